/* Tests: the NVRTC JIT (no GPU needed: CI compiles every kernel for every architecture) and every GPU
 * kernel against its CPU twin on fresh random inputs of awkward sizes, outputs poisoned first. */

// ---- JIT (CPU only) ---------------------------------------------------------------------------------

/* Compiles rq for `target` with NVRTC (no GPU needed): no spill and, with no_stack, no stack frame; the cubin and the
 * lowered names come back for the caller's checks. */
static void test_compile_clean(dllm_test_state &T_, const dllm__jit_request &rq, const char *target, bool no_stack,
                               std::vector<char> &cubin, std::vector<std::string> &lowered) {
    std::string log;
    CHECK_STATUS(dllm__nvrtc_compile(rq, cubin, lowered, log), DLLM_OK, nullptr);
    if (no_stack)
        CHECK_MSG(!dllm__log_has_spills(log) && !dllm__log_reports(log, "stack frame"), "%s on %s:\n%s",
                  rq.name.c_str(), target, log.c_str());
    else
        CHECK_MSG(!dllm__log_has_spills(log), "%s spills on %s:\n%s", rq.name.c_str(), target, log.c_str());
}

/* Every module, every architecture of the table, both head dims (every kernel file of src/kernels/ is in one): compiles
 * without a warning or a spill, and the attention and GEMM kernels need no stack frame. */
TEST(jit, compiles_every_kernel_for_every_arch) {
    double worst_ms = 0;
    for (const dllm__arch &row : dllm__arch_table) {
        dllm__arch a = dllm__arch_for(row.cc);
        std::vector<dllm__jit_request> rqs = {dllm__module_rowwise(a), dllm__module_sampler(a),
                                              dllm__module_attention(a, 64), dllm__module_attention(a, 128),
                                              dllm__module_soloq(a)};
        if (a.cc == 80 || a.cc == 90) {  // the modules a context loads for a feature, on the two targets CI checks
            for (auto rq :
                 {dllm__module_q4_gemm(a), dllm__module_kv_scatter(a), dllm__module_attention_varlen(a, 128),
                  dllm__module_bdfa(a), dllm__module_kvq(a), dllm__module_kvq_tc(a, 128), dllm__module_moe(a)})
                rqs.push_back(rq);
            if (a.fp8 != DLLM__FP8_NONE) rqs.push_back(dllm__module_fp8_gemm(a));
            if (a.cc == 90) rqs.push_back(dllm__module_q4wg(a)), rqs.push_back(dllm__module_gemm_splitk(a));
        }
        if (a.gemm_wg_stages)  // every tile width (the batched forwards' choice)
            for (int bn : {256, 128, 64}) rqs.push_back(dllm__module_gemm_wg(a, bn));
        for (int bc : {64, 128})  // the wgmma attention's tiles and rings
            for (int stages : {2, 3}) {
                dllm__arch wide = a;
                wide.fa_wg_bc = bc;
                wide.fa_wg_stages = stages;
                if (a.cc != 90 || (a.fa_wg_bc == bc && a.fa_wg_stages == stages)) continue;
                rqs.push_back(dllm__module_attention(wide, 64));
                rqs.push_back(dllm__module_attention(wide, 128));
            }
        for (const dllm__jit_request &rq : rqs) {
            std::vector<char> cubin;
            std::vector<std::string> lowered;
            std::string log;
            double t0 = dllm__now_ms();
            CHECK_STATUS(dllm__nvrtc_compile(rq, cubin, lowered, log), DLLM_OK, nullptr);
            worst_ms = std::max(worst_ms, dllm__now_ms() - t0);
            CHECK_MSG(!dllm__log_has_spills(log), "%s spills on %s:\n%s", rq.name.c_str(), a.target, log.c_str());
            // warnings are errors: a kernel file's warning fails CI, which has no GPU
            CHECK_MSG(log.find("warning") == std::string::npos, "%s warns on %s:\n%s", rq.name.c_str(), a.target,
                      log.c_str());
            const bool gemm =
                rq.name.find("gemm_wg") != std::string::npos || rq.name.find("gemm_splitk") != std::string::npos;
            if (rq.name.find("attn") != std::string::npos || gemm)  // register arrays must stay in registers
                CHECK_MSG(!dllm__log_reports(log, "stack frame"), "%s has a stack frame on %s:\n%s", rq.name.c_str(),
                          a.target, log.c_str());
            if (gemm)  // ptxas serialises wgmma it cannot pipeline, and says so
                CHECK_MSG(log.find("serialized") == std::string::npos, "%s: wgmma serialised on %s:\n%s",
                          rq.name.c_str(), a.target, log.c_str());
            CHECK(lowered.size() == rq.kernels.size() && cubin.size() > 1000);
        }
    }
    printf("    slowest module compile: %.0f ms\n", worst_ms);
}

TEST(jit, compile_errors_reach_the_user_with_the_log) {
    dllm__jit_request rq = {
        "broken", "extern \"C\" __global__ void k(int *x) { x[0] = undefined_name; }", {"k"}, "sm_80"};
    std::vector<char> cubin;
    std::vector<std::string> lowered;
    std::string log;
    CHECK_STATUS(dllm__nvrtc_compile(rq, cubin, lowered, log), DLLM_ERR_JIT, "undefined_name");
    CHECK(strstr(dllm_last_error(), "broken") != nullptr && strstr(dllm_last_error(), "sm_80") != nullptr);
}

TEST(jit, disk_cache_round_trip) {
    test_tmpdir dir;
    test_setenv("DLLM_CACHE_DIR", dir.path.c_str(), 1);
    dllm__jit_request rq = dllm__module_rowwise(dllm__arch_for(90));
    uint64_t key = dllm__jit_key(rq);
    std::vector<char> a, b;
    std::vector<std::string> la, lb;
    double t0 = dllm__now_ms();
    CHECK_STATUS(dllm__jit_build(rq, key, a, la), DLLM_OK, nullptr);
    double cold = dllm__now_ms() - t0;
    t0 = dllm__now_ms();
    CHECK_STATUS(dllm__jit_build(rq, key, b, lb), DLLM_OK, nullptr);
    double warm = dllm__now_ms() - t0;
    CHECK(a == b && la == lb && !a.empty());
    printf("    cold %.0f ms, from disk %.1f ms\n", cold, warm);
    CHECK(warm < cold);
    // a corrupt cache file is ignored and rebuilt, never trusted
    std::string path = dllm__format("%s/%s-%016llx.bin", dir.path.c_str(), rq.name.c_str(), (unsigned long long)key);
    test_write_file(path, "garbage");
    CHECK_STATUS(dllm__jit_build(rq, key, b, lb), DLLM_OK, nullptr);
    CHECK(a == b);
    test_unsetenv("DLLM_CACHE_DIR");
}

TEST(jit, arch_table_and_overrides) {
    CHECK(strcmp(dllm__arch_for(90).target, "sm_90a") == 0 && dllm__arch_for(90).fa_br == 128 &&
          dllm__arch_for(90).fa_mt == 2);
    CHECK(strcmp(dllm__arch_for(89).target, "sm_89") == 0 && dllm__arch_for(89).fa_br == 64);
    CHECK(strcmp(dllm__arch_for(120).target, "sm_120") == 0);  // newer GPUs: portable mma.sync path
    test_setenv("DLLM_TILES", "fa_br=64", 1);
    CHECK(dllm__arch_for(90).fa_br == 64);
    test_unsetenv("DLLM_TILES");
    CHECK(dllm__arch_for(90).fa_stages == 2 &&
          dllm__attn_kernel_name(128, dllm__arch_for(90)) == "flash_attn<128,128,32,2,2>");
    test_setenv("DLLM_TILES", "fa_stages=3", 1);
    CHECK(dllm__arch_for(90).fa_stages == 3 &&
          dllm__attn_kernel_name(128, dllm__arch_for(90)) == "flash_attn<128,128,32,2,3>");
    test_setenv("DLLM_TILES", "fa_stages=1", 1);  // a ring needs two slots: clamped
    CHECK(dllm__arch_for(90).fa_stages == 2);
    test_unsetenv("DLLM_TILES");
    // The wgmma attention: sm_90a only; the override takes 0, 64 or 128 and nothing else.
    CHECK(dllm__arch_for(90).fa_wg_bc == 128 && dllm__arch_for(89).fa_wg_bc == 0 && dllm__arch_for(120).fa_wg_bc == 0);
    CHECK(dllm__module_attention(dllm__arch_for(90), 128).kernels.size() == 3 &&
          dllm__module_attention(dllm__arch_for(89), 128).kernels.size() == 2);
    test_setenv("DLLM_TILES", "fa_wg_bc=64", 1);
    CHECK(dllm__arch_for(90).fa_wg_bc == 64 && dllm__arch_for(89).fa_wg_bc == 0 &&
          dllm__attn_wide_name(128, dllm__arch_for(90)) == "flash_attn_wg<128,64,3>");
    test_setenv("DLLM_TILES", "fa_wg_bc=96", 1);
    CHECK(dllm__arch_for(90).fa_wg_bc == 128);
    test_setenv("DLLM_TILES", "fa_wg_bc=0", 1);
    CHECK(dllm__arch_for(90).fa_wg_bc == 0 && dllm__module_attention(dllm__arch_for(90), 128).kernels.size() == 2);
    test_unsetenv("DLLM_TILES");
    // gemm_wg: sm_90a only, off under gemm_wg off, its ring within a CTA's 227 KB at every tile width: the 128-wide
    // tiles' 32 KB stages give a ring of 6, the 64-wide's 24 KB one of 8 (one more would not fit); DLLM_TILES
    // batch_gemm_n takes 256, 128 or 64, anything else is 0.
    CHECK(dllm__arch_for(90).gemm_wg_stages == 4 && dllm__arch_for(89).gemm_wg_stages == 0 &&
          dllm__arch_for(120).gemm_wg_stages == 0);
    CHECK(dllm__gemm_wg_stages(dllm__arch_for(90), 256) == 4 && dllm__gemm_wg_stages(dllm__arch_for(90), 128) == 6 &&
          dllm__gemm_wg_stages(dllm__arch_for(90), 64) == 8);
    CHECK(dllm__gemm_wg_stages(dllm__arch_for(89), 128) == 0 && dllm__gemm_wg_stages(dllm__arch_for(89), 256) == 0);
    for (int bn : {256, 128, 64}) {
        const dllm__arch h = dllm__arch_for(90);
        CHECK(dllm__gemm_wg_smem(h, bn) <= 227 * 1024 &&
              dllm__gemm_wg_smem_of(dllm__gemm_wg_stages(h, bn) + 1, bn) > 227 * 1024);
    }
    CHECK(dllm__gemm_wg_smem(dllm__arch_for(90), 128) == 6 * 32768 + 2 * 16384 + 1024 + 6 * 16);
    CHECK(dllm__gemm_wg_name(dllm__arch_for(90), 256) == "gemm_wg<4,256>" &&
          dllm__gemm_wg_name(dllm__arch_for(90), 128) == "gemm_wg<6,128>" &&
          dllm__gemm_wg_name(dllm__arch_for(90), 64) == "gemm_wg<8,64>");
    CHECK(dllm__env().batch_gemm_n == 0);  // the fastest width per shape and row count
    test_setenv("DLLM_TILES", "batch_gemm_n=128", 1);
    CHECK(dllm__env().batch_gemm_n == 128);
    test_setenv("DLLM_TILES", "batch_gemm_n=256", 1);
    CHECK(dllm__env().batch_gemm_n == 256);
    test_setenv("DLLM_TILES", "batch_gemm_n=64", 1);
    CHECK(dllm__env().batch_gemm_n == 64);
    test_setenv("DLLM_TILES", "batch_gemm_n=96", 1);
    CHECK(dllm__env().batch_gemm_n == 0);
    test_unsetenv("DLLM_TILES");
    test_setenv("DLLM_TILES", "fa_br=64,batch_gemm_n=64,fp8_gemm=mma", 1);  // several at once
    CHECK(dllm__arch_for(90).fa_br == 64 && dllm__env().batch_gemm_n == 64 && dllm__env().fp8_gemm == "mma");
    test_unsetenv("DLLM_TILES");
    // the debug switch: cuBLASLt alone (no gemm_wg, nothing timed), no graphs, no PDL, no wgmma attention,
    // kvq_attention
    test_setenv("DLLM_DEBUG_PLAIN", "1", 1);
    CHECK(dllm__arch_for(90).gemm_wg_stages == 0 && dllm__gemm_wg_stages(dllm__arch_for(90), 128) == 0 &&
          dllm__arch_for(90).fa_wg_bc == 0);
    CHECK(dllm__env().no_graphs && !dllm__env().pdl && !dllm__env().gemm_autotune && !dllm__env().kvq_tc);
    test_unsetenv("DLLM_DEBUG_PLAIN");
    CHECK(dllm__arch_for(90).gemm_wg_stages == 4 && dllm__env().bd_graphs && dllm__env().kvq_tc);
    for (const dllm__arch &a : dllm__arch_table) {
        dllm__arch three = a;
        three.fa_wg_stages = 3;
        CHECK(dllm__attn_wide_smem(128, a) <= 227 * 1024 && dllm__attn_wide_smem(128, three) <= 227 * 1024);
        CHECK(dllm__attn_smem(128, a) <= (a.cc == 80 || a.cc == 90 ? 163 * 1024 : 99 * 1024));
        CHECK(a.fa_br % (16 * a.fa_mt) == 0 && a.fa_bc % 16 == 0);
    }
}

