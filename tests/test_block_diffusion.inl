/* Tests: block diffusion (Fast-dLLM v2, Nemotron-Labs-Diffusion) on the CPU backend: configs and loaders in the
 * real layouts, YaRN and Llama-4 query scaling against transformers' formulas, the block-causal K/V-cache
 * forward, and token traces of Fast-dLLM v2's official generate from tools/make_bd_fixtures.py (an independent
 * numpy implementation). */

static const char *test_nemotron_8b_config =
    "{\"ar_loss_weight\": 1.0, \"architectures\": [\"NemotronLabsDiffusionModel\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"attn_implementation\": \"sdpa\", \"block_size\": 32, \"bos_token_id\": 1, "
    "\"dlm_loss_weight\": null,"
    " \"dlm_paradigm\": \"bidirectional\", \"dp_varying_mask_ratio\": false, \"eos_token_id\": 11, \"head_dim\": 128, "
    "\"hidden_act\": \"silu\","
    " \"hidden_size\": 4096, \"initializer_range\": 0.02, \"intermediate_size\": 14336, \"mask_token_id\": 100,"
    " \"max_position_embeddings\": 262144, \"mlp_bias\": false, \"model_type\": \"nemotron_labs_diffusion\", "
    "\"num_attention_heads\": 32,"
    " \"num_hidden_layers\": 34, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_parameters\": "
    "{\"beta_fast\": 32.0,"
    " \"beta_slow\": 1.0, \"factor\": 16.0, \"llama_4_scaling_beta\": 0.1, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,"
    " \"original_max_position_embeddings\": 16384, \"rope_theta\": 1000000.0, \"rope_type\": \"yarn\"}, "
    "\"sliding_window\": null,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"5.0.0\", "
    "\"use_cache\": false,"
    " \"vocab_size\": 131072}";

static int64_t test_weight_elems(const std::vector<dllm__wspec> &specs) {
    int64_t n = 0;
    for (const dllm__wspec &s : specs) {
        int64_t e = 1;
        for (int64_t d : s.shape) e *= d;
        n += e;
    }
    return n;
}

// ---- configs and loading -------------------------------------------------------------------------------

/* The real Fast_dLLM_v2_7B config.json parses to the Qwen2.5-7B shape with its block; the index maps exactly
 * the tensors the config demands. */
TEST(block_diffusion, real_fast_dllm_v2_config_and_index) {
    dllm__config c;
    CHECK_STATUS(test_config(test_read_file(test_data("real-configs/fast-dllm-v2-7b.config.json")), c), DLLM_OK,
                 nullptr);
    CHECK(c.family == DLLM_FAMILY_FAST_DLLM_V2 && dllm__is_block_diffusion(c));
    CHECK(c.n_layer == 28 && c.n_embd == 3584 && c.n_ff == 18944 && c.n_head == 28 && c.n_head_kv == 4 &&
          c.head_dim == 128);
    CHECK(c.n_vocab == 152064 && c.max_seq_len == 32768 && c.bd_size == 32 && c.bd_mask_block == 32 &&
          !c.bd_causal_context);
    CHECK(c.qkv_bias && c.shift_logits && !c.tied_embeddings && !c.yarn && c.rope_theta == 1e6f && c.norm_eps == 1e-6f);
    CHECK(c.mask_id == -1 && c.stop_id == 151645);  // the mask comes from the tokenizer files (next test)
    const std::unordered_set<std::string> names = test_fast_dllm_v2_index_names(T_);
    std::vector<dllm__wspec> specs = dllm__expected_weights(c);
    CHECK(specs.size() == 339 && names.size() == 339);
    for (const dllm__wspec &s : specs) CHECK_MSG(names.count(s.name), "%s missing from the index", s.name.c_str());
    CHECK(2 * test_weight_elems(specs) == 15231233024LL);
}

/* A directory with the real config, index and added_tokens.json but no shards: the config and the tokenizer's
 * mask/stop ids are accepted, then the first shard is reported missing. */
