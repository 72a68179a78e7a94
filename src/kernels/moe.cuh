/* src/kernels/moe.cuh - LLaDA2's kernels (../shared/spec/llada2.md, "Forward"): QK-norm with partial RoPE, the sigmoid
 * router's group-limited top-k, and the gather / weighted sum around the routed experts' GEMMs (which run through the
 * backend's GEMM entry point, one expert at a time, on the rows routed to it). Every kernel works row by row: a row's
 * bits never depend on which other rows are in the launch, so an expert's choice and a token's sum do not depend on
 * the other tokens (or sequences) of the forward. Needs MOE_MAX_EXPERTS and MOE_MAX_GROUPS. */

/* Twin: dllm__cpu_llada2_qkv's QK-norm and RoPE (dllm__cpu_rmsnorm over each Q and K head with the shared head-dim
 * weight, then dllm__cpu_rope on the first rotary_dim dims). In place on the fused projection rows [q heads | k heads |
 * v heads] of rows at positions pos0 + row; the normed values stay fp32 through the rotation (one rounding to bf16, as
 * the CPU's fp32). Null q_norm: no QK-norm (use_qk_norm false). One warp a (row, head): grid x over rows, y over
 * groups of 4 heads (Q and K heads only), 128 threads. */
KERNEL_qk_norm_rope {
    pdl_enter();
    const int row = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y * 4 + warp;
    if (row >= n_rows || head >= n_head + n_kv) return;
    bf16_t *x = qkv + (u64)row * (n_head + 2 * n_kv) * head_dim + (u64)head * head_dim;
    const float *w = head < n_head ? q_norm : k_norm;
    float r = 1.0f;
    if (w) {
        float ss = 0.f;
        for (int k = lane; k < head_dim; k += 32) {
            const float v = bf16_to_f32(x[k]);
            ss += v * v;
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);  // every lane: the same sum
        r = rsqrtf(ss / (float)head_dim + eps);
    }
    __syncwarp();  // every read above precedes every write below
    const int half = rotary_dim >> 1;
    const u64 t0 = (u64)(pos0 + row) * half;
    for (int j = lane; j < half; j += 32) {  // pairs (j, j + half) of the rotated dims
        float x1 = bf16_to_f32(x[j]), x2 = bf16_to_f32(x[j + half]);
        if (w) {
            x1 = (x1 * r) * w[j];
            x2 = (x2 * r) * w[j + half];
        }
        const float c = cos_t[t0 + j], s = sin_t[t0 + j];
        x[j] = f32_to_bf16(x1 * c - x2 * s);
        x[j + half] = f32_to_bf16(x2 * c + x1 * s);
    }
    if (w)
        for (int k = rotary_dim + lane; k < head_dim; k += 32) x[k] = f32_to_bf16((bf16_to_f32(x[k]) * r) * w[k]);
}

/* The largest of a warp's (value, index) candidates, ties to the lower index; NaN never wins. Every lane returns the
 * same pair (the order is total over distinct indices). index INT_MAX: no candidate. */
__device__ __forceinline__ void moe_warp_best(float &value, int &index) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, value, o);
        const int oi = __shfl_xor_sync(0xffffffffu, index, o);
        if (ov > value || (ov == value && oi < index)) value = ov, index = oi;
    }
}

__device__ __forceinline__ float moe_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Twin: dllm__moe_route_token. One warp a row of fp32 router logits: s = sigmoid(logit), routing score s +
 * expert_bias; each group scored by the sum of its top 2 routing scores; the n_group_used best groups (ties to the
 * lower group), then the top_k best experts among them (ties to the lower expert), highest first, into
 * expert[row][0..top_k); their weights the unbiased s normalised by their sum (+1e-20, when top_k > 1), times
 * routed_scale, summed in that order as the CPU sums. A slot left without an expert (NaN scores) holds -1. */
