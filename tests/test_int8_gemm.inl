/* Tests: [INT8 GEMM], gemm_q4's path for more than 64 rows of integer C values (SoloQ-I, SoloQ-C, RTN-W4A4): its CPU
 * twin dllm__cpu_i8_gemm and the exactness rule that lets it serve rows that must stay independent (CPU); the SoloQ
 * module's new kernels compile and take their handles' parameters (CPU); on a GPU the unpacker, the whole path and the
 * producers' int8 output against their twins bit for bit, and the forward with and without the INT8 path. */

// ---- CPU: the twin and the exactness rule ----------------------------------------------------------------------

/* The integer formats as (activations, weights): SoloQ-I, SoloQ-C, RTN-W4A4. */
static const dllm__q4_format test_i8_pairs[3][2] = {
    {DLLM__Q4_INT4, DLLM__Q4_INT4}, {DLLM__Q4_LLOYD, DLLM__Q4_E8P}, {DLLM__Q4_RTN, DLLM__Q4_RTN}};

/* rows random packed rows of K elements in format f (every byte value: every nibble and every E8P code is valid). */
static std::vector<uint8_t> test_i8_codes(test_rng &r, int rows, int K) {
    std::vector<uint8_t> codes((size_t)rows * K / 2);
    for (uint8_t &c : codes) c = (uint8_t)r.below(256);
    return codes;
}

/* The C values of packed rows, as floats (the q4 twin's operand) and as int8 (the INT8 twin's). */
static void test_i8_values(dllm__q4_format f, const std::vector<uint8_t> &codes, int rows, int K,
                           std::vector<float> &vf, std::vector<int8_t> &vi) {
    vf.assign((size_t)rows * K, 0);
    vi.assign((size_t)rows * K, 0);
    for (int r = 0; r < rows; r++) dllm__q4_row_values(f, &codes[(size_t)r * K / 2], nullptr, K, &vf[(size_t)r * K]);
    for (size_t i = 0; i < vf.size(); i++) vi[i] = (int8_t)vf[i];
}

/* Token scales with the cases real rows have: a zero row's 0, a NaN row's NaN, ordinary magnitudes. */
static std::vector<float> test_i8_scales(test_rng &r, int n) {
    std::vector<float> s((size_t)n);
    for (float &v : s) v = (0.5f + r.uniform()) * 1e-2f;
    if (n > 2) s[2] = 0;
    if (n > 4) s[4] = NAN;
    return s;
}

/* Where the rule says the sums are exact in fp32, the INT8 twin gives dllm__cpu_q4_gemm's bits: integer C values in
 * [-127, 127] cast to int8 unchanged, one epilogue. Every pair at awkward M and K, K as large as the rule allows for
 * SoloQ-C. */
TEST(int8_gemm, twin_equals_the_q4_twin_where_sums_are_exact) {
    test_rng r("int8_gemm twin vs q4 twin");
    for (const auto &pair : test_i8_pairs) {
        const dllm__q4_format fa = pair[0], fw = pair[1];
        for (int K : {8 * 25, 16 * 37, 1040}) {
            const int M = 7 + r.below(70), N = 12;
            CHECK_MSG(dllm__q4_int_sum_exact_in_fp32(fa, fw, K), "%s x %s at K %d", dllm__q4_names[fa],
                      dllm__q4_names[fw], K);
            std::vector<float> af, wf;
            std::vector<int8_t> ai, wi;
            test_i8_values(fa, test_i8_codes(r, M, K), M, K, af, ai);
            const std::vector<uint8_t> wcodes = test_i8_codes(r, N, K);
            test_i8_values(fw, wcodes, N, K, wf, wi);
            size_t cast = 0;
            for (size_t i = 0; i < af.size(); i++) cast += af[i] != (float)ai[i];
            CHECK_MSG(cast == 0, "%s: %zu C values do not survive the cast to int8", dllm__q4_names[fa], cast);
            const std::vector<float> s_x = test_i8_scales(r, M), s_w = test_i8_scales(r, N);
            std::vector<float> y_q4((size_t)M * N, -1), y_i8((size_t)M * N, -2);
            dllm__cpu_q4_gemm(fw, wcodes.data(), nullptr, s_w.data(), af.data(), K, s_x.data(), y_q4.data(), N, M, N,
                              K);
            dllm__cpu_i8_gemm(ai.data(), K, wi.data(), s_x.data(), s_w.data(), y_i8.data(), N, M, N, K);
            int bad = 0;
            for (size_t i = 0; i < y_q4.size(); i++) bad += !test_same_float(y_q4[i], y_i8[i]);
            CHECK_MSG(bad == 0, "%s x %s M=%d K=%d: %d of %d outputs differ", dllm__q4_names[fa], dllm__q4_names[fw], M,
                      K, bad, M * N);
        }
    }
}

