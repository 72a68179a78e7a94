/* Tests: batched decoding on the GPU backend (issue 26): the batched forward's layout (CPU), the varlen flash_attn
 * (compiled here for every architecture; run against each sequence alone on a GPU), forward_batch against each
 * sequence alone and in another order, bit for bit, and against the CPU's, and dllm_generate_batch on the GPU against
 * each item decoded as a batch of one and against the CPU's tokens. Included after test_batch.inl and test_gpu.inl
 * (their helpers). */

// ---- the layout of a batched forward (CPU) ---------------------------------------------------------------

TEST(batch, varlen_layout_concatenates_rows_positions_and_logit_rows) {
    const int32_t a[] = {11, 12, 13, 14, 15}, b[] = {21}, cv[] = {31, 32, 33, 34, 35, 36, 37};
    const int32_t dpad_positions[] = {0, 1, 2, 10, 11, 12, 20};  // a compacted canvas: rows at their original positions
    std::vector<dllm__batch_seq> plan(3);
    plan[0].ids = a, plan[0].n = 5, plan[0].r0 = 2, plan[0].r1 = 5;
    plan[1].ids = b, plan[1].n = 1, plan[1].r0 = 0, plan[1].r1 = 1;
    plan[2].ids = cv, plan[2].n = 7, plan[2].positions = dpad_positions, plan[2].r0 = 3, plan[2].r1 = 7;
    dllm__config c;
    dllm__varlen_layout v;
    c.shift_logits = false;
    CHECK_STATUS(dllm__varlen_layout_of(c, plan, 32, v), DLLM_OK, nullptr);
    CHECK((v.offsets == std::vector<int32_t>{0, 5, 6, 13}) && v.rows == 13 && v.max_rows == 7);
    CHECK((v.ids == std::vector<int32_t>{11, 12, 13, 14, 15, 21, 31, 32, 33, 34, 35, 36, 37}));
    CHECK((v.positions == std::vector<int32_t>{0, 1, 2, 3, 4, 0, 0, 1, 2, 10, 11, 12, 20}));
    CHECK((v.raw0 == std::vector<int>{2, 0, 3}) && (v.raw1 == std::vector<int>{5, 1, 7}));
    CHECK((v.out0 == std::vector<int>{0, 3, 4}) && v.out_rows == 8);
    // Dream's shift: position p is predicted by row p - 1 (position 0 by row 0)
    c.shift_logits = true;
    CHECK_STATUS(dllm__varlen_layout_of(c, plan, 32, v), DLLM_OK, nullptr);
    CHECK((v.raw0 == std::vector<int>{1, 0, 2}) && (v.raw1 == std::vector<int>{4, 1, 6}));
    CHECK((v.out0 == std::vector<int>{0, 3, 4}) && v.out_rows == 8 && v.rows == 13);
    // an empty plan, then plans the driver must never make: each an INTERNAL status naming the sequence
    CHECK_STATUS(dllm__varlen_layout_of(c, std::vector<dllm__batch_seq>(), 32, v), DLLM_OK, nullptr);
    CHECK((v.offsets == std::vector<int32_t>{0}) && v.rows == 0 && v.out_rows == 0 && v.ids.empty());
    CHECK_STATUS(dllm__varlen_layout_of(c, plan, 6, v), DLLM_ERR_INTERNAL, "sequence 2 has 7 rows (at most 6)");
    CHECK_STATUS(dllm__varlen_layout_of(c, plan, 20, v), DLLM_ERR_INTERNAL, "position 20");
    std::vector<dllm__batch_seq> bad = plan;
    bad[1].r1 = 2;
    CHECK_STATUS(dllm__varlen_layout_of(c, bad, 32, v), DLLM_ERR_INTERNAL, "sequence 1");
    bad = plan;
    bad[0].r0 = bad[0].r1;
    CHECK_STATUS(dllm__varlen_layout_of(c, bad, 32, v), DLLM_ERR_INTERNAL, "sequence 0");
}

/* The varlen flash_attn compiles for every architecture of the table and head dims 64, 128 and 256, on the table's
 * tiles and the short runs' (dllm__attn_short_tiles), with attn_combine's varlen instantiation, and, like the plain
 * one, neither spills nor needs a stack frame. */
TEST(jit, varlen_attention_compiles_for_every_arch) {
    for (const dllm__arch &row : dllm__arch_table)
        for (int hd : {64, 128, 256}) {
            const dllm__arch a = dllm__attn_tiles(dllm__arch_for(row.cc), hd);
            const dllm__jit_request rq = dllm__module_attention_varlen(a, hd);
            std::vector<char> cubin;
            std::vector<std::string> lowered;
            test_compile_clean(T_, rq, a.target, true, cubin, lowered);
            CHECK(rq.kernels.size() == 3 && rq.kernels[1] == dllm__attn_combine_name(hd, true) &&
                  rq.kernels[2] == dllm__attn_varlen_name(hd, dllm__attn_short_tiles(a)) &&
                  rq.kernels[0].find(",true>") != std::string::npos && lowered.size() == 3 && cubin.size() > 1000);
        }
}

// ---- [dual cache] [prefix cache] the batched K/V-cache step's layout (CPU) -----------------------------------------

/* Three sequences over slots laid out out of order: a dual-cache step, a filling step, a DPad prefix-cache step. */
struct test_kv_plan {
    std::vector<int32_t> a, b, cv, dpad;
    std::vector<dllm__batch_seq> plan;
    std::vector<int> base = {0, 6, 20}, rows = {6, 14, 10};
};
static void test_kv_make_plan(test_kv_plan &k) {
    for (int i = 0; i < 10; i++) k.a.push_back(100 + i);
    for (int i = 0; i < 6; i++) k.b.push_back(200 + i);
    for (int i = 0; i < 12; i++) k.cv.push_back(300 + i), k.dpad.push_back(2 * i + 1);
    k.plan.resize(3);
    dllm__batch_seq &a = k.plan[0], &b = k.plan[1], &c = k.plan[2];
    a.ids = k.a.data(), a.n = 10, a.slot = 2, a.q0 = 4, a.q1 = 8, a.r0 = 4, a.r1 = 8;
    b.ids = k.b.data(), b.n = 6, b.slot = 0, b.fill = true, b.q0 = 0, b.q1 = 6, b.r0 = 2, b.r1 = 6;
    c.ids = k.cv.data(), c.n = 12, c.slot = 1, c.positions = k.dpad.data(), c.q0 = 8, c.q1 = 12, c.r0 = 9, c.r1 = 12;
}

TEST(batch, kv_layout_places_rows_in_their_slots) {
    test_kv_plan k;
    test_kv_make_plan(k);
    dllm__config c;
    c.shift_logits = false;
    dllm__varlen_layout v;
    CHECK_STATUS(dllm__kv_layout_of(c, k.plan, k.base, k.rows, 64, v), DLLM_OK, nullptr);
    CHECK(v.cached() && v.rows == 14 && v.max_rows == 6 && v.out_rows == 11);
    CHECK((v.offsets == std::vector<int32_t>{0, 4, 10, 14}) && (v.q0 == std::vector<int>{4, 0, 8}));
    CHECK((v.ids == std::vector<int32_t>{104, 105, 106, 107, 200, 201, 202, 203, 204, 205, 308, 309, 310, 311}));
    CHECK((v.positions == std::vector<int32_t>{4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 17, 19, 21, 23}));
    CHECK((v.cache_rows == std::vector<int32_t>{24, 25, 26, 27, 0, 1, 2, 3, 4, 5, 14, 15, 16, 17}));
    // entries 0, 2, 4 the sequences (queries over their slot's n rows), 1 and 3 the bridges without a query row
    CHECK((v.attn_q_offsets == std::vector<int32_t>{0, 4, 4, 10, 10, 14}));
    CHECK((v.attn_kv_offsets == std::vector<int32_t>{20, 30, 0, 6, 6, 18}));
    CHECK((v.raw0 == std::vector<int>{4, 2, 9}) && (v.raw1 == std::vector<int>{8, 6, 12}) &&
          (v.out0 == std::vector<int>{0, 4, 8}));
    // the rows go where the layout says: the twin of kv_scatter_rows moves each forwarded row's K|V into its slot row
    const int width = 24, stride = 40;
    std::vector<uint16_t> src((size_t)v.rows * stride), cache((size_t)30 * width, 0xFFFF);
    for (int r = 0; r < v.rows; r++)
        for (int e = 0; e < stride; e++) src[(size_t)r * stride + e] = (uint16_t)(v.ids[(size_t)r] * 64 + e);
    dllm__kv_scatter_rows_ref(src.data() + 16, stride, cache.data(), width, v.cache_rows.data(), width, v.rows);
    for (int row = 0; row < 30; row++) {
        int32_t id = -1;  // the canvas token whose K|V this cache row must hold, -1: untouched
        if (row >= 24 && row < 28) id = 100 + row - 20;   // slot 2, rows 4..7 of a
        if (row < 6) id = 200 + row;                      // slot 0, every row of b
        if (row >= 14 && row < 18) id = 300 + row - 6;    // slot 1, rows 8..11 of c
        for (int e = 0; e < width; e++) {
            const uint16_t want = id < 0 ? (uint16_t)0xFFFF : (uint16_t)(id * 64 + 16 + e);
            CHECK_MSG(cache[(size_t)row * width + e] == want, "cache row %d element %d: %d, want %d", row, e,
                      cache[(size_t)row * width + e], want);
            if (cache[(size_t)row * width + e] != want) return;
        }
    }
    // Dream's shift: sequence a's first logit row is 3, outside its forwarded rows [4, 8): the driver never plans that
    c.shift_logits = true;
    CHECK_STATUS(dllm__kv_layout_of(c, k.plan, k.base, k.rows, 64, v), DLLM_ERR_INTERNAL,
                 "logit rows [3, 7) outside its forwarded rows [4, 8)");
    k.plan[0].q0 = 3, k.plan[2].q0 = 7;  // dllm__step_rows's rows under the shift
    CHECK_STATUS(dllm__kv_layout_of(c, k.plan, k.base, k.rows, 64, v), DLLM_OK, nullptr);
    CHECK((v.raw0 == std::vector<int>{3, 1, 8}) && (v.cache_rows[0] == 23) && v.rows == 16 &&
          (v.attn_q_offsets == std::vector<int32_t>{0, 5, 5, 11, 11, 16}));
    // plans the driver must never make: INTERNAL, naming the sequence
    c.shift_logits = false;
    test_kv_make_plan(k);
    std::vector<dllm__batch_seq> bad = k.plan;
    bad[2].slot = 2;  // a slot twice
    CHECK_STATUS(dllm__kv_layout_of(c, bad, k.base, k.rows, 64, v), DLLM_ERR_INTERNAL, "sequence 2 (slot 2");
    bad = k.plan, bad[0].slot = 3;
    CHECK_STATUS(dllm__kv_layout_of(c, bad, k.base, k.rows, 64, v), DLLM_ERR_INTERNAL, "sequence 0 (slot 3");
    bad = k.plan, bad[1].q0 = 1;  // a filling step forwards every row
    CHECK_STATUS(dllm__kv_layout_of(c, bad, k.base, k.rows, 64, v), DLLM_ERR_INTERNAL, "sequence 1");
    bad = k.plan, bad[0].slot = 1, bad[2].slot = 2;  // c's 12 rows in slot 2's 10
    CHECK_STATUS(dllm__kv_layout_of(c, bad, k.base, k.rows, 64, v), DLLM_ERR_INTERNAL, "sequence 2");
    CHECK_STATUS(dllm__kv_layout_of(c, k.plan, k.base, k.rows, 20, v), DLLM_ERR_INTERNAL, "position 21");
    CHECK_STATUS(dllm__kv_layout_of(c, std::vector<dllm__batch_seq>(), k.base, k.rows, 64, v), DLLM_OK, nullptr);
    CHECK(v.rows == 0 && !v.cached() && v.attn_q_offsets.empty());
}

