/* d += A (64 x 16, registers) . B (16 x N, shared, MN-major: transposed) */
template <int N> __device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const u32 (&a)[4], u64 desc_b) {
    if constexpr (N == 64)
        asm volatile(WG_RS32("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", ", 1, 1, 1")
                     : WG_ACC_N64(d)
                     : WG_RS_IN(a[0], a[1], a[2], a[3], desc_b));
    else
        asm volatile(WG_RS64("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", ", 1, 1, 1")
                     : WG_ACC_N128(d)
                     : WG_RS_IN(a[0], a[1], a[2], a[3], desc_b));
}

struct attn_tensor_maps {
    tensor_map q, k, v;
};

/* A ROWS x HD tile at rows y.. of head column col0 into the swizzled layout: column block c64 of all rows, then the
 * next (one box each). */
template <int HD, int ROWS>
__device__ __forceinline__ void tma_tile(u32 dst, const tensor_map &map, int col0, int y, int z, u32 bar) {
#pragma unroll
    for (int c = 0; c < HD / 64; c++) tma_load(dst + c * ROWS * 128, map, col0 + c * 64, y, z, bar);
}

/* Issues the scores of one warpgroup's 64 rows against a tile of BC keys (not waited for). */
template <int HD, int BC> __device__ __forceinline__ void wg_scores(float (&s)[BC / 8][4], u32 q_wg, u32 k_s) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wgmma_ss<BC>(s, wg_desc(q_wg + (kk >> 2) * 128 * 128 + (kk & 3) * 32),
                     wg_desc(k_s + (kk >> 2) * BC * 128 + (kk & 3) * 32), kk > 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* Issues O += P V for a tile of BC keys (not waited for). A 64-wide head is one column block: its descriptor keeps
 * the default block distance, which the hardware does not read then. */
template <int HD, int BC>
__device__ __forceinline__ void wg_pv(float (&o)[HD / 8][4], const u32 (&p)[BC / 16][4], u32 v_s) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++)
        wgmma_rs<HD>(o, p[kk], wg_desc(v_s + kk * 16 * 128, HD > 64 ? BC * 128 : 1024));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* The producer warpgroup's one working thread: the Q tile, then every K and V tile of the CTA into its ring slot i % NS
 * once both consumer warpgroups have released the slot's previous tile (empty). K and V complete on separate barriers,
 * so the scores may start before V is in. */
template <int HD, int BC, int NS>
__device__ __forceinline__ void wg_produce(const attn_tensor_maps &tm, u32 sQ, u32 sK, u32 sV, u32 q_full, u32 k_full,
                                           u32 v_full, u32 empty, int q0, int h, int kvh, int b, int n_tiles) {
    constexpr int TILE = BC * HD * 2;
    mbar_expect_tx(q_full, 128 * HD * 2);
    tma_tile<HD, 128>(sQ, tm.q, h * HD, q0, b, q_full);
    for (int i = 0; i < n_tiles; i++) {
        const int slot = i % NS;
        if (i >= NS) mbar_wait(empty + slot * 8, (i / NS + 1) & 1);
        mbar_expect_tx(k_full + slot * 8, TILE);
        tma_tile<HD, BC>(sK + slot * TILE, tm.k, kvh * HD, i * BC, b, k_full + slot * 8);
        mbar_expect_tx(v_full + slot * 8, TILE);
        tma_tile<HD, BC>(sV + slot * TILE, tm.v, kvh * HD, i * BC, b, v_full + slot * 8);
    }
}

/* FA3's layout: a producer warpgroup streams Q, K and V by TMA into a ring of NS slots (mbarriers, no CTA barrier in
 * the loop), and two consumer warpgroups of 64 query rows take turns on the tensor cores: each issues a tile's scores
 * when the other's are done (named barriers 1 and 2, strictly alternating), so one's softmax overlaps the other's
 * GEMMs. Every consumer warp releases a slot after its P V is done (a warpgroup whose rows are all past q_rows too:
 * it keeps the barrier protocol). The producer is a whole warpgroup because registers are rebalanced per warpgroup
 * (setmaxnreg): each of the SM's four register banks holds one warp of every warpgroup, 3 x 168 registers a thread
 * as launched; the producer gives its share to the consumers (24 + 2 x 240 <= 512), whose scores, probabilities and
 * output need about 200. */
