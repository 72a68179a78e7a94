/* src/soloq/kv_quant.cpp - commit-time K/V quantisation of block diffusion (CPU reference). */

// ---------------------------------------------------------------------------------------------------
// 9c. [KV quant] SoloQ's commit-time K/V quantisation for block diffusion (spec soloq.md 7; dllm_kv_quant)
//
//     When a forward commits rows (the prefill of the prompt's whole blocks, a finished block), each layer's new K/V
//     rows are quantised once, after the forward (which itself attended to them at full precision), and never again.
//     The block being denoised, and the block cache, stay full precision.
//       Keys (every mode): KIVI per channel (spec 7.1), asymmetric min/max over one group of committed rows, the
//         group = the generation's block (rows [g G, (g + 1) G) of the sequence; commits are whole blocks at
//         multiples of G), FP16 (scale, min) per (layer, group, kv channel). Post-RoPE keys, no rotation.
//       Values, SoloQ: per (token, kv head) the row v' = R v, R the layer's K-RPBH of head_dim (rotation site
//         layer * 8 + 5, the weight sites being 0-4), quantised by Lloyd-Max on v' / RMS (4 bits: 9b's encoder,
//         INT8 levels / 46; 2 bits: the N(0, 1) levels +-0.452780, +-1.510418 of spec 4.2) with one FP32 row scale
//         that carries SoloQ's bias correction (spec 5: ||v'||^2 / <C, v'>).
//       Values, KIVI: per (token, kv head) asymmetric min/max over the head's channels, FP16 (scale, min).
//       Sinks: rows [0, n_sink) are not quantised (codes 0; left out of their key group's min/max).
//     Packing (the GPU twin's too): a row's kvd = n_kv * head_dim codes, element e at bit e * bits of the row's
//     bytes, low bits first (4 bits: element 2i in the low nibble, 9b's order). KIVI codes are unsigned q in
//     [0, 2^b); SoloQ 4-bit codes are 9b's Lloyd codes (bit 3 sign, bits 0-2 level), 2-bit ones bit 1 sign,
//     bit 0 level.
//     R is applied online at commit rather than folded into v_proj / o_proj (spec 7.2's folding): folding would
//     rotate every weight format's V rows and O columns. The CPU twin decodes a committed row once, from the stored
//     codes, into the fp32 cache that the attention reads, values rotated back (R^T of the decoded v'); attention
//     is linear in V, so this equals attending over v' and rotating each head's output back by R^T.
// ---------------------------------------------------------------------------------------------------

/* float -> IEEE half, round to nearest even, saturating at +-65504 (infinities too); NaN stays NaN. */
static uint16_t dllm__f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)(u >> 16 & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477fe000u) return (uint16_t)(sign | 0x7bffu);  // >= 65504
    if (a < 0x38800000u) {                                    // below 2^-14: a subnormal half, in units of 2^-24
        float m;
        memcpy(&m, &a, 4);
        return (uint16_t)(sign | (uint16_t)rintf(m * 16777216.0f));
    }
    uint32_t h = (a >> 13) - (112u << 10);  // exponent rebiased 127 -> 15, the mantissa's top 10 bits
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static const char *const dllm__kvq_names[] = {"none", "soloq-kv4", "soloq-kv2", "kivi-kv4",
                                              "kivi-kv2"};  // dllm_kv_quant order
static const int dllm__kvq_value_site = 5;  // the values' rotation site in each layer (dllm__soloq_site_id)
static const float dllm__lloyd2_threshold = 0.981599f;
static const float dllm__lloyd2_levels[2] = {0.452780f, 1.510418f};

static int dllm__kvq_bits(int mode) {
    return mode == DLLM_KV_QUANT_SOLOQ_KV4 || mode == DLLM_KV_QUANT_KIVI_KV4 ? 4 : mode ? 2 : 0;
}
static bool dllm__kvq_is_soloq(int mode) { return mode == DLLM_KV_QUANT_SOLOQ_KV4 || mode == DLLM_KV_QUANT_SOLOQ_KV2; }

