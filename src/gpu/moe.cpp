/* src/gpu/moe.cpp - LLaDA2 on the GPU backend (../shared/spec/llada2.md): QK-norm with partial RoPE, the router on the
 * device and the routed experts through the GEMM entry point; twin: src/cpu/moe.cpp.
 *
 * A MoE layer (moe_ffn): the post-attention add + RMSNorm (add_rmsnorm), the router's fp32 logits (a row-independent
 * GEMM, so a token's choice never depends on the other rows), the group-limited top-k (moe_route), the chosen experts
 * copied to the host, where the slots (token, k) are sorted by expert, then token (the CPU's order); each expert's rows
 * gathered into one contiguous range, its gate|up GEMM, SwiGLU, its down GEMM (row-independent GEMMs of exactly the
 * rows it received: no capacity, no dropped token); the shared expert over every row; then each token's weighted sum
 * of its slots in slot order plus the shared expert's (moe_combine) into act_.delta. First version, exact over fast:
 * one host synchronisation a MoE layer and an expert's GEMMs launched one expert at a time; BF16 weights only. */

/* What this first version takes; the rest is refused with the setting to change. */
dllm_status dllm__gpu_backend::moe_supported() const {
    const dllm__config &c = model_.cfg;
    if (model_.random_weights)
        return dllm__fail(
            DLLM_ERR_UNSUPPORTED,
            "LLaDA2 with random weights (dllm_model_load_random, dllm-bench) has no GPU weights yet: load "
            "a checkpoint");
    if (kvq_.enabled())
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "kv_quant (--kv-quant) on LLaDA2's GPU path is not built yet: use DLLM_KV_QUANT_NONE "
                          "(--kv-quant none), or the CPU backend (--backend cpu)");
    if (c.n_ff_expert % 8 || c.n_ff_shared % 8)
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
    bind(moe_.gather, "moe_gather_rows");
    bind(moe_.combine, "moe_combine");
    return DLLM_OK;
}

/* QK-norm and partial RoPE on the T fused projection rows of act_.qkv at positions pos0 + row (twin: the end of
 * dllm__cpu_llada2_qkv). */
dllm_status dllm__gpu_backend::qk_norm_rope(size_t layer, int T, int pos0) {
    const dllm__config &c = model_.cfg;
    const dllm__gpu_layer &L = weights_->layers[layer];
    const bool norm = c.qk_norm && L.q_norm.ptr;
    const unsigned head_groups = (unsigned)(c.n_head + c.n_head_kv + 3) / 4;
    return moe_.qk_norm_rope.launch({dim3((unsigned)T, head_groups), dim3(128)}, stream_, act_.qkv.ptr, T, pos0,
                                    c.n_head, c.n_head_kv, c.head_dim, c.rotary_dim ? c.rotary_dim : c.head_dim,
                                    norm ? L.q_norm.ptr : nullptr, norm ? L.k_norm.ptr : nullptr, c.norm_eps,
                                    rope_cos_.ptr, rope_sin_.ptr);
}

/* Rows a MoE layer of M tokens may need: its M k slots, each expert's range rounded up to `align` rows. */
static int dllm__moe_align_rows(const dllm__config &c) {
    // each expert range starts on a row where every buffer's row offset is a multiple of 256 bytes
    int align = 1;
    for (int width : {c.n_embd, 2 * c.n_ff_expert, c.n_ff_expert}) {
        const int bytes = width * 2;
        int need = 1;
        while ((int64_t)need * bytes % 256) need *= 2;
        align = std::max(align, need);  // powers of two: the largest is a multiple of the others
    }
    return align;
}

/* The expert rows of a MoE layer's slots (expert[i] of slot i = token * k + j; -1: none): expert e's slots, token by
 * token (the CPU's slots_of), in rows [first_row[e], first_row[e + 1]) whose length is rounded up to `align` rows;
 * slot_token[row] the token a row holds (0 in the padding rows: a finite row, never read), slot_row[i] slot i's row
 * (-1: none). Host code, tested on the CPU (llada2.gpu_moe_slot_order). */
