#!/usr/bin/env python3
"""An exact float64 reference forward pass over a GGUF's dequantized weights.

Why: chunkfuse's kernels may sum in any order, so its logits are held against a reference
that does not depend on one: the quantized model itself, every weight dequantized by the
gguf package (gguf.quants.dequantize), every activation in float64, nothing rounded on the
way (no 8-bit matmul inputs, no f16 K/V, exact GELU/SiLU/softmax/exp). The remaining error
of this reference is float64 rounding (~1e-12 relative), far below anything measured.

Architectures (what the engine loads; the facts follow src/model/arch_*.cpp and
src/runtime/forward.cpp):
  llama   RMSNorm, RoPE "normal" (pairs 2i, 2i+1), SiLU-gated FFN, GQA
  qwen2   as llama plus Q/K/V biases and NeoX RoPE (pairs i, i+d/2)
  qwen3   as qwen2 without biases, per-head RMSNorm of Q and K before RoPE
  gemma3  embeddings times sqrt(d_model); per-head Q/K RMSNorm; post-attention and post-FFN
          RMSNorm before each residual add; GELU(tanh)-gated FFN; NeoX RoPE; local layers
          (l % 6 < 5 unless the file says otherwise) see only the last sliding_window
          positions and use rope.freq_base_swa (10000 when absent), global layers use
          rope.freq_base; RMSNorm weights as stored (llama.cpp's converter already added
          Gemma's +1, checked: attn_norm weights are all >= 7 in the 270M file); Q.K scale
          1/sqrt(key_length) (1/sqrt(d_model/n_heads) for the 62-layer model); optional
          final_logit_softcapping.
Output matrix: output.weight when present, else the tied token embedding.

Usage as a library (tools/make_f64_golden.py):  m = F64Model(path); logits = m.prefill(ids)
Usage from the command line (prints the top-k of every position):
    .venv-serve/bin/python tools/f64_reference.py MODEL.gguf 1 2 3 [--top 5]
Set OMP_NUM_THREADS / OPENBLAS_NUM_THREADS to bound numpy's threads.
"""
import argparse
import math
import sys

import numpy as np
import gguf
from gguf import GGUFReader

F64 = np.float64


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


class KvState:
    """Per-layer K and V (float64) of the positions evaluated so far, and those positions."""

    def __init__(self, n_layers):
        self.k = [None] * n_layers
        self.v = [None] * n_layers
        self.pos = np.zeros(0, dtype=np.int64)


