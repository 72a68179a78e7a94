/* Tokenizer tests: Unicode pieces, the pre-tokenizer scanners and BPE by hand, then ids, decodes and chat
 * renders byte-identical to Hugging Face's fixtures (tools/tokenizer_oracle.py) for the real Qwen2.5
 * vocabulary and a small Ling-pattern BPE with LLaDA's special tokens at their real ids; bad input. */

static std::string test_unhex(const std::string &hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) out += (char)strtol(hex.substr(i, 2).c_str(), nullptr, 16);
    return out;
}

static std::vector<int32_t> test_json_ids(const dllm__json *arr) {
    std::vector<int32_t> v;
    for (const dllm__json &x : arr->items) v.push_back((int32_t)x.integer);
    return v;
}

static std::vector<int32_t> test_encode(const dllm_tokenizer *t, const std::string &text, int parse_special = 1) {
    int n = 0;
    dllm_tokenize(t, text.data(), text.size(), parse_special, nullptr, 0, &n);
    std::vector<int32_t> ids((size_t)n);
    if (dllm_tokenize(t, text.data(), text.size(), parse_special, ids.data(), n, &n) != DLLM_OK) return {-1};
    return ids;
}

static std::string test_decode(const dllm_tokenizer *t, const std::vector<int32_t> &ids, int skip_special = 0) {
    size_t need = 0;
    dllm_detokenize(t, ids.data(), (int)ids.size(), skip_special, nullptr, 0, &need);
    std::string s(need, '\0');
    if (dllm_detokenize(t, ids.data(), (int)ids.size(), skip_special, &s[0], need, &need) != DLLM_OK) return "(error)";
    s.resize(need - 1);
    return s;
}

static std::string test_ids_str(const std::vector<int32_t> &ids) {
    std::string s;
    for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
    return s;
}

/* Hand-made tokenizers lack most byte symbols; the loader's warning about that is expected here. */
struct test_quiet_log {
    test_quiet_log() { dllm_log_set([](dllm_log_level, const char *, void *) {}, nullptr, DLLM_LOG_ERROR); }
    ~test_quiet_log() { dllm_log_set(nullptr, nullptr, DLLM_LOG_WARN); }
};

static dllm_tokenizer *test_tokenizer(const std::string &dir) {
    dllm_tokenizer *t = nullptr;
    if (dllm_tokenizer_load(dir.c_str(), &t) != DLLM_OK)
        fprintf(stdout, "    cannot load tokenizer %s: %s\n", dir.c_str(), dllm_last_error());
    return t;
}

/* Pre-tokens of text under a pattern, joined by '|'. */
static std::string test_split(dllm__pretok_kind kind, const std::string &text) {
    std::vector<std::pair<size_t, size_t>> pieces;
    dllm__pretokenize(kind, text, pieces);
    std::string s;
    for (auto &p : pieces) s += (s.empty() ? "" : "|") + text.substr(p.first, p.second - p.first);
    return s;
}

// ---- Unicode ---------------------------------------------------------------------------------------

TEST(tokenizer, utf8_replacement_follows_maximal_subparts) {
    const std::string fffd = "\xEF\xBF\xBD";
    struct { const char *in; size_t len; std::string want; } cases[] = {
        {"a\xFF" "b", 3, "a" + fffd + "b"},
        {"\xE2\x82", 2, fffd},                           // truncated 3-byte sequence: one replacement
        {"\xE2\x82" "A", 3, fffd + "A"},
        {"\xF0\x9F\x98", 3, fffd},
        {"\xED\xA0\x80", 3, fffd + fffd + fffd},         // surrogate: E0..9F is the only valid second byte after ED
        {"\xC0\xAF", 2, fffd + fffd},                    // overlong
        {"\xF4\x90\x80\x80", 4, fffd + fffd + fffd + fffd},  // above U+10FFFF
        {"\xEF\xBF\xBD", 3, fffd},                       // a real U+FFFD stays one
        {"\xF0\x9F\x98\x80", 4, "\xF0\x9F\x98\x80"},
    };
    for (auto &c : cases) CHECK_MSG(dllm__utf8_sanitize(c.in, c.len) == c.want, "case %s", c.in);
}

TEST(tokenizer, unicode_classes_from_the_generated_tables) {
    for (uint32_t cp : {0x41u, 0x7Au, 0xE9u, 0x4E2Du, 0x3042u, 0x10400u, 0x2Cu + 0x100u /* Ĭ */})
        CHECK_MSG(dllm__is_letter(cp), "U+%04X", cp);
    for (uint32_t cp : {0x30u, 0x663u, 0x2460u, 0xBDu, 0x216Bu, 0xFF14u}) CHECK_MSG(dllm__is_number(cp), "U+%04X", cp);
    for (uint32_t cp : {0x20u, 0x09u, 0x0Du, 0x85u, 0xA0u, 0x1680u, 0x2003u, 0x2028u, 0x3000u})
        CHECK_MSG(dllm__is_space(cp), "U+%04X", cp);
    for (uint32_t cp : {0x1Cu, 0x200Bu, 0xFEFFu, 0x180Eu, 0x5Fu})
        CHECK_MSG(!dllm__is_space(cp) && !dllm__is_letter(cp), "U+%04X", cp);
    CHECK(!dllm__is_letter(0x2764) && !dllm__is_number(0x1F600) && !dllm__is_letter(0x301));
    CHECK(dllm__ccc(0x301) == 230 && dllm__ccc(0x323) == 220 && dllm__ccc(0x41) == 0 && dllm__ccc(0x3099) == 8);
}