template <int HD, int BC, int NS>
__global__ void __launch_bounds__(384, 1) flash_attn_wg(attn_args a, const __grid_constant__ attn_tensor_maps tm) {
    constexpr int BR = 128, TILE = BC * HD * 2;
    extern __shared__ __align__(16) unsigned char smem[];
    const u32 sQ = (smem_u32(smem) + 1023) & ~1023u, sK = sQ + BR * HD * 2,
              sV = sK + NS * TILE;  // 1024-byte swizzle atoms
    const u32 q_full = sV + NS * TILE, k_full = q_full + 8, v_full = k_full + NS * 8, empty = v_full + NS * 8;
    pdl_enter();
    // [block-causal mask] The query tiles in reverse, so that those with the most visible keys start first and the
    // launch does not end on a tail of long CTAs; their key tiles past the last row's visible keys are not visited.
    const int qt = a.mask_block ? gridDim.x - 1 - blockIdx.x : blockIdx.x, h = blockIdx.y, b = blockIdx.z,
              kvh = h / a.group;
    const int q0 = qt * BR;
    const int n_tiles = (min(a.seq, a.mask_block ? visible_keys(a, min(q0 + BR, a.q_rows) - 1) : a.seq) + BC - 1) / BC;
    if (threadIdx.x == 256) {
        mbar_init(q_full, 1);
        for (int s = 0; s < NS; s++) {
            mbar_init(k_full + s * 8, 1);
            mbar_init(v_full + s * 8, 1);
            mbar_init(empty + s * 8, 8);  // lane 0 of each consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x >= 256) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (threadIdx.x == 256)
            wg_produce<HD, BC, NS>(tm, sQ, sK, sV, q_full, k_full, v_full, empty, q0, h, kvh, b, n_tiles);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2,
              t = lane & 3;
    float o[HD / 8][4], m[2] = {-DLLM_INF, -DLLM_INF}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    const u32 q_wg = sQ + wg * 64 * 128;
    const unsigned char *valid = a.key_valid ? a.key_valid + (u64)b * a.seq : 0;
    const float scale = a.scale_log2;
    // Barrier 1 + wg is warpgroup wg's turn; warpgroup 1's last arrival would have no taker.
    auto my_turn = [&] {
        if (wg == 0)
            named_bar_sync(1, 256);
        else
            named_bar_sync(2, 256);
    };
    auto their_turn = [&](int i) {
        if (wg == 0)
            named_bar_arrive(2, 256);
        else if (i + 1 < n_tiles)
            named_bar_arrive(1, 256);
    };
    // Rows g and g + 8 of this warp see keys [0, end0) and [0, end1); the CTA's first row sees the fewest.
    const int row_g = q0 + wg * 64 + warp * 16 + g;
    const int end0 = a.mask_block ? visible_keys(a, row_g) : a.seq,
              end1 = a.mask_block ? visible_keys(a, row_g + 8) : a.seq,
              end_first = a.mask_block ? visible_keys(a, q0) : a.seq;
    auto softmax_of = [&](float(&s)[BC / 8][4], int i, float(&corr)[2]) {
        if (valid || (i + 1) * BC > end_first) mask_keys_rows<BC / 8>(s, valid, end0, end1, i * BC, t);
        softmax_scores<BC / 8>(s, m, l, corr, scale);
    };
    if (wg == 1) named_bar_arrive(1, 256);  // warpgroup 0 takes the first turn
    mbar_wait(q_full, 0);

    // FA3's intra-warpgroup overlap: tile i's scores are issued together with tile i - 1's P V, and tile i's softmax
    // runs while that P V is on the tensor cores; O is rescaled for tile i - 1 just before its P V, as in order. A
    // warpgroup whose rows are all past q_rows computes on TMA's zero rows and stores nothing: no wgmma sits in a
    // branch (ptxas serialises wgmma whose registers it cannot follow through divergent paths).
    float s[BC / 8][4], corr[2];
    u32 p[BC / 16][4];
    mbar_wait(k_full, 0);
    my_turn();
    wg_scores<HD, BC>(s, q_wg, sK);
    their_turn(0);
    wg_wait_for<0>(s);
    softmax_of(s, 0, corr);
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) pack_p<BC / 8>(s, kk, p[kk]);
    for (int i = 1; i < n_tiles; i++) {
        const int slot = i % NS, prev = (i - 1) % NS;
        mbar_wait(k_full + slot * 8, (i / NS) & 1);
        my_turn();
        wg_scores<HD, BC>(s, q_wg, sK + slot * TILE);
        mbar_wait(v_full + prev * 8, ((i - 1) / NS) & 1);
        rescale_o<HD / 8>(o, corr);
        wg_pv<HD, BC>(o, p, sV + prev * TILE);
        their_turn(i);
        wg_wait_for<1>(s);
        softmax_of(s, i, corr);
        wg_wait_for<0>(o);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + prev * 8);
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) pack_p<BC / 8>(s, kk, p[kk]);
    }
    const int last = (n_tiles - 1) % NS;
    mbar_wait(v_full + last * 8, ((n_tiles - 1) / NS) & 1);
    rescale_o<HD / 8>(o, corr);
    wg_pv<HD, BC>(o, p, sV + last * TILE);
    wg_wait_for<0>(o);

    bf16_t *O = a.o + b * a.o_bstride + h * HD;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lr = l[r];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        const float inv = lr > 0.f ? 1.f / lr : 0.f;
        const int row = q0 + wg * 64 + warp * 16 + g + 8 * r;
        if (row >= a.q_rows) continue;
#pragma unroll
        for (int d = 0; d < HD / 8; d++)
            *(u32 *)(O + (u64)row * a.o_stride + d * 8 + 2 * t) = pack_bf16x2(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
    }
}
