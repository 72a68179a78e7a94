__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ int kv_tile_at(int i, int n_tiles, int lo, int hi) {
    int head = lo, mid = n_tiles - hi;
    return i < head ? i : (i < head + mid ? i - head + hi : i - head - mid + lo);
}

/* flash_attn computes on head dimensions rounded up to a multiple of 16 (the k16 of an mma, and the pairs of 8-column
 * groups ldmatrix x4 loads): the extra columns of the Q, K and V tiles are zeros, so they add nothing to a score or
 * to an output column, and are never stored. 64 and 128 are their own padding (the same code as without it). */
__device__ constexpr int hd_pad(int hd) { return (hd + 15) / 16 * 16; }

/* A ROWS x HD tile from global rows row0.. (stride elements apart; rows at or past n_valid read as zeros) into shared
 * rows hd_pad(HD) + 8 apart, the padding columns zero-filled too, copied by THREADS threads. Where a row's chunks
 * divide THREADS, a thread keeps one 16-byte chunk column and steps STEP rows a pass: with the pass count known at
 * compile time a copy costs a few integer instructions (a generic loop over chunk indices took ~30 a copy). Other
 * head dims (40, 72, 96, ...) take that generic loop, chunk indices divided by a compile-time constant. */
template <int HD, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(bf16_t *dst, const bf16_t *src, int stride, int row0, int n_valid) {
    constexpr int HDP = hd_pad(HD), LD = HDP + 8, CH = HDP / 8;
    if constexpr (THREADS % CH == 0) {
        constexpr int STEP = THREADS / CH, PASSES = (ROWS + STEP - 1) / STEP;
        const int chunk = threadIdx.x % CH, r0 = threadIdx.x / CH;
        const bool real = HDP == HD || chunk < HD / 8;
        const u32 d0 = smem_u32(dst + r0 * LD + chunk * 8);
        const bf16_t *s0 = src + (u64)(row0 + r0) * stride + chunk * 8;
#pragma unroll
        for (int p = 0; p < PASSES; p++) {
            if (ROWS % STEP != 0 && r0 + p * STEP >= ROWS) break;  // a tile shorter than a pass
            const bool ok = real && row0 + r0 + p * STEP < n_valid;
            cp_async16(d0 + p * STEP * LD * 2, ok ? s0 + (u64)p * STEP * stride : src, ok);
        }
    } else {
        constexpr int CHUNKS = ROWS * CH, PASSES = (CHUNKS + THREADS - 1) / THREADS;
        const u32 d0 = smem_u32(dst);
#pragma unroll 1  // unrolled, the addresses of every pass stay live: spills at head dims 232 and 240
        for (int p = 0; p < PASSES; p++) {
            const int i = threadIdx.x + p * THREADS, r = i / CH, chunk = i % CH;
            if (CHUNKS % THREADS != 0 && i >= CHUNKS) break;
            const bool ok = chunk < HD / 8 && row0 + r < n_valid;
            cp_async16(d0 + (r * LD + chunk * 8) * 2, ok ? src + (u64)(row0 + r) * stride + chunk * 8 : src, ok);
        }
    }
}

/* The i-th K and V tiles of the visiting order (key tile `tile`) into ring slot i % NS. */
template <int HD, int BC, int NS, int THREADS>
__device__ __forceinline__ void load_kv(bf16_t *sK, bf16_t *sV, const bf16_t *K, const bf16_t *V, const attn_args &a,
                                        int i, int tile) {
    constexpr int LD = hd_pad(HD) + 8;
    load_tile<HD, BC, THREADS>(sK + ((unsigned)i % NS) * BC * LD, K, a.kv_stride, tile * BC, a.seq);
    load_tile<HD, BC, THREADS>(sV + ((unsigned)i % NS) * BC * LD, V, a.kv_stride, tile * BC, a.seq);
}

/* Saves (SAVE) or restores the online-softmax registers of one thread: m, l (per-thread partial sums) and
 * the unnormalised O, field by field so that consecutive threads touch consecutive words. Only O's HD real
 * columns (DT = HD / 8 of the hd_pad(HD) / 8 groups): the padding columns stay zero. */
