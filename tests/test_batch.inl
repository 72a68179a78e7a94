/* Tests: dllm_generate_batch (issue 26). Every item of a batch gives the tokens, and the logits bit for bit, that
 * it gives decoded alone by dllm_generate, whatever the batch's other items, their lengths and their order;
 * failures stay with their item; the batched forwards are counted once per batched step. */

#include <random>

/* What one generation did: the canvas after every step (step callback) and the logits of every step
 * (dllm__debug_step_logits, keyed by on_step_data). */
struct test_batch_trace {
    std::vector<int32_t> canvases;
    std::vector<float> logits;
    int cancel_after = 0;  // > 0: the callback cancels after this many steps
    int steps = 0;
};

static int test_batch_on_step(const dllm_step_info *info, void *user) {
    test_batch_trace *t = (test_batch_trace *)user;
    t->canvases.insert(t->canvases.end(), info->canvas, info->canvas + info->canvas_len);
    return ++t->steps == t->cancel_after;
}

static void test_batch_logits_hook(void *tag, const float *logits, int rows, int n_vocab) {
    if (!tag) return;
    test_batch_trace *t = (test_batch_trace *)tag;
    t->logits.insert(t->logits.end(), logits, logits + (size_t)rows * n_vocab);
}

/* One item and what it needs: its prompt, output and traces (alone and in the batch). */
struct test_batch_case {
    std::vector<int32_t> prompt;
    dllm_gen_params params;
    int out_capacity = 0;
    std::vector<int32_t> out_alone, out_batch;
    test_batch_trace alone, batch;
    dllm_status status_alone = DLLM_OK;
    int n_alone = 0;
    dllm_gen_stats stats_alone;
};

/* Random parameters across the batched modes: lengths, blocks, counted and threshold/factor rules, remasking,
 * temperature, CFG, seeds, stop rules; Dream's samplers on Dream. */
static dllm_gen_params test_batch_random_params(std::mt19937 &rng, bool dream) {
    auto pick = [&](int n) { return (int)(rng() % (uint32_t)n); };
    dllm_gen_params p = dllm_gen_default_params();
    const int blocks[] = {4, 8}, n_blocks = 1 + pick(3);
    p.block_length = blocks[pick(2)];
    p.gen_length = p.block_length * n_blocks;
    p.steps = n_blocks * (1 + pick(p.block_length));
    p.seed = rng();
    p.temperature = pick(2) ? 0.0f : 0.8f;
    p.cfg_scale = pick(3) == 0 ? 0.5f : 0.0f;
    p.stop_at_eos = pick(2);
    const dllm_unmask rules[] = {DLLM_UNMASK_SCHEDULE, DLLM_UNMASK_THRESHOLD, DLLM_UNMASK_FACTOR,
                                 DLLM_UNMASK_TIMESTEPS};
    p.unmask = rules[pick(dream ? 4 : 3)];
    p.threshold = 0.05 + 0.3 * pick(3);
    p.factor = 0.5 + pick(3);
    const dllm_remasking remasks[] = {DLLM_REMASK_LOW_CONFIDENCE, DLLM_REMASK_RANDOM, DLLM_REMASK_MARGIN,
                                      DLLM_REMASK_ENTROPY};
    p.remasking = remasks[pick(dream ? 4 : 2)];
    if (p.remasking == DLLM_REMASK_ENTROPY) p.threshold = -0.5 - pick(3);
    if (pick(4) == 0) p.top_k = 1 + pick(20);
    if (pick(4) == 0) {  // DPad: each sequence a compacted canvas of its own, rows at their original positions
        p.dpad = pick(2) ? DLLM_DPAD_UNIFORM : DLLM_DPAD_GAUSSIAN;
        p.dpad_window = 2 + pick(12), p.dpad_n = pick(6);
    }
    return p;
}

