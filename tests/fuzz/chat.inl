/* chat: conversations through dllm_chat_render with the LLaDA and the ChatML templates. The input's
 * first byte picks the tokenizer and add_assistant; the rest, cut at NUL bytes, alternates role and
 * content (a role's first byte picks system, user, assistant or itself as an unknown role). An
 * accepted conversation renders to text that holds each content and tokenizes with special tokens. */

static std::vector<const fuzz_tokenizer *> fuzz_chat_toks;

static void fuzz_chat_init() {
    fuzz_tokenizers_init();
    for (const fuzz_tokenizer &f : fuzz_toks)
        if (dllm_tokenizer_chat_template(f.tok) != DLLM_CHAT_NONE) fuzz_chat_toks.push_back(&f);
    if (fuzz_chat_toks.size() < 2) {
        fprintf(stderr, "dllm-fuzz: chat: expected tokenizers with both chat templates\n");
        exit(1);
    }
}

static int fuzz_chat(const uint8_t *data, size_t n) {
    if (n == 0) return 0;
    const fuzz_tokenizer &f = *fuzz_chat_toks[data[0] % fuzz_chat_toks.size()];
    const int add_assistant = (int)(data[0] / fuzz_chat_toks.size()) & 1;
    std::vector<std::string> fields;
    std::string rest((const char *)data + 1, n - 1);
    for (size_t pos = 0; pos <= rest.size();) {
        size_t nul = rest.find('\0', pos);
        if (nul == std::string::npos) nul = rest.size();
        fields.push_back(rest.substr(pos, nul - pos));
        pos = nul + 1;
    }
    static const char *roles[] = {"system", "user", "assistant"};
    std::vector<dllm_chat_message> msgs;
    bool valid = true;
    for (size_t i = 0; i + 1 < fields.size(); i += 2) {
        const std::string &r = fields[i];
        int pick = r.empty() ? 1 : (unsigned char)r[0] % 4;
        valid = valid && (pick < 3 || r == "system" || r == "user" || r == "assistant");
        msgs.push_back({pick < 3 ? roles[pick] : r.c_str(), fields[i + 1].c_str()});
    }
    valid = valid && !msgs.empty();
    size_t len = 0;
    dllm_status s = dllm_chat_render(f.tok, msgs.data(), (int)msgs.size(), add_assistant, nullptr, 0, &len);
    if (!valid) {
        FUZZ_CHECK(s == DLLM_ERR_INVALID_ARGUMENT);
        return 0;
    }
    FUZZ_CHECK(s == DLLM_ERR_BUFFER_TOO_SMALL && len > 1);
    std::string text(len, '\x7f');
    FUZZ_CHECK(dllm_chat_render(f.tok, msgs.data(), (int)msgs.size(), add_assistant, &text[0], len, &len) == DLLM_OK &&
               len == text.size());
    text.pop_back();
    const bool chatml = dllm_tokenizer_chat_template(f.tok) == DLLM_CHAT_CHATML;
    for (const dllm_chat_message &m : msgs)
        FUZZ_CHECK(text.find(chatml ? std::string(m.content) : dllm__jinja_trim(m.content)) != std::string::npos);
    std::vector<int32_t> ids = fuzz_tokenize(f.tok, text.data(), text.size(), 1);
    FUZZ_CHECK(!ids.empty());
    return 0;
}
