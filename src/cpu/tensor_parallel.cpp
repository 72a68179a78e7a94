/* src/cpu/tensor_parallel.cpp - tensor parallelism: the sharding plan and its CPU reference. */

// ---------------------------------------------------------------------------------------------------
// 10b. [tensor parallelism]: the sharding plan, the CPU reference of a sharded forward, the
//      vocab-split token choice. Megatron-LM's split of one model over R ranks (one GPU each):
//      - Q/K/V and gate/up are column-parallel (Megatron's name for splitting Y = XA by A's columns, the output
//        features; in HF's [out, in] layout these are ROWS): rank r computes its attention heads (and the GQA K/V
//        heads they read) and its slice of the FFN width from the whole input;
//      - O and down are row-parallel (A's rows, the input features; COLUMNS of [out, in]): rank r multiplies its
//        heads' / its FFN slice's features and every rank holds a partial sum of the full output, added up by one
//        all-reduce after O and one after down per layer;
//      - the embedding and the LM head are split by vocabulary rows (Megatron's VocabParallelEmbedding: a rank
//        looks up the tokens it holds, zeros elsewhere, one all-reduce; the head's logits stay split and the sampler
//        reduces across ranks); norms and q/k/v biases of a rank's heads follow their rows, norms are replicated.
//      This section is the CPU twin that defines the numerics of the GPU's sharded forward (fp32; the all-reduce
//      sums the ranks' partials in rank order). The GPU side (NCCL through [dlopen], section 12) is not built yet.
// ---------------------------------------------------------------------------------------------------

static const int dllm__tp_max_ranks = DLLM_MAX_DEVICES;

enum dllm__tp_split {
    DLLM__TP_WHOLE,  // replicated: every rank holds the whole tensor (norms)
    DLLM__TP_ROWS,   // rows [begin, end) of HF's [out, in]: Q/K/V (+ biases), gate/up, embedding, LM head
    DLLM__TP_COLS    // columns [begin, end) of [out, in]: O and down
};

struct dllm__tp_slice {
    dllm__wspec spec;  // the whole tensor: HF name and shape
    dllm__tp_split split = DLLM__TP_WHOLE;
    int64_t begin = 0, end = 0;  // the rows (ROWS) or columns (COLS) this rank holds; WHOLE: [0, shape[0])
};

/* What one rank of R holds: its heads, FFN columns and vocabulary rows, and the slice of every weight. */
struct dllm__tp_plan {
    int n_ranks = 1, rank = 0;
    int head0 = 0, n_head = 0;  // attention heads [head0, head0 + n_head)
    int kv_head0 = 0,
        n_head_kv = 0;            // K/V heads: exactly the ones its query heads read (GQA groups never straddle ranks)
    int ff0 = 0, n_ff = 0;        // FFN width [ff0, ff0 + n_ff)
    int vocab0 = 0, n_vocab = 0;  // embedding / LM head rows [vocab0, vocab0 + n_vocab)
    std::vector<dllm__tp_slice> slices;  // one per tensor of dllm__expected_weights, in its order
};

/* Does the model's shape split over n ranks: heads, K/V heads, FFN width and vocabulary all divisible. */
static bool dllm__tp_divides(const dllm__config &c, int n) {
    return n >= 1 && c.n_head % n == 0 && c.n_head_kv % n == 0 && c.n_ff % n == 0 && c.n_vocab % n == 0;
}

/* "1, 2, 4": the device counts up to dllm__tp_max_ranks the model splits over, for error messages. */
static std::string dllm__tp_valid_counts(const dllm__config &c) {
    std::string s;
    for (int n = 1; n <= dllm__tp_max_ranks; n++)
        if (dllm__tp_divides(c, n)) s += (s.empty() ? "" : ", ") + std::to_string(n);
    return s;
}

static dllm_status dllm__tp_check_count(const dllm__config &c, int n, const char *what, int count) {
    if (count % n == 0) return DLLM_OK;
    return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                      "tensor parallelism over n_devices (--devices) %d: the model's %d %s do not split evenly over "
                      "%d ranks; device counts this model divides: %s",
                      n, count, what, n, dllm__tp_valid_counts(c).c_str());
}

