/* Tests: Philox, the SAR schedule, top-k selection, and decoding traces against the golden ones. */

TEST(rng, philox_known_answers) {
    // Random123's kat_vectors for philox4x32-10: counter, key (k0 = low word of the seed), output.
    struct { uint32_t ctr[4]; uint64_t key; uint32_t out[4];
    } kat[] = {
        {{0, 0, 0, 0}, 0, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         0xffffffffffffffffULL,
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         0x299f31d0a4093822ULL,
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (auto &k : kat) {
        uint32_t o[4];
        dllm__philox(k.key, k.ctr, o);
        CHECK_MSG(memcmp(o, k.out, sizeof o) == 0, "got %08x %08x %08x %08x", o[0], o[1], o[2], o[3]);
    }
}

TEST(rng, uniform_is_open_interval_and_spread) {
    double lo = 1, hi = 0, sum = 0;
    for (uint32_t i = 0; i < 20000; i++) {
        double u = dllm__uniform(42, i, 3, 9, DLLM__RNG_GUMBEL);
        lo = std::min(lo, u);
        hi = std::max(hi, u);
        sum += u;
    }
    CHECK(lo > 0 && hi < 1 && lo < 1e-3 && hi > 1 - 1e-3);
    CHECK(fabs(sum / 20000 - 0.5) < 0.01);
    CHECK(dllm__uniform(1, 0, 0, 0, 1) != dllm__uniform(2, 0, 0, 0, 1));
    CHECK(dllm__uniform(1, 0, 0, 0, 1) != dllm__uniform(1, 0, 0, 0, 2));
}

TEST(schedule, remainder_goes_to_earliest_steps) {
    int want[] = {4, 3, 3, 3, 3};
    for (int i = 0; i < 5; i++) CHECK(dllm__transfer_count(16, 5, i) == want[i]);
    for (int n = 0; n <= 40; n++)
        for (int s = 1; s <= 12; s++) {
            int sum = 0, prev = 1 << 30;
            for (int i = 0; i < s; i++) {
                int k = dllm__transfer_count(n, s, i);
                CHECK(k <= prev && k >= 0);
                prev = k;
                sum += k;
            }
            CHECK_MSG(sum == n, "n=%d s=%d sum=%d", n, s, sum);
        }
}

static std::vector<int> test_select_k(const std::vector<int32_t> &pos, const std::vector<dllm__choice> &ch, int k) {
    return dllm__select(pos, ch, dllm__unmask_rule(), k);
}

TEST(select, ties_go_to_lower_positions_and_deferred_last) {
    std::vector<int32_t> pos = {3, 5, 7, 9, 11};
    std::vector<dllm__choice> ch = {
        {1, 0.5, false}, {1, 0.9, true}, {1, 0.5, false}, {1, 0.7, false}, {1, -INFINITY, false}};
    std::vector<int> sel = test_select_k(pos, ch, 2);
    CHECK(sel.size() == 2 && sel[0] == 0 && sel[1] == 3);  // 0.7 at 9, then the tie 0.5 goes to position 3
    sel = test_select_k(pos, ch, 5);
    CHECK(sel.size() == 5);
    sel = test_select_k(pos, ch, 4);  // the deferred one (0.9) loses even to -inf
    CHECK(sel.size() == 4 && std::find(sel.begin(), sel.end(), 1) == sel.end());
    CHECK(test_select_k(pos, ch, 0).empty());
}

/* Fast-dLLM's threshold rule: the best always, then every candidate with conf >= tau (tau itself included). */
TEST(select, threshold_commits_the_best_and_everything_above_tau) {
    std::vector<int32_t> pos = {10, 11, 12, 13, 14, 15};
    std::vector<dllm__choice> ch = {{1, 0.30, false}, {2, 0.91, false}, {3, 0.90, false},
                                    {4, 0.95, true},  {5, 0.2, false},  {6, 0.89, false}};
    dllm__unmask_rule u;
    u.kind = DLLM_UNMASK_THRESHOLD, u.threshold = 0.9;
    std::vector<int> sel = dllm__select(pos, ch, u, 0);
    CHECK(sel == std::vector<int>({1, 2}));  // the deferred 0.95 does not pass; 0.89 is below tau
    u.threshold = 0.99;
    CHECK(dllm__select(pos, ch, u, 0) == std::vector<int>({1}));  // nothing passes: the best alone
    std::vector<dllm__choice> all_deferred = {{1, 0.99, true}, {2, 0.98, true}};
    CHECK(dllm__select({4, 5}, all_deferred, u, 0) ==
          std::vector<int>({0}));  // a deferred one still enters as the best
    CHECK(dllm__select({}, {}, u, 0).empty());
}

/* The factor rule: the n-th best needs c_n >= 1 - f/(n+1), and commitment stops at the first failure, also
 * when the failure is the last candidate (where Fast-dLLM's code commits one more). */
TEST(select, factor_commits_the_longest_passing_prefix) {
    dllm__unmask_rule u;
    u.kind = DLLM_UNMASK_FACTOR, u.factor = 1.0;  // thresholds: n=2: 0.667, n=3: 0.75, n=4: 0.8
    std::vector<int32_t> pos = {0, 1, 2, 3};
    std::vector<dllm__choice> ch = {{1, 0.70, false}, {1, 0.99, false}, {1, 0.76, false}, {1, 0.79, false}};
    // sorted: 0.99 (n=1, in), 0.79 (n=2 >= 0.667), 0.76 (n=3 >= 0.75), 0.70 (n=4 < 0.8: stop)
    CHECK(dllm__select(pos, ch, u, 0) == std::vector<int>({1, 2, 3}));
    ch[3].conf = 0.70;  // 0.99, then the tie 0.70 at position 0 (n=2 passes), 0.70 at 3 fails n=3
    ch[2].conf = 0.60;
    CHECK(dllm__select(pos, ch, u, 0) == std::vector<int>({0, 1}));
    std::vector<dllm__choice> low = {{1, 0.5, false}, {1, 0.1, false}, {1, 0.2, false}, {1, 0.3, false}};
    CHECK(dllm__select(pos, low, u, 0) == std::vector<int>({0}));  // the best always enters, 0.3 < 0.667 stops
}

TEST(choose, greedy_gumbel_and_confidence) {
    float logits[5] = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
    dllm__sampling s;
    dllm__choice c = dllm__choose(logits, 5, s, 0, 0);
    CHECK(c.token == 1);  // tie between 1 and 2 goes to the lower index
    double z = exp(-2.0) + 1 + 1 + exp(-5.0) + exp(-2.5);
    CHECK(fabs(c.conf - 1.0 / z) < 1e-15);
    s.eos_logit_inf = true;
    s.eos_id = 1;
    c = dllm__choose(logits, 5, s, 0, 0);
    CHECK(c.token == 2 && fabs(c.conf - 1.0 / (z - 1)) < 1e-15);
    s.defer_eos_eot = true;
    s.eot_id = 2;
    CHECK(dllm__choose(logits, 5, s, 0, 0).deferred);
    s = dllm__sampling();
    s.temperature = 1.0;
    s.seed = 9;
    int counts[5] = {0};
    for (uint32_t pos = 0; pos < 4000; pos++) counts[dllm__choose(logits, 5, s, pos, 1).token]++;
    // Gumbel-max samples softmax(l): p(1) = p(2) = 1/z = 0.4275
    CHECK_MSG(abs(counts[1] - 1710) < 150 && abs(counts[2] - 1710) < 150 && counts[3] < 30, "%d %d %d", counts[1],
              counts[2], counts[3]);
    s.remasking = DLLM_REMASK_RANDOM;
    c = dllm__choose(logits, 5, s, 17, 4);
    CHECK(c.conf == dllm__uniform(9, 0, 17, 4, DLLM__RNG_REMASK));
}

/* At temperature 500 softmax(l / 500) over logits in [-4, 4] is nearly uniform: over 64 ids the draws of 6400 positions
 * spread over all of them (the generate.py form exp(l) / (-log u)^T is +inf or 0 for most ids there, where the lowest
 * id wins). A hotter and a huge temperature stay finite and uniform; temperature 0 is still the argmax. */
TEST(choose, large_temperatures_sample_every_id) {
    const int V = 64, draws = 6400;
    std::vector<float> logits((size_t)V);
    for (int v = 0; v < V; v++) logits[(size_t)v] = 4.0f * sinf(0.7f * (float)v);
    const int argmax = (int)(std::max_element(logits.begin(), logits.end()) - logits.begin());
    for (double T : {500.0, 1e9, 3e38}) {
        dllm__sampling s;
        s.temperature = T, s.seed = 11;
        std::vector<int> counts((size_t)V, 0);
        for (uint32_t pos = 0; pos < (uint32_t)draws; pos++)
            counts[(size_t)dllm__choose(logits.data(), V, s, pos, 3).token]++;
        const int lo = *std::min_element(counts.begin(), counts.end()),
                  hi = *std::max_element(counts.begin(), counts.end());
        // 100 expected a bin: a uniform draw keeps every bin within [55, 150] with overwhelming probability
        CHECK_MSG(lo >= 55 && hi <= 150 && counts[0] < 150, "T %g: bins in [%d, %d], id 0 drawn %d times", T, lo, hi,
                  counts[0]);
    }
    dllm__sampling greedy;
    CHECK(dllm__choose(logits.data(), V, greedy, 0, 0).token == argmax);
}

/* The log-space key picks generate.py's token, exp(l) / (-log u)^T, wherever that one stays finite: the two are the
 * same order up to rounding, and at the temperatures people use no row here has its two best keys within rounding. */
TEST(choose, gumbel_key_picks_generate_py_token_at_normal_temperatures) {
    const int V = 512;
    std::vector<float> logits((size_t)V);
    int rows = 0, differ = 0;
    for (double T : {0.1, 0.3, 0.5, 0.7, 0.8, 1.0, 1.5, 2.0, 5.0}) {
        dllm__sampling s;
        s.temperature = T, s.seed = 77;
        for (uint32_t pos = 0; pos < 400; pos++) {
            for (int v = 0; v < V; v++)
                logits[(size_t)v] = (float)(dllm__uniform(3, (uint32_t)v, pos, 0, 16) * 24 - 12);
            int want = 0;
            double best = -INFINITY;
            for (int v = 0; v < V; v++) {
                double u = dllm__uniform(s.seed, (uint32_t)v, pos, 2, DLLM__RNG_GUMBEL);
                double score = exp((double)logits[(size_t)v]) / pow(-log(u), T);
                if (score > best) best = score, want = v;
            }
            rows++;
            differ += dllm__choose(logits.data(), V, s, pos, 2).token != want;
        }
    }
    CHECK_MSG(differ == 0, "%d of %d rows chose another token than generate.py's key", differ, rows);
}

// ---- traces -----------------------------------------------------------------------------------------

struct test_trace_recorder {
    std::vector<std::vector<int32_t>> canvases;
    int last_global = 0;
    bool consistent = true;
};

static int test_record_step(const dllm_step_info *info, void *user) {
    test_trace_recorder *r = (test_trace_recorder *)user;
    r->canvases.emplace_back(info->canvas, info->canvas + info->canvas_len);
    r->consistent &=
        info->global_step == r->last_global + 1 && info->n_committed >= 0 && info->step < info->steps_per_block;
    r->last_global = info->global_step;
    return 0;
}

/* The first step at which two recorded decodes' canvases differ (their common length when one is a prefix of the
 * other), and, where both have that step, in `before` the canvas it started from (the previous one, or the prompt)
 * with masks up to prompt + gen_length ids. */
static size_t test_first_difference(const test_trace_recorder &a, const test_trace_recorder &b,
                                    const std::vector<int32_t> &prompt, int gen_length, int32_t mask_id,
                                    std::vector<int32_t> &before) {
    size_t s = 0;
    while (s < a.canvases.size() && s < b.canvases.size() && a.canvases[s] == b.canvases[s]) s++;
    if (s < a.canvases.size() && s < b.canvases.size()) {
        before = s ? a.canvases[s - 1] : prompt;
        before.resize(prompt.size() + (size_t)gen_length, mask_id);
    }
    return s;
}

static std::vector<int32_t> test_ints(const dllm__json *a) {
    std::vector<int32_t> v;
    if (a)
        for (const dllm__json &x : a->items) v.push_back((int32_t)x.integer);
    return v;
}

static dllm_gen_params test_case_params(const dllm__json &c) {
    dllm_gen_params p = dllm_gen_default_params();
    auto num = [&](const char *k, double d) {
        const dllm__json *v = c.find(k);
        return v ? (v->kind == dllm__json::BOOL ? (double)v->boolean : v->number) : d;
    };
    p.steps = (int)num("steps", 0);
    p.gen_length = (int)num("gen_length", 0);
    p.block_length = (int)num("block_length", 0);
    p.temperature = (float)num("temperature", 0);
    p.cfg_scale = (float)num("cfg_scale", 0);
    const dllm__json *seed = c.find("seed");
    p.seed = seed ? (uint64_t)seed->integer : 0;
    const dllm__json *rm = c.find("remasking");
    p.remasking = rm && rm->str == "random" ? DLLM_REMASK_RANDOM : DLLM_REMASK_LOW_CONFIDENCE;
    p.logits_eos_inf = (int)num("logits_eos_inf", 0);
    p.confidence_eos_eot_inf = (int)num("confidence_eos_eot_inf", 0);
    return p;
}

/* Runs every golden case on ctx; returns the number of cases whose every step matched. */
static int test_run_traces(dllm_test_state &T_, dllm_ctx *ctx, const char *fixture) {
    dllm__json root;
    CHECK_STATUS(dllm__json_load(test_data(fixture) + "/golden_traces.json", root), DLLM_OK, nullptr);
    const dllm__json *cases = root.find("cases");
    int matched = 0;
    for (size_t i = 0; cases && i < cases->items.size(); i++) {
        const dllm__json &c = cases->items[i];
        std::vector<int32_t> prompt = test_ints(c.find("prompt")), want_out = test_ints(c.find("output"));
        dllm_gen_params p = test_case_params(c);
        test_trace_recorder rec;
        p.on_step = test_record_step;
        p.on_step_data = &rec;
        std::vector<int32_t> out((size_t)p.gen_length, -7);
        int n_out = -1;
        dllm_gen_stats stats;
        CHECK_STATUS(
            dllm_generate(ctx, prompt.data(), (int)prompt.size(), p, out.data(), (int)out.size(), &n_out, &stats),
            DLLM_OK, nullptr);
        const dllm__json *canv = c.find("canvases");
        bool same = canv && rec.canvases.size() == canv->items.size() && rec.consistent;
        for (size_t s = 0; same && s < rec.canvases.size(); s++) {
            if (rec.canvases[s] != test_ints(&canv->items[s])) {
                printf("    %s/%s: first difference at step %zu\n", fixture, c.find("name")->str.c_str(), s);
                same = false;
            }
        }
        out.resize((size_t)std::max(0, n_out));
        same =
            same && out == want_out && stats.steps == p.steps && stats.forwards == p.steps * (p.cfg_scale > 0 ? 2 : 1);
        CHECK_MSG(same, "%s case %s differs from the golden trace", fixture, c.find("name")->str.c_str());
        matched += same;
    }
    return matched;
}

TEST(decode, llada_traces_match_reference) {
    test_tiny_ctx f(test_data("tiny-llada"));
    CHECK(f.ctx != nullptr);
    if (f.ctx) printf("    %d tiny-llada cases identical at every step\n", test_run_traces(T_, f.ctx, "tiny-llada"));
}

TEST(decode, dream_traces_match_reference) {
    test_tiny_ctx f(test_data("tiny-dream"));
    CHECK(f.ctx != nullptr);
    if (f.ctx) printf("    %d tiny-dream cases identical at every step\n", test_run_traces(T_, f.ctx, "tiny-dream"));
}

static int test_cancel_at_3(const dllm_step_info *info, void *) { return info->global_step == 3; }

TEST(decode, callback_cancels_with_partial_output) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    int32_t prompt[] = {5, 6, 7};
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = 8; p.steps = 8; p.block_length = 8;
    p.on_step = test_cancel_at_3;
    int32_t out[8];
    int n = -1;
    dllm_gen_stats st;
    CHECK_STATUS(dllm_generate(ctx, prompt, 3, p, out, 8, &n, &st), DLLM_ERR_CANCELLED, "cancelled");
    CHECK(n == 8 && st.steps == 3);
    int masks = 0;
    for (int i = 0; i < 8; i++) masks += out[i] == 130;
    CHECK(masks == 5);
    CHECK(strstr(dllm_ctx_last_error(ctx), "cancelled") != nullptr);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(decode, stop_at_eos_truncates_output_only) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    dllm__json root;
    dllm__json_load(test_data("tiny-llada/golden_traces.json"), root);
    const dllm__json &c = root.find("cases")->items[0];
    std::vector<int32_t> prompt = test_ints(c.find("prompt"));
    std::vector<int32_t> last = test_ints(&c.find("canvases")->items.back());
    dllm_gen_params p = test_case_params(c);
    p.stop_at_eos = 0;
    std::vector<int32_t> out((size_t)p.gen_length);
    int n = 0;
    CHECK_STATUS(dllm_generate(ctx, prompt.data(), (int)prompt.size(), p, out.data(), (int)out.size(), &n, nullptr),
                 DLLM_OK, nullptr);
    CHECK(n == p.gen_length && std::equal(out.begin(), out.end(), last.begin() + (long)prompt.size()));
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}
