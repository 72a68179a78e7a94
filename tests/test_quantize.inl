/* Tests: quantised checkpoints (dllm_model_quantize, section 9b's [quantised checkpoints]). A directory written once
 * loads its stored SoloQ rows, and a context on it computes the same logits, bit for bit, as one that quantises the
 * unquantised model at creation; a mismatched precision is refused naming --precision; every malformed file (missing
 * or misshapen parts, wrong dtypes, damaged scales, metadata that lies, truncation) is a clear error. */

/* Quantises the fixture `fx` into dir at precision p; the loaded result or null. */
static dllm_model *test_quantized(const std::string &src, const test_tmpdir &dir, dllm_precision p, int head,
                                  size_t shard = 0, dllm_soloq_rotation rotation = DLLM_SOLOQ_ROTATION_DEFAULT,
                                  int bias_correction = -1) {
    dllm_model *m = test_load(src);
    if (!m) return nullptr;
    dllm_quantize_params qp = dllm_quantize_default_params();
    qp.precision = p, qp.quantize_lm_head = head, qp.n_threads = 2;
    qp.soloq_rotation = rotation, qp.soloq_bias_correction = bias_correction;
    if (shard) qp.max_shard_bytes = shard;
    dllm_status s = dllm_model_quantize(m, dir.path.c_str(), &qp);
    dllm_model_free(m);
    if (s != DLLM_OK) {
        printf("    cannot quantise %s: %s\n", src.c_str(), dllm_last_error());
        return nullptr;
    }
    return test_load(dir.path);
}

static std::vector<int32_t> test_quant_ids(const dllm_model *m, int n) {
    std::vector<int32_t> ids((size_t)n);
    for (int i = 0; i < n; i++) ids[(size_t)i] = (int32_t)((i * 37 + 11) % std::min(m->cfg.n_vocab, 120));
    return ids;
}

/* Logits of every row of ids on a CPU context at precision p (AUTO: the default), poisoned first. */
static std::vector<float> test_quant_logits(dllm_model *m, dllm_precision p, int head, const std::vector<int32_t> &ids,
                                            dllm_soloq_rotation rotation = DLLM_SOLOQ_ROTATION_DEFAULT,
                                            int bias_correction = -1) {
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_CPU, cp.n_threads = 2, cp.precision = p, cp.quantize_lm_head = head;
    cp.soloq_rotation = rotation, cp.soloq_bias_correction = bias_correction;
    dllm_ctx *ctx = nullptr;
    std::vector<float> out((size_t)ids.size() * m->cfg.n_vocab, NAN);
    if (dllm_ctx_create(m, cp, &ctx) != DLLM_OK ||
        dllm_logits(ctx, ids.data(), (int)ids.size(), 0, (int)ids.size(), out.data(), out.size()) != DLLM_OK) {
        printf("    %s: %s\n", dllm__precision_name(p), dllm_last_error());
        out.clear();
    }
    dllm_ctx_free(ctx);
    return out;
}

