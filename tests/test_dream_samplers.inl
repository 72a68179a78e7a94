/* Tests: Dream's samplers (issue 8, item 4): the confidences of maskgit_plus (LOW_CONFIDENCE), topk_margin
 * and entropy, the timestep count, origin's transfers and alg_temp's Gumbel-top-k. The CPU reference is
 * checked against the formulas written out and against a literal re-implementation of Dream's sampling loop
 * over dllm_logits; the GPU sampler and GPU decoding against the CPU twin (skipped without a GPU). */

// ---- Dream's formulas, written out --------------------------------------------------------------------

/* A reproducible logits row, 3 x standard normal (Philox stream 17: an application stream). */
static std::vector<float> test_dream_row(int V, uint32_t row) {
    std::vector<float> l((size_t)V);
    for (int v = 0; v < V; v++) {
        double u1 = dllm__uniform(99, (uint32_t)v, row, 0, 17), u2 = dllm__uniform(99, (uint32_t)v, row, 1, 17);
        l[(size_t)v] = (float)(3 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
    }
    return l;
}

/* sample_tokens' probs: softmax(l / T). */
static std::vector<double> test_softmax(const float *l, int V, double T) {
    double mx = -INFINITY, z = 0;
    for (int v = 0; v < V; v++) mx = std::max(mx, (double)l[v] / T);
    std::vector<double> q((size_t)V);
    for (int v = 0; v < V; v++) z += q[(size_t)v] = exp((double)l[v] / T - mx);
    for (double &x : q) x /= z;
    return q;
}

/* sample_tokens' confidence: probs[x0], top1 - top2, or sum p log(p + 1e-10). */
static double test_dream_conf(const std::vector<double> &q, dllm_remasking alg, int x0) {
    if (alg == DLLM_REMASK_MARGIN) {
        std::vector<double> s = q;
        std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<double>());
        return s[0] - s[1];
    }
    if (alg == DLLM_REMASK_ENTROPY) {
        double h = 0;
        for (double p : q) h += p * log(p + 1e-10);
        return h;
    }
    return q[(size_t)x0];
}

static const char *test_alg_name(dllm_remasking alg) {
    const char *names[] = {"maskgit_plus", "random", "topk_margin", "entropy", "origin"};
    return names[alg];
}

/* Random rows of awkward sizes, a tie for the largest logit (margin 0), a -inf logit (EOS forbidden: the entropy
 * must skip it, not turn NaN), temperatures 0 and > 0, tempered and untempered. */
TEST(dream, confidences_equal_the_formulas) {
    const int sizes[] = {2, 3, 37, 1000, 4099};
    const dllm_remasking algs[] = {DLLM_REMASK_LOW_CONFIDENCE, DLLM_REMASK_MARGIN, DLLM_REMASK_ENTROPY};
    double worst[3] = {0, 0, 0};
    for (int V : sizes)
        for (uint32_t row = 0; row < 3; row++)
            for (double T : {0.0, 0.7, 1.6})
                for (bool tempered : {false, true})
                    for (int a = 0; a < 3; a++) {
                        std::vector<float> l = test_dream_row(V, row);
                        int top = (int)(std::max_element(l.begin(), l.end()) - l.begin());
                        if (row == 1) l[(size_t)((top + 1) % V)] = l[(size_t)top];
                        dllm__sampling s;
                        s.temperature = T, s.remasking = algs[a], s.tempered_conf = tempered, s.seed = 5;
                        s.eos_logit_inf = row == 2, s.eos_id = top;
                        dllm__choice c = dllm__choose(l.data(), V, s, 10 + row, 3);
                        if (row == 2) l[(size_t)top] = -INFINITY;
                        if (T == 0) CHECK(c.token == (int)(std::max_element(l.begin(), l.end()) - l.begin()));
                        double want =
                            test_dream_conf(test_softmax(l.data(), V, tempered && T > 0 ? T : 1.0), algs[a], c.token);
                        double err = fabs(c.conf - want);
                        worst[a] = std::max(worst[a], err);
                        CHECK_MSG(err <= (algs[a] == DLLM_REMASK_ENTROPY ? 1e-5 : 1e-12),
                                  "%s V=%d row %u T=%g tempered %d: %.17g, want %.17g", test_alg_name(algs[a]), V, row,
                                  T, tempered, c.conf, want);
                        if (row == 1 && algs[a] == DLLM_REMASK_MARGIN) CHECK(c.conf == 0);
                    }
    printf(
        "    largest |dllm - formula|: maskgit_plus %.1e, topk_margin %.1e, entropy %.1e (Dream's +1e-10 in the log: < "
        "V * 1e-10)\n",
        worst[0], worst[1], worst[2]);
}

