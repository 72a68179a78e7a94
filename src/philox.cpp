/* src/philox.cpp - the counter-based Philox generator every random draw comes from. */

// ---------------------------------------------------------------------------------------------------
// 7. Philox counter-based RNG
//    Philox4x32-10 (Salmon et al. 2011). A draw is a pure function of (seed; vocab index, position,
//    step, stream), so the CPU, the GPU and tools/make_fixtures.py produce the same numbers in any order.
// ---------------------------------------------------------------------------------------------------

enum dllm__rng_stream : uint32_t {
    DLLM__RNG_GUMBEL = 1,    // token noise for temperature > 0, counter (vocab index, position, step)
    DLLM__RNG_REMASK = 2,    // 'random' remasking confidence, counter (0, position, step)
    DLLM__RNG_NLL = 3,       // dllm-eval's masked-token NLL masks, counter (index, window, ratio)
    DLLM__RNG_DPAD = 4,      // DPad's kept suffix, counter (suffix distance, position, block)
    DLLM__RNG_ORIGIN = 5,    // Dream's 'origin' transfer draw, counter (0, position, step)
    DLLM__RNG_ALG_TEMP = 6,  // alg_temp's Gumbel noise on the confidence, counter (0, position, step)
    DLLM__RNG_SOLOQ = 7      // SoloQ's rotations (section 9b), counter (element, site, component)
};

static void dllm__philox(uint64_t seed, const uint32_t ctr_in[4], uint32_t out[4]) {
    uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
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

/* A uniform double strictly inside (0, 1): 53 random bits, offset by half a unit. */
static double dllm__uniform(uint64_t seed, uint32_t index, uint32_t position, uint32_t step, uint32_t stream) {
    uint32_t ctr[4] = {index, position, step, stream}, o[4];
    dllm__philox(seed, ctr, o);
    uint64_t bits = ((uint64_t)o[0] << 32 | o[1]) >> 11;
    return ((double)bits + 0.5) * (1.0 / 9007199254740992.0);
}
