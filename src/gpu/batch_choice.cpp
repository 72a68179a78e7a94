/* src/gpu/batch_choice.cpp - the token choice of a batched step on the device. */

// ---- [batch] The token choice of a batched step on the device ----------------------------------------------------
// A batched step's logits (126k fp32 a row at LLaDA's vocabulary: 260 MB for 16 sequences of 32 rows, ~13 ms over PCIe)
// stay on the device: after each LM-head chunk the solo step's sampler (dllm__sampler_fill, launch_sampler) runs over
// the chunk's rows of each sequence with that sequence's own parameters and step, and 13 bytes a row reach the host.
// The sequences whose choice the host makes (CFG's two canvases, combined there) get their logits as forward_batch
// gives them. At batch 16 of the dual-cache step (LLaDA-8B shape, H200) the choice costs 0.1 ms of a 19.5 ms step;
// copying the logits to the host instead took 196 ms.

dllm_status dllm__gpu_backend::forward_batch_choose(const std::vector<dllm__batch_seq> &plan, bool kv, float *logits,
                                                    dllm__choice *choices) {
    if (const char *why = kv ? batch_kv_unsupported() : batch_unsupported())
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched %s %s",
                          kv ? "K/V-cache step" : "forward", why);
    if (plan.empty()) return DLLM_OK;
    if (kv && !batch_.kv.ptr) return dllm__fail(DLLM_ERR_INTERNAL, "a batched K/V-cache step before batch_kv_reserve");
    dllm__varlen_layout v;
    DLLM__TRY(kv ? kv_layout(plan, v) : dllm__varlen_layout_of(model_.cfg, plan, max_tokens_, v));
    return batch_choose(plan, v, logits, choices);
}

/* The sampler over one span of the LM-head chunk in act_.logits (raw_rows rows), with its sequence's parameters and
 * step state (batch_.choice_state), its choices into batch_.choice_x0/batch_.choice_conf/batch_.choice_deferred at
 * span.out. */
dllm_status dllm__gpu_backend::sample_span(const dllm__sampling &s, const dllm__sampler_span &span, int raw_rows) {
    const sampler_args a = sampler_over(s, span.n, span.pos0, span.lrow0, span.shift0, raw_rows);
    return launch_sampler(a, batch_.choice_x0.as<int>() + span.out, batch_.choice_conf.as<double>() + span.out,
                          batch_.choice_deferred.as<unsigned char>() + span.out,
                          batch_.choice_state.as<dllm_step_state>() + span.seq);
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
    const size_t V = (size_t)model_.cfg.n_vocab;
    // One launch samples at most a chunk's rows and one more: under the shift, positions 0 and 1 both read row 0.
    DLLM__TRY(fit_buffers(1, v.rows + 1, std::min(v.out_rows, dllm__lm_chunk_rows) + 1));
    const size_t n = (size_t)std::max(1, n_chosen);
    DLLM__TRY(batch_.choice_state.fit(states.size() * sizeof(dllm_step_state), "the batch's step states"));
    DLLM__TRY(batch_.choice_x0.fit(n * 4, "sampler output"));
    DLLM__TRY(batch_.choice_conf.fit(n * 8, "sampler output"));
    DLLM__TRY(batch_.choice_deferred.fit(n, "sampler output"));
    DLLM__CUDA(cudaMemcpyAsync(batch_.choice_state.ptr, states.data(), states.size() * sizeof(dllm_step_state),
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
    return choices_to_host(batch_.choice_x0, batch_.choice_conf, batch_.choice_deferred, n_chosen,
                           choices);  // also waits for the logits above
}

/* The device's choice of a batched step (choose_in_chunks): the sequences with sampling parameters at their own step;
 * the others' (CFG's) logits to the host, unshifted into `logits` one sequence after another. */
dllm_status dllm__gpu_backend::batch_choose(const std::vector<dllm__batch_seq> &plan, const dllm__varlen_layout &v,
                                            float *logits, dllm__choice *choices) {
    const dllm__config &c = model_.cfg;
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
    batch_.rows_chosen += n_chosen;
    for (size_t i = 0; i < plan.size(); i++) {
        if (choice0[i] >= 0) continue;
        dllm__unshift_rows(c, raw.data() + (size_t)raw0[i] * V, v.raw0[i], plan[i].r0, plan[i].r1, logits);
        logits += (size_t)(plan[i].r1 - plan[i].r0) * V;
    }
    return DLLM_OK;
}
