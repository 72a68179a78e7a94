/* Tests: FP8 precision (dllm_precision, LaCache 3.4). On the CPU: the E4M3 twin against known values, the
 * edge cases and NVIDIA's own host conversion; the group/block quantisers; the CPU FP8 forward and its
 * accuracy figures (per-layer FFN NMSE, logits error, token agreement), printed for BENCHMARKS.md. On the
 * GPU: every FP8 kernel against its twin bit for bit, the block-scaled GEMM, the FP8 forward against the
 * CPU FP8 reference, LaCache exactness under FP8. */
#include <cuda_fp8.h>

// ---- the E4M3 twin (CPU) ----------------------------------------------------------------------------

TEST(fp8, e4m3_known_values_and_edge_cases) {
    struct { float x; uint8_t code;
    } cases[] = {
        {0.0f, 0x00},
        {-0.0f, 0x00},  // one zero
        {1.0f, 0x38},
        {-1.0f, 0xb8},
        {1.125f, 0x39},
        {240.0f, 0x77},
        {0.5f, 0x30},
        {448.0f, 0x7e},
        {-448.0f, 0xfe},  // the largest finite value
        {449.0f, 0x7e},
        {464.0f, 0x7e},
        {500.0f, 0x7e},
        {1e30f, 0x7e},
        {-1e30f, 0xfe},  // above 448: saturate
        {INFINITY, 0x7e},
        {-INFINITY, 0xfe},  // satfinite: Inf saturates too
        {NAN, 0x7f},
        {-NAN, 0x7f},  // one NaN
        {432.0f, 0x7e},
        {416.0f, 0x7d},
        {431.0f, 0x7d},  // 432 is halfway between 416 and 448: to the even mantissa
        {1.0625f, 0x38},
        {1.1875f, 0x3a},  // ties to even in the normal range
        {0x1p-6f, 0x08},
        {0x1p-9f, 0x01},
        {-0x1p-9f, 0x81},
        {7 * 0x1p-9f, 0x07},  // smallest normal, subnormals
        {0x1p-10f, 0x00},
        {-0x1p-10f, 0x00},  // half the smallest subnormal ties to 0 (and the zero is +0)
        {1.5f * 0x1p-9f, 0x02},
        {2.5f * 0x1p-9f, 0x02},
        {7.5f * 0x1p-9f, 0x08},  // subnormal ties to even, 7.5 carries into the normals
        {0x1.0p-11f, 0x00},
        {1e-30f, 0x00},
        {0x1.000002p-10f, 0x01},  // underflow; just above half rounds up
        {0.1f, 0x1d},
        {3.14159f, 0x45},
    };
    for (auto &c : cases) {
        uint8_t got = dllm__f32_to_e4m3(c.x);
        CHECK_MSG(got == c.code, "e4m3(%a) = 0x%02x, want 0x%02x", (double)c.x, got, c.code);
    }
    // decode: every code; encode(decode(c)) = c except the non-canonical zero and NaN
    int round_trips = 0;
    for (int c = 0; c < 256; c++) {
        float v = dllm__e4m3_to_f32((uint8_t)c);
        int want = (c & 0x7f) == 0x7f ? 0x7f : (c & 0x7f) == 0 ? 0 : c;
        round_trips += dllm__f32_to_e4m3(v) == want;
        if ((c & 0x7f) != 0x7f && (c & 0x7f) < 0x7e) {  // decoded values grow with the code
            CHECK(fabsf(dllm__e4m3_to_f32((uint8_t)(c + 1))) > fabsf(v));
        }
    }
    CHECK(round_trips == 256);
    CHECK(dllm__e4m3_to_f32(0x7e) == 448.0f && dllm__e4m3_to_f32(0x01) == 0x1p-9f &&
          dllm__e4m3_to_f32(0x08) == 0x1p-6f);
    CHECK(dllm__e4m3_to_f32(0xff) != dllm__e4m3_to_f32(0xff));  // NaN
    // every midpoint between neighbours goes to the even code, a hair on either side to the nearer one
    int midpoints = 0;
    for (int c = 0; c < 0x7e; c++) {
        float a = dllm__e4m3_to_f32((uint8_t)c), b = dllm__e4m3_to_f32((uint8_t)(c + 1)), mid = (a + b) / 2;
        int even = (c & 1) ? c + 1 : c;
        midpoints += dllm__f32_to_e4m3(mid) == even && dllm__f32_to_e4m3(nextafterf(mid, 0)) == c &&
                     dllm__f32_to_e4m3(nextafterf(mid, INFINITY)) == c + 1;
    }
    CHECK_MSG(midpoints == 0x7e, "%d of %d midpoints round as expected", midpoints, 0x7e);
}

/* NVIDIA's host conversion (cuda_fp8.h, __NV_SATFINITE) is an independent reference; dllm's codes differ only
 * by canonicalising the zero and the NaN. */
static uint8_t test_nv_e4m3(float x) {
    uint8_t c = (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    return (c & 0x7f) == 0 ? 0 : (c & 0x7f) == 0x7f ? 0x7f : c;
}

TEST(fp8, e4m3_matches_nvidia_host_conversion) {
    size_t checked = 0, differ = 0;
    auto check = [&](float x) {
        uint8_t a = dllm__f32_to_e4m3(x), b = test_nv_e4m3(x);
        if (a != b && differ++ < 5) printf("    %a: dllm 0x%02x, cuda_fp8.h 0x%02x\n", (double)x, a, b);
        checked++;
    };
    // every float from 2^-12 to 2^10 with a stride that visits every mantissa residue class, both signs
    for (uint32_t u = 0x39800000u; u < 0x44800000u; u += 61) {
        float x;
        memcpy(&x, &u, 4);
        check(x);
        check(-x);
    }
    // and random bit patterns of every exponent (NaN, Inf, subnormal fp32 included)
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < 2000000; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        uint32_t u = (uint32_t)s;
        float x;
        memcpy(&x, &u, 4);
        check(x);
    }
    printf("    %zu values, %zu differ\n", checked, differ);
    CHECK(differ == 0);
}

// ---- the quantisers (CPU) ---------------------------------------------------------------------------

TEST(fp8, group_quantiser_scales_padding_and_nonfinite_policy) {
    const int k = 200;  // two groups, the second 72 wide
    std::vector<float> x((size_t)4 * k);
    for (int i = 0; i < k; i++) {
        x[(size_t)i] = 0.0f;                                          // row 0: all zeros
        x[(size_t)k + i] = (i % 7 - 3) * 0.37f * (i < 128 ? 1.0f : 1000.0f);  // row 1: groups of different magnitude
        x[(size_t)2 * k + i] = i == 5 ? NAN : 1.0f + i;               // row 2: a NaN
        x[(size_t)3 * k + i] = i == 150 ? INFINITY : 2.0f;            // row 3: an Inf in the second group
    }
    std::vector<uint8_t> q(x.size());
    std::vector<float> s((size_t)4 * 2);
    dllm__quantize_groups(x.data(), 4, k, q.data(), s.data());
    CHECK(s[0] == 1.0f && s[1] == 1.0f && q[0] == 0 && q[(size_t)k - 1] == 0);
    CHECK(s[2] == 3 * 0.37f / 448.0f && s[3] == 3 * 0.37f * 1000.0f / 448.0f);
    CHECK(q[(size_t)2 * k + 5] == 0x7f && s[4] == 128.0f / 448.0f &&
          q[(size_t)2 * k + 127] == 0x7e);  // NaN ignored by amax
    CHECK(s[6] == 2.0f / 448.0f && s[7] == INFINITY && q[(size_t)3 * k + 150] == 0x7f && q[(size_t)3 * k + 151] == 0);
    CHECK(dllm__e4m3_scale(0.0f) == 1.0f && dllm__e4m3_scale(1e-44f) == 1.0f &&
          dllm__e4m3_scale(1e-39f) == 1e-39f / 448.0f);
    // dequantised error: at most half a step, 2^-4 relative in the normal range
    double worst = 0;
    for (int i = 0; i < k; i++) {
        float v = x[(size_t)k + i], dq = dllm__e4m3_to_f32(q[(size_t)k + i]) * s[2 + i / 128];
        if (v != 0) worst = std::max(worst, fabs((double)dq - v) / fabs(v));
    }
    printf("    worst relative error of a dequantised value: %.4f\n", worst);
    CHECK(worst <= 1.0 / 16);
    std::vector<float> fake(x.begin() + k, x.begin() + 2 * k);
    dllm__fake_quantize_groups(fake.data(), 1, k);
    for (int i = 0; i < k; i++) CHECK(fake[(size_t)i] == dllm__e4m3_to_f32(q[(size_t)k + i]) * s[2 + i / 128]);
}