TEST(block_diffusion, real_fast_dllm_v2_dir_without_weights) {
    test_tmpdir dir;
    test_write_file(dir.file("config.json"), test_read_file(test_data("real-configs/fast-dllm-v2-7b.config.json")));
    test_write_file(dir.file("model.safetensors.index.json"),
                    test_read_file(test_data("real-configs/fast-dllm-v2-7b.index.json")));
    test_write_file(dir.file("added_tokens.json"),
                    test_read_file(test_data("real-configs/fast-dllm-v2-7b.added_tokens.json")));
    dllm__config c;
    CHECK_STATUS(test_config(test_read_file(dir.file("config.json")), c), DLLM_OK, nullptr);
    CHECK_STATUS(dllm__find_block_tokens(dir.path, c), DLLM_OK, nullptr);
    CHECK(c.mask_id == 151665 && c.stop_id == 151645);
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load(dir.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_IO,
                 "-of-00004.safetensors: No such file");
    CHECK(m == nullptr);
    // Without the tokenizer files the mask id is unknown, and the config still loads (a generation names mask_id then).
    unlink(dir.file("added_tokens.json").c_str());
    dllm__config bare;
    CHECK_STATUS(test_config(test_read_file(dir.file("config.json")), bare), DLLM_OK, nullptr);
    CHECK_STATUS(dllm__find_block_tokens(dir.path, bare), DLLM_OK, nullptr);
    CHECK(bare.mask_id == -1);
    CHECK_STATUS(dllm_model_load(dir.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_IO,
                 "-of-00004.safetensors: No such file");
    // A mask_token_id in config.json names it.
    std::string cfg = test_read_file(test_data("real-configs/fast-dllm-v2-7b.config.json"));
    cfg.insert(cfg.rfind('}'), ", \"mask_token_id\": 151665");
    test_write_file(dir.file("config.json"), cfg);
    dllm__config named;
    CHECK_STATUS(test_config(cfg, named), DLLM_OK, nullptr);
    CHECK_STATUS(dllm__find_block_tokens(dir.path, named), DLLM_OK, nullptr);
    CHECK(named.mask_id == 151665);
}

/* A Fast-dLLM v2 checkpoint with neither tokenizer files nor mask_token_id loads with mask_id -1; generating needs
 * dllm_gen_params.mask_id (--mask-id), and with it gives the tokens of the model that names its mask. */
TEST(block_diffusion, checkpoint_without_a_mask_id_generates_with_one_given) {
    test_tmpdir dir;
    test_copy_model(test_data("tiny-fast-dllm-v2"), dir);
    unlink(dir.file("tokenizer_config.json").c_str());
    dllm_model *bare = test_load(dir.path), *named = test_load(test_data("tiny-fast-dllm-v2"));
    dllm_ctx *bare_ctx = bare ? test_ctx(bare) : nullptr, *named_ctx = named ? test_ctx(named) : nullptr;
    if (!bare_ctx || !named_ctx) {
        CHECK(bare_ctx && named_ctx);
    } else {
        dllm_model_info info, named_info;
        dllm_model_get_info(bare, &info);
        dllm_model_get_info(named, &named_info);
        CHECK(info.mask_id == -1 && named_info.mask_id == 155);
        const int32_t prompt[] = {5, 17, 42, 9, 3};
        std::vector<int32_t> out(64, -7), want(64, -7);
        int n = -1, n_want = -1;
        dllm_gen_params gp = dllm_gen_default_params();
        gp.gen_length = 32;
        CHECK_STATUS(dllm_generate(bare_ctx, prompt, 5, gp, out.data(), 64, &n, nullptr), DLLM_ERR_INVALID_ARGUMENT,
                     "mask_id (--mask-id)");
        gp.mask_id = 155;
        CHECK_STATUS(dllm_generate(bare_ctx, prompt, 5, gp, out.data(), 64, &n, nullptr), DLLM_OK, nullptr);
        gp.mask_id = -1;
        CHECK_STATUS(dllm_generate(named_ctx, prompt, 5, gp, want.data(), 64, &n_want, nullptr), DLLM_OK, nullptr);
        CHECK(n == n_want && out == want);
        if (dllm__file_exists("build/dllm-generate")) {  // the CLI: refused without --mask-id, the same ids with it
            std::string stdout_text, err;
            CHECK(test_cli("-m " + dir.path + " --ids \"5 17 42 9 3\" -n 32", stdout_text, err) == 1 &&
                  err.find("--mask-id") != std::string::npos);
            std::string ids = "ids:";
            for (int i = 0; i < n; i++) ids += " " + std::to_string(out[(size_t)i]);
            int rc = test_cli("-m " + dir.path + " --ids \"5 17 42 9 3\" -n 32 --mask-id 155 --backend cpu --print-ids",
                              stdout_text, err);
            CHECK_MSG(rc == 0 && stdout_text == ids + "\n", "exit %d, stdout \"%s\", want \"%s\" (%s)", rc,
                      stdout_text.c_str(), ids.c_str(), err.c_str());
        }
    }
    dllm_ctx_free(bare_ctx);
    dllm_ctx_free(named_ctx);
    dllm_model_free(bare);
    dllm_model_free(named);
}

/* Nemotron-Labs-Diffusion-8B (models.md 4.2): the Ministral-3 shape, YaRN and Llama-4 settings, encoder.* names;
 * the parameter count is the published 8,489,553,920. */
TEST(block_diffusion, nemotron_8b_config) {
    dllm__config c;
    CHECK_STATUS(test_config(test_nemotron_8b_config, c), DLLM_OK, nullptr);
    CHECK(c.family == DLLM_FAMILY_NEMOTRON_DIFFUSION && c.n_layer == 34 && c.n_embd == 4096 && c.n_ff == 14336);
    CHECK(c.n_head == 32 && c.n_head_kv == 8 && c.head_dim == 128 && c.n_vocab == 131072 && !c.qkv_bias);
    CHECK(c.mask_id == 100 && c.stop_id == 11 && c.bd_size == 32 && c.bd_mask_block == 32 && c.bd_causal_context &&
          c.shift_logits);
    CHECK(c.yarn && c.yarn_factor == 16 && c.yarn_orig_max == 16384 && c.yarn_attention_factor == 1.0 &&
          c.rope_theta == 1e6f);
    CHECK(c.llama4_beta == 0.1f && c.llama4_orig_max == 16384 && c.norm_eps == 1e-5f);
    std::vector<dllm__wspec> specs = dllm__expected_weights(c);
    CHECK(specs.front().name == "encoder.embed_tokens.weight" && specs.back().name == "diffusion_head.weight");
    CHECK(specs[1].name == "encoder.layers.0.input_layernorm.weight");
    CHECK(test_weight_elems(specs) == 8489553920LL);
    // The shift switch, and values dllm does not implement.
    std::string no_shift = test_nemotron_8b_config;
    no_shift.insert(no_shift.rfind('}'), ", \"shift_logits\": false");
    CHECK_STATUS(test_config(no_shift, c), DLLM_OK, nullptr);
    CHECK(!c.shift_logits);
    std::string bias = test_nemotron_8b_config;
    bias.replace(bias.find("\"attention_bias\": false"), 23, "\"attention_bias\": true ");
    CHECK_STATUS(test_config(bias, c), DLLM_ERR_UNSUPPORTED, "attention_bias");
    std::string rope = test_nemotron_8b_config;
    rope.replace(rope.find("\"yarn\""), 6, "\"ntk\" ");
    CHECK_STATUS(test_config(rope, c), DLLM_ERR_UNSUPPORTED, "rope_type");
}

TEST(block_diffusion, tiny_models_load) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));  // sharded, mask and stop from the tokenizer files only
    dllm_model_info info;
    CHECK(m != nullptr);
    if (m) {
        CHECK_STATUS(dllm_model_get_info(m, &info), DLLM_OK, nullptr);
        CHECK(info.family == DLLM_FAMILY_FAST_DLLM_V2 && info.mask_id == 155 && info.stop_id == 152 &&
              info.block_size == 32);
        CHECK(info.shift_logits == 1 && info.n_head == 6 && info.n_head_kv == 2 && info.head_dim == 16 &&
              info.n_vocab == 160);
    }
    dllm_model_free(m);
    m = test_load(test_data("tiny-nemotron-diffusion"));
    CHECK(m != nullptr);
    if (m) {
        CHECK_STATUS(dllm_model_get_info(m, &info), DLLM_OK, nullptr);
        CHECK(info.family == DLLM_FAMILY_NEMOTRON_DIFFUSION && info.mask_id == 100 && info.stop_id == 11 &&
              info.block_size == 8);
        CHECK(info.head_dim == 24 && info.n_embd == 80 && info.n_vocab == 131);
    }
    dllm_model_free(m);
    // Nemotron's head stored as lm_head.weight (an alias the loaders accept): rename it in the header, same length.
    test_tmpdir dir;
    std::string st = test_read_file(test_data("tiny-nemotron-diffusion/model.safetensors"));
    size_t at = st.find("\"diffusion_head.weight\"");
    CHECK(at != std::string::npos);
    if (at == std::string::npos) return;
    st.replace(at, 23, "\"lm_head.weight\"       ");
    test_write_file(dir.file("model.safetensors"), st);
    test_write_file(dir.file("config.json"), test_read_file(test_data("tiny-nemotron-diffusion/config.json")));
    m = test_load(dir.path);
    CHECK(m != nullptr && m->head != nullptr && m->head->name == "lm_head.weight");
    dllm_model_free(m);
}

