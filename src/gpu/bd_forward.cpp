/* src/gpu/bd_forward.cpp - the block-diffusion forward, its graphs and its device token choice. */

/* The limits of one forward, as the CPU backend checks them: its rows fit the cache after the committed ones, its
 * RoPE positions the context's tables, a sub-block the block cache. */
dllm_status dllm__gpu_backend::bd_check(const dllm__bd_call &call) const {
    if (call.T <= 0 || call.r0 < 0 || call.r1 <= call.r0 || call.r1 > call.T)
        return dllm__fail(DLLM_ERR_INTERNAL, "block diffusion: a forward of %d rows asks for output rows [%d, %d)",
                          call.T, call.r0, call.r1);
    if (call.kind == DLLM__BD_SUB_BLOCK && call.offset + call.T > committed_.block_rows)
        return dllm__fail(DLLM_ERR_INTERNAL,
                          "block diffusion: a sub-block forward at %d outside the block cache (%d rows)", call.offset,
                          committed_.block_rows);
    const int scratch = call.kind == DLLM__BD_SUB_BLOCK ? committed_.block_rows : call.T;
    if (committed_.n + scratch > committed_.capacity)
        return dllm__fail(
            DLLM_ERR_INTERNAL,
            "block diffusion: a forward of %d rows past %d committed ones overflows the K/V cache (%d rows, sized by "
            "bd_begin)",
            call.T, committed_.n, committed_.capacity);
    if (committed_.n + call.offset + call.T > max_tokens_)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "block diffusion: positions up to %d exceed the context's limit of %d tokens (max_tokens)",
                          committed_.n + call.offset + call.T, max_tokens_);
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::bd_forward(const dllm__bd_call &call, float *logits) {
    DLLM__TRY(bd_prepare(call));
    const bool one_chunk = call.r1 - call.r0 <= dllm__lm_chunk_rows;
    DLLM__TRY(bd_run(call, nullptr, one_chunk));
    if (!one_chunk) return bd_head(call, logits);
    DLLM__CUDA(cudaMemcpyAsync(logits, act_.logits.ptr, (size_t)(call.r1 - call.r0) * model_.cfg.n_vocab * 4,
                               cudaMemcpyDeviceToHost, stream_));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    return DLLM_OK;
}

/* Everything the host decides before a forward's launches (none of it may be captured, [bd graphs]): the limits, the
 * key groups of a kv_quant commit, the buffers fitted (the LM head's rows, and the sampler's choose_rows where the
 * device chooses), the ids copied to the device, FACache's row list. */
dllm_status dllm__gpu_backend::bd_prepare(const dllm__bd_call &call, int choose_rows) {
    DLLM__TRY(bd_check(call));
    const dllm__config &c = model_.cfg;
    const int T = call.T, out_rows = call.r1 - call.r0;
    if (call.kind == DLLM__BD_COMMIT && kvq_.enabled()) {  // 9c's rule: whole key groups, the same all generation long
        const int group = call.kv_group ? call.kv_group : c.bd_size;
        if (!kvq_.group) {
            kvq_.group = group;
            DLLM__TRY(
                kv_codes_.k_pairs.fit((size_t)kvq_.n_layer * kvq_.groups() * kvq_.kvd * 4, "the quantised K/V cache"));
        }
        if (group != kvq_.group || group <= 0 || committed_.n % group || T % group)
            return dllm__fail(
                DLLM_ERR_INTERNAL,
                "kv_quant: a commit of rows [%d, %d) is not whole key groups of %d rows (the generation's block: %d)",
                committed_.n, committed_.n + T, group, kvq_.group);
    }
    // A K/V-cache generation: row-tuned GEMMs, as the dual cache's (no LaCache row-independence to keep); the RoPE
    // positions are this path's own, not DPad's. Only self_attention reads act_.kv, and this path never calls it.
    kv_on_ = true, positions_on_ = false;
    solo_kv_ = DLLM__ROWS_TUNED;
    DLLM__TRY(fit_buffers(1, T, std::max(std::min(out_rows, dllm__lm_chunk_rows), choose_rows)));
    const size_t row_bytes = (size_t)4 * c.n_head_kv * c.head_dim;  // K|V, bf16
    if (call.kind == DLLM__BD_BLOCK_FULL) {
        DLLM__TRY(committed_.block_cache.fit(weights_->layers.size() * (size_t)T * row_bytes, "the block cache"));
        committed_.block_rows = T;
    }
    if (kvq_.enabled())  // [KV quant] the rows the forward attends to past the committed ones, one layer's at a time
        DLLM__TRY(kv_codes_.fresh.fit((size_t)(call.kind == DLLM__BD_SUB_BLOCK ? committed_.block_rows : T) * row_bytes,
                                      "the forwarded K/V rows beside the quantised cache"));
    DLLM__CUDA(cudaMemcpyAsync(act_.canvas.ptr, call.ids, (size_t)T * 4, cudaMemcpyHostToDevice, stream_));
    if (bdfa_on(0)) DLLM__TRY(bdfa_prepare(call));
    return DLLM_OK;
}

