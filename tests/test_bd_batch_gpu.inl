/* Tests: the GPU backend's batched block-diffusion forward (dllm__gpu_backend::bd_batch_reserve / bd_forward_batch,
 * issue 26; on by default since the H100 run of 2026-12-05, bd_batch off turns it off): its layout, the slots'
 * states and the sampler spans on the CPU against hand-derived expectations; on the GPU a mixed batch against each
 * sequence as a batch of one (bit for bit) and against the CPU backend's bd_forward (bf16 tolerance), the device's
 * choices against dllm__choose. */

// ---- the layout, the slots' states and the sampler spans (CPU)
// -------------------------------------------------------

/* Three sequences over slots out of order and of awkward sizes: a sub-block over a block cache
 * (slot 2, 7 committed rows, a 5-row block cache), a masked prefill COMMIT (slot 0, empty), a masked STEP past 13
 * committed rows (slot 1). */
struct test_bdb_layout {
    std::vector<int32_t> a = {11, 12, 13}, b, cv = {31, 32, 33, 34, 35};
    std::vector<int> base = {0, 37, 100}, rows = {37, 63, 29};
    std::vector<dllm__bd_slot> slots = std::vector<dllm__bd_slot>(3);
    dllm__bd_pick pa, pc;
    std::vector<dllm__bd_seq> seqs = std::vector<dllm__bd_seq>(3);
    test_bdb_layout() {
        for (int i = 0; i < 11; i++) b.push_back(20 + i);
        slots[1].n = 13, slots[2].n = 7, slots[2].block = 5;
        pa.pos0 = 50, pa.n = 3, pa.shift0 = 1, pa.lrow0 = 0;
        pc.pos0 = 70, pc.n = 4, pc.shift0 = 0, pc.lrow0 = 0;
        dllm__bd_call &a = seqs[0].call, &p = seqs[1].call, &c = seqs[2].call;
        seqs[0].slot = 2, seqs[0].pick = &pa;
        a.kind = DLLM__BD_SUB_BLOCK, a.ids = this->a.data(), a.T = 3, a.offset = 2, a.r0 = 0, a.r1 = 3;
        seqs[1].slot = 0;
        p.kind = DLLM__BD_COMMIT, p.ids = b.data(), p.T = 11, p.mask_block = 4, p.r0 = 10, p.r1 = 11;
        seqs[2].slot = 1, seqs[2].pick = &pc;
        c.kind = DLLM__BD_STEP, c.ids = cv.data(), c.T = 5, c.mask_block = 3, c.r0 = 1, c.r1 = 5;
    }
};

TEST(bd_batch, layout_places_rows_positions_and_masks) {
    test_bdb_layout k;
    dllm__varlen_layout v;
    v.rows = -1;  // poisoned: the layout starts afresh
    CHECK_STATUS(dllm__bd_batch_layout_of(k.seqs, k.base, k.rows, k.slots, 64, v), DLLM_OK, nullptr);
    std::vector<int32_t> ids = {11, 12, 13};
    for (int i = 0; i < 11; i++) ids.push_back(20 + i);
    for (int i = 0; i < 5; i++) ids.push_back(31 + i);
    // positions n + offset + j; slot rows base + n (+ offset under SUB_BLOCK) + j
    const std::vector<int32_t> pos = {9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 14, 15, 16, 17};
    const std::vector<int32_t> cache = {109, 110, 111, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 50, 51, 52, 53, 54};
    CHECK(v.rows == 19 && v.ids == ids && v.positions == pos && v.cache_rows == cache);
    CHECK((v.offsets == std::vector<int32_t>{0, 3, 14, 19}) && (v.q0 == std::vector<int>{0, 0, 0}));
    // keys: the sub-block over n + block = 12 rows, the prefill over its 11, the step over 13 + 5; bridges without a
    // query
    CHECK((v.attn_q_offsets == std::vector<int32_t>{0, 3, 3, 14, 14, 19}));
    CHECK((v.attn_kv_offsets == std::vector<int32_t>{100, 112, 0, 11, 37, 55}));
    CHECK((v.attn_masks == std::vector<int32_t>{0, 9, 0, 0, 4, 0, 0, 0, 3, 13}));
    CHECK((v.raw0 == std::vector<int>{0, 10, 1}) && (v.raw1 == std::vector<int>{3, 11, 5}) &&
          (v.out0 == std::vector<int>{0, 3, 4}));
    CHECK(v.out_rows == 8 && v.max_rows == 11 && v.cached());
    // One sequence alone lays out as it does among the others.
    dllm__varlen_layout one;
    CHECK_STATUS(dllm__bd_batch_layout_of({k.seqs[2]}, k.base, k.rows, k.slots, 64, one), DLLM_OK, nullptr);
    CHECK((one.positions == std::vector<int32_t>(pos.begin() + 14, pos.end())) &&
          (one.cache_rows == std::vector<int32_t>(cache.begin() + 14, cache.end())));
    CHECK((one.attn_kv_offsets == std::vector<int32_t>{37, 55}) && (one.attn_masks == std::vector<int32_t>{3, 13}) &&
          one.out0[0] == 0);
}

