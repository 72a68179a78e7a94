/* src/gpu/quantize.cpp - weights quantised on the device (FP8, SoloQ) and the weight set of a context. */

/* [FP8] A BF16 weight into DLLM__W_E4M3_BLOCK, on the device; the bf16 copy is released. Twin:
 * dllm__quantize_blocks. */
static dllm_status dllm__quantize_linear_e4m3(dllm__linear &W, const dllm__rowwise_kernels &k, cudaStream_t stream) {
    if (!W.data.ptr) return DLLM_OK;  // none (a LLaDA2 MoE layer's dense MLP)
    const int kb = dllm__round_up(W.k, 128) / 128, nb = (W.n + 127) / 128, ld = dllm__round_up(kb, 4);
    dllm__dbuf codes, scale;
    DLLM__TRY(codes.fit((size_t)W.n * kb * 128, "FP8 weights"));
    DLLM__TRY(scale.fit((size_t)nb * ld * 4, "FP8 weight scales"));
    DLLM__CUDA(cudaMemsetAsync(scale.ptr, 0, scale.bytes, stream));  // the ld padding is never read, but defined
    DLLM__TRY(k.quantize_weight_blocks.launch({dim3((unsigned)kb, (unsigned)nb), dim3(256)}, stream, W.data.ptr, W.n,
                                              W.k, codes.ptr, scale.ptr, ld));
    DLLM__CUDA(cudaStreamSynchronize(stream));
    W.data = std::move(codes);
    W.scale = std::move(scale);
    W.format = DLLM__W_E4M3_BLOCK;
    return DLLM_OK;
}

/* [SoloQ] The arguments of soloq_quantize_rows / soloq_produce_rows for `rows` rows d wide, rotated by rot and, with
 * quantize, quantised in format f into row_scale and values (the GEMM input); sources and other outputs are the
 * caller's. */
static soloq_args dllm__soloq_args(const dllm__rotation_dev &rot, dllm__q4_format f, bool quantize,
                                   bool bias_correction, int rows, int d, void *row_scale, void *values) {
    soloq_args a = {};
    a.rows = rows, a.d = d;
    a.perm = rot.perm.as<int>(), a.signs = (const unsigned char *)rot.signs.ptr, a.mixer = rot.mixer.as<float>();
    a.rot_b = rot.b, a.rot_k = rot.k, a.rot_norm = rot.norm;
    a.row_scale = (float *)row_scale, a.values = (bf16_t *)values;
    a.format = (int)f, a.quantize = quantize, a.bias_correction = bias_correction, a.cluster = 1;
    return a;
}

/* [SoloQ clusters] The CTAs a row of d elements takes: the most, up to 8 (a portable cluster), that split it into
 * slices of whole reduction segments and whole rotation blocks of b; 1 where clusters are unavailable. A 32-row block
 * step then fills the GPU instead of 32 of its SMs. */
static int dllm__soloq_split(const dllm__soloq_kernels &k, int d, int b) {
    if (!k.clusters || d <= dllm__soloq_segment || d % dllm__soloq_segment) return 1;
    for (int C = 8; C > 1; C--)
        if ((d / dllm__soloq_segment) % C == 0 && (d / C) % b == 0) return C;
    return 1;
}

/* The threads of a CTA holding a slice of n elements, `asked` the caller's. A row's bits do not depend on them. The
 * norm producer takes its norm's own threads (the fewest whose barriers are cheapest; the rotation runs a block a
 * warp); many rows take smaller CTAs, several an SM, for producer 0 (256); measured on the H200
 * (LLaDA-8B, SoloQ-I, N=1024 forward): the O GEMM's producer 6.0 -> 5.1 ms; 256 threads made the SwiGLU producer
 * (rows of 12288) slower, 8.9 -> 11.4. */
static unsigned dllm__soloq_threads(const soloq_args &a, int n, unsigned asked) {
    if (a.producer == 1) return dllm__norm_threads(a.d / 8);
    const unsigned t = std::min<unsigned>(asked, (unsigned)std::max(128, dllm__round_up(n / 4, 32)));
    return a.producer == 0 ? std::min(t, a.rows > 64 ? 256u : dllm__soloq_quantize_threads) : t;
}

