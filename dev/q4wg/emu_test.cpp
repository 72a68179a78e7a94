// emu_test.cpp -- host-only check of the data path's index arithmetic (no GPU): prepack -> the kernel's 16-byte
// units and widening (mirrored from q4_wgmma.cuh) -> wgmma's A fragment (CUTLASS ALayout_64x32 / PTX ISA: register
// v1 + 2 v2, byte v0 = row 16 warp + lane/4 + 8 v1, k 4 (lane%4) + v0 + 16 v2) -> accumulators in the C layout
// (CLayout_64xN: register 4 j + e = feature lane/4 + 8 (e >> 1), token 8 j + 2 (lane%4) + (e & 1)) -> the kernel's
// epilogue indexing and shift; B read through the 128-byte swizzle as the stage copy wrote it. Compared with the CPU
// twin. Build: g++ -O2 -o emu_test emu_test.cpp && ./emu_test
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include <string.h>
#include <math.h>
#include <algorithm>
#include "prepack.h"

static unsigned long long s = 88172645463325252ull;
static unsigned rnd() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return (unsigned)s; }
static uint32_t widen_hi(int fmt, uint32_t x) { return (x & 0xF0F0F0F0u) | (fmt == 1 ? 0x08080808u : 0); }
static uint32_t widen_lo(int fmt, uint32_t x) { return widen_hi(fmt, x << 4); }

