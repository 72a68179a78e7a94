/* src/gpu/weight_formats.cpp - the weight formats and the GEMM entry point types. */

// ---------------------------------------------------------------------------------------------------
// 16. GPU backend: weight formats, shared weights, activations, forward plan, forward, sampler, step graphs
//     16.1 [weight formats] how a linear's weight is stored, and the one GEMM entry point that takes any of them
//     16.2 [shared weights] the device weights belong to the model: one copy per (device, weight formats), shared
//          by every context on it, freed with the last one
//     16.3 [activations] a context's buffers, named and shaped; [forward plan] which rows each stage computes
//     16.4 the backend: forward (LaCache's [EmbedCache] [RoPECache] [FACache] in layer 0, [truncation] in the last
//          layer, [FP8 fused norm+quantise], [dual cache] / [prefix cache], [DPad] positions), LM head, sampler,
//          [step graphs]; the [batch] forward, its K/V-cache step and the batched block-diffusion forward
//          (bd_forward_batch)
//          16.4.3 [block diffusion]: bd_begin / bd_forward over a committed-block K/V cache, logits to the host
//     16.5 [debug hooks] stage timers and logit recording for tests and benchmarks
//     Weights are BF16 with the projections fused (Q|K|V rows, gate|up rows); norms, biases and RoPE tables stay
//     fp32. The residual stream is fp32. One denoising step (forward, LM head, confidence, top-k commit) is
//     captured once as a CUDA graph and replayed: the step counter, the block bounds and the canvas live on the
//     device, so the host issues one launch per step and never copies logits.
// ---------------------------------------------------------------------------------------------------

static inline int dllm__round_up(int x, int m) { return (x + m - 1) / m * m; }

/* 16.1 [weight formats] How a linear layer's weight W [n x k] (y = x W^T) is stored on the device, and which activation
 * operand its GEMMs take. Adding a format is a row here, its quantiser beside dllm__gpu_layer_quantize_e4m3, its case
 * in dllm__gpu_backend::gemm, and its kernels; nothing else in the forward changes. */
enum dllm__wformat {
    DLLM__W_BF16 = 0,  // bf16 [n x k], row-major: cuBLASLt, or gemm_wg on sm_90a
    DLLM__W_E4M3_BLOCK =
        1,           // E4M3 [n x k_pad] (k padded to whole 128-blocks with zero codes), an fp32 scale per 128x128
                     // block at scale[nb * ceil4(k_pad / 128) + kb] (BLK128x128): cuBLASLt block-scaled or fp8_gemm
    DLLM__W_Q4 = 2,  // [SoloQ] rows of W R^T in a 4-bit format (section 9b's packing: codes [n][k / 2], NVFP4 block
    // scales [n][ceil(k / 16)]), an fp32 row scale each (on sm_90a the layer linears of the integer formats and
    // of NVFP4 are re-laid out for q4wg, NVFP4's block scales inside that layout, and q4wg then runs every GEMM
    // of theirs): q4_gemm on few rows, else the INT8 GEMM
    // or the C values dequantised to BF16 for cuBLASLt, an fp32 epilogue applying the scales
    // (dllm__gpu_backend::gemm_q4)
};
enum dllm__aformat {
    DLLM__A_BF16 = 0,        // bf16 rows [M x k]
    DLLM__A_E4M3_1X128 = 1,  // E4M3 rows [M_pad x k_pad] (M_pad = 16 * ceil(M / 16)), an fp32 scale per 1x128 group at
                             // scale[kb * M_pad + m] (VEC128): written by the producers (add_rmsnorm_e4m3, swiglu_e4m3)
    DLLM__A_Q4 = 2,  // [SoloQ] bf16 rows [M x k] rotated by the weight's R and quantised per token: their C values and
                     // an fp32 scale per row (-w4a16: the rotated rows, no scale); the GEMM entry point makes them
};
struct dllm__wformat_desc {
    const char *name;
    double bits_per_weight;  // in device memory, scales included (n and k multiples of 128)
    dllm__aformat act;       // the activation its GEMMs take
};
static const dllm__wformat_desc dllm__wformats[] = {
    {"BF16", 16.0, DLLM__A_BF16},
    {"E4M3 with 128x128 block scales", 8.0 + 32.0 / (128 * 128), DLLM__A_E4M3_1X128},
    {"SoloQ 4-bit rows", 4.0, DLLM__A_Q4},  // + 32 / k for the row scale, + 0.5 for NVFP4's block scales
};

/* [SoloQ] What a DLLM__W_Q4 weight's GEMM needs beside its codes and row scales: the format, the rotation of its input
 * (on the device: dllm__rotation's arrays), and how its activations are quantised. */
struct dllm__rotation_dev {
    dllm__dbuf perm, signs, mixer;  // empty: identity
    int b = 1, k = 1;
    float norm = 1.0f;  // 1 / sqrt(b) rounded to fp32, as dllm__fwht_blocks
};
struct dllm__q4_site {
    dllm__q4_format format = DLLM__Q4_INT4;
    bool packed = false;      // [W4 GEMM] the codes in q4wg's layout (dllm__q4wg_pack), not section 9b's rows
    dllm__dbuf block_scales;  // NVFP4 [n][ceil(k / 16)] UE4M3; empty once packed (the layout holds them)
    std::shared_ptr<const dllm__rotation_dev> rot;
};

/* A weight as a GEMM reads it (the tied LM head is a view of the embedding table). */
struct dllm__weight_view {
    dllm__wformat format;
    int n, k;
    const void *data;                   // the codes, in the format's layout
    const float *scale;                 // the format's scales, or null
    const dllm__q4_site *q4 = nullptr;  // DLLM__W_Q4 only
};

/* One linear layer's weight, owned. */
struct dllm__linear {
    dllm__wformat format = DLLM__W_BF16;
    int n = 0, k = 0;
    dllm__dbuf data, scale;
    std::unique_ptr<dllm__q4_site> q4;  // DLLM__W_Q4 only
    dllm__weight_view view() const { return {format, n, k, data.ptr, scale.as<float>(), q4.get()}; }
};

/* What a GEMM's rows must satisfy. TUNED may take the fastest algorithm for its row count. INDEPENDENT gives every row
 * the bits it has in any other launch of the same shape: one algorithm per (format, N, K), launches of at most
 * dllm__gemm::pin_m rows. LaCache computes some rows apart from the plain path (layer 0's Q/K/V, the last layer after
 * its attention, the LM head) and needs it there; batching will need it for every GEMM (a sequence's logits may not
 * depend on its batch).
 * BATCH (a batched forward, forward_batch) is INDEPENDENT in one launch where the GEMM allows it: gemm_wg where it
 * takes the operands (row-independent at any row count, by construction, and the same bits at every tile width, so the
 * width may follow the row count: batch_gemm_wg), else INDEPENDENT's pinned algorithm, which depends on the shape
 * alone. So a sequence's rows get the same bits whatever else the batch holds.
 * STEP (a K/V-cache step: a sequence forwarding fewer rows than its canvas; a block-diffusion forward of at most 128
 * rows) is INDEPENDENT on gemm_splitk, fast at a few rows, where it takes the operands; FILL (a K/V cache's full
 * forward) is BATCH's single launch. A batched forward gives each sequence its kind's GEMM (batch_.gemm_runs); a solo
 * forward under a K/V cache (tuned_forwards) takes the same (dllm__gpu_backend::solo_kv_). */
enum dllm__rows { DLLM__ROWS_TUNED, DLLM__ROWS_INDEPENDENT, DLLM__ROWS_BATCH, DLLM__ROWS_STEP, DLLM__ROWS_FILL };
