/* Tests: the schedulers beyond LLaDA's (issue 8) on the CPU reference: Fast-dLLM's threshold and factor
 * unmasking, the prefix and dual K/V caches, DPad's suffix dropout and early termination. Their GPU twins
 * are compared against these in test_gpu.inl. Exact properties are asserted exactly; the approximate
 * caches are reported as agreement with the uncached path. */

/* One generation on the trained tiny model (realistic confidences) with the given options. */
struct test_gen {
    std::vector<int32_t> out;
    dllm_gen_stats stats = {};
    dllm_status status = DLLM_OK;
};

static const int32_t test_sched_prompt[] = {32, 1392, 302, 468,
                                            1259};  // "A fool and his money" in tiny-llada's tokenizer

static dllm_gen_params test_sched_params() {
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = 32, p.steps = 32, p.block_length = 8, p.stop_at_eos = 0;
    return p;
}

static test_gen test_generate(dllm_ctx *ctx, const dllm_gen_params &p, const int32_t *prompt = test_sched_prompt,
                              int n_prompt = (int)(sizeof test_sched_prompt / sizeof test_sched_prompt[0])) {
    test_gen g;
    g.out.assign((size_t)p.gen_length, -7);
    int n = 0;
    g.status = dllm_generate(ctx, prompt, n_prompt, p, g.out.data(), (int)g.out.size(), &n, &g.stats);
    g.out.resize((size_t)std::max(0, n));
    return g;
}

static double test_agreement(const std::vector<int32_t> &a, const std::vector<int32_t> &b) {
    size_t same = 0, n = std::max(a.size(), b.size());
    for (size_t i = 0; i < std::min(a.size(), b.size()); i++) same += a[i] == b[i];
    return n ? (double)same / (double)n : 1.0;
}

/* tau = 1 lets only the best candidate through (a float64 softmax never reaches 1 exactly here), and so does
 * a vanishing factor: both must reproduce the schedule with one token per step, token for token. */
TEST(schedulers, threshold_one_and_tiny_factor_equal_one_token_per_step) {
    test_tiny_ctx t("models/tiny-llada");
    if (!t.ctx) { CHECK(t.ctx != nullptr); return; }
    dllm_gen_params p = test_sched_params();
    test_gen ref = test_generate(t.ctx, p);
    p.unmask = DLLM_UNMASK_THRESHOLD, p.threshold = 1.0;
    test_gen thr = test_generate(t.ctx, p);
    p.unmask = DLLM_UNMASK_FACTOR, p.factor = 1e-9;
    test_gen fac = test_generate(t.ctx, p);
    CHECK(ref.status == DLLM_OK && thr.status == DLLM_OK && fac.status == DLLM_OK);
    CHECK(thr.out == ref.out && fac.out == ref.out);
    CHECK(thr.stats.steps == 32 && thr.stats.forwards == 32 && fac.stats.steps == 32);
}

/* dllm_step_info.total_steps bounds global_step under threshold/factor decoding, the prompt's masks included: at one
 * token a step (tau = 1, a vanishing factor) the bound is met exactly, alone and in a batch. */
static int test_sched_check_bound(const dllm_step_info *info, void *user_data) {
    int *worst = (int *)user_data;  // [0]: the most global_step exceeded total_steps by, [1]: the last total_steps
    worst[0] = std::max(worst[0], info->global_step - info->total_steps), worst[1] = info->total_steps;
    return 0;
}

