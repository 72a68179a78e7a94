/* dllm.h - diffusion LLM inference (LLaDA, Dream; Fast-dLLM v2 and Nemotron block diffusion) in one
 * header and one CUDA file.
 *
 * dllm loads Hugging Face checkpoints of masked-diffusion language models and decodes them with the
 * semi-autoregressive (SAR) block schedule of LLaDA's reference `generate.py`. The public API is this
 * header; the implementation is dllm_cuda.cu (kernels JIT-compiled with NVRTC at first use, GEMMs on
 * cuBLASLt and on dllm's own kernels). A CPU fp32 reference backend computes the same function anywhere.
 *
 * Build your program (one command; CUDA Toolkit only), or link libdllm.so through pkg-config:
 *     nvcc -O2 -std=c++17 -o app app.c dllm_cuda.cu -cudart static -ldl
 *     cc app.c $(pkg-config --cflags --libs dllm)
 *
 * Usage (examples/simple.c is this, complete, with every status checked):
 *     dllm_model *model; dllm_tokenizer *tok; dllm_ctx *ctx; dllm_model_info info;
 *     dllm_model_load(dir, dllm_model_default_params(), &model);    // config.json + safetensors
 *     dllm_model_get_info(model, &info);
 *     dllm_tokenizer_load(dir, &tok);                                // tokenizer.json or vocab.json + merges.txt
 *     dllm_ctx_create(model, dllm_ctx_default_params(), &ctx);       // backend AUTO: GPU if usable, else CPU
 *     dllm_chat_message msg = {"user", "What is 2+2?"};
 *     dllm_chat_render(tok, &msg, 1, 1, text, cap, &len);            // the model's chat template
 *     dllm_tokenize(tok, text, len - 1, 1, ids, ids_cap, &n_ids);     // len counts the NUL
 *     dllm_gen_params gp = dllm_gen_default_params();                // gen 128, steps 128, block 32, greedy
 *     gp.early_stop = info.block_size == 0;                          // see EARLY STOP below
 *     dllm_generate(ctx, ids, n_ids, gp, out, gp.gen_length + 1, &n_out, NULL);
 *     dllm_detokenize(tok, out, n_out, 1, answer, answer_cap, &answer_len);
 *     dllm_ctx_free(ctx); dllm_tokenizer_free(tok); dllm_model_free(model);
 * Calls that fill a buffer (chat_render, tokenize, detokenize) called with capacity 0 return
 * DLLM_ERR_BUFFER_TOO_SMALL and the size needed.
 *
 * EARLY STOP: the library's default is early_stop = 0 (every block is decoded, as generate.py does); the
 * dllm-generate CLI turns it on (--no-early-stop turns it off). With it on, decoding stops after the first
 * block that holds EOS/EoT; the answer before the EOS is the same either way, and a short answer costs a
 * fraction of the steps. Set gp.early_stop = 1 for LLaDA and Dream models; block-diffusion models stop at
 * their stop token by themselves and reject early_stop.
 *
 * Errors: every fallible call returns a dllm_status (negative = error); dllm_status_str() names it. The
 * detail (file, tensor name, expected and found shape, NVRTC log excerpt) is in dllm_last_error() for the
 * calling thread (the last failing call's, kept through later calls that succeed) and, for calls that take
 * a context, also in dllm_ctx_last_error(ctx).
 *
 * Ownership and threads: a dllm_model is immutable after loading and may be shared by several contexts
 * (it must outlive them). Contexts on one model share its weights: on the GPU, the first context on a device
 * (and precision) copies them there once, later ones reuse that copy and add only their own activations and
 * caches, and the copy is freed with the last context that uses it. Several threads may each drive their own
 * context over one model at the same time (contexts may be created and freed concurrently too); a dllm_ctx
 * owns its buffers and must be used by one thread at a time. Every context on a device computes a GEMM shape
 * with the same algorithm (tuned once per process), so two contexts give the same bits. Strings returned by
 * the library stay valid until the next failing call on the same thread/context.
 */
#ifndef DLLM_H
#define DLLM_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && defined(DLLM_SHARED)
#  define DLLM_API __declspec(dllexport)
#elif defined(__GNUC__)
#  define DLLM_API __attribute__((visibility("default")))
#else
#  define DLLM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DLLM_VERSION_MAJOR 0
#define DLLM_VERSION_MINOR 1
#define DLLM_VERSION_PATCH 0

/* The library's version, "MAJOR.MINOR.PATCH" from the macros above as the library was compiled. */
DLLM_API const char *dllm_version(void);

/* ---------------------------------------------------------------------------------------------------
 * Status codes and logging
 * ------------------------------------------------------------------------------------------------- */
typedef enum dllm_status {
    DLLM_OK = 0,
    DLLM_ERR_INVALID_ARGUMENT = -1, /* NULL pointer, option out of range, bad option combination      */
    DLLM_ERR_IO = -2,               /* file missing, unreadable, or not mappable                      */
    DLLM_ERR_FORMAT = -3,           /* malformed file: JSON, safetensors header, offsets, truncation  */
    DLLM_ERR_SHAPE = -4,            /* a tensor is missing or has the wrong shape or dtype            */
    DLLM_ERR_UNSUPPORTED = -5,      /* well-formed but unsupported config value or feature            */
    DLLM_ERR_OUT_OF_MEMORY = -6,    /* host or device allocation failed                               */
    DLLM_ERR_NO_DEVICE = -7,        /* GPU backend requested but no usable GPU or driver              */
    DLLM_ERR_CUDA = -8,             /* a CUDA runtime or cuBLASLt call failed                         */
    DLLM_ERR_JIT = -9,              /* NVRTC could not compile a kernel (log excerpt in the message)  */
    DLLM_ERR_CANCELLED = -10,       /* the step callback asked to stop                                */
    DLLM_ERR_BUFFER_TOO_SMALL = -11,/* an output buffer cannot hold the result                        */
    DLLM_ERR_INTERNAL = -12,        /* a bug in dllm: please report it with the message              */
    DLLM_ERR_FULL = -13             /* a stepper holds max_sequences sequences: step until one ends   */
} dllm_status;

/* Short constant name of a status, e.g. "DLLM_ERR_SHAPE". Never NULL. */
DLLM_API const char *dllm_status_str(dllm_status status);

/* Detail of the last failing call made by this thread ("" if none). */
DLLM_API const char *dllm_last_error(void);

typedef enum dllm_log_level {
    DLLM_LOG_ERROR = 0,
    DLLM_LOG_WARN = 1,
    DLLM_LOG_INFO = 2,
    DLLM_LOG_DEBUG = 3
} dllm_log_level;

/* Receives one message (no trailing newline). */
typedef void (*dllm_log_fn)(dllm_log_level level, const char *text, void *user_data);

/* Route library messages at or below max_level to fn (NULL restores the default: stderr, WARN).
 * Process-wide; set it before loading models. */
DLLM_API void dllm_log_set(dllm_log_fn fn, void *user_data, dllm_log_level max_level);

/* ---------------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------------- */
typedef struct dllm_model dllm_model;

typedef enum dllm_family {
    DLLM_FAMILY_LLADA = 0, /* LLaDA-8B Base/Instruct/1.5: OLMo tensor names, MHA, no logit shift      */
    DLLM_FAMILY_DREAM = 1, /* Dream-7B (Qwen2 layout): GQA, q/k/v bias, logit shift                  */
    DLLM_FAMILY_FAST_DLLM_V2 = 2, /* Fast-dLLM v2 (model_type Fast_dLLM_Qwen): Qwen2 layout, block
                                     diffusion (block-causal, a K/V cache of committed blocks), logit
                                     shift; mask and stop ids from the tokenizer files              */
    DLLM_FAMILY_NEMOTRON_DIFFUSION = 3, /* Nemotron-Labs-Diffusion (nemotron_labs_diffusion): encoder.*
                                     names, GQA, YaRN RoPE, Llama-4 query scaling, block diffusion   */
    DLLM_FAMILY_LLADA2 = 4 /* LLaDA2.0 / LLaDA2.1 (model_type llada2_moe): mixture of experts (sigmoid
                                     router, group-limited top-k, a shared expert, dense first layers),
                                     fused QKV, QK-norm, partial RoPE, block diffusion from position 0,
                                     no logit shift (see LLaDA2 below)                               */
} dllm_family;

