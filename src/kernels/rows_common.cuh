/* 8 bf16 <-> 8 floats: the 16-byte accesses of the row-wise kernels (sizes are multiples of 8). */
__device__ __forceinline__ void unpack8(uint4 v, float f[8]) {
    u32 w[4] = {v.x, v.y, v.z, v.w};
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ uint4 pack8(const float f[8]) {
    return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                      pack_bf16x2(f[6], f[7]));
}
__device__ __forceinline__ void load8(const float *p, float f[8]) {
    float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    f[0] = a.x;
    f[1] = a.y;
    f[2] = a.z;
    f[3] = a.w;
    f[4] = b.x;
    f[5] = b.y;
    f[6] = b.z;
    f[7] = b.w;
}
__device__ __forceinline__ void store8(float *p, const float f[8]) {
    *(float4 *)p = make_float4(f[0], f[1], f[2], f[3]);
    *(float4 *)(p + 4) = make_float4(f[4], f[5], f[6], f[7]);
}

/* Row-wise norms keep a row in registers between the sum of squares and the scaling: chunk slot j of a thread is
 * the 16-byte chunk threadIdx.x + j * blockDim.x, one slot up to 8192 values a row (1024 threads), at most NORM_SLOTS
 * (from the host's dllm__norm_slots). Re-reading the row after the reduction instead took 16.3 against 15.5 us at
 * LLaDA-8B's 1024 x 4096 on an H200; giving a thread 2 or 4 chunks of a shorter CTA, 19.0-19.6 us.
 *
 * The first half of add_rmsnorm and add_rmsnorm_e4m3, for source row src: v = h_in[src] (+ delta[src]) into the
 * thread's slots (zeros past d), h_out[src] = v (if h_out); returns rsqrt(mean(v^2) + eps). The sum of squares is
 * reduced in a fixed order, so a row's bits never depend on which other rows are computed (LaCache relies on this). */
__device__ __forceinline__ float residual_rms(const float *h_in, float *h_out, const bf16_t *delta, u64 src, int d,
                                              float eps, float (&v)[NORM_SLOTS][8]) {
    uint4 dv[NORM_SLOTS];
#pragma unroll
    for (int j = 0; j < NORM_SLOTS; j++) {  // all loads first
        const int k = (threadIdx.x + j * blockDim.x) * 8;
        for (int e = 0; e < 8; e++) v[j][e] = 0.f;
        if (k < d) {
            load8(h_in + src * d + k, v[j]);
            if (delta) dv[j] = *(const uint4 *)(delta + src * d + k);
        }
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_SLOTS; j++) {
        const int k = (threadIdx.x + j * blockDim.x) * 8;
        if (k >= d) continue;
        if (delta) {
            float g[8];
            unpack8(dv[j], g);
            for (int e = 0; e < 8; e++) v[j][e] += g[e];
        }
        if (h_out) store8(h_out + src * d + k, v[j]);
        for (int e = 0; e < 8; e++) ss += v[j][e] * v[j][e];
    }
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) part[0] = t;
    }
    __syncthreads();
    return rsqrtf(part[0] / (float)d + eps);
}

/* silu(g) * u for 8 columns of a [gate (f) | up (f)] row: shared by swiglu and swiglu_e4m3, so that the
 * FP8 path quantises exactly the values the BF16 path computes. */
__device__ __forceinline__ void silu_mul8(const bf16_t *gu_row, int f, int col, float g[8]) {
    float u[8];
    unpack8(*(const uint4 *)(gu_row + col), g);
    unpack8(*(const uint4 *)(gu_row + f + col), u);
    for (int e = 0; e < 8; e++) g[e] = g[e] / (1.f + __expf(-g[e])) * u[e];
}
