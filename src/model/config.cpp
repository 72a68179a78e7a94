/* src/model/config.cpp - config.json of every supported family, validated. */

// ---------------------------------------------------------------------------------------------------
// 4. Model config (LLaDA, Dream)
//    Only what the forward pass needs is kept. A value dllm does not implement is an error naming the
//    key, never a silent approximation; keys dllm does not know are ignored (HF configs carry many).
// ---------------------------------------------------------------------------------------------------

struct dllm__config {
    dllm_family family = DLLM_FAMILY_LLADA;
    int n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
    int n_vocab = 0;     // logit columns = embedding rows (LLaDA: embedding_size)
    int vocab_size = 0;  // config vocab_size
    int max_seq_len = 0;
    float norm_eps = 1e-5f;
    float rope_theta = 10000.0f;
    bool qkv_bias = false;
    bool tied_embeddings = false;
    bool gemma_norm = false;    // LLaDA layer_norm_type gemma_rms: x * (1 + w), folded into the weight
    bool scale_logits = false;  // LLaDA scale_logits: logits / sqrt(d_model)
    bool shift_logits = false;  // Dream: position i is predicted by the logits at i - 1
    int32_t mask_id = -1, eos_id = -1, eot_id = -1, bos_id = -1, pad_id = -1;
    // Block diffusion (Fast-dLLM v2, Nemotron): see dllm__is_block_diffusion and section 17.
    int bd_size = 0;                 // the model's block (bd_size / block_size)
    int bd_mask_block = 0;           // block-causal granularity of a forward that names none: Fast-dLLM v2's
                                     // forward defaults its block_size argument to 32 (not bd_size)
    bool bd_causal_context = false;  // prefill and commit forwards token-causal (Nemotron's reported "causal
                                     // context") instead of block-causal
    int32_t stop_id = -1;            // the token that ends a block-diffusion generation
    // YaRN RoPE (rope_parameters.rope_type "yarn"), transformers' _compute_yarn_parameters
    bool yarn = false;
    double yarn_factor = 1, yarn_beta_fast = 32, yarn_beta_slow = 1, yarn_attention_factor = 1;
    int yarn_orig_max = 0;
    // Llama-4 query scaling (Ministral-3): q *= 1 + beta * log(1 + floor(pos / llama4_orig_max)) after RoPE
    float llama4_beta = 0;
    int llama4_orig_max = 0;
    // LLaDA2 (model/llada2.cpp): partial RoPE, QK-norm and the mixture of experts
    int rotary_dim = 0;  // RoPE rotates the first rotary_dim dims of each head (0: all of them)
    bool qk_norm = false;
    int n_expert = 0, n_expert_used = 0;  // experts per MoE layer, experts each token is routed to
    int n_expert_group = 1, n_group_used = 1;
    int n_ff_expert = 0, n_ff_shared = 0;  // a routed expert's and the shared experts' FFN width (0: no shared)
    int n_dense_layers = 0;                // the first layers are dense SwiGLU (first_k_dense_replace)
    float routed_scale = 1;                // routed_scaling_factor
};

static const char *dllm__family_name(dllm_family f) {
    switch (f) {
        case DLLM_FAMILY_LLADA: return "LLaDA";
        case DLLM_FAMILY_DREAM: return "Dream";
        case DLLM_FAMILY_FAST_DLLM_V2: return "Fast-dLLM v2";
        case DLLM_FAMILY_NEMOTRON_DIFFUSION: return "Nemotron-Labs-Diffusion";
        case DLLM_FAMILY_LLADA2: return "LLaDA2";
    }
    return "?";
}

static bool dllm__is_block_diffusion(const dllm__config &c) {
    return c.family == DLLM_FAMILY_FAST_DLLM_V2 || c.family == DLLM_FAMILY_NEMOTRON_DIFFUSION;
}

/* Typed access to config.json values with errors that name the file and the key. */
struct dllm__cfg_reader {
    const dllm__json &root;
    const std::string &path;

