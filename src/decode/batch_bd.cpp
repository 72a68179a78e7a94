/* src/decode/batch_bd.cpp - batched block diffusion. */

// ---- Batched block diffusion (dllm_stepper, dllm_generate_batch on a block-diffusion model) -----------------------
// Every sequence is a dllm__bd_generation of its own over a committed K/V cache slot of its own (bd_batch_reserve).
// Each round runs every live generation's next forward
// (dllm__bd_generation::next, asked as soon as the previous result is applied) in ONE bd_forward_batch, whatever their
// blocks, kinds, row counts and steps; each result goes back to its generation. A generation that is done, fails or is
// cancelled leaves at once. Each sequence runs the loop dllm_generate runs, so it decodes exactly as alone wherever the
// backend's batched forward gives each sequence its bd_forward's result. LLaDA2 sequences (dllm__llada2_generation, the
// same state machine its dllm_generate runs) go through the same rounds: a step's choices (every row of its block), a
// commit's logit row.

/* The end of a block-diffusion sequence whose generation started (s: how): its output, stats and status. */
static void dllm__bd_batch_retire(dllm__stepper_seq &q, dllm_status s) {
    if (q.l2)
        dllm__llada2_result(*q.l2, s, q.item.out, &q.result->n_out, &q.result->stats, q.t0);
    else
        dllm__bd_result(*q.bd, s, q.item.out, &q.result->n_out, &q.result->stats, q.t0, false);
    dllm__batch_set_status(*q.result, s);
}

/* Checks an item as dllm_generate would and prepares its generation, watched (the stepper's events); to start on its
 * slot when it joins. */
static dllm_status dllm__bd_batch_admit(dllm_ctx &ctx, dllm__stepper_seq &q) {
    const dllm_batch_item &it = q.item;
    if (ctx.model->cfg.family == DLLM_FAMILY_LLADA2) {
        DLLM__TRY(dllm__plan_llada2(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, q.l2_plan));
        q.l2.reset(new dllm__llada2_generation{ctx, q.item.params, q.l2_plan, it.n_prompt});
        q.l2->watch = &q.watch;
        return DLLM_OK;
    }
    DLLM__TRY(dllm__plan_block_diffusion(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, q.bd_plan));
    q.bd.reset(new dllm__bd_generation{ctx, it.params, q.bd_plan, it.n_prompt});
    q.bd->watch = &q.watch;
    return DLLM_OK;
}

/* The generation walks to its first forward on its slot; false (its status set) if it has none or fails. */
static bool dllm__bd_batch_start(dllm__stepper_seq &q) {
    if (q.l2) {
        q.l2->start(q.item.prompt);
        q.bd_seq = dllm__bd_seq();
        q.bd_seq.slot = q.slot[0];
        q.status = q.l2->next(q.bd_seq.call);
        q.bd_seq.pick = q.l2->step_pending() ? &q.l2->pick : nullptr;
        return q.status == DLLM_OK && !q.l2->done();
    }
    q.bd->start(q.item.prompt);
    q.bd_seq.slot = q.slot[0];
    q.status = q.bd->next(q.bd_seq);
    return q.status == DLLM_OK && !q.bd->done();
}

/* One round: every live sequence's next forward in one bd_forward_batch (its logits or, for a step, its choices), then
 * each one's result and its next forward. A sequence with no forward left, or whose loop or step callback fails, moves
 * from live to ended (its status set); a failing batched forward is every live sequence's failure. */
static dllm_status dllm__bd_batch_round(dllm_ctx &ctx, std::vector<dllm__stepper_seq *> &live,
                                        std::vector<dllm__stepper_seq *> &ended, std::vector<float> &logits,
                                        std::vector<dllm__choice> &choices) {
    std::vector<dllm__bd_seq> seqs;
    size_t rows = 0, picked = 0;
    for (dllm__stepper_seq *q : live) {
        seqs.push_back(q->bd_seq);
        if (q->bd_seq.pick)
            picked += (size_t)q->bd_seq.pick->n;
        else
            rows += (size_t)(q->bd_seq.call.r1 - q->bd_seq.call.r0);
    }
    logits.resize(rows * ctx.model->cfg.n_vocab);
    choices.assign(picked, dllm__choice{0, -INFINITY, false});
    DLLM__TRY(ctx.impl->bd_forward_batch(seqs, logits.data(), choices.data()));
    const float *row = logits.data();
    const dllm__choice *ch = choices.data();
    std::vector<dllm__stepper_seq *> still;
    for (dllm__stepper_seq *q : live) {
        const dllm__bd_seq &s = q->bd_seq;
        if (q->l2) {  // [MoE] LLaDA2: a step's choices, a commit's logit row
            if (s.pick) {
                q->status = q->l2->apply_choices(ch);
                ch += s.pick->n;
            } else {
                q->status = q->l2->apply_logits(row);
                row += (size_t)(s.call.r1 - s.call.r0) * ctx.model->cfg.n_vocab;
            }
            if (q->status == DLLM_OK) q->status = q->l2->next(q->bd_seq.call);
            q->bd_seq.pick = q->l2->step_pending() ? &q->l2->pick : nullptr;
            (q->status != DLLM_OK || q->l2->done() ? ended : still).push_back(q);
            continue;
        }
        q->status = s.pick ? q->bd->apply_choices(ch) : q->bd->apply_logits(row);
        if (s.pick)
            ch += s.pick->n;
        else
            row += (size_t)(s.call.r1 - s.call.r0) * ctx.model->cfg.n_vocab;
        if (q->status == DLLM_OK) q->status = q->bd->next(q->bd_seq);
        (q->status != DLLM_OK || q->bd->done() ? ended : still).push_back(q);
    }
    live.swap(still);
    return DLLM_OK;
}
