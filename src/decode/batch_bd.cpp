/* src/decode/batch_bd.cpp - batched block diffusion. */

// ---- Batched block diffusion (dllm_generate_batch on a block-diffusion model) ------------------------------------
// Every item is a dllm__bd_generation of its own over a committed K/V cache slot of its own (bd_batch_reserve). Each
// round asks every live generation for its next forward (dllm__bd_generation::next) and runs them all in ONE
// bd_forward_batch, whatever their blocks, kinds, row counts and steps; each result goes back to its generation. A
// generation that is done, fails or is cancelled leaves at once. Each item runs the loop dllm_generate runs, so it
// decodes exactly as alone wherever the backend's batched forward gives each sequence its bd_forward's result.

/* One block-diffusion item of a batched decode, while it runs. */
struct dllm__bd_member {
    const dllm_batch_item *item = nullptr;
    dllm_batch_result *result = nullptr;
    dllm__bd_plan plan;
    std::unique_ptr<dllm__bd_generation> g;
    dllm__bd_seq seq;  // this round's forward; seq.slot: its K/V cache slot
    double t0 = 0;
};

/* An item's end: its output, stats and status; the batch's steps are the most any item ran. */
static void dllm__bd_batch_retire(dllm__bd_member &m, dllm_status s, dllm_gen_stats &stats) {
    dllm__bd_result(*m.g, s, m.item->out, &m.result->n_out, &m.result->stats, m.t0, false);
    dllm__batch_set_status(*m.result, s);
    stats.steps = std::max(stats.steps, m.g->steps);
}

/* Checks an item as dllm_generate would and starts its generation on slot `slot`; false (its status set) if it is bad. */
static bool dllm__bd_batch_admit(dllm_ctx &ctx, const dllm_batch_item &it, dllm_batch_result &r, dllm__bd_member &m,
                                 int slot) {
    m.item = &it, m.result = &r, m.t0 = dllm__now_ms();
    dllm_status s = dllm__plan_block_diffusion(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, m.plan);
    if (s != DLLM_OK) {
        if (s == DLLM_ERR_BUFFER_TOO_SMALL)
            r.n_out = dllm__out_needed(ctx, it.n_prompt, it.params);  // as dllm_generate reports it
        dllm__batch_set_status(r, s);
        return false;
    }
    m.g.reset(new dllm__bd_generation{ctx, it.params, m.plan, it.n_prompt});
    m.g->start(it.prompt);
    m.seq.slot = slot;
    return true;
}

/* One round: every active member's next forward in one bd_forward_batch (its logits or, for a step, its choices), then
 * each member's result. A member with no forward left, or whose loop or step callback fails, leaves; a failing batched
 * forward is every member's failure. */
static dllm_status dllm__bd_batch_round(dllm_ctx &ctx, std::vector<dllm__bd_member *> &active,
                                        std::vector<float> &logits, std::vector<dllm__choice> &choices,
                                        dllm_gen_stats &stats) {
    std::vector<dllm__bd_member *> live;
    std::vector<dllm__bd_seq> seqs;
    size_t rows = 0, picked = 0;
    for (dllm__bd_member *m : active) {
        dllm_status s = m->g->next(m->seq);
        if (s != DLLM_OK || m->g->done()) {
            dllm__bd_batch_retire(*m, s, stats);
            continue;
        }
        live.push_back(m);
        seqs.push_back(m->seq);
        if (m->seq.pick)
            picked += (size_t)m->seq.pick->n;
        else
            rows += (size_t)(m->seq.call.r1 - m->seq.call.r0);
    }
    active.clear();
    if (live.empty()) return DLLM_OK;
    logits.resize(rows * ctx.model->cfg.n_vocab);
    choices.assign(picked, dllm__choice{0, -INFINITY, false});
    stats.forwards++;
    dllm_status s = ctx.impl->bd_forward_batch(seqs, logits.data(), choices.data());
    if (s != DLLM_OK) {
        for (dllm__bd_member *m : live) dllm__bd_batch_retire(*m, s, stats);
        return s;
    }
    const float *row = logits.data();
    const dllm__choice *ch = choices.data();
    for (dllm__bd_member *m : live) {
        const dllm__bd_seq &q = m->seq;
        s = q.pick ? m->g->apply_choices(ch) : m->g->apply_logits(row);
        if (q.pick)
            ch += q.pick->n;
        else
            row += (size_t)(q.call.r1 - q.call.r0) * ctx.model->cfg.n_vocab;
        if (s != DLLM_OK)
            dllm__bd_batch_retire(*m, s, stats);
        else
            active.push_back(m);
    }
    return DLLM_OK;
}

/* dllm_generate_batch on a block-diffusion model: the items decode together where the backend has bd_forward_batch and
 * the slots fit, else one after another through dllm_generate's path (an INFO log names the backend's reason).
 * stats->forwards counts the batched forwards (the most any item ran), stats->steps the most steps any item ran. */
