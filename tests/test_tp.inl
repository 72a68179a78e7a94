/* Tests: tensor parallelism (section 10b, issue 29) on the CPU: the sharding plan on the real configs and the tiny
 * models, the CPU reference of the sharded forward against the unsharded one, the vocab-split token choice, the
 * device list of dllm_ctx_params and --devices, and NCCL through dlopen. No GPU path exists yet. */

/* Every split dimension of every weight is tiled by the ranks' slices in rank order, exactly, and the replicated
 * tensors are whole; each rank's query heads read only its own K/V heads. */
static void test_tp_check_plan(dllm_test_state &T_, const dllm__config &c, int n, const char *what) {
    std::vector<dllm__tp_plan> plans;
    dllm_status st = dllm__tp_shard_all(c, n, plans);
    CHECK_MSG(st == DLLM_OK && (int)plans.size() == n, "%s TP=%d: %s", what, n, dllm_last_error());
    if (st != DLLM_OK) return;
    const std::vector<dllm__wspec> specs = dllm__expected_weights(c);
    for (size_t w = 0; w < specs.size(); w++) {
        const dllm__wspec &spec = specs[w];
        const bool cols = spec.kind == DLLM__W_O || spec.kind == DLLM__W_DOWN;
        const int64_t full = cols ? spec.shape[1] : spec.shape[0];
        int64_t next = 0;
        for (int r = 0; r < n; r++) {
            const dllm__tp_slice &s = plans[(size_t)r].slices[w];
            CHECK_MSG(s.spec.name == spec.name && s.spec.shape == spec.shape, "%s TP=%d: slice %zu is %s", what, n, w,
                      s.spec.name.c_str());
            const bool whole =
                spec.kind == DLLM__W_ATTN_NORM || spec.kind == DLLM__W_FFN_NORM || spec.kind == DLLM__W_FINAL_NORM;
            const dllm__tp_split want = whole ? DLLM__TP_WHOLE : cols ? DLLM__TP_COLS : DLLM__TP_ROWS;
            CHECK_MSG(s.split == want, "%s TP=%d: %s split %d, want %d", what, n, spec.name.c_str(), (int)s.split,
                      (int)want);
            if (whole) {
                CHECK_MSG(s.begin == 0 && s.end == full, "%s TP=%d: %s is not whole", what, n, spec.name.c_str());
                continue;
            }
            CHECK_MSG(s.begin == next && s.end - s.begin == full / n,
                      "%s TP=%d rank %d: %s holds [%lld, %lld), want [%lld, +%lld)", what, n, r, spec.name.c_str(),
                      (long long)s.begin, (long long)s.end, (long long)next, (long long)(full / n));
            next = s.end;
        }
        if (spec.kind != DLLM__W_ATTN_NORM && spec.kind != DLLM__W_FFN_NORM && spec.kind != DLLM__W_FINAL_NORM)
            CHECK_MSG(next == full, "%s TP=%d: %s tiled up to %lld of %lld", what, n, spec.name.c_str(),
                      (long long)next, (long long)full);
    }
    const int group = c.n_head / c.n_head_kv;
    for (const dllm__tp_plan &p : plans) {
        CHECK(p.n_head * n == c.n_head && p.n_head_kv * n == c.n_head_kv && p.n_ff * n == c.n_ff &&
              p.n_vocab * n == c.n_vocab);
        for (int h = p.head0; h < p.head0 + p.n_head; h++)
            CHECK_MSG(h / group >= p.kv_head0 && h / group < p.kv_head0 + p.n_head_kv,
                      "%s TP=%d rank %d: head %d reads K/V head %d outside [%d, %d)", what, n, p.rank, h, h / group,
                      p.kv_head0, p.kv_head0 + p.n_head_kv);
    }
}

/* TP=n must fail, naming the count that does not divide and the device counts that would. */
static void test_tp_check_refused(dllm_test_state &T_, const dllm__config &c, int n, const char *count_named,
                                  const char *valid) {
    dllm__tp_plan p;
    CHECK_STATUS(dllm__tp_shard(c, n, 0, p), DLLM_ERR_INVALID_ARGUMENT, count_named);
    CHECK_MSG(strstr(dllm_last_error(), "n_devices") && strstr(dllm_last_error(), valid),
              "TP=%d: \"%s\" lacks n_devices or \"%s\"", n, dllm_last_error(), valid);
}