/* kv_scatter_rows compiles for every architecture of the table (sm_80 and sm_90a among them), without spills. */
TEST(jit, kv_scatter_compiles_for_every_arch) {
    for (const dllm__arch &row : dllm__arch_table) {
        const dllm__jit_request rq = dllm__module_kv_scatter(row);
        std::vector<char> cubin;
        std::vector<std::string> lowered;
        test_compile_clean(T_, rq, row.target, true, cubin, lowered);
        CHECK(rq.kernels.size() == 1 && lowered.size() == 1 && cubin.size() > 500);
    }
}

// ---- the varlen attention on the GPU ---------------------------------------------------------------------

/* The arguments both attention launches below share: `rows` rows a sequence of fused Q|K|V rows at qkv
 * ([rows][H + 2 KV][hd]), output rows [rows][H][hd] at out, one key split. */
static attn_args test_fused_attn_args(const dllm__dbuf &qkv, const dllm__dbuf &out, int H, int KV, int hd, int rows) {
    attn_args a = {};
    a.q = qkv.as<bf16_t>(), a.k = a.q + (size_t)H * hd, a.v = a.q + (size_t)(H + KV) * hd, a.o = out.as<bf16_t>();
    a.seq = a.q_rows = rows;
    a.q_stride = a.kv_stride = (H + 2 * KV) * hd, a.o_stride = H * hd, a.group = H / KV;
    a.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    a.kv_splits = 1;
    return a;
}

/* The work lists of a varlen attention over entries q_offsets (shares splits, empty: 1 each) on `tiles` on the device
 * (dw), pointed to by a.varlen_work; their shape, for dllm__attn_varlen_launch. */
static dllm__attn_work_shape test_varlen_work(dllm__dbuf &dw, attn_args &a, const std::vector<int32_t> &q_offsets,
                                              const std::vector<int32_t> &splits, const dllm__arch &tiles) {
    std::vector<int32_t> items;
    const dllm__attn_work_shape w = dllm__attn_varlen_work(q_offsets, splits, tiles.fa_br, items);
    test_put(dw, items);
    a.varlen_work = dw.as<int>();
    return w;
}

/* Sequences of the given lengths concatenated in `order`, fused Q|K|V rows ([T][H + 2 KV][hd]): the varlen flash_attn's
 * output rows of each sequence (by sequence, whatever the order), the output poisoned first. */
static std::vector<std::vector<uint16_t>> test_varlen_attention(dllm_test_state &T_, const test_gpu &g,
                                                                const dllm__kernel<void(attn_args)> &k, int hd, int H,
                                                                int KV, const std::vector<std::vector<uint16_t>> &seqs,
                                                                const std::vector<int> &order) {
    const int stride = (H + 2 * KV) * hd;
    std::vector<uint16_t> rows;
    std::vector<int> offsets = {0};
    int max_rows = 0;
    for (int s : order) {
        rows.insert(rows.end(), seqs[(size_t)s].begin(), seqs[(size_t)s].end());
        const int n = (int)(seqs[(size_t)s].size() / stride);
        offsets.push_back(offsets.back() + n);
        max_rows = std::max(max_rows, n);
    }
    const int T = offsets.back();
    dllm__dbuf dq, doff, dout, dwork;
    test_put(dq, rows);
    test_put(doff, offsets);
    test_poison(dout, (size_t)T * H * hd * 2);
    attn_args a = test_fused_attn_args(dq, dout, H, KV, hd, max_rows);
    a.q_offsets = a.kv_offsets = doff.as<int>();
    const dllm__attn_work_shape w = test_varlen_work(dwork, a, offsets, {}, g.arch);
    CHECK_STATUS(
        dllm__attn_varlen_launch(k, dllm__kernel<void(attn_args)>(), g.arch, hd, H, (int)order.size(), w, a, 0),
        DLLM_OK, nullptr);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<uint16_t> out = test_get<uint16_t>(dout, (size_t)T * H * hd);
    std::vector<std::vector<uint16_t>> by_seq(seqs.size());
    for (size_t i = 0; i < order.size(); i++)
        by_seq[(size_t)order[i]].assign(out.begin() + (size_t)offsets[i] * H * hd,
                                        out.begin() + (size_t)offsets[i + 1] * H * hd);
    return by_seq;
}

/* Each sequence alone through the plain flash_attn (batch 1, plain tile order): its output rows. */
static std::vector<uint16_t> test_attention_alone(dllm_test_state &T_, const test_gpu &g, const dllm__attn_kernels &k,
                                                  int hd, int H, int KV, const std::vector<uint16_t> &rows) {
    const int stride = (H + 2 * KV) * hd, n = (int)(rows.size() / stride);
    dllm__dbuf dq, dout;
    test_put(dq, rows);
    test_poison(dout, (size_t)n * H * hd * 2);
    attn_args a = test_fused_attn_args(dq, dout, H, KV, hd, n);
    a.q_bstride = (u64)n * stride, a.o_bstride = (u64)n * H * hd;
    CHECK_STATUS(dllm__attn_launch(k, g.arch, hd, H, 1, a, 0), DLLM_OK, nullptr);
    return test_get<uint16_t>(dout, (size_t)n * H * hd);
}

/* Awkward lengths (one row, partial tiles, several query tiles), GQA, both head dims: the varlen attention gives every
 * sequence the bits of its own launch, in any order of the concatenation, and the CPU twin's values; on the table's
 * tiles and on the short runs' (dllm__attn_short_tiles), which the batched forwards pick by the batch's longest run. */
/* The varlen flash_attn's module for head dim hd on a's tiles (loaded into mod), its kernel on those tiles (k) and on
 * the short runs' (k_short, dllm__attn_short_tiles), each with the dynamic shared memory its tiles take; false after a
 * failed check. */
static bool test_load_varlen(dllm_test_state &T_, const dllm__arch &a, int hd, std::shared_ptr<dllm__module> &mod,
                             dllm__kernel<void(attn_args)> &k, dllm__kernel<void(attn_args)> &k_short) {
    CHECK_STATUS(dllm__jit_load(dllm__module_attention_varlen(a, hd), mod), DLLM_OK, nullptr);
    if (!mod) return false;
    const dllm__arch short_tiles = dllm__attn_short_tiles(a);
    k.fn = mod->kernels.at(dllm__attn_varlen_name(hd, a)), k.name = "flash_attn (varlen)";
    CHECK(cudaFuncSetAttribute((const void *)k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)dllm__attn_smem(hd, a)) == cudaSuccess);
    k_short.fn = mod->kernels.at(dllm__attn_varlen_name(hd, short_tiles)),
    k_short.name = "flash_attn (varlen, short runs)";
    CHECK(cudaFuncSetAttribute((const void *)k_short.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)dllm__attn_smem(hd, short_tiles)) == cudaSuccess);
    return true;
}

TEST(gpu_batch, varlen_attention_equals_each_sequence_alone) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("varlen attention");
    dllm__pool pool(1);
    for (int hd : {64, 128}) {
        const dllm__arch a = dllm__attn_tiles(g.arch, hd);
        test_gpu ga = g;
        ga.arch = a;
        const int H = 4, KV = 2, stride = (H + 2 * KV) * hd;
        std::shared_ptr<dllm__module> mod;
        dllm__kernel<void(attn_args)> k, k_short;
        if (!test_load_varlen(T_, a, hd, mod, k, k_short)) return;
        test_gpu gs = ga;
        gs.arch = dllm__attn_short_tiles(a);
        const dllm__attn_kernels plain = test_attn_kernels(T_, ga, hd);
        const int lengths[] = {37, 1, 255, 130, 64};
        std::vector<std::vector<uint16_t>> seqs;
        for (int n : lengths) {
            std::vector<float> x((size_t)n * stride);
            for (float &v : x) v = r.normal();
            seqs.push_back(test_bf16_vec(x));
        }
        const std::vector<std::vector<uint16_t>> batched =
            test_varlen_attention(T_, ga, k, hd, H, KV, seqs, {0, 1, 2, 3, 4});
        const std::vector<std::vector<uint16_t>> permuted =
            test_varlen_attention(T_, ga, k, hd, H, KV, seqs, {3, 0, 4, 2, 1});
        const std::vector<std::vector<uint16_t>> short_tiles =
            test_varlen_attention(T_, gs, k_short, hd, H, KV, seqs, {2, 4, 1, 0, 3});
        for (size_t s = 0; s < seqs.size(); s++) {
            const int n = lengths[s];
            CHECK_MSG(batched[s] == test_attention_alone(T_, ga, plain, hd, H, KV, seqs[s]),
                      "hd %d sequence %zu (%d rows): varlen bits differ from alone", hd, s, n);
            CHECK_MSG(permuted[s] == batched[s], "hd %d sequence %zu: the order of the batch changed its bits", hd, s);
            CHECK_MSG(short_tiles[s] == batched[s],
                      "hd %d sequence %zu (%d rows): the short runs' tiles changed its bits", hd, s, n);
            std::vector<float> x = test_f32_vec(seqs[s]), q((size_t)n * H * hd), kk((size_t)n * KV * hd),
                               vv((size_t)n * KV * hd), want(q.size());
            for (int i = 0; i < n; i++) {
                const float *row = &x[(size_t)i * stride];
                std::copy(row, row + H * hd, &q[(size_t)i * H * hd]);
                std::copy(row + H * hd, row + (H + KV) * hd, &kk[(size_t)i * KV * hd]);
                std::copy(row + (H + KV) * hd, row + stride, &vv[(size_t)i * KV * hd]);
            }
            dllm__cpu_attention(pool, q.data(), kk.data(), vv.data(), n, n, H, KV, hd, nullptr, want.data());
            const double err = test_max_rel(test_f32_vec(batched[s]), want);
            CHECK_MSG(err < 2e-2, "hd %d sequence %zu: error %.3e against the CPU twin", hd, s, err);
        }
    }
}

