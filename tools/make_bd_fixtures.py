#!/usr/bin/env python3
"""make_bd_fixtures.py - golden fixtures for dllm's block diffusion: tiny random Fast-dLLM v2 and
Nemotron-Labs-Diffusion checkpoints in their real Hugging Face layouts, float64 reference logits, and token
traces of Fast-dLLM v2's official `generate` (block-diffusion.md), plus YaRN frequencies of the real
Nemotron-Labs-Diffusion-8B config.

This is an independent numpy implementation written from the official code (Fast_dLLM_v2_7B modeling.py:
the eval mask, the K/V cache updates, `generate` with and without `use_block_cache`; transformers'
_compute_yarn_parameters; Ministral-3's Llama-4 query scaling). It shares nothing with dllm_cuda.cu; its
`generate` follows the official loop line by line (x_t, prompt_length, the sub-block while loops). The forward
runs in float64 (dllm's CPU backend in float32), so every decision is checked to have a margin well above
float32 rounding (argmax gaps, the threshold, the best candidate): a fixture with a near-tie is refused.

Run (numpy only; a few seconds):
    python3 tools/make_bd_fixtures.py tests/data            # write the fixtures
    python3 tools/make_bd_fixtures.py --check tests/data    # regenerate in a temp dir and compare
Writes tests/data/tiny-fast-dllm-v2/ and tests/data/tiny-nemotron-diffusion/ (each a model directory plus
golden_logits.safetensors and golden_traces.json) and tests/data/yarn_nemotron_8b.json.
"""
import copy
import math
import os
import sys

import numpy as np

from fixture_files import bf16, fixture_differences, write_json, write_safetensors

MARGIN = 2e-5  # smallest accepted gap (in logits or probability) behind any decision of a trace
TIE = 1e-12    # confidences closer than this are equal in exact arithmetic (rounding noise)

# ----------------------------------------------------------------------------------------------------
# Files: safetensors, BF16
# ----------------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------------
# Tiny configs in the real schemas (models.md 3.1 and 4.2), awkward sizes
# ----------------------------------------------------------------------------------------------------
FAST_SPECIAL = {"<|endoftext|>": 150, "<|im_start|>": 151, "<|im_end|>": 152, "|<MASK>|": 155}
FAST_CFG = {
    "architectures": ["Fast_dLLM_QwenForCausalLM"], "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig", "AutoModel": "modeling.Fast_dLLM_QwenModel",
                 "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
    "bd_size": 32, "bos_token_id": 150, "conplemenrary_mask": True, "eos_token_id": 152, "hidden_act": "silu",
    "hidden_size": 96, "initializer_range": 0.02, "intermediate_size": 136, "layer_types": ["full_attention"] * 2,
    "max_position_embeddings": 256, "max_window_layers": 2, "model_type": "Fast_dLLM_Qwen", "num_attention_heads": 6,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": 152, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.53.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 160,
}

