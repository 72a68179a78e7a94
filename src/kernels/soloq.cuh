/* Twin: dllm__soloq_dot. Every lane of one warp calls it: lane l's fmaf chain over i = l, l + 32, ..., then the
 * butterfly; an addition is commutative, so every lane ends with lane 0's bits, which are the twin's. */
__device__ float soloq_dot(const float *a, const float *b, int n) {
    float p = 0.f;
#pragma unroll 8  // the loads run ahead of the fmaf chain
    for (int i = threadIdx.x & 31; i < n; i += 32) p = fmaf(a[i], b[i], p);
    for (int off = 16; off > 0; off >>= 1) p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, off));
    return p;
}

/* Twin: dllm__e4m3_to_f32. */
__device__ __forceinline__ float e4m3_value(u32 c) {
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return __int_as_float(0x7fc00000);
    const float v = e ? __fmul_rn((float)(8 + m), __int_as_float((e - 10 + 127) << 23)) : __fmul_rn((float)m, 0x1p-9f);
    return c & 0x80u ? -v : v;
}

/* Twins: dllm__f32_to_e2m1 and dllm__e2m1_to_f32. */
__device__ __forceinline__ u32 e2m1_code(float v) {
    const float a = fabsf(v);
    const u32 m = a <= 0.25f   ? 0u
                  : a < 0.75f  ? 1u
                  : a <= 1.25f ? 2u
                  : a < 1.75f  ? 3u
                  : a <= 2.5f  ? 4u
                  : a < 3.5f   ? 5u
                  : a <= 5.0f  ? 6u
                               : 7u;
    return m ? ((signbit(v) ? 8u : 0u) | m) : 0u;
}
__device__ __forceinline__ float e2m1_value(u32 c) {
    const u32 m = c & 7u;
    const float v = m < 4u ? 0.5f * (float)m : m == 7u ? 6.f : (float)(m - 2u);
    return c & 8u ? -v : v;
}

/* Twin: dllm__e8p_decode4 (4 x the 8 coordinates of an E8P code). */
__device__ __forceinline__ void e8p_decode4(u32 code, int out4[8]) {
    const unsigned char *a = E8P_ABS + (code >> 8) * 8;
    int neg = 0, sum_half = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) sum_half += a[i];
#pragma unroll
    for (int i = 1; i < 8; i++) neg += code >> i & 1;
    const bool neg0 = ((sum_half / 2 - neg) & 1) != 0;
    const int shift = code & 1 ? 1 : -1;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const bool negative = i == 0 ? neg0 : (code >> i & 1) != 0;
        out4[i] = 2 * (negative ? -(int)a[i] : (int)a[i]) + shift;
    }
}

/* Twin: dllm__e8p_int. */
__device__ __forceinline__ int e8p_int(int e1_4, int e2_4) { return E8P_INT[((e1_4 + 11) / 2) * 12 + (e2_4 + 11) / 2]; }

/* Twin: dllm__e8p_encode (the exact search; every thread of a warp walks the patterns in the same order, so the
 * table reads are constant-cache broadcasts). */
__device__ u32 e8p_encode(const float x[8]) {
    float best = DLLM_INF;
    u32 best_code = 0;
    for (int s = 0; s < 2; s++) {
        const float shift = s ? 0.25f : -0.25f;
        float y[8], ay[8];
        int neg_y = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            y[i] = __fsub_rn(x[i], shift);
            ay[i] = fabsf(y[i]);
            neg_y += y[i] < 0.f;
        }
        for (int p = 0; p < 256; p++) {
            const unsigned char *h = E8P_ABS + p * 8;
            float cost = 0.f, flip_cost = DLLM_INF;
            int sum_half = 0, flip = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float a = 0.5f * (float)h[i], e = __fsub_rn(ay[i], a);
                cost = __fadd_rn(cost, __fmul_rn(e, e));
                const float fc = __fmul_rn(__fmul_rn(4.0f, ay[i]), a);
                if (fc < flip_cost) flip_cost = fc, flip = i;
                sum_half += h[i];
            }
            const bool violated = ((neg_y - sum_half / 2) & 1) != 0;
            if (violated) cost = __fadd_rn(cost, flip_cost);
            if (cost < best) {
                best = cost;
                u32 code = (u32)(p << 8 | s);
#pragma unroll
                for (int i = 1; i < 8; i++) code |= (u32)((y[i] < 0.f) != (violated && flip == i)) << i;
                best_code = code;
            }
        }
    }
    return best_code;
}

