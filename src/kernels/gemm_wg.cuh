struct gemm_tensor_maps {
    tensor_map x, w, y;
};  // boxes of 64 columns x: 128 rows (x), BN / 2 (w), 64 (y)

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
/* Arrives on the mbarrier at the same shared-memory offset in CTA `rank` of the cluster. The default (CTA-scope)
 * release: the arrival only says that this warp's wgmma reads of the slot are done. With a cluster-scope release the
 * kernel took about 1.5x as long on an H200. */
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar, u32 rank) {
    asm volatile(
        "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::
            "r"(bar),
        "r"(rank)
        : "memory");
}
/* tma_load into the same offset of every CTA of the cluster (both here), completing on each one's barrier. */
__device__ __forceinline__ void tma_load_both(u32 dst, const tensor_map &map, int x, int y, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
        "[%1, {%2, %3, %4}], [%5], %6;\n" ::
            "r"(dst),
        "l"((u64)&map), "r"(x), "r"(y), "r"(0), "r"(bar), "h"((unsigned short)3)
        : "memory");
}
/* TMA store of a 64-column box from shared memory (128-byte swizzle) at (column x, row y); rows past the tensor are
 * not written. Completion is tracked per thread, in bulk groups. */
__device__ __forceinline__ void tma_store(const tensor_map &map, u32 src, int x, int y) {
    asm volatile(
        "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"((u64)&map),
        "r"(x), "r"(y), "r"(0), "r"(src)
        : "memory");
}

/* The j-th k-step job of this CTA: its tile (the cluster's every (gridDim.x / 2)-th tile pair, this CTA's half of
 * it) and k-step. Where the m-tiles are odd the last pair's second tile repeats the first: the two CTAs then store
 * the same bits to the same rows. */
struct gemm_job {
    int m0, c0, ks;
};
template <int BN> __device__ __forceinline__ gemm_job gemm_job_of(int j, int m_tiles, int k_steps) {
    const int m_pairs = (m_tiles + 1) / 2, pair = (blockIdx.x >> 1) + (j / k_steps) * (gridDim.x >> 1);
    return {min((pair % m_pairs) * 2 + (int)(blockIdx.x & 1), m_tiles - 1) * 128, (pair / m_pairs) * BN, j % k_steps};
}

/* The producer's one working thread. The weight boxes of the first NS jobs go out before griddepcontrol.wait, X's
 * after it; later jobs wait until the consumers of both CTAs have released their slot (empty). Weight half `rank`
 * is this CTA's to load for both. */
template <int NS, int BN>
__device__ __forceinline__ void gemm_produce(const gemm_tensor_maps &tm, u32 s0, u32 full, u32 empty, int jobs,
                                             int m_tiles, int k_steps) {
    constexpr u32 A_BYTES = 128 * 64 * 2, STAGE = A_BYTES + BN * 64 * 2;
    const int rank = blockIdx.x & 1;
    auto load_w = [&](int j, const gemm_job &q) {
        const u32 slot = j % NS;
        tma_load_both(s0 + slot * STAGE + A_BYTES + rank * (BN / 2) * 128, tm.w, q.ks * 64, q.c0 + rank * (BN / 2),
                      full + slot * 8);
    };
    auto load_x = [&](int j, const gemm_job &q) {
        tma_load(s0 + (j % NS) * STAGE, tm.x, q.ks * 64, q.m0, 0, full + (j % NS) * 8);
    };
    const int first = min(NS, jobs);
    for (int j = 0; j < first; j++) {
        mbar_expect_tx(full + j * 8, STAGE);
        load_w(j, gemm_job_of<BN>(j, m_tiles, k_steps));
    }
    pdl_enter();
    for (int j = 0; j < first; j++) load_x(j, gemm_job_of<BN>(j, m_tiles, k_steps));
    for (int j = NS; j < jobs; j++) {
        const int slot = j % NS;
        const gemm_job q = gemm_job_of<BN>(j, m_tiles, k_steps);
        mbar_wait(empty + slot * 8, (j / NS + 1) & 1);
        mbar_expect_tx(full + slot * 8, STAGE);
        load_w(j, q);
        load_x(j, q);
    }
}

/* A consumer warpgroup's 64 x BN accumulators (its rows m0 + 64 wg.., columns from c0) to Y, through its 16 KB staging
 * buffer (two 64 x 64 boxes in the 128-byte swizzle, which spreads each warp's stores over all banks) in passes of 128
 * columns (one of 64 where BN = 64, its first box alone), each sent by TMA while the warpgroup goes on; a pass first
 * waits until the previous one's store has read the buffer. Storing from registers straight to global memory left the
 * kernel 13-33% slower than cuBLASLt; four passes of 64 columns alternating between the two boxes measured the same as
 * two (BN = 256). */