typedef struct dllm_model_params {
    int use_mmap;      /* map safetensors files instead of reading them (default 1)                  */
} dllm_model_params;

typedef struct dllm_model_info {
    dllm_family family;
    int n_vocab;       /* logit columns (LLaDA: embedding_size, padding rows included)              */
    int n_embd;        /* hidden size                                                               */
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;
    int n_ff;          /* MLP hidden size                                                           */
    int max_seq_len;   /* longest canvas (prompt + generation) the model supports                   */
    int shift_logits;  /* 1 if position i is predicted by the logits at i-1 (Dream)                 */
    int32_t mask_id;   /* the diffusion [MASK] token; -1 for a Fast-dLLM v2 checkpoint whose
                          tokenizer files and config.json name none (set dllm_gen_params.mask_id)   */
    int32_t eos_id;    /* end of text, -1 if unknown                                                */
    int32_t eot_id;    /* end of turn (LLaDA <|eot_id|>), -1 if unknown                             */
    int32_t bos_id;    /* -1 if unknown                                                             */
    int64_t n_params;
    int block_size;    /* block diffusion families: the model's block (config bd_size / block_size);
                          LLaDA2: 32, its generate's default; 0 for LLaDA and Dream                  */
    int32_t stop_id;   /* block diffusion: the token that ends a generation (Fast-dLLM v2 <|im_end|>,
                          Nemotron eos_token_id); -1 otherwise                                       */
    int precision;     /* a dllm_precision: what a quantised checkpoint (dllm_model_quantize) holds, the
                          one precision family a context on it may use (DLLM_PRECISION_AUTO picks it);
                          DLLM_PRECISION_BF16 for an ordinary checkpoint                             */
    int quantized_lm_head; /* a quantised checkpoint holds a 4-bit LM head (quantize_lm_head)       */
} dllm_model_info;

DLLM_API dllm_model_params dllm_model_default_params(void);

/* Load config.json and model.safetensors (or model.safetensors.index.json with its shards) from dir.
 * Every tensor is checked against the config (names, shapes, BF16/F16/F32 dtype). A directory written by
 * dllm_model_quantize (its safetensors metadata says so) loads its stored 4-bit weights instead of the
 * linears' BF16 ones, every code and scale checked against the config. */
DLLM_API dllm_status dllm_model_load(const char *dir, dllm_model_params params, dllm_model **out_model);

/* A model with the shape of a config.json (a file, or a directory holding one) and random weights that
 * the GPU backend generates on the device: for benchmarks at real sizes without a checkpoint. */
DLLM_API dllm_status dllm_model_load_random(const char *config_path, uint64_t seed, dllm_model **out_model);

DLLM_API void dllm_model_free(dllm_model *model);

DLLM_API dllm_status dllm_model_get_info(const dllm_model *model, dllm_model_info *out_info);

/* ---------------------------------------------------------------------------------------------------
 * Tokenizers: Hugging Face byte-level BPE (tokenizer.json, or vocab.json + merges.txt) and chat templates
 * A tokenizer is immutable after loading except for an internal encode cache guarded by a lock, so one
 * tokenizer may be shared by several threads.
 * ------------------------------------------------------------------------------------------------- */
typedef struct dllm_tokenizer dllm_tokenizer;

/* Loads tokenizer.json from dir, or else vocab.json + merges.txt with the added tokens of
 * tokenizer_config.json / added_tokens.json. An unknown pre-tokenizer pattern is an error. */
DLLM_API dllm_status dllm_tokenizer_load(const char *dir, dllm_tokenizer **out_tok);

DLLM_API void dllm_tokenizer_free(dllm_tokenizer *tok);

/* One more than the largest id the tokenizer can produce. */
DLLM_API int dllm_tokenizer_n_vocab(const dllm_tokenizer *tok);

/* The id of a token given by its exact string (e.g. "<|mdm_mask|>"; vocabulary entries are spelled in
 * the byte-level alphabet, " the" as "\xC4\xA0the"), or -1. */
DLLM_API int32_t dllm_tokenizer_token_id(const dllm_tokenizer *tok, const char *token);

/* DLLM_OK if every id the tokenizer can produce is inside the model's vocabulary; an error otherwise. */
DLLM_API dllm_status dllm_tokenizer_check_model(const dllm_tokenizer *tok, const dllm_model *model);

/* UTF-8 text (text_len bytes, need not be NUL-terminated) to ids; no BOS/EOS is added. parse_special = 1
 * recognises special-token text as Hugging Face does by default; 0 treats it as plain text (untrusted
 * input). Ill-formed UTF-8 is first replaced by U+FFFD as Python's errors="replace" does. ids may be NULL
 * when capacity is 0. If capacity is too small: DLLM_ERR_BUFFER_TOO_SMALL and *n_ids = the count needed. */
DLLM_API dllm_status dllm_tokenize(const dllm_tokenizer *tok, const char *text, size_t text_len, int parse_special,
                                   int32_t *ids, int capacity, int *n_ids);

/* Ids to UTF-8 (NUL-terminated; invalid byte sequences become U+FFFD). skip_special = 1 omits special
 * tokens. *text_len = the bytes of the result, NUL included; if capacity is smaller (text may then be
 * NULL): DLLM_ERR_BUFFER_TOO_SMALL. An id the tokenizer does not have is DLLM_ERR_INVALID_ARGUMENT. */
DLLM_API dllm_status dllm_detokenize(const dllm_tokenizer *tok, const int32_t *ids, int n_ids, int skip_special,
                                     char *text, size_t capacity, size_t *text_len);

typedef enum dllm_chat_template {
    DLLM_CHAT_NONE = 0,   /* no template known for this tokenizer                                  */
    DLLM_CHAT_LLADA = 1,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>, BOS first turn */
    DLLM_CHAT_CHATML = 2, /* Qwen2.5 <|im_start|>role\n...<|im_end|>\n, default system prompt           */
    DLLM_CHAT_LLADA2 = 3  /* LLaDA2 / Ling 2.0 <role>HUMAN</role>...<|role_end|>, "detailed thinking off" */
} dllm_chat_template;

typedef struct dllm_chat_message {
    const char *role;     /* "system", "user" or "assistant" */
    const char *content;
} dllm_chat_message;

/* The chat template the tokenizer's files ask for. */
DLLM_API dllm_chat_template dllm_tokenizer_chat_template(const dllm_tokenizer *tok);

/* Renders a conversation exactly as transformers' apply_chat_template does with the model's Jinja template,
 * add_assistant being its add_generation_prompt (LLaDA's template appends the assistant header always).
 * Roles are "system", "user" and "assistant". Output NUL-terminated; BUFFER_TOO_SMALL with *text_len =
 * the bytes needed, NUL included. */
DLLM_API dllm_status dllm_chat_render(const dllm_tokenizer *tok, const dllm_chat_message *msgs, int n_msgs, int add_assistant,
                                      char *text, size_t capacity, size_t *text_len);

/* ---------------------------------------------------------------------------------------------------
 * Contexts
 * ------------------------------------------------------------------------------------------------- */
typedef struct dllm_ctx dllm_ctx;