static bool test_tp_real_config(const char *name, dllm__config &c) {
    return test_config(test_read_file(test_data(dllm__format("real-configs/%s.config.json", name).c_str())), c) ==
           DLLM_OK;
}

TEST(tp, shard_plan_on_the_real_configs) {
    dllm__config llada, fast;
    if (!test_tp_real_config("llada-8b-instruct", llada) || !test_tp_real_config("fast-dllm-v2-7b", fast)) {
        CHECK_MSG(false, "%s", dllm_last_error());
        return;
    }
    for (int n : {1, 2, 4, 8})
        test_tp_check_plan(T_, llada, n, "LLaDA-8B");  // 32 heads, 32 KV heads, 12288 FFN, 126464 vocab
    test_tp_check_refused(T_, llada, 3, "32 attention heads", "1, 2, 4, 8");
    for (int n : {1, 2, 4}) test_tp_check_plan(T_, fast, n, "Fast-dLLM v2 7B");  // 28 heads, 4 KV heads (GQA 7)
    test_tp_check_refused(T_, fast, 8, "28 attention heads", "1, 2, 4");
    test_tp_check_refused(T_, fast, 3, "28 attention heads", "1, 2, 4");
    dllm__config odd = llada;
    odd.n_vocab = 126466;  // 2 * 63233: TP 2 splits it, TP 4 does not
    test_tp_check_plan(T_, odd, 2, "LLaDA-8B, vocab 126466");
    test_tp_check_refused(T_, odd, 4, "126466 vocabulary rows", "1, 2");
    odd = llada;
    odd.n_ff = 12290;
    test_tp_check_refused(T_, odd, 4, "12290 FFN columns", "1, 2");
    dllm__tp_plan p;
    CHECK_STATUS(dllm__tp_shard(llada, 0, 0, p), DLLM_ERR_INVALID_ARGUMENT, "must be in [1, 8]");
    CHECK_STATUS(dllm__tp_shard(llada, 9, 0, p), DLLM_ERR_INVALID_ARGUMENT, "must be in [1, 8]");
    CHECK_STATUS(dllm__tp_shard(llada, 2, 2, p), DLLM_ERR_INVALID_ARGUMENT, "rank 2 outside [0, 2)");
    CHECK_STATUS(dllm__tp_shard(llada, 2, -1, p), DLLM_ERR_INVALID_ARGUMENT, "rank -1");
}

TEST(tp, shard_plan_on_the_tiny_models) {
    struct { const char *model; int ok_up_to; int refused; const char *named; } cases[] = {
        {"models/tiny-llada", 4, 8, "4 attention heads"},  // 4 heads, 4 KV heads
        {"models/tiny-dream", 2, 4, "2 key/value heads"},  // 4 heads, 2 KV heads, q/k/v biases
        {"models/tiny-fast-dllm-v2", 2, 4, "2 key/value heads"},
        {"models/tiny-add", 2, 4, "2 attention heads"},
        {"tests/data/tiny-llada-hd24", 2, 4, "2 key/value heads"},
        {"tests/data/tiny-dream", 1, 2, "3 attention heads"},
        {"tests/data/tiny-nemotron-diffusion", 1, 2, "131 vocabulary rows"},
    };
    for (auto &k : cases) {
        dllm_model *m = test_load(k.model);
        if (!m) { CHECK(m != nullptr); continue; }
        for (int n = 1; n <= k.ok_up_to; n *= 2) test_tp_check_plan(T_, m->cfg, n, k.model);
        dllm__tp_plan p;
        CHECK_STATUS(dllm__tp_shard(m->cfg, k.refused, 0, p), DLLM_ERR_INVALID_ARGUMENT, k.named);
        dllm_model_free(m);
    }
}

/* A random canvas of n ids with some mask ids, its rows [r0, r1) through the unsharded CPU forward and through the
 * CPU reference of the sharded one at TP=n_ranks. */
struct test_tp_forward {
    std::vector<int32_t> ids;
    int r0 = 0, r1 = 0;
    std::vector<float> plain, sharded;
};

