/* src/cpu/block_diffusion.cpp - the block-causal CPU forward over a committed K/V cache, with FACache. */

/* ---- [FACache] on block diffusion (LaCache, lacache.md 1, on the committed-block cache) ----------------------
 * Inside a block the committed cache does not change, so layer 0's attention state of a block row over it (per
 * head: the running max m, the normaliser l, the unnormalised accumulator O) depends only on the row's query,
 * i.e. on its token and its RoPE position. Block-diffusion attention (dllm__cpu_bd_attend) therefore computes every
 * row's softmax in two parts, the committed keys then the forward's own keys (fresh K/V or the block cache), and
 * merges them as FlashAttention merges two tiles; the cached path keeps layer 0's committed part of each block row,
 * with the row's layer-0 Q/K/V (RoPECache; the embedding is a row copy on the CPU, nothing to cache), and reuses
 * them while the row's token is unchanged. Cached and uncached runs do the same two parts and the same merge, so
 * they give the same bits by construction. */
struct dllm__bd_facache {
    int n = -1;                         // committed rows the held states were computed over (-1: none held)
    unsigned epoch = 0;                 // dllm__bd_kv::epoch they were computed under
    std::vector<int32_t> token;         // [block offset] the row's token, -1: nothing held
    std::vector<float> q, k, v;         // [block offset][n_head * hd] / [n_head_kv * hd]: layer 0's Q (RoPE and query
                                        // scaling applied), K (RoPE applied) and V
    std::vector<double> m, l, acc;      // [block offset][n_head] and [block offset][n_head][hd]: the committed part
    dllm__cpu_buffers scratch;          // the changed rows' layer-0 Q/K/V, computed apart
    int64_t rows = 0, rows_reused = 0;  // layer-0 rows a cached forward needed the state of; of those, reused

    /* Drops what was computed over another committed cache; grows to `offsets` block rows. */
    void fit(const dllm__config &c, int n_committed, unsigned kv_epoch, int offsets) {
        const size_t qd = (size_t)c.n_head * c.head_dim, kvd = (size_t)c.n_head_kv * c.head_dim;
        if (n != n_committed || epoch != kv_epoch) std::fill(token.begin(), token.end(), -1);
        n = n_committed, epoch = kv_epoch;
        if ((int)token.size() >= offsets) return;
        token.resize((size_t)offsets, -1);
        q.resize((size_t)offsets * qd), k.resize((size_t)offsets * kvd), v.resize(k.size());
        m.resize((size_t)offsets * c.n_head), l.resize(m.size()), acc.resize((size_t)offsets * qd);
    }
};

/* Keys and values of block diffusion on the CPU, per layer: the committed rows [0, n), then scratch rows
 * where a forward puts the rows it attends to beyond the cache (its fresh K/V, or the block cache). */
struct dllm__bd_kv {
    int n = 0, cap = 0;                   // committed rows; rows per layer
    std::vector<float> k, v;              // [layer][cap][n_head_kv * head_dim]
    int block_rows = 0;                   // rows of the block cache (0: none)
    std::vector<float> block_k, block_v;  // Fast-dLLM v2's block cache, [layer][block_rows][kvd]
    unsigned epoch = 0;                   // bumped whenever committed rows may change (reset, commit): [FACache]'s key
    dllm__bd_facache fa;                  // [FACache]: layer 0's per-row state over the committed rows

    void reset(const dllm__config &c, int rows) {
        n = 0, cap = rows, block_rows = 0, epoch++;
        k.assign((size_t)c.n_layer * rows * c.n_head_kv * c.head_dim, 0.0f);
        v.assign(k.size(), 0.0f);
        fa.rows = fa.rows_reused = 0;
    }
};

/* What one forward of the block-diffusion schedule does with its rows' K/V. */
enum dllm__bd_kind {
    DLLM__BD_STEP,        // attend to cache ++ fresh, discard (a diffusion step without the block cache)
    DLLM__BD_COMMIT,      // attend to cache ++ fresh, append fresh to the cache (prefill, a finished block)
    DLLM__BD_BLOCK_FULL,  // attend to cache ++ fresh, keep fresh as the block cache (block-cache refresh)
    DLLM__BD_SUB_BLOCK    // write fresh into the block cache at `offset`, attend to cache ++ block cache, no mask
};

