/* Tests: [KV quant] the tensor-core attention over the quantised K/V cache (kvq_tc, the default; kvq_flash +
 * kvq_flash_combine in dllm__src_kvq_tc, twin dllm__kvq_flash_twin in 9c). On the CPU: the key splits partition the
 * keys without mixing kinds, the twin agrees with the fp32 reference (dllm__cpu_attention over 9c's decoded cache) to
 * bf16 rounding, and the module compiles for sm_90 and sm_80 without spills. On a GPU: the kernels against the twin
 * (tight) and against kvq_attention (fp32 decode, looser) on awkward random caches, and block-diffusion forwards and a
 * generation with the switch on against the switch off. */

/* One random case: head dim, heads over kv heads, the key group, sinks, committed rows (whole groups), the active
 * rows past them (the queries' own), the block-causal mask's block (0: none), the rotation's mixer, keys a split. */
struct test_kvqtc_case {
    int hd, n_head, n_kv, group, n_sink, n_committed, n_active, mask_block;
    bool mixer;
    int split_keys;
};

static const test_kvqtc_case test_kvqtc_cases[] = {
    {64, 6, 2, 8, 3, 104, 19, 8, true, 64},     // GQA 3, committed rows not at a tile edge, sinks
    {32, 4, 4, 16, 0, 160, 8, 0, false, 128},   // no GQA, no sinks, no mask, a sub-block of 8 rows, no mixer
    {48, 5, 1, 4, 5, 72, 33, 16, true, 64},     // head dim 48, groups of 4 (a tile spans more than the staged groups)
    {256, 2, 1, 32, 1, 96, 32, 32, true, 128},  // head dim 256 (tiles of 32 keys)
    {16, 8, 1, 8, 2, 40, 40, 8, false,
     64},  // 320 query rows of one kv head: two CTAs of rows; 2-bit codes are 4-byte words
};

/* The case's inputs as the device holds them: rows committed through 9c (q: codes; kv: the decoded cache the fp32
 * reference reads), the bf16 K|V rows before quantisation (cache [n_keys][2 kvd]), queries [n_active][q_stride]. */
struct test_kvqtc_data {
    dllm__config c;
    dllm__kvq q;
    dllm__bd_kv kv;
    std::vector<float> cache, x;
    int n_keys = 0, q_stride = 0, q_index0 = 0;
};

static bool test_kvqtc_make(const test_kvqtc_case &k, int mode, test_rng &rng, test_kvqtc_data &d) {
    d.c.family = DLLM_FAMILY_FAST_DLLM_V2, d.c.n_layer = 1, d.c.n_head = k.n_head, d.c.n_head_kv = k.n_kv,
    d.c.head_dim = k.hd;
    d.n_keys = k.n_committed + k.n_active, d.q_stride = (k.n_head + 2 * k.n_kv) * k.hd, d.q_index0 = k.n_committed;
    const int kvd = k.n_kv * k.hd;
    d.q.setup(d.c, mode, k.n_sink);
    if (!k.mixer)
        for (dllm__rotation &r : d.q.rot) r.mixer.clear();
    d.q.reset(d.n_keys);
    d.kv.reset(d.c, d.n_keys);
    d.cache.assign((size_t)d.n_keys * 2 * kvd, 0.0f);
    auto bf16 = [](float v) { return dllm__bf16_to_f32(dllm__f32_to_bf16(v)); };
    std::vector<float> channel_bias((size_t)kvd);
    for (float &b : channel_bias) b = 2.0f * rng.normal();  // KIVI's keys: per-channel offsets, as RoPE'd keys have
    for (int j = 0; j < d.n_keys; j++)
        for (int e = 0; e < kvd; e++) {
            const float key = bf16(channel_bias[(size_t)e] + rng.normal() * (e % 7 == 0 ? 3.0f : 1.0f)),
                        value = bf16(rng.normal());
            d.cache[(size_t)j * 2 * kvd + e] = d.kv.k[(size_t)j * kvd + e] = key;
            d.cache[(size_t)j * 2 * kvd + kvd + e] = d.kv.v[(size_t)j * kvd + e] = value;
        }
    d.x.assign((size_t)k.n_active * d.q_stride, 0.0f);
    for (float &v : d.x) v = bf16(rng.normal());
    dllm__pool pool(2);
    return dllm__kvq_commit(pool, d.q, d.kv, 0, k.n_committed, k.group) == DLLM_OK;
}

