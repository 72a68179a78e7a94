/* Tests: [W4 GEMM] q4_gemm (section 13), its launcher and its CPU twin dllm__cpu_q4_gemm (section 9b). The JIT, table
 * and decoding tests run anywhere; the kernel against its twin needs a GPU. */

// ---- CPU: the module compiles, the decoders' arithmetic, the twin, the launcher's checks ---------------------

/* Every architecture of the table: the W4 GEMM module compiles with neither spills nor a stack frame (the
 * accumulators and weight words must stay in registers), and each kernel of its table takes, as compiled, the
 * parameters its host handle passes (as backend.kernel_table_matches_the_compiled_kernels checks the other tables). */
TEST(jit, q4_gemm_compiles_without_spills) {
    for (const dllm__arch &row : dllm__arch_table) {
        const dllm__arch a = dllm__arch_for(row.cc);
        std::vector<char> cubin;
        std::vector<std::string> lowered;
        std::string log, ptx;
        const dllm__jit_request rq = dllm__module_q4_gemm(a);
        CHECK_STATUS(dllm__nvrtc_compile(rq, cubin, lowered, log, &ptx), DLLM_OK, nullptr);
        CHECK_MSG(!dllm__log_has_spills(log) && !dllm__log_reports(log, "stack frame"),
                  "q4_gemm spills or has a stack frame on %s:\n%s", a.target, log.c_str());
        CHECK(lowered.size() == 11 && cubin.size() > 1000);
#define TEST_Q4_SIZES(kname, attrs, params)                                                                            \
    CHECK_MSG(test_ptx_param_sizes(ptx, #kname) == dllm__kernel<dllm__sig_##kname>::param_sizes(),                     \
              "%s on %s: parameters differ from its handle's", #kname, a.target);
        DLLM__Q4_GEMM_KERNELS(TEST_Q4_SIZES)
#undef TEST_Q4_SIZES
        printf("    %s:\n%s", a.target, test_register_report(log).c_str());
    }
}

/* q4_e8p_open / q4_e8p_index's arithmetic on the generated abs-pattern entries
 * (the kernel's formula, written again here) gives dllm__e8p_decode4's coordinates for all 65536 codes. */
TEST(q4_gemm, e8p_table_indices_match_the_decoder) {
    size_t wrong = 0;
    for (uint32_t code = 0; code < 65536; code++) {
        const uint32_t pat = dllm__q4_e8p_abs_entry((int)(code >> 8)), shift = code & 1;
        const uint32_t signs = (code & 0xFEu) | (((pat >> 16) ^ (uint32_t)__builtin_popcount(code & 0xFEu)) & 1);
        int want[8];
        dllm__e8p_decode4((uint16_t)code, want);
        for (int i = 0; i < 8; i++) {
            const uint32_t u = (pat >> (2 * i)) & 3, idx = (signs >> i) & 1 ? 4 + shift - 2 * u : 6 + shift + 2 * u;
            wrong += (int)idx != (want[i] + 11) / 2;
        }
    }
    CHECK_MSG(wrong == 0, "%zu coordinates decode differently", wrong);
}

/* PTX prmt (__byte_perm): byte k of the result is byte selector nibble k of the 8 bytes {b, a} (a bytes 0..3). */
static uint32_t test_prmt(uint32_t a, uint32_t b, uint32_t sel) {
    const uint64_t bytes = (uint64_t)b << 32 | a;
    uint32_t r = 0;
    for (int k = 0; k < 4; k++) r |= (uint32_t)(bytes >> (8 * (sel >> (4 * k) & 7)) & 0xFF) << (8 * k);
    return r;
}

/* The INT4 and RTN bit tricks (q4_dequant), on every nibble pair of a byte and at every byte of a word: the bf16
 * pattern built from the word, times the constant plus the constant (exact in double: small integers), is the C value
 * dllm__q4_value decodes, element 2i in the low half, 2i + 1 in the high half. */
TEST(q4_gemm, int_bit_tricks_decode_every_nibble) {
    auto bf16 = [](uint32_t bits) { return (double)dllm__bf16_to_f32((uint16_t)bits); };
    size_t wrong = 0;
    for (int f : {DLLM__Q4_INT4, DLLM__Q4_RTN})
        for (int lo = 0; lo < 16; lo++)
            for (int hi = 0; hi < 16; hi++)
                for (int i = 0; i < 4;
                     i++) {  // element 2i at bits 8i, element 2i + 1 at bits 8i + 4, other bytes noise
                    const uint32_t w =
                        ((uint32_t)lo << (8 * i) | (uint32_t)hi << (8 * i + 4)) | (0x9E3779B9u & ~(0xFFu << (8 * i)));
                    uint32_t r;
                    double mul, add;
                    if (f == DLLM__Q4_INT4) {
                        r = (test_prmt(w << 1, w >> 3, 0x4400u + 0x1111u * i) & 0x001E001Eu) ^ 0x43914391u, mul = 0.5,
                        add = -144;
                    } else {
                        r = (test_prmt(w, w >> 4, 0x4400u + 0x1111u * i) & 0x000F000Fu) ^ 0x43084308u, mul = 1,
                        add = -136;
                    }
                    const uint8_t packed[1] = {(uint8_t)(lo | hi << 4)};
                    wrong += bf16(r & 0xFFFF) * mul + add != dllm__q4_value((dllm__q4_format)f, packed, nullptr, 0);
                    wrong += bf16(r >> 16) * mul + add != dllm__q4_value((dllm__q4_format)f, packed, nullptr, 1);
                }
    CHECK_MSG(wrong == 0, "%zu decodes differ", wrong);
}

/* Every generated table value is exactly its CPU number (bf16 holds them all). */
TEST(q4_gemm, generated_tables_are_exact) {
    size_t wrong = 0;
    for (int c = 0; c < 256; c++) {
        const float v = dllm__e4m3_table()[c];
        wrong += v == v && dllm__bf16_to_f32(dllm__f32_to_bf16(v)) != v;
    }
    for (int c = 0; c < 16; c++) {
        const uint8_t packed[1] = {(uint8_t)c}, bs[1] = {0x38};  // block scale 1.0
        wrong += dllm__bf16_to_f32(dllm__f32_to_bf16(dllm__q4_value(DLLM__Q4_NVFP4, packed, bs, 0))) !=
                 dllm__e2m1_to_f32((uint8_t)c);
        wrong += dllm__bf16_to_f32(dllm__f32_to_bf16(dllm__q4_value(DLLM__Q4_LLOYD, packed, nullptr, 0))) !=
                 dllm__q4_value(DLLM__Q4_LLOYD, packed, nullptr, 0);
    }
    for (int i = 0; i < 144; i++) wrong += std::abs(dllm__e8p_int(2 * (i / 12) - 11, 2 * (i % 12) - 11)) > 127;
    CHECK(dllm__e4m3_table()[0x38] == 1.0f);
    CHECK_MSG(wrong == 0, "%zu table values are not exact in bf16", wrong);
    const std::string src = dllm__src_q4_tables();
    CHECK(src.find("q4_e8p_abs_table[256]") != std::string::npos &&
          src.find("q4_lloyd_table[16]") != std::string::npos);
}

/* Random rows of N(0, 1) quantised by the CPU quantiser. */
static dllm__q4_rows test_q4_weights(test_rng &r, dllm__q4_format f, int N, int K) {
    std::vector<float> x((size_t)N * K);
    for (float &v : x) v = r.normal();
    return dllm__q4_quantize(nullptr, f, x.data(), N, K, r.below(2) != 0);
}

/* Activation C values of the kind the format's GEMM sees: integer formats their integer codes (INT4: odd in
 * [-15, 15]; RTN: [-7, 7]; so every product and partial sum is an exact integer), the others random bf16 values
 * (W4A16, and any exact C values are a special case of them). Rows lda apart, the padding poisoned with NaN. */
static std::vector<float> test_q4_acts(test_rng &r, dllm__q4_format f, int M, int K, int lda) {
    std::vector<float> a((size_t)M * lda, NAN);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            float &v = a[(size_t)m * lda + k];
            if (f == DLLM__Q4_INT4) v = (float)(2 * (r.below(16) - 8) + 1);
            else if (f == DLLM__Q4_RTN) v = (float)(r.below(15) - 7);
            else v = dllm__bf16_to_f32(dllm__f32_to_bf16(r.normal() * 8));
        }
    return a;
}

static bool test_q4_exact_format(dllm__q4_format f) { return f == DLLM__Q4_INT4 || f == DLLM__Q4_RTN; }

/* The twin against float64 on the dequantised rows (dllm__q4_row: C * row scale): it decodes the packed layout as the
 * quantiser wrote it, E8P groups included. Integer formats: exact; others: within 2^-20 of the products' magnitude. */
TEST(q4_gemm, twin_matches_float64_on_dequantised_rows) {
    test_rng r("q4 twin");
    const int M = 3, N = 24, K = 200, lda = 208;
    for (int fi = 0; fi <= DLLM__Q4_RTN; fi++) {
        const dllm__q4_format f = (dllm__q4_format)fi;
        const dllm__q4_rows w = test_q4_weights(r, f, N, K);
        const std::vector<float> a = test_q4_acts(r, f, M, K, lda);
        std::vector<float> s_x((size_t)M), y((size_t)M * N, NAN), row((size_t)K);
        for (float &s : s_x) s = 0.5f + r.uniform();
        dllm__cpu_q4_gemm(f, w.codes.data(), w.block_scales.data(), w.row_scale.data(), a.data(), lda, s_x.data(),
                          y.data(), N, M, N, K);
        size_t bad = 0;
        for (int n = 0; n < N; n++) {
            dllm__q4_row(w, n, row.data());
            for (int m = 0; m < M; m++) {
                double want = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    want += (double)a[(size_t)m * lda + k] * row[(size_t)k];
                    mag += fabs((double)a[(size_t)m * lda + k] * row[(size_t)k]);
                }
                want *= s_x[(size_t)m];
                bad += !(fabs(y[(size_t)m * N + n] - want) <= 0x1p-20 * mag * s_x[(size_t)m] + 1e-30);
            }
        }
        CHECK_MSG(bad == 0, "%s: %zu outputs off", dllm__q4_names[f], bad);
    }
}

