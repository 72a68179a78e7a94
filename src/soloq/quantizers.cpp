/* src/soloq/quantizers.cpp - SoloQ numerics: the 4-bit formats (NVFP4, INT4, Lloyd-Max, E8P-RVQ, RTN). */

// ---- 4-bit quantisers: [NVFP4], INT4 mid-rise ([SoloQ-I]), Lloyd-Max and E8P-RVQ ([SoloQ-C]), [RTN-W4A4] ----

enum dllm__q4_format {
    DLLM__Q4_NVFP4 = 0,  // spec 6: E2M1 x UE4M3 per 16 x FP32 per row (S_enc from the row's amax)
    DLLM__Q4_INT4 = 1,   // spec 4.4: mid-rise, step 0.3352 sigma, sigma the row's RMS
    DLLM__Q4_LLOYD = 2,  // spec 4.2: Lloyd-Max 4-bit levels for N(0, 1), INT8 levels / 46
    DLLM__Q4_E8P = 3,    // spec 4.3: E8P-RVQ 4-bit (QuIP#), scale 1.03, residual 3.45, INT8 values / 35.8
    DLLM__Q4_RTN = 4     // symmetric INT4 [-7, 7], step amax / 7
};

static const char *const dllm__q4_names[] = {"NVFP4", "INT4", "Lloyd-Max", "E8P-RVQ4", "RTN INT4"};

/* Rows [rows][cols] quantised in one format (the packing: this section's header). */
struct dllm__q4_rows {
    dllm__q4_format format = DLLM__Q4_INT4;
    int rows = 0, cols = 0;
    std::vector<uint8_t> codes;                            // [rows][row_bytes()]
    std::vector<uint8_t> block_scales;                     // NVFP4: [rows][blocks()] UE4M3
    std::vector<float> row_scale;                          // [rows]: the value of an element is C * row_scale
    size_t row_bytes() const { return (size_t)cols / 2; }  // 4 bits an element in every format (E8P: 32 bits per 8)
    int blocks() const { return (cols + 15) / 16; }        // NVFP4 blocks a row, the last one shorter if cols % 16
};

static const float dllm__int4_step = 0.3352f;  // Gaussian-MSE-optimal 16-level mid-rise step, in sigma units
static const float dllm__lloyd4_thresholds[7] = {0.258222f, 0.522404f, 0.799550f, 1.099286f,
                                                 1.437139f, 1.843532f, 2.400803f};
// The Lloyd-Max levels themselves: encoding uses their midpoints (the thresholds), decoding the INT8 levels.
[[maybe_unused]] static const float dllm__lloyd4_levels[8] = {0.128395f, 0.388048f, 0.656759f, 0.942340f,
                                                              1.256231f, 1.618046f, 2.069017f, 2.732590f};
static const int dllm__lloyd4_int[8] = {6, 18, 30, 43, 58, 74, 95, 126};
static const float dllm__lloyd4_kappa = 46.0f;
static const float dllm__e8p_scale = 1.03f, dllm__e8p_resid = 3.45f, dllm__e8p_kappa = 35.8f;

/* The magnitude code of an E2M1 value, rounding |v| to nearest even with satfinite (spec 6.2 step 4). */
static uint8_t dllm__f32_to_e2m1(float v) {
    const float a = fabsf(v);
    const int m = a <= 0.25f   ? 0
                  : a < 0.75f  ? 1
                  : a <= 1.25f ? 2
                  : a < 1.75f  ? 3
                  : a <= 2.5f  ? 4
                  : a < 3.5f   ? 5
                  : a <= 5.0f  ? 6
                               : 7;
    return m ? (uint8_t)((signbit(v) ? 8 : 0) | m) : 0;
}

static float dllm__e2m1_to_f32(uint8_t c) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return c & 8 ? -mag[c & 7] : mag[c & 7];
}

/* NVFP4 of n elements with the encode scale s_enc (spec 6.2 steps 2-4): e2m1 codes into c4[n], UE4M3 block scales
 * into bs[ceil(n / 16)] (the last block may be shorter), and each element's value before S_dec, e2m1 * s_b, into
 * value[n]. */