static bool test_tp_run(dllm_test_state &T_, const dllm_model &m, int n_ranks, uint32_t seed, int n,
                        test_tp_forward &f) {
    const dllm__config &c = m.cfg;
    std::mt19937 rng(seed);
    f.ids.resize((size_t)n);
    for (int32_t &id : f.ids) id = rng() % 4 == 0 ? c.mask_id : (int32_t)(rng() % (uint32_t)c.n_vocab);
    f.r0 = (int)(rng() % (uint32_t)(n / 2)), f.r1 = n - (int)(rng() % 3);
    const size_t count = (size_t)(f.r1 - f.r0) * c.n_vocab;
    f.plain.assign(count, NAN), f.sharded.assign(count, NAN);
    dllm__pool pool(2);
    dllm__cpu_buffers b;
    std::vector<float> cos_t, sin_t;
    dllm__rope_tables_cfg(c, n, cos_t, sin_t);
    dllm__cpu_forward(m, pool, b, f.ids.data(), n, dllm__cpu_rows(), nullptr, cos_t.data(), sin_t.data(), f.r0, f.r1,
                      f.plain.data());
    std::vector<dllm__tp_plan> plans;
    if (dllm__tp_shard_all(c, n_ranks, plans) != DLLM_OK) { CHECK_MSG(false, "%s", dllm_last_error()); return false; }
    dllm__tp_cpu_forward(m, plans, pool, f.ids.data(), n, cos_t.data(), sin_t.data(), f.r0, f.r1, f.sharded.data());
    return true;
}

TEST(tp, cpu_reference_at_tp1_is_the_cpu_forward_bit_for_bit) {
    for (const char *name : {"models/tiny-llada", "models/tiny-dream", "tests/data/tiny-dream"}) {
        dllm_model *m = test_load(name);
        if (!m) { CHECK(m != nullptr); continue; }
        test_tp_forward f;
        if (test_tp_run(T_, *m, 1, 5, 23, f))
            CHECK_MSG(!memcmp(f.plain.data(), f.sharded.data(), f.plain.size() * sizeof(float)),
                      "%s: TP=1 logits differ from dllm__cpu_forward's", name);
        dllm_model_free(m);
    }
}

/* TP=2 and TP=4 logits within fp32 rounding of TP=1 (only the O and down sums are split), not bit-identical (they
 * are reduced in another order: the sharded path is really taken), and the same argmax on every row whose top two
 * logits are further apart than the tolerance. Tolerances relative to the largest |logit|, measured over five canvases
 * each: up to 7e-7 for the language models; tiny-add (trained to add, sharp attention) amplifies the reordering to
 * 1.5e-5. */
TEST(tp, cpu_reference_at_tp2_tp4_matches_tp1_within_rounding) {
    struct {
        const char *model;
        int n_ranks;
        double rel_tol;
    } cases[] = {{"models/tiny-llada", 2, 4e-6},
                 {"models/tiny-llada", 4, 4e-6},
                 {"models/tiny-dream", 2, 4e-6},
                 {"models/tiny-add", 2, 1e-4},
                 {"tests/data/tiny-llada-hd24", 2, 4e-6}};
    for (auto &k : cases) {
        dllm_model *m = test_load(k.model);
        if (!m) { CHECK(m != nullptr); continue; }
        test_tp_forward f;
        if (!test_tp_run(T_, *m, k.n_ranks, 11 + (uint32_t)k.n_ranks, 29, f)) { dllm_model_free(m); continue; }
        const int V = m->cfg.n_vocab, rows = f.r1 - f.r0;
        double max_diff = 0, max_abs = 0;
        for (size_t i = 0; i < f.plain.size(); i++) {
            max_diff =
                std::max(max_diff, (double)fabsf(f.plain[i] - f.sharded[i]));  // NaN poison left anywhere fails below
            max_abs = std::max(max_abs, (double)fabsf(f.plain[i]));
            if (f.sharded[i] != f.sharded[i]) max_diff = INFINITY;
        }
        const double tol = k.rel_tol * std::max(1.0, max_abs);
        CHECK_MSG(max_diff <= tol && max_diff > 0, "%s TP=%d: max |logit diff| %g (tolerance %g, must be > 0)", k.model,
                  k.n_ranks, max_diff, tol);
        int argmax_differs = 0;
        for (int t = 0; t < rows; t++) {
            const float *a = f.plain.data() + (size_t)t * V, *b = f.sharded.data() + (size_t)t * V;
            const int ia = (int)(std::max_element(a, a + V) - a), ib = (int)(std::max_element(b, b + V) - b);
            float second = -INFINITY;
            for (int v = 0; v < V; v++)
                if (v != ia) second = std::max(second, a[v]);
            if (ia != ib && a[ia] - second > 2 * tol) argmax_differs++;
        }
        CHECK_MSG(argmax_differs == 0, "%s TP=%d: %d rows choose another token without a near-tie", k.model, k.n_ranks,
                  argmax_differs);
        dllm_model_free(m);
    }
}

