#!/usr/bin/env python3
"""Random-weight GGUF files with the exact shapes of models people run, quantized by llama.cpp,
plus llama.cpp's logits on them (issue 11, item 4).

No real file of these architectures can be fetched here, so this script writes one with the
same hyperparameters, tensor names, tensor shapes and vocabulary size as the published GGUF
conversion of each model, fills it with seeded random weights, and quantizes it with
llama.cpp's own quantizer (llama_model_quantize, as `llama-quantize` does). Every file a user
would download of that model has this layout, so chunkfuse must load and run it exactly as
llama.cpp does: tests/runtime/test_shapes.cpp compares the logits.

Shapes (from the models' config.json and llama.cpp's conversion of them):
  qwen2.5-0.5b   qwen2: 24 layers, d 896, ff 4864, 14 heads / 2 KV heads of 64, Q/K/V biases,
                 NeoX RoPE base 1e6, tied output, vocabulary 151936
  qwen3-0.6b     qwen3: 28 layers, d 1024, ff 3072, 16 heads / 8 KV heads of 128 (so
                 n_head * head_dim = 2048 != d), per-head QK RMSNorm, RoPE base 1e6, tied
                 output, vocabulary 151936
  llama3.2-1b    llama: 16 layers, d 2048, ff 8192, 32 heads / 8 KV heads of 64, RoPE base
                 5e5 with llama3 frequency scaling (factor 32, low 1, high 4, original context
                 8192) stored as the rope_freqs.weight tensor, tied output, vocabulary 128256
  llama3.1-8b    llama: 32 layers, d 4096, ff 14336, 32 heads / 8 KV heads of 128, RoPE base
                 5e5, llama3 scaling factor 8, separate output matrix, vocabulary 128256
                 (benchmark only: 16 GB of F16 written and a 4.7 GB Q4_K_M file)

Tokenizer: the GPT-2 BPE vocabulary, merges and pre-tokenizer ("smollm") of the default model
(SmolLM2-135M-Instruct), padded with unused tokens "<|unused_N|>" (type UNUSED) up to each
shape's vocabulary size, so the embedding and output matrices have the real shapes and both
engines tokenize alike. Random weights make the text meaningless; only the numerics matter.

Weights: N(0, 1/fan_in) for matrices (so every projection keeps unit-scale activations),
embeddings N(0, 1/d) scaled so logits have a standard deviation of about 4 (clear top-1
tokens, like a trained model's), norm weights 1 + N(0, 0.1^2), biases N(0, 0.1^2). Each
tensor has its own generator seeded by (--seed, crc32(name)), so a file is a pure function
of the seed, the shape and the numpy version (its generator streams may change between
versions: scripts/setup.sh pins numpy 2.4.6 and gguf 0.19.0, those of the committed fixtures). Written as F16 (norms, biases, rope_freqs F32, as the converter
does), then quantized; the F16 file is deleted unless --keep-f16.

Outputs, in --out (default <cache>/models/shapes, the folder the tests read):
  <shape>.<TYPE>.gguf         TYPE in --types (default Q8_0,Q4_K_M)
  <shape>.<TYPE>.ref.json     (in --ref-dir, default --out) llama.cpp's top-10 logits (and
                              top-1 margin) at every position of two short prompts, evaluated
                              in one batch (logits_all), without ggml's extra buffer types
                              (tools/benchlib.py says why). The tests read the committed copies
                              in tests/golden/shapes/ (the files are deterministic).

Without llama.cpp (CI): --quantizer gguf --types Q8_0 writes the Q8_0 files directly with the
gguf package, bit-identical in every tensor to llama.cpp's Q8_0 of the same F16 source
(checked), so the committed Q8_0 fixtures hold for them. Q4_K_M needs llama.cpp's quantizer.

Usage (needs the .venv of scripts/setup.sh --bench: llama-cpp-python, numpy, gguf):
  .venv/bin/python tools/make_shape_models.py                       # the three small shapes
  .venv/bin/python tools/make_shape_models.py --force --ref-dir tests/golden/shapes   # new fixtures
  PY tools/make_shape_models.py --quantizer gguf --types Q8_0      # Q8_0 only, numpy + gguf only
  .venv/bin/python tools/make_shape_models.py --shapes llama3.1-8b --types Q4_K_M --no-ref
  .venv/bin/python tools/make_shape_models.py --requantize SRC.gguf --types Q4_K_M,Q8_0,Q4_0
Files that exist with a matching .ref.json are kept (rerunning is cheap); --force remakes.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import math
import os
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import disable_llama_extra_buffers  # noqa: E402

FORMAT_VERSION = 1


def cache_root() -> Path:
    """Same rule as src/base/paths.cpp."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/tmp"), ".cache")
    return Path(base) / "chunkfuse"


