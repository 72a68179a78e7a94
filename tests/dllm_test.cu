/* dllm's test executable: white-box tests of dllm_cuda.cu (included here, so private functions are
 * reachable) plus black-box tests of the public API and the CLI. One line per test, then the summary
 * line "N passed, N failed, N skipped". GPU tests report "skipped (no GPU)" on machines without one.
 *
 *   build/dllm-test [--filter SUB[,SUB...]] [--list] (run from the repository root)
 */
#include "../dllm_cuda.cu"

#include <sys/wait.h>

#include <random>

#include "test_framework.h"
#include "test_helpers.h"

#include "test_loader.inl"
#include "test_model.inl"
#include "test_decode.inl"
#include "test_schedulers.inl"
#include "test_api.inl"
#include "test_tokenizer.inl"
#include "test_models.inl"
#include "test_gpu.inl"
#include "test_dream_samplers.inl"
#include "test_fp8.inl"
#include "test_backend.inl"
#include "test_cli.inl"
#include "test_block_diffusion.inl"
#include "test_block_diffusion_gpu.inl"
#include "test_kv_quant.inl"
#include "test_kvq_tc.inl"
#include "test_bd_facache.inl"
#include "test_soloq.inl"
#include "test_soloq_gpu.inl"
#include "test_q4wg.inl"
#include "test_gemm_splitk.inl"
#include "test_q4_gemm.inl"
#include "test_int8_gemm.inl"
#include "test_quantize.inl"
#include "test_alloc_failure.inl"
#include "test_concurrency.inl"
#include "test_robustness.inl"
#include "test_fuzz_findings.inl"
#include "test_batch.inl"
#include "test_batch_gpu.inl"
#include "test_bd_batch_gpu.inl"
#include "test_tp.inl"
#include "test_bd_batch.inl"
#include "test_stepper.inl"
#include "test_stepper_gpu.inl"
#include "test_docs.inl"
#include "test_llada2.inl"
#include "test_llada2_gpu.inl"
#include "test_llada2_quant.inl"

/* --filter A,B,...: the tests whose "group.name" contains any of the comma-separated substrings. */
static bool test_selected(const std::string &full, const char *filter) {
    if (!filter) return true;
    for (const char *p = filter;;) {
        const char *end = strchr(p, ',');
        const std::string part(p, end ? (size_t)(end - p) : strlen(p));
        if (!part.empty() && full.find(part) != std::string::npos) return true;
        if (!end) return false;
        p = end + 1;
    }
}

int main(int argc, char **argv) {
    const char *filter = nullptr;
    bool list = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--list")) list = true;
        else { fprintf(stderr, "usage: %s [--filter SUBSTRING[,SUBSTRING...]] [--list]\n", argv[0]); return 2; }
    }
    int passed = 0, failed = 0, skipped = 0;
    for (const dllm_test_case &tc : dllm_test_registry()) {
        std::string full = std::string(tc.group) + "." + tc.name;
        if (!test_selected(full, filter)) continue;
        if (list) { printf("%s\n", full.c_str()); continue; }
        dllm_test_state st;
        double t0 = dllm__now_ms();
        tc.fn(st);
        double ms = dllm__now_ms() - t0;
        if (st.skipped && st.failures == 0) {
            skipped++;
            printf("skip  %-55s %s\n", full.c_str(), st.skip_reason.c_str());
        } else if (st.failures) {
            failed++;
            printf("FAIL  %-55s (%d check%s failed, %.0f ms)\n", full.c_str(), st.failures, st.failures == 1 ? "" : "s",
                   ms);
        } else {
            passed++;
            printf("ok    %-55s %.0f ms\n", full.c_str(), ms);
        }
        fflush(stdout);
    }
    if (!list) printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
