/* Tests: [W4 GEMM] q4wg, SoloQ's 4-bit GEMMs on Hopper's wgmma (src/kernels/q4_wgmma.cuh, src/gpu/q4_wgmma.cpp): the
 * integer path's widening and layout and SoloQ-N's dequantisation and layout on the CPU, the kernels against
 * dllm__cpu_i8_gemm / dllm__cpu_q4_gemm and the layout twins on an sm_90a GPU, and forwards on q4wg against the same
 * forwards on the other 4-bit paths. */

/* The widening's claim (q4wg_hi / q4wg_lo in the kernel): a nibble moved into a byte's high half and read as s8 is 16
 * q, and ORing in 8 makes it 8 (2q + 1): SoloQ-I's C value times 8, RTN's q times 16, for every byte. */
TEST(q4wg, widening_gives_eight_or_sixteen_times_the_c_value) {
    int checked = 0;
    for (int byte = 0; byte < 256; byte++)
        for (dllm__q4_format f : {DLLM__Q4_INT4, DLLM__Q4_RTN}) {
            const uint32_t fill = f == DLLM__Q4_INT4 ? 0x08u : 0u, scale = f == DLLM__Q4_INT4 ? 8 : 16;
            const int8_t hi = (int8_t)((byte & 0xF0u) | fill), lo = (int8_t)(((byte << 4) & 0xF0u) | fill);
            const uint8_t packed[1] = {(uint8_t)byte};
            const float c_lo = dllm__q4_value(f, packed, nullptr, 0), c_hi = dllm__q4_value(f, packed, nullptr, 1);
            CHECK_MSG(lo == (int)(scale * c_lo) && hi == (int)(scale * c_hi),
                      "byte 0x%02x, format %s: %d %d, want %g %g", byte, dllm__q4_names[f], lo, hi, scale * c_lo,
                      scale * c_hi);
            checked++;
        }
    CHECK(checked == 512);
}

/* dllm__q4wg_prepack moves every nibble of the canonical rows to exactly one place, the one the kernel's A fragment
 * reads it from: each canonical nibble alone set to a distinct value appears once, at the byte and half the layout
 * (the PTX ISA's 8-bit A fragment: register v1 + 2 v2, byte v0 = row 16 warp + lane / 4 + 8 v1, k 4 (lane % 4) + v0
 * + 16 v2) names. */
TEST(q4wg, prepack_moves_every_nibble_to_its_fragment_place) {
    const int n = 128, k = 256, bytes = n * k / 2;
    std::vector<uint8_t> rows((size_t)bytes), packed((size_t)bytes);
    int wrong = 0, tried = 0;
    for (int at_nk = 0; at_nk < n * k; at_nk += 37) {  // a spread of positions over both tiles, both k blocks
        const int row = at_nk / k, kk = at_nk % k;
        tried++;
        std::fill(rows.begin(), rows.end(), 0);
        const int value = 1 + (row * 7 + kk) % 15;
        rows[(size_t)row * (k / 2) + kk / 2] = (uint8_t)(value << (4 * (kk & 1)));
        dllm__q4wg_prepack(rows.data(), n, k, packed.data());
        // where the fragment puts (row, kk): tile, k block, step s, thread (warp, lane), register, byte
        const int tile = row / 64, r = row % 64, warp = r / 16, g = r % 8, v1 = (r % 16) / 8;
        const int kb = kk / 128, s = (kk % 128) / 32, kin = kk % 32, t = (kin % 16) / 4, v0 = kin % 4, v2 = kin / 16;
        const int lane = 4 * g + t, j = 2 * (s % 2) + v1, h = s / 2;
        const size_t at =
            ((size_t)tile * (k / 128) + kb) * 4096 + (size_t)(h * 128 + 32 * warp + lane) * 16 + j * 4 + v0;
        int nonzero = 0;
        for (int i = 0; i < bytes; i++)
            nonzero += (packed[(size_t)i] & 15) != 0, nonzero += (packed[(size_t)i] >> 4) != 0;
        wrong += nonzero != 1 || (packed[at] >> (4 * v2) & 15) != value;
    }
    CHECK_MSG(wrong == 0 && tried > 800, "%d of %d nibbles not where the A fragment reads them", wrong, tried);
}