DEFAULT_OUT = cache_root() / "models" / "shapes"
DEFAULT_TOKENIZER_SOURCE = cache_root() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_context: int


@dataclasses.dataclass(frozen=True)
class Shape:
    arch: str
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rope_base: float
    rms_eps: float
    tied_output: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_scaling: Llama3RopeScaling | None = None
    write_head_dim: bool = False  # <arch>.attention.key_length / value_length in the file


SHAPES = {
    "qwen2.5-0.5b": Shape("qwen2", 24, 896, 4864, 14, 2, 64, 151936, 32768, 1e6, 1e-6,
                          tied_output=True, qkv_bias=True),
    "qwen3-0.6b": Shape("qwen3", 28, 1024, 3072, 16, 8, 128, 151936, 40960, 1e6, 1e-6,
                        tied_output=True, qk_norm=True, write_head_dim=True),
    "llama3.2-1b": Shape("llama", 16, 2048, 8192, 32, 8, 64, 128256, 131072, 5e5, 1e-5,
                         tied_output=True, rope_scaling=Llama3RopeScaling(32.0, 1.0, 4.0, 8192),
                         write_head_dim=True),
    "llama3.1-8b": Shape("llama", 32, 4096, 14336, 32, 8, 128, 128256, 131072, 5e5, 1e-5,
                         tied_output=False, rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 8192),
                         write_head_dim=True),
}
SMALL_SHAPES = ["qwen2.5-0.5b", "qwen3-0.6b", "llama3.2-1b"]

# llama.cpp's enum llama_ftype.
FTYPES = {"F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K_M": 15,
          "Q5_K_M": 17, "Q6_K": 18, "BF16": 32}

# Short prompts: K-quant weights still run through chunkfuse's generic kernels, and the test
# evaluates every file. Ids come from llama.cpp's tokenizer (the shared SmolLM2 vocabulary).
PROMPTS = [
    ("plain", "The history of the Roman Empire spans more than a thousand years"),
    ("question", "Question: Which planet is known as the Red Planet?\nAnswer:"),
]
TOP_K = 10


