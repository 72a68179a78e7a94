__device__ __forceinline__ float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }

/* Twin: dllm__f32_to_e4m3's canonical codes: one zero (0x00), one NaN (0x7f), whatever sign the hardware gave. */
__device__ __forceinline__ u32 e4m3_canonical(u32 c) {
    u32 m = c & 0x7fu;
    return m == 0u ? 0u : (m == 0x7fu ? 0x7fu : c);
}

#if __CUDA_ARCH__ >= 890 && !defined(DLLM_E4M3_SOFTWARE)
/* Two codes, lo in the low byte: round to nearest even, saturate to +-448 (Inf too). */
__device__ __forceinline__ u32 e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return e4m3_canonical(r & 0xffu) | e4m3_canonical((u32)r >> 8) << 8;
}
#else
/* GPUs before sm_89 have no FP8 conversion (and never run the FP8 GEMM): the twin's arithmetic. Also used
 * on newer GPUs when DLLM_E4M3_SOFTWARE is defined, so that the tests check it against the twin. */
__device__ __forceinline__ u32 e4m3_soft(float x) {
    if (x != x) return 0x7fu;
    float a = fabsf(x);
    int mag;
    if (a < 0x1p-6f) {
        mag = (int)rintf(a * 512.f);
    } else if (a >= 448.f) {
        mag = 0x7e;
    } else {
        int e;
        float m = frexpf(a, &e);
        mag = (e + 6) * 8 + (int)rintf(m * 16.f) - 8;
    }
    return mag ? ((__float_as_uint(x) >> 24) & 0x80u) | (u32)mag : 0u;
}
__device__ __forceinline__ u32 e4m3x2(float lo, float hi) { return e4m3_soft(lo) | e4m3_soft(hi) << 8; }
#endif

/* Eight codes of f / s (IEEE division, as the twin divides), first value in the lowest byte. */
__device__ __forceinline__ uint2 e4m3x8(const float f[8], float s) {
    u32 c[4];
    for (int e = 0; e < 4; e++) c[e] = e4m3x2(f[2 * e] / s, f[2 * e + 1] / s);
    return make_uint2(c[0] | c[1] << 16, c[2] | c[3] << 16);
}

/* Twin: dllm__e4m3_scale. */
__device__ __forceinline__ float e4m3_scale(float amax) {
    float s = amax / 448.f;
    return s > 0.f ? s : 1.f;
}
