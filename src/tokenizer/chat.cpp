/* src/tokenizer/chat.cpp - chat templates: detection and rendering of the known Jinja templates. */

// ---- Chat templates -----------------------------------------------------------------------------------
// Detected by markers of the known Jinja templates (tokenizer_config.json "chat_template", or
// chat_template.jinja, which transformers prefers); a template without them gets DLLM_CHAT_NONE.

static dllm_chat_template dllm__chat_detect(const std::string &tpl) {
    auto has = [&](const char *s) { return tpl.find(s) != std::string::npos; };
    if (has("<|start_header_id|>") && has("<|eot_id|>") && has("bos_token") && has("| trim")) return DLLM_CHAT_LLADA;
    if (has("<|im_start|>") && has("<|im_end|>") && has("You are a helpful assistant.")) return DLLM_CHAT_CHATML;
    return DLLM_CHAT_NONE;
}

/* The chat template text: chat_template.jinja, else tokenizer_config.json's (a string, or a list of
 * {name, template} whose "default" entry is used). */
static dllm_status dllm__tok_chat_config(dllm_tokenizer &t, const dllm__json &config, const std::string &config_path) {
    std::string tpl, jinja = dllm__join_path(t.dir, "chat_template.jinja");
    const dllm__json *ct = config.find("chat_template"), *bos = config.find("bos_token");
    if (dllm__file_exists(jinja)) {
        DLLM__TRY(dllm__read_text(jinja, tpl));
    } else if (ct && ct->kind == dllm__json::STR) {
        tpl = ct->str;
    } else if (ct && ct->kind == dllm__json::ARR) {
        for (const dllm__json &e : ct->items) {
            const dllm__json *name = e.find("name"), *text = e.find("template");
            if (name && name->kind == dllm__json::STR && name->str == "default" && text &&
                text->kind == dllm__json::STR)
                tpl = text->str;
        }
    } else if (ct && !ct->is_null()) {
        return dllm__fail(DLLM_ERR_FORMAT, "%s: \"chat_template\" must be a string or a list of {name, template}",
                          config_path.c_str());
    }
    t.chat = dllm__chat_detect(tpl);
    if (bos && bos->kind == dllm__json::OBJ) bos = bos->find("content");
    if (bos && bos->kind == dllm__json::STR) t.bos_token = bos->str;
    if (t.chat == DLLM_CHAT_LLADA && t.bos_token.empty())
        return dllm__fail(DLLM_ERR_FORMAT, "%s: the LLaDA chat template needs \"bos_token\", which is missing",
                          config_path.c_str());
    if (!tpl.empty() && t.chat == DLLM_CHAT_NONE)
        dllm__log(DLLM_LOG_INFO, "%s: chat template not recognised; prompts are used as given", t.dir.c_str());
    return DLLM_OK;
}

/* Jinja's trim filter is Python's str.strip(): Unicode White_Space plus U+001C..U+001F. */
static std::string dllm__jinja_trim(const std::string &s) {
    std::vector<uint32_t> c;
    dllm__utf8_decode(s, c);
    auto ws = [](uint32_t cp) { return dllm__is_space(cp) || (cp >= 0x1C && cp <= 0x1F); };
    size_t b = 0, e = c.size();
    while (b < e && ws(c[b])) b++;
    while (e > b && ws(c[e - 1])) e--;
    return dllm__utf8_encode(c.data() + b, e - b);
}

static dllm_status dllm__chat_render(const dllm_tokenizer &t, const dllm_chat_message *msgs, int n, bool add_assistant,
                                     std::string &out) {
    if (t.chat == DLLM_CHAT_NONE)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: no known chat template for this tokenizer", t.dir.c_str());
    if (!msgs || n <= 0) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "a conversation needs at least one message");
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        if (!role || !msgs[i].content)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "message %d has a NULL role or content", i);
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant"))
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "message %d has role \"%s\"; roles are system, user and assistant", i, role);
    }
    out.clear();
    if (t.chat == DLLM_CHAT_LLADA) {  // every turn trimmed and closed by <|eot_id|>; BOS before the first
        for (int i = 0; i < n; i++)
            out += (i == 0 ? t.bos_token : "") + "<|start_header_id|>" + msgs[i].role + "<|end_header_id|>\n\n" +
                   dllm__jinja_trim(msgs[i].content) + "<|eot_id|>";
        out +=
            "<|start_header_id|>assistant<|end_header_id|>\n\n";  // the template appends it whatever add_assistant says
        return DLLM_OK;
    }
    // Qwen2.5 ChatML: a system turn always comes first, the default one if the conversation has none.
    bool has_system = strcmp(msgs[0].role, "system") == 0;
    out = std::string("<|im_start|>system\n") + (has_system ? msgs[0].content : "You are a helpful assistant.") +
          "<|im_end|>\n";
    for (int i = has_system ? 1 : 0; i < n; i++)
        out += std::string("<|im_start|>") + msgs[i].role + "\n" + msgs[i].content + "<|im_end|>\n";
    if (add_assistant) out += "<|im_start|>assistant\n";
    return DLLM_OK;
}

static dllm_status dllm__tok_load(const std::string &dir, std::unique_ptr<dllm_tokenizer> &out) {
    std::unique_ptr<dllm_tokenizer> t(new dllm_tokenizer);
    t->dir = dir;
    std::string json_path = dllm__join_path(dir, "tokenizer.json"),
                config_path = dllm__join_path(dir, "tokenizer_config.json");
    dllm__json config;
    if (dllm__file_exists(config_path)) DLLM__TRY(dllm__json_load(config_path, config));
    if (config.kind != dllm__json::OBJ && !config.is_null())
        return dllm__fail(DLLM_ERR_FORMAT, "%s: not a JSON object", config_path.c_str());
    if (dllm__file_exists(json_path)) {
        DLLM__TRY(dllm__tok_load_json(*t, json_path));
    } else if (dllm__file_exists(dllm__join_path(dir, "vocab.json")) &&
               dllm__file_exists(dllm__join_path(dir, "merges.txt"))) {
        if (config.is_null())
            return dllm__fail(DLLM_ERR_IO, "%s: vocab.json and merges.txt need tokenizer_config.json beside them",
                              dir.c_str());
        DLLM__TRY(dllm__tok_load_vocab_merges(*t, config, config_path));
    } else {
        return dllm__fail(DLLM_ERR_IO, "%s: no tokenizer here (neither tokenizer.json nor vocab.json + merges.txt)",
                          dir.c_str());
    }
    DLLM__TRY(dllm__tok_chat_config(*t, config, config_path));
    dllm__tok_finish(*t);
    out = std::move(t);
    return DLLM_OK;
}

/* Copies text and its NUL into a caller's buffer, or reports the size needed. */
static dllm_status dllm__copy_out(const char *fn, const std::string &text, char *buf, size_t capacity, size_t *len) {
    if (len) *len = text.size() + 1;
    if (!buf || capacity < text.size() + 1)
        return dllm__fail(DLLM_ERR_BUFFER_TOO_SMALL,
                          "%s: the result needs %zu bytes with its NUL, the buffer holds %zu", fn, text.size() + 1,
                          buf ? capacity : 0);
    memcpy(buf, text.c_str(), text.size() + 1);
    return DLLM_OK;
}
