/* Tests: API misuse, status strings, the C99 header, the CLI contract. */

extern "C" int dllm_test_header_c99(void);

TEST(api, header_compiles_as_c99_and_cpp) {
    CHECK(dllm_test_header_c99() == 0);
    dllm_gen_params p = dllm_gen_default_params();  // and as C++: this file
    CHECK(p.gen_length == 128 && p.steps == 128 && p.block_length == 32 && p.stop_at_eos == 1 && p.mask_id == -1);
}

TEST(api, status_strings_are_distinct) {
    std::unordered_set<std::string> seen;
    for (int s = 0; s >= DLLM_ERR_FULL; s--) {
        const char *str = dllm_status_str((dllm_status)s);
        CHECK(str != nullptr && strncmp(str, "DLLM_", 5) == 0);
        CHECK(seen.insert(str).second);
    }
    CHECK(strcmp(dllm_status_str((dllm_status)-99), "DLLM_ERR_UNKNOWN") == 0);
}

TEST(api, null_arguments_are_errors) {
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load(nullptr, dllm_model_default_params(), &m), DLLM_ERR_INVALID_ARGUMENT, "dir is NULL");
    CHECK_STATUS(dllm_model_load("x", dllm_model_default_params(), nullptr), DLLM_ERR_INVALID_ARGUMENT, "out_model");
    dllm_ctx *ctx = nullptr;
    CHECK_STATUS(dllm_ctx_create(nullptr, dllm_ctx_default_params(), &ctx), DLLM_ERR_INVALID_ARGUMENT, "model is NULL");
    CHECK_STATUS(dllm_model_load_random(nullptr, 1, &m), DLLM_ERR_INVALID_ARGUMENT, "config_path is NULL");
    CHECK_STATUS(dllm_model_load_random("x", 1, nullptr), DLLM_ERR_INVALID_ARGUMENT, "out_model is NULL");
    CHECK_STATUS(dllm_model_get_info(nullptr, nullptr), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    int32_t ids[2] = {1, 2}, out[4];
    float lg[1];
    CHECK_STATUS(dllm_generate(nullptr, ids, 2, dllm_gen_default_params(), out, 4, nullptr, nullptr),
                 DLLM_ERR_INVALID_ARGUMENT, "ctx is NULL");
    CHECK_STATUS(dllm_logits(nullptr, ids, 2, 0, 1, lg, 1), DLLM_ERR_INVALID_ARGUMENT, nullptr);
    dllm_model_free(nullptr);
    dllm_ctx_free(nullptr);
    CHECK(strcmp(dllm_ctx_last_error(nullptr), "") == 0);
}

TEST(api, bad_context_params) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    dllm_ctx *ctx = nullptr;
    dllm_ctx_params p = dllm_ctx_default_params();
    p.backend = (dllm_backend)7;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "unknown backend 7");
    p = dllm_ctx_default_params();
    p.max_tokens = 100000;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "max_tokens 100000");
    p = dllm_ctx_default_params();
    p.n_threads = -2;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_INVALID_ARGUMENT, "n_threads");
    CHECK(ctx == nullptr);
    dllm_model_free(m);
}

