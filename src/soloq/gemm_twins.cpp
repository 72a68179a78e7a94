/* src/soloq/gemm_twins.cpp - CPU twins of the 4-bit and INT8 GEMMs. */

// ---- [W4 GEMM] twin: y = (sum_k C_a C_w * s_x) * s_w on packed weight rows (GPU: q4_gemm, section 13) ---------------

/* The C values of one packed row of K elements (no row scale): E8P decodes each group once. */
static void dllm__q4_row_values(dllm__q4_format f, const uint8_t *packed, const uint8_t *block_scales, int K,
                                float *dst) {
    if (f != DLLM__Q4_E8P) {
        for (int i = 0; i < K; i++) dst[i] = dllm__q4_value(f, packed, block_scales, i);
        return;
    }
    for (int g = 0; g < K; g += 8) {
        int e1[8], e2[8];
        const uint8_t *p = packed + (size_t)g / 2;
        dllm__e8p_decode4((uint16_t)(p[0] | p[1] << 8), e1);
        dllm__e8p_decode4((uint16_t)(p[2] | p[3] << 8), e2);
        for (int i = 0; i < 8; i++) dst[g + i] = (float)dllm__e8p_int(e1[i], e2[i]);
    }
}

/* Twin of the GPU kernel q4_gemm: y[m * ldy + n] = (acc * s_x[m]) * row_scale[n], acc = the fp32 sum over k ascending
 * of A[m][k] * C_w[n][k] (A: bf16 values held as floats, rows lda apart; s_x null = 1), every product exact. Weights:
 * N packed rows of K elements in format f (section 9b's layout: K / 2 bytes a row, NVFP4's ceil(K / 16) block scales
 * a row). Where every partial sum is an integer below 2^24 (INT4 and RTN weights times integer activations), any
 * order of summation gives these bits, so the GPU must match them exactly; elsewhere the order differs within fp32
 * rounding. */
[[maybe_unused]] static void dllm__cpu_q4_gemm(dllm__q4_format f, const uint8_t *codes, const uint8_t *block_scales,
                                               const float *row_scale, const float *A, int lda, const float *s_x,
                                               float *y, int ldy, int M, int N, int K) {
    std::vector<float> w((size_t)K);
    const int blocks = (K + 15) / 16;
    for (int n = 0; n < N; n++) {
        dllm__q4_row_values(f, codes + (size_t)n * (K / 2),
                            f == DLLM__Q4_NVFP4 ? block_scales + (size_t)n * blocks : nullptr, K, w.data());
        for (int m = 0; m < M; m++) {
            const float *a = A + (size_t)m * lda;
            float acc = 0;
            for (int k = 0; k < K; k++) acc = fmaf(a[k], w[(size_t)k], acc);
            y[(size_t)m * ldy + n] = (acc * (s_x ? s_x[m] : 1.0f)) * row_scale[n];
        }
    }
}

// ---- [INT8 GEMM] twin: y = ((float)sum_k C_x C_w * s_x) * s_w, the sum exact in int32 (GPU: gemm_q4's INT8 path)
// -----

/* The largest |C| a format's codes decode to, for the formats whose C values are integers (spec 9.2 path A: INT8
 * tensor cores); 0 for NVFP4, whose C values are not. */
static int dllm__q4_int_max(dllm__q4_format f) {
    switch (f) {
        case DLLM__Q4_INT4: return 15;  // 2q + 1, q in [-8, 7]
        case DLLM__Q4_LLOYD: return dllm__lloyd4_int[7];
        case DLLM__Q4_E8P: return 127;
        case DLLM__Q4_RTN: return 8;  // the quantiser writes [-7, 7], but a stored nibble may hold -8
        default: return 0;
    }
}

/* Whether every partial sum of K products of an activation C (format fa) and a weight C (fw) stays below 2^24 in
 * magnitude: then an fp32 accumulation in any order is exact, so q4_gemm, the BF16 path and the INT8 GEMM give the same
 * bits (SoloQ-I at LLaDA-8B's widest K, 14336: 15 * 15 * 14336 = 3.2e6). SoloQ-C's 126 * 127 per product passes only
 * for K <= 1048. */
static bool dllm__q4_int_sum_exact_in_fp32(dllm__q4_format fa, dllm__q4_format fw, int K) {
    const int64_t product = (int64_t)dllm__q4_int_max(fa) * dllm__q4_int_max(fw);
    return product > 0 && product * K < ((int64_t)1 << 24);
}

/* Twin of gemm_q4's INT8 path (the cuBLASLt INT8 GEMM and soloq_scale_rows_i32): y[m * ldy + n] = ((float)acc * s_x[m])
 * * s_w[n], acc the exact int32 sum over k of X[m][k] * W[n][k] (int8 C values, rows ldx and K apart). |acc| is at
 * most 127 * 127 * K, so K up to 2^31 / 127^2 = 133144 cannot overflow. */
