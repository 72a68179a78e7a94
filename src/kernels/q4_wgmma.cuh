/* [W4 GEMM] q4wg_gemm: SoloQ's 4-bit integer-weight GEMM on Hopper's wgmma (sm_90a). Twin: dllm__cpu_i8_gemm on the
 * weights' canonical rows (dllm__q4wg_prepack is the layout's twin).
 *
 *   y[m][n] = ((float)acc[m][n] * s_x[m]) * s_w[n],   acc[m][n] = sum_k X[m][k] * C_w[n][k]   (exact int32)
 *
 * bit-identical to dllm__cpu_i8_gemm on the weights' C values (SoloQ-I: C = 2q + 1; RTN-W4A4: C = q; q the signed
 * nibble in [-8, 7]); X: int8 C values of the tokens (any s8), s_x / s_w fp32.
 *
 * Transposed product: the weights are wgmma's A operand (64 output features a warpgroup on M) taken from REGISTERS,
 * the tokens are wgmma's N (NT = 32, 64, 128, 256) read from shared memory as int8, K-major, 128-byte swizzle.
 * Widening (no bias, no sum(x) correction): with the nibble in a byte's HIGH half the byte read as s8 is 16 q, so
 *   hi byte  = x & 0xF0F0F0F0 (| 0x08080808 for SoloQ-I: 16 q + 8 = 8 (2q + 1))        1 LOP3 per 4 weights
 *   lo byte  = (x << 4) & 0xF0F0F0F0 (| 0x08080808)                                       SHF + LOP3 per 4 weights
 * and wgmma s8.s8 accumulates 8 acc (SoloQ-I) or 16 acc (RTN) exactly: |8 * 15 * 128 * K| < 2^31 up to K = 139810.
 * The epilogue shifts right by 3 / 4 (exact: the sums are multiples of 8 / 16).
 *
 * Packed weights (q4wg_prepack below; host twin dllm__q4wg_prepack): for each 64-row tile T and 128-wide k block kb,
 * 4096 bytes:
 *   [T][kb][h = 0, 1][thread 0..127][16 bytes]; 16 bytes = 4 words; word j covers k32 step s = 2h + (j >> 1) and row
 *   rs = j & 1 of the thread's pair (16 warp + lane/4 + 8 rs); byte b of the word: low nibble =
 *   W[row][32 s + 4 (lane%4) + b], high nibble = W[row][32 s + 16 + 4 (lane%4) + b].  So word (s, 0) -> A regs 0 (lo)
 *   and 2 (hi), word (s, 1) -> 1 and 3: CUTLASS's ALayout_64x32 = the PTX ISA's 8-bit A fragment: reg v1 + 2 v2 byte v0
 *   = (row 16 w + g + 8 v1, k 4 t + v0 + 16 v2).
 *
 * Schedule: the work is units (CTA tile of TF = 64 WGS R features, chunk of NT tokens; unit t chunks + c, so that the
 * chunks of one weight tile run side by side and its weights come from HBM once) x (k blocks of 128), cut into groups
 * of P k blocks. One chunk (M <= NT): stream-K, CTA c gets a contiguous run of groups; a segment that covers a whole
 * tile writes y directly; partial segments red.add their int32 sums into ws (layout = the accumulator layout,
 * coalesced) and count k blocks in cnt[tile]; the CTA that completes the count reads the sums back, zeroes ws and cnt
 * (self-cleaning: ws / cnt must be zero before the first launch) and runs the epilogue. Several chunks: CTA c gets a
 * contiguous run of whole units, so nothing is split (the many-row regime has units enough for every SM, and a split's
 * int32 round trip through L2 would cost more than the tail it fills). Integer sums: any split or order gives the same
 * bits.
 *
 * The module (dllm__module_q4wg) is compiled for sm_90a only; q4wg_args is the host/kernel contract's
 * (DLLM__Q4WG_ARGS_FIELDS), y is bf16 (the layer linears' outputs), rounded as the INT8 path's epilogue rounds it.
 */

#define Q4WG_INT4 1  // dllm__q4_format DLLM__Q4_INT4 (SoloQ-I): C = 2q + 1
#define Q4WG_RTN 4   // dllm__q4_format DLLM__Q4_RTN: C = q

/* d (64 x NT s32, accumulator layout) += A (64 x 32 s8, registers a0..a3) . B (NT x 32 s8, shared, K-major)^T */
template <int NT> __device__ __forceinline__ void q4wg_mma(int (&d)[NT / 2], u32 a0, u32 a1, u32 a2, u32 a3, u64 desc) {
    if constexpr (NT == 32)
        asm volatile(WG_RS16("wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8", "")
                     : WG_FLAT16("+r", d, 0)
                     : WG_RS_IN(a0, a1, a2, a3, desc));
    else if constexpr (NT == 64)
        asm volatile(WG_RS32("wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8", "")
                     : WG_FLAT32("+r", d, 0)
                     : WG_RS_IN(a0, a1, a2, a3, desc));
    else if constexpr (NT == 128)
        asm volatile(WG_RS64("wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8", "")
                     : WG_FLAT64("+r", d, 0)
                     : WG_RS_IN(a0, a1, a2, a3, desc));
    else if constexpr (NT == 256)
        asm volatile(WG_RS128("wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8", "")
                     : WG_FLAT128("+r", d, 0)
                     : WG_RS_IN(a0, a1, a2, a3, desc));
}

