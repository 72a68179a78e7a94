/* prepack.h -- host side of the q4wg prototype (q4_wgmma.cuh): the weights' one-time re-layout and the CPU twin.
 *
 * Canonical rows (dllm's section 9b layout, dllm__q4_value): N rows of K / 2 bytes, element k of a row in byte k / 2,
 * the LOW nibble for even k, the HIGH nibble for odd k; the nibble is q in [-8, 7] two's complement; C = 2q + 1
 * (SoloQ-I, DLLM__Q4_INT4 = 1) or C = q (RTN, DLLM__Q4_RTN = 4).
 *
 * Packed (q4wg_prepack): N / 64 tiles x K / 128 blocks x 4096 bytes; inside a (tile T, block kb):
 *   byte ((h * 128 + thread) * 16 + j * 4 + b), h in {0, 1}, thread = 32 warp + lane, j in 0..3, b in 0..3:
 *     s   = 2 h + (j >> 1)                     k32 step of the block
 *     row = 64 T + 16 warp + lane / 4 + 8 (j & 1)
 *     k   = 128 kb + 32 s + 4 (lane % 4) + b   -> low nibble  (wgmma A register (j & 1),     byte b)
 *     k + 16                                   -> high nibble (wgmma A register (j & 1) + 2, byte b)
 * Requires N % 64 == 0 and K % 128 == 0. Pure function, no allocation but the output.
 */
#ifndef Q4WG_PREPACK_H
#define Q4WG_PREPACK_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>

static inline int q4wg_nibble(const uint8_t *rows, int K, int n, int k) {
    return rows[(size_t)n * (K / 2) + k / 2] >> (4 * (k & 1)) & 15;
}

/* canonical rows [N][K / 2] -> packed [N * K / 2] (the same byte count) */
static void q4wg_prepack(const uint8_t *rows, int N, int K, uint8_t *packed) {
    const int KB = K / 128;
    for (int T = 0; T < N / 64; T++)
        for (int kb = 0; kb < KB; kb++) {
            uint8_t *blk = packed + ((size_t)T * KB + kb) * 4096;
            for (int h = 0; h < 2; h++)
                for (int thread = 0; thread < 128; thread++) {
                    const int warp = thread >> 5, lane = thread & 31;
                    for (int j = 0; j < 4; j++) {
                        const int s = 2 * h + (j >> 1), row = 64 * T + 16 * warp + lane / 4 + 8 * (j & 1);
                        for (int b = 0; b < 4; b++) {
                            const int k = 128 * kb + 32 * s + 4 * (lane % 4) + b;
                            const int lo = q4wg_nibble(rows, K, row, k), hi = q4wg_nibble(rows, K, row, k + 16);
                            blk[(h * 128 + thread) * 16 + j * 4 + b] = (uint8_t)(lo | hi << 4);
                        }
                    }
                }
        }
}

/* The weight's integer C value from its nibble (fmt: 1 SoloQ-I, 4 RTN). */
static inline int q4wg_c_value(int fmt, int nibble) {
    const int q = nibble & 8 ? nibble - 16 : nibble;
    return fmt == 1 ? 2 * q + 1 : q;
}

/* CPU twin for output column n (all M tokens): the exact int32 sum, then dllm__cpu_i8_gemm's epilogue
 * y = ((float)acc * s_x[m]) * s_w[n]. X: int8 [M][ldx]. ycol[m] receives y[m][n]; acc_out (optional) the sums. */
static void q4wg_cpu_column(int fmt, const uint8_t *rows, int K, int n, const int8_t *X, long long ldx, int M, const float *s_x,
                            const float *s_w, float *ycol, int32_t *acc_out) {
    int8_t w[16384 * 2];
    int8_t *wv = K <= (int)sizeof(w) ? w : new int8_t[(size_t)K];
    for (int k = 0; k < K; k++) wv[k] = (int8_t)q4wg_c_value(fmt, q4wg_nibble(rows, K, n, k));
    for (int m = 0; m < M; m++) {
        const int8_t *x = X + (size_t)m * ldx;
        int32_t acc = 0;
        for (int k = 0; k < K; k++) acc += (int32_t)x[k] * wv[k];
        ycol[m] = ((float)acc * s_x[m]) * s_w[n];
        if (acc_out) acc_out[m] = acc;
    }
    if (wv != w) delete[] wv;
}