/* One CTA of `threads` a row: soloq_quantize_rows for producer 0, else soloq_produce_rows. */
static dllm_status dllm__soloq_launch(const dllm__soloq_kernels &k, soloq_args a, unsigned threads,
                                      cudaStream_t stream) {
    // Split only few rows (a block step's), and not the norm producer, whose every CTA would normalise the whole row:
    // measured on the H200 (LLaDA-8B shape, SoloQ-I), splitting every launch took the block step from 8.6 to 9.1 ms and
    // the 1024-row forward from 57 to 100 ms; the SwiGLU producer alone went from 1.38 to 1.09 ms a step, while
    // splitting the norm producer too (DLLM_TILES=soloq_split=2) took its 64 launches from 1.28 to 2.11 ms a step.
    const int split = dllm__env().soloq_split >= 0 ? dllm__env().soloq_split : 1;
    a.cluster = split == 0 || (split == 1 && a.producer == 1) || a.rows > 64 ? 1 : dllm__soloq_split(k, a.d, a.rot_b);
    const int n = a.d / a.cluster;  // shared memory: the row buffer (d), a slice, producer 1's normalised row
    const size_t smem = (size_t)(a.d + n + (a.producer == 1 ? a.d : 0)) * 4;
    if (smem > (size_t)k.max_smem)
        return dllm__fail(
            DLLM_ERR_UNSUPPORTED,
            "SoloQ on this GPU quantises rows of at most %d KB of shared memory, a row of %d elements needs %zu",
            k.max_smem / 1024, a.d, smem / 1024);
    const dllm__grid g(dim3((unsigned)a.rows * (unsigned)a.cluster), dim3(dllm__soloq_threads(a, n, threads)), smem,
                       (unsigned)a.cluster);
    return a.producer ? k.soloq_produce_rows.launch(g, stream, a) : k.soloq_quantize_rows.launch(g, stream, a);
}

/* [SoloQ] soloq_quantize_rows over `rows` bf16 rows of x (d wide, x_stride apart): rotated by rot and, with quantize,
 * quantised in format f into whichever of codes, block_scales, row_scale, values and (integer formats) values_i8 are
 * given. */
static dllm_status dllm__soloq_quantize_rows(const dllm__soloq_kernels &k, const dllm__rotation_dev &rot,
                                             dllm__q4_format f, bool quantize, bool bias_correction, const void *x,
                                             u64 x_stride, int rows, int d, void *codes, void *block_scales,
                                             void *row_scale, void *values, cudaStream_t stream,
                                             void *values_i8 = nullptr) {
    soloq_args a = dllm__soloq_args(rot, f, quantize, bias_correction, rows, d, row_scale, values);
    a.x = x, a.x_stride = x_stride, a.values_i8 = (signed char *)values_i8;
    a.codes = (unsigned char *)codes, a.block_scales = (unsigned char *)block_scales;
    return dllm__soloq_launch(k, a, d >= 4096 ? 1024 : d >= 2048 ? 512 : 256, stream);
}

/* [INT8 GEMM] y [M x N] (bf16 or fp32, row stride ldy) = ((float)(X . C_w^T) s_x) s_w: X the int8 C values of M
 * activation rows [M][K], s_x their token scales, the weights N stored 4-bit rows of an integer format
 * (codes [N][K / 2], row scales s_w). Per chunk of `chunk` weight rows: their C values unpacked into w_i8
 * (chunk x K bytes), cuBLASLt's INT8 GEMM into acc
 * (M x chunk int32: the sums exact, so any algorithm and split give the same bits and a row's result never depends on
 * M) and the epilogue soloq_scale_rows_i32 into y's columns of the chunk. Twin: dllm__cpu_i8_gemm on the rows' C values
 * (dllm__q4_row_values). K a multiple of 8, N and chunk of 4; device buffers from cudaMalloc. */