/* The launcher refuses what the kernel cannot take, with a message naming the argument, before touching the GPU. */
TEST(q4_gemm, launcher_rejects_bad_arguments) {
    dllm__q4_gemm_kernels k;
    k.sm_count = 132;
    alignas(16) static uint16_t A[64 * 64];
    static uint8_t codes[64 * 32];
    static float scales[64], y[64 * 64], ws[16];
    auto run = [&](dllm__q4_format f, const void *a, int lda, int ldy, int M, int N, int K, float *w, size_t wn) {
        return dllm__q4_gemm_run(k, f, codes, nullptr, scales, a, lda, nullptr, y, ldy, 0, CUDA_R_32F, M, N, K, w, wn,
                                 0);
    };
    CHECK_STATUS(run(DLLM__Q4_INT4, A, 64, 64, 65, 8, 64, nullptr, 0), DLLM_ERR_INVALID_ARGUMENT, "65 activation rows");
    CHECK_STATUS(run(DLLM__Q4_INT4, A, 64, 64, 4, 12, 64, nullptr, 0), DLLM_ERR_INVALID_ARGUMENT, "multiples of 8");
    CHECK_STATUS(run(DLLM__Q4_INT4, A, 64, 64, 4, 8, 60, nullptr, 0), DLLM_ERR_INVALID_ARGUMENT, "multiples of 8");
    CHECK_STATUS(run(DLLM__Q4_NVFP4, A, 64, 64, 4, 8, 64, nullptr, 0), DLLM_ERR_INVALID_ARGUMENT, "block scales");
    CHECK_STATUS(run(DLLM__Q4_INT4, A, 60, 64, 4, 8, 56, nullptr, 0), DLLM_ERR_INVALID_ARGUMENT, "lda");
    CHECK_STATUS(run(DLLM__Q4_INT4, A + 1, 64, 64, 4, 8, 64, nullptr, 0), DLLM_ERR_INVALID_ARGUMENT, "16-byte");
    CHECK_STATUS(dllm__q4_gemm_run(k, DLLM__Q4_NVFP4, codes, codes + 1, scales, A, 64, nullptr, y, 8, 0, CUDA_R_32F, 4,
                                   8, 64, nullptr, 0, 0),
                 DLLM_ERR_INVALID_ARGUMENT, "block scales 4-byte");
    CHECK_STATUS(run(DLLM__Q4_INT4, A, 64, 7, 4, 8, 64, nullptr, 0), DLLM_ERR_INVALID_ARGUMENT, "ldy");
    CHECK_STATUS(run((dllm__q4_format)7, A, 64, 64, 4, 8, 64, nullptr, 0), DLLM_ERR_INVALID_ARGUMENT, "format 7");
    // 8 x 64 on 132 SMs splits K: a workspace is required, and sized by M
    CHECK(dllm__q4_gemm_workspace_floats(k, 4, 8, 64) == 0);  // one chunk: nothing to split
    CHECK(dllm__q4_gemm_splits(132, 8, 4096) == 32 &&
          dllm__q4_gemm_workspace_floats(k, 4, 8, 4096) == (size_t)32 * 4 * 8);
    CHECK_STATUS(dllm__q4_gemm_run(k, DLLM__Q4_INT4, codes, nullptr, scales, A, 64, nullptr, y, 8, 0, CUDA_R_16F, 4, 8,
                                   64, nullptr, 0, 0),
                 DLLM_ERR_INVALID_ARGUMENT, "bf16 or fp32");
    CHECK_STATUS(dllm__q4_gemm_run(k, DLLM__Q4_INT4, codes, nullptr, scales, A, 4096, nullptr, y, 8, 0, CUDA_R_32F, 4,
                                   8, 4096, ws, 16, 0),
                 DLLM_ERR_INVALID_ARGUMENT, "workspace");
    // split-K never depends on M, and the LLaDA-8B shapes split as designed: a CTA an SM or more, every chunk used
    for (int N : {4096, 6144, 2 * 12288})
        for (int K : {4096, 12288}) {
            const int cps = dllm__q4_gemm_chunks_per_split(132, N, K), splits = dllm__q4_gemm_splits(132, N, K),
                      ctas = (N + 127) / 128;
            CHECK(ctas * splits >= 132 && (splits - 1) * cps < K / 128 && splits * cps >= K / 128);
        }
    CHECK(dllm__q4_gemm_splits(132, 2 * 12288, 4096) == 2 && dllm__q4_gemm_splits(132, 4096, 4096) == 11);
    CHECK(dllm__q4_gemm_splits(132, dllm__q4_bn * dllm__q4_ctas_per_sm * 132, 4096) ==
          1);  // a full wave without splitting
}