TEST(fp8, block_quantiser_partial_blocks) {
    const int rows = 200, cols = 328;  // 2 x 3 blocks, the last row and column of blocks partial
    std::vector<float> w((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            w[(size_t)r * cols + c] = sinf(0.1f * r + 0.37f * c) * (c >= 256 ? 50.0f : 1.0f) * (r >= 128 ? 0.0f : 1.0f);
    dllm__fp8_matrix m = dllm__quantize_blocks(w.data(), rows, cols);
    CHECK(m.scale.size() == 6 && m.col_blocks() == 3);
    float amax02 = 0;
    for (int r = 0; r < 128; r++)
        for (int c = 256; c < cols; c++) amax02 = std::max(amax02, fabsf(w[(size_t)r * cols + c]));
    CHECK(m.scale[2] == amax02 / 448.0f && m.scale[3] == 1.0f && m.scale[5] == 1.0f);  // blocks of zeros: scale 1
    std::vector<float> row((size_t)cols);
    m.row(7, row.data());
    double worst = 0;
    for (int c = 0; c < cols; c++) {
        float v = w[(size_t)7 * cols + c];
        if (fabsf(v) > 1e-2f * (c >= 256 ? 50 : 1)) worst = std::max(worst, fabs((double)row[(size_t)c] - v) / fabs(v));
    }
    CHECK(worst <= 1.0 / 16);
}

// ---- dllm's FP8 GEMM (fp8_gemm): its twin on the CPU -------------------------------------------------

/* E4M3 operands in the GPU layouts (struct dllm__gemm_op): codes x [m_pad x k] and w [n x k], scales
 * x_scale[kb * m_pad + m] and w_scale[nb * ceil4(k / 128) + kb] (the ceil4 padding is NaN: read, it would show). Codes
 * of normal values, never zero or NaN; scales spread over 2^-12..2^5, so that a scale taken from the wrong row, group
 * or block shows. */
struct test_f8_operands {
    int m_pad = 0, n = 0, k = 0;
    std::vector<uint8_t> x, w;
    std::vector<float> xs, ws;
};

static uint8_t test_f8_code(test_rng &r) {
    const uint8_t c = dllm__f32_to_e4m3(64.0f * r.normal());
    return (c & 0x7f) ? c : (uint8_t)(0x01 | r.below(2) << 7);
}

static float test_f8_scale(test_rng &r) { return ldexpf(1.0f + r.uniform(), r.below(17) - 12); }

static test_f8_operands test_f8_random(test_rng &r, int m_pad, int n, int k) {
    test_f8_operands o;
    o.m_pad = m_pad, o.n = n, o.k = k;
    const int groups = k / 128, w_ld = dllm__round_up(groups, 4);
    o.x.resize((size_t)m_pad * k);
    o.w.resize((size_t)n * k);
    for (uint8_t &c : o.x) c = test_f8_code(r);
    for (uint8_t &c : o.w) c = test_f8_code(r);
    o.xs.resize((size_t)groups * m_pad);
    for (float &s : o.xs) s = test_f8_scale(r);
    o.ws.assign((size_t)(n + 127) / 128 * w_ld, NAN);
    for (size_t nb = 0; nb < o.ws.size() / w_ld; nb++)
        for (int g = 0; g < groups; g++) o.ws[nb * w_ld + g] = test_f8_scale(r);
    return o;
}

/* The twin over every one of the m_pad rows, as floats. */
static std::vector<float> test_f8_twin(const test_f8_operands &o, int rows) {
    std::vector<uint16_t> y((size_t)rows * o.n, 0xffff);  // poisoned: bf16 NaN
    dllm__fp8_gemm_twin(o.x.data(), o.xs.data(), o.m_pad, rows, o.w.data(), o.ws.data(), o.n, o.k, y.data());
    return test_f32_vec(y);
}

/* y = X . W^T in float64 over rows [0, rows), and per output the sum of its products' magnitudes, which scales the
 * rounding error of any fp32 summation of them. */
static void test_f8_float64(const test_f8_operands &o, int rows, std::vector<double> &y, std::vector<double> &mag) {
    const int groups = o.k / 128, w_ld = dllm__round_up(groups, 4);
    const float *decode = dllm__e4m3_table();
    y.assign((size_t)rows * o.n, 0.0);
    mag.assign(y.size(), 0.0);
    for (int m = 0; m < rows; m++)
        for (int j = 0; j < o.n; j++)
            for (int g = 0; g < groups; g++) {
                const double s = (double)o.xs[(size_t)g * o.m_pad + m] * o.ws[(size_t)(j / 128) * w_ld + g];
                double sum = 0, abs_sum = 0;
                for (int c = g * 128; c < (g + 1) * 128; c++) {
                    const double p = (double)decode[o.x[(size_t)m * o.k + c]] * decode[o.w[(size_t)j * o.k + c]];
                    sum += p;
                    abs_sum += fabs(p);
                }
                y[(size_t)m * o.n + j] += s * sum;
                mag[(size_t)m * o.n + j] += fabs(s) * abs_sum;
            }
}

/* Elements outside |got - want| <= rel |want| + abs mag (a NaN is outside); prints the worst in units of that bound
 * and the largest error relative to the largest output. */
static size_t test_f8_outside(const std::vector<float> &got, const std::vector<double> &want,
                              const std::vector<double> &mag, double rel, double abs, const char *what) {
    size_t bad = 0;
    double worst = 0, err_max = 0, want_max = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const double e = fabs((double)got[i] - want[i]), bound = rel * fabs(want[i]) + abs * mag[i];
        if (!(e <= bound)) bad++;
        worst = e == e ? std::max(worst, e / bound) : INFINITY;
        err_max = std::max(err_max, e);
        want_max = std::max(want_max, fabs(want[i]));
    }
    printf(
        "    %s: worst error %.3f of the bound (%.1e |ref| + %.1e sum|products|), max error / max |ref| %.2e, %zu of "
        "%zu outside\n",
        what, worst, rel, abs, err_max / want_max, bad, want.size());
    return bad;
}

/* The twin computes the product of the operands it is given: against float64 the only errors are the fp32 sums
 * (a 128-term sum and the promotions: under 2^-16 of the products' magnitudes) and the bf16 rounding of the result
 * (2^-8 relative). */
TEST(fp8, mma_gemm_twin_matches_float64) {
    test_rng r("fp8 gemm twin");
    const int shapes[][3] = {{17, 200, 128}, {17, 4104, 384}, {33, 200, 384}, {33, 4104, 128}};
    for (const auto &sh : shapes) {
        const int M = sh[0], N = sh[1], K = sh[2];
        test_f8_operands o = test_f8_random(r, dllm__round_up(M, 16), N, K);
        std::vector<float> y = test_f8_twin(o, M);
        std::vector<double> want, mag;
        test_f8_float64(o, M, want, mag);
        std::string what = dllm__format("twin M=%d (m_pad %d) N=%d K=%d", M, o.m_pad, N, K);
        CHECK(test_f8_outside(y, want, mag, 0x1p-8, 0x1p-16, what.c_str()) == 0);
        // the comparison can fail: one output 3% off is caught
        size_t i = (size_t)(std::max_element(want.begin(), want.end()) - want.begin());
        y[i] *= 1.03f;
        CHECK(test_f8_outside(y, want, mag, 0x1p-8, 0x1p-16, "the same with one output 3% off") == 1);
    }
}

// ---- precision on the CPU: API, forward, accuracy figures -------------------------------------------

TEST(fp8, precision_is_validated) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    CHECK(dllm_ctx_default_params().precision == DLLM_PRECISION_AUTO);  // BF16 on an unquantised checkpoint
    dllm_ctx_params p = dllm_ctx_default_params();
    p.backend = DLLM_BACKEND_CPU;
    p.precision = (dllm_precision)11;
    dllm_ctx *ctx = nullptr;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "precision 11");
    p.precision = (dllm_precision)-2;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "DLLM_PRECISION_AUTO (-1)");
    CHECK(ctx == nullptr);
    dllm_model_free(m);
}

TEST(fp8, arch_table_fp8_modes) {
    CHECK(dllm__arch_for(90).fp8 == DLLM__FP8_CUBLASLT_BLOCK && dllm__arch_for(89).fp8 == DLLM__FP8_MMA);
    for (int cc : {80, 86, 87, 100, 120}) CHECK_MSG(dllm__arch_for(cc).fp8 == DLLM__FP8_NONE, "sm_%d", cc);
    // DLLM_TILES fp8_gemm: each value where the GPU can run it; elsewhere, or misspelt, an error that names it
    struct { const char *value; int cc; dllm_status want; dllm__fp8_gemm mode; const char *msg;
    } cases[] = {
        {nullptr, 89, DLLM_OK, DLLM__FP8_MMA, nullptr},
        {nullptr, 90, DLLM_OK, DLLM__FP8_CUBLASLT_BLOCK, nullptr},
        {nullptr, 80, DLLM_OK, DLLM__FP8_NONE, nullptr},
        {"", 90, DLLM_OK, DLLM__FP8_CUBLASLT_BLOCK, nullptr},
        {"mma", 90, DLLM_OK, DLLM__FP8_MMA, nullptr},
        {"mma", 89, DLLM_OK, DLLM__FP8_MMA, nullptr},
        {"mma", 120, DLLM_OK, DLLM__FP8_MMA, nullptr},
        {"cublaslt", 90, DLLM_OK, DLLM__FP8_CUBLASLT_BLOCK, nullptr},
        {"mma", 86, DLLM_ERR_UNSUPPORTED, DLLM__FP8_NONE, "8.9"},
        {"cublaslt", 89, DLLM_ERR_UNSUPPORTED, DLLM__FP8_NONE, "sm_90 only"},
        {"MMA", 90, DLLM_ERR_INVALID_ARGUMENT, DLLM__FP8_NONE, "DLLM_TILES=fp8_gemm=MMA: expected mma or cublaslt"},
        {"cutlass", 89, DLLM_ERR_INVALID_ARGUMENT, DLLM__FP8_NONE, "expected mma or cublaslt"},
    };
    for (auto &c : cases) {
        if (c.value) test_knob_set("fp8_gemm", c.value);
        else test_knob_reset();
        dllm__fp8_gemm mode = DLLM__FP8_NONE;
        CHECK_STATUS(dllm__fp8_gemm_for(dllm__arch_for(c.cc), mode), c.want, c.msg);
        if (c.want == DLLM_OK)
            CHECK_MSG(mode == c.mode, "DLLM_TILES=fp8_gemm=%s on sm_%d: mode %d, want %d",
                      c.value ? c.value : "(unset)", c.cc, (int)mode, (int)c.mode);
    }
    test_knob_reset();
    // fp8_gemm's tiles, where it can run: warps tile the CTA in whole mma pairs, a CTA's columns share one weight
    // block, copies divide evenly among the threads, and the ring fits the shared memory per block
    // (99 KB on sm_89, 227 on sm_90)
    for (int cc : {89, 90}) {
        const dllm__arch a = dllm__arch_for(cc);
        for (const dllm__fp8_tile &t : {a.fp8_wide, a.fp8_narrow}) {
            const int threads = t.bm / t.wm * (t.bn / t.wn) * 32;
            CHECK_MSG(t.bm % t.wm == 0 && t.bn % t.wn == 0 && t.wm % 16 == 0 && t.wn % 16 == 0 && 128 % t.bn == 0,
                      "sm_%d tile %s", cc, dllm__fp8_gemm_kernel_name(t).c_str());
            CHECK(t.bm * 8 % threads == 0 && t.bn * 8 % threads == 0 && t.stages >= 2);
            CHECK(dllm__fp8_gemm_smem(t) <= (cc == 90 ? 227u : 99u) * 1024);
        }
        CHECK(a.fp8_narrow.bm <= dllm__fp8_narrow_rows);
    }
}

/* The E4M3 conversion of the software path (GPUs before sm_89) compiles for a Hopper target too, so that the
 * GPU tests can check it against the twin. */
static dllm__jit_request test_rowwise_software_e4m3(const dllm__arch &a) {
    dllm__jit_request rq = dllm__module_rowwise(a);
    rq.name += "_soft_e4m3";
    rq.source = "#define DLLM_E4M3_SOFTWARE 1\n" + rq.source;
    return rq;
}

TEST(jit, e4m3_software_path_compiles_for_sm_90a) {
    std::vector<char> cubin;
    std::vector<std::string> lowered;
    std::string log;
    CHECK_STATUS(dllm__nvrtc_compile(test_rowwise_software_e4m3(dllm__arch_for(90)), cubin, lowered, log), DLLM_OK,
                 nullptr);
    CHECK(!dllm__log_has_spills(log));
}

/* ptxas's "Used N registers" lines of a compile log, one per kernel, joined. */
static std::string test_register_report(const std::string &log) {
    std::string out;
    for (size_t at = log.find("Used "); at != std::string::npos; at = log.find("Used ", at + 1)) {
        size_t end = log.find('\n', at);
        out += "      " + log.substr(at, end == std::string::npos ? std::string::npos : end - at) + "\n";
    }
    return out;
}

