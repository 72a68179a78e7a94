/* src/gpu/gemm.cpp - GEMMs: cuBLASLt (BF16, block-scaled FP8) and gemm_wg, one algorithm per shape. */

// ---------------------------------------------------------------------------------------------------
// 15. GPU: cuBLASLt GEMMs, and dllm's own (gemm_wg: a BF16 candidate; fp8_gemm)
//     Row-major Y[M x N] = X[M x K] . W[N x K]^T is cuBLAS's column-major Y^T = W^T(op T) . X^T: m = N,
//     n = M, k = K, A = W with TRANSA = T, B = X. BF16 in, FP32 accumulate, BF16 or FP32 out; or E4M3
//     in with block scales (dllm_precision), BF16 out. The algorithm is chosen once per (kind, M, N, K,
//     out type) and cached; on sm_90a gemm_wg (TMA and wgmma, through the tensor maps below, which the wgmma
//     attention reads through too) is one more candidate of each BF16 shape. Where cuBLASLt has no block-scaled FP8
//     (sm_89), fp8_gemm takes the same operands. [INT8 GEMM] (run_i8): int8 in, int32 out, exact sums, for SoloQ's
//     integer C values (gemm_q4, section 16).
// ---------------------------------------------------------------------------------------------------

/* cuTensorMapEncodeTiled, fetched from the driver once through the runtime (dllm never links libcuda); null where
 * the driver lacks it. */
static PFN_cuTensorMapEncodeTiled_v12000 dllm__tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
                cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            p = nullptr;
        return (PFN_cuTensorMapEncodeTiled_v12000)p;
    }();
    return fn;
}

/* A TMA map over bf16 rows [batch][rows][width], row_stride and batch_stride elements apart, read in boxes of 64
 * columns x box_rows rows in the 128-byte swizzle, zeros past the rows and columns (tensor_map in dllm__src_hopper). */
static bool dllm__tensor_map(CUtensorMap &map, const void *base, int width, int rows, int batch, uint64_t row_stride,
                             uint64_t batch_stride, int box_rows) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = dllm__tensor_map_encoder();
    if (!encode) return false;
    if (batch == 1) batch_stride = (uint64_t)rows * row_stride;  // unused, but must be a valid stride
    cuuint64_t dims[3] = {(cuuint64_t)width, (cuuint64_t)rows, (cuuint64_t)batch},
               strides[2] = {row_stride * 2, batch_stride * 2};
    cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, steps[3] = {1, 1, 1};
    return encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void *>(base), dims, strides, box, steps,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* gemm_wg's X, W and Y maps (gemm_tensor_maps on the device). */
struct dllm__gemm_tensor_maps {
    CUtensorMap x, w, y;
};

/* dllm's Hopper GEMM (dllm__src_gemm_wg) for one tile width, loaded for one device. */
struct dllm__gemm_wg {
    std::shared_ptr<dllm__module> module;
    dllm__kernel<void(gemm_wg_args, dllm__gemm_tensor_maps)> kernel;
    size_t smem = 0;
    int clusters = 0;  // clusters of two CTAs the GPU holds at once
    int bn = 256;      // output tile width: 256, or 128 (DLLM_TILES batch_gemm_n)
    /* Whether it runs Y [M x N] = X . W^T: whole bn-wide column tiles, 16-byte rows and bases for TMA. */
    bool fits(const void *X, const void *W, const void *Y, int N, int K) const {
        return kernel.fn && N > 0 && N % bn == 0 && K % 8 == 0 &&
               ((uintptr_t)X | (uintptr_t)W | (uintptr_t)Y) % 16 == 0;
    }
};

/* Loads gemm_wg with tiles bn wide (256 or 128) for the current device where the table has it and the driver encodes
 * tensor maps; leaves k empty otherwise. */
