/* Twin: dllm__f32_to_f16. */
__device__ unsigned short kvq_f16(float f) {
    const u32 u = __float_as_uint(f), sign = u >> 16 & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
    if (a >= 0x477fe000u) return (unsigned short)(sign | 0x7bffu);
    if (a < 0x38800000u) return (unsigned short)(sign | (u32)rintf(__fmul_rn(__uint_as_float(a), 16777216.0f)));
    u32 h = (a >> 13) - (112u << 10);
    const u32 rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (unsigned short)(sign | h);
}

/* Twin: dllm__f16_to_f32 (a subnormal is m 2^-24, exact). */
__device__ __forceinline__ float kvq_f16_value(u32 h) {
    const u32 sign = (h >> 15) << 31, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0)
        return m ? (sign ? -__fmul_rn((float)m, 0x1p-24f) : __fmul_rn((float)m, 0x1p-24f)) : __uint_as_float(sign);
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ u32 kvq_get(const unsigned char *row, int e, int bits) {
    return (u32)(row[e * bits / 8] >> (e * bits % 8)) & ((1u << bits) - 1u);
}

/* Twin: dllm__kivi_decode. */
__device__ __forceinline__ float kivi_decode(u32 q, const unsigned short *pair) {
    return fmaf((float)q, kvq_f16_value(pair[0]), kvq_f16_value(pair[1]));
}

/* Twin: dllm__kivi_quantize's pair for the group's range (mn, mx are its min and max as the twin folds them). */
__device__ void kivi_pair(float mn, float mx, bool finite, int bits, unsigned short *pair, float &scale, float &minr) {
    const float top = (float)((1 << bits) - 1);
    pair[0] = finite ? kvq_f16(__fdiv_rn(__fsub_rn(mx, mn), top)) : (unsigned short)0x7e00u;
    pair[1] = finite ? kvq_f16(mn) : (unsigned short)0x7e00u;
    scale = kvq_f16_value(pair[0]), minr = kvq_f16_value(pair[1]);
    if (!(scale > 0.f) && finite) pair[0] = 0;
}
__device__ __forceinline__ u32 kivi_code(float x, float scale, float minr, int bits) {
    return scale > 0.f ? (u32)fminf(fmaxf(rintf(__fdiv_rn(__fsub_rn(x, minr), scale)), 0.f), (float)((1 << bits) - 1))
                       : 0u;
}

/* Twin: dllm__kvq_soloq_c. */
__device__ __forceinline__ float kvq_soloq_c(u32 code, int bits) {
    if (bits == 4) return (float)(code & 8u ? -LLOYD_INT[code & 7u] : LLOYD_INT[code & 7u]);
    return code & 2u ? -LLOYD2_LEVELS[code & 1u] : LLOYD2_LEVELS[code & 1u];
}

/* Keys of a commit (twin: dllm__kvq_commit_keys): a thread per (key group, byte of a row), i.e. the 8 / bits channels
 * of that byte: their pairs from the group's rows at or past n_sink, then the byte of each of those rows. */
KERNEL_kvq_commit_keys {
    pdl_enter();
    const int kvd = a.n_kv * a.hd, row_bytes = kvd * a.bits / 8, per = 8 / a.bits;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x, byte = idx % row_bytes, gi = idx / row_bytes;
    if (gi * a.group >= a.rows) return;
    const int g0 = a.row0 + gi * a.group, first = max(g0, a.n_sink), n = max(0, g0 + a.group - first);
    float scale[4], minr[4];
    for (int c = 0; c < per; c++) {
        const int e = byte * per + c;
        const bf16_t *x = a.fresh + (u64)(first - a.row0) * 2 * kvd + e;
        float mn = n ? bf16_to_f32(x[0]) : 0.f, mx = mn;
        bool finite = true;
        for (int i = 0; i < n; i++) {
            const float v = bf16_to_f32(x[(u64)i * 2 * kvd]);
            finite = finite && isfinite(v);
            mn = fminf(mn, v), mx = fmaxf(mx, v);
        }
        kivi_pair(mn, mx, finite, a.bits, a.k_pairs + ((u64)(g0 / a.group) * kvd + e) * 2, scale[c], minr[c]);
    }
    for (int i = 0; i < n; i++) {
        const bf16_t *x = a.fresh + (u64)(first + i - a.row0) * 2 * kvd + byte * per;
        u32 b = 0;
        for (int c = 0; c < per; c++) b |= kivi_code(bf16_to_f32(x[c]), scale[c], minr[c], a.bits) << (c * a.bits);
        a.k_codes[(u64)(first + i) * row_bytes + byte] = (unsigned char)b;
    }
}