/* Greedy decoding end to end: every step forwards the canvas, chooses x0 at every mask (TP: dllm__tp_choose over the
 * ranks' vocabulary slices; TP=1: dllm__choose) and commits the most confident one. TP=2 and TP=4 give TP=1's
 * tokens. */
static std::vector<int32_t> test_tp_greedy(dllm_test_state &T_, const dllm_model &m, int n_ranks, int n_prompt,
                                           int n_gen) {
    const dllm__config &c = m.cfg;
    const int n = n_prompt + n_gen, V = c.n_vocab;
    std::vector<int32_t> canvas((size_t)n, c.mask_id);
    for (int i = 0; i < n_prompt; i++) canvas[(size_t)i] = (int32_t)(1 + (i * 37) % (V - 2));
    std::vector<dllm__tp_plan> plans;
    if (dllm__tp_shard_all(c, n_ranks, plans) != DLLM_OK) { CHECK_MSG(false, "%s", dllm_last_error()); return canvas; }
    dllm__pool pool(2);
    dllm__cpu_buffers b;
    std::vector<float> cos_t, sin_t, logits((size_t)n * V);
    dllm__rope_tables_cfg(c, n, cos_t, sin_t);
    dllm__sampling s;
    for (int step = 0; step < n_gen; step++) {
        std::fill(logits.begin(), logits.end(), NAN);
        if (n_ranks == 1)
            dllm__cpu_forward(m, pool, b, canvas.data(), n, dllm__cpu_rows(), nullptr, cos_t.data(), sin_t.data(), 0, n,
                              logits.data());
        else dllm__tp_cpu_forward(m, plans, pool, canvas.data(), n, cos_t.data(), sin_t.data(), 0, n, logits.data());
        int best_pos = -1;
        dllm__choice best{};
        for (int pos = n_prompt; pos < n; pos++) {
            if (canvas[(size_t)pos] != c.mask_id) continue;
            const float *row = logits.data() + (size_t)dllm__logit_row(c, pos) * V;
            dllm__choice ch = dllm__choose(row, V, s, (uint32_t)pos, (uint32_t)step);
            if (n_ranks > 1) {
                std::vector<const float *> parts;
                for (const dllm__tp_plan &p : plans) parts.push_back(row + p.vocab0);
                CHECK(dllm__tp_choose(parts, plans, s, (uint32_t)pos, (uint32_t)step, ch) == DLLM_OK);
            }
            if (best_pos < 0 || ch.conf > best.conf) best_pos = pos, best = ch;
        }
        canvas[(size_t)best_pos] = best.token;
    }
    return canvas;
}

TEST(tp, greedy_tokens_at_tp2_tp4_equal_tp1) {
    struct {
        const char *model;
        int n_ranks;
    } cases[] = {{"models/tiny-llada", 2}, {"models/tiny-llada", 4}, {"models/tiny-dream", 2}};
    for (auto &k : cases) {
        dllm_model *m = test_load(k.model);
        if (!m) { CHECK(m != nullptr); continue; }
        std::vector<int32_t> one = test_tp_greedy(T_, *m, 1, 7, 12), tp = test_tp_greedy(T_, *m, k.n_ranks, 7, 12);
        CHECK_MSG(one == tp, "%s TP=%d: greedy canvas differs from TP=1's", k.model, k.n_ranks);
        int masks = 0;
        for (int32_t id : tp) masks += id == m->cfg.mask_id;
        CHECK_MSG(masks == 0, "%s: %d masks left", k.model, masks);
        dllm_model_free(m);
    }
}