/* The fp32 reference: dllm__cpu_attention over the decoded cache (SoloQ's values rotated back at commit). */
static std::vector<float> test_kvqtc_reference(const test_kvqtc_case &k, const test_kvqtc_data &d) {
    const int qd = k.n_head * k.hd;
    std::vector<float> q((size_t)k.n_active * qd), out(q.size());
    for (int i = 0; i < k.n_active; i++) memcpy(&q[(size_t)i * qd], &d.x[(size_t)i * d.q_stride], sizeof(float) * qd);
    dllm__pool pool(2);
    dllm__cpu_attention(pool, q.data(), d.kv.k.data(), d.kv.v.data(), k.n_active, d.n_keys, k.n_head, k.n_kv, k.hd,
                        nullptr, out.data(), d.q_index0, k.mask_block);
    return out;
}

static std::vector<float> test_kvqtc_twin(const test_kvqtc_case &k, const test_kvqtc_data &d, int split_keys) {
    std::vector<float> out((size_t)k.n_active * k.n_head * k.hd, NAN);
    dllm__kvq_flash_twin(d.q, 0, d.cache.data(), d.x.data(), d.q_stride, k.n_head, k.n_active, d.n_keys, k.n_committed,
                         k.mask_block, d.q_index0, 1.0f / sqrtf((float)k.hd), split_keys, out.data());
    return out;
}

// ---- CPU -------------------------------------------------------------------------------------------------------

/* The splits cover [0, n_keys) once, in order, at most split_keys each, cut at its multiples, a split quantised iff its
 * keys are in [min(n_sink, n_committed), n_committed); their count is dllm__kvq_tc_n_splits. */
TEST(kv_quant, tc_splits_partition_the_keys) {
    test_rng rng("kv_quant.tc_splits_partition_the_keys");
    int bad = 0, checked = 0;
    for (int it = 0; it < 2000; it++) {
        const int n_keys = 1 + rng.below(700), n_committed = rng.below(n_keys + 1), n_sink = rng.below(9),
                  S = 64 * (1 + rng.below(5));
        const int n = dllm__kvq_tc_n_splits(n_keys, n_committed, n_sink, S);
        int next = 0;
        for (int s = 0; s < n; s++) {
            int j0, j1;
            bool quant;
            dllm__kvq_tc_split(n_keys, n_committed, n_sink, S, s, j0, j1, quant);
            const bool in_q = j0 >= std::min(n_sink, n_committed) && j1 <= n_committed;
            const bool in_bf16 = j1 <= std::min(n_sink, n_committed) || j0 >= n_committed;
            bad += j0 != next || j1 <= j0 || j1 - j0 > S || (j0 / S != (j1 - 1) / S) || quant != in_q ||
                   (!quant && !in_bf16);
            next = j1;
        }
        bad += next != n_keys;
        checked++;
    }
    printf("    %d random key layouts, %d bad\n", checked, bad);
    CHECK(bad == 0);
}

/* [batch] The batched attention's work (dllm__kvq_batch_work_of) over random layouts: each sequence's chunks and their
 * plans are those kvq_attention launches for it alone (dllm__kvq_tc_plan_for of each chunk of at most
 * dllm__kvq_tc_chunk_rows rows), the sequences in order; the kvq_flash_batch launches (one per CTA shape, grid (the
 * most splits, kv heads, chunks x row tiles), a split past its chunk's returning at once) run every CTA of every
 * chunk's own grid (split, kv head, row tile) exactly once, with that grid's warps and shared memory, the chunks in a
 * fixed order (by CTA shape as the chunks first take them, then chunk); the same sequence alone gets the same chunks;
 * the split states of the chunks are disjoint and fill the total; the (chunk, row) items list every query row once.
 * Without kvq_tc: one chunk of all rows a sequence, no kvq_flash items. */
