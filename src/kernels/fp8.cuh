/* One 1x128 group held by 16 consecutive lanes, 8 values each; every lane of the warp must call it. Returns
 * the group's scale (fixed_scale instead when > 0) and this lane's codes. fmaxf drops NaN, as the twin's. */
__device__ __forceinline__ float quantize_group8(const float f[8], float fixed_scale, uint2 *codes) {
    float amax = 0.f;
    for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(f[e]));
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float s = fixed_scale > 0.f ? fixed_scale : e4m3_scale(amax);
    *codes = e4m3x8(f, s);
    return s;
}

/* Stores chunk c (8 codes) of a quantised row of n_chunks chunks and, from the group's first chunk, its scale.
 * Chunk c sits in lane c % 32, so the 16 chunks of a group are the 16 lanes that reduced its amax together. */
__device__ __forceinline__ void store_chunk8(unsigned char *q_row, float *scale, int scale_ld, u64 row, int c,
                                             int n_chunks, uint2 codes, float s) {
    if (c >= n_chunks) return;
    *(uint2 *)(q_row + (u64)c * 8) = codes;
    if ((c & 15) == 0) scale[(u64)(c >> 4) * scale_ld + row] = s;
}

__device__ __forceinline__ int e4m3_chunks(int k) { return ((k + 127) >> 7) << 4; }  // 8-code chunks in a padded row

/* Twin: dllm__quantize_groups. Rows of x (bf16, or fp32 when x_f32) [n_rows x k] into q [n_rows x k_pad] and their
 * scales. fixed_scale > 0 replaces every group's scale (one scale for the tensor; the tests use 1 to convert
 * raw values). Grid dllm__e4m3_rows_grid: x over 8-code chunks (blockDim a multiple of 32), y over rows. */
KERNEL_quantize_rows_e4m3 {
    pdl_enter();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, n_chunks = e4m3_chunks(k);
    for (int row = blockIdx.y; row < n_rows;
         row += gridDim.y) {  // the same trip count in every lane: all reach the shuffles
        float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (c * 8 < k) {
            if (x_f32)
                load8((const float *)x + (u64)row * k + c * 8, f);
            else
                unpack8(*(const uint4 *)((const bf16_t *)x + (u64)row * k + c * 8), f);
        }
        uint2 codes;
        float s = quantize_group8(f, fixed_scale, &codes);
        store_chunk8(q + (u64)row * n_chunks * 8, scale, scale_ld, row, c, n_chunks, codes, s);
    }
}

/* Twin: add_rmsnorm (same rows, same arguments) followed by dllm__quantize_groups of its bf16 output: output row
 * b * n_rows + i goes to q [.. x d_pad] and its scales. One CTA per row, blockDim a multiple of 32 with
 * blockDim * NORM_SLOTS >= d_pad / 8: chunk c sits in lane c % 32 (store_chunk8). */
KERNEL_add_rmsnorm_e4m3 {
    pdl_enter();
    int i = blockIdx.x, b = blockIdx.y;
    u64 src = (u64)b * seq_len + row0 + i, dst = (u64)b * n_rows + i;
    float v[NORM_SLOTS][8], g[8];
    const float r = residual_rms(h_in, h_out, delta, src, d, eps, v);
    const int n_chunks = e4m3_chunks(d);
#pragma unroll
    for (int j = 0; j < NORM_SLOTS; j++) {
        if (j * (int)blockDim.x >= n_chunks) break;  // uniform over the CTA: every lane reaches the shuffles
        const int c = threadIdx.x + j * blockDim.x;
        if (c * 8 < d) {
            load8(w + c * 8, g);
            for (int e = 0; e < 8; e++) v[j][e] = bf16_round((v[j][e] * r) * g[e]);
        }
        uint2 codes;
        float s = quantize_group8(v[j], 0.f, &codes);
        store_chunk8(q + dst * n_chunks * 8, scale, scale_ld, dst, c, n_chunks, codes, s);
    }
}

/* Twin: swiglu followed by dllm__quantize_groups of its bf16 output. gu rows are [gate (f) | up (f)], n_rows of
 * them. Grid dllm__e4m3_rows_grid over f: x over 8-code chunks (blockDim a multiple of 32), y over rows. */
KERNEL_swiglu_e4m3 {
    pdl_enter();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, n_chunks = e4m3_chunks(f);
    for (int row = blockIdx.y; row < n_rows;
         row += gridDim.y) {  // the same trip count in every lane: all reach the shuffles
        float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (c * 8 < f) {
            silu_mul8(gu + (u64)row * 2 * f, f, c * 8, v);
            for (int e = 0; e < 8; e++) v[e] = bf16_round(v[e]);
        }
        uint2 codes;
        float s = quantize_group8(v, 0.f, &codes);
        store_chunk8(q + (u64)row * n_chunks * 8, scale, scale_ld, row, c, n_chunks, codes, s);
    }
}

/* Twin: dllm__quantize_blocks. One CTA of 256 threads per 128x128 block (kb, nb) of W [n x k] (bf16, row-major):
 * codes into q [n x k_pad] (padding columns 0), the scale into scale[nb * scale_ld + kb]. Each thread owns
 * half a row of the block (64 values). */
KERNEL_quantize_weight_blocks {
    pdl_enter();
    const int kb = blockIdx.x, nb = blockIdx.y, k_pad = e4m3_chunks(k) * 8;
    const int row = nb * 128 + (threadIdx.x >> 1), col0 = kb * 128 + (threadIdx.x & 1) * 64;
    float f[8], amax = 0.f;
    for (int c = col0; row < n && c < col0 + 64 && c < k; c += 8) {
        unpack8(*(const uint4 *)(w + (u64)row * k + c), f);
        for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(f[e]));
    }
    __shared__ float part[8];
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = amax;
    __syncthreads();
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, part[i]);
    const float s = e4m3_scale(amax);
    if (threadIdx.x == 0) scale[(u64)nb * scale_ld + kb] = s;
    for (int c = col0; row < n && c < col0 + 64; c += 8) {
        uint2 codes = make_uint2(0u, 0u);
        if (c < k) {
            unpack8(*(const uint4 *)(w + (u64)row * k + c), f);
            codes = e4m3x8(f, s);
        }
        *(uint2 *)(q + (u64)row * k_pad + c) = codes;
    }
}
