/* src/tokenizer/load.cpp - loading tokenizer.json, or vocab.json + merges.txt. */

// ---- Loading: tokenizer.json, or vocab.json + merges.txt + tokenizer_config.json --------------------

static dllm_status dllm__tok_vocab(dllm_tokenizer &t, const dllm__json &vocab, const std::string &what) {
    if (vocab.kind != dllm__json::OBJ || vocab.keys.empty())
        return dllm__fail(DLLM_ERR_FORMAT, "%s: the vocabulary must be a non-empty object {token: id}", what.c_str());
    std::vector<int32_t> seen;
    for (size_t i = 0; i < vocab.keys.size(); i++) {
        const dllm__json &v = vocab.items[i];
        if (!v.is_integer || v.integer < 0 || v.integer >= dllm__max_vocab)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: the id of token \"%s\" must be an integer in [0, %d)", what.c_str(),
                              vocab.keys[i].c_str(), dllm__max_vocab);
        if (!t.vocab.emplace(vocab.keys[i], (int32_t)v.integer).second)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: token \"%s\" appears twice in the vocabulary", what.c_str(),
                              vocab.keys[i].c_str());
        seen.push_back((int32_t)v.integer);
    }
    std::sort(seen.begin(), seen.end());
    auto dup = std::adjacent_find(seen.begin(), seen.end());
    if (dup != seen.end())
        return dllm__fail(DLLM_ERR_FORMAT, "%s: id %d is given to two tokens of the vocabulary", what.c_str(), *dup);
    return DLLM_OK;
}

/* Registers merge number `rank` (a, b); both and their concatenation must be vocabulary tokens. */
static dllm_status dllm__tok_merge(dllm_tokenizer &t, const std::string &a, const std::string &b, int32_t rank,
                                   const std::string &what) {
    const std::string *parts[3] = {&a, &b, nullptr};
    std::string ab = a + b;
    parts[2] = &ab;
    int32_t ids[3];
    for (int k = 0; k < 3; k++) {
        auto it = t.vocab.find(*parts[k]);
        if (it == t.vocab.end())
            return dllm__fail(DLLM_ERR_FORMAT,
                              "%s: merge %d (\"%s\" \"%s\") refers to \"%s\", which is not in the vocabulary",
                              what.c_str(), rank + 1, a.c_str(), b.c_str(), parts[k]->c_str());
        ids[k] = it->second;
    }
    t.merges[(uint64_t)(uint32_t)ids[0] << 32 | (uint32_t)ids[1]] = {
        rank, ids[2]};  // a repeated pair: the last wins, as in HF
    return DLLM_OK;
}

/* One merge of tokenizer.json: "a b" (older files) or ["a", "b"] (tokenizers >= 0.20). */
static dllm_status dllm__tok_json_merge(dllm_tokenizer &t, const dllm__json &m, int32_t rank, const std::string &what) {
    if (m.kind == dllm__json::ARR && m.items.size() == 2 && m.items[0].kind == dllm__json::STR &&
        m.items[1].kind == dllm__json::STR)
        return dllm__tok_merge(t, m.items[0].str, m.items[1].str, rank, what);
    size_t sp = m.kind == dllm__json::STR ? m.str.find(' ') : std::string::npos;
    if (sp == std::string::npos || m.str.find(' ', sp + 1) != std::string::npos)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: merge %d must be \"left right\" or [\"left\", \"right\"]", what.c_str(),
                          rank + 1);
    return dllm__tok_merge(t, m.str.substr(0, sp), m.str.substr(sp + 1), rank, what);
}

static dllm_status dllm__tok_merges_txt(dllm_tokenizer &t, const std::string &path) {
    std::string text;
    DLLM__TRY(dllm__read_text(path, text));
    size_t pos = 0;
    int32_t rank = 0;
    for (int line_no = 1; pos < text.size(); line_no++) {
        size_t eol = text.find('\n', pos);
        if (eol == std::string::npos) eol = text.size();
        std::string line = text.substr(pos, eol - pos);
        pos = eol + 1;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if ((line_no == 1 && line.rfind("#version", 0) == 0) || line.empty()) continue;
        size_t sp = line.find(' ');
        if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: line %d must be two tokens separated by one space", path.c_str(),
                              line_no);
        DLLM__TRY(dllm__tok_merge(t, line.substr(0, sp), line.substr(sp + 1), rank++, path));
    }
    return DLLM_OK;
}

