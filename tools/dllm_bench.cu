/* dllm-bench: speed of dllm on random weights of the real LLaDA-8B shape, generated on the GPU (no file),
 * beside the PyTorch reference run on the same GPU in the same run.
 *
 *   build/dllm-bench [--anchors anchor_torch.json] [--anchors-v2 anchor_v2.json] [--anchor-graphs anchor_graphs.log] [--json out.json]
 *   build/dllm-bench --help                the options; an unknown one is an error (exit 2), not a full run
 *   build/dllm-bench --attention-only      the attention kernel alone (compare tiles with DLLM_TILES fa_*)
 *   build/dllm-bench --rowwise-only        the memory-bound row-wise kernels alone (add + RMSNorm, RoPE, SwiGLU)
 *   build/dllm-bench --gemm-only           dllm's Hopper GEMM against cuBLASLt at the LLaDA-8B shapes of a W1 step, in
 *                                          bursts and sustained (power-capped); then its 256-, 128- and 64-wide tiles,
 *                                          gemm_splitk and cuBLASLt at M = 32, 64, 128, 512 and 2048 (LLaDA-8B and
 *                                          Fast-dLLM v2 7B shapes)
 *   build/dllm-bench --q4-gemm-only        q4wg (SoloQ-I and SoloQ-N on sm_90a) at the LLaDA-8B layer shapes, M = 32
 *                                          to 1024, beside cuBLASLt BF16 and the copy rate; then the W4 GEMM q4_gemm in every SoloQ
 *                                          weight format against cuBLASLt BF16 at the
 *                                          LLaDA-8B shapes of a block step, M = 1, 8, 32, 64 (also part of the full run)
 *   build/dllm-bench --int8-gemm-only      the INT8 GEMM path (SoloQ-I/C, more than 64 rows) against cuBLASLt BF16, FP8 and
 *                                          the BF16 path it replaces at the LLaDA-8B shapes, M = 256 and 1024 (also part of
 *                                          the full run, and of --quick --precision soloq-i / soloq-c / rtn-w4a4)
 *   build/dllm-bench --quick               that, then only the dual-cache block step and the N=1024 forward, profiled,
 *                                          LaCache's per-component savings at W1's geometry, W1 through dllm_generate
 *                                          with and without tuned_forwards, and the block-diffusion step at the
 *                                          Fast-dLLM v2 7B shape
 *   ncu --profile-from-start off build/dllm-bench --quick      the kernels of one replayed dual-cache block step
 *   build/dllm-bench --batch-rows          the batched forward (dllm_generate_batch's) of 1 to 64 canvases of 256 tokens,
 *                                          then the batched dual-cache step of 1 to 64 canvases of 1024; then both again
 *                                          under DLLM_TILES=batch_gemm_n=256, =128 and =64 (keys n256_... etc., step times only)
 *   build/dllm-bench --batch-w1            W1 with the dual cache end to end at batch 1, 4, 8, 16, 32 and 64
 *                                          (dllm_generate_batch); with --precision NAME in that precision
 *   build/dllm-bench --join-only           a request joining 15 that decode through a dllm_stepper: its first steps
 *   build/dllm-bench --llada2-only         LLaDA2.0-mini shape (MoE; --precision's; --llada2-shape flash: -flash's):
 *                                          the 32-row block step, eager and replayed, its stages, the experts it
 *                                          touched and its read floor (mini's BF16 also in the full run)
 *   build/dllm-bench --long-context [--contexts 4096,16384,32768] [--long-batch 8]    Fast-dLLM v2 7B shape, long
 *                                          prompts, gen 256, per K/V cache (BF16, SoloQ-KV4, -KV2): prefill, block step,
 *                                          tokens/s, device memory at batch 1; batched at the largest batch that fits (at
 *                                          most --long-batch); the largest batch x context that fits in 80 GB
 *   DLLM_TILES=fp8_gemm=mma build/dllm-bench     on sm_90: the FP8 rates and workloads on dllm's fp8_gemm (sm_89's GEMM)
 *
 * Prints the chip's ceilings (device copy, cuBLASLt BF16 GEMM at 8192^3; on sm_90 block-scaled FP8 GEMM at
 * 8192^3 and both precisions at the LLaDA FFN shapes with M = 1024; where FP8 runs on dllm's fp8_gemm, its rate at
 * those shapes for M = 1024 and 32, beside cuBLASLt's on sm_90), cold and warm JIT time, single forwards
 * at N = 256..2048 (time, TFLOP/s, fraction of the compute floor), the workloads W1 (prompt 768, gen 256,
 * block 32, 256 steps) and W1-64 (64 steps) in BF16 and in FP8 (dllm_precision), peak GPU memory, and the
 * ratios to tools/torch anchors (shared/anchors/torch_reference.py and torch_reference_graphs.py) when given.
 * White-box: includes dllm_cuda.cu to time internal stages. Built by ./build.sh; run by ./build.sh gpu.
 */
#include "../dllm_cuda.cu"

#include <cuda_profiler_api.h>

#include <map>
#include <set>

struct bench_result {
    std::map<std::string, double> v;  // name -> value, printed and written as JSON
    void set(const std::string &k, double x) {
        v[k] = x;
        printf("%-40s %12.3f\n", k.c_str(), x);
        fflush(stdout);
    }
};