/* Nibbles in the high half of each byte (x & 0xF0F0F0F0) read as s8 are 16 q; SoloQ-I ORs in 8: 8 (2q + 1). */
template <int FMT> __device__ __forceinline__ u32 q4wg_hi(u32 x) {
    u32 r;
    if (FMT == Q4WG_INT4)
        asm("lop3.b32 %0, %1, 0xF0F0F0F0, 0x08080808, 0xEA;" : "=r"(r) : "r"(x));  // (a & b) | c
    else
        asm("and.b32 %0, %1, 0xF0F0F0F0;" : "=r"(r) : "r"(x));
    return r;
}
template <int FMT> __device__ __forceinline__ u32 q4wg_lo(u32 x) { return q4wg_hi<FMT>(x << 4); }

struct q4wg_u32x4 {
    u32 x, y, z, w;
};

/* One output of the epilogue, rounded once to bf16 (as soloq_scale_body stores it; an fp32 output's branch made the
 * 256-token instances spill). */
__device__ __forceinline__ void q4wg_store(const q4wg_args &a, long long at, float v) {
    a.y[at] = f32_to_bf16(v);
}

__device__ __forceinline__ q4wg_u32x4 q4wg_ldg(const q4wg_u32x4 *p, u64 policy) {
    q4wg_u32x4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
    return v;
}

__device__ __forceinline__ void q4wg_cp16(u32 dst, const void *src, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void q4wg_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void q4wg_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <int PENDING, int R, int NREG> __device__ __forceinline__ void q4wg_wgmma_wait(int (&acc)[R][NREG]) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < NREG; i++) asm volatile("" : "+r"(acc[r][i])::"memory");
}

/* One group's activations: P k blocks, each NT rows x 128 bytes in the 128-byte swizzle (16-byte chunk c of row r at
 * chunk c ^ (r % 8)), rows >= M zero-filled. src: X at the group's first k; thread tid copies chunk tid & 7 of rows
 * (tid >> 3) + j THREADS / 8 of every k block. */
template <int NT, int THREADS, int P>
__device__ __forceinline__ void q4wg_stage(u32 dst, const signed char *src, long long ldx, int M, int tid) {
    const int r0 = tid >> 3, c = tid & 7;  // (rows x ldx < 2^31)
    const u32 d0 = dst + r0 * 128 + ((c ^ (r0 & 7)) << 4);
#pragma unroll
    for (int j = 0; j < NT * 8 / THREADS; j++) {
        const int row = r0 + j * (THREADS / 8);
        const bool ok = row < M;
        const signed char *g =
            src + (u32)(ok ? row * (int)ldx : 0) + c * 16;  // 32-bit row offsets: fewer live registers
#pragma unroll
        for (int p = 0; p < P; p++) q4wg_cp16(d0 + p * (NT * 128) + j * THREADS * 16, g + p * 128, ok ? 16 : 0);
    }
}

/* NT tokens (wgmma N), FMT (Q4WG_INT4 / Q4WG_RTN), WGS warpgroups a CTA, R 64-row tiles a warpgroup, P k blocks (of
 * 128) a group, SG activation stages (one a group; 2: every wgmma of a group awaited at its end, 3: one k block's left
 * in flight). Weights of group g + 1 load into registers while group g computes; activations of group g + 1 are
 * copied (cp.async) while group g computes. */
