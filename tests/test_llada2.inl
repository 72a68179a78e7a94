/* Tests: LLaDA2 (llada2_moe) on the CPU backend: config.json and its errors, the tensors of the real mini shape, the
 * router's group-limited top-k against a brute force, the forward against a naive double-precision implementation
 * (every expert computed, loops over heads and keys) on a tiny random checkpoint written here in the hub layout
 * (sharded), the committed-block cache against the uncached loop bit for bit, both generate loops' rules on scripted
 * logits, and token traces of the official code (tools/make_llada2_fixtures.py) when tests/data/llada2 holds them. */

// ---- a tiny random LLaDA2 checkpoint in the hub layout ----------------------------------------------------------

/* Awkward sizes: head_dim 12 with 6 rotated dims, 5 heads over 1 K/V head... on a hidden size of 40. */
struct test_llada2_shape {
    int H = 40, n_layer = 3, n_head = 4, n_kv = 2, hd = 12, ff = 24, E = 12, n_group = 4, topk_group = 2, top_k = 3;
    int moe_ff = 10, shared = 1, dense = 1, V = 97;
    int32_t mask = 96, eos = 95;
    double theta = 10000, scale = 2.5;
};

static std::string test_llada2_config(const test_llada2_shape &s, const char *extra = "") {
    return dllm__format(
        "{\"architectures\": [\"LLaDA2MoeModelLM\"], \"model_type\": \"llada2_moe\", \"hidden_size\": %d,"
        " \"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,"
        " \"intermediate_size\": %d, \"num_experts\": %d, \"n_group\": %d, \"topk_group\": %d,"
        " \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d, \"num_shared_experts\": %d,"
        " \"first_k_dense_replace\": %d, \"vocab_size\": %d, \"max_position_embeddings\": 512, \"rope_theta\": %g,"
        " \"partial_rotary_factor\": 0.5, \"rms_norm_eps\": 1e-06, \"routed_scaling_factor\": %g, \"use_bias\": false,"
        " \"use_qkv_bias\": false, \"norm_head\": false, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\","
        " \"score_function\": \"sigmoid\", \"moe_router_enable_expert_bias\": true, \"rope_scaling\": null,"
        " \"mask_token_id\": %d, \"eos_token_id\": %d, \"pad_token_id\": %d%s}",
        s.H, s.n_layer, s.n_head, s.n_kv, s.hd, s.ff, s.E, s.n_group, s.topk_group, s.top_k, s.moe_ff, s.shared,
        s.dense, s.V, s.theta, s.scale, (int)s.mask, (int)s.eos, (int)s.eos, extra);
}

/* The tensors of a random checkpoint, kept by name for the naive forward. Norm weights near 1, expert biases small
 * (they change the selection, not the weights), linears ~ 1/sqrt(fan-in). */
struct test_llada2_weights {
    std::map<std::string, std::vector<float>> w;
    std::map<std::string, std::vector<int64_t>> shape;
    const std::vector<float> &operator[](const std::string &n) const { return w.at(n); }
};

static test_llada2_weights test_llada2_random(const test_llada2_shape &s, uint32_t seed) {
    dllm__config c;
    test_config(test_llada2_config(s), c);
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    test_llada2_weights tw;
    for (const dllm__wspec &spec : dllm__expected_weights(c)) {
        int64_t n = 1;
        for (int64_t d : spec.shape) n *= d;
        const bool norm = spec.shape.size() == 1 && spec.kind != DLLM__W_EXPERT_BIAS;
        const float sd = spec.kind == DLLM__W_EXPERT_BIAS ? 0.05f
                         : spec.shape.size() == 2      ? 1.0f / sqrtf((float)spec.shape[1])
                                                       : 0.2f;
        std::vector<float> v((size_t)n);
        for (float &x : v) x = (norm ? 1.0f : 0.0f) + sd * normal(rng);
        tw.w[spec.name] = v, tw.shape[spec.name] = spec.shape;
    }
    return tw;
}

/* Writes config.json and the weights as two shards with model.safetensors.index.json (the hub's layout). */
static void test_llada2_write(const test_tmpdir &dir, const test_llada2_shape &s, const test_llada2_weights &tw,
                              const char *extra_config = "") {
    test_write_file(dir.file("config.json"), test_llada2_config(s, extra_config));
    test_st_builder shard[2];
    std::string map;
    size_t i = 0;
    for (auto &kv : tw.w) {
        const int k = (int)(i++ % 2);
        shard[k].add_f32(kv.first, tw.shape.at(kv.first), kv.second);
        map += dllm__format("%s\"%s\": \"model-0000%d-of-00002.safetensors\"", map.empty() ? "" : ", ",
                            kv.first.c_str(), k + 1);
    }
    for (int k = 0; k < 2; k++)
        test_write_file(dir.file(dllm__format("model-0000%d-of-00002.safetensors", k + 1).c_str()), shard[k].bytes());
    test_write_file(dir.file("model.safetensors.index.json"), "{\"metadata\": {}, \"weight_map\": {" + map + "}}");
}

/* The checkpoint of tw written into dir and loaded; null (a failed check) when it does not load. */
static dllm_model *test_llada2_load(dllm_test_state &T_, const test_tmpdir &dir, const test_llada2_shape &s,
                                    const test_llada2_weights &tw) {
    test_llada2_write(dir, s, tw);
    dllm_model *m = test_load(dir.path);
    CHECK(m != nullptr);
    return m;
}

// ---- config and tensors ----------------------------------------------------------------------------------------

/* dFactory's LLaDA2.0-mini config (the hub's keys; its model_type is the trainer's) parses to the real shape, and
 * the tensors it demands count the model card's ~16B parameters. */
TEST(llada2, real_mini_config_and_tensors) {
    std::string t = test_read_file(test_data("real-configs/llada2-mini.dfactory.config.json"));
    size_t at = t.find("llada2_moe_veomni");
    CHECK(at != std::string::npos);
    t.replace(at, strlen("llada2_moe_veomni"), "llada2_moe");
    dllm__config c;
    CHECK_STATUS(test_config(t, c), DLLM_OK, nullptr);
    CHECK(c.family == DLLM_FAMILY_LLADA2 && !dllm__is_block_diffusion(c));
    CHECK(c.n_layer == 20 && c.n_embd == 2048 && c.n_head == 16 && c.n_head_kv == 4 && c.head_dim == 128);
    CHECK(c.rotary_dim == 64 && c.qk_norm && c.rope_theta == 600000.0f && c.norm_eps == 1e-6f);
    CHECK(c.n_expert == 256 && c.n_expert_used == 8 && c.n_expert_group == 8 && c.n_group_used == 4);
    CHECK(c.n_ff == 5120 && c.n_ff_expert == 512 && c.n_ff_shared == 512 && c.n_dense_layers == 1);
    CHECK(c.routed_scale == 2.5f && c.n_vocab == 157184 && !c.tied_embeddings && !c.shift_logits);
    CHECK(c.mask_id == 156895 && c.eos_id == 156892 && c.pad_id == 156892);  // generate()'s defaults
    std::vector<dllm__wspec> specs = dllm__expected_weights(c);
    CHECK(specs.size() == 3 + 20 * 6 + 3 + 19 * (2 + 256 * 3 + 3));
    const int64_t n = test_weight_elems(specs);
    CHECK_MSG(n > 16000000000LL && n < 16600000000LL, "%lld parameters", (long long)n);
    bool names = false;
    for (const dllm__wspec &s : specs)
        names = names || s.name == "model.layers.19.mlp.experts.255.down_proj.weight";
    CHECK(names);
}

