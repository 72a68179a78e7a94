/* src/kernels/moe.cuh - LLaDA2's kernels (../shared/spec/llada2.md, "Forward"): QK-norm with partial RoPE, the sigmoid
 * router's group-limited top-k, the routes' plan (each expert's rows, built on the device: no host synchronisation, so
 * the forward can be captured in a CUDA graph), the grouped expert GEMM over every expert's rows in one launch, and the
 * weighted sum of a token's experts. Every kernel works row by row: a row's bits never depend on which other rows are
 * in the launch, so an expert's choice and a token's sum do not depend on the other tokens (or sequences) of the
 * forward. Needs MOE_MAX_EXPERTS, MOE_MAX_GROUPS and MOE_TILE_ROWS. */

/* Twin: dllm__cpu_llada2_qkv's QK-norm and RoPE (dllm__cpu_rmsnorm over each Q and K head with the shared head-dim
 * weight, then dllm__cpu_rope on the first rotary_dim dims). In place on the fused projection rows [q heads | k heads |
 * v heads] of rows at positions pos0 + row; the normed values stay fp32 through the rotation (one rounding to bf16, as
 * the CPU's fp32). Null q_norm: no QK-norm (use_qk_norm false). One warp a (row, head): grid x over rows, y over
 * groups of 4 heads (Q and K heads only), 128 threads. */
KERNEL_qk_norm_rope {
    pdl_enter();
    const int row = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y * 4 + warp;
    if (row >= n_rows || head >= n_head + n_kv) return;
    bf16_t *x = qkv + (u64)row * (n_head + 2 * n_kv) * head_dim + (u64)head * head_dim;
    const float *w = head < n_head ? q_norm : k_norm;
    float r = 1.0f;
    if (w) {
        float ss = 0.f;
        for (int k = lane; k < head_dim; k += 32) {
            const float v = bf16_to_f32(x[k]);
            ss += v * v;
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);  // every lane: the same sum
        r = rsqrtf(ss / (float)head_dim + eps);
    }
    __syncwarp();  // every read above precedes every write below
    const int half = rotary_dim >> 1;
    const u64 t0 = (u64)(pos0 + row) * half;
    for (int j = lane; j < half; j += 32) {  // pairs (j, j + half) of the rotated dims
        float x1 = bf16_to_f32(x[j]), x2 = bf16_to_f32(x[j + half]);
        if (w) {
            x1 = (x1 * r) * w[j];
            x2 = (x2 * r) * w[j + half];
        }
        const float c = cos_t[t0 + j], s = sin_t[t0 + j];
        x[j] = f32_to_bf16(x1 * c - x2 * s);
        x[j + half] = f32_to_bf16(x2 * c + x1 * s);
    }
    if (w)
        for (int k = rotary_dim + lane; k < head_dim; k += 32) x[k] = f32_to_bf16((bf16_to_f32(x[k]) * r) * w[k]);
}

/* The largest of a warp's (value, index) candidates, ties to the lower index; NaN never wins. Every lane returns the
 * same pair (the order is total over distinct indices). index INT_MAX: no candidate. */
__device__ __forceinline__ void moe_warp_best(float &value, int &index) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, value, o);
        const int oi = __shfl_xor_sync(0xffffffffu, index, o);
        if (ov > value || (ov == value && oi < index)) value = ov, index = oi;
    }
}

__device__ __forceinline__ float moe_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Twin: dllm__moe_route_token. One warp a row of fp32 router logits: s = sigmoid(logit), routing score s +
 * expert_bias; each group scored by the sum of its top 2 routing scores; the n_group_used best groups (ties to the
 * lower group), then the top_k best experts among them (ties to the lower expert), highest first, into
 * expert[row][0..top_k); their weights the unbiased s normalised by their sum (+1e-20, when top_k > 1), times
 * routed_scale, summed in that order as the CPU sums. A slot left without an expert (NaN scores) holds -1. */
