/* Tests: JSON, safetensors, configs, weight binding, sharded indexes (CPU only). */

// ---- JSON -------------------------------------------------------------------------------------------

static dllm_status test_json(const char *text, dllm__json &out) {
    return dllm__json_parse(text, strlen(text), "test", out);
}

TEST(json, parses_values_and_escapes) {
    dllm__json j;
    CHECK_STATUS(test_json(" {\"a\": [1, -2.5e3, true, null, \"x\\u00e9\\ud83d\\ude00\\n\"], \"b\": {}} ", j), DLLM_OK,
                 nullptr);
    const dllm__json *a = j.find("a");
    CHECK(a && a->items.size() == 5);
    if (!a || a->items.size() != 5) return;
    CHECK(a->items[0].is_integer && a->items[0].integer == 1);
    CHECK(!a->items[1].is_integer && a->items[1].number == -2500.0);
    CHECK(a->items[2].kind == dllm__json::BOOL && a->items[2].boolean);
    CHECK(a->items[3].is_null());
    CHECK(a->items[4].str == "x\xc3\xa9\xf0\x9f\x98\x80\n");
    CHECK(j.find("b") && j.find("b")->kind == dllm__json::OBJ);
    CHECK(j.find("missing") == nullptr);
}

TEST(json, rejects_malformed_input) {
    const char *bad[] = {"", "{", "{\"a\":}", "[1,]", "{\"a\" 1}", "tru", "\"unterminated", "01", "1.", "-", "\"\\x\"",
                         "\"\\u12G4\"", "{} x", "[\"a\tb\"]", "{\"a\":1,}"};
    for (const char *t : bad) {
        dllm__json j;
        dllm_status s = test_json(t, j);
        CHECK_MSG(s == DLLM_ERR_FORMAT, "accepted malformed JSON: %s", t);
    }
}

TEST(json, bounds_nesting_depth) {
    std::string deep(100000, '[');
    dllm__json j;
    CHECK_STATUS(dllm__json_parse(deep.data(), deep.size(), "deep", j), DLLM_ERR_FORMAT, "nesting too deep");
    std::string ok = std::string(40, '[') + std::string(40, ']');
    CHECK_STATUS(dllm__json_parse(ok.data(), ok.size(), "ok", j), DLLM_OK, nullptr);
}

TEST(json, large_integers_stay_exact) {
    dllm__json j;
    CHECK_STATUS(test_json("[16031162368, 9007199254740993, 99999999999999999999]", j), DLLM_OK, nullptr);
    CHECK(j.items[0].is_integer && j.items[0].integer == 16031162368LL);
    CHECK(j.items[1].is_integer && j.items[1].integer == 9007199254740993LL);
    CHECK(!j.items[2].is_integer);  // overflows int64: kept as a double only
}

// ---- safetensors ------------------------------------------------------------------------------------

static dllm_status test_st_open_bytes(const test_tmpdir &dir, const std::string &bytes, dllm__safetensors &st) {
    std::string path = dir.file("t.safetensors");
    test_write_file(path, bytes);
    return dllm__st_open(path, true, st);
}

static test_st_builder test_small_st() {
    test_st_builder b;
    b.add_f32("a", {2, 3}, {1, 2, 3, 4, 5, 6});
    b.add("b", "BF16", {3}, test_bf16_bytes({0.5f, -2.0f, 3.25f}));
    b.add("c", "I32", {2}, std::string("\x07\x00\x00\x00\xff\xff\xff\xff", 8));
    b.add("scalar", "F32", {}, std::string("\x00\x00\x80\x3f", 4));
    b.add("empty", "F16", {0, 4}, "");
    return b;
}

