/* Concurrency: several threads, each with its own CPU-backend context over ONE shared dllm_model and one
 * shared tokenizer, render, tokenise, decode and detokenise at once, and must give the ids and text that
 * the same jobs give one at a time. `./build.sh tsan` runs these tests under ThreadSanitizer. The model is
 * the small fixture of tests/data (it takes the tokenizer's ids modulo 128, below its EOS and [MASK]), so that
 * the sanitizer run stays short. */

struct test_job {
    std::string question;
    dllm_gen_params params;
    std::vector<int32_t> prompt, out;  // results
    std::string answer;
    dllm_status status = DLLM_ERR_INTERNAL;
};

/* Jobs that walk different paths: greedy, sampled, random remasking, threshold unmasking, a K/V cache. */
static std::vector<test_job> test_concurrent_jobs() {
    const char *questions[] = {"What is two plus two?",
                               "Name a colour.",
                               "Tell me about computers.",
                               "Say hello in French.",
                               "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD, it's fine",
                               "Count: 1 2 3"};
    std::vector<test_job> jobs;
    for (int i = 0; i < 8; i++) {  // two of each kind; each of the 4 threads runs two
        test_job j;
        j.question = questions[i % 6];
        j.params = dllm_gen_default_params();
        j.params.gen_length = 16, j.params.steps = 16, j.params.block_length = 8;
        j.params.seed = (uint64_t)i;
        j.params.stop_at_eos = 0;  // every job has 16 ids to compare
        if (i % 4 == 1) j.params.temperature = 0.8f;
        if (i % 4 == 2) j.params.remasking = DLLM_REMASK_RANDOM, j.params.temperature = 0.5f;
        if (i % 4 == 3) j.params.unmask = DLLM_UNMASK_THRESHOLD, j.params.kv_cache = DLLM_KV_CACHE_DUAL;
        jobs.push_back(j);
    }
    return jobs;
}

static void test_run_job(const dllm_tokenizer *tok, dllm_ctx *ctx, test_job &j) {
    dllm_chat_message msg = {"user", j.question.c_str()};
    size_t len = 0;
    dllm_chat_render(tok, &msg, 1, 1, nullptr, 0, &len);
    std::string text(len, '\0');
    if ((j.status = dllm_chat_render(tok, &msg, 1, 1, &text[0], len, &len)) != DLLM_OK) return;
    text.pop_back();
    j.prompt = test_encode(tok, text);
    for (int32_t &id : j.prompt)
        id %= 128;  // into the small fixture model's vocabulary below its special ids (cheap under TSan)
    j.out.assign((size_t)j.params.gen_length, -1);
    int n_out = 0;
    j.status = dllm_generate(ctx, j.prompt.data(), (int)j.prompt.size(), j.params, j.out.data(), (int)j.out.size(),
                             &n_out, nullptr);
    j.out.resize((size_t)n_out);
    j.answer = test_decode(tok, j.out, 1);
}

TEST(concurrency, threads_share_one_model_and_tokenizer) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_tokenizer *tok = test_tokenizer("models/tiny-llada");
    if (!m || !tok) { CHECK(m && tok); dllm_model_free(m); dllm_tokenizer_free(tok); return; }
    std::vector<test_job> want = test_concurrent_jobs(), got = want;
    dllm_ctx *solo = test_ctx(m, DLLM_BACKEND_CPU, 1);
    for (test_job &j : want) test_run_job(tok, solo, j);
    dllm_ctx_free(solo);
    const int n_threads = 4;
    std::vector<std::thread> threads;
    std::atomic<int> bad_ctx{0};
    for (int k = 0; k < n_threads; k++)
        threads.emplace_back([&, k]() {
            dllm_ctx *ctx = test_ctx(m, DLLM_BACKEND_CPU, 2);  // each context has a worker thread of its own too
            if (!ctx) { bad_ctx++; return; }
            for (size_t i = (size_t)k; i < got.size(); i += n_threads) test_run_job(tok, ctx, got[i]);
            dllm_ctx_free(ctx);
        });
    for (std::thread &t : threads) t.join();
    CHECK(bad_ctx == 0);
    for (size_t i = 0; i < want.size(); i++) {
        CHECK_MSG(want[i].status == DLLM_OK && got[i].status == DLLM_OK, "job %zu: %s / %s", i,
                  dllm_status_str(want[i].status), dllm_status_str(got[i].status));
        CHECK_MSG(got[i].prompt == want[i].prompt && got[i].out == want[i].out && got[i].answer == want[i].answer,
                  "job %zu: threaded \"%s\" vs alone \"%s\"", i, got[i].answer.c_str(), want[i].answer.c_str());
        CHECK(!want[i].out.empty() && want[i].prompt.size() > 5);
    }
    dllm_tokenizer_free(tok);
    dllm_model_free(m);
}

/* Contexts created and freed while others decode: creation must not disturb a running context. */
TEST(concurrency, contexts_come_and_go_while_others_decode) {
    dllm_model *m = test_load(test_data("tiny-dream"));
    if (!m) { CHECK(m != nullptr); return; }
    int32_t prompt[4] = {5, 6, 7, 8};
    dllm_gen_params g = dllm_gen_default_params();
    g.gen_length = 8, g.steps = 8, g.block_length = 8, g.stop_at_eos = 0;
    std::vector<int32_t> want(8);
    dllm_ctx *solo = test_ctx(m, DLLM_BACKEND_CPU, 1);
    CHECK(solo && dllm_generate(solo, prompt, 4, g, want.data(), 8, nullptr, nullptr) == DLLM_OK);
    dllm_ctx_free(solo);
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int k = 0; k < 3; k++)
        threads.emplace_back([&]() {
            for (int r = 0; r < 4; r++) {
                dllm_ctx *ctx = test_ctx(m, DLLM_BACKEND_CPU, 1 + r % 2);
                std::vector<int32_t> out(8, -1);
                if (!ctx || dllm_generate(ctx, prompt, 4, g, out.data(), 8, nullptr, nullptr) != DLLM_OK || out != want)
                    bad++;
                dllm_ctx_free(ctx);
            }
        });
    for (std::thread &t : threads) t.join();
    CHECK(bad == 0);
    dllm_model_free(m);
}