[[maybe_unused]] static void dllm__cpu_i8_gemm(const int8_t *X, int ldx, const int8_t *W, const float *s_x,
                                               const float *s_w, float *y, int ldy, int M, int N, int K) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const int8_t *x = X + (size_t)m * ldx, *w = W + (size_t)n * K;
            int32_t acc = 0;
            for (int k = 0; k < K; k++) acc += (int32_t)x[k] * w[k];
            y[(size_t)m * ldy + n] = ((float)acc * s_x[m]) * s_w[n];
        }
}

// ---- [W4 GEMM] q4wg's layout twin: canonical rows into the packed layout q4wg_gemm reads (GPU: q4wg_prepack) ----

/* Per 64-row tile and 128-wide k block, 4096 bytes [h 0..1][thread 0..127][16 bytes]: byte 4 j + b of a thread's 16
 * holds, for k32 step s = 2 h + j / 2 and row 16 warp + lane / 4 + 8 (j % 2), the nibbles of k = 32 s + 4 (lane % 4) +
 * b (low) and k + 16 (high): wgmma's 8-bit A fragment (register j % 2 and j % 2 + 2, byte b) after q4wg's widening. */
[[maybe_unused]] static void dllm__q4wg_prepack(const uint8_t *rows, int n, int k, uint8_t *packed) {
    auto nibble = [&](int row, int kk) { return rows[(size_t)row * (k / 2) + kk / 2] >> (4 * (kk & 1)) & 15; };
    const int kb_count = k / 128;
    for (size_t i = 0; i < (size_t)n * k / 2; i++) {
        const int byte = (int)(i % 4096), b = byte & 3, j = (byte >> 2) & 3, thread = (byte >> 4) & 127, h = byte >> 11;
        const int warp = thread >> 5, lane = thread & 31;
        const size_t block = i / 4096;
        const int tile = (int)(block / kb_count), kb = (int)(block % kb_count);
        const int s = 2 * h + (j >> 1), row = 64 * tile + 16 * warp + lane / 4 + 8 * (j & 1);
        const int kk = 128 * kb + 32 * s + 4 * (lane % 4) + b;
        packed[i] = (uint8_t)(nibble(row, kk) | nibble(row, kk + 16) << 4);
    }
}

// ---- [W4 GEMM] q4wg_gemm_nv's layout twin: NVFP4 rows and block scales into its packed layout (GPU: q4wg_prepack_nv)

/* The code-word bit that lands on A register j's value bit q (q 0-3: bits 6, 7, 8, 15 of the low bf16 = e2m1's m, e0,
 * e1 and sign; q 4-7: bits 22, 23, 24, 31, the high bf16's) through the kernel's extractions x & S, rotl(x, 10) & S,
 * rotl(x, 13) & S and ((x & 0x001B001B) * 0x1084) & S, S = 0x81C081C0 (kernel: q4wg_nv_src). */
static const int dllm__q4wg_nv_src[4][8] = {{6, 7, 8, 15, 22, 23, 24, 31},
                                            {28, 29, 30, 5, 12, 13, 14, 21},
                                            {25, 26, 27, 2, 9, 10, 11, 18},
                                            {4, 0, 1, 3, 20, 16, 17, 19}};

/* A UE4M3 scale byte's b' (sign dropped): |s| = 2^E (1 + f / 8), E in [-9, 8], as (E + 9) << 3 | f (subnormals
 * normalised); 0 for a zero scale. The kernel's (b' << 4) | 0x7000 is then the bf16 |s| 2^106. */
static uint32_t dllm__q4wg_nv_bprime(uint8_t c) {
    const uint32_t e = (c >> 3) & 15, m = c & 7;
    if (e) return ((e + 2) << 3) | m;
    if (!m) return 0;
    const uint32_t sh = m >= 4 ? 2 : m >= 2 ? 1 : 0;  // m 2^-9 = 2^(sh - 9) (1 + f / 8)
    return (sh << 3) | ((m << (3 - sh)) & 7);
}

/* Per 64-row tile and 128-wide k block, 4608 bytes: 1024 code words [h 0..1][thread 0..127][jw 0..3] (k16 step s = 4 h
 * + jw; A register j, half hf = row 16 warp + lane / 4 + 8 (j % 2), k 16 s + 2 (lane % 4) + 8 (j / 2) + hf, its 4 code
 * bits at dllm__q4wg_nv_src[j][4 hf ..]), then 128 scale words [quad 0..31][i 0..3] (rows r0 = 16 (quad / 8) + quad % 8
 * and r0 + 8, steps 2 i and 2 i + 1: b'(r0, 2i) << 4 | b'(r0 + 8, 2i) << 20 | b'(r0, 2i + 1) rotated right by 4 into
 * bits 28-31 and 0-3 | b'(r0 + 8, 2i + 1) << 12). A zero scale zeroes its block's codes, a negative one flips their
 * signs. Returns the NaN scales (0x7F / 0xFF), which pack as zero. */