// ---- the timestep count ------------------------------------------------------------------------------

TEST(dream, timestep_counts_follow_the_linspace) {
    // n = 10, s = 4, eps = 1e-3: t = 1, .75025, .5005, .25075, .001: floor(10 x .24975) = 2, floor(8 x .33289) = 2,
    // floor(6 x .49900) = 2, then the 4 left
    const int want[] = {2, 2, 2, 4};
    int n = 10;
    for (int i = 0; i < 4; i++) {
        int k = dllm__timestep_count(n, 4, i, 1e-3);
        CHECK_MSG(k == want[i], "step %d: k = %d, want %d", i, k, want[i]);
        n -= k;
    }
    bool sums = true;
    int zero_steps = 0;
    for (double eps : {1e-3, 0.05, 0.5})
        for (int s = 1; s <= 16; s++)
            for (int n0 = 0; n0 <= 64; n0++) {
                int left = n0;
                for (int i = 0; i < s; i++) {
                    int k = dllm__timestep_count(left, s, i, eps);
                    sums &= k >= 0 && k <= left;
                    zero_steps += k == 0 && left > 0;
                    left -= k;
                }
                sums &= left == 0;
            }
    CHECK_MSG(sums, "a count sequence is negative, exceeds the masks left, or does not sum to n");
    printf("    %d steps commit nothing although masks are left (Dream's behaviour, kept)\n", zero_steps);
    double err = 0;
    for (int s : {1, 5, 64, 512})
        for (int i = 0; i < s; i++) {
            double eps = 1e-3, t = 1 + i * (eps - 1) / s, u = 1 + (i + 1) * (eps - 1) / s;
            err = std::max(err, fabs(dllm__timestep_fraction(i, s, eps) - (i == s - 1 ? 1.0 : 1 - u / t)));
        }
    CHECK_MSG(err < 1e-12, "fraction differs from 1 - t[i+1]/t[i] by %g", err);
}

// ---- origin and alg_temp -----------------------------------------------------------------------------

/* ORIGIN: a candidate transfers when its own draw is below p, whatever the others do; p = 1 takes them all. */
TEST(dream, origin_transfers_each_mask_with_probability_p) {
    dllm__sampling s;
    s.remasking = DLLM_REMASK_ORIGIN, s.seed = 3;
    const float row[4] = {0, 1, 2, 3};
    std::vector<int32_t> pos;
    std::vector<dllm__choice> ch;
    for (int p = 0; p < 400; p++) {
        pos.push_back(p);
        ch.push_back(dllm__choose(row, 4, s, (uint32_t)p, 7));
    }
    dllm__unmask_rule u;
    u.kind = DLLM_UNMASK_TIMESTEPS, u.origin = true;
    for (double p_transfer : {0.0, 0.3, 1.0}) {
        std::vector<int> want;
        for (int p = 0; p < 400; p++)
            if (dllm__uniform(3, 0, (uint32_t)p, 7, DLLM__RNG_ORIGIN) < p_transfer) want.push_back(p);
        std::vector<int> sel = dllm__select(pos, ch, u, 0, p_transfer);
        CHECK_MSG(sel == want, "p = %g: %zu transferred, want %zu", p_transfer, sel.size(), want.size());
        if (p_transfer == 0.3) CHECK(abs((int)sel.size() - 120) < 30);
    }
    CHECK(dllm__select(pos, ch, u, 0, 1.0).size() == 400);
}

/* The key of a candidate with confidence c under alg_temp (dllm__confidence with z = 1, x0 at log c). */
static double test_alg_temp_key(double alg_temp, uint64_t seed, double c, uint32_t pos, uint32_t step) {
    dllm__sampling s;
    s.alg_temp = alg_temp, s.seed = seed;
    return dllm__confidence(s, 1.0, 0.0, log(c), 0.0, pos, step);
}

/* alg_temp: the first pick follows softmax(conf / alg_temp) (Gumbel-max), so the top k are a sample without
 * replacement; the picks are a function of the seed. */