TEST(safetensors, reads_valid_file) {
    test_tmpdir dir;
    for (int pad = 0; pad < 2; pad++) {  // unpadded headers leave data misaligned: must be realigned
        dllm__safetensors st;
        CHECK_STATUS(test_st_open_bytes(dir, test_small_st().bytes(pad != 0), st), DLLM_OK, nullptr);
        CHECK(st.tensors.size() == 5);
        for (const dllm__tensor &t : st.tensors) {
            if (t.name == "a") CHECK(t.shape == std::vector<int64_t>({2, 3}) && dllm__tensor_at(t, 5) == 6.0f);
            if (t.name == "b")
                CHECK(t.dtype == DLLM__BF16 && dllm__tensor_at(t, 2) == 3.25f && dllm__tensor_at(t, 1) == -2.0f);
            if (t.name == "scalar") CHECK(t.shape.empty() && t.numel == 1 && dllm__tensor_at(t, 0) == 1.0f);
            if (t.name == "empty") CHECK(t.numel == 0 && t.nbytes == 0);
            if (t.name == "c") CHECK(t.dtype == DLLM__I32 && t.nbytes == 8);
            CHECK(t.nbytes == 0 || (uintptr_t)t.data % std::max(1, dllm__dtypes[t.dtype].bits / 8) == 0);
        }
    }
}

TEST(safetensors, half_precision_conversions) {
    // F16: 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal), -0, inf
    const uint16_t h[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00};
    const float want[] = {1.0f, -2.0f, 65504.0f, 5.9604644775390625e-08f, -0.0f, INFINITY};
    for (int i = 0; i < 6; i++)
        CHECK_MSG(dllm__f16_to_f32(h[i]) == want[i], "f16 %04x -> %g", h[i], (double)dllm__f16_to_f32(h[i]));
    CHECK(signbit(dllm__f16_to_f32(0x8000)));
    CHECK(isnan(dllm__f16_to_f32(0x7E00)));
    CHECK(dllm__bf16_to_f32(0x3FC0) == 1.5f);
}

/* Each broken variant must fail with DLLM_ERR_FORMAT and a message naming the problem and the file. */
static void test_broken_st(dllm_test_state &T_, const std::string &bytes, const char *want_substr) {
    test_tmpdir dir;
    dllm__safetensors st;
    CHECK_STATUS(test_st_open_bytes(dir, bytes, st), DLLM_ERR_FORMAT, want_substr);
    CHECK_MSG(strstr(dllm_last_error(), "t.safetensors") != nullptr, "message lacks the file name: %s",
              dllm_last_error());
}

TEST(safetensors, rejects_truncated_and_oversized) {
    std::string good = test_small_st().bytes();
    test_broken_st(T_, good.substr(0, 5), "too short");
    test_broken_st(T_, good.substr(0, good.size() - 3), "truncated");
    test_broken_st(T_, good + "xyz", "trailing bytes");
    std::string past = good;
    past[0] = (char)0xF0;  // header length beyond the file
    past[1] = (char)0x7F;
    test_broken_st(T_, past, "runs past the end");
    std::string huge = good;
    for (int i = 0; i < 8; i++) huge[(size_t)i] = i == 4 ? 1 : 0;  // 2^32 > 100 MB
    test_broken_st(T_, huge, "exceeds");
}

TEST(safetensors, rejects_bad_headers) {
    test_st_builder b = test_small_st();
    std::string data = b.data();
    test_broken_st(T_, test_st_builder::assemble("[1,2]", ""), "does not start with '{'");
    test_broken_st(T_, test_st_builder::assemble("{\"a\": ", data), "invalid JSON");
    std::string h = b.header_json();
    std::string dup = h.substr(0, h.size() - 1) + ",\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}";
    test_broken_st(T_, test_st_builder::assemble(dup, data), "duplicate");
    std::string unk = h;
    unk.replace(unk.find("\"BF16\""), 6, "\"BF17\"");
    test_broken_st(T_, test_st_builder::assemble(unk, data), "unknown dtype");
    std::string meta = h;
    meta.replace(meta.find("{\"format\":\"pt\"}"), 15, "{\"format\":1}");
    test_broken_st(T_, test_st_builder::assemble(meta, data), "__metadata__");
    std::string neg = h;
    neg.replace(neg.find("[2,3]"), 5, "[2,-3]");
    test_broken_st(T_, test_st_builder::assemble(neg, data), "non-negative");
}