/* The config with one piece of text replaced. */
static std::string test_llada2_config_edit(const char *from, const char *to) {
    std::string t = test_llada2_config(test_llada2_shape());
    size_t at = t.find(from);
    if (at != std::string::npos) t.replace(at, strlen(from), to);
    return t;
}

/* Unsupported or inconsistent values are errors naming the key. */
TEST(llada2, config_errors_name_the_key) {
    struct {
        const char *from, *to;
        dllm_status want;
        const char *names;
    } cases[] = {
        {"\"n_group\": 4", "\"n_group\": 5", DLLM_ERR_UNSUPPORTED, "n_group"},  // 12 experts do not split in 5
        {"\"n_group\": 4", "\"n_group\": 12", DLLM_ERR_UNSUPPORTED, "n_group"},  // groups of 1: no top 2
        {"\"topk_group\": 2", "\"topk_group\": 5", DLLM_ERR_UNSUPPORTED, "topk_group"},  // more than 4 groups
        {"\"num_experts_per_tok\": 3", "\"num_experts_per_tok\": 7", DLLM_ERR_UNSUPPORTED, "num_experts_per_tok"},
        {"\"use_bias\": false", "\"use_bias\": true", DLLM_ERR_UNSUPPORTED, "use_bias"},
        {"\"use_bias\": false, ", "", DLLM_ERR_UNSUPPORTED, "use_bias"},  // the class default: a bias
        {"\"use_qkv_bias\": false", "\"use_qkv_bias\": true", DLLM_ERR_UNSUPPORTED, "use_qkv_bias"},
        {"\"sigmoid\"", "\"softmax\"", DLLM_ERR_UNSUPPORTED, "score_function"},
        {"\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\"}", DLLM_ERR_UNSUPPORTED, "rope_scaling"},
        {"\"partial_rotary_factor\": 0.5", "\"partial_rotary_factor\": 0.25", DLLM_ERR_UNSUPPORTED, "rotated dims"},
        {"\"moe_router_enable_expert_bias\": true", "\"moe_router_enable_expert_bias\": false", DLLM_ERR_UNSUPPORTED,
         "moe_router_enable_expert_bias"},
        {"\"num_experts\": 12, ", "", DLLM_ERR_FORMAT, "\"num_experts\" is missing"},
        {"\"moe_intermediate_size\": 10, ", "", DLLM_ERR_FORMAT, "\"moe_intermediate_size\" is missing"},
        {"\"n_group\": 4, ", "", DLLM_ERR_FORMAT, "\"n_group\" is missing"},
        {"\"routed_scaling_factor\": 2.5, ", "", DLLM_ERR_FORMAT, "\"routed_scaling_factor\" is missing"},
        {"\"eos_token_id\": 95, ", "", DLLM_ERR_FORMAT, "EOS id 156892"},  // the official default, outside 97 tokens
        {"\"mask_token_id\": 96, ", "", DLLM_ERR_FORMAT, "156895"},
    };
    for (auto &k : cases) {
        std::string t = test_llada2_config_edit(k.from, k.to);
        CHECK_MSG(t != test_llada2_config(test_llada2_shape()), "%s: the edit found nothing", k.from);
        dllm__config c;
        CHECK_STATUS(test_config(t, c), k.want, k.names);
    }
    dllm__config c;
    CHECK_STATUS(test_config(test_llada2_config_edit("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 0"), c),
                 DLLM_OK, nullptr);
    CHECK(c.n_head_kv == 4 && c.rotary_dim == 6 && c.n_ff_shared == 10 && c.n_dense_layers == 1);
}

/* A checkpoint missing one expert, or with a misshapen router, names the tensor. */
TEST(llada2, loader_names_missing_and_misshapen_tensors) {
    test_llada2_shape s;
    test_llada2_weights tw = test_llada2_random(s, 3);
    {
        test_tmpdir dir;
        test_llada2_weights broken = tw;
        broken.w.erase("model.layers.2.mlp.experts.7.up_proj.weight");
        test_llada2_write(dir, s, broken);
        dllm_model *m = nullptr;
        CHECK_STATUS(dllm_model_load(dir.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_SHAPE,
                     "model.layers.2.mlp.experts.7.up_proj.weight");
    }
    {
        test_tmpdir dir;
        test_llada2_weights broken = tw;
        broken.shape["model.layers.1.mlp.gate.weight"] = {(int64_t)s.H, (int64_t)s.E};
        test_llada2_write(dir, s, broken);
        dllm_model *m = nullptr;
        CHECK_STATUS(dllm_model_load(dir.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_SHAPE,
                     "model.layers.1.mlp.gate.weight");
    }
}

// ---- the router ---------------------------------------------------------------------------------------------------

/* Brute force: a group's score is its best pair sum; a group (expert) is kept when fewer than the quota rank above it
 * (a higher score, or an equal one at a lower index). */
static std::vector<int> test_rank_select(const std::vector<float> &score, const std::vector<bool> &allowed, int quota) {
    std::vector<int> kept;
    for (size_t i = 0; i < score.size(); i++) {
        if (!allowed[i]) continue;
        int above = 0;
        for (size_t j = 0; j < score.size(); j++)
            above += allowed[j] && (score[j] > score[i] || (score[j] == score[i] && j < i));
        if (above < quota) kept.push_back((int)i);
    }
    std::sort(kept.begin(), kept.end(), [&](int a, int b) {
        return score[(size_t)a] > score[(size_t)b] || (score[(size_t)a] == score[(size_t)b] && a < b);
    });
    return kept;
}

/* How far one token's routing scores (sigmoid(logit) + expert_bias, dllm__moe_route_token's) may each move before its
 * chosen experts can change: a group score (a sum of two routing scores) moves at most twice as far, so the margin is
 * the smaller of a quarter of the gap between the weakest kept group and the strongest other one and half the gap
 * between the last chosen expert and the best other expert of the kept groups (infinite where nothing is left out). */
static float test_moe_route_margin(const dllm__config &c, const float *logits, const float *bias) {
    const int E = c.n_expert, G = c.n_expert_group, per = E / G;
    std::vector<float> routing((size_t)E), group((size_t)G, -INFINITY);
    for (int e = 0; e < E; e++) routing[(size_t)e] = 1.0f / (1.0f + expf(-logits[e])) + bias[e];
    for (int g = 0; g < G; g++)
        for (int i = 0; i < per; i++)
            for (int j = i + 1; j < per; j++)
                group[(size_t)g] =
                    std::max(group[(size_t)g], routing[(size_t)(g * per + i)] + routing[(size_t)(g * per + j)]);
    const dllm__moe_route r = dllm__moe_route_token(c, logits, bias);
    std::vector<bool> kept((size_t)G, false), chosen((size_t)E, false);
    float weakest_kept = INFINITY, last_chosen = INFINITY;
    for (int e : r.expert) {
        chosen[(size_t)e] = true;
        last_chosen = std::min(last_chosen, routing[(size_t)e]);
    }
    std::vector<int> order((size_t)G);
    for (int g = 0; g < G; g++) order[(size_t)g] = g;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return group[(size_t)a] > group[(size_t)b]; });
    for (int i = 0; i < c.n_group_used; i++) {
        kept[(size_t)order[(size_t)i]] = true;
        weakest_kept = std::min(weakest_kept, group[(size_t)order[(size_t)i]]);
    }
    float best_other_group = -INFINITY, best_other_expert = -INFINITY;
    for (int g = 0; g < G; g++)
        if (!kept[(size_t)g]) best_other_group = std::max(best_other_group, group[(size_t)g]);
    for (int e = 0; e < E; e++)
        if (kept[(size_t)(e / per)] && !chosen[(size_t)e])
            best_other_expert = std::max(best_other_expert, routing[(size_t)e]);
    return std::min((weakest_kept - best_other_group) / 4, (last_chosen - best_other_expert) / 2);
}