/* fp8_gemm, both tiles, for the architectures whose table row runs it (sm_89) or can (sm_90a, DLLM_TILES=fp8_gemm=mma):
 * compiles with neither spills nor a stack frame (its accumulators must stay in registers). */
TEST(jit, fp8_mma_gemm_compiles_without_spills) {
    for (int cc : {89, 90}) {
        const dllm__arch a = dllm__arch_for(cc);
        std::vector<char> cubin;
        std::vector<std::string> lowered;
        std::string log;
        CHECK_STATUS(dllm__nvrtc_compile(dllm__module_fp8_gemm(a), cubin, lowered, log), DLLM_OK, nullptr);
        CHECK_MSG(!dllm__log_has_spills(log) && !dllm__log_reports(log, "stack frame"),
                  "fp8_gemm spills or has a stack frame on %s:\n%s", a.target, log.c_str());
        CHECK(lowered.size() == 2 && cubin.size() > 1000);
        printf("    %s (%s, %s):\n%s", a.target, dllm__fp8_gemm_kernel_name(a.fp8_wide).c_str(),
               dllm__fp8_gemm_kernel_name(a.fp8_narrow).c_str(), test_register_report(log).c_str());
    }
}

TEST(fp8, cpu_weights_quantised_for_layers_1_and_up) {
    dllm_model *m = test_load(test_data("tiny-dream"));
    if (!m) { CHECK(m != nullptr); return; }
    std::vector<dllm__fp8_layer> ffn = dllm__cpu_fp8_weights(*m, DLLM_PRECISION_FP8_FFN),
                                 all = dllm__cpu_fp8_weights(*m, DLLM_PRECISION_FP8_ALL);
    CHECK(dllm__cpu_fp8_weights(*m, DLLM_PRECISION_BF16).empty());
    CHECK(ffn.size() == m->layers.size() && ffn[0].gu.empty() && ffn[0].down.empty() && all[0].qkv.empty());
    const dllm__config &c = m->cfg;
    for (size_t l = 1; l < ffn.size(); l++) {
        CHECK(ffn[l].gu.rows == 2 * c.n_ff && ffn[l].gu.cols == c.n_embd && ffn[l].down.rows == c.n_embd &&
              ffn[l].qkv.empty());
        CHECK(all[l].qkv.rows == (c.n_head + 2 * c.n_head_kv) * c.head_dim && all[l].o.cols == c.n_head * c.head_dim);
    }
    dllm_model_free(m);
}

/* NMSE of a against reference b: |a - b|^2 / |b|^2. */
static double test_nmse(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? num / den : num;
}

/* Per-layer FFN output NMSE, FP8 vs the exact reference on the same input: the exact CPU forward runs layer
 * by layer, and at each layer >= 1 its FFN also runs in FP8 on the post-attention norm it computed. */
static std::vector<double> test_ffn_nmse(const dllm_model &m, const std::vector<int32_t> &ids) {
    const dllm__config &c = m.cfg;
    const int T = (int)ids.size(), d = c.n_embd;
    dllm__pool pool(2);
    const std::vector<dllm__fp8_layer> q = dllm__cpu_fp8_weights(m, DLLM_PRECISION_FP8_FFN);
    test_cpu_layer0 in(m, ids);
    auto &[b, cos_t, sin_t, rows] = in;
    std::vector<double> nmse;
    for (size_t l = 0; l < m.layers.size(); l++) {
        const dllm__layer_weights &L = m.layers[l];
        dllm__cpu_attention_block(m, l, nullptr, pool, b, rows, nullptr, cos_t.data(), sin_t.data());
        dllm__cpu_rmsnorm(b.h.data(), T, d, L.ffn_norm.data(), c.norm_eps, b.a.data());
        std::vector<float> a = b.a;
        dllm__cpu_ffn(m, L, nullptr, pool, b, T);
        std::vector<float> exact = b.tmp;
        if (l > 0) {
            b.a = a;
            dllm__cpu_ffn(m, L, &q[l], pool, b, T);
            nmse.push_back(test_nmse(b.tmp.data(), exact.data(), (size_t)T * d));
        }
        for (size_t i = 0; i < (size_t)T * d; i++) b.h[i] += exact[i];
    }
    return nmse;
}

/* A 128-id window of held-out text with every other position masked (decoding sees many masks). */
static std::vector<int32_t> test_heldout_window(const char *model, int32_t mask_id) {
    std::vector<int32_t> ids;
    std::string w = test_read_file(std::string("tests/data/heldout.") + model + ".ids");
    for (const char *p = w.c_str(); *p && ids.size() < 128;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        ids.push_back((int32_t)((ids.size() % 2) ? mask_id : v));
        p = end;
    }
    return ids;
}

static std::string test_join(const std::vector<double> &v, const char *fmt) {
    std::string s;
    for (double x : v) s += dllm__format(fmt, x) + " ";
    return s;
}

TEST(fp8, accuracy_ffn_nmse_per_layer) {
    struct { const char *dir, *name; bool fixture;
    } models[] = {{"tests/data/tiny-llada", "fixture tiny-llada", true},
                  {"tests/data/tiny-dream", "fixture tiny-dream", true},
                  {"models/tiny-llada", "tiny-llada", false},
                  {"models/tiny-dream", "tiny-dream", false},
                  {"models/tiny-add", "tiny-add", false}};
    for (auto &mi : models) {
        dllm_model *m = test_load(mi.dir);
        if (!m) { CHECK(m != nullptr); continue; }
        std::vector<std::vector<int32_t>> inputs;
        if (mi.fixture) {
            for (const test_golden_input &g : test_golden_inputs(mi.dir)) inputs.push_back(g.ids);
        } else if (strcmp(mi.name, "tiny-add") == 0) {
            std::vector<int32_t> ids;
            for (int i = 0; i < 96; i++) ids.push_back((int32_t)(100 + (i * 37) % 3000));
            inputs.push_back(ids);
        } else {
            inputs.push_back(test_heldout_window(mi.name, m->cfg.mask_id));
        }
        double worst = 0;
        for (const std::vector<int32_t> &ids : inputs) {
            std::vector<double> nmse = test_ffn_nmse(*m, ids);
            for (double x : nmse) worst = std::max(worst, x);
            printf("    %s T=%zu: FFN output NMSE, layers 1..%zu: %s\n", mi.name, ids.size(), nmse.size(),
                   test_join(nmse, "%.2e").c_str());
        }
        printf("    %s: worst layer %.2e\n", mi.name, worst);
        CHECK(worst == worst && worst < 1);
        if (mi.fixture) CHECK_MSG(worst < 5e-3, "%s: FFN NMSE %.3e is above the issue's 5e-3", mi.name, worst);
        dllm_model_free(m);
    }
}

/* The FFN of one LLaDA-8B layer (4096 -> 2 x 12288 -> 4096) on random weights of the benchmark's scale (uniform,
 * std 0.02) and unit-RMS inputs: FP8 vs exact. */
TEST(fp8, accuracy_ffn_nmse_llada_8b_shape) {
#if defined(__SANITIZE_ADDRESS__)
    SKIP("an accuracy figure (about 10 s of arithmetic): measured by the plain build");
#endif
    const int d = 4096, ff = 12288, T = 16;
    dllm_model m;
    m.cfg.n_embd = d;
    m.cfg.n_ff = ff;
    std::vector<uint16_t> wg((size_t)ff * d), wu(wg.size()), wd(wg.size());
    uint64_t s = 12345;
    auto uniform = [&] {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return (float)((s >> 40) * (1.0 / 16777216.0));
    };
    for (auto *w : {&wg, &wu, &wd})
        for (uint16_t &x : *w) x = dllm__f32_to_bf16((2 * uniform() - 1) * 0.0346f);
    auto tensor = [](std::vector<uint16_t> &v, int64_t rows, int64_t cols) {
        dllm__tensor t;
        t.dtype = DLLM__BF16;
        t.shape = {rows, cols};
        t.numel = rows * cols;
        t.data = (const uint8_t *)v.data();
        t.nbytes = v.size() * 2;
        return t;
    };
    dllm__tensor tg = tensor(wg, ff, d), tu = tensor(wu, ff, d), td = tensor(wd, d, ff);
    dllm__layer_weights L;
    L.gate = &tg;
    L.up = &tu;
    L.down = &td;
    dllm__fp8_layer q;
    q.gu = dllm__quantize_stacked({&tg, &tu});
    q.down = dllm__quantize_stacked({&td});
    dllm__pool pool(2);
    dllm__cpu_buffers b;
    b.a.resize((size_t)T * d);
    b.gate.resize((size_t)T * ff);
    b.up.resize((size_t)T * ff);
    b.tmp.resize((size_t)T * d);
    for (float &x : b.a) x = 2 * uniform() - 1;
    for (int t = 0; t < T; t++) {  // unit RMS, like an RMSNorm output with unit weights
        float *r = &b.a[(size_t)t * d];
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)r[i] * r[i];
        for (int i = 0; i < d; i++) r[i] = (float)(r[i] / sqrt(ss / d));
    }
    std::vector<float> a = b.a;
    dllm__cpu_ffn(m, L, nullptr, pool, b, T);
    std::vector<float> exact = b.tmp;
    b.a = a;
    dllm__cpu_ffn(m, L, &q, pool, b, T);
    double nmse = test_nmse(b.tmp.data(), exact.data(), exact.size());
    printf("    LLaDA-8B FFN shape, random weights (std 0.02), %d rows: FFN output NMSE %.2e\n", T, nmse);
    CHECK(nmse < 5e-3);
}