TEST(safetensors, rejects_bad_offsets) {
    test_st_builder b;
    b.add_f32("x", {2}, {1, 2});
    b.add_f32("y", {2}, {3, 4});
    std::string data = b.data();
    test_broken_st(
        T_,
        test_st_builder::assemble(
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"y\":{\"dtype\":\"F32\",\"shape\":[2],"
            "\"data_offsets\":[4,12]}}",
            data + "abcd"),
        "overlap");
    test_broken_st(
        T_,
        test_st_builder::assemble(
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"y\":{\"dtype\":\"F32\",\"shape\":[2],"
            "\"data_offsets\":[12,20]}}",
            data + "abcd"),
        "gap");
    test_broken_st(
        T_,
        test_st_builder::assemble(
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]},\"y\":{\"dtype\":\"F32\",\"shape\":[2],"
            "\"data_offsets\":[8,16]}}",
            data),
        "needs 12 bytes");
    test_broken_st(
        T_,
        test_st_builder::assemble(
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]},\"y\":{\"dtype\":\"F32\",\"shape\":[2],"
            "\"data_offsets\":[8,16]}}",
            data),
        "end 0 < begin 8");
    test_broken_st(
        T_,
        test_st_builder::assemble(
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]},\"y\":{\"dtype\":\"F32\",\"shape\":[2],"
            "\"data_offsets\":[8,16]}}",
            data),
        "data_offsets");
    test_broken_st(T_, test_st_builder::assemble(
        "{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}", data), "overflows");
}

TEST(safetensors, fuzzed_headers_never_crash) {
    // Random byte flips in a valid file: every outcome is OK or a clean FORMAT error.
    std::string good = test_small_st().bytes();
    test_tmpdir dir;
    uint64_t state = 12345;
    int errors = 0;
    for (int trial = 0; trial < 300; trial++) {
        std::string b = good;
        for (int k = 0; k < 3; k++) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            b[(size_t)((state >> 33) % b.size())] = (char)(state >> 13);
        }
        dllm__safetensors st;
        dllm_status s = test_st_open_bytes(dir, b, st);
        CHECK_MSG(s == DLLM_OK || s == DLLM_ERR_FORMAT, "trial %d: %s", trial, dllm_status_str(s));
        errors += s != DLLM_OK;
    }
    CHECK(errors > 100);
}

// ---- configs ----------------------------------------------------------------------------------------

static dllm_status test_config(const std::string &text, dllm__config &c) {
    dllm__json j;
    dllm_status s = dllm__json_parse(text.data(), text.size(), "config.json", j);
    return s != DLLM_OK ? s : dllm__config_parse(j, "config.json", c);
}

/* The real LLaDA config with one key replaced (value is raw JSON). */
static std::string test_llada_config_with(const char *key, const char *value) {
    std::string t = test_read_file(test_data("real-configs/llada-8b-instruct.config.json"));
    std::string k = std::string("\"") + key + "\":";
    size_t at = t.find(k);
    if (at == std::string::npos) return t.substr(0, t.rfind('}')) + ", " + k + " " + value + "}";
    size_t v0 = at + k.size(), v1 = t.find_first_of(",\n}", v0);
    return t.substr(0, v0) + " " + value + t.substr(v1);
}

TEST(config, parses_real_llada_8b) {
    dllm__config c;
    CHECK_STATUS(test_config(test_read_file(test_data("real-configs/llada-8b-instruct.config.json")), c), DLLM_OK,
                 nullptr);
    CHECK(c.family == DLLM_FAMILY_LLADA);
    CHECK(c.n_embd == 4096 && c.n_layer == 32 && c.n_head == 32 && c.n_head_kv == 32 && c.head_dim == 128);
    CHECK(c.n_ff == 12288 && c.n_vocab == 126464 && c.vocab_size == 126464 && c.max_seq_len == 4096);
    CHECK(c.mask_id == 126336 && c.eos_id == 126081 && c.pad_id == 126081);
    CHECK(c.rope_theta == 500000.0f && c.norm_eps == 1e-5f);
    CHECK(!c.qkv_bias && !c.tied_embeddings && !c.shift_logits && !c.scale_logits && !c.gemma_norm);
}

