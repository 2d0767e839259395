#!/usr/bin/env python3
# Usage: merge_fusionrag_options.py MAIN_RUN_DIR OPTIONS_DIR OUT_DIR (issue 14; bench/README.md).
# Merge FusionRAG option runs into one folder: the main run's full/reuse/fusionrag rows of
# the examples the option runs cover, and each option folder's fusionrag rows renamed.
import json, os, sys
main, opts_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [json.loads(l) for l in open(os.path.join(main, "results.jsonl")) if l.strip()]
names = {"sink_alone": "fusionrag+sink", "probe_stitched": "fusionrag+stitched",
         "layers_0_4": "fusionrag+L0-3", "layers_4_30": "fusionrag+L4-29"}
merged, examples = [], set()
for sub, name in names.items():
    p = os.path.join(opts_dir, sub, "results.jsonl")
    if not os.path.exists(p):
        continue
    for l in open(p):
        if l.strip():
            r = json.loads(l)
            if r["method"] == "fusionrag":
                examples.add(r["example"])
                merged.append(dict(r, method=name))
merged += [r for r in rows if r["example"] in examples and r["method"] in ("full", "reuse", "fusionrag")]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "results.jsonl"), "w") as f:
    for r in merged:
        f.write(json.dumps(r) + "\n")
print(len(merged), "rows,", len(examples), "examples")