// ---- GPU kernels vs their CPU twins -----------------------------------------------------------------

static bool test_have_gpu() {
    std::string why;
    return dllm__gpu_usable(0, why);
}
#define NEED_GPU()                                   \
    do {                                             \
        if (!test_have_gpu()) SKIP("skipped (no GPU)"); \
    } while (0)

/* Fresh inputs every run; the seed is printed so a failure can be replayed. */
struct test_rng {
    uint64_t s;
    explicit test_rng(const char *what) {
        const char *e = getenv("DLLM_TEST_SEED");
        s = e ? strtoull(e, nullptr, 0) : (uint64_t)dllm__now_ms() * 2654435761ULL + (uint64_t)(uintptr_t)what;
        printf("    %s: DLLM_TEST_SEED=%llu\n", what, (unsigned long long)s);
    }
    uint64_t next() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; }
    float uniform() { return (float)((next() >> 40) * (1.0 / 16777216.0)); }
    float normal() {
        float u = std::max(uniform(), 1e-7f), v = uniform();
        return sqrtf(-2 * logf(u)) * cosf(6.2831853f * v);
    }
    int below(int n) { return (int)(next() % (uint64_t)n); }
};

struct test_gpu {
    dllm__arch arch;
    std::shared_ptr<dllm__module> rowwise, sampler;
    dllm_status init() {
        cudaDeviceProp p;
        DLLM__CUDA(cudaGetDeviceProperties(&p, 0));
        arch = dllm__arch_for(p.major * 10 + p.minor);
        DLLM__TRY(dllm__jit_load(dllm__module_rowwise(arch), rowwise));
        DLLM__TRY(dllm__jit_load(dllm__module_sampler(arch), sampler));
        return bind();
    }
    dllm__rowwise_kernels rw;  // typed by the kernel table
    dllm__sampler_kernels sm;
    dllm_status bind() {
        dllm__bind(rw, *rowwise);
        dllm__bind(sm, *sampler);
        return DLLM_OK;
    }
};

template <class T> static void test_put(dllm__dbuf &b, const std::vector<T> &v) {
    b.fit(v.size() * sizeof(T) + 16, "test");
    cudaMemcpy(b.ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
}
template <class T> static std::vector<T> test_get(const dllm__dbuf &b, size_t n) {
    std::vector<T> v(n);
    cudaDeviceSynchronize();
    cudaMemcpy(v.data(), b.ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
}
static void test_poison(dllm__dbuf &b, size_t bytes) {
    b.fit(bytes + 16, "test");
    cudaMemset(b.ptr, 0xFF, bytes);  // NaN in every float format: unwritten outputs cannot pass
}
static std::vector<uint16_t> test_bf16_vec(const std::vector<float> &v) {
    std::vector<uint16_t> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = dllm__f32_to_bf16(v[i]);
    return o;
}
static std::vector<float> test_f32_vec(const std::vector<uint16_t> &v) {
    std::vector<float> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = dllm__bf16_to_f32(v[i]);
    return o;
}
/* Largest |a - b| relative to max |b| (NaN counts as infinitely wrong). */
static double test_max_rel(const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < b.size(); i++) {
        if (a[i] != a[i]) return INFINITY;
        num = std::max(num, (double)fabsf(a[i] - b[i]));
        den = std::max(den, (double)fabsf(b[i]));
    }
    return den > 0 ? num / den : num;
}

/* The embedding gather, then add_rmsnorm in place on rows [row0, row0 + rows) of two sequences, launched as
 * dllm__gpu_backend::add_rmsnorm launches it. */
static void test_embed_norm_case(dllm_test_state &T_, test_gpu &g, test_rng &r, int d) {
    const int V = 37, B = 2, seq = 13, rows = 5, row0 = 4;
    std::vector<float> table((size_t)V * d), w(d), delta_f((size_t)B * seq * d);
    for (float &x : table) x = r.normal();
    for (float &x : w) x = 1 + 0.3f * r.normal();
    for (float &x : delta_f) x = r.normal();
    std::vector<uint16_t> table_b = test_bf16_vec(table), delta_b = test_bf16_vec(delta_f);
    std::vector<int> ids(B * seq);
    for (int &x : ids) x = r.below(V);
    dllm__dbuf dt, di, dh, dd, dw, dy;
    test_put(dt, table_b); test_put(di, ids); test_put(dd, delta_b); test_put(dw, w);
    test_poison(dh, (size_t)B * seq * d * 4);
    test_poison(dy, (size_t)B * rows * d * 2);
    int n = B * seq, dd_ = d, rows_ = rows, r0 = row0, s = seq;
    float eps = 1e-5f;
    CHECK_STATUS(g.rw.embed_gather.launch({dim3(n), dim3(128)}, 0, di.ptr, n, dt.ptr, dd_, dh.ptr), DLLM_OK, nullptr);
    std::vector<float> h = test_get<float>(dh, (size_t)n * d);
    bool exact = true;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < d; k++) exact &= h[(size_t)i * d + k] == dllm__bf16_to_f32(table_b[(size_t)ids[i] * d + k]);
    CHECK_MSG(exact, "d=%d: embedding gather is not exact", d);
    CHECK_STATUS(g.rw.add_rmsnorm.launch({dim3(rows, B), dim3(dllm__norm_threads(d / 8))}, 0, dh.ptr, dh.ptr, dd.ptr,
                                         dw.ptr, eps, dy.ptr, dd_, rows_, r0,
                                         s),  // residual in place
                 DLLM_OK, nullptr);
    std::vector<float> h2 = test_get<float>(dh, (size_t)n * d),
                       y = test_f32_vec(test_get<uint16_t>(dy, (size_t)B * rows * d));
    std::vector<float> want_h = h, want_y((size_t)B * rows * d);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < rows; i++) {
            size_t src = (size_t)b * seq + row0 + i;
            for (int k = 0; k < d; k++) want_h[src * d + k] += dllm__bf16_to_f32(delta_b[src * d + k]);
            dllm__cpu_rmsnorm(&want_h[src * d], 1, d, w.data(), eps, &want_y[((size_t)b * rows + i) * d]);
        }
    CHECK_MSG(h2 == want_h, "d=%d: residual add differs", d);
    double err = test_max_rel(y, want_y);
    printf("    rmsnorm d=%d max relative error %.2e\n", d, err);
    CHECK(err < 8e-3);
}

TEST(gpu, embed_and_add_rmsnorm_match_cpu) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("embed/rmsnorm");
    for (int d : {200, 9000})
        test_embed_norm_case(T_, g, r, d);  // 9000: over 1024 chunks, a second register slot partly used
}

/* rope_qkv with a bias (Dream's) and DPad's position table. */
static void test_rope_case(dllm_test_state &T_, test_gpu &g, test_rng &r, int hd) {
    const int H = 3, KV = 1, seq = 11, B = 3, rows = B * seq, heads = H + 2 * KV, pos0 = 5;
    std::vector<float> x((size_t)rows * heads * hd), bias((size_t)heads * hd), cos_t, sin_t;
    for (float &v : x) v = r.normal();
    for (float &v : bias) v = 0.5f * r.normal();
    dllm__rope_tables(1e6f, hd, 64, cos_t, sin_t);
    std::vector<uint16_t> xb = test_bf16_vec(x);
    dllm__dbuf dx, db, dc, ds;
    test_put(dx, xb); test_put(db, bias); test_put(dc, cos_t); test_put(ds, sin_t);
    // DPad's compacted canvas: row i of a sequence has the RoPE position table[i + pos0], not i + pos0
    std::vector<int> table(seq + pos0);
    for (int i = 0; i < seq + pos0; i++) table[i] = (i * 7 + 3) % 64;
    dllm__dbuf dpos;
    test_put(dpos, table);
    int rows_ = rows, seq_ = seq, p0 = pos0, h_ = H, kv_ = KV, hd_ = hd;
    CHECK_STATUS(g.rw.rope_qkv.launch({dllm__rows_grid(rows, heads * hd / 8, 32), dim3(32)}, 0, dx.ptr, rows_, seq_, p0,
                                      dpos.ptr, h_, kv_, hd_, db.ptr, dc.ptr, ds.ptr),
                 DLLM_OK, nullptr);
    std::vector<float> got = test_f32_vec(test_get<uint16_t>(dx, x.size()));
    std::vector<float> want = test_f32_vec(xb);
    std::vector<int32_t> pos(rows);
    for (int i = 0; i < rows; i++) pos[i] = table[i % seq + pos0];
    for (int i = 0; i < rows; i++)
        for (int c = 0; c < heads * hd; c++) want[(size_t)i * heads * hd + c] += bias[c];
    for (int i = 0; i < rows; i++)
        dllm__cpu_rope(&want[(size_t)i * heads * hd], 1, H + KV, hd, &pos[i], cos_t.data(), sin_t.data());
    double err = test_max_rel(got, want);
    printf("    rope head dim %d max relative error %.2e\n", hd, err);
    CHECK(err < 8e-3);
}

TEST(gpu, rope_and_swiglu_match_cpu) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("rope/swiglu");
    for (int hd : {64, 128}) test_rope_case(T_, g, r, hd);

    const int f = 120, n = 7;
    std::vector<float> gu((size_t)n * 2 * f);
    for (float &v : gu) v = 2 * r.normal();
    std::vector<uint16_t> gub = test_bf16_vec(gu);
    dllm__dbuf dg, dout;
    test_put(dg, gub);
    test_poison(dout, (size_t)n * f * 2);
    int n_ = n, f_ = f;
    CHECK_STATUS(g.rw.swiglu.launch({dllm__rows_grid(n, f / 8, 8), dim3(8)}, 0, dg.ptr, dout.ptr, n_, f_), DLLM_OK,
                 nullptr);
    std::vector<float> sg = test_f32_vec(test_get<uint16_t>(dout, (size_t)n * f)), sw((size_t)n * f);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < f; c++) {
            float gv = dllm__bf16_to_f32(gub[(size_t)i * 2 * f + c]),
                  uv = dllm__bf16_to_f32(gub[(size_t)i * 2 * f + f + c]);
            sw[(size_t)i * f + c] = dllm__silu(gv) * uv;
        }
    double err = test_max_rel(sg, sw);
    printf("    swiglu max relative error %.2e\n", err);
    CHECK(err < 8e-3);
}

