/* src/gpu/forward.cpp - the forward and its stages. */

// ---- 16.4.1 The forward and its stages ------------------------------------------------------------

/* [batch] The gemm_wg of a batched BF16 GEMM (DLLM__ROWS_BATCH), or null where no width fits (cuBLASLt's pinned
 * algorithm runs). Every width gives every output the same bits: an output's K loop is the same wgmma sequence in a
 * 256-, 128- or 64-wide tile (gpu.gemm_wg_widths_give_the_same_bits, on the H100 and the H200). So the width may follow
 * the row count without breaking batch invariance, and it must: on the H100, 128 took 0.56-0.66x of 256's time for the
 * o and down projections at 32 to 512 rows, but 1.2-1.7x at 2048 rows and 1.25x for qkv at 32 rows; 64 beat both for
 * o and down at 128 rows. DLLM_TILES=batch_gemm_n=256 (128, 64) forces one. */
const dllm__gemm_wg *dllm__gpu_backend::batch_gemm_wg(const dllm__gemm_op &op) {
    const bool bf16_out = op.out_type == CUDA_R_16BF;
    const dllm__gemm_wg *const by_width[3] = {
        gemms_.dense.own_fits(op) ? gemms_.dense.own : nullptr,
        bf16_out && gemms_.wg_n128.fits(op.X, op.W, op.Y, op.N, op.K) ? &gemms_.wg_n128 : nullptr,
        bf16_out && gemms_.wg_n64.fits(op.X, op.W, op.Y, op.N, op.K) ? &gemms_.wg_n64 : nullptr};
    const dllm__gemm_wg *first = by_width[0] ? by_width[0] : by_width[1] ? by_width[1] : by_width[2];
    int candidates = 0;
    for (int i = 0; i < 3; i++) {
        if (by_width[i] && dllm__batch_gemm_widths[i] == dllm__env().batch_gemm_n) return by_width[i];  // forced
        candidates += by_width[i] != nullptr;
    }
    if (candidates <= 1) return first;
    const dllm__gemm_wg *chosen = by_width[dllm__batch_gemm_width(op, by_width, stream_)];
    return chosen ? chosen : first;
}

/* A BF16 GEMM whose rows get the bits they have at any other row count: a step's (DLLM__ROWS_STEP) on gemm_splitk where
 * it takes the operands; otherwise, or for another kind of forward, gemm_wg (any width: same bits), else one pinned
 * cuBLASLt algorithm. The choice depends on the kind and the operands' shape, never on M. */
dllm_status dllm__gpu_backend::gemm_bf16_independent(const dllm__gemm_op &op, bool step) {
    if (step && op.out_type == CUDA_R_16BF) {
        const dllm__weight_view W = {DLLM__W_BF16, op.N, op.K, op.W, nullptr};
        if (splitk_fits(W, op.X, op.Y))
            return dllm__gemm_splitk_run(gemms_.splitk, op.X, op.W, op.Y, op.M, op.N, op.K, act_.splitk_ws.as<float>(),
                                         act_.splitk_ws.bytes / 4, stream_);
    }
    if (const dllm__gemm_wg *k = batch_gemm_wg(op))
        return dllm__gemm_wg_run(*k, op.X, op.W, op.Y, op.M, op.N, op.K, stream_);
    return gemms_.dense.run_pinned(op, stream_);
}

/* [batch] A batched forward's BF16 GEMM over all its rows: each run of sequences (batch_.gemm_runs) as its kind's GEMM,
 * so a sequence's rows get the bits they have alone. */
dllm_status dllm__gpu_backend::gemm_bf16_batch(const dllm__gemm_op &op) {
    const std::vector<dllm__gemm_run> &runs = batch_.gemm_runs;
    if (op.out_type != CUDA_R_16BF || runs.empty()) return gemm_bf16_independent(op, false);  // the LM head
    if (runs.size() == 1) return gemm_bf16_independent(op, runs[0].step);
    if (runs.back().r1 != op.M)
        return dllm__fail(DLLM_ERR_INTERNAL, "a batched GEMM of %d rows over a layout of %d", op.M, runs.back().r1);
    for (const dllm__gemm_run &run : runs) {  // bf16 in and out
        dllm__gemm_op part = op;
        part.M = run.r1 - run.r0;
        part.X = (const char *)op.X + (size_t)run.r0 * op.K * 2;
        part.Y = (char *)op.Y + (size_t)run.r0 * op.N * 2;
        DLLM__TRY(gemm_bf16_independent(part, run.step));
    }
    return DLLM_OK;
}

/* [GEMM entry point] y [M x W.n] = x . W^T in W's format; out is bf16 or (the LM head) fp32. x is the activation W's
 * GEMMs take (dllm__wformats[W.format].act): bf16 rows for BF16 weights; for E4M3 weights act_.act8, filled by the
 * kernel that produced the activation (x null), or bf16 rows [M x W.k] that this call quantises into act_.act8 first.
 * `rows` says whether the algorithm may depend on M (dllm__rows). */