typedef enum dllm_backend {
    DLLM_BACKEND_AUTO = 0, /* the GPU backend when a usable GPU is present, else the CPU reference     */
    DLLM_BACKEND_CPU = 1,  /* fp32 reference: clear code, slow, runs anywhere                          */
    DLLM_BACKEND_GPU = 2   /* CUDA: NVRTC kernels + cuBLASLt                                           */
} dllm_backend;

/* Arithmetic of the linear layers (LaCache's precision-adaptive FP8). FP8 quantises weights once at
 * context creation to E4M3 with one scale per 128x128 block, and each GEMM input per 1x128 group; layer 0
 * always stays exact. Both backends compute the same function (the CPU on the dequantised values). FP8 GEMMs
 * run on sm_90 (cuBLASLt) and sm_89 (dllm's own kernel); other GPUs run BF16 and log a warning.
 *
 * SoloQ (calibration-free W4A4, arXiv 2610.07121): every attention and MLP linear of every layer gets 4-bit
 * weights, quantised once at context creation in the basis of a seeded K-RPBH rotation (weights stored as
 * 4-bit codes + FP32 row scales, NVFP4 also an E4M3 scale per 16: 4-4.5 bits a weight), and 4-bit
 * activations, each token rotated and quantised on its own (per-token scales: batching and LaCache stay
 * exact). The scale-only bias correction ||z||^2 / <q(z), z> is folded into every row and token scale.
 * Embeddings and the LM head stay BF16 (dllm_ctx_params.quantize_lm_head quantises the head too). The -W4A16
 * variants leave activations unquantised. Both backends run them (LLaDA2 too, see LLaDA2 below): the GPU
 * quantises the weights on the device into the CPU reference's codes and scales, and quantises its BF16 activations
 * where the CPU quantises fp32 ones.
 * Ablation switches (environment, read once per process): DLLM_SOLOQ_ROTATION = krpbh (default) | rpbh | mixer |
 * hadamard | haar | none, DLLM_SOLOQ_BIAS_CORRECTION = 1 (default) | 0; the RTN baseline ignores both.
 * dllm_model_quantize (dllm-quantize) quantises once and writes the result as a model directory; a context on it
 * loads the stored weights. Accuracy: BENCHMARKS.md. */
typedef enum dllm_precision {
    DLLM_PRECISION_AUTO = -1,    /* the default: what a quantised checkpoint holds (dllm_model_info.
                                    precision), else BF16                                            */
    DLLM_PRECISION_BF16 = 0,     /* BF16 weights on the GPU, fp32 on the CPU                        */
    DLLM_PRECISION_FP8_FFN = 1,  /* the paper: FFN linears (gate|up, down) of layers >= 1 in FP8     */
    DLLM_PRECISION_FP8_ALL = 2,  /* also the attention projections (Q|K|V, O) of layers >= 1        */
    DLLM_PRECISION_SOLOQ_N = 3,  /* SoloQ-N: NVFP4 weights and activations (E2M1, E4M3 per 16, FP32
                                    per row / token)                                                 */
    DLLM_PRECISION_SOLOQ_I = 4,  /* SoloQ-I: uniform INT4 (mid-rise, step 0.3352 RMS), FP32 scales    */
    DLLM_PRECISION_SOLOQ_C = 5,  /* SoloQ-C: E8P-RVQ 4-bit weight codebook, Lloyd-Max 4-bit activations */
    DLLM_PRECISION_RTN_W4A4 = 6, /* baseline: symmetric INT4, round to nearest, per-row weight and
                                    per-token activation absmax scales, no rotation                  */
    DLLM_PRECISION_SOLOQ_N_W4A16 = 7, /* the same four with BF16 activations (weight-only)           */
    DLLM_PRECISION_SOLOQ_I_W4A16 = 8,
    DLLM_PRECISION_SOLOQ_C_W4A16 = 9,
    DLLM_PRECISION_RTN_W4A16 = 10
} dllm_precision;

/* Commit-time K/V quantisation of block diffusion (Fast-dLLM v2, Nemotron; SoloQ, arXiv 2610.07121). When a block
 * is committed (the forward that appends its K/V to the cache), its keys and values are quantised once; the block
 * being denoised stays full precision, and attention over the committed cache reads the quantised rows. Keys are
 * KIVI's per channel, asymmetric min/max over one committed block (group = block_length tokens), FP16 (scale, min)
 * per (layer, kv head, channel, block). SOLOQ values: per (token, kv head) rotated by K-RPBH, Lloyd-Max 4 or 2
 * bits on the RMS-normalised row, one FP32 factor with SoloQ's scale-only bias correction. KIVI values: per
 * (token, kv head) asymmetric min/max, FP16 (scale, min). Block-diffusion models only (the others have no
 * committed cache: DLLM_ERR_UNSUPPORTED names the option). Both backends; the GPU's attention reads the codes
 * directly, on tensor cores (kvq_flash; DLLM_DEBUG_PLAIN=1, or a head dim it does not take: the scalar
 * kvq_attention).
 * Memory: on the GPU the committed cache is the codes alone, dllm_kv_bytes_per_token a token (SOLOQ_KV4 at the 7B
 * shape: 0.29x the BF16 cache, KV2 0.16x), plus full-precision rows for the sinks and for the rows one forward attends
 * to past the committed ones (one layer's at a time: a block, or the prefill's prompt) and the block cache. The CPU
 * reference keeps its fp32 cache beside the codes (it attends over the decoded values). A generation whose committed
 * cache does not fit the device fails before it starts (DLLM_ERR_OUT_OF_MEMORY) naming the length that fits. */
typedef enum dllm_kv_quant {
    DLLM_KV_QUANT_NONE = 0,      /* the default: the cache in BF16 (fp32 on the CPU)                  */
    DLLM_KV_QUANT_SOLOQ_KV4 = 1, /* keys KIVI 4-bit, values K-RPBH + Lloyd-Max 4-bit + bias correction */
    DLLM_KV_QUANT_SOLOQ_KV2 = 2, /* the same at 2 bits                                                 */
    DLLM_KV_QUANT_KIVI_KV4 = 3,  /* baseline: KIVI keys and values, 4-bit                              */
    DLLM_KV_QUANT_KIVI_KV2 = 4   /* baseline: KIVI keys and values, 2-bit                              */
} dllm_kv_quant;

#define DLLM_MAX_DEVICES 8  /* the most GPUs one context may span (dllm_ctx_params.devices) */

/* SoloQ's rotation of every linear's input (with the inverse folded into the weights). DEFAULT is the paper's K-RPBH,
 * or what a quantised checkpoint recorded; the others are the ablations of the SoloQ paper. RTN-W4A4 never rotates. */
typedef enum dllm_soloq_rotation {
    DLLM_SOLOQ_ROTATION_DEFAULT = 0,
    DLLM_SOLOQ_ROTATION_NONE = 1,
    DLLM_SOLOQ_ROTATION_HADAMARD = 2,  /* block Walsh-Hadamard on the largest power-of-two blocks */
    DLLM_SOLOQ_ROTATION_RPBH = 3,      /* random permutation and signs, then block Hadamard */
    DLLM_SOLOQ_ROTATION_MIXER = 4,     /* random signs, block Hadamard, a Haar mixer across blocks */
    DLLM_SOLOQ_ROTATION_KRPBH = 5,     /* permutation, signs, block Hadamard and the mixer: the paper's K-RPBH */
    DLLM_SOLOQ_ROTATION_HAAR = 6       /* a dense Haar-random orthogonal matrix (dims up to 1024) */
} dllm_soloq_rotation;

/* Progress of a quantisation: `done` of `total` layers (the LM head counts as one when quantised) are finished. */
typedef void (*dllm_quantize_progress_fn)(int done, int total, void *user_data);