static dllm_status dllm__q4_int8_gemm_run(const dllm__soloq_kernels &Q, dllm__gemm &gemm, dllm__q4_format f,
                                          const void *codes, const float *s_w, const void *X, const float *s_x, void *y,
                                          int ldy, cudaDataType_t out, int M, int N, int K, int chunk, void *w_i8,
                                          int *acc, cudaStream_t stream) {
    if (!dllm__q4_int_max(f))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "INT8 GEMM: %s weights do not decode to integers",
                          dllm__q4_names[f]);
    if (M < 0 || K <= 0 || K % 8 || N % 4 || chunk <= 0 || chunk % 4 || ldy < N)
        return dllm__fail(
            DLLM_ERR_INVALID_ARGUMENT,
            "INT8 GEMM: K (%d) must be a positive multiple of 8, N (%d) and the chunk (%d) multiples of 4, ldy (%d) >= "
            "N",
            K, N, chunk, ldy);
    if (!codes || !s_w || !X || !s_x || !y || !w_i8 || !acc)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "INT8 GEMM: a null operand");
    const size_t out_bytes = out == CUDA_R_32F ? 4 : 2;
    for (int n0 = 0; n0 < N && M > 0; n0 += chunk) {
        const int nc = std::min(chunk, N - n0);
        const unsigned char *rows = (const unsigned char *)codes + (size_t)n0 * (K / 2);
        DLLM__TRY(Q.soloq_unpack_rows_i8.launch({dim3((unsigned)(K / 8 + 127) / 128, (unsigned)nc), dim3(128)}, stream,
                                                rows, (int)f, nc, K, (signed char *)w_i8));
        DLLM__TRY(gemm.run_i8(X, w_i8, acc, M, nc, K, stream));
        DLLM__TRY(Q.soloq_scale_rows_i32.launch({dim3((unsigned)(nc + 255) / 256, (unsigned)M), dim3(256)}, stream, acc,
                                                M, nc, s_x, s_w + n0, (char *)y + (size_t)n0 * out_bytes,
                                                out == CUDA_R_32F ? 1 : 0, (u64)ldy));
    }
    return DLLM_OK;
}

/* [SoloQ] A BF16 weight into DLLM__W_Q4 on the device, rotated by its site's R (twin: dllm__soloq_quantize_linear); the
 * bf16 copy is released. rot_shared: the rotation that linears of one site and one input width share (a MoE layer's
 * gate|up linears, its routed experts' downs: dllm__soloq_rotations), on the device once, made by the first; null: its
 * own. An absent linear stays absent. */
static dllm_status dllm__quantize_linear_q4(dllm__linear &W, const dllm__soloq_options &o, uint32_t site,
                                            const dllm__soloq_kernels &k, cudaStream_t stream,
                                            std::shared_ptr<dllm__rotation_dev> *rot_shared = nullptr) {
    if (!W.data.ptr) return DLLM_OK;
    std::shared_ptr<dllm__rotation_dev> rot = rot_shared ? *rot_shared : nullptr;
    if (!rot) {
        rot = std::make_shared<dllm__rotation_dev>();
        DLLM__TRY(dllm__rotation_upload(dllm__make_rotation(o.rotation, W.k, o.seed, site), *rot));
        if (rot_shared) *rot_shared = rot;
    }
    std::unique_ptr<dllm__q4_site> q(new dllm__q4_site);
    q->format = o.weights;
    q->rot = rot;
    dllm__dbuf codes, scale;
    DLLM__TRY(codes.fit((size_t)W.n * W.k / 2, "SoloQ weights"));
    DLLM__TRY(scale.fit((size_t)W.n * 4, "SoloQ weights"));
    if (o.weights == DLLM__Q4_NVFP4) DLLM__TRY(q->block_scales.fit((size_t)W.n * ((W.k + 15) / 16), "SoloQ weights"));
    DLLM__TRY(dllm__soloq_quantize_rows(k, *rot, o.weights, true, o.bias_correction, W.data.ptr, (u64)W.k, W.n, W.k,
                                        codes.ptr, q->block_scales.ptr, scale.ptr, nullptr, stream));
    DLLM__CUDA(cudaStreamSynchronize(stream));
    W.data = std::move(codes);
    W.scale = std::move(scale);
    W.format = DLLM__W_Q4;
    W.q4 = std::move(q);
    return DLLM_OK;
}

