/* Tests: block diffusion on the GPU backend (dllm__gpu_backend's bd_begin / bd_forward, section 16.4.3) against the
 * CPU reference: the block-causal attention and the Llama-4 query scaling kernels against their CPU twins on random
 * inputs, every kind of forward (dllm__bd_kind) on the tiny Fast-dLLM v2 fixture and a random tiny Nemotron
 * checkpoint, decoding traces, the cache-full error and the backend choice. */

// ---- kernels vs their CPU twins ------------------------------------------------------------------------------

/* flash_attn under the block-causal mask (attn_args.mask_block / q_index0) on the block-diffusion cache layout: T
 * queries (fused projection rows) over n_keys K|V rows (kv_stride 2 n_kv hd), the queries at sequence indices
 * q_index0 + i; against dllm__cpu_attention. `wide`: flash_attn_wg where the GPU has it (one share). */
static void test_bd_attention_case(dllm_test_state &T_, test_gpu &g, test_rng &r, int hd, int H, int KV, int T,
                                   int n_keys, int q_index0, int mask_block, int splits, bool wide = false) {
    const int qkv = (H + 2 * KV) * hd, kvd = KV * hd;
    dllm__attn_kernels k = test_attn_kernels(T_, g, hd);
    if (!k.attn.fn) return;
    std::vector<float> qf((size_t)T * qkv), kvf((size_t)n_keys * 2 * kvd);
    for (float &v : qf) v = r.normal();
    for (float &v : kvf) v = r.normal();
    const std::vector<uint16_t> qb = test_bf16_vec(qf), kvb = test_bf16_vec(kvf);
    dllm__dbuf dq, dkv, dout, dpart;
    test_put(dq, qb);
    test_put(dkv, kvb);
    test_poison(dout, (size_t)T * H * hd * 2);
    test_poison(dpart, (size_t)splits * H * T * (hd + 2) * 4);
    attn_args a = {};
    a.q = dq.as<bf16_t>(), a.k = dkv.as<bf16_t>(), a.v = dkv.as<bf16_t>() + kvd, a.o = dout.as<bf16_t>();
    a.seq = n_keys, a.q_rows = T, a.q_stride = qkv, a.kv_stride = 2 * kvd, a.o_stride = H * hd, a.group = H / KV;
    a.q_bstride = (u64)T * qkv, a.o_bstride = (u64)T * H * hd, a.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    a.kv_splits = splits, a.partial = dpart.as<float>(), a.mask_block = mask_block, a.q_index0 = q_index0;
    CHECK_STATUS(dllm__attn_launch(k, g.arch, hd, H, 1, a, 0, wide), DLLM_OK, nullptr);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<float> got = test_f32_vec(test_get<uint16_t>(dout, (size_t)T * H * hd)), x = test_f32_vec(qb),
                             kv = test_f32_vec(kvb);
    std::vector<float> q((size_t)T * H * hd), kk((size_t)n_keys * kvd), vv((size_t)n_keys * kvd),
        want((size_t)T * H * hd);
    for (int i = 0; i < T; i++) std::copy(&x[(size_t)i * qkv], &x[(size_t)i * qkv] + H * hd, &q[(size_t)i * H * hd]);
    for (int j = 0; j < n_keys; j++) {
        std::copy(&kv[(size_t)j * 2 * kvd], &kv[(size_t)j * 2 * kvd] + kvd, &kk[(size_t)j * kvd]);
        std::copy(&kv[(size_t)j * 2 * kvd] + kvd, &kv[(size_t)j * 2 * kvd] + 2 * kvd, &vv[(size_t)j * kvd]);
    }
    dllm__pool pool(1);
    dllm__cpu_attention(pool, q.data(), kk.data(), vv.data(), T, n_keys, H, KV, hd, nullptr, want.data(), q_index0,
                        mask_block);
    const double err = test_max_rel(got, want);
    printf(
        "    block-causal attention%s hd=%d H=%d KV=%d: %d queries from %d over %d keys, mask block %d, %d share(s): "
        "max relative error %.2e\n",
        wide && k.wide.fn ? " (flash_attn_wg)" : "", hd, H, KV, T, q_index0, n_keys, mask_block, splits, err);
    CHECK_MSG(err < 2e-2, "block-causal attention hd=%d T=%d keys=%d Bm=%d: error %.3e", hd, T, n_keys, mask_block,
              err);
}

TEST(gpu, block_causal_attention_matches_cpu) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("block_causal_attention");
    // A fresh forward from position 0 (the prompt's prefill: block-causal at 32, token-causal: key tiles past a query
    // tile's last visible key are skipped), a block over a cache (the fresh rows after 45 and 300 committed ones), a
    // sub-block's unmasked rows over cache ++ block cache, a block-causal granularity that does not divide the cache,
    // and split-KV (more shares than tiles; shares wholly past the visible keys).
    test_bd_attention_case(T_, g, r, 64, 4, 2, 77, 77, 0, 32, 1);
    test_bd_attention_case(T_, g, r, 128, 4, 1, 150, 150, 0, 1, 1);
    test_bd_attention_case(T_, g, r, 24, 4, 2, 32, 45 + 32, 45, 32, 1);
    test_bd_attention_case(T_, g, r, 128, 7, 1, 32, 300 + 32, 300, 32, 3);
    test_bd_attention_case(T_, g, r, 128, 4, 2, 8, 300 + 32, 316, 0, 4);
    test_bd_attention_case(T_, g, r, 64, 6, 3, 37, 130 + 37, 130, 12, 2);
    test_bd_attention_case(T_, g, r, 16, 6, 2, 1, 9, 8, 8, 5);
    test_bd_attention_case(T_, g, r, 64, 2, 1, 200, 200, 0, 1, 3);  // token-causal over skipped tiles, in shares
    // flash_attn_wg (sm_90a; flash_attn elsewhere): a prefill whose last query tile is short and GQA 7, token-causal,
    // a block over a cache with a granularity that divides neither, and no mask over more keys than queries.
    if (g.arch.fa_wg_bc) CHECK(test_attn_kernels(T_, g, 128).wide.fn && test_attn_kernels(T_, g, 64).wide.fn);
    test_bd_attention_case(T_, g, r, 128, 7, 1, 300, 300, 0, 32, 1, true);
    test_bd_attention_case(T_, g, r, 128, 4, 2, 200, 200, 0, 1, 1, true);
    test_bd_attention_case(T_, g, r, 64, 4, 2, 77, 45 + 77, 45, 12, 1, true);
    test_bd_attention_case(T_, g, r, 128, 2, 2, 129, 260 + 129, 260, 32, 1, true);
    test_bd_attention_case(T_, g, r, 64, 4, 1, 130, 500, 370, 0, 1, true);
}

/* llama4_scale_q against dllm__cpu_llama4_scale on the bf16 query heads of fused rows whose positions cross several
 * multiples of orig_max; the K and V heads stay untouched. */
TEST(gpu, llama4_query_scaling_matches_cpu) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("llama4_scale_q");
    dllm__config c;
    c.n_head = 5, c.head_dim = 24, c.llama4_beta = 0.1f + r.uniform(), c.llama4_orig_max = 7;
    const int rows = 41, pos0 = 3, width = c.n_head * c.head_dim, stride = width + 2 * 2 * c.head_dim;
    std::vector<float> x((size_t)rows * stride);
    for (float &v : x) v = r.normal();
    const std::vector<uint16_t> xb = test_bf16_vec(x);
    dllm__dbuf d;
    test_put(d, xb);
    CHECK_STATUS(g.rw.llama4_scale_q.launch({dllm__rows_grid(rows, width / 8, 256), dim3(256)}, 0, d.ptr, rows, stride,
                                            width, pos0, c.llama4_beta, c.llama4_orig_max),
                 DLLM_OK, nullptr);
    const std::vector<float> got = test_f32_vec(test_get<uint16_t>(d, xb.size()));
    std::vector<float> in = test_f32_vec(xb), q((size_t)rows * width);
    std::vector<int32_t> pos((size_t)rows);
    for (int i = 0; i < rows; i++) {
        pos[(size_t)i] = pos0 + i;
        std::copy(&in[(size_t)i * stride], &in[(size_t)i * stride] + width, &q[(size_t)i * width]);
    }
    dllm__cpu_llama4_scale(c, q.data(), rows, pos.data());
    double worst = 0;
    bool rest_same = true;
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < width; j++) {
            const float want = q[(size_t)i * width + j], have = got[(size_t)i * stride + j];
            worst = std::max(worst, (double)fabsf(have - want) / std::max(1e-3f, fabsf(want)));
        }
        for (int j = width; j < stride; j++) rest_same &= got[(size_t)i * stride + j] == in[(size_t)i * stride + j];
    }
    printf("    llama4_scale_q: beta %.3f, positions %d..%d over orig_max %d: max relative error %.2e\n", c.llama4_beta,
           pos0, pos0 + rows - 1, c.llama4_orig_max, worst);
    CHECK_MSG(worst <= 1.0 / 128, "Llama-4 query scaling error %.3e (bf16 rounding is 2^-8)", worst);
    CHECK(rest_same);
}

// ---- the forward ------------------------------------------------------------------------------------------------

/* A random tiny Nemotron-Labs-Diffusion checkpoint the GPU backend takes (vocabulary a multiple of 8, unlike the
 * fixture's 131): YaRN with an attention factor != 1, Llama-4 query scaling from position 32, block 8, the
 * encoder.* / diffusion_head names, logits shifted or not. Weights N(0, 0.12) from `seed`, the head's N(0, 0.5) (logits
 * far from flat: fewer near-ties), norms 1 + N(0, 0.1). */
