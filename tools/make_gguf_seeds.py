#!/usr/bin/env python3
"""Writes a few small, valid GGUF files (versions 2 and 3) as a seed corpus for the GGUF
fuzz target: every metadata value type, nested arrays, tensors of several types, a custom
alignment, and a file without tensors. Standard library only.

usage: make_gguf_seeds.py OUT_DIR
"""
import os
import struct
import sys

# Metadata value type ids of the GGUF format.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FORMAT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
                 BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}

# Tensor type ids and (elements per block, bytes per block).
F32_T, F16_T, Q4_0_T, Q4_1_T, Q8_0_T, Q6_K_T = 0, 1, 2, 3, 8, 14
BLOCKS = {F32_T: (1, 4), F16_T: (1, 2), Q4_0_T: (32, 18), Q4_1_T: (32, 20), Q8_0_T: (32, 34),
          Q6_K_T: (256, 210)}


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def value_payload(vtype, value):
    if vtype == STR:
        return gguf_string(value)
    if vtype == ARR:
        elem_type, items = value
        body = b"".join(value_payload(elem_type, v) for v in items)
        return struct.pack("<IQ", elem_type, len(items)) + body
    return struct.pack(SCALAR_FORMAT[vtype], value)


def build(version, kvs, tensors, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, type_id, dims)]."""
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, vtype, value in kvs:
        out += gguf_string(key) + struct.pack("<I", vtype) + value_payload(vtype, value)
    offset = 0
    blobs = []
    for name, ttype, dims in tensors:
        per_block, block_bytes = BLOCKS[ttype]
        rows = 1
        for d in dims[1:]:
            rows *= d
        nbytes = dims[0] // per_block * block_bytes * rows
        out += gguf_string(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ttype, offset)
        blobs.append((offset, bytes((i * 37 + len(blobs)) & 0xFF for i in range(nbytes))))
        offset = (offset + nbytes + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    data_start = len(out)
    for off, blob in blobs:
        out += b"\0" * (data_start + off - len(out))
        out += blob
    return bytes(out)


def every_type_kvs():
    return [
        ("general.architecture", STR, "llama"),
        ("t.u8", U8, 200), ("t.i8", I8, -3), ("t.u16", U16, 65535), ("t.i16", I16, -2),
        ("t.u32", U32, 30), ("t.i32", I32, -7), ("t.f32", F32, 1.5), ("t.bool", BOOL, 1),
        ("t.u64", U64, 1 << 40), ("t.i64", I64, -(1 << 40)), ("t.f64", F64, 0.25),
        ("t.str", STR, "line\nnext"),
        ("t.arr_i32", ARR, (I32, [1, -2, 3])),
        ("t.arr_str", ARR, (STR, ["a", "", "ccc"])),
        ("t.nested", ARR, (ARR, [(U16, [7, 8]), (F32, [])])),
    ]


def tokenizer_kvs():
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab", "Ġ", "Ġab"]
    return [
        ("general.architecture", STR, "llama"),
        ("llama.block_count", U32, 1), ("llama.embedding_length", U32, 32),
        ("llama.attention.head_count", U32, 2), ("llama.rope.freq_base", F32, 10000.0),
        ("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, "smollm"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.token_type", ARR, (I32, [3, 3, 3, 1, 1, 1, 1, 1])),
        ("tokenizer.ggml.merges", ARR, (STR, ["a b", "Ġ ab"])),
        ("tokenizer.chat_template", STR, "{% for m in messages %}<|im_start|>{{ m['role'] }}{% endfor %}"),
    ]


def seeds():
    small_tensors = [("token_embd.weight", Q8_0_T, [32, 8]), ("blk.0.attn_norm.weight", F32_T, [32]),
                     ("blk.0.attn_q.weight", Q4_1_T, [32, 32]), ("blk.0.ffn_up.weight", Q4_0_T, [32, 2]),
                     ("x.f16", F16_T, [2, 3, 2, 1])]
    yield "v3_all_types.gguf", build(3, every_type_kvs(), small_tensors)
    yield "v2_all_types.gguf", build(2, every_type_kvs(), small_tensors)
    yield "v3_tokenizer.gguf", build(3, tokenizer_kvs(), small_tensors[:2])
    yield "v3_align64.gguf", build(3, [("general.alignment", U32, 64)],
                                   [("k.weight", Q6_K_T, [256]), ("b", F32_T, [3])], alignment=64)
    yield "v3_no_tensors.gguf", build(3, [("general.name", STR, "empty")], [])
    yield "v3_empty.gguf", build(3, [], [])


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    for name, data in seeds():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