dllm_status dllm__gpu_backend::gemm(const dllm__weight_view &W, const void *x, void *y, int M, dllm__rows rows,
                                    cudaDataType_t out) {
    // A solo forward under a K/V cache takes the batched forward's BF16 GEMMs on sm_90a (gemm_splitk there); FP8 and
    // SoloQ weights, and GPUs before sm_90a, keep its tuned GEMMs (their batched paths differ from the solo ones
    // anyway).
    const bool solo_kv = rows == DLLM__ROWS_STEP || rows == DLLM__ROWS_FILL;
    if (solo_kv && (W.format != DLLM__W_BF16 || !gemms_.splitk.module)) rows = DLLM__ROWS_TUNED;
    switch (W.format) {
        case DLLM__W_BF16: {
            const dllm__gemm_op op{x, W.data, y, M, W.n, W.k, out, nullptr, nullptr};
            if (rows == DLLM__ROWS_STEP || rows == DLLM__ROWS_FILL)
                return gemm_bf16_independent(op, rows == DLLM__ROWS_STEP);
            if (rows == DLLM__ROWS_BATCH) return gemm_bf16_batch(op);
            return rows != DLLM__ROWS_TUNED ? gemms_.dense.run_pinned(op, stream_) : gemms_.dense.run(op, stream_);
        }
        case DLLM__W_E4M3_BLOCK: {
            if (rows == DLLM__ROWS_BATCH) return gemm_fp8_batch(W, x, y, M);
            if (x) DLLM__TRY(quantize_rows_e4m3(x, M, W.k));
            const int m_pad = act8_rows(M), k_pad = dllm__round_up(W.k, 128);
            const bool pinned = rows != DLLM__ROWS_TUNED;
            if (gemms_.fp8 == DLLM__FP8_MMA)
                return dllm__fp8_mma_run(gemms_.fp8_mma, act_.act8.ptr, act_.act8_scale.as<float>(), W.data, W.scale, y,
                                         m_pad, W.n, k_pad, stream_, pinned);
            return gemms_.dense.run_fp8(act_.act8.ptr, act_.act8_scale.as<float>(), W.data, W.scale, y, m_pad, W.n,
                                        k_pad, stream_, pinned);
        }
        case DLLM__W_Q4: return gemm_q4(W, x, y, M, rows == DLLM__ROWS_BATCH ? DLLM__ROWS_INDEPENDENT : rows, out);
    }
    return dllm__fail(DLLM_ERR_INTERNAL, "weight format %d has no GEMM", (int)W.format);
}

/* [FP8] [batch] gemm() for an E4M3 weight under DLLM__ROWS_BATCH: y [M x W.n] (bf16) = x . W^T for M rows of any count
 * (a batched forward's thousands). The pinned FP8 GEMM takes at most dllm__gemm::pin_m rows a launch (cuBLASLt's
 * algorithm is chosen at that count; fp8_gemm's one-tile launch takes any count), so the rows run in the launches of
 * dllm__fp8_row_chunks over one quantisation of them all (x's rows quantised here, or made by the producer, x null).
 * A launch reads its codes at their offset (rows of k_pad codes), but the scales are laid out [k_pad / 128][M_pad]
 * (their leading dimension the row count), so each launch's columns are first gathered into act_.act8_chunk_scale,
 * laid out for its own row count. A row's bits never depend on its launch or on the batch's row count:
 *   - its codes and scales come from the row-wise quantisers (quantize_rows_e4m3, add_rmsnorm_e4m3, swiglu_e4m3: each
 *     1x128 group's scale from that group's amax alone), copied unchanged;
 *   - every launch runs the pinned algorithm (run_fp8 pinned: one algorithm per (N, K) chosen at pin_m rows; fp8_gemm:
 *     the wide tile whatever the rows), on a 16-row multiple starting on a 16-row boundary (padding as the solo
 *     path's chunks have), and computes each output row from its own row of codes and scales only.
 * The solo paths (TUNED, INDEPENDENT) do not come here. */
dllm_status dllm__gpu_backend::gemm_fp8_batch(const dllm__weight_view &W, const void *x, void *y, int M) {
    if (x) DLLM__TRY(quantize_rows_e4m3(x, M, W.k));
    const int m_pad = act8_rows(M), k_pad = dllm__round_up(W.k, 128), groups = k_pad / 128;
    const bool mma = gemms_.fp8 == DLLM__FP8_MMA;  // fp8_gemm: all rows in one launch
    const unsigned char *codes = act_.act8.as<unsigned char>();
    const float *scales = act_.act8_scale.as<float>();
    for (const dllm__row_chunk &ch : dllm__fp8_row_chunks(M, mma ? std::max(m_pad, 16) : dllm__gemm::pin_m)) {
        const float *s = scales;
        if (ch.rows != m_pad) {  // this launch's scale columns, laid out [groups][ch.rows]
            if (act_.act8_chunk_scale.bytes < (size_t)groups * ch.rows * 4)
                return dllm__fail(DLLM_ERR_INTERNAL,
                                  "gemm_fp8_batch: %d rows of %d scale groups do not fit the chunk scales", ch.rows,
                                  groups);
            DLLM__CUDA(cudaMemcpy2DAsync(act_.act8_chunk_scale.ptr, (size_t)ch.rows * 4, scales + ch.m0,
                                         (size_t)m_pad * 4, (size_t)ch.rows * 4, groups, cudaMemcpyDeviceToDevice,
                                         stream_));
            s = act_.act8_chunk_scale.as<float>();
        }
        const unsigned char *X = codes + (size_t)ch.m0 * k_pad;
        void *Y = (char *)y + (size_t)ch.m0 * W.n * 2;
        if (mma)
            DLLM__TRY(dllm__fp8_mma_run(gemms_.fp8_mma, X, s, W.data, W.scale, Y, ch.rows, W.n, k_pad, stream_, true));
        else
            DLLM__TRY(gemms_.dense.run_fp8(X, s, W.data, W.scale, Y, ch.rows, W.n, k_pad, stream_, true));
    }
    return DLLM_OK;
}

/* [INT8 GEMM] Whether gemm_q4 runs W's M rows on the INT8 path: integer C values on both sides (SoloQ-I, SoloQ-C,
 * RTN-W4A4; not NVFP4, not unquantised activations), more rows than q4_gemm takes, and, where the rows must stay
 * independent (pinned), only where every path's sums are exact (dllm__q4_int_sum_exact_in_fp32: SoloQ-I and RTN at
 * every LLaDA / Dream width), since then the INT8 path gives q4_gemm's bits. A documented rule, not a timing: at more
 * than 64 rows the INT8 path reads the same 4-bit weights, writes int8 rows where the BF16 path writes bf16 ones (half
 * the bytes) and runs at twice the tensor-core rate (dllm-bench --int8-gemm-only measures both paths). */