/* [W4 GEMM] A layer's linears that q4wg takes, into its layout (the LM head keeps section 9b's rows: its many rows
 * would need a workspace of their own). */
static dllm_status dllm__gpu_layer_pack_q4wg(dllm__gpu_layer &G, const dllm__q4wg_kernels &k, cudaStream_t stream) {
    for (dllm__linear *W : {&G.qkv, &G.o, &G.gu, &G.down})
        if (W->format == DLLM__W_Q4 && dllm__q4wg_takes(W->q4->format, W->n, W->k))
            DLLM__TRY(dllm__q4wg_pack(k, *W, stream));
    return DLLM_OK;
}

/* [SoloQ] Layer l's linears (layer 0 too, as the CPU reference: rows stay independent, so LaCache stays exact); a
 * quantised checkpoint's are there already. With q4wg, they then go into its layout. */
static dllm_status dllm__gpu_layer_quantize_q4(const dllm_model &m, size_t l, dllm__gpu_layer &G,
                                               const dllm__soloq_options &o, const dllm__soloq_kernels &k,
                                               const dllm__q4wg_kernels *q4wg, cudaStream_t stream) {
    if (!m.soloq) {
        DLLM__TRY(dllm__quantize_linear_q4(G.qkv, o, dllm__soloq_site_id(l, DLLM__SOLOQ_QKV), k, stream));
        DLLM__TRY(dllm__quantize_linear_q4(G.o, o, dllm__soloq_site_id(l, DLLM__SOLOQ_O), k, stream));
        DLLM__TRY(dllm__quantize_linear_q4(G.gu, o, dllm__soloq_site_id(l, DLLM__SOLOQ_GU), k, stream));
        DLLM__TRY(dllm__quantize_linear_q4(G.down, o, dllm__soloq_site_id(l, DLLM__SOLOQ_DOWN), k, stream));
        // [MoE] the shared expert and every routed expert: every gate|up reads the normed row (one rotation), the
        // routed downs one rotation of their width (dllm__soloq_rotations)
        std::shared_ptr<dllm__rotation_dev> gu_rot, down_rot;
        const uint32_t gu_site = dllm__soloq_site_id(l, DLLM__SOLOQ_GU),
                       down_site = dllm__soloq_site_id(l, DLLM__SOLOQ_DOWN);
        DLLM__TRY(dllm__quantize_linear_q4(G.shared_gu, o, gu_site, k, stream, &gu_rot));
        DLLM__TRY(dllm__quantize_linear_q4(G.shared_down, o, down_site, k, stream));
        for (size_t e = 0; e < G.expert_gu.size(); e++) {
            DLLM__TRY(dllm__quantize_linear_q4(G.expert_gu[e], o, gu_site, k, stream, &gu_rot));
            DLLM__TRY(dllm__quantize_linear_q4(G.expert_down[e], o, down_site, k, stream, &down_rot));
        }
    }
    if (q4wg) DLLM__TRY(dllm__gpu_layer_pack_q4wg(G, *q4wg, stream));
    return DLLM_OK;
}

/* [SoloQ] The LM head, if asked (a tied one from a copy of the embedding table); a quantised checkpoint's is there
 * already. */
static dllm_status dllm__gpu_head_quantize_q4(const dllm_model &m, dllm__gpu_weights &w, const dllm__soloq_kernels &k,
                                              cudaStream_t stream) {
    if (!w.soloq.quantize_head || w.head.format == DLLM__W_Q4) return DLLM_OK;
    const dllm__config &c = m.cfg;
    if (!w.head.data.ptr) {  // tied: the head gets its own (quantised) copy, the embedding gather keeps the table
        w.head.format = DLLM__W_BF16, w.head.n = c.n_vocab, w.head.k = c.n_embd;
        DLLM__TRY(w.head.data.fit((size_t)c.n_vocab * c.n_embd * 2, "the LM head"));
        DLLM__CUDA(cudaMemcpyAsync(w.head.data.ptr, w.embed.ptr, w.head.data.bytes, cudaMemcpyDeviceToDevice, stream));
    }
    const uint32_t site = dllm__soloq_site_id(w.layers.size(), DLLM__SOLOQ_HEAD);
    return dllm__quantize_linear_q4(w.head, w.soloq, site, k, stream);
}

