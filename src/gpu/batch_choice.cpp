/* src/gpu/batch_choice.cpp - the token choice of a batched step on the device. */

// ---- [batch] The token choice of a batched step on the device ----------------------------------------------------
// A batched step's logits (126k fp32 a row at LLaDA's vocabulary: 260 MB for 16 sequences of 32 rows, ~13 ms over PCIe)
// stay on the device: after each LM-head chunk the solo step's sampler (dllm__sampler_fill, launch_sampler) runs over the
// chunk's rows of each sequence with that sequence's own parameters and step, and 13 bytes a row reach the host. The
// sequences whose choice the host makes (CFG's two canvases, combined there) get their logits as forward_batch gives
// them. At batch 16 of the dual-cache step (LLaDA-8B shape, H200) the choice costs 0.1 ms of a 19.5 ms step; copying
// the logits to the host instead took 196 ms.

dllm_status dllm__gpu_backend::forward_batch_choose(const std::vector<dllm__batch_seq> &plan, bool kv, float *logits,
                                                    dllm__choice *choices) {
    if (const char *why = kv ? batch_kv_unsupported() : batch_unsupported())
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched %s %s",
                          kv ? "K/V-cache step" : "forward", why);
    if (plan.empty()) return DLLM_OK;
    if (kv && !bkv_.ptr) return dllm__fail(DLLM_ERR_INTERNAL, "a batched K/V-cache step before batch_kv_reserve");
    dllm__varlen_layout v;
    DLLM__TRY(kv ? kv_layout(plan, v) : dllm__varlen_layout_of(m_.cfg, plan, max_tokens_, v));
    return batch_choose(plan, v, logits, choices);
}

/* The sampler over one span of the LM-head chunk in act_.logits (raw_rows rows), with its sequence's parameters and
 * step state (bch_state_), its choices into bch_x0_/bch_conf_/bch_deferred_ at span.out. */
dllm_status dllm__gpu_backend::sample_span(const dllm__sampling &s, const dllm__sampler_span &span, int raw_rows) {
    const sampler_args a = sampler_over(s, span.n, span.pos0, span.lrow0, span.shift0, raw_rows);
    return launch_sampler(a, bch_x0_.as<int>() + span.out, bch_conf_.as<double>() + span.out,
                          bch_deferred_.as<unsigned char>() + span.out, bch_state_.as<dllm_step_state>() + span.seq);
}

/* The sampler's first n choices (x0, conf, deferred as launch_sampler wrote them) to the host as dllm__choice, after
 * everything queued on the stream: block diffusion's step and the batched step read them so. */
dllm_status dllm__gpu_backend::choices_to_host(const dllm__dbuf &x0, const dllm__dbuf &conf, const dllm__dbuf &deferred,
                                               int n, dllm__choice *out) {
    std::vector<int> t((size_t)n);
    std::vector<double> c((size_t)n);
    std::vector<unsigned char> d((size_t)n);
    if (n > 0) {
        DLLM__CUDA(cudaMemcpyAsync(t.data(), x0.ptr, (size_t)n * 4, cudaMemcpyDeviceToHost, stream_));
        DLLM__CUDA(cudaMemcpyAsync(c.data(), conf.ptr, (size_t)n * 8, cudaMemcpyDeviceToHost, stream_));
        DLLM__CUDA(cudaMemcpyAsync(d.data(), deferred.ptr, (size_t)n, cudaMemcpyDeviceToHost, stream_));
    }
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    for (int i = 0; i < n; i++) out[i] = dllm__choice{t[(size_t)i], c[(size_t)i], d[(size_t)i] != 0};
    return DLLM_OK;
}

/* [batch] The batched forward over layout v with its LM head (batch_logits) and, after each chunk, the sampler over
 * spans_of(c0, rows), each span with its sequence's sampling and step state (sampling[i] null: sequence i is not
 * chosen here); the chunk's logit rows of the other sequences copied to `raw`, sequence i's from row raw0[i]. The
 * n_chosen choices go to the host. The solo step's sampler runs unchanged on each span, so a sequence's choices equal
 * its choices alone. */
