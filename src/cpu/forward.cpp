/* src/cpu/forward.cpp - the CPU fp32 reference forward: linear, RMSNorm, RoPE, attention. */

// ---------------------------------------------------------------------------------------------------
// 9. CPU fp32 reference forward
//    Follows the HF modeling code op for op (models.md 1.3, 2.2): RMSNorm in fp32 with the weight
//    applied after normalising, rotate-half RoPE with float32 angles, bidirectional softmax attention
//    with an optional key-padding mask, SwiGLU, untied head. Clarity over speed; the matmul splits
//    output features across threads and keeps one summation order, so it is deterministic.
// ---------------------------------------------------------------------------------------------------

/* Eight independent partial sums: vectorisable without -ffast-math, same order every call. */
static inline float dllm__dot(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* y[T][N] = x[T][K] . W[N][K]^T (+ bias[N]), with row n of W decoded by weight_row(n, dst) into fp32. */
template <class RowFn>
static void dllm__cpu_linear_rows(dllm__pool &pool, const float *x, int T, int K, const RowFn &weight_row,
                                  const float *bias, int N, float *y) {
    const int rows_per_task = 16;
    pool.run((N + rows_per_task - 1) / rows_per_task, [&](int task) {
        std::vector<float> w((size_t)K);
        int n_end = std::min(N, (task + 1) * rows_per_task);
        for (int n = task * rows_per_task; n < n_end; n++) {
            weight_row(n, w.data());
            float b = bias ? bias[n] : 0.0f;
            for (int t = 0; t < T; t++) y[(size_t)t * N + n] = dllm__dot(x + (size_t)t * K, w.data(), K) + b;
        }
    });
}

/* y[T][N] = x[T][K] . W[N][K]^T (+ bias[N]). W may be BF16, F16 or F32. */
static void dllm__cpu_linear(dllm__pool &pool, const float *x, int T, int K, const dllm__tensor &W, const float *bias,
                             int N, float *y) {
    dllm__cpu_linear_rows(
        pool, x, T, K, [&](int n, float *dst) { dllm__tensor_row(W, n, K, dst); }, bias, N, y);
}

/* y = x * rsqrt(mean(x^2) + eps) * w, row by row. */
static void dllm__cpu_rmsnorm(const float *x, int T, int d, const float *w, float eps, float *y) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * d;
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
        float r = (float)(1.0 / sqrt(ss / d + (double)eps));
        for (int i = 0; i < d; i++) y[(size_t)t * d + i] = (xr[i] * r) * w[i];
    }
}

/* RoPE's inverse frequencies theta^(-2j/d) in float32, as HF computes them. */
static std::vector<float> dllm__rope_inv_freq_plain(float theta, int head_dim) {
    const int half = head_dim / 2;
    std::vector<float> inv((size_t)half);
    for (int j = 0; j < half; j++) inv[(size_t)j] = 1.0f / powf(theta, (float)(2 * j) / (float)head_dim);
    return inv;
}

/* cos/sin tables [n_pos][inv.size()] in float32 (angle pos * inv_freq, as HF), each value times factor (YaRN's
 * attention factor; 1 leaves it as it is). */
static void dllm__rope_tables_of(const std::vector<float> &inv, int n_pos, float factor, std::vector<float> &cos_t,
                                 std::vector<float> &sin_t) {
    const int half = (int)inv.size();
    cos_t.resize((size_t)n_pos * half);
    sin_t.resize((size_t)n_pos * half);
    for (int p = 0; p < n_pos; p++)
        for (int j = 0; j < half; j++) {
            float angle = (float)p * inv[(size_t)j];
            cos_t[(size_t)p * half + j] = cosf(angle) * factor;
            sin_t[(size_t)p * half + j] = sinf(angle) * factor;
        }
}

/* cos/sin tables [n_pos][head_dim/2] of the plain RoPE, computed in float32 exactly as HF does. The GPU backend
 * uploads these same tables, so both backends rotate by identical numbers. */
static void dllm__rope_tables(float theta, int head_dim, int n_pos, std::vector<float> &cos_t,
                              std::vector<float> &sin_t) {
    dllm__rope_tables_of(dllm__rope_inv_freq_plain(theta, head_dim), n_pos, 1.0f, cos_t, sin_t);
}

/* x[t] = x[t] * cos + rotate_half(x[t]) * sin for every head; rotate_half(x) = cat(-x2, x1). A partial RoPE
 * (rot_dim < head_dim, LLaDA2) rotates the first rot_dim dims of each head so, over tables of rot_dim / 2 columns,
 * and passes the others through; 0 rotates them all. */
