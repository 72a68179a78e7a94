/* src/gpu/gemm_lowbit.cpp - the batched FP8 launches and the 4-bit GEMM runner. */

/* [FP8] [batch] The launches of a batched E4M3 GEMM over M rows quantised once (codes [M_pad][k_pad], M_pad = M
 * rounded up to 16): [m0, m0 + rows) for m0 = 0, limit, 2 limit, ..., rows = min(limit, M_pad - m0). limit is a
 * multiple of 16, so every launch starts on a 16-row boundary and is padded as a quantisation of its own rows would
 * be (only the last is short, and its padding rows are the whole quantisation's). */
struct dllm__row_chunk {
    int m0, rows;
};
static std::vector<dllm__row_chunk> dllm__fp8_row_chunks(int M, int limit) {
    std::vector<dllm__row_chunk> out;
    const int m_pad = (M + 15) / 16 * 16;
    for (int m0 = 0; m0 < m_pad; m0 += limit) out.push_back({m0, std::min(limit, m_pad - m0)});
    return out;
}

/* [W4 GEMM] q4_gemm loaded for one device: an entry point per format, the split-K reduction and the SM count that
 * sizes split-K. */
struct dllm__q4_gemm_kernels {
    std::shared_ptr<dllm__module> module;
#define DLLM__Q4_MEMBER(name, attrs, params) dllm__kernel<dllm__sig_##name> name;
    DLLM__Q4_GEMM_KERNELS(DLLM__Q4_MEMBER)
#undef DLLM__Q4_MEMBER
    int sm_count = 0;
};

/* The entry point of format f for M rows: the _m32 instance where M <= dllm__q4_m32_rows. */
static const dllm__kernel<dllm__sig_q4_gemm_int4> &dllm__q4_gemm_kernel(const dllm__q4_gemm_kernels &k,
                                                                        dllm__q4_format f, int M) {
    const dllm__kernel<dllm__sig_q4_gemm_int4> *kernel[] = {&k.q4_gemm_nvfp4, &k.q4_gemm_int4, &k.q4_gemm_lloyd,
                                                            &k.q4_gemm_e8p, &k.q4_gemm_rtn};
    const dllm__kernel<dllm__sig_q4_gemm_int4> *m32[] = {&k.q4_gemm_nvfp4_m32, &k.q4_gemm_int4_m32,
                                                         &k.q4_gemm_lloyd_m32, &k.q4_gemm_e8p_m32, &k.q4_gemm_rtn_m32};
    return *(M <= dllm__q4_m32_rows ? m32 : kernel)[f];
}

/* The kernels of out.module (loaded), their shared-memory limits, and the current device's SM count. */
static dllm_status dllm__q4_gemm_bind(dllm__q4_gemm_kernels &out) {
    int dev = 0;
    DLLM__CUDA(cudaGetDevice(&dev));
    DLLM__CUDA(cudaDeviceGetAttribute(&out.sm_count, cudaDevAttrMultiProcessorCount, dev));
#define DLLM__Q4_BIND(kname, attrs, params) out.kname.fn = out.module->kernels.at(#kname), out.kname.name = #kname;
    DLLM__Q4_GEMM_KERNELS(DLLM__Q4_BIND)
#undef DLLM__Q4_BIND
    for (int f = DLLM__Q4_NVFP4; f <= DLLM__Q4_RTN; f++)
        for (int M : {dllm__q4_m32_rows, dllm__q4_max_rows})
            DLLM__CUDA(cudaFuncSetAttribute((const void *)dllm__q4_gemm_kernel(out, (dllm__q4_format)f, M).fn,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)dllm__q4_ring_bytes((dllm__q4_format)f, M)));
    return DLLM_OK;
}

/* q4_gemm alone (the tests and the bench; the backend compiles its module beside the others and binds it). */
[[maybe_unused]] static dllm_status dllm__q4_gemm_load(const dllm__arch &a, dllm__q4_gemm_kernels &out) {
    DLLM__TRY(dllm__jit_load(dllm__module_q4_gemm(a), out.module));
    return dllm__q4_gemm_bind(out);
}

/* CTAs of q4_gemm an H200 SM holds at once (about 140 registers and at most 76 KB of shared memory (M = 64): 3; NVFP4
 * for M > 32, 184 registers: 2), which split-K aims to fill in one wave: the bytes in flight, and so the bandwidth,
 * grow with the resident warps. */
static const int dllm__q4_ctas_per_sm = 3;

/* Split-K of an N x K weight on sm_count SMs: the 128-wide k chunks a split takes, so that the CTAs come closest to one
 * full wave (gate|up 24576 x 4096 on 132 SMs: 2 splits, 384 CTAs; O 4096 x 4096: 11 splits, 352). A function of
 * (N, K, SMs) only, never of M: a row's partial sums, and so its bits, do not depend on how many rows a launch has. */