// ---- NVFP4 (SoloQ-N): prepack -> the kernel's dequantisation (mirrored from q4_wgmma.cuh: q4wg_nv_step, q4wg_nv_scale,
// HMUL2.BF16 with .H0_H0 / .H1_H1) -> the bf16 A fragment (register j, half hf = row g + 8 (j & 1), k 2 t + 8 (j >> 1) + hf)
// -> wgmma against the bf16 B stage image (two 64-wide halves, 128-byte swizzle, k16 step = 32 bytes) -> accumulator
// layout -> chunk fold -> epilogue; compared with q4wg_cpu_column_nv within the fp32-order tolerance, and every A
// element compared EXACTLY with C_w 2^-20.
static float bf16f(uint32_t h) { uint32_t b = (h & 0xFFFF) << 16; float f; memcpy(&f, &b, 4); return f; }
static uint32_t rotl32(uint32_t x, int n) { return x << n | x >> (32 - n); }
static uint32_t bmul(uint32_t a, uint32_t b, int *inexact) {  // bf16x2 a * b, each product must be exact
    uint32_t r = 0;
    for (int h = 0; h < 2; h++) {
        const double p = (double)bf16f(a >> (16 * h)) * (double)bf16f(b >> (16 * h));
        const float f = (float)p;
        uint32_t fb; memcpy(&fb, &f, 4);
        if ((double)f != p || (fb & 0xFFFF) || (f != 0 && fabsf(f) < 1.17549435e-38f)) (*inexact)++;
        r |= (fb >> 16) << (16 * h);
    }
    return r;
}
static void nv_dequant(const uint8_t *blk, int thread, int s, uint32_t A[4], int *inexact) {  // step s (0..7) of one block
    uint32_t x, W;
    memcpy(&x, blk + ((s >> 2) * 128 + thread) * 16 + (s & 3) * 4, 4);
    memcpy(&W, blk + 4096 + (thread >> 2) * 16 + (s >> 1) * 4, 4);
    if (s & 1) W = rotl32(W, 8);
    const uint32_t sp = (W & 0x0FF00FF0u) | 0x70007000u, S = 0x81C081C0u;
    const uint32_t lo = (sp & 0xFFFF) * 0x10001u, hi = (sp >> 16) * 0x10001u;
    A[0] = bmul(x & S, lo, inexact);
    A[1] = bmul(rotl32(x, 10) & S, hi, inexact);
    A[2] = bmul(rotl32(x, 13) & S, lo, inexact);
    A[3] = bmul(((x & 0x001B001Bu) * 0x1084u) & S, hi, inexact);
}
static int nv_test() {
    int fails = 0;
    // 1. every (code, scale byte) pair: rows of 2048, block b of row n has scale byte (n * 128 + b) % 256 (0x7F / 0xFF -> 0x00),
    //    and its 16 codes are all 16 values (rotated by b)
    {
        const int N = 128, K = 2048, NB = K / 16, KB = K / 128;
        std::vector<uint8_t> rows((size_t)N * K / 2, 0), bs((size_t)N * NB), packed((size_t)N * K / 2 * 9 / 8);
        for (int n = 0; n < N; n++)
            for (int b = 0; b < NB; b++) {
                uint8_t sc = (uint8_t)((n * 128 + b) % 256);
                if ((sc & 0x7F) == 0x7F) sc = 0;
                bs[(size_t)n * NB + b] = sc;
                for (int i = 0; i < 16; i++) {
                    const int k = 16 * b + i, c = (i + b) & 15;
                    rows[(size_t)n * K / 2 + k / 2] |= (uint8_t)(c << (4 * (k & 1)));
                }
            }
        if (q4wg_prepack_nv(rows.data(), bs.data(), N, K, packed.data()) != 0) { printf("nvfp4 prepack: NaN count wrong\n"); fails++; }
        long long bad = 0, checked = 0;
        int inexact = 0;
        for (int T = 0; T < N / 64; T++)
            for (int kb = 0; kb < KB; kb++)
                for (int t = 0; t < 128; t++)
                    for (int s = 0; s < 8; s++) {
                        uint32_t A[4];
                        nv_dequant(packed.data() + ((size_t)T * KB + kb) * 4608, t, s, A, &inexact);
                        const int warp = t >> 5, lane = t & 31;
                        for (int j = 0; j < 4; j++)
                            for (int hf = 0; hf < 2; hf++) {
                                const int row = 64 * T + 16 * warp + lane / 4 + 8 * (j & 1), k = 128 * kb + 16 * s + 2 * (lane % 4) + 8 * (j >> 1) + hf;
                                const float want = q4wg_e2m1(q4wg_nibble(rows.data(), K, row, k)) * q4wg_e4m3(bs[(size_t)row * NB + k / 16]) * 0x1p-20f;
                                const float got = bf16f(A[j] >> (16 * hf));
                                checked++;
                                if (got != want) {
                                    if (bad < 5) printf("nvfp4 dequant: row %d k %d code %d scale 0x%02x: got %g want %g\n", row, k, q4wg_nibble(rows.data(), K, row, k),
                                                        bs[(size_t)row * NB + k / 16], got, want);
                                    bad++;
                                }
                            }
                    }
        printf("emulated NVFP4 dequantisation (every code x every UE4M3 byte, %lld weights): %s (%d inexact bf16 products)\n", checked,
               bad || inexact ? "MISMATCH" : "exact", inexact);
        fails += bad != 0 || inexact != 0;
    }
    // 2. a small GEMM through the fragment, the stage image, the chunk fold and the epilogue
    {
        const int N = 128, K = 1024, NB = K / 16, KB = K / 128, NT = 32, M = 29, ks = 2, KU = KB / ks, WGS = 1, R = 2, TF = 128;
        std::vector<uint8_t> rows((size_t)N * K / 2), bs((size_t)N * NB), packed((size_t)N * K / 2 * 9 / 8);
        for (auto &b : rows) b = (uint8_t)rnd();
        for (auto &b : bs) { b = (uint8_t)(rnd() % 127); if (rnd() % 16 == 0) b = 0; }
        q4wg_prepack_nv(rows.data(), bs.data(), N, K, packed.data());
        std::vector<uint16_t> X((size_t)M * K);  // bf16 token C values: e2m1 x e4m3
        std::vector<float> Xf((size_t)M * K);
        for (size_t i = 0; i < X.size(); i++) {
            const float v = q4wg_e2m1(rnd() & 15) * q4wg_e4m3((uint8_t)(rnd() % 127));
            uint32_t b; memcpy(&b, &v, 4);
            if (b & 0xFFFF) { printf("activation not bf16-exact\n"); fails++; }
            X[i] = (uint16_t)(b >> 16), Xf[i] = v;
        }
        std::vector<float> sx(M), sw(N), y((size_t)M * N);
        for (auto &v : sx) v = 0.5f + (rnd() % 1000) / 1000.0f;
        for (auto &v : sw) v = 0.5f + (rnd() % 1000) / 1000.0f;
        int inexact = 0;
        std::vector<uint16_t> smem((size_t)2 * NT * 64);  // one k block: two halves of NT rows x 64 bf16, swizzled
        for (int ct = 0; ct < N / TF; ct++)
            for (int r = 0; r < R; r++) {
                const int tile64 = ct * WGS * R + r;
                std::vector<std::vector<float>> tot(128, std::vector<float>(NT / 2, 0.0f));
                for (int c = 0; c < ks; c++) {
                    std::vector<std::vector<float>> acc(128, std::vector<float>(NT / 2, 0.0f));
                    for (int kb = c * KU; kb < (c + 1) * KU; kb++) {
                        for (int row = 0; row < NT; row++)
                            for (int kk = 0; kk < 128; kk++) {
                                const int half = kk / 64, byte = (kk % 64) * 2, chunk = byte >> 4;
                                const size_t phys = ((size_t)half * NT * 128 + row * 128 + ((chunk ^ (row & 7)) << 4) + (byte & 15)) / 2;
                                smem[phys] = row < M ? X[(size_t)row * K + kb * 128 + kk] : 0;
                            }
                        for (int s = 0; s < 8; s++)
                            for (int t = 0; t < 128; t++) {
                                uint32_t A[4];
                                nv_dequant(packed.data() + ((size_t)tile64 * KB + kb) * 4608, t, s, A, &inexact);
                                const int warp = t >> 5, lane = t & 31;
                                for (int j = 0; j < 4; j++)
                                    for (int hf = 0; hf < 2; hf++) {
                                        const int arow = 16 * warp + lane / 4 + 8 * (j & 1), ak = 2 * (lane % 4) + 8 * (j >> 1) + hf;  // k within the step
                                        const float a = bf16f(A[j] >> (16 * hf));
                                        for (int n = 0; n < NT; n++) {
                                            const int byte = (s & 3) * 32 + ak * 2, half = s >> 2;  // the descriptor: half block, + 32 bytes a step
                                            const size_t phys = ((size_t)half * NT * 128 + n * 128 + (((byte >> 4) ^ (n & 7)) << 4) + (byte & 15)) / 2;
                                            const float b = bf16f(smem[phys]);
                                            const int dl = 4 * ((arow % 16) % 8) + (n % 8) / 2, dreg = 4 * (n / 8) + 2 * ((arow % 16) / 8) + n % 2;
                                            float &d = acc[(arow / 16) * 32 + dl][dreg];
                                            d = fmaf(a, b, d);
                                        }
                                    }
                            }
                    }
                    for (int t = 0; t < 128; t++)
                        for (int i = 0; i < NT / 2; i++) tot[t][i] = c == 0 ? acc[t][i] : tot[t][i] + acc[t][i];
                }
                for (int t = 0; t < 128; t++) {
                    const int warp = t >> 5, g = (t & 31) >> 2, tq = t & 3, f = ct * TF + r * 64 + warp * 16 + g;
                    for (int j = 0; j < NT / 8; j++) {
                        const int m = 8 * j + 2 * tq;
                        auto ep = [&](float v, int mm, int ff) { y[(size_t)mm * N + ff] = ((v * 0x1p20f) * sx[mm]) * sw[ff]; };
                        if (m < M) ep(tot[t][4 * j], m, f), ep(tot[t][4 * j + 2], m, f + 8);
                        if (m + 1 < M) ep(tot[t][4 * j + 1], m + 1, f), ep(tot[t][4 * j + 3], m + 1, f + 8);
                    }
                }
            }
        std::vector<float> ycol(M);
        std::vector<double> sa(M);
        int bad = 0;
        double worst = 0;
        for (int n = 0; n < N; n++) {
            q4wg_cpu_column_nv(rows.data(), bs.data(), K, n, Xf.data(), K, M, sx.data(), sw.data(), ycol.data(), sa.data());
            for (int m = 0; m < M; m++) {
                const double err = fabs((double)y[(size_t)m * N + n] - ycol[m]), scale = sa[m] * sx[m] * sw[n];
                const double tol = 1e-5 * scale + 4.0 * fabs(ycol[m]) * 1.2e-7 + 1e-30;
                if (scale > 0) worst = std::max(worst, err / scale);
                if (err > tol) {
                    if (bad < 5) printf("nvfp4 gemm (m %d, n %d): emu %.9g twin %.9g\n", m, n, y[(size_t)m * N + n], ycol[m]);
                    bad++;
                }
            }
        }
        printf("emulated NVFP4 data path NT=%d M=%d N=%d K=%d ksplit=%d: %s (max |emu - twin| / sum|terms| = %.2e)\n", NT, M, N, K, ks,
               bad || inexact ? "MISMATCH" : "within tolerance", worst);
        fails += bad != 0 || inexact != 0;
    }
    return fails;
}