template <int NT, int FMT, int WGS, int R, int P, int SG>
__global__ void __launch_bounds__(128 * WGS) q4wg_gemm(const q4wg_args a) {
    constexpr int THREADS = 128 * WGS, TF = 64 * WGS * R, NREG = NT / 2;
    constexpr u32 KSTAGE = NT * 128, GSTAGE = KSTAGE * P;
    constexpr int SH = FMT == Q4WG_INT4 ? 3 : 4;
    static_assert(SG == 2 || SG == 3, "stages");
    static_assert((NT * 8) % THREADS == 0, "stage copy");
    pdl_enter();
    extern __shared__ __align__(16) unsigned char q4wg_smem[];
    __shared__ int last_flag;
    const u32 s0 = (smem_u32(q4wg_smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid >> 7, t128 = tid & 127;
    const int KB = a.K >> 7, gpu = KB / P, chunks = (a.M + NT - 1) / NT, units = a.N / TF * chunks;
    const int b = blockIdx.x, nb = gridDim.x;
    const int g0 = chunks == 1 ? (int)((long long)b * units * gpu / nb) : (int)((long long)b * units / nb) * gpu,
              g1 = chunks == 1 ? (int)((long long)(b + 1) * units * gpu / nb)
                               : (int)((long long)(b + 1) * units / nb) * gpu;
    if (g0 >= g1) return;
    const int it0 = g0 * P, it1 = g1 * P;

    u64 policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));

    // Weights: 16-byte units; slot r of this warpgroup in CTA tile t is 64-row tile (t WGS + wg) R + r.
    const long long rstride = (long long)KB * 256;  // one 64-row tile
    // The group whose weights and activations load next: unit lu (its weights wu, its first token row xm), k block lkb.
    int lu = g0 / gpu, lkb = (g0 - lu * gpu) * P, xm = lu % chunks * NT;
    const q4wg_u32x4 *wu = (const q4wg_u32x4 *)a.w + t128 + (long long)((lu / chunks) * WGS + wg) * R * rstride;
    auto advance = [&]() {
        lkb += P;
        if (lkb == KB) {
            lkb = 0, lu++, xm = lu % chunks * NT;
            wu = (const q4wg_u32x4 *)a.w + t128 + (long long)((lu / chunks) * WGS + wg) * R * rstride;
        }
    };
    auto stage = [&](u32 dst) {
        q4wg_stage<NT, THREADS, P>(dst, a.x + xm * a.ldx + lkb * 128, a.ldx, min(NT, a.M - xm), tid);
    };

    // Group g0's activations, then its weights.
    stage(s0);
    q4wg_cp_commit();
    q4wg_u32x4 wq[P][R][2];
#pragma unroll
    for (int p = 0; p < P; p++)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                wq[p][r][h] = q4wg_ldg(wu + r * rstride + (lkb + p) * 256 + h * 128, policy);
    advance();

    int acc[R][NREG];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < NREG; i++) acc[r][i] = 0;

    int ct = it0 / KB, ckb = it0 % KB, seg0 = ckb;
    // B, K-major: rows of 128 bytes (128 int8 k values of one token), a k32 step +32 bytes of the start address;
    // s0 + SG GSTAGE < 2^18: the 14-bit address field never carries
    const u64 desc0 = wg_desc(s0);
    u32 cst = 0, pst = 1;             // the stage the group computes from / the next group's copy goes to
    for (int it = it0; it < it1; it += P) {
        const bool more = it + P < it1;
        // This group's activations are in (every thread's copies, made visible to wgmma's async proxy), and every
        // wgmma of the group that last read stage pst is done (SG = 2: awaited at each group's end; SG = 3: the
        // group before the last one).
        q4wg_cp_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (more) stage(s0 + pst * GSTAGE);
        q4wg_cp_commit();
        pst = pst + 1 == SG ? 0 : pst + 1;
        const u64 dg = desc0 + cst * (GSTAGE >> 4);  // the group's stage: descriptor address fields add
        cst = cst + 1 == SG ? 0 : cst + 1;
#pragma unroll
        for (int p = 0; p < P; p++) {
            u32 A[R][4][4];
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int s = 0; s < 4; s++) {
                    const q4wg_u32x4 &v = wq[p][r][s >> 1];
                    const u32 w0 = s & 1 ? v.z : v.x, w1 = s & 1 ? v.w : v.y;
                    A[r][s][0] = q4wg_lo<FMT>(w0);
                    A[r][s][1] = q4wg_lo<FMT>(w1);
                    A[r][s][2] = q4wg_hi<FMT>(w0);
                    A[r][s][3] = q4wg_hi<FMT>(w1);
                }
            if (more)
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        wq[p][r][h] = q4wg_ldg(wu + r * rstride + (lkb + p) * 256 + h * 128, policy);

            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
            const u64 d0 = dg + p * (KSTAGE >> 4);
#pragma unroll
            for (int s = 0; s < 4; s++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    q4wg_mma<NT>(acc[r], A[r][s][0], A[r][s][1], A[r][s][2], A[r][s][3], d0 + s * 2);
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            // The next k block's A registers are written while this one's wgmmas run (ptxas keeps both sets live);
            // NT = 256 (128 accumulator registers) has no room for two sets and waits here.
            if (p + 1 < P) q4wg_wgmma_wait<NT >= 256 ? 0 : 1>(acc);
        }
        q4wg_wgmma_wait<SG - 2>(acc);
        advance();
        ckb += P;
        if (ckb == KB || !more) {
            // ---- flush the segment [seg0, ckb) of tile ct ----
            q4wg_wgmma_wait<0>(acc);
            bool store = true;
            if (seg0 != 0 || ckb != KB) {
                int *wsp = a.ws + (long long)ct * (NT * TF) + (wg * R) * NREG * 128 + t128;
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int i = 0; i < NREG; i++)
                        asm volatile("red.global.add.s32 [%0], %1;\n" ::"l"(wsp + (r * NREG + i) * 128), "r"(acc[r][i])
                                     : "memory");
                __threadfence();
                __syncthreads();
                if (tid == 0) {
                    const int nkb = ckb - seg0, old = atomicAdd(a.cnt + ct, nkb);
                    last_flag = old + nkb == KB;
                }
                __syncthreads();
                store = last_flag != 0;
                if (store) {
                    __threadfence();
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int i = 0; i < NREG; i++) {
                            int *q = wsp + (r * NREG + i) * 128;
                            asm volatile("ld.global.cg.s32 %0, [%1];\n" : "=r"(acc[r][i]) : "l"(q) : "memory");
                            asm volatile("st.global.cg.s32 [%0], %1;\n" ::"l"(q), "r"(0) : "memory");
                        }
                    if (tid == 0) a.cnt[ct] = 0;
                }
            }
            if (store) {
                const int warp = t128 >> 5, g = (tid & 31) >> 2, tq = tid & 3, m0 = ct % chunks * NT;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int f = ct / chunks * TF + (wg * R + r) * 64 + warp * 16 + g;
                    const float sw0 = a.s_w[f], sw1 = a.s_w[f + 8];
#pragma unroll
                    for (int j = 0; j < NT / 8; j++) {
                        const int m = m0 + 8 * j + 2 * tq;
                        if (m < a.M) {
                            const float sx = a.s_x[m];
                            const long long at = (long long)m * a.ldy + f;
                            q4wg_store(a, at, __fmul_rn(__fmul_rn((float)(acc[r][4 * j] >> SH), sx), sw0));
                            q4wg_store(a, at + 8, __fmul_rn(__fmul_rn((float)(acc[r][4 * j + 2] >> SH), sx), sw1));
                        }
                        if (m + 1 < a.M) {
                            const float sx = a.s_x[m + 1];
                            const long long at = (long long)(m + 1) * a.ldy + f;
                            q4wg_store(a, at, __fmul_rn(__fmul_rn((float)(acc[r][4 * j + 1] >> SH), sx), sw0));
                            q4wg_store(a, at + 8, __fmul_rn(__fmul_rn((float)(acc[r][4 * j + 3] >> SH), sx), sw1));
                        }
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int i = 0; i < NREG; i++) acc[r][i] = 0;
            if (ckb == KB) ckb = 0, ct++;
            seg0 = ckb;
        }
    }
    q4wg_cp_wait<0>();
}

