"""tiny_llada2.py - the LLaDA2 pieces of tools/train_tiny.py's tiny-llada2: the config in the hub schema, the training
module, its Hugging Face tensor names, a float64 reference forward and LLaDA2.0's greedy generate.

The maths is ../shared/spec/llada2.md ("Forward") as dllm's CPU reference computes it (src/cpu/moe.cpp): fused QKV,
QK-norm over head_dim before a partial RoPE (rotate-half within the first rotary_dim dims), GQA, a dense layer 0
and MoE layers with a sigmoid router in fp32 whose expert_bias only selects, group-limited top-k (group score = the
sum of its top 2 routing scores), the un-biased sigmoid weights normalised (+1e-20) and scaled, plus a shared
expert; no logit shift. Attention is block-causal at 32 in training, evaluation and generation: it is what dllm's
LLaDA2 forward does everywhere (dllm_logits included), so the model is trained under the mask it will run with.
Tensor names and shapes are those of tools/make_llada2_fixtures.py and src/model/llada2.cpp.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from make_fixtures import rope, rope_tables

MASK_BLOCK = 32  # dllm_logits' block-causal granularity for LLaDA2 (generate's default block_length)
ROUTED_SCALE, ROPE_THETA, PARTIAL_ROTARY, NORM_EPS = 2.5, 600000.0, 0.5, 1e-6  # the real models' values


def config(r, n_vocab, ids):
    """config.json in the hub schema (keys of LLaDA2.0-mini's, tiny sizes). mask_token_id is written because the
    official generate's default (156895) lies outside a tiny vocabulary; `ids` holds mask/eos/bos ids."""
    hd = r.d_model // r.n_heads
    return dict(sorted(dict(
        architectures=["LLaDA2MoeModelLM"], model_type="llada2_moe", hidden_size=r.d_model,
        num_hidden_layers=r.n_layers, num_attention_heads=r.n_heads, num_key_value_heads=r.n_kv_heads, head_dim=hd,
        intermediate_size=r.mlp_hidden, first_k_dense_replace=r.n_dense, num_experts=r.n_experts,
        num_experts_per_tok=r.experts_per_tok, n_group=r.n_group, topk_group=r.topk_group,
        moe_intermediate_size=r.moe_hidden, num_shared_experts=r.n_shared, routed_scaling_factor=ROUTED_SCALE,
        score_function="sigmoid", moe_router_enable_expert_bias=True, norm_topk_prob=True, router_dtype="fp32",
        vocab_size=n_vocab, max_position_embeddings=r.seq_len, rope_theta=ROPE_THETA,
        partial_rotary_factor=PARTIAL_ROTARY, rotary_dim=int(hd * PARTIAL_ROTARY), rope_scaling=None,
        rms_norm_eps=NORM_EPS, hidden_act="silu", use_bias=False, use_qkv_bias=False, use_qk_norm=True,
        norm_head=False, use_rmsnorm=True, tie_word_embeddings=False, use_sliding_window=False,
        attention_dropout=0.0, embedding_dropout=0.0, output_dropout=0.0, initializer_range=0.02,
        mask_token_id=ids["mask"], eos_token_id=ids["eos"], pad_token_id=ids["eos"], bos_token_id=ids["bos"],
        torch_dtype="bfloat16", use_cache=False).items()))


def block_causal(T, device=None):
    """[T, T] bool, True where query i may attend key j: j's block of MASK_BLOCK is not after i's."""
    blk = torch.arange(T, device=device) // MASK_BLOCK
    return blk[None, :] <= blk[:, None]


def partial_rope(x, cos, sin, rot):
    """RoPE (make_fixtures' rotate-half) on the first `rot` dims of each head; the rest pass through."""
    return torch.cat([rope(x[..., :rot], cos, sin), x[..., rot:]], -1)


def rms_norm(x, w, eps):
    """HF order: normalise in float32, cast back to the activation dtype, then scale."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def route(logits, bias, c, topk=None):
    """LLaDA2MoeGate on fp32 router logits [N, E] -> (chosen experts [N, k], weights [N, k]). `topk` picks the
    top-k indices of a [..., n] score; the reference passes a stable one (ties to the lower index, as dllm)."""
    topk = topk or torch_topk
    N, E = logits.shape
    s = torch.sigmoid(logits)
    score = s + bias
    group = score.view(N, c["n_group"], E // c["n_group"])
    group_score = group.gather(-1, topk(group, 2)).sum(-1)
    kept = torch.zeros_like(group_score, dtype=torch.bool).scatter(1, topk(group_score, c["topk_group"]), True)
    allowed = kept[:, :, None].expand_as(group).reshape(N, E)
    experts = topk(score.masked_fill(~allowed, -math.inf), c["num_experts_per_tok"])
    w = s.gather(1, experts)
    if c["num_experts_per_tok"] > 1:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return experts, w * c["routed_scaling_factor"]


def torch_topk(x, k):
    return torch.topk(x, k, -1).indices


def stable_topk(x, k):
    """dllm's order: largest first, ties to the lower index."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]


class Attention(nn.Module):
    def __init__(self, r, cfg):
        super().__init__()
        d, self.hd = r.d_model, cfg["head_dim"]
        self.H, self.KV, self.rot = r.n_heads, r.n_kv_heads, cfg["rotary_dim"]
        self.qkv = nn.Linear(d, (self.H + 2 * self.KV) * self.hd, bias=False)  # rows Q heads | K heads | V heads
        self.q_norm = nn.Parameter(torch.ones(self.hd))
        self.k_norm = nn.Parameter(torch.ones(self.hd))
        self.dense = nn.Linear(self.H * self.hd, d, bias=False)

    def forward(self, a, cos, sin, mask, eps):
        B, T, _ = a.shape
        q, k, v = self.qkv(a).view(B, T, self.H + 2 * self.KV, self.hd).split([self.H, self.KV, self.KV], 2)
        # QK-norm before RoPE; RoPE in float32 like the other tiny models' rope_full_precision
        q = partial_rope(rms_norm(q, self.q_norm, eps).float(), cos, sin, self.rot).to(v.dtype)
        k = partial_rope(rms_norm(k, self.k_norm, eps).float(), cos, sin, self.rot).to(v.dtype)
        g = self.H // self.KV
        k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return self.dense(o.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, d, ff):
        super().__init__()
        self.gate, self.up = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class MoE(nn.Module):
    """Routed experts stored stacked ([E, ff, d] / [E, d, ff]: the hub's per-expert [out, in] shapes). Training
    computes every expert on every row and weights them by the router's sparse weights (zero off the chosen
    k): the same function as running only the chosen ones, as plain GEMMs over E * ff columns."""

    def __init__(self, r, cfg):
        super().__init__()
        d, E, ff = r.d_model, r.n_experts, r.moe_hidden
        self.c = cfg
        self.router = nn.Parameter(torch.empty(E, d))
        self.register_buffer("expert_bias", torch.zeros(E))  # a buffer in the hub code too: set, not learnt
        self.w_gate, self.w_up = nn.Parameter(torch.empty(E, ff, d)), nn.Parameter(torch.empty(E, ff, d))
        self.w_down = nn.Parameter(torch.empty(E, d, ff))
        self.shared = SwiGLU(d, ff * r.n_shared) if r.n_shared else None
        self.load = torch.zeros(E)  # rows routed to each expert since the last bias update (training only)

    def forward(self, x):
        shape, (E, ff, d) = x.shape, self.w_gate.shape
        x = x.reshape(-1, d)
        with torch.autocast(x.device.type, enabled=False):  # the router runs in fp32 (router_dtype)
            experts, w = route(F.linear(x.float(), self.router.float()), self.expert_bias, self.c)
        if self.training:
            self.load = self.load.to(x.device) + torch.bincount(experts.flatten(), minlength=E).float()
        weight = torch.zeros(x.shape[0], E, device=x.device, dtype=w.dtype).scatter(1, experts, w)
        h = F.silu(x @ self.w_gate.reshape(E * ff, d).T) * (x @ self.w_up.reshape(E * ff, d).T)
        h = (h.view(-1, E, ff) * weight[:, :, None].to(h.dtype)).reshape(-1, E * ff)
        y = h @ self.w_down.transpose(1, 2).reshape(E * ff, d)
        if self.shared is not None:
            y = y + self.shared(x)
        return y.view(shape)

    @torch.no_grad()
    def balance(self, rate):
        """Auxiliary-loss-free balancing (what moe_router_enable_expert_bias is for): raise the selection bias of
        under-loaded experts and lower it for over-loaded ones by `rate`, then restart the count."""
        if self.load.sum() > 0:
            self.expert_bias += rate * torch.sign(self.load.mean() - self.load).to(self.expert_bias.device)
        self.load = torch.zeros_like(self.load)


class Layer(nn.Module):
    def __init__(self, r, cfg, moe):
        super().__init__()
        self.attn_norm, self.ff_norm = nn.Parameter(torch.ones(r.d_model)), nn.Parameter(torch.ones(r.d_model))
        self.attn = Attention(r, cfg)
        self.mlp = MoE(r, cfg) if moe else SwiGLU(r.d_model, r.mlp_hidden)
        self.drop = nn.Dropout(r.dropout)

    def forward(self, h, cos, sin, mask, eps):
        h = h + self.drop(self.attn(rms_norm(h, self.attn_norm, eps), cos, sin, mask, eps))
        return h + self.drop(self.mlp(rms_norm(h, self.ff_norm, eps)))


class Llada2DLM(nn.Module):
    BALANCE_RATE = 1e-3  # DeepSeek-V3's bias update speed

    def __init__(self, r, cfg):
        super().__init__()
        V = cfg["vocab_size"]
        self.embed = nn.Embedding(V, r.d_model)
        self.layers = nn.ModuleList(Layer(r, cfg, l >= r.n_dense) for l in range(r.n_layers))
        self.final_norm = nn.Parameter(torch.ones(r.d_model))
        self.head = nn.Linear(r.d_model, V, bias=False)
        self.eps = cfg["rms_norm_eps"]
        cos, sin = rope_tables(cfg["rope_theta"], cfg["rotary_dim"], r.seq_len)
        self.register_buffer("cos", cos.float(), persistent=False)
        self.register_buffer("sin", sin.float(), persistent=False)

    def forward(self, ids):
        T = ids.shape[1]
        h, mask = self.embed(ids), block_causal(T, ids.device)
        for layer in self.layers:
            h = layer(h, self.cos[:T], self.sin[:T], mask, self.eps)
        return self.head(rms_norm(h, self.final_norm, self.eps))

    def after_step(self):
        for layer in self.layers:
            if isinstance(layer.mlp, MoE):
                layer.mlp.balance(self.BALANCE_RATE)


def init_weights(model, n_layers):
    """Normal(0, 0.02); the projections into the residual stream (dense, down) scaled by 1/sqrt(2 n_layers)."""
    for name, p in model.named_parameters():
        if name.endswith("norm"):
            nn.init.ones_(p)
        else:
            residual = name.endswith(("dense.weight", "down.weight", "w_down"))
            nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layers) if residual else 0.02)