/* The default sinks (dllm_ctx_params.kv_sink_tokens = -1): the SoloQ paper keeps position 2 of Fast-dLLM v2 and
 * position 0 of Nemotron; dllm keeps that position and every one before it. */
static int dllm__kvq_default_sinks(const dllm__config &c) { return c.family == DLLM_FAMILY_FAST_DLLM_V2 ? 3 : 1; }

static dllm_status dllm__kvq_check(const dllm__config &c, int mode, int sinks, int max_tokens) {
    if (mode < DLLM_KV_QUANT_NONE || mode > DLLM_KV_QUANT_KIVI_KV2)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "kv_quant %d must be a dllm_kv_quant, DLLM_KV_QUANT_NONE (0) to _KIVI_KV2 (4)", mode);
    if (sinks < -1 || sinks > max_tokens)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "kv_sink_tokens (--kv-sinks) %d must be in [-1, %d] (-1 = the model's default)", sinks,
                          max_tokens);
    if (mode == DLLM_KV_QUANT_NONE) return DLLM_OK;
    if (!dllm__is_block_diffusion(c))
        return dllm__fail(
            DLLM_ERR_UNSUPPORTED,
            "kv_quant (--kv-quant) %s: a %s model has no committed K/V cache to quantise (block-diffusion models "
            "only: Fast-dLLM v2, Nemotron-Labs-Diffusion); use DLLM_KV_QUANT_NONE (--kv-quant none)",
            dllm__kvq_names[mode], dllm__family_name(c.family));
    if (c.head_dim % 4)
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "kv_quant (--kv-quant) %s needs head_dim %% 4 == 0 (whole bytes of 2-bit codes a head); "
                          "head_dim is %d",
                          dllm__kvq_names[mode], c.head_dim);
    return DLLM_OK;
}

/* Committed-cache bytes per token (dllm_kv_bytes_per_token): codes, key pairs amortised over the group, and per
 * (token, kv head) 4 bytes (SoloQ's FP32 factor or KIVI's FP16 pair). */
static double dllm__kvq_bytes_per_token(const dllm__config &c, int mode, int group) {
    const double kvd = (double)c.n_head_kv * c.head_dim;
    if (mode == DLLM_KV_QUANT_NONE) return c.n_layer * 2.0 * kvd * 2.0;
    return c.n_layer * (2.0 * kvd * dllm__kvq_bits(mode) / 8.0 + kvd * 4.0 / group + 4.0 * c.n_head_kv);
}

static inline void dllm__kvq_put(uint8_t *row, int e, int bits, unsigned code) {
    row[e * bits / 8] |= (uint8_t)(code << (e * bits % 8));
}
static inline unsigned dllm__kvq_get(const uint8_t *row, int e, int bits) {
    return (unsigned)(row[e * bits / 8] >> (e * bits % 8)) & ((1u << bits) - 1);
}

/* KIVI's asymmetric b-bit quantiser (spec 7.1) of n values x[i * stride]: the FP16 pair (scale, min) into pair and
 * codes in [0, 2^b) into q[n]. The pair is rounded to FP16 first and the codes come from the rounded pair, so that a
 * value decodes as fmaf(q, scale, min) from exactly what is stored. max == min, or a scale that rounds to 0, stores
 * scale 0 and codes 0 (KIVI's own code would divide by zero); n = 0 stores (0, 0); a non-finite value makes the
 * pair NaN (non-finite input never decodes to finite values). */
