/* q4_wgmma.cuh -- SoloQ's few-row 4-bit weight GEMM on Hopper wgmma (sm_90a), prototype for dllm issue 40.
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
 * Packed weights (prepack.h, q4wg_prepack): for each 64-row tile T and 128-wide k block kb, 4096 bytes:
 *   [T][kb][h = 0, 1][thread 0..127][16 bytes]; 16 bytes = 4 words; word j covers k32 step s = 2h + (j >> 1) and row
 *   rs = j & 1 of the thread's pair (16 warp + lane/4 + 8 rs); byte b of the word: low nibble = W[row][32 s + 4 (lane%4) + b],
 *   high nibble = W[row][32 s + 16 + 4 (lane%4) + b].  So word (s, 0) -> A regs 0 (lo) and 2 (hi), word (s, 1) -> 1 and 3:
 *   CUTLASS's ALayout_64x32 = the PTX ISA's 8-bit A fragment: reg v1 + 2 v2 byte v0 = (row 16 w + g + 8 v1,
 *   k 4 t + v0 + 16 v2).
 *
 * Schedule: stream-K over (CTA tile of TF = 64 WGS R features) x (k blocks of 128), cut into groups of P k blocks;
 * CTA c gets a contiguous run of groups. A segment that covers a whole tile writes y directly; partial segments
 * red.add their int32 sums into ws (layout = the accumulator layout, coalesced) and count k blocks in cnt[tile];
 * the CTA that completes the count reads the sums back, zeroes ws and cnt (self-cleaning: ws / cnt must be zero
 * before the first launch) and runs the epilogue. Integer sums: any split or order gives the same bits.
 *
 * NVRTC: no CUDA headers. Define Q4WG_HAVE_TYPES where u32 / u64 already exist (dllm's common prelude).
 */
#ifndef Q4WG_CUH
#define Q4WG_CUH

#ifndef Q4WG_HAVE_TYPES
typedef unsigned int u32;
typedef unsigned long long u64;
#endif

/* nvcc -arch=sm_90a also emits compute_90 PTX, where wgmma does not exist: the kernel body compiles only for the
 * sm_90a target (and for the host pass); elsewhere it traps. */
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define Q4WG_SM90A 1
#else
#define Q4WG_SM90A 0
#endif

#define Q4WG_INT4 1  // dllm__q4_format DLLM__Q4_INT4 (SoloQ-I): C = 2q + 1
#define Q4WG_RTN 4   // dllm__q4_format DLLM__Q4_RTN: C = q

struct q4wg_args {
    const signed char *x;  // [M][ldx] int8 token C values
    const float *s_x;      // [M]
    const void *w;         // packed codes (q4wg_prepack), 16-byte aligned
    const float *s_w;      // [N]
    float *y;              // [M][ldy]
    int *ws;               // [N / TF][NT * TF] int32, zero before the first launch (kept zero by the kernel)
    int *cnt;              // [N / TF], zero likewise
    long long ldx, ldy;
    int M, N, K;           // M <= NT, N % TF == 0, K % (128 P) == 0
    // ---- added for the NVFP4 (SoloQ-N) path, q4wg_gemm_nv; the integer path ignores them ----
    const unsigned short *xb;  // [M][ldx] bf16 token C values (e2m1 x e4m3, exact in bf16)
    float *wsf;                // [N / 128][ksplit][NT * 128] fp32 chunk partials (any content; ksplit > 1 only)
    int ksplit;                // K chunks a 128-feature tile: fixes the summation order; choose it from (N, K) only
};

__device__ __forceinline__ u32 q4wg_smem_u32(const void *p) { return (u32)__cvta_generic_to_shared(p); }

/* B descriptor, K-major, 128-byte swizzle (dllm__src_hopper's wg_desc): rows of 128 bytes (128 int8 k values of
 * one token), 8-row atoms 1024 bytes apart; a k32 step is +32 bytes of the start address. */