    dllm_status bad(const char *key, const char *want) const {
        return dllm__fail(DLLM_ERR_FORMAT, "%s: \"%s\" must be %s", path.c_str(), key, want);
    }
    dllm_status integer(const char *key, int64_t lo, int64_t hi, int &out, bool required = true, int dflt = 0) const {
        const dllm__json *v = root.find(key);
        if (!v || v->is_null()) {
            if (required) return dllm__fail(DLLM_ERR_FORMAT, "%s: required key \"%s\" is missing", path.c_str(), key);
            out = dflt;
            return DLLM_OK;
        }
        if (v->kind != dllm__json::NUM || !v->is_integer) return bad(key, "an integer");
        if (v->integer < lo || v->integer > hi)
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: \"%s\" = %lld is outside the supported range [%lld, %lld]",
                              path.c_str(), key, (long long)v->integer, (long long)lo, (long long)hi);
        out = (int)v->integer;
        return DLLM_OK;
    }
    /* A token id: an integer, or a list whose first entry is used (generation_config style). */
    dllm_status token(const char *key, int32_t &out) const {
        const dllm__json *v = root.find(key);
        if (!v || v->is_null()) return DLLM_OK;
        if (v->kind == dllm__json::ARR && !v->items.empty()) v = &v->items[0];
        if (v->kind != dllm__json::NUM || !v->is_integer || v->integer < 0 || v->integer > INT32_MAX)
            return bad(key, "a token id");
        out = (int32_t)v->integer;
        return DLLM_OK;
    }
    dllm_status number(const char *key, double lo, double hi, float &out) const {
        const dllm__json *v = root.find(key);
        if (!v || v->is_null())
            return dllm__fail(DLLM_ERR_FORMAT, "%s: required key \"%s\" is missing", path.c_str(), key);
        if (v->kind != dllm__json::NUM) return bad(key, "a number");
        if (!(v->number >= lo && v->number <= hi))
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: \"%s\" = %g is outside the supported range [%g, %g]",
                              path.c_str(), key, v->number, lo, hi);
        out = (float)v->number;
        return DLLM_OK;
    }
    dllm_status boolean(const char *key, bool dflt, bool &out) const {
        const dllm__json *v = root.find(key);
        if (!v || v->is_null()) {
            out = dflt;
            return DLLM_OK;
        }
        if (v->kind != dllm__json::BOOL) return bad(key, "true or false");
        out = v->boolean;
        return DLLM_OK;
    }
    /* A boolean switch whose other value dllm does not implement. */
    dllm_status require_bool(const char *key, bool supported, bool dflt) const {
        bool b = dflt;
        DLLM__TRY(boolean(key, dflt, b));
        if (b != supported)
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: \"%s\" = %s is not supported (only %s)", path.c_str(), key,
                              b ? "true" : "false", supported ? "true" : "false");
        return DLLM_OK;
    }
    /* A string key that must be absent/null or one of the listed values. */
    dllm_status one_of(const char *key, const char *const *allowed, int n_allowed, const char *dflt,
                       std::string &out) const {
        const dllm__json *v = root.find(key);
        if (!v || v->is_null()) {
            out = dflt ? dflt : "";
            return DLLM_OK;
        }
        if (v->kind != dllm__json::STR) return bad(key, "a string");
        for (int i = 0; i < n_allowed; i++)
            if (v->str == allowed[i]) {
                out = v->str;
                return DLLM_OK;
            }
        std::string list;
        for (int i = 0; i < n_allowed; i++) list += dllm__format(i ? ", %s" : "%s", allowed[i]);
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: \"%s\" = \"%s\" is not supported (supported: %s)", path.c_str(),
                          key, v->str.c_str(), list.c_str());
    }
    dllm_status must_be_null(const char *key) const {
        const dllm__json *v = root.find(key);
        if (v && !v->is_null() && !(v->kind == dllm__json::BOOL && !v->boolean))
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: \"%s\" is set; dllm supports only null here", path.c_str(),
                              key);
        return DLLM_OK;
    }
};

static const int dllm__max_dim = 1 << 16, dllm__max_vocab = 1 << 22, dllm__max_ctx = 1 << 20;

