/* Tests: LLaDA2 (mixture of experts) on the GPU backend (src/gpu/moe.cpp, src/kernels/moe.cuh), each skipped without a
 * GPU. Every kernel of the moe module against its CPU twin on fresh random inputs of awkward sizes (outputs poisoned
 * first): QK-norm + partial RoPE, the router's group-limited top-k (ties included) against dllm__moe_route_token, the
 * routes' plan, the grouped expert GEMM in BF16 and in each quantised format (FP8, SoloQ's 4-bit formats: the integer
 * ones bit for bit; each row's bits independent of the other rows) and the weighted combine.
 * Then the whole forward's logits against the CPU backend's on tiny random LLaDA2 checkpoints (one of awkward sizes,
 * one with the real head and routing structure: head_dim 128 with 64 rotated, 8 groups keep 4, top 8) on the rows no
 * nearly tied routing reaches, the router's choices inside that forward against the host's choice on the same
 * logits, and greedy generations (LLaDA2.0 and 2.1 loops) token for token against the CPU backend's, a divergence
 * accepted only at a reported near-tie; the same under FP8 and every SoloQ precision against the CPU at that precision;
 * batched items equal to their batch of one in every precision. Finally what the GPU path refuses, with the setting
 * named. */

// ---- kernels vs their CPU twins ------------------------------------------------------------------------------

struct test_moe_gpu {
    std::shared_ptr<dllm__module> mod;
    dllm__kernel<dllm__sig_qk_norm_rope> qk_norm_rope;
    dllm__kernel<dllm__sig_moe_route> route;
    dllm__kernel<dllm__sig_moe_plan> plan;
    dllm__kernel<dllm__sig_moe_grouped_gemm> grouped_gemm;
    dllm__kernel<dllm__sig_moe_combine> combine;
    dllm__kernel<dllm__sig_moe_grouped_gemm_e4m3> grouped_gemm_e4m3;
    dllm__kernel<dllm__sig_moe_grouped_gemm_int4> grouped_gemm_q4[DLLM__Q4_RTN + 1];  // by weight format
    dllm_status init() {
        cudaDeviceProp p;
        DLLM__CUDA(cudaGetDeviceProperties(&p, 0));
        DLLM__TRY(dllm__jit_load(dllm__module_moe(dllm__arch_for(p.major * 10 + p.minor)), mod));
        qk_norm_rope.fn = mod->kernels.at("qk_norm_rope"), qk_norm_rope.name = "qk_norm_rope";
        route.fn = mod->kernels.at("moe_route"), route.name = "moe_route";
        plan.fn = mod->kernels.at("moe_plan"), plan.name = "moe_plan";
        grouped_gemm.fn = mod->kernels.at("moe_grouped_gemm"), grouped_gemm.name = "moe_grouped_gemm";
        combine.fn = mod->kernels.at("moe_combine"), combine.name = "moe_combine";
        grouped_gemm_e4m3.fn = mod->kernels.at("moe_grouped_gemm_e4m3");
        grouped_gemm_e4m3.name = "moe_grouped_gemm_e4m3";
        const std::pair<dllm__q4_format, const char *> q4[] = {{DLLM__Q4_NVFP4, "moe_grouped_gemm_nvfp4"},
                                                               {DLLM__Q4_INT4, "moe_grouped_gemm_int4"},
                                                               {DLLM__Q4_E8P, "moe_grouped_gemm_e8p"},
                                                               {DLLM__Q4_RTN, "moe_grouped_gemm_rtn"}};
        for (const auto &f : q4)
            grouped_gemm_q4[f.first].fn = mod->kernels.at(f.second), grouped_gemm_q4[f.first].name = f.second;
        return DLLM_OK;
    }
};

/* One qk_norm_rope case: rows of [n_head Q | n_kv K | n_kv V] heads of head_dim, rotary_dim rotated, positions pos0 +
 * row; the CPU twin is dllm__cpu_rmsnorm per head then dllm__cpu_rope on the bf16 inputs in fp32. V heads must come
 * back untouched (bit for bit). */
static void test_qk_norm_rope_case(dllm_test_state &T_, test_moe_gpu &g, test_rng &r, int rows, int n_head, int n_kv,
                                   int hd, int rot, int pos0, bool norm) {
    const int heads = n_head + 2 * n_kv, width = heads * hd;
    std::vector<float> x((size_t)rows * width), qw(hd), kw(hd);
    for (float &v : x) v = 2 * r.normal();
    for (float &v : qw) v = 1 + 0.3f * r.normal();
    for (float &v : kw) v = 1 + 0.3f * r.normal();
    std::vector<uint16_t> xb = test_bf16_vec(x);
    x = test_f32_vec(xb);
    std::vector<float> cos_t, sin_t;
    dllm__rope_tables(10000.0f, rot, pos0 + rows, cos_t, sin_t);
    dllm__dbuf dx, dq, dk, dc, ds;
    test_put(dx, xb), test_put(dq, qw), test_put(dk, kw), test_put(dc, cos_t), test_put(ds, sin_t);
    CHECK_STATUS(g.qk_norm_rope.launch({dim3((unsigned)rows, (unsigned)(n_head + n_kv + 3) / 4), dim3(128)}, 0, dx.ptr,
                                       rows, pos0, n_head, n_kv, hd, rot, norm ? dq.ptr : nullptr,
                                       norm ? dk.ptr : nullptr, 1e-6f, dc.ptr, ds.ptr),
                 DLLM_OK, nullptr);
    std::vector<uint16_t> got_b = test_get<uint16_t>(dx, xb.size());
    std::vector<float> got = test_f32_vec(got_b);
    // the twin, head group by head group
    std::vector<float> q((size_t)rows * n_head * hd), k((size_t)rows * n_kv * hd);
    std::vector<int32_t> pos((size_t)rows);
    for (int t = 0; t < rows; t++) {
        pos[(size_t)t] = pos0 + t;
        memcpy(&q[(size_t)t * n_head * hd], &x[(size_t)t * width], sizeof(float) * n_head * hd);
        memcpy(&k[(size_t)t * n_kv * hd], &x[(size_t)t * width + (size_t)n_head * hd], sizeof(float) * n_kv * hd);
    }
    if (norm) {
        dllm__cpu_rmsnorm(q.data(), rows * n_head, hd, qw.data(), 1e-6f, q.data());
        dllm__cpu_rmsnorm(k.data(), rows * n_kv, hd, kw.data(), 1e-6f, k.data());
    }
    dllm__cpu_rope(q.data(), rows, n_head, hd, pos.data(), cos_t.data(), sin_t.data(), rot);
    dllm__cpu_rope(k.data(), rows, n_kv, hd, pos.data(), cos_t.data(), sin_t.data(), rot);
    std::vector<float> want_q, want_k, got_q, got_k;
    bool v_same = true;
    for (int t = 0; t < rows; t++) {
        const size_t o = (size_t)t * width;
        got_q.insert(got_q.end(), got.begin() + (long)o, got.begin() + (long)(o + (size_t)n_head * hd));
        got_k.insert(got_k.end(), got.begin() + (long)(o + (size_t)n_head * hd),
                     got.begin() + (long)(o + (size_t)(n_head + n_kv) * hd));
        for (size_t i = o + (size_t)(n_head + n_kv) * hd; i < o + (size_t)width; i++) v_same &= got_b[i] == xb[i];
    }
    const double eq = test_max_rel(got_q, q), ek = test_max_rel(got_k, k);
    printf("    rows %d, heads %d/%d, head_dim %d (rotary %d), pos0 %d, norm %d: Q error %.2e, K error %.2e\n", rows,
           n_head, n_kv, hd, rot, pos0, (int)norm, eq, ek);
    CHECK_MSG(eq < 8e-3 && ek < 8e-3, "qk_norm_rope: Q %.3e K %.3e against the CPU twin", eq, ek);
    CHECK_MSG(v_same, "qk_norm_rope changed a V head");
}

TEST(gpu_llada2, qk_norm_rope_matches_cpu_twin) {
    NEED_GPU();
    test_moe_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    if (!g.mod) return;
    test_rng r("gpu_llada2.qk_norm_rope");
    test_qk_norm_rope_case(T_, g, r, 5, 4, 2, 16, 8, 0, true);        // the tiny checkpoint's shape
    test_qk_norm_rope_case(T_, g, r, 33, 16, 4, 128, 64, 471, true);  // LLaDA2.0-mini's heads, far positions
    test_qk_norm_rope_case(T_, g, r, 7, 5, 1, 40, 20, 3, true);       // 10 pairs: pairs split over lanes unevenly
    test_qk_norm_rope_case(T_, g, r, 3, 3, 3, 24, 24, 9, false);      // whole-head RoPE, no QK-norm
    test_qk_norm_rope_case(T_, g, r, 2, 2, 1, 256, 64, 1, true);      // 8 values a lane
}

/* A router config: E experts in G groups, keep used groups, k experts a token. */
static dllm__config test_router_config(int E, int G, int used, int k, double scale) {
    dllm__config c;
    c.n_expert = E, c.n_expert_group = G, c.n_group_used = used, c.n_expert_used = k, c.routed_scale = scale;
    return c;
}

/* moe_route on rows of random fp32 logits (some rows with exact ties: equal logits and biases, and equal groups)
 * against dllm__moe_route_token row by row: the same experts in the same order, the weights within fp32 rounding. A
 * mismatch is accepted only where the host's routing scores of the two experts differ by less than 1e-6 (expf's last
 * bits on the two sides), and reported. */