TEST(bd_batch, layout_rejects_what_does_not_fit) {
    test_bdb_layout k;
    dllm__varlen_layout v;
    CHECK_STATUS(dllm__bd_batch_layout_of(k.seqs, k.base, k.rows, k.slots, 18, v), DLLM_OK,
                 nullptr);  // positions 0..17
    CHECK_STATUS(dllm__bd_batch_layout_of(k.seqs, k.base, k.rows, k.slots, 17, v), DLLM_ERR_INVALID_ARGUMENT,
                 "positions up to 18 exceed the context's limit of 17");
    std::vector<dllm__bd_seq> bad = k.seqs;
    bad[1].slot = 2;
    CHECK_STATUS(dllm__bd_batch_layout_of(bad, k.base, k.rows, k.slots, 64, v), DLLM_ERR_INTERNAL, "names slot 2");
    bad = k.seqs, bad[1].slot = 3;
    CHECK_STATUS(dllm__bd_batch_layout_of(bad, k.base, k.rows, k.slots, 64, v), DLLM_ERR_INTERNAL, "3 reserved");
    bad = k.seqs, bad[0].call.offset = 3;  // 3 + 3 rows past the 5-row block cache
    CHECK_STATUS(dllm__bd_batch_layout_of(bad, k.base, k.rows, k.slots, 64, v), DLLM_ERR_INTERNAL,
                 "outside its block cache (5 rows)");
    bad = k.seqs, bad[0].slot = 0, bad[1].slot = 2;  // a sub-block on a slot with no block cache
    CHECK_STATUS(dllm__bd_batch_layout_of(bad, k.base, k.rows, k.slots, 64, v), DLLM_ERR_INTERNAL,
                 "outside its block cache (0 rows)");
    std::vector<int32_t> long_ids(23, 1);
    bad = k.seqs, bad[0].call.kind = DLLM__BD_STEP, bad[0].call.ids = long_ids.data(), bad[0].call.T = 23,
    bad[0].call.offset = 0;  // 7 + 23 > 29
    CHECK_STATUS(dllm__bd_batch_layout_of(bad, k.base, k.rows, k.slots, 64, v), DLLM_ERR_INTERNAL,
                 "overflow slot 2 (29 rows");
    bad = k.seqs, bad[2].call.r1 = 6;
    CHECK_STATUS(dllm__bd_batch_layout_of(bad, k.base, k.rows, k.slots, 64, v), DLLM_ERR_INTERNAL,
                 "output rows [1, 6)");
    dllm__bd_pick wide = k.pc;
    wide.n = 5;  // logits rows 0..4 of the step's 4
    bad = k.seqs, bad[2].pick = &wide;
    CHECK_STATUS(dllm__bd_batch_layout_of(bad, k.base, k.rows, k.slots, 64, v), DLLM_ERR_INTERNAL,
                 "chooses 5 rows from logits rows 0.. of its 4");
}

/* The slots' states along one block of the schedule with the block cache: prefill, block refresh, sub-blocks,
 * commit. */
TEST(bd_batch, slot_states_follow_the_schedule) {
    dllm__bd_slot s;
    dllm__bd_call call;
    call.kind = DLLM__BD_COMMIT, call.T = 24;
    dllm__bd_slot_advance(call, s);
    CHECK(s.n == 24 && s.block == 0);
    call.kind = DLLM__BD_BLOCK_FULL, call.T = 16;
    dllm__bd_slot_advance(call, s);
    CHECK(s.n == 24 && s.block == 16);
    call.kind = DLLM__BD_SUB_BLOCK, call.T = 4, call.offset = 12;
    dllm__bd_slot_advance(call, s);
    CHECK(s.n == 24 && s.block == 16);
    call.kind = DLLM__BD_STEP, call.T = 16, call.offset = 0;  // writes over the block cache's rows
    dllm__bd_slot_advance(call, s);
    CHECK(s.n == 24 && s.block == 0);
    call.kind = DLLM__BD_BLOCK_FULL;
    dllm__bd_slot_advance(call, s);
    call.kind = DLLM__BD_COMMIT;
    dllm__bd_slot_advance(call, s);
    CHECK(s.n == 40 && s.block == 0);
}

/* The sampler spans of every chunking of the layout's 8 logit rows: each pick row chosen once, into its own choice, at
 * its own position, reading (as the sampler does: (shift0 ? max(r - 1, 0) : r) + lrow0 of the chunk) its own logits
 * row; plus the hand-derived spans of a few chunks. */
TEST(bd_batch, sampler_spans_choose_each_pick_row_once) {
    test_bdb_layout k;
    dllm__varlen_layout v;
    CHECK_STATUS(dllm__bd_batch_layout_of(k.seqs, k.base, k.rows, k.slots, 64, v), DLLM_OK, nullptr);
    const std::vector<int> choice0 = {0, -1, 3};
    auto same = [](const dllm__sampler_span &s, int seq, int pos0, int n, int lrow0, int shift0, int out) {
        return s.seq == seq && s.pos0 == pos0 && s.n == n && s.lrow0 == lrow0 && s.shift0 == shift0 && s.out == out;
    };
    std::vector<dllm__sampler_span> sp = dllm__bd_sampler_spans(k.seqs, v, choice0, 0, 8);
    CHECK(sp.size() == 2 && same(sp[0], 0, 50, 3, 0, 1, 0) && same(sp[1], 2, 70, 4, 4, 0, 3));
    sp = dllm__bd_sampler_spans(k.seqs, v, choice0, 0, 1);  // the shifted pick's rows 0 and 1 both read row 0
    CHECK(sp.size() == 1 && same(sp[0], 0, 50, 2, 0, 1, 0));
    sp = dllm__bd_sampler_spans(k.seqs, v, choice0, 1, 1);
    CHECK(sp.size() == 1 && same(sp[0], 0, 52, 1, 0, 0, 2));
    sp = dllm__bd_sampler_spans(k.seqs, v, choice0, 5, 2);
    CHECK(sp.size() == 1 && same(sp[0], 2, 71, 2, 0, 0, 4));
    for (int chunk = 1; chunk <= 8; chunk++) {
        std::vector<int> seen(7, 0);
        bool right = true;
        for (int c0 = 0; c0 < v.out_rows; c0 += chunk) {
            const int rows = std::min(chunk, v.out_rows - c0);
            for (const dllm__sampler_span &s : dllm__bd_sampler_spans(k.seqs, v, choice0, c0, rows))
                for (int r = 0; r < s.n; r++) {
                    const dllm__bd_pick &p = *k.seqs[(size_t)s.seq].pick;
                    const int j = s.out + r - choice0[(size_t)s.seq],
                              read = (s.shift0 ? std::max(r - 1, 0) : r) + s.lrow0;
                    seen[(size_t)(s.out + r)]++;
                    right &= read >= 0 && read < rows && c0 + read == v.out0[(size_t)s.seq] + p.logits_row(j) &&
                             s.pos0 + r == p.pos0 + j;
                }
        }
        CHECK_MSG(right && seen == std::vector<int>(7, 1), "chunks of %d rows", chunk);
    }
}