/* dllm__q4_int_max bounds every C value a stored code can decode to (all 256 bytes of the 4-bit formats, all 144
 * coordinate pairs of E8P-RVQ4), and is reached, so the exactness rule below rests on the true maxima. */
TEST(int8_gemm, int_max_is_the_largest_decodable_c_value) {
    for (dllm__q4_format f : {DLLM__Q4_INT4, DLLM__Q4_LLOYD, DLLM__Q4_RTN}) {
        int largest = 0;
        for (int b = 0; b < 256; b++) {
            const uint8_t byte = (uint8_t)b;
            for (int i = 0; i < 2; i++) {
                const float c = dllm__q4_value(f, &byte, nullptr, i);
                CHECK_MSG(c == rintf(c), "%s: code %d decodes to %g, not an integer", dllm__q4_names[f], b, c);
                largest = std::max(largest, (int)fabsf(c));
            }
        }
        CHECK_MSG(largest == dllm__q4_int_max(f), "%s: largest |C| %d, int_max %d", dllm__q4_names[f], largest,
                  dllm__q4_int_max(f));
    }
    int largest = 0;
    for (int e1 = -11; e1 <= 11; e1 += 2)
        for (int e2 = -11; e2 <= 11; e2 += 2) largest = std::max(largest, abs(dllm__e8p_int(e1, e2)));
    CHECK_MSG(largest == dllm__q4_int_max(DLLM__Q4_E8P), "E8P-RVQ4: largest |C| %d, int_max %d", largest,
              dllm__q4_int_max(DLLM__Q4_E8P));
}

/* The rule is the bound it claims: SoloQ-I and RTN are exact at every LLaDA / Dream width, SoloQ-C up to K = 1048 and
 * not beyond, NVFP4 never (not integers); and past the bound an fp32 sum really loses what the int32 sum keeps: 1100
 * products 126 x 127 take the sum past 2^24, where each of the 300 products 1 x 1 after them rounds away in fp32. */
TEST(int8_gemm, exactness_rule_is_the_fp32_bound) {
    for (int K : {4096, 12288, 14336, 18944})
        CHECK(dllm__q4_int_sum_exact_in_fp32(DLLM__Q4_INT4, DLLM__Q4_INT4, K) &&
              dllm__q4_int_sum_exact_in_fp32(DLLM__Q4_RTN, DLLM__Q4_RTN, K));
    CHECK(dllm__q4_int_sum_exact_in_fp32(DLLM__Q4_LLOYD, DLLM__Q4_E8P, 1048) &&
          !dllm__q4_int_sum_exact_in_fp32(DLLM__Q4_LLOYD, DLLM__Q4_E8P, 1049));
    CHECK(!dllm__q4_int_sum_exact_in_fp32(DLLM__Q4_LLOYD, DLLM__Q4_E8P, 4096));
    CHECK(dllm__q4_int_max(DLLM__Q4_NVFP4) == 0 && !dllm__q4_int_sum_exact_in_fp32(DLLM__Q4_NVFP4, DLLM__Q4_NVFP4, 8));
    const int K = 1400, exact = 1100 * 126 * 127 + 300;
    std::vector<int8_t> x((size_t)K, 1), w((size_t)K, 1);
    for (int k = 0; k < 1100; k++) x[(size_t)k] = 126, w[(size_t)k] = 127;
    float acc = 0, one = 1, y = 0;
    for (int k = 0; k < K; k++) acc = fmaf((float)x[(size_t)k], (float)w[(size_t)k], acc);
    dllm__cpu_i8_gemm(x.data(), K, w.data(), &one, &one, &y, 1, 1, 1, K);
    CHECK_MSG(y == (float)exact && acc != y, "int32 %.1f, fp32 %.1f, exact %d", y, acc, exact);
}

/* The INT8 path's chunks of weight rows: as many as the BF16 path's, equal, multiples of 4, never more rows than the
 * BF16 path's (the buffers are sized for those), covering the weight. LLaDA-8B's and Dream-7B's shapes and awkward
 * ones. */
