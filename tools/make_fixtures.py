#!/usr/bin/env python3
"""Golden fixtures for dllm's tests: tiny random LLaDA and Dream checkpoints in the exact Hugging Face
layout, float64 reference logits for fixed inputs, and token traces of LLaDA's generate.py decoding.

This is an independent PyTorch implementation of the reference semantics (models.md 1.3 / 2.2,
decoding.md 1); it shares nothing with dllm_cuda.cu except the Philox4x32-10 counter-based RNG that
both use for Gumbel noise and random remasking, so the traces must match the C library exactly.

Run (on the GPU machine, torch 2.11; torch 1.13 gives the same weights and traces, and logits equal to
float64 rounding):
    python3 tools/make_fixtures.py tests/data            # write the fixtures
    python3 tools/make_fixtures.py --check tests/data    # regenerate in a temp dir and compare
Writes tests/data/tiny-llada/ and tests/data/tiny-dream/ (each a model directory plus
golden_logits.safetensors and golden_traces.json).
"""
import filecmp
import json
import math
import os
import struct
import sys

import numpy as np
import torch

from fixture_files import (DREAM_CFG, LLADA_CFG, bf16, fixture_differences, layer_names, tokenizer_config,
                           write_json, write_safetensors)

# ----------------------------------------------------------------------------------------------------
# Philox4x32-10, the same generator as dllm__philox / dllm__uniform in dllm_cuda.cu
# ----------------------------------------------------------------------------------------------------
STREAM_GUMBEL, STREAM_REMASK = 1, 2
M0, M1, W0, W1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57), 0x9E3779B9, 0xBB67AE85
MASK32 = np.uint64(0xFFFFFFFF)


def philox(seed, c0, c1, c2, c3):
    """Vectorised over numpy uint32 arrays c0..c3 (broadcast); returns four uint32 arrays."""
    c = [np.asarray(x, dtype=np.uint64) & MASK32 for x in np.broadcast_arrays(c0, c1, c2, c3)]
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0, p1 = M0 * c[0], M1 * c[2]
        n0 = (p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0)
        n2 = (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1)
        c = [n0 & MASK32, p1 & MASK32, n2 & MASK32, p0 & MASK32]
        k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
    return c


def uniform(seed, index, position, step, stream):
    o = philox(seed, index, position, step, stream)
    bits = ((o[0] << np.uint64(32)) | o[1]) >> np.uint64(11)
    return (bits.astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)


# ----------------------------------------------------------------------------------------------------
# Tiny checkpoints: exact real tensor names, real config schema, awkward sizes
# ----------------------------------------------------------------------------------------------------
def bf16_round(a):
    """float32 -> bfloat16 bits (round to nearest even) and the value they hold, as float32."""
    bits, val = bf16(a)
    return bits, val.astype(np.float32)


def encode(a, dtype):
    """Returns (raw bytes, the float64 values the file holds)."""
    if dtype == "BF16":
        bits, val = bf16_round(a)
        return bits.tobytes(), val.astype(np.float64)
    if dtype == "F16":
        h = np.asarray(a, dtype=np.float16)
        return h.tobytes(), h.astype(np.float64)
    f = np.asarray(a, dtype=np.float32)
    return f.tobytes(), f.astype(np.float64)


def llada_specs(c):
    d, ff, V, hd = c["d_model"], c["mlp_hidden_size"], c["embedding_size"], c["d_model"] // c["n_heads"]
    kv = c["n_kv_heads"] * hd
    s = [("model.transformer.wte.weight", (V, d), "embed")]
    for l in range(c["n_layers"]):
        p = f"model.transformer.blocks.{l}."
        s += [(p + "attn_norm.weight", (d,), "norm"), (p + "q_proj.weight", (d, d), "lin"), (p + "k_proj.weight", (kv, d), "lin"),
              (p + "v_proj.weight", (kv, d), "lin"), (p + "attn_out.weight", (d, d), "lin"), (p + "ff_norm.weight", (d,), "norm"),
              (p + "ff_proj.weight", (ff, d), "lin"), (p + "up_proj.weight", (ff, d), "lin"), (p + "ff_out.weight", (d, ff), "lin")]
    s += [("model.transformer.ln_f.weight", (d,), "norm"), ("model.transformer.ff_out.weight", (V, d), "head")]
    return s