/* ---- NVFP4 (SoloQ-N, dllm__q4_format DLLM__Q4_NVFP4 = 0) ------------------------------------------------------------
 * Canonical: codes [N][K / 2] as above (nibble = e2m1: bit 3 sign, bits 0-2 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6}) and
 * block scales [N][K / 16] UE4M3 bytes (dllm__f32_to_e4m3; value dllm__e4m3_to_f32). C_w = e2m1 x e4m3 (dllm__q4_value).
 * Packed (q4wg_prepack_nv; q4_wgmma.cuh's q4wg_gemm_nv): N / 64 tiles x K / 128 blocks x 4608 bytes:
 *   byte (h * 128 + thread) * 16 + 4 jw + b  (h 0..1, thread = 32 warp + lane, jw 0..3): code word of k16 step s = 4 h + jw,
 *     its 32 bits laid out by q4wg_nv_srcbit so that the kernel's four extractions give the A registers j = 0..3:
 *     row 64 T + 16 warp + lane / 4 + 8 (j & 1), k 128 kb + 16 s + 2 (lane % 4) + 8 (j >> 1) + (0 | 1 for the high half);
 *   byte 4096 + 16 quad + 4 i + b (quad = 8 warp + lane / 4): scale word i, re-encoded bytes b' (q4wg_nv_bprime) of rows
 *     r0 = 64 T + 16 warp + quad % 8 and r0 + 8 at steps 2 i (bits 4-11, 20-27) and 2 i + 1 (bits 28-31 + 0-3, 12-19).
 * A block whose scale is 0 gets zero codes (its values are all +-0 in dllm__q4_value too); a negative scale byte (bit 7)
 * flips the codes' signs. NaN scales (0x7F / 0xFF) cannot be represented: counted and returned (0 = all fine).
 */
static inline float q4wg_e2m1(int c) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return c & 8 ? -mag[c & 7] : mag[c & 7];
}
static inline float q4wg_e4m3(uint8_t c) {  // = dllm__e4m3_to_f32
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    const float v = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
    return c & 0x80 ? -v : v;
}
/* |scale| = 2^E (1 + f / 8), E in [-9, 8]: b' = ((E + 9) << 3) | f; the kernel's (b' << 4) | 0x7000 is bf16 |scale| x 2^106.
 * 0 for a zero scale (whose codes are zeroed: any b' would do). */
static inline int q4wg_nv_bprime(uint8_t c) {
    const int E = (c >> 3) & 15, M = c & 7;
    if (E) return ((E + 2) << 3) | M;
    if (!M) return 0;
    const int e = M >= 4 ? 2 : M >= 2 ? 1 : 0;  // M x 2^-9 = 2^(e - 9) (1 + f / 8)
    return (e << 3) | ((M << (3 - e)) & 7);
}
/* srcbit[j][q]: the code-word bit that lands on bit Spos[q] of A register j (Spos = 6, 7, 8, 15, 22, 23, 24, 31). */
static const int q4wg_nv_spos[8] = {6, 7, 8, 15, 22, 23, 24, 31};
static inline const int (*q4wg_nv_srcbit())[8] {
    static int t[4][8];
    static bool init = false;
    if (!init) {
        for (int q = 0; q < 8; q++) {
            const int b = q4wg_nv_spos[q];
            t[0][q] = b;                   // x & S
            t[1][q] = (b - 10 + 32) % 32;  // rotl(x, 10) & S
            t[2][q] = (b - 13 + 32) % 32;  // rotl(x, 13) & S
            t[3][q] = -1;
        }
        static const int L[8] = {0, 1, 3, 4, 16, 17, 19, 20}, sh[3] = {2, 7, 12};  // ((x & 0x001B001B) * 0x1084) & S
        for (int l : L)
            for (int k : sh)
                for (int q = 0; q < 8; q++)
                    if (l + k == q4wg_nv_spos[q]) t[3][q] = l;
        init = true;
    }
    return t;
}

