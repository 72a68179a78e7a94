/* src/cpu/fp8.cpp - FP8 E4M3 quantiser twins (LaCache 3.4). */

/* ---- FP8 E4M3: the quantiser and the CPU half of dllm_precision (LaCache 3.4) ----------------------
 * These are the twins of the GPU kernels in dllm__src_fp8. E4M3 has 1 sign, 4 exponent (bias 7) and 3
 * mantissa bits: normals (1 + m/8) * 2^(e-7) up to 448, subnormals m * 2^-9, no infinity, NaN = S.1111.111.
 * Conversion rounds to nearest even and saturates to +-448 (Inf too), as PTX cvt.rn.satfinite does.
 * dllm's codes are canonical: one zero (0x00, the sign of a zero is dropped) and one NaN (0x7f), so the
 * bits never depend on how a piece of hardware signs them. A quantised group holds q = e4m3(x / s) with
 * s = amax / 448 (IEEE division on both sides, so twin and kernel agree bit for bit); a group whose amax
 * is 0 gets s = 1. amax ignores NaN (a NaN element stays NaN); a group holding Inf gets s = Inf, its codes
 * are NaN (the Inf) and 0, and every value of it dequantises to NaN (0 * Inf): non-finite input never turns
 * into finite output. */
static const int dllm__fp8_group = 128;  // activation groups 1x128, weight blocks 128x128

static uint8_t dllm__f32_to_e4m3(float x) {
    if (x != x) return 0x7f;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const float a = fabsf(x);
    int mag;
    if (a < 0x1p-6f) {
        mag = (int)nearbyintf(a * 512.0f);  // subnormal grid 2^-9; 8 rounds up into the smallest normal (code 8)
    } else if (a >= 448.0f) {
        mag = 0x7e;  // saturate
    } else {
        int e;
        float m = frexpf(a, &e);  // a = m * 2^e, m in [0.5, 1): exponent field e + 6, mantissa 16m - 8;
        mag = (e + 6) * 8 + (int)nearbyintf(m * 16.0f) - 8;  // a mantissa that rounds to 8 carries into the exponent
    }
    return mag ? (uint8_t)(sign | mag) : 0;
}

static float dllm__e4m3_to_f32(uint8_t c) {
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    float v = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
    return c & 0x80 ? -v : v;
}

/* All 256 codes decoded once: the CPU forward decodes every FP8 weight row it multiplies. */
static const float *dllm__e4m3_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(256);
        for (int c = 0; c < 256; c++) t[(size_t)c] = dllm__e4m3_to_f32((uint8_t)c);
        return t;
    }();
    return table.data();
}

/* The scale of a group or block from its largest magnitude. */
static float dllm__e4m3_scale(float amax) {
    float s = amax / 448.0f;
    return s > 0 ? s : 1.0f;  // all zeros (or amax so small that s underflows): 1, never a division by 0
}

static float dllm__amax(const float *x, int n, float acc = 0.0f) {
    for (int i = 0; i < n; i++) acc = fmaxf(acc, fabsf(x[i]));  // fmaxf drops NaN, as the kernels' fmaxf does
    return acc;
}

/* Rows x[rows][k] in groups of 128 along k (the last one may be shorter): codes q[rows][k] and scales
 * s[rows][ceil(k / 128)] (the GPU writes the same numbers padded and token-contiguous). */
static void dllm__quantize_groups(const float *x, int rows, int k, uint8_t *q, float *s) {
    const int groups = (k + dllm__fp8_group - 1) / dllm__fp8_group;
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < groups; g++) {
            const int k0 = g * dllm__fp8_group, n = std::min(dllm__fp8_group, k - k0);
            const float *xg = x + (size_t)r * k + k0;
            const float sc = dllm__e4m3_scale(dllm__amax(xg, n));
            for (int i = 0; i < n; i++) q[(size_t)r * k + k0 + i] = dllm__f32_to_e4m3(xg[i] / sc);
            s[(size_t)r * groups + g] = sc;
        }
}

/* x := dequantise(quantise(x)) in 1x128 groups: the value a GEMM input has under FP8. */
static void dllm__fake_quantize_groups(float *x, int rows, int k) {
    const int groups = (k + dllm__fp8_group - 1) / dllm__fp8_group;
    std::vector<uint8_t> q((size_t)k);
    std::vector<float> s((size_t)groups);
    const float *decode = dllm__e4m3_table();
    for (int r = 0; r < rows; r++) {
        float *xr = x + (size_t)r * k;
        dllm__quantize_groups(xr, 1, k, q.data(), s.data());
        for (int i = 0; i < k; i++) xr[i] = decode[q[(size_t)i]] * s[(size_t)(i / dllm__fp8_group)];
    }
}