static void test_router_case(dllm_test_state &T_, test_moe_gpu &g, test_rng &r, int rows, const dllm__config &c) {
    const int E = c.n_expert, k = c.n_expert_used;
    std::vector<float> logits((size_t)rows * E), bias((size_t)E);
    for (float &v : logits) v = 1.5f * r.normal();
    for (float &v : bias) v = 0.05f * r.normal();
    for (int e = 1; e < E; e += 7) bias[(size_t)e] = bias[(size_t)e - 1];  // tie partners
    for (int t = 0; t < rows; t += 3)                                       // every third row: exact ties
        for (int e = 1; e < E; e += 7) logits[(size_t)t * E + e] = logits[(size_t)t * E + e - 1];
    if (rows > 1)  // one row of equal logits: the biases alone decide, with their ties
        for (int e = 0; e < E; e++) logits[(size_t)E + e] = 0.25f, bias[(size_t)e] = e % 7 ? bias[(size_t)e] : bias[0];
    dllm__dbuf dl, db, de, dw;
    test_put(dl, logits), test_put(db, bias);
    test_poison(de, (size_t)rows * k * 4), test_poison(dw, (size_t)rows * k * 4);
    CHECK_STATUS(g.route.launch({dim3((unsigned)rows), dim3(32)}, 0, dl.ptr, db.ptr, rows, E, c.n_expert_group,
                                c.n_group_used, k, (float)c.routed_scale, de.ptr, dw.ptr),
                 DLLM_OK, nullptr);
    std::vector<int> got_e = test_get<int>(de, (size_t)rows * k);
    std::vector<float> got_w = test_get<float>(dw, (size_t)rows * k);
    int same_rows = 0, near_ties = 0;
    double worst_w = 0;
    for (int t = 0; t < rows; t++) {
        const dllm__moe_route want = dllm__moe_route_token(c, &logits[(size_t)t * E], bias.data());
        bool same = true;
        for (int s = 0; s < k; s++) same &= got_e[(size_t)t * k + s] == want.expert[(size_t)s];
        if (same) {
            same_rows++;
            for (int s = 0; s < k; s++)
                worst_w = std::max(worst_w, (double)fabsf(got_w[(size_t)t * k + s] - want.weight[(size_t)s]) /
                                                std::max(1e-30f, fabsf(want.weight[(size_t)s])));
            continue;
        }
        // the first differing slot: a near-tie if the two experts' routing scores are within 1e-6 on the host
        int s = 0;
        while (got_e[(size_t)t * k + s] == want.expert[(size_t)s]) s++;
        const int a = got_e[(size_t)t * k + s], b = want.expert[(size_t)s];
        auto score = [&](int e) {
            return e < 0 || e >= E ? -1e30 : 1.0 / (1.0 + exp(-(double)logits[(size_t)t * E + e])) + bias[(size_t)e];
        };
        const double gap = fabs(score(a) - score(b));
        printf("    row %d slot %d: GPU expert %d, CPU expert %d, routing scores %.9g / %.9g (gap %.2e)\n", t, s, a, b,
               score(a), score(b), gap);
        if (gap < 1e-6)
            near_ties++;
        else
            CHECK_MSG(false, "E %d: row %d routes differently (not a near-tie)", E, t);
    }
    printf("    E %d (%d groups keep %d, top %d), %d rows: %d identical, %d near-ties; weights within %.2e\n", E,
           c.n_expert_group, c.n_group_used, k, rows, same_rows, near_ties, worst_w);
    CHECK_MSG(worst_w < 1e-5, "moe_route weights differ by %.3e (relative)", worst_w);
}

TEST(gpu_llada2, router_chooses_the_cpu_experts) {
    NEED_GPU();
    test_moe_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    if (!g.mod) return;
    test_rng r("gpu_llada2.router");
    test_router_case(T_, g, r, 37, test_router_config(12, 4, 2, 3, 2.5));    // the tiny checkpoint's router
    test_router_case(T_, g, r, 65, test_router_config(256, 8, 4, 8, 2.5));   // LLaDA2.0-mini / flash
    test_router_case(T_, g, r, 9, test_router_config(64, 1, 1, 6, 1.0));     // one group
    test_router_case(T_, g, r, 11, test_router_config(40, 20, 7, 5, 2.5));   // groups of 2 (top-2 = the whole group)
    test_router_case(T_, g, r, 5, test_router_config(1024, 64, 3, 32, 2.5)); // the limits
    test_router_case(T_, g, r, 4, test_router_config(6, 3, 1, 1, 2.5));      // top-1: the weight is s, unnormalised
}

/* Random routes of T tokens to k distinct experts of E each, expert 1 popular (more than a tile of rows), one slot
 * without an expert (NaN scores): [T][k]. */
static std::vector<int> test_moe_random_routes(test_rng &r, int E, int k, int T) {
    const int P = T * k;
    std::vector<int> expert((size_t)P);
    for (int t = 0; t < T; t++) {
        std::vector<int> all((size_t)E);
        for (int e = 0; e < E; e++) all[(size_t)e] = e;
        for (int e = E - 1; e > 0; e--) std::swap(all[(size_t)e], all[(size_t)r.below(e + 1)]);
        if (t % 2 == 0)
            for (int j = 0; j < E; j++)
                if (all[(size_t)j] == 1) std::swap(all[0], all[(size_t)j]);
        for (int j = 0; j < k; j++) expert[(size_t)t * k + j] = all[(size_t)j];
    }
    expert[(size_t)std::min(P - 1, 5 * k + 1)] = -1;
    return expert;
}

/* moe_plan against dllm__moe_plan_ref (exact: the same rows, tiles and order) on random routes of awkward sizes, some
 * slots without an expert, many tokens on one expert (several tiles); then moe_grouped_gemm over that plan against
 * dllm__moe_grouped_gemm_ref (fp32 sums; the order differs, so within a bound), outputs poisoned first, with and
 * without a row list, N and K not multiples of the tiles. Row independence: each token's rows again with the token
 * alone (its own plan, other experts' counts) give the same bits. */
TEST(gpu_llada2, plan_and_grouped_gemm_match_cpu_twins) {
    NEED_GPU();
    test_moe_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    if (!g.mod) return;
    test_rng r("gpu_llada2.plan_grouped_gemm");
    struct shape {
        int E, k, T, N, K;
    };
    for (const shape &sh : {shape{12, 3, 23, 40, 24}, shape{256, 8, 32, 72, 136}, shape{7, 2, 300, 8, 64},
                            shape{33, 5, 77, 200, 1000}}) {
        const int E = sh.E, k = sh.k, T = sh.T, N = sh.N, K = sh.K, P = T * k;
        const std::vector<int> expert = test_moe_random_routes(r, E, k, T);
        std::vector<int> first_row, tile_first, row_token, slot_row;
        dllm__moe_plan_ref(expert.data(), P, k, E, dllm__moe_tile_rows, first_row, tile_first, row_token, slot_row);
        const int rows = first_row[(size_t)E];
        dllm__dbuf dexp, dplan, drt, dsr;
        test_put(dexp, expert);
        test_poison(dplan, (size_t)2 * (E + 1) * 4), test_poison(drt, (size_t)P * 4), test_poison(dsr, (size_t)P * 4);
        int *d_first = dplan.as<int>(), *d_tiles = d_first + E + 1;
        CHECK_STATUS(g.plan.launch({dim3(1), dim3(256)}, 0, dexp.as<int>(), P, k, E, d_first, d_tiles, drt.as<int>(),
                                   dsr.as<int>()),
                     DLLM_OK, nullptr);
        std::vector<int> plan_got = test_get<int>(dplan, (size_t)2 * (E + 1)), rt_got = test_get<int>(drt, (size_t)P),
                         sr_got = test_get<int>(dsr, (size_t)P);
        rt_got.resize((size_t)rows);
        const bool plan_same = std::equal(first_row.begin(), first_row.end(), plan_got.begin()) &&
                               std::equal(tile_first.begin(), tile_first.end(), plan_got.begin() + E + 1) &&
                               rt_got == row_token && sr_got == slot_row;
        CHECK_MSG(plan_same, "E=%d k=%d T=%d: moe_plan differs from dllm__moe_plan_ref", E, k, T);
        if (!plan_same) continue;
        // experts' weights (bf16 [N][K] each) and the rows: by row list (tokens) and without (rows in order)
        std::vector<std::vector<uint16_t>> w((size_t)E);
        std::vector<dllm__dbuf> dw((size_t)E);
        std::vector<const uint16_t *> w_host;
        std::vector<const void *> w_dev;
        for (int e = 0; e < E; e++) {
            std::vector<float> f((size_t)N * K);
            for (float &v : f) v = r.normal() / sqrtf((float)K);
            w[(size_t)e] = test_bf16_vec(f);
            test_put(dw[(size_t)e], w[(size_t)e]);
            w_host.push_back(w[(size_t)e].data()), w_dev.push_back(dw[(size_t)e].ptr);
        }
        dllm__dbuf dwp;
        test_put(dwp, w_dev);
        for (int listed = 0; listed < 2; listed++) {
            const int x_rows = listed ? T : std::max(rows, 1);
            std::vector<float> xf((size_t)x_rows * K);
            for (float &v : xf) v = r.normal();
            const std::vector<uint16_t> xb = test_bf16_vec(xf);
            dllm__dbuf dx, dy;
            test_put(dx, xb), test_poison(dy, (size_t)std::max(P, 1) * N * 2);
            const unsigned tiles = (unsigned)(P / dllm__moe_tile_rows + std::min(E, P));
            CHECK_STATUS(g.grouped_gemm.launch({dim3(tiles, (unsigned)(N + 63) / 64), dim3(128)}, 0, dx.as<bf16_t>(),
                                               listed ? (const int *)drt.ptr : nullptr,
                                               dwp.as<const bf16_t *>(), d_first, d_tiles, E, N, K, dy.as<bf16_t>()),
                         DLLM_OK, nullptr);
            std::vector<uint16_t> got = test_get<uint16_t>(dy, (size_t)rows * N), want((size_t)rows * N);
            dllm__moe_grouped_gemm_ref(xb.data(), listed ? row_token.data() : nullptr, w_host, first_row, N, K,
                                       want.data());
            const double err = test_max_rel(test_f32_vec(got), test_f32_vec(want));
            printf("    E=%d k=%d T=%d N=%d K=%d rows %d (list %d): grouped GEMM error %.2e\n", E, k, T, N, K, rows,
                   listed, err);
            CHECK_MSG(err < 1e-2, "E=%d N=%d K=%d: moe_grouped_gemm error %.3e", E, N, K, err);
            if (!listed) continue;
            // token 3 alone: its k slots through their own plan give the same bits as in the batch of T
            std::vector<int> one(expert.begin() + 3 * k, expert.begin() + 4 * k);
            std::vector<int> f1, t1, rt1, sr1;
            dllm__moe_plan_ref(one.data(), k, k, E, dllm__moe_tile_rows, f1, t1, rt1, sr1);
            for (int &v : rt1) v = 3;  // its row list names token 3 of the same x
            dllm__dbuf dp1, drt1, dy1;
            std::vector<int> p1 = f1;
            p1.insert(p1.end(), t1.begin(), t1.end());
            test_put(dp1, p1), test_put(drt1, rt1.empty() ? std::vector<int>{0} : rt1),
                test_poison(dy1, (size_t)k * N * 2);
            CHECK_STATUS(g.grouped_gemm.launch({dim3((unsigned)(k / dllm__moe_tile_rows + k), (unsigned)(N + 63) / 64),
                                                dim3(128)},
                                               0, dx.as<bf16_t>(), drt1.as<int>(), dwp.as<const bf16_t *>(),
                                               dp1.as<int>(), dp1.as<int>() + E + 1, E, N, K, dy1.as<bf16_t>()),
                         DLLM_OK, nullptr);
            const std::vector<uint16_t> alone = test_get<uint16_t>(dy1, (size_t)k * N);
            bool same = true;
            for (int j = 0; j < k; j++) {
                const int row_batch = slot_row[(size_t)3 * k + j], row_alone = sr1[(size_t)j];
                if (row_batch < 0) continue;
                same &= memcmp(&got[(size_t)row_batch * N], &alone[(size_t)row_alone * N], (size_t)N * 2) == 0;
            }
            CHECK_MSG(same, "E=%d N=%d K=%d: token 3's expert rows alone differ from its rows among %d tokens", E, N,
                      K, T);
        }
    }
}