TEST(kv_quant, tc_batch_work_is_each_sequence_alone) {
    test_rng rng("kv_quant.tc_batch_work_is_each_sequence_alone");
    struct shape {
        int hd, n_head, n_kv;
    };
    const shape shapes[] = {{128, 28, 4}, {64, 32, 8}, {256, 16, 16}, {128, 12, 2}};
    const int sms[] = {132, 78, 20, 1}, masks[] = {0, 8, 32};
    int bad = 0, layouts = 0;
    size_t ctas = 0;
    for (int it = 0; it < 400; it++) {
        const shape &sh = shapes[rng.below(4)];
        const int n_sms = sms[rng.below(4)], n_sink = rng.below(5), smem_optin = 232448;
        const bool tc = rng.below(5) != 0;
        std::vector<dllm__kvq_batch_seq> seqs(1 + rng.below(9));
        for (dllm__kvq_batch_seq &q : seqs) {
            q.T = 1 + (rng.below(4) ? rng.below(40) : rng.below(400));
            q.n_committed = 1 + (rng.below(3) ? rng.below(2000) : rng.below(40000));
            q.n_keys = q.n_committed + q.T + (rng.below(3) ? 0 : rng.below(64));
            q.mask_block = masks[rng.below(3)], q.pos0 = q.n_committed + rng.below(32);
        }
        dllm__kvq_batch_work w;
        if (dllm__kvq_batch_work_of(tc, sh.hd, sh.n_head, sh.n_kv, n_sink, n_sms, smem_optin, seqs, w) != DLLM_OK) {
            bad++;
            continue;
        }
        layouts++;
        // Each sequence's own chunks and plans, in order.
        std::vector<dllm__kvq_tc_plan> plans;
        std::vector<kvq_item> rows;
        size_t chunk = 0, partial = 0;
        for (size_t s = 0; s < seqs.size(); s++) {
            const dllm__kvq_batch_seq &q = seqs[s];
            const int step = tc ? dllm__kvq_tc_chunk_rows : q.T;
            for (int r0 = 0; r0 < q.T; r0 += step, chunk++) {
                const int n = std::min(step, q.T - r0);
                dllm__kvq_tc_plan p;
                if (chunk >= w.chunks.size() ||
                    (tc && dllm__kvq_tc_plan_for(sh.hd, sh.n_head, sh.n_kv, n, q.n_keys, q.n_committed, n_sink, n_sms,
                                                 smem_optin, p) != DLLM_OK)) {
                    bad++;
                    break;
                }
                const dllm__kvq_batch_chunk &c = w.chunks[chunk];
                bad += c.seq != (int)s || c.r0 != r0 || c.rows != n;
                for (int i = 0; i < n; i++) rows.push_back({(int)chunk, i});
                plans.push_back(p);
                if (!tc) continue;
                bad += c.plan.warps != p.warps || c.plan.q_tiles != p.q_tiles || c.plan.split_keys != p.split_keys ||
                       c.plan.n_splits != p.n_splits || c.partial != partial;
                partial += dllm__kvq_tc_partial_bytes(p, sh.n_head, n, sh.hd) / 4;
            }
        }
        bad += chunk != w.chunks.size() || w.partial_floats != partial || (!tc && (w.n_flash || !w.groups.empty()));
        bad += w.items.size() != (size_t)w.n_flash + rows.size();
        for (size_t i = 0; i < rows.size() && w.n_flash + i < w.items.size(); i++)
            bad += memcmp(&rows[i], &w.items[w.n_flash + i], sizeof(kvq_item)) != 0;
        // The fixed order of the chunks' items: by CTA shape (as the chunks first take them), then chunk.
        std::vector<int> order;
        for (size_t c = 0; tc && c < w.chunks.size(); c++) {
            bool first = true;
            for (size_t d = 0; d < c; d++)
                first = first && (plans[d].warps != plans[c].warps || plans[d].q_tiles != plans[c].q_tiles);
            if (!first) continue;
            for (size_t d = c; d < w.chunks.size(); d++)
                if (plans[d].warps == plans[c].warps && plans[d].q_tiles == plans[c].q_tiles) order.push_back((int)d);
        }
        bad += order.size() != (size_t)w.n_flash;
        for (size_t i = 0; i < order.size() && i < (size_t)w.n_flash; i++) bad += w.items[i].chunk != order[i];
        // The launches' CTAs: every CTA of every chunk's own grid once, with its grid's block and shared memory.
        std::vector<std::vector<int>> seen(w.chunks.size());
        for (size_t c = 0; c < w.chunks.size(); c++)
            seen[c].assign(tc ? (size_t)plans[c].n_splits * sh.n_kv * plans[c].q_tiles : 0, 0);
        int next = 0;
        for (const dllm__kvq_batch_group &g : w.groups) {
            bad += g.first != next || g.count <= 0 || g.smem != dllm__kvq_tc_smem(sh.hd, g.warps);
            next = g.first + g.count;
            int most = 0;
            for (int z = 0; z < g.count * g.q_tiles && g.first + z / g.q_tiles < w.n_flash; z++) {
                const int c = w.items[(size_t)(g.first + z / g.q_tiles)].chunk;
                const dllm__kvq_tc_plan &p = plans[(size_t)c];
                bad += p.warps != g.warps || p.q_tiles != g.q_tiles;
                most = std::max(most, p.n_splits);
                for (int y = 0; y < sh.n_kv; y++)
                    for (int x = 0; x < g.max_splits && x < p.n_splits; x++, ctas++)
                        seen[(size_t)c][((size_t)(z % g.q_tiles) * sh.n_kv + y) * p.n_splits + x]++;
            }
            bad += g.max_splits != most;
        }
        bad += next != w.n_flash;
        for (const std::vector<int> &v : seen)
            for (int n : v) bad += n != 1;
        // The same sequence alone: the same chunks and items (chunk indices and split-state offsets its own).
        const size_t s = (size_t)rng.below((int)seqs.size());
        dllm__kvq_batch_work alone;
        if (dllm__kvq_batch_work_of(tc, sh.hd, sh.n_head, sh.n_kv, n_sink, n_sms, smem_optin, {seqs[s]}, alone) !=
            DLLM_OK) {
            bad++;
            continue;
        }
        size_t first = 0;
        while (first < w.chunks.size() && w.chunks[first].seq != (int)s) first++;
        for (size_t c = 0; c < alone.chunks.size(); c++) {
            const dllm__kvq_batch_chunk &x = alone.chunks[c], &y = w.chunks[first + c];
            bad += x.r0 != y.r0 || x.rows != y.rows || x.plan.warps != y.plan.warps ||
                   x.plan.q_tiles != y.plan.q_tiles || x.plan.split_keys != y.plan.split_keys || x.plan.n_splits != y.plan.n_splits ||
                   x.partial != y.partial - w.chunks[first].partial;
        }
    }
    printf("    %d random layouts, %zu kvq_flash CTAs, %d bad\n", layouts, ctas, bad);
    CHECK(bad == 0);
}