NEMO_CFG = {
    "ar_loss_weight": 1.0, "architectures": ["NemotronLabsDiffusionModel"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_implementation": "sdpa",
    "auto_map": {"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                 "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"},
    "block_size": 8, "bos_token_id": 1, "dlm_loss_weight": None, "dlm_paradigm": "bidirectional", "dp_varying_mask_ratio": False,
    "eos_token_id": 11, "head_dim": 24, "hidden_act": "silu", "hidden_size": 80, "initializer_range": 0.02,
    "intermediate_size": 112, "mask_token_id": 100, "max_position_embeddings": 256, "mlp_bias": False,
    "model_type": "nemotron_labs_diffusion", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {"beta_fast": 8.0, "beta_slow": 1.0, "factor": 4.0, "llama_4_scaling_beta": 0.1, "mscale": 1.0,
                        "mscale_all_dim": 0.5, "original_max_position_embeddings": 32, "rope_theta": 10000.0, "rope_type": "yarn"},
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "5.0.0",
    "use_cache": False, "vocab_size": 131,
}

# The real Nemotron-Labs-Diffusion-8B RoPE settings (models.md 4.2), for the YaRN frequency fixture.
NEMO_8B_ROPE = {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0, "llama_4_scaling_beta": 0.1, "mscale": 1.0, "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 16384, "rope_theta": 1000000.0, "rope_type": "yarn"}


def qwen_specs(c, prefix, head, bias):
    d, ff, V, H, KV = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", d // H)
    s = [(prefix + "embed_tokens.weight", (V, d), "embed")]
    for l in range(c["num_hidden_layers"]):
        p = f"{prefix}layers.{l}."
        s += [(p + "input_layernorm.weight", (d,), "norm"), (p + "self_attn.q_proj.weight", (H * hd, d), "lin"),
              (p + "self_attn.k_proj.weight", (KV * hd, d), "lin"), (p + "self_attn.v_proj.weight", (KV * hd, d), "lin"),
              (p + "self_attn.o_proj.weight", (d, H * hd), "lin"), (p + "post_attention_layernorm.weight", (d,), "norm"),
              (p + "mlp.gate_proj.weight", (ff, d), "lin"), (p + "mlp.up_proj.weight", (ff, d), "lin"),
              (p + "mlp.down_proj.weight", (d, ff), "lin")]
        if bias:
            s += [(p + "self_attn.q_proj.bias", (H * hd,), "bias"), (p + "self_attn.k_proj.bias", (KV * hd,), "bias"),
                  (p + "self_attn.v_proj.bias", (KV * hd,), "bias")]
    return s + [(prefix + "norm.weight", (d,), "norm"), (head, (V, d), "head")]


def make_weights(specs, seed, boost_rows=(), boost=1.6):
    """BF16 tensors scaled so that logits spread over several units; head rows of the stop token scaled by boost."""
    rng = np.random.default_rng(seed)
    raw, val = {}, {}
    for name, shape, role in specs:
        if role == "embed":
            a = rng.standard_normal(shape)
        elif role == "norm":
            a = 1.0 + 0.2 * rng.standard_normal(shape)
        elif role == "bias":
            a = 0.3 * rng.standard_normal(shape)
        elif role == "head":
            a = 3.0 * rng.standard_normal(shape) / math.sqrt(shape[1])
            for r in boost_rows:
                a[r] *= boost
        else:
            a = 1.2 * rng.standard_normal(shape) / math.sqrt(shape[1])
        bits, v = bf16(a)
        raw[name] = ("BF16", shape, bits.tobytes())
        val[name] = v.reshape(shape)
    return raw, val


# ----------------------------------------------------------------------------------------------------
# RoPE: transformers' default and _compute_yarn_parameters (float32 tensors), Llama-4 query scaling
# ----------------------------------------------------------------------------------------------------
def inv_freq_and_scale(rope, dim):
    """(inv_freq float32 [dim/2], attention_factor) as transformers computes them."""
    base = rope["rope_theta"]
    exponents = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)
    pos_freqs = np.power(np.float32(base), exponents, dtype=np.float32)
    if rope.get("rope_type", "default") != "yarn":
        return (np.float32(1.0) / pos_freqs).astype(np.float32), 1.0
    factor, orig = rope["factor"], rope["original_max_position_embeddings"]

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rope.get("attention_factor")
    if attention_factor is None:
        m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
        attention_factor = get_mscale(factor, m) / get_mscale(factor, m_all) if m and m_all else get_mscale(factor)
    beta_fast, beta_slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = max(math.floor(correction_dim(beta_fast)), 0), min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    extrapolation = (np.float32(1.0) / pos_freqs).astype(np.float32)
    interpolation = (np.float32(1.0) / (np.float32(factor) * pos_freqs)).astype(np.float32)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1).astype(np.float32)
    extrapolation_factor = (np.float32(1) - ramp).astype(np.float32)
    inv = interpolation * (np.float32(1) - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv.astype(np.float32), float(attention_factor)


def llama4_scale(rope, positions):
    beta = rope.get("llama_4_scaling_beta")
    if not beta:
        return np.ones(len(positions))
    orig = rope["original_max_position_embeddings"]
    p = np.asarray(positions, dtype=np.float32)
    return (np.float32(1) + np.float32(beta) * np.log(np.float32(1) + np.floor(p / np.float32(orig)))).astype(np.float32).astype(np.float64)


# ----------------------------------------------------------------------------------------------------
# The reference forward (float64) with Fast-dLLM v2's cache semantics
# ----------------------------------------------------------------------------------------------------
class Model:
    def __init__(self, family, cfg, W):
        self.family, self.cfg, self.W = family, cfg, W
        self.d, self.H, self.KV, self.L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
        self.hd = cfg.get("head_dim", self.d // self.H)
        self.eps = cfg["rms_norm_eps"]
        if family == "fast":
            self.prefix, self.head, self.rope = "model.", "lm_head.weight", {"rope_theta": cfg["rope_theta"]}
        else:
            self.prefix, self.head, self.rope = "encoder.", "diffusion_head.weight", cfg["rope_parameters"]
        self.inv_freq, self.attention_factor = inv_freq_and_scale(self.rope, self.hd)

    def cos_sin(self, positions):
        ang = np.asarray(positions, dtype=np.float32)[:, None] * self.inv_freq[None, :]  # float32, as HF
        af = np.float32(self.attention_factor)
        return (np.cos(ang) * af).astype(np.float64), (np.sin(ang) * af).astype(np.float64)

    @staticmethod
    def rope_apply(x, cos, sin):  # x [T, heads, hd]; rotate_half
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def forward(self, ids, past, offset=0, mask_block=None, block_kv=None):
        """Logits [T, V] (unshifted) of ids at positions len(past) + offset + i, and the fresh per-layer (k, v).
        past: per-layer (K, V) of the committed cache. mask_block: the eval mask q // Bm >= k // Bm over
        sequence indices. block_kv: the sub-block path: fresh k/v overwrite rows [offset, offset + T) of it
        (in place, as the official code does) and the keys are past ++ block_kv, unmasked."""
        W, T = self.W, len(ids)
        n = past[0][0].shape[0] if past else 0
        pos = n + offset + np.arange(T)
        cos, sin = self.cos_sin(pos)
        h = W[self.prefix + "embed_tokens.weight"][np.asarray(ids)]
        fresh = []
        for l in range(self.L):
            p = f"{self.prefix}layers.{l}."
            a = self.rms(h, W[p + "input_layernorm.weight"])
            q, k, v = (a @ W[p + f"self_attn.{x}_proj.weight"].T for x in "qkv")
            if p + "self_attn.q_proj.bias" in W:
                q, k, v = q + W[p + "self_attn.q_proj.bias"], k + W[p + "self_attn.k_proj.bias"], v + W[p + "self_attn.v_proj.bias"]
            q = self.rope_apply(q.reshape(T, self.H, self.hd), cos, sin) * llama4_scale(self.rope, pos)[:, None, None]
            k = self.rope_apply(k.reshape(T, self.KV, self.hd), cos, sin)
            v = v.reshape(T, self.KV, self.hd)
            fresh.append((k, v))
            pk = past[l][0] if past else np.zeros((0, self.KV, self.hd))
            pv = past[l][1] if past else np.zeros((0, self.KV, self.hd))
            allowed = None
            if block_kv is not None:
                block_kv[l][0][offset:offset + T] = k
                block_kv[l][1][offset:offset + T] = v
                keys, values = np.concatenate([pk, block_kv[l][0]]), np.concatenate([pv, block_kv[l][1]])
            else:
                keys, values = np.concatenate([pk, k]), np.concatenate([pv, v])
                if mask_block:
                    qi, ki = (n + offset + np.arange(T))[:, None], np.arange(keys.shape[0])[None, :]
                    allowed = qi // mask_block >= ki // mask_block
            g = self.H // self.KV
            keys, values = np.repeat(keys, g, axis=1), np.repeat(values, g, axis=1)
            s = np.einsum("thd,shd->hts", q, keys) / math.sqrt(self.hd)
            if allowed is not None:
                s = np.where(allowed[None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", s, values).reshape(T, self.H * self.hd)
            h = h + o @ W[p + "self_attn.o_proj.weight"].T
            b = self.rms(h, W[p + "post_attention_layernorm.weight"])
            gate, up = b @ W[p + "mlp.gate_proj.weight"].T, b @ W[p + "mlp.up_proj.weight"].T
            h = h + (gate / (1 + np.exp(-gate)) * up) @ W[p + "mlp.down_proj.weight"].T
        return self.rms(h, W[self.prefix + "norm.weight"]) @ W[self.head].T, fresh


def append(past, fresh):
    return [(np.concatenate([pk, k]), np.concatenate([pv, v])) for (pk, pv), (k, v) in zip(past, fresh)] if past else fresh


# ----------------------------------------------------------------------------------------------------
# Fast-dLLM v2's generate, line by line, with margin bookkeeping
# ----------------------------------------------------------------------------------------------------
class Margins:
    def __init__(self):
        self.argmax = self.threshold = self.best = math.inf

    def logits_row(self, row):
        top = np.sort(row)[-2:]
        self.argmax = min(self.argmax, float(top[1] - top[0]))


def shift(logits, on):
    return np.concatenate([logits[:1], logits[:-1]]) if on else logits


def generate(model, prompt, max_new_tokens, mask_id, stop_token, threshold=1.0, small_block_size=8, block_size=32, use_block_cache=False,
             prefill_mask=None, step_mask=32, shift_on=True):
    """Returns (output ids after the prompt, the committed [[pos, tok], ...] of each diffusion step, forwards, margins).
    prefill_mask: the granularity of the prefill and commit forwards (the official code passes block_size)."""
    prefill_mask = prefill_mask or block_size
    mg, steps, forwards = Margins(), [], 0
    num_blocks = max_new_tokens // block_size
    input_ids = list(prompt)
    original_input_length = len(input_ids)
    past = None
    if len(input_ids) > block_size:
        logits, past = model.forward(input_ids[:len(input_ids) // block_size * block_size], None, mask_block=prefill_mask)
        forwards += 1
        if len(input_ids) % block_size == 0:
            mg.logits_row(logits[-1])
            input_ids.append(int(np.argmax(logits[-1])))
    num_small_blocks = block_size // small_block_size

    def stop_reached(x_t, prompt_length):
        tail = x_t[prompt_length:]
        if stop_token in tail:
            idx = tail.index(stop_token)
            return mask_id not in tail[:idx]
        return False

    for _ in range(num_blocks):
        if stop_token in input_ids[original_input_length:]:
            break
        prompt_length = len(input_ids)
        x_t = input_ids + [mask_id] * (block_size - prompt_length % block_size)
        block_kv = None
        while True:
            if stop_reached(x_t, prompt_length):
                break
            if mask_id not in x_t[-block_size:]:
                logits, fresh = model.forward(x_t[-block_size:], past, mask_block=prefill_mask)
                forwards += 1
                past = append(past, fresh)
                mg.logits_row(logits[-1])
                x_t.append(int(np.argmax(logits[-1])))
                break
            for small_block_idx in range(num_small_blocks):
                s0 = small_block_idx * small_block_size
                start = len(x_t) - block_size + s0
                while True:
                    if mask_id not in x_t[start:start + small_block_size]:
                        break
                    if stop_reached(x_t, prompt_length):
                        break
                    if use_block_cache:
                        if block_kv is None or x_t[start] == mask_id:
                            logits, fresh = model.forward(x_t[-block_size:], past, mask_block=step_mask)
                            block_kv = [(k.copy(), v.copy()) for k, v in fresh]
                            logits = shift(logits, shift_on)[s0:s0 + small_block_size]
                        else:
                            logits, _ = model.forward(x_t[start:start + small_block_size], past, offset=s0, block_kv=block_kv)
                            logits = shift(logits, shift_on)
                    else:
                        logits, _ = model.forward(x_t[-block_size:], past, mask_block=step_mask)
                        logits = shift(logits, shift_on)[s0:s0 + small_block_size]
                    forwards += 1
                    masked = np.array([t == mask_id for t in x_t[start:start + small_block_size]])
                    # dllm's one deliberate change: the mask token is never predicted (committing it would leave the
                    # position masked, and the official loop would never end; a trained model gives it ~0 mass).
                    logits = logits.copy()
                    logits[:, mask_id] = -np.inf
                    p = np.exp(logits - logits.max(-1, keepdims=True))
                    p /= p.sum(-1, keepdims=True)
                    x1 = p.argmax(-1)
                    conf = np.where(masked, p[np.arange(len(x1)), x1], -np.inf)
                    commit = conf > threshold
                    # Confidences equal up to float64 rounding come from rows that are equal in exact arithmetic
                    # (a block of masks only, without context, gives identical rows): the official pick is then
                    # rounding noise (block-diffusion.md); dllm's is the lowest position, as here.
                    best = int(np.flatnonzero(conf >= conf.max() - TIE)[0])
                    commit[best] = True
                    commit &= masked
                    for i in np.flatnonzero(masked):
                        mg.logits_row(logits[i])
                        if threshold < 1:
                            mg.threshold = min(mg.threshold, abs(float(conf[i]) - threshold))
                    gaps = np.diff(np.unique(conf[masked]))  # ties (one row, or rows equal in exact arithmetic) are not gaps
                    if (gaps > TIE).any():
                        mg.best = min(mg.best, float(gaps[gaps > TIE].min()))
                    step = []
                    for i in np.flatnonzero(commit):
                        x_t[start + i] = int(x1[i])
                        step.append([start + int(i), int(x1[i])])
                    steps.append(step)
        input_ids = x_t
    out = input_ids[original_input_length:]
    if stop_token in out:
        out = out[:out.index(stop_token) + 1]
    return out, steps, forwards, mg


# ----------------------------------------------------------------------------------------------------
# Fixture directories
# ----------------------------------------------------------------------------------------------------
def golden_logits(model, out_dir, inputs, mask_block, shift_on):
    """dllm_logits semantics: the plain forward without a cache, block-causal at the model forward's default."""
    tensors = []
    for i, ids in enumerate(inputs):
        lg, _ = model.forward(ids, None, mask_block=mask_block)
        lg = shift(lg, shift_on).astype(np.float32)
        tensors.append((f"ids_{i}", "I32", (len(ids),), np.asarray(ids, dtype=np.int32).tobytes()))
        tensors.append((f"logits_{i}", "F32", lg.shape, lg.tobytes()))
    write_safetensors(os.path.join(out_dir, "golden_logits.safetensors"), tensors)


def golden_traces(model, out_dir, name, cases, mask_id, stop_id, **gen_kwargs):
    out = []
    for case in cases:
        c = dict(case)
        threshold = c.get("threshold") or 1.0
        kw = dict(gen_kwargs)
        if "block_size" in c:
            kw["block_size"] = c["block_size"]
        if "shift" in c:  # the model's config switch (Nemotron: "shift_logits")
            kw["shift_on"] = c["shift"]
        o, steps, forwards, mg = generate(model, c["prompt"], c["gen_length"], mask_id, stop_id, threshold, c["sub_block"],
                                          use_block_cache=c.get("block_cache", False), **kw)
        margin = min(mg.argmax, mg.threshold, mg.best)
        print(f"{name} {c['name']}: {len(o)} ids, {len(steps)} steps, {forwards} forwards, stop {'yes' if stop_id in o else 'no'}, "
              f"margins argmax {mg.argmax:.2e} threshold {mg.threshold:.2e} best {mg.best:.2e}")
        if margin < MARGIN:
            sys.exit(f"{name} {c['name']}: a decision is within {margin:.1e} of a tie; float32 could flip it: change the case")
        c.update(output=o, steps=steps, n_steps=len(steps), forwards=forwards)
        out.append(c)
    write_json(os.path.join(out_dir, "golden_traces.json"), {"model": name, "mask_id": mask_id, "stop_id": stop_id, "cases": out})


def write_model(d, cfg, specs, seed, boost_rows, boost, shards):
    os.makedirs(d, exist_ok=True)
    raw, val = make_weights(specs, seed, boost_rows, boost)
    names = sorted(raw)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), [(n, *raw[n]) for n in names])
    else:
        weight_map, total = {}, 0
        for s in range(shards):
            shard = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(os.path.join(d, shard), [(n, *raw[n]) for n in names[s::shards]])
            for n in names[s::shards]:
                weight_map[n] = shard
                total += len(raw[n][2])
        write_json(os.path.join(d, "model.safetensors.index.json"),
                   {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    write_json(os.path.join(d, "config.json"), cfg)
    return val


def make_fast(root):
    d = os.path.join(root, "tiny-fast-dllm-v2")
    c = FAST_CFG
    val = write_model(d, c, qwen_specs(c, "model.", "lm_head.weight", True), 2501, (FAST_SPECIAL["<|im_end|>"],), 1.6, 2)
    # The real checkpoint names its mask and stop only here (block-diffusion.md): config.json has neither.
    write_json(os.path.join(d, "added_tokens.json"), dict(sorted(FAST_SPECIAL.items())))
    write_json(os.path.join(d, "tokenizer_config.json"), {
        "add_bos_token": False, "additional_special_tokens": ["|<MASK>|"], "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                                          "special": True} for t, i in sorted(FAST_SPECIAL.items(), key=lambda e: e[1])}})
    m = Model("fast", c, val)
    rng = np.random.default_rng(31)
    golden_logits(m, d, [rng.integers(0, 150, 45).tolist(), [7]], 32, True)
    prompt = rng.integers(0, 150, 70).tolist()
    mask, stop = FAST_SPECIAL["|<MASK>|"], FAST_SPECIAL["<|im_end|>"]
    cases = []
    for L in (10, 32, 40, 64):  # shorter than a block, exactly one (never forwarded), a block and a bit, two (prefill + AR seed)
        for bc in (False, True):
            cases.append(dict(name=f"L{L}_tau1{'_bc' if bc else ''}", prompt=prompt[:L], gen_length=64, sub_block=8, block_cache=bc))
            cases.append(dict(name=f"L{L}_tau0.3{'_bc' if bc else ''}", prompt=prompt[:L], gen_length=64, sub_block=8, threshold=0.3,
                              block_cache=bc))
    for L in (5, 8, 11, 16):  # a small block: B 8, S 4
        cases.append(dict(name=f"B8_L{L}_tau0.25_bc", prompt=prompt[:L], gen_length=24, block_size=8, sub_block=4, threshold=0.25, block_cache=True))
        cases.append(dict(name=f"B8_L{L}_tau0.25", prompt=prompt[:L], gen_length=24, block_size=8, sub_block=4, threshold=0.25))
    cases.append(dict(name="B16_L20_S16_tau0.2", prompt=prompt[:20], gen_length=32, block_size=16, sub_block=16, threshold=0.2))
    golden_traces(m, d, "tiny-fast-dllm-v2", cases, mask, stop, step_mask=32)


def make_nemotron(root):
    d = os.path.join(root, "tiny-nemotron-diffusion")
    c = NEMO_CFG
    val = write_model(d, c, qwen_specs(c, "encoder.", "diffusion_head.weight", False), 2502, (c["eos_token_id"],), 0.5, 1)
    m = Model("nemotron", c, val)
    rng = np.random.default_rng(32)
    golden_logits(m, d, [rng.integers(0, 131, 70).tolist(), [3, 5]], c["block_size"], True)
    prompt = [int(t) for t in rng.integers(12, 100, 40)]
    cases = []
    for L in (5, 8, 13, 33):
        cases.append(dict(name=f"L{L}_tau0.3", prompt=prompt[:L], gen_length=32, block_size=8, sub_block=4, threshold=0.3))
        cases.append(dict(name=f"L{L}_tau1_bc", prompt=prompt[:L], gen_length=32, block_size=8, sub_block=4, block_cache=True))
    for L in (8, 13):  # config.json "shift_logits": false: position i scored by row i
        cases.append(dict(name=f"L{L}_tau0.3_noshift", prompt=prompt[:L], gen_length=32, block_size=8, sub_block=4, threshold=0.3, shift=False))
        cases.append(dict(name=f"L{L}_tau1_bc_noshift", prompt=prompt[:L], gen_length=32, block_size=8, sub_block=4, block_cache=True,
                          shift=False))
    # dllm's reading of Nemotron's "causal context": prefill and commit forwards token-causal (mask granularity 1)
    golden_traces(m, d, "tiny-nemotron-diffusion", cases, c["mask_token_id"], c["eos_token_id"], prefill_mask=1, step_mask=c["block_size"])


def make_yarn(root):
    inv, af = inv_freq_and_scale(NEMO_8B_ROPE, 128)
    positions = [0, 16383, 16384, 40000, 262143]
    write_json(os.path.join(root, "yarn_nemotron_8b.json"), {
        "rope_parameters": NEMO_8B_ROPE, "head_dim": 128, "inv_freq_f32_bits": [int(b) for b in inv.view(np.uint32)], "attention_factor": af,
        "llama4_positions": positions, "llama4_scale": [float(s) for s in llama4_scale(NEMO_8B_ROPE, positions)]})


def make_all(root):
    make_fast(root)
    make_nemotron(root)
    make_yarn(root)


def check(root):
    bad = fixture_differences(root, make_all)
    for rel in bad:
        print(f"{rel}: DIFFERS")
    print("fixtures reproduce" if not bad else "fixtures DIFFER", "with numpy", np.__version__)
    return not bad


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        sys.exit(0 if check(sys.argv[2] if len(sys.argv) > 2 else "tests/data") else 1)
    root = sys.argv[1] if len(sys.argv) > 1 else "tests/data"
    make_all(root)
    print("fixtures written under", root, "with numpy", np.__version__)
