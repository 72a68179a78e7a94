__device__ __forceinline__ float warp_softmax_chunk(float s, bool valid, float &m, float &l, float &corr) {
    float mx = s;
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float m_new = fmaxf(m, mx);
    corr = m == -DLLM_INF ? 0.f : __expf(m - m_new);
    const float p = valid ? __expf(s - m_new) : 0.f;
    float ps = p;
    for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
    l = l * corr + ps, m = m_new;
    return p;
}
