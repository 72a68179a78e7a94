/* src/gpu/batch_bd.cpp - the batched block-diffusion forward. */

// ---- [batch] [block diffusion] The batched block-diffusion forward (bd_forward_batch; bd_batch) ----------------
// Many block-diffusion generations in one forward (dllm_generate_batch): each has a slot of K|V rows for every layer
// (bd_batch_reserve, the batched K/V-cache step's batch_.kv), held by sequence position: its committed rows [0, n),
// then the block being decoded at [n, n + B). Every sequence's forwarded rows, of any kind (dllm__bd_kind), go through
// the batched forward (forward_varlen: every GEMM once over all rows, DLLM__ROWS_BATCH, a sequence's forward of at most
// 128 rows on gemm_splitk as a K/V-cache step's; embedding, norms, RoPE at each row's position, the Llama-4 query scaling and [SoloQ]'s producers row by row), their K|V into their slot rows
// (kv_scatter_rows), each sequence's queries over its own slot rows under its own block-causal mask (the varlen
// flash_attn with attn_args' varlen_masks: no split-KV; its tiles follow the batch's shape, dllm__attn_varlen_short,
// and give the same bits). So a sequence's logits and choices are bit-identical whatever else is in the batch, a batch
// of one included (not the solo bd_forward's bits: that one tunes its GEMMs per row count, splits the keys and runs
// [FACache]'s split attention on layer 0; under call.lacache this path reuses nothing and counts no row in
// bd_facache_rows). Under kv_quant each slot holds its codes instead of bf16 rows and each sequence attends over its
// own (gpu/batch_kvq.cpp). [MoE] LLaDA2 takes this path too: QK-norm + partial RoPE at each row's position
// (qk_norm_rope_varlen), its MoE layers over all rows (moe_ffn: row-independent, no host sync). On wherever the items
// allow it.

/* The layout of a batched block-diffusion forward over the slots (slot s: rows [slot_base[s], + slot_rows[s]) of each
 * layer's K|V rows, its state slots[s]): sequence i's call.T rows concatenated, at RoPE positions n + offset + j (n:
 * its slot's committed rows), their K|V bound for slot row n + j (SUB_BLOCK: n + offset + j, the overwrite persists),
 * its queries over slot rows [0, n + T) (SUB_BLOCK: [0, n + block)) under its block-causal mask (call.mask_block, query
 * j at sequence index n + offset + j, key k at k); its raw logit rows [r0, r1) of the forward. Twin:
 * dllm__cpu_bd_attention's positions, key rows and q_index0, except that the CPU keeps the block cache apart while here
 * it is the slot's rows after the committed ones. Checked as bd_check checks a forward, plus each slot once, a pick's
 * rows among the logit rows and a sub-block only over a block cache. Entry 2i of the attention is sequence i, entry
 * 2i + 1 the bridge to the next slot (no query row, no mask). */