TEST(int8_gemm, chunks_are_even_and_fit_the_bf16_buffers) {
    const int shapes[][2] = {{4096, 4096},  {12288, 4096}, {24576, 4096}, {4096, 12288}, {126464, 4096},
                             {3584, 18944}, {37888, 3584}, {12, 200},     {1000, 592}};
    for (const auto &nk : shapes) {
        const int n = nk[0], k = nk[1], most = dllm__q4_chunk_rows(n, k), chunk = dllm__q4_int8_chunk_rows(n, k);
        CHECK_MSG(chunk % 4 == 0 && chunk <= most && (n + chunk - 1) / chunk == (n + most - 1) / most &&
                      n - (n + chunk - 1) / chunk * chunk > -chunk,
                  "N %d K %d: chunk %d (BF16 path %d)", n, k, chunk, most);
    }
    CHECK(dllm__q4_int8_chunk_rows(4096, 12288) == 1024);
}

/* The INT8 path refuses, before touching the GPU, what it cannot compute: NVFP4 weights, K not a multiple of 8, N or
 * the chunk not of 4, a short ldy, a null operand; cuBLASLt's INT8 GEMM likewise N or K not a multiple of 4. */
TEST(int8_gemm, launcher_rejects_bad_arguments) {
    dllm__soloq_kernels q;
    dllm__gemm lt;
    char b[64];
    float f[8];
    int acc[8];
    auto run = [&](dllm__q4_format fmt, int ldy, int M, int N, int K, int chunk, const void *codes) {
        return dllm__q4_int8_gemm_run(q, lt, fmt, codes, f, b, f, f, ldy, CUDA_R_16BF, M, N, K, chunk, b, acc, nullptr);
    };
    CHECK_STATUS(run(DLLM__Q4_NVFP4, 8, 1, 8, 8, 8, b), DLLM_ERR_INVALID_ARGUMENT, "integers");
    CHECK_STATUS(run(DLLM__Q4_INT4, 8, 1, 8, 12, 8, b), DLLM_ERR_INVALID_ARGUMENT, "multiple of 8");
    CHECK_STATUS(run(DLLM__Q4_INT4, 8, 1, 6, 8, 8, b), DLLM_ERR_INVALID_ARGUMENT, "multiples of 4");
    CHECK_STATUS(run(DLLM__Q4_E8P, 8, 1, 8, 8, 6, b), DLLM_ERR_INVALID_ARGUMENT, "multiples of 4");
    CHECK_STATUS(run(DLLM__Q4_LLOYD, 4, 1, 8, 8, 8, b), DLLM_ERR_INVALID_ARGUMENT, "ldy");
    CHECK_STATUS(run(DLLM__Q4_RTN, 8, 1, 8, 8, 8, nullptr), DLLM_ERR_INVALID_ARGUMENT, "null");
    CHECK_STATUS(lt.run_i8(b, b, acc, 3, 6, 8, nullptr), DLLM_ERR_INVALID_ARGUMENT, "multiples of 4");
    CHECK_STATUS(lt.run_i8(b, b, acc, 3, 8, 6, nullptr), DLLM_ERR_INVALID_ARGUMENT, "multiples of 4");
}

/* Every architecture of the table: the SoloQ module (its producers now with the int8 output, the unpacker and the int32
 * epilogue) compiles without spills, and each kernel takes, as compiled, the parameters its host handle passes. */