/* Weights q4wg takes: integer and NVFP4 formats, whole 128-row tiles, K in 512s (LLaDA-8B's every layer linear; not
 * the tiny models', which keep the other paths); NVFP4 at most 1024 tiles (its counters' fixed place). */
TEST(q4wg, takes_integer_and_nvfp4_formats_of_whole_tiles) {
    CHECK(dllm__q4wg_takes(DLLM__Q4_INT4, 12288, 4096) && dllm__q4wg_takes(DLLM__Q4_RTN, 4096, 12288) &&
          dllm__q4wg_takes(DLLM__Q4_NVFP4, 4096, 12288));
    CHECK(!dllm__q4wg_takes(DLLM__Q4_E8P, 4096, 4096) && !dllm__q4wg_takes(DLLM__Q4_LLOYD, 4096, 4096));
    CHECK(!dllm__q4wg_takes(DLLM__Q4_INT4, 4096 + 64, 4096) && !dllm__q4wg_takes(DLLM__Q4_INT4, 4096, 4096 + 128) &&
          !dllm__q4wg_takes(DLLM__Q4_INT4, 768, 256) && !dllm__q4wg_takes(DLLM__Q4_NVFP4, 4096, 4096 + 128));
    CHECK(dllm__q4wg_takes(DLLM__Q4_NVFP4, 128 * 1024, 4096) && !dllm__q4wg_takes(DLLM__Q4_NVFP4, 128 * 1025, 4096));
    CHECK(dllm__q4wg_workspace_ints(4096) == (size_t)4096 * 256 + 32);
}

/* SoloQ-N's K chunks depend on the weight's shape only: LLaDA-8B's QKV 2, O 8, gate|up 1, down 6 (the fewest whole
 * 512-wide chunks giving 132 (tile, chunk) units); the workspace holds the counters and the partials of the
 * configuration the rows take. */
TEST(q4wg, nvfp4_chunks_depend_on_the_shape_only) {
    CHECK(dllm__q4wg_nv_ksplit(12288, 4096) == 2 && dllm__q4wg_nv_ksplit(4096, 4096) == 8 &&
          dllm__q4wg_nv_ksplit(24576, 4096) == 1 && dllm__q4wg_nv_ksplit(4096, 12288) == 6);
    for (int n : {128, 384, 4096, 24576})
        for (int k : {512, 1536, 4096, 12288}) {
            const int ks = dllm__q4wg_nv_ksplit(n, k);
            CHECK_MSG(ks >= 1 && (k / 128) % ks == 0 && (k / 128 / ks) % 4 == 0, "%d x %d: %d chunks", n, k, ks);
        }
    CHECK(dllm__q4wg_nv_workspace_ints(24576, 4096, 256) == 1024);  // one chunk: no partials
    CHECK(dllm__q4wg_nv_workspace_ints(4096, 4096, 20) == 1024 + (size_t)32 * 8 * 32 * 128);
    CHECK(dllm__q4wg_nv_workspace_ints(4096, 4096, 1000) == 1024 + (size_t)32 * 8 * 256 * 128);
}

/* bf16 a times b with the product exact in bf16 and not subnormal unless zero (HMUL2.BF16 on q4wg_gemm_nv's operands);
 * *inexact counts the products that are not. */
static uint16_t test_bf16_mul_exact(uint16_t a, uint16_t b, int *inexact) {
    const double p = (double)dllm__bf16_to_f32(a) * (double)dllm__bf16_to_f32(b);
    const float f = (float)p;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((double)f != p || (bits & 0xFFFF) || (f != 0 && fabsf(f) < FLT_MIN)) (*inexact)++;
    return (uint16_t)(bits >> 16);
}

/* q4wg_gemm_nv's dequantisation, emulated on the host twin's layout: every e2m1 code times every UE4M3 scale byte
 * (NaN bytes aside: zero, subnormal, negative included), through the kernel's bit operations (q4wg_nv_step,
 * q4wg_nv_scale, the bf16 multiplies), lands as C_w 2^-20 exactly (dllm__q4_value) on the element the PTX bf16 A
 * fragment gives each register half (register j, half hf = row 16 warp + lane / 4 + 8 (j % 2), k 2 (lane % 4) + 8 (j /
 * 2) + hf of the k16 step): a check of the layout and of the bit tricks, every weight visited once. */
