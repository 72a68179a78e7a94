/* Tests: the GPU backend's structure (issue 22): the kernel table against the compiled kernels, device weights
 * shared by the contexts of one model, contexts on several threads. */

// ---- the kernel table (CPU only: NVRTC compiles without a GPU) ----------------------------------------

/* The byte sizes of an entry point's parameters as the PTX declares them: ".param .u64 name", ".param .align 8 .b8
 * name[104]". Empty if the entry is not there. */
static std::vector<size_t> test_ptx_param_sizes(const std::string &ptx, const char *entry) {
    std::vector<size_t> sizes;
    const std::string head = std::string(".entry ") + entry + "(";
    size_t at = ptx.find(head);
    if (at == std::string::npos) return sizes;
    const size_t end = ptx.find(')', at);
    for (size_t p = ptx.find(".param", at); p < end; p = ptx.find(".param", p + 1)) {
        const std::string decl = ptx.substr(p, ptx.find_first_of(",)", p) - p);
        size_t bracket = decl.find('[');
        if (bracket != std::string::npos) sizes.push_back((size_t)atoi(decl.c_str() + bracket + 1));
        else if (decl.find("64 ") != std::string::npos) sizes.push_back(8);
        else if (decl.find("32 ") != std::string::npos) sizes.push_back(4);
        else if (decl.find("16 ") != std::string::npos) sizes.push_back(2);
        else sizes.push_back(1);
    }
    return sizes;
}

/* Every extern "C" kernel of the table takes, as compiled, exactly the parameters its host handle passes: the same
 * count and byte sizes (the host/kernel contract cannot drift apart). */
TEST(backend, kernel_table_matches_the_compiled_kernels) {
    const dllm__arch a = dllm__arch_for(90);
    int checked = 0;
    for (const dllm__jit_request &rq : {dllm__module_rowwise(a), dllm__module_sampler(a), dllm__module_q4wg(a)}) {
        std::vector<char> cubin;
        std::vector<std::string> lowered;
        std::string log, ptx;
        CHECK_STATUS(dllm__nvrtc_compile(rq, cubin, lowered, log, &ptx), DLLM_OK, nullptr);
        auto check = [&](const char *name, const std::vector<size_t> &host) {
            const std::vector<size_t> dev = test_ptx_param_sizes(ptx, name);
            CHECK_MSG(dev == host, "%s: the kernel takes %zu parameters, its handle passes %zu (or their sizes differ)",
                      name, dev.size(), host.size());
            checked++;
        };
#define TEST_KERNEL_SIZES(kname, attrs, params) check(#kname, dllm__kernel<dllm__sig_##kname>::param_sizes());
        if (rq.name == "dllm_rowwise") {
            DLLM__ROWWISE_KERNELS(TEST_KERNEL_SIZES) DLLM__FP8_QUANT_KERNELS(TEST_KERNEL_SIZES)
        } else if (rq.name == "dllm_q4wg") {
            DLLM__Q4WG_KERNELS(TEST_KERNEL_SIZES)
        } else {
            DLLM__SAMPLER_KERNELS(TEST_KERNEL_SIZES)
        }
#undef TEST_KERNEL_SIZES
    }
    printf("    %d kernels checked against their PTX entry points\n", checked);
    CHECK(checked > 0);  // a kernel missing from the PTX fails its own check above
}

/* The #line directives of the amalgamation: a compile error in a kernel file names that file of src/kernels/ and the
 * line (here one past the file's last, where the broken line is appended). */
TEST(backend, kernel_errors_name_lines_of_their_src_kernels_file) {
    const std::string fp8 = dllm__src_fp8;  // the row-wise module's last source
    CHECK(fp8.rfind("\n#line 1 \"src/kernels/fp8.cuh\"\n", 0) == 0);
    const int file_lines = (int)std::count(fp8.begin(), fp8.end(), '\n') - 2;  // less the blank line and the #line
    dllm__jit_request rq = dllm__module_rowwise(dllm__arch_for(80));
    rq.source += "extern \"C\" __global__ void k(int *x) { x[0] = undefined_name; }\n";
    std::vector<char> cubin;
    std::vector<std::string> lowered;
    std::string log;
    CHECK_STATUS(dllm__nvrtc_compile(rq, cubin, lowered, log), DLLM_ERR_JIT, "undefined_name");
    const std::string want = dllm__format("src/kernels/fp8.cuh(%d)", file_lines + 1);
    CHECK_MSG(log.find(want) != std::string::npos, "the log does not name %s:\n%s", want.c_str(), log.c_str());
}