static dllm_status dllm__tok_bool(const dllm__json &obj, const char *key, bool dflt, bool &out,
                                  const std::string &what) {
    const dllm__json *v = obj.find(key);
    if (!v || v->is_null()) {
        out = dflt;
        return DLLM_OK;
    }
    if (v->kind != dllm__json::BOOL)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: \"%s\" must be true or false", what.c_str(), key);
    out = v->boolean;
    return DLLM_OK;
}

/* An added token from a {content, special, lstrip, rstrip, normalized, single_word} object. */
static dllm_status dllm__tok_added(dllm_tokenizer &t, const dllm__json &obj, int64_t id, const std::string &what) {
    const dllm__json *content = obj.find("content");
    if (obj.kind != dllm__json::OBJ || !content || content->kind != dllm__json::STR || content->str.empty())
        return dllm__fail(DLLM_ERR_FORMAT, "%s: an added token needs a non-empty \"content\" string", what.c_str());
    if (id < 0 || id >= dllm__max_vocab)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: added token \"%s\" has id %lld outside [0, %d)", what.c_str(),
                          content->str.c_str(), (long long)id, dllm__max_vocab);
    dllm__added_token a;
    a.content = content->str;
    a.id = (int32_t)id;
    bool single_word = false;
    DLLM__TRY(dllm__tok_bool(obj, "special", false, a.special, what));
    DLLM__TRY(dllm__tok_bool(obj, "lstrip", false, a.lstrip, what));
    DLLM__TRY(dllm__tok_bool(obj, "rstrip", false, a.rstrip, what));
    DLLM__TRY(dllm__tok_bool(obj, "normalized", !a.special, a.normalized, what));
    DLLM__TRY(dllm__tok_bool(obj, "single_word", false, single_word, what));
    if (single_word)
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "%s: added token \"%s\" has single_word: true, which dllm does not implement", what.c_str(),
                          a.content.c_str());
    auto same = t.added_ids.find(a.content);
    if (same != t.added_ids.end()) {
        if (same->second != a.id)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: added token \"%s\" has ids %d and %d", what.c_str(),
                              a.content.c_str(), same->second, a.id);
        return DLLM_OK;  // listed twice (tokenizer_config.json and added_tokens.json)
    }
    auto in_vocab = t.vocab.find(a.content);
    if (in_vocab != t.vocab.end() && in_vocab->second != a.id)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: added token \"%s\" has id %d but the vocabulary gives it %d",
                          what.c_str(), a.content.c_str(), a.id, in_vocab->second);
    t.added_ids[a.content] = a.id;
    t.added.push_back(a);
    return DLLM_OK;
}

static const char *dllm__json_excerpt(const std::string &s, std::string &buf) {
    buf = s.size() > 60 ? s.substr(0, 60) + "..." : s;
    return buf.c_str();
}

/* pre_tokenizer: Sequence[Split(known regex, Isolated), ByteLevel(use_regex false)], or ByteLevel with
 * use_regex (GPT-2's pattern). add_prefix_space must be off: no supported model uses it. */