TEST(tokenizer, nfc_composes_reorders_and_respects_exclusions) {
    struct { const char *in, *want;
    } cases[] = {
        {"cafe\xCC\x81", "caf\xC3\xA9"},                   // e + U+0301 -> U+00E9
        {"a\xCC\x87\xCC\xA3", "\xE1\xBA\xA1\xCC\x87"},     // dot above + dot below reorder, then a+below composes
        {"\xE1\xB8\x8B\xCC\xA3", "\xE1\xB8\x8D\xCC\x87"},  // U+1E0B U+0323 -> U+1E0D U+0307
        {"\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB", "\xED\x95\x9C"},  // conjoining jamo -> U+D55C
        {"\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC"},              // U+0958 is excluded from composition
        {"\xE2\x84\xA6", "\xCE\xA9"},                              // OHM SIGN -> OMEGA (singleton)
        {"\xCC\x81"
         "e",
         "\xCC\x81"
         "e"},  // a leading combining mark stays
        {"plain ascii", "plain ascii"},
    };
    for (auto &c : cases) CHECK_MSG(dllm__nfc(c.in) == c.want, "NFC(%s) = %s", c.in, dllm__nfc(c.in).c_str());
}

// ---- Pre-tokenizer scanners, checked by hand against Oniguruma's semantics -------------------------------

TEST(tokenizer, pretokenizer_scanners_follow_the_regexes) {
    struct { dllm__pretok_kind kind; const char *in, *want; } cases[] = {
        {DLLM__PRETOK_QWEN2, "Hello world", "Hello| world"},
        {DLLM__PRETOK_QWEN2, "I'm John's 12345", "I|'m| John|'s| |1|2|3|4|5"},
        {DLLM__PRETOK_QWEN2, "IT'S 'LL", "IT|'S| '|LL"},                         // (?i:...) contractions
        {DLLM__PRETOK_QWEN2, "a  b\t\tc   ", "a| | b|\t|\tc|   "},                // \s+(?!\S) leaves the last space
        {DLLM__PRETOK_QWEN2, "x  \n\n  y", "x|  \n\n| | y"},                     // \s*[\r\n]+ ends at the last newline
        {DLLM__PRETOK_QWEN2, "x \r\n\r\n", "x| \r\n\r\n"},
        {DLLM__PRETOK_QWEN2, "!!\n\nab ,cd", "!!\n\n|ab| ,|cd"},                 //  ?[^\s\p{L}\p{N}]+[\r\n]*
        {DLLM__PRETOK_QWEN2, "\tHi \xE4\xBD\xA0\xE5\xA5\xBD", "\tHi| \xE4\xBD\xA0\xE5\xA5\xBD"},
        {DLLM__PRETOK_QWEN2, "'\xC5\xBF", "'\xC5\xBF"},                          // U+017F folds to s
        {DLLM__PRETOK_LLAMA3, "12345 678", "123|45| |678"},
        {DLLM__PRETOK_LING, "x  \n\n  y'LL", "x|  \n\n| | y|'LL"},
        {DLLM__PRETOK_GPT2, "I'M ok 123 !!\n", "I|'|M| ok| 123| !!|\n"},           // case-sensitive, no [\r\n]*
        {DLLM__PRETOK_GPT2, "a   b", "a|  | b"},
    };
    for (auto &c : cases) {
        std::string got = test_split(c.kind, c.in);
        CHECK_MSG(got == c.want, "pattern %d, \"%s\": got \"%s\", want \"%s\"", (int)c.kind, c.in, got.c_str(), c.want);
    }
}

// ---- BPE on a hand-made tokenizer.json ----------------------------------------------------------------

static std::string test_json_string(const std::string &s) {
    std::string e = "\"";
    for (char c : s) e += c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : std::string(1, c);
    return e + "\"";
}

/* A tokenizer.json over the single-byte symbols of "abc " (Ġ is the space) with a few merges. */
static std::string test_hand_tokenizer(const std::string &merges, bool ignore_merges,
                                       const std::string &extra_vocab = "", const std::string &added = "[]",
                                       const char *regex = nullptr) {
    std::string re = test_json_string(regex ? regex : dllm__pretok_patterns[DLLM__PRETOK_QWEN2].regex);
    return "{\"version\":\"1.0\",\"added_tokens\":" + added +
           ",\"normalizer\":null,"
           "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":" +
           re +
           "},"
           "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
           "\"trim_offsets\":true,\"use_regex\":false}]},"
           "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
           "\"ignore_merges\":" +
           (ignore_merges ? "true" : "false") +
           ",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"\xC4\xA0\":3,\"ab\":4,\"bc\":5,\"aa\":6,\"abc\":7,\"aaa\":8" +
           extra_vocab + "},\"merges\":" + merges + "}}";
}