KERNEL_moe_route {
    pdl_enter();
    __shared__ float routing[MOE_MAX_EXPERTS], group_score[MOE_MAX_GROUPS];
    __shared__ unsigned char chosen[MOE_MAX_EXPERTS], group_kept[MOE_MAX_GROUPS];
    __shared__ float picked_s[32];
    const int row = blockIdx.x, lane = threadIdx.x;
    if (row >= n_rows) return;
    const float *lg = logits + (u64)row * n_expert;
    for (int e = lane; e < n_expert; e += 32) {
        routing[e] = moe_sigmoid(lg[e]) + expert_bias[e];
        chosen[e] = 0;
    }
    __syncwarp();
    const int per_group = n_expert / n_group;
    for (int g = lane; g < n_group; g += 32) {
        float b0 = -DLLM_INF, b1 = -DLLM_INF;  // the largest two, a tie counted twice (top-2 by index)
        for (int i = 0; i < per_group; i++) {
            const float v = routing[g * per_group + i];
            if (v > b0)
                b1 = b0, b0 = v;
            else if (v > b1)
                b1 = v;
        }
        group_score[g] = b0 + b1;
        group_kept[g] = 0;
    }
    __syncwarp();
    for (int it = 0; it < n_group_used; it++) {
        float bv = -DLLM_INF;
        int bi = 0x7fffffff;
        for (int g = lane; g < n_group; g += 32)
            if (!group_kept[g] && (group_score[g] > bv || (group_score[g] == bv && g < bi)))
                bv = group_score[g], bi = g;
        moe_warp_best(bv, bi);
        __syncwarp();
        if (lane == 0 && bi < n_group) group_kept[bi] = 1;
        __syncwarp();
    }
    for (int it = 0; it < top_k; it++) {
        float bv = -DLLM_INF;
        int bi = 0x7fffffff;
        for (int e = lane; e < n_expert; e += 32)
            if (group_kept[e / per_group] && !chosen[e] && (routing[e] > bv || (routing[e] == bv && e < bi)))
                bv = routing[e], bi = e;
        moe_warp_best(bv, bi);
        __syncwarp();
        if (lane == 0) {
            const bool found = bi < n_expert;
            if (found) chosen[bi] = 1;
            expert[(u64)row * top_k + it] = found ? bi : -1;
            picked_s[it] = found ? moe_sigmoid(lg[bi]) : 0.f;
        }
        __syncwarp();
    }
    if (lane == 0) {
        float sum = 0.f;
        for (int it = 0; it < top_k; it++) sum += picked_s[it];
        for (int it = 0; it < top_k; it++)
            weight[(u64)row * top_k + it] = (top_k > 1 ? picked_s[it] / (sum + 1e-20f) : picked_s[it]) * routed_scale;
    }
}

/* Twin: dllm__moe_plan_ref. Where each slot (token t, choice j; slot i = t * top_k + j) goes: expert e's slots, in slot
 * order (token by token, as the CPU's slots_of), in the rows [first_row[e], first_row[e + 1]) with no padding, and its
 * row tiles (MOE_TILE_ROWS rows each, the last one short) numbered [tile_first[e], tile_first[e + 1]); row_token[row]
 * the token a row holds, slot_row[i] slot i's row (-1 for a slot without an expert, which adds nothing). One CTA of
 * 256 threads: counts, a scan by warp 0, then the slots a chunk of 256 at a time, a slot's rank inside its chunk
 * counted over the chunk's earlier slots, so the order is the slots' whatever the timing. */
