/* Tests: SoloQ numerics (section 9b) and the SoloQ precisions of the CPU backend. The spec's acceptance numbers
 * (soloq.md 11): rotation orthogonality at every model size, Lloyd-Max / NVFP4 / INT4 / E8P NMSE on Gaussian data,
 * the E8P codebook's properties, NVFP4's ties and saturation; the packing round trip, per-row independence, the bias
 * correction, awkward sizes; the precisions through the API; per-layer output NMSE on the tiny models and the
 * paper's rotation ablation (KL to N(0, 1), block-energy imbalance), printed for BENCHMARKS.md. */
#include <set>

// ---- rotations ------------------------------------------------------------------------------------------------

/* R as an explicit d x d matrix in double, built from the definition R = (Q_k x H_b / sqrt b) D P (spec 2.1), not
 * from the fast transform: (R x)_{j b + c} = sum_i Q_ji sum_c' H_cc' / sqrt b s_{i b + c'} x[perm[i b + c']]. */
static std::vector<double> test_dense_rotation(const dllm__rotation &r) {
    const int d = r.d, b = r.b, k = r.k;
    std::vector<double> R((size_t)d * d, 0.0);
    auto hadamard = [](int c, int c2) {
        return __builtin_popcount((unsigned)(c & c2)) & 1 ? -1.0 : 1.0;
    };  // Sylvester H_b
    for (int j = 0; j < k; j++)
        for (int c = 0; c < b; c++)
            for (int i = 0; i < k; i++) {
                const double q = r.mixer.empty() ? (i == j ? 1.0 : 0.0) : r.mixer[(size_t)j * k + i];
                if (q == 0) continue;
                for (int c2 = 0; c2 < b; c2++) {
                    const int in = i * b + c2, src = r.perm.empty() ? in : r.perm[(size_t)in];
                    R[(size_t)(j * b + c) * d + src] += q * hadamard(c, c2) / sqrt((double)b) * dllm__rot_sign(r, in);
                }
            }
    return R;
}

static std::vector<float> test_normals(test_rng &r, size_t n) {
    std::vector<float> v(n);
    for (float &x : v) x = r.normal();
    return v;
}

TEST(soloq, krpbh_block_sizes_follow_the_spec) {
    struct {
        int d, b, k;
    } cases[] = {{4096, 1024, 4}, {12288, 1024, 12}, {3584, 512, 7}, {18944, 512, 37}, {14336, 1024, 14}, {128, 32, 4},
                 {256, 64, 4},    {384, 64, 6},      {640, 128, 5},  {24, 4, 6},       {3, 1, 3}};
    for (auto &c : cases) {
        dllm__rotation r = dllm__make_rotation(DLLM__ROT_KRPBH, c.d, 1, 0);
        CHECK_MSG(r.b == c.b && r.k == c.k, "d %d: b %d k %d, want %d %d", c.d, r.b, r.k, c.b, c.k);
        CHECK(r.perm.size() == (size_t)c.d && r.sign_bits.size() == (size_t)(c.d + 7) / 8 &&
              r.mixer.size() == (size_t)c.k * c.k);
    }
    CHECK(dllm__make_rotation(DLLM__ROT_HADAMARD, 3584, 1, 0).b == 512 &&
          dllm__make_rotation(DLLM__ROT_HADAMARD, 4096, 1, 0).b == 4096);
    CHECK(dllm__make_rotation(DLLM__ROT_RPBH, 4096, 1, 0).mixer.empty() &&
          dllm__make_rotation(DLLM__ROT_MIXER, 4096, 1, 0).perm.empty());
    // a pure function of (kind, d, seed, site); another site or seed draws another rotation
    dllm__rotation a = dllm__make_rotation(DLLM__ROT_KRPBH, 640, 7, 3),
                   b = dllm__make_rotation(DLLM__ROT_KRPBH, 640, 7, 3),
                   c = dllm__make_rotation(DLLM__ROT_KRPBH, 640, 7, 4),
                   e = dllm__make_rotation(DLLM__ROT_KRPBH, 640, 8, 3);
    CHECK(a.perm == b.perm && a.sign_bits == b.sign_bits && a.mixer == b.mixer);
    CHECK(a.perm != c.perm && a.sign_bits != c.sign_bits && a.mixer != c.mixer && a.perm != e.perm);
}

/* Spec 11.1 for every (d, b) of the models: |Rx| / |x| = 1 +- 1e-6, R^T R x = x to 1e-5, (W R^T)(R x) = W x; Q_k
 * orthogonal to 1e-6; and the fast transform equals the definition's dense matrix (small d). */
TEST(soloq, rotations_are_orthogonal_at_every_model_size) {
    test_rng rng("soloq rotations");
    const int sizes[] = {4096, 12288, 3584, 18944, 14336, 128, 256, 384, 640, 48, 24, 3};
    const dllm__rot_kind kinds[] = {DLLM__ROT_KRPBH, DLLM__ROT_RPBH, DLLM__ROT_MIXER, DLLM__ROT_HADAMARD,
                                    DLLM__ROT_HAAR};
    for (int d : sizes)
        for (dllm__rot_kind kind : kinds) {
            if (kind == DLLM__ROT_HAAR && d > 640) continue;
            const dllm__rotation r = dllm__make_rotation(kind, d, rng.next(), 5);
            double q_err = 0;
            const int n = kind == DLLM__ROT_HAAR ? d : r.k;
            for (int i = 0; i < n && !r.mixer.empty(); i++)
                for (int j = 0; j < n; j++) {
                    double dot = 0;
                    for (int c = 0; c < n; c++) dot += (double)r.mixer[(size_t)i * n + c] * r.mixer[(size_t)j * n + c];
                    q_err = std::max(q_err, fabs(dot - (i == j)));
                }
            double norm_err = 0, inv_err = 0, dot_err = 0;
            for (int t = 0; t < 3; t++) {
                std::vector<float> x = test_normals(rng, (size_t)d), w = test_normals(rng, (size_t)d),
                                   rx((size_t)d, NAN), rw((size_t)d, NAN), back((size_t)d, NAN);
                if (t == 2) x[(size_t)rng.below(d)] = 300.0f;  // an outlier channel
                dllm__rotate(r, x.data(), rx.data());
                dllm__rotate(r, w.data(), rw.data());
                dllm__rotate_inverse(r, rx.data(), back.data());
                double nx = 0, nrx = 0, diff = 0, wx = 0, wx_rot = 0, nw = 0;
                for (int i = 0; i < d; i++) {
                    nx += (double)x[(size_t)i] * x[(size_t)i];
                    nrx += (double)rx[(size_t)i] * rx[(size_t)i];
                    diff += ((double)back[(size_t)i] - x[(size_t)i]) * ((double)back[(size_t)i] - x[(size_t)i]);
                    // W x with W in BF16, as the model holds it
                    const double wi = dllm__bf16_to_f32(dllm__f32_to_bf16(w[(size_t)i]));
                    wx += wi * x[(size_t)i];
                    nw += wi * wi;
                }
                std::vector<float> wb((size_t)d), rwb((size_t)d);
                for (int i = 0; i < d; i++) wb[(size_t)i] = dllm__bf16_to_f32(dllm__f32_to_bf16(w[(size_t)i]));
                dllm__rotate(r, wb.data(), rwb.data());
                for (int i = 0; i < d; i++) wx_rot += (double)rwb[(size_t)i] * rx[(size_t)i];
                norm_err = std::max(norm_err, fabs(sqrt(nrx / nx) - 1));
                inv_err = std::max(inv_err, sqrt(diff / nx));
                // relative to |w| |x|: the rotated products mix every channel, so their rounding scales with the norms
                // (sum |w_i x_i| can be far smaller: at d = 3 with an outlier channel it failed CI on one seed)
                dot_err = std::max(dot_err, fabs(wx_rot - wx) / sqrt(nx * nw));
            }
            CHECK_MSG(norm_err < 1e-6 && inv_err < 1e-5 && dot_err < 1e-5 && q_err < 1e-6,
                      "%s d=%d (b %d, k %d): norm %.1e, inverse %.1e, W x %.1e, Q %.1e", dllm__rot_names[kind], d, r.b,
                      r.k, norm_err, inv_err, dot_err, q_err);
            if (d <= 640) {  // the fast transform is the definition's matrix
                const std::vector<double> R = kind == DLLM__ROT_HAAR
                                                  ? std::vector<double>(r.mixer.begin(), r.mixer.end())
                                                  : test_dense_rotation(r);
                std::vector<float> x = test_normals(rng, (size_t)d), rx((size_t)d);
                dllm__rotate(r, x.data(), rx.data());
                double worst = 0;
                for (int i = 0; i < d; i++) {
                    double want = 0;
                    for (int j = 0; j < d; j++) want += R[(size_t)i * d + j] * x[(size_t)j];
                    worst = std::max(worst, fabs(want - rx[(size_t)i]));
                }
                CHECK_MSG(worst < 1e-4, "%s d=%d: fast transform vs dense definition %.2e", dllm__rot_names[kind], d,
                          worst);
            }
        }
    // a rotation that does nothing would pass every check above: K-RPBH spreads a unit vector over all d coordinates
    for (int d : {256, 4096}) {
        const dllm__rotation r = dllm__make_rotation(DLLM__ROT_KRPBH, d, 11, 0);
        std::vector<float> e((size_t)d, 0.0f), re((size_t)d);
        e[7] = 1;
        dllm__rotate(r, e.data(), re.data());
        int nonzero = 0;
        for (float v : re) nonzero += v != 0;
        CHECK_MSG(nonzero == d && dllm__amax(re.data(), d) < 4.0f / sqrtf((float)d) * sqrtf((float)r.k),
                  "d %d: %d nonzero, amax %g", d, nonzero, dllm__amax(re.data(), d));
    }
}

