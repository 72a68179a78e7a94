/* [row-independent GEMM] gemm_splitk: Y [M x N] (bf16) = X [M x K] . W [N x K]^T for BF16 operands on Hopper's
 * wgmma (sm_90a), fast at a few rows and the same bits for a row whatever the other rows are. Twin: dllm__cpu_gemm's
 * products (fp32 sums; the GPU's order differs, so its tests compare within a bound and check the bits against
 * themselves across row counts).
 *
 * Transposed product, as q4wg: the weights are wgmma's A operand (64 output features a consumer warpgroup, 128 a CTA)
 * and the tokens its N (NT = 32, 64, 128 or 256), so that 32 tokens cost a 64 x 32 x 16 product, not the 128-row
 * tile gemm_wg computes whatever M is. Both operands arrive by TMA in 64-wide k-steps (128-byte swizzle, K-major).
 *
 * Split-K fixed by the shape: K is cut into `splits` equal ranges (the host picks splits from N, K and the GPU's SM
 * count, never from M), and every output is
 *     ((p_0 + p_1) + p_2) + ...,   p_s = the wgmma k16 products of split s, in k order, from zero
 * however it is computed. SPREAD (few tokens: one token tile) spreads a tile's splits over CTAs: a unit is (feature
 * tile, split), it writes p_s to ws (the accumulator layout, coalesced) and counts itself in cnt[tile]; the unit
 * that completes the count reads p_0, p_1, ... back in split order and stores their sum, whichever unit is last.
 * Otherwise (many tokens, where ws would cost as much memory traffic as the weights) a unit is (feature tile, token
 * tile) and computes its splits one after the other, adding each p_s to the sum as it completes. Either way a row's
 * bits depend on (N, K, splits) alone, never on M, NT, the mode or timing (gpu_splitk.* checks it). cnt is left
 * zero; ws needs no clearing. A CTA walks units blockIdx.x, + gridDim.x, ...; token tiles vary fastest, so that the
 * CTAs running at once share their weight tiles in L2.
 */

struct gemm_splitk_maps {
    tensor_map x, w;
};  // boxes of 64 columns x: NT rows (x), 128 rows (w)

/* d (64 x 32, accumulators) = (accumulate ? d : 0) + A (64 x 16, shared) . B (32 x 16, shared, K-major)^T: wgmma_ss
 * for NT = 32, which the attention and gemm_wg never need. */