__device__ __forceinline__ u64 q4wg_desc(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(1024 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

/* d (64 x NT s32, accumulator layout) += A (64 x 32 s8, registers a0..a3) . B (NT x 32 s8, shared, K-major)^T */
template <int NT>
__device__ __forceinline__ void q4wg_mma(int (&d)[NT / 2], u32 a0, u32 a1, u32 a2, u32 a3, u64 desc) {
#if Q4WG_SM90A
    if constexpr (NT == 32)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
                     ", {%16, %17, %18, %19}, %20, p;\n}\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                     "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    else if constexpr (NT == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
                     ", {%32, %33, %34, %35}, %36, p;\n}\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                     "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
                     "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                     "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    else if constexpr (NT == 128)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                     "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                     "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
                     ", {%64, %65, %66, %67}, %68, p;\n}\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                     "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
                     "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                     "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
                     "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
                     "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
                     "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
                     "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    else if constexpr (NT == 256)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                     "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                     "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                     "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                     "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                     "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                     "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
                     ", {%128, %129, %130, %131}, %132, p;\n}\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                     "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
                     "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                     "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
                     "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
                     "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
                     "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
                     "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]),
                     "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]),
                     "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]),
                     "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]),
                     "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]),
                     "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]),
                     "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]),
                     "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]),
                     "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
#endif
}

/* Nibbles in the high half of each byte (x & 0xF0F0F0F0) read as s8 are 16 q; SoloQ-I ORs in 8: 8 (2q + 1). */
template <int FMT>
__device__ __forceinline__ u32 q4wg_hi(u32 x) {
    u32 r;
    if (FMT == Q4WG_INT4)
        asm("lop3.b32 %0, %1, 0xF0F0F0F0, 0x08080808, 0xEA;" : "=r"(r) : "r"(x));  // (a & b) | c
    else
        asm("and.b32 %0, %1, 0xF0F0F0F0;" : "=r"(r) : "r"(x));
    return r;
}
template <int FMT>
__device__ __forceinline__ u32 q4wg_lo(u32 x) { return q4wg_hi<FMT>(x << 4); }

struct q4wg_u32x4 { u32 x, y, z, w; };

__device__ __forceinline__ q4wg_u32x4 q4wg_ldg(const q4wg_u32x4 *p, u64 policy) {
    q4wg_u32x4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
    return v;
}

__device__ __forceinline__ void q4wg_cp16(u32 dst, const void *src, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void q4wg_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void q4wg_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

template <int PENDING, int R, int NREG>
__device__ __forceinline__ void q4wg_wgmma_wait(int (&acc)[R][NREG]) {
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
        const signed char *g = src + (u32)(ok ? row * (int)ldx : 0) + c * 16;  // 32-bit row offsets: fewer live registers
        #pragma unroll
        for (int p = 0; p < P; p++) q4wg_cp16(d0 + p * (NT * 128) + j * THREADS * 16, g + p * 128, ok ? 16 : 0);
    }
}

/* NT tokens (wgmma N), FMT (Q4WG_INT4 / Q4WG_RTN), WGS warpgroups a CTA, R 64-row tiles a warpgroup, P k blocks (of
 * 128) a group, SG activation stages (one a group; 2: every wgmma of a group awaited at its end, 3: one k block's left
 * in flight). Weights of group g + 1 load into registers while group g computes; activations of group g + 1 are
 * copied (cp.async) while group g computes. */
/* Added (defaults = the original kernel): WAITK, the wgmma groups left in flight between the k blocks of a group (-1:
 * 1, or 0 for NT = 256; 0 frees the A registers of TF = 256 at NT = 128); CL > 1: cluster split-K. The grid is then
 * (N / TF) x CL CTAs launched as clusters of CL (cudaLaunchAttributeClusterDimension): CTA rank q of cluster t
 * computes tile t over k blocks [q KB / CL, (q + 1) KB / CL) (KB % (CL P) == 0), parks its int32 sums in its own shared
 * memory, and after a cluster barrier reduces 1/CL of the tile's outputs from all CL CTAs over DSMEM (integer sums:
 * exact in any order) and writes them; no ws / cnt traffic, no global atomics. */
template <int NT, int FMT, int WGS, int R, int P, int SG, int WAITK = -1, int CL = 1>
__global__ void __launch_bounds__(128 * WGS) q4wg_gemm(const q4wg_args a) {
    constexpr int WAITIN = WAITK >= 0 ? WAITK : (NT >= 256 ? 0 : 1);
    static_assert(CL == 1 || (WGS * R * (NT / 2)) % CL == 0, "cluster slice");
    constexpr int THREADS = 128 * WGS, TF = 64 * WGS * R, NREG = NT / 2;
    constexpr u32 KSTAGE = NT * 128, GSTAGE = KSTAGE * P;
    constexpr int SH = FMT == Q4WG_INT4 ? 3 : 4;
    static_assert(SG == 2 || SG == 3, "stages");
    static_assert((NT * 8) % THREADS == 0, "stage copy");
#if !Q4WG_SM90A
    (void)TF, (void)NREG, (void)GSTAGE, (void)SH, (void)WAITIN;
    __trap();
#else
    extern __shared__ __align__(16) unsigned char q4wg_smem[];
    __shared__ int last_flag;
    const u32 s0 = (q4wg_smem_u32(q4wg_smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid >> 7, t128 = tid & 127;
    const int KB = a.K >> 7, tiles = a.N / TF, groups = tiles * (KB / P);
    int it0, it1;
    if constexpr (CL == 1) {
        const int g0 = (int)((long long)blockIdx.x * groups / gridDim.x), g1 = (int)((long long)(blockIdx.x + 1) * groups / gridDim.x);
        if (g0 >= g1) return;
        it0 = g0 * P, it1 = g1 * P;
    } else {
        (void)groups;
        const int q = (int)(blockIdx.x % CL), t = (int)(blockIdx.x / CL);
        it0 = t * KB + q * (KB / CL), it1 = it0 + KB / CL;
    }

    u64 policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));

    // Weights: 16-byte units; slot r of this warpgroup in CTA tile t is 64-row tile (t WGS + wg) R + r.
    const long long rstride = (long long)KB * 256;  // one 64-row tile
    int lkb = it0 % KB;                             // the k block whose weights load next
    const q4wg_u32x4 *wp = (const q4wg_u32x4 *)a.w + t128 + ((long long)((it0 / KB) * WGS + wg) * R * KB + lkb) * 256;

    // Group g0's activations, then its weights.
    int akb = lkb;  // the first k block of the group whose activations are copied next
    q4wg_stage<NT, THREADS, P>(s0, a.x + akb * 128, a.ldx, a.M, tid);
    q4wg_cp_commit();
    akb = akb + P == KB ? 0 : akb + P;
    q4wg_u32x4 wq[P][R][2];
    #pragma unroll
    for (int p = 0; p < P; p++)
        #pragma unroll
        for (int r = 0; r < R; r++)
            #pragma unroll
            for (int h = 0; h < 2; h++) wq[p][r][h] = q4wg_ldg(wp + r * rstride + p * 256 + h * 128, policy);
    wp += P * 256;
    lkb += P;
    if (lkb == KB) lkb = 0, wp += (WGS * R - 1) * rstride;

    int acc[R][NREG];
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int i = 0; i < NREG; i++) acc[r][i] = 0;

    int ct = it0 / KB, ckb = it0 % KB, seg0 = ckb;
    const u64 desc0 = q4wg_desc(s0);  // s0 + SG GSTAGE < 2^18: the 14-bit address field never carries
    u32 cst = 0, pst = 1;  // the stage the group computes from / the next group's copy goes to
    for (int it = it0; it < it1; it += P) {
        const bool more = it + P < it1;
        // This group's activations are in (every thread's copies, made visible to wgmma's async proxy), and every
        // wgmma of the group that last read stage pst is done (SG = 2: awaited at each group's end; SG = 3: the
        // group before the last one).
        q4wg_cp_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (more) q4wg_stage<NT, THREADS, P>(s0 + pst * GSTAGE, a.x + akb * 128, a.ldx, a.M, tid);
        q4wg_cp_commit();
        akb = akb + P == KB ? 0 : akb + P;
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
                    for (int h = 0; h < 2; h++) wq[p][r][h] = q4wg_ldg(wp + r * rstride + p * 256 + h * 128, policy);

            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
            const u64 d0 = dg + p * (KSTAGE >> 4);
            #pragma unroll
            for (int s = 0; s < 4; s++)
                #pragma unroll
                for (int r = 0; r < R; r++) q4wg_mma<NT>(acc[r], A[r][s][0], A[r][s][1], A[r][s][2], A[r][s][3], d0 + s * 2);
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            // The next k block's A registers are written while this one's wgmmas run (ptxas keeps both sets live);
            // NT = 256 (128 accumulator registers) has no room for two sets and waits here.
            if (p + 1 < P) q4wg_wgmma_wait<WAITIN>(acc);
        }
        q4wg_wgmma_wait<SG - 2>(acc);
        wp += P * 256;
        lkb += P;
        if (lkb == KB) lkb = 0, wp += (WGS * R - 1) * rstride;
        ckb += P;
        if constexpr (CL > 1) {
            if (!more) {
                // ---- cluster reduction over DSMEM: park the sums, barrier, sum slice q of all CL CTAs, write it ----
                q4wg_wgmma_wait<0>(acc);
                q4wg_cp_wait<0>();
                __syncthreads();  // every wgmma / copy of this CTA's stages is done: the stage memory is free
                constexpr int SLOTS = WGS * R * NREG, PER = SLOTS / CL;
                #pragma unroll
                for (int r = 0; r < R; r++)
                    #pragma unroll
                    for (int i = 0; i < NREG; i++)
                        asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(s0 + (u32)((((wg * R + r) * NREG + i) * 128 + t128) * 4)), "r"(acc[r][i]) : "memory");
                asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
                u32 q;
                asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(q));
                const int warp = t128 >> 5, g = (tid & 31) >> 2, tq = tid & 3;
                for (int e = tid; e < PER * 128; e += THREADS) {
                    const int slot = (int)q * PER + (e >> 7), tt = e & 127;  // slot = (wg R + r) NREG + i
                    const u32 la = s0 + (u32)((slot * 128 + tt) * 4);
                    int sum = 0;
                    #pragma unroll
                    for (int c = 0; c < CL; c++) {
                        u32 ra;
                        int v;
                        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(la), "r"(c));
                        asm volatile("ld.shared::cluster.s32 %0, [%1];\n" : "=r"(v) : "r"(ra) : "memory");
                        sum += v;
                    }
                    const int wr = slot / NREG, i = slot % NREG, w2 = tt >> 5, g2 = (tt & 31) >> 2, tq2 = tt & 3;
                    const int f = ct * TF + wr * 64 + w2 * 16 + g2 + 8 * ((i & 3) >> 1), m = 8 * (i >> 2) + 2 * tq2 + (i & 1);
                    if (m < a.M) a.y[(long long)m * a.ldy + f] = __fmul_rn(__fmul_rn((float)(sum >> SH), a.s_x[m]), a.s_w[f]);
                }
                (void)warp, (void)g, (void)tq;
                asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
            }
            continue;
        }
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
                        asm volatile("red.global.add.s32 [%0], %1;\n" ::"l"(wsp + (r * NREG + i) * 128), "r"(acc[r][i]) : "memory");
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
                const int warp = t128 >> 5, g = (tid & 31) >> 2, tq = tid & 3;
                #pragma unroll
                for (int r = 0; r < R; r++) {
                    const int f = ct * TF + (wg * R + r) * 64 + warp * 16 + g;
                    const float sw0 = a.s_w[f], sw1 = a.s_w[f + 8];
                    #pragma unroll
                    for (int j = 0; j < NT / 8; j++) {
                        const int m = 8 * j + 2 * tq;
                        if (m < a.M) {
                            const float sx = a.s_x[m];
                            float *yr = a.y + (long long)m * a.ldy + f;
                            yr[0] = __fmul_rn(__fmul_rn((float)(acc[r][4 * j] >> SH), sx), sw0);
                            yr[8] = __fmul_rn(__fmul_rn((float)(acc[r][4 * j + 2] >> SH), sx), sw1);
                        }
                        if (m + 1 < a.M) {
                            const float sx = a.s_x[m + 1];
                            float *yr = a.y + (long long)(m + 1) * a.ldy + f;
                            yr[0] = __fmul_rn(__fmul_rn((float)(acc[r][4 * j + 1] >> SH), sx), sw0);
                            yr[8] = __fmul_rn(__fmul_rn((float)(acc[r][4 * j + 3] >> SH), sx), sw1);
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
#endif
}

/* ---------------------------------------------------------------------------------------------------------------
 * NVFP4 (SoloQ-N) path: q4wg_gemm_nv. Weights e2m1 x UE4M3 (per 16 along K) x s_w[n]; tokens bf16 C values x s_x[m].
 *   y[m][n] = ((acc * 2^20) * s_x[m]) * s_w[n],  acc = fp32 sum of (C_w 2^-20) C_x on wgmma m64nNk16 bf16
 * Every product C_w C_x is exact (6 x 6 significant bits), the sum is fp32 in a FIXED order that depends on neither M,
 * the grid nor the config: each 128-feature tile's K is cut into a.ksplit chunks (chosen from N and K only); a chunk is
 * one wgmma chain from zero (k16 steps ascending); the chunks are folded left to right (((c0 + c1) + c2) ...) in fp32.
 * Packed weights (prepack.h, q4wg_prepack_nv): per 64-row tile T and 128-wide k block kb, 4608 bytes:
 *   [codes: h 0..1][thread 0..127][16 B]  then  [scales: quad 0..31][16 B]
 *   code word j of (h, thread) = k16 step s = 4 h + j: 8 nibbles re-laid so that (x the word, S = 0x81C081C0)
 *     A0 = x & S, A1 = rotl(x, 10) & S, A2 = rotl(x, 13) & S, A3 = ((x & 0x001B001B) * 0x1084) & S
 *   are bf16 pairs with sign at bit 15, e2m1's (e1 e0 m) at bits 8..6 = e2m1 x 2^-126 (0.5 subnormal, exact);
 *   A0 / A1 / A2 / A3 = rows (g, g + 8, g, g + 8), k (2t, 2t + 1) + (0, 0, 8, 8) of the step (the PTX bf16 A fragment).
 *   scale word i of quad q (rows g = 16 warp + q % 8 and g + 8): steps 2i and 2i + 1, re-encoded b' (prepack.h) so that
 *     (W & 0x0FF00FF0) | 0x70007000 = bf16 pair {s(g, 2i), s(g + 8, 2i)} x 2^106, rotl(W, 8) likewise for step 2i + 1;
 *   A_j = HMUL2(A_j, scale.H0_H0 / .H1_H1) = C_w x 2^-20 exactly (normal bf16). Zero-scale blocks have zero codes.
 * Tokens: bf16, K-major, 128-byte swizzle; a 128-wide k block is two 64-wide halves of NT x 128 bytes.
 * Requirements: N % 128 == 0, K % (128 P ksplit) == 0, M <= NT.
 */
#define Q4WG_NVFP4 0  // dllm__q4_format DLLM__Q4_NVFP4 (SoloQ-N)

/* d (64 x NT f32) += A (64 x 16 bf16, registers) . B (NT x 16 bf16, shared, K-major)^T */
template <int NT>
__device__ __forceinline__ void q4wg_mma_bf16(float (&d)[NT / 2], u32 a0, u32 a1, u32 a2, u32 a3, u64 desc) {
#if Q4WG_SM90A
    if constexpr (NT == 32)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
                     ", {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    else if constexpr (NT == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
                     ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    else if constexpr (NT == 128)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
                     ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    else if constexpr (NT == 256)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
                     ", {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
#endif
}

template <int PENDING, int R, int NREG>
__device__ __forceinline__ void q4wg_wgmma_wait_f(float (&acc)[R][NREG]) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int i = 0; i < NREG; i++) asm volatile("" : "+f"(acc[r][i])::"memory");
}

