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
    return K_.block_begin.launch({dim3(1), dim3(256)}, stream_, act_.state.ptr, act_.canvas.ptr, st.block_begin,
                                 st.block_end, st.steps_per_block, st.mask_id);
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
/* The sampler's arguments over n_rows rows of the LM-head chunk in act_.logits (raw_rows rows) with sampling s: row r is
 * canvas position pos0 + r, reading logits row (shift0 ? max(r - 1, 0) : r) + lrow0; no CFG (sample_rows adds it). The
 * solo step, block diffusion's step (bd_sampler_args) and the batched step (sample_span) all fill them here. */
sampler_args dllm__gpu_backend::sampler_over(const dllm__sampling &s, int n_rows, int pos0, int lrow0, int shift0,
                                             int raw_rows) const {
    const dllm__config &c = m_.cfg;
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
    const dllm__config &c = m_.cfg;
    const int off = s0 - st.cand_lo;
    sampler_args a = sampler_over(st.sampling, s1 - s0, s0, dllm__logit_row(c, s0) - dllm__logit_row(c, cp0),
                                  c.shift_logits && s0 == 0, raw_rows);
    a.uncond = batch == 2 ? act_.logits.as<float>() + (size_t)raw_rows * c.n_vocab : nullptr;
    a.cfg_weight = st.cfg_scale + 1.0f;
    return launch_sampler(a, act_.x0.as<int>() + off, act_.conf.as<double>() + off,
                          act_.deferred.as<unsigned char>() + off);
}

/* The sampler's launches over a.n_rows rows (the filters' cutoff first where they are on), reading act_.state's step. */
dllm_status dllm__gpu_backend::launch_sampler(const sampler_args &a, int *x0, double *conf, unsigned char *deferred,
                                              const dllm_step_state *state) {
    const unsigned rows = (unsigned)a.n_rows;
    if (!state) state = act_.state.as<dllm_step_state>();  // [batch] batch_choose: each sequence's own
    if (a.cutoff) DLLM__TRY(S_.row_cutoff_kernel.launch({dim3(rows), dim3(256)}, stream_, a, act_.cutoff.ptr));
    DLLM__TRY(S_.conf_partial_kernel.launch({dim3((unsigned)a.n_slices, rows), dim3(256)}, stream_, a, state,
                                            act_.partials.ptr));
    return S_.conf_combine_kernel.launch({dim3((rows + 127) / 128), dim3(128)}, stream_, a, state, act_.partials.ptr,
                                         x0, conf, deferred);
}