static bool test_bitwise_equal(const std::vector<float> &a, const std::vector<float> &b) {
    return !a.empty() && a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(quant, stored_rows_give_the_logits_of_quantising_at_load_bit_for_bit) {
    struct { const char *fx; dllm_precision p; int head; size_t shard;
    } cases[] = {
        {"tiny-llada", DLLM_PRECISION_SOLOQ_I, 0, 0},
        {"tiny-llada", DLLM_PRECISION_SOLOQ_N, 1, 0},
        {"tiny-dream", DLLM_PRECISION_SOLOQ_C, 0, 300000},
        {"tiny-dream", DLLM_PRECISION_RTN_W4A4, 1, 0},
        {"tiny-fast-dllm-v2", DLLM_PRECISION_SOLOQ_I_W4A16, 0, 0},
        {"tiny-nemotron-diffusion", DLLM_PRECISION_SOLOQ_N, 1, 0},
    };
    for (auto &c : cases) {
        test_tmpdir dir;
        dllm_model *src = test_load(test_data(c.fx)), *q = test_quantized(test_data(c.fx), dir, c.p, c.head, c.shard);
        if (!src || !q) {
            CHECK_MSG(false, "%s %s: not loaded", c.fx, dllm__precision_name(c.p));
            dllm_model_free(src);
            dllm_model_free(q);
            continue;
        }
        // the stored model has no BF16 linears: its context cannot have quantised them again
        CHECK(q->soloq && q->layers[0].wq == nullptr && q->layers.back().down == nullptr &&
              (q->head == nullptr) == (c.head == 1));
        CHECK(q->n_params == src->n_params);
        dllm_model_info info;
        CHECK(dllm_model_get_info(q, &info) == DLLM_OK && info.precision == c.p && info.quantized_lm_head == c.head);
        CHECK(dllm_model_get_info(src, &info) == DLLM_OK && info.precision == DLLM_PRECISION_BF16 &&
              info.quantized_lm_head == 0);
        if (c.shard)
            CHECK_MSG(dllm__file_exists(dir.file("model.safetensors.index.json")) && q->files.size() > 1, "%zu files",
                      q->files.size());
        const std::vector<int32_t> ids = test_quant_ids(src, 13);
        const std::vector<float> want = test_quant_logits(src, c.p, c.head, ids),
                                 got = test_quant_logits(q, DLLM_PRECISION_AUTO, 0, ids);
        const std::vector<float> bf16 = test_quant_logits(src, DLLM_PRECISION_BF16, 0, ids);
        CHECK_MSG(test_bitwise_equal(want, got), "%s %s: the stored rows' logits differ from quantising at load", c.fx,
                  dllm__precision_name(c.p));
        CHECK_MSG(!test_bitwise_equal(want, bf16), "%s %s: quantising changed nothing", c.fx,
                  dllm__precision_name(c.p));
        // the other activation treatment of the same weights (W4A4 <-> W4A16)
        const dllm_precision other = (dllm_precision)(c.p >= DLLM_PRECISION_SOLOQ_N_W4A16 ? c.p - 4 : c.p + 4);
        CHECK_MSG(test_bitwise_equal(test_quant_logits(src, other, c.head, ids), test_quant_logits(q, other, 0, ids)),
                  "%s %s", c.fx, dllm__precision_name(other));
        dllm_model_free(src);
        dllm_model_free(q);
    }
}

static void test_record_progress(int done, int total, void *user_data) {
    ((std::vector<std::pair<int, int>> *)user_data)->push_back({done, total});
}

/* dllm_ctx_params.progress while a CPU context quantises: once a layer (and the head when quantised), done counting up
 * to total; not at all where nothing is quantised (BF16, a quantised checkpoint's stored rows). */
TEST(quant, context_creation_reports_progress) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    const int L = m->cfg.n_layer;
    struct { dllm_precision precision; int head, total;
    } cases[] = {{DLLM_PRECISION_SOLOQ_C, 0, L},
                 {DLLM_PRECISION_SOLOQ_N, 1, L + 1},
                 {DLLM_PRECISION_FP8_FFN, 0, L - 1},
                 {DLLM_PRECISION_BF16, 0, 0}};
    for (auto &c : cases) {
        std::vector<std::pair<int, int>> calls, want;
        for (int i = 1; i <= c.total; i++) want.push_back({i, c.total});
        dllm_ctx_params cp = dllm_ctx_default_params();
        cp.backend = DLLM_BACKEND_CPU, cp.n_threads = 2, cp.precision = c.precision, cp.quantize_lm_head = c.head;
        cp.progress = test_record_progress, cp.progress_user_data = &calls;
        dllm_ctx *ctx = nullptr;
        CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
        CHECK_MSG(calls == want, "%s: %zu calls, the last %d of %d; want %d", dllm__precision_name(c.precision),
                  calls.size(), calls.empty() ? 0 : calls.back().first, calls.empty() ? 0 : calls.back().second,
                  c.total);
        dllm_ctx_free(ctx);
    }
    test_tmpdir dir;
    dllm_model *stored = test_quantized(test_data("tiny-llada"), dir, DLLM_PRECISION_SOLOQ_C, 0, 0);
    std::vector<std::pair<int, int>> calls;
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_CPU, cp.n_threads = 2, cp.progress = test_record_progress, cp.progress_user_data = &calls;
    dllm_ctx *ctx = nullptr;
    CHECK_STATUS(stored ? dllm_ctx_create(stored, cp, &ctx) : DLLM_ERR_IO, DLLM_OK, nullptr);
    CHECK_MSG(calls.empty(), "a quantised checkpoint reported %zu quantised layers", calls.size());
    dllm_ctx_free(ctx);
    dllm_model_free(stored);
    dllm_model_free(m);
}