TEST(q4wg, nvfp4_dequantisation_is_exact_for_every_code_and_scale) {
    const int n = 128, k = 2048, nb = k / 16, kb_count = k / 128;
    std::vector<uint8_t> rows((size_t)n * k / 2, 0), bs((size_t)n * nb), packed((size_t)n * k * 9 / 16);
    for (int r = 0; r < n; r++)
        for (int b = 0; b < nb; b++) {
            uint8_t sc = (uint8_t)((r * 128 + b) % 256);  // every byte in some block
            if ((sc & 0x7F) == 0x7F) sc = 0;
            bs[(size_t)r * nb + b] = sc;
            for (int i = 0; i < 16; i++) {  // every code in every block
                const int kk = 16 * b + i, c = (i + b) & 15;
                rows[(size_t)r * k / 2 + kk / 2] |= (uint8_t)(c << (4 * (kk & 1)));
            }
        }
    CHECK(dllm__q4wg_prepack_nv(rows.data(), bs.data(), n, k, packed.data()) == 0);
    auto rotl = [](uint32_t x, int s) { return x << s | x >> (32 - s); };
    long long bad = 0, checked = 0;
    int inexact = 0;
    for (int tile = 0; tile < n / 64; tile++)
        for (int kb = 0; kb < kb_count; kb++) {
            const uint8_t *blk = packed.data() + ((size_t)tile * kb_count + kb) * 4608;
            for (int thread = 0; thread < 128; thread++)
                for (int s = 0; s < 8; s++) {
                    uint32_t x, w;
                    memcpy(&x, blk + ((s >> 2) * 128 + thread) * 16 + (s & 3) * 4, 4);
                    memcpy(&w, blk + 4096 + (thread >> 2) * 16 + (s >> 1) * 4, 4);
                    if (s & 1) w = rotl(w, 8);
                    const uint32_t sp = (w & 0x0FF00FF0u) | 0x70007000u, S = 0x81C081C0u;
                    const uint32_t reg[4] = {x & S, rotl(x, 10) & S, rotl(x, 13) & S,
                                             ((x & 0x001B001Bu) * 0x1084u) & S};
                    const int warp = thread >> 5, lane = thread & 31;
                    for (int j = 0; j < 4; j++)
                        for (int hf = 0; hf < 2; hf++) {
                            const uint16_t scale = (uint16_t)(j & 1 ? sp >> 16 : sp & 0xFFFF);  // .H0_H0 / .H1_H1
                            const float got = dllm__bf16_to_f32(
                                test_bf16_mul_exact((uint16_t)(reg[j] >> (16 * hf)), scale, &inexact));
                            const int row = 64 * tile + 16 * warp + lane / 4 + 8 * (j & 1);
                            const int kk = 128 * kb + 16 * s + 2 * (lane % 4) + 8 * (j >> 1) + hf;
                            const float want = ldexpf(dllm__q4_value(DLLM__Q4_NVFP4, rows.data() + (size_t)row * k / 2,
                                                                     bs.data() + (size_t)row * nb, kk),
                                                      -20);
                            checked++;
                            if (got != want && bad++ < 5)
                                printf("    row %d k %d scale 0x%02x: got %g, want %g\n", row, kk,
                                       bs[(size_t)row * nb + kk / 16], got, want);
                        }
                }
        }
    CHECK_MSG(bad == 0 && inexact == 0 && checked == (long long)n * k,
              "%lld of %lld weights wrong, %d inexact bf16 products", bad, checked, inexact);
    // The code word's 32 bits feed the four registers' 32 value bits once each.
    uint32_t seen = 0;
    for (int j = 0; j < 4; j++)
        for (int q = 0; q < 8; q++) {
            CHECK(!(seen >> dllm__q4wg_nv_src[j][q] & 1));
            seen |= 1u << dllm__q4wg_nv_src[j][q];
        }
    CHECK(seen == 0xFFFFFFFFu);
    // NaN scales are counted, once each.
    bs[5] = 0x7F, bs[(size_t)77 * nb + 3] = 0xFF;
    CHECK(dllm__q4wg_prepack_nv(rows.data(), bs.data(), n, k, packed.data()) == 2);
}

// ---- on an sm_90a GPU --------------------------------------------------------------------------------------------

