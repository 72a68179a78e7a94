/* [row-independent GEMM] gemm_splitk: Y [M x N] (bf16) = X [M x K] . W [N x K]^T for BF16 operands on Hopper's
 * wgmma (sm_90a), fast at a few rows and the same bits for a row whatever the other rows are. Twin: dllm__cpu_gemm's
 * products (fp32 sums; the GPU's order differs, so its tests compare within a bound and check the bits against
 * themselves across row counts).
 *
 * Transposed product, as q4wg: the weights are wgmma's A operand (64 output features a consumer warpgroup, 128 a CTA)
 * and the tokens its N (NT = 32, 64, 128 or 256), so that 32 tokens cost a 64 x 32 x 16 product, not the 128-row
 * tile gemm_wg computes whatever M is. Both operands arrive by TMA in 64-wide k-steps (128-byte swizzle, K-major).
 *
 * A stream-K cut fixed by the shape: a tile's K is `chunks` chunks of `chunk` 64-wide k-steps, and the chunks of all
 * tiles, laid end to end (W = tiles x chunks), are cut into `ctas` equal ranges (the host picks chunk from K and ctas
 * from the GPU's SM count, never from M). The ranges cut a tile's K into pieces, and every output is
 *     ((p_0 + p_1) + p_2) + ...,   p_i = the wgmma k16 products of piece i, in k order, from zero
 * however it is computed. SPREAD (few tokens: one token tile) runs one CTA a range: it computes its pieces in turn, and
 * a piece of a tile cut in several writes p_i to ws (the accumulator layout, coalesced) and counts itself in cnt[tile];
 * the CTA that completes the count reads p_0, p_1, ... back in order and stores their sum, whichever CTA is last.
 * Otherwise (many tokens, where ws would cost as much memory traffic as the weights) a unit is (feature tile, token
 * tile) and computes the tile's pieces one after the other, adding each p_i to the sum as it completes. Either way a
 * row's bits depend on (N, K, the cut) alone, never on M, NT, the mode or timing (gpu_splitk.* checks it). cnt is left
 * zero; ws needs no clearing. In the other mode a CTA walks units blockIdx.x, + gridDim.x, ...; token tiles vary
 * fastest, so that the CTAs running at once share their weight tiles in L2. */

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

/* The cut (see above): range c covers chunks [splitk_cut_start(c), splitk_cut_start(c + 1)); splitk_range_of(x) is the
 * range holding chunk x. A piece of tile t is its part of one range: piece i of t lies in range
 * splitk_range_of(t x chunks) + i. */
__device__ __forceinline__ int splitk_cut_start(const gemm_splitk_args &a, int c) {
    return (int)((long long)c * (a.n / 128 * a.chunks) / a.ctas);
}
__device__ __forceinline__ int splitk_range_of(const gemm_splitk_args &a, int x) {
    const long long w = (long long)(a.n / 128) * a.chunks;
    return (int)(((long long)(x + 1) * a.ctas + w - 1) / w) - 1;
}

/* Walks the pieces of a tile (the other mode) or of this CTA's range (SPREAD): tile, first chunk, chunk count and
 * index among the tile's pieces of each in turn. */
struct splitk_piece {
    int tile, x0, n, index, of;  // of: how many pieces the tile has
};
__device__ __forceinline__ splitk_piece splitk_piece_at(const gemm_splitk_args &a, int x, int end) {
    const int t = x / a.chunks, first = splitk_range_of(a, t * a.chunks), r = splitk_range_of(a, x);
    const int stop = min(min(end, (t + 1) * a.chunks), splitk_cut_start(a, r + 1));
    return {t, x, stop - x, r - first, splitk_range_of(a, (t + 1) * a.chunks - 1) - first + 1};
}

/* The j-th unit of this CTA in the other mode: its feature tile and token tile. */
struct splitk_unit {
    int tile, tok;
};
template <int NT> __device__ __forceinline__ splitk_unit splitk_unit_of(int j, const gemm_splitk_args &a) {
    const int u = blockIdx.x + j * gridDim.x, tt = (a.m + NT - 1) / NT;
    return {u / tt, u % tt};
}

/* The producer's one thread: for each k-step of this CTA's work (SPREAD: its range's chunks; otherwise every k-step of
 * each of its units), the weight box (128 features) and the token box (NT rows, zeros past M) into the next slot of
 * the ring. The first NS weight boxes go out before griddepcontrol.wait (weights never depend on the previous kernel),
 * the tokens after it. A cursor advances one k-step a stage: no division in the loop. */