/* Values of a commit (twin: dllm__kvq_commit_values): one warp per (row, kv head) of the rows at or past n_sink.
 * SoloQ: the row rotated by 9b's soloq_rotate, Lloyd-Max codes (4 bits: 9b's soloq_encode), the bias-corrected scale;
 * KIVI: the head's pair and codes. */
KERNEL_kvq_commit_values {
    pdl_enter();
    __shared__ float A[256], B[256], val[256], seg[32];
    const int kvd = a.n_kv * a.hd, row_bytes = kvd * a.bits / 8, lane = threadIdx.x, h = blockIdx.y, hd = a.hd;
    const int r = max(a.row0, a.n_sink) + blockIdx.x;
    if (r >= a.row0 + a.rows) return;
    unsigned char *codes = a.v_codes + (u64)r * row_bytes + h * hd * a.bits / 8;
    if (!a.soloq) {
        if (lane == 0) {
            const bf16_t *x = a.fresh + (u64)(r - a.row0) * 2 * kvd + kvd + h * hd;
            float mn = bf16_to_f32(x[0]), mx = mn, scale, minr;
            bool finite = true;
            for (int i = 0; i < hd; i++) {
                const float v = bf16_to_f32(x[i]);
                finite = finite && isfinite(v);
                mn = fminf(mn, v), mx = fmaxf(mx, v);
            }
            kivi_pair(mn, mx, finite, a.bits, a.v_pairs + ((u64)r * a.n_kv + h) * 2, scale, minr);
            for (int i = 0; i < hd; i += 8 / a.bits) {
                u32 b = 0;
                for (int c = 0; c < 8 / a.bits; c++)
                    b |= kivi_code(bf16_to_f32(x[i + c]), scale, minr, a.bits) << (c * a.bits);
                codes[i * a.bits / 8] = (unsigned char)b;
            }
        }
        return;
    }
    soloq_args s = {};
    s.x = a.fresh + kvd + h * hd, s.x_stride = (u64)2 * kvd;
    s.perm = a.perm, s.signs = a.signs, s.mixer = a.mixer, s.rot_b = a.rot_b, s.rot_k = a.rot_k,
    s.rot_norm = a.rot_norm;
    s.d = hd, s.rows = 1, s.cluster = 1;
    soloq_slice sl;
    sl.C = 1, sl.r = 0, sl.i0 = 0, sl.n = hd;
    float *y = soloq_rotate(s, r - a.row0, sl, A, B, 0), *v = val;
    const float ss = soloq_row_dot(y, y, hd, sl, seg), sigma = __fsqrt_rn(__fdiv_rn(ss, (float)hd));
    float scale = 0.f;
    if (ss != 0.f) {
        if (a.bits == 4) {
            soloq_encode<false>(Q4_LLOYD, y, sl, 0.f, sigma, codes, 0, v);
            scale = __fdiv_rn(sigma, LLOYD_KAPPA);
        } else {
            for (int i = lane * 4; i < hd; i += 128) {
                u32 b = 0;
                for (int c = 0; c < 4; c++) {
                    const float z = __fdiv_rn(y[i + c], sigma);
                    const u32 code = (z < 0.f ? 2u : 0u) | (fabsf(z) >= LLOYD2_THRESHOLD ? 1u : 0u);
                    v[i + c] = kvq_soloq_c(code, 2);
                    b |= code << (2 * c);
                }
                codes[i / 4] = (unsigned char)b;
            }
            scale = sigma;
        }
        __syncthreads();
        if (!(ss <= 3.402823466e38f)) {
            scale = __int_as_float(0x7fc00000);
        } else {  // [bias correction] ||x||^2 / <C, x>
            const float proj = soloq_row_dot(v, y, hd, sl, seg);
            if (proj > 0.f) scale = __fdiv_rn(ss, proj);
        }
    }
    if (lane == 0) a.v_scale[(u64)r * a.n_kv + h] = scale;
}