/* The q4wg kernels of the current GPU, or a skip where it is not sm_90a. */
#define NEED_Q4WG(k)                                                                                                   \
    NEED_GPU();                                                                                                        \
    dllm__q4wg_kernels k;                                                                                              \
    {                                                                                                                  \
        cudaDeviceProp p;                                                                                              \
        cudaGetDeviceProperties(&p, 0);                                                                                \
        if (p.major * 10 + p.minor != 90) SKIP("q4wg needs sm_90a");                                                   \
        CHECK_STATUS(dllm__q4wg_load(dllm__arch_for(90), k), DLLM_OK, nullptr);                                        \
        if (!k.module) return;                                                                                         \
    }

/* The device prepack against its twin, on random codes of two shapes. */
TEST(gpu_q4wg, prepack_kernel_matches_its_twin) {
    NEED_Q4WG(k);
    test_rng rng("q4wg prepack");
    for (auto nk : {std::make_pair(128, 512), std::make_pair(384, 1664)}) {
        dllm__linear W;
        W.format = DLLM__W_Q4, W.n = nk.first, W.k = nk.second, W.q4.reset(new dllm__q4_site);
        std::vector<uint8_t> rows((size_t)W.n * W.k / 2), want(rows.size());
        for (uint8_t &b : rows) b = (uint8_t)rng.next();
        test_put(W.data, rows);
        CHECK_STATUS(dllm__q4wg_pack(k, W, nullptr), DLLM_OK, nullptr);
        dllm__q4wg_prepack(rows.data(), W.n, W.k, want.data());
        CHECK_MSG(W.q4->packed && test_get<uint8_t>(W.data, want.size()) == want, "%d x %d: the packed bytes differ",
                  W.n, W.k);
    }
}

/* q4wg_gemm equals dllm__cpu_i8_gemm bit for bit (rounded to bf16 as the epilogue rounds) for either format, at token
 * counts across every configuration and past 256 (300 and 520: two and three chunks of whole tiles), on random codes,
 * C values and scales; outputs poisoned first; the workspace is zero again after every call. */
TEST(gpu_q4wg, gemm_matches_cpu_i8_gemm) {
    NEED_Q4WG(k);
    test_rng rng("q4wg gemm");
    auto scale = [&] { return 0.01f + 2 * rng.uniform(); };
    for (auto nk : {std::make_pair(128, 512), std::make_pair(384, 1536)})
        for (dllm__q4_format f : {DLLM__Q4_INT4, DLLM__Q4_RTN}) {
            const int N = nk.first, K = nk.second, Mmax = 520;
            std::vector<uint8_t> rows((size_t)N * K / 2), packed(rows.size());
            for (uint8_t &b : rows) b = (uint8_t)rng.next();
            dllm__q4wg_prepack(rows.data(), N, K, packed.data());
            std::vector<int8_t> w8((size_t)N * K), x8((size_t)Mmax * K);
            for (int n = 0; n < N; n++)
                for (int kk = 0; kk < K; kk++)
                    w8[(size_t)n * K + kk] = (int8_t)dllm__q4_value(f, rows.data() + (size_t)n * K / 2, nullptr, kk);
            for (int8_t &v : x8)
                v = f == DLLM__Q4_INT4 ? (int8_t)(2 * rng.below(16) - 15) : (int8_t)(rng.below(16) - 8);
            std::vector<float> s_x((size_t)Mmax), s_w((size_t)N);
            for (float &v : s_x) v = scale() * (rng.below(2) ? 1 : -1);
            for (float &v : s_w) v = scale();
            dllm__dbuf dw, dx, dsx, dsw, dy, ws;
            test_put(dw, packed), test_put(dx, x8), test_put(dsx, s_x), test_put(dsw, s_w);
            const size_t ws_ints = dllm__q4wg_workspace_ints(N);
            ws.fit(ws_ints * 4, "test");
            cudaMemset(ws.ptr, 0, ws_ints * 4);
            for (int M : {1, 13, 32, 33, 64, 65, 128, 129, 200, 256, 300, 520}) {
                std::vector<float> want((size_t)M * N);
                dllm__cpu_i8_gemm(x8.data(), K, w8.data(), s_x.data(), s_w.data(), want.data(), N, M, N, K);
                test_poison(dy, (size_t)M * N * 2);
                CHECK_STATUS(dllm__q4wg_gemm_run(k, f, dw.ptr, dsw.as<float>(), dx.as<signed char>(), dsx.as<float>(),
                                                 dy.as<bf16_t>(), M, N, K, ws.as<int>(), ws_ints, nullptr),
                             DLLM_OK, nullptr);
                const std::vector<uint16_t> got = test_get<uint16_t>(dy, (size_t)M * N);
                int bad = 0;
                for (size_t i = 0; i < want.size(); i++) bad += got[i] != dllm__f32_to_bf16(want[i]);
                CHECK_MSG(bad == 0, "%s N %d K %d M %d: %d of %zu outputs differ from dllm__cpu_i8_gemm",
                          dllm__q4_names[f], N, K, M, bad, want.size());
                const std::vector<int> left = test_get<int>(ws, ws_ints);
                CHECK_MSG(std::all_of(left.begin(), left.end(), [](int v) { return v == 0; }),
                          "%s M %d: the workspace is not zero", dllm__q4_names[f], M);
            }
            printf("    %s %d x %d: M = 1 to 520 exact\n", dllm__q4_names[f], N, K);
        }
}

