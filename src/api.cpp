/* src/api.cpp - the public API. */

// ---------------------------------------------------------------------------------------------------
// 18. Public API
//     Every entry point converts C++ exceptions (allocation failure) into a status and records the
//     error detail for dllm_last_error() and, where there is a context, dllm_ctx_last_error().
// ---------------------------------------------------------------------------------------------------

template <class F> static dllm_status dllm__guard(dllm_ctx *ctx, F &&body) {
    // dllm_last_error is the last *failing* call's detail: a call that succeeds leaves it as it was, though a failure
    // it recovered from inside (a GEMM candidate that failed its timing, a kernel that fell back) recorded its own.
    std::string earlier_error;
    earlier_error.swap(dllm__tls_error);  // swaps allocate nothing: allocation-failure injection reaches only the body
    dllm_status st;
    try {
        st = body();
    } catch (const std::bad_alloc &) {
        st = DLLM_ERR_OUT_OF_MEMORY;
        dllm__set_error_nothrow(dllm__tls_error, "out of host memory");  // dllm__fail could throw again
    } catch (const std::exception &e) {
        st = DLLM_ERR_INTERNAL;
        try {
            dllm__fail(st, "unexpected exception: %s", e.what());
        } catch (...) { dllm__set_error_nothrow(dllm__tls_error, "unexpected exception"); }
    } catch (...) {
        st = DLLM_ERR_INTERNAL;
        dllm__set_error_nothrow(dllm__tls_error, "unexpected exception");
    }
    if (st == DLLM_OK)
        dllm__tls_error.swap(earlier_error);
    else if (ctx)
        dllm__set_error_nothrow(ctx->last_error, dllm__tls_error.c_str());
    return st;
}

/* A sequence of the stepper by id, or the error that names the id. */
static dllm_status dllm__stepper_seq_of(const dllm_stepper *stepper, const char *fn, int seq_id,
                                        dllm__stepper_seq *&q) {
    q = stepper->find(seq_id);
    if (!q)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "%s: the stepper holds no sequence %d (removed, or never added)",
                          fn, seq_id);
    return DLLM_OK;
}

}  // namespace
#pragma GCC visibility pop

extern "C" {

const char *dllm_status_str(dllm_status s) {
    switch (dllm__enum_int(s)) {
        case DLLM_OK: return "DLLM_OK";
        case DLLM_ERR_INVALID_ARGUMENT: return "DLLM_ERR_INVALID_ARGUMENT";
        case DLLM_ERR_IO: return "DLLM_ERR_IO";
        case DLLM_ERR_FORMAT: return "DLLM_ERR_FORMAT";
        case DLLM_ERR_SHAPE: return "DLLM_ERR_SHAPE";
        case DLLM_ERR_UNSUPPORTED: return "DLLM_ERR_UNSUPPORTED";
        case DLLM_ERR_OUT_OF_MEMORY: return "DLLM_ERR_OUT_OF_MEMORY";
        case DLLM_ERR_NO_DEVICE: return "DLLM_ERR_NO_DEVICE";
        case DLLM_ERR_CUDA: return "DLLM_ERR_CUDA";
        case DLLM_ERR_JIT: return "DLLM_ERR_JIT";
        case DLLM_ERR_CANCELLED: return "DLLM_ERR_CANCELLED";
        case DLLM_ERR_BUFFER_TOO_SMALL: return "DLLM_ERR_BUFFER_TOO_SMALL";
        case DLLM_ERR_INTERNAL: return "DLLM_ERR_INTERNAL";
        case DLLM_ERR_FULL: return "DLLM_ERR_FULL";
    }
    return "DLLM_ERR_UNKNOWN";
}

const char *dllm_last_error(void) { return dllm__tls_error.c_str(); }

double dllm_rng_uniform(uint64_t seed, uint32_t index, uint32_t position, uint32_t step, uint32_t stream) {
    return dllm__uniform(seed, index, position, step, stream);
}

void dllm_log_set(dllm_log_fn fn, void *user_data, dllm_log_level max_level) {
    dllm__log_fn = fn ? fn : dllm__default_log;
    dllm__log_data = fn ? user_data : nullptr;
    dllm__log_max = fn ? max_level : DLLM_LOG_WARN;
}

dllm_model_params dllm_model_default_params(void) {
    dllm_model_params p;
    p.use_mmap = 1;
    return p;
}

dllm_status dllm_model_load(const char *dir, dllm_model_params params, dllm_model **out_model) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!out_model) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_load: out_model is NULL");
        *out_model = nullptr;
        if (!dir) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_load: dir is NULL");
        std::unique_ptr<dllm_model> m;
        DLLM__TRY(dllm__load_model(dir, params, m));
        dllm__log(DLLM_LOG_INFO, "loaded %s: %s, %d layers, d=%d, %lld parameters", dir,
                  dllm__family_name(m->cfg.family), m->cfg.n_layer, m->cfg.n_embd, (long long)m->n_params);
        *out_model = m.release();
        return DLLM_OK;
    });
}