TEST(config, parses_dream_7b_shape) {
    const char *dream =
        "{\"model_type\": \"Dream\", \"hidden_size\": 3584, \"num_hidden_layers\": 28, \"num_attention_heads\": 28,"
        " \"num_key_value_heads\": 4, \"intermediate_size\": 18944, \"vocab_size\": 152064, \"rms_norm_eps\": 1e-06,"
        " \"rope_theta\": 1000000.0, \"rope_scaling\": null, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\","
        " \"max_position_embeddings\": 131072, \"mask_token_id\": 151666, \"eos_token_id\": 151643, \"pad_token_id\": "
        "151643,"
        " \"use_sliding_window\": false, \"sliding_window\": null}";
    dllm__config c;
    CHECK_STATUS(test_config(dream, c), DLLM_OK, nullptr);
    CHECK(c.family == DLLM_FAMILY_DREAM && c.n_head == 28 && c.n_head_kv == 4 && c.head_dim == 128 && c.n_ff == 18944);
    CHECK(c.qkv_bias && c.shift_logits && c.n_vocab == 152064 && c.mask_id == 151666);
}

TEST(config, rejects_unsupported_values) {
    struct { const char *key, *value; dllm_status want; const char *substr; } cases[] = {
        {"alibi", "true", DLLM_ERR_UNSUPPORTED, "\"alibi\""},
        {"rope", "false", DLLM_ERR_UNSUPPORTED, "\"rope\""},
        {"block_type", "\"sequential\"", DLLM_ERR_UNSUPPORTED, "block_type"},
        {"activation_type", "\"gelu\"", DLLM_ERR_UNSUPPORTED, "activation_type"},
        {"layer_norm_type", "\"default\"", DLLM_ERR_UNSUPPORTED, "layer_norm_type"},
        {"include_bias", "true", DLLM_ERR_UNSUPPORTED, "include_bias"},
        {"input_emb_norm", "true", DLLM_ERR_UNSUPPORTED, "input_emb_norm"},
        {"block_group_size", "2", DLLM_ERR_UNSUPPORTED, "block_group_size"},
        {"n_heads", "0", DLLM_ERR_UNSUPPORTED, "n_heads"},
        {"n_heads", "48", DLLM_ERR_UNSUPPORTED, "not a multiple"},
        {"n_kv_heads", "5", DLLM_ERR_UNSUPPORTED, "key/value heads"},
        {"d_model", "\"4096\"", DLLM_ERR_FORMAT, "d_model"},
        {"d_model", "4096.5", DLLM_ERR_FORMAT, "d_model"},
        {"mask_token_id", "null", DLLM_ERR_FORMAT, "mask_token_id"},
        {"mask_token_id", "999999", DLLM_ERR_FORMAT, "outside the vocabulary"},
        {"model_type", "\"gpt2\"", DLLM_ERR_UNSUPPORTED, "model_type"},
        {"embedding_size", "100", DLLM_ERR_UNSUPPORTED, "embedding_size"},
        {"rope_theta", "-1", DLLM_ERR_UNSUPPORTED, "rope_theta"},
    };
    for (auto &k : cases) {
        dllm__config c;
        CHECK_STATUS(test_config(test_llada_config_with(k.key, k.value), c), k.want, k.substr);
    }
    dllm__config c;
    std::string no_d = test_read_file(test_data("real-configs/llada-8b-instruct.config.json"));
    no_d.replace(no_d.find("\"d_model\""), 9, "\"x_model\"");
    CHECK_STATUS(test_config(no_d, c), DLLM_ERR_FORMAT, "required key \"d_model\"");
    CHECK_STATUS(test_config("[1]", c), DLLM_ERR_FORMAT, "not a JSON object");
}

