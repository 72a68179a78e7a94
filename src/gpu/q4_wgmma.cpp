/* src/gpu/q4_wgmma.cpp - [W4 GEMM] q4wg: SoloQ's 4-bit weights on Hopper's wgmma, integer ones (SoloQ-I, RTN-W4A4:
 * q4wg_gemm) and NVFP4 ones (SoloQ-N: q4wg_gemm_nv): the packed layouts, the kernels' configurations, loading, and the
 * launchers. */

/* q4wg_gemm's arguments (host/kernel contract, declared in its own module). */
#define DLLM__Q4WG_ARGS_FIELDS(X)                                                                                      \
    X(const signed char *, x) /* [M][ldx] int8 token C values (act_.q4a8), 16-byte aligned rows */                     \
    X(const float *, s_x)     /* [M] token scales */                                                                   \
    X(const void *, w)        /* the packed weights (q4wg_prepack, q4wg_prepack_nv), 16-byte aligned */                \
    X(const float *, s_w)     /* [N] row scales */                                                                     \
    X(bf16_t *, y)            /* [M][ldy] */                                                                           \
    X(int *, ws)              /* [N / 128][NT * 128] int32 split-K sums: zero before a launch, left zero after */      \
    X(int *, cnt)             /* [N / 128] k blocks (q4wg_gemm_nv: chunks) summed per tile: likewise */                \
    X(const bf16_t *, xb)     /* q4wg_gemm_nv: [M][ldx] bf16 token C values, 16-byte aligned rows */                   \
    X(float *, wsf)           /* q4wg_gemm_nv: [N / 128][ksplit][NT * 128] fp32 chunk partials (any content) */        \
    X(int, ksplit)            /* q4wg_gemm_nv: K chunks a tile (dllm__q4wg_nv_ksplit) */                               \
    X(long long, ldx) X(long long, ldy) X(int, M) X(int, N) X(int, K)
struct q4wg_args {
    DLLM__Q4WG_ARGS_FIELDS(DLLM__FIELD)
};
static_assert(sizeof(q4wg_args) == 112, "contract layout");

/* [kernel table] the q4wg module's plain kernels; q4wg_gemm and q4wg_gemm_nv are templates, looked up by name
 * (dllm__q4wg_name). */
#define DLLM__Q4WG_KERNELS(X)                                                                                          \
    X(q4wg_prepack, , (const unsigned char *rows, int n, int k, unsigned char *packed))                                \
    X(q4wg_prepack_nv, ,                                                                                               \
      (const unsigned char *rows, const unsigned char *block_scales, int n, int k, u32 *packed, int *nan_scales))
DLLM__Q4WG_KERNELS(DLLM__KERNEL_SIGNATURE)

static const char *dllm__src_q4_wgmma = DLLM__KERNEL_FILE("q4_wgmma.cuh");

/* q4wg_gemm's configurations by token rows (wgmma's N): NT tokens, WGS warpgroups of R 64-row tiles (128 features a
 * CTA in each), P k blocks of 128 a group, SG activation stages. Measured on an H200 (dllm-bench --q4-gemm-only):
 * memory-bound at 32 and 64 tokens, where two CTAs an SM keep 64 KB of weights in flight each. */
struct dllm__q4wg_config {
    int nt, wgs, r, p, sg;
};
static constexpr dllm__q4wg_config dllm__q4wg_configs[] = {
    {32, 1, 2, 4, 3}, {64, 1, 2, 4, 3}, {128, 2, 1, 4, 3}, {256, 2, 1, 2, 3}};
/* q4wg_gemm_nv's (SoloQ-N), 128 features a CTA in each (the summation order's tiles), the same NT steps: P = 2 at 64
 * tokens (the bf16 stages are twice the int8 ones), one k block a group from 128 (NT = 256: three stages of 64 KB; NT
 * = 128: the registers of the second set of accumulators that many rows fold into). At 32 tokens the four LLaDA-8B
 * projections took 0.551x cuBLASLt BF16's time (H100). */
static constexpr dllm__q4wg_config dllm__q4wg_nv_configs[] = {
    {32, 1, 2, 4, 3}, {64, 1, 2, 2, 3}, {128, 2, 1, 1, 3}, {256, 2, 1, 1, 3}};
