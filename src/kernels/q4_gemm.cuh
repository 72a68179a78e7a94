/* src/kernels/q4_gemm.cuh - the W4 GEMM for few activation rows (see dllm__src_q4_gemm); its dequantiser is
 * q4_dequant.cuh, which the module includes first. */

/* The ring: STAGES stages of q4_stage_bytes (dllm__q4_stage_bytes: codes [wt * 2 + h][thread] 16 bytes, NVFP4's
 * block-scale words [(wt * 2 + h) * 2 + i][thread], then the activation rows, 256 bytes each). Every thread copies
 * its own weight slots and a share of the activation rows with cp.async (nothing held in registers); its
 * cp.async.wait_group makes its copies visible to itself, and the CTA barrier at each chunk's start makes every
 * thread's visible to all and orders their reads of the stage being refilled before its new copies (PTX leaves
 * cp.async unordered with other memory operations otherwise). */
__device__ __forceinline__ void q4_cp_async4(u32 smem, const void *gmem, u32 bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void q4_cp_async16(u32 smem, const void *gmem, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(bytes) : "memory");
}
/* The same for weight codes, with an L2 prefetch of the whole 128-byte line: a row's 64 bytes of a chunk are half a
 * line (rows start 128-byte aligned where K % 256 == 0), so DRAM serves whole lines and the next chunk's half is
 * already on its way when its copy is issued. */
__device__ __forceinline__ void q4_cp_async16_line(u32 smem, const void *gmem, u32 bytes) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void q4_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* The "memory" clobber keeps the ring's reads after the wait. */
template <int N> __device__ __forceinline__ void q4_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <int FMT> __device__ constexpr int q4_scale_bytes() {
    return FMT == Q4_NVFP4 ? 2 * Q4_WT * 2 * Q4_THREADS * 4 : 0;
}
constexpr int Q4_CODE_BYTES = 2 * Q4_WT * Q4_THREADS * 16;
/* A stage's bytes for m_tiles activation tiles (the host's dllm__q4_stage_bytes). */
template <int FMT> __device__ __forceinline__ u32 q4_stage_bytes(int m_tiles) {
    return (u32)(Q4_CODE_BYTES + q4_scale_bytes<FMT>() + m_tiles * 8 * Q4_KC * 2);
}

/* Activation row r's 16-byte slot for k group q (k0 + 8 q, q = 4 t + j as q4_chunk reads it) is 4 j + t, xor 5 in odd
 * rows: a quarter warp's 8 reads (rows g, g + 1; t = 0..3) land in the 8 distinct 16-byte bank groups (slot mod 8: even
 * rows 4 (j & 1) + t, odd ones 4 (~j & 1) + (t ^ 1)). An involution of q for a given r (the transpose fixes 5), so it
 * is also the group a slot holds. */
__device__ __forceinline__ int q4_act_slot(int q, int r) { return ((q & 3) << 2 | q >> 2) ^ 5 * (r & 1); }

/* The NVFP4 block-scale bytes of one row and chunk: words 0, 1 of thread t lie in block b0 = n * blocks + k0 / 16 + 2 t
 * (an index into the [N][blocks] array), words 2, 3 in b0 + 1; both bytes lie in the 8 from the 4-aligned b0 & ~3;
 * each 4-byte copy reads only the bytes before the array's end (src-size), so nothing past it is touched. */
__device__ __forceinline__ u64 q4_scale_base(const q4_gemm_args &a, int n, int k0, int t) {
    return (u64)n * ((a.K + 15) >> 4) + (k0 >> 4) + 2 * t;
}

/* Issues the copies of one chunk at k0 into the stage at byte `stage` of the ring: this thread's rows n0 + 16 wt + 8 h
 * (h = 0: row g, 1: row g + 8), k0 + 32 t + [0, 32); its share of the activation rows [0, 8 m_tiles). Nothing is read
 * (zeros land) where a row is past N or M, or k past k_end. vec16: K % 32 == 0 and the codes 16-byte aligned, so a
 * thread's 16 bytes of a row are one aligned copy (k_end, a multiple of 32 then, never cuts them). */