typedef struct dllm_ctx_params {
    dllm_backend backend;  /* default AUTO                                                           */
    int device;            /* CUDA device ordinal (default 0)                                        */
    int max_tokens;        /* longest canvas this context serves; 0 = the model's max_seq_len       */
    int n_threads;         /* CPU backend threads; 0 = all hardware threads                          */
    dllm_precision precision; /* default DLLM_PRECISION_AUTO                                        */
    int quantize_lm_head;  /* SoloQ precisions: 1 quantises the LM head too (default 0: BF16, the paper's) */
    dllm_kv_quant kv_quant; /* block diffusion's committed K/V cache (default DLLM_KV_QUANT_NONE)        */
    int kv_sink_tokens;    /* with kv_quant: sequence positions [0, N) keep full-precision K/V (attention
                              sinks). -1 (default): the model's, the SoloQ paper's sink position p kept with
                              everything before it, N = p + 1: 3 for Fast-dLLM v2 (p = 2), 1 for Nemotron (p = 0) */
    /* Tensor parallelism (GPU backend): one model split across the GPUs devices[0..n_devices) of this host, rank i
     * on devices[i] (Megatron-style: attention heads, K/V heads, FFN width and vocabulary split evenly, so each must
     * divide by n_devices; NCCL all-reduces, libnccl.so.2 loaded at run time). 0 (default): one GPU, `device`; 1:
     * one GPU, devices[0] (device is then ignored). Default devices {0, 1, ..., 7}; the listed ones must be distinct
     * and non-negative. The multi-GPU forward is not built: more than one device is validated (the split, each
     * device usable, NCCL loadable) and then DLLM_ERR_UNSUPPORTED (docs/internals.md, "Tensor parallelism"). */
    int n_devices;
    int devices[DLLM_MAX_DEVICES];
    /* SoloQ precisions: the rotation (default DLLM_SOLOQ_ROTATION_DEFAULT) and the scale-only bias correction (-1,
     * the default: on, or what a quantised checkpoint recorded; 0 off; 1 on). A quantised checkpoint runs only with
     * the values it was quantised with (or the defaults). */
    dllm_soloq_rotation soloq_rotation;
    int soloq_bias_correction;
    /* Called on the creating thread after each layer the backend (CPU or GPU) quantises at context creation (FP8 and
     * SoloQ precisions on an unquantised checkpoint: seconds to minutes on a large model), done of total, the last
     * call with done == total; never called when nothing is quantised (BF16, a quantised checkpoint, weights another
     * GPU context on the same model and device already holds). It must not create a context on the same model. May
     * be NULL (the default). */
    dllm_quantize_progress_fn progress;
    void *progress_user_data;
} dllm_ctx_params;

DLLM_API dllm_ctx_params dllm_ctx_default_params(void);

/* Bytes of committed K/V cache per token under kv_quant (all layers, keys and values; the per-block key scales
 * amortised over block_length tokens, 0 = the model's block), into *bytes. Sink tokens are full-precision rows on
 * top (2 bytes an element). DLLM_KV_QUANT_NONE gives the BF16 cache's 4 * n_layer * n_kv_heads * head_dim. */
DLLM_API dllm_status dllm_kv_bytes_per_token(const dllm_model *model, dllm_kv_quant kv_quant, int block_length, double *bytes);

/* ---------------------------------------------------------------------------------------------------
 * Quantising once (dllm-quantize): a SoloQ precision's 4-bit weights written as a model directory
 * Quantising an 8B model's linears takes minutes on the CPU; a context on the written directory loads the
 * stored codes and scales instead, bit-identical to quantising at context creation. The directory holds
 * config.json and the tokenizer files copied from the source, and model.safetensors (or shards
 * model-0000k-of-0000n.safetensors of at most max_shard_bytes with model.safetensors.index.json): standard
 * safetensors (U8, F32 and the source's BF16/F16/F32 only) with, per layer l and linear site s in qkv (Q|K|V
 * stacked by rows), o, gate_up (gate|up), down (and lm_head.soloq.* for a quantised head):
 *   model.layers.{l}.soloq.{s}.codes        U8  [rows][cols / 2]    two 4-bit codes a byte, low nibble first
 *   model.layers.{l}.soloq.{s}.block_scales U8  [rows][ceil(cols / 16)]  UE4M3 per 16 (NVFP4 only)
 *   model.layers.{l}.soloq.{s}.row_scale    F32 [rows]              the value of an element is C * row_scale
 * in the basis of the site's seeded rotation (docs/internals.md, "Quantised checkpoints"), and every other
 * tensor (embeddings, norms, biases, an unquantised head) as the source holds it. LLaDA2: qkv is the fused
 * projection; in a MoE layer gate_up and down are the shared expert's, routed expert e's are
 * model.layers.{l}.soloq.experts.{e}.{gate_up,down}.*, and the router and expert biases are copied.
 * __metadata__ records dllm.quant_version, dllm.precision, dllm.weight_format, dllm.rotation,
 * dllm.rotation_seed, dllm.bias_correction, dllm.quantize_lm_head and dllm.source_config (the source's
 * config.json). */
typedef struct dllm_quantize_params {
    dllm_precision precision;  /* a SoloQ precision: SOLOQ_N/I/C or RTN_W4A4 (or a -W4A16 form, recorded as
                                  asked; a context may use either form of the same weight format)       */
    int quantize_lm_head;      /* 1: the LM head in 4 bits too (default 0)                                */
    int n_threads;             /* 0 = all hardware threads                                                */
    int overwrite;             /* 1: write into an existing non-empty out_dir, replacing dllm's files      */
    size_t max_shard_bytes;    /* a safetensors file holds at most this (default 4 GiB; a larger tensor
                                  gets a file of its own)                                                 */
    dllm_quantize_progress_fn progress; /* called after each quantised layer (done of total); may be NULL */
    void *progress_user_data;
    dllm_soloq_rotation soloq_rotation; /* as dllm_ctx_params (default DLLM_SOLOQ_ROTATION_DEFAULT), recorded */
    int soloq_bias_correction;          /* as dllm_ctx_params (-1 default: on), recorded                      */
} dllm_quantize_params;

DLLM_API dllm_quantize_params dllm_quantize_default_params(void);

/* Quantise model's linears to params->precision and write the directory out_dir (created if missing;
 * an existing non-empty one is DLLM_ERR_INVALID_ARGUMENT unless overwrite). The model must have been
 * loaded from an unquantised checkpoint (its directory is where config.json and the tokenizer files are
 * copied from). The DLLM_SOLOQ_ROTATION / DLLM_SOLOQ_BIAS_CORRECTION switches apply and are recorded. LLaDA2: every
 * routed and shared expert is quantised too; router, expert biases and norms are copied as they are. */
DLLM_API dllm_status dllm_model_quantize(const dllm_model *model, const char *out_dir, const dllm_quantize_params *params);

DLLM_API dllm_status dllm_ctx_create(dllm_model *model, dllm_ctx_params params, dllm_ctx **out_ctx);

DLLM_API void dllm_ctx_free(dllm_ctx *ctx);

/* Detail of the last failing call on this context ("" if none). */
DLLM_API const char *dllm_ctx_last_error(const dllm_ctx *ctx);

/* The backend the context actually runs on (never AUTO). */
DLLM_API dllm_backend dllm_ctx_get_backend(const dllm_ctx *ctx);

/* Logits of one full bidirectional forward over ids[0..n_ids) (block diffusion: block-causal, see below), for
 * positions [row_begin, row_end). out receives (row_end - row_begin) * n_vocab floats, row-major. For models with
 * shift_logits the row of position i holds the prediction for position i (the shift is already applied). */
DLLM_API dllm_status dllm_logits(dllm_ctx *ctx, const int32_t *ids, int n_ids, int row_begin, int row_end,
                                 float *out, size_t out_count);