dllm_status dllm_model_load_random(const char *config_path, uint64_t seed, dllm_model **out_model) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!out_model) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_load_random: out_model is NULL");
        *out_model = nullptr;
        if (!config_path) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_load_random: config_path is NULL");
        std::unique_ptr<dllm_model> m(new dllm_model);
        std::string path = config_path;
        if (!dllm__file_exists(path)) path = dllm__join_path(path, "config.json");
        dllm__json cfg;
        DLLM__TRY(dllm__json_load(path, cfg));
        DLLM__TRY(dllm__config_parse(cfg, path, m->cfg));
        DLLM__TRY(dllm__find_block_tokens(path.substr(0, path.find_last_of('/') + 1) + ".", m->cfg));
        for (const dllm__wspec &s : dllm__expected_weights(m->cfg)) {
            int64_t n = 1;
            for (int64_t d : s.shape) n *= d;
            m->n_params += n;
        }
        m->random_weights = true;
        m->random_seed = seed;
        *out_model = m.release();
        return DLLM_OK;
    });
}

void dllm_model_free(dllm_model *model) { delete model; }

dllm_status dllm_model_get_info(const dllm_model *m, dllm_model_info *out) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!m || !out) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_get_info: NULL argument");
        const dllm__config &c = m->cfg;
        out->family = c.family;
        out->n_vocab = c.n_vocab;
        out->n_embd = c.n_embd;
        out->n_layer = c.n_layer;
        out->n_head = c.n_head;
        out->n_head_kv = c.n_head_kv;
        out->head_dim = c.head_dim;
        out->n_ff = c.n_ff;
        out->max_seq_len = c.max_seq_len;
        out->shift_logits = c.shift_logits;
        out->mask_id = c.mask_id;
        out->eos_id = c.eos_id;
        out->eot_id = c.eot_id;
        out->bos_id = c.bos_id;
        out->n_params = m->n_params;
        out->block_size = dllm__is_block_diffusion(c) || c.family == DLLM_FAMILY_LLADA2 ? c.bd_size : 0;
        out->stop_id = dllm__is_block_diffusion(c) ? c.stop_id : -1;
        out->precision = m->soloq ? m->soloq->precision : DLLM_PRECISION_BF16;
        out->quantized_lm_head = m->soloq && m->soloq->head ? 1 : 0;
        return DLLM_OK;
    });
}

dllm_ctx_params dllm_ctx_default_params(void) {
    dllm_ctx_params p;
    p.backend = DLLM_BACKEND_AUTO;
    p.device = 0;
    p.max_tokens = 0;
    p.n_threads = 0;
    p.precision = DLLM_PRECISION_AUTO;
    p.quantize_lm_head = 0;
    p.kv_quant = DLLM_KV_QUANT_NONE;
    p.kv_sink_tokens = -1;
    p.n_devices = 0;
    for (int i = 0; i < DLLM_MAX_DEVICES; i++) p.devices[i] = i;
    p.soloq_rotation = DLLM_SOLOQ_ROTATION_DEFAULT;
    p.soloq_bias_correction = -1;
    p.progress = nullptr;
    p.progress_user_data = nullptr;
    return p;
}

