/* src/gpu/block_diffusion.cpp - block diffusion on the GPU: the committed K/V cache and its forward. */

// ---- 16.4.3 [block diffusion] (Fast-dLLM v2, Nemotron) --------------------------------------------------
// The GPU twin of dllm__cpu_bd_forward (section 9; block-diffusion.md): one forward of the block-diffusion schedule
// over call.T rows against the committed K/V cache, with the same stages as the plain forward (the GEMM entry point,
// so every weight format works) and flash_attn under its block-causal mask. K|V rows of the committed blocks stay on
// the device for the whole generation; the forward's fresh K|V rows are written right after them, so its attention
// reads one contiguous key range (cache ++ fresh, or cache ++ block cache), and a commit only advances committed_.n.
// Under kv_quant the committed rows are codes and the fresh rows have a buffer of their own (gpu/kv_quant.cpp). The raw
// logits of rows [r0, r1) are copied to the host: the decode loop (section 17) runs there.

/* A generation starts: the committed cache is emptied and sized for `rows` rows (grown, never shrunk): bf16 rows, or
 * under kv_quant their codes (kvq_begin). */
dllm_status dllm__gpu_backend::bd_begin(int rows) {
    const dllm__config &c = model_.cfg;
    const size_t row_bytes = (size_t)4 * c.n_head_kv * c.head_dim;  // K|V, bf16
    if (!kvq_.enabled())
        DLLM__TRY(
            committed_.kv.fit(weights_->layers.size() * (size_t)rows * row_bytes, "the block-diffusion K/V cache"));
    DLLM__TRY(committed_.partial.fit(dllm__attn_partial_bound(arch_, c.head_dim, n_sms_), "split-KV attention states"));
    DLLM__TRY(load_kv_scatter());  // bd_attention's copy of the fresh rows
    committed_.n = 0, committed_.capacity = rows, committed_.block_rows = 0;
    facache_.n = -1, facache_.rows_seen = facache_.rows_reused = 0;
    return kvq_.enabled() ? kvq_begin(rows) : DLLM_OK;
}

/* The device's free memory and the committed cache's own (bd_begin refits it) at dllm__kvq_bytes_per_token a row, the
 * sinks' bf16 rows set aside under kv_quant. */
dllm_status dllm__gpu_backend::bd_rows_that_fit(int group, int64_t &rows) const {
    size_t free_bytes = 0, total_bytes = 0;
    DLLM__CUDA(cudaSetDevice(device_));
    DLLM__CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
    const double sinks = kvq_.enabled() ? (double)kvq_.n_layer * kvq_.n_sink * 4 * kvq_.kvd : 0.0;
    const double room = (double)free_bytes + (double)bd_committed_bytes() - sinks;
    rows = (int64_t)std::max(0.0, room / dllm__kvq_bytes_per_token(model_.cfg, kvq_.mode, group));
    return DLLM_OK;
}
