#!/usr/bin/env python3
"""train_tiny_bd.py - trains tiny-fast-dllm-v2, a tiny block-diffusion LM in Fast-dLLM v2's exact layout
(model_type Fast_dLLM_Qwen, Qwen2 tensor names, |<MASK>| and <|im_end|> in the tokenizer files only), with
Fast-dLLM v2's training recipe (block-diffusion.md, "Training recipe"; the official modeling.py training branch):

  - input [x_t ; x_0] (2L tokens); both halves at RoPE positions 0..L-1;
  - attention mask block_diff_mask: block-diagonal among the noisy blocks, noisy -> clean earlier blocks,
    clean -> clean block-causal (blocks of bd_size = 32);
  - per block t ~ U(0, 1), p = (1 - eps) t + eps, each position masked with probability p, plus a
    complementary copy of the batch that masks exactly the other positions;
  - the causal-LM cross-entropy (row i predicts token i + 1: the logit shift) on the masked positions of the
    noisy half, averaged over them.

It is the accuracy yardstick of SoloQ W4A4 / KV4 / KV2 against BF16 on block diffusion. It reuses
tools/train_tiny.py's corpus (Debian fortunes, the same held-out split and NLL protocol), BPE training with the
Qwen2 split regex, wall-clock schedule and model-card conventions, and tools/make_bd_fixtures.py's float64
reference to evaluate the exported BF16 weights (masked-token NLL with dllm_logits semantics: block-causal at 32,
shift applied; greedy block-diffusion samples as the official generate decodes).

Device run (one H200, torch >= 2.1 with `tokenizers`, carry .carry/fortunes; about 4 minutes):
    python3 tools/train_tiny_bd.py --out $OUT/models 2>&1 | tee $OUT/train_tiny_bd.log
Local smoke run (CPU, torch >= 1.13, numpy; byte vocabulary, tiny dimensions, 15 s of training):
    python3 tools/train_tiny_bd.py --smoke            # writes build/smoke/models/tiny-fast-dllm-v2
models/tiny-fast-dllm-v2 was trained so on an H200 (179 s of training).
"""
import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS_DIR)
import make_bd_fixtures as bdref  # noqa: E402
from train_tiny import (MASK_EPS, NLL_PROTOCOL, QWEN2, SPLIT_RULE, FORTUNES_SOURCE, Recipe, Schedule, autocast, bf16_round,  # noqa: E402
                        byte_tokenizer, check_tokenizer, environment, init_weights, masked_nll, rms_norm, rope, rope_tables,
                        train_bpe, write_json, write_safetensors, write_test_data)

BD_SIZE = 32
# Qwen2.5's added tokens followed by Fast-dLLM v2's mask, as in the real added_tokens.json (151643.. then 151665).
FAST = dataclasses.replace(QWEN2, name="fast-dllm-v2", specials=[s for s in QWEN2.specials if s[0] not in ("<|beginoftext|>", "<|mask|>")]
                           + [("|<MASK>|", True)], bos="<|endoftext|>", eos="<|im_end|>", eot="<|im_end|>", mask="|<MASK>|")

RECIPE = Recipe("tiny-fast-dllm-v2", "fast", "text", 256, 6, 4, 2, 640, 256, 64, 1e-3, 200, 0.1, 0.2, 3.0, 14)


def smoke_recipe(r):
    return dataclasses.replace(r, d_model=128, n_layers=2, n_heads=2, n_kv_heads=1, mlp_hidden=256, seq_len=64, batch=4, lr=3e-3,
                               warmup=20, minutes=0.25, log_every=5, n_evals=2)


