/* tokenizer_files: a Qwen2-style tokenizer directory (vocab.json, merges.txt, tokenizer_config.json and,
 * when the input has them, added_tokens.json and chat_template.jinja), the files cut from the input at
 * each "\n@@\n", through dllm_tokenizer_load. */

static int fuzz_tokenizer_files(const uint8_t *data, size_t n) {
    static const char *names[] = {"vocab.json", "merges.txt", "tokenizer_config.json", "added_tokens.json",
                                  "chat_template.jinja"};
    std::vector<std::string> parts = fuzz_split(data, n, 5);
    for (size_t i = 0; i < 5; i++) {
        if (i < parts.size()) fuzz_write(names[i], parts[i]);
        else fuzz_unlink(names[i]);
    }
    dllm_tokenizer *t = nullptr;
    dllm_status s = dllm_tokenizer_load(fuzz_dir.c_str(), &t);
    if (s != DLLM_OK) {
        FUZZ_CHECK(t == nullptr && (s == DLLM_ERR_FORMAT || s == DLLM_ERR_UNSUPPORTED || s == DLLM_ERR_IO));
        return 0;
    }
    fuzz_probe_tokenizer(t);
    dllm_chat_message msg = {"user", " Hi "};
    size_t len = 0;
    s = dllm_chat_render(t, &msg, 1, 1, nullptr, 0, &len);
    FUZZ_CHECK(dllm_tokenizer_chat_template(t) == DLLM_CHAT_NONE ? s == DLLM_ERR_UNSUPPORTED
                                                                 : s == DLLM_ERR_BUFFER_TOO_SMALL && len > 1);
    dllm_tokenizer_free(t);
    return 0;
}
