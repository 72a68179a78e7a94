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
 * of the FMA pipes' rate), and each key's group: the K pairs of its ng key groups (from ga = lo / group) into kpf
 * [KVQ_TC_PG][4][KVQ_HD / 8] float4s (channel c8 * 8 + e's pair at [gi][e / 2][c8], beside channel e + 1's, so that the
 * 16 threads decoding a key's channel chunks read 16 consecutive float4s, no bank conflict), KIVI's V pairs into vpf
 * [KVQ_TC_BC], and key k0 + u's group less ga into kgroup[u] (one division a key and tile, not one a decoded chunk;
 * exact: every half is an fp32). */
__device__ void kvq_tc_convert(const kvq_args &a, const unsigned char *st, float4 *kpf, float2 *vpf, int *kgroup,
                               int k0, int lo, int ng) {
    const unsigned short *kp = (const unsigned short *)(st + KVQ_STAGE_KP),
                         *vp = (const unsigned short *)(st + KVQ_STAGE_VS);
    for (int u = threadIdx.x; u < ng * KVQ_HD; u += blockDim.x) {
        const int gi = u / KVQ_HD, ch = u % KVQ_HD, e = ch % 8;
        ((float2 *)(kpf + gi * (KVQ_HD / 2) + e / 2 * (KVQ_HD / 8) + ch / 8))[e % 2] = kvq_pair_f32(kp + 2 * u);
    }
    if (!a.soloq)
        for (int u = threadIdx.x; u < KVQ_TC_BC; u += blockDim.x) vpf[u] = kvq_pair_f32(vp + 2 * u);
    const int group = max(a.group, 1), ga = lo / group;
    for (int u = threadIdx.x; u < KVQ_TC_BC; u += blockDim.x) kgroup[u] = (k0 + u) / group - ga;
}

/* The 8 codes of channel chunk c8 of a key's codes (4 bytes at 4 bits, 2 at 2 bits). */
template <int BITS> __device__ __forceinline__ u32 kvq_tc_word(const unsigned char *codes, int c8) {
    return BITS == 4 ? *(const u32 *)(codes + c8 * 4) : (u32) * (const unsigned short *)(codes + c8 * 2);
}
/* Byte B of x under bytes 1..3 of y: prmt with its selector an immediate (y a register: with a constant y, ptxas makes
 * y the immediate and rebuilds the selector in a register at every use). */
template <int B> __device__ __forceinline__ u32 kvq_tc_byte_under(u32 x, u32 y) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "n"(0x7540 + B));
    return r;
}
/* Code E of a word as an fp32, exactly, without the conversion unit: the code under the exponent of 2^23 (bias:
 * 0x4B000000, read from shared memory so that it stays a register) minus 2^23. At 4 bits lo and hi hold the even and
 * the odd codes a byte each (word & 0x0F0F0F0F, word >> 4 & 0x0F0F0F0F: kvq_tc_spread), so one prmt places a code under
 * 0x4B, where a shift and a mask and an or did. */
template <int BITS, int E> __device__ __forceinline__ float kvq_tc_code(u32 lo, u32 hi, u32 bias) {
    const u32 biased = BITS == 4 ? kvq_tc_byte_under<E / 2>(E & 1 ? hi : lo, bias) : bias | (lo >> (2 * E) & 3u);
    return __uint_as_float(biased) - 8388608.f;
}
/* lo and hi of kvq_tc_code (at 2 bits lo is the word itself). */
template <int BITS> __device__ __forceinline__ void kvq_tc_spread(u32 word, u32 &lo, u32 &hi) {
    lo = BITS == 4 ? word & 0x0F0F0F0Fu : word, hi = word >> 4 & 0x0F0F0F0Fu;
}

/* Key channels E and E + 1 of a chunk (packed[E / 2]) from their converted pairs (p: the chunk's float4s in
 * kvq_tc_convert's layout) or, a group past the staged ones, from their FP16 pairs in global memory (f16: the chunk's
 * 8 pairs). */
template <int BITS, int E>
__device__ __forceinline__ void kvq_tc_key_pairs(u32 lo, u32 hi, u32 bias, const float4 *p, u32 (&packed)[4]) {
    const float4 pr = p[E / 2 * (KVQ_HD / 8)];
    packed[E / 2] = pack_bf16x2(fmaf(kvq_tc_code<BITS, E>(lo, hi, bias), pr.x, pr.y),
                                fmaf(kvq_tc_code<BITS, E + 1>(lo, hi, bias), pr.z, pr.w));
}
template <int BITS, int E>
__device__ __forceinline__ void kvq_tc_key_pairs_f16(u32 lo, u32 hi, u32 bias, const unsigned short *f16,
                                                     u32 (&packed)[4]) {
    const float2 p0 = kvq_pair_f32(f16 + 2 * E), p1 = kvq_pair_f32(f16 + 2 * E + 2);
    packed[E / 2] = pack_bf16x2(fmaf(kvq_tc_code<BITS, E>(lo, hi, bias), p0.x, p0.y),
                                fmaf(kvq_tc_code<BITS, E + 1>(lo, hi, bias), p1.x, p1.y));
}

