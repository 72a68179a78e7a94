/* Tests: the library as a new user meets it (version, sampler filters, model info, buffer sizes) and the
 * contract of the CLI programs: exit status, stdout and stderr (issue 27). The CLI tests run the built
 * binaries from the repository root and skip where they are not built. */

TEST(api, version_string_matches_the_header) {
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", DLLM_VERSION_MAJOR, DLLM_VERSION_MINOR, DLLM_VERSION_PATCH);
    CHECK_MSG(strcmp(dllm_version(), want) == 0, "dllm_version() = \"%s\", header %s", dllm_version(), want);
}

TEST(api, model_info_reads_bos_from_generation_config) {
    dllm_model *m = test_load(test_data("tiny-llada"));  // config.json names no BOS; generation_config.json does
    dllm_model_info info;
    if (!m) { CHECK(m != nullptr); return; }
    CHECK_STATUS(dllm_model_get_info(m, &info), DLLM_OK, nullptr);
    CHECK_MSG(info.bos_id == 127 && info.eos_id == 128, "bos %d eos %d", info.bos_id, info.eos_id);
    dllm_model_free(m);
}

TEST(api, missing_model_directory_says_so) {
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load("/nonexistent-dllm-dir", dllm_model_default_params(), &m), DLLM_ERR_IO, "No such file or directory");
    CHECK(strstr(dllm_last_error(), "config.json") == nullptr);
    CHECK_STATUS(dllm_model_load("tests/data/tiny-llada/config.json", dllm_model_default_params(), &m), DLLM_ERR_IO, "not a directory");
}

TEST(api, small_output_buffer_reports_the_size_needed) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    int32_t prompt[3] = {1, 2, 3}, out[16];
    for (int32_t &o : out) o = -7;
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = 16; p.steps = 16; p.block_length = 8;
    int n = -1;
    CHECK_STATUS(dllm_generate(ctx, prompt, 3, p, out, 10, &n, nullptr), DLLM_ERR_BUFFER_TOO_SMALL, "gen_length = 16");
    CHECK_MSG(n == 16, "*n_out = %d, want the 16 needed", n);
    for (int32_t o : out) CHECK(o == -7);  // nothing written
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

// ---- the sampler filters (top-k, top-p, min-p) ------------------------------------------------------

TEST(choose, filter_cutoffs_follow_the_header) {
    // logits with a tie at 2.0; softmax masses (T = 1): 3.0 -> 0.4309, 2.0 -> 0.1585 each, 1.0 -> 0.0583, ...
    std::vector<float> row = {2.0f, 3.0f, -1.0f, 2.0f, 1.0f, NAN, 0.0f};
    dllm__sampling s;
    CHECK(dllm__row_cutoff(row, s) == -INFINITY);  // no filter keeps everything
    s.top_k = 1;
    CHECK(dllm__row_cutoff(row, s) == 3.0f);
    s.top_k = 2;  // the 2nd largest is 2.0, tied: both 2.0s kept
    CHECK(dllm__row_cutoff(row, s) == 2.0f);
    s.top_k = 6;  // six non-NaN logits: the smallest is the cut
    CHECK(dllm__row_cutoff(row, s) == -1.0f);
    s.top_k = 7;  // more than there are: off
    CHECK(dllm__row_cutoff(row, s) == -INFINITY);
    s.top_k = 0;
    double z = 0;
    for (float l : row)
        if (l == l) z += exp(l - 3.0);
    const double p3 = 1 / z, p2 = exp(-1.0) / z;
    s.top_p = (float)(p3 * 0.999);  // the top token alone reaches it
    CHECK(dllm__row_cutoff(row, s) == 3.0f);
    s.top_p = (float)(p3 + 0.5 * p2);  // needs one 2.0: the tie keeps both
    CHECK(dllm__row_cutoff(row, s) == 2.0f);
    s.top_p = (float)(p3 + 2 * p2 + 1e-3);  // needs the 1.0 too
    CHECK(dllm__row_cutoff(row, s) == 1.0f);
    s.top_p = 1;
    s.min_p = (float)(exp(-1.0) * 0.999);  // p(2.0) / p(3.0) = e^-1: kept, 1.0 (e^-2) not
    CHECK(dllm__row_cutoff(row, s) == 2.0f);
    s.temperature = 2;  // min-p on softmax(l / 2): p(1.0) / p(3.0) = e^-1 now
    CHECK(dllm__row_cutoff(row, s) == 1.0f);
    s.top_k = 1;  // the intersection: the largest cut
    CHECK(dllm__row_cutoff(row, s) == 3.0f);
}