static dllm_model *test_random_nemotron(const test_tmpdir &dir, uint64_t seed, bool shift_logits, int head_dim = 24) {
    std::string cfg = test_read_file(test_data("tiny-nemotron-diffusion/config.json"));
    cfg.replace(cfg.find("\"vocab_size\": 131"), 17, "\"vocab_size\": 136");
    cfg.replace(cfg.find("\"head_dim\": 24"), 14, dllm__format("\"head_dim\": %d", head_dim));
    if (!shift_logits) cfg.insert(cfg.rfind('}'), ", \"shift_logits\": false");
    test_write_file(dir.file("config.json"), cfg);
    dllm__config c;
    if (test_config(cfg, c) != DLLM_OK) return nullptr;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    test_st_builder st;
    for (const dllm__wspec &s : dllm__expected_weights(c)) {
        int64_t n = 1;
        for (int64_t d : s.shape) n *= d;
        const bool norm = s.kind == DLLM__W_ATTN_NORM || s.kind == DLLM__W_FFN_NORM || s.kind == DLLM__W_FINAL_NORM;
        std::vector<float> v((size_t)n);
        const float std_dev = s.kind == DLLM__W_HEAD ? 0.5f : 0.12f;
        for (float &x : v) x = norm ? 1 + 0.1f * normal(rng) : std_dev * normal(rng);
        st.add(s.name, "BF16", s.shape, test_bf16_bytes(v));
    }
    test_write_file(dir.file("model.safetensors"), st.bytes());
    return test_load(dir.path);
}

/* One scripted forward of the schedule on a backend. */
struct test_bd_fwd {
    dllm__bd_kind kind;
    int start, T, offset, mask_block, r0, r1;  // ids [start, start + T) of the script's sequence
};

/* The script on one backend: bd_begin(rows), then every forward's raw logits, appended. */
static dllm_status test_bd_run(dllm__backend_impl &b, const dllm_model &m, int rows, const std::vector<int32_t> &ids,
                               const std::vector<test_bd_fwd> &script, std::vector<float> &out) {
    DLLM__TRY(b.bd_begin(rows));
    out.clear();
    for (const test_bd_fwd &f : script) {
        dllm__bd_call call;
        call.kind = f.kind, call.ids = ids.data() + f.start, call.T = f.T, call.offset = f.offset,
        call.mask_block = f.mask_block;
        call.r0 = f.r0, call.r1 = f.r1;
        std::vector<float> l((size_t)(f.r1 - f.r0) * m.cfg.n_vocab, NAN);
        DLLM__TRY(b.bd_forward(call, l.data()));
        out.insert(out.end(), l.begin(), l.end());
    }
    return DLLM_OK;
}

/* Every kind of forward on the CPU and the GPU backend, logits compared forward by forward: a prompt longer than a
 * block (prefill, a block without and with the block cache, two sub-blocks, the commit, the next block's first
 * step), one shorter than a block (no prefill: the first block holds the prompt's tail), and a long prefill; then
 * dllm_logits. */
static void test_bd_forward_compare(dllm_test_state &T_, const char *name, dllm_model *m, int B, int S) {
    dllm_ctx *cpu = test_ctx(m, DLLM_BACKEND_CPU), *gpu = test_ctx(m, DLLM_BACKEND_GPU);
    CHECK(cpu && gpu && dllm_ctx_get_backend(gpu) == DLLM_BACKEND_GPU);
    if (!cpu || !gpu) { dllm_ctx_free(cpu); dllm_ctx_free(gpu); return; }
    const dllm__config &c = m->cfg;
    const int V = c.n_vocab, prefill = c.bd_causal_context ? 1 : B, step = c.bd_mask_block;
    std::vector<int32_t> ids((size_t)7 * B);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 37 + 11) % (size_t)V);
    for (int i = 2 * B + 3; i < 3 * B; i += 2) ids[(size_t)i] = c.mask_id;  // a block being decoded: masks among tokens
    std::vector<int32_t> sub(ids.begin() + 2 * B + S, ids.begin() + 2 * B + 2 * S);  // a sub-block with new tokens
    for (int32_t &t : sub) t = (t + 5) % V;
    ids.insert(ids.end(), sub.begin(), sub.end());  // at 7B
    const int sub_at = 7 * B;
    struct script { const char *what; int rows; std::vector<test_bd_fwd> f; };
    const script scripts[] = {
        {"prompt longer than a block", 4 * B,
         {{DLLM__BD_COMMIT, 0, 2 * B, 0, prefill, 0, 2 * B},
          {DLLM__BD_STEP, 2 * B, B, 0, step, 0, B},
          {DLLM__BD_BLOCK_FULL, 2 * B, B, 0, step, S - 1, 2 * S},
          {DLLM__BD_SUB_BLOCK, sub_at, S, S, 0, 0, S},
          {DLLM__BD_SUB_BLOCK, 2 * B, S, 0, 0, 0, S},
          {DLLM__BD_COMMIT, 2 * B, B, 0, prefill, B - 1, B},
          {DLLM__BD_STEP, 3 * B, B, 0, step, 3, B}}},
        {"prompt shorter than a block", 3 * B,
         {{DLLM__BD_STEP, 2 * B, B, 0, step, 0, B},
          {DLLM__BD_BLOCK_FULL, 2 * B, B, 0, step, 0, B},
          {DLLM__BD_SUB_BLOCK, sub_at, S, S, 0, 0, S},
          {DLLM__BD_COMMIT, 2 * B, B, 0, prefill, 0, B},
          {DLLM__BD_BLOCK_FULL, 3 * B, B, 0, step, 0, B},
          {DLLM__BD_SUB_BLOCK, 3 * B + B - S, S, B - S, 0, 1, S}}},
        {"a long prefill (Nemotron: positions past its Llama-4 scaling's 32)", 7 * B,
         {{DLLM__BD_COMMIT, 0, 5 * B, 0, prefill, 0, 5 * B},
          {DLLM__BD_STEP, 5 * B, B, 0, step, 0, B},
          {DLLM__BD_COMMIT, 5 * B, B, 0, prefill, B - 1, B},
          {DLLM__BD_BLOCK_FULL, 6 * B, B, 0, step, 2, B},
          {DLLM__BD_SUB_BLOCK, sub_at, S, S, 0, 0, S}}},
    };
    for (const script &s : scripts) {
        std::vector<float> want, got;
        CHECK_STATUS(test_bd_run(*cpu->impl, *m, s.rows, ids, s.f, want), DLLM_OK, nullptr);
        CHECK_STATUS(test_bd_run(*gpu->impl, *m, s.rows, ids, s.f, got), DLLM_OK, nullptr);
        size_t at = 0;
        for (size_t i = 0; i < s.f.size() && got.size() == want.size(); i++) {
            const size_t n = (size_t)(s.f[i].r1 - s.f[i].r0) * V;
            std::vector<float> a(want.begin() + (long)at, want.begin() + (long)(at + n)),
                b(got.begin() + (long)at, got.begin() + (long)(at + n));
            at += n;
            const double err = test_max_rel(b, a);
            printf("    %s, %s, forward %zu (kind %d, %d rows): GPU vs CPU logits max relative error %.2e\n", name,
                   s.what, i, (int)s.f[i].kind, s.f[i].T, err);
            CHECK_MSG(err < 3e-2, "%s, %s, forward %zu: error %.3e", name, s.what, i, err);
        }
        CHECK(got.size() == want.size());
    }
    const int n = 2 * B + 5;
    std::vector<float> a((size_t)(n - 1) * V, NAN), b(a.size(), NAN);
    CHECK_STATUS(dllm_logits(cpu, ids.data(), n, 1, n, a.data(), a.size()), DLLM_OK, nullptr);
    CHECK_STATUS(dllm_logits(gpu, ids.data(), n, 1, n, b.data(), b.size()), DLLM_OK, nullptr);
    const double err = test_max_rel(b, a);
    printf("    %s, dllm_logits over %d ids: max relative error %.2e\n", name, n, err);
    CHECK_MSG(err < 3e-2, "%s dllm_logits: error %.3e", name, err);
    dllm_ctx_free(cpu);
    dllm_ctx_free(gpu);
}

TEST(gpu, block_diffusion_forward_matches_cpu) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    CHECK(m != nullptr);
    if (m) test_bd_forward_compare(T_, "tiny-fast-dllm-v2", m, 32, 8);
    dllm_model_free(m);
    test_tmpdir dir;
    m = test_random_nemotron(dir, 0x5eed, true);
    CHECK(m != nullptr && m->cfg.yarn && m->cfg.llama4_beta > 0 && m->cfg.bd_causal_context);
    if (m) test_bd_forward_compare(T_, "random tiny Nemotron", m, m->cfg.bd_size, 4);
    dllm_model_free(m);
    test_tmpdir dir64;
    m = test_random_nemotron(dir64, 0x5eed, true, 64);  // head dim 64: flash_attn_wg where the keys are not split
    CHECK(m != nullptr && m->cfg.head_dim == 64);
    if (m) test_bd_forward_compare(T_, "random tiny Nemotron, head dim 64", m, m->cfg.bd_size, 4);
    dllm_model_free(m);
}

