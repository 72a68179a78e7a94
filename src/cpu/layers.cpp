/* src/cpu/layers.cpp - the CPU reference layers, LM head and the full forward. */

/* b.q, b.k, b.v of layer `layer` for the T rows of b.h: RMSNorm, the projections in the layer's precision
 * (q: its FP8 or SoloQ weights, or null for the exact ones), RoPE at the positions b.pos. Both forwards
 * (bidirectional, block diffusion) take it. */
static void dllm__cpu_qkv(const dllm_model &m, size_t layer, const dllm__fp8_layer *q, dllm__pool &pool,
                          dllm__cpu_buffers &b, int T, const float *cos_t, const float *sin_t) {
    const dllm__config &c = m.cfg;
    if (c.family == DLLM_FAMILY_LLADA2) return dllm__cpu_llada2_qkv(m, layer, q, pool, b, T, cos_t, sin_t);
    const dllm__layer_weights &L = m.layers[layer];
    dllm__cpu_rmsnorm(b.h.data(), T, c.n_embd, L.attn_norm.data(), c.norm_eps, b.a.data());
    dllm__cpu_qkv_proj(c, L, q, pool, b, T);
    dllm__cpu_rope(b.q.data(), T, c.n_head, c.head_dim, b.pos.data(), cos_t, sin_t);
    dllm__cpu_rope(b.k.data(), T, c.n_head_kv, c.head_dim, b.pos.data(), cos_t, sin_t);
}

/* h += O(b.att) for the T rows, in the layer's precision. */
static void dllm__cpu_out_proj(const dllm_model &m, size_t layer, const dllm__fp8_layer *q, dllm__pool &pool,
                               dllm__cpu_buffers &b, int T) {
    const int d = m.cfg.n_embd, qd = m.cfg.n_head * m.cfg.head_dim;
    if (q && q->soloq)
        dllm__cpu_linear_soloq(pool, b.att.data(), true, T, *q->soloq, DLLM__SOLOQ_O, 0, nullptr, d, b.tmp.data());
    else if (q && !q->o.empty())
        dllm__cpu_linear_fp8(pool, b.att.data(), T, qd, q->o, 0, nullptr, d, b.tmp.data());
    else
        dllm__cpu_linear(pool, b.att.data(), T, qd, *m.layers[layer].wo, nullptr, d, b.tmp.data());
    for (size_t i = 0; i < (size_t)T * d; i++) b.h[i] += b.tmp[i];
}

/* One sequence of a CPU forward (the CPU's twin of section 16.3's dllm__seq_rows): its canvas, the rows it
 * computes and the keys they see, and the output rows it wants. A forward concatenates the computed rows of its
 * sequences; row0 is where this one's begin. */
struct dllm__cpu_seq {
    const int32_t *ids = nullptr;
    int n = 0;            // canvas rows
    dllm__cpu_rows rows;  // rows.q1 == 0: every row
    const uint8_t *key_valid = nullptr;
    int r0 = 0, r1 = 0;  // unshifted output rows, inside the computed ones
    int row0 = 0;        // first row in the concatenation (set by dllm__cpu_forward_seqs)
};

/* Attention of one sequence over its own keys: its rows [row0, row0 + T) of b.q, b.k, b.v into b.att. With a
 * K/V cache the rows' keys and values overwrite their cache slots and attention reads every cached row. */
static void dllm__cpu_attend(const dllm__config &c, size_t layer, dllm__pool &pool, dllm__cpu_buffers &b,
                             const dllm__cpu_seq &s) {
    const int T = s.rows.q1 - s.rows.q0, kvd = c.n_head_kv * c.head_dim, qd = c.n_head * c.head_dim;
    const float *keys = b.k.data() + (size_t)s.row0 * kvd, *values = b.v.data() + (size_t)s.row0 * kvd;
    int n_keys = T;
    if (s.rows.kv) {
        float *kc = s.rows.kv->k.data() + layer * s.rows.kv->n * kvd,
              *vc = s.rows.kv->v.data() + layer * s.rows.kv->n * kvd;
        memcpy(kc + (size_t)s.rows.q0 * kvd, keys, sizeof(float) * T * kvd);
        memcpy(vc + (size_t)s.rows.q0 * kvd, values, sizeof(float) * T * kvd);
        keys = kc, values = vc, n_keys = s.rows.kv->n;
    }
    dllm__cpu_attention(pool, b.q.data() + (size_t)s.row0 * qd, keys, values, T, n_keys, c.n_head, c.n_head_kv,
                        c.head_dim, s.key_valid, b.att.data() + (size_t)s.row0 * qd);
}