// ---- SoloQ-N (NVFP4): q4wg_gemm_nv ---------------------------------------------------------------------------------

/* q4wg_gemm_nv: NVFP4 weights (e2m1 codes x UE4M3 block scales per 16 along K x s_w[n]) times NVFP4 tokens given as
 * their bf16 C values x s_x[m], on wgmma m64nNTk16.f32.bf16.bf16. Twin: dllm__cpu_q4_gemm (NVFP4) within fp32 order,
 * dllm__q4wg_prepack_nv for the layout.
 *
 *   y[m][n] = bf16(((acc * 2^20) * s_x[m]) * s_w[n]),   acc = fp32 sum over k of (C_w 2^-20) C_x
 *
 * Every product C_w C_x is exact (bf16 times bf16 in fp32), so the sum differs from the twin's (fmaf, k ascending)
 * only in its order. That order is FIXED, independent of M, the grid and the configuration: TF = 128 features a tile
 * in every configuration; each tile's K is cut into a.ksplit chunks (the host chooses it from N and K only:
 * dllm__q4wg_nv_ksplit); a chunk is one wgmma chain from zero, k16 steps ascending; the chunks' fp32
 * partials are folded left to right (((c0 + c1) + c2) ...) by the tile's last CTA (plain stores to wsf, an atomic count
 * in cnt; no float atomics), or, where M holds several chunks of NT tokens (the 128-token configuration), in the same
 * order in registers by the CTA that owns the whole (tile, token chunk). So a token row's bits depend on neither M nor
 * the other rows.
 *
 * Dequantisation without a table: a bf16 whose exponent field is e2m1's (e1 e0) and whose top mantissa bit is e2m1's m
 * is exactly e2m1 x 2^-126 (0.5 is a bf16 subnormal). Packed weights (q4wg_prepack_nv; twin dllm__q4wg_prepack_nv): per
 * 64-row tile and 128-wide k block, 4608 bytes: codes [h 0..1][thread 0..127][16 bytes], then scales [quad 0..31][16
 * bytes]. Code word j of (h, thread) is k16 step s = 4 h + j, its 8 nibbles laid out so that (S = 0x81C081C0)
 *   A0 = x & S, A1 = rotl(x, 10) & S, A2 = rotl(x, 13) & S, A3 = ((x & 0x001B001B) * 0x1084) & S
 * are the bf16 pairs (sign bit 15, e2m1's (e1 e0 m) at bits 8..6) of the PTX bf16 A fragment: register j, half hf =
 * row 16 warp + lane / 4 + 8 (j & 1), k 16 s + 2 (lane % 4) + 8 (j >> 1) + hf (the IMAD's three shifted copies of 8
 * masked bits neither overlap nor carry). Scale word i of quad q (rows g = 16 warp + q % 8 and g + 8) holds steps 2 i
 * and 2 i + 1 as b' = (E + 9) << 3 | f for |scale| = 2^E (1 + f / 8) (UE4M3 subnormals normalised), placed so that
 * (W & 0x0FF00FF0) | 0x70007000 is the bf16 pair {s(g), s(g + 8)} x 2^106 of step 2 i and the same of rotl(W, 8) step
 * 2 i + 1; A_j x that (HMUL2, bf16 subnormals kept) = C_w 2^-20 exactly. Zero-scale blocks have zero codes, a negative
 * scale byte flips the codes' signs (the prepack does both), NaN scales are refused at load.
 *
 * Tokens: bf16 [M][ldx], staged as the integer path stages int8 (q4wg_stage): a 128-wide k block is two 64-wide halves
 * of NT x 128 bytes, each a k16 step of +32 bytes. Requirements: N % 128 == 0, K % (512 ksplit) == 0, M <= NT outside the
 * 128-token configuration. */