TEST(dream, alg_temp_samples_positions_reproducibly) {
    const double conf[3] = {0.9, 0.5, 0.1}, alg_temp = 0.2;
    int counts[3] = {0, 0, 0};
    const int n = 6000;
    for (uint32_t step = 0; step < (uint32_t)n; step++) {
        double best = -INFINITY;
        int pick = 0;
        for (int j = 0; j < 3; j++) {
            double key = test_alg_temp_key(alg_temp, 11, conf[j], (uint32_t)j, step);
            if (key > best) best = key, pick = j;
        }
        counts[pick]++;
    }
    double z = exp(4.5) + exp(2.5) + exp(0.5), want[3] = {exp(4.5) / z, exp(2.5) / z, exp(0.5) / z};
    printf("    first pick frequencies %.3f %.3f %.3f, softmax(conf / alg_temp) %.3f %.3f %.3f\n",
           counts[0] / (double)n, counts[1] / (double)n, counts[2] / (double)n, want[0], want[1], want[2]);
    for (int j = 0; j < 3; j++) CHECK(fabs(counts[j] / (double)n - want[j]) < 0.02);
    auto pick10 = [](uint64_t seed) {
        std::vector<int32_t> pos;
        std::vector<dllm__choice> ch;
        for (int p = 0; p < 40; p++) {
            pos.push_back(p);
            ch.push_back({1, test_alg_temp_key(0.5, seed, 0.5 + 0.01 * (p % 5), (uint32_t)p, 2), false});
        }
        return dllm__select(pos, ch, dllm__unmask_rule(), 10);
    };
    CHECK(pick10(1) == pick10(1) && pick10(1).size() == 10);
    CHECK(pick10(1) != pick10(2));
}

// ---- decoding -----------------------------------------------------------------------------------------

/* Dream's _sample loop, written out over dllm_logits, per SAR block: timesteps = linspace(1, eps, s + 1);
 * x0 and a confidence from the tempered softmax; k = int(n (1 - t[i+1]/t[i])) (n at the last step) of the n
 * candidates by top-k, or by top-k of conf / alg_temp + Gumbel; origin: each candidate transfers when its draw
 * is below 1 - t[i+1]/t[i]. Randomness comes from dllm_rng_uniform with the streams dllm.h documents. */
struct test_dream_setup {
    dllm_remasking alg;
    float temperature;
    double alg_temp;
    int block, steps;
};

static void test_dream_step(dllm_ctx *ctx, std::vector<int32_t> &x, int end, int i, int s, uint32_t global,
                            const test_dream_setup &c, uint64_t seed, int32_t mask, int V) {
    const int N = (int)x.size();
    const double eps = 1e-3, t = 1 + i * (eps - 1) / s, u = 1 + (i + 1) * (eps - 1) / s,
                 frac = i < s - 1 ? 1 - u / t : 1.0;
    std::vector<float> logits((size_t)N * V);
    dllm_logits(ctx, x.data(), N, 0, N, logits.data(), logits.size());
    std::vector<std::pair<double, int>> keyed;  // (-key, position): ascending = best first, ties to the lower position
    std::vector<int32_t> x0((size_t)N);
    for (int p = 0; p < end; p++) {
        if (x[(size_t)p] != mask) continue;
        const float *l = &logits[(size_t)p * V];
        double best = -INFINITY;
        for (int v = 0; v < V; v++) {
            double score =
                c.temperature > 0
                    ? exp((double)l[v]) /
                          pow(-log(dllm_rng_uniform(seed, (uint32_t)v, (uint32_t)p, global, 1)), c.temperature)
                    : l[v];
            if (score > best) best = score, x0[(size_t)p] = v;
        }
        double key =
            c.alg == DLLM_REMASK_ORIGIN
                ? -dllm_rng_uniform(seed, 0, (uint32_t)p, global, 5)
                : test_dream_conf(test_softmax(l, V, c.temperature > 0 ? c.temperature : 1.0), c.alg, x0[(size_t)p]);
        if (c.alg_temp > 0) key = key / c.alg_temp - log(-log(dllm_rng_uniform(seed, 0, (uint32_t)p, global, 6)));
        keyed.push_back({-key, p});
    }
    std::sort(keyed.begin(), keyed.end());
    const int k = (int)floor((double)keyed.size() * frac);
    for (size_t j = 0; j < keyed.size(); j++)
        if (c.alg == DLLM_REMASK_ORIGIN ? keyed[j].first < frac : (int)j < k)
            x[(size_t)keyed[j].second] = x0[(size_t)keyed[j].second];
}

static std::vector<int32_t> test_dream_loop(dllm_ctx *ctx, const std::vector<int32_t> &prompt, int gen,
                                            const test_dream_setup &c, uint64_t seed, int32_t mask, int V) {
    std::vector<int32_t> x = prompt;
    x.resize(prompt.size() + (size_t)gen, mask);
    const int n_blocks = gen / c.block, s = c.steps / n_blocks;
    uint32_t global = 0;
    for (int b = 0; b < n_blocks; b++)
        for (int i = 0; i < s; i++)
            test_dream_step(ctx, x, (int)prompt.size() + (b + 1) * c.block, i, s, global++, c, seed, mask, V);
    return std::vector<int32_t>(x.begin() + (long)prompt.size(), x.end());
}

