/* src/gpu/batch_kv.cpp - the batched K/V-cache step. */

// ---- [batch] [dual cache] [prefix cache] The batched K/V-cache step ------------------------------------------------
// Fast-dLLM's caches for many sequences in one forward: each sequence has its own slot of cached K|V rows (for every
// layer), sized by its canvas (batch_kv_reserve) and kept, moved where a new layout puts it, while it decodes. A
// block's first step forwards every row of the canvas and fills the slot; its later steps forward the block (dual) or
// the block and the rows after it (prefix) and write their fresh K|V over their slot rows. All sequences' forwarded
// rows, at any block and of any step kind, go through the batched forward
// (forward_varlen: every GEMM over each run of sequences of one kind, DLLM__ROWS_BATCH); each sequence's queries attend
// to its own slot only, through the varlen flash_attn, its keys split as its solo step splits them. So a sequence's
// logits are bit-identical whatever else is in the batch, a batch of one and dllm_generate (on sm_90a, BF16) included.
// A sequence that finishes is simply no longer in the plan.

const char *dllm__gpu_backend::batch_kv_unsupported() const { return batch_unsupported(); }

dllm_status dllm__gpu_backend::batch_kv_reserve(const std::vector<int> &rows, const std::vector<bool> &keep) {
    batch_.bd_slots.clear();  // the slots are no longer bd_forward_batch's
    if (rows.empty()) {
        bkv_release();
        return DLLM_OK;
    }
    if (const char *why = batch_kv_unsupported())
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched K/V-cache step %s", why);
    for (int n : rows)
        if (n < 1 || n > max_tokens_)
            return dllm__fail(DLLM_ERR_INTERNAL, "a K/V cache slot of %d rows (1 to %d expected)", n, max_tokens_);
    return bkv_alloc(rows, keep);
}

void dllm__gpu_backend::bkv_release() {
    batch_.kv.release();
    batch_.kvq_slots.clear(), batch_.kvq_fresh.release();  // [KV quant] the slots' codes
    batch_.slot_base.clear(), batch_.slot_rows.clear(), batch_.kv_rows = 0;
}

/* The slots of rows[s] rows each (batch_.kv, batch_.slot_base, batch_.slot_rows); kv_scatter_rows loaded. A slot with
 * keep[s] keeps its K|V rows, copied to its place in a new layout
 * (a stepper's live sequence while others join and leave); the same layout again moves nothing. A failure leaves the
 * previous slots as they were, or none if none was kept. */
dllm_status dllm__gpu_backend::bkv_alloc(const std::vector<int> &rows, const std::vector<bool> &keep) {
    DLLM__TRY(dllm__check_kept_slots(rows, keep, batch_.slot_rows));
    if (rows == batch_.slot_rows && batch_.kv.ptr) return load_kv_scatter();
    const dllm__config &c = model_.cfg;
    int64_t total = 0;
    for (int n : rows) total += n;
    if (total > INT32_MAX)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "the batch's K/V caches hold more than 2^31 rows; make the batch smaller");
    const size_t row_bytes = (size_t)2 * c.n_head_kv * c.head_dim * 2;
    if (std::find(keep.begin(), keep.end(), true) == keep.end())
        bkv_release();  // nothing to copy: the previous slots go before the new ones are allocated
    dllm__dbuf next;
    DLLM__TRY(next.fit((size_t)c.n_layer * (size_t)total * row_bytes,
                       "the batch's K/V caches (make the batch or its canvases smaller)"));
    std::vector<int> base(rows.size(), 0);
    for (size_t s = 1; s < rows.size(); s++) base[s] = base[s - 1] + rows[s - 1];
    for (size_t s = 0; s < keep.size(); s++)  // every layer's rows of the slot: one strided copy
        if (keep[s])
            DLLM__CUDA(cudaMemcpy2DAsync((char *)next.ptr + (size_t)base[s] * row_bytes, (size_t)total * row_bytes,
                                         (const char *)batch_.kv.ptr + (size_t)batch_.slot_base[s] * row_bytes,
                                         (size_t)batch_.kv_rows * row_bytes, (size_t)rows[s] * row_bytes,
                                         (size_t)c.n_layer, cudaMemcpyDeviceToDevice, stream_));
    DLLM__CUDA(cudaStreamSynchronize(stream_));  // the copies read the previous slots, released next
    batch_.kv = std::move(next);
    batch_.slot_base = base, batch_.slot_rows = rows, batch_.kv_rows = (int)total;
    return load_kv_scatter();
}