/* The CPU twin of every BF16 GEMM: Y [M x N] = X [M x K] . W [N x K]^T on the bf16 operands, summed in float64. */
static std::vector<float> test_product_f64(const std::vector<uint16_t> &xb, const std::vector<uint16_t> &wb, int M,
                                           int N, int K) {
    const std::vector<float> xf = test_f32_vec(xb), wf = test_f32_vec(wb);
    std::vector<float> y((size_t)M * N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)xf[(size_t)i * K + k] * wf[(size_t)j * K + k];
            y[(size_t)i * N + j] = (float)s;
        }
    return y;
}

TEST(gpu, cublaslt_gemm_matches_cpu) {
    NEED_GPU();
    test_rng r("gemm");
    const int M = 37, N = 72, K = 136;
    std::vector<float> x((size_t)M * K), w((size_t)N * K);
    for (float &v : x) v = r.normal();
    for (float &v : w) v = r.normal();
    std::vector<uint16_t> xb = test_bf16_vec(x), wb = test_bf16_vec(w);
    dllm__dbuf dx, dw, dy, dy32;
    test_put(dx, xb); test_put(dw, wb);
    test_poison(dy, (size_t)M * N * 2);
    test_poison(dy32, (size_t)M * N * 4);
    dllm__gemm gemm;
    CHECK_STATUS(gemm.init(), DLLM_OK, nullptr);
    CHECK_STATUS(gemm.run(dx.ptr, dw.ptr, dy.ptr, M, N, K, CUDA_R_16BF, 0), DLLM_OK, nullptr);
    CHECK_STATUS(gemm.run(dx.ptr, dw.ptr, dy32.ptr, M, N, K, CUDA_R_32F, 0), DLLM_OK, nullptr);
    const std::vector<float> want = test_product_f64(xb, wb, M, N, K);
    double e16 = test_max_rel(test_f32_vec(test_get<uint16_t>(dy, (size_t)M * N)), want),
           e32 = test_max_rel(test_get<float>(dy32, (size_t)M * N), want);
    printf("    bf16 out %.2e, fp32 out %.2e\n", e16, e32);
    CHECK(e16 < 8e-3 && e32 < 1e-5);
}

/* gemm_wg (sm_90a) against the float64 product of the same bf16 operands at awkward shapes (rows past a tile, an odd
 * number of m-tiles, K not a multiple of 64, one row, more tile pairs than clusters); outputs poisoned, with a
 * poisoned row past the end that must stay so. Then the properties the backend relies on: a run repeats its bits,
 * and the first rows computed alone carry the bits they have among all (row-independence). */
static void test_gemm_wg_case(dllm_test_state &T_, const dllm__gemm_wg &k, test_rng &r, int M, int N, int K) {
    std::vector<float> x((size_t)M * K), w((size_t)N * K);
    for (float &v : x) v = r.normal();
    for (float &v : w) v = r.normal() * 0.1f;
    std::vector<uint16_t> xb = test_bf16_vec(x), wb = test_bf16_vec(w);
    dllm__dbuf dx, dw, dy, dy2, dy_few;
    test_put(dx, xb);
    test_put(dw, wb);
    const size_t out = (size_t)M * N, guard = (size_t)N;
    test_poison(dy, (out + guard) * 2);
    test_poison(dy2, out * 2);
    const int few = std::min(M, 37);
    test_poison(dy_few, (size_t)few * N * 2);
    CHECK_STATUS(dllm__gemm_wg_run(k, dx.ptr, dw.ptr, dy.ptr, M, N, K, 0), DLLM_OK, nullptr);
    CHECK_STATUS(dllm__gemm_wg_run(k, dx.ptr, dw.ptr, dy2.ptr, M, N, K, 0), DLLM_OK, nullptr);
    CHECK_STATUS(dllm__gemm_wg_run(k, dx.ptr, dw.ptr, dy_few.ptr, few, N, K, 0), DLLM_OK, nullptr);
    std::vector<uint16_t> got = test_get<uint16_t>(dy, out + guard), again = test_get<uint16_t>(dy2, out),
                          alone = test_get<uint16_t>(dy_few, (size_t)few * N);
    const std::vector<float> want = test_product_f64(xb, wb, M, N, K);
    const double err = test_max_rel(test_f32_vec(std::vector<uint16_t>(got.begin(), got.begin() + (long)out)), want);
    bool guard_kept = true, repeats = memcmp(got.data(), again.data(), out * 2) == 0,
         independent = memcmp(got.data(), alone.data(), (size_t)few * N * 2) == 0;
    for (size_t i = out; i < out + guard; i++) guard_kept = guard_kept && got[i] == 0xFFFF;
    printf("    M=%d N=%d K=%d: max relative error %.2e%s%s%s\n", M, N, K, err,
           guard_kept ? "" : ", WROTE PAST THE END", repeats ? "" : ", NOT REPEATABLE",
           independent ? "" : ", ROWS DEPEND ON M");
    CHECK(err < 8e-3 && guard_kept && repeats && independent);
}

/* Every tile width (256, 128 and 64: the batched forwards take whichever is fastest for the shape and row count). */
TEST(gpu, gemm_wg_matches_cpu) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("gemm_wg");
    for (int bn : {256, 128, 64}) {
        dllm__gemm_wg k;
        CHECK_STATUS(dllm__gemm_wg_load(g.arch, bn, k), DLLM_OK, nullptr);
        if (!k.kernel.fn) SKIP("skipped (gemm_wg is sm_90a's, with a driver that encodes TMA tensor maps)");
        printf("    tiles %d wide:\n", bn);
        test_gemm_wg_case(T_, k, r, 333, 512, 200);         // 3 m-tiles: the last pair's second tile repeats the first
        test_gemm_wg_case(T_, k, r, 1, 256, 8);
        test_gemm_wg_case(T_, k, r, 130, 768, 136);
        test_gemm_wg_case(T_, k, r, 600, 256, 4096);        // 64 k-steps: the ring wraps many times
        test_gemm_wg_case(T_, k, r, 1100, 67 * 256,
                          72);  // 5 x 67 tile pairs for at most 66 clusters: clusters walk several
        if (bn <= 128) {                                    // N an odd multiple of bn: a last column tile of its own
            test_gemm_wg_case(T_, k, r, 333, 3 * bn, 200);
            test_gemm_wg_case(T_, k, r, 1, bn, 8);
            test_gemm_wg_case(T_, k, r, 1100, 67 * bn, 72);
            test_gemm_wg_case(T_, k, r, 130, 9 * bn,
                              4104);  // the ring (6 stages at 128, 8 at 64) wraps with a part k-step last
        }
        // Shapes it cannot run are refused, not computed wrong.
        dllm__dbuf dx, dy;
        test_poison(dx, 1 << 16);
        test_poison(dy, 1 << 16);
        if (bn == 256)
            CHECK_STATUS(dllm__gemm_wg_run(k, dx.ptr, dx.ptr, dy.ptr, 4, 384, 64, 0), DLLM_ERR_INTERNAL, "cannot run");
        if (bn >= 128)
            CHECK_STATUS(dllm__gemm_wg_run(k, dx.ptr, dx.ptr, dy.ptr, 4, 192, 64, 0), DLLM_ERR_INTERNAL, "cannot run");
        CHECK_STATUS(dllm__gemm_wg_run(k, dx.ptr, dx.ptr, dy.ptr, 4, 96, 64, 0), DLLM_ERR_INTERNAL, "cannot run");
        CHECK_STATUS(dllm__gemm_wg_run(k, dx.ptr, dx.ptr, dy.ptr, 4, 256, 12, 0), DLLM_ERR_INTERNAL, "cannot run");
        CHECK_STATUS(dllm__gemm_wg_run(k, (char *)dx.ptr + 8, dx.ptr, dy.ptr, 4, 256, 64, 0), DLLM_ERR_INTERNAL,
                     "cannot run");
    }
}

/* The batched forwards pick gemm_wg's width by row count (dllm__batch_gemm_width), which keeps batch invariance only
 * because the widths give every output the same bits (128 and 64 against 256): compared here at awkward shapes (one
 * row, rows past a tile, K not a multiple of 64, a part k-step after many ring wraps, more tiles than clusters),
 * outputs poisoned. */
TEST(gpu, gemm_wg_widths_give_the_same_bits) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    dllm__gemm_wg wide, narrow, n64;
    CHECK_STATUS(dllm__gemm_wg_load(g.arch, 256, wide), DLLM_OK, nullptr);
    CHECK_STATUS(dllm__gemm_wg_load(g.arch, 128, narrow), DLLM_OK, nullptr);
    CHECK_STATUS(dllm__gemm_wg_load(g.arch, 64, n64), DLLM_OK, nullptr);
    if (!wide.kernel.fn || !narrow.kernel.fn || !n64.kernel.fn)
        SKIP("skipped (gemm_wg is sm_90a's, with a driver that encodes TMA tensor maps)");
    test_rng r("gemm_wg widths");
    const int shapes[][3] = {{1, 256, 8},       {37, 512, 200},       {333, 768, 4104},
                             {130, 4096, 1000}, {1100, 67 * 256, 72}, {2049, 1024, 520}};
    for (const auto &s : shapes) {
        const int M = s[0], N = s[1], K = s[2];
        std::vector<float> x((size_t)M * K), w((size_t)N * K);
        for (float &v : x) v = r.normal();
        for (float &v : w) v = r.normal() * 0.1f;
        dllm__dbuf dx, dw, dy_wide;
        test_put(dx, test_bf16_vec(x));
        test_put(dw, test_bf16_vec(w));
        test_poison(dy_wide, (size_t)M * N * 2);
        CHECK_STATUS(dllm__gemm_wg_run(wide, dx.ptr, dw.ptr, dy_wide.ptr, M, N, K, 0), DLLM_OK, nullptr);
        const std::vector<uint16_t> a = test_get<uint16_t>(dy_wide, (size_t)M * N);
        for (const dllm__gemm_wg *k : {&narrow, &n64}) {
            dllm__dbuf dy;
            test_poison(dy, (size_t)M * N * 2);
            CHECK_STATUS(dllm__gemm_wg_run(*k, dx.ptr, dw.ptr, dy.ptr, M, N, K, 0), DLLM_OK, nullptr);
            const std::vector<uint16_t> b = test_get<uint16_t>(dy, (size_t)M * N);
            size_t differ = 0;
            for (size_t i = 0; i < a.size(); i++) differ += a[i] != b[i];
            printf("    M=%d N=%d K=%d: %zu of %zu outputs differ between the 256- and %d-wide tiles\n", M, N, K,
                   differ, a.size(), k->bn);
            CHECK_MSG(differ == 0, "M=%d N=%d K=%d: %zu outputs differ at %d wide", M, N, K, differ, k->bn);
        }
    }
}

/* Attention on fused projection rows: B = 2, awkward lengths, GQA, a padding mask, both head dims, and
 * the block-last tile order (which only reorders the sum). */
/* Queries are the rows [q0, q0 + q_rows) of each sequence (a K/V-cache step when q_rows < seq), keys every row. */
/* The attention kernels of head dim hd, loaded and ready to launch. */
static dllm__attn_kernels test_attn_kernels(dllm_test_state &T_, test_gpu &g, int hd) {
    std::shared_ptr<dllm__module> mod;
    CHECK_STATUS(dllm__jit_load(dllm__module_attention(g.arch, hd), mod), DLLM_OK, nullptr);
    dllm__attn_kernels k;
    if (mod) CHECK_STATUS(dllm__attn_kernels_of(*mod, g.arch, hd, k), DLLM_OK, nullptr);
    return k;
}

