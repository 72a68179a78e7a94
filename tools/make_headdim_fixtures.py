#!/usr/bin/env python3
"""Two tiny random checkpoints whose head dimensions are neither 64 nor 128, in the exact Hugging Face layouts:
LLaDA with head_dim 24 (d_model 96, 4 heads, 2 key/value heads) and Dream / Qwen2 with head_dim 96 (hidden_size 192,
2 heads, 1 key/value head), two layers each, vocabularies of 152. Each directory also gets golden_logits.safetensors:
float64 logits of a few inputs from an independent numpy forward (the same reference semantics as
tools/make_fixtures.py, which needs PyTorch; this script needs numpy only), so the CPU backend is checked against a
reference at these head dims and the GPU backend against the CPU one (tests/test_gpu.inl).

Run:
    python3 tools/make_headdim_fixtures.py tests/data            # writes tiny-llada-hd24/ and tiny-dream-hd96/
    python3 tools/make_headdim_fixtures.py --check tests/data    # regenerates in a temp dir and compares bytes
"""
import math
import os
import sys

import numpy as np

import fixture_files
from fixture_files import (bf16, fixture_differences, layer_names, tokenizer_config, write_json,
                           write_safetensors)


# tiny-llada's and tiny-dream's configs at other sizes; every other field as there.
LLADA_CFG = dict(fixture_files.LLADA_CFG, d_model=96, embedding_size=152, eos_token_id=144, mask_token_id=146,
                 mlp_hidden_size=136, n_heads=4, n_layers=2, pad_token_id=144, vocab_size=147)
DREAM_CFG = dict(fixture_files.DREAM_CFG, bos_token_id=150, eos_token_id=148, intermediate_size=56, mask_token_id=151,
                 max_window_layers=2, num_attention_heads=2, num_hidden_layers=2, pad_token_id=148, vocab_size=152)


class Shape:
    def __init__(self, family, c):
        llada = family == "llada"
        self.family = family
        self.d = c["d_model"] if llada else c["hidden_size"]
        self.H = c["n_heads"] if llada else c["num_attention_heads"]
        self.KV = c["n_kv_heads"] if llada else c["num_key_value_heads"]
        self.L = c["n_layers"] if llada else c["num_hidden_layers"]
        self.ff = c["mlp_hidden_size"] if llada else c["intermediate_size"]
        self.V = c["embedding_size"] if llada else c["vocab_size"]
        self.eps, self.theta = c["rms_norm_eps"], c["rope_theta"]
        self.hd = self.d // self.H
        self.embed = "model.transformer.wte.weight" if llada else "model.embed_tokens.weight"
        self.final_norm = "model.transformer.ln_f.weight" if llada else "model.norm.weight"
        self.head = "model.transformer.ff_out.weight" if llada else "lm_head.weight"


def specs(s):
    """(name, shape, role) of every tensor."""
    d, kv = s.d, s.KV * s.hd
    out = [(s.embed, (s.V, d), "embed")]
    for l in range(s.L):
        n = layer_names(s.family, l)
        out += [(n["an"], (d,), "norm"), (n["q"], (d, d), "lin"), (n["k"], (kv, d), "lin"), (n["v"], (kv, d), "lin"),
                (n["o"], (d, d), "lin"), (n["fn"], (d,), "norm"), (n["g"], (s.ff, d), "lin"), (n["u"], (s.ff, d), "lin"),
                (n["dn"], (d, s.ff), "lin")]
        if "bq" in n:
            out += [(n["bq"], (d,), "bias"), (n["bk"], (kv,), "bias"), (n["bv"], (kv,), "bias")]
    return out + [(s.final_norm, (d,), "norm"), (s.head, (s.V, d), "head")]


