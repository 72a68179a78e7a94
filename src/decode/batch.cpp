/* src/decode/batch.cpp - a sequence of a stepper, and the batched step of the plain and cached schedules. */

// ---- Batched decoding (dllm_stepper, dllm_generate_batch; decoding.md 6) ------------------------------------------
// Every batched sequence is a dllm__generation of its own, stepped in lock step: each step plans every live sequence's
// rows (dllm__step_begin), runs ONE forward over all of them (CFG's unconditional canvas is one more sequence of it),
// then chooses and commits per sequence (dllm__step_end, dllm__generation::end_step), exactly as the solo step does.
// Sequences join and leave between steps (dllm_stepper), each at its own block and step.

/* One sequence of a stepper, from dllm_stepper_add to dllm_stepper_remove: a copy of its item, its generation
 * (the plain and cached schedules: g; block diffusion: bd; neither where it decodes alone), its K/V cache slots and its
 * last step. */
struct dllm__stepper_seq {
    enum state { JOINING, LIVE, ALONE, ENDED };  // ALONE: waits to decode whole, outside the batched forwards
    int id = 0;
    state at = JOINING;
    dllm_batch_item item;  // a copy; item.prompt points into prompt
    std::vector<int32_t> prompt;
    dllm_batch_result own_result;         // its outcome, unless dllm_generate_batch's results array takes it
    dllm_batch_result *result = nullptr;  // where its outcome goes
    dllm_status status = DLLM_OK;         // how it ended, set by the step that ends it
    double t0 = 0;
    dllm__gen_plan plan;
    std::unique_ptr<dllm__generation> g;
    dllm__step_work work;
    std::vector<int32_t> uncond, committed;
    dllm__bd_plan bd_plan;
    std::unique_ptr<dllm__bd_generation> bd;
    dllm__bd_seq bd_seq;     // [block diffusion] its next forward (LLaDA2's too)
    dllm__llada2_plan l2_plan;  // [MoE] a LLaDA2 sequence's plan and generation (decode/llada2.cpp)
    std::unique_ptr<dllm__llada2_generation> l2;
    int slot[2] = {-1, -1};  // [dual cache] [prefix cache] its K/V caches (CFG's unconditional canvas: [1]); bd: [0]
    int fill_waits = 0;      // [dual cache] [prefix cache] steps it has waited for its fill (dllm_stepper::defer_fills)
    dllm__step_watch watch;
};

/* An item's outcome; its error message is kept with it, since later items overwrite the thread's. */
static void dllm__batch_set_status(dllm_batch_result &r, dllm_status s) {
    r.status = s;
    snprintf(r.error, sizeof r.error, "%s", s == DLLM_OK ? "" : dllm__tls_error.c_str());
}

/* The end of a sequence whose generation ran (s: how): its output, stats and status. */
static void dllm__batch_retire(dllm__stepper_seq &q, dllm_status s) {
    s = q.g->finish(s);
    dllm__generation_result(*q.g, s, q.item.out, &q.result->n_out, &q.result->stats, q.t0);
    dllm__batch_set_status(*q.result, s);
}

/* [dual cache] [prefix cache] Whether a sequence's next forward fills its K/V cache: its block's first step, over every
 * canvas row. */
static bool dllm__batch_fills(const dllm__stepper_seq &q) { return q.slot[0] >= 0 && q.g->st.step_in_block == 0; }

/* [batch] [dual cache] [prefix cache] A sequence's canvas (c = 1: CFG's unconditional one) as a sequence of this step's
 * forward: with a K/V cache, the rows dllm__step_rows names over its slot, the block's first step filling it. */
static dllm__batch_seq dllm__batch_seq_of(const dllm__stepper_seq &q, int c, int shift) {
    const dllm__decode &st = q.g->st;
    dllm__batch_seq s;
    s.ids = c ? q.uncond.data() : st.canvas.data(), s.n = (int)st.canvas.size();
    s.positions = st.positions.empty() ? nullptr : st.positions.data();
    s.r0 = q.work.r0, s.r1 = q.work.r1;
    if (q.slot[0] >= 0) {
        dllm__step_rows(st, shift, s.q0, s.q1);
        s.slot = q.slot[c], s.fill = dllm__batch_fills(q);
    }
    return s;
}

/* [batch] Whether the backend chooses a sequence's tokens (forward_batch_choose): where it chooses at all, for every
 * sequence but CFG's (its two canvases' logits are combined on the host) and none while dllm__debug_step_logits (tests)
 * wants the logits. */
static bool dllm__batch_device_choice(const dllm_ctx &ctx, const dllm__decode &st) {
    return ctx.impl->batch_chooses() && !dllm__debug_step_logits && st.cfg_scale <= 0;
}

/* [batch] A forward of a step's plan (k = 1: the sequences with a K/V cache): the logits of every sequence, or where
 * the backend chooses some (a sampling in the plan) theirs chosen and the others' logits. */
static dllm_status dllm__batch_forward(dllm_ctx &ctx, const std::vector<dllm__batch_seq> &plan, int k, float *logits,
                                       dllm__choice *choices) {
    if (plan.empty()) return DLLM_OK;
    for (const dllm__batch_seq &s : plan)
        if (s.sampling) return ctx.impl->forward_batch_choose(plan, k == 1, logits, choices);
    return k == 1 ? ctx.impl->forward_batch_kv(plan, logits) : ctx.impl->forward_batch(plan, logits);
}