// ---- quantisers on Gaussian data (spec 11.2-11.5) ----------------------------------------------------------------

struct test_q4_stats {
    double nmse = 0, nmse_bc = 0, alpha = 0;  // plain and bias-corrected NMSE; mean alpha = bc scale / plain scale
};

/* NMSE of a format on `rows` i.i.d. N(0, 1) rows of d (one scale a row), with and without the bias correction. */
static test_q4_stats test_q4_gaussian(test_rng &rng, dllm__q4_format f, int rows, int d) {
    test_q4_stats s;
    double num = 0, num_bc = 0, den = 0;
    std::vector<float> value((size_t)d);
    std::vector<uint8_t> packed((size_t)d / 2), bs((size_t)d / 16);
    for (int r = 0; r < rows; r++) {
        std::vector<float> x = test_normals(rng, (size_t)d);
        const float plain = dllm__q4_quantize_row(f, x.data(), d, false, packed.data(), bs.data(), value.data());
        const float bc = dllm__q4_quantize_row(f, x.data(), d, true, packed.data(), bs.data(), value.data());
        for (int i = 0; i < d; i++) {
            num += pow((double)value[(size_t)i] * plain - x[(size_t)i], 2);
            num_bc += pow((double)value[(size_t)i] * bc - x[(size_t)i], 2);
            den += (double)x[(size_t)i] * x[(size_t)i];
        }
        s.alpha += (double)bc / plain / rows;
    }
    s.nmse = num / den, s.nmse_bc = num_bc / den;
    return s;
}

TEST(soloq, quantiser_nmse_on_gaussian_rows) {
    test_rng rng("soloq gaussian nmse");
    struct { dllm__q4_format f; double want, tol;
    } cases[] = {
        {DLLM__Q4_LLOYD, 0.00953, 0.0003},  // spec 11.2 (INT8 levels)
        {DLLM__Q4_NVFP4, 0.0091, 0.0003},   // spec 11.4
        {DLLM__Q4_INT4, 0.0115, 0.0004},    // spec 11.5
        {DLLM__Q4_E8P, 0.0097,
         0.0004},  // spec 11.3's RVQ4 0.0094 (we measure 0.0096: e8p test), the INT8 mapping, the row's own RMS
        {DLLM__Q4_RTN, 0.0241, 0.002},  // spec 6.2: symmetric INT4 per-token absmax, d = 4096
    };
    for (auto &c : cases) {
        const test_q4_stats s =
            test_q4_gaussian(rng, c.f, 160, 4096);  // 160 rows: the bounds at 3-4 sigma of the sampling spread
        printf("    %-9s d=4096: NMSE %.5f (want %.5f +- %.4f), bias-corrected %.5f, mean alpha %.5f\n",
               dllm__q4_names[c.f], s.nmse, c.want, c.tol, s.nmse_bc, s.alpha);
        CHECK_MSG(fabs(s.nmse - c.want) <= c.tol, "%s NMSE %.5f", dllm__q4_names[c.f], s.nmse);
        CHECK(s.nmse_bc < 1.1 * s.nmse + 1e-4);  // the correction restores the projection at a small MSE cost
    }
}

/* Spec 11.2's alpha: with the real Lloyd-Max levels (the codes decoded by dllm__lloyd4_levels), alpha = |z|^2 / <q, z>
 * averages 1.0096 +- 0.001 and the least-squares factor <q, z> / |q|^2 1.000 +- 0.001; NMSE 0.0095 +- 0.0003. */
TEST(soloq, lloyd_max_alpha_and_least_squares_factor) {
    test_rng rng("soloq lloyd alpha");
    // 192 rows: at 48 the means' spread (~0.0005) put the 0.001 bounds at 2 sigma, and a run in ~20 failed
    const int d = 4096, rows = 192;
    double alpha = 0, alpha_ls = 0, num = 0, den = 0;
    std::vector<float> value((size_t)d);
    std::vector<uint8_t> packed((size_t)d / 2);
    for (int r = 0; r < rows; r++) {
        std::vector<float> z = test_normals(rng, (size_t)d);
        double ss = 0;
        for (float v : z) ss += (double)v * v;
        const double sigma = sqrt(ss / d);
        dllm__q4_quantize_row(DLLM__Q4_LLOYD, z.data(), d, false, packed.data(), nullptr, value.data());
        double qz = 0, qq = 0;
        for (int i = 0; i < d; i++) {
            const uint8_t c = packed[(size_t)i / 2] >> (4 * (i & 1)) & 15;
            const double q = (c & 8 ? -1 : 1) * dllm__lloyd4_levels[c & 7] * sigma;
            CHECK(value[(size_t)i] == (c & 8 ? -1 : 1) * dllm__lloyd4_int[c & 7]);
            qz += q * z[(size_t)i], qq += q * q;
            num += (q - z[(size_t)i]) * (q - z[(size_t)i]);
        }
        den += ss;
        alpha += ss / qz / rows;
        alpha_ls += qz / qq / rows;
    }
    printf("    Lloyd-Max (real levels): NMSE %.5f, alpha %.5f, alpha_LS %.5f\n", num / den, alpha, alpha_ls);
    CHECK(fabs(num / den - 0.0095) <= 0.0003 && fabs(alpha - 1.0096) <= 0.001 && fabs(alpha_ls - 1.0) <= 0.001);
}

/* E2M1 round to nearest even (spec 11.4): the ties, saturation at 6, signs; the block scale and the element codes of a
 * row; an all-zero block. */
TEST(soloq, nvfp4_ties_saturation_and_zero_blocks) {
    const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}, want[] = {0, 1, 1, 2, 2, 4, 4};
    const float below[] = {0, 0.5f, 1, 1.5f, 2, 3, 4}, above[] = {0.5f, 1, 1.5f, 2, 3, 4, 6};
    auto e2m1 = [](float v) { return dllm__e2m1_to_f32(dllm__f32_to_e2m1(v)); };
    for (int i = 0; i < 7; i++) {
        CHECK_MSG(e2m1(ties[i]) == want[i] && e2m1(-ties[i]) == -want[i], "e2m1(%g) = %g", ties[i], e2m1(ties[i]));
        CHECK(e2m1(nextafterf(ties[i], 0)) == below[i] &&
              e2m1(nextafterf(ties[i], 10)) == above[i]);  // a hair off a tie: the nearer one
    }
    CHECK(dllm__f32_to_e2m1(6.0f) == 7 && dllm__f32_to_e2m1(7.0f) == 7 && dllm__f32_to_e2m1(1e30f) == 7 &&
          dllm__f32_to_e2m1(-100.0f) == 15);
    CHECK(dllm__f32_to_e2m1(-0.1f) == 0 && dllm__f32_to_e2m1(-0.0f) == 0);  // one zero
    // a row of two blocks: the first all zeros, the second with amax 3 among a 1e-3 background
    std::vector<float> x(32, 0.0f), value(32, NAN);
    for (int i = 16; i < 32; i++) x[(size_t)i] = i == 20 ? -3.0f : 1e-3f * (i - 24);
    uint8_t packed[16], bs[2];
    const float scale = dllm__q4_quantize_row(DLLM__Q4_NVFP4, x.data(), 32, false, packed, bs, value.data());
    const float s_enc = 2688.0f / 3.0f;
    CHECK(scale == 1.0f / s_enc && bs[0] == 0 && bs[1] == dllm__f32_to_e4m3(0.5f * s_enc));
    CHECK(dllm__e4m3_to_f32(bs[1]) == 448.0f && packed[0] == 0 && value[20] == -6.0f * 448.0f &&
          fabsf(value[20] * scale + 3.0f) < 1e-6f);
    for (int i = 0; i < 16; i++) CHECK(value[(size_t)i] == 0);
}

