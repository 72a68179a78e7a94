/* src/cpu/moe.cpp - LLaDA2 on the CPU reference: fused QKV with QK-norm and partial RoPE, the sigmoid router's
 * group-limited top-k, and the mixture-of-experts FFN (../shared/spec/llada2.md, "Forward"); the CPU twins of the GPU's
 * route plan and grouped expert GEMM. */

/* b.q, b.k, b.v of a LLaDA2 layer for the T rows of b.h: RMSNorm, the fused projection in the layer's precision (q:
 * its FP8 or SoloQ weights, or null), RMSNorm over head_dim of each Q and K head (QK-norm, one weight shared by the
 * heads), then RoPE on the first rotary_dim dims of each head at the positions b.pos. */
static void dllm__cpu_llada2_qkv(const dllm_model &m, size_t layer, const dllm__fp8_layer *q, dllm__pool &pool,
                                 dllm__cpu_buffers &b, int T, const float *cos_t, const float *sin_t) {
    const dllm__config &c = m.cfg;
    const dllm__layer_weights &L = m.layers[layer];
    const int hd = c.head_dim;
    dllm__cpu_rmsnorm(b.h.data(), T, c.n_embd, L.attn_norm.data(), c.norm_eps, b.a.data());
    dllm__cpu_qkv_proj(c, L, q, pool, b, T);
    if (c.qk_norm) {  // in place: each head is one row of head_dim
        dllm__cpu_rmsnorm(b.q.data(), T * c.n_head, hd, L.q_norm.data(), c.norm_eps, b.q.data());
        dllm__cpu_rmsnorm(b.k.data(), T * c.n_head_kv, hd, L.k_norm.data(), c.norm_eps, b.k.data());
    }
    dllm__cpu_rope(b.q.data(), T, c.n_head, hd, b.pos.data(), cos_t, sin_t, c.rotary_dim);
    dllm__cpu_rope(b.k.data(), T, c.n_head_kv, hd, b.pos.data(), cos_t, sin_t, c.rotary_dim);
}

/* Where one token goes: n_expert_used experts (highest routing score first) and their weights. */
struct dllm__moe_route {
    std::vector<int> expert;
    std::vector<float> weight;
};

/* The indices of the k largest of score[i] for i in [0, n) with allowed(i), largest first, ties to the lower index
 * (dllm's reading of torch.topk's order, which torch leaves unspecified). */
template <class Allowed>
static std::vector<int> dllm__top_k_indices(const float *score, int n, int k, const Allowed &allowed) {
    std::vector<int> idx;
    for (int i = 0; i < n; i++)
        if (allowed(i)) idx.push_back(i);
    auto before = [&](int a, int b) { return score[a] > score[b] || (score[a] == score[b] && a < b); };
    k = std::min(k, (int)idx.size());
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), before);
    idx.resize((size_t)k);
    return idx;
}

/* LLaDA2MoeGate on one token's router logits (fp32): s = sigmoid(logits); the routing score s + expert_bias picks
 * the groups (n_group_used of n_expert_group, each scored by the sum of its top 2) and then the experts among
 * them; their weights are the unbiased s, normalised by their sum (+1e-20) when more than one, times
 * routed_scale. */