/* Attention half of a layer over the T concatenated rows of b.h: h += O(attention(RoPE(QKV(norm(h))))). The
 * projections take every row at once (each row alone, so batching changes no bit); attention stays inside each
 * sequence. q: the layer's quantised weights or null. */
static void dllm__cpu_attention_seqs(const dllm_model &m, size_t layer, const dllm__fp8_layer *q, dllm__pool &pool,
                                     dllm__cpu_buffers &b, const std::vector<dllm__cpu_seq> &seqs, int T,
                                     const float *cos_t, const float *sin_t) {
    dllm__cpu_qkv(m, layer, q, pool, b, T, cos_t, sin_t);
    for (const dllm__cpu_seq &s : seqs) dllm__cpu_attend(m.cfg, layer, pool, b, s);
    dllm__cpu_out_proj(m, layer, q, pool, b, T);
}

/* The attention half for one sequence's rows [rows.q0, rows.q1). */
static void dllm__cpu_attention_block(const dllm_model &m, size_t layer, const dllm__fp8_layer *q, dllm__pool &pool,
                                      dllm__cpu_buffers &b, const dllm__cpu_rows &rows, const uint8_t *key_valid,
                                      const float *cos_t, const float *sin_t) {
    std::vector<dllm__cpu_seq> one(1);
    one[0].rows = rows, one[0].key_valid = key_valid;
    dllm__cpu_attention_seqs(m, layer, q, pool, b, one, rows.q1 - rows.q0, cos_t, sin_t);
}

/* b.tmp = down(silu(gate(b.a)) * up(b.a)) of layer L's MLP in its precision (b.a is quantised in place). */
static void dllm__cpu_ffn(const dllm_model &m, const dllm__layer_weights &L, const dllm__fp8_layer *q, dllm__pool &pool,
                          dllm__cpu_buffers &b, int T) {
    dllm__cpu_swiglu(pool, b.a.data(), T, m.cfg.n_embd, dllm__swiglu_of(m.cfg, L, q), b.gate.data(), b.up.data(),
                     b.tmp.data());
}

/* The MLP half of a layer over the T rows of b.h: h += FFN(norm(h)). Both forwards take it. */
static void dllm__cpu_ffn_block(const dllm_model &m, size_t layer, const dllm__fp8_layer *q, dllm__pool &pool,
                                dllm__cpu_buffers &b, int T) {
    const int d = m.cfg.n_embd;
    dllm__cpu_rmsnorm(b.h.data(), T, d, m.layers[layer].ffn_norm.data(), m.cfg.norm_eps, b.a.data());
    if (dllm__is_moe_layer(m.cfg, layer))
        dllm__cpu_moe(m, m.layers[layer], q, pool, b.a.data(), T, b.tmp.data());
    else
        dllm__cpu_ffn(m, m.layers[layer], q, pool, b, T);
    for (size_t i = 0; i < (size_t)T * d; i++) b.h[i] += b.tmp[i];
}

/* logits = LM head of the rows of b.a (already final-normed): BF16/fp32, or SoloQ with quantize_lm_head (head). */
static void dllm__cpu_lm_head(const dllm_model &m, dllm__pool &pool, dllm__cpu_buffers &b, int rows,
                              const dllm__soloq_layer *head, float *logits) {
    if (head)
        dllm__cpu_linear_soloq(pool, b.a.data(), true, rows, *head, DLLM__SOLOQ_HEAD, 0, nullptr, m.cfg.n_vocab,
                               logits);
    else
        dllm__cpu_linear(pool, b.a.data(), rows, m.cfg.n_embd, *m.head, nullptr, m.cfg.n_vocab, logits);
}

