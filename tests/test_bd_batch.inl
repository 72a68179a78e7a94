/* Tests: dllm_generate_batch on block-diffusion models (issue 26). Every item of a batch runs the loop dllm_generate
 * runs (dllm__bd_generation, one forward at a time), its forwards in rounds of one bd_forward_batch: each item gives
 * exactly the ids, n_out, stats and step callbacks it gives alone, whatever the batch's other items
 * (prompts shorter than, equal to and longer than a block; blocks, sub-blocks, threshold, block cache, LaCache, seeds;
 * an item that stops early, one its callback cancels, bad ones) and their order; the batch's forwards are the most any
 * item ran, not their sum. */

/* What one generation showed its step callback: per step (block, step in block, steps done, masks left, commits as
 * (position, token)) and the canvas after it. */
struct test_bdi_trace {
    std::vector<int32_t> steps;     // 4 + 2 n_committed ints a step
    std::vector<int32_t> canvases;
    int cancel_after = 0;           // > 0: the callback cancels after this many steps
    int n_steps = 0;
};

static int test_bdi_on_step(const dllm_step_info *info, void *user) {
    test_bdi_trace *t = (test_bdi_trace *)user;
    t->steps.insert(t->steps.end(), {info->block, info->step, info->global_step, info->n_masked});
    for (int i = 0; i < info->n_committed; i++)
        t->steps.insert(t->steps.end(), {info->committed_pos[i], info->canvas[info->committed_pos[i]]});
    t->canvases.insert(t->canvases.end(), info->canvas, info->canvas + info->canvas_len);
    return ++t->n_steps == t->cancel_after;
}

/* One item: its prompt and parameters, and what it gave alone. */
struct test_bdi_case {
    const char *what = "";
    std::vector<int32_t> prompt;
    dllm_gen_params params;
    int out_capacity = 0;
    int cancel_after = 0;
    std::vector<int32_t> out_alone;
    test_bdi_trace alone;
    dllm_status status_alone = DLLM_OK;
    int n_alone = 0;
    dllm_gen_stats stats_alone;
};

/* A prompt of n ids below the mask id and past the stop ids of the fixtures (Fast-dLLM v2: mask 155, stop 152;
 * Nemotron: mask 100, stop 11). */
static std::vector<int32_t> test_bdi_prompt(std::mt19937 &rng, int n) {
    std::vector<int32_t> p((size_t)n);
    for (int32_t &t : p) t = 12 + (int32_t)(rng() % 88);
    return p;
}

static dllm_gen_params test_bdi_params(int gen_length, int block, int sub_block, double tau, int block_cache,
                                       bool lacache, uint64_t seed) {
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = gen_length, p.block_length = block, p.sub_block_length = sub_block;
    if (tau > 0) p.unmask = DLLM_UNMASK_THRESHOLD, p.threshold = tau;
    p.block_cache = block_cache;
    p.lacache = lacache ? DLLM_LACACHE_ON : DLLM_LACACHE_OFF;
    p.seed = seed;
    return p;
}

static int test_bdi_max_out(const test_bdi_case &c) {
    const int B = c.params.block_length;
    return c.params.gen_length / B * B + 1 - (int)c.prompt.size() % B;
}

static void test_bdi_run_alone(dllm_ctx *ctx, test_bdi_case &c) {
    c.alone = test_bdi_trace();
    c.alone.cancel_after = c.cancel_after;
    dllm_gen_params p = c.params;
    p.on_step = test_bdi_on_step, p.on_step_data = &c.alone;
    c.out_alone.assign((size_t)std::max(1, c.out_capacity), -7);
    c.stats_alone = dllm_gen_stats();
    c.status_alone = dllm_generate(ctx, c.prompt.data(), (int)c.prompt.size(), p, c.out_alone.data(), c.out_capacity,
                                   &c.n_alone, &c.stats_alone);
}

/* The cases: prompts around the block boundary (< B, = B, > B, a multiple of B: the AR seed after the prefill), every
 * option, an early stop, a cancellation and two bad items. The stop case's stop token is one its base case generates
 * in its first block, so it ends blocks earlier (checked). */
static std::vector<test_bdi_case> test_bdi_cases(dllm_ctx *ctx, uint64_t seed) {
    std::mt19937 rng((uint32_t)seed);
    std::vector<test_bdi_case> cs(10);
    auto set = [&](size_t i, const char *what, int n_prompt, dllm_gen_params p) {
        cs[i].what = what, cs[i].prompt = test_bdi_prompt(rng, n_prompt), cs[i].params = p;
        cs[i].params.stop_at_eos = (int)(i % 2);
        cs[i].out_capacity = test_bdi_max_out(cs[i]);
    };
    set(0, "L5 B32 default rule", 5, test_bdi_params(64, 32, 0, 0, 0, false, 1));
    set(1, "L32 = B S4 tau0.3 block cache lacache", 32, test_bdi_params(32, 32, 4, 0.3, 1, true, 2));
    set(2, "L40 > B tau0.5 block cache", 40, test_bdi_params(64, 32, 8, 0.5, 1, false, 3));
    set(3, "L8 = B8 S4 tau0.25 lacache", 8, test_bdi_params(24, 8, 4, 0.25, 0, true, 4));
    set(4, "L17 B16 block cache lacache", 17, test_bdi_params(48, 16, 8, 0, 1, true, 77));
    set(5, "L64 = 2B S16 tau0.2 (AR seed after the prefill)", 64, test_bdi_params(32, 32, 16, 0.2, 0, false, 5));
    set(6, "stops at its stop token", 40, cs[2].params);
    cs[6].prompt = cs[2].prompt, cs[6].params.stop_at_eos = 1;
    set(7, "cancelled after 3 steps", 11, test_bdi_params(64, 16, 4, 0.4, 1, true, 6));
    cs[7].cancel_after = 3;
    set(8, "bad: temperature", 9, test_bdi_params(32, 32, 0, 0, 0, false, 7));
    cs[8].params.temperature = 0.5f;
    set(9, "bad: buffer too small", 9, test_bdi_params(32, 32, 0, 0, 0, false, 8));
    cs[9].out_capacity -= 1;
    test_bdi_case base = cs[2];
    test_bdi_run_alone(ctx, base);
    if (base.status_alone == DLLM_OK && base.n_alone > 5)
        cs[6].params.stop_id = base.out_alone[5];  // position 45: the first block
    for (test_bdi_case &c : cs) test_bdi_run_alone(ctx, c);
    return cs;
}