static dllm_status dllm__gemm_wg_load(const dllm__arch &a, int bn, dllm__gemm_wg &k) {
    if (!a.gemm_wg_stages || !dllm__tensor_map_encoder()) return DLLM_OK;
    if (bn != 256 && bn != 128 && bn != 64)
        return dllm__fail(DLLM_ERR_INTERNAL, "gemm_wg has no tiles %d wide (256, 128 or 64)", bn);
    DLLM__TRY(dllm__jit_load(dllm__module_gemm_wg(a, bn), k.module));
    cudaKernel_t kernel = k.module->kernels.at(dllm__gemm_wg_name(a, bn));
    k.smem = dllm__gemm_wg_smem(a, bn);
    k.bn = bn;
    DLLM__CUDA(cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k.smem));
    cudaLaunchAttribute pair = dllm__cluster_attr(2);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(2);
    cfg.blockDim = dim3(384);
    cfg.dynamicSmemBytes = k.smem;
    cfg.attrs = &pair;
    cfg.numAttrs = 1;
    DLLM__CUDA(cudaOccupancyMaxActiveClusters(&k.clusters, (const void *)kernel, &cfg));
    if (k.clusters < 1) return dllm__fail(DLLM_ERR_CUDA, "gemm_wg: the GPU holds no cluster of two of its CTAs");
    k.kernel.fn = kernel, k.kernel.name = "gemm_wg";
    return DLLM_OK;
}

/* Y [M x N] (bf16) = X [M x K] . W [N x K]^T on gemm_wg (k's tile width): as many clusters of two as the GPU holds at
 * once, each walking its tile pairs. */
static dllm_status dllm__gemm_wg_run(const dllm__gemm_wg &k, const void *X, const void *W, void *Y, int M, int N, int K,
                                     cudaStream_t stream) {
    if (!k.fits(X, W, Y, N, K)) return dllm__fail(DLLM_ERR_INTERNAL, "gemm_wg cannot run M=%d N=%d K=%d", M, N, K);
    if (M == 0) return DLLM_OK;
    dllm__gemm_tensor_maps maps;
    if (!dllm__tensor_map(maps.x, X, K, M, 1, (uint64_t)K, 0, 128) ||
        !dllm__tensor_map(maps.w, W, K, N, 1, (uint64_t)K, 0, k.bn / 2) ||
        !dllm__tensor_map(maps.y, Y, N, M, 1, (uint64_t)N, 0, 64))
        return dllm__fail(DLLM_ERR_CUDA, "the driver refused a TMA tensor map for gemm_wg (M=%d N=%d K=%d)", M, N, K);
    const gemm_wg_args args = {M, N, K};
    const int pairs = (M + 255) / 256 * (N / k.bn);
    return k.kernel.launch({dim3((unsigned)(2 * std::min(pairs, k.clusters))), dim3(384), k.smem, 2}, stream, args,
                           maps);
}

/* Split-K algorithms whose partial sums are reduced in place are dropped: their reduction order can depend
 * on timing. Split-K with an out-of-place reduction (a fixed split, summed by a separate pass) is kept: it is
 * deterministic for a given shape and algorithm, and at a few rows over a deep K (a dual-cache block step)
 * it is often all cuBLASLt offers. Every dllm GEMM is deterministic. */
static int dllm__drop_split_k(cublasLtMatmulHeuristicResult_t *res, int found) {
    int kept = 0;
    for (int i = 0; i < found; i++) {
        int splits = 1;
        uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
        size_t written = 0;
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                       sizeof splits, &written);
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                       sizeof scheme, &written);
        bool ordered = splits <= 1 || scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE ||
                       scheme == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
        if (res[i].state == CUBLAS_STATUS_SUCCESS && ordered) res[kept++] = res[i];
    }
    return kept;
}

/* The padding every FP8 GEMM (cuBLASLt's or fp8_gemm) expects of its operands: the quantisers provide it. */
static dllm_status dllm__check_fp8_shape(int M, int K) {
    if (M % 16 || K % dllm__fp8_group)
        return dllm__fail(DLLM_ERR_INTERNAL,
                          "FP8 GEMM with M=%d K=%d: M must be a multiple of 16 and K of 128 (pad them)", M, K);
    return DLLM_OK;
}

static const int dllm__gemm_candidates = 128;  // the heuristic's 32 and their split-K copies
static const int dllm__split_k_max_m = 64;     // rows up to which split-K copies are timed too

struct dllm__gemm_plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
    bool own = false;  // gemm_wg runs this shape instead of cuBLASLt's algo
    ~dllm__gemm_plan() {
        if (desc) dllm__lib.cublasLtMatmulDescDestroy(desc);
        if (a) dllm__lib.cublasLtMatrixLayoutDestroy(a);
        if (b) dllm__lib.cublasLtMatrixLayoutDestroy(b);
        if (c) dllm__lib.cublasLtMatrixLayoutDestroy(c);
    }
};

