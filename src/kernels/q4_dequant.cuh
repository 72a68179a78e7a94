/* src/kernels/q4_dequant.cuh - SoloQ's 4-bit weight codes dequantised in registers to their exact BF16 C values (and
 * the tables they read), shared by q4_gemm and the MoE grouped GEMM (moe.cuh). Needs Q4_THREADS (the threads that
 * copy the tables) and the tables of dllm__src_q4_tables. */

enum { Q4_NVFP4 = 0, Q4_INT4 = 1, Q4_LLOYD = 2, Q4_E8P = 3, Q4_RTN = 4 };

__device__ __forceinline__ void q4_mma(float c[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 q4_fma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
/* A float's bf16 (exact for the constants below) in both halves. */
__device__ __forceinline__ u32 q4_bf16x2(float f) { return (__float_as_uint(f) >> 16) * 0x10001u; }

struct q4_smem {
    u32 e8p_abs[256];              // q4_e8p_abs_table
    unsigned short e8p_wint[144];  // q4_e8p_wint_table
    unsigned short e4m3[256];      // q4_e4m3_table
    unsigned short lut[16];        // NVFP4: e2m1; Lloyd-Max: +-levels (bf16)
};

/* The tables a format reads, copied from global memory (coalesced; __constant__ would serialise the lanes' distinct
 * addresses). */
template <int FMT> __device__ __forceinline__ void q4_load_tables(q4_smem &s) {
    if (FMT == Q4_E8P) {
        for (int i = threadIdx.x; i < 256; i += Q4_THREADS) s.e8p_abs[i] = q4_e8p_abs_table[i];
        for (int i = threadIdx.x; i < 144; i += Q4_THREADS) s.e8p_wint[i] = q4_e8p_wint_table[i];
    }
    if (FMT == Q4_NVFP4)
        for (int i = threadIdx.x; i < 256; i += Q4_THREADS) s.e4m3[i] = q4_e4m3_table[i];
    if ((FMT == Q4_NVFP4 || FMT == Q4_LLOYD) && threadIdx.x < 16)
        s.lut[threadIdx.x] = FMT == Q4_LLOYD ? q4_lloyd_table[threadIdx.x] : q4_e2m1_table[threadIdx.x];
}

/* An E8P code decoded to W_int row/column indices (4 v + 11) / 2 (dllm__e8p_decode4, dllm__e8p_int). Abs pattern
 * entry: bits 2i, 2i+1 = u_i = (2|a_i| - 1) / 2 (2|a_i| in {1, 3, 5}), bit 16 = (sum 2|a_i|) / 2 odd. Coordinate 0's
 * sign gives the negative count that bit's parity; 4 v = +-(4 u + 2) + (shift ? 1 : -1), so the index is
 * 6 + shift + 2 u when positive and 4 + shift - 2 u when negative. */
struct q4_e8p_code {
    u32 pat, signs, shift;
};
__device__ __forceinline__ q4_e8p_code q4_e8p_open(u32 code, const q4_smem &s) {
    const u32 pat = s.e8p_abs[code >> 8];
    return {pat, (code & 0xFEu) | (((pat >> 16) ^ (u32)__popc(code & 0xFEu)) & 1), code & 1};
}
__device__ __forceinline__ u32 q4_e8p_index(const q4_e8p_code &c, int i) {
    const u32 u = (c.pat >> (2 * i)) & 3;
    return (c.signs >> i) & 1 ? 4 + c.shift - 2 * u : 6 + c.shift + 2 * u;
}

/* The 8 C values of one word of codes as the bf16 pairs (e0, e1), (e2, e3), (e4, e5), (e6, e7) (low half first): byte
 * i's two nibbles. scale: the word's UE4M3 block scale (NVFP4). */
template <int FMT> __device__ __forceinline__ void q4_dequant(u32 w, u32 scale, const q4_smem &s, u32 p[4]) {
    if (FMT == Q4_INT4) {
        // byte i of w << 1 holds element 2i at bits 1..4, byte i of w >> 3 element 2i + 1: prmt puts them in bytes 0
        // and 2, then mantissa fields v = 2 u + 1 under 256's exponent (bf16 0x4380 + v: 256 + 2 v), u = nibble ^ 8
        // = q + 8: (258 + 4 u) / 2 - 144 = 2 u - 15 = 2 q + 1
        const u32 lo = w << 1, hi = w >> 3;
#pragma unroll
        for (int i = 0; i < 4; i++)
            p[i] = q4_fma2((__byte_perm(lo, hi, 0x4400u + 0x1111u * i) & 0x001E001Eu) ^ 0x43914391u, q4_bf16x2(0.5f),
                           q4_bf16x2(-144.0f));
    } else if (FMT == Q4_RTN) {
        // elements 2i, 2i + 1 at bits 0..3 of byte i of w, w >> 4; mantissa fields u = nibble ^ 8 = q + 8 under 128's
        // exponent (bf16 0x4300 + u: 128 + u): 128 + u - 136 = q
        const u32 hi = w >> 4;
#pragma unroll
        for (int i = 0; i < 4; i++)
            p[i] = q4_fma2((__byte_perm(w, hi, 0x4400u + 0x1111u * i) & 0x000F000Fu) ^ 0x43084308u, q4_bf16x2(1.0f),
                           q4_bf16x2(-136.0f));
    } else if (FMT == Q4_E8P) {  // the word is one group: stage-1 code low, stage-2 code high
        const q4_e8p_code c1 = q4_e8p_open(w & 0xFFFFu, s), c2 = q4_e8p_open(w >> 16, s);
#pragma unroll
        for (int i = 0; i < 4; i++)
            p[i] = (u32)s.e8p_wint[q4_e8p_index(c1, 2 * i) * 12 + q4_e8p_index(c2, 2 * i)] |
                   (u32)s.e8p_wint[q4_e8p_index(c1, 2 * i + 1) * 12 + q4_e8p_index(c2, 2 * i + 1)] << 16;
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) p[i] = (u32)s.lut[(w >> (8 * i)) & 15] | (u32)s.lut[(w >> (8 * i + 4)) & 15] << 16;
        if (FMT == Q4_NVFP4) {
            const u32 sc = (u32)s.e4m3[scale] * 0x10001u;
#pragma unroll
            for (int i = 0; i < 4; i++) p[i] = q4_fma2(p[i], sc, 0x80008000u);  // + (-0): the product alone, exact
        }
    }
}