/* Random NVFP4 block scales for q4wg_gemm_nv's tests: 1/32 zero, 1/16 subnormal, a quarter negative (bit 7), never
 * NaN. */
static uint8_t test_nv_scale(test_rng &rng) {
    const int kind = rng.below(32);
    uint8_t c = kind == 0 ? 0 : kind <= 2 ? (uint8_t)(1 + rng.below(7)) : (uint8_t)(8 + rng.below(119));
    if (rng.below(4) == 0) c |= 0x80;
    return (c & 0x7F) == 0x7F ? 0x7E : c;
}

/* The device prepack of NVFP4 weights against its twin (zero, subnormal and negative scale bytes), the block scales
 * folded into the layout (freed); a NaN scale is refused with a message that says so. */
TEST(gpu_q4wg, prepack_nv_kernel_matches_its_twin) {
    NEED_Q4WG(k);
    test_rng rng("q4wg prepack nv");
    for (auto nk : {std::make_pair(128, 512), std::make_pair(384, 1664)})
        for (int nan = 0; nan < 2; nan++) {
            dllm__linear W;
            W.format = DLLM__W_Q4, W.n = nk.first, W.k = nk.second, W.q4.reset(new dllm__q4_site);
            W.q4->format = DLLM__Q4_NVFP4;
            std::vector<uint8_t> rows((size_t)W.n * W.k / 2), bs((size_t)W.n * W.k / 16),
                want((size_t)W.n * W.k * 9 / 16);
            for (uint8_t &b : rows) b = (uint8_t)rng.next();
            for (uint8_t &b : bs) b = test_nv_scale(rng);
            if (nan) bs[(size_t)rng.below((int)bs.size())] = 0xFF;
            test_put(W.data, rows), test_put(W.q4->block_scales, bs);
            if (nan) {
                CHECK_STATUS(dllm__q4wg_pack(k, W, nullptr), DLLM_ERR_INVALID_ARGUMENT, "NaN block scales");
                continue;
            }
            CHECK_STATUS(dllm__q4wg_pack(k, W, nullptr), DLLM_OK, nullptr);
            CHECK(dllm__q4wg_prepack_nv(rows.data(), bs.data(), W.n, W.k, want.data()) == 0);
            CHECK_MSG(W.q4->packed && !W.q4->block_scales.ptr && test_get<uint8_t>(W.data, want.size()) == want,
                      "%d x %d: the packed bytes differ", W.n, W.k);
        }
}

/* q4wg_gemm_nv against dllm__cpu_q4_gemm (NVFP4) on fresh random weights, block scales (zero, subnormal, negative) and
 * NVFP4 token C values, at shapes of one, three and eight K chunks a tile: within the fp32 reordering (1e-5 of the sum
 * of |terms|) and one bf16 rounding, outputs poisoned first; and bit for bit the same at every M (1 to 520: every
 * configuration, and past 256 rows the K chunks folded in registers) for the same rows, with the rows reversed, and on a
 * rerun; the tile counters zero after every call. */