/* One quantised grouped-GEMM case: E experts of N x K weights in format wf (a dllm__q4_format, or -1: FP8 E4M3) and
 * activation rows of format acts, random routes of T tokens to k experts each; the GPU's rows against the twin's
 * (dllm__moe_grouped_gemm_q4_ref, dllm__moe_grouped_gemm_e4m3_ref), outputs poisoned first, by row list (the tokens,
 * with token scales) and without (rows in order; SoloQ: no scales, as -w4a16), then token 3's rows alone. exact: the
 * bits must agree (integer sums); otherwise within 1e-2 relative (fp32 sums in another order). */
static void test_moe_quantised_gemm_case(dllm_test_state &T_, test_moe_gpu &g, test_rng &r, int wf,
                                         dllm__q4_format acts, bool exact, int E, int k, int T, int N, int K) {
    const bool fp8 = wf < 0;
    const dllm__q4_format f = (dllm__q4_format)std::max(wf, 0);
    const int P = T * k, Kp = fp8 ? (K + 127) / 128 * 128 : K, blocks = (K + 15) / 16;
    const std::vector<int> expert = test_moe_random_routes(r, E, k, T);
    std::vector<int> first_row, tile_first, row_token, slot_row;
    dllm__moe_plan_ref(expert.data(), P, k, E, dllm__moe_tile_rows, first_row, tile_first, row_token, slot_row);
    const int rows = first_row[(size_t)E];
    std::vector<int> plan = first_row;
    plan.insert(plan.end(), tile_first.begin(), tile_first.end());
    dllm__dbuf dplan, drt;
    test_put(dplan, plan), test_put(drt, row_token.empty() ? std::vector<int>{0} : row_token);
    auto e4m3_code = [&]() {  // any code but NaN
        const int c = r.below(256);
        return (uint8_t)((c & 0x7F) == 0x7F ? 0 : c);
    };
    // the weights: codes (FP8: [N][Kp], the padding zero; SoloQ: [N][K / 2]), scales, NVFP4's block scales
    const int w_ld = (Kp / 128 + 3) / 4 * 4, n_blocks = (N + 127) / 128;
    std::vector<std::vector<uint8_t>> codes((size_t)E), bscales((size_t)E);
    std::vector<std::vector<float>> scales((size_t)E);
    std::vector<dllm__dbuf> dcodes((size_t)E), dscales((size_t)E), dbscales((size_t)E);
    std::vector<const void *> ptrs((size_t)3 * E, nullptr);
    std::vector<const uint8_t *> h_codes, h_bscales;
    std::vector<const float *> h_scales;
    for (int e = 0; e < E; e++) {
        std::vector<uint8_t> &c = codes[(size_t)e];
        std::vector<float> &s = scales[(size_t)e];
        if (fp8) {
            c.assign((size_t)N * Kp, 0);
            for (int n = 0; n < N; n++)
                for (int i = 0; i < K; i++) c[(size_t)n * Kp + i] = e4m3_code();
            s.assign((size_t)n_blocks * w_ld, 0.f);
            for (float &v : s) v = 1e-3f * (0.5f + r.uniform());
        } else {
            c.resize((size_t)N * K / 2);
            for (uint8_t &v : c) v = (uint8_t)r.below(256);
            s.resize((size_t)N);
            for (float &v : s) v = 0.01f * (0.5f + r.uniform());
            if (f == DLLM__Q4_NVFP4) {  // positive UE4M3 block scales from 2^-3 to 2^3
                bscales[(size_t)e].resize((size_t)N * blocks);
                for (uint8_t &v : bscales[(size_t)e]) v = (uint8_t)(0x20 + r.below(0x30));
                test_put(dbscales[(size_t)e], bscales[(size_t)e]);
            }
        }
        test_put(dcodes[(size_t)e], c), test_put(dscales[(size_t)e], s);
        ptrs[(size_t)e] = dcodes[(size_t)e].ptr, ptrs[(size_t)E + e] = dscales[(size_t)e].ptr;
        ptrs[(size_t)2 * E + e] = dbscales[(size_t)e].ptr;
        h_codes.push_back(c.data()), h_scales.push_back(s.data()), h_bscales.push_back(bscales[(size_t)e].data());
    }
    dllm__dbuf dptrs;
    test_put(dptrs, ptrs);
    for (int listed = 0; listed < 2; listed++) {
        const int x_rows = listed ? T : std::max(rows, 1), x_ld16 = (x_rows + 15) / 16 * 16;
        // the rows: FP8 codes [x_rows][Kp] with scales [Kp / 128][x_ld16]; SoloQ C values of format acts
        std::vector<uint8_t> x8;
        std::vector<float> xc, xs;
        dllm__dbuf dx, dxs, dy;
        if (fp8) {
            x8.assign((size_t)x_rows * Kp, 0);
            for (int m = 0; m < x_rows; m++)
                for (int i = 0; i < K; i++) x8[(size_t)m * Kp + i] = e4m3_code();
            xs.resize((size_t)Kp / 128 * x_ld16);
            for (float &v : xs) v = 1e-2f * (0.5f + r.uniform());
            test_put(dx, x8), test_put(dxs, xs);
        } else {
            xc.resize((size_t)x_rows * K);
            for (size_t i = 0; i < xc.size(); i++) {
                const int q = r.below(16);
                switch (acts) {
                    case DLLM__Q4_INT4: xc[i] = (float)(2 * (q - 8) + 1); break;
                    case DLLM__Q4_RTN: xc[i] = (float)(q % 15 - 7); break;
                    case DLLM__Q4_LLOYD:
                        xc[i] = (float)(q & 8 ? -dllm__lloyd4_int[q & 7] : dllm__lloyd4_int[q & 7]);
                        break;
                    default:  // NVFP4: an e2m1 value times its block's UE4M3 scale
                        xc[i] = dllm__e2m1_to_f32((uint8_t)q) * dllm__e4m3_to_f32((uint8_t)(0x30 + (i / 16) % 16));
                }
            }
            xs.resize((size_t)x_rows);
            for (float &v : xs) v = 0.05f * (0.5f + r.uniform());
            test_put(dx, test_bf16_vec(xc)), test_put(dxs, xs);  // C values: exact in bf16
        }
        test_poison(dy, (size_t)std::max(P, 1) * N * 2);
        moe_gemm_args a = {};
        a.x = dx.ptr, a.x_scale = fp8 || listed ? dxs.as<float>() : nullptr;
        a.row_src = listed ? drt.as<int>() : nullptr, a.w = dptrs.as<const void *>();
        a.w_scale = (const float *const *)(dptrs.as<const void *>() + E);
        a.w_block_scales = (const unsigned char *const *)(dptrs.as<const void *>() + 2 * E);
        a.first_row = dplan.as<int>(), a.tile_first = dplan.as<int>() + E + 1, a.y = dy.as<bf16_t>();
        a.n_expert = E, a.N = N, a.K = a.x_ld = Kp, a.x_scale_ld = x_ld16, a.w_scale_ld = w_ld;
        const dllm__kernel<dllm__sig_moe_grouped_gemm_int4> &kernel = fp8 ? g.grouped_gemm_e4m3 : g.grouped_gemm_q4[f];
        const unsigned tiles = (unsigned)(P / dllm__moe_tile_rows + std::min(E, P));
        CHECK_STATUS(kernel.launch({dim3(tiles, (unsigned)(N + 63) / 64), dim3(dllm__moe_threads)}, 0, a), DLLM_OK,
                     nullptr);
        std::vector<uint16_t> got = test_get<uint16_t>(dy, (size_t)rows * N), want((size_t)rows * N);
        const int *src = listed ? row_token.data() : nullptr;
        if (fp8)
            dllm__moe_grouped_gemm_e4m3_ref(x8.data(), xs.data(), x_ld16, src, h_codes, h_scales, first_row, N, Kp,
                                            want.data());
        else
            dllm__moe_grouped_gemm_q4_ref(f, xc.data(), listed ? xs.data() : nullptr, src, h_codes, h_bscales,
                                          h_scales, first_row, N, K, want.data());
        const char *name = fp8 ? "E4M3" : dllm__q4_names[f];
        if (exact) {
            size_t differ = 0;
            for (size_t i = 0; i < got.size(); i++) differ += got[i] != want[i];
            printf("    %s x %s E=%d k=%d T=%d N=%d K=%d (list %d): %zu of %zu outputs differ from the twin\n", name,
                   fp8 ? "E4M3" : dllm__q4_names[acts], E, k, T, N, K, listed, differ, got.size());
            CHECK_MSG(differ == 0, "%s E=%d N=%d K=%d: the grouped GEMM is not the twin's bits", name, E, N, K);
        } else {
            const double err = test_max_rel(test_f32_vec(got), test_f32_vec(want));
            printf("    %s E=%d k=%d T=%d N=%d K=%d (list %d): error %.2e against the twin\n", name, E, k, T, N, K,
                   listed, err);
            CHECK_MSG(err < 1e-2, "%s E=%d N=%d K=%d: grouped GEMM error %.3e", name, E, N, K, err);
        }
        if (!listed) continue;
        // token 3 alone: its k slots through their own plan give the same bits as among all T tokens
        std::vector<int> one(expert.begin() + 3 * k, expert.begin() + 4 * k), f1, t1, rt1, sr1;
        dllm__moe_plan_ref(one.data(), k, k, E, dllm__moe_tile_rows, f1, t1, rt1, sr1);
        for (int &v : rt1) v = 3;
        f1.insert(f1.end(), t1.begin(), t1.end());
        dllm__dbuf dp1, drt1, dy1;
        test_put(dp1, f1), test_put(drt1, rt1.empty() ? std::vector<int>{0} : rt1);
        test_poison(dy1, (size_t)k * N * 2);
        moe_gemm_args a1 = a;
        a1.row_src = drt1.as<int>(), a1.first_row = dp1.as<int>(), a1.tile_first = dp1.as<int>() + E + 1;
        a1.y = dy1.as<bf16_t>();
        CHECK_STATUS(kernel.launch({dim3((unsigned)(k / dllm__moe_tile_rows + k), (unsigned)(N + 63) / 64),
                                    dim3(dllm__moe_threads)},
                                   0, a1),
                     DLLM_OK, nullptr);
        const std::vector<uint16_t> alone = test_get<uint16_t>(dy1, (size_t)k * N);
        bool same = true;
        for (int j = 0; j < k; j++) {
            const int row_batch = slot_row[(size_t)3 * k + j], row_alone = sr1[(size_t)j];
            if (row_batch >= 0)
                same &= memcmp(&got[(size_t)row_batch * N], &alone[(size_t)row_alone * N], (size_t)N * 2) == 0;
        }
        CHECK_MSG(same, "%s E=%d N=%d K=%d: token 3's rows alone differ from its rows among %d tokens", name, E, N, K,
                  T);
    }
}