/* The forward's launches up to the final norm of output rows [r0, r1) (act_.y); the committed length moves in
 * bd_run. */
dllm_status dllm__gpu_backend::bd_layers(const dllm__bd_call &call) {
    const int T = call.T, out_rows = call.r1 - call.r0;
    float *h = act_.h.as<float>();
    mark("start");
    DLLM__TRY(embed_gather(act_.canvas.as<int>(), T, h));
    DLLM__TRY(add_rmsnorm(h, nullptr, nullptr, weights_->layers[0].attn_norm.ptr, act_.a.ptr, 1, T, 0, T));
    mark("L0 embed+norm");
    const size_t n_layers = weights_->layers.size();
    for (size_t l = 0; l < n_layers; l++) {
        DLLM__TRY(bd_attention(l, call));
        DLLM__TRY(output_and_ffn(l, 1, T, 0, T, h, h));
        if (l + 1 == n_layers)
            DLLM__TRY(add_rmsnorm(h, h, act_.delta.ptr, weights_->final_norm.ptr, act_.y.ptr, 1, T, call.r0, out_rows));
        else  // bd_attention's QKV GEMM quantises a SoloQ layer's input itself: no fused producer
            DLLM__TRY(next_layer_input(l, h, 1, T, false));
        mark("add+norm");
    }
    return DLLM_OK;
}

/* The forward's launches (bd_layers), then with `head` the LM head over its output rows (one chunk: act_.logits), then
 * with `pick` the sampler's choice of pick's rows (act_.x0, act_.conf, act_.deferred; the draws' step in
 * act_.state). */
dllm_status dllm__gpu_backend::bd_body(const dllm__bd_call &call, const dllm__bd_pick *pick, bool head) {
    const int out_rows = call.r1 - call.r0;
    DLLM__TRY(bd_layers(call));
    if (!head) return DLLM_OK;
    DLLM__TRY(lm_head(1, out_rows, 0, out_rows));
    mark("lm head");
    if (!pick) return DLLM_OK;
    return launch_sampler(bd_sampler_args(call, *pick), act_.x0.as<int>(), act_.conf.as<double>(),
                          act_.deferred.as<unsigned char>());
}

/* [bd graphs] A forward's launches, eagerly or as a graph; then a commit advances the committed length. Graphs are
 * taken for the repeated step forwards (STEP, BLOCK_FULL, SUB_BLOCK) whose LM head is one chunk; a commit runs once per
 * block (capturing it would cost what launching it does), and profiling (mark) times stages between launches: both stay
 * eager, as does everything under DLLM_DEBUG_PLAIN=1. */
dllm_status dllm__gpu_backend::bd_run(const dllm__bd_call &call, const dllm__bd_pick *pick, bool head) {
    // [MoE] LLaDA2's routes stay on the device (gpu/moe.cpp): captured as the others, unless a test reads them back
    const bool graph = head && call.kind != DLLM__BD_COMMIT && !debug_.timer && !dllm__env().no_graphs &&
                       dllm__env().bd_graphs && !moe_.debug_experts && !moe_.debug_logits;
    if (graph)
        DLLM__TRY(bd_replay(call, pick));
    else
        DLLM__TRY(bd_body(call, pick, head));
    if (!graph) graphs_.block_diffusion.counts[DLLM__GRAPH_EAGER]++;
    if (call.kind == DLLM__BD_COMMIT) committed_.n += call.T;
    return DLLM_OK;
}