TEST(dream, decoding_equals_a_literal_dream_loop) {
    test_tiny_ctx t("models/tiny-dream");
    if (!t.ctx) { CHECK(t.ctx != nullptr); return; }
    dllm_model_info info;
    dllm_model_get_info(t.model, &info);
    const test_dream_setup cases[] = {
        {DLLM_REMASK_LOW_CONFIDENCE, 0, 0, 24, 12}, {DLLM_REMASK_MARGIN, 0, 0, 24, 12},
        {DLLM_REMASK_ENTROPY, 0, 0, 24, 12},        {DLLM_REMASK_ORIGIN, 0, 0, 24, 12},
        {DLLM_REMASK_ENTROPY, 0.8f, 0, 8, 12},      {DLLM_REMASK_LOW_CONFIDENCE, 0.8f, 0.3, 8, 12},
        {DLLM_REMASK_MARGIN, 0.5f, 0.5, 24, 6},     {DLLM_REMASK_ORIGIN, 1.0f, 0, 8, 12},
    };
    const std::vector<int32_t> prompt(test_sched_prompt, test_sched_prompt + 5);
    for (const test_dream_setup &c : cases) {
        dllm_gen_params p = test_sched_params();
        p.gen_length = 24, p.block_length = c.block, p.steps = c.steps, p.temperature = c.temperature, p.seed = 21;
        p.remasking = c.alg, p.unmask = DLLM_UNMASK_TIMESTEPS, p.alg_temp = c.alg_temp;
        test_gen g = test_generate(t.ctx, p);
        std::vector<int32_t> want = test_dream_loop(t.ctx, prompt, 24, c, 21, info.mask_id, info.n_vocab);
        printf("    %-12s T=%.1f alg_temp=%.1f block %2d steps %2d: agreement with the literal loop %.3f\n",
               test_alg_name(c.alg), c.temperature, c.alg_temp, c.block, c.steps, test_agreement(g.out, want));
        CHECK(g.status == DLLM_OK && g.stats.steps == c.steps && g.out == want);
        CHECK(std::count(want.begin(), want.end(), info.mask_id) == 0);
    }
}

/* Every Dream confidence under every unmasking rule, on both fixture families: decodes every position, counted
 * rules run exactly their steps, a sampled run (alg_temp on the counted rules) decodes too and repeats. */
TEST(dream, every_alg_composes_with_the_block_machinery) {
    const int32_t prompt[] = {5, 17, 42, 9, 3};
    for (const char *fx : {"tiny-llada", "tiny-dream"}) {
        const dllm_remasking algs[] = {DLLM_REMASK_LOW_CONFIDENCE, DLLM_REMASK_MARGIN, DLLM_REMASK_ENTROPY,
                                       DLLM_REMASK_RANDOM};
        const std::string dir = test_data(fx);
        test_tiny_ctx t(dir);
        if (!t.ctx) { CHECK(t.ctx != nullptr); continue; }
        dllm_model_info info;
        dllm_model_get_info(t.model, &info);
        for (dllm_remasking alg : algs)
            for (int rule = DLLM_UNMASK_SCHEDULE; rule <= DLLM_UNMASK_TIMESTEPS; rule++) {
                dllm_gen_params p = test_sched_params();
                p.gen_length = 16, p.steps = 8, p.remasking = alg, p.unmask = (dllm_unmask)rule;
                p.threshold = alg == DLLM_REMASK_ENTROPY ? -0.5 : 0.6;
                test_gen g = test_generate(t.ctx, p, prompt, 5);
                const bool counted = rule == DLLM_UNMASK_SCHEDULE || rule == DLLM_UNMASK_TIMESTEPS;
                p.temperature = 0.7f, p.seed = 4,
                p.alg_temp = counted ? 0.5 : 0;  // alg_temp samples a counted step's k
                test_gen a = test_generate(t.ctx, p, prompt, 5);
                bool repeats = rule != DLLM_UNMASK_TIMESTEPS || test_generate(t.ctx, p, prompt, 5).out == a.out;
                CHECK_MSG(g.status == DLLM_OK && a.status == DLLM_OK && repeats, "%s %s rule %d", fx,
                          test_alg_name(alg), rule);
                CHECK(std::count(g.out.begin(), g.out.end(), info.mask_id) == 0 &&
                      std::count(a.out.begin(), a.out.end(), info.mask_id) == 0);
                CHECK(counted ? g.stats.steps == 8 : g.stats.steps <= 16);
                if (!counted)
                    printf("    %s %-12s %s: %d steps for 16 tokens\n", fx, test_alg_name(alg),
                           rule == DLLM_UNMASK_THRESHOLD ? "threshold" : "factor   ", g.stats.steps);
            }
        dllm_gen_params p = test_sched_params();
        p.gen_length = 16, p.steps = 8, p.remasking = DLLM_REMASK_ORIGIN, p.unmask = DLLM_UNMASK_TIMESTEPS,
        p.kv_cache = DLLM_KV_CACHE_DUAL;
        test_gen o = test_generate(t.ctx, p, prompt, 5);
        CHECK(o.status == DLLM_OK && o.stats.steps == 8 && std::count(o.out.begin(), o.out.end(), info.mask_id) == 0);
    }
}

