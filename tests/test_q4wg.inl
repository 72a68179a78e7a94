/* Tests: [W4 GEMM] q4wg, SoloQ's integer 4-bit GEMM on Hopper's wgmma (src/kernels/q4_wgmma.cuh, src/gpu/q4_wgmma.cpp):
 * its widening and layout on the CPU, its kernels against dllm__cpu_i8_gemm and the layout twin on an sm_90a GPU, and a
 * forward on q4wg against the same forward on the other 4-bit paths. */

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

/* Weights q4wg takes: integer formats, whole 128-row tiles, K in 512s (LLaDA-8B's every layer linear; not the tiny
 * models', which keep the other paths). */
TEST(q4wg, takes_integer_formats_of_whole_tiles) {
    CHECK(dllm__q4wg_takes(DLLM__Q4_INT4, 12288, 4096) && dllm__q4wg_takes(DLLM__Q4_RTN, 4096, 12288));
    CHECK(!dllm__q4wg_takes(DLLM__Q4_NVFP4, 4096, 4096) && !dllm__q4wg_takes(DLLM__Q4_E8P, 4096, 4096) &&
          !dllm__q4wg_takes(DLLM__Q4_LLOYD, 4096, 4096));
    CHECK(!dllm__q4wg_takes(DLLM__Q4_INT4, 4096 + 64, 4096) && !dllm__q4wg_takes(DLLM__Q4_INT4, 4096, 4096 + 128) &&
          !dllm__q4wg_takes(DLLM__Q4_INT4, 768, 256));
    CHECK(dllm__q4wg_workspace_ints(4096) == (size_t)4096 * 256 + 32);
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
 * counts across every configuration and past one launch (300: two), on random codes, C values and scales; outputs
 * poisoned first; the workspace is zero again after every call. */
TEST(gpu_q4wg, gemm_matches_cpu_i8_gemm) {
    NEED_Q4WG(k);
    test_rng rng("q4wg gemm");
    auto scale = [&] { return 0.01f + 2 * rng.uniform(); };
    for (auto nk : {std::make_pair(128, 512), std::make_pair(384, 1536)})
        for (dllm__q4_format f : {DLLM__Q4_INT4, DLLM__Q4_RTN}) {
            const int N = nk.first, K = nk.second, Mmax = 300;
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
            for (int M : {1, 13, 32, 33, 64, 65, 128, 129, 200, 256, 300}) {
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
            printf("    %s %d x %d: M = 1 to 300 exact\n", dllm__q4_names[f], N, K);
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