/* One format's operands (kept on the host) and the twin's output for them. */
struct test_q4_case {
    dllm__q4_format f;
    int M, N, K, lda, ldy, col0;
    bool f32, with_sx;
    dllm__q4_rows w;
    std::vector<float> a, s_x, want;  // want: [M][ldy] fp32 (the twin; rounded to bf16 where the output is)
};

static test_q4_case test_q4_make(test_rng &r, dllm__q4_format f, int M, int N, int K, bool f32) {
    test_q4_case c;
    c.f = f, c.M = M, c.N = N, c.K = K, c.f32 = f32;
    c.lda = K + 8 * r.below(3), c.col0 = r.below(2) * 8, c.ldy = c.col0 + N + 8 * r.below(2);
    c.with_sx = r.below(4) != 0;
    c.w = test_q4_weights(r, f, N, K);
    c.a = test_q4_acts(r, f, M, K, c.lda);
    c.s_x.resize((size_t)M);
    for (float &s : c.s_x) s = ldexpf(1 + r.uniform(), r.below(9) - 4);
    std::vector<float> y((size_t)M * N);
    dllm__cpu_q4_gemm(f, c.w.codes.data(), c.w.block_scales.data(), c.w.row_scale.data(), c.a.data(), c.lda,
                      c.with_sx ? c.s_x.data() : nullptr, y.data(), N, M, N, K);
    c.want = y;
    if (!f32)
        for (float &v : c.want) v = dllm__bf16_to_f32(dllm__f32_to_bf16(v));
    return c;
}