/* C of element i of a packed row (twin: dllm__q4_value); bs: the row's NVFP4 block scales. */
__device__ __forceinline__ float q4_value(int format, const unsigned char *packed, const unsigned char *bs, int i) {
    if (format == Q4_E8P) {
        const unsigned char *p = packed + (i / 8) * 4;
        int e1[8], e2[8];
        e8p_decode4(p[0] | p[1] << 8, e1);
        e8p_decode4(p[2] | p[3] << 8, e2);
        int v = 0;
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j == (i & 7)) v = e8p_int(e1[j], e2[j]);
        return (float)v;
    }
    const u32 c = packed[i / 2] >> (4 * (i & 1)) & 15u;
    const int signed4 = c & 8u ? (int)c - 16 : (int)c;
    if (format == Q4_NVFP4) return __fmul_rn(e2m1_value(c), e4m3_value(bs[i / 16]));
    if (format == Q4_INT4) return (float)(2 * signed4 + 1);
    if (format == Q4_LLOYD) return (float)(c & 8u ? -LLOYD_INT[c & 7u] : LLOYD_INT[c & 7u]);
    return (float)signed4;
}

/* Element i of the row a GEMM would read before the rotation: the bf16 row of x, add_rmsnorm's output (already in
 * `normed`), or SwiGLU's (silu_mul8's arithmetic, rounded to bf16 as swiglu stores it). */
__device__ __forceinline__ float soloq_source(const soloq_args &a, int row, int i, const float *normed) {
    if (a.producer == 1) return normed[i];
    const bf16_t *x = (const bf16_t *)a.x + (u64)row * a.x_stride;
    if (a.producer == 0) return bf16_to_f32(x[i]);
    const float g = bf16_to_f32(x[i]), u = bf16_to_f32(x[a.d + i]);
    return bf16_to_f32(f32_to_bf16(g / (1.f + __expf(-g)) * u));
}

/* add_rmsnorm's row into `normed` (its arithmetic and reduction order: residual_rms), writing h_out when asked. */
__device__ void soloq_norm_row(const soloq_args &a, int row, bool write_h, float *normed) {
    float v[NORM_SLOTS][8], g[8];
    const float r = residual_rms(a.h_in, write_h ? a.h_out : 0, a.delta, (u64)row, a.d, a.eps, v);
#pragma unroll
    for (int j = 0; j < NORM_SLOTS; j++) {
        const int k = (threadIdx.x + j * blockDim.x) * 8;
        if (k >= a.d) continue;
        load8(a.norm_w + k, g);
        for (int e = 0; e < 8; e++) normed[k + e] = bf16_to_f32(f32_to_bf16((v[j][e] * r) * g[e]));
    }
    __syncthreads();
}

/* [SoloQ clusters] A row may be split over a cluster of C CTAs along x (sm_90+, the host's dllm__soloq_split): CTA r
 * owns the rotated row's slice [r n, (r + 1) n), n = d / C, of whole rotation blocks and whole reduction segments; the
 * mixer reads the other slices, and the reductions combine per-CTA partials, through distributed shared memory. */
struct soloq_slice {
    int C, r, i0, n;  // CTAs a row, this one's rank, its slice
};

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void soloq_sync(const soloq_slice &s) {
    if (s.C == 1) {
        __syncthreads();
        return;
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
/* This CTA's shared address p as CTA `rank`'s, for ld.shared::cluster. */
__device__ __forceinline__ u32 soloq_map(const void *p, int rank) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote)
                 : "r"((u32)__cvta_generic_to_shared(p)), "r"(rank));
    return remote;
}
/* *p in CTA `rank` of the cluster (p: this CTA's address of the same shared variable). */
__device__ __forceinline__ float soloq_remote(const float *p, int rank) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(soloq_map(p, rank)));
    return v;
}
/* The float4 at p in CTA `rank`. */
__device__ __forceinline__ float4 soloq_remote4(const float4 *p, int rank) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(soloq_map(p, rank)));
    return v;
}
#else
__device__ __forceinline__ void soloq_sync(const soloq_slice &) { __syncthreads(); }
__device__ __forceinline__ float soloq_remote(const float *p, int) { return *p; }  // C is 1 here
__device__ __forceinline__ float4 soloq_remote4(const float4 *p, int) { return *p; }
#endif