TEST(config, supported_variants) {
    dllm__config c;
    CHECK_STATUS(test_config(test_llada_config_with("layer_norm_type", "\"gemma_rms\""), c), DLLM_OK, nullptr);
    CHECK(c.gemma_norm);
    CHECK_STATUS(test_config(test_llada_config_with("multi_query_attention", "true"), c), DLLM_ERR_FORMAT,
                 "contradicts n_kv_heads");
    std::string mqa = test_llada_config_with("multi_query_attention", "true");
    mqa.replace(mqa.find("\"n_kv_heads\""), 12, "\"n_kv_headz\"");
    CHECK_STATUS(test_config(mqa, c), DLLM_OK, nullptr);
    CHECK(c.n_head_kv == 1);
    CHECK_STATUS(test_config(test_llada_config_with("n_kv_heads", "8"), c), DLLM_OK, nullptr);
    CHECK(c.n_head_kv == 8);
    CHECK_STATUS(test_config(test_llada_config_with("weight_tying", "true"), c), DLLM_OK, nullptr);
    CHECK(c.tied_embeddings);
}

// ---- weights and indexes ----------------------------------------------------------------------------

/* The real LLaDA-8B index: its 291 names are exactly what the config demands, with matching byte total. */
TEST(weights, real_llada_index_maps_every_tensor) {
    dllm__config c;
    CHECK_STATUS(test_config(test_read_file(test_data("real-configs/llada-8b-instruct.config.json")), c), DLLM_OK,
                 nullptr);
    dllm__json idx;
    CHECK_STATUS(dllm__json_load(test_data("real-configs/llada-8b-instruct.index.json"), idx), DLLM_OK, nullptr);
    std::vector<std::pair<std::string, std::string>> map;
    CHECK_STATUS(dllm__parse_index(idx, "index", map), DLLM_OK, nullptr);
    std::vector<dllm__wspec> specs = dllm__expected_weights(c);
    CHECK_MSG(map.size() == 291 && specs.size() == 291, "index %zu, expected %zu", map.size(), specs.size());
    std::unordered_map<std::string, std::string> shard_of(map.begin(), map.end());
    int64_t bytes = 0;
    int per_kind[DLLM__W_HEAD + 1] = {0};
    for (const dllm__wspec &s : specs) {
        CHECK_MSG(shard_of.count(s.name), "expected tensor %s missing from the index", s.name.c_str());
        int64_t n = 1;
        for (int64_t d : s.shape) n *= d;
        bytes += 2 * n;
        per_kind[s.kind]++;
    }
    CHECK(bytes == idx.find("metadata")->find("total_size")->integer);
    CHECK(per_kind[DLLM__W_Q] == 32 && per_kind[DLLM__W_DOWN] == 32 && per_kind[DLLM__W_EMBED] == 1 &&
          per_kind[DLLM__W_HEAD] == 1);
    CHECK(shard_of["model.transformer.blocks.0.attn_out.weight"] == "model-00001-of-00006.safetensors");
}

/* The Fast-dLLM v2 index has the Qwen2.5-7B layout that Dream-7B shares: 339 tensors. */
/* The tensor names of Fast-dLLM v2 7B's safetensors index (tests/data/real-configs): Qwen2-7B's layout, Dream's too. */
static std::unordered_set<std::string> test_fast_dllm_v2_index_names(dllm_test_state &T_) {
    dllm__json idx;
    CHECK_STATUS(dllm__json_load(test_data("real-configs/fast-dllm-v2-7b.index.json"), idx), DLLM_OK, nullptr);
    std::vector<std::pair<std::string, std::string>> map;
    CHECK_STATUS(dllm__parse_index(idx, "index", map), DLLM_OK, nullptr);
    std::unordered_set<std::string> names;
    for (auto &e : map) names.insert(e.first);
    return names;
}