/* Logits of the CPU FP8 forward against the exact CPU forward on the fixtures' golden inputs. */
TEST(fp8, accuracy_cpu_logits_error) {
    for (const char *fx : {"tiny-llada", "tiny-dream"}) {
        dllm_model *m = test_load(test_data(fx));
        dllm_ctx *exact = m ? test_ctx(m) : nullptr,
                 *ffn = m ? test_ctx_precision(m, DLLM_BACKEND_CPU, DLLM_PRECISION_FP8_FFN) : nullptr,
                 *all = m ? test_ctx_precision(m, DLLM_BACKEND_CPU, DLLM_PRECISION_FP8_ALL) : nullptr;
        CHECK(exact && ffn && all);
        for (const test_golden_input &gi :
             exact &&ffn &&all ? test_golden_inputs(test_data(fx)) : std::vector<test_golden_input>()) {
            const int T = (int)gi.ids.size(), V = m->cfg.n_vocab;
            std::vector<float> a((size_t)T * V, NAN), b(a.size(), NAN), c(a.size(), NAN);
            CHECK_STATUS(dllm_logits(exact, gi.ids.data(), T, 0, T, a.data(), a.size()), DLLM_OK, nullptr);
            CHECK_STATUS(dllm_logits(ffn, gi.ids.data(), T, 0, T, b.data(), b.size()), DLLM_OK, nullptr);
            CHECK_STATUS(dllm_logits(all, gi.ids.data(), T, 0, T, c.data(), c.size()), DLLM_OK, nullptr);
            int same_ffn = 0, same_all = 0;
            for (int i = 0; i < T; i++) {
                auto argmax = [&](const std::vector<float> &v) {
                    return std::max_element(v.begin() + (long)i * V, v.begin() + (long)(i + 1) * V) - v.begin();
                };
                same_ffn += argmax(a) == argmax(b);
                same_all += argmax(a) == argmax(c);
            }
            double e_ffn = test_rel_err(b.data(), a.data(), a.size()),
                   e_all = test_rel_err(c.data(), a.data(), a.size());
            printf(
                "    %s T=%d: logits max relative error vs exact: FP8 FFN %.2e (argmax %d/%d), FP8 all %.2e (argmax "
                "%d/%d)\n",
                fx, T, e_ffn, same_ffn, T, e_all, same_all, T);
            CHECK(e_ffn > 0 && e_ffn < 0.1 && e_all > 0 && e_all < 0.2);
            CHECK(memcmp(b.data(), c.data(), b.size() * 4) != 0);  // FP8_ALL is a different function
        }
        dllm_ctx_free(exact);
        dllm_ctx_free(ffn);
        dllm_ctx_free(all);
        dllm_model_free(m);
    }
}

/* Greedy decoding of the fixtures' golden cases, FP8 vs exact on the CPU: token agreement of the final canvases. */
TEST(fp8, accuracy_cpu_token_agreement_on_fixtures) {
    for (const char *fx : {"tiny-llada", "tiny-dream"}) {
        dllm_model *m = test_load(test_data(fx));
        dllm_ctx *exact = m ? test_ctx(m) : nullptr,
                 *f8 = m ? test_ctx_precision(m, DLLM_BACKEND_CPU, DLLM_PRECISION_FP8_FFN) : nullptr;
        dllm__json root;
        dllm__json_load(test_data(fx) + "/golden_traces.json", root);
        const dllm__json *cs = root.find("cases");
        long tokens = 0, same = 0;
        int seqs = 0, same_seqs = 0;
        for (size_t ci = 0; exact && f8 && cs && ci < cs->items.size(); ci++) {
            dllm_gen_params p = test_case_params(cs->items[ci]);
            p.stop_at_eos = 0;
            std::vector<int32_t> prompt = test_ints(cs->items[ci].find("prompt")), a((size_t)p.gen_length), b(a.size());
            CHECK_STATUS(
                dllm_generate(exact, prompt.data(), (int)prompt.size(), p, a.data(), (int)a.size(), nullptr, nullptr),
                DLLM_OK, nullptr);
            CHECK_STATUS(
                dllm_generate(f8, prompt.data(), (int)prompt.size(), p, b.data(), (int)b.size(), nullptr, nullptr),
                DLLM_OK, nullptr);
            for (size_t i = 0; i < a.size(); i++) same += a[i] == b[i];
            tokens += (long)a.size();
            same_seqs += a == b;
            seqs++;
        }
        printf("    %s: FP8 vs exact decoding (%d golden cases): token agreement %.4f, sequences identical %d/%d\n", fx,
               seqs, tokens ? (double)same / tokens : 0.0, same_seqs, seqs);
        CHECK(seqs > 0 && same > 0);
        dllm_ctx_free(exact);
        dllm_ctx_free(f8);
        dllm_model_free(m);
    }
}

/* The BF16 default is untouched: explicit BF16 gives the bits of the default context. */
TEST(fp8, bf16_default_unchanged) {
    dllm_model *m = test_load(test_data("tiny-dream"));
    dllm_ctx *a = m ? test_ctx(m) : nullptr,
             *b = m ? test_ctx_precision(m, DLLM_BACKEND_CPU, DLLM_PRECISION_BF16) : nullptr;
    if (a && b) {
        std::vector<test_golden_input> gs = test_golden_inputs(test_data("tiny-dream"));
        const int T = (int)gs[0].ids.size(), V = m->cfg.n_vocab;
        std::vector<float> x((size_t)T * V), y(x.size());
        CHECK_STATUS(dllm_logits(a, gs[0].ids.data(), T, 0, T, x.data(), x.size()), DLLM_OK, nullptr);
        CHECK_STATUS(dllm_logits(b, gs[0].ids.data(), T, 0, T, y.data(), y.size()), DLLM_OK, nullptr);
        CHECK(memcmp(x.data(), y.data(), x.size() * 4) == 0);
        CHECK(test_rel_err(x.data(), gs[0].logits.data(), x.size()) <= 1e-5);
    }
    dllm_ctx_free(a);
    dllm_ctx_free(b);
    dllm_model_free(m);
}

// ---- GPU: kernels vs twins, bit for bit -------------------------------------------------------------

/* The twin of a GPU-quantised activation buffer: codes [rows x k_pad] and scales [g * ld + row]. */
struct test_act8 {
    std::vector<uint8_t> q;
    std::vector<float> s;
};

static test_act8 test_twin_groups(const std::vector<float> &x, int rows, int k, int ld) {
    const int k_pad = dllm__round_up(k, 128), groups = k_pad / 128;
    std::vector<uint8_t> q((size_t)rows * k);
    std::vector<float> s((size_t)rows * groups);
    dllm__quantize_groups(x.data(), rows, k, q.data(), s.data());
    test_act8 t;
    t.q.assign((size_t)rows * k_pad, 0);
    t.s.assign((size_t)groups * ld, 0);
    for (int r = 0; r < rows; r++) {
        std::copy(q.begin() + (long)r * k, q.begin() + (long)(r + 1) * k, t.q.begin() + (long)r * k_pad);
        for (int g = 0; g < groups; g++) t.s[(size_t)g * ld + r] = s[(size_t)r * groups + g];
    }
    return t;
}

/* Compares codes and scales bit for bit over the first rows; prints the first differences. */
static size_t test_act8_diff(const test_act8 &want, const std::vector<uint8_t> &q, const std::vector<float> &s,
                             int rows, int k, int ld, const char *what) {
    const int k_pad = dllm__round_up(k, 128);
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)rows * k_pad; i++)
        if (q[i] != want.q[i] && bad++ < 4)
            printf("    %s: row %zu col %zu: GPU 0x%02x, twin 0x%02x\n", what, i / k_pad, i % k_pad, q[i], want.q[i]);
    for (int g = 0; g < k_pad / 128; g++)
        for (int r = 0; r < rows; r++) {
            size_t i = (size_t)g * ld + r;
            if (memcmp(&s[i], &want.s[i], 4) != 0 && bad++ < 8)
                printf("    %s: scale row %d group %d: GPU %a, twin %a\n", what, r, g, (double)s[i], (double)want.s[i]);
        }
    return bad;
}

/* Runs quantize_rows_e4m3 on fp32 or bf16 rows; returns codes and scales (outputs poisoned first). */
static void test_quantize_rows(const dllm__kernel<dllm__sig_quantize_rows_e4m3> &k_quant, const void *x_host, bool f32,
                               int rows, int k, float fixed_scale, std::vector<uint8_t> &q, std::vector<float> &s,
                               int &ld) {
    const int k_pad = dllm__round_up(k, 128);
    ld = dllm__round_up(rows, 16);
    dllm__dbuf dx, dq, ds;
    size_t in_bytes = (size_t)rows * k * (f32 ? 4 : 2);
    dx.fit(in_bytes, "test");
    cudaMemcpy(dx.ptr, x_host, in_bytes, cudaMemcpyHostToDevice);
    test_poison(dq, (size_t)rows * k_pad);
    test_poison(ds, (size_t)(k_pad / 128) * ld * 4);
    k_quant.launch({dllm__e4m3_rows_grid(rows, k), dim3(128)}, 0, dx.ptr, f32 ? 1 : 0, k, rows, dq.ptr, ds.ptr, ld,
                   fixed_scale);
    q = test_get<uint8_t>(dq, (size_t)rows * k_pad);
    s = test_get<float>(ds, (size_t)(k_pad / 128) * ld);
}

/* Random rows whose groups span many magnitudes, then rows of edge cases. */
static std::vector<float> test_fp8_inputs(test_rng &r, int rows, int k) {
    std::vector<float> x((size_t)rows * k);
    for (int i = 0; i < rows; i++) {
        float mag = powf(10.0f, (float)(r.below(12) - 6));
        for (int c = 0; c < k; c++) x[(size_t)i * k + c] = r.normal() * mag * (c % 128 == 5 ? 20.0f : 1.0f);
    }
    const float edge[] = {0.0f,           -0.0f,   448.0f, -448.0f, 0x1p-9f, 1.5f * 0x1p-9f, 0x1p-10f,
                          7.5f * 0x1p-9f, 0x1p-6f, 432.0f, 1.0625f, -3.0f,   1e-30f};
    for (int c = 0; c < k; c++) {
        x[(size_t)0 * k + c] = 0.0f;                                           // all zeros: scale 1
        x[(size_t)1 * k + c] = edge[c % (sizeof edge / sizeof edge[0])];       // amax 448: scale 1, raw conversion
        x[(size_t)2 * k + c] = c == 3 ? NAN : r.normal();                      // a NaN
        x[(size_t)3 * k + c] = c == 130 ? -INFINITY : r.normal();              // an Inf in the second group
        x[(size_t)4 * k + c] = r.normal() * 1e-39f;                            // fp32 subnormals: a subnormal scale
        x[(size_t)5 * k + c] = r.normal() * 1e-44f;                            // amax / 448 underflows to 0: scale 1
    }
    return x;
}