/* The other CTAs' slices of the row buffer F into this CTA's F, 16 bytes a load, eight loads a thread in flight before
 * any is stored (a float at a time, each remote load's latency was paid in turn). */
__device__ void soloq_copy_slices(float *F, const soloq_slice &s) {
    const int n4 = s.n / 4, total = (s.C - 1) * n4, nt = blockDim.x;  // s.n % 4 == 0: whole rotation blocks
    float4 *F4 = (float4 *)F;
    constexpr int G = 8;
    for (int i0 = threadIdx.x; i0 < total; i0 += G * nt) {
        float4 v[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int i = i0 + g * nt, owner = i / n4 + (i / n4 >= s.r);  // the slices in order, this CTA's skipped
            if (i < total) v[g] = soloq_remote4(F4 + owner * n4 + i % n4, owner);
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int i = i0 + g * nt, owner = i / n4 + (i / n4 >= s.r);
            if (i < total) F4[owner * n4 + i % n4] = v[g];
        }
    }
}

/* [SoloQ register FWHT] The block FWHTs of this CTA's slice A (gathered) with b = 32 E <= 128, a block a warp, no
 * barrier: lane l holds elements l + 32 i (i < E) of its block, so the stages h < 32 pair lanes (shuffles) and the
 * stages h >= 32 pair a thread's own registers. The butterflies are dllm__fwht_blocks's (stage h pairs c and c + h,
 * u + v and u - v) in its stage order, so the bits are those of the shared-memory FWHT; then 1/sqrt(b). */
template <int E>
__device__ void soloq_fwht_registers(float *A, int n, float norm) {
    const int lane = threadIdx.x & 31, b = 32 * E;
    for (int blk = threadIdx.x >> 5; blk < n / b; blk += blockDim.x >> 5) {
        float *block = A + blk * b + lane, x[E];
#pragma unroll
        for (int i = 0; i < E; i++) x[i] = block[32 * i];
#pragma unroll
        for (int h = 1; h < 32 && h < b; h <<= 1) {
            const bool upper = lane & h;
#pragma unroll
            for (int i = 0; i < E; i++) {
                const float other = __shfl_xor_sync(0xffffffffu, x[i], h);
                x[i] = upper ? __fsub_rn(other, x[i]) : __fadd_rn(x[i], other);
            }
        }
#pragma unroll
        for (int h = 1; h < E; h <<= 1)
#pragma unroll
            for (int i = 0; i < E; i++)
                if (!(i & h)) {
                    const float u = x[i], v = x[i + h];
                    x[i] = __fadd_rn(u, v);
                    x[i + h] = __fsub_rn(u, v);
                }
#pragma unroll
        for (int i = 0; i < E; i++) block[32 * i] = __fmul_rn(x[i], norm);
    }
}

/* [SoloQ chunk FWHT] The block FWHTs of slice A for b >= 256 with every thread busy: thread t holds chunks q = t, t +
 * blockDim.x, ... of 8 contiguous elements (lane = q % 32), so the stages h = 1, 2, 4 pair its own registers and h = 8
 * .. 128 pair lanes (shuffles); the stages from 256 on are soloq_fwht_shared's. A block a warp (soloq_fwht_registers)
 * kept 4 of a 4096-wide row's 16 warps busy and the others at the barrier after it. The same stage order and
 * butterflies, so the same bits. Without the scaling by 1/sqrt(b). */
__device__ void soloq_fwht_chunks(float *A, int n) {
    const int lane = threadIdx.x & 31;
    for (int q = threadIdx.x; q < n / 8; q += blockDim.x) {  // n % 256 == 0: whole warps, every lane a chunk
        float4 *p = (float4 *)(A + 8 * q);
        const float4 lo = p[0], hi = p[1];
        float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int h = 1; h < 8; h <<= 1)
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (!(i & h)) {
                    const float u = x[i], v = x[i + h];
                    x[i] = __fadd_rn(u, v);
                    x[i + h] = __fsub_rn(u, v);
                }
#pragma unroll
        for (int h = 1; h < 32; h <<= 1) {
            const bool upper = lane & h;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float other = __shfl_xor_sync(0xffffffffu, x[i], h);
                x[i] = upper ? __fsub_rn(other, x[i]) : __fadd_rn(x[i], other);
            }
        }
        p[0] = make_float4(x[0], x[1], x[2], x[3]);
        p[1] = make_float4(x[4], x[5], x[6], x[7]);
    }
    __syncthreads();
}