/* The grouped GEMM in the quantised formats against its twins (test_moe_quantised_gemm_case) on awkward sizes: each
 * SoloQ weight format with its precision's activations (SoloQ-I INT4 x INT4, SoloQ-C E8P x Lloyd-Max, RTN-W4A4 RTN x
 * RTN: integer C values whose partial sums stay below 2^24 (K <= 1000: 127 x 126 x 1000), so the products sum exactly
 * in any order and the epilogue's (acc x_scale) w_scale is the twin's: bit for bit; SoloQ-N NVFP4 x NVFP4, whose
 * sums are not integers: 1e-2 relative, as the BF16 kernel), and FP8 (each 128-wide group's products summed in
 * another order than dllm__fp8_gemm_twin's, then promoted as it does: 1e-2 relative). */
TEST(gpu_llada2, quantised_grouped_gemms_match_cpu_twins) {
    NEED_GPU();
    test_moe_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    if (!g.mod) return;
    test_rng r("gpu_llada2.quantised_grouped_gemms");
    struct format_case {
        int weights;
        dllm__q4_format acts;
        bool exact;
    };
    const format_case formats[] = {{DLLM__Q4_INT4, DLLM__Q4_INT4, true},
                                   {DLLM__Q4_E8P, DLLM__Q4_LLOYD, true},
                                   {DLLM__Q4_RTN, DLLM__Q4_RTN, true},
                                   {DLLM__Q4_NVFP4, DLLM__Q4_NVFP4, false},
                                   {-1, DLLM__Q4_NVFP4, false}};
    struct shape {
        int E, k, T, N, K;
    };
    for (const format_case &fc : formats)
        for (const shape &sh : {shape{12, 3, 23, 40, 24}, shape{256, 8, 32, 72, 136}, shape{7, 2, 300, 8, 64},
                                shape{33, 5, 77, 200, 1000}})
            test_moe_quantised_gemm_case(T_, g, r, fc.weights, fc.acts, fc.exact, sh.E, sh.k, sh.T, sh.N, sh.K);
}

/* moe_combine (the weighted slot sum in fp32 plus the shared row, one bf16 rounding) against its twin on awkward
 * sizes; a slot of row -1 adds nothing. */
TEST(gpu_llada2, combine_matches_cpu_twin) {
    NEED_GPU();
    test_moe_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    if (!g.mod) return;
    test_rng r("gpu_llada2.combine");
    for (int d : {40, 64, 2048}) {
        const int T = 13, k = 3, R = 29;
        std::vector<float> y((size_t)R * d), sh((size_t)T * d), w((size_t)T * k);
        for (float &v : y) v = r.normal();
        for (float &v : sh) v = r.normal();
        for (float &v : w) v = r.uniform();
        std::vector<int> slot_row((size_t)T * k);
        for (int &v : slot_row) v = r.below(R);
        slot_row[4] = -1;
        std::vector<uint16_t> yb = test_bf16_vec(y), shb = test_bf16_vec(sh);
        dllm__dbuf dy, ds, dsh, dw, dout;
        test_put(dy, yb), test_put(ds, slot_row), test_put(dsh, shb), test_put(dw, w);
        for (int with_shared = 0; with_shared < 2; with_shared++) {
            test_poison(dout, (size_t)T * d * 2);
            CHECK_STATUS(g.combine.launch({dllm__rows_grid(T, d / 8, 256), dim3(256)}, 0, dy.ptr, ds.ptr, dw.ptr,
                                          with_shared ? dsh.ptr : nullptr, T, k, d, dout.ptr),
                         DLLM_OK, nullptr);
            std::vector<float> out = test_f32_vec(test_get<uint16_t>(dout, (size_t)T * d)), want((size_t)T * d);
            const std::vector<float> yf = test_f32_vec(yb), shf = test_f32_vec(shb);
            for (int t = 0; t < T; t++)
                for (int i = 0; i < d; i++) {
                    float acc = 0;
                    for (int s = 0; s < k; s++) {
                        const int row = slot_row[(size_t)t * k + s];
                        if (row >= 0) acc += w[(size_t)t * k + s] * yf[(size_t)row * d + i];
                    }
                    want[(size_t)t * d + i] = acc + (with_shared ? shf[(size_t)t * d + i] : 0.0f);
                }
            const double err = test_max_rel(out, want);
            printf("    d=%d shared=%d: combine error %.2e\n", d, with_shared, err);
            CHECK_MSG(err < 8e-3, "d=%d: moe_combine error %.3e", d, err);
        }
    }
}

// ---- the forward and the generate loops against the CPU backend ------------------------------------------------

/* GPU-compatible tiny shapes (sizes divisible by 8, head_dim a multiple of 8): awkward ones, and one with the real
 * models' head (128, 64 rotated) and routing structure (8 groups keep 4, top 8). */
static test_llada2_shape test_llada2_gpu_shape(bool real_structure) {
    test_llada2_shape s;
    s.H = 64, s.n_layer = 3, s.n_head = 4, s.n_kv = 2, s.hd = 16, s.ff = 48, s.E = 12, s.n_group = 4, s.topk_group = 2;
    s.top_k = 3, s.moe_ff = 24, s.shared = 1, s.dense = 1, s.V = 104;
    if (real_structure) {
        s.H = 256, s.n_layer = 2, s.n_head = 4, s.n_kv = 2, s.hd = 128, s.ff = 96, s.E = 32, s.n_group = 8;
        s.topk_group = 4, s.top_k = 8, s.moe_ff = 64, s.V = 136, s.theta = 600000;
    }
    return s;
}

/* A random prompt token: below EOS and the mask id (LLaDA2 refuses a prompt holding the mask id). */
static int32_t test_llada2_prompt_token(const test_llada2_shape &s, std::mt19937 &rng) {
    return (int32_t)(rng() % (uint32_t)std::min(s.eos, s.mask));
}

/* A loaded tiny checkpoint with a CPU and a GPU context over it. Its weights are bf16 values, as the GPU holds them, so
 * that both backends compute with the same weights: rounding them alone moves the fp32 CPU's logits of these random
 * models by up to 0.5 relative from 32 tokens on (expert choices flip at near-ties), as much as the GPU's differ. */
