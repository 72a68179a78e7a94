/* Twin: dllm__tensor_row on the embedding table. h[row] = embed[ids[row]] in fp32. */
KERNEL_embed_gather {
    pdl_enter();
    int row = blockIdx.x;
    if (row >= n_rows) return;
    const bf16_t *src = table + (u64)ids[row] * d;
    float *dst = h + (u64)row * d, f[8];
    for (int k = threadIdx.x * 8; k < d; k += blockDim.x * 8) {
        unpack8(*(const uint4 *)(src + k), f);
        store8(dst + k, f);
    }
}

/* Twin: dllm__cpu_rmsnorm after the residual add. For each batch b and row i < n_rows, with the source
 * row s = b * seq_len + row0 + i: v = h_in[s] (+ delta[s]); h_out[s] = v (if h_out); then
 * y[b * n_rows + i] = bf16(norm(v) * w). One CTA per row. */
KERNEL_add_rmsnorm {
    pdl_enter();
    int i = blockIdx.x, b = blockIdx.y;
    u64 src = (u64)b * seq_len + row0 + i, dst = (u64)b * n_rows + i;
    float v[NORM_SLOTS][8], g[8];
    const float r = residual_rms(h_in, h_out, delta, src, d, eps, v);
    bf16_t *yr = y + dst * d;
#pragma unroll
    for (int j = 0; j < NORM_SLOTS; j++) {
        const int k = (threadIdx.x + j * blockDim.x) * 8;
        if (k >= d) continue;
        load8(w + k, g);
        for (int e = 0; e < 8; e++) v[j][e] = (v[j][e] * r) * g[e];
        *(uint4 *)(yr + k) = pack8(v[j]);
    }
}

/* Twin: bias add + dllm__cpu_rope. In place on the fused projection rows [q heads | k heads | v heads]:
 * adds the fp32 bias, rotates q and k heads by the position p = (row % seq_len) + pos0 (or positions[p]: DPad) with the
 * same cos/sin tables as the CPU. Grid dllm__rows_grid: x over (head, 4 pairs) of a row, one thread each; y over rows,
 * so that a thread divides 32-bit numbers only (a flat 64-bit index took three 64-bit divisions a thread). */
KERNEL_rope_qkv {
    pdl_enter();
    // Without a bias the V heads are left alone: the pass touches q and k only.
    const int half = head_dim >> 1, quads = half >> 2, heads = n_head + 2 * n_kv, active = bias ? heads : n_head + n_kv;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= active * quads) return;
    const int j = idx % quads * 4, hd = idx / quads;
    for (int row = blockIdx.y; row < n_rows; row += gridDim.y) {
        bf16_t *x = qkv + (u64)row * heads * head_dim + hd * head_dim;
        uint2 lo = *(const uint2 *)(x + j), hi = *(const uint2 *)(x + j + half);
        float x1[4] = {__uint_as_float(lo.x << 16), __uint_as_float(lo.x & 0xffff0000u), __uint_as_float(lo.y << 16),
                       __uint_as_float(lo.y & 0xffff0000u)};
        float x2[4] = {__uint_as_float(hi.x << 16), __uint_as_float(hi.x & 0xffff0000u), __uint_as_float(hi.y << 16),
                       __uint_as_float(hi.y & 0xffff0000u)};
        if (bias) {
            const float *bh = bias + hd * head_dim;
            for (int e = 0; e < 4; e++) {
                x1[e] += bh[j + e];
                x2[e] += bh[j + half + e];
            }
        }
        if (hd < n_head + n_kv) {
            const int at = row % seq_len + pos0;
            const u64 t = (u64)(positions ? positions[at] : at) * half + j;
            float4 c = *(const float4 *)(cos_t + t), s = *(const float4 *)(sin_t + t);
            float cv[4] = {c.x, c.y, c.z, c.w}, sv[4] = {s.x, s.y, s.z, s.w};
            for (int e = 0; e < 4; e++) {
                float r1 = x1[e] * cv[e] - x2[e] * sv[e], r2 = x2[e] * cv[e] + x1[e] * sv[e];
                x1[e] = r1;
                x2[e] = r2;
            }
        }
        *(uint2 *)(x + j) = make_uint2(pack_bf16x2(x1[0], x1[1]), pack_bf16x2(x1[2], x1[3]));
        *(uint2 *)(x + j + half) = make_uint2(pack_bf16x2(x2[0], x2[1]), pack_bf16x2(x2[2], x2[3]));
    }
}