// ---- on the GPU
// ------------------------------------------------------------------------------------------------------

/* The varlen flash_attn with per-sequence masks (attn_args' varlen_masks) compiles at the test models' head dims (24:
 * the tiny Nemotron's, 64) on sm_90 and sm_80 with neither spills nor a stack frame. */
TEST(jit, bd_batch_varlen_attention_compiles_for_sm90_and_sm80) {
    for (int cc : {90, 80})
        for (int hd : {24, 64}) {
            const dllm__arch a = dllm__attn_tiles(dllm__arch_for(cc), hd);
            const dllm__jit_request rq = dllm__module_attention_varlen(a, hd);
            std::vector<char> cubin;
            std::vector<std::string> lowered;
            test_compile_clean(T_, rq, a.target, true, cubin, lowered);
            CHECK(lowered.size() == 3 && cubin.size() > 1000);  // the table's tiles, the split combine, the short runs
        }
}

/* One sequence of the masked varlen attention's test: n_keys K|V rows of a slot at `base`, its T queries at sequence
 * indices q_index0 + i, block-causal at mask_block. */
struct test_bdb_attn_seq {
    int base, n_keys, T, q_index0, mask_block;
};

/* Slots of K|V rows (kv_stride 2 KV hd) laid out out of order, fused query rows concatenated, a bridge between
 * sequences: each sequence's output bit-identical to the plain flash_attn over its slot alone (batch 1, no split, the
 * same mask) and within bf16 tolerance of dllm__cpu_attention (the twin of the mask: n_visible); the short runs' tiles
 * (dllm__attn_short_tiles, which visit fewer masked key tiles per query tile) give the same bits. */