/* The block FWHTs' stages from h = 2^first on in shared memory, a barrier a stage. */
__device__ void soloq_fwht_shared(float *A, const soloq_slice &s, int b, int first) {
    const int tid = threadIdx.x, nt = blockDim.x, log_b = __ffs(b) - 1;  // b a power of two: shifts and masks
    for (int log_h = first; log_h < log_b; log_h++) {
        const int h = 1 << log_h;
        for (int p = s.i0 / 2 + tid; p < (s.i0 + s.n) / 2; p += nt) {  // butterfly p: block p >> (log_b - 1), pair q
            const int q = p & (b / 2 - 1),
                      c = ((p >> (log_b - 1)) << log_b) + ((q >> log_h) << (log_h + 1)) + (q & (h - 1)) - s.i0;
            const float u = A[c], v = A[c + h];
            A[c] = __fadd_rn(u, v);
            A[c + h] = __fsub_rn(u, v);
        }
        __syncthreads();
    }
}

/* FWHT_b (and 1/sqrt(b)) of every block of the gathered slice A: a block a warp in registers for b = 32 .. 128, in
 * chunks of 8 from 256 on (then shared memory past 256). */
__device__ void soloq_fwht_blocks(const soloq_args &a, const soloq_slice &s, float *A) {
    switch (a.rot_b) {
    case 1: return;
    case 32: return soloq_fwht_registers<1>(A, s.n, a.rot_norm);
    case 64: return soloq_fwht_registers<2>(A, s.n, a.rot_norm);
    case 128: return soloq_fwht_registers<4>(A, s.n, a.rot_norm);
    }
    int first = 0;
    if (a.rot_b >= 256) soloq_fwht_chunks(A, s.n), first = 8;
    soloq_fwht_shared(A, s, a.rot_b, first);
    for (int i = threadIdx.x; i < s.n; i += blockDim.x) A[i] = __fmul_rn(A[i], a.rot_norm);
}

/* y = R x on this CTA's slice (twin: dllm__rotate): signs and permutation gathered, block FWHTs, 1/sqrt(b), the
 * mixer Q_k into B. F is the row buffer (d floats) and A = F + i0 this CTA's slice of it; before mixing, a split row's
 * other slices are copied into F from the other CTAs (one coalesced pass over distributed shared memory, rather than a
 * remote load per multiply-add). B holds the slice (element i at i - i0); `normed`, producer 1's whole source row.
 * Returns where the rotated slice is (A or B). */
__device__ float *soloq_rotate(const soloq_args &a, int row, const soloq_slice &s, float *F, float *B,
                               const float *normed) {
    const int tid = threadIdx.x, nt = blockDim.x, i1 = s.i0 + s.n;
    float *A = F + s.i0;
    // Eight elements a pass, their permutation and sign loads issued before any is used: one element at a time, each
    // waited on its dependent global loads in turn (about 30% of a 32-row add+norm producer's time, ncu, H100).
    constexpr int G = 8;
    for (int i0 = s.i0 + tid; i0 < i1; i0 += G * nt) {
        int src[G];
        u32 sign[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int i = min(i0 + g * nt, i1 - 1);
            src[g] = a.perm ? a.perm[i] : i;
            sign[g] = a.signs ? a.signs[i >> 3] >> (i & 7) & 1u : 0u;
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int i = i0 + g * nt;
            if (i < i1) {
                const float v = soloq_source(a, row, src[g], normed);
                A[i - s.i0] = sign[g] ? -v : v;
            }
        }
    }
    __syncthreads();
    soloq_fwht_blocks(a, s, A);
    const int b = a.rot_b, log_b = __ffs(b) - 1;
    if (!a.mixer) {
        __syncthreads();
        return A;
    }
    soloq_sync(s);  // every slice transformed before any is mixed
    if (s.C > 1) {
        soloq_copy_slices(F, s);
        __syncthreads();
    }
    const int k = a.rot_k;
    for (int o = s.i0 + tid; o < i1; o += nt) {
        const int j = o >> log_b, c = o & (b - 1);
        const float *q = a.mixer + j * k, *col = F + c;
        float acc = 0.f;
        for (int i = 0; i < k; i++) acc = fmaf(q[i], col[i * b], acc);
        B[o - s.i0] = acc;
    }
    // Every CTA has copied every slice, and this one mixed, before A is written again: quantising, the cluster barrier
    // of soloq_row_stats comes first (soloq_row), so this CTA's own suffices here.
    if (s.C > 1 && a.quantize) __syncthreads();
    else soloq_sync(s);
    return B;
}