static void dllm__kivi_quantize(const float *x, size_t stride, int n, int bits, uint8_t *q, uint16_t pair[2]) {
    float mn = n ? x[0] : 0.0f, mx = mn;
    bool finite = true;
    for (int i = 0; i < n; i++) {
        const float v = x[(size_t)i * stride];
        finite = finite && std::isfinite(v);
        mn = fminf(mn, v), mx = fmaxf(mx, v);
    }
    const float top = (float)((1 << bits) - 1);
    pair[0] = finite ? dllm__f32_to_f16((mx - mn) / top) : (uint16_t)0x7e00u;
    pair[1] = finite ? dllm__f32_to_f16(mn) : (uint16_t)0x7e00u;
    const float scale = dllm__f16_to_f32(pair[0]), minr = dllm__f16_to_f32(pair[1]);
    if (!(scale > 0) && finite) pair[0] = 0;
    for (int i = 0; i < n; i++)
        q[i] = scale > 0 ? (uint8_t)fminf(fmaxf(rintf((x[(size_t)i * stride] - minr) / scale), 0.0f), top) : 0;
}

static inline float dllm__kivi_decode(unsigned q, const uint16_t pair[2]) {
    return fmaf((float)q, dllm__f16_to_f32(pair[0]), dllm__f16_to_f32(pair[1]));
}

/* C of a SoloQ value code: 4 bits, 9b's Lloyd code (an INT8 level); 2 bits, bit 1 sign and bit 0 the level. */
static float dllm__kvq_soloq_c(unsigned code, int bits) {
    if (bits == 4) return (float)(code & 8 ? -dllm__lloyd4_int[code & 7] : dllm__lloyd4_int[code & 7]);
    return code & 2 ? -dllm__lloyd2_levels[code & 1] : dllm__lloyd2_levels[code & 1];
}

/* SoloQ's quantiser of one rotated value row x[n]: codes packed into `packed` (zeroed by the caller) and the row
 * scale returned (an element's value is C * scale). 4 bits: 9b's Lloyd-Max with the bias correction
 * (dllm__q4_quantize_row); 2 bits: the same steps with the 2-bit levels (nearest level of x / RMS, scale
 * ||x||^2 / <C, x>, the RMS if <C, x> <= 0; a zero row has scale 0, a non-finite one NaN). */
static float dllm__kvq_soloq_row(const float *x, int n, int bits, uint8_t *packed) {
    std::vector<float> value((size_t)n);
    if (bits == 4) return dllm__q4_quantize_row(DLLM__Q4_LLOYD, x, n, true, packed, nullptr, value.data());
    const float ss = dllm__soloq_dot(x, x, n), sigma = sqrtf(ss / (float)n);
    if (ss == 0) return 0.0f;
    for (int i = 0; i < n; i++) {
        const float z = x[i] / sigma;
        const unsigned code = (z < 0 ? 2u : 0u) | (fabsf(z) >= dllm__lloyd2_threshold ? 1u : 0u);
        dllm__kvq_put(packed, i, 2, code);
        value[(size_t)i] = dllm__kvq_soloq_c(code, 2);
    }
    if (!(ss <= FLT_MAX)) return NAN;
    const float proj = dllm__soloq_dot(value.data(), x, n);
    return proj > 0 ? ss / proj : sigma;
}

/* The quantised committed rows of one block-diffusion generation (this section's packing), and how they are made. */
struct dllm__kvq {
    int mode = DLLM_KV_QUANT_NONE, bits = 0, n_sink = 0;
    int n_layer = 0, n_kv = 0, hd = 0, kvd = 0, cap = 0;
    int group = 0;                          // rows per key group: the first commit's block (0: nothing committed yet)
    std::vector<dllm__rotation> rot;        // SoloQ: each layer's R of head_dim
    std::vector<uint8_t> k_codes, v_codes;  // [layer][cap][row_bytes()]
    std::vector<uint16_t> k_pairs;          // [layer][groups()][kvd][2] FP16 (scale, min)
    std::vector<uint16_t> v_pairs;          // KIVI: [layer][cap][n_kv][2] FP16 (scale, min)
    std::vector<float> v_scale;             // SoloQ: [layer][cap][n_kv] row scales