#define BENCH_CHECK(expr)                                                                 \
    do {                                                                                  \
        dllm_status s_ = (expr);                                                          \
        if (s_ != DLLM_OK) {                                                              \
            fprintf(stderr, "dllm-bench: %s: %s\n", dllm_status_str(s_), dllm_last_error()); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

/* Median of reps timings (ms) of fn on the stream, after warm-up runs. */
template <class F>
static double bench_ms(cudaStream_t s, int warm, int reps, F &&fn) {
    for (int i = 0; i < warm; i++) fn();
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        cudaEventRecord(a, s);
        fn();
        cudaEventRecord(b, s);
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        t.push_back(ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/* Microseconds per launch of launch(i), i = 0..9 launched back to back (launch gaps amortised), median of reps such runs. */
template <class F>
static double bench_us_each(cudaStream_t s, int reps, F &&launch) {
    return 1000 * bench_ms(s, 2, reps, [&] { for (int i = 0; i < 10; i++) launch(i); }) / 10;
}

/* Lets the GPU idle for 0.5 s, so that the clock a timing starts at does not depend on what ran before it (a sustained
 * BF16 GEMM on an H200 meets the 700 W power cap and the SM clock falls by about a fifth). */
static void bench_idle(cudaStream_t s) {
    cudaStreamSynchronize(s);
    usleep(500000);
}

/* Microseconds per launch of launch() in the state a long run reaches: after bench_idle, launched alone for 0.4 s,
 * then 200 launches timed. */
template <class F>
static double bench_us_sustained(cudaStream_t s, F &&launch) {
    bench_idle(s);
    const double t0 = dllm__now_ms();
    while (dllm__now_ms() - t0 < 400) {
        for (int i = 0; i < 20; i++) launch();
        cudaStreamSynchronize(s);
    }
    return 1000 * bench_ms(s, 0, 1, [&] { for (int i = 0; i < 200; i++) launch(); }) / 200;
}

/* The row-wise module's kernels, typed by the kernel table. */
static dllm__rowwise_kernels bench_rowwise_kernels(std::shared_ptr<dllm__module> &rowwise) {
    dllm__rowwise_kernels k;
    dllm__bind(k, *rowwise);
    return k;
}

/* Random bf16 values: zeros run faster than real data. */
static void bench_fill(std::shared_ptr<dllm__module> &rowwise, dllm__dbuf &buf, uint64_t n, cudaStream_t s) {
    BENCH_CHECK(bench_rowwise_kernels(rowwise).fill_random_bf16.launch({dim3(1024), dim3(256)}, s, buf.ptr, n, (uint64_t)(uintptr_t)buf.ptr, 1.0f, 0));
}

/* One GEMM shape's operands, random, in BF16 and (for FP8) quantised with dllm's own kernels. */
struct bench_gemm_shape {
    int M, N, K;
    dllm__dbuf x, w, y, x8, xs, w8, ws;
};

static void bench_prepare(std::shared_ptr<dllm__module> &rowwise, bench_gemm_shape &g, bool fp8, cudaStream_t s) {
    BENCH_CHECK(g.x.fit((size_t)g.M * g.K * 2, "gemm"));
    BENCH_CHECK(g.w.fit((size_t)g.N * g.K * 2, "gemm"));
    BENCH_CHECK(g.y.fit((size_t)g.M * g.N * 2, "gemm"));
    bench_fill(rowwise, g.x, (uint64_t)g.M * g.K, s);
    bench_fill(rowwise, g.w, (uint64_t)g.N * g.K, s);
    if (!fp8) return;
    const int kb = g.K / 128, ld_w = dllm__round_up(kb, 4), nb = (g.N + 127) / 128;  // M and K: multiples of 128 here
    BENCH_CHECK(g.x8.fit((size_t)g.M * g.K, "gemm"));
    BENCH_CHECK(g.xs.fit((size_t)kb * g.M * 4, "gemm"));
    BENCH_CHECK(g.w8.fit((size_t)g.N * g.K, "gemm"));
    BENCH_CHECK(g.ws.fit((size_t)nb * ld_w * 4, "gemm"));
    const dllm__rowwise_kernels k = bench_rowwise_kernels(rowwise);
    BENCH_CHECK(k.quantize_rows_e4m3.launch({dllm__e4m3_rows_grid(g.M, g.K), dim3(128)}, s, g.x.ptr, 0, g.K, g.M, g.x8.ptr, g.xs.ptr, g.M, 0.0f));
    BENCH_CHECK(k.quantize_weight_blocks.launch({dim3((unsigned)kb, (unsigned)nb), dim3(256)}, s, g.w.ptr, g.N, g.K, g.w8.ptr, g.ws.ptr, ld_w));
}

/* TFLOP/s of cuBLASLt on one shape (the algorithm dllm would pick: autotuned, no split-K). */
static double bench_gemm_rate(dllm__gemm &gemm, std::shared_ptr<dllm__module> &rowwise, int M, int N, int K, bool fp8, cudaStream_t s) {
    bench_gemm_shape g;
    g.M = M; g.N = N; g.K = K;
    bench_prepare(rowwise, g, fp8, s);
    double ms = bench_ms(s, 3, 10, [&] {
        if (fp8) BENCH_CHECK(gemm.run_fp8(g.x8.ptr, g.xs.as<float>(), g.w8.ptr, g.ws.as<float>(), g.y.ptr, M, N, K, s));
        else BENCH_CHECK(gemm.run(g.x.ptr, g.w.ptr, g.y.ptr, M, N, K, CUDA_R_16BF, s));
    });
    return 2.0 * M * N * K / ms / 1e9;
}

/* TFLOP/s of dllm's own FP8 GEMM (fp8_gemm) on one shape, on the operands cuBLASLt's FP8 rate is measured on. */
static double bench_mma_rate(const dllm__fp8_mma &k, std::shared_ptr<dllm__module> &rowwise, int M, int N, int K, cudaStream_t s) {
    bench_gemm_shape g;
    g.M = M; g.N = N; g.K = K;
    bench_prepare(rowwise, g, true, s);
    double ms = bench_ms(s, 3, 10, [&] { BENCH_CHECK(dllm__fp8_mma_run(k, g.x8.ptr, g.xs.as<float>(), g.w8.ptr, g.ws.as<float>(), g.y.ptr, M, N, K, s)); });
    return 2.0 * M * N * K / ms / 1e9;
}

/* fp8_gemm where FP8 runs on it (sm_89, or sm_90 under DLLM_TILES=fp8_gemm=mma) at the LLaDA FFN shapes, for 1024 tokens and
 * for a 32-row block step; on sm_90 cuBLASLt's block-scaled rate at 32 rows beside it (1024: bench_ceilings). */
static void bench_mma_gemm(bench_result &r, dllm__gemm &gemm, std::shared_ptr<dllm__module> &rowwise, const dllm__arch &arch, cudaStream_t s) {
    dllm__fp8_gemm mode;
    BENCH_CHECK(dllm__fp8_gemm_for(arch, mode));
    if (mode != DLLM__FP8_MMA) return;
    dllm__fp8_mma k;
    BENCH_CHECK(dllm__fp8_mma_load(arch, k));
    for (int M : {1024, 32}) {
        r.set(dllm__format("fp8_mma_gemm_ffn_gate_up_M%d_TFLOPs", M), bench_mma_rate(k, rowwise, M, 2 * 12288, 4096, s));
        r.set(dllm__format("fp8_mma_gemm_ffn_down_M%d_TFLOPs", M), bench_mma_rate(k, rowwise, M, 4096, 12288, s));
    }
    if (arch.fp8 != DLLM__FP8_CUBLASLT_BLOCK) return;
    r.set("fp8_gemm_ffn_gate_up_M32_TFLOPs", bench_gemm_rate(gemm, rowwise, 32, 2 * 12288, 4096, true, s));
    r.set("fp8_gemm_ffn_down_M32_TFLOPs", bench_gemm_rate(gemm, rowwise, 32, 4096, 12288, true, s));
}

static void bench_ceilings(bench_result &r, cudaStream_t s) {
    const size_t n = (size_t)1 << 30;
    dllm__dbuf a, b;
    BENCH_CHECK(a.fit(n, "copy"));
    BENCH_CHECK(b.fit(n, "copy"));
    cudaMemsetAsync(a.ptr, 1, n, s);
    double ms = bench_ms(s, 3, 10, [&] { cudaMemcpyAsync(b.ptr, a.ptr, n, cudaMemcpyDeviceToDevice, s); });
    r.set("copy_TBps", 2.0 * n / ms / 1e9);
    a.release();
    b.release();
    std::shared_ptr<dllm__module> rowwise;
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    const dllm__arch arch = dllm__arch_for(prop.major * 10 + prop.minor);
    BENCH_CHECK(dllm__jit_load(dllm__module_rowwise(arch), rowwise));
    dllm__gemm g;
    BENCH_CHECK(g.init());
    r.set("bf16_gemm_8192_TFLOPs", bench_gemm_rate(g, rowwise, 8192, 8192, 8192, false, s));
    bench_mma_gemm(r, g, rowwise, arch, s);
    if (arch.fp8 != DLLM__FP8_CUBLASLT_BLOCK) {
        printf("(no block-scaled cuBLASLt FP8 on sm_%d: its rates not measured)\n", arch.cc);
        return;
    }
    r.set("fp8_gemm_8192_TFLOPs", bench_gemm_rate(g, rowwise, 8192, 8192, 8192, true, s));
    // the LLaDA FFN GEMMs at M = 1024 tokens: gate|up (N = 2 x 12288, K = 4096) and down (N = 4096, K = 12288)
    r.set("bf16_gemm_ffn_gate_up_M1024_TFLOPs", bench_gemm_rate(g, rowwise, 1024, 2 * 12288, 4096, false, s));
    r.set("fp8_gemm_ffn_gate_up_M1024_TFLOPs", bench_gemm_rate(g, rowwise, 1024, 2 * 12288, 4096, true, s));
    r.set("bf16_gemm_ffn_down_M1024_TFLOPs", bench_gemm_rate(g, rowwise, 1024, 4096, 12288, false, s));
    r.set("fp8_gemm_ffn_down_M1024_TFLOPs", bench_gemm_rate(g, rowwise, 1024, 4096, 12288, true, s));
}

/* gemm_wg (sm_90a) against cuBLASLt's tuned best at the LLaDA-8B shapes of a 1024-token step (10 launches back to
 * back a timing, the same operands); with `sustained` (--gemm-only) both also as a power-capped forward runs them
 * (bench_us_sustained, about 10 s in all). */
static void bench_gemm_wg(bench_result &r, const dllm__arch &arch, cudaStream_t s, bool sustained) {
    dllm__gemm_wg k;
    BENCH_CHECK(dllm__gemm_wg_load(arch, 256, k));
    if (!k.kernel.fn) {
        printf("(no gemm_wg on sm_%d)\n", arch.cc);
        return;
    }
    std::shared_ptr<dllm__module> rowwise;
    BENCH_CHECK(dllm__jit_load(dllm__module_rowwise(arch), rowwise));
    dllm__gemm lt;  // cuBLASLt alone: no gemm_wg candidate
    BENCH_CHECK(lt.init());
    const int M = 1024;
    struct { const char *name; int N, K; } shapes[] = {{"qkv", 3 * 4096, 4096}, {"o", 4096, 4096}, {"gate_up", 2 * 12288, 4096}, {"down", 4096, 12288}};
    for (const auto &sh : shapes) {
        bench_gemm_shape g;
        g.M = M; g.N = sh.N; g.K = sh.K;
        bench_prepare(rowwise, g, false, s);
        auto run_lt = [&] { BENCH_CHECK(lt.run(g.x.ptr, g.w.ptr, g.y.ptr, M, sh.N, sh.K, CUDA_R_16BF, s)); };
        auto run_wg = [&] { BENCH_CHECK(dllm__gemm_wg_run(k, g.x.ptr, g.w.ptr, g.y.ptr, M, sh.N, sh.K, s)); };
        if (sustained) bench_idle(s);  // the bursts at full clock, not where the previous shape's sustained runs left it
        const double lt_us = bench_us_each(s, 7, [&](int) { run_lt(); });
        const double us = bench_us_each(s, 7, [&](int) { run_wg(); });
        const std::string name = dllm__format("gemm %s M%d ", sh.name, M);
        r.set(name + "cuBLASLt us", lt_us);
        r.set(name + "gemm_wg us", us);
        r.set(name + "gemm_wg TFLOPs", 2.0 * M * sh.N * sh.K / us / 1e6);
        r.set(name + "gemm_wg vs cuBLASLt", us / lt_us);
        if (!sustained) continue;
        const double lt_held = bench_us_sustained(s, run_lt), held = bench_us_sustained(s, run_wg);
        r.set(name + "cuBLASLt sustained us", lt_held);
        r.set(name + "gemm_wg sustained us", held);
        r.set(name + "cuBLASLt sustained TFLOPs", 2.0 * M * sh.N * sh.K / lt_held / 1e6);
    }
}

/* [batch] gemm_wg's tile widths (256, 128 and 64, which dllm__batch_gemm_width times), gemm_splitk and cuBLASLt's tuned
 * best at the LLaDA-8B shapes for the row counts of batched steps (M = 32: a dual-cache block step alone; 512: 16 of
 * them; 128 and 2048 around), 10 launches back to back a timing. Keys "n<width> us", each narrower width's
 * "n<width>/n256", "splitk us", "cuBLASLt us" and "splitk/cuBLASLt". */
static void bench_gemm_wg_widths(bench_result &r, const dllm__arch &arch, cudaStream_t s) {
    const int widths[3] = {256, 128, 64};
    dllm__gemm_wg k[3];
    for (int i = 0; i < 3; i++) {
        BENCH_CHECK(dllm__gemm_wg_load(arch, widths[i], k[i]));
        if (!k[i].kernel.fn) return;
    }
    std::shared_ptr<dllm__module> rowwise;
    BENCH_CHECK(dllm__jit_load(dllm__module_rowwise(arch), rowwise));
    dllm__gemm_splitk splitk;
    BENCH_CHECK(dllm__gemm_splitk_load(arch, splitk));
    dllm__gemm lt;  // cuBLASLt alone: no gemm_wg candidate
    BENCH_CHECK(lt.init());
    // LLaDA-8B's, then Fast-dLLM v2 7B's (Qwen2.5-7B: the block-diffusion step)
    struct { const char *name; int N, K; } shapes[] = {{"qkv", 3 * 4096, 4096}, {"o", 4096, 4096}, {"gate_up", 2 * 12288, 4096}, {"down", 4096, 12288},
                                                       {"v2_qkv", 4608, 3584}, {"v2_o", 3584, 3584}, {"v2_gate_up", 2 * 18944, 3584}, {"v2_down", 3584, 18944}};
    for (const auto &sh : shapes)
        for (int M : {32, 64, 128, 512, 2048}) {
            bench_gemm_shape g;
            g.M = M; g.N = sh.N; g.K = sh.K;
            bench_prepare(rowwise, g, false, s);
            const std::string name = dllm__format("gemm_wg %s M%d ", sh.name, M);
            double us[3];
            for (int i = 0; i < 3; i++) {
                us[i] = bench_us_each(s, 7, [&](int) { BENCH_CHECK(dllm__gemm_wg_run(k[i], g.x.ptr, g.w.ptr, g.y.ptr, M, sh.N, sh.K, s)); });
                r.set(name + dllm__format("n%d us", widths[i]), us[i]);
                if (i > 0) r.set(name + dllm__format("n%d/n256", widths[i]), us[i] / us[0]);
            }
            const size_t ws_floats = dllm__splitk_workspace_floats(sh.N, dllm__splitk_cut_of(sh.N, sh.K, splitk.sm_count));
            dllm__dbuf ws;
            BENCH_CHECK(ws.fit(ws_floats * 4, "splitk bench"));
            cudaMemset(ws.ptr, 0, ws_floats * 4);
            const double sk = bench_us_each(s, 7, [&](int) {
                BENCH_CHECK(dllm__gemm_splitk_run(splitk, g.x.ptr, g.w.ptr, g.y.ptr, M, sh.N, sh.K, ws.as<float>(), ws_floats, s));
            });
            const double lt_us = bench_us_each(s, 7, [&](int) { BENCH_CHECK(lt.run(g.x.ptr, g.w.ptr, g.y.ptr, M, sh.N, sh.K, CUDA_R_16BF, s)); });
            r.set(name + "splitk us", sk);
            r.set(name + "cuBLASLt us", lt_us);
            r.set(name + "splitk/cuBLASLt", sk / lt_us);
        }
}

/* n bytes in [lo, lo + span) from a xorshift stream (seed advances) into buf on the device. */
static void bench_random_bytes(dllm__dbuf &buf, size_t n, int lo, int span, uint64_t &seed, const char *what) {
    std::vector<uint8_t> host(n);
    for (uint8_t &b : host) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        b = (uint8_t)(lo + (int)((seed >> 24) % (uint64_t)span));
    }
    BENCH_CHECK(buf.fit(n, what));
    cudaMemcpy(buf.ptr, host.data(), n, cudaMemcpyHostToDevice);
}

/* [W4 GEMM] q4_gemm in every SoloQ weight format at the LLaDA-8B shapes of a block step (O 4096 x 4096, fused QKV
 * 6144 x 4096, fused gate|up 24576 x 4096, down 4096 x 12288) for M = 1, 8, 32, 64 rows, beside cuBLASLt BF16 on the
 * same shape (its tuned best, bf16 out): microseconds a launch (10 back to back, split-K's reduction included), the
 * ratio to cuBLASLt, and TB/s on the packed bytes (codes, NVFP4's block scales, row scales). The weights are random
 * bytes: every nibble and every E8P code is valid, so the dequantisers see realistic variety (NVFP4's block scales are
 * kept finite). */
static void bench_q4_gemm(bench_result &r, const dllm__arch &arch, cudaStream_t s) {
    dllm__q4_gemm_kernels k;
    BENCH_CHECK(dllm__q4_gemm_load(arch, k));
    std::shared_ptr<dllm__module> rowwise;
    BENCH_CHECK(dllm__jit_load(dllm__module_rowwise(arch), rowwise));
    dllm__gemm lt;
    BENCH_CHECK(lt.init());
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    auto random_bytes = [&](dllm__dbuf &buf, size_t n, int lo, int span) { bench_random_bytes(buf, n, lo, span, seed, "q4 bench"); };
    struct { const char *name; int N, K; } shapes[] = {{"o", 4096, 4096}, {"qkv", 6144, 4096}, {"gate_up", 2 * 12288, 4096}, {"down", 4096, 12288}};
    for (const auto &sh : shapes) {
        bench_gemm_shape g;
        g.M = dllm__q4_max_rows; g.N = sh.N; g.K = sh.K;
        bench_prepare(rowwise, g, false, s);  // bf16 activations [64][K], bf16 weights for cuBLASLt, y [64][N]
        const int blocks = (sh.K + 15) / 16;
        dllm__dbuf codes, block_scales, row_scale, workspace;
        random_bytes(codes, (size_t)sh.N * sh.K / 2, 0, 256);
        random_bytes(block_scales, (size_t)sh.N * blocks, 0x20, 0x30);  // UE4M3 codes 0x20..0x4f: 2^-3 .. 7.5, finite
        BENCH_CHECK(dllm__upload_f32(row_scale, std::vector<float>((size_t)sh.N, 1e-3f), "q4 bench"));
        const size_t ws = dllm__q4_gemm_workspace_floats(k, dllm__q4_max_rows, sh.N, sh.K);
        BENCH_CHECK(workspace.fit(std::max<size_t>(ws, 1) * 4, "q4 bench"));
        printf("q4_gemm %s (N %d, K %d): %d split(s)\n", sh.name, sh.N, sh.K, dllm__q4_gemm_splits(k.sm_count, sh.N, sh.K));
        for (int M : {1, 8, 32, 64}) {
            const std::string at = dllm__format("q4 %s M%d ", sh.name, M);
            const double lt_us = bench_us_each(s, 7, [&](int) { BENCH_CHECK(lt.run(g.x.ptr, g.w.ptr, g.y.ptr, M, sh.N, sh.K, CUDA_R_16BF, s)); });
            r.set(at + "cuBLASLt BF16 us", lt_us);
            for (int fi = 0; fi <= DLLM__Q4_RTN; fi++) {
                const dllm__q4_format f = (dllm__q4_format)fi;
                const double us = bench_us_each(s, 7, [&](int) {
                    BENCH_CHECK(dllm__q4_gemm_run(k, f, codes.ptr, block_scales.ptr, row_scale.as<float>(), g.x.ptr, sh.K, nullptr, g.y.ptr, sh.N, 0, CUDA_R_16BF, M,
                                                  sh.N, sh.K, workspace.as<float>(), ws, s));
                });
                const double bytes = (double)sh.N * sh.K / 2 + (f == DLLM__Q4_NVFP4 ? (double)sh.N * blocks : 0) + 4.0 * sh.N;
                const std::string name = at + dllm__q4_names[f];
                r.set(name + " us", us);
                r.set(name + " vs cuBLASLt", us / lt_us);
                r.set(name + " TBps", bytes / us / 1e6);
            }
        }
    }
    printf("\n| q4_gemm, us (ratio to cuBLASLt BF16; TB/s on packed bytes) | cuBLASLt BF16 us |");
    for (int fi = 0; fi <= DLLM__Q4_RTN; fi++) printf(" %s |", dllm__q4_names[fi]);
    printf("\n|---|---|---|---|---|---|---|\n");
    for (const auto &sh : shapes)
        for (int M : {1, 8, 32, 64}) {
            const std::string at = dllm__format("q4 %s M%d ", sh.name, M);
            printf("| %s (N %d, K %d) M = %d | %.1f |", sh.name, sh.N, sh.K, M, r.v[at + "cuBLASLt BF16 us"]);
            for (int fi = 0; fi <= DLLM__Q4_RTN; fi++) {
                const std::string name = at + dllm__q4_names[fi];
                printf(" %.1f (%.2fx; %.2f) |", r.v[name + " us"], r.v[name + " vs cuBLASLt"], r.v[name + " TBps"]);
            }
            printf("\n");
        }
}

/* [W4 GEMM] q4wg on sm_90a, SoloQ-I (q4wg_gemm; RTN-W4A4 runs the same code) and SoloQ-N (q4wg_gemm_nv, weights packed
 * on the device from random codes and normal block scales), at the LLaDA-8B layer shapes for M = 32 to 1024 token rows,
 * beside cuBLASLt BF16 on the same shape and M and the device's copy rate: microseconds a launch (weights rotated over
 * enough copies to leave the 50 MB L2 for both), the ratios, the rate SoloQ-I's codes stream at and its share of the
 * copy rate, and each M's sum over the four projections (the targets are on those sums). */
static void bench_q4wg(bench_result &r, const dllm__arch &arch, cudaStream_t s) {
    dllm__q4wg_kernels k;
    if (dllm__q4wg_load(arch, k) != DLLM_OK) {
        printf("q4wg: %s\n", dllm_last_error());
        return;
    }
    std::shared_ptr<dllm__module> rowwise;
    BENCH_CHECK(dllm__jit_load(dllm__module_rowwise(arch), rowwise));
    dllm__gemm lt;
    BENCH_CHECK(lt.init());
    double copy_TBps = 0;
    {
        const size_t n = (size_t)512 << 20;
        dllm__dbuf a, b;
        BENCH_CHECK(a.fit(n, "copy"));
        BENCH_CHECK(b.fit(n, "copy"));
        cudaMemsetAsync(a.ptr, 1, n, s);
        copy_TBps = 2.0 * n / bench_ms(s, 3, 10, [&] { cudaMemcpyAsync(b.ptr, a.ptr, n, cudaMemcpyDeviceToDevice, s); }) / 1e9;
    }
    r.set("q4wg copy_TBps", copy_TBps);
    uint64_t seed = 0x51ED270B27D4A5F1ull;
    struct { const char *name; int N, K; } shapes[] = {{"qkv", 3 * 4096, 4096}, {"o", 4096, 4096}, {"gate_up", 2 * 12288, 4096}, {"down", 4096, 12288}};
    const int Ms[] = {32, 64, 128, 256, 512, 1024};
    std::map<int, double> q4_sum, nv_sum, lt_sum;
    printf("\n| q4wg | M | SoloQ-I us | SoloQ-N us | cuBLASLt BF16 us | SoloQ-I ratio | SoloQ-N ratio | SoloQ-I codes TB/s | "
           "of copy |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const auto &sh : shapes) {
        const size_t code_bytes = (size_t)sh.N * sh.K / 2, copies = std::max<size_t>(2, (256u << 20) / code_bytes);
        const size_t bf16_copies = std::max<size_t>(2, (256u << 20) / (code_bytes * 4));
        std::vector<dllm__dbuf> codes(copies), wb(bf16_copies);
        for (dllm__dbuf &c : codes) bench_random_bytes(c, code_bytes, 0, 256, seed, "q4wg bench");
        std::vector<dllm__linear> nv(copies);  // SoloQ-N: codes and block scales packed (4.5 bits a weight)
        for (dllm__linear &W : nv) {
            W.format = DLLM__W_Q4, W.n = sh.N, W.k = sh.K, W.q4.reset(new dllm__q4_site);
            W.q4->format = DLLM__Q4_NVFP4;
            bench_random_bytes(W.data, code_bytes, 0, 256, seed, "q4wg bench");
            bench_random_bytes(W.q4->block_scales, (size_t)sh.N * sh.K / 16, 0x30, 0x20, seed, "q4wg bench");
            BENCH_CHECK(dllm__q4wg_pack(k, W, s));
        }
        for (dllm__dbuf &w : wb) {
            BENCH_CHECK(w.fit((size_t)sh.N * sh.K * 2, "q4wg bench"));
            bench_fill(rowwise, w, (uint64_t)sh.N * sh.K, s);
        }
        dllm__dbuf x8, xb, s_x, s_w, y, ws;
        bench_random_bytes(x8, (size_t)1024 * sh.K, 256 - 15, 31, seed, "q4wg bench");
        BENCH_CHECK(xb.fit((size_t)1024 * sh.K * 2, "q4wg bench"));
        bench_fill(rowwise, xb, (uint64_t)1024 * sh.K, s);
        BENCH_CHECK(dllm__upload_f32(s_x, std::vector<float>(1024, 1e-2f), "q4wg bench"));
        BENCH_CHECK(dllm__upload_f32(s_w, std::vector<float>((size_t)sh.N, 1e-3f), "q4wg bench"));
        BENCH_CHECK(y.fit((size_t)1024 * sh.N * 2, "q4wg bench"));
        const size_t ws_ints = std::max(dllm__q4wg_workspace_ints(sh.N), dllm__q4wg_nv_workspace_ints(sh.N, sh.K, 1024));
        BENCH_CHECK(ws.fit(ws_ints * 4, "q4wg bench"));
        cudaMemsetAsync(ws.ptr, 0, ws_ints * 4, s);
        for (int M : Ms) {
            const double q4 = bench_us_each(s, 7, [&](int i) {
                BENCH_CHECK(dllm__q4wg_gemm_run(k, DLLM__Q4_INT4, codes[(size_t)i % copies].ptr, s_w.as<float>(), x8.as<signed char>(),
                                                s_x.as<float>(), y.as<bf16_t>(), M, sh.N, sh.K, ws.as<int>(), ws_ints, s));
            });
            const double nvu = bench_us_each(s, 7, [&](int i) {  // the same tokens read as bf16 C values
                BENCH_CHECK(dllm__q4wg_gemm_nv_run(k, nv[(size_t)i % copies].data.ptr, s_w.as<float>(), xb.as<bf16_t>(), s_x.as<float>(),
                                                   y.as<bf16_t>(), M, sh.N, sh.K, ws.as<int>(), ws_ints, s));
            });
            const double bf16 = bench_us_each(s, 7, [&](int i) {
                BENCH_CHECK(lt.run(xb.ptr, wb[(size_t)i % bf16_copies].ptr, y.ptr, M, sh.N, sh.K, CUDA_R_16BF, s));
            });
            const double TBps = (double)code_bytes / q4 / 1e6;
            const std::string at = dllm__format("q4wg %s M%d ", sh.name, M);
            r.set(at + "us", q4), r.set(at + "cuBLASLt BF16 us", bf16), r.set(at + "vs cuBLASLt", q4 / bf16), r.set(at + "of copy", TBps / copy_TBps);
            r.set(at + "SoloQ-N us", nvu), r.set(at + "SoloQ-N vs cuBLASLt", nvu / bf16);
            q4_sum[M] += q4, nv_sum[M] += nvu, lt_sum[M] += bf16;
            printf("| %s (N %d, K %d) | %d | %.1f | %.1f | %.1f | %.3f | %.3f | %.2f | %.0f%% |\n", sh.name, sh.N, sh.K, M, q4, nvu, bf16,
                   q4 / bf16, nvu / bf16, TBps, 100 * TBps / copy_TBps);
        }
    }
    printf("\n| q4wg, the four projections summed | M | SoloQ-I us | SoloQ-N us | cuBLASLt BF16 us | SoloQ-I ratio | SoloQ-N ratio |\n"
           "|---|---|---|---|---|---|---|\n");
    for (int M : Ms) {
        r.set(dllm__format("q4wg summed M%d vs cuBLASLt", M), q4_sum[M] / lt_sum[M]);
        r.set(dllm__format("q4wg SoloQ-N summed M%d vs cuBLASLt", M), nv_sum[M] / lt_sum[M]);
        printf("| (device copy %.2f TB/s) | %d | %.1f | %.1f | %.1f | %.3f | %.3f |\n", copy_TBps, M, q4_sum[M], nv_sum[M], lt_sum[M],
               q4_sum[M] / lt_sum[M], nv_sum[M] / lt_sum[M]);
    }
}

/* [INT8 GEMM] The GEMMs of many rows SoloQ-I / SoloQ-C / RTN-W4A4 run, at the LLaDA-8B shapes of a forward (O 4096 x
 * 4096, fused QKV 12288 x 4096, fused gate|up 24576 x 4096, down 4096 x 12288) for M = 256 and 1024 rows: cuBLASLt's
 * INT8 GEMM alone (int8 in, int32 out) beside cuBLASLt BF16 and block-scaled FP8 on the same shape (microseconds a
 * launch, TFLOP/s), then gemm_q4's two whole paths on 4-bit INT4 weights in the backend's chunks of weight rows: the
 * INT8 path (unpack to int8, INT8 GEMM, epilogue) and the BF16 path it replaces (dequantise to bf16, BF16 GEMM into
 * fp32, epilogue). The INT8 path's ratio to the BF16 path decides nothing at run time (gemm_q4 takes it by rule above
 * 64 rows): this table is the evidence for the rule. */
static void bench_int8_gemm(bench_result &r, const dllm__arch &arch, cudaStream_t s) {
    std::shared_ptr<dllm__module> rowwise, soloq;
    BENCH_CHECK(dllm__jit_load(dllm__module_rowwise(arch), rowwise));
    BENCH_CHECK(dllm__jit_load(dllm__module_soloq(arch), soloq));
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    dllm__soloq_kernels Q;
    BENCH_CHECK(dllm__bind(Q, *soloq, optin, arch.cc));
    dllm__gemm lt;
    BENCH_CHECK(lt.init());
    uint64_t seed = 0x2545F4914F6CDD1Dull;
    auto random_bytes = [&](dllm__dbuf &buf, size_t n, int lo, int span) { bench_random_bytes(buf, n, lo, span, seed, "int8 bench"); };
    const bool fp8 = arch.fp8 == DLLM__FP8_CUBLASLT_BLOCK;
    struct { const char *name; int N, K; } shapes[] = {{"o", 4096, 4096}, {"qkv", 3 * 4096, 4096}, {"gate_up", 2 * 12288, 4096}, {"down", 4096, 12288}};
    for (const auto &sh : shapes)
        for (int M : {256, 1024}) {
            bench_gemm_shape g;
            g.M = M; g.N = sh.N; g.K = sh.K;
            bench_prepare(rowwise, g, fp8, s);
            const int chunk = dllm__q4_int8_chunk_rows(sh.N, sh.K), bf16_chunk = dllm__q4_chunk_rows(sh.N, sh.K);
            dllm__dbuf x8, w8, acc, codes, s_w, s_x, w_chunk;
            random_bytes(x8, (size_t)M * sh.K, 256 - 15, 31);  // int8 in [-15, 15], SoloQ-I's odd C values' range
            random_bytes(w8, (size_t)sh.N * sh.K, 256 - 15, 31);
            random_bytes(codes, (size_t)sh.N * sh.K / 2, 0, 256);
            BENCH_CHECK(acc.fit((size_t)M * sh.N * 4, "int8 bench"));
            BENCH_CHECK(w_chunk.fit((size_t)bf16_chunk * sh.K * 2, "int8 bench"));
            BENCH_CHECK(dllm__upload_f32(s_w, std::vector<float>((size_t)sh.N, 1e-3f), "int8 bench"));
            BENCH_CHECK(dllm__upload_f32(s_x, std::vector<float>((size_t)M, 1e-2f), "int8 bench"));
            const double flop = 2.0 * M * sh.N * sh.K;
            const std::string at = dllm__format("int8 %s M%d ", sh.name, M);
            auto row = [&](const char *what, double us) {
                r.set(at + what + " us", us);
                r.set(at + what + " TFLOPs", flop / us / 1e6);
            };
            row("cuBLASLt BF16", bench_us_each(s, 5, [&](int) { BENCH_CHECK(lt.run(g.x.ptr, g.w.ptr, g.y.ptr, M, sh.N, sh.K, CUDA_R_16BF, s)); }));
            if (fp8)
                row("cuBLASLt FP8", bench_us_each(s, 5, [&](int) {
                        BENCH_CHECK(lt.run_fp8(g.x8.ptr, g.xs.as<float>(), g.w8.ptr, g.ws.as<float>(), g.y.ptr, M, sh.N, sh.K, s));
                    }));
            row("cuBLASLt INT8", bench_us_each(s, 5, [&](int) { BENCH_CHECK(lt.run_i8(x8.ptr, w8.ptr, acc.ptr, M, sh.N, sh.K, s)); }));
            row("INT8 path", bench_us_each(s, 5, [&](int) {
                    BENCH_CHECK(dllm__q4_int8_gemm_run(Q, lt, DLLM__Q4_INT4, codes.ptr, s_w.as<float>(), x8.ptr, s_x.as<float>(), g.y.ptr, sh.N, CUDA_R_16BF, M,
                                                       sh.N, sh.K, chunk, w_chunk.ptr, acc.as<int>(), s));
                }));
            row("BF16 path", bench_us_each(s, 5, [&](int) {  // gemm_q4's path for more than 64 rows before the INT8 one
                    for (int n0 = 0; n0 < sh.N; n0 += bf16_chunk) {
                        const int nc = std::min(bf16_chunk, sh.N - n0);
                        BENCH_CHECK(Q.soloq_dequantize_rows.launch({dim3((unsigned)(sh.K / 8 + 127) / 128, (unsigned)nc), dim3(128)}, s,
                                                                   codes.as<unsigned char>() + (size_t)n0 * (sh.K / 2), nullptr, (int)DLLM__Q4_INT4, nc, sh.K,
                                                                   w_chunk.as<bf16_t>()));
                        BENCH_CHECK(lt.run(g.x.ptr, w_chunk.ptr, acc.ptr, M, nc, sh.K, CUDA_R_32F, s));
                        BENCH_CHECK(Q.soloq_scale_rows.launch({dim3((unsigned)(nc + 255) / 256, (unsigned)M), dim3(256)}, s, acc.as<float>(), M, nc,
                                                              s_x.as<float>(), s_w.as<float>() + n0, g.y.as<bf16_t>() + n0, 0, (u64)sh.N));
                    }
                }));
        }
    printf("\n| GEMM (LLaDA-8B) | M | cuBLASLt BF16 us (TFLOP/s) | cuBLASLt FP8 | cuBLASLt INT8 | INT8 path (4-bit weights) | x BF16 | BF16 path "
           "(today) | INT8 path x BF16 path |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const auto &sh : shapes)
        for (int M : {256, 1024}) {
            const std::string at = dllm__format("int8 %s M%d ", sh.name, M);
            auto cell = [&](const char *what) {
                const std::string k = at + what;
                return r.v.count(k + " us") ? dllm__format("%.1f (%.0f)", r.v[k + " us"], r.v[k + " TFLOPs"]) : std::string("-");
            };
            const double bf16 = r.v[at + "cuBLASLt BF16 us"], path = r.v[at + "INT8 path us"], old = r.v[at + "BF16 path us"];
            printf("| %s (N %d, K %d) | %d | %s | %s | %s | %s | %.2f | %s | %.2f |\n", sh.name, sh.N, sh.K, M, cell("cuBLASLt BF16").c_str(),
                   cell("cuBLASLt FP8").c_str(), cell("cuBLASLt INT8").c_str(), cell("INT8 path").c_str(), path / bf16, cell("BF16 path").c_str(), path / old);
        }
}

/* FLOPs of one LLaDA forward over n tokens with the LM head on lm_rows rows. */
static double bench_flops(const dllm__config &c, double n, double lm_rows) {
    const double d = c.n_embd, q = (double)c.n_head * c.head_dim, kv = (double)c.n_head_kv * c.head_dim, ff = c.n_ff;
    double per_token = c.n_layer * (d * (q + 2 * kv) + q * d + 2 * d * ff + ff * d);
    double attn = c.n_layer * 4.0 * n * n * q;
    return 2.0 * n * per_token + 2.0 * lm_rows * d * c.n_vocab + attn;
}

/* Median time of one plain forward over n tokens with the LM head on every row; leaves it prepared. */
static double bench_forward_ms(dllm__gpu_backend *gpu, int n) {
    std::vector<int32_t> ids((size_t)n);
    for (int i = 0; i < n; i++) ids[(size_t)i] = (i * 7919) % 100000;
    BENCH_CHECK(gpu->prepare_forward(ids.data(), n, n));
    auto nothing = [](int, int) { return DLLM_OK; };
    return bench_ms(gpu->stream(), 2, 5, [&] { BENCH_CHECK(gpu->forward_logits(n, 0, n, nothing)); });
}

/* Per-stage totals (ms) of one eager run of `forward` (the backend's marks between launches), as keys prefix + stage. */
template <class F>
static void bench_stages_of(bench_result &r, dllm__gpu_backend *gpu, const std::string &prefix, F &&forward) {
    dllm__stage_timer timer;
    gpu->set_timer(&timer);
    BENCH_CHECK(forward());
    cudaStreamSynchronize(gpu->stream());
    gpu->set_timer(nullptr);
    for (auto &stage : timer.totals()) r.set(prefix + stage.first + " ms", stage.second);
}

/* Per-stage totals of the forward bench_forward_ms(gpu, n) prepared, as "<prefix><stage> ms". */
static void bench_stages(bench_result &r, dllm__gpu_backend *gpu, int n, const std::string &prefix) {
    bench_stages_of(r, gpu, prefix, [&] { return gpu->forward_logits(n, 0, n, [](int, int) { return DLLM_OK; }); });
}

static std::map<std::string, double> bench_read_anchors(const char *json_path, const char *graphs_log) {
    std::map<std::string, double> a;
    if (json_path) {
        dllm__json j;
        if (dllm__json_load(json_path, j) == DLLM_OK)
            for (size_t i = 0; i < j.keys.size(); i++)
                if (j.items[i].kind == dllm__json::NUM) a[j.keys[i]] = j.items[i].number;
    }
    if (graphs_log) {
        std::string text;
        if (dllm__read_text(graphs_log, text) == DLLM_OK)
            for (size_t b = 0, e; b < text.size(); b = e + 1) {
                e = text.find('\n', b);
                if (e == std::string::npos) e = text.size();
                std::string line = text.substr(b, e - b);
                size_t sp = line.find(' ');
                if (sp != std::string::npos && line.compare(0, 6, "graph_") == 0) a[line.substr(0, sp)] = atof(line.c_str() + sp + 1);
            }
    }
    return a;
}

/* Where LaCache's time goes, at W1's geometry (prompt 768, block 32 at the generation's start): one
 * step profiled per mode, stage by stage, beside the saving predicted from FLOPs and bytes. */
static void bench_lacache_components(bench_result &r, dllm__gpu_backend *gpu, const dllm__config &c, int np, int gen, int block,
                                     double gemm_rate, double copy_tbps) {
    std::map<std::string, double> t[3];
    for (int mode = 0; mode < 3; mode++) {
        dllm__decode st;
        st.canvas.assign((size_t)np + gen, c.mask_id);
        for (int i = 0; i < np; i++) st.canvas[(size_t)i] = (i * 104729) % 100000;
        st.is_prompt.assign(st.canvas.size(), 0);
        std::fill(st.is_prompt.begin(), st.is_prompt.begin() + np, 1);
        st.n_prompt = np;
        st.mask_id = c.mask_id;
        st.lacache = mode;
        st.steps_per_block = block;
        st.block_begin = np;
        st.block_end = np + block;
        BENCH_CHECK(gpu->begin(st));
        BENCH_CHECK(gpu->begin_block(st));
        if (mode == DLLM_LACACHE_ON) {  // the FILL step, then a REUSE step is what repeats
            dllm__stage_timer fill;
            BENCH_CHECK(gpu->profile_step(st, fill));
            st.step_in_block = 1;
        }
        dllm__stage_timer timer;
        for (int rep = 0; rep < 3; rep++) BENCH_CHECK(gpu->profile_step(st, timer));
        cudaStreamSynchronize(gpu->stream());
        for (auto &kv : timer.totals()) t[mode][kv.first] = kv.second / 3;
    }
    auto saved = [&](int from, int to, std::initializer_list<const char *> stages) {
        double s = 0;
        for (const char *k : stages) s += t[from][k] - t[to][k];
        return s;
    };
    const double n = np + gen, u = n - block, d = c.n_embd, q = (double)c.n_head * c.head_dim, qkv = (double)(c.n_head + 2 * c.n_head_kv) * c.head_dim;
    const double bw = copy_tbps * 1e9, rate = gemm_rate * 1e9;  // bytes/ms, FLOP/ms
    const double br = 128, u_tiles = floor(np / br) / ceil(n / br), kv_u = floor(np / 32.0) / ceil(n / 32.0);
    struct { const char *name; double measured, predicted; } rows[] = {
        {"EmbedCache (embedding + layer-0 norm)", saved(1, 2, {"L0 embed+norm"}), u * d * (2 + 4 + 4 + 2) / bw},
        {"RoPECache (layer-0 QKV GEMM + RoPE)", saved(1, 2, {"L0 gemm qkv", "L0 rope"}), 2 * u * d * qkv / rate + u * qkv * 2 * 2 * 2.0 / 3 / bw},
        {"FACache (layer-0 attention tiles)", saved(1, 2, {"L0 attention"}), t[1]["L0 attention"] * u_tiles * kv_u},
        {"truncation (final norm, LM head, sampler)", saved(0, 1, {"add+norm", "lm head", "sampler"}),
         2 * u * d * c.n_vocab / rate + (u * d * 4 * 2 + u * d * 2) / bw + u * c.n_vocab * 4.0 * 3 / bw},
        {"truncation (last layer's queries, O, FFN)", saved(0, 1, {"attention", "gemm o", "gemm gate+up", "swiglu", "gemm down"}),
         2 * u * (d * q + 3 * d * c.n_ff + 2 * n * q) / rate},
    };
    printf("\n| LaCache component (one step, W1 geometry) | measured saving ms | predicted ms |\n|---|---|---|\n");
    for (auto &row : rows) {
        printf("| %s | %.3f | %s |\n", row.name, row.measured, row.predicted == row.predicted ? dllm__format("%.3f", row.predicted).c_str() : "-");
        r.v[std::string("saving ") + row.name] = row.measured;
    }
    double step[3] = {0, 0, 0};
    for (int m = 0; m < 3; m++)
        for (auto &kv : t[m]) step[m] += kv.second;
    printf("| step total: off / truncate / lacache | %.3f / %.3f / %.3f | |\n\n", step[0], step[1], step[2]);
    for (auto &kv : t[0]) r.set("W1 plain step stage " + kv.first + " ms", kv.second);
}

/* One untimed generation with gp's shapes (canvas, K/V cache, DPad view) but four steps a block, so that the timed
 * run finds their GEMMs tuned and their kernels loaded. */
static void bench_warm(dllm_ctx *ctx, const std::vector<int32_t> &prompt, dllm_gen_params gp, std::vector<int32_t> &out) {
    gp.unmask = DLLM_UNMASK_SCHEDULE;
    gp.steps = gp.gen_length / gp.block_length * 4;
    BENCH_CHECK(dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, out.data(), (int)out.size(), nullptr, nullptr));
}

/* W1 (prompt 768, gen 256, 256 steps, blocks of 32) through dllm_generate, warmed up first, with a K/V cache or none:
 * by default (one answer per prompt: a batch of one) and with tuned_forwards (its own forwards, LaCache's reuse).
 * Keys W1_<cache>_<path>_s. */
static void bench_w1_paths(bench_result &r, dllm_ctx *ctx) {
    std::vector<int32_t> prompt(768), out(256);
    for (int i = 0; i < 768; i++) prompt[(size_t)i] = (i * 104729) % 100000;
    for (dllm_kv_cache kv : {DLLM_KV_CACHE_DUAL, DLLM_KV_CACHE_NONE})
        for (int tuned = 0; tuned < 2; tuned++) {
            dllm_gen_params gp = dllm_gen_default_params();
            gp.gen_length = 256, gp.steps = 256, gp.block_length = 32, gp.stop_at_eos = 0, gp.kv_cache = kv;
            gp.tuned_forwards = tuned;
            bench_warm(ctx, prompt, gp, out);
            dllm_gen_stats st;
            BENCH_CHECK(dllm_generate(ctx, prompt.data(), 768, gp, out.data(), 256, nullptr, &st));
            r.set(dllm__format("W1_%s_%s_s", kv == DLLM_KV_CACHE_DUAL ? "dual" : "nocache", tuned ? "tuned" : "one_answer"),
                  st.wall_ms / 1000);
        }
}

/* One dual-cache block step (Fast-dLLM): 32 query rows over n cached keys, replayed as the decoding loop
 * replays it (a CUDA graph per block). The block's first step fills the cache and is not timed. */
static double bench_dual_block_step(bench_result &r, dllm__gpu_backend *gpu, const dllm__config &c, int n, int block) {
    dllm__decode st;
    const int np = n - block;
    st.canvas.assign((size_t)n, c.mask_id);
    for (int i = 0; i < np; i++) st.canvas[(size_t)i] = (i * 104729) % 100000;
    st.is_prompt.assign(st.canvas.size(), 0);
    std::fill(st.is_prompt.begin(), st.is_prompt.begin() + np, 1);
    st.n_prompt = np, st.mask_id = c.mask_id, st.lacache = DLLM_LACACHE_ON, st.kv_cache = DLLM_KV_CACHE_DUAL;
    st.steps_per_block = block, st.block_begin = np, st.block_end = n;
    BENCH_CHECK(gpu->begin(st));
    BENCH_CHECK(gpu->begin_block(st));
    std::vector<int32_t> committed;
    BENCH_CHECK(gpu->step(st, committed, false));  // the full forward that fills the cache
    st.step_in_block = 1;  // every later step has this shape: the first runs eagerly, then the graph replays
    const double ms = bench_ms(gpu->stream(), 3, 20, [&] { BENCH_CHECK(gpu->step(st, committed, false)); });
    // One replay between profiler marks: `ncu --profile-from-start off` then times each kernel of the graph.
    cudaProfilerStart();
    BENCH_CHECK(gpu->step(st, committed, false));
    cudaStreamSynchronize(gpu->stream());
    cudaProfilerStop();
    dllm__stage_timer timer;  // where the step's time goes (eager, so launch gaps show in the first stage after each)
    BENCH_CHECK(gpu->profile_step(st, timer));
    cudaStreamSynchronize(gpu->stream());
    for (auto &stage : timer.totals()) r.set("dual step stage " + stage.first + " ms", stage.second);
    return ms;
}

/* The attention kernel alone at the LLaDA-8B shape (32 heads, head dim 128, random Q/K/V): a full forward's
 * 1024 x 1024, and a dual-cache block step's 32 queries over 1024 keys with the split-KV the backend picks.
 * The tile comes from the architecture table or DLLM_TILES (fa_br, fa_bc, fa_mt). */
static void bench_attention(bench_result &r, const dllm__arch &arch, int n_sms, cudaStream_t s) {
    const int H = 32, hd = 128, n = 1024, stride = 3 * H * hd;
    std::shared_ptr<dllm__module> mod, rowwise;
    BENCH_CHECK(dllm__jit_load(dllm__module_attention(arch, hd), mod));
    BENCH_CHECK(dllm__jit_load(dllm__module_rowwise(arch), rowwise));
    dllm__attn_kernels k;
    BENCH_CHECK(dllm__attn_kernels_of(*mod, arch, hd, k));
    dllm__dbuf qkv, out, partial;
    BENCH_CHECK(qkv.fit((size_t)n * stride * 2, "attention"));
    BENCH_CHECK(out.fit((size_t)n * H * hd * 2, "attention"));
    BENCH_CHECK(partial.fit(dllm__attn_partial_bound(arch, hd, n_sms), "attention"));
    bench_fill(rowwise, qkv, (uint64_t)n * stride, s);
    const std::string tile = dllm__format("attention %dx%d mt%d ", arch.fa_br, arch.fa_bc, arch.fa_mt);
    for (int q_rows : {n, 32}) {
        const int splits = q_rows == n ? 1 : dllm__attn_kv_splits(arch, q_rows, n, H, n_sms);
        const bf16_t *q = qkv.as<bf16_t>() + (size_t)(n - q_rows) * stride;
        attn_args a = {q, qkv.as<bf16_t>() + (size_t)H * hd, qkv.as<bf16_t>() + (size_t)2 * H * hd, out.as<bf16_t>(), nullptr, n, q_rows, stride, stride,
                       H * hd, 1, (uint64_t)n * stride, (uint64_t)q_rows * H * hd, nullptr, 1.4426950408889634f / sqrtf((float)hd), 0, nullptr, splits,
                       partial.as<float>(), 0, 0, nullptr, nullptr, nullptr, nullptr, nullptr};
        double ms = bench_ms(s, 3, 20, [&] { BENCH_CHECK(dllm__attn_launch(k, arch, hd, H, 1, a, s)); });
        r.set(tile + dllm__format("%d over %d (%d shares) us", q_rows, n, splits), ms * 1000);
        if (q_rows == n) r.set(tile + "1024 over 1024 TFLOPs", 4.0 * n * n * hd * H / ms / 1e9);
        if (q_rows == n && k.wide.fn) {  // what layers >= 1 of a plain forward run (10 back to back: launch gaps amortised)
            const double us = bench_us_each(s, 20, [&](int) { BENCH_CHECK(dllm__attn_launch(k, arch, hd, H, 1, a, s, true)); });
            const std::string wide = dllm__format("attention wgmma 128x%d ", arch.fa_wg_bc);
            r.set(wide + "1024 over 1024 us", us);
            r.set(wide + "1024 over 1024 TFLOPs", 4.0 * n * n * hd * H / us / 1e6);
        }
    }
}

/* The memory-bound row-wise kernels alone at the LLaDA-8B shape, launched as the backend launches them, 10 back to
 * back over 4 sets of buffers (more than L2 holds at 1024 rows, as a forward streams them): residual add + RMSNorm
 * (d 4096, in place), RoPE on Q and K (32 + 32 heads of 128), SwiGLU (f 12288). TB/s = bytes moved / time. */
static void bench_rowwise(bench_result &r, const dllm__arch &arch, cudaStream_t s) {
    const int d = 4096, H = 32, hd = 128, qkv = 3 * H * hd, f = 12288, sets = 4;
    std::shared_ptr<dllm__module> mod;
    BENCH_CHECK(dllm__jit_load(dllm__module_rowwise(arch), mod));
    std::vector<float> cos_t, sin_t;
    dllm__rope_tables(1e6f, hd, 1024, cos_t, sin_t);
    dllm__dbuf cs, sn, w, h[sets], delta[sets], y[sets], x[sets], gu[sets], out[sets];
    BENCH_CHECK(cs.fit(cos_t.size() * 4, "rowwise"));
    BENCH_CHECK(sn.fit(sin_t.size() * 4, "rowwise"));
    cudaMemcpy(cs.ptr, cos_t.data(), cos_t.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(sn.ptr, sin_t.data(), sin_t.size() * 4, cudaMemcpyHostToDevice);
    BENCH_CHECK(w.fit((size_t)d * 4, "rowwise"));
    bench_fill(mod, w, (uint64_t)d * 2, s);
    const int n_max = 1024;
    for (int i = 0; i < sets; i++) {
        BENCH_CHECK(h[i].fit((size_t)n_max * d * 4, "rowwise"));
        BENCH_CHECK(delta[i].fit((size_t)n_max * d * 2, "rowwise"));
        BENCH_CHECK(y[i].fit((size_t)n_max * d * 2, "rowwise"));
        BENCH_CHECK(x[i].fit((size_t)n_max * qkv * 2, "rowwise"));
        BENCH_CHECK(gu[i].fit((size_t)n_max * 2 * f * 2, "rowwise"));
        BENCH_CHECK(out[i].fit((size_t)n_max * f * 2, "rowwise"));
        bench_fill(mod, h[i], (uint64_t)n_max * d * 2, s);
        bench_fill(mod, delta[i], (uint64_t)n_max * d, s);
        bench_fill(mod, x[i], (uint64_t)n_max * qkv, s);
        bench_fill(mod, gu[i], (uint64_t)n_max * 2 * f, s);
    }
    for (int n : {n_max, 32}) {
        auto time10 = [&](auto &&launch) { return bench_us_each(s, 10, [&](int i) { launch(i % sets); }); };  // over the buffer sets
        const dllm__rowwise_kernels k = bench_rowwise_kernels(mod);
        const float eps = 1e-5f;
        double us = time10([&](int i) {
            BENCH_CHECK(k.add_rmsnorm.launch({dim3(n, 1), dim3(dllm__norm_threads(d / 8))}, s, h[i].ptr, h[i].ptr, delta[i].ptr, w.ptr, eps, y[i].ptr, d, n,
                                             0, n));
        });
        r.set(dllm__format("add+rmsnorm %d rows us", n), us);
        r.set(dllm__format("add+rmsnorm %d rows TB/s", n), (double)n * d * (4 + 2 + 4 + 2) / us / 1e6);
        us = time10([&](int i) {
            BENCH_CHECK(k.rope_qkv.launch({dllm__rows_grid(n, 2 * H * hd / 8, 256), dim3(256)}, s, x[i].ptr, n, n, 0, nullptr, H, H, hd, nullptr, cs.ptr,
                                          sn.ptr));
        });
        r.set(dllm__format("rope %d rows us", n), us);
        r.set(dllm__format("rope %d rows TB/s", n), (double)n * 2 * H * hd * 2 * 2 / us / 1e6);
        us = time10([&](int i) {
            BENCH_CHECK(k.swiglu.launch({dllm__rows_grid(n, f / 8, 256), dim3(256)}, s, gu[i].ptr, out[i].ptr, n, f));
        });
        r.set(dllm__format("swiglu %d rows us", n), us);
        r.set(dllm__format("swiglu %d rows TB/s", n), (double)n * 3 * f * 2 / us / 1e6);
    }
}

/* The GPU context every benchmark of the LLaDA-8B shape uses (canvases up to 2048 tokens). */
static dllm_ctx_params bench_gpu_params() {
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_GPU;
    cp.max_tokens = 2048;
    return cp;
}

/* [bd graphs] (bd_graphs, the default) The block step and the sub-block step of bench_block_diffusion, and the block step with
 * the device's token choice (bd_forward_choose, as generation runs it: no logits to the host), eagerly (no_graphs on)
 * and replayed as graphs; the replayed choice step against the anchor's CUDA-graph step (8.0 ms when measured; the
 * target: at most 0.60x). Returns the replayed block step's time. */
static double bench_block_diffusion_graphs(bench_result &r, dllm__gpu_backend *gpu, const dllm__bd_call &step, const dllm__bd_call &sub,
                                           std::vector<float> &logits, int mask_id) {
    dllm__bd_pick pick;  // the step's sub-block (rows S..2S of the block), scored by output rows S-1.. (shifted)
    pick.sampling.eos_logit_inf = true, pick.sampling.eos_id = mask_id;
    pick.pos0 = 0, pick.n = step.r1 - step.r0, pick.shift0 = 0, pick.lrow0 = 0;
    std::vector<dllm__choice> ch((size_t)pick.n);
    dllm__env_set("bd_graphs", "1");
    double ms[2][3];  // [graphs][block step, sub-block step, block step with the device's choice]
    for (int graphs = 0; graphs < 2; graphs++) {
        dllm__env_set("no_graphs", graphs ? "0" : "1");
        ms[graphs][0] = bench_ms(gpu->stream(), 3, 20, [&] { BENCH_CHECK(gpu->bd_forward(step, logits.data())); });
        ms[graphs][1] = bench_ms(gpu->stream(), 3, 20, [&] { BENCH_CHECK(gpu->bd_forward(sub, logits.data())); });
        ms[graphs][2] = bench_ms(gpu->stream(), 3, 20, [&] { BENCH_CHECK(gpu->bd_forward_choose(step, pick, ch.data())); });
    }
    dllm__env_set("no_graphs", "0");
    dllm__env_set("bd_graphs", "0");
    for (int graphs = 0; graphs < 2; graphs++) {
        const char *how = graphs ? "graph" : "eager";
        r.set(dllm__format("bd_block32_N1024_step_%s_ms", how), ms[graphs][0]);
        r.set(dllm__format("bd_subblock8_N1024_step_%s_ms", how), ms[graphs][1]);
        r.set(dllm__format("bd_block32_N1024_choose_%s_ms", how), ms[graphs][2]);
    }
    r.set("bd_block32_N1024_choose_graph_over_anchor_graph_8.0ms", ms[1][2] / 8.0);
    r.set("bd_graphs_replayed", (double)gpu->bd_graph_count(DLLM__GRAPH_REPLAY));
    r.set("bd_graph_updates_refused", (double)gpu->bd_graph_refusals());
    return ms[1][0];
}

/* [KV quant] kvq_flash's plan (one CTA an SM: 33 splits of 1024 keys at the 7B shape on 132 SMs, 14 warps) against
 * smaller splits and half the warps (each key then decoded once per row tile). On the H100 and the H200 every variant
 * was slower than the default (172 us; a 2x target needs <= 146 us). time(plan, its split states). */
template <class F>
static void bench_kvq_tc_plans(bench_result &r, const dllm__kvq_tc_kernels &tc, const dllm__kvq_tc_plan &base, int hd, int n_head, int n_kv, int rows,
                               int n_keys, int n_committed, double bf16_us, F &&time) {
    const int group_rows = n_head / n_kv * rows;  // a CTA's query rows: the GQA group's
    for (int warps : {base.warps, (base.warps + 1) / 2})
        for (int divide : {1, 2, 4}) {
            if (warps == base.warps && divide == 1) continue;  // the default plan's row
            dllm__kvq_tc_plan p;
            dllm__kvq_tc_set_warps(p, hd, group_rows, warps);
            dllm__kvq_tc_set_splits(p, std::max(2 * dllm__kvq_tc_bc(hd), base.split_keys / divide), n_keys, n_committed, 0);
            if (p.smem > (size_t)tc.smem_optin) continue;
            dllm__dbuf part;
            BENCH_CHECK(part.fit(dllm__kvq_tc_partial_bytes(p, n_head, rows, hd), "kv4 attention plans"));
            const double us = time(p, part);
            r.set(dllm__format("kv_attention_32k_kv4_kivi_tc_us (%d warps x %d row tiles, %d splits of %d keys)", p.warps, p.q_tiles, p.n_splits, p.split_keys), us);
            r.set(dllm__format("kv_attention_32k_kv4_kivi_tc_speedup_over_bf16 (%d warps, %d keys a split)", p.warps, p.split_keys), bf16_us / us);
        }
}

/* [KV quant] The long-context row: one layer's attention of a 32-row block step over a 32k-token committed cache
 * at the Fast-dLLM v2 7B shape (28 query heads, 4 K/V heads of 128), the BF16 cache through flash_attn (split-KV, as
 * bd_attention launches it) against the 4-bit caches through kvq_attention (KIVI values, and SoloQ's rotated Lloyd-Max
 * values), each kernel alone, back to back over 4 layers' caches (as a forward reads them: 4 BF16 caches are 268 MB, 4
 * KV4 caches 69 MB, both past the 50 MB L2). Codes and their scales are zeros (the kernels' time does not depend on them:
 * no branch on a code's value); queries and BF16 rows random. Target: the KV4 attention at least 2x faster. The
 * tensor-core kernels of kvq_tc on (kvq_flash + kvq_flash_combine, the plan bd_attention's launch takes) run on the
 * same caches: the kv_attention_32k_kv4_*_tc rows. */
static void bench_kv4_attention_32k(bench_result &r, const dllm__arch &arch, int n_sms, cudaStream_t s) {
    const int H = 28, n_kv = 4, hd = 128, kvd = n_kv * hd, qkv = (H + 2 * n_kv) * hd, T = 32, n = 32768, n_keys = n + T, layers = 4;
    std::shared_ptr<dllm__module> attn_mod, rowwise, kvq_mod;
    BENCH_CHECK(dllm__jit_load(dllm__module_attention(arch, hd), attn_mod));
    BENCH_CHECK(dllm__jit_load(dllm__module_rowwise(arch), rowwise));
    BENCH_CHECK(dllm__jit_load(dllm__module_kvq(arch), kvq_mod));
    dllm__attn_kernels k;
    BENCH_CHECK(dllm__attn_kernels_of(*attn_mod, arch, hd, k));
    dllm__kernel<void(kvq_args)> kvq_attention;
    kvq_attention.fn = kvq_mod->kernels.at("kvq_attention"), kvq_attention.name = "kvq_attention";
    dllm__dbuf q, cache, out, partial, k_codes, v_codes, k_pairs, v_side;
    BENCH_CHECK(q.fit((size_t)T * qkv * 2, "kv4 attention"));
    const size_t cache_elems = (size_t)n_keys * 2 * kvd, codes = (size_t)n_keys * kvd / 2;
    BENCH_CHECK(cache.fit(layers * cache_elems * 2, "kv4 attention"));
    BENCH_CHECK(out.fit((size_t)T * H * hd * 2, "kv4 attention"));
    BENCH_CHECK(partial.fit(dllm__attn_partial_bound(arch, hd, n_sms), "kv4 attention"));
    BENCH_CHECK(k_codes.fit(layers * codes, "kv4 attention"));
    BENCH_CHECK(v_codes.fit(layers * codes, "kv4 attention"));
    BENCH_CHECK(k_pairs.fit((size_t)layers * (n_keys / T + 1) * kvd * 4, "kv4 attention"));
    BENCH_CHECK(v_side.fit((size_t)layers * n_keys * n_kv * 4, "kv4 attention"));
    for (dllm__dbuf *b : {&k_codes, &v_codes, &k_pairs, &v_side}) cudaMemsetAsync(b->ptr, 0, b->bytes, s);
    bench_fill(rowwise, q, (uint64_t)T * qkv, s);
    bench_fill(rowwise, cache, (uint64_t)layers * cache_elems, s);
    attn_args a = {};
    a.q = q.as<bf16_t>(), a.k = cache.as<bf16_t>(), a.v = cache.as<bf16_t>() + kvd, a.o = out.as<bf16_t>();
    a.seq = n_keys, a.q_rows = T, a.q_stride = qkv, a.kv_stride = 2 * kvd, a.o_stride = H * hd, a.group = H / n_kv;
    a.q_bstride = (u64)T * qkv, a.o_bstride = (u64)T * H * hd, a.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    a.kv_splits = dllm__attn_kv_splits(arch, T, n_keys, H, n_sms), a.partial = partial.as<float>(), a.mask_block = T, a.q_index0 = n;
    const double bf16_us = bench_us_each(s, 20, [&](int i) {
        attn_args al = a;
        al.k += (i % layers) * cache_elems, al.v += (i % layers) * cache_elems;
        BENCH_CHECK(dllm__attn_launch(k, arch, hd, H, 1, al, s));
    });
    r.set(dllm__format("kv_attention_32k_bf16_us (%d splits)", a.kv_splits), bf16_us);
    int device = 0, smem_optin = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    dllm__kvq_tc_kernels tc;
    BENCH_CHECK(dllm__kvq_tc_load(arch, hd, smem_optin, tc));
    dllm__kvq_tc_plan plan;
    BENCH_CHECK(dllm__kvq_tc_plan_for(hd, H, n_kv, T, n_keys, n, 0, n_sms, smem_optin, plan));
    dllm__dbuf tc_partial;
    const size_t tc_bytes = dllm__kvq_tc_partial_bytes(plan, H, T, hd);
    BENCH_CHECK(tc_partial.fit(tc_bytes, "kv4 attention"));
    const dllm__rotation rot = dllm__make_rotation(DLLM__ROT_KRPBH, hd, dllm__soloq_options().seed, 0);
    dllm__rotation_dev rd;
    BENCH_CHECK(dllm__rotation_upload(rot, rd));
    for (int soloq = 0; soloq < 2; soloq++) {
        kvq_args b = {};
        b.sinks = cache.as<bf16_t>(), b.fresh = cache.as<bf16_t>() + (size_t)n * 2 * kvd, b.k_codes = k_codes.as<unsigned char>(), b.v_codes = v_codes.as<unsigned char>();
        b.k_pairs = k_pairs.as<unsigned short>();
        b.v_pairs = soloq ? nullptr : v_side.as<unsigned short>();
        b.v_scale = soloq ? v_side.as<float>() : nullptr;
        if (soloq) b.perm = rd.perm.as<int>(), b.signs = (const unsigned char *)rd.signs.ptr, b.mixer = rd.mixer.as<float>();
        b.rot_b = rd.b, b.rot_k = rd.k, b.rot_norm = rd.norm;
        b.n_kv = n_kv, b.hd = hd, b.bits = 4, b.soloq = soloq, b.n_sink = 0, b.group = T;
        b.q = q.as<bf16_t>(), b.o = out.as<bf16_t>(), b.q_stride = qkv, b.o_stride = H * hd, b.n_head = H;
        b.n_keys = n_keys, b.n_committed = n, b.mask_block = T, b.q_index0 = n, b.scale = 1.0f / sqrtf((float)hd), b.q_rows = T;
        auto layer_args = [&](int i) {
            kvq_args bl = b;
            const size_t l = (size_t)(i % layers);
            bl.sinks += l * cache_elems, bl.fresh += l * cache_elems, bl.k_codes += l * codes, bl.v_codes += l * codes, bl.k_pairs += l * (n_keys / T + 1) * kvd * 2;
            if (soloq) bl.v_scale += l * n_keys * n_kv;
            else bl.v_pairs += l * n_keys * n_kv * 2;
            return bl;
        };
        const double us = bench_us_each(s, 20, [&](int i) { BENCH_CHECK(kvq_attention.launch({dim3((unsigned)T, (unsigned)H), dim3(32)}, s, layer_args(i))); });
        const double tc_us = bench_us_each(s, 20, [&](int i) { BENCH_CHECK(dllm__kvq_tc_launch(tc, layer_args(i), plan, tc_partial.as<float>(), tc_bytes, s)); });
        const char *name = soloq ? "soloq" : "kivi";
        r.set(dllm__format("kv_attention_32k_kv4_%s_us", name), us);
        r.set(dllm__format("kv_attention_32k_kv4_%s_speedup_over_bf16 (target >= 2)", name), bf16_us / us);
        r.set(dllm__format("kv_attention_32k_kv4_%s_tc_us (%d warps, %d splits of %d keys)", name, plan.warps, plan.n_splits, plan.split_keys), tc_us);
        r.set(dllm__format("kv_attention_32k_kv4_%s_tc_speedup_over_bf16 (target >= 2)", name), bf16_us / tc_us);
        if (!soloq) bench_kvq_tc_plans(r, tc, plan, hd, H, n_kv, T, n_keys, n, bf16_us, [&](const dllm__kvq_tc_plan &p, dllm__dbuf &part) {
            return bench_us_each(s, 20, [&](int i) { BENCH_CHECK(dllm__kvq_tc_launch(tc, layer_args(i), p, part.as<float>(), part.bytes, s)); });
        });
    }
}

/* [batch] [block diffusion] Fast-dLLM v2 batched (the batched block-diffusion forward) as the
 * anchor's v2_gen_b16 runs it: B prompts of 512 tokens, gen 256, threshold 0.9, through dllm_generate_batch at B = 1 and
 * 16 after a one-block warm-up; generated tokens/s, and batch 16 against the anchor's 585 tokens/s (when measured; target
 * at least 2.1x). The batch's forwards are reported too: the rounds of one batched forward. */
static void bench_bd_batch(bench_result &r, dllm_ctx *ctx, const std::vector<int32_t> &ids, dllm_gen_params gp) {
    const int np = 512, gen = 256;
    for (int B : {1, 16}) {
        std::vector<std::vector<int32_t>> prompts((size_t)B), outs((size_t)B, std::vector<int32_t>((size_t)gen + 1));
        std::vector<dllm_batch_item> items((size_t)B);
        std::vector<dllm_batch_result> results((size_t)B);
        for (int b = 0; b < B; b++) prompts[(size_t)b].assign(ids.begin() + b, ids.begin() + b + np);  // distinct prompts
        auto run = [&](int gen_length) {
            gp.gen_length = gen_length;
            for (int b = 0; b < B; b++) items[(size_t)b] = {prompts[(size_t)b].data(), np, gp, outs[(size_t)b].data(), gen + 1};
            dllm_gen_stats batch = {};
            const double t0 = dllm__now_ms();
            BENCH_CHECK(dllm_generate_batch(ctx, items.data(), B, results.data(), &batch));
            int tokens = 0;
            for (const dllm_batch_result &res : results) {
                if (res.status != DLLM_OK) {
                    fprintf(stderr, "dllm-bench: batch %d block-diffusion item failed: %s\n", B, res.error);
                    exit(1);
                }
                tokens += res.n_out;
            }
            const double sec = (dllm__now_ms() - t0) / 1000;
            return std::make_pair(sec, std::make_pair(tokens, batch.forwards));
        };
        run(32);  // warm-up: one block
        const auto res = run(gen);
        r.set(dllm__format("bd_gen_p512_g256_b%d_s", B), res.first);
        r.set(dllm__format("bd_gen_p512_g256_b%d_tokens_per_s", B), res.second.first / res.first);
        r.set(dllm__format("bd_gen_p512_g256_b%d_batched_forwards", B), res.second.second);
    }
    r.set("bd_gen_p512_g256_b16_over_anchor_585_tokens_per_s (target >= 2.1)", r.v["bd_gen_p512_g256_b16_tokens_per_s"] / 585.0);
}

/* Random weights of the Fast-dLLM v2 7B shape: its config and its tokenizer's added tokens (which name the mask id) from
 * tests/data/real-configs, written to a temporary directory for dllm_model_load_random. */
static dllm_model *bench_fast_dllm_v2_model() {
    std::string dir = dllm__format("/tmp/dllm-bench-bd-%d", (int)getpid()), text;
    mkdir(dir.c_str(), 0700);
    const char *files[2][2] = {{"tests/data/real-configs/fast-dllm-v2-7b.config.json", "config.json"},
                               {"tests/data/real-configs/fast-dllm-v2-7b.added_tokens.json", "added_tokens.json"}};
    for (auto &f : files) {
        BENCH_CHECK(dllm__read_text(f[0], text));
        FILE *out = fopen((dir + "/" + f[1]).c_str(), "wb");
        if (!out || fwrite(text.data(), 1, text.size(), out) != text.size() || fclose(out) != 0) {
            fprintf(stderr, "dllm-bench: cannot write %s\n", dir.c_str());
            exit(1);
        }
    }
    dllm_model *model = nullptr;
    BENCH_CHECK(dllm_model_load_random(dir.c_str(), 1, &model));
    for (auto &f : files) unlink((dir + "/" + f[1]).c_str());
    rmdir(dir.c_str());
    return model;
}

/* Block diffusion at the real Fast-dLLM v2 7B shape (random weights generated on the GPU; the config and the tokenizer's
 * added tokens from tests/data/real-configs): the 1024-token prompt prefilled into the committed cache, then one block
 * step without the block cache (the 32-row block against the cache, logits of one 8-row sub-block copied to the host, as
 * the decoding loop runs it) and one with it (the 8-row sub-block against cache ++ block cache), against the weight-read
 * floor (the weights a step reads, the embedding table aside, at the measured copy rate) when that rate was measured;
 * then a generation as torch_reference_v2.py times it (prompt 512, gen 256, threshold 0.9). */
static void bench_block_diffusion(bench_result &r) {
    dllm_model *model = bench_fast_dllm_v2_model();
    const int64_t before = dllm__device_bytes;
    dllm_ctx *ctx = nullptr;
    BENCH_CHECK(dllm_ctx_create(model, bench_gpu_params(), &ctx));
    const double weights_gb = (dllm__device_bytes - before) / 1e9;
    dllm__gpu_backend *gpu = (dllm__gpu_backend *)ctx->impl.get();
    const dllm__config &c = model->cfg;
    const int n = 1024, B = 32, S = 8;
    dllm__env_set("bd_graphs", "0");  // the rows without a graph suffix run eagerly; [bd graphs] sets it where it times graphs
    std::vector<int32_t> ids((size_t)(n + B));
    for (int i = 0; i < n + B; i++) ids[(size_t)i] = i < n + 1 ? (i * 104729) % 150000 : c.mask_id;  // the block: the AR seed, then masks
    std::vector<float> logits((size_t)n * c.n_vocab);
    auto call = [&](dllm__bd_kind kind, int start, int T, int offset, int mask_block, int r0, int r1) {
        dllm__bd_call k;
        k.kind = kind, k.ids = ids.data() + start, k.T = T, k.offset = offset, k.mask_block = mask_block, k.r0 = r0, k.r1 = r1;
        return k;
    };
    BENCH_CHECK(gpu->bd_begin(n + 2 * B));
    const dllm__bd_call prefill = call(DLLM__BD_COMMIT, 0, n, 0, B, n - 1, n);
    const double prefill_ms = bench_ms(gpu->stream(), 0, 1, [&] { BENCH_CHECK(gpu->bd_forward(prefill, logits.data())); });
    const dllm__bd_call step = call(DLLM__BD_STEP, n, B, 0, B, S - 1, 2 * S - 1), full = call(DLLM__BD_BLOCK_FULL, n, B, 0, B, S - 1, 2 * S - 1),
                        sub = call(DLLM__BD_SUB_BLOCK, n + S, S, S, 0, 0, S);
    const double step_ms = bench_ms(gpu->stream(), 3, 20, [&] { BENCH_CHECK(gpu->bd_forward(step, logits.data())); });
    BENCH_CHECK(gpu->bd_forward(full, logits.data()));
    const double sub_ms = bench_ms(gpu->stream(), 3, 20, [&] { BENCH_CHECK(gpu->bd_forward(sub, logits.data())); });
    r.set("bd_prefill_N1024_first_ms", prefill_ms);  // once, cold: GEMM tuning included
    r.set("bd_block32_N1024_step_ms", step_ms);
    r.set("bd_subblock8_N1024_step_ms", sub_ms);
    const double graph_ms = bench_block_diffusion_graphs(r, gpu, step, sub, logits, c.mask_id);
    // End to end as the anchor runs it: prompt 512, gen 256, threshold 0.9 (random weights: one token a step, 257 forwards).
    std::vector<int32_t> prompt(ids.begin(), ids.begin() + 512), out(257);
    dllm_gen_params gp = dllm_gen_default_params();
    gp.block_length = B, gp.unmask = DLLM_UNMASK_THRESHOLD, gp.threshold = 0.9, gp.stop_at_eos = 0;
    gp.gen_length = B;  // warm-up: one block
    BENCH_CHECK(dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, out.data(), (int)out.size(), nullptr, nullptr));
    gp.gen_length = 256;
    dllm_gen_stats st;
    BENCH_CHECK(dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, out.data(), (int)out.size(), nullptr, &st));
    r.set("bd_gen_p512_g256_s", st.wall_ms / 1000);
    r.set("bd_gen_p512_g256_forwards", st.forwards);
    dllm__env_set("bd_graphs", "1");  // [bd graphs] the same generation with the step forwards replayed as graphs
    BENCH_CHECK(dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, out.data(), (int)out.size(), nullptr, &st));
    r.set("bd_gen_p512_g256_graph_s", st.wall_ms / 1000);
    r.set("bd_gen_graph_updates_refused", (double)gpu->bd_graph_refusals());
    dllm__env_reload();  // the default (graphs) from here
    gp.tuned_forwards = 1;  // dllm_generate's own forwards: GEMMs tuned per row count, LaCache's reuse, graphs
    BENCH_CHECK(dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, out.data(), (int)out.size(), nullptr, &st));
    r.set("bd_gen_p512_g256_tuned_s", st.wall_ms / 1000);
    gp.tuned_forwards = 0;
    bench_bd_batch(r, ctx, ids, gp);
    if (r.v.count("copy_TBps")) {
        const double floor_ms = (weights_gb - (double)c.n_vocab * c.n_embd * 2 / 1e9) / r.v["copy_TBps"];
        r.set("bd_block32_N1024_weight_read_floor_ms", floor_ms);
        r.set("bd_block32_N1024_over_floor", step_ms / floor_ms);
        r.set("bd_block32_N1024_graph_over_floor", graph_ms / floor_ms);
    }
    dllm_ctx_free(ctx);
    dllm_model_free(model);
}