static const int dllm__q4wg_configs_n = 4, dllm__q4wg_max_rows = 256, dllm__q4wg_tile = 128;
/* The q4wg_gemm_nv configuration of more than dllm__q4wg_max_rows rows: 128 tokens, the most that leave room for a
 * second set of accumulators (the kernel's FOLD). */
static const int dllm__q4wg_nv_fold_config = 2;
static_assert(dllm__q4wg_nv_configs[dllm__q4wg_nv_fold_config].nt == 128, "q4wg_gemm_nv folds at NT = 128 only");

/* q4wg_gemm_nv's tile counters lead its workspace (their place must not depend on the shape: one workspace serves every
 * layer linear, and only the counters must stay zero), the fp32 chunk partials follow; so N is at most 1024 tiles. */
static const int dllm__q4wg_nv_counters = 1024;

/* Activation stages of 128-byte token rows: int8 (one a k block of 128) or bf16 (two). */
static size_t dllm__q4wg_smem(const dllm__q4wg_config &c, dllm__q4_format f) {
    return (size_t)c.sg * c.nt * 128 * c.p * (f == DLLM__Q4_NVFP4 ? 2 : 1) + 1024;
}

static std::string dllm__q4wg_name(const dllm__q4wg_config &c, dllm__q4_format f) {
    if (f == DLLM__Q4_NVFP4) return dllm__format("q4wg_gemm_nv<%d,%d,%d,%d,%d>", c.nt, c.wgs, c.r, c.p, c.sg);
    return dllm__format("q4wg_gemm<%d,%d,%d,%d,%d,%d>", c.nt, (int)f, c.wgs, c.r, c.p, c.sg);
}

/* Whether q4wg takes an n x k weight of format f: integer or NVFP4 codes, whole 128-feature tiles (NVFP4: at most
 * dllm__q4wg_nv_counters of them) and 512-wide k groups. */
static bool dllm__q4wg_takes(dllm__q4_format f, int n, int k) {
    const bool format = f == DLLM__Q4_INT4 || f == DLLM__Q4_RTN ||
                        (f == DLLM__Q4_NVFP4 && n / dllm__q4wg_tile <= dllm__q4wg_nv_counters);
    return format && n > 0 && k > 0 && n % dllm__q4wg_tile == 0 && k % 512 == 0;
}

/* The configuration of a launch of `rows` (1 to dllm__q4wg_max_rows) token rows: the smallest NT that holds them (the
 * same index in both tables). */
static int dllm__q4wg_config_for(int rows) {
    int i = 0;
    while (i + 1 < dllm__q4wg_configs_n && dllm__q4wg_configs[i].nt < rows) i++;
    return i;
}

/* q4wg_gemm_nv's K chunks a 128-feature tile of an n x k weight: the fewest (each a multiple of 4 k blocks, so every
 * configuration's groups fit) that give at least 132 (tile, chunk) units, an H100's SM count as a constant. A
 * function of (n, k) only, never of the GPU, M or the grid: it fixes the summation order, hence the bits (LLaDA-8B:
 * QKV 2, O 8, gate|up 1, down 6). */
static int dllm__q4wg_nv_ksplit(int n, int k) {
    const int tiles = n / dllm__q4wg_tile, kb = k / 128;
    int best = 1;
    for (int ks = 1; ks <= kb; ks++)
        if (kb % ks == 0 && (kb / ks) % 4 == 0) {
            best = ks;
            if (tiles * ks >= 132) break;
        }
    return best;
}

/* The int32 workspace (ws) of an n-row weight, and the tile counters (cnt) after it: zeroed once, kept zero. */
static size_t dllm__q4wg_workspace_ints(int n) { return (size_t)n * dllm__q4wg_max_rows + (size_t)n / dllm__q4wg_tile; }

/* q4wg_gemm_nv's workspace for launches of up to `rows` token rows of an n x k weight, in 4-byte words: the tile
 * counters (zeroed once, kept zero), then the fp32 chunk partials of the configuration those rows take. */
static size_t dllm__q4wg_nv_workspace_ints(int n, int k, int rows) {
    const int ks = dllm__q4wg_nv_ksplit(n, k);
    const int nt = dllm__q4wg_nv_configs[dllm__q4wg_config_for(std::min(std::max(rows, 1), dllm__q4wg_max_rows))].nt;
    return dllm__q4wg_nv_counters + (ks > 1 ? (size_t)(n / dllm__q4wg_tile) * ks * nt * dllm__q4wg_tile : 0);
}

