/* src/gpu/debug_hooks.cpp - debug hooks for tests and benchmarks. */

// ---------------------------------------------------------------------------------------------------
// 16.5 [debug hooks]: for tests and benchmarks only
// ---------------------------------------------------------------------------------------------------
DLLM__TEST_HOOKS_BEGIN

/* [KV quant] The device's committed cache as the CPU twin holds it: q with the codes, pairs and scales (9c's vectors,
 * sized for committed_.capacity rows), k and v the bf16 rows each commit quantised as fp32 [layer][cap][kvd]
 * (kept since bd_begin under kvq_keep_rows, else zeros). */
dllm_status dllm__gpu_backend::kvq_snapshot(dllm__kvq &q, std::vector<float> &k, std::vector<float> &v) {
    q = kvq_;
    q.reset(committed_.capacity);
    q.group = kvq_.group;
    q.k_pairs.assign((size_t)q.n_layer * q.groups() * q.kvd * 2, 0);
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    DLLM__CUDA(cudaMemcpy(q.k_codes.data(), kv_codes_.k_codes.ptr, q.k_codes.size(), cudaMemcpyDeviceToHost));
    DLLM__CUDA(cudaMemcpy(q.v_codes.data(), kv_codes_.v_codes.ptr, q.v_codes.size(), cudaMemcpyDeviceToHost));
    if (!q.k_pairs.empty())
        DLLM__CUDA(cudaMemcpy(q.k_pairs.data(), kv_codes_.k_pairs.ptr, q.k_pairs.size() * 2, cudaMemcpyDeviceToHost));
    if (q.soloq())
        DLLM__CUDA(cudaMemcpy(q.v_scale.data(), kv_codes_.v_side.ptr, q.v_scale.size() * 4, cudaMemcpyDeviceToHost));
    else
        DLLM__CUDA(cudaMemcpy(q.v_pairs.data(), kv_codes_.v_side.ptr, q.v_pairs.size() * 2, cudaMemcpyDeviceToHost));
    const size_t rows = (size_t)q.n_layer * committed_.capacity;
    k.assign(rows * q.kvd, 0.0f), v.assign(rows * q.kvd, 0.0f);
    for (size_t r = 0; r < rows && kv_codes_.kept.size() == rows * 2 * q.kvd; r++)
        for (int e = 0; e < q.kvd; e++) {
            k[r * q.kvd + e] = dllm__bf16_to_f32(kv_codes_.kept[r * 2 * q.kvd + e]);
            v[r * q.kvd + e] = dllm__bf16_to_f32(kv_codes_.kept[r * 2 * q.kvd + q.kvd + e]);
        }
    return DLLM_OK;
}

/* [KV quant] kvq_keep_rows: layer `layer`'s rows [row0, row0 + T) of a commit, from kv_codes_.fresh into kv_codes_.kept
 * (the next layer overwrites them; commits are never captured, so this copy may wait). */
dllm_status dllm__gpu_backend::kvq_keep(size_t layer, int row0, int T) {
    const size_t row_elems = (size_t)2 * kvq_.kvd;
    if (kv_codes_.kept.size() != (size_t)kvq_.n_layer * committed_.capacity * row_elems)
        return dllm__fail(DLLM_ERR_INTERNAL, "kvq_keep_rows was set after bd_begin: no rows kept for this generation");
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    DLLM__CUDA(cudaMemcpy(&kv_codes_.kept[(layer * committed_.capacity + (size_t)row0) * row_elems],
                          kv_codes_.fresh.ptr, (size_t)T * row_elems * 2, cudaMemcpyDeviceToHost));
    return DLLM_OK;
}

/* Per-stage timing of the forward (benchmarks): an event after each stage, named. */
struct dllm__stage_timer {
    std::vector<std::pair<std::string, cudaEvent_t>> marks;
    ~dllm__stage_timer() {
        for (auto &m : marks) cudaEventDestroy(m.second);
    }
    void mark(const char *name, cudaStream_t s) {
        cudaEvent_t e;
        if (cudaEventCreate(&e) != cudaSuccess) return;
        cudaEventRecord(e, s);
        marks.push_back({name, e});
    }
    /* Milliseconds per stage name, summed over repeats (call after synchronising). */
    DLLM__TEST_HOOK std::vector<std::pair<std::string, double>> totals() const {
        std::vector<std::pair<std::string, double>> out;
        for (size_t i = 1; i < marks.size(); i++) {
            float ms = 0;
            cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second);
            auto it = std::find_if(out.begin(), out.end(),
                                   [&](const std::pair<std::string, double> &p) { return p.first == marks[i].first; });
            if (it == out.end())
                out.push_back({marks[i].first, ms});
            else
                it->second += ms;
        }
        return out;
    }
};

void dllm__gpu_backend::mark(const char *stage) {
    if (debug_.timer) debug_.timer->mark(stage, stream_);
}

/* Benchmarks: one eager step with every stage timed. */
dllm_status dllm__gpu_backend::profile_step(const dllm__decode &st, dllm__stage_timer &t) {
    debug_.timer = &t;
    dllm_status s = run_step(st);
    debug_.timer = nullptr;
    return s;
}

/* Tests (set_debug_rows): the logits the sampler sees at each (global step, block position), cond then uncond rows
 * (eager steps only: set no_graphs). */
dllm_status dllm__gpu_backend::record_rows(const dllm__decode &st, int batch, int cp0, int raw_rows, int s0, int s1) {
    const dllm__config &c = model_.cfg;
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    for (int p = s0; p < s1; p++) {
        std::vector<float> &row = (*debug_.rows)[{st.global_step, p}];
        row.resize((size_t)batch * c.n_vocab);
        for (int b = 0; b < batch; b++) {
            size_t lr = (size_t)b * raw_rows + (size_t)(dllm__logit_row(c, p) - dllm__logit_row(c, cp0));
            DLLM__CUDA(cudaMemcpy(row.data() + (size_t)b * c.n_vocab, act_.logits.as<float>() + lr * c.n_vocab,
                                  (size_t)c.n_vocab * 4, cudaMemcpyDeviceToHost));
        }
    }
    return DLLM_OK;
}

DLLM__TEST_HOOKS_END