__device__ __forceinline__ void splitk_mma32(float (&d)[4][4], u64 desc_a, u64 desc_b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC8(d, 0), WG_ACC8(d, 1), WG_ACC8(d, 2), WG_ACC8(d, 3)
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
template <int NT> __device__ __forceinline__ void splitk_mma(float (&d)[NT / 8][4], u64 a, u64 b, int accumulate) {
    if constexpr (NT == 32)
        splitk_mma32(d, a, b, accumulate);
    else
        wgmma_ss<NT>(d, a, b, accumulate);
}

/* The j-th unit of this CTA: its feature tile, split (SPREAD) or token tile (otherwise). */
struct splitk_unit {
    int tile, split, tok;
};
template <int NT, bool SPREAD>
__device__ __forceinline__ splitk_unit splitk_unit_of(int j, const gemm_splitk_args &a) {
    const int u = blockIdx.x + j * gridDim.x, tt = (a.m + NT - 1) / NT;
    if (SPREAD) return {u / a.splits, u % a.splits, 0};
    return {u / tt, 0, u % tt};
}

/* The producer's one thread: for each k-step of each unit, the weight box (128 features) and the token box (NT rows,
 * zeros past M) into the next slot of the ring. The first NS weight boxes go out before griddepcontrol.wait (weights
 * never depend on the previous kernel), the tokens after it. */
template <int NS, int NT, bool SPREAD>
__device__ __forceinline__ void splitk_produce(const gemm_splitk_args &a, const gemm_splitk_maps &tm, u32 s0, u32 full,
                                               u32 empty, int units, int unit_steps) {
    constexpr u32 W_BYTES = 128 * 128, STAGE = W_BYTES + NT * 128;
    const int jobs = units * unit_steps;
    auto load_w = [&](int j) {
        const splitk_unit u = splitk_unit_of<NT, SPREAD>(j / unit_steps, a);
        tma_load(s0 + (j % NS) * STAGE, tm.w, (u.split * unit_steps + j % unit_steps) * 64, u.tile * 128, 0,
                 full + (j % NS) * 8);
    };
    auto load_x = [&](int j) {
        const splitk_unit u = splitk_unit_of<NT, SPREAD>(j / unit_steps, a);
        tma_load(s0 + (j % NS) * STAGE + W_BYTES, tm.x, (u.split * unit_steps + j % unit_steps) * 64, u.tok * NT, 0,
                 full + (j % NS) * 8);
    };
    const int first = min(NS, jobs);
    for (int j = 0; j < first; j++) {
        mbar_expect_tx(full + j * 8, STAGE);
        load_w(j);
    }
    pdl_enter();
    for (int j = 0; j < first; j++) load_x(j);
    for (int j = NS; j < jobs; j++) {
        const int slot = j % NS;
        mbar_wait(empty + slot * 8, (j / NS + 1) & 1);
        mbar_expect_tx(full + slot * 8, STAGE);
        load_w(j);
        load_x(j);
    }
}

/* A consumer warpgroup's 64 x NT accumulators (features f0 + rows, tokens m0 + columns) to Y, rounded once. */
template <int NT>
__device__ __forceinline__ void splitk_store(const gemm_splitk_args &a, const float (&acc)[NT / 8][4], int f0, int m0) {
    const int t128 = threadIdx.x & 127, warp = t128 >> 5, g = (t128 & 31) >> 2, tq = t128 & 3;
    const int f = f0 + warp * 16 + g;
#pragma unroll
    for (int j = 0; j < NT / 8; j++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int m = m0 + 8 * j + 2 * tq + c;
            if (m < a.m) {
                a.y[(long long)m * a.n + f] = f32_to_bf16(acc[j][c]);
                a.y[(long long)m * a.n + f + 8] = f32_to_bf16(acc[j][2 + c]);
            }
        }
}

/* SPREAD's end of a unit: the partial to ws, counted in cnt[tile]; the unit that completes the count replaces acc by
 * the ordered sum of every split's partial and returns true. Named barrier 1 joins the two consumer warpgroups (the
 * producer warp takes no part). */
template <int NT>
__device__ __forceinline__ bool splitk_reduce(const gemm_splitk_args &a, float (&acc)[NT / 8][4], splitk_unit u,
                                              int *last) {
    constexpr int TILE = 256 * (NT / 2);  // floats of one tile's partial (both warpgroups)
    const int tid = threadIdx.x;
    float *mine = a.ws + ((long long)u.tile * a.splits + u.split) * TILE + tid;
#pragma unroll
    for (int j = 0; j < NT / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) __stcg(mine + (4 * j + e) * 256, acc[j][e]);
    __threadfence();
    named_bar_sync(1, 256);
    if (tid == 0) *last = atomicAdd(a.cnt + u.tile, 1) == a.splits - 1;
    named_bar_sync(1, 256);
    if (!*last) return false;
    __threadfence();
    const float *part = a.ws + (long long)u.tile * a.splits * TILE + tid;
#pragma unroll
    for (int j = 0; j < NT / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = __ldcg(part + (4 * j + e) * 256);
    for (int s = 1; s < a.splits; s++)
#pragma unroll
        for (int j = 0; j < NT / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][e] += __ldcg(part + (long long)s * TILE + (4 * j + e) * 256);
    if (tid == 0) a.cnt[u.tile] = 0;
    return true;
}

/* The consumer warpgroups. Per k-step four k16 products, the previous step's awaited and its slot released; a split
 * starts from zero (into part after the first, added to acc when its last step is done). */
template <int NS, int NT, bool SPREAD>
__device__ __forceinline__ void splitk_consume(const gemm_splitk_args &a, u32 s0, u32 full, u32 empty, int units,
                                               int steps, int *last) {
    constexpr u32 W_BYTES = 128 * 128, STAGE = W_BYTES + NT * 128;
    const int wg = threadIdx.x >> 7;
    auto release = [&](int j) {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) mbar_arrive(empty + (j % NS) * 8);
    };
    auto mma = [](float (&d)[NT / 8][4], u64 desc_a, u64 desc_b, int accumulate) {
        splitk_mma<NT>(d, desc_a, desc_b, accumulate);
    };
    int j = 0;  // ring stages consumed so far
    float acc[NT / 8][4];
    for (int i = 0; i < units; i++) {
        const splitk_unit u = splitk_unit_of<NT, SPREAD>(i, a);
        wg_ring_run<NS, STAGE, W_BYTES>(acc, s0, full, j, steps, mma, release);
        if (SPREAD) {
            if (a.splits > 1 && !splitk_reduce<NT>(a, acc, u, last)) continue;
        } else {
            for (int s = 1; s < a.splits; s++) {
                float part[NT / 8][4];
                wg_ring_run<NS, STAGE, W_BYTES>(part, s0, full, j, steps, mma, release);
#pragma unroll
                for (int jj = 0; jj < NT / 8; jj++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[jj][e] += part[jj][e];
            }
        }
        splitk_store<NT>(a, acc, u.tile * 128 + wg * 64, u.tok * NT);
    }
}

/* NS ring slots of a weight box and a token box; NT tokens a tile; SPREAD: see above (the host passes a.m <= NT). */
template <int NS, int NT, bool SPREAD>
__global__ void __launch_bounds__(384, 1) gemm_splitk(gemm_splitk_args a, const __grid_constant__ gemm_splitk_maps tm) {
    constexpr u32 STAGE = 128 * 128 + NT * 128;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int last;
    const u32 s0 = (smem_u32(smem) + 1023) & ~1023u, full = s0 + NS * STAGE, empty = full + NS * 8;
    const int steps = a.k / 64 / a.splits, tt = (a.m + NT - 1) / NT;
    const int total = a.n / 128 * (SPREAD ? a.splits : tt), unit_steps = SPREAD ? steps : steps * a.splits;
    const int units = (int)blockIdx.x < total ? (total - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x : 0;
    if (threadIdx.x == 256) {
        for (int s = 0; s < NS; s++) {
            mbar_init(full + s * 8, 1);
            mbar_init(empty + s * 8, 8);  // lane 0 of each consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x >= 256) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x == 256) splitk_produce<NS, NT, SPREAD>(a, tm, s0, full, empty, units, unit_steps);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    splitk_consume<NS, NT, SPREAD>(a, s0, full, empty, units, steps, &last);
}
