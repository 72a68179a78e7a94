/* f16 -> f32 on the conversion unit: exact for every half, as kvq_f16_value. */
__device__ __forceinline__ float kvq_h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ void kvq_cp_async4(u32 smem, const void *gmem, bool pred) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem), "r"(pred ? 4 : 0));
}

/* Row i's keys [0, kvq_visible(a, i)) under the block-causal mask (kvq_attention's n_visible). */
__device__ __forceinline__ int kvq_visible(const kvq_args &a, int i) {
    return a.mask_block ? min(a.n_keys, ((a.q_index0 + i) / a.mask_block + 1) * a.mask_block) : a.n_keys;
}

/* The key ranges of one kind: 0 the bf16 sinks, 1 the quantised rows, 2 the bf16 rows past the committed ones. */
__device__ __forceinline__ void kvq_range(const kvq_args &a, int r, int &lo, int &hi) {
    const int qb = a.n_committed, qa = min(a.n_sink, qb);
    lo = r == 0 ? 0 : r == 1 ? qa : qb;
    hi = r == 0 ? qa : r == 1 ? qb : a.n_keys;
}
__device__ __forceinline__ int kvq_range_splits(int lo, int hi, int S) {
    return hi > lo ? (hi - 1) / S - lo / S + 1 : 0;
}

/* Split s: keys [j0, j1) of one range, cut at multiples of split_keys (twin: dllm__kvq_tc_split). */
__device__ void kvq_split(const kvq_args &a, int s, int &j0, int &j1, bool &quant) {
    const int S = a.split_keys;
    for (int r = 0; r < 3; r++) {
        int lo, hi;
        kvq_range(a, r, lo, hi);
        const int n = kvq_range_splits(lo, hi, S);
        if (s < n) {
            j0 = max(lo, (lo / S + s) * S), j1 = min(hi, (lo / S + s + 1) * S), quant = r == 1;
            return;
        }
        s -= n;
    }
    j0 = j1 = 0, quant = false;
}
__device__ int kvq_n_splits(const kvq_args &a) {
    int n = 0;
    for (int r = 0; r < 3; r++) {
        int lo, hi;
        kvq_range(a, r, lo, hi);
        n += kvq_range_splits(lo, hi, a.split_keys);
    }
    return n;
}

/* A stage: the raw K and V codes of a tile's keys [KVQ_TC_BC][KVQ_HD / 2] each (2-bit rows use the first half), the K
 * pairs of up to KVQ_TC_PG key groups from group ga = lo / group on [KVQ_TC_PG][KVQ_HD][2], the V side
 * (KIVI pair or SoloQ scale) [KVQ_TC_BC]. Keys outside [lo, hi) are zero-filled. */
#define KVQ_STAGE_VC (KVQ_TC_BC * KVQ_HD / 2)
#define KVQ_STAGE_KP (KVQ_TC_BC * KVQ_HD)
#define KVQ_STAGE_VS (KVQ_TC_BC * KVQ_HD + KVQ_TC_PG * KVQ_HD * 4)
/* The stage's key groups: from ga = lo / group, at most KVQ_TC_PG of them. */
__device__ __forceinline__ int kvq_tc_groups(const kvq_args &a, int lo, int hi) {
    return min(KVQ_TC_PG, (hi - 1) / a.group - lo / a.group + 1);
}
/* The K and V codes of a tile's keys [lo, hi) (kv head at byte off of a row, cb bytes) into the stage, W bytes a copy:
 * 16 where a kv head's codes are whole 16-byte chunks, else 4 (whole 4-byte words, as KVQ_HD % 16 == 0 makes them). */