struct dllm__bd_call {
    dllm__bd_kind kind = DLLM__BD_STEP;
    const int32_t *ids = nullptr;
    int T = 0;             // rows forwarded
    int offset = 0;        // SUB_BLOCK: the rows' offset in the block (RoPE position n + offset + i)
    int mask_block = 0;    // block-causal granularity Bm (0: no mask)
    int r0 = 0, r1 = 0;    // the raw (unshifted) output rows wanted, within [0, T)
    int kv_group = 0;      // COMMIT under kv_quant: rows per key group, the generation's block (0: the model's bd_size)
    bool lacache = false;  // [FACache]: reuse layer 0's per-row work of unchanged rows (dllm_gen_params.lacache == ON)
};

/* The softmax state of query qi over keys [j0, j1) of kv head kvh, in double, keys in ascending order: m the
 * max score, l the sum of exp(s - m), acc the sum of exp(s - m) v (m = -inf, l = 0, acc = 0 over no key).
 * Scores as dllm__cpu_attention computes them. p: scratch of at least j1 entries. */
static void dllm__cpu_softmax_part(const float *qi, const float *k, const float *v, int j0, int j1, int n_kv, int kvh,
                                   int hd, float scale, double *p, double &m, double &l, double *acc) {
    m = -INFINITY, l = 0;
    for (int c = 0; c < hd; c++) acc[c] = 0;
    for (int j = j0; j < j1; j++) {
        p[j] = (double)(dllm__dot(qi, k + ((size_t)j * n_kv + kvh) * hd, hd) * scale);
        m = std::max(m, p[j]);
    }
    for (int j = j0; m > -INFINITY && j < j1; j++) {
        double e = exp(p[j] - m);
        l += e;
        const float *vj = v + ((size_t)j * n_kv + kvh) * hd;
        for (int c = 0; c < hd; c++) acc[c] += e * vj[c];
    }
}

/* (m1, l1, acc1) := the merged state of two parts, with dllm__softmax_merge's arithmetic before its division. */
static void dllm__softmax_merge_into(double &m1, double &l1, double *acc1, double m2, double l2, const double *acc2,
                                     int hd) {
    const double mx = std::max(m1, m2);
    if (mx == -INFINITY) return;
    const double a1 = m1 == -INFINITY ? 0.0 : exp(m1 - mx), a2 = m2 == -INFINITY ? 0.0 : exp(m2 - mx);
    l1 = l1 * a1 + l2 * a2;
    for (int c = 0; c < hd; c++) acc1[c] = acc1[c] * a1 + acc2[c] * a2;
    m1 = mx;
}

/* dllm__cpu_softmax_part over keys [j0, j1) taken one key block at a time (blocks of key_block keys from key 0,
 * merged left to right), so that a prefix of whole blocks has the same state whether it is a part of its own or
 * the start of a longer one: LLaDA2's committed-block cache then gives the bits of the uncached forward. acc2:
 * scratch of hd entries. */
static void dllm__cpu_softmax_blocks(const float *qi, const float *k, const float *v, int j0, int j1, int key_block,
                                     int n_kv, int kvh, int hd, float scale, double *p, double &m, double &l,
                                     double *acc, double *acc2) {
    m = -INFINITY, l = 0;
    for (int c = 0; c < hd; c++) acc[c] = 0;
    for (int b0 = j0; b0 < j1;) {
        const int b1 = std::min(j1, (b0 / key_block + 1) * key_block);
        double m2, l2;
        dllm__cpu_softmax_part(qi, k, v, b0, b1, n_kv, kvh, hd, scale, p, m2, l2, acc2);
        dllm__softmax_merge_into(m, l, acc, m2, l2, acc2, hd);
        b0 = b1;
    }
}

