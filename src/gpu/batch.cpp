/* src/gpu/batch.cpp - the batched forward (varlen). */

// ---- [batch] The batched forward: every canvas's rows in one forward (dllm_generate_batch) ----------------------
// Each GEMM runs once over all sequences' rows (DLLM__ROWS_BATCH: the bits of a row never depend on the row count);
// embedding, norms, RoPE (at each row's own position) and SwiGLU work row by row; attention is varlen, every sequence's
// queries over its own keys only. So a sequence's logits are bit-identical whatever the batch's other sequences, their
// lengths and their order, a batch of one included. Without a K/V cache not the solo forward's bits: that one tunes
// its GEMMs per row count and runs LaCache, the wgmma attention and the current block's tile order. Under FP8
// (batch_fp8, on by default) an E4M3 GEMM runs its rows in row-independent launches instead (gemm_fp8_batch), with the
// same guarantee.

const char *dllm__gpu_backend::batch_unsupported() const {
    if (dllm__is_block_diffusion(model_.cfg)) return "for block diffusion";
    if (moe_model()) return "for LLaDA2 (mixture of experts: it batches through the block-diffusion forward)";
    if ((weights_->fp8_ffn || weights_->fp8_attn) && !dllm__env().batch_fp8) return "under FP8 (batch_fp8 is off)";
    return nullptr;
}

dllm__batch_caps dllm__gpu_backend::batch_caps() const {
    auto why = [](const char *what, const char *reason) {
        return reason ? dllm__format("the GPU backend has no batched %s %s", what, reason) : std::string();
    };
    return {why("forward", batch_unsupported()), why("K/V-cache step", batch_kv_unsupported()),
            why("block-diffusion forward", bd_batch_unsupported())};
}

dllm_status dllm__gpu_backend::forward_batch(const std::vector<dllm__batch_seq> &plan, float *out) {
    if (const char *why = batch_unsupported())
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched forward %s", why);
    if (plan.empty()) return DLLM_OK;
    const dllm__config &c = model_.cfg;
    dllm__varlen_layout v;
    DLLM__TRY(dllm__varlen_layout_of(c, plan, max_tokens_, v));
    return batch_logits_to_host(plan, v, out);
}

/* batch_logits with every chunk copied to the host, then each sequence's rows [r0, r1) unshifted into out, one sequence
 * after another (forward_batch's and forward_batch_kv's contract). */
dllm_status dllm__gpu_backend::batch_logits_to_host(const std::vector<dllm__batch_seq> &plan,
                                                    const dllm__varlen_layout &v, float *out) {
    const dllm__config &c = model_.cfg;
    std::vector<float> raw((size_t)v.out_rows * c.n_vocab);
    DLLM__TRY(batch_logits(v, [&](int c0, int rows) -> dllm_status {
        DLLM__CUDA(cudaMemcpyAsync(raw.data() + (size_t)c0 * c.n_vocab, act_.logits.ptr, (size_t)rows * c.n_vocab * 4,
                                   cudaMemcpyDeviceToHost, stream_));
        return DLLM_OK;
    }));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < plan.size(); i++) {
        dllm__unshift_rows(c, raw.data() + (size_t)v.out0[i] * c.n_vocab, v.raw0[i], plan[i].r0, plan[i].r1, out);
        out += (size_t)(plan[i].r1 - plan[i].r0) * c.n_vocab;
    }
    return DLLM_OK;
}