/* test_moe_route_margin is sound: moving every routing score by less than the margin (through the logits) leaves the
 * chosen experts as they were; and it is not vacuous: most random tokens have a positive margin below 1. */
TEST(llada2, route_margin_bounds_the_routing_stability) {
    std::mt19937 rng(12);
    std::uniform_real_distribution<float> u(-3, 3), unit(-1, 1);
    int tight = 0, trials = 0;
    for (int trial = 0; trial < 300; trial++) {
        dllm__config c;
        c.n_expert_group = 2 + trial % 7, c.n_expert = c.n_expert_group * (2 + trial % 4);
        c.n_group_used = 1 + trial % c.n_expert_group;
        c.n_expert_used = 1 + trial % (c.n_group_used * (c.n_expert / c.n_expert_group));
        c.routed_scale = 2.5f;
        std::vector<float> logits((size_t)c.n_expert), bias((size_t)c.n_expert), moved(logits.size());
        for (size_t e = 0; e < logits.size(); e++) logits[e] = u(rng), bias[e] = 0.05f * u(rng);
        const float m = test_moe_route_margin(c, logits.data(), bias.data());
        const dllm__moe_route r = dllm__moe_route_token(c, logits.data(), bias.data());
        trials++;
        tight += m > 0 && m < 1;
        if (!(m > 0) || std::isinf(m)) continue;
        for (int k = 0; k < 20; k++) {
            // a logit step of at most 3.6 m moves its sigmoid by at most 0.9 m (the slope is at most 1/4)
            for (size_t e = 0; e < logits.size(); e++) moved[e] = logits[e] + 3.6f * m * unit(rng);
            const dllm__moe_route q = dllm__moe_route_token(c, moved.data(), bias.data());
            std::vector<int> a = r.expert, b = q.expert;
            std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
            CHECK_MSG(a == b, "trial %d: the experts changed within the margin %.3e", trial, m);
        }
    }
    CHECK_MSG(tight * 2 > trials, "only %d of %d tokens have a margin in (0, 1)", tight, trials);
}

TEST(llada2, router_group_limited_top_k_matches_brute_force_with_ties) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-3, 3);
    int checked = 0, tied = 0;
    for (int trial = 0; trial < 400; trial++) {
        dllm__config c;
        c.n_expert_group = 2 + trial % 4, c.n_expert = c.n_expert_group * (2 + trial % 5);
        c.n_group_used = 1 + trial % c.n_expert_group;
        c.n_expert_used = 1 + trial % (c.n_group_used * (c.n_expert / c.n_expert_group));
        c.routed_scale = 2.5f;
        const int E = c.n_expert, per = E / c.n_expert_group;
        std::vector<float> logits((size_t)E), bias((size_t)E);
        for (int e = 0; e < E; e++) {
            // every other trial: values on a coarse grid, so scores, pair sums and group scores tie
            logits[(size_t)e] = trial % 2 ? std::round(u(rng)) : u(rng);
            bias[(size_t)e] = trial % 2 ? 0.0f : 0.02f * u(rng);
        }
        dllm__moe_route r = dllm__moe_route_token(c, logits.data(), bias.data());
        std::vector<float> s((size_t)E), routing((size_t)E), group((size_t)c.n_expert_group, -INFINITY);
        for (int e = 0; e < E; e++)
            s[(size_t)e] = 1.0f / (1.0f + expf(-logits[(size_t)e])),
            routing[(size_t)e] = s[(size_t)e] + bias[(size_t)e];
        for (int g = 0; g < c.n_expert_group; g++)
            for (int i = 0; i < per; i++)
                for (int j = i + 1; j < per; j++)
                    group[(size_t)g] =
                        std::max(group[(size_t)g], routing[(size_t)(g * per + i)] + routing[(size_t)(g * per + j)]);
        std::vector<int> groups = test_rank_select(group, std::vector<bool>(group.size(), true), c.n_group_used);
        std::vector<bool> allowed((size_t)E, false);
        for (int g : groups)
            for (int i = 0; i < per; i++) allowed[(size_t)(g * per + i)] = true;
        std::vector<int> want = test_rank_select(routing, allowed, c.n_expert_used);
        CHECK_MSG(r.expert == want, "trial %d: the chosen experts differ", trial);
        double sum = 0;
        for (int e : want) sum += s[(size_t)e];
        for (size_t k = 0; k < want.size() && k < r.weight.size(); k++) {
            const double w = (c.n_expert_used > 1 ? s[(size_t)want[k]] / sum : s[(size_t)want[k]]) * 2.5;
            CHECK_MSG(fabs(r.weight[k] - w) < 1e-5, "trial %d: weight %zu is %g, want %g", trial, k, r.weight[k], w);
        }
        std::vector<float> sorted = routing;
        std::sort(sorted.begin(), sorted.end());
        tied += std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end();
        checked++;
    }
    CHECK(checked == 400 && tied > 100);  // ties were exercised
}

// ---- the forward against a naive implementation -------------------------------------------------------------------

/* y = W x in double for a [out][in] weight. */
static std::vector<double> test_matvec(const std::vector<float> &W, const std::vector<double> &x, int out) {
    const size_t in = x.size();
    std::vector<double> y((size_t)out, 0.0);
    for (int o = 0; o < out; o++)
        for (size_t i = 0; i < in; i++) y[(size_t)o] += (double)W[(size_t)o * in + i] * x[i];
    return y;
}