/* The twin (bf16 keys, values and probabilities, per-split online softmax, SoloQ rotated back at the merge) against the
 * fp32 reference over 9c's decoded cache, every case and mode: they must agree to bf16 rounding. */
TEST(kv_quant, tc_twin_matches_fp32_reference) {
    test_rng rng("kv_quant.tc_twin_matches_fp32_reference");
    for (const test_kvqtc_case &k : test_kvqtc_cases)
        for (int mode = DLLM_KV_QUANT_SOLOQ_KV4; mode <= DLLM_KV_QUANT_KIVI_KV2; mode++) {
            test_kvqtc_data d;
            CHECK(test_kvqtc_make(k, mode, rng, d));
            const std::vector<float> ref = test_kvqtc_reference(k, d), twin = test_kvqtc_twin(k, d, k.split_keys);
            const double err = test_max_rel(twin, ref);
            printf(
                "    hd %d, %d/%d heads, %d keys (%d committed, %d sinks), mask %d, %s: twin vs fp32 max relative "
                "error %.2e\n",
                k.hd, k.n_head, k.n_kv, d.n_keys, k.n_committed, k.n_sink, k.mask_block, dllm__kvq_names[mode], err);
            CHECK_MSG(err < 2e-2, "hd %d %s: twin vs fp32 reference %.3e", k.hd, dllm__kvq_names[mode], err);
        }
}

