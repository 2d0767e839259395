#!/usr/bin/env python3
"""Seeds for fuzz/tokenizer_fuzz.cpp (issue 24): a flags byte, then text: ASCII, UTF-8 of
several scripts, special-token text, whitespace runs, digits, and invalid UTF-8."""
import sys
from pathlib import Path

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
texts = [
    b"The capital of France is Paris.",
    "Marie Curie était née à Varsovie — 1867. 東京は日本の首都です。 Привет, мир! 🙂".encode(),
    b"<|im_start|>user\nhello<|im_end|>\n<start_of_turn>model\n<bos><eos>",
    b"   \t\t\n\n\n  x  \r\n 12345678901234567890 3.14159 don't we'll",
    b"\xff\xfe\xc3\x28\xe2\x82\x28\xf0\x90\x28\xbc abc \xed\xa0\x80",
    b"def f(x):\n    return x ** 2  # comment\n",
]
for i, t in enumerate(texts):
    for flags in (0, 3, 7):
        (out / f"seed_{i}_{flags}").write_bytes(bytes([flags]) + t)