dllm_status dllm_kv_bytes_per_token(const dllm_model *model, dllm_kv_quant kv_quant, int block_length, double *bytes) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!model || !bytes)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_kv_bytes_per_token: model and bytes must not be NULL");
        const int mode = dllm__enum_int(kv_quant), group = block_length ? block_length : model->cfg.bd_size;
        DLLM__TRY(dllm__kvq_check(model->cfg, mode, -1, model->cfg.max_seq_len));
        if (mode != DLLM_KV_QUANT_NONE && (block_length < 0 || group <= 0))
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "dllm_kv_bytes_per_token: block_length %d must be positive (0 = the model's)",
                              block_length);
        *bytes = dllm__kvq_bytes_per_token(model->cfg, mode, group);
        return DLLM_OK;
    });
}

dllm_status dllm_ctx_create(dllm_model *model, dllm_ctx_params params, dllm_ctx **out_ctx) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!out_ctx) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: out_ctx is NULL");
        *out_ctx = nullptr;
        if (!model) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: model is NULL");
        int backend = dllm__enum_int(params.backend);
        if (backend < DLLM_BACKEND_AUTO || backend > DLLM_BACKEND_GPU)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: unknown backend %d", backend);
        if (params.max_tokens < 0 || params.max_tokens > model->cfg.max_seq_len)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "dllm_ctx_create: max_tokens %d must be in [0, %d] (0 = the model's limit)",
                              params.max_tokens, model->cfg.max_seq_len);
        if (params.n_threads < 0 || params.n_threads > 1024)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "dllm_ctx_create: n_threads (--threads) %d must be in [0, 1024]", params.n_threads);
        int precision = dllm__enum_int(params.precision);
        if (precision < DLLM_PRECISION_AUTO || precision > DLLM_PRECISION_RTN_W4A16)
            return dllm__fail(
                DLLM_ERR_INVALID_ARGUMENT,
                "dllm_ctx_create: precision %d must be a dllm_precision, DLLM_PRECISION_AUTO (-1) to _RTN_W4A16 (10)",
                precision);
        DLLM__TRY(dllm__soloq_check_ablation("dllm_ctx_create", dllm__enum_int(params.soloq_rotation),
                                             params.soloq_bias_correction));
        DLLM__TRY(dllm__resolve_precision(*model, precision, dllm__enum_int(params.soloq_rotation),
                                          params.soloq_bias_correction, precision));  // AUTO never reaches a backend
        params.precision = (dllm_precision)precision;
        if (params.quantize_lm_head != 0 && params.quantize_lm_head != 1)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: quantize_lm_head %d must be 0 or 1",
                              params.quantize_lm_head);
        DLLM__TRY(dllm__kvq_check(model->cfg, dllm__enum_int(params.kv_quant), params.kv_sink_tokens,
                                  params.max_tokens ? params.max_tokens : model->cfg.max_seq_len));
        DLLM__TRY(dllm__tp_check_params(model->cfg, params));
        if (params.n_devices == 1) params.device = params.devices[0];
        std::unique_ptr<dllm_ctx> ctx(new dllm_ctx);
        ctx->model = model;
        ctx->params = params;
        ctx->max_tokens = params.max_tokens ? params.max_tokens : model->cfg.max_seq_len;
        DLLM__TRY(dllm__create_backend(*ctx));
        *out_ctx = ctx.release();
        return DLLM_OK;
    });
}

dllm_quantize_params dllm_quantize_default_params(void) {
    dllm_quantize_params p;
    memset(&p, 0, sizeof p);
    p.precision = DLLM_PRECISION_SOLOQ_N;
    p.max_shard_bytes = (size_t)4 << 30;
    p.soloq_rotation = DLLM_SOLOQ_ROTATION_DEFAULT;
    p.soloq_bias_correction = -1;
    return p;
}

