/* quantized: a quantised checkpoint (dllm_model_quantize's format) through dllm_model_load: arbitrary bytes as the
 * model.safetensors of a directory whose config.json is a one-layer LLaDA of width 16 (fuzz_quantized_config). The
 * seeds (corpus/quantized) are dllm-quantize's output for that config with random F32 weights, at soloq-n (with the
 * LM head: NVFP4 block scales), soloq-i, soloq-c (E8P codes) and rtn-w4a4. A load either fails with a format, shape
 * or unsupported status naming the problem, or holds every stored site with the config's shapes, and then a CPU
 * context at the stored precision runs a forward over every code (AddressSanitizer sees any read outside a row). */

static const char *const fuzz_quantized_config =
    "{\"activation_type\":\"silu\",\"alibi\":false,\"alibi_bias_max\":8.0,\"attention_dropout\":0.0,\"attention_lay"
    "er_norm\":false,\"attention_layer_norm_with_affine\":true,\"bias_for_layer_norm\":false,\"block_group_size\":1"
    ",\"block_type\":\"llama\",\"d_model\":16,\"embedding_dropout\":0.0,\"embedding_size\":24,\"eos_token_id\":20,\""
    "flash_attention\":false,\"include_bias\":false,\"include_qkv_bias\":false,\"init_cutoff_factor\":null,\"init_d"
    "evice\":\"meta\",\"init_fn\":\"mitchell\",\"init_std\":0.02,\"input_emb_norm\":false,\"layer_norm_type\":\"rms"
    "\",\"layer_norm_with_affine\":true,\"mask_token_id\":22,\"max_sequence_length\":64,\"mlp_hidden_size\":16,\"ml"
    "p_ratio\":4,\"model_type\":\"llada\",\"multi_query_attention\":null,\"n_heads\":2,\"n_kv_heads\":2,\"n_layers\""
    ":1,\"pad_token_id\":20,\"precision\":\"amp_bf16\",\"residual_dropout\":0.0,\"rms_norm_eps\":1e-05,\"rope\":tru"
    "e,\"rope_full_precision\":true,\"rope_theta\":500000.0,\"scale_logits\":false,\"transformers_version\":\"4.46."
    "3\",\"use_cache\":false,\"vocab_size\":24,\"weight_tying\":false}";

static void fuzz_quantized_init() {
    fuzz_make_dir();
    fuzz_write("config.json", std::string(fuzz_quantized_config));
}

static int fuzz_quantized(const uint8_t *data, size_t n) {
    fuzz_write("model.safetensors", data, n);
    dllm_model_params mp = dllm_model_default_params();
    mp.use_mmap = n % 2 == 0;
    dllm_model *m = nullptr;
    dllm_status s = dllm_model_load(fuzz_dir.c_str(), mp, &m);
    if (s != DLLM_OK) {
        FUZZ_CHECK(m == nullptr && (s == DLLM_ERR_FORMAT || s == DLLM_ERR_SHAPE || s == DLLM_ERR_UNSUPPORTED) &&
                   *dllm_last_error());
        return 0;
    }
    if (m->soloq) {
        const dllm__soloq_store &q = *m->soloq;
        FUZZ_CHECK(q.layers.size() == (size_t)m->cfg.n_layer && (q.head != nullptr) == q.opt.quantize_head &&
                   (m->cfg.tied_embeddings || (m->head == nullptr) == (q.head != nullptr)));
        for (int l = -1; l < m->cfg.n_layer; l++)
            for (int site = 0; site < DLLM__SOLOQ_SITES; site++) {
                if ((l < 0) != (site == DLLM__SOLOQ_HEAD) || (l < 0 && !q.head)) continue;
                const dllm__q4_rows &w = (l < 0 ? *q.head : *q.layers[(size_t)l]).lin[site].w;
                int rows = 0, cols = 0;
                dllm__soloq_site_shape(m->cfg, l < 0 ? 0 : l, site, -1, rows, cols);
                FUZZ_CHECK(w.rows == rows && w.cols == cols && w.codes.size() == (size_t)rows * cols / 2 &&
                           w.row_scale.size() == (size_t)rows);
                FUZZ_CHECK(w.block_scales.size() == (w.format == DLLM__Q4_NVFP4 ? (size_t)rows * w.blocks() : 0));
            }
    }
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_CPU, cp.n_threads = 1;
    dllm_ctx *ctx = nullptr;
    s = dllm_ctx_create(m, cp, &ctx);
    FUZZ_CHECK(s == DLLM_OK || s == DLLM_ERR_FORMAT);  // FORMAT: non-finite dense weights
    if (ctx) {
        const int32_t ids[4] = {1, 22, 7, 22};
        std::vector<float> logits((size_t)4 * m->cfg.n_vocab);
        FUZZ_CHECK(dllm_logits(ctx, ids, 4, 0, 4, logits.data(), logits.size()) == DLLM_OK);
    }
    dllm_ctx_free(ctx);
    dllm_model_free(m);
    return 0;
}