/* The committed cache's limit on both backends: a forward past the rows bd_begin sized is an error naming them. */
TEST(block_diffusion, cache_full_is_a_clear_error) {
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    const std::vector<int32_t> ids(64, 7);
    const std::vector<test_bd_fwd> fill = {{DLLM__BD_COMMIT, 0, 32, 0, 32, 31, 32}},
                                   over = {{DLLM__BD_COMMIT, 0, 32, 0, 32, 31, 32},
                                           {DLLM__BD_STEP, 32, 8, 0, 32, 0, 8}};
    for (dllm_backend be : {DLLM_BACKEND_CPU, DLLM_BACKEND_GPU}) {
        if (be == DLLM_BACKEND_GPU && !test_have_gpu()) continue;
        dllm_ctx *ctx = test_ctx(m, be);
        CHECK(ctx != nullptr);
        if (!ctx) continue;
        std::vector<float> out;
        CHECK_STATUS(test_bd_run(*ctx->impl, *m, 32, ids, fill, out), DLLM_OK, nullptr);
        CHECK_STATUS(test_bd_run(*ctx->impl, *m, 32, ids, over, out), DLLM_ERR_INTERNAL,
                     "past 32 committed ones overflows the K/V cache (32 rows");
        dllm_ctx_free(ctx);
    }
    dllm_model_free(m);
}

// ---- decoding -----------------------------------------------------------------------------------------------------

/* A backend that forwards to another and keeps what each block-diffusion forward returned: its first id, rows and raw
 * logits. The decoding test reads a diverging step's own logits from it. */
struct test_bd_record {
    const int32_t *ids;
    int r0, r1;
    std::vector<float> logits;
};
struct test_bd_recording : dllm__backend_impl {
    dllm__backend_impl &inner;
    int n_vocab;
    std::vector<test_bd_record> records;
    test_bd_recording(dllm__backend_impl &b, int V) : inner(b), n_vocab(V) {}
    dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) override {
        return inner.logits(ids, n, r0, r1, out);
    }
    dllm_status begin_block(dllm__decode &st) override { return inner.begin_block(st); }
    dllm_status step(dllm__decode &st, std::vector<int32_t> &committed, bool want_host) override {
        return inner.step(st, committed, want_host);
    }
    dllm_status bd_begin(int rows) override { return inner.bd_begin(rows); }
    dllm_status bd_forward(const dllm__bd_call &call, float *logits) override {
        DLLM__TRY(inner.bd_forward(call, logits));
        records.push_back(
            {call.ids, call.r0, call.r1, std::vector<float>(logits, logits + (size_t)(call.r1 - call.r0) * n_vocab)});
        return DLLM_OK;
    }
};

/* After every step of a block-diffusion generation: the canvas, the commits, and the forward the step ran (the last
 * one recorded) with the canvas position of its row 0. */
struct test_bd_trace {
    test_bd_recording *live = nullptr;  // during the generation
    std::vector<test_bd_record> records;
    std::vector<std::vector<int32_t>> canvases, committed;
    std::vector<size_t> forward;
    std::vector<int> start;
};
static int test_bd_trace_step(const dllm_step_info *info, void *user) {
    test_bd_trace *t = (test_bd_trace *)user;
    t->canvases.emplace_back(info->canvas, info->canvas + info->canvas_len);
    t->committed.emplace_back(info->committed_pos, info->committed_pos + info->n_committed);
    t->forward.push_back(t->live->records.size() - 1);
    t->start.push_back(
        (int)(t->live->records.back().ids - info->canvas));  // a step changes the canvas its forward read
    return 0;
}

/* dllm_generate on ctx with its backend wrapped in a recorder for the generation. */
static dllm_status test_bd_generate_recorded(dllm_ctx *ctx, const std::vector<int32_t> &prompt, dllm_gen_params gp,
                                             test_bd_trace &t) {
    std::unique_ptr<dllm__backend_impl> backend = std::move(ctx->impl);
    test_bd_recording *rec = new test_bd_recording(*backend, ctx->model->cfg.n_vocab);
    ctx->impl.reset(rec);
    t.live = rec;
    gp.on_step = test_bd_trace_step, gp.on_step_data = &t;
    std::vector<int32_t> out((size_t)gp.gen_length + 1);
    const dllm_status st =
        dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, out.data(), (int)out.size(), nullptr, nullptr);
    t.records = std::move(rec->records);
    t.live = nullptr;
    ctx->impl = std::move(backend);  // frees the recorder
    return st;
}

/* A GPU step that differs from the CPU's (the steps before it equal, so both ran the same forward on the same canvas)
 * is accepted only at a near-tie of that forward's logits, with the BF16 noise of a row = max |GPU - CPU| there: two
 * tokens at one position whose CPU logits are within twice the noise, or a position one backend commits and the other
 * not whose confidence is within twice the noise (relatively: a logit moved by e moves a probability by a factor of
 * about exp(e)) of the threshold or of a position the other backend committed instead; or a block's first token (the
 * AR seed, from the commit forward before the step) whose two choices are that close on that forward's logit row. */
static bool test_bd_near_tie(const test_bd_trace &ta, const test_bd_trace &tb, size_t s, const dllm_model *m,
                             double tau, const char *what) {
    const test_bd_record &ra = ta.records[ta.forward[s]], &rb = tb.records[tb.forward[s]];
    const std::vector<int32_t> &a = ta.canvases[s], &b = tb.canvases[s];
    if (ta.start[s] != tb.start[s] || ra.r0 != rb.r0 || ra.r1 != rb.r1 || a.size() != b.size()) {
        printf("    %s the two backends ran different forwards\n", what);
        return false;
    }
    const int V = m->cfg.n_vocab, mask = m->cfg.mask_id;
    dllm__sampling greedy;  // the decoding loop's confidence: the mask id never predicted
    greedy.eos_logit_inf = true, greedy.eos_id = mask;
    auto row = [&](int p) {  // the raw row that scores position p (block-diffusion.md: row 0 scores itself)
        const int q = p - ta.start[s];
        return (m->cfg.shift_logits && q > 0 ? q - 1 : q) - ra.r0;
    };
    auto noise = [&](int r) {
        double e = 0;
        for (int v = 0; v < V; v++)
            e = std::max(e, (double)fabsf(ra.logits[(size_t)r * V + v] - rb.logits[(size_t)r * V + v]));
        return e;
    };
    auto conf = [&](int p) { return dllm__choose(&ra.logits[(size_t)row(p) * V], V, greedy, (uint32_t)p, 0).conf; };
    auto committed_at_s = [&](int p) {
        return std::count(ta.committed[s].begin(), ta.committed[s].end(), p) +
                   std::count(tb.committed[s].begin(), tb.committed[s].end(), p) >
               0;
    };
    std::vector<int> only;
    bool ok = true;
    for (int p = 0; p < (int)a.size(); p++) {
        if (a[(size_t)p] == b[(size_t)p]) continue;
        if (!committed_at_s(
                p)) {  // the block's first token: the AR seed, argmax of the commit forward before this step
            if (ta.forward[s] == 0 || tb.forward[s] == 0) return false;
            const test_bd_record &ca = ta.records[ta.forward[s] - 1], &cb = tb.records[tb.forward[s] - 1];
            double noise_seed = 0;
            for (int v = 0; v < V; v++)
                noise_seed = std::max(noise_seed, (double)fabsf(ca.logits[(size_t)v] - cb.logits[(size_t)v]));
            const double gap = fabs(ca.logits[(size_t)a[(size_t)p]] - ca.logits[(size_t)b[(size_t)p]]);
            printf("    %s AR seed at %d: CPU %d vs GPU %d, logit gap %.4f, noise bound %.4f\n", what, p, a[(size_t)p],
                   b[(size_t)p], gap, 2 * noise_seed);
            ok &= gap <= 2 * noise_seed;
            continue;
        }
        if (row(p) < 0 || row(p) >= ra.r1 - ra.r0) {
            printf("    %s position %d differs outside the step's rows\n", what, p);
            return false;
        }
        if (a[(size_t)p] != mask && b[(size_t)p] != mask) {
            const float *l = &ra.logits[(size_t)row(p) * V];
            const double gap = fabs(l[a[(size_t)p]] - l[b[(size_t)p]]), bound = 2 * noise(row(p));
            printf("    %s position %d: token CPU %d vs GPU %d, logit gap %.4f, noise bound %.4f\n", what, p,
                   a[(size_t)p], b[(size_t)p], gap, bound);
            ok &= gap <= bound;
        } else {
            only.push_back(p);
        }
    }
    for (int p : only) {
        const double c = conf(p), bound = 2 * noise(row(p));
        double gap = fabs(c - tau) / std::max(c, tau);
        for (int o : only)
            if ((a[(size_t)o] == mask) != (a[(size_t)p] == mask))
                gap = std::min(gap, fabs(c - conf(o)) / std::max(c, conf(o)));
        printf("    %s position %d committed by the %s only: confidence %.5f, relative gap %.5f, noise bound %.4f\n",
               what, p, a[(size_t)p] != mask ? "CPU" : "GPU", c, gap, bound);
        ok &= gap <= bound;
    }
    return ok;
}

/* The cases of a trace fixture (threshold, block cache, shift off, prompts around the block) decoded on both backends
 * of `models` (with shifted logits; without, for the cases marked "shift": false): the GPU's steps equal the CPU's
 * (which equal the reference's on the fixture's own model: block_diffusion.*_traces_match_reference), near-ties aside;
 * so do the outputs of the cases identical at every step. */