static std::vector<double> test_rms(const std::vector<double> &x, const float *w, size_t off, size_t n) {
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += x[off + i] * x[off + i];
    const double r = 1.0 / sqrt(ss / n + 1e-6);
    std::vector<double> y(n);
    for (size_t i = 0; i < n; i++) y[i] = x[off + i] * r * w[i];
    return y;
}

/* y = W x of the linear whose weight tw names `name`, as a precision computes it (test_llada2_quant.inl's reference);
 * the naive forward takes the exact one (test_matvec) where it is given none. */
struct test_llada2_linear {
    virtual std::vector<double> apply(const std::string &name, const std::vector<double> &x, int out) const = 0;
    virtual ~test_llada2_linear() = default;
};

static std::vector<double> test_linear(const test_llada2_weights &tw, const test_llada2_linear *lin,
                                       const std::string &name, const std::vector<double> &x, int out) {
    return lin ? lin->apply(name, x, out) : test_matvec(tw[name], x, out);
}

static std::vector<double> test_swiglu(const test_llada2_weights &tw, const std::string &p,
                                       const std::vector<double> &x, int ff, const test_llada2_linear *lin = nullptr) {
    std::vector<double> g = test_linear(tw, lin, p + "gate_proj.weight", x, ff),
                        u = test_linear(tw, lin, p + "up_proj.weight", x, ff);
    for (int i = 0; i < ff; i++) g[(size_t)i] = g[(size_t)i] / (1 + exp(-g[(size_t)i])) * u[(size_t)i];
    return test_linear(tw, lin, p + "down_proj.weight", g, (int)x.size());
}

/* The MoE block on one normed row: every expert computed, the chosen ones summed with their weights. */
static std::vector<double> test_naive_moe(const test_llada2_shape &s, const test_llada2_weights &tw,
                                          const std::string &mlp, const std::vector<double> &x,
                                          const test_llada2_linear *lin) {
    std::vector<double> logit = test_matvec(tw[mlp + "gate.weight"], x, s.E);
    std::vector<float> score((size_t)s.E), sig((size_t)s.E), group((size_t)s.n_group, -INFINITY);
    const int per = s.E / s.n_group;
    for (int e = 0; e < s.E; e++)
        sig[(size_t)e] = (float)(1 / (1 + exp(-logit[(size_t)e]))),
        score[(size_t)e] = sig[(size_t)e] + tw[mlp + "gate.expert_bias"][(size_t)e];
    for (int g = 0; g < s.n_group; g++)
        for (int i = 0; i < per; i++)
            for (int j = i + 1; j < per; j++)
                group[(size_t)g] =
                    std::max(group[(size_t)g], score[(size_t)(g * per + i)] + score[(size_t)(g * per + j)]);
    std::vector<bool> allowed((size_t)s.E, false);
    for (int g : test_rank_select(group, std::vector<bool>(group.size(), true), s.topk_group))
        for (int i = 0; i < per; i++) allowed[(size_t)(g * per + i)] = true;
    std::vector<int> chosen = test_rank_select(score, allowed, s.top_k);
    double sum = 0;
    for (int e : chosen) sum += sig[(size_t)e];
    std::vector<double> y = test_swiglu(tw, mlp + "shared_experts.", x, s.moe_ff * s.shared, lin);
    for (int e = 0; e < s.E; e++) {
        std::vector<double> out = test_swiglu(tw, mlp + dllm__format("experts.%d.", e), x, s.moe_ff, lin);
        auto it = std::find(chosen.begin(), chosen.end(), e);
        if (it == chosen.end()) continue;
        for (size_t i = 0; i < y.size(); i++) y[i] += sig[(size_t)e] / sum * s.scale * out[i];
    }
    return y;
}

/* Q, K, V of every row of one layer: the fused projection, QK-norm, partial rotate-half RoPE. */
static void test_naive_qkv(const test_llada2_shape &s, const test_llada2_weights &tw, const std::string &attn,
                           const std::vector<double> &a, int pos, std::vector<double> &q, std::vector<double> &k,
                           std::vector<double> &v, const test_llada2_linear *lin) {
    const int qd = s.n_head * s.hd, kvd = s.n_kv * s.hd, rot = s.hd / 2, half = rot / 2;
    std::vector<double> qkv = test_linear(tw, lin, attn + "query_key_value.weight", a, qd + 2 * kvd);
    auto head = [&](std::vector<double> &out, size_t off, const std::string &norm) {
        std::vector<double> h = test_rms(qkv, tw[attn + norm].data(), off, (size_t)s.hd);
        for (int j = 0; j < half; j++) {
            const double ang = pos * pow(s.theta, -2.0 * j / rot), x1 = h[(size_t)j], x2 = h[(size_t)(j + half)];
            h[(size_t)j] = x1 * cos(ang) - x2 * sin(ang), h[(size_t)(j + half)] = x2 * cos(ang) + x1 * sin(ang);
        }
        out.insert(out.end(), h.begin(), h.end());
    };
    for (int h = 0; h < s.n_head; h++) head(q, (size_t)h * s.hd, "query_layernorm.weight");
    for (int h = 0; h < s.n_kv; h++) head(k, (size_t)(qd + h * s.hd), "key_layernorm.weight");
    v.insert(v.end(), qkv.begin() + qd + kvd, qkv.end());
}

/* logits of every row of ids under the block-causal mask of `block`, positions from 0; lin: how the linears compute
 * (null: exactly; the router always does). */
