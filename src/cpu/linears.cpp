/* src/cpu/linears.cpp - the CPU forward's linears in a layer's precision (exact, FP8, SoloQ): the Q|K|V projection
 * (three tensors, or LLaDA2's fused one) and the SwiGLU FFN (a dense MLP, LLaDA2's shared and routed experts). */

/* y[T][N] = x . W[row0 .. row0 + N)^T (+ bias) on an FP8 weight; x is quantised in place first. */
static void dllm__cpu_linear_fp8(dllm__pool &pool, float *x, int T, int K, const dllm__fp8_matrix &W, int row0,
                                 const float *bias, int N, float *y) {
    dllm__fake_quantize_groups(x, T, K);
    dllm__cpu_linear_rows(
        pool, x, T, K, [&](int n, float *dst) { W.row(row0 + n, dst); }, bias, N, y);
}

/* b.q, b.k, b.v = the Q|K|V projections (+ biases) of the T rows of b.a in the layer's precision (q: its FP8 or SoloQ
 * weights, or null for the exact ones); b.a is quantised in place. LLaDA2's fused weight has the rows of the three. */
static void dllm__cpu_qkv_proj(const dllm__config &c, const dllm__layer_weights &L, const dllm__fp8_layer *q,
                               dllm__pool &pool, dllm__cpu_buffers &b, int T) {
    const int d = c.n_embd, qd = c.n_head * c.head_dim, kvd = c.n_head_kv * c.head_dim;
    const int row0[3] = {0, qd, qd + kvd}, rows[3] = {qd, kvd, kvd};
    const float *bias[3] = {L.bq.empty() ? nullptr : L.bq.data(), L.bk.empty() ? nullptr : L.bk.data(),
                            L.bv.empty() ? nullptr : L.bv.data()};
    float *out[3] = {b.q.data(), b.k.data(), b.v.data()};
    auto exact_row = [&](int r, float *dst) {  // row r of Q|K|V
        if (L.wqkv) return dllm__tensor_row(*L.wqkv, r, d, dst);
        const dllm__tensor &W = r < qd ? *L.wq : r < qd + kvd ? *L.wk : *L.wv;
        dllm__tensor_row(W, r < qd ? r : r < qd + kvd ? r - qd : r - qd - kvd, d, dst);
    };
    for (int i = 0; i < 3; i++) {
        if (q && q->soloq) {
            dllm__cpu_linear_soloq(pool, b.a.data(), i == 0, T, *q->soloq, DLLM__SOLOQ_QKV, row0[i], bias[i], rows[i],
                                   out[i]);
        } else if (q && !q->qkv.empty()) {
            if (i == 0) dllm__fake_quantize_groups(b.a.data(), T, d);
            dllm__cpu_linear_rows(
                pool, b.a.data(), T, d, [&](int n, float *dst) { q->qkv.row(row0[i] + n, dst); }, bias[i], rows[i],
                out[i]);
        } else {
            dllm__cpu_linear_rows(
                pool, b.a.data(), T, d, [&](int n, float *dst) { exact_row(row0[i] + n, dst); }, bias[i], rows[i],
                out[i]);
        }
    }
}

/* One SwiGLU, down(silu(gate x) * up x), in its layer's precision: the exact tensors, FP8 gate|up and down, or the
 * SoloQ layer's linears at sites GU and DOWN (of routed expert `expert`, or the layer's own: -1). */
struct dllm__swiglu {
    int ff = 0;
    const dllm__tensor *gate = nullptr, *up = nullptr, *down = nullptr;
    const dllm__fp8_matrix *fp8_gu = nullptr, *fp8_down = nullptr;
    const dllm__soloq_layer *soloq = nullptr;
    int expert = -1;
};

/* Layer L's always-on SwiGLU (dllm__ffn_parts: its MLP, or the shared expert) or, with expert >= 0, LLaDA2's routed
 * expert `expert`, in the precision of q (null: exact). */
static dllm__swiglu dllm__swiglu_of(const dllm__config &c, const dllm__layer_weights &L, const dllm__fp8_layer *q,
                                    int expert = -1) {
    dllm__swiglu w;
    w.expert = expert;
    if (expert >= 0) {
        const size_t e = (size_t)expert;
        w.ff = c.n_ff_expert;
        w.gate = L.expert_gate[e], w.up = L.expert_up[e], w.down = L.expert_down[e];
        if (q && !q->expert_gu.empty()) w.fp8_gu = &q->expert_gu[e], w.fp8_down = &q->expert_down[e];
    } else {
        const std::array<const dllm__tensor *, 3> ffn = dllm__ffn_parts(L);
        w.ff = L.router ? c.n_ff_shared : c.n_ff;
        w.gate = ffn[0], w.up = ffn[1], w.down = ffn[2];
        if (q && !q->gu.empty()) w.fp8_gu = &q->gu, w.fp8_down = &q->down;
    }
    if (q && q->soloq) w.soloq = q->soloq.get();
    return w;
}

/* y[T][d] = the SwiGLU w of the T rows of x; x is quantised in place, gate and up ([T][w.ff]) are scratch. */
static void dllm__cpu_swiglu(dllm__pool &pool, float *x, int T, int d, const dllm__swiglu &w, float *gate, float *up,
                             float *y) {
    const int ff = w.ff;
    if (w.soloq) {
        dllm__cpu_linear_soloq(pool, x, true, T, *w.soloq, DLLM__SOLOQ_GU, 0, nullptr, ff, gate, w.expert);
        dllm__cpu_linear_soloq(pool, x, false, T, *w.soloq, DLLM__SOLOQ_GU, ff, nullptr, ff, up, w.expert);
    } else if (w.fp8_gu) {
        dllm__cpu_linear_fp8(pool, x, T, d, *w.fp8_gu, 0, nullptr, ff, gate);
        dllm__cpu_linear_rows(
            pool, x, T, d, [&](int n, float *dst) { w.fp8_gu->row(ff + n, dst); }, nullptr, ff, up);
    } else {
        dllm__cpu_linear(pool, x, T, d, *w.gate, nullptr, ff, gate);
        dllm__cpu_linear(pool, x, T, d, *w.up, nullptr, ff, up);
    }
    for (size_t i = 0; i < (size_t)T * ff; i++) gate[i] = dllm__silu(gate[i]) * up[i];
    if (w.soloq)
        dllm__cpu_linear_soloq(pool, gate, true, T, *w.soloq, DLLM__SOLOQ_DOWN, 0, nullptr, d, y, w.expert);
    else if (w.fp8_down)
        dllm__cpu_linear_fp8(pool, gate, T, ff, *w.fp8_down, 0, nullptr, d, y);
    else
        dllm__cpu_linear(pool, gate, T, ff, *w.down, nullptr, d, y);
}