static void test_bd_gpu_traces(dllm_test_state &T_, const char *fx, dllm_model *const (&models)[2], const char *name) {
    dllm__json root;
    CHECK_STATUS(dllm__json_load(test_data(fx) + "/golden_traces.json", root), DLLM_OK, nullptr);
    const dllm__json *cases = root.find("cases");
    dllm_ctx *cpu[2] = {}, *gpu[2] = {};
    for (int i = 0; i < 2; i++)
        if (models[i]) {
            cpu[i] = test_ctx(models[i], DLLM_BACKEND_CPU), gpu[i] = test_ctx(models[i], DLLM_BACKEND_GPU);
            CHECK(cpu[i] && gpu[i] && dllm_ctx_get_backend(gpu[i]) == DLLM_BACKEND_GPU);
        }
    int identical = 0, n_cases = 0, unexplained = 0;
    for (size_t ci = 0; cases && ci < cases->items.size(); ci++) {
        const dllm__json &cs = cases->items[ci];
        const dllm__json *shift = cs.find("shift");
        const int which = shift && !shift->boolean ? 1 : 0;
        if (!cpu[which] || !gpu[which]) continue;
        const dllm_model *m = models[which];
        std::vector<int32_t> prompt = test_json_ids(cs.find("prompt"));
        dllm_gen_params gp = test_bd_case_params(cs);
        test_bd_trace ta, tb;
        CHECK_STATUS(test_bd_generate_recorded(cpu[which], prompt, gp, ta), DLLM_OK, nullptr);
        CHECK_STATUS(test_bd_generate_recorded(gpu[which], prompt, gp, tb), DLLM_OK, nullptr);
        n_cases++;
        size_t s = 0;
        while (s < ta.canvases.size() && s < tb.canvases.size() && ta.canvases[s] == tb.canvases[s]) s++;
        if (s == ta.canvases.size() && ta.canvases.size() == tb.canvases.size()) { identical++; continue; }
        const std::string what = dllm__format("%s/%s step %zu:", name, cs.find("name")->str.c_str(), s);
        if (s >= ta.canvases.size() || s >= tb.canvases.size()) {
            printf("    %s one backend stopped (%zu CPU steps, %zu GPU steps)\n", what.c_str(), ta.canvases.size(),
                   tb.canvases.size());
            unexplained++;
            continue;
        }
        unexplained +=
            !test_bd_near_tie(ta, tb, s, m, gp.unmask == DLLM_UNMASK_THRESHOLD ? gp.threshold : 1.0, what.c_str());
    }
    printf("    %s: %d of %d cases identical at every step on the GPU\n", name, identical, n_cases);
    CHECK(n_cases >= 8);
    CHECK_MSG(unexplained == 0, "%s: %d cases diverge beyond a near-tie", name, unexplained);
    for (int i = 0; i < 2; i++) {
        dllm_ctx_free(cpu[i]);
        dllm_ctx_free(gpu[i]);
    }
}

TEST(gpu, block_diffusion_decoding_matches_cpu) {
    NEED_GPU();
    dllm_model *fast[2] = {test_load(test_data("tiny-fast-dllm-v2")), nullptr};
    CHECK(fast[0] != nullptr);
    test_bd_gpu_traces(T_, "tiny-fast-dllm-v2", fast, "tiny-fast-dllm-v2");
    dllm_model_free(fast[0]);
    // The Nemotron fixture's cases (its vocabulary of 131 is not for the GPU) on the random tiny Nemotron, shifted and
    // not.
    test_tmpdir shifted, unshifted;
    dllm_model *nemotron[2] = {test_random_nemotron(shifted, 0x5eed, true),
                               test_random_nemotron(unshifted, 0x5eed, false)};
    CHECK(nemotron[0] && nemotron[1] && !nemotron[1]->cfg.shift_logits);
    if (nemotron[0] && nemotron[1]) test_bd_gpu_traces(T_, "tiny-nemotron-diffusion", nemotron, "random tiny Nemotron");
    dllm_model_free(nemotron[0]);
    dllm_model_free(nemotron[1]);
}

/* FP8 weights (layers >= 1) reach block diffusion through the GEMM entry point: the GPU's FP8 block-diffusion logits
 * against the CPU's FP8 reference, within the bound of the plain forward's FP8 test (fp8.*: 8e-2). */
TEST(gpu, block_diffusion_fp8_matches_cpu_fp8) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    dllm_ctx *cpu8 = test_ctx_precision(m, DLLM_BACKEND_CPU, DLLM_PRECISION_FP8_ALL);
    dllm_ctx *gpu8 = test_ctx_precision(m, DLLM_BACKEND_GPU, DLLM_PRECISION_FP8_ALL);
    CHECK(cpu8 && gpu8);
    if (cpu8 && gpu8) {
        dllm__gpu_backend *g = (dllm__gpu_backend *)gpu8->impl.get();
        CHECK(g->fp8_attn_active() == (g->arch().fp8 != DLLM__FP8_NONE));
        std::vector<int32_t> ids(70);
        for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 29 + 3) % 150);
        const int V = m->cfg.n_vocab, n = (int)ids.size();
        std::vector<float> a((size_t)n * V, NAN), b(a.size(), NAN);
        CHECK_STATUS(dllm_logits(cpu8, ids.data(), n, 0, n, a.data(), a.size()), DLLM_OK, nullptr);
        CHECK_STATUS(dllm_logits(gpu8, ids.data(), n, 0, n, b.data(), b.size()), DLLM_OK, nullptr);
        const double err = test_max_rel(b, a);
        printf("    FP8 (all) block-diffusion logits, GPU vs CPU: max relative error %.2e\n", err);
        CHECK_MSG(err < 8e-2, "FP8 block-diffusion forward error %.3e", err);
    }
    dllm_ctx_free(cpu8);
    dllm_ctx_free(gpu8);
    dllm_model_free(m);
}

// ---- [KV quant] commit-time K/V quantisation on the GPU (9c's twins in dllm__src_kvq) ---------------------------

/* A GPU backend with kv_quant, made directly (the model's whole positions). */
static std::unique_ptr<dllm__backend_impl> test_kvq_gpu(dllm_model *m, dllm_kv_quant q) {
    dllm_ctx_params p = dllm_ctx_default_params();
    p.backend = DLLM_BACKEND_GPU, p.precision = DLLM_PRECISION_BF16, p.kv_quant = q;
    std::unique_ptr<dllm__backend_impl> g;
    if (dllm__gpu_backend::create(*m, p, m->cfg.max_seq_len, g) != DLLM_OK)
        fprintf(stdout, "    cannot create the GPU backend: %s\n", dllm_last_error());
    return g;
}

/* The commit kernels against 9c's quantisers on the same (bf16) rows, byte for byte: codes, FP16 pairs and SoloQ's
 * FP32 scales of a 2-block prefill and a later block, every mode, sinks included. */
TEST(gpu, kv_quant_commit_matches_cpu_twin_bytes) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    const dllm__config &c = m->cfg;
    const int B = 32, V = c.n_vocab;
    std::vector<int32_t> ids((size_t)3 * B);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 41 + 9) % 150);
    for (int mode = DLLM_KV_QUANT_SOLOQ_KV4; mode <= DLLM_KV_QUANT_KIVI_KV2; mode++) {
        std::unique_ptr<dllm__backend_impl> g = test_kvq_gpu(m, (dllm_kv_quant)mode);
        if (!g) { CHECK(g != nullptr); continue; }
        ((dllm__gpu_backend *)g.get())
            ->kvq_keep_rows(true);  // the device keeps codes only: the rows they came from, for 9c
        CHECK_STATUS(g->bd_begin(4 * B), DLLM_OK, nullptr);
        std::vector<float> l((size_t)B * V);
        dllm__bd_call pre;
        pre.kind = DLLM__BD_COMMIT, pre.ids = ids.data(), pre.T = 2 * B, pre.mask_block = B, pre.r0 = 2 * B - 1,
        pre.r1 = 2 * B, pre.kv_group = B;
        dllm__bd_call blk = pre;
        blk.ids = ids.data() + 2 * B, blk.T = B, blk.r0 = B - 1, blk.r1 = B;
        CHECK_STATUS(g->bd_forward(pre, l.data()), DLLM_OK, nullptr);
        CHECK_STATUS(g->bd_forward(blk, l.data()), DLLM_OK, nullptr);
        dllm__kvq got, want;
        dllm__bd_kv kv;
        kv.reset(c, 4 * B);
        CHECK_STATUS(((dllm__gpu_backend *)g.get())->kvq_snapshot(got, kv.k, kv.v), DLLM_OK, nullptr);
        want.setup(c, mode, -1);
        want.reset(4 * B);
        dllm__pool pool(2);
        CHECK_STATUS(dllm__kvq_commit(pool, want, kv, 0, 2 * B, B), DLLM_OK, nullptr);
        CHECK_STATUS(dllm__kvq_commit(pool, want, kv, 2 * B, B, B), DLLM_OK, nullptr);
        const bool codes = got.k_codes == want.k_codes && got.v_codes == want.v_codes;
        const bool pairs = got.k_pairs == want.k_pairs && got.v_pairs == want.v_pairs;
        const bool scales = got.v_scale.size() == want.v_scale.size() &&
                            !memcmp(got.v_scale.data(), want.v_scale.data(), sizeof(float) * want.v_scale.size());
        printf("    %s: codes %s, pairs %s, scales %s\n", dllm__kvq_names[mode], codes ? "equal" : "DIFFER",
               pairs ? "equal" : "DIFFER", scales ? "equal" : "DIFFER");
        CHECK_MSG(codes && pairs && scales, "%s: the device's commit differs from 9c's", dllm__kvq_names[mode]);
    }
    dllm_model_free(m);
}

