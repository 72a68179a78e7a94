/* src/gpu/gemm_splitk.cpp - [row-independent GEMM] gemm_splitk: BF16 GEMMs whose rows get the same bits at any row
 * count, fast at a few rows (src/kernels/gemm_splitk.cuh): the split per shape, loading, and the launcher. */

/* gemm_splitk's arguments (host/kernel contract, declared in its own module). */
#define DLLM__GEMM_SPLITK_ARGS_FIELDS(X)                                                                               \
    X(bf16_t *, y)  /* [m][n] */                                                                                       \
    X(float *, ws)  /* SPREAD: [n / 128][splits][256 NT / 2] fp32 partials */                                          \
    X(int *, cnt)   /* SPREAD: [n / 128] units counted a tile: zero before a launch, left zero after */                \
    X(int, m) X(int, n) X(int, k) X(int, splits)
struct gemm_splitk_args {
    DLLM__GEMM_SPLITK_ARGS_FIELDS(DLLM__FIELD)
};
static_assert(sizeof(gemm_splitk_args) == 40, "contract layout");

static const char *dllm__src_gemm_splitk = DLLM__KERNEL_FILE("gemm_splitk.cuh");

/* Its configurations: NT tokens a tile, NS ring slots (each a 16 KB weight box and NT x 128 bytes of tokens, about
 * 192 KB in all), SPREAD (see the kernel). SPREAD takes one tile of at most 128 tokens: at 128 its partials (written
 * and read back) already move half the weights' bytes at K = 4096 in 4 splits. The other mode's tiles are 128 tokens:
 * a split's partial needs a second set of accumulators. */
struct dllm__splitk_config {
    int nt, ns;
    bool spread;
};
static const dllm__splitk_config dllm__splitk_configs[] = {
    {32, 10, true}, {64, 8, true}, {128, 6, true}, {128, 6, false}};
static const int dllm__splitk_configs_n = 4, dllm__splitk_spread_rows = 128, dllm__splitk_tile = 128;
static const int dllm__splitk_max_tiles = 1024;  // the tile counters at the workspace's start: N up to 131072

static size_t dllm__splitk_smem(const dllm__splitk_config &c) {
    return (size_t)c.ns * (128 + c.nt) * 128 + 1024 + 16 * c.ns;
}

static std::string dllm__splitk_name(const dllm__splitk_config &c) {
    return dllm__format("gemm_splitk<%d,%d,%s>", c.ns, c.nt, c.spread ? "true" : "false");
}

/* Whether gemm_splitk takes an n x k weight: whole 128-feature tiles, k in 64-wide steps, 16-byte aligned operands. */
static bool dllm__splitk_takes(const void *X, const void *W, const void *Y, int n, int k) {
    return n > 0 && k > 0 && n % dllm__splitk_tile == 0 && k % 64 == 0 &&
           ((uintptr_t)X | (uintptr_t)W | (uintptr_t)Y) % 16 == 0;
}

/* The split of an n x k weight on a GPU of sm_count SMs: the one (of those dividing k's 64-wide steps into ranges of
 * at least 4 steps, up to 8) whose busiest SM runs the fewest steps when every (tile, split) unit is spread over
 * the SMs, the smallest on a tie. It depends on the shape and the GPU alone, so a row's bits never depend on M. */
static int dllm__splitk_splits(int n, int k, int sm_count) {
    const int tiles = n / dllm__splitk_tile, steps = k / 64;
    int best = 1;
    long long best_cost = -1;
    for (int s = 1; s <= 8; s++) {
        if (steps % s || steps / s < 4) continue;
        const long long waves = ((long long)tiles * s + sm_count - 1) / sm_count, cost = waves * (steps / s);
        if (best_cost < 0 || cost < best_cost) best = s, best_cost = cost;
    }
    return best;
}

/* The workspace of an n-row weight, in 4-byte words: the tile counters (cnt, at a fixed place whatever the weight,
 * so that one zeroed buffer serves every GEMM), then SPREAD's partials at its most tokens (ws). */
static size_t dllm__splitk_workspace_floats(int n, int splits) {
    return dllm__splitk_max_tiles + (size_t)(n / dllm__splitk_tile) * splits * 256 * (dllm__splitk_spread_rows / 2);
}