TEST(gpu_q4wg, gemm_nv_matches_cpu_q4_gemm_and_keeps_rows_independent) {
    NEED_Q4WG(k);
    test_rng rng("q4wg gemm nv");
    for (auto nk : {std::make_pair(128, 512), std::make_pair(384, 1536), std::make_pair(256, 4096)}) {
        const int N = nk.first, K = nk.second, Mmax = 520, nb = K / 16;
        std::vector<uint8_t> rows((size_t)N * K / 2), bs((size_t)N * nb), packed((size_t)N * K * 9 / 16);
        for (uint8_t &b : rows) b = (uint8_t)rng.next();
        for (uint8_t &b : bs) b = test_nv_scale(rng);
        CHECK(dllm__q4wg_prepack_nv(rows.data(), bs.data(), N, K, packed.data()) == 0);
        std::vector<float> xf((size_t)Mmax * K), xf_rev(xf.size()), s_x((size_t)Mmax), s_x_rev(s_x.size()),
            s_w((size_t)N);
        std::vector<uint16_t> xb(xf.size()), xb_rev(xf.size());
        for (size_t i = 0; i < xf.size(); i++) {  // e2m1 x UE4M3: exact in bf16
            const uint8_t code[1] = {(uint8_t)rng.below(16)}, scale[1] = {(uint8_t)(rng.below(127) & 0x7F)};
            xf[i] = dllm__q4_value(DLLM__Q4_NVFP4, code, scale, 0);
            xb[i] = dllm__f32_to_bf16(xf[i]);
            CHECK(dllm__bf16_to_f32(xb[i]) == xf[i]);
        }
        for (float &v : s_x) v = (0.01f + 2 * rng.uniform()) * (rng.below(2) ? 1 : -1);
        for (float &v : s_w) v = 0.01f + 2 * rng.uniform();
        for (int m = 0; m < Mmax; m++) {
            std::copy(xb.begin() + (size_t)m * K, xb.begin() + (size_t)(m + 1) * K,
                      xb_rev.begin() + (size_t)(Mmax - 1 - m) * K);
            s_x_rev[(size_t)(Mmax - 1 - m)] = s_x[(size_t)m];
        }
        std::vector<float> want((size_t)Mmax * N);
        dllm__cpu_q4_gemm(DLLM__Q4_NVFP4, rows.data(), bs.data(), s_w.data(), xf.data(), K, s_x.data(), want.data(), N,
                          Mmax, N, K);
        std::vector<double> sumabs((size_t)Mmax * N);
        std::vector<float> wv((size_t)K);
        for (int n = 0; n < N; n++) {
            for (int kk = 0; kk < K; kk++)
                wv[(size_t)kk] =
                    dllm__q4_value(DLLM__Q4_NVFP4, rows.data() + (size_t)n * K / 2, bs.data() + (size_t)n * nb, kk);
            for (int m = 0; m < Mmax; m++) {
                double a = 0;
                for (int kk = 0; kk < K; kk++) a += fabs((double)xf[(size_t)m * K + kk] * wv[(size_t)kk]);
                sumabs[(size_t)m * N + n] = a * fabs((double)s_x[(size_t)m] * s_w[(size_t)n]);
            }
        }
        dllm__dbuf dw, dx, dx_rev, dsx, dsx_rev, dsw, dy, ws;
        test_put(dw, packed), test_put(dx, xb), test_put(dx_rev, xb_rev), test_put(dsx, s_x),
            test_put(dsx_rev, s_x_rev);
        test_put(dsw, s_w);
        const size_t ws_ints = dllm__q4wg_nv_workspace_ints(N, K, Mmax);
        ws.fit(ws_ints * 4, "test");
        cudaMemset(ws.ptr, 0, ws_ints * 4);
        auto run = [&](const dllm__dbuf &x, const dllm__dbuf &sx, int M) {
            test_poison(dy, (size_t)M * N * 2);
            CHECK_STATUS(dllm__q4wg_gemm_nv_run(k, dw.ptr, dsw.as<float>(), x.as<bf16_t>(), sx.as<float>(),
                                                dy.as<bf16_t>(), M, N, K, ws.as<int>(), ws_ints, nullptr),
                         DLLM_OK, nullptr);
            const std::vector<int> counters = test_get<int>(ws, (size_t)N / 128);
            CHECK_MSG(std::all_of(counters.begin(), counters.end(), [](int v) { return v == 0; }),
                      "%d x %d, M %d: the tile counters are not zero", N, K, M);
            return test_get<uint16_t>(dy, (size_t)M * N);
        };
        const std::vector<uint16_t> all = run(dx, dsx, Mmax);
        int bad = 0;
        double worst = 0;
        for (size_t i = 0; i < want.size(); i++) {
            const double got = dllm__bf16_to_f32(all[i]), err = fabs(got - (double)want[i]);
            const double tol = 1e-5 * sumabs[i] + fabs((double)want[i]) / 256 + 1e-30;
            worst = std::max(worst, err / tol);
            if (!(err <= tol) && bad++ < 5)
                printf("    %d x %d: row %zu col %zu: got %.9g, twin %.9g\n", N, K, i / N, i % N, got, want[i]);
        }
        CHECK_MSG(bad == 0, "%d x %d: %d of %zu outputs outside the tolerance of dllm__cpu_q4_gemm", N, K, bad,
                  want.size());
        CHECK_MSG(run(dx, dsx, Mmax) == all, "%d x %d: a rerun gives other bits", N, K);
        const std::vector<uint16_t> rev = run(dx_rev, dsx_rev, Mmax);
        int moved = 0;
        for (int m = 0; m < Mmax; m++)
            moved += memcmp(rev.data() + (size_t)(Mmax - 1 - m) * N, all.data() + (size_t)m * N, (size_t)N * 2) != 0;
        CHECK_MSG(moved == 0, "%d x %d: %d rows change bits when the other rows are reordered", N, K, moved);
        for (int M : {1, 13, 32, 33, 64, 65, 128, 129, 200, 256, 300}) {
            const std::vector<uint16_t> got = run(dx, dsx, M);
            CHECK_MSG(memcmp(got.data(), all.data(), got.size() * 2) == 0,
                      "%d x %d: rows at M = %d differ from the same rows at M = %d", N, K, M, Mmax);
        }
        printf("    SoloQ-N %d x %d (%d chunks): M = 1 to 520 the same bits, worst error / tolerance %.3f\n", N, K,
               dllm__q4wg_nv_ksplit(N, K), worst);
    }
}