// ---- RoPE ----------------------------------------------------------------------------------------------

/* YaRN inverse frequencies and attention factor of the real 8B config against an independent numpy computation
 * of transformers' _compute_yarn_parameters (float32, tests/data/yarn_nemotron_8b.json), within 2 ulp
 * (float32 pow differs between libms); and the Llama-4 query scale at positions around
 * original_max_position_embeddings. */
TEST(block_diffusion, yarn_and_llama4_scaling_match_transformers_formulas) {
    dllm__json fx;
    CHECK_STATUS(dllm__json_load(test_data("yarn_nemotron_8b.json"), fx), DLLM_OK, nullptr);
    dllm__config c;
    CHECK_STATUS(test_config(test_nemotron_8b_config, c), DLLM_OK, nullptr);
    const dllm__json *bits = fx.find("inv_freq_f32_bits");
    std::vector<float> inv = dllm__rope_inv_freq(c);
    CHECK(bits && bits->items.size() == 64 && inv.size() == 64);
    int worst = 0, n_ramp = 0;
    for (size_t j = 0; bits && j < std::min(inv.size(), bits->items.size()); j++) {
        uint32_t want = (uint32_t)bits->items[j].integer, got;
        memcpy(&got, &inv[j], 4);
        worst = std::max(worst, abs((int)(got - want)));
        float plain = 1.0f / powf(1e6f, (float)(2 * j) / 128.0f);
        n_ramp +=
            inv[j] != plain && fabsf(inv[j] - plain / 16) > 1e-6f * plain;  // neither extrapolated nor interpolated
    }
    printf("    YaRN inv_freq: largest difference %d ulp, %d frequencies on the ramp\n", worst, n_ramp);
    CHECK(worst <= 2 && n_ramp > 0);
    CHECK(fabs(fx.find("attention_factor")->number - c.yarn_attention_factor) < 1e-15);
    const dllm__json *pos = fx.find("llama4_positions"), *scale = fx.find("llama4_scale");
    for (size_t i = 0; pos && scale && i < pos->items.size(); i++) {
        int32_t p = (int32_t)pos->items[i].integer;
        std::vector<float> q((size_t)c.n_head * c.head_dim, 1.0f);
        dllm__cpu_llama4_scale(c, q.data(), 1, &p);
        CHECK_MSG(q[0] == (float)scale->items[i].number && q.back() == q[0], "position %d: %.9g, want %.9g", p, q[0],
                  scale->items[i].number);
    }
}