def log(msg: str) -> None:
    print(f"make_shape_models: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------
# Writing the F16 file
# ----------------------------------------------------------------------------------------
def llama3_rope_factors(s: Shape) -> np.ndarray:
    """Per-frequency divisors of llama3 RoPE scaling, as convert_hf_to_gguf.py computes them
    into rope_freqs.weight (Meta's apply_scaling: long wavelengths slowed by `factor`, short
    ones kept, a smooth ramp between)."""
    sc = s.rope_scaling
    assert sc is not None
    freqs = 1.0 / (s.rope_base ** (np.arange(0, s.head_dim, 2, dtype=np.float32) / s.head_dim))
    low_wavelen = sc.original_context / sc.low_freq_factor
    high_wavelen = sc.original_context / sc.high_freq_factor
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(sc.factor)
        else:
            smooth = (sc.original_context / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor)
            out.append(1.0 / ((1 - smooth) / sc.factor + smooth))
    return np.asarray(out, dtype=np.float32)


@dataclasses.dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # numpy order: (rows, cols) = GGUF dims reversed
    kind: str               # "matrix" | "embedding" | "norm" | "bias" | "rope_freqs"


def tensor_specs(s: Shape) -> list[TensorSpec]:
    d, qd, kvd, ff = s.d_model, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.d_ff
    t = [TensorSpec("token_embd.weight", (s.vocab, d), "embedding")]
    if s.rope_scaling:
        t.append(TensorSpec("rope_freqs.weight", (s.head_dim // 2,), "rope_freqs"))
    for layer in range(s.n_layers):
        p = f"blk.{layer}."
        t.append(TensorSpec(p + "attn_norm.weight", (d,), "norm"))
        t.append(TensorSpec(p + "attn_q.weight", (qd, d), "matrix"))
        t.append(TensorSpec(p + "attn_k.weight", (kvd, d), "matrix"))
        t.append(TensorSpec(p + "attn_v.weight", (kvd, d), "matrix"))
        if s.qkv_bias:
            t.append(TensorSpec(p + "attn_q.bias", (qd,), "bias"))
            t.append(TensorSpec(p + "attn_k.bias", (kvd,), "bias"))
            t.append(TensorSpec(p + "attn_v.bias", (kvd,), "bias"))
        if s.qk_norm:
            t.append(TensorSpec(p + "attn_q_norm.weight", (s.head_dim,), "norm"))
            t.append(TensorSpec(p + "attn_k_norm.weight", (s.head_dim,), "norm"))
        t.append(TensorSpec(p + "attn_output.weight", (d, qd), "matrix"))
        t.append(TensorSpec(p + "ffn_norm.weight", (d,), "norm"))
        t.append(TensorSpec(p + "ffn_gate.weight", (ff, d), "matrix"))
        t.append(TensorSpec(p + "ffn_up.weight", (ff, d), "matrix"))
        t.append(TensorSpec(p + "ffn_down.weight", (d, ff), "matrix"))
    t.append(TensorSpec("output_norm.weight", (d,), "norm"))
    if not s.tied_output:
        t.append(TensorSpec("output.weight", (s.vocab, d), "embedding"))
    return t


def make_tensor(spec: TensorSpec, s: Shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    if spec.kind == "rope_freqs":
        return llama3_rope_factors(s)
    if spec.kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(spec.shape, dtype=np.float32)).astype(np.float32)
    if spec.kind == "bias":
        return (0.1 * rng.standard_normal(spec.shape, dtype=np.float32)).astype(np.float32)
    fan_in = spec.shape[1]
    # The output projection sees a unit-RMS row, so logits ~ N(0, scale^2 * d / fan_in).
    scale = 4.0 / math.sqrt(fan_in) if spec.kind == "embedding" else 1.0 / math.sqrt(fan_in)
    out = np.empty(spec.shape, dtype=np.float16)
    rows_per_step = max(1, (1 << 24) // spec.shape[1])  # bounded float32 scratch
    for r0 in range(0, spec.shape[0], rows_per_step):
        r1 = min(spec.shape[0], r0 + rows_per_step)
        chunk = rng.standard_normal((r1 - r0, spec.shape[1]), dtype=np.float32)
        chunk *= scale
        out[r0:r1] = chunk
    return out


def tokenizer_metadata(source: Path) -> dict:
    import gguf

    if not source.is_file():
        raise SystemExit(f"tokenizer source {source} not found (scripts/setup.sh fetches the default model; "
                         "or pass --tokenizer-source)")
    r = gguf.GGUFReader(str(source))

    def field(name):
        f = r.fields.get(name)
        if f is None:
            raise SystemExit(f"{source}: no '{name}' (need a GPT-2 BPE GGUF as tokenizer source)")
        return f

    def strings(name):
        f = field(name)
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def scalar(name):
        f = field(name)
        v = f.parts[f.data[0]]
        return bytes(v).decode("utf-8") if f.types[0] == gguf.GGUFValueType.STRING else v.tolist()[0]

    model = scalar("tokenizer.ggml.model")
    if model != "gpt2":
        raise SystemExit(f"{source}: tokenizer model '{model}', need 'gpt2' (BPE)")
    f = field("tokenizer.ggml.token_type")
    return {
        "pre": scalar("tokenizer.ggml.pre"),
        "tokens": strings("tokenizer.ggml.tokens"),
        "types": [int(f.parts[i][0]) for i in f.data],
        "merges": strings("tokenizer.ggml.merges"),
        "bos": int(scalar("tokenizer.ggml.bos_token_id")),
        "eos": int(scalar("tokenizer.ggml.eos_token_id")),
    }


def write_gguf(name: str, s: Shape, tok: dict, seed: int, path: Path, matrix_type: str = "F16") -> None:
    """The shape with random weights; matrices as F16 (the source llama.cpp quantizes) or, with
    matrix_type "Q8_0", quantized here by the gguf package from the same F16 values: its Q8_0
    is bit-exact with ggml's reference quantizer, which llama_model_quantize uses, so the
    weights equal those of the llama.cpp-made Q8_0 file without needing llama.cpp."""
    import gguf

    q8 = matrix_type == "Q8_0"
    w = gguf.GGUFWriter(str(path), s.arch)
    w.add_name(f"chunkfuse random-weight {name} shape (seed {seed})")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.MOSTLY_F16)
    if q8:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(s.n_layers)
    w.add_context_length(s.context)
    w.add_embedding_length(s.d_model)
    w.add_feed_forward_length(s.d_ff)
    w.add_head_count(s.n_heads)
    w.add_head_count_kv(s.n_kv_heads)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(s.rms_eps)
    if s.write_head_dim:
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    if s.arch == "llama":
        w.add_vocab_size(s.vocab)
        w.add_rope_dimension_count(s.head_dim)
    n_pad = s.vocab - len(tok["tokens"])
    if n_pad < 0:
        raise SystemExit(f"tokenizer source has {len(tok['tokens'])} tokens, more than {name}'s {s.vocab}")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"] + [f"<|unused_{i}|>" for i in range(n_pad)])
    w.add_token_types(tok["types"] + [int(gguf.TokenType.UNUSED)] * n_pad)
    w.add_token_merges(tok["merges"])
    w.add_bos_token_id(tok["bos"])
    w.add_eos_token_id(tok["eos"])
    w.add_add_bos_token(False)

    specs = tensor_specs(s)
    q8_block_bytes = 34  # 32 int8 + an f16 scale
    for sp in specs:
        if sp.kind in ("matrix", "embedding") and q8:
            byte_shape = (sp.shape[0], sp.shape[1] // 32 * q8_block_bytes)
            w.add_tensor_info(sp.name, byte_shape, np.dtype(np.uint8), byte_shape[0] * byte_shape[1],
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            dt = np.float16 if sp.kind in ("matrix", "embedding") else np.float32
            w.add_tensor_info(sp.name, sp.shape, np.dtype(dt), int(np.prod(sp.shape)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # One tensor in memory at a time: the 8B shape's 16 GB never has to fit in RAM.
    for sp in specs:
        t = make_tensor(sp, s, seed)
        if q8 and sp.kind in ("matrix", "embedding"):
            out = np.empty((t.shape[0], t.shape[1] // 32 * q8_block_bytes), dtype=np.uint8)
            step = max(1, (1 << 22) // t.shape[1])
            for r0 in range(0, t.shape[0], step):
                out[r0:r0 + step] = gguf.quantize(t[r0:r0 + step].astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
            t = out
        w.write_tensor_data(t)
    w.close()


# ----------------------------------------------------------------------------------------
# Quantizing and reference logits with llama.cpp
# ----------------------------------------------------------------------------------------
class quiet_stderr:
    """llama.cpp logs every tensor to fd 2; keep it in a temp file, shown only on failure."""

    def __enter__(self):
        import tempfile

        sys.stderr.flush()
        self.log = tempfile.TemporaryFile()
        self.saved = os.dup(2)
        os.dup2(self.log.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.log.seek(0)
        self.text = self.log.read().decode(errors="replace")
        self.log.close()
        return False


def quantize(src: Path, dst: Path, ftype: str, threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.nthread = threads
    params.allow_requantize = True  # lets an already quantized file (e.g. the Q4_1 default) be the source
    tmp = dst.with_name(dst.name + ".tmp")
    with quiet_stderr() as q:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        sys.stderr.write(q.text[-4000:])
        raise SystemExit(f"llama_model_quantize({src} -> {ftype}) failed with {rc}")
    tmp.rename(dst)


def topk(row: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    # Larger logit first, smaller id first on ties (as tools/make_golden.py).
    order = np.lexsort((np.arange(row.shape[0]), -row))[:k]
    return [int(i) for i in order], [round(float(row[i]), 5) for i in order]


def reference_logits(model: Path, threads: int) -> dict:
    import llama_cpp

    disable_llama_extra_buffers()
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=256, n_threads=threads, n_batch=256,
                          logits_all=True, seed=0, verbose=False)
    cases = []
    for name, text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)  # one batch: every position from the same evaluation
        scores = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
        positions = []
        for p in range(len(ids)):
            top_ids, top_vals = topk(scores[p], TOP_K)
            positions.append({"ids": top_ids, "logits": top_vals,
                              "margin": round(top_vals[0] - top_vals[1], 5)})
        cases.append({"name": name, "prompt": text, "prompt_ids": ids, "positions": positions})
    return {"format_version": FORMAT_VERSION, "generator": "tools/make_shape_models.py",
            "llama_cpp_python_version": llama_cpp.__version__, "numpy_version": np.__version__,
            "model": {"file": model.name, "size": model.stat().st_size},
            "eval_settings": {"n_threads": threads, "n_batch": 256, "use_extra_bufts": False},
            "logits": cases}


def make_one(label: str, types: list[str], out: Path, make_source, args) -> None:
    """make_source(path) writes the unquantized source once, only if some output is missing."""
    wanted = []
    for t in types:
        gguf_path = out / f"{label}.{t}.gguf"
        ref_path = Path(args.ref_dir or out) / f"{label}.{t}.ref.json"
        if args.force or not gguf_path.is_file() or (not args.no_ref and not ref_path.is_file()):
            wanted.append((t, gguf_path, ref_path))
        else:
            log(f"{gguf_path.name}: present")
    if not wanted:
        return
    src, made_src = make_source()
    try:
        for t, gguf_path, ref_path in wanted:
            if args.force or not gguf_path.is_file():
                t0 = time.time()
                quantize(src, gguf_path, t, args.threads)
                log(f"{gguf_path.name}: quantized in {time.time() - t0:.0f}s "
                    f"({gguf_path.stat().st_size / 2**20:.0f} MiB)")
            if not args.no_ref:
                t0 = time.time()
                ref = reference_logits(gguf_path, args.threads)
                tmp = ref_path.with_name(ref_path.name + ".tmp")
                tmp.write_text(json.dumps(ref, sort_keys=True, separators=(",", ":")) + "\n")
                tmp.rename(ref_path)
                log(f"{ref_path.name}: llama.cpp logits in {time.time() - t0:.0f}s")
    finally:
        if made_src and not args.keep_f16:
            src.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--shapes", default=",".join(SMALL_SHAPES),
                    help=f"comma-separated, from {', '.join(SHAPES)} (default: the three small ones)")
    ap.add_argument("--types", default="Q8_0,Q4_K_M", help=f"from {', '.join(FTYPES)}")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 4))
    ap.add_argument("--tokenizer-source", default=str(DEFAULT_TOKENIZER_SOURCE),
                    help="GGUF whose GPT-2 BPE tokenizer is copied (default: the default model)")
    ap.add_argument("--requantize", metavar="SRC.gguf",
                    help="instead of shapes: requantize this file to each of --types (allow_requantize)")
    ap.add_argument("--no-ref", action="store_true", help="skip llama.cpp's reference logits")
    ap.add_argument("--ref-dir", help="where the .ref.json files go (default: --out); tests/golden/shapes "
                                      "regenerates the committed fixtures")
    ap.add_argument("--keep-f16", action="store_true", help="keep the unquantized F16 file")
    ap.add_argument("--force", action="store_true", help="remake files that exist")
    ap.add_argument("--quantizer", choices=("llama.cpp", "gguf"), default="llama.cpp",
                    help="gguf: write Q8_0 directly with the gguf package (no llama.cpp; bit-exact with "
                         "llama.cpp's Q8_0; implies --no-ref: the tests use tests/golden/shapes)")
    args = ap.parse_args()

    types = [t.strip() for t in args.types.split(",") if t.strip()]
    for t in types:
        if t not in FTYPES:
            raise SystemExit(f"unknown type {t} (choose from {', '.join(FTYPES)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.requantize:
        src = Path(args.requantize)
        if not src.is_file():
            raise SystemExit(f"not found: {src}")
        label = src.name[:-5] if src.name.endswith(".gguf") else src.name
        make_one(label, types, out, lambda: (src, False), args)
        return

    names = [n.strip() for n in args.shapes.split(",") if n.strip()]
    for n in names:
        if n not in SHAPES:
            raise SystemExit(f"unknown shape {n} (choose from {', '.join(SHAPES)})")
    tok = tokenizer_metadata(Path(args.tokenizer_source))
    if args.quantizer == "gguf":
        if types != ["Q8_0"]:
            raise SystemExit("--quantizer gguf makes Q8_0 only (--types Q8_0)")
        for n in names:
            dst = out / f"{n}.Q8_0.gguf"
            if dst.is_file() and not args.force:
                log(f"{dst.name}: present")
                continue
            t0 = time.time()
            tmp = dst.with_name(dst.name + ".tmp")
            write_gguf(n, SHAPES[n], tok, args.seed, tmp, matrix_type="Q8_0")
            tmp.rename(dst)
            log(f"{dst.name}: written with the gguf package in {time.time() - t0:.0f}s "
                f"({dst.stat().st_size / 2**20:.0f} MiB)")
        return
    for n in names:
        s = SHAPES[n]

        def make_source(n=n, s=s):
            f16 = out / f"{n}.source-f16.gguf"
            if f16.is_file() and not args.force:
                return f16, False
            t0 = time.time()
            tmp = out / f"{n}.source-f16.gguf.tmp"
            write_gguf(n, s, tok, args.seed, tmp)
            tmp.rename(f16)
            log(f"{f16.name}: written in {time.time() - t0:.0f}s ({f16.stat().st_size / 2**20:.0f} MiB)")
            return f16, True

        make_one(n, types, out, make_source, args)


if __name__ == "__main__":
    main()