/* ---------------------------------------------------------------------------------------------------
 * Generation: semi-autoregressive block decoding (LLaDA's generate.py, Fast-dLLM, DPad, Dream's samplers)
 * ------------------------------------------------------------------------------------------------- */
/* Which candidates a step commits first: the ranking key (the "confidence") of each masked position. p is
 * the softmax of its logits: LLaDA's softmax(l) for LOW_CONFIDENCE under the SCHEDULE, THRESHOLD and FACTOR
 * rules (generate.py, Fast-dLLM); Dream's softmax(l / temperature) (at temperature > 0) for MARGIN and
 * ENTROPY always and for LOW_CONFIDENCE under DLLM_UNMASK_TIMESTEPS, where it is Dream's maskgit_plus.
 * The keys live on different scales: p(x0) and the margin in [0, 1], the negative entropy in [-log V, 0]
 * nats, so a threshold means something different for each. */
typedef enum dllm_remasking {
    DLLM_REMASK_LOW_CONFIDENCE = 0, /* the highest p(x0) first (Dream's maskgit_plus)                */
    DLLM_REMASK_RANDOM = 1,         /* random positions (seeded)                                     */
    DLLM_REMASK_MARGIN = 2,         /* Dream's topk_margin: the largest p(top1) - p(top2) first      */
    DLLM_REMASK_ENTROPY = 3,        /* Dream's entropy: the highest sum p log p (least entropy) first;
                                       computed as sum p log p, without Dream's +1e-10 inside the log
                                       (a difference below V * 1e-10)                                */
    DLLM_REMASK_ORIGIN = 4          /* Dream's origin: each mask transfers independently with
                                       probability 1 - t[i+1]/t[i]; needs DLLM_UNMASK_TIMESTEPS; ranks
                                       nothing, so no confidence_eos_eot_inf and no alg_temp         */
} dllm_remasking;

/* LaCache (GPU backend; block diffusion's on both, see below): exact reuse of work that does not change inside a
 * block. Every mode gives the same tokens and the same logits, bit for bit; the CPU reference computes that same
 * function. On the GPU it works in dllm_generate's own forwards (tuned_forwards = 1); a batch, and dllm_generate by
 * default, compute the LM head on the rows they choose from and reuse nothing else. With a K/V cache (dllm_kv_cache) the later steps of a block recompute no outside row anyway: every
 * mode then acts as TRUNCATE (LM head and sampler on the block's rows). */
typedef enum dllm_lacache {
    DLLM_LACACHE_OFF = 0,      /* recompute everything every step, LM head on every row (the reference)  */
    DLLM_LACACHE_TRUNCATE = 1, /* final norm, LM head and sampler on the block's rows only             */
    DLLM_LACACHE_ON = 2        /* + EmbedCache, RoPECache and FACache in layer 0 (default)              */
} dllm_lacache;

/* How many candidates a step commits (LLaDA generate.py, Fast-dLLM, Dream generation_utils.py). */
typedef enum dllm_unmask {
    DLLM_UNMASK_SCHEDULE = 0,  /* LLaDA: n/s per step, steps fixed (n masks of a block over s steps)     */
    DLLM_UNMASK_THRESHOLD = 1, /* Fast-dLLM: the best candidate and every one with confidence >= threshold;
                                  a block repeats steps until it has no mask (steps is ignored)        */
    DLLM_UNMASK_FACTOR = 2,    /* Fast-dLLM: the longest confidence-sorted prefix with c_n >= 1 - factor/(n+1),
                                  at least one; steps is ignored                                        */
    DLLM_UNMASK_TIMESTEPS = 3  /* Dream: with t = linspace(1, eps, s + 1), step i of a block commits
                                  floor(n (1 - t[i+1]/t[i])) of the n candidates left (0 is possible),
                                  all of them at the last step; steps fixed as for SCHEDULE             */
} dllm_unmask;

/* Fast-dLLM's K/V caches. APPROXIMATE: K/V of positions outside the forwarded rows are reused stale within
 * a block, so tokens can differ from the uncached path (measured as agreement, not equality). Each block's
 * first step is a full forward that refreshes the whole cache. */
typedef enum dllm_kv_cache {
    DLLM_KV_CACHE_NONE = 0,   /* every step forwards the whole canvas (exact)                              */
    DLLM_KV_CACHE_PREFIX = 1, /* later steps forward the block and everything after it over cached prefix K/V */
    DLLM_KV_CACHE_DUAL = 2    /* later steps forward the block only over cached prefix and suffix K/V      */
} dllm_kv_cache;

/* DPad suffix dropout: each block attends to a random subset of the masked suffix, drawn once
 * per block from the seed; kept positions keep their RoPE positions. Changes the output (by design). */
typedef enum dllm_dpad {
    DLLM_DPAD_OFF = 0,
    DLLM_DPAD_GAUSSIAN = 1,   /* keep suffix distance d < window with probability scale * phi(k * d / (window - 1)) */
    DLLM_DPAD_UNIFORM = 2     /* keep dpad_n positions drawn uniformly from the window                           */
} dllm_dpad;

/* What happened in one denoising step; passed to the step callback. */
typedef struct dllm_step_info {
    int block;                    /* current block, 0-based                                        */
    int n_blocks;
    int step;                     /* step within the block, 0-based                                */
    int steps_per_block;          /* 0 under threshold/factor decoding (data-dependent)            */
    int global_step;              /* steps done so far in this generation, this one included       */
    int total_steps;              /* upper bound under threshold/factor decoding (one per mask: the
                                     generation's and the prompt's)                                */
    int n_committed;              /* positions unmasked by this step                              */
    const int32_t *committed_pos; /* their canvas positions, ascending                             */
    const int32_t *canvas;        /* the whole canvas after the step: prompt ++ generation         */
    int canvas_len;
    int prompt_len;
    int n_masked;                 /* masks left in the generated part (block diffusion: in the canvas
                                     so far, whose later blocks are not appended yet)              */
} dllm_step_info;

/* Called after every step. Return 0 to continue, nonzero to cancel (dllm_generate then returns
 * DLLM_ERR_CANCELLED with the canvas so far in its output). */
typedef int (*dllm_step_fn)(const dllm_step_info *info, void *user_data);