/* The buffers and sizes a captured forward points into, beside what the call names (dllm__bd_graph_keys). */
dllm__graph_id dllm__gpu_backend::bd_graph_id(const dllm__bd_call &call, const dllm__bd_pick *pick) const {
    const dllm__config &c = model_.cfg;
    const int n_keys = committed_.n + (call.kind == DLLM__BD_SUB_BLOCK ? committed_.block_rows : call.T);
    const int splits = dllm__attn_kv_splits(arch_, call.T, n_keys, c.n_head, n_sms_);
    const std::string buffers =
        dllm__format("a%d cap%d g%d %p %p %p %p %p %p %p %p %p %p %p", act_.generation, committed_.capacity, kvq_.group,
                     committed_.kv.ptr, committed_.block_cache.ptr, committed_.partial.ptr, facache_.state.ptr,
                     facache_.rows.ptr, kv_codes_.k_codes.ptr, kv_codes_.v_codes.ptr, kv_codes_.k_pairs.ptr,
                     kv_codes_.v_side.ptr, kv_codes_.sinks.ptr, kv_codes_.fresh.ptr);
    return dllm__bd_graph_keys(call, pick, committed_.n, committed_.block_rows, splits, buffers);
}

dllm_status dllm__gpu_backend::bd_replay(const dllm__bd_call &call, const dllm__bd_pick *pick) {
    return replay_graph(graphs_.block_diffusion, bd_graph_id(call, pick), [&] { return bd_body(call, pick, true); });
}

/* [bd graphs] [batch graphs] One forward through its slot of `graphs` (dllm__graph_next): run eagerly, replayed, or
 * captured first (the slot's graph updated in place or instantiated anew). A failed capture fails no forward: this one
 * and the slot's next run eagerly, with one warning a context. set.counts[action] counts what each forward did. */
template <class F>
dllm_status dllm__gpu_backend::replay_graph(dllm__graph_set &set, const dllm__graph_id &id, F &&body) {
    if (!set.slots.count(id.slot) && set.slots.size() >= dllm__graph_slots) graphs_drop(set);
    dllm__graph_slot &g = set.slots[id.slot];
    dllm__graph_action action = dllm__graph_next(g, id);
    if ((action == DLLM__GRAPH_UPDATE || action == DLLM__GRAPH_INSTANTIATE) &&
        capture_graph(set, g, action, body) != DLLM_OK) {
        if (!set.warned_eager)
            dllm__log(DLLM_LOG_WARN, "%s could not be captured as a CUDA graph (%s); forwards of its shape run eagerly",
                      set.what, dllm__tls_error.c_str());
        set.warned_eager = true;
        cudaGetLastError();
        g.eager_only = true, action = DLLM__GRAPH_EAGER;
    }
    if (action == DLLM__GRAPH_EAGER)
        DLLM__TRY(body());
    else
        DLLM__CUDA(cudaGraphLaunch(g.exec, stream_));
    set.counts[action]++;
    return DLLM_OK;
}

/* Captures body() into slot g: updates g.exec in place (action UPDATE) or instantiates it (INSTANTIATE, or an update
 * CUDA refused: action says which happened). A failure leaves the slot without a graph. A refused update is counted
 * (the tests expect none) and, the first time in a context, logged with CUDA's reason and the node it names, so that a
 * device run says which capture changed shape. */
