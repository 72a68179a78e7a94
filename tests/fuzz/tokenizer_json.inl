/* tokenizer_json: arbitrary bytes as a directory's tokenizer.json, through dllm_tokenizer_load. A loaded
 * tokenizer must encode and decode probe texts into ids it owns and valid UTF-8. */

static void fuzz_probe_tokenizer(const dllm_tokenizer *t) {
    static const char *probes[] = {"Hello world, it's 2024!\n",
                                   "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80 \xFF",
                                   "<|im_start|>user\n<|eot_id|>  <s></s>[MASK]", "   \t\r\n 'S 'll 123456"};
    const int n_vocab = dllm_tokenizer_n_vocab(t);
    FUZZ_CHECK(n_vocab > 0);
    for (const char *p : probes)
        for (int special = 0; special < 2; special++) {
            std::vector<int32_t> ids;
            dllm__tokenize(*t, p, strlen(p), special != 0, ids);
            for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < n_vocab && t->has_token[(size_t)id]);
            std::string text;
            FUZZ_CHECK(dllm__detokenize(*t, ids.data(), (int)ids.size(), special != 0, text) == DLLM_OK);
            FUZZ_CHECK(fuzz_valid_utf8(text));
        }
}

static int fuzz_tokenizer_json(const uint8_t *data, size_t n) {
    fuzz_write("tokenizer.json", data, n);
    dllm_tokenizer *t = nullptr;
    dllm_status s = dllm_tokenizer_load(fuzz_dir.c_str(), &t);
    if (s != DLLM_OK) {
        FUZZ_CHECK(t == nullptr && (s == DLLM_ERR_FORMAT || s == DLLM_ERR_UNSUPPORTED) &&
                   strstr(dllm_last_error(), "tokenizer.json"));
        return 0;
    }
    fuzz_probe_tokenizer(t);
    FUZZ_CHECK(dllm_tokenizer_chat_template(t) == DLLM_CHAT_NONE);
    dllm_tokenizer_free(t);
    return 0;
}