struct test_llada2_pair {
    test_tmpdir dir;
    dllm_model *m = nullptr;
    dllm_ctx *cpu = nullptr, *gpu = nullptr;
    explicit test_llada2_pair(const test_llada2_shape &s, uint32_t seed,
                              dllm_precision precision = DLLM_PRECISION_BF16) {
        test_llada2_weights tw = test_llada2_random(s, seed);
        for (auto &kv : tw.w)
            for (float &v : kv.second) v = dllm__bf16_to_f32(dllm__f32_to_bf16(v));
        test_llada2_write(dir, s, tw);
        m = test_load(dir.path);
        if (!m) return;
        cpu = test_ctx_precision(m, DLLM_BACKEND_CPU, precision);
        gpu = test_ctx_precision(m, DLLM_BACKEND_GPU, precision);
    }
    explicit test_llada2_pair(const char *model_dir,
                              dllm_precision precision = DLLM_PRECISION_BF16) {  // a checkpoint as it is
        m = test_load(model_dir);
        if (!m) return;
        cpu = test_ctx_precision(m, DLLM_BACKEND_CPU, precision);
        gpu = test_ctx_precision(m, DLLM_BACKEND_GPU, precision);
    }
    ~test_llada2_pair() {
        dllm_ctx_free(cpu);
        dllm_ctx_free(gpu);
        dllm_model_free(m);
    }
    bool ok() const { return cpu && gpu; }
    dllm__gpu_backend &backend() const { return *(dllm__gpu_backend *)gpu->impl.get(); }
};

/* The rows of an n-token forward that no nearly tied routing reaches: a token whose routing scores on the GPU's router
 * logits (router_logits: MoE layer -> [n][n_expert]) are within `delta` of changing its experts
 * (test_moe_route_margin) may choose others on the CPU, whose fp32 hidden states differ from the GPU's bf16 ones by
 * about 1%. Such a flip moves that token's row far beyond bf16 rounding and, in a MoE layer before the last, every row
 * that attends to it afterwards (its block and the later ones, block-causal). */
static std::vector<bool> test_llada2_clean_rows(const dllm_model &m,
                                                const std::map<int, std::vector<float>> &router_logits, int n,
                                                float delta) {
    const dllm__config &c = m.cfg;
    const int block = c.bd_mask_block > 0 ? c.bd_mask_block : n;
    std::vector<bool> clean((size_t)n, true);
    const int last = router_logits.empty() ? -1 : router_logits.rbegin()->first;
    for (const auto &kv : router_logits)
        for (int t = 0; t < n; t++) {
            const float *lg = &kv.second[(size_t)t * c.n_expert];
            if (test_moe_route_margin(c, lg, m.layers[(size_t)kv.first].expert_bias.data()) >= delta) continue;
            for (int i = kv.first == last ? t : t / block * block; i < (kv.first == last ? t + 1 : n); i++)
                clean[(size_t)i] = false;
        }
    return clean;
}

/* dllm_logits (one block-causal forward from position 0, blocks of 32) on both backends: close logits on the rows no
 * nearly tied routing reaches (test_llada2_clean_rows), some rows of each shape among them; the argmax agreeing except
 * where the CPU's top two are within twice the row's noise; inside the GPU's forward, each MoE layer's chosen experts
 * equal to the host's choice (dllm__moe_route_token) on the GPU's own router logits. */
TEST(gpu_llada2, forward_logits_match_cpu_backend) {
    NEED_GPU();
    for (int real = 0; real < 2; real++) {
        const test_llada2_shape s = test_llada2_gpu_shape(real != 0);
        test_llada2_pair pair(s, 21 + real);
        CHECK_MSG(pair.ok(), "shape %d: contexts not made (%s)", real, dllm_last_error());
        if (!pair.ok()) continue;
        CHECK(dllm_ctx_get_backend(pair.gpu) == DLLM_BACKEND_GPU);
        std::map<int, std::vector<int>> experts;
        std::map<int, std::vector<float>> router_logits;
        pair.backend().set_moe_debug(&experts, &router_logits);
        std::mt19937 rng(5 + real);
        int clean_rows = 0;
        for (int n : {5, 32, 45, 70}) {
            std::vector<int32_t> ids((size_t)n);
            for (int32_t &t : ids) t = (int32_t)(rng() % (uint32_t)(s.V - 8));
            for (int i = n * 2 / 3; i < n; i++) ids[(size_t)i] = s.mask;  // masks at the end, as in a step
            const int V = s.V, r0 = n > 3 ? 2 : 0;
            std::vector<float> a((size_t)(n - r0) * V, NAN), b(a.size(), NAN);
            CHECK_STATUS(dllm_logits(pair.cpu, ids.data(), n, r0, n, a.data(), a.size()), DLLM_OK, nullptr);
            experts.clear(), router_logits.clear();
            CHECK_STATUS(dllm_logits(pair.gpu, ids.data(), n, r0, n, b.data(), b.size()), DLLM_OK, nullptr);
            int argmax_same = 0, near = 0;
            for (int i = 0; i < n - r0; i++) {
                const float *ra = &a[(size_t)i * V], *rb = &b[(size_t)i * V];
                const long ia = std::max_element(ra, ra + V) - ra, ib = std::max_element(rb, rb + V) - rb;
                double noise = 0;
                for (int v = 0; v < V; v++) noise = std::max(noise, (double)fabsf(ra[v] - rb[v]));
                if (ia == ib) {
                    argmax_same++;
                    continue;
                }
                const double gap = (double)ra[ia] - ra[ib];
                printf("    row %d: argmax CPU %ld GPU %ld, CPU gap %.3e, noise %.3e\n", r0 + i, ia, ib, gap, noise);
                if (gap <= 2 * noise)
                    near++;
                else
                    CHECK_MSG(false, "shape %d n %d row %d: argmax differs beyond the noise", real, n, r0 + i);
            }
            const std::vector<bool> clean = test_llada2_clean_rows(*pair.m, router_logits, n, 1e-2f);
            std::vector<float> ac, bc;
            for (int i = 0; i < n - r0; i++)
                if (clean[(size_t)(r0 + i)]) {
                    ac.insert(ac.end(), a.begin() + (long)i * V, a.begin() + (long)(i + 1) * V);
                    bc.insert(bc.end(), b.begin() + (long)i * V, b.begin() + (long)(i + 1) * V);
                }
            const int n_clean = (int)(ac.size() / V);
            const double err = n_clean ? test_max_rel(bc, ac) : 0, err_all = test_max_rel(b, a);
            printf("    shape %d T=%d: GPU vs CPU logits max relative error %.2e on the %d/%d rows no nearly tied "
                   "routing reaches (%.2e on all), argmax agrees on %d/%d rows (%d near-ties)\n",
                   real, n, err, n_clean, n - r0, err_all, argmax_same, n - r0, near);
            CHECK_MSG(err < 3e-2, "shape %d T=%d: logits error %.3e", real, n, err);
            clean_rows += n_clean;
            // the router inside the forward: its choices are the host's on the GPU's own logits
            dllm__config c = pair.m->cfg;
            int layers = 0, rows_same = 0, rows_all = 0;
            for (auto &kv : experts) {
                const std::vector<float> &lg = router_logits[kv.first];
                const dllm__layer_weights &L = pair.m->layers[(size_t)kv.first];
                layers++;
                for (int t = 0; t < n; t++) {
                    const dllm__moe_route want =
                        dllm__moe_route_token(c, &lg[(size_t)t * c.n_expert], L.expert_bias.data());
                    rows_all++;
                    rows_same += std::equal(want.expert.begin(), want.expert.end(),
                                            kv.second.begin() + (long)t * c.n_expert_used);
                }
            }
            printf("    shape %d T=%d: %d MoE layers, the device's routes equal the host's on %d/%d rows\n", real, n,
                   layers, rows_same, rows_all);
            CHECK_MSG(layers == s.n_layer - s.dense, "%d MoE layers seen", layers);
            CHECK_MSG(rows_same == rows_all, "shape %d T=%d: %d rows routed apart from the host's choice", real, n,
                      rows_all - rows_same);
        }
        CHECK_MSG(clean_rows > 0, "shape %d: every row is reached by a nearly tied routing: nothing compared", real);
        pair.backend().set_moe_debug(nullptr, nullptr);
    }
}

/* Each MoE layer alone (moe_block through the moe_rows hook) against dllm__cpu_moe on the same bf16 rows: close
 * outputs; the chosen experts the CPU's except at a reported near-tie of the routing scores (within twice the row's
 * router-logit noise, the GPU's bf16 weights against the CPU's fp32); and a row's output and experts bit for bit the
 * same whether it is computed among 7 rows or 40 (no row depends on the others: the router, expert and shared GEMMs
 * are row-independent, the sums per row). */
