#!/usr/bin/env python3
"""make_llada2_fixtures.py - token traces of the official LLaDA2.0 / LLaDA2.1 `generate` on a tiny random checkpoint,
for tests/test_llada2.inl (TEST llada2.official_generate_traces).

Needs PyTorch, transformers and numpy (the GPU machine has them; a CPU is enough) and the official modeling code,
which stays out of this repository: a directory holding llada2/modeling_llada2_moe.py + configuration_llada2_moe.py
(LLaDA2.0) and llada21/modeling_llada21_moe.py + configuration_llada21_moe.py (LLaDA2.1), e.g. as vendored in
github.com/ZHZisZZ/dllm (dllm/pipelines/llada2/models, dllm/pipelines/llada21/models; spec: llada2.md).

    python3 tools/make_llada2_fixtures.py --official .carry/llada2_official --out tests/data/llada2

Writes OUT/config.json, OUT/model.safetensors (float32, the hub's tensor names) and OUT/cases.json: for each case the
prompt, the generate arguments and the official output ids. The model runs in float32 (dllm's CPU reference
arithmetic) with two adaptations that dllm's decoding documents (dllm.h, "LLaDA2"), applied by wrapping
model.forward, never by editing the official code:
  - generate()'s bfloat16 block mask is cast to the query dtype (its values are 0 and -inf: exact); fp32 SDPA
    refuses a bf16 mask;
  - the mask token's logit is -inf (dllm never predicts the mask id).
Both generate() calls use temperature 0 (the greedy path of both samplers).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_files import write_json, write_safetensors  # noqa: E402

SHAPE = dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=40, num_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4,
             moe_intermediate_size=12, num_shared_experts=1, first_k_dense_replace=1, vocab_size=64,
             max_position_embeddings=256, rope_theta=600000.0, partial_rotary_factor=0.5, rms_norm_eps=1e-6,
             routed_scaling_factor=2.5, use_bias=False, use_qkv_bias=False, use_qk_norm=True, norm_head=False,
             tie_word_embeddings=False, hidden_act="silu")
MASK_ID, EOS_ID = 63, 62


def shim_transformers():
    """Names the official code (written for transformers 4.5x) imports that transformers 5 dropped: FX tracing is
    unused here, torch is newer than 1.13."""
    import transformers.pytorch_utils as pu
    import transformers.utils.import_utils as iu
    if not hasattr(iu, "is_torch_fx_available"):
        iu.is_torch_fx_available = lambda: False
    if not hasattr(pu, "is_torch_greater_or_equal_than_1_13"):
        pu.is_torch_greater_or_equal_than_1_13 = True
    import transformers.modeling_rope_utils as ru
    if "default" not in ru.ROPE_INIT_FUNCTIONS:
        ru.ROPE_INIT_FUNCTIONS["default"] = default_rope


def default_rope(config, device=None, **_):
    """transformers 4's _compute_default_rope_parameters: theta^(-2i/dim) over dim = int(head_dim * partial factor)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (config.rope_theta ** exponent), 1.0


def load_official(root):
    """The official LLaDA2.0 and LLaDA2.1 model classes, imported from root/llada2 and root/llada21."""
    sys.path.insert(0, os.path.abspath(root))
    shim_transformers()
    import llada2.modeling_llada2_moe as v20  # noqa: E402  (namespace packages: relative imports work)
    import llada21.modeling_llada21_moe as v21  # noqa: E402
    return v20, v21


def make_model(module, config_cls, state=None):
    cfg = config_cls(**SHAPE, pad_token_id=EOS_ID)
    cfg._attn_implementation = "sdpa"  # the path that takes generate()'s additive 4-D mask as it is
    model = module.LLaDA2MoeModelLM(cfg).float().eval()
    if state is None:
        state = random_state(model)
    model.load_state_dict(state, strict=False)
    wrap_forward(model)
    return model, state