/* A weight matrix [rows][cols] in E4M3 with one fp32 scale per 128x128 block (scale[rb][cb], partial blocks
 * at the edges). */
struct dllm__fp8_matrix {
    int rows = 0, cols = 0;
    std::vector<uint8_t> q;
    std::vector<float> scale;
    bool empty() const { return rows == 0; }
    int col_blocks() const { return (cols + dllm__fp8_group - 1) / dllm__fp8_group; }
    void row(int r, float *dst) const {
        const float *s = scale.data() + (size_t)(r / dllm__fp8_group) * col_blocks(), *decode = dllm__e4m3_table();
        for (int c = 0; c < cols; c++) dst[c] = decode[q[(size_t)r * cols + c]] * s[c / dllm__fp8_group];
    }
};

/* Twin of the kernel quantize_weight_blocks. */
static dllm__fp8_matrix dllm__quantize_blocks(const float *w, int rows, int cols) {
    dllm__fp8_matrix m;
    m.rows = rows;
    m.cols = cols;
    m.q.resize((size_t)rows * cols);
    const int rb_n = (rows + dllm__fp8_group - 1) / dllm__fp8_group, cb_n = m.col_blocks();
    m.scale.resize((size_t)rb_n * cb_n);
    for (int rb = 0; rb < rb_n; rb++)
        for (int cb = 0; cb < cb_n; cb++) {
            const int r0 = rb * dllm__fp8_group, r1 = std::min(rows, r0 + dllm__fp8_group);
            const int c0 = cb * dllm__fp8_group, n = std::min(dllm__fp8_group, cols - c0);
            float amax = 0;
            for (int r = r0; r < r1; r++) amax = dllm__amax(w + (size_t)r * cols + c0, n, amax);
            const float s = dllm__e4m3_scale(amax);
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c0 + n; c++)
                    m.q[(size_t)r * cols + c] = dllm__f32_to_e4m3(w[(size_t)r * cols + c] / s);
            m.scale[(size_t)rb * cb_n + cb] = s;
        }
    return m;
}

/* Twin of the GPU kernel fp8_gemm, on its operands (the GPU layouts: see struct dllm__gemm_op): codes xq [m_pad x k]
 * with scales x_scale[kb * m_pad + m], codes wq [n x k] with block scales w_scale[nb * ceil4(k / 128) + kb]; k a
 * multiple of 128. Rows [0, rows) of y [rows x n] (bf16 bits) = bf16(total), the total summed over the 128-wide groups
 * in order as total = fmaf(G, sx * sw, total), G the group's 128 code products summed in fp32
 * (each product is exact: an E4M3 value has 4 significant bits). Only the order of G's sum differs from the tensor
 * cores'. The tests' reference: the CPU forward multiplies dequantised values instead (dllm__cpu_linear_fp8), so the
 * library itself never calls it. */
[[maybe_unused]] static void dllm__fp8_gemm_twin(const uint8_t *xq, const float *x_scale, int m_pad, int rows,
                                                 const uint8_t *wq, const float *w_scale, int n, int k, uint16_t *y) {
    const int groups = k / dllm__fp8_group, w_ld = (groups + 3) / 4 * 4;
    const float *decode = dllm__e4m3_table();
    std::vector<float> xd((size_t)k), wd((size_t)n * k);
    for (size_t i = 0; i < wd.size(); i++) wd[i] = decode[wq[i]];
    for (int m = 0; m < rows; m++) {
        for (int c = 0; c < k; c++) xd[(size_t)c] = decode[xq[(size_t)m * k + c]];
        for (int j = 0; j < n; j++) {
            const float *wr = wd.data() + (size_t)j * k;
            float total = 0;
            for (int g = 0; g < groups; g++) {
                float G = 0;
                for (int c = g * dllm__fp8_group; c < (g + 1) * dllm__fp8_group; c++) G += xd[(size_t)c] * wr[c];
                total =
                    fmaf(G, x_scale[(size_t)g * m_pad + m] * w_scale[(size_t)(j / dllm__fp8_group) * w_ld + g], total);
            }
            y[(size_t)m * n + j] = dllm__f32_to_bf16(total);
        }
    }
}

/* Tensors stacked by rows, as the GPU fuses them (Q|K|V, gate|up), in their BF16 values (what the GPU holds, so both
 * backends quantise the same numbers): [rows][cols] in fp32. */
static std::vector<float> dllm__stack_bf16(const std::vector<const dllm__tensor *> &parts, int &rows, int &cols) {
    cols = (int)parts[0]->shape[1];
    std::vector<float> w;
    size_t n = 0;
    for (const dllm__tensor *t : parts) n += (size_t)t->numel;
    w.reserve(n);
    for (const dllm__tensor *t : parts)
        for (int64_t i = 0; i < t->numel; i++)
            w.push_back(dllm__bf16_to_f32(dllm__f32_to_bf16(dllm__tensor_at(*t, i))));
    rows = (int)(w.size() / (size_t)cols);
    return w;
}