    bool enabled() const { return mode != DLLM_KV_QUANT_NONE; }
    bool soloq() const { return dllm__kvq_is_soloq(mode); }
    size_t row_bytes() const { return (size_t)kvd * bits / 8; }
    int groups() const { return group ? (cap + group - 1) / group : 0; }
    size_t row_at(int l, int r) const { return ((size_t)l * cap + r) * row_bytes(); }  // k_codes, v_codes
    size_t k_pair_at(int l, int r, int e) const {
        return (((size_t)l * groups() + r / group) * kvd + e) * 2;
    }                                                                                       // k_pairs
    size_t head_at(int l, int r, int h) const { return ((size_t)l * cap + r) * n_kv + h; }  // v_scale; v_pairs / 2

    /* A context's settings (validated by dllm__kvq_check); sinks -1 is the model's default. */
    void setup(const dllm__config &c, int mode_, int sinks) {
        mode = mode_, bits = dllm__kvq_bits(mode_), n_sink = sinks < 0 ? dllm__kvq_default_sinks(c) : sinks;
        n_layer = c.n_layer, n_kv = c.n_head_kv, hd = c.head_dim, kvd = n_kv * hd;
        rot.clear();
        for (int l = 0; soloq() && l < n_layer; l++)
            rot.push_back(dllm__make_rotation(DLLM__ROT_KRPBH, hd, dllm__soloq_options().seed,
                                              dllm__soloq_site_id((size_t)l, dllm__kvq_value_site)));
    }

    /* A generation starts with `rows` empty rows. */
    void reset(int rows) {
        cap = rows, group = 0;
        k_codes.assign((size_t)n_layer * cap * row_bytes(), 0);
        v_codes.assign(k_codes.size(), 0);
        k_pairs.clear();
        v_pairs.assign(soloq() ? 0 : (size_t)n_layer * cap * n_kv * 2, 0);
        v_scale.assign(soloq() ? (size_t)n_layer * cap * n_kv : 0, 0.0f);
    }
};

/* Key element e of committed row r of layer l, decoded. */
static float dllm__kvq_key(const dllm__kvq &q, int l, int r, int e) {
    return dllm__kivi_decode(dllm__kvq_get(&q.k_codes[q.row_at(l, r)], e, q.bits), &q.k_pairs[q.k_pair_at(l, r, e)]);
}

/* Values of kv head h of committed row r of layer l, decoded into out[hd]: SoloQ's in the rotated basis (C * scale). */
static void dllm__kvq_value(const dllm__kvq &q, int l, int r, int h, float *out) {
    const uint8_t *row = &q.v_codes[q.row_at(l, r)];
    const size_t at = q.head_at(l, r, h);
    for (int i = 0; i < q.hd; i++) {
        const unsigned code = dllm__kvq_get(row, h * q.hd + i, q.bits);
        out[i] =
            q.soloq() ? dllm__kvq_soloq_c(code, q.bits) * q.v_scale[at] : dllm__kivi_decode(code, &q.v_pairs[2 * at]);
    }
}

/* Keys of layer l's rows [row0, row1) (whole groups; rows below n_sink left out), kv head by kv head (a head's codes
 * are whole bytes): codes and pairs into the store, then the decoded keys over k. */
static void dllm__kvq_commit_keys(dllm__pool &pool, dllm__kvq &q, int l, float *k, int row0, int row1) {
    pool.run(q.n_kv, [&](int h) {
        std::vector<uint8_t> codes((size_t)q.group);
        for (int g0 = row0; g0 < row1; g0 += q.group) {
            const int a = std::max(g0, q.n_sink), n = std::max(0, g0 + q.group - a);
            for (int e = h * q.hd; e < (h + 1) * q.hd; e++) {
                dllm__kivi_quantize(k + (size_t)a * q.kvd + e, (size_t)q.kvd, n, q.bits, codes.data(),
                                    &q.k_pairs[q.k_pair_at(l, g0, e)]);
                for (int i = 0; i < n; i++) {
                    dllm__kvq_put(&q.k_codes[q.row_at(l, a + i)], e, q.bits, codes[(size_t)i]);
                    k[(size_t)(a + i) * q.kvd + e] = dllm__kvq_key(q, l, a + i, e);
                }
            }
        }
    });
}

