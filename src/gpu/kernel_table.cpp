/* src/gpu/kernel_table.cpp - the host/kernel contract, the kernel tables and the kernel sources. */

// ---------------------------------------------------------------------------------------------------
// 13. GPU kernel sources (compiled by NVRTC at first use)
//     Strings, not __global__ functions: dllm_cuda.cu holds no device code, so it builds anywhere and a
//     kernel is compiled only for the GPU it runs on. No headers: bf16 is handled as raw 16-bit values
//     with PTX conversions, so the JIT needs nothing but libnvrtc at run time.
//     Each kernel names its CPU twin; tests/test_gpu.inl compares every pair on fresh random inputs.
//     [host/kernel contract] What host and kernels share (structs, enums, constants, each kernel's parameter
//     list) is written once below as X-macros: the host compiles them, and the kernel source receives the
//     same text stringified (dllm__src_contract). [kernel table] Each extern "C" kernel is one table row
//     (name, attributes, parameters): the row declares the kernel in the source (KERNEL_<name>), lists it for
//     NVRTC, types its host handle (dllm__kernel) and checks every launch's arguments against it.
//     [#line] Each source string starts with a #line directive: NVRTC errors, -lineinfo and Nsight name
//     lines of dllm_cuda.cu.
// ---------------------------------------------------------------------------------------------------

#define DLLM__STR(...) #__VA_ARGS__
#define DLLM__XSTR(...) DLLM__STR(__VA_ARGS__)
/* DLLM__KERNEL_FILE("x.cuh") stands for the text of src/kernels/x.cuh as a string literal: tools/amalgamate.py puts
 * it there, with a #line directive first, so NVRTC's errors and -lineinfo name lines of src/kernels/x.cuh. */

/* The kernels' fixed-width types, the same names on the host (the contract's structs use them on both sides). */
typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;

/* The decoding state that lives on the device so that a captured step graph can replay unchanged. */
#define DLLM__STEP_STATE_FIELDS(X)                                                                                     \
    X(int, block_begin)                                                                                                \
    X(int, block_end) /* current block [begin, end) */                                                                 \
    X(int, steps_per_block)                                                                                            \
    X(int, step_in_block) /* advanced by select_commit */                                                              \
    X(int, global_step)   /* keys the RNG; advanced by select_commit */                                                \
    X(int, n_block_masks) /* masks in the block at its first step */                                                   \
    X(int, n_committed)   /* positions committed by the last step */                                                   \
    X(int, n_block_left)  /* masks left in the block after the last step */

/* One sampler CTA's statistics of its vocabulary slice for one row (conf_partial_kernel -> conf_combine_kernel). */
#define DLLM__CONF_PARTIAL_FIELDS(X)                                                                                   \
    X(double, best_score) /* argmax criterion: the logit (T = 0) or the Gumbel score (T > 0) */                        \
    X(double, sum_exp)    /* sum of e^x over the slice, x = (l - max_logit) * inv_t */                                 \
    X(double, sum_exp_x)  /* ENTROPY: sum of e^x x over the slice */                                                   \
    X(float, max_logit)                                                                                                \
    X(float, second_logit) /* MARGIN: the second largest logit of the slice (a tie for the largest counts twice) */    \
    X(float, best_logit)                                                                                               \
    X(int, best_idx)

/* The sampler's arguments (one step's token choice over rows of logits). */
#define DLLM__SAMPLER_ARGS_FIELDS(X)                                                                                   \
    X(const float *, cond)   /* [rows][vocab] logits */                                                                \
    X(const float *, uncond) /* CFG: unconditional logits with the same layout, or null */                             \
    X(float, cfg_weight)     /* s + 1: logits = U + (s + 1)(C - U) */                                                  \
    X(int, vocab)                                                                                                      \
    X(int, slice)                                                                                                      \
    X(int, n_slices)                                                                                                   \
    X(int, n_rows) X(int, pos0)      /* canvas position of row 0 */                                                    \
        X(int, lrow0) X(int, shift0) /* logits row of row r: (shift0 ? max(r - 1, 0) : r) + lrow0 (Dream's shift) */   \
        X(int, raw_rows)             /* logits rows per batch entry in the buffer */                                   \
        X(double, temperature) X(u64, seed) X(int, eos_inf) X(int, eos_id) X(int, eot_id) X(int, defer_eos_eot)        \
            X(int, remasking) /* dllm_remasking: which confidence */                                                   \
        X(int, conf_tempered) /* the confidence's softmax is Dream's softmax(l / T), not LLaDA's softmax(l) */         \
        X(double, alg_temp)   /* > 0: the ranking key is conf / alg_temp + Gumbel noise */                             \
        X(int, top_k) X(float, top_p)                                                                                  \
            X(float, min_p)      /* the sampler filters (dllm_gen_params), applied through cutoff */                   \
        X(const float *, cutoff) /* [n_rows] row_cutoff_kernel's output: a logit below it is -inf; null = no filter */

/* The attention's arguments: query row r of batch b, head h at q + b*q_bstride + r*q_stride + h*HD; key row at
 * k + (b*seq + r)*kv_stride + h*HD; output like the query with o_*. */
#define DLLM__ATTN_ARGS_FIELDS(X)                                                                                      \
    X(const bf16_t *, q)                                                                                               \
    X(const bf16_t *, k)                                                                                               \
    X(const bf16_t *, v)                                                                                               \
    X(bf16_t *, o) X(const unsigned char *, key_valid) /* [batch][seq] or null */                                      \
    X(int, seq) X(int, q_rows) /* keys and query rows per batch entry (a K/V cache step: q_rows < seq) */              \
    X(int, q_stride) X(int, kv_stride) X(int, o_stride) X(int, group) /* group = n_head / n_kv */                      \
    X(u64, q_bstride) X(u64, o_bstride)                                                                                \
    X(const dllm_step_state *, st) /* current block: its KV tiles are visited last; null or empty: plain order */      \
    X(float, scale_log2)           /* log2(e) / sqrt(HD) */                                                            \
    X(int, fa_mode)                /* FACache: 0 plain, 1 save the state after the early tiles, 2 resume from it */    \
    X(float *, fa_state)           /* [batch][head][q tile][field][thread] online-softmax registers (modes 1, 2) */    \
    /* kv_splits: CTAs per (query tile, head) sharing the KV tiles; > 1: blockIdx.z = batch * kv_splits + split */     \
    X(int, kv_splits)                                                                                                  \
    X(float *, partial) /* kv_splits > 1: per-split states for attn_combine (see store_partial) */                     \
    X(int, mask_block)  /* > 0: block-causal (block diffusion): query row r sees keys < min(seq, visible_keys) */      \
    X(int, q_index0)    /* the sequence index of query row 0 for that mask (key j's index is j) */                     \
    X(const int *, q_offsets) /* varlen (flash_attn<..., true>) [batch + 1]: sequence b's query (and output) rows */   \
    /* kv_offsets: [q_offsets[b], q_offsets[b+1]) of q and o, its keys [kv_offsets[b], ..[b+1]) of k, v */             \
    X(const int *, kv_offsets)                                                                                         \
    /* varlen_masks: varlen, or null: [batch][2] sequence b's (mask_block, q_index0), keys counted from its first */   \
    X(const int *, varlen_masks)                                                                                       \
    /* varlen_splits: varlen, or null (1 each): [batch][2] entry b's split-KV shares (<= kv_splits) and where its */ \
    /* partial states start in partial (floats) */                                                                  \
    X(const int *, varlen_splits)                                                                                      \
    /* varlen_work: varlen: the CTAs' work items (dllm__attn_varlen_work): flash_attn's int4 (q tile, entry, */        \
    /* share, 0), attn_combine's int2 (entry, row) */                                                                  \
    X(const int *, varlen_work)