KERNEL_moe_route {
    pdl_enter();
    __shared__ float routing[MOE_MAX_EXPERTS], group_score[MOE_MAX_GROUPS];
    __shared__ unsigned char chosen[MOE_MAX_EXPERTS], group_kept[MOE_MAX_GROUPS];
    __shared__ float picked_s[32];
    const int row = blockIdx.x, lane = threadIdx.x;
    if (row >= n_rows) return;
    const float *lg = logits + (u64)row * n_expert;
    for (int e = lane; e < n_expert; e += 32) {
        routing[e] = moe_sigmoid(lg[e]) + expert_bias[e];
        chosen[e] = 0;
    }
    __syncwarp();
    const int per_group = n_expert / n_group;
    for (int g = lane; g < n_group; g += 32) {
        float b0 = -DLLM_INF, b1 = -DLLM_INF;  // the largest two, a tie counted twice (top-2 by index)
        for (int i = 0; i < per_group; i++) {
            const float v = routing[g * per_group + i];
            if (v > b0)
                b1 = b0, b0 = v;
            else if (v > b1)
                b1 = v;
        }
        group_score[g] = b0 + b1;
        group_kept[g] = 0;
    }
    __syncwarp();
    for (int it = 0; it < n_group_used; it++) {
        float bv = -DLLM_INF;
        int bi = 0x7fffffff;
        for (int g = lane; g < n_group; g += 32)
            if (!group_kept[g] && (group_score[g] > bv || (group_score[g] == bv && g < bi)))
                bv = group_score[g], bi = g;
        moe_warp_best(bv, bi);
        __syncwarp();
        if (lane == 0 && bi < n_group) group_kept[bi] = 1;
        __syncwarp();
    }
    for (int it = 0; it < top_k; it++) {
        float bv = -DLLM_INF;
        int bi = 0x7fffffff;
        for (int e = lane; e < n_expert; e += 32)
            if (group_kept[e / per_group] && !chosen[e] && (routing[e] > bv || (routing[e] == bv && e < bi)))
                bv = routing[e], bi = e;
        moe_warp_best(bv, bi);
        __syncwarp();
        if (lane == 0) {
            const bool found = bi < n_expert;
            if (found) chosen[bi] = 1;
            expert[(u64)row * top_k + it] = found ? bi : -1;
            picked_s[it] = found ? moe_sigmoid(lg[bi]) : 0.f;
        }
        __syncwarp();
    }
    if (lane == 0) {
        float sum = 0.f;
        for (int it = 0; it < top_k; it++) sum += picked_s[it];
        for (int it = 0; it < top_k; it++)
            weight[(u64)row * top_k + it] = (top_k > 1 ? picked_s[it] / (sum + 1e-20f) : picked_s[it]) * routed_scale;
    }
}

/* Twin: the rows memcpy of dllm__cpu_moe. out[i] = x[rows[i]] (d bf16, a multiple of 8), one CTA a row. */
KERNEL_moe_gather_rows {
    pdl_enter();
    const int i = blockIdx.x;
    if (i >= n_rows) return;
    const uint4 *from = (const uint4 *)(x + (u64)rows[i] * d);
    uint4 *to = (uint4 *)(out + (u64)i * d);
    for (int c = threadIdx.x; c < d / 8; c += blockDim.x) to[c] = from[c];
}

/* Twin: the final sum of dllm__cpu_moe. out[t] = (sum over slots s in order of weight[t][s] expert_out[slot_row[t][s]])
 * + shared[t] (null: none), fp32 until the one rounding to bf16; a slot_row of -1 adds nothing. Grid dllm__rows_grid:
 * x over 8-column chunks, y over rows. */
KERNEL_moe_combine {
    pdl_enter();
    const int col = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (col >= d) return;
    for (int t = blockIdx.y; t < n_rows; t += gridDim.y) {
        float acc[8], f[8];
        for (int e = 0; e < 8; e++) acc[e] = 0.f;
        for (int s = 0; s < top_k; s++) {
            const int r = slot_row[(u64)t * top_k + s];
            if (r < 0) continue;
            const float w = weight[(u64)t * top_k + s];
            unpack8(*(const uint4 *)(expert_out + (u64)r * d + col), f);
            for (int e = 0; e < 8; e++) acc[e] += w * f[e];
        }
        if (shared) {
            unpack8(*(const uint4 *)(shared + (u64)t * d + col), f);
            for (int e = 0; e < 8; e++) acc[e] += f[e];
        }
        *(uint4 *)(out + (u64)t * d + col) = pack8(acc);
    }
}
