/* src/gpu/moe.cpp - LLaDA2 on the GPU backend (../shared/spec/llada2.md): QK-norm with partial RoPE, the router on the
 * device and the routed experts in one grouped GEMM launch each; twin: src/cpu/moe.cpp.
 *
 * A MoE layer (moe_ffn): the post-attention add + RMSNorm (add_rmsnorm), the router's fp32 logits (a row-independent
 * GEMM, so a token's choice never depends on the other rows), the group-limited top-k (moe_route), the plan of the
 * routes on the device (moe_plan: the slots (token, k) sorted by expert, then token, the CPU's order; each expert's
 * rows and row tiles), the gate|up GEMM of every expert over the rows it received in one launch (moe_grouped_gemm,
 * reading each row's token from the normed rows: no gather), SwiGLU, the down GEMM likewise (no capacity, no dropped
 * token), the shared expert over every row, then each token's weighted sum of its slots in slot order plus the shared
 * expert's (moe_combine) into act_.delta. Nothing goes back to the host: every launch's grid is a bound fixed by the
 * row count M alone (the grouped GEMM's CTAs past the plan's tile count leave at once), so a forward is captured as a
 * CUDA graph like any other. A row's bits do not depend on the other rows (each kernel is row-independent), so a
 * token's output is the same in any batch. BF16 weights only (FP8 and SoloQ run on the CPU backend). */

/* What this first version takes; the rest is refused with the setting to change. */
dllm_status dllm__gpu_backend::moe_supported() const {
    const dllm__config &c = model_.cfg;
    if (precision_ != DLLM_PRECISION_BF16)  // the CPU backend runs them (src/cpu/moe.cpp)
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "precision (--precision) %s on LLaDA2's GPU path is not built yet: use DLLM_PRECISION_BF16 "
                          "(--precision bf16), or the CPU backend (--backend cpu)",
                          dllm__precision_name(precision_));
    if (kvq_.enabled())
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "kv_quant (--kv-quant) on LLaDA2's GPU path is not built yet: use DLLM_KV_QUANT_NONE "
                          "(--kv-quant none), or the CPU backend (--backend cpu)");
    if (c.n_ff_expert % 8 || c.n_ff_shared % 8)  // the hidden size: init's check, before this one
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "LLaDA2 on the GPU backend needs expert widths divisible by 8 (moe_intermediate_size %d, "
                          "shared %d); use the CPU backend (--backend cpu)",
                          c.n_ff_expert, c.n_ff_shared);
    if (c.n_expert > dllm__moe_max_experts || c.n_expert_group > dllm__moe_max_groups || c.n_expert_used > 32)
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "LLaDA2 on the GPU backend routes at most %d experts in %d groups, 32 a token; this model "
                          "has %d in %d, %d a token: use the CPU backend (--backend cpu)",
                          dllm__moe_max_experts, dllm__moe_max_groups, c.n_expert, c.n_expert_group, c.n_expert_used);
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::load_moe() {
    if (moe_.module) return DLLM_OK;
    DLLM__TRY(dllm__jit_load(dllm__module_moe(arch_), moe_.module));
    auto bind = [&](auto &k, const char *name) { k.fn = moe_.module->kernels.at(name), k.name = name; };
    bind(moe_.qk_norm_rope, "qk_norm_rope");
    bind(moe_.route, "moe_route");
    bind(moe_.plan_kernel, "moe_plan");
    bind(moe_.grouped_gemm, "moe_grouped_gemm");
    bind(moe_.combine, "moe_combine");
    return DLLM_OK;
}

/* QK-norm and partial RoPE on the T fused projection rows of act_.qkv from row r0 on, at positions pos0 + row (twin:
 * the end of dllm__cpu_llada2_qkv). */