/* Queries are the rows [q0, q0 + q_rows) of each sequence (a K/V-cache step when q_rows < seq), keys every row;
 * splits > 1 runs split-KV with that many shares (more shares than tiles leaves some empty); wide runs
 * flash_attn_wg (the caller makes sure the table has it), twice: it must repeat its bits. */
static void test_attention_case(dllm_test_state &T_, test_gpu &g, test_rng &r, int hd, int seq, int H, int KV,
                                const int *block, int q0 = 0, int q_rows = 0, int splits = 1, bool wide = false) {
    if (q_rows == 0) q_rows = seq;
    const int B = 2, heads = H + 2 * KV, stride = heads * hd;
    dllm__attn_kernels k = test_attn_kernels(T_, g, hd);
    if (!k.attn.fn || (wide && !k.wide.fn)) return;
    std::vector<float> qkv((size_t)B * seq * stride);
    for (float &v : qkv) v = r.normal();
    std::vector<uint16_t> qkvb = test_bf16_vec(qkv);
    std::vector<unsigned char> valid((size_t)B * seq, 1);
    for (int i = 0; i < seq / 5; i++) valid[(size_t)seq + r.below(seq)] = 0;  // padding in the second sequence
    dllm__dbuf dq, dv, dout, dst, dpart;
    test_put(dq, qkvb); test_put(dv, valid);
    test_poison(dout, (size_t)B * q_rows * H * hd * 2);
    test_poison(dpart, (size_t)splits * B * H * q_rows * (hd + 2) * 4);
    int st[16] = {0};
    if (block) { st[0] = block[0]; st[1] = block[1]; }
    test_put(dst, std::vector<int>(st, st + 16));
    attn_args a = {dq.as<bf16_t>() + (size_t)q0 * stride,
                   dq.as<bf16_t>() + (size_t)H * hd,
                   dq.as<bf16_t>() + (size_t)(H + KV) * hd,
                   dout.as<bf16_t>(),
                   dv.as<unsigned char>(),
                   seq,
                   q_rows,
                   stride,
                   stride,
                   H * hd,
                   H / KV,
                   (uint64_t)seq * stride,
                   (uint64_t)q_rows * H * hd,
                   dst.as<dllm_step_state>(),
                   1.4426950408889634f / sqrtf((float)hd),
                   0,
                   nullptr,
                   splits,
                   dpart.as<float>(),
                   0,
                   0,
                   nullptr,
                   nullptr,
                   nullptr,
                   nullptr,
                   nullptr};
    CHECK_STATUS(dllm__attn_launch(k, g.arch, hd, H, B, a, 0, wide), DLLM_OK, nullptr);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<uint16_t> first = test_get<uint16_t>(dout, (size_t)B * q_rows * H * hd);
    if (wide) {
        test_poison(dout, (size_t)B * q_rows * H * hd * 2);
        CHECK_STATUS(dllm__attn_launch(k, g.arch, hd, H, B, a, 0, wide), DLLM_OK, nullptr);
        CHECK_MSG(test_get<uint16_t>(dout, first.size()) == first,
                  "flash_attn_wg hd=%d seq=%d: a second run gave other bits", hd, seq);
    }
    std::vector<float> got = test_f32_vec(first), want(got.size());
    std::vector<float> xf = test_f32_vec(qkvb);
    dllm__pool pool(1);
    for (int b = 0; b < B; b++) {
        std::vector<float> q((size_t)seq * H * hd), kk((size_t)seq * KV * hd), vv((size_t)seq * KV * hd);
        for (int i = 0; i < seq; i++) {
            const float *row = &xf[((size_t)b * seq + i) * stride];
            std::copy(row, row + H * hd, &q[(size_t)i * H * hd]);
            std::copy(row + H * hd, row + (H + KV) * hd, &kk[(size_t)i * KV * hd]);
            std::copy(row + (H + KV) * hd, row + heads * hd, &vv[(size_t)i * KV * hd]);
        }
        dllm__cpu_attention(pool, q.data() + (size_t)q0 * H * hd, kk.data(), vv.data(), q_rows, seq, H, KV, hd,
                            &valid[(size_t)b * seq], &want[(size_t)b * q_rows * H * hd]);
    }
    double err = test_max_rel(got, want);
    printf("    attention%s hd=%d seq=%d H=%d KV=%d queries [%d,%d)%s, %d KV share(s): max relative error %.2e\n",
           wide ? " (wgmma)" : "", hd, seq, H, KV, q0, q0 + q_rows, block ? " (block tiles last)" : "", splits, err);
    CHECK_MSG(err < 2e-2, "attention hd=%d seq=%d error %.3e", hd, seq, err);
}

/* The cases below on the table's K/V ring and on rings of 3 and 4 slots (3: a slot index that wraps unevenly). */
static void test_attention_cases(dllm_test_state &T_, test_gpu &g, test_rng &r);

TEST(gpu, flash_attention_matches_cpu) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("attention");
    const dllm__arch table = g.arch;
    for (int stages : {table.fa_stages, 3, 4}) {
        g.arch.fa_stages = stages;
        printf("    K/V ring of %d tiles\n", stages);
        test_attention_cases(T_, g, r);
    }
    g.arch = table;
}

static void test_attention_cases(dllm_test_state &T_, test_gpu &g, test_rng &r) {
    int block[2] = {70, 101};
    test_attention_case(T_, g, r, 64, 77, 4, 2, nullptr);
    test_attention_case(T_, g, r, 128, 77, 2, 2, nullptr);
    test_attention_case(T_, g, r, 128, 300, 4, 1, block);
    test_attention_case(T_, g, r, 64, 1, 3, 3, nullptr);
    test_attention_case(T_, g, r, 128, 300, 4, 2, block, 70, 31);   // dual cache: the block's rows over every key
    test_attention_case(T_, g, r, 64, 203, 2, 1, nullptr, 95, 108);  // prefix cache: the block and the suffix
    test_attention_case(T_, g, r, 128, 300, 4, 2, block, 70, 31, 3);   // split-KV: 10 tiles in shares of 4, 4, 2
    test_attention_case(T_, g, r, 64, 203, 2, 1, nullptr, 95, 108, 5);
    test_attention_case(T_, g, r, 128, 40, 3, 1, nullptr, 9, 17, 4);    // more shares than tiles: empty shares
}

/* flash_attn_wg (sm_90a) at both key tiles: partial query tiles (a warpgroup with no live row), partial and
 * padded key tiles, GQA, one key, several query tiles. */
TEST(gpu, flash_attention_wgmma_matches_cpu) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    if (g.arch.cc != 90) SKIP("skipped (the wgmma attention is sm_90a's)");
    test_rng r("attention_wgmma");
    const dllm__arch table = g.arch;
    for (int bc : {64, 128})
        for (int stages : {2, 3}) {
            g.arch.fa_wg_bc = bc;
            g.arch.fa_wg_stages = stages;
            printf("    key tile %d, ring of %d\n", bc, stages);
            test_attention_case(T_, g, r, 128, 77, 2, 2, nullptr, 0, 0, 1, true);
            test_attention_case(T_, g, r, 64, 77, 4, 2, nullptr, 0, 0, 1, true);
            test_attention_case(T_, g, r, 128, 300, 4, 1, nullptr, 0, 0, 1, true);
            test_attention_case(T_, g, r, 64, 1, 3, 3, nullptr, 0, 0, 1, true);
            test_attention_case(T_, g, r, 128, 150, 2, 2, nullptr, 0, 0, 1,
                                true);  // second query tile: rows 128-149, one live warpgroup
            test_attention_case(T_, g, r, 128, 203, 2, 1, nullptr, 95, 108, 1,
                                true);  // prefix cache: the block and the suffix
            test_attention_case(T_, g, r, 128, 1000, 2, 2, nullptr, 0, 0, 1, true);  // 8 tiles: every ring slot reused
        }
    g.arch = table;
}

/* The split the backend chooses: one share for grids that fill the GPU, at least two tiles per share. */
TEST(jit, attention_kv_splits_fill_the_gpu) {
    const dllm__arch a = dllm__arch_for(90);
    CHECK(dllm__attn_kv_splits(a, 1024, 1024, 32, 132) == 1);            // a full forward: one share
    const int dual = dllm__attn_kv_splits(a, 32, 1024, 32, 132);        // a dual-cache block step of LLaDA-8B
    CHECK(dual > 1 && 32 * dual <= 2 * 132 && (1024 / a.fa_bc) / dual >= 2);
    CHECK(dllm__attn_kv_splits(a, 32, 40, 32, 132) == 1);               // two tiles: nothing to share
    CHECK((size_t)dual * 32 * 32 * (128 + 2) * 4 <= dllm__attn_partial_bound(a, 128, 132));
    // DLLM_TILES fa_kv_ctas moves the target; the partial-state buffer bound follows it, and nonsense is clamped to 1.
    test_setenv("DLLM_TILES", "fa_kv_ctas=4", 1);
    const dllm__arch four = dllm__arch_for(90);
    const int more = dllm__attn_kv_splits(four, 32, 1024, 32, 132);
    CHECK(four.fa_kv_ctas_per_sm == 4 && more > dual &&
          (size_t)more * 32 * 32 * (128 + 2) * 4 <= dllm__attn_partial_bound(four, 128, 132));
    test_setenv("DLLM_TILES", "fa_kv_ctas=-3", 1);  // not understood: the table's value stays, and it is reported
    CHECK(dllm__arch_for(90).fa_kv_ctas_per_sm == dllm__arch_table[4].fa_kv_ctas_per_sm &&
          dllm__env().tiles_error == "fa_kv_ctas=-3");
    test_setenv("DLLM_TILES", "fa_kv_ctas=0", 1);  // 0: the table's
    CHECK(dllm__arch_for(90).fa_kv_ctas_per_sm == dllm__arch_table[4].fa_kv_ctas_per_sm &&
          dllm__env().tiles_error.empty());
    test_unsetenv("DLLM_TILES");
}

/* The sampler kernels against dllm__choose and dllm__select on the same float logits, with a small
 * vocabulary slice so that the cross-CTA combine is exercised. */
struct test_filters {
    int top_k = 0;
    float top_p = 1, min_p = 0;
};

