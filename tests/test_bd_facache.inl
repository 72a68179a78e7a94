/* Tests: LaCache on block diffusion ([FACache] in section 9): the split softmax (committed part, then the forward's
 * own keys, merged) against the plain attention on random inputs, reuse that really reads the held state, and whole
 * generations on the tiny block-diffusion fixtures where DLLM_LACACHE_ON gives every forward's logits bit for bit as
 * DLLM_LACACHE_OFF, with the reuse counts in dllm_gen_stats equal to an independent count of unchanged rows. */

static std::vector<float> test_bdfa_random(std::mt19937 &rng, size_t n, float scale) {
    std::normal_distribution<float> g(0.0f, scale);
    std::vector<float> x(n);
    for (float &e : x) e = g(rng);
    return x;
}

/* dllm__cpu_bd_attend against dllm__cpu_attention: bit for bit with no committed key, within float rounding with
 * some (the merge rescales in double); awkward sizes, GQA, the block-causal mask and none, outputs poisoned first. */
TEST(bd_facache, split_attention_matches_plain_attention) {
    std::mt19937 rng(2511);
    dllm__pool pool(2);
    struct shape { int Tq, n_committed, Tk, n_head, n_kv, hd, mask_block;
    } shapes[] = {
        {13, 0, 13, 6, 2, 16, 0}, {32, 0, 32, 4, 4, 24, 8},  {32, 37, 69, 6, 2, 16, 32},
        {7, 64, 71, 3, 1, 40, 0}, {24, 96, 120, 4, 2, 8, 8},
    };
    for (const shape &sh : shapes) {
        const size_t qn = (size_t)sh.Tq * sh.n_head * sh.hd, kn = (size_t)sh.Tk * sh.n_kv * sh.hd;
        std::vector<float> q = test_bdfa_random(rng, qn, 1.5f), k = test_bdfa_random(rng, kn, 1.5f),
                           v = test_bdfa_random(rng, kn, 1.0f);
        std::vector<float> want(qn, NAN), got(qn, NAN);
        const int q0 = sh.n_committed;
        dllm__cpu_attention(pool, q.data(), k.data(), v.data(), sh.Tq, sh.Tk, sh.n_head, sh.n_kv, sh.hd, nullptr,
                            want.data(), q0, sh.mask_block);
        dllm__cpu_bd_attend(pool, q.data(), k.data(), v.data(), sh.Tq, sh.n_committed, sh.Tk, sh.n_head, sh.n_kv, sh.hd,
                            got.data(), q0, sh.mask_block, dllm__bd_states());
        if (sh.n_committed == 0) {
            CHECK_MSG(memcmp(got.data(), want.data(), qn * sizeof(float)) == 0,
                      "Tq %d hd %d: no committed key, yet not the plain bits", sh.Tq, sh.hd);
        } else {
            double err = test_rel_err(got.data(), want.data(), qn);
            CHECK_MSG(err <= 1e-6, "Tq %d over %d committed + %d: relative difference %.2e", sh.Tq, sh.n_committed,
                      sh.Tk - sh.n_committed, err);
        }
    }
}

/* Held states are read, not recomputed: compute them once, then poison the committed keys and values and run again
 * with every row marked reused: the same bits (a recomputation would see the poison); rows not marked change. */