__device__ __forceinline__ u32 q4wg_rotl(u32 x, int n) { return __funnelshift_l(x, x, n); }
/* bf16x2 a * {s.lo, s.lo} and a * {s.hi, s.hi} (one HMUL2.BF16_V2 with an operand swizzle) */
__device__ __forceinline__ u32 q4wg_bmul_lo(u32 a, u32 s) {
    u32 r;
    asm("{\n.reg .b16 l, h;\n.reg .b32 b;\nmov.b32 {l, h}, %2;\nmov.b32 b, {l, l};\nmul.rn.bf16x2 %0, %1, b;\n}" : "=r"(r) : "r"(a), "r"(s));
    return r;
}
__device__ __forceinline__ u32 q4wg_bmul_hi(u32 a, u32 s) {
    u32 r;
    asm("{\n.reg .b16 l, h;\n.reg .b32 b;\nmov.b32 {l, h}, %2;\nmov.b32 b, {h, h};\nmul.rn.bf16x2 %0, %1, b;\n}" : "=r"(r) : "r"(a), "r"(s));
    return r;
}
/* scale pair of a word (bf16 {row g, row g + 8} x 2^106): (w & 0x0FF00FF0) | 0x70007000 */
__device__ __forceinline__ u32 q4wg_nv_scale(u32 w) {
    u32 r;
    asm("lop3.b32 %0, %1, 0x0FF00FF0, 0x70007000, 0xEA;" : "=r"(r) : "r"(w));
    return r;
}
/* The four A registers of one k16 step: code word x, scale pair sp. */
__device__ __forceinline__ void q4wg_nv_step(u32 x, u32 sp, u32 (&A)[4]) {
    const u32 S = 0x81C081C0u;
    u32 m3;
    asm("mul.lo.u32 %0, %1, 0x1084;" : "=r"(m3) : "r"(x & 0x001B001Bu));
    A[0] = q4wg_bmul_lo(x & S, sp);
    A[1] = q4wg_bmul_hi(q4wg_rotl(x, 10) & S, sp);
    A[2] = q4wg_bmul_lo(q4wg_rotl(x, 13) & S, sp);
    A[3] = q4wg_bmul_hi(m3 & S, sp);
}