KERNEL_moe_plan {
    pdl_enter();
    __shared__ int count[MOE_MAX_EXPERTS], next[MOE_MAX_EXPERTS], chunk_expert[256];
    const int tid = threadIdx.x, lane = tid & 31;
    for (int e = tid; e < n_expert; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int i = tid; i < n_slots; i += blockDim.x) {
        const int e = expert[i];
        if (e >= 0 && e < n_expert) atomicAdd(&count[e], 1);
    }
    __syncthreads();
    if (tid < 32) {  // warp 0: exclusive scans of the rows and the tiles, each lane over a contiguous run of experts
        const int per_lane = (n_expert + 31) / 32, e0 = min(lane * per_lane, n_expert),
                  e1 = min(e0 + per_lane, n_expert);
        int rows = 0, tiles = 0;
        for (int e = e0; e < e1; e++) rows += count[e], tiles += (count[e] + MOE_TILE_ROWS - 1) / MOE_TILE_ROWS;
        int row_before = rows, tile_before = tiles;  // inclusive scans, then made exclusive
        for (int o = 1; o < 32; o <<= 1) {
            const int r = __shfl_up_sync(0xffffffffu, row_before, o), t = __shfl_up_sync(0xffffffffu, tile_before, o);
            if (lane >= o) row_before += r, tile_before += t;
        }
        row_before -= rows, tile_before -= tiles;
        for (int e = e0; e < e1; e++) {
            first_row[e] = row_before, tile_first[e] = tile_before, next[e] = row_before;
            row_before += count[e], tile_before += (count[e] + MOE_TILE_ROWS - 1) / MOE_TILE_ROWS;
        }
        if (lane == 31) first_row[n_expert] = row_before, tile_first[n_expert] = tile_before;
    }
    __syncthreads();
    for (int base = 0; base < n_slots; base += 256) {
        const int i = base + tid;
        int e = i < n_slots && tid < 256 ? expert[i] : -1;
        if (e >= n_expert) e = -1;
        if (tid < 256) chunk_expert[tid] = e;
        __syncthreads();
        if (e >= 0) {
            int rank = 0;
            for (int j = 0; j < tid; j++) rank += chunk_expert[j] == e;
            const int row = next[e] + rank;
            row_token[row] = i / top_k;
            slot_row[i] = row;
        } else if (i < n_slots && tid < 256) {
            slot_row[i] = -1;
        }
        __syncthreads();  // every rank read next[] before it moves
        if (e >= 0) atomicAdd(&next[e], 1);
        __syncthreads();
    }
}

/* d (16 x 8, fp32) += a (16 x 16, bf16, row-major fragment) . b (16 x 8, bf16, column fragment). */
__device__ __forceinline__ void moe_mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The weight formats of the grouped GEMM beside q4_dequant's Q4_NVFP4, Q4_INT4, Q4_E8P and Q4_RTN. */
enum { MOE_BF16 = 16, MOE_E4M3 = 17 };

/* Bytes of a weight row of K elements in format WF. */
template <int WF> __device__ __forceinline__ u64 moe_row_bytes(int K) {
    return WF == MOE_E4M3 ? (u64)K : WF == MOE_BF16 ? (u64)K * 2 : (u64)K / 2;
}

/* 8 E4M3 codes (byte i: element i) as 8 bf16 (exact: an E4M3 value has 4 significant bits), low element first. */
__device__ __forceinline__ uint4 moe_e4m3x8(uint2 c, const q4_smem &s) {
    auto pair = [&](u32 w, int i) {
        return (u32)s.e4m3[(w >> (16 * i)) & 255] | (u32)s.e4m3[(w >> (16 * i + 8)) & 255] << 16;
    };
    return make_uint4(pair(c.x, 0), pair(c.x, 1), pair(c.y, 0), pair(c.y, 1));
}

/* The bytes of elements [k, k + 8) of a weight row (at row; NVFP4: its block scales at bs), loaded a k-chunk ahead of
 * their use: 8 bf16 (16 bytes), 8 E4M3 codes (.x, .y), or 8 4-bit codes (.x) and, NVFP4, their block scale (.y). */