/* kv_scatter_rows's module, compiled (or read from the JIT caches) once. */
dllm_status dllm__gpu_backend::load_kv_scatter() {
    if (kernels_.kv_scatter.fn) return DLLM_OK;
    DLLM__TRY(dllm__jit_load(dllm__module_kv_scatter(arch_), kernels_.kv_scatter_module));
    kernels_.kv_scatter.fn = kernels_.kv_scatter_module->kernels.at("kv_scatter_rows"),
    kernels_.kv_scatter.name = "kv_scatter_rows";
    return DLLM_OK;
}

/* forward_batch's with the layout of the reserved slots. */
dllm_status dllm__gpu_backend::forward_batch_kv(const std::vector<dllm__batch_seq> &plan, float *out) {
    if (const char *why = batch_kv_unsupported())
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched K/V-cache step %s", why);
    if (plan.empty()) return DLLM_OK;
    if (!batch_.kv.ptr) return dllm__fail(DLLM_ERR_INTERNAL, "a batched K/V-cache step before batch_kv_reserve");
    dllm__varlen_layout v;
    DLLM__TRY(kv_layout(plan, v));
    return batch_logits_to_host(plan, v, out);
}

/* Per attention entry of a K/V-cache layout (sequence i is entry 2i, the bridges between them have no query row) its
 * split-KV shares, as dllm__gpu_backend::attention splits a solo forward's (its forwarded rows over its keys), and
 * where its partial states start; the most shares; the floats of all the states. */
static int dllm__attn_entry_splits(const dllm__arch &arch, const dllm__config &c, int n_sms,
                                   const dllm__varlen_layout &v, std::vector<int32_t> &out, size_t &floats) {
    const size_t entries = v.attn_q_offsets.size() - 1;
    out.assign(2 * entries, 0);
    floats = 0;
    int most = 1;
    for (size_t e = 0; e < entries; e++) {
        const int rows = v.attn_q_offsets[e + 1] - v.attn_q_offsets[e],
                  keys = v.attn_kv_offsets[e + 1] - v.attn_kv_offsets[e];
        const bool may_split = rows > 0 && c.head_dim <= dllm__attn_varlen_split_max_hd;
        const int shares = may_split ? dllm__attn_kv_splits(arch, rows, keys, c.n_head, n_sms) : 1;
        out[2 * e] = shares, out[2 * e + 1] = (int32_t)floats;
        if (shares > 1) floats += (size_t)c.n_head * shares * rows * (c.head_dim + 2);
        most = std::max(most, shares);
    }
    return most;
}

/* The attention's offsets, shares and work lists and the rows' cache rows on the device (prepare_batch, before its
 * synchronisation). */
