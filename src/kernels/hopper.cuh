#define WG_ACC8(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WG_ACC_N64(d)                                                                                                  \
    WG_ACC8(d, 0), WG_ACC8(d, 1), WG_ACC8(d, 2), WG_ACC8(d, 3), WG_ACC8(d, 4), WG_ACC8(d, 5), WG_ACC8(d, 6),           \
        WG_ACC8(d, 7)
#define WG_ACC_N128(d)                                                                                                 \
    WG_ACC_N64(d), WG_ACC8(d, 8), WG_ACC8(d, 9), WG_ACC8(d, 10), WG_ACC8(d, 11), WG_ACC8(d, 12), WG_ACC8(d, 13),       \
        WG_ACC8(d, 14), WG_ACC8(d, 15)
#define WG_ACC_N256(d)                                                                                                 \
    WG_ACC_N128(d), WG_ACC8(d, 16), WG_ACC8(d, 17), WG_ACC8(d, 18), WG_ACC8(d, 19), WG_ACC8(d, 20), WG_ACC8(d, 21),    \
        WG_ACC8(d, 22), WG_ACC8(d, 23), WG_ACC8(d, 24), WG_ACC8(d, 25), WG_ACC8(d, 26), WG_ACC8(d, 27),                \
        WG_ACC8(d, 28), WG_ACC8(d, 29), WG_ACC8(d, 30), WG_ACC8(d, 31)
#define WG_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define WG_REGS32                                                                                                      \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                          \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_REGS64                                                                                                      \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                          \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                 \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                 \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_REGS128                                                                                                     \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                          \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                 \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                 \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                                 \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                                 \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                                 \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "                     \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

/* Register-A wgmma (A: four registers, B: a shared-memory descriptor) on R accumulator registers, R = 16..128: the
 * text "instr {d}, {a}, desc_b, p imm;" with p set from the operand after desc_b (its callers pass 1: d += A B). imm
 * follows p: the scales and B's transpose of a bf16 product, nothing for s8. Operands: the accumulators (WG_FLAT* for a
 * flat array, WG_ACC_N* for n8 chunks), then WG_RS_IN. */
#define WG_PRED(i) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #i ", 0;\n"
#define WG_RS16(instr, imm) WG_PRED(21) instr " " WG_REGS16 ", {%16, %17, %18, %19}, %20, p" imm ";\n}\n"
#define WG_RS32(instr, imm) WG_PRED(37) instr " " WG_REGS32 ", {%32, %33, %34, %35}, %36, p" imm ";\n}\n"
#define WG_RS64(instr, imm) WG_PRED(69) instr " " WG_REGS64 ", {%64, %65, %66, %67}, %68, p" imm ";\n}\n"
#define WG_RS128(instr, imm) WG_PRED(133) instr " " WG_REGS128 ", {%128, %129, %130, %131}, %132, p" imm ";\n}\n"
#define WG_RS_IN(a0, a1, a2, a3, desc) "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1)
/* d[i], d[i + 1], ... of a flat accumulator array as operands under constraint c ("+r" s32, "+f" f32). */
#define WG_FLAT4(c, d, i) c(d[i]), c(d[i + 1]), c(d[i + 2]), c(d[i + 3])
#define WG_FLAT16(c, d, i) WG_FLAT4(c, d, i), WG_FLAT4(c, d, i + 4), WG_FLAT4(c, d, i + 8), WG_FLAT4(c, d, i + 12)
#define WG_FLAT32(c, d, i) WG_FLAT16(c, d, i), WG_FLAT16(c, d, i + 16)
#define WG_FLAT64(c, d, i) WG_FLAT32(c, d, i), WG_FLAT32(c, d, i + 32)
#define WG_FLAT128(c, d, i) WG_FLAT64(c, d, i), WG_FLAT64(c, d, i + 64)

/* Shared-memory matrix descriptor, 128-byte swizzle: start address, the stride of 8-row groups (1024 bytes) and,
 * for an MN-major operand wider than 64, the distance of its 64-column blocks (K-major operands ignore it). */