TEST(bd_facache, reused_rows_read_the_held_state) {
    std::mt19937 rng(77);
    dllm__pool pool(2);
    const int Tq = 11, nc = 45, Tk = nc + Tq, H = 4, KV = 2, hd = 24;
    const size_t qn = (size_t)Tq * H * hd, kn = (size_t)Tk * KV * hd;
    std::vector<float> q = test_bdfa_random(rng, qn, 1.0f), k = test_bdfa_random(rng, kn, 1.0f),
                       v = test_bdfa_random(rng, kn, 1.0f);
    std::vector<double> m((size_t)Tq * H, NAN), l(m.size(), NAN), acc(qn, NAN);
    std::vector<uint8_t> reuse((size_t)Tq, 0);
    dllm__bd_states st;
    st.m = m.data(), st.l = l.data(), st.acc = acc.data(), st.reuse = reuse.data();
    std::vector<float> first(qn, NAN), second(qn, NAN);
    dllm__cpu_bd_attend(pool, q.data(), k.data(), v.data(), Tq, nc, Tk, H, KV, hd, first.data(), nc, 0, st);
    for (size_t i = 0; i < (size_t)nc * KV * hd; i++) k[i] = -k[i] * 3.0f, v[i] = v[i] + 5.0f;
    for (int i = 0; i < Tq; i++) reuse[(size_t)i] = i % 3 != 1;
    dllm__cpu_bd_attend(pool, q.data(), k.data(), v.data(), Tq, nc, Tk, H, KV, hd, second.data(), nc, 0, st);
    int same = 0, changed = 0;
    for (int i = 0; i < Tq; i++) {
        bool eq =
            memcmp(first.data() + (size_t)i * H * hd, second.data() + (size_t)i * H * hd, sizeof(float) * H * hd) == 0;
        same += reuse[(size_t)i] && eq, changed += !reuse[(size_t)i] && !eq;
    }
    CHECK_MSG(same == 7 && changed == 4,
              "%d of 7 reused rows kept their bits, %d of 4 recomputed rows saw the new keys", same, changed);
}

/* Wraps a context's backend and keeps every block-diffusion forward's logits, and counts the rows a cached forward
 * could reuse by the rule itself (a block row whose token at that offset is unchanged since the last commit). */
struct test_bdfa_recorder : dllm__backend_impl {
    dllm__backend_impl *inner = nullptr;
    std::vector<float> kept;  // every forward's logits, in order
    int64_t rows = 0, reused = 0;
    int n_committed = 0;
    std::vector<int32_t> held;

    dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) override {
        return inner->logits(ids, n, r0, r1, out);
    }
    dllm_status begin_block(dllm__decode &st) override { return inner->begin_block(st); }
    dllm_status step(dllm__decode &st, std::vector<int32_t> &c, bool h) override { return inner->step(st, c, h); }
    dllm_status bd_begin(int n) override {
        n_committed = 0, held.clear();
        return inner->bd_begin(n);
    }
    void bd_facache_rows(int64_t &r, int64_t &u) const override { inner->bd_facache_rows(r, u); }
    dllm_status bd_forward(const dllm__bd_call &call, float *out) override {
        if (n_committed > 0) {
            if ((int)held.size() < call.offset + call.T) held.resize((size_t)(call.offset + call.T), -1);
            for (int t = 0; t < call.T; t++) {
                reused += held[(size_t)(call.offset + t)] == call.ids[t];
                held[(size_t)(call.offset + t)] = call.ids[t];
            }
            rows += call.T;
        }
        if (call.kind == DLLM__BD_COMMIT) n_committed += call.T, held.clear();
        dllm_status s = inner->bd_forward(call, out);
        kept.insert(kept.end(), out, out + (size_t)(call.r1 - call.r0) * ctx_vocab);
        return s;
    }
    int ctx_vocab = 0;
};

struct test_bdfa_run {
    std::vector<int32_t> out;
    std::vector<float> logits;
    dllm_gen_stats stats = {};
    int64_t rows = 0, reused = 0;
    dllm_status status = DLLM_ERR_INTERNAL;
};

static test_bdfa_run test_bdfa_generate(dllm_ctx *ctx, const std::vector<int32_t> &prompt, dllm_gen_params gp) {
    test_bdfa_run r;
    test_bdfa_recorder *rec = new test_bdfa_recorder;
    rec->inner = ctx->impl.release();
    rec->ctx_vocab = ctx->model->cfg.n_vocab;
    ctx->impl.reset(rec);
    r.out.assign((size_t)gp.gen_length + gp.block_length + 1, -7);
    int n = 0;
    memset(&r.stats, 0x5a, sizeof r.stats);  // poisoned: every field must be written
    r.status = dllm_generate(ctx, prompt.data(), (int)prompt.size(), gp, r.out.data(), (int)r.out.size(), &n, &r.stats);
    r.out.resize((size_t)std::max(n, 0));
    r.logits.swap(rec->kept);
    r.rows = rec->rows, r.reused = rec->reused;
    ctx->impl.release();
    ctx->impl.reset(rec->inner);
    delete rec;
    return r;
}