/* torchao's _nvfp4_quantize with a per-tensor scale (data / (per_tensor_scale * fp8 block scale), spec 11.4's
 * cross-check) against dllm's TE semantics (data * (S_enc / block scale)): the block scales agree, and the codes
 * agree except where the two roundings of the coefficient land on opposite sides of a tie. */
TEST(soloq, nvfp4_matches_torchao_semantics_on_a_tensor) {
    test_rng rng("soloq nvfp4 torchao");
    const int rows = 128, cols = 256;
    std::vector<float> x = test_normals(rng, (size_t)rows * cols);
    for (float &v : x) v *= 0.02f;
    const float amax = dllm__amax(x.data(), (int)x.size()), s_enc = dllm__nvfp4_s_enc(amax),
                per_tensor = amax / 2688.0f;
    std::vector<uint8_t> c4(x.size()), bs(x.size() / 16);
    std::vector<float> value(x.size());
    dllm__nvfp4_encode(x.data(), (int)x.size(), s_enc, c4.data(), bs.data(), value.data());
    size_t scale_diff = 0, code_diff = 0, near_tie = 0;
    for (size_t b = 0; b < bs.size(); b++) {
        const float block_scale = dllm__amax(&x[b * 16], 16) / 6.0f / per_tensor;
        const uint8_t sb = dllm__f32_to_e4m3(fminf(fmaxf(block_scale, 0x1p-9f), 448.0f));
        scale_diff += sb != bs[b];
        const float total = per_tensor * dllm__e4m3_to_f32(sb);
        for (size_t i = b * 16; i < b * 16 + 16; i++) {
            const float v = x[i] / total;
            const uint8_t c = dllm__f32_to_e2m1(v);
            if (c != c4[i]) {
                code_diff++;
                const float a = fabsf(v);
                for (float t : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) near_tie += fabsf(a - t) <= 1e-5f * t;
            }
        }
    }
    printf("    128x256 tensor: %zu block scales and %zu of %zu codes differ (%zu of them at a tie)\n", scale_diff,
           code_diff, x.size(), near_tie);
    CHECK(scale_diff == 0 && code_diff == near_tie && code_diff <= x.size() / 1000);
}

/* The E8P codebook (spec 11.3): 2^16 distinct codewords, each of even coordinate sum once the +-1/4 is removed and
 * every |coordinate| <= 11/4; the encoder is the exact nearest codeword (brute force over all 2^16); MSE 0.0903 at
 * scale 1.03 and 0.0094 for RVQ4 (1.03, 3.45) on N(0, 1). */
TEST(soloq, e8p_codebook_properties_and_exact_encoder) {
    std::vector<int> all((size_t)65536 * 8);
    std::set<std::vector<int>> distinct;
    int bad_parity = 0, too_large = 0;
    for (int code = 0; code < 65536; code++) {
        int *v = &all[(size_t)code * 8];
        dllm__e8p_decode4((uint16_t)code, v);
        const int shift = code & 1 ? 1 : -1;
        int sum2 = 0;  // sum of 2 * coordinate without the shift
        for (int i = 0; i < 8; i++) {
            sum2 += (v[i] - shift) / 2;
            too_large += abs(v[i]) > 11;
        }
        bad_parity += (sum2 / 2) % 2 != 0 || sum2 % 2 != 0;
        distinct.insert(std::vector<int>(v, v + 8));
    }
    std::set<std::vector<int>> patterns;
    for (int p = 0; p < 256; p++) patterns.insert(std::vector<int>(dllm__e8p_abs(p), dllm__e8p_abs(p) + 8));
    printf("    %zu distinct codewords, %zu distinct abs patterns, %d of odd sum, %d beyond 11/4\n", distinct.size(),
           patterns.size(), bad_parity, too_large);
    CHECK(distinct.size() == 65536 && patterns.size() == 256 && bad_parity == 0 && too_large == 0);
    test_rng rng("soloq e8p");
    int not_nearest = 0;
    for (int t = 0; t < 300; t++) {
        float x[8];
        for (float &v : x) v = rng.normal() * (t < 100 ? 1.0f : 3.0f);
        double best = INFINITY;
        for (int code = 0; code < 65536; code++) {
            double e = 0;
            for (int i = 0; i < 8; i++) e += pow(x[i] - all[(size_t)code * 8 + i] / 4.0, 2);
            best = std::min(best, e);
        }
        int got[8];
        dllm__e8p_decode4(dllm__e8p_encode(x), got);
        double e = 0;
        for (int i = 0; i < 8; i++) e += pow(x[i] - got[i] / 4.0, 2);
        not_nearest += e > best + 1e-5;
    }
    CHECK_MSG(not_nearest == 0, "%d of 300 encodings are not the nearest codeword", not_nearest);
    double mse1 = 0, mse_rvq = 0, mse_int = 0;
    const int groups = 100000;
    for (int g = 0; g < groups; g++) {
        float z[8], v1[8], v2[8];
        int e1[8], e2[8];
        for (int i = 0; i < 8; i++) z[i] = rng.normal(), v1[i] = z[i] * 1.03f;
        dllm__e8p_decode4(dllm__e8p_encode(v1), e1);
        for (int i = 0; i < 8; i++) v2[i] = (v1[i] - e1[i] / 4.0f) * 3.45f;
        dllm__e8p_decode4(dllm__e8p_encode(v2), e2);
        for (int i = 0; i < 8; i++) {
            mse1 += pow(z[i] - e1[i] / 4.0 / 1.03, 2);
            mse_rvq += pow(z[i] - (e1[i] / 4.0 + e2[i] / 4.0 / 3.45) / 1.03, 2);
            mse_int += pow(z[i] - dllm__e8p_int(e1[i], e2[i]) / (35.8 * 1.03), 2);
            CHECK(abs(dllm__e8p_int(e1[i], e2[i])) <= 127);
        }
    }
    mse1 /= groups * 8.0, mse_rvq /= groups * 8.0, mse_int /= groups * 8.0;
    // over 20 seeds we measure 0.09135 +- 0.00022 and 0.00962 +- 0.00007 (mean, sd); the spec's Monte Carlo says 0.0903
    // and 0.0094 (RVQ4 runs 2 % above it). The bands are centred on our means, at least 7 sd to each side (the old edge
    // sat 2.6 sd above the mean: about one run in 200 would have failed), and still hold the spec's values
    printf("    E8P at 1.03: MSE %.5f (want 0.0913 +- 0.002); RVQ4: %.5f (want 0.0096 +- 0.0005); RVQ4 in INT8: %.5f\n",
           mse1, mse_rvq, mse_int);
    CHECK(fabs(mse1 - 0.0913) <= 0.002 && fabs(mse_rvq - 0.0096) <= 0.0005 && mse_int < mse_rvq * 1.02);
}

// ---- packing, independence, bias correction, awkward sizes ------------------------------------------------------

static const dllm__q4_format test_q4_formats[] = {DLLM__Q4_NVFP4, DLLM__Q4_INT4, DLLM__Q4_LLOYD, DLLM__Q4_E8P,
                                                  DLLM__Q4_RTN};

/* Rows of awkward widths quantised as a matrix, decoded through the packing (dllm__q4_row, dllm__q4_value) equal what
 * the quantiser computed; quantised alone, or among other rows, a row gets the same bytes; the bias correction makes
 * <x^, x> = |x|^2; zero, NaN and Inf rows. */