TEST(schedulers, total_steps_bounds_every_step_with_masks_in_the_prompt) {
    test_tiny_ctx t("models/tiny-llada");
    if (!t.ctx) { CHECK(t.ctx != nullptr); return; }
    dllm_model_info info;
    CHECK_STATUS(dllm_model_get_info(t.model, &info), DLLM_OK, nullptr);
    const int32_t prompt[] = {32, info.mask_id, 302, info.mask_id, 1259};
    for (dllm_unmask rule : {DLLM_UNMASK_THRESHOLD, DLLM_UNMASK_FACTOR})
        for (int batched = 0; batched < 2; batched++) {
            dllm_gen_params p = test_sched_params();
            p.gen_length = 16, p.unmask = rule, p.threshold = 1.0, p.factor = 1e-9;
            int worst[2] = {INT32_MIN, -1};
            p.on_step = test_sched_check_bound, p.on_step_data = worst;
            std::vector<int32_t> out(16);
            dllm_gen_stats stats = {};
            if (batched) {
                const dllm_batch_item item = {prompt, 5, p, out.data(), 16};
                dllm_batch_result r;
                CHECK_STATUS(dllm_generate_batch(t.ctx, &item, 1, &r, nullptr), DLLM_OK, nullptr);
                stats = r.stats;
            } else {
                CHECK_STATUS(dllm_generate(t.ctx, prompt, 5, p, out.data(), 16, nullptr, &stats), DLLM_OK, nullptr);
            }
            CHECK_MSG(worst[0] == 0 && worst[1] == 18 && stats.steps == 18,
                      "rule %d%s: global_step passed total_steps by %d (total %d, %d steps)", (int)rule,
                      batched ? " batched" : "", worst[0], worst[1], stats.steps);
        }
}

TEST(schedulers, threshold_and_factor_finish_every_block_in_fewer_steps) {
    test_tiny_ctx t("models/tiny-llada");
    if (!t.ctx) { CHECK(t.ctx != nullptr); return; }
    dllm_gen_params p = test_sched_params();
    test_gen ref = test_generate(t.ctx, p);
    const struct {
        dllm_unmask rule;
        double value;
    } cases[] = {{DLLM_UNMASK_THRESHOLD, 0.9}, {DLLM_UNMASK_THRESHOLD, 0.5}, {DLLM_UNMASK_FACTOR, 1.0}};
    for (auto &c : cases) {
        p.unmask = c.rule, p.threshold = c.value, p.factor = c.value;
        test_gen g = test_generate(t.ctx, p);
        int masks = (int)std::count(g.out.begin(), g.out.end(), 4086);
        printf("    %s %.2g: %d steps for 32 tokens (%.2f tokens/step), agreement with one token per step %.3f\n",
               c.rule == DLLM_UNMASK_THRESHOLD ? "threshold" : "factor", c.value, g.stats.steps, 32.0 / g.stats.steps,
               test_agreement(g.out, ref.out));
        CHECK(g.status == DLLM_OK && g.out.size() == 32 && masks == 0);
        CHECK(g.stats.steps >= 4 && g.stats.steps <= 32 && g.stats.forwards == g.stats.steps);
    }
}

/* The K/V cache mechanism is exact when nothing changed: a block-only (dual) or block+suffix (prefix) forward
 * over keys cached from the same canvas equals the plain forward's rows bit for bit on the CPU. */