/* The sharding plan of rank `rank` of n_ranks: a pure function of the config. An even split only: heads, K/V
 * heads, FFN width and vocabulary must divide by n_ranks (an error names the count that does not). */
static dllm_status dllm__tp_shard(const dllm__config &c, int n_ranks, int rank, dllm__tp_plan &plan) {
    if (n_ranks < 1 || n_ranks > dllm__tp_max_ranks)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "tensor parallelism over n_devices (--devices) %d: must be in [1, %d]", n_ranks,
                          dllm__tp_max_ranks);
    if (rank < 0 || rank >= n_ranks)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "tensor parallelism: rank %d outside [0, %d)", rank, n_ranks);
    DLLM__TRY(dllm__tp_check_count(c, n_ranks, "attention heads", c.n_head));
    DLLM__TRY(dllm__tp_check_count(c, n_ranks, "key/value heads", c.n_head_kv));
    DLLM__TRY(dllm__tp_check_count(c, n_ranks, "FFN columns (intermediate size)", c.n_ff));
    DLLM__TRY(dllm__tp_check_count(c, n_ranks, "vocabulary rows", c.n_vocab));
    plan = dllm__tp_plan();
    plan.n_ranks = n_ranks, plan.rank = rank;
    plan.n_head = c.n_head / n_ranks, plan.head0 = rank * plan.n_head;
    plan.n_head_kv = c.n_head_kv / n_ranks, plan.kv_head0 = rank * plan.n_head_kv;
    plan.n_ff = c.n_ff / n_ranks, plan.ff0 = rank * plan.n_ff;
    plan.n_vocab = c.n_vocab / n_ranks, plan.vocab0 = rank * plan.n_vocab;
    const int64_t hd = c.head_dim;
    for (const dllm__wspec &w : dllm__expected_weights(c)) {
        dllm__tp_slice s;
        s.spec = w;
        switch (w.kind) {
            case DLLM__W_Q:
            case DLLM__W_BQ:
                s.split = DLLM__TP_ROWS, s.begin = plan.head0 * hd, s.end = (plan.head0 + plan.n_head) * hd;
                break;
            case DLLM__W_K:
            case DLLM__W_V:
            case DLLM__W_BK:
            case DLLM__W_BV:
                s.split = DLLM__TP_ROWS, s.begin = plan.kv_head0 * hd, s.end = (plan.kv_head0 + plan.n_head_kv) * hd;
                break;
            case DLLM__W_O:
                s.split = DLLM__TP_COLS, s.begin = plan.head0 * hd, s.end = (plan.head0 + plan.n_head) * hd;
                break;
            case DLLM__W_GATE:
            case DLLM__W_UP: s.split = DLLM__TP_ROWS, s.begin = plan.ff0, s.end = plan.ff0 + plan.n_ff; break;
            case DLLM__W_DOWN: s.split = DLLM__TP_COLS, s.begin = plan.ff0, s.end = plan.ff0 + plan.n_ff; break;
            case DLLM__W_EMBED:
            case DLLM__W_HEAD:
                s.split = DLLM__TP_ROWS, s.begin = plan.vocab0, s.end = plan.vocab0 + plan.n_vocab;
                break;
            default: s.split = DLLM__TP_WHOLE, s.begin = 0, s.end = w.shape[0]; break;
        }
        plan.slices.push_back(s);
    }
    return DLLM_OK;
}

/* The plans of all n_ranks ranks, rank order. */
[[maybe_unused]] static dllm_status dllm__tp_shard_all(const dllm__config &c, int n_ranks,
                                                       std::vector<dllm__tp_plan> &plans) {
    plans.clear();
    dllm__tp_plan p;
    DLLM__TRY(dllm__tp_shard(c, n_ranks, 0, p));
    plans.push_back(p);
    for (int r = 1; r < n_ranks; r++) {
        DLLM__TRY(dllm__tp_shard(c, n_ranks, r, p));
        plans.push_back(p);
    }
    return DLLM_OK;
}

