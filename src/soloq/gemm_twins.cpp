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