/* Every kind of forward over a quantised committed cache, GPU (kvq_attention reading the codes) against the CPU
 * backend (9c's decoded cache), forward by forward. The two quantise their own rows (bf16 on the GPU, fp32 on the
 * CPU), so a code may fall on either side of a rounding boundary: the bound is looser than the BF16 cache's 3e-2. */
TEST(gpu, kv_quant_forwards_match_cpu) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    const int B = 32, S = 8, V = m->cfg.n_vocab;
    std::vector<int32_t> ids((size_t)5 * B);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 37 + 11) % 150);
    for (int i = 2 * B + 3; i < 3 * B; i += 2) ids[(size_t)i] = m->cfg.mask_id;
    const std::vector<test_bd_fwd> script = {
        {DLLM__BD_COMMIT, 0, 2 * B, 0, B, 0, 2 * B},         {DLLM__BD_STEP, 2 * B, B, 0, B, 0, B},
        {DLLM__BD_BLOCK_FULL, 2 * B, B, 0, B, S - 1, 2 * S}, {DLLM__BD_SUB_BLOCK, 2 * B + S, S, S, 0, 0, S},
        {DLLM__BD_COMMIT, 2 * B, B, 0, B, B - 1, B},         {DLLM__BD_STEP, 3 * B, B, 0, B, 3, B}};
    for (int mode = DLLM_KV_QUANT_SOLOQ_KV4; mode <= DLLM_KV_QUANT_KIVI_KV2; mode++) {
        dllm_ctx_params p = dllm_ctx_default_params();
        p.backend = DLLM_BACKEND_CPU, p.n_threads = 2, p.kv_quant = (dllm_kv_quant)mode;
        dllm_ctx *cpu = nullptr;
        CHECK_STATUS(dllm_ctx_create(m, p, &cpu), DLLM_OK, nullptr);
        std::unique_ptr<dllm__backend_impl> g = test_kvq_gpu(m, (dllm_kv_quant)mode);
        if (!cpu || !g) { CHECK(cpu && g); dllm_ctx_free(cpu); continue; }
        std::vector<float> want, got;
        CHECK_STATUS(test_bd_run(*cpu->impl, *m, 4 * B, ids, script, want), DLLM_OK, nullptr);
        CHECK_STATUS(test_bd_run(*g, *m, 4 * B, ids, script, got), DLLM_OK, nullptr);
        size_t at = 0;
        for (size_t i = 0; i < script.size() && got.size() == want.size(); i++) {
            const size_t n = (size_t)(script[i].r1 - script[i].r0) * V;
            std::vector<float> a(want.begin() + (long)at, want.begin() + (long)(at + n)),
                b(got.begin() + (long)at, got.begin() + (long)(at + n));
            at += n;
            const double err = test_max_rel(b, a), bound = dllm__kvq_bits(mode) == 4 ? 5e-2 : 1e-1;
            printf("    %s, forward %zu (kind %d): GPU vs CPU logits max relative error %.2e\n", dllm__kvq_names[mode],
                   i, (int)script[i].kind, err);
            CHECK_MSG(err < bound, "%s, forward %zu: error %.3e", dllm__kvq_names[mode], i, err);
        }
        CHECK(got.size() == want.size());
        dllm_ctx_free(cpu);
    }
    dllm_model_free(m);
}

/* FNV-1a over the bytes of n values: a digest to compare runs of two builds by. */
template <class T> static uint64_t test_digest(const T *x, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < n * sizeof(T); i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* ids[6 B] for test_kvq_script: block 1 holds masks among tokens. */
static std::vector<int32_t> test_kvq_script_ids(const dllm_model &m, int B) {
    std::vector<int32_t> ids((size_t)6 * B);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 43 + 3) % 150);
    for (int i = B + 2; i < 2 * B; i += 3) ids[(size_t)i] = m.cfg.mask_id;
    return ids;
}

/* Every kind of forward, commits crossing 37 sinks: a one-block prefill, a step, the block cache, a sub-block, commits
 * of one and two blocks, a step over them (5 B rows). */
static std::vector<test_bd_fwd> test_kvq_script(int B, int S) {
    return {{DLLM__BD_COMMIT, 0, B, 0, B, B - 1, B},         {DLLM__BD_STEP, B, B, 0, B, 0, B},
            {DLLM__BD_BLOCK_FULL, B, B, 0, B, S - 1, 2 * S}, {DLLM__BD_SUB_BLOCK, B + S, S, S, 0, 0, S},
            {DLLM__BD_COMMIT, B, B, 0, B, B - 1, B},         {DLLM__BD_COMMIT, 2 * B, 2 * B, 0, B, 2 * B - 1, 2 * B},
            {DLLM__BD_STEP, 4 * B, B, 0, B, 0, B}};
}

/* The GPU's kv_quant forwards and generations are deterministic: every mode, the default sinks and 37 (sink rows in two
 * commits), kvq_flash and kvq_attention (kvq_tc off), a script of every kind of forward
 * (a one-block prefill, a step, the block cache, a sub-block, commits of one and two blocks, a step over them) and a
 * generation, each run twice with equal bits. The digests printed let two builds be compared bit for bit
 * (the committed cache's layout must not change them). */
TEST(gpu, kv_quant_logits_digest) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    const int B = 32, S = 8;
    const std::vector<int32_t> ids = test_kvq_script_ids(*m, B);
    const std::vector<test_bd_fwd> script = test_kvq_script(B, S);
    for (int mode = DLLM_KV_QUANT_SOLOQ_KV4; mode <= DLLM_KV_QUANT_KIVI_KV2; mode++)
        for (int sinks : {-1, 37})
            for (int tc = 0; tc < 2; tc++) {
                test_knob kvq_tc("kvq_tc", tc == 1);
                uint64_t digest[2] = {0, 1}, tokens[2] = {0, 1};
                for (int run = 0; run < 2; run++) {
                    dllm_ctx_params p = dllm_ctx_default_params();
                    p.backend = DLLM_BACKEND_GPU, p.precision = DLLM_PRECISION_BF16, p.kv_quant = (dllm_kv_quant)mode,
                    p.kv_sink_tokens = sinks;
                    dllm_ctx *ctx = nullptr;
                    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_OK, nullptr);
                    if (!ctx) continue;
                    std::vector<float> logits;
                    CHECK_STATUS(test_bd_run(*ctx->impl, *m, 5 * B, ids, script, logits), DLLM_OK, nullptr);
                    digest[run] = test_digest(logits.data(), logits.size());
                    dllm_gen_params gp = dllm_gen_default_params();
                    gp.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
                    gp.gen_length = 3 * B, gp.block_length = B, gp.sub_block_length = S, gp.stop_at_eos = 0,
                    gp.block_cache = run;
                    std::vector<int32_t> out((size_t)gp.gen_length + 1, -1);
                    int n_out = 0;
                    CHECK_STATUS(
                        dllm_generate(ctx, ids.data(), B + 2, gp, out.data(), (int)out.size(), &n_out, nullptr),
                        DLLM_OK, nullptr);
                    tokens[run] = test_digest(out.data(), (size_t)std::max(n_out, 0));
                    dllm_ctx_free(ctx);
                }
                printf(
                    "    %s, sinks %d, kvq_tc %d: forwards %016llx, generation %016llx (block cache off) %016llx "
                    "(on)\n",
                    dllm__kvq_names[mode], sinks, tc, (unsigned long long)digest[0], (unsigned long long)tokens[0],
                    (unsigned long long)tokens[1]);
                CHECK_MSG(digest[0] == digest[1], "%s, sinks %d, kvq_tc %d: two runs of the script differ",
                          dllm__kvq_names[mode], sinks, tc);
            }
    dllm_model_free(m);
}

/* test_kvq_script with 37 sinks (sink rows in two commits, the device's bf16 sinks filled by both) and the default 3,
 * every mode, GPU (kvq_flash) against the CPU backend forward by forward, with gpu.kv_quant_forwards_match_cpu's
 * bounds. */