def dream_specs(c):
    d, ff, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = d // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    s = [("model.embed_tokens.weight", (V, d), "embed")]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        s += [(p + "input_layernorm.weight", (d,), "norm"), (p + "self_attn.q_proj.weight", (d, d), "lin"),
              (p + "self_attn.q_proj.bias", (d,), "bias"), (p + "self_attn.k_proj.weight", (kv, d), "lin"),
              (p + "self_attn.k_proj.bias", (kv,), "bias"), (p + "self_attn.v_proj.weight", (kv, d), "lin"),
              (p + "self_attn.v_proj.bias", (kv,), "bias"), (p + "self_attn.o_proj.weight", (d, d), "lin"),
              (p + "post_attention_layernorm.weight", (d,), "norm"), (p + "mlp.gate_proj.weight", (ff, d), "lin"),
              (p + "mlp.up_proj.weight", (ff, d), "lin"), (p + "mlp.down_proj.weight", (d, ff), "lin")]
    s += [("model.norm.weight", (d,), "norm"), ("lm_head.weight", (V, d), "head")]
    return s


def random_tensor(rng, shape, role):
    """Scaled so that logits spread over several units: confidences then rarely tie."""
    if role == "embed":
        return rng.standard_normal(shape)
    if role == "norm":
        return 1.0 + 0.2 * rng.standard_normal(shape)
    if role == "bias":
        return 0.3 * rng.standard_normal(shape)
    if role == "head":
        return 3.0 * rng.standard_normal(shape) / math.sqrt(shape[1])
    return 1.2 * rng.standard_normal(shape) / math.sqrt(shape[1])


def make_weights(specs, seed, dtype_of, boost_rows=()):
    rng = np.random.default_rng(seed)
    raw, val = {}, {}
    for name, shape, role in specs:
        a = random_tensor(rng, shape, role)
        if role == "head":
            for r in boost_rows:  # EOS/EoT rows win often, so the EOS options are exercised
                a[r] *= 1.8
        dt = dtype_of(name, role)
        raw[name], v = encode(a, dt)
        raw[name] = (dt, shape, raw[name])
        val[name] = torch.from_numpy(v.reshape(shape))
    return raw, val


# ----------------------------------------------------------------------------------------------------
# The reference forward (float64), written from the HF modeling code
# ----------------------------------------------------------------------------------------------------
def rms(x, w, eps):
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)) * w


def rope_tables(theta, hd, n):
    """float32 angles exactly as HF computes them, then float64 for the arithmetic."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cos(ang).double(), torch.sin(ang).double()


def rope(x, cos, sin):  # x [T, H, hd]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


class Model:
    def __init__(self, family, cfg, W):
        self.family, self.cfg, self.W = family, cfg, W
        if family == "llada":
            self.d, self.H, self.KV, self.L = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"], cfg["n_layers"]
            self.eps, self.theta, self.shift = cfg["rms_norm_eps"], cfg["rope_theta"], False
        else:
            self.d, self.H, self.KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
            self.L, self.eps, self.theta, self.shift = cfg["num_hidden_layers"], cfg["rms_norm_eps"], cfg["rope_theta"], True
        self.hd = self.d // self.H

    def names(self, l):
        return layer_names(self.family, l)

    def logits(self, ids):
        """[T, V] float64; with Dream's shift applied (row i predicts position i)."""
        W, T = self.W, len(ids)
        ids_t = torch.tensor(ids, dtype=torch.long)
        emb = W["model.transformer.wte.weight" if self.family == "llada" else "model.embed_tokens.weight"]
        h = emb[ids_t]
        cos, sin = rope_tables(self.theta, self.hd, T)
        for l in range(self.L):
            n = self.names(l)
            a = rms(h, W[n["an"]], self.eps)
            q, k, v = a @ W[n["q"]].T, a @ W[n["k"]].T, a @ W[n["v"]].T
            if "bq" in n:
                q, k, v = q + W[n["bq"]], k + W[n["bk"]], v + W[n["bv"]]
            q = rope(q.view(T, self.H, self.hd), cos, sin)
            k = rope(k.view(T, self.KV, self.hd), cos, sin)
            v = v.view(T, self.KV, self.hd)
            g = self.H // self.KV
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(self.hd)
            o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v).reshape(T, self.d)
            h = h + o @ W[n["o"]].T
            b = rms(h, W[n["fn"]], self.eps)
            h = h + (torch.nn.functional.silu(b @ W[n["g"]].T) * (b @ W[n["u"]].T)) @ W[n["dn"]].T
        if self.family == "llada":
            out = rms(h, W["model.transformer.ln_f.weight"], self.eps) @ W["model.transformer.ff_out.weight"].T
        else:
            out = rms(h, W["model.norm.weight"], self.eps) @ W["lm_head.weight"].T
        if self.shift:
            out = torch.cat([out[:1], out[:-1]], 0)
        return out