/* OLMo's effective_n_kv_heads: multi_query_attention and n_kv_heads may only both be set if they agree. */
static dllm_status dllm__llada_kv_heads(const dllm__cfg_reader &r, dllm__config &c) {
    const dllm__json *mqa_v = r.root.find("multi_query_attention");
    bool mqa_set = mqa_v && !mqa_v->is_null(), mqa = false;
    DLLM__TRY(r.boolean("multi_query_attention", false, mqa));
    int implied = mqa ? 1 : c.n_head;
    DLLM__TRY(r.integer("n_kv_heads", 1, c.n_head, c.n_head_kv, false, implied));
    if (mqa_set && c.n_head_kv != implied)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: multi_query_attention = %s contradicts n_kv_heads = %d", r.path.c_str(),
                          mqa ? "true" : "false", c.n_head_kv);
    return DLLM_OK;
}

/* Keys both families spell the same way. */
static dllm_status dllm__config_shared(const dllm__cfg_reader &r, dllm__config &c) {
    DLLM__TRY(r.number("rope_theta", 1.0, 1e12, c.rope_theta));
    DLLM__TRY(r.number("rms_norm_eps", 0.0, 1.0, c.norm_eps));
    DLLM__TRY(r.token("mask_token_id", c.mask_id));
    DLLM__TRY(r.token("eos_token_id", c.eos_id));
    DLLM__TRY(r.token("pad_token_id", c.pad_id));
    DLLM__TRY(r.token("bos_token_id", c.bos_id));
    return DLLM_OK;
}

static dllm_status dllm__config_llada(const dllm__cfg_reader &r, dllm__config &c) {
    static const char *block_types[] = {"llama"}, *acts[] = {"silu"}, *norms[] = {"rms", "gemma_rms"};
    std::string s;
    DLLM__TRY(r.one_of("block_type", block_types, 1, nullptr, s));
    if (s.empty()) return dllm__fail(DLLM_ERR_FORMAT, "%s: required key \"block_type\" is missing", r.path.c_str());
    DLLM__TRY(r.one_of("activation_type", acts, 1, nullptr, s));
    if (s.empty())
        return dllm__fail(DLLM_ERR_FORMAT, "%s: required key \"activation_type\" is missing", r.path.c_str());
    DLLM__TRY(r.one_of("layer_norm_type", norms, 2, "rms", s));
    c.gemma_norm = s == "gemma_rms";
    DLLM__TRY(r.require_bool("alibi", false, false));
    DLLM__TRY(r.require_bool("rope", true, false));
    DLLM__TRY(r.require_bool("include_bias", false, false));
    DLLM__TRY(r.require_bool("bias_for_layer_norm", false, false));
    DLLM__TRY(r.require_bool("layer_norm_with_affine", true, true));
    DLLM__TRY(r.require_bool("attention_layer_norm", false, false));
    DLLM__TRY(r.require_bool("input_emb_norm", false, false));
    DLLM__TRY(r.must_be_null("clip_qkv"));
    int group = 1;
    DLLM__TRY(r.integer("block_group_size", 1, 1, group, false, 1));
    DLLM__TRY(r.boolean("include_qkv_bias", false, c.qkv_bias));
    DLLM__TRY(r.boolean("weight_tying", false, c.tied_embeddings));
    DLLM__TRY(r.boolean("scale_logits", false, c.scale_logits));
    DLLM__TRY(r.integer("d_model", 1, dllm__max_dim, c.n_embd));
    DLLM__TRY(r.integer("n_heads", 1, 1024, c.n_head));
    DLLM__TRY(r.integer("n_layers", 1, 1024, c.n_layer));
    DLLM__TRY(r.integer("vocab_size", 1, dllm__max_vocab, c.vocab_size));
    DLLM__TRY(r.integer("embedding_size", c.vocab_size, dllm__max_vocab, c.n_vocab, false, c.vocab_size));
    DLLM__TRY(r.integer("max_sequence_length", 1, dllm__max_ctx, c.max_seq_len));
    int ratio = 4;
    DLLM__TRY(r.integer("mlp_ratio", 1, 64, ratio, false, 4));
    DLLM__TRY(r.integer("mlp_hidden_size", 1, 1 << 20, c.n_ff, false, ratio * c.n_embd));
    DLLM__TRY(dllm__llada_kv_heads(r, c));
    DLLM__TRY(dllm__config_shared(r, c));
    if (c.n_embd % c.n_head)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: d_model %d is not a multiple of n_heads %d", r.path.c_str(),
                          c.n_embd, c.n_head);
    c.head_dim = c.n_embd / c.n_head;
    return DLLM_OK;
}