TEST(gpu_llada2, moe_layer_matches_cpu_and_rows_are_independent) {
    NEED_GPU();
    test_rng r("gpu_llada2.moe_layer");
    dllm__pool pool(2);
    for (int real = 0; real < 2; real++) {
        const test_llada2_shape s = test_llada2_gpu_shape(real != 0);
        test_llada2_pair pair(s, 41 + real);
        CHECK_MSG(pair.ok(), "shape %d: contexts not made (%s)", real, dllm_last_error());
        if (!pair.ok()) continue;
        const dllm__config &c = pair.m->cfg;
        const int d = c.n_embd, E = c.n_expert, k = c.n_expert_used;
        std::map<int, std::vector<float>> gpu_logits;
        pair.backend().set_moe_debug(nullptr, &gpu_logits);
        for (int l = c.n_dense_layers; l < c.n_layer; l++) {
            const dllm__layer_weights &L = pair.m->layers[(size_t)l];
            std::vector<uint16_t> x40b((size_t)40 * d), out7, out40;
            std::vector<int> e7, e40;
            for (uint16_t &v : x40b) v = dllm__f32_to_bf16(r.normal());
            const std::vector<uint16_t> x7b(x40b.begin(), x40b.begin() + 7 * d);
            CHECK_STATUS(pair.backend().moe_rows((size_t)l, x7b, 7, out7, e7), DLLM_OK, nullptr);
            CHECK_STATUS(pair.backend().moe_rows((size_t)l, x40b, 40, out40, e40), DLLM_OK, nullptr);
            const std::vector<float> glog = gpu_logits[l];  // the 40-row call's
            CHECK_MSG(out40.size() == (size_t)40 * d && memcmp(out7.data(), out40.data(), (size_t)7 * d * 2) == 0 &&
                          std::equal(e7.begin(), e7.begin() + 7 * k, e40.begin()),
                      "shape %d layer %d: rows 0-6 differ between a 7-row and a 40-row call", real, l);
            const std::vector<float> x = test_f32_vec(x40b);
            std::vector<float> want((size_t)40 * d), logits((size_t)40 * E);
            std::vector<float> x_moe = x;  // dllm__cpu_moe quantises its input in place (not at BF16)
            dllm__cpu_moe(*pair.m, L, nullptr, pool, x_moe.data(), 40, want.data());
            dllm__cpu_linear(pool, x.data(), 40, d, *L.router, nullptr, E, logits.data());
            const std::vector<float> got = test_f32_vec(out40);
            std::vector<float> got_alike, want_alike;  // the rows routed alike (a near-tie sums other experts)
            int same = 0, near = 0;
            for (int t = 0; t < 40; t++) {
                const dllm__moe_route cr = dllm__moe_route_token(c, &logits[(size_t)t * E], L.expert_bias.data());
                if (std::equal(cr.expert.begin(), cr.expert.end(), e40.begin() + (long)t * k)) {
                    same++;
                    got_alike.insert(got_alike.end(), got.begin() + (long)t * d, got.begin() + (long)(t + 1) * d);
                    want_alike.insert(want_alike.end(), want.begin() + (long)t * d, want.begin() + (long)(t + 1) * d);
                    continue;
                }
                double noise = 0;
                for (int e = 0; e < E && glog.size() >= (size_t)40 * E; e++)
                    noise = std::max(noise, (double)fabsf(glog[(size_t)t * E + e] - logits[(size_t)t * E + e]));
                int j = 0;
                while (cr.expert[(size_t)j] == e40[(size_t)t * k + j]) j++;
                const int a = e40[(size_t)t * k + j], b = cr.expert[(size_t)j];
                auto score = [&](int e) {
                    return e < 0 ? -1e30
                                 : 1.0 / (1.0 + exp(-(double)logits[(size_t)t * E + e])) + L.expert_bias[(size_t)e];
                };
                const double gap = fabs(score(a) - score(b));
                printf(
                    "    shape %d layer %d row %d slot %d: GPU expert %d, CPU %d, routing gap %.3e, logit noise %.3e\n",
                    real, l, t, j, a, b, gap, noise);
                if (gap <= 2 * noise)  // sigmoid's slope is at most 1/4: a logit error moves a score by less
                    near++;
                else
                    CHECK_MSG(false, "shape %d layer %d row %d: routed apart from the CPU beyond the noise", real, l,
                              t);
            }
            const double err = test_max_rel(got_alike, want_alike);
            printf("    shape %d layer %d: MoE output error %.2e on the %d/40 rows routed alike, %d near-ties\n", real,
                   l, err, same, near);
            CHECK_MSG(same > 0 && err < 3e-2, "shape %d layer %d: MoE output error %.3e", real, l, err);
        }
        pair.backend().set_moe_debug(nullptr, nullptr);
    }
}

/* One generation's steps: the canvas after each and its block. */
struct test_llada2_steps {
    std::vector<std::vector<int32_t>> canvas;
    std::vector<int> block;
    static int record(const dllm_step_info *info, void *user) {
        test_llada2_steps &s = *(test_llada2_steps *)user;
        s.canvas.emplace_back(info->canvas, info->canvas + info->canvas_len);
        s.block.push_back(info->block);
        return 0;
    }
};

/* Whether the first step where two generations differ was decided by a near-tie: on the canvas before it, the block's
 * rows through dllm_logits on both backends (the step's forward, uncached: blocks of 32 are the model's mask block);
 * for each row (the mask id excluded, as the loop excludes it) the CPU's top-two logit gap against twice the row's
 * noise, and its confidence p against the thresholds and the other rows' p within twice the p noise. Prints what it
 * finds. */
static bool test_llada2_near_tie(const test_llada2_pair &pair, const std::vector<int32_t> &before, int block, int B,
                                 double threshold, double edit_threshold) {
    const int V = pair.m->cfg.n_vocab, mask = pair.m->cfg.mask_id, n = (block + 1) * B, r0 = block * B;
    std::vector<int32_t> ids(before.begin(), before.begin() + n);
    std::vector<float> a((size_t)B * V), b((size_t)B * V);
    if (dllm_logits(pair.cpu, ids.data(), n, r0, n, a.data(), a.size()) != DLLM_OK ||
        dllm_logits(pair.gpu, ids.data(), n, r0, n, b.data(), b.size()) != DLLM_OK)
        return false;
    std::vector<double> pa((size_t)B), pb((size_t)B);
    bool near = false;
    for (int i = 0; i < B; i++) {
        float *ra = &a[(size_t)i * V], *rb = &b[(size_t)i * V];
        ra[mask] = rb[mask] = -INFINITY;
        double noise = 0;
        for (int v = 0; v < V; v++)
            if (v != mask) noise = std::max(noise, (double)fabsf(ra[v] - rb[v]));
        std::vector<float> sorted(ra, ra + V);
        std::sort(sorted.begin(), sorted.end(), std::greater<float>());
        pa[(size_t)i] = test_softmax_max(ra, V), pb[(size_t)i] = test_softmax_max(rb, V);
        const double gap = (double)sorted[0] - sorted[1], pnoise = fabs(pa[(size_t)i] - pb[(size_t)i]);
        const bool tie = gap <= 2 * noise || fabs(pa[(size_t)i] - threshold) <= 2 * pnoise ||
                         (edit_threshold >= 0 && fabs(pa[(size_t)i] - edit_threshold) <= 2 * pnoise);
        if (tie)
            printf("      row %d: top-2 gap %.3e (noise %.3e), p %.6f vs GPU %.6f\n", r0 + i, gap, noise, pa[(size_t)i],
                   pb[(size_t)i]);
        near |= tie;
    }
    for (int i = 0; i < B; i++)  // the ranking of the fallback commit
        for (int j = i + 1; j < B; j++) {
            const double pn = std::max(fabs(pa[(size_t)i] - pb[(size_t)i]), fabs(pa[(size_t)j] - pb[(size_t)j]));
            if (before[(size_t)(r0 + i)] == mask && before[(size_t)(r0 + j)] == mask &&
                fabs(pa[(size_t)i] - pa[(size_t)j]) <= 2 * pn) {
                printf("      rows %d and %d: p %.6f and %.6f within the noise %.3e\n", r0 + i, r0 + j,
                       pa[(size_t)i], pa[(size_t)j], pn);
                near = true;
            }
        }
    return near;
}

/* One greedy generation of `prompt` with p on both backends of the pair: the same tokens at every step (1), or a first
 * divergence at a reported near-tie (0; a divergence elsewhere fails). */
static int test_llada2_generate_pair(dllm_test_state &T_, test_llada2_pair &pair, const std::vector<int32_t> &prompt,
                                     const dllm_gen_params &p, const std::string &label) {
    const int B = p.block_length;
    test_llada2_steps sa, sb;
    std::vector<int32_t> out_a((size_t)p.gen_length), out_b((size_t)p.gen_length);
    int na = 0, nb = 0;
    dllm_gen_params pa = p, pb = p;
    pa.on_step = test_llada2_steps::record, pa.on_step_data = &sa;
    pb.on_step = test_llada2_steps::record, pb.on_step_data = &sb;
    CHECK_STATUS(dllm_generate(pair.cpu, prompt.data(), (int)prompt.size(), pa, out_a.data(), (int)out_a.size(), &na,
                               nullptr),
                 DLLM_OK, nullptr);
    CHECK_STATUS(dllm_generate(pair.gpu, prompt.data(), (int)prompt.size(), pb, out_b.data(), (int)out_b.size(), &nb,
                               nullptr),
                 DLLM_OK, nullptr);
    out_a.resize((size_t)na), out_b.resize((size_t)nb);
    if (sa.canvas == sb.canvas && out_a == out_b) {
        printf("    %s (prompt %zu): %zu steps, the same tokens\n", label.c_str(), prompt.size(), sa.canvas.size());
        return 1;
    }
    size_t step = 0;
    while (step < sa.canvas.size() && step < sb.canvas.size() && sa.canvas[step] == sb.canvas[step]) step++;
    std::vector<int32_t> before = prompt;
    if (step > 0) before = sa.canvas[step - 1];
    const int block = step < sa.canvas.size() ? sa.block[step] : sb.block[std::min(step, sb.block.size() - 1)];
    before.resize((size_t)(block + 1) * B, pair.m->cfg.mask_id);  // the block's canvas (a new block starts as masks)
    printf("    %s (prompt %zu): first divergence at step %zu (block %d):\n", label.c_str(), prompt.size(), step,
           block);
    const bool tie = test_llada2_near_tie(pair, before, block, B, p.threshold, p.edit_threshold);
    CHECK_MSG(tie, "%s: the GPU's tokens differ from the CPU's at step %zu, not at a near-tie", label.c_str(), step);
    return 0;
}

/* Greedy generations on both backends, LLaDA2.0's loop and LLaDA2.1's (editing, post steps), prompts ending inside a
 * block and on its boundary: the same tokens at every step, or a first divergence at a reported near-tie. */
