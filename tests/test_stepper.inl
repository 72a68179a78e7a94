/* Tests: continuous batching (dllm_stepper; issue 42). Sequences join a running stepper at random step boundaries, some
 * wait (max_sequences), some are cancelled before they join or after a step, each is removed at a random step after it
 * ended; every one gets exactly what dllm_generate gives it alone: status, ids, stats, every step callback and canvas
 * and (the CPU's plain schedules) the logits of every step, bit for bit. Each step's events (dllm_stepper_poll) are
 * that step; the K/V cache slots and the host memory of a long run stop growing. test_stepper_gpu.inl runs the same on
 * the GPU against each sequence decoded as a batch of one. */

#include <malloc.h>
#include <numeric>

/* What one generation showed its step callback: per step (block, step in block, steps done, masks left, commits as
 * (position, token)), the canvas after it, and the logits it chose from (dllm__debug_step_logits); the last step's
 * canvas and commits, and how many steps the callback saw since the driver last looked. */
struct test_stepper_trace {
    std::vector<int32_t> steps, canvases;
    std::vector<float> logits;
    int n_steps = 0, cancel_after = 0;  // cancel_after > 0: the callback cancels after this many steps
    int calls = 0;
    std::vector<int32_t> last_canvas, last_committed;
    int last_global_step = 0;
};

static int test_stepper_on_step(const dllm_step_info *info, void *user) {
    test_stepper_trace *t = (test_stepper_trace *)user;
    t->steps.insert(t->steps.end(), {info->block, info->step, info->global_step, info->n_masked});
    for (int i = 0; i < info->n_committed; i++)
        t->steps.insert(t->steps.end(), {info->committed_pos[i], info->canvas[info->committed_pos[i]]});
    t->canvases.insert(t->canvases.end(), info->canvas, info->canvas + info->canvas_len);
    t->last_canvas.assign(info->canvas, info->canvas + info->canvas_len);
    t->last_committed.assign(info->committed_pos, info->committed_pos + info->n_committed);
    t->last_global_step = info->global_step;
    t->calls++;
    return ++t->n_steps == t->cancel_after;
}

static void test_stepper_logits_hook(void *tag, const float *logits, int rows, int n_vocab) {
    if (tag)
        ((test_stepper_trace *)tag)
            ->logits.insert(((test_stepper_trace *)tag)->logits.end(), logits, logits + (size_t)rows * n_vocab);
}

/* One sequence: its item, what the reference gave it (dllm_generate alone, or on the GPU a batch of one), and what it
 * got in the stepper. */
struct test_stepper_case {
    std::string what;
    std::vector<int32_t> prompt;
    dllm_gen_params params;
    int out_capacity = 0, cancel_after = 0;  // cancel_after: its step callback's
    test_stepper_trace alone, run;
    std::vector<int32_t> out_alone, out;
    dllm_status status_alone = DLLM_OK;
    int n_alone = 0;
    dllm_gen_stats stats_alone = {};
    dllm_status added = DLLM_OK;    // dllm_stepper_add's status
    dllm_batch_result result = {};  // its last event's
    int id = -1;
    bool finished = false, removed = false, cancelled = false;
};

static dllm_batch_item test_stepper_item(test_stepper_case &c, test_stepper_trace &t, std::vector<int32_t> &out) {
    out.assign((size_t)std::max(1, c.out_capacity), -7);
    dllm_batch_item it = {c.prompt.data(), (int)c.prompt.size(), c.params, out.data(), c.out_capacity};
    it.params.on_step = test_stepper_on_step, it.params.on_step_data = &t;
    return it;
}

/* The reference: dllm_generate alone (batch_of_one: dllm_generate_batch of the item alone, the GPU's reference), its
 * callback cancelling after cancel_after steps. */
static void test_stepper_run_alone(dllm_ctx *ctx, test_stepper_case &c, int cancel_after, bool batch_of_one = false) {
    c.alone = test_stepper_trace();
    c.alone.cancel_after = cancel_after;
    dllm_batch_item it = test_stepper_item(c, c.alone, c.out_alone);
    c.stats_alone = dllm_gen_stats();
    if (batch_of_one) {
        dllm_batch_result r;
        dllm_generate_batch(ctx, &it, 1, &r, nullptr);
        c.status_alone = r.status, c.n_alone = r.n_out, c.stats_alone = r.stats;
        return;
    }
    c.status_alone =
        dllm_generate(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, &c.n_alone, &c.stats_alone);
}

/* A sequence's event after a step, against its step callback: a step of it that ran is the event; a forward without a
 * step (block diffusion's commit) shows one committed position at most; a sequence decoded alone (many steps in one)
 * shows its end, the generated ids all committed. */