def swiglu_names(out, prefix, m):
    out.update({prefix + "gate_proj.weight": m.gate.weight, prefix + "up_proj.weight": m.up.weight,
                prefix + "down_proj.weight": m.down.weight})


def hf_tensors(model):
    """{hub name: tensor} (experts split out of their stacks, expert_bias included), in the loader's order."""
    out = {"model.word_embeddings.weight": model.embed.weight}
    for l, layer in enumerate(model.layers):
        p, a = f"model.layers.{l}.", layer.attn
        out.update({p + "input_layernorm.weight": layer.attn_norm,
                    p + "attention.query_key_value.weight": a.qkv.weight,
                    p + "attention.query_layernorm.weight": a.q_norm, p + "attention.key_layernorm.weight": a.k_norm,
                    p + "attention.dense.weight": a.dense.weight, p + "post_attention_layernorm.weight": layer.ff_norm})
        m = layer.mlp
        if not isinstance(m, MoE):
            swiglu_names(out, p + "mlp.", m)
            continue
        out.update({p + "mlp.gate.weight": m.router, p + "mlp.gate.expert_bias": m.expert_bias})
        for e in range(m.w_gate.shape[0]):
            q = p + f"mlp.experts.{e}."
            out.update({q + "gate_proj.weight": m.w_gate[e], q + "up_proj.weight": m.w_up[e],
                        q + "down_proj.weight": m.w_down[e]})
        if m.shared is not None:
            swiglu_names(out, p + "mlp.shared_experts.", m.shared)
    out.update({"model.norm.weight": model.final_norm, "lm_head.weight": model.head.weight})
    return out