template <int BN>
__device__ __forceinline__ void gemm_store(const gemm_tensor_maps &tm, const float (&acc)[BN / 8][4], int m0, int c0,
                                           int wg, u32 stage) {
    constexpr int PASS_COLUMNS = BN < 128 ? BN : 128;
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    const bool issuer = (threadIdx.x & 127) == 0;
#pragma unroll
    for (int pass = 0; pass < BN / PASS_COLUMNS; pass++) {
        if (issuer) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
        named_bar_sync(1 + wg, 128);
#pragma unroll
        for (int jj = 0; jj < PASS_COLUMNS / 8; jj++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = warp * 16 + g + 8 * r, j = pass * 16 + jj;
                const u32 at = stage + (jj >> 3) * 8192 + row * 128 + (((jj & 7) ^ (row & 7)) << 4) + 4 * t;
                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at), "r"(pack_bf16x2(acc[j][2 * r], acc[j][2 * r + 1]))
                             : "memory");
            }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the stores above, visible to TMA
        named_bar_sync(1 + wg, 128);
        if (issuer) {
            tma_store(tm.y, stage, c0 + pass * 128, m0 + wg * 64);
            if (PASS_COLUMNS == 128) tma_store(tm.y, stage + 8192, c0 + pass * 128 + 64, m0 + wg * 64);
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
    }
}

/* The consumer warpgroups: one k-step a turn, its four k16 products issued, then the previous step's awaited and its
 * slot released in both CTAs; the tile's last step awaited before the store. */
template <int NS, int BN>
__device__ __forceinline__ void gemm_consume(const gemm_tensor_maps &tm, u32 s0, u32 staging, u32 full, u32 empty,
                                             int jobs, int m_tiles, int k_steps) {
    constexpr u32 A_BYTES = 128 * 64 * 2, STAGE = A_BYTES + BN * 64 * 2;
    const int wg = threadIdx.x >> 7;
    auto release = [&](int j) {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) {
            mbar_arrive(empty + (j % NS) * 8);
            mbar_arrive_cluster(empty + (j % NS) * 8, (blockIdx.x & 1) ^ 1);
        }
    };
    auto mma = [](float (&d)[BN / 8][4], u64 desc_a, u64 desc_b, int accumulate) {
        wgmma_ss<BN>(d, desc_a, desc_b, accumulate);
    };
    float acc[BN / 8][4];
    for (int j = 0; j < jobs;) {
        wg_ring_run<NS, STAGE, A_BYTES>(acc, s0, full, j, k_steps, mma, release);
        const gemm_job tile = gemm_job_of<BN>(j - 1, m_tiles, k_steps);
        gemm_store<BN>(tm, acc, tile.m0, tile.c0, wg, staging + wg * 16384);
    }
    if ((threadIdx.x & 127) == 0)
        asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the last stores are done
}

template <int NS, int BN>
__global__ void __launch_bounds__(384, 1) gemm_wg(gemm_wg_args a, const __grid_constant__ gemm_tensor_maps tm) {
    constexpr u32 STAGE = (128 + BN) * 64 * 2;
    extern __shared__ __align__(16) unsigned char smem[];
    // The ring, the consumers' staging buffers (16 KB each), the mbarriers; 1024-byte swizzle atoms.
    const u32 s0 = (smem_u32(smem) + 1023) & ~1023u, staging = s0 + NS * STAGE, full = staging + 2 * 16384,
              empty = full + NS * 8;
    const int m_tiles = (a.m + 127) / 128, pairs = (m_tiles + 1) / 2 * (a.n / BN), k_steps = (a.k + 63) / 64;
    const int clusters = gridDim.x >> 1, cluster = blockIdx.x >> 1;
    const int jobs = cluster < pairs ? (pairs - cluster + clusters - 1) / clusters * k_steps : 0;
    if (threadIdx.x == 256) {
        for (int s = 0; s < NS; s++) {
            mbar_init(full + s * 8, 1);
            mbar_init(empty + s * 8, 16);  // lane 0 of each consumer warp of both CTAs
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_sync();  // both CTAs' barriers exist before either multicasts or arrives
    // Each side meets the cluster barrier again before leaving: no CTA exits while its peer may still arrive on its
    // barriers. ptxas compiles each side for its register count: the producer needs more than the attention's 24.
    if (threadIdx.x >= 256) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x == 256) gemm_produce<NS, BN>(tm, s0, full, empty, jobs, m_tiles, k_steps);
        __syncwarp();
        cluster_sync();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    gemm_consume<NS, BN>(tm, s0, staging, full, empty, jobs, m_tiles, k_steps);
    cluster_sync();
}