static void dllm__cpu_rope(float *x, int T, int n_heads, int head_dim, const int32_t *pos, const float *cos_t,
                           const float *sin_t, int rot_dim = 0) {
    int half = (rot_dim ? rot_dim : head_dim) / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            const float *c = cos_t + (size_t)pos[t] * half, *s = sin_t + (size_t)pos[t] * half;
            for (int j = 0; j < half; j++) {
                float x1 = v[j], x2 = v[j + half];
                v[j] = x1 * c[j] - x2 * s[j];
                v[j + half] = x2 * c[j] + x1 * s[j];
            }
        }
}

/* Softmax(q k^T / sqrt(hd)) v per head: Tq query rows over Tk keys. Query i, at sequence index q_index0 + i,
 * sees key j iff key_valid (nullable: every key) holds it and, under the block-causal mask of block diffusion
 * (mask_block > 0), (q_index0 + i) / mask_block >= j / mask_block; mask_block 0 is bidirectional. A row that
 * sees no key is 0. */
static void dllm__cpu_attention(dllm__pool &pool, const float *q, const float *k, const float *v, int Tq, int Tk,
                                int n_head, int n_kv, int hd, const uint8_t *key_valid, float *out, int q_index0 = 0,
                                int mask_block = 0) {
    const int group = n_head / n_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    pool.run(n_head, [&](int h) {
        int kvh = h / group;
        std::vector<double> p((size_t)Tk);
        std::vector<double> acc((size_t)hd);
        for (int i = 0; i < Tq; i++) {
            const float *qi = q + ((size_t)i * n_head + h) * hd;
            const int n_visible =
                mask_block ? std::min(Tk, ((q_index0 + i) / mask_block + 1) * mask_block) : Tk;  // keys [0, n_visible)
            double m = -INFINITY;
            for (int j = 0; j < n_visible; j++) {
                if (key_valid && !key_valid[j]) {
                    p[(size_t)j] = -INFINITY;
                    continue;
                }
                p[(size_t)j] = (double)(dllm__dot(qi, k + ((size_t)j * n_kv + kvh) * hd, hd) * scale);
                m = std::max(m, p[(size_t)j]);
            }
            double l = 0;
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int j = 0; m > -INFINITY && j < n_visible; j++) {
                if (p[(size_t)j] == -INFINITY) continue;
                double e = exp(p[(size_t)j] - m);
                l += e;
                const float *vj = v + ((size_t)j * n_kv + kvh) * hd;
                for (int c = 0; c < hd; c++) acc[(size_t)c] += e * vj[c];
            }
            float *oi = out + ((size_t)i * n_head + h) * hd;
            for (int c = 0; c < hd; c++) oi[c] = l > 0 ? (float)(acc[(size_t)c] / l) : 0.0f;
        }
    });
}

static inline float dllm__silu(float x) { return x / (1.0f + expf(-x)); }

/* Working memory of the CPU forward, grown on demand. */
struct dllm__cpu_buffers {
    std::vector<float> h, a, q, k, v, att, tmp, gate, up;
    std::vector<int32_t> pos;
    void fit(const dllm__config &c, int T) {
        size_t d = (size_t)c.n_embd * T, qd = (size_t)c.n_head * c.head_dim * T,
               kvd = (size_t)c.n_head_kv * c.head_dim * T;
        h.resize(d);
        a.resize(d);
        tmp.resize(d);
        q.resize(qd);
        att.resize(qd);
        k.resize(kvd);
        v.resize(kvd);
        gate.resize((size_t)c.n_ff * T);
        up.resize((size_t)c.n_ff * T);
        pos.resize((size_t)T);
    }
};

/* Keys and values of every layer for every canvas row: Fast-dLLM's prefix/dual cache on the CPU. */
struct dllm__cpu_kv {
    int n = 0;                // canvas rows
    std::vector<float> k, v;  // [layer][n][n_head_kv * head_dim]
};

/* Which rows a forward computes and which keys they see (plain: every row, fresh keys). */
struct dllm__cpu_rows {
    int q0 = 0, q1 = 0;                  // query rows [q0, q1) of the canvas
    dllm__cpu_kv *kv = nullptr;          // null: keys are the rows themselves; else rows [q0, q1) are written
                                         // into the cache and attention reads all kv->n cached rows
    const int32_t *positions = nullptr;  // RoPE position of each canvas row (DPad); null: the row index
};