dllm_status dllm__gpu_backend::qk_norm_rope(size_t layer, int T, int pos0, int r0) {
    const dllm__config &c = model_.cfg;
    const dllm__gpu_layer &L = weights_->layers[layer];
    const bool norm = c.qk_norm && L.q_norm.ptr;
    const unsigned head_groups = (unsigned)(c.n_head + c.n_head_kv + 3) / 4;
    bf16_t *qkv = act_.qkv.as<bf16_t>() + (size_t)r0 * (c.n_head + 2 * c.n_head_kv) * c.head_dim;
    return moe_.qk_norm_rope.launch({dim3((unsigned)T, head_groups), dim3(128)}, stream_, qkv, T, pos0, c.n_head,
                                    c.n_head_kv, c.head_dim, c.rotary_dim ? c.rotary_dim : c.head_dim,
                                    norm ? L.q_norm.ptr : nullptr, norm ? L.k_norm.ptr : nullptr, c.norm_eps,
                                    rope_cos_.ptr, rope_sin_.ptr);
}

/* [batch] qk_norm_rope over a batched layout's rows at their own positions (v.positions): one launch per run of
 * consecutive positions (a block-diffusion sequence's rows are one run). Row-wise: a row's bits never depend on the
 * other rows. */
dllm_status dllm__gpu_backend::qk_norm_rope_varlen(size_t layer, const dllm__varlen_layout &v) {
    for (int r0 = 0, r1 = 0; r0 < v.rows; r0 = r1) {
        for (r1 = r0 + 1; r1 < v.rows && v.positions[(size_t)r1] == v.positions[(size_t)r1 - 1] + 1; r1++) {}
        DLLM__TRY(qk_norm_rope(layer, r1 - r0, v.positions[(size_t)r0], r0));
    }
    return DLLM_OK;
}

/* Row tiles a MoE layer of M tokens may need (the grouped GEMM's grid): each expert's last tile may be short, so at
 * most M k / tile_rows whole tiles plus one short tile per expert that received a row. */
static int dllm__moe_tile_bound(const dllm__config &c, int M) {
    const int slots = M * c.n_expert_used;
    return slots / dllm__moe_tile_rows + std::min(c.n_expert, slots);
}

/* The buffers of a MoE layer over M tokens, sized by M alone (fit_buffers calls it before a forward is captured; a
 * buffer that moves bumps act_.generation, as the activations' do). The expert rows are zeroed when made: SwiGLU runs
 * over all M k rows, whose tail past the routed rows then holds finite values nobody reads. */
dllm_status dllm__gpu_backend::moe_fit(int M) {
    const dllm__config &c = model_.cfg;
    const size_t d = (size_t)c.n_embd, E = (size_t)c.n_expert, k = (size_t)c.n_expert_used, ff = (size_t)c.n_ff_expert,
                 ffs = (size_t)std::max(c.n_ff_shared, 8);
    const size_t rows = (size_t)M * k;
    const std::vector<const void *> before = {moe_.logits.ptr, moe_.expert.ptr,    moe_.weight.ptr,
                                              moe_.slot_row.ptr, moe_.row_token.ptr, moe_.plan.ptr,
                                              moe_.gu.ptr,     moe_.f.ptr,         moe_.y.ptr,
                                              moe_.shared_gu.ptr, moe_.shared_f.ptr, moe_.shared_y.ptr};
    DLLM__TRY(moe_.logits.fit((size_t)M * E * 4, "the MoE router's logits"));
    DLLM__TRY(moe_.expert.fit(rows * 4, "the MoE routes"));
    DLLM__TRY(moe_.weight.fit(rows * 4, "the MoE routes"));
    DLLM__TRY(moe_.slot_row.fit(rows * 4, "the MoE routes"));
    DLLM__TRY(moe_.row_token.fit(rows * 4, "the MoE routes"));
    DLLM__TRY(moe_.plan.fit(2 * (E + 1) * 4, "the MoE routes"));
    for (auto buf : {std::make_pair(&moe_.gu, 2 * ff), std::make_pair(&moe_.f, ff), std::make_pair(&moe_.y, d)}) {
        const void *was = buf.first->ptr;
        DLLM__TRY(buf.first->fit(rows * buf.second * 2, "the MoE experts' rows"));
        if (buf.first->ptr != was) DLLM__CUDA(cudaMemsetAsync(buf.first->ptr, 0, buf.first->bytes, stream_));
    }
    DLLM__TRY(moe_.shared_gu.fit((size_t)M * 2 * ffs * 2, "the MoE shared expert's rows"));
    DLLM__TRY(moe_.shared_f.fit((size_t)M * ffs * 2, "the MoE shared expert's rows"));
    DLLM__TRY(moe_.shared_y.fit((size_t)M * d * 2, "the MoE shared expert's rows"));
    const std::vector<const void *> after = {moe_.logits.ptr, moe_.expert.ptr,    moe_.weight.ptr,   moe_.slot_row.ptr,
                                             moe_.row_token.ptr, moe_.plan.ptr,   moe_.gu.ptr,       moe_.f.ptr,
                                             moe_.y.ptr,      moe_.shared_gu.ptr, moe_.shared_f.ptr, moe_.shared_y.ptr};
    if (after != before) act_.generation++;
    return DLLM_OK;
}