dllm_status dllm__gpu_backend::choose_in_chunks(
    const dllm__varlen_layout &v, const std::vector<const dllm__sampling *> &sampling,
    const std::vector<dllm_step_state> &states, const std::vector<int> &raw0, int n_chosen,
    const std::function<std::vector<dllm__sampler_span>(int, int)> &spans_of, float *raw, dllm__choice *choices) {
    const size_t V = (size_t)m_.cfg.n_vocab;
    // One launch samples at most a chunk's rows and one more: under the shift, positions 0 and 1 both read row 0.
    DLLM__TRY(fit_buffers(1, v.rows + 1, std::min(v.out_rows, dllm__lm_chunk_rows) + 1));
    const size_t n = (size_t)std::max(1, n_chosen);
    DLLM__TRY(bch_state_.fit(states.size() * sizeof(dllm_step_state), "the batch's step states"));
    DLLM__TRY(bch_x0_.fit(n * 4, "sampler output"));
    DLLM__TRY(bch_conf_.fit(n * 8, "sampler output"));
    DLLM__TRY(bch_deferred_.fit(n, "sampler output"));
    DLLM__CUDA(cudaMemcpyAsync(bch_state_.ptr, states.data(), states.size() * sizeof(dllm_step_state),
                               cudaMemcpyHostToDevice, stream_));
    DLLM__TRY(batch_logits(v, [&](int c0, int rows) -> dllm_status {
        for (const dllm__sampler_span &s : spans_of(c0, rows))
            DLLM__TRY(sample_span(*sampling[(size_t)s.seq], s, rows));
        for (size_t i = 0; i < sampling.size(); i++) {  // the other sequences: their rows of this chunk
            const int g0 = std::max(c0, v.out0[i]), g1 = std::min(c0 + rows, v.out0[i] + v.raw1[i] - v.raw0[i]);
            if (!sampling[i] && g0 < g1)
                DLLM__CUDA(cudaMemcpyAsync(raw + (size_t)(raw0[i] + g0 - v.out0[i]) * V,
                                           act_.logits.as<float>() + (size_t)(g0 - c0) * V, (size_t)(g1 - g0) * V * 4,
                                           cudaMemcpyDeviceToHost, stream_));
        }
        return DLLM_OK;
    }));
    return choices_to_host(bch_x0_, bch_conf_, bch_deferred_, n_chosen, choices);  // also waits for the logits above
}

/* The device's choice of a batched step (choose_in_chunks): the sequences with sampling parameters at their own step;
 * the others' (CFG's) logits to the host, unshifted into `logits` one sequence after another. */
dllm_status dllm__gpu_backend::batch_choose(const std::vector<dllm__batch_seq> &plan, const dllm__varlen_layout &v,
                                            float *logits, dllm__choice *choices) {
    const dllm__config &c = m_.cfg;
    const size_t V = (size_t)c.n_vocab;
    std::vector<int> choice0(plan.size(), -1),
        raw0(plan.size(), 0);  // a chosen sequence's first choice; another's first row in raw
    std::vector<const dllm__sampling *> sampling(plan.size(), nullptr);
    std::vector<dllm_step_state> states(plan.size(), dllm_step_state());
    int n_chosen = 0, n_raw = 0;
    for (size_t i = 0; i < plan.size(); i++) {
        if (plan[i].sampling)
            choice0[i] = n_chosen, n_chosen += plan[i].r1 - plan[i].r0, states[i].global_step = plan[i].step,
            sampling[i] = plan[i].sampling;
        else
            raw0[i] = n_raw, n_raw += v.raw1[i] - v.raw0[i];
    }
    std::vector<float> raw((size_t)n_raw * V);
    DLLM__TRY(choose_in_chunks(
        v, sampling, states, raw0, n_chosen,
        [&](int c0, int rows) { return dllm__batch_sampler_spans(c, plan, v, choice0, c0, rows); }, raw.data(),
        choices));
    bch_rows_ += n_chosen;
    for (size_t i = 0; i < plan.size(); i++) {
        if (choice0[i] >= 0) continue;
        dllm__unshift_rows(c, raw.data() + (size_t)raw0[i] * V, v.raw0[i], plan[i].r0, plan[i].r1, logits);
        logits += (size_t)(plan[i].r1 - plan[i].r0) * V;
    }
    return DLLM_OK;
}

/* The rows the step's forward computes (dllm__step_rows) and those that reach the LM head: [truncation] only rows that
 * can hold a candidate reach the final norm, the LM head and the sampler (the block, plus the prompt's masks if it has
 * any). The plain path computes every row, except under a K/V cache, whose forwards skip rows anyway: there every mode
 * truncates, so the LM head has the same rows in every mode and may take the GEMM tuned for them (lm_head). */