def expected_shapes(c):
    """The tensor list src/model/llada2.cpp demands for config c, {name: shape}."""
    d, hd, V, E = c["hidden_size"], c["head_dim"], c["vocab_size"], c["num_experts"]
    H, KV, ffe = c["num_attention_heads"], c["num_key_value_heads"], c["moe_intermediate_size"]
    w = {"model.word_embeddings.weight": (V, d), "model.norm.weight": (d,), "lm_head.weight": (V, d)}

    def swiglu(p, ff):
        w.update({p + "gate_proj.weight": (ff, d), p + "up_proj.weight": (ff, d), p + "down_proj.weight": (d, ff)})
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w.update({p + "input_layernorm.weight": (d,), p + "attention.query_key_value.weight": ((H + 2 * KV) * hd, d),
                  p + "attention.query_layernorm.weight": (hd,), p + "attention.key_layernorm.weight": (hd,),
                  p + "attention.dense.weight": (d, H * hd), p + "post_attention_layernorm.weight": (d,)})
        if l < c["first_k_dense_replace"]:
            swiglu(p + "mlp.", c["intermediate_size"])
            continue
        w.update({p + "mlp.gate.weight": (E, d), p + "mlp.gate.expert_bias": (E,)})
        for e in range(E):
            swiglu(p + f"mlp.experts.{e}.", ffe)
        if c["num_shared_experts"]:
            swiglu(p + "mlp.shared_experts.", ffe * c["num_shared_experts"])
    return w