TEST(gpu_bd_batch, masked_varlen_attention_equals_each_sequence_alone) {
    NEED_GPU();
    test_gpu g;
    CHECK_STATUS(g.init(), DLLM_OK, nullptr);
    test_rng r("masked varlen attention");
    dllm__pool pool(1);
    // a step after 45 committed rows, a one-row forward, a token-causal prefill, a granularity that divides nothing, a
    // sub-block's unmasked rows over cache ++ block cache
    const std::vector<test_bdb_attn_seq> seqs = {
        {230, 77, 32, 45, 32}, {0, 9, 1, 8, 8}, {320, 200, 200, 0, 1}, {10, 167, 37, 130, 12}, {520, 340, 8, 316, 0}};
    const int total_keys = 860;
    for (int hd : {24, 64}) {
        const dllm__arch a = dllm__attn_tiles(g.arch, hd);
        test_gpu ga = g;
        ga.arch = a;
        const int H = 6, KV = 2, qkv = (H + 2 * KV) * hd, kvd = KV * hd;
        std::shared_ptr<dllm__module> mod;
        dllm__kernel<void(attn_args)> k, k_short;
        if (!test_load_varlen(T_, a, hd, mod, k, k_short)) return;
        const dllm__arch short_tiles = dllm__attn_short_tiles(a);  // the batched steps' tiles where every run is short
        const dllm__attn_kernels plain = test_attn_kernels(T_, ga, hd);
        std::vector<float> kvf((size_t)total_keys * 2 * kvd);
        for (float &v : kvf) v = r.normal();
        const std::vector<uint16_t> kvb = test_bf16_vec(kvf);
        std::vector<int32_t> q_off, kv_off, masks;
        int rows = 0, max_rows = 0;
        for (size_t i = 0; i < seqs.size(); i++) {
            if (i > 0) masks.push_back(0), masks.push_back(0);
            q_off.push_back(rows), kv_off.push_back(seqs[i].base), masks.push_back(seqs[i].mask_block),
                masks.push_back(seqs[i].q_index0);
            rows += seqs[i].T, max_rows = std::max(max_rows, seqs[i].T);
            q_off.push_back(rows), kv_off.push_back(seqs[i].base + seqs[i].n_keys);
        }
        std::vector<float> qf((size_t)rows * qkv);
        for (float &v : qf) v = r.normal();
        const std::vector<uint16_t> qb = test_bf16_vec(qf);
        dllm__dbuf dq, dkv, dqo, dkvo, dm, dout;
        test_put(dq, qb), test_put(dkv, kvb), test_put(dqo, q_off), test_put(dkvo, kv_off), test_put(dm, masks);
        test_poison(dout, (size_t)rows * H * hd * 2);
        attn_args b = {};
        b.q = dq.as<bf16_t>(), b.k = dkv.as<bf16_t>(), b.v = dkv.as<bf16_t>() + kvd, b.o = dout.as<bf16_t>();
        b.seq = total_keys, b.q_rows = max_rows, b.q_stride = qkv, b.kv_stride = 2 * kvd, b.o_stride = H * hd,
        b.group = H / KV;
        b.scale_log2 = 1.4426950408889634f / sqrtf((float)hd), b.kv_splits = 1;
        b.q_offsets = dqo.as<int>(), b.kv_offsets = dkvo.as<int>(), b.varlen_masks = dm.as<int>();
        dllm__dbuf dwork, dwork_short;
        const dllm__attn_work_shape w = test_varlen_work(dwork, b, q_off, {}, ga.arch);
        CHECK_STATUS(dllm__attn_varlen_launch(k, dllm__kernel<void(attn_args)>(), ga.arch, hd, H, (int)q_off.size() - 1,
                                              w, b, 0),
                     DLLM_OK, nullptr);
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        const std::vector<uint16_t> out = test_get<uint16_t>(dout, (size_t)rows * H * hd);
        test_poison(dout, (size_t)rows * H * hd * 2);
        const dllm__attn_work_shape w_short = test_varlen_work(dwork_short, b, q_off, {}, short_tiles);
        CHECK_STATUS(dllm__attn_varlen_launch(k_short, dllm__kernel<void(attn_args)>(), short_tiles, hd, H,
                                              (int)q_off.size() - 1, w_short, b, 0),
                     DLLM_OK, nullptr);
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        CHECK_MSG(test_get<uint16_t>(dout, (size_t)rows * H * hd) == out,
                  "hd %d: the short runs' tiles changed the masked varlen attention's bits", hd);
        const std::vector<float> x = test_f32_vec(qb), kv = test_f32_vec(kvb);
        for (size_t i = 0; i < seqs.size(); i++) {
            const test_bdb_attn_seq &s = seqs[i];
            dllm__dbuf dout1;
            test_poison(dout1, (size_t)s.T * H * hd * 2);
            attn_args a1 = {};
            a1.q = dq.as<bf16_t>() + (size_t)q_off[2 * i] * qkv, a1.k = dkv.as<bf16_t>() + (size_t)s.base * 2 * kvd,
            a1.v = a1.k + kvd, a1.o = dout1.as<bf16_t>();
            a1.seq = s.n_keys, a1.q_rows = s.T, a1.q_stride = qkv, a1.kv_stride = 2 * kvd, a1.o_stride = H * hd,
            a1.group = H / KV;
            a1.q_bstride = (u64)s.T * qkv, a1.o_bstride = (u64)s.T * H * hd, a1.scale_log2 = b.scale_log2,
            a1.kv_splits = 1;
            a1.mask_block = s.mask_block, a1.q_index0 = s.q_index0;
            CHECK_STATUS(dllm__attn_launch(plain, ga.arch, hd, H, 1, a1, 0), DLLM_OK, nullptr);
            const std::vector<uint16_t> alone = test_get<uint16_t>(dout1, (size_t)s.T * H * hd);
            const std::vector<uint16_t> mine(out.begin() + (long)q_off[2 * i] * H * hd,
                                             out.begin() + (long)q_off[2 * i + 1] * H * hd);
            std::vector<float> q((size_t)s.T * H * hd), kk((size_t)s.n_keys * kvd), vv((size_t)s.n_keys * kvd),
                want(q.size());
            for (int t = 0; t < s.T; t++)
                std::copy(&x[(size_t)(q_off[2 * i] + t) * qkv], &x[(size_t)(q_off[2 * i] + t) * qkv] + H * hd,
                          &q[(size_t)t * H * hd]);
            for (int j = 0; j < s.n_keys; j++) {
                const float *row = &kv[(size_t)(s.base + j) * 2 * kvd];
                std::copy(row, row + kvd, &kk[(size_t)j * kvd]);
                std::copy(row + kvd, row + 2 * kvd, &vv[(size_t)j * kvd]);
            }
            dllm__cpu_attention(pool, q.data(), kk.data(), vv.data(), s.T, s.n_keys, H, KV, hd, nullptr, want.data(),
                                s.q_index0, s.mask_block);
            const double err = test_max_rel(test_f32_vec(mine), want);
            printf(
                "    hd %d, sequence %zu: %d queries from %d over %d keys, mask block %d: %s alone, max relative error "
                "vs CPU %.2e\n",
                hd, i, s.T, s.q_index0, s.n_keys, s.mask_block, mine == alone ? "bit-identical to" : "DIFFERENT from",
                err);
            CHECK_MSG(mine == alone,
                      "hd %d sequence %zu: the masked varlen attention's bits differ from its launch alone", hd, i);
            CHECK_MSG(err < 2e-2, "hd %d sequence %zu: error %.3e against the CPU twin", hd, i, err);
        }
    }
}


/* One forward of a sequence's script: what bd_forward takes, and where the schedule's pick would be (pick_s0 >= 0: the
 * sub-block at that block offset of the block starting at bs, scored from the forward's rows as
 * dllm__bd_generation::step scores them; -1: logits). */
struct test_bdb_fwd {
    test_bd_fwd f;
    int bs, pick_s0;
};
struct test_bdb_script {
    int rows;
    std::vector<int32_t> ids;
    std::vector<test_bdb_fwd> f;
};

static dllm__bd_call test_bdb_call(const test_bdb_script &s, const test_bdb_fwd &x) {
    dllm__bd_call call;
    call.kind = x.f.kind, call.ids = s.ids.data() + x.f.start, call.T = x.f.T, call.offset = x.f.offset,
    call.mask_block = x.f.mask_block;
    call.r0 = x.f.r0, call.r1 = x.f.r1, call.kv_group = 0;
    return call;
}

static dllm__bd_pick test_bdb_pick(const dllm__config &c, const test_bdb_fwd &x, int S) {
    const int shift = c.shift_logits ? 1 : 0, first = x.f.kind == DLLM__BD_SUB_BLOCK ? x.f.offset : 0,
              q0 = x.pick_s0 - first;
    dllm__bd_pick p;
    p.sampling.eos_logit_inf = true, p.sampling.eos_id = c.mask_id;
    p.pos0 = x.bs + x.pick_s0, p.n = S, p.shift0 = shift && q0 == 0, p.lrow0 = (shift && q0 > 0 ? q0 - 1 : q0) - x.f.r0;
    return p;
}

/* Three generations at different committed lengths: A a prefill of two blocks, a masked step, the block cache's refresh
 * and a sub-block with new tokens, the commit, the next block's step; B a one-block prefill, a refresh and two
 * sub-blocks for their logits, the commit; C a prompt shorter than a block (no prefill), two steps, the commit, a
 * refresh. Steps choose their sub-block's tokens (with_picks) unless the logits are asked for. */
