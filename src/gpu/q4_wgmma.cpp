/* src/gpu/q4_wgmma.cpp - [W4 GEMM] q4wg: SoloQ's integer 4-bit weights (SoloQ-I, RTN-W4A4) on Hopper's wgmma: the
 * packed layout, the kernels' configurations, loading, and the launcher. */

/* q4wg_gemm's arguments (host/kernel contract, declared in its own module). */
#define DLLM__Q4WG_ARGS_FIELDS(X)                                                                                      \
    X(const signed char *, x) /* [M][ldx] int8 token C values (act_.q4a8), 16-byte aligned rows */                     \
    X(const float *, s_x)     /* [M] token scales */                                                                   \
    X(const void *, w)        /* the packed codes (q4wg_prepack), 16-byte aligned */                                   \
    X(const float *, s_w)     /* [N] row scales */                                                                     \
    X(bf16_t *, y)            /* [M][ldy] */                                                                           \
    X(int *, ws)              /* [N / 128][NT * 128] int32 split-K sums: zero before a launch, left zero after */      \
    X(int *, cnt)             /* [N / 128] k blocks summed per tile: likewise */                                       \
    X(long long, ldx) X(long long, ldy) X(int, M) X(int, N) X(int, K)
struct q4wg_args {
    DLLM__Q4WG_ARGS_FIELDS(DLLM__FIELD)
};
static_assert(sizeof(q4wg_args) == 88, "contract layout");

/* [kernel table] the q4wg module's plain kernels; q4wg_gemm is a template, looked up by name (dllm__q4wg_name). */
#define DLLM__Q4WG_KERNELS(X) X(q4wg_prepack, , (const unsigned char *rows, int n, int k, unsigned char *packed))
DLLM__Q4WG_KERNELS(DLLM__KERNEL_SIGNATURE)

static const char *dllm__src_q4_wgmma = DLLM__KERNEL_FILE("q4_wgmma.cuh");

/* q4wg_gemm's configurations by token rows (wgmma's N): NT tokens, WGS warpgroups of R 64-row tiles (128 features a
 * CTA in each), P k blocks of 128 a group, SG activation stages. Measured on an H200 (dllm-bench --q4-gemm-only):
 * memory-bound at 32 and 64 tokens, where two CTAs an SM keep 64 KB of weights in flight each. */
struct dllm__q4wg_config {
    int nt, wgs, r, p, sg;
};
static const dllm__q4wg_config dllm__q4wg_configs[] = {
    {32, 1, 2, 4, 3}, {64, 1, 2, 4, 3}, {128, 2, 1, 4, 3}, {256, 2, 1, 2, 3}};
static const int dllm__q4wg_configs_n = 4, dllm__q4wg_max_rows = 256, dllm__q4wg_tile = 128;

static size_t dllm__q4wg_smem(const dllm__q4wg_config &c) { return (size_t)c.sg * c.nt * 128 * c.p + 1024; }

static std::string dllm__q4wg_name(const dllm__q4wg_config &c, dllm__q4_format f) {
    return dllm__format("q4wg_gemm<%d,%d,%d,%d,%d,%d>", c.nt, (int)f, c.wgs, c.r, c.p, c.sg);
}

/* Whether q4wg takes an n x k weight of format f: integer codes, whole 128-feature tiles and 512-wide k groups. */
static bool dllm__q4wg_takes(dllm__q4_format f, int n, int k) {
    return (f == DLLM__Q4_INT4 || f == DLLM__Q4_RTN) && n > 0 && k > 0 && n % dllm__q4wg_tile == 0 && k % 512 == 0;
}

/* The int32 workspace (ws) of an n-row weight, and the tile counters (cnt) after it: zeroed once, kept zero. */
static size_t dllm__q4wg_workspace_ints(int n) { return (size_t)n * dllm__q4wg_max_rows + (size_t)n / dllm__q4wg_tile; }

static dllm__jit_request dllm__module_q4wg(const dllm__arch &arch) {
    std::vector<std::string> names = {DLLM__Q4WG_KERNELS(DLLM__KERNEL_NAME)};
    for (dllm__q4_format f : {DLLM__Q4_INT4, DLLM__Q4_RTN})
        for (const dllm__q4wg_config &c : dllm__q4wg_configs) names.push_back(dllm__q4wg_name(c, f));
    return {
        "dllm_q4wg",
            dllm__src_prelude() + DLLM__XSTR(struct q4wg_args{DLLM__Q4WG_ARGS_FIELDS(DLLM__FIELD)};) "\n" +
                DLLM__Q4WG_KERNELS(DLLM__KERNEL_DECLARE) + dllm__src_q4_wgmma,
            names, arch.target
    };
}

/* q4wg loaded for one device: the prepack kernel and q4wg_gemm per (format, configuration) with its occupancy. */
struct dllm__q4wg_kernels {
    std::shared_ptr<dllm__module> module;
    dllm__kernel<dllm__sig_q4wg_prepack> prepack;
    dllm__kernel<void(q4wg_args)> gemm[2][dllm__q4wg_configs_n];  // [INT4, RTN][configuration]
    int ctas_per_sm[dllm__q4wg_configs_n] = {};
    int sm_count = 0;
};