template <int HD, int MT, int THREADS, bool SAVE>
__device__ __forceinline__ void fa_state_io(const attn_args &a, float (&o)[MT][hd_pad(HD) / 8][4], float (&m)[MT][2],
                                            float (&l)[MT][2]) {
    constexpr int DT = HD / 8;
    // Computed here, not kept live across the KV loop: registers are the budget at head dim 128.
    float *state =
        a.fa_state +
        ((u64)(blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * (MT * (4 + DT * 4) * THREADS) +
        threadIdx.x;
    int f = 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (SAVE) {
                state[(f++) * THREADS] = m[mt][r];
                state[(f++) * THREADS] = l[mt][r];
            } else {
                m[mt][r] = state[(f++) * THREADS];
                l[mt][r] = state[(f++) * THREADS];
            }
        }
#pragma unroll
        for (int d = 0; d < DT; d++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (SAVE)
                    state[(f++) * THREADS] = o[mt][d][e];
                else
                    o[mt][d][e] = state[(f++) * THREADS];
            }
    }
}

/* The KV tiles [i_begin, i_end) of the visiting order this CTA streams: all of them, those after the
 * cached early tiles (FACache resume), or one contiguous share of them (split-KV). */
__device__ __forceinline__ void kv_range(const attn_args &a, int split, int n_tiles, int n_early, bool resume,
                                         int &i_begin, int &i_end) {
    i_begin = resume ? n_early : 0;
    i_end = n_tiles;
    if (a.kv_splits > 1) {
        const int per = (n_tiles + a.kv_splits - 1) / a.kv_splits;
        i_begin = min(n_tiles, split * per);
        i_end = min(n_tiles, i_begin + per);
    }
}

/* Split-KV: a CTA's unnormalised output, running max and normaliser per query row, for attn_combine.
 * Layout: [batch][head][split][q_rows][HD + 2] floats (O's HD real columns, then m, then l). */
template <int HD, int MT, int DT>
__device__ __forceinline__ void store_partial(const attn_args &a, int b, int h, int split, int q0, int warp, int g,
                                              int t, float (&o)[MT][DT][4], float (&m)[MT][2], float (&l)[MT][2]) {
    float *P = a.partial + (((u64)b * gridDim.y + h) * a.kv_splits + split) * a.q_rows * (HD + 2);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lr = l[mt][r];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            const int row = q0 + (warp * MT + mt) * 16 + g + 8 * r;
            if (row >= a.q_rows) continue;
            float *p = P + (u64)row * (HD + 2);
#pragma unroll
            for (int d = 0; d < HD / 8; d++)
                *(float2 *)(p + d * 8 + 2 * t) = make_float2(o[mt][d][2 * r], o[mt][d][2 * r + 1]);
            if (t == 0) p[HD] = m[mt][r], p[HD + 1] = lr;
        }
}

/* 2^x on the special-function unit, subnormal results flushed to zero: exp2f's subnormal handling costs
 * extra instructions per score, and a probability below 2^-126 of the row's largest adds nothing. */
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* The scores of one m16 row pair in the mma accumulator layout, s[j][e]: row g + 8 (e >> 1), key k0 + 8j + 2t + (e & 1)
 * (a wgmma accumulator has the same layout, 16 rows per warp). The helpers below are the online softmax both
 * attention kernels share. Keys past seq or padded out (valid: null or this sequence's flags) get -inf. */
template <int NT>
__device__ __forceinline__ void mask_keys(float (&s)[NT][4], const unsigned char *valid, int seq, int k0, int t) {
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = k0 + j * 8 + 2 * t + (e & 1);
            if (key >= seq || (valid && !valid[key])) s[j][e] = -DLLM_INF;
        }
}

/* [block-causal mask] Block diffusion's (a.mask_block > 0): query row `row` (sequence index q_index0 + row) sees the
 * keys before the end of its block of mask_block indices. Twin: dllm__cpu_attention's n_visible. */
__device__ __forceinline__ int visible_keys(const attn_args &a, int row) {
    return min(a.seq, ((a.q_index0 + row) / a.mask_block + 1) * a.mask_block);
}
/* mask_keys with a key limit per row of the m16 pair (rows g and g + 8): keys at or past end0 / end1 get -inf. */
template <int NT>
__device__ __forceinline__ void mask_keys_rows(float (&s)[NT][4], const unsigned char *valid, int end0, int end1,
                                               int k0, int t) {
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = k0 + j * 8 + 2 * t + (e & 1);
            if (key >= (e >> 1 ? end1 : end0) || (valid && !valid[key])) s[j][e] = -DLLM_INF;
        }
}

