__device__ __forceinline__ void mma_e4m3(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled k-tile. */
__device__ __forceinline__ u32 f8_swizzle(int row, int chunk) { return (u32)(row * 128 + ((chunk ^ (row & 7)) << 4)); }

/* Codes [k0, k0 + 128) of ROWS rows from row0 into a swizzled k-tile; rows at or past n_rows are zero-filled. */
template <int ROWS, int THREADS>
__device__ __forceinline__ void f8_load_tile(u32 dst, const unsigned char *src, int ld, int row0, int n_rows, int k0) {
    static_assert(ROWS * 8 % THREADS == 0, "every thread copies the same number of chunks");
#pragma unroll
    for (int i = 0; i < ROWS * 8 / THREADS; i++) {
        const int c = i * THREADS + threadIdx.x, r = c >> 3, chunk = c & 7;
        const bool ok = row0 + r < n_rows;
        cp_async16(dst + f8_swizzle(r, chunk), src + (u64)(ok ? row0 + r : 0) * ld + k0 + chunk * 16, ok);
    }
}

/* Stores a row's two neighbouring outputs (n even); a u32 store needs an even N for 4-byte alignment. */
__device__ __forceinline__ void f8_store2(bf16_t *y_row, int n, int N, float v0, float v1) {
    if (!(N & 1) && n + 1 < N) {
        *(u32 *)(y_row + n) = pack_bf16x2(v0, v1);
    } else {
        if (n < N) y_row[n] = f32_to_bf16(v0);
        if (n + 1 < N) y_row[n + 1] = f32_to_bf16(v1);
    }
}

/* Grid (ceil(M / BM), ceil(N / BN)): neighbouring CTAs share a weight tile, which is read from DRAM about once. */
template <int BM, int BN, int WM, int WN, int STAGES>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, 1)
    fp8_gemm(const unsigned char *X, const float *x_scale, const unsigned char *W, const float *w_scale, bf16_t *Y,
             int M, int N, int K) {
    constexpr int THREADS = (BM / WM) * (BN / WN) * 32, MT = WM / 16, NT = WN / 8, STAGE_BYTES = (BM + BN) * 128;
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && NT % 2 == 0 && 128 % BN == 0, "fp8_gemm tile");
    pdl_enter();
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN, wm = warp / (BN / WN) * WM, wn = warp % (BN / WN) * WN;
    const int k_tiles = K >> 7;
    const float *ws = w_scale + (u64)(n0 >> 7) * ((k_tiles + 3) & ~3);
    const u32 base = smem_u32(smem);

    for (int s = 0; s < STAGES - 1; s++) {
        if (s < k_tiles) {
            f8_load_tile<BM, THREADS>(base + s * STAGE_BYTES, X, K, m0, M, s * 128);
            f8_load_tile<BN, THREADS>(base + s * STAGE_BYTES + BM * 128, W, K, n0, N, s * 128);
        }
        cp_async_commit();
    }
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
    // ldmatrix row addresses (see m16n8k16): A rows wm + (lane & 15), chunk + (lane >> 4); B rows wn + (lane & 7) +
    // (lane >> 4) * 8, chunk + ((lane >> 3) & 1). Tile rows are multiples of 8 apart, so a row's swizzle is lane & 7.
    const u32 a_row = (u32)(wm + (lane & 15)) * 128, b_row = (u32)(BM + wn + (lane & 7) + (lane >> 4) * 8) * 128;
    const int a_half = lane >> 4, b_half = (lane >> 3) & 1, sw = lane & 7;

    for (int kt = 0; kt < k_tiles; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // k-tile kt has landed everywhere, and every warp is done with the stage it replaces
        const int next = kt + STAGES - 1;
        if (next < k_tiles) {
            const u32 dst = base + (next % STAGES) * STAGE_BYTES;
            f8_load_tile<BM, THREADS>(dst, X, K, m0, M, next * 128);
            f8_load_tile<BN, THREADS>(dst + BM * 128, W, K, n0, N, next * 128);
        }
        cp_async_commit();
        // the scales are loaded first: their latency hides behind the k-tile's mma
        float sx[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int m = m0 + wm + mt * 16 + g + 8 * r;
                sx[mt][r] = m < M ? x_scale[(u64)kt * M + m] : 0.f;
            }
        const float s_w = ws[kt];
        const u32 stage = base + (kt % STAGES) * STAGE_BYTES;
        float part[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) part[mt][nt][0] = part[mt][nt][1] = part[mt][nt][2] = part[mt][nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {  // 4 x k32 = the 128-wide group
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                if (m0 + wm + mt * 16 < M)
                    ldmatrix_x4(a[mt], stage + a_row + mt * 16 * 128 + (((2 * ks + a_half) ^ sw) << 4));
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) {
                u32 b[4];
                ldmatrix_x4(b, stage + b_row + nt * 8 * 128 + (((2 * ks + b_half) ^ sw) << 4));
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    if (m0 + wm + mt * 16 < M) {  // m16 tiles wholly past the padded rows (small M) do no work
                        mma_e4m3(part[mt][nt], a[mt], b[0], b[1]);
                        mma_e4m3(part[mt][nt + 1], a[mt], b[2], b[3]);
                    }
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[mt][nt][e] = fmaf(part[mt][nt][e], sx[mt][e >> 1] * s_w, acc[mt][nt][e]);
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int m = m0 + wm + mt * 16 + g + 8 * r;
            if (m >= M) continue;
            bf16_t *y_row = Y + (u64)m * N;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                f8_store2(y_row, n0 + wn + nt * 8 + 2 * t, N, acc[mt][nt][2 * r], acc[mt][nt][2 * r + 1]);
        }
}