static void test_sampler_case(dllm_test_state &T_, test_gpu &g, test_rng &r, double temp, bool random, float cfg,
                              bool eos_opts, int shift0, test_filters f = test_filters()) {
    const int V = 1000, rows = 9, slice = 128, slices = (V + slice - 1) / slice, pos0 = 40, k_steps = 3;
    std::vector<float> cond((size_t)(rows + 1) * V), uncond(cond.size());
    for (float &v : cond) v = 3 * r.normal();
    for (float &v : uncond) v = 3 * r.normal();
    const int eos = 7, eot = 9;
    for (int i = 0; i <= rows; i++) cond[(size_t)i * V + eos] += 6;  // EOS often wins: exercises the options
    dllm__dbuf dc, du, dp, dx, dconf, ddef, dstate, dcanvas, dcomm;
    test_put(dc, cond); test_put(du, uncond);
    test_poison(dp, (size_t)rows * slices * sizeof(conf_partial));
    test_poison(dx, rows * 4); test_poison(dconf, rows * 8); test_poison(ddef, rows);
    int st[16] = {0, pos0 + rows, k_steps, 1, 17, 0, 0};
    std::vector<int> canvas(pos0 + rows, 5);
    int n_masks = 0;
    for (int i = 0; i < rows; i++)
        if (r.below(3)) { canvas[pos0 + i] = 999; n_masks++; }
    st[5] = n_masks;
    test_put(dstate, std::vector<int>(st, st + 16));
    test_put(dcanvas, canvas);
    test_poison(dcomm, rows * 4);
    sampler_args a = {dc.as<float>(),
                      cfg > 0 ? du.as<float>() : nullptr,
                      cfg + 1,
                      V,
                      slice,
                      slices,
                      rows,
                      pos0,
                      0,
                      shift0,
                      rows + 1,
                      temp,
                      12345,
                      eos_opts,
                      eos,
                      eot,
                      eos_opts,
                      random,
                      0,
                      0.0,
                      f.top_k,
                      f.top_p,
                      f.min_p,
                      nullptr};
    dllm__dbuf dcut;
    dllm__sampling s;
    s.temperature = temp; s.remasking = random ? DLLM_REMASK_RANDOM : DLLM_REMASK_LOW_CONFIDENCE; s.seed = 12345;
    s.eos_logit_inf = eos_opts; s.defer_eos_eot = eos_opts; s.eos_id = eos; s.eot_id = eot;
    s.top_k = f.top_k, s.top_p = f.top_p, s.min_p = f.min_p;
    auto cpu_row = [&](int i) {  // the logits the CPU sampler sees for sampler row i
        int lr = shift0 ? std::max(i - 1, 0) : i;
        std::vector<float> l(cond.begin() + (long)lr * V, cond.begin() + (long)(lr + 1) * V);
        if (cfg > 0)
            for (int v = 0; v < V; v++)
                l[v] = uncond[(size_t)lr * V + v] + (cfg + 1) * (l[v] - uncond[(size_t)lr * V + v]);
        return l;
    };
    if (s.filters()) {
        test_poison(dcut, rows * 4);
        a.cutoff = dcut.as<float>();
        CHECK_STATUS(g.sm.row_cutoff_kernel.launch({dim3(rows), dim3(256)}, 0, a, dcut.ptr), DLLM_OK, nullptr);
        std::vector<float> cut = test_get<float>(dcut, rows);
        for (int i = 0; i < rows; i++) {
            std::vector<float> l = cpu_row(i);
            if (eos_opts) l[eos] = -INFINITY;
            float want = dllm__row_cutoff(l, s);
            int kept = 0;
            for (float x : l) kept += x >= want;
            CHECK_MSG(cut[i] == want, "row %d: GPU cutoff %.9g, CPU %.9g (%d kept; top_k %d top_p %g min_p %g T %g)", i,
                      cut[i], want, kept, f.top_k, f.top_p, f.min_p, temp);
        }
    }
    CHECK_STATUS(g.sm.conf_partial_kernel.launch({dim3(slices, rows), dim3(256)}, 0, a, dstate.ptr, dp.ptr), DLLM_OK,
                 nullptr);
    CHECK_STATUS(
        g.sm.conf_combine_kernel.launch({dim3(1), dim3(128)}, 0, a, dstate.ptr, dp.ptr, dx.ptr, dconf.ptr, ddef.ptr),
        DLLM_OK, nullptr);
    std::vector<int> x0 = test_get<int>(dx, rows);
    std::vector<double> conf = test_get<double>(dconf, rows);
    std::vector<unsigned char> def = test_get<unsigned char>(ddef, rows);
    std::vector<dllm__choice> ch;
    std::vector<int32_t> cand;
    int same = 0;
    for (int i = 0; i < rows; i++) {
        std::vector<float> l = cpu_row(i);
        dllm__choice c = dllm__choose(l.data(), V, s, (uint32_t)(pos0 + i), 17);
        bool ok = c.token == x0[i] && fabs(c.conf - conf[i]) <= 1e-5 * fabs(c.conf) && c.deferred == (def[i] != 0);
        if (!ok)
            printf("    row %d: cpu (%d, %.17g, %d) gpu (%d, %.17g, %d)\n", i, c.token, c.conf, c.deferred, x0[i],
                   conf[i], def[i]);
        same += ok;
        if (canvas[pos0 + i] == 999) { cand.push_back(pos0 + i); ch.push_back({x0[i], conf[i], def[i] != 0}); }
    }
    CHECK_MSG(same == rows, "T=%g random=%d cfg=%g eos=%d shift=%d: %d of %d rows agree", temp, random, cfg, eos_opts,
              shift0, same, rows);
    // select_commit vs dllm__select on the GPU's own proposals, under each unmasking rule
    const int k = dllm__transfer_count(n_masks, k_steps, 1);
    for (int rule = DLLM_UNMASK_SCHEDULE; rule <= DLLM_UNMASK_FACTOR; rule++) {
        test_put(dcanvas, canvas);
        test_put(dstate, std::vector<int>(st, st + 16));
        test_poison(dcomm, rows * 4);
        int lo = pos0, mask = 999;
        double threshold = 0.35, factor = 1.5, eps = 1e-3;
        CHECK_STATUS(g.sm.select_commit.launch({dim3(1), dim3(1024), (size_t)rows * 5}, 0, dcanvas.ptr, dstate.ptr, lo,
                                               lo, dx.ptr, dconf.ptr, ddef.ptr, mask, dcomm.ptr, rule, threshold,
                                               factor, eps),
                     DLLM_OK, nullptr);
        std::vector<int> canvas_gpu = test_get<int>(dcanvas, canvas.size()), st_gpu = test_get<int>(dstate, 16);
        dllm__unmask_rule u;
        u.kind = (dllm_unmask)rule, u.threshold = threshold, u.factor = factor;
        std::vector<int> want = canvas, sel = dllm__select(cand, ch, u, k);
        for (int i : sel) want[(size_t)cand[(size_t)i]] = ch[(size_t)i].token;
        CHECK_MSG(canvas_gpu == want,
                  "select_commit differs from dllm__select (rule %d, k=%d, %zu committed on the CPU)", rule, k,
                  sel.size());
        CHECK(st_gpu[3] == 2 && st_gpu[4] == 18 && st_gpu[6] == (int)sel.size() &&
              st_gpu[7] == n_masks - (int)sel.size());
    }
}

TEST(gpu, sampler_matches_cpu_choose_and_select) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("sampler");
    test_sampler_case(T_, g, r, 0.0, false, 0, false, 0);
    test_sampler_case(T_, g, r, 0.8, false, 0, false, 0);
    test_sampler_case(T_, g, r, 0.0, true, 0, true, 0);
    test_sampler_case(T_, g, r, 1.3, true, 1.5f, true, 1);
    test_sampler_case(T_, g, r, 0.0, false, 0.5f, true, 1);
}

// ---- head dims other than 64 and 128 (issue 22, item 6) ---------------------------------------------

/* The attention module of every head dim shape class (not a multiple of 16: 24, 40, 72, 232; chunks that do not
 * divide the threads: 40, 72, 96, 160, 232; above 128: 160, 232, 256; 232 is the generic copy loop at its largest,
 * where it spilled while unrolled) on every architecture of the table, with the tiles the backend picks for it:
 * compiles, no spills, no stack frame, no flash_attn_wg, shared memory within the opt-in limit. Head dims 64 and 128
 * keep the table's tiles (compiled by jit.compiles_every_kernel_for_every_arch). Every multiple of 8 up to 256 was
 * compiled this way once (160 modules, 50 s): all clean. */
TEST(jit, attention_compiles_for_every_head_dim) {
    for (int hd = 0; hd <= 264; hd += 4)
        CHECK_MSG(dllm__attn_supports(hd) == (hd >= 8 && hd <= 256 && hd % 8 == 0), "hd=%d", hd);
    for (const dllm__arch &row : dllm__arch_table) {
        const dllm__arch table = dllm__arch_for(row.cc);
        for (int hd : {64, 128}) {
            const dllm__arch t = dllm__attn_tiles(table, hd);
            CHECK(dllm__attn_kernel_name(hd, t) == dllm__attn_kernel_name(hd, table) && t.fa_wg_bc == table.fa_wg_bc);
        }
        for (int hd = 8; hd <= 256; hd += 8) {
            const dllm__arch t = dllm__attn_tiles(table, hd);
            CHECK_MSG(dllm__attn_smem(hd, t) <= (row.cc == 80 || row.cc == 90 ? 163 * 1024 : 99 * 1024),
                      "hd=%d on %s: %zu bytes", hd, t.target, dllm__attn_smem(hd, t));
            CHECK(t.fa_br % (16 * t.fa_mt) == 0 && t.fa_bc % 16 == 0);
        }
        for (int hd : {24, 40, 72, 96, 160, 232, 256}) {
            const dllm__arch t = dllm__attn_tiles(table, hd);
            dllm__jit_request rq = dllm__module_attention(t, hd);
            CHECK_MSG(t.fa_wg_bc == 0 && rq.kernels.size() == 2, "hd=%d on %s selects flash_attn_wg", hd, t.target);
            std::vector<char> cubin;
            std::vector<std::string> lowered;
            std::string log;
            CHECK_STATUS(dllm__nvrtc_compile(rq, cubin, lowered, log), DLLM_OK, nullptr);
            CHECK_MSG(!dllm__log_has_spills(log), "%s spills on %s:\n%s", rq.name.c_str(), t.target, log.c_str());
            CHECK_MSG(!dllm__log_reports(log, "stack frame"), "%s has a stack frame on %s:\n%s", rq.name.c_str(),
                      t.target, log.c_str());
            CHECK(lowered.size() == rq.kernels.size() && cubin.size() > 1000);
        }
    }
}

static void test_facache_case(dllm_test_state &T_, test_gpu &g, test_rng &r, int hd, int seq, int H, int KV, int b0,
                              int b1);

/* flash_attn at head dims 24, 96 and 256 (not a multiple of 16; chunks that do not divide the threads; above 128) on
 * the tiles the backend picks for them, against dllm__cpu_attention: awkward lengths, GQA, a key-padding mask (second
 * sequence), a K/V-cache step, split-KV with an uneven and an empty share; then FACache save and resume. */
TEST(gpu, flash_attention_other_head_dims_match_cpu) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("attention_head_dims");
    const dllm__arch table = g.arch;
    int block[2] = {70, 101};
    for (int hd : {24, 96, 256}) {
        g.arch = dllm__attn_tiles(table, hd);
        printf("    hd=%d: %s\n", hd, dllm__attn_kernel_name(hd, g.arch).c_str());
        test_attention_case(T_, g, r, hd, 77, 4, 2, nullptr);
        test_attention_case(T_, g, r, hd, 1, 3, 3, nullptr);
        test_attention_case(T_, g, r, hd, 300, 6, 2, block);
        test_attention_case(T_, g, r, hd, 300, 4, 2, block, 70, 31);     // dual cache: the block's rows over every key
        test_attention_case(T_, g, r, hd, 203, 2, 1, nullptr, 95, 108, 5);  // split-KV, the last share short
        test_attention_case(T_, g, r, hd, 40, 3, 1, nullptr, 9, 17, 4);     // more shares than tiles: empty shares
        test_facache_case(T_, g, r, hd, 300, 4, 2, 205, 237);
        test_facache_case(T_, g, r, hd, 97, 3, 1, 89, 97);
    }
    for (int hd : {24, 96, 256}) test_rope_case(T_, g, r, hd);  // rope_qkv works on quads of pairs: any multiple of 8
    g.arch = table;
}

TEST(gpu, sampler_filters_match_cpu) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("sampler filters");
    test_filters f;
    f.top_k = 37;
    test_sampler_case(T_, g, r, 0.8, false, 0, false, 0, f);
    test_sampler_case(T_, g, r, 0.0, false, 1.5f, true, 1, f);
    f = test_filters();
    f.top_p = 0.83f;
    test_sampler_case(T_, g, r, 1.3, false, 0, true, 0, f);
    test_sampler_case(T_, g, r, 0.0, true, 0, false, 1, f);
    f = test_filters();
    f.min_p = 0.05f;
    test_sampler_case(T_, g, r, 0.7, false, 0.5f, false, 0, f);
    f.top_k = 200, f.top_p = 0.9f;
    test_sampler_case(T_, g, r, 1.0, false, 0, true, 0, f);
    test_sampler_case(T_, g, r, 0.0, false, 0, false, 0, f);
}