static dllm__moe_route dllm__moe_route_token(const dllm__config &c, const float *logits, const float *expert_bias) {
    const int E = c.n_expert, per_group = E / c.n_expert_group;
    std::vector<float> s((size_t)E), routing((size_t)E), group_score((size_t)c.n_expert_group);
    for (int e = 0; e < E; e++) {
        s[(size_t)e] = 1.0f / (1.0f + expf(-logits[e]));
        routing[(size_t)e] = s[(size_t)e] + expert_bias[e];
    }
    for (int g = 0; g < c.n_expert_group; g++) {
        std::vector<int> top2 =
            dllm__top_k_indices(routing.data() + (size_t)g * per_group, per_group, 2, [](int) { return true; });
        group_score[(size_t)g] =
            routing[(size_t)(g * per_group + top2[0])] + routing[(size_t)(g * per_group + top2[1])];
    }
    std::vector<int> groups =
        dllm__top_k_indices(group_score.data(), c.n_expert_group, c.n_group_used, [](int) { return true; });
    std::vector<uint8_t> group_kept((size_t)c.n_expert_group, 0);
    for (int g : groups) group_kept[(size_t)g] = 1;
    dllm__moe_route r;
    r.expert = dllm__top_k_indices(routing.data(), E, c.n_expert_used,
                                   [&](int e) { return group_kept[(size_t)(e / per_group)] != 0; });
    float sum = 0;
    for (int e : r.expert) sum += s[(size_t)e];
    for (int e : r.expert)
        r.weight.push_back((c.n_expert_used > 1 ? s[(size_t)e] / (sum + 1e-20f) : s[(size_t)e]) * c.routed_scale);
    return r;
}

/* out[T][d] = sum over a token's experts (in route order) of weight * expert(x), plus the shared expert's output:
 * LLaDA2MoeSparseMoeBlock on the normed rows x, every expert in the layer's precision (q: its FP8 or SoloQ weights, or
 * null). The router stays exact (fp32 logits of x before any quantisation, as the official code computes them): which
 * experts a token gets never depends on the precision. Each expert runs once over the rows routed to it; every row's
 * arithmetic is its own (its quantisation too), so a row's result does not depend on the other rows. x is quantised
 * in place, last (by the shared expert). */
static void dllm__cpu_moe(const dllm_model &m, const dllm__layer_weights &L, const dllm__fp8_layer *q, dllm__pool &pool,
                          float *x, int T, float *out) {
    const dllm__config &c = m.cfg;
    const int d = c.n_embd, E = c.n_expert, k = c.n_expert_used;
    std::vector<float> logits((size_t)T * E);
    dllm__cpu_linear(pool, x, T, d, *L.router, nullptr, E, logits.data());
    std::vector<dllm__moe_route> routes((size_t)T);
    std::vector<std::vector<int>> slots_of((size_t)E);  // expert e's (token * k + slot) entries
    for (int t = 0; t < T; t++) {
        routes[(size_t)t] = dllm__moe_route_token(c, logits.data() + (size_t)t * E, L.expert_bias.data());
        for (int s = 0; s < k; s++) slots_of[(size_t)routes[(size_t)t].expert[(size_t)s]].push_back(t * k + s);
    }
    std::vector<float> expert_out((size_t)T * k * d);  // [token][slot][d]
    std::vector<float> rows, ys, gate, up;
    for (int e = 0; e < E; e++) {
        const std::vector<int> &slots = slots_of[(size_t)e];
        if (slots.empty()) continue;
        const int n = (int)slots.size();
        rows.resize((size_t)n * d), ys.resize((size_t)n * d);
        gate.resize((size_t)n * c.n_ff_expert), up.resize(gate.size());
        for (int i = 0; i < n; i++)
            memcpy(rows.data() + (size_t)i * d, x + (size_t)(slots[(size_t)i] / k) * d, sizeof(float) * d);
        dllm__cpu_swiglu(pool, rows.data(), n, d, dllm__swiglu_of(c, L, q, e), gate.data(), up.data(), ys.data());
        for (int i = 0; i < n; i++)
            memcpy(expert_out.data() + (size_t)slots[(size_t)i] * d, ys.data() + (size_t)i * d, sizeof(float) * d);
    }
    std::vector<float> shared((size_t)T * d, 0.0f);
    if (c.n_ff_shared > 0) {
        gate.resize((size_t)T * c.n_ff_shared), up.resize(gate.size());
        dllm__cpu_swiglu(pool, x, T, d, dllm__swiglu_of(c, L, q), gate.data(), up.data(), shared.data());
    }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++) {
            float acc = 0;
            for (int s = 0; s < k; s++)
                acc += routes[(size_t)t].weight[(size_t)s] * expert_out[((size_t)t * k + s) * d + i];
            out[(size_t)t * d + i] = acc + shared[(size_t)t * d + i];
        }
}

