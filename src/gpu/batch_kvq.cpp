/* src/gpu/batch_kvq.cpp - the batched block-diffusion forward under kv_quant (SoloQ's quantised K/V cache). */

// ---- [batch] [block diffusion] [KV quant] bd_forward_batch over quantised caches ----------------------------------
// Each sequence's committed cache is a slot of its own holding what kvq_begin holds for a generation alone: codes,
// pairs, V side and the sinks' bf16 rows for the slot's rows (dllm__gpu_kvq_slot), and its block cache; no bf16
// committed rows (batch_.kv stays empty). The forward is bd_forward_batch's: every GEMM once over all rows
// (DLLM__ROWS_BATCH), embedding, norms, RoPE at each row's position row by row. Only the attention differs: one layer's
// forwarded K|V rows of every sequence go to one buffer (batch_.kvq_fresh, kv_scatter_rows), then ONE launch (kvq_flash
// and its combine under kvq_tc, one kvq_flash launch per CTA shape where chunks differ in it, else kvq_attention)
// attends every sequence over ITS OWN cache (its codes ++ its fresh rows): a work table built on the host
// (dllm__kvq_batch_work_of, uploaded by kvq_batch_upload) lists, per sequence, the CTAs of the launches kvq_attention
// makes for it alone, each with that launch's arguments, so every CTA's keys, splits, arithmetic and merge are the
// sequence's own, their shapes a function of its rows and keys only (before sm_90 kvq_flash runs per chunk from the
// same table: kvq_flash_batch would spill there). A sequence
// with nothing committed takes bd_attention's attention over its fresh rows, a launch of its own; a COMMIT quantises its rows into
// its own codes (kvq_commit) after the attention. So a sequence's logits and choices are bit-identical whatever else
// is in the batch, a batch of one included (the GEMMs are the batched path's, so not dllm_generate's bits: bd_batch's
// header says why).

/* The slots of rows[s] rows (what kvq_begin(rows[s]) allocates), each empty unless keep[s]; a free slot's buffers are
 * reused, grown where a new sequence needs more. The module, the rotations, kvq_flash's split states and flash_attn's
 * (a sequence with nothing committed) loaded and sized once. A failure leaves the kept slots as they were. */
dllm_status dllm__gpu_backend::kvq_batch_reserve(const std::vector<int> &rows, const std::vector<bool> &keep) {
    DLLM__TRY(dllm__check_kept_slots(rows, keep, batch_.slot_rows));
    const dllm__config &c = model_.cfg;
    DLLM__TRY(kvq_load());
    kv_codes_.flash_on = false;  // as kvq_begin: the switch read at each layout (one run keeps it)
    if (dllm__env().kvq_tc) DLLM__TRY(kvq_tc_begin());
    DLLM__TRY(committed_.partial.fit(dllm__attn_partial_bound(arch_, c.head_dim, n_sms_), "split-KV attention states"));
    DLLM__TRY(load_kv_scatter());
    batch_.kv.release();  // the bf16 slots of a previous layout without kv_quant: none here
    std::vector<dllm__gpu_kvq_slot> &slots = batch_.kvq_slots;
    const size_t had = batch_.slot_rows.size();
    if (slots.size() < rows.size()) slots.resize(rows.size());
    for (size_t s = 0; s < rows.size(); s++) {
        if (s < keep.size() && keep[s]) continue;
        dllm__gpu_kvq_slot &k = slots[s];
        const int sink_rows = std::min(kvq_.n_sink, rows[s]);
        k.capacity = k.group = k.sink_rows = 0;  // empty until it fits
        const dllm_status st = kvq_fit(k.k_codes, k.v_codes, k.v_side, k.sinks, rows[s], sink_rows);
        if (st != DLLM_OK) {
            slots.resize(had);  // the previous layout's slots (a free one emptied), the live ones untouched
            return st;
        }
        k.capacity = rows[s], k.sink_rows = sink_rows;
    }
    slots.resize(rows.size());
    std::vector<int> base(rows.size(), 0);
    for (size_t s = 1; s < rows.size(); s++) base[s] = base[s - 1] + rows[s - 1];
    batch_.slot_base = base, batch_.slot_rows = rows, batch_.kv_rows = 0;
    return DLLM_OK;
}

/* What a forward needs before its launches (none may be captured, [batch graphs]): each COMMIT's key groups as
 * bd_prepare checks a generation's (the slot's group set, and its pairs sized, at its first commit), each BLOCK_FULL's
 * block cache sized, and one layer's fresh rows of the whole forward. */