// ---------------------------------------------------------------------------------------------------
// [MoE] LLaDA2.0-mini: the block step against the read floor of the weights it touches
// ---------------------------------------------------------------------------------------------------

/* Random weights of the LLaDA2.0-mini shape (tests/data/real-configs/llada2-mini.dfactory.config.json, dFactory's copy
 * of the real config; its model_type "llada2_moe_veomni" is the training code's name for llada2_moe) or, flash, of
 * LLaDA2.0-flash's (the same config with flash's widths and depth, ../shared/spec/llada2.md's table). */
static dllm_model *bench_llada2_model(bool flash) {
    std::string dir = dllm__format("/tmp/dllm-bench-llada2-%d", (int)getpid()), text;
    mkdir(dir.c_str(), 0700);
    BENCH_CHECK(dllm__read_text("tests/data/real-configs/llada2-mini.dfactory.config.json", text));
    std::vector<std::pair<std::string, std::string>> edits = {{"llada2_moe_veomni", "llada2_moe"}};
    if (flash)
        edits.insert(edits.end(), {{"\"num_hidden_layers\": 20", "\"num_hidden_layers\": 32"},
                                   {"\"hidden_size\": 2048", "\"hidden_size\": 4096"},
                                   {"\"intermediate_size\": 5120", "\"intermediate_size\": 9216"},
                                   {"\"moe_intermediate_size\": 512", "\"moe_intermediate_size\": 1024"},
                                   {"\"num_attention_heads\": 16", "\"num_attention_heads\": 32"}});
    for (const auto &e : edits) {
        const size_t at = text.find(e.first);
        if (at == std::string::npos) {
            fprintf(stderr, "dllm-bench: the LLaDA2 config lacks %s\n", e.first.c_str());
            exit(1);
        }
        text.replace(at, e.first.size(), e.second);
    }
    const std::string path = dir + "/config.json";
    FILE *out = fopen(path.c_str(), "wb");
    if (!out || fwrite(text.data(), 1, text.size(), out) != text.size() || fclose(out) != 0) {
        fprintf(stderr, "dllm-bench: cannot write %s\n", path.c_str());
        exit(1);
    }
    dllm_model *model = nullptr;
    BENCH_CHECK(dllm_model_load_random(dir.c_str(), 1, &model));
    unlink(path.c_str());
    rmdir(dir.c_str());
    return model;
}