/* Outputs y [M][N] that differ from c's twin, and the worst error in units of the bound. INT4 and RTN (integer
 * activations): equal values (+0 and -0 not told apart: an exact cancellation's zero), so bit for bit otherwise.
 * NVFP4, Lloyd-Max and E8P: the same exact products summed in another order with fp32 accumulation, so
 * |y - twin| <= 2^-16 of the products' magnitude sum |A C_w| s_x s_w (K <= 1200 here: about 2^-24 an addition with
 * room to spare), plus a bf16 step (2^-7 relative) where the output is bf16 and the two fp32 sums straddle a rounding
 * boundary. A wrong fragment, pair order, table or scale is off by far more. */
static size_t test_q4_mismatches(const test_q4_case &c, const std::vector<float> &y, double &worst) {
    const int M = c.M, N = c.N, K = c.K, blocks = (K + 15) / 16;
    std::vector<float> wrow((size_t)K);
    size_t bad = 0;
    worst = 0;
    for (int n = 0; n < N; n++) {
        dllm__q4_row_values(c.f, c.w.codes.data() + (size_t)n * (K / 2),
                            c.f == DLLM__Q4_NVFP4 ? c.w.block_scales.data() + (size_t)n * blocks : nullptr, K,
                            wrow.data());
        for (int m = 0; m < M; m++) {
            const float got = y[(size_t)m * N + n], want = c.want[(size_t)m * N + n];
            if (test_q4_exact_format(c.f)) {
                bad += !(got == want && (got != 0 || want == 0));
                continue;
            }
            double mag = 0;
            for (int kk = 0; kk < K; kk++) mag += fabs((double)c.a[(size_t)m * c.lda + kk] * wrow[(size_t)kk]);
            mag *= (c.with_sx ? c.s_x[(size_t)m] : 1.0) * fabs(c.w.row_scale[(size_t)n]);
            const double err = fabs((double)got - want), bound = 0x1p-16 * mag + (c.f32 ? 0 : 0x1p-7 * fabs(want));
            worst = std::max(worst, bound > 0 ? err / bound : err);
            bad += !(err <= bound);
        }
    }
    return bad;
}