/* Dream counts every mask of its canvas: a [MASK] in the prompt is a candidate of each block, counted in n, so
 * the first block's last step commits it with the block's own masks. */
TEST(dream, timesteps_count_the_prompts_masks_too) {
    test_tiny_ctx t(test_data("tiny-llada"));
    if (!t.ctx) { CHECK(t.ctx != nullptr); return; }
    const int32_t mask = t.model->cfg.mask_id, prompt[] = {5, mask, 7};
    for (dllm_remasking alg : {DLLM_REMASK_ENTROPY, DLLM_REMASK_ORIGIN}) {
        dllm_gen_params p = test_sched_params();
        p.gen_length = 16, p.steps = 8, p.remasking = alg, p.unmask = DLLM_UNMASK_TIMESTEPS;
        test_trace_recorder rec;
        p.on_step = test_record_step, p.on_step_data = &rec;
        test_gen g = test_generate(t.ctx, p, prompt, 3);
        CHECK(g.status == DLLM_OK && rec.canvases.size() == 8);
        if (rec.canvases.size() == 8) {
            CHECK_MSG(std::count(rec.canvases[3].begin(), rec.canvases[3].begin() + 11, mask) == 0,
                      "%s: masks left after the first block", test_alg_name(alg));
            CHECK(std::count(rec.canvases[7].begin(), rec.canvases[7].end(), mask) == 0);
        }
    }
}

/* LLaDA's confidence stays untempered where it was (the defaults decode as before); Dream's is tempered. */
TEST(dream, only_dream_confidences_are_tempered) {
    dllm_gen_params p = dllm_gen_default_params();
    CHECK(p.eps == 1e-3 && p.alg_temp == 0 && p.remasking == DLLM_REMASK_LOW_CONFIDENCE &&
          p.unmask == DLLM_UNMASK_SCHEDULE);
    dllm__gen_plan plan;
    const int32_t prompt[] = {1, 2};
    struct { dllm_remasking alg; dllm_unmask rule; bool tempered;
    } cases[] = {
        {DLLM_REMASK_LOW_CONFIDENCE, DLLM_UNMASK_SCHEDULE, false},
        {DLLM_REMASK_LOW_CONFIDENCE, DLLM_UNMASK_THRESHOLD, false},
        {DLLM_REMASK_LOW_CONFIDENCE, DLLM_UNMASK_TIMESTEPS, true},
        {DLLM_REMASK_MARGIN, DLLM_UNMASK_SCHEDULE, true},
        {DLLM_REMASK_ENTROPY, DLLM_UNMASK_FACTOR, true},
    };
    for (auto &c : cases) {
        p.remasking = c.alg, p.unmask = c.rule;
        dllm__decode st;
        dllm__init_decode(prompt, 2, p, plan, st);
        CHECK(st.sampling.tempered_conf == c.tempered);
    }
}