/* Bytes a GEMM reads of a device linear in its format: codes or values, scales, NVFP4's block scales. */
static double bench_linear_bytes(const dllm__linear &W) {
    return (double)W.data.bytes + (double)W.scale.bytes + (W.q4 ? (double)W.q4->block_scales.bytes : 0.0);
}

/* [batch] B items of gp, each its own prompt of np ids below id_end (a fixed pseudo-random walk) and its own output
 * of gp.gen_length ids; prompts and outs hold their storage. */
static std::vector<dllm_batch_item> bench_batch_items(int B, int np, int id_end, const dllm_gen_params &gp,
                                                      std::vector<std::vector<int32_t>> &prompts,
                                                      std::vector<std::vector<int32_t>> &outs) {
    const int gen = gp.gen_length;
    prompts.assign((size_t)B, {}), outs.assign((size_t)B, std::vector<int32_t>((size_t)gen));
    std::vector<dllm_batch_item> items((size_t)B);
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < np; i++) prompts[(size_t)b].push_back((i * 104729 + b * 7919) % id_end);
        items[(size_t)b] = {prompts[(size_t)b].data(), np, gp, outs[(size_t)b].data(), gen};
    }
    return items;
}

/* [batch] The wall time of one dllm_generate_batch over items, in s; a failed item ends the run with its message. */
static double bench_generate_batch_s(dllm_ctx *ctx, std::vector<dllm_batch_item> &items, const char *what) {
    std::vector<dllm_batch_result> results(items.size());
    const double t0 = dllm__now_ms();
    BENCH_CHECK(dllm_generate_batch(ctx, items.data(), (int)items.size(), results.data(), nullptr));
    for (const dllm_batch_result &res : results)
        if (res.status != DLLM_OK) {
            fprintf(stderr, "dllm-bench: %s batch %zu item failed: %s\n", what, items.size(), res.error);
            exit(1);
        }
    return (dllm__now_ms() - t0) / 1000;
}