// ---- the GPU backend end to end on the fixtures -----------------------------------------------------

/* run(fx, m, gpu, cpu) on each trained tiny fixture with a GPU and a CPU context on it. */
template <class Run> static void test_gpu_cpu_on_tiny_fixtures(dllm_test_state &T_, Run run) {
    for (const char *fx : {"tiny-llada", "tiny-dream"}) {
        dllm_model *m = test_load(test_data(fx));
        dllm_ctx *gpu = m ? test_ctx(m, DLLM_BACKEND_GPU) : nullptr, *cpu = m ? test_ctx(m, DLLM_BACKEND_CPU) : nullptr;
        CHECK(gpu && cpu);
        if (gpu && cpu) run(fx, m, gpu, cpu);
        dllm_ctx_free(gpu);
        dllm_ctx_free(cpu);
        dllm_model_free(m);
    }
}

TEST(gpu, forward_matches_cpu_reference) {
    NEED_GPU();
    test_gpu_cpu_on_tiny_fixtures(T_, [&](const char *fx, dllm_model *m, dllm_ctx *gpu, dllm_ctx *cpu) {
        CHECK(dllm_ctx_get_backend(gpu) == DLLM_BACKEND_GPU);
        for (const test_golden_input &gi : test_golden_inputs(test_data(fx))) {
            const int T = (int)gi.ids.size(), V = m->cfg.n_vocab, r0 = T > 3 ? 2 : 0;
            std::vector<float> a((size_t)(T - r0) * V, NAN), b(a.size(), NAN);
            CHECK_STATUS(dllm_logits(cpu, gi.ids.data(), T, r0, T, a.data(), a.size()), DLLM_OK, nullptr);
            CHECK_STATUS(dllm_logits(gpu, gi.ids.data(), T, r0, T, b.data(), b.size()), DLLM_OK, nullptr);
            int argmax_same = 0;
            for (int i = 0; i < T - r0; i++)
                argmax_same += std::max_element(a.begin() + (long)i * V, a.begin() + (long)(i + 1) * V) -
                                   (a.begin() + (long)i * V) ==
                               std::max_element(b.begin() + (long)i * V, b.begin() + (long)(i + 1) * V) -
                                   (b.begin() + (long)i * V);
            double err = test_max_rel(b, a);
            printf("    %s T=%d: GPU vs CPU logits max relative error %.2e, argmax agrees on %d/%d rows\n", fx, T, err,
                   argmax_same, T - r0);
            CHECK_MSG(err < 3e-2, "%s: BF16 forward error %.3e", fx, err);
        }
    });
}

/* Temperature-0 decoding on the GPU must give the CPU's tokens. A divergence is accepted only at a
 * near-tie: on the canvas before the first differing step, the gap that decided it (between two tokens'
 * logits, or between two positions' confidences) is within twice the measured BF16 noise of that row
 * (max |GPU logit - CPU logit|), both taken on the logits the step decides on (CFG-combined under CFG).
 * Every divergence is printed with its gap and noise. */
static double test_softmax_max(const float *row, int V) {
    float mx = *std::max_element(row, row + V);
    double z = 0;
    for (int v = 0; v < V; v++) z += exp((double)row[v] - mx);
    return 1.0 / z;
}

/* The logits a decoding step decides on: with CFG (cfg > 0), U + (cfg + 1)(C - U), U from the canvas with
 * its n_prompt prompt positions masked. */
static void test_step_logits(dllm_ctx *ctx, const dllm_model *m, const std::vector<int32_t> &canvas, float cfg,
                             size_t n_prompt, std::vector<float> &out) {
    const int N = (int)canvas.size();
    dllm_logits(ctx, canvas.data(), N, 0, N, out.data(), out.size());
    if (cfg <= 0) return;
    std::vector<int32_t> un = canvas;
    std::fill(un.begin(), un.begin() + (long)n_prompt, m->cfg.mask_id);
    std::vector<float> u(out.size());
    dllm_logits(ctx, un.data(), N, 0, N, u.data(), u.size());
    for (size_t i = 0; i < out.size(); i++) out[i] = u[i] + (cfg + 1) * (out[i] - u[i]);
}

/* conf_of, when given, ranks positions (Dream's samplers); the default is LLaDA's max softmax probability. */
static bool test_divergence_is_near_tie(dllm_ctx *cpu, dllm_ctx *gpu, const dllm_model *m,
                                        const std::vector<int32_t> &canvas, float cfg, size_t n_prompt,
                                        const std::vector<int32_t> &a, const std::vector<int32_t> &b, const char *what,
                                        const dllm__sampling *conf_of = nullptr) {
    const int N = (int)canvas.size(), V = m->cfg.n_vocab, mask = m->cfg.mask_id;
    std::vector<float> lc((size_t)N * V), lg((size_t)N * V);
    test_step_logits(cpu, m, canvas, cfg, n_prompt, lc);
    test_step_logits(gpu, m, canvas, cfg, n_prompt, lg);
    auto noise = [&](int p) {
        double e = 0;
        for (int v = 0; v < V; v++) e = std::max(e, (double)fabsf(lc[(size_t)p * V + v] - lg[(size_t)p * V + v]));
        return e;
    };
    std::vector<int> only_a, only_b;
    bool ok = true;
    for (int p = 0; p < N; p++) {
        if (a[(size_t)p] == b[(size_t)p]) continue;
        if (a[(size_t)p] != mask && b[(size_t)p] != mask) {
            double gap = fabs(lc[(size_t)p * V + a[(size_t)p]] - lc[(size_t)p * V + b[(size_t)p]]),
                   bound = 2 * noise(p);
            printf("    %s position %d: token CPU %d vs GPU %d, logit gap %.4f, noise bound %.4f\n", what, p,
                   a[(size_t)p], b[(size_t)p], gap, bound);
            ok &= gap <= bound;
        } else {
            (a[(size_t)p] != mask ? only_a : only_b).push_back(p);
        }
    }
    for (int pa : only_a)
        for (int pb : only_b) {
            auto conf = [&](int p) {
                return conf_of ? dllm__choose(&lc[(size_t)p * V], V, *conf_of, (uint32_t)p, 0).conf
                               : test_softmax_max(&lc[(size_t)p * V], V);
            };
            double ca = conf(pa), cb = conf(pb);
            double gap = fabs(ca - cb) / std::max(fabs(ca), fabs(cb)), bound = 2 * std::max(noise(pa), noise(pb));
            printf(
                "    %s positions %d (CPU) / %d (GPU): confidence %.5f vs %.5f, relative gap %.4f, noise bound %.4f\n",
                what, pa, pb, ca, cb, gap, bound);
            ok &= gap <= bound;
        }
    return ok && only_a.size() == only_b.size();
}

/* The golden cases of fixture fx decoded at temperature 0 on two contexts, cpu the reference (any pair: the FP8 tests
 * compare two GPU contexts); returns the cases identical at every step. */
static int test_decode_compare(dllm_test_state &T_, const char *fx, const dllm_model *m, dllm_ctx *cpu, dllm_ctx *gpu) {
    int unexplained = 0, identical = 0, cases = 0;
    dllm__json root;
    dllm__json_load(test_data(fx) + "/golden_traces.json", root);
    const dllm__json *cs = root.find("cases");
    for (size_t ci = 0; cpu && gpu && cs && ci < cs->items.size(); ci++) {
        const dllm__json &c = cs->items[ci];
        dllm_gen_params p = test_case_params(c);
        if (p.temperature > 0 || p.remasking == DLLM_REMASK_RANDOM) continue;
        std::vector<int32_t> prompt = test_ints(c.find("prompt"));
        test_trace_recorder ra, rb;
        p.on_step = test_record_step;
        p.on_step_data = &ra;
        std::vector<int32_t> out((size_t)p.gen_length);
        CHECK_STATUS(
            dllm_generate(cpu, prompt.data(), (int)prompt.size(), p, out.data(), (int)out.size(), nullptr, nullptr),
            DLLM_OK, nullptr);
        p.on_step_data = &rb;
        CHECK_STATUS(
            dllm_generate(gpu, prompt.data(), (int)prompt.size(), p, out.data(), (int)out.size(), nullptr, nullptr),
            DLLM_OK, nullptr);
        cases++;
        std::vector<int32_t> before;
        const size_t s = test_first_difference(ra, rb, prompt, p.gen_length, m->cfg.mask_id, before);
        if (s == ra.canvases.size() && ra.canvases.size() == rb.canvases.size()) { identical++; continue; }
        if (s >= ra.canvases.size() || s >= rb.canvases.size()) { unexplained++; continue; }
        std::string what = dllm__format("%s/%s step %zu:", fx, c.find("name")->str.c_str(), s);
        unexplained += !test_divergence_is_near_tie(cpu, gpu, m, before, p.cfg_scale, prompt.size(), ra.canvases[s],
                                                    rb.canvases[s], what.c_str());
    }
    printf("    %s: %d of %d temperature-0 cases identical at every step\n", fx, identical, cases);
    CHECK_MSG(unexplained == 0, "%s: %d cases diverge beyond a near-tie", fx, unexplained);
    return identical;
}

static int test_decode_compare(dllm_test_state &T_, const char *fx) {
    dllm_model *m = test_load(test_data(fx));
    dllm_ctx *cpu = m ? test_ctx(m, DLLM_BACKEND_CPU) : nullptr, *gpu = m ? test_ctx(m, DLLM_BACKEND_GPU) : nullptr;
    const int identical = test_decode_compare(T_, fx, m, cpu, gpu);
    dllm_ctx_free(cpu);
    dllm_ctx_free(gpu);
    dllm_model_free(m);
    return identical;
}

TEST(gpu, decoding_matches_cpu_at_temperature_0) {
    NEED_GPU();
    test_decode_compare(T_, "tiny-llada");
    test_decode_compare(T_, "tiny-dream");
}

/* The captured step graph and eager launches compute the same bits; seeded sampling is reproducible. */
TEST(gpu, graphs_equal_eager_and_runs_repeat) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *gpu = m ? test_ctx(m, DLLM_BACKEND_GPU) : nullptr;
    if (!gpu) { CHECK(gpu != nullptr); dllm_model_free(m); return; }
    int32_t prompt[] = {3, 14, 15, 92, 65, 35, 89};
    dllm_gen_params p = dllm_gen_default_params();
    p.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
    p.gen_length = 24;
    p.steps = 24;
    p.block_length = 8;
    p.temperature = 0.9f;
    p.cfg_scale = 0.7f;
    p.seed = 77;
    p.stop_at_eos = 0;
    std::vector<int32_t> a(24), b(24), c(24);
    CHECK_STATUS(dllm_generate(gpu, prompt, 7, p, a.data(), 24, nullptr, nullptr), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_generate(gpu, prompt, 7, p, b.data(), 24, nullptr, nullptr), DLLM_OK, nullptr);
    test_knob_set("no_graphs", "1");
    CHECK_STATUS(dllm_generate(gpu, prompt, 7, p, c.data(), 24, nullptr, nullptr), DLLM_OK, nullptr);
    test_knob_reset();
    CHECK(a == b && a == c);
    dllm_ctx_free(gpu);
    dllm_model_free(m);
}