/* The same on the GPU backend, which quantises on the device (FP8 blocks, SoloQ rows, q4wg's layout on sm_90a): once a
 * quantised layer (and the head when quantised), done counting up to total as on the CPU; FP8 only where this GPU has
 * an FP8 GEMM (elsewhere BF16 runs: nothing quantised); not at all for BF16, a quantised checkpoint, or a second
 * context that shares the first one's device weights. */
TEST(gpu_quant, context_creation_reports_progress) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    const int L = m->cfg.n_layer;
    struct { dllm_precision precision; int head, total; } cases[] = {
        {DLLM_PRECISION_SOLOQ_C, 0, L}, {DLLM_PRECISION_SOLOQ_N, 1, L + 1}, {DLLM_PRECISION_SOLOQ_I, 0, L},
        {DLLM_PRECISION_RTN_W4A4, 1, L + 1}, {DLLM_PRECISION_FP8_FFN, 0, L - 1}, {DLLM_PRECISION_FP8_ALL, 0, L - 1},
        {DLLM_PRECISION_BF16, 0, 0}};
    for (auto &c : cases) {
        std::vector<std::pair<int, int>> calls, second;
        dllm_ctx_params cp = dllm_ctx_default_params();
        cp.backend = DLLM_BACKEND_GPU, cp.precision = c.precision, cp.quantize_lm_head = c.head;
        cp.progress = test_record_progress, cp.progress_user_data = &calls;
        dllm_ctx *ctx = nullptr, *ctx2 = nullptr;
        CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
        if (!ctx) continue;
        const dllm__gpu_weights &w = ((dllm__gpu_backend *)ctx->impl.get())->weights();
        const bool fp8 = c.precision == DLLM_PRECISION_FP8_FFN || c.precision == DLLM_PRECISION_FP8_ALL;
        const int total = fp8 && !w.fp8_ffn ? 0 : c.total;  // no FP8 GEMM on this GPU: BF16, nothing quantised
        std::vector<std::pair<int, int>> want;
        for (int i = 1; i <= total; i++) want.push_back({i, total});
        CHECK_MSG(calls == want, "%s: %zu calls, the last %d of %d; want %d", dllm__precision_name(c.precision),
                  calls.size(), calls.empty() ? 0 : calls.back().first, calls.empty() ? 0 : calls.back().second, total);
        cp.progress_user_data = &second;  // the same formats: the first context's weights, nothing quantised again
        CHECK_STATUS(dllm_ctx_create(m, cp, &ctx2), DLLM_OK, nullptr);
        CHECK_MSG(second.empty(), "%s: a context sharing the device weights reported %zu layers",
                  dllm__precision_name(c.precision), second.size());
        dllm_ctx_free(ctx2);
        dllm_ctx_free(ctx);
    }
    test_tmpdir dir;
    dllm_model *stored = test_quantized(test_data("tiny-llada"), dir, DLLM_PRECISION_SOLOQ_I, 0, 0);
    std::vector<std::pair<int, int>> calls;
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_GPU, cp.progress = test_record_progress, cp.progress_user_data = &calls;
    dllm_ctx *ctx = nullptr;
    CHECK_STATUS(stored ? dllm_ctx_create(stored, cp, &ctx) : DLLM_ERR_IO, DLLM_OK, nullptr);
    CHECK_MSG(calls.empty(), "a quantised checkpoint on the GPU reported %zu quantised layers", calls.size());
    dllm_ctx_free(ctx);
    dllm_model_free(stored);
    dllm_model_free(m);
}