/* One batched step: every live sequence's rows (and CFG's unconditional canvas) in one forward (sequences with a K/V
 * cache in a second one, forward_batch_kv), then each sequence's choice and commits. Where the backend chooses tokens
 * (dllm__batch_device_choice) it returns a sequence's choices in place of its logits. A sequence that is done, fails
 * or is cancelled by its step callback moves from live to ended (its status set). A failing forward is every
 * sequence's failure: the step of none can go on. */
static dllm_status dllm__batch_step(dllm_ctx &ctx, std::vector<dllm__stepper_seq *> &live,
                                    std::vector<dllm__stepper_seq *> &ended, std::vector<float> &logits) {
    const int V = ctx.model->cfg.n_vocab;
    std::vector<dllm__batch_seq> plan[2];         // without, with a K/V cache
    size_t rows[2] = {0, 0}, chosen[2] = {0, 0};  // logit rows to the host, rows chosen by the backend
    for (dllm__stepper_seq *q : live) {
        dllm__decode &st = q->g->st;
        dllm__step_begin(st, q->work);
        const int n_canvas = st.cfg_scale > 0 ? 2 : 1;
        if (n_canvas == 2) dllm__uncond_canvas(st, q->uncond);
        const bool device = dllm__batch_device_choice(ctx, st);
        for (int c = 0; c < n_canvas; c++) {
            dllm__batch_seq s = dllm__batch_seq_of(*q, c, ctx.model->cfg.shift_logits);
            if (device) s.sampling = &st.sampling, s.step = st.global_step;
            plan[q->slot[0] >= 0].push_back(s);
            (device ? chosen : rows)[q->slot[0] >= 0] += (size_t)(s.r1 - s.r0);
        }
    }
    logits.resize((rows[0] + rows[1]) * V);
    std::vector<dllm__choice> choices(chosen[0] + chosen[1]);
    DLLM__TRY(dllm__batch_forward(ctx, plan[0], 0, logits.data(), choices.data()));
    DLLM__TRY(dllm__batch_forward(ctx, plan[1], 1, logits.data() + rows[0] * V, choices.data() + chosen[0]));
    float *next[2] = {logits.data(), logits.data() + rows[0] * V};
    const dllm__choice *next_choice[2] = {choices.data(), choices.data() + chosen[0]};
    std::vector<dllm__stepper_seq *> still;
    for (dllm__stepper_seq *q : live) {
        dllm__decode &st = q->g->st;
        const dllm__step_work &w = q->work;
        const int k = q->slot[0] >= 0;
        if (dllm__batch_device_choice(ctx, st)) {  // the backend's choice of rows [r0, r1): the candidates' are ch
            const dllm__choice *&row = next_choice[k];
            std::vector<dllm__choice> ch;
            for (int32_t p : w.cand) ch.push_back(row[p - w.r0]);
            row += w.r1 - w.r0;
            st.forwards++;
            dllm__step_commit(st, w, ch, q->committed);
        } else {
            const size_t n = (size_t)(w.r1 - w.r0) * V;
            float *&cond = next[k];
            float *uncond = st.cfg_scale > 0 ? cond + n : nullptr;
            dllm__step_end(st, w, cond, uncond, V, q->committed);
            cond += uncond ? 2 * n : n;
        }
        q->status = q->g->end_step(q->committed);
        (q->status != DLLM_OK || q->g->done ? ended : still).push_back(q);
    }
    live.swap(still);
    return DLLM_OK;
}

/* Checks an item as dllm_generate would and prepares its generation, stepped on the host around the batched forwards
 * and watched (the stepper's events); to start when it joins. */
static dllm_status dllm__batch_admit(dllm_ctx &ctx, dllm__stepper_seq &q) {
    const dllm_batch_item &it = q.item;
    DLLM__TRY(dllm__plan_generation(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, q.plan));
    q.g.reset(new dllm__generation{ctx, it.params, q.plan, dllm__decode(), {}, 0});
    dllm__init_decode(it.prompt, it.n_prompt, it.params, q.plan, q.g->st);
    q.g->st.host_steps = true;
    q.g->watch = &q.watch;
    return DLLM_OK;
}

/* [batch] [dual cache] [prefix cache] The K/V cache slots a sequence needs: one a canvas (CFG: two) with a K/V cache,
 * of its canvas's rows (prompt + gen_length, which DPad's views never exceed); none without one. */
static int dllm__batch_slots_needed(const dllm__stepper_seq &q, int &rows) {
    const dllm_gen_params &p = q.item.params;
    rows = q.item.n_prompt + p.gen_length;
    return dllm__enum_int(p.kv_cache) == DLLM_KV_CACHE_NONE ? 0 : p.cfg_scale > 0 ? 2 : 1;
}

/* An item decoded alone (dllm_generate's result, its status and message kept with it); its steps and forwards count in
 * the batch's, unless it ran out of memory (a failure of the whole batch). */
static dllm_status dllm__batch_decode_alone(dllm_ctx &ctx, const dllm_batch_item &it, dllm_batch_result &r,
                                            dllm_gen_stats &stats) {
    dllm_status s =
        dllm__generate_impl(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, &r.n_out, &r.stats);
    if (s == DLLM_ERR_BUFFER_TOO_SMALL) r.n_out = dllm__out_needed(ctx, it.n_prompt, it.params);
    dllm__batch_set_status(r, s);
    if (s != DLLM_ERR_OUT_OF_MEMORY) stats.steps += r.stats.steps, stats.forwards += r.stats.forwards;
    return s;
}