TEST(api, bad_generation_params) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_CPU;
    cp.max_tokens = 64;
    dllm_ctx *ctx = nullptr;
    if (!m || dllm_ctx_create(m, cp, &ctx) != DLLM_OK) { CHECK(false); dllm_model_free(m); return; }
    int32_t prompt[3] = {1, 2, 3}, out[64];
    auto gen = [&](dllm_gen_params p, int n_prompt = 3, int cap = 64, const int32_t *pr = nullptr) {
        if (!pr) pr = prompt;
        return dllm_generate(ctx, pr, n_prompt, p, out, cap, nullptr, nullptr);
    };
    dllm_gen_params base = dllm_gen_default_params();
    base.gen_length = 16; base.steps = 16; base.block_length = 8;
    dllm_gen_params p = base;
    p.block_length = 5;
    CHECK_STATUS(gen(p), DLLM_ERR_INVALID_ARGUMENT, "gen_length (-n) 16 is not a multiple of block_length (--block) 5");
    p = base; p.steps = 15;
    CHECK_STATUS(gen(p), DLLM_ERR_INVALID_ARGUMENT, "steps (--steps) 15 is not a multiple of the number of blocks 2");
    // steps beyond one token a step would commit nothing: refused with the limit, at once, under both counted rules
    for (dllm_unmask rule : {DLLM_UNMASK_SCHEDULE, DLLM_UNMASK_TIMESTEPS})
        for (int steps : {18, 256, 1000000, INT_MAX}) {
            p = base; p.unmask = rule; p.steps = steps;
            CHECK_STATUS(gen(p), DLLM_ERR_INVALID_ARGUMENT, "is more than gen_length (-n) 16: at most 16 steps");
        }
    p = base; p.unmask = DLLM_UNMASK_THRESHOLD; p.steps = 1000000;  // a threshold rule steps until the block is done
    CHECK_STATUS(gen(p), DLLM_OK, nullptr);
    p = base; p.temperature = 1e30f;  // any finite temperature samples
    CHECK_STATUS(gen(p), DLLM_OK, nullptr);
    p = base; p.temperature = INFINITY;
    CHECK_STATUS(gen(p), DLLM_ERR_INVALID_ARGUMENT, "temperature (--temp) must be finite and >= 0, got inf");
    p = base; p.gen_length = 64;
    CHECK_STATUS(gen(p), DLLM_ERR_INVALID_ARGUMENT, "exceeds the context's limit of 64");
    p = base; p.temperature = -1;
    CHECK_STATUS(gen(p), DLLM_ERR_INVALID_ARGUMENT, "temperature");
    p = base; p.temperature = NAN;
    CHECK_STATUS(gen(p), DLLM_ERR_INVALID_ARGUMENT, "temperature");
    p = base; p.cfg_scale = -0.5f;
    CHECK_STATUS(gen(p), DLLM_ERR_INVALID_ARGUMENT, "cfg_scale");
    p = base; p.remasking = (dllm_remasking)9;
    CHECK_STATUS(gen(p), DLLM_ERR_INVALID_ARGUMENT, "remasking");
    p = base; p.lacache = (dllm_lacache)7;
    CHECK_STATUS(gen(p), DLLM_ERR_INVALID_ARGUMENT, "lacache");
    p = base; p.steps = 0;
    CHECK_STATUS(gen(p), DLLM_ERR_INVALID_ARGUMENT, "must be positive");
    p = base; p.mask_id = 500;
    CHECK_STATUS(gen(p), DLLM_ERR_INVALID_ARGUMENT, "mask_id (--mask-id) 500");
    CHECK_STATUS(gen(base, 3, 10), DLLM_ERR_BUFFER_TOO_SMALL, "gen_length (-n) = 16");
    CHECK_STATUS(dllm_generate(ctx, prompt, 3, base, nullptr, 0, nullptr, nullptr), DLLM_ERR_INVALID_ARGUMENT,
                 "output buffer");
    int32_t bad[3] = {1, 136, 2};
    CHECK_STATUS(gen(base, 3, 64, bad), DLLM_ERR_INVALID_ARGUMENT, "prompt[1] = 136");
    CHECK_STATUS(gen(base, -1), DLLM_ERR_INVALID_ARGUMENT, "n_prompt");
    CHECK(strstr(dllm_ctx_last_error(ctx), "n_prompt") != nullptr);
    CHECK_STATUS(gen(base), DLLM_OK, nullptr);  // the context still works after all that
    float lg[136 * 2];
    CHECK_STATUS(dllm_logits(ctx, prompt, 3, 2, 1, lg, 272), DLLM_ERR_INVALID_ARGUMENT, "rows [2, 1)");
    CHECK_STATUS(dllm_logits(ctx, prompt, 3, 0, 3, lg, 272), DLLM_ERR_BUFFER_TOO_SMALL, "408 needed");
    CHECK_STATUS(dllm_logits(ctx, prompt, 65, 0, 1, lg, 272), DLLM_ERR_INVALID_ARGUMENT, "n_ids 65");
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* dllm_last_error is the detail of the last call that failed: calls that succeed after it leave it, though inside them
 * a failure may have been recovered from (AUTO's backend choice, a GEMM candidate failing its timing on the GPU, a
 * batch whose items decode one after another). */