// ---- forward_batch on the GPU -----------------------------------------------------------------------------

/* A plan of canvases of mixed lengths and logit rows, one of them DPad-like (rows at spread positions). */
struct test_batch_plan {
    std::vector<std::vector<int32_t>> ids, positions;
    std::vector<dllm__batch_seq> plan;
};
static void test_batch_make_plan(std::mt19937 &rng, int n_vocab, int mask_id, test_batch_plan &p) {
    const int lengths[] = {3, 17, 40, 1, 9, 66};
    for (int n : lengths) {
        p.ids.emplace_back();
        for (int i = 0; i < n; i++)
            p.ids.back().push_back(rng() % 3 == 0 ? mask_id : (int32_t)(rng() % (uint32_t)n_vocab));
        p.positions.emplace_back();
        if (n == 9)
            for (int i = 0; i < n; i++) p.positions.back().push_back(3 * i + (int)(rng() % 3));
    }
    for (size_t s = 0; s < p.ids.size(); s++) {
        dllm__batch_seq q;
        q.ids = p.ids[s].data(), q.n = (int)p.ids[s].size();
        q.positions = p.positions[s].empty() ? nullptr : p.positions[s].data();
        q.r0 = (int)(rng() % (uint32_t)q.n), q.r1 = q.r0 + 1 + (int)(rng() % (uint32_t)(q.n - q.r0));
        p.plan.push_back(q);
    }
}

/* forward_batch's logits of a plan, the output poisoned first. */
static std::vector<float> test_forward_batch(dllm_test_state &T_, dllm_ctx *ctx,
                                             const std::vector<dllm__batch_seq> &plan, int V) {
    size_t rows = 0;
    for (const dllm__batch_seq &s : plan) rows += (size_t)(s.r1 - s.r0);
    std::vector<float> out(rows * V, NAN);
    CHECK_STATUS(ctx->impl->forward_batch(plan, out.data()), DLLM_OK, nullptr);
    return out;
}

/* One context's batched forward against each sequence alone (a batch of one) and the batch reversed, bit for bit,
 * and against the CPU reference's batched forward. The batch holds `copies` plans of test_batch_make_plan (136 rows
 * each). */
static void test_forward_batch_case(dllm_test_state &T_, dllm_model *m, dllm_ctx *gpu, dllm_ctx *cpu, const char *what,
                                    int copies = 1) {
    const int V = m->cfg.n_vocab;
    std::mt19937 rng(1234);
    std::vector<test_batch_plan> plans((size_t)copies);  // sized once: the plan points into their ids
    test_batch_plan p;
    for (test_batch_plan &one : plans) {
        test_batch_make_plan(rng, V, m->cfg.mask_id, one);
        p.plan.insert(p.plan.end(), one.plan.begin(), one.plan.end());
    }
    const std::vector<float> all = test_forward_batch(T_, gpu, p.plan, V);
    std::vector<float> alone, reversed_by_seq;
    for (const dllm__batch_seq &s : p.plan) {
        const std::vector<float> one = test_forward_batch(T_, gpu, {s}, V);
        alone.insert(alone.end(), one.begin(), one.end());
    }
    CHECK_MSG(all.size() == alone.size() && !memcmp(all.data(), alone.data(), all.size() * 4),
              "%s: a batched sequence's logits differ from its own", what);
    std::vector<dllm__batch_seq> reversed(p.plan.rbegin(), p.plan.rend());
    const std::vector<float> rev = test_forward_batch(T_, gpu, reversed, V);
    size_t at = rev.size();  // the reversed batch's sequences, back in plan order
    for (const dllm__batch_seq &s : p.plan) {
        const size_t n = (size_t)(s.r1 - s.r0) * V;
        at -= n;
        reversed_by_seq.insert(reversed_by_seq.end(), rev.begin() + (long)at, rev.begin() + (long)(at + n));
    }
    CHECK_MSG(reversed_by_seq.size() == all.size() && !memcmp(all.data(), reversed_by_seq.data(), all.size() * 4),
              "%s: the batch's order changed bits", what);
    if (cpu) {
        const std::vector<float> ref = test_forward_batch(T_, cpu, p.plan, V);
        const double err = test_max_rel(all, ref);
        printf("    %s: GPU vs CPU batched logits max relative error %.2e\n", what, err);
        CHECK_MSG(err < 5e-2, "%s: GPU batched forward error %.3e against the CPU's", what, err);
    }
}

/* The varlen tile rule on the shapes it was measured at (32 heads of 128, 32-row blocks; the H100 and H200 both have
 * 132 SMs of 228 KB): the table's tiles at batch 1 (their 32 CTAs won, 40 against 60 us a layer on the H200), the short
 * ones at batch 16 (105 against 136 us a layer); never past 64 rows a run; and once the short tiles win at a batch,
 * they win at every larger one. */
TEST(batch, varlen_short_tiles_only_where_the_table_needs_a_second_wave) {
    const int smem_hopper = 233472, n_sms = 132;
    const dllm__arch a = dllm__attn_tiles(dllm__arch_for(90), 128);
    CHECK(!dllm__attn_varlen_short(a, 128, 32, 1, 32, n_sms, smem_hopper));
    CHECK(dllm__attn_varlen_short(a, 128, 32, 16, 32, n_sms, smem_hopper));
    CHECK(!dllm__attn_varlen_short(a, 128, 32, 16, 65, n_sms, smem_hopper));
    CHECK(!dllm__attn_varlen_short(a, 128, 32, 64, 96, n_sms, smem_hopper));
    for (int sm : {80, 86, 89, 90})
        for (int hd : {64, 128, 256}) {
            const dllm__arch t = dllm__attn_tiles(dllm__arch_for(sm), hd);
            int first = 0;
            for (int batch = 1; batch <= 256; batch++) {
                const bool on = dllm__attn_varlen_short(t, hd, 32, batch, 32, n_sms, smem_hopper);
                if (on && !first) first = batch;
                CHECK_MSG(on == (first && batch >= first), "sm_%d hd %d: the short tiles at batch %d but not at %d", sm,
                          hd, first, batch);
            }
            CHECK_MSG(first > 1, "sm_%d hd %d: the short tiles even at batch 1", sm, hd);
        }
}

/* The CTAs of the dense grids the varlen attention launched before its work lists, in the order the grids numbered
 * them, that did not return at once: flash_attn's grid of ceil(longest / br) query tiles by entries x most shares,
 * whose CTA (x, z) worked on tile x of entry z / most, share z % most, where the tile holds query rows and the entry
 * has that share (varlen_sequence's test then); attn_combine's grid of longest rows by entries, launched where some
 * entry splits, whose CTA (x, z) worked where entry z has row x and more than one share. */
static std::vector<int32_t> test_dense_varlen_ctas(const std::vector<int32_t> &q_offsets,
                                                   const std::vector<int32_t> &splits, int br) {
    const int entries = (int)q_offsets.size() - 1;
    auto rows = [&](int e) { return q_offsets[(size_t)e + 1] - q_offsets[(size_t)e]; };
    auto shares = [&](int e) { return splits.empty() ? 1 : splits[2 * (size_t)e]; };
    int longest = 0, most = 1;
    for (int e = 0; e < entries; e++) longest = std::max(longest, rows(e)), most = std::max(most, shares(e));
    std::vector<int32_t> ctas;
    for (int z = 0; z < entries * most; z++) {
        const int e = z / most, split = z % most;
        for (int x = 0; x < (longest + br - 1) / br; x++)
            if (x * br < rows(e) && split < shares(e)) ctas.insert(ctas.end(), {x, e, split, 0});
    }
    for (int z = 0; most > 1 && z < entries; z++)
        for (int x = 0; x < longest; x++)
            if (x < rows(z) && shares(z) >= 2) ctas.insert(ctas.end(), {z, x});
    return ctas;
}

/* On random layouts of awkward sizes (one row, a tile and one row either side, bridges without a query row, entries
 * with and without split-KV shares), the work lists are exactly the dense grids' working CTAs, each once, in their
 * order: each CTA computes what it did, so the lists change no bit (gpu_batch and gpu_bd_batch compare the bits). */
TEST(batch, varlen_work_lists_hold_the_dense_grids_working_ctas) {
    test_rng r("varlen work lists");
    const int sizes[] = {1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 1024};
    for (int trial = 0; trial < 400; trial++) {
        const int n = 1 + (int)(r.next() % 9), br = 32 << (r.next() % 3);
        const bool split = r.next() % 3 != 0;
        std::vector<int32_t> q_offsets = {0}, splits;
        for (int i = 0; i < n; i++) {
            if (i > 0) q_offsets.push_back(q_offsets.back()), splits.insert(splits.end(), {1, 7});  // a bridge
            const int rows = r.next() % 4 ? sizes[r.next() % 16] : 1 + (int)(r.next() % 300);
            q_offsets.push_back(q_offsets.back() + rows);
            splits.insert(splits.end(), {1 + (int)(r.next() % 8), (int)(r.next() % 1000)});
        }
        if (!split) splits.clear();
        std::vector<int32_t> items;
        const dllm__attn_work_shape w = dllm__attn_varlen_work(q_offsets, splits, br, items);
        const std::vector<int32_t> dense = test_dense_varlen_ctas(q_offsets, splits, br);
        CHECK_MSG(items == dense && w.br == br && (size_t)w.n_attn * 4 + (size_t)w.n_combine * 2 == items.size(),
                  "trial %d (%d sequences, tiles of %d rows, %s): %zu ints of work against the dense grids' %zu", trial,
                  n, br, split ? "split" : "unsplit", items.size(), dense.size());
    }
    // the H100's mixed step: 2 fills of 1024 rows (1 share) and 14 steps of 32 rows (8 shares), 31 entries: the grid of
    // 8 x 248 CTAs a head is down to the 16 + 112 that work, the combine's 1024 x 31 to the steps' 448 rows
    std::vector<int32_t> q_offsets = {0}, splits, items;
    for (int i = 0; i < 16; i++) {
        if (i > 0) q_offsets.push_back(q_offsets.back()), splits.insert(splits.end(), {1, 0});
        q_offsets.push_back(q_offsets.back() + (i < 2 ? 1024 : 32));
        splits.insert(splits.end(), {i < 2 ? 1 : 8, 0});
    }
    const dllm__attn_work_shape w = dllm__attn_varlen_work(q_offsets, splits, 128, items);
    CHECK(w.n_attn == 128 && w.n_combine == 448 && items == test_dense_varlen_ctas(q_offsets, splits, 128));
}