/* flash_attn's varlen instantiation, compiled (or read from the JIT caches) once. */
dllm_status dllm__gpu_backend::load_varlen() {
    if (batch_.attn.fn) return DLLM_OK;
    const int hd = model_.cfg.head_dim;
    DLLM__TRY(dllm__jit_load(dllm__module_attention_varlen(arch_, hd), batch_.varlen_module));
    auto bind = [&](const dllm__arch &tiles, dllm__kernel<void(attn_args)> &k) {
        cudaKernel_t fn = batch_.varlen_module->kernels.at(dllm__attn_varlen_name(hd, tiles));
        DLLM__CUDA(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)dllm__attn_smem(hd, tiles)));
        k.fn = fn, k.name = "flash_attn (varlen)";
        return DLLM_OK;
    };
    DLLM__TRY(bind(dllm__attn_short_tiles(arch_), batch_.attn_short));
    batch_.combine.fn = batch_.varlen_module->kernels.at(dllm__attn_combine_name(hd, true));
    batch_.combine.name = "attn_combine (varlen)";
    return bind(arch_, batch_.attn);  // last: its kernel says the module is bound
}

/* Whether the varlen attention of `batch` entries, the longest forwarding max_rows query rows, runs on the short tiles
 * (dllm__attn_short_tiles: same bits): where dllm__attn_varlen_short says so. */
bool dllm__gpu_backend::varlen_short(int batch, int max_rows) const {
    return dllm__attn_varlen_short(arch_, model_.cfg.head_dim, model_.cfg.n_head, batch, max_rows, n_sms_,
                                   smem_per_sm_);
}

/* The varlen attention of `batch` entries (a's offsets) over the work lists upload_varlen_work made for them. */
dllm_status dllm__gpu_backend::varlen_attention(const attn_args &a, int batch, int max_rows) {
    const bool short_runs = varlen_short(batch, max_rows);
    attn_args w = a;
    w.varlen_work = batch_.attn_work.as<int>();
    return dllm__attn_varlen_launch(short_runs ? batch_.attn_short : batch_.attn, batch_.combine,
                                    short_runs ? dllm__attn_short_tiles(arch_) : arch_, model_.cfg.head_dim,
                                    model_.cfg.n_head, batch, batch_.work, w, stream_);
}

/* The work lists (dllm__attn_varlen_work) of the varlen attention over entries q_offsets with shares splits (empty: 1
 * each) on the device, for the tiles varlen_attention will pick. Before prepare_batch's synchronisation: the copy is
 * no launch a graph may capture ([batch graphs]), and the lists stay put until the next layout. */
dllm_status dllm__gpu_backend::upload_varlen_work(const std::vector<int32_t> &q_offsets,
                                                  const std::vector<int32_t> &splits, int max_rows) {
    const int batch = (int)q_offsets.size() - 1;
    const int br = varlen_short(batch, max_rows) ? dllm__attn_short_tiles(arch_).fa_br : arch_.fa_br;
    batch_.work = dllm__attn_varlen_work(q_offsets, splits, br, batch_.work_items);
    if (batch_.work_items.empty()) return DLLM_OK;
    DLLM__TRY(batch_.attn_work.fit(batch_.work_items.size() * 4, "the batch's attention work lists"));
    DLLM__CUDA(cudaMemcpyAsync(batch_.attn_work.ptr, batch_.work_items.data(), batch_.work_items.size() * 4,
                               cudaMemcpyHostToDevice, stream_));
    return DLLM_OK;
}

/* The buffers for the layout's rows, and its canvas rows, positions and offsets on the device, and the tables of the
 * one attention self_attention_varlen runs over it, picked as it picks: [KV quant]'s work tables (no bf16 slot rows,
 * no varlen work lists), a K/V cache's layout and work lists, or the plain varlen attention's work lists. */