dllm_status dllm__gpu_backend::upload_kv_layout(const dllm__varlen_layout &v) {
    std::vector<int32_t> splits;
    size_t floats = 0;
    batch_.max_splits = dllm__attn_entry_splits(arch_, model_.cfg, n_sms_, v, splits, floats);
    if (floats > (size_t)INT32_MAX)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "the batch's split attention states exceed 2^31 floats; make the batch smaller");
    // [block diffusion] A sequence whose keys are not split (a prefill) takes bd_attention's attention, a launch of its
    // own (self_attention_varlen_kv), as it would alone: the work lists leave it out (no share).
    std::vector<int32_t> work_splits = splits;
    batch_.attn_wide.assign(splits.size() / 2, 0);
    for (size_t e = 0; e < batch_.attn_wide.size() && kernels_.attention.wide.fn && !v.attn_masks.empty(); e++)
        if (v.attn_masks[2 * e] > 0 && v.attn_q_offsets[e + 1] > v.attn_q_offsets[e] && splits[2 * e] == 1)
            batch_.attn_wide[e] = 1, work_splits[2 * e] = 0;
    if (batch_.max_splits == 1) splits.clear();  // no entry splits: the kernels read no shares (varlen_splits null)
    DLLM__TRY(upload_varlen_work(v.attn_q_offsets, work_splits, v.max_rows));
    if (batch_.max_splits > 1) {
        DLLM__TRY(batch_.attn_splits.fit(splits.size() * 4, "the batch's attention shares"));
        DLLM__TRY(batch_.attn_partial.fit(floats * 4, "the batch's split attention states"));
        DLLM__CUDA(cudaMemcpyAsync(batch_.attn_splits.ptr, splits.data(), splits.size() * 4, cudaMemcpyHostToDevice,
                                   stream_));
    }
    DLLM__TRY(batch_.attn_q_offsets.fit(v.attn_q_offsets.size() * 4, "the batch's attention offsets"));
    DLLM__TRY(batch_.attn_kv_offsets.fit(v.attn_kv_offsets.size() * 4, "the batch's attention offsets"));
    DLLM__TRY(batch_.cache_rows.fit(v.cache_rows.size() * 4, "the batch's cache rows"));
    DLLM__CUDA(cudaMemcpyAsync(batch_.attn_q_offsets.ptr, v.attn_q_offsets.data(), v.attn_q_offsets.size() * 4,
                               cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(batch_.attn_kv_offsets.ptr, v.attn_kv_offsets.data(), v.attn_kv_offsets.size() * 4,
                               cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(batch_.cache_rows.ptr, v.cache_rows.data(), v.cache_rows.size() * 4,
                               cudaMemcpyHostToDevice, stream_));
    if (v.attn_masks.empty()) return DLLM_OK;
    DLLM__TRY(batch_.attn_masks.fit(v.attn_masks.size() * 4, "the batch's attention masks"));
    DLLM__CUDA(cudaMemcpyAsync(batch_.attn_masks.ptr, v.attn_masks.data(), v.attn_masks.size() * 4,
                               cudaMemcpyHostToDevice, stream_));
    return DLLM_OK;
}

/* self_attention_varlen under a K/V cache: the fused QKV GEMM over the forwarded rows, bias + RoPE at their positions,
 * their K|V columns into their slot rows of this layer's cache (kv_scatter_rows), then the varlen attention with each
 * sequence's queries (the forwarded rows' Q columns) over its slot's n rows. */
dllm_status dllm__gpu_backend::self_attention_varlen_kv(size_t layer, const dllm__varlen_layout &v) {
    const dllm__config &c = model_.cfg;
    const int hd = c.head_dim, stride = (c.n_head + 2 * c.n_head_kv) * hd, width = 2 * c.n_head_kv * hd, T = v.rows;
    const dllm__gpu_layer &L = weights_->layers[layer];
    if (v.attn_q_offsets.size() != v.attn_kv_offsets.size() || v.cache_rows.size() != (size_t)T || !batch_.kv.ptr)
        return dllm__fail(DLLM_ERR_INTERNAL,
                          "batched K/V-cache step: a layout of %d rows with %zu cache rows, caches %s", T,
                          v.cache_rows.size(), batch_.kv.ptr ? "reserved" : "not reserved");
    DLLM__TRY(gemm(L.qkv.view(), produced_attn_input(layer) ? nullptr : act_.a.ptr, act_.qkv.ptr, T, DLLM__ROWS_BATCH));
    mark("gemm qkv");
    if (moe_model())  // [MoE] LLaDA2: QK-norm, then RoPE on the first rotary_dim dims, at each row's position
        DLLM__TRY(qk_norm_rope_varlen(layer, v));
    else
        DLLM__TRY(rope_qkv(act_.qkv.ptr, L.b_qkv.ptr, T, T, 0));
    if (c.llama4_beta != 0) DLLM__TRY(llama4_scale_varlen(v));
    mark("rope");
    bf16_t *cache = batch_.kv.as<bf16_t>() + layer * (size_t)batch_.kv_rows * width;
    DLLM__TRY(kernels_.kv_scatter.launch({dim3((unsigned)T), dim3(128)}, stream_,
                                         act_.qkv.as<bf16_t>() + (size_t)c.n_head * hd, (u64)stride, cache, (u64)width,
                                         batch_.cache_rows.as<int>(), width, T));
    mark("kv cache");
    attn_args a = {};
    a.q = act_.qkv.as<bf16_t>();
    a.k = cache;
    a.v = cache + (size_t)c.n_head_kv * hd;
    a.o = act_.att.as<bf16_t>();
    a.seq = max_tokens_, a.q_rows = v.max_rows;  // each CTA reads its sequence's own (varlen_sequence)
    a.q_stride = stride, a.kv_stride = width, a.o_stride = c.n_head * hd, a.group = c.n_head / c.n_head_kv;
    a.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    a.kv_splits = batch_.max_splits;  // each sequence's keys split as its solo step splits them (upload_kv_layout)
    a.varlen_splits = batch_.max_splits > 1 ? batch_.attn_splits.as<int>() : nullptr;
    a.partial = batch_.attn_partial.as<float>();
    a.q_offsets = batch_.attn_q_offsets.as<int>(), a.kv_offsets = batch_.attn_kv_offsets.as<int>();
    a.varlen_masks = v.attn_masks.empty() ? nullptr : batch_.attn_masks.as<int>();
    DLLM__TRY(varlen_attention(a, (int)v.attn_q_offsets.size() - 1, v.max_rows));
    for (size_t e = 0; e < batch_.attn_wide.size(); e++)
        if (batch_.attn_wide[e]) DLLM__TRY(attention_wide_entry(a, v, e));
    mark("attention");
    return DLLM_OK;
}

/* [block diffusion] Entry e of layout v (upload_kv_layout's attn_wide) as bd_attention attends a forward alone: its
 * queries over its slot rows under its block-causal mask, one launch with the keys not split (flash_attn_wg where the
 * GPU has it). `a` is the varlen attention's arguments. */
dllm_status dllm__gpu_backend::attention_wide_entry(const attn_args &a, const dllm__varlen_layout &v, size_t e) {
    const dllm__config &c = model_.cfg;
    const int q0 = v.attn_q_offsets[e], k0 = v.attn_kv_offsets[e];
    attn_args d = {};
    d.q = a.q + (size_t)q0 * a.q_stride, d.o = a.o + (size_t)q0 * a.o_stride;
    d.k = a.k + (size_t)k0 * a.kv_stride, d.v = a.v + (size_t)k0 * a.kv_stride;
    d.seq = v.attn_kv_offsets[e + 1] - k0, d.q_rows = v.attn_q_offsets[e + 1] - q0;
    d.q_stride = a.q_stride, d.kv_stride = a.kv_stride, d.o_stride = a.o_stride, d.group = a.group;
    d.q_bstride = (u64)d.q_rows * a.q_stride, d.o_bstride = (u64)d.q_rows * a.o_stride;
    d.scale_log2 = a.scale_log2, d.kv_splits = 1, d.partial = a.partial;
    d.mask_block = v.attn_masks[2 * e], d.q_index0 = v.attn_masks[2 * e + 1];
    return dllm__attn_launch(kernels_.attention, arch_, c.head_dim, c.n_head, 1, d, stream_, true);
}

/* [Llama-4 query scaling] of the layout's rows (act_.qkv, after RoPE) at their own positions (v.positions): one launch
 * per run of consecutive positions (a block-diffusion sequence's rows are one run). Row-wise, so a row's bits never
 * depend on the others. Twin: dllm__cpu_llama4_scale. */
dllm_status dllm__gpu_backend::llama4_scale_varlen(const dllm__varlen_layout &v) {
    const dllm__config &c = model_.cfg;
    const int qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim, width = c.n_head * c.head_dim;
    for (int r0 = 0, r1 = 0; r0 < v.rows; r0 = r1) {
        for (r1 = r0 + 1; r1 < v.rows && v.positions[(size_t)r1] == v.positions[(size_t)r1 - 1] + 1; r1++) {}
        DLLM__TRY(kernels_.rowwise.llama4_scale_q.launch({dllm__rows_grid(r1 - r0, width / 8, 256), dim3(256)}, stream_,
                                                         act_.qkv.as<bf16_t>() + (size_t)r0 * qkv, r1 - r0, qkv, width,
                                                         v.positions[(size_t)r0], c.llama4_beta, c.llama4_orig_max));
    }
    return DLLM_OK;
}