static void test_stepper_check_event(dllm_test_state &T_, const test_stepper_case &c, const dllm_seq_event &ev,
                                     const char *label) {
    const dllm_step_info &in = ev.info;
    const char *what = c.what.c_str();
    const std::vector<int32_t> canvas(in.canvas, in.canvas + in.canvas_len),
        committed(in.committed_pos, in.committed_pos + in.n_committed);
    CHECK_MSG(ev.stepped || c.run.calls == 0, "%s %s: %d steps ran, no event", label, what, c.run.calls);
    CHECK_MSG(in.prompt_len == (int)c.prompt.size() && std::equal(c.prompt.begin(), c.prompt.end(), canvas.begin()),
              "%s %s: the event's canvas lacks the prompt", label, what);
    if (c.run.calls == 1)
        CHECK_MSG(canvas == c.run.last_canvas && committed == c.run.last_committed &&
                      in.global_step == c.run.last_global_step,
                  "%s %s: the event is not the step that ran (step %d, %d commits; the callback's %d, %zu)", label,
                  what, in.global_step, in.n_committed, c.run.last_global_step, c.run.last_committed.size());
    if (c.run.calls == 0 && ev.stepped)
        CHECK_MSG(in.n_committed <= 1, "%s %s: a commit forward shows %d commits", label, what, in.n_committed);
    if (c.run.calls > 1 && ev.finished && (ev.result.status == DLLM_OK || ev.result.status == DLLM_ERR_CANCELLED))
        CHECK_MSG(in.canvas_len == in.prompt_len + ev.result.n_out && in.n_committed == ev.result.n_out &&
                      std::equal(c.out.begin(), c.out.begin() + ev.result.n_out, canvas.begin() + in.prompt_len),
                  "%s %s: decoded alone, its event is not its output", label, what);
}

/* Polls every sequence added and not removed after a step: checks its event, keeps its result once it ended, removes
 * it at a random step after that, or cancels it (dllm_stepper_cancel) after a random step of it. */
static void test_stepper_poll_all(dllm_test_state &T_, dllm_stepper *st, std::vector<test_stepper_case> &cs,
                                  std::mt19937 &rng, const char *label) {
    for (test_stepper_case &c : cs) {
        if (c.id < 0 || c.removed) continue;
        dllm_seq_event ev;
        CHECK_STATUS(dllm_stepper_poll(st, c.id, &ev), DLLM_OK, nullptr);
        test_stepper_check_event(T_, c, ev, label);
        if (ev.finished) {
            c.result = ev.result, c.finished = true;
            if (rng() % 3 == 0) {
                CHECK_STATUS(dllm_stepper_remove(st, c.id), DLLM_OK, nullptr);
                CHECK_STATUS(dllm_stepper_poll(st, c.id, &ev), DLLM_ERR_INVALID_ARGUMENT, "no sequence");
                c.removed = true;
            }
        } else if (c.run.calls == 1 && rng() % 10 == 0) {
            CHECK_STATUS(dllm_stepper_cancel(st, c.id), DLLM_OK, nullptr);
            CHECK_STATUS(dllm_stepper_poll(st, c.id, &ev), DLLM_OK, nullptr);
            CHECK(ev.finished && ev.result.status == DLLM_ERR_CANCELLED && strstr(ev.result.error, "cancelled"));
            c.result = ev.result, c.finished = c.cancelled = true;
        }
        c.run.calls = 0;
    }
}

/* The cases through one stepper of max_sequences: three added before the first step, the others at random step
 * boundaries (one the stepper is full for waits; one in eight is cancelled before it joins), at least one added while
 * none decodes. Returns the number of steps. */
static int test_stepper_drive(dllm_test_state &T_, dllm_ctx *ctx, std::vector<test_stepper_case> &cs, std::mt19937 &rng,
                              int max_sequences, const char *label, int max_fill_rows = -1,
                              int *fills_deferred = nullptr) {
    dllm_stepper_params sp = dllm_stepper_default_params();
    sp.max_sequences = max_sequences;
    if (max_fill_rows >= 0) sp.max_fill_rows = max_fill_rows;
    dllm_stepper *st = nullptr;
    CHECK_STATUS(dllm_stepper_create(ctx, sp, &st), DLLM_OK, nullptr);
    if (!st) return 0;
    std::vector<dllm_batch_item> items;
    for (test_stepper_case &c : cs) {
        c.run = test_stepper_trace();
        c.run.cancel_after = c.cancel_after;
        items.push_back(test_stepper_item(c, c.run, c.out));
        c.id = -1, c.finished = c.removed = c.cancelled = false, c.result = dllm_batch_result();
    }
    size_t next = 0;
    int steps = 0, full = 0;
    while (next < cs.size() || dllm_stepper_n_active(st) > 0) {
        int k = steps == 0 ? 3 : (int)(rng() % 3);
        if (k == 0 && dllm_stepper_n_active(st) == 0) k = 1;
        for (; k > 0 && next < cs.size(); k--) {
            test_stepper_case &c = cs[next];
            c.added = dllm_stepper_add(st, &items[next], &c.id);
            if (c.added == DLLM_ERR_FULL) {
                CHECK(dllm_stepper_n_active(st) == max_sequences && c.id == -1 &&
                      dllm_stepper_can_add(st, &items[next]) == DLLM_ERR_FULL);
                full++;
                break;
            }
            next++;
            if (c.added != DLLM_OK) {
                CHECK(c.id == -1);
                continue;
            }
            if (rng() % 8 == 0) {
                CHECK_STATUS(dllm_stepper_cancel(st, c.id), DLLM_OK, nullptr);
                c.cancelled = true;
            }
        }
        CHECK_STATUS(dllm_stepper_step(st), DLLM_OK, nullptr);
        steps++;
        test_stepper_poll_all(T_, st, cs, rng, label);
    }
    for (test_stepper_case &c : cs)
        if (c.id >= 0 && !c.removed) CHECK_STATUS(dllm_stepper_remove(st, c.id), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_stepper_step(st), DLLM_OK, nullptr);  // nothing to do
    if (fills_deferred) *fills_deferred = st->fills_deferred;  // white-box
    dllm_stepper_free(st);
    printf("    %s: %zu sequences in %d steps, at most %d at once (%d adds found it full)\n", label, cs.size(), steps,
           max_sequences, full);
    return steps;
}