template <int WF>
__device__ __forceinline__ uint4 moe_w8_load(const unsigned char *row, const unsigned char *bs, int k, bool ok) {
    if (!ok) return make_uint4(0u, 0u, 0u, 0u);
    if constexpr (WF == MOE_BF16) {
        return __ldg((const uint4 *)(row + (u64)k * 2));
    } else if constexpr (WF == MOE_E4M3) {
        const uint2 c = __ldg((const uint2 *)(row + k));
        return make_uint4(c.x, c.y, 0u, 0u);
    } else {
        return make_uint4(__ldg((const u32 *)(row + k / 2)), WF == Q4_NVFP4 ? (u32)__ldg(bs + k / 16) : 0u, 0u, 0u);
    }
}

/* moe_w8_load's bytes as 8 bf16, low element first: the 4-bit codes decode to their exact C values (q4_dequant), E4M3
 * codes to theirs. Zeros where !ok. */
template <int WF> __device__ __forceinline__ uint4 moe_w8(uint4 raw, bool ok, const q4_smem *s) {
    if (!ok) return make_uint4(0u, 0u, 0u, 0u);
    if constexpr (WF == MOE_BF16) {
        return raw;
    } else if constexpr (WF == MOE_E4M3) {
        return moe_e4m3x8(make_uint2(raw.x, raw.y), *s);
    } else {
        u32 p[4];
        q4_dequant<WF>(raw.x, raw.y, *s, p);
        return make_uint4(p[0], p[1], p[2], p[3]);
    }
}

/* An activation row's 128-wide k-chunk in shared memory: 128 bf16 (BF16, and SoloQ's C values) or 128 E4M3 codes,
 * padded so that the lanes of each phase of a read (rows g, 16 or 8 bytes at element 8t) hit distinct banks. */
template <int WF> struct moe_chunk {
    static constexpr int elem_bytes = WF == MOE_E4M3 ? 1 : 2;
    static constexpr int pieces = 128 * elem_bytes / 16;  // 16-byte copies a row
    static constexpr int stride = 128 * elem_bytes + (WF == MOE_E4M3 ? 32 : 64);
};

/* Elements [k, k + 8) of a row's chunk in shared memory as 8 bf16 (E4M3 codes decoded). */
template <int WF> __device__ __forceinline__ uint4 moe_x8(const unsigned char *chunk_row, int k, const q4_smem *s) {
    if constexpr (WF == MOE_E4M3) return moe_e4m3x8(*(const uint2 *)(chunk_row + k), *s);
    return *(const uint4 *)(chunk_row + k * 2);
}

/* The tables format WF decodes with (q4_dequant's; E4M3: its 256 values), into shared memory. */
template <int WF> __device__ __forceinline__ void moe_load_tables(q4_smem &s) {
    if constexpr (WF == MOE_E4M3)
        for (int i = threadIdx.x; i < 256; i += Q4_THREADS) s.e4m3[i] = q4_e4m3_table[i];
    else
        q4_load_tables<WF>(s);
}

