/* src/decode/batch.cpp - batched decoding (dllm_generate_batch). */

// ---- Batched decoding (dllm_generate_batch; decoding.md 6) ---------------------------------------------
// Every batched item is a dllm__generation of its own, stepped in lock step: each step plans every active
// sequence's rows (dllm__step_begin), runs ONE forward over all of them (CFG's unconditional canvas is one more
// sequence of it), then chooses and commits per sequence (dllm__step_end, dllm__generation::end_step), exactly
// as the solo step does. A sequence that finishes, fails or is cancelled leaves the batch at once.

/* Why an item cannot join a batched forward (it then decodes alone), or null. kv_why: why the backend has no batched
 * K/V-cache step (forward_batch_kv), or null when it has one. */
static const char *dllm__batch_excluded(const dllm_gen_params &p, const char *kv_why) {
    if (dllm__enum_int(p.kv_cache) != DLLM_KV_CACHE_NONE && kv_why) return kv_why;
    return nullptr;
}

/* One item of a batched decode, while it runs. */
struct dllm__batch_member {
    const dllm_batch_item *item = nullptr;
    dllm_batch_result *result = nullptr;
    dllm__gen_plan plan;
    std::unique_ptr<dllm__generation> g;
    dllm__step_work work;
    std::vector<int32_t> uncond, committed;
    double t0 = 0;
    int slot = -1;  // [dual cache] [prefix cache] its K/V cache (CFG's unconditional canvas: slot + 1), or -1
};

/* An item's outcome; its error message is kept with it, since later items overwrite the thread's. */
static void dllm__batch_set_status(dllm_batch_result &r, dllm_status s) {
    r.status = s;
    snprintf(r.error, sizeof r.error, "%s", s == DLLM_OK ? "" : dllm__tls_error.c_str());
}

static void dllm__batch_retire(dllm__batch_member &m, dllm_status s) {
    s = m.g->finish(s);
    dllm__generation_result(*m.g, s, m.item->out, &m.result->n_out, &m.result->stats, m.t0);
    dllm__batch_set_status(*m.result, s);
}

/* [batch] [dual cache] [prefix cache] A member's canvas (c = 1: CFG's unconditional one) as a sequence of this step's
 * forward: with a K/V cache, the rows dllm__step_rows names over its slot, the block's first step filling it. */
static dllm__batch_seq dllm__batch_seq_of(const dllm__batch_member &m, int c, int shift) {
    const dllm__decode &st = m.g->st;
    dllm__batch_seq s;
    s.ids = c ? m.uncond.data() : st.canvas.data(), s.n = (int)st.canvas.size();
    s.positions = st.positions.empty() ? nullptr : st.positions.data();
    s.r0 = m.work.r0, s.r1 = m.work.r1;
    if (m.slot >= 0) {
        dllm__step_rows(st, shift, s.q0, s.q1);
        s.slot = m.slot + c, s.fill = st.step_in_block == 0;
    }
    return s;
}

/* [batch] Whether the backend chooses a member's tokens (forward_batch_choose): where it chooses at all, for every member
 * but CFG's (its two canvases' logits are combined on the host) and none while dllm__debug_step_logits (tests) wants
 * the logits. */
static bool dllm__batch_device_choice(const dllm_ctx &ctx, const dllm__decode &st) {
    return ctx.impl->batch_chooses() && !dllm__debug_step_logits && st.cfg_scale <= 0;
}

/* [batch] A forward of a step's plan (k = 1: the members with a K/V cache): the logits of every sequence, or where the
 * backend chooses some (a sampling in the plan) theirs chosen and the others' logits. */
static dllm_status dllm__batch_forward(dllm_ctx &ctx, const std::vector<dllm__batch_seq> &plan, int k, float *logits,
                                       dllm__choice *choices) {
    if (plan.empty()) return DLLM_OK;
    for (const dllm__batch_seq &s : plan)
        if (s.sampling) return ctx.impl->forward_batch_choose(plan, k == 1, logits, choices);
    return k == 1 ? ctx.impl->forward_batch_kv(plan, logits) : ctx.impl->forward_batch(plan, logits);
}

/* One batched step: every active member's rows (and CFG's unconditional canvas) in one forward (members with a K/V
 * cache in a second one, forward_batch_kv), then each member's choice and commits. Where the backend chooses tokens
 * (dllm__batch_device_choice) it returns a member's choices in place of its logits. A failing forward is every member's
 * failure: the step of none can go on. */