/* Values of layer l's rows [row0, row1) (rows below n_sink left out), row by row: codes and scales into the store,
 * then the decoded values (SoloQ: rotated back) over v. */
static void dllm__kvq_commit_values(dllm__pool &pool, dllm__kvq &q, int l, float *v, int row0, int row1) {
    const int first = std::max(row0, q.n_sink);
    if (first >= row1) return;
    pool.run(row1 - first, [&](int i) {
        const int r = first + i;
        uint8_t *row = &q.v_codes[q.row_at(l, r)];
        std::vector<float> rotated((size_t)q.hd), decoded((size_t)q.hd);
        std::vector<uint8_t> codes((size_t)q.hd);
        for (int h = 0; h < q.n_kv; h++) {
            float *x = v + (size_t)r * q.kvd + (size_t)h * q.hd;
            if (q.soloq()) {
                dllm__rotate(q.rot[(size_t)l], x, rotated.data());
                q.v_scale[q.head_at(l, r, h)] =
                    dllm__kvq_soloq_row(rotated.data(), q.hd, q.bits, row + (size_t)h * q.hd * q.bits / 8);
            } else {
                dllm__kivi_quantize(x, 1, q.hd, q.bits, codes.data(), &q.v_pairs[2 * q.head_at(l, r, h)]);
                for (int c = 0; c < q.hd; c++) dllm__kvq_put(row, h * q.hd + c, q.bits, codes[(size_t)c]);
            }
            dllm__kvq_value(q, l, r, h, decoded.data());
            if (q.soloq())
                dllm__rotate_inverse(q.rot[(size_t)l], decoded.data(), x);
            else
                memcpy(x, decoded.data(), sizeof(float) * q.hd);
        }
    });
}

/* The commit of rows [row0, row0 + T) of kv (every layer; the forward that appended them has run): quantised into q
 * and replaced in kv by their decoded values, which is what later forwards attend to. Commits are whole key groups of
 * `group` rows (the generation's block), the same group all generation long. */
static dllm_status dllm__kvq_commit(dllm__pool &pool, dllm__kvq &q, dllm__bd_kv &kv, int row0, int T, int group) {
    if (!q.group) {
        q.group = group;
        q.k_pairs.assign((size_t)q.n_layer * q.groups() * q.kvd * 2, 0);
    }
    if (group != q.group || group <= 0 || row0 % group || T % group || kv.cap != q.cap)
        return dllm__fail(
            DLLM_ERR_INTERNAL,
            "kv_quant: a commit of rows [%d, %d) is not whole key groups of %d rows (the generation's block: %d)", row0,
            row0 + T, group, q.group);
    for (int l = 0; l < q.n_layer; l++) {
        dllm__kvq_commit_keys(pool, q, l, kv.k.data() + (size_t)l * kv.cap * q.kvd, row0, row0 + T);
        dllm__kvq_commit_values(pool, q, l, kv.v.data() + (size_t)l * kv.cap * q.kvd, row0, row0 + T);
    }
    return DLLM_OK;
}

/* [KV quant] The key splits of the tensor-core attention (kvq_tc, on by default; device: kvq_split, kvq_n_splits): the
 * bf16 sinks [0, min(n_sink, n_committed)), the quantised rows up to n_committed and the bf16 rows past them up to
 * n_keys, each range cut at multiples of split_keys, so that no split mixes the two kinds
 * (SoloQ's quantised values are in the rotated basis). Split s is keys [j0, j1) of one range; quant says which kind. */
