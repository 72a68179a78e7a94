/* src/soloq/rotation.cpp - SoloQ numerics: the K-RPBH rotations. */

// ---------------------------------------------------------------------------------------------------
// 9b. SoloQ numerics (CPU reference): [K-RPBH] rotation, [NVFP4] / INT4 / E8P codebook / Lloyd-Max
//     quantisers, scale-only [bias correction]; the precisions [SoloQ-N] [SoloQ-I] [SoloQ-C] and the
//     [RTN-W4A4] baseline (spec soloq.md 2-6; the paper: arXiv 2610.07121)
//
//     SoloQ maps each linear's input x and each weight row w into one rotated basis, x' = R x and
//     w' = R w (so <w', x'> = <w, x>), where the coordinates are close to N(0, 1) after dividing by the
//     row's RMS, and quantises them there with fixed, calibration-free 4-bit grids. Activations are
//     quantised per token and weights per row: a row's codes and scale never depend on another row, so
//     batching and LaCache stay exact.
//
//     Every quantised row is stored as 4-bit codes plus one FP32 row scale (NVFP4 adds an E4M3 scale per
//     16): a code decodes to an exact fp32 "integer value" C (an odd integer, a Lloyd-Max INT8 level, an
//     E8P-RVQ INT8 value, or e2m1 * block scale) and the row's value is C * row_scale. A GEMM on two such
//     rows is row_scale_x * row_scale_w * sum C_x C_w: INT32-exact on 8-bit tensor cores for INT4, Lloyd
//     and E8P, exact products in BF16 for NVFP4 (spec 9.2 paths A and B). The GPU twin must reproduce the
//     codes and scales bit for bit, so every float operation here has one defined order and rounding:
//     row sums by dllm__soloq_dot's warp order, IEEE division and sqrt, no FMA contraction except the
//     explicit fmaf calls.
//
//     Packing (one layout, used by every quantise / dequantise function below), per row:
//       4-bit formats: two codes a byte, element 2i in the low nibble (PTX cvt.e2m1x2 order);
//         NVFP4  E2M1: bit 3 sign, bits 0-2 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6}; canonical zero 0;
//                plus one UE4M3 (dllm__f32_to_e4m3) per 16 elements in block_scales (the last block of a
//                row shorter when cols % 16);
//         INT4   mid-rise: two's complement q in [-8, 7], value C = 2q + 1 (odd, +-15 at most);
//         LLOYD  bit 3 sign, bits 0-2 level index: C = +-{6, 18, 30, 43, 58, 74, 95, 126} (46 x levels);
//         RTN    two's complement q in [-7, 7], value C = q;
//       E8P_RVQ: per 8 elements two little-endian uint16 E8P codes (stage 1, stage 2): 4 bytes;
//         C = W_int[e1][e2] = round(35.8 (e1 + e2 / 3.45)), |C| <= 127.
//     Rows are cols % 8 == 0 wide. Bits per weight: 4 + 32 / cols (row scale), NVFP4 4.5 + 32 / cols.
//
//     Rotations are generated on the host from a 64-bit seed with dllm's Philox (stream
//     DLLM__RNG_SOLOQ) and applied as a fast transform, never as a dense d x d matrix (except the dense
//     Haar option, for the ablation, d <= 1024).
// ---------------------------------------------------------------------------------------------------

/* The one summation order of SoloQ's row reductions. A segment: 32 strided fp32 partial sums (lane l takes i = l,
 * l + 32, ..., one fmaf each), then a warp's butterfly (partial l plus l + 16, then + 8, + 4, + 2, + 1). A row longer
 * than dllm__soloq_segment and a multiple of it is summed segment by segment, the segment sums added in order (so that
 * the GPU may split a row over a cluster of CTAs, each reducing its own segments); any other row is one segment. A GPU
 * warp reproduces a segment bit for bit with fmaf and __shfl_xor_sync. */
static const int dllm__soloq_segment = 1024;
/* soloq_quantize_rows's CTA (producer 0: every format, E8P's encoder included): at most 512 threads, so that it may
 * take 128 registers without spilling (its results do not depend on the thread count). */
static const unsigned dllm__soloq_quantize_threads = 512;

static float dllm__soloq_dot_segment(const float *a, const float *b, int n) {
    float p[32] = {0};
    for (int i = 0; i < n; i++) p[i & 31] = fmaf(a[i], b[i], p[i & 31]);
    for (int off = 16; off > 0; off >>= 1)
        for (int l = 0; l < off; l++) p[l] += p[l + off];
    return p[0];
}

static float dllm__soloq_dot(const float *a, const float *b, int n) {
    if (n <= dllm__soloq_segment || n % dllm__soloq_segment) return dllm__soloq_dot_segment(a, b, n);
    float sum = 0;
    for (int s = 0; s < n; s += dllm__soloq_segment) sum += dllm__soloq_dot_segment(a + s, b + s, dllm__soloq_segment);
    return sum;
}