/* dllm_generate_batch of the cases in `order`; each one's result against its run alone: status, ids, n_out, stats,
 * every step callback and canvas. Returns the batch's stats. */
static dllm_gen_stats test_bdi_check_batch(dllm_test_state &T_, dllm_ctx *ctx, std::vector<test_bdi_case> &cs,
                                           const std::vector<size_t> &order, const char *label) {
    const size_t n = order.size();
    std::vector<dllm_batch_item> items(n);
    std::vector<dllm_batch_result> results(n);
    std::vector<std::vector<int32_t>> outs(n);
    std::vector<test_bdi_trace> traces(n);
    for (size_t i = 0; i < n; i++) {
        test_bdi_case &c = cs[order[i]];
        traces[i].cancel_after = c.cancel_after;
        outs[i].assign((size_t)std::max(1, c.out_capacity), -7);
        items[i].prompt = c.prompt.data(), items[i].n_prompt = (int)c.prompt.size(), items[i].params = c.params;
        items[i].params.on_step = test_bdi_on_step, items[i].params.on_step_data = &traces[i];
        items[i].out = outs[i].data(), items[i].out_capacity = c.out_capacity;
    }
    dllm_gen_stats bs;
    const dllm_status s = dllm_generate_batch(ctx, items.data(), (int)n, results.data(), &bs);
    dllm_status first = DLLM_OK;
    for (size_t i = 0; i < n; i++) {
        const test_bdi_case &c = cs[order[i]];
        const dllm_batch_result &r = results[i];
        if (first == DLLM_OK) first = c.status_alone;
        CHECK_MSG(r.status == c.status_alone, "%s %s: status %s in the batch, %s alone (%s)", label, c.what,
                  dllm_status_str(r.status), dllm_status_str(c.status_alone), r.error);
        CHECK_MSG(r.n_out == c.n_alone && outs[i] == c.out_alone, "%s %s: %d ids in the batch, %d alone, or other ids",
                  label, c.what, r.n_out, c.n_alone);
        CHECK_MSG(r.stats.steps == c.stats_alone.steps && r.stats.forwards == c.stats_alone.forwards &&
                      r.stats.n_generated == c.stats_alone.n_generated,
                  "%s %s: steps %d/%d, forwards %d/%d alone", label, c.what, r.stats.steps, c.stats_alone.steps,
                  r.stats.forwards, c.stats_alone.forwards);
        CHECK_MSG(traces[i].steps == c.alone.steps && traces[i].canvases == c.alone.canvases,
                  "%s %s: the step callbacks differ (%d in the batch, %d alone)", label, c.what, traces[i].n_steps,
                  c.alone.n_steps);
    }
    CHECK_MSG(s == first, "%s: the batch returned %s, its first failing item %s", label, dllm_status_str(s),
              dllm_status_str(first));
    return bs;
}

/* The cases on a model, in a batch, reversed, and each in a batch of one. */
static void test_bdi_model(dllm_test_state &T_, dllm_ctx *ctx, uint64_t seed, const char *name) {
    std::vector<test_bdi_case> cs = test_bdi_cases(ctx, seed);
    // The cases are what they say they are: the good ones decode (different lengths), the stop ends early and fewer
    // forwards, the cancel and the bad ones fail with their status.
    for (size_t i = 0; i < 7; i++)  // the stop case may stop at its first token
        CHECK_MSG(cs[i].status_alone == DLLM_OK && (cs[i].n_alone > 0 || i == 6), "%s %s: %s alone, %d ids", name,
                  cs[i].what, dllm_status_str(cs[i].status_alone), cs[i].n_alone);
    CHECK_MSG(cs[6].params.stop_id >= 0 && cs[6].n_alone < test_bdi_max_out(cs[6]) &&
                  cs[6].stats_alone.forwards < cs[2].stats_alone.forwards,
              "%s: the stop case did not stop early (%d ids of %d, %d forwards, %d without the stop)", name,
              cs[6].n_alone, test_bdi_max_out(cs[6]), cs[6].stats_alone.forwards, cs[2].stats_alone.forwards);
    CHECK(cs[7].status_alone == DLLM_ERR_CANCELLED && cs[7].alone.n_steps == 3);
    CHECK(cs[8].status_alone == DLLM_ERR_UNSUPPORTED && cs[9].status_alone == DLLM_ERR_BUFFER_TOO_SMALL);
    CHECK_MSG(cs[9].n_alone == cs[9].out_capacity + 1, "%s: BUFFER_TOO_SMALL says %d ids are needed, the bound is %d",
              name, cs[9].n_alone,
              cs[9].out_capacity + 1);  // the batch's n_out must equal it: test_bdi_check_batch
    std::vector<size_t> order(cs.size());
    int max_forwards = 0, max_steps = 0, sum_forwards = 0;
    for (size_t i = 0; i < cs.size(); i++) {
        order[i] = i;
        max_forwards = std::max(max_forwards, cs[i].stats_alone.forwards),
        max_steps = std::max(max_steps, cs[i].stats_alone.steps);
        sum_forwards += cs[i].stats_alone.forwards;
    }
    const dllm_gen_stats bs = test_bdi_check_batch(T_, ctx, cs, order, name);
    printf(
        "    %s: %zu items in one batch: %d batched forwards (the items alone: %d at most, %d in all), %d steps at "
        "most\n",
        name, cs.size(), bs.forwards, max_forwards, sum_forwards, bs.steps);
    CHECK_MSG(bs.forwards == max_forwards && bs.steps == max_steps,
              "%s: the batch ran %d forwards and %d steps, want %d and %d", name, bs.forwards, bs.steps, max_forwards,
              max_steps);
    std::reverse(order.begin(), order.end());
    std::rotate(order.begin(), order.begin() + 3, order.end());
    test_bdi_check_batch(T_, ctx, cs, order, (std::string(name) + " permuted").c_str());
    for (size_t i : {(size_t)1, (size_t)5})
        test_bdi_check_batch(T_, ctx, cs, {i}, (std::string(name) + " alone in a batch").c_str());
}