static int dllm__q4wg_format_index(dllm__q4_format f) { return f == DLLM__Q4_INT4 ? 0 : 1; }

/* The module for the current device (sm_90a only: wgmma) and its kernels' limits. */
static dllm_status dllm__q4wg_load(const dllm__arch &a, dllm__q4wg_kernels &out) {
    if (a.cc != 90)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "q4wg runs on sm_90a (wgmma) only, this GPU is sm_%d", a.cc);
    DLLM__TRY(dllm__jit_load(dllm__module_q4wg(a), out.module));
    int dev = 0;
    DLLM__CUDA(cudaGetDevice(&dev));
    DLLM__CUDA(cudaDeviceGetAttribute(&out.sm_count, cudaDevAttrMultiProcessorCount, dev));
    out.prepack.fn = out.module->kernels.at("q4wg_prepack"), out.prepack.name = "q4wg_prepack";
    for (dllm__q4_format f : {DLLM__Q4_INT4, DLLM__Q4_RTN})
        for (int i = 0; i < dllm__q4wg_configs_n; i++) {
            const dllm__q4wg_config &c = dllm__q4wg_configs[i];
            dllm__kernel<void(q4wg_args)> &k = out.gemm[dllm__q4wg_format_index(f)][i];
            k.fn = out.module->kernels.at(dllm__q4wg_name(c, f)), k.name = "q4wg_gemm";
            DLLM__CUDA(cudaFuncSetAttribute((const void *)k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)dllm__q4wg_smem(c)));
            DLLM__CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&out.ctas_per_sm[i], (const void *)k.fn,
                                                                     128 * c.wgs, dllm__q4wg_smem(c)));
            out.ctas_per_sm[i] = std::max(1, out.ctas_per_sm[i]);
        }
    return DLLM_OK;
}

/* An n x k weight's canonical codes (section 9b's rows) into q4wg's layout on the device, in place of W.data. */
static dllm_status dllm__q4wg_pack(const dllm__q4wg_kernels &k, dllm__linear &W, cudaStream_t stream) {
    dllm__dbuf packed;
    DLLM__TRY(packed.fit((size_t)W.n * W.k / 2, "SoloQ weights (q4wg layout)"));
    const size_t bytes = packed.bytes;
    DLLM__TRY(k.prepack.launch({dim3((unsigned)std::min<size_t>((bytes + 255) / 256, 65535)), dim3(256)}, stream,
                               W.data.ptr, W.n, W.k, packed.ptr));
    DLLM__CUDA(cudaStreamSynchronize(stream));
    W.data = std::move(packed);
    W.q4->packed = true;
    return DLLM_OK;
}

/* y [M x N] (bf16) = ((float)(X . C_w^T) s_x) s_w: X int8 token C values [M][K], the weights packed
 * (dllm__q4wg_pack) in format f. Launches of at most 256 token rows, each on the smallest configuration that holds
 * them, over a grid of every resident CTA (capped at the groups); the sums are exact integers, so the launches, the
 * configuration and the split give every row the bits of dllm__cpu_i8_gemm whatever M is. ws: the
 * dllm__q4wg_workspace_ints(N) ints, zero (the launches leave them zero). */
static dllm_status dllm__q4wg_gemm_run(const dllm__q4wg_kernels &k, dllm__q4_format f, const void *packed,
                                       const float *s_w, const signed char *x, const float *s_x, bf16_t *y, int M,
                                       int N, int K, int *ws, size_t ws_ints, cudaStream_t stream) {
    if (!dllm__q4wg_takes(f, N, K) || M < 0)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "q4wg: format %d, N = %d, K = %d, M = %d: it takes INT4 or RTN codes, N a multiple of 128 "
                          "and K of 512",
                          (int)f, N, K, M);
    if (ws_ints < dllm__q4wg_workspace_ints(N) || !ws || (uintptr_t)x % 16 || (uintptr_t)packed % 16)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "q4wg: a workspace of %zu ints (%zu given) and 16-byte aligned inputs are required",
                          dllm__q4wg_workspace_ints(N), ws_ints);
    for (int m0 = 0; m0 < M; m0 += dllm__q4wg_max_rows) {
        const int rows = std::min(dllm__q4wg_max_rows, M - m0);
        int i = 0;
        while (dllm__q4wg_configs[i].nt < rows) i++;
        const dllm__q4wg_config &c = dllm__q4wg_configs[i];
        q4wg_args a = {};
        a.x = x + (size_t)m0 * K, a.s_x = s_x + m0, a.w = packed, a.s_w = s_w;
        a.y = y + (size_t)m0 * N, a.ws = ws, a.cnt = ws + (size_t)N * dllm__q4wg_max_rows;
        a.ldx = K, a.ldy = N, a.M = rows, a.N = N, a.K = K;
        const int groups = N / dllm__q4wg_tile * (K / 128 / c.p);
        const int grid = std::max(1, std::min(groups, k.ctas_per_sm[i] * k.sm_count));
        DLLM__TRY(k.gemm[dllm__q4wg_format_index(f)][i].launch(
            {dim3((unsigned)grid), dim3((unsigned)(128 * c.wgs)), dllm__q4wg_smem(c)}, stream, a));
    }
    return DLLM_OK;
}