static void dllm__moe_slot_order(const std::vector<int> &expert, int E, int k, int align, std::vector<int> &first_row,
                                 std::vector<int> &slot_token, std::vector<int> &slot_row) {
    std::vector<int> count((size_t)E, 0);
    for (int e : expert)
        if (e >= 0 && e < E) count[(size_t)e]++;
    first_row.assign((size_t)E + 1, 0);
    for (int e = 0; e < E; e++)
        first_row[(size_t)e + 1] = first_row[(size_t)e] + (count[(size_t)e] + align - 1) / align * align;
    std::vector<int> next(first_row.begin(), first_row.end() - 1);
    slot_token.assign((size_t)first_row[(size_t)E], 0);
    slot_row.assign(expert.size(), -1);
    for (size_t i = 0; i < expert.size(); i++) {
        const int e = expert[i];
        if (e < 0 || e >= E) continue;  // no expert (NaN scores): the slot adds nothing, as moe_combine says
        const int row = next[(size_t)e]++;
        slot_token[(size_t)row] = (int)i / k;
        slot_row[i] = row;
    }
}

/* The buffers of a MoE layer over M tokens (zeroed when made: the padding rows between experts hold finite values). */
dllm_status dllm__gpu_backend::moe_fit(int M) {
    const dllm__config &c = model_.cfg;
    const size_t d = (size_t)c.n_embd, E = (size_t)c.n_expert, k = (size_t)c.n_expert_used, ff = (size_t)c.n_ff_expert,
                 ffs = (size_t)std::max(c.n_ff_shared, 8);
    const size_t rows = (size_t)M * k + E * (size_t)(dllm__moe_align_rows(c) - 1);
    DLLM__TRY(moe_.logits.fit((size_t)M * E * 4, "the MoE router's logits"));
    DLLM__TRY(moe_.expert.fit((size_t)M * k * 4, "the MoE routes"));
    DLLM__TRY(moe_.weight.fit((size_t)M * k * 4, "the MoE routes"));
    DLLM__TRY(moe_.slot_row.fit((size_t)M * k * 4, "the MoE routes"));
    DLLM__TRY(moe_.slot_token.fit(rows * 4, "the MoE routes"));
    for (auto buf : {std::make_pair(&moe_.x, d), std::make_pair(&moe_.gu, 2 * ff), std::make_pair(&moe_.f, ff),
                     std::make_pair(&moe_.y, d)}) {
        const void *was = buf.first->ptr;
        DLLM__TRY(buf.first->fit(rows * buf.second * 2, "the MoE experts' rows"));
        if (buf.first->ptr != was) DLLM__CUDA(cudaMemsetAsync(buf.first->ptr, 0, buf.first->bytes, stream_));
    }
    DLLM__TRY(moe_.shared_gu.fit((size_t)M * 2 * ffs * 2, "the MoE shared expert's rows"));
    DLLM__TRY(moe_.shared_f.fit((size_t)M * ffs * 2, "the MoE shared expert's rows"));
    DLLM__TRY(moe_.shared_y.fit((size_t)M * d * 2, "the MoE shared expert's rows"));
    moe_.rows = (int)rows;
    return DLLM_OK;
}

/* The router of layer l over the M normed rows of act_.a, and the slots' order: moe_.expert and moe_.weight [M][k] on
 * the device, moe_.first_row (expert e's rows [first_row[e], first_row[e + 1]), padding included), slot_token (the
 * token of each expert row) and slot_row (the expert row of each slot) on both sides. */