/* The operands of one GEMM Y[M x N] = X[M x K] . W[N x K]^T. BF16: X and W bf16. FP8 (block-scaled, when
 * x_scale is set): X and W E4M3 with fp32 scales, X per 1x128 group at x_scale[kb * M + m] (VEC128),
 * W per 128x128 block at w_scale[nb * ceil4(K / 128) + kb] (BLK128x128); K a multiple of 128 and M of 16
 * (the quantisers pad), so that the scale tensors' leading dimensions are what cuBLASLt expects. */
struct dllm__gemm_op {
    const void *X, *W;
    void *Y;
    int M, N, K;
    cudaDataType_t out_type;
    const float *x_scale, *w_scale;
    bool i8 = false;  // [INT8 GEMM]: X and W int8, Y int32 (out_type CUDA_R_32I), the sum exact (dllm__gemm::run_i8)
    bool fp8() const { return x_scale != nullptr; }
    const char *kind() const {
        return i8 ? "INT8 (int32 out)" : fp8() ? "FP8 block-scaled (E4M3, 1x128 x 128x128)" : "BF16";
    }
    /* alpha = 1 and beta = 0 in the scale type: int32 for the INT8 GEMM, fp32 otherwise. */
    const void *alpha() const {
        static const float f = 1.0f;
        static const int32_t i = 1;
        return i8 ? (const void *)&i : (const void *)&f;
    }
    const void *beta() const {
        static const float f = 0.0f;
        static const int32_t i = 0;
        return i8 ? (const void *)&i : (const void *)&f;
    }
};

/* The algorithm each GEMM shape runs, chosen once per process and device: every context then computes a shape with the
 * same algorithm, so two contexts (and later the sequences of a batch) give the same bits, and only the first context
 * pays the tuning. Descriptors stay per context (FP8 plans take their scale pointers at each launch). */
struct dllm__gemm_choice {
    cublasLtMatmulAlgo_t algo;
    bool own;
};
static std::mutex dllm__gemm_choices_mutex;
static std::map<std::pair<int, std::string>, dllm__gemm_choice> dllm__gemm_choices;  // (device, plan key)

struct dllm__gemm {
    cublasLtHandle_t handle = nullptr;
    dllm__dbuf workspace;
    const dllm__gemm_wg *own = nullptr;  // dllm's Hopper GEMM, a candidate of every tuned BF16 shape it fits
    std::unordered_map<std::string, std::unique_ptr<dllm__gemm_plan>> plans;
    static const size_t workspace_bytes = 32u << 20;  // Hopper kernels want up to 32 MiB

