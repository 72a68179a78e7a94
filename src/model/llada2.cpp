/* src/model/llada2.cpp - LLaDA2.0 / LLaDA2.1 (model_type llada2_moe): config.json and the tensors it demands. */

// ---- LLaDA2 config (../shared/spec/llada2.md) ---------------------------------------------------------------
// The keys the official modeling_llada2_moe.py reads, with the defaults of its LLaDA2MoeConfig where config.json
// may omit them. Keys the official code ignores (rotary_dim, norm_topk_prob, router_dtype, ...) are ignored here.

static const int32_t dllm__llada2_default_mask_id = 156895;  // <|mask|>: the official generate's mask_id default
static const int32_t dllm__llada2_default_eos_id = 156892;   // <|endoftext|>: its eos_id default

/* The switches of the official code that dllm implements one way only. */
static dllm_status dllm__llada2_switches(const dllm__cfg_reader &r, dllm__config &c) {
    static const char *acts[] = {"silu"}, *scores[] = {"sigmoid"};
    std::string s;
    DLLM__TRY(r.one_of("hidden_act", acts, 1, "silu", s));
    DLLM__TRY(r.one_of("score_function", scores, 1, "sigmoid", s));
    DLLM__TRY(r.require_bool("use_qkv_bias", false, false));
    DLLM__TRY(r.require_bool("use_bias", false, true));  // the class default is true: a bias on `dense`
    DLLM__TRY(r.require_bool("norm_head", false, false));
    DLLM__TRY(r.require_bool("use_sliding_window", false, false));
    DLLM__TRY(r.require_bool("moe_router_enable_expert_bias", true, true));
    DLLM__TRY(r.must_be_null("rope_scaling"));
    DLLM__TRY(r.boolean("use_qk_norm", true, c.qk_norm));
    return r.boolean("tie_word_embeddings", false, c.tied_embeddings);
}

/* The attention shape: heads, head_dim and the partial RoPE's rotated dims int(head_dim * partial_rotary_factor). */
static dllm_status dllm__llada2_attention_shape(const dllm__cfg_reader &r, dllm__config &c) {
    DLLM__TRY(r.integer("num_attention_heads", 1, 1024, c.n_head));
    // 0 (LLaDA2.1's class default) means one K/V head per head
    DLLM__TRY(r.integer("num_key_value_heads", 0, c.n_head, c.n_head_kv, false, 0));
    if (c.n_head_kv == 0) c.n_head_kv = c.n_head;
    DLLM__TRY(r.integer("head_dim", 2, 1024, c.head_dim, false, c.n_embd / c.n_head));
    float factor = 0.5f;
    const dllm__json *f = r.root.find("partial_rotary_factor");
    if (f && !f->is_null()) DLLM__TRY(r.number("partial_rotary_factor", 1e-6, 1.0, factor));
    c.rotary_dim = (int)(c.head_dim * (double)factor);
    if (c.rotary_dim < 2 || c.rotary_dim % 2)
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "%s: head_dim %d x partial_rotary_factor %g gives %d rotated dims; RoPE needs an even number "
                          ">= 2",
                          r.path.c_str(), c.head_dim, factor, c.rotary_dim);
    return DLLM_OK;
}

/* The mixture of experts: counts, groups (each of n_expert / n_group experts, scored by its top 2), widths. */
static dllm_status dllm__llada2_moe_shape(const dllm__cfg_reader &r, dllm__config &c) {
    DLLM__TRY(r.integer("num_experts", 1, 4096, c.n_expert));
    DLLM__TRY(r.integer("n_group", 1, c.n_expert, c.n_expert_group));
    if (c.n_expert % c.n_expert_group || c.n_expert / c.n_expert_group < 2)
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "%s: num_experts %d must split into n_group %d groups of at least 2 experts (a group "
                          "scores by its top 2)",
                          r.path.c_str(), c.n_expert, c.n_expert_group);
    DLLM__TRY(r.integer("topk_group", 1, c.n_expert_group, c.n_group_used));
    const int reachable = c.n_group_used * (c.n_expert / c.n_expert_group);
    DLLM__TRY(r.integer("num_experts_per_tok", 1, reachable, c.n_expert_used));
    DLLM__TRY(r.integer("moe_intermediate_size", 1, 1 << 20, c.n_ff_expert));
    int shared = 0;
    DLLM__TRY(r.integer("num_shared_experts", 0, 64, shared, false, 0));
    c.n_ff_shared = shared * c.n_ff_expert;
    DLLM__TRY(r.integer("first_k_dense_replace", 0, c.n_layer, c.n_dense_layers, false, 0));
    DLLM__TRY(r.integer("intermediate_size", 1, 1 << 20, c.n_ff, c.n_dense_layers > 0, 1));
    return r.number("routed_scaling_factor", 0.0, 1e6, c.routed_scale);
}

/* The mask and EOS ids: config.json's, else the official generate's defaults (which must then fit the vocabulary). */
static dllm_status dllm__llada2_token_ids(const dllm__cfg_reader &r, dllm__config &c) {
    DLLM__TRY(r.token("mask_token_id", c.mask_id));
    DLLM__TRY(r.token("eos_token_id", c.eos_id));
    DLLM__TRY(r.token("pad_token_id", c.pad_id));
    DLLM__TRY(r.token("bos_token_id", c.bos_id));
    if (c.mask_id < 0) c.mask_id = dllm__llada2_default_mask_id;
    if (c.eos_id < 0) c.eos_id = dllm__llada2_default_eos_id;
    if (c.eos_id >= c.n_vocab)
        return dllm__fail(DLLM_ERR_FORMAT,
                          "%s: the EOS id %d (eos_token_id, or the official default) is outside the vocabulary (%d)",
                          r.path.c_str(), c.eos_id, c.n_vocab);
    return DLLM_OK;
}