/* [batch] LLaDA2 end to end through dllm_generate_batch at batch 1 and 16: prompts of 512 ids (each its own), gen 128,
 * blocks of 32 in 32 forwards each (the 2.0 loop; random weights are never confident, so a forward commits one token),
 * greedy; generated tokens/s of the batch over its wall time (each size warmed up once), and batch 16's over batch 1's
 * (the issue's target: at least 6x). Keys <k>batch<B>_tokens_per_s. */
static void bench_llada2_batch(bench_result &r, dllm_ctx *ctx, const std::string &k) {
    const int np = 512, gen = 128;
    dllm_gen_params gp = dllm_gen_default_params();
    gp.gen_length = gen, gp.block_length = 32, gp.steps = 32, gp.stop_at_eos = 0;
    for (int B : {1, 16}) {
        std::vector<std::vector<int32_t>> prompts, outs;
        std::vector<dllm_batch_item> items = bench_batch_items(B, np, 150000, gp, prompts, outs);
        bench_generate_batch_s(ctx, items, "LLaDA2");  // warm-up
        r.set(k + dllm__format("batch%d_gen128_tokens_per_s", B), B * gen / bench_generate_batch_s(ctx, items, "LLaDA2"));
    }
    r.set(k + "batch16_over_batch1 (target >= 6)",
          r.v[k + "batch16_gen128_tokens_per_s"] / r.v[k + "batch1_gen128_tokens_per_s"]);
}

/* LLaDA2.0-mini or -flash (random weights on the GPU, in `precision`; the build's peak memory and time): a prompt of n
 * tokens committed, then the 32-row block step with its tokens chosen on the device (as the decoding loop runs it),
 * eager and replayed as a graph, and with its logits copied to the host instead; its stages (the routing: router GEMM,
 * top-k and plan, against the step); and the read floor of what the step reads: for each MoE layer the experts its 32
 * rows chose (counted on this step's routes: 32 x 8 slots, far from all 256) plus the dense parts (the attention
 * projections, router, shared expert, the dense layer 0, the LM head), each in its device format, and the K/V rows
 * attended, at the copy rate measured here. The issue's target: the graph step at most 1.4x that floor. Then
 * bench_llada2_batch. Keys llada2_*, llada2_<precision>_* past BF16, llada2_flash_* for flash. */
static void bench_llada2(bench_result &r, dllm_precision precision, bool flash) {
    dllm_model *model = bench_llada2_model(flash);
    const dllm__config &c = model->cfg;
    const int64_t before = dllm__device_bytes;
    dllm__device_peak = before;
    dllm_ctx *ctx = nullptr;
    dllm_ctx_params cp = bench_gpu_params();
    cp.precision = precision;
    const double t0 = dllm__now_ms();
    BENCH_CHECK(dllm_ctx_create(model, cp, &ctx));
    const std::string k = std::string(flash ? "llada2_flash_" : "llada2_") +
                          (precision == DLLM_PRECISION_BF16 ? "" : dllm__format("%s_", dllm__precision_name(precision)));
    r.set(k + "weights_GB", (dllm__device_bytes - before) / 1e9);
    r.set(k + "build_peak_GB (the weights made a layer at a time)", (dllm__device_peak - before) / 1e9);
    r.set(k + "build_s", (dllm__now_ms() - t0) / 1e3);
    dllm__gpu_backend *gpu = (dllm__gpu_backend *)ctx->impl.get();
    const int n = 512, B = 32;
    std::vector<int32_t> ids((size_t)(n + B));
    for (int i = 0; i < n + B; i++) ids[(size_t)i] = i < n + 4 ? (i * 104729) % 150000 : c.mask_id;
    std::vector<float> logits((size_t)B * c.n_vocab);
    BENCH_CHECK(gpu->bd_begin(n + B));
    dllm__bd_call prefill;
    prefill.kind = DLLM__BD_COMMIT, prefill.ids = ids.data(), prefill.T = n, prefill.mask_block = B;
    prefill.r0 = n - 1, prefill.r1 = n;
    r.set(k + "prefill_N512_first_ms",
          bench_ms(gpu->stream(), 0, 1, [&] { BENCH_CHECK(gpu->bd_forward(prefill, logits.data())); }));
    dllm__bd_call step;
    step.kind = DLLM__BD_STEP, step.ids = ids.data() + n, step.T = B, step.mask_block = B, step.r0 = 0, step.r1 = B;
    // as the decoding loop runs it: the 32 rows' tokens chosen on the device (bd_forward_choose); beside it the step
    // with its 32 logit rows (20 MB) copied to the host
    dllm__bd_pick pick;
    pick.sampling.eos_logit_inf = true, pick.sampling.eos_id = c.mask_id;
    pick.pos0 = n, pick.n = B;
    std::vector<dllm__choice> ch((size_t)B);
    double ms[2], ms_logits = 0;
    dllm__env_set("bd_graphs", "1");
    for (int graphs = 0; graphs < 2; graphs++) {
        dllm__env_set("no_graphs", graphs ? "0" : "1");
        ms[graphs] = bench_ms(gpu->stream(), 3, 20, [&] { BENCH_CHECK(gpu->bd_forward_choose(step, pick, ch.data())); });
        if (graphs)
            ms_logits = bench_ms(gpu->stream(), 3, 20, [&] { BENCH_CHECK(gpu->bd_forward(step, logits.data())); });
    }
    dllm__env_reload();
    r.set(k + "block32_N512_step_eager_ms", ms[0]);
    r.set(k + "block32_N512_step_graph_ms", ms[1]);
    r.set(k + "block32_N512_step_graph_32_logit_rows_to_host_ms", ms_logits);
    r.set(k + "graphs_replayed", (double)gpu->bd_graph_count(DLLM__GRAPH_REPLAY));
    // the stages of one eager step (marks), the routing's share
    bench_result stages;
    bench_stages_of(stages, gpu, "", [&] { return gpu->bd_forward(step, logits.data()); });
    double total = 0, routing = 0;
    for (auto &kv : stages.v) {
        total += kv.second;
        if (kv.first == "moe router gemm ms" || kv.first == "moe route ms" || kv.first == "moe plan ms")
            routing += kv.second;
    }
    for (auto &kv : stages.v) r.set(k + "step stage " + kv.first, kv.second);
    r.set(k + "step_routing_share_eager", routing / total);
    // the routing alone (every MoE layer's router GEMM, top-k and plan) replayed as a graph: the eager stages above
    // also count each small launch's host cost
    cudaGraph_t routing_captured = nullptr;
    cudaGraphExec_t routing_exec = nullptr;
    cudaStreamBeginCapture(gpu->stream(), cudaStreamCaptureModeThreadLocal);
    const dllm_status routed = gpu->moe_route_all(B);
    cudaStreamEndCapture(gpu->stream(), &routing_captured);
    BENCH_CHECK(routed);
    if (!routing_captured || cudaGraphInstantiate(&routing_exec, routing_captured, 0) != cudaSuccess) {
        fprintf(stderr, "dllm-bench: the LLaDA2 routing graph was not made\n");
        exit(1);
    }
    const double routing_graph =
        bench_us_each(gpu->stream(), 5, [&](int) { cudaGraphLaunch(routing_exec, gpu->stream()); }) / 1000;
    cudaGraphExecDestroy(routing_exec);
    cudaGraphDestroy(routing_captured);
    r.set(k + "step_routing_graph_ms", routing_graph);
    r.set(k + "step_routing_share (graph; target < 0.10)", routing_graph / ms[1]);
    // the experts the step touched, layer by layer
    std::map<int, std::vector<int>> experts;
    gpu->set_moe_debug(&experts, nullptr);
    BENCH_CHECK(gpu->bd_forward(step, logits.data()));
    gpu->set_moe_debug(nullptr, nullptr);
    const dllm__gpu_weights &w = gpu->weights();
    double expert_bytes = 0;
    int touched = 0;
    for (auto &kv : experts) {
        std::set<int> distinct(kv.second.begin(), kv.second.end());
        distinct.erase(-1);
        touched += (int)distinct.size();
        const dllm__gpu_layer &L = w.layers[(size_t)kv.first];
        for (int e : distinct)
            expert_bytes += bench_linear_bytes(L.expert_gu[(size_t)e]) + bench_linear_bytes(L.expert_down[(size_t)e]);
    }
    const double hd = c.head_dim, moe_layers = (double)experts.size();
    double attn = 0, dense = w.head.data.ptr ? bench_linear_bytes(w.head) : (double)c.n_vocab * c.n_embd * 2;
    for (const dllm__gpu_layer &L : w.layers) {
        attn += bench_linear_bytes(L.qkv) + bench_linear_bytes(L.o);
        for (const dllm__linear *W : {&L.gu, &L.down, &L.router, &L.shared_gu, &L.shared_down})
            dense += bench_linear_bytes(*W);
    }
    const double kv = (double)(n + B) * 2 * c.n_head_kv * hd * 2 * c.n_layer;
    r.set(k + "step_experts_touched (of layers x 256)", touched);
    r.set(k + "step_experts_touched_per_moe_layer", moe_layers > 0 ? touched / moe_layers : 0);
    r.set(k + "step_read_GB (experts touched + dense + K/V)", (expert_bytes + attn + dense + kv) / 1e9);
    r.set(k + "step_expert_read_GB", expert_bytes / 1e9);
    dllm__dbuf a, b;
    const size_t copy_bytes = (size_t)1 << 30;
    BENCH_CHECK(a.fit(copy_bytes, "bench"));
    BENCH_CHECK(b.fit(copy_bytes, "bench"));
    const double copy_ms = bench_ms(gpu->stream(), 3, 10, [&] {
        cudaMemcpyAsync(b.ptr, a.ptr, copy_bytes, cudaMemcpyDeviceToDevice, gpu->stream());
    });
    const double TBps = 2.0 * copy_bytes / copy_ms / 1e9;
    const double floor_ms = (expert_bytes + attn + dense + kv) / 1e9 / TBps;
    r.set(k + "copy_TBps", TBps);
    r.set(k + "block32_N512_read_floor_ms", floor_ms);
    r.set(k + "block32_N512_graph_over_floor (target <= 1.4)", ms[1] / floor_ms);
    r.set(k + "block32_N512_eager_over_floor", ms[0] / floor_ms);
    bench_llada2_batch(r, ctx, k);
    dllm_ctx_free(ctx);
    dllm_model_free(model);
}

// ---------------------------------------------------------------------------------------------------
// [long context] block diffusion at 4k-32k-token prompts, per K/V cache, and what fits in 80 GB
// ---------------------------------------------------------------------------------------------------

static std::vector<int> bench_contexts = {4096, 16384, 32768};  // --long-context's prompt lengths (--contexts)
static const int bench_long_gen = 256, bench_long_block = 32;     // the generation and block of the long-context run

/* The prompt of a context: the model's positions end at max_seq_len (32768 at this shape), so its longest prompt is that
 * less the generation and its last seed, in whole blocks (a prompt ending mid-block fills the first generated block with
 * its tail, and fewer tokens are generated). */
static int bench_long_prompt(const dllm_model *model, int context) {
    return std::min(context, (model->cfg.max_seq_len - bench_long_gen - 1) / bench_long_block * bench_long_block);
}

/* The K/V caches --long-context compares: the name in its keys, the mode. */
static const std::pair<const char *, dllm_kv_quant> bench_long_caches[] = {
    {"bf16", DLLM_KV_QUANT_NONE}, {"kv4", DLLM_KV_QUANT_SOLOQ_KV4}, {"kv2", DLLM_KV_QUANT_SOLOQ_KV2}};

/* False, with the failing call and the library's detail on stderr, where BENCH_CHECK would exit: a long-context row that
 * does not fit or fails must not end the rows after it. */
static bool bench_ok(dllm_status s, const std::string &what) {
    if (s == DLLM_OK) return true;
    fprintf(stderr, "dllm-bench: %s: %s: %s (row skipped)\n", what.c_str(), dllm_status_str(s), dllm_last_error());
    return false;
}

/* Device memory in use on the current device, by cudaMemGetInfo (what other processes hold included: take differences). */
static double bench_used_bytes() {
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    return (double)total_bytes - (double)free_bytes;
}

/* Host times of a generation's step callbacks (dllm_gen_params.on_step): the public API's only view of where the time goes
 * inside dllm_generate. The decoding loop reads each step's choices on the host, so a callback runs when its step has
 * finished on the device. */
struct bench_step_clock {
    double start_ms = 0;
    std::vector<std::pair<int, double>> steps;  // (block, host time at the step's callback)

    static int on_step(const dllm_step_info *info, void *self) {
        ((bench_step_clock *)self)->steps.push_back({info->block, dllm__now_ms()});
        return 0;
    }
    /* The median time between two steps of one block (a pair across blocks holds the finished block's commit forward). */
    double step_ms() const {
        std::vector<double> t;
        for (size_t i = 1; i < steps.size(); i++)
            if (steps[i].first == steps[i - 1].first) t.push_back(steps[i].second - steps[i - 1].second);
        if (t.empty()) return NAN;
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }
    /* From the call to the first step's end, less one step: the prefill forward and the generation's set-up. */
    double prefill_ms() const { return steps.empty() ? NAN : steps[0].second - start_ms - step_ms(); }
};

/* One row of --long-context, kept for the human tables. */
struct bench_long_row {
    const char *cache;
    int context, n_prompt;
    double prefill_ms, step_ms, tokens_per_s, ctx_gb, after_gen_gb;
};

/* What the fit table is computed from, measured by the rows. */
struct bench_long_fit {
    double weights_bytes[2] = {NAN, NAN};  // a context's device memory before any generation: BF16, SoloQ-N weights
    double reserve_bytes = 0;              // the most a generation held beyond its committed cache (activations etc.)
};

/* The committed K/V rows of a generation (dllm__bd_cache_rows): the prompt's whole blocks, the generated ones, one block
 * of slack. */
static double bench_long_cache_rows(int n_prompt) {
    return (double)(n_prompt / bench_long_block * bench_long_block + bench_long_gen + bench_long_block);
}

/* A generation of gen tokens after the n_prompt-token prompt, threshold 0.9 (random weights: one token a step), timed by
 * its step callbacks; false (the error printed) if it fails. */
static bool bench_long_generate(dllm_ctx *ctx, const std::vector<int32_t> &prompt, int gen, int block,
                                bench_step_clock *clock, dllm_gen_stats &st) {
    dllm_gen_params gp = dllm_gen_default_params();
    gp.gen_length = gen, gp.block_length = block, gp.unmask = DLLM_UNMASK_THRESHOLD, gp.threshold = 0.9;
    // The stop token ends a generation only where random weights predict it (about 1 in the vocabulary's size a token).
    gp.stop_at_eos = 0;
    if (clock) gp.on_step = bench_step_clock::on_step, gp.on_step_data = clock, clock->start_ms = dllm__now_ms();
    std::vector<int32_t> out((size_t)(gen + block + 1));
    return bench_ok(dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, out.data(), (int)out.size(), nullptr, &st),
                    dllm__format("generation of %d tokens after %d", gen, (int)prompt.size()));
}

/* One cache at one context: a one-block warm-up (GEMMs tuned for the prefill's rows, kernels loaded), then prompt + gen
 * 256, block 32, at batch 1. used0: device memory in use before the context was made. */
static void bench_long_context_row(bench_result &r, dllm_ctx *ctx, const dllm_model *model, const char *cache,
                                   double bytes_per_token, int context, double used0, double ctx_bytes,
                                   bench_long_fit &fit, std::vector<bench_long_row> &rows) {
    const int gen = bench_long_gen, block = bench_long_block, n_prompt = bench_long_prompt(model, context);
    const std::string key = dllm__format("longctx_%s_ctx%d_", cache, context);
    std::vector<int32_t> prompt((size_t)n_prompt);
    for (int i = 0; i < n_prompt; i++) prompt[(size_t)i] = (i * 104729) % 150000;
    dllm_gen_stats st;
    bench_step_clock clock;
    if (!bench_long_generate(ctx, prompt, block, block, nullptr, st)) return;
    if (!bench_long_generate(ctx, prompt, gen, block, &clock, st)) return;
    const double after_gen = bench_used_bytes() - used0;
    const double cache_bytes = bytes_per_token * bench_long_cache_rows(n_prompt);
    fit.reserve_bytes = std::max(fit.reserve_bytes, after_gen - ctx_bytes - cache_bytes);
    bench_long_row row = {cache, context, n_prompt, clock.prefill_ms(), clock.step_ms(),
                          st.n_generated / (st.wall_ms / 1000), ctx_bytes / 1e9, after_gen / 1e9};
    r.set(key + "prompt_tokens", n_prompt);
    r.set(key + "prefill_ms", row.prefill_ms);
    r.set(key + "block_step_ms", row.step_ms);
    r.set(key + "e2e_s", st.wall_ms / 1000);
    r.set(key + "steps", st.steps);
    r.set(key + "tokens_per_s", row.tokens_per_s);
    r.set(key + "kv_cache_gb", cache_bytes / 1e9);
    r.set(key + "mem_after_gen_gb", row.after_gen_gb);
    rows.push_back(row);
}

