/* src/gpu/step.cpp - the denoising step and its CUDA graph. */

// ---- 16.4.2 The denoising step --------------------------------------------------------------------

/* First position that can be a candidate: a [MASK] inside the prompt competes too (reference semantics). */
static int dllm__first_candidate(const dllm__decode &st) {
    for (int p = 0; p < st.n_prompt; p++)
        if (st.canvas[(size_t)p] == st.mask_id) return p;
    return st.n_prompt;
}

dllm_status dllm__gpu_backend::begin(dllm__decode &st) {
    if (st.host_steps)
        return DLLM_OK;  // a batched item: its canvas lives on the host, its forwards are forward_batch's
    const int n = (int)st.canvas.size(), batch = st.cfg_scale > 0 ? 2 : 1;
    kv_on_ = st.kv_cache != DLLM_KV_CACHE_NONE;
    DLLM__TRY(
        fit_buffers(batch, n, std::min(n, dllm__lm_chunk_rows), st.lacache == DLLM_LACACHE_ON && !kv_on_, kv_on_));
    positions_on_ = !st.positions.empty();
    if (positions_on_)
        DLLM__CUDA(
            cudaMemcpyAsync(act_.positions.ptr, st.positions.data(), (size_t)n * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(act_.canvas.ptr, st.canvas.data(), (size_t)n * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(act_.is_prompt.ptr, st.is_prompt.data(), (size_t)n, cudaMemcpyHostToDevice, stream_));
    dllm_step_state init = {};
    init.global_step = st.global_step;
    DLLM__CUDA(cudaMemcpyAsync(act_.state.ptr, &init, sizeof init, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaStreamSynchronize(stream_));  // the host arrays may go out of scope
    st.cand_lo = dllm__first_candidate(st);
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::begin_block(dllm__decode &st) {
    if (st.host_steps) {  // what the host step (dllm__step_begin) reads, as the CPU backend sets it
        st.n_block_masks = dllm__count_masks(st, st.block_begin, st.block_end);
        return DLLM_OK;
    }
    return kernels_.rowwise.block_begin.launch({dim3(1), dim3(256)}, stream_, act_.state.ptr, act_.canvas.ptr,
                                               st.block_begin, st.block_end, st.steps_per_block, st.mask_id);
}

/* The sampler's arguments that come from dllm__sampling (the rest say which logits rows it reads). With the filters off
 * the sampler runs exactly as before they existed: no cutoff launch, no per-logit test. */
static void dllm__sampler_fill(sampler_args &a, const dllm__sampling &s) {
    a.temperature = s.temperature, a.seed = s.seed;
    a.eos_inf = s.eos_logit_inf, a.eos_id = s.eos_id, a.eot_id = s.eot_id, a.defer_eos_eot = s.defer_eos_eot;
    a.remasking = (int)s.remasking, a.conf_tempered = s.tempered_conf, a.alg_temp = s.alg_temp;
    a.top_k = s.top_k, a.top_p = (float)s.top_p, a.min_p = (float)s.min_p, a.cutoff = nullptr;
}

/* Samples positions [s0, s1) from the LM head chunk that starts at position cp0 (raw_rows logits rows per batch entry).
 * x0/conf/deferred are indexed by position - cand_lo. */
/* The sampler's arguments over n_rows rows of the LM-head chunk in act_.logits (raw_rows rows) with sampling s: row r
 * is canvas position pos0 + r, reading logits row (shift0 ? max(r - 1, 0) : r) + lrow0; no CFG (sample_rows adds it).
 * The solo step, block diffusion's step (bd_sampler_args) and the batched step (sample_span) all fill them here. */
sampler_args dllm__gpu_backend::sampler_over(const dllm__sampling &s, int n_rows, int pos0, int lrow0, int shift0,
                                             int raw_rows) const {
    const dllm__config &c = model_.cfg;
    sampler_args a = {};
    a.cond = act_.logits.as<float>(), a.uncond = nullptr, a.cfg_weight = 1.0f;
    a.vocab = c.n_vocab, a.slice = dllm__vocab_slice,
    a.n_slices = (c.n_vocab + dllm__vocab_slice - 1) / dllm__vocab_slice, a.n_rows = n_rows;
    a.pos0 = pos0, a.lrow0 = lrow0, a.shift0 = shift0, a.raw_rows = raw_rows;
    dllm__sampler_fill(a, s);
    if (s.filters()) a.cutoff = act_.cutoff.as<float>();
    return a;
}

dllm_status dllm__gpu_backend::sample_rows(const dllm__decode &st, int batch, int cp0, int raw_rows, int s0, int s1) {
    const dllm__config &c = model_.cfg;
    const int off = s0 - st.cand_lo;
    sampler_args a = sampler_over(st.sampling, s1 - s0, s0, dllm__logit_row(c, s0) - dllm__logit_row(c, cp0),
                                  c.shift_logits && s0 == 0, raw_rows);
    a.uncond = batch == 2 ? act_.logits.as<float>() + (size_t)raw_rows * c.n_vocab : nullptr;
    a.cfg_weight = st.cfg_scale + 1.0f;
    return launch_sampler(a, act_.x0.as<int>() + off, act_.conf.as<double>() + off,
                          act_.deferred.as<unsigned char>() + off);
}

/* The sampler's launches over a.n_rows rows (the filters' cutoff first where they are on), reading act_.state's
 * step. */
dllm_status dllm__gpu_backend::launch_sampler(const sampler_args &a, int *x0, double *conf, unsigned char *deferred,
                                              const dllm_step_state *state) {
    const unsigned rows = (unsigned)a.n_rows;
    if (!state) state = act_.state.as<dllm_step_state>();  // [batch] batch_choose: each sequence's own
    if (a.cutoff)
        DLLM__TRY(kernels_.sampler.row_cutoff_kernel.launch({dim3(rows), dim3(256)}, stream_, a, act_.cutoff.ptr));
    DLLM__TRY(kernels_.sampler.conf_partial_kernel.launch({dim3((unsigned)a.n_slices, rows), dim3(256)}, stream_, a,
                                                          state, act_.partials.ptr));
    return kernels_.sampler.conf_combine_kernel.launch({dim3((rows + 127) / 128), dim3(128)}, stream_, a, state,
                                                       act_.partials.ptr, x0, conf, deferred);
}

/* The rows the step's forward computes (dllm__step_rows) and those that reach the LM head: [truncation] only rows that
 * can hold a candidate reach the final norm, the LM head and the sampler (the block, plus the prompt's masks if it has
 * any). The plain path computes every row, except under a K/V cache, whose forwards skip rows anyway: there every mode
 * truncates, so the LM head has the same rows in every mode and may take the GEMM tuned for them (lm_head). */
dllm__forward_plan dllm__gpu_backend::plan_step(const dllm__decode &st) const {
    const dllm__config &c = model_.cfg;
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
    const dllm__config &c = model_.cfg;
    const int n = (int)st.canvas.size(), batch = st.cfg_scale > 0 ? 2 : 1;
    if (batch == 2)
        DLLM__TRY(kernels_.rowwise.make_uncond.launch({dim3((unsigned)(n + 255) / 256), dim3(256)}, stream_,
                                                      act_.canvas.ptr, act_.is_prompt.ptr, n, st.mask_id,
                                                      act_.canvas.as<int>() + n));
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
        if (debug_.rows && s0 < cp1)
            DLLM__TRY(record_rows(st, batch, cp0, craw1 - craw0, std::max(s0, st.block_begin), cp1));
    }
    const int rule = st.unmask.origin ? 4 : (int)st.unmask.kind;  // select_commit's rule 4: ORIGIN
    DLLM__TRY(kernels_.sampler.select_commit.launch(
        {dim3(1), dim3(1024), (size_t)(n - st.cand_lo) * 5}, stream_, act_.canvas.ptr, act_.state.ptr, st.cand_lo,
        st.cand_lo, act_.x0.ptr, act_.conf.ptr, act_.deferred.ptr, st.mask_id, act_.committed.ptr, rule,
        st.unmask.threshold, st.unmask.factor, st.unmask.eps));
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

/* Captures run_step as a graph. A new block of the same configuration (may_update) changes only kernel arguments, so
 * the executable graph is updated in place when it can be (cheaper than instantiating again); another configuration has
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
    if (graphs_.step_exec && may_update) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(graphs_.step_exec, graph, &info) == cudaSuccess) {
            cudaGraphDestroy(graph);
            return DLLM_OK;
        }
        cudaGetLastError();  // refused (the captured kernels differ): instantiate instead
    }
    if (graphs_.step_exec) cudaGraphExecDestroy(graphs_.step_exec);
    graphs_.step_exec = nullptr;
    e = cudaGraphInstantiate(&graphs_.step_exec, graph, 0);
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
    if (dllm__env().no_graphs || fill || shape != graphs_.warmed_key) {
        DLLM__TRY(run_step(st));
        if (!fill) graphs_.warmed_key = shape;
    } else {
        if (!graphs_.step_exec || key != graphs_.step_key) {
            DLLM__TRY(capture_step(st, config == graphs_.step_config));
            graphs_.step_key = key;
            graphs_.step_config = config;
        }
        DLLM__CUDA(cudaGraphLaunch(graphs_.step_exec, stream_));
    }
    st.forwards += st.cfg_scale > 0 ? 2 : 1;
    committed.clear();
    const bool rule_needs_count = st.steps_per_block == 0;  // threshold/factor: the block loops until no mask is left
    if (!want_host && !rule_needs_count) return DLLM_OK;
    const int n = (int)st.canvas.size();
    int *host = (int *)host_pinned_.ptr;
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