TEST(gpu, kv_quant_sinks_across_commits_match_cpu) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    const int B = 32, S = 8, V = m->cfg.n_vocab;
    const std::vector<int32_t> ids = test_kvq_script_ids(*m, B);
    const std::vector<test_bd_fwd> script = test_kvq_script(B, S);
    for (int mode = DLLM_KV_QUANT_SOLOQ_KV4; mode <= DLLM_KV_QUANT_KIVI_KV2; mode++)
        for (int sinks : {37, -1}) {
            dllm_ctx *ctx[2] = {nullptr, nullptr};
            for (int gpu = 0; gpu < 2; gpu++) {
                dllm_ctx_params p = dllm_ctx_default_params();
                p.backend = gpu ? DLLM_BACKEND_GPU : DLLM_BACKEND_CPU, p.n_threads = 2,
                p.precision = DLLM_PRECISION_BF16;
                p.kv_quant = (dllm_kv_quant)mode, p.kv_sink_tokens = sinks;
                CHECK_STATUS(dllm_ctx_create(m, p, &ctx[gpu]), DLLM_OK, nullptr);
            }
            std::vector<float> want, got;
            if (ctx[0] && ctx[1]) {
                CHECK_STATUS(test_bd_run(*ctx[0]->impl, *m, 5 * B, ids, script, want), DLLM_OK, nullptr);
                CHECK_STATUS(test_bd_run(*ctx[1]->impl, *m, 5 * B, ids, script, got), DLLM_OK, nullptr);
            }
            size_t at = 0;
            double worst = 0;
            for (size_t i = 0; i < script.size() && got.size() == want.size() && !got.empty(); i++) {
                const size_t n = (size_t)(script[i].r1 - script[i].r0) * V;
                std::vector<float> a(want.begin() + (long)at, want.begin() + (long)(at + n)),
                    b(got.begin() + (long)at, got.begin() + (long)(at + n));
                at += n;
                const double err = test_max_rel(b, a), bound = dllm__kvq_bits(mode) == 4 ? 5e-2 : 1e-1;
                worst = std::max(worst, err);
                CHECK_MSG(err < bound, "%s, sinks %d, forward %zu (kind %d): GPU vs CPU %.3e", dllm__kvq_names[mode],
                          sinks, i, (int)script[i].kind, err);
            }
            printf("    %s, sinks %d: GPU vs CPU logits over %zu forwards, max relative error %.2e\n",
                   dllm__kvq_names[mode], sinks, script.size(), worst);
            CHECK(!got.empty() && got.size() == want.size());
            dllm_ctx_free(ctx[0]);
            dllm_ctx_free(ctx[1]);
        }
    dllm_model_free(m);
}

/* [KV quant] A random model with the Fast-dLLM v2 7B's K/V shape (28 layers, 4 kv heads of 128: 56 KiB a token in BF16)
 * and a small rest (8 query heads, FFN 2048), for the cache's device memory at its 32k positions. */
static dllm_model *test_kvq_7b_cache_model(const test_tmpdir &dir) {
    std::string cfg = test_read_file(test_data("real-configs/fast-dllm-v2-7b.config.json"));
    const char *edits[][2] = {
        {"\"bd_size\": 32,", "\"bd_size\": 32, \"mask_token_id\": 151665,"},  // no tokenizer files to name it
        {"\"hidden_size\": 3584", "\"hidden_size\": 1024"},
        {"\"intermediate_size\": 18944", "\"intermediate_size\": 2048"},
        {"\"num_attention_heads\": 28", "\"num_attention_heads\": 8"}};
    for (auto &e : edits) {
        const size_t at = cfg.find(e[0]);
        if (at == std::string::npos) return nullptr;
        cfg.replace(at, strlen(e[0]), e[1]);
    }
    dllm_model *m = nullptr;
    if (!test_write_file(dir.file("config.json"), cfg) ||
        dllm_model_load_random(dir.file("config.json").c_str(), 17, &m) != DLLM_OK)
        fprintf(stdout, "    cannot make the model: %s\n", dllm_last_error());
    return m;
}

/* What one context took on the device: cudaMemGetInfo's free memory before dllm_ctx_create and after its generation,
 * its committed cache and the quantised cache's buffers beside the codes (its own counts), the rows it has room for
 * after. */
struct test_kvq_footprint {
    int64_t used = 0, fit = 0;
    size_t committed = 0, beside = 0;
};

static test_kvq_footprint test_kvq_footprint_of(dllm_test_state &T_, dllm_model *m, dllm_kv_quant q,
                                                const std::vector<int32_t> &prompt, int B) {
    test_kvq_footprint f;
    size_t free0 = 0, free1 = 0, total = 0;
    CHECK(cudaDeviceSynchronize() == cudaSuccess && cudaMemGetInfo(&free0, &total) == cudaSuccess);
    dllm_ctx_params p = dllm_ctx_default_params();
    p.backend = DLLM_BACKEND_GPU, p.precision = DLLM_PRECISION_BF16, p.kv_quant = q;
    dllm_ctx *ctx = nullptr;
    CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_OK, nullptr);
    if (!ctx) return f;
    dllm_gen_params gp = dllm_gen_default_params();
    gp.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
    gp.gen_length = B, gp.block_length = B, gp.stop_at_eos = 0;
    std::vector<int32_t> out((size_t)B + 1);
    int n_out = 0;
    CHECK_STATUS(
        dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, out.data(), (int)out.size(), &n_out, nullptr),
        DLLM_OK, nullptr);
    CHECK(n_out > 0);
    CHECK(cudaDeviceSynchronize() == cudaSuccess && cudaMemGetInfo(&free1, &total) == cudaSuccess);
    const dllm__gpu_backend *g = (const dllm__gpu_backend *)ctx->impl.get();
    f.used = (int64_t)free0 - (int64_t)free1, f.committed = g->bd_committed_bytes(), f.beside = g->kvq_beside_bytes();
    CHECK_STATUS(g->bd_rows_that_fit(B, f.fit), DLLM_OK, nullptr);
    dllm_ctx_free(ctx);
    return f;
}

/* Issue 44: under kv_quant the device holds the committed cache as codes only. A context's committed cache after a
 * generation of prompt 32704 + gen 32 (32768 rows, the model's positions) at the 7B's K/V shape is exactly rows x
 * dllm_kv_bytes_per_token plus the sinks' bf16 rows: KV4 at most 0.31x and KV2 at most 0.18x the BF16 cache's (issue
 * 44's targets). cudaMemGetInfo around each context's creation and generation (after a warm-up that puts the weights
 * and the kernels on the device) shows the same saving: the BF16 context's use minus the quantised one's equals the
 * committed caches' difference less the buffers beside the codes (the forwarded rows of one layer, kvq_flash's split
 * states), within 64 MiB and 3% (allocation granularity, graphs). */
TEST(gpu, kv_quant_memory_follows_bytes_per_token) {
    NEED_GPU();
    test_tmpdir dir;
    dllm_model *m = test_kvq_7b_cache_model(dir);
    if (!m) { CHECK(m != nullptr); return; }
    const int B = 32, n_prompt = m->cfg.max_seq_len - 2 * B;
    const int64_t rows = n_prompt + 2 * B;  // the prompt's whole blocks, the generated block and a block of slack
    std::vector<int32_t> prompt((size_t)n_prompt);
    for (size_t i = 0; i < prompt.size(); i++) prompt[i] = (int32_t)((i * 7919 + 11) % 150000);
    const dllm_kv_quant modes[3] = {DLLM_KV_QUANT_NONE, DLLM_KV_QUANT_SOLOQ_KV4, DLLM_KV_QUANT_SOLOQ_KV2};
    const std::vector<int32_t> warm(prompt.begin(), prompt.begin() + 40);
    for (dllm_kv_quant q : modes) test_kvq_footprint_of(T_, m, q, warm, B);
    test_kvq_footprint f[3];
    double per_token[3];
    for (int i = 0; i < 3; i++) {
        f[i] = test_kvq_footprint_of(T_, m, modes[i], prompt, B);
        CHECK_STATUS(dllm_kv_bytes_per_token(m, modes[i], B, &per_token[i]), DLLM_OK, nullptr);
    }
    const double sinks =
        (double)m->cfg.n_layer * dllm__kvq_default_sinks(m->cfg) * 4 * m->cfg.n_head_kv * m->cfg.head_dim;
    printf("    %lld rows of 28 layers x 4 kv heads x 128: committed cache BF16 %.1f MiB; context used %.1f MiB\n",
           (long long)rows, f[0].committed / 1048576.0, f[0].used / 1048576.0);
    CHECK_MSG((double)f[0].committed == rows * per_token[0], "BF16: %zu committed bytes, %lld rows x %.0f",
              f[0].committed, (long long)rows, per_token[0]);
    for (int i = 1; i < 3; i++) {
        const double ratio = (double)f[i].committed / (double)f[0].committed;
        const double expected = (double)f[0].committed - (double)f[i].committed - (double)f[i].beside,
                     measured = (double)(f[0].used - f[i].used);
        printf(
            "    %s: committed %.1f MiB (%.3fx BF16; %.1f bytes a token), beside it %.1f MiB; context used %.1f MiB; "
            "saved %.1f MiB "
            "measured, %.1f expected; room for %lld rows after\n",
            dllm__kvq_names[modes[i]], f[i].committed / 1048576.0, ratio, per_token[i], f[i].beside / 1048576.0,
            f[i].used / 1048576.0, measured / 1048576.0, expected / 1048576.0, (long long)f[i].fit);
        CHECK_MSG((double)f[i].committed == rows * per_token[i] + sinks,
                  "%s: %zu committed bytes, %lld rows x %.1f + %.0f of sinks", dllm__kvq_names[modes[i]],
                  f[i].committed, (long long)rows, per_token[i], sinks);
        CHECK_MSG(ratio <= (i == 1 ? 0.31 : 0.18), "%s: the committed cache is %.3fx the BF16 cache's",
                  dllm__kvq_names[modes[i]], ratio);
        CHECK_MSG(fabs(measured - expected) <= 64.0 * 1048576 + 0.03 * expected,
                  "%s: cudaMemGetInfo saw %.1f MiB saved, the buffers say %.1f", dllm__kvq_names[modes[i]],
                  measured / 1048576.0, expected / 1048576.0);
        CHECK_MSG(f[i].fit >= rows && f[i].fit > f[0].fit, "%s: room for %lld rows after (BF16: %lld)",
                  dllm__kvq_names[modes[i]], (long long)f[i].fit, (long long)f[0].fit);
    }
    dllm_model_free(m);
}