/* y[T][N] = x[T][K] . W[row0 + n][col0 + k]^T (+ bias[N]): one rank's block of a [out, in] weight. At row0 = col0 =
 * 0 and the whole width it is dllm__cpu_linear, bit for bit (the same dot, the same order). */
static void dllm__tp_cpu_linear(dllm__pool &pool, const float *x, int T, int K, const dllm__tensor &W, int64_t row0,
                                int64_t col0, const float *bias, int N, float *y) {
    const int64_t width = W.shape[1];
    dllm__cpu_linear_rows(
        pool, x, T, K,
        [&](int n, float *dst) {
            for (int k = 0; k < K; k++) dst[k] = dllm__tensor_at(W, (row0 + n) * width + col0 + k);
        },
        bias, N, y);
}

/* The all-reduce (sum) this reference defines: out = ((p_0 + p_1) + p_2) + ..., in rank order, fp32. NCCL sums in
 * another order: its ring starts each chunk at another rank, its tree pairs ranks differently. Two ranks give the
 * same bits in any order (fp32 addition commutes); from three on the association differs, so the GPU's sums can
 * differ from this in the last bits, and tokens equal TP=1's except where two candidates are within that rounding
 * (near-ties), the same caveat as every GPU-vs-CPU comparison. */
static void dllm__tp_all_reduce(const std::vector<const float *> &partials, size_t n, float *out) {
    memcpy(out, partials[0], n * sizeof(float));
    for (size_t r = 1; r < partials.size(); r++)
        for (size_t i = 0; i < n; i++) out[i] += partials[r][i];
}

/* One emulated rank's working memory. */
struct dllm__tp_rank_buffers {
    std::vector<float> q, k, v, att, gate, up, partial;
};

/* Rank p's attention partial: partial[T][d] = O[:, its heads] . attention(its heads of RoPE(QKV(a))). Column-parallel
 * Q/K/V: each head's numbers are those of the unsharded forward, bit for bit; only O's sum over heads is split. */
static void dllm__tp_cpu_attention_partial(const dllm_model &m, size_t layer, const dllm__tp_plan &p, dllm__pool &pool,
                                           const float *a, int T, const int32_t *pos, const float *cos_t,
                                           const float *sin_t, dllm__tp_rank_buffers &rb) {
    const dllm__config &c = m.cfg;
    const dllm__layer_weights &L = m.layers[layer];
    const int d = c.n_embd, hd = c.head_dim, qd = p.n_head * hd, kvd = p.n_head_kv * hd;
    const int64_t q0 = (int64_t)p.head0 * hd, kv0 = (int64_t)p.kv_head0 * hd;
    rb.q.resize((size_t)T * qd), rb.att.resize((size_t)T * qd), rb.k.resize((size_t)T * kvd),
        rb.v.resize((size_t)T * kvd);
    rb.partial.resize((size_t)T * d);
    auto bias = [](const std::vector<float> &b, int64_t at) { return b.empty() ? nullptr : b.data() + at; };
    dllm__tp_cpu_linear(pool, a, T, d, *L.wq, q0, 0, bias(L.bq, q0), qd, rb.q.data());
    dllm__tp_cpu_linear(pool, a, T, d, *L.wk, kv0, 0, bias(L.bk, kv0), kvd, rb.k.data());
    dllm__tp_cpu_linear(pool, a, T, d, *L.wv, kv0, 0, bias(L.bv, kv0), kvd, rb.v.data());
    dllm__cpu_rope(rb.q.data(), T, p.n_head, hd, pos, cos_t, sin_t);
    dllm__cpu_rope(rb.k.data(), T, p.n_head_kv, hd, pos, cos_t, sin_t);
    dllm__cpu_attention(pool, rb.q.data(), rb.k.data(), rb.v.data(), T, T, p.n_head, p.n_head_kv, hd, nullptr,
                        rb.att.data());
    dllm__tp_cpu_linear(pool, rb.att.data(), T, qd, *L.wo, 0, q0, nullptr, d, rb.partial.data());
}