TEST(dream, bad_sampler_options_are_clear_errors) {
    test_tiny_ctx t(test_data("tiny-dream"));
    if (!t.ctx) { CHECK(t.ctx != nullptr); return; }
    int32_t prompt[] = {5, 6, 7}, out[16];
    const test_bad_params cases[] = {
        {[](dllm_gen_params &p) { p.remasking = DLLM_REMASK_ORIGIN; }, "needs DLLM_UNMASK_TIMESTEPS (--timesteps)"},
        {[](dllm_gen_params &p) { p.remasking = DLLM_REMASK_ORIGIN, p.unmask = DLLM_UNMASK_THRESHOLD; },
         "needs DLLM_UNMASK_TIMESTEPS (--timesteps)"},
        {[](dllm_gen_params &p) {
             p.remasking = DLLM_REMASK_ORIGIN, p.unmask = DLLM_UNMASK_TIMESTEPS, p.confidence_eos_eot_inf = 1;
         },
         "does not rank"},
        {[](dllm_gen_params &p) {
             p.remasking = DLLM_REMASK_ORIGIN, p.unmask = DLLM_UNMASK_TIMESTEPS, p.alg_temp = 0.5;
         },
         "alg_temp"},
        {[](dllm_gen_params &p) { p.unmask = DLLM_UNMASK_TIMESTEPS, p.eps = 0; }, "eps"},
        {[](dllm_gen_params &p) { p.unmask = DLLM_UNMASK_TIMESTEPS, p.eps = 1; }, "eps"},
        {[](dllm_gen_params &p) { p.unmask = DLLM_UNMASK_TIMESTEPS, p.eps = NAN; }, "eps"},
        {[](dllm_gen_params &p) { p.unmask = DLLM_UNMASK_TIMESTEPS, p.steps = 0; }, "must be positive"},
        {[](dllm_gen_params &p) { p.alg_temp = -1; }, "alg_temp"},
        {[](dllm_gen_params &p) { p.alg_temp = NAN; }, "alg_temp"},
        {[](dllm_gen_params &p) { p.alg_temp = INFINITY; }, "alg_temp"},
        {[](dllm_gen_params &p) { p.alg_temp = 0.5, p.unmask = DLLM_UNMASK_THRESHOLD; }, "counted step"},
        {[](dllm_gen_params &p) { p.alg_temp = 0.5, p.unmask = DLLM_UNMASK_FACTOR; }, "counted step"},
        {[](dllm_gen_params &p) { p.remasking = DLLM_REMASK_ENTROPY, p.unmask = DLLM_UNMASK_THRESHOLD; },
         "<= 0"},  // default tau 0.9
        {[](dllm_gen_params &p) {
             p.remasking = DLLM_REMASK_MARGIN, p.unmask = DLLM_UNMASK_THRESHOLD, p.threshold = -0.5;
         },
         "(0, 1]"},
        {[](dllm_gen_params &p) { p.unmask = (dllm_unmask)4; }, "_TIMESTEPS"},
        {[](dllm_gen_params &p) { p.remasking = (dllm_remasking)5; }, "_ORIGIN"},
    };
    test_params_refused(T_, t.ctx, prompt, cases);
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = 16, p.steps = 16, p.block_length = 8, p.remasking = DLLM_REMASK_ENTROPY,
    p.unmask = DLLM_UNMASK_THRESHOLD, p.threshold = -0.5;
    CHECK_STATUS(dllm_generate(t.ctx, prompt, 3, p, out, 16, nullptr, nullptr), DLLM_OK, nullptr);
    p.unmask = DLLM_UNMASK_SCHEDULE, p.eps = 0;  // eps is only read by the timestep schedule
    CHECK_STATUS(dllm_generate(t.ctx, prompt, 3, p, out, 16, nullptr, nullptr), DLLM_OK, nullptr);
}

// ---- GPU ----------------------------------------------------------------------------------------------

/* The sampler kernels in one of Dream's modes against dllm__choose, then select_commit against dllm__select on
 * the GPU's own proposals. Awkward vocabularies over several slices; row 1's two largest logits tie across
 * two slices (margin 0), row 2 forbids its best token (-inf: the entropy must not turn NaN). */