bool dllm__gpu_backend::q4_int8(const dllm__weight_view &W, int M, bool pinned) const {
    if (W.q4->packed) return W.q4->format != DLLM__Q4_NVFP4;  // q4wg_gemm takes the int8 C values at every M
    const dllm__q4_format fa = lowbit_.options.acts, fw = W.q4->format;
    if (!lowbit_.int8_path || !lowbit_.options.quantize_acts || !dllm__q4_int_max(fa) || !dllm__q4_int_max(fw) ||
        M <= dllm__q4_max_rows || W.k % 4 || W.n % 4)
        return false;
    return !pinned || dllm__q4_int_sum_exact_in_fp32(fa, fw, W.k);
}

/* [SoloQ] y = x W^T for a DLLM__W_Q4 weight: x's rows rotated by the weight's R and quantised per token into act_.q4a
 * (their C values, exact in bf16) or, for the INT8 path, act_.q4a8 (int8), and act_.q4a_scale (x null: a fused producer
 * did); then
 *   - [INT8 GEMM] where q4_int8 says so: per chunk of weight rows their C values unpacked into int8 act_.q4w,
 *   cuBLASLt's
 *     INT8 GEMM into int32 act_.q4acc (exact) and the epilogue ((float)acc s_x) s_w into y;
 *   - at most dllm__q4_max_rows rows, or rows that must stay INDEPENDENT (in launches of that many): [W4 GEMM] q4_gemm,
 *     which reads the 4-bit rows and dequantises them in registers (its split-K depends on the shape only);
 *   - more rows: per chunk of weight rows their C values dequantised into act_.q4w, a BF16 GEMM into fp32 act_.q4acc
 *   and
 *     the epilogue (acc s_x) s_w into y.
 *   - [W4 GEMM] weights in q4wg's layout (sm_90a, SoloQ-I and RTN-W4A4 layer linears): q4wg_gemm at every M, on the
 *     int8 C values; its sums are exact integers, so it gives the INT8 path's and q4_gemm's bits. SoloQ-N's layer
 *     linears: q4wg_gemm_nv at every M on the bf16 C values, its fp32 sums in an order fixed by the weight's shape.
 * Every stage works row by row, so a row's result never depends on the other rows of its launch. */
dllm_status dllm__gpu_backend::gemm_q4(const dllm__weight_view &W, const void *x, void *y, int M, dllm__rows rows,
                                       cudaDataType_t out) {
    const dllm__q4_site &q = *W.q4;
    const bool quantize = lowbit_.options.quantize_acts, pinned = rows == DLLM__ROWS_INDEPENDENT;
    const bool int8 = q4_int8(W, M, pinned);
    if (x) {
        DLLM__TRY(dllm__soloq_quantize_rows(lowbit_.kernels, *q.rot, lowbit_.options.acts, quantize,
                                            lowbit_.options.bias_correction, x, (u64)W.k, M, W.k, nullptr, nullptr,
                                            act_.q4a_scale.ptr, int8 ? nullptr : act_.q4a.ptr, stream_,
                                            int8 ? act_.q4a8.ptr : nullptr));
    } else if (!(lowbit_.act_forms &
                 (int8 ? 2 : 1))) {  // a fused producer made the input: in the form this path reads?
        return dllm__fail(DLLM_ERR_INTERNAL, "gemm_q4: the producer of this %d-row input did not write the %s C values",
                          M, int8 ? "int8" : "bf16");
    }
    if (W.q4->packed) {  // a layer linear: its output is bf16
        if (out != CUDA_R_16BF) return dllm__fail(DLLM_ERR_INTERNAL, "gemm_q4: q4wg writes bf16 outputs only");
        if (q.format == DLLM__Q4_NVFP4)
            return dllm__q4wg_gemm_nv_run(*lowbit_.q4wg, W.data, W.scale, (const bf16_t *)act_.q4a.ptr,
                                          act_.q4a_scale.as<float>(), (bf16_t *)y, M, W.n, W.k, act_.q4wg_ws.as<int>(),
                                          act_.q4wg_ws.bytes / 4, stream_);
        return dllm__q4wg_gemm_run(*lowbit_.q4wg, q.format, W.data, W.scale, (const signed char *)act_.q4a8.ptr,
                                   act_.q4a_scale.as<float>(), (bf16_t *)y, M, W.n, W.k, act_.q4wg_ws.as<int>(),
                                   act_.q4wg_ws.bytes / 4, stream_);
    }
    if (int8) return gemm_q4_int8(W, y, M, out);
    const int scale_bytes = (W.k + 15) / 16;
    const size_t out_bytes = out == CUDA_R_32F ? 4 : 2;
    const float *s_x = quantize ? act_.q4a_scale.as<float>() : nullptr;
    if (M <= dllm__q4_max_rows || pinned) {
        for (int m0 = 0; m0 < M; m0 += dllm__q4_max_rows) {
            const int mc = std::min(dllm__q4_max_rows, M - m0);
            DLLM__TRY(dllm__q4_gemm_run(lowbit_.q4_gemm, q.format, W.data, q.block_scales.ptr, W.scale,
                                        (const bf16_t *)act_.q4a.ptr + (size_t)m0 * W.k, W.k, s_x ? s_x + m0 : nullptr,
                                        (char *)y + (size_t)m0 * W.n * out_bytes, W.n, 0, out, mc, W.n, W.k,
                                        act_.q4acc.as<float>(), act_.q4acc.bytes / 4, stream_));
        }
        return DLLM_OK;
    }
    const int chunk = dllm__q4_chunk_rows(W.n, W.k);
    for (int n0 = 0; n0 < W.n; n0 += chunk) {
        const int nc = std::min(chunk, W.n - n0);
        const unsigned char *codes = (const unsigned char *)W.data + (size_t)n0 * (W.k / 2);
        const unsigned char *bs =
            q.block_scales.ptr ? (const unsigned char *)q.block_scales.ptr + (size_t)n0 * scale_bytes : nullptr;
        DLLM__TRY(lowbit_.kernels.soloq_dequantize_rows.launch(
            {dim3((unsigned)(W.k / 8 + 127) / 128, (unsigned)nc), dim3(128)}, stream_, codes, bs, (int)q.format, nc,
            W.k, act_.q4w.ptr));
        const dllm__gemm_op op{act_.q4a.ptr, act_.q4w.ptr, act_.q4acc.ptr, M, nc, W.k, CUDA_R_32F, nullptr, nullptr};
        DLLM__TRY(pinned ? gemms_.dense.run_pinned(op, stream_) : gemms_.dense.run(op, stream_));
        DLLM__TRY(lowbit_.kernels.soloq_scale_rows.launch(
            {dim3((unsigned)(nc + 255) / 256, (unsigned)M), dim3(256)}, stream_, act_.q4acc.ptr, M, nc, s_x,
            W.scale + n0, (char *)y + (size_t)n0 * out_bytes, out == CUDA_R_32F ? 1 : 0, (u64)W.n));
    }
    return DLLM_OK;
}