class F64Model:
    def __init__(self, path, store="f64"):
        """store: how the dequantized matrices are kept. "f64" (fastest); "f32" (half the
        memory, the same values: every quant type dequantizes exactly in float32, and a
        product with float64 activations upcasts them); "none" (each layer dequantized when
        a pass reaches it and dropped after: for files whose weights do not fit at all; slow
        for greedy decoding, which pays it per token)."""
        if store not in ("f64", "f32", "none"):
            raise ValueError(f"store must be f64, f32 or none, not {store!r}")
        self.path = path
        self.store = store
        self.cache_layers = store != "none"
        r = GGUFReader(path)
        self.reader = r
        arch = _field(r, "general.architecture")
        if arch not in ("llama", "qwen2", "qwen3", "gemma3"):
            raise ValueError(f"{path}: unsupported architecture {arch!r}")
        self.arch = arch
        p = arch + "."
        self.n_layers = int(_field(r, p + "block_count"))
        self.d = int(_field(r, p + "embedding_length"))
        self.n_heads = int(_field(r, p + "attention.head_count"))
        self.n_kv = int(_field(r, p + "attention.head_count_kv", self.n_heads))
        self.head_dim = int(_field(r, p + "attention.key_length", self.d // self.n_heads))
        rope_dims = int(_field(r, p + "rope.dimension_count", self.head_dim))
        if rope_dims != self.head_dim:
            raise ValueError("partial RoPE is not supported")
        self.eps = float(_field(r, p + "attention.layer_norm_rms_epsilon", 1e-5))
        self.rope_base = float(_field(r, p + "rope.freq_base", 10000.0))
        scaling = _field(r, p + "rope.scaling.type")
        if scaling not in (None, "none", "linear"):
            raise ValueError(f"RoPE scaling {scaling!r} is not supported")
        self.neox = arch != "llama"
        self.qkv_bias = arch == "qwen2"
        self.qk_norm = arch in ("qwen3", "gemma3")
        self.gelu = arch == "gemma3"
        self.post_norms = arch == "gemma3"
        self.embed_scale = math.sqrt(self.d) if arch == "gemma3" else 1.0
        self.attn_scale = 1.0 / math.sqrt(self.head_dim)
        if arch == "gemma3" and self.n_layers == 62:
            self.attn_scale = 1.0 / math.sqrt(self.d // self.n_heads)
        self.softcap = float(_field(r, p + "final_logit_softcapping", 0.0) or 0.0) if arch == "gemma3" else 0.0
        # Sliding-window layers (gemma3 only), as arch_gemma3.cpp reads them.
        self.window = 0
        self.local = [False] * self.n_layers
        self.rope_base_local = 10000.0
        if arch == "gemma3":
            w = int(_field(r, p + "attention.sliding_window", 0) or 0)
            if w > 0:
                self.window = w
                self.rope_base_local = float(_field(r, p + "rope.freq_base_swa", 10000.0))
                pat = r.fields.get(p + "attention.sliding_window_pattern")
                if pat is not None and pat.types and pat.types[0] == gguf.GGUFValueType.ARRAY:
                    self.local = [bool(x) for x in pat.contents()]
                    if len(self.local) != self.n_layers:
                        raise ValueError("sliding_window_pattern has the wrong length")
                else:
                    period = int(pat.contents()) if pat is not None else 6
                    self.local = [period == 0 or l % period < period - 1 for l in range(self.n_layers)]

        self.tensors = {t.name: t for t in r.tensors}
        self.freq_factors = self._vec("rope_freqs.weight") if "rope_freqs.weight" in self.tensors else None
        # Token embedding: float32 dequantized (exact: every quant type dequantizes in f32),
        # rows taken to float64 when looked up.
        self.embd32 = self._deq("token_embd.weight")
        self.vocab = self.embd32.shape[0]
        out_name = "output.weight" if "output.weight" in self.tensors else "token_embd.weight"
        if out_name == "token_embd.weight":
            self.output = self.embd32 if self.store == "f32" else self.embd32.astype(F64)
        else:
            self.output = self._mat(out_name)
        self.output_norm = self._vec("output_norm.weight")
        self.layers = [self._layer(l) for l in range(self.n_layers)] if self.cache_layers else None

    # --- weights
    def _deq(self, name):
        t = self.tensors[name]
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = [int(x) for x in reversed(t.shape)]  # GGUF lists ne0 (columns) first
        return np.ascontiguousarray(a.reshape(shape), dtype=np.float32)

    def _mat(self, name):
        a = self._deq(name)
        return a if self.store == "f32" else a.astype(F64)

    def _vec(self, name):
        return self._deq(name).astype(F64).reshape(-1)

    def _layer(self, l):
        p = f"blk.{l}."
        w = {k: self._mat(p + n + ".weight") for k, n in (
            ("wq", "attn_q"), ("wk", "attn_k"), ("wv", "attn_v"), ("wo", "attn_output"),
            ("wg", "ffn_gate"), ("wu", "ffn_up"), ("wd", "ffn_down"))}
        w["attn_norm"] = self._vec(p + "attn_norm.weight")
        w["ffn_norm"] = self._vec(p + "ffn_norm.weight")
        if self.qkv_bias:
            for k, n in (("bq", "attn_q"), ("bk", "attn_k"), ("bv", "attn_v")):
                w[k] = self._vec(p + n + ".bias")
        if self.qk_norm:
            w["q_norm"] = self._vec(p + "attn_q_norm.weight")
            w["k_norm"] = self._vec(p + "attn_k_norm.weight")
        if self.post_norms:
            w["post_attn"] = self._vec(p + "post_attention_norm.weight")
            w["post_ffn"] = self._vec(p + "post_ffw_norm.weight")
        return w

    # --- pieces
    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, base):
        """x: [n, heads, head_dim]; rotates in place by each row's position."""
        hd = self.head_dim
        half = hd // 2
        inv = base ** (-2.0 * np.arange(half, dtype=F64) / hd)
        ang = pos.astype(F64)[:, None] * inv[None, :]
        if self.freq_factors is not None:
            ang = ang / self.freq_factors[None, :half]
        c = np.cos(ang)[:, None, :]
        s = np.sin(ang)[:, None, :]
        if self.neox:
            a, b = x[..., :half].copy(), x[..., half:].copy()
            x[..., :half] = a * c - b * s
            x[..., half:] = a * s + b * c
        else:
            a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
            x[..., 0::2] = a * c - b * s
            x[..., 1::2] = a * s + b * c
        return x

    def act(self, g, u):
        if self.gelu:  # GELU, tanh approximation (Gemma's gelu_pytorch_tanh), exactly
            return 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3))) * u
        return g / (1.0 + np.exp(-g)) * u

    # --- the pass
    def forward(self, ids, state, logit_rows=None):
        """Appends `ids` at the positions after those in `state`; returns logits [len(rows), vocab]
        of the rows asked for (all rows when None)."""
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        start = len(state.pos)
        pos = np.arange(start, start + n, dtype=np.int64)
        all_pos = np.concatenate([state.pos, pos])
        H, G, hd = self.n_heads, self.n_kv, self.head_dim
        group = H // G
        x = self.embd32[ids].astype(F64) * self.embed_scale
        for l in range(self.n_layers):
            w = self.layers[l] if self.cache_layers else self._layer(l)
            h = self.rms(x, w["attn_norm"])
            q = h @ w["wq"].T
            k = h @ w["wk"].T
            v = h @ w["wv"].T
            if self.qkv_bias:
                q += w["bq"]
                k += w["bk"]
                v += w["bv"]
            q = q.reshape(n, H, hd)
            k = k.reshape(n, G, hd)
            v = v.reshape(n, G, hd)
            if self.qk_norm:
                q = self.rms(q, w["q_norm"])
                k = self.rms(k, w["k_norm"])
            base = self.rope_base_local if self.local[l] else self.rope_base
            self.rope(q, pos, base)
            self.rope(k, pos, base)
            K = k if state.k[l] is None else np.concatenate([state.k[l], k])
            V = v if state.v[l] is None else np.concatenate([state.v[l], v])
            state.k[l], state.v[l] = K, V
            # Visibility: entry p for row t iff p <= t, and p > t - window on a local layer.
            vis = all_pos[None, :] <= pos[:, None]
            if self.local[l] and self.window > 0:
                vis &= all_pos[None, :] > pos[:, None] - self.window
            out = np.empty((n, H, hd), dtype=F64)
            for g in range(G):
                qg = q[:, g * group:(g + 1) * group, :]                  # [n, group, hd]
                sc = np.einsum("ngd,md->gnm", qg, K[:, g, :]) * self.attn_scale
                sc = np.where(vis[None], sc, -np.inf)
                sc -= sc.max(axis=-1, keepdims=True)
                pr = np.exp(sc)
                pr /= pr.sum(axis=-1, keepdims=True)
                out[:, g * group:(g + 1) * group, :] = np.einsum("gnm,md->ngd", pr, V[:, g, :])
            o = out.reshape(n, H * hd) @ w["wo"].T
            if self.post_norms:
                o = self.rms(o, w["post_attn"])
            x = x + o
            h = self.rms(x, w["ffn_norm"])
            f = self.act(h @ w["wg"].T, h @ w["wu"].T) @ w["wd"].T
            if self.post_norms:
                f = self.rms(f, w["post_ffn"])
            x = x + f
        state.pos = all_pos
        rows = np.arange(n) if logit_rows is None else np.asarray(logit_rows, dtype=np.int64)
        xn = self.rms(x[rows], self.output_norm)
        logits = xn @ self.output.T
        if self.softcap > 0:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return logits

    def prefill(self, ids, chunk=256):
        """Logits of every position of `ids` (evaluated in chunks of `chunk` rows; the result
        does not depend on the chunking beyond float64 rounding)."""
        state = KvState(self.n_layers)
        parts = [self.forward(ids[b:b + chunk], state) for b in range(0, len(ids), chunk)]
        return np.concatenate(parts)

    def greedy(self, ids, n_predict, top=10):
        """Greedy continuation (argmax, smallest id on ties): output ids, and per step the
        top-1 minus top-2 logit and the `top` best (ids, logits) of the row that chose it."""
        state = KvState(self.n_layers)
        row = self.forward(ids, state, logit_rows=[len(ids) - 1])[0]
        out, margins, tops = [], [], []
        for step in range(n_predict):
            order = np.argsort(-row, kind="stable")
            out.append(int(order[0]))
            margins.append(float(row[order[0]] - row[order[1]]))
            tops.append(([int(i) for i in order[:top]], [float(row[i]) for i in order[:top]]))
            if step + 1 < n_predict:
                row = self.forward([order[0]], state, logit_rows=[0])[0]
        return out, margins, tops

    def mean_nll(self, ids, chunk=128):
        """Mean negative log-likelihood (nats) of ids[1:] given the ids before each."""
        state = KvState(self.n_layers)
        total, count = 0.0, 0
        for b in range(0, len(ids), chunk):
            lg = self.forward(ids[b:b + chunk], state)
            for i in range(lg.shape[0]):
                t = b + i
                if t + 1 >= len(ids):
                    break
                row = lg[i]
                mx = row.max()
                lse = mx + math.log(np.exp(row - mx).sum())
                total += lse - row[ids[t + 1]]
                count += 1
        return total / count, count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("ids", nargs="+", type=int)
    ap.add_argument("--top", type=int, default=5)
    a = ap.parse_args()
    m = F64Model(a.model)
    lg = m.prefill(a.ids)
    for p in range(lg.shape[0]):
        order = np.argsort(-lg[p], kind="stable")[:a.top]
        print(p, " ".join(f"{int(i)}:{lg[p, i]:.5f}" for i in order))


if __name__ == "__main__":
    sys.exit(main())