static std::vector<test_bdb_script> test_bdb_scripts(const dllm__config &c, int B, int S) {
    const int V = c.n_vocab, prefill = c.bd_causal_context ? 1 : B, step = c.bd_mask_block,
              shift = c.shift_logits ? 1 : 0;
    auto ids = [&](int n, int seed) {
        std::vector<int32_t> x((size_t)n);
        for (int i = 0; i < n; i++) x[(size_t)i] = (int32_t)(((size_t)i * 37 + (size_t)seed) % (size_t)V);
        for (int i = 0; i < n; i++)
            if (x[(size_t)i] == c.mask_id) x[(size_t)i] = (c.mask_id + 1) % V;
        return x;
    };
    auto masks = [&](std::vector<int32_t> &x, int from, int to) {
        for (int i = from; i < to; i += 2) x[(size_t)i] = c.mask_id;
    };
    const int r1_0 = std::max(S - shift, 1);  // the schedule's logit rows of the first sub-block's step
    std::vector<test_bdb_script> s(3);
    s[0].rows = 4 * B + 3, s[0].ids = ids(4 * B + S, 11);
    masks(s[0].ids, 2 * B + 3, 3 * B), masks(s[0].ids, 3 * B + 1, 4 * B);
    s[0].f = {{{DLLM__BD_COMMIT, 0, 2 * B, 0, prefill, 2 * B - 1, 2 * B}, 0, -1},
              {{DLLM__BD_STEP, 2 * B, B, 0, step, 0, r1_0}, 2 * B, 0},
              {{DLLM__BD_BLOCK_FULL, 2 * B, B, 0, step, S - shift, 2 * S - shift}, 2 * B, S},
              {{DLLM__BD_SUB_BLOCK, 4 * B, S, S, 0, 0, S}, 2 * B, S},
              {{DLLM__BD_COMMIT, 2 * B, B, 0, prefill, B - 1, B}, 2 * B, -1},
              {{DLLM__BD_STEP, 3 * B, B, 0, step, 0, r1_0}, 3 * B, 0}};
    s[1].rows = 3 * B + 7, s[1].ids = ids(2 * B, 5);
    masks(s[1].ids, B + 1, 2 * B);
    s[1].f = {{{DLLM__BD_COMMIT, 0, B, 0, prefill, B - 1, B}, 0, -1},
              {{DLLM__BD_BLOCK_FULL, B, B, 0, step, 0, B}, B, -1},
              {{DLLM__BD_SUB_BLOCK, 2 * B - S, S, B - S, 0, 1, S}, B, -1},
              {{DLLM__BD_SUB_BLOCK, B, S, 0, 0, 0, S}, B, 0},
              {{DLLM__BD_COMMIT, B, B, 0, prefill, B - 1, B}, B, -1}};
    s[2].rows = 2 * B, s[2].ids = ids(2 * B, 29);
    masks(s[2].ids, 5, B), masks(s[2].ids, B + 2, 2 * B);
    s[2].f = {{{DLLM__BD_STEP, 0, B, 0, step, 0, r1_0}, 0, 0},
              {{DLLM__BD_STEP, 0, B, 0, step, S - shift, 2 * S - shift}, 0, S},
              {{DLLM__BD_COMMIT, 0, B, 0, prefill, B - 1, B}, 0, -1},
              {{DLLM__BD_BLOCK_FULL, B, B, 0, step, 0, B}, B, -1}};
    return s;
}

/* What one sequence got from one forward: its logits, or its choices. */
struct test_bdb_result {
    std::vector<float> logits;
    std::vector<dllm__choice> choices;
};

/* The scripts `which` through bd_forward_batch, round r holding each script's r-th forward (the order reversed in odd
 * rounds): results[i][r] for script which[i]. with_picks false: every forward returns its logits. */
static dllm_status test_bdb_run(dllm__backend_impl &b, const dllm__config &c, const std::vector<test_bdb_script> &s,
                                const std::vector<int> &which, int S, bool with_picks,
                                std::vector<std::vector<test_bdb_result>> &results) {
    std::vector<int> rows;
    for (int i : which) rows.push_back(s[(size_t)i].rows);
    DLLM__TRY(b.bd_batch_reserve(rows));
    results.assign(which.size(), {});
    for (size_t r = 0;; r++) {
        std::vector<int> in;  // indices into which
        for (size_t i = 0; i < which.size(); i++)
            if (r < s[(size_t)which[i]].f.size()) in.push_back((int)i);
        if (in.empty()) break;
        if (r % 2) std::reverse(in.begin(), in.end());
        std::vector<dllm__bd_seq> seqs;
        std::vector<dllm__bd_pick> picks(in.size());
        size_t n_logits = 0, n_choices = 0;
        for (size_t k = 0; k < in.size(); k++) {
            const test_bdb_script &sc = s[(size_t)which[(size_t)in[k]]];
            const test_bdb_fwd &x = sc.f[r];
            dllm__bd_seq q;
            q.slot = in[k], q.call = test_bdb_call(sc, x);
            if (with_picks && x.pick_s0 >= 0)
                picks[k] = test_bdb_pick(c, x, S), q.pick = &picks[k], n_choices += (size_t)S;
            else n_logits += (size_t)(x.f.r1 - x.f.r0) * c.n_vocab;
            seqs.push_back(q);
        }
        std::vector<float> logits(n_logits, NAN);
        std::vector<dllm__choice> choices(n_choices, dllm__choice{-1, NAN, true});
        DLLM__TRY(b.bd_forward_batch(seqs, logits.data(), choices.data()));
        size_t at_l = 0, at_c = 0;
        for (size_t k = 0; k < in.size(); k++) {
            test_bdb_result res;
            if (seqs[k].pick) {
                res.choices.assign(choices.begin() + (long)at_c, choices.begin() + (long)(at_c + (size_t)S));
                at_c += (size_t)S;
            } else {
                const size_t n = (size_t)(seqs[k].call.r1 - seqs[k].call.r0) * c.n_vocab;
                res.logits.assign(logits.begin() + (long)at_l, logits.begin() + (long)(at_l + n));
                at_l += n;
            }
            results[(size_t)in[k]].push_back(res);
        }
    }
    return b.bd_batch_reserve({});
}

