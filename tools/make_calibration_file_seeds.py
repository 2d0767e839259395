#!/usr/bin/env python3
"""Seeds for fuzz/calibration_file_fuzz.cpp: every shipped calibration (format /3 and /2 as
shipped), each also rewritten in the other format, so the fuzzer starts from files that parse.

  tools/make_calibration_file_seeds.py OUT_DIR
"""
import glob
import json
import os
import sys


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "auto_calibrations")
    for path in sorted(glob.glob(os.path.join(root, "*.auto.json"))):
        name = os.path.basename(path)
        with open(path) as f:
            cal = json.load(f)
        variants = {"shipped": cal}
        if "size_classes" in cal:  # /3 -> /2: the first class's plan for every size
            one = {k: v for k, v in cal.items() if k != "size_classes"}
            one.update(format="chunkfuse.auto.calibration/2", policies=cal["size_classes"][0]["policies"])
            variants["one_class"] = one
        else:  # /2 -> /3 with a second class from 3000 tokens
            three = {k: v for k, v in cal.items() if k != "policies"}
            three.update(format="chunkfuse.auto.calibration/3",
                         size_classes=[{"min_context_tokens": 0, "policies": cal["policies"]},
                                       {"min_context_tokens": 3000, "policies": cal["policies"][-1:]}])
            variants["two_classes"] = three
        for tag, value in variants.items():
            with open(os.path.join(out, "%s.%s" % (name, tag)), "w") as f:
                json.dump(value, f)


if __name__ == "__main__":
    main()