/* The vocab-split token choice against dllm__choose on random rows with planted ties (inside a rank and across a rank
 * boundary), -inf and NaN logits, every ranking key, argmax and Gumbel-max, EOS options: the same token and deferral
 * exactly, the confidence within float64 rounding (its sums are associated per rank). */
TEST(tp, vocab_split_choice_equals_the_unsharded_one) {
    std::mt19937 rng(29);
    std::uniform_real_distribution<float> logit(-8.0f, 8.0f);
    const dllm_remasking keys[] = {DLLM_REMASK_LOW_CONFIDENCE, DLLM_REMASK_MARGIN, DLLM_REMASK_ENTROPY,
                                   DLLM_REMASK_RANDOM};
    int checked = 0, tied_rows = 0;
    for (int V : {4096, 1000, 8 * 97}) {
        dllm__config c;
        c.n_head = c.n_head_kv = 8, c.head_dim = 4, c.n_embd = 32, c.n_ff = 64, c.n_layer = 1, c.n_vocab = V;
        for (int n_ranks : {1, 2, 4, 8}) {
            std::vector<dllm__tp_plan> plans;
            if (dllm__tp_shard_all(c, n_ranks, plans) != DLLM_OK) {
                CHECK_MSG(V % n_ranks != 0, "V %d TP=%d: %s", V, n_ranks, dllm_last_error());
                continue;
            }
            for (int trial = 0; trial < 24; trial++) {
                std::vector<float> row((size_t)V);
                for (float &l : row) l = logit(rng);
                const float top = 9.0f;
                if (trial % 3 == 0) {  // ties for the largest: one in the middle, one on each side of a rank boundary
                    const int b = V / n_ranks;
                    row[(size_t)(V / 3)] = row[(size_t)(b - 1)] = row[(size_t)(std::min(V - 1, b))] = top;
                    tied_rows++;
                }
                if (trial % 4 == 1)
                    row[(size_t)(rng() % (uint32_t)V)] = NAN, row[(size_t)(rng() % (uint32_t)V)] = -INFINITY;
                if (trial == 23) std::fill(row.begin(), row.end(), -INFINITY);
                dllm__sampling s;
                s.remasking = keys[trial % 4];
                s.temperature = trial % 2 ? 0.7 : 0.0;
                s.tempered_conf = trial % 5 == 0;
                s.seed = 1000 + (uint64_t)trial;
                s.eos_id = (int32_t)(V - 1 - trial), s.eot_id = (int32_t)(trial * 13 % V);
                s.eos_logit_inf = trial % 6 == 2;
                s.defer_eos_eot = trial % 7 == 3;
                if (trial % 8 == 5)
                    row[(size_t)s.eos_id] = row[(size_t)s.eot_id] = top + 1;  // EOS / EoT win: deferral, eos_logit_inf
                const uint32_t pos = (uint32_t)(trial * 3), step = (uint32_t)trial;
                dllm__choice want = dllm__choose(row.data(), V, s, pos, step), got{-7, NAN, true};
                std::vector<const float *> parts;
                for (const dllm__tp_plan &p : plans) parts.push_back(row.data() + p.vocab0);
                CHECK(dllm__tp_choose(parts, plans, s, pos, step, got) == DLLM_OK);
                const bool conf_ok =
                    got.conf == want.conf || fabs(got.conf - want.conf) <= 1e-12 * std::max(1.0, fabs(want.conf));
                CHECK_MSG(got.token == want.token && got.deferred == want.deferred && conf_ok,
                          "V %d TP=%d trial %d: token %d/%d deferred %d/%d conf %.17g/%.17g", V, n_ranks, trial,
                          got.token, want.token, got.deferred, want.deferred, got.conf, want.conf);
                checked++;
            }
        }
    }
    CHECK(checked > 200 && tied_rows > 50);
    dllm__sampling filtered;
    filtered.top_k = 5;
    std::vector<dllm__tp_plan> plans;
    dllm__config c;
    c.n_head = c.n_head_kv = 2, c.head_dim = 4, c.n_embd = 8, c.n_ff = 8, c.n_layer = 1, c.n_vocab = 64;
    std::vector<float> row(64, 1.0f);
    dllm__choice ch;
    CHECK(dllm__tp_shard_all(c, 2, plans) == DLLM_OK);
    CHECK_STATUS(dllm__tp_choose({row.data(), row.data() + 32}, plans, filtered, 0, 0, ch), DLLM_ERR_UNSUPPORTED,
                 "top-k");
}