/* The twins of the GPU's moe_plan and moe_grouped_gemm (src/kernels/moe.cuh): host code the CPU tests run too. */
DLLM__TEST_HOOK static void dllm__moe_plan_ref(const int *expert, int n_slots, int top_k, int n_expert, int tile_rows,
                                               std::vector<int> &first_row, std::vector<int> &tile_first,
                                               std::vector<int> &row_token, std::vector<int> &slot_row) {
    std::vector<int> count((size_t)n_expert, 0);
    for (int i = 0; i < n_slots; i++)
        if (expert[i] >= 0 && expert[i] < n_expert) count[(size_t)expert[i]]++;
    first_row.assign((size_t)n_expert + 1, 0), tile_first.assign((size_t)n_expert + 1, 0);
    for (int e = 0; e < n_expert; e++) {
        first_row[(size_t)e + 1] = first_row[(size_t)e] + count[(size_t)e];
        tile_first[(size_t)e + 1] = tile_first[(size_t)e] + (count[(size_t)e] + tile_rows - 1) / tile_rows;
    }
    std::vector<int> next(first_row.begin(), first_row.end() - 1);
    row_token.assign((size_t)first_row[(size_t)n_expert], 0), slot_row.assign((size_t)n_slots, -1);
    for (int i = 0; i < n_slots; i++) {
        const int e = expert[i];
        if (e < 0 || e >= n_expert) continue;
        const int row = next[(size_t)e]++;
        row_token[(size_t)row] = i / top_k, slot_row[(size_t)i] = row;
    }
}
/* y[row] = x[row_src ? row_src[row] : row] . w[e]^T over each expert's rows, in fp32 (bf16 in and out). */
DLLM__TEST_HOOK static void dllm__moe_grouped_gemm_ref(const uint16_t *x, const int *row_src,
                                                       const std::vector<const uint16_t *> &w,
                                                       const std::vector<int> &first_row, int N, int K, uint16_t *y) {
    for (size_t e = 0; e + 1 < first_row.size(); e++)
        for (int row = first_row[e]; row < first_row[e + 1]; row++) {
            const uint16_t *xr = x + (size_t)(row_src ? row_src[row] : row) * K;
            for (int f = 0; f < N; f++) {
                float acc = 0;
                for (int k = 0; k < K; k++)
                    acc += dllm__bf16_to_f32(xr[k]) * dllm__bf16_to_f32(w[e][(size_t)f * K + k]);
                y[(size_t)row * N + f] = dllm__f32_to_bf16(acc);
            }
        }
}
/* [FP8] The twin of moe_grouped_gemm_e4m3: y[row] = x[src(row)] . w[e]^T over each expert's rows as dllm__fp8_gemm_twin
 * computes one row (x: E4M3 codes [][k] with scales x_scale[g * x_scale_ld + row]; w[e]: codes [N][k] with block scales
 * w_scale[e] laid out as the device's; k a multiple of 128). */
DLLM__TEST_HOOK static void dllm__moe_grouped_gemm_e4m3_ref(const uint8_t *x, const float *x_scale, int x_scale_ld,
                                                             const int *row_src, const std::vector<const uint8_t *> &w,
                                                             const std::vector<const float *> &w_scale,
                                                             const std::vector<int> &first_row, int N, int k,
                                                             uint16_t *y) {
    for (size_t e = 0; e + 1 < first_row.size(); e++)
        for (int row = first_row[e]; row < first_row[e + 1]; row++) {
            const int src = row_src ? row_src[row] : row;
            dllm__fp8_gemm_twin(x + (size_t)src * k, x_scale + src, x_scale_ld, 1, w[e], w_scale[e], N, k,
                                y + (size_t)row * N);
        }
}
