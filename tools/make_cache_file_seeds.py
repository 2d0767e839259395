#!/usr/bin/env python3
"""Seeds for fuzz/cache_file_fuzz.cpp (issue 24): odd first byte = the target's own valid
image with (offset, byte) overwrites; even first byte = raw bytes. A few of each, so the
fuzzer starts from both a valid file and from garbage."""
import sys
from pathlib import Path

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
seeds = {
    "valid_f16_a": bytes([1, 0]),
    "valid_f16_b": bytes([1, 1]),
    "flip_header": bytes([1, 0, 0, 8, 0x41]),
    "flip_meta": bytes([1, 0, 0, 130, 0x7b]),
    "truncate": bytes([1, 1, 0, 100, 0xff]),
    "raw_magic": bytes([0]) + b"CFKV" + bytes(60),
    "raw_empty": bytes([0]),
}
for name, data in seeds.items():
    (out / name).write_bytes(data)