static dllm_status dllm__bd_batch_layout_of(const std::vector<dllm__bd_seq> &seqs, const std::vector<int> &slot_base,
                                            const std::vector<int> &slot_rows, const std::vector<dllm__bd_slot> &slots,
                                            int max_tokens, dllm__varlen_layout &v) {
    v = dllm__varlen_layout();
    v.offsets.push_back(0);
    std::vector<bool> used(slot_base.size(), false);
    for (size_t i = 0; i < seqs.size(); i++) {
        const dllm__bd_seq &q = seqs[i];
        const dllm__bd_call &call = q.call;
        if (q.slot < 0 || (size_t)q.slot >= slot_base.size() || used[(size_t)q.slot])
            return dllm__fail(
                DLLM_ERR_INTERNAL,
                "batched block diffusion: sequence %zu names slot %d (%zu reserved, each at most once a forward)", i,
                q.slot, slot_base.size());
        used[(size_t)q.slot] = true;
        const dllm__bd_slot &s = slots[(size_t)q.slot];
        const bool sub = call.kind == DLLM__BD_SUB_BLOCK;
        if (!call.ids || call.T <= 0 || call.offset < 0 || call.r0 < 0 || call.r1 <= call.r0 || call.r1 > call.T)
            return dllm__fail(
                DLLM_ERR_INTERNAL,
                "batched block diffusion: sequence %zu forwards %d rows at offset %d and asks for output rows [%d, %d)",
                i, call.T, call.offset, call.r0, call.r1);
        if (sub && call.offset + call.T > s.block)
            return dllm__fail(
                DLLM_ERR_INTERNAL,
                "batched block diffusion: sequence %zu's sub-block of %d rows at %d lies outside its block cache (%d "
                "rows)",
                i, call.T, call.offset, s.block);
        const int n_keys = s.n + (sub ? s.block : call.T);
        if (n_keys > slot_rows[(size_t)q.slot])
            return dllm__fail(
                DLLM_ERR_INTERNAL,
                "batched block diffusion: sequence %zu's %d rows past %d committed ones overflow slot %d (%d rows, "
                "sized by "
                "bd_batch_reserve)",
                i, call.T, s.n, q.slot, slot_rows[(size_t)q.slot]);
        if ((int64_t)s.n + call.offset + call.T > max_tokens)
            return dllm__fail(
                DLLM_ERR_INVALID_ARGUMENT,
                "batched block diffusion: sequence %zu's positions up to %lld exceed the context's limit of %d tokens "
                "(max_tokens)",
                i, (long long)s.n + call.offset + call.T, max_tokens);
        const dllm__bd_pick *p = q.pick;
        if (p && (p->n <= 0 || p->logits_row(0) < 0 || p->logits_row(p->n - 1) >= call.r1 - call.r0))
            return dllm__fail(DLLM_ERR_INTERNAL,
                              "batched block diffusion: sequence %zu chooses %d rows from logits rows %d.. of its %d",
                              i, p->n, p->n > 0 ? p->logits_row(0) : 0, call.r1 - call.r0);
        if (v.rows > INT32_MAX - call.T)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "batched forward: more than 2^31 rows");
        const int base = slot_base[(size_t)q.slot], row0 = s.n + (sub ? call.offset : 0);
        for (int j = 0; j < call.T; j++)
            v.positions.push_back(s.n + call.offset + j), v.cache_rows.push_back(base + row0 + j);
        v.ids.insert(v.ids.end(), call.ids, call.ids + call.T);
        if (i > 0) v.attn_masks.push_back(0), v.attn_masks.push_back(0);  // the bridge from the previous sequence
        v.attn_q_offsets.push_back(v.rows), v.attn_kv_offsets.push_back(base);
        v.attn_masks.push_back(call.mask_block), v.attn_masks.push_back(s.n + call.offset);
        v.rows += call.T;
        v.attn_q_offsets.push_back(v.rows), v.attn_kv_offsets.push_back(base + n_keys);
        v.offsets.push_back(v.rows);
        v.step.push_back(call.T <= dllm__splitk_spread_rows);  // a block's rows: gemm_splitk, alone and in any batch
        v.raw0.push_back(call.r0), v.raw1.push_back(call.r1), v.q0.push_back(0);
        v.out0.push_back(v.out_rows);
        v.out_rows += call.r1 - call.r0;
        v.max_rows = std::max(v.max_rows, call.T);
    }
    return DLLM_OK;
}

/* A slot's state after its forward ran: a COMMIT's rows join the committed ones; a BLOCK_FULL's rows are the block
 * cache; a STEP or a COMMIT wrote over the rows the block cache was in (the schedule follows neither by a
 * sub-block). */
static void dllm__bd_slot_advance(const dllm__bd_call &call, dllm__bd_slot &s) {
    if (call.kind == DLLM__BD_COMMIT)
        s.n += call.T, s.block = 0;
    else if (call.kind == DLLM__BD_BLOCK_FULL)
        s.block = call.T;
    else if (call.kind == DLLM__BD_STEP)
        s.block = 0;
}

/* The sampler launches of the LM-head chunk of gathered logit rows [c0, c0 + rows) of layout v: for each sequence i
 * with a pick (its choices start at choice0[i]), the pick rows j whose logits row (gathered: v.out0[i] +
 * pick->logits_row(j)) is in the chunk, one range since that row never falls as j rises; a range from a shifted pick's
 * row 0 keeps the shift (rows 0 and 1 read the same logits row), any other reads consecutive rows. */
static std::vector<dllm__sampler_span> dllm__bd_sampler_spans(const std::vector<dllm__bd_seq> &seqs,
                                                              const dllm__varlen_layout &v,
                                                              const std::vector<int> &choice0, int c0, int rows) {
    std::vector<dllm__sampler_span> spans;
    for (size_t i = 0; i < seqs.size(); i++) {
        const dllm__bd_pick *p = seqs[i].pick;
        if (!p) continue;
        auto gathered = [&](int j) { return v.out0[i] + p->logits_row(j); };
        int j0 = 0, j1 = p->n;
        while (j0 < j1 && gathered(j0) < c0) j0++;
        while (j1 > j0 && gathered(j1 - 1) >= c0 + rows) j1--;
        if (j0 == j1) continue;
        dllm__sampler_span s;
        s.seq = (int)i, s.pos0 = p->pos0 + j0, s.n = j1 - j0, s.lrow0 = gathered(j0) - c0;
        s.shift0 = p->shift0 && j0 == 0, s.out = choice0[i] + j0;
        spans.push_back(s);
    }
    return spans;
}