/* The twin does not depend on how the keys are split beyond fp32 rounding and the bf16 rounding of probabilities
 * under another running max: the same case under two split sizes. */
TEST(kv_quant, tc_twin_split_size_changes_only_rounding) {
    test_rng rng("kv_quant.tc_twin_split_size_changes_only_rounding");
    const test_kvqtc_case &k = test_kvqtc_cases[0];
    test_kvqtc_data d;
    CHECK(test_kvqtc_make(k, DLLM_KV_QUANT_SOLOQ_KV4, rng, d));
    const double err = test_max_rel(test_kvqtc_twin(k, d, 64), test_kvqtc_twin(k, d, 4096));
    printf("    splits of 64 keys vs one split: max relative difference %.2e\n", err);
    CHECK(err < 1e-2);
}

/* The module compiles for sm_90 and sm_80 at the 7B shape's head dim 128 (and at 16, 48 and 256 on sm_90) without
 * spills or a stack frame (the output registers must stay registers), shared memory within the plan's. */
TEST(jit, kv_quant_tc_module_compiles) {
    const struct { int cc, hd; } builds[] = {{90, 128}, {80, 128}, {90, 16}, {90, 48}, {90, 256}};
    for (const auto &b : builds) {
        const dllm__arch a = dllm__arch_for(b.cc);
        dllm__jit_request rq = dllm__module_kvq_tc(a, b.hd);
        // PTX no compile in this process has made: NVRTC 13 returns an empty log, no ptxas report, for PTX it compiled
        // before (the GPU tests load these modules first), and a comment does not change the PTX; an extra entry does.
        rq.source += dllm__format("\nextern \"C\" __global__ void jit_test_entry_%.0f() {}\n", dllm__now_ms() * 1000);
        std::vector<char> cubin;
        std::vector<std::string> lowered;
        std::string log;
        CHECK_STATUS(dllm__nvrtc_compile(rq, cubin, lowered, log), DLLM_OK, nullptr);
        CHECK(lowered.size() == 4 && cubin.size() > 1000);
        // The module holds the kvq module's kernels too: ptxas's lines for kvq_flash, its combine and their batched
        // launches alone.
        static const char *const names[4] = {"kvq_flash", "kvq_flash_combine", "kvq_flash_batch",
                                              "kvq_flash_combine_batch"};
        std::string lines[4];
        for (int i = 0; i < 4; i++) {
            const std::string head = std::string("Function properties for ") + names[i] + "\n";
            const size_t at = log.find(head);
            const size_t end = at == std::string::npos ? at : log.find("Compile time", at);
            lines[i] = at == std::string::npos ? std::string() : log.substr(at + head.size(), end - at - head.size());
            CHECK_MSG(!lines[i].empty(),
                      "%s: no ptxas report for %s(NVRTC %d; %zu bytes of log, from its start:)\n%.1200s",
                      rq.name.c_str(), head.c_str(), dllm__nvrtc_version(), log.size(), log.c_str());
            CHECK_MSG(!dllm__log_has_spills(lines[i]), "%s spills on %s:\n%s", rq.name.c_str(), a.target,
                      lines[i].c_str());
            CHECK_MSG(!dllm__log_reports(lines[i], "stack frame"), "%s has a stack frame on %s:\n%s", rq.name.c_str(),
                      a.target, lines[i].c_str());
        }
        auto used_line = [&](const std::string &l) {
            const size_t used = l.find("Used");
            return used == std::string::npos ? std::string("(no ptxas line)")
                                             : l.substr(used, l.find('\n', used) - used);
        };
        const std::string line = used_line(lines[0]), batch_line = used_line(lines[2]);
        dllm__kvq_tc_plan p;
        CHECK_STATUS(dllm__kvq_tc_plan_for(b.hd, 28, 4, 32, 32800, 32768, 3, 132, b.cc >= 90 ? 232448 : 166912, p),
                     DLLM_OK, nullptr);
        printf(
            "    %s on %s: kvq_flash %s; kvq_flash_batch %s; at 28/4 heads x 32 rows: %d warps, %zu bytes of dynamic "
            "shared memory, %d splits of %d keys\n",
            rq.name.c_str(), a.target, line.c_str(), batch_line.c_str(), p.warps, p.smem, p.n_splits, p.split_keys);
    }
}