static bool test_bdb_same(const test_bdb_result &a, const test_bdb_result &b) {
    if (a.logits.size() != b.logits.size() || a.choices.size() != b.choices.size()) return false;
    if (!a.logits.empty() && memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4) != 0) return false;
    for (size_t i = 0; i < a.choices.size(); i++)
        if (a.choices[i].token != b.choices[i].token || memcmp(&a.choices[i].conf, &b.choices[i].conf, 8) != 0 ||
            a.choices[i].deferred != b.choices[i].deferred)
            return false;
    return true;
}

/* The mixed batch on one model: (1) with the picks, every sequence's results bit-identical to its own in a batch of
 * one; (2) without them, every forward's logits bit-identical across the two runs' shared forwards and within bf16
 * tolerance of the CPU backend's bd_forward of the same calls; the device's choices (1) equal to dllm__choose over
 * those logits. */
static void test_bdb_model(dllm_test_state &T_, const char *name, dllm_model *m, int B, int S,
                           dllm_precision precision = DLLM_PRECISION_BF16, double tolerance = 3e-2,
                           dllm_kv_quant kv_quant = DLLM_KV_QUANT_NONE) {
    dllm_ctx *cpu = nullptr, *gpu = nullptr;  // [FP8] [KV quant]: the GPU's against the CPU's twin
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.n_threads = 2, cp.precision = precision, cp.kv_quant = kv_quant;
    cp.backend = DLLM_BACKEND_CPU, cpu = test_ctx_params(m, cp);
    cp.backend = DLLM_BACKEND_GPU, gpu = test_ctx_params(m, cp);
    CHECK_MSG(cpu && gpu && dllm_ctx_get_backend(gpu) == DLLM_BACKEND_GPU, "%s: no GPU context", name);
    if (!cpu || !gpu || dllm_ctx_get_backend(gpu) != DLLM_BACKEND_GPU) {
        dllm_ctx_free(cpu);
        dllm_ctx_free(gpu);
        return;
    }
    const dllm__config &c = m->cfg;
    const int V = c.n_vocab;
    const std::vector<test_bdb_script> s = test_bdb_scripts(c, B, S);
    std::vector<std::vector<test_bdb_result>> mixed, logits, alone;
    CHECK_STATUS(test_bdb_run(*gpu->impl, c, s, {0, 1, 2}, S, true, mixed), DLLM_OK, nullptr);
    CHECK_STATUS(test_bdb_run(*gpu->impl, c, s, {0, 1, 2}, S, false, logits), DLLM_OK, nullptr);
    for (int i = 0; i < 3; i++) {
        CHECK_STATUS(test_bdb_run(*gpu->impl, c, s, {i}, S, true, alone), DLLM_OK, nullptr);
        if (mixed.size() != 3 || logits.size() != 3 || alone.size() != 1) break;
        int same = 0, n = (int)s[(size_t)i].f.size();
        for (int r = 0; r < n && r < (int)alone[0].size() && r < (int)mixed[(size_t)i].size(); r++)
            same += test_bdb_same(mixed[(size_t)i][(size_t)r], alone[0][(size_t)r]);
        printf("    %s, sequence %d: %d of %d forwards bit-identical in the mixed batch and alone\n", name, i, same, n);
        CHECK_MSG(same == n, "%s, sequence %d: %d of %d forwards differ from the batch of one", name, i, n - same, n);
        // the CPU reference, forward by forward, and the device's choices against the host's over the same logits
        CHECK_STATUS(cpu->impl->bd_begin(s[(size_t)i].rows), DLLM_OK, nullptr);
        for (int r = 0; r < n && r < (int)logits[(size_t)i].size(); r++) {
            const test_bdb_fwd &x = s[(size_t)i].f[(size_t)r];
            const dllm__bd_call call = test_bdb_call(s[(size_t)i], x);
            std::vector<float> want((size_t)(call.r1 - call.r0) * V, NAN);
            CHECK_STATUS(cpu->impl->bd_forward(call, want.data()), DLLM_OK, nullptr);
            const std::vector<float> &got = logits[(size_t)i][(size_t)r].logits;
            const double err = got.size() == want.size() ? test_max_rel(got, want) : 1e9;
            printf(
                "    %s, sequence %d, forward %d (kind %d, %d rows at offset %d): GPU batch vs CPU logits max relative "
                "error %.2e\n",
                name, i, r, (int)call.kind, call.T, call.offset, err);
            CHECK_MSG(err < tolerance, "%s, sequence %d, forward %d: error %.3e", name, i, r, err);
            const std::vector<float> &with_picks =
                mixed[(size_t)i][(size_t)r].logits;  // a forward without a pick: the same logits
            if (!with_picks.empty())
                CHECK(with_picks.size() == got.size() && memcmp(with_picks.data(), got.data(), got.size() * 4) == 0);
            if (x.pick_s0 < 0 || got.size() != want.size()) continue;
            const dllm__bd_pick p = test_bdb_pick(c, x, S);
            const std::vector<dllm__choice> &dev = mixed[(size_t)i][(size_t)r].choices;
            int equal = 0;
            for (int j = 0; j < S && (size_t)j < dev.size(); j++) {
                const dllm__choice h =
                    dllm__choose(got.data() + (size_t)p.logits_row(j) * V, V, p.sampling, (uint32_t)(p.pos0 + j), 0);
                equal += dev[(size_t)j].token == h.token && dev[(size_t)j].deferred == h.deferred &&
                         fabs(dev[(size_t)j].conf - h.conf) <= 1e-12 * std::max(1e-300, fabs(h.conf));
            }
            CHECK_MSG(equal == S, "%s, sequence %d, forward %d: %d of %d device choices equal the host's", name, i, r,
                      equal, S);
        }
    }
    dllm_ctx_free(cpu);
    dllm_ctx_free(gpu);
}