def model_config(r, tok):
    cfg = dict(bdref.FAST_CFG)
    cfg.update(bd_size=BD_SIZE, hidden_size=r.d_model, num_attention_heads=r.n_heads, num_key_value_heads=r.n_kv_heads,
               num_hidden_layers=r.n_layers, max_window_layers=r.n_layers, layer_types=["full_attention"] * r.n_layers,
               intermediate_size=r.mlp_hidden, vocab_size=tok.n_vocab, max_position_embeddings=max(r.seq_len, 1024),
               bos_token_id=tok.special("<|endoftext|>"), eos_token_id=tok.special("<|im_end|>"), pad_token_id=tok.special("<|im_end|>"))
    return dict(sorted(cfg.items()))


# ----------------------------------------------------------------------------------------------------
# The model (Qwen2 block, q/k/v bias) with an explicit attention mask
# ----------------------------------------------------------------------------------------------------
def block_diff_mask(L, bs, device):
    """The official training mask over [x_t ; x_0] (2L x 2L, True = may attend)."""
    i = torch.arange(2 * L, device=device)
    x0 = i >= L
    blk = torch.where(x0, (i - L) // bs, i // bs)
    q_x0, k_x0, q_b, k_b = x0[:, None], x0[None, :], blk[:, None], blk[None, :]
    diagonal = (q_b == k_b) & (q_x0 == k_x0)
    offset_causal = (q_b > k_b) & k_x0 & ~q_x0
    causal = (q_b >= k_b) & k_x0 & q_x0
    return diagonal | offset_causal | causal


class Block(nn.Module):
    def __init__(self, r):
        super().__init__()
        d, self.hd, self.nh, self.nkv = r.d_model, r.d_model // r.n_heads, r.n_heads, r.n_kv_heads
        self.attn_norm, self.ff_norm = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
        self.q, self.k, self.v = nn.Linear(d, self.nh * self.hd), nn.Linear(d, self.nkv * self.hd), nn.Linear(d, self.nkv * self.hd)
        self.o = nn.Linear(self.nh * self.hd, d, bias=False)
        self.gate, self.up = nn.Linear(d, r.mlp_hidden, bias=False), nn.Linear(d, r.mlp_hidden, bias=False)
        self.down = nn.Linear(r.mlp_hidden, d, bias=False)
        self.drop = nn.Dropout(r.dropout)  # residual dropout: without it the shifted objective overfits the corpus early

    def forward(self, h, cos, sin, mask, eps):
        B, T, _ = h.shape
        a = rms_norm(h, self.attn_norm, eps)
        v = self.v(a).view(B, T, self.nkv, self.hd)
        q = rope(self.q(a).view(B, T, self.nh, self.hd).float(), cos, sin).to(v.dtype)
        k = rope(self.k(a).view(B, T, self.nkv, self.hd).float(), cos, sin).to(v.dtype)
        g = self.nh // self.nkv
        k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask).transpose(1, 2)
        h = h + self.drop(self.o(o.reshape(B, T, -1)))
        b = rms_norm(h, self.ff_norm, eps)
        return h + self.drop(self.down(F.silu(self.gate(b)) * self.up(b)))


class TinyBD(nn.Module):
    def __init__(self, r, cfg):
        super().__init__()
        V = cfg["vocab_size"]
        self.embed = nn.Embedding(V, r.d_model)
        self.blocks = nn.ModuleList(Block(r) for _ in range(r.n_layers))
        self.final_norm = nn.Parameter(torch.ones(r.d_model))
        self.head = nn.Linear(r.d_model, V, bias=False)
        self.eps = cfg["rms_norm_eps"]
        cos, sin = rope_tables(cfg["rope_theta"], r.d_model // r.n_heads, cfg["max_position_embeddings"])
        self.register_buffer("cos", cos.float(), persistent=False)
        self.register_buffer("sin", sin.float(), persistent=False)

    def forward(self, ids, positions, mask):
        """Raw logits (no shift) of ids [B, T] at RoPE positions [T] under a boolean mask [T, T]."""
        h = self.embed(ids)
        cos, sin = self.cos[positions], self.sin[positions]
        for block in self.blocks:
            h = block(h, cos, sin, mask, self.eps)
        return self.head(rms_norm(h, self.final_norm, self.eps))


def hf_tensors(model):
    out = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.final_norm, "lm_head.weight": model.head.weight}
    for l, b in enumerate(model.blocks):
        p = f"model.layers.{l}."
        out.update({p + "input_layernorm.weight": b.attn_norm, p + "post_attention_layernorm.weight": b.ff_norm,
                    p + "self_attn.q_proj.weight": b.q.weight, p + "self_attn.q_proj.bias": b.q.bias,
                    p + "self_attn.k_proj.weight": b.k.weight, p + "self_attn.k_proj.bias": b.k.bias,
                    p + "self_attn.v_proj.weight": b.v.weight, p + "self_attn.v_proj.bias": b.v.bias,
                    p + "self_attn.o_proj.weight": b.o.weight, p + "mlp.gate_proj.weight": b.gate.weight,
                    p + "mlp.up_proj.weight": b.up.weight, p + "mlp.down_proj.weight": b.down.weight})
    return out