static dllm__jit_request dllm__module_gemm_splitk(const dllm__arch &arch) {
    std::vector<std::string> names;
    for (const dllm__splitk_config &c : dllm__splitk_configs) names.push_back(dllm__splitk_name(c));
    return {"dllm_gemm_splitk",
            dllm__src_prelude() + dllm__src_mma + dllm__src_hopper +
                DLLM__XSTR(struct gemm_splitk_args{DLLM__GEMM_SPLITK_ARGS_FIELDS(DLLM__FIELD)};) "\n" +
                dllm__src_gemm_splitk,
            names, arch.target};
}

/* gemm_splitk's maps (gemm_splitk_maps on the device). */
struct dllm__splitk_maps {
    CUtensorMap x, w;
};

/* gemm_splitk loaded for one device. */
struct dllm__gemm_splitk {
    std::shared_ptr<dllm__module> module;
    dllm__kernel<void(gemm_splitk_args, dllm__splitk_maps)> kernel[dllm__splitk_configs_n];
    int sm_count = 0;
};

/* The module for the current device (sm_90a only: wgmma, TMA). */
static dllm_status dllm__gemm_splitk_load(const dllm__arch &a, dllm__gemm_splitk &out) {
    if (a.cc != 90 || !dllm__tensor_map_encoder())
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "gemm_splitk runs on sm_90a (wgmma, TMA) only, this GPU is sm_%d",
                          a.cc);
    DLLM__TRY(dllm__jit_load(dllm__module_gemm_splitk(a), out.module));
    int dev = 0;
    DLLM__CUDA(cudaGetDevice(&dev));
    DLLM__CUDA(cudaDeviceGetAttribute(&out.sm_count, cudaDevAttrMultiProcessorCount, dev));
    for (int i = 0; i < dllm__splitk_configs_n; i++) {
        const dllm__splitk_config &c = dllm__splitk_configs[i];
        out.kernel[i].fn = out.module->kernels.at(dllm__splitk_name(c)), out.kernel[i].name = "gemm_splitk";
        DLLM__CUDA(cudaFuncSetAttribute((const void *)out.kernel[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)dllm__splitk_smem(c)));
    }
    return DLLM_OK;
}

/* Y [M x N] (bf16) = X [M x K] . W [N x K]^T, every row the bits it has at any other M: SPREAD at up to 128 rows, the
 * other mode in launches of 128-row token tiles above, on as many CTAs as there are units (at most one an SM). ws: the
 * dllm__splitk_workspace_floats(N, splits) floats, its counters zero (the launches leave them zero). */
static dllm_status dllm__gemm_splitk_run(const dllm__gemm_splitk &k, const void *X, const void *W, void *Y, int M,
                                         int N, int K, float *ws, size_t ws_floats, cudaStream_t stream) {
    if (!dllm__splitk_takes(X, W, Y, N, K) || N / dllm__splitk_tile > dllm__splitk_max_tiles || M < 0)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "gemm_splitk: M = %d, N = %d, K = %d: N must be a multiple of 128, K of 64, the operands "
                          "16-byte aligned",
                          M, N, K);
    const int splits = dllm__splitk_splits(N, K, k.sm_count);
    if (M == 0) return DLLM_OK;
    const bool spread = M <= dllm__splitk_spread_rows;
    if (spread && splits > 1 && (!ws || ws_floats < dllm__splitk_workspace_floats(N, splits)))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "gemm_splitk: a workspace of %zu floats is required (%zu given)",
                          dllm__splitk_workspace_floats(N, splits), ws_floats);
    int i = 0;
    while (dllm__splitk_configs[i].spread != spread || dllm__splitk_configs[i].nt < std::min(M, 128))
        i++;  // the smallest tile that holds M (SPREAD), else 128 tokens
    const dllm__splitk_config &c = dllm__splitk_configs[i];
    dllm__splitk_maps maps;
    if (!dllm__tensor_map(maps.x, X, K, M, 1, (uint64_t)K, 0, c.nt) ||
        !dllm__tensor_map(maps.w, W, K, N, 1, (uint64_t)K, 0, dllm__splitk_tile))
        return dllm__fail(DLLM_ERR_CUDA, "the driver refused a TMA tensor map for gemm_splitk (M=%d N=%d K=%d)", M, N,
                          K);
    gemm_splitk_args a = {};
    a.y = (bf16_t *)Y, a.cnt = (int *)ws, a.ws = ws ? ws + dllm__splitk_max_tiles : nullptr;
    a.m = M, a.n = N, a.k = K, a.splits = splits;
    const int units = N / dllm__splitk_tile * (spread ? splits : (M + c.nt - 1) / c.nt);
    return k.kernel[i].launch({dim3((unsigned)std::min(units, k.sm_count)), dim3(384), dllm__splitk_smem(c)}, stream, a,
                              maps);
}