dllm_status dllm__gpu_backend::prepare_batch(const dllm__varlen_layout &v) {
    DLLM__TRY(load_varlen());
    DLLM__TRY(fit_buffers(1, v.rows, std::max(1, std::min(v.out_rows, dllm__lm_chunk_rows))));
    DLLM__TRY(batch_.row_offsets.fit(v.offsets.size() * 4, "the batch's row offsets"));
    positions_on_ = true;  // rope_qkv reads act_.positions[row]
    DLLM__CUDA(cudaMemcpyAsync(act_.canvas.ptr, v.ids.data(), (size_t)v.rows * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(
        cudaMemcpyAsync(act_.positions.ptr, v.positions.data(), (size_t)v.rows * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(batch_.row_offsets.ptr, v.offsets.data(), v.offsets.size() * 4, cudaMemcpyHostToDevice,
                               stream_));
    batch_.attn_wide.clear();  // upload_kv_layout's
    if (batch_.kvq_seqs)
        DLLM__TRY(kvq_batch_upload(v));
    else if (v.cached())
        DLLM__TRY(upload_kv_layout(v));
    else
        DLLM__TRY(upload_varlen_work(v.offsets, {}, v.max_rows));
    DLLM__CUDA(cudaStreamSynchronize(stream_));  // the host arrays may go out of scope
    return DLLM_OK;
}

/* The forward of the layout's rows up to the final norm of each sequence's logit rows, gathered into act_.y. The plain
 * forward's stages with batch 1 over all rows (output_and_ffn, the norms, [SoloQ]'s fused producers); attention varlen.
 * No [truncation]: the last layer computes every row, as it would for any other batch. */
dllm_status dllm__gpu_backend::forward_varlen(const dllm__varlen_layout &v) {
    const int T = v.rows, d = model_.cfg.n_embd;
    float *h = act_.h.as<float>();
    DLLM__TRY(embed_gather(act_.canvas.as<int>(), T, h));
    DLLM__TRY(add_rmsnorm(h, nullptr, nullptr, weights_->layers[0].attn_norm.ptr, act_.a.ptr, 1, T, 0, T));
    const size_t n_layers = weights_->layers.size();
    for (size_t l = 0; l < n_layers; l++) {
        DLLM__TRY(self_attention_varlen(l, v));
        DLLM__TRY(output_and_ffn(l, 1, T, 0, T, h, h));
        if (l + 1 == n_layers) break;
        DLLM__TRY(next_layer_input(l, h, 1, T, true));
    }
    for (size_t i = 0; i < v.out0.size(); i++)  // the last residual add and the final norm, the wanted rows only
        DLLM__TRY(add_rmsnorm(h, nullptr, act_.delta.ptr, weights_->final_norm.ptr,
                              (char *)act_.y.ptr + (size_t)v.out0[i] * d * 2, 1, T, v.offsets[i] + v.raw0[i] - v.q0[i],
                              v.raw1[i] - v.raw0[i]));
    return DLLM_OK;
}

/* [batch graphs] forward_varlen as a CUDA graph (batch_graphs, on by default): a batch steps many
 * times through one layout (the same sequences, rows and positions within a block; only the token ids change, and they
 * reach act_.canvas by prepare_batch's copy before each forward), so its ~10 launches a layer are replayed from one
 * graph, captured at the layout's second forward (replay_graph). A graph replays the launches an eager forward makes,
 * so its bits are the eager forward's. */
dllm_status dllm__gpu_backend::forward_varlen_replayed(const dllm__varlen_layout &v) {
    if (!dllm__env().batch_graphs || dllm__env().no_graphs || debug_.timer || moe_.debug_experts || moe_.debug_logits)
        return forward_varlen(v);  // profiling (mark) times eager stages; [MoE] a test reading the routes back, too
    return replay_graph(graphs_.batched, varlen_graph_id(v), [&] { return forward_varlen(v); });
}

/* What a captured batched forward bakes in. `slot` fixes its kernels and grids: the sequences, the rows, the longest
 * sequence (with the sequences, the attention's tiles), the logit rows, whether a K/V cache and block-causal masks take
 * part, the kind of each run of sequences (its GEMMs' kernel: gemm_splitk or gemm_wg, whose cluster launches a graph
 * update would not carry over) and the most split-KV shares (the combine's launches). The attention's grids are as
 * long as its work lists (dllm__attn_varlen_work), which may differ within a slot: a graph update carries them.
 * `baked` adds every launch argument the host computes from the layout (all of it but the ids: the positions too,
 * which [Llama-4 query scaling]'s launches take, and the work lists, which the attention's CTAs read) and the device
 * buffers the launches point into. */
dllm__graph_id dllm__gpu_backend::varlen_graph_id(const dllm__varlen_layout &v) const {
    dllm__graph_id id;
    id.slot = dllm__format("b%zu T%d m%d o%d c%d k%d s%d ", v.out0.size(), v.rows, v.max_rows, v.out_rows,
                           (int)v.cached(), (int)!v.attn_masks.empty(), v.cached() ? batch_.max_splits : 1);
    for (const dllm__gemm_run &run : dllm__gemm_runs_of(v)) id.slot += run.step ? 's' : 'f';
    for (char wide : batch_.attn_wide) id.slot += wide ? 'w' : '.';  // entries attended apart: launches of their own
    if (batch_.kvq_seqs) id.slot += kvq_batch_graph_key();  // [KV quant] each sequence's own launches
    id.baked = id.slot + dllm__format(" | a%d t%d %p %p %p %p %p %p %p %p %p", act_.generation, batch_.kv_rows,
                                      batch_.row_offsets.ptr, batch_.attn_q_offsets.ptr, batch_.attn_kv_offsets.ptr,
                                      batch_.cache_rows.ptr, batch_.attn_masks.ptr, batch_.kv.ptr,
                                      batch_.attn_splits.ptr, batch_.attn_partial.ptr, batch_.attn_work.ptr);
    id.baked.append(v.step.begin(), v.step.end());  // each sequence's GEMM kind (batch_.gemm_runs)
    for (const std::vector<int32_t> *a : {&v.positions, &v.offsets, &v.raw0, &v.raw1, &v.out0, &v.q0, &v.attn_q_offsets,
                                          &v.attn_kv_offsets, &v.cache_rows, &v.attn_masks, &batch_.work_items}) {
        id.baked += dllm__format(" %zu:", a->size());
        id.baked.append((const char *)a->data(), a->size() * sizeof(int32_t));
    }
    return id;
}

/* Self-attention of one layer over the layout's rows (held in act_.a, or under [SoloQ] from layer 1 on made in act_.q4a
 * by the fused producer): the fused QKV GEMM, bias + RoPE at each row's position, varlen attention into act_.att. */
dllm_status dllm__gpu_backend::self_attention_varlen(size_t layer, const dllm__varlen_layout &v) {
    if (batch_.kvq_seqs) return self_attention_varlen_kvq(layer, v);  // [KV quant] gpu/batch_kvq.cpp
    if (v.cached()) return self_attention_varlen_kv(layer, v);
    const dllm__config &c = model_.cfg;
    const int hd = c.head_dim, stride = (c.n_head + 2 * c.n_head_kv) * hd, T = v.rows;
    const dllm__gpu_layer &L = weights_->layers[layer];
    DLLM__TRY(gemm(L.qkv.view(), produced_attn_input(layer) ? nullptr : act_.a.ptr, act_.qkv.ptr, T, DLLM__ROWS_BATCH));
    DLLM__TRY(rope_qkv(act_.qkv.ptr, L.b_qkv.ptr, T, T, 0));
    attn_args a = {};
    a.q = act_.qkv.as<bf16_t>();
    a.k = a.q + (size_t)c.n_head * hd;
    a.v = a.q + (size_t)(c.n_head + c.n_head_kv) * hd;
    a.o = act_.att.as<bf16_t>();
    a.seq = a.q_rows = v.max_rows;  // each CTA reads its sequence's own (varlen_sequence)
    a.q_stride = stride, a.kv_stride = stride, a.o_stride = c.n_head * hd, a.group = c.n_head / c.n_head_kv;
    a.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    a.kv_splits = 1;
    a.q_offsets = a.kv_offsets = batch_.row_offsets.as<int>();
    return varlen_attention(a, (int)v.out0.size(), v.max_rows);
}