template <int W>
__device__ __forceinline__ void kvq_tc_stage_codes(const kvq_args &a, unsigned char *st, int k0, int lo, int hi,
                                                   int row_bytes, u64 off, int cb) {
    const int per = cb / W;
    for (int u = threadIdx.x; u < 2 * KVQ_TC_BC * per; u += blockDim.x) {
        const bool v = u >= KVQ_TC_BC * per;
        const int w = v ? u - KVQ_TC_BC * per : u, key = w / per, c = w % per, j = k0 + key;
        const bool ok = j >= lo && j < hi;
        const u32 dst = smem_u32(st + (v ? KVQ_STAGE_VC : 0) + key * (KVQ_HD / 2) + c * W);
        const unsigned char *src = (v ? a.v_codes : a.k_codes) + (ok ? (u64)j * row_bytes + off + c * W : 0);
        if (W == 16)
            cp_async16(dst, src, ok);
        else
            kvq_cp_async4(dst, src, ok);
    }
}
__device__ void kvq_tc_stage(const kvq_args &a, unsigned char *st, int kvh, int k0, int lo, int hi) {
    const int ga = lo / a.group;
    const int tid = threadIdx.x, nt = blockDim.x, kvd = a.n_kv * KVQ_HD, row_bytes = kvd * a.bits / 8,
              cb = KVQ_HD * a.bits / 8;
    const u64 off = (u64)kvh * cb;
    if (cb % 16 == 0)
        kvq_tc_stage_codes<16>(a, st, k0, lo, hi, row_bytes, off, cb);
    else
        kvq_tc_stage_codes<4>(a, st, k0, lo, hi, row_bytes, off, cb);
    const int ng = kvq_tc_groups(a, lo, hi);
    for (int u = tid; u < ng * KVQ_HD / 4; u += nt) {
        const int gi = u / (KVQ_HD / 4), c = u % (KVQ_HD / 4);
        cp_async16(smem_u32(st + KVQ_STAGE_KP + gi * KVQ_HD * 4 + c * 16),
                   a.k_pairs + ((u64)(ga + gi) * kvd + kvh * KVQ_HD) * 2 + c * 8, true);
    }
    for (int u = tid; u < KVQ_TC_BC; u += nt) {
        const int j = k0 + u;
        const bool ok = j >= lo && j < hi;
        const u64 at = ok ? (u64)j * a.n_kv + kvh : 0;
        const void *src = a.soloq ? (const void *)(a.v_scale + at) : (const void *)(a.v_pairs + 2 * at);
        kvq_cp_async4(smem_u32(st + KVQ_STAGE_VS + u * 4), src, ok);
    }
}

/* An FP16 pair (scale, min) as fp32 (exact: every half is an fp32). */
__device__ __forceinline__ float2 kvq_pair_f32(const unsigned short *p) {
    return make_float2(kvq_h2f(p[0]), kvq_h2f(p[1]));
}

/* A stage's FP16 pairs as fp32, once per tile rather than once per decoded element (the conversion unit is a sixteenth
 * of the FMA pipes' rate): the K pairs of its ng key groups into kpf [KVQ_TC_PG][KVQ_HD], KIVI's V pairs into vpf
 * [KVQ_TC_BC] (exact: every half is an fp32). */
__device__ void kvq_tc_convert(const kvq_args &a, const unsigned char *st, float2 *kpf, float2 *vpf, int ng) {
    const unsigned short *kp = (const unsigned short *)(st + KVQ_STAGE_KP),
                         *vp = (const unsigned short *)(st + KVQ_STAGE_VS);
    for (int u = threadIdx.x; u < ng * KVQ_HD; u += blockDim.x) kpf[u] = kvq_pair_f32(kp + 2 * u);
    if (!a.soloq)
        for (int u = threadIdx.x; u < KVQ_TC_BC; u += blockDim.x) vpf[u] = kvq_pair_f32(vp + 2 * u);
}

/* Code e of an 8-code word as an fp32, exactly, without the conversion unit: 2^23 + code's bits minus 2^23. */
__device__ __forceinline__ float kvq_code_f32(u32 word, int e, int bits, u32 mask) {
    return __uint_as_float(0x4B000000u | (word >> (e * bits) & mask)) - 8388608.f;
}

/* A stage decoded into the bf16 K and V tiles [KVQ_TC_BC][KVQ_HD + 8] (twin: dllm__kvq_flash_twin's keys and values): a
 * thread per 8 channels of a key; the pairs from kvq_tc_convert (a key group past the staged ones: from global memory),
 * SoloQ's levels from `lut` (kvq_soloq_c of each code). Keys outside [lo, hi) become zeros (their scores are masked;
 * P = 0 times a zero value adds nothing, where a NaN would). */