static dllm_status dllm__config_dream(const dllm__cfg_reader &r, dllm__config &c) {
    static const char *acts[] = {"silu"};
    std::string s;
    DLLM__TRY(r.one_of("hidden_act", acts, 1, "silu", s));
    DLLM__TRY(r.must_be_null("rope_scaling"));
    DLLM__TRY(r.require_bool("use_sliding_window", false, false));
    DLLM__TRY(r.boolean("tie_word_embeddings", false, c.tied_embeddings));
    DLLM__TRY(r.integer("hidden_size", 1, dllm__max_dim, c.n_embd));
    DLLM__TRY(r.integer("num_attention_heads", 1, 1024, c.n_head));
    DLLM__TRY(r.integer("num_hidden_layers", 1, 1024, c.n_layer));
    DLLM__TRY(r.integer("num_key_value_heads", 1, c.n_head, c.n_head_kv, false, c.n_head));
    DLLM__TRY(r.integer("intermediate_size", 1, 1 << 20, c.n_ff));
    DLLM__TRY(r.integer("vocab_size", 1, dllm__max_vocab, c.vocab_size));
    DLLM__TRY(r.integer("max_position_embeddings", 1, dllm__max_ctx, c.max_seq_len));
    DLLM__TRY(dllm__config_shared(r, c));
    if (c.n_embd % c.n_head)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: hidden_size %d is not a multiple of num_attention_heads %d",
                          r.path.c_str(), c.n_embd, c.n_head);
    c.head_dim = c.n_embd / c.n_head;
    int head_dim = c.head_dim;
    DLLM__TRY(r.integer("head_dim", c.head_dim, c.head_dim, head_dim, false, c.head_dim));
    c.n_vocab = c.vocab_size;
    c.qkv_bias = true;  // Qwen2 always has q/k/v biases
    c.shift_logits = true;
    return DLLM_OK;
}

/* Fast-dLLM v2 (model_type Fast_dLLM_Qwen): the Qwen2 config plus bd_size (block-diffusion.md). The mask and
 * stop ids are not in config.json: dllm__find_block_tokens reads them from the tokenizer files. */
static dllm_status dllm__config_fast_dllm_v2(const dllm__cfg_reader &r, dllm__config &c) {
    DLLM__TRY(dllm__config_dream(r, c));
    DLLM__TRY(r.integer("bd_size", 1, 4096, c.bd_size, false, 32));
    c.bd_mask_block = 32;  // the default block_size argument of the official forward
    c.stop_id = c.eos_id;  // <|im_end|> in the real config; the tokenizer's <|im_end|> wins when present
    return DLLM_OK;
}

/* Nemotron-Labs-Diffusion rope_parameters (transformers 5): "default" or "yarn" with the keys of
 * transformers' _compute_yarn_parameters, plus Ministral-3's llama_4_scaling_beta. */