/* q4_gemm's data movement emulated on the CPU, lane by lane, with mma.sync m16n8k16's fragment definitions (PTX ISA
 * 9.7.14.5.8: A a0 = (row g, cols 2t, 2t+1), a1 = (g + 8, same), a2 = (g, 2t+8, 2t+9), a3 = (g + 8, same); B b0 = (rows
 * 2t, 2t+1, col g), b1 = (2t+8, 2t+9, col g); C c0, c1 = (g, 2t, 2t+1), c2, c3 = (g + 8, same)). It repeats the
 * kernel's index arithmetic (which words a lane loads, where NVFP4's block scales are found, which activation slot a
 * thread copies a k group to and which one a lane reads, which pairs make which fragment, where c lands, split-K's
 * partials and their reduction), so that a slip in that reasoning shows here without a GPU; the values of words come
 * from the decoders the other tests check. Returns y [M][N] fp32. */
static int test_q4_act_slot(int q, int r) { return ((q & 3) << 2 | q >> 2) ^ 5 * (r & 1); }  // q4_act_slot

static std::vector<float> test_q4_emulate(const test_q4_case &c, int sm_count) {
    const int M = c.M, N = c.N, K = c.K, blocks = (K + 15) / 16, kc = dllm__q4_kc, chunks = (K + kc - 1) / kc;
    const int cps = dllm__q4_gemm_chunks_per_split(sm_count, N, K), splits = dllm__q4_gemm_splits(sm_count, N, K),
              m_tiles = (M + 7) / 8;
    // NVFP4: the block scale of word j as q4_issue_chunk / q4_read_chunk find it: two 4-byte copies from the 4-aligned
    // index below b0 (zeros past the array's end), then __funnelshift_r, byte j / 2, written out here
    auto nvfp4_scale = [&](int n, int k0, int t, int j) {
        const uint64_t total = (uint64_t)N * blocks, b0 = (uint64_t)n * blocks + k0 / 16 + 2 * t,
                       base = b0 & ~(uint64_t)3;
        uint32_t win[2] = {0, 0};
        for (int i = 0; i < 2; i++)
            for (int b = 0; b < 4; b++)
                if (base + 4 * i + b < total) win[i] |= (uint32_t)c.w.block_scales[base + 4 * i + b] << (8 * b);
        const uint32_t picked = (uint32_t)((((uint64_t)win[1] << 32) | win[0]) >> (8 * (b0 & 3)));
        return dllm__e4m3_table()[picked >> (8 * (j / 2)) & 0xFF];
    };
    // C of element i of word j of lane t at (n, k0)
    std::vector<float> cw((size_t)N * K);
    for (int n = 0; n < N && c.f != DLLM__Q4_NVFP4; n++)
        dllm__q4_row_values(c.f, c.w.codes.data() + (size_t)n * (K / 2), nullptr, K, &cw[(size_t)n * K]);
    auto word_value = [&](int n, int k0, int t, int j, int i) {
        const int k = k0 + 32 * t + 8 * j;
        if (c.f != DLLM__Q4_NVFP4) return cw[(size_t)n * K + k + i];
        const uint8_t code = c.w.codes[(size_t)n * (K / 2) + (k + i) / 2] >> (4 * ((k + i) & 1)) & 15;
        return dllm__e2m1_to_f32(code) * nvfp4_scale(n, k0, t, j);
    };
    std::vector<float> partial((size_t)splits * M * N, NAN), y((size_t)M * N, NAN);
    for (int bx = 0; bx < (N + dllm__q4_bn - 1) / dllm__q4_bn; bx++)
        for (int split = 0; split < splits; split++)
            for (int warp = 0; warp < dllm__q4_warps; warp++) {
                const int c_begin = split * cps, c_end = std::min(chunks, c_begin + cps),
                          k_end = std::min(K, c_end * kc);
                // acc[lane][wt][mt][e]; pair registers as (lo, hi) floats
                std::vector<float> acc((size_t)32 * dllm__q4_wt * 8 * 4, 0.0f);
                for (int ch = c_begin; ch < c_end; ch++) {
                    const int k0 = ch * kc;
                    // the chunk's activation stage as the threads' copies fill it: slot v of row r holds k group
                    // q4_act_slot(v, r), zeros past M or k_end
                    std::vector<float> stage((size_t)m_tiles * 8 * 16 * 8);
                    for (int v = 0; v < m_tiles * 8 * 16; v++) {
                        const int r = v / 16, kq = k0 + 8 * test_q4_act_slot(v % 16, r);
                        for (int e = 0; e < 8; e++)
                            stage[(size_t)v * 8 + e] = r < M && kq < k_end ? c.a[(size_t)r * c.lda + kq + e] : 0.0f;
                    }
                    for (int j = 0; j < 4; j++)
                        for (int mt = 0; mt < m_tiles; mt++)
                            for (int wt = 0; wt < dllm__q4_wt; wt++)
                                for (int step = 0; step < 2; step++) {
                                    double A[16][16] = {}, B[16][8] = {};
                                    for (int lane = 0; lane < 32; lane++) {
                                        const int g = lane / 4, t = lane % 4,
                                                  n0 = bx * dllm__q4_bn + warp * 16 * dllm__q4_wt + g;
                                        const int k = k0 + 32 * t + 8 * j;
                                        // pairs (e_2i, e_2i+1) of rows g (h 0) and g + 8 (h 1); zero past N or k_end
                                        float p[2][4][2];
                                        for (int h = 0; h < 2; h++)
                                            for (int i = 0; i < 4; i++)
                                                for (int half = 0; half < 2; half++) {
                                                    const int n = n0 + 16 * wt + 8 * h;
                                                    p[h][i][half] = n < N && k < k_end
                                                                        ? word_value(n, k0, t, j, 2 * i + half)
                                                                        : 0.0f;
                                                }
                                        // the 16 bytes lane reads from row mt * 8 + g's slot for k group 4 t + j: pairs
                                        // (e0, e1) .. (e6, e7)
                                        const int m = mt * 8 + g;
                                        const float *x = &stage[((size_t)m * 16 + test_q4_act_slot(4 * t + j, m)) * 8];
                                        float b[4][2];
                                        for (int i = 0; i < 4; i++)
                                            for (int half = 0; half < 2; half++) b[i][half] = x[2 * i + half];
                                        // step 0: a = (p0[0], p1[0], p0[1], p1[1]), b = (b[0], b[1]); step 1: pairs 2
                                        // and 3
                                        const int q = 2 * step;
                                        const float *a_reg[4] = {p[0][q], p[1][q], p[0][q + 1], p[1][q + 1]},
                                                    *b_reg[2] = {b[q], b[q + 1]};
                                        for (int r = 0; r < 4; r++)
                                            for (int half = 0; half < 2; half++)
                                                A[g + 8 * (r & 1)][2 * t + half + 8 * (r >> 1)] = a_reg[r][half];
                                        for (int r = 0; r < 2; r++)
                                            for (int half = 0; half < 2; half++)
                                                B[2 * t + half + 8 * r][g] = b_reg[r][half];
                                    }
                                    for (int lane = 0; lane < 32; lane++) {
                                        const int g = lane / 4, t = lane % 4;
                                        for (int e = 0; e < 4; e++) {
                                            const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
                                            double d = 0;
                                            for (int kk = 0; kk < 16; kk++) d += A[row][kk] * B[kk][col];
                                            float &r = acc[(((size_t)lane * dllm__q4_wt + wt) * 8 + mt) * 4 + e];
                                            r = (float)(r + d);
                                        }
                                    }
                                }
                }
                for (int lane = 0; lane < 32; lane++) {
                    const int g = lane / 4, t = lane % 4, n0 = bx * dllm__q4_bn + warp * 16 * dllm__q4_wt + g;
                    for (int wt = 0; wt < dllm__q4_wt; wt++)
                        for (int mt = 0; mt < m_tiles; mt++)
                            for (int e = 0; e < 4; e++) {
                                const int n = n0 + 16 * wt + 8 * (e >> 1), m = mt * 8 + 2 * t + (e & 1);
                                if (m >= M || n >= N) continue;
                                partial[((size_t)split * M + m) * N + n] =
                                    acc[(((size_t)lane * dllm__q4_wt + wt) * 8 + mt) * 4 + e];
                            }
                }
            }
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float v = partial[(size_t)m * N + n];
            for (int sp = 1; sp < splits; sp++) v += partial[((size_t)sp * M + m) * N + n];
            y[(size_t)m * N + n] = (v * (c.with_sx ? c.s_x[(size_t)m] : 1.0f)) * c.w.row_scale[(size_t)n];
        }
    return y;
}