/* canonical codes [N][K / 2] + block scales [N][K / 16] -> packed [N / 64][K / 128][4608]. Returns the NaN scale count. */
static long long q4wg_prepack_nv(const uint8_t *rows, const uint8_t *bs, int N, int K, uint8_t *packed) {
    const int KB = K / 128, NB = K / 16;
    const int(*src)[8] = q4wg_nv_srcbit();
    long long nan_scales = 0;
    for (int n = 0; n < N; n++)
        for (int b = 0; b < NB; b++)
            if ((bs[(size_t)n * NB + b] & 0x7F) == 0x7F) nan_scales++;
    auto code = [&](int row, int k) {
        const uint8_t sc = bs[(size_t)row * NB + k / 16];
        int c = q4wg_nibble(rows, K, row, k);
        if ((sc & 0x7F) == 0 || (sc & 0x7F) == 0x7F) return 0;
        return sc & 0x80 ? c ^ 8 : c;
    };
    auto bp = [&](int row, int kb, int s) {
        const uint8_t sc = bs[(size_t)row * NB + kb * 8 + s];
        return (sc & 0x7F) == 0x7F ? 0 : q4wg_nv_bprime(sc & 0x7F);
    };
    for (int T = 0; T < N / 64; T++)
        for (int kb = 0; kb < KB; kb++) {
            uint8_t *blk = packed + ((size_t)T * KB + kb) * 4608;
            for (int h = 0; h < 2; h++)
                for (int thread = 0; thread < 128; thread++) {
                    const int warp = thread >> 5, lane = thread & 31;
                    for (int jw = 0; jw < 4; jw++) {
                        const int s = 4 * h + jw;
                        uint32_t word = 0;
                        for (int j = 0; j < 4; j++)
                            for (int hf = 0; hf < 2; hf++) {
                                const int row = 64 * T + 16 * warp + lane / 4 + 8 * (j & 1);
                                const int k = 128 * kb + 16 * s + 2 * (lane % 4) + 8 * (j >> 1) + hf;
                                const int c = code(row, k);
                                const int bits[4] = {c & 1, (c >> 1) & 1, (c >> 2) & 1, (c >> 3) & 1};  // m, e0, e1, sign -> 6, 7, 8, 15
                                for (int q = 0; q < 4; q++) word |= (uint32_t)bits[q] << src[j][q + 4 * hf];
                            }
                        memcpy(blk + (h * 128 + thread) * 16 + jw * 4, &word, 4);
                    }
                }
            for (int quad = 0; quad < 32; quad++) {
                const int r0 = 64 * T + 16 * (quad / 8) + quad % 8, r1 = r0 + 8;
                for (int i = 0; i < 4; i++) {
                    const uint32_t a0 = bp(r0, kb, 2 * i), a1 = bp(r1, kb, 2 * i), b0 = bp(r0, kb, 2 * i + 1), b1 = bp(r1, kb, 2 * i + 1);
                    const uint32_t W = a0 << 4 | a1 << 20 | (b0 & 15) << 28 | b0 >> 4 | b1 << 12;
                    memcpy(blk + 4096 + quad * 16 + i * 4, &W, 4);
                }
            }
        }
    return nan_scales;
}

/* CPU twin (dllm__cpu_q4_gemm for NVFP4, one output column n, all M tokens): acc = fmaf(a[k], C_w[k], acc) for k
 * ascending, y = (acc * s_x[m]) * s_w[n]. A: the tokens' C values as floats (bf16-exact), rows lda apart. sumabs[m]
 * (optional) receives sum_k |a[k] C_w[k]| (double) for the tolerance of an fp32 result in another order. */
static void q4wg_cpu_column_nv(const uint8_t *rows, const uint8_t *bs, int K, int n, const float *A, long long lda, int M, const float *s_x,
                               const float *s_w, float *ycol, double *sumabs) {
    float wbuf[16384];
    float *w = K <= 16384 ? wbuf : new float[(size_t)K];
    for (int k = 0; k < K; k++) w[k] = q4wg_e2m1(q4wg_nibble(rows, K, n, k)) * q4wg_e4m3(bs[(size_t)n * (K / 16) + k / 16]);
    for (int m = 0; m < M; m++) {
        const float *a = A + (size_t)m * lda;
        float acc = 0;
        double sa = 0;
        for (int k = 0; k < K; k++) acc = fmaf(a[k], w[k], acc), sa += fabs((double)a[k] * w[k]);
        ycol[m] = (acc * s_x[m]) * s_w[n];
        if (sumabs) sumabs[m] = sa;
    }
    if (w != wbuf) delete[] w;
}

#endif