/* An unquantised head in the file can still be quantised at context creation, with the stored rotation's seed. */
TEST(quant, a_bf16_head_can_be_quantised_at_load) {
    test_tmpdir dir;
    dllm_model *src = test_load(test_data("tiny-llada")),
               *q = test_quantized(test_data("tiny-llada"), dir, DLLM_PRECISION_SOLOQ_I, 0);
    if (!src || !q) { CHECK(false); dllm_model_free(src); dllm_model_free(q); return; }
    const std::vector<int32_t> ids = test_quant_ids(src, 9);
    CHECK(q->head != nullptr && test_bitwise_equal(test_quant_logits(src, DLLM_PRECISION_SOLOQ_I, 1, ids),
                                                   test_quant_logits(q, DLLM_PRECISION_SOLOQ_I, 1, ids)));
    dllm_model_free(src);
    dllm_model_free(q);
}

TEST(quant, a_mismatched_precision_is_refused_naming_it) {
    test_tmpdir dir;
    dllm_model *q = test_quantized(test_data("tiny-llada"), dir, DLLM_PRECISION_SOLOQ_I, 0);
    if (!q) { CHECK(q != nullptr); return; }
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_CPU, cp.n_threads = 2;
    dllm_ctx *ctx = nullptr;
    const struct {
        dllm_precision p;
        const char *name;
    } bad[] = {{DLLM_PRECISION_SOLOQ_N, "--precision soloq-n"},
               {DLLM_PRECISION_BF16, "--precision bf16"},
               {DLLM_PRECISION_FP8_ALL, "--precision fp8-all"},
               {DLLM_PRECISION_RTN_W4A16, "--precision rtn-w4a16"}};
    for (auto &b : bad) {
        cp.precision = b.p;
        CHECK_STATUS(dllm_ctx_create(q, cp, &ctx), DLLM_ERR_INVALID_ARGUMENT, b.name);
        CHECK(strstr(dllm_last_error(), "INT4 weights") &&
              strstr(dllm_last_error(), "use --precision soloq-i or soloq-i-w4a16"));
    }
    cp.precision = DLLM_PRECISION_SOLOQ_I;
    cp.soloq_rotation = DLLM_SOLOQ_ROTATION_HADAMARD;
    CHECK_STATUS(dllm_ctx_create(q, cp, &ctx), DLLM_ERR_INVALID_ARGUMENT, "quantised with rotation krpbh");
    CHECK(strstr(dllm_last_error(), "--soloq-rotation") != nullptr);
    cp.soloq_rotation = DLLM_SOLOQ_ROTATION_KRPBH;  // the recorded one, asked for: fine with the recorded correction
    cp.soloq_bias_correction = 0;
    CHECK_STATUS(dllm_ctx_create(q, cp, &ctx), DLLM_ERR_INVALID_ARGUMENT,
                 "soloq_bias_correction 0 (--soloq-bias-correction)");
    CHECK(ctx == nullptr);
    cp.soloq_bias_correction = 1;
    CHECK_STATUS(dllm_ctx_create(q, cp, &ctx), DLLM_OK, nullptr);
    dllm_ctx_free(ctx);
    ctx = nullptr;
    cp.soloq_rotation = DLLM_SOLOQ_ROTATION_DEFAULT, cp.soloq_bias_correction = -1;
    CHECK_STATUS(dllm_ctx_create(q, cp, &ctx), DLLM_OK, nullptr);
    dllm_ctx_free(ctx);
    dllm_model_free(q);
}

/* A file quantised with a non-default rotation and correction records them, and loads without asking for them. */
TEST(quant, ablations_are_recorded) {
    test_tmpdir dir;
    dllm_model *src = test_load(test_data("tiny-dream")),
               *q = test_quantized(test_data("tiny-dream"), dir, DLLM_PRECISION_SOLOQ_N, 0, 0, DLLM_SOLOQ_ROTATION_RPBH,
                                   0);
    const std::vector<float> want =
        src ? test_quant_logits(src, DLLM_PRECISION_SOLOQ_N, 0, test_quant_ids(src, 7), DLLM_SOLOQ_ROTATION_RPBH, 0)
            : std::vector<float>();
    if (!src || !q) { CHECK(false); dllm_model_free(src); dllm_model_free(q); return; }
    CHECK(q->soloq->opt.rotation == DLLM__ROT_RPBH && !q->soloq->opt.bias_correction);
    CHECK(test_bitwise_equal(want, test_quant_logits(q, DLLM_PRECISION_AUTO, 0, test_quant_ids(src, 7))));
    dllm_model_free(src);
    dllm_model_free(q);
}