TEST(gpu_batch, forward_batch_equals_each_sequence_alone_bit_for_bit) {
    NEED_GPU();
    test_gpu_cpu_on_tiny_fixtures(T_, [&](const char *fx, dllm_model *m, dllm_ctx *gpu, dllm_ctx *cpu) {
        CHECK(((dllm__gpu_backend *)gpu->impl.get())->batch_unsupported() == nullptr);
        test_forward_batch_case(T_, m, gpu, cpu, fx);
    });
    for (const char *fx : {"tiny-llada", "tiny-dream"}) {
        dllm_model *m = test_load(test_data(fx));
        // [SoloQ]: the same GEMM entry point, every stage row by row (the GPU's SoloQ numerics are not the CPU's bits)
        dllm_ctx *soloq = m ? test_soloq_ctx(m, DLLM_BACKEND_GPU, DLLM_PRECISION_SOLOQ_N, 0) : nullptr;
        CHECK_MSG(soloq != nullptr, "%s SoloQ-N: %s", fx, dllm_last_error());
        if (soloq) test_forward_batch_case(T_, m, soloq, nullptr, "SoloQ-N");
        dllm_ctx_free(soloq);
        dllm_model_free(m);
    }
}

// ---- [dual cache] [prefix cache] the batched K/V-cache step on the GPU ---------------------------------------------

/* kv_scatter_rows against its twin: awkward widths and strides, rows in a scattered order, the cache poisoned first. */
TEST(gpu_batch, kv_scatter_equals_its_twin) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    std::shared_ptr<dllm__module> mod;
    CHECK_STATUS(dllm__jit_load(dllm__module_kv_scatter(g.arch), mod), DLLM_OK, nullptr);
    if (!mod) return;
    dllm__kernel<dllm__sig_kv_scatter_rows> k;
    k.fn = mod->kernels.at("kv_scatter_rows"), k.name = "kv_scatter_rows";
    std::mt19937 rng(44);
    for (int width : {8, 24, 1032}) {
        const int stride = width + 40, rows = 37, cache_rows = 3 * rows;
        std::vector<uint16_t> src((size_t)rows * stride), cache((size_t)cache_rows * width, 0x7FC1);
        for (uint16_t &x : src) x = (uint16_t)rng();
        std::vector<int> to((size_t)cache_rows);
        for (int i = 0; i < cache_rows; i++) to[(size_t)i] = i;
        std::shuffle(to.begin(), to.end(), rng);
        to.resize((size_t)rows);
        dllm__dbuf dsrc, dcache, dto;
        test_put(dsrc, src);
        test_put(dcache, cache);  // the poison: rows the scatter must not touch keep it
        test_put(dto, to);
        CHECK_STATUS(k.launch({dim3((unsigned)rows), dim3(128)}, 0, dsrc.as<bf16_t>() + 40, (u64)stride,
                              dcache.as<bf16_t>(), (u64)width, dto.as<int>(), width, rows),
                     DLLM_OK, nullptr);
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        dllm__kv_scatter_rows_ref(src.data() + 40, stride, cache.data(), width, to.data(), width, rows);
        CHECK_MSG(test_get<uint16_t>(dcache, cache.size()) == cache,
                  "width %d: the scattered cache differs from the twin's", width);
        // no row list: row r to cache row r (block diffusion's fresh rows), here from cache row `rows` on
        for (uint16_t &x : src) x = (uint16_t)rng();
        test_put(dsrc, src);
        CHECK_STATUS(k.launch({dim3((unsigned)rows), dim3(128)}, 0, dsrc.as<bf16_t>() + 40, (u64)stride,
                              dcache.as<bf16_t>() + (size_t)rows * width, (u64)width, (const int *)nullptr, width,
                              rows),
                     DLLM_OK, nullptr);
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        dllm__kv_scatter_rows_ref(src.data() + 40, stride, cache.data() + (size_t)rows * width, width, nullptr, width,
                                  rows);
        CHECK_MSG(test_get<uint16_t>(dcache, cache.size()) == cache,
                  "width %d: the in-order copy differs from the twin's", width);
    }
}

/* Sequences with K/V caches of mixed lengths and cache modes, stepped together through forward_batch_kv: a filling
 * step for all, then a step where some forward their block (dual) or block and suffix (prefix) over their caches while
 * one fills again (its next block) and one has left; each sequence's logits bit-identical to its own steps in a batch
 * of one, and to the batch with its slots and sequences in another order; close to the CPU's forward_batch_kv. */
struct test_kv_seq {
    std::vector<int32_t> ids;
    int b0 = 0, b1 = 0;  // the block
    bool dual = true;
};
static dllm__batch_seq test_kv_step(const test_kv_seq &q, int slot, bool fill, int shift) {
    dllm__batch_seq s;
    s.ids = q.ids.data(), s.n = (int)q.ids.size(), s.slot = slot, s.fill = fill;
    s.q0 = fill ? 0 : std::max(0, q.b0 - shift), s.q1 = fill || !q.dual ? s.n : q.b1;
    s.r0 = q.b0, s.r1 = q.b1;
    return s;
}
/* Runs the steps (each a list of (sequence, fill)), step k on the canvases canvases[k], over slots in the given order
 * (slot i: sequence slots[i]); each step's logits by sequence (empty where it took no part). */
typedef std::vector<std::vector<std::pair<int, bool>>> test_kv_steps;
static std::vector<std::vector<float>> test_kv_run(dllm_test_state &T_, dllm_ctx *ctx,
                                                   const std::vector<std::vector<test_kv_seq>> &canvases,
                                                   const test_kv_steps &steps, const std::vector<int> &slots, int V,
                                                   int shift) {
    const std::vector<test_kv_seq> &seqs = canvases[0];
    std::vector<int> rows(seqs.size()), slot_of(seqs.size());
    for (size_t i = 0; i < slots.size(); i++)
        rows[i] = (int)seqs[(size_t)slots[i]].ids.size(), slot_of[(size_t)slots[i]] = (int)i;
    CHECK_STATUS(ctx->impl->batch_kv_reserve(rows), DLLM_OK, nullptr);
    std::vector<std::vector<float>> res;
    for (size_t k = 0; k < steps.size(); k++) {
        std::vector<dllm__batch_seq> plan;
        size_t n = 0;
        for (const std::pair<int, bool> &e : steps[k]) {
            plan.push_back(test_kv_step(canvases[k][(size_t)e.first], slot_of[(size_t)e.first], e.second, shift));
            n += (size_t)(plan.back().r1 - plan.back().r0) * V;
        }
        std::vector<float> out(n, NAN);
        CHECK_STATUS(ctx->impl->forward_batch_kv(plan, out.data()), DLLM_OK, nullptr);
        size_t at = 0;
        std::vector<std::vector<float>> mine(seqs.size());
        for (size_t i = 0; i < plan.size(); i++) {
            const size_t w = (size_t)(plan[i].r1 - plan[i].r0) * V;
            mine[(size_t)steps[k][i].first].assign(out.begin() + (long)at, out.begin() + (long)(at + w));
            at += w;
        }
        for (std::vector<float> &x : mine) res.push_back(x);
    }
    CHECK_STATUS(ctx->impl->batch_kv_reserve({}), DLLM_OK, nullptr);
    return res;
}

TEST(gpu_batch, kv_step_equals_each_sequence_alone_bit_for_bit) {
    NEED_GPU();
    test_gpu_cpu_on_tiny_fixtures(T_, [&](const char *fx, dllm_model *m, dllm_ctx *gpu, dllm_ctx *cpu) {
        const int V = m->cfg.n_vocab, shift = m->cfg.shift_logits ? 1 : 0;
        std::mt19937 rng(77);
        const int prompts[] = {5, 13, 1, 40}, gens[] = {16, 32, 16, 24};
        std::vector<test_kv_seq> seqs(4);
        for (size_t i = 0; i < seqs.size(); i++) {
            const int n = prompts[i] + gens[i];
            for (int p = 0; p < n; p++)
                seqs[i].ids.push_back(p >= prompts[i] && rng() % 2 ? m->cfg.mask_id : (int32_t)(rng() % (uint32_t)V));
            seqs[i].b0 = prompts[i], seqs[i].b1 = prompts[i] + 8, seqs[i].dual = i % 2 == 0;
        }
        // step 1: every sequence fills; step 2: 0 and 1 cached, 2 fills its next block, 3 has left
        std::vector<test_kv_seq> later = seqs;
        later[0].ids[(size_t)later[0].b0] = 7, later[1].ids[(size_t)later[1].b0 + 1] = 9;  // a step committed tokens
        later[2].b0 += 8, later[2].b1 += 8;
        const test_kv_steps steps = {{{0, true}, {1, true}, {2, true}, {3, true}}, {{0, false}, {1, false}, {2, true}}};
        const std::vector<std::vector<test_kv_seq>> canvases = {seqs, later};
        auto run_two = [&](dllm_ctx *ctx, const test_kv_steps &st, const std::vector<int> &slots) {
            return test_kv_run(T_, ctx, canvases, st, slots, V, shift);
        };
        const std::vector<std::vector<float>> all = run_two(gpu, steps, {0, 1, 2, 3});
        // the same steps, the sequences listed backwards and their slots in another order
        test_kv_steps backwards = steps;
        for (auto &st : backwards) std::reverse(st.begin(), st.end());
        CHECK_MSG(run_two(gpu, backwards, {2, 0, 3, 1}) == all, "%s: the batch's order or slots changed bits", fx);
        for (int i = 0; i < 4; i++) {  // each alone: a batch of one with one slot
            test_kv_steps one;
            for (const auto &st : steps) {
                one.emplace_back();
                for (const auto &e : st)
                    if (e.first == i) one.back().push_back(e);
                if (one.back().empty()) one.pop_back();
            }
            const std::vector<std::vector<float>> solo = run_two(gpu, one, {i, (i + 1) % 4, (i + 2) % 4, (i + 3) % 4});
            for (size_t k = 0; k < one.size(); k++) {
                const std::vector<float> &want = solo[k * 4 + (size_t)i], &got = all[k * 4 + (size_t)i];
                CHECK_MSG(!want.empty() && want.size() == got.size() &&
                              !memcmp(want.data(), got.data(), want.size() * 4),
                          "%s sequence %d step %zu: batched logits differ from its own", fx, i, k);
            }
        }
        const std::vector<std::vector<float>> ref = run_two(cpu, steps, {0, 1, 2, 3});
        double err = 0;
        for (size_t k = 0; k < all.size(); k++)
            if (!all[k].empty()) err = std::max(err, test_max_rel(all[k], ref[k]));
        printf("    %s: GPU vs CPU batched K/V-cache logits max relative error %.2e\n", fx, err);
        CHECK_MSG(err < 5e-2, "%s: GPU batched K/V-cache step error %.3e against the CPU's", fx, err);
    });
}

// ---- dllm_generate_batch on the GPU ----------------------------------------------------------------------

/* Random batches on the GPU: every item's tokens, canvases and step logits bit-identical to the item decoded as a batch
 * of one, in two orders; where the CPU decodes an item alone to the same tokens, the CPU's batch does too. */