dllm_status dllm_model_quantize(const dllm_model *model, const char *out_dir, const dllm_quantize_params *params) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!model || !out_dir || !*out_dir)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "dllm_model_quantize: model and out_dir must not be NULL or empty");
        const dllm_quantize_params p = params ? *params : dllm_quantize_default_params();
        const int precision = dllm__enum_int(p.precision);
        if (!dllm__precision_is_soloq(precision))
            return dllm__fail(
                DLLM_ERR_INVALID_ARGUMENT,
                "dllm_model_quantize: precision %s is not one dllm-quantize writes: use soloq-n, soloq-i, soloq-c or "
                "rtn-w4a4 (or a -w4a16 form)",
                dllm__precision_name(precision));
        if (p.quantize_lm_head != 0 && p.quantize_lm_head != 1)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_quantize: quantize_lm_head %d must be 0 or 1",
                              p.quantize_lm_head);
        if (p.n_threads < 0 || p.n_threads > 1024)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_quantize: n_threads %d must be in [0, 1024]",
                              p.n_threads);
        if (p.max_shard_bytes == 0)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "dllm_model_quantize: max_shard_bytes must be positive (default 4 GiB)");
        if (model->random_weights)
            return dllm__fail(
                DLLM_ERR_UNSUPPORTED,
                "dllm_model_quantize: a model with random weights has no checkpoint to quantise; load one with "
                "dllm_model_load");
        if (model->soloq)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "dllm_model_quantize: %s is already quantised (%s); quantise the unquantised model",
                              model->dir.c_str(), dllm__precision_name(model->soloq->precision));
        dllm__soloq_options o;
        DLLM__TRY(dllm__soloq_check_ablation("dllm_model_quantize", dllm__enum_int(p.soloq_rotation),
                                             p.soloq_bias_correction));
        DLLM__TRY(dllm__soloq_options_for(precision, p.quantize_lm_head, p.soloq_rotation, p.soloq_bias_correction, o));
        DLLM__TRY(dllm__soloq_check_dims(model->cfg, o));
        return dllm__soloq_write(*model, out_dir, precision, o, p);
    });
}

void dllm_ctx_free(dllm_ctx *ctx) { delete ctx; }

const char *dllm_ctx_last_error(const dllm_ctx *ctx) { return ctx ? ctx->last_error.c_str() : ""; }

dllm_backend dllm_ctx_get_backend(const dllm_ctx *ctx) { return ctx ? ctx->backend : DLLM_BACKEND_AUTO; }

dllm_status dllm_logits(dllm_ctx *ctx, const int32_t *ids, int n_ids, int row_begin, int row_end, float *out,
                        size_t out_count) {
    return dllm__guard(ctx, [&]() -> dllm_status {
        if (!ctx || !ids || !out) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_logits: NULL argument");
        const dllm__config &c = ctx->model->cfg;
        if (n_ids <= 0 || n_ids > ctx->max_tokens)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_logits: n_ids %d must be in [1, %d]", n_ids,
                              ctx->max_tokens);
        if (row_begin < 0 || row_end <= row_begin || row_end > n_ids)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "dllm_logits: rows [%d, %d) must be a non-empty range inside [0, %d)", row_begin, row_end,
                              n_ids);
        if (out_count < (size_t)(row_end - row_begin) * c.n_vocab)
            return dllm__fail(DLLM_ERR_BUFFER_TOO_SMALL, "dllm_logits: out holds %zu floats, %zu needed", out_count,
                              (size_t)(row_end - row_begin) * c.n_vocab);
        for (int i = 0; i < n_ids; i++)
            if (ids[i] < 0 || ids[i] >= c.n_vocab)
                return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                                  "dllm_logits: ids[%d] = %d is outside the vocabulary [0, %d)", i, ids[i], c.n_vocab);
        return ctx->impl->logits(ids, n_ids, row_begin, row_end, out);
    });
}

dllm_gen_params dllm_gen_default_params(void) {
    dllm_gen_params p;
    memset(&p, 0, sizeof p);
    p.gen_length = 128;
    p.steps = 128;
    p.block_length = 32;
    p.temperature = 0.0f;
    p.cfg_scale = 0.0f;
    p.remasking = DLLM_REMASK_LOW_CONFIDENCE;
    p.seed = 0;
    p.stop_at_eos = 1;
    p.lacache = DLLM_LACACHE_ON;
    p.mask_id = -1;
    p.eos_id = -1;
    p.eot_id = -1;
    p.unmask = DLLM_UNMASK_SCHEDULE;
    p.threshold = 0.9;
    p.factor = 1.0;
    p.eps = 1e-3;
    p.alg_temp = 0.0;
    p.kv_cache = DLLM_KV_CACHE_NONE;
    p.dpad = DLLM_DPAD_OFF;
    p.dpad_window = 256;
    p.dpad_k = 4.0f;
    p.dpad_scale = 2.0f;
    p.dpad_n = 64;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.sub_block_length = 0;
    p.block_cache = 0;
    p.stop_id = -1;
    p.edit_threshold = -1;
    p.max_post_steps = -1;
    return p;
}