static void test_batch_make_case(std::mt19937 &rng, const dllm_model_info &info, bool dream, test_batch_case &c) {
    const int n_prompt = 1 + (int)(rng() % 12);
    for (int i = 0; i < n_prompt; i++) {
        int32_t t = (int32_t)(rng() % (uint32_t)info.n_vocab);
        c.prompt.push_back(t == info.mask_id ? 0 : t);
    }
    c.params = test_batch_random_params(rng, dream);
    c.out_capacity = c.params.gen_length;
}

/* dllm_generate of a case, its traces recorded. */
static void test_batch_run_alone(dllm_ctx *ctx, test_batch_case &c) {
    c.alone = test_batch_trace{{}, {}, c.alone.cancel_after, 0};
    c.params.on_step = test_batch_on_step;
    c.params.on_step_data = &c.alone;
    c.out_alone.assign((size_t)std::max(1, c.out_capacity), -7);
    c.status_alone = dllm_generate(ctx, c.prompt.data(), (int)c.prompt.size(), c.params, c.out_alone.data(),
                                   c.out_capacity, &c.n_alone, &c.stats_alone);
}

/* dllm_generate_batch of the cases in the given order; results by case. */
static dllm_status test_batch_run(dllm_ctx *ctx, std::vector<test_batch_case *> order,
                                  std::vector<dllm_batch_result> &results, dllm_gen_stats *bs) {
    std::vector<dllm_batch_item> items(order.size());
    for (size_t i = 0; i < order.size(); i++) {
        test_batch_case &c = *order[i];
        c.batch = test_batch_trace{{}, {}, c.alone.cancel_after, 0};
        c.out_batch.assign((size_t)std::max(1, c.out_capacity), -7);
        items[i].prompt = c.prompt.data(), items[i].n_prompt = (int)c.prompt.size(), items[i].params = c.params;
        items[i].params.on_step = test_batch_on_step, items[i].params.on_step_data = &c.batch;
        items[i].out = c.out_batch.data(), items[i].out_capacity = c.out_capacity;
    }
    results.assign(order.size(), dllm_batch_result());
    return dllm_generate_batch(ctx, items.data(), (int)items.size(), results.data(), bs);
}

/* A case's batch result against its solo run: status, ids, stats, canvases, logits bit for bit. */
static void test_batch_check_case(dllm_test_state &T_, const test_batch_case &c, const dllm_batch_result &r,
                                  const char *what) {
    CHECK_MSG(r.status == c.status_alone, "%s: status %s in the batch, %s alone (%s)", what, dllm_status_str(r.status),
              dllm_status_str(c.status_alone), r.error);
    CHECK_MSG(r.n_out == c.n_alone && c.out_batch == c.out_alone, "%s: %d ids in the batch, %d alone, or other ids",
              what, r.n_out, c.n_alone);
    CHECK_MSG(r.stats.steps == c.stats_alone.steps && r.stats.forwards == c.stats_alone.forwards,
              "%s: steps %d/%d, forwards %d/%d", what, r.stats.steps, c.stats_alone.steps, r.stats.forwards,
              c.stats_alone.forwards);
    CHECK_MSG(c.batch.canvases == c.alone.canvases, "%s: the canvases after each step differ", what);
    const bool same_logits = c.batch.logits.size() == c.alone.logits.size() &&
                             (c.alone.logits.empty() || !memcmp(c.batch.logits.data(), c.alone.logits.data(),
                                                                c.alone.logits.size() * sizeof(float)));
    CHECK_MSG(same_logits, "%s: logits differ (%zu floats in the batch, %zu alone)", what, c.batch.logits.size(),
              c.alone.logits.size());
    CHECK_MSG(c.status_alone != DLLM_OK || !c.alone.logits.empty(),
              "%s: no logits recorded: the test would prove nothing", what);
}

static dllm_status test_batch_first_failure(const std::vector<test_batch_case *> &order) {
    for (const test_batch_case *c : order)
        if (c->status_alone != DLLM_OK) return c->status_alone;
    return DLLM_OK;
}