/* out = the softmax average of two parts' states (FlashAttention's merge of two tiles); 0 where no key was seen. */
static void dllm__softmax_merge(double m1, double l1, const double *acc1, double m2, double l2, const double *acc2,
                                int hd, float *out) {
    const double mx = std::max(m1, m2);
    if (mx == -INFINITY) {
        for (int c = 0; c < hd; c++) out[c] = 0.0f;
        return;
    }
    const double a1 = m1 == -INFINITY ? 0.0 : exp(m1 - mx), a2 = m2 == -INFINITY ? 0.0 : exp(m2 - mx);
    const double l = l1 * a1 + l2 * a2;
    for (int c = 0; c < hd; c++) out[c] = (float)((acc1[c] * a1 + acc2[c] * a2) / l);
}

/* Where a forward's layer-0 committed states live (dllm__cpu_bd_attend): per query row of the forward, m and l
 * [n_head], acc [n_head][hd]; `reuse` (nullable) marks rows whose state is read, the others are computed and
 * written. Null m: computed and dropped (other layers, lacache off). */
struct dllm__bd_states {
    double *m = nullptr, *l = nullptr, *acc = nullptr;
    const uint8_t *reuse = nullptr;
};

/* Block diffusion's attention: dllm__cpu_attention's function (block-causal at mask_block from sequence index
 * q_index0, no key mask) split at the committed cache: each row's state over keys [0, n_committed) (all of them
 * visible to every row, which sits at or after n_committed), then over the keys [n_committed, n_visible) of the
 * forward itself, merged by dllm__softmax_merge. With no committed key it is dllm__cpu_attention's result bit for
 * bit (the merge multiplies by exp(0) = 1). */
static void dllm__cpu_bd_attend(dllm__pool &pool, const float *q, const float *k, const float *v, int Tq,
                                int n_committed, int Tk, int n_head, int n_kv, int hd, float *out, int q_index0,
                                int mask_block, const dllm__bd_states &states, int key_block = 0) {
    const int group = n_head / n_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    pool.run(n_head, [&](int h) {
        const int kvh = h / group;
        std::vector<double> p((size_t)Tk), acc_c((size_t)hd), acc_f((size_t)hd), acc_b((size_t)hd);
        auto part = [&](const float *qi, int j0, int j1, double &m, double &l, double *acc) {
            if (key_block > 0)
                dllm__cpu_softmax_blocks(qi, k, v, j0, j1, key_block, n_kv, kvh, hd, scale, p.data(), m, l, acc,
                                         acc_b.data());
            else
                dllm__cpu_softmax_part(qi, k, v, j0, j1, n_kv, kvh, hd, scale, p.data(), m, l, acc);
        };
        for (int i = 0; i < Tq; i++) {
            const float *qi = q + ((size_t)i * n_head + h) * hd;
            const int n_visible = mask_block ? std::min(Tk, ((q_index0 + i) / mask_block + 1) * mask_block) : Tk;
            const size_t at = (size_t)i * n_head + h;
            double mc, lc, mf, lf;
            double *acc = states.m ? states.acc + at * hd : acc_c.data();
            if (states.m && states.reuse && states.reuse[i]) {
                mc = states.m[at], lc = states.l[at];
            } else {
                part(qi, 0, std::min(n_committed, n_visible), mc, lc, acc);
                if (states.m) states.m[at] = mc, states.l[at] = lc;
            }
            part(qi, std::min(n_committed, n_visible), n_visible, mf, lf, acc_f.data());
            dllm__softmax_merge(mc, lc, acc, mf, lf, acc_f.data(), hd, out + at * hd);
        }
    });
}

/* [FACache] Layer 0's Q/K/V of the forward's rows into b.q, b.k, b.v: a row whose token kv.fa holds at its block
 * offset (same committed cache, so same position) is copied from it and marked in reuse; the others are computed
 * apart, in fa.scratch (every op of dllm__cpu_qkv and the query scaling is row-wise, so the bits are those of the
 * whole forward's), and kept. Counts the rows for dllm_gen_stats. */