__device__ void kvq_tc_decode(const kvq_args &a, const unsigned char *st, const float2 *kpf, const float2 *vpf,
                              const float *lut, bf16_t *sK, bf16_t *sV, int kvh, int k0, int lo, int hi) {
    constexpr int CPR = KVQ_HD / 8, LD = KVQ_HD + 8;
    const int bits = a.bits, group = max(a.group, 1), ga = lo / group;
    const u32 mask = (1u << bits) - 1u;
    // Keys, then values: apart, each loop holds only its own operands (the decode runs beside the 64 output registers
    // a thread keeps at head dim 128, and beside another warp's mma).
    for (int u = threadIdx.x; u < KVQ_TC_BC * CPR; u += blockDim.x) {
        const int key = u / CPR, c8 = u % CPR, j = k0 + key;
        u32 packed[4] = {0u, 0u, 0u, 0u};
        if (j >= lo && j < hi) {
            const unsigned char *codes = st + key * (KVQ_HD / 2);
            const u32 word =
                bits == 4 ? *(const u32 *)(codes + c8 * 4) : (u32) * (const unsigned short *)(codes + c8 * 2);
            const int gi = j / group - ga;
#pragma unroll
            for (int e = 0; e < 8; e += 2) {  // two channels at a time, packed as they are made
                float x[2];
#pragma unroll
                for (int f = 0; f < 2; f++) {
                    const int ch = c8 * 8 + e + f;
                    const float2 pr =
                        gi < KVQ_TC_PG
                            ? kpf[gi * KVQ_HD + ch]
                            : kvq_pair_f32(a.k_pairs + ((u64)(j / group) * a.n_kv * KVQ_HD + kvh * KVQ_HD + ch) * 2);
                    x[f] = fmaf(kvq_code_f32(word, e + f, bits, mask), pr.x, pr.y);
                }
                packed[e / 2] = pack_bf16x2(x[0], x[1]);
            }
        }
        *(uint4 *)(sK + key * LD + c8 * 8) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
    for (int u = threadIdx.x; u < KVQ_TC_BC * CPR; u += blockDim.x) {
        const int key = u / CPR, c8 = u % CPR, j = k0 + key;
        u32 packed[4] = {0u, 0u, 0u, 0u};
        if (j >= lo && j < hi) {
            const unsigned char *codes = st + KVQ_STAGE_VC + key * (KVQ_HD / 2);
            const u32 word =
                bits == 4 ? *(const u32 *)(codes + c8 * 4) : (u32) * (const unsigned short *)(codes + c8 * 2);
            const float sc = *(const float *)(st + KVQ_STAGE_VS + key * 4);
            const float2 vp = vpf[key];
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                float x[2];
#pragma unroll
                for (int f = 0; f < 2; f++)
                    x[f] = a.soloq ? __fmul_rn(lut[word >> ((e + f) * bits) & mask], sc)
                                   : fmaf(kvq_code_f32(word, e + f, bits, mask), vp.x, vp.y);
                packed[e / 2] = pack_bf16x2(x[0], x[1]);
            }
        }
        *(uint4 *)(sV + key * LD + c8 * 8) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
}

/* The bf16 rows [lo, hi) of a tile (sinks, or rows past the committed ones: kvq_bf16_row) copied into the K and V tiles
 * as they are. */
__device__ void kvq_tc_load_bf16(const kvq_args &a, bf16_t *sK, bf16_t *sV, int kvh, int k0, int lo, int hi) {
    constexpr int CPR = KVQ_HD / 8, LD = KVQ_HD + 8;
    const int kvd = a.n_kv * KVQ_HD;
    for (int u = threadIdx.x; u < 2 * KVQ_TC_BC * CPR; u += blockDim.x) {
        const bool v = u >= KVQ_TC_BC * CPR;
        const int w = v ? u - KVQ_TC_BC * CPR : u, key = w / CPR, c = w % CPR, j = k0 + key;
        const bool ok = j >= lo && j < hi;
        cp_async16(smem_u32((v ? sV : sK) + key * LD + c * 8),
                   ok ? kvq_bf16_row(a, j) + (v ? kvd : 0) + kvh * KVQ_HD + c * 8 : a.fresh, ok);
    }
}

/* The CTA's query rows [r0, r0 + rows) of kv head kvh's group into sQ (rows past R zero-filled). */
__device__ void kvq_tc_load_q(const kvq_args &a, bf16_t *sQ, int kvh, int r0, int rows, int R) {
    constexpr int CPR = KVQ_HD / 8, LD = KVQ_HD + 8;
    const int group = a.n_head / a.n_kv;
    for (int u = threadIdx.x; u < rows * CPR; u += blockDim.x) {
        const int r = u / CPR, c = u % CPR, row = r0 + r;
        const bool ok = row < R;
        const int h = kvh * group + row / a.q_rows, i = row % a.q_rows;
        cp_async16(smem_u32(sQ + r * LD + c * 8), a.q + (ok ? (u64)i * a.q_stride + h * KVQ_HD + c * 8 : 0), ok);
    }
}

/* One warp, one 32-key chunk at key kc of the K and V tiles: flash_tile's step for one m16 tile of query rows (rows
 * g and g + 8 see keys [j0, lim0) and [j0, lim1)). */
__device__ __forceinline__ void kvq_tc_chunk(u32 q_warp, u32 k_s, u32 v_s, int kc, int j0, int lim0, int lim1, int lane,
                                             float scale_log2, float (&o)[KVQ_HD / 8][4], float (&m)[2],
                                             float (&l)[2]) {
    constexpr int LD = KVQ_HD + 8, NT = 4, KS = KVQ_HD / 16, DT = KVQ_HD / 8;
    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        u32 qf[4];
        ldmatrix_x4(qf, q_warp + kk * 32);
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            u32 kb[4];
            ldmatrix_x4(kb, k_s + ((j * 8 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8) * 2);
            mma_bf16(s[j], qf, kb[0], kb[1]);
            mma_bf16(s[j + 1], qf, kb[2], kb[3]);
        }
    }
    if (kc < j0 || kc + 32 > min(lim0, lim1)) {
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = kc + j * 8 + 2 * (lane & 3) + (e & 1);
                if (key < j0 || key >= (e >> 1 ? lim1 : lim0)) s[j][e] = -DLLM_INF;
            }
    }
    online_softmax<NT, DT>(s, m, l, o, scale_log2);
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
        u32 pa[4];
        pack_p<NT>(s, kk, pa);