static void test_dream_sampler_case(dllm_test_state &T_, test_gpu &g, test_rng &r, int V, int slice, dllm_remasking alg,
                                    double temp, double alg_temp) {
    const int rows = 11, slices = (V + slice - 1) / slice, pos0 = 30, s_steps = 5, i_step = 2, global = 9, mask = V - 1;
    std::vector<float> cond((size_t)rows * V);
    for (float &v : cond) v = 3 * r.normal();
    int top = (int)(std::max_element(cond.begin() + V, cond.begin() + 2 * V) - (cond.begin() + V));
    cond[(size_t)V + (top + slice) % V] = cond[(size_t)V + top];
    const int eos = (int)(std::max_element(cond.begin() + 2 * V, cond.begin() + 3 * V) - (cond.begin() + 2 * V));
    dllm__sampling s;
    s.temperature = temp, s.remasking = alg, s.seed = 4242, s.alg_temp = alg_temp, s.eos_logit_inf = true,
    s.eos_id = eos;
    s.tempered_conf = alg != DLLM_REMASK_LOW_CONFIDENCE || r.below(2);
    dllm__dbuf dc, dp, dx, dconf, ddef, dstate, dcanvas, dcomm;
    test_put(dc, cond);
    test_poison(dp, (size_t)rows * slices * sizeof(conf_partial));
    test_poison(dx, rows * 4); test_poison(dconf, rows * 8); test_poison(ddef, rows);
    std::vector<int> canvas(pos0 + rows, 5);
    int n_masks = 0;
    for (int i = 0; i < rows; i++)
        if (r.below(4)) { canvas[pos0 + i] = mask; n_masks++; }
    int st[16] = {0, pos0 + rows, s_steps, i_step, global, n_masks, 0, 0};
    test_put(dstate, std::vector<int>(st, st + 16));
    sampler_args a = {
        dc.as<float>(),  nullptr,  1, V, slice, slices, rows, pos0, 0, 0, rows, temp, s.seed, 1, eos, -1, 0, (int)alg,
        s.tempered_conf, alg_temp, 0, 1, 0,     nullptr};
    CHECK_STATUS(g.sm.conf_partial_kernel.launch({dim3(slices, rows), dim3(256)}, 0, a, dstate.ptr, dp.ptr), DLLM_OK,
                 nullptr);
    CHECK_STATUS(
        g.sm.conf_combine_kernel.launch({dim3(1), dim3(128)}, 0, a, dstate.ptr, dp.ptr, dx.ptr, dconf.ptr, ddef.ptr),
        DLLM_OK, nullptr);
    std::vector<int> x0 = test_get<int>(dx, rows);
    std::vector<double> conf = test_get<double>(dconf, rows);
    std::vector<dllm__choice> ch;
    std::vector<int32_t> cand;
    int same = 0;
    for (int i = 0; i < rows; i++) {
        dllm__choice c = dllm__choose(&cond[(size_t)i * V], V, s, (uint32_t)(pos0 + i), (uint32_t)global);
        bool ok = c.token == x0[i] && fabs(c.conf - conf[i]) <= 1e-9 * (1 + fabs(c.conf));
        if (!ok) printf("    row %d: cpu (%d, %.17g) gpu (%d, %.17g)\n", i, c.token, c.conf, x0[i], conf[i]);
        same += ok;
        if (canvas[pos0 + i] == mask) { cand.push_back(pos0 + i); ch.push_back({x0[i], conf[i], false}); }
    }
    CHECK_MSG(same == rows, "%s V=%d T=%g alg_temp=%g: %d of %d rows agree", test_alg_name(alg), V, temp, alg_temp,
              same, rows);
    dllm__unmask_rule u;
    u.origin = alg == DLLM_REMASK_ORIGIN, u.eps = 1e-3;
    std::vector<int> rules = u.origin ? std::vector<int>{DLLM_UNMASK_TIMESTEPS}
                                      : std::vector<int>{DLLM_UNMASK_SCHEDULE, DLLM_UNMASK_TIMESTEPS};
    if (alg_temp == 0 && !u.origin) rules.insert(rules.end(), {DLLM_UNMASK_THRESHOLD, DLLM_UNMASK_FACTOR});
    for (int rule : rules) {
        test_put(dcanvas, canvas);
        test_put(dstate, std::vector<int>(st, st + 16));
        test_poison(dcomm, rows * 4);
        int lo = pos0, dev_rule = u.origin ? 4 : rule;
        double threshold = alg == DLLM_REMASK_ENTROPY ? -1.0 : 0.35, factor = 1.5;
        CHECK_STATUS(g.sm.select_commit.launch({dim3(1), dim3(1024), (size_t)rows * 5}, 0, dcanvas.ptr, dstate.ptr, lo,
                                               lo, dx.ptr, dconf.ptr, ddef.ptr, mask, dcomm.ptr, dev_rule, threshold,
                                               factor, u.eps),
                     DLLM_OK, nullptr);
        std::vector<int> canvas_gpu = test_get<int>(dcanvas, canvas.size()), st_gpu = test_get<int>(dstate, 16);
        u.kind = (dllm_unmask)rule, u.threshold = threshold, u.factor = factor;
        dllm__decode d;
        d.unmask = u, d.n_block_masks = n_masks, d.steps_per_block = s_steps, d.step_in_block = i_step;
        std::vector<int> want = canvas, sel = dllm__select(cand, ch, u, dllm__step_count(d, (int)cand.size()),
                                                           dllm__timestep_fraction(i_step, s_steps, u.eps));
        for (int i : sel) want[(size_t)cand[(size_t)i]] = ch[(size_t)i].token;
        CHECK_MSG(canvas_gpu == want, "%s rule %d: select_commit differs from dllm__select (%zu committed on the CPU)",
                  test_alg_name(alg), rule, sel.size());
        CHECK(st_gpu[3] == i_step + 1 && st_gpu[4] == global + 1 && st_gpu[6] == (int)sel.size() &&
              st_gpu[7] == n_masks - (int)sel.size());
    }
}