/* The emulation against the twin, judged as the kernel is (test_q4_mismatches). Shapes with split-K, partial tiles, K =
 * 8 mod 16 and K = 0 mod 32 (16-byte weight copies: the same words land); a small SM count makes the no-split-K path
 * reachable at a small N. */
TEST(q4_gemm, kernel_data_movement_emulated_matches_twin) {
    test_rng r("q4 emulation");
    struct {
        int M, N, K, sms;
    } shapes[] = {{3, 200, 16 * 25, 132},
                  {17, 136, 8 * 41, 132},
                  {9, 264, 16 * 9, 1},
                  {64, 8, 16 * 11, 132},
                  {32, 136, 32 * 13, 132}};
    for (int fi = 0; fi <= DLLM__Q4_RTN; fi++)
        for (const auto &sh : shapes) {
            const dllm__q4_format f = (dllm__q4_format)fi;
            const test_q4_case c = test_q4_make(r, f, sh.M, sh.N, sh.K, true);
            double worst;
            const size_t bad = test_q4_mismatches(c, test_q4_emulate(c, sh.sms), worst);
            CHECK_MSG(bad == 0, "%s M=%d N=%d K=%d (%d SMs): %zu outputs differ", dllm__q4_names[f], sh.M, sh.N, sh.K,
                      sh.sms, bad);
        }
}