static int bench_long_max_batch = 8;  // --long-batch: the most sequences of a batched row (the long-context target's batch)

/* One batched row of --long-context, kept for the human table. */
struct bench_long_batch {
    const char *cache;
    int context, batch;
    double step_ms, tokens_per_s, e2e_s, after_gen_gb;
};

/* The batched row of one cache at one context, in the context the batch-1 row ran in: the largest batch, at most
 * --long-batch, whose committed caches (bytes_per_token a row, dllm__bd_cache_rows' rows each) fit in the device's free
 * memory now beside twice the most a batch-1 generation held beyond its cache; its sequences (distinct prompts, gen 256,
 * block 32, threshold 0.9) join one dllm_stepper one a step, so that their prefills (each a forward of its whole
 * prompt) share no forward, and decode to the end. Under kv_quant each slot holds its codes alone
 * (gpu/batch_kvq.cpp). Keys longctx_<cache>_ctx<N>_batch: the batch, the median step with every sequence live (a
 * forward of every sequence's block), the run's generated tokens per second from the first join, device memory after;
 * and the batched forwards the run took (batched_forwards: one a step; items decoded alone would add theirs). */
static void bench_long_batch_row(bench_result &r, dllm_ctx *ctx, const dllm_model *model, const char *cache,
                                 double bytes_per_token, int context, double used0, const bench_long_fit &fit,
                                 std::vector<bench_long_batch> &rows) {
    const int gen = bench_long_gen, block = bench_long_block, n_prompt = bench_long_prompt(model, context);
    const std::string key = dllm__format("longctx_%s_ctx%d_batch_", cache, context);
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    const double sequence_bytes = bytes_per_token * bench_long_cache_rows(n_prompt);
    const int batch = (int)std::min((double)bench_long_max_batch,
                                    std::floor(((double)free_bytes - 2 * fit.reserve_bytes) / sequence_bytes));
    r.set(key + "size", batch);
    if (batch < 2) {
        fprintf(stderr, "dllm-bench: %s cache at %d tokens: no batch of 2 fits beside the rest (row skipped)\n", cache,
                n_prompt);
        return;
    }
    std::vector<std::vector<int32_t>> prompts((size_t)batch, std::vector<int32_t>((size_t)n_prompt)),
        outs((size_t)batch, std::vector<int32_t>((size_t)(gen + block + 1)));
    std::vector<dllm_batch_item> items((size_t)batch);
    for (int b = 0; b < batch; b++) {
        for (int i = 0; i < n_prompt; i++) prompts[(size_t)b][(size_t)i] = (i * 104729 + b * 7919) % 150000;
        dllm_batch_item &it = items[(size_t)b];
        it.prompt = prompts[(size_t)b].data(), it.n_prompt = n_prompt;
        it.params = dllm_gen_default_params();
        it.params.gen_length = gen, it.params.block_length = block, it.params.unmask = DLLM_UNMASK_THRESHOLD;
        it.params.threshold = 0.9, it.params.stop_at_eos = 0;
        it.out = outs[(size_t)b].data(), it.out_capacity = (int)outs[(size_t)b].size();
    }
    dllm_stepper_params sp = dllm_stepper_default_params();
    sp.max_sequences = batch;
    dllm_stepper *st = nullptr;
    if (!bench_ok(dllm_stepper_create(ctx, sp, &st), "dllm_stepper_create")) return;
    std::vector<int> ids((size_t)batch, -1);
    std::vector<double> full_steps;
    const double t0 = dllm__now_ms();
    bool ok = true;
    for (int added = 0; ok && (added < batch || dllm_stepper_n_active(st) > 0);) {
        if (added < batch) {
            ok = bench_ok(dllm_stepper_add(st, &items[(size_t)added], &ids[(size_t)added]), "dllm_stepper_add");
            added++;
        }
        const double t = dllm__now_ms();
        ok = ok && bench_ok(dllm_stepper_step(st), dllm__format("a step of %d sequences", dllm_stepper_n_active(st)));
        if (added == batch && dllm_stepper_n_active(st) == batch) full_steps.push_back(dllm__now_ms() - t);
    }
    const double wall_s = (dllm__now_ms() - t0) / 1000;
    int64_t generated = 0;
    for (int b = 0; ok && b < batch; b++) {
        dllm_seq_event ev;
        ok = bench_ok(dllm_stepper_poll(st, ids[(size_t)b], &ev), "dllm_stepper_poll") &&
             bench_ok(ev.result.status, dllm__format("sequence %d of the batch", b));
        generated += ev.result.stats.n_generated;
    }
    const double after_gen = bench_used_bytes() - used0;
    const int forwards = st->counts.forwards;  // white-box: the stepper's batched forwards
    dllm_stepper_free(st);
    if (!ok) return;
    std::sort(full_steps.begin(), full_steps.end());
    bench_long_batch row = {cache, context, batch, full_steps.empty() ? NAN : full_steps[full_steps.size() / 2],
                            generated / wall_s, wall_s, after_gen / 1e9};
    r.set(key + "step_ms", row.step_ms);
    r.set(key + "tokens_per_s", row.tokens_per_s);
    r.set(key + "e2e_s", wall_s);
    r.set(key + "batched_forwards", forwards);
    r.set(key + "mem_after_gen_gb", row.after_gen_gb);
    rows.push_back(row);
}

/* One cache at every context of --contexts, in one context (max_tokens: the model's limit) made for it: batch 1, then
 * the largest batch that fits (bench_long_batch_row). */
static void bench_long_context_cache(bench_result &r, dllm_model *model, const char *cache, dllm_kv_quant kv_quant,
                                     bench_long_fit &fit, std::vector<bench_long_row> &rows,
                                     std::vector<bench_long_batch> &batches) {
    double bytes_per_token = 0;
    if (!bench_ok(dllm_kv_bytes_per_token(model, kv_quant, bench_long_block, &bytes_per_token), "dllm_kv_bytes_per_token")) return;
    r.set(dllm__format("longctx_%s_kv_bytes_per_token", cache), bytes_per_token);
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_GPU, cp.kv_quant = kv_quant;
    const double used0 = bench_used_bytes();
    dllm_ctx *ctx = nullptr;
    if (!bench_ok(dllm_ctx_create(model, cp, &ctx), dllm__format("context with the %s cache", cache))) return;
    const double ctx_bytes = bench_used_bytes() - used0;
    if (kv_quant == DLLM_KV_QUANT_NONE) fit.weights_bytes[0] = ctx_bytes;
    r.set(dllm__format("longctx_%s_ctx_mem_gb", cache), ctx_bytes / 1e9);
    for (int context : bench_contexts) {
        bench_long_context_row(r, ctx, model, cache, bytes_per_token, context, used0, ctx_bytes, fit, rows);
        if (bench_long_max_batch > 1)
            bench_long_batch_row(r, ctx, model, cache, bytes_per_token, context, used0, fit, batches);
    }
    dllm_ctx_free(ctx);
}

/* Device memory a SoloQ-N context takes before any generation (its weights), NAN (the error printed) if it fails. */
static double bench_soloq_n_weights_bytes(dllm_model *model) {
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_GPU, cp.precision = DLLM_PRECISION_SOLOQ_N;
    const double used0 = bench_used_bytes();
    dllm_ctx *ctx = nullptr;
    if (!bench_ok(dllm_ctx_create(model, cp, &ctx), "context in SoloQ-N")) return NAN;
    const double bytes = bench_used_bytes() - used0;
    dllm_ctx_free(ctx);
    return bytes;
}

/* The largest batch of each context (and the longest context at batch 1) whose committed caches fit in 80 GB (80e9
 * bytes, a little under an H100's 85.5e9) beside the weights and the largest reserve a generation held. Computed from
 * the measured bytes (bench_long_batch_row runs batches up to --long-batch). */
static void bench_long_fit_table(bench_result &r, const dllm_model *model, const bench_long_fit &fit) {
    const char *weights[2] = {"bf16", "soloq_n"};
    r.set("longctx_fit80gb_reserve_gb", fit.reserve_bytes / 1e9);
    // the keys print as they are set; the human table after them
    std::string table = "\nlargest batch whose committed K/V caches fit in 80 GB (computed from the measured bytes):\n"
                        "| weights | cache |";
    for (int context : bench_contexts) table += dllm__format(" ctx %d |", context);
    table += " longest context, batch 1 |\n";
    for (int w = 0; w < 2; w++) {
        if (std::isnan(fit.weights_bytes[w])) continue;
        r.set(dllm__format("longctx_fit80gb_%s_weights_gb", weights[w]), fit.weights_bytes[w] / 1e9);
        const double room = 80e9 - fit.weights_bytes[w] - fit.reserve_bytes;
        for (auto &cache : bench_long_caches) {
            double bytes_per_token = 0;
            if (!bench_ok(dllm_kv_bytes_per_token(model, cache.second, bench_long_block, &bytes_per_token), "dllm_kv_bytes_per_token")) continue;
            const std::string key = dllm__format("longctx_fit80gb_%s_weights_%s_cache_", weights[w], cache.first);
            table += dllm__format("| %s | %s |", weights[w], cache.first);
            for (int context : bench_contexts) {
                const double sequence_bytes = bytes_per_token * bench_long_cache_rows(bench_long_prompt(model, context));
                const double batch = std::max(0.0, std::floor(room / sequence_bytes));
                r.set(key + dllm__format("ctx%d_max_batch", context), batch);
                table += dllm__format(" %.0f |", batch);
            }
            const double tokens = std::max(0.0, std::floor(room / bytes_per_token));
            r.set(key + "b1_max_tokens", tokens);
            table += dllm__format(" %.0f |\n", tokens);
        }
    }
    fputs(table.c_str(), stdout);
}

/* --long-context: the Fast-dLLM v2 7B shape at each prompt of --contexts, gen 256, block 32, batch 1, for the BF16,
 * SoloQ-KV4 and SoloQ-KV2 caches: prefill, block step, tokens/s and device memory; then the 80 GB fit table. */
static void bench_long_context(bench_result &r) {
    const double t0 = dllm__now_ms();
    dllm_model *model = bench_fast_dllm_v2_model();
    bench_long_fit fit;
    std::vector<bench_long_row> rows;
    std::vector<bench_long_batch> batches;
    for (auto &cache : bench_long_caches)
        bench_long_context_cache(r, model, cache.first, cache.second, fit, rows, batches);
    printf("\n| cache | context | prompt | prefill ms | block step ms | tokens/s | context GB | after gen GB |\n");
    for (const bench_long_row &x : rows)
        printf("| %s | %d | %d | %.1f | %.3f | %.1f | %.2f | %.2f |\n", x.cache, x.context, x.n_prompt, x.prefill_ms,
               x.step_ms, x.tokens_per_s, x.ctx_gb, x.after_gen_gb);
    if (!batches.empty()) printf("\n| cache | context | batch | step ms (all live) | tokens/s | e2e s | after gen GB |\n");
    for (const bench_long_batch &x : batches)
        printf("| %s | %d | %d | %.3f | %.1f | %.1f | %.2f |\n", x.cache, x.context, x.batch, x.step_ms,
               x.tokens_per_s, x.e2e_s, x.after_gen_gb);
    fit.weights_bytes[1] = bench_soloq_n_weights_bytes(model);
    bench_long_fit_table(r, model, fit);
    dllm_model_free(model);
    r.set("longctx_total_s", (dllm__now_ms() - t0) / 1000);
}

/* FLOPs of a K/V-cache step: `rows` forwarded rows through every linear, their queries over `keys` keys, the LM head on
 * lm_rows rows. */
static double bench_kv_step_flops(const dllm__config &c, double rows, double keys, double lm_rows) {
    const double d = c.n_embd, q = (double)c.n_head * c.head_dim, kv = (double)c.n_head_kv * c.head_dim, ff = c.n_ff;
    const double per_token = c.n_layer * (d * (q + 2 * kv) + q * d + 2 * d * ff + ff * d);
    return 2.0 * rows * per_token + 2.0 * lm_rows * d * c.n_vocab + c.n_layer * 4.0 * rows * keys * q;
}

static std::vector<int> bench_batch_sizes = {1, 4, 8, 16, 32, 64};  // --batch-rows' and --batch-w1's batches (--batch-sizes)

/* [batch] A second pass of the --batch-rows tables under a switch (tag, e.g. "n128_", non-empty): only the step time
 * under key + "step_ms" and its ratio to the first pass's (base + "step_ms"). Returns whether it was one. */
static bool bench_batch_brief(bench_result &r, const char *tag, const std::string &key, const std::string &base, double ms) {
    if (!*tag) return false;
    r.set(key + "step_ms", ms);
    if (r.v.count(base + "step_ms")) r.set(key + "step_over_default", ms / r.v[base + "step_ms"]);
    return true;
}

/* [batch] [dual cache] The batched K/V-cache step (forward_batch_kv's forward) at the LLaDA-8B
 * shape as torch_reference_batch.py's dual_block32_N1024 rows run it: B canvases of 1024 tokens, each with its own
 * dual cache, the block at 768..799. Per B: the block's full forward that fills the caches (once), then the dual-cache
 * step (32 query rows a sequence over its 1024 cached keys, the LM head on the block): time per step, tokens/s (one
 * token per sequence a step), TFLOP/s and the fraction of the BF16 compute floor; at B = 16 the step against the
 * anchor's CUDA-graph step (20.5 ms when measured; the target: at most 0.65x, and a floor fraction >= 0.75). Beside
 * it the step with its token choice on the device (step_with_choice_ms; choice_ms the difference), and at B = 16 the
 * step with its logits copied to the host for the host's choice (step_logits_to_host_ms). With a tag, only the step
 * times (bench_batch_brief). */
static void bench_batch_kv_rows(bench_result &r, dllm_model *model, double gemm_rate, const char *tag) {
    dllm_ctx_params cp = bench_gpu_params();
    cp.max_tokens = 1024;
    dllm_ctx *ctx = nullptr;
    BENCH_CHECK(dllm_ctx_create(model, cp, &ctx));
    dllm__gpu_backend *gpu = (dllm__gpu_backend *)ctx->impl.get();
    const dllm__config &c = model->cfg;
    const int n = 1024, b0 = 768, b1 = 800;
    for (int B : bench_batch_sizes) {
        std::vector<std::vector<int32_t>> canvases((size_t)B);
        std::vector<dllm__batch_seq> fill((size_t)B), step;
        for (int b = 0; b < B; b++) {
            for (int i = 0; i < n; i++) canvases[(size_t)b].push_back(i >= b0 && i < b1 ? c.mask_id : (i * 7919 + b * 104729) % 100000);
            dllm__batch_seq &s = fill[(size_t)b];
            s.ids = canvases[(size_t)b].data(), s.n = n, s.slot = b, s.fill = true, s.q0 = 0, s.q1 = n, s.r0 = b0, s.r1 = b1;
        }
        step = fill;
        for (dllm__batch_seq &s : step) s.fill = false, s.q0 = b0 - (c.shift_logits ? 1 : 0), s.q1 = b1;
        if (gpu->batch_kv_reserve(std::vector<int>((size_t)B, n)) != DLLM_OK) {  // memory: the larger batches are left out, said so
            fprintf(stderr, "dllm-bench: batch %d dual-cache rows left out: %s\n", B, dllm_last_error());
            break;
        }
        dllm__varlen_layout vf, vs;
        BENCH_CHECK(gpu->kv_layout(fill, vf));
        BENCH_CHECK(gpu->kv_layout(step, vs));
        auto nothing = [](int, int) { return DLLM_OK; };
        const double fill_ms = bench_ms(gpu->stream(), 1, 3, [&] { BENCH_CHECK(gpu->batch_logits(vf, nothing)); });
        const double ms = bench_ms(gpu->stream(), 2, 5, [&] { BENCH_CHECK(gpu->batch_logits(vs, nothing)); });
        const double flops = B * bench_kv_step_flops(c, b1 - vs.q0[0], n, b1 - b0);
        const std::string k = dllm__format("%sbatch%d_dual_N1024_", tag, B);
        if (bench_batch_brief(r, tag, k, dllm__format("batch%d_dual_N1024_", B), ms)) continue;
        r.set(k + "fill_ms", fill_ms);
        r.set(k + "step_ms", ms);
        r.set(k + "tokens_per_s", 1000.0 * B / ms);
        r.set(k + "TFLOPs", flops / ms / 1e9);
        r.set(k + "floor_fraction", flops / (gemm_rate * 1e12) / (ms / 1000));
        if (B == 16) r.set(k + "step_over_anchor_graph_20.5ms", ms / 20.5);
        if (B == 1 || B == 16)  // where the step's time goes (eager, summed over the layers)
            bench_stages_of(r, gpu, k + "stage ", [&] { return gpu->batch_logits(vs, nothing); });
        // The step with its token choice (forward_batch_choose, as dllm_generate_batch runs it: the sampler per sequence
        // on the device, LLaDA's defaults, its choices on the host); at B = 16 also the step with every logit copied to
        // the host instead (forward_batch_kv), which the host's choice then reads.
        const dllm__sampling sampling;
        std::vector<dllm__batch_seq> choose = step;
        for (dllm__batch_seq &s : choose) s.sampling = &sampling, s.step = 1;
        std::vector<dllm__choice> choices((size_t)B * (b1 - b0));
        const double choose_ms = bench_ms(gpu->stream(), 2, 5, [&] { BENCH_CHECK(gpu->forward_batch_choose(choose, true, nullptr, choices.data())); });
        r.set(k + "step_with_choice_ms", choose_ms);
        r.set(k + "choice_ms", choose_ms - ms);
        if (B == 16) {
            std::vector<float> logits((size_t)B * (b1 - b0) * c.n_vocab);
            r.set(k + "step_logits_to_host_ms", bench_ms(gpu->stream(), 1, 3, [&] { BENCH_CHECK(gpu->forward_batch_kv(step, logits.data())); }));
        }
    }
    BENCH_CHECK(gpu->batch_kv_reserve({}));
    dllm_ctx_free(ctx);
}

/* B of W1's items (prompt 768, gen 256, block 32, 256 steps, dual cache, no EOS stop), each its own prompt; prompts
 * and outs hold their ids. */
static std::vector<dllm_batch_item> bench_w1_items(int B, std::vector<std::vector<int32_t>> &prompts,
                                                   std::vector<std::vector<int32_t>> &outs) {
    dllm_gen_params gp = dllm_gen_default_params();
    gp.gen_length = 256, gp.steps = 256, gp.block_length = 32, gp.stop_at_eos = 0, gp.kv_cache = DLLM_KV_CACHE_DUAL;
    return bench_batch_items(B, 768, 100000, gp, prompts, outs);
}

/* [batch] [dual cache] W1 end to end through dllm_generate_batch: B prompts of 768 random ids (each its own), gen 256,
 * block 32, 256 steps, the dual cache, greedy low-confidence, decoded together; generated tokens/s of the batch
 * (B x 256 over its wall time) for B = 1, 4, 8, 16, 32, 64, and batch 16's over batch 1's (the
 * target: at least 3.5x in BF16), in the given precision. Each batch size is warmed up once (module loading, GEMM tuning of its row counts). */
static void bench_batch_w1(bench_result &r, dllm_model *model, dllm_precision precision) {
    dllm_ctx_params cp = bench_gpu_params();
    cp.max_tokens = 1024;
    cp.precision = precision;
    printf("batch W1 in %s\n", dllm__precision_name(precision));
    dllm_ctx *ctx = nullptr;
    BENCH_CHECK(dllm_ctx_create(model, cp, &ctx));
    for (int B : bench_batch_sizes) {
        std::vector<std::vector<int32_t>> prompts, outs;
        std::vector<dllm_batch_item> items = bench_w1_items(B, prompts, outs);
        bench_generate_batch_s(ctx, items, "W1");  // warm-up
        const double s = bench_generate_batch_s(ctx, items, "W1");
        r.set(dllm__format("batch%d_W1_dual_s", B), s);
        r.set(dllm__format("batch%d_W1_dual_tokens_per_s", B), B * items[0].params.gen_length / s);
    }
    if (r.v.count("batch1_W1_dual_tokens_per_s"))
        r.set("batch16_W1_dual_over_batch1", r.v["batch16_W1_dual_tokens_per_s"] / r.v["batch1_W1_dual_tokens_per_s"]);
    dllm_ctx_free(ctx);
}

/* [batch] A request joining a running batch, as the server's stepper meets it: at the LLaDA-8B shape (W1's item: prompt
 * 768, gen 256, block 32, dual cache) 15 sequences join a dllm_stepper of 16 at once and decode 32 steps, so that
 * without a fill bound all 15 are due for block 1's fill (the whole canvas each) when a 16th joins. Per
 * max_fill_rows (the default, and 0: no bound; a first pass warms up): the time from its dllm_stepper_add to its first
 * step's event, the median step before it and the longest step (the most any arrival waits for a step to end).
 * Keys join_<bound>_*. `staged`: the joiner's steps run eager with the stages timed (keys join_staged_stage *). */