/* Twins: dllm__moe_grouped_gemm_ref (BF16), dllm__moe_grouped_gemm_q4_ref (SoloQ), dllm__moe_grouped_gemm_e4m3_ref
 * (FP8). For every expert e at once, y[row] = x[src(row)] . w[e]^T (w[e] [N][K]) for the rows of e's range (moe_plan's
 * first_row; src(row) = row_src[row], or row when row_src is null), fp32 sums, one rounding to bf16. Grid x over row
 * tiles (a bound: CTAs past tile_first[n_expert] leave at once), y over groups of 64 output features; 4 warps, each 16
 * features of one tile of MOE_TILE_ROWS rows. The weights are mma's A operand and the rows its n8 columns (the
 * transposed product: a decode step gives an expert a row or two). K goes in chunks of 128, pipelined: while a chunk
 * is multiplied, the next chunk's weights travel to registers (each lane its own, straight from global memory: a
 * decode step is bound by the weights' latency, so every byte in flight counts) and the tile's rows of it to shared
 * memory (cp.async, once for the 4 warps). In a 32-wide k-step lane (g, t) holds k [8t, 8t + 8) of feature rows g and
 * g + 8 and of row g of each n8 group as 8 bf16 (16 bytes; a quantised format's codes decoded into them, exactly:
 * moe_w8, moe_x8), the first 8 bytes for the first k16 product and the rest for the second. That pairs logical k with
 * a permuted physical k, the same permutation on both operands, so each product is still a dot product over all of K.
 * Formats:
 *   - BF16: bf16 weights and rows;
 *   - SoloQ (Q4_*): 4-bit weight rows decoded to their C values (NVFP4: times their block scale), the rows' bf16 C
 *     values; the epilogue (acc * x_scale[src]) * w_scale[e][feature], as q4_gemm's. Integer C values (SoloQ-I,
 *     SoloQ-C, RTN) make every partial sum an integer below 2^24, exact in any order: the twin's bits;
 *   - FP8 (MOE_E4M3): E4M3 weight and row codes, each 128-wide k group (one chunk) summed into a fresh accumulator and
 *     promoted as total = fmaf(G, x_scale * w_scale, total), the twin's (and fp8_gemm's) order of the scales.
 * Row independence: an output (row, feature) is one accumulator fed the same k16 products in the same order whatever
 * the tile holds, its expert's row count and the number of tiles; columns of an mma never mix, a row's scales are its
 * own, and the rows past a range's end are zeros never stored. So a token's expert output is the same bits in any
 * batch. K is a multiple of 8 (the host checks; FP8: of 128, the codes padded with zeros); any N. */