static int test_progress_calls, test_progress_last, test_progress_total;

TEST(quant, quantize_validates_its_arguments_and_the_output_directory) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    test_tmpdir dir;
    dllm_quantize_params qp = dllm_quantize_default_params();
    CHECK(qp.precision == DLLM_PRECISION_SOLOQ_N && qp.quantize_lm_head == 0 && qp.overwrite == 0 &&
          qp.max_shard_bytes == ((size_t)4 << 30));
    qp.n_threads = 2;
    qp.precision = DLLM_PRECISION_FP8_FFN;
    CHECK_STATUS(dllm_model_quantize(m, dir.path.c_str(), &qp), DLLM_ERR_INVALID_ARGUMENT,
                 "precision fp8 is not one dllm-quantize writes");
    qp.precision = DLLM_PRECISION_SOLOQ_C;
    qp.quantize_lm_head = 3;
    CHECK_STATUS(dllm_model_quantize(m, dir.path.c_str(), &qp), DLLM_ERR_INVALID_ARGUMENT, "quantize_lm_head 3");
    qp.quantize_lm_head = 1;
    CHECK_STATUS(dllm_model_quantize(nullptr, dir.path.c_str(), &qp), DLLM_ERR_INVALID_ARGUMENT, "NULL");
    test_tmpdir used;
    test_write_file(used.file("notes.txt"), "mine");
    CHECK_STATUS(dllm_model_quantize(m, used.path.c_str(), &qp), DLLM_ERR_INVALID_ARGUMENT,
                 "exists and is not empty (notes.txt, ...)");
    CHECK_STATUS(dllm_model_quantize(m, test_data("tiny-llada").c_str(), &qp), DLLM_ERR_INVALID_ARGUMENT,
                 "is the source model's directory");
    qp.overwrite = 1;
    CHECK_STATUS(dllm_model_quantize(m, test_data("tiny-llada").c_str(), &qp), DLLM_ERR_INVALID_ARGUMENT,
                 "is the source model's directory");
    CHECK_STATUS(dllm_model_quantize(m, (test_data("tiny-llada") + "/config.json").c_str(), &qp), DLLM_ERR_IO,
                 "not a directory");
    qp.overwrite = 0;
    test_progress_calls = test_progress_last = test_progress_total = 0;
    qp.progress = [](int done, int total, void *) {
        test_progress_calls++, test_progress_last = done, test_progress_total = total;
    };
    qp.max_shard_bytes = 100000;  // sharded first
    CHECK_STATUS(dllm_model_quantize(m, dir.path.c_str(), &qp), DLLM_OK, nullptr);
    CHECK_MSG(test_progress_calls == m->cfg.n_layer + 1 && test_progress_last == test_progress_total &&
                  test_progress_total == m->cfg.n_layer + 1,
              "progress called %d times, last %d of %d", test_progress_calls, test_progress_last, test_progress_total);
    CHECK(dllm__file_exists(dir.file("model.safetensors.index.json")) &&
          dllm__file_exists(dir.file("tokenizer.json")) == dllm__file_exists(test_data("tiny-llada/tokenizer.json")));
    CHECK(test_read_file(dir.file("config.json")) == test_read_file(test_data("tiny-llada/config.json")));
    CHECK_STATUS(dllm_model_quantize(m, dir.path.c_str(), &qp), DLLM_ERR_INVALID_ARGUMENT, "--force");
    qp.overwrite = 1, qp.max_shard_bytes = (size_t)1 << 30,
    qp.progress = nullptr;  // one file now: no stale shard or index stays
    CHECK_STATUS(dllm_model_quantize(m, dir.path.c_str(), &qp), DLLM_OK, nullptr);
    CHECK(!dllm__file_exists(dir.file("model.safetensors.index.json")) &&
          !dllm__file_exists(dir.file("model-00001-of-00002.safetensors")));
    dllm_model *q = test_load(dir.path);
    CHECK(q && q->soloq && q->soloq->precision == DLLM_PRECISION_SOLOQ_C && q->soloq->head);
    if (q)
        CHECK_STATUS(dllm_model_quantize(q, "/tmp/dllm-never-written", &qp), DLLM_ERR_INVALID_ARGUMENT,
                     "already quantised");
    dllm_model_free(q);
    dllm_model_free(m);
}