static void bench_join_pass(bench_result &r, dllm_ctx *ctx, int max_fill_rows, const char *tag, bool staged = false) {
    const int B = 16;
    std::vector<std::vector<int32_t>> prompts, outs;
    std::vector<dllm_batch_item> items = bench_w1_items(B, prompts, outs);
    dllm_stepper_params sp = dllm_stepper_default_params();
    sp.max_sequences = B, sp.max_fill_rows = max_fill_rows;
    dllm_stepper *st = nullptr;
    BENCH_CHECK(dllm_stepper_create(ctx, sp, &st));
    std::vector<int> ids((size_t)B, -1);
    std::vector<double> steps;
    auto timed_step = [&] {
        const double t = dllm__now_ms();
        BENCH_CHECK(dllm_stepper_step(st));
        steps.push_back(dllm__now_ms() - t);
    };
    for (int b = 0; b < B - 1; b++) BENCH_CHECK(dllm_stepper_add(st, &items[(size_t)b], &ids[(size_t)b]));
    for (int i = 0; i < 32; i++) timed_step();
    std::vector<double> before(steps.begin() + 8, steps.end());
    std::sort(before.begin(), before.end());
    const double t0 = dllm__now_ms();
    BENCH_CHECK(dllm_stepper_add(st, &items[(size_t)B - 1], &ids[(size_t)B - 1]));
    int n = 0;
    const std::string key = dllm__format("join_%s_", tag);
    for (dllm_seq_event ev = {}; !ev.stepped && n < 64; n++) {
        if (staged)
            bench_stages_of(r, (dllm__gpu_backend *)ctx->impl.get(), key + "stage ",
                            [&] { return dllm_stepper_step(st); });
        else
            timed_step();
        BENCH_CHECK(dllm_stepper_poll(st, ids[(size_t)B - 1], &ev));
    }
    r.set(key + "to_first_step_ms", dllm__now_ms() - t0);
    r.set(key + "steps_to_first_step", n);
    for (int i = 0; i < 32; i++) timed_step();
    r.set(key + "median_step_before_ms", before[before.size() / 2]);
    r.set(key + "longest_step_after_the_first_ms", *std::max_element(steps.begin() + 1, steps.end()));
    dllm_stepper_free(st);
}

static void bench_join(bench_result &r, dllm_model *model) {
    dllm_ctx_params cp = bench_gpu_params();
    cp.max_tokens = 1024;
    dllm_ctx *ctx = nullptr;
    BENCH_CHECK(dllm_ctx_create(model, cp, &ctx));
    const int bound = dllm_stepper_default_params().max_fill_rows;
    bench_join_pass(r, ctx, 0, "warmup");
    bench_join_pass(r, ctx, 0, "unbounded");
    bench_join_pass(r, ctx, bound, dllm__format("fill%d", bound).c_str());
    bench_join_pass(r, ctx, bound, "staged", true);
    dllm_ctx_free(ctx);
}

/* [batch] The batched forward (dllm__gpu_backend::batch_logits, as dllm_generate_batch runs it) at the LLaDA-8B shape:
 * B canvases of 256 tokens each, the LM head on each one's last 32 rows (a block's candidates), for B = 1 .. 64: time per
 * step, the generated tokens/s it stands for (one token per sequence a step, as W1 commits them), TFLOP/s and the fraction
 * of the BF16 compute floor (its FLOPs at the 8192^3 GEMM rate measured here). The batched step runs row-independent
 * GEMMs and no K/V cache; the solo forward of the same canvas (tuned GEMMs) is printed beside B = 1 for what batch
 * invariance costs. The model's weights and the sequences' ids are random. With a tag (a second pass under a switch)
 * only the step times, beside the first pass's (bench_batch_brief). */
static void bench_batch_rows(bench_result &r, const char *config, cudaStream_t s, const char *tag) {
    std::shared_ptr<dllm__module> rowwise;
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    BENCH_CHECK(dllm__jit_load(dllm__module_rowwise(dllm__arch_for(prop.major * 10 + prop.minor)), rowwise));
    double gemm_rate;
    if (r.v.count("bf16_gemm_8192_TFLOPs")) {
        gemm_rate = r.v["bf16_gemm_8192_TFLOPs"];
    } else {
        dllm__gemm g;
        BENCH_CHECK(g.init());
        gemm_rate = bench_gemm_rate(g, rowwise, 8192, 8192, 8192, false, s);
        r.set("bf16_gemm_8192_TFLOPs", gemm_rate);
    }
    dllm_model *model = nullptr;
    BENCH_CHECK(dllm_model_load_random(config, 1, &model));
    dllm_ctx_params cp = bench_gpu_params();
    cp.max_tokens = 256;
    dllm_ctx *ctx = nullptr;
    BENCH_CHECK(dllm_ctx_create(model, cp, &ctx));
    dllm__gpu_backend *gpu = (dllm__gpu_backend *)ctx->impl.get();
    const dllm__config &c = model->cfg;
    const int n = 256, out_rows = 32;
    std::vector<int32_t> ids((size_t)n);
    for (int i = 0; i < n; i++) ids[(size_t)i] = (i * 7919) % 100000;
    if (!*tag) {
        BENCH_CHECK(gpu->prepare_forward(ids.data(), n, out_rows));
        const double solo_ms = bench_ms(gpu->stream(), 2, 5, [&] { BENCH_CHECK(gpu->forward_logits(n, n - out_rows, n, [](int, int) { return DLLM_OK; })); });
        r.set("batch_solo_fwd_N256_ms", solo_ms);
    }
    for (int B : bench_batch_sizes) {
        std::vector<std::vector<int32_t>> canvases((size_t)B);
        std::vector<dllm__batch_seq> plan((size_t)B);
        for (int b = 0; b < B; b++) {
            for (int i = 0; i < n; i++) canvases[(size_t)b].push_back((i * 7919 + b * 104729) % 100000);
            plan[(size_t)b].ids = canvases[(size_t)b].data(), plan[(size_t)b].n = n, plan[(size_t)b].r0 = n - out_rows, plan[(size_t)b].r1 = n;
        }
        dllm__varlen_layout v;
        BENCH_CHECK(dllm__varlen_layout_of(c, plan, cp.max_tokens, v));
        const double ms = bench_ms(gpu->stream(), 2, 5, [&] { BENCH_CHECK(gpu->batch_logits(v, [](int, int) { return DLLM_OK; })); });
        const double flops = B * bench_flops(c, n, out_rows);
        const std::string k = dllm__format("%sbatch%d_fwd_N256_", tag, B);
        if (bench_batch_brief(r, tag, k, dllm__format("batch%d_fwd_N256_", B), ms)) continue;
        r.set(k + "step_ms", ms);
        r.set(k + "tokens_per_s", 1000.0 * B / ms);
        r.set(k + "TFLOPs", flops / ms / 1e9);
        r.set(k + "floor_fraction", flops / (gemm_rate * 1e12) / (ms / 1000));
    }
    dllm_ctx_free(ctx);
    bench_batch_kv_rows(r, model, gemm_rate, tag);
    dllm_model_free(model);
}

static const char *bench_usage =
    "usage: dllm-bench [--quick | --attention-only | --rowwise-only | --gemm-only | --q4-gemm-only | --int8-gemm-only |\n"
    "                   --batch-rows | --batch-w1 | --bd-only | --kv-attention-only | --llada2-only |\n"
    "                   --long-context [--contexts LIST]]\n"
    "                  [--anchors anchor_torch.json]\n"
    "                  [--anchors-v2 anchor_v2.json (torch_reference_v2.py's, block diffusion)]\n"
    "                  [--anchor-graphs anchor_graphs.log] [--json out.json] [--config llada-config.json]\n"
    "\n"
    "Speed of dllm on random weights of the real LLaDA-8B (and Fast-dLLM v2 7B) shapes, generated on the GPU (no file needed); the\n"
    "ratios to the PyTorch reference when its results are given. Modes (the default runs everything):\n"
    "  --quick            the dual-cache block step and the N=1024 forward, profiled, LaCache's components, W1 through\n"
    "                     dllm_generate with and without tuned_forwards, and block diffusion at the Fast-dLLM v2 7B shape\n"
    "  --attention-only   the attention kernels alone (compare tiles with DLLM_TILES fa_*)\n"
    "  --rowwise-only     add + RMSNorm, RoPE and SwiGLU alone\n"
    "  --gemm-only        dllm's Hopper GEMM against cuBLASLt at a W1 step's shapes, in bursts and sustained; then its\n"
    "                     256-, 128- and 64-wide tiles, gemm_splitk and cuBLASLt at M = 32, 64, 128, 512, 2048 (LLaDA-8B\n"
    "                     and Fast-dLLM v2 7B shapes)\n"
    "  --q4-gemm-only     q4wg (SoloQ-I and SoloQ-N, sm_90a) against cuBLASLt BF16 and the copy rate at M = 32 to 1024, then the W4 GEMM\n"
    "                     (q4_gemm, every SoloQ weight format) against cuBLASLt BF16 at a block step's shapes\n"
    "  --int8-gemm-only   the INT8 GEMM path of SoloQ-I/C for many rows against cuBLASLt BF16 and FP8 and the BF16 path,\n"
    "                     M = 256 and 1024 at the LLaDA-8B shapes (also part of the full run and of --quick in soloq-i/c)\n"
    "  --batch-rows       the batched forward (dllm_generate_batch's) of 1 to 64 canvases of 256 tokens: time per step,\n"
    "                     tokens/s, fraction of the BF16 compute floor; then the batched dual-cache step (canvases of 1024,\n"
    "                     block 768..799, as torch_reference_batch.py's dual_block32_N1024) at batch 1 to 64, the same columns,\n"
    "                     and the step with its token choice on the device beside it; then both step times again under\n"
    "                     DLLM_TILES=batch_gemm_n=256, =128 and =64 (keys n256_..., n128_..., n64_...) with their ratio to the default's\n"
    "  --batch-sizes LIST --batch-rows and --batch-w1 at these batches only (comma-separated, e.g. 1,16; by default\n"
    "                     1,4,8,16,32,64)\n"
    "  --batch-w1         W1 with the dual cache end to end through dllm_generate_batch at batch 1, 4, 8, 16, 32, 64:\n"
    "                     tokens/s (in --precision NAME's precision)\n"
    "  --join-only        a request joining 15 that decode (W1's item, LLaDA-8B shape, a dllm_stepper of 16) when they\n"
    "                     are due for a block's fill: the time to its first step, with and without the fill bound\n"
    "  --bd-only          block diffusion alone at the Fast-dLLM v2 7B shape (the rows --quick ends with)\n"
    "  --llada2-only      LLaDA2.0-mini (mixture of experts; --precision NAME's, default BF16): the 32-row block step\n"
    "                     over a 512-token prompt, eager and as a graph, its stages and routing share, the experts it\n"
    "                     touched and its read floor in their device format (keys llada2_*, llada2_NAME_* past BF16;\n"
    "                     BF16 also part of the full run)\n"
    "  --llada2-shape S   --llada2-only at LLaDA2.0-mini's shape (mini, the default) or LLaDA2.0-flash's (flash: 100B\n"
    "                     parameters; on an 80 GB card in SoloQ or FP8 only; keys llada2_flash_*)\n"
    "  --kv-attention-only  --bd-only's first rows alone: a layer's attention over a 32k-token cache, BF16 against KV4\n"
    "                     (kvq_attention and kvq_flash, with its plan variants); short enough to run under ncu\n"
    "  --long-context     block diffusion at the Fast-dLLM v2 7B shape with long prompts, gen 256, block 32: per K/V cache\n"
    "                     (bf16, soloq-kv4, soloq-kv2) and prompt, at batch 1 the prefill, the block step, tokens/s and device\n"
    "                     memory (keys longctx_*); then batched (a dllm_stepper, one join a step) at the largest batch that fits\n"
    "                     the free memory, at most --long-batch: step, tokens/s, memory (keys longctx_*_batch_*); then the\n"
    "                     largest batch x context whose caches fit in 80 GB beside BF16 or SoloQ-N weights (longctx_fit80gb_*)\n"
    "  --long-batch N     --long-context's batched rows take at most N sequences (default 8; 1: none)\n"
    "  --contexts LIST    --long-context's prompt lengths (comma-separated; by default 4096,16384,32768; a prompt is cut to\n"
    "                     the model's 32768 positions less the generation, in whole blocks: 32480)\n"
    "  --precision NAME   --quick, --batch-w1 or --llada2-only in that precision (bf16, fp8, fp8-all, soloq-n, soloq-i, soloq-c, rtn-w4a4, ...)\n";

/* --precision's NAME (dllm__precision_name's) into out; false (and the usage printed) for an unknown one. */
static bool bench_precision(const char *name, dllm_precision &out) {
    for (int p = DLLM_PRECISION_BF16; p <= DLLM_PRECISION_RTN_W4A16; p++)
        if (!strcmp(name, dllm__precision_name(p))) {
            out = (dllm_precision)p;
            return true;
        }
    fprintf(stderr, "dllm-bench: unknown precision '%s'\n%s", name, bench_usage);
    return false;
}

/* A comma-separated list of integers from 1 to most into out (replaced); false (the error printed) for a malformed one. */
static bool bench_parse_list(const char *flag, const char *what, const char *text, long most, std::vector<int> &out) {
    out.clear();
    for (const char *p = text; *p;) {
        char *end = nullptr;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > most || (*end && *end != ',')) {
            fprintf(stderr, "dllm-bench: %s takes %s from 1 to %ld separated by commas, got '%s'\n", flag, what, most, text);
            return false;
        }
        out.push_back((int)v);
        p = *end ? end + 1 : end;
    }
    if (out.empty()) fprintf(stderr, "dllm-bench: %s needs at least one value\n", flag);
    return !out.empty();
}