/* A model whose layer linears q4wg takes (d 512, MLP 1536, random weights): SoloQ-I and RTN-W4A4 logits of 40 and 300
 * rows on q4wg equal, bit for bit, those of the same model on q4_gemm and the INT8 path (q4wg off); its weights are
 * packed, so the comparison is not between one path and itself. */
TEST(gpu_q4wg, forward_equals_the_other_4bit_paths) {
    NEED_Q4WG(k);
    test_tmpdir dir;
    std::string cfg = test_read_file("models/tiny-llada/config.json");
    for (auto kv : {std::make_pair("\"d_model\": 256", "\"d_model\": 512"),
                    std::make_pair("\"mlp_hidden_size\": 640", "\"mlp_hidden_size\": 1536"),
                    std::make_pair("\"n_layers\": 8", "\"n_layers\": 2"),
                    std::make_pair("\"max_sequence_length\": 256", "\"max_sequence_length\": 512")})
        cfg.replace(cfg.find(kv.first), strlen(kv.first), kv.second);
    test_write_file(dir.file("config.json"), cfg);
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load_random(dir.file("config.json").c_str(), 11, &m), DLLM_OK, nullptr);
    if (!m) return;
    for (int p : {DLLM_PRECISION_SOLOQ_I, DLLM_PRECISION_RTN_W4A4})
        for (int n : {40, 300}) {
            std::vector<int32_t> ids((size_t)n);
            for (int i = 0; i < n; i++) ids[(size_t)i] = (int32_t)((i * 7919 + 13) % m->cfg.n_vocab);
            std::vector<float> logits[2];
            for (int on = 1; on >= 0; on--) {
                test_knob q4wg("q4wg", on == 1);
                dllm_ctx *g = test_soloq_ctx(m, DLLM_BACKEND_GPU, p, 0);
                CHECK_MSG(g != nullptr, "%s: %s", dllm__precision_name(p), dllm_last_error());
                if (!g) continue;
                const dllm__gpu_backend *gpu = (const dllm__gpu_backend *)g->impl.get();
                CHECK_MSG(gpu->weights().layers[1].gu.q4->packed == (on == 1), "%s: q4wg %s but the weights %s packed",
                          dllm__precision_name(p), on ? "on" : "off", on ? "are not" : "are");
                logits[on].assign((size_t)n * m->cfg.n_vocab, NAN);
                CHECK_STATUS(dllm_logits(g, ids.data(), n, 0, n, logits[on].data(), logits[on].size()), DLLM_OK,
                             nullptr);
                dllm_ctx_free(g);
            }
            CHECK_MSG(!logits[1].empty() && logits[0].size() == logits[1].size() &&
                          memcmp(logits[0].data(), logits[1].data(), logits[1].size() * 4) == 0,
                      "%s, %d rows: the logits on q4wg differ from the other paths'", dllm__precision_name(p), n);
        }
    dllm_model_free(m);
}