#define DLLM__GEMM_WG_ARGS_FIELDS(X) X(int, m) X(int, n) X(int, k)

/* soloq_quantize_rows's arguments: bf16 rows of x rotated by R = mixer . FWHT_b . signs . perm (a
 * null array is the identity) and quantised in `format` (dllm__q4_format). */
#define DLLM__SOLOQ_ARGS_FIELDS(X)                                                                                     \
    X(const void *, x)                                                                                                 \
    X(u64, x_stride) /* row r at x + r * x_stride elements */                                                          \
    X(const int *, perm)                                                                                               \
    X(const unsigned char *, signs)                                                                                    \
    X(const float *, mixer) /* [d], [d / 8] bits, [k][k] */                                                            \
    X(unsigned char *, codes)                                                                                          \
    X(unsigned char *, block_scales)          /* packed rows [rows][d / 2], NVFP4 [rows][d / 16]; or null */           \
    X(float *, row_scale) X(bf16_t *, values) /* [rows]; the C values [rows][d] (or null) */                           \
    X(const float *, h_in) X(float *, h_out) X(const bf16_t *, delta)                                                  \
    X(const float *, norm_w) /* producer 1's operands */                                                               \
    X(int, rows) X(int, d) X(int, rot_b) X(int, rot_k) X(int, format) X(int, quantize) X(int, bias_correction)         \
    /* producer: 0: the bf16 rows x; 1: add_rmsnorm's row (h_in (+ delta) -> h_out, normed by norm_w); 2: SwiGLU of    \
     * the [gate | up] rows x */                                                                                       \
    X(int, producer)                                                                                                   \
    X(int, cluster)    /* CTAs a row (dllm__soloq_split): a cluster along x */                                         \
    X(float, rot_norm) /* 1 / sqrt(rot_b), rounded to fp32 once */                                                     \
    X(float, eps)      /* producer 1's RMSNorm epsilon */                                                              \
    /* values_i8: the C values as int8 [rows][d] (or null): the [INT8 GEMM]'s input; integer formats only */           \
    X(signed char *, values_i8)

#define DLLM__FIELD(type, name) type name;
struct dllm_step_state {
    DLLM__STEP_STATE_FIELDS(DLLM__FIELD)
};
struct conf_partial {
    DLLM__CONF_PARTIAL_FIELDS(DLLM__FIELD)
};
struct sampler_args {
    DLLM__SAMPLER_ARGS_FIELDS(DLLM__FIELD)
};
struct attn_args {
    DLLM__ATTN_ARGS_FIELDS(DLLM__FIELD)
};
struct gemm_wg_args {
    DLLM__GEMM_WG_ARGS_FIELDS(DLLM__FIELD)
};
struct soloq_args {
    DLLM__SOLOQ_ARGS_FIELDS(DLLM__FIELD)
};
// Both compilers lay these out by the same C rules for the same member list; the sizes pin what the kernels assume.
static_assert(sizeof(dllm_step_state) == 32 && sizeof(conf_partial) == 40 && sizeof(gemm_wg_args) == 12,
              "contract layout");
static_assert(sizeof(sampler_args) == 128 && sizeof(attn_args) == 168 && sizeof(soloq_args) == 160, "contract layout");

/* The contract as kernel source: the shared enums and constants, then the structs above. */
static std::string dllm__src_contract() {
    return dllm__format(
               "enum { REMASK_LOW_CONFIDENCE = %d, REMASK_RANDOM = %d, REMASK_MARGIN = %d, REMASK_ENTROPY = %d, "
               "REMASK_ORIGIN = %d };\n",
               DLLM_REMASK_LOW_CONFIDENCE, DLLM_REMASK_RANDOM, DLLM_REMASK_MARGIN, DLLM_REMASK_ENTROPY,
               DLLM_REMASK_ORIGIN) +
           DLLM__XSTR(struct dllm_step_state{DLLM__STEP_STATE_FIELDS(DLLM__FIELD)};) "\n" DLLM__XSTR(
               struct conf_partial{DLLM__CONF_PARTIAL_FIELDS(DLLM__FIELD)};) "\n" DLLM__XSTR(struct sampler_args{
               DLLM__SAMPLER_ARGS_FIELDS(DLLM__FIELD)};) "\n" DLLM__XSTR(struct attn_args{
               DLLM__ATTN_ARGS_FIELDS(DLLM__FIELD)};) "\n" DLLM__XSTR(struct gemm_wg_args{
               DLLM__GEMM_WG_ARGS_FIELDS(DLLM__FIELD)};) "\n" DLLM__XSTR(struct soloq_args{
               DLLM__SOLOQ_ARGS_FIELDS(DLLM__FIELD)};) "\n";
}

/* A kernel table row X(name, attributes, (parameters)) becomes, in the kernel source, the macro KERNEL_<name> that
 * opens the kernel's definition, and on the host the signature type dllm__sig_<name> its handle is typed by. */
#define DLLM__KERNEL_DECLARE(name, attrs, params)                                                                      \
    "#define KERNEL_" #name " extern \"C\" __global__ void " #attrs " " #name " " #params "\n"
#define DLLM__KERNEL_SIGNATURE(name, attrs, params) typedef void dllm__sig_##name params;
#define DLLM__KERNEL_NAME(name, attrs, params) #name,

/* A launch configuration: grid, block, dynamic shared memory, CTAs per cluster along x. */
struct dllm__grid {
    dim3 grid, block;
    size_t smem = 0;
    unsigned cluster = 1;
    dllm__grid(dim3 g, dim3 b, size_t sm = 0, unsigned cl = 1) : grid(g), block(b), smem(sm), cluster(cl) {}
};

static dllm_status dllm__launch_raw(cudaKernel_t k, const dllm__grid &g, cudaStream_t stream, void **args,
                                    const char *name);

