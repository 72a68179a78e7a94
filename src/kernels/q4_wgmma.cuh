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
 * Schedule: stream-K over (CTA tile of TF = 64 WGS R features) x (k blocks of 128), cut into groups of P k blocks;
 * CTA c gets a contiguous run of groups. A segment that covers a whole tile writes y directly; partial segments
 * red.add their int32 sums into ws (layout = the accumulator layout, coalesced) and count k blocks in cnt[tile];
 * the CTA that completes the count reads the sums back, zeroes ws and cnt (self-cleaning: ws / cnt must be zero
 * before the first launch) and runs the epilogue. Integer sums: any split or order gives the same bits.
 *
 * The module (dllm__module_q4wg) is compiled for sm_90a only; q4wg_args is the host/kernel contract's
 * (DLLM__Q4WG_ARGS_FIELDS), y is bf16 (the layer linears' outputs), rounded as the INT8 path's epilogue rounds it.
 */

#define Q4WG_INT4 1  // dllm__q4_format DLLM__Q4_INT4 (SoloQ-I): C = 2q + 1
#define Q4WG_RTN 4   // dllm__q4_format DLLM__Q4_RTN: C = q

__device__ __forceinline__ u32 q4wg_smem_u32(const void *p) { return (u32)__cvta_generic_to_shared(p); }

/* B descriptor, K-major, 128-byte swizzle (dllm__src_hopper's wg_desc): rows of 128 bytes (128 int8 k values of
 * one token), 8-row atoms 1024 bytes apart; a k32 step is +32 bytes of the start address. */
__device__ __forceinline__ u64 q4wg_desc(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(1024 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

/* d (64 x NT s32, accumulator layout) += A (64 x 32 s8, registers a0..a3) . B (NT x 32 s8, shared, K-major)^T */
template <int NT> __device__ __forceinline__ void q4wg_mma(int (&d)[NT / 2], u32 a0, u32 a1, u32 a2, u32 a3, u64 desc) {
    if constexpr (NT == 32)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
                     ", {%16, %17, %18, %19}, %20, p;\n}\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                       "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]),
                       "+r"(d[15])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    else if constexpr (NT == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
                     ", {%32, %33, %34, %35}, %36, p;\n}\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                       "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]),
                       "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]),
                       "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]),
                       "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
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
                       "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]),
                       "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]),
                       "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]),
                       "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]),
                       "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]),
                       "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]),
                       "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]),
                       "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
    else if constexpr (NT == 256)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
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
              "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]),
              "+r"(d[103]), "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]),
              "+r"(d[110]), "+r"(d[111]), "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]),
              "+r"(d[117]), "+r"(d[118]), "+r"(d[119]), "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]),
              "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
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
    const u32 s0 = (q4wg_smem_u32(q4wg_smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid >> 7, t128 = tid & 127;
    const int KB = a.K >> 7, tiles = a.N / TF, groups = tiles * (KB / P);
    const int g0 = (int)((long long)blockIdx.x * groups / gridDim.x),
              g1 = (int)((long long)(blockIdx.x + 1) * groups / gridDim.x);
    if (g0 >= g1) return;
    const int it0 = g0 * P, it1 = g1 * P;

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
    u32 cst = 0, pst = 1;             // the stage the group computes from / the next group's copy goes to
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
                for (int r = 0; r < R; r++)
                    q4wg_mma<NT>(acc[r], A[r][s][0], A[r][s][1], A[r][s][2], A[r][s][3], d0 + s * 2);
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            // The next k block's A registers are written while this one's wgmmas run (ptxas keeps both sets live);
            // NT = 256 (128 accumulator registers) has no room for two sets and waits here.
            if (p + 1 < P) q4wg_wgmma_wait<NT >= 256 ? 0 : 1>(acc);
        }
        q4wg_wgmma_wait<SG - 2>(acc);
        wp += P * 256;
        lkb += P;
        if (lkb == KB) lkb = 0, wp += (WGS * R - 1) * rstride;
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