static dllm_status dllm__tok_pretokenizer(dllm_tokenizer &t, const dllm__json *pre, const std::string &what) {
    auto type_is = [](const dllm__json *j, const char *type) {
        const dllm__json *ty = j ? j->find("type") : nullptr;
        return ty && ty->kind == dllm__json::STR && ty->str == type;
    };
    auto byte_level = [&](const dllm__json *j, bool use_regex) -> dllm_status {
        bool prefix = false, regex = true;
        DLLM__TRY(dllm__tok_bool(*j, "add_prefix_space", true, prefix, what));
        DLLM__TRY(dllm__tok_bool(*j, "use_regex", true, regex, what));
        if (prefix)
            return dllm__fail(DLLM_ERR_UNSUPPORTED,
                              "%s: ByteLevel pre-tokenizer with add_prefix_space: true is not supported", what.c_str());
        if (regex != use_regex)
            return dllm__fail(DLLM_ERR_UNSUPPORTED,
                              "%s: ByteLevel pre-tokenizer with use_regex: %s is not supported here", what.c_str(),
                              regex ? "true" : "false");
        return DLLM_OK;
    };
    if (type_is(pre, "ByteLevel")) {
        t.pretok = DLLM__PRETOK_GPT2;
        return byte_level(pre, true);
    }
    const dllm__json *seq = type_is(pre, "Sequence") ? pre->find("pretokenizers") : nullptr;
    if (!seq || seq->kind != dllm__json::ARR || seq->items.size() != 2 || !type_is(&seq->items[0], "Split") ||
        !type_is(&seq->items[1], "ByteLevel"))
        return dllm__fail(
            DLLM_ERR_UNSUPPORTED,
            "%s: pre_tokenizer must be Sequence[Split(regex), ByteLevel] or ByteLevel (the byte-level BPE layouts dllm "
            "implements)",
            what.c_str());
    const dllm__json &split = seq->items[0];
    const dllm__json *pattern = split.find("pattern"), *behavior = split.find("behavior");
    const dllm__json *regex = pattern ? pattern->find("Regex") : nullptr;
    bool invert = false;
    DLLM__TRY(dllm__tok_bool(split, "invert", false, invert, what));
    if (!regex || regex->kind != dllm__json::STR || !behavior || behavior->kind != dllm__json::STR ||
        behavior->str != "Isolated" || invert)
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "%s: the Split pre-tokenizer must have a Regex pattern, behavior Isolated and invert false",
                          what.c_str());
    DLLM__TRY(byte_level(&seq->items[1], false));
    for (const auto &p : dllm__pretok_patterns)
        if (regex->str == p.regex && p.kind != DLLM__PRETOK_GPT2) {
            t.pretok = p.kind;
            return DLLM_OK;
        }
    std::string buf;
    return dllm__fail(
        DLLM_ERR_UNSUPPORTED,
        "%s: unknown pre-tokenizer regex \"%s\" (dllm implements the Llama-3, Qwen2, Ling and GPT-2 patterns exactly)",
        what.c_str(), dllm__json_excerpt(regex->str, buf));
}

/* normalizer: null, NFC, or a Sequence holding at most NFC. */
static dllm_status dllm__tok_normalizer(dllm_tokenizer &t, const dllm__json *norm, const std::string &what) {
    if (!norm || norm->is_null()) return DLLM_OK;
    const dllm__json *type = norm->find("type"), *list = norm->find("normalizers");
    if (type && type->kind == dllm__json::STR && type->str == "NFC") {
        t.nfc = true;
        return DLLM_OK;
    }
    if (type && type->kind == dllm__json::STR && type->str == "Sequence" && list && list->kind == dllm__json::ARR &&
        list->items.size() <= 1)
        return list->items.empty() ? DLLM_OK : dllm__tok_normalizer(t, &list->items[0], what);
    return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: normalizer must be null or NFC", what.c_str());
}

