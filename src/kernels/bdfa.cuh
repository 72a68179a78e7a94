/* The online softmax of the warp's query q (shared, hd floats) over keys [j0, j1) of kv head kvh: keys in chunks of
 * 32, a lane's score each, max and normaliser in fp32, values accumulated a lane per channel into acc (shared). */
__device__ void bdfa_part(const bdfa_args &a, const float *q, int kvh, int j0, int j1, float *acc, float &m, float &l) {
    const int lane = threadIdx.x % 32, hd = a.hd, kvd = a.n_kv * hd;
    m = -DLLM_INF, l = 0.f;
    for (int c = lane; c < hd; c += 32) acc[c] = 0.f;
    for (int jb = j0; jb < j1; jb += 32) {
        const int j = jb + lane;
        float s = -DLLM_INF;
        if (j < j1) {
            const bf16_t *k = a.cache + (u64)j * 2 * kvd + kvh * hd;
            float dot = 0.f;
            if (hd % 8 == 0) {  // 16-byte loads: rows and heads start at multiples of 8 elements
                for (int c = 0; c < hd; c += 8) {
                    const uint4 w = *(const uint4 *)(k + c);
                    const u32 x[4] = {w.x, w.y, w.z, w.w};
                    for (int t = 0; t < 4; t++) {
                        dot = fmaf(q[c + 2 * t], __uint_as_float(x[t] << 16), dot);
                        dot = fmaf(q[c + 2 * t + 1], __uint_as_float(x[t] & 0xffff0000u), dot);
                    }
                }
            } else {
                for (int c = 0; c < hd; c++) dot = fmaf(q[c], bf16_to_f32(k[c]), dot);
            }
            s = dot * a.scale;
        }
        float corr;
        const float p = warp_softmax_chunk(s, j < j1, m, l, corr);
        for (int c = lane; c < hd; c += 32) acc[c] *= corr;
        for (int jj = 0; jj < 32 && jb + jj < j1; jj++) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const bf16_t *v = a.cache + (u64)(jb + jj) * 2 * kvd + kvd + kvh * hd;
            for (int c = lane; c < hd; c += 32) acc[c] = fmaf(pj, bf16_to_f32(v[c]), acc[c]);
        }
    }
    __syncwarp();
}

__device__ void bdfa_load_q(const bdfa_args &a, int i, int h, float *q) {
    for (int c = threadIdx.x; c < a.hd; c += blockDim.x) q[c] = bf16_to_f32(a.q[(u64)i * a.q_stride + h * a.hd + c]);
    __syncthreads();
}

/* Warp w takes committed keys [w n, (w + 1) n) (n a multiple of 32); the states merge in warp order, each warp's scaled
 * by exp(m_w - max m): the same bits for the same keys whichever rows a launch lists. */
KERNEL_bdfa_committed {
    pdl_enter();
    const int W = DLLM_BDFA_WARPS;
    __shared__ float q[256], acc[W][256], wm[W], wl[W];
    if (a.n_rows && (int)blockIdx.x >= *a.n_rows) return;  // a graph's launch covers every row; the list holds n_rows
    const int i = a.rows[blockIdx.x], h = blockIdx.y, hd = a.hd, w = threadIdx.x / 32;
    bdfa_load_q(a, i, h, q);
    const int n = (a.n_committed + 32 * W - 1) / (32 * W) * 32, j0 = min(a.n_committed, w * n),
              j1 = min(a.n_committed, j0 + n);
    float m, l;
    bdfa_part(a, q, h / (a.n_head / a.n_kv), j0, j1, acc[w], m, l);
    if (threadIdx.x % 32 == 0) wm[w] = m, wl[w] = l;
    __syncthreads();
    float mx = -DLLM_INF;
    for (int u = 0; u < W; u++) mx = fmaxf(mx, wm[u]);
    float *st = a.state + ((u64)(a.offset + i) * a.n_head + h) * (hd + 2);
    for (int c = threadIdx.x; c < hd + 1; c += blockDim.x) {
        float sum = 0.f;
        for (int u = 0; u < W; u++) {
            const float f = wm[u] == -DLLM_INF ? 0.f : __expf(wm[u] - mx);
            sum = fmaf(c < hd ? acc[u][c] : wl[u], f, sum);
        }
        st[c < hd ? c : hd + 1] = sum;
    }
    if (threadIdx.x == 0) st[hd] = mx;
}

/* Every row: its own keys' state merged with its committed state (dllm__softmax_merge; 0 where no key was seen). */
KERNEL_bdfa_merge {
    pdl_enter();
    __shared__ float q[256], acc[256];
    const int i = blockIdx.x, h = blockIdx.y, hd = a.hd;
    const int n_visible = a.mask_block ? min(a.n_keys, ((a.q_index0 + i) / a.mask_block + 1) * a.mask_block) : a.n_keys;
    bdfa_load_q(a, i, h, q);
    float m2, l2;
    bdfa_part(a, q, h / (a.n_head / a.n_kv), min(a.n_committed, n_visible), n_visible, acc, m2, l2);
    const float *st = a.state + ((u64)(a.offset + i) * a.n_head + h) * (hd + 2);
    const float m1 = st[hd], l1 = st[hd + 1], mx = fmaxf(m1, m2);
    const float a1 = m1 == -DLLM_INF ? 0.f : __expf(m1 - mx), a2 = m2 == -DLLM_INF ? 0.f : __expf(m2 - mx);
    const float l = __fadd_rn(__fmul_rn(l1, a1), __fmul_rn(l2, a2)),
                inv = mx == -DLLM_INF || !(l > 0.f) ? 0.f : 1.f / l;
    for (int c = threadIdx.x; c < hd; c += 32)
        a.o[(u64)i * a.o_stride + h * hd + c] =
            f32_to_bf16(__fmul_rn(__fadd_rn(__fmul_rn(st[c], a1), __fmul_rn(acc[c], a2)), inv));
}