static void dllm__nvfp4_encode(const float *x, int n, float s_enc, uint8_t *c4, uint8_t *bs, float *value) {
    const float *e4m3 = dllm__e4m3_table();
    for (int b0 = 0; b0 < n; b0 += 16) {
        const int b1 = std::min(n, b0 + 16);
        const uint8_t sb = dllm__f32_to_e4m3((dllm__amax(x + b0, b1 - b0) / 6.0f) * s_enc);
        const float scale = e4m3[sb], enc = sb ? s_enc / scale : 0.0f;
        bs[b0 / 16] = sb;
        for (int i = b0; i < b1; i++) {
            c4[i] = sb ? dllm__f32_to_e2m1(x[i] * enc) : 0;
            value[i] = dllm__e2m1_to_f32(c4[i]) * scale;
        }
    }
}

/* The global encode scale of an amax (spec 6.2 step 1): 2688 / amax, 1 when amax is 0 or the quotient is 0. */
static float dllm__nvfp4_s_enc(float amax) {
    const float s = fminf(2688.0f / amax, FLT_MAX);
    return amax > 0 && s > 0 ? s : 1.0f;
}

// ---- the E8P lattice codebook (QuIP#'s E8P, spec 4.3) -----------------------------------------------------

/* Abs pattern number `index` (0..255) of E8P: 8 bytes in half units (2|a_i| in {1, 3, 5}): first the 227 patterns of
 * norm^2 <= 10, in lexicographic order of (coordinate 0, ..., 7) with 1 < 3 < 5, then QuIP#'s 29 norm-12 paddings
 * (five 3/2 and three 1/2; listed by the positions of the 1/2s, the deduplicated list of
 * latticee8_padded12_rvq4bit.py). The order is dllm's own: no QuIP# file is ever read. */
static const uint8_t *dllm__e8p_abs(int index) {
    static const std::vector<uint8_t> table = [] {
        std::vector<uint8_t> t;
        for (int code = 0; code < 6561; code++) {
            uint8_t a[8];
            int rest = code, norm4 = 0;  // 4 * norm^2 = sum (2 a_i)^2
            for (int i = 7; i >= 0; i--, rest /= 3) a[i] = (uint8_t)(1 + 2 * (rest % 3));
            for (uint8_t h : a) norm4 += h * h;
            if (norm4 <= 40) t.insert(t.end(), a, a + 8);
        }
        static const char *const pads[29] = {"123", "023", "013", "012", "367", "357", "347", "356", "346", "345",
                                             "267", "257", "247", "256", "246", "245", "167", "157", "147", "156",
                                             "146", "045", "067", "057", "047", "056", "046", "014", "237"};
        for (const char *p : pads) {
            uint8_t a[8] = {3, 3, 3, 3, 3, 3, 3, 3};
            for (const char *c = p; *c; c++) a[*c - '0'] = 1;
            t.insert(t.end(), a, a + 8);
        }
        return t;
    }();
    return table.data() + (size_t)index * 8;
}

/* Decodes an E8P code to 4 x its 8 coordinates (odd integers in [-11, 11]). Bits 15..8: abs index; 7..1: the signs
 * of coordinates 1..7 (1 = negative); 0: the shift (1 = +1/4). The sign of coordinate 0 makes the count of negative
 * signs congruent to sum |a| (mod 2), so that sum(s a) is even. */
static void dllm__e8p_decode4(uint16_t code, int out4[8]) {
    const uint8_t *a = dllm__e8p_abs(code >> 8);
    int neg = 0, sum_half = 0;
    for (int i = 0; i < 8; i++) sum_half += a[i];
    for (int i = 1; i < 8; i++) neg += code >> i & 1;
    const bool neg0 = ((sum_half / 2 - neg) & 1) != 0;
    const int shift = code & 1 ? 1 : -1;
    for (int i = 0; i < 8; i++) {
        const bool negative = i == 0 ? neg0 : (code >> i & 1) != 0;
        out4[i] = 2 * (negative ? -a[i] : a[i]) + shift;
    }
}

/* The nearest E8P codeword to x[8] (spec 4.3's exact search, QuIP#'s fast_quantize_part): for each shift (-1/4
 * first) and abs pattern a (index order), cost = sum (|y_i| - a_i)^2 + [parity violated] min_i 4 |y_i| a_i with
 * y = x - shift, each product and sum rounded separately in fp32 in coordinate order; the first strict minimum wins.
 * Signs are sign(y) (0 counts as +), with the cheapest coordinate flipped when the parity is violated. */