/* model: BPE with the byte-level options off (dropout, byte_fallback, affixes); vocab and merges. */
static dllm_status dllm__tok_model(dllm_tokenizer &t, const dllm__json *model, const std::string &what) {
    const dllm__json *type = model ? model->find("type") : nullptr;
    if (!model || model->kind != dllm__json::OBJ || (type && !(type->kind == dllm__json::STR && type->str == "BPE")))
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: model must be a BPE model", what.c_str());
    for (const char *key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
        const dllm__json *v = model->find(key);
        if (v && !v->is_null() && !(v->kind == dllm__json::STR && v->str.empty()))
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: BPE \"%s\" is set; dllm supports only null here", what.c_str(),
                              key);
    }
    bool byte_fallback = false;
    DLLM__TRY(dllm__tok_bool(*model, "byte_fallback", false, byte_fallback, what));
    if (byte_fallback)
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "%s: BPE byte_fallback is not supported (byte-level BPE never needs it)", what.c_str());
    DLLM__TRY(dllm__tok_bool(*model, "ignore_merges", false, t.ignore_merges, what));
    DLLM__TRY(dllm__tok_bool(*model, "fuse_unk", false, t.fuse_unk, what));
    const dllm__json *vocab = model->find("vocab"), *merges = model->find("merges"), *unk = model->find("unk_token");
    if (!vocab) return dllm__fail(DLLM_ERR_FORMAT, "%s: model.vocab is missing", what.c_str());
    DLLM__TRY(dllm__tok_vocab(t, *vocab, what + " (model.vocab)"));
    if (!merges || merges->kind != dllm__json::ARR)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: model.merges must be an array", what.c_str());
    for (size_t i = 0; i < merges->items.size(); i++)
        DLLM__TRY(dllm__tok_json_merge(t, merges->items[i], (int32_t)i, what));
    if (unk && !unk->is_null()) {
        auto it = unk->kind == dllm__json::STR ? t.vocab.find(unk->str) : t.vocab.end();
        if (it == t.vocab.end())
            return dllm__fail(DLLM_ERR_FORMAT, "%s: model.unk_token is not a vocabulary token", what.c_str());
        t.unk_id = it->second;
    }
    return DLLM_OK;
}

static dllm_status dllm__tok_load_json(dllm_tokenizer &t, const std::string &path) {
    dllm__json root;
    DLLM__TRY(dllm__json_load(path, root));
    if (root.kind != dllm__json::OBJ) return dllm__fail(DLLM_ERR_FORMAT, "%s: not a JSON object", path.c_str());
    DLLM__TRY(dllm__tok_model(t, root.find("model"), path));
    DLLM__TRY(dllm__tok_normalizer(t, root.find("normalizer"), path));
    DLLM__TRY(dllm__tok_pretokenizer(t, root.find("pre_tokenizer"), path));
    const dllm__json *dec = root.find("decoder"), *dec_type = dec ? dec->find("type") : nullptr;
    if (!dec_type || dec_type->kind != dllm__json::STR || dec_type->str != "ByteLevel")
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: decoder must be ByteLevel", path.c_str());
    const dllm__json *added = root.find("added_tokens");
    if (added && added->kind != dllm__json::ARR)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: added_tokens must be an array", path.c_str());
    for (size_t i = 0; added && i < added->items.size(); i++) {
        const dllm__json *id = added->items[i].find("id");
        if (!id || !id->is_integer)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: added_tokens[%zu] has no integer \"id\"", path.c_str(), i);
        DLLM__TRY(dllm__tok_added(t, added->items[i], id->integer, path));
    }
    return DLLM_OK;
}

/* Dream and Fast-dLLM v2 ship the slow Qwen2 tokenizer's files: its class hard-codes NFC and the Qwen2
 * split pattern. Added tokens come from added_tokens_decoder and added_tokens.json. */