static void test_batch_gpu_random(dllm_test_state &T_, const char *model_dir, bool dream, uint32_t seed,
                                  bool kv = false, dllm_precision precision = DLLM_PRECISION_BF16) {
    NEED_GPU();
    dllm_model *m = test_load(test_data(model_dir));
    dllm_ctx *gpu = nullptr, *cpu = nullptr;  // [FP8]: the GPU's FP8 against the CPU's FP8 twin
    if (m && precision == DLLM_PRECISION_BF16) gpu = test_ctx(m, DLLM_BACKEND_GPU), cpu = test_ctx(m, DLLM_BACKEND_CPU);
    else if (m)
        gpu = test_ctx_precision(m, DLLM_BACKEND_GPU, precision),
        cpu = test_ctx_precision(m, DLLM_BACKEND_CPU, precision);
    if (!gpu || !cpu) { CHECK(gpu && cpu); dllm_ctx_free(gpu); dllm_ctx_free(cpu); dllm_model_free(m); return; }
    dllm_model_info info;
    dllm_model_get_info(m, &info);
    std::mt19937 rng(seed);
    dllm__debug_step_logits = test_batch_logits_hook;
    int n_agree = 0, n_cases = 0;
    for (int round = 0; round < 3; round++) {
        std::vector<test_batch_case> cases((size_t)(2 + rng() % 4));
        std::vector<test_batch_case *> order;
        std::vector<std::vector<int32_t>> cpu_alone;
        for (test_batch_case &c : cases) {
            test_batch_make_case(rng, info, dream, c);
            if (kv) c.params.kv_cache = rng() % 2 ? DLLM_KV_CACHE_PREFIX : DLLM_KV_CACHE_DUAL;
            // alone on the GPU: a batch of one (the same forward as in any batch)
            std::vector<dllm_batch_result> one;
            dllm_status s = test_batch_run(gpu, {&c}, one, nullptr);
            CHECK_MSG(s == one[0].status, "%s: batch of one: %s, its item %s", model_dir, dllm_status_str(s),
                      dllm_status_str(one[0].status));
            const test_batch_trace gpu_trace = c.batch;
            const std::vector<int32_t> gpu_out = c.out_batch;
            test_batch_run_alone(cpu, c);  // alone on the CPU: dllm_generate
            cpu_alone.push_back(
                std::vector<int32_t>(c.out_alone.begin(), c.out_alone.begin() + std::max(0, c.n_alone)));
            c.alone = gpu_trace, c.out_alone = gpu_out, c.status_alone = one[0].status, c.n_alone = one[0].n_out,
            c.stats_alone = one[0].stats;
            order.push_back(&c);
        }
        std::vector<std::vector<int32_t>> gpu_batch(cases.size());
        for (int pass = 0; pass < 2; pass++) {
            if (pass) std::shuffle(order.begin(), order.end(), rng);
            std::vector<dllm_batch_result> results;
            dllm_gen_stats bs;
            test_batch_run(gpu, order, results, &bs);
            int max_steps = 0;
            for (size_t i = 0; i < order.size(); i++) {
                char what[96];
                snprintf(what, sizeof what, "GPU %s round %d pass %d item %zu of %zu", model_dir, round, pass, i,
                         order.size());
                test_batch_check_case(T_, *order[i], results[i], what);
                max_steps = std::max(max_steps, results[i].stats.steps);
                const size_t c = (size_t)(order[i] - cases.data());
                gpu_batch[c].assign(order[i]->out_batch.begin(),
                                    order[i]->out_batch.begin() + std::max(0, results[i].n_out));
            }
            CHECK_MSG(bs.forwards == max_steps, "GPU batch forwards %d, the items' largest step count %d", bs.forwards,
                      max_steps);
        }
        std::vector<dllm_batch_result> cpu_results;
        std::vector<test_batch_case *> in_order;
        for (test_batch_case &c : cases) in_order.push_back(&c);
        test_batch_run(cpu, in_order, cpu_results, nullptr);
        for (size_t c = 0; c < cases.size(); c++) {
            const test_batch_case &k = cases[c];
            const std::vector<int32_t> gpu_one(k.out_alone.begin(), k.out_alone.begin() + std::max(0, k.n_alone));
            n_cases++;
            if (gpu_one != cpu_alone[c]) continue;  // CPU and GPU differ alone (a near-tie): nothing to compare batched
            n_agree++;
            const std::vector<int32_t> cpu_batch(k.out_batch.begin(),
                                                 k.out_batch.begin() + std::max(0, cpu_results[c].n_out));
            CHECK_MSG(cpu_batch == gpu_batch[c], "%s round %d item %zu: CPU and GPU agree alone but not batched",
                      model_dir, round, c);
        }
    }
    printf("    %s: CPU and GPU agree alone on %d of %d items\n", model_dir, n_agree, n_cases);
    CHECK_MSG(n_agree >= 1, "%s: no item decoded alike on the CPU and the GPU: the comparison proved nothing",
              model_dir);
    dllm__debug_step_logits = nullptr;
    dllm_ctx_free(gpu);
    dllm_ctx_free(cpu);
    dllm_model_free(m);
}

TEST(gpu_batch, llada_items_equal_batch_of_one_and_cpu) { test_batch_gpu_random(T_, "tiny-llada", false, 126); }

TEST(gpu_batch, dream_items_equal_batch_of_one_and_cpu) { test_batch_gpu_random(T_, "tiny-dream", true, 2126); }

/* [dual cache] [prefix cache] The batched K/V-cache step: random
 * items with prefix and dual caches, mixed prompt and generation lengths, CFG, DPad and threshold rules (sequences
 * finishing at different steps), each bit-identical to its batch of one in two orders, and the CPU's tokens where the
 * CPU agrees alone. */
TEST(gpu_batch, kv_cache_items_equal_batch_of_one_and_cpu) {
    test_batch_gpu_random(T_, "tiny-llada", false, 326, true);
    test_batch_gpu_random(T_, "tiny-dream", true, 327, true);
}

/* One answer per prompt: dllm_generate on the GPU (a batch of one) gives an item the status, ids, step and forward
 * counts and the canvas after every step that dllm_generate_batch gives it among others, bit for bit: random items
 * (mixed lengths, CFG, DPad, threshold rules) without a K/V cache, or (kv) with prefix and dual caches, in two orders,
 * in the context's precision. */
static void test_generate_equals_batch(dllm_test_state &T_, const char *model_dir, bool dream, uint32_t seed, bool kv,
                                       dllm_precision precision = DLLM_PRECISION_BF16) {
    dllm_model *m = test_load(test_data(model_dir));
    dllm_ctx *gpu = m ? test_ctx_precision(m, DLLM_BACKEND_GPU, precision) : nullptr;
    if (!gpu) { CHECK(gpu); dllm_model_free(m); return; }
    dllm_model_info info;
    dllm_model_get_info(m, &info);
    std::mt19937 rng(seed);
    int compared = 0;
    const char *what = dllm__precision_name(precision);
    for (int round = 0; round < 3; round++) {
        std::vector<test_batch_case> cases((size_t)(2 + rng() % 4));
        std::vector<test_batch_case *> order;
        for (test_batch_case &c : cases) {
            test_batch_make_case(rng, info, dream, c);
            c.params.kv_cache = !kv ? DLLM_KV_CACHE_NONE : rng() % 2 ? DLLM_KV_CACHE_PREFIX : DLLM_KV_CACHE_DUAL;
            test_batch_run_alone(gpu, c);  // dllm_generate
            order.push_back(&c);
        }
        for (int pass = 0; pass < 2; pass++) {
            if (pass) std::shuffle(order.begin(), order.end(), rng);
            std::vector<dllm_batch_result> results;
            test_batch_run(gpu, order, results, nullptr);
            for (size_t i = 0; i < order.size(); i++) {
                const test_batch_case &c = *order[i];
                const dllm_batch_result &r = results[i];
                CHECK_MSG(r.status == c.status_alone && r.n_out == c.n_alone && c.out_batch == c.out_alone &&
                              r.stats.steps == c.stats_alone.steps && r.stats.forwards == c.stats_alone.forwards &&
                              c.batch.canvases == c.alone.canvases,
                          "%s %s round %d pass %d item %zu (cache %d): dllm_generate %s, %d ids, %d steps; the batch "
                          "%s, %d ids, %d steps%s",
                          model_dir, what, round, pass, i, (int)c.params.kv_cache, dllm_status_str(c.status_alone),
                          c.n_alone, c.stats_alone.steps, dllm_status_str(r.status), r.n_out, r.stats.steps,
                          c.out_batch == c.out_alone ? " (the ids agree, a canvas does not)" : "");
                compared += c.status_alone == DLLM_OK && !c.alone.canvases.empty();
            }
        }
    }
    printf("    %s %s%s: %d items compared with their batches\n", model_dir, what, kv ? ", K/V caches" : "", compared);
    CHECK_MSG(compared >= 6, "%s: only %d items decoded: the comparison proved little", model_dir, compared);
    dllm_ctx_free(gpu);
    dllm_model_free(m);
}

TEST(gpu_batch, generate_equals_batch_bit_for_bit) {
    NEED_GPU();
    test_generate_equals_batch(T_, "tiny-llada", false, 425, false);
    test_generate_equals_batch(T_, "tiny-dream", true, 428, false);
    test_generate_equals_batch(T_, "tiny-llada", false, 426, true);
    test_generate_equals_batch(T_, "tiny-dream", true, 427, true);
}

TEST(gpu_batch, quantised_generate_equals_batch_bit_for_bit) {
    NEED_GPU();
    for (dllm_precision p : {DLLM_PRECISION_FP8_ALL, DLLM_PRECISION_SOLOQ_I, DLLM_PRECISION_SOLOQ_N}) {
        test_generate_equals_batch(T_, "tiny-llada", false, 430 + (uint32_t)p, false, p);
        test_generate_equals_batch(T_, "tiny-llada", false, 440 + (uint32_t)p, true, p);
    }
}

/* [batch] DLLM_TILES=batch_gemm_n=128 and =64 (forced), and 0
 * (the default: the width follows the row count, every width loaded where gemm_wg runs): the batched forwards' BF16
 * GEMMs on gemm_wg's narrow tiles where N is a multiple of the width: tiny-llada's Q/K/V (384, which the 256-wide tiles
 * do not take), attention output and FFN down (128); its gate|up (400) and the LM head (fp32 out) stay on the pinned
 * GEMM, as does all of tiny-dream (192 wide) at 128. A sequence in a batch still has the logits and tokens of its batch
 * of one, bit for bit, in any order, and the CPU's values. Contexts are made inside the switch's scope. */