template <int WF> __device__ __forceinline__ void moe_gemm_body(const moe_gemm_args &a, q4_smem *tables) {
    using C = moe_chunk<WF>;
    __shared__ alignas(16) unsigned char chunk[2][MOE_TILE_ROWS * C::stride];
    __shared__ int tile_src[MOE_TILE_ROWS];
    pdl_enter();
    const int tile = blockIdx.x, n_expert = a.n_expert, N = a.N, K = a.K;
    const int *first_row = a.first_row, *tile_first = a.tile_first;
    if (tile >= tile_first[n_expert]) return;  // CTA-uniform: before the barriers
    if constexpr (WF != MOE_BF16) moe_load_tables<WF>(*tables);
    int lo = 0, hi = n_expert;  // the last expert whose first tile is at or before this one (it holds it)
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (tile_first[mid] <= tile)
            lo = mid;
        else
            hi = mid;
    }
    const int e = lo, row0 = first_row[e] + (tile - tile_first[e]) * MOE_TILE_ROWS;
    const int n_rows = min(MOE_TILE_ROWS, first_row[e + 1] - row0), rows8 = (n_rows + 7) & ~7;
    for (int r = threadIdx.x; r < MOE_TILE_ROWS; r += blockDim.x)
        tile_src[r] = r < n_rows ? (a.row_src ? a.row_src[row0 + r] : row0 + r) : 0;
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int f0 = blockIdx.y * 64 + warp * 16;
    const bool live = f0 < N;              // a warp past N still copies the rows and meets the barriers
    constexpr int NT = MOE_TILE_ROWS / 8;  // n8 groups of rows
    constexpr bool fp8 = WF == MOE_E4M3, q4 = WF != MOE_BF16 && WF != MOE_E4M3;
    const u64 w_row = moe_row_bytes<WF>(K), x_row = (u64)a.x_ld * C::elem_bytes;
    const unsigned char *W = (const unsigned char *)a.w[e], *x = (const unsigned char *)a.x;
    const bool fa = live && f0 + g < N, fb = live && f0 + g + 8 < N;
    const unsigned char *wa = W + (fa ? f0 + g : 0) * w_row, *wb = W + (fb ? f0 + g + 8 : 0) * w_row;
    const unsigned char *bsa = nullptr, *bsb = nullptr;  // NVFP4: the two rows' block scales
    if constexpr (WF == Q4_NVFP4) {
        const u64 blocks = (u64)(K + 15) / 16;
        bsa = a.w_block_scales[e] + (fa ? f0 + g : 0) * blocks;
        bsb = a.w_block_scales[e] + (fb ? f0 + g + 8 : 0) * blocks;
    }
    auto copy_rows = [&](int buf, int k0) {  // the tile's rows of chunk k0 (zeros past n_rows and past K)
        for (int i = threadIdx.x; i < rows8 * C::pieces; i += blockDim.x) {
            const int r = i / C::pieces, p = i % C::pieces, k = k0 + p * (16 / C::elem_bytes);
            const bool ok = r < n_rows && k < K;
            cp_async16(smem_u32(chunk[buf] + r * C::stride + p * 16),
                       ok ? x + (u64)tile_src[r] * x_row + (u64)k * C::elem_bytes : x, ok);
        }
        cp_async_commit();
    };
    uint4 next_lo[4], next_hi[4];  // the next chunk's weight bytes, in flight while this chunk is multiplied
    auto load_weights = [&](int k0) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int k = k0 + 32 * q + 8 * t;
            next_lo[q] = moe_w8_load<WF>(wa, bsa, k, fa && k < K);
            next_hi[q] = moe_w8_load<WF>(wb, bsb, k, fb && k < K);
        }
    };
    float acc[NT][4], part[NT][4];  // FP8: part is one 128-wide group's sum
    for (int j = 0; j < NT; j++)
        for (int c = 0; c < 4; c++) acc[j][c] = part[j][c] = 0.f;
    float(&sum)[NT][4] = fp8 ? part : acc;
    copy_rows(0, 0);
    load_weights(0);
    for (int k0 = 0, buf = 0; k0 < K; k0 += 128, buf ^= 1) {
        uint4 a_lo[4], a_hi[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int k = k0 + 32 * q + 8 * t;
            a_lo[q] = moe_w8<WF>(next_lo[q], fa && k < K, tables);
            a_hi[q] = moe_w8<WF>(next_hi[q], fb && k < K, tables);
        }
        if (k0 + 128 < K) {
            copy_rows(buf ^ 1, k0 + 128);
            load_weights(k0 + 128);
        } else {
            cp_async_commit();  // an empty group: wait_group 1 below then waits for this chunk's rows
        }
        cp_async_wait<1>();
        __syncthreads();
#pragma unroll
        for (int h = 0; h < 2; h++) {              // each 64-wide half in the order a 64-wide loop would take it
            if (!live || k0 + 64 * h >= K) break;  // warp-uniform: where a 64-wide loop would have stopped
            const uint4 &l0 = a_lo[2 * h], &h0 = a_hi[2 * h], &l1 = a_lo[2 * h + 1], &h1 = a_hi[2 * h + 1];
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (j * 8 >= n_rows) break;  // warp-uniform: no row of this n8 group
                const unsigned char *xr = chunk[buf] + (j * 8 + g) * C::stride;
                const uint4 b0 = moe_x8<WF>(xr, 64 * h + 8 * t, tables),
                            b1 = moe_x8<WF>(xr, 64 * h + 32 + 8 * t, tables);
                moe_mma(sum[j], l0.x, h0.x, l0.y, h0.y, b0.x, b0.y);
                moe_mma(sum[j], l0.z, h0.z, l0.w, h0.w, b0.z, b0.w);
                moe_mma(sum[j], l1.x, h1.x, l1.y, h1.y, b1.x, b1.y);
                moe_mma(sum[j], l1.z, h1.z, l1.w, h1.w, b1.z, b1.w);
            }
        }
        if constexpr (fp8) {  // the group's promotion; the warp's 16 features lie in one 128-row weight block
            const int kg = k0 >> 7;
            const float sw = live ? a.w_scale[e][(u64)(f0 >> 7) * a.w_scale_ld + kg] : 0.f;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (j * 8 >= n_rows) break;
                for (int c = 0; c < 4; c++) {
                    const int r = j * 8 + 2 * t + (c & 1);
                    const float sx = a.x_scale[(u64)kg * a.x_scale_ld + tile_src[r]];
                    acc[j][c] = fmaf(part[j][c], sx * sw, acc[j][c]);
                    part[j][c] = 0.f;
                }
            }
        }
        __syncthreads();  // every warp is done with chunk[buf] before the next iteration refills it
    }
    if (!live) return;
        // accumulator (feature g or g + 8, row 2t or 2t + 1 of the n8 group)