static dllm_status dllm__bd_generate_batch_impl(dllm_ctx &ctx, const dllm_batch_item *items, int n_items,
                                                dllm_batch_result *results, dllm_gen_stats &stats) {
    std::string why;
    if (ctx.impl->bd_forward_batch({}, nullptr, nullptr) != DLLM_OK) why = dllm__tls_error;
    std::vector<dllm__bd_member> members;
    members.reserve((size_t)n_items);  // a generation holds its member's plan: no reallocation
    std::vector<int> rows;
    for (int i = 0; why.empty() && i < n_items; i++) {
        members.emplace_back();
        if (dllm__bd_batch_admit(ctx, items[i], results[i], members.back(), (int)rows.size()))
            rows.push_back(members.back().g->cache_rows());
        else
            members.pop_back();
    }
    if (!rows.empty() && ctx.impl->bd_batch_reserve(rows) != DLLM_OK)
        why = dllm__tls_error, members.clear();  // (memory)
    if (!why.empty()) {
        if (n_items > 0)
            dllm__log(
                DLLM_LOG_INFO,
                "dllm_generate_batch: %d block-diffusion items decode one after another, outside a batched forward (%s)",
                n_items, why.c_str());
        for (int i = 0; i < n_items; i++)
            if (dllm__batch_decode_alone(ctx, items[i], results[i], stats) == DLLM_ERR_OUT_OF_MEMORY)
                return DLLM_ERR_OUT_OF_MEMORY;
        return DLLM_OK;
    }
    std::vector<dllm__bd_member *> active;
    for (dllm__bd_member &m : members) active.push_back(&m);
    std::vector<float> logits;
    std::vector<dllm__choice> choices;
    dllm_status s = DLLM_OK;
    while (s == DLLM_OK && !active.empty()) s = dllm__bd_batch_round(ctx, active, logits, choices, stats);
    if (!rows.empty()) {  // the caches go with the batch; a failure's message stays the thread's
        const std::string error = dllm__tls_error;
        ctx.impl->bd_batch_reserve({});
        dllm__tls_error = error;
    }
    return s;
}

/* dllm_generate_batch: the items a batched forward can take decode together, the others one after another. */
static dllm_status dllm__generate_batch_impl(dllm_ctx &ctx, const dllm_batch_item *items, int n_items,
                                             dllm_batch_result *results, dllm_gen_stats &stats) {
    if (dllm__is_block_diffusion(ctx.model->cfg))
        return dllm__bd_generate_batch_impl(ctx, items, n_items, results, stats);
    if (ctx.model->cfg.family == DLLM_FAMILY_LLADA2) {  // no batched LLaDA2 forward yet: dllm_generate's, item by item
        if (n_items > 0)
            dllm__log(DLLM_LOG_INFO, "dllm_generate_batch: %d LLaDA2 items decode one after another", n_items);
        for (int i = 0; i < n_items; i++)
            if (dllm__batch_decode_alone(ctx, items[i], results[i], stats) == DLLM_ERR_OUT_OF_MEMORY)
                return DLLM_ERR_OUT_OF_MEMORY;
        return DLLM_OK;
    }
    const bool batches = ctx.impl->forward_batch({}, nullptr) == DLLM_OK;
    const std::string no_batch = batches ? std::string() : dllm__tls_error;  // the backend's reason
    std::string kv_why;  // why items with a K/V cache cannot batch (the backend's reason), empty if they can
    if (batches && ctx.impl->forward_batch_kv({}, nullptr) != DLLM_OK) kv_why = "a K/V cache: " + dllm__tls_error;
    std::vector<dllm__batch_member> members;
    members.reserve((size_t)n_items);
    std::vector<int> alone;
    const char *why = batches ? nullptr : no_batch.c_str();
    std::vector<bool> batched((size_t)n_items);
    for (int i = 0; i < n_items; i++)
        batched[(size_t)i] =
            batches && !dllm__batch_excluded(items[i].params, kv_why.empty() ? nullptr : kv_why.c_str());
    std::vector<int> slot_of, slot_rows;
    const bool kv_slots = dllm__batch_kv_plan(ctx, items, n_items, batched, slot_of, slot_rows) > 0;
    if (kv_slots &&
        ctx.impl->batch_kv_reserve(slot_rows) != DLLM_OK) {  // (memory): those items decode one after another
        kv_why = "a K/V cache: " + dllm__tls_error;
        for (int i = 0; i < n_items; i++) batched[(size_t)i] = batched[(size_t)i] && slot_of[(size_t)i] < 0;
    }
    for (int i = 0; i < n_items; i++) {
        const char *excluded = !batches              ? why
                               : !batched[(size_t)i] ? dllm__batch_excluded(items[i].params, kv_why.c_str())
                                                     : nullptr;
        if (excluded) {
            if (alone.empty()) why = excluded;
            alone.push_back(i);
            continue;
        }
        members.emplace_back();
        members.back().slot = slot_of[(size_t)i];
        if (!dllm__batch_admit(ctx, items[i], results[i], members.back())) members.pop_back();
    }
    if (!alone.empty())
        dllm__log(
            DLLM_LOG_INFO,
            "dllm_generate_batch: %zu of %d items decode one after another, outside the batched forward (item %d: %s)",
            alone.size(), n_items, alone[0], why);
    const dllm_status decoded = dllm__batch_decode(ctx, members, stats);
    if (kv_slots) {  // the caches go with the batch; a failure's message stays the thread's
        const std::string error = dllm__tls_error;
        ctx.impl->batch_kv_reserve({});
        dllm__tls_error = error;
    }
    DLLM__TRY(decoded);
    for (int i : alone)
        if (dllm__batch_decode_alone(ctx, items[i], results[i], stats) == DLLM_ERR_OUT_OF_MEMORY)
            return DLLM_ERR_OUT_OF_MEMORY;  // global: the items after it would fail the same way
    return DLLM_OK;
}