    ~dllm__gemm() {
        plans.clear();
        if (handle) dllm__lib.cublasLtDestroy(handle);
    }
    dllm_status init() {
        DLLM__TRY(dllm__load_cublaslt());
        DLLM__CUBLAS(dllm__lib.cublasLtCreate(&handle));
        return workspace.fit(workspace_bytes, "the cuBLASLt workspace");
    }
    /* Descriptors for one shape. FP8: weights BLK128x128 (the A operand), activations VEC128 (B), BF16 out;
     * fast accumulation off, so partial sums are promoted to FP32 (DeepSeek-V3's recipe). */
    dllm_status describe(dllm__gemm_plan &p, const dllm__gemm_op &op) {
        cublasOperation_t ta = CUBLAS_OP_T,
                          tb = CUBLAS_OP_N;  // TN: the one layout cuBLASLt's INT8 (IMMA) kernels take in column order
        const cudaDataType_t in = op.i8 ? CUDA_R_8I : op.fp8() ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
        if (op.i8)
            DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32I, CUDA_R_32I));
        else
            DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        if (op.fp8()) {
            int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                    b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
            int8_t fast_accum = 0;
            DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode,
                                                                  sizeof a_mode));
            DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                                                  sizeof b_mode));
            DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                                                  sizeof fast_accum));
            DLLM__TRY(bind_scales(p, op));  // the heuristic wants to see scale pointers
        }
        DLLM__CUBLAS(dllm__lib.cublasLtMatrixLayoutCreate(&p.a, in, op.K, op.N, op.K));
        DLLM__CUBLAS(dllm__lib.cublasLtMatrixLayoutCreate(&p.b, in, op.K, op.M, op.K));
        DLLM__CUBLAS(dllm__lib.cublasLtMatrixLayoutCreate(&p.c, op.out_type, op.N, op.M, op.N));
        return DLLM_OK;
    }
    /* A plan serves every layer of its shape: the scale pointers are set before each launch. */
    dllm_status bind_scales(dllm__gemm_plan &p, const dllm__gemm_op &op) {
        if (!op.fp8()) return DLLM_OK;
        DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &op.w_scale,
                                                              sizeof op.w_scale));
        DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &op.x_scale,
                                                              sizeof op.x_scale));
        return DLLM_OK;
    }
    /* Descriptors and the algorithm for one shape. The first call times cuBLASLt's best candidates on
     * the real operands and keeps the fastest (the heuristic's first pick is often a few % slower). */
    dllm_status plan(const dllm__gemm_op &op, cudaStream_t stream, dllm__gemm_plan *&out, bool tune) {
        std::string key = dllm__format("%s%s%s%d,%d,%d,%d", tune ? "" : "h:", own ? "wg:" : "",
                                       op.i8      ? "i8:"
                                       : op.fp8() ? "f8:"
                                                  : "",
                                       op.M, op.N, op.K, (int)op.out_type);
        auto it = plans.find(key);
        if (it != plans.end()) {
            out = it->second.get();
            return DLLM_OK;
        }
        std::unique_ptr<dllm__gemm_plan> p(new dllm__gemm_plan);
        DLLM__TRY(describe(*p, op));
        int device = 0;
        DLLM__CUDA(cudaGetDevice(&device));
        std::lock_guard<std::mutex> lock(dllm__gemm_choices_mutex);  // held while tuning: a shape is timed once
        auto chosen = dllm__gemm_choices.find({device, key});
        if (chosen != dllm__gemm_choices.end()) {
            p->algo = chosen->second.algo, p->own = chosen->second.own;
            out = p.get();
            plans[key] = std::move(p);
            return DLLM_OK;
        }
        cublasLtMatmulPreference_t pref;
        DLLM__CUBLAS(dllm__lib.cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = workspace_bytes;
        uint32_t schemes =
            CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;  // no in-place split-K
        dllm__lib.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        dllm__lib.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                       sizeof schemes);
        cublasLtMatmulHeuristicResult_t res[dllm__gemm_candidates];
        int found = 0;
        cublasStatus_t s =
            dllm__lib.cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->a, p->b, p->c, p->c, pref, 32, res, &found);
        dllm__lib.cublasLtMatmulPreferenceDestroy(pref);
        if (s != CUBLAS_STATUS_SUCCESS || found == 0)
            return dllm__fail(DLLM_ERR_CUDA, "cuBLASLt has no %s GEMM algorithm for M=%d N=%d K=%d (status %d)",
                              op.kind(), op.M, op.N, op.K, (int)s);
        found = dllm__drop_split_k(res, found);
        if (found == 0)
            return dllm__fail(
                DLLM_ERR_CUDA,
                "cuBLASLt offers only split-K %s algorithms with an in-place (unordered) reduction for M=%d N=%d K=%d",
                op.kind(), op.M, op.N, op.K);
        p->algo = res[0].algo;
        if (tune && op.M <= dllm__split_k_max_m) found = add_split_k(*p, res, found);
        if (tune && dllm__env().gemm_autotune) DLLM__TRY(fastest(*p, res, found, op, stream));
        dllm__gemm_choices[{device, key}] = {p->algo, p->own};
        out = p.get();
        plans[key] = std::move(p);
        return DLLM_OK;
    }
    /* Appends split-K copies (2..8 shares, reduced out of place, so deterministic) of the heuristic's unsplit
     * picks. At a block step's 32 rows an N = 4096 product is 32 output tiles for 132 SMs; the heuristic
     * rarely offers the split that fills the GPU. Returns the new count; the timing decides. */
    int add_split_k(const dllm__gemm_plan &p, cublasLtMatmulHeuristicResult_t *res, int found) {
        const int unsplit = found;
        for (int i = 0; i < unsplit; i++) {
            int32_t can = 0, splits = 1;
            size_t written = 0;
            dllm__lib.cublasLtMatmulAlgoCapGetAttribute(&res[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &can,
                                                        sizeof can, &written);
            dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                           sizeof splits, &written);
            if (!can || splits > 1) continue;
            for (int32_t k : {2, 3, 4, 6, 8}) {
                if (found == dllm__gemm_candidates) return found;
                cublasLtMatmulHeuristicResult_t r = res[i];
                uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
                dllm__lib.cublasLtMatmulAlgoConfigSetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &k, sizeof k);
                dllm__lib.cublasLtMatmulAlgoConfigSetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                               sizeof scheme);
                if (dllm__lib.cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.c, p.c, &r.algo, &r) ==
                        CUBLAS_STATUS_SUCCESS &&
                    r.workspaceSize <= workspace_bytes)
                    res[found++] = r;
            }
        }
        return found;
    }
    /* One line per tuned shape under DLLM_GEMM_VERBOSE=1: what won, against the heuristic's first pick. */
    void report(const dllm__gemm_plan &p, const dllm__gemm_op &op, int found, float first_us, float best_us) {
        int32_t id = 0, tile = 0, stages = 0, splits = 1;
        uint32_t scheme = 0;
        size_t w = 0;
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages,
                                                       &w);
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits,
                                                       &w);
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                       sizeof scheme, &w);
        if (p.own)
            dllm__log_verbose(
                "GEMM %s M=%d N=%d K=%d: gemm_wg, %.1f us; heuristic's first %.1f us; %d cuBLASLt candidates timed",
                op.kind(), op.M, op.N, op.K, best_us, first_us, found);
        else
            dllm__log_verbose(
                "GEMM %s M=%d N=%d K=%d: algo %d tile %d stages %d split-K %d (scheme %u), %.1f us; heuristic's first "
                "%.1f us; %d timed",
                op.kind(), op.M, op.N, op.K, id, tile, stages, splits, scheme, best_us, first_us, found);
    }
    /* Mean time (ms) of three runs of `launch` on the stream after a warm-up run; infinite if one fails. */
    template <class F> static float time_runs(F &&launch, cudaStream_t stream) {
        cudaEvent_t t0, t1;
        if (cudaEventCreate(&t0) != cudaSuccess) return INFINITY;
        if (cudaEventCreate(&t1) != cudaSuccess) {
            cudaEventDestroy(t0);
            return INFINITY;
        }
        float total = 0;
        bool ok = true;
        for (int rep = 0; rep < 4 && ok; rep++) {  // the first run warms up and is not counted
            cudaEventRecord(t0, stream);
            ok = launch();
            cudaEventRecord(t1, stream);
            float ms = 0;
            ok = ok && cudaEventSynchronize(t1) == cudaSuccess && cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess;
            if (rep) total += ms;
        }
        cudaEventDestroy(t0);
        cudaEventDestroy(t1);
        cudaGetLastError();
        return ok ? total / 3 : INFINITY;
    }
    /* Times the candidates on the real operands and keeps the fastest: cuBLASLt's, then gemm_wg where it fits. */
    dllm_status fastest(dllm__gemm_plan &p, const cublasLtMatmulHeuristicResult_t *res, int found,
                        const dllm__gemm_op &op, cudaStream_t stream) {
        float best = INFINITY, first = INFINITY;
        for (int i = 0; i < found; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
            const float ms = time_runs(
                [&] {
                    return dllm__lib.cublasLtMatmul(handle, p.desc, op.alpha(), op.W, p.a, op.X, p.b, op.beta(), op.Y,
                                                    p.c, op.Y, p.c, &res[i].algo, workspace.ptr, workspace_bytes,
                                                    stream) == CUBLAS_STATUS_SUCCESS;
                },
                stream);
            if (i == 0) first = ms;
            if (ms < best) {
                best = ms;
                p.algo = res[i].algo;
            }
        }
        if (own_fits(op)) {
            const float ms = time_runs(
                [&] { return dllm__gemm_wg_run(*own, op.X, op.W, op.Y, op.M, op.N, op.K, stream) == DLLM_OK; }, stream);
            if (ms < best) {
                best = ms;
                p.own = true;
            }
        }
        if (dllm__env().gemm_verbose) report(p, op, found, first * 1000, best * 1000);
        return DLLM_OK;
    }
    /* Whether gemm_wg can run op: BF16 in and out, on a GPU that has it. */
    bool own_fits(const dllm__gemm_op &op) const {
        return own && !op.fp8() && !op.i8 && op.out_type == CUDA_R_16BF && own->fits(op.X, op.W, op.Y, op.N, op.K);
    }
    /* Row-independent GEMM: whatever M is, the algorithm is the one the heuristic picks for M = pin_m (unordered
     * split-K excluded, no timing), and no launch computes more than pin_m rows, the sizes it was chosen for (at
     * 1024-2048 rows in one launch the first trial of the last layer's pinned GEMMs failed). So the bits of a row
     * never depend on how many rows are computed. LaCache computes some rows alone that the plain path computes
     * among all (lacache.md 2): layer 0's Q/K/V, the last layer after its attention, the LM head. BF16 rows beyond
     * pin_m are done in chunks here; FP8 operands (the last layer's FFN) come in chunks, since their scales'
     * leading dimension is the row count. */
    static constexpr int pin_m = 256;  // constexpr: inline, so std::min may take it by reference
    dllm_status run_pinned(const dllm__gemm_op &op, cudaStream_t stream) {
        if (op.M > pin_m && op.fp8())
            return dllm__fail(DLLM_ERR_INTERNAL, "a pinned FP8 GEMM of %d rows (at most %d)", op.M, pin_m);
        const size_t out_bytes = op.out_type == CUDA_R_32F ? 4 : 2;
        for (int m0 = 0; m0 < op.M; m0 += pin_m) {
            dllm__gemm_op part = op;
            part.M = std::min(pin_m, op.M - m0);
            part.X = (const char *)op.X + (size_t)m0 * op.K * 2;
            part.Y = (char *)op.Y + (size_t)m0 * op.N * out_bytes;
            dllm__gemm_plan *p;
            DLLM__TRY(pinned_plan(part, stream, p));
            DLLM__TRY(launch(*p, part, stream));
        }
        return DLLM_OK;
    }
    /* The plan of run_pinned for op's shape: the algorithm chosen at pin_m rows, checked at op.M. */
    dllm_status pinned_plan(const dllm__gemm_op &op, cudaStream_t stream, dllm__gemm_plan *&out) {
        std::string key = dllm__format("pin:%s%d,%d,%d,%d", op.fp8() ? "f8:" : "", op.M, op.N, op.K, (int)op.out_type);
        auto it = plans.find(key);
        if (it == plans.end()) {
            dllm__gemm_op ref_op = op;
            ref_op.M = pin_m;
            dllm__gemm_plan *ref;
            DLLM__TRY(plan(ref_op, stream, ref, false));
            std::unique_ptr<dllm__gemm_plan> pinned(new dllm__gemm_plan);
            DLLM__TRY(describe(*pinned, op));
            pinned->algo = ref->algo;
            cublasLtMatmulHeuristicResult_t check;
            if (dllm__lib.cublasLtMatmulAlgoCheck(handle, pinned->desc, pinned->a, pinned->b, pinned->c, pinned->c,
                                                  &pinned->algo, &check) != CUBLAS_STATUS_SUCCESS)
                return dllm__fail(DLLM_ERR_CUDA,
                                  "the pinned %s GEMM algorithm (chosen at M=%d) does not run at M=%d N=%d K=%d",
                                  op.kind(), pin_m, op.M, op.N, op.K);
            it = plans.emplace(key, std::move(pinned)).first;
        }
        out = it->second.get();
        return DLLM_OK;
    }
    /* Y[M x N] = X[M x K] . W[N x K]^T, BF16 (tests and benchmarks). */
    DLLM__TEST_HOOKS_BEGIN
    DLLM__TEST_HOOK dllm_status run(const void *X, const void *W, void *Y, int M, int N, int K, cudaDataType_t out_type,
                                    cudaStream_t stream) {
        return run(dllm__gemm_op{X, W, Y, M, N, K, out_type, nullptr, nullptr}, stream);
    }
    DLLM__TEST_HOOKS_END
    /* The same with E4M3 operands and their block scales (see dllm__gemm_op), BF16 out; pinned: run_pinned's
     * algorithm. */
    dllm_status run_fp8(const void *X, const float *x_scale, const void *W, const float *w_scale, void *Y, int M, int N,
                        int K, cudaStream_t stream, bool pinned = false) {
        DLLM__TRY(dllm__check_fp8_shape(M, K));
        const dllm__gemm_op op{X, W, Y, M, N, K, CUDA_R_16BF, x_scale, w_scale};
        return pinned ? run_pinned(op, stream) : run(op, stream);
    }
    /* [INT8 GEMM] Y[M x N] (int32, leading dimension N) = X[M x K] . W[N x K]^T on int8 operands (leading dimension K),
     * every sum exact: any algorithm, any split gives the same bits, so the fastest is kept whatever rows must stay
     * independent. cuBLASLt's IMMA kernels want the TN layout, K and N multiples of 4 and 4-byte aligned operands
     * (16 bytes for its fast kernels: cudaMalloc'd buffers, K a multiple of 16). */
    dllm_status run_i8(const void *X, const void *W, void *Y, int M, int N, int K, cudaStream_t stream) {
        if (M < 0 || N % 4 || K % 4 || K <= 0 || ((uintptr_t)X | (uintptr_t)W | (uintptr_t)Y) % 4)
            return dllm__fail(
                DLLM_ERR_INVALID_ARGUMENT,
                "INT8 GEMM M=%d N=%d K=%d: N and K must be multiples of 4 and the operands 4-byte aligned", M, N, K);
        if (M == 0) return DLLM_OK;
        dllm__gemm_op op{X, W, Y, M, N, K, CUDA_R_32I, nullptr, nullptr};
        op.i8 = true;
        return run(op, stream);
    }
    dllm_status run(const dllm__gemm_op &op, cudaStream_t stream) {
        dllm__gemm_plan *p;
        DLLM__TRY(plan(op, stream, p, true));
        return launch(*p, op, stream);
    }
    dllm_status launch(dllm__gemm_plan &p, const dllm__gemm_op &op, cudaStream_t stream) {
        // A plan that chose gemm_wg keeps cuBLASLt's best algorithm too, for operands gemm_wg cannot take.
        if (p.own && own_fits(op)) return dllm__gemm_wg_run(*own, op.X, op.W, op.Y, op.M, op.N, op.K, stream);
        DLLM__TRY(bind_scales(p, op));
        DLLM__CUBLAS(dllm__lib.cublasLtMatmul(handle, p.desc, op.alpha(), op.W, p.a, op.X, p.b, op.beta(), op.Y, p.c,
                                              op.Y, p.c, &p.algo, workspace.ptr, workspace_bytes, stream));
        return DLLM_OK;
    }
};