/* The in-order sum and the maximum of the row's segment partials: segment r mine + j at sums[j] (and maxima[j]) in
 * CTA r of the cluster. Lane i of every warp loads partial i, all at once, then every lane adds them in order through
 * shuffles: one remote load after another cost a 12288-wide row's 12 partials about as much as its rotation. */
__device__ float2 soloq_combine(const float *sums, const float *maxima, const soloq_slice &s, int mine) {
    const int lane = threadIdx.x & 31, total = s.C * mine;
    float acc = 0.f, amax = 0.f;
    for (int base = 0; base < total; base += 32) {
        float p = 0.f, m = 0.f;
        const int i = base + lane, r = i / mine, j = i - r * mine;
        if (i < total) {
            p = r == s.r ? sums[j] : soloq_remote(&sums[j], r);
            if (maxima) m = r == s.r ? maxima[j] : soloq_remote(&maxima[j], r);
        }
        for (int k = 0; k < min(32, total - base); k++) {
            acc = __fadd_rn(acc, __shfl_sync(0xffffffffu, p, k));
            amax = fmaxf(amax, __shfl_sync(0xffffffffu, m, k));
        }
    }
    return make_float2(acc, amax);
}

/* Twin: dllm__soloq_dot over the whole row of which this CTA holds [i0, i0 + n) (x and y: the slice): its segments'
 * sums (one warp each), then all of them added in order from every CTA's `seg`
 * (a cluster-shared array of at most 32 sums). Every thread of every CTA returns the same bits. Ends with a barrier
 * across the cluster. */
__device__ float soloq_row_dot(const float *x, const float *y, int d, const soloq_slice &s, float *seg) {
    const bool segmented = d > SOLOQ_SEGMENT && d % SOLOQ_SEGMENT == 0;
    const int len = segmented ? SOLOQ_SEGMENT : d, mine = s.n / len;
    for (int j = threadIdx.x >> 5; j < mine; j += blockDim.x >> 5) {  // a segment a warp
        const float p = soloq_dot(x + j * len, y + j * len, len);
        if ((threadIdx.x & 31) == 0) seg[j] = p;
    }
    soloq_sync(s);
    float sum = soloq_combine(seg, 0, s, mine).x;
    if (!segmented) sum = seg[0];  // one segment: its sum as it is (0 + p is p, -0 aside)
    soloq_sync(s);                 // every CTA has read every partial before any is overwritten
    return sum;
}

/* The row's amax and sum of squares (twins: dllm__amax, whose fmaxf drops NaN, and dllm__soloq_dot(y, y)) in one pass
 * over the slice y: a warp a segment, as soloq_row_dot, its fmaxf beside the fmaf chain; then every segment's sum added
 * in order and the maxima combined, from every CTA. Every thread of every CTA returns the same bits. A split row's CTAs
 * may still read this one's partials: the caller passes a cluster barrier before it leaves. */
__device__ float2 soloq_row_stats(const float *y, int d, const soloq_slice &s) {
    __shared__ float seg_sum[32], seg_max[32];
    const bool segmented = d > SOLOQ_SEGMENT && d % SOLOQ_SEGMENT == 0;
    const int len = segmented ? SOLOQ_SEGMENT : d, mine = s.n / len;
    for (int j = threadIdx.x >> 5; j < mine; j += blockDim.x >> 5) {
        const float *x = y + j * len;
        float p = 0.f, m = 0.f;
#pragma unroll 8
        for (int i = threadIdx.x & 31; i < len; i += 32) p = fmaf(x[i], x[i], p), m = fmaxf(m, fabsf(x[i]));
        for (int off = 16; off > 0; off >>= 1) {
            p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, off));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        }
        if ((threadIdx.x & 31) == 0) seg_sum[j] = p, seg_max[j] = m;
    }
    soloq_sync(s);
    const float2 c = soloq_combine(seg_sum, seg_max, s, mine);
    float sum = c.x;
    const float amax = c.y;
    if (!segmented) sum = seg_sum[0];  // one segment: its sum as it is (0 + p is p, -0 aside)
    return make_float2(amax, sum);
}

/* Codes and C values of this CTA's slice of a nonzero row
 * (y and val: the slice; twins: dllm__encode_nvfp4 / _rtn / _int4 / _lloyd / _e8p): the work split by pairs of
 * elements, NVFP4 blocks of 16 or E8P groups of 8, codes to `codes` when given, C to val. */