TEST(api, last_error_is_kept_by_calls_that_succeed) {
    dllm_model *bad = nullptr;
    CHECK_STATUS(dllm_model_load("/nonexistent/dllm-model", dllm_model_default_params(), &bad), DLLM_ERR_IO, nullptr);
    const std::string failure = dllm_last_error();
    CHECK(!failure.empty());
    auto kept = [&](const char *after) {
        CHECK_MSG(failure == dllm_last_error(), "after %s: \"%s\", want \"%s\"", after, dllm_last_error(),
                  failure.c_str());
    };
    for (const char *name : {"tiny-llada", "tiny-fast-dllm-v2"}) {
        dllm_model *m = test_load(test_data(name));
        if (!m) { CHECK(m != nullptr); return; }
        kept("dllm_model_load");
        dllm_ctx *ctx = nullptr;
        CHECK_STATUS(dllm_ctx_create(m, dllm_ctx_default_params(), &ctx), DLLM_OK,
                     nullptr);  // AUTO: the GPU where usable
        kept("dllm_ctx_create");
        const int32_t prompt[] = {1, 2, 3, 4, 5};
        dllm_gen_params gp = dllm_gen_default_params();
        gp.gen_length = 32, gp.steps = 8, gp.block_length = 32;
        int32_t out[2][33];
        CHECK_STATUS(dllm_generate(ctx, prompt, 5, gp, out[0], 33, nullptr, nullptr), DLLM_OK, nullptr);
        kept("dllm_generate");
        dllm_batch_item items[2] = {{prompt, 5, gp, out[0], 33}, {prompt, 3, gp, out[1], 33}};
        dllm_batch_result results[2];
        CHECK_STATUS(dllm_generate_batch(ctx, items, 2, results, nullptr), DLLM_OK, nullptr);
        kept("dllm_generate_batch");
        CHECK(strcmp(dllm_ctx_last_error(ctx), "") == 0);
        dllm_ctx_free(ctx);
        dllm_model_free(m);
    }
}

TEST(api, gpu_backend_without_gpu_is_a_clear_error) {
    std::string why;
    if (dllm__gpu_usable(0, why)) SKIP("a GPU is present");
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    dllm_ctx_params p = dllm_ctx_default_params();
    p.backend = DLLM_BACKEND_GPU;
    dllm_ctx *ctx = nullptr;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_ERR_NO_DEVICE, "GPU backend requested");
    p.backend = DLLM_BACKEND_AUTO;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_OK, nullptr);
    CHECK(dllm_ctx_get_backend(ctx) == DLLM_BACKEND_CPU);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

// ---- the CLI contract -------------------------------------------------------------------------------

static int test_cli(const std::string &args, std::string &out, std::string &err) {
    test_tmpdir dir;
    std::string cmd = "build/dllm-generate " + args + " >" + dir.file("out") + " 2>" + dir.file("err");
    int rc = system(cmd.c_str());
    out = test_read_file(dir.file("out"));
    err = test_read_file(dir.file("err"));
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(cli, generate_prints_ids_matching_the_library) {
    if (!dllm__file_exists("build/dllm-generate")) SKIP("build/dllm-generate not built");
    dllm__json root;
    dllm__json_load(test_data("tiny-llada/golden_traces.json"), root);
    const dllm__json &c = root.find("cases")->items[4];  // temperature 0.7, seed 3
    std::string ids;
    for (int32_t t : test_ints(c.find("prompt"))) ids += std::to_string(t) + " ";
    std::string out, err;
    int rc = test_cli("-m " + test_data("tiny-llada") + " --ids \"" + ids +
                          "\" -n 16 --steps 16 --block 4 --temp 0.7 --seed 3 --backend cpu --print-ids",
                      out, err);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, err.c_str());
    std::string want = "ids:";
    for (int32_t t : test_ints(c.find("output"))) want += " " + std::to_string(t);
    CHECK_MSG(out == want + "\n", "stdout \"%s\", want \"%s\"", out.c_str(), want.c_str());
    CHECK(err.find("generated") != std::string::npos && err.find("tokens/s") != std::string::npos);
}

TEST(cli, bad_usage_exits_nonzero_with_one_line) {
    if (!dllm__file_exists("build/dllm-generate")) SKIP("build/dllm-generate not built");
    const char *bad[] = {"",
                         "-m /nonexistent --ids \"1 2\"",
                         "-m tests/data/tiny-llada",
                         "-m tests/data/tiny-llada --ids \"1 x\"",
                         "-m tests/data/tiny-llada --ids \"1\" --remask sometimes",
                         "-m tests/data/tiny-llada --ids \"1\" -n 10 --block 3",
                         "-m tests/data/tiny-llada --ids \"1\" --bogus",
                         "-m tests/data/tiny-llada --ids \"1\" --steps"};
    for (const char *a : bad) {
        std::string out, err;
        int rc = test_cli(a, out, err);
        CHECK_MSG(rc == 1, "`%s` exited %d", a, rc);
        CHECK_MSG(std::count(err.begin(), err.end(), '\n') == 1 && err.rfind("dllm-generate: ", 0) == 0,
                  "`%s` stderr: %s", a, err.c_str());
    }
    std::string out, err;
    CHECK(test_cli("--help", out, err) == 0 && out.find("--print-ids") != std::string::npos);
}