// ---- malformed quantised files ----------------------------------------------------------------------------------

/* The tensors and metadata of a quantised tiny-llada (NVFP4 with a head: every part kind present). */
struct test_qfile {
    std::vector<std::pair<std::string, std::string>> meta;
    std::vector<test_st_builder::entry> tensors;
};

static test_qfile test_qfile_of(const test_tmpdir &src) {
    test_qfile f;
    dllm__safetensors st;
    dllm__st_open(src.file("model.safetensors"), false, st);
    f.meta = st.metadata;
    for (const dllm__tensor &t : st.tensors)
        f.tensors.push_back({t.name, dllm__dtypes[t.dtype].name, t.shape, std::string((const char *)t.data, t.nbytes)});
    return f;
}

static std::string test_qfile_bytes(const test_qfile &f) {
    test_st_builder b;
    b.metadata = "{";
    for (size_t i = 0; i < f.meta.size(); i++)
        b.metadata += (i ? "," : "") + dllm__json_quote(f.meta[i].first) + ":" + dllm__json_quote(f.meta[i].second);
    b.metadata += "}";
    b.entries = f.tensors;
    return b.bytes();
}

static void test_qfile_set(test_qfile &f, const char *key, const std::string &value) {
    for (auto &kv : f.meta)
        if (kv.first == key) kv.second = value;
}

static test_st_builder::entry *test_qfile_tensor(test_qfile &f, const std::string &name) {
    for (auto &e : f.tensors)
        if (e.name == name) return &e;
    return nullptr;
}