static dllm_status dllm__config_rope_parameters(const dllm__cfg_reader &top, dllm__config &c) {
    const dllm__json *rp = top.root.find("rope_parameters");
    if (!rp || rp->is_null()) return top.number("rope_theta", 1.0, 1e12, c.rope_theta);
    std::string path = top.path + ": rope_parameters";
    if (rp->kind != dllm__json::OBJ) return top.bad("rope_parameters", "an object");
    dllm__cfg_reader r{*rp, path};
    static const char *types[] = {"default", "yarn"};
    std::string type;
    DLLM__TRY(r.one_of("rope_type", types, 2, "default", type));
    DLLM__TRY(r.number("rope_theta", 1.0, 1e12, c.rope_theta));
    DLLM__TRY(r.require_bool("truncate", true, true));
    const dllm__json *beta = rp->find("llama_4_scaling_beta");
    if (beta && !beta->is_null()) {
        DLLM__TRY(r.number("llama_4_scaling_beta", 0.0, 100.0, c.llama4_beta));
        DLLM__TRY(r.integer("original_max_position_embeddings", 1, dllm__max_ctx * 64, c.llama4_orig_max));
    }
    if (type != "yarn") return DLLM_OK;
    float factor = 1, fast = 32, slow = 1, mscale = 0, mscale_all = 0, attn = 0;
    DLLM__TRY(r.number("factor", 1.0, 1e6, factor));
    DLLM__TRY(r.integer("original_max_position_embeddings", 1, dllm__max_ctx * 64, c.yarn_orig_max));
    auto optional = [&](const char *key, float &v) -> dllm_status {
        const dllm__json *x = rp->find(key);
        return x && !x->is_null() ? r.number(key, 0.0, 1e6, v) : DLLM_OK;
    };
    DLLM__TRY(optional("beta_fast", fast));
    DLLM__TRY(optional("beta_slow", slow));
    DLLM__TRY(optional("mscale", mscale));
    DLLM__TRY(optional("mscale_all_dim", mscale_all));
    DLLM__TRY(optional("attention_factor", attn));
    c.yarn = true;
    c.yarn_factor = factor;
    c.yarn_beta_fast = fast > 0 ? fast : 32;  // transformers: `get("beta_fast") or 32`
    c.yarn_beta_slow = slow > 0 ? slow : 1;
    auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; };
    if (attn > 0)
        c.yarn_attention_factor = attn;
    else if (mscale > 0 && mscale_all > 0)
        c.yarn_attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all);
    else
        c.yarn_attention_factor = get_mscale(factor, 1.0);
    return DLLM_OK;
}

/* Nemotron-Labs-Diffusion (models.md 4): Ministral-3 shape, encoder.* names, YaRN, Llama-4 query scaling.
 * Whether its logits are shifted is not public: config key "shift_logits" (dllm's own) decides, default
 * shifted, as in the other AR-initialised diffusion models (Dream, Fast-dLLM v2) and as its joint AR loss
 * suggests; check it against modeling_nemotron_labs_diffusion.py when a checkpoint is at hand. */
static dllm_status dllm__config_nemotron(const dllm__cfg_reader &r, dllm__config &c) {
    static const char *acts[] = {"silu"};
    std::string s;
    DLLM__TRY(r.one_of("hidden_act", acts, 1, "silu", s));
    DLLM__TRY(r.require_bool("attention_bias", false, false));
    DLLM__TRY(r.require_bool("mlp_bias", false, false));
    DLLM__TRY(r.must_be_null("sliding_window"));
    DLLM__TRY(r.must_be_null("rope_scaling"));
    DLLM__TRY(r.boolean("tie_word_embeddings", false, c.tied_embeddings));
    DLLM__TRY(r.integer("hidden_size", 1, dllm__max_dim, c.n_embd));
    DLLM__TRY(r.integer("num_attention_heads", 1, 1024, c.n_head));
    DLLM__TRY(r.integer("num_hidden_layers", 1, 1024, c.n_layer));
    DLLM__TRY(r.integer("num_key_value_heads", 1, c.n_head, c.n_head_kv, false, c.n_head));
    DLLM__TRY(r.integer("head_dim", 2, 1024, c.head_dim, false, c.n_embd / c.n_head));
    DLLM__TRY(r.integer("intermediate_size", 1, 1 << 20, c.n_ff));
    DLLM__TRY(r.integer("vocab_size", 1, dllm__max_vocab, c.vocab_size));
    DLLM__TRY(r.integer("max_position_embeddings", 1, dllm__max_ctx * 64, c.max_seq_len));
    c.max_seq_len = std::min(c.max_seq_len, dllm__max_ctx);
    DLLM__TRY(r.integer("block_size", 1, 4096, c.bd_size, false, 32));
    DLLM__TRY(r.number("rms_norm_eps", 0.0, 1.0, c.norm_eps));
    DLLM__TRY(r.token("mask_token_id", c.mask_id));
    DLLM__TRY(r.token("eos_token_id", c.eos_id));
    DLLM__TRY(r.token("pad_token_id", c.pad_id));
    DLLM__TRY(r.token("bos_token_id", c.bos_id));
    DLLM__TRY(dllm__config_rope_parameters(r, c));
    DLLM__TRY(r.boolean("shift_logits", true, c.shift_logits));
    c.n_vocab = c.vocab_size;
    c.bd_mask_block = c.bd_size;
    c.bd_causal_context = true;
    c.stop_id = c.eos_id;
    return DLLM_OK;
}