/* d (64 x NT f32, accumulator layout) += A (64 x 16 bf16, registers a0..a3) . B (NT x 16 bf16, shared, K-major)^T */
template <int NT>
__device__ __forceinline__ void q4wg_mma_bf16(float (&d)[NT / 2], u32 a0, u32 a1, u32 a2, u32 a3, u64 desc) {
    if constexpr (NT == 32)
        asm volatile(WG_RS16("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16", ", 1, 1, 0")
                     : WG_FLAT16("+f", d, 0)
                     : WG_RS_IN(a0, a1, a2, a3, desc));
    else if constexpr (NT == 64)
        asm volatile(WG_RS32("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", ", 1, 1, 0")
                     : WG_FLAT32("+f", d, 0)
                     : WG_RS_IN(a0, a1, a2, a3, desc));
    else if constexpr (NT == 128)
        asm volatile(WG_RS64("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", ", 1, 1, 0")
                     : WG_FLAT64("+f", d, 0)
                     : WG_RS_IN(a0, a1, a2, a3, desc));
    else if constexpr (NT == 256)
        asm volatile(WG_RS128("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", ", 1, 1, 0")
                     : WG_FLAT128("+f", d, 0)
                     : WG_RS_IN(a0, a1, a2, a3, desc));
}

__device__ __forceinline__ u32 q4wg_rotl(u32 x, int n) { return __funnelshift_l(x, x, n); }

/* bf16x2 a times {s.lo, s.lo} / {s.hi, s.hi}: one HMUL2.BF16 whose broadcast is an operand swizzle. */
__device__ __forceinline__ u32 q4wg_bmul_lo(u32 a, u32 s) {
    u32 r;
    asm("{\n.reg .b16 l, h;\n.reg .b32 b;\nmov.b32 {l, h}, %2;\nmov.b32 b, {l, l};\nmul.rn.bf16x2 %0, %1, b;\n}"
        : "=r"(r)
        : "r"(a), "r"(s));
    return r;
}
__device__ __forceinline__ u32 q4wg_bmul_hi(u32 a, u32 s) {
    u32 r;
    asm("{\n.reg .b16 l, h;\n.reg .b32 b;\nmov.b32 {l, h}, %2;\nmov.b32 b, {h, h};\nmul.rn.bf16x2 %0, %1, b;\n}"
        : "=r"(r)
        : "r"(a), "r"(s));
    return r;
}

/* A scale word's pair for its even step: bf16 {s(row g), s(row g + 8)} x 2^106. */
__device__ __forceinline__ u32 q4wg_nv_scale(u32 w) {
    u32 r;
    asm("lop3.b32 %0, %1, 0x0FF00FF0, 0x70007000, 0xEA;" : "=r"(r) : "r"(w));  // (a & b) | c
    return r;
}

/* The four A registers of one k16 step (C_w 2^-20): code word x, scale pair sp. */
__device__ __forceinline__ void q4wg_nv_step(u32 x, u32 sp, u32 (&A)[4]) {
    const u32 S = 0x81C081C0u;
    u32 m3;
    asm("mul.lo.u32 %0, %1, 0x1084;" : "=r"(m3) : "r"(x & 0x001B001Bu));
    A[0] = q4wg_bmul_lo(x & S, sp);
    A[1] = q4wg_bmul_hi(q4wg_rotl(x, 10) & S, sp);
    A[2] = q4wg_bmul_lo(q4wg_rotl(x, 13) & S, sp);
    A[3] = q4wg_bmul_hi(m3 & S, sp);
}

/* The fp32 accumulators' wait (q4wg_wgmma_wait for the integer ones). */
template <int PENDING, int R, int NREG> __device__ __forceinline__ void q4wg_wgmma_wait(float (&acc)[R][NREG]) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < NREG; i++) asm volatile("" : "+f"(acc[r][i])::"memory");
}

/* NT tokens, WGS warpgroups of R 64-row tiles (TF = 128 in every configuration: the tiles, hence the order, are the
 * same), P k blocks a group, SG activation stages. Each k block is two wgmma groups (k 0-63, 64-127); the next half's A
 * registers are written while the previous half's wgmmas run, except at NT = 256, whose 128 accumulator registers
 * leave no room for two sets. Weights of group g + 1 load into registers and its tokens into shared memory while
 * group g computes. CTAs take contiguous runs of whole units: (tile, K chunk), or (tile, token chunk) past NT tokens. */