/* A loaded kernel, typed by its signature: launch() takes exactly its parameters, each converted to the
 * parameter's type (a void * buffer to the kernel's pointer type, an int to a u64), so a launch cannot pass the
 * wrong number of arguments or an argument of the wrong size. Templates (the attention and GEMM kernels) get their
 * handle by name at run time, the rest from the table. */
template <class Sig> struct dllm__kernel;
template <class... P> struct dllm__kernel<void(P...)> {
    cudaKernel_t fn = nullptr;
    const char *name = "";
    static std::vector<size_t> param_sizes() { return {sizeof(typename std::decay<P>::type)...}; }
    template <class... A> dllm_status launch(const dllm__grid &g, cudaStream_t s, A &&...a) const {
        static_assert(sizeof...(A) == sizeof...(P), "a kernel launch takes exactly the kernel's parameters");
        std::tuple<typename std::decay<P>::type...> values(static_cast<typename std::decay<P>::type>(a)...);
        return launch_tuple(g, s, values, std::index_sequence_for<P...>{});
    }
    template <class T, size_t... I>
    dllm_status launch_tuple(const dllm__grid &g, cudaStream_t s, T &values, std::index_sequence<I...>) const {
        void *argv[sizeof...(P) + 1] = {(void *)&std::get<I>(values)...};
        return dllm__launch_raw(fn, g, s, argv, name);
    }
};

/* Shared by every module: fixed-width types, bf16 conversions, Philox (twin: dllm__philox). */
static const char *dllm__src_common = DLLM__KERNEL_FILE("common.cuh");

/* [kernel table] the row-wise module's kernels (this section): X(name, attributes, (parameters)). */
#define DLLM__ROWWISE_KERNELS(X)                                                                                       \
    X(embed_gather, , (const int *ids, int n_rows, const bf16_t *table, int d, float *h))                              \
    X(add_rmsnorm, __launch_bounds__(1024),                                                                            \
      (const float *h_in, float *h_out, const bf16_t *delta, const float *w, float eps, bf16_t *y, int d, int n_rows,  \
       int row0, int seq_len))                                                                                         \
    X(rope_qkv, ,                                                                                                      \
      (bf16_t * qkv, int n_rows, int seq_len, int pos0, const int *positions, int n_head, int n_kv, int head_dim,      \
       const float *bias, const float *cos_t, const float *sin_t))                                                     \
    X(swiglu, , (const bf16_t *gu, bf16_t *out, int n_rows, int f))                                                    \
    X(make_uncond, , (const int *canvas, const unsigned char *is_prompt, int n, int mask_id, int *out))                \
    X(block_begin, , (dllm_step_state * st, const int *canvas, int begin, int end, int steps_per_block, int mask_id))  \
    X(fill_random_bf16, , (bf16_t * w, u64 n, u64 seed, float scale, int constant))                                    \
    X(find_nonfinite_bf16, , (const bf16_t *w, u64 n, u64 *first))                                                     \
    X(llama4_scale_q, , (bf16_t * qkv, int n_rows, int stride, int width, int pos0, float beta, int orig_max))
DLLM__ROWWISE_KERNELS(DLLM__KERNEL_SIGNATURE)

/* What the row-wise module's kernels and SoloQ's fused producers share: 16-byte row accesses, the residual add + RMS
 * of a row, SwiGLU's product. Needs NORM_SLOTS. */
static const char *dllm__src_rows_common = DLLM__KERNEL_FILE("rows_common.cuh");

/* Row-wise kernels: shapes are run-time arguments, so one module serves every model. */
static const char *dllm__src_rowwise = DLLM__KERNEL_FILE("rowwise.cuh");

/* [kernel table] the FP8 quantisers, compiled into the row-wise module: X(name, attributes, (parameters)). */
#define DLLM__FP8_QUANT_KERNELS(X)                                                                                     \
    X(quantize_rows_e4m3, ,                                                                                            \
      (const void *x, int x_f32, int k, int n_rows, unsigned char *q, float *scale, int scale_ld, float fixed_scale))  \
    X(add_rmsnorm_e4m3, __launch_bounds__(1024),                                                                       \
      (const float *h_in, float *h_out, const bf16_t *delta, const float *w, float eps, unsigned char *q,              \
       float *scale, int scale_ld, int d, int n_rows, int row0, int seq_len))                                          \
    X(swiglu_e4m3, , (const bf16_t *gu, int f, int n_rows, unsigned char *q, float *scale, int scale_ld))              \
    X(quantize_weight_blocks, , (const bf16_t *w, int n, int k, unsigned char *q, float *scale, int scale_ld))
DLLM__FP8_QUANT_KERNELS(DLLM__KERNEL_SIGNATURE)

/* FP8 E4M3 quantisation (LaCache 3.4), compiled into the row-wise module. Activations: groups of 1x128
 * along K, codes e4m3(x / s) with s = amax / 448 (1 for an all-zero group), rows padded with zero codes to
 * k_pad = 128 * ceil(k / 128), scales token-contiguous: scale[g * scale_ld + row] (cuBLASLt's VEC128
 * layout for the B operand). Weights: 128x128 blocks (BLK128x128 for the A operand). Each kernel names its
 * twin (section 9); the fused kernels quantise exactly the bf16 values the BF16 path would produce. */
static const char *dllm__src_e4m3 = DLLM__KERNEL_FILE("e4m3.cuh");

/* The FP8 quantisers themselves (after dllm__src_e4m3's conversions). */
static const char *dllm__src_fp8 = DLLM__KERNEL_FILE("fp8.cuh");

/* [kernel table] SoloQ's module (compiled only for a context with a SoloQ precision):
 * X(name, attributes, (parameters)). */
#define DLLM__SOLOQ_KERNELS(X)                                                                                         \
    X(soloq_quantize_rows, __launch_bounds__(SOLOQ_QUANTIZE_THREADS, 1), (soloq_args a))                               \
    X(soloq_produce_rows, __launch_bounds__(1024, 1), (soloq_args a))                                                  \
    X(soloq_dequantize_rows, ,                                                                                         \
      (const unsigned char *codes, const unsigned char *block_scales, int format, int rows, int cols, bf16_t *out))    \
    X(soloq_scale_rows, ,                                                                                              \
      (const float *acc, int m, int n, const float *s_x, const float *s_w, void *y, int y_f32, u64 ldy))               \
    X(soloq_unpack_rows_i8, , (const unsigned char *codes, int format, int rows, int cols, signed char *out))          \
    X(soloq_scale_rows_i32, ,                                                                                          \
      (const int *acc, int m, int n, const float *s_x, const float *s_w, void *y, int y_f32, u64 ldy))
DLLM__SOLOQ_KERNELS(DLLM__KERNEL_SIGNATURE)

/* [SoloQ] on the device: the rotation and quantisers of section 9b, bit for bit (its header states the order of every
 * float operation; here each one is an explicit _rn intrinsic or fmaf, so no contraction can change a bit), the
 * dequantiser of stored weights into their BF16 integer values C, and the GEMM epilogue that applies the row scales.
 * The format's constants come from dllm__src_soloq_tables, printed from the CPU's own tables. */