static void test_batch_gemm_width_case(dllm_test_state &T_, const char *width) {
    test_knob forced("batch_gemm_n", width);
    const int bn = atoi(width), want = bn ? bn : 256 + 128 + 64;
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *gpu = m ? test_ctx(m, DLLM_BACKEND_GPU) : nullptr, *cpu = m ? test_ctx(m, DLLM_BACKEND_CPU) : nullptr;
    CHECK(gpu && cpu);
    if (gpu && cpu) {
        const dllm__gpu_backend *g = (const dllm__gpu_backend *)gpu->impl.get();
        CHECK_MSG(!g->arch().gemm_wg_stages || (g->batch_gemm_widths() & want) == want,
                  "DLLM_TILES=batch_gemm_n=%s set, widths loaded %d, wanted %d", width, g->batch_gemm_widths(), want);
        printf("    DLLM_TILES=batch_gemm_n=%s: widths loaded %d (0: none on this GPU)\n", width,
               g->batch_gemm_widths());
        test_forward_batch_case(T_, m, gpu, cpu, "tiny-llada", 3);  // 408 rows: 4 m-tiles
    }
    dllm_ctx_free(gpu);
    dllm_ctx_free(cpu);
    dllm_model_free(m);
    test_batch_gpu_random(T_, "tiny-llada", false, 128);        // tokens and step logits: whole generations
    test_batch_gpu_random(T_, "tiny-llada", false, 328, true);  // the batched K/V-cache steps
}

TEST(gpu_batch, gemm_widths_batch_equal_each_sequence_alone) {
    NEED_GPU();
    for (const char *width : {"128", "64", "0"}) test_batch_gemm_width_case(T_, width);
}

/* With batch_fp8 off the batched forwards refuse FP8 contexts (on a GPU with an FP8 GEMM), naming the switch:
 * the items decode one after another, each exactly as dllm_generate decodes it, and the log says why. */
TEST(gpu_batch, fp8_items_decode_one_after_another) {
    NEED_GPU();
    test_knob off("batch_fp8", false);
    dllm_model *m = test_load(test_data("tiny-llada"));
    dllm_ctx *ctx = m ? test_ctx_precision(m, DLLM_BACKEND_GPU, DLLM_PRECISION_FP8_ALL) : nullptr;
    if (!ctx) { CHECK(ctx != nullptr); dllm_model_free(m); return; }
    dllm__gpu_backend *g = (dllm__gpu_backend *)ctx->impl.get();
    const bool fp8 = g->fp8_ffn_active();
    CHECK_MSG((g->batch_unsupported() != nullptr) == fp8 &&
                  (!fp8 || strstr(g->batch_unsupported(), "batch_fp8 is off")),
              "FP8 %s, batch_unsupported: %s", fp8 ? "active" : "off",
              g->batch_unsupported() ? g->batch_unsupported() : "(null)");
    const std::string why = ctx->impl->batch_caps().plain;
    CHECK_MSG(fp8 ? why.find("batch_fp8 is off") != std::string::npos : why.empty(), "batch_caps().plain: %s",
              why.c_str());
    CHECK_STATUS(ctx->impl->batch_kv_reserve({8}), fp8 ? DLLM_ERR_UNSUPPORTED : DLLM_OK,
                 fp8 ? "batch_fp8 is off" : nullptr);
    CHECK_STATUS(ctx->impl->batch_kv_reserve({}), DLLM_OK, nullptr);
    dllm_model_info info;
    dllm_model_get_info(m, &info);
    std::mt19937 rng(17);
    std::vector<test_batch_case> cases(3);
    std::vector<test_batch_case *> order;
    for (test_batch_case &c : cases) {
        test_batch_make_case(rng, info, false, c);
        test_batch_run_alone(ctx, c);
        order.push_back(&c);
    }
    std::string log;
    dllm_log_set(test_batch_log, &log, DLLM_LOG_INFO);
    std::vector<dllm_batch_result> results;
    test_batch_run(ctx, order, results, nullptr);
    dllm_log_set(nullptr, nullptr, DLLM_LOG_WARN);
    for (size_t i = 0; i < cases.size(); i++) {
        CHECK_MSG(results[i].status == cases[i].status_alone && results[i].n_out == cases[i].n_alone &&
                      cases[i].out_batch == cases[i].out_alone,
                  "item %zu: %s, %d ids (alone %s, %d)", i, dllm_status_str(results[i].status), results[i].n_out,
                  dllm_status_str(cases[i].status_alone), cases[i].n_alone);
        CHECK(cases[i].batch.canvases == cases[i].alone.canvases);
    }
    if (fp8)
        CHECK_MSG(strstr(log.c_str(), "3 items decode one after another") && strstr(log.c_str(), "(3 items in all") &&
                      strstr(log.c_str(), "under FP8"),
                  "log: %s", log.c_str());
    dllm_ctx_free(ctx);
    dllm_model_free(m);
}

/* dllm__fp8_row_chunks against a direct count: the launches cover the padded rows [0, M_pad) in order, each on a
 * 16-row boundary, a multiple of 16 rows and at most limit, all but the last exactly limit. */
TEST(batch, fp8_row_chunks_cover_the_padded_rows_on_16_row_boundaries) {
    for (int limit : {16, 48, 256})
        for (int M : {0, 1, 15, 16, 17, 47, 48, 49, 255, 256, 257, 511, 512, 513, 1000, 4099}) {
            const std::vector<dllm__row_chunk> chunks = dllm__fp8_row_chunks(M, limit);
            const int m_pad = (M + 15) / 16 * 16;
            int next = 0;
            bool ok = true;
            for (size_t i = 0; i < chunks.size(); i++) {
                const dllm__row_chunk &c = chunks[i];
                ok = ok && c.m0 == next && c.m0 % 16 == 0 && c.rows > 0 && c.rows % 16 == 0 && c.rows <= limit &&
                     (i + 1 == chunks.size() || c.rows == limit);
                next += c.rows;
            }
            CHECK_MSG(ok && next == m_pad && chunks.size() == (size_t)((m_pad + limit - 1) / limit),
                      "M=%d limit=%d: %zu launches ending at row %d (%s)", M, limit, chunks.size(), next,
                      ok ? "in order" : "out of order");
        }
}

/* [FP8] The GPU's FP8 GEMM kinds: the architecture's, and on sm_90 (whose table takes cuBLASLt's) fp8_gemm too
 * (DLLM_TILES=fp8_gemm=mma). Empty where the GPU has no FP8 GEMM. */
static std::vector<const char *> test_fp8_gemm_kinds() {
    test_gpu g;
    if (g.init() != DLLM_OK || g.arch.fp8 == DLLM__FP8_NONE) return {};
    if (g.arch.fp8 == DLLM__FP8_CUBLASLT_BLOCK) return {"", "mma"};
    return {""};
}

/* gemm_fp8_batch (DLLM__ROWS_BATCH) over 600 random rows against the solo path's pinned GEMM (INDEPENDENT, one
 * quantisation and one launch of the rows it is given, device-tested by gpu_fp8.lacache_*) over row ranges: the two
 * launches of 256 rows, the last 88 (padded to 96 either way), ranges across a launch boundary and one row alone.
 * Bit for bit: the same codes, scales and algorithm, so a wrong scale gather or code offset shows; every output
 * finite (poisoned first, so an unwritten row shows). Every FP8 linear of layer 1, each FP8 GEMM kind. */
TEST(gpu_batch, fp8_gemm_batch_equals_the_solo_pinned_gemm) {
    NEED_GPU();
    test_knob on("batch_fp8", true);
    const std::vector<const char *> kinds = test_fp8_gemm_kinds();
    if (kinds.empty()) SKIP("skipped (no FP8 GEMM on this GPU)");
    dllm_model *m = test_load(test_data("tiny-llada"));
    CHECK(m != nullptr);
    test_rng r("fp8 batched gemm");
    const int M = 600;
    const std::pair<int, int> ranges[] = {{0, 256}, {256, 512}, {512, 600}, {250, 287}, {500, 530}, {599, 600}};
    for (const char *kind : kinds) {
        if (*kind) test_knob_set("fp8_gemm", kind);
        dllm_ctx *ctx = m ? test_ctx_precision(m, DLLM_BACKEND_GPU, DLLM_PRECISION_FP8_ALL) : nullptr;
        if (*kind) test_knob_reset();
        dllm__gpu_backend *g = ctx ? (dllm__gpu_backend *)ctx->impl.get() : nullptr;
        CHECK_MSG(g && g->fp8_attn_active(), "no FP8 context: %s", dllm_last_error());
        if (g && g->fp8_attn_active()) {
            const dllm__gpu_layer &L = g->weights().layers[1];
            for (const dllm__linear *lin : {&L.qkv, &L.o, &L.gu, &L.down}) {
                const dllm__weight_view W = lin->view();
                CHECK(W.format == DLLM__W_E4M3_BLOCK);
                std::vector<float> xf((size_t)M * W.k);
                for (float &v : xf)
                    v = r.normal() * (r.below(50) ? 1.f : 30.f);  // a few outliers: groups of different scales
                dllm__dbuf x, y, y1;
                test_put(x, test_bf16_vec(xf));
                test_poison(y, (size_t)(M + 16) * W.n * 2);
                cudaDeviceSynchronize();  // the poison lands before the backend's stream writes
                CHECK_STATUS(g->gemm_rows(W, x.ptr, y.ptr, M, true), DLLM_OK, nullptr);
                const std::vector<uint16_t> all = test_get<uint16_t>(y, (size_t)M * W.n);
                bool finite = true;
                for (uint16_t b : all) finite = finite && std::isfinite(dllm__bf16_to_f32(b));
                CHECK_MSG(finite, "%s N=%d K=%d: a batched output row is not finite (unwritten?)",
                          *kind ? kind : "default", W.n, W.k);
                for (const std::pair<int, int> &rg : ranges) {
                    const int n = rg.second - rg.first;
                    test_poison(y1, (size_t)(n + 16) * W.n * 2);
                    cudaDeviceSynchronize();
                    CHECK_STATUS(g->gemm_rows(W, (const char *)x.ptr + (size_t)rg.first * W.k * 2, y1.ptr, n, false),
                                 DLLM_OK, nullptr);
                    const std::vector<uint16_t> solo = test_get<uint16_t>(y1, (size_t)n * W.n);
                    CHECK_MSG(!memcmp(solo.data(), all.data() + (size_t)rg.first * W.n, solo.size() * 2),
                              "%s N=%d K=%d rows [%d, %d): batched bits differ from the solo pinned GEMM's",
                              *kind ? kind : "default", W.n, W.k, rg.first, rg.second);
                }
            }
        }
        dllm_ctx_free(ctx);
    }
    dllm_model_free(m);
}

/* With batch_fp8 (the default), FP8 contexts (FFN and all, each FP8 GEMM) run the batched forward: three plans'
 * sequences of mixed lengths (408 rows, so cuBLASLt's pinned GEMM runs them in a launch of 256 rows and one of 160, the
 * last 8 padding, some sequence across the boundary in one order or the other), every sequence's logits bit-identical
 * to its own in a batch of one (one launch) and in the reversed batch. */