dllm_status dllm_generate(dllm_ctx *ctx, const int32_t *prompt, int n_prompt, dllm_gen_params params, int32_t *out,
                          int out_capacity, int *n_out, dllm_gen_stats *stats) {
    if (n_out) *n_out = 0;
    return dllm__guard(ctx, [&]() -> dllm_status {
        if (!ctx) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_generate: ctx is NULL");
        DLLM__TRY(dllm__check_tuned_forwards(params));
        dllm_status s = dllm__generate_as_batch(*ctx, params)
                            ? dllm__generate_one(*ctx, prompt, n_prompt, params, out, out_capacity, n_out, stats)
                            : dllm__generate_impl(*ctx, prompt, n_prompt, params, out, out_capacity, n_out, stats);
        if (s == DLLM_ERR_BUFFER_TOO_SMALL && n_out)
            *n_out = dllm__out_needed(*ctx, n_prompt, params);  // the size needed, as dllm_tokenize reports it
        return s;
    });
}

dllm_status dllm_generate_batch(dllm_ctx *ctx, const dllm_batch_item *items, int n_items, dllm_batch_result *results,
                                dllm_gen_stats *batch_stats) {
    const dllm_status pending = (dllm_status)1;  // not a status: an item the call has not finished
    if (batch_stats) memset(batch_stats, 0, sizeof *batch_stats);
    if (results && n_items > 0)
        for (int i = 0; i < n_items; i++) memset(&results[i], 0, sizeof results[i]), results[i].status = pending;
    const double t0 = dllm__now_ms();
    dllm_gen_stats stats;
    memset(&stats, 0, sizeof stats);
    dllm_status global = dllm__guard(ctx, [&]() -> dllm_status {
        if (!ctx) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_generate_batch: ctx is NULL");
        if (n_items < 0 || (n_items > 0 && (!items || !results)))
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "dllm_generate_batch: n_items %d must be >= 0, with items and results non-NULL when > 0",
                              n_items);
        if (ctx->stepper)
            return dllm__fail(
                DLLM_ERR_INVALID_ARGUMENT,
                "dllm_generate_batch: the context has a dllm_stepper, whose batch caches it would use: add "
                "the items to the stepper, or free it first");
        return dllm__generate_batch_impl(*ctx, items, n_items, results, stats);
    });
    // From here on no exception may be thrown (nothing catches it): the messages are copied by dllm__set_error_nothrow.
    dllm_status first = global;  // a global failure is every unfinished item's; else the first failing item's status
    const char *item_error = nullptr;  // the first failing item's message, when there is no global failure
    for (int i = 0; results && i < n_items; i++) {
        if (results[i].status == pending)
            dllm__batch_set_status(results[i], global != DLLM_OK ? global : DLLM_ERR_INTERNAL);
        if (first == DLLM_OK && results[i].status != DLLM_OK) first = results[i].status, item_error = results[i].error;
        stats.n_prompt += results[i].stats.n_prompt, stats.n_generated += results[i].stats.n_generated;
    }
    stats.wall_ms = dllm__now_ms() - t0;
    if (batch_stats) *batch_stats = stats;
    if (item_error) {
        dllm__set_error_nothrow(dllm__tls_error, item_error);
        if (ctx) dllm__set_error_nothrow(ctx->last_error, item_error);
    }
    return first;
}

dllm_stepper_params dllm_stepper_default_params(void) {
    dllm_stepper_params p;
    memset(&p, 0, sizeof p);
    p.max_sequences = 16;
    p.max_fill_rows = 1024;
    return p;
}