# ----------------------------------------------------------------------------------------------------
# LLaDA generate.py, with dllm's documented determinism: float64 confidences, ties to the lower index,
# confidence_eos_eot_inf as intended (EOS/EoT predictions are committed last)
# ----------------------------------------------------------------------------------------------------
def generate(model, prompt, steps, gen_length, block_length, temperature=0.0, cfg_scale=0.0, remasking="low_confidence",
             seed=0, mask_id=0, eos_id=-1, eot_id=-1, logits_eos_inf=False, confidence_eos_eot_inf=False):
    temperature = float(np.float32(temperature))  # the C API takes a float
    cfg_scale = float(np.float32(cfg_scale))
    Lp = len(prompt)
    x = list(prompt) + [mask_id] * gen_length
    is_prompt = [t != mask_id for t in prompt] + [False] * gen_length
    nb = gen_length // block_length
    spb = steps // nb
    canvases, gstep = [], 0
    for b in range(nb):
        s1 = Lp + (b + 1) * block_length
        n = sum(1 for t in x[Lp + b * block_length:s1] if t == mask_id)
        for i in range(spb):
            k = n // spb + (1 if i < n % spb else 0)
            logits = model.logits(x)
            if cfg_scale > 0:
                un = [mask_id if is_prompt[p] else t for p, t in enumerate(x)]
                U = model.logits(un)
                logits = U + (cfg_scale + 1) * (logits - U)
            if logits_eos_inf:
                logits[:, eos_id] = -math.inf
            N, V = logits.shape
            if temperature > 0:
                u = uniform(seed, np.arange(V)[None, :], np.arange(N)[:, None], gstep, STREAM_GUMBEL)
                noised = torch.exp(logits) / torch.from_numpy(-np.log(u)) ** temperature
                x0 = torch.argmax(noised, -1)
            else:
                x0 = torch.argmax(logits, -1)
            if remasking == "low_confidence":
                conf = torch.softmax(logits, -1).gather(-1, x0[:, None])[:, 0]
            else:
                conf = torch.from_numpy(uniform(seed, 0, np.arange(N), gstep, STREAM_REMASK))
            cand = [p for p in range(s1) if x[p] == mask_id]

            def key(p):
                deferred = confidence_eos_eot_inf and int(x0[p]) in (eos_id, eot_id)
                return (deferred, -float(conf[p]), p)

            for p in sorted(cand, key=key)[:k]:
                x[p] = int(x0[p])
            canvases.append(list(x))
            gstep += 1
    return canvases


def truncate(gen, eos_id, eot_id):
    out = []
    for t in gen:
        if t in (eos_id, eot_id):
            break
        out.append(t)
    return out


# ----------------------------------------------------------------------------------------------------
# Writing the fixture directories
# ----------------------------------------------------------------------------------------------------
def golden_logits(model, out_dir, inputs):
    tensors = []
    for i, ids in enumerate(inputs):
        lg = model.logits(ids).numpy().astype(np.float32)
        tensors.append((f"ids_{i}", "I32", (len(ids),), np.asarray(ids, dtype=np.int32).tobytes()))
        tensors.append((f"logits_{i}", "F32", lg.shape, lg.tobytes()))
    write_safetensors(os.path.join(out_dir, "golden_logits.safetensors"), tensors)


def golden_traces(model, out_dir, name, cases, mask_id, eos_id, eot_id):
    out = []
    for case in cases:
        c = dict(case)
        canv = generate(model, c["prompt"], c["steps"], c["gen_length"], c["block_length"], c.get("temperature", 0.0),
                        c.get("cfg_scale", 0.0), c.get("remasking", "low_confidence"), c.get("seed", 0), mask_id, eos_id, eot_id,
                        c.get("logits_eos_inf", False), c.get("confidence_eos_eot_inf", False))
        c["canvases"] = canv
        c["output"] = truncate(canv[-1][len(c["prompt"]):], eos_id, eot_id)
        out.append(c)
    write_json(os.path.join(out_dir, "golden_traces.json"), {"model": name, "mask_id": mask_id, "eos_id": eos_id, "eot_id": eot_id, "cases": out})