/* The activation stage's slots (q4_act_slot): a permutation of a row's 16 k groups that is its own inverse (the copy
 * of slot v fetches group slot(v), the read of group q takes slot(q)), q4_chunk's two-base form of the read address is
 * the same slot, and a quarter warp's 8 16-byte reads (lanes 8 i .. 8 i + 7) hit 8 distinct 16-byte bank groups. */
TEST(q4_gemm, activation_slots_invert_and_reads_are_conflict_free) {
    size_t wrong = 0;
    for (int r = 0; r < 16; r++)
        for (int q = 0; q < 16; q++) wrong += test_q4_act_slot(test_q4_act_slot(q, r), r) != q;
    for (int mt = 0; mt < 8; mt++)
        for (int j = 0; j < 4; j++)
            for (int quarter = 0; quarter < 4; quarter++) {
                unsigned banks = 0;
                for (int lane = 8 * quarter; lane < 8 * quarter + 8; lane++) {
                    const int g = lane / 4, t = lane % 4, p = g & 1, r = mt * 8 + g,
                              at = r * 256 + 16 * test_q4_act_slot(4 * t + j, r);
                    const int even = g * 256 + 16 * (t ^ p) + 64 * p,
                              base = j & 1 ? even - 128 * p : even;  // q4_chunk's
                    wrong += base + 64 * j + mt * 8 * 256 != at;
                    banks |= 1u << (at / 16 % 8);
                }
                wrong += banks != 0xFF;
            }
    CHECK_MSG(wrong == 0, "%zu slot checks failed", wrong);
}

// ---- GPU: q4_gemm against its twin -----------------------------------------------------------------------

/* Runs q4_gemm on rows [m0, m0 + M) of c (so that a row can be computed alone) into a poisoned output; returns the
 * [M][N] block it wrote, as floats, and checks that nothing outside it was written. */
static std::vector<float> test_q4_run(dllm_test_state &T_, const dllm__q4_gemm_kernels &k, const test_q4_case &c,
                                      int m0, int M) {
    dllm__dbuf dcodes, dbs, drs, da, dsx, dy, dws;
    test_put(dcodes, c.w.codes);
    if (c.f == DLLM__Q4_NVFP4) test_put(dbs, c.w.block_scales);
    test_put(drs, c.w.row_scale);
    test_put(da, test_bf16_vec(c.a));
    test_put(dsx, c.s_x);
    const size_t esize = c.f32 ? 4 : 2, y_elems = (size_t)M * c.ldy,
                 ws = dllm__q4_gemm_workspace_floats(k, M, c.N, c.K);
    test_poison(dy, y_elems * esize);
    if (ws) test_poison(dws, ws * 4);
    const uint16_t *a_rows = da.as<uint16_t>() + (size_t)m0 * c.lda;
    CHECK_STATUS(dllm__q4_gemm_run(k, c.f, dcodes.ptr, dbs.ptr, drs.as<float>(), a_rows, c.lda,
                                   c.with_sx ? dsx.as<float>() + m0 : nullptr, dy.ptr, c.ldy, c.col0,
                                   c.f32 ? CUDA_R_32F : CUDA_R_16BF, M, c.N, c.K, ws ? dws.as<float>() : nullptr, ws,
                                   0),
                 DLLM_OK, nullptr);
    std::vector<float> all((size_t)y_elems), out((size_t)M * c.N);
    if (c.f32) all = test_get<float>(dy, y_elems);
    else all = test_f32_vec(test_get<uint16_t>(dy, y_elems));
    size_t stray = 0;
    for (int m = 0; m < M; m++)
        for (int j = 0; j < c.ldy; j++) {
            const float v = all[(size_t)m * c.ldy + j];
            if (j >= c.col0 && j < c.col0 + c.N) out[(size_t)m * c.N + j - c.col0] = v;
            else stray += v == v;  // the poison is NaN
        }
    CHECK_MSG(stray == 0, "%zu outputs written outside the [M][N] block at column %d", stray, c.col0);
    return out;
}