/* The same model under SoloQ-N: its layer linears packed for q4wg_gemm_nv when q4wg is on; logits of 40 and 300 rows
 * close (within 5 % of the largest logit: a reordered fp32 sum can flip a token's 4-bit code) to the same model on
 * q4_gemm and the BF16 path (q4wg off), whose sums run in other orders; and the same bits on a second context. */
TEST(gpu_q4wg, soloq_n_forward_is_close_to_the_other_4bit_paths) {
    NEED_Q4WG(k);
    test_tmpdir dir;
    std::string cfg = test_read_file("models/tiny-llada/config.json");
    for (auto kv : {std::make_pair("\"d_model\": 256", "\"d_model\": 512"),
                    std::make_pair("\"mlp_hidden_size\": 640", "\"mlp_hidden_size\": 1536"),
                    std::make_pair("\"n_layers\": 8", "\"n_layers\": 2"),
                    std::make_pair("\"max_sequence_length\": 256", "\"max_sequence_length\": 512")})
        cfg.replace(cfg.find(kv.first), strlen(kv.first), kv.second);
    test_write_file(dir.file("config.json"), cfg);
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load_random(dir.file("config.json").c_str(), 11, &m), DLLM_OK, nullptr);
    if (!m) return;
    for (int n : {40, 300}) {
        std::vector<int32_t> ids((size_t)n);
        for (int i = 0; i < n; i++) ids[(size_t)i] = (int32_t)((i * 7919 + 13) % m->cfg.n_vocab);
        std::vector<float> logits[3];
        for (int run = 0; run < 3; run++) {  // q4wg off, on, on again
            test_knob q4wg("q4wg", run > 0);
            dllm_ctx *g = test_soloq_ctx(m, DLLM_BACKEND_GPU, DLLM_PRECISION_SOLOQ_N, 0);
            CHECK_MSG(g != nullptr, "SoloQ-N: %s", dllm_last_error());
            if (!g) continue;
            const dllm__gpu_backend *gpu = (const dllm__gpu_backend *)g->impl.get();
            CHECK_MSG(gpu->weights().layers[1].gu.q4->packed == (run > 0), "SoloQ-N: q4wg %s but the weights %s packed",
                      run ? "on" : "off", run ? "are not" : "are");
            logits[run].assign((size_t)n * m->cfg.n_vocab, NAN);
            CHECK_STATUS(dllm_logits(g, ids.data(), n, 0, n, logits[run].data(), logits[run].size()), DLLM_OK, nullptr);
            dllm_ctx_free(g);
        }
        if (logits[0].size() != logits[1].size() || logits[1].size() != logits[2].size()) {
            CHECK(false);
            continue;
        }
        float top = 0, diff = 0;
        for (size_t i = 0; i < logits[0].size(); i++)
            top = std::max(top, fabsf(logits[0][i])), diff = std::max(diff, fabsf(logits[1][i] - logits[0][i]));
        CHECK_MSG(diff <= 5e-2f * top, "SoloQ-N, %d rows: the logits on q4wg differ by %g (largest logit %g)", n, diff,
                  top);
        CHECK_MSG(memcmp(logits[1].data(), logits[2].data(), logits[1].size() * 4) == 0,
                  "SoloQ-N, %d rows: two contexts on q4wg give other bits", n);
        printf("    SoloQ-N, %d rows: q4wg vs q4_gemm / BF16 path: largest difference %g of %g\n", n, diff, top);
    }
    dllm_model_free(m);
}