/* bd_forward_choose (a step's token choice on the device) against its twin, the host's dllm__choose over bd_forward's
 * logits of the same forward on the same backend: every row's token equal and its confidence within float64 rounding
 * (the device's exp and the host's may differ in an ulp), for the row mappings a step uses
 * (shifted from row 0, shifted past it, unshifted, an offset into the rows); then whole generations with it give the
 * host path's tokens and step counts. */
static void test_bd_choose_case(dllm_test_state &T_, dllm_ctx *gpu, const char *name) {
    const dllm__config &c = gpu->model->cfg;
    const int V = c.n_vocab, B = c.bd_size, S = std::max(1, B / 4), shift = c.shift_logits ? 1 : 0;
    std::vector<int32_t> ids((size_t)2 * B);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 53 + 7) % (size_t)V);
    for (int i = B + 1; i < 2 * B; i += 3) ids[(size_t)i] = c.mask_id;
    if (ids[(size_t)B] == c.mask_id || ids[0] == c.mask_id) ids[0] = ids[(size_t)B] = (c.mask_id + 1) % V;
    dllm__backend_impl &b = *gpu->impl;
    CHECK_STATUS(b.bd_begin(2 * B), DLLM_OK, nullptr);
    dllm__bd_call commit;
    commit.kind = DLLM__BD_COMMIT, commit.ids = ids.data(), commit.T = B,
    commit.mask_block = c.bd_causal_context ? 1 : B, commit.r0 = B - 1, commit.r1 = B;
    std::vector<float> seed((size_t)V);
    CHECK_STATUS(b.bd_forward(commit, seed.data()), DLLM_OK, nullptr);
    const int cases[][3] = {
        {0, 0, std::max(S - shift, 1)}, {S, S - shift, 2 * S - shift}, {S, 0, B}, {B - S, 0, B}};  // s0, r0, r1
    for (const auto &k : cases) {
        const int s0 = k[0];
        dllm__bd_call call;
        call.kind = DLLM__BD_STEP, call.ids = ids.data() + B, call.T = B, call.mask_block = c.bd_mask_block,
        call.r0 = k[1], call.r1 = k[2];
        dllm__bd_pick pick;
        pick.sampling.eos_logit_inf = true, pick.sampling.eos_id = c.mask_id;
        pick.pos0 = B + s0, pick.n = S, pick.shift0 = shift && s0 == 0,
        pick.lrow0 = (shift && s0 > 0 ? s0 - 1 : s0) - call.r0;
        std::vector<float> logits((size_t)(call.r1 - call.r0) * V, NAN);
        CHECK_STATUS(b.bd_forward(call, logits.data()), DLLM_OK, nullptr);
        std::vector<dllm__choice> dev((size_t)S, dllm__choice{-1, NAN, true});
        CHECK_STATUS(b.bd_forward_choose(call, pick, dev.data()), DLLM_OK, nullptr);
        int same = 0;
        double worst = 0;
        for (int i = 0; i < S; i++) {
            const dllm__choice h = dllm__choose(logits.data() + (size_t)pick.logits_row(i) * V, V, pick.sampling,
                                                (uint32_t)(pick.pos0 + i), 0);
            const double rel = fabs(dev[(size_t)i].conf - h.conf) / std::max(1e-300, fabs(h.conf));
            worst = std::max(worst, rel);
            same += dev[(size_t)i].token == h.token && dev[(size_t)i].deferred == h.deferred && rel < 1e-12;
        }
        printf(
            "    %s: rows [%d, %d) from logits rows %d.. of [%d, %d): %d of %d choices equal, confidence max relative "
            "difference %.1e\n",
            name, pick.pos0, pick.pos0 + S, pick.logits_row(0), call.r0, call.r1, same, S, worst);
        CHECK_MSG(same == S, "%s: sub-block at %d: %d of %d device choices equal the host's", name, s0, same, S);
    }
    // Whole generations, block cache off and on: the device's choice against the host's.
    for (int block_cache = 0; block_cache < 2; block_cache++) {
        dllm_gen_params gp = dllm_gen_default_params();
        gp.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
        gp.gen_length = 2 * B, gp.block_length = B, gp.sub_block_length = S, gp.block_cache = block_cache,
        gp.stop_at_eos = 0;
        gp.unmask = DLLM_UNMASK_THRESHOLD, gp.threshold = 0.9;
        std::vector<int32_t> prompt(ids.begin(), ids.begin() + B + 5);
        for (int32_t &t : prompt)
            if (t == c.mask_id) t = (t + 1) % V;
        std::vector<int32_t> out[2];
        dllm_gen_stats stats[2] = {};
        for (int dev = 0; dev < 2; dev++) {
            ((dllm__gpu_backend &)b).bd_choose_on_host(dev == 0);
            CHECK(b.bd_chooses() == (dev == 1));
            out[dev].assign((size_t)gp.gen_length + 1, -1);
            int n_out = 0;
            CHECK_STATUS(dllm_generate(gpu, prompt.data(), (int)prompt.size(), gp, out[dev].data(),
                                       (int)out[dev].size(), &n_out, &stats[dev]),
                         DLLM_OK, nullptr);
            out[dev].resize((size_t)std::max(n_out, 0));
        }
        printf("    %s, block cache %d: %zu tokens, %d and %d steps (host, device choice)\n", name, block_cache,
               out[0].size(), stats[0].steps, stats[1].steps);
        CHECK_MSG(out[0] == out[1] && stats[0].steps == stats[1].steps,
                  "%s, block cache %d: the device's choice changed the generation", name, block_cache);
    }
}

TEST(gpu, bd_choose_on_device_matches_the_host) {
    NEED_GPU();
    test_tmpdir dir;
    dllm_model *models[2] = {test_load(test_data("tiny-fast-dllm-v2")), test_random_nemotron(dir, 0x5eed, false)};
    const char *names[2] = {"tiny-fast-dllm-v2", "random tiny Nemotron (unshifted)"};
    for (int i = 0; i < 2; i++) {
        dllm_ctx *gpu = models[i] ? test_ctx(models[i], DLLM_BACKEND_GPU) : nullptr;
        CHECK_MSG(gpu && dllm_ctx_get_backend(gpu) == DLLM_BACKEND_GPU, "%s: no GPU context", names[i]);
        if (gpu && dllm_ctx_get_backend(gpu) == DLLM_BACKEND_GPU) test_bd_choose_case(T_, gpu, names[i]);
        dllm_ctx_free(gpu);
        dllm_model_free(models[i]);
    }
}

// ---- [bd graphs] the step forwards replayed as CUDA graphs
// ------------------------------------------------------------

/* The graph keys and the slot's actions over a scripted generation (host logic only): the repeated steps of a sub-block
 * replay one graph whatever their ids; the next block's steps (a longer committed cache, the sampled rows further on)
 * update it; other kinds, sub-blocks, the first committed cache, the split-KV count and the sampling get slots of their
 * own; moved buffers update. */