dllm_status dllm__gpu_backend::moe_route(size_t l, int M) {
    const dllm__config &c = model_.cfg;
    const dllm__gpu_layer &L = weights_->layers[l];
    const int E = c.n_expert, k = c.n_expert_used, P = M * k, align = dllm__moe_align_rows(c);
    DLLM__TRY(gemm(L.router.view(), act_.a.ptr, moe_.logits.ptr, M, DLLM__ROWS_INDEPENDENT, CUDA_R_32F));
    mark("moe router gemm");
    DLLM__TRY(moe_.route.launch({dim3((unsigned)M), dim3(32)}, stream_, moe_.logits.ptr, L.expert_bias.ptr, M, E,
                                c.n_expert_group, c.n_group_used, k, (float)c.routed_scale, moe_.expert.ptr,
                                moe_.weight.ptr));
    mark("moe route");
    moe_.expert_host.resize((size_t)P);
    DLLM__CUDA(
        cudaMemcpyAsync(moe_.expert_host.data(), moe_.expert.ptr, (size_t)P * 4, cudaMemcpyDeviceToHost, stream_));
    if (moe_.debug_logits) {
        std::vector<float> &lg = (*moe_.debug_logits)[(int)l];
        lg.resize((size_t)M * E);
        DLLM__CUDA(cudaMemcpyAsync(lg.data(), moe_.logits.ptr, lg.size() * 4, cudaMemcpyDeviceToHost, stream_));
    }
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    if (moe_.debug_experts) (*moe_.debug_experts)[(int)l] = moe_.expert_host;
    dllm__moe_slot_order(moe_.expert_host, E, k, align, moe_.first_row, moe_.slot_token_host, moe_.slot_row_host);
    if (moe_.first_row[(size_t)E] > moe_.rows)
        return dllm__fail(DLLM_ERR_INTERNAL, "MoE layer %zu: %d expert rows past the %d the buffers hold", l,
                          moe_.first_row[(size_t)E], moe_.rows);
    DLLM__CUDA(cudaMemcpyAsync(moe_.slot_token.ptr, moe_.slot_token_host.data(), moe_.slot_token_host.size() * 4,
                               cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(moe_.slot_row.ptr, moe_.slot_row_host.data(), (size_t)P * 4, cudaMemcpyHostToDevice,
                               stream_));
    // the host vectors are read by the copies above: keep them until they are done (the next layer reuses them)
    DLLM__CUDA(cudaStreamSynchronize(stream_));
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
    const int d = c.n_embd, E = c.n_expert, ff = c.n_ff_expert, ffs = c.n_ff_shared;
    DLLM__TRY(moe_fit(M));
    DLLM__TRY(moe_route(l, M));
    const int rows = moe_.first_row[(size_t)E];
    if (rows > 0) {
        DLLM__TRY(moe_.gather.launch({dim3((unsigned)rows), dim3(128)}, stream_, act_.a.ptr, d, moe_.slot_token.ptr,
                                     rows, moe_.x.ptr));
        mark("moe gather");
    }
    for (int e = 0; e < E; e++) {
        const int r = moe_.first_row[(size_t)e], n = moe_.first_row[(size_t)e + 1] - r;
        if (n == 0) continue;
        // the padding rows at the range's end are computed too (zeros or stale finite rows, never read): whole ranges
        // keep every launch's row count a multiple of the alignment
        DLLM__TRY(gemm(L.expert_gu[(size_t)e].view(), (const char *)moe_.x.ptr + (size_t)r * d * 2,
                       (char *)moe_.gu.ptr + (size_t)r * 2 * ff * 2, n, DLLM__ROWS_INDEPENDENT));
    }
    mark("moe gemm gate+up");
    if (rows > 0)
        DLLM__TRY(kernels_.rowwise.swiglu.launch({dllm__rows_grid(rows, ff / 8, 256), dim3(256)}, stream_, moe_.gu.ptr,
                                                 moe_.f.ptr, rows, ff));
    mark("moe swiglu");
    for (int e = 0; e < E; e++) {
        const int r = moe_.first_row[(size_t)e], n = moe_.first_row[(size_t)e + 1] - r;
        if (n == 0) continue;
        DLLM__TRY(gemm(L.expert_down[(size_t)e].view(), (const char *)moe_.f.ptr + (size_t)r * ff * 2,
                       (char *)moe_.y.ptr + (size_t)r * d * 2, n, DLLM__ROWS_INDEPENDENT));
    }
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