static void dllm__cpu_bd_qkv_cached(const dllm_model &m, const dllm__fp8_layer *q8, dllm__pool &pool,
                                    dllm__cpu_buffers &b, dllm__bd_kv &kv, const dllm__bd_call &call,
                                    const float *cos_t, const float *sin_t, std::vector<uint8_t> &reuse) {
    const dllm__config &c = m.cfg;
    const int T = call.T;
    const size_t d = (size_t)c.n_embd, qd = (size_t)c.n_head * c.head_dim, kvd = (size_t)c.n_head_kv * c.head_dim;
    dllm__bd_facache &fa = kv.fa;
    fa.fit(c, kv.n, kv.epoch, call.offset + T);
    reuse.assign((size_t)T, 0);
    std::vector<int> changed;
    for (int t = 0; t < T; t++) {
        reuse[(size_t)t] = fa.token[(size_t)(call.offset + t)] == call.ids[t];
        if (!reuse[(size_t)t]) changed.push_back(t);
    }
    const int n_changed = (int)changed.size();
    dllm__cpu_buffers &s = fa.scratch;
    s.fit(c, std::max(n_changed, 1));
    for (int i = 0; i < n_changed; i++) {
        memcpy(s.h.data() + (size_t)i * d, b.h.data() + (size_t)changed[(size_t)i] * d, sizeof(float) * d);
        s.pos[(size_t)i] = b.pos[(size_t)changed[(size_t)i]];
    }
    if (n_changed > 0) {
        dllm__cpu_qkv(m, 0, q8, pool, s, n_changed, cos_t, sin_t);
        dllm__cpu_llama4_scale(c, s.q.data(), n_changed, s.pos.data());
    }
    for (int i = 0; i < n_changed; i++) {
        const size_t o = (size_t)(call.offset + changed[(size_t)i]);
        memcpy(fa.q.data() + o * qd, s.q.data() + (size_t)i * qd, sizeof(float) * qd);
        memcpy(fa.k.data() + o * kvd, s.k.data() + (size_t)i * kvd, sizeof(float) * kvd);
        memcpy(fa.v.data() + o * kvd, s.v.data() + (size_t)i * kvd, sizeof(float) * kvd);
        fa.token[o] = call.ids[changed[(size_t)i]];
    }
    const size_t o0 = (size_t)call.offset;
    memcpy(b.q.data(), fa.q.data() + o0 * qd, sizeof(float) * qd * T);
    memcpy(b.k.data(), fa.k.data() + o0 * kvd, sizeof(float) * kvd * T);
    memcpy(b.v.data(), fa.v.data() + o0 * kvd, sizeof(float) * kvd * T);
    fa.rows += T;
    fa.rows_reused += T - n_changed;
}

/* Attention half of a block-diffusion layer (see dllm__bd_kind), then o_proj and the residual. Layer 0 of a forward
 * over a non-empty committed cache under call.lacache takes [FACache]'s held Q/K/V and committed states. */