static dllm_status dllm__config_llada2(const dllm__cfg_reader &r, dllm__config &c);  // model/llada2.cpp

/* Parses a config.json text (path is for messages). */
static dllm_status dllm__config_parse(const dllm__json &root, const std::string &path, dllm__config &c) {
    if (root.kind != dllm__json::OBJ) return dllm__fail(DLLM_ERR_FORMAT, "%s: not a JSON object", path.c_str());
    const dllm__json *mt = root.find("model_type");
    if (!mt || mt->kind != dllm__json::STR)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: required key \"model_type\" is missing", path.c_str());
    dllm__cfg_reader r{root, path};
    c = dllm__config();
    if (mt->str == "llada") {
        c.family = DLLM_FAMILY_LLADA;
        DLLM__TRY(dllm__config_llada(r, c));
    } else if (mt->str == "Dream" || mt->str == "dream") {
        c.family = DLLM_FAMILY_DREAM;
        DLLM__TRY(dllm__config_dream(r, c));
    } else if (mt->str == "Fast_dLLM_Qwen") {
        c.family = DLLM_FAMILY_FAST_DLLM_V2;
        DLLM__TRY(dllm__config_fast_dllm_v2(r, c));
    } else if (mt->str == "nemotron_labs_diffusion") {
        c.family = DLLM_FAMILY_NEMOTRON_DIFFUSION;
        DLLM__TRY(dllm__config_nemotron(r, c));
    } else if (mt->str == "llada2_moe" || mt->str == "llada21_moe") {
        c.family = DLLM_FAMILY_LLADA2;
        DLLM__TRY(dllm__config_llada2(r, c));
    } else {
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "%s: model_type \"%s\" is not supported (supported: llada, Dream, Fast_dLLM_Qwen, "
                          "nemotron_labs_diffusion, llada2_moe)",
                          path.c_str(), mt->str.c_str());
    }
    if (c.n_head % c.n_head_kv)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: %d attention heads are not a multiple of %d key/value heads",
                          path.c_str(), c.n_head, c.n_head_kv);
    if (c.head_dim % 2)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: head dimension %d is odd; rotary embeddings need an even one",
                          path.c_str(), c.head_dim);
    // Fast-dLLM v2 names its mask in the tokenizer files only: dllm__find_block_tokens looks there.
    if (c.mask_id < 0 && c.family != DLLM_FAMILY_FAST_DLLM_V2)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: \"mask_token_id\" is missing; a diffusion model needs its [MASK] id",
                          path.c_str());
    if (c.mask_id >= c.n_vocab)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: mask_token_id %d is outside the vocabulary (%d)", path.c_str(),
                          c.mask_id, c.n_vocab);
    return DLLM_OK;
}

/* tokenizer_config.json's added_tokens_decoder ({"id": {"content": ...}}) of directory dir, if it has one: calls
 * on_token(content, id) for every entry whose key is a non-negative integer id and whose content is a string. */
