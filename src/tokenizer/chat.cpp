/* src/tokenizer/chat.cpp - chat templates: detection and rendering of the known Jinja templates. */

// ---- Chat templates -----------------------------------------------------------------------------------
// Detected by markers of the known Jinja templates (tokenizer_config.json "chat_template", or
// chat_template.jinja, which transformers prefers); a template without them gets DLLM_CHAT_NONE.

static dllm_chat_template dllm__chat_detect(const std::string &tpl) {
    auto has = [&](const char *s) { return tpl.find(s) != std::string::npos; };
    if (has("<|start_header_id|>") && has("<|eot_id|>") && has("bos_token") && has("| trim")) return DLLM_CHAT_LLADA;
    if (has("<|im_start|>") && has("<|im_end|>") && has("You are a helpful assistant.")) return DLLM_CHAT_CHATML;
    if (has("<role>SYSTEM</role>") && has("<|role_end|>") && has("detailed thinking ")) return DLLM_CHAT_LLADA2;
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

// ---- LLaDA2 (Ling 2.0's format) ---------------------------------------------------------------------------
// Sources: the chat_template of the Hub's inclusionAI/LLaDA2.1-flash tokenizer_config.json (849c58d), read up to
// its turn loop; the turns as Ling 2.0's template renders them (Ling-1T's, printed in ikawrakow/ik_llama.cpp issue
// 873), which is identical over that part; sgl-project/sglang docs/supported_models/diffusion_language_models.md
// writes LLaDA2.0-mini prompts this way. Format: a system block first, always, holding the first system message
// and "detailed thinking off"; each turn closed by <|role_end|>; an assistant turn holding </think> split into
// reasoning and answer, the reasoning kept only after the last user query. Tools are not in dllm's API.

static bool dllm__is_tool_response(const std::string &s) {
    static const std::string open = "<tool_response>", close = "</tool_response>";
    return s.size() >= open.size() && s.size() >= close.size() && !s.compare(0, open.size(), open) &&
           !s.compare(s.size() - close.size(), close.size(), close);
}

/* Python's str.lstrip('\n') / rstrip('\n'). */
static std::string dllm__lstrip_nl(const std::string &s) {
    return s.substr(std::min(s.find_first_not_of('\n'), s.size()));
}
static std::string dllm__rstrip_nl(const std::string &s) {
    size_t e = s.find_last_not_of('\n');
    return e == std::string::npos ? std::string() : s.substr(0, e + 1);
}

/* One assistant turn: the template's split of "...<think>R</think>A" into R and A (keeping R only when asked). */
static std::string dllm__llada2_assistant(const std::string &content, bool keep_reasoning) {
    const size_t close = content.find("</think>");
    if (close == std::string::npos) return "<role>ASSISTANT</role>" + content + "<|role_end|>";
    std::string reasoning = dllm__rstrip_nl(content.substr(0, close));  // before the first </think>
    const size_t open = reasoning.rfind("<think>");                      // after the last <think> in it
    if (open != std::string::npos) reasoning = reasoning.substr(open + 7);
    reasoning = dllm__lstrip_nl(reasoning);
    const std::string answer = dllm__lstrip_nl(content.substr(content.rfind("</think>") + 8));
    if (!keep_reasoning || reasoning.empty()) return "<role>ASSISTANT</role>" + answer + "<|role_end|>";
    return "<role>ASSISTANT</role>\n<think>\n" + dllm__rstrip_nl(reasoning) + "\n</think>\n\n" + answer +
           "<|role_end|>";
}

static void dllm__chat_render_llada2(const dllm_chat_message *msgs, int n, bool add_assistant, std::string &out) {
    const bool system_first = strcmp(msgs[0].role, "system") == 0;
    out = std::string("<role>SYSTEM</role>") + (system_first ? std::string(msgs[0].content) + "\n" : "") +
          "detailed thinking off<|role_end|>";
    int last_query = n - 1;  // the last user message that is not a tool response
    for (int i = n - 1; i >= 0; i--)
        if (!strcmp(msgs[i].role, "user") && !dllm__is_tool_response(msgs[i].content)) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        if (!strcmp(role, "user"))
            out += std::string("<role>HUMAN</role>") + msgs[i].content + "<|role_end|>";
        else if (!strcmp(role, "system") && i > 0)
            out += std::string("<role>SYSTEM</role>") + msgs[i].content + "<|role_end|>";
        else if (!strcmp(role, "assistant"))
            out += dllm__llada2_assistant(msgs[i].content, i > last_query);
    }
    if (add_assistant) out += "<role>ASSISTANT</role>";
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
    if (t.chat == DLLM_CHAT_LLADA2) {
        dllm__chat_render_llada2(msgs, n, add_assistant, out);
        return DLLM_OK;
    }
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
