/* Allocation-failure injection on the host: this executable replaces the global operator new, and a test
 * arms it to fail the i-th allocation made by its own thread, for every i in turn, on the load paths
 * (dllm_model_load, dllm_tokenizer_load) and dllm_ctx_create with the CPU backend. Each call must return
 * DLLM_ERR_OUT_OF_MEMORY with nothing half-made left behind (under ./build.sh test the ASan run asks
 * LeakSanitizer after each test), and the same call must succeed afterwards. The GPU paths (cudaMalloc)
 * are not covered here. */

#include <new>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

/* Clang's static sanitizer runtimes (ThreadSanitizer, clang's ASan) define operator new themselves: there
 * the replacement is left out and these tests skip. GCC's ASan, which ./build.sh test uses, allows it. */
#if defined(__SANITIZE_THREAD__)
#define TEST_ALLOC_INJECTION 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TEST_ALLOC_INJECTION 0
#endif
#endif
#ifndef TEST_ALLOC_INJECTION
#define TEST_ALLOC_INJECTION 1
#endif

/* The arming thread's countdown: -1 disarmed; n >= 0 fails the allocation that finds it at 0. */
static thread_local long test_alloc_countdown = -1;
static thread_local long test_alloc_seen = 0;  // allocations counted since arming

static void *test_alloc(size_t n) {
    if (test_alloc_countdown >= 0) {
        test_alloc_seen++;
        if (test_alloc_countdown-- == 0) return nullptr;
    }
    return malloc(n ? n : 1);
}

#if TEST_ALLOC_INJECTION &&                                                                                            \
    !defined(__CUDA_ARCH__)  // host code only: nvcc would compile a replacement for the device too