/* [INT8 GEMM] gemm_q4's INT8 path on the int8 input act_.q4a8 (M rows) and its token scales
 * (chunks: dllm__q4_int8_chunk_rows). */
dllm_status dllm__gpu_backend::gemm_q4_int8(const dllm__weight_view &W, void *y, int M, cudaDataType_t out) {
    lowbit_.int8_launches++;
    return dllm__q4_int8_gemm_run(lowbit_.kernels, gemms_.dense, W.q4->format, W.data, W.scale, act_.q4a8.ptr,
                                  act_.q4a_scale.as<float>(), y, W.n, out, M, W.n, W.k,
                                  dllm__q4_int8_chunk_rows(W.n, W.k), act_.q4w.ptr, act_.q4acc.as<int>(), stream_);
}

/* [SoloQ fused producers] The arguments of a producer of M rows for W's GEMM: the C values in the forms gemm_q4 will
 * read (q4_int8 for the launch's rows, which the producer does not know: bf16 unless even pinned rows take the INT8
 * path, int8 where the INT8 path may run), recorded in lowbit_.act_forms for gemm_q4 to check. */
soloq_args dllm__gpu_backend::soloq_producer_args(const dllm__weight_view &W, int M) {
    const bool bf16 = !q4_int8(W, M, true), int8 = q4_int8(W, M, false);
    lowbit_.act_forms = (bf16 ? 1 : 0) | (int8 ? 2 : 0);
    soloq_args a =
        dllm__soloq_args(*W.q4->rot, lowbit_.options.acts, lowbit_.options.quantize_acts,
                         lowbit_.options.bias_correction, M, W.k, act_.q4a_scale.ptr, bf16 ? act_.q4a.ptr : nullptr);
    a.values_i8 = int8 ? (signed char *)act_.q4a8.ptr : nullptr;
    return a;
}

/* [SoloQ fused producers] add_rmsnorm of M contiguous rows (h_in (+ delta) -> h_out, normed by w) rotated and quantised
 * for W's GEMM into act_.q4a: one kernel instead of a norm, a quantiser and the bf16 row between them. */
dllm_status dllm__gpu_backend::soloq_add_rmsnorm(const dllm__weight_view &W, const float *h_in, float *h_out,
                                                 const void *delta, const void *w, int M) {
    soloq_args a = soloq_producer_args(W, M);
    a.producer = 1, a.h_in = h_in, a.h_out = h_out, a.delta = (const bf16_t *)delta, a.norm_w = (const float *)w,
    a.eps = model_.cfg.norm_eps;
    return dllm__soloq_launch(lowbit_.kernels, a, dllm__norm_threads(a.d / 8), stream_);
}

/* [SoloQ fused producers] SwiGLU of M [gate | up] rows rotated and quantised for W's (down) GEMM into act_.q4a. */
dllm_status dllm__gpu_backend::soloq_swiglu(const dllm__weight_view &W, const void *gu, int M) {
    soloq_args a = soloq_producer_args(W, M);
    a.producer = 2, a.x = gu, a.x_stride = (u64)2 * W.k;
    return dllm__soloq_launch(lowbit_.kernels, a, 1024, stream_);
}

/* Attention of q_rows query rows (fused projection rows at q, batch entries q_bstride elements apart) over the seq key
 * rows of keys_qkv; the KV tiles that overlap the current block (read from the device step state) are visited last,
 * except under a K/V cache, where the tiles go in plain order, split as a batched forward splits them (for split_rows
 * query rows, the forward's: the last layer may query fewer) and on flash_attn, so that a sequence's attention is the
 * batched forward's (self_attention_varlen_kv). */
dllm_status dllm__gpu_backend::attention(int batch, int seq, int q_rows, const void *q, size_t q_bstride,
                                         const void *keys_qkv, void *out, int fa_mode, bool may_split, bool wide,
                                         int split_rows) {
    const bool solo_kv = solo_kv_ != DLLM__ROWS_TUNED;
    const dllm__config &c = model_.cfg;
    const int hd = c.head_dim, stride = (c.n_head + 2 * c.n_head_kv) * hd;
    attn_args a = {};
    a.q = (const bf16_t *)q;
    a.k = (const bf16_t *)keys_qkv + (size_t)c.n_head * hd;
    a.v = (const bf16_t *)keys_qkv + (size_t)(c.n_head + c.n_head_kv) * hd;
    a.o = (bf16_t *)out;
    a.seq = seq, a.q_rows = q_rows;
    a.q_stride = stride, a.kv_stride = stride, a.o_stride = c.n_head * hd, a.group = c.n_head / c.n_head_kv;
    a.q_bstride = q_bstride, a.o_bstride = (u64)q_rows * c.n_head * hd;
    a.st = solo_kv ? nullptr : act_.state.as<dllm_step_state>();
    a.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    a.fa_mode = fa_mode, a.fa_state = act_.fa_state.as<float>();
    // Under a K/V cache each sequence (CFG's two among them) splits as it would alone (fit_buffers sizes the states).
    const int heads = solo_kv ? c.n_head : c.n_head * batch;
    const bool split = may_split && (!solo_kv || hd <= dllm__attn_varlen_split_max_hd);
    a.kv_splits = split ? dllm__attn_kv_splits(arch_, split_rows ? split_rows : q_rows, seq, heads, n_sms_) : 1;
    a.partial = act_.attn_partial.as<float>();
    return dllm__attn_launch(kernels_.attention, arch_, hd, c.n_head, batch, a, stream_, wide && !solo_kv);
}