TEST(schedulers, kv_cache_forward_on_an_unchanged_canvas_is_exact) {
    const char *dirs[] = {"tiny-llada", "tiny-dream"};
    for (const char *d : dirs) {
        dllm_model *m = test_load(test_data(d));
        if (!m) { CHECK(m != nullptr); continue; }
        const dllm__config &c = m->cfg;
        dllm__pool pool(2);
        dllm__cpu_buffers b;
        std::vector<float> cos_t, sin_t;
        dllm__rope_tables(c.rope_theta, c.head_dim, 64, cos_t, sin_t);
        const int n = 45, q0 = 21, q1 = 29;
        std::vector<int32_t> ids(n);
        for (int i = 0; i < n; i++) ids[(size_t)i] = (i * 37 + 5) % (c.n_vocab - 1);
        std::vector<float> plain((size_t)(q1 - q0) * c.n_vocab), cached(plain.size()),
            suffix((size_t)(n - q0) * c.n_vocab, 0.0f);
        dllm__cpu_forward(*m, pool, b, ids.data(), n, dllm__cpu_rows(), nullptr, cos_t.data(), sin_t.data(), q0, q1,
                          plain.data());
        dllm__cpu_kv kv;
        kv.n = n;
        kv.k.assign((size_t)c.n_layer * n * c.n_head_kv * c.head_dim, NAN);  // poisoned: the fill must write every slot
        kv.v = kv.k;
        dllm__cpu_rows fill;
        fill.q0 = 0, fill.q1 = n, fill.kv = &kv;
        std::vector<float> full((size_t)n * c.n_vocab);
        dllm__cpu_forward(*m, pool, b, ids.data(), n, fill, nullptr, cos_t.data(), sin_t.data(), 0, n, full.data());
        dllm__cpu_rows dual = fill, prefix = fill;
        dual.q0 = q0, dual.q1 = q1, prefix.q0 = q0, prefix.q1 = n;
        dllm__cpu_forward(*m, pool, b, ids.data(), n, dual, nullptr, cos_t.data(), sin_t.data(), q0, q1, cached.data());
        CHECK_MSG(cached == plain, "%s: the dual-cache rows differ from the plain forward", d);
        dllm__cpu_forward(*m, pool, b, ids.data(), n, prefix, nullptr, cos_t.data(), sin_t.data(), q0, q1,
                          cached.data());
        CHECK_MSG(cached == plain, "%s: the prefix-cache rows differ from the plain forward", d);
        CHECK(std::equal(plain.begin(), plain.end(), full.begin() + (long)q0 * c.n_vocab));
        dllm_model_free(m);
    }
}

/* The caches are approximate: report agreement with the uncached path; every position must be decoded and
 * the forward count must be the schedule's (the block's first step is the full forward that fills the cache). */
TEST(schedulers, kv_cache_decoding_agrees_with_the_uncached_path) {
    const char *models[] = {"models/tiny-llada", "models/tiny-dream"};
    for (const char *dir : models) {
        test_tiny_ctx t(dir);
        if (!t.ctx) { CHECK(t.ctx != nullptr); continue; }
        dllm_model_info info;
        dllm_model_get_info(t.model, &info);
        dllm_gen_params p = test_sched_params();
        test_gen ref = test_generate(t.ctx, p);
        for (dllm_kv_cache kv : {DLLM_KV_CACHE_PREFIX, DLLM_KV_CACHE_DUAL}) {
            p.kv_cache = kv;
            test_gen g = test_generate(t.ctx, p);
            p.unmask = DLLM_UNMASK_THRESHOLD;
            test_gen gt = test_generate(t.ctx, p);
            p.unmask = DLLM_UNMASK_SCHEDULE;
            printf("    %s %s cache: agreement with the uncached path %.3f (schedule), threshold 0.9 in %d steps\n",
                   dir, kv == DLLM_KV_CACHE_PREFIX ? "prefix" : "dual", test_agreement(g.out, ref.out), gt.stats.steps);
            CHECK(g.status == DLLM_OK && gt.status == DLLM_OK && g.stats.forwards == 32);
            CHECK(std::count(g.out.begin(), g.out.end(), info.mask_id) == 0 &&
                  std::count(gt.out.begin(), gt.out.end(), info.mask_id) == 0);
        }
        // One block: the block is the whole suffix, so both caches forward the same rows: identical tokens.
        p.block_length = p.gen_length;
        p.kv_cache = DLLM_KV_CACHE_PREFIX;
        test_gen prefix = test_generate(t.ctx, p);
        p.kv_cache = DLLM_KV_CACHE_DUAL;
        test_gen dual = test_generate(t.ctx, p);
        CHECK_MSG(prefix.status == DLLM_OK && prefix.out == dual.out, "%s: one block, prefix and dual caches differ",
                  dir);
    }
}

/* DPad that keeps the whole suffix is the plain decoding: Gaussian with a scale that makes every keep
 * probability >= 1, or uniform with n >= the suffix. This pins the compacted canvas and its RoPE positions. */