static dllm__jit_request dllm__module_q4wg(const dllm__arch &arch) {
    std::vector<std::string> names = {DLLM__Q4WG_KERNELS(DLLM__KERNEL_NAME)};
    for (dllm__q4_format f : {DLLM__Q4_INT4, DLLM__Q4_RTN})
        for (const dllm__q4wg_config &c : dllm__q4wg_configs) names.push_back(dllm__q4wg_name(c, f));
    for (const dllm__q4wg_config &c : dllm__q4wg_nv_configs) names.push_back(dllm__q4wg_name(c, DLLM__Q4_NVFP4));
    return {
        "dllm_q4wg",
            dllm__src_prelude() + DLLM__XSTR(struct q4wg_args{DLLM__Q4WG_ARGS_FIELDS(DLLM__FIELD)};) "\n" +
                DLLM__Q4WG_KERNELS(DLLM__KERNEL_DECLARE) + dllm__src_mma + dllm__src_hopper + dllm__src_q4_wgmma,
            names, arch.target
    };
}

/* q4wg loaded for one device: the prepack kernels and the GEMM per (format, configuration) with its occupancy. */
struct dllm__q4wg_kernels {
    std::shared_ptr<dllm__module> module;
    dllm__kernel<dllm__sig_q4wg_prepack> prepack;
    dllm__kernel<dllm__sig_q4wg_prepack_nv> prepack_nv;
    dllm__kernel<void(q4wg_args)> gemm[3][dllm__q4wg_configs_n];  // [INT4, RTN, NVFP4][configuration]
    int ctas_per_sm[3][dllm__q4wg_configs_n] = {};
    int sm_count = 0;
};

static int dllm__q4wg_format_index(dllm__q4_format f) { return f == DLLM__Q4_INT4 ? 0 : f == DLLM__Q4_RTN ? 1 : 2; }

static const dllm__q4wg_config &dllm__q4wg_config_of(dllm__q4_format f, int i) {
    return (f == DLLM__Q4_NVFP4 ? dllm__q4wg_nv_configs : dllm__q4wg_configs)[i];
}

/* The module for the current device (sm_90a only: wgmma) and its kernels' limits. */
static dllm_status dllm__q4wg_load(const dllm__arch &a, dllm__q4wg_kernels &out) {
    if (a.cc != 90)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "q4wg runs on sm_90a (wgmma) only, this GPU is sm_%d", a.cc);
    DLLM__TRY(dllm__jit_load(dllm__module_q4wg(a), out.module));
    int dev = 0;
    DLLM__CUDA(cudaGetDevice(&dev));
    DLLM__CUDA(cudaDeviceGetAttribute(&out.sm_count, cudaDevAttrMultiProcessorCount, dev));
    out.prepack.fn = out.module->kernels.at("q4wg_prepack"), out.prepack.name = "q4wg_prepack";
    out.prepack_nv.fn = out.module->kernels.at("q4wg_prepack_nv"), out.prepack_nv.name = "q4wg_prepack_nv";
    for (dllm__q4_format f : {DLLM__Q4_INT4, DLLM__Q4_RTN, DLLM__Q4_NVFP4})
        for (int i = 0; i < dllm__q4wg_configs_n; i++) {
            const dllm__q4wg_config &c = dllm__q4wg_config_of(f, i);
            const int fi = dllm__q4wg_format_index(f);
            dllm__kernel<void(q4wg_args)> &k = out.gemm[fi][i];
            k.fn = out.module->kernels.at(dllm__q4wg_name(c, f));
            k.name = f == DLLM__Q4_NVFP4 ? "q4wg_gemm_nv" : "q4wg_gemm";
            DLLM__CUDA(cudaFuncSetAttribute((const void *)k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)dllm__q4wg_smem(c, f)));
            DLLM__CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&out.ctas_per_sm[fi][i], (const void *)k.fn,
                                                                     128 * c.wgs, dllm__q4wg_smem(c, f)));
            out.ctas_per_sm[fi][i] = std::max(1, out.ctas_per_sm[fi][i]);
        }
    return DLLM_OK;
}