/* One transformer layer over one sequence's rows of b.h, in place (the tests step through a forward with it). */
[[maybe_unused]] static void dllm__cpu_layer(const dllm_model &m, size_t layer, const dllm__fp8_layer *q,
                                             dllm__pool &pool, dllm__cpu_buffers &b, const dllm__cpu_rows &rows,
                                             const uint8_t *key_valid, const float *cos_t, const float *sin_t) {
    dllm__cpu_attention_block(m, layer, q, pool, b, rows, key_valid, cos_t, sin_t);
    dllm__cpu_ffn_block(m, layer, q, pool, b, rows.q1 - rows.q0);
}

/* Forward of several canvases at once: their computed rows concatenated (dllm__cpu_seq), every linear, norm and
 * MLP over all rows in one pass, RoPE at each row's own position, attention per sequence over its own keys; then
 * each sequence's unshifted output rows [r0, r1), one sequence after another, to logits. Every row's arithmetic
 * is the same whatever its neighbours, so a sequence's logits are bit-identical to its forward alone.
 * fp8: per-layer quantised weights (dllm__cpu_fp8_weights, dllm__cpu_soloq_weights), empty for the exact reference;
 * head: SoloQ's quantised LM head or null (BF16). */
static void dllm__cpu_forward_seqs(const dllm_model &m, dllm__pool &pool, dllm__cpu_buffers &b,
                                   std::vector<dllm__cpu_seq> &seqs, const float *cos_t, const float *sin_t,
                                   float *logits, const std::vector<dllm__fp8_layer> &fp8,
                                   const dllm__soloq_layer *head) {
    const dllm__config &c = m.cfg;
    const int d = c.n_embd;
    int T = 0;
    for (dllm__cpu_seq &s : seqs) {
        if (s.rows.q1 == 0) s.rows.q0 = 0, s.rows.q1 = s.n;
        s.row0 = T;
        T += s.rows.q1 - s.rows.q0;
    }
    b.fit(c, T);
    for (const dllm__cpu_seq &s : seqs)
        for (int row = s.rows.q0; row < s.rows.q1; row++) {
            const size_t t = (size_t)(s.row0 + row - s.rows.q0);
            b.pos[t] = s.rows.positions ? s.rows.positions[row] : row;
            dllm__tensor_row(*m.embed, s.ids[row], d, b.h.data() + t * d);
        }
    for (size_t l = 0; l < m.layers.size(); l++) {
        const dllm__fp8_layer *q = l < fp8.size() ? &fp8[l] : nullptr;
        dllm__cpu_attention_seqs(m, l, q, pool, b, seqs, T, cos_t, sin_t);
        dllm__cpu_ffn_block(m, l, q, pool, b, T);
    }
    int out_rows = 0;  // the output rows, gathered into b.a for one LM head over all of them
    for (const dllm__cpu_seq &s : seqs) {
        dllm__cpu_rmsnorm(b.h.data() + (size_t)(s.row0 + s.r0 - s.rows.q0) * d, s.r1 - s.r0, d, m.final_norm.data(),
                          c.norm_eps, b.a.data() + (size_t)out_rows * d);
        out_rows += s.r1 - s.r0;
    }
    dllm__cpu_lm_head(m, pool, b, out_rows, head, logits);
    if (c.scale_logits) {
        const float s = 1.0f / sqrtf((float)d);
        for (size_t i = 0; i < (size_t)out_rows * c.n_vocab; i++) logits[i] *= s;
    }
}

/* Forward of the canvas ids[0..n) over the rows [rows.q0, rows.q1) (every row if rows.q1 == 0); writes the
 * unshifted output rows [r0, r1) (canvas rows inside the computed ones) to logits: a batch of one. */
static void dllm__cpu_forward(const dllm_model &m, dllm__pool &pool, dllm__cpu_buffers &b, const int32_t *ids, int n,
                              dllm__cpu_rows rows, const uint8_t *key_valid, const float *cos_t, const float *sin_t,
                              int r0, int r1, float *logits,
                              const std::vector<dllm__fp8_layer> &fp8 = std::vector<dllm__fp8_layer>(),
                              const dllm__soloq_layer *head = nullptr) {
    std::vector<dllm__cpu_seq> one(1);
    one[0].ids = ids, one[0].n = n, one[0].rows = rows, one[0].key_valid = key_valid, one[0].r0 = r0, one[0].r1 = r1;
    dllm__cpu_forward_seqs(m, pool, b, one, cos_t, sin_t, logits, fp8, head);
}