int main(int argc, char **argv) {
    const char *anchors = nullptr, *anchors_v2 = nullptr, *graphs = nullptr, *json_out = nullptr,
               *config = "tests/data/real-configs/llada-8b-instruct.config.json";
    const char *precision = "bf16", *batch_sizes = nullptr, *contexts = nullptr, *long_batch = nullptr,
               *llada2_shape = "mini";
    bool attention_only = false, rowwise_only = false, quick = false, gemm_only = false, q4_only = false, int8_only = false, batch_rows = false, batch_w1 = false,
         bd_only = false, kv_attention_only = false, long_context = false, llada2_only = false, join_only = false;
    struct { const char *flag; bool *on; } modes[] = {{"--attention-only", &attention_only}, {"--gemm-only", &gemm_only}, {"--rowwise-only", &rowwise_only},
                                                      {"--quick", &quick}, {"--q4-gemm-only", &q4_only}, {"--int8-gemm-only", &int8_only},
                                                      {"--batch-rows", &batch_rows}, {"--batch-w1", &batch_w1}, {"--bd-only", &bd_only},
                                                      {"--kv-attention-only", &kv_attention_only}, {"--long-context", &long_context},
                                                      {"--llada2-only", &llada2_only}, {"--join-only", &join_only}};
    struct { const char *flag; const char **value; } values[] = {{"--anchors", &anchors}, {"--anchors-v2", &anchors_v2}, {"--anchor-graphs", &graphs},
                                                                 {"--json", &json_out}, {"--config", &config}, {"--precision", &precision},
                                                                 {"--batch-sizes", &batch_sizes}, {"--contexts", &contexts},
                                                                 {"--long-batch", &long_batch}, {"--llada2-shape", &llada2_shape}};
    for (int i = 1; i < argc; i++) {
        bool known = false;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(bench_usage, stdout);
            return 0;
        }
        for (auto &m : modes)
            if (!strcmp(argv[i], m.flag)) *m.on = known = true;
        for (auto &v : values)
            if (!strcmp(argv[i], v.flag)) {
                if (i + 1 == argc) {
                    fprintf(stderr, "dllm-bench: %s needs a value\n%s", v.flag, bench_usage);
                    return 2;
                }
                *v.value = argv[++i];
                known = true;
            }
        if (!known) {
            fprintf(stderr, "dllm-bench: unknown argument '%s'\n%s", argv[i], bench_usage);
            return 2;
        }
    }
    if (batch_sizes && !bench_parse_list("--batch-sizes", "batch sizes", batch_sizes, 4096, bench_batch_sizes)) return 2;
    if (contexts && !bench_parse_list("--contexts", "prompt lengths", contexts, 1 << 20, bench_contexts)) return 2;
    if (long_batch) {
        std::vector<int> n;
        if (!bench_parse_list("--long-batch", "batch sizes", long_batch, 4096, n) || n.size() != 1) return 2;
        bench_long_max_batch = n[0];
    }
    bench_result r;
    cudaStream_t s0;
    cudaStreamCreate(&s0);
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) { fprintf(stderr, "dllm-bench: no GPU\n"); return 1; }
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    const dllm__arch arch = dllm__arch_for(prop.major * 10 + prop.minor);
    if (rowwise_only) {
        bench_rowwise(r, arch, s0);
        return 0;
    }
    if (gemm_only) {
        bench_gemm_wg(r, arch, s0, true);
        bench_gemm_wg_widths(r, arch, s0);
        return 0;
    }
    if (q4_only) {
        bench_q4wg(r, arch, s0);
        bench_q4_gemm(r, arch, s0);
        return 0;
    }
    if (int8_only) {
        bench_q4wg(r, arch, s0);
        bench_int8_gemm(r, arch, s0);
        return 0;
    }
    if (long_context) {
        bench_long_context(r);
        return 0;
    }
    if (llada2_only) {
        dllm_precision p;
        if (!bench_precision(precision, p)) return 2;
        if (strcmp(llada2_shape, "mini") && strcmp(llada2_shape, "flash")) {
            fprintf(stderr, "dllm-bench: --llada2-shape takes mini or flash, not '%s'\n%s", llada2_shape, bench_usage);
            return 2;
        }
        bench_llada2(r, p, !strcmp(llada2_shape, "flash"));
        return 0;
    }
    if (bd_only || kv_attention_only) {
        bench_kv4_attention_32k(r, arch, prop.multiProcessorCount, s0);
        if (bd_only) bench_block_diffusion(r);
        return 0;
    }
    if (join_only) {
        dllm_model *model = nullptr;
        BENCH_CHECK(dllm_model_load_random(config, 1, &model));
        bench_join(r, model);
        dllm_model_free(model);
        return 0;
    }
    if (batch_w1) {
        dllm_precision p;
        if (!bench_precision(precision, p)) return 2;
        dllm_model *model = nullptr;
        BENCH_CHECK(dllm_model_load_random(config, 1, &model));
        bench_batch_w1(r, model, p);
        dllm_model_free(model);
        return 0;
    }
    if (batch_rows) {  // the default (each GEMM's faster width), then gemm_wg's widths forced (a context reads the switch when made)
        bench_batch_rows(r, config, s0, "");
        for (const char *width : {"256", "128", "64"}) {
            dllm__env_set("batch_gemm_n", width);
            bench_batch_rows(r, config, s0, dllm__format("n%s_", width).c_str());
        }
        return 0;
    }
    bench_attention(r, arch, prop.multiProcessorCount, s0);
    if (attention_only) return 0;
    bench_rowwise(r, arch, s0);
    bench_gemm_wg(r, arch, s0, false);
    if (!quick) bench_q4wg(r, arch, s0);
    if (!quick) bench_q4_gemm(r, arch, s0);
    if (!quick) bench_int8_gemm(r, arch, s0);
    if (quick) {  // the two step shapes that matter most, with their stage profiles
        dllm_model *model = nullptr;
        BENCH_CHECK(dllm_model_load_random(config, 1, &model));
        dllm_ctx *ctx = nullptr;
        dllm_ctx_params cp = bench_gpu_params();
        if (!bench_precision(precision, cp.precision)) return 2;
        // the INT8 GEMM's rows beside the N=1024 forward of the precisions whose GEMMs of many rows take it
        if (cp.precision == DLLM_PRECISION_SOLOQ_I || cp.precision == DLLM_PRECISION_SOLOQ_C || cp.precision == DLLM_PRECISION_RTN_W4A4)
            bench_int8_gemm(r, arch, s0);
        BENCH_CHECK(dllm_ctx_create(model, cp, &ctx));
        dllm__gpu_backend *gpu = (dllm__gpu_backend *)ctx->impl.get();
        r.set("dual_block32_N1024_step_ms", bench_dual_block_step(r, gpu, model->cfg, 1024, 32));
        r.set("fwd_full_N1024_ms", bench_forward_ms(gpu, 1024));
        bench_stages(r, gpu, 1024, "N1024 stage ");
        bench_lacache_components(r, gpu, model->cfg, 768, 256, 32, NAN, NAN);  // no ceilings measured: no predictions
        bench_w1_paths(r, ctx);
        dllm_ctx_free(ctx);
        dllm_model_free(model);
        bench_block_diffusion(r);
        return 0;
    }
    bench_ceilings(r, s0);

    // JIT: cold (empty disk cache), then warm (disk cache only)
    std::string cache = dllm__format("/tmp/dllm-bench-cache-%d", (int)getpid());
    setenv("DLLM_CACHE_DIR", cache.c_str(), 1);
    dllm__env_reload();
    auto load_all = [&] {
        std::shared_ptr<dllm__module> a, b, c;
        BENCH_CHECK(dllm__jit_load(dllm__module_rowwise(arch), a));
        BENCH_CHECK(dllm__jit_load(dllm__module_sampler(arch), b));
        BENCH_CHECK(dllm__jit_load(dllm__module_attention(arch, 128), c));
        if (arch.gemm_wg_stages) BENCH_CHECK(dllm__jit_load(dllm__module_gemm_wg(arch, 256), c));
    };
    {
        std::lock_guard<std::mutex> lk(dllm__jit_mutex);
        dllm__jit_modules.clear();
    }
    double t0 = dllm__now_ms();
    load_all();
    r.set("jit_cold_serial_s", (dllm__now_ms() - t0) / 1000);
    {
        std::lock_guard<std::mutex> lk(dllm__jit_mutex);
        dllm__jit_modules.clear();
    }
    t0 = dllm__now_ms();
    load_all();
    r.set("jit_warm_disk_s", (dllm__now_ms() - t0) / 1000);

    dllm_model *model = nullptr;
    BENCH_CHECK(dllm_model_load_random(config, 1, &model));
    size_t free0, total;
    cudaMemGetInfo(&free0, &total);
    dllm_ctx_params cp = bench_gpu_params();
    dllm_ctx *ctx = nullptr;
    t0 = dllm__now_ms();
    BENCH_CHECK(dllm_ctx_create(model, cp, &ctx));
    r.set("ctx_create_s", (dllm__now_ms() - t0) / 1000);
    r.set("weights_GB", dllm__device_bytes / 1e9);
    dllm__gpu_backend *gpu = (dllm__gpu_backend *)ctx->impl.get();
    const dllm__config &c = model->cfg;
    const double gemm_rate = r.v["bf16_gemm_8192_TFLOPs"];

    // Generations first, on fresh buffers: dllm's own peak memory for W1 is what they allocate.
    const int64_t weights_bytes = dllm__device_bytes;
    dllm__device_peak = weights_bytes;
    const int np = 768, gen = 256, block = 32;
    std::vector<int32_t> prompt(np), out(gen);
    for (int i = 0; i < np; i++) prompt[(size_t)i] = (i * 104729) % 100000;
    auto generate_on = [&](dllm_ctx *on, int steps, dllm_lacache mode) {
        dllm_gen_params gp = dllm_gen_default_params();
        gp.tuned_forwards = 1;  // LaCache's modes are dllm_generate's own forwards
        gp.gen_length = gen;
        gp.steps = steps;
        gp.block_length = block;
        gp.stop_at_eos = 0;
        gp.lacache = mode;
        dllm_gen_stats st;
        BENCH_CHECK(dllm_generate(on, prompt.data(), np, gp, out.data(), gen, nullptr, &st));
        return st;
    };
    auto generate = [&](int steps, dllm_lacache mode) { return generate_on(ctx, steps, mode); };
    // W1 with the dual cache and LaCache (the default) on a context, warmed up first: its wall time in seconds
    auto w1_dual_s = [&](dllm_ctx *on) {
        dllm_gen_params gp = dllm_gen_default_params();
        gp.gen_length = gen, gp.steps = gen, gp.block_length = block, gp.stop_at_eos = 0, gp.kv_cache = DLLM_KV_CACHE_DUAL;
        bench_warm(on, prompt, gp, out);
        dllm_gen_stats st;
        BENCH_CHECK(dllm_generate(on, prompt.data(), np, gp, out.data(), gen, nullptr, &st));
        return st.wall_ms / 1000;
    };
    generate(64, DLLM_LACACHE_ON);  // warm-up: GEMM tuning, module loading
    const char *mode_name[3] = {"off", "truncate", "lacache"};
    for (int steps : {256, 64})
        for (int mode = 0; mode < 3; mode++) {
            dllm_gen_stats st = generate(steps, (dllm_lacache)mode);
            std::string w = dllm__format("%s_%s", steps == 256 ? "W1" : "W1-64", mode_name[mode]);
            r.set(w + "_s", st.wall_ms / 1000);
            r.set(w + "_ms_per_step", st.wall_ms / st.steps);
            if (mode == 0) {
                double floor_s = st.steps * bench_flops(c, np + gen, np + gen) / (gemm_rate * 1e12);
                r.set(w + "_floor_fraction", floor_s / (st.wall_ms / 1000));
            }
            if (steps == 256 && mode == 0) {
                size_t free1;
                cudaMemGetInfo(&free1, &total);
                r.set("W1_peak_over_weights_GB", (double)(dllm__device_peak - weights_bytes) / 1e9);
                r.set("W1_device_used_over_weights_GB", ((double)free0 - (double)free1 - (double)weights_bytes) / 1e9);
            }
        }
    bench_lacache_components(r, gpu, c, np, gen, block, gemm_rate, r.v["copy_TBps"]);

    // Schedulers. Random weights are never confident, so threshold decoding commits one token per
    // step here (NFE = gen): its rows show the per-step cost; 64 steps stands in for ~4 tokens per step.
    struct sched_run { const char *name; int gen, steps; dllm_kv_cache kv; dllm_unmask unmask; dllm_dpad dpad; };
    const sched_run sched[] = {
        {"W1 dual", 256, 256, DLLM_KV_CACHE_DUAL, DLLM_UNMASK_SCHEDULE, DLLM_DPAD_OFF},
        {"W1 prefix", 256, 256, DLLM_KV_CACHE_PREFIX, DLLM_UNMASK_SCHEDULE, DLLM_DPAD_OFF},
        {"W1 threshold", 256, 256, DLLM_KV_CACHE_NONE, DLLM_UNMASK_THRESHOLD, DLLM_DPAD_OFF},
        {"W1 threshold+dual", 256, 256, DLLM_KV_CACHE_DUAL, DLLM_UNMASK_THRESHOLD, DLLM_DPAD_OFF},
        {"W1 DPad", 256, 256, DLLM_KV_CACHE_NONE, DLLM_UNMASK_SCHEDULE, DLLM_DPAD_GAUSSIAN},
        {"W1 threshold+dual+DPad", 256, 256, DLLM_KV_CACHE_DUAL, DLLM_UNMASK_THRESHOLD, DLLM_DPAD_GAUSSIAN},
        {"W1-64 dual", 256, 64, DLLM_KV_CACHE_DUAL, DLLM_UNMASK_SCHEDULE, DLLM_DPAD_OFF},
        {"gen512 dual", 512, 512, DLLM_KV_CACHE_DUAL, DLLM_UNMASK_SCHEDULE, DLLM_DPAD_OFF},
        {"gen512 threshold+dual+DPad", 512, 512, DLLM_KV_CACHE_DUAL, DLLM_UNMASK_THRESHOLD, DLLM_DPAD_GAUSSIAN},
    };
    std::vector<int32_t> out512(512);
    std::set<std::string> warmed;
    printf("\n| scheduler (LaCache on, random LLaDA-8B weights) | steps | NFE | s | generated tokens/s |\n|---|---|---|---|---|\n");
    for (const sched_run &sr : sched) {
        dllm_gen_params gp = dllm_gen_default_params();
        gp.gen_length = sr.gen, gp.steps = sr.steps, gp.block_length = block, gp.stop_at_eos = 0;
        gp.kv_cache = sr.kv, gp.unmask = sr.unmask, gp.dpad = sr.dpad;  // DPad: the paper's W=256 k=4 a=2 (defaults)
        // Steady state, as the anchors are timed: a first run of new shapes tunes their GEMMs (~0.2 s at W1's dual cache).
        if (warmed.insert(dllm__format("%d %d %d", sr.gen, (int)sr.kv, (int)sr.dpad)).second) bench_warm(ctx, prompt, gp, out512);
        dllm_gen_stats st;
        BENCH_CHECK(dllm_generate(ctx, prompt.data(), np, gp, out512.data(), 512, nullptr, &st));
        printf("| %s | %d | %d | %.3f | %.1f |\n", sr.name, st.steps, st.forwards, st.wall_ms / 1000, 1000.0 * sr.gen / st.wall_ms);
        r.v[std::string(sr.name) + "_s"] = st.wall_ms / 1000;
        r.v[std::string(sr.name) + "_nfe"] = st.forwards;
    }
    {
        double ms = bench_dual_block_step(r, gpu, c, 1024, 32), floor_ms = (double)weights_bytes / (r.v["copy_TBps"] * 1e9);
        r.set("dual_block32_N1024_step_ms", ms);
        r.set("dual_block32_N1024_weight_read_floor_ms", floor_ms);
        r.set("dual_block32_N1024_over_floor", ms / floor_ms);
    }

    for (int n : {256, 512, 1024, 2048}) {
        double ms = bench_forward_ms(gpu, n);
        double flops = bench_flops(c, n, n), floor_ms = flops / (gemm_rate * 1e9);
        r.set(dllm__format("fwd_full_N%d_ms", n), ms);
        r.set(dllm__format("fwd_full_N%d_TFLOPs", n), flops / ms / 1e9);
        r.set(dllm__format("fwd_full_N%d_floor_fraction", n), floor_ms / ms);
        if (n == 1024) bench_stages(r, gpu, n, "N1024 stage ");  // where the time goes: per-stage totals over the 32 layers
    }

    // FP8 (dllm_precision): contexts on the same random weights, quantised on the device at creation
    if (arch.fp8 != DLLM__FP8_NONE) {
        dllm_ctx_free(ctx);  // the BF16 context's 16 GB are not needed any more
        ctx = nullptr;
        for (dllm_precision prec : {DLLM_PRECISION_FP8_FFN, DLLM_PRECISION_FP8_ALL}) {
            const char *pn = prec == DLLM_PRECISION_FP8_FFN ? "fp8" : "fp8all";
            cp.precision = prec;
            dllm_ctx *ctx8 = nullptr;
            int64_t before = dllm__device_bytes;
            t0 = dllm__now_ms();
            BENCH_CHECK(dllm_ctx_create(model, cp, &ctx8));
            r.set(dllm__format("%s_ctx_create_s", pn), (dllm__now_ms() - t0) / 1000);
            r.set(dllm__format("%s_weights_GB", pn), (dllm__device_bytes - before) / 1e9);
            generate_on(ctx8, 64, DLLM_LACACHE_ON);  // warm-up
            for (int steps : {256, 64})
                for (int mode : {0, 2}) {
                    if (prec == DLLM_PRECISION_FP8_ALL && mode == 0) continue;
                    dllm_gen_stats st = generate_on(ctx8, steps, (dllm_lacache)mode);
                    r.set(dllm__format("%s_%s_%s_s", steps == 256 ? "W1" : "W1-64", pn, mode_name[mode]), st.wall_ms / 1000);
                }
            r.set(dllm__format("W1_%s_dual_s", pn), w1_dual_s(ctx8));  // the composition: FP8 + LaCache + dual cache
            dllm__gpu_backend *g8 = (dllm__gpu_backend *)ctx8->impl.get();
            r.set(dllm__format("%s_fwd_full_N1024_ms", pn), bench_forward_ms(g8, 1024));
            if (prec == DLLM_PRECISION_FP8_FFN) bench_stages(r, g8, 1024, "fp8 N1024 stage ");
            dllm_ctx_free(ctx8);
        }
    }

    // [SoloQ] the 4-bit precisions on the same random weights, quantised on the device at creation: time to quantise,
    // device memory, the dual-cache block step, the N=1024 forward and W1 with the dual cache (the GEMM paths:
    // q4_gemm serves GEMMs of at most 64 rows; larger ones run the INT8 GEMM in SoloQ-I / SoloQ-C and still dequantise
    // their weight rows to BF16 first in SoloQ-N)
    dllm_ctx_free(ctx);
    ctx = nullptr;
    for (dllm_precision prec : {DLLM_PRECISION_SOLOQ_N, DLLM_PRECISION_SOLOQ_I, DLLM_PRECISION_SOLOQ_C}) {
        const char *pn = dllm__precision_name(prec);
        cp.precision = prec;
        dllm_ctx *cq = nullptr;
        const int64_t before = dllm__device_bytes;
        t0 = dllm__now_ms();
        BENCH_CHECK(dllm_ctx_create(model, cp, &cq));
        r.set(dllm__format("%s_ctx_create_s", pn), (dllm__now_ms() - t0) / 1000);
        r.set(dllm__format("%s_weights_GB", pn), (dllm__device_bytes - before) / 1e9);
        dllm__gpu_backend *gq = (dllm__gpu_backend *)cq->impl.get();
        bench_result stages;
        r.set(dllm__format("%s_dual_block32_N1024_step_ms", pn), bench_dual_block_step(stages, gq, c, 1024, 32));
        r.set(dllm__format("%s_fwd_full_N1024_ms", pn), bench_forward_ms(gq, 1024));
        r.set(dllm__format("W1_%s_dual_s", pn), w1_dual_s(cq));
        dllm_ctx_free(cq);
    }
    bench_block_diffusion(r);
    bench_llada2(r, DLLM_PRECISION_BF16, false);

    std::map<std::string, double> a = bench_read_anchors(anchors, graphs);
    for (auto &kv : bench_read_anchors(anchors_v2, nullptr)) a.emplace(kv);  // torch_reference_v2.py's (block diffusion)
    printf("\n| workload | dllm | torch eager | ratio | torch graphs | ratio |\n|---|---|---|---|---|---|\n");
    auto row = [&](const char *name, double ours, const char *eager_key, const char *graph_key) {
        double e = a.count(eager_key) ? a[eager_key] : NAN, g = graph_key && a.count(graph_key) ? a[graph_key] : NAN;
        printf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f |\n", name, ours, e, ours / e, g, ours / g);
        if (e == e) r.v[std::string(name) + "_ratio_eager"] = ours / e;
        if (g == g) r.v[std::string(name) + "_ratio_graphs"] = ours / g;
    };
    row("fwd N=512 ms", r.v["fwd_full_N512_ms"], "fwd_full_N512_ms", "graph_fwd_full_N512_ms");
    row("fwd N=1024 ms", r.v["fwd_full_N1024_ms"], "fwd_full_N1024_ms", "graph_fwd_full_N1024_ms");
    row("fwd N=2048 ms", r.v["fwd_full_N2048_ms"], "fwd_full_N2048_ms", nullptr);
    row("W1 s (plain)", r.v["W1_off_s"], "gen_p768_g256_b32_s256_vanilla_s", nullptr);
    row("W1 s (truncation)", r.v["W1_truncate_s"], "gen_p768_g256_b32_s256_vanilla_s", nullptr);
    row("W1 s (LaCache)", r.v["W1_lacache_s"], "gen_p768_g256_b32_s256_vanilla_s", nullptr);
    row("W1-64 s (plain)", r.v["W1-64_off_s"], "gen_p768_g256_b32_s64_vanilla_s", nullptr);
    row("W1-64 s (LaCache)", r.v["W1-64_lacache_s"], "gen_p768_g256_b32_s64_vanilla_s", nullptr);
    row("dual block step ms (32 over 1024)", r.v["dual_block32_N1024_step_ms"], "fwd_dual_block32_N1024_ms", "graph_fwd_dual_block32_N1024_ms");
    row("W1 s (dual cache)", r.v["W1 dual_s"], "gen_p768_g256_b32_s256_dual_s", nullptr);
    row("W1 s (prefix cache)", r.v["W1 prefix_s"], "gen_p768_g256_b32_s256_prefix_s", nullptr);
    row("W1-64 s (dual cache)", r.v["W1-64 dual_s"], "gen_p768_g256_b32_s64_dual_s", nullptr);
    row("block-diffusion step ms (32 over 1024, 7B)", r.v["bd_block32_N1024_step_ms"], "v2_block_step_N1024_eager_ms", "v2_block_step_N1024_graph_ms");
    row("block-diffusion gen s (p512 g256, 7B)", r.v["bd_gen_p512_g256_s"], "v2_gen_p512_g256_b1_s", nullptr);
    if (r.v.count("W1_fp8_lacache_s")) {  // the target: W1 with LaCache + FP8 at most 0.45x the eager reference
        row("fwd N=1024 ms (FP8)", r.v["fp8_fwd_full_N1024_ms"], "fwd_full_N1024_ms", "graph_fwd_full_N1024_ms");
        row("W1 s (FP8, plain)", r.v["W1_fp8_off_s"], "gen_p768_g256_b32_s256_vanilla_s", nullptr);
        row("W1 s (FP8, LaCache)", r.v["W1_fp8_lacache_s"], "gen_p768_g256_b32_s256_vanilla_s", nullptr);
        row("W1 s (FP8 all, LaCache)", r.v["W1_fp8all_lacache_s"], "gen_p768_g256_b32_s256_vanilla_s", nullptr);
        row("W1-64 s (FP8, plain)", r.v["W1-64_fp8_off_s"], "gen_p768_g256_b32_s64_vanilla_s", nullptr);
        row("W1-64 s (FP8, LaCache)", r.v["W1-64_fp8_lacache_s"], "gen_p768_g256_b32_s64_vanilla_s", nullptr);
        row("W1 s (FP8, LaCache, dual cache)", r.v["W1_fp8_dual_s"], "gen_p768_g256_b32_s256_dual_s", nullptr);
        row("W1 s (FP8 all, LaCache, dual cache)", r.v["W1_fp8all_dual_s"], "gen_p768_g256_b32_s256_dual_s", nullptr);
        printf("\n| GEMM (M = 1024 unless said) | BF16 TFLOP/s | FP8 block-scaled TFLOP/s |\n|---|---|---|\n");
        printf("| 8192^3 (ceiling, same run) | %.0f | %.0f |\n", r.v["bf16_gemm_8192_TFLOPs"], r.v["fp8_gemm_8192_TFLOPs"]);
        printf("| LLaDA gate+up (N 24576, K 4096) | %.0f | %.0f |\n", r.v["bf16_gemm_ffn_gate_up_M1024_TFLOPs"], r.v["fp8_gemm_ffn_gate_up_M1024_TFLOPs"]);
        printf("| LLaDA down (N 4096, K 12288) | %.0f | %.0f |\n", r.v["bf16_gemm_ffn_down_M1024_TFLOPs"], r.v["fp8_gemm_ffn_down_M1024_TFLOPs"]);
    }
    printf("\n| SoloQ (LLaDA-8B shape) | quantise s | weights GB | dual step ms | x BF16 | fwd N=1024 ms | x BF16 | W1 dual s |\n|---|---|---|---|---|---|---|---|\n");
    for (const char *pn : {"soloq-n", "soloq-i", "soloq-c"}) {
        const std::string k = pn;
        if (!r.v.count(k + "_fwd_full_N1024_ms")) continue;
        const double step = r.v[k + "_dual_block32_N1024_step_ms"], fwd = r.v[k + "_fwd_full_N1024_ms"];
        printf("| %s | %.1f | %.2f | %.3f | %.2f | %.2f | %.2f | %.2f |\n", pn, r.v[k + "_ctx_create_s"], r.v[k + "_weights_GB"], step,
               step / r.v["dual_block32_N1024_step_ms"], fwd, fwd / r.v["fwd_full_N1024_ms"], r.v["W1_" + k + "_dual_s"]);
    }
    if (r.v.count("fp8_mma_gemm_ffn_down_M32_TFLOPs")) {  // DLLM_TILES=fp8_gemm=mma on sm_90, or sm_89
        printf("\n| FP8 GEMM TFLOP/s | dllm fp8_gemm (mma.sync) | cuBLASLt block-scaled |\n|---|---|---|\n");
        for (const char *shape : {"gate_up_M1024", "down_M1024", "gate_up_M32", "down_M32"}) {
            const std::string mma = dllm__format("fp8_mma_gemm_ffn_%s_TFLOPs", shape), lt = dllm__format("fp8_gemm_ffn_%s_TFLOPs", shape);
            printf("| LLaDA %s | %.0f | %s |\n", shape, r.v[mma], r.v.count(lt) ? dllm__format("%.0f", r.v[lt]).c_str() : "-");
        }
    }
    if (json_out) {
        std::string j = "{\n";
        for (auto &kv : r.v) j += dllm__format("  \"%s\": %.6g,\n", kv.first.c_str(), kv.second);
        j += dllm__format("  \"device\": \"%s\"\n}\n", prop.name);
        FILE *f = fopen(json_out, "w");
        if (f) { fputs(j.c_str(), f); fclose(f); }
    }
    dllm_ctx_free(ctx);
    dllm_model_free(model);
    return 0;
}