/* Tensors stacked by rows (dllm__stack_bf16) and quantised in 128x128 blocks. */
static dllm__fp8_matrix dllm__quantize_stacked(const std::vector<const dllm__tensor *> &parts) {
    int rows = 0, cols = 0;
    const std::vector<float> w = dllm__stack_bf16(parts, rows, cols);
    return dllm__quantize_blocks(w.data(), rows, cols);
}

/* A layer's Q|K|V rows: LLaDA2's fused projection, or the three. */
static std::vector<const dllm__tensor *> dllm__qkv_parts(const dllm__layer_weights &L) {
    if (L.wqkv) return {L.wqkv};
    return {L.wq, L.wk, L.wv};
}

/* Gate, up and down of a layer's always-on SwiGLU: its MLP, or in a LLaDA2 MoE layer (one with a router) its shared
 * expert (null where there is none). A MoE layer's routed experts are L.expert_gate/up/down. */
static std::array<const dllm__tensor *, 3> dllm__ffn_parts(const dllm__layer_weights &L) {
    if (L.router) return {L.shared_gate, L.shared_up, L.shared_down};
    return {L.gate, L.up, L.down};
}

/* SoloQ's 4-bit linears of a layer (section 9b), by input site; declared here for the forward's hooks. In a LLaDA2
 * MoE layer GU and DOWN hold the shared expert, and each routed expert has its own GU and DOWN linears (expert). */
enum dllm__soloq_site {
    DLLM__SOLOQ_QKV,
    DLLM__SOLOQ_O,
    DLLM__SOLOQ_GU,
    DLLM__SOLOQ_DOWN,
    DLLM__SOLOQ_HEAD,
    DLLM__SOLOQ_SITES
};
struct dllm__soloq_layer;
static void dllm__cpu_linear_soloq(dllm__pool &pool, float *x, bool prepare_x, int T, const dllm__soloq_layer &q,
                                   int site, int row0, const float *bias, int N, float *y, int expert = -1);

/* The quantised weights of one layer: FP8 (an empty matrix: that linear runs exact) or SoloQ (every linear). gu and
 * down are the layer's always-on SwiGLU (dllm__ffn_parts); expert_gu and expert_down LLaDA2's routed experts. */
struct dllm__fp8_layer {
    dllm__fp8_matrix qkv, o, gu, down;
    std::vector<dllm__fp8_matrix> expert_gu, expert_down;
    std::shared_ptr<const dllm__soloq_layer> soloq;
};

/* Layer l's FFN linears in FP8: its always-on SwiGLU and, in a LLaDA2 MoE layer, every routed expert. */
static void dllm__fp8_quantize_ffn(const dllm__layer_weights &L, dllm__fp8_layer &q) {
    const std::array<const dllm__tensor *, 3> ffn = dllm__ffn_parts(L);
    if (ffn[0]) {
        q.gu = dllm__quantize_stacked({ffn[0], ffn[1]});
        q.down = dllm__quantize_stacked({ffn[2]});
    }
    if (!L.router) return;
    for (size_t e = 0; e < L.expert_gate.size(); e++) {
        q.expert_gu.push_back(dllm__quantize_stacked({L.expert_gate[e], L.expert_up[e]}));
        q.expert_down.push_back(dllm__quantize_stacked({L.expert_down[e]}));
    }
}

/* Quantised once when a CPU context is created: nothing for BF16 and for layer 0 (LaCache keeps it exact; in the
 * LLaDA2 checkpoints its FFN is the dense MLP). progress counts layers 1.. . */
static std::vector<dllm__fp8_layer> dllm__cpu_fp8_weights(const dllm_model &m, dllm_precision precision,
                                                          const dllm__progress &progress = dllm__progress()) {
    const bool fp8 = precision == DLLM_PRECISION_FP8_FFN || precision == DLLM_PRECISION_FP8_ALL;
    std::vector<dllm__fp8_layer> out(fp8 ? m.layers.size() : 0);
    for (size_t l = 1; l < out.size(); l++) {
        const dllm__layer_weights &L = m.layers[l];
        dllm__fp8_quantize_ffn(L, out[l]);
        if (precision == DLLM_PRECISION_FP8_ALL) {
            out[l].qkv = dllm__quantize_stacked(dllm__qkv_parts(L));
            out[l].o = dllm__quantize_stacked({L.wo});
        }
        progress.report((int)l, (int)out.size() - 1);
    }
    return out;
}