template <int NS, int NT, bool SPREAD>
__device__ __forceinline__ void splitk_produce(const gemm_splitk_args &a, const gemm_splitk_maps &tm, u32 s0, u32 full,
                                               u32 empty, int units) {
    constexpr u32 W_BYTES = 128 * 128, STAGE = W_BYTES + NT * 128;
    const int steps = a.chunks * a.chunk;  // a tile's k-steps
    int jobs, tile, tok = 0, k, unit = 0;
    if (SPREAD) {
        const int x0 = splitk_cut_start(a, blockIdx.x);
        jobs = (splitk_cut_start(a, blockIdx.x + 1) - x0) * a.chunk;
        tile = x0 / a.chunks, k = x0 % a.chunks * a.chunk;
    } else {
        jobs = units * steps;
        const splitk_unit u = splitk_unit_of<NT>(0, a);
        tile = u.tile, tok = u.tok, k = 0;
    }
    auto next = [&] {  // the cursor to the following k-step
        if (++k < steps) return;
        k = 0;
        if (SPREAD) {
            tile++;
        } else {
            const splitk_unit u = splitk_unit_of<NT>(++unit, a);
            tile = u.tile, tok = u.tok;
        }
    };
    auto load_w = [&](int j) {
        tma_load(s0 + (j % NS) * STAGE, tm.w, k * 64, tile * 128, 0, full + (j % NS) * 8);
    };
    auto load_x = [&](int j) {
        tma_load(s0 + (j % NS) * STAGE + W_BYTES, tm.x, k * 64, tok * NT, 0, full + (j % NS) * 8);
    };
    const int first = min(NS, jobs);
    const int tile0 = tile, tok0 = tok, k0 = k, unit0 = unit;
    for (int j = 0; j < first; j++, next()) {
        mbar_expect_tx(full + j * 8, STAGE);
        load_w(j);
    }
    pdl_enter();
    tile = tile0, tok = tok0, k = k0, unit = unit0;
    for (int j = 0; j < first; j++, next()) load_x(j);
    for (int j = NS; j < jobs; j++, next()) {
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

/* SPREAD's end of a piece of a tile cut in several: the partial to ws, counted in cnt[tile]; the CTA that completes the
 * count replaces acc by the ordered sum of every piece's partial and returns true. Named barrier 1 joins the two
 * consumer warpgroups (the producer warp takes no part). */
template <int NT>
__device__ __forceinline__ bool splitk_reduce(const gemm_splitk_args &a, float (&acc)[NT / 8][4], splitk_piece p,
                                              int *last) {
    constexpr int TILE = 256 * (NT / 2);  // floats of one tile's partial (both warpgroups)
    const int tid = threadIdx.x;
    float *mine = a.ws + ((long long)p.tile * a.max_pieces + p.index) * TILE + tid;
#pragma unroll
    for (int j = 0; j < NT / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) __stcg(mine + (4 * j + e) * 256, acc[j][e]);
    __threadfence();
    named_bar_sync(1, 256);
    if (tid == 0) *last = atomicAdd(a.cnt + p.tile, 1) == p.of - 1;
    named_bar_sync(1, 256);
    if (!*last) return false;
    __threadfence();
    const float *part = a.ws + (long long)p.tile * a.max_pieces * TILE + tid;
#pragma unroll
    for (int j = 0; j < NT / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = __ldcg(part + (4 * j + e) * 256);
    for (int i = 1; i < p.of; i++)
#pragma unroll
        for (int j = 0; j < NT / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][e] += __ldcg(part + (long long)i * TILE + (4 * j + e) * 256);
    if (tid == 0) a.cnt[p.tile] = 0;
    return true;
}

/* The consumer warpgroups. Per k-step four k16 products, the previous step's awaited and its slot released; a piece
 * starts from zero (into part after a tile's first, added to acc when its last step is done). */
template <int NS, int NT, bool SPREAD>
__device__ __forceinline__ void splitk_consume(const gemm_splitk_args &a, u32 s0, u32 full, u32 empty, int units,
                                               int *last) {
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
    if (SPREAD) {
        const int end = splitk_cut_start(a, blockIdx.x + 1);
        for (int x = splitk_cut_start(a, blockIdx.x); x < end;) {
            const splitk_piece p = splitk_piece_at(a, x, end);
            x += p.n;
            wg_ring_run<NS, STAGE, W_BYTES>(acc, s0, full, j, p.n * a.chunk, mma, release);
            if (p.of > 1 && !splitk_reduce<NT>(a, acc, p, last)) continue;
            splitk_store<NT>(a, acc, p.tile * 128 + wg * 64, 0);
        }
    } else {
        for (int i = 0; i < units; i++) {
            const splitk_unit u = splitk_unit_of<NT>(i, a);
            const int end = (u.tile + 1) * a.chunks;
            splitk_piece p = splitk_piece_at(a, u.tile * a.chunks, end);
            wg_ring_run<NS, STAGE, W_BYTES>(acc, s0, full, j, p.n * a.chunk, mma, release);
            for (int x = p.x0 + p.n; x < end; x += p.n) {
                p = splitk_piece_at(a, x, end);
                float part[NT / 8][4];
                wg_ring_run<NS, STAGE, W_BYTES>(part, s0, full, j, p.n * a.chunk, mma, release);
#pragma unroll
                for (int jj = 0; jj < NT / 8; jj++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[jj][e] += part[jj][e];
            }
            splitk_store<NT>(a, acc, u.tile * 128 + wg * 64, u.tok * NT);
        }
    }
}

/* NS ring slots of a weight box and a token box; NT tokens a tile; SPREAD: see above (the host passes a.m <= NT and
 * a.ctas CTAs). */
template <int NS, int NT, bool SPREAD>
__global__ void __launch_bounds__(384, 1) gemm_splitk(gemm_splitk_args a, const __grid_constant__ gemm_splitk_maps tm) {
    constexpr u32 STAGE = 128 * 128 + NT * 128;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int last;
    const u32 s0 = (smem_u32(smem) + 1023) & ~1023u, full = s0 + NS * STAGE, empty = full + NS * 8;
    const int total = SPREAD ? 0 : a.n / 128 * ((a.m + NT - 1) / NT);
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
        if (threadIdx.x == 256) splitk_produce<NS, NT, SPREAD>(a, tm, s0, full, empty, units);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    splitk_consume<NS, NT, SPREAD>(a, s0, full, empty, units, &last);
}