static uint16_t dllm__e8p_encode(const float x[8]) {
    float best = INFINITY;
    uint16_t best_code = 0;
    for (int s = 0; s < 2; s++) {
        const float shift = s ? 0.25f : -0.25f;
        float y[8], ay[8];
        int neg_y = 0;
        for (int i = 0; i < 8; i++) {
            y[i] = x[i] - shift;
            ay[i] = fabsf(y[i]);
            neg_y += y[i] < 0;
        }
        for (int p = 0; p < 256; p++) {
            const uint8_t *h = dllm__e8p_abs(p);
            float cost = 0, flip_cost = INFINITY;
            int sum_half = 0, flip = 0;
            for (int i = 0; i < 8; i++) {
                const float a = 0.5f * h[i], e = ay[i] - a;
                cost = cost + e * e;
                const float fc = 4.0f * ay[i] * a;
                if (fc < flip_cost) flip_cost = fc, flip = i;
                sum_half += h[i];
            }
            const bool violated = ((neg_y - sum_half / 2) & 1) != 0;
            if (violated) cost = cost + flip_cost;
            if (cost < best) {
                best = cost;
                uint16_t code = (uint16_t)(p << 8 | s);
                for (int i = 1; i < 8; i++) code |= (uint16_t)(((y[i] < 0) != (violated && flip == i)) << i);
                best_code = code;
            }
        }
    }
    return best_code;
}

/* W_int[e1][e2] = round(35.8 (e1 + e2 / 3.45)) for the 12 x 12 pairs of odd quarter values (index (4v + 11) / 2). */
static int dllm__e8p_int(int e1_4, int e2_4) {
    static const std::vector<int8_t> table = [] {
        std::vector<int8_t> t(144);
        for (int i = 0; i < 12; i++)
            for (int j = 0; j < 12; j++)
                t[(size_t)i * 12 + j] = (int8_t)lrint(35.8 * ((2 * i - 11) / 4.0 + (2 * j - 11) / 4.0 / 3.45));
        return t;
    }();
    return table[(size_t)((e1_4 + 11) / 2) * 12 + (e2_4 + 11) / 2];
}

// ---- one row, every format -------------------------------------------------------------------------------

/* C of element i of a packed row (the inverse of the packing; NVFP4 reads its block scale). */
static float dllm__q4_value(dllm__q4_format f, const uint8_t *packed, const uint8_t *block_scales, int i) {
    if (f == DLLM__Q4_E8P) {
        const uint8_t *p = packed + (size_t)(i / 8) * 4;
        int e1[8], e2[8];
        dllm__e8p_decode4((uint16_t)(p[0] | p[1] << 8), e1);
        dllm__e8p_decode4((uint16_t)(p[2] | p[3] << 8), e2);
        return (float)dllm__e8p_int(e1[i % 8], e2[i % 8]);
    }
    const uint8_t c = packed[i / 2] >> (4 * (i & 1)) & 15;
    const int signed4 = c & 8 ? (int)c - 16 : (int)c;
    switch (f) {
        case DLLM__Q4_NVFP4: return dllm__e2m1_to_f32(c) * dllm__e4m3_table()[block_scales[i / 16]];
        case DLLM__Q4_INT4: return (float)(2 * signed4 + 1);
        case DLLM__Q4_LLOYD: return (float)(c & 8 ? -dllm__lloyd4_int[c & 7] : dllm__lloyd4_int[c & 7]);
        default: return (float)signed4;
    }
}

/* The encoders of one nonzero row x[n]: 4-bit codes into c4 (E8P: its packed codes), each element's C into value, and
 * the format's own row scale returned. sigma = the row's RMS. */
static float dllm__encode_nvfp4(const float *x, int n, uint8_t *c4, uint8_t *block_scales, float *value) {
    const float s_enc = dllm__nvfp4_s_enc(dllm__amax(x, n));
    dllm__nvfp4_encode(x, n, s_enc, c4, block_scales, value);
    return 1.0f / s_enc;
}