// ---- GPU -------------------------------------------------------------------------------------------------------

/* One case on the device: the codes, pairs, scales, bf16 rows, queries and rotation uploaded, kvq_flash under the
 * case's split size and under the plan's own, kvq_attention on the same arguments; outputs poisoned first. */
static void test_kvqtc_gpu_case(dllm_test_state &T_, const test_kvqtc_case &k, int mode, test_rng &rng) {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    int smem_optin = 0;
    cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    const dllm__arch arch = dllm__arch_for(prop.major * 10 + prop.minor);
    test_kvqtc_data d;
    CHECK(test_kvqtc_make(k, mode, rng, d));
    dllm__kvq_tc_kernels tc;
    dllm__kvq_kernels plain;
    CHECK_STATUS(dllm__kvq_tc_load(arch, k.hd, smem_optin, tc), DLLM_OK, nullptr);
    CHECK_STATUS(dllm__jit_load(dllm__module_kvq(arch), plain.module), DLLM_OK, nullptr);
    if (!tc.module || !plain.module) return;
    dllm__bind(plain, *plain.module);
    dllm__dbuf cache, kc, vc, kp, vs, q, o, o_ref, partial;
    dllm__rotation_dev rd;
    test_put(cache, test_bf16_vec(d.cache));
    test_put(kc, d.q.k_codes), test_put(vc, d.q.v_codes), test_put(kp, d.q.k_pairs);
    if (d.q.soloq()) {
        test_put(vs, d.q.v_scale);
        CHECK_STATUS(dllm__rotation_upload(d.q.rot[0], rd), DLLM_OK, nullptr);
    } else {
        test_put(vs, d.q.v_pairs);
    }
    test_put(q, test_bf16_vec(d.x));
    const size_t out_elems = (size_t)k.n_active * k.n_head * k.hd;
    kvq_args a = {};
    a.sinks = cache.as<bf16_t>(), a.fresh = cache.as<bf16_t>() + (size_t)k.n_committed * 2 * k.n_kv * k.hd,
    a.k_codes = kc.as<unsigned char>(), a.v_codes = vc.as<unsigned char>(), a.k_pairs = kp.as<unsigned short>();
    a.v_pairs = d.q.soloq() ? nullptr : vs.as<unsigned short>(), a.v_scale = d.q.soloq() ? vs.as<float>() : nullptr;
    if (d.q.soloq())
        a.perm = rd.perm.as<int>(), a.signs = (const unsigned char *)rd.signs.ptr, a.mixer = rd.mixer.as<float>();
    a.rot_b = rd.b, a.rot_k = rd.k, a.rot_norm = rd.norm;
    a.n_kv = k.n_kv, a.hd = k.hd, a.bits = d.q.bits, a.soloq = d.q.soloq(), a.n_sink = k.n_sink, a.group = k.group;
    a.q = q.as<bf16_t>(), a.q_stride = d.q_stride, a.o_stride = k.n_head * k.hd, a.n_head = k.n_head,
    a.q_rows = k.n_active;
    a.n_keys = d.n_keys, a.n_committed = k.n_committed, a.mask_block = k.mask_block, a.q_index0 = d.q_index0,
    a.scale = 1.0f / sqrtf((float)k.hd);
    test_poison(o_ref, out_elems * 2);
    a.o = o_ref.as<bf16_t>();
    CHECK_STATUS(plain.kvq_attention.launch({dim3((unsigned)k.n_active, (unsigned)k.n_head), dim3(32)}, nullptr, a),
                 DLLM_OK, nullptr);
    const std::vector<float> fp32 = test_f32_vec(test_get<uint16_t>(o_ref, out_elems));
    dllm__kvq_tc_plan p;
    CHECK_STATUS(dllm__kvq_tc_plan_for(k.hd, k.n_head, k.n_kv, k.n_active, d.n_keys, k.n_committed, k.n_sink,
                                       prop.multiProcessorCount, smem_optin, p),
                 DLLM_OK, nullptr);
    for (int own = 0; own < 2; own++) {
        dllm__kvq_tc_plan run = p;
        if (!own) dllm__kvq_tc_set_splits(run, k.split_keys, d.n_keys, k.n_committed, k.n_sink);
        const size_t bytes = dllm__kvq_tc_partial_bytes(run, k.n_head, k.n_active, k.hd);
        test_poison(partial, bytes);
        test_poison(o, out_elems * 2);
        a.o = o.as<bf16_t>();
        CHECK_STATUS(dllm__kvq_tc_launch(tc, a, run, partial.as<float>(), bytes, nullptr), DLLM_OK, nullptr);
        const std::vector<float> got = test_f32_vec(test_get<uint16_t>(o, out_elems)),
                                 twin = test_kvqtc_twin(k, d, run.split_keys);
        const double err_twin = test_max_rel(got, twin), err_fp32 = test_max_rel(got, fp32);
        printf(
            "    hd %d, %d/%d heads, %d keys, %s, %d warps x %d row tiles, %d splits of %d keys: vs twin %.2e, vs "
            "kvq_attention %.2e\n",
            k.hd, k.n_head, k.n_kv, d.n_keys, dllm__kvq_names[mode], run.warps, run.q_tiles, run.n_splits,
            run.split_keys, err_twin, err_fp32);
        CHECK_MSG(err_twin < 1e-2, "hd %d %s: kvq_flash vs its twin %.3e", k.hd, dllm__kvq_names[mode], err_twin);
        CHECK_MSG(err_fp32 < 3e-2, "hd %d %s: kvq_flash vs kvq_attention %.3e", k.hd, dllm__kvq_names[mode], err_fp32);
    }
}