/* NT tokens, WGS warpgroups x R 64-row tiles (TF = 128 always: the tiles, hence the order, are the same in every
 * config), P k blocks a group, SG activation stages. Each k block is committed as two wgmma groups (k 0-63, 64-127);
 * the A registers of the next half are written while the previous half's wgmmas run (WAITH = 1) or after they are
 * done (WAITH = 0, for NT = 256's register budget). */
template <int NT, int WGS, int R, int P, int SG, int WAITH>
__global__ void __launch_bounds__(128 * WGS) q4wg_gemm_nv(const q4wg_args a) {
    constexpr int THREADS = 128 * WGS, TF = 64 * WGS * R, NREG = NT / 2;
    constexpr u32 KSTAGE = NT * 128, GSTAGE = KSTAGE * 2 * P;
    static_assert(TF == 128, "NVFP4: 128-feature tiles in every config (the summation order)");
    static_assert(SG == 2 || SG == 3, "stages");
    static_assert((NT * 8) % THREADS == 0, "stage copy");
#if !Q4WG_SM90A
    (void)NREG, (void)GSTAGE;
    __trap();
#else
    extern __shared__ __align__(16) unsigned char q4wg_smem[];
    __shared__ int last_flag;
    const u32 s0 = (q4wg_smem_u32(q4wg_smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid >> 7, t128 = tid & 127;
    const int KB = a.K >> 7, tiles = a.N / TF, ks = a.ksplit, KU = KB / ks, units = tiles * ks;
    const int u0 = (int)((long long)blockIdx.x * units / gridDim.x), u1 = (int)((long long)(blockIdx.x + 1) * units / gridDim.x);
    if (u0 >= u1) return;
    const int it0 = u0 * KU, it1 = u1 * KU;  // global k-block indices (tile * KB + kb)

    u64 policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));

    // Weights in 16-byte units: (64-row tile, k block) = 288 units: codes [h][thread], then scales [quad].
    const long long rstride = (long long)KB * 288;
    int lkb = it0 % KB;
    const q4wg_u32x4 *wp = (const q4wg_u32x4 *)a.w + ((long long)((it0 / KB) * WGS + wg) * R * KB + lkb) * 288;
    const int cofs = t128, sofs = 256 + (t128 >> 2);

    int akb = lkb;
    const signed char *xb = (const signed char *)a.xb;
    const long long ldxb = a.ldx * 2;
    q4wg_stage<NT, THREADS, 2 * P>(s0, xb + akb * 256, ldxb, a.M, tid);
    q4wg_cp_commit();
    akb = akb + P == KB ? 0 : akb + P;
    q4wg_u32x4 wq[P][R][3];
    #pragma unroll
    for (int p = 0; p < P; p++)
        #pragma unroll
        for (int r = 0; r < R; r++) {
            const q4wg_u32x4 *q = wp + r * rstride + p * 288;
            wq[p][r][0] = q4wg_ldg(q + cofs, policy);
            wq[p][r][1] = q4wg_ldg(q + 128 + cofs, policy);
            wq[p][r][2] = q4wg_ldg(q + sofs, policy);
        }
    wp += P * 288;
    lkb += P;
    if (lkb == KB) lkb = 0, wp += (WGS * R - 1) * rstride;

    float acc[R][NREG];
    #pragma unroll
    for (int r = 0; r < R; r++)
        #pragma unroll
        for (int i = 0; i < NREG; i++) acc[r][i] = 0.0f;

    int ct = it0 / KB, ckb = it0 % KB;
    const u64 desc0 = q4wg_desc(s0);
    u32 cst = 0, pst = 1;
    for (int it = it0; it < it1; it += P) {
        const bool more = it + P < it1;
        q4wg_cp_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (more) q4wg_stage<NT, THREADS, 2 * P>(s0 + pst * GSTAGE, xb + akb * 256, ldxb, a.M, tid);
        q4wg_cp_commit();
        akb = akb + P == KB ? 0 : akb + P;
        pst = pst + 1 == SG ? 0 : pst + 1;
        const u64 dg = desc0 + cst * (GSTAGE >> 4);
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
                    const u32 sp0 = q4wg_nv_scale(w0), sp1 = q4wg_nv_scale(q4wg_rotl(w0, 8));
                    const u32 sp2 = q4wg_nv_scale(w1), sp3 = q4wg_nv_scale(q4wg_rotl(w1, 8));
                    q4wg_nv_step(v.x, sp0, A[r][0]);
                    q4wg_nv_step(v.y, sp1, A[r][1]);
                    q4wg_nv_step(v.z, sp2, A[r][2]);
                    q4wg_nv_step(v.w, sp3, A[r][3]);
                }
                if (hh == 1 && more)
                    #pragma unroll
                    for (int r = 0; r < R; r++) {
                        const q4wg_u32x4 *q = wp + r * rstride + p * 288;
                        wq[p][r][0] = q4wg_ldg(q + cofs, policy);
                        wq[p][r][1] = q4wg_ldg(q + 128 + cofs, policy);
                        wq[p][r][2] = q4wg_ldg(q + sofs, policy);
                    }
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
                const u64 d0 = dg + ((2 * p + hh) * KSTAGE >> 4);
                #pragma unroll
                for (int s = 0; s < 4; s++)
                    #pragma unroll
                    for (int r = 0; r < R; r++) q4wg_mma_bf16<NT>(acc[r], A[r][s][0], A[r][s][1], A[r][s][2], A[r][s][3], d0 + s * 2);
                asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                if (p + 1 < P || hh == 0) q4wg_wgmma_wait_f<WAITH, R, NREG>(acc);
            }
        }
        q4wg_wgmma_wait_f<SG - 2>(acc);
        wp += P * 288;
        lkb += P;
        if (lkb == KB) lkb = 0, wp += (WGS * R - 1) * rstride;
        ckb += P;
        if (ckb % KU == 0) {
            // ---- the chunk (ct, ckb / KU - 1) is complete: fold or publish it ----
            q4wg_wgmma_wait_f<0>(acc);
            bool store = true;
            if (ks > 1) {
                const int chunk = ckb / KU - 1;
                const long long tstride = (long long)NT * TF;
                float *wsp = a.wsf + (long long)ct * ks * tstride + (wg * R) * NREG * 128 + t128;
                #pragma unroll
                for (int r = 0; r < R; r++)
                    #pragma unroll
                    for (int i = 0; i < NREG; i++) __stcg(wsp + chunk * tstride + (r * NREG + i) * 128, acc[r][i]);
                __threadfence();
                __syncthreads();
                if (tid == 0) {
                    const int old = atomicAdd(a.cnt + ct, 1);
                    last_flag = old == ks - 1;
                }
                __syncthreads();
                store = last_flag != 0;
                if (store) {
                    __threadfence();
                    // fold the chunks left to right: (((c0 + c1) + c2) + ...), four chunks' loads in flight at a time
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
                const int warp = t128 >> 5, g = (tid & 31) >> 2, tq = tid & 3;
                #pragma unroll
                for (int r = 0; r < R; r++) {
                    const int f = ct * TF + (wg * R + r) * 64 + warp * 16 + g;
                    const float sw0 = a.s_w[f], sw1 = a.s_w[f + 8];
                    #pragma unroll
                    for (int j = 0; j < NT / 8; j++) {
                        const int m = 8 * j + 2 * tq;
                        if (m < a.M) {
                            const float sx = a.s_x[m];
                            float *yr = a.y + (long long)m * a.ldy + f;
                            yr[0] = __fmul_rn(__fmul_rn(__fmul_rn(acc[r][4 * j], 0x1p20f), sx), sw0);
                            yr[8] = __fmul_rn(__fmul_rn(__fmul_rn(acc[r][4 * j + 2], 0x1p20f), sx), sw1);
                        }
                        if (m + 1 < a.M) {
                            const float sx = a.s_x[m + 1];
                            float *yr = a.y + (long long)(m + 1) * a.ldy + f;
                            yr[0] = __fmul_rn(__fmul_rn(__fmul_rn(acc[r][4 * j + 1], 0x1p20f), sx), sw0);
                            yr[8] = __fmul_rn(__fmul_rn(__fmul_rn(acc[r][4 * j + 3], 0x1p20f), sx), sw1);
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
#endif
}

#endif  // Q4WG_CUH