/* [FP8] Layer l >= 1's linears in the formats in effect (layer 0 stays BF16: the paper: quantising it costs accuracy;
 * and LaCache caches its work). */
static dllm_status dllm__gpu_layer_quantize_e4m3(dllm__gpu_layer &G, const dllm__gpu_weights &w,
                                                 const dllm__rowwise_kernels &k, cudaStream_t stream) {
    if (w.fp8_ffn) {  // [MoE] a LLaDA2 MoE layer's FFN: its shared expert and every routed expert
        for (dllm__linear *W : {&G.gu, &G.down, &G.shared_gu, &G.shared_down})
            DLLM__TRY(dllm__quantize_linear_e4m3(*W, k, stream));
        for (size_t e = 0; e < G.expert_gu.size(); e++) {
            DLLM__TRY(dllm__quantize_linear_e4m3(G.expert_gu[e], k, stream));
            DLLM__TRY(dllm__quantize_linear_e4m3(G.expert_down[e], k, stream));
        }
    }
    if (w.fp8_attn) {
        DLLM__TRY(dllm__quantize_linear_e4m3(G.qkv, k, stream));
        DLLM__TRY(dllm__quantize_linear_e4m3(G.o, k, stream));
    }
    return DLLM_OK;
}

/* The device copy in its formats, a layer at a time: each layer made (uploaded or generated) and quantised before the
 * next, so the device holds at most one layer in BF16 beside the quantised ones (a 16B MoE in 4 bits builds on a 24 GB
 * card); then the embedding table, the final norm and the head. progress counts as the CPU backend's: FP8 the layers
 * from 1 (dllm__cpu_fp8_weights), SoloQ the layers and the head (dllm__cpu_soloq_weights; none from a quantised
 * checkpoint). */
static dllm_status dllm__gpu_weights_make(const dllm_model &m, const dllm__rowwise_kernels &k,
                                          const dllm__soloq_kernels *q, const dllm__q4wg_kernels *q4wg,
                                          const dllm__progress &progress, cudaStream_t stream, dllm__gpu_weights &w) {
    if (w.soloq.enabled && !q) return dllm__fail(DLLM_ERR_INTERNAL, "SoloQ weights without SoloQ kernels");
    dllm__weights_source source(m, k, stream);
    const int n = (int)source.n_layers(), q4_total = n + (w.soloq.quantize_head ? 1 : 0);
    const bool fp8 = w.fp8_ffn || w.fp8_attn, q4_progress = w.soloq.enabled && !m.soloq;
    w.layers.resize((size_t)n);
    for (int l = 0; l < n; l++) {
        dllm__gpu_layer &G = w.layers[(size_t)l];
        DLLM__TRY(source.layer((size_t)l, G));
        if (fp8 && l > 0) {
            DLLM__TRY(dllm__gpu_layer_quantize_e4m3(G, w, k, stream));
            progress.report(l, n - 1);
        }
        if (w.soloq.enabled) DLLM__TRY(dllm__gpu_layer_quantize_q4(m, (size_t)l, G, w.soloq, *q, q4wg, stream));
        if (q4_progress) {
            DLLM__CUDA(cudaStreamSynchronize(stream));  // the layer is done when progress says so
            progress.report(l + 1, q4_total);
        }
    }
    DLLM__TRY(source.rest(w));
    if (w.soloq.enabled) DLLM__TRY(dllm__gpu_head_quantize_q4(m, w, *q, stream));
    if (q4_progress && w.soloq.quantize_head) progress.report(q4_total, q4_total);
    DLLM__CUDA(cudaStreamSynchronize(stream));
    return DLLM_OK;
}