/* The planted tie across the rank boundary goes to the lower index, as unsharded: checked directly, TP=2, argmax. */
TEST(tp, vocab_split_tie_across_ranks_goes_to_the_lower_index) {
    dllm__config c;
    c.n_head = c.n_head_kv = 2, c.head_dim = 4, c.n_embd = 8, c.n_ff = 8, c.n_layer = 1, c.n_vocab = 64;
    std::vector<dllm__tp_plan> plans;
    if (dllm__tp_shard_all(c, 2, plans) != DLLM_OK) { CHECK(false); return; }
    std::vector<float> row(64, 0.0f);
    row[31] = row[32] = row[40] = 3.0f;
    dllm__sampling s;
    dllm__choice ch{-1, 0, false};
    CHECK(dllm__tp_choose({row.data(), row.data() + 32}, plans, s, 0, 0, ch) == DLLM_OK);
    CHECK_MSG(ch.token == 31 && ch.token == dllm__choose(row.data(), 64, s, 0, 0).token, "token %d", ch.token);
    s.remasking = DLLM_REMASK_MARGIN;  // the second largest is the tied 3.0: margin 0
    CHECK(dllm__tp_choose({row.data(), row.data() + 32}, plans, s, 0, 0, ch) == DLLM_OK);
    CHECK_MSG(ch.conf == 0.0, "margin %g", ch.conf);
}

/* dllm_ctx_params' device list: every bad field named; one listed device is a plain context; more than one is the GPU
 * backend's, which is not built (without a GPU: which device is not usable). */
TEST(tp, ctx_device_list_is_validated) {
    dllm_model *m = test_load("models/tiny-llada");
    if (!m) { CHECK(m != nullptr); return; }
    dllm_ctx_params d = dllm_ctx_default_params();
    CHECK(d.n_devices == 0 && d.devices[0] == 0 && d.devices[1] == 1 &&
          d.devices[DLLM_MAX_DEVICES - 1] == DLLM_MAX_DEVICES - 1);
    d.backend = DLLM_BACKEND_CPU;
    d.n_threads = 2;
    dllm_ctx *ctx = nullptr;
    dllm_ctx_params p = d;
    p.n_devices = -1;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "n_devices (--devices) -1 must be in [0, 8]");
    p.n_devices = DLLM_MAX_DEVICES + 1;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "n_devices (--devices) 9");
    p = d, p.n_devices = 2, p.devices[1] = 0;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT,
                 "devices[0] and devices[1] are both CUDA device 0");
    p = d, p.n_devices = 3, p.devices[2] = -4;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "devices[2] = -4");
    p = d, p.n_devices = 8;  // tiny-llada has 4 heads
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT,
                 "4 attention heads do not split evenly over 8 ranks");
    p = d, p.n_devices = 2;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_UNSUPPORTED, "GPU backend only");
    CHECK(ctx == nullptr);
    p.backend = DLLM_BACKEND_GPU;
    std::string why;
    const bool gpu0 = dllm__gpu_usable(0, why), gpu1 = dllm__gpu_usable(1, why);
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), gpu0 && gpu1 ? DLLM_ERR_UNSUPPORTED : DLLM_ERR_NO_DEVICE,
                 gpu0 && gpu1 ? "not built yet" : "is not usable");
    CHECK(ctx == nullptr);
    p = d, p.n_devices = 1, p.devices[0] = 5;  // one device: a plain context (the CPU backend ignores the ordinal)
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_OK, nullptr);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(tp, cli_devices_option) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    // test_llada runs on the CPU backend: a well-formed list is refused there, naming the flag to drop
    const char *cases[][2] = {{"-p hi -n 8 --devices 0,0", "drop --devices"},
                              {"-p hi -n 8 --devices 0,1", "drop --devices"},
                              {"-p hi -n 8 --devices 3", "drop --devices"},
                              {"-p hi -n 8 --devices 0,,1", "--devices must be up to 8 comma-separated GPU ordinals"},
                              {"-p hi -n 8 --devices 0,1,2,3,4,5,6,7,8", "--devices must be up to 8"},
                              {"-p hi -n 8 --devices x", "--devices"}};
    for (auto &c : cases) {
        std::string out, err;
        int rc = test_run_cli("dllm-generate", std::string(test_llada) + c[0], "", out, err);
        CHECK_MSG(rc == 1 && test_one_line(err) && err.find(c[1]) != std::string::npos, "`%s`: exit %d, stderr %s",
                  c[0], rc, err.c_str());
    }
}