typedef struct dllm_gen_params {
    int gen_length;             /* masked positions appended to the prompt (default 128)           */
    int steps;                  /* denoising steps over the whole generation (default 128); at most
                                   gen_length under the counted rules (SCHEDULE, TIMESTEPS), since
                                   further steps would commit nothing (DLLM_ERR_INVALID_ARGUMENT) */
    int block_length;           /* SAR block; gen_length % block_length == 0 and steps % n_blocks == 0 */
    float temperature;          /* 0 = argmax; > 0 (finite) = Gumbel-max sampling of softmax(logits / T),
                                   keys l / T - log(-log u) in float64: no temperature overflows   */
    float cfg_scale;            /* classifier-free guidance; 0 = off                               */
    dllm_remasking remasking;
    uint64_t seed;              /* drives every random draw (counter-based: reproducible)          */
    int logits_eos_inf;         /* EOS logit := -inf before choosing tokens                        */
    int confidence_eos_eot_inf; /* positions predicting EOS or EoT are committed last (docs/internals.md) */
    int stop_at_eos;            /* output ends before the first EOS/EoT (default 1)                */
    dllm_lacache lacache;       /* default DLLM_LACACHE_ON                                         */
    dllm_unmask unmask;         /* default DLLM_UNMASK_SCHEDULE                                    */
    double threshold;           /* DLLM_UNMASK_THRESHOLD's tau in (0, 1] (default 0.9); <= 0 with
                                   DLLM_REMASK_ENTROPY (a bound on minus the entropy, in nats)      */
    double factor;              /* DLLM_UNMASK_FACTOR's f > 0 (default 1.0)                        */
    double eps;                 /* DLLM_UNMASK_TIMESTEPS's last timestep, in (0, 1) (default 1e-3)  */
    double alg_temp;            /* > 0: a counted step (SCHEDULE, TIMESTEPS) samples its k positions
                                   without replacement from softmax(confidence / alg_temp) instead
                                   of taking the top k (Dream's alg_temp; default 0); the other
                                   rules and DLLM_REMASK_ORIGIN reject it                            */
    dllm_kv_cache kv_cache;     /* default DLLM_KV_CACHE_NONE; PREFIX/DUAL are approximate          */
    dllm_dpad dpad;             /* default DLLM_DPAD_OFF                                           */
    int dpad_window;            /* suffix positions considered (default 256)                      */
    float dpad_k;               /* Gaussian sharpness (default 4)                                  */
    float dpad_scale;           /* Gaussian scale a (default 2)                                    */
    int dpad_n;                 /* DLLM_DPAD_UNIFORM: positions kept per block (default 64)        */
    int early_stop;             /* after a block containing EOS/EoT: fill the rest with it and stop */
    int32_t mask_id;            /* -1 = the model's (a model without one: DLLM_ERR_INVALID_ARGUMENT) */
    int32_t eos_id;             /* -1 = the model's                                                */
    int32_t eot_id;             /* -1 = the model's                                                */
    int sub_block_length;       /* block diffusion: sub-block S, decoded left to right; divides
                                   block_length (0 = the official default, 8)                       */
    int block_cache;            /* block diffusion: Fast-dLLM v2's sub-block ("block") cache, 0/1;
                                   APPROXIMATE by design (stale K/V of the block's other rows)      */
    int32_t stop_id;            /* block diffusion: stop token, -1 = the model's (info.stop_id)     */
    dllm_step_fn on_step;       /* optional streaming/progress callback                            */
    void *on_step_data;
    /* Sampler filters (llama.cpp / Hugging Face habits). Each keeps a set of vocabulary entries of a row; a
     * token outside the intersection of the three sets gets logit -inf before anything else looks at the row,
     * so the token choice (argmax or Gumbel-max) and the confidence (its softmax) both see the filtered row.
     * Each set is computed on the unfiltered row (after CFG and logits_eos_inf), so the order does not matter;
     * ties are kept. Probabilities here are softmax(l / temperature) at temperature > 0, else softmax(l).
     * All three off (the defaults) is bit-for-bit the unfiltered sampler.                               */
    int top_k;                  /* > 0: keep tokens whose logit is >= the k-th largest (0 = off)    */
    float top_p;                /* in (0, 1): keep the smallest set of most probable tokens whose mass
                                   is >= top_p, and every token tied with the least probable of them
                                   (1 = off)                                                        */
    float min_p;                /* in (0, 1]: keep tokens with p >= min_p * p(most probable) (0 = off) */
    /* LLaDA2 (DLLM_FAMILY_LLADA2) only; see "LLaDA2" below. Other families reject values other than the defaults. */
    double edit_threshold;      /* < 0 (default -1): LLaDA2.0's loop, no token editing; in [0, 1]: LLaDA2.1's
                                   loop, which rewrites an already decoded token of the current block whose
                                   new prediction has p > edit_threshold (1 = LLaDA2.1's loop without edits) */
    int max_post_steps;         /* LLaDA2.1's loop: forwards after a block's last mask is filled that may
                                   still edit it (-1 = the official default, 16; >= 0 otherwise)       */
    int tuned_forwards;         /* GPU backend, 0 (default) or 1: dllm_generate runs its own forwards, each GEMM
                                   tuned to its row count, and LaCache's reuse, instead of the batched
                                   forwards (see dllm_generate); the same tokens up to near-ties, not the
                                   bits the prompt gets from dllm_generate_batch, and such an item decodes
                                   alone in a batch. The CPU backend's answer is one either way.      */
} dllm_gen_params;

typedef struct dllm_gen_stats {
    int n_prompt;
    int n_generated;            /* ids written to the output (after truncation at EOS/EoT)         */
    int steps;                  /* denoising steps run                                            */
    int forwards;               /* model forwards run, NFE (CFG counts two per step)               */
    double wall_ms;
    int facache_rows;           /* block diffusion under DLLM_LACACHE_ON: block rows whose layer-0 state over
                                   the committed cache a forward needed; 0 otherwise (also on the GPU under
                                   kv_quant, and for dllm_generate_batch's batched block-diffusion items) */
    int facache_rows_reused;    /* ... and of those, rows that reused it (token unchanged in the block) */
} dllm_gen_stats;

DLLM_API dllm_gen_params dllm_gen_default_params(void);

/* Block diffusion (DLLM_FAMILY_FAST_DLLM_V2, DLLM_FAMILY_NEMOTRON_DIFFUSION). The model's family selects
 * it; dllm_generate then decodes exactly as Fast-dLLM v2's official `generate` (NVlabs/Fast-dLLM v2):
 *   - block_length is the block B (default 32, the official default; gen_length a multiple of it; the
 *     official code floors gen_length / B instead), sub_block_length S (default 8) must divide it;
 *   - a prompt longer than B has its whole blocks prefilled once, block-causally (Nemotron: causally, as its
 *     commit forwards), into a K/V cache of committed blocks; a prompt of L <= B tokens is part of the first
 *     block (L == B: the quirk of the official code, the first block is B masks forwarded without the prompt);
 *   - per block, sub-blocks left to right, each repeated until it has no mask: forward the block against
 *     the committed cache, shifted logits, commit the masked positions with p(x0) > tau plus the best one;
 *     tau = threshold under DLLM_UNMASK_THRESHOLD, else 1 (the official default: one token a step); steps
 *     is ignored (a block steps until it has no mask);
 *   - the finished block is forwarded once more to append its K/V; the argmax of its last logit row is
 *     the next block's first token (the AR seed); the generation stops once the stop token is committed
 *     with no mask before it (or is an AR seed).
 * Output: the official `generate` output after the prompt, up to n_blocks * B + 1 - (n_prompt mod B) ids
 * (gen_length + 1 when n_prompt is a multiple of B, because it ends with the last AR seed), so out_capacity must be
 * at least that; with stop_at_eos it ends before the first stop token, without it just after it (as the official
 * code truncates). Differences from the official code, all chosen: fp32 forward and float64 softmax (the official
 * runs bf16: there conf > 0.9 compares in bf16), greedy only (temperature 0; the official
 * top_p only acts at temperature > 0), the prompt may not contain the mask id, and a step never predicts the mask
 * id itself (the official loop would never end if it did; a trained model gives it ~0 probability). Ties between
 * equal confidences go to the lowest position (a block of masks alone, the n_prompt == B quirk, ties exactly).
 * Options that do not apply to block diffusion (cfg, DPad, kv_cache, Dream's samplers, the EOS options
 * logits_eos_inf, confidence_eos_eot_inf, early_stop, eos_id and eot_id (it stops at stop_id), the sampler filters
 * top_k, top_p and min_p) are rejected with DLLM_ERR_UNSUPPORTED. Both backends run it (the GPU's forward in BF16,
 * so its tokens equal the CPU's up to near-ties). dllm_logits on these models is the model's plain forward without
 * a cache: block-causal at the granularity of the model's own forward (Fast-dLLM v2: 32, its default block_size
 * argument; Nemotron: its block), positions from 0, shift applied.
 * lacache (DLLM_LACACHE_ON, the default) reuses, inside a block, layer 0's Q/K/V and its attention state over the
 * committed cache for every block row whose token did not change (LaCache's RoPECache and FACache); every mode
 * gives the same bits. Both backends run it (stats: facache_rows, facache_rows_reused); the GPU reuses the
 * attention state only (its layer-0 Q/K/V GEMM computes every row), and not under kv_quant. */