static void dllm__cpu_bd_attention(const dllm_model &m, size_t layer, const dllm__fp8_layer *q8, dllm__pool &pool,
                                   dllm__cpu_buffers &b, dllm__bd_kv &kv, const dllm__bd_call &call, const float *cos_t,
                                   const float *sin_t) {
    const dllm__config &c = m.cfg;
    const int T = call.T, kvd = c.n_head_kv * c.head_dim;
    const bool cached = call.lacache && layer == 0 && kv.n > 0;
    std::vector<uint8_t> reuse;
    dllm__bd_states states;
    if (cached) {
        dllm__cpu_bd_qkv_cached(m, q8, pool, b, kv, call, cos_t, sin_t, reuse);
        const size_t o = (size_t)call.offset;
        states.m = kv.fa.m.data() + o * c.n_head, states.l = kv.fa.l.data() + o * c.n_head;
        states.acc = kv.fa.acc.data() + o * c.n_head * c.head_dim, states.reuse = reuse.data();
    } else {
        dllm__cpu_qkv(m, layer, q8, pool, b, T, cos_t, sin_t);
        dllm__cpu_llama4_scale(c, b.q.data(), T, b.pos.data());
    }
    float *kc = kv.k.data() + layer * kv.cap * kvd, *vc = kv.v.data() + layer * kv.cap * kvd;
    const size_t row_bytes = sizeof(float) * kvd;
    int n_keys = kv.n + T;
    if (call.kind == DLLM__BD_SUB_BLOCK) {
        float *bkc = kv.block_k.data() + layer * kv.block_rows * kvd,
              *bvc = kv.block_v.data() + layer * kv.block_rows * kvd;
        memcpy(bkc + (size_t)call.offset * kvd, b.k.data(),
               row_bytes * T);  // the overwrite persists (block-diffusion.md)
        memcpy(bvc + (size_t)call.offset * kvd, b.v.data(), row_bytes * T);
        memcpy(kc + (size_t)kv.n * kvd, bkc, row_bytes * kv.block_rows);
        memcpy(vc + (size_t)kv.n * kvd, bvc, row_bytes * kv.block_rows);
        n_keys = kv.n + kv.block_rows;
    } else {
        memcpy(kc + (size_t)kv.n * kvd, b.k.data(), row_bytes * T);
        memcpy(vc + (size_t)kv.n * kvd, b.v.data(), row_bytes * T);
        if (call.kind == DLLM__BD_BLOCK_FULL) {
            memcpy(kv.block_k.data() + layer * T * kvd, b.k.data(), row_bytes * T);
            memcpy(kv.block_v.data() + layer * T * kvd, b.v.data(), row_bytes * T);
        }
    }
    const int key_block = c.family == DLLM_FAMILY_LLADA2 ? call.mask_block : 0;  // the committed-block cache's bits
    dllm__cpu_bd_attend(pool, b.q.data(), kc, vc, T, kv.n, n_keys, c.n_head, c.n_head_kv, c.head_dim, b.att.data(),
                        kv.n + call.offset, call.mask_block, states, key_block);
    dllm__cpu_out_proj(m, layer, q8, pool, b, T);
}

/* One forward of the block-diffusion schedule over call.T rows; writes the raw logits of rows [r0, r1).
 * The caller sizes kv (kv.n + rows <= kv.cap). */
static void dllm__cpu_bd_forward(const dllm_model &m, dllm__pool &pool, dllm__cpu_buffers &b, dllm__bd_kv &kv,
                                 const dllm__bd_call &call, const float *cos_t, const float *sin_t, float *logits,
                                 const std::vector<dllm__fp8_layer> &fp8, const dllm__soloq_layer *head = nullptr) {
    const dllm__config &c = m.cfg;
    const int d = c.n_embd, T = call.T, kvd = c.n_head_kv * c.head_dim;
    b.fit(c, T);
    for (int t = 0; t < T; t++) {
        b.pos[(size_t)t] = kv.n + call.offset + t;
        dllm__tensor_row(*m.embed, call.ids[t], d, b.h.data() + (size_t)t * d);
    }
    if (call.kind == DLLM__BD_BLOCK_FULL) {
        kv.block_rows = T;
        kv.block_k.assign((size_t)c.n_layer * T * kvd, 0.0f);
        kv.block_v.assign(kv.block_k.size(), 0.0f);
    }
    for (size_t l = 0; l < m.layers.size(); l++) {
        const dllm__fp8_layer *q8 = l < fp8.size() ? &fp8[l] : nullptr;
        dllm__cpu_bd_attention(m, l, q8, pool, b, kv, call, cos_t, sin_t);
        dllm__cpu_ffn_block(m, l, q8, pool, b, T);
    }
    if (call.kind == DLLM__BD_COMMIT) kv.n += T, kv.epoch++;
    dllm__cpu_rmsnorm(b.h.data() + (size_t)call.r0 * d, call.r1 - call.r0, d, m.final_norm.data(), c.norm_eps,
                      b.a.data());
    dllm__cpu_lm_head(m, pool, b, call.r1 - call.r0, head, logits);
}