TEST(gpu_bd_batch, mixed_batch_equals_batch_of_one_and_cpu) {
    NEED_GPU();
    test_knob on("bd_batch", true);
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    CHECK(m != nullptr);
    if (m) test_bdb_model(T_, "tiny-fast-dllm-v2 (block 64 under the step mask's 32)", m, 2 * m->cfg.bd_mask_block, 8);
    dllm_model_free(m);
    test_tmpdir dir;
    m = test_random_nemotron(dir, 0x5eed, true);
    CHECK(m != nullptr && m->cfg.llama4_beta > 0 && m->cfg.llama4_orig_max < 4 * 2 * m->cfg.bd_mask_block &&
          m->cfg.bd_causal_context);
    if (m)
        test_bdb_model(
            T_, "random tiny Nemotron (block 16 under the step mask's 8, positions past the Llama-4 scaling's 32)", m,
            2 * m->cfg.bd_mask_block, 4);
    dllm_model_free(m);
    test_tmpdir dir64;  // head dim 64: sequences whose keys are not split take flash_attn_wg apart (sm_90a)
    m = test_random_nemotron(dir64, 0x5eed, true, 64);
    CHECK(m != nullptr);
    if (m) test_bdb_model(T_, "random tiny Nemotron, head dim 64", m, 2 * m->cfg.bd_mask_block, 4);
    dllm_model_free(m);
}

/* [FP8] With batch_fp8 on too (the default), an FP8 context (FP8 all) runs the batched block-diffusion forward: the
 * same checks, the logits against the CPU's FP8 twin within gpu_fp8.forward_matches_cpu_fp8_reference's bound
 * (8e-2: the two quantise slightly different activations). */
TEST(gpu_bd_batch, fp8_mixed_batch_equals_batch_of_one_and_cpu) {
    NEED_GPU();
    test_knob on("bd_batch", true);
    test_knob fp8("batch_fp8", true);
    if (test_fp8_gemm_kinds().empty()) SKIP("skipped (no FP8 GEMM on this GPU)");
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    CHECK(m != nullptr);
    if (m)
        test_bdb_model(T_, "tiny-fast-dllm-v2 FP8 all", m, 2 * m->cfg.bd_mask_block, 8, DLLM_PRECISION_FP8_ALL, 8e-2);
    dllm_model_free(m);
}

/* [KV quant] The mixed batch with every slot's committed rows as codes (gpu/batch_kvq.cpp): each sequence's results
 * bit-identical to its batch of one, its logits within gpu.kv_quant_forwards_match_cpu's bounds of the CPU's bd_forward
 * under the same kv_quant (KV4 5e-2, KV2 1e-1), for SoloQ's and KIVI's caches; with kvq_flash (kvq_tc, the default)
 * and with kvq_attention. */
TEST(gpu_bd_batch, kv_quant_mixed_batch_equals_batch_of_one_and_cpu) {
    NEED_GPU();
    test_knob on("bd_batch", true);
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    CHECK(m != nullptr);
    for (int tc = 1; m && tc >= 0; tc--) {
        test_knob kvq_tc("kvq_tc", tc == 1);
        for (dllm_kv_quant q : {DLLM_KV_QUANT_SOLOQ_KV4, DLLM_KV_QUANT_SOLOQ_KV2, DLLM_KV_QUANT_KIVI_KV4}) {
            const std::string name =
                dllm__format("tiny-fast-dllm-v2 %s%s", dllm__kvq_names[q], tc ? "" : " (kvq_attention)");
            test_bdb_model(T_, name.c_str(), m, 2 * m->cfg.bd_mask_block, 8, DLLM_PRECISION_BF16,
                           dllm__kvq_bits(q) == 4 ? 5e-2 : 1e-1, q);
        }
    }
    dllm_model_free(m);
}

/* With bd_batch off both calls answer UNSUPPORTED naming the switch (dllm_generate_batch then decodes the items one
 * after another); with it, the empty list says the forward exists, and a forward before the slots is an error. */
TEST(gpu_bd_batch, off_when_switched_off) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    dllm_ctx *gpu = m ? test_ctx(m, DLLM_BACKEND_GPU) : nullptr;
    CHECK(gpu && dllm_ctx_get_backend(gpu) == DLLM_BACKEND_GPU);
    if (gpu && dllm_ctx_get_backend(gpu) == DLLM_BACKEND_GPU) {
        {
            test_knob off("bd_batch", false);
            CHECK(gpu->impl->batch_caps().block_diffusion.find("bd_batch is off") != std::string::npos);
            CHECK_STATUS(gpu->impl->bd_batch_reserve({64}), DLLM_ERR_UNSUPPORTED, "bd_batch is off");
            CHECK_STATUS(gpu->impl->bd_batch_reserve({}), DLLM_OK, nullptr);
        }
        test_knob on("bd_batch", true);
        CHECK(gpu->impl->batch_caps().block_diffusion.empty());
        std::vector<int32_t> ids(8, 1);
        dllm__bd_seq q;
        q.slot = 0, q.call.ids = ids.data(), q.call.T = 8, q.call.r0 = 0, q.call.r1 = 1;
        std::vector<float> logits((size_t)m->cfg.n_vocab);
        CHECK_STATUS(gpu->impl->bd_forward_batch({q}, logits.data(), nullptr), DLLM_ERR_INTERNAL,
                     "before bd_batch_reserve");
    }
    dllm_ctx_free(gpu);
    dllm_model_free(m);
}

// ---- the layout against the CPU reference's data movement (CPU) -----------------------------------------------------

/* What a key or query row is, for the emulation below: its token and RoPE position
 * (what layer 0's K/V of a row depend on). */
typedef std::pair<int32_t, int32_t> test_bdb_row;  // (position, token)