const char *dllm__gpu_backend::bd_batch_unsupported() const {
    if (!dllm__env().bd_batch) return "(bd_batch is off)";
    if (!dllm__is_block_diffusion(model_.cfg) && !moe_model()) return "for a model that is not block diffusion";
    if ((weights_->fp8_ffn || weights_->fp8_attn) && !dllm__env().batch_fp8) return "under FP8 (batch_fp8 is off)";
    if (kvq_.enabled() && model_.cfg.head_dim > 256) return "under kv_quant at head dims above 256";
    return nullptr;
}

/* Slot s sized for rows[s] rows, empty unless keep[s]
 * (the batched K/V-cache step's slots: a batch is one or the other); the empty list releases them. */
dllm_status dllm__gpu_backend::bd_batch_reserve(const std::vector<int> &rows, const std::vector<bool> &keep) {
    if (rows.empty()) return batch_kv_reserve(rows, keep);
    if (const char *why = bd_batch_unsupported())
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched block-diffusion forward %s", why);
    for (int n : rows)
        if (n < 1) return dllm__fail(DLLM_ERR_INTERNAL, "a block-diffusion slot of %d rows (at least 1 expected)", n);
    // [KV quant] each slot's codes, no bf16 rows (gpu/batch_kvq.cpp)
    const dllm_status s = kvq_.enabled() ? kvq_batch_reserve(rows, keep) : bkv_alloc(rows, keep);
    if (s != DLLM_OK) {
        if (batch_.slot_rows.empty()) batch_.bd_slots.clear();  // none kept: the previous slots are gone
        return s;
    }
    std::vector<dllm__bd_slot> slots(rows.size());
    for (size_t s = 0; s < keep.size() && s < rows.size(); s++)
        if (keep[s]) slots[s] = batch_.bd_slots[s];
    batch_.bd_slots.swap(slots);
    return DLLM_OK;
}

/* The layout over the reserved slots, the batched forward with its LM head and the device's choice (bd_batch_choose),
 * then each slot's state advanced. */
dllm_status dllm__gpu_backend::bd_forward_batch(const std::vector<dllm__bd_seq> &seqs, float *logits,
                                                dllm__choice *choices) {
    if (const char *why = bd_batch_unsupported())
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched block-diffusion forward %s", why);
    if (seqs.empty()) return DLLM_OK;
    if (batch_.bd_slots.empty())
        return dllm__fail(DLLM_ERR_INTERNAL, "a batched block-diffusion forward before bd_batch_reserve");
    dllm__varlen_layout v;
    DLLM__TRY(dllm__bd_batch_layout_of(seqs, batch_.slot_base, batch_.slot_rows, batch_.bd_slots, max_tokens_, v));
    if (kvq_.enabled()) {  // [KV quant] each sequence's attention over its own codes (self_attention_varlen_kvq)
        DLLM__TRY(kvq_batch_prepare(seqs, v.rows));
        batch_.kvq_seqs = &seqs;
    }
    const dllm_status s = bd_batch_choose(seqs, v, logits, choices);
    batch_.kvq_seqs = nullptr;
    DLLM__TRY(s);
    for (const dllm__bd_seq &q : seqs) dllm__bd_slot_advance(q.call, batch_.bd_slots[(size_t)q.slot]);
    batch_.bd_forwards++;
    return DLLM_OK;
}

/* The device's choice over the layout (choose_in_chunks): the sequences with a pick sampled at step 0 (as
 * bd_forward_choose: dllm__choose's step for block diffusion; their choices to the host), the other sequences' raw
 * logit rows copied into `logits`, one sequence after another. */
dllm_status dllm__gpu_backend::bd_batch_choose(const std::vector<dllm__bd_seq> &seqs, const dllm__varlen_layout &v,
                                               float *logits, dllm__choice *choices) {
    std::vector<int> choice0(seqs.size(), -1),
        raw0(seqs.size(), 0);  // a picked sequence's first choice; another's first row in logits
    std::vector<const dllm__sampling *> sampling(seqs.size(), nullptr);
    int n_chosen = 0, n_raw = 0;
    for (size_t i = 0; i < seqs.size(); i++) {
        if (seqs[i].pick)
            choice0[i] = n_chosen, n_chosen += seqs[i].pick->n, sampling[i] = &seqs[i].pick->sampling;
        else
            raw0[i] = n_raw, n_raw += v.raw1[i] - v.raw0[i];
    }
    if ((n_raw > 0 && !logits) || (n_chosen > 0 && !choices))
        return dllm__fail(DLLM_ERR_INTERNAL, "batched block diffusion: %d logit rows and %d choices to return, %s",
                          n_raw, n_chosen, logits ? "no choices array" : "no logits array");
    const std::vector<dllm_step_state> states(seqs.size(), dllm_step_state());
    return choose_in_chunks(
        v, sampling, states, raw0, n_chosen,
        [&](int c0, int rows) { return dllm__bd_sampler_spans(seqs, v, choice0, c0, rows); }, logits, choices);
}