TEST(weights, qwen2_layout_matches_dream_expectation) {
    dllm__config c;
    const char *dream =
        "{\"model_type\": \"Dream\", \"hidden_size\": 3584, \"num_hidden_layers\": 28, \"num_attention_heads\": 28,"
        " \"num_key_value_heads\": 4, \"intermediate_size\": 18944, \"vocab_size\": 152064, \"rms_norm_eps\": 1e-06,"
        " \"rope_theta\": 1000000.0, \"max_position_embeddings\": 2048, \"mask_token_id\": 151666}";
    CHECK_STATUS(test_config(dream, c), DLLM_OK, nullptr);
    const std::unordered_set<std::string> names = test_fast_dllm_v2_index_names(T_);
    std::vector<dllm__wspec> specs = dllm__expected_weights(c);
    CHECK(specs.size() == 339 && names.size() == 339);
    int64_t bytes = 0;
    for (const dllm__wspec &s : specs) {
        CHECK_MSG(names.count(s.name), "%s missing", s.name.c_str());
        int64_t n = 1;
        for (int64_t d : s.shape) n *= d;
        bytes += 2 * n;
    }
    CHECK(bytes == 15231233024LL);
}

TEST(weights, loads_fixtures) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    CHECK(m != nullptr);
    if (m) {
        dllm_model_info info;
        CHECK_STATUS(dllm_model_get_info(m, &info), DLLM_OK, nullptr);
        CHECK(info.family == DLLM_FAMILY_LLADA && info.n_vocab == 136 && info.mask_id == 130 && info.eos_id == 128 &&
              info.eot_id == 129);
        CHECK(info.n_layer == 3 && info.head_dim == 64 && info.n_ff == 200 && !info.shift_logits);
    }
    dllm_model_free(m);
    m = test_load(test_data("tiny-dream"));  // sharded, BF16 + F16 + F32 tensors
    CHECK(m != nullptr);
    if (m) {
        dllm_model_info info;
        dllm_model_get_info(m, &info);
        CHECK(info.family == DLLM_FAMILY_DREAM && info.n_head == 3 && info.n_head_kv == 1 && info.shift_logits &&
              info.eot_id == 139);
    }
    dllm_model_free(m);
}

/* Rewrites tiny-llada's model.safetensors with `edit` applied to the tensor list. */
static void test_rewrite_llada(const test_tmpdir &dir,
                               const std::function<void(std::vector<dllm__tensor> &, test_st_builder &)> &edit) {
    dllm__safetensors st;
    dllm__st_open(test_data("tiny-llada/model.safetensors"), false, st);
    std::vector<dllm__tensor> ts = st.tensors;
    test_st_builder b;
    edit(ts, b);
    for (const dllm__tensor &t : ts)
        b.add(t.name, dllm__dtypes[t.dtype].name, t.shape, std::string((const char *)t.data, t.nbytes));
    test_copy_model(test_data("tiny-llada"), dir);
    test_write_file(dir.file("model.safetensors"), b.bytes());
}

TEST(weights, missing_tensor_is_named) {
    test_tmpdir dir;
    test_rewrite_llada(dir, [](std::vector<dllm__tensor> &ts, test_st_builder &) {
        ts.erase(
            std::remove_if(ts.begin(), ts.end(),
                           [](const dllm__tensor &t) { return t.name == "model.transformer.blocks.1.up_proj.weight"; }),
            ts.end());
    });
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load(dir.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_SHAPE,
                 "missing tensor model.transformer.blocks.1.up_proj.weight (expected shape [200, 128])");
    CHECK(m == nullptr);
}

TEST(weights, shape_mismatch_names_file_tensor_and_shapes) {
    test_tmpdir dir;
    test_rewrite_llada(dir, [](std::vector<dllm__tensor> &ts, test_st_builder &) {
        for (dllm__tensor &t : ts)
            if (t.name == "model.transformer.blocks.2.k_proj.weight") t.shape = {64, 256};
    });
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load(dir.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_SHAPE,
                 "tensor model.transformer.blocks.2.k_proj.weight: expected shape [128, 128], found [64, 256]");
    CHECK(strstr(dllm_last_error(), "model.safetensors") != nullptr);
}