/* Rank p's MLP partial: partial[T][d] = down[:, its columns] . (silu(gate_p(a)) * up_p(a)). */
static void dllm__tp_cpu_ffn_partial(const dllm_model &m, size_t layer, const dllm__tp_plan &p, dllm__pool &pool,
                                     const float *a, int T, dllm__tp_rank_buffers &rb) {
    const dllm__layer_weights &L = m.layers[layer];
    const int d = m.cfg.n_embd, ff = p.n_ff;
    rb.gate.resize((size_t)T * ff), rb.up.resize((size_t)T * ff), rb.partial.resize((size_t)T * d);
    dllm__tp_cpu_linear(pool, a, T, d, *L.gate, p.ff0, 0, nullptr, ff, rb.gate.data());
    dllm__tp_cpu_linear(pool, a, T, d, *L.up, p.ff0, 0, nullptr, ff, rb.up.data());
    for (size_t i = 0; i < (size_t)T * ff; i++) rb.gate[i] = dllm__silu(rb.gate[i]) * rb.up[i];
    dllm__tp_cpu_linear(pool, rb.gate.data(), T, ff, *L.down, 0, p.ff0, nullptr, d, rb.partial.data());
}

/* The all-reduce of the ranks' partials into out[n]. */
static void dllm__tp_all_reduce_partials(const std::vector<dllm__tp_rank_buffers> &rb, size_t n, float *out) {
    std::vector<const float *> parts;
    for (const dllm__tp_rank_buffers &r : rb) parts.push_back(r.partial.data());
    dllm__tp_all_reduce(parts, n, out);
}

/* h[n] += the all-reduce of the ranks' partials (the residual add after O and after down). */
static void dllm__tp_add_all_reduced(const std::vector<dllm__tp_rank_buffers> &rb, size_t n, std::vector<float> &sum,
                                     float *h) {
    sum.resize(n);
    dllm__tp_all_reduce_partials(rb, n, sum.data());
    for (size_t i = 0; i < n; i++) h[i] += sum[i];
}

/* The vocab-parallel embedding into h[T][d]: rank p writes the rows of the tokens it holds and zeros elsewhere; the
 * all-reduce leaves every row the one rank's row (x + 0 = x), so h equals the unsharded lookup. */
static void dllm__tp_cpu_embed(const dllm_model &m, const std::vector<dllm__tp_plan> &plans, const int32_t *ids, int T,
                               std::vector<dllm__tp_rank_buffers> &rb, float *h) {
    const int d = m.cfg.n_embd;
    for (size_t r = 0; r < plans.size(); r++) {
        rb[r].partial.assign((size_t)T * d, 0.0f);
        for (int t = 0; t < T; t++)
            if (ids[t] >= plans[r].vocab0 && ids[t] < plans[r].vocab0 + plans[r].n_vocab)
                dllm__tensor_row(*m.embed, ids[t], d, rb[r].partial.data() + (size_t)t * d);
    }
    dllm__tp_all_reduce_partials(rb, (size_t)T * d, h);
}

/* The CPU reference of the tensor-parallel forward: the plain bidirectional forward of ids[0..n) (every row, fresh
 * keys, the exact precision of an unquantised checkpoint), each rank of `plans` emulated in turn, the all-reduces
 * after O and after down summed in rank order (dllm__tp_all_reduce). Writes the unshifted output rows [r0, r1):
 * logits[row][v], each rank its own vocabulary columns (the layout an all-gather would give; the sampler needs no
 * gather, dllm__tp_choose). One rank is dllm__cpu_forward bit for bit. */