static int dllm__q4_gemm_chunks_per_split(int sm_count, int N, int K) {
    const int ctas = (N + dllm__q4_bn - 1) / dllm__q4_bn, chunks = (K + dllm__q4_kc - 1) / dllm__q4_kc;
    const int splits = std::max(1, std::min(chunks, (int)lrint((double)dllm__q4_ctas_per_sm * sm_count / ctas)));
    return (chunks + splits - 1) / splits;
}

static int dllm__q4_gemm_splits(int sm_count, int N, int K) {
    const int chunks = (K + dllm__q4_kc - 1) / dllm__q4_kc, cps = dllm__q4_gemm_chunks_per_split(sm_count, N, K);
    return (chunks + cps - 1) / cps;
}

/* The fp32 workspace dllm__q4_gemm_run needs for M rows of an N x K weight (0 without split-K). */
static size_t dllm__q4_gemm_workspace_floats(const dllm__q4_gemm_kernels &k, int M, int N, int K) {
    const int splits = dllm__q4_gemm_splits(k.sm_count, N, K);
    return splits > 1 ? (size_t)splits * M * N : 0;
}

/* y[m * ldy + y_col0 + n] (out_type CUDA_R_16BF or CUDA_R_32F) = (sum_k A[m][k] C_w[n][k] * s_x[m]) * row_scale[n] for
 * M <= 64 activation rows and N packed 4-bit weight rows of K elements in format f (section 9b's layout; NVFP4 with its
 * block scales); s_x null = 1. The twin is dllm__cpu_q4_gemm. Device pointers: A 16-byte aligned with lda % 8 == 0
 * (bf16 elements), codes and block scales 4-byte aligned; N and K multiples of 8. workspace:
 * dllm__q4_gemm_workspace_floats(M, N, K) floats (may be null when that is 0). Deterministic, and a row's result does
 * not depend on M. */
static dllm_status dllm__q4_gemm_run(const dllm__q4_gemm_kernels &k, dllm__q4_format f, const void *codes,
                                     const void *block_scales, const float *row_scale, const void *A, int lda,
                                     const float *s_x, void *y, int ldy, int y_col0, cudaDataType_t out_type, int M,
                                     int N, int K, float *workspace, size_t workspace_floats, cudaStream_t stream) {
    if (M < 0 || M > dllm__q4_max_rows)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "q4_gemm: %d activation rows; it takes 0 to %d (split larger M into launches)", M,
                          dllm__q4_max_rows);
    if (N < 0 || N % 8 || K <= 0 || K % 8)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: N = %d and K = %d must be multiples of 8 (K > 0)", N, K);
    if ((int)f < DLLM__Q4_NVFP4 || (int)f > DLLM__Q4_RTN)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: unknown weight format %d", (int)f);
    if (!codes || !row_scale || !A || !y || (f == DLLM__Q4_NVFP4 && !block_scales))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "q4_gemm: codes, row scales, A and y are required (and block scales for NVFP4)");
    if (lda < K || lda % 8 || (uintptr_t)A % 16 || (uintptr_t)codes % 4 || (uintptr_t)block_scales % 4)
        return dllm__fail(
            DLLM_ERR_INVALID_ARGUMENT,
            "q4_gemm: A needs 16-byte alignment and lda (%d) a multiple of 8 and >= K (%d); codes and block "
            "scales 4-byte alignment",
            lda, K);
    if (out_type != CUDA_R_16BF && out_type != CUDA_R_32F)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: the output is bf16 or fp32");
    if (y_col0 < 0 || ldy < y_col0 + N)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: ldy (%d) must be >= y_col0 (%d) + N (%d)", ldy, y_col0,
                          N);
    const size_t need = dllm__q4_gemm_workspace_floats(k, M, N, K);
    if (need > workspace_floats || (need && !workspace))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: split-K needs a workspace of %zu floats, %zu given",
                          need, workspace_floats);
    if (M == 0 || N == 0) return DLLM_OK;
    q4_gemm_args a = {};
    a.codes = (const unsigned char *)codes, a.block_scales = (const unsigned char *)block_scales,
    a.row_scale = row_scale;
    a.A = (const bf16_t *)A, a.s_x = s_x, a.y = y, a.partial = workspace;
    a.lda = lda, a.ldy = ldy, a.y_col0 = y_col0, a.y_f32 = out_type == CUDA_R_32F, a.M = M, a.N = N, a.K = K;
    a.chunks_per_split = dllm__q4_gemm_chunks_per_split(k.sm_count, N, K);
    a.k_splits = dllm__q4_gemm_splits(k.sm_count, N, K);
    const dllm__grid grid(dim3((unsigned)((N + dllm__q4_bn - 1) / dllm__q4_bn), (unsigned)a.k_splits),
                          dim3(dllm__q4_threads), dllm__q4_ring_bytes(f, M));
    DLLM__TRY(dllm__q4_gemm_kernel(k, f, M).launch(grid, stream, a));
    if (a.k_splits == 1) return DLLM_OK;
    const unsigned blocks = (unsigned)(((size_t)M * N + 255) / 256);
    return k.q4_gemm_reduce.launch({dim3(blocks), dim3(256)}, stream, a);
}