TEST(gpu, random_weight_model_runs_on_gpu_only) {
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load_random("/nonexistent", 5, &m), DLLM_ERR_IO, "/nonexistent");
    CHECK(m == nullptr);
    CHECK_STATUS(dllm_model_load_random(test_data("tiny-dream").c_str(), 5, &m), DLLM_OK, nullptr);
    dllm_ctx *ctx = nullptr;
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_CPU;
    CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_ERR_UNSUPPORTED, "random weights");
    if (test_have_gpu()) {
        cp.backend = DLLM_BACKEND_GPU;
        CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
        int32_t prompt[] = {1, 2, 3};
        int32_t out[16];
        dllm_gen_params p = dllm_gen_default_params();
        p.gen_length = 16; p.steps = 8; p.block_length = 8;
        CHECK_STATUS(dllm_generate(ctx, prompt, 3, p, out, 16, nullptr, nullptr), DLLM_OK, nullptr);
        dllm_ctx_free(ctx);
    }
    dllm_model_free(m);
}

// ---- LaCache: bit-exactness ------------------------------------------------------------------------

/* FACache at the kernel: save the state with one block, change the block's Q/K/V rows, resume; the
 * output must equal a plain run on the changed inputs bit for bit (and the saving run, the plain one). */
static void test_facache_case(dllm_test_state &T_, test_gpu &g, test_rng &r, int hd, int seq, int H, int KV, int b0,
                              int b1) {
    const int B = 2, heads = H + 2 * KV, stride = heads * hd;
    dllm__attn_kernels k = test_attn_kernels(T_, g, hd);
    if (!k.attn.fn) return;
    std::vector<float> qkv((size_t)B * seq * stride);
    for (float &v : qkv) v = r.normal();
    std::vector<uint16_t> before = test_bf16_vec(qkv), after = before;
    for (int b = 0; b < B; b++)
        for (int p = b0; p < b1; p++)
            for (int c = 0; c < stride; c++) after[((size_t)b * seq + p) * stride + c] = dllm__f32_to_bf16(r.normal());
    const int q_tiles = (seq + g.arch.fa_br - 1) / g.arch.fa_br, threads = dllm__attn_threads(g.arch);
    const size_t out_n = (size_t)B * seq * H * hd,
                 state_n = (size_t)B * H * q_tiles * g.arch.fa_mt * (4 + hd / 2) * threads;
    dllm__dbuf dq, dout, dst, dstate;
    int st[16] = {b0, b1};
    test_put(dst, std::vector<int>(st, st + 16));
    test_poison(dstate, state_n * 4);
    auto run = [&](const std::vector<uint16_t> &in, int mode) {
        test_put(dq, in);
        test_poison(dout, out_n * 2);
        attn_args a = {dq.as<bf16_t>(),
                       dq.as<bf16_t>() + (size_t)H * hd,
                       dq.as<bf16_t>() + (size_t)(H + KV) * hd,
                       dout.as<bf16_t>(),
                       nullptr,
                       seq,
                       seq,
                       stride,
                       stride,
                       H * hd,
                       H / KV,
                       (uint64_t)seq * stride,
                       (uint64_t)seq * H * hd,
                       dst.as<dllm_step_state>(),
                       1.4426950408889634f / sqrtf((float)hd),
                       mode,
                       dstate.as<float>(),
                       1,
                       nullptr,
                       0,
                       0,
                       nullptr,
                       nullptr,
                       nullptr,
                       nullptr,
                       nullptr};
        dllm__attn_launch(k, g.arch, hd, H, B, a, 0);
        return test_get<uint16_t>(dout, out_n);
    };
    std::vector<uint16_t> plain_before = run(before, 0), saved = run(before, 1), plain_after = run(after, 0),
                          resumed = run(after, 2);
    CHECK_MSG(saved == plain_before, "hd=%d seq=%d block [%d,%d): the saving run differs from the plain one", hd, seq,
              b0, b1);
    size_t diff = 0;
    for (size_t i = 0; i < out_n; i++) diff += resumed[i] != plain_after[i];
    printf("    FACache hd=%d seq=%d H=%d KV=%d block [%d,%d): %zu of %zu outputs differ from the plain run\n", hd, seq,
           H, KV, b0, b1, diff, out_n);
    CHECK(diff == 0);
}

TEST(gpu, facache_resume_is_bit_exact) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("facache");
    test_facache_case(T_, g, r, 128, 300, 4, 2, 205, 237);  // block straddles a query tile and key tiles
    test_facache_case(T_, g, r, 64, 97, 3, 1, 89, 97);      // block at the end, short last tiles
    test_facache_case(T_, g, r, 128, 1000, 2, 2, 936, 968);
    test_facache_case(T_, g, r, 64, 256, 2, 2, 0, 64);      // block at the start
}

/* Runs one generation with the sampler's logits recorded; graphs off so that every step is observable. */
static dllm_status test_gen_recorded(dllm_ctx *ctx, const std::vector<int32_t> &prompt, dllm_gen_params p,
                                     test_trace_recorder &rec,
                                     std::map<std::pair<int, int>, std::vector<float>> &rows) {
    test_knob_set("no_graphs", "1");
    ((dllm__gpu_backend *)ctx->impl.get())->set_debug_rows(&rows);
    p.on_step = test_record_step;
    p.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
    p.on_step_data = &rec;
    std::vector<int32_t> out((size_t)p.gen_length);
    dllm_status s =
        dllm_generate(ctx, prompt.data(), (int)prompt.size(), p, out.data(), p.gen_length, nullptr, nullptr);
    ((dllm__gpu_backend *)ctx->impl.get())->set_debug_rows(nullptr);
    test_knob_reset();
    return s;
}

/* LaCache off, truncation only, on: identical canvases at every step and identical logits (max |delta| = 0)
 * at every block position of every step. Also with graphs (canvases). */
static void test_lacache_exact(dllm_test_state &T_, dllm_ctx *ctx, int vocab, int np, int gen, int block, int steps,
                               float cfg) {
    std::vector<int32_t> prompt((size_t)np);
    for (int i = 0; i < np; i++) prompt[(size_t)i] = (int32_t)((i * 7919 + 13) % std::min(vocab, 100000));
    dllm_gen_params p = dllm_gen_default_params();
    p.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
    p.gen_length = gen; p.steps = steps; p.block_length = block; p.cfg_scale = cfg; p.stop_at_eos = 0;
    test_trace_recorder rec[3];
    std::map<std::pair<int, int>, std::vector<float>> rows[3];
    const dllm_lacache modes[3] = {DLLM_LACACHE_OFF, DLLM_LACACHE_TRUNCATE, DLLM_LACACHE_ON};
    int last_rows[3];
    for (int m = 0; m < 3; m++) {
        p.lacache = modes[m];
        CHECK_STATUS(test_gen_recorded(ctx, prompt, p, rec[m], rows[m]), DLLM_OK, nullptr);
        last_rows[m] = ((dllm__gpu_backend *)ctx->impl.get())->last_layer_rows();
    }
    // Truncation reaches into the last layer: after its attention it computes the output rows only (at the last
    // step the last block, and any [MASK] of the prompt on), while the plain path computes every row that has
    // logits (Dream's shift: all but the last), at most dllm__lm_chunk_rows of them apart.
    const dllm__config &mc = ctx->model->cfg;
    const int n = np + gen, first_mask = (int)(std::find(prompt.begin(), prompt.end(), mc.mask_id) - prompt.begin());
    auto last_layer = [&](int out_rows) { return out_rows < n && out_rows <= dllm__lm_chunk_rows ? out_rows : n; };
    const int want_off = last_layer(mc.shift_logits ? n - 1 : n),
              want_cut = last_layer(first_mask < np ? n - first_mask : block);
    CHECK_MSG(last_rows[0] == want_off && last_rows[1] == want_cut && last_rows[2] == want_cut,
              "N=%d: the last layer computed %d / %d / %d rows, want %d / %d", n, last_rows[0], last_rows[1],
              last_rows[2], want_off, want_cut);
    double max_delta = 0;
    size_t compared = 0;
    for (int m = 1; m < 3; m++) {
        CHECK_MSG(rec[m].canvases == rec[0].canvases && !rec[0].canvases.empty(),
                  "N=%d block %d: mode %d tokens differ", np + gen, block, m);
        // Truncation records the block's rows of every step; the plain path records every row after the
        // block start (a superset): each truncated row must be found there with the same bits.
        CHECK_MSG(rows[m].size() == (size_t)steps * block, "N=%d: %zu recorded rows, want %d", np + gen, rows[m].size(),
                  steps * block);
        for (auto &kv : rows[m]) {
            auto it = rows[0].find(kv.first);
            if (it == rows[0].end() || it->second.size() != kv.second.size()) { max_delta = INFINITY; continue; }
            for (size_t i = 0; i < kv.second.size(); i++)
                max_delta = std::max(max_delta, (double)fabsf(kv.second[i] - it->second[i]));
            compared++;
        }
    }
    // and through captured graphs
    std::vector<int32_t> a((size_t)gen), b((size_t)gen);
    p.lacache = DLLM_LACACHE_OFF;
    CHECK_STATUS(dllm_generate(ctx, prompt.data(), np, p, a.data(), gen, nullptr, nullptr), DLLM_OK, nullptr);
    p.lacache = DLLM_LACACHE_ON;
    CHECK_STATUS(dllm_generate(ctx, prompt.data(), np, p, b.data(), gen, nullptr, nullptr), DLLM_OK, nullptr);
    std::vector<int32_t> want(rec[0].canvases.empty() ? std::vector<int32_t>() : rec[0].canvases.back());
    bool graphs_same = a == b && !want.empty() && std::equal(a.begin(), a.end(), want.begin() + np);
    printf("    N=%d (prompt %d) block %d steps %d cfg %.1f: %zu logit rows compared, max |delta| = %g, graphs %s\n",
           np + gen, np, block, steps, cfg, compared, max_delta, graphs_same ? "identical" : "DIFFER");
    CHECK_MSG(max_delta == 0, "N=%d block %d: LaCache logits differ by %g", np + gen, block, max_delta);
    CHECK(graphs_same);
}

/* run(ctx) on each trained tiny fixture under the context make_ctx(m) gives (the LaCache exactness tests), the log line
 * naming the fixture and `what`. */
template <class MakeCtx, class Run>
static void test_on_tiny_fixtures(dllm_test_state &T_, const char *what, MakeCtx make_ctx, Run run) {
    for (const char *fx : {"tiny-llada", "tiny-dream"}) {
        dllm_model *m = test_load(test_data(fx));
        dllm_ctx *ctx = m ? make_ctx(m) : nullptr;
        if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); continue; }
        printf("    %s%s\n", fx, what);
        run(ctx);
        dllm_ctx_free(ctx);
        dllm_model_free(m);
    }
}

TEST(gpu, lacache_is_bit_exact_on_fixtures) {
    NEED_GPU();
    test_on_tiny_fixtures(T_, "", [](dllm_model *m) { return test_ctx(m, DLLM_BACKEND_GPU); }, [&](dllm_ctx *ctx) {
        test_lacache_exact(T_, ctx, 128, 37, 64, 8, 16, 0);
        test_lacache_exact(T_, ctx, 128, 5, 96, 32, 6, 0);
        test_lacache_exact(T_, ctx, 128, 61, 128, 64, 4, 1.5f);
    });
}

