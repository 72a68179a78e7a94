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
 * token's output is the same in any batch. The experts run in the layer's precision, as the CPU's (dllm__cpu_moe):
 * BF16; FP8 (E4M3 weights with 128x128 block scales, the rows quantised in 1x128 groups: the normed rows once for
 * every expert's gate|up, the SwiGLU rows for down); SoloQ (4-bit weight rows, the rows rotated and quantised per
 * token: the normed rows once, all gate|up linears sharing their rotation, and the SwiGLU rows by the fused producer).
 * The router stays exact (its bf16 GEMM on the unquantised normed rows); the shared expert goes through gemm() in the
 * layer's format. */

/* What LLaDA2's GPU path takes (every precision: BF16, FP8, SoloQ); the rest is refused with the setting to change. */
dllm_status dllm__gpu_backend::moe_supported() const {
    const dllm__config &c = model_.cfg;
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
    bind(moe_.grouped_gemm_e4m3, "moe_grouped_gemm_e4m3");
    bind(moe_.grouped_gemm_q4[DLLM__Q4_NVFP4], "moe_grouped_gemm_nvfp4");
    bind(moe_.grouped_gemm_q4[DLLM__Q4_INT4], "moe_grouped_gemm_int4");
    bind(moe_.grouped_gemm_q4[DLLM__Q4_E8P], "moe_grouped_gemm_e8p");
    bind(moe_.grouped_gemm_q4[DLLM__Q4_RTN], "moe_grouped_gemm_rtn");  // Lloyd-Max codes only activations
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

/* Where layer l's pointers of field (0 codes, 1 scales, 2 NVFP4 block scales) of linear lin (0 gate|up, 1 down) begin
 * in moe_.expert_ptrs (E experts a list). */
static size_t dllm__moe_ptr(size_t E, size_t l, int lin, int field) { return ((l * 2 + (size_t)lin) * 3 + field) * E; }

/* The buffers of a MoE layer over M tokens, sized by M alone (fit_buffers calls it before a forward is captured; a
 * buffer that moves bumps act_.generation, as the activations' do). The expert rows are zeroed when made: SwiGLU runs
 * over all M k rows, whose tail past the routed rows then holds finite values nobody reads. */
dllm_status dllm__gpu_backend::moe_fit(int M) {
    const dllm__config &c = model_.cfg;
    const size_t d = (size_t)c.n_embd, E = (size_t)c.n_expert, k = (size_t)c.n_expert_used, ff = (size_t)c.n_ff_expert,
                 ffs = (size_t)std::max(c.n_ff_shared, 8);
    const size_t rows = (size_t)M * k;
    const std::vector<const void *> before = moe_.addresses();
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
    // [FP8] [SoloQ] the experts' inputs quantised: the normed rows (x_codes, x_scale) and the SwiGLU rows (f_codes,
    // f_scale; SoloQ's C values go to f): FP8's codes [rows_pad][k_pad] with scales [k_pad / 128][rows_pad], SoloQ's
    // C values [rows][width] with a scale a row. Zeroed when made: the padding is read as zero codes.
    const dllm__wformat wf = moe_format();
    const size_t Mp = (size_t)dllm__round_up(M, 16), Rp = (size_t)dllm__round_up((int)rows, 16);
    const size_t dp = (size_t)dllm__round_up((int)d, 128), ffp = (size_t)dllm__round_up((int)ff, 128);
    const std::pair<dllm__dbuf *, size_t> quantised[] = {
        {&moe_.x_codes, wf == DLLM__W_E4M3_BLOCK ? Mp * dp : wf == DLLM__W_Q4 ? (size_t)M * d * 2 : 0},
        {&moe_.x_scale, wf == DLLM__W_E4M3_BLOCK ? dp / 128 * Mp * 4 : wf == DLLM__W_Q4 ? (size_t)M * 4 : 0},
        {&moe_.f_codes, wf == DLLM__W_E4M3_BLOCK ? Rp * ffp : 0},
        {&moe_.f_scale, wf == DLLM__W_E4M3_BLOCK ? ffp / 128 * Rp * 4 : wf == DLLM__W_Q4 ? rows * 4 : 0}};
    for (const auto &buf : quantised) {
        if (!buf.second) continue;
        const void *was = buf.first->ptr;
        DLLM__TRY(buf.first->fit(buf.second, "the MoE experts' quantised rows"));
        if (buf.first->ptr != was) DLLM__CUDA(cudaMemsetAsync(buf.first->ptr, 0, buf.first->bytes, stream_));
    }
    // an FP8 GEMM (the shared expert's, through gemm()) writes whole 16-row tiles
    DLLM__TRY(moe_.shared_gu.fit(Mp * 2 * ffs * 2, "the MoE shared expert's rows"));
    DLLM__TRY(moe_.shared_f.fit((size_t)M * ffs * 2, "the MoE shared expert's rows"));
    DLLM__TRY(moe_.shared_y.fit(Mp * d * 2, "the MoE shared expert's rows"));
    if (moe_.addresses() != before) act_.generation++;
    return DLLM_OK;
}

/* The quantised format of the routed experts' weights (one a context; under FP8 a MoE layer 0 stays BF16, as the
 * CPU's), BF16 where none is quantised. */
dllm__wformat dllm__gpu_backend::moe_format() const {
    for (const dllm__gpu_layer &L : weights_->layers)
        if (!L.expert_gu.empty() && L.expert_gu[0].format != DLLM__W_BF16) return L.expert_gu[0].format;
    return DLLM__W_BF16;
}

/* Each MoE layer's expert weights as device arrays of pointers, for the grouped GEMMs: [layer][gate|up, down][codes,
 * scales, NVFP4 block scales][E] (dllm__moe_ptr). */
dllm_status dllm__gpu_backend::moe_pointers() {
    const size_t E = (size_t)model_.cfg.n_expert, n_layers = weights_->layers.size();
    std::vector<const void *> ptrs(n_layers * 2 * 3 * E, nullptr);
    for (size_t l = 0; l < n_layers; l++) {
        const dllm__gpu_layer &L = weights_->layers[l];
        for (int lin = 0; lin < 2; lin++) {
            const std::vector<dllm__linear> &experts = lin ? L.expert_down : L.expert_gu;
            for (size_t e = 0; e < experts.size() && e < E; e++) {
                const dllm__linear &W = experts[e];
                ptrs[dllm__moe_ptr(E, l, lin, 0) + e] = W.data.ptr;
                ptrs[dllm__moe_ptr(E, l, lin, 1) + e] = W.scale.ptr;
                ptrs[dllm__moe_ptr(E, l, lin, 2) + e] = W.q4 ? W.q4->block_scales.ptr : nullptr;
            }
        }
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

dllm_status dllm__gpu_backend::moe_route_all(int M) {
    for (size_t l = 0; l < weights_->layers.size(); l++)
        if (moe_layer(l)) DLLM__TRY(moe_route(l, M));
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

/* The grouped GEMM of layer l's routed experts (down: their down linears, else gate|up) over the plan's rows, in their
 * weight format, into y [rows][N]: x the activation rows in the form that format's GEMM takes (bf16 rows; FP8: E4M3
 * codes [][k_pad] with scales [k_pad / 128][x_scale_ld]; SoloQ: C values with a scale a row, or none under -w4a16),
 * row_src the x row of each expert row (null: the row itself). */
dllm_status dllm__gpu_backend::moe_grouped(size_t l, bool down, int M, const void *x, const float *x_scale,
                                           int x_scale_ld, const int *row_src, void *y) {
    const dllm__gpu_layer &L = weights_->layers[l];
    const dllm__linear &W0 = down ? L.expert_down[0] : L.expert_gu[0];
    const int E = model_.cfg.n_expert, N = W0.n;
    const int *first_row = moe_.plan.as<int>(), *tile_first = first_row + E + 1;
    const void *const *ptrs = moe_.expert_ptrs.as<const void *>() + dllm__moe_ptr((size_t)E, l, down ? 1 : 0, 0);
    const dllm__grid grid(dim3((unsigned)dllm__moe_tile_bound(model_.cfg, M), (unsigned)(N + 63) / 64),
                          dim3(dllm__moe_threads));
    if (W0.format == DLLM__W_BF16)
        return moe_.grouped_gemm.launch(grid, stream_, (const bf16_t *)x, row_src, (const bf16_t *const *)ptrs,
                                        first_row, tile_first, E, N, W0.k, (bf16_t *)y);
    moe_gemm_args a = {};
    a.x = x, a.x_scale = x_scale, a.row_src = row_src, a.w = ptrs, a.w_scale = (const float *const *)(ptrs + E);
    a.w_block_scales = (const unsigned char *const *)(ptrs + 2 * E), a.first_row = first_row,
    a.tile_first = tile_first, a.y = (bf16_t *)y, a.n_expert = E, a.N = N, a.x_scale_ld = x_scale_ld;
    if (W0.format == DLLM__W_E4M3_BLOCK) {  // K padded to whole 128-groups, as the codes of both operands are
        a.K = a.x_ld = dllm__round_up(W0.k, 128);
        a.w_scale_ld = dllm__round_up(a.K / 128, 4);
        return moe_.grouped_gemm_e4m3.launch(grid, stream_, a);
    }
    const dllm__q4_format f = W0.q4->format;
    if (W0.q4->packed || !moe_.grouped_gemm_q4[f].fn)
        return dllm__fail(DLLM_ERR_INTERNAL, "the MoE grouped GEMM takes no %s%s expert weights", dllm__q4_names[f],
                          W0.q4->packed ? " (q4wg-packed)" : "");
    a.K = a.x_ld = W0.k;
    return moe_.grouped_gemm_q4[f].launch(grid, stream_, a);
}

/* The mixture of experts of layer l on the M normed rows of act_.a into the bf16 rows `out` (twin: dllm__cpu_moe): the
 * router on the bf16 rows; the experts' inputs in their format (FP8: quantize_rows_e4m3 of the normed rows, then
 * swiglu_e4m3; SoloQ: the normed rows rotated and quantised once by the experts' gate|up rotation, then the SwiGLU
 * producer with their down rotation; BF16: the rows as they are, then swiglu). Every stage is row-wise. */
dllm_status dllm__gpu_backend::moe_block(size_t l, int M, void *out) {
    const dllm__config &c = model_.cfg;
    const dllm__gpu_layer &L = weights_->layers[l];
    const int d = c.n_embd, ff = c.n_ff_expert, ffs = c.n_ff_shared, rows = M * c.n_expert_used;
    const dllm__wformat wf = L.expert_gu[0].format;
    DLLM__TRY(moe_fit(M));
    DLLM__TRY(moe_route(l, M));
    const int *row_token = moe_.row_token.as<int>();
    if (wf == DLLM__W_E4M3_BLOCK) {
        const int Mp = dllm__round_up(M, 16), Rp = dllm__round_up(rows, 16);
        DLLM__TRY(kernels_.rowwise.quantize_rows_e4m3.launch({dllm__e4m3_rows_grid(M, d), dim3(128)}, stream_,
                                                             act_.a.ptr, 0, d, M, moe_.x_codes.ptr, moe_.x_scale.ptr,
                                                             Mp, 0.0f));
        DLLM__TRY(moe_grouped(l, false, M, moe_.x_codes.ptr, moe_.x_scale.as<float>(), Mp, row_token, moe_.gu.ptr));
        mark("moe gemm gate+up");
        DLLM__TRY(kernels_.rowwise.swiglu_e4m3.launch({dllm__e4m3_rows_grid(rows, ff), dim3(128)}, stream_,
                                                      moe_.gu.ptr, ff, rows, moe_.f_codes.ptr, moe_.f_scale.ptr, Rp));
        mark("moe swiglu");
        DLLM__TRY(moe_grouped(l, true, M, moe_.f_codes.ptr, moe_.f_scale.as<float>(), Rp, nullptr, moe_.y.ptr));
    } else if (wf == DLLM__W_Q4) {
        const dllm__soloq_options &o = lowbit_.options;
        const float *x_scale = o.quantize_acts ? moe_.x_scale.as<float>() : nullptr,
                    *f_scale = o.quantize_acts ? moe_.f_scale.as<float>() : nullptr;
        DLLM__TRY(dllm__soloq_quantize_rows(lowbit_.kernels, *L.expert_gu[0].q4->rot, o.acts, o.quantize_acts,
                                            o.bias_correction, act_.a.ptr, (u64)d, M, d, nullptr, nullptr,
                                            moe_.x_scale.ptr, moe_.x_codes.ptr, stream_));
        DLLM__TRY(moe_grouped(l, false, M, moe_.x_codes.ptr, x_scale, 0, row_token, moe_.gu.ptr));
        mark("moe gemm gate+up");
        soloq_args a = dllm__soloq_args(*L.expert_down[0].q4->rot, o.acts, o.quantize_acts, o.bias_correction, rows,
                                        ff, moe_.f_scale.ptr, moe_.f.ptr);
        a.producer = 2, a.x = moe_.gu.ptr, a.x_stride = (u64)2 * ff;
        DLLM__TRY(dllm__soloq_launch(lowbit_.kernels, a, 1024, stream_));
        mark("moe swiglu");
        DLLM__TRY(moe_grouped(l, true, M, moe_.f.ptr, f_scale, 0, nullptr, moe_.y.ptr));
    } else {
        DLLM__TRY(moe_grouped(l, false, M, act_.a.ptr, nullptr, 0, row_token, moe_.gu.ptr));
        mark("moe gemm gate+up");
        DLLM__TRY(kernels_.rowwise.swiglu.launch({dllm__rows_grid(rows, ff / 8, 256), dim3(256)}, stream_,
                                                 moe_.gu.ptr, moe_.f.ptr, rows, ff));
        mark("moe swiglu");
        DLLM__TRY(moe_grouped(l, true, M, moe_.f.ptr, nullptr, 0, nullptr, moe_.y.ptr));
    }
    mark("moe gemm down");
    const bool shared = ffs > 0 && L.shared_gu.data.ptr;
    if (shared) {  // gemm() quantises its inputs in the shared expert's format (its own copy of the normed rows' codes)
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