static dllm_status dllm__batch_step(dllm_ctx &ctx, std::vector<dllm__batch_member *> &active,
                                    std::vector<float> &logits) {
    const int V = ctx.model->cfg.n_vocab;
    std::vector<dllm__batch_seq> plan[2];         // without, with a K/V cache
    size_t rows[2] = {0, 0}, chosen[2] = {0, 0};  // logit rows to the host, rows chosen by the backend
    for (dllm__batch_member *m : active) {
        dllm__decode &st = m->g->st;
        dllm__step_begin(st, m->work);
        const int n_canvas = st.cfg_scale > 0 ? 2 : 1;
        if (n_canvas == 2) dllm__uncond_canvas(st, m->uncond);
        const bool device = dllm__batch_device_choice(ctx, st);
        for (int c = 0; c < n_canvas; c++) {
            dllm__batch_seq s = dllm__batch_seq_of(*m, c, ctx.model->cfg.shift_logits);
            if (device) s.sampling = &st.sampling, s.step = st.global_step;
            plan[m->slot >= 0].push_back(s);
            (device ? chosen : rows)[m->slot >= 0] += (size_t)(s.r1 - s.r0);
        }
    }
    logits.resize((rows[0] + rows[1]) * V);
    std::vector<dllm__choice> choices(chosen[0] + chosen[1]);
    DLLM__TRY(dllm__batch_forward(ctx, plan[0], 0, logits.data(), choices.data()));
    DLLM__TRY(dllm__batch_forward(ctx, plan[1], 1, logits.data() + rows[0] * V, choices.data() + chosen[0]));
    float *next[2] = {logits.data(), logits.data() + rows[0] * V};
    const dllm__choice *next_choice[2] = {choices.data(), choices.data() + chosen[0]};
    std::vector<dllm__batch_member *> still;
    for (dllm__batch_member *m : active) {
        dllm__decode &st = m->g->st;
        const dllm__step_work &w = m->work;
        if (dllm__batch_device_choice(
                ctx, st)) {  // the backend's choice of rows [r0, r1): the candidates' are the host's ch
            const dllm__choice *&row = next_choice[m->slot >= 0];
            std::vector<dllm__choice> ch;
            for (int32_t p : w.cand) ch.push_back(row[p - w.r0]);
            row += w.r1 - w.r0;
            st.forwards++;
            dllm__step_commit(st, w, ch, m->committed);
        } else {
            const size_t n = (size_t)(w.r1 - w.r0) * V;
            float *&cond = next[m->slot >= 0];
            float *uncond = st.cfg_scale > 0 ? cond + n : nullptr;
            dllm__step_end(st, w, cond, uncond, V, m->committed);
            cond += uncond ? 2 * n : n;
        }
        dllm_status s = m->g->end_step(m->committed);
        if (s != DLLM_OK || m->g->done)
            dllm__batch_retire(*m, s);
        else
            still.push_back(m);
    }
    active.swap(still);
    return DLLM_OK;
}

/* Decodes members together until every one is done; stats->steps and ->forwards count batched steps. */
static dllm_status dllm__batch_decode(dllm_ctx &ctx, std::vector<dllm__batch_member> &members, dllm_gen_stats &stats) {
    std::vector<dllm__batch_member *> active;
    for (dllm__batch_member &m : members) {
        dllm_status s = m.g->start();
        if (s == DLLM_OK)
            active.push_back(&m);
        else
            dllm__batch_retire(m, s);
    }
    std::vector<float> logits;
    while (!active.empty()) {
        dllm_status s = dllm__batch_step(ctx, active, logits);
        if (s != DLLM_OK) {
            for (dllm__batch_member *m : active) dllm__batch_retire(*m, s);
            return s;
        }
        stats.steps++, stats.forwards++;
    }
    return DLLM_OK;
}

/* Checks an item as dllm_generate would and prepares its generation; false (with its status set) if it is bad. */
static bool dllm__batch_admit(dllm_ctx &ctx, const dllm_batch_item &it, dllm_batch_result &r, dllm__batch_member &m) {
    m.item = &it, m.result = &r, m.t0 = dllm__now_ms();
    dllm_status s = dllm__plan_generation(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, m.plan);
    if (s != DLLM_OK) {
        if (s == DLLM_ERR_BUFFER_TOO_SMALL)
            r.n_out = dllm__out_needed(ctx, it.n_prompt, it.params);  // as dllm_generate reports it
        dllm__batch_set_status(r, s);
        return false;
    }
    m.g.reset(new dllm__generation{ctx, it.params, m.plan, dllm__decode(), {}, 0});
    dllm__init_decode(it.prompt, it.n_prompt, it.params, m.plan, m.g->st);
    m.g->st.host_steps = true;
    return true;
}

/* [batch] [dual cache] [prefix cache] The K/V cache slots of the items that join the batch with a K/V cache: slot_of[i]
 * is item i's (CFG's unconditional canvas: the next one), -1 for the others; slot_rows[s] its canvas's rows (prompt
 * + gen_length, which DPad's views never exceed). An item whose lengths are invalid gets none: its admission fails. */
static int dllm__batch_kv_plan(const dllm_ctx &ctx, const dllm_batch_item *items, int n_items,
                               const std::vector<bool> &batched, std::vector<int> &slot_of,
                               std::vector<int> &slot_rows) {
    slot_of.assign((size_t)n_items, -1), slot_rows.clear();
    for (int i = 0; i < n_items; i++) {
        const dllm_gen_params &p = items[i].params;
        const int64_t n = (int64_t)items[i].n_prompt + p.gen_length;
        if (!batched[(size_t)i] || dllm__enum_int(p.kv_cache) == DLLM_KV_CACHE_NONE || items[i].n_prompt < 0 ||
            p.gen_length <= 0 || n > ctx.max_tokens)
            continue;
        slot_of[(size_t)i] = (int)slot_rows.size();
        slot_rows.insert(slot_rows.end(), p.cfg_scale > 0 ? 2 : 1, (int)n);
    }
    return (int)slot_rows.size();
}

/* An item decoded alone inside dllm_generate_batch (dllm_generate's result, its status and message kept with it); its
 * steps and forwards count in the batch's. */
static dllm_status dllm__batch_decode_alone(dllm_ctx &ctx, const dllm_batch_item &it, dllm_batch_result &r,
                                            dllm_gen_stats &stats) {
    dllm_status s =
        dllm__generate_impl(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, &r.n_out, &r.stats);
    if (s == DLLM_ERR_BUFFER_TOO_SMALL) r.n_out = dllm__out_needed(ctx, it.n_prompt, it.params);
    dllm__batch_set_status(r, s);
    if (s != DLLM_ERR_OUT_OF_MEMORY) stats.steps += r.stats.steps, stats.forwards += r.stats.forwards;
    return s;
}