template <int NT, int WGS, int R, int P, int SG>
__global__ void __launch_bounds__(128 * WGS) q4wg_gemm_nv(const q4wg_args a) {
    constexpr int THREADS = 128 * WGS, TF = 64 * WGS * R, NREG = NT / 2, WAITH = NT >= 256 ? 0 : 1;
    constexpr bool FOLD = NT == 128;  // the many-row configuration (dllm__q4wg_nv_fold_config)
    constexpr u32 KSTAGE = NT * 128, GSTAGE = KSTAGE * 2 * P;
    static_assert(TF == 128, "NVFP4: 128-feature tiles in every configuration (the summation order)");
    static_assert(SG == 2 || SG == 3, "stages");
    static_assert((NT * 8) % THREADS == 0, "stage copy");
    pdl_enter();
    extern __shared__ __align__(16) unsigned char q4wg_smem[];
    __shared__ int last_flag;
    const u32 s0 = (smem_u32(q4wg_smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid >> 7, t128 = tid & 127;
    // Units: one chunk of at most NT tokens: (tile, K chunk), each chunk's partial through wsf; more chunks (FOLD
    // configurations only): whole (tile, token chunk) units, unit t chunks + c, their K chunks folded in registers.
    const int KB = a.K >> 7, tiles = a.N / TF, ks = a.ksplit, KU = KB / ks;
    const int chunks = FOLD ? (a.M + NT - 1) / NT : 1, whole = chunks > 1, units = whole ? tiles * chunks : tiles * ks;
    const int u0 = (int)((long long)blockIdx.x * units / gridDim.x),
              u1 = (int)((long long)(blockIdx.x + 1) * units / gridDim.x);
    if (u0 >= u1) return;
    const int it0 = u0 * (whole ? KB : KU), it1 = u1 * (whole ? KB : KU);  // k blocks over all units (unit KB + kb)

    u64 policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));

    // Weights in 16-byte units, 288 a (64-row tile, k block): codes [h][thread], then scales [quad].
    const int rstride = KB * 288;  // one 64-row tile (32-bit offsets: fewer live registers)
    const int cofs = t128, sofs = 256 + (t128 >> 2);
    // The group whose weights and tokens load next: unit lu (its weights wu, its first token row xm), k block lkb.
    int lu = it0 / KB, lkb = it0 % KB, xm = lu % chunks * NT;
    const q4wg_u32x4 *wu = (const q4wg_u32x4 *)a.w + (long long)((lu / chunks) * WGS + wg) * R * rstride;
    const signed char *xb = (const signed char *)a.xb;  // bytes: 256 a k block
    const int ldxb = (int)a.ldx * 2;
    auto advance = [&]() {
        lkb += P;
        if (lkb == KB) {
            lkb = 0, lu++, xm = lu % chunks * NT;
            wu = (const q4wg_u32x4 *)a.w + (long long)((lu / chunks) * WGS + wg) * R * rstride;
        }
    };
    auto stage = [&](u32 dst) {
        q4wg_stage<NT, THREADS, 2 * P>(dst, xb + (long long)xm * ldxb + lkb * 256, ldxb, min(NT, a.M - xm), tid);
    };
    stage(s0);
    q4wg_cp_commit();
    q4wg_u32x4 wq[P][R][3];
#pragma unroll
    for (int p = 0; p < P; p++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            const q4wg_u32x4 *q = wu + r * rstride + (lkb + p) * 288;
            wq[p][r][0] = q4wg_ldg(q + cofs, policy);
            wq[p][r][1] = q4wg_ldg(q + 128 + cofs, policy);
            wq[p][r][2] = q4wg_ldg(q + sofs, policy);
        }
    advance();

    float acc[R][NREG], tot[R][FOLD ? NREG : 1];  // tot: a whole unit's K chunks folded so far
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < NREG; i++) acc[r][i] = 0.0f;

    int ct = it0 / KB, ckb = it0 % KB;
    u32 cst = 0, pst = 1;
    for (int it = it0; it < it1; it += P) {
        const bool more = it + P < it1;
        q4wg_cp_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (more) stage(s0 + pst * GSTAGE);
        q4wg_cp_commit();
        pst = pst + 1 == SG ? 0 : pst + 1;
        const u64 dg = wg_desc(s0 + cst * GSTAGE);  // made per group: a descriptor kept live costs two registers
        cst = cst + 1 == SG ? 0 : cst + 1;
#pragma unroll
        for (int p = 0; p < P; p++) {
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                u32 A[R][4][4];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const q4wg_u32x4 &v = wq[p][r][hh], &sc = wq[p][r][2];
                    const u32 w0 = hh ? sc.z : sc.x, w1 = hh ? sc.w : sc.y;
                    q4wg_nv_step(v.x, q4wg_nv_scale(w0), A[r][0]);
                    q4wg_nv_step(v.y, q4wg_nv_scale(q4wg_rotl(w0, 8)), A[r][1]);
                    q4wg_nv_step(v.z, q4wg_nv_scale(w1), A[r][2]);
                    q4wg_nv_step(v.w, q4wg_nv_scale(q4wg_rotl(w1, 8)), A[r][3]);
                }
                if (hh == 1 && more)
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const q4wg_u32x4 *q = wu + r * rstride + (lkb + p) * 288;
                        wq[p][r][0] = q4wg_ldg(q + cofs, policy);
                        wq[p][r][1] = q4wg_ldg(q + 128 + cofs, policy);
                        wq[p][r][2] = q4wg_ldg(q + sofs, policy);
                    }
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                const u64 d0 = dg + ((2 * p + hh) * KSTAGE >> 4);
#pragma unroll
                for (int s = 0; s < 4; s++)