static const char *dllm__src_soloq = DLLM__KERNEL_FILE("soloq.cuh");

/* [KV quant] commit-time K/V quantisation of block diffusion (section 9c) on the device: the commit's quantisers, bit
 * for bit with 9c on the same inputs (every float operation an explicit _rn intrinsic, fmaf, or one of 9b's SoloQ
 * device functions, which this module compiles beside its own), and the block step's attention reading the quantised
 * committed rows directly (decoded in registers; no decoded copy in device memory). One kvq_args serves all three. */
#define DLLM__KVQ_ARGS_FIELDS(X)                                                                                       \
    X(const bf16_t *, sinks) /* the layer's committed sinks, bf16 K|V rows [min(n_sink, cap)][2 kvd] */                \
    X(const bf16_t *, fresh) /* the forward's own K|V rows [rows][2 kvd], row 0 at n_committed (a commit's at row0) */ \
    X(unsigned char *, k_codes)                                                                                        \
    X(unsigned char *, v_codes)  /* the layer's [cap][kvd bits / 8] (9c's packing) */                                  \
    X(unsigned short *, k_pairs) /* [cap / group][kvd][2] FP16 (scale, min) */                                         \
    X(unsigned short *, v_pairs) /* KIVI: [cap][n_kv][2] */                                                            \
    X(float *, v_scale)          /* SoloQ: [cap][n_kv] */                                                              \
    X(const int *, perm)                                                                                               \
    X(const unsigned char *, signs)                                                                                    \
    X(const float *, mixer) /* SoloQ: the layer's R (9b) */                                                            \
        X(int, rot_b) X(int, rot_k) X(float, rot_norm) X(int, n_kv) X(int, hd) X(int, bits) X(int, soloq)              \
            X(int, n_sink) X(int, group) X(int, row0) X(int, rows) /* commits: rows [row0, row0 + rows) */             \
        X(const bf16_t *, q) X(bf16_t *, o) X(int, q_stride) X(int, o_stride) X(int, n_head) /* attention */           \
        X(int, n_keys) X(int, n_committed) X(int, mask_block) X(int, q_index0) X(float, scale) X(int, q_rows)          \
            X(int, split_keys) X(float *, partial) /* kvq_flash: query rows, keys a split, split states */

/* [batch] [KV quant] One layer's attention over every sequence's quantised cache in one launch (bd_forward_batch;
 * dllm__kvq_batch_work_of builds the tables on the host): `chunks` holds the layer's kvq_args of each chunk, exactly
 * the arguments the chunk's own launch would take (a sequence's query rows, at most dllm__kvq_tc_chunk_rows of them
 * under kvq_tc), and each CTA reads its item: kvq_flash_batch's CTAs (x, y, z) item z / q_tiles (its chunk), the
 * warp-per-row kernels' (kvq_attention, kvq_flash_combine) CTA (x, head) item x (a chunk and its query row). */
#define DLLM__KVQ_ITEM_FIELDS(X) X(int, chunk) X(int, row)
#define DLLM__KVQ_BATCH_ARGS_FIELDS(X) X(const kvq_args *, chunks) X(const kvq_item *, items) X(int, q_tiles)

#define DLLM__KVQ_KERNELS(X)                                                                                           \
    X(kvq_commit_keys, , (kvq_args a))                                                                                 \
    X(kvq_commit_values, __launch_bounds__(32), (kvq_args a))                                                          \
    X(kvq_attention, __launch_bounds__(32), (kvq_args a))                                                              \
    X(kvq_attention_batch, __launch_bounds__(32), (kvq_batch_args b))

struct kvq_args {
    DLLM__KVQ_ARGS_FIELDS(DLLM__FIELD)
};
struct kvq_item {
    DLLM__KVQ_ITEM_FIELDS(DLLM__FIELD)
};
struct kvq_batch_args {
    DLLM__KVQ_BATCH_ARGS_FIELDS(DLLM__FIELD)
};
DLLM__KVQ_KERNELS(DLLM__KERNEL_SIGNATURE)

/* The warp-per-query online softmax of block diffusion's attention kernels without tensor cores (kvq_attention over
 * the quantised cache, bdfa_part for FACache): keys in chunks of 32, a lane's score each. One step per chunk: the
 * running max m and sum l take the chunk (s: the lane's score, valid: a key there), corr is the factor the accumulators
 * take, the result the lane's weight exp(s - m) (0 past the keys). Twin: dllm__cpu_softmax_part (in double). */
static const char *dllm__src_warp_softmax = DLLM__KERNEL_FILE("warp_softmax.cuh");

static const char *dllm__src_kvq = DLLM__KERNEL_FILE("kvq.cuh");

/* [KV quant] The block step's attention over the quantised cache on tensor cores (kvq_tc, on by default; twin:
 * dllm__kvq_flash_twin in 9c). kvq_attention decodes every key's codes once per query head (7 times per kv head at
 * the 7B shape) with scalar FMAs; here the codes are read and decoded once per kv head:
 *   kvq_flash: flash-decoding split over the keys, one CTA per (key split, kv head, tile of query rows). A CTA holds
 *     every query row of its kv head's GQA group (n_head / n_kv heads x q_rows rows, row r = head (r / q_rows), query
 *     r % q_rows), 16 a warp, as many warps as fit (KVQ_TC_THREADS; the host's plan tiles larger groups over
 *     blockIdx.z). Per tile of KVQ_TC_BC keys the CTA decodes K and V into shared memory as bf16 (KIVI keys
 *     fmaf(code, scale, min) from the pair of the key's group and channel; KIVI values from the (row, kv head) pair;
 *     SoloQ values C * scale, the row scale folded into the decoded value, in the rotated basis), then each warp runs
 *     flash_attn's step on it per 32-key chunk: S = Q K^T and O += P V by mma.sync (P rounded to bf16 as the mma
 *     takes it), the online softmax in fp32 (online_softmax). A pipeline of three tiles: while tile t is multiplied,
 *     tile t + 1 is decoded into a second pair of K and V tiles and the raw codes and pairs of tile t + 2 are copied
 *     (cp.async; two stages of KVQ_TC_STAGE bytes). No barrier stands between a tile's decode and the previous
 *     tile's mma, so warps overlap the two: with one phase after the other and a barrier between them, ncu saw the
 *     H100 issue an instruction on 33% of cycles at 14 warps an SM (1.87 GHz, 159 us at 32k keys).
 *   Splits (kvq_split) never mix kinds: the bf16 sinks [0, min(n_sink, n_committed)), the quantised rows up to
 *     n_committed, and the bf16 rows past it (the forward's own, or the block cache), each cut at multiples of
 *     split_keys. bf16 splits copy their rows as they are. Each split leaves per (query row, head) the unnormalised
 *     output, the running max (log2 domain) and the normaliser in `partial` [split][n_head][q_rows][hd + 2].
 *   kvq_flash_combine: one warp per (query row, head) merges the splits in split order, the quantised ones of SoloQ
 *     apart and rotated back once (kvq_rotate_back) before they join the bf16 ones.
 * The block-causal mask: row i sees the keys below kvq_visible(i); a CTA visits no tile past its rows' last visible
 * key. */