def check_against_reference(r, cfg, device):
    """Random weights: the training module under the eval mask (block-causal at 32) gives make_bd_fixtures' logits."""
    model = TinyBD(r, cfg).to(device).eval()
    params = hf_tensors(model)
    specs = bdref.qwen_specs(cfg, "model.", "lm_head.weight", True)
    if {n: tuple(s) for n, s, _ in specs} != {n: tuple(t.shape) for n, t in params.items()}:
        raise SystemExit("train_tiny_bd: tensor layout differs from the reference")
    _, weights = bdref.make_weights(specs, 99)
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(torch.from_numpy(weights[name]))
        T = min(48, r.seq_len)
        ids = torch.randint(0, cfg["vocab_size"], (T,), generator=torch.Generator().manual_seed(5))
        i = torch.arange(T)
        mask = (i[:, None] // BD_SIZE >= i[None, :] // BD_SIZE).to(device)
        got = model(ids[None].to(device), i.to(device), mask)[0].double().cpu().numpy()
    want, _ = bdref.Model("fast", cfg, weights).forward(ids.tolist(), None, mask_block=BD_SIZE)
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    if not rel < 1e-2:
        raise SystemExit(f"train_tiny_bd: training forward differs from the reference (relative {rel:.2e})")
    return rel


# ----------------------------------------------------------------------------------------------------
# The objective
# ----------------------------------------------------------------------------------------------------
def bd_loss(model, x0, mask_id, gen):
    """Fast-dLLM v2's training loss on clean rows x0 [B, L] (L a multiple of BD_SIZE), complementary copy included."""
    B, L = x0.shape
    nb = L // BD_SIZE
    t = torch.rand(B, nb, 1, device=x0.device, generator=gen)
    p = ((1 - MASK_EPS) * t + MASK_EPS).expand(B, nb, BD_SIZE).reshape(B, L)
    masked = torch.rand(B, L, device=x0.device, generator=gen) < p
    masked = torch.cat([masked, ~masked])  # the complementary copy masks exactly the other positions
    clean = torch.cat([x0, x0])
    inputs = torch.cat([clean.masked_fill(masked, mask_id), clean], 1)
    positions = torch.arange(L, device=x0.device).repeat(2)
    logits = model(inputs, positions, block_diff_mask(L, BD_SIZE, x0.device))[:, :L]
    labels = clean.masked_fill(~masked, -100)
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


def train(model, r, stream, val_rows, mask_id, device, log):
    opt = torch.optim.AdamW(model.parameters(), lr=r.lr, betas=(0.9, 0.95), weight_decay=r.weight_decay)
    gen = torch.Generator(device=device).manual_seed(r.seed)
    val_gen_seed = 4321
    schedule, start, step, curve, best = Schedule(r, device), time.time(), 0, [], {"loss": math.inf}
    offsets = torch.arange(r.seq_len, device=device)
    while not schedule.finished(step):
        for group in opt.param_groups:
            group["lr"] = schedule.lr(step)
        starts = torch.randint(0, len(stream) - r.seq_len + 1, (r.batch,), device=device, generator=gen)
        with autocast(device):
            loss = bd_loss(model, stream[starts[:, None] + offsets[None, :]], mask_id, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        schedule.after_step(step)
        if step % r.log_every == 0 or schedule.finished(step):
            model.eval()
            with torch.no_grad(), autocast(device):
                val = bd_loss(model, val_rows, mask_id, torch.Generator(device=device).manual_seed(val_gen_seed)).item()
            model.train()
            curve.append([step, round(loss.item(), 4), round(val, 4)])
            log(f"step {step}/{schedule.total or '?'}  loss {loss.item():.4f}  validation {val:.4f}  {time.time() - start:.0f} s")
            if val < best["loss"]:
                best = {"loss": val, "step": step, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    model.load_state_dict(best["state"])
    return {"steps": step, "wall_time_s": round(time.time() - start, 1), "curve": curve, "chosen_step": best["step"],
            "chosen_validation_loss": round(best["loss"], 5)}


# ----------------------------------------------------------------------------------------------------
# Export and evaluation of the exported BF16 weights with the float64 reference
# ----------------------------------------------------------------------------------------------------
def save_tokenizer(tok, out_dir):
    """vocab.json + merges.txt + added_tokens.json as train_tiny writes them, then Fast_dLLM_v2_7B's tokenizer_config:
    eos <|im_end|>, pad <|endoftext|>, |<MASK>| an additional special token, no mask_token key (the real one has none)."""
    tok.save(out_dir)
    write_json(os.path.join(out_dir, "tokenizer_config.json"), {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": tok.added_tokens_decoder(),
        "additional_special_tokens": ["|<MASK>|"], "bos_token": None, "chat_template": tok.chat_template(),
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 131072,
        "pad_token": "<|endoftext|>", "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
    write_json(os.path.join(out_dir, "special_tokens_map.json"),
               {"additional_special_tokens": ["|<MASK>|"], "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})


class Reference:
    """make_bd_fixtures' float64 forward of the exported weights, with dllm_logits semantics (for masked_nll)."""

    def __init__(self, cfg, out_dir):
        from train_tiny import read_bf16_safetensors
        weights = {k: v.numpy() for k, v in read_bf16_safetensors(os.path.join(out_dir, "model.safetensors")).items()}
        self.model = bdref.Model("fast", cfg, weights)

    def logits(self, ids):
        raw, _ = self.model.forward(ids, None, mask_block=BD_SIZE)
        return torch.from_numpy(bdref.shift(raw, True))


def samples(ref, tok, mask_id, stop_id):
    out = []
    for prompt in ("The best way to predict the future is", "Q: How many programmers does it take to change a light bulb?\nA:"):
        ids = tok.encode(prompt)
        gen, steps, forwards, _ = bdref.generate(ref.model, ids, 64, mask_id, stop_id, threshold=0.9, small_block_size=8, block_size=BD_SIZE)
        out.append({"prompt": prompt, "threshold": 0.9, "output_ids": gen, "text": tok.decode(gen), "steps": len(steps), "forwards": forwards})
    return out


def main():
    ap = argparse.ArgumentParser(description="Train tiny-fast-dllm-v2 (see the header comment).")
    ap.add_argument("--fortunes", default=".carry/fortunes")
    ap.add_argument("--out", help="default models (smoke: build/smoke/models)")
    ap.add_argument("--data-out", help="heldout.txt goes here (default tests/data, smoke: build/smoke/tests/data)")
    ap.add_argument("--minutes", type=float)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    args.out = args.out or ("build/smoke/models" if args.smoke else "models")
    args.data_out = args.data_out or ("build/smoke/tests/data" if args.smoke else "tests/data")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    r = smoke_recipe(RECIPE) if args.smoke else RECIPE
    r = dataclasses.replace(r, minutes=args.minutes or r.minutes, steps=args.steps or r.steps)
    log = lambda msg: print(f"[{r.name}] {msg}", flush=True)  # noqa: E731
    os.makedirs(args.data_out, exist_ok=True)
    corpus, parts, heldout_text, _ = write_test_data(args)
    tok = byte_tokenizer(FAST) if args.smoke else train_bpe(FAST, parts["train"], args.vocab)
    heldout_ids = check_tokenizer(tok, heldout_text)
    eos, mask_id = tok.special("<|im_end|>"), tok.special("|<MASK>|")
    order = list(parts["train"])
    np.random.default_rng(0).shuffle(order)
    stream = torch.tensor([i for ids in tok.encode_batch(order) for i in ids + [eos]], device=device)
    val = [i for ids in tok.encode_batch(parts["validation"]) for i in ids + [eos]]
    n_val = min(32, len(val) // r.seq_len)
    val_rows = torch.tensor(val[: n_val * r.seq_len], device=device).view(n_val, r.seq_len)
    cfg = model_config(r, tok)
    rel = check_against_reference(r, cfg, device)
    log(f"training forward matches the reference (max relative logit difference {rel:.1e})")
    torch.manual_seed(r.seed)
    model = TinyBD(r, cfg).to(device)
    init_weights(model, r.n_layers)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{n_params:,} parameters, {len(stream):,} training tokens, on {device}")
    stats = train(model, r, stream, val_rows, mask_id, device, log)

    out_dir = os.path.join(args.out, r.name)
    os.makedirs(out_dir, exist_ok=True)
    tensors = [(n, "BF16", tuple(t.shape), bf16_round(t.detach().float().cpu().numpy())[0].tobytes()) for n, t in hf_tensors(model).items()]
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    write_json(os.path.join(out_dir, "config.json"), cfg)
    write_json(os.path.join(out_dir, "generation_config.json"), {"bos_token_id": cfg["bos_token_id"], "eos_token_id": [eos, tok.special("<|endoftext|>")],
                                                                   "pad_token_id": tok.special("<|endoftext|>")})
    save_tokenizer(tok, out_dir)
    ref = Reference(cfg, out_dir)
    evaluation = {"masked_nll": masked_nll(ref, heldout_ids, mask_id), "samples": samples(ref, tok, mask_id, eos)}
    evaluation["masked_nll"]["protocol"] = NLL_PROTOCOL.replace("one full bidirectional forward", "one forward, block-causal at 32 "
                                                                "(the model's forward without a cache, as dllm_logits computes it)")
    log(f"held-out masked NLL {evaluation['masked_nll']['nll']}")
    card = {"name": r.name, "family": "Fast_dLLM_Qwen (block diffusion)", "parameters": n_params, "recipe": dataclasses.asdict(r),
            "objective": __doc__.split("\n\n")[1], "data": {"source": FORTUNES_SOURCE, "split": SPLIT_RULE, "corpus": corpus},
            "training": stats, "evaluation": evaluation, "environment": environment(device), "status": "trained by tools/train_tiny_bd.py"}
    write_json(os.path.join(out_dir, "model_card.json"), card)
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(f"# {r.name}\n\nA {n_params:,}-parameter block-diffusion LM in Fast-dLLM v2's layout, trained by "
                f"`tools/train_tiny_bd.py` for {stats['steps']} steps ({stats['wall_time_s']} s) with Fast-dLLM v2's "
                f"complementary-mask block recipe on Debian fortunes. Held-out masked-token NLL (ratios 0.15/0.5/0.9): "
                f"{evaluation['masked_nll']['nll']}. Details: model_card.json.\n")
    exe = os.path.join("build", "dllm-generate")
    if os.path.exists(exe):
        res = subprocess.run([exe, "-m", out_dir, "--ids", "1 2 3", "-n", "32", "--backend", "cpu", "--print-ids"], capture_output=True, text=True)
        log(f"dllm check: {'ok' if res.returncode == 0 else 'FAILED'} {res.stdout.strip()} {res.stderr.strip()}")


if __name__ == "__main__":
    main()