/* The online-softmax update of rows g and g + 8 over one tile of scores, in two halves. softmax_scores: the running
 * max m (scaled, log2 domain), the per-thread partial normaliser l and the correction corr that rescales what was
 * accumulated under the old max; the scores become their unnormalised probabilities. Scores stay unscaled until the
 * exponent, where one FFMA applies scale and max. rescale_o: the unnormalised output o times corr. flash_attn_wg runs
 * the two apart (o is in flight in a wgmma between them); the order of operations on o is the same either way. */
template <int NT>
__device__ __forceinline__ void softmax_scores(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&corr)[2],
                                               float scale) {
    float mx0 = -DLLM_INF, mx1 = -DLLM_INF;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
        mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    const float n0 = fmaxf(m[0], mx0 * scale), n1 = fmaxf(m[1], mx1 * scale);
    const float base0 = n0 == -DLLM_INF ? 0.f : n0, base1 = n1 == -DLLM_INF ? 0.f : n1;
    corr[0] = exp2_ftz(m[0] - base0);
    corr[1] = exp2_ftz(m[1] - base1);
    m[0] = n0;
    m[1] = n1;
    l[0] *= corr[0];
    l[1] *= corr[1];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        s[j][0] = exp2_ftz(fmaf(s[j][0], scale, -base0));
        s[j][1] = exp2_ftz(fmaf(s[j][1], scale, -base0));
        s[j][2] = exp2_ftz(fmaf(s[j][2], scale, -base1));
        s[j][3] = exp2_ftz(fmaf(s[j][3], scale, -base1));
        l[0] += s[j][0] + s[j][1];
        l[1] += s[j][2] + s[j][3];
    }
}

template <int DT> __device__ __forceinline__ void rescale_o(float (&o)[DT][4], const float (&corr)[2]) {
    // Once the running max settles, most tiles leave it unchanged: corr is then exactly 1 and the
    // rescale of O (128 multiplies per thread at head dim 128) is skipped, which changes no bit.
    if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
        for (int d = 0; d < DT; d++) {
            o[d][0] *= corr[0];
            o[d][1] *= corr[0];
            o[d][2] *= corr[1];
            o[d][3] *= corr[1];
        }
    }
}

template <int NT, int DT>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&o)[DT][4],
                                               float scale) {
    float corr[2];
    softmax_scores<NT>(s, m, l, corr, scale);
    rescale_o<DT>(o, corr);
}

/* Keys 16 kk .. 16 kk + 15 of the probabilities as a bf16 A fragment: (g, 2t), (g + 8, 2t), (g, 2t + 8),
 * (g + 8, 2t + 8). */
template <int NT> __device__ __forceinline__ void pack_p(const float (&s)[NT][4], int kk, u32 (&pa)[4]) {
    pa[0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
    pa[1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
    pa[2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

/* One warp, one KV tile of BC keys: S = Q K^T, the online-softmax update, O += P V. Keys past the
 * sequence or padded out are masked; full tiles without a padding mask (nearly all) skip that test.
 * HD here is the padded head dimension (a multiple of 16) the shared tiles are laid out for; row0 is the warp's first
 * query row (the block-causal mask's rows). */
template <int HD, int BC, int MT>
__device__ __forceinline__ void flash_tile(const attn_args &a, int b, u32 q_warp, u32 k_s, u32 v_s, int k0, int row0,
                                           int lane, int t, float (&o)[MT][HD / 8][4], float (&m)[MT][2],
                                           float (&l)[MT][2]) {
    constexpr int LD = HD + 8, NT = BC / 8, KS = HD / 16,
                  DT = HD / 8;  // LD in elements; addresses advance 2 bytes each
    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        u32 qf[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) ldmatrix_x4(qf[mt], q_warp + (mt * 16 * LD + kk * 16) * 2);
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            u32 kb[4];
            ldmatrix_x4(kb, k_s + ((j * 8 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8) * 2);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_bf16(s[mt][j], qf[mt], kb[0], kb[1]);
                mma_bf16(s[mt][j + 1], qf[mt], kb[2], kb[3]);
            }
        }
    }
    if (a.key_valid || k0 + BC > a.seq || a.mask_block) {
        const unsigned char *valid = a.key_valid ? a.key_valid + (u64)b * a.seq : 0;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int row = row0 + mt * 16 + (lane >> 2);
            mask_keys_rows<NT>(s[mt], valid, a.mask_block ? visible_keys(a, row) : a.seq,
                               a.mask_block ? visible_keys(a, row + 8) : a.seq, k0, t);
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) online_softmax<NT, DT>(s[mt], m[mt], l[mt], o[mt], a.scale_log2);
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) {
        u32 pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) pack_p<NT>(s[mt], kk, pa[mt]);
#pragma unroll
        for (int d = 0; d < DT; d += 2) {
            u32 vb[4];
            ldmatrix_x4_trans(
                vb, v_s + ((kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + d * 8 + (lane >> 4) * 8) * 2);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_bf16(o[mt][d], pa[mt], vb[0], vb[1]);
                mma_bf16(o[mt][d + 1], pa[mt], vb[2], vb[3]);
            }
        }
    }
}