#define DLLM__KVQ_TC_KERNELS(X)                                                                                        \
    X(kvq_flash, __launch_bounds__(KVQ_TC_THREADS), (kvq_args a))                                                      \
    X(kvq_flash_combine, __launch_bounds__(32), (kvq_args a))                                                          \
    X(kvq_flash_batch, __launch_bounds__(KVQ_TC_THREADS), (kvq_batch_args b))                                          \
    X(kvq_flash_combine_batch, __launch_bounds__(32), (kvq_batch_args b))
DLLM__KVQ_TC_KERNELS(DLLM__KERNEL_SIGNATURE)

static const char *dllm__src_kvq_tc = DLLM__KERNEL_FILE("kvq_tc.cuh");

/* [FACache] on block diffusion, on the device (twins: dllm__cpu_softmax_part, dllm__softmax_merge,
 * dllm__cpu_bd_attend): layer 0's attention split at the committed cache. bdfa_committed computes, for the listed rows
 * of a forward, each head's online-softmax state over the committed keys [0, n_committed) and stores it at the row's
 * block offset; bdfa_merge computes every row's state over the forward's own keys [n_committed, n_visible) and merges
 * it with the stored one. The cached path lists only the rows whose token changed; the uncached path lists every row:
 * the same kernels in the same order, so both give the same bits. bdfa_committed splits the committed keys over
 * DLLM_BDFA_WARPS warps of a CTA per (row, head) and merges their states in warp order
 * (a warp walking 1024 keys alone is latency-bound: 0.7 ms more than flash_attn for a 32-row step of the 7B shape,
 * measured); bdfa_merge (the forward's own keys, a block at most) keeps a warp per (row, head). */
#define DLLM__BDFA_ARGS_FIELDS(X)                                                                                      \
    X(const bf16_t *, cache) /* layer 0's K|V rows [n_keys][2 kvd]: committed, then the forward's own */               \
    X(const bf16_t *, q)                                                                                               \
    X(bf16_t *, o)                                                                                                     \
    X(int, q_stride)                                                                                                   \
    X(int, o_stride) X(int, n_head) X(int, n_kv) X(int, hd) X(float, scale) X(int, n_keys) X(int, n_committed)         \
        X(int, mask_block) X(int, q_index0)                                                                            \
            X(const int *, rows) /* bdfa_committed: the forward's rows whose state is computed, one per grid.x */      \
        X(const int *, n_rows)   /* null, or how many rows are listed (a graph's launch covers every row) */           \
        X(int, offset)           /* the block offset of the forward's row 0 */                                         \
        X(float *, state)        /* [block offset][n_head][hd + 2]: the unnormalised O, then m and l */

#define DLLM__BDFA_KERNELS(X)                                                                                          \
    X(bdfa_committed, __launch_bounds__(256), (bdfa_args a))                                                           \
    X(bdfa_merge, __launch_bounds__(32), (bdfa_args a))

struct bdfa_args {
    DLLM__BDFA_ARGS_FIELDS(DLLM__FIELD)
};
DLLM__BDFA_KERNELS(DLLM__KERNEL_SIGNATURE)
static const int dllm__bdfa_warps = 8;  // bdfa_committed's warps per (row, head): 256 threads, its __launch_bounds__

static const char *dllm__src_bdfa = DLLM__KERNEL_FILE("bdfa.cuh");

/* Tensor-core plumbing shared by the attention and the FP8 GEMM modules (sm_80+): cp.async copies and
 * ldmatrix. Shared-memory operands are 32-bit shared-window byte addresses: half the registers of generic
 * pointers. */
static const char *dllm__src_mma = DLLM__KERNEL_FILE("mma.cuh");

/* dllm's own FP8 GEMM (DLLM__FP8_MMA): sm_89 (Ada) has FP8 tensor cores but no block-scaled cuBLASLt mode; sm_90 runs
 * it with DLLM_TILES=fp8_gemm=mma. Twin: dllm__fp8_gemm_twin. Y [M x N] (bf16, row-major, leading dimension N) = X .
 * W^T on the cuBLASLt path's operands (struct dllm__gemm_op): X E4M3 [M x K] with an fp32 scale per 1x128 group at
 * x_scale[kb * M + m], W E4M3 [N x K] with one per 128x128 block at w_scale[nb * ceil4(K / 128) + kb]. M is the
 * padded row count (a multiple of 16) and every one of its rows is written, as cuBLASLt writes them; K is a multiple
 * of 128; any N.
 * Promotion (DeepSeek-V3, DeepGEMM): each 128-wide K group, one k-tile, is accumulated by mma.sync m16n8k32 into a
 * fresh fp32 fragment, then added into the fp32 total times (x scale of the row) * (w scale of the block), so the
 * tensor cores' reduced-precision accumulation never spans more than 128 products. Every (m, n) runs the same k-steps
 * and promotions whatever the tile and M are: the tile chosen for M never changes a row's bits (the tests check it).
 * CTA tile BM x BN x 128, warps of WM x WN (MT x NT mma tiles), a STAGES-deep cp.async ring; BN divides 128, so a
 * CTA's columns share one weight block and one w scale per k-tile. Shared-memory rows are the 128 codes of a k-tile
 * with their 16-byte chunks XOR-swizzled by row (chunk c of row r at c ^ (r & 7)): the 8 rows an ldmatrix phase
 * reads hit 8 different bank groups without padding. Byte for byte, the E4M3 fragments of m16n8k32 are those of
 * the bf16 m16n8k16 (A: rows g and g + 8, bytes 4t..4t+3 and 16 + 4t..; B: column g, the same bytes; PTX ISA
 * 9.7.14.5), so ldmatrix .b16 loads them unchanged. Tiles: dllm__arch::fp8_wide / fp8_narrow. */
static const char *dllm__src_fp8_gemm = DLLM__KERNEL_FILE("fp8_gemm.cuh");

/* [W4 GEMM] q4_gemm's arguments (host/kernel contract, declared in its own module): y = (A . C_w^T * s_x) * s_w on
 * N packed 4-bit weight rows (section 9b's layout) and M <= 64 bf16 activation rows; partial: split-K's fp32
 * [k_splits][M][N] (k_splits > 1 only). */