dllm_status dllm__gpu_backend::kvq_batch_prepare(const std::vector<dllm__bd_seq> &seqs, int rows) {
    const dllm__config &c = model_.cfg;
    const size_t row_bytes = (size_t)4 * kvq_.kvd;  // K|V, bf16
    if (batch_.kvq_slots.size() != batch_.bd_slots.size())
        return dllm__fail(DLLM_ERR_INTERNAL, "batched block diffusion under kv_quant: %zu code slots for %zu slots",
                          batch_.kvq_slots.size(), batch_.bd_slots.size());
    for (const dllm__bd_seq &q : seqs) {
        dllm__gpu_kvq_slot &k = batch_.kvq_slots[(size_t)q.slot];
        const dllm__bd_slot &s = batch_.bd_slots[(size_t)q.slot];
        const dllm__bd_call &call = q.call;
        if (call.kind == DLLM__BD_BLOCK_FULL)
            DLLM__TRY(k.block_cache.fit((size_t)kvq_.n_layer * call.T * row_bytes, "the block cache"));
        if (call.kind != DLLM__BD_COMMIT) continue;
        const int group = call.kv_group ? call.kv_group : c.bd_size;  // 9c's rule, as bd_prepare's
        if (!k.group && group > 0) {
            k.group = group;
            const size_t groups = (size_t)(k.capacity + group - 1) / group;
            DLLM__TRY(k.k_pairs.fit((size_t)kvq_.n_layer * groups * kvq_.kvd * 4, "the quantised K/V cache"));
        }
        if (group != k.group || group <= 0 || s.n % group || call.T % group)
            return dllm__fail(DLLM_ERR_INTERNAL,
                              "kv_quant: slot %d's commit of rows [%d, %d) is not whole key groups of %d rows (the "
                              "generation's block: %d)",
                              q.slot, s.n, s.n + call.T, group, k.group);
    }
    return batch_.kvq_fresh.fit((size_t)rows * row_bytes, "the forwarded K/V rows beside the quantised caches");
}

/* The attention's work tables on the device (prepare_batch, after the buffers are fitted; none may be captured): the
 * work over the sequences with committed rows (dllm__kvq_batch_work_of), the kvq_args of each (layer, chunk) as
 * kvq_attention would build them for the sequence alone, the items, and the split states sized for all chunks. */