/* [batch] gemm_wg's tile widths, in the order of every by_width[] array of candidates. */
static const int dllm__batch_gemm_widths[3] = {256, 128, 64};

/* [batch] The fastest of the candidates by_width[] (null: not loaded, or not fitting op) for op's N, K and number of
 * 128-row tiles, as its index, timed once a process and device on op's operands (its output is overwritten by the
 * launch that follows). Untimed (DLLM_DEBUG_PLAIN=1, or inside a graph capture) a rule from the H100's timings: 128
 * for N <= 4096 up to 1024 rows, else 256 (whichever of the two is a candidate). The width changes no bit (gemm_wg's
 * widths agree), so neither the timing nor the rule can make a sequence's output depend on its batch. On the H100, 64
 * took 0.83-0.87x of 128's time for the o and down projections at 128 rows, and lost elsewhere. The index may name a
 * width another context loaded and this one lacks: the caller falls back. */
static int dllm__batch_gemm_width(const dllm__gemm_op &op, const dllm__gemm_wg *const by_width[3],
                                  cudaStream_t stream) {
    const int m_tiles = (op.M + 127) / 128;
    const int rule = (op.N <= 4096 && m_tiles <= 8 && by_width[1]) || !by_width[0] ? 1 : 0;
    static std::mutex mutex;
    static std::map<std::array<int, 4>, int> chosen;  // (device, N, K, m-tiles) -> index
    int device = 0;
    cudaGetDevice(&device);
    std::lock_guard<std::mutex> lock(mutex);
    const std::array<int, 4> key = {device, op.N, op.K, m_tiles};
    auto it = chosen.find(key);
    if (it != chosen.end()) return it->second;  // a capture takes what its layout's eager forward timed
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (!dllm__env().gemm_autotune || cudaStreamIsCapturing(stream, &capturing) != cudaSuccess ||
        capturing != cudaStreamCaptureStatusNone) {
        cudaGetLastError();
        return rule;
    }
    float ms[3] = {INFINITY, INFINITY, INFINITY};
    int best = -1;
    for (int i = 0; i < 3; i++) {
        if (!by_width[i]) continue;
        const dllm__gemm_wg &k = *by_width[i];
        ms[i] = dllm__gemm::time_runs(
            [&] { return dllm__gemm_wg_run(k, op.X, op.W, op.Y, op.M, op.N, op.K, stream) == DLLM_OK; }, stream);
        if (ms[i] < INFINITY && (best < 0 || ms[i] < ms[best])) best = i;
    }
    if (best < 0) best = rule;
    if (dllm__env().gemm_verbose)
        dllm__log_verbose(
            "batched GEMM N=%d K=%d, %d row tiles: gemm_wg 256 wide %.1f us, 128 wide %.1f us, 64 wide %.1f us: %d",
            op.N, op.K, m_tiles, ms[0] * 1000, ms[1] * 1000, ms[2] * 1000, dllm__batch_gemm_widths[best]);
    return chosen[key] = best;
}