TEST(bd_batch, items_equal_alone_fast_dllm_v2) {
    test_tiny_ctx f(test_data("tiny-fast-dllm-v2"));
    CHECK(f.ctx != nullptr);
    if (f.ctx) test_bdi_model(T_, f.ctx, 0xbdb1, "tiny-fast-dllm-v2");
}

TEST(bd_batch, items_equal_alone_nemotron) {
    test_tiny_ctx f(test_data("tiny-nemotron-diffusion"));
    CHECK(f.ctx != nullptr);
    if (f.ctx) test_bdi_model(T_, f.ctx, 0xbdb2, "tiny-nemotron-diffusion");
}

/* kv_quant: each slot has its own codes; the items equal alone under SoloQ's 4- and 2-bit and KIVI's 2-bit caches, in
 * as many forwards as the longest item (test_bdi_model: batched, not one after another). */
TEST(bd_batch, items_equal_alone_under_kv_quant) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    for (dllm_kv_quant q : {DLLM_KV_QUANT_SOLOQ_KV4, DLLM_KV_QUANT_SOLOQ_KV2, DLLM_KV_QUANT_KIVI_KV2}) {
        dllm_ctx_params p = dllm_ctx_default_params();
        p.backend = DLLM_BACKEND_CPU, p.n_threads = 2, p.kv_quant = q;
        dllm_ctx *ctx = nullptr;
        CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_OK, nullptr);
        if (ctx)
            test_bdi_model(T_, ctx, 0xbdb3 + (uint64_t)q, dllm__format("kv_quant %s", dllm__kvq_names[q]).c_str());
        dllm_ctx_free(ctx);
    }
    dllm_model_free(m);
}

/* The official traces (golden_traces.json: the reference's ids, every step's commits, steps and forwards) of every
 * shifted case of both fixtures, all in ONE batch: the batched loop is the official loop. */
static void test_bdi_fixture_in_one_batch(dllm_test_state &T_, const char *fixture) {
    dllm__json root;
    CHECK_STATUS(dllm__json_load(test_data(fixture) + "/golden_traces.json", root), DLLM_OK, nullptr);
    const dllm__json *cases = root.find("cases");
    dllm_model *m = test_load(test_data(fixture));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx || !cases) { CHECK(ctx && cases); dllm_model_free(m); return; }
    std::vector<const dllm__json *> picked;
    for (const dllm__json &cs : cases->items)
        if (!cs.find("shift") || cs.find("shift")->boolean) picked.push_back(&cs);
    const size_t n = picked.size();
    std::vector<std::vector<int32_t>> prompts(n), outs(n);
    std::vector<test_bd_recorder> recs(n);
    std::vector<dllm_batch_item> items(n);
    std::vector<dllm_batch_result> results(n);
    for (size_t i = 0; i < n; i++) {
        const dllm__json &cs = *picked[i];
        prompts[i] = test_json_ids(cs.find("prompt"));
        dllm_gen_params gp = test_bd_case_params(cs);
        gp.on_step = test_bd_on_step, gp.on_step_data = &recs[i];
        outs[i].assign((size_t)gp.gen_length + 1, -7);
        items[i] = {prompts[i].data(), (int)prompts[i].size(), gp, outs[i].data(), (int)outs[i].size()};
    }
    dllm_gen_stats bs;
    CHECK_STATUS(dllm_generate_batch(ctx, items.data(), (int)n, results.data(), &bs), DLLM_OK, nullptr);
    int exact = 0, max_forwards = 0;
    for (size_t i = 0; i < n; i++) {
        const dllm__json &cs = *picked[i];
        std::vector<int32_t> out(outs[i].begin(), outs[i].begin() + std::max(0, results[i].n_out));
        const dllm__json *steps = cs.find("steps");
        bool same = steps && steps->items.size() == recs[i].steps.size() && out == test_json_ids(cs.find("output")) &&
                    results[i].stats.steps == (int)cs.find("n_steps")->integer &&
                    results[i].stats.forwards == (int)cs.find("forwards")->integer;
        for (size_t s = 0; same && s < recs[i].steps.size(); s++) {
            const dllm__json &ws = steps->items[s];
            same = ws.items.size() == recs[i].steps[s].size();
            for (size_t k = 0; same && k < ws.items.size(); k++)
                same = ws.items[k].items[0].integer == recs[i].steps[s][k].first &&
                       ws.items[k].items[1].integer == recs[i].steps[s][k].second;
        }
        CHECK_MSG(same, "%s %s: the batched item differs from the reference", fixture, cs.find("name")->str.c_str());
        exact += same;
        max_forwards = std::max(max_forwards, (int)cs.find("forwards")->integer);
    }
    printf("    %s: %d of %zu reference traces identical in one batch, %d batched forwards\n", fixture, exact, n,
           bs.forwards);
    CHECK(n >= 8 && bs.forwards == max_forwards);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(bd_batch, reference_traces_in_one_batch) {
    test_bdi_fixture_in_one_batch(T_, "tiny-fast-dllm-v2");
    test_bdi_fixture_in_one_batch(T_, "tiny-nemotron-diffusion");
}