// ---- [K-RPBH] rotations ------------------------------------------------------------------------------

enum dllm__rot_kind {
    DLLM__ROT_NONE = 0,      // identity (RTN)
    DLLM__ROT_HADAMARD = 1,  // plain block Walsh-Hadamard H_b / sqrt(b), b the largest power of two dividing d
    DLLM__ROT_RPBH = 2,      // (I_k x H_b) D P: permutation, signs, block Hadamard ("permutation only")
    DLLM__ROT_MIXER = 3,     // (Q_k x H_b) D: signs, block Hadamard, Haar mixer, no permutation ("mixer only")
    DLLM__ROT_KRPBH = 4,     // (Q_k x H_b) D P: SoloQ's rotation
    DLLM__ROT_HAAR = 5       // a dense Haar-random d x d rotation (d <= 1024)
};

static const char *const dllm__rot_names[] = {"none", "hadamard", "rpbh", "mixer", "krpbh", "haar"};
static const int dllm__haar_max_d = 1024;

/* R on d = k * b, applied to a row x as y = R x: gather y_i = s_i x[perm[i]], an FWHT on each of the k blocks of b
 * contiguous coordinates scaled by 1/sqrt(b), then Z = Q_k Y on the k x b view (block j is row j). */
struct dllm__rotation {
    dllm__rot_kind kind = DLLM__ROT_NONE;
    int d = 0, b = 1, k = 1;
    std::vector<int32_t> perm;       // empty: no permutation
    std::vector<uint8_t> sign_bits;  // bit i % 8 of byte i / 8 set: D_ii = -1; empty: no signs
    std::vector<float> mixer;        // Q_k [k][k] row-major (dense Haar: [d][d]); empty: no mixer
};

/* K-RPBH's block size for a dimension d (spec 2.2, an [I] choice): the largest power of two that divides d and is
 * at most 1024 and at most d / 4, so that the mixer sees k >= 4 blocks wherever d allows. 4096 -> 1024 (k 4),
 * 12288 -> 1024 (12), 3584 -> 512 (7), 18944 -> 512 (37), 14336 -> 1024 (14), 256 -> 64 (4), 640 -> 128 (5). */
static int dllm__krpbh_block(int d) {
    int b = 1;
    while (d % (2 * b) == 0 && 2 * b <= 1024 && 2 * b <= d / 4) b *= 2;
    return b;
}

static int dllm__pow2_factor(int d) { return d & -d; }