/* [varlen] The flash_attn work item of this CTA (dllm__attn_varlen_work): (query tile, entry, split-KV share, 0). */
__device__ __forceinline__ int4 varlen_item(const attn_args &a) {
    return ((const int4 *)a.varlen_work)[blockIdx.x];  // (tile, entry, split, 0)
}

/* [varlen] A batched forward's attention: CTA x works on item x of the work list a.varlen_work (dllm__attn_varlen_work:
 * only the tiles that hold query rows, so no CTA is launched to return at once): query tile `tile` of entry z of a
 * concatenation, its share `split` of the entry's own varlen_splits[.] split-KV shares, its queries rows [q_offsets[z],
 * q_offsets[z + 1]) of q and o, its keys rows [kv_offsets[z], kv_offsets[z + 1]) of k and v. a becomes that entry's
 * arguments as a launch of batch 1 with its shares would hold them (partial states in its own region of a.partial),
 * so its bits never depend on the other sequences (no FACache, no key mask: dllm__attn_varlen_launch). */
template <bool SPLITS> __device__ __forceinline__ void varlen_sequence(attn_args &a, int &tile, int &split) {
    const int4 w = varlen_item(a);
    const int z = w.y, q0 = a.q_offsets[z], k0 = a.kv_offsets[z];
    tile = w.x, split = SPLITS ? w.z : 0;
    if (SPLITS && a.varlen_splits) a.partial += a.varlen_splits[2 * z + 1];
    a.kv_splits = SPLITS && a.varlen_splits ? a.varlen_splits[2 * z] : 1;
    a.q_rows = a.q_offsets[z + 1] - q0, a.seq = a.kv_offsets[z + 1] - k0;
    a.q += (u64)q0 * a.q_stride, a.o += (u64)q0 * a.o_stride;
    a.k += (u64)k0 * a.kv_stride, a.v += (u64)k0 * a.kv_stride;
    a.q_bstride = a.o_bstride = 0;
    if (a.varlen_masks)
        a.mask_block = a.varlen_masks[2 * z], a.q_index0 = a.varlen_masks[2 * z + 1];  // [block-causal mask]
}

/* Any head dim HD that is a multiple of 8 up to 256, computed on hd_pad(HD) columns (tiles per head dim:
 * dllm__attn_tiles). Each warp owns MT m16 tiles (16 * MT query rows), so every K and V fragment it loads from shared
 * memory feeds MT tensor-core ops (FA2's layout). Q fragments are re-read from shared memory at each
 * k-step rather than held in registers: that keeps HD = 128 with MT = 2 under 255 registers. The online
 * softmax is online_softmax's (softmax_scores, then rescale_o), shared with flash_attn_wg. VARLEN (varlen_sequence):
 * one more instantiation, in its own module loaded by the first batched forward, so the solo paths' code stays as it
 * was. */