/* The backend's side alone: bd_forward_batch over sequences of every kind (a prefill, block-full and sub-block steps
 * with picks, a plain step, a commit), at different committed lengths, gives each sequence bd_forward's logits and
 * dllm__choose's choices over them bit for bit, and a bad slot list is an error, not a crash. */
TEST(bd_batch, cpu_forward_batch_equals_bd_forward) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    dllm__backend_impl &b = *ctx->impl;
    const int V = m->cfg.n_vocab, B = 32;
    std::mt19937 rng(0xbdb5);
    std::vector<int32_t> ids = test_bdi_prompt(rng, 3 * B);
    CHECK_MSG(b.batch_caps().block_diffusion.empty(), "%s", b.batch_caps().block_diffusion.c_str());
    // Slot 0: a 2-block prefill then a block's full step; slot 1: a 1-block prefill then a plain step; slot 2: a block
    // full step then a sub-block step; slot 3: a commit.
    auto call = [&](dllm__bd_kind kind, int start, int T, int offset, int mask, int r0, int r1) {
        dllm__bd_call c;
        c.kind = kind, c.ids = ids.data() + start, c.T = T, c.offset = offset, c.mask_block = mask, c.r0 = r0,
        c.r1 = r1, c.kv_group = B;
        return c;
    };
    dllm__bd_pick pick;
    pick.sampling.eos_logit_inf = true, pick.sampling.eos_id = m->cfg.mask_id;
    pick.pos0 = 70, pick.n = 8, pick.shift0 = 1, pick.lrow0 = 0;
    const std::vector<std::vector<dllm__bd_seq>> rounds = {
        {{0, call(DLLM__BD_COMMIT, 0, 2 * B, 0, B, 2 * B - 1, 2 * B), nullptr},
         {1, call(DLLM__BD_COMMIT, 0, B, 0, B, B - 1, B), nullptr},
         {2, call(DLLM__BD_BLOCK_FULL, B, B, 0, B, 3, 12), &pick}},
        {{2, call(DLLM__BD_SUB_BLOCK, B + 8, 8, 8, 0, 0, 8), &pick},
         {0, call(DLLM__BD_BLOCK_FULL, 2 * B, B, 0, B, 0, 9), &pick},
         {3, call(DLLM__BD_COMMIT, 5, B, 0, B, 0, B), nullptr},
         {1, call(DLLM__BD_STEP, B, B, 0, B, 7, 16), nullptr}},
    };
    const std::vector<int> rows = {4 * B, 3 * B, 2 * B, 2 * B};
    CHECK_STATUS(b.bd_batch_reserve(rows), DLLM_OK, nullptr);
    // The twin: each slot's forwards alone through bd_begin / bd_forward, in the same order, one slot after another.
    std::vector<std::vector<float>> want_logits(rows.size());
    std::vector<std::vector<dllm__choice>> want_choices(rows.size());
    std::vector<std::vector<float>> got_logits(rows.size());
    std::vector<std::vector<dllm__choice>> got_choices(rows.size());
    for (const std::vector<dllm__bd_seq> &round : rounds) {
        size_t n_logits = 0, n_choices = 0;
        for (const dllm__bd_seq &s : round)
            (s.pick ? n_choices : n_logits) += s.pick ? (size_t)s.pick->n : (size_t)(s.call.r1 - s.call.r0) * V;
        std::vector<float> logits(n_logits, NAN);
        std::vector<dllm__choice> choices(n_choices, dllm__choice{-9, NAN, true});
        CHECK_STATUS(b.bd_forward_batch(round, logits.data(), choices.data()), DLLM_OK, nullptr);
        const float *l = logits.data();
        const dllm__choice *c = choices.data();
        for (const dllm__bd_seq &s : round) {
            if (s.pick)
                got_choices[(size_t)s.slot].insert(got_choices[(size_t)s.slot].end(), c, c + s.pick->n), c += s.pick->n;
            else
                got_logits[(size_t)s.slot].insert(got_logits[(size_t)s.slot].end(), l,
                                                  l + (size_t)(s.call.r1 - s.call.r0) * V),
                    l += (size_t)(s.call.r1 - s.call.r0) * V;
        }
    }
    for (size_t slot = 0; slot < rows.size(); slot++) {
        CHECK_STATUS(b.bd_begin(rows[slot]), DLLM_OK, nullptr);
        for (const std::vector<dllm__bd_seq> &round : rounds)
            for (const dllm__bd_seq &s : round) {
                if ((size_t)s.slot != slot) continue;
                std::vector<float> l((size_t)(s.call.r1 - s.call.r0) * V, NAN);
                CHECK_STATUS(b.bd_forward(s.call, l.data()), DLLM_OK, nullptr);
                if (!s.pick) {
                    want_logits[slot].insert(want_logits[slot].end(), l.begin(), l.end());
                    continue;
                }
                for (int i = 0; i < s.pick->n; i++)
                    want_choices[slot].push_back(dllm__choose(l.data() + (size_t)s.pick->logits_row(i) * V, V,
                                                              s.pick->sampling, (uint32_t)(s.pick->pos0 + i), 0));
            }
        const bool logits_same =
            got_logits[slot].size() == want_logits[slot].size() &&
            (want_logits[slot].empty() ||
             !memcmp(got_logits[slot].data(), want_logits[slot].data(), want_logits[slot].size() * 4));
        bool choices_same = got_choices[slot].size() == want_choices[slot].size();
        for (size_t i = 0; choices_same && i < want_choices[slot].size(); i++)
            choices_same = got_choices[slot][i].token == want_choices[slot][i].token &&
                           got_choices[slot][i].conf == want_choices[slot][i].conf &&
                           got_choices[slot][i].deferred == want_choices[slot][i].deferred;
        CHECK_MSG(logits_same && choices_same, "slot %zu: logits %s, choices %s", slot, logits_same ? "same" : "differ",
                  choices_same ? "same" : "differ");
    }
    CHECK(!want_logits[0].empty() && !want_choices[0].empty() && !want_choices[2].empty() && !want_logits[3].empty());
    // A slot out of range, or twice in one forward: an error naming the slot.
    CHECK_STATUS(b.bd_batch_reserve({B, B}), DLLM_OK, nullptr);
    CHECK_STATUS(b.bd_forward_batch({{2, call(DLLM__BD_COMMIT, 0, B, 0, B, 0, 1), nullptr}}, nullptr, nullptr),
                 DLLM_ERR_INTERNAL, "slot 2");
    std::vector<float> l((size_t)2 * V);
    CHECK_STATUS(b.bd_forward_batch({{1, call(DLLM__BD_COMMIT, 0, B, 0, B, 0, 1), nullptr},
                                     {1, call(DLLM__BD_COMMIT, 0, B, 0, B, 0, 1), nullptr}},
                                    l.data(), nullptr),
                 DLLM_ERR_INTERNAL, "slot 1");
    CHECK_STATUS(b.bd_forward_batch({{0, call(DLLM__BD_COMMIT, 0, B, 0, B, 0, 1), nullptr}}, nullptr, nullptr),
                 DLLM_ERR_INTERNAL, "no array");
    CHECK_STATUS(b.bd_batch_reserve({}), DLLM_OK, nullptr);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* The CLI: dllm-generate --prompts FILE --batch 1 and 3 (options opts) print, for every prompt, the ids -p gives it
 * alone, and the stats line counts the batched forwards. */