static void test_quantizer_module(dllm_test_state &T_, const dllm__kernel<dllm__sig_quantize_rows_e4m3> &k_quant,
                                  const char *label) {
    test_rng r(label);
    for (int k : {200, 1024}) {
        const int rows = 97;
        std::vector<float> x = test_fp8_inputs(r, rows, k);
        std::vector<uint8_t> q;
        std::vector<float> s;
        int ld = 0;
        test_quantize_rows(k_quant, x.data(), true, rows, k, 0, q, s, ld);
        size_t bad = test_act8_diff(test_twin_groups(x, rows, k, ld), q, s, rows, k, ld, label);
        // bf16 input, as the attention output arrives
        std::vector<uint16_t> xb = test_bf16_vec(x);
        std::vector<float> xbf = test_f32_vec(xb);
        test_quantize_rows(k_quant, xb.data(), false, rows, k, 0, q, s, ld);
        bad += test_act8_diff(test_twin_groups(xbf, rows, k, ld), q, s, rows, k, ld, label);
        // fixed scale 1: the raw conversion of every value, above 448 and non-finite ones included
        std::vector<float> raw = x;
        const float extra[] = {449.0f,    464.0f, 500.0f, 1e30f, -1e30f,         INFINITY,
                               -INFINITY, NAN,    -NAN,   3e38f, 0x1.000002p-10f};
        for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) raw[(size_t)7 * k + i] = extra[i];
        test_quantize_rows(k_quant, raw.data(), true, rows, k, 1.0f, q, s, ld);
        size_t raw_bad = 0;
        for (int i = 0; i < rows; i++)
            for (int c = 0; c < k; c++) {
                uint8_t want = dllm__f32_to_e4m3(raw[(size_t)i * k + c]),
                        got = q[(size_t)i * dllm__round_up(k, 128) + c];
                if (want != got && raw_bad++ < 4)
                    printf("    %s raw: %a -> GPU 0x%02x, twin 0x%02x\n", label, (double)raw[(size_t)i * k + c], got,
                           want);
            }
        printf("    %s k=%d (%d rows, edge rows, fp32 + bf16 + raw): %zu codes or scales differ from the twin\n", label,
               k, rows, bad + raw_bad);
        CHECK(bad == 0 && raw_bad == 0);
    }
}

TEST(gpu_fp8, quantizer_matches_twin_bit_for_bit) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_quantizer_module(T_, g.rw.quantize_rows_e4m3, g.arch.cc >= 89 ? "hardware cvt" : "software conversion");
    std::shared_ptr<dllm__module> soft;
    CHECK_STATUS(dllm__jit_load(test_rowwise_software_e4m3(g.arch), soft), DLLM_OK, nullptr);
    if (soft)
        test_quantizer_module(
            T_,
            dllm__kernel<dllm__sig_quantize_rows_e4m3>{soft->kernels.at("quantize_rows_e4m3"), "quantize_rows_e4m3"},
            "software conversion");
    // More rows than a grid's y dimension holds (65535): the kernel walks them.
    test_rng r("quantizer, many rows");
    const int rows = 65600, k = 136;
    std::vector<float> x = test_fp8_inputs(r, rows, k);
    std::vector<uint8_t> q;
    std::vector<float> s;
    int ld = 0;
    test_quantize_rows(g.rw.quantize_rows_e4m3, x.data(), true, rows, k, 0, q, s, ld);
    const size_t bad = test_act8_diff(test_twin_groups(x, rows, k, ld), q, s, rows, k, ld, "many rows");
    printf("    %d rows of %d: %zu codes or scales differ from the twin\n", rows, k, bad);
    CHECK(bad == 0);
}

/* add_rmsnorm_e4m3 = add_rmsnorm, then the twin on its bf16 output: codes, scales and residual bit for bit. */
static void test_norm_e4m3_case(dllm_test_state &T_, test_gpu &g, test_rng &r, int d, int B, int seq, int row0,
                                int rows) {
    std::vector<float> h((size_t)B * seq * d), w((size_t)d), delta_f(h.size());
    for (float &x : h) x = 3 * r.normal();
    for (float &x : w) x = 1 + 0.3f * r.normal();
    for (float &x : delta_f) x = r.normal();
    std::vector<uint16_t> delta = test_bf16_vec(delta_f);
    const int M = B * rows, ld = dllm__round_up(M, 16), k_pad = dllm__round_up(d, 128);
    dllm__dbuf dh1, dh2, dd, dw, dy, dq, ds;
    test_put(dh1, h); test_put(dh2, h); test_put(dd, delta); test_put(dw, w);
    test_poison(dy, (size_t)M * d * 2);
    test_poison(dq, (size_t)M * k_pad);
    test_poison(ds, (size_t)(k_pad / 128) * ld * 4);
    float eps = 1e-5f;
    int dd_ = d, rows_ = rows, r0 = row0, s = seq;
    const unsigned threads = dllm__norm_threads(k_pad / 8);  // as dllm__gpu_backend::add_rmsnorm_e4m3 sizes it
    CHECK_STATUS(g.rw.add_rmsnorm.launch({dim3(rows, B), dim3(threads)}, 0, dh1.ptr, dh1.ptr, dd.ptr, dw.ptr, eps,
                                         dy.ptr, dd_, rows_, r0, s),
                 DLLM_OK, nullptr);
    CHECK_STATUS(g.rw.add_rmsnorm_e4m3.launch({dim3(rows, B), dim3(threads)}, 0, dh2.ptr, dh2.ptr, dd.ptr, dw.ptr, eps,
                                              dq.ptr, ds.ptr, ld, dd_, rows_, r0, s),
                 DLLM_OK, nullptr);
    std::vector<float> y = test_f32_vec(test_get<uint16_t>(dy, (size_t)M * d));
    CHECK_MSG(test_get<float>(dh1, h.size()) == test_get<float>(dh2, h.size()), "d=%d: the residual streams differ", d);
    size_t bad = test_act8_diff(test_twin_groups(y, M, d, ld), test_get<uint8_t>(dq, (size_t)M * k_pad),
                                test_get<float>(ds, (size_t)(k_pad / 128) * ld), M, d, ld, "add_rmsnorm_e4m3");
    printf("    add+norm+quantise d=%d, %d rows: %zu codes or scales differ\n", d, M, bad);
    CHECK(bad == 0);
}

TEST(gpu_fp8, add_rmsnorm_e4m3_matches_twin) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("add_rmsnorm_e4m3");
    test_norm_e4m3_case(T_, g, r, 200, 2, 61, 5, 50);  // a partial group, row offsets, two sequences
    test_norm_e4m3_case(T_, g, r, 4096, 1, 97, 0, 97);
    test_norm_e4m3_case(T_, g, r, 9000, 2, 9, 2, 7);  // over 1024 chunks: a second register slot, partly used
}

TEST(gpu_fp8, swiglu_e4m3_matches_twin) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("swiglu_e4m3");
    const int cases[][2] = {
        {200, 97}, {640, 97}, {12288, 97}, {136, 65600}};  // {f, rows}: the last walks more rows than a grid's y holds
    for (const auto &fc : cases) {
        const int f = fc[0], n = fc[1], ld = dllm__round_up(n, 16), f_pad = dllm__round_up(f, 128);
        std::vector<float> gu((size_t)n * 2 * f);
        for (float &v : gu) v = 2 * r.normal();
        dllm__dbuf dg, dout, dq, ds;
        test_put(dg, test_bf16_vec(gu));
        test_poison(dout, (size_t)n * f * 2);
        test_poison(dq, (size_t)n * f_pad);
        test_poison(ds, (size_t)(f_pad / 128) * ld * 4);
        int n_ = n, f_ = f, ld_ = ld;
        CHECK_STATUS(g.rw.swiglu.launch({dllm__rows_grid(n, f / 8, 256), dim3(256)}, 0, dg.ptr, dout.ptr, n_, f_),
                     DLLM_OK, nullptr);
        CHECK_STATUS(
            g.rw.swiglu_e4m3.launch({dllm__e4m3_rows_grid(n, f), dim3(128)}, 0, dg.ptr, f_, n_, dq.ptr, ds.ptr, ld_),
            DLLM_OK, nullptr);
        std::vector<float> y = test_f32_vec(test_get<uint16_t>(dout, (size_t)n * f));
        size_t bad = test_act8_diff(test_twin_groups(y, n, f, ld), test_get<uint8_t>(dq, (size_t)n * f_pad),
                                    test_get<float>(ds, (size_t)(f_pad / 128) * ld), n, f, ld, "swiglu_e4m3");
        printf("    swiglu+quantise f=%d, %d rows: %zu codes or scales differ\n", f, n, bad);
        CHECK(bad == 0);
    }
}

/* quantize_weight_blocks vs dllm__quantize_blocks, mapped to the cuBLASLt layout: codes [n x k_pad], scales
 * [nb * ceil4(k_pad / 128) + kb]. */
static void test_weight_quant_case(dllm_test_state &T_, test_gpu &g, test_rng &r, int n, int k,
                                   std::vector<uint8_t> *q_out = nullptr, std::vector<float> *s_out = nullptr,
                                   const std::vector<uint16_t> *given = nullptr) {
    std::vector<uint16_t> wb;
    if (given) {
        wb = *given;
    } else {
        std::vector<float> w((size_t)n * k);
        for (int i = 0; i < n; i++)
            for (int c = 0; c < k; c++)
                w[(size_t)i * k + c] =
                    r.normal() * ((c / 128 + i / 128) % 3 == 1 ? 100.0f : 0.02f) * (i >= 128 && c < 128 ? 0.0f : 1.0f);
        wb = test_bf16_vec(w);
    }
    const int kb = dllm__round_up(k, 128) / 128, nb = (n + 127) / 128, ld = dllm__round_up(kb, 4), k_pad = kb * 128;
    dllm__dbuf dw, dq, ds;
    test_put(dw, wb);
    test_poison(dq, (size_t)n * k_pad);
    test_poison(ds, (size_t)nb * ld * 4);
    int n_ = n, k_ = k, ld_ = ld;
    CHECK_STATUS(g.rw.quantize_weight_blocks.launch({dim3(kb, nb), dim3(256)}, 0, dw.ptr, n_, k_, dq.ptr, ds.ptr, ld_),
                 DLLM_OK, nullptr);
    std::vector<uint8_t> q = test_get<uint8_t>(dq, (size_t)n * k_pad);
    std::vector<float> s = test_get<float>(ds, (size_t)nb * ld);
    dllm__fp8_matrix want = dllm__quantize_blocks(test_f32_vec(wb).data(), n, k);
    size_t bad = 0;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < k_pad; c++) {
            uint8_t w8 = c < k ? want.q[(size_t)i * k + c] : 0;
            if (q[(size_t)i * k_pad + c] != w8 && bad++ < 4)
                printf("    weight [%d][%d]: GPU 0x%02x, twin 0x%02x\n", i, c, q[(size_t)i * k_pad + c], w8);
        }
    for (int b = 0; b < nb; b++)
        for (int c = 0; c < kb; c++)
            if (memcmp(&s[(size_t)b * ld + c], &want.scale[(size_t)b * kb + c], 4) != 0 && bad++ < 8)
                printf("    block scale (%d, %d) differs\n", b, c);
    printf("    weight blocks n=%d k=%d: %zu codes or scales differ\n", n, k, bad);
    CHECK(bad == 0);
    if (q_out) *q_out = q;
    if (s_out) *s_out = s;
}

TEST(gpu_fp8, weight_quantiser_matches_twin) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("weight blocks");
    test_weight_quant_case(T_, g, r, 200, 328);  // partial blocks both ways, a block of zeros
    test_weight_quant_case(T_, g, r, 256, 1024);
}