TEST(schedulers, dpad_keeping_the_whole_suffix_equals_vanilla) {
    const char *models[] = {"models/tiny-llada", "models/tiny-dream"};
    for (const char *dir : models) {
        test_tiny_ctx t(dir);
        if (!t.ctx) { CHECK(t.ctx != nullptr); continue; }
        dllm_gen_params p = test_sched_params();
        test_gen ref = test_generate(t.ctx, p);
        p.dpad = DLLM_DPAD_GAUSSIAN, p.dpad_window = 64, p.dpad_k = 0.5f, p.dpad_scale = 10.0f;
        test_gen gauss = test_generate(t.ctx, p);
        p.dpad = DLLM_DPAD_UNIFORM, p.dpad_n = 64;
        test_gen uni = test_generate(t.ctx, p);
        CHECK_MSG(gauss.out == ref.out && uni.out == ref.out, "%s: DPad keeping everything changed the tokens", dir);
        CHECK(gauss.stats.forwards == 32 && uni.stats.forwards == 32);
    }
}

TEST(schedulers, dpad_keeps_the_expected_suffix_and_is_seeded) {
    dllm_gen_params p = dllm_gen_default_params();
    p.dpad = DLLM_DPAD_GAUSSIAN, p.dpad_window = 256, p.dpad_k = 4, p.dpad_scale = 2;
    double kept = 0;
    for (int b = 0; b < 200; b++) kept += (double)dllm__dpad_keep(p, 100, 100 + 1024, b).size();
    // E[kept] = sum_d a phi(k d / (W - 1)) = 2 * (255 / 4) * (Phi(4) - 1/2) + phi(0) ~ 64.0 (DPad's "about 64")
    printf("    Gaussian a=2 k=4 W=256: %.1f suffix positions kept per block on average\n", kept / 200);
    CHECK(fabs(kept / 200 - 64.0) < 3.0);
    std::vector<int32_t> a = dllm__dpad_keep(p, 100, 400, 3), b = dllm__dpad_keep(p, 100, 400, 3);
    CHECK(a == b && !a.empty() && std::is_sorted(a.begin(), a.end()) && a.front() >= 100 && a.back() < 356);
    p.seed = 1;
    CHECK(dllm__dpad_keep(p, 100, 400, 3) != a);
    p.dpad = DLLM_DPAD_UNIFORM, p.dpad_n = 10;
    std::vector<int32_t> u = dllm__dpad_keep(p, 100, 130, 0);
    CHECK(u.size() == 10 && std::is_sorted(u.begin(), u.end()) && u.front() >= 100 && u.back() < 130);
    CHECK(dllm__dpad_keep(p, 100, 105, 0).size() == 5);  // the window is cut at the canvas end
}

TEST(schedulers, dpad_decoding_is_reproducible_and_composes) {
    test_tiny_ctx t("models/tiny-llada");
    if (!t.ctx) { CHECK(t.ctx != nullptr); return; }
    dllm_gen_params p = test_sched_params();
    p.gen_length = 48, p.steps = 48;
    p.dpad = DLLM_DPAD_GAUSSIAN, p.dpad_window = 24, p.dpad_k = 3, p.dpad_scale = 1.0f, p.seed = 5;
    test_gen a = test_generate(t.ctx, p), b = test_generate(t.ctx, p);
    CHECK(a.status == DLLM_OK && a.out == b.out && a.out.size() == 48);
    p.unmask = DLLM_UNMASK_THRESHOLD, p.kv_cache = DLLM_KV_CACHE_DUAL;  // Parallel + DPad + dual cache
    test_gen c = test_generate(t.ctx, p);
    CHECK(c.status == DLLM_OK && c.out.size() == 48 && std::count(c.out.begin(), c.out.end(), 4086) == 0);
    printf("    DPad W=24: parallel + dual cache in %d steps, agreement with DPad alone %.3f\n", c.stats.steps,
           test_agreement(c.out, a.out));
}

/* Early termination changes nothing before the first EOS: blocks before it decode identically (SAR never
 * revisits them) and the output ends at that EOS either way; it only saves the later blocks' forwards. */