static std::vector<double> test_naive_forward(const test_llada2_shape &s, const test_llada2_weights &tw,
                                              const std::vector<int32_t> &ids, int block,
                                              const test_llada2_linear *lin = nullptr) {
    const int n = (int)ids.size(), H = s.H, qd = s.n_head * s.hd;
    std::vector<std::vector<double>> h((size_t)n);
    for (int t = 0; t < n; t++)
        h[(size_t)t].assign(tw["model.word_embeddings.weight"].begin() + (size_t)ids[(size_t)t] * H,
                            tw["model.word_embeddings.weight"].begin() + (size_t)(ids[(size_t)t] + 1) * H);
    for (int l = 0; l < s.n_layer; l++) {
        const std::string p = dllm__format("model.layers.%d.", l), attn = p + "attention.";
        std::vector<std::vector<double>> q((size_t)n), k((size_t)n), v((size_t)n);
        for (int t = 0; t < n; t++)
            test_naive_qkv(s, tw, attn, test_rms(h[(size_t)t], tw[p + "input_layernorm.weight"].data(), 0, (size_t)H),
                           t, q[(size_t)t], k[(size_t)t], v[(size_t)t], lin);
        for (int t = 0; t < n; t++) {
            std::vector<double> att((size_t)qd, 0.0);
            const int visible = std::min(n, (t / block + 1) * block);
            for (int hh = 0; hh < s.n_head; hh++) {
                const int kh = hh / (s.n_head / s.n_kv);
                std::vector<double> sc((size_t)visible);
                double mx = -INFINITY, z = 0;
                for (int j = 0; j < visible; j++) {
                    double d = 0;
                    for (int c = 0; c < s.hd; c++)
                        d += q[(size_t)t][(size_t)(hh * s.hd + c)] * k[(size_t)j][(size_t)(kh * s.hd + c)];
                    sc[(size_t)j] = d / sqrt((double)s.hd), mx = std::max(mx, sc[(size_t)j]);
                }
                for (int j = 0; j < visible; j++) z += exp(sc[(size_t)j] - mx);
                for (int j = 0; j < visible; j++)
                    for (int c = 0; c < s.hd; c++)
                        att[(size_t)(hh * s.hd + c)] +=
                            exp(sc[(size_t)j] - mx) / z * v[(size_t)j][(size_t)(kh * s.hd + c)];
            }
            std::vector<double> o = test_linear(tw, lin, attn + "dense.weight", att, H);
            for (int i = 0; i < H; i++) h[(size_t)t][(size_t)i] += o[(size_t)i];
        }
        for (int t = 0; t < n; t++) {
            std::vector<double> a =
                test_rms(h[(size_t)t], tw[p + "post_attention_layernorm.weight"].data(), 0, (size_t)H);
            std::vector<double> f =
                l < s.dense ? test_swiglu(tw, p + "mlp.", a, s.ff, lin) : test_naive_moe(s, tw, p + "mlp.", a, lin);
            for (int i = 0; i < H; i++) h[(size_t)t][(size_t)i] += f[(size_t)i];
        }
    }
    std::vector<double> logits;
    for (int t = 0; t < n; t++) {
        const std::vector<double> normed = test_rms(h[(size_t)t], tw["model.norm.weight"].data(), 0, (size_t)H);
        std::vector<double> row = test_linear(tw, lin, "lm_head.weight", normed, s.V);
        logits.insert(logits.end(), row.begin(), row.end());
    }
    return logits;
}

/* dllm_logits (block-causal at 32, positions from 0) on a loaded tiny checkpoint equals the naive forward. */
TEST(llada2, forward_matches_naive_loop_over_experts) {
    test_llada2_shape s;
    test_llada2_weights tw = test_llada2_random(s, 5);
    test_tmpdir dir;
    dllm_model *m = test_llada2_load(T_, dir, s, tw);
    if (!m) return;
    dllm_model_info info;
    dllm_model_get_info(m, &info);
    CHECK(info.family == DLLM_FAMILY_LLADA2 && info.block_size == 32 && info.mask_id == s.mask && info.eos_id == s.eos);
    dllm_ctx *ctx = test_ctx(m, DLLM_BACKEND_CPU, 3);
    std::mt19937 rng(7);
    std::vector<int32_t> ids(45);  // two blocks, the second partial
    for (int32_t &t : ids) t = (int32_t)(rng() % (uint32_t)(s.V - 2));
    std::vector<float> got((size_t)(45 - 3) * s.V);
    CHECK_STATUS(dllm_logits(ctx, ids.data(), 45, 3, 45, got.data(), got.size()), DLLM_OK, nullptr);
    std::vector<double> want = test_naive_forward(s, tw, ids, 32);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < got.size(); i++) {
        worst = std::max(worst, fabs(got[i] - want[3 * (size_t)s.V + i]));
        scale = std::max(scale, fabs(want[3 * (size_t)s.V + i]));
    }
    CHECK_MSG(worst < 1e-4 * std::max(1.0, scale) && scale > 0.1, "max |error| %g over logits up to %g", worst, scale);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

// ---- generation ---------------------------------------------------------------------------------------------------

/* Every step's canvas and confidences, for comparing two runs bit for bit. */
struct test_llada2_trace {
    std::vector<std::vector<int32_t>> canvas;
    std::vector<std::vector<double>> conf;
    const dllm__llada2_generation *g = nullptr;
    int edits = 0, multi = 0;
};

static int test_llada2_on_step(const dllm_step_info *info, void *user) {
    test_llada2_trace &t = *(test_llada2_trace *)user;
    t.canvas.emplace_back(info->canvas, info->canvas + info->canvas_len);
    std::vector<double> conf;
    for (const dllm__choice &c : t.g->ch) conf.push_back(c.conf);
    t.conf.push_back(conf);
    t.multi += info->n_committed > 1;
    if (t.canvas.size() > 1)
        for (int i = 0; i < info->n_committed; i++)
            t.edits += t.canvas[t.canvas.size() - 2][(size_t)info->committed_pos[i]] != 96;
    return 0;
}

static dllm_status test_llada2_generate(dllm_ctx *ctx, const std::vector<int32_t> &prompt, dllm_gen_params p,
                                        bool cache, test_llada2_trace &trace, std::vector<int32_t> &out) {
    dllm__llada2_plan plan;
    out.assign((size_t)p.gen_length, -1);
    p.on_step = test_llada2_on_step, p.on_step_data = &trace;
    DLLM__TRY(dllm__plan_llada2(*ctx, prompt.data(), (int)prompt.size(), p, out.data(), (int)out.size(), plan));
    plan.cache = cache;
    dllm__llada2_generation g{*ctx, p, plan, (int)prompt.size()};
    trace.g = &g;
    dllm_status st = g.run(prompt.data());
    out.resize((size_t)g.emit(st == DLLM_OK, out.data()));
    return st;
}

/* The committed-block cache gives the uncached loop's bits: every step's canvas and every row's confidence, for both
 * loops, prompts ending inside a block and on its boundary, with and without LaCache. */