void *operator new(size_t n) {
    void *p = test_alloc(n);
    if (!p) throw std::bad_alloc();
    return p;
}
void *operator new[](size_t n) { return operator new(n); }
void *operator new(size_t n, const std::nothrow_t &) noexcept { return test_alloc(n); }
void *operator new[](size_t n, const std::nothrow_t &) noexcept { return test_alloc(n); }
/* Not inlined: GCC would see free() meet a pointer from operator new and warn (-Wmismatched-new-delete). */
__attribute__((noinline)) static void test_release(void *p) { free(p); }
void operator delete(void *p) noexcept { test_release(p); }
void operator delete[](void *p) noexcept { test_release(p); }
void operator delete(void *p, size_t) noexcept { test_release(p); }
void operator delete[](void *p, size_t) noexcept { test_release(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { test_release(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { test_release(p); }
#endif

/* Calls f with the i-th allocation failing, i = first, first + 1, ... until f makes fewer than i + 1 allocations;
 * each failing call must return DLLM_ERR_OUT_OF_MEMORY and the passing one DLLM_OK. f frees what it
 * made. Returns the number of allocations of a complete call. `stride` > 1 tries every stride-th i
 * only (the first 64 always), for paths of tens of thousands of allocations. */
#define TEST_NEEDS_ALLOC_INJECTION() \
    if (!TEST_ALLOC_INJECTION) SKIP("this sanitizer runtime owns operator new")

template <class F>
static long test_fail_each_allocation(dllm_test_state &T_, const char *what, long stride, F &&f, long first = 0) {
    for (long i = first;; i += (i < 64 ? 1 : stride)) {
        test_alloc_seen = 0;
        test_alloc_countdown = i;
        dllm_status s = f();
        bool reached = test_alloc_countdown < 0;  // the i-th allocation happened (and failed)
        test_alloc_countdown = -1;
        if (!reached) {
            CHECK_MSG(s == DLLM_OK, "%s: %s with no failed allocation (%s)", what, dllm_status_str(s),
                      dllm_last_error());
            return test_alloc_seen;
        }
        if (s != DLLM_ERR_OUT_OF_MEMORY || strcmp(dllm_last_error(), "out of host memory") != 0) {
            CHECK_MSG(false, "%s: allocation %ld failed, the call returned %s (%s)", what, i, dllm_status_str(s),
                      dllm_last_error());
            return -1;
        }
    }
}

/* Under ASan: anything a failed call left unreachable is reported now, not at exit. */
static bool test_no_leaks() {
#if defined(__SANITIZE_ADDRESS__)
    return __lsan_do_recoverable_leak_check() == 0;
#else
    return true;
#endif
}

static void test_model_load_survives_oom(dllm_test_state &T_, const std::string &dir) {
    long n = test_fail_each_allocation(T_, dir.c_str(), 1, [&]() {
        dllm_model *m = nullptr;
        dllm_status s = dllm_model_load(dir.c_str(), dllm_model_default_params(), &m);
        CHECK((s == DLLM_OK) == (m != nullptr));
        dllm_model_free(m);
        return s;
    });
    CHECK_MSG(n > 50, "%s: %ld allocations counted", dir.c_str(), n);
    CHECK(test_no_leaks());
}

TEST(alloc_failure, model_load_tiny_llada) {
    TEST_NEEDS_ALLOC_INJECTION();
    test_model_load_survives_oom(T_, test_data("tiny-llada"));
}
TEST(alloc_failure, model_load_tiny_dream_sharded) {
    TEST_NEEDS_ALLOC_INJECTION();
    test_model_load_survives_oom(T_, test_data("tiny-dream"));
}

static void test_tokenizer_load_survives_oom(dllm_test_state &T_, const std::string &dir, long stride) {
    long n = test_fail_each_allocation(T_, dir.c_str(), stride, [&]() {
        dllm_tokenizer *t = nullptr;
        dllm_status s = dllm_tokenizer_load(dir.c_str(), &t);
        CHECK((s == DLLM_OK) == (t != nullptr));
        dllm_tokenizer_free(t);
        return s;
    });
    CHECK_MSG(n > 50, "%s: %ld allocations counted", dir.c_str(), n);
    CHECK(test_no_leaks());
}

/* Small hand-made files reach every allocation of the loaders (tokenizer.json with added tokens, a
 * normaliser and a chat template; vocab.json + merges.txt + tokenizer_config.json + added_tokens.json);
 * the shipped tiny tokenizers are tried at a stride. */
TEST(alloc_failure, tokenizer_load_every_allocation) {
    TEST_NEEDS_ALLOC_INJECTION();
    test_tmpdir json_dir, files_dir;
    test_quiet_log quiet;
    std::string added =
        "[{\"id\":9,\"content\":\"<x>\",\"special\":true,\"lstrip\":true,\"rstrip\":false,\"normalized\":false},"
        "{\"id\":10,\"content\":\"caf\xC3\xA9\",\"special\":false,\"normalized\":true}]";
    std::string tj = test_hand_tokenizer("[\"a b\",[\"a\",\"a\"]]", false, "", added);
    tj.replace(tj.find("\"normalizer\":null"), strlen("\"normalizer\":null"), "\"normalizer\":{\"type\":\"NFC\"}");
    test_write_file(json_dir.file("tokenizer.json"), tj);
    test_write_file(json_dir.file("tokenizer_config.json"),
                    "{\"bos_token\":{\"content\":\"<x>\"},\"chat_template\":[{\"name\":\"default\",\"template\":"
                    "\"{{ bos_token }}<|start_header_id|>{{ m | trim }}<|eot_id|>\"}]}");
    test_tokenizer_load_survives_oom(T_, json_dir.path, 1);
    dllm_tokenizer *t = test_tokenizer(json_dir.path);
    CHECK(t && dllm_tokenizer_chat_template(t) == DLLM_CHAT_LLADA);
    dllm_tokenizer_free(t);
    test_write_file(files_dir.file("vocab.json"), "{\"a\":0,\"b\":1,\"ab\":2,\"\xC4\xA0\":3}");
    test_write_file(files_dir.file("merges.txt"), "#version: 0.2\na b\n");
    test_write_file(files_dir.file("tokenizer_config.json"), test_read_file("models/tiny-dream/tokenizer_config.json"));
    test_write_file(files_dir.file("added_tokens.json"), "{\"<|im_start|>\":4073,\"<extra>\":4100}");
    test_tokenizer_load_survives_oom(T_, files_dir.path, 1);
    t = test_tokenizer(files_dir.path);
    CHECK(t && dllm_tokenizer_chat_template(t) == DLLM_CHAT_CHATML && dllm_tokenizer_token_id(t, "<extra>") == 4100);
    dllm_tokenizer_free(t);
}

TEST(alloc_failure, tokenizer_load_shipped_tiny_tokenizers) {
    TEST_NEEDS_ALLOC_INJECTION();
    test_quiet_log quiet;
    test_tokenizer_load_survives_oom(T_, "models/tiny-llada", 997);
    test_tokenizer_load_survives_oom(T_, "models/tiny-dream", 997);
}

TEST(alloc_failure, cpu_context_create) {
    TEST_NEEDS_ALLOC_INJECTION();
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    for (dllm_precision precision : {DLLM_PRECISION_BF16, DLLM_PRECISION_FP8_ALL}) {
        dllm_ctx_params p = dllm_ctx_default_params();
        p.backend = DLLM_BACKEND_CPU;
        p.n_threads = 3;  // worker threads are started, and must be stopped when a later allocation fails
        p.precision = precision;
        long n = test_fail_each_allocation(T_, "dllm_ctx_create", 1, [&]() {
            dllm_ctx *c = nullptr;
            dllm_status s = dllm_ctx_create(m, p, &c);
            CHECK((s == DLLM_OK) == (c != nullptr));
            dllm_ctx_free(c);
            return s;
        });
        CHECK_MSG(n > 5, "%ld allocations counted", n);
    }
    dllm_ctx *c = test_ctx(m);  // and the model still serves a context that decodes
    int32_t prompt[3] = {1, 2, 3}, out[8];
    dllm_gen_params g = dllm_gen_default_params();
    g.gen_length = 8, g.steps = 8, g.block_length = 8;
    CHECK(c && dllm_generate(c, prompt, 3, g, out, 8, nullptr, nullptr) == DLLM_OK);
    dllm_ctx_free(c);
    dllm_model_free(m);
    CHECK(test_no_leaks());
}

/* Calls f with the first allocation of this thread failing; true if f made one. */
template <class F> static bool test_first_allocation_fails(F &&f) {
    test_alloc_countdown = 0;
    f();
    bool reached = test_alloc_countdown < 0;
    test_alloc_countdown = -1;
    return reached;
}

/* The calls that once ran outside dllm__guard, with their first allocation failed (an error message longer than
 * std::string's inline buffer, a lookup's key): DLLM_ERR_OUT_OF_MEMORY, or -1 from dllm_tokenizer_token_id, never an
 * exception out of the library. */
TEST(alloc_failure, unguarded_calls) {
    TEST_NEEDS_ALLOC_INJECTION();
    dllm_model *m = test_load("models/tiny-llada");
    dllm_tokenizer *t = m ? test_tokenizer("models/tiny-llada") : nullptr;
    if (!t) { CHECK(t != nullptr); dllm_model_free(m); return; }
    dllm_status s = DLLM_OK;
    CHECK(test_first_allocation_fails([&] { s = dllm_model_get_info(m, nullptr); }));
    CHECK(s == DLLM_ERR_OUT_OF_MEMORY && strcmp(dllm_last_error(), "out of host memory") == 0);
    CHECK_STATUS(dllm_model_get_info(m, nullptr), DLLM_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK(test_first_allocation_fails([&] { s = dllm_tokenizer_check_model(nullptr, m); }));
    CHECK(s == DLLM_ERR_OUT_OF_MEMORY && strcmp(dllm_last_error(), "out of host memory") == 0);
    CHECK_STATUS(dllm_tokenizer_check_model(nullptr, m), DLLM_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_STATUS(dllm_tokenizer_check_model(t, m), DLLM_OK, nullptr);
    const char *long_token = "<|a token longer than any inline string buffer|>";
    int32_t id = 0;
    CHECK(test_first_allocation_fails([&] { id = dllm_tokenizer_token_id(t, long_token); }));
    CHECK(id == -1 && dllm_tokenizer_token_id(t, "<|mdm_mask|>") >= 0);
    dllm_tokenizer_free(t);
    dllm_model_free(m);
    CHECK(test_no_leaks());
}