TEST(quant, malformed_files_give_clear_errors) {
    test_tmpdir good;
    dllm_model *q = test_quantized(test_data("tiny-llada"), good, DLLM_PRECISION_SOLOQ_N, 1);
    if (!q) { CHECK(q != nullptr); return; }
    dllm_model_free(q);
    const test_qfile base = test_qfile_of(good);
    const std::string l1 = "model.layers.1.soloq.";
    struct edit { const char *what; std::function<void(test_qfile &)> apply; dllm_status want; const char *message; };
    const edit edits[] = {
        {"missing row scales",
         [&](test_qfile &f) {
             f.tensors.erase(
                 std::remove_if(f.tensors.begin(), f.tensors.end(),
                                [&](const test_st_builder::entry &e) { return e.name == l1 + "o.row_scale"; }),
                 f.tensors.end());
         },
         DLLM_ERR_SHAPE, "missing tensor model.layers.1.soloq.o.row_scale (F32 [128])"},
        {"missing block scales",
         [&](test_qfile &f) {
             f.tensors.erase(
                 std::remove_if(f.tensors.begin(), f.tensors.end(),
                                [&](const test_st_builder::entry &e) { return e.name == l1 + "down.block_scales"; }),
                 f.tensors.end());
         },
         DLLM_ERR_SHAPE, "missing tensor model.layers.1.soloq.down.block_scales"},
        {"codes too short",
         [&](test_qfile &f) {
             auto *e = test_qfile_tensor(f, l1 + "qkv.codes");
             e->shape[1] -= 1;
             e->data.resize((size_t)(e->shape[0] * e->shape[1]));
         },
         DLLM_ERR_SHAPE, "tensor model.layers.1.soloq.qkv.codes is U8 [384, 63], expected U8 [384, 64]"},
        {"codes as I8", [&](test_qfile &f) { test_qfile_tensor(f, l1 + "gate_up.codes")->dtype = "I8"; },
         DLLM_ERR_SHAPE, "is I8 [400, 64], expected U8 [400, 64]"},
        {"row scales as BF16",
         [&](test_qfile &f) {
             auto *e = test_qfile_tensor(f, l1 + "o.row_scale");
             e->dtype = "BF16";
             e->shape = {256};
         },
         DLLM_ERR_SHAPE, "expected F32 [128]"},
        {"a NaN row scale",
         [&](test_qfile &f) {
             float nan = NAN;
             memcpy(&test_qfile_tensor(f, l1 + "down.row_scale")->data[12], &nan, 4);
         },
         DLLM_ERR_FORMAT, "non-finite scale"},
        {"a NaN block scale",
         [&](test_qfile &f) { test_qfile_tensor(f, "lm_head.soloq.block_scales")->data[5] = (char)0x7F; },
         DLLM_ERR_FORMAT, "not a UE4M3 scale"},
        {"a layer too many",
         [&](test_qfile &f) {
             auto e = *test_qfile_tensor(f, l1 + "o.row_scale");
             e.name = "model.layers.9.soloq.o.row_scale";
             f.tensors.push_back(e);
         },
         DLLM_ERR_FORMAT, "model.layers.9.soloq.o.row_scale is not part of the quantised checkpoint"},
        {"weight format lies", [&](test_qfile &f) { test_qfile_set(f, "dllm.weight_format", "INT4"); }, DLLM_ERR_FORMAT,
         "dllm.weight_format \"INT4\" does not match dllm.precision soloq-n"},
        {"precision lies", [&](test_qfile &f) { test_qfile_set(f, "dllm.precision", "soloq-i"); }, DLLM_ERR_FORMAT,
         "does not match dllm.precision soloq-i"},
        {"an INT4 file with block scales",
         [&](test_qfile &f) {
             test_qfile_set(f, "dllm.precision", "soloq-i"), test_qfile_set(f, "dllm.weight_format", "INT4");
         },
         DLLM_ERR_FORMAT, "INT4 weights have no block scales"},
        {"unknown precision", [&](test_qfile &f) { test_qfile_set(f, "dllm.precision", "bf16"); }, DLLM_ERR_FORMAT,
         "dllm.precision \"bf16\" is not a SoloQ precision"},
        {"head flag lies", [&](test_qfile &f) { test_qfile_set(f, "dllm.quantize_lm_head", "0"); }, DLLM_ERR_FORMAT,
         "lm_head.soloq."},
        {"a bad flag", [&](test_qfile &f) { test_qfile_set(f, "dllm.bias_correction", "yes"); }, DLLM_ERR_FORMAT,
         "dllm.bias_correction is \"yes\""},
        {"a newer version", [&](test_qfile &f) { test_qfile_set(f, "dllm.quant_version", "2"); }, DLLM_ERR_UNSUPPORTED,
         "format version \"2\""},
        {"a bad seed", [&](test_qfile &f) { test_qfile_set(f, "dllm.rotation_seed", "0x12zz"); }, DLLM_ERR_FORMAT,
         "dllm.rotation_seed \"0x12zz\""},
        {"an unknown rotation", [&](test_qfile &f) { test_qfile_set(f, "dllm.rotation", "givens"); }, DLLM_ERR_FORMAT,
         "dllm.rotation \"givens\""},
        {"a missing key", [&](test_qfile &f) { f.meta.erase(f.meta.begin() + 3); }, DLLM_ERR_FORMAT,
         "__metadata__ has no \"dllm.rotation\""},
        {"another model's config",
         [&](test_qfile &f) {
             std::string c = test_read_file(test_data("tiny-llada/config.json"));
             c.replace(c.find("\"n_layers\": 3"), 13, "\"n_layers\": 4");
             test_qfile_set(f, "dllm.source_config", c);
         },
         DLLM_ERR_SHAPE, "is not the one config.json describes"},
        {"no metadata", [&](test_qfile &f) { f.meta.clear(); }, DLLM_ERR_FORMAT,
         "looks quantised but the file's __metadata__ has no dllm.* keys"},
    };
    for (const edit &e : edits) {
        test_tmpdir dir;
        test_qfile f = base;
        e.apply(f);
        test_copy_model(good.path, dir);
        test_write_file(dir.file("model.safetensors"), test_qfile_bytes(f));
        dllm_model *m = nullptr;
        for (int mmap : {0, 1}) {
            dllm_model_params mp = dllm_model_default_params();
            mp.use_mmap = mmap;
            dllm_status s = dllm_model_load(dir.path.c_str(), mp, &m);
            CHECK_MSG(s == e.want && strstr(dllm_last_error(), e.message) && m == nullptr, "%s: %s, \"%s\"", e.what,
                      dllm_status_str(s), dllm_last_error());
        }
    }
    // unedited through the same path: loads (so the errors above come from the edits)
    {
        test_tmpdir dir;
        test_copy_model(good.path, dir);
        test_write_file(dir.file("model.safetensors"), test_qfile_bytes(base));
        dllm_model *m = test_load(dir.path);
        CHECK(m && m->soloq);
        dllm_model_free(m);
    }
    // a truncated file, and shards from two runs
    test_tmpdir cut;
    test_copy_model(good.path, cut);
    const std::string bytes = test_read_file(good.file("model.safetensors"));
    test_write_file(cut.file("model.safetensors"), bytes.substr(0, bytes.size() - 100));
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load(cut.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_FORMAT, "truncated");
    test_tmpdir a, b;
    dllm_model *qa = test_quantized(test_data("tiny-llada"), a, DLLM_PRECISION_SOLOQ_I, 0, 200000),
               *qb = test_quantized(test_data("tiny-llada"), b, DLLM_PRECISION_SOLOQ_C, 0, 200000);
    CHECK(qa && qb && qa->files.size() > 1 && qa->files.size() == qb->files.size());
    const std::string shard =
        qa && qa->files.size() > 1 ? qa->files[1]->file->path.substr(a.path.size() + 1) : "model.safetensors";
    dllm_model_free(qa);
    dllm_model_free(qb);
    test_write_file(a.file(shard.c_str()), test_read_file(b.file(shard.c_str())));
    CHECK_STATUS(dllm_model_load(a.path.c_str(), dllm_model_default_params(), &m), DLLM_ERR_FORMAT,
                 "carry different dllm.* metadata");
    CHECK(m == nullptr);
}