#pragma unroll
                    for (int r = 0; r < R; r++)
                        q4wg_mma_bf16<NT>(acc[r], A[r][s][0], A[r][s][1], A[r][s][2], A[r][s][3], d0 + s * 2);
                asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                if (p + 1 < P || hh == 0) q4wg_wgmma_wait<WAITH>(acc);
            }
        }
        q4wg_wgmma_wait<SG - 2>(acc);
        advance();
        ckb += P;
        if (ckb % KU == 0) {
            // ---- K chunk ckb / KU - 1 of unit ct is complete: fold it, publish it, or fold the tile ----
            q4wg_wgmma_wait<0>(acc);
            bool store = true;
            if constexpr (FOLD) {
                if (whole) {  // (((c0 + c1) + c2) + ...), as the tile's last CTA folds them below
                    const bool first = ckb == KU;
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int i = 0; i < NREG; i++) tot[r][i] = first ? acc[r][i] : __fadd_rn(tot[r][i], acc[r][i]);
                    store = ckb == KB;
                    if (store)
#pragma unroll
                        for (int r = 0; r < R; r++)
#pragma unroll
                            for (int i = 0; i < NREG; i++) acc[r][i] = tot[r][i];
                }
            }
            if (ks > 1 && !whole) {
                const int chunk = ckb / KU - 1;
                const long long tstride = (long long)NT * TF;
                float *wsp = a.wsf + (long long)ct * ks * tstride + (wg * R) * NREG * 128 + t128;
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int i = 0; i < NREG; i++) __stcg(wsp + chunk * tstride + (r * NREG + i) * 128, acc[r][i]);
                __threadfence();
                __syncthreads();
                if (tid == 0) last_flag = atomicAdd(a.cnt + ct, 1) == ks - 1;
                __syncthreads();
                store = last_flag != 0;
                if (store) {
                    __threadfence();
                    // (((c0 + c1) + c2) + ...), four chunks' loads in flight at a time
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int i = 0; i < NREG; i++) acc[r][i] = __ldcg(wsp + (r * NREG + i) * 128);
                    for (int c = 1; c < ks; c += 4) {
#pragma unroll
                        for (int r = 0; r < R; r++)
#pragma unroll
                            for (int i = 0; i < NREG; i++) {
                                const float *q = wsp + c * tstride + (r * NREG + i) * 128;
                                float v[4];
#pragma unroll
                                for (int j = 0; j < 4; j++) v[j] = c + j < ks ? __ldcg(q + j * tstride) : 0.0f;
#pragma unroll
                                for (int j = 0; j < 4; j++)
                                    if (c + j < ks) acc[r][i] = __fadd_rn(acc[r][i], v[j]);
                            }
                    }
                    if (tid == 0) a.cnt[ct] = 0;
                }
            }
            if (store) {
                const int warp = t128 >> 5, g = (tid & 31) >> 2, tq = tid & 3, m0 = ct % chunks * NT;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int f = ct / chunks * TF + (wg * R + r) * 64 + warp * 16 + g;
                    const float sw0 = a.s_w[f], sw1 = a.s_w[f + 8];
#pragma unroll
                    for (int j = 0; j < NT / 8; j++) {
                        const int m = m0 + 8 * j + 2 * tq;
                        if (m < a.M) {
                            const float sx = a.s_x[m];
                            const long long at = (long long)m * a.ldy + f;
                            q4wg_store(a, at, __fmul_rn(__fmul_rn(__fmul_rn(acc[r][4 * j], 0x1p20f), sx), sw0));
                            q4wg_store(a, at + 8, __fmul_rn(__fmul_rn(__fmul_rn(acc[r][4 * j + 2], 0x1p20f), sx), sw1));
                        }
                        if (m + 1 < a.M) {
                            const float sx = a.s_x[m + 1];
                            const long long at = (long long)(m + 1) * a.ldy + f;
                            q4wg_store(a, at, __fmul_rn(__fmul_rn(__fmul_rn(acc[r][4 * j + 1], 0x1p20f), sx), sw0));
                            q4wg_store(a, at + 8, __fmul_rn(__fmul_rn(__fmul_rn(acc[r][4 * j + 3], 0x1p20f), sx), sw1));
                        }
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int i = 0; i < NREG; i++) acc[r][i] = 0.0f;
            if (ckb == KB) ckb = 0, ct++;
        }
    }
    q4wg_cp_wait<0>();
}

/* Canonical rows [n][k / 2] (low nibble first) into the packed layout above, one thread per packed byte (n % 64 == 0,
 * k % 128 == 0). Twin: dllm__q4wg_prepack. */