TEST(soloq, packing_round_trip_row_independence_and_bias_correction) {
    test_rng rng("soloq packing");
    for (dllm__q4_format f : test_q4_formats)
        for (int cols : {16, 40, 48, 200, 640}) {
            const int rows = 7;
            std::vector<float> x = test_normals(rng, (size_t)rows * cols);
            for (int i = 0; i < cols; i++) x[(size_t)3 * cols + i] = 0.0f;       // row 3: zeros
            x[(size_t)5 * cols + 1] = 40.0f;                                       // row 5: an outlier
            for (bool bc : {false, true}) {
                dllm__q4_rows q = dllm__q4_quantize(nullptr, f, x.data(), rows, cols, bc);
                CHECK(q.codes.size() == (size_t)rows * cols / 2 && q.row_scale.size() == (size_t)rows);
                std::vector<float> deq((size_t)cols, NAN), value((size_t)cols, NAN);
                std::vector<uint8_t> packed((size_t)cols / 2), bs((size_t)(cols + 15) / 16);
                double proj_sum = 0,
                       ss_sum = 0;  // Lloyd's shrink (alpha ~ 1.01 on Gaussian rows), over the ordinary rows:
                                    // a single row of 640 can go either way
                for (int r = 0; r < rows; r++) {
                    const float *xr = &x[(size_t)r * cols];
                    const float scale = dllm__q4_quantize_row(f, xr, cols, bc, packed.data(), bs.data(), value.data());
                    CHECK(scale == q.row_scale[(size_t)r] &&
                          !memcmp(packed.data(), &q.codes[(size_t)r * cols / 2], packed.size()));
                    if (f == DLLM__Q4_NVFP4)
                        CHECK(!memcmp(bs.data(), &q.block_scales[(size_t)r * q.blocks()], bs.size()));
                    dllm__q4_row(q, r, deq.data());
                    double proj = 0, ss = 0;
                    int mismatches = 0;
                    for (int i = 0; i < cols; i++) {
                        mismatches += deq[(size_t)i] != value[(size_t)i] * scale ||
                                      dllm__q4_value(f, packed.data(), bs.data(), i) != value[(size_t)i];
                        proj += (double)deq[(size_t)i] * xr[i], ss += (double)xr[i] * xr[i];
                    }
                    CHECK_MSG(mismatches == 0, "%s cols %d row %d: %d values differ from the quantiser's",
                              dllm__q4_names[f], cols, r, mismatches);
                    if (r == 3) CHECK(scale == 0);
                    else if (bc)
                        CHECK_MSG(fabs(proj - ss) <= 1e-5 * ss, "%s cols %d: <x^, x> %.7g vs |x|^2 %.7g",
                                  dllm__q4_names[f], cols, proj, ss);
                    else if (f == DLLM__Q4_LLOYD && cols == 640 && r != 5) proj_sum += proj, ss_sum += ss;
                }
                if (ss_sum > 0)
                    CHECK_MSG(proj_sum < ss_sum, "Lloyd cols 640: <x^, x> %.7g vs |x|^2 %.7g over the ordinary rows",
                              proj_sum, ss_sum);
                // row 2 alone, and among other rows: the same bytes
                std::vector<float> other = test_normals(rng, (size_t)3 * cols);
                memcpy(&other[(size_t)cols], &x[(size_t)2 * cols], sizeof(float) * cols);
                dllm__q4_rows alone = dllm__q4_quantize(nullptr, f, &x[(size_t)2 * cols], 1, cols, bc),
                              among = dllm__q4_quantize(nullptr, f, other.data(), 3, cols, bc);
                CHECK(!memcmp(alone.codes.data(), &q.codes[(size_t)cols], (size_t)cols / 2) &&
                      !memcmp(among.codes.data() + cols / 2, alone.codes.data(), (size_t)cols / 2));
                CHECK(alone.row_scale[0] == q.row_scale[2] && among.row_scale[1] == q.row_scale[2]);
            }
            std::vector<float> bad(x.begin(), x.begin() + cols), value((size_t)cols);
            std::vector<uint8_t> packed((size_t)cols / 2), bs((size_t)(cols + 15) / 16);
            bad[3] = NAN;
            CHECK(std::isnan(dllm__q4_quantize_row(f, bad.data(), cols, true, packed.data(), bs.data(), value.data())));
            bad[3] = INFINITY;
            CHECK(
                std::isnan(dllm__q4_quantize_row(f, bad.data(), cols, false, packed.data(), bs.data(), value.data())));
        }
}

/* Activations rotated then quantised per token; a W4A4 linear on rotated weights computes W x to the formats'
 * accuracy, and without quantisation (the rotation alone) exactly up to fp32. */
TEST(soloq, rotated_linear_computes_w_x) {
    test_rng rng("soloq linear");
    const int K = 640, N = 96, T = 5;
    std::vector<uint16_t> wb((size_t)N * K);
    for (uint16_t &v : wb) v = dllm__f32_to_bf16(0.02f * rng.normal());
    dllm__tensor W;
    W.dtype = DLLM__BF16, W.shape = {N, K}, W.numel = (int64_t)N * K, W.data = (const uint8_t *)wb.data(),
    W.nbytes = wb.size() * 2;
    std::vector<float> x = test_normals(rng, (size_t)T * K);
    x[3] = 60.0f;  // an outlier channel of token 0
    dllm__pool pool(2);
    std::vector<float> exact((size_t)T * N);
    dllm__cpu_linear(pool, x.data(), T, K, W, nullptr, N, exact.data());
    double worst_rotated = 0, rtn = 0;
    for (dllm__q4_format f : test_q4_formats) {
        dllm__soloq_options o;
        o.enabled = true, o.weights = f, o.acts = f == DLLM__Q4_E8P ? DLLM__Q4_LLOYD : f;
        o.rotation = f == DLLM__Q4_RTN ? DLLM__ROT_NONE : DLLM__ROT_KRPBH;
        dllm__soloq_layer L;
        L.opt = o;
        L.lin[DLLM__SOLOQ_O] = dllm__soloq_quantize_linear(
            pool, {&W}, std::make_shared<const dllm__rotation>(dllm__make_rotation(o.rotation, K, 3, 1)), o);
        std::vector<float> xa = x, y((size_t)T * N, NAN);
        dllm__cpu_linear_soloq(pool, xa.data(), true, T, L, DLLM__SOLOQ_O, 0, nullptr, N, y.data());
        const double nmse = test_nmse(y.data(), exact.data(), y.size());
        printf("    %-9s W4A4 linear %dx%d, %d tokens: output NMSE %.4f\n", dllm__q4_names[f], N, K, T, nmse);
        // quantised: changed, but close. Over 200 seeds the rotated formats stay under 0.036 and plain RTN (the outlier
        // lands unrotated in one token's scale) under 0.24, at least 4x the worst rotated format of the same seed.
        CHECK(nmse > 1e-5 && nmse < (f == DLLM__Q4_RTN ? 0.4 : 0.05));
        if (f == DLLM__Q4_RTN) rtn = nmse;
        else worst_rotated = std::max(worst_rotated, nmse);
    }
    CHECK(rtn > 2 * worst_rotated);  // what the rotation is for
    // the rotation alone (no quantisation anywhere) is W x up to fp32 rounding
    const dllm__rotation r = dllm__make_rotation(DLLM__ROT_KRPBH, K, 3, 1);
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            std::vector<float> w((size_t)K), rw((size_t)K), rx((size_t)K);
            dllm__tensor_row(W, n, K, w.data());
            dllm__rotate(r, w.data(), rw.data());
            dllm__rotate(r, &x[(size_t)t * K], rx.data());
            double y = 0;
            for (int i = 0; i < K; i++) y += (double)rw[(size_t)i] * rx[(size_t)i];
            worst = std::max(worst, fabs(y - exact[(size_t)t * N + n]));
        }
    CHECK_MSG(worst < 1e-4, "rotated W x differs by %.2e", worst);
}

// ---- the precisions through the API -------------------------------------------------------------------------------