template <bool E8P>
__device__ void soloq_encode(int format, const float *y, const soloq_slice &s, float amax, float sigma,
                             unsigned char *codes, unsigned char *bs, float *val) {
    const int tid = threadIdx.x, nt = blockDim.x, i1 = s.i0 + s.n;
    if (format == Q4_NVFP4) {
        const float s_enc = nvfp4_s_enc(amax);
        for (int b0 = s.i0 + tid * 16; b0 < i1; b0 += nt * 16) {
            const int b1 = min(i1, b0 + 16);
            float m = 0.f;
            for (int i = b0; i < b1; i++) m = fmaxf(m, fabsf(y[i - s.i0]));
            const u32 sb = e4m3x2(__fmul_rn(__fdiv_rn(m, 6.0f), s_enc), 0.f) & 0xffu;
            const float scale = e4m3_value(sb), enc = sb ? __fdiv_rn(s_enc, scale) : 0.f;
            if (bs) bs[b0 / 16] = (unsigned char)sb;
            for (int i = b0; i < b1; i += 2) {
                const u32 c0 = sb ? e2m1_code(__fmul_rn(y[i - s.i0], enc)) : 0u,
                          c1 = sb ? e2m1_code(__fmul_rn(y[i + 1 - s.i0], enc)) : 0u;
                if (codes) codes[i / 2] = (unsigned char)(c0 | c1 << 4);
                val[i - s.i0] = __fmul_rn(e2m1_value(c0), scale);
                val[i + 1 - s.i0] = __fmul_rn(e2m1_value(c1), scale);
            }
        }
        return;
    }
    if (E8P && format == Q4_E8P) {
        for (int g = s.i0 + tid * 8; g < i1; g += nt * 8) {
            float v1[8], v2[8];
            int e1[8], e2[8];
#pragma unroll
            for (int i = 0; i < 8; i++) v1[i] = __fmul_rn(__fdiv_rn(y[g + i - s.i0], sigma), E8P_SCALE);
            const u32 c1 = e8p_encode(v1);
            e8p_decode4(c1, e1);
#pragma unroll
            for (int i = 0; i < 8; i++) v2[i] = __fmul_rn(__fsub_rn(v1[i], __fmul_rn(0.25f, (float)e1[i])), E8P_RESID);
            const u32 c2 = e8p_encode(v2);
            e8p_decode4(c2, e2);
            if (codes) *(u32 *)(codes + g / 2) = c1 | c2 << 16;
#pragma unroll
            for (int i = 0; i < 8; i++) val[g + i - s.i0] = (float)e8p_int(e1[i], e2[i]);
        }
        return;
    }
    const float step = __fmul_rn(sigma, INT4_STEP), rtn_scale = __fdiv_rn(amax, 7.0f);
    for (int i = s.i0 + tid * 2; i < i1; i += nt * 2) {
        u32 c[2];
        for (int e = 0; e < 2; e++) {
            const float x = y[i + e - s.i0];
            if (format == Q4_RTN) {
                const float q = fminf(fmaxf(rintf(__fdiv_rn(x, rtn_scale)), -7.f), 7.f);
                c[e] = (u32)(int)q & 15u;
                val[i + e - s.i0] = q;
            } else if (format == Q4_INT4) {
                const float q = fminf(fmaxf(floorf(__fdiv_rn(x, step)), -8.f), 7.f);
                c[e] = (u32)(int)q & 15u;
                val[i + e - s.i0] = __fadd_rn(__fmul_rn(2.f, q), 1.f);
            } else {
                const float z = __fdiv_rn(x, sigma), az = fabsf(z);
                int level = 0;
                while (level < 7 && az >= LLOYD_T[level]) level++;
                c[e] = (z < 0.f ? 8u : 0u) | (u32)level;
                val[i + e - s.i0] = (float)(z < 0.f ? -LLOYD_INT[level] : LLOYD_INT[level]);
            }
        }
        if (codes) codes[i / 2] = (unsigned char)(c[0] | c[1] << 4);
    }
}