def random_weights(s, seed):
    """BF16 tensors scaled as tools/make_fixtures.py scales them (logits spread over several units, so that
    confidences rarely tie); returns {name: (raw bytes, float64 values)}."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape, role in specs(s):
        a = rng.standard_normal(shape)
        if role == "norm":
            a = 1.0 + 0.2 * a
        elif role == "bias":
            a = 0.3 * a
        elif role == "head":
            a = 3.0 * a / math.sqrt(shape[1])
        elif role == "lin":
            a = 1.2 * a / math.sqrt(shape[1])
        bits, val = bf16(a)
        out[name] = (bits.tobytes(), val.reshape(shape))
    return out


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, theta, hd):
    """x [T, heads, hd]; the angles in float32 as HF computes them, the rotation in float64."""
    inv = np.float32(1.0) / (np.float32(theta) ** (np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)))
    ang = np.arange(x.shape[0], dtype=np.float32)[:, None] * inv[None, :]
    c, sn = np.cos(ang).astype(np.float64)[:, None, :], np.sin(ang).astype(np.float64)[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([x1 * c - x2 * sn, x2 * c + x1 * sn], -1)


def logits(s, W, ids):
    """[T, V] float64, bidirectional attention; Dream's shift applied (row i predicts position i)."""
    T, hd = len(ids), s.hd
    h = W[s.embed][np.asarray(ids)]
    for l in range(s.L):
        n = layer_names(s.family, l)
        a = rms(h, W[n["an"]], s.eps)
        q, k, v = a @ W[n["q"]].T, a @ W[n["k"]].T, a @ W[n["v"]].T
        if "bq" in n:
            q, k, v = q + W[n["bq"]], k + W[n["bk"]], v + W[n["bv"]]
        q = rope(q.reshape(T, s.H, hd), s.theta, hd)
        k = np.repeat(rope(k.reshape(T, s.KV, hd), s.theta, hd), s.H // s.KV, axis=1)
        v = np.repeat(v.reshape(T, s.KV, hd), s.H // s.KV, axis=1)
        sc = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        h = h + np.einsum("hts,shd->thd", p, v).reshape(T, s.d) @ W[n["o"]].T
        b = rms(h, W[n["fn"]], s.eps)
        g = b @ W[n["g"]].T
        h = h + (g / (1.0 + np.exp(-g)) * (b @ W[n["u"]].T)) @ W[n["dn"]].T
    out = rms(h, W[s.final_norm], s.eps) @ W[s.head].T
    return np.concatenate([out[:1], out[:-1]], 0) if s.family == "dream" else out


def make(root, name, family, cfg, seed, special, extra_files):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    s = Shape(family, cfg)
    w = random_weights(s, seed)
    shapes = {n: shape for n, shape, _ in specs(s)}
    write_safetensors(os.path.join(d, "model.safetensors"), [(n, "BF16", shapes[n], raw) for n, (raw, _) in w.items()])
    write_json(os.path.join(d, "config.json"), cfg)
    write_json(os.path.join(d, "tokenizer_config.json"), tokenizer_config(special))
    for fname, obj in extra_files.items():
        write_json(os.path.join(d, fname), obj)
    W = {n: val for n, (_, val) in w.items()}
    rng = np.random.default_rng(seed + 1)
    vocab = cfg["vocab_size"]
    inputs = [rng.integers(0, vocab, 23).tolist(), [cfg["mask_token_id"]], rng.integers(0, vocab, 70).tolist()]
    tensors = []
    for i, ids in enumerate(inputs):
        lg = logits(s, W, ids).astype(np.float32)
        tensors.append((f"ids_{i}", "I32", (len(ids),), np.asarray(ids, dtype=np.int32).tobytes()))
        tensors.append((f"logits_{i}", "F32", lg.shape, lg.tobytes()))
    write_safetensors(os.path.join(d, "golden_logits.safetensors"), tensors)


def make_all(root):
    make(root, "tiny-llada-hd24", "llada", LLADA_CFG, 2424, [(144, "<|endoftext|>"), (145, "<|eot_id|>"), (146, "<|mdm_mask|>")],
         {"generation_config.json": {"bos_token_id": 143, "eos_token_id": 144}})
    make(root, "tiny-dream-hd96", "dream", DREAM_CFG, 9696, [(148, "<|endoftext|>"), (149, "<|im_end|>"), (151, "<|mask|>")], {})


def main():
    args = sys.argv[1:]
    if args[:1] == ["--check"] and len(args) == 2:
        bad = fixture_differences(args[1], make_all)
        print("fixtures reproduce" if not bad else "differ: " + ", ".join(bad))
        sys.exit(1 if bad else 0)
    if len(args) != 1:
        sys.exit(__doc__)
    make_all(args[0])


if __name__ == "__main__":
    main()