TEST(llada2, kv_cached_generate_equals_uncached_bit_for_bit) {
    test_llada2_shape s;
    test_llada2_weights tw = test_llada2_random(s, 9);
    test_tmpdir dir;
    dllm_model *m = test_llada2_load(T_, dir, s, tw);
    if (!m) return;
    dllm_ctx *ctx = test_ctx(m, DLLM_BACKEND_CPU, 2);
    std::mt19937 rng(13);
    int edits = 0, multi = 0;
    for (int variant = 0; variant < 4; variant++) {
        std::vector<int32_t> prompt(variant % 2 ? 14 : 10);  // blocks of 7 / 5: ends inside one, or on a boundary
        for (int32_t &t : prompt) t = (int32_t)(rng() % 90);
        dllm_gen_params p = dllm_gen_default_params();
        p.block_length = variant % 2 ? 7 : 5, p.gen_length = 17, p.steps = 3, p.threshold = 0.035;
        p.lacache = variant < 2 ? DLLM_LACACHE_ON : DLLM_LACACHE_OFF;
        if (variant >= 2) p.edit_threshold = 0.03, p.max_post_steps = 2;
        test_llada2_trace a, b;
        std::vector<int32_t> out_a, out_b;
        CHECK_STATUS(test_llada2_generate(ctx, prompt, p, true, a, out_a), DLLM_OK, nullptr);
        CHECK_STATUS(test_llada2_generate(ctx, prompt, p, false, b, out_b), DLLM_OK, nullptr);
        CHECK_MSG(a.canvas == b.canvas && out_a == out_b && !a.canvas.empty(), "variant %d: tokens differ", variant);
        bool same = a.conf.size() == b.conf.size();
        for (size_t i = 0; same && i < a.conf.size(); i++)
            same = a.conf[i].size() == b.conf[i].size() &&
                   memcmp(a.conf[i].data(), b.conf[i].data(), a.conf[i].size() * sizeof(double)) == 0;
        CHECK_MSG(same, "variant %d: confidences differ", variant);
        edits += a.edits, multi += a.multi;
    }
    CHECK_MSG(edits > 0 && multi > 0, "the runs exercised %d edits and %d multi-token steps", edits, multi);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* A backend whose forwards return scripted logits: script(forward index, the block's tokens) -> per row (token, p). */
struct test_llada2_scripted : dllm__backend_impl {
    int V = 8, forwards = 0;
    std::function<std::vector<std::pair<int32_t, double>>(int, const int32_t *, int)> script;
    std::vector<int> commits;  // T of each COMMIT forward
    dllm_status logits(const int32_t *, int, int, int, float *) override { return DLLM_OK; }
    dllm_status begin_block(dllm__decode &) override { return DLLM_OK; }
    dllm_status step(dllm__decode &, std::vector<int32_t> &, bool) override { return DLLM_OK; }
    dllm_status bd_begin(int) override { return DLLM_OK; }
    /* Row logits that give `token` probability p (> 1 / (V - 1): it is the argmax) under the softmax without the mask
     * (id V - 1). */
    dllm_status bd_forward(const dllm__bd_call &call, float *out) override {
        if (call.kind == DLLM__BD_COMMIT) return commits.push_back(call.T), DLLM_OK;
        std::vector<std::pair<int32_t, double>> rows = script(forwards++, call.ids, call.T);
        for (int r = 0; r < call.T; r++) {
            const double others = V - 2, L = log(rows[(size_t)r].second * others / (1 - rows[(size_t)r].second));
            for (int v = 0; v < V; v++) out[(size_t)r * V + v] = v == rows[(size_t)r].first ? (float)L : 0.0f;
            out[(size_t)r * V + V - 1] = 50.0f;  // the mask itself scores highest: it is never predicted
        }
        return DLLM_OK;
    }
};

/* A dllm_ctx over a model that is only a config (vocabulary 8, mask 7, EOS 6) and the scripted backend. */
struct test_llada2_rig {
    dllm_model model;
    dllm_ctx ctx;
    test_llada2_scripted *backend = new test_llada2_scripted;
    test_llada2_rig() {
        model.cfg.family = DLLM_FAMILY_LLADA2, model.cfg.n_vocab = 8, model.cfg.mask_id = 7, model.cfg.eos_id = 6;
        ctx.model = &model, ctx.max_tokens = 256, ctx.impl.reset(backend);
    }
    /* Runs a generation; returns its steps' canvases (generated part) and its output. */
    dllm_status run(std::vector<int32_t> prompt, dllm_gen_params p, std::vector<std::vector<int32_t>> &steps,
                    std::vector<int32_t> &out) {
        struct rec {
            static int fn(const dllm_step_info *i, void *u) {
                ((std::vector<std::vector<int32_t>> *)u)
                    ->emplace_back(i->canvas + i->prompt_len, i->canvas + i->canvas_len);
                return 0;
            }
        };
        steps.clear();
        p.on_step = rec::fn, p.on_step_data = &steps;
        out.assign((size_t)p.gen_length, -1);
        int n = 0;
        dllm_status st = dllm__llada2_generate_impl(ctx, prompt.data(), (int)prompt.size(), p, out.data(),
                                                    (int)out.size(), &n, nullptr);
        out.resize((size_t)n);
        return st;
    }
};

/* LLaDA2.0: all masks above the threshold when at least k_s, else the k_s most confident (ties: the lower position);
 * the schedule k_s = B / steps (+1 first); a block with EOS ends the generation. */
TEST(llada2, loop_v20_threshold_fallback_schedule_and_eos) {
    test_llada2_rig rig;
    dllm_gen_params p = dllm_gen_default_params();
    p.block_length = 4, p.gen_length = 8, p.steps = 3, p.threshold = 0.9;  // k = 2, 1, 1
    rig.backend->script = [](int f, const int32_t *, int T) {
        std::vector<std::pair<int32_t, double>> r((size_t)T, {1, 0.5});
        if (f == 0) r = {{1, 0.95}, {2, 0.3}, {3, 0.3}, {4, 0.6}};  // 1 above 0.9 < k 2: top 2 = rows 0, 3
        if (f == 1) r = {{1, 0.2}, {2, 0.4}, {2, 0.4}, {4, 0.2}};  // none above, k 1: an exact tie -> row 1
        if (f == 2) r = {{1, 0.2}, {2, 0.2}, {5, 0.25}, {4, 0.2}};
        if (f == 3) r = {{1, 0.99}, {6, 0.98}, {3, 0.91}, {4, 0.2}};  // block 2: 3 above >= k 2: all three; EOS
        return r;
    };
    std::vector<std::vector<int32_t>> steps;
    std::vector<int32_t> out;
    CHECK_STATUS(rig.run({}, p, steps, out), DLLM_OK, nullptr);
    const std::vector<std::vector<int32_t>> want = {{1, 7, 7, 4, 7, 7, 7, 7}, {1, 2, 7, 4, 7, 7, 7, 7},
                                                    {1, 2, 5, 4, 7, 7, 7, 7}, {1, 2, 5, 4, 1, 6, 3, 7},
                                                    {1, 2, 5, 4, 1, 6, 3, 1}};
    CHECK(steps == want);
    CHECK(rig.backend->forwards == 5);  // the block holding EOS is finished, then the generation ends
    CHECK((out == std::vector<int32_t>{1, 2, 5, 4, 1}));  // cut before the EOS (stop_at_eos)
    CHECK(rig.backend->commits == std::vector<int>{4});
    p.stop_at_eos = 0;
    rig.backend->forwards = 0;
    CHECK_STATUS(rig.run({}, p, steps, out), DLLM_OK, nullptr);
    CHECK((out == std::vector<int32_t>{1, 2, 5, 4, 1, 6}));
}

/* LLaDA2.0 with early_stop: a step that commits an EOS ends the generation when no mask precedes the first EOS (step
 * 1's has one before it); without early_stop the block is finished first. */
TEST(llada2, loop_v20_early_stop) {
    test_llada2_rig rig;
    dllm_gen_params p = dllm_gen_default_params();
    p.block_length = 4, p.gen_length = 4, p.steps = 4, p.threshold = 0.9, p.early_stop = 1, p.stop_at_eos = 0;
    rig.backend->script = [](int f, const int32_t *, int) {
        if (f == 0) return std::vector<std::pair<int32_t, double>>{{1, 0.2}, {2, 0.3}, {6, 0.95}, {4, 0.2}};
        return std::vector<std::pair<int32_t, double>>{{1, 0.2}, {6, 0.99}, {6, 0.3}, {4, 0.3}};
    };
    std::vector<std::vector<int32_t>> steps;
    std::vector<int32_t> out;
    CHECK_STATUS(rig.run({3}, p, steps, out), DLLM_OK, nullptr);  // the prompt shares the block: rows 1..3 decode
    CHECK(steps.size() == 2 && rig.backend->forwards == 2);
    CHECK((steps.back() == std::vector<int32_t>{6, 6, 7, 7, 7, 7, 7}));
    CHECK((out == std::vector<int32_t>{6}));
    p.early_stop = 0;
    rig.backend->forwards = 0;
    CHECK_STATUS(rig.run({3}, p, steps, out), DLLM_OK, nullptr);
    CHECK(rig.backend->forwards == 3 && (out == std::vector<int32_t>{6}));
}

/* LLaDA2.1: masks above the threshold (else the single best), edits of decoded non-prompt rows whose new token has
 * p > edit_threshold, post steps until one edits nothing or max_post_steps; no EOS stop without early_stop. */
TEST(llada2, loop_v21_editing_post_steps_and_eos) {
    test_llada2_rig rig;
    dllm_gen_params p = dllm_gen_default_params();
    p.block_length = 4, p.gen_length = 6, p.threshold = 0.7, p.edit_threshold = 0.5, p.max_post_steps = 2;
    rig.backend->script = [](int f, const int32_t *ids, int) {
        using R = std::vector<std::pair<int32_t, double>>;
        switch (f) {
            case 0: return R{{5, 0.9}, {2, 0.8}, {3, 0.3}, {4, 0.2}};  // prompt row 0 never edits; 2 masks above
            case 1: return R{{5, 0.9}, {1, 0.6}, {3, 0.3}, {4, 0.4}};  // edit row 1 (2 -> 1); none above: best = row 3
            case 2: return R{{5, 0.9}, {1, 0.9}, {2, 0.4}, {4, 0.9}};  // last mask row 2 by fallback; row 3 same token
            case 3: return R{{5, 0.9}, {1, 0.9}, {6, 0.8}, {4, 0.9}};  // post step 1: edit row 2 to EOS
            case 4: return R{{5, 0.9}, {1, 0.9}, {6, 0.9}, {4, 0.9}};  // post step 2: nothing to edit: block done
            default: break;
        }
        R r;  // block 2: masks become 6 (row 2 below the threshold); decoded rows always change: edits until the cap
        for (int i = 0; i < 4; i++)
            r.push_back(ids[i] == 7 ? std::make_pair(6, i == 2 ? 0.4 : 0.9) : std::make_pair((ids[i] + 1) % 6, 0.9));
        return r;
    };
    std::vector<std::vector<int32_t>> steps;
    std::vector<int32_t> out;
    p.stop_at_eos = 0;
    CHECK_STATUS(rig.run({0}, p, steps, out), DLLM_OK, nullptr);
    const std::vector<std::vector<int32_t>> want = {{2, 7, 7, 7, 7, 7, 7},
                                                    {1, 7, 4, 7, 7, 7, 7},
                                                    {1, 2, 4, 7, 7, 7, 7},
                                                    {1, 6, 4, 7, 7, 7, 7},
                                                    {1, 6, 4, 7, 7, 7, 7}};
    CHECK(steps.size() >= 5 && std::vector<std::vector<int32_t>>(steps.begin(), steps.begin() + 5) == want);
    // block 2 (rows 4..7): 3 masks above 0.7 then the fallback, then post steps that keep editing: 2 at most
    CHECK_MSG(rig.backend->forwards == 5 + 2 + 2, "%d forwards", rig.backend->forwards);
    CHECK((out == std::vector<int32_t>{1, 6}));  // without early_stop the EOS cuts the output only
    p.early_stop = 1;
    rig.backend->forwards = 0;
    CHECK_STATUS(rig.run({0}, p, steps, out), DLLM_OK, nullptr);
    CHECK(rig.backend->forwards == 5);  // with it, the block that ends with EOS and no mask stops the generation
}

/* The options that do not apply are refused with their name; edit_threshold on another family too. */
TEST(llada2, options_that_do_not_apply_are_refused) {
    test_llada2_rig rig;
    rig.backend->script = [](int, const int32_t *, int T) {
        return std::vector<std::pair<int32_t, double>>((size_t)T, {1, 0.99});
    };
    std::vector<std::vector<int32_t>> steps;
    std::vector<int32_t> out;
    dllm_gen_params p = dllm_gen_default_params();
    p.max_post_steps = 4;
    CHECK_STATUS(rig.run({}, p, steps, out), DLLM_ERR_UNSUPPORTED, "max_post_steps");
    p = dllm_gen_default_params(), p.temperature = 0.5f;
    CHECK_STATUS(rig.run({}, p, steps, out), DLLM_ERR_UNSUPPORTED, "temperature");
    p = dllm_gen_default_params(), p.cfg_scale = 1;
    CHECK_STATUS(rig.run({}, p, steps, out), DLLM_ERR_UNSUPPORTED, "cfg_scale");
    p = dllm_gen_default_params(), p.edit_threshold = 1.5;
    CHECK_STATUS(rig.run({}, p, steps, out), DLLM_ERR_INVALID_ARGUMENT, "edit_threshold");
    p = dllm_gen_default_params();
    CHECK_STATUS(rig.run({7}, p, steps, out), DLLM_ERR_INVALID_ARGUMENT, "mask id");
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) return;
    dllm_ctx *ctx = test_ctx(m);
    p = dllm_gen_default_params(), p.edit_threshold = 0.5;
    int32_t prompt[2] = {1, 2};
    std::vector<int32_t> o((size_t)p.gen_length);
    CHECK_STATUS(dllm_generate(ctx, prompt, 2, p, o.data(), (int)o.size(), nullptr, nullptr), DLLM_ERR_UNSUPPORTED,
                 "edit_threshold");
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* The backend choice: without a GPU, asking for the GPU fails with NO_DEVICE and AUTO gets the CPU (with a GPU too, for
 * now); with one, this checkpoint's awkward sizes (head_dim 12, expert width 10) are refused by the GPU backend, naming
 * the CPU backend (the GPU path itself: tests/test_llada2_gpu.inl). */
TEST(llada2, backend_choice) {
    test_llada2_shape s;
    test_tmpdir dir;
    dllm_model *m = test_llada2_load(T_, dir, s, test_llada2_random(s, 1));
    if (!m) return;
    std::string why;
    const bool gpu = dllm__gpu_usable(0, why);
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_GPU;
    dllm_ctx *ctx = nullptr;
    if (gpu)
        CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_ERR_UNSUPPORTED, "CPU backend");
    else
        CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_ERR_NO_DEVICE, nullptr);
    dllm_ctx_free(ctx), ctx = nullptr;
    cp.backend = DLLM_BACKEND_CPU, cp.n_threads = 2, cp.precision = DLLM_PRECISION_FP8_FFN;  // the CPU runs it
    CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
    dllm_ctx_free(ctx), ctx = nullptr;
    cp = dllm_ctx_default_params(), cp.backend = DLLM_BACKEND_AUTO, cp.n_threads = 2;
    CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
    if (ctx) CHECK(dllm_ctx_get_backend(ctx) == DLLM_BACKEND_CPU);  // with a GPU too, until its path is validated
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* The twin of the GPU's routes plan (moe_plan: dllm__moe_plan_ref), checked here without a GPU: each expert's slots in
 * its rows token by token, every slot once, no padding, each expert's row tiles counted (ceil(rows / tile)). */
TEST(llada2, gpu_moe_plan_twin) {
    std::mt19937 rng(3);
    for (int tile : {32, 1, 4}) {
        const int E = 12, k = 3, T = 23;
        std::vector<int> expert((size_t)T * k);
        for (int t = 0; t < T; t++) {  // k distinct experts a token, one slot without (NaN scores) in token 5
            std::vector<int> all(E);
            for (int e = 0; e < E; e++) all[(size_t)e] = e;
            std::shuffle(all.begin(), all.end(), rng);
            for (int j = 0; j < k; j++) expert[(size_t)t * k + j] = all[(size_t)j];
        }
        expert[5 * k + 1] = -1;
        std::vector<int> first_row, tile_first, row_token, slot_row;
        dllm__moe_plan_ref(expert.data(), (int)expert.size(), k, E, tile, first_row, tile_first, row_token, slot_row);
        bool ok = first_row.size() == (size_t)E + 1 && first_row[0] == 0 && tile_first[0] == 0 &&
                  slot_row[5 * k + 1] == -1;
        int used = 0;
        for (int e = 0; ok && e < E; e++) {
            int last_token = -1, n = 0;
            for (size_t i = 0; i < expert.size(); i++) {
                if (expert[i] != e) continue;
                const int row = slot_row[i];
                ok &= row == first_row[(size_t)e] + n;  // in the expert's range, in slot (token) order
                ok &= row_token[(size_t)row] == (int)i / k && (int)i / k > last_token;
                last_token = (int)i / k, n++, used++;
            }
            ok &= first_row[(size_t)e + 1] - first_row[(size_t)e] == n;
            ok &= tile_first[(size_t)e + 1] - tile_first[(size_t)e] == (n + tile - 1) / tile;
        }
        CHECK_MSG(ok && used == T * k - 1 && (int)row_token.size() == first_row[(size_t)E],
                  "tile %d: the plan is broken", tile);
    }
    // the grouped GEMM's twin on a plan: expert e's rows through expert e's weights
    const int N = 3, K = 2;
    const std::vector<uint16_t> w0 = {dllm__f32_to_bf16(1), 0, 0, dllm__f32_to_bf16(1), dllm__f32_to_bf16(1),
                                      dllm__f32_to_bf16(1)},
                                w1 = {dllm__f32_to_bf16(2), 0, 0, 0, 0, dllm__f32_to_bf16(-1)};
    const std::vector<uint16_t> x = {dllm__f32_to_bf16(3), dllm__f32_to_bf16(5), dllm__f32_to_bf16(7),
                                     dllm__f32_to_bf16(11)};
    const std::vector<int> first_row = {0, 1, 3}, row_src = {1, 0, 1};
    std::vector<uint16_t> y(9);
    dllm__moe_grouped_gemm_ref(x.data(), row_src.data(), {w0.data(), w1.data()}, first_row, N, K, y.data());
    const float want[9] = {7, 11, 18, 6, 0, -5, 14, 0, -11};
    bool same = true;
    for (int i = 0; i < 9; i++) same &= dllm__bf16_to_f32(y[(size_t)i]) == want[i];
    CHECK_MSG(same, "dllm__moe_grouped_gemm_ref: wrong products");
}

// ---- the official code's traces (tools/make_llada2_fixtures.py) ---------------------------------------------------

/* tests/data/llada2/: a tiny checkpoint and the official generate's outputs ("cases": prompt, settings, output) for
 * LLaDA2.0 and LLaDA2.1, made with PyTorch on the GPU machine. dllm must give the same tokens. */
TEST(llada2, official_generate_traces) {
    const std::string dir = test_data("llada2"), cases_path = dir + "/cases.json";
    if (!dllm__file_exists(cases_path))
        SKIP("tests/data/llada2/cases.json is absent: run tools/make_llada2_fixtures.py (PyTorch) to make it");
    dllm__json cases;
    CHECK_STATUS(dllm__json_load(cases_path, cases), DLLM_OK, nullptr);
    dllm_model *m = test_load(dir);
    if (!m) {
        CHECK(false);
        return;
    }
    dllm_ctx *ctx = test_ctx(m, DLLM_BACKEND_CPU, 2);
    const dllm__json *list = cases.find("cases");
    int compared = 0;
    for (size_t i = 0; list && i < list->items.size(); i++) {
        const dllm__json &k = list->items[i];
        auto num = [&](const char *key) { return k.find(key)->number; };
        std::vector<int32_t> prompt, want;
        for (const dllm__json &v : k.find("prompt")->items) prompt.push_back((int32_t)v.integer);
        for (const dllm__json &v : k.find("output")->items) want.push_back((int32_t)v.integer);
        dllm_gen_params p = dllm_gen_default_params();
        p.gen_length = (int)num("gen_length"), p.block_length = (int)num("block_length"), p.steps = (int)num("steps");
        p.threshold = num("threshold"), p.early_stop = k.find("eos_early_stop")->boolean ? 1 : 0, p.stop_at_eos = 0;
        if (k.find("editing_threshold"))
            p.edit_threshold = num("editing_threshold"), p.max_post_steps = (int)num("max_post_steps");
        std::vector<int32_t> out((size_t)p.gen_length);
        int n = 0;
        CHECK_STATUS(dllm_generate(ctx, prompt.data(), (int)prompt.size(), p, out.data(), (int)out.size(), &n, nullptr),
                     DLLM_OK, nullptr);
        out.resize((size_t)n);
        CHECK_MSG(out == want, "case %zu (%s): dllm's %zu tokens differ from the official %zu", i,
                  k.find("name")->str.c_str(), out.size(), want.size());
        compared++;
    }
    CHECK(compared >= 4);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}