/* dllm's own FP8 GEMM (dllm__src_fp8_gemm), loaded for one device: both tiles, with the stages they were built with. */
typedef void dllm__sig_fp8_gemm(const unsigned char *X, const float *x_scale, const unsigned char *W,
                                const float *w_scale, bf16_t *Y, int M, int N, int K);
struct dllm__fp8_mma {
    std::shared_ptr<dllm__module> module;
    dllm__kernel<dllm__sig_fp8_gemm> wide, narrow;
    dllm__fp8_tile wide_tile = {}, narrow_tile = {};
};

/* Compiles and loads fp8_gemm for the current device. A GPU newer than the table runs sm_90's tiles
 * (DLLM_TILES=fp8_gemm=mma), with fewer stages where its shared memory per block is smaller. */
static dllm_status dllm__fp8_mma_load(dllm__arch a, dllm__fp8_mma &out) {
    int dev = 0, optin = 0;
    DLLM__CUDA(cudaGetDevice(&dev));
    DLLM__CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    for (dllm__fp8_tile *t : {&a.fp8_wide, &a.fp8_narrow})
        while (t->stages > 2 && dllm__fp8_gemm_smem(*t) > (size_t)optin) t->stages--;
    DLLM__TRY(dllm__jit_load(dllm__module_fp8_gemm(a), out.module));
    out.wide_tile = a.fp8_wide;
    out.narrow_tile = a.fp8_narrow;
    out.wide.fn = out.module->kernels.at(dllm__fp8_gemm_kernel_name(a.fp8_wide)), out.wide.name = "fp8_gemm";
    out.narrow.fn = out.module->kernels.at(dllm__fp8_gemm_kernel_name(a.fp8_narrow)), out.narrow.name = "fp8_gemm";
    DLLM__CUDA(cudaFuncSetAttribute((const void *)out.wide.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dllm__fp8_gemm_smem(a.fp8_wide)));
    DLLM__CUDA(cudaFuncSetAttribute((const void *)out.narrow.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dllm__fp8_gemm_smem(a.fp8_narrow)));
    return DLLM_OK;
}