/* Self-attention of layer `layer` for the rows held in act_.a (r.rows() per sequence, canvas rows [r.q0, r.q1)): fused
 * QKV GEMM, bias + RoPE, attention into act_.att for the queries of rows [o0, o0 + orows) of those (the last layer may
 * need fewer: forward). Without a K/V cache the rows are the whole canvas; with one their Q/K/V overwrite their slots
 * in the layer's cache and attention reads every cached key. A query row's attention does not depend on which other
 * rows are queried. Layer 0's GEMM is row-independent: LaCache may compute its rows apart. */
dllm_status dllm__gpu_backend::self_attention(size_t layer, int batch, const dllm__seq_rows &r, int o0, int orows) {
    const dllm__config &c = model_.cfg;
    const int d = c.n_embd, qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim, rows = r.rows(), seq = r.seq;
    const dllm__gpu_layer &L = weights_->layers[layer];
    const dllm__rows gemm_rows = layer == 0 ? lacache_rows() : solo_kv_;
    auto stage = [&](const char *name) {  // layer 0's stages are named apart: the LaCache benchmark compares them
        if (debug_.timer) mark((layer == 0 ? std::string("L0 ") + name : std::string(name)).c_str());
    };
    if (!kv_on_) {
        DLLM__TRY(gemm(L.qkv.view(), produced_attn_input(layer) ? nullptr : act_.a.ptr, act_.qkv.ptr, batch * rows,
                       gemm_rows));
        stage("gemm qkv");
        DLLM__TRY(rope_qkv(act_.qkv.ptr, L.b_qkv.ptr, batch * rows, rows, 0));
        stage("rope");
        DLLM__TRY(attention(batch, rows, orows, (const char *)act_.qkv.ptr + (size_t)o0 * qkv * 2, (size_t)rows * qkv,
                            act_.qkv.ptr, act_.att.ptr, 0, false, layer > 0));
        stage("attention");
        return DLLM_OK;
    }
    char *cache = (char *)act_.kv[layer].ptr, *first = cache + (size_t)r.q0 * qkv * 2;
    if (produced_attn_input(
            layer)) {  // the input is all batch entries' rows (an FP8 GEMM's whole 16-row tiles): project into
                       // scratch, then copy the rows in
        DLLM__TRY(gemm(L.qkv.view(), nullptr, act_.qkv.ptr, batch * rows, gemm_rows));
        for (int b = 0; b < batch; b++)
            DLLM__CUDA(cudaMemcpyAsync(first + (size_t)b * seq * qkv * 2,
                                       (const char *)act_.qkv.ptr + (size_t)b * rows * qkv * 2, (size_t)rows * qkv * 2,
                                       cudaMemcpyDeviceToDevice, stream_));
    } else {
        for (int b = 0; b < batch; b++)
            DLLM__TRY(gemm(L.qkv.view(), (const char *)act_.a.ptr + (size_t)b * rows * d * 2,
                           first + (size_t)b * seq * qkv * 2, rows, gemm_rows));
    }
    stage("gemm qkv");
    for (int b = 0; b < batch; b++)
        DLLM__TRY(rope_qkv(first + (size_t)b * seq * qkv * 2, L.b_qkv.ptr, rows, rows, r.q0));
    stage("rope");
    DLLM__TRY(attention(batch, seq, orows, first + (size_t)o0 * qkv * 2, (size_t)seq * qkv, cache, act_.att.ptr, 0,
                        true, layer > 0, rows));
    stage("attention");
    return DLLM_OK;
}

/* [FP8 fused norm+quantise] Residual add + RMSNorm over n_rows rows from row0 of each sequence (h_in -> h_out, see the
 * kernel add_rmsnorm). */
dllm_status dllm__gpu_backend::add_rmsnorm(const float *h_in, float *h_out, const void *delta, const void *w, void *y,
                                           int batch, int seq, int row0, int n_rows) {
    const dllm__config &c = model_.cfg;
    const unsigned threads = dllm__norm_threads(c.n_embd / 8);
    return kernels_.rowwise.add_rmsnorm.launch({dim3((unsigned)n_rows, (unsigned)batch), dim3(threads)}, stream_, h_in,
                                               h_out, delta, w, c.norm_eps, y, c.n_embd, n_rows, row0, seq);
}

/* add_rmsnorm over every row (row0 = 0, n_rows = seq), writing E4M3 codes and scales to act_.act8 instead of y. */
dllm_status dllm__gpu_backend::add_rmsnorm_e4m3(const float *h_in, float *h_out, const void *delta, const void *w,
                                                int batch, int seq) {
    const dllm__config &c = model_.cfg;
    const unsigned threads = dllm__norm_threads(dllm__round_up(c.n_embd, 128) / 8);
    return kernels_.rowwise.add_rmsnorm_e4m3.launch({dim3((unsigned)seq, (unsigned)batch), dim3(threads)}, stream_,
                                                    h_in, h_out, delta, w, c.norm_eps, act_.act8.ptr,
                                                    act_.act8_scale.ptr, act8_rows(batch * seq), c.n_embd, seq, 0, seq);
}