TEST(gpu, dream_sampler_matches_cpu_choose_and_select) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("dream sampler");
    for (dllm_remasking alg : {DLLM_REMASK_LOW_CONFIDENCE, DLLM_REMASK_MARGIN, DLLM_REMASK_ENTROPY, DLLM_REMASK_ORIGIN})
        for (double temp : {0.0, 0.7}) {
            test_dream_sampler_case(T_, g, r, 997, 128, alg, temp, 0);
            test_dream_sampler_case(T_, g, r, 4099, 1024, alg, temp, alg == DLLM_REMASK_ORIGIN ? 0 : 0.3);
        }
}

/* Dream's samplers decoding on the GPU against the CPU (trained tiny models). Temperature 0: every step's canvas
 * must equal the CPU's unless the first difference is a near-tie under the sampler's own confidence (see
 * test_divergence_is_near_tie). Sampled with alg_temp: agreement is reported, LaCache must stay exact and a
 * run must repeat. */
TEST(gpu, dream_samplers_decode_like_cpu) {
    NEED_GPU();
    const dllm_remasking algs[] = {DLLM_REMASK_LOW_CONFIDENCE, DLLM_REMASK_MARGIN, DLLM_REMASK_ENTROPY,
                                   DLLM_REMASK_ORIGIN};
    int unexplained = 0, identical = 0, cases = 0;
    for (const char *dir : {"models/tiny-llada", "models/tiny-dream"}) {
        test_tiny_ctx cpu(dir), gpu(dir, DLLM_BACKEND_GPU);
        if (!cpu.ctx || !gpu.ctx) { CHECK(cpu.ctx && gpu.ctx); continue; }
        const std::vector<int32_t> prompt(test_sched_prompt, test_sched_prompt + 5);
        for (dllm_remasking alg : algs)
            for (int block : {8, 32}) {
                dllm_gen_params p = test_sched_params();
                p.block_length = block, p.remasking = alg, p.unmask = DLLM_UNMASK_TIMESTEPS;
                test_trace_recorder ra, rb;
                p.on_step = test_record_step;
                p.on_step_data = &ra;
                test_gen want = test_generate(cpu.ctx, p);
                p.on_step_data = &rb;
                test_gen got = test_generate(gpu.ctx, p);
                CHECK(want.status == DLLM_OK && got.status == DLLM_OK);
                cases++;
                std::vector<int32_t> before;
                const size_t s = test_first_difference(ra, rb, prompt, p.gen_length, cpu.model->cfg.mask_id, before);
                if (s == ra.canvases.size() && ra.canvases.size() == rb.canvases.size()) { identical++; continue; }
                if (s >= ra.canvases.size() || s >= rb.canvases.size()) { unexplained++; continue; }
                dllm__decode st;
                dllm__init_decode(prompt.data(), (int)prompt.size(), p, dllm__gen_plan(), st);
                std::string what = dllm__format("%s %s block %d step %zu:", dir, test_alg_name(alg), block, s);
                unexplained += !test_divergence_is_near_tie(cpu.ctx, gpu.ctx, cpu.model, before, 0.f, prompt.size(),
                                                            ra.canvases[s], rb.canvases[s], what.c_str(), &st.sampling);
            }
        for (dllm_remasking alg : algs) {
            dllm_gen_params p = test_sched_params();
            p.remasking = alg, p.unmask = DLLM_UNMASK_TIMESTEPS, p.temperature = 0.7f, p.seed = 9;
            p.alg_temp = alg == DLLM_REMASK_ORIGIN ? 0 : 0.5;
            test_gen want = test_generate(cpu.ctx, p), on = test_generate(gpu.ctx, p),
                     again = test_generate(gpu.ctx, p);
            p.lacache = DLLM_LACACHE_OFF;
            test_gen off = test_generate(gpu.ctx, p);
            CHECK_MSG(on.out == off.out && on.out == again.out,
                      "%s %s sampled: LaCache on/off or a repeat differ on the GPU", dir, test_alg_name(alg));
            printf("    %s %-12s T=0.7 alg_temp=%.1f: GPU vs CPU agreement %.3f\n", dir, test_alg_name(alg), p.alg_temp,
                   test_agreement(on.out, want.out));
        }
    }
    printf("    %d of %d temperature-0 runs identical at every step\n", identical, cases);
    CHECK_MSG(unexplained == 0, "%d runs diverge beyond a near-tie", unexplained);
}