/* The format's own row scale from the row's amax and RMS (the return values of the twins' encoders). */
__device__ __forceinline__ float soloq_own_scale(int format, float amax, float sigma) {
    if (format == Q4_NVFP4) return __fdiv_rn(1.0f, nvfp4_s_enc(amax));
    if (format == Q4_RTN) return __fdiv_rn(amax, 7.0f);
    if (format == Q4_INT4) return __fdiv_rn(__fmul_rn(sigma, INT4_STEP), 2.0f);
    if (format == Q4_LLOYD) return __fdiv_rn(sigma, LLOYD_KAPPA);
    return __fdiv_rn(sigma, E8P_ENC_SCALE);
}

/* One row (this CTA's slice of it): its source rotated by R and, with a.quantize, quantised in a.format (twin:
 * dllm__rotate, then dllm__q4_quantize_row): packed codes and NVFP4 block scales (a.codes, a.block_scales: weights),
 * the row scale, and the C values as bf16 (a.values: a GEMM's input; exact, every C is a BF16 number). Without
 * a.quantize the rotated row itself goes to a.values in bf16 (the -w4a16 precisions) and the scale is 1. A and B: two
 * fp32 rows of shared memory. */
template <bool E8P>
__device__ void soloq_row(const soloq_args &a, int row, const soloq_slice &s, float *F, float *B, const float *normed) {
    __shared__ float seg[32];
    const int d = a.d, tid = threadIdx.x, nt = blockDim.x, i1 = s.i0 + s.n;
    float *y = soloq_rotate(a, row, s, F, B, normed), *A = F + s.i0, *val = y == A ? B : A;
    bf16_t *values = a.values ? a.values + (u64)row * d : 0;
    if (!a.quantize) {
        for (int i = s.i0 + tid; i < i1; i += nt) values[i] = f32_to_bf16(y[i - s.i0]);
        if (a.row_scale && tid == 0 && s.r == 0) a.row_scale[row] = 1.f;
        return;
    }
    const float2 stats = soloq_row_stats(y, d, s);
    const float amax = stats.x, ss = stats.y, sigma = __fsqrt_rn(__fdiv_rn(ss, (float)d));
    const bool correct = a.bias_correction && ss > 0.f && ss <= 3.402823466e38f;  // the same in every CTA of the row
    if (s.C > 1 && !correct) soloq_sync(s);  // no CTA leaves while another reads its partials (else soloq_row_dot's)
    unsigned char *codes = a.codes ? a.codes + (u64)row * (d / 2) : 0;
    unsigned char *bs = a.block_scales ? a.block_scales + (u64)row * ((d + 15) / 16) : 0;
    float scale = 0.f;
    if (ss == 0.f) {  // codes 0 (some decode to a nonzero C, INT4's 1) and scale 0
        if (codes)
            for (int i = s.i0 / 2 + tid; i < i1 / 2; i += nt) codes[i] = 0;
        if (bs)
            for (int i = s.i0 / 16 + tid; i < (i1 + 15) / 16; i += nt) bs[i] = 0;
        const unsigned char zeros[4] = {0, 0, 0, 0};
        for (int i = s.i0 + tid; i < i1; i += nt) val[i - s.i0] = q4_value(a.format, zeros, zeros, i & 7);
    } else {
        soloq_encode<E8P>(a.format, y, s, amax, sigma, codes, bs, val);
        scale = soloq_own_scale(a.format, amax, sigma);
    }
    __syncthreads();
    if (!(ss <= 3.402823466e38f)) {
        scale = __int_as_float(0x7fc00000);
    } else if (correct) {  // [bias correction] ||x||^2 / <C, x>
        const float proj = soloq_row_dot(val, y, d, s, seg);
        if (proj > 0.f) scale = __fdiv_rn(ss, proj);
    }
    if (tid == 0 && s.r == 0 && a.row_scale) a.row_scale[row] = scale;
    if (values)
        for (int i = s.i0 + tid; i < i1; i += nt) values[i] = f32_to_bf16(val[i - s.i0]);
    if (a.values_i8)  // [INT8 GEMM] the same integers, for gemm_q4's INT8 path
        for (int i = s.i0 + tid; i < i1; i += nt) a.values_i8[(u64)row * d + i] = (signed char)(int)val[i - s.i0];
}

/* A row's CTAs: gridDim.x = rows x C along x, clusters of C (a.cluster). */
__device__ __forceinline__ soloq_slice soloq_slice_of(const soloq_args &a) {
    soloq_slice s;
    s.C = a.cluster, s.r = blockIdx.x % a.cluster, s.n = a.d / a.cluster, s.i0 = s.r * s.n;
    return s;
}