/* Y [M x N] (bf16) = X . W^T with fp8_gemm, on the operands and under the contract of dllm__gemm::run_fp8: M and K
 * padded (multiples of 16 and 128), every one of the M rows written. one_tile: the wide tile whatever M, so that a
 * row's bits do not depend on how many rows are computed (the counterpart of dllm__gemm::run_pinned). */
static dllm_status dllm__fp8_mma_run(const dllm__fp8_mma &k, const void *X, const float *x_scale, const void *W,
                                     const float *w_scale, void *Y, int M, int N, int K, cudaStream_t stream,
                                     bool one_tile = false) {
    DLLM__TRY(dllm__check_fp8_shape(M, K));
    if (M == 0 || N == 0) return DLLM_OK;
    const bool narrow = !one_tile && M <= dllm__fp8_narrow_rows;
    const dllm__fp8_tile &t = narrow ? k.narrow_tile : k.wide_tile;
    dim3 grid((unsigned)((M + t.bm - 1) / t.bm), (unsigned)((N + t.bn - 1) / t.bn));
    return (narrow ? k.narrow : k.wide)
        .launch({grid, dim3((unsigned)(t.bm / t.wm * (t.bn / t.wn) * 32)), dllm__fp8_gemm_smem(t)}, stream, X, x_scale,
                W, w_scale, Y, M, N, K);
}
