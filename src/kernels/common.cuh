typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;
#define DLLM_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float bf16_to_f32(bf16_t b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    bf16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}
/* Two floats into one register: lo in the low half (the lower column of an mma fragment). */
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ void philox(u64 seed, u32 c0, u32 c1, u32 c2, u32 c3, u32 out[4]) {
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c1 = lo1;
        c3 = lo0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}
/* Twin of dllm__uniform: 53 bits, offset by half a unit, strictly inside (0, 1). */
__device__ __forceinline__ double uniform01(u64 seed, u32 index, u32 position, u32 step, u32 stream) {
    u32 o[4];
    philox(seed, index, position, step, stream, o);
    u64 bits = (((u64)o[0] << 32) | o[1]) >> 11;
    return ((double)bits + 0.5) * (1.0 / 9007199254740992.0);
}

/* Programmatic dependent launch (sm_90+, see dllm__launch): this grid may start while the previous one in
 * the stream is still finishing. Every kernel calls this first: it waits until the previous grid has
 * completed and its writes are visible, then lets the next grid start launching, so that the launch of
 * each kernel overlaps the tail of the one before instead of following it. A no-op without the launch
 * attribute and before sm_90. */
__device__ __forceinline__ void pdl_enter() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