/* LLaDA2 (DLLM_FAMILY_LLADA2: LLaDA2.0-mini/flash, LLaDA2.1-mini). dllm_generate decodes as the official `generate`
 * of LLaDA2.0's modeling code (2.0) and of LLaDA2.1's (2.1), greedily:
 *   - the canvas is prompt ++ masks up to a multiple of block_length B (default 32) counted from position 0, so the
 *     prompt's last partial block is decoded together with the answer; attention is block-causal (a block sees
 *     itself and every earlier block); logits are not shifted;
 *   - the committed blocks' keys and values are cached (the official loop recomputes the prefix at every forward;
 *     under block-causal attention the cache gives the same bits, tested), the whole prompt blocks once;
 *   - edit_threshold < 0, LLaDA2.0: per block at most min(steps, gen_length) forwards, step s committing every mask
 *     with p(x0) > threshold if there are at least k_s = B / steps (+1 for s < B % steps) of them, else the k_s most
 *     confident; generation stops after a block whose generated part holds EOS, and with early_stop as soon as a
 *     committed EOS has no mask before it;
 *   - edit_threshold >= 0, LLaDA2.1: per block, each forward commits the masks with p(x0) > threshold (at least the
 *     most confident one) and rewrites every decoded, non-prompt token of the block whose prediction differs with
 *     p > edit_threshold; after the last mask up to max_post_steps further forwards edit, until one edits nothing;
 *     steps is not used; with early_stop the generation stops after a block whose generated part has no mask and
 *     holds EOS;
 *   - the output is the first gen_length generated ids, cut at the first EOS (kept without stop_at_eos).
 * threshold is p(x0) > threshold, strict (dllm's default 0.9; the official 2.0 default is 0.95, the model card's
 * LLaDA2.1 settings 0.7 / edit 0.5 for quality and 0.5 / edit 0 for speed). The mask and EOS ids default to the
 * official generate's 156895 and 156892 where config.json names none.
 * Chosen differences from the official code: greedy only (temperature 0; the hub's 2.0 sampler samples at
 * temperature 1 when asked for 0, a documented bug: dllm takes the greedy reading, argmax and its p, as LLaDA2.1's
 * sampler does), fp32 forward and float64 softmax (the official runs bf16), the mask id is never predicted (the
 * official 2.1 loop could otherwise run forever), ties between confidences go to the lowest position, the
 * prompt may not hold the mask id, and EOS is looked for in the generated part only. Options that do not apply
 * (cfg, remasking other than low confidence, unmask other than SCHEDULE or THRESHOLD (both mean the loop above), DPad,
 * kv_cache, alg_temp, the sampler filters, logits_eos_inf, confidence_eos_eot_inf, eot_id, stop_id,
 * sub_block_length, block_cache, max_post_steps with LLaDA2.0's loop) are DLLM_ERR_UNSUPPORTED naming the option.
 * Both backends run LLaDA2 in every dllm_precision (AUTO takes the GPU where there is one): FP8 on the FFN linears of
 * layers >= 1 (the dense MLP, the shared and every routed expert;
 * fp8-all also Q|K|V and O), SoloQ and RTN on every linear of every layer, experts included (a MoE layer's gate|up
 * linears share one rotation, as they read the same row), and dllm_model_quantize writes LLaDA2 checkpoints. The
 * router is never quantised: its logits are the fp32 product of the layer's normed row, as the official code computes
 * them, so no rounding of its own moves a token to other experts. kv_quant does not take LLaDA2 yet on the GPU
 * (DLLM_ERR_UNSUPPORTED naming --kv-quant).
 * dllm_generate_batch and dllm_stepper batch LLaDA2 items
 * on both backends, each giving the bits it gets alone (CPU: dllm_generate's; GPU: its batch of one's).
 * dllm_logits is the forward without a cache, block-causal at 32 (generate's default block), positions from 0. */

/* Decode one prompt. out receives the generated ids (prompt excluded) and must hold gen_length ids (the
 * generation is at most that long, and with stop_at_eos often shorter; block diffusion: the bound above, up to
 * gen_length + 1); a smaller out_capacity is DLLM_ERR_BUFFER_TOO_SMALL before any decoding, with nothing written
 * and *n_out = the capacity needed. n_out and stats may be NULL. dllm_generate_batch decodes several prompts together.
 * One answer per prompt: on the GPU backend dllm_generate decodes the prompt as a batch of one, so it gets the bits
 * dllm_generate_batch, a dllm_stepper and dllm-server give it in any batch (on the CPU backend every path gives them).
 * Exceptions: params.tuned_forwards = 1; a context with a dllm_stepper open; a kind the GPU does not batch (an INFO
 * log names it) or whose K/V cache slot does not fit the device. These decode through dllm_generate's own forwards. */
DLLM_API dllm_status dllm_generate(dllm_ctx *ctx, const int32_t *prompt, int n_prompt, dllm_gen_params params,
                                   int32_t *out, int out_capacity, int *n_out, dllm_gen_stats *stats);

/* One prompt of a batch: what dllm_generate takes, with its own parameters (length, block, steps or threshold,
 * seed, temperature, remasking, CFG, stop rules, step callback and its user data). */
typedef struct dllm_batch_item {
    const int32_t *prompt;
    int n_prompt;
    dllm_gen_params params;
    int32_t *out;               /* the generated ids; the same rule as dllm_generate's out          */
    int out_capacity;
} dllm_batch_item;

/* What became of one item: dllm_generate's status, *n_out and stats, and the status's detail. */
typedef struct dllm_batch_result {
    dllm_status status;
    int n_out;                  /* BUFFER_TOO_SMALL: the capacity needed, as dllm_generate reports it */
    dllm_gen_stats stats;       /* steps and forwards as if the item had decoded alone              */
    char error[256];            /* "" when status is DLLM_OK, else the message (truncated)          */
} dllm_batch_result;

/* Decode n_items prompts together (through a dllm_stepper of its own: DLLM_ERR_INVALID_ARGUMENT while the context
 * has one). Every item gets what dllm_generate would give it alone, whatever the batch's other items, their lengths
 * and their order. On the CPU backend: the same tokens, from bit-identical logits. On the GPU backend a batched
 * item's logits are bit-identical to its batch of one's, which dllm_generate decodes (one answer per prompt, however
 * it is submitted; dllm_generate's exceptions: above).
 *
 * Batched on both backends: items on LLaDA and Dream models (the plain schedule, LLaDA's low-confidence / random
 * remasking, Dream's samplers, Fast-dLLM threshold / factor, CFG, DPad, the sampler filters, a kv_cache) decode in
 * lock step, one forward over the rows of every active sequence per step (attention per sequence, each at its own
 * positions; items with a kv_cache in a second forward, each over its own K/V cache slots); a sequence that is done
 * leaves the batch. Block-diffusion items decode together too: one forward per round over every live sequence's
 * next forward, each over its own committed K/V cache (under kv_quant its own codes). Decoded one after another
 * instead, as dllm_generate would (an INFO log says why), on the GPU backend only: the kv_cache items (block diffusion:
 * every item) when the device cannot hold their K/V cache slots.
 *
 * Failures: a bad item (its parameters, its buffer) fails alone, before decoding; an item whose step callback
 * returns nonzero stops alone with DLLM_ERR_CANCELLED and the canvas so far in its output, as dllm_generate's.
 * A global failure (out of memory, a failing forward, a CUDA error) ends every item not finished yet with that
 * status; among the items decoded one after another only out of memory does, another error fails its item alone.
 * Returns DLLM_OK if every item succeeded, else a global failure's status or the first failing item's (in item
 * order), whose message dllm_last_error() and dllm_ctx_last_error() hold; results[i] says which items failed and
 * why. n_items = 0 does nothing and returns DLLM_OK (items and results may then be NULL).
 *
 * batch_stats (may be NULL): n_prompt and n_generated summed over the items; steps and forwards count the
 * batched steps, each one forward whatever the number of sequences in it (CFG's unconditional canvas rides in
 * the same forward; a step with both plain and kv_cache items runs one of each, counted once), i.e. the largest
 * steps count of the batched items, plus the steps and forwards of the items decoded one after another (block
 * diffusion: forwards the batched forwards, the most any item ran; steps the most steps any item ran); wall_ms for
 * the whole call; facache_rows 0. Batched block-diffusion items report facache_rows 0 too. */