#pragma unroll
        for (int d = 0; d < DT; d += 2) {
            u32 vb[4];
            ldmatrix_x4_trans(
                vb, v_s + ((kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + d * 8 + (lane >> 4) * 8) * 2);
            mma_bf16(o[d], pa, vb[0], vb[1]);
            mma_bf16(o[d + 1], pa, vb[2], vb[3]);
        }
    }
}

/* Which CTA of its launch a kvq_flash CTA is (ix.split(), .kv_head(), .q_tile(): its key split, kv head and tile of
 * query rows; .warps(): its warps, 16 query rows each), read from its grid where used rather than held in registers
 * (the CTA's registers are all taken at head dim 128). A launch of its own: (split, kv head, tile). A batched launch
 * (kvq_flash_batch): its chunks' tiles over blockIdx.z, q_tiles a chunk. */
struct kvq_flash_own {
    __device__ __forceinline__ int split() const { return blockIdx.x; }
    __device__ __forceinline__ int kv_head() const { return blockIdx.y; }
    __device__ __forceinline__ int q_tile() const { return blockIdx.z; }
    __device__ __forceinline__ int warps() const { return blockDim.x >> 5; }
};
struct kvq_flash_tiled {
    int q_tiles;
    __device__ __forceinline__ int split() const { return blockIdx.x; }
    __device__ __forceinline__ int kv_head() const { return blockIdx.y; }
    __device__ __forceinline__ int q_tile() const { return blockIdx.z % q_tiles; }
    __device__ __forceinline__ int warps() const { return blockDim.x >> 5; }
};