static void test_cli_prompts_equal_alone(dllm_test_state &T_, const std::string &opts) {
    const char *prompts[] = {"Tell me a story.", "hi",
                             "What is two plus two? Answer briefly, please, and then say something else about it."};
    test_tmpdir dir;
    std::string file, out, err;
    std::vector<std::string> alone;
    for (const char *p : prompts) {
        file += std::string(p) + "\n";
        int rc = test_run_cli("dllm-generate", opts + "-p \"" + p + "\"", "", out, err);
        std::vector<std::string> ids = test_ids_lines(out);
        CHECK_MSG(rc == 0 && ids.size() == 1, "-p %s: exit %d, %s", p, rc, err.c_str());
        alone.push_back(ids.empty() ? "" : ids[0]);
    }
    test_write_file(dir.file("prompts"), file);
    for (const char *batch : {"1", "3"}) {
        int rc = test_run_cli("dllm-generate", opts + "--prompts " + dir.file("prompts") + " --batch " + batch, "", out,
                              err);
        CHECK_MSG(rc == 0 && test_ids_lines(out) == alone, "--batch %s: exit %d, stdout %s, stderr %s", batch, rc,
                  out.c_str(), err.c_str());
        CHECK_MSG(err.find("batched steps") != std::string::npos, "--batch %s: no stats line: %s", batch, err.c_str());
    }
}

/* On a block-diffusion model. */
TEST(bd_batch, cli_prompts_file_equals_one_at_a_time) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    test_cli_prompts_equal_alone(T_, "-m models/tiny-fast-dllm-v2 --backend cpu -n 32 --threshold 0.5 --block-cache "
                                     "--print-ids ");
}

/* On the GPU a prompt gets the same bits alone (dllm_generate) and batched (dllm_generate_batch): without a cache, under
 * each K/V cache, and in block diffusion. */
TEST(gpu_batch, cli_prompts_file_equals_one_at_a_time) {
    NEED_GPU();
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    for (const char *cache : {"none", "dual", "prefix"})
        test_cli_prompts_equal_alone(T_, std::string("-m models/tiny-llada --backend gpu -n 32 --cache ") + cache +
                                             " --print-ids ");
    test_cli_prompts_equal_alone(T_, "-m models/tiny-fast-dllm-v2 --backend gpu -n 32 --threshold 0.5 --print-ids ");
}

/* The CPU backend behind a wrapper that keeps the default bd_forward_batch (unsupported): a backend without the batched
 * block-diffusion forward, as the GPU is without bd_batch. */
struct test_bdi_unbatched : dllm__backend_impl {
    std::unique_ptr<dllm__backend_impl> in;
    dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) override {
        return in->logits(ids, n, r0, r1, out);
    }
    dllm_status begin_block(dllm__decode &st) override { return in->begin_block(st); }
    dllm_status step(dllm__decode &st, std::vector<int32_t> &committed, bool want_host) override {
        return in->step(st, committed, want_host);
    }
    dllm_status bd_begin(int rows) override { return in->bd_begin(rows); }
    dllm_status bd_forward(const dllm__bd_call &call, float *out) override { return in->bd_forward(call, out); }
    void bd_facache_rows(int64_t &rows, int64_t &reused) const override { in->bd_facache_rows(rows, reused); }
};

/* Where the backend has no batched block-diffusion forward the items decode one after another, each exactly as
 * dllm_generate's (facache stats included), the batch's forwards are their sum, and the INFO log names the reason. */