TEST(gpu, kvq_flash_matches_twin_and_kvq_attention) {
    NEED_GPU();
    test_rng rng("gpu.kvq_flash_matches_twin_and_kvq_attention");
    for (const test_kvqtc_case &k : test_kvqtc_cases)
        for (int mode = DLLM_KV_QUANT_SOLOQ_KV4; mode <= DLLM_KV_QUANT_KIVI_KV2; mode++)
            test_kvqtc_gpu_case(T_, k, mode, rng);
}

/* Block-diffusion forwards over a quantised cache with kvq_tc on against the switch off (kvq_attention), forward by
 * forward (prefill, a step, the block cache, a sub-block, a commit, the next step), every mode; then whole generations:
 * the tokens may differ only where logits differ beyond bf16 rounding, so they are reported, the logits checked. The
 * bounds are gpu.kv_quant_forwards_match_cpu's (GPU against the fp32 CPU twin): after a commit, rounding differences in
 * a layer's K/V rows move codes across quantisation boundaries, more at 2 bits (the H100 measured 1.6e-2 at 4 bits and
 * 3.1e-2 at 2 bits at the step after the second commit). */
TEST(gpu, kvq_tc_forwards_match_the_switch_off) {
    NEED_GPU();
    dllm_model *m = test_load(test_data("tiny-fast-dllm-v2"));
    if (!m) { CHECK(m != nullptr); return; }
    const int B = 32, S = 8, V = m->cfg.n_vocab;
    std::vector<int32_t> ids((size_t)5 * B);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)((i * 29 + 5) % 150);
    for (int i = 2 * B + 1; i < 3 * B; i += 3) ids[(size_t)i] = m->cfg.mask_id;
    const std::vector<test_bd_fwd> script = {
        {DLLM__BD_COMMIT, 0, 2 * B, 0, B, 0, 2 * B},         {DLLM__BD_STEP, 2 * B, B, 0, B, 0, B},
        {DLLM__BD_BLOCK_FULL, 2 * B, B, 0, B, S - 1, 2 * S}, {DLLM__BD_SUB_BLOCK, 2 * B + S, S, S, 0, 0, S},
        {DLLM__BD_COMMIT, 2 * B, B, 0, B, B - 1, B},         {DLLM__BD_STEP, 3 * B, B, 0, B, 3, B}};
    for (int mode = DLLM_KV_QUANT_SOLOQ_KV4; mode <= DLLM_KV_QUANT_KIVI_KV2; mode++) {
        std::vector<float> logits[2];
        for (int tc = 0; tc < 2; tc++) {
            test_knob kvq_tc("kvq_tc", tc == 1);
            std::unique_ptr<dllm__backend_impl> g = test_kvq_gpu(m, (dllm_kv_quant)mode);
            if (!g) { CHECK(g != nullptr); continue; }
            CHECK_STATUS(test_bd_run(*g, *m, 4 * B, ids, script, logits[tc]), DLLM_OK, nullptr);
            CHECK(((dllm__gpu_backend *)g.get())->kvq_tc_active() == (tc == 1));
        }
        size_t at = 0;
        for (size_t i = 0; i < script.size() && logits[0].size() == logits[1].size(); i++) {
            const size_t n = (size_t)(script[i].r1 - script[i].r0) * V;
            std::vector<float> off(logits[0].begin() + (long)at, logits[0].begin() + (long)(at + n)),
                on(logits[1].begin() + (long)at, logits[1].begin() + (long)(at + n));
            at += n;
            const double err = test_max_rel(on, off), bound = dllm__kvq_bits(mode) == 4 ? 5e-2 : 1e-1;
            printf("    %s, forward %zu (kind %d): kvq_tc on vs off, logits max relative difference %.2e\n",
                   dllm__kvq_names[mode], i, (int)script[i].kind, err);
            CHECK_MSG(err < bound, "%s, forward %zu: %.3e", dllm__kvq_names[mode], i, err);
        }
        CHECK(logits[0].size() == logits[1].size());
    }
    // Whole generations through the public API: the tokens, reported.
    for (int mode = DLLM_KV_QUANT_SOLOQ_KV4; mode <= DLLM_KV_QUANT_KIVI_KV4; mode += 2) {
        std::vector<int32_t> out[2];
        for (int tc = 0; tc < 2; tc++) {
            test_knob kvq_tc("kvq_tc", tc == 1);
            dllm_ctx_params p = dllm_ctx_default_params();
            p.backend = DLLM_BACKEND_GPU, p.precision = DLLM_PRECISION_BF16, p.kv_quant = (dllm_kv_quant)mode;
            dllm_ctx *ctx = nullptr;
            CHECK_STATUS(dllm_ctx_create(m, p, &ctx), DLLM_OK, nullptr);
            if (!ctx) continue;
            CHECK(dllm_ctx_get_backend(ctx) == DLLM_BACKEND_GPU);
            dllm_gen_params gp = dllm_gen_default_params();
            gp.tuned_forwards = 1;  // dllm_generate's own forwards, which this test is about
            gp.gen_length = 3 * B, gp.block_length = B, gp.sub_block_length = S, gp.stop_at_eos = 0;
            out[tc].assign((size_t)gp.gen_length + 1, -1);
            int n_out = 0;
            // the prompt: two whole blocks and one token (ids[2B+1..] hold mask ids, which a prompt may not)
            CHECK_STATUS(
                dllm_generate(ctx, ids.data(), 2 * B + 1, gp, out[tc].data(), (int)out[tc].size(), &n_out, nullptr),
                DLLM_OK, nullptr);
            out[tc].resize((size_t)std::max(n_out, 0));
            dllm_ctx_free(ctx);
        }
        size_t same = 0;
        for (size_t i = 0; i < std::min(out[0].size(), out[1].size()); i++) same += out[0][i] == out[1][i];
        printf("    %s generation: %zu of %zu tokens equal with kvq_tc on and without\n", dllm__kvq_names[mode], same,
               out[0].size());
        CHECK(!out[0].empty() && out[0].size() == out[1].size());
    }
    dllm_model_free(m);
}
