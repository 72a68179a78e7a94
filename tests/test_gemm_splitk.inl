/* Tests: [row-independent GEMM] gemm_splitk (src/kernels/gemm_splitk.cuh, src/gpu/gemm_splitk.cpp): its cut per
 * shape on the CPU; on an sm_90a GPU its products against the CPU's fp32 sums, and every row's bits at every row count,
 * in both of its modes. */

/* The cut follows the shape and the SM count alone: chunks of 4 k-steps (2, 1 where K's steps are not a multiple), one
 * range an SM (fewer where there are fewer chunks), each range holding at least one chunk, every chunk in exactly the
 * range splitk_range_of names, no tile cut in more than max_pieces pieces, and the pieces' partials (max_pieces a
 * tile) in the workspace. */
TEST(gemm_splitk, cut_follows_the_shape_alone) {
    const int shapes[][2] = {{12288, 4096}, {4096, 4096}, {37888, 3584}, {3584, 18944}, {384, 1024},
                             {1280, 576},   {256, 256},   {128, 4096},   {4608, 3584}};
    for (const auto &s : shapes)
        for (int sms : {78, 114, 132}) {
            const dllm__splitk_cut c = dllm__splitk_cut_of(s[0], s[1], sms);
            const int tiles = s[0] / 128, steps = s[1] / 64, w = tiles * c.chunks;
            CHECK_MSG(c.chunk * c.chunks == steps && (c.chunk == 4 || steps % (2 * c.chunk) != 0) &&
                          c.ctas == std::min(sms, w),
                      "N %d K %d on %d SMs: chunks %d x %d, %d ranges", s[0], s[1], sms, c.chunks, c.chunk, c.ctas);
            int bad = 0, most = 0;
            for (int r = 0; r < c.ctas; r++) {
                const int x0 = dllm__splitk_cut_start(c, tiles, r), x1 = dllm__splitk_cut_start(c, tiles, r + 1);
                bad += x1 <= x0;
                for (int x = x0; x < x1; x++) bad += dllm__splitk_range_of(c, tiles, x) != r;
            }
            for (int t = 0; t < tiles; t++)
                most = std::max(most, dllm__splitk_range_of(c, tiles, (t + 1) * c.chunks - 1) -
                                          dllm__splitk_range_of(c, tiles, t * c.chunks) + 1);
            CHECK_MSG(bad == 0 && dllm__splitk_cut_start(c, tiles, c.ctas) == w && most <= c.max_pieces,
                      "N %d K %d on %d SMs: %d chunks in the wrong range, %d pieces a tile (bound %d)", s[0], s[1], sms,
                      bad, most, c.max_pieces);
            CHECK(dllm__splitk_workspace_floats(s[0], c) ==
                  (size_t)dllm__splitk_max_tiles + (size_t)tiles * c.max_pieces * 256 * 64);
        }
    for (const auto &s : {std::make_pair(64, 4096), std::make_pair(384, 32), std::make_pair(0, 0)}) {  // not taken
        const dllm__splitk_cut c = dllm__splitk_cut_of(s.first, s.second, 132);
        CHECK(c.ctas == 1 && c.max_pieces == 1);
    }
    CHECK(dllm__splitk_takes((void *)16, (void *)32, (void *)48, 384, 576) &&
          !dllm__splitk_takes((void *)16, (void *)32, (void *)48, 384 + 64, 576) &&
          !dllm__splitk_takes((void *)16, (void *)32, (void *)48, 384, 576 + 32) &&
          !dllm__splitk_takes((void *)16, (void *)40, (void *)48, 384, 576));
}

// ---- on an sm_90a GPU --------------------------------------------------------------------------------------------

/* gemm_splitk for the current GPU, or a skip where it is not sm_90a. */
#define NEED_SPLITK(k)                                                                                                 \
    NEED_GPU();                                                                                                        \
    dllm__gemm_splitk k;                                                                                               \
    {                                                                                                                  \
        cudaDeviceProp p;                                                                                              \
        cudaGetDeviceProperties(&p, 0);                                                                                \
        if (p.major * 10 + p.minor != 90) SKIP("gemm_splitk needs sm_90a");                                           \
        CHECK_STATUS(dllm__gemm_splitk_load(dllm__arch_for(90), k), DLLM_OK, nullptr);                                 \
        if (!k.module) return;                                                                                         \
    }

/* Random bf16 operands of one shape on the device, the workspace zeroed, and the CPU's fp32 products of the rounded
 * values. */