dllm_status dllm__gpu_backend::kvq_batch_upload(const dllm__varlen_layout &v) {
    const dllm__config &c = model_.cfg;
    const int hd = c.head_dim, qkv = (c.n_head + 2 * c.n_head_kv) * hd;
    const std::vector<dllm__bd_seq> &seqs = *batch_.kvq_seqs;
    std::vector<dllm__kvq_batch_seq> att;
    std::vector<size_t> seq_of;  // att[j] is seqs[seq_of[j]]
    for (size_t i = 0; i < seqs.size(); i++) {
        const dllm__bd_call &call = seqs[i].call;
        const dllm__bd_slot &s = batch_.bd_slots[(size_t)seqs[i].slot];
        if (s.n == 0) continue;  // nothing committed: flash_attn (self_attention_varlen_kvq)
        dllm__kvq_batch_seq q;
        q.T = call.T, q.n_keys = s.n + (call.kind == DLLM__BD_SUB_BLOCK ? s.block : call.T), q.n_committed = s.n,
        q.mask_block = call.mask_block, q.pos0 = s.n + call.offset;
        att.push_back(q), seq_of.push_back(i);
    }
    dllm__kvq_batch_work &w = batch_.kvq_work;
    DLLM__TRY(dllm__kvq_batch_work_of(kv_codes_.flash_on, hd, c.n_head, c.n_head_kv, kvq_.n_sink, n_sms_,
                                      kv_codes_.flash.smem_optin, att, w));
    if (w.chunks.empty()) return DLLM_OK;
    if (w.tc) DLLM__TRY(batch_.kvq_partial.fit(w.partial_floats * 4, "the batch's KV-quant attention split states"));
    std::vector<kvq_args> &tab = batch_.kvq_args_host;
    tab.assign((size_t)kvq_.n_layer * w.chunks.size(), kvq_args());
    for (size_t layer = 0; layer < (size_t)kvq_.n_layer; layer++)
        for (size_t ci = 0; ci < w.chunks.size(); ci++) {
            const dllm__kvq_batch_chunk &ch = w.chunks[ci];
            const dllm__kvq_batch_seq &q = att[(size_t)ch.seq];
            const size_t i = seq_of[(size_t)ch.seq];
            const dllm__bd_slot &s = batch_.bd_slots[(size_t)seqs[i].slot];
            const dllm__gpu_kvq_slot &k = batch_.kvq_slots[(size_t)seqs[i].slot];
            const size_t row0 = (size_t)v.offsets[i] + ch.r0;
            const char *keys = kvq_batch_fresh_rows(v, i);
            if (seqs[i].call.kind == DLLM__BD_SUB_BLOCK)  // the block cache, this layer's (self_attention_varlen_kvq)
                keys = kvq_batch_block_rows(k, layer, s.block);
            kvq_args a = kvq_attention_args(k.codes(keys), layer, act_.qkv.as<bf16_t>() + row0 * qkv,
                                            act_.att.as<bf16_t>() + row0 * c.n_head * hd, q.n_keys, q.n_committed,
                                            q.mask_block, q.pos0 + ch.r0);
            if (w.tc)  // kvq_attention's chunk, dllm__kvq_tc_launch's split size and states
                a.q_rows = ch.rows, a.split_keys = ch.plan.split_keys,
                a.partial = batch_.kvq_partial.as<float>() + ch.partial;
            tab[layer * w.chunks.size() + ci] = a;
        }
    DLLM__TRY(batch_.kvq_chunks.fit(tab.size() * sizeof(kvq_args), "the batch's KV-quant attention arguments"));
    DLLM__TRY(batch_.kvq_items.fit(w.items.size() * sizeof(kvq_item), "the batch's KV-quant attention items"));
    DLLM__CUDA(cudaMemcpyAsync(batch_.kvq_chunks.ptr, tab.data(), tab.size() * sizeof(kvq_args),
                               cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(batch_.kvq_items.ptr, w.items.data(), w.items.size() * sizeof(kvq_item),
                               cudaMemcpyHostToDevice, stream_));
    return DLLM_OK;
}

/* Sequence i's rows in batch_.kvq_fresh: the K|V rows (bf16, 4 kvd bytes a row) the layer being computed forwards. */
const char *dllm__gpu_backend::kvq_batch_fresh_rows(const dllm__varlen_layout &v, size_t i) const {
    return (const char *)batch_.kvq_fresh.ptr + (size_t)v.offsets[i] * ((size_t)4 * kvq_.kvd);
}

/* Slot k's block cache of one layer, for a block of `rows` K|V rows. */
char *dllm__gpu_backend::kvq_batch_block_rows(const dllm__gpu_kvq_slot &k, size_t layer, int rows) const {
    return (char *)k.block_cache.ptr + layer * (size_t)rows * ((size_t)4 * kvq_.kvd);
}

/* The fused QKV GEMM over every row, bias + RoPE at their positions (and the Llama-4 query scaling), their K|V columns
 * into batch_.kvq_fresh. */
dllm_status dllm__gpu_backend::kvq_batch_qkv(size_t layer, const dllm__varlen_layout &v) {
    const dllm__config &c = model_.cfg;
    const int hd = c.head_dim, kvd = c.n_head_kv * hd, qkv = (c.n_head + 2 * c.n_head_kv) * hd, T = v.rows;
    const dllm__gpu_layer &L = weights_->layers[layer];
    DLLM__TRY(gemm(L.qkv.view(), produced_attn_input(layer) ? nullptr : act_.a.ptr, act_.qkv.ptr, T, DLLM__ROWS_BATCH));
    mark("gemm qkv");
    DLLM__TRY(rope_qkv(act_.qkv.ptr, L.b_qkv.ptr, T, T, 0));
    if (c.llama4_beta != 0) DLLM__TRY(llama4_scale_varlen(v));
    mark("rope");
    return kernels_.kv_scatter.launch({dim3((unsigned)T), dim3(128)}, stream_,
                                      act_.qkv.as<bf16_t>() + (size_t)c.n_head * hd, (u64)qkv,
                                      batch_.kvq_fresh.as<bf16_t>(), (u64)(2 * kvd), nullptr, 2 * kvd, T);
}

/* Each sequence's block cache: a BLOCK_FULL's fresh rows kept, a SUB_BLOCK's written at its offset (the overwrite
 * persists, block-diffusion.md; the attention reads the block from there). */
dllm_status dllm__gpu_backend::kvq_batch_keep_blocks(size_t layer, const dllm__varlen_layout &v) {
    const size_t row_bytes = (size_t)4 * kvq_.kvd;
    const std::vector<dllm__bd_seq> &seqs = *batch_.kvq_seqs;
    for (size_t i = 0; i < seqs.size(); i++) {
        const dllm__bd_call &call = seqs[i].call;
        const dllm__bd_slot &s = batch_.bd_slots[(size_t)seqs[i].slot];
        const dllm__gpu_kvq_slot &k = batch_.kvq_slots[(size_t)seqs[i].slot];
        if (call.kind == DLLM__BD_BLOCK_FULL)
            DLLM__CUDA(cudaMemcpyAsync(kvq_batch_block_rows(k, layer, call.T), kvq_batch_fresh_rows(v, i),
                                       (size_t)call.T * row_bytes, cudaMemcpyDeviceToDevice, stream_));
        else if (call.kind == DLLM__BD_SUB_BLOCK)
            DLLM__CUDA(cudaMemcpyAsync(kvq_batch_block_rows(k, layer, s.block) + (size_t)call.offset * row_bytes,
                                       kvq_batch_fresh_rows(v, i), (size_t)call.T * row_bytes, cudaMemcpyDeviceToDevice,
                                       stream_));
    }
    return DLLM_OK;
}

/* The sequences with nothing committed yet (their first block): bd_attention's attention over their fresh rows (a
 * SUB_BLOCK's: its block cache), a launch each. */
dllm_status dllm__gpu_backend::kvq_batch_attention_uncommitted(size_t layer, const dllm__varlen_layout &v) {
    const dllm__config &c = model_.cfg;
    const int hd = c.head_dim, qkv = (c.n_head + 2 * c.n_head_kv) * hd;
    const std::vector<dllm__bd_seq> &seqs = *batch_.kvq_seqs;
    for (size_t i = 0; i < seqs.size(); i++) {
        const dllm__bd_call &call = seqs[i].call;
        const dllm__bd_slot &s = batch_.bd_slots[(size_t)seqs[i].slot];
        if (s.n > 0) continue;
        const dllm__gpu_kvq_slot &k = batch_.kvq_slots[(size_t)seqs[i].slot];
        const char *keys = kvq_batch_fresh_rows(v, i);
        int n_keys = call.T;
        if (call.kind == DLLM__BD_SUB_BLOCK) keys = kvq_batch_block_rows(k, layer, s.block), n_keys = s.block;
        DLLM__TRY(dllm__attn_launch(kernels_.attention, arch_, hd, c.n_head, 1,
                                    bd_attn_args(call, act_.qkv.as<bf16_t>() + (size_t)v.offsets[i] * qkv, keys,
                                                 act_.att.as<bf16_t>() + (size_t)v.offsets[i] * c.n_head * hd, n_keys,
                                                 s.n + call.offset),
                                    stream_, true));
    }
    return DLLM_OK;
}

/* ONE attention over every sequence's own committed codes and fresh rows from kvq_batch_upload's tables, each CTA a CTA
 * of the sequence's own launch: kvq_flash_batch (one launch per CTA shape) and its combine under kvq_tc, else
 * kvq_attention_batch. */
dllm_status dllm__gpu_backend::kvq_batch_attention_committed(size_t layer) {
    const dllm__config &c = model_.cfg;
    const dllm__kvq_batch_work &w = batch_.kvq_work;
    const size_t n_chunks = w.chunks.size();
    const kvq_args *chunks = batch_.kvq_chunks.as<kvq_args>() + layer * n_chunks;
    const kvq_item *items = batch_.kvq_items.as<kvq_item>();
    const kvq_batch_args rows = {chunks, items + w.n_flash, 0};
    const dim3 row_grid((unsigned)(w.items.size() - (size_t)w.n_flash), (unsigned)c.n_head);
    if (n_chunks && !w.tc) {
        DLLM__TRY(kv_codes_.kernels.kvq_attention_batch.launch({row_grid, dim3(32)}, stream_, rows));
    } else if (n_chunks && arch_.cc >= 90) {
        for (const dllm__kvq_batch_group &g : w.groups) {
            const kvq_batch_args flash = {chunks, items + g.first, g.q_tiles};
            const dim3 grid((unsigned)g.max_splits, (unsigned)c.n_head_kv, (unsigned)(g.count * g.q_tiles));
            DLLM__TRY(
                kv_codes_.flash.kvq_flash_batch.launch({grid, dim3((unsigned)g.warps * 32), g.smem}, stream_, flash));
        }
        DLLM__TRY(kv_codes_.flash.kvq_flash_combine_batch.launch({row_grid, dim3(32)}, stream_, rows));
    } else {  // before sm_90 (kvq_flash_batch would spill there): each chunk's own launches, the same arguments
        for (size_t ci = 0; ci < n_chunks; ci++) {
            const dllm__kvq_batch_chunk &ch = w.chunks[ci];
            DLLM__TRY(dllm__kvq_tc_launch(kv_codes_.flash, batch_.kvq_args_host[layer * n_chunks + ci], ch.plan,
                                          batch_.kvq_partial.as<float>() + ch.partial,
                                          batch_.kvq_partial.bytes - ch.partial * 4, stream_));
        }
    }
    return DLLM_OK;
}

/* Each COMMIT's fresh rows quantised into its slot's codes, after the attention read them. */
dllm_status dllm__gpu_backend::kvq_batch_commit(size_t layer, const dllm__varlen_layout &v) {
    const std::vector<dllm__bd_seq> &seqs = *batch_.kvq_seqs;
    for (size_t i = 0; i < seqs.size(); i++) {
        if (seqs[i].call.kind != DLLM__BD_COMMIT) continue;
        const dllm__gpu_kvq_slot &k = batch_.kvq_slots[(size_t)seqs[i].slot];
        DLLM__TRY(kvq_commit(k.codes(kvq_batch_fresh_rows(v, i)), layer, batch_.bd_slots[(size_t)seqs[i].slot].n,
                             seqs[i].call.T));
    }
    return DLLM_OK;
}

/* self_attention_varlen under kv_quant: the fused QKV GEMM, RoPE and the fresh K|V rows (kvq_batch_qkv); each
 * sequence's block cache kept or written (kvq_batch_keep_blocks); then ONE attention over every sequence's own
 * committed codes (kvq_batch_attention_committed), and each COMMIT's rows quantised into its codes (kvq_batch_commit).
 * A sequence with nothing committed yet (its first block) keeps bd_attention's attention over its fresh rows, a
 * launch of its own (kvq_batch_attention_uncommitted): another kernel, whose bits the batched attention could not
 * give. */
dllm_status dllm__gpu_backend::self_attention_varlen_kvq(size_t layer, const dllm__varlen_layout &v) {
    DLLM__TRY(kvq_batch_qkv(layer, v));
    DLLM__TRY(kvq_batch_keep_blocks(layer, v));
    mark("kv cache");
    DLLM__TRY(kvq_batch_attention_uncommitted(layer, v));
    DLLM__TRY(kvq_batch_attention_committed(layer));
    DLLM__TRY(kvq_batch_commit(layer, v));
    mark("attention");
    return DLLM_OK;
}

/* [batch graphs] What a captured forward under kv_quant bakes in beyond the layout (varlen_graph_id): each sequence's
 * slot, kind, rows, offset, mask, committed and block rows (its launches and their shapes, and so the work tables'
 * contents, which kvq_batch_upload writes before every forward) and its slot's buffers, the shared buffers (the work
 * tables' among them), and whether kvq_flash runs. */
std::string dllm__gpu_backend::kvq_batch_graph_key() const {
    std::string key =
        dllm__format(" kvq f%d %p %p %p %p %p %p", (int)kv_codes_.flash_on, batch_.kvq_fresh.ptr,
                     kv_codes_.flash_partial.ptr, committed_.partial.ptr, batch_.kvq_chunks.ptr, batch_.kvq_items.ptr,
                     batch_.kvq_partial.ptr);
    for (const dllm__bd_seq &q : *batch_.kvq_seqs) {
        const dllm__bd_slot &s = batch_.bd_slots[(size_t)q.slot];
        const dllm__gpu_kvq_slot &k = batch_.kvq_slots[(size_t)q.slot];
        key += dllm__format(" [%d k%d T%d o%d m%d n%d b%d g%d c%d %p %p %p %p %p %p]", q.slot, (int)q.call.kind,
                            q.call.T, q.call.offset, q.call.mask_block, s.n, s.block, k.group, k.capacity,
                            k.k_codes.ptr, k.v_codes.ptr, k.k_pairs.ptr, k.v_side.ptr, k.sinks.ptr, k.block_cache.ptr);
    }
    return key;
}