[[maybe_unused]] static void dllm__tp_cpu_forward(const dllm_model &m, const std::vector<dllm__tp_plan> &plans,
                                                  dllm__pool &pool, const int32_t *ids, int n, const float *cos_t,
                                                  const float *sin_t, int r0, int r1, float *logits) {
    const dllm__config &c = m.cfg;
    const int d = c.n_embd, rows = r1 - r0;
    std::vector<float> h((size_t)n * d), a((size_t)n * d), sum;
    std::vector<int32_t> pos((size_t)n);
    for (int t = 0; t < n; t++) pos[(size_t)t] = t;
    std::vector<dllm__tp_rank_buffers> rb(plans.size());
    dllm__tp_cpu_embed(m, plans, ids, n, rb, h.data());
    for (size_t l = 0; l < m.layers.size(); l++) {
        dllm__cpu_rmsnorm(h.data(), n, d, m.layers[l].attn_norm.data(), c.norm_eps,
                          a.data());  // replicated: every rank the same bits
        for (size_t r = 0; r < plans.size(); r++)
            dllm__tp_cpu_attention_partial(m, l, plans[r], pool, a.data(), n, pos.data(), cos_t, sin_t, rb[r]);
        dllm__tp_add_all_reduced(rb, (size_t)n * d, sum, h.data());
        dllm__cpu_rmsnorm(h.data(), n, d, m.layers[l].ffn_norm.data(), c.norm_eps, a.data());
        for (size_t r = 0; r < plans.size(); r++) dllm__tp_cpu_ffn_partial(m, l, plans[r], pool, a.data(), n, rb[r]);
        dllm__tp_add_all_reduced(rb, (size_t)n * d, sum, h.data());
    }
    dllm__cpu_rmsnorm(h.data() + (size_t)r0 * d, rows, d, m.final_norm.data(), c.norm_eps, a.data());
    const float scale = c.scale_logits ? 1.0f / sqrtf((float)d) : 1.0f;
    for (const dllm__tp_plan &p : plans) {
        std::vector<float> part((size_t)rows * p.n_vocab);
        dllm__tp_cpu_linear(pool, a.data(), rows, d, *m.head, p.vocab0, 0, nullptr, p.n_vocab, part.data());
        for (int t = 0; t < rows; t++)
            for (int v = 0; v < p.n_vocab; v++) {
                float l = part[(size_t)t * p.n_vocab + v];
                logits[(size_t)t * c.n_vocab + p.vocab0 + v] = c.scale_logits ? l * scale : l;
            }
    }
}

/* One rank's share of dllm__choose's first pass over its vocabulary slice, and the merge of two ranks' shares. */
struct dllm__tp_best {
    double score = -INFINITY;                               // the winner's argmax / Gumbel-max score
    int32_t token = 0;                                      // its global vocabulary index
    float logit = -INFINITY;                                // its (filtered) logit
    float max_logit = -INFINITY, second_logit = -INFINITY;  // a tie for the largest counts twice, as in dllm__choose
};

static dllm__tp_best dllm__tp_rank_best(const float *logits, const dllm__tp_plan &p, const dllm__sampling &s,
                                        uint32_t pos, uint32_t step) {
    auto logit = [&](int i) { return s.eos_logit_inf && p.vocab0 + i == s.eos_id ? -INFINITY : logits[i]; };
    dllm__tp_best b;
    int best = 0;
    for (int i = 0; i < p.n_vocab; i++) {
        const float l = logit(i);
        b.second_logit = std::max(b.second_logit, l > b.max_logit ? b.max_logit : l);
        if (l > b.max_logit) b.max_logit = l;
        double score = l;
        if (s.temperature > 0)
            score = dllm__gumbel_key(l, s.temperature,
                                     dllm__uniform(s.seed, (uint32_t)(p.vocab0 + i), pos, step, DLLM__RNG_GUMBEL));
        if (score > b.score) b.score = score, best = i;
    }
    b.token = p.vocab0 + best, b.logit = logit(best);
    return b;
}

/* a from the lower rank (lower indices), b from the next: b wins only with a strictly larger score, so ties go to the
 * lower index as in dllm__choose. max/second merge exactly: the second largest of the union is the larger of the two
 * seconds and the smaller of the two maxima. */