TEST(schedulers, early_stop_keeps_the_output_and_saves_forwards) {
    test_tiny_ctx t("models/tiny-llada");
    if (!t.ctx) { CHECK(t.ctx != nullptr); return; }
    dllm_gen_params p = test_sched_params();
    p.gen_length = 64, p.steps = 64, p.stop_at_eos = 1;
    test_gen ref = test_generate(t.ctx, p);
    p.early_stop = 1;
    test_gen early = test_generate(t.ctx, p);
    printf("    output %zu tokens; forwards %d without early stop, %d with\n", ref.out.size(), ref.stats.forwards,
           early.stats.forwards);
    CHECK(early.status == DLLM_OK && early.out == ref.out && early.stats.forwards <= ref.stats.forwards);
    if (ref.out.size() + 8 < 64) CHECK(early.stats.forwards < ref.stats.forwards);
}

/* An edit of a small generation's parameters (16 tokens, 16 steps, blocks of 8) and what its error must mention. */
struct test_bad_params {
    void (*edit)(dllm_gen_params &);
    const char *needle;
};

/* Each case's generation of 16 ids after the 3-id prompt is refused as an invalid argument naming its needle. */
template <size_t N>
static void test_params_refused(dllm_test_state &T_, dllm_ctx *ctx, const int32_t *prompt,
                                const test_bad_params (&cases)[N]) {
    int32_t out[16];
    for (const test_bad_params &c : cases) {
        dllm_gen_params p = dllm_gen_default_params();
        p.gen_length = 16, p.steps = 16, p.block_length = 8;
        c.edit(p);
        CHECK_STATUS(dllm_generate(ctx, prompt, 3, p, out, 16, nullptr, nullptr), DLLM_ERR_INVALID_ARGUMENT, c.needle);
    }
}

TEST(schedulers, bad_scheduler_options_are_clear_errors) {
    test_tiny_ctx t(test_data("tiny-llada"));
    if (!t.ctx) { CHECK(t.ctx != nullptr); return; }
    int32_t prompt[] = {5, 6, 7}, masked_prompt[] = {5, 130, 7};
    int32_t out[16];
    const test_bad_params cases[] = {
        {[](dllm_gen_params &p) { p.unmask = (dllm_unmask)7; }, "unmask"},
        {[](dllm_gen_params &p) { p.unmask = DLLM_UNMASK_THRESHOLD, p.threshold = 0; }, "threshold"},
        {[](dllm_gen_params &p) { p.unmask = DLLM_UNMASK_THRESHOLD, p.threshold = NAN; }, "threshold"},
        {[](dllm_gen_params &p) { p.unmask = DLLM_UNMASK_FACTOR, p.factor = -1; }, "factor"},
        {[](dllm_gen_params &p) { p.kv_cache = (dllm_kv_cache)3; }, "kv_cache"},
        {[](dllm_gen_params &p) { p.dpad = DLLM_DPAD_GAUSSIAN, p.dpad_window = 1; }, "dpad_window"},
        {[](dllm_gen_params &p) { p.dpad = DLLM_DPAD_GAUSSIAN, p.dpad_k = NAN; }, "dpad_k"},
        {[](dllm_gen_params &p) { p.dpad = DLLM_DPAD_UNIFORM, p.dpad_n = -1; }, "dpad_n"},
        {[](dllm_gen_params &p) { p.dpad = (dllm_dpad)9; }, "dpad"},
    };
    test_params_refused(T_, t.ctx, prompt, cases);
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = 16, p.steps = 16, p.block_length = 8, p.kv_cache = DLLM_KV_CACHE_DUAL;
    CHECK_STATUS(dllm_generate(t.ctx, masked_prompt, 3, p, out, 16, nullptr, nullptr), DLLM_ERR_INVALID_ARGUMENT,
                 "[MASK] at 1");
    p.kv_cache = DLLM_KV_CACHE_NONE, p.unmask = DLLM_UNMASK_THRESHOLD,
    p.steps = 0;  // steps is ignored by threshold decoding
    CHECK_STATUS(dllm_generate(t.ctx, prompt, 3, p, out, 16, nullptr, nullptr), DLLM_OK, nullptr);
}