TEST(soloq, precisions_are_validated) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    CHECK(dllm_ctx_default_params().quantize_lm_head == 0);
    dllm_ctx_params p = dllm_ctx_default_params();
    dllm_ctx *ctx = nullptr;
    p.precision = DLLM_PRECISION_SOLOQ_N;
    p.backend = DLLM_BACKEND_AUTO;  // AUTO takes the GPU where there is one, as for every precision
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_OK, nullptr);
    CHECK(ctx && dllm_ctx_get_backend(ctx) == (test_have_gpu() ? DLLM_BACKEND_GPU : DLLM_BACKEND_CPU));
    dllm_ctx_free(ctx);
    ctx = nullptr;
    p.backend = DLLM_BACKEND_CPU;
    p.quantize_lm_head = 2;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "quantize_lm_head 2");
    p.quantize_lm_head = 0;
    p.precision = (dllm_precision)11;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "precision 11");
    p.precision = DLLM_PRECISION_SOLOQ_I;
    p.soloq_rotation = (dllm_soloq_rotation)7;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT,
                 "soloq_rotation 7 must be a dllm_soloq_rotation");
    p.soloq_rotation = DLLM_SOLOQ_ROTATION_DEFAULT;
    p.soloq_bias_correction = 2;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "soloq_bias_correction 2 must be -1");
    p.soloq_bias_correction = -1;
    CHECK(ctx == nullptr);
    // the options of each precision
    struct { dllm_precision p; dllm__q4_format w, a; bool acts; dllm__rot_kind rot; bool bc; } cases[] = {
        {DLLM_PRECISION_SOLOQ_N, DLLM__Q4_NVFP4, DLLM__Q4_NVFP4, true, DLLM__ROT_KRPBH, true},
        {DLLM_PRECISION_SOLOQ_I, DLLM__Q4_INT4, DLLM__Q4_INT4, true, DLLM__ROT_KRPBH, true},
        {DLLM_PRECISION_SOLOQ_C, DLLM__Q4_E8P, DLLM__Q4_LLOYD, true, DLLM__ROT_KRPBH, true},
        {DLLM_PRECISION_RTN_W4A4, DLLM__Q4_RTN, DLLM__Q4_RTN, true, DLLM__ROT_NONE, false},
        {DLLM_PRECISION_SOLOQ_N_W4A16, DLLM__Q4_NVFP4, DLLM__Q4_NVFP4, false, DLLM__ROT_KRPBH, true},
        {DLLM_PRECISION_SOLOQ_C_W4A16, DLLM__Q4_E8P, DLLM__Q4_LLOYD, false, DLLM__ROT_KRPBH, true},
        {DLLM_PRECISION_RTN_W4A16, DLLM__Q4_RTN, DLLM__Q4_RTN, false, DLLM__ROT_NONE, false},
    };
    for (auto &c : cases) {
        dllm__soloq_options o;
        CHECK(dllm__soloq_options_for(c.p, 1, DLLM_SOLOQ_ROTATION_DEFAULT, -1, o) == DLLM_OK);
        CHECK_MSG(o.enabled && o.weights == c.w && o.acts == c.a && o.quantize_acts == c.acts && o.rotation == c.rot &&
                      o.bias_correction == c.bc && o.quantize_head,
                  "%s", dllm__precision_name(c.p));
    }
    dllm__soloq_options o;
    const int rpbh = DLLM_SOLOQ_ROTATION_RPBH;
    CHECK(dllm__soloq_options_for(DLLM_PRECISION_SOLOQ_C, 0, rpbh, 0, o) == DLLM_OK && o.rotation == DLLM__ROT_RPBH &&
          !o.bias_correction && !o.quantize_head);
    CHECK(dllm__soloq_options_for(DLLM_PRECISION_RTN_W4A4, 0, rpbh, 0, o) == DLLM_OK &&
          o.rotation == DLLM__ROT_NONE);  // the baseline ignores them
    CHECK(dllm__soloq_options_for(DLLM_PRECISION_FP8_ALL, 0, rpbh, 0, o) == DLLM_OK && !o.enabled);
    // the public enum's order is the rotation kinds' (dllm__rot_names), one ahead of them
    CHECK(DLLM_SOLOQ_ROTATION_NONE - 1 == DLLM__ROT_NONE && DLLM_SOLOQ_ROTATION_HAAR - 1 == DLLM__ROT_HAAR &&
          DLLM_SOLOQ_ROTATION_KRPBH - 1 == DLLM__ROT_KRPBH && DLLM_SOLOQ_ROTATION_MIXER - 1 == DLLM__ROT_MIXER);
    dllm_model_free(m);
}

/* Weights are held as codes + scales: 4 + 32 / cols bits a weight (NVFP4 4.5 + 32 / cols); every linear of every
 * layer is quantised, the head only when asked. */
TEST(soloq, weights_stored_in_four_bits) {
    dllm_model *m = test_load(test_data("tiny-dream"));
    if (!m) { CHECK(m != nullptr); return; }
    dllm__pool pool(2);
    const dllm__config &c = m->cfg;
    for (int p : {DLLM_PRECISION_SOLOQ_N, DLLM_PRECISION_SOLOQ_C, DLLM_PRECISION_RTN_W4A4}) {
        dllm__soloq_options o;
        CHECK(dllm__soloq_options_for(p, p == DLLM_PRECISION_SOLOQ_N, DLLM_SOLOQ_ROTATION_DEFAULT, -1, o) == DLLM_OK);
        std::shared_ptr<const dllm__soloq_layer> head;
        std::vector<dllm__fp8_layer> layers = dllm__cpu_soloq_weights(*m, pool, o, head);
        CHECK(layers.size() == (size_t)c.n_layer && (head != nullptr) == (p == DLLM_PRECISION_SOLOQ_N));
        size_t bytes = 0, weights = 0, want = 0;
        for (const dllm__fp8_layer &l : layers) {
            CHECK(l.soloq && l.qkv.empty() && l.gu.empty());
            const dllm__soloq_linear &qkv = l.soloq->lin[DLLM__SOLOQ_QKV], &down = l.soloq->lin[DLLM__SOLOQ_DOWN];
            CHECK(qkv.w.rows == (c.n_head + 2 * c.n_head_kv) * c.head_dim && qkv.w.cols == c.n_embd &&
                  down.w.cols == c.n_ff && down.rot->d == c.n_ff);
            for (int s = 0; s < DLLM__SOLOQ_HEAD; s++) {
                const dllm__q4_rows &w = l.soloq->lin[s].w;
                weights += (size_t)w.rows * w.cols;
                want += (size_t)w.rows * (w.cols / 2 + (p == DLLM_PRECISION_SOLOQ_N ? w.blocks() : 0) +
                                          4);  // codes, UE4M3 per 16, FP32 row scale
            }
            bytes += dllm__soloq_bytes(*l.soloq);
        }
        const double bits = 8.0 * bytes / weights;
        printf("    %s: %zu weights in %zu bytes, %.3f bits a weight\n", dllm__precision_name(p), weights, bytes, bits);
        CHECK(bytes == want && bits >= (p == DLLM_PRECISION_SOLOQ_N ? 4.5 : 4.0) && bits < 5.0);
    }
    dllm_model_free(m);
}

/* Every quantised precision changes the logits (a path that quantises nothing cannot pass) and stays close to them. */
TEST(soloq, every_precision_changes_the_logits) {
    for (const char *fx : {"tiny-llada", "tiny-dream"}) {
        dllm_model *m = test_load(test_data(fx));
        if (!m) { CHECK(m != nullptr); continue; }
        const std::vector<int32_t> ids = test_golden_inputs(test_data(fx))[0].ids;
        const int n = (int)ids.size(), V = m->cfg.n_vocab;
        dllm_ctx *exact = test_ctx(m);
        std::vector<float> ref((size_t)n * V);
        CHECK(exact && dllm_logits(exact, ids.data(), n, 0, n, ref.data(), ref.size()) == DLLM_OK);
        for (int p = DLLM_PRECISION_SOLOQ_N; p <= DLLM_PRECISION_RTN_W4A16; p++)
            for (int head : {0, 1}) {
                if (head && p != DLLM_PRECISION_SOLOQ_N) continue;
                dllm_ctx_params cp = dllm_ctx_default_params();
                cp.backend = DLLM_BACKEND_CPU, cp.n_threads = 2, cp.precision = (dllm_precision)p,
                cp.quantize_lm_head = head;
                dllm_ctx *ctx = nullptr;
                CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
                std::vector<float> got((size_t)n * V, NAN);
                CHECK(ctx && dllm_logits(ctx, ids.data(), n, 0, n, got.data(), got.size()) == DLLM_OK);
                const double nmse = test_nmse(got.data(), ref.data(), got.size());
                printf("    %s %s%s: logits NMSE %.2e\n", fx, dllm__precision_name(p), head ? " + LM head" : "", nmse);
                CHECK_MSG(nmse > 1e-7 && nmse < 0.5, "%s %s: logits NMSE %.3e", fx, dllm__precision_name(p), nmse);
                dllm_ctx_free(ctx);
            }
        dllm_ctx_free(exact);
        dllm_model_free(m);
    }
}