/* act_.act8 = E4M3 of the bf16 rows x [M x K] in 1x128 groups. */
dllm_status dllm__gpu_backend::quantize_rows_e4m3(const void *x, int M, int K) {
    return kernels_.rowwise.quantize_rows_e4m3.launch({dllm__e4m3_rows_grid(M, K), dim3(128)}, stream_, x, 0, K, M,
                                                      act_.act8.ptr, act_.act8_scale.ptr, act8_rows(M), 0.0f);
}

/* [EmbedCache] h[0..n_rows) = embedding rows of ids[0..n_rows), in fp32. */
dllm_status dllm__gpu_backend::embed_gather(const int *ids, int n_rows, float *h) {
    return kernels_.rowwise.embed_gather.launch({dim3((unsigned)n_rows), dim3(256)}, stream_, ids, n_rows,
                                                weights_->embed.ptr, model_.cfg.n_embd, h);
}

/* h rows [0, batch * rows) = embeddings of the canvas rows [q0, q0 + rows) of each batch entry. */
dllm_status dllm__gpu_backend::embed_gather_rows(const int *ids, int batch, int seq, int q0, int rows, float *h) {
    if (rows == seq) return embed_gather(ids, batch * seq, h);
    for (int b = 0; b < batch; b++)
        DLLM__TRY(embed_gather(ids + (size_t)b * seq + q0, rows, h + (size_t)b * rows * model_.cfg.n_embd));
    return DLLM_OK;
}

/* [RoPECache] Bias + RoPE on rows [0, n_rows) of qkv whose positions are pos0 + (row % seq_len)
 * ([DPad]: positions[...]). */
dllm_status dllm__gpu_backend::rope_qkv(void *qkv, const void *bias, int n_rows, int seq_len, int pos0) {
    const dllm__config &c = model_.cfg;
    const int per_row = (c.n_head + (bias ? 2 : 1) * c.n_head_kv) * (c.head_dim / 8);
    const void *positions = positions_on_ ? act_.positions.ptr : nullptr;
    return kernels_.rowwise.rope_qkv.launch({dllm__rows_grid(n_rows, per_row, 256), dim3(256)}, stream_, qkv, n_rows,
                                            seq_len, pos0, positions, c.n_head, c.n_head_kv, c.head_dim, bias,
                                            rope_cos_.ptr, rope_sin_.ptr);
}

/* Layer 0 up to its attention output (act_.att) with LaCache's [EmbedCache], [RoPECache] and [FACache] (lacache.md 1):
 *   FILL (a block's first step): every row, keeping embeddings (h0), rotated Q/K/V (qkv0) and the attention state of
 *         the query tiles outside the block (fa_state);
 *   REUSE (the block's later steps): embed, norm, project and rotate the block's rows only, and resume the attention of
 *         the outside query tiles from their saved state.
 * The QKV GEMM is row-independent (no K/V cache here), so the rows REUSE computes alone carry the same bits as when the
 * plain path (self_attention) computes them among all rows. */
dllm_status dllm__gpu_backend::layer0_attention(const dllm__forward_plan &plan, const int *ids) {
    const dllm__config &c = model_.cfg;
    const dllm__seq_rows &r = plan.rows();
    const int batch = plan.batch(), seq = r.seq, qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim, d = c.n_embd,
              M = batch * seq;
    const dllm__gpu_layer &L = weights_->layers[0];
    float *h = act_.h0.as<float>();
    if (plan.layer0 == DLLM__L0_FILL) {
        DLLM__TRY(embed_gather(ids, M, h));
        DLLM__TRY(add_rmsnorm(h, nullptr, nullptr, L.attn_norm.ptr, act_.a.ptr, batch, seq, 0, seq));
        mark("L0 embed+norm");
        DLLM__TRY(gemm(L.qkv.view(), act_.a.ptr, act_.qkv0.ptr, M, lacache_rows()));
        mark("L0 gemm qkv");
        DLLM__TRY(rope_qkv(act_.qkv0.ptr, L.b_qkv.ptr, M, seq, 0));
        mark("L0 rope");
    } else {
        const int b0 = r.block0, blk = r.block1 - r.block0;
        for (int b = 0; b < batch; b++)
            DLLM__TRY(embed_gather(ids + (size_t)b * seq + b0, blk, h + ((size_t)b * seq + b0) * d));
        DLLM__TRY(add_rmsnorm(h, nullptr, nullptr, L.attn_norm.ptr, act_.a.ptr, batch, seq, b0, blk));
        mark("L0 embed+norm");
        for (int b = 0; b < batch; b++) {
            char *out = (char *)act_.qkv0.ptr + ((size_t)b * seq + b0) * qkv * 2;
            DLLM__TRY(gemm(L.qkv.view(), (const char *)act_.a.ptr + (size_t)b * blk * d * 2, out, blk, lacache_rows()));
        }
        mark("L0 gemm qkv");
        for (int b = 0; b < batch; b++)
            DLLM__TRY(rope_qkv((char *)act_.qkv0.ptr + ((size_t)b * seq + b0) * qkv * 2, L.b_qkv.ptr, blk, blk, b0));
        mark("L0 rope");
    }
    DLLM__TRY(attention(batch, seq, seq, act_.qkv0.ptr, (size_t)seq * qkv, act_.qkv0.ptr, act_.att.ptr,
                        plan.layer0 == DLLM__L0_FILL ? 1 : 2));
    mark("L0 attention");
    return DLLM_OK;
}

/* One forward over the plan's sequences (canvas ids_dev [batch][seq]), up to the final norm of the output rows
 * (act_.y). */