template <int FMT>
__device__ __forceinline__ void q4_issue_chunk(const q4_gemm_args &a, u32 stage, int m_tiles, int n0, int t, int k0,
                                               int k_end, bool vec16) {
    const int row_bytes = a.K >> 1, k = k0 + 32 * t;
#pragma unroll
    for (int wt = 0; wt < Q4_WT; wt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int n = n0 + 16 * wt + 8 * h;
            const bool row_ok = n < a.N;
            const unsigned char *row = a.codes + (u64)(row_ok ? n : 0) * row_bytes;
            const u32 dst = stage + ((wt * 2 + h) * Q4_THREADS + threadIdx.x) * 16;
            if (vec16) {
                const bool ok = row_ok && k < k_end;
                q4_cp_async16_line(dst, ok ? row + (k >> 1) : a.codes, ok ? 16 : 0);
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const bool ok = row_ok && k + 8 * j < k_end;
                    q4_cp_async4(dst + 4 * j, ok ? row + ((k + 8 * j) >> 1) : a.codes, ok ? 4 : 0);
                }
            }
            if (FMT == Q4_NVFP4) {
                const u64 total = (u64)a.N * ((a.K + 15) >> 4),
                          base = row_ok ? q4_scale_base(a, n, k0, t) & ~(u64)3 : total;
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const u64 at = base + 4 * i, bytes = at < total ? min(total - at, (u64)4) : 0;
                    q4_cp_async4(stage + Q4_CODE_BYTES + (((wt * 2 + h) * 2 + i) * Q4_THREADS + threadIdx.x) * 4,
                                 bytes ? a.block_scales + at : a.block_scales, (u32)bytes);
                }
            }
        }
    const u32 acts = stage + Q4_CODE_BYTES + q4_scale_bytes<FMT>();
    for (int v = threadIdx.x; v < m_tiles * 8 * 16; v += Q4_THREADS) {  // consecutive threads, consecutive slots
        const int r = v >> 4, q = q4_act_slot(v & 15, r), kq = k0 + 8 * q;
        const bool ok = r < a.M && kq < k_end;
        q4_cp_async16(acts + v * 16, ok ? a.A + (u64)r * a.lda + kq : a.A, ok ? 16 : 0);
    }
}

/* This thread's words of the stage at `stage` (landed: see the wait in q4_gemm_body); NVFP4: words 0, 1's block scale
 * in byte 0 of sc, words 2, 3's in byte 1, picked out of the 8 copied bytes at offset b0 & 3. */
template <int FMT>
__device__ __forceinline__ void q4_read_chunk(const q4_gemm_args &a, const unsigned char *stage, int n0, int t, int k0,
                                              uint4 w[Q4_WT][2], u32 sc[Q4_WT][2]) {
#pragma unroll
    for (int wt = 0; wt < Q4_WT; wt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            w[wt][h] = *(const uint4 *)(stage + ((wt * 2 + h) * Q4_THREADS + threadIdx.x) * 16);
            sc[wt][h] = 0;
            if (FMT == Q4_NVFP4) {
                const u32 *win =
                    (const u32 *)(stage + Q4_CODE_BYTES + ((wt * 2 + h) * 2 * Q4_THREADS + threadIdx.x) * 4);
                const u32 shift = 8 * (u32)(q4_scale_base(a, n0 + 16 * wt + 8 * h, k0, t) & 3);
                sc[wt][h] = __funnelshift_r(win[0], win[Q4_THREADS], shift);  // the next slot, Q4_THREADS words on
            }
        }
}

__device__ __forceinline__ u32 q4_word(const uint4 &w, int j) {
    return j == 0 ? w.x : j == 1 ? w.y : j == 2 ? w.z : w.w;
}

/* One chunk (its stage's activation rows at acts) into the accumulators: per word j, the two k16 steps of every
 * weight tile against every live activation tile (the tiles past M cost nothing and change no row's arithmetic, and
 * neither does MT, the tiles an instance holds). */