KERNEL_q4wg_prepack {
    pdl_enter();
    const u64 total = (u64)n * k / 2;
    const int kb_count = k / 128;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const int byte = (int)(i % 4096), b = byte & 3, j = (byte >> 2) & 3, thread = (byte >> 4) & 127, h = byte >> 11;
        const int warp = thread >> 5, lane = thread & 31;
        const u64 block = i / 4096;
        const int tile = (int)(block / kb_count), kb = (int)(block % kb_count);
        const int s = 2 * h + (j >> 1), row = 64 * tile + 16 * warp + lane / 4 + 8 * (j & 1);
        const int kk = 128 * kb + 32 * s + 4 * (lane % 4) + b;  // the low nibble's k; the high nibble's is kk + 16
        const unsigned char *r = rows + (u64)row * (k / 2);
        const int lo = r[kk / 2] >> (4 * (kk & 1)) & 15, hi = r[(kk + 16) / 2] >> (4 * (kk & 1)) & 15;
        packed[i] = (unsigned char)(lo | hi << 4);
    }
}

/* The code-word bit that lands on A register j's bit q4wg_nv_pos[q] (bits 6, 7, 8, 15 of the low bf16 = e2m1's m, e0,
 * e1, sign; then the high bf16's) through q4wg_nv_step's extractions: x & S, rotl(x, 10) & S, rotl(x, 13) & S and the
 * IMAD's copies of bits {0, 1, 3, 4, 16, 17, 19, 20} shifted by 2, 7 and 12. Twin: dllm__q4wg_nv_src. */
__device__ const unsigned char q4wg_nv_src[4][8] = {{6, 7, 8, 15, 22, 23, 24, 31},
                                                    {28, 29, 30, 5, 12, 13, 14, 21},
                                                    {25, 26, 27, 2, 9, 10, 11, 18},
                                                    {4, 0, 1, 3, 20, 16, 17, 19}};

/* A UE4M3 scale byte's b' (without its sign): |s| = 2^E (1 + f / 8) as (E + 9) << 3 | f; 0 for 0. Twin:
 * dllm__q4wg_nv_bprime. */
__device__ __forceinline__ u32 q4wg_nv_bprime(u32 c) {
    const u32 e = (c >> 3) & 15, m = c & 7;
    if (e) return ((e + 2) << 3) | m;
    if (!m) return 0;
    const u32 sh = m >= 4 ? 2 : m >= 2 ? 1 : 0;  // m 2^-9 = 2^(sh - 9) (1 + f / 8)
    return (sh << 3) | ((m << (3 - sh)) & 7);
}

/* Canonical NVFP4 rows [n][k / 2] and block scales [n][k / 16] into q4wg_gemm_nv's layout, one thread per packed
 * 32-bit word (n % 64 == 0, k % 128 == 0); a NaN scale (0x7F / 0xFF) counts in *nan_scales and packs as zero. Twin:
 * dllm__q4wg_prepack_nv. */
KERNEL_q4wg_prepack_nv {
    pdl_enter();
    const u64 total = (u64)n * k * 9 / 64;
    const int kb_count = k / 128, nb = k / 16;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 block = i / 1152;
        const int word = (int)(i % 1152), tile = (int)(block / kb_count), kb = (int)(block % kb_count);
        const unsigned char *bs = block_scales;
        u32 out = 0;
        if (word < 1024) {  // a code word: step s = 4 h + jw of thread (warp, lane)
            const int jw = word & 3, thread = (word >> 2) & 127, h = word >> 9, warp = thread >> 5, lane = thread & 31;
            const int s = 4 * h + jw;
            for (int j = 0; j < 4; j++)
                for (int hf = 0; hf < 2; hf++) {
                    const int row = 64 * tile + 16 * warp + lane / 4 + 8 * (j & 1);
                    const int kk = 128 * kb + 16 * s + 2 * (lane % 4) + 8 * (j >> 1) + hf;
                    const u32 sc = bs[(u64)row * nb + kk / 16] & 0xFF;
                    u32 c = rows[(u64)row * (k / 2) + kk / 2] >> (4 * (kk & 1)) & 15;
                    if ((sc & 0x7F) == 0 || (sc & 0x7F) == 0x7F)
                        c = 0;  // +0 whatever the sign bit, as the twin packs it
                    else if (sc & 0x80)
                        c ^= 8;
                    for (int q = 0; q < 4; q++) out |= (c >> q & 1) << q4wg_nv_src[j][q + 4 * hf];
                }
        } else {  // a scale word: steps 2 i, 2 i + 1 of rows r0, r0 + 8
            const int quad = (word - 1024) >> 2, i4 = word & 3;
            const int r0 = 64 * tile + 16 * (quad / 8) + quad % 8;
            auto bp = [&](int row, int step) {
                const u32 sc = bs[(u64)row * nb + kb * 8 + step] & 0x7F;
                if (sc == 0x7F) atomicAdd(nan_scales, 1);
                return sc == 0x7F ? 0u : q4wg_nv_bprime(sc);
            };
            const u32 a0 = bp(r0, 2 * i4), a1 = bp(r0 + 8, 2 * i4), b0 = bp(r0, 2 * i4 + 1),
                      b1 = bp(r0 + 8, 2 * i4 + 1);
            out = a0 << 4 | a1 << 20 | (b0 & 15) << 28 | b0 >> 4 | b1 << 12;
        }
        packed[i] = out;
    }
}
