/* Tests: the tiny trained models (models/, written by tools/train_tiny.py on the GPU machine) through the
 * CPU reference: the task model's exact match and the text models' masked-token NLL from their cards. */

static int test_eval(const std::string &args, std::map<std::string, double> &out) {
    test_tmpdir dir;
    std::string cmd = "build/dllm-eval " + args + " >" + dir.file("out") + " 2>" + dir.file("err");
    int rc = system(cmd.c_str());
    std::string text = test_read_file(dir.file("out"));
    for (size_t b = 0, e; b < text.size(); b = e + 1) {
        e = text.find('\n', b);
        if (e == std::string::npos) e = text.size();
        std::string line = text.substr(b, e - b);
        size_t sp = line.find(' ');
        if (sp != std::string::npos) out[line.substr(0, sp)] = atof(line.c_str() + sp + 1);
    }
    if (rc) printf("    %s: %s\n", cmd.c_str(), test_read_file(dir.file("err")).c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(models, tiny_add_exact_match_at_least_99_percent) {
    if (!dllm__file_exists("build/dllm-eval")) SKIP("build/dllm-eval not built");
    std::map<std::string, double> r;
    CHECK(test_eval("-m models/tiny-add --add tests/data/add_test.txt --limit 200 --backend cpu", r) == 0);
    printf("    tiny-add: %g of %g problems exact\n", r["add_correct"], r["add_problems"]);
    CHECK(r["add_problems"] == 200 && r["exact_match"] >= 0.99);
}

/* The card's NLL was computed in PyTorch (float64 forward of the exported BF16 weights, HF tokenizer): dllm-eval's on
 * `backend` within `tolerance` of it (relative), with the same masked-token counts. */
static void test_nll_matches_card(dllm_test_state &T_, const char *model, const char *backend = "cpu",
                                  double tolerance = 0.01) {
    if (!dllm__file_exists("build/dllm-eval")) SKIP("build/dllm-eval not built");
    dllm__json card;
    CHECK_STATUS(dllm__json_load(std::string("models/") + model + "/model_card.json", card), DLLM_OK, nullptr);
    const dllm__json *nll = card.find("evaluation") ? card.find("evaluation")->find("masked_nll") : nullptr;
    const dllm__json *want = nll ? nll->find("nll") : nullptr, *counts = nll ? nll->find("n_masked") : nullptr;
    CHECK(want && counts && want->items.size() == 3);
    if (!want || !counts) return;
    std::map<std::string, double> r;
    CHECK(test_eval(std::string("-m models/") + model + " --nll tests/data/heldout.txt --backend " + backend, r) == 0);
    const char *keys[3] = {"nll_0.15", "nll_0.50", "nll_0.90"};
    for (int k = 0; k < 3; k++) {
        double got = r[keys[k]], card_v = want->items[(size_t)k].number;
        printf("    %s %s on the %s: %.6f (card %.6f), %g masked (card %g)\n", model, keys[k], backend, got, card_v,
               r[std::string(keys[k]) + "_masked"], counts->items[(size_t)k].number);
        CHECK_MSG(fabs(got - card_v) <= tolerance * card_v, "%s %s: %.6f vs card %.6f", model, keys[k], got, card_v);
        CHECK(r[std::string(keys[k]) + "_masked"] == counts->items[(size_t)k].number);
    }
}

TEST(models, tiny_llada_nll_matches_model_card) { test_nll_matches_card(T_, "tiny-llada"); }

TEST(models, tiny_dream_nll_matches_model_card) { test_nll_matches_card(T_, "tiny-dream"); }

/* Block-causal at 32 with the shift: the card's float64 reference of the official forward, on dllm's CPU backend. */
TEST(models, tiny_fast_dllm_v2_nll_matches_model_card) { test_nll_matches_card(T_, "tiny-fast-dllm-v2"); }

/* Block-causal at 32, LLaDA2's forward (MoE routing in fp32): the card's float64 reference of the official code. */
TEST(models, tiny_llada2_nll_matches_model_card) { test_nll_matches_card(T_, "tiny-llada2"); }

/* One of tiny-llada2's card samples: its prompt, the ids the float64 reference decoded and the settings it used. */
struct test_llada2_sample {
    std::vector<int32_t> prompt, want;
    dllm_gen_params params;
};

/* The card's greedy samples (LLaDA2.0's generate in float64: gen length, block, steps and threshold as recorded). */
static std::vector<test_llada2_sample> test_llada2_card_samples(dllm_test_state &T_) {
    dllm__json card;
    CHECK_STATUS(dllm__json_load("models/tiny-llada2/model_card.json", card), DLLM_OK, nullptr);
    const dllm__json *ev = card.find("evaluation"), *samples = ev ? ev->find("samples") : nullptr;
    CHECK(samples && !samples->items.empty());
    std::vector<test_llada2_sample> out;
    for (size_t k = 0; samples && k < samples->items.size(); k++) {
        const dllm__json &smp = samples->items[k];
        test_llada2_sample t;
        for (const dllm__json &v : smp.find("prompt_ids")->items) t.prompt.push_back((int32_t)v.number);
        for (const dllm__json &v : smp.find("output_ids")->items) t.want.push_back((int32_t)v.number);
        dllm_gen_params &p = t.params = dllm_gen_default_params();
        p.gen_length = (int)smp.find("gen_length")->number, p.block_length = (int)smp.find("block_length")->number;
        p.steps = (int)smp.find("steps")->number, p.threshold = (float)smp.find("threshold")->number;
        out.push_back(t);
    }
    return out;
}

TEST(models, tiny_llada2_decodes_the_card_samples) {
    const std::vector<test_llada2_sample> samples = test_llada2_card_samples(T_);
    dllm_model *m = test_load("models/tiny-llada2");
    dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
    CHECK(ctx != nullptr);
    int same = 0;
    for (size_t k = 0; ctx && k < samples.size(); k++) {
        const test_llada2_sample &t = samples[k];
        std::vector<int32_t> got(64);
        int n = 0;
        CHECK_STATUS(dllm_generate(ctx, t.prompt.data(), (int)t.prompt.size(), t.params, got.data(), (int)got.size(),
                                   &n, nullptr),
                     DLLM_OK, nullptr);
        got.resize((size_t)n);
        same += got == t.want;
        printf("    sample %zu (%zu prompt tokens): %s\n", k, t.prompt.size(),
               got == t.want ? "the reference's tokens" : "differs from the reference");
    }
    CHECK_MSG(!samples.empty() && same == (int)samples.size(),
              "%d of %zu samples as the float64 reference decoded them", same, samples.size());
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* The whole held-out text through the C tokenizer gives the ids Hugging Face gave in training. */
TEST(models, heldout_tokenization_matches_hugging_face) {
    std::string text = test_read_file("tests/data/heldout.txt");
    for (const char *model : {"tiny-llada", "tiny-dream", "tiny-llada2"}) {
        dllm_tokenizer *tok = nullptr;
        CHECK_STATUS(dllm_tokenizer_load((std::string("models/") + model).c_str(), &tok), DLLM_OK, nullptr);
        if (!tok) continue;
        int n = 0;
        dllm_tokenize(tok, text.data(), text.size(), 0, nullptr, 0, &n);
        std::vector<int32_t> ids((size_t)n);
        CHECK_STATUS(dllm_tokenize(tok, text.data(), text.size(), 0, ids.data(), n, &n), DLLM_OK, nullptr);
        std::vector<int32_t> want;
        std::string w = test_read_file(std::string("tests/data/heldout.") + model + ".ids");
        for (const char *p = w.c_str(); *p;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p) break;
            want.push_back((int32_t)v);
            p = end;
        }
        printf("    %s: %zu ids, Hugging Face %zu\n", model, ids.size(), want.size());
        CHECK_MSG(ids == want, "%s tokenization differs from Hugging Face's", model);
        dllm_tokenizer_free(tok);
    }
}

/* dllm-eval --agree with a scheduler under test: vanilla against vanilla agrees fully with equal NFE and
 * pseudo-log-likelihood; a dual cache runs, counts its forwards and prints its own PLL; a bad value is a
 * clear error. */
TEST(models, eval_agreement_reports_scheduler_nfe_and_pll) {
    if (!dllm__file_exists("build/dllm-eval")) SKIP("build/dllm-eval not built");
    const std::string base =
        "-m models/tiny-llada --agree tests/data/prompts.txt --limit 2 -n 8 --steps 8 --block 4 --backend cpu "
        "--ref-backend cpu";
    std::map<std::string, double> same, dual;
    CHECK(test_eval(base, same) == 0);
    CHECK(same["agree_token"] == 1.0 && same["nfe"] == 16 && same["ref_nfe"] == 16 && same["pll"] == same["ref_pll"] &&
          same["pll"] > 0);
    CHECK(test_eval(base + " --cache dual --threshold 0.5", dual) == 0);
    printf("    dual + threshold 0.5: token agreement %.3f, NFE %g / %g, PLL %.4f / %.4f\n", dual["agree_token"],
           dual["nfe"], dual["ref_nfe"], dual["pll"], dual["ref_pll"]);
    CHECK(dual["agree_sequences"] == 2 && dual["nfe"] >= 4 && dual["nfe"] <= 16 && dual["pll"] > 0 &&
          dual["ref_pll"] == same["ref_pll"]);
    std::map<std::string, double> bad;
    CHECK(test_eval(base + " --cache triple", bad) == 1);
}
