/* Tests: the CPU fp32 reference forward against float64 golden logits from tools/make_fixtures.py. */

struct test_golden_input {
    std::vector<int32_t> ids;
    std::vector<float> logits;  // [T][V]
};

static std::vector<test_golden_input> test_golden_inputs(const std::string &model_dir) {
    std::vector<test_golden_input> out;
    dllm__safetensors st;
    if (dllm__st_open(model_dir + "/golden_logits.safetensors", false, st) != DLLM_OK) return out;
    for (int i = 0;; i++) {
        const dllm__tensor *ids = nullptr, *lg = nullptr;
        for (const dllm__tensor &t : st.tensors) {
            if (t.name == dllm__format("ids_%d", i)) ids = &t;
            if (t.name == dllm__format("logits_%d", i)) lg = &t;
        }
        if (!ids || !lg) break;
        test_golden_input g;
        g.ids.resize((size_t)ids->numel);
        memcpy(g.ids.data(), ids->data, ids->nbytes);
        g.logits = dllm__tensor_f32(*lg);
        out.push_back(std::move(g));
    }
    return out;
}

/* max |a - b| / max |b|: the relative error of a whole logits block. */
static double test_rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = std::max(num, (double)fabsf(a[i] - b[i]));
        den = std::max(den, (double)fabsf(b[i]));
    }
    return den > 0 ? num / den : num;
}

static void test_golden_logits(dllm_test_state &T_, const char *fixture) {
    std::vector<test_golden_input> gs = test_golden_inputs(test_data(fixture));
    CHECK_MSG(gs.size() >= 2, "no golden inputs for %s", fixture);
    dllm_model *m = test_load(test_data(fixture));
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    const int V = m->cfg.n_vocab;
    for (size_t i = 0; i < gs.size(); i++) {
        const int T = (int)gs[i].ids.size();
        std::vector<float> out((size_t)T * V, NAN);  // poisoned: every element must be written
        CHECK_STATUS(dllm_logits(ctx, gs[i].ids.data(), T, 0, T, out.data(), out.size()), DLLM_OK, nullptr);
        double err = test_rel_err(out.data(), gs[i].logits.data(), out.size());
        printf("    %s input %zu (T=%d): max relative error %.2e\n", fixture, i, T, err);
        CHECK_MSG(err <= 1e-5, "%s input %zu: relative error %.3e > 1e-5", fixture, i, err);
    }
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(forward, llada_matches_golden_logits) { test_golden_logits(T_, "tiny-llada"); }

TEST(forward, dream_matches_golden_logits) { test_golden_logits(T_, "tiny-dream"); }

/* Any row range and any thread count give the same bits: the CPU reference is deterministic. */
TEST(forward, rows_and_threads_do_not_change_bits) {
    dllm_model *m = test_load(test_data("tiny-dream"));
    if (!m) { CHECK(m != nullptr); return; }
    std::vector<test_golden_input> gs = test_golden_inputs(test_data("tiny-dream"));
    const std::vector<int32_t> &ids = gs[0].ids;
    const int T = (int)ids.size(), V = m->cfg.n_vocab;
    std::vector<float> full((size_t)T * V), part((size_t)5 * V);
    dllm_ctx *one = test_ctx(m, DLLM_BACKEND_CPU, 1), *three = test_ctx(m, DLLM_BACKEND_CPU, 3);
    if (one && three) {
        CHECK_STATUS(dllm_logits(one, ids.data(), T, 0, T, full.data(), full.size()), DLLM_OK, nullptr);
        CHECK_STATUS(dllm_logits(three, ids.data(), T, 7, 12, part.data(), part.size()), DLLM_OK, nullptr);
        CHECK(memcmp(full.data() + (size_t)7 * V, part.data(), part.size() * sizeof(float)) == 0);
        CHECK_STATUS(dllm_logits(three, ids.data(), T, 0, 1, part.data(), part.size()), DLLM_OK, nullptr);
        CHECK(memcmp(full.data(), part.data(), (size_t)V * sizeof(float)) == 0);
        // Dream's shift: position 1 and position 0 are both predicted by output row 0.
        CHECK(memcmp(full.data(), full.data() + V, (size_t)V * sizeof(float)) == 0);
    }
    dllm_ctx_free(one);
    dllm_ctx_free(three);
    dllm_model_free(m);
}

TEST(forward, rope_tables_follow_hf_float32) {
    std::vector<float> c, s;
    dllm__rope_tables(500000.0f, 128, 4096, c, s);
    // position 0 is the identity; the lowest frequency is 1 for every position
    CHECK(c[0] == 1.0f && s[0] == 0.0f);
    CHECK(c[(size_t)4095 * 64] == cosf(4095.0f) && s[(size_t)4095 * 64] == sinf(4095.0f));
    float inv63 = 1.0f / powf(500000.0f, 126.0f / 128.0f);
    CHECK(c[(size_t)1000 * 64 + 63] == cosf(1000.0f * inv63));
}