static void dllm__kvq_tc_ranges(int n_keys, int n_committed, int n_sink, int lo[3], int hi[3]) {
    const int qa = std::min(n_sink, n_committed);
    lo[0] = 0, hi[0] = qa, lo[1] = qa, hi[1] = n_committed, lo[2] = n_committed, hi[2] = n_keys;
}
static int dllm__kvq_tc_range_splits(int lo, int hi, int split_keys) {
    return hi > lo ? (hi - 1) / split_keys - lo / split_keys + 1 : 0;
}
static int dllm__kvq_tc_n_splits(int n_keys, int n_committed, int n_sink, int split_keys) {
    int lo[3], hi[3], n = 0;
    dllm__kvq_tc_ranges(n_keys, n_committed, n_sink, lo, hi);
    for (int r = 0; r < 3; r++) n += dllm__kvq_tc_range_splits(lo[r], hi[r], split_keys);
    return n;
}
static void dllm__kvq_tc_split(int n_keys, int n_committed, int n_sink, int split_keys, int s, int &j0, int &j1,
                               bool &quant) {
    int lo[3], hi[3];
    dllm__kvq_tc_ranges(n_keys, n_committed, n_sink, lo, hi);
    for (int r = 0; r < 3; r++) {
        const int n = dllm__kvq_tc_range_splits(lo[r], hi[r], split_keys);
        if (s < n) {
            j0 = std::max(lo[r], (lo[r] / split_keys + s) * split_keys),
            j1 = std::min(hi[r], (lo[r] / split_keys + s + 1) * split_keys);
            quant = r == 1;
            return;
        }
        s -= n;
    }
    j0 = j1 = 0, quant = false;
}

/* The block-causal attention of kvq_flash + kvq_flash_combine (section 13, kvq_tc) as they compute it, up to
 * fp32 summation order and the device's ex2.approx: the CPU twin the GPU tests compare them with. Inputs as the device
 * holds them: layer l's codes in q; `cache` [rows][2 kvd] the bf16 K|V rows (as floats) that the sinks and the rows
 * from n_committed on are read from; queries x [q_rows][q_stride] (bf16 values, head h at h * hd); out [q_rows][n_head
 * hd], fp32 (the kernel rounds it to bf16). Per split (dllm__kvq_tc_split) and per 32-key chunk at multiples of 32 (the
 * device's mma step): scores in fp32 against keys rounded to bf16 (a quantised key decoded, fmaf(code, scale, min),
 * then rounded), the online softmax in the log2 domain, probabilities rounded to bf16 before they meet the values
 * (rounded to bf16 too; SoloQ's C * scale in the rotated basis: the row scale is folded into the decoded value). The
 * splits merge in order, SoloQ's quantised ones rotated back once (R^T) before the bf16 ones join. */