#define DLLM__Q4_GEMM_ARGS_FIELDS(X)                                                                                   \
    X(const unsigned char *, codes)        /* [N][K / 2] */                                                            \
    X(const unsigned char *, block_scales) /* NVFP4: [N][ceil(K / 16)] UE4M3; otherwise unused */                      \
    X(const float *, row_scale)            /* [N] */                                                                   \
    X(const bf16_t *, A)                   /* [M][lda], 16-byte aligned, lda % 8 == 0 */                               \
    X(const float *, s_x)                  /* [M] per-token scales, or null (1) */                                     \
    X(void *, y)                           /* y[m * ldy + y_col0 + n], bf16 or fp32 (y_f32) */                         \
    X(float *, partial)                                                                                                \
    X(int, lda)                                                                                                        \
    X(int, ldy)                                                                                                        \
    X(int, y_col0)                                                                                                     \
    X(int, y_f32) X(int, M) X(int, N) X(int, K) X(int, k_splits)                                                       \
        X(int, chunks_per_split) /* K in chunks of Q4_KC; split s takes chunks [s * cps, (s + 1) * cps) */
struct q4_gemm_args {
    DLLM__Q4_GEMM_ARGS_FIELDS(DLLM__FIELD)
};
static_assert(sizeof(q4_gemm_args) == 96, "contract layout");

/* q4_gemm's tile (kernel and host): 4 warps, each 2 m16 tiles of weight rows, so 128 weight rows a CTA; up to 8 n8
 * tiles of activation rows (M <= 64); 128-wide k chunks. */
static const int dllm__q4_warps = 4, dllm__q4_wt = 2, dllm__q4_max_rows = 64, dllm__q4_kc = 128;
static const int dllm__q4_threads = 32 * dllm__q4_warps, dllm__q4_bn = 16 * dllm__q4_wt * dllm__q4_warps;
/* q4_gemm's ring (dynamic shared memory): stages of a chunk each: the weight codes, 16 bytes a thread per (weight
 * tile, row half), [slot][thread]; NVFP4's block scales, two 4-byte words a thread per (tile, row half); the chunk's
 * activation rows (8 per live n8 tile), 256 bytes each. stages - 1 chunks fly while one is computed: 8 KB of weights
 * a chunk and CTA, so 72 KB an SM at 3 CTAs of 4 stages, 48 KB at 3 stages (the H200's bandwidth-latency product is
 * about 36 KB an SM at a microsecond). 4 stages where 3 CTAs an SM still fit (M <= 32 but NVFP4), 3 otherwise; the
 * kernel instance of (f, M) is compiled with the same count (Q4_STAGES, Q4_STAGES_M32). */
static const int dllm__q4_stages = 3, dllm__q4_stages_m32 = 4, dllm__q4_m32_rows = dllm__q4_max_rows / 2;
static int dllm__q4_stage_count(dllm__q4_format f, int M) {
    return M <= dllm__q4_m32_rows && f != DLLM__Q4_NVFP4 ? dllm__q4_stages_m32 : dllm__q4_stages;
}
static size_t dllm__q4_stage_bytes(dllm__q4_format f, int M) {
    const int tiles = 2 * dllm__q4_wt, m_tiles = (M + 7) / 8;
    return (size_t)tiles * dllm__q4_threads * (16 + (f == DLLM__Q4_NVFP4 ? 8 : 0)) +
           (size_t)m_tiles * 8 * dllm__q4_kc * 2;
}
static size_t dllm__q4_ring_bytes(dllm__q4_format f, int M) {
    return (size_t)dllm__q4_stage_count(f, M) * dllm__q4_stage_bytes(f, M);
}

/* [kernel table] the W4 GEMM module: two entry points per weight format (the dequantiser is a template parameter), for
 * M <= 64 and (_m32) M <= 32 (half the accumulators: NVFP4 then fits 3 CTAs an SM), and split-K's reduction. The 128 of
 * __launch_bounds__ is dllm__q4_threads. */
#define DLLM__Q4_GEMM_KERNELS(X)                                                                                       \
    X(q4_gemm_nvfp4, __launch_bounds__(128), (q4_gemm_args a))                                                         \
    X(q4_gemm_int4, __launch_bounds__(128), (q4_gemm_args a))                                                          \
    X(q4_gemm_lloyd, __launch_bounds__(128), (q4_gemm_args a))                                                         \
    X(q4_gemm_e8p, __launch_bounds__(128), (q4_gemm_args a))                                                           \
    X(q4_gemm_rtn, __launch_bounds__(128), (q4_gemm_args a))                                                           \
    X(q4_gemm_nvfp4_m32, __launch_bounds__(128), (q4_gemm_args a))                                                     \
    X(q4_gemm_int4_m32, __launch_bounds__(128), (q4_gemm_args a))                                                      \
    X(q4_gemm_lloyd_m32, __launch_bounds__(128), (q4_gemm_args a))                                                     \
    X(q4_gemm_e8p_m32, __launch_bounds__(128), (q4_gemm_args a))                                                       \
    X(q4_gemm_rtn_m32, __launch_bounds__(128), (q4_gemm_args a))                                                       \
    X(q4_gemm_reduce, , (q4_gemm_args a))
DLLM__Q4_GEMM_KERNELS(DLLM__KERNEL_SIGNATURE)

/* [W4 GEMM] q4_gemm: a GEMM for few activation rows (block steps: M <= 64, memory-bound) on 4-bit weights read once
 * from global memory in section 9b's canonical packed layout (no repack), streamed with their chunk's activation rows
 * through a cp.async ring (3 or 4 chunks deep) and dequantised in registers to their exact BF16 C values; mma.sync
 * m16n8k16 BF16 with fp32 accumulation (sm_80+). Twin: dllm__cpu_q4_gemm.
 * Roles: the weights are the A operand (16 weight rows n an m16 tile), the activations the B operand (8 activation
 * rows m an n8 tile), so the accumulator holds y^T: c0, c1 = (n = g, m = 2t, 2t + 1), c2, c3 = (n = g + 8, same m)
 * (g = lane / 4, t = lane % 4; PTX ISA 9.7.14.5.8).
 * The k order inside an mma is free as long as both operands use the same one; q4_gemm's makes every load whole:
 * in a 128-wide chunk at k0, thread t owns the 32 elements k0 + 32 t + [0, 32) of its rows, 16 bytes of packed codes
 * (one 16-byte copy where K % 32 == 0, four 4-byte ones otherwise), words j = 0..3 at k0 + 32 t + 8 j (8 nibbles, or
 * one E8P group of two codes; an NVFP4 word lies in one 16-block). A word's elements e0..e7 dequantise into the bf16
 * pairs (e0, e1), (e2, e3), (e4, e5), (e6, e7), memory's order, and the mma k16 steps 2 j and 2 j + 1 take slots
 * 2t, 2t+1, 2t+8, 2t+9 = (e0, e1, e2, e3) and (e4, e5, e6, e7); so the activations are copied to shared memory as
 * they are (cp.async, no registers), and one 16-byte read of 8 consecutive k gives a thread both steps' B fragments.
 * Dequantisers (exact): INT4 and RTN by bit tricks on the word (a byte's two nibbles moved into the two bf16 halves
 * by one prmt, placed in the mantissas by one lop3, then one fma.bf16x2); NVFP4 and Lloyd-Max by a 16-entry bf16
 * table in shared memory (8 banks: conflict-free), NVFP4 then times its UE4M3 block scale as bf16 (e2m1 x e4m3 has at
 * most 6 significant bits: the bf16 product is exact); E8P by the abs-pattern and W_int tables in shared memory
 * (dllm__e8p_decode4 / dllm__e8p_int's numbers, generated into the source). Elements past K (or past the split) get
 * zero activations and zero codes, so whatever those decode to adds 0.
 * Split-K: grid (ceil(N / 128), k_splits); the split count depends on N, K and the SM count, never on M, and split
 * partials are summed in split order by q4_gemm_reduce, so a row's result is the same whatever M is and run to run.
 * Epilogue: y = (acc * s_x[m]) * s_w[n] in fp32, one rounding to the output type. */