def checked_tensors(model, cfg):
    out = hf_tensors(model)
    got, want = {n: tuple(t.shape) for n, t in out.items()}, expected_shapes(cfg)
    if got != want:
        differences = sorted(set(got.items()) ^ set(want.items()))[:4]
        raise SystemExit(f"train_tiny: tiny-llada2 tensor layout differs from src/model/llada2.cpp's: {differences}")
    return out


class Reference:
    """The forward in float64 on the CPU from {hub name: tensor}, with dllm_logits' semantics (block-causal at 32,
    positions from 0, no shift) and dllm's top-k tie order."""

    def __init__(self, cfg, W):
        self.c, self.W = cfg, {n: t.double() for n, t in W.items()}

    def attention(self, p, a, cos, sin):
        c, W, T = self.c, self.W, a.shape[0]
        H, KV, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
        q, k, v = (a @ W[p + "attention.query_key_value.weight"].T).view(T, H + 2 * KV, hd).split([H, KV, KV], 1)
        q = partial_rope(rms(q, W[p + "attention.query_layernorm.weight"], eps), cos, sin, c["rotary_dim"])
        k = partial_rope(rms(k, W[p + "attention.key_layernorm.weight"], eps), cos, sin, c["rotary_dim"])
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        s = s.masked_fill(~block_causal(T), -math.inf)
        o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v).reshape(T, H * hd)
        return o @ W[p + "attention.dense.weight"].T

    def swiglu(self, p, x):
        W = self.W
        return (F.silu(x @ W[p + "gate_proj.weight"].T) * (x @ W[p + "up_proj.weight"].T)) @ W[p + "down_proj.weight"].T

    def moe(self, p, x):
        W, c = self.W, self.c
        experts, w = route(x @ W[p + "gate.weight"].T, W[p + "gate.expert_bias"], c, stable_topk)
        y = self.swiglu(p + "shared_experts.", x) if c["num_shared_experts"] else torch.zeros_like(x)
        for e in experts.unique().tolist():  # each expert once, over the rows routed to it (as dllm does)
            rows, slot = (experts == e).nonzero(as_tuple=True)
            y[rows] += w[rows, slot, None] * self.swiglu(p + f"experts.{e}.", x[rows])
        return y

    def logits(self, ids):
        c, W, T, eps = self.c, self.W, len(ids), self.c["rms_norm_eps"]
        h = W["model.word_embeddings.weight"][torch.tensor(ids, dtype=torch.long)]
        cos, sin = rope_tables(c["rope_theta"], c["rotary_dim"], T)
        for l in range(c["num_hidden_layers"]):
            p = f"model.layers.{l}."
            h = h + self.attention(p, rms(h, W[p + "input_layernorm.weight"], eps), cos, sin)
            b = rms(h, W[p + "post_attention_layernorm.weight"], eps)
            h = h + (self.swiglu(p + "mlp.", b) if l < c["first_k_dense_replace"] else self.moe(p + "mlp.", b))
        return rms(h, W["model.norm.weight"], eps) @ W["lm_head.weight"].T


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def check_against_reference(r, cfg, device):
    """Random weights with peaked routing (as make_llada2_fixtures draws them): the training module's logits on 48
    ids (two mask blocks) must match the float64 reference's. Catches a wrong name, split, norm, RoPE or route."""
    g = torch.Generator().manual_seed(99)
    model = Llada2DLM(r, cfg).eval()
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith(("cos", "sin")):
                continue
            if name.endswith("expert_bias"):
                t.copy_(torch.randn(t.shape, generator=g) * 0.05)
            elif t.dim() >= 2:
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(t.shape[-1]))
            else:
                t.copy_(1.0 + torch.randn(t.shape, generator=g) * 0.2)
    ids = torch.randint(0, cfg["vocab_size"], (min(48, r.seq_len),), generator=torch.Generator().manual_seed(5))
    want = Reference(cfg, {n: t.detach() for n, t in checked_tensors(model, cfg).items()}).logits(ids.tolist())
    model = model.to(device)
    with torch.no_grad():
        got = model(ids[None].to(device))[0].double().cpu()
    rel = float((got - want).abs().max() / want.abs().max())
    if not rel < 1e-2:  # a layout bug gives ~1; float32 stays far below (a routing near-tie could too: reseed)
        raise SystemExit(f"train_tiny: {r.name}: training forward differs from the reference (relative {rel:.2e})")
    return rel