static dllm_status dllm__tok_load_vocab_merges(dllm_tokenizer &t, const dllm__json &config,
                                               const std::string &config_path) {
    const dllm__json *cls = config.find("tokenizer_class");
    static const char *known[] = {"Qwen2Tokenizer", "Qwen2TokenizerFast", "DreamTokenizer"};
    if (!cls || cls->kind != dllm__json::STR ||
        std::none_of(known, known + 3, [&](const char *k) { return cls->str == k; }))
        return dllm__fail(
            DLLM_ERR_UNSUPPORTED,
            "%s: tokenizer_class %s%s%s is not supported with vocab.json + merges.txt (supported: Qwen2Tokenizer, "
            "DreamTokenizer)",
            config_path.c_str(), cls && cls->kind == dllm__json::STR ? "\"" : "",
            cls && cls->kind == dllm__json::STR ? cls->str.c_str() : "(missing)",
            cls && cls->kind == dllm__json::STR ? "\"" : "");
    t.nfc = true;
    t.pretok = DLLM__PRETOK_QWEN2;
    dllm__json vocab;
    std::string vocab_path = dllm__join_path(t.dir, "vocab.json");
    DLLM__TRY(dllm__json_load(vocab_path, vocab));
    DLLM__TRY(dllm__tok_vocab(t, vocab, vocab_path));
    DLLM__TRY(dllm__tok_merges_txt(t, dllm__join_path(t.dir, "merges.txt")));
    const dllm__json *dec = config.find("added_tokens_decoder");
    if (dec && dec->kind != dllm__json::OBJ)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: added_tokens_decoder must be an object", config_path.c_str());
    for (size_t i = 0; dec && i < dec->keys.size(); i++) {
        char *end = nullptr;
        long long id = strtoll(dec->keys[i].c_str(), &end, 10);
        if (dec->keys[i].empty() || *end)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: added_tokens_decoder key \"%s\" is not an id", config_path.c_str(),
                              dec->keys[i].c_str());
        DLLM__TRY(dllm__tok_added(t, dec->items[i], id, config_path));
    }
    std::string extra_path = dllm__join_path(t.dir, "added_tokens.json");
    if (!dllm__file_exists(extra_path)) return DLLM_OK;
    dllm__json extra;
    DLLM__TRY(dllm__json_load(extra_path, extra));
    if (extra.kind != dllm__json::OBJ)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: not a JSON object {token: id}", extra_path.c_str());
    for (size_t i = 0; i < extra.keys.size(); i++) {
        if (!extra.items[i].is_integer)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: the id of \"%s\" must be an integer", extra_path.c_str(),
                              extra.keys[i].c_str());
        dllm__json obj;  // tokens listed only here are plain added tokens, as the slow tokenizer adds them
        obj.kind = dllm__json::OBJ;
        obj.keys = {"content"};
        obj.items.resize(1);
        obj.items[0].kind = dllm__json::STR;
        obj.items[0].str = extra.keys[i];
        DLLM__TRY(dllm__tok_added(t, obj, extra.items[i].integer, extra_path));
    }
    return DLLM_OK;
}

/* Ids, decode pieces and the added-token matchers, once vocabulary, merges and added tokens are in. */
static void dllm__tok_finish(dllm_tokenizer &t) {
    dllm__byte_chars(t.byte_char);
    int32_t max_id = -1;
    for (const auto &kv : t.vocab) max_id = std::max(max_id, kv.second);
    for (const dllm__added_token &a : t.added) max_id = std::max(max_id, a.id);
    t.n_vocab = max_id + 1;
    t.piece.assign((size_t)t.n_vocab, std::string());
    t.has_token.assign((size_t)t.n_vocab, 0);
    t.is_special.assign((size_t)t.n_vocab, 0);
    for (const auto &kv : t.vocab) {
        t.piece[(size_t)kv.second] = dllm__token_bytes(t, kv.first);
        t.has_token[(size_t)kv.second] = 1;
    }
    int missing = 0;
    for (int b = 0; b < 256; b++) {
        std::string ch;
        dllm__utf8_put(ch, t.byte_char[b]);
        auto it = t.vocab.find(ch);
        t.byte_id[b] = it == t.vocab.end() ? -1 : it->second;
        missing += t.byte_id[b] < 0;
    }
    if (missing)
        dllm__log(
            DLLM_LOG_WARN,
            "%s: %d of the 256 byte symbols are not in the vocabulary; text with those bytes loses them, as in Hugging "
            "Face",
            t.dir.c_str(), missing);
    for (size_t i = 0; i < t.added.size(); i++) {
        const dllm__added_token &a = t.added[i];
        t.piece[(size_t)a.id] = dllm__token_bytes(t, a.content);
        t.has_token[(size_t)a.id] = 1;
        t.is_special[(size_t)a.id] = a.special;
        if (a.normalized)
            t.normalized_trie.insert(t.nfc ? dllm__nfc(a.content) : a.content, (int32_t)i);
        else
            t.raw_trie.insert(a.content, (int32_t)i);
    }
}