/* The GPU loads a quantised checkpoint's rows as they are (nothing quantised again) and computes the logits it computes
 * when it quantises the unquantised model itself, bit for bit (the device quantiser equals the CPU's, which wrote the
 * file). */
TEST(gpu_quant, stored_rows_on_the_gpu_equal_quantising_on_the_device) {
    NEED_GPU();
    struct { const char *fx; dllm_precision p; int head;
    } cases[] = {{"tiny-llada", DLLM_PRECISION_SOLOQ_I, 0},
                 {"tiny-llada", DLLM_PRECISION_SOLOQ_N, 1},
                 {"tiny-dream", DLLM_PRECISION_SOLOQ_C, 0}};
    for (auto &c : cases) {
        test_tmpdir dir;
        dllm_model *src = test_load(test_data(c.fx)), *q = test_quantized(test_data(c.fx), dir, c.p, c.head);
        if (!src || !q) { CHECK(false); dllm_model_free(src); dllm_model_free(q); continue; }
        const std::vector<int32_t> ids = test_quant_ids(src, 13);
        std::vector<float> got[2];
        dllm_model *models[2] = {src, q};
        for (int i = 0; i < 2; i++) {
            dllm_ctx_params cp = dllm_ctx_default_params();
            cp.backend = DLLM_BACKEND_GPU, cp.precision = i ? DLLM_PRECISION_AUTO : c.p,
            cp.quantize_lm_head = i ? 0 : c.head;
            dllm_ctx *ctx = nullptr;
            got[i].assign(ids.size() * (size_t)src->cfg.n_vocab, NAN);
            CHECK_STATUS(dllm_ctx_create(models[i], cp, &ctx), DLLM_OK, nullptr);
            if (ctx)
                CHECK_STATUS(
                    dllm_logits(ctx, ids.data(), (int)ids.size(), 0, (int)ids.size(), got[i].data(), got[i].size()),
                    DLLM_OK, nullptr);
            dllm_ctx_free(ctx);
        }
        CHECK_MSG(test_bitwise_equal(got[0], got[1]), "%s %s: GPU logits of the stored rows differ", c.fx,
                  dllm__precision_name(c.p));
        dllm_model_free(src);
        dllm_model_free(q);
    }
}