/* A case's result in the stepper against its reference. A sequence cancelled after k steps of it is compared with the
 * reference cancelled by its callback after k steps (computed here); one cancelled before it joined ends with
 * nothing. */
static void test_stepper_check_case(dllm_test_state &T_, dllm_ctx *ctx, test_stepper_case &c, const char *label,
                                    bool batch_of_one = false) {
    const char *what = c.what.c_str();
    if (c.added != DLLM_OK) {
        CHECK_MSG(c.added == c.status_alone, "%s %s: dllm_stepper_add said %s, alone %s", label, what,
                  dllm_status_str(c.added), dllm_status_str(c.status_alone));
        return;
    }
    CHECK_MSG(c.finished, "%s %s: never ended", label, what);
    if (c.cancelled && c.run.n_steps == 0) {
        CHECK_MSG(c.result.status == DLLM_ERR_CANCELLED && c.result.n_out == 0 &&
                      std::all_of(c.out.begin(), c.out.end(), [](int32_t t) { return t == -7; }),
                  "%s %s: cancelled before it joined: %s, %d ids", label, what, dllm_status_str(c.result.status),
                  c.result.n_out);
        return;
    }
    test_stepper_case cancelled_alone;
    if (c.cancelled) {
        cancelled_alone = c;
        test_stepper_run_alone(ctx, cancelled_alone, c.run.n_steps, batch_of_one);
    }
    const test_stepper_case &a = c.cancelled ? cancelled_alone : c;  // the reference
    const dllm_batch_result &r = c.result;
    CHECK_MSG(r.status == a.status_alone, "%s %s: status %s in the stepper, %s alone (%s)", label, what,
              dllm_status_str(r.status), dllm_status_str(a.status_alone), r.error);
    CHECK_MSG(r.n_out == a.n_alone && c.out == a.out_alone, "%s %s: %d ids in the stepper, %d alone, or other ids",
              label, what, r.n_out, a.n_alone);
    CHECK_MSG(r.stats.steps == a.stats_alone.steps && r.stats.forwards == a.stats_alone.forwards &&
                  r.stats.n_generated == a.stats_alone.n_generated,
              "%s %s: steps %d/%d, forwards %d/%d", label, what, r.stats.steps, a.stats_alone.steps, r.stats.forwards,
              a.stats_alone.forwards);
    CHECK_MSG(c.run.steps == a.alone.steps && c.run.canvases == a.alone.canvases,
              "%s %s: the step callbacks differ (%d in the stepper, %d alone)", label, what, c.run.n_steps,
              a.alone.n_steps);
    const bool same_logits = c.run.logits.size() == a.alone.logits.size() &&
                             (a.alone.logits.empty() || !memcmp(c.run.logits.data(), a.alone.logits.data(),
                                                                a.alone.logits.size() * sizeof(float)));
    CHECK_MSG(same_logits, "%s %s: logits differ (%zu floats in the stepper, %zu alone)", label, what,
              c.run.logits.size(), a.alone.logits.size());
}

/* Random LLaDA / Dream cases (test_batch_make_case's modes: rules, remasking, temperature, CFG, DPad, filters; K/V
 * caches mixed in with kv), one with a bad block_length, one cancelled by its callback. */
static std::vector<test_stepper_case> test_stepper_plain_cases(dllm_ctx *ctx, const dllm_model_info &info, bool dream,
                                                               bool kv, std::mt19937 &rng, int n) {
    std::vector<test_stepper_case> cs((size_t)n);
    for (int i = 0; i < n; i++) {
        test_batch_case b;
        test_batch_make_case(rng, info, dream, b);
        test_stepper_case &c = cs[(size_t)i];
        c.prompt = b.prompt, c.params = b.params, c.out_capacity = b.out_capacity;
        if (kv) c.params.kv_cache = (dllm_kv_cache)(rng() % 3);
        if (i == 1) c.params.block_length = 5;  // bad: no gen_length here is a multiple of it
        if (i == 2) c.cancel_after = 1;
        c.what = dllm__format("case %d (gen %d, block %d, unmask %d, cfg %g, dpad %d, kv %d)", i, c.params.gen_length,
                              c.params.block_length, (int)c.params.unmask, (double)c.params.cfg_scale,
                              (int)c.params.dpad, (int)c.params.kv_cache);
        test_stepper_run_alone(ctx, c, c.cancel_after);
    }
    return cs;
}

/* A model's cases through steppers of 2, 4 and all at once, each against dllm_generate; dllm_generate runs between
 * steps of the last one (a solo generation beside the stepper's). */
