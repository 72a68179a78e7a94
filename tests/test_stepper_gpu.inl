/* Tests: continuous batching (dllm_stepper) on the GPU backend (issue 42). test_stepper.inl's driver with the GPU's
 * reference: each sequence decoded as a batch of one
 * (dllm_generate_batch of the item alone: the same batched forward in any batch; dllm_generate tunes its forwards per
 * row count, so its tokens equal a batched sequence's only up to near-ties). Every sequence joining and leaving at
 * random steps gets its batch of one's ids, stats, step callbacks and canvases, and with the host's choice
 * (dllm__debug_step_logits set) its logits, bit for bit; with the device's choice (the default) its ids and canvases. A
 * long run's device memory stops growing. */

/* A model's cases (test_stepper_plain_cases) through steppers of 2 and 12 sequences on the GPU, against each one's
 * batch of one: with the host's choice (logits compared) and the device's. */
static void test_stepper_gpu_plain(dllm_test_state &T_, const char *model_dir, bool dream, bool kv, uint32_t seed,
                                   dllm_precision precision = DLLM_PRECISION_BF16) {
    NEED_GPU();
    dllm_model *m = test_load(test_data(model_dir));
    dllm_ctx *gpu = m ? test_ctx_precision(m, DLLM_BACKEND_GPU, precision) : nullptr;
    if (!gpu) { CHECK(gpu != nullptr); dllm_model_free(m); return; }
    dllm_model_info info;
    dllm_model_get_info(m, &info);
    for (int host_choice = 1; host_choice >= 0; host_choice--) {
        dllm__debug_step_logits = host_choice ? test_stepper_logits_hook : nullptr;
        std::mt19937 rng(seed);
        std::vector<test_stepper_case> cs = test_stepper_plain_cases(gpu, info, dream, kv, rng, 12);
        for (test_stepper_case &c : cs) test_stepper_run_alone(gpu, c, c.cancel_after, true);
        for (int max_sequences : {2, 12}) {
            const std::string label = dllm__format("GPU %s%s %s choice max %d", model_dir, kv ? " kv" : "",
                                                   host_choice ? "host" : "device", max_sequences);
            test_stepper_drive(T_, gpu, cs, rng, max_sequences, label.c_str());
            for (test_stepper_case &c : cs) test_stepper_check_case(T_, gpu, c, label.c_str(), true);
        }
    }
    dllm__debug_step_logits = nullptr;
    dllm_ctx_free(gpu);
    dllm_model_free(m);
}

TEST(gpu_stepper, llada_sequences_joining_and_leaving_equal_batch_of_one) {
    test_stepper_gpu_plain(T_, "tiny-llada", false, false, 142);
}

TEST(gpu_stepper, dream_sequences_joining_and_leaving_equal_batch_of_one) {
    test_stepper_gpu_plain(T_, "tiny-dream", true, false, 4142);
}

/* [dual cache] [prefix cache] K/V cache slots taken, freed and moved (batch_kv_reserve with kept slots: a live slot
 * copied when an earlier one grows) while sequences decode. */
TEST(gpu_stepper, kv_cache_sequences_joining_and_leaving_equal_batch_of_one) {
    test_stepper_gpu_plain(T_, "tiny-llada", false, true, 143);
    test_stepper_gpu_plain(T_, "tiny-dream", true, true, 144);
}

TEST(gpu_stepper, fp8_and_soloq_sequences_equal_batch_of_one) {
    test_stepper_gpu_plain(T_, "tiny-llada", false, true, 145, DLLM_PRECISION_FP8_ALL);
    test_stepper_gpu_plain(T_, "tiny-dream", true, false, 146, DLLM_PRECISION_SOLOQ_N);
}

/* Block diffusion on the GPU: test_bdi_cases' items joining and leaving (bd_batch_reserve with kept slots), each
 * against its batch of one. */
TEST(gpu_stepper, block_diffusion_sequences_joining_and_leaving_equal_batch_of_one) {
    NEED_GPU();
    test_tmpdir dir;
    for (const char *model_dir : {"tiny-fast-dllm-v2", "random tiny Nemotron"}) {
        // the Nemotron fixture's vocabulary (131) is no multiple of 8: the GPU takes test_random_nemotron's
        dllm_model *m = model_dir[0] == 't' ? test_load(test_data(model_dir)) : test_random_nemotron(dir, 0x57a0, true);
        dllm_ctx *gpu = m ? test_ctx(m, DLLM_BACKEND_GPU) : nullptr;
        if (!gpu) { CHECK(gpu != nullptr); dllm_model_free(m); return; }
        std::vector<test_stepper_case> cs;
        for (const test_bdi_case &b : test_bdi_cases(gpu, 0x57a1)) {
            test_stepper_case c;
            c.what = b.what, c.prompt = b.prompt, c.params = b.params, c.out_capacity = b.out_capacity,
            c.cancel_after = b.cancel_after;
            test_stepper_run_alone(gpu, c, c.cancel_after, true);
            cs.push_back(c);
        }
        std::mt19937 rng(0x57a2);
        for (int max_sequences : {3, 10}) {
            const std::string label = dllm__format("GPU %s max %d", model_dir, max_sequences);
            test_stepper_drive(T_, gpu, cs, rng, max_sequences, label.c_str());
            for (test_stepper_case &c : cs) test_stepper_check_case(T_, gpu, c, label.c_str(), true);
        }
        dllm_ctx_free(gpu);
        dllm_model_free(m);
    }
}

/* [KV quant] Block diffusion under SoloQ's KV4 and KV2 caches on the GPU: test_bdi_cases' items joining and leaving at
 * random steps (each slot's codes taken, kept and reused: gpu/batch_kvq.cpp), each against its batch of one. */
TEST(gpu_stepper, kv_quant_sequences_joining_and_leaving_equal_batch_of_one) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    for (dllm_kv_quant q : {DLLM_KV_QUANT_SOLOQ_KV4, DLLM_KV_QUANT_SOLOQ_KV2}) {
        dllm_ctx_params p = dllm_ctx_default_params();
        p.backend = DLLM_BACKEND_GPU, p.kv_quant = q;
        dllm_ctx *gpu = test_ctx_params(m, p);
        if (!gpu) { CHECK(gpu != nullptr); continue; }
        CHECK_MSG(gpu->impl->batch_caps().block_diffusion.empty(), "%s",
                  gpu->impl->batch_caps().block_diffusion.c_str());
        std::vector<test_stepper_case> cs;
        for (const test_bdi_case &b : test_bdi_cases(gpu, 0x57b1 + (uint64_t)q)) {
            test_stepper_case c;
            c.what = b.what, c.prompt = b.prompt, c.params = b.params, c.out_capacity = b.out_capacity,
            c.cancel_after = b.cancel_after;
            test_stepper_run_alone(gpu, c, c.cancel_after, true);
            cs.push_back(c);
        }
        std::mt19937 rng(0x57b2 + (uint32_t)q);
        for (int max_sequences : {2, 4, 10}) {
            const std::string label = dllm__format("GPU %s max %d", dllm__kvq_names[q], max_sequences);
            test_stepper_drive(T_, gpu, cs, rng, max_sequences, label.c_str());
            for (test_stepper_case &c : cs) test_stepper_check_case(T_, gpu, c, label.c_str(), true);
        }
        dllm_ctx_free(gpu);
    }
    dllm_model_free(m);
}

TEST(gpu_stepper, finished_sequences_memory_is_reused) {
    NEED_GPU();
    test_stepper_memory_on(T_, DLLM_BACKEND_GPU);
}