/* The M bf16 rows [M x K] at x_dev (on the device) quantised by quantize_rows_e4m3 into the padded operand an FP8 GEMM
 * takes: codes [round_up(M, 16) x round_up(K, 128)] and scales [kb][round_up(M, 16)], the padding zero. */
static void test_quantize_padded(dllm_test_state &T_, test_gpu &g, const void *x_dev, int M, int K, dllm__dbuf &dq,
                                 dllm__dbuf &ds) {
    const int Mp = dllm__round_up(M, 16), k_pad = dllm__round_up(K, 128), kb = k_pad / 128;
    dq.fit((size_t)Mp * k_pad, "test");
    ds.fit((size_t)kb * Mp * 4, "test");
    cudaMemset(dq.ptr, 0, (size_t)Mp * k_pad);
    cudaMemset(ds.ptr, 0, (size_t)kb * Mp * 4);
    CHECK_STATUS(g.rw.quantize_rows_e4m3.launch({dllm__e4m3_rows_grid(M, K), dim3(128)}, 0, x_dev, 0, K, M, dq.ptr,
                                                ds.ptr, Mp, 0.0f),
                 DLLM_OK, nullptr);
}

/* The block-scaled FP8 GEMM against the CPU product (float64) of the same dequantised operands. Both sum exact
 * products of E4M3 values times the same scales; they differ by FP32 accumulation order and the BF16 output
 * rounding (2^-9 relative): the BF16 GEMM test's 8e-3 bound applies. Also printed: the error against the
 * unquantised product (what FP8 costs). */
static void test_fp8_gemm_case(dllm_test_state &T_, test_gpu &g, test_rng &r, int M, int N, int K) {
    const int Mp = dllm__round_up(M, 16), k_pad = dllm__round_up(K, 128), kb = k_pad / 128,
              ld_w = dllm__round_up(kb, 4);
    std::vector<float> x((size_t)M * K), w((size_t)N * K);
    for (float &v : x) v = r.normal();
    for (float &v : w) v = 0.02f * r.normal();
    std::vector<uint16_t> xb = test_bf16_vec(x), wb = test_bf16_vec(w);
    std::vector<uint8_t> wq;
    std::vector<float> ws;
    test_weight_quant_case(T_, g, r, N, K, &wq, &ws, &wb);
    // activations through the kernel, padded to Mp rows of zeros
    dllm__dbuf dx, dq, ds, dwq, dws, dy;
    test_put(dx, xb);
    test_quantize_padded(T_, g, dx.ptr, M, K, dq, ds);
    test_put(dwq, wq);
    test_put(dws, ws);
    test_poison(dy, (size_t)Mp * N * 2);
    dllm__gemm gemm;
    CHECK_STATUS(gemm.init(), DLLM_OK, nullptr);
    CHECK_STATUS(gemm.run_fp8(dq.ptr, ds.as<float>(), dwq.ptr, dws.as<float>(), dy.ptr, Mp, N, k_pad, 0), DLLM_OK,
                 nullptr);
    std::vector<float> y = test_f32_vec(test_get<uint16_t>(dy, (size_t)M * N));
    std::vector<uint8_t> xq = test_get<uint8_t>(dq, (size_t)M * k_pad);
    std::vector<float> xs = test_get<float>(ds, (size_t)kb * Mp), want((size_t)M * N), exact((size_t)M * N);
    std::vector<float> xd((size_t)M * K), wd((size_t)N * K), xf = test_f32_vec(xb), wf = test_f32_vec(wb);
    for (int i = 0; i < M; i++)
        for (int c = 0; c < K; c++)
            xd[(size_t)i * K + c] = dllm__e4m3_to_f32(xq[(size_t)i * k_pad + c]) * xs[(size_t)(c / 128) * Mp + i];
    for (int j = 0; j < N; j++)
        for (int c = 0; c < K; c++)
            wd[(size_t)j * K + c] =
                dllm__e4m3_to_f32(wq[(size_t)j * k_pad + c]) * ws[(size_t)(j / 128) * ld_w + c / 128];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, e = 0;
            for (int c = 0; c < K; c++) {
                s += (double)xd[(size_t)i * K + c] * wd[(size_t)j * K + c];
                e += (double)xf[(size_t)i * K + c] * wf[(size_t)j * K + c];
            }
            want[(size_t)i * N + j] = (float)s;
            exact[(size_t)i * N + j] = (float)e;
        }
    double err = test_max_rel(y, want), cost = test_max_rel(y, exact);
    printf(
        "    FP8 GEMM M=%d (padded %d) N=%d K=%d: max rel error %.2e vs the dequantised product, %.2e vs the "
        "unquantised one\n",
        M, Mp, N, K, err, cost);
    CHECK_MSG(err < 8e-3, "FP8 GEMM error %.3e", err);
}

TEST(gpu_fp8, block_scaled_gemm_matches_cpu) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    if (g.arch.fp8 != DLLM__FP8_CUBLASLT_BLOCK) SKIP("skipped (no block-scaled FP8 GEMM on this GPU)");
    test_rng r("fp8 gemm");
    test_fp8_gemm_case(T_, g, r, 97, 256, 1024);
    test_fp8_gemm_case(T_, g, r, 97, 400, 200);   // N not a multiple of 128, K padded (the fixtures' shapes)
    test_fp8_gemm_case(T_, g, r, 40, 1024, 12288);
}

// ---- GPU: dllm's FP8 GEMM (fp8_gemm) -----------------------------------------------------------------

/* fp8_gemm over every one of o's m_pad rows into a poisoned output, as floats. */
static std::vector<float> test_f8_run_mma(dllm_test_state &T_, const dllm__fp8_mma &k, const test_f8_operands &o) {
    dllm__dbuf dx, dxs, dw, dws, dy;
    test_put(dx, o.x);
    test_put(dxs, o.xs);
    test_put(dw, o.w);
    test_put(dws, o.ws);
    test_poison(dy, (size_t)o.m_pad * o.n * 2);
    CHECK_STATUS(dllm__fp8_mma_run(k, dx.ptr, dxs.as<float>(), dw.ptr, dws.as<float>(), dy.ptr, o.m_pad, o.n, o.k, 0),
                 DLLM_OK, nullptr);
    return test_f32_vec(test_get<uint16_t>(dy, (size_t)o.m_pad * o.n));
}

/* The kernel against its twin, every padded row included (the kernel writes them all, as cuBLASLt does). Both round
 * to bf16 (2^-8 relative each, so one bf16 step apart at most: 2^-7); their group sums differ in order and in the
 * tensor cores' accumulation, which falls short of fp32 (DeepSeek-V3 reports about 14 bits on Hopper: hence the
 * promotion every 128). 2^-9 of the products' magnitudes allows 14-bit truncation of every product with room to
 * spare and is still a few % of a typical output: a scale of the wrong row, group or block (they span 2^17), a lost
 * k-step or a misplaced fragment fails by far. The worst error is printed in units of the bound, and the error
 * against float64 beside it. */
static void test_mma_twin_case(dllm_test_state &T_, const dllm__fp8_mma &k, test_rng &r, int M, int N, int K) {
    test_f8_operands o = test_f8_random(r, dllm__round_up(M, 16), N, K);
    std::vector<float> y = test_f8_run_mma(T_, k, o), twin = test_f8_twin(o, o.m_pad);
    std::vector<double> want, mag, twin64(twin.begin(), twin.end());
    test_f8_float64(o, o.m_pad, want, mag);
    const bool narrow = o.m_pad <= dllm__fp8_narrow_rows;
    std::string what = dllm__format("fp8_gemm M=%d (m_pad %d, %s tile) N=%d K=%d vs twin", M, o.m_pad,
                                    narrow ? "narrow" : "wide", N, K);
    CHECK_MSG(test_f8_outside(y, twin64, mag, 0x1p-7, 0x1p-9, what.c_str()) == 0, "%s", what.c_str());
    test_f8_outside(y, want, mag, 0x1p-7, 0x1p-9, "  the same vs float64");
}

TEST(gpu_fp8, mma_gemm_matches_twin) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    if (g.arch.cc < 89) SKIP("skipped (no FP8 tensor cores: fp8_gemm needs sm_89 or newer)");
    dllm__fp8_mma k;
    CHECK_STATUS(dllm__fp8_mma_load(g.arch, k), DLLM_OK, nullptr);
    if (!k.wide.fn || !k.narrow.fn) return;
    test_rng r("fp8_gemm vs twin");
    test_mma_twin_case(T_, k, r, 17, 200, 128);    // narrow: a dead m16 tile, a partial N tile
    test_mma_twin_case(T_, k, r, 33, 4104, 384);   // narrow: a partial M tile, N = 4096 + 8
    test_mma_twin_case(T_, k, r, 64, 72, 1024);    // the last narrow row count, a deep K
    test_mma_twin_case(T_, k, r, 70, 201, 256);    // wide, odd N (scalar stores)
    test_mma_twin_case(T_, k, r, 1000, 328, 512);  // wide, partial tiles both ways

    // A row's bits do not depend on M or on the tile: rows 0..15 computed alone (narrow) equal the same rows among 80
    // (wide).
    test_f8_operands all = test_f8_random(r, 80, 136, 384), first = all;
    first.m_pad = 16;
    first.x.resize((size_t)16 * all.k);
    first.xs.clear();
    for (int kb = 0; kb < all.k / 128; kb++)
        first.xs.insert(first.xs.end(), all.xs.begin() + (long)kb * 80, all.xs.begin() + (long)kb * 80 + 16);
    std::vector<float> a = test_f8_run_mma(T_, k, all), b = test_f8_run_mma(T_, k, first);
    CHECK_MSG(memcmp(a.data(), b.data(), b.size() * 4) == 0,
              "rows 0..15 differ between M = 16 (narrow tile) and M = 80 (wide tile)");
}

/* The two FP8 GEMMs of sm_90 on the same operands at LLaDA-8B's FFN shapes, quantised by dllm's own kernels from
 * random bf16 (padding rows zero, as in the forward): the same sums of the same exact products in another order, each
 * rounded to bf16, so they differ by a bf16 step where their fp32 sums straddle a rounding boundary: at most 2^-7 of
 * the largest output (bound 1e-2; cuBLASLt alone is within 3.6e-3 of float64 at K = 12288 on an H200), in few outputs
 * (NMSE bound 1e-5; a step in every output would make 1.5e-5 or more). */