template <int FMT, int MT>
__device__ __forceinline__ void q4_chunk(const q4_smem &s, const unsigned char *acts, int m_tiles, int g, int t,
                                         const uint4 w[Q4_WT][2], const u32 sc[Q4_WT][2], float acc[Q4_WT][MT][4]) {
    const int p = g & 1;
    const unsigned char *acts_even = acts + g * (Q4_KC * 2) + 16 * (t ^ p) + 64 * p, *acts_odd = acts_even - 128 * p;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        u32 p[Q4_WT][2][4];
#pragma unroll
        for (int wt = 0; wt < Q4_WT; wt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                q4_dequant<FMT>(q4_word(w[wt][h], j), (sc[wt][h] >> (8 * (j >> 1))) & 255, s, p[wt][h]);
        // row r = 8 mt + g's slot q4_act_slot(4 t + j, r) = 4 (j ^ p) + (t ^ p), p = g & 1, and 4 (j ^ p) = 4 j + 4 p
        // for even j, 4 j - 4 p for odd j: two bases with constant offsets
        // (ptxas keeps a register an address otherwise)
        const unsigned char *b_at = (j & 1 ? acts_odd : acts_even) + 64 * j;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            if (mt < m_tiles) {
                const uint4 b = *(const uint4 *)(b_at + mt * 8 * (Q4_KC * 2));
#pragma unroll
                for (int wt = 0; wt < Q4_WT; wt++) {
                    q4_mma(acc[wt][mt], p[wt][0][0], p[wt][1][0], p[wt][0][1], p[wt][1][1], b.x, b.y);
                    q4_mma(acc[wt][mt], p[wt][0][2], p[wt][1][2], p[wt][0][3], p[wt][1][3], b.z, b.w);
                }
            }
    }
}

/* The epilogue of one output: (acc * s_x) * s_w in fp32, rounded once to the output type. */
__device__ __forceinline__ void q4_store(const q4_gemm_args &a, int m, int n, float acc) {
    const float v = __fmul_rn(__fmul_rn(acc, a.s_x ? a.s_x[m] : 1.0f), a.row_scale[n]);
    const u64 at = (u64)m * a.ldy + a.y_col0 + n;
    if (a.y_f32)
        ((float *)a.y)[at] = v;
    else
        ((bf16_t *)a.y)[at] = f32_to_bf16(v);
}

/* The accumulators of one CTA: weight tile `tile` (rows tile * Q4_BN + [0, Q4_BN)) over split `split`'s chunks
 * [split * cps, (split + 1) * cps) of K. STAGES - 1 chunks (weights and activations) are in flight while one is
 * computed; one barrier a chunk. MT: the activation tiles the instance holds (M <= 8 MT); STAGES: the host's
 * dllm__q4_stage_count for them. Leaves only empty cp.async groups outstanding. */
template <int FMT, int MT, int STAGES>
__device__ __forceinline__ void q4_gemm_accumulate(const q4_gemm_args &a, const q4_smem &s, int tile, int split,
                                                   float acc[Q4_WT][MT][4]) {
    extern __shared__ __align__(16) unsigned char q4_ring[];
    const u32 ring = (u32)__cvta_generic_to_shared(q4_ring);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int m_tiles = (a.M + 7) >> 3, chunks = (a.K + Q4_KC - 1) / Q4_KC;
    const int c_begin = split * a.chunks_per_split, c_end = min(chunks, c_begin + a.chunks_per_split),
              k_end = min(a.K, c_end * Q4_KC);
    const int n0 = tile * Q4_BN + warp * (16 * Q4_WT) + g, n_chunks = c_end - c_begin;
    const u32 stage_bytes = q4_stage_bytes<FMT>(m_tiles), act_offset = Q4_CODE_BYTES + q4_scale_bytes<FMT>();
    const bool vec16 = (a.K & 31) == 0 && ((u64)a.codes & 15) == 0;
#pragma unroll
    for (int wt = 0; wt < Q4_WT; wt++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++) acc[wt][mt][0] = acc[wt][mt][1] = acc[wt][mt][2] = acc[wt][mt][3] = 0.f;
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) {  // one commit group per chunk, empty past the split's end
        if (i < n_chunks)
            q4_issue_chunk<FMT>(a, ring + i * stage_bytes, m_tiles, n0, t, (c_begin + i) * Q4_KC, k_end, vec16);
        q4_cp_async_commit();
    }
    for (int i = 0; i < n_chunks; i++) {
        const int c = c_begin + i;
        q4_cp_async_wait<STAGES - 2>();  // this thread's copies of chunk i (and of every older one) have landed
        // every thread's copies of chunk i have landed, and every thread is done with chunk i - 1's stage (and the
        // tables are written): the barrier orders those before the reads and the refill below
        __syncthreads();
        if (i + STAGES - 1 < n_chunks)
            q4_issue_chunk<FMT>(a, ring + ((i + STAGES - 1) % STAGES) * stage_bytes, m_tiles, n0, t,
                                (c + STAGES - 1) * Q4_KC, k_end, vec16);
        q4_cp_async_commit();
        const unsigned char *stage = q4_ring + (i % STAGES) * stage_bytes;
        uint4 w[Q4_WT][2];
        u32 sc[Q4_WT][2];
        q4_read_chunk<FMT>(a, stage, n0, t, c * Q4_KC, w, sc);
        q4_chunk<FMT, MT>(s, stage + act_offset, m_tiles, g, t, w, sc, acc);
    }
}