dllm_status dllm__gpu_backend::forward(const dllm__forward_plan &plan, const int *ids_dev) {
    if (moe_model())  // [MoE] LLaDA2 runs the block-diffusion forward only (bd_layers)
        return dllm__fail(DLLM_ERR_INTERNAL, "LLaDA2 on the GPU backend runs through the block-diffusion forward only");
    if (!plan.uniform())
        return dllm__fail(DLLM_ERR_INTERNAL,
                          "a forward over sequences with different rows (batching is not built yet)");
    const dllm__seq_rows &r = plan.rows();
    const int batch = plan.batch(), rows = r.rows(), out_rows = r.out_rows();
    solo_kv_ = !kv_on_ ? DLLM__ROWS_TUNED : rows < r.seq ? DLLM__ROWS_STEP : DLLM__ROWS_FILL;
    float *h = act_.h.as<float>();
    mark("start");
    if (plan.layer0 == DLLM__L0_PLAIN) {
        DLLM__TRY(embed_gather_rows(ids_dev, batch, r.seq, r.q0, rows, h));
        DLLM__TRY(
            add_rmsnorm(h, nullptr, nullptr, weights_->layers[0].attn_norm.ptr, act_.a.ptr, batch, rows, 0, rows));
        mark("L0 embed+norm");
    } else {
        DLLM__TRY(layer0_attention(plan, ids_dev));
    }
    const float *h_in = plan.layer0 == DLLM__L0_PLAIN ? h : act_.h0.as<float>();  // layer 0's residual input
    const size_t n_layers = weights_->layers.size();
    for (size_t l = 0; l < n_layers; l++) {
        // [truncation] Output truncation reaches into the last layer: after its attention only the output rows
        // [out0, out1) matter, so it computes those alone when they are fewer (queries, O, FFN, final norm), its GEMMs
        // row-independent.
        const bool cut =
            last_cut(l) && out_rows < rows && (size_t)batch * out_rows * model_.cfg.n_embd * 4 <= act_.h_cut.bytes;
        const int o0 = cut ? r.out0 - r.q0 : 0, orows = cut ? out_rows : rows;
        if (l > 0 || plan.layer0 == DLLM__L0_PLAIN) DLLM__TRY(self_attention(l, batch, r, o0, orows));
        float *h_out = cut ? act_.h_cut.as<float>() : h;  // the cut rows' residual stream goes on in h_cut
        DLLM__TRY(output_and_ffn(l, batch, rows, o0, orows, l == 0 ? h_in : h, h_out));
        const bool last = l + 1 == n_layers;
        if (last) debug_.last_layer_rows = orows;
        // The last layer's residual is only needed for the output rows (LaCache truncates them).
        if (last)
            DLLM__TRY(add_rmsnorm(h_out, h_out, act_.delta.ptr, weights_->final_norm.ptr, act_.y.ptr, batch, orows,
                                  cut ? 0 : r.out0 - r.q0, out_rows));
        else
            DLLM__TRY(next_layer_input(l, h, batch, rows, true));
        mark("add+norm");
    }
    return DLLM_OK;
}

/* The next-layer producer chain, the one copy of every forward (plain, block diffusion, varlen): layer l's output
 * (act_.delta) added into the residual h ([batch][rows], in place) and normed by layer l + 1's attention norm into the
 * form its QKV GEMM reads: E4M3 rows for FP8 attention projections (act_.act8), with soloq_producer [SoloQ]'s fused
 * producer for DLLM__W_Q4 layers (act_.q4a; produced_attn_input), else bf16 rows in act_.a. FP8 and SoloQ never meet
 * (choose_precision leaves FP8 off under SoloQ), so the order of the first two tests is immaterial. */
dllm_status dllm__gpu_backend::next_layer_input(size_t l, float *h, int batch, int rows, bool soloq_producer) {
    const dllm__gpu_layer &next = weights_->layers[l + 1];
    if (fp8_attn(l + 1)) return add_rmsnorm_e4m3(h, h, act_.delta.ptr, next.attn_norm.ptr, batch, rows);
    if (soloq_producer && q4(l + 1))
        return soloq_add_rmsnorm(next.qkv.view(), h, h, act_.delta.ptr, next.attn_norm.ptr, batch * rows);
    return add_rmsnorm(h, h, act_.delta.ptr, next.attn_norm.ptr, act_.a.ptr, batch, rows, 0, rows);
}

/* Layer l from its attention output on (O projection, residual add + RMSNorm, FFN) for the query rows [o0, o0 + orows)
 * of each batch entry's `rows`: residual rows read from h_res (laid out [batch][rows]) and written to h_out
 * ([batch][orows]; in place when all rows are computed), act_.att and act_.delta compact [batch][orows]. Rows LaCache
 * computes apart (the last layer without a K/V cache) take row-independent GEMMs in chunks of at most pin_m rows; the
 * FP8 quantisers must see the same chunks as their GEMMs, so the chunks are cut here. */
dllm_status dllm__gpu_backend::output_and_ffn(size_t l, int batch, int rows, int o0, int orows, const float *h_res,
                                              float *h_out) {
    const int d = model_.cfg.n_embd;
    const bool whole = orows == rows;  // then one run over the batch's rows end to end
    const int segments = whole ? 1 : batch, seg_rows = whole ? batch * rows : orows;
    const int chunk = layer_rows(l) == DLLM__ROWS_INDEPENDENT ? dllm__gemm::pin_m : seg_rows;
    for (int b = 0; b < segments; b++)
        for (int c0 = 0; c0 < seg_rows; c0 += chunk) {
            const int m = std::min(chunk, seg_rows - c0), r0 = b * seg_rows + c0;
            DLLM__TRY(project_o(l, m, r0));
            mark("gemm o");
            DLLM__TRY(ffn(l, m, h_res + ((size_t)b * rows + o0 + c0) * d, h_out + (size_t)r0 * d, r0));
        }
    return DLLM_OK;
}

/* The attention output projection of layer l for rows [r0, r0 + M) of act_.att into those of act_.delta (under FP8 the
 * GEMM entry point quantises the attention output first). */
dllm_status dllm__gpu_backend::project_o(size_t l, int M, int r0) {
    const dllm__config &c = model_.cfg;
    const char *x = (const char *)act_.att.ptr + (size_t)r0 * c.n_head * c.head_dim * 2;
    char *y = (char *)act_.delta.ptr + (size_t)r0 * c.n_embd * 2;
    return gemm(weights_->layers[l].o.view(), x, y, M, layer_rows(l));
}