/* Random batches of 2-5 items on one model, each in two orders, against the items alone. Quantised precisions
 * quantise each row (token) on its own, so they batch exactly too. */
static void test_batch_random_batches(dllm_test_state &T_, const char *model_dir, bool dream, uint32_t seed,
                                      int rounds = 5, dllm_precision precision = DLLM_PRECISION_BF16, bool kv = false) {
    dllm_model *m = test_load(test_data(model_dir));
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_CPU, cp.n_threads = 2, cp.precision = precision;
    dllm_ctx *ctx = nullptr;
    if (m && dllm_ctx_create(m, cp, &ctx) != DLLM_OK)
        fprintf(stdout, "    cannot create a context: %s\n", dllm_last_error());
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    dllm_model_info info;
    dllm_model_get_info(m, &info);
    std::mt19937 rng(seed);
    dllm__debug_step_logits = test_batch_logits_hook;
    int n_cfg = 0, n_dpad = 0, n_sampled = 0, n_rule = 0, n_kv[3] = {0, 0, 0};  // what the random batches covered
    for (int round = 0; round < rounds; round++) {
        std::vector<test_batch_case> cases((size_t)(2 + rng() % 4));
        int n_ok = 0;
        for (test_batch_case &c : cases) {
            test_batch_make_case(rng, info, dream, c);
            if (kv) c.params.kv_cache = (dllm_kv_cache)(rng() % 3);  // none, prefix, dual: mixed in one batch
            n_kv[c.params.kv_cache]++;
            test_batch_run_alone(ctx, c);
            // Not always OK: a threshold/factor block of a tiny random model can hit the step bound (INTERNAL, also
            // in dllm_generate before batching existed); the batch must then fail that item alike.
            n_ok += c.status_alone == DLLM_OK;
            n_cfg += c.params.cfg_scale > 0, n_dpad += c.params.dpad != DLLM_DPAD_OFF,
                n_sampled += c.params.temperature > 0;
            n_rule += c.params.unmask == DLLM_UNMASK_THRESHOLD || c.params.unmask == DLLM_UNMASK_FACTOR;
        }
        CHECK_MSG(n_ok >= 1, "round %d: no item decoded alone", round);
        std::vector<test_batch_case *> order;
        for (test_batch_case &c : cases) order.push_back(&c);
        for (int pass = 0; pass < 2; pass++) {
            if (pass) std::shuffle(order.begin(), order.end(), rng);
            std::vector<dllm_batch_result> results;
            dllm_gen_stats bs;
            const dllm_status want = n_ok == (int)cases.size() ? DLLM_OK : test_batch_first_failure(order);
            CHECK_STATUS(test_batch_run(ctx, order, results, &bs), want, nullptr);
            int max_steps = 0, sum_steps = 0;
            for (size_t i = 0; i < order.size(); i++) {
                char what[96];
                snprintf(what, sizeof what, "%s round %d pass %d item %zu of %zu", model_dir, round, pass, i,
                         order.size());
                test_batch_check_case(T_, *order[i], results[i], what);
                max_steps = std::max(max_steps, results[i].stats.steps);
                sum_steps += results[i].stats.steps;
            }
            // One forward per batched step, whatever the number of sequences in it: the largest step count.
            CHECK_MSG(bs.forwards == max_steps && bs.steps == max_steps,
                      "batch forwards %d, steps %d; the items' largest step count is %d (sum %d)", bs.forwards,
                      bs.steps, max_steps, sum_steps);
        }
    }
    dllm__debug_step_logits = nullptr;
    CHECK_MSG(rounds < 5 || (n_cfg && n_dpad && n_sampled && n_rule),
              "%s: the batches held %d CFG, %d DPad, %d sampled, %d threshold/factor items", model_dir, n_cfg, n_dpad,
              n_sampled, n_rule);
    CHECK_MSG(!kv || (n_kv[DLLM_KV_CACHE_PREFIX] && n_kv[DLLM_KV_CACHE_DUAL]),
              "%s: the batches held %d prefix-cache and %d dual-cache items", model_dir, n_kv[DLLM_KV_CACHE_PREFIX],
              n_kv[DLLM_KV_CACHE_DUAL]);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(batch, llada_items_equal_alone_bit_for_bit) { test_batch_random_batches(T_, "tiny-llada", false, 26); }

TEST(batch, dream_items_equal_alone_bit_for_bit) { test_batch_random_batches(T_, "tiny-dream", true, 2026); }

/* [dual cache] [prefix cache] Items with a K/V cache batch too (forward_batch_kv), beside items without one, each at
 * its own block and step: the same tokens and logits as dllm_generate alone. */
TEST(batch, kv_cache_items_equal_alone_bit_for_bit) {
    test_batch_random_batches(T_, "tiny-llada", false, 31, 5, DLLM_PRECISION_BF16, true);
    test_batch_random_batches(T_, "tiny-dream", true, 32, 4, DLLM_PRECISION_BF16, true);
}

TEST(batch, fp8_and_soloq_items_equal_alone_bit_for_bit) {
    test_batch_random_batches(T_, "tiny-llada", false, 8, 2, DLLM_PRECISION_FP8_ALL);
    test_batch_random_batches(T_, "tiny-dream", true, 9, 2, DLLM_PRECISION_SOLOQ_N);
}

/* The CPU forward of several canvases against each alone, on the forward itself: different lengths, row
 * ranges and positions, the logits compared bit for bit. */
TEST(batch, cpu_forward_seqs_equals_each_forward_alone) {
    dllm_model *m = test_load(test_data("tiny-dream"));
    if (!m) { CHECK(m != nullptr); return; }
    const dllm__config &c = m->cfg;
    dllm__pool pool(2);
    dllm__cpu_buffers b;
    std::vector<float> cos_t, sin_t;
    dllm__rope_tables_cfg(c, 64, cos_t, sin_t);
    std::mt19937 rng(7);
    const int lengths[] = {5, 17, 1, 30};
    std::vector<std::vector<int32_t>> canvases;
    std::vector<dllm__cpu_seq> seqs;
    std::vector<float> alone;
    for (int n : lengths) {
        canvases.emplace_back();
        for (int i = 0; i < n; i++) canvases.back().push_back((int32_t)(rng() % (uint32_t)c.n_vocab));
    }
    for (size_t s = 0; s < canvases.size(); s++) {
        dllm__cpu_seq q;
        q.ids = canvases[s].data(), q.n = (int)canvases[s].size();
        q.r0 = (int)(rng() % (uint32_t)q.n), q.r1 = q.r0 + 1 + (int)(rng() % (uint32_t)(q.n - q.r0));
        seqs.push_back(q);
        std::vector<float> one((size_t)(q.r1 - q.r0) * c.n_vocab, NAN);
        dllm__cpu_forward(*m, pool, b, q.ids, q.n, dllm__cpu_rows(), nullptr, cos_t.data(), sin_t.data(), q.r0, q.r1,
                          one.data());
        alone.insert(alone.end(), one.begin(), one.end());
    }
    std::vector<float> batched(alone.size(), NAN);
    dllm__cpu_forward_seqs(*m, pool, b, seqs, cos_t.data(), sin_t.data(), batched.data(),
                           std::vector<dllm__fp8_layer>(), nullptr);
    CHECK_MSG(!memcmp(batched.data(), alone.data(), alone.size() * sizeof(float)), "%s",
              "a batched forward's logits differ from the forwards alone");
    dllm_model_free(m);
}

/* Failures stay with their item: bad parameters (a block that does not divide, steps that could commit nothing), a
 * small buffer, a cancellation; the others decode as alone. */
TEST(batch, bad_small_and_cancelled_items_fail_alone) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    dllm_model_info info;
    dllm_model_get_info(m, &info);
    std::mt19937 rng(11);
    dllm__debug_step_logits = test_batch_logits_hook;
    std::vector<test_batch_case> cases(6);
    for (test_batch_case &c : cases) test_batch_make_case(rng, info, false, c);
    cases[1].params.block_length = 5;                       // no gen_length here is a multiple of it
    cases[2].out_capacity = cases[2].params.gen_length - 1; // too small
    cases[3].params.steps = cases[3].params.gen_length, cases[3].params.unmask = DLLM_UNMASK_SCHEDULE;
    cases[3].alone.cancel_after = 2;                        // cancelled after its second step
    cases[5].params.unmask = DLLM_UNMASK_SCHEDULE, cases[5].params.steps = 2 * cases[5].params.gen_length;
    for (test_batch_case &c : cases) test_batch_run_alone(ctx, c);
    CHECK(cases[1].status_alone == DLLM_ERR_INVALID_ARGUMENT && cases[2].status_alone == DLLM_ERR_BUFFER_TOO_SMALL &&
          cases[3].status_alone == DLLM_ERR_CANCELLED && cases[0].status_alone == DLLM_OK &&
          cases[4].status_alone == DLLM_OK && cases[5].status_alone == DLLM_ERR_INVALID_ARGUMENT);
    std::vector<test_batch_case *> order;
    for (test_batch_case &c : cases) order.push_back(&c);
    std::vector<dllm_batch_result> results;
    CHECK_STATUS(test_batch_run(ctx, order, results, nullptr), DLLM_ERR_INVALID_ARGUMENT,
                 "block_length (--block) 5");  // the first failing item's
    for (size_t i = 0; i < cases.size(); i++) {
        char what[64];
        snprintf(what, sizeof what, "item %zu", i);
        if (i == 1 || i == 2 || i == 5) {
            CHECK_MSG(results[i].status == cases[i].status_alone && results[i].n_out == cases[i].n_alone,
                      "%s: %s, n_out %d", what, dllm_status_str(results[i].status), results[i].n_out);
            CHECK_MSG(
                std::all_of(cases[i].out_batch.begin(), cases[i].out_batch.end(), [](int32_t t) { return t == -7; }),
                "%s: ids written", what);
            CHECK_MSG(results[i].error[0] != 0, "%s: no message", what);
            continue;
        }
        test_batch_check_case(T_, cases[i], results[i], what);
    }
    CHECK_MSG(strstr(results[2].error, "gen_length") != nullptr, "the small buffer's message: %s", results[2].error);
    CHECK_MSG(results[2].n_out == cases[2].params.gen_length, "n_out %d: the size needed", results[2].n_out);
    CHECK_MSG(strstr(results[5].error, "steps (--steps)") && strstr(results[5].error, "commit anything"),
              "the extra steps' message: %s", results[5].error);
    CHECK(results[0].error[0] == 0 && results[3].status == DLLM_ERR_CANCELLED && strstr(results[3].error, "cancelled"));
    dllm__debug_step_logits = nullptr;
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(batch, empty_and_null_arguments_are_statuses) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    dllm_gen_stats bs;
    bs.steps = -1;
    CHECK_STATUS(dllm_generate_batch(ctx, nullptr, 0, nullptr, &bs), DLLM_OK, nullptr);
    CHECK(bs.steps == 0 && bs.forwards == 0 && bs.n_generated == 0);
    dllm_batch_result r[2];
    dllm_batch_item items[2];
    memset(items, 0, sizeof items);
    CHECK_STATUS(dllm_generate_batch(nullptr, items, 2, r, nullptr), DLLM_ERR_INVALID_ARGUMENT, "ctx is NULL");
    CHECK(r[0].status == DLLM_ERR_INVALID_ARGUMENT && r[1].status == DLLM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(dllm_generate_batch(ctx, nullptr, 2, r, nullptr), DLLM_ERR_INVALID_ARGUMENT, "items and results");
    CHECK_STATUS(dllm_generate_batch(ctx, items, 2, nullptr, nullptr), DLLM_ERR_INVALID_ARGUMENT, "items and results");
    CHECK_STATUS(dllm_generate_batch(ctx, items, -1, r, nullptr), DLLM_ERR_INVALID_ARGUMENT, "n_items -1");
    // Items of zeros: NULL prompt with n_prompt 0 is fine, but NULL out and gen_length 0 are each item's error.
    CHECK_STATUS(dllm_generate_batch(ctx, items, 2, r, nullptr), DLLM_ERR_INVALID_ARGUMENT, "gen_length");
    CHECK(r[0].status == DLLM_ERR_INVALID_ARGUMENT && r[1].status == DLLM_ERR_INVALID_ARGUMENT &&
          strstr(r[1].error, "gen_length"));
    int32_t prompt[2] = {5, 6};
    items[0].prompt = prompt, items[0].n_prompt = 2, items[0].params = dllm_gen_default_params(),
    items[0].params.gen_length = 8;
    items[0].params.steps = 8, items[0].params.block_length = 8;
    CHECK_STATUS(dllm_generate_batch(ctx, items, 1, r, nullptr), DLLM_ERR_INVALID_ARGUMENT,
                 "output buffer");  // out NULL
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

static void test_batch_log(dllm_log_level level, const char *text, void *user) {
    if (level == DLLM_LOG_INFO && strstr(text, "dllm_generate_batch")) *(std::string *)user += text;
}

/* Items with a K/V cache join the batched forward on the CPU (its forward_batch_kv) beside plain and DPad items, each
 * gets its own result, and the batch counts one forward per batched step (two forwards, one per kind, count once). */
TEST(batch, kv_cache_items_join_the_batch) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    dllm_model_info info;
    dllm_model_get_info(m, &info);
    std::mt19937 rng(5);
    std::vector<test_batch_case> cases(5);
    for (test_batch_case &c : cases) test_batch_make_case(rng, info, false, c);
    dllm__debug_step_logits = test_batch_logits_hook;
    cases[1].params.kv_cache = DLLM_KV_CACHE_DUAL;
    cases[2].params.kv_cache = DLLM_KV_CACHE_PREFIX, cases[2].params.cfg_scale = 0.5f;  // two slots
    cases[3].params.dpad = DLLM_DPAD_UNIFORM, cases[3].params.dpad_n = 2;
    cases[4].params.kv_cache = DLLM_KV_CACHE_DUAL, cases[4].params.dpad = DLLM_DPAD_UNIFORM, cases[4].params.dpad_n = 1;
    for (test_batch_case &c : cases) test_batch_run_alone(ctx, c);
    std::string log;
    dllm_log_set(test_batch_log, &log, DLLM_LOG_INFO);
    std::vector<test_batch_case *> order;
    for (test_batch_case &c : cases) order.push_back(&c);
    std::vector<dllm_batch_result> results;
    dllm_gen_stats bs;
    CHECK_STATUS(test_batch_run(ctx, order, results, &bs), DLLM_OK, nullptr);
    dllm_log_set(nullptr, nullptr, DLLM_LOG_WARN);
    int max_steps = 0;
    for (size_t i = 0; i < cases.size(); i++) {
        char what[64];
        snprintf(what, sizeof what, "item %zu (K/V cache %d, DPad %d)", i, (int)cases[i].params.kv_cache,
                 (int)cases[i].params.dpad);
        test_batch_check_case(T_, cases[i], results[i], what);
        max_steps = std::max(max_steps, results[i].stats.steps);
    }
    CHECK_MSG(log.find("one after another") == std::string::npos, "log: %s", log.c_str());
    CHECK_MSG(bs.forwards == max_steps && bs.steps == max_steps,
              "batch forwards %d, steps %d, the items' largest step count %d", bs.forwards, bs.steps, max_steps);
    dllm__debug_step_logits = nullptr;
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}
