/* A minimal test framework for dllm's single test executable.
 * TEST(group, name) { CHECK(...); } registers a test; SKIP("why") ends it as skipped.
 * The runner prints one line per test and, last, "N passed, N failed, N skipped". */
#ifndef DLLM_TEST_FRAMEWORK_H
#define DLLM_TEST_FRAMEWORK_H

#include <stdio.h>
#include <string>
#include <vector>

struct dllm_test_state {
    int failures = 0;
    bool skipped = false;
    std::string skip_reason;
};

struct dllm_test_case {
    const char *group, *name;
    void (*fn)(dllm_test_state &);
};

static std::vector<dllm_test_case> &dllm_test_registry() {
    static std::vector<dllm_test_case> r;
    return r;
}

struct dllm_test_registrar {
    dllm_test_registrar(const char *g, const char *n, void (*fn)(dllm_test_state &)) {
        dllm_test_registry().push_back({g, n, fn});
    }
};

#define TEST(group, name)                                                                   \
    static void dllm_test_##group##_##name(dllm_test_state &T_);                            \
    static dllm_test_registrar dllm_test_reg_##group##_##name(#group, #name, dllm_test_##group##_##name); \
    static void dllm_test_##group##_##name(dllm_test_state &T_)

#define CHECK_MSG(cond, ...)                                                                \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            T_.failures++;                                                                  \
            fprintf(stdout, "    %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);    \
            fprintf(stdout, __VA_ARGS__);                                                   \
            fprintf(stdout, "\n");                                                          \
        }                                                                                   \
    } while (0)

#define CHECK(cond) CHECK_MSG(cond, "%s", "")

/* Asserts a status and, when given, that the error message mentions a substring. */
#define CHECK_STATUS(expr, want, substr)                                                    \
    do {                                                                                    \
        dllm_status got_ = (expr);                                                          \
        const char *msg_ = dllm_last_error();                                               \
        CHECK_MSG(got_ == (want), "got %s, want %s (%s)", dllm_status_str(got_), dllm_status_str(want), msg_); \
        const char *want_sub_ = (substr);                                                   \
        if (want_sub_ && got_ != DLLM_OK)                                                   \
            CHECK_MSG(strstr(msg_, want_sub_) != nullptr, "message \"%s\" lacks \"%s\"", msg_, want_sub_); \
    } while (0)

#define SKIP(reason)                                                                        \
    do {                                                                                    \
        T_.skipped = true;                                                                  \
        T_.skip_reason = (reason);                                                          \
        return;                                                                             \
    } while (0)

#endif