/* Whole generations: LACACHE_ON against OFF (and TRUNCATE) on both tiny fixtures, prompts shorter than, equal to and
 * longer than a block (one and two whole blocks prefilled), sub-blocks B/4, B/2 and B, the threshold rule and one
 * token a step, with and without the block cache, with and without kv_quant: every forward's logits bit for bit,
 * the same ids, and stats.facache_rows / _reused equal to the recorder's own count (and > 0 reused). */
static void test_bdfa_fixture(dllm_test_state &T_, const char *fixture, dllm_kv_quant kvq, dllm_precision precision) {
    dllm_model *m = test_load(test_data(fixture));
    if (!m) { CHECK(m != nullptr); return; }
    const int B = m->cfg.bd_size, V = m->cfg.n_vocab;
    dllm_ctx *ctx = test_kvq_ctx(m, kvq, -1, precision);
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    int cases = 0, exact = 0;
    int64_t all_rows = 0, all_reused = 0;
    for (int L : {B - 3, B, B + 5, 2 * B + 3}) {
        std::vector<int32_t> prompt((size_t)L);
        for (int i = 0; i < L; i++) prompt[(size_t)i] = (int32_t)((i * 29 + L) % std::min(V - 10, 90));
        for (int S : {B / 4, B / 2, B})
            for (int variant = 0; variant < 3; variant++) {
                dllm_gen_params gp = dllm_gen_default_params();
                gp.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
                gp.gen_length = 3 * B, gp.block_length = B, gp.sub_block_length = S, gp.stop_at_eos = 0,
                gp.stop_id = V - 1;
                if (variant >= 1) gp.unmask = DLLM_UNMASK_THRESHOLD, gp.threshold = 0.3;
                gp.block_cache = variant == 2;
                gp.lacache = DLLM_LACACHE_OFF;
                test_bdfa_run off = test_bdfa_generate(ctx, prompt, gp);
                gp.lacache = (L + S) % 2 ? DLLM_LACACHE_TRUNCATE : DLLM_LACACHE_OFF;
                test_bdfa_run off2 = test_bdfa_generate(ctx, prompt, gp);
                gp.lacache = DLLM_LACACHE_ON;
                test_bdfa_run on = test_bdfa_generate(ctx, prompt, gp);
                cases++;
                const bool ok =
                    on.status == DLLM_OK && off.status == DLLM_OK && off2.status == DLLM_OK && !on.logits.empty();
                const bool bits = ok && on.logits.size() == off.logits.size() &&
                                  memcmp(on.logits.data(), off.logits.data(), sizeof(float) * on.logits.size()) == 0 &&
                                  off2.logits == off.logits;
                const bool counts = on.stats.facache_rows == on.rows && on.stats.facache_rows_reused == on.reused &&
                                    off.stats.facache_rows == 0 && off.stats.facache_rows_reused == 0 &&
                                    on.stats.forwards == off.stats.forwards;
                exact += bits && counts && on.out == off.out;
                all_rows += on.stats.facache_rows, all_reused += on.stats.facache_rows_reused;
                CHECK_MSG(bits && counts && on.out == off.out,
                          "%s L=%d S=%d variant %d: logits %s, ids %s, rows %d/%lld reused %d/%lld", fixture, L, S,
                          variant, bits ? "equal" : "DIFFER", on.out == off.out ? "equal" : "differ",
                          on.stats.facache_rows, (long long)on.rows, on.stats.facache_rows_reused,
                          (long long)on.reused);
            }
    }
    printf(
        "    %s kv_quant %d precision %d: %d of %d generations bit-identical; %lld of %lld layer-0 rows reused their "
        "state\n",
        fixture, (int)kvq, (int)precision, exact, cases, (long long)all_reused, (long long)all_rows);
    CHECK(all_reused > 0 && all_reused < all_rows);
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

TEST(bd_facache, fast_dllm_v2_on_equals_off_bit_for_bit) {
    test_bdfa_fixture(T_, "tiny-fast-dllm-v2", DLLM_KV_QUANT_NONE, DLLM_PRECISION_AUTO);
}

TEST(bd_facache, nemotron_on_equals_off_bit_for_bit) {
    test_bdfa_fixture(T_, "tiny-nemotron-diffusion", DLLM_KV_QUANT_NONE, DLLM_PRECISION_AUTO);
}

TEST(bd_facache, on_equals_off_under_kv_quant) {
    test_bdfa_fixture(T_, "tiny-fast-dllm-v2", DLLM_KV_QUANT_SOLOQ_KV4, DLLM_PRECISION_AUTO);
    test_bdfa_fixture(T_, "tiny-nemotron-diffusion", DLLM_KV_QUANT_KIVI_KV2, DLLM_PRECISION_AUTO);
}

TEST(bd_facache, on_equals_off_under_soloq_weights) {
    test_bdfa_fixture(T_, "tiny-nemotron-diffusion", DLLM_KV_QUANT_SOLOQ_KV2, DLLM_PRECISION_SOLOQ_I);
}

/* The switch is validated on block-diffusion models too, and a LLaDA generation reports no FACache rows. */
TEST(bd_facache, lacache_option_and_stats_elsewhere) {
    dllm_model *bd = test_load(test_data("tiny-fast-dllm-v2")), *llada = test_load(test_data("tiny-llada"));
    dllm_ctx *bctx = bd ? test_ctx(bd) : nullptr, *lctx = llada ? test_ctx(llada) : nullptr;
    if (!bctx || !lctx) {
        CHECK(bctx && lctx);
    } else {
        std::vector<int32_t> prompt = {5, 6, 7}, out(128);
        dllm_gen_params gp = dllm_gen_default_params();
        gp.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
        gp.gen_length = 32, gp.block_length = 32, gp.lacache = (dllm_lacache)3;
        int n = 0;
        CHECK_STATUS(dllm_generate(bctx, prompt.data(), 3, gp, out.data(), (int)out.size(), &n, nullptr),
                     DLLM_ERR_INVALID_ARGUMENT, "lacache");
        gp = dllm_gen_default_params();
        gp.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
        gp.gen_length = 16, gp.block_length = 8, gp.steps = 4;
        dllm_gen_stats st;
        memset(&st, 0x5a, sizeof st);
        CHECK_STATUS(dllm_generate(lctx, prompt.data(), 3, gp, out.data(), (int)out.size(), &n, &st), DLLM_OK, nullptr);
        CHECK(st.facache_rows == 0 && st.facache_rows_reused == 0 && st.forwards == 4);
    }
    dllm_ctx_free(bctx);
    dllm_ctx_free(lctx);
    dllm_model_free(bd);
    dllm_model_free(llada);
}

// ---- the GPU's [FACache] on block diffusion (dllm__src_bdfa) ----

/* The module compiles for sm_80 and sm_90a (and the rest of the architecture table) without spills. */
TEST(jit, bd_facache_module_compiles) {
    int targets = 0;
    for (const dllm__arch &row : dllm__arch_table) {
        const dllm__arch a = dllm__arch_for(row.cc);
        const dllm__jit_request rq = dllm__module_bdfa(a);
        std::vector<char> cubin;
        std::vector<std::string> lowered;
        test_compile_clean(T_, rq, a.target, false, cubin, lowered);
        CHECK(lowered.size() == 2 && cubin.size() > 1000);
        targets += row.cc == 80 || row.cc == 90;
    }
    CHECK(targets == 2);
}

/* One prefill of two blocks, then one block step over it (the split path's first use), on a GPU context: the step's
 * logits. */
static std::vector<float> test_bdfa_gpu_step(dllm_ctx *ctx, int B) {
    const int V = ctx->model->cfg.n_vocab;
    std::vector<int32_t> ids((size_t)3 * B);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 37 + 11) % 150);
    std::vector<float> pre((size_t)V), step((size_t)B * V, NAN);
    dllm__bd_call prefill, blk;
    prefill.kind = DLLM__BD_COMMIT, prefill.ids = ids.data(), prefill.T = 2 * B, prefill.mask_block = B,
    prefill.r0 = 2 * B - 1, prefill.r1 = 2 * B;
    blk.ids = ids.data() + 2 * B, blk.T = B, blk.mask_block = B, blk.r0 = 0, blk.r1 = B, blk.lacache = true;
    if (ctx->impl->bd_begin(4 * B) != DLLM_OK || ctx->impl->bd_forward(prefill, pre.data()) != DLLM_OK ||
        ctx->impl->bd_forward(blk, step.data()) != DLLM_OK)
        step.clear();
    return step;
}