// ---- the forward -----------------------------------------------------------------------------------------

TEST(block_diffusion, fast_dllm_v2_matches_golden_logits) { test_golden_logits(T_, "tiny-fast-dllm-v2"); }

TEST(block_diffusion, nemotron_matches_golden_logits) { test_golden_logits(T_, "tiny-nemotron-diffusion"); }

/* The K/V cache path computes the function of the plain block-causal forward: a 2-block prefill (COMMIT) then a
 * block against the cache gives the rows of one forward over all 3 blocks; a BLOCK_FULL forward then a
 * SUB_BLOCK forward of unchanged tokens gives the BLOCK_FULL rows again (the block cache is then not stale). */
TEST(block_diffusion, kv_cache_forward_equals_plain_forward) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    const dllm__config &c = m->cfg;
    const int V = c.n_vocab, B = 32, n = 3 * B - 5;  // a partial last block
    std::vector<int32_t> ids((size_t)n);
    for (int i = 0; i < n; i++) ids[(size_t)i] = (int32_t)((i * 37 + 11) % 150);
    dllm__pool pool(2);
    dllm__cpu_buffers buf;
    std::vector<float> cos_t, sin_t;
    dllm__rope_tables_cfg(c, 256, cos_t, sin_t);
    const std::vector<dllm__fp8_layer> no_fp8;
    dllm__bd_kv plain_kv;
    plain_kv.reset(c, n);
    dllm__bd_call plain;
    plain.ids = ids.data(), plain.T = n, plain.mask_block = B, plain.r0 = 0, plain.r1 = n;
    std::vector<float> want((size_t)n * V, NAN), got((size_t)n * V, NAN);
    dllm__cpu_bd_forward(*m, pool, buf, plain_kv, plain, cos_t.data(), sin_t.data(), want.data(), no_fp8);
    dllm__bd_kv kv;
    kv.reset(c, 4 * B);
    dllm__bd_call prefill = plain, block = plain;
    prefill.kind = DLLM__BD_COMMIT, prefill.T = 2 * B, prefill.r1 = 2 * B;
    dllm__cpu_bd_forward(*m, pool, buf, kv, prefill, cos_t.data(), sin_t.data(), got.data(), no_fp8);
    CHECK(kv.n == 2 * B);
    block.ids = ids.data() + 2 * B, block.T = n - 2 * B, block.r1 = n - 2 * B;
    dllm__cpu_bd_forward(*m, pool, buf, kv, block, cos_t.data(), sin_t.data(), got.data() + (size_t)2 * B * V, no_fp8);
    CHECK(kv.n == 2 * B);  // a step forward appends nothing
    double err = test_rel_err(got.data(), want.data(), got.size());
    printf("    prefill + cached block vs one forward: relative difference %.2e\n", err);
    CHECK(err <= 1e-5);
    // Block cache: the sub-block's rows (unchanged tokens) equal the full block forward's rows.
    kv.reset(c, 4 * B);
    dllm__cpu_bd_forward(*m, pool, buf, kv, prefill, cos_t.data(), sin_t.data(), got.data(), no_fp8);
    std::vector<int32_t> blk(ids.begin() + B, ids.begin() + 2 * B);
    dllm__bd_call full;
    full.kind = DLLM__BD_BLOCK_FULL, full.ids = blk.data(), full.T = B, full.mask_block = B, full.r0 = 0, full.r1 = B;
    std::vector<float> full_out((size_t)B * V, NAN), sub_out((size_t)8 * V, NAN);
    dllm__cpu_bd_forward(*m, pool, buf, kv, full, cos_t.data(), sin_t.data(), full_out.data(), no_fp8);
    CHECK(kv.block_rows == B && kv.n == 2 * B);
    dllm__bd_call sub;
    sub.kind = DLLM__BD_SUB_BLOCK, sub.ids = blk.data() + 16, sub.T = 8, sub.offset = 16, sub.r0 = 0, sub.r1 = 8;
    dllm__cpu_bd_forward(*m, pool, buf, kv, sub, cos_t.data(), sin_t.data(), sub_out.data(), no_fp8);
    err = test_rel_err(sub_out.data(), full_out.data() + (size_t)16 * V, sub_out.size());
    printf("    sub-block over the block cache vs the full block: relative difference %.2e\n", err);
    CHECK(err <= 1e-5);
    dllm_model_free(m);
}

// ---- decoding ----------------------------------------------------------------------------------------------

struct test_bd_recorder {
    std::vector<std::vector<std::pair<int32_t, int32_t>>> steps;  // (position, token) committed by each step
};