TEST(gpu_llada2, generate_tokens_match_cpu_backend) {
    NEED_GPU();
    const test_llada2_shape s = test_llada2_gpu_shape(false);
    test_llada2_pair pair(s, 33);
    CHECK_MSG(pair.ok(), "contexts not made (%s)", dllm_last_error());
    if (!pair.ok()) return;
    std::mt19937 rng(17);
    int equal = 0, compared = 0;
    for (int variant = 0; variant < 4; variant++) {
        std::vector<int32_t> prompt(variant % 2 ? 32 : 11);
        for (int32_t &t : prompt) t = test_llada2_prompt_token(s, rng);
        dllm_gen_params p = dllm_gen_default_params();
        p.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
        p.block_length = 32, p.gen_length = 45, p.steps = 8, p.threshold = 0.03, p.stop_at_eos = 0;
        if (variant >= 2) p.edit_threshold = 0.025, p.max_post_steps = 3;
        equal += test_llada2_generate_pair(T_, pair, prompt, p,
                                           dllm__format("variant %d (%s)", variant, variant >= 2 ? "2.1" : "2.0"));
        compared++;
    }
    const int near = compared - equal;
    printf("    %d generations: %d identical, %d diverged at a reported near-tie\n", compared, equal, near);
    // the step forwards replay CUDA graphs (the routes never leave the device), with the eager forwards' bits
    dllm__gpu_backend &g = pair.backend();
    const int64_t replays = g.bd_graph_count(DLLM__GRAPH_REPLAY), refusals = g.bd_graph_refusals();
    printf("    graphs replayed %lld, updates refused %lld\n", (long long)replays, (long long)refusals);
    CHECK_MSG(replays > 0, "LLaDA2's step forwards replayed no graph");
    for (int variant = 0; variant < 4; variant += 3) {
        std::vector<int32_t> prompt(variant ? 40 : 11);
        for (int32_t &t : prompt) t = test_llada2_prompt_token(s, rng);
        dllm_gen_params p = dllm_gen_default_params();
        p.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
        p.block_length = 32, p.gen_length = 45, p.steps = 8, p.threshold = 0.03, p.stop_at_eos = 0;
        if (variant) p.edit_threshold = 0.025, p.max_post_steps = 3;
        test_llada2_steps runs[2];
        for (int eager = 0; eager < 2; eager++) {
            if (eager) test_knob_set("no_graphs", "1");
            std::vector<int32_t> out((size_t)p.gen_length);
            int n = 0;
            dllm_gen_params pe = p;
            pe.on_step = test_llada2_steps::record, pe.on_step_data = &runs[eager];
            CHECK_STATUS(dllm_generate(pair.gpu, prompt.data(), (int)prompt.size(), pe, out.data(), (int)out.size(),
                                       &n, nullptr),
                         DLLM_OK, nullptr);
            test_knob_reset();
        }
        CHECK_MSG(runs[0].canvas == runs[1].canvas && !runs[0].canvas.empty(),
                  "variant %d: graphs and eager forwards give different steps", variant);
    }
}

/* LLaDA2 under FP8 and every SoloQ precision on the GPU against the CPU backend at the same precision, on a tiny random
 * checkpoint and on models/tiny-llada2: one block-causal forward's logits (45 rows, the last third masks) and greedy
 * generations of both loops (the random checkpoint). The GPU quantises its bf16 activations where the CPU quantises
 * fp32 ones, so codes at a decision threshold differ by a whole step (as gpu_soloq.forward_matches_cpu_soloq_reference
 * explains) and expert choices flip at near-ties: the logits are judged as the dense models' are, the GPU nearer the
 * CPU's quantised logits than the quantisation's own effect (SoloQ: NMSE to the reference below the NMSE the precision
 * moves the CPU's logits by; FP8: nearer the FP8 reference than the exact one, where FP8 moves them by more than 1e-3),
 * and the tokens equal step for step or diverging at a reported near-tie (test_llada2_generate_pair). RTN-W4A4 gets 1.5x
 * the effect: without a rotation its absmax codes put the most elements at a threshold, and on a trained MoE a flipped
 * code can flip an expert too (tiny-llada2, H100: the GPU 2.81e-2 from the CPU's RTN logits, RTN's effect 2.72e-2, the
 * GPU's RTN as far from the exact logits as the CPU's, 3.06e-2). */
TEST(gpu_llada2, quantised_precisions_match_cpu_backend) {
    NEED_GPU();
    const test_llada2_shape s = test_llada2_gpu_shape(false);
    for (dllm_precision p : {DLLM_PRECISION_FP8_FFN, DLLM_PRECISION_FP8_ALL, DLLM_PRECISION_SOLOQ_N,
                             DLLM_PRECISION_SOLOQ_I, DLLM_PRECISION_SOLOQ_C, DLLM_PRECISION_RTN_W4A4,
                             DLLM_PRECISION_SOLOQ_I_W4A16})
        for (int trained = 0; trained < 2; trained++) {
            const char *name = dllm__precision_name(p), *model = trained ? "tiny-llada2" : "random";
            std::unique_ptr<test_llada2_pair> pair(trained ? new test_llada2_pair("models/tiny-llada2", p)
                                                           : new test_llada2_pair(s, 61, p));
            CHECK_MSG(pair->ok(), "%s %s: contexts not made (%s)", model, name, dllm_last_error());
            if (!pair->ok()) continue;
            const bool fp8 = p == DLLM_PRECISION_FP8_FFN || p == DLLM_PRECISION_FP8_ALL;
            if (fp8 && !pair->backend().fp8_ffn_active()) {
                printf("    %s %s: this GPU runs FP8 as BF16 (no FP8 GEMM): not compared\n", model, name);
                continue;
            }
            dllm_ctx *exact = test_ctx(pair->m, DLLM_BACKEND_CPU, 2);
            const dllm__config &c = pair->m->cfg;
            const int n = 45, V = c.n_vocab;
            std::mt19937 rng(7);
            std::vector<int32_t> ids((size_t)n);
            const int32_t below = std::min(c.eos_id > 0 ? c.eos_id : V, c.mask_id > 0 ? c.mask_id : V);
            for (int32_t &t : ids) t = (int32_t)(rng() % (uint32_t)below);
            for (int i = n * 2 / 3; i < n; i++) ids[(size_t)i] = c.mask_id;
            std::vector<float> ref((size_t)n * V, NAN), got(ref.size(), NAN), ex(ref.size(), NAN);
            CHECK_STATUS(dllm_logits(pair->cpu, ids.data(), n, 0, n, ref.data(), ref.size()), DLLM_OK, nullptr);
            CHECK_STATUS(dllm_logits(pair->gpu, ids.data(), n, 0, n, got.data(), got.size()), DLLM_OK, nullptr);
            CHECK(exact && dllm_logits(exact, ids.data(), n, 0, n, ex.data(), ex.size()) == DLLM_OK);
            dllm_ctx_free(exact);
            const double to_ref = test_nmse(got.data(), ref.data(), got.size()),
                         to_exact = test_nmse(got.data(), ex.data(), got.size()),
                         effect = test_nmse(ref.data(), ex.data(), ref.size());
            int argmax_same = 0;
            for (int i = 0; i < n; i++) {
                const float *ra = &ref[(size_t)i * V], *rb = &got[(size_t)i * V];
                argmax_same += std::max_element(ra, ra + V) - ra == std::max_element(rb, rb + V) - rb;
            }
            printf("    %s %s: GPU vs CPU logits NMSE %.2e (vs the CPU's exact %.2e); the precision moves the CPU's "
                   "by %.2e; argmax agrees on %d/%d rows\n",
                   model, name, to_ref, to_exact, effect, argmax_same, n);
            if (fp8)
                CHECK_MSG(effect <= 1e-3 || to_ref < to_exact, "%s %s: the GPU is nearer the exact logits than FP8's",
                          model, name);
            else
                CHECK_MSG(to_ref < (p == DLLM_PRECISION_RTN_W4A4 ? 1.5 : 1.0) * effect,
                          "%s %s: GPU %.3e from the reference, quantisation effect %.3e", model, name, to_ref, effect);
            if (trained) continue;
            for (int variant = 0; variant < 2; variant++) {
                std::vector<int32_t> prompt(variant ? 32 : 11);
                for (int32_t &t : prompt) t = test_llada2_prompt_token(s, rng);
                dllm_gen_params gp = dllm_gen_default_params();
                gp.block_length = 32, gp.gen_length = 45, gp.steps = 8, gp.threshold = 0.03, gp.stop_at_eos = 0;
                if (variant) gp.edit_threshold = 0.025, gp.max_post_steps = 3;
                test_llada2_generate_pair(T_, *pair, prompt, gp,
                                          dllm__format("%s %s (%s)", model, name, variant ? "2.1" : "2.0"));
            }
        }
}

/* [batch] LLaDA2 items through dllm_generate_batch / the stepper on the GPU (the batched block-diffusion forward with
 * the MoE layers, QK-norm + partial RoPE at each row's position): both loops, prompts inside a block and on its
 * boundary, joining and leaving at random steps, each bit-identical to its batch of one (ids, stats, step callbacks,
 * canvases), at `precision` (every stage is row-wise in each format: the quantisers, producers and GEMMs). */
static void test_llada2_batch_items(dllm_test_state &T_, dllm_precision precision) {
    const test_llada2_shape s = test_llada2_gpu_shape(true);
    test_llada2_pair pair(s, 35, precision);
    CHECK_MSG(pair.ok(), "%s: contexts not made (%s)", dllm__precision_name(precision),
              dllm_last_error());
    if (!pair.ok()) return;
    std::mt19937 rng(0x11ad2);
    std::vector<test_stepper_case> cs(7);
    for (size_t i = 0; i < cs.size(); i++) {
        test_stepper_case &c = cs[i];
        const int n_prompt = i == 2 ? 32 : 5 + 7 * (int)i;
        for (int j = 0; j < n_prompt; j++) c.prompt.push_back(test_llada2_prompt_token(s, rng));
        c.params = dllm_gen_default_params();
        c.params.gen_length = 20 + 13 * (int)(i % 3), c.params.block_length = 32, c.params.steps = 4 + (int)(i % 5);
        c.params.stop_at_eos = 0, c.params.threshold = 0.02 + 0.01 * (double)(i % 4);
        if (i % 2) c.params.edit_threshold = 0.025, c.params.max_post_steps = (int)(i % 3);
        c.out_capacity = c.params.gen_length;
        c.what = dllm__format("GPU llada2 %s case %zu", dllm__precision_name(precision), i);
        test_stepper_run_alone(pair.gpu, c, 0, true);
        CHECK_MSG(c.status_alone == DLLM_OK, "%s: %s alone", c.what.c_str(), dllm_status_str(c.status_alone));
    }
    for (int max_sequences : {3, 10}) {
        const std::string label =
            dllm__format("GPU llada2 %s max %d", dllm__precision_name(precision), max_sequences);
        test_stepper_drive(T_, pair.gpu, cs, rng, max_sequences, label.c_str());
        for (test_stepper_case &c : cs) test_stepper_check_case(T_, pair.gpu, c, label.c_str(), true);
    }
}