TEST(choose, filters_reach_the_token_and_the_confidence) {
    float logits[5] = {1.0f, 3.0f, 2.5f, -2.0f, 0.5f};
    dllm__sampling s;
    s.temperature = 1.0;
    s.seed = 4;
    s.top_k = 2;
    int counts[5] = {0};
    for (uint32_t pos = 0; pos < 2000; pos++) counts[dllm__choose(logits, 5, s, pos, 1).token]++;
    CHECK_MSG(counts[0] == 0 && counts[3] == 0 && counts[4] == 0 && counts[1] > 1000 && counts[2] > 500, "%d %d %d", counts[0], counts[1], counts[2]);
    s.temperature = 0;  // the confidence is the renormalised p over the kept tokens: 1 / (1 + e^-0.5)
    dllm__choice c = dllm__choose(logits, 5, s, 0, 0);
    CHECK_MSG(c.token == 1 && fabs(c.conf - 1 / (1 + exp(-0.5))) < 1e-12, "token %d conf %.17g", c.token, c.conf);
    s.top_k = 0;  // off: bit-for-bit the unfiltered choice
    dllm__sampling plain;
    CHECK(dllm__choose(logits, 5, s, 3, 2).conf == dllm__choose(logits, 5, plain, 3, 2).conf);
}

/* Decoding with a filter that keeps one token samples nothing: at any temperature the result is the one at
 * temperature 0 with that filter (whose confidences are all 1, as Dream computes them on the filtered row). */
TEST(decode, filters_keeping_one_token_sample_nothing) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    int32_t prompt[4] = {5, 17, 42, 9}, cold[16], out[16];
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = 16; p.steps = 16; p.block_length = 8; p.stop_at_eos = 0;
    p.top_k = 1;
    int n = 0;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, p, cold, 16, &n, nullptr), DLLM_OK, nullptr);
    p.top_k = 0;
    p.temperature = 5.0f;  // hot: without a filter it wanders
    p.seed = 11;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, p, out, 16, &n, nullptr), DLLM_OK, nullptr);
    CHECK_MSG(memcmp(out, cold, sizeof out) != 0, "%s", "T = 5 unfiltered matched: the checks below could not fail");
    dllm_gen_params f = p;
    f.top_k = 1;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, f, out, 16, &n, nullptr), DLLM_OK, nullptr);
    CHECK(memcmp(out, cold, sizeof out) == 0);
    f = p;
    f.min_p = 1.0f;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, f, out, 16, &n, nullptr), DLLM_OK, nullptr);
    CHECK(memcmp(out, cold, sizeof out) == 0);
    f = p;
    f.top_p = 1e-6f;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, f, out, 16, &n, nullptr), DLLM_OK, nullptr);
    CHECK(memcmp(out, cold, sizeof out) == 0);
    f = p;
    f.top_k = -1;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, f, out, 16, &n, nullptr), DLLM_ERR_INVALID_ARGUMENT, "top_k must be >= 0");
    f = p;
    f.top_p = 0;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, f, out, 16, &n, nullptr), DLLM_ERR_INVALID_ARGUMENT, "top_p must be in (0, 1]");
    f = p;
    f.min_p = NAN;
    CHECK_STATUS(dllm_generate(ctx, prompt, 4, f, out, 16, &n, nullptr), DLLM_ERR_INVALID_ARGUMENT, "min_p must be in [0, 1]");
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}