TEST(weights, wrong_dtype_and_extra_tensor) {
    test_tmpdir dir;
    test_rewrite_llada(dir, [](std::vector<dllm__tensor> &ts, test_st_builder &) {
        for (dllm__tensor &t : ts)
            if (t.name == "model.transformer.ln_f.weight") t.dtype = DLLM__I16;
    });
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load(dir.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_UNSUPPORTED, "dtype I16");

    test_tmpdir dir2;
    test_rewrite_llada(dir2, [](std::vector<dllm__tensor> &, test_st_builder &b) {
        b.add_f32("rotary.inv_freq", {2}, {1, 2});
    });
    static std::string logged;
    logged.clear();
    dllm_log_set([](dllm_log_level, const char *text, void *) { logged += text; }, nullptr, DLLM_LOG_WARN);
    CHECK_STATUS(dllm_model_load(dir2.path.c_str(), dllm_model_default_params(), &m), DLLM_OK, nullptr);
    dllm_log_set(nullptr, nullptr, DLLM_LOG_WARN);
    CHECK_MSG(logged.find("rotary.inv_freq") != std::string::npos, "no warning naming the unused tensor: %s",
              logged.c_str());
    dllm_model_free(m);
}

TEST(weights, missing_files_and_bad_index) {
    test_tmpdir dir;
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load(dir.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_IO, "no config.json");
    CHECK_STATUS(dllm_model_load("/nonexistent/dllm", dllm_model_default_params(), &m), DLLM_ERR_IO,
                 "/nonexistent/dllm");
    test_write_file(dir.file("config.json"), test_read_file(test_data("tiny-llada/config.json")));
    CHECK_STATUS(dllm_model_load(dir.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_IO,
                 "neither model.safetensors");
    test_write_file(dir.file("config.json"), "{\"model_type\": \"llada\",");
    CHECK_STATUS(dllm_model_load(dir.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_FORMAT,
                 "config.json: invalid JSON");

    test_tmpdir d2;
    test_copy_model(test_data("tiny-dream"), d2);
    std::string idx = test_read_file(d2.file("model.safetensors.index.json"));
    std::string evil = idx;
    evil.replace(evil.find("model-00002-of-00002.safetensors"), 32, "../../../../../../../etc/passwd");
    test_write_file(d2.file("model.safetensors.index.json"), evil);
    CHECK_STATUS(dllm_model_load(d2.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_FORMAT,
                 "must be a file name");
    std::string wrong = idx;
    size_t at = wrong.find("model-00001-of-00002.safetensors");
    wrong.replace(at, 32, "model-00002-of-00002.safetensors");  // first entry points at the other shard
    test_write_file(d2.file("model.safetensors.index.json"), wrong);
    CHECK_STATUS(dllm_model_load(d2.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_FORMAT,
                 "does not hold it");
    test_write_file(d2.file("model.safetensors.index.json"), idx);
    unlink(d2.file("model-00001-of-00002.safetensors").c_str());
    CHECK_STATUS(dllm_model_load(d2.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_IO,
                 "model-00001-of-00002.safetensors");
    CHECK(m == nullptr);
}

TEST(weights, mmap_and_read_agree) {
    dllm_model_params p = dllm_model_default_params();
    p.use_mmap = 0;
    dllm_model *a = nullptr, *b = test_load(test_data("tiny-dream"));
    CHECK_STATUS(dllm_model_load(test_data("tiny-dream").c_str(), p, &a), DLLM_OK, nullptr);
    if (a && b) {
        CHECK(a->files[0]->file->mapped == false && b->files[0]->file->mapped == true);
        CHECK(a->layers[1].bq == b->layers[1].bq && a->final_norm == b->final_norm);
        CHECK(memcmp(a->embed->data, b->embed->data, a->embed->nbytes) == 0);
    }
    dllm_model_free(a);
    dllm_model_free(b);
}