TEST(tokenizer, bpe_takes_the_lowest_rank_leftmost_first) {
    test_tmpdir dir;
    test_quiet_log quiet;
    test_write_file(dir.file("tokenizer.json"), test_hand_tokenizer("[\"b c\",\"a b\",\"a a\"]", false));
    dllm_tokenizer *t = test_tokenizer(dir.path);
    if (!t) { CHECK(t != nullptr); return; }
    CHECK(test_ids_str(test_encode(t, "abc")) == "0 5");      // b c (rank 0) before a b (rank 1)
    CHECK(test_ids_str(test_encode(t, "aaa")) == "6 0");      // equal ranks: leftmost first
    CHECK(test_ids_str(test_encode(t, "aaaa")) == "6 6");
    CHECK(test_ids_str(test_encode(t, "ab ab")) == "4 3 4");    // " ab" is one pre-token; Ġ merges with nothing
    CHECK(test_decode(t, test_encode(t, "ab ab")) == "ab ab");
    dllm_tokenizer_free(t);
}

TEST(tokenizer, bpe_pairs_format_and_ignore_merges) {
    test_tmpdir dir;
    test_quiet_log quiet;
    // Pair format; "abc" is a vocabulary entry but no merge builds it.
    test_write_file(dir.file("tokenizer.json"), test_hand_tokenizer("[[\"a\",\"b\"],[\"a\",\"a\"]]", true));
    dllm_tokenizer *t = test_tokenizer(dir.path);
    if (!t) { CHECK(t != nullptr); return; }
    CHECK(test_ids_str(test_encode(t, "abc")) == "7");   // ignore_merges: the whole pre-token is in the vocabulary
    CHECK(test_ids_str(test_encode(t, "abcb")) == "4 2 1");
    dllm_tokenizer_free(t);
    test_write_file(dir.file("tokenizer.json"), test_hand_tokenizer("[[\"a\",\"b\"],[\"a\",\"a\"]]", false));
    t = test_tokenizer(dir.path);
    if (t) CHECK(test_ids_str(test_encode(t, "abc")) == "4 2");
    dllm_tokenizer_free(t);
}

TEST(tokenizer, added_tokens_with_lstrip_rstrip_and_normalized) {
    test_tmpdir dir;
    test_quiet_log quiet;
    std::string added =
        "[{\"id\":9,\"content\":\"<x>\",\"special\":true,\"lstrip\":true,\"rstrip\":true,\"normalized\":false,"
        "\"single_word\":false},"
        "{\"id\":10,\"content\":\"<x>>\",\"special\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
        "\"single_word\":false},"
        "{\"id\":11,\"content\":\"cab\",\"special\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":true,"
        "\"single_word\":false}]";
    test_write_file(dir.file("tokenizer.json"), test_hand_tokenizer("[\"a b\"]", false, ",\"<x>\":9", added));
    dllm_tokenizer *t = test_tokenizer(dir.path);
    if (!t) { CHECK(t != nullptr); return; }
    CHECK(test_ids_str(test_encode(t, "a  <x>  b")) == "0 9 1");      // the spaces go with the token
    CHECK(test_ids_str(test_encode(t, "a<x>>b")) == "0 10 1");        // leftmost-longest
    CHECK(test_ids_str(test_encode(t, "acabb")) == "0 11 1");
    CHECK(test_ids_str(test_encode(t, "<x>", 0)) != "9");             // parse_special = 0: plain text
    CHECK(dllm_tokenizer_token_id(t, "<x>") == 9 && dllm_tokenizer_token_id(t, "zz") == -1 &&
          dllm_tokenizer_token_id(t, "\xC4\xA0") == 3);
    CHECK(test_decode(t, {0, 9, 1}) == "a<x>b" && test_decode(t, {0, 9, 1}, 1) == "ab" &&
          test_decode(t, {0, 10, 1}, 1) == "a<x>>b");
    dllm_tokenizer_free(t);
}

// ---- Byte-exact against Hugging Face ------------------------------------------------------------------

static void test_against_fixture(dllm_test_state &T_, const char *fixture, const char *dir, bool nfc) {
    dllm__json root;
    CHECK_STATUS(dllm__json_load(test_data(fixture), root), DLLM_OK, nullptr);
    const dllm__json *cases = root.find("cases");
    if (!cases) { CHECK(cases != nullptr); return; }
    dllm_tokenizer *t = test_tokenizer(test_data(dir));
    if (!t) { CHECK(t != nullptr); return; }
    int mismatches = 0;
    for (const dllm__json &c : cases->items) {
        std::string name = c.find("name")->str, text = test_unhex(c.find("hex")->str);
        std::vector<int32_t> want = test_json_ids(c.find("ids")), got = test_encode(t, text);
        CHECK_MSG(got == want, "%s: %s\n      got  %s\n      want %s", fixture, name.c_str(), test_ids_str(got).c_str(),
                  test_ids_str(want).c_str());
        std::vector<int32_t> plain = test_encode(t, text, 0);
        CHECK_MSG(plain == test_json_ids(c.find("ids_no_parse_special")), "%s: %s (parse_special = 0): got %s", fixture,
                  name.c_str(), test_ids_str(plain).c_str());
        CHECK_MSG(test_decode(t, want) == test_unhex(c.find("decoded_hex")->str), "%s: %s: decode differs", fixture,
                  name.c_str());
        CHECK_MSG(test_decode(t, want, 1) == test_unhex(c.find("decoded_skip_special_hex")->str),
                  "%s: %s: decode (skip special) differs", fixture, name.c_str());
        // Round trip on valid UTF-8: the text comes back, normalised where the tokenizer normalises.
        std::string valid = dllm__utf8_sanitize(text.data(), text.size());
        if (valid == text)
            CHECK_MSG(test_decode(t, got) == (nfc ? dllm__nfc(text) : text), "%s: %s: round trip", fixture,
                      name.c_str());
        mismatches += got != want;
    }
    const std::string &source = root.find("source")->str;
    if (mismatches)
        fprintf(stdout, "    %d of %zu cases differ (fixture source: %s)\n", mismatches, cases->items.size(),
                source.c_str());
    if (source.rfind("provisional", 0) == 0)
        fprintf(stdout, "    note: %s is provisional; regenerate it with tools/tokenizer_oracle.py\n", fixture);
    dllm_tokenizer_free(t);
}