/* NCCL through dlopen: where it is installed, the table resolves and ncclGetVersion answers (no GPU needed). */
TEST(tp, nccl_loads_through_dlopen_and_reports_its_version) {
    dllm__nccl_api api;
    if (dllm__nccl_open(dllm__nccl_candidates(), api) != DLLM_OK) SKIP("NCCL (libnccl.so.2) is not installed here");
    CHECK_MSG(api.version >= 20900 && api.version / 10000 == 2, "version code %d", api.version);
    CHECK(api.ncclAllReduce && api.ncclCommInitAll && api.ncclCommInitRank && api.ncclGroupStart && api.ncclGroupEnd &&
          api.ncclCommDestroy && api.ncclGetUniqueId);
    const char *ok = api.ncclGetErrorString(DLLM__NCCL_SUCCESS);
    CHECK(ok && *ok);
    CHECK_STATUS(dllm__load_nccl(), DLLM_OK, nullptr);
    CHECK(dllm__nccl.version == api.version);
}

TEST(tp, nccl_missing_or_wrong_library_is_a_clear_error) {
    dllm__nccl_api api;
    CHECK_STATUS(dllm__nccl_open({"/nonexistent-dir/libnccl.so.2"}, api), DLLM_ERR_NO_DEVICE,
                 "cannot load libnccl.so.2");
    CHECK(strstr(dllm_last_error(), "/nonexistent-dir/libnccl.so.2") && strstr(dllm_last_error(), "NCCL_HOME") &&
          strstr(dllm_last_error(), "n_devices 0 or 1"));
    CHECK(api.ncclGetVersion == nullptr);
    CHECK_STATUS(dllm__nccl_open({"libc.so.6"}, api), DLLM_ERR_NO_DEVICE, "lacks ncclGetVersion");
    std::vector<std::string> names = dllm__nccl_candidates();
    CHECK(!names.empty() && names[0] == "libnccl.so.2");
}

/* On a multi-GPU host (none was lent when this was written: unrun): NCCL's all-reduce over 2 and, where present, 4
 * GPUs against the CPU reference's rank-order sum. Two ranks: the same bits (fp32 addition commutes); four: within
 * fp32 rounding of the reference (NCCL's own order). An awkward count, so NCCL's chunking has a ragged tail. */
TEST(tp, gpu_nccl_all_reduce_matches_the_reference) {
    std::string why;
    if (!dllm__gpu_usable(0, why) || !dllm__gpu_usable(1, why)) SKIP("skipped (fewer than 2 GPUs)");
    dllm__nccl_api api;
    if (dllm__nccl_open(dllm__nccl_candidates(), api) != DLLM_OK) SKIP("NCCL (libnccl.so.2) is not installed here");
    for (int ranks : {2, 4}) {
        if (ranks > 2 && !dllm__gpu_usable(ranks - 1, why)) break;
        std::vector<int> devices;
        for (int r = 0; r < ranks; r++) devices.push_back(r);
        double max_diff = -1;
        size_t n_differ = 0;
        CHECK_STATUS(dllm__tp_all_reduce_selfcheck(devices, 1000003, max_diff, n_differ), DLLM_OK, nullptr);
        if (ranks == 2)
            CHECK_MSG(n_differ == 0 && max_diff == 0, "TP=2: %zu elements differ (max %g)", n_differ, max_diff);
        else
            CHECK_MSG(max_diff >= 0 && max_diff <= 4 * 7 * 4 * FLT_EPSILON, "TP=%d: max |difference| %g", ranks,
                      max_diff);  // |sum| <= 28
    }
}