/* Each MoE layer's expert weights as device arrays of pointers (gate|up, then down, E each), for the grouped GEMM. */
dllm_status dllm__gpu_backend::moe_pointers() {
    const size_t E = (size_t)model_.cfg.n_expert, n_layers = weights_->layers.size();
    std::vector<const void *> ptrs(n_layers * 2 * E, nullptr);
    for (size_t l = 0; l < n_layers; l++) {
        const dllm__gpu_layer &L = weights_->layers[l];
        for (size_t e = 0; e < L.expert_gu.size() && e < E; e++)
            ptrs[(l * 2 + 0) * E + e] = L.expert_gu[e].data.ptr, ptrs[(l * 2 + 1) * E + e] = L.expert_down[e].data.ptr;
    }
    DLLM__TRY(moe_.expert_ptrs.fit(ptrs.size() * sizeof(void *), "the MoE experts' addresses"));
    DLLM__CUDA(cudaMemcpy(moe_.expert_ptrs.ptr, ptrs.data(), ptrs.size() * sizeof(void *), cudaMemcpyHostToDevice));
    return DLLM_OK;
}

/* The router of layer l over the M normed rows of act_.a, then the routes' plan, all on the device: moe_.expert and
 * moe_.weight [M][k], the plan's first_row and tile_first [E + 1] (moe_.plan), row_token (the token of each expert row)
 * and slot_row (the expert row of each slot). With the debug hooks set, the chosen experts and logits are copied back
 * (a synchronisation: bd_run never captures then). */
dllm_status dllm__gpu_backend::moe_route(size_t l, int M) {
    const dllm__config &c = model_.cfg;
    const dllm__gpu_layer &L = weights_->layers[l];
    const int E = c.n_expert, k = c.n_expert_used, P = M * k;
    DLLM__TRY(gemm(L.router.view(), act_.a.ptr, moe_.logits.ptr, M, DLLM__ROWS_INDEPENDENT, CUDA_R_32F));
    mark("moe router gemm");
    DLLM__TRY(moe_.route.launch({dim3((unsigned)M), dim3(32)}, stream_, moe_.logits.ptr, L.expert_bias.ptr, M, E,
                                c.n_expert_group, c.n_group_used, k, (float)c.routed_scale, moe_.expert.ptr,
                                moe_.weight.ptr));
    mark("moe route");
    int *first_row = moe_.plan.as<int>(), *tile_first = first_row + E + 1;
    DLLM__TRY(moe_.plan_kernel.launch({dim3(1), dim3(256)}, stream_, moe_.expert.ptr, P, k, E, first_row, tile_first,
                                      moe_.row_token.ptr, moe_.slot_row.ptr));
    mark("moe plan");
    if (moe_.debug_experts || moe_.debug_logits) {
        std::vector<int> experts((size_t)P);
        DLLM__CUDA(cudaMemcpyAsync(experts.data(), moe_.expert.ptr, (size_t)P * 4, cudaMemcpyDeviceToHost, stream_));
        std::vector<float> lg((size_t)M * E);
        DLLM__CUDA(cudaMemcpyAsync(lg.data(), moe_.logits.ptr, lg.size() * 4, cudaMemcpyDeviceToHost, stream_));
        DLLM__CUDA(cudaStreamSynchronize(stream_));
        if (moe_.debug_experts) (*moe_.debug_experts)[(int)l] = experts;
        if (moe_.debug_logits) (*moe_.debug_logits)[(int)l] = lg;
    }
    return DLLM_OK;
}