static float dllm__encode_rtn(const float *x, int n, uint8_t *c4, float *value) {
    const float scale = dllm__amax(x, n) / 7.0f;
    for (int i = 0; i < n; i++) {
        const float q = fminf(fmaxf(rintf(x[i] / scale), -7.0f), 7.0f);  // NaN clamps to -7: the row scale is NaN then
        c4[i] = (uint8_t)((int)q & 15);
        value[i] = q;
    }
    return scale;
}

static float dllm__encode_int4(const float *x, int n, float sigma, uint8_t *c4, float *value) {
    const float step = sigma * dllm__int4_step;
    for (int i = 0; i < n; i++) {
        const float q = fminf(fmaxf(floorf(x[i] / step), -8.0f), 7.0f);
        c4[i] = (uint8_t)((int)q & 15);
        value[i] = 2.0f * q + 1.0f;
    }
    return step / 2.0f;
}

static float dllm__encode_lloyd(const float *x, int n, float sigma, uint8_t *c4, float *value) {
    for (int i = 0; i < n; i++) {
        const float z = x[i] / sigma, az = fabsf(z);
        int level = 0;
        while (level < 7 && az >= dllm__lloyd4_thresholds[level]) level++;
        c4[i] = (uint8_t)((z < 0 ? 8 : 0) | level);
        value[i] = (float)(z < 0 ? -dllm__lloyd4_int[level] : dllm__lloyd4_int[level]);
    }
    return sigma / dllm__lloyd4_kappa;
}

/* E8P-RVQ4: stage 1 on v1 = 1.03 z, stage 2 on the residual (v1 - e1) x 3.45; two codes per 8 into packed. */
static float dllm__encode_e8p(const float *x, int n, float sigma, uint8_t *packed, float *value) {
    for (int g = 0; g < n; g += 8) {
        float v1[8], v2[8];
        int e1[8], e2[8];
        for (int i = 0; i < 8; i++) v1[i] = (x[g + i] / sigma) * dllm__e8p_scale;
        const uint16_t c1 = dllm__e8p_encode(v1);
        dllm__e8p_decode4(c1, e1);
        for (int i = 0; i < 8; i++) v2[i] = (v1[i] - 0.25f * (float)e1[i]) * dllm__e8p_resid;
        const uint16_t c2 = dllm__e8p_encode(v2);
        dllm__e8p_decode4(c2, e2);
        uint8_t *p = packed + (size_t)g / 2;
        p[0] = (uint8_t)c1, p[1] = (uint8_t)(c1 >> 8), p[2] = (uint8_t)c2, p[3] = (uint8_t)(c2 >> 8);
        for (int i = 0; i < 8; i++) value[g + i] = (float)dllm__e8p_int(e1[i], e2[i]);
    }
    return sigma / (dllm__e8p_scale * dllm__e8p_kappa);
}

/* Quantises row x[n] in format f. Writes the packed codes (row_bytes), NVFP4's block scales, and returns the row
 * scale; value[n] receives each element's C (the value is C * row scale). With bias_correction the row scale is
 * SoloQ's ||x||^2 / <C, x> (spec 5: the projection of the quantised row on x is exact), otherwise the format's own
 * scale. A zero row gets codes 0 and scale 0; a row holding Inf or NaN gets a NaN scale (non-finite input never
 * turns into finite output); if <C, x> <= 0 the format's own scale stays. */