static int test_bd_on_step(const dllm_step_info *info, void *user) {
    test_bd_recorder *r = (test_bd_recorder *)user;
    std::vector<std::pair<int32_t, int32_t>> s;
    for (int i = 0; i < info->n_committed; i++)
        s.push_back({info->committed_pos[i], info->canvas[info->committed_pos[i]]});
    r->steps.push_back(s);
    return 0;
}

/* A golden trace case's generation parameters: the reference's lengths, sub-block, block cache and threshold, greedy,
 * the stop token kept in the output as the reference keeps it. */
static dllm_gen_params test_bd_case_params(const dllm__json &cs) {
    dllm_gen_params gp = dllm_gen_default_params();
    gp.gen_length = (int)cs.find("gen_length")->integer;
    gp.block_length = cs.find("block_size") ? (int)cs.find("block_size")->integer : 32;
    gp.sub_block_length = (int)cs.find("sub_block")->integer;
    gp.block_cache = cs.find("block_cache") && cs.find("block_cache")->boolean;
    const dllm__json *tau = cs.find("threshold");
    if (tau && !tau->is_null()) gp.unmask = DLLM_UNMASK_THRESHOLD, gp.threshold = tau->number;
    gp.stop_at_eos = 0;
    return gp;
}

/* Every case of the fixture: the CPU backend's output, every step's commits, the step and forward counts equal
 * the independent reference's, token for token. */
static void test_bd_traces(dllm_test_state &T_, const char *fixture) {
    dllm__json root;
    CHECK_STATUS(dllm__json_load(test_data(fixture) + "/golden_traces.json", root), DLLM_OK, nullptr);
    const dllm__json *cases = root.find("cases");
    CHECK(cases && cases->items.size() >= 8);
    dllm_model *m = test_load(test_data(fixture));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx || !cases) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    // Cases with "shift": false run on a copy whose config.json sets the switch "shift_logits": false.
    test_tmpdir noshift_dir;
    dllm_model *noshift_model = nullptr;
    dllm_ctx *noshift_ctx = nullptr;
    int exact = 0;
    for (const dllm__json &cs : cases->items) {
        const std::string name = cs.find("name")->str;
        dllm_ctx *run_ctx = ctx;
        const dllm__json *shift = cs.find("shift");
        if (shift && !shift->boolean) {
            if (!noshift_ctx) {
                std::string cfg = test_read_file(test_data(fixture) + "/config.json");
                cfg.insert(cfg.rfind('}'), ", \"shift_logits\": false");
                test_write_file(noshift_dir.file("config.json"), cfg);
                test_write_file(noshift_dir.file("model.safetensors"),
                                test_read_file(test_data(fixture) + "/model.safetensors"));
                noshift_model = test_load(noshift_dir.path);
                noshift_ctx = noshift_model ? test_ctx(noshift_model) : nullptr;
                CHECK(noshift_model && !noshift_model->cfg.shift_logits && noshift_ctx);
                if (!noshift_ctx) continue;
            }
            run_ctx = noshift_ctx;
        }
        std::vector<int32_t> prompt = test_json_ids(cs.find("prompt")), want = test_json_ids(cs.find("output"));
        dllm_gen_params gp = test_bd_case_params(cs);
        test_bd_recorder rec;
        gp.on_step = test_bd_on_step, gp.on_step_data = &rec;
        std::vector<int32_t> out((size_t)gp.gen_length + 1, -7);
        int n_out = 0;
        dllm_gen_stats stats;
        CHECK_STATUS(
            dllm_generate(run_ctx, prompt.data(), (int)prompt.size(), gp, out.data(), (int)out.size(), &n_out, &stats),
            DLLM_OK, nullptr);
        out.resize((size_t)std::max(0, n_out));
        const dllm__json *steps = cs.find("steps");
        bool steps_same = steps && steps->items.size() == rec.steps.size();
        for (size_t s = 0; steps_same && s < rec.steps.size(); s++) {
            const dllm__json &ws = steps->items[s];
            steps_same = ws.items.size() == rec.steps[s].size();
            for (size_t k = 0; steps_same && k < ws.items.size(); k++)
                steps_same = ws.items[k].items[0].integer == rec.steps[s][k].first &&
                             ws.items[k].items[1].integer == rec.steps[s][k].second;
        }
        bool same = out == want && steps_same && stats.steps == (int)cs.find("n_steps")->integer &&
                    stats.forwards == (int)cs.find("forwards")->integer && stats.n_generated == n_out;
        exact += same;
        CHECK_MSG(same, "%s %s: %d ids (want %zu), %d steps (want %lld), %d forwards (want %lld), steps %s", fixture,
                  name.c_str(), n_out, want.size(), stats.steps, (long long)cs.find("n_steps")->integer, stats.forwards,
                  (long long)cs.find("forwards")->integer, steps_same ? "equal" : "differ");
    }
    printf("    %s: %d of %zu traces identical\n", fixture, exact, cases->items.size());
    dllm_ctx_free(noshift_ctx);
    dllm_model_free(noshift_model);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(block_diffusion, fast_dllm_v2_traces_match_reference) { test_bd_traces(T_, "tiny-fast-dllm-v2"); }

TEST(block_diffusion, nemotron_traces_match_reference) { test_bd_traces(T_, "tiny-nemotron-diffusion"); }