TEST(gpu_batch, fp8_forward_batch_equals_each_sequence_alone_bit_for_bit) {
    NEED_GPU();
    test_knob on("batch_fp8", true);
    const std::vector<const char *> kinds = test_fp8_gemm_kinds();
    if (kinds.empty()) SKIP("skipped (no FP8 GEMM on this GPU)");
    for (const char *fx : {"tiny-llada", "tiny-dream"}) {
        dllm_model *m = test_load(test_data(fx));
        CHECK(m != nullptr);
        for (const char *kind : kinds)
            for (dllm_precision precision : {DLLM_PRECISION_FP8_FFN, DLLM_PRECISION_FP8_ALL}) {
                if (*kind) test_knob_set("fp8_gemm", kind);
                dllm_ctx *gpu = m ? test_ctx_precision(m, DLLM_BACKEND_GPU, precision) : nullptr;
                if (*kind) test_knob_reset();
                dllm__gpu_backend *g = gpu ? (dllm__gpu_backend *)gpu->impl.get() : nullptr;
                char what[96];
                snprintf(what, sizeof what, "%s %s%s", fx, precision == DLLM_PRECISION_FP8_ALL ? "FP8 all" : "FP8 FFN",
                         *kind ? " (fp8_gemm)" : "");
                CHECK_MSG(g && g->fp8_ffn_active() && g->batch_unsupported() == nullptr, "%s: %s", what,
                          !g ? dllm_last_error() : g->batch_unsupported() ? g->batch_unsupported() : "FP8 not active");
                if (g && g->fp8_ffn_active() && !g->batch_unsupported())
                    test_forward_batch_case(T_, m, gpu, nullptr, what, 3);
                dllm_ctx_free(gpu);
            }
        dllm_model_free(m);
    }
}

/* With batch_fp8 (the default), FP8 items (LLaDA, FP8 all) batch in dllm_generate_batch, without and with the prefix
 * and dual K/V caches: each item's tokens, canvases and step logits bit-identical to its batch of one in two orders
 * (one forward per step, so they did batch), and the CPU's FP8 twin's tokens where it decodes the item alone alike. */
TEST(gpu_batch, fp8_items_equal_batch_of_one_and_cpu) {
    NEED_GPU();
    test_knob on("batch_fp8", true);
    if (test_fp8_gemm_kinds().empty()) SKIP("skipped (no FP8 GEMM on this GPU)");
    test_batch_gpu_random(T_, "tiny-llada", false, 426, false, DLLM_PRECISION_FP8_ALL);
    test_batch_gpu_random(T_, "tiny-llada", false, 427, true, DLLM_PRECISION_FP8_ALL);
}

// ---- [batch] the token choice of a batched step on the device ---------------------------------------------------

/* dllm__batch_sampler_spans against a direct count: over plans without and with a K/V cache, without and with Dream's
 * shift, and chunks of awkward sizes, every position [r0, r1) of every chosen sequence is sampled exactly once, from
 * the chunk row that holds its own logits row, into its own choice slot; the host's sequences get no sampler rows, and
 * no launch takes more than its chunk's rows and one more. */
TEST(batch, device_choice_spans_read_each_position_once) {
    std::mt19937 rng(2626);
    int n_shift0 = 0, n_split = 0;  // what the plans covered: position 0 under the shift, a sequence across chunks
    for (int shift = 0; shift < 2; shift++)
        for (int kv = 0; kv < 2; kv++) {
            dllm__config c;
            c.shift_logits = shift;
            test_batch_plan bp;
            test_kv_plan kp;
            dllm__varlen_layout v;
            if (kv) {
                test_kv_make_plan(kp);
                if (shift) kp.plan[0].q0 = 3, kp.plan[2].q0 = 7;  // dllm__step_rows's rows under the shift
                CHECK_STATUS(dllm__kv_layout_of(c, kp.plan, kp.base, kp.rows, 64, v), DLLM_OK, nullptr);
            } else {
                test_batch_make_plan(rng, 1000, 999, bp);
                CHECK_STATUS(dllm__varlen_layout_of(c, bp.plan, 256, v), DLLM_OK, nullptr);
            }
            const std::vector<dllm__batch_seq> &plan = kv ? kp.plan : bp.plan;
            std::vector<int> choice0(plan.size(), -1);
            int n_chosen = 0;
            for (size_t i = 0; i < plan.size(); i++)
                if (i != 1 && (i == 0 || rng() % 3)) choice0[i] = n_chosen, n_chosen += plan[i].r1 - plan[i].r0;
            for (int chunk : {1, 2, 3, 5, 256}) {
                std::vector<std::vector<int>> seen(plan.size());
                for (size_t i = 0; i < plan.size(); i++) seen[i].assign((size_t)plan[i].n, 0);
                for (int c0 = 0; c0 < v.out_rows; c0 += chunk) {
                    const int rows = std::min(chunk, v.out_rows - c0);
                    for (const dllm__sampler_span &sp : dllm__batch_sampler_spans(c, plan, v, choice0, c0, rows)) {
                        const size_t i = (size_t)sp.seq;
                        CHECK_MSG(i < plan.size() && choice0[i] >= 0 && sp.n >= 1 && sp.n <= rows + 1,
                                  "shift %d kv %d chunk %d: span of sequence %zu, %d rows", shift, kv, chunk, i, sp.n);
                        if (i >= plan.size() || choice0[i] < 0) return;
                        n_shift0 += sp.shift0, n_split += sp.n < plan[i].r1 - plan[i].r0;
                        for (int r = 0; r < sp.n; r++) {
                            const int p = sp.pos0 + r, lr = (sp.shift0 ? std::max(r - 1, 0) : r) + sp.lrow0;
                            const int want = v.out0[i] + dllm__logit_row(c, p) - v.raw0[i] - c0;
                            CHECK_MSG(
                                p >= plan[i].r0 && p < plan[i].r1 && lr == want && lr >= 0 && lr < rows &&
                                    sp.out + r == choice0[i] + p - plan[i].r0,
                                "shift %d kv %d chunk %d sequence %zu position %d: logits row %d (want %d of %d), out "
                                "%d",
                                shift, kv, chunk, i, p, lr, want, rows, sp.out + r);
                            if (p >= plan[i].r0 && p < plan[i].r1) seen[i][(size_t)p]++;
                        }
                    }
                }
                for (size_t i = 0; i < plan.size(); i++)
                    for (int p = 0; p < plan[i].n; p++) {
                        const int want = choice0[i] >= 0 && p >= plan[i].r0 && p < plan[i].r1;
                        CHECK_MSG(seen[i][(size_t)p] == want,
                                  "shift %d kv %d chunk %d: sequence %zu position %d sampled %d times, want %d", shift,
                                  kv, chunk, i, p, seen[i][(size_t)p], want);
                    }
            }
        }
    CHECK_MSG(n_shift0 > 0 && n_split > 0,
              "the plans never sampled position 0 under the shift (%d) or split a sequence across chunks (%d)",
              n_shift0, n_split);
}

/* A CPU backend that chooses a batched step's tokens itself
 * (forward_batch_choose: its batched forward, then dllm__choose of each chosen row: the contract's twin), so that
 * dllm__batch_step's device-choice path runs here. */
class test_choosing_cpu : public dllm__cpu_backend {
  public:
    using dllm__cpu_backend::dllm__cpu_backend;
    int V = 0;
    int64_t rows_chosen = 0, rows_logits = 0;
    bool batch_chooses() const override { return true; }
    dllm_status forward_batch_choose(const std::vector<dllm__batch_seq> &plan, bool kv, float *logits,
                                     dllm__choice *choices) override {
        size_t rows = 0;
        for (const dllm__batch_seq &s : plan) rows += (size_t)(s.r1 - s.r0);
        std::vector<float> all(rows * V, NAN);
        DLLM__TRY(kv ? forward_batch_kv(plan, all.data()) : forward_batch(plan, all.data()));
        const float *l = all.data();
        for (const dllm__batch_seq &s : plan)
            for (int p = s.r0; p < s.r1; p++, l += V) {
                if (s.sampling)
                    *choices++ = dllm__choose(l, V, *s.sampling, (uint32_t)p, (uint32_t)s.step), rows_chosen++;
                else logits = std::copy(l, l + V, logits), rows_logits++;
            }
        return DLLM_OK;
    }
};

/* A case's batch result against the reference run kept in its `alone`: status, ids, step and forward counts, the
 * canvas after every step (the logits are not there to compare where the choice is made on the device). */
static void test_batch_check_tokens(dllm_test_state &T_, const test_batch_case &c, const dllm_batch_result &r,
                                    const char *what) {
    CHECK_MSG(r.status == c.status_alone, "%s: status %s, the reference's %s (%s)", what, dllm_status_str(r.status),
              dllm_status_str(c.status_alone), r.error);
    CHECK_MSG(r.n_out == c.n_alone && c.out_batch == c.out_alone, "%s: %d ids, the reference's %d, or other ids", what,
              r.n_out, c.n_alone);
    CHECK_MSG(r.stats.steps == c.stats_alone.steps && r.stats.forwards == c.stats_alone.forwards,
              "%s: steps %d/%d, forwards %d/%d", what, r.stats.steps, c.stats_alone.steps, r.stats.forwards,
              c.stats_alone.forwards);
    CHECK_MSG(c.batch.canvases == c.alone.canvases, "%s: the canvases after each step differ", what);
    CHECK_MSG(c.status_alone != DLLM_OK || !c.alone.canvases.empty(),
              "%s: no step recorded: the test would prove nothing", what);
}

/* Items of random parameters and caches (none, prefix, dual), one in three with CFG, in batches on the CPU through the
 * backend-choice path of dllm__batch_step (test_choosing_cpu): every item's ids and canvases those of the host-choice
 * batch, in two orders, CFG's members (their logits) mixed with chosen ones in one forward. */