template <int HD, int BR, int BC, int MT, int NS, bool VARLEN = false>
__global__ void __launch_bounds__(BR * 2 / MT) flash_attn(attn_args a) {
    pdl_enter();
    int varlen_tile = 0, varlen_split = 0;
    if constexpr (VARLEN) {
        // Above head dim 128 no register is left for a split index (dllm__attn_varlen_split_max_hd): no splits there.
        varlen_sequence<(HD <= 128)>(a, varlen_tile, varlen_split);
    }
    // Two m16 tiles per warp hold the scores of only 32 keys in registers at head dim 128: a larger tile
    // (fewer barriers per key) is computed in 32-key slices, in key order.
    constexpr int HDP = hd_pad(HD), LD = HDP + 8, DT = HDP / 8, THREADS = BR * 2 / MT,
                  SUB = BC > 32 && MT > 1 ? 32 : BC;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16_t *sQ = (bf16_t *)smem, *sK = sQ + BR * LD, *sV = sK + NS * BC * LD;  // a ring of NS K and V tiles
    const int qt = VARLEN ? varlen_tile : blockIdx.x, h = blockIdx.y, b = VARLEN ? 0 : blockIdx.z / a.kv_splits,
              split = VARLEN ? (HD <= 128 ? varlen_split : 0) : blockIdx.z % a.kv_splits;
    const int kvh = h / a.group;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int q0 = qt * BR, n_tiles = (a.seq + BC - 1) / BC;
    // [varlen] The tile's first row and the share, read again from the work list (a plain load, which the KV loop's
    // barriers keep the compiler from reusing) where the loop and the epilogue need them: held across the loop they
    // took registers the short tiles' kernels lack (the dense grid's blockIdx cost none).
    auto q0_again = [&] { return VARLEN ? varlen_item(a).x * BR : q0; };
    auto split_again = [&] { return VARLEN ? (HD <= 128 ? varlen_item(a).z : 0) : split; };
    const bf16_t *Q = a.q + b * a.q_bstride + h * HD;
    const bf16_t *K = a.k + (u64)b * a.seq * a.kv_stride + kvh * HD;
    const bf16_t *V = a.v + (u64)b * a.seq * a.kv_stride + kvh * HD;
    int late_lo = 0, late_hi = 0;
    if (a.st && a.st->block_end > a.st->block_begin) {
        late_lo = a.st->block_begin / BC;
        late_hi = min(n_tiles, (a.st->block_end + BC - 1) / BC);
    }
    // FACache (LaCache, Algorithm 1): a query tile outside the block keeps, across the block's steps, its
    // state over the KV tiles outside the block. Saved and restored register for register, so resuming
    // continues exactly the computation the plain order performs.
    const int n_early = n_tiles - (late_hi - late_lo);
    const bool q_in_block = late_hi > late_lo && q0 < a.st->block_end && q0 + BR > a.st->block_begin;
    const bool cached = a.fa_mode != 0 && !q_in_block;
    int i_begin, i_end;
    kv_range(a, split, n_tiles, n_early, cached && a.fa_mode == 2, i_begin, i_end);
    // [block-causal mask] In the plain order the key tiles past the query tile's last visible key hold no visible key:
    // not visited (a fully masked tile changes no register of the online softmax, so this changes no bit).
    if (a.mask_block && late_hi == late_lo)
        i_end = max(i_begin, min(i_end, (visible_keys(a, min(q0 + BR, a.q_rows) - 1) + BC - 1) / BC));

    load_tile<HD, BR, THREADS>(sQ, Q, a.q_stride, q0, a.q_rows);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < NS - 1; s++) {
        if (i_begin + s < i_end)
            load_kv<HD, BC, NS, THREADS>(sK, sV, K, V, a, i_begin + s,
                                         kv_tile_at(i_begin + s, n_tiles, late_lo, late_hi));
        cp_async_commit();
    }

    float o[MT][DT][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int d = 0; d < DT; d++) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.f;
        m[mt][0] = m[mt][1] = -DLLM_INF;
        l[mt][0] = l[mt][1] = 0.f;
    }
    if (cached && a.fa_mode == 2) fa_state_io<HD, MT, THREADS, false>(a, o, m, l);
    if (cached && a.fa_mode == 1 && n_early == 0) fa_state_io<HD, MT, THREADS, true>(a, o, m, l);
    const u32 q_warp = smem_u32(sQ + (warp * 16 * MT + (lane & 15)) * LD + (lane >> 4) * 8);
    // A warp whose rows are all past the last query (a short K/V-cache step) only helps load tiles.
    const bool live = q0 + warp * 16 * MT < a.q_rows;

    for (int i = i_begin; i < i_end; i++) {
        const int stage = (int)((unsigned)i % NS);
        if (i + NS - 1 < i_end)  // into the slot of tile i - 1, which every warp is done with
            load_kv<HD, BC, NS, THREADS>(sK, sV, K, V, a, i + NS - 1,
                                         kv_tile_at(i + NS - 1, n_tiles, late_lo, late_hi));
        cp_async_commit();
        cp_async_wait<NS - 1>();
        __syncthreads();
        const u32 k_s = smem_u32(sK + stage * BC * LD), v_s = smem_u32(sV + stage * BC * LD);
        const int k0 = kv_tile_at(i, n_tiles, late_lo, late_hi) * BC;
        if (live)
#pragma unroll 1
            for (int sub = 0; sub < BC; sub += SUB)  // not unrolled: two slices in flight would not fit the registers
                flash_tile<HDP, SUB, MT>(a, b, q_warp, k_s + sub * LD * 2, v_s + sub * LD * 2, k0 + sub,
                                         q0_again() + warp * 16 * MT, lane, t, o, m, l);
        if (cached && a.fa_mode == 1 && i == n_early - 1) fa_state_io<HD, MT, THREADS, true>(a, o, m, l);
        __syncthreads();
    }

    if (a.kv_splits > 1) {
        store_partial<HD, MT, DT>(a, b, h, split_again(), q0_again(), warp, g, t, o, m, l);
        return;
    }
    bf16_t *O = a.o + b * a.o_bstride + h * HD;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float l0 = l[mt][0], l1 = l[mt][1];