DLLM__TEST_HOOK static void dllm__kvq_flash_twin(const dllm__kvq &q, int l, const float *cache, const float *x,
                                                 int q_stride, int n_head, int q_rows, int n_keys, int n_committed,
                                                 int mask_block, int q_index0, float scale, int split_keys,
                                                 float *out) {
    const int hd = q.hd, kvd = q.kvd, group = n_head / q.n_kv,
              n_splits = dllm__kvq_tc_n_splits(n_keys, n_committed, q.n_sink, split_keys);
    const float scale_log2 = scale * 1.4426950408889634f;
    auto bf16 = [](float v) { return dllm__bf16_to_f32(dllm__f32_to_bf16(v)); };
    std::vector<float> key((size_t)hd), o((size_t)n_splits * hd), ms((size_t)n_splits), ls((size_t)n_splits);
    std::vector<float> acc((size_t)hd), racc((size_t)hd), back((size_t)hd), sc(32), vals((size_t)32 * hd);
    for (int i = 0; i < q_rows; i++)
        for (int h = 0; h < n_head; h++) {
            const int kvh = h / group,
                      n_visible =
                          mask_block ? std::min(n_keys, ((q_index0 + i) / mask_block + 1) * mask_block) : n_keys;
            const float *qi = x + (size_t)i * q_stride + (size_t)h * hd;
            for (int s = 0; s < n_splits; s++) {
                int j0, j1;
                bool quant;
                dllm__kvq_tc_split(n_keys, n_committed, q.n_sink, split_keys, s, j0, j1, quant);
                float m = -INFINITY, lsum = 0.0f, *os = &o[(size_t)s * hd];
                std::fill(os, os + hd, 0.0f);
                const int end = std::min(j1, n_visible);
                for (int c0 = j0 / 32 * 32; c0 < end; c0 += 32) {
                    const int a = std::max(c0, j0), b = std::min(c0 + 32, end);
                    float mx = -INFINITY;
                    for (int j = a; j < b; j++) {
                        float *v = &vals[(size_t)(j - a) * hd];
                        if (quant) {
                            for (int c = 0; c < hd; c++) key[(size_t)c] = bf16(dllm__kvq_key(q, l, j, kvh * hd + c));
                            dllm__kvq_value(q, l, j, kvh, v);
                            for (int c = 0; c < hd; c++) v[c] = bf16(v[c]);
                        } else {
                            const float *row = cache + (size_t)j * 2 * kvd + (size_t)kvh * hd;
                            for (int c = 0; c < hd; c++) key[(size_t)c] = row[c], v[c] = row[kvd + c];
                        }
                        float dot = 0.0f;
                        for (int c = 0; c < hd; c++) dot = fmaf(qi[c], key[(size_t)c], dot);
                        sc[(size_t)(j - a)] = dot, mx = std::max(mx, dot);
                    }
                    const float n0 = std::max(m, mx * scale_log2), base = n0 == -INFINITY ? 0.0f : n0,
                                corr = exp2f(m - base);
                    m = n0, lsum *= corr;
                    for (int c = 0; c < hd; c++) os[c] *= corr;
                    for (int j = a; j < b; j++) {
                        const float p = exp2f(fmaf(sc[(size_t)(j - a)], scale_log2, -base)), pb = bf16(p);
                        const float *v = &vals[(size_t)(j - a) * hd];
                        lsum += p;
                        for (int c = 0; c < hd; c++) os[c] = fmaf(pb, v[c], os[c]);
                    }
                }
                ms[(size_t)s] = m, ls[(size_t)s] = lsum;
            }
            float mx = -INFINITY, lsum = 0.0f;
            for (int s = 0; s < n_splits; s++) mx = std::max(mx, ms[(size_t)s]);
            std::fill(acc.begin(), acc.end(), 0.0f);
            std::fill(racc.begin(), racc.end(), 0.0f);
            for (int s = 0; s < n_splits; s++) {
                if (ms[(size_t)s] == -INFINITY) continue;
                int j0, j1;
                bool quant;
                dllm__kvq_tc_split(n_keys, n_committed, q.n_sink, split_keys, s, j0, j1, quant);
                const float w = exp2f(ms[(size_t)s] - mx);
                lsum = fmaf(w, ls[(size_t)s], lsum);
                std::vector<float> &dst = quant && q.soloq() ? racc : acc;
                for (int c = 0; c < hd; c++) dst[(size_t)c] = fmaf(w, o[(size_t)s * hd + c], dst[(size_t)c]);
            }
            if (q.soloq()) dllm__rotate_inverse(q.rot[(size_t)l], racc.data(), back.data());
            const float inv = lsum > 0 ? 1.0f / lsum : 0.0f;
            float *oi = out + (size_t)i * n_head * hd + (size_t)h * hd;
            for (int c = 0; c < hd; c++) oi[c] = (acc[(size_t)c] + (q.soloq() ? back[(size_t)c] : 0.0f)) * inv;
        }
}