static const char *dllm__src_q4_gemm = DLLM__KERNEL_FILE("q4_gemm.cuh");
/* The 4-bit codes dequantised to BF16 C values in registers (q4_dequant): q4_gemm's, and the MoE grouped GEMM's. */
static const char *dllm__src_q4_dequant = DLLM__KERNEL_FILE("q4_dequant.cuh");

/* [kernel table] the sampler module: X(name, attributes, (parameters)). */
#define DLLM__SAMPLER_KERNELS(X)                                                                                       \
    X(conf_partial_kernel, , (sampler_args a, const dllm_step_state *st, conf_partial *out))                           \
    X(conf_combine_kernel, ,                                                                                           \
      (sampler_args a, const dllm_step_state *st, const conf_partial *parts, int *x0, double *conf,                    \
       unsigned char *deferred))                                                                                       \
    X(select_commit, ,                                                                                                 \
      (int *canvas, dllm_step_state *st, int cand_lo, int row0, const int *x0, const double *conf,                     \
       const unsigned char *deferred, int mask_id, int *committed, int rule, double threshold, double factor,          \
       double eps))                                                                                                    \
    X(row_cutoff_kernel, , (sampler_args a, float *cutoff))
DLLM__SAMPLER_KERNELS(DLLM__KERNEL_SIGNATURE)

/* Token choice on the device. Twins: dllm__choose and dllm__confidence (per row), dllm__select (per step). */
static const char *dllm__src_sampler = DLLM__KERNEL_FILE("sampler.cuh");

/* FlashAttention forward, bidirectional, with a key-padding mask and GQA; mma.sync m16n8k16 BF16 with
 * FP32 accumulation (sm_80+). Twin: dllm__cpu_attention.
 * Compile-time: HD (head dim), BR (query rows per CTA), BC (keys per tile), MT (m16 tiles per warp).
 * KV tiles are visited in the order [0, late_lo) ++ [late_hi, T) ++ [late_lo, late_hi): the tiles that
 * overlap the current block come last. The plain forward and LaCache's FACache use this same order,
 * so a cached online-softmax state is exactly the prefix of the uncached computation. */
static const char *dllm__src_attention = DLLM__KERNEL_FILE("attention.cuh");

/* Hopper's building blocks (sm_90a), shared by flash_attn_wg and gemm_wg: wgmma on shared-memory operands in the
 * 128-byte swizzle, TMA tensor copies and the mbarriers they complete on. A tile sits in shared memory as TMA writes
 * it (CU_TENSOR_MAP_SWIZZLE_128B) and wgmma reads it: rows of 64 bf16 (128 bytes), 16-byte chunk c of row r at chunk
 * c ^ (r % 8), 8-row atoms of 1024 bytes. */
static const char *dllm__src_hopper = DLLM__KERNEL_FILE("hopper.cuh");

/* FlashAttention forward on Hopper's warpgroup tensor cores (wgmma, sm_90a only), for layers >= 1 wherever no
 * split-KV is asked for, where flash_attn took 9% of a 1024-token forward (2.4 of 27 ms on an H200). Same semantics
 * as flash_attn (key-padding mask, GQA, keys past seq masked) and the same online softmax, in plain key order and
 * without FACache or split-KV, which stay with flash_attn (layer 0 always runs flash_attn, so LaCache's exactness
 * does not depend on this kernel). Twin: dllm__cpu_attention.
 * Two warpgroups of 64 query rows share each K/V tile. Tiles sit in shared memory in the 128-byte swizzle
 * (dllm__src_hopper); a 128-wide head is two 64-column blocks. S = Q K^T reads both operands from shared memory
 * (K-major); O += P V takes P from registers (the scores' accumulator layout is the A-fragment layout, as
 * with mma.sync) and V as a transposed (MN-major) operand. Descriptors: 8-row groups 1024 bytes apart; a 128-wide
 * V operand also names the distance of its two 64-column blocks. */
static const char *dllm__src_attention_wgmma = DLLM__KERNEL_FILE("attention_wgmma.cuh");

/* dllm's BF16 GEMM on Hopper (sm_90a): Y [m x n] = X [m x k] . W [n x k]^T, bf16 in and out, fp32 accumulation, X and W
 * row-major (both K-major, as wgmma reads them). A candidate that dllm__gemm times against cuBLASLt's per shape; its
 * rows are independent of m by construction (below). Twin: the float64 product (tests).
 * The layout is DeepGEMM's and CUTLASS's warp-specialised persistent kernel. Output tiles are 128 x BN (BN = 256, or
 * 128 or 64, which the batched forwards take where more tiles fill more SMs: dllm__batch_gemm_width); CTAs come in
 * clusters of two that take vertically adjacent tiles (m-tiles 2i and 2i + 1 of one column tile) and walk the tile
 * pairs, m fastest, so that the clusters in flight also share weight tiles through L2. In each CTA a producer
 * warpgroup streams 64-wide k-steps by TMA into a ring of NS stages: its own 128 rows of X, and one BN / 2-row half of
 * the weight tile, multicast into both CTAs of the cluster. A stage is refilled once the consumers of both CTAs have
 * released it (16 arrivals on its empty mbarrier). The two consumer warpgroups (64 rows each, m64nBNk16,
 * accumulators in registers) hand a finished tile to TMA through shared memory and go on with the next, whose
 * stages the producer has been filling meanwhile. The weights of the first stages are requested before
 * griddepcontrol.wait: they do not depend on the previous kernel.
 * Every output element is summed over k in the same order whatever m is and wherever its tile falls, so a row's bits
 * never depend on how many rows are computed (row-independent, as LaCache needs; the tests check it). Nor on BN: an
 * output's k-loop is the same sequence of k16 products at every width, so the widths give the same bits and a caller
 * may pick one by row count (gpu.gemm_wg_widths_give_the_same_bits: 0 of 21.8 million outputs differed, H100 and
 * H200). */
