/* Robustness: every public call with NULLs, negative, zero and overflowing sizes and out-of-range enums
 * returns a status (the sanitizer run checks that nothing reads out of bounds or overflows on the way);
 * weights that are not finite are refused by the CPU backend with the tensor and index named. */

static const int test_bad_ints[] = {INT_MIN, INT_MIN + 1, -2, -1, 0, 1, 7, 65, INT_MAX - 1, INT_MAX};
static const double test_bad_reals[] = {-HUGE_VAL, -1e30, -1, -0.0, 0, 1e-300, 0.5, 1, 2, 1e30, HUGE_VAL, NAN};

TEST(robustness, model_and_tokenizer_calls_with_null_and_bad_sizes) {
    test_quiet_log quiet;
    dllm_model *m = nullptr;
    dllm_tokenizer *t = nullptr;
    dllm_model_params mp = dllm_model_default_params();
    for (int v : test_bad_ints) {
        mp.use_mmap = v;  // any value means map or read
        CHECK_STATUS(dllm_model_load(nullptr, mp, &m), DLLM_ERR_INVALID_ARGUMENT, nullptr);
        CHECK_STATUS(dllm_model_load("", mp, &m), DLLM_ERR_IO, nullptr);
    }
    CHECK_STATUS(dllm_model_load("/nonexistent", mp, nullptr), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    CHECK_STATUS(dllm_model_load_random("", 1, &m), DLLM_ERR_IO, nullptr);
    CHECK_STATUS(dllm_tokenizer_load(nullptr, &t), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    CHECK_STATUS(dllm_tokenizer_load("models/tiny-llada", nullptr), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    CHECK_STATUS(dllm_tokenizer_load("", &t), DLLM_ERR_IO, nullptr);
    CHECK(m == nullptr && t == nullptr);
    dllm_model_info info;
    m = test_load(test_data("tiny-llada"));
    t = test_tokenizer("models/tiny-llada");
    if (!m || !t) { CHECK(m && t); dllm_model_free(m); dllm_tokenizer_free(t); return; }
    CHECK_STATUS(dllm_model_get_info(m, nullptr), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    CHECK_STATUS(dllm_model_get_info(nullptr, &info), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    CHECK(dllm_tokenizer_n_vocab(nullptr) == 0 && dllm_tokenizer_token_id(nullptr, "a") == -1 &&
          dllm_tokenizer_token_id(t, nullptr) == -1);
    CHECK(dllm_tokenizer_chat_template(nullptr) == DLLM_CHAT_NONE);
    CHECK_STATUS(dllm_tokenizer_check_model(nullptr, m), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    CHECK_STATUS(dllm_tokenizer_check_model(t, nullptr), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    // dllm_tokenize: every capacity, with and without buffers, texts NULL and empty.
    int32_t ids[8];
    int want = 0, n = -5;
    CHECK_STATUS(dllm_tokenize(t, "Hello world", 11, 1, nullptr, 0, &want), DLLM_ERR_BUFFER_TOO_SMALL, nullptr);
    if (want < 1 || want > 8) {
        CHECK_MSG(false, "\"Hello world\" makes %d ids", want);
        dllm_tokenizer_free(t);
        dllm_model_free(m);
        return;
    }
    CHECK_STATUS(dllm_tokenize(nullptr, "a", 1, 1, ids, 8, &n), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    CHECK_STATUS(dllm_tokenize(t, nullptr, 1, 1, ids, 8, &n), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    CHECK_STATUS(dllm_tokenize(t, "a", 1, 1, ids, 8, nullptr), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    CHECK_STATUS(dllm_tokenize(t, nullptr, 0, 1, nullptr, 0, &n), DLLM_OK, nullptr);
    CHECK(n == 0);
    for (int cap : test_bad_ints)
        for (int special : test_bad_ints) {
            // a capacity beyond 8 promises room ids lacks, but the call writes only the `want` ids it makes
            dllm_status with = dllm_tokenize(t, "Hello world", 11, special, ids, cap, &n);
            CHECK_MSG(cap < 0      ? with == DLLM_ERR_INVALID_ARGUMENT
                      : cap < want ? with == DLLM_ERR_BUFFER_TOO_SMALL && n == want
                                   : with == DLLM_OK && n == want,
                      "capacity %d: %s", cap, dllm_status_str(with));
            dllm_status without = dllm_tokenize(t, "Hello world", 11, special, nullptr, cap, &n);
            CHECK_MSG(cap == 0 ? without == DLLM_ERR_BUFFER_TOO_SMALL : without == DLLM_ERR_INVALID_ARGUMENT,
                      "capacity %d, ids NULL: %s", cap, dllm_status_str(without));
        }
    CHECK_STATUS(dllm_tokenize(t, "Hello world", 11, 1, ids, 8, &n), DLLM_OK, nullptr);
    // dllm_detokenize: negative counts, ids outside the vocabulary, every capacity.
    char text[64];
    size_t len = 99;
    for (int n_ids : test_bad_ints) {
        dllm_status s = dllm_detokenize(t, n_ids > want ? nullptr : ids, n_ids, 0, text, sizeof text, &len);
        CHECK_MSG(n_ids < 0 || n_ids > want ? s == DLLM_ERR_INVALID_ARGUMENT : s == DLLM_OK, "n_ids %d: %s", n_ids,
                  dllm_status_str(s));
    }
    for (int bad : test_bad_ints) {
        int32_t one[1] = {bad};
        dllm_status s = dllm_detokenize(t, one, 1, 1, text, sizeof text, &len);
        CHECK_MSG(bad >= 0 && bad < dllm_tokenizer_n_vocab(t) ? s == DLLM_OK : s == DLLM_ERR_INVALID_ARGUMENT,
                  "id %d: %s", bad, dllm_status_str(s));
    }
    for (size_t cap : {(size_t)0, (size_t)1, (size_t)5, (size_t)11, (size_t)12, sizeof text}) {
        CHECK_STATUS(dllm_detokenize(t, ids, want, 0, cap ? text : nullptr, cap, &len),
                     cap >= 12 ? DLLM_OK : DLLM_ERR_BUFFER_TOO_SMALL, nullptr);
        CHECK(len == 12);
    }
    CHECK(strcmp(text, "Hello world") == 0);
    CHECK_STATUS(dllm_detokenize(t, ids, want, 0, text, sizeof text, nullptr), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_detokenize(t, ids, want, 0, nullptr, SIZE_MAX, &len), DLLM_ERR_BUFFER_TOO_SMALL, nullptr);
    // dllm_chat_render: NULL messages, roles and contents, message counts, capacities.
    dllm_chat_message msgs[2] = {{"user", "Hi"}, {"assistant", "Hello"}};
    for (int n_msgs : test_bad_ints) {
        if (n_msgs > 2) continue;  // the array holds 2
        dllm_status s = dllm_chat_render(t, nullptr, n_msgs, 1, text, sizeof text, &len);
        CHECK_MSG(s == DLLM_ERR_INVALID_ARGUMENT, "n_msgs %d with NULL: %s", n_msgs, dllm_status_str(s));
        s = dllm_chat_render(t, msgs, n_msgs, n_msgs, text, sizeof text, &len);
        CHECK_MSG(n_msgs > 0 ? s == DLLM_ERR_BUFFER_TOO_SMALL || s == DLLM_OK : s == DLLM_ERR_INVALID_ARGUMENT,
                  "n_msgs %d: %s", n_msgs, dllm_status_str(s));
    }
    dllm_chat_message bad[3] = {{nullptr, "x"}, {"user", nullptr}, {"", "x"}};
    for (const dllm_chat_message &b : bad)
        CHECK_STATUS(dllm_chat_render(t, &b, 1, 1, text, sizeof text, &len), DLLM_ERR_INVALID_ARGUMENT, "message 0");
    CHECK_STATUS(dllm_chat_render(nullptr, msgs, 1, 1, text, sizeof text, &len), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    CHECK_STATUS(dllm_chat_render(t, msgs, 1, 1, nullptr, 0, nullptr), DLLM_ERR_BUFFER_TOO_SMALL, nullptr);
    dllm_tokenizer_free(t);
    dllm_model_free(m);
}

TEST(robustness, context_and_logits_with_bad_sizes) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    dllm_ctx *ctx = nullptr;
    dllm_ctx_params p = dllm_ctx_default_params();
    for (int v : test_bad_ints) {
        p = dllm_ctx_default_params(), p.backend = DLLM_BACKEND_CPU;
        p.n_threads = v;
        dllm_status s = dllm_ctx_create(m, p, &ctx);
        CHECK_MSG((v >= 0 && v <= 1024) == (s == DLLM_OK), "n_threads %d: %s", v, dllm_status_str(s));
        dllm_ctx_free(ctx);
        p.n_threads = 1, p.max_tokens = v;
        s = dllm_ctx_create(m, p, &ctx);
        CHECK_MSG((v >= 0 && v <= 256) == (s == DLLM_OK), "max_tokens %d: %s", v, dllm_status_str(s));
        dllm_ctx_free(ctx);
        p.max_tokens = 0, p.device = v;  // the CPU backend ignores the device
        CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_OK, nullptr);
        dllm_ctx_free(ctx);
        p.device = 0;
        memcpy(&p.backend, &v, sizeof v);
        s = dllm_ctx_create(m, p, &ctx);
        CHECK_MSG(v < 0 || v > 2 ? s == DLLM_ERR_INVALID_ARGUMENT : s != DLLM_ERR_INVALID_ARGUMENT, "backend %d: %s", v,
                  dllm_status_str(s));
        dllm_ctx_free(ctx);
        p.backend = DLLM_BACKEND_CPU;
        memcpy(&p.precision, &v, sizeof v);
        s = dllm_ctx_create(m, p, &ctx);
        CHECK_MSG((v >= DLLM_PRECISION_AUTO && v <= DLLM_PRECISION_RTN_W4A16) == (s == DLLM_OK), "precision %d: %s", v,
                  dllm_status_str(s));
        dllm_ctx_free(ctx);
    }
    CHECK_STATUS(dllm_ctx_create(m, dllm_ctx_default_params(), nullptr), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    ctx = test_ctx(m, DLLM_BACKEND_CPU, 1);
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    const int V = 136;  // the fixture's embedding rows
    std::vector<float> out((size_t)2 * V, NAN);
    int32_t ids[4] = {1, 2, 3, 4};
    for (int n_ids : test_bad_ints)
        for (int r0 : test_bad_ints)
            for (int r1 : test_bad_ints) {
                bool ok = n_ids >= 1 && n_ids <= 4 && r0 >= 0 && r1 > r0 && r1 <= n_ids && r1 - r0 <= 2;
                if (n_ids > 4 && n_ids <= 256) continue;  // a count the array cannot back
                dllm_status s = dllm_logits(ctx, ids, n_ids, r0, r1, out.data(), out.size());
                CHECK_MSG(ok ? s == DLLM_OK : s == DLLM_ERR_INVALID_ARGUMENT || s == DLLM_ERR_BUFFER_TOO_SMALL,
                          "n_ids %d rows [%d, %d): %s", n_ids, r0, r1, dllm_status_str(s));
            }
    for (size_t count : {(size_t)0, (size_t)V - 1, (size_t)V, SIZE_MAX}) {
        dllm_status s = dllm_logits(ctx, ids, 4, 0, 1, out.data(), count);
        CHECK_MSG(count >= (size_t)V ? s == DLLM_OK : s == DLLM_ERR_BUFFER_TOO_SMALL, "out_count %zu: %s", count,
                  dllm_status_str(s));
    }
    for (int bad : test_bad_ints) {
        int32_t one[2] = {1, bad};
        dllm_status s = dllm_logits(ctx, one, 2, 0, 1, out.data(), out.size());
        CHECK_MSG((bad >= 0 && bad < V) == (s == DLLM_OK), "id %d: %s", bad, dllm_status_str(s));
    }
    CHECK_STATUS(dllm_logits(ctx, nullptr, 1, 0, 1, out.data(), out.size()), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    CHECK_STATUS(dllm_logits(ctx, ids, 1, 0, 1, nullptr, out.size()), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* Every integer field of dllm_gen_params through the bad integers, every real field through the bad reals,
 * every enum through out-of-range values, and the call's own sizes: a status each time, and a generation
 * that is accepted fills only the output it may. */
TEST(robustness, generate_with_every_bad_parameter) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m, DLLM_BACKEND_CPU, 1) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    dllm_gen_params base = dllm_gen_default_params();
    base.gen_length = 8, base.steps = 2, base.block_length = 4;  // one forward a block: accepted calls stay cheap
    int32_t prompt[3] = {1, 2, 3};
    std::vector<int32_t> out(16);
    int accepted = 0, calls = 0;
    auto run = [&](const dllm_gen_params &p, const char *field, double value) {
        std::fill(out.begin(), out.end(), -7);
        int n_out = -1;
        dllm_status s = dllm_generate(ctx, prompt, 3, p, out.data(), 8, &n_out, nullptr);
        calls++;
        CHECK_MSG(s == DLLM_OK || s == DLLM_ERR_INVALID_ARGUMENT || s == DLLM_ERR_BUFFER_TOO_SMALL, "%s = %g: %s",
                  field, value, dllm_status_str(s));
        CHECK_MSG(out[8] == -7 && n_out >= 0 && n_out <= 8, "%s = %g: wrote past the output", field, value);
        if (s == DLLM_OK) {
            accepted++;
            for (int i = 0; i < n_out; i++)
                CHECK_MSG(out[(size_t)i] >= 0 && out[(size_t)i] < 136, "%s = %g: id %d", field, value, out[(size_t)i]);
        } else {
            CHECK_MSG(strlen(dllm_ctx_last_error(ctx)) > 10, "%s = %g: no message", field, value);
        }
    };
#define TEST_INT_FIELD(f) for (int v : test_bad_ints) { dllm_gen_params p = base; p.f = v; run(p, #f, v); }
#define TEST_REAL_FIELD(f)                                                                                             \
    for (double v : test_bad_reals) {                                                                                  \
        dllm_gen_params p = base;                                                                                      \
        p.f = (decltype(p.f))v;                                                                                        \
        run(p, #f, v);                                                                                                 \
    }
#define TEST_ENUM_FIELD(f)                                                                                             \
    for (int v : test_bad_ints) {                                                                                      \
        dllm_gen_params p = base;                                                                                      \
        memcpy(&p.f, &v, sizeof v);                                                                                    \
        run(p, #f, v);                                                                                                 \
    }
    TEST_INT_FIELD(gen_length)
    TEST_INT_FIELD(steps) TEST_INT_FIELD(block_length) TEST_INT_FIELD(logits_eos_inf)
        TEST_INT_FIELD(confidence_eos_eot_inf) TEST_INT_FIELD(stop_at_eos) TEST_INT_FIELD(dpad_window)
            TEST_INT_FIELD(dpad_n) TEST_INT_FIELD(early_stop) TEST_INT_FIELD(mask_id) TEST_INT_FIELD(eos_id)
                TEST_INT_FIELD(eot_id) TEST_REAL_FIELD(temperature) TEST_REAL_FIELD(cfg_scale)
                    TEST_REAL_FIELD(threshold) TEST_REAL_FIELD(factor) TEST_REAL_FIELD(eps) TEST_REAL_FIELD(alg_temp)
                        TEST_REAL_FIELD(dpad_k) TEST_REAL_FIELD(dpad_scale) TEST_ENUM_FIELD(remasking)
                            TEST_ENUM_FIELD(lacache) TEST_ENUM_FIELD(unmask) TEST_ENUM_FIELD(kv_cache)
                                TEST_ENUM_FIELD(dpad)
        // The real fields again where they matter: under the rule or option that reads them.
        base.unmask = DLLM_UNMASK_THRESHOLD;
    TEST_REAL_FIELD(threshold)
    base.remasking = DLLM_REMASK_ENTROPY;
    TEST_REAL_FIELD(threshold)
    base.remasking = DLLM_REMASK_LOW_CONFIDENCE, base.unmask = DLLM_UNMASK_FACTOR;
    TEST_REAL_FIELD(factor)
    base.unmask = DLLM_UNMASK_TIMESTEPS;
    TEST_REAL_FIELD(eps) TEST_REAL_FIELD(alg_temp)
    base.unmask = DLLM_UNMASK_SCHEDULE, base.dpad = DLLM_DPAD_GAUSSIAN;
    TEST_REAL_FIELD(dpad_k) TEST_REAL_FIELD(dpad_scale) TEST_INT_FIELD(dpad_window)
    base.dpad = DLLM_DPAD_UNIFORM;
    TEST_INT_FIELD(dpad_window) TEST_INT_FIELD(dpad_n)
#undef TEST_INT_FIELD
#undef TEST_REAL_FIELD
#undef TEST_ENUM_FIELD
    base = dllm_gen_default_params();
    base.gen_length = 8, base.steps = 4, base.block_length = 4;
    for (int n_prompt : test_bad_ints) {
        if (n_prompt > 3 && n_prompt < 200) continue;  // a count the array cannot back
        CHECK_STATUS(dllm_generate(ctx, prompt, n_prompt, base, out.data(), 8, nullptr, nullptr),
                     n_prompt >= 0 && n_prompt <= 3 ? DLLM_OK : DLLM_ERR_INVALID_ARGUMENT, nullptr);
        CHECK_STATUS(dllm_generate(ctx, nullptr, n_prompt, base, out.data(), 8, nullptr, nullptr),
                     n_prompt == 0 ? DLLM_OK : DLLM_ERR_INVALID_ARGUMENT, nullptr);
    }
    for (int cap : test_bad_ints) {
        if (cap > 16) continue;
        CHECK_STATUS(dllm_generate(ctx, prompt, 3, base, out.data(), cap, nullptr, nullptr),
                     cap >= 8 ? DLLM_OK : DLLM_ERR_BUFFER_TOO_SMALL, nullptr);
        CHECK_STATUS(dllm_generate(ctx, prompt, 3, base, nullptr, cap, nullptr, nullptr), DLLM_ERR_INVALID_ARGUMENT,
                     nullptr);
    }
    CHECK_MSG(accepted > 20 && accepted < calls, "%d of %d calls accepted", accepted, calls);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

// ---- Non-finite weights ---------------------------------------------------------------------------------

/* Writes value (as the tensor's dtype) at flat index `at` of tensor `name` in dir/model.safetensors. */
static bool test_poke_weight(const std::string &dir, const char *name, int64_t at, float value) {
    std::string path = dir + "/model.safetensors", bytes = test_read_file(path);
    dllm__safetensors st;
    if (dllm__st_open(path, false, st) != DLLM_OK) return false;
    for (const dllm__tensor &t : st.tensors) {
        if (t.name != name) continue;
        size_t off = (size_t)(t.data - st.file->data), size = t.dtype == DLLM__F32 ? 4 : 2;
        uint32_t bits = 0;
        if (t.dtype == DLLM__F32) memcpy(&bits, &value, 4);
        else if (t.dtype == DLLM__BF16) bits = dllm__f32_to_bf16(value);
        else bits = std::isnan(value) ? 0x7E00u : value > 0 ? 0x7C00u : 0xFC00u;  // F16
        memcpy(&bytes[off + size * (size_t)at], &bits, size);
        return test_write_file(path, bytes);
    }
    return false;
}

TEST(robustness, non_finite_weights_are_named_when_the_cpu_backend_starts) {
    test_tmpdir dir;
    test_copy_model(test_data("tiny-llada"), dir);
    const char *tensor = "model.transformer.blocks.1.ff_out.weight";
    for (float bad : {NAN, HUGE_VALF, -HUGE_VALF}) {
        CHECK(test_poke_weight(dir.path, tensor, 1234, bad));
        dllm_model *m = test_load(dir.path);  // loading reads no weights; the backend checks them
        if (!m) { CHECK(m != nullptr); return; }
        dllm_ctx *ctx = nullptr;
        dllm_ctx_params p = dllm_ctx_default_params();
        p.backend = DLLM_BACKEND_CPU;
        p.n_threads = 3;
        CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_FORMAT, "tensor model.transformer.blocks.1.ff_out.weight");
        CHECK(ctx == nullptr && strstr(dllm_last_error(), "flat index 1234") &&
              strstr(dllm_last_error(), std::isnan(bad) ? "nan" : "inf"));
        dllm_model_free(m);
    }
    CHECK(test_poke_weight(dir.path, tensor, 1234, 0.25f));
    CHECK(test_poke_weight(dir.path, "model.transformer.wte.weight", 0,
                           -HUGE_VALF));  // the first element of the first tensor
    dllm_model *m = test_load(dir.path);
    dllm_ctx *ctx = nullptr;
    dllm_ctx_params p = dllm_ctx_default_params();
    p.backend = DLLM_BACKEND_CPU;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_FORMAT,
                 "model.transformer.wte.weight [136, 128] holds -inf at flat index 0");
    dllm_model_free(m);
    CHECK(test_poke_weight(dir.path, "model.transformer.wte.weight", 0, 0.0f));
    m = test_load(dir.path);
    ctx = m ? test_ctx(m) : nullptr;
    CHECK(ctx != nullptr);  // a repaired file starts
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(robustness, finite_scan_covers_every_dtype_and_chunk_edge) {
    for (dllm__dtype dt : {DLLM__BF16, DLLM__F16, DLLM__F32}) {
        const int64_t n = 37;
        std::vector<uint8_t> buf((size_t)n * 4, 0);
        dllm__tensor t;
        t.dtype = dt, t.numel = n, t.data = buf.data();
        CHECK(dllm__first_nonfinite(t, 0, n) == -1);
        size_t size = dt == DLLM__F32 ? 4 : 2;
        uint32_t inf = dt == DLLM__F32    ? 0x7F800000u
                       : dt == DLLM__BF16 ? 0x7F80u
                                          : 0x7C00u,
                 big = dt == DLLM__F32    ? 0x7F7FFFFFu
                       : dt == DLLM__BF16 ? 0x7F7Fu
                                          : 0x7BFFu;
        for (int64_t i = 0; i < n; i++)
            memcpy(&buf[size * (size_t)i], &big, size);  // the largest finite value everywhere
        CHECK(dllm__first_nonfinite(t, 0, n) == -1);
        memcpy(&buf[size * 36], &inf, size);
        CHECK(dllm__first_nonfinite(t, 0, n) == 36 && dllm__first_nonfinite(t, 0, 36) == -1 &&
              dllm__first_nonfinite(t, 36, 37) == 36);
    }
}

/* The calls that take no status of their own: a NULL handle or an enum value outside the header's gives a documented
 * answer (never a crash), and a detokenize without a tokenizer is an error naming it. */
TEST(robustness, handle_free_calls_and_out_of_range_enums) {
    test_quiet_log quiet;
    CHECK(dllm_ctx_get_backend(nullptr) == DLLM_BACKEND_AUTO);
    for (int v : test_bad_ints) {
        const char *s = dllm_status_str((dllm_status)v);
        CHECK_MSG(s && *s, "dllm_status_str(%d) is empty", v);
    }
    CHECK(strcmp(dllm_status_str(DLLM_OK), "DLLM_OK") == 0);
    const char *version = dllm_version();
    CHECK(version && strchr(version, '.'));
    int32_t ids[2] = {1, 2};
    char text[16];
    size_t len = 99;
    CHECK_STATUS(dllm_detokenize(nullptr, ids, 2, 0, text, sizeof text, &len), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    // dllm_rng_uniform is the sampler's Philox draw: in [0, 1) at the extremes of every argument.
    for (uint64_t seed : {(uint64_t)0, (uint64_t)1, UINT64_MAX})
        for (uint32_t x : {0u, 1u, 0x7fffffffu, UINT32_MAX}) {
            const double u = dllm_rng_uniform(seed, x, x, x, x);
            CHECK_MSG(u >= 0 && u < 1, "seed %llu, %u: %g", (unsigned long long)seed, x, u);
        }
}