def make_llada(root):
    d = os.path.join(root, "tiny-llada")
    os.makedirs(d, exist_ok=True)
    c = LLADA_CFG
    raw, val = make_weights(llada_specs(c), 1234, lambda n, r: "BF16", boost_rows=(128, 129))
    write_safetensors(os.path.join(d, "model.safetensors"), [(n, *raw[n]) for n in raw])
    write_json(os.path.join(d, "config.json"), c)
    write_json(os.path.join(d, "tokenizer_config.json"), tokenizer_config([(128, "<|endoftext|>"), (129, "<|eot_id|>"), (130, "<|mdm_mask|>")]))
    write_json(os.path.join(d, "generation_config.json"), {"bos_token_id": 127, "eos_token_id": 128})
    m = Model("llada", c, val)
    rng = np.random.default_rng(99)
    golden_logits(m, d, [rng.integers(0, 131, 23).tolist(), [130], rng.integers(0, 136, 64).tolist()])
    P = rng.integers(0, 128, 11).tolist()
    cases = [
        dict(name="lowconf_b8", prompt=P, steps=16, gen_length=16, block_length=8),
        dict(name="two_per_step_single_block", prompt=P, steps=8, gen_length=16, block_length=16),
        dict(name="remainder_to_earliest", prompt=P, steps=5, gen_length=16, block_length=16),
        dict(name="random_remask", prompt=P, steps=12, gen_length=24, block_length=8, remasking="random", seed=7),
        dict(name="temperature", prompt=P, steps=16, gen_length=16, block_length=4, temperature=0.7, seed=3),
        dict(name="cfg", prompt=P, steps=8, gen_length=16, block_length=8, cfg_scale=1.5),
        dict(name="all_options", prompt=P, steps=10, gen_length=20, block_length=10, temperature=1.0, remasking="random",
             cfg_scale=0.5, seed=0x123456789AB),
        dict(name="eos_inf", prompt=P, steps=16, gen_length=16, block_length=8, logits_eos_inf=True),
        dict(name="eos_eot_last", prompt=P, steps=16, gen_length=16, block_length=8, confidence_eos_eot_inf=True),
        dict(name="infill_prompt_mask", prompt=P[:5] + [130] + P[6:], steps=8, gen_length=8, block_length=8),
        dict(name="empty_prompt_like", prompt=P[:1], steps=12, gen_length=12, block_length=3, temperature=0.3, seed=5),
    ]
    golden_traces(m, d, "tiny-llada", cases, 130, 128, 129)


def make_dream(root):
    d = os.path.join(root, "tiny-dream")
    os.makedirs(d, exist_ok=True)
    c = DREAM_CFG
    dtype_of = lambda n, r: "F32" if r == "norm" else ("F16" if r == "bias" else "BF16")
    raw, val = make_weights(dream_specs(c), 4321, dtype_of, boost_rows=(138, 139))
    names = sorted(raw)
    shards = {"model-00001-of-00002.safetensors": names[0::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map, total = {}, 0
    for shard, ns in shards.items():
        write_safetensors(os.path.join(d, shard), [(n, *raw[n]) for n in ns])
        for n in ns:
            weight_map[n] = shard
            total += len(raw[n][2])
    write_json(os.path.join(d, "model.safetensors.index.json"), {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    write_json(os.path.join(d, "config.json"), c)
    write_json(os.path.join(d, "tokenizer_config.json"), tokenizer_config([(138, "<|endoftext|>"), (139, "<|im_end|>"), (142, "<|mask|>")]))
    m = Model("dream", c, val)
    rng = np.random.default_rng(77)
    golden_logits(m, d, [rng.integers(0, 144, 19).tolist(), [5]])
    P = rng.integers(0, 138, 9).tolist()
    cases = [
        dict(name="lowconf", prompt=P, steps=12, gen_length=12, block_length=4),
        dict(name="random_temperature", prompt=P, steps=8, gen_length=16, block_length=8, temperature=0.5, remasking="random", seed=21),
        dict(name="cfg_eos", prompt=P, steps=6, gen_length=12, block_length=6, cfg_scale=2.0, logits_eos_inf=True, confidence_eos_eot_inf=True),
    ]
    golden_traces(m, d, "tiny-dream", cases, 142, 138, 139)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        dt = {"F32": np.float32, "I32": np.int32}[e["dtype"]]
        out[name] = np.frombuffer(raw[8 + n + b:8 + n + end], dtype=dt).reshape(e["shape"])
    return out


def rel_diff(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.max(np.abs(a - b))) / max(1e-30, float(np.max(np.abs(b))))


def check(root):
    """Regenerates the fixtures and compares: identical files, except golden logits, which must agree to
    float64 rounding (BLAS summation order differs between torch versions)."""
    def same(rel, a, b):
        if os.path.basename(rel) != "golden_logits.safetensors":
            return filecmp.cmp(a, b, shallow=False)
        ta, tb = read_safetensors(a), read_safetensors(b)
        err = max(rel_diff(ta[k], tb[k]) for k in tb)
        print(f"{rel}: max relative difference {err:.2e}")
        return ta.keys() == tb.keys() and err < 1e-6
    bad = fixture_differences(root, lambda d: (make_llada(d), make_dream(d)), same)
    for rel in bad:
        print(f"{rel}: DIFFERS")
    print("fixtures reproduce" if not bad else "fixtures DIFFER", "with torch", torch.__version__)
    return not bad


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)  # here, not at import: tools/train_tiny.py imports this module
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        sys.exit(0 if check(sys.argv[2] if len(sys.argv) > 2 else "tests/data") else 1)
    root = sys.argv[1] if len(sys.argv) > 1 else "tests/data"
    make_llada(root)
    make_dream(root)
    print("fixtures written under", root, "with torch", torch.__version__)
