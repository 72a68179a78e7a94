/* decode: arbitrary bytes as int32 ids through dllm_detokenize (first byte: tokenizer, skip_special).
 * Mostly ids of the vocabulary, some just outside it: a bad id is DLLM_ERR_INVALID_ARGUMENT, anything
 * else decodes to valid UTF-8, which encodes again into the tokenizer's ids. */

static void fuzz_decode_init() { fuzz_tokenizers_init(); }

static int fuzz_decode(const uint8_t *data, size_t n) {
    if (n == 0) return 0;
    const fuzz_tokenizer &f = fuzz_toks[data[0] % fuzz_toks.size()];
    const int skip = (int)(data[0] / fuzz_toks.size()) & 1;
    const int n_vocab = dllm_tokenizer_n_vocab(f.tok);
    std::vector<int32_t> ids;
    bool valid = true;
    for (size_t i = 1; i + 4 <= n; i += 4) {
        uint32_t raw;
        memcpy(&raw, data + i, 4);
        int32_t id =
            raw >> 31 ? (int32_t)raw : (int32_t)(raw % (uint32_t)(n_vocab + 2)) - 1;  // [-1, n_vocab], or very negative
        valid = valid && id >= 0 && id < n_vocab && f.tok->has_token[(size_t)id];
        ids.push_back(id);
    }
    if (!valid) {
        size_t len = 1;
        FUZZ_CHECK(dllm_detokenize(f.tok, ids.data(), (int)ids.size(), skip, nullptr, 0, &len) ==
                       DLLM_ERR_INVALID_ARGUMENT &&
                   len == 0);
        return 0;
    }
    std::string text = fuzz_detokenize(f.tok, ids, skip);
    for (int32_t id : fuzz_tokenize(f.tok, text.data(), text.size(), 1)) FUZZ_CHECK(id >= 0 && id < n_vocab);
    return 0;
}