def random_state(model):
    """Weights with peaked output distributions (so thresholds and edits both happen): linears ~ N(0, 1/fan_in),
    the LM head 3x that, norms 1 + N(0, 0.2^2), expert biases N(0, 0.05^2)."""
    g = torch.Generator().manual_seed(20251)
    state = {}
    for name, t in model.state_dict().items():
        if name.endswith("inv_freq"):
            continue
        if t.dim() == 2:
            std = (3.0 if name == "lm_head.weight" else 1.0) / math.sqrt(t.shape[1])
            state[name] = torch.randn(t.shape, generator=g) * std
        elif name.endswith("expert_bias"):
            state[name] = torch.randn(t.shape, generator=g) * 0.05
        else:
            state[name] = 1.0 + torch.randn(t.shape, generator=g) * 0.2
    return state


def wrap_forward(model):
    inner = model.forward

    def forward(*args, attention_mask=None, **kwargs):
        if attention_mask is not None and attention_mask.dtype != torch.float32:
            attention_mask = attention_mask.to(torch.float32)
        out = inner(*args, attention_mask=attention_mask, **kwargs)
        out.logits[..., MASK_ID] = -math.inf
        return out

    model.forward = forward


CASES = [  # name, prompt length, generate() arguments (2.1's have editing_threshold)
    ("v20_mid_block", 11, dict(gen_length=21, block_length=8, steps=4, threshold=0.6, eos_early_stop=False)),
    ("v20_boundary_early_stop", 16, dict(gen_length=24, block_length=8, steps=8, threshold=0.5, eos_early_stop=True)),
    ("v20_one_token_steps", 5, dict(gen_length=16, block_length=4, steps=4, threshold=0.99, eos_early_stop=False)),
    ("v21_edit", 11, dict(gen_length=21, block_length=8, threshold=0.5, editing_threshold=0.3, max_post_steps=4,
                          eos_early_stop=False)),
    ("v21_quality_preset", 9, dict(gen_length=24, block_length=8, threshold=0.7, editing_threshold=0.5,
                                   max_post_steps=16, eos_early_stop=True)),
    ("v21_speed_preset", 16, dict(gen_length=16, block_length=8, threshold=0.5, editing_threshold=0.0,
                                  max_post_steps=16, eos_early_stop=False)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--official", required=True, help="directory with llada2/ and llada21/ (the official code)")
    ap.add_argument("--out", default="tests/data/llada2")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_grad_enabled(False)
    v20, v21 = load_official(args.official)
    m20, state = make_model(v20, v20.LLaDA2MoeConfig)
    m21, _ = make_model(v21, v21.LLaDA2MoeConfig, state)
    os.makedirs(args.out, exist_ok=True)
    config = dict(SHAPE, architectures=["LLaDA2MoeModelLM"], model_type="llada2_moe", mask_token_id=MASK_ID,
                  eos_token_id=EOS_ID, pad_token_id=EOS_ID, rope_scaling=None, torch_dtype="float32")
    write_json(os.path.join(args.out, "config.json"), config)
    write_safetensors(os.path.join(args.out, "model.safetensors"),
                      [(n, "F32", list(t.shape), t.contiguous().numpy().astype(np.float32).tobytes())
                       for n, t in state.items()])
    rng = np.random.default_rng(7)
    cases = []
    for name, n_prompt, kw in CASES:
        prompt = [int(t) for t in rng.integers(0, EOS_ID, n_prompt)]
        model = m21 if "editing_threshold" in kw else m20
        out = model.generate(torch.tensor([prompt]), temperature=0.0, eos_id=EOS_ID, mask_id=MASK_ID, **kw)
        case = dict(name=name, prompt=prompt, steps=32)  # 2.1 ignores steps; 32 is its default
        case.update(kw)
        case["output"] = out[0].tolist()
        cases.append(case)
        print(f"{name}: {len(out[0])} ids")
    write_json(os.path.join(args.out, "cases.json"), {"mask_id": MASK_ID, "eos_id": EOS_ID, "cases": cases})


if __name__ == "__main__":
    main()