static const char *dllm__src_gemm_wg = DLLM__KERNEL_FILE("gemm_wg.cuh");

/* [batch] [dual cache] [prefix cache] The batched K/V-cache step's one kernel of its own: the K|V columns of each
 * forwarded row (width elements from src, rows src_stride apart) copied to row cache_rows[r] of one layer's cache (rows
 * cache_stride apart; cache_rows null: row r). Its own module (dllm__module_kv_scatter), loaded by the first batched
 * K/V-cache step or block-diffusion generation. Block diffusion's fresh rows go to the cache through it (rows in order)
 * rather than a 2D memcpy: CUDA updates a captured memcpy node's addresses only when the copy is one-dimensional, so a
 * 2D copy into the rows after a grown committed cache made every [bd graphs] update at a new block fail (error 910).
 * A copy: twin dllm__kv_scatter_rows_ref. */
#define DLLM__BATCH_KV_KERNELS(X)                                                                                      \
    X(kv_scatter_rows, __launch_bounds__(128),                                                                         \
      (const bf16_t *src, u64 src_stride, bf16_t *cache, u64 cache_stride, const int *cache_rows, int width,           \
       int n_rows))
DLLM__BATCH_KV_KERNELS(DLLM__KERNEL_SIGNATURE)

DLLM__TEST_HOOK static void dllm__kv_scatter_rows_ref(const uint16_t *src, size_t src_stride, uint16_t *cache,
                                                      size_t cache_stride, const int *cache_rows, int width,
                                                      int n_rows) {
    for (int r = 0; r < n_rows; r++)
        memcpy(cache + (size_t)(cache_rows ? cache_rows[r] : r) * cache_stride, src + (size_t)r * src_stride,
               (size_t)width * 2);
}

static const char *dllm__src_kv_scatter = DLLM__KERNEL_FILE("kv_scatter.cuh");

/* [MoE] LLaDA2's kernels (../shared/spec/llada2.md), in a module of their own (dllm__module_moe), loaded by a LLaDA2
 * context: QK-norm + partial RoPE on the fused projection rows, the sigmoid router's group-limited top-k, the plan of
 * the routes (each expert's rows and row tiles, on the device), the grouped expert GEMM over all experts' rows in one
 * launch, and the weighted sum of a token's expert outputs in slot order plus the shared expert's. Each names its CPU
 * twin in src/kernels/moe.cuh. The router and the plan keep one count per expert in shared memory: at most
 * dllm__moe_max_experts experts in at most dllm__moe_max_groups groups (the real models: 256 in 8). A grouped GEMM
 * tile holds dllm__moe_tile_rows rows of one expert (a fixed number: never chosen from a row count). */
static const int dllm__moe_max_experts = 1024, dllm__moe_max_groups = 64, dllm__moe_tile_rows = 32;
static const int dllm__moe_threads = 128;  // a grouped GEMM CTA (4 warps; the 128 of its __launch_bounds__)
/* [MoE] The grouped expert GEMM's operands in a quantised weight format (moe_grouped_gemm_<format>; declared in the
 * moe module, as q4_gemm_args in its own): moe_grouped_gemm's, with the activations' and weights' scales. */
#define DLLM__MOE_GEMM_ARGS_FIELDS(X)                                                                                  \
    X(const void *, x)         /* rows [][x_ld]: SoloQ's bf16 C values, or FP8's E4M3 codes */                         \
    X(const float *, x_scale)  /* SoloQ: a token scale a row (null: 1, -w4a16); FP8: [K / 128][x_scale_ld] */         \
    X(const int *, row_src)    /* the x row of each expert row (the token), or null: the row itself */                 \
    X(const void *const *, w)  /* [n_expert] codes: SoloQ [N][K / 2] (section 9b's rows); FP8 [N][K] */                \
    X(const float *const *, w_scale) /* [n_expert] SoloQ: row scales [N]; FP8: [ceil(N / 128)][w_scale_ld] */          \
    X(const unsigned char *const *, w_block_scales) /* [n_expert] NVFP4's UE4M3 [N][ceil(K / 16)]; else unused */     \
    X(const int *, first_row)                                                                                          \
    X(const int *, tile_first) /* moe_plan's */                                                                        \
    X(bf16_t *, y)             /* [rows][N] */                                                                         \
    X(int, n_expert) X(int, N) X(int, K) /* FP8: K padded to 128 */ X(int, x_ld) X(int, x_scale_ld) X(int, w_scale_ld)
struct moe_gemm_args {
    DLLM__MOE_GEMM_ARGS_FIELDS(DLLM__FIELD)
};
static_assert(sizeof(moe_gemm_args) == 96, "contract layout");
#define DLLM__MOE_KERNELS(X)                                                                                           \
    X(qk_norm_rope, __launch_bounds__(128),                                                                            \
      (bf16_t * qkv, int n_rows, int pos0, int n_head, int n_kv, int head_dim, int rotary_dim, const float *q_norm,    \
       const float *k_norm, float eps, const float *cos_t, const float *sin_t))                                        \
    X(moe_route, __launch_bounds__(32),                                                                                \
      (const float *logits, const float *expert_bias, int n_rows, int n_expert, int n_group, int n_group_used,         \
       int top_k, float routed_scale, int *expert, float *weight))                                                     \
    X(moe_plan, __launch_bounds__(256),                                                                                \
      (const int *expert, int n_slots, int top_k, int n_expert, int *first_row, int *tile_first, int *row_token,      \
       int *slot_row))                                                                                                 \
    X(moe_grouped_gemm, __launch_bounds__(128),                                                                        \
      (const bf16_t *x, const int *row_src, const bf16_t *const *w, const int *first_row, const int *tile_first,     \
       int n_expert, int N, int K, bf16_t *y))                                                                         \
    X(moe_grouped_gemm_e4m3, __launch_bounds__(128), (moe_gemm_args a))                                                \
    X(moe_grouped_gemm_nvfp4, __launch_bounds__(128), (moe_gemm_args a))                                               \
    X(moe_grouped_gemm_int4, __launch_bounds__(128), (moe_gemm_args a))                                                \
    X(moe_grouped_gemm_e8p, __launch_bounds__(128), (moe_gemm_args a))                                                 \
    X(moe_grouped_gemm_rtn, __launch_bounds__(128), (moe_gemm_args a))                                                 \
    X(moe_combine, __launch_bounds__(256),                                                                             \
      (const bf16_t *expert_out, const int *slot_row, const float *weight, const bf16_t *shared, int n_rows,          \
       int top_k, int d, bf16_t *out))
DLLM__MOE_KERNELS(DLLM__KERNEL_SIGNATURE)

static const char *dllm__src_moe = DLLM__KERNEL_FILE("moe.cuh");