template <class F>
dllm_status dllm__gpu_backend::capture_graph(dllm__graph_set &set, dllm__graph_slot &g, dllm__graph_action &action,
                                             F &&body) {
    cudaGraph_t graph = nullptr;
    DLLM__CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    const dllm_status s = body();
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (s == DLLM_OK && e == cudaSuccess && action == DLLM__GRAPH_UPDATE) {
        cudaGraphExecUpdateResultInfo info = {};
        if (cudaGraphExecUpdate(g.exec, graph, &info) == cudaSuccess) {
            cudaGraphDestroy(graph);
            return DLLM_OK;
        }
        cudaGetLastError();  // refused (the captured kernels or their topology differ): instantiate instead
        set.refusals++;
        if (!set.logged_refusal) {
            set.logged_refusal = true;
            cudaGraphNodeType type = cudaGraphNodeTypeCount;
            if (info.errorNode) cudaGraphNodeGetType(info.errorNode, &type);
            cudaGetLastError();
            dllm__log(
                DLLM_LOG_INFO,
                "CUDA refused to update the graph of %s (cudaGraphExecUpdateResult %d, node type %d); the slot is "
                "instantiated again",
                set.what, (int)info.result, (int)type);
        }
        action = DLLM__GRAPH_INSTANTIATE;
    }
    if (g.exec) cudaGraphExecDestroy(g.exec);
    g.exec = nullptr;
    if (s == DLLM_OK && e == cudaSuccess) e = cudaGraphInstantiate(&g.exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (s == DLLM_OK && e == cudaSuccess) return DLLM_OK;  // g.baked: set by dllm__graph_next
    g.exec = nullptr;
    return s != DLLM_OK ? s : dllm__cuda_fail(e, dllm__format("capturing %s as a CUDA graph", set.what).c_str());
}

void dllm__gpu_backend::graphs_drop(dllm__graph_set &set) {
    for (auto &kv : set.slots)
        if (kv.second.exec) cudaGraphExecDestroy(kv.second.exec);
    set.slots.clear();
}

/* flash_attn's arguments for one sequence's call.T queries (rows of the fused QKV projection from q) over n_keys K|V
 * rows (kv), block-causal at positions pos0 + i, into o. One fill for bd_attention and for self_attention_varlen_kvq's
 * sequence with nothing committed, so that the batched kv_quant path launches what the sequence alone would. */
attn_args dllm__gpu_backend::bd_attn_args(const dllm__bd_call &call, const bf16_t *q, const char *kv, bf16_t *o,
                                          int n_keys, int pos0) const {
    const dllm__config &c = model_.cfg;
    const int hd = c.head_dim, kvd = c.n_head_kv * hd, qkv = (c.n_head + 2 * c.n_head_kv) * hd;
    attn_args a = {};
    a.q = q, a.k = (const bf16_t *)kv, a.v = (const bf16_t *)kv + kvd, a.o = o;
    a.seq = n_keys, a.q_rows = call.T;
    a.q_stride = qkv, a.kv_stride = 2 * kvd, a.o_stride = c.n_head * hd, a.group = c.n_head / c.n_head_kv;
    a.q_bstride = (u64)call.T * qkv, a.o_bstride = (u64)call.T * c.n_head * hd;
    a.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    a.kv_splits = dllm__attn_kv_splits(arch_, call.T, n_keys, c.n_head, n_sms_);
    a.partial = committed_.partial.as<float>();
    a.mask_block = call.mask_block, a.q_index0 = pos0;
    return a;
}

/* Layer `layer` up to its attention output (act_.att) for the rows of act_.a (see dllm__bd_kind): the fused QKV GEMM,
 * bias + RoPE at positions committed_.n + offset + i, Nemotron's Llama-4 query scaling, the fresh K|V rows into the
 * cache (and the block cache), and the queries' block-causal attention over the cache's key range. Twin:
 * dllm__cpu_bd_attention. */
dllm_status dllm__gpu_backend::bd_attention(size_t layer, const dllm__bd_call &call) {
    const dllm__config &c = model_.cfg;
    const int T = call.T, hd = c.head_dim, kvd = c.n_head_kv * hd, qkv = (c.n_head + 2 * c.n_head_kv) * hd,
              pos0 = committed_.n + call.offset;
    const size_t row_bytes = (size_t)kvd * 4;
    const dllm__gpu_layer &L = weights_->layers[layer];
    const bool split = bdfa_on(layer);  // [FACache]: a row's Q must not depend on the forward's row count
    DLLM__TRY(gemm(L.qkv.view(), fp8_attn(layer) ? nullptr : act_.a.ptr, act_.qkv.ptr, T,
                   split ? DLLM__ROWS_INDEPENDENT : DLLM__ROWS_TUNED));
    mark("gemm qkv");
    if (moe_model())  // [MoE] LLaDA2: QK-norm, then RoPE on the first rotary_dim dims of each head
        DLLM__TRY(qk_norm_rope(layer, T, pos0));
    else
        DLLM__TRY(rope_qkv(act_.qkv.ptr, L.b_qkv.ptr, T, T, pos0));
    if (c.llama4_beta != 0)
        DLLM__TRY(kernels_.rowwise.llama4_scale_q.launch({dllm__rows_grid(T, c.n_head * hd / 8, 256), dim3(256)},
                                                         stream_, act_.qkv.ptr, T, qkv, c.n_head * hd, pos0,
                                                         c.llama4_beta, c.llama4_orig_max));
    mark("rope");
    char *cache, *after;
    // flash_attn reads kv_codes_.fresh only while nothing is committed; kvq_attention reads the codes
    if (kvq_.enabled())
        cache = after = (char *)kv_codes_.fresh.ptr;
    else
        cache = (char *)committed_.kv.ptr + layer * (size_t)committed_.capacity * row_bytes,
        after = cache + (size_t)committed_.n * row_bytes;
    const bf16_t *fresh = act_.qkv.as<bf16_t>() + (size_t)c.n_head * hd;  // the K|V part of each projection row
    auto put_fresh = [&](char *dst) {  // rows T of them, in order (kv_scatter_rows: see there why not a 2D memcpy)
        return kernels_.kv_scatter.launch({dim3((unsigned)T), dim3(128)}, stream_, fresh, (u64)qkv, (bf16_t *)dst,
                                          (u64)(2 * kvd), nullptr, 2 * kvd, T);
    };
    int n_keys = committed_.n + T;
    if (call.kind == DLLM__BD_SUB_BLOCK) {
        char *block = (char *)committed_.block_cache.ptr + layer * (size_t)committed_.block_rows * row_bytes;
        DLLM__TRY(put_fresh(block + (size_t)call.offset * row_bytes));  // the overwrite persists (block-diffusion.md)
        DLLM__CUDA(cudaMemcpyAsync(after, block, (size_t)committed_.block_rows * row_bytes, cudaMemcpyDeviceToDevice,
                                   stream_));
        n_keys = committed_.n + committed_.block_rows;
    } else {
        DLLM__TRY(put_fresh(after));
        if (call.kind == DLLM__BD_BLOCK_FULL)
            DLLM__TRY(put_fresh((char *)committed_.block_cache.ptr + layer * (size_t)T * row_bytes));
    }
    mark("kv cache");
    const attn_args a = bd_attn_args(call, act_.qkv.as<bf16_t>(), cache, act_.att.as<bf16_t>(), n_keys, pos0);
    if (split)
        DLLM__TRY(bdfa_attention(call, n_keys, pos0));
    else if (kvq_.enabled() && committed_.n > 0)
        DLLM__TRY(kvq_attention(kvq_codes_solo(), layer, act_.qkv.as<bf16_t>(), act_.att.as<bf16_t>(), T, n_keys,
                                committed_.n, call.mask_block, pos0));
    else  // flash_attn_wg where the keys are not split (a prefill): the batched forward decides as this one does
        DLLM__TRY(dllm__attn_launch(kernels_.attention, arch_, hd, c.n_head, 1, a, stream_, true));
    mark("attention");
    if (call.kind == DLLM__BD_COMMIT && kvq_.enabled()) DLLM__TRY(kvq_commit(kvq_codes_solo(), layer, committed_.n, T));
    return DLLM_OK;
}

/* [FACache] Layer 0 of a forward over a non-empty committed cache takes the split attention (bdfa_attention) in every
 * lacache mode, so that ON and OFF give the same bits. Not under kv_quant
 * (its attention reads the codes: kvq_attention). */
bool dllm__gpu_backend::bdfa_on(size_t layer) const {
    return !debug_.facache_off && layer == 0 && committed_.n > 0 && !kvq_.enabled() && model_.cfg.head_dim <= 256;
}

/* [FACache] The host's part of layer 0's split attention, run before the forward's launches (bd_prepare) so that a
 * captured forward holds launches only [bd graphs]: the module at its first use, the state buffers, and the list of
 * rows whose committed state is computed (those whose token changed since the last commit; every row without
 * call.lacache), copied to the device after its length. The decision stays on the host; a graph reads its outcome. */
dllm_status dllm__gpu_backend::bdfa_prepare(const dllm__bd_call &call) {
    const dllm__config &c = model_.cfg;
    const int T = call.T, hd = c.head_dim, offsets = call.offset + T;
    if (!facache_.kernels.module) {
        DLLM__TRY(dllm__jit_load(dllm__module_bdfa(arch_), facache_.kernels.module));
        dllm__bind(facache_.kernels, *facache_.kernels.module);
    }
    const size_t state_bytes = (size_t)offsets * c.n_head * (hd + 2) * 4;
    if (facache_.n != committed_.n || state_bytes > facache_.state.bytes)
        facache_.tokens.assign(facache_.tokens.size(), -1);  // other keys, or states lost
    DLLM__TRY(facache_.state.fit(state_bytes, "layer 0's attention states (FACache)"));
    DLLM__TRY(facache_.rows.fit((size_t)(T + 1) * 4, "layer 0's attention states (FACache)"));
    facache_.n = committed_.n;
    if ((int)facache_.tokens.size() < offsets) facache_.tokens.resize((size_t)offsets, -1);
    facache_.list.assign(1, 0);  // [0]: how many rows follow
    for (int t = 0; t < T; t++) {
        int32_t &held = facache_.tokens[(size_t)(call.offset + t)];
        if (call.lacache && held == call.ids[t]) continue;
        facache_.list.push_back(t);
        held = call.lacache ? call.ids[t] : -1;
    }
    facache_.list[0] = (int)facache_.list.size() - 1;
    if (call.lacache) facache_.rows_seen += T, facache_.rows_reused += T - (int64_t)facache_.list[0];
    DLLM__CUDA(cudaMemcpyAsync(facache_.rows.ptr, facache_.list.data(), facache_.list.size() * 4,
                               cudaMemcpyHostToDevice, stream_));
    return DLLM_OK;
}

/* [FACache] Layer 0's attention of call's rows (act_.qkv) over the committed rows ++ its own (n_keys in all): the
 * committed state of each listed row (bdfa_prepare) is computed and kept at its block offset, then every row merges it
 * with its own keys' state (dllm__src_bdfa). Eagerly a CTA per listed row; captured, a CTA per row, those past the
 * list's length (on the device, read at each replay) returning at once. */
dllm_status dllm__gpu_backend::bdfa_attention(const dllm__bd_call &call, int n_keys, int pos0) {
    const dllm__config &c = model_.cfg;
    const int T = call.T, hd = c.head_dim;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    DLLM__CUDA(cudaStreamIsCapturing(stream_, &capturing));
    const bool graph = capturing != cudaStreamCaptureStatusNone;
    bdfa_args a = {};
    a.cache = (const bf16_t *)committed_.kv.ptr;  // layer 0's rows come first
    a.q = act_.qkv.as<bf16_t>(), a.o = act_.att.as<bf16_t>();
    a.q_stride = (c.n_head + 2 * c.n_head_kv) * hd, a.o_stride = c.n_head * hd;
    a.n_head = c.n_head, a.n_kv = c.n_head_kv, a.hd = hd, a.scale = 1.0f / sqrtf((float)hd);
    a.n_keys = n_keys, a.n_committed = committed_.n, a.mask_block = call.mask_block, a.q_index0 = pos0;
    a.rows = facache_.rows.as<int>() + 1, a.n_rows = graph ? facache_.rows.as<int>() : nullptr;
    a.offset = call.offset, a.state = facache_.state.as<float>();
    const int ctas = graph ? T : facache_.list[0];
    if (ctas > 0)
        DLLM__TRY(facache_.kernels.bdfa_committed.launch(
            {dim3((unsigned)ctas, (unsigned)c.n_head), dim3(32 * dllm__bdfa_warps)}, stream_, a));
    return facache_.kernels.bdfa_merge.launch({dim3((unsigned)T, (unsigned)c.n_head), dim3(32)}, stream_, a);
}

/* The LM head over the final-normed output rows (act_.y) in chunks, each chunk's fp32 logits copied to the host. */
dllm_status dllm__gpu_backend::bd_head(const dllm__bd_call &call, float *logits) {
    const int V = model_.cfg.n_vocab, out_rows = call.r1 - call.r0;
    for (int c0 = 0; c0 < out_rows; c0 += dllm__lm_chunk_rows) {
        const int rows = std::min(dllm__lm_chunk_rows, out_rows - c0);
        DLLM__TRY(lm_head(1, out_rows, c0, rows));
        mark("lm head");
        if (!logits) continue;  // bd_forward_choose: one chunk, sampled where it is
        DLLM__CUDA(cudaMemcpyAsync(logits + (size_t)c0 * V, act_.logits.ptr, (size_t)rows * V * 4,
                                   cudaMemcpyDeviceToHost, stream_));
    }
    if (logits) DLLM__CUDA(cudaStreamSynchronize(stream_));
    return DLLM_OK;
}

/* A step's forward and its token choice on the device (twin: dllm__choose on the host over bd_forward's logits, in
 * dllm__bd_generation::forward_choose). The logits stay in act_.logits and the sampler picks each row's token and
 * confidence, so 13 bytes a row reach the host instead of a vocabulary of fp32 (600 KB a row at Qwen2's), and the
 * host's float64 softmax over it (~2 ms a row on one core) leaves the step: prompt 512 + gen 256 at the 7B shape took
 * 3.18 s with the host's choice, 1.41 s with this (H200). */
dllm_status dllm__gpu_backend::bd_forward_choose(const dllm__bd_call &call, const dllm__bd_pick &pick,
                                                 dllm__choice *out) {
    const int out_rows = call.r1 - call.r0, n = pick.n;
    if (n <= 0 || n > call.T || out_rows > dllm__lm_chunk_rows || pick.logits_row(0) < 0 ||
        pick.logits_row(n - 1) >= out_rows)
        return dllm__fail(
            DLLM_ERR_INTERNAL,
            "block diffusion: %d rows to choose from logits rows %d.. of a forward's %d (one LM-head chunk of at most "
            "%d)",
            n, pick.logits_row(0), out_rows, dllm__lm_chunk_rows);
    DLLM__TRY(bd_prepare(call, n));
    const dllm_step_state draws = {};  // global_step 0: dllm__choose's step for block diffusion
    DLLM__CUDA(cudaMemcpyAsync(act_.state.ptr, &draws, sizeof draws, cudaMemcpyHostToDevice, stream_));
    DLLM__TRY(bd_run(call, &pick, true));  // the forward, its LM head and the sampler
    return choices_to_host(act_.x0, act_.conf, act_.deferred, n, out);
}

/* The sampler over pick's rows of the forward's one LM-head chunk (act_.logits, call's output rows). */
sampler_args dllm__gpu_backend::bd_sampler_args(const dllm__bd_call &call, const dllm__bd_pick &pick) const {
    return sampler_over(pick.sampling, pick.n, pick.pos0, pick.lrow0, pick.shift0, call.r1 - call.r0);
}

/* dllm_logits on a block-diffusion model (twin: dllm__cpu_backend::bd_logits): one forward without a committed cache,
 * block-causal at the granularity the model's forward uses when none is named, positions from 0, shift applied. */
dllm_status dllm__gpu_backend::bd_logits(const int32_t *ids, int n, int r0, int r1, float *out) {
    const dllm__config &c = model_.cfg;
    DLLM__TRY(bd_begin(n));
    dllm__bd_call call;
    call.ids = ids, call.T = n, call.mask_block = c.bd_mask_block;
    call.r0 = dllm__logit_row(c, r0), call.r1 = dllm__logit_row(c, r1 - 1) + 1;
    std::vector<float> raw((size_t)(call.r1 - call.r0) * c.n_vocab);
    DLLM__TRY(bd_forward(call, raw.data()));
    for (int p = r0; p < r1; p++)
        memcpy(out + (size_t)(p - r0) * c.n_vocab, raw.data() + (size_t)(dllm__logit_row(c, p) - call.r0) * c.n_vocab,
               sizeof(float) * c.n_vocab);
    return DLLM_OK;
}