TEST(block_diffusion, graph_keys_and_actions) {
    const int B = 32, S = 8;
    std::vector<int32_t> ids_a((size_t)B, 5), ids_b((size_t)B, 9);
    auto step = [&](dllm__bd_kind kind, int s0, int n_committed, const std::vector<int32_t> &ids, int splits = 1,
                    uint64_t seed = 0, const char *buffers = "a1 p0") {
        dllm__bd_call call;
        call.kind = kind, call.ids = ids.data(), call.mask_block = B;
        if (kind == DLLM__BD_SUB_BLOCK)
            call.T = S, call.offset = s0, call.r0 = 0, call.r1 = S, call.mask_block = 0;
        else
            call.T = B, call.r0 = std::max(0, s0 - 1), call.r1 = s0 + S - 1 > call.r0 ? s0 + S - 1 : call.r0 + 1;
        dllm__bd_pick pick;
        pick.sampling.eos_logit_inf = true, pick.sampling.eos_id = 7, pick.sampling.seed = seed;
        pick.pos0 = n_committed + s0, pick.n = S, pick.shift0 = s0 == 0, pick.lrow0 = (s0 > 0 ? s0 - 1 : 0) - call.r0;
        return dllm__bd_graph_keys(call, &pick, n_committed, B, splits, buffers);
    };
    // the same forward on other ids: one graph
    const dllm__graph_id a = step(DLLM__BD_STEP, 8, 64, ids_a), b = step(DLLM__BD_STEP, 8, 64, ids_b);
    CHECK(a.slot == b.slot && a.baked == b.baked);
    // the next block: the same slot, other arguments
    const dllm__graph_id next = step(DLLM__BD_STEP, 8, 96, ids_a);
    CHECK(next.slot == a.slot && next.baked != a.baked);
    // a slot of its own: another kind, sub-block, the first committed rows, split count, sampling seed
    const dllm__graph_id others[] = {step(DLLM__BD_BLOCK_FULL, 8, 64, ids_a), step(DLLM__BD_STEP, 16, 64, ids_a),
                                     step(DLLM__BD_STEP, 8, 0, ids_a),        step(DLLM__BD_STEP, 8, 64, ids_a, 2),
                                     step(DLLM__BD_STEP, 8, 64, ids_a, 1, 3), step(DLLM__BD_SUB_BLOCK, 8, 64, ids_a),
                                     step(DLLM__BD_SUB_BLOCK, 16, 64, ids_a)};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        CHECK_MSG(others[i].slot != a.slot, "case %zu shares the step's slot", i);
        for (size_t j = 0; j < i; j++)
            CHECK_MSG(others[i].slot != others[j].slot, "cases %zu and %zu share a slot", j, i);
    }
    // moved buffers: the same slot, other arguments; no pick: a slot of its own
    const dllm__graph_id moved = step(DLLM__BD_STEP, 8, 64, ids_a, 1, 0, "a2 p0");
    CHECK(moved.slot == a.slot && moved.baked != a.baked);
    dllm__bd_call plain;
    plain.kind = DLLM__BD_STEP, plain.T = B, plain.mask_block = B, plain.r0 = 7, plain.r1 = 15;
    CHECK(dllm__bd_graph_keys(plain, nullptr, 64, B, 1, "a1 p0").slot != a.slot);

    // A slot's life over two blocks of two sub-blocks: eager, capture, replays; then updates per sub-block.
    std::map<std::string, dllm__graph_slot> slots;
    int fake_exec = 0;
    std::string got;
    struct { int s0, n_committed, repeats; } script[] = {{0, 64, 3}, {8, 64, 2}, {0, 96, 2}, {8, 96, 3}, {8, 96, 1}};
    for (const auto &k : script) {
        for (int r = 0; r < k.repeats; r++) {
            const dllm__graph_id id = step(DLLM__BD_STEP, k.s0, k.n_committed, r % 2 ? ids_a : ids_b);
            dllm__graph_slot &g = slots[id.slot];
            const dllm__graph_action act = dllm__graph_next(g, id);
            if (act == DLLM__GRAPH_INSTANTIATE) g.exec = (cudaGraphExec_t)&fake_exec;  // what bd_capture would leave
            got += "ERUI"[act];
        }
        got += ' ';
    }
    printf("    actions: %s\n", got.c_str());
    CHECK_MSG(got == "EIR EI UR URR R ", "actions %s", got.c_str());
    dllm__graph_slot &failed = slots.begin()->second;  // a slot whose capture failed stays eager
    failed.eager_only = true;
    CHECK(dllm__graph_next(failed, step(DLLM__BD_STEP, 0, 96, ids_a)) == DLLM__GRAPH_EAGER);
    for (auto &kv : slots) kv.second.exec = nullptr;  // nothing to destroy
}

/* A generation's forwards with graphs against no_graphs on on the same context (both with bd_graphs on):
 * every step's logits bit for bit (the host's choice, through the recorder) and the same tokens and step counts with
 * the device's choice (bd_forward_choose replayed too); graphs replayed and updated across blocks where they are on,
 * none where they are off. */
static void test_bd_graphs_case(dllm_test_state &T_, dllm_ctx *gpu, const char *name, int L, int S, bool block_cache,
                                bool lacache, int64_t &replayed, int64_t &updated) {
    const dllm__config &c = gpu->model->cfg;
    const int V = c.n_vocab, B = c.bd_size;
    std::vector<int32_t> prompt((size_t)L);
    for (int i = 0; i < L; i++) prompt[(size_t)i] = (int32_t)((i * 31 + 3 * L) % (V - 8));
    for (int32_t &t : prompt)
        if (t == c.mask_id) t = (t + 1) % (V - 8);
    dllm_gen_params gp = dllm_gen_default_params();
    gp.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
    gp.gen_length = 3 * B, gp.block_length = B, gp.sub_block_length = S, gp.block_cache = block_cache,
    gp.stop_at_eos = 0, gp.stop_id = V - 1;
    gp.unmask = DLLM_UNMASK_THRESHOLD,
    gp.threshold = 0.95;  // mostly a token a step: a sub-block's steps replay its graph
    gp.lacache = lacache ? DLLM_LACACHE_ON : DLLM_LACACHE_OFF;
    dllm__gpu_backend *g = (dllm__gpu_backend *)gpu->impl.get();
    test_bd_trace trace[2];
    std::vector<int32_t> out[2];
    dllm_gen_stats stats[2] = {};
    int64_t replays[2], updates[2], refusals[2];
    for (int eager = 0; eager < 2; eager++) {
        test_knob_reset();
        if (eager) test_knob_set("no_graphs", "1");
        const int64_t r0 = g->bd_graph_count(DLLM__GRAPH_REPLAY), u0 = g->bd_graph_count(DLLM__GRAPH_UPDATE),
                      x0 = g->bd_graph_refusals();
        CHECK_STATUS(test_bd_generate_recorded(gpu, prompt, gp, trace[eager]), DLLM_OK, nullptr);
        out[eager].assign((size_t)gp.gen_length + B + 1, -1);
        int n_out = 0;
        CHECK(gpu->impl->bd_chooses());
        CHECK_STATUS(
            dllm_generate(gpu, prompt.data(), L, gp, out[eager].data(), (int)out[eager].size(), &n_out, &stats[eager]),
            DLLM_OK, nullptr);
        out[eager].resize((size_t)std::max(n_out, 0));
        replays[eager] = g->bd_graph_count(DLLM__GRAPH_REPLAY) - r0,
        updates[eager] = g->bd_graph_count(DLLM__GRAPH_UPDATE) - u0;
        refusals[eager] = g->bd_graph_refusals() - x0;
    }
    test_knob_reset();
    const test_bd_trace &ga = trace[0], &ea = trace[1];
    bool logits_same = ga.records.size() == ea.records.size() && !ga.records.empty();
    for (size_t i = 0; logits_same && i < ga.records.size(); i++)
        logits_same = ga.records[i].r0 == ea.records[i].r0 && ga.records[i].r1 == ea.records[i].r1 &&
                      ga.records[i].logits.size() == ea.records[i].logits.size() &&
                      memcmp(ga.records[i].logits.data(), ea.records[i].logits.data(),
                             sizeof(float) * ga.records[i].logits.size()) == 0;
    const bool steps_same = ga.canvases == ea.canvases && ga.committed == ea.committed;
    printf(
        "    %s L=%d S=%d block cache %d lacache %d: %zu forwards, logits %s, steps %s; device choice: %zu tokens %s, "
        "%d and %d steps; "
        "graphs replayed %lld, updated %lld, updates refused %lld (eager: %lld, %lld)\n",
        name, L, S, block_cache, lacache, ga.records.size(), logits_same ? "bit-identical" : "DIFFER",
        steps_same ? "equal" : "DIFFER", out[0].size(), out[0] == out[1] ? "equal" : "DIFFER", stats[0].steps,
        stats[1].steps, (long long)replays[0], (long long)updates[0], (long long)refusals[0], (long long)replays[1],
        (long long)updates[1]);
    CHECK_MSG(logits_same && steps_same, "%s L=%d S=%d block cache %d: graphs changed the host-choice generation", name,
              L, S, block_cache);
    CHECK_MSG(out[0] == out[1] && stats[0].steps == stats[1].steps && !out[0].empty(),
              "%s L=%d S=%d block cache %d: graphs changed the device-choice generation", name, L, S, block_cache);
    CHECK(replays[1] == 0 && updates[1] == 0);
    // a new block moves the rows a step writes: CUDA must take that as an update (the 2D memcpy it refused is gone)
    CHECK_MSG(refusals[0] == 0, "%s L=%d S=%d: CUDA refused %lld graph updates", name, L, S, (long long)refusals[0]);
    replayed += replays[0], updated += updates[0];  // checked over the cases (a stop token may end one after a block)
}

TEST(gpu, block_diffusion_graphs_equal_eager) {
    NEED_GPU();
    test_knob graphs("bd_graphs", true);
    test_tmpdir dir;
    dllm_model *models[2] = {test_load(test_data("tiny-fast-dllm-v2")), test_random_nemotron(dir, 0x5eed, true)};
    const char *names[2] = {"tiny-fast-dllm-v2", "random tiny Nemotron"};
    for (int i = 0; i < 2; i++) {
        dllm_ctx *gpu = models[i] ? test_ctx(models[i], DLLM_BACKEND_GPU) : nullptr;
        CHECK_MSG(gpu && dllm_ctx_get_backend(gpu) == DLLM_BACKEND_GPU, "%s: no GPU context", names[i]);
        if (gpu && dllm_ctx_get_backend(gpu) == DLLM_BACKEND_GPU) {
            const int B = models[i]->cfg.bd_size;
            int64_t replayed = 0, updated = 0;
            // prompts shorter than a block (the first block over no committed rows) and longer
            // (prefilled: FACache's split attention at layer 0 from the first step); sub-blocks of B/4 and B/2; with
            // and without the block cache
            test_bd_graphs_case(T_, gpu, names[i], B / 2 + 1, std::max(1, B / 4), false, false, replayed, updated);
            test_bd_graphs_case(T_, gpu, names[i], B + 5, std::max(1, B / 4), false, true, replayed, updated);
            test_bd_graphs_case(T_, gpu, names[i], B + 5, std::max(1, B / 4), true, true, replayed, updated);
            test_bd_graphs_case(T_, gpu, names[i], 2 * B + 3, std::max(1, B / 2), true, false, replayed, updated);
            CHECK_MSG(replayed > 0 && updated > 0, "%s: graphs replayed %lld times, updated %lld", names[i],
                      (long long)replayed, (long long)updated);
        }
        dllm_ctx_free(gpu);
        dllm_model_free(models[i]);
    }
}
