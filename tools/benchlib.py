"""Small helpers shared by the benchmark and fixture scripts (standard library only).

read_jsonl: JSON Lines reader that skips (and reports) damaged lines, so a run killed
mid-write can still be read and resumed.
disable_llama_extra_buffers: makes llama-cpp-python load models without ggml's "extra
buffer types" (AMX, weight repacking). On an earlier development machine (Xeon with AMX) the
AMX Q4_1 matmul crashed (SIGSEGV in ggml_backend_amx_mul_mat: the sandbox does not grant AMX
tile state). Fixtures (make_golden.py, make_shape_models.py) use it so that llama.cpp runs
its plain kernels on every machine; bench/runtime_bench.py runs one peer with and one
without (its "repack" and "plain" peers; bench/README.md says how to build without AMX).
"""
import hashlib
import json
import sys


def read_jsonl(path, prog="chunkfuse"):
    rows = []
    try:
        f = open(path, encoding="utf-8")
    except FileNotFoundError:
        return rows
    with f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                print(f"{prog}: {path}:{n}: skipped ({e})", file=sys.stderr)
    return rows


def disable_llama_extra_buffers():
    """Call before creating llama_cpp.Llama objects."""
    import llama_cpp.llama_cpp as low

    if getattr(low.llama_model_default_params, "_chunkfuse_patched", False):
        return
    default_params = low.llama_model_default_params

    def params_without_extra_bufts():
        p = default_params()
        p.use_extra_bufts = False
        return p

    params_without_extra_bufts._chunkfuse_patched = True
    low.llama_model_default_params = params_without_extra_bufts


def sha256_of(path):
    """Hex SHA-256 of a file, read 1 MiB at a time (a model file is too big to read whole)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