/* On the device: one block step through the split layer-0 attention against flash_attn's (bd_split_attention off)
 * within BF16 rounding; then whole generations where LACACHE_ON gives every forward's logits bit for bit as
 * OFF (both take the split attention), with reuse counted as the rule says; the ids the CPU's gives are printed. */
TEST(gpu_bd_facache, on_equals_off_and_matches_flash_attention) {
    NEED_GPU();
    test_tmpdir dir;
    dllm_model *models[2] = {test_load(test_data("tiny-fast-dllm-v2")), test_random_nemotron(dir, 0x5eed, true)};
    const char *names[2] = {"tiny-fast-dllm-v2", "random tiny Nemotron"};
    for (int k = 0; k < 2; k++) {
        dllm_model *m = models[k];
        if (!m) { CHECK(m != nullptr); continue; }
        const int B = m->cfg.bd_size, V = m->cfg.n_vocab;
        dllm_ctx *gpu = test_ctx_precision(m, DLLM_BACKEND_GPU, DLLM_PRECISION_BF16),
                 *cpu = test_ctx_precision(m, DLLM_BACKEND_CPU, DLLM_PRECISION_BF16);
        CHECK(gpu && cpu);
        if (gpu) {
            dllm__gpu_backend *g = (dllm__gpu_backend *)gpu->impl.get();
            g->bd_split_attention(false);
            const std::vector<float> flash = test_bdfa_gpu_step(gpu, B);
            g->bd_split_attention(true);
            const std::vector<float> split = test_bdfa_gpu_step(gpu, B);
            const double err = flash.size() == split.size() && !flash.empty() ? test_max_rel(split, flash) : 1e9;
            printf("    %s: a block step, split layer-0 attention vs flash_attn: max relative error %.2e\n", names[k],
                   err);
            CHECK_MSG(err < 2e-2, "%s: split attention error %.3e", names[k], err);
        }
        for (int L : {B + 5, 2 * B + 3}) {
            if (!gpu || !cpu) break;
            std::vector<int32_t> prompt((size_t)L);
            for (int i = 0; i < L; i++) prompt[(size_t)i] = (int32_t)((i * 29 + L) % std::min(V - 10, 90));
            for (int variant = 0; variant < 3; variant++) {
                dllm_gen_params gp = dllm_gen_default_params();
                gp.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
                gp.gen_length = 3 * B, gp.block_length = B, gp.sub_block_length = variant == 1 ? B / 2 : B / 4,
                gp.stop_at_eos = 0, gp.stop_id = V - 1;
                if (variant >= 1) gp.unmask = DLLM_UNMASK_THRESHOLD, gp.threshold = 0.3;
                gp.block_cache = variant == 2;
                gp.lacache = DLLM_LACACHE_OFF;
                test_bdfa_run off = test_bdfa_generate(gpu, prompt, gp);
                gp.lacache = DLLM_LACACHE_ON;
                test_bdfa_run on = test_bdfa_generate(gpu, prompt, gp), ref = test_bdfa_generate(cpu, prompt, gp);
                const bool bits = on.status == DLLM_OK && off.status == DLLM_OK && !on.logits.empty() &&
                                  on.logits.size() == off.logits.size() &&
                                  memcmp(on.logits.data(), off.logits.data(), sizeof(float) * on.logits.size()) == 0;
                size_t agree = 0;
                for (size_t i = 0; i < std::min(on.out.size(), ref.out.size()); i++) agree += on.out[i] == ref.out[i];
                printf("    %s L=%d variant %d: GPU ON vs OFF %s; %d of %d rows reused; %zu of %zu ids as the CPU's\n",
                       names[k], L, variant, bits ? "bit-identical" : "DIFFER", on.stats.facache_rows_reused,
                       on.stats.facache_rows, agree, ref.out.size());
                CHECK(bits && on.out == off.out);
                CHECK(on.stats.facache_rows == on.rows && on.stats.facache_rows_reused == on.reused && on.reused > 0);
            }
        }
        dllm_ctx_free(gpu);
        dllm_ctx_free(cpu);
        dllm_model_free(m);
    }
}