static float dllm__q4_quantize_row(dllm__q4_format f, const float *x, int n, bool bias_correction, uint8_t *packed,
                                   uint8_t *block_scales, float *value) {
    const float ss = dllm__soloq_dot(x, x, n), sigma = sqrtf(ss / (float)n);
    std::vector<uint8_t> c4((size_t)n, 0);
    float scale = 0;
    if (ss == 0) {
        if (f == DLLM__Q4_NVFP4) memset(block_scales, 0, (size_t)(n + 15) / 16);
        if (f == DLLM__Q4_E8P) memset(packed, 0, (size_t)n / 2);
    } else {
        switch (f) {
            case DLLM__Q4_NVFP4: scale = dllm__encode_nvfp4(x, n, c4.data(), block_scales, value); break;
            case DLLM__Q4_RTN: scale = dllm__encode_rtn(x, n, c4.data(), value); break;
            case DLLM__Q4_INT4: scale = dllm__encode_int4(x, n, sigma, c4.data(), value); break;
            case DLLM__Q4_LLOYD: scale = dllm__encode_lloyd(x, n, sigma, c4.data(), value); break;
            case DLLM__Q4_E8P: scale = dllm__encode_e8p(x, n, sigma, packed, value); break;
        }
    }
    if (f != DLLM__Q4_E8P)
        for (int i = 0; i < n; i += 2) packed[i / 2] = (uint8_t)(c4[(size_t)i] | c4[(size_t)i + 1] << 4);
    if (ss == 0)  // codes 0 decode to a nonzero C in some formats (INT4: 1); scale 0 makes the row 0
        for (int i = 0; i < n; i++) value[i] = dllm__q4_value(f, packed, block_scales, i);
    if (!(ss <= FLT_MAX)) return NAN;
    if (bias_correction && ss > 0) {
        const float proj = dllm__soloq_dot(value, x, n);
        if (proj > 0) scale = ss / proj;
    }
    return scale;
}

/* Dequantised row r of q: C * row scale. */
static void dllm__q4_row(const dllm__q4_rows &q, int r, float *dst) {
    const uint8_t *packed = q.codes.data() + (size_t)r * q.row_bytes();
    const uint8_t *bs = q.format == DLLM__Q4_NVFP4 ? q.block_scales.data() + (size_t)r * q.blocks() : nullptr;
    if (q.format == DLLM__Q4_E8P) {  // decode each group once
        for (int g = 0; g < q.cols; g += 8) {
            int e1[8], e2[8];
            const uint8_t *p = packed + (size_t)g / 2;
            dllm__e8p_decode4((uint16_t)(p[0] | p[1] << 8), e1);
            dllm__e8p_decode4((uint16_t)(p[2] | p[3] << 8), e2);
            for (int i = 0; i < 8; i++) dst[g + i] = (float)dllm__e8p_int(e1[i], e2[i]) * q.row_scale[(size_t)r];
        }
        return;
    }
    for (int i = 0; i < q.cols; i++) dst[i] = dllm__q4_value(q.format, packed, bs, i) * q.row_scale[(size_t)r];
}

/* Quantises rows x[rows][cols], each row on its own (per token / per row): the pool splits rows, and a row's codes
 * and scale depend on that row only. cols % 8 == 0 (E8P's groups, whole bytes). */
static dllm__q4_rows dllm__q4_quantize(dllm__pool *pool, dllm__q4_format f, const float *x, int rows, int cols,
                                       bool bias_correction) {
    dllm__q4_rows q;
    q.format = f, q.rows = rows, q.cols = cols;
    q.codes.resize((size_t)rows * q.row_bytes());
    if (f == DLLM__Q4_NVFP4) q.block_scales.resize((size_t)rows * q.blocks());
    q.row_scale.resize((size_t)rows);
    auto one = [&](int r) {
        std::vector<float> value((size_t)cols);
        q.row_scale[(size_t)r] = dllm__q4_quantize_row(
            f, x + (size_t)r * cols, cols, bias_correction, q.codes.data() + (size_t)r * q.row_bytes(),
            f == DLLM__Q4_NVFP4 ? q.block_scales.data() + (size_t)r * q.blocks() : nullptr, value.data());
    };
    if (pool)
        pool->run(rows, one);
    else
        for (int r = 0; r < rows; r++) one(r);
    return q;
}

/* x := dequantise(quantise(x)) row by row: the value a GEMM input has under a 4-bit format. */
static void dllm__q4_fake_quantize(dllm__q4_format f, float *x, int rows, int cols, bool bias_correction) {
    std::vector<float> value((size_t)cols);
    std::vector<uint8_t> packed((size_t)cols / 2), bs((size_t)(cols + 15) / 16);
    for (int r = 0; r < rows; r++) {
        float *xr = x + (size_t)r * cols;
        const float scale = dllm__q4_quantize_row(f, xr, cols, bias_correction, packed.data(), bs.data(), value.data());
        for (int i = 0; i < cols; i++) xr[i] = value[(size_t)i] * scale;
    }
}