/* The shared structs' layout is what the kernels index (fields the host reads back by member). */
TEST(backend, contract_structs_have_the_kernels_layout) {
    CHECK(offsetof(dllm_step_state, global_step) == 16 && offsetof(dllm_step_state, n_committed) == 24 &&
          offsetof(dllm_step_state, n_block_left) == 28);
    CHECK(offsetof(conf_partial, best_idx) == 36 && offsetof(sampler_args, temperature) == 56 &&
          offsetof(attn_args, st) == 80);
    const std::string src = dllm__src_contract();
    CHECK(src.find("struct sampler_args") != std::string::npos && src.find("REMASK_ORIGIN = 4") != std::string::npos);
}

// ---- contexts over one model ------------------------------------------------------------------------

/* Each of n_threads threads decodes its own prompt on its own context over one model; the tokens equal a decode of the
 * same prompt alone on one context. */
static void test_threads_decode_alone(dllm_test_state &T_, dllm_backend backend) {
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    const int n_threads = 3, gen = 16;
    std::vector<std::vector<int32_t>> prompts = {{3, 14, 15, 92, 65}, {35, 89, 79, 32, 38, 46, 26}, {43, 38, 32}};
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = gen, p.steps = gen, p.block_length = 8, p.stop_at_eos = 0, p.temperature = 0.7f, p.seed = 5;
    std::vector<std::vector<int32_t>> alone(n_threads, std::vector<int32_t>(gen)), together = alone;
    dllm_ctx *one = test_ctx(m, backend);
    for (int i = 0; one && i < n_threads; i++)
        CHECK_STATUS(
            dllm_generate(one, prompts[i].data(), (int)prompts[i].size(), p, alone[i].data(), gen, nullptr, nullptr),
            DLLM_OK, nullptr);
    dllm_ctx_free(one);
    std::vector<dllm_ctx *> ctx(n_threads);
    for (dllm_ctx *&c : ctx) c = test_ctx(m, backend);
    std::vector<dllm_status> st(n_threads, DLLM_ERR_INTERNAL);
    std::vector<std::thread> threads;
    for (int i = 0; i < n_threads; i++)
        threads.emplace_back([&, i] {
            if (ctx[i])
                st[i] = dllm_generate(ctx[i], prompts[i].data(), (int)prompts[i].size(), p, together[i].data(), gen,
                                      nullptr, nullptr);
        });
    for (std::thread &t : threads) t.join();
    for (int i = 0; i < n_threads; i++) {
        CHECK(st[i] == DLLM_OK);
        CHECK_MSG(together[i] == alone[i], "thread %d decoded other tokens than a context alone", i);
        dllm_ctx_free(ctx[i]);
    }
    dllm_model_free(m);
}

TEST(backend, cpu_contexts_on_threads_decode_as_alone) { test_threads_decode_alone(T_, DLLM_BACKEND_CPU); }

TEST(gpu, contexts_on_threads_decode_as_alone) {
    NEED_GPU();
    test_threads_decode_alone(T_, DLLM_BACKEND_GPU);
}

/* A second context on a model adds its activations and caches only: the weights are the first one's. Measured as the
 * device memory a context takes after a short decode (cudaMemGetInfo), at the LLaDA-8B shape. */