#pragma unroll
    for (int j = 0; j < NT; j++)
        for (int c = 0; c < 4; c++) {
            const int r = j * 8 + 2 * t + (c & 1), f = f0 + g + (c >> 1) * 8;
            if (r >= n_rows || f >= N) continue;
            float v = acc[j][c];
            if constexpr (q4) v = (v * (a.x_scale ? a.x_scale[tile_src[r]] : 1.0f)) * a.w_scale[e][f];
            a.y[(u64)(row0 + r) * N + f] = f32_to_bf16(v);
        }
}

/* BF16 weights and rows (the parameters of the BF16 path, which came first). */
KERNEL_moe_grouped_gemm {
    moe_gemm_args a = {};
    a.x = x, a.row_src = row_src, a.w = (const void *const *)w, a.first_row = first_row, a.tile_first = tile_first;
    a.y = y, a.n_expert = n_expert, a.N = N, a.K = K, a.x_ld = K;
    moe_gemm_body<MOE_BF16>(a, nullptr);
}
/* The quantised formats: the tables in shared memory. */
KERNEL_moe_grouped_gemm_e4m3 {
    __shared__ q4_smem tables;
    moe_gemm_body<MOE_E4M3>(a, &tables);
}
KERNEL_moe_grouped_gemm_nvfp4 {
    __shared__ q4_smem tables;
    moe_gemm_body<Q4_NVFP4>(a, &tables);
}
KERNEL_moe_grouped_gemm_int4 {
    __shared__ q4_smem tables;
    moe_gemm_body<Q4_INT4>(a, &tables);
}
KERNEL_moe_grouped_gemm_e8p {
    __shared__ q4_smem tables;
    moe_gemm_body<Q4_E8P>(a, &tables);
}
KERNEL_moe_grouped_gemm_rtn {
    __shared__ q4_smem tables;
    moe_gemm_body<Q4_RTN>(a, &tables);
}

/* Twin: the final sum of dllm__cpu_moe. out[t] = (sum over slots s in order of weight[t][s] expert_out[slot_row[t][s]])
 * + shared[t] (null: none), fp32 until the one rounding to bf16; a slot_row of -1 adds nothing. Grid dllm__rows_grid:
 * x over 8-column chunks, y over rows. */
KERNEL_moe_combine {
    pdl_enter();
    const int col = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (col >= d) return;
    for (int t = blockIdx.y; t < n_rows; t += gridDim.y) {
        float acc[8], f[8];
        for (int e = 0; e < 8; e++) acc[e] = 0.f;
        for (int s = 0; s < top_k; s++) {
            const int r = slot_row[(u64)t * top_k + s];
            if (r < 0) continue;
            const float w = weight[(u64)t * top_k + s];
            unpack8(*(const uint4 *)(expert_out + (u64)r * d + col), f);
            for (int e = 0; e < 8; e++) acc[e] += w * f[e];
        }
        if (shared) {
            unpack8(*(const uint4 *)(shared + (u64)t * d + col), f);
            for (int e = 0; e < 8; e++) acc[e] += f[e];
        }
        *(uint4 *)(out + (u64)t * d + col) = pack8(acc);
    }
}