dllm__forward_plan dllm__gpu_backend::plan_step(const dllm__decode &st) const {
    const dllm__config &c = m_.cfg;
    dllm__seq_rows r;
    r.seq = (int)st.canvas.size();
    dllm__step_rows(st, c.shift_logits, r.q0, r.q1);
    const bool truncate = st.lacache != DLLM_LACACHE_OFF || st.kv_cache != DLLM_KV_CACHE_NONE;
    const int lm_lo = truncate    ? (st.cand_lo < st.n_prompt ? st.cand_lo : st.block_begin)
                      : r.q0 == 0 ? 0
                                  : st.block_begin;
    const int lm_hi = truncate ? st.block_end : r.q1;
    r.head0 = lm_lo, r.head1 = lm_hi;
    r.out0 = dllm__logit_row(c, lm_lo), r.out1 = dllm__logit_row(c, lm_hi - 1) + 1;
    r.block0 = st.block_begin, r.block1 = st.block_end;
    dllm__forward_plan plan;
    plan.seqs.assign(st.cfg_scale > 0 ? 2 : 1, r);
    const bool layer0_cache = st.lacache == DLLM_LACACHE_ON && st.kv_cache == DLLM_KV_CACHE_NONE;
    plan.layer0 = !layer0_cache ? DLLM__L0_PLAIN : st.step_in_block == 0 ? DLLM__L0_FILL : DLLM__L0_REUSE;
    return plan;
}

/* One denoising step on the device: forward (both CFG halves), LM head (every row as the reference does, or the
 * candidate rows with LaCache), the sampler over the candidate rows, then the commit. With a K/V cache, steps after the
 * block's first forward only the rows dllm__step_rows names. Everything it reads is on the device, so it can be
 * captured once and replayed. */
dllm_status dllm__gpu_backend::run_step(const dllm__decode &st) {
    const dllm__config &c = m_.cfg;
    const int n = (int)st.canvas.size(), batch = st.cfg_scale > 0 ? 2 : 1;
    if (batch == 2)
        DLLM__TRY(K_.make_uncond.launch({dim3((unsigned)(n + 255) / 256), dim3(256)}, stream_, act_.canvas.ptr,
                                        act_.is_prompt.ptr, n, st.mask_id, act_.canvas.as<int>() + n));
    const dllm__forward_plan plan = plan_step(st);
    const dllm__seq_rows &r = plan.rows();
    DLLM__TRY(forward(plan, act_.canvas.as<int>()));
    for (int cp0 = r.head0; cp0 < r.head1; cp0 += dllm__lm_chunk_rows) {
        const int cp1 = std::min(r.head1, cp0 + dllm__lm_chunk_rows);
        const int craw0 = dllm__logit_row(c, cp0), craw1 = dllm__logit_row(c, cp1 - 1) + 1;
        DLLM__TRY(lm_head(batch, r.out_rows(), craw0 - r.out0, craw1 - craw0));
        mark("lm head");
        const int s0 = std::max(cp0, st.cand_lo);
        if (s0 < cp1) DLLM__TRY(sample_rows(st, batch, cp0, craw1 - craw0, s0, cp1));
        mark("sampler");
        if (debug_rows_ && s0 < cp1)
            DLLM__TRY(record_rows(st, batch, cp0, craw1 - craw0, std::max(s0, st.block_begin), cp1));
    }
    const int rule = st.unmask.origin ? 4 : (int)st.unmask.kind;  // select_commit's rule 4: ORIGIN
    DLLM__TRY(S_.select_commit.launch({dim3(1), dim3(1024), (size_t)(n - st.cand_lo) * 5}, stream_, act_.canvas.ptr,
                                      act_.state.ptr, st.cand_lo, st.cand_lo, act_.x0.ptr, act_.conf.ptr,
                                      act_.deferred.ptr, st.mask_id, act_.committed.ptr, rule, st.unmask.threshold,
                                      st.unmask.factor, st.unmask.eps));
    mark("select");
    return DLLM_OK;
}

/* [step graphs] Everything a captured step graph baked in: a different key means a new capture. */
std::string dllm__gpu_backend::graph_key(const dllm__decode &st) const {
    const dllm__sampling &s = st.sampling;
    return dllm__format("%d %d %d %.17g %.9g %llu %d %d %d %d %d %d %d %d %d %.17g %.17g %.17g %.17g %d %d",
                        st.cfg_scale > 0 ? 2 : 1, (int)st.canvas.size(), st.cand_lo, s.temperature,
                        (double)st.cfg_scale, (unsigned long long)s.seed, s.eos_logit_inf, s.defer_eos_eot,
                        (int)s.remasking, s.eos_id, s.eot_id, st.mask_id, st.lacache, (int)st.unmask.kind,
                        st.unmask.threshold, st.unmask.factor, st.unmask.eps, s.alg_temp, (int)st.kv_cache,
                        (int)positions_on_, act_.generation) +
           dllm__format(" %d %.17g %.17g", s.top_k, s.top_p,
                        s.min_p);  // the sampler filters (a graph without them has no cutoff launch)
}