/* The weight row n and activation row m of accumulator element e of weight tile wt and activation tile mt, for thread
 * `thread` of the CTA of weight tile `tile` (the mma's c0..c3: see q4_gemm's header). */
__device__ __forceinline__ int q4_acc_row_n(int tile, int thread, int wt, int e) {
    return tile * Q4_BN + (thread >> 5) * (16 * Q4_WT) + 16 * wt + 8 * (e >> 1) + ((thread & 31) >> 2);
}
__device__ __forceinline__ int q4_acc_row_m(int thread, int mt, int e) { return mt * 8 + 2 * (thread & 3) + (e & 1); }

/* This thread's outputs: split-K's partial (k_splits > 1: [split][M][N]) or the epilogue. */
template <int MT>
__device__ __forceinline__ void q4_gemm_write(const q4_gemm_args &a, int tile, int split,
                                              const float acc[Q4_WT][MT][4]) {
    const int m_tiles = (a.M + 7) >> 3;
#pragma unroll
    for (int wt = 0; wt < Q4_WT; wt++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int n = q4_acc_row_n(tile, threadIdx.x, wt, e), m = q4_acc_row_m(threadIdx.x, mt, e);
                if (mt >= m_tiles || m >= a.M || n >= a.N) continue;
                if (a.k_splits > 1)
                    a.partial[((u64)split * a.M + m) * a.N + n] = acc[wt][mt][e];
                else
                    q4_store(a, m, n, acc[wt][mt][e]);
            }
}

/* Grid (ceil(N / Q4_BN), k_splits), Q4_THREADS threads, dynamic shared memory: the ring (dllm__q4_ring_bytes(M)). */
template <int FMT, int MT, int STAGES> __device__ __forceinline__ void q4_gemm_body(const q4_gemm_args &a) {
    pdl_enter();
    __shared__ __align__(16) q4_smem s;
    q4_load_tables<FMT>(s);
    float acc[Q4_WT][MT][4];
    q4_gemm_accumulate<FMT, MT, STAGES>(a, s, blockIdx.x, blockIdx.y, acc);
    q4_gemm_write<MT>(a, blockIdx.x, blockIdx.y, acc);
}

KERNEL_q4_gemm_nvfp4 { q4_gemm_body<Q4_NVFP4, Q4_MT, Q4_STAGES>(a); }
KERNEL_q4_gemm_int4 { q4_gemm_body<Q4_INT4, Q4_MT, Q4_STAGES>(a); }
KERNEL_q4_gemm_lloyd { q4_gemm_body<Q4_LLOYD, Q4_MT, Q4_STAGES>(a); }
KERNEL_q4_gemm_e8p { q4_gemm_body<Q4_E8P, Q4_MT, Q4_STAGES>(a); }
KERNEL_q4_gemm_rtn { q4_gemm_body<Q4_RTN, Q4_MT, Q4_STAGES>(a); }
KERNEL_q4_gemm_nvfp4_m32 { q4_gemm_body<Q4_NVFP4, Q4_MT / 2, Q4_STAGES>(a); }
KERNEL_q4_gemm_int4_m32 { q4_gemm_body<Q4_INT4, Q4_MT / 2, Q4_STAGES_M32>(a); }
KERNEL_q4_gemm_lloyd_m32 { q4_gemm_body<Q4_LLOYD, Q4_MT / 2, Q4_STAGES_M32>(a); }
KERNEL_q4_gemm_e8p_m32 { q4_gemm_body<Q4_E8P, Q4_MT / 2, Q4_STAGES_M32>(a); }
KERNEL_q4_gemm_rtn_m32 { q4_gemm_body<Q4_RTN, Q4_MT / 2, Q4_STAGES_M32>(a); }

/* Split-K's partials [k_splits][M][N] summed in split order (one thread an output), then the epilogue. */
KERNEL_q4_gemm_reduce {
    pdl_enter();
    const u64 outputs = (u64)a.M * a.N, i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= outputs) return;
    float acc = a.partial[i];
    for (int s = 1; s < a.k_splits; s++) acc += a.partial[(u64)s * outputs + i];
    q4_store(a, (int)(i / a.N), (int)(i % a.N), acc);
}