/* The output row that predicts position pos: Dream shifts by one (position 0 keeps row 0). */
static inline int dllm__logit_row(const dllm__config &c, int pos) { return c.shift_logits && pos > 0 ? pos - 1 : pos; }

/* ---- Block diffusion (Fast-dLLM v2, Nemotron): RoPE variants, block-causal attention over a K/V cache -----
 * block-diffusion.md: every forward attends to the committed cache ++ its own fresh K/V, with RoPE position
 * (committed length) + offset and the eval mask "query q sees key k iff q / Bm >= k / Bm" over sequence
 * indices; only commit forwards (the prefill, a finished block) append their K/V. The sub-block ("block")
 * cache path forwards S rows whose fresh K/V overwrite their slots of the block's cached K/V, unmasked. */

/* RoPE inverse frequencies in float32, as transformers computes them: theta^(-2j/d), or YaRN
 * (_compute_yarn_parameters: ramp between interpolated and extrapolated frequencies over the dimensions
 * whose rotation count at original_max_position_embeddings lies between beta_slow and beta_fast). */
static std::vector<float> dllm__rope_inv_freq(const dllm__config &c) {
    if (!c.yarn) return dllm__rope_inv_freq_plain(c.rope_theta, c.head_dim);
    const int dim = c.head_dim, half = dim / 2;
    std::vector<float> inv((size_t)half);
    const double base = c.rope_theta;
    auto correction_dim = [&](double rotations) {
        return dim * log(c.yarn_orig_max / (rotations * 2 * M_PI)) / (2 * log(base));
    };
    double low = std::max(floor(correction_dim(c.yarn_beta_fast)), 0.0),
           high = std::min(ceil(correction_dim(c.yarn_beta_slow)), (double)(dim - 1));
    if (low == high) high += 0.001;  // transformers: prevent a division by zero
    for (int j = 0; j < half; j++) {
        float pos_freq = powf((float)base, (float)(2 * j) / (float)dim);
        float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / ((float)c.yarn_factor * pos_freq);
        float ramp = std::min(std::max(((float)j - (float)low) / (float)(high - low), 0.0f), 1.0f);
        float extrapolation_factor = 1.0f - ramp;
        inv[(size_t)j] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
    return inv;
}

/* Columns of the model's cos/sin tables (a row per position): half the rotated dims. */
static int dllm__rope_columns(const dllm__config &c) { return (c.rotary_dim ? c.rotary_dim : c.head_dim) / 2; }

/* cos/sin tables of the model's RoPE: dllm__rope_tables for the plain one; YaRN multiplies both by its
 * attention factor (1.0 at Nemotron's mscale == mscale_all_dim). */
static void dllm__rope_tables_cfg(const dllm__config &c, int n_pos, std::vector<float> &cos_t,
                                  std::vector<float> &sin_t) {
    if (!c.yarn) return dllm__rope_tables(c.rope_theta, c.rotary_dim ? c.rotary_dim : c.head_dim, n_pos, cos_t, sin_t);
    dllm__rope_tables_of(dllm__rope_inv_freq(c), n_pos, (float)c.yarn_attention_factor, cos_t, sin_t);
}

/* Llama-4 query scaling (Ministral-3, Nemotron): after RoPE, q *= 1 + beta log(1 + floor(pos / orig_max));
 * 1 below orig_max. float32, as in transformers. */
static void dllm__cpu_llama4_scale(const dllm__config &c, float *q, int T, const int32_t *pos) {
    if (c.llama4_beta == 0) return;
    const int width = c.n_head * c.head_dim;
    for (int t = 0; t < T; t++) {
        float s = 1.0f + c.llama4_beta * logf(1.0f + floorf((float)pos[t] / (float)c.llama4_orig_max));
        for (int i = 0; i < width; i++) q[(size_t)t * width + i] *= s;
    }
}