/* stop_at_eos (the default) ends the output before the stop token; the official output (the fixture case
 * L10_tau1, which stops) keeps it. */
TEST(block_diffusion, stop_at_eos_drops_the_stop_token) {
    dllm__json root;
    CHECK_STATUS(dllm__json_load(test_data("tiny-fast-dllm-v2/golden_traces.json"), root), DLLM_OK, nullptr);
    const dllm__json *cs = nullptr;
    for (const dllm__json &c : root.find("cases")->items)
        if (c.find("name")->str == "L10_tau1") cs = &c;
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx || !cs) { CHECK(ctx && cs); dllm_ctx_free(ctx); dllm_model_free(m); return; }
    std::vector<int32_t> prompt = test_json_ids(cs->find("prompt")), official = test_json_ids(cs->find("output"));
    CHECK(!official.empty() && official.back() == 152);
    dllm_gen_params gp = dllm_gen_default_params();
    gp.gen_length = 64;
    std::vector<int32_t> out(65, -1);
    int n = 0;
    CHECK_STATUS(dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, out.data(), 65, &n, nullptr), DLLM_OK,
                 nullptr);
    out.resize((size_t)std::max(n, 0));
    official.pop_back();
    CHECK_MSG(out == official, "%d ids, want the official %zu without its stop token", n, official.size());
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* A cancelled generation's output is the canvas so far (dllm_step_fn), alone and in a batch, even where it holds a
 * committed stop token (a finished one's output ends there). */
struct test_bd_cancel_trace {
    std::vector<int32_t> generated;  // the canvas after the prompt, at the cancelling step
};
static int test_bd_cancel_at_first_step(const dllm_step_info *info, void *user_data) {
    ((test_bd_cancel_trace *)user_data)
        ->generated.assign(info->canvas + info->prompt_len, info->canvas + info->canvas_len);
    return 1;
}

TEST(block_diffusion, cancelled_output_is_the_canvas_so_far) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    dllm_model_info info;
    CHECK_STATUS(dllm_model_get_info(m, &info), DLLM_OK, nullptr);
    const int32_t prompt[] = {3, 17, 42, 9, 11, 23};
    int32_t stop = -1;  // then a token the first step committed: a stop token inside the cancelled canvas
    for (int pass = 0; pass < 2; pass++)
        for (int stop_at_eos = 0; stop_at_eos < 2; stop_at_eos++)
            for (int batched = 0; batched < 2; batched++) {
                test_bd_cancel_trace trace;
                dllm_gen_params gp = dllm_gen_default_params();
                gp.gen_length = 32, gp.stop_id = stop, gp.stop_at_eos = stop_at_eos;
                gp.on_step = test_bd_cancel_at_first_step, gp.on_step_data = &trace;
                std::vector<int32_t> out(64, -7);
                int n = -1;
                dllm_status s;
                if (batched) {
                    const dllm_batch_item item = {prompt, 6, gp, out.data(), 64};
                    dllm_batch_result r;
                    s = dllm_generate_batch(ctx, &item, 1, &r, nullptr);
                    n = r.n_out;
                } else {
                    s = dllm_generate(ctx, prompt, 6, gp, out.data(), 64, &n, nullptr);
                }
                out.resize((size_t)std::max(n, 0));
                CHECK_MSG(s == DLLM_ERR_CANCELLED && !trace.generated.empty() && out == trace.generated,
                          "stop id %d, stop_at_eos %d%s: %s, %d ids, the canvas after the prompt has %zu", stop,
                          stop_at_eos, batched ? ", batched" : "", dllm_status_str(s), n, trace.generated.size());
                if (pass == 0)
                    for (int32_t id : trace.generated)
                        if (id != info.mask_id && stop < 0) stop = id;
            }
    CHECK_MSG(stop >= 0, "the first step committed nothing after the prompt");
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

// ---- API: backend choice and validation ------------------------------------------------------------------

/* Block diffusion runs on either backend: a GPU context where there is a GPU (a clear "no device" error elsewhere), and
 * AUTO picks the GPU when it is usable, the CPU otherwise. */
TEST(block_diffusion, backend_choice_takes_the_gpu_when_usable) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    std::string why;
    const bool gpu = dllm__gpu_usable(0, why);
    dllm_ctx_params p = dllm_ctx_default_params();
    p.backend = DLLM_BACKEND_GPU;
    dllm_ctx *ctx = nullptr;
    if (gpu) {
        CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_OK, nullptr);
        CHECK(ctx && dllm_ctx_get_backend(ctx) == DLLM_BACKEND_GPU);
    } else {
        CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_NO_DEVICE, "GPU backend requested");
        CHECK(ctx == nullptr);
    }
    dllm_ctx_free(ctx);
    ctx = nullptr;
    p.backend = DLLM_BACKEND_AUTO;
    p.n_threads = 2;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_OK, nullptr);
    CHECK(ctx && dllm_ctx_get_backend(ctx) == (gpu ? DLLM_BACKEND_GPU : DLLM_BACKEND_CPU));
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(block_diffusion, rejects_options_that_do_not_apply) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    std::vector<int32_t> prompt = {1, 2, 3, 4, 5}, out(128, 0);
    auto gen = [&](void (*edit)(dllm_gen_params &), int cap = 128, int n_prompt = 5) {
        dllm_gen_params gp = dllm_gen_default_params();
        gp.gen_length = 32;
        edit(gp);
        return dllm_generate(ctx, prompt.data(), n_prompt, gp, out.data(), cap, nullptr, nullptr);
    };
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.cfg_scale = 1; }), DLLM_ERR_UNSUPPORTED, "cfg_scale");
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.temperature = 0.5f; }), DLLM_ERR_UNSUPPORTED, "temperature");
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.kv_cache = DLLM_KV_CACHE_DUAL; }), DLLM_ERR_UNSUPPORTED, "kv_cache");
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.unmask = DLLM_UNMASK_FACTOR; }), DLLM_ERR_UNSUPPORTED, "unmask");
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.dpad = DLLM_DPAD_UNIFORM; }), DLLM_ERR_UNSUPPORTED, "DPad");
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.top_k = 5; }), DLLM_ERR_UNSUPPORTED,
                 "top_k");  // greedy: no filter may be ignored silently
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.top_p = 0.9f; }), DLLM_ERR_UNSUPPORTED, "top_p");
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.min_p = 0.05f; }), DLLM_ERR_UNSUPPORTED, "min_p");
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.eos_id = 10; }), DLLM_ERR_UNSUPPORTED, "stop_id");
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.eot_id = 99999; }), DLLM_ERR_UNSUPPORTED, "stop_id");
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.sub_block_length = 12; }), DLLM_ERR_INVALID_ARGUMENT,
                 "must divide block_length");
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.gen_length = 40; }), DLLM_ERR_INVALID_ARGUMENT,
                 "multiple of block_length");
    CHECK_STATUS(gen([](dllm_gen_params &g) {
                     g.unmask = DLLM_UNMASK_THRESHOLD;
                     g.threshold = 1.5;
                 }),
                 DLLM_ERR_INVALID_ARGUMENT, "threshold");
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.block_cache = 2; }), DLLM_ERR_INVALID_ARGUMENT, "block_cache");
    CHECK_STATUS(gen([](dllm_gen_params &g) { g.stop_id = 999; }), DLLM_ERR_INVALID_ARGUMENT, "stop_id");
    // 5 prompt ids, one block: up to 32 + 1 - 5 = 28 ids; a prompt of 32: 33.
    CHECK_STATUS(gen([](dllm_gen_params &) {}, 27), DLLM_ERR_BUFFER_TOO_SMALL, "writes up to 28 ids");
    CHECK_STATUS(gen([](dllm_gen_params &) {}, 28), DLLM_OK, nullptr);
    prompt.assign(32, 9);
    CHECK_STATUS(gen([](dllm_gen_params &) {}, 32, 32), DLLM_ERR_BUFFER_TOO_SMALL, "writes up to 33 ids");
    {  // *n_out is the capacity needed (33, not gen_length), so a caller that resizes to it succeeds
        dllm_gen_params gp = dllm_gen_default_params();
        gp.gen_length = 32;
        int need = -1, n = -1;
        CHECK_STATUS(dllm_generate(ctx, prompt.data(), 32, gp, out.data(), 32, &need, nullptr),
                     DLLM_ERR_BUFFER_TOO_SMALL, nullptr);
        CHECK_MSG(need == 33, "BUFFER_TOO_SMALL reported %d ids needed, the bound is 33", need);
        CHECK_STATUS(dllm_generate(ctx, prompt.data(), 32, gp, out.data(), need, &n, nullptr), DLLM_OK, nullptr);
        CHECK(n >= 0 && n <= need);
    }
    prompt[3] = 155;
    CHECK_STATUS(gen([](dllm_gen_params &) {}, 33, 32), DLLM_ERR_INVALID_ARGUMENT, "mask id");
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* A backend that forwards to another and has room for `room` committed rows (bd_rows_that_fit). */
struct test_bd_cramped : dllm__backend_impl {
    std::unique_ptr<dllm__backend_impl> inner;
    int64_t room;
    test_bd_cramped(std::unique_ptr<dllm__backend_impl> b, int64_t rows) : inner(std::move(b)), room(rows) {}
    dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) override {
        return inner->logits(ids, n, r0, r1, out);
    }
    dllm_status begin_block(dllm__decode &st) override { return inner->begin_block(st); }
    dllm_status step(dllm__decode &st, std::vector<int32_t> &committed, bool want_host) override {
        return inner->step(st, committed, want_host);
    }
    dllm_status bd_begin(int rows) override { return inner->bd_begin(rows); }
    dllm_status bd_forward(const dllm__bd_call &call, float *logits) override {
        return inner->bd_forward(call, logits);
    }
    dllm_status bd_rows_that_fit(int, int64_t &rows) const override {
        rows = room;
        return DLLM_OK;
    }
};