dllm_status dllm_stepper_create(dllm_ctx *ctx, dllm_stepper_params params, dllm_stepper **out_stepper) {
    if (out_stepper) *out_stepper = nullptr;
    return dllm__guard(ctx, [&]() -> dllm_status {
        if (!ctx || !out_stepper)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_stepper_create: ctx or out_stepper is NULL");
        if (ctx->stepper)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "dllm_stepper_create: the context has a stepper already (one at a time: free it first)");
        if (params.max_sequences < 1)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_stepper_create: max_sequences must be >= 1, got %d",
                              params.max_sequences);
        if (params.max_fill_rows < 0)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "dllm_stepper_create: max_fill_rows must be >= 0 (0: no bound), got %d",
                              params.max_fill_rows);
        *out_stepper = new dllm_stepper(*ctx, params.max_sequences, "dllm_stepper");
        (*out_stepper)->max_fill_rows = params.max_fill_rows;
        return DLLM_OK;
    });
}

void dllm_stepper_free(dllm_stepper *stepper) { delete stepper; }

dllm_status dllm_stepper_can_add(dllm_stepper *stepper, const dllm_batch_item *item) {
    return dllm__guard(stepper ? &stepper->ctx : nullptr, [&]() -> dllm_status {
        if (!stepper || !item) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_stepper_can_add: NULL argument");
        DLLM__TRY(stepper->room());
        dllm__stepper_seq q;
        q.item = *item;
        return stepper->admit(q);
    });
}

dllm_status dllm_stepper_add(dllm_stepper *stepper, const dllm_batch_item *item, int *seq_id) {
    if (seq_id) *seq_id = -1;
    return dllm__guard(stepper ? &stepper->ctx : nullptr, [&]() -> dllm_status {
        if (!stepper || !item || !seq_id)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_stepper_add: stepper, item and seq_id must be non-NULL");
        return stepper->add(*item, nullptr, seq_id);
    });
}

dllm_status dllm_stepper_step(dllm_stepper *stepper) {
    return dllm__guard(stepper ? &stepper->ctx : nullptr, [&]() -> dllm_status {
        if (!stepper) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_stepper_step: stepper is NULL");
        return stepper->step();
    });
}

int dllm_stepper_n_active(const dllm_stepper *stepper) { return stepper ? stepper->n_active() : 0; }

dllm_status dllm_stepper_poll(const dllm_stepper *stepper, int seq_id, dllm_seq_event *event) {
    return dllm__guard(stepper ? &stepper->ctx : nullptr, [&]() -> dllm_status {
        if (!stepper || !event)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_stepper_poll: stepper or event is NULL");
        dllm__stepper_seq *q = nullptr;
        DLLM__TRY(dllm__stepper_seq_of(stepper, "dllm_stepper_poll", seq_id, q));
        event->stepped = q->watch.stepped;
        event->info = q->watch.info;
        event->finished = q->at == dllm__stepper_seq::ENDED;
        event->result = *q->result;
        return DLLM_OK;
    });
}

dllm_status dllm_stepper_cancel(dllm_stepper *stepper, int seq_id) {
    return dllm__guard(stepper ? &stepper->ctx : nullptr, [&]() -> dllm_status {
        if (!stepper) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_stepper_cancel: stepper is NULL");
        dllm__stepper_seq *q = nullptr;
        DLLM__TRY(dllm__stepper_seq_of(stepper, "dllm_stepper_cancel", seq_id, q));
        return stepper->cancel(*q);
    });
}

dllm_status dllm_stepper_remove(dllm_stepper *stepper, int seq_id) {
    return dllm__guard(stepper ? &stepper->ctx : nullptr, [&]() -> dllm_status {
        if (!stepper) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_stepper_remove: stepper is NULL");
        dllm__stepper_seq *q = nullptr;
        DLLM__TRY(dllm__stepper_seq_of(stepper, "dllm_stepper_remove", seq_id, q));
        DLLM__TRY(stepper->cancel(*q));
        stepper->remove(seq_id);
        return DLLM_OK;
    });
}

const char *dllm_version(void) {
    return DLLM__XSTR(DLLM_VERSION_MAJOR) "." DLLM__XSTR(DLLM_VERSION_MINOR) "." DLLM__XSTR(DLLM_VERSION_PATCH);
}