/* An n x k weight's canonical codes (section 9b's rows; NVFP4 with its block scales) into q4wg's layout on the device,
 * in place of W.data (NVFP4: of the block scales too, which the layout holds: the same bytes as before). A NVFP4 weight
 * with a NaN block scale is refused: the layout cannot hold one. */
static dllm_status dllm__q4wg_pack(const dllm__q4wg_kernels &k, dllm__linear &W, cudaStream_t stream) {
    const bool nv = W.q4->format == DLLM__Q4_NVFP4;
    dllm__dbuf packed, nan_scales;
    DLLM__TRY(packed.fit((size_t)W.n * W.k / 2 + (nv ? (size_t)W.n * W.k / 16 : 0), "SoloQ weights (q4wg layout)"));
    const size_t bytes = packed.bytes;
    if (!nv) {
        DLLM__TRY(k.prepack.launch({dim3((unsigned)std::min<size_t>((bytes + 255) / 256, 65535)), dim3(256)}, stream,
                                   W.data.ptr, W.n, W.k, packed.ptr));
    } else {
        DLLM__TRY(nan_scales.fit(4, "q4wg's NaN count"));
        DLLM__CUDA(cudaMemsetAsync(nan_scales.ptr, 0, 4, stream));
        DLLM__TRY(k.prepack_nv.launch({dim3((unsigned)std::min<size_t>((bytes / 4 + 255) / 256, 65535)), dim3(256)},
                                      stream, W.data.ptr, W.q4->block_scales.ptr, W.n, W.k, packed.as<u32>(),
                                      nan_scales.as<int>()));
    }
    DLLM__CUDA(cudaStreamSynchronize(stream));
    if (nv) {
        int nan = 0;
        DLLM__CUDA(cudaMemcpy(&nan, nan_scales.ptr, 4, cudaMemcpyDeviceToHost));
        if (nan)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "SoloQ-N weight %d x %d: %d NaN block scales (UE4M3 0x7F / 0xFF); NVFP4 weights need "
                              "finite scales",
                              W.n, W.k, nan);
        W.q4->block_scales = dllm__dbuf();
    }
    W.data = std::move(packed);
    W.q4->packed = true;
    return DLLM_OK;
}

static_assert(dllm__q4wg_configs[dllm__q4wg_configs_n - 2].nt == 128 &&
                  dllm__q4wg_configs[dllm__q4wg_configs_n - 1].nt == 256,
              "dllm__q4wg_many_rows_config chooses between the last two configurations: 128 and 256 tokens");

/* q4wg_gemm's configuration for M rows of an N-row weight: at most 256 rows, the smallest that holds them; more, chunks
 * of 256 or 128 tokens, whichever takes fewer waves of whole (tile, chunk) units times the tokens a unit computes (a
 * unit of 256 tokens on every SM at once beats two rounds of 128; 64 units of 256 on 132 SMs do not). */
static int dllm__q4wg_many_rows_config(const dllm__q4wg_kernels &k, int fi, int M, int N) {
    if (M <= dllm__q4wg_max_rows) return dllm__q4wg_config_for(M);
    auto cost = [&](int i) {
        const int nt = dllm__q4wg_configs[i].nt, units = N / dllm__q4wg_tile * ((M + nt - 1) / nt);
        const int slots = std::max(1, k.ctas_per_sm[fi][i] * k.sm_count);
        return (long long)((units + slots - 1) / slots) * nt;
    };
    const int i256 = dllm__q4wg_configs_n - 1, i128 = i256 - 1;
    return cost(i128) < cost(i256) ? i128 : i256;
}