static void test_q4_case_run(dllm_test_state &T_, const dllm__q4_gemm_kernels &k, test_rng &r, dllm__q4_format f, int M,
                             int N, int K, bool f32) {
    const test_q4_case c = test_q4_make(r, f, M, N, K, f32);
    double worst;
    const size_t bad = test_q4_mismatches(c, test_q4_run(T_, k, c, 0, M), worst);
    printf("    %-9s M=%2d N=%5d K=%4d %s%s: %s\n", dllm__q4_names[f], M, N, K, f32 ? "fp32" : "bf16",
           c.with_sx ? "" : " (no s_x)",
           test_q4_exact_format(f) ? (bad ? "NOT exact" : "exact")
                                   : dllm__format("worst error %.2f of the bound", worst).c_str());
    CHECK_MSG(bad == 0, "%s M=%d N=%d K=%d: %zu of %d outputs differ from the twin", dllm__q4_names[f], M, N, K, bad,
              M * N);
}

/* A weight row count that fills the GPU without split-K. */
static int test_q4_unsplit_n(const dllm__q4_gemm_kernels &k) { return dllm__q4_bn * dllm__q4_ctas_per_sm * k.sm_count; }

static bool test_q4_load(dllm_test_state &T_, dllm__q4_gemm_kernels &k) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return false;
    CHECK_STATUS(dllm__q4_gemm_load(dllm__arch_for(p.major * 10 + p.minor), k), DLLM_OK, nullptr);
    return k.q4_gemm_int4.fn != nullptr;
}

TEST(gpu_q4, gemm_matches_twin_every_format_and_shape) {
    NEED_GPU();
    dllm__q4_gemm_kernels k;
    if (!test_q4_load(T_, k)) return;
    test_rng r("q4_gemm vs twin");
    for (int fi = 0; fi <= DLLM__Q4_RTN; fi++) {
        const dllm__q4_format f = (dllm__q4_format)fi;
        test_q4_case_run(T_, k, r, f, 1, 8, 16 * 7, false);     // one row, one partial weight tile, one partial chunk
        test_q4_case_run(T_, k, r, f, 3, 200, 16 * 25, true);   // split-K over 4 chunks, a partial last one
        test_q4_case_run(T_, k, r, f, 17, 1000, 16 * 75, false); // a partial activation tile, 8 weight CTAs
        test_q4_case_run(T_, k, r, f, 64, 1000, 16 * 9, true);  // every activation tile
        test_q4_case_run(T_, k, r, f, 5, 1000, 8 * 25,
                         false);  // K = 8 mod 16 (E8P's granularity; every format takes it)
        test_q4_case_run(T_, k, r, f, 32, 520, 32 * 37,
                         true);  // K % 32 == 0: 16-byte weight copies, a partial last chunk
        test_q4_case_run(T_, k, r, f, 3, test_q4_unsplit_n(k), 16 * 7,
                         false);  // no split-K: the epilogue in the GEMM itself
    }
}

/* Row m of a 64-row launch equals the same row computed alone (M = 1), bit for bit, in every format; and a second run
 * of the same launch gives the same bits (no timing-dependent reduction). */
TEST(gpu_q4, rows_do_not_depend_on_m_and_runs_repeat) {
    NEED_GPU();
    dllm__q4_gemm_kernels k;
    if (!test_q4_load(T_, k)) return;
    test_rng r("q4_gemm rows");
    for (int fi = 0; fi <= DLLM__Q4_RTN; fi++) {
        const dllm__q4_format f = (dllm__q4_format)fi;
        for (int N : {264, test_q4_unsplit_n(k)}) {  // with and without split-K
            const test_q4_case c =
                test_q4_make(r, f, 64, N, N > 1000 ? 16 * 9 : 16 * 41, true);  // K kept small where the twin is big
            const std::vector<float> all = test_q4_run(T_, k, c, 0, 64), again = test_q4_run(T_, k, c, 0, 64);
            CHECK_MSG(memcmp(all.data(), again.data(), all.size() * 4) == 0, "%s N=%d: two runs differ",
                      dllm__q4_names[f], N);
            for (int m : {0, 9, 38, 63}) {
                const std::vector<float> alone = test_q4_run(T_, k, c, m, 1);
                CHECK_MSG(memcmp(alone.data(), &all[(size_t)m * N], (size_t)N * 4) == 0,
                          "%s N=%d: row %d alone differs from row %d of 64", dllm__q4_names[f], N, m, m);
            }
        }
    }
}
