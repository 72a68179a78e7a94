/* src/gpu/gemm_splitk.cpp - [row-independent GEMM] gemm_splitk: BF16 GEMMs whose rows get the same bits at any row
 * count, fast at a few rows (src/kernels/gemm_splitk.cuh): the split per shape, loading, and the launcher. */

/* gemm_splitk's arguments (host/kernel contract, declared in its own module). */
#define DLLM__GEMM_SPLITK_ARGS_FIELDS(X)                                                                               \
    X(bf16_t *, y)  /* [m][n] */                                                                                       \
    X(float *, ws)  /* SPREAD: [n / 128][max_pieces][256 NT / 2] fp32 partials */                                      \
    X(int *, cnt)   /* SPREAD: [n / 128] pieces counted a tile: zero before a launch, left zero after */               \
    X(int, m) X(int, n) X(int, k)                                                                                      \
    X(int, chunk) X(int, chunks) X(int, ctas) X(int, max_pieces) /* the cut: dllm__splitk_cut */
struct gemm_splitk_args {
    DLLM__GEMM_SPLITK_ARGS_FIELDS(DLLM__FIELD)
};
static_assert(sizeof(gemm_splitk_args) == 56, "contract layout");

static const char *dllm__src_gemm_splitk = DLLM__KERNEL_FILE("gemm_splitk.cuh");

/* Its configurations: NT tokens a tile, NS ring slots (each a 16 KB weight box and NT x 128 bytes of tokens, about
 * 192 KB in all), SPREAD (see the kernel). SPREAD takes one tile of at most 128 tokens: at 128 its partials (written
 * and read back) already move half the weights' bytes at K = 4096 in 4 pieces. The other mode's tiles are 128 tokens:
 * a piece's partial needs a second set of accumulators. */
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

/* The stream-K cut of an n x k weight on a GPU of sm_count SMs (gemm_splitk.cuh): a tile's K in chunks of 4 k-steps
 * (2 or 1 where K's 64-wide steps are not a multiple), the tiles' chunks end to end in one range an SM (fewer where
 * there are fewer chunks). It depends on the shape and the GPU alone, so a row's bits never depend on M. */
struct dllm__splitk_cut {
    int chunk, chunks, ctas, max_pieces;
};

/* The first chunk of range r and the range holding chunk x (the kernel's splitk_cut_start, splitk_range_of). */
static int dllm__splitk_cut_start(const dllm__splitk_cut &c, int tiles, int r) {
    return (int)((long long)r * tiles * c.chunks / c.ctas);
}
static int dllm__splitk_range_of(const dllm__splitk_cut &c, int tiles, int x) {
    const long long w = (long long)tiles * c.chunks;
    return (int)(((long long)(x + 1) * c.ctas + w - 1) / w) - 1;
}

static dllm__splitk_cut dllm__splitk_cut_of(int n, int k, int sm_count) {
    const int tiles = n / dllm__splitk_tile, steps = k / 64;
    dllm__splitk_cut c = {1, 1, 1, 1};
    if (tiles < 1 || steps < 1) return c;  // a shape gemm_splitk does not take (dllm__splitk_takes): no cut
    c.chunk = steps % 4 == 0 ? 4 : steps % 2 == 0 ? 2 : 1;
    c.chunks = steps / c.chunk;
    c.ctas = (int)std::min<long long>(std::max(sm_count, 1), (long long)tiles * c.chunks);
    // Ranges hold at least q chunks, so at most ceil((chunks - 1) / q) of their starts fall inside a tile.
    const int q = (int)((long long)tiles * c.chunks / c.ctas);
    c.max_pieces = (c.chunks - 1 + q - 1) / q + 1;
    return c;
}

/* The workspace of an n-row weight, in 4-byte words: the tile counters (cnt, at a fixed place whatever the weight,
 * so that one zeroed buffer serves every GEMM), then SPREAD's partials at its most tokens (ws). */
static size_t dllm__splitk_workspace_floats(int n, const dllm__splitk_cut &c) {
    return dllm__splitk_max_tiles +
           (size_t)(n / dllm__splitk_tile) * c.max_pieces * 256 * (dllm__splitk_spread_rows / 2);
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

/* Y [M x N] (bf16) = X [M x K] . W [N x K]^T, every row the bits it has at any other M: SPREAD at up to 128 rows (one
 * CTA a range of the cut), the other mode in 128-row token tiles above (as many CTAs as units, at most one an SM). ws:
 * the dllm__splitk_workspace_floats(N, cut) floats, its counters zero (the launches leave them zero). */
static dllm_status dllm__gemm_splitk_run(const dllm__gemm_splitk &k, const void *X, const void *W, void *Y, int M,
                                         int N, int K, float *ws, size_t ws_floats, cudaStream_t stream) {
    if (!dllm__splitk_takes(X, W, Y, N, K) || N / dllm__splitk_tile > dllm__splitk_max_tiles || M < 0)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "gemm_splitk: M = %d, N = %d, K = %d: N must be a multiple of 128, K of 64, the operands "
                          "16-byte aligned",
                          M, N, K);
    if (M == 0) return DLLM_OK;
    const dllm__splitk_cut cut = dllm__splitk_cut_of(N, K, k.sm_count);
    const bool spread = M <= dllm__splitk_spread_rows;
    if (spread && cut.max_pieces > 1 && (!ws || ws_floats < dllm__splitk_workspace_floats(N, cut)))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "gemm_splitk: a workspace of %zu floats is required (%zu given)",
                          dllm__splitk_workspace_floats(N, cut), ws_floats);
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
    a.m = M, a.n = N, a.k = K;
    a.chunk = cut.chunk, a.chunks = cut.chunks, a.ctas = cut.ctas, a.max_pieces = cut.max_pieces;
    const int ctas = spread ? cut.ctas : std::min(N / dllm__splitk_tile * ((M + c.nt - 1) / c.nt), k.sm_count);
    return k.kernel[i].launch({dim3((unsigned)ctas), dim3(384), dllm__splitk_smem(c)}, stream, a, maps);
}