/* Layer l's FFN when it is a MoE layer (ffn's): rows [r0, r0 + M) of act_.delta hold the attention output projection
 * in and the MoE output out; h_in (+ delta) -> h_out, as ffn. */
dllm_status dllm__gpu_backend::moe_ffn(size_t l, int M, const float *h_in, float *h_out, int r0) {
    const dllm__config &c = model_.cfg;
    char *delta = (char *)act_.delta.ptr + (size_t)r0 * c.n_embd * 2;
    DLLM__TRY(add_rmsnorm(h_in, h_out, delta, weights_->layers[l].ffn_norm.ptr, act_.a.ptr, 1, M, 0, M));
    mark("add+norm");
    return moe_block(l, M, delta);
}

/* The mixture of experts of layer l on the M normed rows of act_.a into the bf16 rows `out` (twin: dllm__cpu_moe). */
dllm_status dllm__gpu_backend::moe_block(size_t l, int M, void *out) {
    const dllm__config &c = model_.cfg;
    const dllm__gpu_layer &L = weights_->layers[l];
    const int d = c.n_embd, E = c.n_expert, ff = c.n_ff_expert, ffs = c.n_ff_shared, rows = M * c.n_expert_used;
    DLLM__TRY(moe_fit(M));
    DLLM__TRY(moe_route(l, M));
    const int *first_row = moe_.plan.as<int>(), *tile_first = first_row + E + 1;
    const bf16_t *const *gu_w = moe_.expert_ptrs.as<const bf16_t *>() + (l * 2 + 0) * (size_t)E;
    const bf16_t *const *down_w = gu_w + E;
    const unsigned tiles = (unsigned)dllm__moe_tile_bound(c, M);
    DLLM__TRY(moe_.grouped_gemm.launch({dim3(tiles, (unsigned)(2 * ff + 63) / 64), dim3(128)}, stream_, act_.a.ptr,
                                       moe_.row_token.ptr, gu_w, first_row, tile_first, E, 2 * ff, d, moe_.gu.ptr));
    mark("moe gemm gate+up");
    DLLM__TRY(kernels_.rowwise.swiglu.launch({dllm__rows_grid(rows, ff / 8, 256), dim3(256)}, stream_, moe_.gu.ptr,
                                             moe_.f.ptr, rows, ff));
    mark("moe swiglu");
    DLLM__TRY(moe_.grouped_gemm.launch({dim3(tiles, (unsigned)(d + 63) / 64), dim3(128)}, stream_, moe_.f.ptr,
                                       (const int *)nullptr, down_w, first_row, tile_first, E, d, ff, moe_.y.ptr));
    mark("moe gemm down");
    const bool shared = ffs > 0 && L.shared_gu.data.ptr;
    if (shared) {
        DLLM__TRY(gemm(L.shared_gu.view(), act_.a.ptr, moe_.shared_gu.ptr, M, DLLM__ROWS_INDEPENDENT));
        DLLM__TRY(kernels_.rowwise.swiglu.launch({dllm__rows_grid(M, ffs / 8, 256), dim3(256)}, stream_,
                                                 moe_.shared_gu.ptr, moe_.shared_f.ptr, M, ffs));
        DLLM__TRY(gemm(L.shared_down.view(), moe_.shared_f.ptr, moe_.shared_y.ptr, M, DLLM__ROWS_INDEPENDENT));
        mark("moe shared expert");
    }
    DLLM__TRY(moe_.combine.launch({dllm__rows_grid(M, d / 8, 256), dim3(256)}, stream_, moe_.y.ptr, moe_.slot_row.ptr,
                                  moe_.weight.ptr, shared ? moe_.shared_y.ptr : nullptr, M, c.n_expert_used, d,
                                  out));
    mark("moe combine");
    return DLLM_OK;
}