__device__ __forceinline__ u64 wg_desc(u32 addr, u32 block_stride = 1024) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(block_stride >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

/* Accumulators are the mma layout's n8 chunks, d[j][e] (see mask_keys), N / 8 of them for a 64 x N product.
 * d = (accumulate ? d : 0) + A (64 x 16, shared) . B (N x 16, shared, K-major)^T. N = 128 where a product is 128
 * wide: one instruction instead of two, 56.6 against 58.1 us at 1024 x 1024 on an H200; 256 for gemm_wg's tile. */
template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], u64 desc_a, u64 desc_b, int accumulate) {
    if constexpr (N == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_REGS32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                     : WG_ACC_N64(d)
                     : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    else if constexpr (N == 128)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_REGS64
                     ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                     : WG_ACC_N128(d)
                     : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " WG_REGS128
                     ", %128, %129, p, 1, 1, 0, 0;\n}\n"
                     : WG_ACC_N256(d)
                     : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* A tensor map (CUtensorMap, built on the host by cuTensorMapEncodeTiled) as a kernel parameter: a
 * [batch][rows][row width] bf16 tensor read in boxes of 64 columns (128 bytes) x rows in the 128-byte swizzle, rows
 * and columns past the tensor read as zeros (dllm__tensor_map). */
struct __align__(64) tensor_map {
    u64 opaque[16];
};

/* mbarriers (shared memory, 8 bytes each): the TMA copies complete a transaction count on one, consumers arrive on
 * another when they are done with a slot. Waits spin on the phase parity. */
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra WAIT;\n}\n" ::
            "r"(bar),
        "r"(parity)
        : "memory");
}

/* One TMA box of map at (column x, row y, batch z) into shared memory at dst, completing on bar. */
__device__ __forceinline__ void tma_load(u32 dst, const tensor_map &map, int x, int y, int z, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];\n" ::
            "r"(dst),
        "l"((u64)&map), "r"(x), "r"(y), "r"(z), "r"(bar)
        : "memory");
}

/* Waits until at most PENDING of the warpgroup's committed wgmma groups are in flight (they complete in order), then
 * ties the registers the awaited one wrote to this point of the program: without that the compiler, which sees them
 * as written by the issuing asm, may read them before the wait. */
template <int PENDING, int N> __device__ __forceinline__ void wg_wait_for(float (&d)[N][4]) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[j][e])::"memory");
}

/* One K run of a consumer warpgroup over a ring of NS stages of STAGE bytes (gemm_wg's and gemm_splitk's): stage j
 * (slot j % NS, phase (j / NS) & 1) holds the A tile, this warpgroup's 64 rows at wg * 8192, and the B tile at B_OFF,
 * 64 columns each; its four k16 products mma(d, desc_a, desc_b, accumulate) are issued, then the previous stage's
 * awaited and its slot handed back (release(j - 1)), so one group stays in flight. The run's last stage is awaited
 * and released before returning. j counts stages over the kernel's life: it comes back k_steps further. */
template <int NS, u32 STAGE, u32 B_OFF, int N, class Mma, class Release>
__device__ __forceinline__ void wg_ring_run(float (&d)[N][4], u32 s0, u32 full, int &j, int k_steps, Mma mma,
                                            Release release) {
    const int wg = threadIdx.x >> 7;
    for (int ks = 0; ks < k_steps; ks++, j++) {
        const u32 slot = j % NS, sa = s0 + slot * STAGE;
        mbar_wait(full + slot * 8, (j / NS) & 1);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            mma(d, wg_desc(sa + wg * 64 * 128 + kk * 32), wg_desc(sa + B_OFF + kk * 32), ks > 0 || kk > 0);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        if (ks > 0) {
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            release(j - 1);
        }
    }
    wg_wait_for<0>(d);
    release(j - 1);
}

__device__ __forceinline__ void named_bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
