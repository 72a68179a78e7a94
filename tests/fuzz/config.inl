/* config: config.json text through dllm__json_parse and dllm__config_parse. An accepted config has the
 * invariants the forward relies on, and its expected weight list is built (shapes in int64). */

static int fuzz_config(const uint8_t *data, size_t n) {
    dllm__json root;
    if (dllm__json_parse((const char *)data, n, "config.json", root) != DLLM_OK) return 0;
    dllm__config c;
    dllm_status s = dllm__config_parse(root, "config.json", c);
    if (s != DLLM_OK) {
        FUZZ_CHECK((s == DLLM_ERR_FORMAT || s == DLLM_ERR_UNSUPPORTED) && strstr(dllm_last_error(), "config.json"));
        return 0;
    }
    FUZZ_CHECK(c.n_embd > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_head_kv > 0 && c.n_ff > 0 && c.max_seq_len > 0);
    // Nemotron's head_dim is its own key (q heads need not span the hidden size); Fast-dLLM v2 names its mask in the
    // tokenizer files (dllm__find_block_tokens), so the config alone leaves it -1.
    FUZZ_CHECK(c.n_head % c.n_head_kv == 0 && c.head_dim > 0 && c.head_dim % 2 == 0 &&
               (c.head_dim * c.n_head == c.n_embd || c.family == DLLM_FAMILY_NEMOTRON_DIFFUSION));
    FUZZ_CHECK(c.n_vocab >= c.vocab_size && c.vocab_size > 0 && c.mask_id < c.n_vocab &&
               (c.mask_id >= 0 || c.family == DLLM_FAMILY_FAST_DLLM_V2));
    FUZZ_CHECK(std::isfinite(c.norm_eps) && c.rope_theta >= 1.0f);
    if ((int64_t)c.n_layer * c.n_embd > ((int64_t)1 << 20))
        return 0;  // the weight list of a huge model is slow, not interesting
    std::vector<dllm__wspec> w = dllm__expected_weights(c);
    FUZZ_CHECK(w.size() >= (size_t)c.n_layer * 9 + 2);
    for (const dllm__wspec &spec : w)
        for (int64_t d : spec.shape) FUZZ_CHECK(d > 0);
    return 0;
}