/* y [M x N] (bf16) = ((float)(X . C_w^T) s_x) s_w: X int8 token C values [M][K], the weights packed
 * (dllm__q4wg_pack) in format f. One launch: at most 256 rows on the smallest configuration that holds them, split over
 * every resident CTA (capped at the groups); more rows in chunks of tokens (dllm__q4wg_many_rows_config), whole tiles a
 * CTA. The sums are exact integers, so the configuration and the split give every row the bits of dllm__cpu_i8_gemm
 * whatever M is. ws: the dllm__q4wg_workspace_ints(N) ints, zero (the launches leave them zero). */
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
    if (M == 0) return DLLM_OK;
    const int fi = dllm__q4wg_format_index(f), i = dllm__q4wg_many_rows_config(k, fi, M, N);
    const dllm__q4wg_config &c = dllm__q4wg_configs[i];
    const int chunks = (M + c.nt - 1) / c.nt, units = N / dllm__q4wg_tile * chunks;
    q4wg_args a = {};
    a.x = x, a.s_x = s_x, a.w = packed, a.s_w = s_w, a.y = y, a.ws = ws, a.cnt = ws + (size_t)N * dllm__q4wg_max_rows;
    a.ldx = K, a.ldy = N, a.M = M, a.N = N, a.K = K;
    const int work = chunks == 1 ? units * (K / 128 / c.p) : units;
    const int grid = std::max(1, std::min(work, k.ctas_per_sm[fi][i] * k.sm_count));
    return k.gemm[fi][i].launch({dim3((unsigned)grid), dim3((unsigned)(128 * c.wgs)), dllm__q4wg_smem(c, f)}, stream,
                                a);
}

/* y [M x N] (bf16) = (((acc 2^20) s_x) s_w) for SoloQ-N: X the tokens' bf16 C values [M][K] (NVFP4, exact in bf16),
 * the weights packed (dllm__q4wg_pack, NVFP4), acc q4wg_gemm_nv's fp32 sum in its fixed order (dllm__q4wg_nv_ksplit
 * of (N, K) chunks a tile, folded left to right). One launch: at most 256 rows on the smallest configuration that holds
 * them; more rows on the 128-token one, whole (tile, 128 tokens) units a CTA, their K chunks folded in registers.
 * Every configuration sums a row in the same order, so a row's bits depend on neither M nor the other rows; they equal
 * dllm__cpu_q4_gemm's up to that order. ws: dllm__q4wg_nv_workspace_ints(N, K, M) words, its tile counters zero (the
 * launches leave them zero). */
static dllm_status dllm__q4wg_gemm_nv_run(const dllm__q4wg_kernels &k, const void *packed, const float *s_w,
                                          const bf16_t *x, const float *s_x, bf16_t *y, int M, int N, int K, int *ws,
                                          size_t ws_ints, cudaStream_t stream) {
    if (!dllm__q4wg_takes(DLLM__Q4_NVFP4, N, K) || M < 0)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "q4wg_gemm_nv: N = %d, K = %d, M = %d: it takes N a multiple of 128 (at most %d tiles) and "
                          "K of 512",
                          N, K, M, dllm__q4wg_nv_counters);
    if (ws_ints < dllm__q4wg_nv_workspace_ints(N, K, M) || !ws || !s_x || (uintptr_t)x % 16 || (uintptr_t)packed % 16)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "q4wg_gemm_nv: token scales, a workspace of %zu words (%zu given) and 16-byte aligned "
                          "inputs are required",
                          dllm__q4wg_nv_workspace_ints(N, K, M), ws_ints);
    if (M == 0) return DLLM_OK;
    const int ks = dllm__q4wg_nv_ksplit(N, K), fi = dllm__q4wg_format_index(DLLM__Q4_NVFP4);
    const int i = M > dllm__q4wg_max_rows ? dllm__q4wg_nv_fold_config : dllm__q4wg_config_for(M);
    const dllm__q4wg_config &c = dllm__q4wg_nv_configs[i];
    const int chunks = (M + c.nt - 1) / c.nt, tiles = N / dllm__q4wg_tile;
    q4wg_args a = {};
    a.xb = x, a.s_x = s_x, a.w = packed, a.s_w = s_w, a.y = y;
    a.cnt = ws, a.wsf = (float *)(ws + dllm__q4wg_nv_counters);
    a.ldx = K, a.ldy = N, a.M = M, a.N = N, a.K = K, a.ksplit = ks;
    const int units = chunks > 1 ? tiles * chunks : tiles * ks;
    const int grid = std::max(1, std::min(units, k.ctas_per_sm[fi][i] * k.sm_count));
    return k.gemm[fi][i].launch({dim3((unsigned)grid), dim3((unsigned)(128 * c.wgs)),
                                 dllm__q4wg_smem(c, DLLM__Q4_NVFP4)},
                                stream, a);
}