TEST(bd_batch, without_the_batched_forward_items_decode_one_after_another) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    test_bdi_unbatched *w = new test_bdi_unbatched;
    w->in = std::move(ctx->impl);
    ctx->impl.reset(w);
    std::vector<test_bdi_case> cs = test_bdi_cases(ctx, 0xbdb7);
    std::vector<size_t> order(cs.size());
    int sum_forwards = 0;
    for (size_t i = 0; i < cs.size(); i++) order[i] = i, sum_forwards += cs[i].stats_alone.forwards;
    std::string log;
    dllm_log_set(test_batch_log, &log, DLLM_LOG_INFO);
    const dllm_gen_stats bs = test_bdi_check_batch(T_, ctx, cs, order, "unbatched");
    dllm_log_set(nullptr, nullptr, DLLM_LOG_WARN);
    CHECK_MSG(bs.forwards == sum_forwards, "%d forwards, the items' sum %d", bs.forwards, sum_forwards);
    CHECK_MSG(log.find("10 block-diffusion items decode one after another") != std::string::npos &&
                  log.find("no batched block-diffusion forward") != std::string::npos,
              "log: %s", log.c_str());
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

// ---- the GPU backend ------------------------------------------------------------------------------------------

/* The GPU's batched block-diffusion forward (bd_batch, on by default since this test passed on the H100): the
 * cases in one batch give exactly what each gives in a batch of one on the GPU (ids, n_out, stats, every step callback
 * and canvas), permuted too; their ids equal the CPU's where no near-tie decides (most items; the CPU is the reference,
 * gpu.block_diffusion_decoding_matches_cpu explains the rest for dllm_generate). With bd_batch off the items decode
 * one after another, as dllm_generate's (whose solo forwards may pick faster, row-count-tuned GEMMs: so the batch's
 * reference is the batch of one, not dllm_generate). */
TEST(gpu_bd_batch, items_equal_batch_of_one_and_cpu) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    test_knob_set("bd_batch", "0");
    dllm_ctx *cpu = test_ctx(m), *gpu = test_ctx(m, DLLM_BACKEND_GPU);
    CHECK(cpu && gpu && dllm_ctx_get_backend(gpu) == DLLM_BACKEND_GPU);
    if (!cpu || !gpu) { dllm_ctx_free(cpu), dllm_ctx_free(gpu), dllm_model_free(m); return; }
    // Switched off: one after another, each equal to its dllm_generate on the GPU.
    std::vector<test_bdi_case> cs = test_bdi_cases(gpu, 0xbdb6);
    std::vector<size_t> order(cs.size());
    for (size_t i = 0; i < cs.size(); i++) order[i] = i;
    test_bdi_check_batch(T_, gpu, cs, order, "GPU, bd_batch off");
    // By default (a fresh context, whenever the backend reads it): the batch against the batch of one.
    test_knob_reset();
    dllm_ctx_free(gpu);
    gpu = test_ctx(m, DLLM_BACKEND_GPU);
    CHECK(gpu != nullptr);
    if (!gpu) { test_knob_reset(), dllm_ctx_free(cpu), dllm_model_free(m); return; }
    CHECK_MSG(gpu->impl->batch_caps().block_diffusion.empty(), "%s", gpu->impl->batch_caps().block_diffusion.c_str());
    for (test_bdi_case &c : cs) {  // "alone" := the item in a batch of one
        c.alone = test_bdi_trace();
        c.alone.cancel_after = c.cancel_after;
        dllm_batch_item it = {c.prompt.data(), (int)c.prompt.size(), c.params, nullptr, c.out_capacity};
        c.out_alone.assign((size_t)std::max(1, c.out_capacity), -7);
        it.out = c.out_alone.data(), it.params.on_step = test_bdi_on_step, it.params.on_step_data = &c.alone;
        dllm_batch_result r;
        dllm_generate_batch(gpu, &it, 1, &r, nullptr);
        c.status_alone = r.status, c.n_alone = r.n_out, c.stats_alone = r.stats;
    }
    int max_forwards = 0;
    for (const test_bdi_case &c : cs) max_forwards = std::max(max_forwards, c.stats_alone.forwards);
    const dllm_gen_stats bs = test_bdi_check_batch(T_, gpu, cs, order, "GPU batch vs batch of one");
    CHECK_MSG(bs.forwards == max_forwards, "GPU: %d batched forwards, want %d", bs.forwards, max_forwards);
    std::reverse(order.begin(), order.end());
    test_bdi_check_batch(T_, gpu, cs, order, "GPU permuted vs batch of one");
    // The CPU's ids for the same items.
    std::vector<test_bdi_case> ref = cs;
    int good = 0, same = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        test_bdi_run_alone(cpu, ref[i]);
        if (ref[i].status_alone != DLLM_OK || i == 6) continue;  // the stop case's stop token is the GPU base run's
        good++;
        same += ref[i].n_alone == cs[i].n_alone && ref[i].out_alone == cs[i].out_alone;
    }
    printf("    GPU batch vs CPU: %d of %d items the same ids\n", same, good);
    CHECK_MSG(2 * same >= good, "GPU batch vs CPU: only %d of %d items the same ids", same, good);
    test_knob_reset();
    dllm_ctx_free(cpu);
    dllm_ctx_free(gpu);
    dllm_model_free(m);
}

/* [KV quant] kv_quant items batch on the GPU (gpu/batch_kvq.cpp): under SoloQ's KV4 and KV2 caches the cases in one
 * batch, and permuted, give exactly what each gives in a batch of one (ids, n_out, stats, every step callback and
 * canvas); they really are batched: the batch runs as many forwards as its longest item, each one bd_forward_batch
 * call, and no solo block-diffusion forward; and their ids equal dllm_generate's (the solo path over the same codes,
 * other GEMMs) where no near-tie decides (most items), so the batched attention reads the right codes. */