/* The two kernels against their CPU twin (dllm__cpu_bd_attend) on random bf16 inputs of awkward sizes: committed
 * states of every row, then the merge under the block-causal mask and none; then a second merge after the committed
 * keys are poisoned, with the states of rows 0, 2, 4, ... kept and the others recomputed. */
TEST(gpu_bd_facache, kernels_match_cpu_twin) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    dllm__bdfa_kernels k;
    CHECK_STATUS(dllm__jit_load(dllm__module_bdfa(g.arch), k.module), DLLM_OK, nullptr);
    if (!k.module) return;
    dllm__bind(k, *k.module);
    const dllm__kernel<dllm__sig_bdfa_committed> &committed = k.bdfa_committed;
    const dllm__kernel<dllm__sig_bdfa_merge> &merge = k.bdfa_merge;
    test_rng r("bd_facache_kernels");
    struct shape {
        int hd, H, KV, T, nc, offset, mask_block;
    } shapes[] = {{24, 6, 2, 32, 45, 0, 32},
                  {128, 4, 1, 8, 300, 16, 0},
                  {64, 7, 7, 13, 33, 3, 13},
                  {128, 8, 2, 5, 1037, 5, 32}};  // the last: every warp of bdfa_committed busy
    for (const shape &sh : shapes) {
        const int qkv = (sh.H + 2 * sh.KV) * sh.hd, kvd = sh.KV * sh.hd, n_keys = sh.nc + sh.offset + sh.T,
                  q0 = sh.nc + sh.offset;
        std::vector<float> qf((size_t)sh.T * qkv), kvf((size_t)n_keys * 2 * kvd);
        for (float &v : qf) v = r.normal();
        for (float &v : kvf) v = r.normal();
        std::vector<uint16_t> qb = test_bf16_vec(qf), kvb = test_bf16_vec(kvf);
        std::vector<int> rows((size_t)sh.T);
        for (int i = 0; i < sh.T; i++) rows[(size_t)i] = i;
        dllm__dbuf dq, dkv, dout, dstate, drows;
        test_put(dq, qb);
        test_put(dkv, kvb);
        test_put(drows, rows);
        test_poison(dout, (size_t)sh.T * sh.H * sh.hd * 2);
        test_poison(dstate, (size_t)(sh.offset + sh.T) * sh.H * (sh.hd + 2) * 4);
        bdfa_args a = {};
        a.cache = dkv.as<bf16_t>(), a.q = dq.as<bf16_t>(), a.o = dout.as<bf16_t>(), a.q_stride = qkv,
        a.o_stride = sh.H * sh.hd;
        a.n_head = sh.H, a.n_kv = sh.KV, a.hd = sh.hd, a.scale = 1.0f / sqrtf((float)sh.hd);
        a.n_keys = n_keys, a.n_committed = sh.nc, a.mask_block = sh.mask_block, a.q_index0 = q0;
        a.rows = drows.as<int>(), a.offset = sh.offset, a.state = dstate.as<float>();
        CHECK_STATUS(committed.launch({dim3((unsigned)sh.T, (unsigned)sh.H), dim3(32 * dllm__bdfa_warps)}, 0, a),
                     DLLM_OK, nullptr);
        CHECK_STATUS(merge.launch({dim3((unsigned)sh.T, (unsigned)sh.H), dim3(32)}, 0, a), DLLM_OK, nullptr);
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        const std::vector<float> got = test_f32_vec(test_get<uint16_t>(dout, (size_t)sh.T * sh.H * sh.hd)),
                                 x = test_f32_vec(qb), kv = test_f32_vec(kvb);
        std::vector<float> q((size_t)sh.T * sh.H * sh.hd), kk((size_t)n_keys * kvd), vv((size_t)n_keys * kvd),
            want(q.size(), NAN);
        for (int i = 0; i < sh.T; i++)
            std::copy(&x[(size_t)i * qkv], &x[(size_t)i * qkv] + sh.H * sh.hd, &q[(size_t)i * sh.H * sh.hd]);
        for (int j = 0; j < n_keys; j++) {
            std::copy(&kv[(size_t)j * 2 * kvd], &kv[(size_t)j * 2 * kvd] + kvd, &kk[(size_t)j * kvd]);
            std::copy(&kv[(size_t)j * 2 * kvd] + kvd, &kv[(size_t)j * 2 * kvd] + 2 * kvd, &vv[(size_t)j * kvd]);
        }
        dllm__pool pool(1);
        dllm__cpu_bd_attend(pool, q.data(), kk.data(), vv.data(), sh.T, sh.nc, n_keys, sh.H, sh.KV, sh.hd, want.data(),
                            q0, sh.mask_block, dllm__bd_states());
        const double err = test_max_rel(got, want);
        printf(
            "    bdfa hd=%d H=%d KV=%d: %d rows at %d over %d committed keys, mask block %d: max relative error %.2e\n",
            sh.hd, sh.H, sh.KV, sh.T, q0, sh.nc, sh.mask_block, err);
        CHECK_MSG(err < 2e-2, "bdfa hd=%d: error %.3e", sh.hd, err);
        // Reuse: poison the committed keys, recompute only the odd rows' states: the even rows keep their bits.
        for (size_t i = 0; i < (size_t)sh.nc * 2 * kvd; i++) kvb[i] = (uint16_t)(kvb[i] ^ 0x4000u);
        test_put(dkv, kvb);
        std::vector<int> odd;
        for (int i = 1; i < sh.T; i += 2) odd.push_back(i);
        test_put(drows, odd);
        a.cache = dkv.as<bf16_t>(), a.rows = drows.as<int>();
        test_poison(dout, (size_t)sh.T * sh.H * sh.hd * 2);
        a.o = dout.as<bf16_t>();
        CHECK_STATUS(committed.launch({dim3((unsigned)odd.size(), (unsigned)sh.H), dim3(32 * dllm__bdfa_warps)}, 0, a),
                     DLLM_OK, nullptr);
        CHECK_STATUS(merge.launch({dim3((unsigned)sh.T, (unsigned)sh.H), dim3(32)}, 0, a), DLLM_OK, nullptr);
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        const std::vector<uint16_t> again = test_get<uint16_t>(dout, (size_t)sh.T * sh.H * sh.hd),
                                    first = test_bf16_vec(got);
        int kept = 0, moved = 0;
        const size_t w = (size_t)sh.H * sh.hd;
        for (int i = 0; i < sh.T; i++) {
            const bool eq = memcmp(&again[(size_t)i * w], &first[(size_t)i * w], w * 2) == 0;
            kept += i % 2 == 0 && eq, moved += i % 2 == 1 && !eq;
        }
        CHECK_MSG(kept == (sh.T + 1) / 2 && moved == sh.T / 2,
                  "bdfa hd=%d: %d even rows kept their bits, %d odd rows saw the poison", sh.hd, kept, moved);
    }
}