/* The context's capacity is checked before a generation runs, each error naming the length that fits and what to
 * change: prompt + gen_length past the context's positions (max_tokens 128), and a committed K/V cache past what the
 * backend holds (100 rows: a prompt of 40 has one whole block, so gen_length 32 needs 96 rows and 64 needs 128). */
TEST(block_diffusion, capacity_errors_name_what_fits) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    dllm_ctx_params p = dllm_ctx_default_params();
    p.backend = DLLM_BACKEND_CPU, p.n_threads = 2, p.max_tokens = 128;
    dllm_ctx *ctx = nullptr;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_OK, nullptr);
    if (!ctx) { dllm_model_free(m); return; }
    std::vector<int32_t> prompt(40), out(200);
    for (size_t i = 0; i < prompt.size(); i++) prompt[i] = (int32_t)(i * 7 % 150);
    auto gen = [&](int gen_length) {
        dllm_gen_params gp = dllm_gen_default_params();
        gp.gen_length = gen_length;
        return dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, out.data(), (int)out.size(), nullptr, nullptr);
    };
    CHECK_STATUS(
        gen(96), DLLM_ERR_INVALID_ARGUMENT,
        "prompt (40) + gen_length (-n) 96 + 1 tokens exceeds the context's limit of 128 (max_tokens; the model's "
        "positions end at 256): "
        "prompt + gen_length may be 127 tokens at most (gen_length 64 with this prompt)");
    ctx->impl.reset(new test_bd_cramped(std::move(ctx->impl), 100));
    CHECK_STATUS(
        gen(64), DLLM_ERR_OUT_OF_MEMORY,
        "the committed K/V cache of prompt (40) + gen_length (-n) 64 needs 128 rows (0.0 MiB at 256 bytes a token, "
        "kv_quant none) and the "
        "device has room for 100: prompt + gen_length may be 68 tokens at most (gen_length 32 with this prompt); or "
        "quantise the cache "
        "(kv_quant, --kv-quant soloq-kv4: 88 bytes a token)");
    CHECK_STATUS(gen(32), DLLM_OK, nullptr);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