static dllm_status dllm__gpu_weights_build(const dllm_model &m, const dllm__rowwise_kernels &k,
                                           const dllm__soloq_kernels *q, const dllm__q4wg_kernels *q4wg,
                                           const dllm__progress &progress, dllm__gpu_weights &w) {
    cudaStream_t stream = nullptr;
    DLLM__CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const int64_t before = dllm__device_bytes;
    const double t0 = dllm__now_ms();
    const dllm_status s = dllm__gpu_weights_make(m, k, q, q4wg, progress, stream, w);
    if (s == DLLM_OK && w.soloq.enabled)
        dllm__log(DLLM_LOG_INFO, "SoloQ: quantised on the device in %.1f s", (dllm__now_ms() - t0) / 1e3);
    cudaStreamDestroy(stream);
    w.bytes = (size_t)std::max<int64_t>(0, dllm__device_bytes - before);
    return s;
}

/* Whether two SoloQ option sets quantise weights alike (the activation options do not touch the weights). */
static bool dllm__same_soloq_weights(const dllm__soloq_options &a, const dllm__soloq_options &b) {
    if (!a.enabled || !b.enabled) return a.enabled == b.enabled;
    return a.weights == b.weights && a.rotation == b.rotation && a.bias_correction == b.bias_correction &&
           a.quantize_head == b.quantize_head && a.seed == b.seed;
}

/* The model's weights on the current device in the given formats: the copy another context already made, or a new one
 * that the model then shares. The model's lock is held while a copy is built, so two contexts created at once on one
 * model build it once. progress reports a new copy's quantisation (dllm_ctx_params.progress); a copy found reports
 * nothing, as nothing is quantised. */

static dllm_status dllm__gpu_weights_for(const dllm_model &m, int device, bool fp8_ffn, bool fp8_attn,
                                         const dllm__soloq_options &soloq, const dllm__rowwise_kernels &k,
                                         const dllm__soloq_kernels *q, const dllm__q4wg_kernels *q4wg,
                                         const dllm__progress &progress, std::shared_ptr<dllm__gpu_weights> &out) {
    std::lock_guard<std::mutex> lock(m.gpu_weights_mutex);
    auto &cache = m.gpu_weights;
    cache.erase(std::remove_if(cache.begin(), cache.end(),
                               [](const std::weak_ptr<dllm__gpu_weights> &w) { return w.expired(); }),
                cache.end());
    for (const std::weak_ptr<dllm__gpu_weights> &held : cache)
        if (std::shared_ptr<dllm__gpu_weights> w = held.lock())
            if (w->device == device && w->fp8_ffn == fp8_ffn && w->fp8_attn == fp8_attn &&
                dllm__same_soloq_weights(w->soloq, soloq) && w->q4wg == (q4wg != nullptr)) {
                out = w;
                return DLLM_OK;
            }
    std::shared_ptr<dllm__gpu_weights> w = std::make_shared<dllm__gpu_weights>();
    w->device = device, w->fp8_ffn = fp8_ffn, w->fp8_attn = fp8_attn, w->soloq = soloq, w->q4wg = q4wg != nullptr;
    DLLM__TRY(dllm__gpu_weights_build(m, k, q, q4wg, progress, *w));
    const dllm__gpu_layer *L1 = w->layers.size() > 1 ? &w->layers[1] : nullptr;  // [MoE] its experts' format
    dllm__log(DLLM_LOG_INFO, "GPU weights on device %d: %.2f GB; layers >= 1: FFN %s, attention projections %s", device,
              w->bytes / 1e9,
              dllm__wformats[!L1 ? DLLM__W_BF16 : L1->expert_gu.empty() ? L1->gu.format : L1->expert_gu[0].format].name,
              dllm__wformats[w->layers.size() > 1 ? w->layers[1].qkv.format : DLLM__W_BF16].name);
    cache.push_back(w);
    out = std::move(w);
    return DLLM_OK;
}