TEST(gpu, contexts_share_the_model_weights) {
    NEED_GPU();
    dllm_model *m = test_llada_8b_shape(T_, 7);
    if (!m) return;
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_GPU;
    cp.max_tokens = 1024;
    auto free_bytes = [] {
        size_t free_b = 0, total = 0;
        cudaDeviceSynchronize();
        cudaMemGetInfo(&free_b, &total);
        return (double)free_b;
    };
    std::vector<int32_t> prompt(480, 11), out(64);
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = 64, p.steps = 8, p.block_length = 32, p.stop_at_eos = 0, p.kv_cache = DLLM_KV_CACHE_DUAL;
    const double before = free_bytes();
    dllm_ctx *a = nullptr, *b = nullptr;
    CHECK_STATUS(dllm_ctx_create(m, cp, &a), DLLM_OK, nullptr);
    if (a) CHECK_STATUS(dllm_generate(a, prompt.data(), 480, p, out.data(), 64, nullptr, nullptr), DLLM_OK, nullptr);
    const double after_a = free_bytes();
    CHECK_STATUS(dllm_ctx_create(m, cp, &b), DLLM_OK, nullptr);
    std::vector<int32_t> out_b(64);
    if (b) CHECK_STATUS(dllm_generate(b, prompt.data(), 480, p, out_b.data(), 64, nullptr, nullptr), DLLM_OK, nullptr);
    const double after_b = free_bytes();
    printf("    LLaDA-8B shape: the first context takes %.2f GB, the second %.2f GB more\n", (before - after_a) / 1e9,
           (after_a - after_b) / 1e9);
    CHECK(before - after_a > 15e9 && after_a - after_b < 1.5e9);
    CHECK(out == out_b);
    if (a && b)
        CHECK(&((dllm__gpu_backend *)a->impl.get())->weights() == &((dllm__gpu_backend *)b->impl.get())->weights());
    dllm_ctx_free(a);
    const double after_free_a = free_bytes();
    dllm_ctx_free(b);
    const double after_free_b = free_bytes();
    printf("    freeing the first gives back %.2f GB, the last %.2f GB (the weights with it)\n",
           (after_free_a - after_b) / 1e9, (after_free_b - after_free_a) / 1e9);
    CHECK(after_free_b - after_free_a > 15e9);
    dllm_model_free(m);
}

// ---- bad weights and failing device allocations (issue 28, the GPU side) ------------------------------

/* find_nonfinite_bf16 against its twin: random bf16 with NaN and infinities planted at awkward places, and none. */
TEST(gpu, nonfinite_weight_search_matches_twin) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("nonfinite");
    for (uint64_t n : {1ull, 777ull, 1000003ull}) {
        std::vector<float> f(n);
        for (float &x : f) x = r.normal();
        std::vector<uint16_t> w = test_bf16_vec(f);
        for (int plant = 0; plant < 3; plant++) {
            if (plant == 1) w[(size_t)r.below((int)n)] = 0x7fc0;                     // NaN
            if (plant == 2) w[(size_t)r.below((int)std::min<uint64_t>(n, 1000))] = 0xff80;  // -infinity
            dllm__dbuf dw, df;
            test_put(dw, w);
            test_put(df, std::vector<uint64_t>{n});
            CHECK_STATUS(g.rw.find_nonfinite_bf16.launch({dim3(1024), dim3(256)}, 0, dw.ptr, n, df.ptr), DLLM_OK,
                         nullptr);
            dllm__tensor host;  // the twin: the CPU backend's scan of a checkpoint tensor
            host.dtype = DLLM__BF16, host.numel = (int64_t)n, host.data = (const uint8_t *)w.data();
            const int64_t first = dllm__first_nonfinite(host, 0, (int64_t)n);
            CHECK(test_get<uint64_t>(df, 1)[0] == (first < 0 ? n : (uint64_t)first));
        }
    }
}

/* A copy of a fixture with one weight element set to `bits` (bf16), written into dir. */
static bool test_damage_checkpoint(const std::string &from, const std::string &dir, const char *tensor, size_t element,
                                   uint16_t bits) {
    for (const char *f : {"config.json", "generation_config.json", "model.safetensors"}) {
        std::string bytes = test_read_file(from + "/" + f);
        if (bytes.empty() && strcmp(f, "generation_config.json") == 0) continue;
        if (strcmp(f, "model.safetensors") == 0) {
            uint64_t header = 0;
            memcpy(&header, bytes.data(), 8);
            dllm__json j;
            if (dllm__json_parse(bytes.data() + 8, (size_t)header, "test", j) != DLLM_OK || !j.find(tensor))
                return false;
            const dllm__json *t = j.find(tensor);
            if (t->find("dtype")->str != "BF16") return false;
            const size_t at = 8 + (size_t)header + (size_t)t->find("data_offsets")->items[0].integer + 2 * element;
            memcpy(&bytes[at], &bits, 2);
        }
        if (!test_write_file(dir + "/" + f, bytes)) return false;
    }
    return true;
}

/* A checkpoint with a NaN or an infinity in a weight: creating a GPU context fails with DLLM_ERR_FORMAT naming the
 * tensor and the element, and nothing stays allocated. */