struct test_splitk_case {
    int M, N, K;
    std::vector<float> x, w;  // bf16-rounded values
    dllm__dbuf dx, dw, ws;
    size_t ws_floats = 0;
    test_splitk_case(test_rng &r, const dllm__gemm_splitk &k, int M_, int N_, int K_) : M(M_), N(N_), K(K_) {
        x.resize((size_t)M * K), w.resize((size_t)N * K);
        for (float &v : x) v = dllm__bf16_to_f32(dllm__f32_to_bf16(r.normal()));
        for (float &v : w) v = dllm__bf16_to_f32(dllm__f32_to_bf16(r.normal() * 0.1f));
        test_put(dx, test_bf16_vec(x)), test_put(dw, test_bf16_vec(w));
        ws_floats = dllm__splitk_workspace_floats(N, dllm__splitk_cut_of(N, K, k.sm_count));
        ws.fit(ws_floats * 4, "test");
        cudaMemset(ws.ptr, 0, ws_floats * 4);
    }
    float want(int m, int n) const {
        float s = 0;
        for (int i = 0; i < K; i++) s += x[(size_t)m * K + i] * w[(size_t)n * K + i];
        return s;
    }
    /* Rows [m0, m0 + rows) through gemm_splitk, into a buffer poisoned one row past them; the bits, and whether that
     * row and the tile counters were left alone. */
    std::vector<uint16_t> run(dllm_test_state &T_, const dllm__gemm_splitk &k, int m0, int rows, bool &clean) {
        dllm__dbuf dy;
        test_poison(dy, (size_t)(rows + 1) * N * 2);
        CHECK_STATUS(dllm__gemm_splitk_run(k, (const char *)dx.ptr + (size_t)m0 * K * 2, dw.ptr, dy.ptr, rows, N, K,
                                           ws.as<float>(), ws_floats, nullptr),
                     DLLM_OK, nullptr);
        std::vector<uint16_t> y = test_get<uint16_t>(dy, (size_t)(rows + 1) * N);
        const std::vector<int> cnt = test_get<int>(ws, (size_t)N / 128);
        clean = std::all_of(y.begin() + (size_t)rows * N, y.end(), [](uint16_t v) { return v == 0xFFFF; }) &&
                std::all_of(cnt.begin(), cnt.end(), [](int v) { return v == 0; });
        y.resize((size_t)rows * N);
        return y;
    }
};

/* Every output within bf16 rounding of the CPU's fp32 sum, at row counts across both modes and every tile (1 to 300),
 * for tiles cut in 1 to 16 pieces; nothing written past the rows; the counters zero after each call. */
TEST(gpu_splitk, gemm_matches_cpu_products) {
    NEED_SPLITK(k);
    test_rng r("gemm_splitk products");
    const int shapes[][2] = {{384, 1024}, {1280, 576}, {256, 4096}, {128, 4096}};
    for (const auto &s : shapes) {
        test_splitk_case c(r, k, 300, s[0], s[1]);
        for (int M : {1, 5, 32, 33, 64, 100, 128, 129, 300}) {
            bool clean = false;
            const std::vector<uint16_t> y = c.run(T_, k, 0, M, clean);
            int bad = 0;
            for (int m = 0; m < M; m++)
                for (int n = 0; n < c.N; n++) {
                    const float want = c.want(m, n), got = dllm__bf16_to_f32(y[(size_t)m * c.N + n]);
                    bad += !(fabsf(got - want) <= 0.008f * fabsf(want) + 1e-3f * sqrtf((float)c.K));
                }
            CHECK_MSG(bad == 0 && clean, "N %d K %d M %d (%d pieces a tile at most): %d of %d outputs off, %s", c.N,
                      c.K, M, dllm__splitk_cut_of(c.N, c.K, k.sm_count).max_pieces, bad, M * c.N,
                      clean ? "clean" : "wrote past its rows");
        }
        printf("    N %d K %d, %d pieces a tile at most: M = 1 to 300 within bf16 rounding\n", c.N, c.K,
               dllm__splitk_cut_of(c.N, c.K, k.sm_count).max_pieces);
    }
}

/* A row's bits are the same at every row count and offset: 300 rows at once (the token-tile mode) against runs of 1 to
 * 255 rows taken from the end of them (one CTA a range of the cut up to 128 rows), tiles cut in 2 to 16 pieces. */
TEST(gpu_splitk, rows_get_the_same_bits_at_any_count) {
    NEED_SPLITK(k);
    test_rng r("gemm_splitk rows");
    const int shapes[][2] = {{384, 1024}, {1280, 576}, {4096, 4096}, {2432, 3584}};
    for (const auto &s : shapes) {
        const int total = 300;
        test_splitk_case c(r, k, total, s[0], s[1]);
        bool clean = false;
        const std::vector<uint16_t> all = c.run(T_, k, 0, total, clean);
        for (int M : {1, 7, 32, 33, 64, 65, 128, 129, 255}) {
            const int m0 = total - M;
            const std::vector<uint16_t> part = c.run(T_, k, m0, M, clean);
            size_t differ = 0;
            for (size_t i = 0; i < part.size(); i++) differ += part[i] != all[(size_t)m0 * c.N + i];
            CHECK_MSG(differ == 0 && clean, "N %d K %d: %zu of %zu outputs of rows %d.. differ from the 300-row run",
                      c.N, c.K, differ, part.size(), m0);
        }
        printf("    N %d K %d, %d pieces a tile at most: rows equal at 1 to 300 rows\n", c.N, c.K,
               dllm__splitk_cut_of(c.N, c.K, k.sm_count).max_pieces);
    }
}