/* Rows of x (producer 0): the weights at load (every format) and a GEMM's bf16 input. */
KERNEL_soloq_quantize_rows {
    pdl_enter();
    extern __shared__ float soloq_smem[];
    const soloq_slice s = soloq_slice_of(a);
    soloq_row<true>(a, blockIdx.x / a.cluster, s, soloq_smem, soloq_smem + a.d, 0);
}

/* [fused producers] A GEMM's input made and quantised in one pass (producer 1: add_rmsnorm, blockDim its norm threads;
 * 2: SwiGLU): the activation formats only (no E8P). */
KERNEL_soloq_produce_rows {
    pdl_enter();
    extern __shared__ float soloq_smem[];
    const soloq_slice s = soloq_slice_of(a);
    float *B = soloq_smem + a.d,
          *normed = B + s.n;  // the row buffer, a slice; producer 1: every CTA normalises the whole row
    if (a.producer == 1) soloq_norm_row(a, blockIdx.x / a.cluster, s.r == 0, normed);
    soloq_row<false>(a, blockIdx.x / a.cluster, s, soloq_smem, B, normed);
}

/* The C values of elements g .. g + 7 of a stored row (twin: dllm__q4_value). */
__device__ __forceinline__ void soloq_values8(int format, const unsigned char *packed, const unsigned char *bs, int g,
                                              float f[8]) {
    if (format == Q4_E8P) {
        int e1[8], e2[8];
        const unsigned char *p = packed + g / 2;
        e8p_decode4(p[0] | p[1] << 8, e1);
        e8p_decode4(p[2] | p[3] << 8, e2);
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = (float)e8p_int(e1[i], e2[i]);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = q4_value(format, packed, bs, g + i);
    }
}

/* Stored weight rows into their C values, bf16 [rows][cols] (twin: dllm__q4_value); 8 elements (4 code bytes) a
 * thread. */
KERNEL_soloq_dequantize_rows {
    pdl_enter();
    const int row = blockIdx.y, g = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (row >= rows || g >= cols) return;
    const unsigned char *packed = codes + (u64)row * (cols / 2),
                        *bs = block_scales ? block_scales + (u64)row * ((cols + 15) / 16) : 0;
    float f[8];
    soloq_values8(format, packed, bs, g, f);
    *(uint4 *)(out + (u64)row * cols + g) =
        make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
}

/* [INT8 GEMM] Stored weight rows of an integer format (INT4, Lloyd-Max, E8P-RVQ4, RTN: every C in [-127, 127]) into
 * their C values as int8 [rows][cols], the INT8 GEMM's weight operand; 8 elements a thread, one 8-byte store. */
KERNEL_soloq_unpack_rows_i8 {
    pdl_enter();
    const int row = blockIdx.y, g = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (row >= rows || g >= cols) return;
    float f[8];
    soloq_values8(format, codes + (u64)row * (cols / 2), 0, g, f);
    u32 w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; i++) w[i / 4] |= ((u32)(int)f[i] & 0xffu) << (8 * (i % 4));
    *(uint2 *)(out + (u64)row * cols + g) = make_uint2(w[0], w[1]);
}

/* The GEMM epilogue of two quantised operands (twin: dllm__soloq_scale_rows): y[i][j] = (acc[i][j] s_x[i]) s_w[j],
 * s_x null for unquantised activations; y bf16 or fp32 with row stride ldy. */
template <class Acc>
__device__ __forceinline__ void soloq_scale_body(const Acc *acc, int n, const float *s_x, const float *s_w, void *y,
                                                 int y_f32, u64 ldy) {
    const int i = blockIdx.y;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
        float v = (float)acc[(u64)i * n + j];  // int32: cvt.rn, as the twin's (float) cast
        if (s_x) v = __fmul_rn(v, s_x[i]);
        v = __fmul_rn(v, s_w[j]);
        if (y_f32)
            ((float *)y)[(u64)i * ldy + j] = v;
        else
            ((bf16_t *)y)[(u64)i * ldy + j] = f32_to_bf16(v);
    }
}

KERNEL_soloq_scale_rows {
    pdl_enter();
    soloq_scale_body(acc, n, s_x, s_w, y, y_f32, ldy);
}

/* [INT8 GEMM] The same epilogue on the INT8 GEMM's exact int32 sums (twin: dllm__cpu_i8_gemm's last step). */
KERNEL_soloq_scale_rows_i32 {
    pdl_enter();
    soloq_scale_body(acc, n, s_x, s_w, y, y_f32, ldy);
}