TEST(jit, soloq_module_with_int8_kernels_matches_its_table) {
    for (const dllm__arch &row : dllm__arch_table) {
        const dllm__arch a = dllm__arch_for(row.cc);
        std::vector<char> cubin;
        std::vector<std::string> lowered;
        std::string log, ptx;
        const dllm__jit_request rq = dllm__module_soloq(a);
        CHECK_STATUS(dllm__nvrtc_compile(rq, cubin, lowered, log, &ptx), DLLM_OK, nullptr);
        CHECK_MSG(!dllm__log_has_spills(log), "the SoloQ module spills on %s:\n%s", a.target, log.c_str());
        CHECK(lowered.size() == rq.kernels.size() && cubin.size() > 1000);
#define TEST_SOLOQ_SIZES(kname, attrs, params)                                                                         \
    CHECK_MSG(test_ptx_param_sizes(ptx, #kname) == dllm__kernel<dllm__sig_##kname>::param_sizes(),                     \
              "%s on %s: parameters differ from its handle's", #kname, a.target);
        DLLM__SOLOQ_KERNELS(TEST_SOLOQ_SIZES)
#undef TEST_SOLOQ_SIZES
    }
}

// ---- GPU: the kernels and the path against the twin; the producers' int8 rows; the forward ------------------------

/* Stored rows of every integer format into int8 C values: random codes (E8P: any two 16-bit codes), poisoned output. */
TEST(gpu_int8, unpack_rows_match_twin) {
    NEED_GPU();
    test_soloq_gpu t;
    CHECK_STATUS(t.init(), DLLM_OK, nullptr);
    test_rng r("gpu_int8.unpack_rows");
    const int rows = 5, cols = 8 * 25 + 1024 * 8;  // more than one block of 128 threads along the row; cols % 16 = 8
    for (dllm__q4_format f : {DLLM__Q4_INT4, DLLM__Q4_LLOYD, DLLM__Q4_E8P, DLLM__Q4_RTN}) {
        const std::vector<uint8_t> codes = test_i8_codes(r, rows, cols);
        std::vector<float> vf;
        std::vector<int8_t> want;
        test_i8_values(f, codes, rows, cols, vf, want);
        dllm__dbuf dc, out;
        test_put(dc, codes);
        test_poison(out, (size_t)rows * cols);
        CHECK_STATUS(t.k.soloq_unpack_rows_i8.launch({dim3((cols / 8 + 127) / 128, rows), dim3(128)}, nullptr,
                                                     dc.as<unsigned char>(), (int)f, rows, cols, out.as<signed char>()),
                     DLLM_OK, nullptr);
        CHECK_MSG(test_get<int8_t>(out, (size_t)rows * cols) == want, "%s: the int8 rows differ from dllm__q4_value's",
                  dllm__q4_names[f]);
    }
}

/* One case of the whole INT8 path (unpack, cuBLASLt INT8, epilogue) against dllm__cpu_i8_gemm: y poisoned, written with
 * row stride ldy at a column offset (the columns around must stay poisoned), bf16 or fp32 out. Returns the
 * mismatches. */
static int test_i8_path_case(dllm_test_state &T_, test_soloq_gpu &t, dllm__gemm &lt, test_rng &r, dllm__q4_format fa,
                             dllm__q4_format fw, int M, int N, int K, int chunk, bool f32) {
    std::vector<float> af, wf;
    std::vector<int8_t> ai, wi;
    test_i8_values(fa, test_i8_codes(r, M, K), M, K, af, ai);
    const std::vector<uint8_t> wcodes = test_i8_codes(r, N, K);
    test_i8_values(fw, wcodes, N, K, wf, wi);
    const std::vector<float> s_x = test_i8_scales(r, M), s_w = test_i8_scales(r, N);
    const int col0 = 4, ldy = N + 12;
    const size_t esize = f32 ? 4 : 2, y_elems = (size_t)M * ldy;
    dllm__dbuf dx, dc, dsx, dsw, dy, dw, dacc;
    test_put(dx, ai), test_put(dc, wcodes), test_put(dsx, s_x), test_put(dsw, s_w);
    test_poison(dy, y_elems * esize), test_poison(dw, (size_t)chunk * K), test_poison(dacc, (size_t)M * chunk * 4);
    CHECK_STATUS(dllm__q4_int8_gemm_run(t.k, lt, fw, dc.ptr, dsw.as<float>(), dx.ptr, dsx.as<float>(),
                                        (char *)dy.ptr + col0 * esize, ldy, f32 ? CUDA_R_32F : CUDA_R_16BF, M, N, K,
                                        chunk, dw.ptr, dacc.as<int>(), nullptr),
                 DLLM_OK, nullptr);
    std::vector<float> want((size_t)M * N);
    dllm__cpu_i8_gemm(ai.data(), K, wi.data(), s_x.data(), s_w.data(), want.data(), N, M, N, K);
    const std::vector<float> got = f32 ? test_get<float>(dy, y_elems) : test_f32_vec(test_get<uint16_t>(dy, y_elems));
    int bad = 0;
    for (int m = 0; m < M; m++)
        for (int j = 0; j < ldy; j++) {
            const float g = got[(size_t)m * ldy + j];
            if (j < col0 || j >= col0 + N) bad += g == g;  // outside the block: still the NaN poison
            else
                bad += !test_same_float(g, f32 ? want[(size_t)m * N + j - col0]
                                               : dllm__bf16_to_f32(dllm__f32_to_bf16(want[(size_t)m * N + j - col0])));
        }
    return bad;
}

/* The INT8 path equals its twin bit for bit for SoloQ-I, SoloQ-C and RTN-W4A4 at awkward shapes: M not a multiple of
 * 16, N a multiple of 4 but not 8, several chunks with a short last one, K = 8 mod 16 and a K beyond SoloQ-C's fp32
 * bound (the int32 sums stay exact where fp32 ones would not). */
TEST(gpu_int8, path_matches_twin_bit_for_bit) {
    NEED_GPU();
    test_soloq_gpu t;
    CHECK_STATUS(t.init(), DLLM_OK, nullptr);
    dllm__gemm lt;
    CHECK_STATUS(lt.init(), DLLM_OK, nullptr);
    test_rng r("gpu_int8.path");
    struct {
        int M, N, K, chunk;
        bool f32;
    } shapes[] = {{65, 12, 8 * 25, 64, false},
                  {77, 200, 16 * 37, 64, true},
                  {130, 1000, 4096, 256, false},
                  {257, 300, 8 * 25, 300, true},
                  {3, 44, 2048, 20, false}};
    for (const auto &pair : test_i8_pairs)
        for (const auto &s : shapes) {
            const int bad = test_i8_path_case(T_, t, lt, r, pair[0], pair[1], s.M, s.N, s.K, s.chunk, s.f32);
            printf("    %s x %s M=%d N=%d K=%d chunk %d %s: %s\n", dllm__q4_names[pair[0]], dllm__q4_names[pair[1]],
                   s.M, s.N, s.K, s.chunk, s.f32 ? "fp32" : "bf16", bad ? "DIFFERS" : "exact");
            CHECK_MSG(bad == 0, "%s x %s M=%d N=%d K=%d: %d outputs differ from the twin", dllm__q4_names[pair[0]],
                      dllm__q4_names[pair[1]], s.M, s.N, s.K, bad);
        }
}

/* The quantiser and both fused producers write, beside the bf16 C values, the same integers as int8 when asked
 * (values_i8), and the int8 output alone changes nothing else (token scales equal). */
TEST(gpu_int8, producers_write_int8_c_values) {
    NEED_GPU();
    test_soloq_gpu t;
    CHECK_STATUS(t.init(), DLLM_OK, nullptr);
    test_rng r("gpu_int8.producers");
    const int M = 67;
    for (int d : {264, 4096})
        for (dllm__q4_format f : {DLLM__Q4_INT4, DLLM__Q4_LLOYD, DLLM__Q4_RTN}) {
            dllm__rotation_dev rot;
            CHECK(dllm__rotation_upload(dllm__make_rotation(DLLM__ROT_KRPBH, d, r.next(), 3), rot) == DLLM_OK);
            const std::vector<float> x = test_soloq_rows(r, M, d);
            std::vector<float> h((size_t)M * d), w((size_t)d), gu((size_t)M * 2 * d);
            for (float &v : h) v = r.normal();
            for (float &v : w) v = 1 + 0.3f * r.normal();
            for (float &v : gu) v = 2 * r.normal();
            dllm__dbuf dx, dh, dw, dgu, hout, vals, vals8, sA, sB;
            test_put(dx, test_bf16_vec(x)), test_put(dh, h), test_put(dw, w), test_put(dgu, test_bf16_vec(gu));
            for (int producer = 0; producer <= 2; producer++) {
                test_poison(vals, (size_t)M * d * 2), test_poison(vals8, (size_t)M * d), test_poison(sA, (size_t)M * 4),
                    test_poison(sB, (size_t)M * 4);
                test_poison(hout, (size_t)M * d * 4);
                soloq_args a = dllm__soloq_args(rot, f, true, true, M, d, sA.ptr, vals.ptr);
                if (producer == 0) a.x = dx.ptr, a.x_stride = (u64)d;
                if (producer == 1)
                    a.h_in = dh.as<float>(), a.h_out = hout.as<float>(), a.norm_w = dw.as<float>(), a.eps = 1e-5f;
                if (producer == 2) a.x = dgu.ptr, a.x_stride = (u64)2 * d;
                a.producer = producer;
                CHECK(dllm__soloq_launch(t.k, a, producer == 1 ? dllm__norm_threads(d / 8) : 512, nullptr) == DLLM_OK);
                const std::vector<uint16_t> bf = test_get<uint16_t>(vals, (size_t)M * d);
                const std::vector<uint32_t> scales = test_get<uint32_t>(sA, M);
                test_poison(vals, (size_t)M * d * 2);
                a.row_scale = sB.as<float>(), a.values = nullptr, a.values_i8 = vals8.as<signed char>();
                CHECK(dllm__soloq_launch(t.k, a, producer == 1 ? dllm__norm_threads(d / 8) : 512, nullptr) == DLLM_OK);
                const std::vector<int8_t> i8 = test_get<int8_t>(vals8, (size_t)M * d);
                int bad = 0;
                for (size_t i = 0; i < bf.size(); i++) bad += dllm__bf16_to_f32(bf[i]) != (float)i8[i];
                CHECK_MSG(bad == 0 && test_get<uint32_t>(sB, M) == scales,
                          "producer %d, d %d, %s: %d int8 values differ from the bf16 ones", producer, d,
                          dllm__q4_names[f], bad);
            }
        }
}

/* gemm_q4 takes the INT8 path for a forward of more than 64 rows in SoloQ-I, SoloQ-C and RTN-W4A4 (it ran: the launch
 * count grows), and the logits are those of the same forward without it, bit for bit (on these tiny models every sum
 * is exact in fp32 too, SoloQ-C's included: K <= 1048), and near the CPU SoloQ reference as the forward test asks. */
TEST(gpu_int8, forward_with_int8_path_equals_forward_without) {
    NEED_GPU();
    for (const char *fx : {"tiny-llada", "tiny-dream"}) {
        dllm_model *m = test_load(test_data(fx));
        if (!m) { CHECK(m != nullptr); continue; }
        const int n = 150, V = m->cfg.n_vocab;
        std::vector<int32_t> ids((size_t)n);
        for (int i = 0; i < n; i++) ids[(size_t)i] = (int32_t)((i * 7919 + 13) % V);
        for (int p : {DLLM_PRECISION_SOLOQ_I, DLLM_PRECISION_SOLOQ_C, DLLM_PRECISION_RTN_W4A4}) {
            dllm_ctx *g = test_soloq_ctx(m, DLLM_BACKEND_GPU, p, 0);
            if (!g) { CHECK_MSG(g != nullptr, "%s %s: %s", fx, dllm__precision_name(p), dllm_last_error()); continue; }
            dllm__gpu_backend *gpu = (dllm__gpu_backend *)g->impl.get();
            std::vector<float> with((size_t)n * V, NAN), without(with.size(), NAN);
            const long before = gpu->q4_int8_launches();
            CHECK(dllm_logits(g, ids.data(), n, 0, n, with.data(), with.size()) == DLLM_OK);
            const long ran = gpu->q4_int8_launches() - before;
            gpu->set_q4_int8(false);
            CHECK(dllm_logits(g, ids.data(), n, 0, n, without.data(), without.size()) == DLLM_OK);
            CHECK_MSG(gpu->q4_int8_launches() - before == ran, "%s %s: the INT8 path ran while switched off", fx,
                      dllm__precision_name(p));
            printf("    %s %s, %d rows: %ld INT8 GEMMs\n", fx, dllm__precision_name(p), n, ran);
            CHECK_MSG(ran > 0, "%s %s: the forward of %d rows never took the INT8 path", fx, dllm__precision_name(p),
                      n);
            CHECK_MSG(memcmp(with.data(), without.data(), with.size() * 4) == 0,
                      "%s %s: logits differ with the INT8 path", fx, dllm__precision_name(p));
            dllm_ctx *cpu = test_soloq_ctx(m, DLLM_BACKEND_CPU, p, 0),
                     *exact = test_soloq_ctx(m, DLLM_BACKEND_CPU, DLLM_PRECISION_BF16, 0);
            std::vector<float> ref(with.size(), NAN), fp32(with.size(), NAN);
            CHECK(cpu && exact && dllm_logits(cpu, ids.data(), n, 0, n, ref.data(), ref.size()) == DLLM_OK &&
                  dllm_logits(exact, ids.data(), n, 0, n, fp32.data(), fp32.size()) == DLLM_OK);
            const double to_ref = test_nmse(with.data(), ref.data(), ref.size()),
                         effect = test_nmse(ref.data(), fp32.data(), ref.size());
            CHECK_MSG(to_ref < effect, "%s %s: GPU %.3e from the CPU SoloQ reference, quantisation effect %.3e", fx,
                      dllm__precision_name(p), to_ref, effect);
            dllm_ctx_free(cpu);
            dllm_ctx_free(exact);
            dllm_ctx_free(g);
        }
        dllm_model_free(m);
    }
}