/* LaCache's and the K/V cache's premise under SoloQ: a row's output depends on that row only, so a forward over a
 * subset of the rows, reading the other rows' K/V from a cache the full forward wrote, gives the same logits, bit for
 * bit (per-token activation scales; a per-tensor scale would fail this). */
TEST(soloq, forward_rows_are_independent_with_a_kv_cache) {
    dllm_model *m = test_load(test_data("tiny-dream"));
    if (!m) { CHECK(m != nullptr); return; }
    const dllm__config &c = m->cfg;
    const std::vector<int32_t> ids = test_golden_inputs(test_data("tiny-dream"))[0].ids;
    const int n = (int)ids.size(), V = c.n_vocab, q0 = n / 3, q1 = n / 3 + 5;
    dllm__pool pool(2);
    for (int p : {DLLM_PRECISION_SOLOQ_N, DLLM_PRECISION_SOLOQ_I, DLLM_PRECISION_SOLOQ_C, DLLM_PRECISION_RTN_W4A4}) {
        dllm__soloq_options o;
        CHECK(dllm__soloq_options_for(p, 1, DLLM_SOLOQ_ROTATION_DEFAULT, -1, o) == DLLM_OK);
        std::shared_ptr<const dllm__soloq_layer> head;
        const std::vector<dllm__fp8_layer> q = dllm__cpu_soloq_weights(*m, pool, o, head);
        std::vector<float> cos_t, sin_t;
        dllm__rope_tables(c.rope_theta, c.head_dim, n, cos_t, sin_t);
        dllm__cpu_buffers b;
        dllm__cpu_kv kv;
        kv.n = n;
        kv.k.assign((size_t)c.n_layer * n * c.n_head_kv * c.head_dim, 0.0f);
        kv.v = kv.k;
        dllm__cpu_rows all;
        all.kv = &kv;
        std::vector<float> full((size_t)n * V, NAN), part((size_t)(q1 - q0) * V, NAN);
        dllm__cpu_forward(*m, pool, b, ids.data(), n, all, nullptr, cos_t.data(), sin_t.data(), 0, n, full.data(), q,
                          head.get());
        dllm__cpu_rows some;
        some.q0 = q0, some.q1 = q1, some.kv = &kv;
        dllm__cpu_forward(*m, pool, b, ids.data(), n, some, nullptr, cos_t.data(), sin_t.data(), q0, q1, part.data(), q,
                          head.get());
        CHECK_MSG(!memcmp(part.data(), &full[(size_t)q0 * V], part.size() * sizeof(float)), "%s: rows [%d, %d) differ",
                  dllm__precision_name(p), q0, q1);
    }
    dllm_model_free(m);
}

// ---- accuracy figures: per-layer output NMSE, the rotation ablation
// ---------------------------------------------------

/* Per-layer output NMSE (spec 11.7): the exact CPU forward runs layer by layer; at each layer the quantised layer runs
 * on the same input, and the NMSE of what it adds to the residual stream (attention + MLP outputs) is recorded. */
static std::vector<double> test_soloq_layer_nmse(const dllm_model &m, const std::vector<int32_t> &ids,
                                                 const dllm__soloq_options &o) {
    dllm__pool pool(2);
    std::shared_ptr<const dllm__soloq_layer> head;
    const std::vector<dllm__fp8_layer> q = dllm__cpu_soloq_weights(m, pool, o, head);
    test_cpu_layer0 in(m, ids);
    auto &[b, cos_t, sin_t, rows] = in;
    std::vector<double> nmse;
    for (size_t l = 0; l < m.layers.size(); l++) {
        const std::vector<float> h0 = b.h;
        dllm__cpu_layer(m, l, &q[l], pool, b, rows, nullptr, cos_t.data(), sin_t.data());
        std::vector<float> dq = b.h;
        b.h = h0;
        dllm__cpu_layer(m, l, nullptr, pool, b, rows, nullptr, cos_t.data(), sin_t.data());
        for (size_t i = 0; i < h0.size(); i++) dq[i] -= h0[i];
        std::vector<float> dx = b.h;
        for (size_t i = 0; i < h0.size(); i++) dx[i] -= h0[i];
        nmse.push_back(test_nmse(dq.data(), dx.data(), dx.size()));
    }
    return nmse;
}

TEST(soloq, accuracy_layer_output_nmse) {
#if defined(__SANITIZE_ADDRESS__)
    SKIP("accuracy figures: measured by the plain build");
#endif
    struct {
        const char *dir, *name;
    } models[] = {
        {"models/tiny-llada", "tiny-llada"}, {"models/tiny-dream", "tiny-dream"}, {"models/tiny-add", "tiny-add"}};
    struct { int precision, rotation, bc;
    } configs[] = {
        {DLLM_PRECISION_RTN_W4A4, 0, -1},
        {DLLM_PRECISION_SOLOQ_N, DLLM_SOLOQ_ROTATION_HADAMARD, 1},
        {DLLM_PRECISION_SOLOQ_N, DLLM_SOLOQ_ROTATION_RPBH, 1},
        {DLLM_PRECISION_SOLOQ_N, DLLM_SOLOQ_ROTATION_KRPBH, 0},
        {DLLM_PRECISION_SOLOQ_N, DLLM_SOLOQ_ROTATION_KRPBH, 1},
        {DLLM_PRECISION_SOLOQ_I, DLLM_SOLOQ_ROTATION_KRPBH, 1},
        {DLLM_PRECISION_SOLOQ_C, DLLM_SOLOQ_ROTATION_KRPBH, 1},
    };
    for (auto &mi : models) {
        dllm_model *m = test_load(mi.dir);
        if (!m) { CHECK(m != nullptr); continue; }
        std::vector<int32_t> ids;
        if (!strcmp(mi.name, "tiny-add")) {
            for (int i = 0; i < 96; i++) ids.push_back((int32_t)(100 + (i * 37) % 3000));
        } else {
            ids = test_heldout_window(mi.name, m->cfg.mask_id);
        }
        double rtn_worst = 0, krpbh_worst = 0;
        for (auto &cf : configs) {
            dllm__soloq_options o;
            CHECK(dllm__soloq_options_for(cf.precision, 0, cf.rotation, cf.bc, o) == DLLM_OK);
            const std::vector<double> nmse = test_soloq_layer_nmse(*m, ids, o);
            const double worst = *std::max_element(nmse.begin(), nmse.end());
            printf("    %s %-8s %-8s bc %s: layer output NMSE %s(worst %.2e)\n", mi.name,
                   dllm__precision_name(cf.precision), dllm__rot_names[o.rotation], o.bias_correction ? "on " : "off",
                   test_join(nmse, "%.2e").c_str(), worst);
            CHECK(worst == worst && worst > 0);
            if (cf.precision == DLLM_PRECISION_RTN_W4A4) rtn_worst = worst;
            if (cf.precision == DLLM_PRECISION_SOLOQ_N && o.rotation == DLLM__ROT_KRPBH && o.bias_correction)
                krpbh_worst = worst;
        }
        CHECK_MSG(krpbh_worst < rtn_worst, "%s: K-RPBH's worst layer %.3e is not below RTN's %.3e", mi.name,
                  krpbh_worst, rtn_worst);
        dllm_model_free(m);
    }
}

/* [folded variant] The paper's appendix D.3 / spec soloq.md 3.1 Mode B, measured layer by layer beside the online
 * Mode A: the RMSNorm gains folded into the linears that read them (W <- W diag(g), g <- 1) and one residual rotation
 * R1 (K-RPBH on d, shared by every layer) folded into the residual's readers
 * (Q, K, V, gate, up: rows rotated, no online rotation at sites 1 and 3) and writers (O, down: W <- R1 W); sites 2
 * (O's input) and 4 (down's input, behind SwiGLU) keep their online K-RPBH. The residual stream is then stored rotated
 * (R1 h), so a layer's output is compared with R1 times the exact one (NMSE is rotation invariant). An ablation of the
 * CPU reference: the product runs Mode A. */