/* Twin: dllm__cpu_llama4_scale. [Llama-4 query scaling] (Nemotron) after RoPE, in place on the first `width` (the query
 * heads) of each row of `stride` elements: row r at position pos0 + r is scaled by 1 + beta
 * log(1 + floor(pos / orig_max)). Grid dllm__rows_grid: x over 8-column chunks, y over rows. */
KERNEL_llama4_scale_q {
    pdl_enter();
    const int col = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (col >= width) return;
    for (int row = blockIdx.y; row < n_rows; row += gridDim.y) {
        const float s = 1.0f + beta * logf(1.0f + floorf((float)(pos0 + row) / (float)orig_max));
        bf16_t *x = qkv + (u64)row * stride + col;
        float f[8];
        unpack8(*(const uint4 *)x, f);
        for (int e = 0; e < 8; e++) f[e] *= s;
        *(uint4 *)x = pack8(f);
    }
}

/* Twin: the CPU's silu(gate) * up. gu rows are [gate (f) | up (f)]; out rows are f wide. Grid dllm__rows_grid: x over
 * 8-column chunks of a row, y over rows (no division per thread, as in rope_qkv). */
KERNEL_swiglu {
    pdl_enter();
    const int col = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (col >= f) return;
    for (int row = blockIdx.y; row < n_rows; row += gridDim.y) {
        float g[8];
        silu_mul8(gu + (u64)row * 2 * f, f, col, g);
        *(uint4 *)(out + (u64)row * f + col) = pack8(g);
    }
}

/* The CFG unconditional canvas: prompt positions become MASK (twin: dllm__cpu_backend::apply_cfg). */
KERNEL_make_uncond {
    pdl_enter();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = is_prompt[i] ? mask_id : canvas[i];
}

/* Starts a block: bounds, schedule length, masks in the block (the n of k_i = n/s + (i < n%s)). */
KERNEL_block_begin {
    pdl_enter();
    __shared__ int count;
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    int mine = 0;
    for (int p = begin + threadIdx.x; p < end; p += blockDim.x) mine += canvas[p] == mask_id;
    atomicAdd(&count, mine);
    __syncthreads();
    if (threadIdx.x == 0) {
        st->block_begin = begin;
        st->block_end = end;
        st->steps_per_block = steps_per_block;
        st->step_in_block = 0;
        st->n_block_masks = count;
    }
}

/* Random weights for benchmarks (no file): normal with standard deviation `scale`, as the PyTorch reference draws
 * them (torch.randn * std), so that both time the same values (a power-capped GEMM's speed could depend on them; on
 * an H200 uniform weights of the same std timed the same), or the constant `scale` when constant != 0 (norm
 * weights). Box-Muller on a cheap integer hash: speed matters for 16 GB, quality does not. */
__device__ __forceinline__ u64 fill_hash(u64 z) {
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 31;
    z *= 0x94D049BB133111EBull;
    return z ^ (z >> 29);
}

KERNEL_fill_random_bf16 {
    pdl_enter();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 z = fill_hash(i + seed * 0x9E3779B97F4A7C15ull);
        const float u1 = ((float)(z >> 40) + 0.5f) * (1.0f / 16777216.0f),
                    u2 = (float)(z & 0xFFFFFFu) * (1.0f / 16777216.0f);
        const float normal = sqrtf(-2.f * __logf(u1)) * __cosf(6.2831853f * u2);
        w[i] = f32_to_bf16(constant ? scale : normal * scale);
    }
}

/* The index of the first NaN or infinity among n bf16 values into *first (which starts at n or above: atomicMin). The
 * check of a checkpoint's weights once they are on the device (twin: dllm__first_nonfinite, the CPU backend's scan). */
KERNEL_find_nonfinite_bf16 {
    pdl_enter();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        if ((w[i] & 0x7f80u) == 0x7f80u) atomicMin(first, i);
}