TEST(tokenizer, qwen25_ids_match_hugging_face) {
    test_against_fixture(T_, "tokenizer/qwen2.5.expected.json", "tokenizer/qwen2.5", true);
}

TEST(tokenizer, ling_bpe_with_llada_specials_matches_hugging_face) {
    test_against_fixture(T_, "tokenizer/ling.expected.json", "tokenizer/ling", false);
}

static void test_chats_against_fixture(dllm_test_state &T_, const char *fixture, const char *dir,
                                       dllm_chat_template want_kind) {
    dllm__json root;
    CHECK_STATUS(dllm__json_load(test_data(fixture), root), DLLM_OK, nullptr);
    const dllm__json *chats = root.find("chats");
    if (!chats) { CHECK(chats != nullptr); return; }
    dllm_tokenizer *t = test_tokenizer(test_data(dir));
    if (!t) { CHECK(t != nullptr); return; }
    CHECK(dllm_tokenizer_chat_template(t) == want_kind);
    for (const dllm__json &c : chats->items) {
        std::vector<dllm_chat_message> msgs;
        for (const dllm__json &m : c.find("messages")->items)
            msgs.push_back({m.find("role")->str.c_str(), m.find("content")->str.c_str()});
        size_t need = 0;
        dllm_chat_render(t, msgs.data(), (int)msgs.size(), c.find("add_generation_prompt")->boolean, nullptr, 0, &need);
        std::string got(need, '\0');
        CHECK_STATUS(dllm_chat_render(t, msgs.data(), (int)msgs.size(), c.find("add_generation_prompt")->boolean,
                                      &got[0], need, &need),
                     DLLM_OK, nullptr);
        got.resize(need ? need - 1 : 0);
        CHECK_MSG(got == c.find("text")->str, "%s: got\n%s\n---- want\n%s", fixture, got.c_str(),
                  c.find("text")->str.c_str());
    }
    dllm_tokenizer_free(t);
}

TEST(tokenizer, chatml_renders_match_apply_chat_template) {
    test_chats_against_fixture(T_, "tokenizer/qwen2.5.expected.json", "tokenizer/qwen2.5", DLLM_CHAT_CHATML);
}

TEST(tokenizer, llada_renders_match_apply_chat_template) {
    test_chats_against_fixture(T_, "tokenizer/ling.expected.json", "tokenizer/ling", DLLM_CHAT_LLADA);
}

/* A tokenizer directory holding LLaDA's tokenizer.json and tools/chat_templates/llada2.jinja as its chat template. */
static dllm_tokenizer *test_llada2_chat_tokenizer(dllm_test_state &T_, const test_tmpdir &dir) {
    const std::string tpl = test_read_file(test_data_dir() + "/../../tools/chat_templates/llada2.jinja");
    CHECK(!tpl.empty());
    test_write_file(dir.file("tokenizer.json"), test_read_file(test_data("tokenizer/ling/tokenizer.json")));
    test_write_file(dir.file("tokenizer_config.json"),
                    "{\"bos_token\":\"<|startoftext|>\",\"chat_template\":" + test_json_string(tpl) + "}");
    return test_tokenizer(dir.path);
}

static std::string test_render(dllm_test_state &T_, dllm_tokenizer *t, std::vector<dllm_chat_message> msgs, int gen) {
    size_t need = 0;
    dllm_chat_render(t, msgs.data(), (int)msgs.size(), gen, nullptr, 0, &need);
    std::string got(need, '\0');
    CHECK_STATUS(dllm_chat_render(t, msgs.data(), (int)msgs.size(), gen, &got[0], need, &need), DLLM_OK, nullptr);
    got.resize(need ? need - 1 : 0);
    return got;
}