/* A standard normal draw from two Philox uniforms (Box-Muller in double). */
static double dllm__soloq_normal(uint64_t seed, uint32_t index, uint32_t site) {
    const double u1 = dllm__uniform(seed, 2 * index, site, 2, DLLM__RNG_SOLOQ),
                 u2 = dllm__uniform(seed, 2 * index + 1, site, 2, DLLM__RNG_SOLOQ);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* A Haar-random n x n orthogonal matrix (row-major, rounded to fp32): Gram-Schmidt, twice, on the columns of a
 * Gaussian matrix, in double. Gram-Schmidt makes every R_jj positive, which is the sign fix that makes QR Haar
 * (QuaRot's random_orthogonal_matrix). */
static std::vector<float> dllm__haar_matrix(int n, uint64_t seed, uint32_t site) {
    std::vector<double> a((size_t)n * n);  // column j at a[j * n ...]
    for (size_t i = 0; i < a.size(); i++) a[i] = dllm__soloq_normal(seed, (uint32_t)i, site);
    for (int j = 0; j < n; j++) {
        double *cj = &a[(size_t)j * n];
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < j; i++) {
                const double *ci = &a[(size_t)i * n];
                double dot = 0;
                for (int r = 0; r < n; r++) dot += ci[r] * cj[r];
                for (int r = 0; r < n; r++) cj[r] -= dot * ci[r];
            }
        double norm = 0;
        for (int r = 0; r < n; r++) norm += cj[r] * cj[r];
        norm = sqrt(norm);
        for (int r = 0; r < n; r++) cj[r] /= norm;
    }
    std::vector<float> q((size_t)n * n);
    for (int r = 0; r < n; r++)
        for (int c = 0; c < n; c++) q[(size_t)r * n + c] = (float)a[(size_t)c * n + r];
    return q;
}

/* The rotation of one site: a pure function of (kind, d, seed, site). site numbers the (layer, linear input) pairs,
 * so every site draws its own P, D and Q. Philox counters: (index, site, component, DLLM__RNG_SOLOQ) with component
 * 0 the permutation, 1 the signs, 2 the Gaussians of Q. b = 0 picks the default block size. */
static dllm__rotation dllm__make_rotation(dllm__rot_kind kind, int d, uint64_t seed, uint32_t site, int b = 0) {
    dllm__rotation r;
    r.kind = kind;
    r.d = d;
    if (kind == DLLM__ROT_NONE) return r;
    if (kind == DLLM__ROT_HAAR) {
        r.b = 1, r.k = d;
        r.mixer = dllm__haar_matrix(d, seed, site);
        return r;
    }
    r.b = b ? b : kind == DLLM__ROT_HADAMARD ? dllm__pow2_factor(d) : dllm__krpbh_block(d);
    r.k = d / r.b;
    if (kind == DLLM__ROT_HADAMARD) return r;
    if (kind != DLLM__ROT_MIXER) {  // Fisher-Yates
        r.perm.resize((size_t)d);
        for (int i = 0; i < d; i++) r.perm[(size_t)i] = i;
        for (int i = d - 1; i > 0; i--)
            std::swap(r.perm[(size_t)i],
                      r.perm[(size_t)(dllm__uniform(seed, (uint32_t)i, site, 0, DLLM__RNG_SOLOQ) * (i + 1))]);
    }
    r.sign_bits.assign((size_t)(d + 7) / 8, 0);
    for (int i = 0; i < d; i++)
        if (dllm__uniform(seed, (uint32_t)i, site, 1, DLLM__RNG_SOLOQ) < 0.5)
            r.sign_bits[(size_t)i / 8] |= (uint8_t)(1u << (i % 8));
    if (kind != DLLM__ROT_RPBH && r.k > 1) r.mixer = dllm__haar_matrix(r.k, seed, site);
    return r;
}

static inline float dllm__rot_sign(const dllm__rotation &r, int i) {
    return !r.sign_bits.empty() && (r.sign_bits[(size_t)i / 8] >> (i % 8) & 1) ? -1.0f : 1.0f;
}

/* In-place FWHT of each block of b coordinates of v (length k * b), then * 1/sqrt(b) rounded to fp32 once. The
 * butterflies are one add or subtract each, so any order of a stage gives the same bits. */
static void dllm__fwht_blocks(float *v, int k, int b) {
    const float norm = (float)(1.0 / sqrt((double)b));
    for (int j = 0; j < k; j++) {
        float *x = v + (size_t)j * b;
        for (int h = 1; h < b; h *= 2)
            for (int i = 0; i < b; i += 2 * h)
                for (int c = i; c < i + h; c++) {
                    const float p = x[c], q = x[c + h];
                    x[c] = p + q;
                    x[c + h] = p - q;
                }
        if (b > 1)
            for (int c = 0; c < b; c++) x[c] *= norm;
    }
}

/* out[j * b + c] = sum_i M[j][i] in[i * b + c] (transpose: M[i][j]), accumulated by fmaf over i ascending. */
static void dllm__mix_blocks(const float *m, bool transpose, const float *in, int k, int b, float *out) {
    for (int j = 0; j < k; j++)
        for (int c = 0; c < b; c++) {
            float acc = 0;
            for (int i = 0; i < k; i++)
                acc = fmaf(transpose ? m[(size_t)i * k + j] : m[(size_t)j * k + i], in[(size_t)i * b + c], acc);
            out[(size_t)j * b + c] = acc;
        }
}

/* y = R x for one row (x and y distinct, length r.d). */
static void dllm__rotate(const dllm__rotation &r, const float *x, float *y) {
    if (r.kind == DLLM__ROT_NONE) {
        memcpy(y, x, sizeof(float) * r.d);
        return;
    }
    std::vector<float> t((size_t)r.d);
    for (int i = 0; i < r.d; i++) t[(size_t)i] = dllm__rot_sign(r, i) * x[r.perm.empty() ? i : r.perm[(size_t)i]];
    dllm__fwht_blocks(t.data(), r.k, r.b);
    if (r.mixer.empty())
        memcpy(y, t.data(), sizeof(float) * r.d);
    else
        dllm__mix_blocks(r.mixer.data(), false, t.data(), r.k, r.b, y);
}

/* x = R^T y for one row (the inverse: R is orthogonal). The forward never needs it (weights are rotated by R as
 * rows: W R^T has rows R w_n); the tests and tools use it to undo a rotation. */
[[maybe_unused]] static void dllm__rotate_inverse(const dllm__rotation &r, const float *y, float *x) {
    if (r.kind == DLLM__ROT_NONE) {
        memcpy(x, y, sizeof(float) * r.d);
        return;
    }
    std::vector<float> t((size_t)r.d);
    if (r.mixer.empty())
        memcpy(t.data(), y, sizeof(float) * r.d);
    else
        dllm__mix_blocks(r.mixer.data(), true, y, r.k, r.b, t.data());
    dllm__fwht_blocks(t.data(), r.k, r.b);
    for (int i = 0; i < r.d; i++) x[r.perm.empty() ? i : r.perm[(size_t)i]] = dllm__rot_sign(r, i) * t[(size_t)i];
}