int main() {
    int fails = 0;
    for (int fmt : {1, 4})
        for (int NT : {32, 64}) {
            const int N = 128, K = 512, KB = K / 128, M = NT - 3, R = 2, WGS = 1, TF = 64 * WGS * R;
            std::vector<uint8_t> rows((size_t)N * K / 2), packed(rows.size());
            for (auto &b : rows) b = (uint8_t)rnd();
            q4wg_prepack(rows.data(), N, K, packed.data());
            std::vector<int8_t> X((size_t)M * K);
            for (auto &v : X) v = (int8_t)((rnd() % 255) - 127);
            // shared-memory stage image as q4wg_stage writes it (one k block): chunk c of row r at c ^ (r % 8)
            std::vector<int8_t> smem((size_t)NT * 128);
            std::vector<long long> out((size_t)M * N, 0);
            for (int ct = 0; ct < N / TF; ct++) {
                for (int wg = 0; wg < WGS; wg++)
                    for (int r = 0; r < R; r++) {
                        std::vector<std::vector<int>> acc(128, std::vector<int>(NT / 2, 0));  // [thread][reg]
                        const int tile64 = (ct * WGS + wg) * R + r;
                        for (int kb = 0; kb < KB; kb++) {
                            for (int row = 0; row < NT; row++)
                                for (int c = 0; c < 8; c++)
                                    for (int b = 0; b < 16; b++)
                                        smem[row * 128 + ((c ^ (row & 7)) << 4) + b] = row < M ? X[(size_t)row * K + kb * 128 + c * 16 + b] : 0;
                            for (int t = 0; t < 128; t++) {
                                // the kernel: wp = w + t128 + (tile64 * KB + kb) * 256 units; + h * 128
                                uint32_t v[2][4];
                                for (int h = 0; h < 2; h++) memcpy(v[h], &packed[(((size_t)tile64 * KB + kb) * 256 + h * 128 + t) * 16], 16);
                                for (int st = 0; st < 4; st++) {
                                    const uint32_t *q = v[st >> 1];
                                    const uint32_t w0 = st & 1 ? q[2] : q[0], w1 = st & 1 ? q[3] : q[1];
                                    uint32_t A[4] = {widen_lo(fmt, w0), widen_lo(fmt, w1), widen_hi(fmt, w0), widen_hi(fmt, w1)};
                                    // wgmma: A fragment (ALayout_64x32) times B (token n, k) read through the swizzle
                                    const int warp = t >> 5, lane = t & 31;
                                    for (int reg = 0; reg < 4; reg++)
                                        for (int v0 = 0; v0 < 4; v0++) {
                                            const int v1 = reg & 1, v2 = reg >> 1;
                                            const int arow = 16 * warp + lane / 4 + 8 * v1, ak = 4 * (lane % 4) + v0 + 16 * v2;
                                            const int a = (int8_t)(A[reg] >> (8 * v0));
                                            // this A element multiplies B[n][ak] for every token n into D[arow][n];
                                            // D[arow][n] lives in thread (warp, lane' = 4 (arow%8) + (n%8)/2), reg 4 (n/8) + 2 ((arow%16)/8) + n%2
                                            for (int n = 0; n < NT; n++) {
                                                const int kbyte = 32 * st + ak;  // logical byte of the token's 128-byte row
                                                const int phys = n * 128 + ((((kbyte >> 4) ^ (n & 7))) << 4) + (kbyte & 15);
                                                const int bval = smem[phys];
                                                const int dl = 4 * ((arow % 16) % 8) + (n % 8) / 2, dreg = 4 * (n / 8) + 2 * ((arow % 16) / 8) + n % 2;
                                                acc[(arow / 16) * 32 + dl][dreg] += a * bval;
                                            }
                                        }
                                }
                            }
                        }
                        // the kernel's epilogue indexing
                        for (int t = 0; t < 128; t++) {
                            const int warp = t >> 5, g = (t & 31) >> 2, tq = t & 3;
                            const int f = ct * TF + (wg * R + r) * 64 + warp * 16 + g;
                            const int SH = fmt == 1 ? 3 : 4;
                            for (int j = 0; j < NT / 8; j++) {
                                const int m = 8 * j + 2 * tq;
                                if (m < M) out[(size_t)m * N + f] = acc[t][4 * j] >> SH, out[(size_t)m * N + f + 8] = acc[t][4 * j + 2] >> SH;
                                if (m + 1 < M) out[(size_t)(m + 1) * N + f] = acc[t][4 * j + 1] >> SH, out[(size_t)(m + 1) * N + f + 8] = acc[t][4 * j + 3] >> SH;
                                if ((acc[t][4 * j] & ((1 << SH) - 1)) != 0) { printf("sum not a multiple of %d\n", 1 << SH); fails++; }
                            }
                        }
                    }
            }
            std::vector<float> ones(M, 1.0f), onesN(N, 1.0f), ycol(M);
            std::vector<int32_t> accs(M);
            int bad = 0;
            for (int n = 0; n < N; n++) {
                q4wg_cpu_column(fmt, rows.data(), K, n, X.data(), K, M, ones.data(), onesN.data(), ycol.data(), accs.data());
                for (int m = 0; m < M; m++)
                    if (out[(size_t)m * N + n] != accs[m]) {
                        if (bad < 5) printf("fmt %d NT %d: (m %d, n %d) emu %lld twin %d\n", fmt, NT, m, n, out[(size_t)m * N + n], accs[m]);
                        bad++;
                    }
            }
            printf("emulated data path fmt=%d NT=%d M=%d N=%d K=%d: %s\n", fmt, NT, M, N, K, bad ? "MISMATCH" : "exact");
            fails += bad != 0;
        }
    fails += nv_test();
    return fails ? 1 : 0;
}