static void test_mma_vs_cublaslt_case(dllm_test_state &T_, test_gpu &g, const dllm__fp8_mma &k, dllm__gemm &gemm, int M,
                                      int N, int K) {
    const int m_pad = dllm__round_up(M, 16), kb = K / 128, w_ld = dllm__round_up(kb, 4), nb = (N + 127) / 128;
    dllm__dbuf x, w, xq, xs, wq, ws, y_lt, y_mma;
    auto fill = [&](dllm__dbuf &b, uint64_t n, uint64_t seed, float scale) {
        b.fit(n * 2, "test");
        CHECK_STATUS(g.rw.fill_random_bf16.launch({dim3(1024), dim3(256)}, 0, b.ptr, n, seed, scale, 0), DLLM_OK,
                     nullptr);
    };
    fill(x, (uint64_t)M * K, 11, 1.0f);
    fill(w, (uint64_t)N * K, 12, 0.02f);
    test_quantize_padded(T_, g, x.ptr, M, K, xq, xs);
    ws.fit((size_t)nb * w_ld * 4, "test");
    wq.fit((size_t)N * K, "test");
    cudaMemset(ws.ptr, 0, ws.bytes);
    CHECK_STATUS(g.rw.quantize_weight_blocks.launch({dim3((unsigned)kb, (unsigned)nb), dim3(256)}, 0, w.ptr, N, K,
                                                    wq.ptr, ws.ptr, w_ld),
                 DLLM_OK, nullptr);
    test_poison(y_lt, (size_t)m_pad * N * 2);
    test_poison(y_mma, (size_t)m_pad * N * 2);
    CHECK_STATUS(gemm.run_fp8(xq.ptr, xs.as<float>(), wq.ptr, ws.as<float>(), y_lt.ptr, m_pad, N, K, 0), DLLM_OK,
                 nullptr);
    CHECK_STATUS(dllm__fp8_mma_run(k, xq.ptr, xs.as<float>(), wq.ptr, ws.as<float>(), y_mma.ptr, m_pad, N, K, 0),
                 DLLM_OK, nullptr);
    std::vector<float> a = test_f32_vec(test_get<uint16_t>(y_mma, (size_t)m_pad * N)),
                       b = test_f32_vec(test_get<uint16_t>(y_lt, (size_t)m_pad * N));
    const double err = test_max_rel(a, b), nmse = test_nmse(a.data(), b.data(), b.size());
    printf("    M=%d (m_pad %d) N=%d K=%d: fp8_gemm vs cuBLASLt block-scaled: max error / max |ref| %.2e, NMSE %.2e\n",
           M, m_pad, N, K, err, nmse);
    CHECK_MSG(err < 1e-2 && nmse < 1e-5, "M=%d N=%d K=%d: fp8_gemm and cuBLASLt differ (%.3e, NMSE %.3e)", M, N, K, err,
              nmse);
}

TEST(gpu_fp8, mma_gemm_matches_cublaslt_at_llada_ffn_shapes) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    if (g.arch.fp8 != DLLM__FP8_CUBLASLT_BLOCK) SKIP("skipped (cuBLASLt's block-scaled FP8 is sm_90 only)");
    dllm__fp8_mma k;
    CHECK_STATUS(dllm__fp8_mma_load(g.arch, k), DLLM_OK, nullptr);
    dllm__gemm gemm;
    CHECK_STATUS(gemm.init(), DLLM_OK, nullptr);
    if (!k.wide.fn || !k.narrow.fn) return;
    test_mma_vs_cublaslt_case(T_, g, k, gemm, 32, 2 * 12288, 4096);   // a block step's gate|up (narrow tile)
    test_mma_vs_cublaslt_case(T_, g, k, gemm, 32, 4096, 12288);       // its down
    test_mma_vs_cublaslt_case(T_, g, k, gemm, 1000, 2 * 12288, 4096); // a forward of 1000 tokens (wide tile)
    test_mma_vs_cublaslt_case(T_, g, k, gemm, 1000, 4096, 12288);
}

/* DLLM_TILES fp8_gemm is read when an FP8 context is created: a misspelt value, or one this GPU cannot run, fails the
 * creation with a message naming it; a BF16 context never reads it. */
TEST(gpu_fp8, fp8_gemm_env_is_validated) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    dllm_ctx_params p = dllm_ctx_default_params();
    p.backend = DLLM_BACKEND_GPU;
    dllm_ctx *ctx = nullptr;
    test_knob_set("fp8_gemm", "wgmma");
    p.precision = DLLM_PRECISION_FP8_FFN;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "fp8_gemm=wgmma");
    CHECK(ctx == nullptr);
    p.precision = DLLM_PRECISION_BF16;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_OK, nullptr);
    dllm_ctx_free(ctx);
    ctx = nullptr;
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_knob_set("fp8_gemm", g.arch.cc == 90 ? "mma" : "cublaslt");  // runs on sm_90; cuBLASLt's mode nowhere else
    p.precision = DLLM_PRECISION_FP8_FFN;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), g.arch.cc == 90 ? DLLM_OK : DLLM_ERR_UNSUPPORTED, "fp8_gemm=cublaslt");
    if (ctx) CHECK(((dllm__gpu_backend *)ctx->impl.get())->fp8_gemm() == DLLM__FP8_MMA);
    test_knob_reset();
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* The FP8 forward with fp8_gemm (DLLM_TILES=fp8_gemm=mma) against the one with cuBLASLt on sm_90, on the fixtures and
 * the tiny trained models, FP8 FFN and FP8 all: the logits are much nearer each other than either is to BF16 (NMSE),
 * and temperature-0 decoding of the fixtures' golden cases gives the same tokens at every step, a divergence accepted
 * only at a near-tie within the measured noise between the two (test_decode_compare); LaCache stays bit-exact. */
static void test_mma_forward_case(dllm_test_state &T_, const char *dir, const char *fixture, dllm_precision precision) {
    dllm_model *m = test_load(dir);
    dllm_ctx *lt = m ? test_ctx_precision(m, DLLM_BACKEND_GPU, precision) : nullptr,
             *bf16 = m ? test_ctx_precision(m, DLLM_BACKEND_GPU, DLLM_PRECISION_BF16) : nullptr;
    test_knob_set("fp8_gemm", "mma");
    dllm_ctx *mma = m ? test_ctx_precision(m, DLLM_BACKEND_GPU, precision) : nullptr;
    test_knob_reset();
    CHECK(lt && bf16 && mma);
    if (lt && bf16 && mma) {
        CHECK(((dllm__gpu_backend *)mma->impl.get())->fp8_gemm() == DLLM__FP8_MMA &&
              ((dllm__gpu_backend *)lt->impl.get())->fp8_gemm() == DLLM__FP8_CUBLASLT_BLOCK);
        std::vector<std::vector<int32_t>> inputs;
        for (const test_golden_input &gi : test_golden_inputs(dir)) inputs.push_back(gi.ids);
        if (inputs.empty())
            inputs.push_back(test_heldout_window(strstr(dir, "dream") ? "tiny-dream" : "tiny-llada", m->cfg.mask_id));
        std::vector<float> all_mma, all_lt, all_bf16;
        int same_argmax = 0, rows = 0;
        for (const std::vector<int32_t> &ids : inputs) {
            const int T = (int)ids.size(), V = m->cfg.n_vocab;
            std::vector<float> a((size_t)T * V, NAN), b(a.size(), NAN), c(a.size(), NAN);
            CHECK_STATUS(dllm_logits(mma, ids.data(), T, 0, T, a.data(), a.size()), DLLM_OK, nullptr);
            CHECK_STATUS(dllm_logits(lt, ids.data(), T, 0, T, b.data(), b.size()), DLLM_OK, nullptr);
            CHECK_STATUS(dllm_logits(bf16, ids.data(), T, 0, T, c.data(), c.size()), DLLM_OK, nullptr);
            for (int i = 0; i < T; i++, rows++)
                same_argmax += std::max_element(a.begin() + (long)i * V, a.begin() + (long)(i + 1) * V) - a.begin() ==
                               std::max_element(b.begin() + (long)i * V, b.begin() + (long)(i + 1) * V) - b.begin();
            all_mma.insert(all_mma.end(), a.begin(), a.end());
            all_lt.insert(all_lt.end(), b.begin(), b.end());
            all_bf16.insert(all_bf16.end(), c.begin(), c.end());
        }
        const double to_lt = test_nmse(all_mma.data(), all_lt.data(), all_lt.size()),
                     lt_to_bf16 = test_nmse(all_lt.data(), all_bf16.data(), all_lt.size());
        printf(
            "    %s %s: logits NMSE mma vs cuBLASLt FP8 %.2e (cuBLASLt FP8 vs BF16 %.2e), max error / max |ref| %.2e, "
            "argmax agrees on %d/%d rows\n",
            dir, precision == DLLM_PRECISION_FP8_ALL ? "FP8 all" : "FP8 FFN", to_lt, lt_to_bf16,
            test_max_rel(all_mma, all_lt), same_argmax, rows);
        // The GEMMs agree to NMSE ~4e-7 (gpu_fp8.mma_gemm_matches_cublaslt_at_llada_ffn_shapes); through the layers a
        // last-bit difference moves some activations across an E4M3 rounding boundary, so two correct FP8 paths end
        // about as far apart as FP8 is from BF16 on these tiny models
        // (measured on the H200: 0.09-0.8 of it; GPU vs CPU FP8 shows the same). A wrong scale or tile would put them
        // orders of magnitude further apart.
        CHECK_MSG(to_lt < 1.5 * lt_to_bf16,
                  "%s: the mma FP8 logits are further from the cuBLASLt FP8 ones than FP8 is from BF16", dir);
        if (fixture) {
            test_decode_compare(T_, fixture, m, lt, mma);
            test_lacache_exact(T_, mma, 128, 37, 64, 8, 16, 0);
        }
    }
    dllm_ctx_free(lt);
    dllm_ctx_free(bf16);
    dllm_ctx_free(mma);
    dllm_model_free(m);
}

TEST(gpu_fp8, mma_forward_matches_cublaslt_forward) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    if (g.arch.fp8 != DLLM__FP8_CUBLASLT_BLOCK)
        SKIP("skipped (cuBLASLt's block-scaled FP8, the reference, is sm_90 only)");
    printf("    (in near-tie reports below, \"CPU\" is the cuBLASLt FP8 context and \"GPU\" the mma one)\n");
    for (dllm_precision precision : {DLLM_PRECISION_FP8_FFN, DLLM_PRECISION_FP8_ALL}) {
        test_mma_forward_case(T_, "tests/data/tiny-llada", "tiny-llada", precision);
        test_mma_forward_case(T_, "tests/data/tiny-dream", "tiny-dream", precision);
        test_mma_forward_case(T_, "models/tiny-llada", nullptr, precision);
    }
}

// ---- GPU: the FP8 forward, LaCache ------------------------------------------------------------------