TEST(gpu, nonfinite_weights_are_refused_by_name) {
    NEED_GPU();
    const char *tensor = "model.transformer.blocks.1.ff_out.weight";
    for (uint16_t bits : {(uint16_t)0x7fc0, (uint16_t)0xff80}) {
        test_tmpdir dir;
        if (!test_damage_checkpoint("models/tiny-llada", dir.path, tensor, 1234, bits)) {
            CHECK(!"could not write the damaged checkpoint");
            return;
        }
        dllm_model *m = test_load(dir.path);
        if (!m) { CHECK(m != nullptr); return; }
        const int64_t before = dllm__device_bytes;
        dllm_ctx_params cp = dllm_ctx_default_params();
        cp.backend = DLLM_BACKEND_GPU;
        dllm_ctx *ctx = nullptr;
        CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_ERR_FORMAT, "ff_out.weight");
        CHECK(ctx == nullptr && strstr(dllm_last_error(), "non-finite") != nullptr && dllm__device_bytes == before);
        printf("    %s\n", dllm_last_error());
        dllm_model_free(m);
    }
}

/* Every device allocation of context creation and of a generation made to fail in turn: each failure is a clean
 * DLLM_ERR_OUT_OF_MEMORY, no device memory stays allocated, and the next attempt works. */
TEST(gpu, failing_device_allocations_are_clean_errors) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_GPU;
    int32_t prompt[] = {3, 14, 15, 92, 65};
    dllm_gen_params p = dllm_gen_default_params();
    p.gen_length = 16, p.steps = 16, p.block_length = 8, p.kv_cache = DLLM_KV_CACHE_DUAL;
    std::vector<int32_t> out(16);
    const int64_t base = dllm__device_bytes;
    int create_sites = 0, generate_sites = 0;
    for (int i = 1; i < 200; i++) {  // context creation
        dllm__device_alloc_countdown = i;
        dllm_ctx *ctx = nullptr;
        dllm_status s = dllm_ctx_create(m, cp, &ctx);
        const bool hit = dllm__device_alloc_countdown == 0;
        dllm__device_alloc_countdown = 0;
        if (!hit) {  // every allocation passed: the context is whole
            CHECK(s == DLLM_OK);
            dllm_ctx_free(ctx);
            break;
        }
        create_sites++;
        CHECK_MSG(s == DLLM_ERR_OUT_OF_MEMORY && ctx == nullptr, "allocation %d of context creation: %s", i,
                  dllm_status_str(s));
        CHECK_MSG(dllm__device_bytes == base, "allocation %d of context creation failed and left %lld bytes", i,
                  (long long)(dllm__device_bytes - base));
    }
    // A generation's buffers: dllm_generate's own forwards (tuned_forwards), then a batch of one (the default), which
    // decodes through those forwards instead where its K/V cache slot cannot be allocated: the tuned run's ids.
    std::vector<int32_t> tuned_out(16, -1);
    int recovered = 0;
    for (int tuned : {1, 0}) {
        p.tuned_forwards = tuned;
        for (int i = 1; i < 200; i++) {
            dllm_ctx *ctx = nullptr;
            CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
            if (!ctx) break;
            dllm__device_alloc_countdown = i;
            std::fill(out.begin(), out.end(), -7);
            dllm_status s = dllm_generate(ctx, prompt, 5, p, out.data(), 16, nullptr, nullptr);
            const bool hit = dllm__device_alloc_countdown == 0;
            dllm__device_alloc_countdown = 0;
            if (hit) {
                generate_sites++;
                const bool alone = !tuned && s == DLLM_OK && out == tuned_out;
                recovered += alone;
                CHECK_MSG(s == DLLM_ERR_OUT_OF_MEMORY || alone, "allocation %d of a generation (tuned_forwards %d): %s",
                          i, tuned, dllm_status_str(s));
                CHECK_STATUS(dllm_generate(ctx, prompt, 5, p, out.data(), 16, nullptr, nullptr), DLLM_OK,
                             nullptr);  // the context still works
            }
            dllm_ctx_free(ctx);
            CHECK(dllm__device_bytes == base);
            if (!hit) {
                CHECK(s == DLLM_OK);
                if (tuned) tuned_out = out;
                break;
            }
        }
    }
    printf("    %d allocation sites of context creation and %d of a generation failed in turn, each cleanly (%d "
           "recovered by decoding alone)\n",
           create_sites, generate_sites, recovered);
    CHECK(create_sites > 10 && generate_sites > 20);
    dllm_model_free(m);
}