static dllm_status dllm__config_llada2(const dllm__cfg_reader &r, dllm__config &c) {
    DLLM__TRY(dllm__llada2_switches(r, c));
    DLLM__TRY(r.integer("hidden_size", 1, dllm__max_dim, c.n_embd));
    DLLM__TRY(r.integer("num_hidden_layers", 1, 1024, c.n_layer));
    DLLM__TRY(dllm__llada2_attention_shape(r, c));
    DLLM__TRY(dllm__llada2_moe_shape(r, c));
    DLLM__TRY(r.integer("vocab_size", 1, dllm__max_vocab, c.vocab_size));
    c.n_vocab = c.vocab_size;
    DLLM__TRY(r.integer("max_position_embeddings", 1, dllm__max_ctx, c.max_seq_len));
    DLLM__TRY(r.number("rope_theta", 1.0, 1e12, c.rope_theta));
    DLLM__TRY(r.number("rms_norm_eps", 0.0, 1.0, c.norm_eps));
    DLLM__TRY(dllm__llada2_token_ids(r, c));
    c.bd_size = 32;        // generate's default block_length
    c.bd_mask_block = 32;  // dllm_logits: block-causal at that block
    return DLLM_OK;
}

/* Is layer l a MoE layer (not one of the first_k_dense_replace dense ones)? */
static bool dllm__is_moe_layer(const dllm__config &c, size_t l) {
    return c.family == DLLM_FAMILY_LLADA2 && (int)l >= c.n_dense_layers;
}

// ---- LLaDA2 tensors: the hub checkpoint's names and PyTorch shapes [out, in] ---------------------------------

static void dllm__llada2_swiglu_weights(std::vector<dllm__wspec> &w, const std::string &p, int64_t d, int64_t ff, int l,
                                        dllm__wkind gate, dllm__wkind up, dllm__wkind down, int expert = -1) {
    w.push_back({p + "gate_proj.weight", {ff, d}, l, gate, expert});
    w.push_back({p + "up_proj.weight", {ff, d}, l, up, expert});
    w.push_back({p + "down_proj.weight", {d, ff}, l, down, expert});
}

static void dllm__llada2_moe_weights(std::vector<dllm__wspec> &w, const dllm__config &c, const std::string &mlp,
                                     int l) {
    const int64_t d = c.n_embd;
    w.push_back({mlp + "gate.weight", {c.n_expert, d}, l, DLLM__W_ROUTER});
    w.push_back({mlp + "gate.expert_bias", {c.n_expert}, l, DLLM__W_EXPERT_BIAS});
    for (int e = 0; e < c.n_expert; e++)
        dllm__llada2_swiglu_weights(w, mlp + dllm__format("experts.%d.", e), d, c.n_ff_expert, l, DLLM__W_EXPERT_GATE,
                                    DLLM__W_EXPERT_UP, DLLM__W_EXPERT_DOWN, e);
    if (c.n_ff_shared > 0)
        dllm__llada2_swiglu_weights(w, mlp + "shared_experts.", d, c.n_ff_shared, l, DLLM__W_SHARED_GATE,
                                    DLLM__W_SHARED_UP, DLLM__W_SHARED_DOWN);
}

static std::vector<dllm__wspec> dllm__llada2_expected_weights(const dllm__config &c) {
    const int64_t d = c.n_embd, hd = c.head_dim, q = (int64_t)c.n_head * hd, kv = (int64_t)c.n_head_kv * hd;
    std::vector<dllm__wspec> w;
    w.push_back({"model.word_embeddings.weight", {c.n_vocab, d}, -1, DLLM__W_EMBED});
    for (int l = 0; l < c.n_layer; l++) {
        const std::string p = dllm__format("model.layers.%d.", l), attn = p + "attention.", mlp = p + "mlp.";
        w.push_back({p + "input_layernorm.weight", {d}, l, DLLM__W_ATTN_NORM});
        w.push_back({attn + "query_key_value.weight", {q + 2 * kv, d}, l, DLLM__W_QKV});
        if (c.qk_norm) {
            w.push_back({attn + "query_layernorm.weight", {hd}, l, DLLM__W_Q_NORM});
            w.push_back({attn + "key_layernorm.weight", {hd}, l, DLLM__W_K_NORM});
        }
        w.push_back({attn + "dense.weight", {d, q}, l, DLLM__W_O});
        w.push_back({p + "post_attention_layernorm.weight", {d}, l, DLLM__W_FFN_NORM});
        if (dllm__is_moe_layer(c, (size_t)l))
            dllm__llada2_moe_weights(w, c, mlp, l);
        else
            dllm__llada2_swiglu_weights(w, mlp, d, c.n_ff, l, DLLM__W_GATE, DLLM__W_UP, DLLM__W_DOWN);
    }
    w.push_back({"model.norm.weight", {d}, -1, DLLM__W_FINAL_NORM});
    if (!c.tied_embeddings) w.push_back({"lm_head.weight", {c.n_vocab, d}, -1, DLLM__W_HEAD});
    return w;
}