/* Layer l's post-attention residual add + RMSNorm and its FFN (gate|up GEMM, SwiGLU, down GEMM into act_.delta) for the
 * rows [r0, r0 + M) of act_.delta (the attention output projection in, the FFN output out). h_in: their M residual rows
 * before the attention output is added; the sum goes to h_out (which may be h_in). Under [FP8] (layers >= 1) the two
 * GEMM inputs are quantised by the kernels that produce them: add+norm+quantise and SwiGLU+quantise. */
dllm_status dllm__gpu_backend::ffn(size_t l, int M, const float *h_in, float *h_out, int r0) {
    const dllm__config &c = model_.cfg;
    const dllm__gpu_layer &L = weights_->layers[l];
    const int ff = c.n_ff;
    char *delta = (char *)act_.delta.ptr + (size_t)r0 * c.n_embd * 2;
    const dllm__rows rows = layer_rows(l);
    if (moe_layer(l)) return moe_ffn(l, M, h_in, h_out, r0);  // [MoE] LLaDA2 (gpu/moe.cpp)
    if (fp8_ffn(l)) {
        DLLM__TRY(add_rmsnorm_e4m3(h_in, h_out, delta, L.ffn_norm.ptr, 1, M));
        mark("add+norm");
        DLLM__TRY(gemm(L.gu.view(), nullptr, act_.gu.ptr, M, rows));
        mark("gemm gate+up");
        DLLM__TRY(kernels_.rowwise.swiglu_e4m3.launch({dllm__e4m3_rows_grid(M, ff), dim3(128)}, stream_, act_.gu.ptr,
                                                      ff, M, act_.act8.ptr, act_.act8_scale.ptr, act8_rows(M)));
        mark("swiglu");
        DLLM__TRY(gemm(L.down.view(), nullptr, delta, M, rows));
        mark("gemm down");
        return DLLM_OK;
    }
    if (q4(l)) {  // [SoloQ fused producers]: each GEMM input made, rotated and quantised by one kernel
        DLLM__TRY(soloq_add_rmsnorm(L.gu.view(), h_in, h_out, delta, L.ffn_norm.ptr, M));
        mark("add+norm");
        DLLM__TRY(gemm(L.gu.view(), nullptr, act_.gu.ptr, M, rows));
        mark("gemm gate+up");
        DLLM__TRY(soloq_swiglu(L.down.view(), act_.gu.ptr, M));
        mark("swiglu");
        DLLM__TRY(gemm(L.down.view(), nullptr, delta, M, rows));
        mark("gemm down");
        return DLLM_OK;
    }
    DLLM__TRY(add_rmsnorm(h_in, h_out, delta, L.ffn_norm.ptr, act_.a.ptr, 1, M, 0, M));
    mark("add+norm");
    DLLM__TRY(gemm(L.gu.view(), act_.a.ptr, act_.gu.ptr, M, rows));
    mark("gemm gate+up");
    DLLM__TRY(kernels_.rowwise.swiglu.launch({dllm__rows_grid(M, ff / 8, 256), dim3(256)}, stream_, act_.gu.ptr,
                                             act_.f.ptr, M, ff));
    mark("swiglu");
    DLLM__TRY(gemm(L.down.view(), act_.f.ptr, delta, M, rows));
    mark("gemm down");
    return DLLM_OK;
}

/* LM head for output rows [c0, c0 + rows) of the raw_rows of each batch entry into act_.logits [batch][rows][V]. */
dllm_status dllm__gpu_backend::lm_head(int batch, int raw_rows, int c0, int rows) {
    const dllm__config &c = model_.cfg;
    for (int b = 0; b < batch; b++) {
        const char *y = (const char *)act_.y.ptr + ((size_t)b * raw_rows + c0) * c.n_embd * 2;
        char *out = (char *)act_.logits.ptr + (size_t)b * rows * c.n_vocab * 4;
        DLLM__TRY(gemm(weights_->lm_head(c), y, out, rows, lacache_rows(), CUDA_R_32F));
    }
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::prepare_forward(const int32_t *ids, int n, int raw_rows) {
    kv_on_ = positions_on_ = false;
    solo_kv_ = DLLM__ROWS_TUNED;
    DLLM__TRY(fit_buffers(1, n, std::min(raw_rows, dllm__lm_chunk_rows)));
    DLLM__CUDA(cudaMemcpyAsync(act_.canvas.ptr, ids, (size_t)n * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemsetAsync(act_.state.ptr, 0, sizeof(dllm_step_state),
                               stream_));  // no block: attention visits tiles in plain order
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::logits(const int32_t *ids, int n, int r0, int r1, float *out) {
    const dllm__config &c = model_.cfg;
    if (dllm__is_block_diffusion(c) || moe_model()) return bd_logits(ids, n, r0, r1, out);  // LLaDA2: block-causal
    const int raw0 = dllm__logit_row(c, r0), raw1 = dllm__logit_row(c, r1 - 1) + 1;
    DLLM__TRY(prepare_forward(ids, n, raw1 - raw0));
    std::vector<float> raw((size_t)(raw1 - raw0) * c.n_vocab);
    DLLM__TRY(forward_logits(n, raw0, raw1, [&](int c0, int rows) -> dllm_status {
        DLLM__CUDA(cudaMemcpyAsync(raw.data() + (size_t)c0 * c.n_vocab, act_.logits.ptr, (size_t)rows * c.n_vocab * 4,
                                   cudaMemcpyDeviceToHost, stream_));
        return DLLM_OK;
    }));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    for (int p = r0; p < r1; p++)
        memcpy(out + (size_t)(p - r0) * c.n_vocab, raw.data() + (size_t)(dllm__logit_row(c, p) - raw0) * c.n_vocab,
               sizeof(float) * c.n_vocab);
    return DLLM_OK;
}