/* Captures run_step as a graph. A new block of the same configuration (may_update) changes only kernel arguments, so the
 * executable graph is updated in place when it can be (cheaper than instantiating again); another configuration has
 * other kernels, so no update is tried. */
dllm_status dllm__gpu_backend::capture_step(const dllm__decode &st, bool may_update) {
    cudaGraph_t graph = nullptr;
    DLLM__CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    dllm_status s = run_step(st);
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (s != DLLM_OK) {
        if (graph) cudaGraphDestroy(graph);
        return s;
    }
    if (e != cudaSuccess) return dllm__cuda_fail(e, "capturing the step graph");
    if (graph_exec_ && may_update) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(graph_exec_, graph, &info) == cudaSuccess) {
            cudaGraphDestroy(graph);
            return DLLM_OK;
        }
        cudaGetLastError();  // refused (the captured kernels differ): instantiate instead
    }
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    graph_exec_ = nullptr;
    e = cudaGraphInstantiate(&graph_exec_, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) return dllm__cuda_fail(e, "instantiating the step graph");
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::step(dllm__decode &st, std::vector<int32_t> &committed, bool want_host) {
    // The first step of a new configuration runs eagerly: cuBLASLt and lazy module loading do their one-time work
    // outside any capture. So does a block's first step when it fills a cache (LaCache's FILL, the K/V cache's full
    // forward): it runs once per block. Graphs that bake in the block (LaCache, K/V caches) are captured per block;
    // the prefix cache's row count changes with the block, so its GEMM shapes are warmed per block too.
    const bool fill = (st.lacache == DLLM_LACACHE_ON || st.kv_cache != DLLM_KV_CACHE_NONE) && st.step_in_block == 0;
    const std::string at_block = dllm__format(" @%d", st.block_begin);
    const std::string config = graph_key(st), shape = config + (st.kv_cache == DLLM_KV_CACHE_PREFIX ? at_block : "");
    const std::string key =
        shape + (st.lacache != DLLM_LACACHE_OFF || st.kv_cache != DLLM_KV_CACHE_NONE ? at_block : "");
    if (dllm__env().no_graphs || fill || shape != warmed_key_) {
        DLLM__TRY(run_step(st));
        if (!fill) warmed_key_ = shape;
    } else {
        if (!graph_exec_ || key != graph_key_) {
            DLLM__TRY(capture_step(st, config == graph_config_));
            graph_key_ = key;
            graph_config_ = config;
        }
        DLLM__CUDA(cudaGraphLaunch(graph_exec_, stream_));
    }
    st.forwards += st.cfg_scale > 0 ? 2 : 1;
    committed.clear();
    const bool rule_needs_count = st.steps_per_block == 0;  // threshold/factor: the block loops until no mask is left
    if (!want_host && !rule_needs_count) return DLLM_OK;
    const int n = (int)st.canvas.size();
    int *host = (int *)host_pinned_;
    if (want_host) {
        DLLM__CUDA(cudaMemcpyAsync(host, act_.canvas.ptr, (size_t)n * 4, cudaMemcpyDeviceToHost, stream_));
        DLLM__CUDA(cudaMemcpyAsync(host + n, act_.committed.ptr, (size_t)n * 4, cudaMemcpyDeviceToHost, stream_));
    }
    dllm_step_state *state = (dllm_step_state *)(host + 2 * n);
    DLLM__CUDA(cudaMemcpyAsync(state, act_.state.ptr, sizeof *state, cudaMemcpyDeviceToHost, stream_));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    st.n_block_left = state->n_block_left;
    if (!want_host) return DLLM_OK;
    memcpy(st.canvas.data(), host, (size_t)n * 4);
    committed.assign(host + n, host + n + state->n_committed);
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::finish(dllm__decode &st) {
    if (st.host_steps) return DLLM_OK;  // the host canvas is current
    DLLM__CUDA(
        cudaMemcpyAsync(st.canvas.data(), act_.canvas.ptr, st.canvas.size() * 4, cudaMemcpyDeviceToHost, stream_));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    return DLLM_OK;
}