// The strings are the format written out by hand (LLaDA2's template: src/tokenizer/chat.cpp, "LLaDA2"); the same
// conversations rendered by Jinja with tools/chat_templates/llada2.jinja give them too.
TEST(tokenizer, llada2_renders_the_role_format) {
    test_tmpdir dir;
    dllm_tokenizer *t = test_llada2_chat_tokenizer(T_, dir);
    if (!t) { CHECK(t != nullptr); return; }
    CHECK(dllm_tokenizer_chat_template(t) == DLLM_CHAT_LLADA2);
    const std::string head = "<role>SYSTEM</role>detailed thinking off<|role_end|>";
    CHECK(test_render(T_, t, {{"user", "Hi"}}, 1) == head + "<role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>");
    CHECK(test_render(T_, t, {{"user", "Hi"}}, 0) == head + "<role>HUMAN</role>Hi<|role_end|>");
    CHECK(test_render(T_, t, {{"system", "You are terse."}, {"user", "Hi  there \n"}}, 1) ==
          "<role>SYSTEM</role>You are terse.\ndetailed thinking off<|role_end|><role>HUMAN</role>Hi  there \n"
          "<|role_end|><role>ASSISTANT</role>");
    CHECK(test_render(T_, t, {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Who are you?"}}, 1) ==
          head + "<role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>Hello!<|role_end|><role>HUMAN</role>"
                 "Who are you?<|role_end|><role>ASSISTANT</role>");
    CHECK(test_render(T_, t, {{"user", "q"}, {"system", "late"}, {"assistant", "</think>only"}}, 0) ==
          head + "<role>HUMAN</role>q<|role_end|><role>SYSTEM</role>late<|role_end|><role>ASSISTANT</role>only"
                 "<|role_end|>");
    dllm_tokenizer_free(t);
}

// An assistant turn's <think>...</think> is dropped before the last user query and kept, normalised, after it.
TEST(tokenizer, llada2_keeps_reasoning_only_after_the_last_query) {
    test_tmpdir dir;
    dllm_tokenizer *t = test_llada2_chat_tokenizer(T_, dir);
    if (!t) { CHECK(t != nullptr); return; }
    CHECK(test_render(T_, t, {{"system", "sys"}, {"user", "q1"}, {"assistant", "\n<think>\nplan\n\n</think>\n\nans1"},
                              {"user", "q2"}, {"assistant", "<think>r2</think>a2"}}, 0) ==
          "<role>SYSTEM</role>sys\ndetailed thinking off<|role_end|><role>HUMAN</role>q1<|role_end|>"
          "<role>ASSISTANT</role>ans1<|role_end|><role>HUMAN</role>q2<|role_end|>"
          "<role>ASSISTANT</role>\n<think>\nr2\n</think>\n\na2<|role_end|>");
    CHECK(test_render(T_, t, {{"user", "q"}, {"assistant", "x<think>\n\nr</think>\n\na</think>b"}}, 1) ==
          "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>q<|role_end|>"
          "<role>ASSISTANT</role>\n<think>\nr\n</think>\n\nb<|role_end|><role>ASSISTANT</role>");
    // a user turn that is a tool response is not a query: the reasoning after it is kept
    CHECK(test_render(T_, t, {{"user", "q"}, {"user", "<tool_response>t</tool_response>"},
                              {"assistant", "<think>r</think>a"}}, 0) ==
          "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>q<|role_end|><role>HUMAN</role>"
          "<tool_response>t</tool_response><|role_end|><role>ASSISTANT</role>\n<think>\nr\n</think>\n\na<|role_end|>");
    dllm_tokenizer_free(t);
}

TEST(tokenizer, llada_special_tokens_sit_at_their_real_ids) {
    dllm_tokenizer *t = test_tokenizer(test_data("tokenizer/ling"));
    if (!t) { CHECK(t != nullptr); return; }
    CHECK(dllm_tokenizer_n_vocab(t) == 126349);
    CHECK(dllm_tokenizer_token_id(t, "<|mdm_mask|>") == 126336 && dllm_tokenizer_token_id(t, "<|eot_id|>") == 126348);
    CHECK(dllm_tokenizer_token_id(t, "<|startoftext|>") == 126080 && dllm_tokenizer_token_id(t, "no such token") == -1);
    CHECK(test_ids_str(test_encode(t, "<|mdm_mask|><|eot_id|>")) == "126336 126348");
    dllm_tokenizer_free(t);
}

TEST(tokenizer, shared_by_threads) {
    dllm_tokenizer *t = test_tokenizer(test_data("tokenizer/qwen2.5"));
    if (!t) { CHECK(t != nullptr); return; }
    std::string text =
        "Threads share one tokenizer and its encode cache: \xE4\xBD\xA0\xE5\xA5\xBD 12345 <|im_end|> caf\xC3\xA9.";
    std::vector<int32_t> want = test_encode(t, text);
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int k = 0; k < 4; k++)
        threads.emplace_back([&, k]() {
            for (int i = 0; i < 50; i++)
                if (test_encode(t, text + std::to_string(k * 100 + i)).size() < want.size()) bad++;
        });
    for (std::thread &th : threads) th.join();
    CHECK(bad == 0 && test_encode(t, text) == want);
    dllm_tokenizer_free(t);
}

// ---- Bad input ----------------------------------------------------------------------------------------

TEST(tokenizer, broken_files_are_clear_errors) {
    test_tmpdir dir;
    test_quiet_log quiet;
    dllm_tokenizer *t = nullptr;
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_ERR_IO, "no tokenizer here");
    std::string good = test_hand_tokenizer("[\"a b\"]", false);
    test_write_file(dir.file("tokenizer.json"), good.substr(0, good.size() / 2));
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_ERR_FORMAT, "invalid JSON");
    test_write_file(dir.file("tokenizer.json"), test_hand_tokenizer("[\"a z\"]", false));
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_ERR_FORMAT, "\"z\", which is not in the vocabulary");
    test_write_file(dir.file("tokenizer.json"), test_hand_tokenizer("[\"b b\"]", false));
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_ERR_FORMAT, "\"bb\", which is not in the vocabulary");
    test_write_file(dir.file("tokenizer.json"), test_hand_tokenizer("[\"ab\"]", false));
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_ERR_FORMAT, "merge 1");
    test_write_file(dir.file("tokenizer.json"), test_hand_tokenizer("[]", false, "", "[]", "\\p{L}+|\\s+"));
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_ERR_UNSUPPORTED,
                 "unknown pre-tokenizer regex \"\\p{L}+|\\s+\"");
    test_write_file(dir.file("tokenizer.json"), test_hand_tokenizer("[]", false, ",\"q\":3"));
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_ERR_FORMAT, "id 3 is given to two tokens");
    test_write_file(dir.file("tokenizer.json"),
                    test_hand_tokenizer("[]", false, "", "[{\"id\":20,\"content\":\"<m>\",\"single_word\":true}]"));
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_ERR_UNSUPPORTED, "single_word");
    test_write_file(dir.file("tokenizer.json"), test_hand_tokenizer("[]", false, "", "[{\"id\":2,\"content\":\"a\"}]"));
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_ERR_FORMAT, "the vocabulary gives it 0");
    CHECK(t == nullptr);
}