static void test_stepper_plain_model(dllm_test_state &T_, const char *model_dir, bool dream, bool kv, uint32_t seed,
                                     dllm_precision precision = DLLM_PRECISION_BF16) {
    dllm_model *m = test_load(test_data(model_dir));
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_CPU, cp.n_threads = 2, cp.precision = precision;
    dllm_ctx *ctx = nullptr;
    if (m) dllm_ctx_create(m, cp, &ctx);
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    dllm_model_info info;
    dllm_model_get_info(m, &info);
    std::mt19937 rng(seed);
    dllm__debug_step_logits = test_stepper_logits_hook;
    std::vector<test_stepper_case> cs = test_stepper_plain_cases(ctx, info, dream, kv, rng, 12);
    int n_ok = 0;
    for (const test_stepper_case &c : cs) n_ok += c.status_alone == DLLM_OK;
    CHECK_MSG(n_ok >= 6 && cs[1].status_alone == DLLM_ERR_INVALID_ARGUMENT && cs[2].status_alone == DLLM_ERR_CANCELLED,
              "%s: %d of %zu decoded alone", model_dir, n_ok, cs.size());
    int n_cancelled[2] = {0, 0};  // before joining, after a step
    for (int max_sequences : {2, 4, 12}) {
        const std::string label = dllm__format("%s%s max %d", model_dir, kv ? " kv" : "", max_sequences);
        test_stepper_drive(T_, ctx, cs, rng, max_sequences, label.c_str());
        for (test_stepper_case &c : cs) {
            test_stepper_check_case(T_, ctx, c, label.c_str());
            if (c.cancelled) n_cancelled[c.run.n_steps > 0]++;
        }
    }
    CHECK_MSG(n_cancelled[0] > 0 && n_cancelled[1] > 0,
              "%s: %d sequences cancelled before joining, %d after a step: the test proves less", model_dir,
              n_cancelled[0], n_cancelled[1]);
    if (kv) {  // one fill a step (max_fill_rows 1): the others wait, and nothing but when their tokens come changes
        const std::string label = dllm__format("%s kv max 12, one fill a step", model_dir);
        int deferred = 0;
        test_stepper_drive(T_, ctx, cs, rng, 12, label.c_str(), 1, &deferred);
        for (test_stepper_case &c : cs) test_stepper_check_case(T_, ctx, c, label.c_str());
        CHECK_MSG(deferred > 0, "%s: no fill waited: the test proves less", label.c_str());
        printf("    %s: %d fills waited a step\n", label.c_str(), deferred);
    }
    dllm__debug_step_logits = nullptr;
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(stepper, llada_sequences_joining_and_leaving_equal_alone) {
    test_stepper_plain_model(T_, "tiny-llada", false, false, 42);
}

TEST(stepper, dream_sequences_joining_and_leaving_equal_alone) {
    test_stepper_plain_model(T_, "tiny-dream", true, false, 4242);
}

/* [dual cache] [prefix cache] Sequences with K/V caches join and leave beside those without: each takes a slot freed by
 * an earlier one or a new one, and decodes exactly as alone. */
TEST(stepper, kv_cache_sequences_joining_and_leaving_equal_alone) {
    test_stepper_plain_model(T_, "tiny-llada", false, true, 43);
    test_stepper_plain_model(T_, "tiny-dream", true, true, 44);
}

TEST(stepper, fp8_and_soloq_sequences_equal_alone) {
    test_stepper_plain_model(T_, "tiny-llada", false, true, 45, DLLM_PRECISION_FP8_ALL);
    test_stepper_plain_model(T_, "tiny-dream", true, false, 46, DLLM_PRECISION_SOLOQ_N);
}

/* Block diffusion: test_bdi_cases' items (prompts around the block, every option, a stop, a callback's cancellation,
 * two bad ones) joining and leaving, each against dllm_generate; each block commit forward is an event of its own. */
static void test_stepper_bd_model(dllm_test_state &T_, const char *model_dir, uint64_t seed,
                                  dllm_kv_quant kv_quant = DLLM_KV_QUANT_NONE) {
    dllm_model *m = test_load(test_data(model_dir));
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_CPU, cp.n_threads = 2, cp.kv_quant = kv_quant;
    dllm_ctx *ctx = nullptr;
    if (m) dllm_ctx_create(m, cp, &ctx);
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    std::vector<test_stepper_case> cs;
    for (const test_bdi_case &b : test_bdi_cases(ctx, seed)) {
        test_stepper_case c;
        c.what = b.what, c.prompt = b.prompt, c.params = b.params, c.out_capacity = b.out_capacity,
        c.cancel_after = b.cancel_after;
        test_stepper_run_alone(ctx, c, c.cancel_after);
        cs.push_back(c);
    }
    std::mt19937 rng((uint32_t)seed);
    for (int max_sequences : {3, 10}) {
        const std::string label = dllm__format("%s%s max %d", model_dir, kv_quant ? " kv_quant" : "", max_sequences);
        test_stepper_drive(T_, ctx, cs, rng, max_sequences, label.c_str());
        for (test_stepper_case &c : cs) test_stepper_check_case(T_, ctx, c, label.c_str());
    }
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(stepper, block_diffusion_sequences_joining_and_leaving_equal_alone) {
    test_stepper_bd_model(T_, "tiny-fast-dllm-v2", 0x5701);
    test_stepper_bd_model(T_, "tiny-nemotron-diffusion", 0x5702);
    test_stepper_bd_model(T_, "tiny-fast-dllm-v2", 0x5703, DLLM_KV_QUANT_SOLOQ_KV2);
    test_stepper_bd_model(T_, "tiny-fast-dllm-v2", 0x5704, DLLM_KV_QUANT_SOLOQ_KV4);
}

/* LLaDA2 batches through the block-diffusion rounds (decode/batch_bd.cpp): sequences of both loops (2.0's schedule,
 * 2.1's edits and post-fill forwards), prompts ending inside a block and on its boundary, joining and leaving at random
 * steps, each exactly as dllm_generate alone (canvas, callbacks, output, stats); the forwards are shared (fewer
 * stepper steps than the sequences' forwards alone). */
static void test_stepper_llada2(dllm_test_state &T_, const char *model_dir, dllm_precision precision, uint32_t seed) {
    dllm_model *m = test_load(model_dir);
    dllm_ctx *ctx = m ? test_ctx_precision(m, DLLM_BACKEND_CPU, precision) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    std::mt19937 rng(seed);
    std::vector<test_stepper_case> cs(7);
    int forwards_alone = 0;
    for (size_t i = 0; i < cs.size(); i++) {
        test_stepper_case &c = cs[i];
        const int n_prompt = i == 2 ? 8 : 3 + (int)i;  // case 2: the prompt ends on a block boundary
        for (int j = 0; j < n_prompt; j++) c.prompt.push_back(5 + (int32_t)(rng() % 50));
        c.params = dllm_gen_default_params();
        c.params.gen_length = 12 + 4 * (int)(i % 3), c.params.block_length = 8, c.params.steps = 4 + (int)(i % 5);
        c.params.stop_at_eos = 0, c.params.threshold = 0.05 + 0.1 * (double)(i % 4);
        if (i % 2) c.params.edit_threshold = 0.5, c.params.max_post_steps = (int)(i % 3);
        c.out_capacity = c.params.gen_length;
        c.what = dllm__format("llada2 case %zu", i);
        test_stepper_run_alone(ctx, c, 0);
        CHECK_MSG(c.status_alone == DLLM_OK, "%s: %s alone", c.what.c_str(), dllm_status_str(c.status_alone));
        forwards_alone += c.stats_alone.forwards;
    }
    for (int max_sequences : {3, 10}) {
        const std::string label =
            dllm__format("%s %s max %d", model_dir, dllm__precision_name(precision), max_sequences);
        const int steps = test_stepper_drive(T_, ctx, cs, rng, max_sequences, label.c_str());
        for (test_stepper_case &c : cs) test_stepper_check_case(T_, ctx, c, label.c_str());
        printf("    %s: %d stepper steps for %d forwards alone\n", label.c_str(), steps, forwards_alone);
        CHECK_MSG(steps < forwards_alone, "%s: %d steps, no fewer than the %d forwards alone", label.c_str(), steps,
                  forwards_alone);
    }
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(stepper, llada2_sequences_joining_and_leaving_equal_alone) {
    test_stepper_llada2(T_, test_data("llada2").c_str(), DLLM_PRECISION_BF16, 0x11ad);
}

/* The same under FP8 and SoloQ (every row quantised on its own: a sequence's bits do not depend on the batch). */
TEST(stepper, llada2_fp8_and_soloq_sequences_equal_alone) {
    test_stepper_llada2(T_, test_data("llada2").c_str(), DLLM_PRECISION_FP8_ALL, 0x11ae);
    test_stepper_llada2(T_, "models/tiny-llada2", DLLM_PRECISION_SOLOQ_I, 0x11af);
}

/* The host memory in use (glibc's count over every arena; 0 where the allocator does not count, e.g. under ASan). */
static size_t test_heap_in_use() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    return mallinfo2().uordblks;
#else
    return 0;
#endif
}

/* Rounds of the same sequences (random lengths, K/V caches, CFG's second cache) through one stepper, at most 3 at once:
 * a slot outlives its sequence and serves the next that fits, so the slots stop changing after a few rounds, never more
 * than 3 sequences' worth (two caches each) of the largest one, and the host memory in use stops growing too. */
static void test_stepper_memory_rounds(dllm_test_state &T_, dllm_ctx *ctx, std::vector<test_stepper_case> &cs,
                                       const char *label) {
    dllm_stepper_params sp = dllm_stepper_default_params();
    sp.max_sequences = 3;
    dllm_stepper *st = nullptr;
    CHECK_STATUS(dllm_stepper_create(ctx, sp, &st), DLLM_OK, nullptr);
    if (!st) return;
    int largest = 0;
    for (test_stepper_case &c : cs)
        largest = std::max(largest, (int)c.prompt.size() + c.params.gen_length + c.params.block_length + 1);
    std::vector<std::vector<int>> layouts;
    std::vector<size_t> heap;
    std::vector<int64_t> device;  // the GPU backend's buffers (0 on the CPU)
    for (int round = 0; round < 6; round++) {
        std::mt19937 rng(7);  // every round the same schedule
        size_t next = 0;
        std::vector<int> ids;
        while (next < cs.size() || dllm_stepper_n_active(st) > 0) {
            for (int k = (int)(rng() % 3); k >= 0 && next < cs.size(); k--) {
                test_stepper_case &c = cs[next];
                dllm_batch_item it = test_stepper_item(c, c.run, c.out);
                it.params.on_step = nullptr;
                int id = -1;
                const dllm_status s = dllm_stepper_add(st, &it, &id);
                if (s == DLLM_ERR_FULL) break;
                CHECK_STATUS(s, DLLM_OK, nullptr);
                ids.push_back(id), next++;
            }
            CHECK_STATUS(dllm_stepper_step(st), DLLM_OK, nullptr);
            for (size_t i = 0; i < ids.size(); i++) {
                dllm_seq_event ev;
                if (ids[i] < 0 || dllm_stepper_poll(st, ids[i], &ev) != DLLM_OK || !ev.finished) continue;
                CHECK_MSG(ev.result.status == DLLM_OK, "%s: %s", label, ev.result.error);
                CHECK_STATUS(dllm_stepper_remove(st, ids[i]), DLLM_OK, nullptr);
                ids[i] = -1;
            }
        }
        std::vector<int> rows;
        for (const dllm__kv_slot &s : st->slots) {
            rows.push_back(s.rows);
            CHECK_MSG(s.owner == -1 && s.rows <= largest, "%s round %d: a slot of %d rows owned by %d", label, round,
                      s.rows, s.owner);
        }
        CHECK_MSG(rows.size() <= 6, "%s round %d: %zu slots for at most 3 sequences", label, round, rows.size());
        layouts.push_back(rows);
        heap.push_back(test_heap_in_use());
        device.push_back(dllm__device_bytes.load());
    }
    CHECK_MSG(!layouts[0].empty(), "%s: no slot was used: the test would prove nothing", label);
    CHECK_MSG(layouts[5] == layouts[4] && layouts[4] == layouts[3],
              "%s: the slots still change after three rounds (%zu, %zu, %zu slots)", label, layouts[3].size(),
              layouts[4].size(), layouts[5].size());
    CHECK_MSG(heap[5] <= heap[3] + 64 * 1024,
              "%s: the host memory in use grew from %zu to %zu bytes over the last rounds", label, heap[3], heap[5]);
    CHECK_MSG(device[5] == device[3], "%s: the device memory grew from %lld to %lld bytes over the last rounds", label,
              (long long)device[3], (long long)device[5]);
    printf("    %s: %zu slots of %d rows in all; heap in use %zu, %zu, %zu bytes after rounds 4-6; device %lld bytes\n",
           label, layouts[5].size(), std::accumulate(layouts[5].begin(), layouts[5].end(), 0), heap[3], heap[4],
           heap[5], (long long)device[5]);
    dllm_stepper_free(st);
}

/* The memory test's sequences: random prompts and lengths, three in four with a K/V cache, one in five with CFG; on a
 * block-diffusion model random blocks, block caches and thresholds. */
static std::vector<test_stepper_case> test_stepper_memory_cases(bool block_diffusion) {
    std::mt19937 rng(0x3e3);
    std::vector<test_stepper_case> cs(16);
    for (size_t i = 0; i < cs.size(); i++) {
        test_stepper_case &c = cs[i];
        for (int j = 0, n = 1 + (int)(rng() % 12); j < n; j++) c.prompt.push_back(12 + (int32_t)(rng() % 80));
        c.params = dllm_gen_default_params();
        c.params.block_length = 4, c.params.gen_length = 4 * (1 + (int)(rng() % 3)),
        c.params.steps = c.params.gen_length;
        c.params.kv_cache = i % 4 ? (dllm_kv_cache)(1 + i % 2) : DLLM_KV_CACHE_NONE;
        c.params.cfg_scale = i % 5 == 0 ? 0.5f : 0.0f;
        if (block_diffusion)
            c.params = test_bdi_params(16 * (1 + (int)(rng() % 2)), 16, 8, 0.3, (int)(rng() % 2), true, rng());
        c.out_capacity = c.params.gen_length + 1;
    }
    return cs;
}

/* Rounds of many sequences on a backend (tiny-llada, then tiny-fast-dllm-v2): test_stepper_memory_rounds. */
static void test_stepper_memory_on(dllm_test_state &T_, dllm_backend backend) {
    for (const char *model_dir : {"tiny-llada", "tiny-fast-dllm-v2"}) {
        dllm_model *m = test_load(test_data(model_dir));
        dllm_ctx *ctx = m ? test_ctx(m, backend) : nullptr;
        if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
        std::vector<test_stepper_case> cs = test_stepper_memory_cases(dllm__is_block_diffusion(m->cfg));
        test_stepper_memory_rounds(T_, ctx, cs, model_dir);
        dllm_ctx_free(ctx);
        dllm_model_free(m);
    }
}

TEST(stepper, finished_sequences_memory_is_reused) { test_stepper_memory_on(T_, DLLM_BACKEND_CPU); }

/* One fill a step (max_fill_rows 1) and a block a step, so every step of every sequence is a fill: A and B join
 * together (A fills first, then B, A waiting), then C joins while A waits. C's prefill goes first, before A who waited
 * a step, so a new request's first step is not held up by the others' fills; A and B then go in turn. */
TEST(stepper, a_joining_sequence_fills_before_those_waiting) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    dllm_stepper_params sp = dllm_stepper_default_params();
    sp.max_fill_rows = 1;
    dllm_stepper *st = nullptr;
    CHECK_STATUS(dllm_stepper_create(ctx, sp, &st), DLLM_OK, nullptr);
    int32_t prompt[3] = {5, 6, 7}, out[3][8];
    std::fill(&out[0][0], &out[0][0] + 24, -7);  // poison: a sequence's ids past its n_out stay so
    dllm_batch_item it[3];
    int id[3] = {-1, -1, -1};
    for (int i = 0; i < 3; i++) {
        it[i] = {prompt, 3, dllm_gen_default_params(), out[i], 8};
        it[i].params.gen_length = 8, it[i].params.block_length = 4, it[i].params.steps = 2;
        it[i].params.kv_cache = DLLM_KV_CACHE_DUAL;
    }
    auto stepped = [&](int i) {
        dllm_seq_event ev;
        return dllm_stepper_poll(st, id[i], &ev) == DLLM_OK && ev.stepped;
    };
    CHECK_STATUS(dllm_stepper_add(st, &it[0], &id[0]), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_stepper_add(st, &it[1], &id[1]), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_stepper_step(st), DLLM_OK, nullptr);
    CHECK_MSG(stepped(0) && !stepped(1), "step 1: A fills, B waits");
    CHECK_STATUS(dllm_stepper_step(st), DLLM_OK, nullptr);
    CHECK_MSG(!stepped(0) && stepped(1), "step 2: B (joining) fills, A waits");
    CHECK_STATUS(dllm_stepper_add(st, &it[2], &id[2]), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_stepper_step(st), DLLM_OK, nullptr);
    CHECK_MSG(stepped(2) && !stepped(0) && !stepped(1), "step 3: C (joining) fills before A, who waited a step");
    CHECK_STATUS(dllm_stepper_step(st), DLLM_OK, nullptr);
    CHECK_MSG(stepped(0) && !stepped(1) && !stepped(2), "step 4: A, who waited longest");
    int steps = 4;
    for (; dllm_stepper_n_active(st) > 0 && steps < 20; steps++) CHECK_STATUS(dllm_stepper_step(st), DLLM_OK, nullptr);
    int n_out[3] = {-1, -2, -3};
    for (int i = 0; i < 3; i++) {
        dllm_seq_event ev;
        CHECK(dllm_stepper_poll(st, id[i], &ev) == DLLM_OK && ev.finished && ev.result.status == DLLM_OK &&
              ev.result.stats.forwards == 2);
        n_out[i] = ev.result.n_out;
    }
    CHECK_MSG(steps == 6 && n_out[0] == n_out[1] && n_out[0] == n_out[2] && !memcmp(out[0], out[1], sizeof out[0]) &&
                  !memcmp(out[0], out[2], sizeof out[0]),
              "6 steps for 6 fills one a step (took %d), and the same prompt the same ids whenever it stepped", steps);
    dllm_stepper_free(st);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* Misuse is a status naming what to change; a stepper's events before any step; one stepper a context, and
 * dllm_generate_batch not beside it. */
TEST(stepper, misuse_is_a_status_and_events_start_at_the_prompt) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    dllm_stepper *st = nullptr, *other = nullptr;
    dllm_stepper_params sp = dllm_stepper_default_params();
    CHECK(sp.max_sequences == 16 && sp.max_fill_rows == 1024);
    CHECK_STATUS(dllm_stepper_create(nullptr, sp, &st), DLLM_ERR_INVALID_ARGUMENT, "ctx");
    sp.max_fill_rows = -1;
    CHECK_STATUS(dllm_stepper_create(ctx, sp, &st), DLLM_ERR_INVALID_ARGUMENT, "max_fill_rows");
    sp.max_fill_rows = 1024, sp.max_sequences = 0;
    CHECK_STATUS(dllm_stepper_create(ctx, sp, &st), DLLM_ERR_INVALID_ARGUMENT, "max_sequences");
    sp.max_sequences = 1;
    CHECK_STATUS(dllm_stepper_create(ctx, sp, &st), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_stepper_create(ctx, sp, &other), DLLM_ERR_INVALID_ARGUMENT, "has a stepper");
    CHECK(other == nullptr);
    int32_t prompt[3] = {5, 6, 7}, out[8];
    dllm_batch_item it = {prompt, 3, dllm_gen_default_params(), out, 8};
    it.params.gen_length = 8, it.params.block_length = 4, it.params.steps = 8;
    dllm_batch_result r;
    CHECK_STATUS(dllm_generate_batch(ctx, &it, 1, &r, nullptr), DLLM_ERR_INVALID_ARGUMENT, "dllm_stepper");
    int id = 5;
    CHECK_STATUS(dllm_stepper_add(st, nullptr, &id), DLLM_ERR_INVALID_ARGUMENT, "non-NULL");
    CHECK(id == -1);
    dllm_batch_item bad = it;
    bad.out_capacity = 7;
    CHECK_STATUS(dllm_stepper_can_add(st, &bad), DLLM_ERR_BUFFER_TOO_SMALL, "gen_length (-n) = 8");
    CHECK_STATUS(dllm_stepper_add(st, &bad, &id), DLLM_ERR_BUFFER_TOO_SMALL, "gen_length (-n) = 8");
    CHECK(id == -1 && dllm_stepper_n_active(st) == 0);
    CHECK_STATUS(dllm_stepper_can_add(st, &it), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_stepper_add(st, &it, &id), DLLM_OK, nullptr);
    prompt[0] = 99;  // the stepper copied the prompt
    int id2 = -1;
    CHECK_STATUS(dllm_stepper_add(st, &it, &id2), DLLM_ERR_FULL, "max_sequences");
    CHECK_STATUS(dllm_stepper_can_add(st, &it), DLLM_ERR_FULL, "step until one ends");
    dllm_seq_event ev;
    CHECK_STATUS(dllm_stepper_poll(st, id, &ev), DLLM_OK, nullptr);
    CHECK(!ev.stepped && !ev.finished && ev.info.canvas_len == 11 && ev.info.prompt_len == 3 &&
          ev.info.canvas[0] == 5 && ev.info.n_masked == 8 && ev.info.n_committed == 0 && ev.info.n_blocks == 2);
    CHECK_STATUS(dllm_stepper_poll(st, id + 1, &ev), DLLM_ERR_INVALID_ARGUMENT, "no sequence");
    CHECK_STATUS(dllm_stepper_poll(st, id, nullptr), DLLM_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_STATUS(dllm_stepper_cancel(st, 77), DLLM_ERR_INVALID_ARGUMENT, "no sequence 77");
    CHECK_STATUS(dllm_stepper_step(nullptr), DLLM_ERR_INVALID_ARGUMENT, "NULL");
    CHECK(dllm_stepper_n_active(nullptr) == 0);
    CHECK_STATUS(dllm_stepper_step(st), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_stepper_poll(st, id, &ev), DLLM_OK, nullptr);
    CHECK(ev.stepped && !ev.finished && ev.info.global_step == 1 && ev.info.n_committed == 1 && ev.info.n_masked == 7);
    CHECK_STATUS(dllm_stepper_cancel(st, id), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_stepper_cancel(st, id), DLLM_OK, nullptr);  // ended already: stays as it ended
    CHECK_STATUS(dllm_stepper_poll(st, id, &ev), DLLM_OK, nullptr);
    CHECK(ev.finished && ev.result.status == DLLM_ERR_CANCELLED && ev.result.n_out == 8 && ev.result.stats.steps == 1 &&
          dllm_stepper_n_active(st) == 0);
    CHECK_STATUS(dllm_stepper_remove(st, id), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_stepper_remove(st, id), DLLM_ERR_INVALID_ARGUMENT, "removed");
    CHECK_STATUS(dllm_stepper_add(st, &it, &id2), DLLM_OK, nullptr);
    CHECK(id2 == id + 1);  // ids are never reused
    dllm_stepper_free(st);  // with a sequence still decoding: dropped
    CHECK_STATUS(dllm_generate_batch(ctx, &it, 1, &r, nullptr), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_stepper_create(ctx, sp, &st), DLLM_OK, nullptr);
    dllm_stepper_free(st);
    dllm_stepper_free(nullptr);
    CHECK(strcmp(dllm_status_str(DLLM_ERR_FULL), "DLLM_ERR_FULL") == 0);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* Every host allocation of a stepper session (create, add a plain and a K/V-cache sequence, step both to their end,
 * poll, remove, free) failed in turn, and of dllm_generate_batch of the same items: the failing call returns
 * DLLM_ERR_OUT_OF_MEMORY, freeing the stepper leaves nothing behind, and the context still decodes. On two threads the
 * count differs from run to run (the pool's tasks allocate on whichever thread takes them), so which allocations the
 * stride reaches does too: generate_batch_every_allocation below is the deterministic twin. */
/* The two items of the allocation-failure tests: a plain sequence and a dual-cache one, 8 tokens in blocks of 4. */
static void test_oom_items(int32_t prompt[4], int32_t out[2][8], dllm_batch_item items[2]) {
    for (int i = 0; i < 2; i++) {
        items[i] = {prompt, 3 + i, dllm_gen_default_params(), out[i], 8};
        items[i].params.gen_length = 8, items[i].params.block_length = 4, items[i].params.steps = 4,
        items[i].params.stop_at_eos = 0;
    }
    items[1].params.kv_cache = DLLM_KV_CACHE_DUAL;
}

TEST(alloc_failure, stepper_session) {
    TEST_NEEDS_ALLOC_INJECTION();
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    int32_t prompt[4] = {5, 6, 7, 8}, out[2][8];
    dllm_batch_item items[2];
    test_oom_items(prompt, out, items);
    long n = test_fail_each_allocation(T_, "a stepper session", 7, [&]() {
        dllm_stepper *st = nullptr;
        int ids[2] = {-1, -1};
        dllm_status s = dllm_stepper_create(ctx, dllm_stepper_default_params(), &st);
        for (int i = 0; s == DLLM_OK && i < 2; i++) s = dllm_stepper_add(st, &items[i], &ids[i]);
        while (s == DLLM_OK && dllm_stepper_n_active(st) > 0) s = dllm_stepper_step(st);
        for (int i = 0; s == DLLM_OK && i < 2; i++) {
            dllm_seq_event ev;
            s = dllm_stepper_poll(st, ids[i], &ev);
            CHECK_MSG(s != DLLM_OK || (ev.finished && ev.result.status == DLLM_OK && ev.result.n_out == 8),
                      "sequence %d: %s (%s), %d ids", i, dllm_status_str(ev.result.status), ev.result.error,
                      ev.result.n_out);
            if (s == DLLM_OK) s = dllm_stepper_remove(st, ids[i]);
        }
        dllm_stepper_free(st);
        return s;
    });
    CHECK_MSG(n > 100, "%ld allocations counted", n);
    n = test_fail_each_allocation(T_, "dllm_generate_batch", 7, [&]() {
        dllm_batch_result r[2];
        return dllm_generate_batch(ctx, items, 2, r, nullptr);
    });
    CHECK_MSG(n > 100, "%ld allocations counted", n);
    CHECK(test_no_leaks());
    dllm_batch_result r[2];
    CHECK_STATUS(dllm_generate_batch(ctx, items, 2, r, nullptr), DLLM_OK, nullptr);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* dllm_generate_batch's allocations failed in turn on one thread, where their count is the same in every run: every
 * 7th, then each of the last 16 of a complete call made after a failed one. The last was once the copy of the failed
 * call's message ("out of host memory") that dllm_generate_batch made after dllm__guard, outside it: its std::bad_alloc
 * ended the process (on two threads, stepper_session's stride reached it in about one run in three). */
TEST(alloc_failure, generate_batch_last_allocations) {
    TEST_NEEDS_ALLOC_INJECTION();
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m, DLLM_BACKEND_CPU, 1) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    int32_t prompt[4] = {5, 6, 7, 8}, out[2][8];
    dllm_batch_item items[2];
    test_oom_items(prompt, out, items);
    auto batch = [&]() {
        dllm_batch_result r[2];
        return dllm_generate_batch(ctx, items, 2, r, nullptr);
    };
    long n = test_fail_each_allocation(T_, "dllm_generate_batch", 7, batch);
    CHECK_MSG(n > 100, "%ld allocations counted", n);
    if (n > 100) CHECK(test_fail_each_allocation(T_, "dllm_generate_batch's last allocations", 1, batch, n - 16) == n);
    CHECK(test_no_leaks());
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}