/* The CPU reference's block-diffusion cache for one sequence (dllm__cpu_bd_attention's data movement on one layer):
 * committed rows, the block cache apart; each query row's visible keys. */
struct test_bdb_cpu_cache {
    std::vector<test_bdb_row> rows, block;
    int n = 0;
    std::vector<std::vector<test_bdb_row>> forward(const dllm__bd_call &call, std::vector<test_bdb_row> &queries) {
        std::vector<test_bdb_row> fresh;
        for (int t = 0; t < call.T; t++) fresh.push_back({n + call.offset + t, call.ids[t]});
        queries = fresh;
        if (call.kind == DLLM__BD_BLOCK_FULL) block.assign((size_t)call.T, test_bdb_row{-1, -1});
        rows.resize((size_t)n);
        if (call.kind == DLLM__BD_SUB_BLOCK) {
            std::copy(fresh.begin(), fresh.end(), block.begin() + call.offset);  // the overwrite persists
            rows.insert(rows.end(), block.begin(), block.end());
        } else {
            rows.insert(rows.end(), fresh.begin(), fresh.end());
            if (call.kind == DLLM__BD_BLOCK_FULL) block = fresh;
        }
        std::vector<std::vector<test_bdb_row>> visible;
        const int n_keys = (int)rows.size(), q_index0 = n + call.offset;
        for (int i = 0; i < call.T; i++) {
            const int n_visible = call.mask_block
                                      ? std::min(n_keys, ((q_index0 + i) / call.mask_block + 1) * call.mask_block)
                                      : n_keys;  // dllm__cpu_bd_attend's
            visible.emplace_back(rows.begin(), rows.begin() + n_visible);
        }
        if (call.kind == DLLM__BD_COMMIT) n += call.T;
        return visible;
    }
};

/* The GPU test's scripts, round by round through the layout (rows scattered into a slot store by cache_rows, each query
 * over its entry's key range under its entry's mask, as the varlen attention reads them) and the slots' advance: every
 * query row's position, token and visible keys (position and token, in order) equal the CPU reference's, for the two
 * test models' shapes. */
TEST(bd_batch, layout_reads_what_the_cpu_reference_reads) {
    for (int model = 0; model < 2; model++) {
        dllm__config c;
        c.n_vocab = 136, c.mask_id = 100, c.shift_logits = model == 0;
        c.bd_causal_context = model == 1, c.bd_mask_block = model == 0 ? 32 : 8;
        const int B = 2 * c.bd_mask_block, S = model == 0 ? 8 : 4;
        const std::vector<test_bdb_script> s = test_bdb_scripts(c, B, S);
        std::vector<int> base, rows;
        int total = 0;
        for (const test_bdb_script &x : s) base.push_back(total), rows.push_back(x.rows), total += x.rows;
        std::vector<test_bdb_row> store((size_t)total, test_bdb_row{-7, -7});
        std::vector<dllm__bd_slot> slots(s.size());
        std::vector<test_bdb_cpu_cache> cpu(s.size());
        int checked = 0, wrong = 0;
        for (size_t r = 0; r < 6; r++) {
            std::vector<dllm__bd_seq> seqs;
            std::vector<dllm__bd_pick> picks(s.size());
            for (size_t k = 0; k < s.size(); k++) {
                const size_t i = r % 2 ? s.size() - 1 - k : k;  // the order reversed in odd rounds, as on the GPU
                if (r >= s[i].f.size()) continue;
                dllm__bd_seq q;
                q.slot = (int)i, q.call = test_bdb_call(s[i], s[i].f[r]);
                if (s[i].f[r].pick_s0 >= 0) picks[i] = test_bdb_pick(c, s[i].f[r], S), q.pick = &picks[i];
                seqs.push_back(q);
            }
            dllm__varlen_layout v;
            CHECK_STATUS(dllm__bd_batch_layout_of(seqs, base, rows, slots, 4 * B + S, v), DLLM_OK, nullptr);
            if ((int)v.cache_rows.size() != v.rows) break;
            for (int t = 0; t < v.rows; t++)
                store[(size_t)v.cache_rows[(size_t)t]] = {v.positions[(size_t)t], v.ids[(size_t)t]};
            for (size_t k = 0; k < seqs.size(); k++) {
                std::vector<test_bdb_row> want_q;
                const std::vector<std::vector<test_bdb_row>> want =
                    cpu[(size_t)seqs[k].slot].forward(seqs[k].call, want_q);
                const int e = 2 * (int)k, q0 = v.attn_q_offsets[(size_t)e], k0 = v.attn_kv_offsets[(size_t)e];
                const int n_keys = v.attn_kv_offsets[(size_t)e + 1] - k0, mb = v.attn_masks[(size_t)e * 2],
                          qi0 = v.attn_masks[(size_t)e * 2 + 1];
                for (int j = 0; j < seqs[k].call.T; j++) {
                    const int n_visible = mb ? std::min(n_keys, ((qi0 + j) / mb + 1) * mb) : n_keys;  // visible_keys
                    const std::vector<test_bdb_row> got(store.begin() + k0, store.begin() + k0 + n_visible);
                    const test_bdb_row query = {v.positions[(size_t)(q0 + j)], v.ids[(size_t)(q0 + j)]};
                    checked++;
                    wrong += got != want[(size_t)j] || query != want_q[(size_t)j];
                }
            }
            for (const dllm__bd_seq &q : seqs) dllm__bd_slot_advance(q.call, slots[(size_t)q.slot]);
        }
        printf(
            "    %s shape (block %d, sub-block %d): %d query rows over 6 rounds, %d read other keys than the CPU "
            "reference's\n",
            model ? "Nemotron" : "Fast-dLLM v2", B, S, checked, wrong);
        CHECK_MSG(checked > 0 && wrong == 0, "model shape %d: %d of %d query rows differ from the CPU reference", model,
                  wrong, checked);
    }
}