/* T1 := R^T racc for one warp, head dim a.hd in shared memory (T0: scratch; twin: dllm__rotate_inverse): the mixer
 * transposed, the block FWHTs, the signs, the permutation. SoloQ's quantised values are accumulated in their rotated
 * basis and rotated back once, which equals rotating each value back (attention is linear in V). */
__device__ void kvq_rotate_back(const kvq_args &a, const float *racc, float *T0, float *T1, int lane) {
    const int b = a.rot_b, k = a.rot_k, hd = a.hd;
    for (int o = lane; o < hd; o += 32) {
        if (!a.mixer) {
            T0[o] = racc[o];
            continue;
        }
        const int jb = o / b, c = o % b;
        float t = 0.f;
        for (int ib = 0; ib < k; ib++) t = fmaf(a.mixer[ib * k + jb], racc[ib * b + c], t);
        T0[o] = t;
    }
    __syncwarp();
    for (int hh = 1; hh < b; hh *= 2) {
        for (int p = lane; p < hd / 2; p += 32) {
            const int blk = p / (b / 2), qq = p % (b / 2), c = blk * b + (qq / hh) * 2 * hh + qq % hh;
            const float u = T0[c], w = T0[c + hh];
            T0[c] = u + w, T0[c + hh] = u - w;
        }
        __syncwarp();
    }
    for (int o = lane; o < hd; o += 32) {
        float t = b > 1 ? T0[o] * a.rot_norm : T0[o];
        if (a.signs && (a.signs[o >> 3] >> (o & 7) & 1)) t = -t;
        T1[a.perm ? a.perm[o] : o] = t;
    }
    __syncwarp();
}

/* Query row i's output at head h, normalised by l: acc (the values summed in the model's basis) plus, under SoloQ,
 * racc (the quantised values summed in the rotated basis) rotated back; T0 and T1 are kvq_rotate_back's scratch. */
__device__ void kvq_store_output(const kvq_args &a, const float *acc, const float *racc, float *T0, float *T1, float l,
                                 int i, int h, int lane) {
    __syncwarp();
    if (a.soloq) kvq_rotate_back(a, racc, T0, T1, lane);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int c = lane; c < a.hd; c += 32)
        a.o[(u64)i * a.o_stride + h * a.hd + c] = f32_to_bf16((acc[c] + (a.soloq ? T1[c] : 0.f)) * inv);
}

/* Key element e (of kv head kvh) of row j: bf16 (a sink, or a row past the committed ones) or decoded from its
 * codes. */
__device__ __forceinline__ bool kvq_quantised(const kvq_args &a, int j) { return j >= a.n_sink && j < a.n_committed; }

/* The K|V row of key j that is not quantised: a committed sink, or the forward's own row j - n_committed. */
__device__ __forceinline__ const bf16_t *kvq_bf16_row(const kvq_args &a, int j) {
    const u64 row_elems = (u64)2 * a.n_kv * a.hd;
    return j < a.n_committed ? a.sinks + (u64)j * row_elems : a.fresh + (u64)(j - a.n_committed) * row_elems;
}

/* [batch] The kvq_args of this CTA's chunk (b.chunks[chunk]) copied into shared memory by its threads, for kernels
 * whose body reads its arguments as the single-chunk kernel reads its parameter. */
__device__ __forceinline__ const kvq_args &kvq_batch_chunk(const kvq_batch_args &b, int chunk, kvq_args &sa) {
    const u32 *src = (const u32 *)(b.chunks + chunk);
    for (int w = threadIdx.x; w < (int)(sizeof(kvq_args) / 4); w += blockDim.x) ((u32 *)&sa)[w] = src[w];
    __syncthreads();
    return sa;
}