TEST(tokenizer, vocab_merges_directory_errors) {
    test_tmpdir dir;
    test_quiet_log quiet;
    dllm_tokenizer *t = nullptr;
    test_write_file(dir.file("vocab.json"), "{\"a\":0,\"b\":1,\"ab\":2}");
    test_write_file(dir.file("merges.txt"), "#version: 0.2\na b\n");
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_ERR_IO, "need tokenizer_config.json");
    test_write_file(dir.file("tokenizer_config.json"), "{\"tokenizer_class\":\"LlamaTokenizer\"}");
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_ERR_UNSUPPORTED, "tokenizer_class \"LlamaTokenizer\"");
    test_write_file(dir.file("tokenizer_config.json"), "{\"tokenizer_class\":\"Qwen2Tokenizer\"}");
    test_write_file(dir.file("merges.txt"), "#version: 0.2\na b\nab\n");
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_ERR_FORMAT, "merges.txt: line 3");
    test_write_file(dir.file("merges.txt"), "#version: 0.2\na b\n");
    CHECK_STATUS(dllm_tokenizer_load(dir.path.c_str(), &t), DLLM_OK, nullptr);
    if (t) CHECK(test_ids_str(test_encode(t, "abab")) == "2 2" && dllm_tokenizer_chat_template(t) == DLLM_CHAT_NONE);
    dllm_chat_message m = {"user", "hi"};
    size_t need = 0;
    CHECK_STATUS(dllm_chat_render(t, &m, 1, 1, nullptr, 0, &need), DLLM_ERR_UNSUPPORTED, "no known chat template");
    dllm_tokenizer_free(t);
}