dllm_status dllm_tokenizer_load(const char *dir, dllm_tokenizer **out_tok) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!out_tok) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_tokenizer_load: out_tok is NULL");
        *out_tok = nullptr;
        if (!dir) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_tokenizer_load: dir is NULL");
        std::unique_ptr<dllm_tokenizer> t;
        DLLM__TRY(dllm__tok_load(dir, t));
        dllm__log(DLLM_LOG_INFO, "tokenizer %s: %d ids, %zu merges, %zu added tokens", dir, t->n_vocab,
                  t->merges.size(), t->added.size());
        *out_tok = t.release();
        return DLLM_OK;
    });
}

void dllm_tokenizer_free(dllm_tokenizer *tok) { delete tok; }

int dllm_tokenizer_n_vocab(const dllm_tokenizer *tok) { return tok ? tok->n_vocab : 0; }

int32_t dllm_tokenizer_token_id(const dllm_tokenizer *tok, const char *token) {
    if (!tok || !token) return -1;
    try {  // each lookup makes a std::string of the token: out of memory is -1 (no status to say more)
        auto added = tok->added_ids.find(token);
        if (added != tok->added_ids.end()) return added->second;
        auto it = tok->vocab.find(token);
        return it == tok->vocab.end() ? -1 : it->second;
    } catch (...) { return -1; }
}

dllm_status dllm_tokenizer_check_model(const dllm_tokenizer *tok, const dllm_model *model) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!tok || !model)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_tokenizer_check_model: NULL argument");
        if (tok->n_vocab > model->cfg.n_vocab)
            return dllm__fail(DLLM_ERR_SHAPE,
                              "the tokenizer in %s produces ids up to %d but the model in %s has %d embedding rows: "
                              "they do not belong together",
                              tok->dir.c_str(), tok->n_vocab - 1, model->dir.c_str(), model->cfg.n_vocab);
        return DLLM_OK;
    });
}

dllm_status dllm_tokenize(const dllm_tokenizer *tok, const char *text, size_t text_len, int parse_special, int32_t *ids,
                          int capacity, int *n_ids) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (n_ids) *n_ids = 0;
        if (!tok || !n_ids || (!text && text_len))
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_tokenize: NULL argument");
        if (capacity < 0 || (!ids && capacity))
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_tokenize: capacity %d with %s ids", capacity,
                              ids ? "non-NULL" : "NULL");
        std::vector<int32_t> out;
        dllm__tokenize(*tok, text, text_len, parse_special != 0, out);
        if (out.size() > (size_t)INT32_MAX)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_tokenize: the text makes more than 2^31 tokens");
        *n_ids = (int)out.size();
        if (out.size() > (size_t)capacity)
            return dllm__fail(DLLM_ERR_BUFFER_TOO_SMALL,
                              "dllm_tokenize: the text makes %zu tokens, the buffer holds %d", out.size(), capacity);
        if (!out.empty()) memcpy(ids, out.data(), out.size() * sizeof(int32_t));
        return DLLM_OK;
    });
}

dllm_status dllm_detokenize(const dllm_tokenizer *tok, const int32_t *ids, int n_ids, int skip_special, char *text,
                            size_t capacity, size_t *text_len) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (text_len) *text_len = 0;
        if (!tok || (!ids && n_ids) || n_ids < 0)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_detokenize: NULL argument or negative n_ids");
        std::string out;
        DLLM__TRY(dllm__detokenize(*tok, ids, n_ids, skip_special != 0, out));
        return dllm__copy_out("dllm_detokenize", out, text, capacity, text_len);
    });
}

dllm_chat_template dllm_tokenizer_chat_template(const dllm_tokenizer *tok) { return tok ? tok->chat : DLLM_CHAT_NONE; }

dllm_status dllm_chat_render(const dllm_tokenizer *tok, const dllm_chat_message *msgs, int n_msgs, int add_assistant,
                             char *text, size_t capacity, size_t *text_len) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (text_len) *text_len = 0;
        if (!tok) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_chat_render: tok is NULL");
        std::string out;
        DLLM__TRY(dllm__chat_render(*tok, msgs, n_msgs, add_assistant != 0, out));
        return dllm__copy_out("dllm_chat_render", out, text, capacity, text_len);
    });
}

}  // extern "C"