DLLM_API dllm_status dllm_generate_batch(dllm_ctx *ctx, const dllm_batch_item *items, int n_items, dllm_batch_result *results,
                                         dllm_gen_stats *batch_stats);

/* ---------------------------------------------------------------------------------------------------
 * Continuous batching: a stepper decodes sequences that join and leave a running batch at any step
 * A server loop adds each request when it comes, steps, streams what each step did, and removes what ended:
 *     dllm_stepper *st; int id;
 *     dllm_stepper_create(ctx, dllm_stepper_default_params(), &st);
 *     dllm_stepper_add(st, &item, &id);                       // any time; joins the next step
 *     while (dllm_stepper_n_active(st) > 0) {
 *         dllm_stepper_step(st);                               // every live sequence: one step, one forward
 *         dllm_seq_event ev;
 *         dllm_stepper_poll(st, id, &ev);                      // ev.info: committed positions, the canvas
 *         if (ev.finished) dllm_stepper_remove(st, id);        // ev.result; item.out holds the ids
 *     }
 *     dllm_stepper_free(st);
 * A sequence joins the next dllm_stepper_step at its own first step (its prefill, with block diffusion; under a K/V
 * cache it may wait a step or more for room among the step's fills, max_fill_rows), and gets what
 * dllm_generate_batch gives it: the same bits whatever joins or leaves around it, when, and in which order
 * (dllm_generate_batch is this loop). Every item dllm_generate_batch takes, with its rules: the kinds it decodes one
 * after another (sequences whose K/V caches the device cannot hold) decode whole inside one step each, after the
 * batched forward, their one event their end; block diffusion under kv_quant batches, each slot its codes.
 * Memory: the K/V caches of sequences with a kv_cache and of block-diffusion sequences live in slots that a sequence
 * frees when it ends and the next one reuses (the smallest that fits, else one enlarged): a long run's memory stops at
 * what its largest concurrent sequences need, and dllm_stepper_free releases it. One stepper per context at a time
 * (dllm_generate_batch runs its own: not while one exists); dllm_generate may run between steps. A stepper is used by
 * its context's thread; the context must outlive it.
 * ------------------------------------------------------------------------------------------------- */
typedef struct dllm_stepper dllm_stepper;

typedef struct dllm_stepper_params {
    int max_sequences;          /* sequences decoding at once, waiting ones included (default 16)      */
    int max_fill_rows;          /* the K/V-cache fills one step forwards (a dual or prefix cache's first
                                   step of a block forwards the whole canvas), in canvas rows: further
                                   sequences due for a fill wait a step, those joining first, then the
                                   longest-waiting; one fill always goes. Keeps each step short, so that a
                                   joining sequence is not held up behind many fills. Only when tokens come
                                   changes, never which (default 1024; 0: no bound)                    */
} dllm_stepper_params;

/* What a sequence's last step did, and whether it ended. The pointers in info stay valid until the next
 * dllm_stepper_step, dllm_stepper_cancel or dllm_stepper_remove of its stepper. */
typedef struct dllm_seq_event {
    int stepped;                /* 1 if the last dllm_stepper_step ran a forward of it (info is that one's) */
    dllm_step_info info;        /* its latest step: committed_pos (this step's commits), the whole canvas so
                                   far (before its first step: the prompt and the masks it will decode). A
                                   block-diffusion commit forward (the prefill, a finished block) shows the next
                                   block's first token as its one committed position, or none */
    int finished;               /* 1 once it ended (done, failed or cancelled): result says how, item.out
                                   holds its ids (with dllm_generate's rules) */
    dllm_batch_result result;   /* its outcome once finished                                           */
} dllm_seq_event;

DLLM_API dllm_stepper_params dllm_stepper_default_params(void);

/* A stepper on ctx (DLLM_ERR_INVALID_ARGUMENT if the context has one already). */
DLLM_API dllm_status dllm_stepper_create(dllm_ctx *ctx, dllm_stepper_params params, dllm_stepper **out_stepper);

/* Frees the stepper and its K/V cache slots; sequences still decoding are dropped, their out buffers untouched. */
DLLM_API void dllm_stepper_free(dllm_stepper *stepper);

/* DLLM_OK if dllm_stepper_add would take the item now, else the status it would return (DLLM_ERR_FULL, or what
 * dllm_generate would say of the item), with the message in dllm_last_error(). */
DLLM_API dllm_status dllm_stepper_can_add(dllm_stepper *stepper, const dllm_batch_item *item);

/* Adds a sequence: checked as dllm_generate checks it (a bad one is not added: its status, and BUFFER_TOO_SMALL's
 * message says the capacity needed), its prompt and parameters copied, *seq_id its id (never reused; -1 on failure).
 * item->out receives its ids when it ends and must stay valid until then (or until it is removed); its step callback,
 * if any, is called as dllm_generate calls it. DLLM_ERR_FULL when max_sequences sequences are decoding. */
DLLM_API dllm_status dllm_stepper_add(dllm_stepper *stepper, const dllm_batch_item *item, int *seq_id);

/* One step: the sequences added since the last one join, every live sequence runs its next step (block diffusion: its
 * next forward) in one batched forward, those that finish, fail or are cancelled by their step callback end; then one
 * sequence waiting to decode alone decodes whole. Nothing to do: DLLM_OK. A sequence's own failure ends it alone (its
 * result says why; the step returns DLLM_OK); a global failure (the batched forward failing, out of memory) ends every
 * sequence of that forward with its status, and the step returns it. */
DLLM_API dllm_status dllm_stepper_step(dllm_stepper *stepper);

/* Sequences not ended yet (waiting, joining or decoding). */
DLLM_API int dllm_stepper_n_active(const dllm_stepper *stepper);

/* A sequence's event (DLLM_ERR_INVALID_ARGUMENT for an id the stepper does not hold). */
DLLM_API dllm_status dllm_stepper_poll(const dllm_stepper *stepper, int seq_id, dllm_seq_event *event);

/* Ends a sequence now with DLLM_ERR_CANCELLED and, if it had started, the canvas so far in item.out (as a step
 * callback's cancellation leaves it); one that ended already stays as it ended. Its slots are free for the next. */
DLLM_API dllm_status dllm_stepper_cancel(dllm_stepper *stepper, int seq_id);

/* Forgets a sequence (cancelled first if it had not ended): its id is no longer valid. */
DLLM_API dllm_status dllm_stepper_remove(dllm_stepper *stepper, int seq_id);

/* ---------------------------------------------------------------------------------------------------
 * Reproducible randomness
 * ------------------------------------------------------------------------------------------------- */

/* dllm's counter-based draw (Philox4x32-10): a uniform double strictly inside (0, 1) that is a pure
 * function of its arguments. Decoding uses streams 1 (Gumbel noise) and 2 (random remasking); stream 3
 * keys the masks of dllm-eval's masked-token NLL; stream 4 DPad's kept suffix; stream 5 DLLM_REMASK_ORIGIN's
 * transfers; stream 6 alg_temp's Gumbel noise; stream 7 SoloQ's rotations; streams >= 16 are free for
 * applications. */
DLLM_API double dllm_rng_uniform(uint64_t seed, uint32_t index, uint32_t position, uint32_t step, uint32_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DLLM_H */