static dllm__tp_best dllm__tp_best_merge(const dllm__tp_best &a, const dllm__tp_best &b) {
    dllm__tp_best m = b.score > a.score ? b : a;
    m.max_logit = std::max(a.max_logit, b.max_logit);
    m.second_logit = std::max(std::max(a.second_logit, b.second_logit), std::min(a.max_logit, b.max_logit));
    return m;
}

/* dllm__choose over a vocabulary split across ranks: rank_logits[r] holds rank r's n_vocab logits of the row. Two
 * reductions, as the GPU's would be: (best, max, second) merged in rank order (exact: the token, the max and the
 * second equal the unsharded ones given the same logits), then the softmax sums z, zx of each rank's slice added in
 * rank order (float64; the association differs from one pass over the row, so the confidence may differ in the last
 * bits). The sampler filters need a cross-rank cutoff that is not built: DLLM_ERR_UNSUPPORTED. */
[[maybe_unused]] static dllm_status dllm__tp_choose(const std::vector<const float *> &rank_logits,
                                                    const std::vector<dllm__tp_plan> &plans, const dllm__sampling &s,
                                                    uint32_t pos, uint32_t step, dllm__choice &out) {
    if (s.filters())
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "tensor parallelism: top-k / top-p / min-p across ranks are not built yet");
    dllm__tp_best best = dllm__tp_rank_best(rank_logits[0], plans[0], s, pos, step);
    for (size_t r = 1; r < plans.size(); r++)
        best = dllm__tp_best_merge(best, dllm__tp_rank_best(rank_logits[r], plans[r], s, pos, step));
    const double inv_t = s.tempered_conf && s.temperature > 0 ? 1.0 / s.temperature : 1.0;
    double z = 0, zx = 0;
    for (size_t r = 0; r < plans.size(); r++) {
        double zr = 0, zxr = 0;
        for (int i = 0; i < plans[r].n_vocab; i++) {
            const int v = plans[r].vocab0 + i;
            const float l = s.eos_logit_inf && v == s.eos_id ? -INFINITY : rank_logits[r][i];
            double x = ((double)l - best.max_logit) * inv_t, e = exp(x);
            zr += e;
            if (e > 0) zxr += e * x;
        }
        z += zr, zx += zxr;
    }
    out.token = best.token;
    out.conf = dllm__confidence(s, z, zx, ((double)best.logit - best.max_logit) * inv_t,
                                ((double)best.second_logit - best.max_logit) * inv_t, pos, step);
    out.deferred = s.defer_eos_eot && (best.token == s.eos_id || best.token == s.eot_id);
    return DLLM_OK;
}

/* dllm_ctx_params' device list: n_devices in [0, DLLM_MAX_DEVICES], the devices distinct and non-negative, and a count
 * the model splits over (dllm__tp_shard). Whether the devices exist is the GPU backend's check. */
static dllm_status dllm__tp_check_params(const dllm__config &c, const dllm_ctx_params &p) {
    if (p.n_devices < 0 || p.n_devices > DLLM_MAX_DEVICES)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "dllm_ctx_create: n_devices (--devices) %d must be in [0, %d] (0 = one GPU, "
                          "dllm_ctx_params.device)",
                          p.n_devices, DLLM_MAX_DEVICES);
    for (int i = 0; i < p.n_devices; i++) {
        if (p.devices[i] < 0)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "dllm_ctx_create: devices[%d] = %d must be a CUDA device ordinal (>= 0)", i,
                              p.devices[i]);
        for (int j = 0; j < i; j++)
            if (p.devices[j] == p.devices[i])
                return dllm__fail(
                    DLLM_ERR_INVALID_ARGUMENT,
                    "dllm_ctx_create: devices[%d] and devices[%d] are both CUDA device %d: each GPU holds one rank, "
                    "list it once",
                    j, i, p.devices[i]);
    }
    dllm__tp_plan plan;
    return p.n_devices > 1 ? dllm__tp_shard(c, p.n_devices, 0, plan) : DLLM_OK;
}