TEST(gpu_llada2, batch_items_equal_batch_of_one) {
    NEED_GPU();
    test_llada2_batch_items(T_, DLLM_PRECISION_BF16);
}

/* The same under FP8 and the SoloQ precisions. */
TEST(gpu_llada2, quantised_batch_items_equal_batch_of_one) {
    NEED_GPU();
    for (dllm_precision p : {DLLM_PRECISION_FP8_ALL, DLLM_PRECISION_SOLOQ_I, DLLM_PRECISION_SOLOQ_N,
                             DLLM_PRECISION_SOLOQ_C, DLLM_PRECISION_RTN_W4A4})
        test_llada2_batch_items(T_, p);
}

/* [FACache] on the GPU: layer 0 of every forward over committed blocks takes the split attention in every lacache mode,
 * so LaCache on and off give the same tokens and confidences step for step (the GPU's own invariant, as for the other
 * block-diffusion models), for both loops; with it on, rows are reused. */
TEST(gpu_llada2, facache_on_and_off_give_the_same_steps) {
    NEED_GPU();
    const test_llada2_shape s = test_llada2_gpu_shape(false);
    test_llada2_pair pair(s, 35);
    CHECK_MSG(pair.ok(), "contexts not made (%s)", dllm_last_error());
    if (!pair.ok()) return;
    std::mt19937 rng(19);
    for (int variant = 0; variant < 2; variant++) {
        std::vector<int32_t> prompt(40);
        for (int32_t &t : prompt) t = test_llada2_prompt_token(s, rng);
        dllm_gen_params p = dllm_gen_default_params();
        p.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
        p.block_length = 16, p.gen_length = 40, p.steps = 4, p.threshold = 0.03, p.stop_at_eos = 0;
        if (variant) p.edit_threshold = 0.025, p.max_post_steps = 2;
        test_llada2_steps on, off;
        std::vector<int32_t> out_on((size_t)p.gen_length), out_off((size_t)p.gen_length);
        int n_on = 0, n_off = 0;
        dllm_gen_stats stats = {};
        dllm_gen_params a = p, b = p;
        a.lacache = DLLM_LACACHE_ON, a.on_step = test_llada2_steps::record, a.on_step_data = &on;
        b.lacache = DLLM_LACACHE_OFF, b.on_step = test_llada2_steps::record, b.on_step_data = &off;
        CHECK_STATUS(dllm_generate(pair.gpu, prompt.data(), (int)prompt.size(), a, out_on.data(), (int)out_on.size(),
                                   &n_on, &stats),
                     DLLM_OK, nullptr);
        CHECK_STATUS(dllm_generate(pair.gpu, prompt.data(), (int)prompt.size(), b, out_off.data(), (int)out_off.size(),
                                   &n_off, nullptr),
                     DLLM_OK, nullptr);
        printf("    variant %d: %zu and %zu steps; LaCache reused %lld of %lld layer-0 rows\n", variant,
               on.canvas.size(), off.canvas.size(), (long long)stats.facache_rows_reused,
               (long long)stats.facache_rows);
        CHECK_MSG(on.canvas == off.canvas && n_on == n_off &&
                      std::equal(out_on.begin(), out_on.begin() + n_on, out_off.begin()),
                  "variant %d: LaCache on and off decode differently on the GPU", variant);
    }
}

/* The device copy is built a layer at a time: while a context is created, the device holds at most the copy it ends
 * with plus one layer in BF16. LLaDA2.0-mini's widths with 4 layers (random weights; one MoE layer is 1.6 GB in BF16,
 * the model 6.3 GB): in FP8 and SoloQ-I the peak of dllm's device memory stays under that bound, which the whole model
 * in BF16 at once would pass by about 2 GB. */
TEST(gpu_llada2, quantised_weights_are_built_a_layer_at_a_time) {
    NEED_GPU();
    std::string cfg = test_read_file(test_data("real-configs/llada2-mini.dfactory.config.json"));
    const size_t layers = cfg.find("\"num_hidden_layers\": 20"), type = cfg.find("llada2_moe_veomni");
    CHECK(layers != std::string::npos && type != std::string::npos);
    if (layers == std::string::npos || type == std::string::npos) return;
    cfg.replace(layers, 23, "\"num_hidden_layers\": 4");
    cfg.replace(cfg.find("llada2_moe_veomni"), 17, "llada2_moe");
    test_tmpdir dir;
    CHECK(test_write_file(dir.file("config.json"), cfg));
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load_random(dir.file("config.json").c_str(), 3, &m), DLLM_OK, nullptr);
    if (!m) return;
    const dllm__config &c = m->cfg;
    CHECK(c.n_layer == 4 && c.n_expert == 256);
    const double d = c.n_embd, attn = d * (c.n_head + 2 * c.n_head_kv) * c.head_dim + d * c.n_head * c.head_dim;
    const double experts = 3.0 * d * ((double)c.n_ff_expert * c.n_expert + c.n_ff_shared);
    const double moe_layer = 2.0 * (attn + d * c.n_expert + experts);
    for (dllm_precision p : {DLLM_PRECISION_FP8_FFN, DLLM_PRECISION_SOLOQ_I}) {
        cudaDeviceSynchronize();
        const int64_t before = dllm__device_bytes;
        dllm__device_peak = before;
        dllm_ctx_params cp = dllm_ctx_default_params();
        cp.backend = DLLM_BACKEND_GPU, cp.max_tokens = 64, cp.precision = p;
        dllm_ctx *ctx = nullptr;
        CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
        const double held = (double)(dllm__device_bytes - before), peak = (double)(dllm__device_peak - before);
        printf("    %s: the context holds %.2f GB, peaked at %.2f GB while built (bound %.2f: + one BF16 layer)\n",
               dllm__precision_name(p), held / 1e9, peak / 1e9, (held + moe_layer) / 1e9);
        CHECK_MSG(peak <= held + moe_layer, "%s: peak %.2f GB over %.2f + %.2f", dllm__precision_name(p), peak / 1e9,
                  held / 1e9, moe_layer / 1e9);
        dllm_ctx_free(ctx);
    }
    dllm_model_free(m);
}

/* What the GPU path does not take yet (K/V quantisation) is refused with the setting to change, every precision is
 * taken; AUTO takes the GPU backend; LLaDA2 batches through the block-diffusion forward, not the plain one. */
TEST(gpu_llada2, refusals_name_the_setting) {
    NEED_GPU();
    const test_llada2_shape s = test_llada2_gpu_shape(false);
    test_tmpdir dir;
    test_llada2_write(dir, s, test_llada2_random(s, 3));
    dllm_model *m = test_load(dir.path);
    if (!m) {
        CHECK(false);
        return;
    }
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_GPU;
    dllm_ctx *ctx = nullptr;
    cp.kv_quant = DLLM_KV_QUANT_SOLOQ_KV4;
    CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_ERR_UNSUPPORTED, "--kv-quant");
    dllm_ctx_free(ctx), ctx = nullptr;
    for (dllm_precision p : {DLLM_PRECISION_FP8_FFN, DLLM_PRECISION_SOLOQ_N}) {  // built: taken
        cp = dllm_ctx_default_params(), cp.backend = DLLM_BACKEND_GPU, cp.precision = p;
        CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
        dllm_ctx_free(ctx), ctx = nullptr;
    }
    cp = dllm_ctx_default_params(), cp.backend = DLLM_BACKEND_AUTO;
    CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
    if (ctx) CHECK(dllm_ctx_get_backend(ctx) == DLLM_BACKEND_GPU);
    dllm_ctx_free(ctx), ctx = nullptr;
    cp = dllm_ctx_default_params(), cp.backend = DLLM_BACKEND_GPU;
    CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
    if (ctx) {
        const dllm__batch_caps caps = ctx->impl->batch_caps();
        CHECK_MSG(caps.plain.find("LLaDA2") != std::string::npos, "batch caps: \"%s\"", caps.plain.c_str());
        // it batches through the block-diffusion forward
        CHECK_MSG(caps.block_diffusion.empty(), "batch caps: \"%s\"", caps.block_diffusion.c_str());
    }
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* The tiny trained LLaDA2 (models/tiny-llada2): its card's greedy samples decoded on the GPU as on the CPU (or apart
 * from a reported near-tie), and dllm-eval's masked-token NLL on the GPU within 2% of the card's float64 figures
 * (the GPU's activations are bf16). */
TEST(gpu_llada2, tiny_trained_model_decodes_as_the_cpu) {
    NEED_GPU();
    test_llada2_pair pair("models/tiny-llada2");
    CHECK_MSG(pair.ok(), "contexts not made (%s)", dllm_last_error());
    if (!pair.ok()) return;
    const std::vector<test_llada2_sample> samples = test_llada2_card_samples(T_);
    int equal = 0;
    for (size_t k = 0; k < samples.size(); k++)
        equal +=
            test_llada2_generate_pair(T_, pair, samples[k].prompt, samples[k].params, dllm__format("sample %zu", k));
    printf("    %zu samples: %d identical on both backends\n", samples.size(), equal);
    test_nll_matches_card(T_, "tiny-llada2", "gpu", 0.02);
}