/* One kvq_flash CTA (ix: which one). */
template <class Ix> __device__ __forceinline__ void kvq_flash_cta(const kvq_args &a, const Ix &ix) {
    constexpr int HD = KVQ_HD, LD = HD + 8, BC = KVQ_TC_BC, DT = HD / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float lut[16];  // SoloQ's level of each code (kvq_soloq_c)
    const int CR = ix.warps() * 16, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    bf16_t *sQ = (bf16_t *)smem,
           *sK = sQ + CR * LD;  // sK: the decoded K tiles [2][BC][LD], then the V tiles [2][BC][LD]
    bf16_t *sV = sK + 2 * BC * LD;
    float2 *kpf = (float2 *)(sV + 2 * BC * LD), *vpf = kpf + KVQ_TC_PG * HD;
    unsigned char *raw = (unsigned char *)(vpf + BC);
    const int R = a.n_head / a.n_kv * a.q_rows, r0 = ix.q_tile() * CR;
    int j0, j1;
    bool quant;
    kvq_split(a, ix.split(), j0, j1, quant);
    // The CTA's last query (the largest sequence index among its rows) bounds the keys worth visiting.
    const int r_last = min(R, r0 + CR) - 1;
    const int i_max = r_last / a.q_rows != r0 / a.q_rows ? a.q_rows - 1 : r_last % a.q_rows;
    const int j1c = min(j1, kvq_visible(a, i_max));
    const int rA = r0 + warp * 16 + g, rB = rA + 8;
    if (threadIdx.x < 16)
        lut[threadIdx.x] = a.soloq && threadIdx.x < (1 << a.bits) ? kvq_soloq_c(threadIdx.x, a.bits) : 0.f;
    kvq_tc_load_q(a, sQ, ix.kv_head(), r0, CR, R);
    cp_async_commit();

    float o[DT][4], m[2] = {-DLLM_INF, -DLLM_INF}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int d = 0; d < DT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    const bool live = r0 + warp * 16 < R;  // a warp past the group's rows only copies and decodes
    const float scale_log2 = a.scale * 1.4426950408889634f;
    const int t0 = j0 / BC, t1 = j1c > j0 ? (j1c - 1) / BC + 1 : t0;
    auto tile_lo = [&](int tile) { return max(tile * BC, j0); };
    auto tile_hi = [&](int tile) { return min(tile * BC + BC, j1c); };
    auto buf = [&](int tile) { return (tile - t0) & 1; };
    auto stage = [&](int tile) {
        kvq_tc_stage(a, raw + buf(tile) * KVQ_TC_STAGE, ix.kv_head(), tile * BC, tile_lo(tile), tile_hi(tile));
    };
    auto convert = [&](int tile) {
        kvq_tc_convert(a, raw + buf(tile) * KVQ_TC_STAGE, kpf, vpf, kvq_tc_groups(a, tile_lo(tile), tile_hi(tile)));
    };
    auto decode = [&](int tile) {
        kvq_tc_decode(a, raw + buf(tile) * KVQ_TC_STAGE, kpf, vpf, lut, sK + buf(tile) * BC * LD,
                      sV + buf(tile) * BC * LD, ix.kv_head(), tile * BC, tile_lo(tile), tile_hi(tile));
    };
    auto multiply = [&](int tile,
                        int b) {  // this warp's rows over the tile's keys, decoded or copied into K and V tiles b
        if (!live) return;
        // Recomputed here rather than held across the decode, which needs the registers.
        const int limA = rA < R ? min(j1, kvq_visible(a, rA % a.q_rows)) : 0,
                  limB = rB < R ? min(j1, kvq_visible(a, rB % a.q_rows)) : 0;
        const u32 q_warp = smem_u32(sQ + (warp * 16 + (lane & 15)) * LD + (lane >> 4) * 8);
        const int k0 = tile * BC, lo = tile_lo(tile), hi = tile_hi(tile);
        const u32 k_s = smem_u32(sK + b * BC * LD), v_s = smem_u32(sV + b * BC * LD);
#pragma unroll 1
        for (int sub = 0; sub < BC; sub += 32)
            if (k0 + sub < hi && k0 + sub + 32 > lo)
                kvq_tc_chunk(q_warp, k_s + sub * LD * 2, v_s + sub * LD * 2, k0 + sub, j0, limA, limB, lane, scale_log2,
                             o, m, l);
    };
    // bf16 rows: copied into the first K and V tiles, one tile at a time (a split of the block's own rows is short)
    if (!quant) {
        for (int tile = t0; tile < t1; tile++) {
            kvq_tc_load_bf16(a, sK, sV, ix.kv_head(), tile * BC, tile_lo(tile), tile_hi(tile));
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
            multiply(tile, 0);
            __syncthreads();
        }
    } else if (t0 < t1) {
        // Quantised rows, a pipeline of three tiles: tile t + 1 is decoded (its pairs already fp32) into the other K
        // and V tiles and then tile t multiplied, with no barrier between, while the raw codes and pairs of tile t + 2
        // are copied (cp.async) into the stage tile t's were in. A warp done decoding multiplies while others still
        // decode, so the decode's ALU work and the mma overlap across warps. (Odd warps multiplying first would force
        // that overlap, but its two decode sites spill at head dim 128.) Two barriers a tile: the tile's decode and
        // the next stage landed, then the next stage's pairs converted.
        stage(t0);
        cp_async_commit();
        for (int tile = t0 - 1; tile < t1; tile++) {  // tile t0 - 1: the pipeline's start, nothing to multiply
            const int next = tile + 1;
            cp_async_wait<0>();
            __syncthreads();  // tile decoded; next's stage landed; the other K and V tiles and tile's stage free
            if (next < t1) {
                if (next + 1 < t1) stage(next + 1);
                cp_async_commit();
                convert(next);
                __syncthreads();  // next's pairs in fp32
                decode(next);
            }
            if (tile >= t0) multiply(tile, buf(tile));
        }
    }
    cp_async_wait<0>();  // a split with no visible key never waited for its query rows
    const int group = a.n_head / a.n_kv;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lr = l[r];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        const int row = r ? rB : rA;
        if (row >= R) continue;
        const int h = ix.kv_head() * group + row / a.q_rows, i = row % a.q_rows;
        float *p = a.partial + (((u64)ix.split() * a.n_head + h) * a.q_rows + i) * (HD + 2);
#pragma unroll
        for (int d = 0; d < DT; d++) *(float2 *)(p + d * 8 + 2 * t) = make_float2(o[d][2 * r], o[d][2 * r + 1]);
        if (t == 0) p[HD] = m[r], p[HD + 1] = lr;
    }
}