static float *test_f32_tensor(std::vector<float> &data, int rows, int cols, dllm__tensor &t) {
    t.dtype = DLLM__F32, t.shape = {rows, cols}, t.numel = (int64_t)rows * cols, t.nbytes = data.size() * 4,
    t.data = (const uint8_t *)data.data();
    return data.data();
}

/* W [rows][cols] as fp32, times diag(gain) when gain is given (folding a norm's gain into a reader). */
static std::vector<float> test_weight_f32(const dllm__tensor &w, const std::vector<float> *gain) {
    const int rows = (int)w.shape[0], cols = (int)w.shape[1];
    std::vector<float> out((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            out[(size_t)r * cols + c] = dllm__tensor_at(w, (int64_t)r * cols + c) * (gain ? (*gain)[(size_t)c] : 1.0f);
    return out;
}

/* R1 W for a writer W [rows = d][cols]: every column rotated. */
static std::vector<float> test_rotate_columns(const dllm__rotation &r1, const std::vector<float> &w, int rows,
                                              int cols) {
    std::vector<float> out(w.size()), col((size_t)rows), rc((size_t)rows);
    for (int c = 0; c < cols; c++) {
        for (int r = 0; r < rows; r++) col[(size_t)r] = w[(size_t)r * cols + c];
        dllm__rotate(r1, col.data(), rc.data());
        for (int r = 0; r < rows; r++) out[(size_t)r * cols + c] = rc[(size_t)r];
    }
    return out;
}

/* Layer l's SoloQ linears in Mode B (see above), for the options o. */
static dllm__soloq_layer test_folded_layer(const dllm_model &m, size_t l, dllm__pool &pool,
                                           const dllm__soloq_options &o, std::shared_ptr<const dllm__rotation> r1) {
    const dllm__config &c = m.cfg;
    const dllm__layer_weights &L = m.layers[l];
    const int qd = c.n_head * c.head_dim, kvd = c.n_head_kv * c.head_dim;
    const std::shared_ptr<const dllm__rotation> none =
        std::make_shared<const dllm__rotation>(dllm__make_rotation(DLLM__ROT_NONE, c.n_embd, 0, 0));
    std::vector<float> wq = test_weight_f32(*L.wq, &L.attn_norm), wk = test_weight_f32(*L.wk, &L.attn_norm),
                       wv = test_weight_f32(*L.wv, &L.attn_norm);
    std::vector<float> wg = test_weight_f32(*L.gate, &L.ffn_norm), wu = test_weight_f32(*L.up, &L.ffn_norm);
    std::vector<float> wo = test_rotate_columns(*r1, test_weight_f32(*L.wo, nullptr), c.n_embd, qd);
    std::vector<float> wd = test_rotate_columns(*r1, test_weight_f32(*L.down, nullptr), c.n_embd, c.n_ff);
    dllm__tensor tq, tk, tv, tg, tu, to, td;
    test_f32_tensor(wq, qd, c.n_embd, tq), test_f32_tensor(wk, kvd, c.n_embd, tk),
        test_f32_tensor(wv, kvd, c.n_embd, tv);
    test_f32_tensor(wg, c.n_ff, c.n_embd, tg), test_f32_tensor(wu, c.n_ff, c.n_embd, tu);
    test_f32_tensor(wo, c.n_embd, qd, to), test_f32_tensor(wd, c.n_embd, c.n_ff, td);
    dllm__soloq_layer q;
    q.opt = o;
    q.lin[DLLM__SOLOQ_QKV] = dllm__soloq_quantize_linear(pool, {&tq, &tk, &tv}, r1, o);  // rows rotated by R1 ...
    q.lin[DLLM__SOLOQ_QKV].rot = none;                                                  // ... and nothing online
    q.lin[DLLM__SOLOQ_GU] = dllm__soloq_quantize_linear(pool, {&tg, &tu}, r1, o);
    q.lin[DLLM__SOLOQ_GU].rot = none;
    q.lin[DLLM__SOLOQ_O] =
        dllm__soloq_quantize_linear(pool, {&to}, dllm__soloq_site_rotation(o, l, DLLM__SOLOQ_O, qd), o);
    q.lin[DLLM__SOLOQ_DOWN] =
        dllm__soloq_quantize_linear(pool, {&td}, dllm__soloq_site_rotation(o, l, DLLM__SOLOQ_DOWN, c.n_ff), o);
    return q;
}

/* Per-layer output NMSE of Mode B against the exact layer (the residual rotated by R1 on the way in, the exact output
 * rotated by R1 for the comparison; the norm gains set to 1 while Mode B runs). */
static std::vector<double> test_soloq_folded_nmse(dllm_model &m, const std::vector<int32_t> &ids,
                                                  const dllm__soloq_options &o) {
    const dllm__config &c = m.cfg;
    const int T = (int)ids.size(), d = c.n_embd;
    dllm__pool pool(2);
    const std::shared_ptr<const dllm__rotation> r1 = std::make_shared<const dllm__rotation>(
        dllm__make_rotation(DLLM__ROT_KRPBH, d, o.seed, dllm__soloq_site_id(m.layers.size() + 1, 0)));
    test_cpu_layer0 in(m, ids);
    auto &[b, cos_t, sin_t, rows] = in;
    auto rotate_rows = [&](std::vector<float> &x) {
        std::vector<float> y((size_t)d);
        for (int t = 0; t < T; t++) {
            dllm__rotate(*r1, &x[(size_t)t * d], y.data());
            memcpy(&x[(size_t)t * d], y.data(), sizeof(float) * d);
        }
    };
    std::vector<double> nmse;
    for (size_t l = 0; l < m.layers.size(); l++) {
        const std::vector<float> h0 = b.h;  // the exact stream into layer l
        dllm__cpu_layer(m, l, nullptr, pool, b, rows, nullptr, cos_t.data(), sin_t.data());
        std::vector<float> exact = b.h;  // the exact stream out of it
        dllm__fp8_layer q8;
        q8.soloq = std::make_shared<dllm__soloq_layer>(test_folded_layer(m, l, pool, o, r1));
        std::vector<float> g_attn(m.layers[l].attn_norm.size(), 1.0f), g_ffn(m.layers[l].ffn_norm.size(), 1.0f);
        std::swap(m.layers[l].attn_norm, g_attn), std::swap(m.layers[l].ffn_norm, g_ffn);
        b.h = h0;
        rotate_rows(b.h);
        std::vector<float> in_rot = b.h;
        dllm__cpu_layer(m, l, &q8, pool, b, rows, nullptr, cos_t.data(), sin_t.data());
        std::swap(m.layers[l].attn_norm, g_attn), std::swap(m.layers[l].ffn_norm, g_ffn);
        std::vector<float> want = exact, got = b.h;
        for (size_t i = 0; i < want.size(); i++) want[i] -= h0[i], got[i] -= in_rot[i];
        rotate_rows(want);
        nmse.push_back(test_nmse(got.data(), want.data(), want.size()));
        b.h = exact;
    }
    return nmse;
}

TEST(soloq, accuracy_folded_variant_beside_online) {
#if defined(__SANITIZE_ADDRESS__)
    SKIP("accuracy figures: measured by the plain build");
#endif
    for (const char *name : {"tiny-llada", "tiny-dream"}) {
        dllm_model *m = test_load(std::string("models/") + name);
        if (!m) { CHECK(m != nullptr); continue; }
        const std::vector<int32_t> ids = test_heldout_window(name, m->cfg.mask_id);
        for (int p : {DLLM_PRECISION_SOLOQ_N, DLLM_PRECISION_SOLOQ_I}) {
            dllm__soloq_options o;
            CHECK(dllm__soloq_options_for(p, 0, DLLM_SOLOQ_ROTATION_DEFAULT, -1, o) == DLLM_OK);
            const std::vector<double> online = test_soloq_layer_nmse(*m, ids, o),
                                      folded = test_soloq_folded_nmse(*m, ids, o);
            double mean_on = 0, mean_fold = 0;
            for (size_t l = 0; l < online.size(); l++)
                mean_on += online[l] / online.size(), mean_fold += folded[l] / folded.size();
            printf("    %s %s: layer output NMSE online (Mode A) %s| folded (Mode B) %s| mean %.2e vs %.2e\n", name,
                   dllm__precision_name(p), test_join(online, "%.2e").c_str(), test_join(folded, "%.2e").c_str(),
                   mean_on, mean_fold);
            // a sanity bound, not a claim about which mode wins: both must quantise (> 0) and stay near the exact layer
            for (double v : folded)
                CHECK_MSG(v == v && v > 0 && v < 0.5, "%s %s: folded layer NMSE %.3e", name, dllm__precision_name(p),
                          v);
        }
        dllm_model_free(m);
    }
}

/* The paper's 6.2 ablation: how close the rotated, RMS-normalised coordinates are to N(0, 1). KL(histogram || N(0, 1))
 * over bins of 0.1 on [-8, 8] (the tails in the end bins), less the Miller-Madow estimate of a finite sample's bias
 * ((nonempty bins - 1) / 2N); and the block-energy imbalance: per row, the coefficient of variation of the k block
 * energies of the rotated row, averaged over rows. Both definitions are dllm's: the paper's are not public. Rows
 * x[rows][d]. */
static void test_rotation_stats(const dllm__rotation &r, const std::vector<float> &x, int rows, double &kl,
                                double &imbalance) {
    const int d = r.d, bins = 160;
    std::vector<double> hist(bins, 0.0);
    std::vector<float> y((size_t)d);
    imbalance = 0;
    for (int t = 0; t < rows; t++) {
        dllm__rotate(r, &x[(size_t)t * d], y.data());
        double ss = 0;
        for (float v : y) ss += (double)v * v;
        const double sigma = sqrt(ss / d);
        for (float v : y) hist[(size_t)std::min(bins - 1, std::max(0, (int)floor((v / sigma + 8.0) / 0.1)))] += 1;
        std::vector<double> e((size_t)r.k, 0.0);
        for (int i = 0; i < d; i++) e[(size_t)(i / r.b)] += (double)y[(size_t)i] * y[(size_t)i];
        double mean = 0, var = 0;
        for (double v : e) mean += v / r.k;
        for (double v : e) var += (v - mean) * (v - mean) / r.k;
        imbalance += sqrt(var) / mean / rows;
    }
    kl = 0;
    int nonempty = 0;
    for (int i = 0; i < bins; i++) {
        const double lo = i == 0 ? -INFINITY : -8.0 + 0.1 * i, hi = i == bins - 1 ? INFINITY : -8.0 + 0.1 * (i + 1);
        const double q = 0.5 * (erfc(-hi / sqrt(2.0)) - erfc(-lo / sqrt(2.0))),
                     p = hist[(size_t)i] / ((double)rows * d);
        if (p > 0) kl += p * log(p / std::max(q, 1e-300)), nonempty++;
    }
    kl -= (nonempty - 1) / (2.0 * rows * d);
}

/* Synthetic activations with outlier channels (the spec's 50-100x the median |x|, as real LLMs have): a body of
 * Gaussians with per-token-and-channel scales in [0.5, 1.5), and 8 outlier channels, the same in every token, at
 * scattered positions (as in real LLMs) or in one contiguous cluster (adversarial for a rotation without P). */
static std::vector<float> test_outlier_activations(test_rng &rng, int rows, int d, bool clustered) {
    std::vector<float> x((size_t)rows * d);
    std::vector<int> outliers;
    const int first = rng.below(d - 8);
    for (int i = 0; i < 8; i++) outliers.push_back(clustered ? first + i : rng.below(d));
    for (int t = 0; t < rows; t++) {
        float *xr = &x[(size_t)t * d];
        for (int i = 0; i < d; i++) xr[i] = rng.normal() * (0.5f + rng.uniform());
        for (int c : outliers) xr[c] = (rng.below(2) ? 1.0f : -1.0f) * (50.0f + 50.0f * rng.uniform()) * 0.8f;
    }
    return x;
}

TEST(soloq, rotation_ablation_kl_and_block_energy) {
#if defined(__SANITIZE_ADDRESS__)
    SKIP("accuracy figures: measured by the plain build");
#endif
    test_rng rng("soloq ablation");
    // one draw of 8 outlier channels and one rotation decide a lot: averages over 8 draws of both
    for (bool clustered : {false, true})
        for (int d : {4096, 3584, 640}) {
            const int rows = 48, trials = 8;
            double kl[3] = {0, 0, 0}, imb[3] = {0, 0, 0};
            const dllm__rot_kind kinds[3] = {DLLM__ROT_RPBH, DLLM__ROT_MIXER, DLLM__ROT_KRPBH};
            for (int trial = 0; trial < trials; trial++) {
                const std::vector<float> x = test_outlier_activations(rng, rows, d, clustered);
                const uint64_t seed = rng.next();
                for (int i = 0; i < 3; i++) {
                    double k1, i1;
                    test_rotation_stats(dllm__make_rotation(kinds[i], d, seed, 1), x, rows, k1, i1);
                    kl[i] += k1 / trials, imb[i] += i1 / trials;
                }
            }
            printf(
                "    synthetic d=%d (b %d, k %d), 8 %s outlier channels at 40-80x the median, mean of 8 draws: KL "
                "permutation only %.5f, mixer only %.5f, both %.5f; "
                "block-energy imbalance %.1f%% / %.1f%% / %.1f%%\n",
                d, dllm__krpbh_block(d), d / dllm__krpbh_block(d), clustered ? "clustered" : "scattered", kl[0], kl[1],
                kl[2], 100 * imb[0], 100 * imb[1], 100 * imb[2]);
            // what holds on every seed tried: each component beats the other where that one is weak; both beats
            // permutation only always, and mixer only where outliers cluster (with scattered ones the two tie:
            // BENCHMARKS.md)
            CHECK_MSG(kl[2] < kl[0], "d %d: K-RPBH's KL is not below permutation only's", d);
            if (clustered)
                CHECK_MSG(kl[2] < kl[1], "d %d, clustered outliers: K-RPBH's KL is not below mixer only's", d);
            else
                CHECK_MSG(kl[1] < kl[0], "d %d, scattered outliers: mixer only's KL is not below permutation only's",
                          d);
        }
    // activations captured from the tiny models: the inputs of every down projection (the site with the outliers)
    for (const char *name : {"tiny-llada", "tiny-dream"}) {
        dllm_model *m = test_load(std::string("models/") + name);
        if (!m) { CHECK(m != nullptr); continue; }
        const dllm__config &c = m->cfg;
        const std::vector<int32_t> ids = test_heldout_window(name, c.mask_id);
        const int T = (int)ids.size();
        dllm__pool pool(2);
        test_cpu_layer0 in(*m, ids);
        auto &[b, cos_t, sin_t, rows] = in;
        std::vector<float> captured;
        for (size_t l = 0; l < m->layers.size(); l++) {
            dllm__cpu_attention_block(*m, l, nullptr, pool, b, rows, nullptr, cos_t.data(), sin_t.data());
            dllm__cpu_rmsnorm(b.h.data(), T, c.n_embd, m->layers[l].ffn_norm.data(), c.norm_eps, b.a.data());
            dllm__cpu_ffn(*m, m->layers[l], nullptr, pool, b, T);  // leaves silu(gate) * up in b.gate
            captured.insert(captured.end(), b.gate.begin(), b.gate.begin() + (size_t)T * c.n_ff);
            for (size_t i = 0; i < (size_t)T * c.n_embd; i++) b.h[i] += b.tmp[i];
        }
        const int n_rows = (int)(captured.size() / c.n_ff);
        double kl[3], imb[3];
        const dllm__rot_kind kinds[3] = {DLLM__ROT_RPBH, DLLM__ROT_MIXER, DLLM__ROT_KRPBH};
        for (int i = 0; i < 3; i++)
            test_rotation_stats(dllm__make_rotation(kinds[i], c.n_ff, 99, 1), captured, n_rows, kl[i], imb[i]);
        printf(
            "    %s down_proj inputs (d %d, b %d, k %d, %d rows): KL permutation only %.5f, mixer only %.5f, both "
            "%.5f; "
            "block-energy imbalance %.1f%% / %.1f%% / %.1f%%\n",
            name, c.n_ff, dllm__krpbh_block(c.n_ff), c.n_ff / dllm__krpbh_block(c.n_ff), n_rows, kl[0], kl[1], kl[2],
            100 * imb[0], 100 * imb[1], 100 * imb[2]);
        CHECK(kl[2] == kl[2] && kl[2] < kl[0]);
        dllm_model_free(m);
    }
}