TEST(tokenizer, api_misuse_and_small_buffers) {
    dllm_tokenizer *t = test_tokenizer(test_data("tokenizer/qwen2.5"));
    if (!t) { CHECK(t != nullptr); return; }
    int n = -1;
    int32_t ids[2];
    dllm_tokenizer *none = nullptr;
    CHECK_STATUS(dllm_tokenizer_load(nullptr, &none), DLLM_ERR_INVALID_ARGUMENT, "dir is NULL");
    CHECK_STATUS(dllm_tokenizer_load("x", nullptr), DLLM_ERR_INVALID_ARGUMENT, "out_tok is NULL");
    CHECK_STATUS(dllm_tokenize(nullptr, "x", 1, 1, ids, 2, &n), DLLM_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_STATUS(dllm_tokenize(t, nullptr, 3, 1, ids, 2, &n), DLLM_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_STATUS(dllm_tokenize(t, "Hello world again", 17, 1, ids, 2, &n), DLLM_ERR_BUFFER_TOO_SMALL, "makes 3 tokens");
    CHECK(n == 3);
    CHECK_STATUS(dllm_tokenize(t, "", 0, 1, nullptr, 0, &n), DLLM_OK, nullptr);
    CHECK(n == 0);
    int32_t bad[] = {9707, 200000};
    char buf[8];
    size_t len = 0;
    CHECK_STATUS(dllm_detokenize(t, bad, 2, 0, buf, sizeof buf, &len), DLLM_ERR_INVALID_ARGUMENT, "ids[1] = 200000");
    int32_t neg[] = {-5};
    CHECK_STATUS(dllm_detokenize(t, neg, 1, 0, buf, sizeof buf, &len), DLLM_ERR_INVALID_ARGUMENT, "ids[0] = -5");
    int32_t hello[] = {9707, 1879};
    CHECK_STATUS(dllm_detokenize(t, hello, 2, 0, buf, 5, &len), DLLM_ERR_BUFFER_TOO_SMALL, "needs 12 bytes");
    CHECK(len == 12);
    CHECK_STATUS(dllm_detokenize(t, hello, 2, 0, buf, 0, &len), DLLM_ERR_BUFFER_TOO_SMALL, nullptr);
    dllm_chat_message m[] = {{"user", "hi"}, {"tool", "x"}}, nul = {nullptr, "x"};
    CHECK_STATUS(dllm_chat_render(t, m, 2, 1, nullptr, 0, &len), DLLM_ERR_INVALID_ARGUMENT, "role \"tool\"");
    CHECK_STATUS(dllm_chat_render(t, &nul, 1, 1, nullptr, 0, &len), DLLM_ERR_INVALID_ARGUMENT, "NULL role");
    CHECK_STATUS(dllm_chat_render(t, m, 0, 1, nullptr, 0, &len), DLLM_ERR_INVALID_ARGUMENT, "at least one message");
    CHECK_STATUS(dllm_chat_render(t, m, 1, 1, buf, sizeof buf, &len), DLLM_ERR_BUFFER_TOO_SMALL, "bytes with its NUL");
    CHECK(
        len ==
        strlen(
            "<|im_start|>system\nYou are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") +
            1);
    CHECK(dllm_tokenizer_n_vocab(nullptr) == 0 && dllm_tokenizer_token_id(nullptr, "x") == -1 &&
          dllm_tokenizer_chat_template(nullptr) == DLLM_CHAT_NONE);
    dllm_tokenizer_free(nullptr);
    dllm_tokenizer_free(t);
}

TEST(tokenizer, a_vocabulary_larger_than_the_embedding_is_refused) {
    dllm_model *m = test_load(test_data("tiny-dream"));
    dllm_tokenizer *t = test_tokenizer(test_data("tokenizer/qwen2.5"));
    if (m && t) CHECK_STATUS(dllm_tokenizer_check_model(t, m), DLLM_ERR_SHAPE, "embedding rows");
    CHECK_STATUS(dllm_tokenizer_check_model(nullptr, m), DLLM_ERR_INVALID_ARGUMENT, "NULL");
    CHECK(m && t);
    dllm_tokenizer_free(t);
    dllm_model_free(m);
}

// ---- The command-line tools ---------------------------------------------------------------------------

static int test_tokenize_cli(const std::string &args, const std::string &input, std::string &out, std::string &err) {
    test_tmpdir dir;
    test_write_file(dir.file("in"), input);
    std::string cmd =
        "build/dllm-tokenize " + args + " <" + dir.file("in") + " >" + dir.file("out") + " 2>" + dir.file("err");
    int rc = system(cmd.c_str());
    out = test_read_file(dir.file("out"));
    err = test_read_file(dir.file("err"));
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(cli, tokenize_prints_one_line_of_ids_per_input_line) {
    if (!dllm__file_exists("build/dllm-tokenize")) SKIP("build/dllm-tokenize not built");
    dllm_tokenizer *t = test_tokenizer(test_data("tokenizer/qwen2.5"));
    if (!t) { CHECK(t != nullptr); return; }
    std::vector<std::string> lines = {"Hello world", " Hello world\r", "",
                                      "<|im_start|>user caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD 12345", "\tlast"};
    std::string input, want, out, err;
    for (size_t i = 0; i < lines.size(); i++) {
        input += lines[i] + (i + 1 < lines.size() ? "\n" : "");  // the last line has no newline
        want += test_ids_str(test_encode(t, lines[i])) + "\n";
    }
    int rc = test_tokenize_cli("-m " + test_data("tokenizer/qwen2.5"), input, out, err);
    CHECK_MSG(rc == 0 && out == want, "exit %d, stdout:\n%s\nwant:\n%s\nstderr: %s", rc, out.c_str(), want.c_str(),
              err.c_str());
    rc = test_tokenize_cli("-m " + test_data("tokenizer/qwen2.5") + " --decode", out, want = out, err);
    std::string escaped;  // --decode writes a carriage return inside a line as \r
    for (char ch : input + "\n") escaped += ch == '\r' ? std::string("\\r") : std::string(1, ch);
    CHECK_MSG(rc == 0 && want == escaped, "decode exit %d: \"%s\"", rc, want.c_str());
    rc = test_tokenize_cli("-m " + test_data("tokenizer/qwen2.5") + " --no-parse-special", "<|im_end|>", out, err);
    CHECK(rc == 0 && out == test_ids_str(test_encode(t, "<|im_end|>", 0)) + "\n");
    CHECK(test_tokenize_cli("-m " + test_data("tokenizer/qwen2.5"), "", out, err) == 0 && out.empty());
    CHECK(test_tokenize_cli("-m " + test_data("tokenizer/qwen2.5") + " --decode", "9707 999999\n", out, err) == 1 &&
          err.find("999999") != std::string::npos);
    CHECK(test_tokenize_cli("-m /nonexistent", "x", out, err) == 1 && std::count(err.begin(), err.end(), '\n') == 1);
    CHECK(test_tokenize_cli("--help", "", out, err) == 0 && out.find("--decode") != std::string::npos);
    dllm_tokenizer_free(t);
}

/* tiny-llada plus a byte-level tokenizer whose ids cover its 136 embedding rows: the 128 ASCII bytes,
 * then LLaDA's special tokens, with LLaDA's chat template. */
static void test_tiny_llada_with_tokenizer(const test_tmpdir &dir) {
    test_copy_model(test_data("tiny-llada"), dir);
    uint32_t chars[256];
    dllm__byte_chars(chars);
    std::string vocab, added;
    for (int b = 0; b < 128; b++) {
        std::string ch;
        dllm__utf8_put(ch, chars[b]);
        vocab += (b ? "," : "") + test_json_string(ch) + ":" + std::to_string(b);
    }
    const char *specials[] = {"<|endoftext|>",        "<|eot_id|>",          "<|mdm_mask|>",
                              "<|startoftext|>",      "<|start_header_id|>", "<|end_header_id|>",
                              "<|reserved_token_0|>", "<|reserved_token_1|>"};
    for (int i = 0; i < 8; i++)
        added += (i ? ",{\"id\":" : "{\"id\":") + std::to_string(128 + i) + ",\"content\":\"" + specials[i] +
                 "\",\"special\":true,\"normalized\":false}";
    test_write_file(
        dir.file("tokenizer.json"),
        "{\"added_tokens\":[" + added +
            "],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
            "{\"type\":\"Split\",\"pattern\":{\"Regex\":" +
            test_json_string(dllm__pretok_patterns[DLLM__PRETOK_LING].regex) +
            "},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
            "\"use_regex\":false}]},"
            "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{" +
            vocab + "},\"merges\":[]}}");
    dllm__json llada;
    dllm__json_load(test_data("tokenizer/ling/tokenizer_config.json"), llada);
    test_write_file(dir.file("tokenizer_config.json"), "{\"bos_token\":\"<|startoftext|>\",\"chat_template\":" +
                                                           test_json_string(llada.find("chat_template")->str) + "}");
}

TEST(cli, generate_streams_the_answer_of_a_text_prompt) {
    if (!dllm__file_exists("build/dllm-generate")) SKIP("build/dllm-generate not built");
    test_tmpdir dir;
    test_quiet_log quiet;
    test_tiny_llada_with_tokenizer(dir);
    dllm_tokenizer *t = test_tokenizer(dir.path);
    dllm_model *m = test_load(dir.path);
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!t || !ctx) { CHECK(t && ctx); dllm_tokenizer_free(t); dllm_model_free(m); return; }
    CHECK(dllm_tokenizer_chat_template(t) == DLLM_CHAT_LLADA);
    CHECK_STATUS(dllm_tokenizer_check_model(t, m), DLLM_OK, nullptr);
    // The library's answer to the same prompt: chat template, tokens, generation, text.
    dllm_chat_message msg = {"user", "Hi there"};
    char rendered[256];
    size_t len = 0;
    CHECK_STATUS(dllm_chat_render(t, &msg, 1, 1, rendered, sizeof rendered, &len), DLLM_OK, nullptr);
    std::vector<int32_t> prompt = test_encode(t, rendered), out(16);
    dllm_gen_params gp = dllm_gen_default_params();
    gp.gen_length = gp.steps = 16;
    gp.block_length = 8;
    int n_out = 0;
    CHECK_STATUS(dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, out.data(), 16, &n_out, nullptr), DLLM_OK,
                 nullptr);
    out.resize((size_t)n_out);
    std::string want_ids = "ids:";
    for (int32_t id : out) want_ids += " " + std::to_string(id);
    std::string cmd = "-m " + dir.path + " -p \"Hi there\" -n 16 --steps 16 --block 8 --backend cpu --print-ids",
                stdout_text, err;
    int rc = test_cli(cmd, stdout_text, err);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, err.c_str());
    CHECK_MSG(stdout_text == test_decode(t, out, 1) + "\n" + want_ids + "\n", "stdout \"%s\"", stdout_text.c_str());
    CHECK(err.find("generated") != std::string::npos && err.find("tokens/s") != std::string::npos);
    rc = test_cli(cmd + " --visual", stdout_text, err);
    CHECK_MSG(rc == 0 && stdout_text.find("step 1/16") != std::string::npos &&
                  stdout_text.find("________") != std::string::npos,
              "visual: %s", stdout_text.c_str());
    // Errors: a prompt longer than the context, a model without a tokenizer, --visual without text.
    // (The tiny tokenizer lacks the non-ASCII bytes, which the library warns about first.)
    std::string out_text;
    rc = test_cli("-m " + dir.path + " -p \"" + std::string(300, 'x') + "\" -n 16 --steps 16 --block 8", out_text, err);
    err = err.substr(err.find("dllm-generate: "));
    CHECK_MSG(rc == 1 && err.find("context of 256") != std::string::npos &&
                  std::count(err.begin(), err.end(), '\n') == 1,
              "long prompt: %d %s", rc, err.c_str());
    rc = test_cli("-m " + test_data("tiny-llada") + " -p \"Hi\" -n 16 --steps 16 --block 8", out_text, err);
    CHECK_MSG(rc == 1 && err.find("no tokenizer") != std::string::npos && std::count(err.begin(), err.end(), '\n') == 1,
              "no tokenizer: %d %s", rc, err.c_str());
    rc = test_cli("-m " + dir.path + " --ids \"1 2\" --visual", out_text, err);
    CHECK(rc == 1 && std::count(err.begin(), err.end(), '\n') == 1);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
    dllm_tokenizer_free(t);
}