def generate(ref, prompt, gen_length, block, steps, threshold, mask_id, eos_id):
    """LLaDA2.0's generate, greedy (dllm's reading: argmax and its p; the mask id never predicted; ties to the
    lower position), no cache: blocks of `block` from position 0, the prompt's last block decoded with the answer;
    stop after a block whose generated part holds EOS. Returns the generated ids, cut after the first EOS."""
    P = len(prompt)
    nb = -(-(P + gen_length) // block)
    x = list(prompt) + [mask_id] * (nb * block - P)
    steps = min(steps, gen_length)
    sched = [block // steps + (1 if s < block % steps else 0) for s in range(steps)]
    for b in range(P // block, nb):
        lo, hi = b * block, (b + 1) * block
        for k in sched:
            masked = [i for i in range(lo, hi) if x[i] == mask_id]
            if not masked:
                break
            logits = ref.logits(x[:hi])[lo:hi]
            logits[:, mask_id] = -math.inf
            prob = torch.softmax(logits, -1)
            p, x0 = prob.max(-1)
            conf = sorted(((float(p[i - lo]), i) for i in masked), key=lambda t: (-t[0], t[1]))
            hot = [i for pc, i in conf if pc > threshold]
            for i in (hot if len(hot) >= k else [i for _, i in conf[:k]]):
                x[i] = int(x0[i - lo])
        if eos_id in x[P:hi]:
            break
    out = x[P:P + gen_length]
    return out[:out.index(eos_id) + 1] if eos_id in out else out