#pragma unroll
        for (int x = 1; x <= 2; x <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, x);
            l1 += __shfl_xor_sync(0xffffffffu, l1, x);
        }
        const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
        const int r0 = q0_again() + (warp * MT + mt) * 16 + g, r1 = r0 + 8;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {  // the real columns
            int col = d * 8 + 2 * t;
            if (r0 < a.q_rows)
                *(u32 *)(O + (u64)r0 * a.o_stride + col) = pack_bf16x2(o[mt][d][0] * inv0, o[mt][d][1] * inv0);
            if (r1 < a.q_rows)
                *(u32 *)(O + (u64)r1 * a.o_stride + col) = pack_bf16x2(o[mt][d][2] * inv1, o[mt][d][3] * inv1);
        }
    }
}

/* Split-KV: merges the kv_splits partial states of one query row and head, in split order (fixed, so the
 * result does not depend on scheduling). One thread per output column. VARLEN: CTA x merges the shares of the row and
 * entry of item x of a.varlen_work (dllm__attn_varlen_work: the rows of entries with more than one share only),
 * in varlen_sequence's layout. */
template <int HD, bool VARLEN = false> __global__ void __launch_bounds__(HD) attn_combine(attn_args a) {
    pdl_enter();
    int row = blockIdx.x;
    const int h = blockIdx.y, d = threadIdx.x;
    int b = blockIdx.z;
    if constexpr (VARLEN) {
        const int2 w = ((const int2 *)a.varlen_work)[blockIdx.x];  // (entry, row)
        b = w.x, row = w.y;
        const int q0 = a.q_offsets[b];
        a.partial += a.varlen_splits[2 * b + 1];
        a.kv_splits = a.varlen_splits[2 * b];
        a.q_rows = a.q_offsets[b + 1] - q0;
        a.o += (u64)q0 * a.o_stride, a.o_bstride = 0, b = 0;
    }
    const float *P = a.partial + ((u64)b * gridDim.y + h) * a.kv_splits * a.q_rows * (HD + 2) + (u64)row * (HD + 2);
    const u64 split_stride = (u64)a.q_rows * (HD + 2);
    float mx = -DLLM_INF;
    for (int s = 0; s < a.kv_splits; s++) mx = fmaxf(mx, P[s * split_stride + HD]);
    float acc = 0.f, l = 0.f;
    for (int s = 0; s < a.kv_splits; s++) {
        const float ms = P[s * split_stride + HD];
        if (ms == -DLLM_INF) continue;  // a share with no visible key
        const float w = exp2_ftz(ms - mx);
        acc += w * P[s * split_stride + d];
        l += w * P[s * split_stride + HD + 1];
    }
    a.o[b * a.o_bstride + (u64)row * a.o_stride + h * HD + d] = f32_to_bf16(l > 0.f ? acc / l : 0.f);
}