[[maybe_unused]] static int64_t dllm__q4wg_prepack_nv(const uint8_t *rows, const uint8_t *block_scales, int n, int k,
                                                      uint8_t *packed) {
    const int kb_count = k / 128, nb = k / 16;
    int64_t nan_scales = 0;
    auto scale = [&](int row, int kk) { return block_scales[(size_t)row * nb + kk / 16]; };
    auto code = [&](int row, int kk) {
        const uint8_t sc = scale(row, kk);
        const int c = rows[(size_t)row * (k / 2) + kk / 2] >> (4 * (kk & 1)) & 15;
        if ((sc & 0x7F) == 0 || (sc & 0x7F) == 0x7F) return 0;
        return sc & 0x80 ? c ^ 8 : c;
    };
    auto bprime = [&](int row, int kk) {
        const uint8_t sc = scale(row, kk) & 0x7F;
        nan_scales += sc == 0x7F;
        return sc == 0x7F ? 0u : dllm__q4wg_nv_bprime(sc);
    };
    for (int tile = 0; tile < n / 64; tile++)
        for (int kb = 0; kb < kb_count; kb++) {
            uint8_t *blk = packed + ((size_t)tile * kb_count + kb) * 4608;
            auto put = [&](int word, uint32_t v) { memcpy(blk + 4 * word, &v, 4); };  // little-endian words
            for (int word = 0; word < 1024; word++) {
                const int jw = word & 3, thread = (word >> 2) & 127, h = word >> 9, warp = thread >> 5,
                          lane = thread & 31, s = 4 * h + jw;
                uint32_t out = 0;
                for (int j = 0; j < 4; j++)
                    for (int hf = 0; hf < 2; hf++) {
                        const int row = 64 * tile + 16 * warp + lane / 4 + 8 * (j & 1);
                        const int c = code(row, 128 * kb + 16 * s + 2 * (lane % 4) + 8 * (j >> 1) + hf);
                        for (int q = 0; q < 4; q++) out |= (uint32_t)(c >> q & 1) << dllm__q4wg_nv_src[j][q + 4 * hf];
                    }
                put(word, out);
            }
            for (int quad = 0; quad < 32; quad++)
                for (int i = 0; i < 4; i++) {
                    const int r0 = 64 * tile + 16 * (quad / 8) + quad % 8, k0 = 128 * kb + 32 * i;
                    const uint32_t a0 = bprime(r0, k0), a1 = bprime(r0 + 8, k0), b0 = bprime(r0, k0 + 16),
                                   b1 = bprime(r0 + 8, k0 + 16);
                    put(1024 + 4 * quad + i, a0 << 4 | a1 << 20 | (b0 & 15) << 28 | b0 >> 4 | b1 << 12);
                }
        }
    return nan_scales;
}

// ---- [MoE] the SoloQ grouped expert GEMM's twin (GPU: moe_grouped_gemm_<format>, src/kernels/moe.cuh) ------------

/* y[row] = bf16 of dllm__cpu_q4_gemm's one row: x[src(row)] (C values, K wide) . the 4-bit rows of expert e (codes[e]
 * [N][K / 2], NVFP4's block_scales[e], row_scale[e]) times x_scale[src(row)] (null: 1), over each expert's rows
 * (dllm__moe_plan_ref's first_row; src(row) = row_src[row], or row when row_src is null). */
DLLM__TEST_HOOK static void dllm__moe_grouped_gemm_q4_ref(dllm__q4_format f, const float *x, const float *x_scale,
                                                          const int *row_src,
                                                          const std::vector<const uint8_t *> &codes,
                                                          const std::vector<const uint8_t *> &block_scales,
                                                          const std::vector<const float *> &row_scale,
                                                          const std::vector<int> &first_row, int N, int K,
                                                          uint16_t *y) {
    std::vector<float> out((size_t)N);
    for (size_t e = 0; e + 1 < first_row.size(); e++)
        for (int row = first_row[e]; row < first_row[e + 1]; row++) {
            const int src = row_src ? row_src[row] : row;
            dllm__cpu_q4_gemm(f, codes[e], f == DLLM__Q4_NVFP4 ? block_scales[e] : nullptr, row_scale[e],
                              x + (size_t)src * K, K, x_scale ? x_scale + src : nullptr, out.data(), N, 1, N, K);
            for (int n = 0; n < N; n++) y[(size_t)row * N + n] = dllm__f32_to_bf16(out[(size_t)n]);
        }
}