TEST(gpu_bd_batch, kv_quant_items_equal_batch_of_one) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    for (dllm_kv_quant q : {DLLM_KV_QUANT_SOLOQ_KV4, DLLM_KV_QUANT_SOLOQ_KV2}) {
        dllm_ctx_params p = dllm_ctx_default_params();
        p.backend = DLLM_BACKEND_GPU, p.kv_quant = q;
        dllm_ctx *gpu = test_ctx_params(m, p);
        CHECK(gpu && dllm_ctx_get_backend(gpu) == DLLM_BACKEND_GPU);
        if (!gpu || dllm_ctx_get_backend(gpu) != DLLM_BACKEND_GPU) { dllm_ctx_free(gpu); continue; }
        const char *name = dllm__kvq_names[q];
        dllm__gpu_backend *g = (dllm__gpu_backend *)gpu->impl.get();
        CHECK_MSG(gpu->impl->batch_caps().block_diffusion.empty(), "%s: %s", name,
                  gpu->impl->batch_caps().block_diffusion.c_str());
        std::vector<test_bdi_case> cs = test_bdi_cases(gpu, 0xbdc0 + (uint64_t)q);  // alone: dllm_generate
        const std::vector<test_bdi_case> solo = cs;
        for (test_bdi_case &c : cs) {  // "alone" := the item in a batch of one
            c.alone = test_bdi_trace();
            c.alone.cancel_after = c.cancel_after;
            dllm_batch_item it = {c.prompt.data(), (int)c.prompt.size(), c.params, nullptr, c.out_capacity};
            c.out_alone.assign((size_t)std::max(1, c.out_capacity), -7);
            it.out = c.out_alone.data(), it.params.on_step = test_bdi_on_step, it.params.on_step_data = &c.alone;
            dllm_batch_result r;
            dllm_generate_batch(gpu, &it, 1, &r, nullptr);
            c.status_alone = r.status, c.n_alone = r.n_out, c.stats_alone = r.stats;
        }
        std::vector<size_t> order(cs.size());
        int max_forwards = 0;
        for (size_t i = 0; i < cs.size(); i++)
            order[i] = i, max_forwards = std::max(max_forwards, cs[i].stats_alone.forwards);
        auto solo_forwards = [&] {
            int64_t n = 0;
            for (dllm__graph_action a :
                 {DLLM__GRAPH_EAGER, DLLM__GRAPH_REPLAY, DLLM__GRAPH_UPDATE, DLLM__GRAPH_INSTANTIATE})
                n += g->bd_graph_count(a);
            return n;
        };
        const int64_t batched0 = g->bd_batch_forwards(), solo0 = solo_forwards();
        const dllm_gen_stats bs = test_bdi_check_batch(T_, gpu, cs, order, dllm__format("GPU %s batch", name).c_str());
        const int64_t batched = g->bd_batch_forwards() - batched0, solo_run = solo_forwards() - solo0;
        printf("    GPU %s: %zu items, %d batched forwards (%lld bd_forward_batch calls, %lld solo forwards), the "
               "longest item alone %d\n",
               name, cs.size(), bs.forwards, (long long)batched, (long long)solo_run, max_forwards);
        CHECK_MSG(bs.forwards == max_forwards && batched == bs.forwards && solo_run == 0,
                  "%s: %d forwards (%lld batched calls, %lld solo), want %d batched calls and none solo", name,
                  bs.forwards, (long long)batched, (long long)solo_run, max_forwards);
        std::reverse(order.begin(), order.end());
        std::rotate(order.begin(), order.begin() + 3, order.end());
        test_bdi_check_batch(T_, gpu, cs, order, dllm__format("GPU %s permuted", name).c_str());
        int good = 0, same = 0;
        for (size_t i = 0; i < cs.size(); i++) {
            if (solo[i].status_alone != DLLM_OK || i == 6) continue;  // the stop case's stop token is the solo run's
            good++;
            same += solo[i].n_alone == cs[i].n_alone && solo[i].out_alone == cs[i].out_alone;
        }
        printf("    GPU %s batch vs dllm_generate: %d of %d items the same ids\n", name, same, good);
        CHECK_MSG(2 * same >= good, "%s batch vs dllm_generate: only %d of %d items the same ids", name, same, good);
        dllm_ctx_free(gpu);
    }
    dllm_model_free(m);
}

/* [KV quant] A stepper's slots under kv_quant hold codes as a generation alone would (kvq_begin's buffers for the
 * slot's rows: codes, V side, sinks, key pairs once committed), no bf16 committed rows; freed with the stepper. */