/* GPU FP8 logits against the CPU FP8 reference. The two quantise slightly different activations (the GPU's
 * carry BF16 noise), so a code near a rounding boundary can land one step apart: the max error is bounded
 * loosely (8e-2, the CPU FP8-vs-exact error on the fixtures is up to 7e-2), and the test that the GPU computes
 * the FP8 function is relative: over all inputs, the GPU's logits are nearer (NMSE) the CPU FP8 reference
 * than the exact CPU reference. That tells the two apart only where FP8 moves the logits far more than the E4M3
 * codes the BF16 noise flips (one flip moves a value by 1/16 to 1/8): on the fixtures FP8 moves them by 2.5-5e-3
 * NMSE and the GPU lands 1.5-2x nearer its twin; on the trained tiny models by 2-4e-4 only, as much as the
 * flips, and the order of the two distances changed with the wgmma attention's rounding (models/tiny-llada,
 * FP8 all: 2.48e-4 against 2.38e-4 on the H200). There the distances are reported, not compared. */
static void test_fp8_forward_case(dllm_test_state &T_, const char *dir, dllm_precision precision) {
    dllm_model *m = test_load(dir);
    dllm_ctx *cpu8 = m ? test_ctx_precision(m, DLLM_BACKEND_CPU, precision) : nullptr, *cpu = m ? test_ctx(m) : nullptr,
             *gpu = m ? test_ctx_precision(m, DLLM_BACKEND_GPU, precision) : nullptr,
             *gpu16 = m ? test_ctx_precision(m, DLLM_BACKEND_GPU, DLLM_PRECISION_BF16) : nullptr;
    CHECK(cpu8 && cpu && gpu && gpu16);
    if (cpu8 && cpu && gpu && gpu16) {
        dllm__gpu_backend *g = (dllm__gpu_backend *)gpu->impl.get();
        CHECK(g->fp8_ffn_active() == (g->arch().fp8 != DLLM__FP8_NONE) &&
              g->fp8_attn_active() == (g->fp8_ffn_active() && precision == DLLM_PRECISION_FP8_ALL));
        std::vector<std::vector<int32_t>> inputs;
        for (const test_golden_input &gi : test_golden_inputs(dir)) inputs.push_back(gi.ids);
        if (inputs.empty())
            inputs.push_back(test_heldout_window(strstr(dir, "dream") ? "tiny-dream" : "tiny-llada", m->cfg.mask_id));
        std::vector<float> all8, all_cpu8, all_cpu, all16;
        for (const std::vector<int32_t> &ids : inputs) {
            const int T = (int)ids.size(), V = m->cfg.n_vocab;
            std::vector<float> a((size_t)T * V, NAN), b(a.size(), NAN), c(a.size(), NAN), e(a.size(), NAN);
            CHECK_STATUS(dllm_logits(cpu8, ids.data(), T, 0, T, a.data(), a.size()), DLLM_OK, nullptr);
            CHECK_STATUS(dllm_logits(gpu, ids.data(), T, 0, T, b.data(), b.size()), DLLM_OK, nullptr);
            CHECK_STATUS(dllm_logits(gpu16, ids.data(), T, 0, T, c.data(), c.size()), DLLM_OK, nullptr);
            CHECK_STATUS(dllm_logits(cpu, ids.data(), T, 0, T, e.data(), e.size()), DLLM_OK, nullptr);
            double err = test_max_rel(b, a);
            printf(
                "    %s %s T=%d: GPU vs CPU FP8 logits max relative error %.2e (GPU FP8 vs GPU BF16 %.2e, CPU FP8 vs "
                "CPU exact %.2e)\n",
                dir, precision == DLLM_PRECISION_FP8_ALL ? "FP8 all" : "FP8 FFN", T, err, test_max_rel(b, c),
                test_max_rel(a, e));
            CHECK_MSG(err < 8e-2, "%s: FP8 forward error %.3e", dir, err);
            all8.insert(all8.end(), b.begin(), b.end());
            all_cpu8.insert(all_cpu8.end(), a.begin(), a.end());
            all_cpu.insert(all_cpu.end(), e.begin(), e.end());
            all16.insert(all16.end(), c.begin(), c.end());
        }
        double to_fp8 = test_nmse(all8.data(), all_cpu8.data(), all8.size()),
               to_exact = test_nmse(all8.data(), all_cpu.data(), all8.size());
        const double fp8_effect = test_nmse(all_cpu8.data(), all_cpu.data(), all8.size()),
                     bf16_noise = test_nmse(all16.data(), all_cpu.data(), all8.size());
        printf(
            "    %s: GPU FP8 logits NMSE vs CPU FP8 %.2e, vs CPU exact %.2e (FP8 moves the CPU's logits by %.2e%s, the "
            "GPU's BF16 noise %.2e)\n",
            dir, to_fp8, to_exact, fp8_effect, fp8_effect > 1e-3 ? "" : ": too little to compare", bf16_noise);
        if (g->fp8_ffn_active() && fp8_effect > 1e-3)
            CHECK_MSG(to_fp8 < to_exact, "%s: the GPU FP8 logits are not nearer the FP8 reference than the exact one",
                      dir);
    }
    dllm_ctx_free(cpu8);
    dllm_ctx_free(cpu);
    dllm_ctx_free(gpu);
    dllm_ctx_free(gpu16);
    dllm_model_free(m);
}

TEST(gpu_fp8, forward_matches_cpu_fp8_reference) {
    NEED_GPU();
    for (const char *dir :
         {"tests/data/tiny-llada", "tests/data/tiny-dream", "models/tiny-llada", "models/tiny-dream"}) {
        test_fp8_forward_case(T_, dir, DLLM_PRECISION_FP8_FFN);
        test_fp8_forward_case(T_, dir, DLLM_PRECISION_FP8_ALL);
    }
}

/* LaCache off / truncate / on under FP8: the same bits (layers 1 to L-2 run every row with the same M; the last
 * layer, which may run the output rows alone, takes pinned FP8 GEMMs in chunks). */
TEST(gpu_fp8, lacache_is_bit_exact_under_fp8_tiny_models) {
    NEED_GPU();
    const auto fp8_all = [](dllm_model *m) { return test_ctx_precision(m, DLLM_BACKEND_GPU, DLLM_PRECISION_FP8_ALL); };
    test_on_tiny_fixtures(T_, ", FP8 all", fp8_all, [&](dllm_ctx *ctx) {
        test_lacache_exact(T_, ctx, 128, 37, 64, 8, 16, 0);
        test_lacache_exact(T_, ctx, 128, 61, 128, 64, 4, 1.5f);
        // CFG with the last layer cut to all rows but one (Dream's shift): the second batch entry's FP8 GEMMs start
        // at an odd row and write their 16-row padding furthest past the rows
        test_lacache_exact(T_, ctx, 128, 37, 64, 8, 8, 1.5f);
    });
}

TEST(gpu_fp8, lacache_is_bit_exact_under_fp8_llada_8b_shape) {
    NEED_GPU();
    dllm_model *m = test_llada_8b_shape(T_);
    dllm_ctx *ctx = test_gpu_ctx(T_, m, 2048, DLLM_PRECISION_FP8_FFN);
    if (ctx) {
        printf("    LLaDA-8B shape, FP8 FFN\n");
        test_lacache_exact(T_, ctx, 100000, 81, 16, 8, 4, 0);    // N = 97
        test_lacache_exact(T_, ctx, 100000, 936, 64, 32, 4, 0);  // N = 1000
    }
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* FP8 keeps one byte a weight: the BF16 FFN weights of layers >= 1 are released after quantisation. */
TEST(gpu_fp8, fp8_weights_replace_bf16_ones) {
    NEED_GPU();
    dllm_model *m = test_llada_8b_shape(T_);
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_GPU;
    cp.max_tokens = 256;
    int64_t bytes[3] = {0, 0, 0};
    for (int p = 0; p < 3 && m; p++) {
        cp.precision = (dllm_precision)p;
        int64_t before = dllm__device_bytes;
        dllm_ctx *ctx = nullptr;
        CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
        bytes[p] = dllm__device_bytes - before;
        dllm_ctx_free(ctx);
    }
    printf("    LLaDA-8B shape, GPU memory after creation: BF16 %.2f GB, FP8 FFN %.2f GB, FP8 all %.2f GB\n",
           bytes[0] / 1e9, bytes[1] / 1e9, bytes[2] / 1e9);
    test_gpu g;
    if (g.init() == DLLM_OK && g.arch.fp8 != DLLM__FP8_NONE) CHECK(bytes[1] < bytes[0] * 0.75 && bytes[2] < bytes[1]);
    dllm_model_free(m);
}

/* Greedy decoding on the GPU in FP8 against the CPU FP8 reference and against GPU BF16: agreement printed. */
TEST(gpu_fp8, decoding_agreement_printed) {
    NEED_GPU();
    for (const char *fx : {"tiny-llada", "tiny-dream"}) {
        dllm_model *m = test_load(test_data(fx));
        dllm_ctx *cpu8 = m ? test_ctx_precision(m, DLLM_BACKEND_CPU, DLLM_PRECISION_FP8_FFN) : nullptr,
                 *gpu8 = m ? test_ctx_precision(m, DLLM_BACKEND_GPU, DLLM_PRECISION_FP8_FFN) : nullptr,
                 *gpu16 = m ? test_ctx_precision(m, DLLM_BACKEND_GPU, DLLM_PRECISION_BF16) : nullptr;
        dllm__json root;
        dllm__json_load(test_data(fx) + "/golden_traces.json", root);
        const dllm__json *cs = root.find("cases");
        long tokens = 0, same_cpu = 0, same_16 = 0;
        for (size_t ci = 0; cpu8 && gpu8 && gpu16 && cs && ci < cs->items.size(); ci++) {
            dllm_gen_params p = test_case_params(cs->items[ci]);
            p.stop_at_eos = 0;
            std::vector<int32_t> prompt = test_ints(cs->items[ci].find("prompt")), a((size_t)p.gen_length), b(a.size()),
                                 c(a.size());
            dllm_generate(cpu8, prompt.data(), (int)prompt.size(), p, a.data(), (int)a.size(), nullptr, nullptr);
            CHECK_STATUS(
                dllm_generate(gpu8, prompt.data(), (int)prompt.size(), p, b.data(), (int)b.size(), nullptr, nullptr),
                DLLM_OK, nullptr);
            dllm_generate(gpu16, prompt.data(), (int)prompt.size(), p, c.data(), (int)c.size(), nullptr, nullptr);
            for (size_t i = 0; i < a.size(); i++) { same_cpu += a[i] == b[i]; same_16 += c[i] == b[i]; }
            tokens += (long)a.size();
        }
        printf("    %s: GPU FP8 token agreement with CPU FP8 %.4f, with GPU BF16 %.4f (%ld tokens)\n", fx,
               tokens ? (double)same_cpu / tokens : 0.0, tokens ? (double)same_16 / tokens : 0.0, tokens);
        CHECK(tokens > 0);
        dllm_ctx_free(cpu8);
        dllm_ctx_free(gpu8);
        dllm_ctx_free(gpu16);
        dllm_model_free(m);
    }
}