TEST(batch, backend_choice_equals_host_choice) {
    for (int dream = 0; dream < 2; dream++) {
        dllm_model *m = test_load(test_data(dream ? "tiny-dream" : "tiny-llada"));
        dllm_ctx *host = m ? test_ctx(m) : nullptr, *chooser = m ? test_ctx(m) : nullptr;
        if (!host || !chooser) {
            CHECK(host && chooser);
            dllm_ctx_free(host);
            dllm_ctx_free(chooser);
            dllm_model_free(m);
            return;
        }
        test_choosing_cpu *b =
            new test_choosing_cpu(*m, 2, chooser->max_tokens, DLLM_PRECISION_BF16, dllm__soloq_options());
        b->V = m->cfg.n_vocab;
        chooser->impl.reset(b);
        dllm_model_info info;
        dllm_model_get_info(m, &info);
        std::mt19937 rng(dream ? 4126 : 4026);
        int n_cfg = 0;
        for (int round = 0; round < 3; round++) {
            std::vector<test_batch_case> cases((size_t)(3 + rng() % 3));
            std::vector<test_batch_case *> order;
            for (size_t i = 0; i < cases.size(); i++) {
                test_batch_case &c = cases[i];
                test_batch_make_case(rng, info, dream, c);
                c.params.kv_cache = (dllm_kv_cache)(i % 3);
                n_cfg += c.params.cfg_scale > 0;
                order.push_back(&c);
            }
            std::vector<dllm_batch_result> results;
            test_batch_run(host, order, results, nullptr);  // the reference: the host's choice
            for (size_t i = 0; i < cases.size(); i++) {
                test_batch_case &c = cases[i];
                c.alone = c.batch, c.out_alone = c.out_batch, c.status_alone = results[i].status,
                c.n_alone = results[i].n_out, c.stats_alone = results[i].stats;
            }
            for (int pass = 0; pass < 2; pass++) {
                if (pass) std::shuffle(order.begin(), order.end(), rng);
                test_batch_run(chooser, order, results, nullptr);
                for (size_t i = 0; i < order.size(); i++) {
                    char what[96];
                    snprintf(what, sizeof what, "%s round %d pass %d item %zu of %zu", dream ? "dream" : "llada", round,
                             pass, i, order.size());
                    test_batch_check_tokens(T_, *order[i], results[i], what);
                }
            }
        }
        CHECK_MSG(b->rows_chosen > 0 && b->rows_logits > 0 && n_cfg > 0,
                  "rows chosen by the backend %lld, with logits %lld (CFG items %d)", (long long)b->rows_chosen,
                  (long long)b->rows_logits, n_cfg);
        dllm_ctx_free(host);
        dllm_ctx_free(chooser);
        dllm_model_free(m);
    }
}

/* The GPU's device choice: batches of items with mixed lengths,
 * parameters and modes (plain, prefix and dual caches; temperature 0 and > 0; low-confidence and random remasking;
 * threshold rules; Dream's samplers on Dream; a CFG item, chosen on the host, among them), and a batch of 12 long
 * items whose logit rows span two LM-head chunks: every item's ids, canvases and counts those it gets as a batch of one
 * with the host's choice, as a batch of one with the device's, in the batch with the device's (two orders), and in the
 * batch with the host's. */
TEST(gpu_batch, device_choice_equals_host_choice_and_alone) {
    NEED_GPU();
    for (int dream = 0; dream < 2; dream++) {
        dllm_model *m = test_load(test_data(dream ? "tiny-dream" : "tiny-llada"));
        dllm_ctx *gpu = m ? test_ctx(m, DLLM_BACKEND_GPU) : nullptr;
        if (!gpu) { CHECK(gpu != nullptr); dllm_model_free(m); return; }
        dllm__gpu_backend *g = (dllm__gpu_backend *)gpu->impl.get();
        CHECK(g->batch_chooses());
        dllm_model_info info;
        dllm_model_get_info(m, &info);
        std::mt19937 rng(dream ? 5126 : 5026);
        for (int round = 0; round < 3; round++) {
            const bool long_items = round == 2;
            std::vector<test_batch_case> cases(long_items ? 12 : 6);
            std::vector<test_batch_case *> order;
            for (size_t i = 0; i < cases.size(); i++) {
                test_batch_case &c = cases[i];
                test_batch_make_case(rng, info, dream, c);
                dllm_gen_params &p = c.params;
                p.kv_cache = (dllm_kv_cache)(i % 3);
                p.temperature = (i / 3) % 2 ? 0.8f : 0.0f;
                if (!dream) p.remasking = i % 2 ? DLLM_REMASK_RANDOM : DLLM_REMASK_LOW_CONFIDENCE;
                if (i % 4 == 1)
                    p.unmask = DLLM_UNMASK_THRESHOLD, p.threshold = p.remasking == DLLM_REMASK_ENTROPY ? -1.5 : 0.35;
                p.cfg_scale = i == 5 ? 0.5f : 0.0f;
                if (long_items)
                    p.gen_length = p.block_length = 24 + 8 * (int)(i % 4), p.steps = p.gen_length / 2,
                    c.out_capacity = p.gen_length;
                order.push_back(&c);
            }
            // the reference: each a batch of one, chosen on the host (the logits hook keeps every step's choice there)
            dllm__debug_step_logits = test_batch_logits_hook;
            for (test_batch_case &c : cases) {
                std::vector<dllm_batch_result> one;
                test_batch_run(gpu, {&c}, one, nullptr);
                c.alone = c.batch, c.out_alone = c.out_batch, c.status_alone = one[0].status, c.n_alone = one[0].n_out,
                c.stats_alone = one[0].stats;
            }
            std::vector<dllm_batch_result> results;
            test_batch_run(gpu, order, results, nullptr);
            for (size_t i = 0; i < order.size(); i++) {
                char what[112];
                snprintf(what, sizeof what, "%s round %d host-choice batch item %zu of %zu", dream ? "dream" : "llada",
                         round, i, order.size());
                test_batch_check_tokens(T_, *order[i], results[i], what);
            }
            dllm__debug_step_logits = nullptr;
            const int64_t chosen0 = g->batch_rows_chosen();
            for (test_batch_case &c : cases) {
                std::vector<dllm_batch_result> one;
                test_batch_run(gpu, {&c}, one, nullptr);
                char what[112];
                snprintf(what, sizeof what, "%s round %d device-choice batch of one, item %zu",
                         dream ? "dream" : "llada", round, (size_t)(&c - cases.data()));
                test_batch_check_tokens(T_, c, one[0], what);
            }
            for (int pass = 0; pass < 2; pass++) {
                if (pass) std::shuffle(order.begin(), order.end(), rng);
                test_batch_run(gpu, order, results, nullptr);
                for (size_t i = 0; i < order.size(); i++) {
                    char what[112];
                    snprintf(what, sizeof what, "%s round %d device-choice batch pass %d item %zu of %zu",
                             dream ? "dream" : "llada", round, pass, i, order.size());
                    test_batch_check_tokens(T_, *order[i], results[i], what);
                }
            }
            CHECK_MSG(g->batch_rows_chosen() > chosen0, "%s round %d: no row was chosen on the device",
                      dream ? "dream" : "llada", round);
        }
        dllm_ctx_free(gpu);
        dllm_model_free(m);
    }
}

/* [batch graphs] Batches of plain, prefix-cache and dual-cache items (counted and threshold rules, so the layout
 * changes as items finish) with batch_graphs on (the default) against the same batches eagerly (=0): every item's ids,
 * canvases, counts and step logits bit for bit, twice over
 * (the second run replays the first run's graphs where a layout repeats), with graphs captured and replayed and no
 * update refused. */
TEST(gpu_batch, graphs_replay_the_eager_forwards_bit_for_bit) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-llada"));
    if (!m) { CHECK(m != nullptr); return; }
    dllm_model_info info;
    dllm_model_get_info(m, &info);
    std::mt19937 rng(7026);
    std::vector<test_batch_case> cases(6);
    std::vector<test_batch_case *> order;
    for (size_t i = 0; i < cases.size(); i++) {
        test_batch_make_case(rng, info, false, cases[i]);
        dllm_gen_params &p = cases[i].params;
        p.kv_cache = (dllm_kv_cache)(i % 3), p.cfg_scale = 0.0f;
        if (i % 2) p.unmask = DLLM_UNMASK_THRESHOLD, p.threshold = 0.35;
        order.push_back(&cases[i]);
    }
    dllm__debug_step_logits = test_batch_logits_hook;
    {  // the reference: the batch eagerly
        test_knob off("batch_graphs", false);
        dllm_ctx *eager = test_ctx(m, DLLM_BACKEND_GPU);
        std::vector<dllm_batch_result> results;
        CHECK(eager && test_batch_run(eager, order, results, nullptr) == DLLM_OK);
        for (size_t i = 0; eager && i < cases.size(); i++) {
            test_batch_case &c = cases[i];
            c.alone = c.batch, c.out_alone = c.out_batch, c.status_alone = results[i].status,
            c.n_alone = results[i].n_out, c.stats_alone = results[i].stats;
        }
        dllm_ctx_free(eager);
    }
    test_knob on("batch_graphs", true);
    dllm_ctx *gpu = test_ctx(m, DLLM_BACKEND_GPU);
    dllm__gpu_backend *g = gpu ? (dllm__gpu_backend *)gpu->impl.get() : nullptr;
    for (int pass = 0; g && pass < 2; pass++) {
        std::vector<dllm_batch_result> results;
        CHECK(test_batch_run(gpu, order, results, nullptr) == DLLM_OK);
        for (size_t i = 0; i < cases.size(); i++) {
            char what[80];
            snprintf(what, sizeof what, "graphs pass %d item %zu (kv_cache %d)", pass, i,
                     (int)cases[i].params.kv_cache);
            test_batch_check_case(T_, cases[i], results[i], what);
        }
    }
    if (g) {
        const int64_t eager = g->varlen_graph_count(DLLM__GRAPH_EAGER),
                      replay = g->varlen_graph_count(DLLM__GRAPH_REPLAY);
        const int64_t made = g->varlen_graph_count(DLLM__GRAPH_INSTANTIATE) + g->varlen_graph_count(DLLM__GRAPH_UPDATE);
        printf("    batched forwards: %lld eager, %lld captured, %lld replayed, %lld updates refused\n",
               (long long)eager, (long long)made, (long long)replay, (long long)g->varlen_graph_refusals());
        CHECK_MSG(made > 0 && replay > 0, "graphs captured %lld, replayed %lld: the comparison proved nothing",
                  (long long)made, (long long)replay);
        CHECK_MSG(g->varlen_graph_refusals() == 0, "%lld graph updates refused", (long long)g->varlen_graph_refusals());
    }
    CHECK(gpu != nullptr);
    dllm__debug_step_logits = nullptr;
    dllm_ctx_free(gpu);
    dllm_model_free(m);
}

// ---- the command line ---------------------------------------------------------------------------------------

/* dllm-eval --add --batch N decodes the problems N at a time and scores them as one at a time does (the CPU's batch
 * gives each item dllm_generate's tokens); a leftover partial batch is decoded too. */
TEST(cli, eval_add_batched_scores_as_one_at_a_time) {
    if (!test_cli_built()) SKIP("the CLI programs are not built");
    std::string one, batched, err, err2;
    const std::string args = "-m models/tiny-add --backend cpu --add tests/data/add_test.txt --limit 7";
    CHECK(test_run_cli("dllm-eval", args, "", one, err) == 0);
    CHECK(test_run_cli("dllm-eval", args + " --batch 3", "", batched, err2) == 0);
    CHECK_MSG(one == batched && one.find("add_problems 7\n") != std::string::npos && err.empty() && err2.empty(),
              "one at a time:\n%s\nbatched:\n%s%s", one.c_str(), batched.c_str(), err2.c_str());
    CHECK(test_run_cli("dllm-eval", args + " --batch 0", "", batched, err2) == 1 &&
          err2.find("--batch") != std::string::npos);
}
