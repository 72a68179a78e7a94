/* encode: arbitrary bytes through dllm_tokenize with the shipped tokenizers, one per pre-tokenizer
 * scanner: the input's first byte picks the tokenizer and parse_special, the rest is the text. Ids
 * must be the tokenizer's, the same on a second (cached) encode, and decode back to the text (NFC'd
 * where the tokenizer normalises) whenever no added token was matched. */

struct fuzz_tokenizer {
    const char *what;
    dllm_tokenizer *tok;
    bool lossless;                          // every byte has a symbol: plain text round-trips
    std::unordered_set<int32_t> added_ids;  // ids of added tokens (matched, not merged)
};

static std::vector<fuzz_tokenizer> fuzz_toks;

/* tiny-llada's tokenizer.json with another pre-tokenizer, so each scanner is fuzzed on a real vocabulary. */
static dllm_tokenizer *fuzz_variant_tokenizer(const char *pre_tokenizer_json, bool ignore_merges) {
    dllm__json root, pre;
    std::string path = fuzz_root() + "/models/tiny-llada/tokenizer.json";
    if (dllm__json_load(path, root) != DLLM_OK ||
        dllm__json_parse(pre_tokenizer_json, strlen(pre_tokenizer_json), "variant", pre) != DLLM_OK) {
        fprintf(stderr, "dllm-fuzz: %s\n", dllm_last_error());
        exit(1);
    }
    for (size_t i = 0; i < root.keys.size(); i++)
        if (root.keys[i] == "pre_tokenizer") root.items[i] = pre;
    dllm__json *model = &root.items[(size_t)(root.find("model") - root.items.data())];
    for (size_t i = 0; i < model->keys.size(); i++)
        if (model->keys[i] == "ignore_merges") model->items[i].boolean = ignore_merges;
    std::string text;
    fuzz_json_write(root, text);
    fuzz_write("tokenizer.json", text);
    dllm_tokenizer *t = fuzz_load_tokenizer(fuzz_dir);
    fuzz_unlink("tokenizer.json");
    return t;
}

static void fuzz_add_tokenizer(const char *what, dllm_tokenizer *t) {
    fuzz_tokenizer f{what, t, true, {}};
    for (int b = 0; b < 256; b++) f.lossless = f.lossless && t->byte_id[b] >= 0;
    for (const dllm__added_token &a : t->added) f.added_ids.insert(a.id);
    fuzz_toks.push_back(std::move(f));
}

static void fuzz_tokenizers_free() {
    for (fuzz_tokenizer &f : fuzz_toks) dllm_tokenizer_free(f.tok);
    fuzz_toks.clear();
}

static void fuzz_tokenizers_init() {
    if (!fuzz_toks.empty()) return;
    fuzz_make_dir();
    atexit(fuzz_tokenizers_free);
    const std::string root = fuzz_root();
    fuzz_add_tokenizer("tiny-llada (Ling pattern)", fuzz_load_tokenizer(root + "/models/tiny-llada"));
    fuzz_add_tokenizer("tiny-dream (Qwen2 pattern, NFC)", fuzz_load_tokenizer(root + "/models/tiny-dream"));
    fuzz_add_tokenizer("ling (LLaDA's 269 special tokens)", fuzz_load_tokenizer(root + "/tests/data/tokenizer/ling"));
    fuzz_add_tokenizer("qwen2.5 (the real vocabulary)", fuzz_load_tokenizer(root + "/tests/data/tokenizer/qwen2.5"));
    dllm__json pattern;
    pattern.kind = dllm__json::STR;
    pattern.str = dllm__pretok_patterns[DLLM__PRETOK_LLAMA3].regex;
    std::string llama3;
    fuzz_json_write(pattern, llama3);
    llama3 =
        "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":" + llama3 +
        "},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
        "\"use_regex\":false}]}";
    fuzz_add_tokenizer("tiny-llada with Llama-3's pattern and ignore_merges",
                       fuzz_variant_tokenizer(llama3.c_str(), true));
    fuzz_add_tokenizer(
        "tiny-llada with GPT-2's ByteLevel pattern",
        fuzz_variant_tokenizer("{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}", false));
}

static void fuzz_encode_init() { fuzz_tokenizers_init(); }

static std::vector<int32_t> fuzz_tokenize(const dllm_tokenizer *t, const char *text, size_t n, int special) {
    int needed = -1;
    dllm_status s = dllm_tokenize(t, text, n, special, nullptr, 0, &needed);
    FUZZ_CHECK(needed >= 0 && (needed == 0 ? s == DLLM_OK : s == DLLM_ERR_BUFFER_TOO_SMALL));
    std::vector<int32_t> ids((size_t)needed + 1, -7);
    int got = -1;
    FUZZ_CHECK(dllm_tokenize(t, text, n, special, ids.data(), needed, &got) == DLLM_OK && got == needed &&
               ids[(size_t)needed] == -7);
    ids.resize((size_t)got);
    return ids;
}

static std::string fuzz_detokenize(const dllm_tokenizer *t, const std::vector<int32_t> &ids, int skip_special) {
    size_t len = 0;
    dllm_status s = dllm_detokenize(t, ids.data(), (int)ids.size(), skip_special, nullptr, 0, &len);
    FUZZ_CHECK(s == DLLM_ERR_BUFFER_TOO_SMALL && len >= 1);
    std::string text(len, '\x7f');
    FUZZ_CHECK(dllm_detokenize(t, ids.data(), (int)ids.size(), skip_special, &text[0], len, &len) == DLLM_OK &&
               len == text.size());
    FUZZ_CHECK(text.back() == '\0');
    text.pop_back();
    FUZZ_CHECK(fuzz_valid_utf8(text));
    return text;
}

static int fuzz_encode(const uint8_t *data, size_t n) {
    if (n == 0) return 0;
    const fuzz_tokenizer &f = fuzz_toks[data[0] % fuzz_toks.size()];
    const int special = (int)(data[0] / fuzz_toks.size()) & 1;
    const char *text = (const char *)data + 1;
    n--;
    std::vector<int32_t> ids = fuzz_tokenize(f.tok, text, n, special);
    const int n_vocab = dllm_tokenizer_n_vocab(f.tok);
    bool any_added = false;
    for (int32_t id : ids) {
        FUZZ_CHECK(id >= 0 && id < n_vocab);
        any_added = any_added || f.added_ids.count(id);
    }
    FUZZ_CHECK(fuzz_tokenize(f.tok, text, n, special) == ids);
    std::string back = fuzz_detokenize(f.tok, ids, 0);
    if (f.lossless && !any_added) {
        std::string want = dllm__utf8_sanitize(text, n);
        if (f.tok->nfc) want = dllm__nfc(want);
        if (back != want) fprintf(stderr, "dllm-fuzz: %s: decode(encode(text)) differs from the text\n", f.what);
        FUZZ_CHECK(back == want);
    }
    return 0;
}