TEST(gpu_bd_batch, kv_quant_slots_hold_codes_only) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    const dllm__config &c = m->cfg;
    for (dllm_kv_quant q : {DLLM_KV_QUANT_SOLOQ_KV4, DLLM_KV_QUANT_SOLOQ_KV2}) {
        dllm_ctx_params p = dllm_ctx_default_params();
        p.backend = DLLM_BACKEND_GPU, p.kv_quant = q;
        dllm_ctx *gpu = test_ctx_params(m, p);
        if (!gpu || dllm_ctx_get_backend(gpu) != DLLM_BACKEND_GPU) {
            CHECK(gpu != nullptr);
            dllm_ctx_free(gpu);
            continue;
        }
        dllm__gpu_backend *g = (dllm__gpu_backend *)gpu->impl.get();
        std::mt19937 rng(0xbdc7);
        std::vector<std::vector<int32_t>> prompts, outs(3);
        std::vector<dllm_batch_item> items(3);
        dllm_stepper_params sp = dllm_stepper_default_params();
        sp.max_sequences = 3;
        dllm_stepper *st = nullptr;
        CHECK_STATUS(dllm_stepper_create(gpu, sp, &st), DLLM_OK, nullptr);
        for (int i = 0; st && i < 3; i++) {
            prompts.push_back(test_bdi_prompt(rng, 20 + 25 * i));
            items[i].prompt = prompts.back().data(), items[i].n_prompt = (int)prompts.back().size();
            items[i].params = test_bdi_params(64, 32, 8, 0.5, 1, false, (uint64_t)i + 1);
            outs[i].assign(128, -7);
            items[i].out = outs[i].data(), items[i].out_capacity = 128;
            int id = -1;
            CHECK_STATUS(dllm_stepper_add(st, &items[i], &id), DLLM_OK, nullptr);
        }
        if (st) {
            CHECK_STATUS(dllm_stepper_step(st), DLLM_OK, nullptr);  // the prompts' commits
            const int kvd = c.n_head_kv * c.head_dim, bits = dllm__kvq_bits(q), sinks = dllm__kvq_default_sinks(c);
            size_t least = 0, most = 0, bf16 = 0;
            for (const dllm__kv_slot &k : st->slots) {
                const size_t r = (size_t)k.rows;
                least += (size_t)c.n_layer * (2 * r * kvd * bits / 8 + r * c.n_head_kv * 4 +
                                              std::min<size_t>(r, (size_t)sinks) * 4 * kvd);
                most += (size_t)c.n_layer * ((r + 31) / 32) * kvd * 4;  // the key pairs: groups of the block, 32
                bf16 += (size_t)c.n_layer * r * 4 * kvd;
            }
            most += least;
            const size_t got = g->bd_batch_committed_bytes();
            printf("    %s: %zu slots, %zu device bytes of committed caches (codes alone %zu, with key pairs %zu; "
                   "bf16 would take %zu)\n",
                   dllm__kvq_names[q], st->slots.size(), got, least, most, bf16);
            CHECK_MSG(st->slots.size() == 3 && got >= least && got <= most && got < bf16,
                      "%s: %zu bytes in %zu slots, want %zu to %zu", dllm__kvq_names[q], got, st->slots.size(), least,
                      most);
            while (dllm_stepper_n_active(st) > 0) CHECK_STATUS(dllm_stepper_step(st), DLLM_OK, nullptr);
            dllm_stepper_free(st);
            CHECK_MSG(g->bd_batch_committed_bytes() == 0, "%s: %zu bytes left after the stepper", dllm__kvq_names[q],
                      g->bd_batch_committed_bytes());
        }
        dllm_ctx_free(gpu);
    }
    dllm_model_free(m);
}

/* One answer per prompt for block diffusion: test_bdi_model on the GPU, where dllm_generate (the cases' "alone") is a
 * batch of one: every case in one batch, permuted and alone in a batch gives exactly dllm_generate's status, ids,
 * stats and step callbacks, in BF16, FP8 (all linears) and SoloQ-I (tiny-fast-dllm-v2; the Nemotron fixture's sizes
 * are not the GPU's multiples of 8, and test_bdi_model's cases are written for the fixtures' stop and mask ids). */
TEST(gpu_bd_batch, generate_equals_batch_bit_for_bit) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    for (dllm_precision p : {DLLM_PRECISION_BF16, DLLM_PRECISION_FP8_ALL, DLLM_PRECISION_SOLOQ_I}) {
        dllm_ctx *gpu = test_ctx_precision(m, DLLM_BACKEND_GPU, p);
        CHECK(gpu != nullptr);
        if (gpu)
            test_bdi_model(T_, gpu, 0xbdd0 + (uint64_t)p,
                           dllm__format("GPU tiny-fast-dllm-v2 %s", dllm__precision_name(p)).c_str());
        dllm_ctx_free(gpu);
    }
    dllm_model_free(m);
}

/* tuned_forwards = 1 takes dllm_generate's own forwards: a block-diffusion generation under LaCache reuses layer 0's
 * rows there (the batched forward reuses none); in a batch such an item decodes alone, with what it gets from
 * dllm_generate. */
TEST(gpu_batch, tuned_forwards_take_the_solo_forwards) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    dllm_ctx *gpu = m ? test_ctx(m, DLLM_BACKEND_GPU) : nullptr;
    if (!gpu) { CHECK(gpu); dllm_model_free(m); return; }
    std::mt19937 rng(0x7f);
    test_bdi_case c;
    c.prompt = test_bdi_prompt(rng, 40), c.params = test_bdi_params(64, 32, 8, 0.5, 0, true, 3);
    c.params.stop_at_eos = 0, c.out_capacity = test_bdi_max_out(c);
    test_bdi_run_alone(gpu, c);
    const test_bdi_case batched = c;
    c.params.tuned_forwards = 1;
    test_bdi_run_alone(gpu, c);
    CHECK_STATUS(batched.status_alone, DLLM_OK, nullptr);
    CHECK_STATUS(c.status_alone, DLLM_OK, nullptr);
    printf("    FACache rows: %d (%d reused) tuned, %d batched\n", c.stats_alone.facache_rows,
           c.stats_alone.facache_rows_reused, batched.stats_alone.facache_rows);
    CHECK(c.stats_alone.facache_rows > 0 && c.stats_alone.facache_rows_reused > 0 &&
          batched.stats_alone.facache_rows == 0);
    std::vector<test_bdi_case> cs = {c};
    test_bdi_check_batch(T_, gpu, cs, {0}, "tuned_forwards in a batch");
    c.params.tuned_forwards = 2;
    std::vector<int32_t> out((size_t)c.out_capacity);
    CHECK_STATUS(dllm_generate(gpu, c.prompt.data(), (int)c.prompt.size(), c.params, out.data(), c.out_capacity,
                               nullptr, nullptr),
                 DLLM_ERR_INVALID_ARGUMENT, "tuned_forwards");
    dllm_ctx_free(gpu);
    dllm_model_free(m);
}