/* The block step's attention over the quantised cache (twin: dllm__cpu_attention over 9c's decoded cache):
 * one warp per (query row, head); keys in chunks of 32, a lane's score each, the online softmax in fp32, values
 * accumulated a lane per channel. SoloQ's quantised values are accumulated apart in their rotated basis and rotated
 * back once (kvq_rotate_back). One warp's query row i at head h: */
__device__ void kvq_attention_row(const kvq_args &a, int i, int h) {
    __shared__ float q[256], acc[256], racc[256], T0[256], T1[256];
    const int lane = threadIdx.x, hd = a.hd, kvd = a.n_kv * hd, kvh = h / (a.n_head / a.n_kv);
    const int row_bytes = kvd * a.bits / 8;
    for (int c = lane; c < hd; c += 32)
        q[c] = bf16_to_f32(a.q[(u64)i * a.q_stride + h * hd + c]), acc[c] = 0.f, racc[c] = 0.f;
    __syncwarp();
    const int n_visible = a.mask_block ? min(a.n_keys, ((a.q_index0 + i) / a.mask_block + 1) * a.mask_block) : a.n_keys;
    float m = -DLLM_INF, l = 0.f;
    for (int j0 = 0; j0 < n_visible; j0 += 32) {
        const int j = j0 + lane;
        float s = -DLLM_INF;
        if (j < n_visible) {
            const unsigned char *codes = a.k_codes + (u64)j * row_bytes;
            const unsigned short *pairs = a.k_pairs + ((u64)(j / max(a.group, 1)) * kvd + kvh * hd) * 2;
            float dot = 0.f;
            if (kvq_quantised(a, j))
                for (int c = 0; c < hd; c++)
                    dot = fmaf(q[c], kivi_decode(kvq_get(codes, kvh * hd + c, a.bits), pairs + 2 * c), dot);
            else {
                const bf16_t *k = kvq_bf16_row(a, j) + kvh * hd;
                for (int c = 0; c < hd; c++) dot = fmaf(q[c], bf16_to_f32(k[c]), dot);
            }
            s = dot * a.scale;
        }
        float corr;
        const float p = warp_softmax_chunk(s, j < n_visible, m, l, corr);
        for (int c = lane; c < hd; c += 32) acc[c] *= corr, racc[c] *= corr;
        for (int jj = 0; jj < 32 && j0 + jj < n_visible; jj++) {
            const int key = j0 + jj;
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            if (!kvq_quantised(a, key)) {
                const bf16_t *v = kvq_bf16_row(a, key) + kvd + kvh * hd;
                for (int c = lane; c < hd; c += 32) acc[c] = fmaf(pj, bf16_to_f32(v[c]), acc[c]);
                continue;
            }
            const unsigned char *codes = a.v_codes + (u64)key * row_bytes;
            if (a.soloq) {
                const float sc = __fmul_rn(pj, a.v_scale[(u64)key * a.n_kv + kvh]);
                for (int c = lane; c < hd; c += 32)
                    racc[c] = fmaf(sc, kvq_soloq_c(kvq_get(codes, kvh * hd + c, a.bits), a.bits), racc[c]);
            } else {
                const unsigned short *pair = a.v_pairs + ((u64)key * a.n_kv + kvh) * 2;
                for (int c = lane; c < hd; c += 32)
                    acc[c] = fmaf(pj, kivi_decode(kvq_get(codes, kvh * hd + c, a.bits), pair), acc[c]);
            }
        }
    }
    kvq_store_output(a, acc, racc, T0, T1, l, i, h, lane);
}
KERNEL_kvq_attention {
    pdl_enter();
    kvq_attention_row(a, blockIdx.x, blockIdx.y);
}
/* [batch] Every chunk's rows in one launch: CTA (x, h) runs row item x (its chunk's query row) at head h. */
KERNEL_kvq_attention_batch {
    pdl_enter();
    __shared__ kvq_args sa;
    const kvq_item it = b.items[blockIdx.x];
    kvq_attention_row(kvq_batch_chunk(b, it.chunk, sa), it.row, blockIdx.y);
}