// ---- CLI -----------------------------------------------------------------------------------------------------

static const dllm__json *test_bd_case(const dllm__json &root, const char *name) {
    for (const dllm__json &c : root.find("cases")->items)
        if (c.find("name")->str == name) return &c;
    return nullptr;
}

/* dllm-generate takes the block from the model and prints the library's (the reference's) ids; --sub-block,
 * --block-cache, --threshold, --mask-id and --stop-id reach the library. */
TEST(block_diffusion, cli_options_and_model_defaults) {
    if (!dllm__file_exists("build/dllm-generate")) SKIP("build/dllm-generate not built");
    dllm__json root;
    CHECK_STATUS(dllm__json_load(test_data("tiny-fast-dllm-v2/golden_traces.json"), root), DLLM_OK, nullptr);
    struct { const char *name, *args; } runs[] = {
        {"L40_tau0.3_bc", "-n 64 --threshold 0.3 --block-cache --mask-id 155"},            // block 32 from the model
        {"B8_L11_tau0.25", "-n 24 --block 8 --sub-block 4 --threshold 0.25 --stop-id 152"},  // stops
    };
    for (auto &r : runs) {
        const dllm__json *c = test_bd_case(root, r.name);
        CHECK(c != nullptr);
        if (!c) continue;
        std::string ids, out, err, want = "ids:";
        for (int32_t t : test_json_ids(c->find("prompt"))) ids += std::to_string(t) + " ";
        for (int32_t t : test_json_ids(c->find("output"))) want += " " + std::to_string(t);
        // The CPU backend: its ids are the reference's
        // (the GPU's equal them up to near-ties: gpu.block_diffusion_decoding_matches_cpu)
        int rc = test_cli("-m " + test_data("tiny-fast-dllm-v2") + " --backend cpu --ids \"" + ids + "\" " + r.args +
                              " --no-stop-at-eos --print-ids",
                          out, err);
        CHECK_MSG(rc == 0 && out == want + "\n", "%s: exit %d, stdout \"%s\", want \"%s\" (%s)", r.name, rc,
                  out.c_str(), want.c_str(), err.c_str());
    }
    // --stop-id: the first generated token of a case as the stop token ends the output before it, at once.
    const dllm__json *c = test_bd_case(root, "L40_tau1");
    if (!c) { CHECK(c != nullptr); return; }
    std::string ids, out, err;
    for (int32_t t : test_json_ids(c->find("prompt"))) ids += std::to_string(t) + " ";
    std::string stop = std::to_string(c->find("output")->items[0].integer);
    int rc = test_cli("-m " + test_data("tiny-fast-dllm-v2") + " --backend cpu --ids \"" + ids + "\" -n 64 --stop-id " +
                          stop + " --print-ids",
                      out, err);
    CHECK_MSG(rc == 0 && out == "ids:\n", "exit %d, stdout \"%s\" (%s)", rc, out.c_str(), err.c_str());
    CHECK(test_cli("-m " + test_data("tiny-fast-dllm-v2") + " --ids \"1 2\" --sub-block x", out, err) == 1);
    CHECK(test_cli("-m " + test_data("tiny-fast-dllm-v2") + " --ids \"1 2\" -n 64 --sub-block 5", out, err) == 1 &&
          err.find("divide") != std::string::npos);
    CHECK(test_cli("--help", out, err) == 0 && out.find("--block-cache") != std::string::npos);
}