KERNEL_kvq_flash {
    pdl_enter();
    kvq_flash_cta(a, kvq_flash_own());
}
/* [batch] The CTAs of the chunks of one CTA shape (warps, b.q_tiles row tiles: dllm__kvq_batch_group) in one launch:
 * CTA (x, y, z) is CTA (x, y, z % q_tiles) of chunk b.items[z / q_tiles].chunk's own grid, a split past the chunk's
 * splits (the grid's x takes the group's most) returns at once. Before sm_90 the per-chunk arguments would cost
 * registers past the 128 a thread has (spills): the host launches kvq_flash per chunk there, this kernel is empty. */
KERNEL_kvq_flash_batch {
#if __CUDA_ARCH__ >= 900
    pdl_enter();
    __shared__ kvq_args sa;
    const kvq_args &a = kvq_batch_chunk(b, b.items[blockIdx.z / b.q_tiles].chunk, sa);
    if ((int)blockIdx.x >= kvq_n_splits(a)) return;
    kvq_flash_cta(a, kvq_flash_tiled{b.q_tiles});
#endif
}

/* The splits of one (query row i, head h) merged in split order (twin: dllm__kvq_flash_twin's last step): weights
 * 2^(m_s - max), SoloQ's quantised splits summed apart and rotated back once, then the bf16 ones added and the sum
 * normalised. */
__device__ void kvq_flash_combine_row(const kvq_args &a, int i, int h) {
    __shared__ float acc[256], racc[256], T0[256], T1[256];
    const int lane = threadIdx.x, hd = a.hd, n_splits = kvq_n_splits(a);
    const u64 stride = (u64)a.n_head * a.q_rows * (hd + 2);
    const float *P = a.partial + ((u64)h * a.q_rows + i) * (hd + 2);
    float mx = -DLLM_INF;
    for (int s = lane; s < n_splits; s += 32) mx = fmaxf(mx, P[s * stride + hd]);
    for (int x = 16; x > 0; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
    for (int c = lane; c < hd; c += 32) acc[c] = 0.f, racc[c] = 0.f;
    float l = 0.f;
    for (int s = 0; s < n_splits; s++) {
        const float ms = P[s * stride + hd];
        if (ms == -DLLM_INF) continue;  // a split with no visible key
        int j0, j1;
        bool quant;
        kvq_split(a, s, j0, j1, quant);
        const float w = exp2_ftz(ms - mx);
        l = fmaf(w, P[s * stride + hd + 1], l);
        float *dst = quant && a.soloq ? racc : acc;
        for (int c = lane; c < hd; c += 32) dst[c] = fmaf(w, P[s * stride + c], dst[c]);
    }
    kvq_store_output(a, acc, racc, T0, T1, l, i, h, lane);
}
KERNEL_kvq_flash_combine {
    pdl_enter();
    kvq_flash_combine_row(a, blockIdx.x, blockIdx.y);
}
/* [batch] Every chunk's rows in one launch: CTA (x, h) merges row item x (its chunk's query row) at head h. */
KERNEL_kvq_flash_combine_batch {
    pdl_enter();
    __shared__ kvq_args sa;
    const kvq_item it = b.items[blockIdx.x];
    kvq_flash_combine_row(kvq_batch_chunk(b, it.chunk, sa), it.row, blockIdx.y);
}