TEST(gpu, lacache_is_bit_exact_on_llada_8b_shape) {
    NEED_GPU();
    dllm_model *m = test_llada_8b_shape(T_);
    dllm_ctx *ctx = test_gpu_ctx(T_, m, 2048);
    if (ctx) {
        test_lacache_exact(T_, ctx, 100000, 81, 16, 8, 4, 0);      // N = 97
        test_lacache_exact(T_, ctx, 100000, 232, 24, 8, 6, 0);     // N = 256
        test_lacache_exact(T_, ctx, 100000, 936, 64, 32, 4, 0);    // N = 1000
        test_lacache_exact(T_, ctx, 100000, 1920, 128, 64, 4,
                           0);  // N = 2048, prompt a multiple of 128: block tile-aligned
        test_lacache_exact(T_, ctx, 100000, 2000, 48, 8, 6, 0);    // N = 2048, blocks straddle tiles
    }
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

// ---- schedulers (issue 8) on the GPU ------------------------------------------------------------------

/* Every scheduler on the GPU against the CPU reference (trained tiny models, temperature 0): token
 * agreement, with the first difference reported (BF16 vs fp32 near-ties; the K/V caches amplify them).
 * LaCache must stay exact relative to the same scheduler: tokens with LaCache on equal those with it off. */
TEST(gpu, schedulers_match_cpu_and_lacache_stays_exact) {
    NEED_GPU();
    struct sched { const char *name; void (*edit)(dllm_gen_params &);
    } cases[] = {
        {"threshold 0.9", [](dllm_gen_params &p) { p.unmask = DLLM_UNMASK_THRESHOLD; }},
        {"factor 1", [](dllm_gen_params &p) { p.unmask = DLLM_UNMASK_FACTOR; }},
        {"prefix cache", [](dllm_gen_params &p) { p.kv_cache = DLLM_KV_CACHE_PREFIX; }},
        {"dual cache", [](dllm_gen_params &p) { p.kv_cache = DLLM_KV_CACHE_DUAL; }},
        {"DPad",
         [](dllm_gen_params &p) { p.dpad = DLLM_DPAD_GAUSSIAN, p.dpad_window = 24, p.dpad_k = 3, p.dpad_scale = 1; }},
        {"threshold + dual + DPad",
         [](dllm_gen_params &p) {
             p.unmask = DLLM_UNMASK_THRESHOLD, p.kv_cache = DLLM_KV_CACHE_DUAL;
             p.dpad = DLLM_DPAD_GAUSSIAN, p.dpad_window = 24, p.dpad_k = 3, p.dpad_scale = 1;
         }},
        {"threshold + early stop",
         [](dllm_gen_params &p) { p.unmask = DLLM_UNMASK_THRESHOLD, p.early_stop = 1, p.stop_at_eos = 1; }},
    };
    const char *models[] = {"models/tiny-llada", "models/tiny-dream"};
    double agree_sum = 0;
    int n_runs = 0;
    for (const char *dir : models) {
        test_tiny_ctx cpu(dir), gpu(dir, DLLM_BACKEND_GPU);
        if (!cpu.ctx || !gpu.ctx) { CHECK(cpu.ctx && gpu.ctx); continue; }
        for (auto &c : cases) {
            dllm_gen_params p = test_sched_params();
            p.gen_length = 48, p.steps = 48;
            c.edit(p);
            test_gen want = test_generate(cpu.ctx, p);
            test_gen on = test_generate(gpu.ctx, p);
            p.lacache = DLLM_LACACHE_OFF;
            test_gen off = test_generate(gpu.ctx, p);
            CHECK(want.status == DLLM_OK && on.status == DLLM_OK && off.status == DLLM_OK);
            CHECK_MSG(on.out == off.out && on.stats.steps == off.stats.steps,
                      "%s %s: LaCache on and off differ on the GPU", dir, c.name);
            double a = test_agreement(on.out, want.out);
            size_t first = 0;
            while (first < std::min(on.out.size(), want.out.size()) && on.out[first] == want.out[first]) first++;
            printf("    %s %-24s GPU vs CPU agreement %.3f (first difference at %zu of %zu), steps %d GPU / %d CPU\n",
                   dir, c.name, a, first, want.out.size(), on.stats.steps, want.stats.steps);
            agree_sum += a, n_runs++;
        }
    }
    printf("    mean GPU vs CPU token agreement over %d scheduler runs: %.3f\n", n_runs,
           n_runs ? agree_sum / n_runs : 0.0);
    CHECK(n_runs > 0 && agree_sum / n_runs >= 0.75);
}

// ---- head dims other than 64 and 128 end to end (tools/make_headdim_fixtures.py) ------------------------

/* LLaDA at head dim 24 (4 heads over 2 key/value heads), Dream at head dim 96 (2 over 1). */
struct test_headdim_fixture {
    const char *name;
    int head_dim;
};
static const test_headdim_fixture test_headdim_fixtures[] = {{"tiny-llada-hd24", 24}, {"tiny-dream-hd96", 96}};

/* Three greedy blocks after a prompt of 11 tokens. */
static dllm_gen_params test_headdim_params() {
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = 24, p.steps = 24, p.block_length = 8, p.stop_at_eos = 0;
    return p;
}
static const int32_t test_headdim_prompt[] = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46};

/* The CPU backend loads both checkpoints, matches their float64 logits and decodes them. */
TEST(forward, other_head_dims_run_on_cpu) {
    for (const test_headdim_fixture &fx : test_headdim_fixtures) {
        test_golden_logits(T_, fx.name);
        dllm_model *m = test_load(test_data(fx.name));
        dllm_ctx *ctx = m ? test_ctx(m) : nullptr;
        if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); continue; }
        CHECK_MSG(m->cfg.head_dim == fx.head_dim, "%s: head dim %d", fx.name, m->cfg.head_dim);
        dllm_gen_params p = test_headdim_params();
        test_trace_recorder rec;
        p.on_step = test_record_step, p.on_step_data = &rec;
        std::vector<int32_t> out((size_t)p.gen_length, -1);
        int n_out = 0;
        CHECK_STATUS(dllm_generate(ctx, test_headdim_prompt, 11, p, out.data(), (int)out.size(), &n_out, nullptr),
                     DLLM_OK, nullptr);
        bool decoded = n_out == p.gen_length && (int)rec.canvases.size() == p.steps && rec.consistent;
        for (int32_t t : out) decoded &= t >= 0 && t < m->cfg.n_vocab && t != m->cfg.mask_id;
        CHECK_MSG(decoded, "%s: %d tokens over %zu steps", fx.name, n_out, rec.canvases.size());
        dllm_ctx_free(ctx);
        dllm_model_free(m);
    }
}

/* Both checkpoints on the GPU (flash_attn at head dims 24 and 96): logits within the BF16 forward's tolerance of the
 * CPU's (as forward_matches_cpu_reference), temperature-0 decoding with the CPU's tokens at every step (a divergence
 * only at a near-tie, as decoding_matches_cpu_at_temperature_0), with and without CFG; LaCache exact on the GPU with
 * and without the dual K/V cache (split-KV and FACache on the model's own head dim). */
TEST(gpu, other_head_dims_decode_as_on_cpu) {
    NEED_GPU();
    for (const test_headdim_fixture &fx : test_headdim_fixtures) {
        dllm_model *m = test_load(test_data(fx.name));
        dllm_ctx *cpu = m ? test_ctx(m, DLLM_BACKEND_CPU) : nullptr, *gpu = m ? test_ctx(m, DLLM_BACKEND_GPU) : nullptr;
        CHECK_MSG(cpu && gpu, "%s: %s", fx.name, dllm_last_error());
        if (!cpu || !gpu) { dllm_ctx_free(cpu); dllm_ctx_free(gpu); dllm_model_free(m); continue; }
        const int V = m->cfg.n_vocab;
        for (const test_golden_input &gi : test_golden_inputs(test_data(fx.name))) {
            const int T = (int)gi.ids.size();
            std::vector<float> a((size_t)T * V, NAN), b(a.size(), NAN);
            CHECK_STATUS(dllm_logits(cpu, gi.ids.data(), T, 0, T, a.data(), a.size()), DLLM_OK, nullptr);
            CHECK_STATUS(dllm_logits(gpu, gi.ids.data(), T, 0, T, b.data(), b.size()), DLLM_OK, nullptr);
            double err = test_max_rel(b, a);
            printf("    %s T=%d: GPU vs CPU logits max relative error %.2e\n", fx.name, T, err);
            CHECK_MSG(err < 3e-2, "%s T=%d: BF16 forward error %.3e", fx.name, T, err);
        }
        const std::vector<int32_t> prompt(test_headdim_prompt, test_headdim_prompt + 11);
        int unexplained = 0, identical = 0;
        for (float cfg : {0.0f, 0.5f}) {
            dllm_gen_params p = test_headdim_params();
            p.cfg_scale = cfg;
            test_trace_recorder ra, rb;
            std::vector<int32_t> out((size_t)p.gen_length);
            p.on_step = test_record_step;
            p.on_step_data = &ra;
            CHECK_STATUS(dllm_generate(cpu, prompt.data(), 11, p, out.data(), (int)out.size(), nullptr, nullptr),
                         DLLM_OK, nullptr);
            p.on_step_data = &rb;
            CHECK_STATUS(dllm_generate(gpu, prompt.data(), 11, p, out.data(), (int)out.size(), nullptr, nullptr),
                         DLLM_OK, nullptr);
            std::vector<int32_t> before;
            const size_t s = test_first_difference(ra, rb, prompt, p.gen_length, m->cfg.mask_id, before);
            if (s == ra.canvases.size() && ra.canvases.size() == rb.canvases.size() && s > 0) { identical++; continue; }
            if (s >= ra.canvases.size() || s >= rb.canvases.size()) { unexplained++; continue; }
            std::string what = dllm__format("%s cfg %.1f step %zu:", fx.name, cfg, s);
            unexplained += !test_divergence_is_near_tie(cpu, gpu, m, before, cfg, prompt.size(), ra.canvases[s],
                                                        rb.canvases[s], what.c_str());
        }
        printf("    %s: %d of 2 temperature-0 decodes identical at every step\n", fx.name, identical);
        CHECK_MSG(unexplained == 0, "%s: %d decodes diverge beyond a near-tie", fx.name, unexplained);
        for (dllm_kv_cache kv : {DLLM_KV_CACHE_NONE, DLLM_KV_CACHE_DUAL}) {
            dllm_gen_params p = test_headdim_params();
            p.kv_cache = kv;
            p.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
            std::vector<int32_t> on((size_t)p.gen_length), off(on.size());
            CHECK_STATUS(dllm_generate(gpu, prompt.data(), 11, p, on.data(), (int)on.size(), nullptr, nullptr), DLLM_OK,
                         nullptr);
            p.lacache = DLLM_LACACHE_OFF;
            CHECK_STATUS(dllm_generate(gpu, prompt.data(), 11, p, off.data(), (int)off.size(), nullptr, nullptr),
                         DLLM_OK, nullptr);
            CHECK_MSG(on == off, "%s K/V cache %d: LaCache on and off differ on the GPU", fx.name, (int)kv);
        }
        dllm_ctx_free(cpu);
        dllm_ctx_free(gpu);
        dllm_model_free(m);
    }
}

/* A head dim the GPU backend cannot run (36: not a multiple of 8) is a status naming what it supports. */
TEST(gpu, unsupported_head_dim_is_a_clear_error) {
    NEED_GPU();
    std::string cfg = test_read_file(test_data("tiny-llada-hd24/config.json"));
    const size_t at = cfg.find("\"n_heads\": 4");
    CHECK(at != std::string::npos);
    if (at == std::string::npos) return;
    cfg.replace(at, 12, "\"n_heads\": 2");
    cfg.replace(cfg.find("\"d_model\": 96"), 13, "\"d_model\": 72");  // 2 heads of 36
    test_tmpdir dir;
    CHECK(test_write_file(dir.file("config.json"), cfg));
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load_random(dir.file("config.json").c_str(), 1, &m), DLLM_OK, nullptr);
    if (!m) return;
    CHECK(m->cfg.head_dim == 36);
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_GPU;
    dllm_ctx *ctx = nullptr;
    CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_ERR_UNSUPPORTED, "multiples of 8 from 8 to 256, this model has 36");
    CHECK(ctx == nullptr);
    dllm_model_free(m);
}