template <class F> static dllm_status dllm__scan_added_tokens_decoder(const std::string &dir, F &&on_token) {
    std::string path = dllm__join_path(dir, "tokenizer_config.json");
    if (!dllm__file_exists(path)) return DLLM_OK;
    dllm__json root;
    DLLM__TRY(dllm__json_load(path, root));
    const dllm__json *dec = root.find("added_tokens_decoder");
    if (!dec || dec->kind != dllm__json::OBJ) return DLLM_OK;
    for (size_t i = 0; i < dec->keys.size(); i++) {
        const dllm__json *content = dec->items[i].find("content");
        char *endp = nullptr;
        long id = strtol(dec->keys[i].c_str(), &endp, 10);
        if (content && content->kind == dllm__json::STR && endp && *endp == 0 && id >= 0 && id <= INT32_MAX)
            on_token(content->str, (int32_t)id);
    }
    return DLLM_OK;
}

/* Finds the end-of-turn token (LLaDA <|eot_id|>, Qwen <|im_end|>) in tokenizer_config.json, if any. */
static dllm_status dllm__find_eot(const std::string &dir, dllm__config &c) {
    return dllm__scan_added_tokens_decoder(dir, [&](const std::string &content, int32_t id) {
        if ((content == "<|eot_id|>" || content == "<|im_end|>") && id < c.n_vocab) c.eot_id = id;
    });
}

/* config.json need not name BOS (LLaDA's does not); generation_config.json usually does. */
static dllm_status dllm__find_bos(const std::string &dir, dllm__config &c) {
    std::string path = dllm__join_path(dir, "generation_config.json");
    if (c.bos_id >= 0 || !dllm__file_exists(path)) return DLLM_OK;
    dllm__json root;
    DLLM__TRY(dllm__json_load(path, root));
    DLLM__TRY((dllm__cfg_reader{root, path}.token("bos_token_id", c.bos_id)));
    if (c.bos_id >= c.n_vocab)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: bos_token_id %d is outside the vocabulary (%d)", path.c_str(), c.bos_id,
                          c.n_vocab);
    return DLLM_OK;
}

/* Where the path is not a directory at all, say so: "no config.json in this directory" misleads. */
static dllm_status dllm__check_model_dir(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) return dllm__fail(DLLM_ERR_IO, "%s: %s (the model directory)", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dllm__fail(DLLM_ERR_IO, "%s: not a directory; pass the model's directory (config.json, safetensors)",
                          dir);
    return DLLM_OK;
}

/* The id of an added token spelled `content`: added_tokens.json ({"token": id}), else tokenizer_config.json's
 * added_tokens_decoder ({"id": {"content": ...}}); -1 if neither names it. */
static dllm_status dllm__find_added_token(const std::string &dir, const char *content, int32_t &id) {
    id = -1;
    std::string added = dllm__join_path(dir, "added_tokens.json");
    if (dllm__file_exists(added)) {
        dllm__json root;
        DLLM__TRY(dllm__json_load(added, root));
        const dllm__json *v = root.find(content);
        if (v && v->kind == dllm__json::NUM && v->is_integer && v->integer >= 0 && v->integer <= INT32_MAX) {
            id = (int32_t)v->integer;
            return DLLM_OK;
        }
    }
    return dllm__scan_added_tokens_decoder(dir, [&](const std::string &name, int32_t v) {
        if (name == content) id = v;
    });
}

/* Fast-dLLM v2's mask (|<MASK>|) and stop (<|im_end|>) ids live in its tokenizer files, not in config.json
 * (block-diffusion.md). A checkpoint without either still loads with mask_id -1: generating then needs
 * dllm_gen_params.mask_id (dllm__plan_block_diffusion says so). */
static dllm_status dllm__find_block_tokens(const std::string &dir, dllm__config &c) {
    if (c.family != DLLM_FAMILY_FAST_DLLM_V2) return DLLM_OK;
    int32_t mask = -1, stop = -1;
    DLLM__TRY(dllm__find_added_token(dir, "|<MASK>|", mask));
    DLLM__TRY(dllm__find_added_token(dir, "<|im_end|>", stop));
    if (mask >= 0 && c.mask_id < 0) c.mask_id = mask;
    if (stop >= 0) c.stop_id = stop;
    if (c.mask_id >= c.n_vocab || c.stop_id >= c.n_vocab)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: mask id %d or stop id %d is outside the vocabulary (%d)", dir.c_str(),
                          c.mask_id, c.stop_id, c.n_vocab);
    return DLLM_OK;
}