/* The bf16 of key channels c8 * 8 .. + 7 (twin: dllm__kvq_flash_twin's keys): fmaf(code, scale, min) with the pairs of
 * the key's group, the stage's gi-th (converted by kvq_tc_convert; a group past the staged ones: group gi + tile_lo /
 * group from global memory). */
template <int BITS>
__device__ __forceinline__ uint4 kvq_tc_key8(const kvq_args &a, const unsigned char *codes, const float4 *kpf, int c8,
                                             int gi, int tile_lo, int kvh, u32 bias) {
    u32 lo, hi, packed[4];
    kvq_tc_spread<BITS>(kvq_tc_word<BITS>(codes, c8), lo, hi);
    if (gi < KVQ_TC_PG) {
        const float4 *p = kpf + gi * (KVQ_HD / 2) + c8;
        kvq_tc_key_pairs<BITS, 0>(lo, hi, bias, p, packed);  // two channels at a time, packed as they are made
        kvq_tc_key_pairs<BITS, 2>(lo, hi, bias, p, packed);
        kvq_tc_key_pairs<BITS, 4>(lo, hi, bias, p, packed);
        kvq_tc_key_pairs<BITS, 6>(lo, hi, bias, p, packed);
    } else {
        const int jg = gi + tile_lo / max(a.group, 1);
        const unsigned short *p = a.k_pairs + ((u64)jg * a.n_kv * KVQ_HD + kvh * KVQ_HD + c8 * 8) * 2;
        kvq_tc_key_pairs_f16<BITS, 0>(lo, hi, bias, p, packed);
        kvq_tc_key_pairs_f16<BITS, 2>(lo, hi, bias, p, packed);
        kvq_tc_key_pairs_f16<BITS, 4>(lo, hi, bias, p, packed);
        kvq_tc_key_pairs_f16<BITS, 6>(lo, hi, bias, p, packed);
    }
    return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

/* The bf16 of value channels c8 * 8 .. + 7 of stage key `key` (twin: dllm__kvq_flash_twin's values): SoloQ's level
 * (lut: kvq_soloq_c of each code) times the key's scale, KIVI's fmaf(code, scale, min) with the key's pair (vpf). A
 * SoloQ code is read as its level's byte offset in lut (4 code: the bytes of (word << 2) & 0x3C3C3C3C and
 * (word >> 2) & 0x3C3C3C3C at 4 bits), one byte_perm a code. */
template <int BITS, bool SOLOQ>
__device__ __forceinline__ uint4 kvq_tc_value8(const unsigned char *st, const float2 *vpf, const float *lut, int key,
                                               int c8, u32 bias) {
    const u32 word = kvq_tc_word<BITS>(st + KVQ_STAGE_VC + key * (KVQ_HD / 2), c8);
    u32 packed[4];
    if (SOLOQ) {
        const float sc = *(const float *)(st + KVQ_STAGE_VS + key * 4);
        const u32 lo = BITS == 4 ? word << 2 & 0x3C3C3C3Cu : word << 2, hi = word >> 2 & 0x3C3C3C3Cu;
        float x[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const u32 at = BITS == 4 ? __byte_perm(e & 1 ? hi : lo, 0, 0x4440 + e / 2) : lo >> (2 * e) & 0xCu;
            x[e] = __fmul_rn(*(const float *)((const unsigned char *)lut + at), sc);
        }
#pragma unroll
        for (int e = 0; e < 8; e += 2) packed[e / 2] = pack_bf16x2(x[e], x[e + 1]);
    } else {
        const float2 vp = vpf[key];
        u32 lo, hi;
        kvq_tc_spread<BITS>(word, lo, hi);
        packed[0] = pack_bf16x2(fmaf(kvq_tc_code<BITS, 0>(lo, hi, bias), vp.x, vp.y),
                                fmaf(kvq_tc_code<BITS, 1>(lo, hi, bias), vp.x, vp.y));
        packed[1] = pack_bf16x2(fmaf(kvq_tc_code<BITS, 2>(lo, hi, bias), vp.x, vp.y),
                                fmaf(kvq_tc_code<BITS, 3>(lo, hi, bias), vp.x, vp.y));
        packed[2] = pack_bf16x2(fmaf(kvq_tc_code<BITS, 4>(lo, hi, bias), vp.x, vp.y),
                                fmaf(kvq_tc_code<BITS, 5>(lo, hi, bias), vp.x, vp.y));
        packed[3] = pack_bf16x2(fmaf(kvq_tc_code<BITS, 6>(lo, hi, bias), vp.x, vp.y),
                                fmaf(kvq_tc_code<BITS, 7>(lo, hi, bias), vp.x, vp.y));
    }
    return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

/* A stage decoded into the bf16 K and V tiles [KVQ_TC_BC][KVQ_HD + 8] (twin: dllm__kvq_flash_twin's keys and values): a
 * thread per 8 channels of a key, the keys' chunks then the values' in one loop (a warp's 32 chunks are all keys or all
 * values, as 32 divides KVQ_TC_BC * KVQ_HD / 8; one loop: a thread's share is within one chunk of every other's, where
 * two loops gave some warps two more than others). Keys outside [lo, hi) become zeros (their scores are masked; P = 0
 * times a zero value adds nothing, where a NaN would). BITS and SOLOQ: the cache's, a specialisation each (the branch
 * on them taken once a tile, not once a code). */
template <int BITS, bool SOLOQ>
__device__ void kvq_tc_decode(const kvq_args &a, const unsigned char *st, const float4 *kpf, const float2 *vpf,
                              const int *kgroup, const float *lut, bf16_t *sK, bf16_t *sV, int kvh, int k0, int lo,
                              int hi) {
    constexpr u32 CPR = KVQ_HD / 8, LD = KVQ_HD + 8, N = KVQ_TC_BC * CPR;
    const u32 bias = __float_as_uint(lut[16]);
    for (u32 u = threadIdx.x; u < 2 * N; u += blockDim.x) {  // unsigned: / CPR and % CPR without sign fixes
        const bool value = u >= N;
        const u32 w = value ? u - N : u;
        const int key = w / CPR, c8 = w % CPR, j = k0 + key;
        uint4 x = make_uint4(0u, 0u, 0u, 0u);
        if (j >= lo && j < hi) {
            if (value) {
                x = kvq_tc_value8<BITS, SOLOQ>(st, vpf, lut, key, c8, bias);
            } else {
                x = kvq_tc_key8<BITS>(a, st + key * (KVQ_HD / 2), kpf, c8, kgroup[key], lo, kvh, bias);
            }
        }
        *(uint4 *)((value ? sV : sK) + key * LD + c8 * 8) = x;
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
    __shared__ float lut[17];  // SoloQ's level of each code (kvq_soloq_c), then 2^23 (kvq_tc_code's bias)
    const int CR = ix.warps() * 16, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    bf16_t *sQ = (bf16_t *)smem,
           *sK = sQ + CR * LD;  // sK: the decoded K tiles [2][BC][LD], then the V tiles [2][BC][LD]
    bf16_t *sV = sK + 2 * BC * LD;
    float4 *kpf = (float4 *)(sV + 2 * BC * LD);
    float2 *vpf = (float2 *)(kpf + KVQ_TC_PG * HD / 2);
    int *kgroup = (int *)(vpf + BC);
    unsigned char *raw = (unsigned char *)(kgroup + BC);
    const int R = a.n_head / a.n_kv * a.q_rows, r0 = ix.q_tile() * CR;
    int j0, j1;
    bool quant;
    kvq_split(a, ix.split(), j0, j1, quant);
    // The CTA's last query (the largest sequence index among its rows) bounds the keys worth visiting.
    const int r_last = min(R, r0 + CR) - 1;
    const int i_max = r_last / a.q_rows != r0 / a.q_rows ? a.q_rows - 1 : r_last % a.q_rows;
    const int j1c = min(j1, kvq_visible(a, i_max));
    const int rA = r0 + warp * 16 + g, rB = rA + 8;
    if (threadIdx.x < 17)
        lut[threadIdx.x] = threadIdx.x == 16                        ? 8388608.f
                           : a.soloq && threadIdx.x < (1 << a.bits) ? kvq_soloq_c(threadIdx.x, a.bits)
                                                                    : 0.f;
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
        kvq_tc_convert(a, raw + buf(tile) * KVQ_TC_STAGE, kpf, vpf, kgroup, tile * BC, tile_lo(tile),
                       kvq_tc_groups(a, tile_lo(tile), tile_hi(tile)));
    };
    auto decode = [&](int tile) {
        const unsigned char *st = raw + buf(tile) * KVQ_TC_STAGE;
        bf16_t *k_tile = sK + buf(tile) * BC * LD, *v_tile = sV + buf(tile) * BC * LD;
        const int kvh = ix.kv_head(), k0 = tile * BC, lo = tile_lo(tile), hi = tile_hi(tile);
        if (a.bits == 4 && a.soloq)
            kvq_tc_decode<4, true>(a, st, kpf, vpf, kgroup, lut, k_tile, v_tile, kvh, k0, lo, hi);
        else if (a.bits == 4)
            kvq_tc_decode<4, false>(a, st, kpf, vpf, kgroup, lut, k_tile, v_tile, kvh, k0, lo, hi);
        else if (a.soloq)
            kvq_tc_decode<2, true>(a, st, kpf, vpf, kgroup, lut, k_tile, v_tile, kvh, k0, lo, hi);
        else
            kvq_tc_decode<2, false>(a, st, kpf, vpf, kgroup, lut, k_tile, v_tile, kvh, k0, lo, hi);
    };
    // Rows rA and rB's visible keys, once, in two registers (the decode's specialisations leave them free; computed at
    // each tile they cost two divisions and two remainders a tile and warp).
    const int limA = rA < R ? min(j1, kvq_visible(a, rA % a.q_rows)) : 0,
              limB = rB < R ? min(j1, kvq_visible(a, rB % a.q_rows)) : 0;
    auto multiply = [&](int tile,
                        int b) {  // this warp's rows over the tile's keys, decoded or copied into K and V tiles b
        if (!live) return;
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
 * normalised. The order of the sums is the splits', one split after the other, but nothing else waits on it: lane s of
 * each 32 splits reads split s's max and normaliser and finds its kind (kvq_split) at once, its weight reaches every
 * lane by a shuffle, and the sums stay in registers (lane + 32 k: channel k of the lane), so the reads of later splits'
 * outputs are issued ahead of the sums of earlier ones instead of three dependent global reads a split. A split with
 * no visible key (max -inf) adds nothing, as before. */
__device__ void kvq_flash_combine_row(const kvq_args &a, int i, int h) {
    constexpr int CL = (KVQ_HD + 31) / 32;  // channels a lane (a.hd is the module's KVQ_HD: dllm__kvq_tc_launch)
    __shared__ float acc[256], racc[256], T0[256], T1[256];
    const int lane = threadIdx.x, hd = a.hd, n_splits = kvq_n_splits(a);
    const u64 stride = (u64)a.n_head * a.q_rows * (hd + 2);
    const float *P = a.partial + ((u64)h * a.q_rows + i) * (hd + 2);
    float mx = -DLLM_INF;
    for (int s = lane; s < n_splits; s += 32) mx = fmaxf(mx, P[s * stride + hd]);
    for (int x = 16; x > 0; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
    float sum[CL], rsum[CL], l = 0.f;
#pragma unroll
    for (int k = 0; k < CL; k++) sum[k] = 0.f, rsum[k] = 0.f;
    for (int s0 = 0; s0 < n_splits; s0 += 32) {
        const int n = min(32, n_splits - s0);
        float ws = 0.f, ls = 0.f;
        bool live = false, rotated = false;
        if (lane < n) {
            const float ms = P[(s0 + lane) * stride + hd];
            int j0, j1;
            bool quant;
            kvq_split(a, s0 + lane, j0, j1, quant);
            live = ms != -DLLM_INF, rotated = quant && a.soloq;
            ws = exp2_ftz(ms - mx), ls = P[(s0 + lane) * stride + hd + 1];
        }
        const u32 lives = __ballot_sync(0xffffffffu, live), rots = __ballot_sync(0xffffffffu, rotated);
#pragma unroll 8
        for (int k = 0; k < n; k++) {
            const float w = __shfl_sync(0xffffffffu, ws, k), lk = __shfl_sync(0xffffffffu, ls, k);
            const float *o = P + (s0 + k) * stride;
            const bool add = lives >> k & 1u, rot = rots >> k & 1u;
            if (add) l = fmaf(w, lk, l);
#pragma unroll
            for (int c = 0; c < CL; c++) {
                const float x = lane + 32 * c < hd ? o[lane + 32 * c] : 0.f;
                if (add && rot) rsum[c] = fmaf(w, x, rsum[c]);
                if (add && !rot) sum[c] = fmaf(w, x, sum[c]);
            }
        }
    }
#pragma unroll
    for (int c = 0; c < CL; c++)
        if (lane + 32 * c < hd) acc[lane + 32 * c] = sum[c], racc[lane + 32 * c] = rsum[c];
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
