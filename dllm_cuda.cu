/* dllm_cuda.cu - the implementation of dllm.h: diffusion LLM inference in one translation unit.
 *
 * What it does: loads Hugging Face checkpoints of LLaDA and Dream models (config.json + safetensors,
 * single file or sharded) with strict validation, runs their bidirectional transformer forward, and
 * decodes with LLaDA's semi-autoregressive block schedule. The CPU backend is an fp32 reference written
 * for clarity; it is the twin every GPU kernel is tested against. The GPU backend JIT-compiles its
 * kernels with NVRTC for the GPU it finds, runs GEMMs through cuBLASLt and replays each denoising step
 * as a CUDA graph with the canvas, the step counter and the sampler state on the device.
 * Text goes in and out through the model's Hugging Face byte-level BPE tokenizer and chat template,
 * reimplemented id for id (section 6).
 *
 * The clever part, in one place: every random draw (Gumbel noise, random remasking, Dream's origin
 * transfers and alg_temp noise) comes from a counter-based Philox generator keyed by (seed) and counted by
 * (vocab index, position, step, stream), so a run is reproducible on any backend, in any order of
 * evaluation, and a PyTorch script (tools/make_fixtures.py) reproduces the exact token traces.
 *
 * Table of contents (sections are in data-flow order; grep a [tag] to find a feature):
 *   1. Utilities: errors, logging, numbers, files, the [environment] switches
 *   2. JSON parser
 *   3. safetensors reader
 *   4. Model config (LLaDA, Dream, Fast-dLLM v2, Nemotron-Labs-Diffusion) [block diffusion] [YaRN]
 *   5. Weights: expected tensors, binding, loading
 *   6. Tokenizer (byte-level BPE) and chat templates
 *   7. Philox counter-based RNG
 *   8. CPU thread pool
 *   9. CPU fp32 reference forward, FP8 E4M3 quantiser twins, the block-causal forward over a committed K/V cache
 *      with LaCache's [FACache] on it (the split attention dllm__cpu_bd_attend)
 *   9b. SoloQ numerics (CPU reference): [K-RPBH] rotation (RPBH, Hadamard, dense Haar options), [NVFP4],
 *       [SoloQ-I] INT4, [SoloQ-C] E8P-RVQ codebook / Lloyd-Max and [RTN-W4A4] quantisers, scale-only
 *       [bias correction]; the SoloQ precisions of the CPU forward; [quantised checkpoints] (dllm_model_quantize);
 *       the [W4 GEMM]'s twin
 *   9c. [KV quant] SoloQ's commit-time K/V quantisation of block diffusion (KIVI keys, rotated Lloyd-Max values); its
 *       device twins are dllm__src_kvq in section 13, called from 16.4.3
 *  10. Token choice: argmax / Gumbel-max, confidences (LLaDA's, Dream's), unmasking rules
 *  10b. [tensor parallelism]: the sharding plan (dllm__tp_shard), the CPU reference of the sharded forward
 *       (all-reduces in rank order), the vocab-split token choice; NCCL itself is [dlopen]ed in section 12
 *  11. Backends (CPU reference)
 *  12. GPU: the CUDA libraries loaded at run time [dlopen], errors, device memory
 *  13. GPU kernel sources (NVRTC strings): [host/kernel contract] [kernel table] [#line]; row-wise ops, [FP8 fused
 *      norm+quantise] quantisers and GEMM, sampler, FlashAttention (mma.sync for any head dim up to 256, [FACache],
 *      split-KV, the [block-causal mask]; wgmma on sm_90a for the plain forward of layers >= 1), the sm_90a BF16 GEMM,
 *      [SoloQ] on the device (rotation, quantisers and bias correction bit-exact with 9b, the [fused producers]), the
 *      [W4 GEMM] q4_gemm (4-bit weights dequantised in registers, mma.sync), the [INT8 GEMM]'s unpacker and epilogue,
 *      [varlen] attention (one sequence per grid slice, for a batched forward), block diffusion's [FACache] (dllm__src_bdfa)
 *  14. GPU: NVRTC JIT and the architecture table
 *  15. GPU: cuBLASLt GEMMs (BF16, block-scaled FP8) and dllm's own (BF16 wgmma on sm_90a, timed against cuBLASLt's;
 *      FP8 mma.sync), cuBLASLt's INT8 GEMM for the [INT8 GEMM]; one algorithm per shape and device for every context
 *  16. GPU backend: [weight formats] and the [GEMM entry point]; [shared weights]; [activations]; [forward plan];
 *      the forward with LaCache's [EmbedCache] [RoPECache] [FACache] and [truncation], [FP8], [dual cache] /
 *      [prefix cache], [DPad], [SoloQ] weights (DLLM__W_Q4, quantised on the device or uploaded from a quantised
 *      checkpoint); the sampler; [step graphs]; 16.4.3 [block diffusion] on the GPU (committed-block K/V
 *      cache, block cache, [Llama-4 query scaling], [KV quant], [FACache] (bdfa_attention), the token choice on
 *      the device: bd_forward_choose, [bd graphs]: step forwards replayed as CUDA graphs, DLLM_BD_GRAPHS=1); the GPU [batch] forward (forward_batch) and its K/V-cache
 *      step (forward_batch_kv, kv_scatter_rows), the batched step's token choice on the device
 *      (forward_batch_choose), the batched block-diffusion forward (bd_forward_batch, DLLM_BD_BATCH=1); [debug hooks]
 *  17. SAR decoding; [batch] decoding (dllm_generate_batch); block diffusion (Fast-dLLM v2's generate, either backend: a
 *      state machine, dllm__bd_generation, stepped alone by dllm_generate and in rounds of one bd_forward_batch by
 *      dllm_generate_batch)
 *  18. Public API
 *
 * Build: see README.md (one nvcc command). Private names are prefixed dllm__ and live in an anonymous namespace.
 */
#include "dllm.h"

#include <cublasLt.h>
#include <cuda.h>          // CUtensorMap and its enums only: the encoder comes from the driver at run time
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <nvrtc.h>

#include <dirent.h>
#include <dlfcn.h>

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <cmath>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <tuple>
#include <utility>
#include <vector>

// Everything but the public API has internal linkage: nothing of dllm's leaks into the program that links it. The three
// public handles (dllm_model, dllm_tokenizer, dllm_ctx) are declared in dllm.h, so they live at global scope, between
// the namespace's parts; GCC would warn that they hold members of the namespace's types when this file is #included
// (the tests do), which is what is intended.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wsubobject-linkage"
#endif
// nvcc's front end turns the anonymous namespace into a uniquely named one (for device code), whose inline functions
// would stay global symbols: hidden visibility keeps them out of a shared library's exports too.
#pragma GCC visibility push(hidden)
namespace {

// ---------------------------------------------------------------------------------------------------
// 1. Utilities: errors, logging, numbers, files
// ---------------------------------------------------------------------------------------------------

static thread_local std::string dllm__tls_error;

static std::string dllm__vformat(const char *fmt, va_list ap) {
    char small[512];
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap2);
    va_end(ap2);
    if (n < 0) return std::string("(message formatting failed)");
    if ((size_t)n < sizeof small) return std::string(small, (size_t)n);
    std::string big((size_t)n + 1, '\0');
    vsnprintf(&big[0], big.size(), fmt, ap);
    big.resize((size_t)n);
    return big;
}

static std::string dllm__format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = dllm__vformat(fmt, ap);
    va_end(ap);
    return s;
}

/* Records the detail of a failure for dllm_last_error() and returns the status, so that error paths
 * read `return dllm__fail(DLLM_ERR_SHAPE, "tensor %s ...", ...);`. */
static dllm_status dllm__fail(dllm_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dllm__tls_error = dllm__vformat(fmt, ap);
    va_end(ap);
    return status;
}

#define DLLM__TRY(expr)                          \
    do {                                         \
        dllm_status dllm__st_ = (expr);          \
        if (dllm__st_ != DLLM_OK) return dllm__st_; \
    } while (0)

static void dllm__default_log(dllm_log_level level, const char *text, void *) {
    static const char *names[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "dllm: %s: %s\n", names[level], text);
}

static dllm_log_fn dllm__log_fn = dllm__default_log;
static void *dllm__log_data = nullptr;
static dllm_log_level dllm__log_max = DLLM_LOG_WARN;

static void dllm__vlog(dllm_log_level level, const char *fmt, va_list ap) {
    if (!dllm__log_fn) return;
    std::string s = dllm__vformat(fmt, ap);
    dllm__log_fn(level, s.c_str(), dllm__log_data);
}

static void dllm__log(dllm_log_level level, const char *fmt, ...) {
    if (level > dllm__log_max) return;
    va_list ap;
    va_start(ap, fmt);
    dllm__vlog(level, fmt, ap);
    va_end(ap);
}

/* What a DLLM_*_VERBOSE switch asks for: shown at INFO level even when the log level (WARN by default) would
 * hide INFO; a user who sets the switch wants the lines. */
static void dllm__log_verbose(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dllm__vlog(DLLM_LOG_INFO, fmt, ap);
    va_end(ap);
}

static std::string dllm__shape_str(const std::vector<int64_t> &shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); i++) s += dllm__format(i ? ", %lld" : "%lld", (long long)shape[i]);
    return s + "]";
}

static double dllm__now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

/* The integer inside an enum a C caller passed: C lets any int through, and loading an out-of-range
 * value as the C++ enum type is undefined, so validation reads the bytes. */
template <class E>
static int dllm__enum_int(const E &e) {
    static_assert(sizeof(E) == sizeof(int), "dllm enums are int-sized");
    int v;
    memcpy(&v, &e, sizeof v);
    return v;
}

static inline float dllm__bf16_to_f32(uint16_t bits) {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t dllm__f32_to_bf16(float f) {  // round to nearest even; twin of the PTX cvt.rn
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline float dllm__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {  // subnormal: renormalise
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 1024));
            u = sign | ((uint32_t)(112 - e) << 23) | ((man & 1023) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static std::string dllm__join_path(const std::string &dir, const char *name) {
    if (dir.empty() || dir.back() == '/') return dir + name;
    return dir + "/" + name;
}

static bool dllm__file_exists(const std::string &path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

/* A whole file in memory: mmap'ed read-only, or read into an owned buffer. */
struct dllm__file {
    std::string path;
    const uint8_t *data = nullptr;
    size_t size = 0;
    bool mapped = false;
    std::vector<uint8_t> owned;

    ~dllm__file() {
        if (mapped && data) munmap((void *)data, size);
    }
};

static dllm_status dllm__open_file(const std::string &path, bool use_mmap, std::unique_ptr<dllm__file> &out) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dllm__fail(DLLM_ERR_IO, "cannot open %s: %s", path.c_str(), strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dllm__fail(DLLM_ERR_IO, "%s is not a regular file", path.c_str());
    }
    std::unique_ptr<dllm__file> f(new dllm__file);
    f->path = path;
    f->size = (size_t)st.st_size;
    if (use_mmap && f->size > 0) {
        void *p = mmap(nullptr, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p != MAP_FAILED) {
            f->data = (const uint8_t *)p;
            f->mapped = true;
        }
    }
    if (!f->mapped) {
        f->owned.resize(f->size);
        size_t got = 0;
        while (got < f->size) {
            ssize_t r = read(fd, f->owned.data() + got, f->size - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                close(fd);
                return dllm__fail(DLLM_ERR_IO, "cannot read %s: %s", path.c_str(), r < 0 ? strerror(errno) : "short read");
            }
            got += (size_t)r;
        }
        f->data = f->owned.data();
    }
    close(fd);
    out = std::move(f);
    return DLLM_OK;
}

static dllm_status dllm__read_text(const std::string &path, std::string &out) {
    std::unique_ptr<dllm__file> f;
    DLLM__TRY(dllm__open_file(path, false, f));
    out.assign((const char *)f->data, f->size);
    return DLLM_OK;
}

/* [environment] Every DLLM_* switch, read once (at first use) into one struct; tests that change one call
 * dllm__env_reload(). The switches (all optional; also listed in README.md):
 *   DLLM_CACHE_DIR=DIR       the JIT disk cache (default $XDG_CACHE_HOME/dllm or ~/.cache/dllm); "off" disables it
 *   DLLM_JIT_VERBOSE=1       print each compile, its time and registers
 *   DLLM_JIT_DUMP=DIR        write the PTX and cubin of every compiled module (cuobjdump -sass for SASS)
 *   DLLM_JIT_FAIL_ON_SPILL=1 a kernel that spills registers is a DLLM_ERR_JIT error
 *   DLLM_FA_BR, DLLM_FA_BC, DLLM_FA_MT, DLLM_FA_STAGES  the attention tile up to head dim 128 (query rows per CTA, keys per tile, m16
 *                            tiles per warp, K/V ring); DLLM_FA_KV_CTAS the split-KV target (CTAs per SM);
 *                            DLLM_FA_WG_BC keys per tile of the wgmma attention (64 or 128; 0 turns it off),
 *                            DLLM_FA_WG_STAGES its K/V ring (2 or 3 tiles)
 *   DLLM_GEMM_WG=0           BF16 GEMMs on cuBLASLt alone (gemm_wg not timed)
 *   DLLM_FP8_GEMM=mma|cublaslt  the FP8 GEMM instead of the architecture table's
 *   DLLM_GEMM_AUTOTUNE=0     take cuBLASLt's heuristic pick without timing candidates
 *   DLLM_GEMM_VERBOSE=1      one line per tuned GEMM shape: what won, against the heuristic's first pick
 *   DLLM_GEMM_ROWS=independent  every BF16 GEMM row-independent (dllm__rows), to measure what it costs
 *   DLLM_PDL=0               no programmatic dependent launch
 *   DLLM_NO_GRAPHS=1         denoising steps run eagerly, never as CUDA graphs
 *   DLLM_SOLOQ_ROTATION=none|hadamard|rpbh|mixer|krpbh|haar  the SoloQ precisions' rotation (the ablation; default krpbh)
 *   DLLM_SOLOQ_BIAS_CORRECTION=0|1  SoloQ's scale-only bias correction (the ablation; default 1)
 *   DLLM_SOLOQ_SPLIT=0|1|2   SoloQ producers of few rows over clusters of CTAs: 0 never, 1 (default) all but the norm
 *                            producer, 2 all (dllm__soloq_launch measures them)
 *   DLLM_BD_GRAPHS=1         block diffusion's step forwards replayed as CUDA graphs ([bd graphs]; off by default: a
 *                            generation re-captures each sub-block's graph once a block, which cost more than the
 *                            launches it saves, 1.36 vs 1.32 s at the 7B shape on the H200)
 *   DLLM_BD_BATCH=1          the GPU backend's batched block-diffusion forward (bd_forward_batch: dllm_generate_batch's
 *                            block-diffusion items in one forward); unverified on a device, so off by default: without it
 *                            those items decode one after another
 *   DLLM_BATCH_FP8=1         the GPU backend's batched forwards (forward_batch, forward_batch_kv, bd_forward_batch) under
 *                            FP8 precisions, their E4M3 GEMMs in row-independent launches (gemm_fp8_batch); unverified on
 *                            a device, so off by default: without it FP8 items decode one after another
 *   DLLM_KVQ_TC=1            [KV quant] block diffusion's attention over the quantised cache on tensor cores (kvq_flash:
 *                            the codes decoded once per kv head, mma.sync, split over the keys); unverified on a device,
 *                            so off by default: without it kvq_attention runs (a warp per query row and head) */
struct dllm__env_switches {
    std::string cache_dir, jit_dump, fp8_gemm, soloq_rotation, soloq_bias_correction;
    bool jit_verbose = false, jit_fail_on_spill = false;
    int fa_br = 0, fa_bc = 0, fa_mt = 0, fa_stages = 0, fa_kv_ctas = 0, fa_wg_bc = -1, fa_wg_stages = 0;  // 0 (-1): the table's
    bool gemm_wg = true, gemm_autotune = true, gemm_verbose = false, gemm_rows_independent = false, pdl = true, no_graphs = false;
    int soloq_split = -1;  // -1: dllm__soloq_launch's default
    bool bd_graphs = false, bd_batch = false, batch_fp8 = false, kvq_tc = false;
};

static dllm__env_switches dllm__env_read() {
    auto str = [](const char *name) { const char *v = getenv(name); return std::string(v ? v : ""); };
    auto num = [](const char *name, int dflt) { const char *v = getenv(name); return v && *v ? atoi(v) : dflt; };
    dllm__env_switches e;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    e.cache_dir = str("DLLM_CACHE_DIR");
    if (e.cache_dir == "off") e.cache_dir.clear();
    else if (e.cache_dir.empty()) e.cache_dir = xdg && *xdg ? std::string(xdg) + "/dllm" : home && *home ? std::string(home) + "/.cache/dllm" : "";
    e.jit_dump = str("DLLM_JIT_DUMP");
    e.fp8_gemm = str("DLLM_FP8_GEMM");
    e.jit_verbose = num("DLLM_JIT_VERBOSE", 0) != 0;
    e.jit_fail_on_spill = num("DLLM_JIT_FAIL_ON_SPILL", 0) != 0;
    e.fa_br = num("DLLM_FA_BR", 0), e.fa_bc = num("DLLM_FA_BC", 0), e.fa_mt = num("DLLM_FA_MT", 0), e.fa_stages = num("DLLM_FA_STAGES", 0);
    e.fa_kv_ctas = num("DLLM_FA_KV_CTAS", 0), e.fa_wg_bc = num("DLLM_FA_WG_BC", -1), e.fa_wg_stages = num("DLLM_FA_WG_STAGES", 0);
    e.gemm_wg = num("DLLM_GEMM_WG", 1) != 0;
    e.gemm_autotune = num("DLLM_GEMM_AUTOTUNE", 1) != 0;
    e.gemm_verbose = num("DLLM_GEMM_VERBOSE", 0) != 0;
    e.gemm_rows_independent = str("DLLM_GEMM_ROWS") == "independent";
    e.pdl = num("DLLM_PDL", 1) != 0;
    e.no_graphs = num("DLLM_NO_GRAPHS", 0) != 0;
    e.soloq_rotation = str("DLLM_SOLOQ_ROTATION");
    e.soloq_bias_correction = str("DLLM_SOLOQ_BIAS_CORRECTION");
    e.soloq_split = num("DLLM_SOLOQ_SPLIT", -1);
    e.bd_graphs = num("DLLM_BD_GRAPHS", 0) != 0;
    e.bd_batch = num("DLLM_BD_BATCH", 0) != 0;
    e.batch_fp8 = num("DLLM_BATCH_FP8", 0) != 0;
    e.kvq_tc = num("DLLM_KVQ_TC", 0) != 0;
    return e;
}

static dllm__env_switches &dllm__env_storage() {
    static dllm__env_switches e = dllm__env_read();
    return e;
}
static const dllm__env_switches &dllm__env() { return dllm__env_storage(); }
/* What only the tests and benchmarks call: marked, and the warning that the library never references it (nvcc's front
 * end gives it for the members of classes with internal linkage, [[maybe_unused]] or not) turned off around it. */
#define DLLM__TEST_HOOK [[maybe_unused]]
#if defined(__NVCC__)
#define DLLM__TEST_HOOKS_BEGIN _Pragma("nv_diag_suppress 177")
#define DLLM__TEST_HOOKS_END _Pragma("nv_diag_default 177")
#else
#define DLLM__TEST_HOOKS_BEGIN
#define DLLM__TEST_HOOKS_END
#endif

/* Tests: re-read the switches after changing the environment (not thread-safe against running contexts). */
DLLM__TEST_HOOK static void dllm__env_reload() { dllm__env_storage() = dllm__env_read(); }

// ---------------------------------------------------------------------------------------------------
// 2. JSON parser
//    A small strict DOM parser (RFC 8259): config files, safetensors headers, shard indexes and
//    tokenizer files. Depth is bounded so a malicious file cannot exhaust the stack.
// ---------------------------------------------------------------------------------------------------

struct dllm__json {
    enum kind_t : uint8_t { NUL, BOOL, NUM, STR, ARR, OBJ } kind = NUL;
    bool boolean = false;
    bool is_integer = false;  // the number was written without fraction/exponent and fits int64
    int64_t integer = 0;
    double number = 0;
    std::string str;
    std::vector<std::string> keys;   // OBJ: member names, parallel to items
    std::vector<dllm__json> items;   // ARR: elements; OBJ: member values

    const dllm__json *find(const char *key) const {
        if (kind != OBJ) return nullptr;
        for (size_t i = 0; i < keys.size(); i++)
            if (keys[i] == key) return &items[i];
        return nullptr;
    }
    bool is_null() const { return kind == NUL; }
};

struct dllm__json_parser {
    const char *begin, *p, *end;
    std::string error;
    enum { max_depth = 64 };

    bool fail(const char *what) {
        if (error.empty()) error = dllm__format("%s at byte %lld", what, (long long)(p - begin));
        return false;
    }
    void skip_ws() {
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    }
    bool literal(const char *word) {
        size_t n = strlen(word);
        if ((size_t)(end - p) < n || memcmp(p, word, n) != 0) return fail("invalid literal");
        p += n;
        return true;
    }
    static void put_utf8(std::string &s, uint32_t cp) {
        if (cp < 0x80) {
            s += (char)cp;
        } else if (cp < 0x800) {
            s += (char)(0xC0 | (cp >> 6));
            s += (char)(0x80 | (cp & 63));
        } else if (cp < 0x10000) {
            s += (char)(0xE0 | (cp >> 12));
            s += (char)(0x80 | ((cp >> 6) & 63));
            s += (char)(0x80 | (cp & 63));
        } else {
            s += (char)(0xF0 | (cp >> 18));
            s += (char)(0x80 | ((cp >> 12) & 63));
            s += (char)(0x80 | ((cp >> 6) & 63));
            s += (char)(0x80 | (cp & 63));
        }
    }
    bool hex4(uint32_t &v) {
        if (end - p < 4) return fail("truncated \\u escape");
        v = 0;
        for (int i = 0; i < 4; i++) {
            char c = *p++;
            v <<= 4;
            if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
            else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
            else return fail("bad hex digit in \\u escape");
        }
        return true;
    }
    bool string(std::string &s) {
        p++;  // opening quote
        while (true) {
            const char *run = p;
            while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) p++;
            s.append(run, (size_t)(p - run));
            if (p >= end) return fail("unterminated string");
            char c = *p;
            if (c == '"') { p++; return true; }
            if ((unsigned char)c < 0x20) return fail("control character in string");
            p++;  // backslash
            if (p >= end) return fail("unterminated escape");
            char e = *p++;
            switch (e) {
                case '"': s += '"'; break;
                case '\\': s += '\\'; break;
                case '/': s += '/'; break;
                case 'b': s += '\b'; break;
                case 'f': s += '\f'; break;
                case 'n': s += '\n'; break;
                case 'r': s += '\r'; break;
                case 't': s += '\t'; break;
                case 'u': {
                    uint32_t cp;
                    if (!hex4(cp)) return false;
                    if (cp >= 0xD800 && cp < 0xDC00 && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
                        const char *save = p;
                        p += 2;
                        uint32_t lo;
                        if (!hex4(lo)) return false;
                        if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        else { p = save; cp = 0xFFFD; }
                    } else if (cp >= 0xD800 && cp < 0xE000) {
                        cp = 0xFFFD;  // lone surrogate: not representable in UTF-8
                    }
                    put_utf8(s, cp);
                    break;
                }
                default: return fail("invalid escape");
            }
        }
    }
    bool number(dllm__json &v) {
        const char *start = p;
        bool integral = true;
        if (p < end && *p == '-') p++;
        if (p >= end || !(*p >= '0' && *p <= '9')) return fail("invalid number");
        if (*p == '0') p++;
        else while (p < end && *p >= '0' && *p <= '9') p++;
        if (p < end && *p == '.') {
            integral = false;
            p++;
            if (p >= end || !(*p >= '0' && *p <= '9')) return fail("invalid number");
            while (p < end && *p >= '0' && *p <= '9') p++;
        }
        if (p < end && (*p == 'e' || *p == 'E')) {
            integral = false;
            p++;
            if (p < end && (*p == '+' || *p == '-')) p++;
            if (p >= end || !(*p >= '0' && *p <= '9')) return fail("invalid number");
            while (p < end && *p >= '0' && *p <= '9') p++;
        }
        std::string text(start, (size_t)(p - start));
        v.kind = dllm__json::NUM;
        v.number = strtod(text.c_str(), nullptr);
        if (integral) {
            errno = 0;
            long long ll = strtoll(text.c_str(), nullptr, 10);
            if (errno == 0) { v.is_integer = true; v.integer = ll; }
        }
        return true;
    }
    bool value(dllm__json &v, int depth) {
        if (depth > max_depth) return fail("nesting too deep");
        skip_ws();
        if (p >= end) return fail("unexpected end of input");
        switch (*p) {
            case '{': {
                v.kind = dllm__json::OBJ;
                p++;
                skip_ws();
                if (p < end && *p == '}') { p++; return true; }
                while (true) {
                    skip_ws();
                    if (p >= end || *p != '"') return fail("expected a member name");
                    v.keys.emplace_back();
                    if (!string(v.keys.back())) return false;
                    skip_ws();
                    if (p >= end || *p != ':') return fail("expected ':'");
                    p++;
                    v.items.emplace_back();
                    if (!value(v.items.back(), depth + 1)) return false;
                    skip_ws();
                    if (p < end && *p == ',') { p++; continue; }
                    if (p < end && *p == '}') { p++; return true; }
                    return fail("expected ',' or '}'");
                }
            }
            case '[': {
                v.kind = dllm__json::ARR;
                p++;
                skip_ws();
                if (p < end && *p == ']') { p++; return true; }
                while (true) {
                    v.items.emplace_back();
                    if (!value(v.items.back(), depth + 1)) return false;
                    skip_ws();
                    if (p < end && *p == ',') { p++; continue; }
                    if (p < end && *p == ']') { p++; return true; }
                    return fail("expected ',' or ']'");
                }
            }
            case '"': v.kind = dllm__json::STR; return string(v.str);
            case 't': v.kind = dllm__json::BOOL; v.boolean = true; return literal("true");
            case 'f': v.kind = dllm__json::BOOL; v.boolean = false; return literal("false");
            case 'n': v.kind = dllm__json::NUL; return literal("null");
            default: return number(v);
        }
    }
};

/* Parses text[0..size) into out; on failure returns DLLM_ERR_FORMAT naming `what` (usually a path). */
static dllm_status dllm__json_parse(const char *text, size_t size, const std::string &what, dllm__json &out) {
    dllm__json_parser ps{text, text, text + size, std::string()};
    out = dllm__json();
    if (!ps.value(out, 0)) return dllm__fail(DLLM_ERR_FORMAT, "%s: invalid JSON: %s", what.c_str(), ps.error.c_str());
    ps.skip_ws();
    if (ps.p != ps.end) return dllm__fail(DLLM_ERR_FORMAT, "%s: invalid JSON: trailing data at byte %lld", what.c_str(), (long long)(ps.p - text));
    return DLLM_OK;
}

static dllm_status dllm__json_load(const std::string &path, dllm__json &out) {
    std::string text;
    DLLM__TRY(dllm__read_text(path, text));
    return dllm__json_parse(text.data(), text.size(), path, out);
}

// ---------------------------------------------------------------------------------------------------
// 3. safetensors reader
//    Layout: u64 LE header length N, N bytes of JSON, then the data buffer. Validation follows the
//    reference reader: header bound, JSON object, known dtypes, byte counts that match the shape,
//    offsets contiguous from 0 with no gap or overlap and ending exactly at the end of the file.
// ---------------------------------------------------------------------------------------------------

enum dllm__dtype {
    DLLM__BOOL, DLLM__U8, DLLM__I8, DLLM__F8_E5M2, DLLM__F8_E4M3, DLLM__F8_E8M0, DLLM__F4, DLLM__F6_E2M3,
    DLLM__F6_E3M2, DLLM__I16, DLLM__U16, DLLM__F16, DLLM__BF16, DLLM__I32, DLLM__U32, DLLM__F32,
    DLLM__F64, DLLM__I64, DLLM__U64, DLLM__C64, DLLM__DTYPE_COUNT
};

static const struct {
    const char *name;
    int bits;
} dllm__dtypes[DLLM__DTYPE_COUNT] = {
    {"BOOL", 8},    {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F4", 4},
    {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"I16", 16}, {"U16", 16}, {"F16", 16}, {"BF16", 16}, {"I32", 32},
    {"U32", 32},    {"F32", 32}, {"F64", 64}, {"I64", 64}, {"U64", 64}, {"C64", 64},
};

struct dllm__tensor {
    std::string name;
    dllm__dtype dtype = DLLM__F32;
    std::vector<int64_t> shape;
    int64_t numel = 1;
    const uint8_t *data = nullptr;
    size_t nbytes = 0;
    const std::string *file = nullptr;  // path of the file holding it
};

struct dllm__safetensors {
    std::unique_ptr<dllm__file> file;
    std::vector<dllm__tensor> tensors;
    std::vector<std::vector<uint8_t>> realigned;  // copies of tensors whose mapped bytes were misaligned
    std::vector<std::pair<std::string, std::string>> metadata;  // __metadata__ (string values), in file order
};

static const uint64_t dllm__st_max_header = 100000000;

static dllm_status dllm__st_parse_entry(const std::string &path, const std::string &name, const dllm__json &e,
                                        dllm__tensor &t, uint64_t &begin, uint64_t &end) {
    const char *p = path.c_str(), *n = name.c_str();
    if (e.kind != dllm__json::OBJ) return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: entry is not a JSON object", p, n);
    const dllm__json *dt = e.find("dtype"), *sh = e.find("shape"), *off = e.find("data_offsets");
    if (!dt || dt->kind != dllm__json::STR) return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: missing dtype", p, n);
    int dtype = -1;
    for (int i = 0; i < DLLM__DTYPE_COUNT; i++)
        if (dt->str == dllm__dtypes[i].name) dtype = i;
    if (dtype < 0) return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: unknown dtype \"%s\"", p, n, dt->str.c_str());
    if (!sh || sh->kind != dllm__json::ARR) return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: missing shape", p, n);
    if (!off || off->kind != dllm__json::ARR || off->items.size() != 2)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: data_offsets must be [begin, end]", p, n);
    t.name = name;
    t.dtype = (dllm__dtype)dtype;
    t.numel = 1;
    for (const dllm__json &d : sh->items) {
        if (!d.is_integer || d.integer < 0) return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: shape entries must be non-negative integers", p, n);
        if (d.integer > 0 && t.numel > INT64_MAX / 64 / d.integer) return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: shape overflows", p, n);
        t.shape.push_back(d.integer);
        t.numel *= d.integer;
    }
    for (const dllm__json &o : off->items)
        if (!o.is_integer || o.integer < 0) return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: data_offsets must be non-negative integers", p, n);
    begin = (uint64_t)off->items[0].integer;
    end = (uint64_t)off->items[1].integer;
    if (end < begin) return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: data_offsets end %llu < begin %llu", p, n, (unsigned long long)end, (unsigned long long)begin);
    uint64_t bits = (uint64_t)t.numel * (uint64_t)dllm__dtypes[dtype].bits;
    if (bits % 8 != 0 || end - begin != bits / 8)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: %s %s needs %llu bytes but data_offsets span %llu", p, n,
                          dllm__dtypes[dtype].name, dllm__shape_str(t.shape).c_str(), (unsigned long long)(bits / 8),
                          (unsigned long long)(end - begin));
    t.nbytes = (size_t)(end - begin);
    return DLLM_OK;
}

static dllm_status dllm__st_open(const std::string &path, bool use_mmap, dllm__safetensors &st) {
    DLLM__TRY(dllm__open_file(path, use_mmap, st.file));
    const dllm__file &f = *st.file;
    const char *p = path.c_str();
    if (f.size < 8) return dllm__fail(DLLM_ERR_FORMAT, "%s: file is %zu bytes, too short for the 8-byte header length", p, f.size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f.data[i];
    if (n > dllm__st_max_header) return dllm__fail(DLLM_ERR_FORMAT, "%s: header length %llu exceeds the %llu-byte limit", p, (unsigned long long)n, (unsigned long long)dllm__st_max_header);
    if (n > f.size - 8) return dllm__fail(DLLM_ERR_FORMAT, "%s: header length %llu runs past the end of the %zu-byte file (truncated?)", p, (unsigned long long)n, f.size);
    const char *header = (const char *)f.data + 8;
    if (n == 0 || header[0] != '{') return dllm__fail(DLLM_ERR_FORMAT, "%s: header does not start with '{'", p);
    dllm__json root;
    DLLM__TRY(dllm__json_parse(header, (size_t)n, path + " (safetensors header)", root));
    if (root.kind != dllm__json::OBJ) return dllm__fail(DLLM_ERR_FORMAT, "%s: header is not a JSON object", p);

    std::unordered_set<std::string> seen;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // (begin, end) per tensor
    for (size_t i = 0; i < root.keys.size(); i++) {
        const std::string &name = root.keys[i];
        if (!seen.insert(name).second) return dllm__fail(DLLM_ERR_FORMAT, "%s: duplicate entry \"%s\" in header", p, name.c_str());
        if (name == "__metadata__") {
            const dllm__json &m = root.items[i];
            if (m.kind != dllm__json::OBJ) return dllm__fail(DLLM_ERR_FORMAT, "%s: __metadata__ is not an object", p);
            for (const dllm__json &v : m.items)
                if (v.kind != dllm__json::STR) return dllm__fail(DLLM_ERR_FORMAT, "%s: __metadata__ values must be strings", p);
            for (size_t k = 0; k < m.keys.size(); k++) st.metadata.push_back({m.keys[k], m.items[k].str});
            continue;
        }
        dllm__tensor t;
        uint64_t b = 0, e = 0;
        DLLM__TRY(dllm__st_parse_entry(path, name, root.items[i], t, b, e));
        st.tensors.push_back(std::move(t));
        ranges.push_back({b, e});
    }

    // Offsets must tile the data buffer exactly: sorted by begin, each starts where the last ended.
    std::vector<size_t> order(ranges.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
    uint64_t expected = 0;
    for (size_t k : order) {
        if (ranges[k].first != expected)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s starts at data offset %llu, expected %llu (%s)", p,
                              st.tensors[k].name.c_str(), (unsigned long long)ranges[k].first, (unsigned long long)expected,
                              ranges[k].first < expected ? "overlap" : "gap");
        expected = ranges[k].second;
    }
    uint64_t data_size = f.size - 8 - n;
    if (expected != data_size)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: tensors cover %llu data bytes but the file holds %llu (%s)", p,
                          (unsigned long long)expected, (unsigned long long)data_size, expected > data_size ? "truncated" : "trailing bytes");

    const uint8_t *base = f.data + 8 + n;
    for (size_t i = 0; i < st.tensors.size(); i++) {
        dllm__tensor &t = st.tensors[i];
        t.data = base + ranges[i].first;
        t.file = &st.file->path;
        size_t align = (size_t)std::max(1, dllm__dtypes[t.dtype].bits / 8);
        if (t.nbytes && ((uintptr_t)t.data % align) != 0) {  // some writers do not pad the header
            st.realigned.emplace_back(t.data, t.data + t.nbytes);
            t.data = st.realigned.back().data();
        }
    }
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 4. Model config (LLaDA, Dream)
//    Only what the forward pass needs is kept. A value dllm does not implement is an error naming the
//    key, never a silent approximation; keys dllm does not know are ignored (HF configs carry many).
// ---------------------------------------------------------------------------------------------------

struct dllm__config {
    dllm_family family = DLLM_FAMILY_LLADA;
    int n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
    int n_vocab = 0;      // logit columns = embedding rows (LLaDA: embedding_size)
    int vocab_size = 0;   // config vocab_size
    int max_seq_len = 0;
    float norm_eps = 1e-5f;
    float rope_theta = 10000.0f;
    bool qkv_bias = false;
    bool tied_embeddings = false;
    bool gemma_norm = false;    // LLaDA layer_norm_type gemma_rms: x * (1 + w), folded into the weight
    bool scale_logits = false;  // LLaDA scale_logits: logits / sqrt(d_model)
    bool shift_logits = false;  // Dream: position i is predicted by the logits at i - 1
    int32_t mask_id = -1, eos_id = -1, eot_id = -1, bos_id = -1, pad_id = -1;
    // Block diffusion (Fast-dLLM v2, Nemotron): see dllm__is_block_diffusion and section 17.
    int bd_size = 0;                  // the model's block (bd_size / block_size)
    int bd_mask_block = 0;            // block-causal granularity of a forward that names none: Fast-dLLM v2's
                                      // forward defaults its block_size argument to 32 (not bd_size)
    bool bd_causal_context = false;   // prefill and commit forwards token-causal (Nemotron's reported "causal
                                      // context") instead of block-causal
    int32_t stop_id = -1;             // the token that ends a block-diffusion generation
    // YaRN RoPE (rope_parameters.rope_type "yarn"), transformers' _compute_yarn_parameters
    bool yarn = false;
    double yarn_factor = 1, yarn_beta_fast = 32, yarn_beta_slow = 1, yarn_attention_factor = 1;
    int yarn_orig_max = 0;
    // Llama-4 query scaling (Ministral-3): q *= 1 + beta * log(1 + floor(pos / llama4_orig_max)) after RoPE
    float llama4_beta = 0;
    int llama4_orig_max = 0;
};

static const char *dllm__family_name(dllm_family f) {
    switch (f) {
    case DLLM_FAMILY_LLADA: return "LLaDA";
    case DLLM_FAMILY_DREAM: return "Dream";
    case DLLM_FAMILY_FAST_DLLM_V2: return "Fast-dLLM v2";
    case DLLM_FAMILY_NEMOTRON_DIFFUSION: return "Nemotron-Labs-Diffusion";
    }
    return "?";
}

static bool dllm__is_block_diffusion(const dllm__config &c) {
    return c.family == DLLM_FAMILY_FAST_DLLM_V2 || c.family == DLLM_FAMILY_NEMOTRON_DIFFUSION;
}

/* Typed access to config.json values with errors that name the file and the key. */
struct dllm__cfg_reader {
    const dllm__json &root;
    const std::string &path;

    dllm_status bad(const char *key, const char *want) const {
        return dllm__fail(DLLM_ERR_FORMAT, "%s: \"%s\" must be %s", path.c_str(), key, want);
    }
    dllm_status integer(const char *key, int64_t lo, int64_t hi, int &out, bool required = true, int dflt = 0) const {
        const dllm__json *v = root.find(key);
        if (!v || v->is_null()) {
            if (required) return dllm__fail(DLLM_ERR_FORMAT, "%s: required key \"%s\" is missing", path.c_str(), key);
            out = dflt;
            return DLLM_OK;
        }
        if (v->kind != dllm__json::NUM || !v->is_integer) return bad(key, "an integer");
        if (v->integer < lo || v->integer > hi)
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: \"%s\" = %lld is outside the supported range [%lld, %lld]",
                              path.c_str(), key, (long long)v->integer, (long long)lo, (long long)hi);
        out = (int)v->integer;
        return DLLM_OK;
    }
    /* A token id: an integer, or a list whose first entry is used (generation_config style). */
    dllm_status token(const char *key, int32_t &out) const {
        const dllm__json *v = root.find(key);
        if (!v || v->is_null()) return DLLM_OK;
        if (v->kind == dllm__json::ARR && !v->items.empty()) v = &v->items[0];
        if (v->kind != dllm__json::NUM || !v->is_integer || v->integer < 0 || v->integer > INT32_MAX) return bad(key, "a token id");
        out = (int32_t)v->integer;
        return DLLM_OK;
    }
    dllm_status number(const char *key, double lo, double hi, float &out) const {
        const dllm__json *v = root.find(key);
        if (!v || v->is_null()) return dllm__fail(DLLM_ERR_FORMAT, "%s: required key \"%s\" is missing", path.c_str(), key);
        if (v->kind != dllm__json::NUM) return bad(key, "a number");
        if (!(v->number >= lo && v->number <= hi))
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: \"%s\" = %g is outside the supported range [%g, %g]", path.c_str(), key, v->number, lo, hi);
        out = (float)v->number;
        return DLLM_OK;
    }
    dllm_status boolean(const char *key, bool dflt, bool &out) const {
        const dllm__json *v = root.find(key);
        if (!v || v->is_null()) { out = dflt; return DLLM_OK; }
        if (v->kind != dllm__json::BOOL) return bad(key, "true or false");
        out = v->boolean;
        return DLLM_OK;
    }
    /* A boolean switch whose other value dllm does not implement. */
    dllm_status require_bool(const char *key, bool supported, bool dflt) const {
        bool b = dflt;
        DLLM__TRY(boolean(key, dflt, b));
        if (b != supported)
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: \"%s\" = %s is not supported (only %s)", path.c_str(), key,
                              b ? "true" : "false", supported ? "true" : "false");
        return DLLM_OK;
    }
    /* A string key that must be absent/null or one of the listed values. */
    dllm_status one_of(const char *key, const char *const *allowed, int n_allowed, const char *dflt, std::string &out) const {
        const dllm__json *v = root.find(key);
        if (!v || v->is_null()) { out = dflt ? dflt : ""; return DLLM_OK; }
        if (v->kind != dllm__json::STR) return bad(key, "a string");
        for (int i = 0; i < n_allowed; i++)
            if (v->str == allowed[i]) { out = v->str; return DLLM_OK; }
        std::string list;
        for (int i = 0; i < n_allowed; i++) list += dllm__format(i ? ", %s" : "%s", allowed[i]);
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: \"%s\" = \"%s\" is not supported (supported: %s)", path.c_str(), key, v->str.c_str(), list.c_str());
    }
    dllm_status must_be_null(const char *key) const {
        const dllm__json *v = root.find(key);
        if (v && !v->is_null() && !(v->kind == dllm__json::BOOL && !v->boolean))
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: \"%s\" is set; dllm supports only null here", path.c_str(), key);
        return DLLM_OK;
    }
};

static const int dllm__max_dim = 1 << 16, dllm__max_vocab = 1 << 22, dllm__max_ctx = 1 << 20;

/* OLMo's effective_n_kv_heads: multi_query_attention and n_kv_heads may only both be set if they agree. */
static dllm_status dllm__llada_kv_heads(const dllm__cfg_reader &r, dllm__config &c) {
    const dllm__json *mqa_v = r.root.find("multi_query_attention");
    bool mqa_set = mqa_v && !mqa_v->is_null(), mqa = false;
    DLLM__TRY(r.boolean("multi_query_attention", false, mqa));
    int implied = mqa ? 1 : c.n_head;
    DLLM__TRY(r.integer("n_kv_heads", 1, c.n_head, c.n_head_kv, false, implied));
    if (mqa_set && c.n_head_kv != implied)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: multi_query_attention = %s contradicts n_kv_heads = %d", r.path.c_str(), mqa ? "true" : "false", c.n_head_kv);
    return DLLM_OK;
}

/* Keys both families spell the same way. */
static dllm_status dllm__config_shared(const dllm__cfg_reader &r, dllm__config &c) {
    DLLM__TRY(r.number("rope_theta", 1.0, 1e12, c.rope_theta));
    DLLM__TRY(r.number("rms_norm_eps", 0.0, 1.0, c.norm_eps));
    DLLM__TRY(r.token("mask_token_id", c.mask_id));
    DLLM__TRY(r.token("eos_token_id", c.eos_id));
    DLLM__TRY(r.token("pad_token_id", c.pad_id));
    DLLM__TRY(r.token("bos_token_id", c.bos_id));
    return DLLM_OK;
}

static dllm_status dllm__config_llada(const dllm__cfg_reader &r, dllm__config &c) {
    static const char *block_types[] = {"llama"}, *acts[] = {"silu"}, *norms[] = {"rms", "gemma_rms"};
    std::string s;
    DLLM__TRY(r.one_of("block_type", block_types, 1, nullptr, s));
    if (s.empty()) return dllm__fail(DLLM_ERR_FORMAT, "%s: required key \"block_type\" is missing", r.path.c_str());
    DLLM__TRY(r.one_of("activation_type", acts, 1, nullptr, s));
    if (s.empty()) return dllm__fail(DLLM_ERR_FORMAT, "%s: required key \"activation_type\" is missing", r.path.c_str());
    DLLM__TRY(r.one_of("layer_norm_type", norms, 2, "rms", s));
    c.gemma_norm = s == "gemma_rms";
    DLLM__TRY(r.require_bool("alibi", false, false));
    DLLM__TRY(r.require_bool("rope", true, false));
    DLLM__TRY(r.require_bool("include_bias", false, false));
    DLLM__TRY(r.require_bool("bias_for_layer_norm", false, false));
    DLLM__TRY(r.require_bool("layer_norm_with_affine", true, true));
    DLLM__TRY(r.require_bool("attention_layer_norm", false, false));
    DLLM__TRY(r.require_bool("input_emb_norm", false, false));
    DLLM__TRY(r.must_be_null("clip_qkv"));
    int group = 1;
    DLLM__TRY(r.integer("block_group_size", 1, 1, group, false, 1));
    DLLM__TRY(r.boolean("include_qkv_bias", false, c.qkv_bias));
    DLLM__TRY(r.boolean("weight_tying", false, c.tied_embeddings));
    DLLM__TRY(r.boolean("scale_logits", false, c.scale_logits));
    DLLM__TRY(r.integer("d_model", 1, dllm__max_dim, c.n_embd));
    DLLM__TRY(r.integer("n_heads", 1, 1024, c.n_head));
    DLLM__TRY(r.integer("n_layers", 1, 1024, c.n_layer));
    DLLM__TRY(r.integer("vocab_size", 1, dllm__max_vocab, c.vocab_size));
    DLLM__TRY(r.integer("embedding_size", c.vocab_size, dllm__max_vocab, c.n_vocab, false, c.vocab_size));
    DLLM__TRY(r.integer("max_sequence_length", 1, dllm__max_ctx, c.max_seq_len));
    int ratio = 4;
    DLLM__TRY(r.integer("mlp_ratio", 1, 64, ratio, false, 4));
    DLLM__TRY(r.integer("mlp_hidden_size", 1, 1 << 20, c.n_ff, false, ratio * c.n_embd));
    DLLM__TRY(dllm__llada_kv_heads(r, c));
    DLLM__TRY(dllm__config_shared(r, c));
    if (c.n_embd % c.n_head) return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: d_model %d is not a multiple of n_heads %d", r.path.c_str(), c.n_embd, c.n_head);
    c.head_dim = c.n_embd / c.n_head;
    return DLLM_OK;
}

static dllm_status dllm__config_dream(const dllm__cfg_reader &r, dllm__config &c) {
    static const char *acts[] = {"silu"};
    std::string s;
    DLLM__TRY(r.one_of("hidden_act", acts, 1, "silu", s));
    DLLM__TRY(r.must_be_null("rope_scaling"));
    DLLM__TRY(r.require_bool("use_sliding_window", false, false));
    DLLM__TRY(r.boolean("tie_word_embeddings", false, c.tied_embeddings));
    DLLM__TRY(r.integer("hidden_size", 1, dllm__max_dim, c.n_embd));
    DLLM__TRY(r.integer("num_attention_heads", 1, 1024, c.n_head));
    DLLM__TRY(r.integer("num_hidden_layers", 1, 1024, c.n_layer));
    DLLM__TRY(r.integer("num_key_value_heads", 1, c.n_head, c.n_head_kv, false, c.n_head));
    DLLM__TRY(r.integer("intermediate_size", 1, 1 << 20, c.n_ff));
    DLLM__TRY(r.integer("vocab_size", 1, dllm__max_vocab, c.vocab_size));
    DLLM__TRY(r.integer("max_position_embeddings", 1, dllm__max_ctx, c.max_seq_len));
    DLLM__TRY(dllm__config_shared(r, c));
    if (c.n_embd % c.n_head) return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: hidden_size %d is not a multiple of num_attention_heads %d", r.path.c_str(), c.n_embd, c.n_head);
    c.head_dim = c.n_embd / c.n_head;
    int head_dim = c.head_dim;
    DLLM__TRY(r.integer("head_dim", c.head_dim, c.head_dim, head_dim, false, c.head_dim));
    c.n_vocab = c.vocab_size;
    c.qkv_bias = true;  // Qwen2 always has q/k/v biases
    c.shift_logits = true;
    return DLLM_OK;
}

/* Fast-dLLM v2 (model_type Fast_dLLM_Qwen): the Qwen2 config plus bd_size (block-diffusion.md). The mask and
 * stop ids are not in config.json: dllm__find_block_tokens reads them from the tokenizer files. */
static dllm_status dllm__config_fast_dllm_v2(const dllm__cfg_reader &r, dllm__config &c) {
    DLLM__TRY(dllm__config_dream(r, c));
    DLLM__TRY(r.integer("bd_size", 1, 4096, c.bd_size, false, 32));
    c.bd_mask_block = 32;  // the default block_size argument of the official forward
    c.stop_id = c.eos_id;  // <|im_end|> in the real config; the tokenizer's <|im_end|> wins when present
    return DLLM_OK;
}

/* Nemotron-Labs-Diffusion rope_parameters (transformers 5): "default" or "yarn" with the keys of
 * transformers' _compute_yarn_parameters, plus Ministral-3's llama_4_scaling_beta. */
static dllm_status dllm__config_rope_parameters(const dllm__cfg_reader &top, dllm__config &c) {
    const dllm__json *rp = top.root.find("rope_parameters");
    if (!rp || rp->is_null()) return top.number("rope_theta", 1.0, 1e12, c.rope_theta);
    std::string path = top.path + ": rope_parameters";
    if (rp->kind != dllm__json::OBJ) return top.bad("rope_parameters", "an object");
    dllm__cfg_reader r{*rp, path};
    static const char *types[] = {"default", "yarn"};
    std::string type;
    DLLM__TRY(r.one_of("rope_type", types, 2, "default", type));
    DLLM__TRY(r.number("rope_theta", 1.0, 1e12, c.rope_theta));
    DLLM__TRY(r.require_bool("truncate", true, true));
    const dllm__json *beta = rp->find("llama_4_scaling_beta");
    if (beta && !beta->is_null()) {
        DLLM__TRY(r.number("llama_4_scaling_beta", 0.0, 100.0, c.llama4_beta));
        DLLM__TRY(r.integer("original_max_position_embeddings", 1, dllm__max_ctx * 64, c.llama4_orig_max));
    }
    if (type != "yarn") return DLLM_OK;
    float factor = 1, fast = 32, slow = 1, mscale = 0, mscale_all = 0, attn = 0;
    DLLM__TRY(r.number("factor", 1.0, 1e6, factor));
    DLLM__TRY(r.integer("original_max_position_embeddings", 1, dllm__max_ctx * 64, c.yarn_orig_max));
    auto optional = [&](const char *key, float &v) -> dllm_status {
        const dllm__json *x = rp->find(key);
        return x && !x->is_null() ? r.number(key, 0.0, 1e6, v) : DLLM_OK;
    };
    DLLM__TRY(optional("beta_fast", fast));
    DLLM__TRY(optional("beta_slow", slow));
    DLLM__TRY(optional("mscale", mscale));
    DLLM__TRY(optional("mscale_all_dim", mscale_all));
    DLLM__TRY(optional("attention_factor", attn));
    c.yarn = true;
    c.yarn_factor = factor;
    c.yarn_beta_fast = fast > 0 ? fast : 32;  // transformers: `get("beta_fast") or 32`
    c.yarn_beta_slow = slow > 0 ? slow : 1;
    auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; };
    if (attn > 0) c.yarn_attention_factor = attn;
    else if (mscale > 0 && mscale_all > 0) c.yarn_attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all);
    else c.yarn_attention_factor = get_mscale(factor, 1.0);
    return DLLM_OK;
}

/* Nemotron-Labs-Diffusion (models.md 4): Ministral-3 shape, encoder.* names, YaRN, Llama-4 query scaling.
 * Whether its logits are shifted is not public: config key "shift_logits" (dllm's own) decides, default
 * shifted, as in the other AR-initialised diffusion models (Dream, Fast-dLLM v2) and as its joint AR loss
 * suggests; check it against modeling_nemotron_labs_diffusion.py when a checkpoint is at hand. */
static dllm_status dllm__config_nemotron(const dllm__cfg_reader &r, dllm__config &c) {
    static const char *acts[] = {"silu"};
    std::string s;
    DLLM__TRY(r.one_of("hidden_act", acts, 1, "silu", s));
    DLLM__TRY(r.require_bool("attention_bias", false, false));
    DLLM__TRY(r.require_bool("mlp_bias", false, false));
    DLLM__TRY(r.must_be_null("sliding_window"));
    DLLM__TRY(r.must_be_null("rope_scaling"));
    DLLM__TRY(r.boolean("tie_word_embeddings", false, c.tied_embeddings));
    DLLM__TRY(r.integer("hidden_size", 1, dllm__max_dim, c.n_embd));
    DLLM__TRY(r.integer("num_attention_heads", 1, 1024, c.n_head));
    DLLM__TRY(r.integer("num_hidden_layers", 1, 1024, c.n_layer));
    DLLM__TRY(r.integer("num_key_value_heads", 1, c.n_head, c.n_head_kv, false, c.n_head));
    DLLM__TRY(r.integer("head_dim", 2, 1024, c.head_dim, false, c.n_embd / c.n_head));
    DLLM__TRY(r.integer("intermediate_size", 1, 1 << 20, c.n_ff));
    DLLM__TRY(r.integer("vocab_size", 1, dllm__max_vocab, c.vocab_size));
    DLLM__TRY(r.integer("max_position_embeddings", 1, dllm__max_ctx * 64, c.max_seq_len));
    c.max_seq_len = std::min(c.max_seq_len, dllm__max_ctx);
    DLLM__TRY(r.integer("block_size", 1, 4096, c.bd_size, false, 32));
    DLLM__TRY(r.number("rms_norm_eps", 0.0, 1.0, c.norm_eps));
    DLLM__TRY(r.token("mask_token_id", c.mask_id));
    DLLM__TRY(r.token("eos_token_id", c.eos_id));
    DLLM__TRY(r.token("pad_token_id", c.pad_id));
    DLLM__TRY(r.token("bos_token_id", c.bos_id));
    DLLM__TRY(dllm__config_rope_parameters(r, c));
    DLLM__TRY(r.boolean("shift_logits", true, c.shift_logits));
    c.n_vocab = c.vocab_size;
    c.bd_mask_block = c.bd_size;
    c.bd_causal_context = true;
    c.stop_id = c.eos_id;
    return DLLM_OK;
}

/* Parses a config.json text (path is for messages). */
static dllm_status dllm__config_parse(const dllm__json &root, const std::string &path, dllm__config &c) {
    if (root.kind != dllm__json::OBJ) return dllm__fail(DLLM_ERR_FORMAT, "%s: not a JSON object", path.c_str());
    const dllm__json *mt = root.find("model_type");
    if (!mt || mt->kind != dllm__json::STR) return dllm__fail(DLLM_ERR_FORMAT, "%s: required key \"model_type\" is missing", path.c_str());
    dllm__cfg_reader r{root, path};
    c = dllm__config();
    if (mt->str == "llada") {
        c.family = DLLM_FAMILY_LLADA;
        DLLM__TRY(dllm__config_llada(r, c));
    } else if (mt->str == "Dream" || mt->str == "dream") {
        c.family = DLLM_FAMILY_DREAM;
        DLLM__TRY(dllm__config_dream(r, c));
    } else if (mt->str == "Fast_dLLM_Qwen") {
        c.family = DLLM_FAMILY_FAST_DLLM_V2;
        DLLM__TRY(dllm__config_fast_dllm_v2(r, c));
    } else if (mt->str == "nemotron_labs_diffusion") {
        c.family = DLLM_FAMILY_NEMOTRON_DIFFUSION;
        DLLM__TRY(dllm__config_nemotron(r, c));
    } else {
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not supported (supported: llada, Dream, Fast_dLLM_Qwen, "
                          "nemotron_labs_diffusion)", path.c_str(), mt->str.c_str());
    }
    if (c.n_head % c.n_head_kv)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: %d attention heads are not a multiple of %d key/value heads", path.c_str(), c.n_head, c.n_head_kv);
    if (c.head_dim % 2) return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: head dimension %d is odd; rotary embeddings need an even one", path.c_str(), c.head_dim);
    // Fast-dLLM v2 names its mask in the tokenizer files only: dllm__find_block_tokens checks it there.
    if (c.mask_id < 0 && c.family != DLLM_FAMILY_FAST_DLLM_V2)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: \"mask_token_id\" is missing; a diffusion model needs its [MASK] id", path.c_str());
    if (c.mask_id >= c.n_vocab) return dllm__fail(DLLM_ERR_FORMAT, "%s: mask_token_id %d is outside the vocabulary (%d)", path.c_str(), c.mask_id, c.n_vocab);
    return DLLM_OK;
}

/* tokenizer_config.json's added_tokens_decoder ({"id": {"content": ...}}) of directory dir, if it has one: calls
 * on_token(content, id) for every entry whose key is a non-negative integer id and whose content is a string. */
template <class F>
static dllm_status dllm__scan_added_tokens_decoder(const std::string &dir, F &&on_token) {
    std::string path = dllm__join_path(dir, "tokenizer_config.json");
    if (!dllm__file_exists(path)) return DLLM_OK;
    dllm__json root;
    DLLM__TRY(dllm__json_load(path, root));
    const dllm__json *dec = root.find("added_tokens_decoder");
    if (!dec || dec->kind != dllm__json::OBJ) return DLLM_OK;
    for (size_t i = 0; i < dec->keys.size(); i++) {
        const dllm__json *content = dec->items[i].find("content");
        char *endp = nullptr;
        long id = strtol(dec->keys[i].c_str(), &endp, 10);
        if (content && content->kind == dllm__json::STR && endp && *endp == 0 && id >= 0 && id <= INT32_MAX) on_token(content->str, (int32_t)id);
    }
    return DLLM_OK;
}

/* Finds the end-of-turn token (LLaDA <|eot_id|>, Qwen <|im_end|>) in tokenizer_config.json, if any. */
static dllm_status dllm__find_eot(const std::string &dir, dllm__config &c) {
    return dllm__scan_added_tokens_decoder(dir, [&](const std::string &content, int32_t id) {
        if ((content == "<|eot_id|>" || content == "<|im_end|>") && id < c.n_vocab) c.eot_id = id;
    });
}

/* config.json need not name BOS (LLaDA's does not); generation_config.json usually does. */
static dllm_status dllm__find_bos(const std::string &dir, dllm__config &c) {
    std::string path = dllm__join_path(dir, "generation_config.json");
    if (c.bos_id >= 0 || !dllm__file_exists(path)) return DLLM_OK;
    dllm__json root;
    DLLM__TRY(dllm__json_load(path, root));
    DLLM__TRY((dllm__cfg_reader{root, path}.token("bos_token_id", c.bos_id)));
    if (c.bos_id >= c.n_vocab) return dllm__fail(DLLM_ERR_FORMAT, "%s: bos_token_id %d is outside the vocabulary (%d)", path.c_str(), c.bos_id, c.n_vocab);
    return DLLM_OK;
}

/* Where the path is not a directory at all, say so: "no config.json in this directory" misleads. */
static dllm_status dllm__check_model_dir(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) return dllm__fail(DLLM_ERR_IO, "%s: %s (the model directory)", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return dllm__fail(DLLM_ERR_IO, "%s: not a directory; pass the model's directory (config.json, safetensors)", dir);
    return DLLM_OK;
}

/* The id of an added token spelled `content`: added_tokens.json ({"token": id}), else tokenizer_config.json's
 * added_tokens_decoder ({"id": {"content": ...}}); -1 if neither names it. */
static dllm_status dllm__find_added_token(const std::string &dir, const char *content, int32_t &id) {
    id = -1;
    std::string added = dllm__join_path(dir, "added_tokens.json");
    if (dllm__file_exists(added)) {
        dllm__json root;
        DLLM__TRY(dllm__json_load(added, root));
        const dllm__json *v = root.find(content);
        if (v && v->kind == dllm__json::NUM && v->is_integer && v->integer >= 0 && v->integer <= INT32_MAX) {
            id = (int32_t)v->integer;
            return DLLM_OK;
        }
    }
    return dllm__scan_added_tokens_decoder(dir, [&](const std::string &name, int32_t v) {
        if (name == content) id = v;
    });
}

/* Fast-dLLM v2's mask (|<MASK>|) and stop (<|im_end|>) ids live in its tokenizer files, not in config.json
 * (block-diffusion.md). A model without them is an error naming what to add. */
static dllm_status dllm__find_block_tokens(const std::string &dir, dllm__config &c) {
    if (c.family != DLLM_FAMILY_FAST_DLLM_V2) return DLLM_OK;
    int32_t mask = -1, stop = -1;
    DLLM__TRY(dllm__find_added_token(dir, "|<MASK>|", mask));
    DLLM__TRY(dllm__find_added_token(dir, "<|im_end|>", stop));
    if (mask >= 0 && c.mask_id < 0) c.mask_id = mask;
    if (stop >= 0) c.stop_id = stop;
    if (c.mask_id < 0)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: Fast-dLLM v2 takes its mask id from the tokenizer's added token |<MASK>| (added_tokens.json or "
                          "tokenizer_config.json), and neither names it: add the tokenizer files, or \"mask_token_id\" to config.json", dir.c_str());
    if (c.mask_id >= c.n_vocab || c.stop_id >= c.n_vocab)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: mask id %d or stop id %d is outside the vocabulary (%d)", dir.c_str(), c.mask_id, c.stop_id, c.n_vocab);
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 5. Weights: expected tensors, binding, loading
// ---------------------------------------------------------------------------------------------------

enum dllm__wkind {
    DLLM__W_EMBED, DLLM__W_ATTN_NORM, DLLM__W_Q, DLLM__W_K, DLLM__W_V, DLLM__W_BQ, DLLM__W_BK, DLLM__W_BV,
    DLLM__W_O, DLLM__W_FFN_NORM, DLLM__W_GATE, DLLM__W_UP, DLLM__W_DOWN, DLLM__W_FINAL_NORM, DLLM__W_HEAD
};

struct dllm__wspec {
    std::string name;
    std::vector<int64_t> shape;
    int layer;  // -1 for model-level tensors
    dllm__wkind kind;
};

/* Every tensor the config demands, with its HF name and PyTorch shape [out, in]. */
static std::vector<dllm__wspec> dllm__expected_weights(const dllm__config &c) {
    const int64_t d = c.n_embd, q = (int64_t)c.n_head * c.head_dim, kv = (int64_t)c.n_head_kv * c.head_dim, ff = c.n_ff;
    const bool llada = c.family == DLLM_FAMILY_LLADA;
    const std::string qwen = c.family == DLLM_FAMILY_NEMOTRON_DIFFUSION ? "encoder." : "model.";  // Nemotron: encoder.*
    std::vector<dllm__wspec> w;
    w.push_back({llada ? "model.transformer.wte.weight" : qwen + "embed_tokens.weight", {c.n_vocab, d}, -1, DLLM__W_EMBED});
    for (int l = 0; l < c.n_layer; l++) {
        std::string p = llada ? dllm__format("model.transformer.blocks.%d.", l) : qwen + dllm__format("layers.%d.", l);
        std::string attn = llada ? p : p + "self_attn.", mlp = llada ? p : p + "mlp.";
        w.push_back({p + (llada ? "attn_norm.weight" : "input_layernorm.weight"), {d}, l, DLLM__W_ATTN_NORM});
        w.push_back({attn + "q_proj.weight", {q, d}, l, DLLM__W_Q});
        w.push_back({attn + "k_proj.weight", {kv, d}, l, DLLM__W_K});
        w.push_back({attn + "v_proj.weight", {kv, d}, l, DLLM__W_V});
        if (c.qkv_bias) {
            w.push_back({attn + "q_proj.bias", {q}, l, DLLM__W_BQ});
            w.push_back({attn + "k_proj.bias", {kv}, l, DLLM__W_BK});
            w.push_back({attn + "v_proj.bias", {kv}, l, DLLM__W_BV});
        }
        w.push_back({attn + (llada ? "attn_out.weight" : "o_proj.weight"), {d, q}, l, DLLM__W_O});
        w.push_back({p + (llada ? "ff_norm.weight" : "post_attention_layernorm.weight"), {d}, l, DLLM__W_FFN_NORM});
        w.push_back({mlp + (llada ? "ff_proj.weight" : "gate_proj.weight"), {ff, d}, l, DLLM__W_GATE});
        w.push_back({mlp + "up_proj.weight", {ff, d}, l, DLLM__W_UP});
        w.push_back({mlp + (llada ? "ff_out.weight" : "down_proj.weight"), {d, ff}, l, DLLM__W_DOWN});
    }
    w.push_back({llada ? "model.transformer.ln_f.weight" : qwen + "norm.weight", {d}, -1, DLLM__W_FINAL_NORM});
    const char *head = llada ? "model.transformer.ff_out.weight" : c.family == DLLM_FAMILY_NEMOTRON_DIFFUSION ? "diffusion_head.weight" : "lm_head.weight";
    if (!c.tied_embeddings) w.push_back({head, {c.n_vocab, d}, -1, DLLM__W_HEAD});
    return w;
}

struct dllm__layer_weights {
    const dllm__tensor *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
    const dllm__tensor *gate = nullptr, *up = nullptr, *down = nullptr;
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv;  // small vectors, kept in fp32
};

struct dllm__gpu_weights;
struct dllm__soloq_store;
}  // namespace
struct dllm_model {
    dllm__config cfg;
    std::string dir;
    std::vector<std::unique_ptr<dllm__safetensors>> files;
    std::unordered_map<std::string, const dllm__tensor *> by_name;
    const dllm__tensor *embed = nullptr, *head = nullptr;
    std::vector<float> final_norm;
    std::vector<dllm__layer_weights> layers;
    int64_t n_params = 0;
    // [quantised checkpoints] a directory written by dllm_model_quantize: the stored SoloQ linears (section 9b); the
    // BF16 tensors they replace are absent (their dllm__layer_weights pointers, and head if the head is stored, are null)
    std::shared_ptr<const dllm__soloq_store> soloq;
    bool random_weights = false;  // dllm_model_load_random: weights are generated on the GPU
    uint64_t random_seed = 0;
    // [shared weights] the device copies (section 16.2): built by the first context on a device and weight format, shared by the rest
    mutable std::mutex gpu_weights_mutex;
    mutable std::vector<std::weak_ptr<dllm__gpu_weights>> gpu_weights;
};
namespace {

/* Element i of a float tensor (BF16/F16/F32), read bytewise: mapped data need not be aligned. */
static inline float dllm__tensor_at(const dllm__tensor &t, int64_t i) {
    switch (t.dtype) {
        case DLLM__BF16: { uint16_t b; memcpy(&b, t.data + 2 * i, 2); return dllm__bf16_to_f32(b); }
        case DLLM__F16: { uint16_t b; memcpy(&b, t.data + 2 * i, 2); return dllm__f16_to_f32(b); }
        default: { float f; memcpy(&f, t.data + 4 * i, 4); return f; }
    }
}

static void dllm__tensor_row(const dllm__tensor &t, int64_t row, int64_t width, float *dst) {
    for (int64_t k = 0; k < width; k++) dst[k] = dllm__tensor_at(t, row * width + k);
}

static std::vector<float> dllm__tensor_f32(const dllm__tensor &t) {
    std::vector<float> v((size_t)t.numel);
    dllm__tensor_row(t, 0, t.numel, v.data());
    return v;
}

static dllm_status dllm__check_tensor(const dllm__wspec &spec, const dllm__tensor *t) {
    if (!t) return dllm__fail(DLLM_ERR_SHAPE, "missing tensor %s (expected shape %s)", spec.name.c_str(), dllm__shape_str(spec.shape).c_str());
    if (t->shape != spec.shape)
        return dllm__fail(DLLM_ERR_SHAPE, "%s: tensor %s: expected shape %s, found %s", t->file->c_str(), spec.name.c_str(),
                          dllm__shape_str(spec.shape).c_str(), dllm__shape_str(t->shape).c_str());
    if (t->dtype != DLLM__BF16 && t->dtype != DLLM__F16 && t->dtype != DLLM__F32)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s; dllm reads BF16, F16 and F32", t->file->c_str(),
                          spec.name.c_str(), dllm__dtypes[t->dtype].name);
    return DLLM_OK;
}

static void dllm__bind_tensor(dllm_model &m, const dllm__wspec &spec, const dllm__tensor *t) {
    dllm__layer_weights *L = spec.layer >= 0 ? &m.layers[(size_t)spec.layer] : nullptr;
    switch (spec.kind) {
        case DLLM__W_EMBED: m.embed = t; break;
        case DLLM__W_HEAD: m.head = t; break;
        case DLLM__W_FINAL_NORM: m.final_norm = dllm__tensor_f32(*t); break;
        case DLLM__W_ATTN_NORM: L->attn_norm = dllm__tensor_f32(*t); break;
        case DLLM__W_FFN_NORM: L->ffn_norm = dllm__tensor_f32(*t); break;
        case DLLM__W_BQ: L->bq = dllm__tensor_f32(*t); break;
        case DLLM__W_BK: L->bk = dllm__tensor_f32(*t); break;
        case DLLM__W_BV: L->bv = dllm__tensor_f32(*t); break;
        case DLLM__W_Q: L->wq = t; break;
        case DLLM__W_K: L->wk = t; break;
        case DLLM__W_V: L->wv = t; break;
        case DLLM__W_O: L->wo = t; break;
        case DLLM__W_GATE: L->gate = t; break;
        case DLLM__W_UP: L->up = t; break;
        case DLLM__W_DOWN: L->down = t; break;
    }
}

/* A tensor by its expected name; Nemotron's head may also be stored as lm_head.weight (models.md 4.3). */
static const dllm__tensor *dllm__find_weight(const dllm_model &m, const dllm__wspec &spec, std::string &found_name) {
    found_name = spec.name;
    auto it = m.by_name.find(spec.name);
    if (it == m.by_name.end() && spec.name == "diffusion_head.weight") it = m.by_name.find(found_name = "lm_head.weight");
    return it == m.by_name.end() ? nullptr : it->second;
}

/* gemma_rms norms compute x * (1 + w): folding the 1 into the weights keeps one norm everywhere. */
static void dllm__fold_gemma_norms(dllm_model &m) {
    auto fold = [](std::vector<float> &w) { for (float &x : w) x += 1.0f; };
    fold(m.final_norm);
    for (dllm__layer_weights &L : m.layers) { fold(L.attn_norm); fold(L.ffn_norm); }
}

// [quantised checkpoints] (section 9b): the stored linears are read before the BF16 tensors are bound.
static dllm_status dllm__soloq_load_store(dllm_model &m);
static bool dllm__soloq_replaces(const dllm_model &m, dllm__wkind kind);
static bool dllm__soloq_tensor_name(const std::string &name);

/* Resolves every expected tensor; missing, misshapen or wrongly typed tensors are errors. */
static dllm_status dllm__bind_weights(dllm_model &m) {
    const dllm__config &c = m.cfg;
    m.layers.assign((size_t)c.n_layer, dllm__layer_weights());
    std::vector<dllm__wspec> specs = dllm__expected_weights(c);
    std::unordered_set<std::string> used;
    for (const dllm__wspec &spec : specs) {
        if (dllm__soloq_replaces(m, spec.kind)) continue;  // counted by dllm__soloq_load_store
        std::string name;
        const dllm__tensor *t = dllm__find_weight(m, spec, name);
        DLLM__TRY(dllm__check_tensor(spec, t));
        dllm__bind_tensor(m, spec, t);
        used.insert(name);
        m.n_params += t->numel;
    }
    if (c.tied_embeddings) m.head = m.embed;
    if (c.gemma_norm) dllm__fold_gemma_norms(m);
    std::vector<std::string> extra;
    for (auto &kv : m.by_name)
        if (!used.count(kv.first) && !(m.soloq && dllm__soloq_tensor_name(kv.first))) extra.push_back(kv.first);
    if (!extra.empty()) {
        std::sort(extra.begin(), extra.end());
        dllm__log(DLLM_LOG_WARN, "%zu tensor(s) in the checkpoint are not used by the model, e.g. %s", extra.size(), extra[0].c_str());
    }
    return DLLM_OK;
}

static dllm_status dllm__add_file_tensors(dllm_model &m, std::unique_ptr<dllm__safetensors> st) {
    for (const dllm__tensor &t : st->tensors) {
        if (!m.by_name.emplace(t.name, &t).second)
            return dllm__fail(DLLM_ERR_FORMAT, "tensor %s appears in %s and in %s", t.name.c_str(), m.by_name[t.name]->file->c_str(), t.file->c_str());
    }
    m.files.push_back(std::move(st));
    return DLLM_OK;
}

/* Shard names come from an untrusted index: a plain file name in the model directory only. */
static bool dllm__safe_shard_name(const std::string &s) {
    return !s.empty() && s.find('/') == std::string::npos && s.find('\\') == std::string::npos && s != "." && s != "..";
}

/* model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor: shard file}}. */
static dllm_status dllm__parse_index(const dllm__json &root, const std::string &path, std::vector<std::pair<std::string, std::string>> &map) {
    const dllm__json *wm = root.find("weight_map");
    if (root.kind != dllm__json::OBJ || !wm || wm->kind != dllm__json::OBJ)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: missing \"weight_map\" object", path.c_str());
    std::unordered_set<std::string> seen;
    for (size_t i = 0; i < wm->keys.size(); i++) {
        const dllm__json &f = wm->items[i];
        if (f.kind != dllm__json::STR || !dllm__safe_shard_name(f.str))
            return dllm__fail(DLLM_ERR_FORMAT, "%s: weight_map[\"%s\"] must be a file name in the model directory", path.c_str(), wm->keys[i].c_str());
        if (!seen.insert(wm->keys[i]).second) return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s is listed twice", path.c_str(), wm->keys[i].c_str());
        map.push_back({wm->keys[i], f.str});
    }
    return DLLM_OK;
}

static dllm_status dllm__load_sharded(dllm_model &m, const std::string &index_path, bool use_mmap) {
    dllm__json root;
    DLLM__TRY(dllm__json_load(index_path, root));
    std::vector<std::pair<std::string, std::string>> map;
    DLLM__TRY(dllm__parse_index(root, index_path, map));
    std::vector<std::string> shards;
    for (auto &e : map)
        if (std::find(shards.begin(), shards.end(), e.second) == shards.end()) shards.push_back(e.second);
    for (const std::string &shard : shards) {
        std::unique_ptr<dllm__safetensors> st(new dllm__safetensors);
        DLLM__TRY(dllm__st_open(dllm__join_path(m.dir, shard.c_str()), use_mmap, *st));
        DLLM__TRY(dllm__add_file_tensors(m, std::move(st)));
    }
    for (auto &e : map) {
        auto it = m.by_name.find(e.first);
        if (it == m.by_name.end() || it->second->file->size() < e.second.size() ||
            it->second->file->compare(it->second->file->size() - e.second.size(), e.second.size(), e.second) != 0)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s is mapped to %s but that shard does not hold it", index_path.c_str(), e.first.c_str(), e.second.c_str());
    }
    return DLLM_OK;
}

static dllm_status dllm__load_model(const char *dir, const dllm_model_params &params, std::unique_ptr<dllm_model> &out) {
    std::unique_ptr<dllm_model> m(new dllm_model);
    m->dir = dir;
    std::string cfg_path = dllm__join_path(m->dir, "config.json");
    DLLM__TRY(dllm__check_model_dir(dir));
    if (!dllm__file_exists(cfg_path)) return dllm__fail(DLLM_ERR_IO, "%s: no config.json in this directory", dir);
    dllm__json cfg_json;
    DLLM__TRY(dllm__json_load(cfg_path, cfg_json));
    DLLM__TRY(dllm__config_parse(cfg_json, cfg_path, m->cfg));
    DLLM__TRY(dllm__find_eot(m->dir, m->cfg));
    DLLM__TRY(dllm__find_bos(m->dir, m->cfg));
    DLLM__TRY(dllm__find_block_tokens(m->dir, m->cfg));
    std::string single = dllm__join_path(m->dir, "model.safetensors"), index = single + ".index.json";
    if (dllm__file_exists(index)) {
        DLLM__TRY(dllm__load_sharded(*m, index, params.use_mmap != 0));
    } else if (dllm__file_exists(single)) {
        std::unique_ptr<dllm__safetensors> st(new dllm__safetensors);
        DLLM__TRY(dllm__st_open(single, params.use_mmap != 0, *st));
        DLLM__TRY(dllm__add_file_tensors(*m, std::move(st)));
    } else {
        return dllm__fail(DLLM_ERR_IO, "%s: neither model.safetensors nor model.safetensors.index.json exists", dir);
    }
    DLLM__TRY(dllm__soloq_load_store(*m));
    DLLM__TRY(dllm__bind_weights(*m));
    out = std::move(m);
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 6. Tokenizer (byte-level BPE) and chat templates
//    Hugging Face's byte-level BPE pipeline, stage by stage: added tokens are cut out of the raw text
//    first (leftmost-longest); the gaps are NFC-normalised where the file asks for it, split by the
//    model's pre-tokenizer regex (a hand-written scanner that follows Oniguruma's semantics for the
//    known patterns), mapped through GPT-2's byte-to-unicode table and merged by BPE rank. Chat
//    templates are hard-coded renderers of the known Jinja templates. Invalid UTF-8 in the input is
//    replaced by U+FFFD first, as Python's bytes.decode(errors="replace") does before HF sees the text.
// ---------------------------------------------------------------------------------------------------

// BEGIN GENERATED: unicode tables
// Written by tools/gen_unicode_tables.py from the Unicode Character Database 16.0.0.
// Ranges are inclusive [lo, hi] pairs sorted by lo.
static const uint32_t dllm__uc_letter[] = {
    65, 90, 97, 122, 170, 170, 181, 181, 186, 186, 192, 214, 216, 246, 248, 705, 710, 721, 736, 740, 748, 748, 750, 750,
    880, 884, 886, 887, 890, 893, 895, 895, 902, 902, 904, 906, 908, 908, 910, 929, 931, 1013, 1015, 1153, 1162, 1327, 1329, 1366,
    1369, 1369, 1376, 1416, 1488, 1514, 1519, 1522, 1568, 1610, 1646, 1647, 1649, 1747, 1749, 1749, 1765, 1766, 1774, 1775, 1786, 1788, 1791, 1791,
    1808, 1808, 1810, 1839, 1869, 1957, 1969, 1969, 1994, 2026, 2036, 2037, 2042, 2042, 2048, 2069, 2074, 2074, 2084, 2084, 2088, 2088, 2112, 2136,
    2144, 2154, 2160, 2183, 2185, 2190, 2208, 2249, 2308, 2361, 2365, 2365, 2384, 2384, 2392, 2401, 2417, 2432, 2437, 2444, 2447, 2448, 2451, 2472,
    2474, 2480, 2482, 2482, 2486, 2489, 2493, 2493, 2510, 2510, 2524, 2525, 2527, 2529, 2544, 2545, 2556, 2556, 2565, 2570, 2575, 2576, 2579, 2600,
    2602, 2608, 2610, 2611, 2613, 2614, 2616, 2617, 2649, 2652, 2654, 2654, 2674, 2676, 2693, 2701, 2703, 2705, 2707, 2728, 2730, 2736, 2738, 2739,
    2741, 2745, 2749, 2749, 2768, 2768, 2784, 2785, 2809, 2809, 2821, 2828, 2831, 2832, 2835, 2856, 2858, 2864, 2866, 2867, 2869, 2873, 2877, 2877,
    2908, 2909, 2911, 2913, 2929, 2929, 2947, 2947, 2949, 2954, 2958, 2960, 2962, 2965, 2969, 2970, 2972, 2972, 2974, 2975, 2979, 2980, 2984, 2986,
    2990, 3001, 3024, 3024, 3077, 3084, 3086, 3088, 3090, 3112, 3114, 3129, 3133, 3133, 3160, 3162, 3165, 3165, 3168, 3169, 3200, 3200, 3205, 3212,
    3214, 3216, 3218, 3240, 3242, 3251, 3253, 3257, 3261, 3261, 3293, 3294, 3296, 3297, 3313, 3314, 3332, 3340, 3342, 3344, 3346, 3386, 3389, 3389,
    3406, 3406, 3412, 3414, 3423, 3425, 3450, 3455, 3461, 3478, 3482, 3505, 3507, 3515, 3517, 3517, 3520, 3526, 3585, 3632, 3634, 3635, 3648, 3654,
    3713, 3714, 3716, 3716, 3718, 3722, 3724, 3747, 3749, 3749, 3751, 3760, 3762, 3763, 3773, 3773, 3776, 3780, 3782, 3782, 3804, 3807, 3840, 3840,
    3904, 3911, 3913, 3948, 3976, 3980, 4096, 4138, 4159, 4159, 4176, 4181, 4186, 4189, 4193, 4193, 4197, 4198, 4206, 4208, 4213, 4225, 4238, 4238,
    4256, 4293, 4295, 4295, 4301, 4301, 4304, 4346, 4348, 4680, 4682, 4685, 4688, 4694, 4696, 4696, 4698, 4701, 4704, 4744, 4746, 4749, 4752, 4784,
    4786, 4789, 4792, 4798, 4800, 4800, 4802, 4805, 4808, 4822, 4824, 4880, 4882, 4885, 4888, 4954, 4992, 5007, 5024, 5109, 5112, 5117, 5121, 5740,
    5743, 5759, 5761, 5786, 5792, 5866, 5873, 5880, 5888, 5905, 5919, 5937, 5952, 5969, 5984, 5996, 5998, 6000, 6016, 6067, 6103, 6103, 6108, 6108,
    6176, 6264, 6272, 6276, 6279, 6312, 6314, 6314, 6320, 6389, 6400, 6430, 6480, 6509, 6512, 6516, 6528, 6571, 6576, 6601, 6656, 6678, 6688, 6740,
    6823, 6823, 6917, 6963, 6981, 6988, 7043, 7072, 7086, 7087, 7098, 7141, 7168, 7203, 7245, 7247, 7258, 7293, 7296, 7306, 7312, 7354, 7357, 7359,
    7401, 7404, 7406, 7411, 7413, 7414, 7418, 7418, 7424, 7615, 7680, 7957, 7960, 7965, 7968, 8005, 8008, 8013, 8016, 8023, 8025, 8025, 8027, 8027,
    8029, 8029, 8031, 8061, 8064, 8116, 8118, 8124, 8126, 8126, 8130, 8132, 8134, 8140, 8144, 8147, 8150, 8155, 8160, 8172, 8178, 8180, 8182, 8188,
    8305, 8305, 8319, 8319, 8336, 8348, 8450, 8450, 8455, 8455, 8458, 8467, 8469, 8469, 8473, 8477, 8484, 8484, 8486, 8486, 8488, 8488, 8490, 8493,
    8495, 8505, 8508, 8511, 8517, 8521, 8526, 8526, 8579, 8580, 11264, 11492, 11499, 11502, 11506, 11507, 11520, 11557, 11559, 11559, 11565, 11565, 11568, 11623,
    11631, 11631, 11648, 11670, 11680, 11686, 11688, 11694, 11696, 11702, 11704, 11710, 11712, 11718, 11720, 11726, 11728, 11734, 11736, 11742, 11823, 11823, 12293, 12294,
    12337, 12341, 12347, 12348, 12353, 12438, 12445, 12447, 12449, 12538, 12540, 12543, 12549, 12591, 12593, 12686, 12704, 12735, 12784, 12799, 13312, 19903, 19968, 42124,
    42192, 42237, 42240, 42508, 42512, 42527, 42538, 42539, 42560, 42606, 42623, 42653, 42656, 42725, 42775, 42783, 42786, 42888, 42891, 42957, 42960, 42961, 42963, 42963,
    42965, 42972, 42994, 43009, 43011, 43013, 43015, 43018, 43020, 43042, 43072, 43123, 43138, 43187, 43250, 43255, 43259, 43259, 43261, 43262, 43274, 43301, 43312, 43334,
    43360, 43388, 43396, 43442, 43471, 43471, 43488, 43492, 43494, 43503, 43514, 43518, 43520, 43560, 43584, 43586, 43588, 43595, 43616, 43638, 43642, 43642, 43646, 43695,
    43697, 43697, 43701, 43702, 43705, 43709, 43712, 43712, 43714, 43714, 43739, 43741, 43744, 43754, 43762, 43764, 43777, 43782, 43785, 43790, 43793, 43798, 43808, 43814,
    43816, 43822, 43824, 43866, 43868, 43881, 43888, 44002, 44032, 55203, 55216, 55238, 55243, 55291, 63744, 64109, 64112, 64217, 64256, 64262, 64275, 64279, 64285, 64285,
    64287, 64296, 64298, 64310, 64312, 64316, 64318, 64318, 64320, 64321, 64323, 64324, 64326, 64433, 64467, 64829, 64848, 64911, 64914, 64967, 65008, 65019, 65136, 65140,
    65142, 65276, 65313, 65338, 65345, 65370, 65382, 65470, 65474, 65479, 65482, 65487, 65490, 65495, 65498, 65500, 65536, 65547, 65549, 65574, 65576, 65594, 65596, 65597,
    65599, 65613, 65616, 65629, 65664, 65786, 66176, 66204, 66208, 66256, 66304, 66335, 66349, 66368, 66370, 66377, 66384, 66421, 66432, 66461, 66464, 66499, 66504, 66511,
    66560, 66717, 66736, 66771, 66776, 66811, 66816, 66855, 66864, 66915, 66928, 66938, 66940, 66954, 66956, 66962, 66964, 66965, 66967, 66977, 66979, 66993, 66995, 67001,
    67003, 67004, 67008, 67059, 67072, 67382, 67392, 67413, 67424, 67431, 67456, 67461, 67463, 67504, 67506, 67514, 67584, 67589, 67592, 67592, 67594, 67637, 67639, 67640,
    67644, 67644, 67647, 67669, 67680, 67702, 67712, 67742, 67808, 67826, 67828, 67829, 67840, 67861, 67872, 67897, 67968, 68023, 68030, 68031, 68096, 68096, 68112, 68115,
    68117, 68119, 68121, 68149, 68192, 68220, 68224, 68252, 68288, 68295, 68297, 68324, 68352, 68405, 68416, 68437, 68448, 68466, 68480, 68497, 68608, 68680, 68736, 68786,
    68800, 68850, 68864, 68899, 68938, 68965, 68975, 68997, 69248, 69289, 69296, 69297, 69314, 69316, 69376, 69404, 69415, 69415, 69424, 69445, 69488, 69505, 69552, 69572,
    69600, 69622, 69635, 69687, 69745, 69746, 69749, 69749, 69763, 69807, 69840, 69864, 69891, 69926, 69956, 69956, 69959, 69959, 69968, 70002, 70006, 70006, 70019, 70066,
    70081, 70084, 70106, 70106, 70108, 70108, 70144, 70161, 70163, 70187, 70207, 70208, 70272, 70278, 70280, 70280, 70282, 70285, 70287, 70301, 70303, 70312, 70320, 70366,
    70405, 70412, 70415, 70416, 70419, 70440, 70442, 70448, 70450, 70451, 70453, 70457, 70461, 70461, 70480, 70480, 70493, 70497, 70528, 70537, 70539, 70539, 70542, 70542,
    70544, 70581, 70583, 70583, 70609, 70609, 70611, 70611, 70656, 70708, 70727, 70730, 70751, 70753, 70784, 70831, 70852, 70853, 70855, 70855, 71040, 71086, 71128, 71131,
    71168, 71215, 71236, 71236, 71296, 71338, 71352, 71352, 71424, 71450, 71488, 71494, 71680, 71723, 71840, 71903, 71935, 71942, 71945, 71945, 71948, 71955, 71957, 71958,
    71960, 71983, 71999, 71999, 72001, 72001, 72096, 72103, 72106, 72144, 72161, 72161, 72163, 72163, 72192, 72192, 72203, 72242, 72250, 72250, 72272, 72272, 72284, 72329,
    72349, 72349, 72368, 72440, 72640, 72672, 72704, 72712, 72714, 72750, 72768, 72768, 72818, 72847, 72960, 72966, 72968, 72969, 72971, 73008, 73030, 73030, 73056, 73061,
    73063, 73064, 73066, 73097, 73112, 73112, 73440, 73458, 73474, 73474, 73476, 73488, 73490, 73523, 73648, 73648, 73728, 74649, 74880, 75075, 77712, 77808, 77824, 78895,
    78913, 78918, 78944, 82938, 82944, 83526, 90368, 90397, 92160, 92728, 92736, 92766, 92784, 92862, 92880, 92909, 92928, 92975, 92992, 92995, 93027, 93047, 93053, 93071,
    93504, 93548, 93760, 93823, 93952, 94026, 94032, 94032, 94099, 94111, 94176, 94177, 94179, 94179, 94208, 100343, 100352, 101589, 101631, 101640, 110576, 110579, 110581, 110587,
    110589, 110590, 110592, 110882, 110898, 110898, 110928, 110930, 110933, 110933, 110948, 110951, 110960, 111355, 113664, 113770, 113776, 113788, 113792, 113800, 113808, 113817, 119808, 119892,
    119894, 119964, 119966, 119967, 119970, 119970, 119973, 119974, 119977, 119980, 119982, 119993, 119995, 119995, 119997, 120003, 120005, 120069, 120071, 120074, 120077, 120084, 120086, 120092,
    120094, 120121, 120123, 120126, 120128, 120132, 120134, 120134, 120138, 120144, 120146, 120485, 120488, 120512, 120514, 120538, 120540, 120570, 120572, 120596, 120598, 120628, 120630, 120654,
    120656, 120686, 120688, 120712, 120714, 120744, 120746, 120770, 120772, 120779, 122624, 122654, 122661, 122666, 122928, 122989, 123136, 123180, 123191, 123197, 123214, 123214, 123536, 123565,
    123584, 123627, 124112, 124139, 124368, 124397, 124400, 124400, 124896, 124902, 124904, 124907, 124909, 124910, 124912, 124926, 124928, 125124, 125184, 125251, 125259, 125259, 126464, 126467,
    126469, 126495, 126497, 126498, 126500, 126500, 126503, 126503, 126505, 126514, 126516, 126519, 126521, 126521, 126523, 126523, 126530, 126530, 126535, 126535, 126537, 126537, 126539, 126539,
    126541, 126543, 126545, 126546, 126548, 126548, 126551, 126551, 126553, 126553, 126555, 126555, 126557, 126557, 126559, 126559, 126561, 126562, 126564, 126564, 126567, 126570, 126572, 126578,
    126580, 126583, 126585, 126588, 126590, 126590, 126592, 126601, 126603, 126619, 126625, 126627, 126629, 126633, 126635, 126651, 131072, 173791, 173824, 177977, 177984, 178205, 178208, 183969,
    183984, 191456, 191472, 192093, 194560, 195101, 196608, 201546, 201552, 205743,
};  // General_Category L*
static const uint32_t dllm__uc_number[] = {
    48, 57, 178, 179, 185, 185, 188, 190, 1632, 1641, 1776, 1785, 1984, 1993, 2406, 2415, 2534, 2543, 2548, 2553, 2662, 2671, 2790, 2799,
    2918, 2927, 2930, 2935, 3046, 3058, 3174, 3183, 3192, 3198, 3302, 3311, 3416, 3422, 3430, 3448, 3558, 3567, 3664, 3673, 3792, 3801, 3872, 3891,
    4160, 4169, 4240, 4249, 4969, 4988, 5870, 5872, 6112, 6121, 6128, 6137, 6160, 6169, 6470, 6479, 6608, 6618, 6784, 6793, 6800, 6809, 6992, 7001,
    7088, 7097, 7232, 7241, 7248, 7257, 8304, 8304, 8308, 8313, 8320, 8329, 8528, 8578, 8581, 8585, 9312, 9371, 9450, 9471, 10102, 10131, 11517, 11517,
    12295, 12295, 12321, 12329, 12344, 12346, 12690, 12693, 12832, 12841, 12872, 12879, 12881, 12895, 12928, 12937, 12977, 12991, 42528, 42537, 42726, 42735, 43056, 43061,
    43216, 43225, 43264, 43273, 43472, 43481, 43504, 43513, 43600, 43609, 44016, 44025, 65296, 65305, 65799, 65843, 65856, 65912, 65930, 65931, 66273, 66299, 66336, 66339,
    66369, 66369, 66378, 66378, 66513, 66517, 66720, 66729, 67672, 67679, 67705, 67711, 67751, 67759, 67835, 67839, 67862, 67867, 68028, 68029, 68032, 68047, 68050, 68095,
    68160, 68168, 68221, 68222, 68253, 68255, 68331, 68335, 68440, 68447, 68472, 68479, 68521, 68527, 68858, 68863, 68912, 68921, 68928, 68937, 69216, 69246, 69405, 69414,
    69457, 69460, 69573, 69579, 69714, 69743, 69872, 69881, 69942, 69951, 70096, 70105, 70113, 70132, 70384, 70393, 70736, 70745, 70864, 70873, 71248, 71257, 71360, 71369,
    71376, 71395, 71472, 71483, 71904, 71922, 72016, 72025, 72688, 72697, 72784, 72812, 73040, 73049, 73120, 73129, 73552, 73561, 73664, 73684, 74752, 74862, 90416, 90425,
    92768, 92777, 92864, 92873, 93008, 93017, 93019, 93025, 93552, 93561, 93824, 93846, 118000, 118009, 119488, 119507, 119520, 119539, 119648, 119672, 120782, 120831, 123200, 123209,
    123632, 123641, 124144, 124153, 124401, 124410, 125127, 125135, 125264, 125273, 126065, 126123, 126125, 126127, 126129, 126132, 126209, 126253, 126255, 126269, 127232, 127244, 130032, 130041,
};  // General_Category N*
static const uint32_t dllm__uc_space[] = {
    9, 13, 32, 32, 133, 133, 160, 160, 5760, 5760, 8192, 8202, 8232, 8233, 8239, 8239, 8287, 8287, 12288, 12288,
};  // White_Space (= Oniguruma \s)
// Canonical_Combining_Class runs: lo, hi, class (class 0 elsewhere).
static const uint32_t dllm__uc_ccc[] = {
    768, 788, 230, 789, 789, 232, 790, 793, 220, 794, 794, 232, 795, 795, 216, 796, 800, 220, 801, 802, 202,
    803, 806, 220, 807, 808, 202, 809, 819, 220, 820, 824, 1, 825, 828, 220, 829, 836, 230, 837, 837, 240,
    838, 838, 230, 839, 841, 220, 842, 844, 230, 845, 846, 220, 848, 850, 230, 851, 854, 220, 855, 855, 230,
    856, 856, 232, 857, 858, 220, 859, 859, 230, 860, 860, 233, 861, 862, 234, 863, 863, 233, 864, 865, 234,
    866, 866, 233, 867, 879, 230, 1155, 1159, 230, 1425, 1425, 220, 1426, 1429, 230, 1430, 1430, 220, 1431, 1433, 230,
    1434, 1434, 222, 1435, 1435, 220, 1436, 1441, 230, 1442, 1447, 220, 1448, 1449, 230, 1450, 1450, 220, 1451, 1452, 230,
    1453, 1453, 222, 1454, 1454, 228, 1455, 1455, 230, 1456, 1456, 10, 1457, 1457, 11, 1458, 1458, 12, 1459, 1459, 13,
    1460, 1460, 14, 1461, 1461, 15, 1462, 1462, 16, 1463, 1463, 17, 1464, 1464, 18, 1465, 1466, 19, 1467, 1467, 20,
    1468, 1468, 21, 1469, 1469, 22, 1471, 1471, 23, 1473, 1473, 24, 1474, 1474, 25, 1476, 1476, 230, 1477, 1477, 220,
    1479, 1479, 18, 1552, 1559, 230, 1560, 1560, 30, 1561, 1561, 31, 1562, 1562, 32, 1611, 1611, 27, 1612, 1612, 28,
    1613, 1613, 29, 1614, 1614, 30, 1615, 1615, 31, 1616, 1616, 32, 1617, 1617, 33, 1618, 1618, 34, 1619, 1620, 230,
    1621, 1622, 220, 1623, 1627, 230, 1628, 1628, 220, 1629, 1630, 230, 1631, 1631, 220, 1648, 1648, 35, 1750, 1756, 230,
    1759, 1762, 230, 1763, 1763, 220, 1764, 1764, 230, 1767, 1768, 230, 1770, 1770, 220, 1771, 1772, 230, 1773, 1773, 220,
    1809, 1809, 36, 1840, 1840, 230, 1841, 1841, 220, 1842, 1843, 230, 1844, 1844, 220, 1845, 1846, 230, 1847, 1849, 220,
    1850, 1850, 230, 1851, 1852, 220, 1853, 1853, 230, 1854, 1854, 220, 1855, 1857, 230, 1858, 1858, 220, 1859, 1859, 230,
    1860, 1860, 220, 1861, 1861, 230, 1862, 1862, 220, 1863, 1863, 230, 1864, 1864, 220, 1865, 1866, 230, 2027, 2033, 230,
    2034, 2034, 220, 2035, 2035, 230, 2045, 2045, 220, 2070, 2073, 230, 2075, 2083, 230, 2085, 2087, 230, 2089, 2093, 230,
    2137, 2139, 220, 2199, 2200, 230, 2201, 2203, 220, 2204, 2207, 230, 2250, 2254, 230, 2255, 2259, 220, 2260, 2273, 230,
    2275, 2275, 220, 2276, 2277, 230, 2278, 2278, 220, 2279, 2280, 230, 2281, 2281, 220, 2282, 2284, 230, 2285, 2287, 220,
    2288, 2288, 27, 2289, 2289, 28, 2290, 2290, 29, 2291, 2293, 230, 2294, 2294, 220, 2295, 2296, 230, 2297, 2298, 220,
    2299, 2303, 230, 2364, 2364, 7, 2381, 2381, 9, 2385, 2385, 230, 2386, 2386, 220, 2387, 2388, 230, 2492, 2492, 7,
    2509, 2509, 9, 2558, 2558, 230, 2620, 2620, 7, 2637, 2637, 9, 2748, 2748, 7, 2765, 2765, 9, 2876, 2876, 7,
    2893, 2893, 9, 3021, 3021, 9, 3132, 3132, 7, 3149, 3149, 9, 3157, 3157, 84, 3158, 3158, 91, 3260, 3260, 7,
    3277, 3277, 9, 3387, 3388, 9, 3405, 3405, 9, 3530, 3530, 9, 3640, 3641, 103, 3642, 3642, 9, 3656, 3659, 107,
    3768, 3769, 118, 3770, 3770, 9, 3784, 3787, 122, 3864, 3865, 220, 3893, 3893, 220, 3895, 3895, 220, 3897, 3897, 216,
    3953, 3953, 129, 3954, 3954, 130, 3956, 3956, 132, 3962, 3965, 130, 3968, 3968, 130, 3970, 3971, 230, 3972, 3972, 9,
    3974, 3975, 230, 4038, 4038, 220, 4151, 4151, 7, 4153, 4154, 9, 4237, 4237, 220, 4957, 4959, 230, 5908, 5909, 9,
    5940, 5940, 9, 6098, 6098, 9, 6109, 6109, 230, 6313, 6313, 228, 6457, 6457, 222, 6458, 6458, 230, 6459, 6459, 220,
    6679, 6679, 230, 6680, 6680, 220, 6752, 6752, 9, 6773, 6780, 230, 6783, 6783, 220, 6832, 6836, 230, 6837, 6842, 220,
    6843, 6844, 230, 6845, 6845, 220, 6847, 6848, 220, 6849, 6850, 230, 6851, 6852, 220, 6853, 6857, 230, 6858, 6858, 220,
    6859, 6862, 230, 6964, 6964, 7, 6980, 6980, 9, 7019, 7019, 230, 7020, 7020, 220, 7021, 7027, 230, 7082, 7083, 9,
    7142, 7142, 7, 7154, 7155, 9, 7223, 7223, 7, 7376, 7378, 230, 7380, 7380, 1, 7381, 7385, 220, 7386, 7387, 230,
    7388, 7391, 220, 7392, 7392, 230, 7394, 7400, 1, 7405, 7405, 220, 7412, 7412, 230, 7416, 7417, 230, 7616, 7617, 230,
    7618, 7618, 220, 7619, 7625, 230, 7626, 7626, 220, 7627, 7628, 230, 7629, 7629, 234, 7630, 7630, 214, 7631, 7631, 220,
    7632, 7632, 202, 7633, 7669, 230, 7670, 7670, 232, 7671, 7672, 228, 7673, 7673, 220, 7674, 7674, 218, 7675, 7675, 230,
    7676, 7676, 233, 7677, 7677, 220, 7678, 7678, 230, 7679, 7679, 220, 8400, 8401, 230, 8402, 8403, 1, 8404, 8407, 230,
    8408, 8410, 1, 8411, 8412, 230, 8417, 8417, 230, 8421, 8422, 1, 8423, 8423, 230, 8424, 8424, 220, 8425, 8425, 230,
    8426, 8427, 1, 8428, 8431, 220, 8432, 8432, 230, 11503, 11505, 230, 11647, 11647, 9, 11744, 11775, 230, 12330, 12330, 218,
    12331, 12331, 228, 12332, 12332, 232, 12333, 12333, 222, 12334, 12335, 224, 12441, 12442, 8, 42607, 42607, 230, 42612, 42621, 230,
    42654, 42655, 230, 42736, 42737, 230, 43014, 43014, 9, 43052, 43052, 9, 43204, 43204, 9, 43232, 43249, 230, 43307, 43309, 220,
    43347, 43347, 9, 43443, 43443, 7, 43456, 43456, 9, 43696, 43696, 230, 43698, 43699, 230, 43700, 43700, 220, 43703, 43704, 230,
    43710, 43711, 230, 43713, 43713, 230, 43766, 43766, 9, 44013, 44013, 9, 64286, 64286, 26, 65056, 65062, 230, 65063, 65069, 220,
    65070, 65071, 230, 66045, 66045, 220, 66272, 66272, 220, 66422, 66426, 230, 68109, 68109, 220, 68111, 68111, 230, 68152, 68152, 230,
    68153, 68153, 1, 68154, 68154, 220, 68159, 68159, 9, 68325, 68325, 230, 68326, 68326, 220, 68900, 68903, 230, 68969, 68973, 230,
    69291, 69292, 230, 69373, 69375, 220, 69446, 69447, 220, 69448, 69450, 230, 69451, 69451, 220, 69452, 69452, 230, 69453, 69456, 220,
    69506, 69506, 230, 69507, 69507, 220, 69508, 69508, 230, 69509, 69509, 220, 69702, 69702, 9, 69744, 69744, 9, 69759, 69759, 9,
    69817, 69817, 9, 69818, 69818, 7, 69888, 69890, 230, 69939, 69940, 9, 70003, 70003, 7, 70080, 70080, 9, 70090, 70090, 7,
    70197, 70197, 9, 70198, 70198, 7, 70377, 70377, 7, 70378, 70378, 9, 70459, 70460, 7, 70477, 70477, 9, 70502, 70508, 230,
    70512, 70516, 230, 70606, 70608, 9, 70722, 70722, 9, 70726, 70726, 7, 70750, 70750, 230, 70850, 70850, 9, 70851, 70851, 7,
    71103, 71103, 9, 71104, 71104, 7, 71231, 71231, 9, 71350, 71350, 9, 71351, 71351, 7, 71467, 71467, 9, 71737, 71737, 9,
    71738, 71738, 7, 71997, 71998, 9, 72003, 72003, 7, 72160, 72160, 9, 72244, 72244, 9, 72263, 72263, 9, 72345, 72345, 9,
    72767, 72767, 9, 73026, 73026, 7, 73028, 73029, 9, 73111, 73111, 9, 73537, 73538, 9, 90415, 90415, 9, 92912, 92916, 1,
    92976, 92982, 230, 94192, 94193, 6, 113822, 113822, 1, 119141, 119142, 216, 119143, 119145, 1, 119149, 119149, 226, 119150, 119154, 216,
    119163, 119170, 220, 119173, 119177, 230, 119178, 119179, 220, 119210, 119213, 230, 119362, 119364, 230, 122880, 122886, 230, 122888, 122904, 230,
    122907, 122913, 230, 122915, 122916, 230, 122918, 122922, 230, 123023, 123023, 230, 123184, 123190, 230, 123566, 123566, 230, 123628, 123631, 230,
    124140, 124141, 232, 124142, 124142, 220, 124143, 124143, 230, 124398, 124398, 230, 124399, 124399, 220, 125136, 125142, 220, 125252, 125257, 230,
    125258, 125258, 7,
};
// Canonical decompositions (one level): code point, first, second (0 for a singleton); the top bit
// of the code point marks Full_Composition_Exclusion. Hangul syllables are algorithmic.
static const uint32_t dllm__uc_decomp[] = {
    192, 65, 768, 193, 65, 769, 194, 65, 770, 195, 65, 771, 196, 65, 776, 197, 65, 778,
    199, 67, 807, 200, 69, 768, 201, 69, 769, 202, 69, 770, 203, 69, 776, 204, 73, 768,
    205, 73, 769, 206, 73, 770, 207, 73, 776, 209, 78, 771, 210, 79, 768, 211, 79, 769,
    212, 79, 770, 213, 79, 771, 214, 79, 776, 217, 85, 768, 218, 85, 769, 219, 85, 770,
    220, 85, 776, 221, 89, 769, 224, 97, 768, 225, 97, 769, 226, 97, 770, 227, 97, 771,
    228, 97, 776, 229, 97, 778, 231, 99, 807, 232, 101, 768, 233, 101, 769, 234, 101, 770,
    235, 101, 776, 236, 105, 768, 237, 105, 769, 238, 105, 770, 239, 105, 776, 241, 110, 771,
    242, 111, 768, 243, 111, 769, 244, 111, 770, 245, 111, 771, 246, 111, 776, 249, 117, 768,
    250, 117, 769, 251, 117, 770, 252, 117, 776, 253, 121, 769, 255, 121, 776, 256, 65, 772,
    257, 97, 772, 258, 65, 774, 259, 97, 774, 260, 65, 808, 261, 97, 808, 262, 67, 769,
    263, 99, 769, 264, 67, 770, 265, 99, 770, 266, 67, 775, 267, 99, 775, 268, 67, 780,
    269, 99, 780, 270, 68, 780, 271, 100, 780, 274, 69, 772, 275, 101, 772, 276, 69, 774,
    277, 101, 774, 278, 69, 775, 279, 101, 775, 280, 69, 808, 281, 101, 808, 282, 69, 780,
    283, 101, 780, 284, 71, 770, 285, 103, 770, 286, 71, 774, 287, 103, 774, 288, 71, 775,
    289, 103, 775, 290, 71, 807, 291, 103, 807, 292, 72, 770, 293, 104, 770, 296, 73, 771,
    297, 105, 771, 298, 73, 772, 299, 105, 772, 300, 73, 774, 301, 105, 774, 302, 73, 808,
    303, 105, 808, 304, 73, 775, 308, 74, 770, 309, 106, 770, 310, 75, 807, 311, 107, 807,
    313, 76, 769, 314, 108, 769, 315, 76, 807, 316, 108, 807, 317, 76, 780, 318, 108, 780,
    323, 78, 769, 324, 110, 769, 325, 78, 807, 326, 110, 807, 327, 78, 780, 328, 110, 780,
    332, 79, 772, 333, 111, 772, 334, 79, 774, 335, 111, 774, 336, 79, 779, 337, 111, 779,
    340, 82, 769, 341, 114, 769, 342, 82, 807, 343, 114, 807, 344, 82, 780, 345, 114, 780,
    346, 83, 769, 347, 115, 769, 348, 83, 770, 349, 115, 770, 350, 83, 807, 351, 115, 807,
    352, 83, 780, 353, 115, 780, 354, 84, 807, 355, 116, 807, 356, 84, 780, 357, 116, 780,
    360, 85, 771, 361, 117, 771, 362, 85, 772, 363, 117, 772, 364, 85, 774, 365, 117, 774,
    366, 85, 778, 367, 117, 778, 368, 85, 779, 369, 117, 779, 370, 85, 808, 371, 117, 808,
    372, 87, 770, 373, 119, 770, 374, 89, 770, 375, 121, 770, 376, 89, 776, 377, 90, 769,
    378, 122, 769, 379, 90, 775, 380, 122, 775, 381, 90, 780, 382, 122, 780, 416, 79, 795,
    417, 111, 795, 431, 85, 795, 432, 117, 795, 461, 65, 780, 462, 97, 780, 463, 73, 780,
    464, 105, 780, 465, 79, 780, 466, 111, 780, 467, 85, 780, 468, 117, 780, 469, 220, 772,
    470, 252, 772, 471, 220, 769, 472, 252, 769, 473, 220, 780, 474, 252, 780, 475, 220, 768,
    476, 252, 768, 478, 196, 772, 479, 228, 772, 480, 550, 772, 481, 551, 772, 482, 198, 772,
    483, 230, 772, 486, 71, 780, 487, 103, 780, 488, 75, 780, 489, 107, 780, 490, 79, 808,
    491, 111, 808, 492, 490, 772, 493, 491, 772, 494, 439, 780, 495, 658, 780, 496, 106, 780,
    500, 71, 769, 501, 103, 769, 504, 78, 768, 505, 110, 768, 506, 197, 769, 507, 229, 769,
    508, 198, 769, 509, 230, 769, 510, 216, 769, 511, 248, 769, 512, 65, 783, 513, 97, 783,
    514, 65, 785, 515, 97, 785, 516, 69, 783, 517, 101, 783, 518, 69, 785, 519, 101, 785,
    520, 73, 783, 521, 105, 783, 522, 73, 785, 523, 105, 785, 524, 79, 783, 525, 111, 783,
    526, 79, 785, 527, 111, 785, 528, 82, 783, 529, 114, 783, 530, 82, 785, 531, 114, 785,
    532, 85, 783, 533, 117, 783, 534, 85, 785, 535, 117, 785, 536, 83, 806, 537, 115, 806,
    538, 84, 806, 539, 116, 806, 542, 72, 780, 543, 104, 780, 550, 65, 775, 551, 97, 775,
    552, 69, 807, 553, 101, 807, 554, 214, 772, 555, 246, 772, 556, 213, 772, 557, 245, 772,
    558, 79, 775, 559, 111, 775, 560, 558, 772, 561, 559, 772, 562, 89, 772, 563, 121, 772,
    2147484480, 768, 0, 2147484481, 769, 0, 2147484483, 787, 0, 2147484484, 776, 769, 2147484532, 697, 0, 2147484542, 59, 0,
    901, 168, 769, 902, 913, 769, 2147484551, 183, 0, 904, 917, 769, 905, 919, 769, 906, 921, 769,
    908, 927, 769, 910, 933, 769, 911, 937, 769, 912, 970, 769, 938, 921, 776, 939, 933, 776,
    940, 945, 769, 941, 949, 769, 942, 951, 769, 943, 953, 769, 944, 971, 769, 970, 953, 776,
    971, 965, 776, 972, 959, 769, 973, 965, 769, 974, 969, 769, 979, 978, 769, 980, 978, 776,
    1024, 1045, 768, 1025, 1045, 776, 1027, 1043, 769, 1031, 1030, 776, 1036, 1050, 769, 1037, 1048, 768,
    1038, 1059, 774, 1049, 1048, 774, 1081, 1080, 774, 1104, 1077, 768, 1105, 1077, 776, 1107, 1075, 769,
    1111, 1110, 776, 1116, 1082, 769, 1117, 1080, 768, 1118, 1091, 774, 1142, 1140, 783, 1143, 1141, 783,
    1217, 1046, 774, 1218, 1078, 774, 1232, 1040, 774, 1233, 1072, 774, 1234, 1040, 776, 1235, 1072, 776,
    1238, 1045, 774, 1239, 1077, 774, 1242, 1240, 776, 1243, 1241, 776, 1244, 1046, 776, 1245, 1078, 776,
    1246, 1047, 776, 1247, 1079, 776, 1250, 1048, 772, 1251, 1080, 772, 1252, 1048, 776, 1253, 1080, 776,
    1254, 1054, 776, 1255, 1086, 776, 1258, 1256, 776, 1259, 1257, 776, 1260, 1069, 776, 1261, 1101, 776,
    1262, 1059, 772, 1263, 1091, 772, 1264, 1059, 776, 1265, 1091, 776, 1266, 1059, 779, 1267, 1091, 779,
    1268, 1063, 776, 1269, 1095, 776, 1272, 1067, 776, 1273, 1099, 776, 1570, 1575, 1619, 1571, 1575, 1620,
    1572, 1608, 1620, 1573, 1575, 1621, 1574, 1610, 1620, 1728, 1749, 1620, 1730, 1729, 1620, 1747, 1746, 1620,
    2345, 2344, 2364, 2353, 2352, 2364, 2356, 2355, 2364, 2147486040, 2325, 2364, 2147486041, 2326, 2364, 2147486042, 2327, 2364,
    2147486043, 2332, 2364, 2147486044, 2337, 2364, 2147486045, 2338, 2364, 2147486046, 2347, 2364, 2147486047, 2351, 2364, 2507, 2503, 2494,
    2508, 2503, 2519, 2147486172, 2465, 2492, 2147486173, 2466, 2492, 2147486175, 2479, 2492, 2147486259, 2610, 2620, 2147486262, 2616, 2620,
    2147486297, 2582, 2620, 2147486298, 2583, 2620, 2147486299, 2588, 2620, 2147486302, 2603, 2620, 2888, 2887, 2902, 2891, 2887, 2878,
    2892, 2887, 2903, 2147486556, 2849, 2876, 2147486557, 2850, 2876, 2964, 2962, 3031, 3018, 3014, 3006, 3019, 3015, 3006,
    3020, 3014, 3031, 3144, 3142, 3158, 3264, 3263, 3285, 3271, 3270, 3285, 3272, 3270, 3286, 3274, 3270, 3266,
    3275, 3274, 3285, 3402, 3398, 3390, 3403, 3399, 3390, 3404, 3398, 3415, 3546, 3545, 3530, 3548, 3545, 3535,
    3549, 3548, 3530, 3550, 3545, 3551, 2147487555, 3906, 4023, 2147487565, 3916, 4023, 2147487570, 3921, 4023, 2147487575, 3926, 4023,
    2147487580, 3931, 4023, 2147487593, 3904, 4021, 2147487603, 3953, 3954, 2147487605, 3953, 3956, 2147487606, 4018, 3968, 2147487608, 4019, 3968,
    2147487617, 3953, 3968, 2147487635, 3986, 4023, 2147487645, 3996, 4023, 2147487650, 4001, 4023, 2147487655, 4006, 4023, 2147487660, 4011, 4023,
    2147487673, 3984, 4021, 4134, 4133, 4142, 6918, 6917, 6965, 6920, 6919, 6965, 6922, 6921, 6965, 6924, 6923, 6965,
    6926, 6925, 6965, 6930, 6929, 6965, 6971, 6970, 6965, 6973, 6972, 6965, 6976, 6974, 6965, 6977, 6975, 6965,
    6979, 6978, 6965, 7680, 65, 805, 7681, 97, 805, 7682, 66, 775, 7683, 98, 775, 7684, 66, 803,
    7685, 98, 803, 7686, 66, 817, 7687, 98, 817, 7688, 199, 769, 7689, 231, 769, 7690, 68, 775,
    7691, 100, 775, 7692, 68, 803, 7693, 100, 803, 7694, 68, 817, 7695, 100, 817, 7696, 68, 807,
    7697, 100, 807, 7698, 68, 813, 7699, 100, 813, 7700, 274, 768, 7701, 275, 768, 7702, 274, 769,
    7703, 275, 769, 7704, 69, 813, 7705, 101, 813, 7706, 69, 816, 7707, 101, 816, 7708, 552, 774,
    7709, 553, 774, 7710, 70, 775, 7711, 102, 775, 7712, 71, 772, 7713, 103, 772, 7714, 72, 775,
    7715, 104, 775, 7716, 72, 803, 7717, 104, 803, 7718, 72, 776, 7719, 104, 776, 7720, 72, 807,
    7721, 104, 807, 7722, 72, 814, 7723, 104, 814, 7724, 73, 816, 7725, 105, 816, 7726, 207, 769,
    7727, 239, 769, 7728, 75, 769, 7729, 107, 769, 7730, 75, 803, 7731, 107, 803, 7732, 75, 817,
    7733, 107, 817, 7734, 76, 803, 7735, 108, 803, 7736, 7734, 772, 7737, 7735, 772, 7738, 76, 817,
    7739, 108, 817, 7740, 76, 813, 7741, 108, 813, 7742, 77, 769, 7743, 109, 769, 7744, 77, 775,
    7745, 109, 775, 7746, 77, 803, 7747, 109, 803, 7748, 78, 775, 7749, 110, 775, 7750, 78, 803,
    7751, 110, 803, 7752, 78, 817, 7753, 110, 817, 7754, 78, 813, 7755, 110, 813, 7756, 213, 769,
    7757, 245, 769, 7758, 213, 776, 7759, 245, 776, 7760, 332, 768, 7761, 333, 768, 7762, 332, 769,
    7763, 333, 769, 7764, 80, 769, 7765, 112, 769, 7766, 80, 775, 7767, 112, 775, 7768, 82, 775,
    7769, 114, 775, 7770, 82, 803, 7771, 114, 803, 7772, 7770, 772, 7773, 7771, 772, 7774, 82, 817,
    7775, 114, 817, 7776, 83, 775, 7777, 115, 775, 7778, 83, 803, 7779, 115, 803, 7780, 346, 775,
    7781, 347, 775, 7782, 352, 775, 7783, 353, 775, 7784, 7778, 775, 7785, 7779, 775, 7786, 84, 775,
    7787, 116, 775, 7788, 84, 803, 7789, 116, 803, 7790, 84, 817, 7791, 116, 817, 7792, 84, 813,
    7793, 116, 813, 7794, 85, 804, 7795, 117, 804, 7796, 85, 816, 7797, 117, 816, 7798, 85, 813,
    7799, 117, 813, 7800, 360, 769, 7801, 361, 769, 7802, 362, 776, 7803, 363, 776, 7804, 86, 771,
    7805, 118, 771, 7806, 86, 803, 7807, 118, 803, 7808, 87, 768, 7809, 119, 768, 7810, 87, 769,
    7811, 119, 769, 7812, 87, 776, 7813, 119, 776, 7814, 87, 775, 7815, 119, 775, 7816, 87, 803,
    7817, 119, 803, 7818, 88, 775, 7819, 120, 775, 7820, 88, 776, 7821, 120, 776, 7822, 89, 775,
    7823, 121, 775, 7824, 90, 770, 7825, 122, 770, 7826, 90, 803, 7827, 122, 803, 7828, 90, 817,
    7829, 122, 817, 7830, 104, 817, 7831, 116, 776, 7832, 119, 778, 7833, 121, 778, 7835, 383, 775,
    7840, 65, 803, 7841, 97, 803, 7842, 65, 777, 7843, 97, 777, 7844, 194, 769, 7845, 226, 769,
    7846, 194, 768, 7847, 226, 768, 7848, 194, 777, 7849, 226, 777, 7850, 194, 771, 7851, 226, 771,
    7852, 7840, 770, 7853, 7841, 770, 7854, 258, 769, 7855, 259, 769, 7856, 258, 768, 7857, 259, 768,
    7858, 258, 777, 7859, 259, 777, 7860, 258, 771, 7861, 259, 771, 7862, 7840, 774, 7863, 7841, 774,
    7864, 69, 803, 7865, 101, 803, 7866, 69, 777, 7867, 101, 777, 7868, 69, 771, 7869, 101, 771,
    7870, 202, 769, 7871, 234, 769, 7872, 202, 768, 7873, 234, 768, 7874, 202, 777, 7875, 234, 777,
    7876, 202, 771, 7877, 234, 771, 7878, 7864, 770, 7879, 7865, 770, 7880, 73, 777, 7881, 105, 777,
    7882, 73, 803, 7883, 105, 803, 7884, 79, 803, 7885, 111, 803, 7886, 79, 777, 7887, 111, 777,
    7888, 212, 769, 7889, 244, 769, 7890, 212, 768, 7891, 244, 768, 7892, 212, 777, 7893, 244, 777,
    7894, 212, 771, 7895, 244, 771, 7896, 7884, 770, 7897, 7885, 770, 7898, 416, 769, 7899, 417, 769,
    7900, 416, 768, 7901, 417, 768, 7902, 416, 777, 7903, 417, 777, 7904, 416, 771, 7905, 417, 771,
    7906, 416, 803, 7907, 417, 803, 7908, 85, 803, 7909, 117, 803, 7910, 85, 777, 7911, 117, 777,
    7912, 431, 769, 7913, 432, 769, 7914, 431, 768, 7915, 432, 768, 7916, 431, 777, 7917, 432, 777,
    7918, 431, 771, 7919, 432, 771, 7920, 431, 803, 7921, 432, 803, 7922, 89, 768, 7923, 121, 768,
    7924, 89, 803, 7925, 121, 803, 7926, 89, 777, 7927, 121, 777, 7928, 89, 771, 7929, 121, 771,
    7936, 945, 787, 7937, 945, 788, 7938, 7936, 768, 7939, 7937, 768, 7940, 7936, 769, 7941, 7937, 769,
    7942, 7936, 834, 7943, 7937, 834, 7944, 913, 787, 7945, 913, 788, 7946, 7944, 768, 7947, 7945, 768,
    7948, 7944, 769, 7949, 7945, 769, 7950, 7944, 834, 7951, 7945, 834, 7952, 949, 787, 7953, 949, 788,
    7954, 7952, 768, 7955, 7953, 768, 7956, 7952, 769, 7957, 7953, 769, 7960, 917, 787, 7961, 917, 788,
    7962, 7960, 768, 7963, 7961, 768, 7964, 7960, 769, 7965, 7961, 769, 7968, 951, 787, 7969, 951, 788,
    7970, 7968, 768, 7971, 7969, 768, 7972, 7968, 769, 7973, 7969, 769, 7974, 7968, 834, 7975, 7969, 834,
    7976, 919, 787, 7977, 919, 788, 7978, 7976, 768, 7979, 7977, 768, 7980, 7976, 769, 7981, 7977, 769,
    7982, 7976, 834, 7983, 7977, 834, 7984, 953, 787, 7985, 953, 788, 7986, 7984, 768, 7987, 7985, 768,
    7988, 7984, 769, 7989, 7985, 769, 7990, 7984, 834, 7991, 7985, 834, 7992, 921, 787, 7993, 921, 788,
    7994, 7992, 768, 7995, 7993, 768, 7996, 7992, 769, 7997, 7993, 769, 7998, 7992, 834, 7999, 7993, 834,
    8000, 959, 787, 8001, 959, 788, 8002, 8000, 768, 8003, 8001, 768, 8004, 8000, 769, 8005, 8001, 769,
    8008, 927, 787, 8009, 927, 788, 8010, 8008, 768, 8011, 8009, 768, 8012, 8008, 769, 8013, 8009, 769,
    8016, 965, 787, 8017, 965, 788, 8018, 8016, 768, 8019, 8017, 768, 8020, 8016, 769, 8021, 8017, 769,
    8022, 8016, 834, 8023, 8017, 834, 8025, 933, 788, 8027, 8025, 768, 8029, 8025, 769, 8031, 8025, 834,
    8032, 969, 787, 8033, 969, 788, 8034, 8032, 768, 8035, 8033, 768, 8036, 8032, 769, 8037, 8033, 769,
    8038, 8032, 834, 8039, 8033, 834, 8040, 937, 787, 8041, 937, 788, 8042, 8040, 768, 8043, 8041, 768,
    8044, 8040, 769, 8045, 8041, 769, 8046, 8040, 834, 8047, 8041, 834, 8048, 945, 768, 2147491697, 940, 0,
    8050, 949, 768, 2147491699, 941, 0, 8052, 951, 768, 2147491701, 942, 0, 8054, 953, 768, 2147491703, 943, 0,
    8056, 959, 768, 2147491705, 972, 0, 8058, 965, 768, 2147491707, 973, 0, 8060, 969, 768, 2147491709, 974, 0,
    8064, 7936, 837, 8065, 7937, 837, 8066, 7938, 837, 8067, 7939, 837, 8068, 7940, 837, 8069, 7941, 837,
    8070, 7942, 837, 8071, 7943, 837, 8072, 7944, 837, 8073, 7945, 837, 8074, 7946, 837, 8075, 7947, 837,
    8076, 7948, 837, 8077, 7949, 837, 8078, 7950, 837, 8079, 7951, 837, 8080, 7968, 837, 8081, 7969, 837,
    8082, 7970, 837, 8083, 7971, 837, 8084, 7972, 837, 8085, 7973, 837, 8086, 7974, 837, 8087, 7975, 837,
    8088, 7976, 837, 8089, 7977, 837, 8090, 7978, 837, 8091, 7979, 837, 8092, 7980, 837, 8093, 7981, 837,
    8094, 7982, 837, 8095, 7983, 837, 8096, 8032, 837, 8097, 8033, 837, 8098, 8034, 837, 8099, 8035, 837,
    8100, 8036, 837, 8101, 8037, 837, 8102, 8038, 837, 8103, 8039, 837, 8104, 8040, 837, 8105, 8041, 837,
    8106, 8042, 837, 8107, 8043, 837, 8108, 8044, 837, 8109, 8045, 837, 8110, 8046, 837, 8111, 8047, 837,
    8112, 945, 774, 8113, 945, 772, 8114, 8048, 837, 8115, 945, 837, 8116, 940, 837, 8118, 945, 834,
    8119, 8118, 837, 8120, 913, 774, 8121, 913, 772, 8122, 913, 768, 2147491771, 902, 0, 8124, 913, 837,
    2147491774, 953, 0, 8129, 168, 834, 8130, 8052, 837, 8131, 951, 837, 8132, 942, 837, 8134, 951, 834,
    8135, 8134, 837, 8136, 917, 768, 2147491785, 904, 0, 8138, 919, 768, 2147491787, 905, 0, 8140, 919, 837,
    8141, 8127, 768, 8142, 8127, 769, 8143, 8127, 834, 8144, 953, 774, 8145, 953, 772, 8146, 970, 768,
    2147491795, 912, 0, 8150, 953, 834, 8151, 970, 834, 8152, 921, 774, 8153, 921, 772, 8154, 921, 768,
    2147491803, 906, 0, 8157, 8190, 768, 8158, 8190, 769, 8159, 8190, 834, 8160, 965, 774, 8161, 965, 772,
    8162, 971, 768, 2147491811, 944, 0, 8164, 961, 787, 8165, 961, 788, 8166, 965, 834, 8167, 971, 834,
    8168, 933, 774, 8169, 933, 772, 8170, 933, 768, 2147491819, 910, 0, 8172, 929, 788, 8173, 168, 768,
    2147491822, 901, 0, 2147491823, 96, 0, 8178, 8060, 837, 8179, 969, 837, 8180, 974, 837, 8182, 969, 834,
    8183, 8182, 837, 8184, 927, 768, 2147491833, 908, 0, 8186, 937, 768, 2147491835, 911, 0, 8188, 937, 837,
    2147491837, 180, 0, 2147491840, 8194, 0, 2147491841, 8195, 0, 2147492134, 937, 0, 2147492138, 75, 0, 2147492139, 197, 0,
    8602, 8592, 824, 8603, 8594, 824, 8622, 8596, 824, 8653, 8656, 824, 8654, 8660, 824, 8655, 8658, 824,
    8708, 8707, 824, 8713, 8712, 824, 8716, 8715, 824, 8740, 8739, 824, 8742, 8741, 824, 8769, 8764, 824,
    8772, 8771, 824, 8775, 8773, 824, 8777, 8776, 824, 8800, 61, 824, 8802, 8801, 824, 8813, 8781, 824,
    8814, 60, 824, 8815, 62, 824, 8816, 8804, 824, 8817, 8805, 824, 8820, 8818, 824, 8821, 8819, 824,
    8824, 8822, 824, 8825, 8823, 824, 8832, 8826, 824, 8833, 8827, 824, 8836, 8834, 824, 8837, 8835, 824,
    8840, 8838, 824, 8841, 8839, 824, 8876, 8866, 824, 8877, 8872, 824, 8878, 8873, 824, 8879, 8875, 824,
    8928, 8828, 824, 8929, 8829, 824, 8930, 8849, 824, 8931, 8850, 824, 8938, 8882, 824, 8939, 8883, 824,
    8940, 8884, 824, 8941, 8885, 824, 2147492649, 12296, 0, 2147492650, 12297, 0, 2147494620, 10973, 824, 12364, 12363, 12441,
    12366, 12365, 12441, 12368, 12367, 12441, 12370, 12369, 12441, 12372, 12371, 12441, 12374, 12373, 12441, 12376, 12375, 12441,
    12378, 12377, 12441, 12380, 12379, 12441, 12382, 12381, 12441, 12384, 12383, 12441, 12386, 12385, 12441, 12389, 12388, 12441,
    12391, 12390, 12441, 12393, 12392, 12441, 12400, 12399, 12441, 12401, 12399, 12442, 12403, 12402, 12441, 12404, 12402, 12442,
    12406, 12405, 12441, 12407, 12405, 12442, 12409, 12408, 12441, 12410, 12408, 12442, 12412, 12411, 12441, 12413, 12411, 12442,
    12436, 12358, 12441, 12446, 12445, 12441, 12460, 12459, 12441, 12462, 12461, 12441, 12464, 12463, 12441, 12466, 12465, 12441,
    12468, 12467, 12441, 12470, 12469, 12441, 12472, 12471, 12441, 12474, 12473, 12441, 12476, 12475, 12441, 12478, 12477, 12441,
    12480, 12479, 12441, 12482, 12481, 12441, 12485, 12484, 12441, 12487, 12486, 12441, 12489, 12488, 12441, 12496, 12495, 12441,
    12497, 12495, 12442, 12499, 12498, 12441, 12500, 12498, 12442, 12502, 12501, 12441, 12503, 12501, 12442, 12505, 12504, 12441,
    12506, 12504, 12442, 12508, 12507, 12441, 12509, 12507, 12442, 12532, 12454, 12441, 12535, 12527, 12441, 12536, 12528, 12441,
    12537, 12529, 12441, 12538, 12530, 12441, 12542, 12541, 12441, 2147547392, 35912, 0, 2147547393, 26356, 0, 2147547394, 36554, 0,
    2147547395, 36040, 0, 2147547396, 28369, 0, 2147547397, 20018, 0, 2147547398, 21477, 0, 2147547399, 40860, 0, 2147547400, 40860, 0,
    2147547401, 22865, 0, 2147547402, 37329, 0, 2147547403, 21895, 0, 2147547404, 22856, 0, 2147547405, 25078, 0, 2147547406, 30313, 0,
    2147547407, 32645, 0, 2147547408, 34367, 0, 2147547409, 34746, 0, 2147547410, 35064, 0, 2147547411, 37007, 0, 2147547412, 27138, 0,
    2147547413, 27931, 0, 2147547414, 28889, 0, 2147547415, 29662, 0, 2147547416, 33853, 0, 2147547417, 37226, 0, 2147547418, 39409, 0,
    2147547419, 20098, 0, 2147547420, 21365, 0, 2147547421, 27396, 0, 2147547422, 29211, 0, 2147547423, 34349, 0, 2147547424, 40478, 0,
    2147547425, 23888, 0, 2147547426, 28651, 0, 2147547427, 34253, 0, 2147547428, 35172, 0, 2147547429, 25289, 0, 2147547430, 33240, 0,
    2147547431, 34847, 0, 2147547432, 24266, 0, 2147547433, 26391, 0, 2147547434, 28010, 0, 2147547435, 29436, 0, 2147547436, 37070, 0,
    2147547437, 20358, 0, 2147547438, 20919, 0, 2147547439, 21214, 0, 2147547440, 25796, 0, 2147547441, 27347, 0, 2147547442, 29200, 0,
    2147547443, 30439, 0, 2147547444, 32769, 0, 2147547445, 34310, 0, 2147547446, 34396, 0, 2147547447, 36335, 0, 2147547448, 38706, 0,
    2147547449, 39791, 0, 2147547450, 40442, 0, 2147547451, 30860, 0, 2147547452, 31103, 0, 2147547453, 32160, 0, 2147547454, 33737, 0,
    2147547455, 37636, 0, 2147547456, 40575, 0, 2147547457, 35542, 0, 2147547458, 22751, 0, 2147547459, 24324, 0, 2147547460, 31840, 0,
    2147547461, 32894, 0, 2147547462, 29282, 0, 2147547463, 30922, 0, 2147547464, 36034, 0, 2147547465, 38647, 0, 2147547466, 22744, 0,
    2147547467, 23650, 0, 2147547468, 27155, 0, 2147547469, 28122, 0, 2147547470, 28431, 0, 2147547471, 32047, 0, 2147547472, 32311, 0,
    2147547473, 38475, 0, 2147547474, 21202, 0, 2147547475, 32907, 0, 2147547476, 20956, 0, 2147547477, 20940, 0, 2147547478, 31260, 0,
    2147547479, 32190, 0, 2147547480, 33777, 0, 2147547481, 38517, 0, 2147547482, 35712, 0, 2147547483, 25295, 0, 2147547484, 27138, 0,
    2147547485, 35582, 0, 2147547486, 20025, 0, 2147547487, 23527, 0, 2147547488, 24594, 0, 2147547489, 29575, 0, 2147547490, 30064, 0,
    2147547491, 21271, 0, 2147547492, 30971, 0, 2147547493, 20415, 0, 2147547494, 24489, 0, 2147547495, 19981, 0, 2147547496, 27852, 0,
    2147547497, 25976, 0, 2147547498, 32034, 0, 2147547499, 21443, 0, 2147547500, 22622, 0, 2147547501, 30465, 0, 2147547502, 33865, 0,
    2147547503, 35498, 0, 2147547504, 27578, 0, 2147547505, 36784, 0, 2147547506, 27784, 0, 2147547507, 25342, 0, 2147547508, 33509, 0,
    2147547509, 25504, 0, 2147547510, 30053, 0, 2147547511, 20142, 0, 2147547512, 20841, 0, 2147547513, 20937, 0, 2147547514, 26753, 0,
    2147547515, 31975, 0, 2147547516, 33391, 0, 2147547517, 35538, 0, 2147547518, 37327, 0, 2147547519, 21237, 0, 2147547520, 21570, 0,
    2147547521, 22899, 0, 2147547522, 24300, 0, 2147547523, 26053, 0, 2147547524, 28670, 0, 2147547525, 31018, 0, 2147547526, 38317, 0,
    2147547527, 39530, 0, 2147547528, 40599, 0, 2147547529, 40654, 0, 2147547530, 21147, 0, 2147547531, 26310, 0, 2147547532, 27511, 0,
    2147547533, 36706, 0, 2147547534, 24180, 0, 2147547535, 24976, 0, 2147547536, 25088, 0, 2147547537, 25754, 0, 2147547538, 28451, 0,
    2147547539, 29001, 0, 2147547540, 29833, 0, 2147547541, 31178, 0, 2147547542, 32244, 0, 2147547543, 32879, 0, 2147547544, 36646, 0,
    2147547545, 34030, 0, 2147547546, 36899, 0, 2147547547, 37706, 0, 2147547548, 21015, 0, 2147547549, 21155, 0, 2147547550, 21693, 0,
    2147547551, 28872, 0, 2147547552, 35010, 0, 2147547553, 35498, 0, 2147547554, 24265, 0, 2147547555, 24565, 0, 2147547556, 25467, 0,
    2147547557, 27566, 0, 2147547558, 31806, 0, 2147547559, 29557, 0, 2147547560, 20196, 0, 2147547561, 22265, 0, 2147547562, 23527, 0,
    2147547563, 23994, 0, 2147547564, 24604, 0, 2147547565, 29618, 0, 2147547566, 29801, 0, 2147547567, 32666, 0, 2147547568, 32838, 0,
    2147547569, 37428, 0, 2147547570, 38646, 0, 2147547571, 38728, 0, 2147547572, 38936, 0, 2147547573, 20363, 0, 2147547574, 31150, 0,
    2147547575, 37300, 0, 2147547576, 38584, 0, 2147547577, 24801, 0, 2147547578, 20102, 0, 2147547579, 20698, 0, 2147547580, 23534, 0,
    2147547581, 23615, 0, 2147547582, 26009, 0, 2147547583, 27138, 0, 2147547584, 29134, 0, 2147547585, 30274, 0, 2147547586, 34044, 0,
    2147547587, 36988, 0, 2147547588, 40845, 0, 2147547589, 26248, 0, 2147547590, 38446, 0, 2147547591, 21129, 0, 2147547592, 26491, 0,
    2147547593, 26611, 0, 2147547594, 27969, 0, 2147547595, 28316, 0, 2147547596, 29705, 0, 2147547597, 30041, 0, 2147547598, 30827, 0,
    2147547599, 32016, 0, 2147547600, 39006, 0, 2147547601, 20845, 0, 2147547602, 25134, 0, 2147547603, 38520, 0, 2147547604, 20523, 0,
    2147547605, 23833, 0, 2147547606, 28138, 0, 2147547607, 36650, 0, 2147547608, 24459, 0, 2147547609, 24900, 0, 2147547610, 26647, 0,
    2147547611, 29575, 0, 2147547612, 38534, 0, 2147547613, 21033, 0, 2147547614, 21519, 0, 2147547615, 23653, 0, 2147547616, 26131, 0,
    2147547617, 26446, 0, 2147547618, 26792, 0, 2147547619, 27877, 0, 2147547620, 29702, 0, 2147547621, 30178, 0, 2147547622, 32633, 0,
    2147547623, 35023, 0, 2147547624, 35041, 0, 2147547625, 37324, 0, 2147547626, 38626, 0, 2147547627, 21311, 0, 2147547628, 28346, 0,
    2147547629, 21533, 0, 2147547630, 29136, 0, 2147547631, 29848, 0, 2147547632, 34298, 0, 2147547633, 38563, 0, 2147547634, 40023, 0,
    2147547635, 40607, 0, 2147547636, 26519, 0, 2147547637, 28107, 0, 2147547638, 33256, 0, 2147547639, 31435, 0, 2147547640, 31520, 0,
    2147547641, 31890, 0, 2147547642, 29376, 0, 2147547643, 28825, 0, 2147547644, 35672, 0, 2147547645, 20160, 0, 2147547646, 33590, 0,
    2147547647, 21050, 0, 2147547648, 20999, 0, 2147547649, 24230, 0, 2147547650, 25299, 0, 2147547651, 31958, 0, 2147547652, 23429, 0,
    2147547653, 27934, 0, 2147547654, 26292, 0, 2147547655, 36667, 0, 2147547656, 34892, 0, 2147547657, 38477, 0, 2147547658, 35211, 0,
    2147547659, 24275, 0, 2147547660, 20800, 0, 2147547661, 21952, 0, 2147547664, 22618, 0, 2147547666, 26228, 0, 2147547669, 20958, 0,
    2147547670, 29482, 0, 2147547671, 30410, 0, 2147547672, 31036, 0, 2147547673, 31070, 0, 2147547674, 31077, 0, 2147547675, 31119, 0,
    2147547676, 38742, 0, 2147547677, 31934, 0, 2147547678, 32701, 0, 2147547680, 34322, 0, 2147547682, 35576, 0, 2147547685, 36920, 0,
    2147547686, 37117, 0, 2147547690, 39151, 0, 2147547691, 39164, 0, 2147547692, 39208, 0, 2147547693, 40372, 0, 2147547694, 37086, 0,
    2147547695, 38583, 0, 2147547696, 20398, 0, 2147547697, 20711, 0, 2147547698, 20813, 0, 2147547699, 21193, 0, 2147547700, 21220, 0,
    2147547701, 21329, 0, 2147547702, 21917, 0, 2147547703, 22022, 0, 2147547704, 22120, 0, 2147547705, 22592, 0, 2147547706, 22696, 0,
    2147547707, 23652, 0, 2147547708, 23662, 0, 2147547709, 24724, 0, 2147547710, 24936, 0, 2147547711, 24974, 0, 2147547712, 25074, 0,
    2147547713, 25935, 0, 2147547714, 26082, 0, 2147547715, 26257, 0, 2147547716, 26757, 0, 2147547717, 28023, 0, 2147547718, 28186, 0,
    2147547719, 28450, 0, 2147547720, 29038, 0, 2147547721, 29227, 0, 2147547722, 29730, 0, 2147547723, 30865, 0, 2147547724, 31038, 0,
    2147547725, 31049, 0, 2147547726, 31048, 0, 2147547727, 31056, 0, 2147547728, 31062, 0, 2147547729, 31069, 0, 2147547730, 31117, 0,
    2147547731, 31118, 0, 2147547732, 31296, 0, 2147547733, 31361, 0, 2147547734, 31680, 0, 2147547735, 32244, 0, 2147547736, 32265, 0,
    2147547737, 32321, 0, 2147547738, 32626, 0, 2147547739, 32773, 0, 2147547740, 33261, 0, 2147547741, 33401, 0, 2147547742, 33401, 0,
    2147547743, 33879, 0, 2147547744, 35088, 0, 2147547745, 35222, 0, 2147547746, 35585, 0, 2147547747, 35641, 0, 2147547748, 36051, 0,
    2147547749, 36104, 0, 2147547750, 36790, 0, 2147547751, 36920, 0, 2147547752, 38627, 0, 2147547753, 38911, 0, 2147547754, 38971, 0,
    2147547755, 24693, 0, 2147547756, 148206, 0, 2147547757, 33304, 0, 2147547760, 20006, 0, 2147547761, 20917, 0, 2147547762, 20840, 0,
    2147547763, 20352, 0, 2147547764, 20805, 0, 2147547765, 20864, 0, 2147547766, 21191, 0, 2147547767, 21242, 0, 2147547768, 21917, 0,
    2147547769, 21845, 0, 2147547770, 21913, 0, 2147547771, 21986, 0, 2147547772, 22618, 0, 2147547773, 22707, 0, 2147547774, 22852, 0,
    2147547775, 22868, 0, 2147547776, 23138, 0, 2147547777, 23336, 0, 2147547778, 24274, 0, 2147547779, 24281, 0, 2147547780, 24425, 0,
    2147547781, 24493, 0, 2147547782, 24792, 0, 2147547783, 24910, 0, 2147547784, 24840, 0, 2147547785, 24974, 0, 2147547786, 24928, 0,
    2147547787, 25074, 0, 2147547788, 25140, 0, 2147547789, 25540, 0, 2147547790, 25628, 0, 2147547791, 25682, 0, 2147547792, 25942, 0,
    2147547793, 26228, 0, 2147547794, 26391, 0, 2147547795, 26395, 0, 2147547796, 26454, 0, 2147547797, 27513, 0, 2147547798, 27578, 0,
    2147547799, 27969, 0, 2147547800, 28379, 0, 2147547801, 28363, 0, 2147547802, 28450, 0, 2147547803, 28702, 0, 2147547804, 29038, 0,
    2147547805, 30631, 0, 2147547806, 29237, 0, 2147547807, 29359, 0, 2147547808, 29482, 0, 2147547809, 29809, 0, 2147547810, 29958, 0,
    2147547811, 30011, 0, 2147547812, 30237, 0, 2147547813, 30239, 0, 2147547814, 30410, 0, 2147547815, 30427, 0, 2147547816, 30452, 0,
    2147547817, 30538, 0, 2147547818, 30528, 0, 2147547819, 30924, 0, 2147547820, 31409, 0, 2147547821, 31680, 0, 2147547822, 31867, 0,
    2147547823, 32091, 0, 2147547824, 32244, 0, 2147547825, 32574, 0, 2147547826, 32773, 0, 2147547827, 33618, 0, 2147547828, 33775, 0,
    2147547829, 34681, 0, 2147547830, 35137, 0, 2147547831, 35206, 0, 2147547832, 35222, 0, 2147547833, 35519, 0, 2147547834, 35576, 0,
    2147547835, 35531, 0, 2147547836, 35585, 0, 2147547837, 35582, 0, 2147547838, 35565, 0, 2147547839, 35641, 0, 2147547840, 35722, 0,
    2147547841, 36104, 0, 2147547842, 36664, 0, 2147547843, 36978, 0, 2147547844, 37273, 0, 2147547845, 37494, 0, 2147547846, 38524, 0,
    2147547847, 38627, 0, 2147547848, 38742, 0, 2147547849, 38875, 0, 2147547850, 38911, 0, 2147547851, 38923, 0, 2147547852, 38971, 0,
    2147547853, 39698, 0, 2147547854, 40860, 0, 2147547855, 141386, 0, 2147547856, 141380, 0, 2147547857, 144341, 0, 2147547858, 15261, 0,
    2147547859, 16408, 0, 2147547860, 16441, 0, 2147547861, 152137, 0, 2147547862, 154832, 0, 2147547863, 163539, 0, 2147547864, 40771, 0,
    2147547865, 40846, 0, 2147547933, 1497, 1460, 2147547935, 1522, 1463, 2147547946, 1513, 1473, 2147547947, 1513, 1474, 2147547948, 64329, 1473,
    2147547949, 64329, 1474, 2147547950, 1488, 1463, 2147547951, 1488, 1464, 2147547952, 1488, 1468, 2147547953, 1489, 1468, 2147547954, 1490, 1468,
    2147547955, 1491, 1468, 2147547956, 1492, 1468, 2147547957, 1493, 1468, 2147547958, 1494, 1468, 2147547960, 1496, 1468, 2147547961, 1497, 1468,
    2147547962, 1498, 1468, 2147547963, 1499, 1468, 2147547964, 1500, 1468, 2147547966, 1502, 1468, 2147547968, 1504, 1468, 2147547969, 1505, 1468,
    2147547971, 1507, 1468, 2147547972, 1508, 1468, 2147547974, 1510, 1468, 2147547975, 1511, 1468, 2147547976, 1512, 1468, 2147547977, 1513, 1468,
    2147547978, 1514, 1468, 2147547979, 1493, 1465, 2147547980, 1489, 1471, 2147547981, 1499, 1471, 2147547982, 1508, 1471, 67017, 67026, 775,
    67044, 67034, 775, 69786, 69785, 69818, 69788, 69787, 69818, 69803, 69797, 69818, 69934, 69937, 69927, 69935, 69938, 69927,
    70475, 70471, 70462, 70476, 70471, 70487, 70531, 70530, 70601, 70533, 70532, 70587, 70542, 70539, 70594, 70545, 70544, 70601,
    70597, 70594, 70594, 70599, 70594, 70584, 70600, 70594, 70601, 70843, 70841, 70842, 70844, 70841, 70832, 70846, 70841, 70845,
    71098, 71096, 71087, 71099, 71097, 71087, 71992, 71989, 71984, 90401, 90398, 90398, 90402, 90398, 90409, 90403, 90398, 90399,
    90404, 90409, 90399, 90405, 90398, 90400, 90406, 90401, 90399, 90407, 90402, 90399, 90408, 90401, 90400, 93544, 93543, 93543,
    93545, 93539, 93543, 93546, 93545, 93543, 2147602782, 119127, 119141, 2147602783, 119128, 119141, 2147602784, 119135, 119150, 2147602785, 119135, 119151,
    2147602786, 119135, 119152, 2147602787, 119135, 119153, 2147602788, 119135, 119154, 2147602875, 119225, 119141, 2147602876, 119226, 119141, 2147602877, 119227, 119150,
    2147602878, 119228, 119150, 2147602879, 119227, 119151, 2147602880, 119228, 119151, 2147678208, 20029, 0, 2147678209, 20024, 0, 2147678210, 20033, 0,
    2147678211, 131362, 0, 2147678212, 20320, 0, 2147678213, 20398, 0, 2147678214, 20411, 0, 2147678215, 20482, 0, 2147678216, 20602, 0,
    2147678217, 20633, 0, 2147678218, 20711, 0, 2147678219, 20687, 0, 2147678220, 13470, 0, 2147678221, 132666, 0, 2147678222, 20813, 0,
    2147678223, 20820, 0, 2147678224, 20836, 0, 2147678225, 20855, 0, 2147678226, 132380, 0, 2147678227, 13497, 0, 2147678228, 20839, 0,
    2147678229, 20877, 0, 2147678230, 132427, 0, 2147678231, 20887, 0, 2147678232, 20900, 0, 2147678233, 20172, 0, 2147678234, 20908, 0,
    2147678235, 20917, 0, 2147678236, 168415, 0, 2147678237, 20981, 0, 2147678238, 20995, 0, 2147678239, 13535, 0, 2147678240, 21051, 0,
    2147678241, 21062, 0, 2147678242, 21106, 0, 2147678243, 21111, 0, 2147678244, 13589, 0, 2147678245, 21191, 0, 2147678246, 21193, 0,
    2147678247, 21220, 0, 2147678248, 21242, 0, 2147678249, 21253, 0, 2147678250, 21254, 0, 2147678251, 21271, 0, 2147678252, 21321, 0,
    2147678253, 21329, 0, 2147678254, 21338, 0, 2147678255, 21363, 0, 2147678256, 21373, 0, 2147678257, 21375, 0, 2147678258, 21375, 0,
    2147678259, 21375, 0, 2147678260, 133676, 0, 2147678261, 28784, 0, 2147678262, 21450, 0, 2147678263, 21471, 0, 2147678264, 133987, 0,
    2147678265, 21483, 0, 2147678266, 21489, 0, 2147678267, 21510, 0, 2147678268, 21662, 0, 2147678269, 21560, 0, 2147678270, 21576, 0,
    2147678271, 21608, 0, 2147678272, 21666, 0, 2147678273, 21750, 0, 2147678274, 21776, 0, 2147678275, 21843, 0, 2147678276, 21859, 0,
    2147678277, 21892, 0, 2147678278, 21892, 0, 2147678279, 21913, 0, 2147678280, 21931, 0, 2147678281, 21939, 0, 2147678282, 21954, 0,
    2147678283, 22294, 0, 2147678284, 22022, 0, 2147678285, 22295, 0, 2147678286, 22097, 0, 2147678287, 22132, 0, 2147678288, 20999, 0,
    2147678289, 22766, 0, 2147678290, 22478, 0, 2147678291, 22516, 0, 2147678292, 22541, 0, 2147678293, 22411, 0, 2147678294, 22578, 0,
    2147678295, 22577, 0, 2147678296, 22700, 0, 2147678297, 136420, 0, 2147678298, 22770, 0, 2147678299, 22775, 0, 2147678300, 22790, 0,
    2147678301, 22810, 0, 2147678302, 22818, 0, 2147678303, 22882, 0, 2147678304, 136872, 0, 2147678305, 136938, 0, 2147678306, 23020, 0,
    2147678307, 23067, 0, 2147678308, 23079, 0, 2147678309, 23000, 0, 2147678310, 23142, 0, 2147678311, 14062, 0, 2147678312, 14076, 0,
    2147678313, 23304, 0, 2147678314, 23358, 0, 2147678315, 23358, 0, 2147678316, 137672, 0, 2147678317, 23491, 0, 2147678318, 23512, 0,
    2147678319, 23527, 0, 2147678320, 23539, 0, 2147678321, 138008, 0, 2147678322, 23551, 0, 2147678323, 23558, 0, 2147678324, 24403, 0,
    2147678325, 23586, 0, 2147678326, 14209, 0, 2147678327, 23648, 0, 2147678328, 23662, 0, 2147678329, 23744, 0, 2147678330, 23693, 0,
    2147678331, 138724, 0, 2147678332, 23875, 0, 2147678333, 138726, 0, 2147678334, 23918, 0, 2147678335, 23915, 0, 2147678336, 23932, 0,
    2147678337, 24033, 0, 2147678338, 24034, 0, 2147678339, 14383, 0, 2147678340, 24061, 0, 2147678341, 24104, 0, 2147678342, 24125, 0,
    2147678343, 24169, 0, 2147678344, 14434, 0, 2147678345, 139651, 0, 2147678346, 14460, 0, 2147678347, 24240, 0, 2147678348, 24243, 0,
    2147678349, 24246, 0, 2147678350, 24266, 0, 2147678351, 172946, 0, 2147678352, 24318, 0, 2147678353, 140081, 0, 2147678354, 140081, 0,
    2147678355, 33281, 0, 2147678356, 24354, 0, 2147678357, 24354, 0, 2147678358, 14535, 0, 2147678359, 144056, 0, 2147678360, 156122, 0,
    2147678361, 24418, 0, 2147678362, 24427, 0, 2147678363, 14563, 0, 2147678364, 24474, 0, 2147678365, 24525, 0, 2147678366, 24535, 0,
    2147678367, 24569, 0, 2147678368, 24705, 0, 2147678369, 14650, 0, 2147678370, 14620, 0, 2147678371, 24724, 0, 2147678372, 141012, 0,
    2147678373, 24775, 0, 2147678374, 24904, 0, 2147678375, 24908, 0, 2147678376, 24910, 0, 2147678377, 24908, 0, 2147678378, 24954, 0,
    2147678379, 24974, 0, 2147678380, 25010, 0, 2147678381, 24996, 0, 2147678382, 25007, 0, 2147678383, 25054, 0, 2147678384, 25074, 0,
    2147678385, 25078, 0, 2147678386, 25104, 0, 2147678387, 25115, 0, 2147678388, 25181, 0, 2147678389, 25265, 0, 2147678390, 25300, 0,
    2147678391, 25424, 0, 2147678392, 142092, 0, 2147678393, 25405, 0, 2147678394, 25340, 0, 2147678395, 25448, 0, 2147678396, 25475, 0,
    2147678397, 25572, 0, 2147678398, 142321, 0, 2147678399, 25634, 0, 2147678400, 25541, 0, 2147678401, 25513, 0, 2147678402, 14894, 0,
    2147678403, 25705, 0, 2147678404, 25726, 0, 2147678405, 25757, 0, 2147678406, 25719, 0, 2147678407, 14956, 0, 2147678408, 25935, 0,
    2147678409, 25964, 0, 2147678410, 143370, 0, 2147678411, 26083, 0, 2147678412, 26360, 0, 2147678413, 26185, 0, 2147678414, 15129, 0,
    2147678415, 26257, 0, 2147678416, 15112, 0, 2147678417, 15076, 0, 2147678418, 20882, 0, 2147678419, 20885, 0, 2147678420, 26368, 0,
    2147678421, 26268, 0, 2147678422, 32941, 0, 2147678423, 17369, 0, 2147678424, 26391, 0, 2147678425, 26395, 0, 2147678426, 26401, 0,
    2147678427, 26462, 0, 2147678428, 26451, 0, 2147678429, 144323, 0, 2147678430, 15177, 0, 2147678431, 26618, 0, 2147678432, 26501, 0,
    2147678433, 26706, 0, 2147678434, 26757, 0, 2147678435, 144493, 0, 2147678436, 26766, 0, 2147678437, 26655, 0, 2147678438, 26900, 0,
    2147678439, 15261, 0, 2147678440, 26946, 0, 2147678441, 27043, 0, 2147678442, 27114, 0, 2147678443, 27304, 0, 2147678444, 145059, 0,
    2147678445, 27355, 0, 2147678446, 15384, 0, 2147678447, 27425, 0, 2147678448, 145575, 0, 2147678449, 27476, 0, 2147678450, 15438, 0,
    2147678451, 27506, 0, 2147678452, 27551, 0, 2147678453, 27578, 0, 2147678454, 27579, 0, 2147678455, 146061, 0, 2147678456, 138507, 0,
    2147678457, 146170, 0, 2147678458, 27726, 0, 2147678459, 146620, 0, 2147678460, 27839, 0, 2147678461, 27853, 0, 2147678462, 27751, 0,
    2147678463, 27926, 0, 2147678464, 27966, 0, 2147678465, 28023, 0, 2147678466, 27969, 0, 2147678467, 28009, 0, 2147678468, 28024, 0,
    2147678469, 28037, 0, 2147678470, 146718, 0, 2147678471, 27956, 0, 2147678472, 28207, 0, 2147678473, 28270, 0, 2147678474, 15667, 0,
    2147678475, 28363, 0, 2147678476, 28359, 0, 2147678477, 147153, 0, 2147678478, 28153, 0, 2147678479, 28526, 0, 2147678480, 147294, 0,
    2147678481, 147342, 0, 2147678482, 28614, 0, 2147678483, 28729, 0, 2147678484, 28702, 0, 2147678485, 28699, 0, 2147678486, 15766, 0,
    2147678487, 28746, 0, 2147678488, 28797, 0, 2147678489, 28791, 0, 2147678490, 28845, 0, 2147678491, 132389, 0, 2147678492, 28997, 0,
    2147678493, 148067, 0, 2147678494, 29084, 0, 2147678495, 148395, 0, 2147678496, 29224, 0, 2147678497, 29237, 0, 2147678498, 29264, 0,
    2147678499, 149000, 0, 2147678500, 29312, 0, 2147678501, 29333, 0, 2147678502, 149301, 0, 2147678503, 149524, 0, 2147678504, 29562, 0,
    2147678505, 29579, 0, 2147678506, 16044, 0, 2147678507, 29605, 0, 2147678508, 16056, 0, 2147678509, 16056, 0, 2147678510, 29767, 0,
    2147678511, 29788, 0, 2147678512, 29809, 0, 2147678513, 29829, 0, 2147678514, 29898, 0, 2147678515, 16155, 0, 2147678516, 29988, 0,
    2147678517, 150582, 0, 2147678518, 30014, 0, 2147678519, 150674, 0, 2147678520, 30064, 0, 2147678521, 139679, 0, 2147678522, 30224, 0,
    2147678523, 151457, 0, 2147678524, 151480, 0, 2147678525, 151620, 0, 2147678526, 16380, 0, 2147678527, 16392, 0, 2147678528, 30452, 0,
    2147678529, 151795, 0, 2147678530, 151794, 0, 2147678531, 151833, 0, 2147678532, 151859, 0, 2147678533, 30494, 0, 2147678534, 30495, 0,
    2147678535, 30495, 0, 2147678536, 30538, 0, 2147678537, 16441, 0, 2147678538, 30603, 0, 2147678539, 16454, 0, 2147678540, 16534, 0,
    2147678541, 152605, 0, 2147678542, 30798, 0, 2147678543, 30860, 0, 2147678544, 30924, 0, 2147678545, 16611, 0, 2147678546, 153126, 0,
    2147678547, 31062, 0, 2147678548, 153242, 0, 2147678549, 153285, 0, 2147678550, 31119, 0, 2147678551, 31211, 0, 2147678552, 16687, 0,
    2147678553, 31296, 0, 2147678554, 31306, 0, 2147678555, 31311, 0, 2147678556, 153980, 0, 2147678557, 154279, 0, 2147678558, 154279, 0,
    2147678559, 31470, 0, 2147678560, 16898, 0, 2147678561, 154539, 0, 2147678562, 31686, 0, 2147678563, 31689, 0, 2147678564, 16935, 0,
    2147678565, 154752, 0, 2147678566, 31954, 0, 2147678567, 17056, 0, 2147678568, 31976, 0, 2147678569, 31971, 0, 2147678570, 32000, 0,
    2147678571, 155526, 0, 2147678572, 32099, 0, 2147678573, 17153, 0, 2147678574, 32199, 0, 2147678575, 32258, 0, 2147678576, 32325, 0,
    2147678577, 17204, 0, 2147678578, 156200, 0, 2147678579, 156231, 0, 2147678580, 17241, 0, 2147678581, 156377, 0, 2147678582, 32634, 0,
    2147678583, 156478, 0, 2147678584, 32661, 0, 2147678585, 32762, 0, 2147678586, 32773, 0, 2147678587, 156890, 0, 2147678588, 156963, 0,
    2147678589, 32864, 0, 2147678590, 157096, 0, 2147678591, 32880, 0, 2147678592, 144223, 0, 2147678593, 17365, 0, 2147678594, 32946, 0,
    2147678595, 33027, 0, 2147678596, 17419, 0, 2147678597, 33086, 0, 2147678598, 23221, 0, 2147678599, 157607, 0, 2147678600, 157621, 0,
    2147678601, 144275, 0, 2147678602, 144284, 0, 2147678603, 33281, 0, 2147678604, 33284, 0, 2147678605, 36766, 0, 2147678606, 17515, 0,
    2147678607, 33425, 0, 2147678608, 33419, 0, 2147678609, 33437, 0, 2147678610, 21171, 0, 2147678611, 33457, 0, 2147678612, 33459, 0,
    2147678613, 33469, 0, 2147678614, 33510, 0, 2147678615, 158524, 0, 2147678616, 33509, 0, 2147678617, 33565, 0, 2147678618, 33635, 0,
    2147678619, 33709, 0, 2147678620, 33571, 0, 2147678621, 33725, 0, 2147678622, 33767, 0, 2147678623, 33879, 0, 2147678624, 33619, 0,
    2147678625, 33738, 0, 2147678626, 33740, 0, 2147678627, 33756, 0, 2147678628, 158774, 0, 2147678629, 159083, 0, 2147678630, 158933, 0,
    2147678631, 17707, 0, 2147678632, 34033, 0, 2147678633, 34035, 0, 2147678634, 34070, 0, 2147678635, 160714, 0, 2147678636, 34148, 0,
    2147678637, 159532, 0, 2147678638, 17757, 0, 2147678639, 17761, 0, 2147678640, 159665, 0, 2147678641, 159954, 0, 2147678642, 17771, 0,
    2147678643, 34384, 0, 2147678644, 34396, 0, 2147678645, 34407, 0, 2147678646, 34409, 0, 2147678647, 34473, 0, 2147678648, 34440, 0,
    2147678649, 34574, 0, 2147678650, 34530, 0, 2147678651, 34681, 0, 2147678652, 34600, 0, 2147678653, 34667, 0, 2147678654, 34694, 0,
    2147678655, 17879, 0, 2147678656, 34785, 0, 2147678657, 34817, 0, 2147678658, 17913, 0, 2147678659, 34912, 0, 2147678660, 34915, 0,
    2147678661, 161383, 0, 2147678662, 35031, 0, 2147678663, 35038, 0, 2147678664, 17973, 0, 2147678665, 35066, 0, 2147678666, 13499, 0,
    2147678667, 161966, 0, 2147678668, 162150, 0, 2147678669, 18110, 0, 2147678670, 18119, 0, 2147678671, 35488, 0, 2147678672, 35565, 0,
    2147678673, 35722, 0, 2147678674, 35925, 0, 2147678675, 162984, 0, 2147678676, 36011, 0, 2147678677, 36033, 0, 2147678678, 36123, 0,
    2147678679, 36215, 0, 2147678680, 163631, 0, 2147678681, 133124, 0, 2147678682, 36299, 0, 2147678683, 36284, 0, 2147678684, 36336, 0,
    2147678685, 133342, 0, 2147678686, 36564, 0, 2147678687, 36664, 0, 2147678688, 165330, 0, 2147678689, 165357, 0, 2147678690, 37012, 0,
    2147678691, 37105, 0, 2147678692, 37137, 0, 2147678693, 165678, 0, 2147678694, 37147, 0, 2147678695, 37432, 0, 2147678696, 37591, 0,
    2147678697, 37592, 0, 2147678698, 37500, 0, 2147678699, 37881, 0, 2147678700, 37909, 0, 2147678701, 166906, 0, 2147678702, 38283, 0,
    2147678703, 18837, 0, 2147678704, 38327, 0, 2147678705, 167287, 0, 2147678706, 18918, 0, 2147678707, 38595, 0, 2147678708, 23986, 0,
    2147678709, 38691, 0, 2147678710, 168261, 0, 2147678711, 168474, 0, 2147678712, 19054, 0, 2147678713, 19062, 0, 2147678714, 38880, 0,
    2147678715, 168970, 0, 2147678716, 19122, 0, 2147678717, 169110, 0, 2147678718, 38923, 0, 2147678719, 38923, 0, 2147678720, 38953, 0,
    2147678721, 169398, 0, 2147678722, 39138, 0, 2147678723, 19251, 0, 2147678724, 39209, 0, 2147678725, 39335, 0, 2147678726, 39362, 0,
    2147678727, 39422, 0, 2147678728, 19406, 0, 2147678729, 170800, 0, 2147678730, 39698, 0, 2147678731, 40000, 0, 2147678732, 40189, 0,
    2147678733, 19662, 0, 2147678734, 19693, 0, 2147678735, 40295, 0, 2147678736, 172238, 0, 2147678737, 19704, 0, 2147678738, 172293, 0,
    2147678739, 172558, 0, 2147678740, 172689, 0, 2147678741, 40635, 0, 2147678742, 19798, 0, 2147678743, 40697, 0, 2147678744, 40702, 0,
    2147678745, 40709, 0, 2147678746, 40719, 0, 2147678747, 40726, 0, 2147678748, 40763, 0, 2147678749, 173568, 0,
};
// END GENERATED: unicode tables

/* The row of a generated table (rows of `stride` values starting lo, hi, sorted by lo) whose inclusive
 * range [lo, hi] holds cp, or NULL. */
static const uint32_t *dllm__uc_find(const uint32_t *table, size_t n_values, size_t stride, uint32_t cp) {
    size_t lo = 0, hi = n_values / stride;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp > table[stride * mid + 1]) lo = mid + 1;
        else hi = mid;
    }
    return lo < n_values / stride && cp >= table[stride * lo] ? table + stride * lo : nullptr;
}

#define DLLM__UC_IN(table, cp) (dllm__uc_find(table, sizeof(table) / sizeof(table[0]), 2, cp) != nullptr)

static bool dllm__is_letter(uint32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return DLLM__UC_IN(dllm__uc_letter, cp);
}

static bool dllm__is_number(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return DLLM__UC_IN(dllm__uc_number, cp);
}

static bool dllm__is_space(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    return DLLM__UC_IN(dllm__uc_space, cp);
}

static int dllm__ccc(uint32_t cp) {
    if (cp < 0x300) return 0;
    const uint32_t *row = dllm__uc_find(dllm__uc_ccc, sizeof(dllm__uc_ccc) / sizeof(dllm__uc_ccc[0]), 3, cp);
    return row ? (int)row[2] : 0;
}

// ---- UTF-8 -----------------------------------------------------------------------------------------

/* Decodes the code point at s[0..n), n >= 1, and returns the bytes it spans. An ill-formed sequence
 * yields U+FFFD over its maximal subpart (Unicode's recommended practice, which Python's
 * errors="replace" and Rust's from_utf8_lossy follow), so "\xE2\x82" is one U+FFFD, "\xFF" one each. */
static size_t dllm__utf8_next(const uint8_t *s, size_t n, uint32_t &cp) {
    uint8_t b = s[0];
    if (b < 0x80) { cp = b; return 1; }
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) { len = 2; cp = b & 0x1F; }
    else if (b >= 0xE0 && b <= 0xEF) { len = 3; cp = b & 0x0F; if (b == 0xE0) lo = 0xA0; if (b == 0xED) hi = 0x9F; }
    else if (b >= 0xF0 && b <= 0xF4) { len = 4; cp = b & 0x07; if (b == 0xF0) lo = 0x90; if (b == 0xF4) hi = 0x8F; }
    else { cp = 0xFFFD; return 1; }
    for (size_t i = 1; i < len; i++) {
        if (i >= n || s[i] < lo || s[i] > hi) { cp = 0xFFFD; return i; }
        cp = (cp << 6) | (s[i] & 0x3F);
        lo = 0x80, hi = 0xBF;
    }
    return len;
}

static void dllm__utf8_put(std::string &s, uint32_t cp) { dllm__json_parser::put_utf8(s, cp); }

/* The code points of UTF-8 text, ill-formed sequences replaced by U+FFFD. */
static void dllm__utf8_decode(const std::string &text, std::vector<uint32_t> &cps) {
    cps.clear();
    const uint8_t *s = (const uint8_t *)text.data();
    for (size_t i = 0; i < text.size();) {
        uint32_t cp;
        i += dllm__utf8_next(s + i, text.size() - i, cp);
        cps.push_back(cp);
    }
}

static std::string dllm__utf8_encode(const uint32_t *cps, size_t n) {
    std::string s;
    for (size_t i = 0; i < n; i++) dllm__utf8_put(s, cps[i]);
    return s;
}

/* Valid UTF-8 of bytes: each ill-formed sequence replaced by U+FFFD (well-formed ones re-encode to
 * the same bytes). */
static std::string dllm__utf8_sanitize(const char *data, size_t n) {
    std::string out;
    out.reserve(n);
    const uint8_t *s = (const uint8_t *)data;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += dllm__utf8_next(s + i, n - i, cp);
        dllm__utf8_put(out, cp);
    }
    return out;
}

// ---- NFC (UAX #15: canonical decomposition, canonical ordering, canonical composition) ---------------

enum { DLLM__HANGUL_S = 0xAC00, DLLM__HANGUL_L = 0x1100, DLLM__HANGUL_V = 0x1161, DLLM__HANGUL_T = 0x11A7,
       DLLM__HANGUL_V_COUNT = 21, DLLM__HANGUL_T_COUNT = 28, DLLM__HANGUL_N = 21 * 28, DLLM__HANGUL_COUNT = 19 * 21 * 28 };

struct dllm__nfc_tables {
    std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> decomp;  // code point -> (first, second or 0)
    std::unordered_map<uint64_t, uint32_t> compose;                      // (first << 32 | second) -> composite

    dllm__nfc_tables() {
        const size_t n = sizeof(dllm__uc_decomp) / sizeof(dllm__uc_decomp[0]);
        for (size_t i = 0; i < n; i += 3) {
            uint32_t cp = dllm__uc_decomp[i] & 0x7FFFFFFFu, a = dllm__uc_decomp[i + 1], b = dllm__uc_decomp[i + 2];
            bool excluded = (dllm__uc_decomp[i] >> 31) != 0;
            decomp[cp] = {a, b};
            if (!excluded && b) compose[(uint64_t)a << 32 | b] = cp;
        }
    }
};

static const dllm__nfc_tables &dllm__nfc_data() {
    static const dllm__nfc_tables tables;  // built once, thread-safe (C++11 static initialisation)
    return tables;
}

static void dllm__decompose(uint32_t cp, std::vector<uint32_t> &out) {
    if (cp >= DLLM__HANGUL_S && cp < DLLM__HANGUL_S + DLLM__HANGUL_COUNT) {
        uint32_t s = cp - DLLM__HANGUL_S;
        out.push_back(DLLM__HANGUL_L + s / DLLM__HANGUL_N);
        out.push_back(DLLM__HANGUL_V + (s % DLLM__HANGUL_N) / DLLM__HANGUL_T_COUNT);
        if (s % DLLM__HANGUL_T_COUNT) out.push_back(DLLM__HANGUL_T + s % DLLM__HANGUL_T_COUNT);
        return;
    }
    const auto &d = dllm__nfc_data().decomp;
    auto it = cp < 0xC0 ? d.end() : d.find(cp);
    if (it == d.end()) { out.push_back(cp); return; }
    dllm__decompose(it->second.first, out);
    if (it->second.second) dllm__decompose(it->second.second, out);
}

static uint32_t dllm__compose_pair(uint32_t a, uint32_t b) {
    if (a >= DLLM__HANGUL_L && a < DLLM__HANGUL_L + 19 && b >= DLLM__HANGUL_V && b < DLLM__HANGUL_V + DLLM__HANGUL_V_COUNT)
        return DLLM__HANGUL_S + ((a - DLLM__HANGUL_L) * DLLM__HANGUL_V_COUNT + (b - DLLM__HANGUL_V)) * DLLM__HANGUL_T_COUNT;
    if (a >= DLLM__HANGUL_S && a < DLLM__HANGUL_S + DLLM__HANGUL_COUNT && (a - DLLM__HANGUL_S) % DLLM__HANGUL_T_COUNT == 0 &&
        b > DLLM__HANGUL_T && b < DLLM__HANGUL_T + DLLM__HANGUL_T_COUNT)
        return a + (b - DLLM__HANGUL_T);
    const auto &c = dllm__nfc_data().compose;
    auto it = c.find((uint64_t)a << 32 | b);
    return it == c.end() ? 0 : it->second;
}

/* NFC of valid UTF-8. Text that is all ASCII is already NFC. */
static std::string dllm__nfc(const std::string &text) {
    bool ascii = true;
    for (char ch : text) ascii = ascii && (unsigned char)ch < 0x80;
    if (ascii) return text;
    std::vector<uint32_t> cps, d;
    dllm__utf8_decode(text, cps);
    for (uint32_t cp : cps) dllm__decompose(cp, d);
    // Canonical ordering: a stable sort of each run of non-starters by combining class.
    for (size_t i = 1; i < d.size(); i++) {
        int c = dllm__ccc(d[i]);
        for (size_t j = i; c && j > 0 && dllm__ccc(d[j - 1]) > c; j--) std::swap(d[j - 1], d[j]);
    }
    // Canonical composition (the reference algorithm of UAX #15): a character joins the last starter
    // unless a character of equal or higher class stands between them; 256 blocks a leading non-starter.
    if (d.empty()) return std::string();
    size_t starter = 0, kept = 1;
    int last_class = dllm__ccc(d[0]) ? 256 : 0;
    for (size_t i = 1; i < d.size(); i++) {
        int c = dllm__ccc(d[i]);
        uint32_t composite = last_class < c || last_class == 0 ? dllm__compose_pair(d[starter], d[i]) : 0;
        if (composite) {
            d[starter] = composite;
            continue;
        }
        if (c == 0) starter = kept;
        last_class = c;
        d[kept++] = d[i];
    }
    return dllm__utf8_encode(d.data(), kept);
}

// ---- Pre-tokenizer: the split regexes, as scanners --------------------------------------------------
// HF runs these patterns with Oniguruma: at each position the alternatives are tried left to right and
// the first that matches wins (not the longest); matches never overlap. The Ling pattern differs from
// Qwen2's only in spelling (possessive quantifiers and `\s*[\r\n]` give the same matches here), and every
// code point is a letter, a number, whitespace or "other", so the alternatives always cover the text.

enum dllm__pretok_kind { DLLM__PRETOK_GPT2, DLLM__PRETOK_LLAMA3, DLLM__PRETOK_QWEN2, DLLM__PRETOK_LING };

static const struct {
    dllm__pretok_kind kind;
    const char *regex;  // exactly as in tokenizer.json, after JSON unescaping
} dllm__pretok_patterns[] = {
    {DLLM__PRETOK_GPT2, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
    {DLLM__PRETOK_LLAMA3, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {DLLM__PRETOK_QWEN2, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {DLLM__PRETOK_LING, "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"},
};

/* Does c (at i) match the ASCII letter `lower`, case-insensitively if asked? Oniguruma folds case
 * with Unicode's CaseFolding, where U+017F LATIN SMALL LETTER LONG S folds to 's'. */
static bool dllm__ci_letter(const std::vector<uint32_t> &c, size_t i, char lower, bool ignore_case) {
    if (i >= c.size()) return false;
    if (c[i] == (uint32_t)lower) return true;
    return ignore_case && (c[i] == (uint32_t)(lower - 32) || (lower == 's' && c[i] == 0x17F));
}

/* Length of the contraction suffix ('s 't 're 've 'm 'll 'd without the apostrophe) at c[i], or 0. */
static size_t dllm__contraction(const std::vector<uint32_t> &c, size_t i, bool ic) {
    for (char one : {'s', 't', 'm', 'd'})
        if (dllm__ci_letter(c, i, one, ic)) return 1;
    static const char two[][3] = {"re", "ve", "ll"};
    for (const char *t : two)
        if (dllm__ci_letter(c, i, t[0], ic) && dllm__ci_letter(c, i + 1, t[1], ic)) return 2;
    return 0;
}

/* The end of the pre-token that starts at c[i]. */
static size_t dllm__pretok_next(dllm__pretok_kind kind, const std::vector<uint32_t> &c, size_t i) {
    const size_t n = c.size();
    const bool gpt2 = kind == DLLM__PRETOK_GPT2;
    auto letter = [&](size_t k) { return k < n && dllm__is_letter(c[k]); };
    auto number = [&](size_t k) { return k < n && dllm__is_number(c[k]); };
    auto space = [&](size_t k) { return k < n && dllm__is_space(c[k]); };
    auto other = [&](size_t k) { return k < n && !dllm__is_letter(c[k]) && !dllm__is_number(c[k]) && !dllm__is_space(c[k]); };
    auto newline = [&](size_t k) { return k < n && (c[k] == '\r' || c[k] == '\n'); };
    auto run = [&](size_t k, const auto &in) { while (in(k)) k++; return k; };

    if (c[i] == '\'') {  // 's|'t|'re|'ve|'m|'ll|'d, case-insensitive except in GPT-2's pattern
        size_t len = dllm__contraction(c, i + 1, !gpt2);
        if (len) return i + 1 + len;
    }
    if (gpt2) {  // ' ?\p{L}+| ?\p{N}+'
        size_t j = i + (c[i] == ' ');
        if (letter(j)) return run(j, letter);
        if (number(j)) return run(j, number);
    } else {  // '[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}' (Llama-3) or '|\p{N}' (Qwen2, Ling)
        if (letter(i)) return run(i, letter);
        if (!newline(i) && !number(i) && letter(i + 1)) return run(i + 1, letter);
        if (number(i)) {
            size_t max_digits = kind == DLLM__PRETOK_LLAMA3 ? 3 : 1, k = i;
            while (k - i < max_digits && number(k)) k++;
            return k;
        }
    }
    size_t j = i + (c[i] == ' ');  // ' ?[^\s\p{L}\p{N}]+', then '[\r\n]*' except in GPT-2's pattern
    if (other(j)) {
        size_t k = run(j, other);
        return gpt2 ? k : run(k, newline);
    }
    // c[i] is whitespace. '\s*[\r\n]+' ends at the last newline of the run (greedy \s* backtracks to it).
    size_t end = run(i, space);
    if (!gpt2)
        for (size_t k = end; k > i; k--)
            if (newline(k - 1)) return k;
    // '\s+(?!\S)' keeps the whole run at the end of the text, else leaves its last character to the
    // next token (when that leaves nothing, '\s+' takes the single character).
    return end == n || end - i == 1 ? end : end - 1;
}

/* Splits NFC'd text into pre-tokens (byte ranges). */
static void dllm__pretokenize(dllm__pretok_kind kind, const std::string &text, std::vector<std::pair<size_t, size_t>> &out) {
    std::vector<uint32_t> c;
    dllm__utf8_decode(text, c);
    std::vector<size_t> offset(c.size() + 1, 0);
    for (size_t i = 0; i < c.size(); i++) offset[i + 1] = offset[i] + (c[i] < 0x80 ? 1 : c[i] < 0x800 ? 2 : c[i] < 0x10000 ? 3 : 4);
    for (size_t i = 0; i < c.size();) {
        size_t end = dllm__pretok_next(kind, c, i);
        out.push_back({offset[i], offset[end]});
        i = end;
    }
}

// ---- The tokenizer ----------------------------------------------------------------------------------

struct dllm__added_token {
    std::string content;
    int32_t id = -1;
    bool special = false, lstrip = false, rstrip = false, normalized = false;
};

/* Byte trie over added-token contents, for leftmost-longest matching (HF uses Aho-Corasick with
 * MatchKind::LeftmostLongest: the earliest start wins, then the longest token there). */
struct dllm__trie {
    std::vector<int32_t> token = {-1};                // node -> index in dllm_tokenizer::added, or -1
    std::unordered_map<uint64_t, int32_t> children;  // (node << 8 | byte) -> node

    void insert(const std::string &s, int32_t index) {
        int32_t node = 0;
        for (unsigned char b : s) {
            auto it = children.find((uint64_t)node << 8 | b);
            if (it == children.end()) {
                it = children.emplace((uint64_t)node << 8 | b, (int32_t)token.size()).first;
                token.push_back(-1);
            }
            node = it->second;
        }
        token[(size_t)node] = index;
    }
    /* The longest token starting at text[pos]: its index (or -1) and length. */
    int32_t longest(const std::string &text, size_t pos, size_t &len) const {
        int32_t node = 0, best = -1;
        for (size_t k = pos; k < text.size(); k++) {
            auto it = children.find((uint64_t)node << 8 | (unsigned char)text[k]);
            if (it == children.end()) break;
            node = it->second;
            if (token[(size_t)node] >= 0) { best = token[(size_t)node]; len = k + 1 - pos; }
        }
        return best;
    }
};

enum { DLLM__BPE_CACHE_MAX = 1 << 16, DLLM__BPE_CACHE_PIECE = 256 };

}  // namespace
struct dllm_tokenizer {
    std::string dir;
    std::unordered_map<std::string, int32_t> vocab;               // BPE vocabulary (byte-mapped strings)
    std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged id)
    std::vector<dllm__added_token> added;
    std::unordered_map<std::string, int32_t> added_ids;           // content -> id
    dllm__trie raw_trie, normalized_trie;                         // added tokens matched before / after NFC
    std::vector<std::string> piece;                               // id -> bytes it decodes to
    std::vector<uint8_t> has_token, is_special;                   // per id
    int32_t byte_id[256];                                         // id of each single-byte symbol, or -1
    uint32_t byte_char[256];                                      // GPT-2 bytes_to_unicode
    int32_t n_vocab = 0;
    bool nfc = false, ignore_merges = false, fuse_unk = false;
    int32_t unk_id = -1;
    dllm__pretok_kind pretok = DLLM__PRETOK_QWEN2;
    dllm_chat_template chat = DLLM_CHAT_NONE;
    std::string bos_token;                                        // for the LLaDA template
    mutable std::mutex cache_mutex;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache;  // pre-token bytes -> ids
};
namespace {

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes map to
 * U+0100.. in increasing order, so every byte is a visible character in vocab strings. */
static void dllm__byte_chars(uint32_t out[256]) {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        out[b] = printable ? b : next++;
    }
}

/* The bytes a token string stands for, by HF's ByteLevel decoder: each character through the inverse
 * byte map, or, if any character is outside it, the token's own UTF-8. */
static std::string dllm__token_bytes(const dllm_tokenizer &t, const std::string &token) {
    std::vector<uint32_t> cps;
    dllm__utf8_decode(token, cps);
    std::string bytes;
    for (uint32_t cp : cps) {
        const uint32_t *hit = cp < 324 ? std::find(t.byte_char, t.byte_char + 256, cp) : t.byte_char + 256;
        if (hit == t.byte_char + 256) return token;
        bytes += (char)(hit - t.byte_char);
    }
    return bytes;
}

/* BPE of one pre-token (raw bytes), as HF's Word::merge_all: repeatedly apply the lowest-ranked merge,
 * leftmost first among equal ranks, with a heap of candidate pairs that are re-checked when popped. */
static void dllm__bpe_merge(const dllm_tokenizer &t, const std::string &bytes, std::vector<int32_t> &out) {
    struct symbol { int32_t id; int prev, next; };
    std::vector<symbol> sym;
    for (unsigned char b : bytes) {
        int32_t id = t.byte_id[b];
        if (id < 0) {  // a byte the vocabulary lacks: HF uses unk (fused if asked) or drops it
            if (t.unk_id < 0 || (t.fuse_unk && !sym.empty() && sym.back().id == t.unk_id)) continue;
            id = t.unk_id;
        }
        sym.push_back({id, (int)sym.size() - 1, (int)sym.size() + 1});
    }
    if (sym.empty()) return;
    sym.back().next = -1;
    struct cand { int32_t rank; int pos; int32_t merged; };
    auto later = [](const cand &a, const cand &b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
    std::vector<cand> heap;
    auto push = [&](int pos) {
        int next = sym[(size_t)pos].next;
        if (next < 0) return;
        auto it = t.merges.find((uint64_t)(uint32_t)sym[(size_t)pos].id << 32 | (uint32_t)sym[(size_t)next].id);
        if (it == t.merges.end()) return;
        heap.push_back({it->second.first, pos, it->second.second});
        std::push_heap(heap.begin(), heap.end(), later);
    };
    for (int i = 0; i + 1 < (int)sym.size(); i++) push(i);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), later);
        cand top = heap.back();
        heap.pop_back();
        symbol &left = sym[(size_t)top.pos];
        if (left.id < 0 || left.next < 0) continue;  // merged away, or now the last symbol
        auto it = t.merges.find((uint64_t)(uint32_t)left.id << 32 | (uint32_t)sym[(size_t)left.next].id);
        if (it == t.merges.end() || it->second.second != top.merged) continue;  // stale candidate
        symbol &right = sym[(size_t)left.next];
        left.id = top.merged;
        left.next = right.next;
        right.id = -1;
        if (left.next >= 0) sym[(size_t)left.next].prev = top.pos;
        if (left.prev >= 0) push(left.prev);
        push(top.pos);
    }
    for (const symbol &s : sym)
        if (s.id >= 0) out.push_back(s.id);
}

/* Ids of one pre-token, through the encode cache. */
static void dllm__bpe(const dllm_tokenizer &t, const std::string &bytes, std::vector<int32_t> &out) {
    bool cacheable = bytes.size() <= DLLM__BPE_CACHE_PIECE;
    if (cacheable) {
        std::lock_guard<std::mutex> lock(t.cache_mutex);
        auto it = t.cache.find(bytes);
        if (it != t.cache.end()) { out.insert(out.end(), it->second.begin(), it->second.end()); return; }
    }
    std::vector<int32_t> ids;
    if (t.ignore_merges) {  // Llama-3: a pre-token that is a whole vocabulary entry is not merged
        std::string mapped;
        for (unsigned char b : bytes) dllm__utf8_put(mapped, t.byte_char[b]);
        auto it = t.vocab.find(mapped);
        if (it != t.vocab.end()) ids.push_back(it->second);
    }
    if (ids.empty()) dllm__bpe_merge(t, bytes, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) {
        std::lock_guard<std::mutex> lock(t.cache_mutex);
        if (t.cache.size() < DLLM__BPE_CACHE_MAX) t.cache.emplace(bytes, std::move(ids));
    }
}

/* The start of the run of whitespace that ends text[0..end). */
static size_t dllm__space_before(const std::string &text, size_t end) {
    while (end > 0) {
        size_t k = end - 1;
        while (k > 0 && ((unsigned char)text[k] & 0xC0) == 0x80) k--;
        uint32_t cp;
        dllm__utf8_next((const uint8_t *)text.data() + k, end - k, cp);
        if (!dllm__is_space(cp)) break;
        end = k;
    }
    return end;
}

/* The end of the run of whitespace that starts at text[begin]. */
static size_t dllm__space_after(const std::string &text, size_t begin) {
    while (begin < text.size()) {
        uint32_t cp;
        size_t len = dllm__utf8_next((const uint8_t *)text.data() + begin, text.size() - begin, cp);
        if (!dllm__is_space(cp)) break;
        begin += len;
    }
    return begin;
}

struct dllm__span {
    int32_t id;  // an added token, or -1 for text still to tokenize
    size_t begin, end;
};

/* HF's AddedVocabulary::find_matches: added tokens cut out of text, with lstrip/rstrip taking the
 * whitespace beside them. A special token skipped because parse_special is off is still consumed by
 * the matcher, as HF's encode_special_tokens does, so no token is found inside it. */
static void dllm__split_added(const dllm_tokenizer &t, const dllm__trie &trie, const std::string &text, bool parse_special,
                              std::vector<dllm__span> &out) {
    size_t done = 0;  // text before this is already in out
    for (size_t pos = 0; pos < text.size();) {
        size_t len = 0;
        int32_t k = trie.longest(text, pos, len);
        if (k < 0) { pos++; continue; }
        const dllm__added_token &a = t.added[(size_t)k];
        size_t begin = pos, end = pos + len;
        pos = end;
        if (a.special && !parse_special) continue;
        if (a.lstrip) begin = std::max(dllm__space_before(text, begin), done);
        if (a.rstrip) pos = end = dllm__space_after(text, end);
        if (begin > done) out.push_back({-1, done, begin});
        out.push_back({a.id, begin, end});
        done = end;
    }
    if (done < text.size()) out.push_back({-1, done, text.size()});
}

/* Pre-tokenizes and BPE-encodes normalised text that holds no added token. */
static void dllm__encode_plain(const dllm_tokenizer &t, const std::string &text, std::vector<int32_t> &out) {
    std::vector<std::pair<size_t, size_t>> pieces;
    dllm__pretokenize(t.pretok, text, pieces);
    for (const auto &p : pieces) dllm__bpe(t, text.substr(p.first, p.second - p.first), out);
}

/* The whole encode pipeline of HF's TokenizerImpl::encode, without post-processing (no BOS/EOS). */
static void dllm__tokenize(const dllm_tokenizer &t, const char *data, size_t n, bool parse_special, std::vector<int32_t> &out) {
    std::string text = dllm__utf8_sanitize(data, n);
    std::vector<dllm__span> spans;
    dllm__split_added(t, t.raw_trie, text, parse_special, spans);
    for (const dllm__span &s : spans) {
        if (s.id >= 0) { out.push_back(s.id); continue; }
        std::string gap = text.substr(s.begin, s.end - s.begin);
        if (t.nfc) gap = dllm__nfc(gap);
        std::vector<dllm__span> inner;  // tokens with normalized: true match the normalised text
        dllm__split_added(t, t.normalized_trie, gap, parse_special, inner);
        for (const dllm__span &g : inner) {
            if (g.id >= 0) out.push_back(g.id);
            else dllm__encode_plain(t, gap.substr(g.begin, g.end - g.begin), out);
        }
    }
}

/* HF's decode: token bytes concatenated (special tokens skipped if asked), then UTF-8 with U+FFFD
 * replacement over the whole byte string, so characters split across tokens survive. */
static dllm_status dllm__detokenize(const dllm_tokenizer &t, const int32_t *ids, int n_ids, bool skip_special, std::string &out) {
    std::string bytes;
    for (int i = 0; i < n_ids; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t.n_vocab || !t.has_token[(size_t)id])
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "ids[%d] = %d is not a token of this tokenizer (vocabulary of %d)", i, id, t.n_vocab);
        if (!(skip_special && t.is_special[(size_t)id])) bytes += t.piece[(size_t)id];
    }
    out = dllm__utf8_sanitize(bytes.data(), bytes.size());
    return DLLM_OK;
}

// ---- Loading: tokenizer.json, or vocab.json + merges.txt + tokenizer_config.json --------------------

static dllm_status dllm__tok_vocab(dllm_tokenizer &t, const dllm__json &vocab, const std::string &what) {
    if (vocab.kind != dllm__json::OBJ || vocab.keys.empty()) return dllm__fail(DLLM_ERR_FORMAT, "%s: the vocabulary must be a non-empty object {token: id}", what.c_str());
    std::vector<int32_t> seen;
    for (size_t i = 0; i < vocab.keys.size(); i++) {
        const dllm__json &v = vocab.items[i];
        if (!v.is_integer || v.integer < 0 || v.integer >= dllm__max_vocab)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: the id of token \"%s\" must be an integer in [0, %d)", what.c_str(), vocab.keys[i].c_str(), dllm__max_vocab);
        if (!t.vocab.emplace(vocab.keys[i], (int32_t)v.integer).second)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: token \"%s\" appears twice in the vocabulary", what.c_str(), vocab.keys[i].c_str());
        seen.push_back((int32_t)v.integer);
    }
    std::sort(seen.begin(), seen.end());
    auto dup = std::adjacent_find(seen.begin(), seen.end());
    if (dup != seen.end()) return dllm__fail(DLLM_ERR_FORMAT, "%s: id %d is given to two tokens of the vocabulary", what.c_str(), *dup);
    return DLLM_OK;
}

/* Registers merge number `rank` (a, b); both and their concatenation must be vocabulary tokens. */
static dllm_status dllm__tok_merge(dllm_tokenizer &t, const std::string &a, const std::string &b, int32_t rank, const std::string &what) {
    const std::string *parts[3] = {&a, &b, nullptr};
    std::string ab = a + b;
    parts[2] = &ab;
    int32_t ids[3];
    for (int k = 0; k < 3; k++) {
        auto it = t.vocab.find(*parts[k]);
        if (it == t.vocab.end())
            return dllm__fail(DLLM_ERR_FORMAT, "%s: merge %d (\"%s\" \"%s\") refers to \"%s\", which is not in the vocabulary", what.c_str(),
                              rank + 1, a.c_str(), b.c_str(), parts[k]->c_str());
        ids[k] = it->second;
    }
    t.merges[(uint64_t)(uint32_t)ids[0] << 32 | (uint32_t)ids[1]] = {rank, ids[2]};  // a repeated pair: the last wins, as in HF
    return DLLM_OK;
}

/* One merge of tokenizer.json: "a b" (older files) or ["a", "b"] (tokenizers >= 0.20). */
static dllm_status dllm__tok_json_merge(dllm_tokenizer &t, const dllm__json &m, int32_t rank, const std::string &what) {
    if (m.kind == dllm__json::ARR && m.items.size() == 2 && m.items[0].kind == dllm__json::STR && m.items[1].kind == dllm__json::STR)
        return dllm__tok_merge(t, m.items[0].str, m.items[1].str, rank, what);
    size_t sp = m.kind == dllm__json::STR ? m.str.find(' ') : std::string::npos;
    if (sp == std::string::npos || m.str.find(' ', sp + 1) != std::string::npos)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: merge %d must be \"left right\" or [\"left\", \"right\"]", what.c_str(), rank + 1);
    return dllm__tok_merge(t, m.str.substr(0, sp), m.str.substr(sp + 1), rank, what);
}

static dllm_status dllm__tok_merges_txt(dllm_tokenizer &t, const std::string &path) {
    std::string text;
    DLLM__TRY(dllm__read_text(path, text));
    size_t pos = 0;
    int32_t rank = 0;
    for (int line_no = 1; pos < text.size(); line_no++) {
        size_t eol = text.find('\n', pos);
        if (eol == std::string::npos) eol = text.size();
        std::string line = text.substr(pos, eol - pos);
        pos = eol + 1;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if ((line_no == 1 && line.rfind("#version", 0) == 0) || line.empty()) continue;
        size_t sp = line.find(' ');
        if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: line %d must be two tokens separated by one space", path.c_str(), line_no);
        DLLM__TRY(dllm__tok_merge(t, line.substr(0, sp), line.substr(sp + 1), rank++, path));
    }
    return DLLM_OK;
}

static dllm_status dllm__tok_bool(const dllm__json &obj, const char *key, bool dflt, bool &out, const std::string &what) {
    const dllm__json *v = obj.find(key);
    if (!v || v->is_null()) { out = dflt; return DLLM_OK; }
    if (v->kind != dllm__json::BOOL) return dllm__fail(DLLM_ERR_FORMAT, "%s: \"%s\" must be true or false", what.c_str(), key);
    out = v->boolean;
    return DLLM_OK;
}

/* An added token from a {content, special, lstrip, rstrip, normalized, single_word} object. */
static dllm_status dllm__tok_added(dllm_tokenizer &t, const dllm__json &obj, int64_t id, const std::string &what) {
    const dllm__json *content = obj.find("content");
    if (obj.kind != dllm__json::OBJ || !content || content->kind != dllm__json::STR || content->str.empty())
        return dllm__fail(DLLM_ERR_FORMAT, "%s: an added token needs a non-empty \"content\" string", what.c_str());
    if (id < 0 || id >= dllm__max_vocab) return dllm__fail(DLLM_ERR_FORMAT, "%s: added token \"%s\" has id %lld outside [0, %d)", what.c_str(), content->str.c_str(), (long long)id, dllm__max_vocab);
    dllm__added_token a;
    a.content = content->str;
    a.id = (int32_t)id;
    bool single_word = false;
    DLLM__TRY(dllm__tok_bool(obj, "special", false, a.special, what));
    DLLM__TRY(dllm__tok_bool(obj, "lstrip", false, a.lstrip, what));
    DLLM__TRY(dllm__tok_bool(obj, "rstrip", false, a.rstrip, what));
    DLLM__TRY(dllm__tok_bool(obj, "normalized", !a.special, a.normalized, what));
    DLLM__TRY(dllm__tok_bool(obj, "single_word", false, single_word, what));
    if (single_word) return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: added token \"%s\" has single_word: true, which dllm does not implement", what.c_str(), a.content.c_str());
    auto same = t.added_ids.find(a.content);
    if (same != t.added_ids.end()) {
        if (same->second != a.id) return dllm__fail(DLLM_ERR_FORMAT, "%s: added token \"%s\" has ids %d and %d", what.c_str(), a.content.c_str(), same->second, a.id);
        return DLLM_OK;  // listed twice (tokenizer_config.json and added_tokens.json)
    }
    auto in_vocab = t.vocab.find(a.content);
    if (in_vocab != t.vocab.end() && in_vocab->second != a.id)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: added token \"%s\" has id %d but the vocabulary gives it %d", what.c_str(), a.content.c_str(), a.id, in_vocab->second);
    t.added_ids[a.content] = a.id;
    t.added.push_back(a);
    return DLLM_OK;
}

static const char *dllm__json_excerpt(const std::string &s, std::string &buf) {
    buf = s.size() > 60 ? s.substr(0, 60) + "..." : s;
    return buf.c_str();
}

/* pre_tokenizer: Sequence[Split(known regex, Isolated), ByteLevel(use_regex false)], or ByteLevel with
 * use_regex (GPT-2's pattern). add_prefix_space must be off: no supported model uses it. */
static dllm_status dllm__tok_pretokenizer(dllm_tokenizer &t, const dllm__json *pre, const std::string &what) {
    auto type_is = [](const dllm__json *j, const char *type) {
        const dllm__json *ty = j ? j->find("type") : nullptr;
        return ty && ty->kind == dllm__json::STR && ty->str == type;
    };
    auto byte_level = [&](const dllm__json *j, bool use_regex) -> dllm_status {
        bool prefix = false, regex = true;
        DLLM__TRY(dllm__tok_bool(*j, "add_prefix_space", true, prefix, what));
        DLLM__TRY(dllm__tok_bool(*j, "use_regex", true, regex, what));
        if (prefix) return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: ByteLevel pre-tokenizer with add_prefix_space: true is not supported", what.c_str());
        if (regex != use_regex) return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: ByteLevel pre-tokenizer with use_regex: %s is not supported here", what.c_str(), regex ? "true" : "false");
        return DLLM_OK;
    };
    if (type_is(pre, "ByteLevel")) {
        t.pretok = DLLM__PRETOK_GPT2;
        return byte_level(pre, true);
    }
    const dllm__json *seq = type_is(pre, "Sequence") ? pre->find("pretokenizers") : nullptr;
    if (!seq || seq->kind != dllm__json::ARR || seq->items.size() != 2 || !type_is(&seq->items[0], "Split") || !type_is(&seq->items[1], "ByteLevel"))
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: pre_tokenizer must be Sequence[Split(regex), ByteLevel] or ByteLevel (the byte-level BPE layouts dllm implements)", what.c_str());
    const dllm__json &split = seq->items[0];
    const dllm__json *pattern = split.find("pattern"), *behavior = split.find("behavior");
    const dllm__json *regex = pattern ? pattern->find("Regex") : nullptr;
    bool invert = false;
    DLLM__TRY(dllm__tok_bool(split, "invert", false, invert, what));
    if (!regex || regex->kind != dllm__json::STR || !behavior || behavior->kind != dllm__json::STR || behavior->str != "Isolated" || invert)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: the Split pre-tokenizer must have a Regex pattern, behavior Isolated and invert false", what.c_str());
    DLLM__TRY(byte_level(&seq->items[1], false));
    for (const auto &p : dllm__pretok_patterns)
        if (regex->str == p.regex && p.kind != DLLM__PRETOK_GPT2) { t.pretok = p.kind; return DLLM_OK; }
    std::string buf;
    return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: unknown pre-tokenizer regex \"%s\" (dllm implements the Llama-3, Qwen2, Ling and GPT-2 patterns exactly)",
                      what.c_str(), dllm__json_excerpt(regex->str, buf));
}

/* normalizer: null, NFC, or a Sequence holding at most NFC. */
static dllm_status dllm__tok_normalizer(dllm_tokenizer &t, const dllm__json *norm, const std::string &what) {
    if (!norm || norm->is_null()) return DLLM_OK;
    const dllm__json *type = norm->find("type"), *list = norm->find("normalizers");
    if (type && type->kind == dllm__json::STR && type->str == "NFC") { t.nfc = true; return DLLM_OK; }
    if (type && type->kind == dllm__json::STR && type->str == "Sequence" && list && list->kind == dllm__json::ARR && list->items.size() <= 1)
        return list->items.empty() ? DLLM_OK : dllm__tok_normalizer(t, &list->items[0], what);
    return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: normalizer must be null or NFC", what.c_str());
}

/* model: BPE with the byte-level options off (dropout, byte_fallback, affixes); vocab and merges. */
static dllm_status dllm__tok_model(dllm_tokenizer &t, const dllm__json *model, const std::string &what) {
    const dllm__json *type = model ? model->find("type") : nullptr;
    if (!model || model->kind != dllm__json::OBJ || (type && !(type->kind == dllm__json::STR && type->str == "BPE")))
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: model must be a BPE model", what.c_str());
    for (const char *key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
        const dllm__json *v = model->find(key);
        if (v && !v->is_null() && !(v->kind == dllm__json::STR && v->str.empty()))
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: BPE \"%s\" is set; dllm supports only null here", what.c_str(), key);
    }
    bool byte_fallback = false;
    DLLM__TRY(dllm__tok_bool(*model, "byte_fallback", false, byte_fallback, what));
    if (byte_fallback) return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: BPE byte_fallback is not supported (byte-level BPE never needs it)", what.c_str());
    DLLM__TRY(dllm__tok_bool(*model, "ignore_merges", false, t.ignore_merges, what));
    DLLM__TRY(dllm__tok_bool(*model, "fuse_unk", false, t.fuse_unk, what));
    const dllm__json *vocab = model->find("vocab"), *merges = model->find("merges"), *unk = model->find("unk_token");
    if (!vocab) return dllm__fail(DLLM_ERR_FORMAT, "%s: model.vocab is missing", what.c_str());
    DLLM__TRY(dllm__tok_vocab(t, *vocab, what + " (model.vocab)"));
    if (!merges || merges->kind != dllm__json::ARR) return dllm__fail(DLLM_ERR_FORMAT, "%s: model.merges must be an array", what.c_str());
    for (size_t i = 0; i < merges->items.size(); i++) DLLM__TRY(dllm__tok_json_merge(t, merges->items[i], (int32_t)i, what));
    if (unk && !unk->is_null()) {
        auto it = unk->kind == dllm__json::STR ? t.vocab.find(unk->str) : t.vocab.end();
        if (it == t.vocab.end()) return dllm__fail(DLLM_ERR_FORMAT, "%s: model.unk_token is not a vocabulary token", what.c_str());
        t.unk_id = it->second;
    }
    return DLLM_OK;
}

static dllm_status dllm__tok_load_json(dllm_tokenizer &t, const std::string &path) {
    dllm__json root;
    DLLM__TRY(dllm__json_load(path, root));
    if (root.kind != dllm__json::OBJ) return dllm__fail(DLLM_ERR_FORMAT, "%s: not a JSON object", path.c_str());
    DLLM__TRY(dllm__tok_model(t, root.find("model"), path));
    DLLM__TRY(dllm__tok_normalizer(t, root.find("normalizer"), path));
    DLLM__TRY(dllm__tok_pretokenizer(t, root.find("pre_tokenizer"), path));
    const dllm__json *dec = root.find("decoder"), *dec_type = dec ? dec->find("type") : nullptr;
    if (!dec_type || dec_type->kind != dllm__json::STR || dec_type->str != "ByteLevel")
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: decoder must be ByteLevel", path.c_str());
    const dllm__json *added = root.find("added_tokens");
    if (added && added->kind != dllm__json::ARR) return dllm__fail(DLLM_ERR_FORMAT, "%s: added_tokens must be an array", path.c_str());
    for (size_t i = 0; added && i < added->items.size(); i++) {
        const dllm__json *id = added->items[i].find("id");
        if (!id || !id->is_integer) return dllm__fail(DLLM_ERR_FORMAT, "%s: added_tokens[%zu] has no integer \"id\"", path.c_str(), i);
        DLLM__TRY(dllm__tok_added(t, added->items[i], id->integer, path));
    }
    return DLLM_OK;
}

/* Dream and Fast-dLLM v2 ship the slow Qwen2 tokenizer's files: its class hard-codes NFC and the Qwen2
 * split pattern. Added tokens come from added_tokens_decoder and added_tokens.json. */
static dllm_status dllm__tok_load_vocab_merges(dllm_tokenizer &t, const dllm__json &config, const std::string &config_path) {
    const dllm__json *cls = config.find("tokenizer_class");
    static const char *known[] = {"Qwen2Tokenizer", "Qwen2TokenizerFast", "DreamTokenizer"};
    if (!cls || cls->kind != dllm__json::STR || std::none_of(known, known + 3, [&](const char *k) { return cls->str == k; }))
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: tokenizer_class %s%s%s is not supported with vocab.json + merges.txt (supported: Qwen2Tokenizer, DreamTokenizer)",
                          config_path.c_str(), cls && cls->kind == dllm__json::STR ? "\"" : "", cls && cls->kind == dllm__json::STR ? cls->str.c_str() : "(missing)",
                          cls && cls->kind == dllm__json::STR ? "\"" : "");
    t.nfc = true;
    t.pretok = DLLM__PRETOK_QWEN2;
    dllm__json vocab;
    std::string vocab_path = dllm__join_path(t.dir, "vocab.json");
    DLLM__TRY(dllm__json_load(vocab_path, vocab));
    DLLM__TRY(dllm__tok_vocab(t, vocab, vocab_path));
    DLLM__TRY(dllm__tok_merges_txt(t, dllm__join_path(t.dir, "merges.txt")));
    const dllm__json *dec = config.find("added_tokens_decoder");
    if (dec && dec->kind != dllm__json::OBJ) return dllm__fail(DLLM_ERR_FORMAT, "%s: added_tokens_decoder must be an object", config_path.c_str());
    for (size_t i = 0; dec && i < dec->keys.size(); i++) {
        char *end = nullptr;
        long long id = strtoll(dec->keys[i].c_str(), &end, 10);
        if (dec->keys[i].empty() || *end) return dllm__fail(DLLM_ERR_FORMAT, "%s: added_tokens_decoder key \"%s\" is not an id", config_path.c_str(), dec->keys[i].c_str());
        DLLM__TRY(dllm__tok_added(t, dec->items[i], id, config_path));
    }
    std::string extra_path = dllm__join_path(t.dir, "added_tokens.json");
    if (!dllm__file_exists(extra_path)) return DLLM_OK;
    dllm__json extra;
    DLLM__TRY(dllm__json_load(extra_path, extra));
    if (extra.kind != dllm__json::OBJ) return dllm__fail(DLLM_ERR_FORMAT, "%s: not a JSON object {token: id}", extra_path.c_str());
    for (size_t i = 0; i < extra.keys.size(); i++) {
        if (!extra.items[i].is_integer) return dllm__fail(DLLM_ERR_FORMAT, "%s: the id of \"%s\" must be an integer", extra_path.c_str(), extra.keys[i].c_str());
        dllm__json obj;  // tokens listed only here are plain added tokens, as the slow tokenizer adds them
        obj.kind = dllm__json::OBJ;
        obj.keys = {"content"};
        obj.items.resize(1);
        obj.items[0].kind = dllm__json::STR;
        obj.items[0].str = extra.keys[i];
        DLLM__TRY(dllm__tok_added(t, obj, extra.items[i].integer, extra_path));
    }
    return DLLM_OK;
}

/* Ids, decode pieces and the added-token matchers, once vocabulary, merges and added tokens are in. */
static void dllm__tok_finish(dllm_tokenizer &t) {
    dllm__byte_chars(t.byte_char);
    int32_t max_id = -1;
    for (const auto &kv : t.vocab) max_id = std::max(max_id, kv.second);
    for (const dllm__added_token &a : t.added) max_id = std::max(max_id, a.id);
    t.n_vocab = max_id + 1;
    t.piece.assign((size_t)t.n_vocab, std::string());
    t.has_token.assign((size_t)t.n_vocab, 0);
    t.is_special.assign((size_t)t.n_vocab, 0);
    for (const auto &kv : t.vocab) {
        t.piece[(size_t)kv.second] = dllm__token_bytes(t, kv.first);
        t.has_token[(size_t)kv.second] = 1;
    }
    int missing = 0;
    for (int b = 0; b < 256; b++) {
        std::string ch;
        dllm__utf8_put(ch, t.byte_char[b]);
        auto it = t.vocab.find(ch);
        t.byte_id[b] = it == t.vocab.end() ? -1 : it->second;
        missing += t.byte_id[b] < 0;
    }
    if (missing) dllm__log(DLLM_LOG_WARN, "%s: %d of the 256 byte symbols are not in the vocabulary; text with those bytes loses them, as in Hugging Face", t.dir.c_str(), missing);
    for (size_t i = 0; i < t.added.size(); i++) {
        const dllm__added_token &a = t.added[i];
        t.piece[(size_t)a.id] = dllm__token_bytes(t, a.content);
        t.has_token[(size_t)a.id] = 1;
        t.is_special[(size_t)a.id] = a.special;
        if (a.normalized) t.normalized_trie.insert(t.nfc ? dllm__nfc(a.content) : a.content, (int32_t)i);
        else t.raw_trie.insert(a.content, (int32_t)i);
    }
}

// ---- Chat templates -----------------------------------------------------------------------------------
// Detected by markers of the known Jinja templates (tokenizer_config.json "chat_template", or
// chat_template.jinja, which transformers prefers); a template without them gets DLLM_CHAT_NONE.

static dllm_chat_template dllm__chat_detect(const std::string &tpl) {
    auto has = [&](const char *s) { return tpl.find(s) != std::string::npos; };
    if (has("<|start_header_id|>") && has("<|eot_id|>") && has("bos_token") && has("| trim")) return DLLM_CHAT_LLADA;
    if (has("<|im_start|>") && has("<|im_end|>") && has("You are a helpful assistant.")) return DLLM_CHAT_CHATML;
    return DLLM_CHAT_NONE;
}

/* The chat template text: chat_template.jinja, else tokenizer_config.json's (a string, or a list of
 * {name, template} whose "default" entry is used). */
static dllm_status dllm__tok_chat_config(dllm_tokenizer &t, const dllm__json &config, const std::string &config_path) {
    std::string tpl, jinja = dllm__join_path(t.dir, "chat_template.jinja");
    const dllm__json *ct = config.find("chat_template"), *bos = config.find("bos_token");
    if (dllm__file_exists(jinja)) {
        DLLM__TRY(dllm__read_text(jinja, tpl));
    } else if (ct && ct->kind == dllm__json::STR) {
        tpl = ct->str;
    } else if (ct && ct->kind == dllm__json::ARR) {
        for (const dllm__json &e : ct->items) {
            const dllm__json *name = e.find("name"), *text = e.find("template");
            if (name && name->kind == dllm__json::STR && name->str == "default" && text && text->kind == dllm__json::STR) tpl = text->str;
        }
    } else if (ct && !ct->is_null()) {
        return dllm__fail(DLLM_ERR_FORMAT, "%s: \"chat_template\" must be a string or a list of {name, template}", config_path.c_str());
    }
    t.chat = dllm__chat_detect(tpl);
    if (bos && bos->kind == dllm__json::OBJ) bos = bos->find("content");
    if (bos && bos->kind == dllm__json::STR) t.bos_token = bos->str;
    if (t.chat == DLLM_CHAT_LLADA && t.bos_token.empty())
        return dllm__fail(DLLM_ERR_FORMAT, "%s: the LLaDA chat template needs \"bos_token\", which is missing", config_path.c_str());
    if (!tpl.empty() && t.chat == DLLM_CHAT_NONE) dllm__log(DLLM_LOG_INFO, "%s: chat template not recognised; prompts are used as given", t.dir.c_str());
    return DLLM_OK;
}

/* Jinja's trim filter is Python's str.strip(): Unicode White_Space plus U+001C..U+001F. */
static std::string dllm__jinja_trim(const std::string &s) {
    std::vector<uint32_t> c;
    dllm__utf8_decode(s, c);
    auto ws = [](uint32_t cp) { return dllm__is_space(cp) || (cp >= 0x1C && cp <= 0x1F); };
    size_t b = 0, e = c.size();
    while (b < e && ws(c[b])) b++;
    while (e > b && ws(c[e - 1])) e--;
    return dllm__utf8_encode(c.data() + b, e - b);
}

static dllm_status dllm__chat_render(const dllm_tokenizer &t, const dllm_chat_message *msgs, int n, bool add_assistant, std::string &out) {
    if (t.chat == DLLM_CHAT_NONE) return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: no known chat template for this tokenizer", t.dir.c_str());
    if (!msgs || n <= 0) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "a conversation needs at least one message");
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        if (!role || !msgs[i].content) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "message %d has a NULL role or content", i);
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant"))
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "message %d has role \"%s\"; roles are system, user and assistant", i, role);
    }
    out.clear();
    if (t.chat == DLLM_CHAT_LLADA) {  // every turn trimmed and closed by <|eot_id|>; BOS before the first
        for (int i = 0; i < n; i++)
            out += (i == 0 ? t.bos_token : "") + "<|start_header_id|>" + msgs[i].role + "<|end_header_id|>\n\n" + dllm__jinja_trim(msgs[i].content) + "<|eot_id|>";
        out += "<|start_header_id|>assistant<|end_header_id|>\n\n";  // the template appends it whatever add_assistant says
        return DLLM_OK;
    }
    // Qwen2.5 ChatML: a system turn always comes first, the default one if the conversation has none.
    bool has_system = strcmp(msgs[0].role, "system") == 0;
    out = std::string("<|im_start|>system\n") + (has_system ? msgs[0].content : "You are a helpful assistant.") + "<|im_end|>\n";
    for (int i = has_system ? 1 : 0; i < n; i++) out += std::string("<|im_start|>") + msgs[i].role + "\n" + msgs[i].content + "<|im_end|>\n";
    if (add_assistant) out += "<|im_start|>assistant\n";
    return DLLM_OK;
}

static dllm_status dllm__tok_load(const std::string &dir, std::unique_ptr<dllm_tokenizer> &out) {
    std::unique_ptr<dllm_tokenizer> t(new dllm_tokenizer);
    t->dir = dir;
    std::string json_path = dllm__join_path(dir, "tokenizer.json"), config_path = dllm__join_path(dir, "tokenizer_config.json");
    dllm__json config;
    if (dllm__file_exists(config_path)) DLLM__TRY(dllm__json_load(config_path, config));
    if (config.kind != dllm__json::OBJ && !config.is_null()) return dllm__fail(DLLM_ERR_FORMAT, "%s: not a JSON object", config_path.c_str());
    if (dllm__file_exists(json_path)) {
        DLLM__TRY(dllm__tok_load_json(*t, json_path));
    } else if (dllm__file_exists(dllm__join_path(dir, "vocab.json")) && dllm__file_exists(dllm__join_path(dir, "merges.txt"))) {
        if (config.is_null()) return dllm__fail(DLLM_ERR_IO, "%s: vocab.json and merges.txt need tokenizer_config.json beside them", dir.c_str());
        DLLM__TRY(dllm__tok_load_vocab_merges(*t, config, config_path));
    } else {
        return dllm__fail(DLLM_ERR_IO, "%s: no tokenizer here (neither tokenizer.json nor vocab.json + merges.txt)", dir.c_str());
    }
    DLLM__TRY(dllm__tok_chat_config(*t, config, config_path));
    dllm__tok_finish(*t);
    out = std::move(t);
    return DLLM_OK;
}

/* Copies text and its NUL into a caller's buffer, or reports the size needed. */
static dllm_status dllm__copy_out(const char *fn, const std::string &text, char *buf, size_t capacity, size_t *len) {
    if (len) *len = text.size() + 1;
    if (!buf || capacity < text.size() + 1)
        return dllm__fail(DLLM_ERR_BUFFER_TOO_SMALL, "%s: the result needs %zu bytes with its NUL, the buffer holds %zu", fn, text.size() + 1, buf ? capacity : 0);
    memcpy(buf, text.c_str(), text.size() + 1);
    return DLLM_OK;
}


// ---------------------------------------------------------------------------------------------------
// 7. Philox counter-based RNG
//    Philox4x32-10 (Salmon et al. 2011). A draw is a pure function of (seed; vocab index, position,
//    step, stream), so the CPU, the GPU and tools/make_fixtures.py produce the same numbers in any order.
// ---------------------------------------------------------------------------------------------------

enum dllm__rng_stream : uint32_t {
    DLLM__RNG_GUMBEL = 1,  // token noise for temperature > 0, counter (vocab index, position, step)
    DLLM__RNG_REMASK = 2,  // 'random' remasking confidence, counter (0, position, step)
    DLLM__RNG_NLL = 3,     // dllm-eval's masked-token NLL masks, counter (index, window, ratio)
    DLLM__RNG_DPAD = 4,    // DPad's kept suffix, counter (suffix distance, position, block)
    DLLM__RNG_ORIGIN = 5,  // Dream's 'origin' transfer draw, counter (0, position, step)
    DLLM__RNG_ALG_TEMP = 6, // alg_temp's Gumbel noise on the confidence, counter (0, position, step)
    DLLM__RNG_SOLOQ = 7     // SoloQ's rotations (section 9b), counter (element, site, component)
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
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* A uniform double strictly inside (0, 1): 53 random bits, offset by half a unit. */
static double dllm__uniform(uint64_t seed, uint32_t index, uint32_t position, uint32_t step, uint32_t stream) {
    uint32_t ctr[4] = {index, position, step, stream}, o[4];
    dllm__philox(seed, ctr, o);
    uint64_t bits = ((uint64_t)o[0] << 32 | o[1]) >> 11;
    return ((double)bits + 0.5) * (1.0 / 9007199254740992.0);
}

// ---------------------------------------------------------------------------------------------------
// 8. CPU thread pool
//    The caller runs tasks too. Each output element is computed by exactly one task in a fixed order,
//    so results do not depend on the thread count.
// ---------------------------------------------------------------------------------------------------

class dllm__pool {
  public:
    explicit dllm__pool(int n_threads) {
        try {
            for (int i = 1; i < n_threads; i++) workers_.emplace_back([this] { worker(); });
        } catch (...) {  // starting a thread ran out of memory: the started ones must end (a joinable std::thread aborts)
            stop();
            throw;
        }
    }
    ~dllm__pool() { stop(); }

    /* Runs fn(0..n_tasks-1) across the pool; returns when all are done. Every worker reports back
     * before this returns, so no worker can still be reading this call's state in the next call. */
    void run(int n_tasks, const std::function<void(int)> &fn) {
        if (workers_.empty() || n_tasks <= 1) {
            for (int i = 0; i < n_tasks; i++) fn(i);
            return;
        }
        {
            std::lock_guard<std::mutex> lk(mu_);
            fn_ = &fn;
            n_tasks_ = n_tasks;
            next_ = 0;
            reported_ = 0;
            generation_++;
        }
        wake_.notify_all();
        drain();
        std::unique_lock<std::mutex> lk(mu_);
        done_.wait(lk, [this] { return reported_ == workers_.size(); });
        fn_ = nullptr;
    }

  private:
    void stop() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            quit_ = true;
        }
        wake_.notify_all();
        for (std::thread &t : workers_) t.join();
    }
    void drain() {
        for (int i = next_.fetch_add(1); i < n_tasks_; i = next_.fetch_add(1)) (*fn_)(i);
    }
    void worker() {
        uint64_t seen = 0;
        while (true) {
            {
                std::unique_lock<std::mutex> lk(mu_);
                wake_.wait(lk, [&] { return quit_ || generation_ != seen; });
                if (quit_) return;
                seen = generation_;
            }
            drain();
            std::lock_guard<std::mutex> lk(mu_);
            if (++reported_ == workers_.size()) done_.notify_one();
        }
    }
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable wake_, done_;
    const std::function<void(int)> *fn_ = nullptr;
    int n_tasks_ = 0;
    std::atomic<int> next_{0};
    size_t reported_ = 0;
    uint64_t generation_ = 0;
    bool quit_ = false;
};

// ---------------------------------------------------------------------------------------------------
// 9. CPU fp32 reference forward
//    Follows the HF modeling code op for op (models.md 1.3, 2.2): RMSNorm in fp32 with the weight
//    applied after normalising, rotate-half RoPE with float32 angles, bidirectional softmax attention
//    with an optional key-padding mask, SwiGLU, untied head. Clarity over speed; the matmul splits
//    output features across threads and keeps one summation order, so it is deterministic.
// ---------------------------------------------------------------------------------------------------

/* Eight independent partial sums: vectorisable without -ffast-math, same order every call. */
static inline float dllm__dot(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* y[T][N] = x[T][K] . W[N][K]^T (+ bias[N]), with row n of W decoded by weight_row(n, dst) into fp32. */
template <class RowFn>
static void dllm__cpu_linear_rows(dllm__pool &pool, const float *x, int T, int K, const RowFn &weight_row, const float *bias, int N, float *y) {
    const int rows_per_task = 16;
    pool.run((N + rows_per_task - 1) / rows_per_task, [&](int task) {
        std::vector<float> w((size_t)K);
        int n_end = std::min(N, (task + 1) * rows_per_task);
        for (int n = task * rows_per_task; n < n_end; n++) {
            weight_row(n, w.data());
            float b = bias ? bias[n] : 0.0f;
            for (int t = 0; t < T; t++) y[(size_t)t * N + n] = dllm__dot(x + (size_t)t * K, w.data(), K) + b;
        }
    });
}

/* y[T][N] = x[T][K] . W[N][K]^T (+ bias[N]). W may be BF16, F16 or F32. */
static void dllm__cpu_linear(dllm__pool &pool, const float *x, int T, int K, const dllm__tensor &W, const float *bias, int N, float *y) {
    dllm__cpu_linear_rows(pool, x, T, K, [&](int n, float *dst) { dllm__tensor_row(W, n, K, dst); }, bias, N, y);
}

/* y = x * rsqrt(mean(x^2) + eps) * w, row by row. */
static void dllm__cpu_rmsnorm(const float *x, int T, int d, const float *w, float eps, float *y) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * d;
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
        float r = (float)(1.0 / sqrt(ss / d + (double)eps));
        for (int i = 0; i < d; i++) y[(size_t)t * d + i] = (xr[i] * r) * w[i];
    }
}

/* RoPE's inverse frequencies theta^(-2j/d) in float32, as HF computes them. */
static std::vector<float> dllm__rope_inv_freq_plain(float theta, int head_dim) {
    const int half = head_dim / 2;
    std::vector<float> inv((size_t)half);
    for (int j = 0; j < half; j++) inv[(size_t)j] = 1.0f / powf(theta, (float)(2 * j) / (float)head_dim);
    return inv;
}

/* cos/sin tables [n_pos][inv.size()] in float32 (angle pos * inv_freq, as HF), each value times factor (YaRN's
 * attention factor; 1 leaves it as it is). */
static void dllm__rope_tables_of(const std::vector<float> &inv, int n_pos, float factor, std::vector<float> &cos_t, std::vector<float> &sin_t) {
    const int half = (int)inv.size();
    cos_t.resize((size_t)n_pos * half);
    sin_t.resize((size_t)n_pos * half);
    for (int p = 0; p < n_pos; p++)
        for (int j = 0; j < half; j++) {
            float angle = (float)p * inv[(size_t)j];
            cos_t[(size_t)p * half + j] = cosf(angle) * factor;
            sin_t[(size_t)p * half + j] = sinf(angle) * factor;
        }
}

/* cos/sin tables [n_pos][head_dim/2] of the plain RoPE, computed in float32 exactly as HF does. The GPU backend
 * uploads these same tables, so both backends rotate by identical numbers. */
static void dllm__rope_tables(float theta, int head_dim, int n_pos, std::vector<float> &cos_t, std::vector<float> &sin_t) {
    dllm__rope_tables_of(dllm__rope_inv_freq_plain(theta, head_dim), n_pos, 1.0f, cos_t, sin_t);
}

/* x[t] = x[t] * cos + rotate_half(x[t]) * sin for every head; rotate_half(x) = cat(-x2, x1). */
static void dllm__cpu_rope(float *x, int T, int n_heads, int head_dim, const int32_t *pos, const float *cos_t, const float *sin_t) {
    int half = head_dim / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            const float *c = cos_t + (size_t)pos[t] * half, *s = sin_t + (size_t)pos[t] * half;
            for (int j = 0; j < half; j++) {
                float x1 = v[j], x2 = v[j + half];
                v[j] = x1 * c[j] - x2 * s[j];
                v[j + half] = x2 * c[j] + x1 * s[j];
            }
        }
}

/* Softmax(q k^T / sqrt(hd)) v per head: Tq query rows over Tk keys. Query i, at sequence index q_index0 + i,
 * sees key j iff key_valid (nullable: every key) holds it and, under the block-causal mask of block diffusion
 * (mask_block > 0), (q_index0 + i) / mask_block >= j / mask_block; mask_block 0 is bidirectional. A row that
 * sees no key is 0. */
static void dllm__cpu_attention(dllm__pool &pool, const float *q, const float *k, const float *v, int Tq, int Tk, int n_head, int n_kv,
                                int hd, const uint8_t *key_valid, float *out, int q_index0 = 0, int mask_block = 0) {
    const int group = n_head / n_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    pool.run(n_head, [&](int h) {
        int kvh = h / group;
        std::vector<double> p((size_t)Tk);
        std::vector<double> acc((size_t)hd);
        for (int i = 0; i < Tq; i++) {
            const float *qi = q + ((size_t)i * n_head + h) * hd;
            const int n_visible = mask_block ? std::min(Tk, ((q_index0 + i) / mask_block + 1) * mask_block) : Tk;  // keys [0, n_visible)
            double m = -INFINITY;
            for (int j = 0; j < n_visible; j++) {
                if (key_valid && !key_valid[j]) { p[(size_t)j] = -INFINITY; continue; }
                p[(size_t)j] = (double)(dllm__dot(qi, k + ((size_t)j * n_kv + kvh) * hd, hd) * scale);
                m = std::max(m, p[(size_t)j]);
            }
            double l = 0;
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int j = 0; m > -INFINITY && j < n_visible; j++) {
                if (p[(size_t)j] == -INFINITY) continue;
                double e = exp(p[(size_t)j] - m);
                l += e;
                const float *vj = v + ((size_t)j * n_kv + kvh) * hd;
                for (int c = 0; c < hd; c++) acc[(size_t)c] += e * vj[c];
            }
            float *oi = out + ((size_t)i * n_head + h) * hd;
            for (int c = 0; c < hd; c++) oi[c] = l > 0 ? (float)(acc[(size_t)c] / l) : 0.0f;
        }
    });
}

static inline float dllm__silu(float x) { return x / (1.0f + expf(-x)); }

/* Working memory of the CPU forward, grown on demand. */
struct dllm__cpu_buffers {
    std::vector<float> h, a, q, k, v, att, tmp, gate, up;
    std::vector<int32_t> pos;
    void fit(const dllm__config &c, int T) {
        size_t d = (size_t)c.n_embd * T, qd = (size_t)c.n_head * c.head_dim * T, kvd = (size_t)c.n_head_kv * c.head_dim * T;
        h.resize(d); a.resize(d); tmp.resize(d);
        q.resize(qd); att.resize(qd);
        k.resize(kvd); v.resize(kvd);
        gate.resize((size_t)c.n_ff * T); up.resize((size_t)c.n_ff * T);
        pos.resize((size_t)T);
    }
};

/* Keys and values of every layer for every canvas row: Fast-dLLM's prefix/dual cache on the CPU. */
struct dllm__cpu_kv {
    int n = 0;                        // canvas rows
    std::vector<float> k, v;          // [layer][n][n_head_kv * head_dim]
};

/* Which rows a forward computes and which keys they see (plain: every row, fresh keys). */
struct dllm__cpu_rows {
    int q0 = 0, q1 = 0;               // query rows [q0, q1) of the canvas
    dllm__cpu_kv *kv = nullptr;       // null: keys are the rows themselves; else rows [q0, q1) are written
                                      // into the cache and attention reads all kv->n cached rows
    const int32_t *positions = nullptr;  // RoPE position of each canvas row (DPad); null: the row index
};

/* ---- FP8 E4M3: the quantiser and the CPU half of dllm_precision (LaCache 3.4) ----------------------
 * These are the twins of the GPU kernels in dllm__src_fp8. E4M3 has 1 sign, 4 exponent (bias 7) and 3
 * mantissa bits: normals (1 + m/8) * 2^(e-7) up to 448, subnormals m * 2^-9, no infinity, NaN = S.1111.111.
 * Conversion rounds to nearest even and saturates to +-448 (Inf too), as PTX cvt.rn.satfinite does.
 * dllm's codes are canonical: one zero (0x00, the sign of a zero is dropped) and one NaN (0x7f), so the
 * bits never depend on how a piece of hardware signs them. A quantised group holds q = e4m3(x / s) with
 * s = amax / 448 (IEEE division on both sides, so twin and kernel agree bit for bit); a group whose amax
 * is 0 gets s = 1. amax ignores NaN (a NaN element stays NaN); a group holding Inf gets s = Inf, its codes
 * are NaN (the Inf) and 0, and every value of it dequantises to NaN (0 * Inf): non-finite input never turns
 * into finite output. */
static const int dllm__fp8_group = 128;  // activation groups 1x128, weight blocks 128x128

static uint8_t dllm__f32_to_e4m3(float x) {
    if (x != x) return 0x7f;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const float a = fabsf(x);
    int mag;
    if (a < 0x1p-6f) {
        mag = (int)nearbyintf(a * 512.0f);  // subnormal grid 2^-9; 8 rounds up into the smallest normal (code 8)
    } else if (a >= 448.0f) {
        mag = 0x7e;  // saturate
    } else {
        int e;
        float m = frexpf(a, &e);  // a = m * 2^e, m in [0.5, 1): exponent field e + 6, mantissa 16m - 8;
        mag = (e + 6) * 8 + (int)nearbyintf(m * 16.0f) - 8;  // a mantissa that rounds to 8 carries into the exponent
    }
    return mag ? (uint8_t)(sign | mag) : 0;
}

static float dllm__e4m3_to_f32(uint8_t c) {
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    float v = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
    return c & 0x80 ? -v : v;
}

/* All 256 codes decoded once: the CPU forward decodes every FP8 weight row it multiplies. */
static const float *dllm__e4m3_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(256);
        for (int c = 0; c < 256; c++) t[(size_t)c] = dllm__e4m3_to_f32((uint8_t)c);
        return t;
    }();
    return table.data();
}

/* The scale of a group or block from its largest magnitude. */
static float dllm__e4m3_scale(float amax) {
    float s = amax / 448.0f;
    return s > 0 ? s : 1.0f;  // all zeros (or amax so small that s underflows): 1, never a division by 0
}

static float dllm__amax(const float *x, int n, float acc = 0.0f) {
    for (int i = 0; i < n; i++) acc = fmaxf(acc, fabsf(x[i]));  // fmaxf drops NaN, as the kernels' fmaxf does
    return acc;
}

/* Rows x[rows][k] in groups of 128 along k (the last one may be shorter): codes q[rows][k] and scales
 * s[rows][ceil(k / 128)] (the GPU writes the same numbers padded and token-contiguous). */
static void dllm__quantize_groups(const float *x, int rows, int k, uint8_t *q, float *s) {
    const int groups = (k + dllm__fp8_group - 1) / dllm__fp8_group;
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < groups; g++) {
            const int k0 = g * dllm__fp8_group, n = std::min(dllm__fp8_group, k - k0);
            const float *xg = x + (size_t)r * k + k0;
            const float sc = dllm__e4m3_scale(dllm__amax(xg, n));
            for (int i = 0; i < n; i++) q[(size_t)r * k + k0 + i] = dllm__f32_to_e4m3(xg[i] / sc);
            s[(size_t)r * groups + g] = sc;
        }
}

/* x := dequantise(quantise(x)) in 1x128 groups: the value a GEMM input has under FP8. */
static void dllm__fake_quantize_groups(float *x, int rows, int k) {
    const int groups = (k + dllm__fp8_group - 1) / dllm__fp8_group;
    std::vector<uint8_t> q((size_t)k);
    std::vector<float> s((size_t)groups);
    const float *decode = dllm__e4m3_table();
    for (int r = 0; r < rows; r++) {
        float *xr = x + (size_t)r * k;
        dllm__quantize_groups(xr, 1, k, q.data(), s.data());
        for (int i = 0; i < k; i++) xr[i] = decode[q[(size_t)i]] * s[(size_t)(i / dllm__fp8_group)];
    }
}

/* A weight matrix [rows][cols] in E4M3 with one fp32 scale per 128x128 block (scale[rb][cb], partial blocks
 * at the edges). */
struct dllm__fp8_matrix {
    int rows = 0, cols = 0;
    std::vector<uint8_t> q;
    std::vector<float> scale;
    bool empty() const { return rows == 0; }
    int col_blocks() const { return (cols + dllm__fp8_group - 1) / dllm__fp8_group; }
    void row(int r, float *dst) const {
        const float *s = scale.data() + (size_t)(r / dllm__fp8_group) * col_blocks(), *decode = dllm__e4m3_table();
        for (int c = 0; c < cols; c++) dst[c] = decode[q[(size_t)r * cols + c]] * s[c / dllm__fp8_group];
    }
};

/* Twin of the kernel quantize_weight_blocks. */
static dllm__fp8_matrix dllm__quantize_blocks(const float *w, int rows, int cols) {
    dllm__fp8_matrix m;
    m.rows = rows;
    m.cols = cols;
    m.q.resize((size_t)rows * cols);
    const int rb_n = (rows + dllm__fp8_group - 1) / dllm__fp8_group, cb_n = m.col_blocks();
    m.scale.resize((size_t)rb_n * cb_n);
    for (int rb = 0; rb < rb_n; rb++)
        for (int cb = 0; cb < cb_n; cb++) {
            const int r0 = rb * dllm__fp8_group, r1 = std::min(rows, r0 + dllm__fp8_group);
            const int c0 = cb * dllm__fp8_group, n = std::min(dllm__fp8_group, cols - c0);
            float amax = 0;
            for (int r = r0; r < r1; r++) amax = dllm__amax(w + (size_t)r * cols + c0, n, amax);
            const float s = dllm__e4m3_scale(amax);
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c0 + n; c++) m.q[(size_t)r * cols + c] = dllm__f32_to_e4m3(w[(size_t)r * cols + c] / s);
            m.scale[(size_t)rb * cb_n + cb] = s;
        }
    return m;
}

/* Twin of the GPU kernel fp8_gemm, on its operands (the GPU layouts: see struct dllm__gemm_op): codes xq [m_pad x k] with
 * scales x_scale[kb * m_pad + m], codes wq [n x k] with block scales w_scale[nb * ceil4(k / 128) + kb]; k a multiple
 * of 128. Rows [0, rows) of y [rows x n] (bf16 bits) = bf16(total), the total summed over the 128-wide groups in order
 * as total = fmaf(G, sx * sw, total), G the group's 128 code products summed in fp32 (each product is exact: an E4M3
 * value has 4 significant bits). Only the order of G's sum differs from the tensor cores'. The tests' reference: the
 * CPU forward multiplies dequantised values instead (dllm__cpu_linear_fp8), so the library itself never calls it. */
[[maybe_unused]] static void dllm__fp8_gemm_twin(const uint8_t *xq, const float *x_scale, int m_pad, int rows, const uint8_t *wq,
                                                 const float *w_scale, int n, int k, uint16_t *y) {
    const int groups = k / dllm__fp8_group, w_ld = (groups + 3) / 4 * 4;
    const float *decode = dllm__e4m3_table();
    std::vector<float> xd((size_t)k), wd((size_t)n * k);
    for (size_t i = 0; i < wd.size(); i++) wd[i] = decode[wq[i]];
    for (int m = 0; m < rows; m++) {
        for (int c = 0; c < k; c++) xd[(size_t)c] = decode[xq[(size_t)m * k + c]];
        for (int j = 0; j < n; j++) {
            const float *wr = wd.data() + (size_t)j * k;
            float total = 0;
            for (int g = 0; g < groups; g++) {
                float G = 0;
                for (int c = g * dllm__fp8_group; c < (g + 1) * dllm__fp8_group; c++) G += xd[(size_t)c] * wr[c];
                total = fmaf(G, x_scale[(size_t)g * m_pad + m] * w_scale[(size_t)(j / dllm__fp8_group) * w_ld + g], total);
            }
            y[(size_t)m * n + j] = dllm__f32_to_bf16(total);
        }
    }
}

/* Stacks tensors by rows, as the GPU fuses them (Q|K|V, gate|up), in their BF16 values (what the GPU holds,
 * so both backends quantise the same numbers), and quantises the result in 128x128 blocks. */
static dllm__fp8_matrix dllm__quantize_stacked(std::initializer_list<const dllm__tensor *> parts) {
    const int cols = (int)parts.begin()[0]->shape[1];
    std::vector<float> w;
    size_t n = 0;
    for (const dllm__tensor *t : parts) n += (size_t)t->numel;
    w.reserve(n);
    for (const dllm__tensor *t : parts)
        for (int64_t i = 0; i < t->numel; i++) w.push_back(dllm__bf16_to_f32(dllm__f32_to_bf16(dllm__tensor_at(*t, i))));
    return dllm__quantize_blocks(w.data(), (int)(w.size() / (size_t)cols), cols);
}

/* SoloQ's 4-bit linears of a layer (section 9b), by input site; declared here for the forward's hooks. */
enum dllm__soloq_site { DLLM__SOLOQ_QKV, DLLM__SOLOQ_O, DLLM__SOLOQ_GU, DLLM__SOLOQ_DOWN, DLLM__SOLOQ_HEAD, DLLM__SOLOQ_SITES };
struct dllm__soloq_layer;
static void dllm__cpu_linear_soloq(dllm__pool &pool, float *x, bool prepare_x, int T, const dllm__soloq_layer &q, int site, int row0,
                                   const float *bias, int N, float *y);

/* The quantised weights of one layer: FP8 (an empty matrix: that linear runs exact) or SoloQ (every linear). */
struct dllm__fp8_layer {
    dllm__fp8_matrix qkv, o, gu, down;
    std::shared_ptr<const dllm__soloq_layer> soloq;
};

/* Quantised once when a CPU context is created: nothing for BF16 and for layer 0. */
static std::vector<dllm__fp8_layer> dllm__cpu_fp8_weights(const dllm_model &m, dllm_precision precision) {
    const bool fp8 = precision == DLLM_PRECISION_FP8_FFN || precision == DLLM_PRECISION_FP8_ALL;
    std::vector<dllm__fp8_layer> out(fp8 ? m.layers.size() : 0);
    for (size_t l = 1; l < out.size(); l++) {
        const dllm__layer_weights &L = m.layers[l];
        out[l].gu = dllm__quantize_stacked({L.gate, L.up});
        out[l].down = dllm__quantize_stacked({L.down});
        if (precision == DLLM_PRECISION_FP8_ALL) {
            out[l].qkv = dllm__quantize_stacked({L.wq, L.wk, L.wv});
            out[l].o = dllm__quantize_stacked({L.wo});
        }
    }
    return out;
}

/* y[T][N] = x . W[row0 .. row0 + N)^T (+ bias) on an FP8 weight; x is quantised in place first. */
static void dllm__cpu_linear_fp8(dllm__pool &pool, float *x, int T, int K, const dllm__fp8_matrix &W, int row0, const float *bias, int N,
                                 float *y) {
    dllm__fake_quantize_groups(x, T, K);
    dllm__cpu_linear_rows(pool, x, T, K, [&](int n, float *dst) { W.row(row0 + n, dst); }, bias, N, y);
}

/* b.q, b.k, b.v of layer `layer` for the T rows of b.h: RMSNorm, the projections in the layer's precision (q: its FP8 or
 * SoloQ weights, or null for the exact ones), RoPE at the positions b.pos. Both forwards (bidirectional, block
 * diffusion) take it. */
static void dllm__cpu_qkv(const dllm_model &m, size_t layer, const dllm__fp8_layer *q, dllm__pool &pool, dllm__cpu_buffers &b, int T,
                          const float *cos_t, const float *sin_t) {
    const dllm__config &c = m.cfg;
    const dllm__layer_weights &L = m.layers[layer];
    const int d = c.n_embd, qd = c.n_head * c.head_dim, kvd = c.n_head_kv * c.head_dim;
    const float *bq = L.bq.empty() ? nullptr : L.bq.data(), *bk = L.bk.empty() ? nullptr : L.bk.data(), *bv = L.bv.empty() ? nullptr : L.bv.data();
    dllm__cpu_rmsnorm(b.h.data(), T, d, L.attn_norm.data(), c.norm_eps, b.a.data());
    if (q && q->soloq) {
        dllm__cpu_linear_soloq(pool, b.a.data(), true, T, *q->soloq, DLLM__SOLOQ_QKV, 0, bq, qd, b.q.data());
        dllm__cpu_linear_soloq(pool, b.a.data(), false, T, *q->soloq, DLLM__SOLOQ_QKV, qd, bk, kvd, b.k.data());
        dllm__cpu_linear_soloq(pool, b.a.data(), false, T, *q->soloq, DLLM__SOLOQ_QKV, qd + kvd, bv, kvd, b.v.data());
    } else if (q && !q->qkv.empty()) {
        dllm__cpu_linear_fp8(pool, b.a.data(), T, d, q->qkv, 0, bq, qd, b.q.data());
        dllm__cpu_linear_rows(pool, b.a.data(), T, d, [&](int n, float *dst) { q->qkv.row(qd + n, dst); }, bk, kvd, b.k.data());
        dllm__cpu_linear_rows(pool, b.a.data(), T, d, [&](int n, float *dst) { q->qkv.row(qd + kvd + n, dst); }, bv, kvd, b.v.data());
    } else {
        dllm__cpu_linear(pool, b.a.data(), T, d, *L.wq, bq, qd, b.q.data());
        dllm__cpu_linear(pool, b.a.data(), T, d, *L.wk, bk, kvd, b.k.data());
        dllm__cpu_linear(pool, b.a.data(), T, d, *L.wv, bv, kvd, b.v.data());
    }
    dllm__cpu_rope(b.q.data(), T, c.n_head, c.head_dim, b.pos.data(), cos_t, sin_t);
    dllm__cpu_rope(b.k.data(), T, c.n_head_kv, c.head_dim, b.pos.data(), cos_t, sin_t);
}

/* h += O(b.att) for the T rows, in the layer's precision. */
static void dllm__cpu_out_proj(const dllm_model &m, size_t layer, const dllm__fp8_layer *q, dllm__pool &pool, dllm__cpu_buffers &b, int T) {
    const int d = m.cfg.n_embd, qd = m.cfg.n_head * m.cfg.head_dim;
    if (q && q->soloq) dllm__cpu_linear_soloq(pool, b.att.data(), true, T, *q->soloq, DLLM__SOLOQ_O, 0, nullptr, d, b.tmp.data());
    else if (q && !q->o.empty()) dllm__cpu_linear_fp8(pool, b.att.data(), T, qd, q->o, 0, nullptr, d, b.tmp.data());
    else dllm__cpu_linear(pool, b.att.data(), T, qd, *m.layers[layer].wo, nullptr, d, b.tmp.data());
    for (size_t i = 0; i < (size_t)T * d; i++) b.h[i] += b.tmp[i];
}

/* One sequence of a CPU forward (the CPU's twin of section 16.3's dllm__seq_rows): its canvas, the rows it
 * computes and the keys they see, and the output rows it wants. A forward concatenates the computed rows of its
 * sequences; row0 is where this one's begin. */
struct dllm__cpu_seq {
    const int32_t *ids = nullptr;
    int n = 0;                        // canvas rows
    dllm__cpu_rows rows;              // rows.q1 == 0: every row
    const uint8_t *key_valid = nullptr;
    int r0 = 0, r1 = 0;               // unshifted output rows, inside the computed ones
    int row0 = 0;                     // first row in the concatenation (set by dllm__cpu_forward_seqs)
};

/* Attention of one sequence over its own keys: its rows [row0, row0 + T) of b.q, b.k, b.v into b.att. With a
 * K/V cache the rows' keys and values overwrite their cache slots and attention reads every cached row. */
static void dllm__cpu_attend(const dllm__config &c, size_t layer, dllm__pool &pool, dllm__cpu_buffers &b, const dllm__cpu_seq &s) {
    const int T = s.rows.q1 - s.rows.q0, kvd = c.n_head_kv * c.head_dim, qd = c.n_head * c.head_dim;
    const float *keys = b.k.data() + (size_t)s.row0 * kvd, *values = b.v.data() + (size_t)s.row0 * kvd;
    int n_keys = T;
    if (s.rows.kv) {
        float *kc = s.rows.kv->k.data() + layer * s.rows.kv->n * kvd, *vc = s.rows.kv->v.data() + layer * s.rows.kv->n * kvd;
        memcpy(kc + (size_t)s.rows.q0 * kvd, keys, sizeof(float) * T * kvd);
        memcpy(vc + (size_t)s.rows.q0 * kvd, values, sizeof(float) * T * kvd);
        keys = kc, values = vc, n_keys = s.rows.kv->n;
    }
    dllm__cpu_attention(pool, b.q.data() + (size_t)s.row0 * qd, keys, values, T, n_keys, c.n_head, c.n_head_kv, c.head_dim, s.key_valid,
                        b.att.data() + (size_t)s.row0 * qd);
}

/* Attention half of a layer over the T concatenated rows of b.h: h += O(attention(RoPE(QKV(norm(h))))). The
 * projections take every row at once (each row alone, so batching changes no bit); attention stays inside each
 * sequence. q: the layer's quantised weights or null. */
static void dllm__cpu_attention_seqs(const dllm_model &m, size_t layer, const dllm__fp8_layer *q, dllm__pool &pool, dllm__cpu_buffers &b,
                                     const std::vector<dllm__cpu_seq> &seqs, int T, const float *cos_t, const float *sin_t) {
    dllm__cpu_qkv(m, layer, q, pool, b, T, cos_t, sin_t);
    for (const dllm__cpu_seq &s : seqs) dllm__cpu_attend(m.cfg, layer, pool, b, s);
    dllm__cpu_out_proj(m, layer, q, pool, b, T);
}

/* The attention half for one sequence's rows [rows.q0, rows.q1). */
static void dllm__cpu_attention_block(const dllm_model &m, size_t layer, const dllm__fp8_layer *q, dllm__pool &pool, dllm__cpu_buffers &b,
                                      const dllm__cpu_rows &rows, const uint8_t *key_valid, const float *cos_t, const float *sin_t) {
    std::vector<dllm__cpu_seq> one(1);
    one[0].rows = rows, one[0].key_valid = key_valid;
    dllm__cpu_attention_seqs(m, layer, q, pool, b, one, rows.q1 - rows.q0, cos_t, sin_t);
}

/* b.tmp = down(silu(gate(b.a)) * up(b.a)); under FP8 both GEMM inputs are quantised (b.a in place). */
static void dllm__cpu_ffn(const dllm_model &m, const dllm__layer_weights &L, const dllm__fp8_layer *q, dllm__pool &pool, dllm__cpu_buffers &b, int T) {
    const int d = m.cfg.n_embd, ff = m.cfg.n_ff;
    const bool fp8 = q && !q->gu.empty(), soloq = q && q->soloq;
    if (soloq) {
        dllm__cpu_linear_soloq(pool, b.a.data(), true, T, *q->soloq, DLLM__SOLOQ_GU, 0, nullptr, ff, b.gate.data());
        dllm__cpu_linear_soloq(pool, b.a.data(), false, T, *q->soloq, DLLM__SOLOQ_GU, ff, nullptr, ff, b.up.data());
    } else if (fp8) {
        dllm__cpu_linear_fp8(pool, b.a.data(), T, d, q->gu, 0, nullptr, ff, b.gate.data());
        dllm__cpu_linear_rows(pool, b.a.data(), T, d, [&](int n, float *dst) { q->gu.row(ff + n, dst); }, nullptr, ff, b.up.data());
    } else {
        dllm__cpu_linear(pool, b.a.data(), T, d, *L.gate, nullptr, ff, b.gate.data());
        dllm__cpu_linear(pool, b.a.data(), T, d, *L.up, nullptr, ff, b.up.data());
    }
    for (size_t i = 0; i < (size_t)T * ff; i++) b.gate[i] = dllm__silu(b.gate[i]) * b.up[i];
    if (soloq) dllm__cpu_linear_soloq(pool, b.gate.data(), true, T, *q->soloq, DLLM__SOLOQ_DOWN, 0, nullptr, d, b.tmp.data());
    else if (fp8) dllm__cpu_linear_fp8(pool, b.gate.data(), T, ff, q->down, 0, nullptr, d, b.tmp.data());
    else dllm__cpu_linear(pool, b.gate.data(), T, ff, *L.down, nullptr, d, b.tmp.data());
}

/* The MLP half of a layer over the T rows of b.h: h += FFN(norm(h)). Both forwards take it. */
static void dllm__cpu_ffn_block(const dllm_model &m, size_t layer, const dllm__fp8_layer *q, dllm__pool &pool, dllm__cpu_buffers &b, int T) {
    const int d = m.cfg.n_embd;
    dllm__cpu_rmsnorm(b.h.data(), T, d, m.layers[layer].ffn_norm.data(), m.cfg.norm_eps, b.a.data());
    dllm__cpu_ffn(m, m.layers[layer], q, pool, b, T);
    for (size_t i = 0; i < (size_t)T * d; i++) b.h[i] += b.tmp[i];
}

/* logits = LM head of the rows of b.a (already final-normed): BF16/fp32, or SoloQ with quantize_lm_head (head). */
static void dllm__cpu_lm_head(const dllm_model &m, dllm__pool &pool, dllm__cpu_buffers &b, int rows, const dllm__soloq_layer *head, float *logits) {
    if (head) dllm__cpu_linear_soloq(pool, b.a.data(), true, rows, *head, DLLM__SOLOQ_HEAD, 0, nullptr, m.cfg.n_vocab, logits);
    else dllm__cpu_linear(pool, b.a.data(), rows, m.cfg.n_embd, *m.head, nullptr, m.cfg.n_vocab, logits);
}

/* One transformer layer over one sequence's rows of b.h, in place (the tests step through a forward with it). */
[[maybe_unused]] static void dllm__cpu_layer(const dllm_model &m, size_t layer, const dllm__fp8_layer *q, dllm__pool &pool, dllm__cpu_buffers &b,
                                             const dllm__cpu_rows &rows, const uint8_t *key_valid, const float *cos_t, const float *sin_t) {
    dllm__cpu_attention_block(m, layer, q, pool, b, rows, key_valid, cos_t, sin_t);
    dllm__cpu_ffn_block(m, layer, q, pool, b, rows.q1 - rows.q0);
}

/* Forward of several canvases at once: their computed rows concatenated (dllm__cpu_seq), every linear, norm and
 * MLP over all rows in one pass, RoPE at each row's own position, attention per sequence over its own keys; then
 * each sequence's unshifted output rows [r0, r1), one sequence after another, to logits. Every row's arithmetic
 * is the same whatever its neighbours, so a sequence's logits are bit-identical to its forward alone.
 * fp8: per-layer quantised weights (dllm__cpu_fp8_weights, dllm__cpu_soloq_weights), empty for the exact reference;
 * head: SoloQ's quantised LM head or null (BF16). */
static void dllm__cpu_forward_seqs(const dllm_model &m, dllm__pool &pool, dllm__cpu_buffers &b, std::vector<dllm__cpu_seq> &seqs, const float *cos_t,
                                   const float *sin_t, float *logits, const std::vector<dllm__fp8_layer> &fp8, const dllm__soloq_layer *head) {
    const dllm__config &c = m.cfg;
    const int d = c.n_embd;
    int T = 0;
    for (dllm__cpu_seq &s : seqs) {
        if (s.rows.q1 == 0) s.rows.q0 = 0, s.rows.q1 = s.n;
        s.row0 = T;
        T += s.rows.q1 - s.rows.q0;
    }
    b.fit(c, T);
    for (const dllm__cpu_seq &s : seqs)
        for (int row = s.rows.q0; row < s.rows.q1; row++) {
            const size_t t = (size_t)(s.row0 + row - s.rows.q0);
            b.pos[t] = s.rows.positions ? s.rows.positions[row] : row;
            dllm__tensor_row(*m.embed, s.ids[row], d, b.h.data() + t * d);
        }
    for (size_t l = 0; l < m.layers.size(); l++) {
        const dllm__fp8_layer *q = l < fp8.size() ? &fp8[l] : nullptr;
        dllm__cpu_attention_seqs(m, l, q, pool, b, seqs, T, cos_t, sin_t);
        dllm__cpu_ffn_block(m, l, q, pool, b, T);
    }
    int out_rows = 0;  // the output rows, gathered into b.a for one LM head over all of them
    for (const dllm__cpu_seq &s : seqs) {
        dllm__cpu_rmsnorm(b.h.data() + (size_t)(s.row0 + s.r0 - s.rows.q0) * d, s.r1 - s.r0, d, m.final_norm.data(), c.norm_eps, b.a.data() + (size_t)out_rows * d);
        out_rows += s.r1 - s.r0;
    }
    dllm__cpu_lm_head(m, pool, b, out_rows, head, logits);
    if (c.scale_logits) {
        const float s = 1.0f / sqrtf((float)d);
        for (size_t i = 0; i < (size_t)out_rows * c.n_vocab; i++) logits[i] *= s;
    }
}

/* Forward of the canvas ids[0..n) over the rows [rows.q0, rows.q1) (every row if rows.q1 == 0); writes the
 * unshifted output rows [r0, r1) (canvas rows inside the computed ones) to logits: a batch of one. */
static void dllm__cpu_forward(const dllm_model &m, dllm__pool &pool, dllm__cpu_buffers &b, const int32_t *ids, int n, dllm__cpu_rows rows,
                              const uint8_t *key_valid, const float *cos_t, const float *sin_t, int r0, int r1, float *logits,
                              const std::vector<dllm__fp8_layer> &fp8 = std::vector<dllm__fp8_layer>(), const dllm__soloq_layer *head = nullptr) {
    std::vector<dllm__cpu_seq> one(1);
    one[0].ids = ids, one[0].n = n, one[0].rows = rows, one[0].key_valid = key_valid, one[0].r0 = r0, one[0].r1 = r1;
    dllm__cpu_forward_seqs(m, pool, b, one, cos_t, sin_t, logits, fp8, head);
}

/* The output row that predicts position pos: Dream shifts by one (position 0 keeps row 0). */
static inline int dllm__logit_row(const dllm__config &c, int pos) { return c.shift_logits && pos > 0 ? pos - 1 : pos; }

/* ---- Block diffusion (Fast-dLLM v2, Nemotron): RoPE variants, block-causal attention over a K/V cache -----
 * block-diffusion.md: every forward attends to the committed cache ++ its own fresh K/V, with RoPE position
 * (committed length) + offset and the eval mask "query q sees key k iff q / Bm >= k / Bm" over sequence
 * indices; only commit forwards (the prefill, a finished block) append their K/V. The sub-block ("block")
 * cache path forwards S rows whose fresh K/V overwrite their slots of the block's cached K/V, unmasked. */

/* RoPE inverse frequencies in float32, as transformers computes them: theta^(-2j/d), or YaRN
 * (_compute_yarn_parameters: ramp between interpolated and extrapolated frequencies over the dimensions
 * whose rotation count at original_max_position_embeddings lies between beta_slow and beta_fast). */
static std::vector<float> dllm__rope_inv_freq(const dllm__config &c) {
    if (!c.yarn) return dllm__rope_inv_freq_plain(c.rope_theta, c.head_dim);
    const int dim = c.head_dim, half = dim / 2;
    std::vector<float> inv((size_t)half);
    const double base = c.rope_theta;
    auto correction_dim = [&](double rotations) { return dim * log(c.yarn_orig_max / (rotations * 2 * M_PI)) / (2 * log(base)); };
    double low = std::max(floor(correction_dim(c.yarn_beta_fast)), 0.0), high = std::min(ceil(correction_dim(c.yarn_beta_slow)), (double)(dim - 1));
    if (low == high) high += 0.001;  // transformers: prevent a division by zero
    for (int j = 0; j < half; j++) {
        float pos_freq = powf((float)base, (float)(2 * j) / (float)dim);
        float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / ((float)c.yarn_factor * pos_freq);
        float ramp = std::min(std::max(((float)j - (float)low) / (float)(high - low), 0.0f), 1.0f);
        float extrapolation_factor = 1.0f - ramp;
        inv[(size_t)j] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
    return inv;
}

/* cos/sin tables of the model's RoPE: dllm__rope_tables for the plain one; YaRN multiplies both by its
 * attention factor (1.0 at Nemotron's mscale == mscale_all_dim). */
static void dllm__rope_tables_cfg(const dllm__config &c, int n_pos, std::vector<float> &cos_t, std::vector<float> &sin_t) {
    if (!c.yarn) return dllm__rope_tables(c.rope_theta, c.head_dim, n_pos, cos_t, sin_t);
    dllm__rope_tables_of(dllm__rope_inv_freq(c), n_pos, (float)c.yarn_attention_factor, cos_t, sin_t);
}

/* Llama-4 query scaling (Ministral-3, Nemotron): after RoPE, q *= 1 + beta log(1 + floor(pos / orig_max));
 * 1 below orig_max. float32, as in transformers. */
static void dllm__cpu_llama4_scale(const dllm__config &c, float *q, int T, const int32_t *pos) {
    if (c.llama4_beta == 0) return;
    const int width = c.n_head * c.head_dim;
    for (int t = 0; t < T; t++) {
        float s = 1.0f + c.llama4_beta * logf(1.0f + floorf((float)pos[t] / (float)c.llama4_orig_max));
        for (int i = 0; i < width; i++) q[(size_t)t * width + i] *= s;
    }
}

/* ---- [FACache] on block diffusion (LaCache, lacache.md 1, on the committed-block cache) ----------------------
 * Inside a block the committed cache does not change, so layer 0's attention state of a block row over it (per
 * head: the running max m, the normaliser l, the unnormalised accumulator O) depends only on the row's query,
 * i.e. on its token and its RoPE position. Block-diffusion attention (dllm__cpu_bd_attend) therefore computes every
 * row's softmax in two parts, the committed keys then the forward's own keys (fresh K/V or the block cache), and
 * merges them as FlashAttention merges two tiles; the cached path keeps layer 0's committed part of each block row,
 * with the row's layer-0 Q/K/V (RoPECache; the embedding is a row copy on the CPU, nothing to cache), and reuses
 * them while the row's token is unchanged. Cached and uncached runs do the same two parts and the same merge, so
 * they give the same bits by construction. */
struct dllm__bd_facache {
    int n = -1;                        // committed rows the held states were computed over (-1: none held)
    unsigned epoch = 0;                // dllm__bd_kv::epoch they were computed under
    std::vector<int32_t> token;        // [block offset] the row's token, -1: nothing held
    std::vector<float> q, k, v;        // [block offset][n_head * hd] / [n_head_kv * hd]: layer 0's Q (RoPE and query
                                       // scaling applied), K (RoPE applied) and V
    std::vector<double> m, l, acc;     // [block offset][n_head] and [block offset][n_head][hd]: the committed part
    dllm__cpu_buffers scratch;         // the changed rows' layer-0 Q/K/V, computed apart
    int64_t rows = 0, rows_reused = 0; // layer-0 rows a cached forward needed the state of; of those, reused

    /* Drops what was computed over another committed cache; grows to `offsets` block rows. */
    void fit(const dllm__config &c, int n_committed, unsigned kv_epoch, int offsets) {
        const size_t qd = (size_t)c.n_head * c.head_dim, kvd = (size_t)c.n_head_kv * c.head_dim;
        if (n != n_committed || epoch != kv_epoch) std::fill(token.begin(), token.end(), -1);
        n = n_committed, epoch = kv_epoch;
        if ((int)token.size() >= offsets) return;
        token.resize((size_t)offsets, -1);
        q.resize((size_t)offsets * qd), k.resize((size_t)offsets * kvd), v.resize(k.size());
        m.resize((size_t)offsets * c.n_head), l.resize(m.size()), acc.resize((size_t)offsets * qd);
    }
};

/* Keys and values of block diffusion on the CPU, per layer: the committed rows [0, n), then scratch rows
 * where a forward puts the rows it attends to beyond the cache (its fresh K/V, or the block cache). */
struct dllm__bd_kv {
    int n = 0, cap = 0;                   // committed rows; rows per layer
    std::vector<float> k, v;              // [layer][cap][n_head_kv * head_dim]
    int block_rows = 0;                   // rows of the block cache (0: none)
    std::vector<float> block_k, block_v;  // Fast-dLLM v2's block cache, [layer][block_rows][kvd]
    unsigned epoch = 0;                   // bumped whenever committed rows may change (reset, commit): [FACache]'s key
    dllm__bd_facache fa;                  // [FACache]: layer 0's per-row state over the committed rows

    void reset(const dllm__config &c, int rows) {
        n = 0, cap = rows, block_rows = 0, epoch++;
        k.assign((size_t)c.n_layer * rows * c.n_head_kv * c.head_dim, 0.0f);
        v.assign(k.size(), 0.0f);
        fa.rows = fa.rows_reused = 0;
    }
};

/* What one forward of the block-diffusion schedule does with its rows' K/V. */
enum dllm__bd_kind {
    DLLM__BD_STEP,        // attend to cache ++ fresh, discard (a diffusion step without the block cache)
    DLLM__BD_COMMIT,      // attend to cache ++ fresh, append fresh to the cache (prefill, a finished block)
    DLLM__BD_BLOCK_FULL,  // attend to cache ++ fresh, keep fresh as the block cache (block-cache refresh)
    DLLM__BD_SUB_BLOCK    // write fresh into the block cache at `offset`, attend to cache ++ block cache, no mask
};

struct dllm__bd_call {
    dllm__bd_kind kind = DLLM__BD_STEP;
    const int32_t *ids = nullptr;
    int T = 0;            // rows forwarded
    int offset = 0;       // SUB_BLOCK: the rows' offset in the block (RoPE position n + offset + i)
    int mask_block = 0;   // block-causal granularity Bm (0: no mask)
    int r0 = 0, r1 = 0;   // the raw (unshifted) output rows wanted, within [0, T)
    int kv_group = 0;     // COMMIT under kv_quant: rows per key group, the generation's block (0: the model's bd_size)
    bool lacache = false; // [FACache]: reuse layer 0's per-row work of unchanged rows (dllm_gen_params.lacache == ON)
};

/* The softmax state of query qi over keys [j0, j1) of kv head kvh, in double, keys in ascending order: m the
 * max score, l the sum of exp(s - m), acc the sum of exp(s - m) v (m = -inf, l = 0, acc = 0 over no key).
 * Scores as dllm__cpu_attention computes them. p: scratch of at least j1 entries. */
static void dllm__cpu_softmax_part(const float *qi, const float *k, const float *v, int j0, int j1, int n_kv, int kvh, int hd, float scale,
                                   double *p, double &m, double &l, double *acc) {
    m = -INFINITY, l = 0;
    for (int c = 0; c < hd; c++) acc[c] = 0;
    for (int j = j0; j < j1; j++) {
        p[j] = (double)(dllm__dot(qi, k + ((size_t)j * n_kv + kvh) * hd, hd) * scale);
        m = std::max(m, p[j]);
    }
    for (int j = j0; m > -INFINITY && j < j1; j++) {
        double e = exp(p[j] - m);
        l += e;
        const float *vj = v + ((size_t)j * n_kv + kvh) * hd;
        for (int c = 0; c < hd; c++) acc[c] += e * vj[c];
    }
}

/* out = the softmax average of two parts' states (FlashAttention's merge of two tiles); 0 where no key was seen. */
static void dllm__softmax_merge(double m1, double l1, const double *acc1, double m2, double l2, const double *acc2, int hd, float *out) {
    const double mx = std::max(m1, m2);
    if (mx == -INFINITY) {
        for (int c = 0; c < hd; c++) out[c] = 0.0f;
        return;
    }
    const double a1 = m1 == -INFINITY ? 0.0 : exp(m1 - mx), a2 = m2 == -INFINITY ? 0.0 : exp(m2 - mx);
    const double l = l1 * a1 + l2 * a2;
    for (int c = 0; c < hd; c++) out[c] = (float)((acc1[c] * a1 + acc2[c] * a2) / l);
}

/* Where a forward's layer-0 committed states live (dllm__cpu_bd_attend): per query row of the forward, m and l
 * [n_head], acc [n_head][hd]; `reuse` (nullable) marks rows whose state is read, the others are computed and
 * written. Null m: computed and dropped (other layers, lacache off). */
struct dllm__bd_states {
    double *m = nullptr, *l = nullptr, *acc = nullptr;
    const uint8_t *reuse = nullptr;
};

/* Block diffusion's attention: dllm__cpu_attention's function (block-causal at mask_block from sequence index
 * q_index0, no key mask) split at the committed cache: each row's state over keys [0, n_committed) (all of them
 * visible to every row, which sits at or after n_committed), then over the keys [n_committed, n_visible) of the
 * forward itself, merged by dllm__softmax_merge. With no committed key it is dllm__cpu_attention's result bit for
 * bit (the merge multiplies by exp(0) = 1). */
static void dllm__cpu_bd_attend(dllm__pool &pool, const float *q, const float *k, const float *v, int Tq, int n_committed, int Tk, int n_head,
                                int n_kv, int hd, float *out, int q_index0, int mask_block, const dllm__bd_states &states) {
    const int group = n_head / n_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    pool.run(n_head, [&](int h) {
        const int kvh = h / group;
        std::vector<double> p((size_t)Tk), acc_c((size_t)hd), acc_f((size_t)hd);
        for (int i = 0; i < Tq; i++) {
            const float *qi = q + ((size_t)i * n_head + h) * hd;
            const int n_visible = mask_block ? std::min(Tk, ((q_index0 + i) / mask_block + 1) * mask_block) : Tk;
            const size_t at = (size_t)i * n_head + h;
            double mc, lc, mf, lf;
            double *acc = states.m ? states.acc + at * hd : acc_c.data();
            if (states.m && states.reuse && states.reuse[i]) {
                mc = states.m[at], lc = states.l[at];
            } else {
                dllm__cpu_softmax_part(qi, k, v, 0, std::min(n_committed, n_visible), n_kv, kvh, hd, scale, p.data(), mc, lc, acc);
                if (states.m) states.m[at] = mc, states.l[at] = lc;
            }
            dllm__cpu_softmax_part(qi, k, v, std::min(n_committed, n_visible), n_visible, n_kv, kvh, hd, scale, p.data(), mf, lf, acc_f.data());
            dllm__softmax_merge(mc, lc, acc, mf, lf, acc_f.data(), hd, out + at * hd);
        }
    });
}

/* [FACache] Layer 0's Q/K/V of the forward's rows into b.q, b.k, b.v: a row whose token kv.fa holds at its block
 * offset (same committed cache, so same position) is copied from it and marked in reuse; the others are computed
 * apart, in fa.scratch (every op of dllm__cpu_qkv and the query scaling is row-wise, so the bits are those of the
 * whole forward's), and kept. Counts the rows for dllm_gen_stats. */
static void dllm__cpu_bd_qkv_cached(const dllm_model &m, const dllm__fp8_layer *q8, dllm__pool &pool, dllm__cpu_buffers &b, dllm__bd_kv &kv,
                                    const dllm__bd_call &call, const float *cos_t, const float *sin_t, std::vector<uint8_t> &reuse) {
    const dllm__config &c = m.cfg;
    const int T = call.T;
    const size_t d = (size_t)c.n_embd, qd = (size_t)c.n_head * c.head_dim, kvd = (size_t)c.n_head_kv * c.head_dim;
    dllm__bd_facache &fa = kv.fa;
    fa.fit(c, kv.n, kv.epoch, call.offset + T);
    reuse.assign((size_t)T, 0);
    std::vector<int> changed;
    for (int t = 0; t < T; t++) {
        reuse[(size_t)t] = fa.token[(size_t)(call.offset + t)] == call.ids[t];
        if (!reuse[(size_t)t]) changed.push_back(t);
    }
    const int n_changed = (int)changed.size();
    dllm__cpu_buffers &s = fa.scratch;
    s.fit(c, std::max(n_changed, 1));
    for (int i = 0; i < n_changed; i++) {
        memcpy(s.h.data() + (size_t)i * d, b.h.data() + (size_t)changed[(size_t)i] * d, sizeof(float) * d);
        s.pos[(size_t)i] = b.pos[(size_t)changed[(size_t)i]];
    }
    if (n_changed > 0) {
        dllm__cpu_qkv(m, 0, q8, pool, s, n_changed, cos_t, sin_t);
        dllm__cpu_llama4_scale(c, s.q.data(), n_changed, s.pos.data());
    }
    for (int i = 0; i < n_changed; i++) {
        const size_t o = (size_t)(call.offset + changed[(size_t)i]);
        memcpy(fa.q.data() + o * qd, s.q.data() + (size_t)i * qd, sizeof(float) * qd);
        memcpy(fa.k.data() + o * kvd, s.k.data() + (size_t)i * kvd, sizeof(float) * kvd);
        memcpy(fa.v.data() + o * kvd, s.v.data() + (size_t)i * kvd, sizeof(float) * kvd);
        fa.token[o] = call.ids[changed[(size_t)i]];
    }
    const size_t o0 = (size_t)call.offset;
    memcpy(b.q.data(), fa.q.data() + o0 * qd, sizeof(float) * qd * T);
    memcpy(b.k.data(), fa.k.data() + o0 * kvd, sizeof(float) * kvd * T);
    memcpy(b.v.data(), fa.v.data() + o0 * kvd, sizeof(float) * kvd * T);
    fa.rows += T;
    fa.rows_reused += T - n_changed;
}

/* Attention half of a block-diffusion layer (see dllm__bd_kind), then o_proj and the residual. Layer 0 of a forward
 * over a non-empty committed cache under call.lacache takes [FACache]'s held Q/K/V and committed states. */
static void dllm__cpu_bd_attention(const dllm_model &m, size_t layer, const dllm__fp8_layer *q8, dllm__pool &pool, dllm__cpu_buffers &b,
                                   dllm__bd_kv &kv, const dllm__bd_call &call, const float *cos_t, const float *sin_t) {
    const dllm__config &c = m.cfg;
    const int T = call.T, kvd = c.n_head_kv * c.head_dim;
    const bool cached = call.lacache && layer == 0 && kv.n > 0;
    std::vector<uint8_t> reuse;
    dllm__bd_states states;
    if (cached) {
        dllm__cpu_bd_qkv_cached(m, q8, pool, b, kv, call, cos_t, sin_t, reuse);
        const size_t o = (size_t)call.offset;
        states.m = kv.fa.m.data() + o * c.n_head, states.l = kv.fa.l.data() + o * c.n_head;
        states.acc = kv.fa.acc.data() + o * c.n_head * c.head_dim, states.reuse = reuse.data();
    } else {
        dllm__cpu_qkv(m, layer, q8, pool, b, T, cos_t, sin_t);
        dllm__cpu_llama4_scale(c, b.q.data(), T, b.pos.data());
    }
    float *kc = kv.k.data() + layer * kv.cap * kvd, *vc = kv.v.data() + layer * kv.cap * kvd;
    const size_t row_bytes = sizeof(float) * kvd;
    int n_keys = kv.n + T;
    if (call.kind == DLLM__BD_SUB_BLOCK) {
        float *bkc = kv.block_k.data() + layer * kv.block_rows * kvd, *bvc = kv.block_v.data() + layer * kv.block_rows * kvd;
        memcpy(bkc + (size_t)call.offset * kvd, b.k.data(), row_bytes * T);  // the overwrite persists (block-diffusion.md)
        memcpy(bvc + (size_t)call.offset * kvd, b.v.data(), row_bytes * T);
        memcpy(kc + (size_t)kv.n * kvd, bkc, row_bytes * kv.block_rows);
        memcpy(vc + (size_t)kv.n * kvd, bvc, row_bytes * kv.block_rows);
        n_keys = kv.n + kv.block_rows;
    } else {
        memcpy(kc + (size_t)kv.n * kvd, b.k.data(), row_bytes * T);
        memcpy(vc + (size_t)kv.n * kvd, b.v.data(), row_bytes * T);
        if (call.kind == DLLM__BD_BLOCK_FULL) {
            memcpy(kv.block_k.data() + layer * T * kvd, b.k.data(), row_bytes * T);
            memcpy(kv.block_v.data() + layer * T * kvd, b.v.data(), row_bytes * T);
        }
    }
    dllm__cpu_bd_attend(pool, b.q.data(), kc, vc, T, kv.n, n_keys, c.n_head, c.n_head_kv, c.head_dim, b.att.data(), kv.n + call.offset,
                        call.mask_block, states);
    dllm__cpu_out_proj(m, layer, q8, pool, b, T);
}

/* One forward of the block-diffusion schedule over call.T rows; writes the raw logits of rows [r0, r1).
 * The caller sizes kv (kv.n + rows <= kv.cap). */
static void dllm__cpu_bd_forward(const dllm_model &m, dllm__pool &pool, dllm__cpu_buffers &b, dllm__bd_kv &kv, const dllm__bd_call &call,
                                 const float *cos_t, const float *sin_t, float *logits, const std::vector<dllm__fp8_layer> &fp8,
                                 const dllm__soloq_layer *head = nullptr) {
    const dllm__config &c = m.cfg;
    const int d = c.n_embd, T = call.T, kvd = c.n_head_kv * c.head_dim;
    b.fit(c, T);
    for (int t = 0; t < T; t++) {
        b.pos[(size_t)t] = kv.n + call.offset + t;
        dllm__tensor_row(*m.embed, call.ids[t], d, b.h.data() + (size_t)t * d);
    }
    if (call.kind == DLLM__BD_BLOCK_FULL) {
        kv.block_rows = T;
        kv.block_k.assign((size_t)c.n_layer * T * kvd, 0.0f);
        kv.block_v.assign(kv.block_k.size(), 0.0f);
    }
    for (size_t l = 0; l < m.layers.size(); l++) {
        const dllm__fp8_layer *q8 = l < fp8.size() ? &fp8[l] : nullptr;
        dllm__cpu_bd_attention(m, l, q8, pool, b, kv, call, cos_t, sin_t);
        dllm__cpu_ffn_block(m, l, q8, pool, b, T);
    }
    if (call.kind == DLLM__BD_COMMIT) kv.n += T, kv.epoch++;
    dllm__cpu_rmsnorm(b.h.data() + (size_t)call.r0 * d, call.r1 - call.r0, d, m.final_norm.data(), c.norm_eps, b.a.data());
    dllm__cpu_lm_head(m, pool, b, call.r1 - call.r0, head, logits);
}

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
    const double u1 = dllm__uniform(seed, 2 * index, site, 2, DLLM__RNG_SOLOQ), u2 = dllm__uniform(seed, 2 * index + 1, site, 2, DLLM__RNG_SOLOQ);
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
        for (int i = d - 1; i > 0; i--) std::swap(r.perm[(size_t)i], r.perm[(size_t)(dllm__uniform(seed, (uint32_t)i, site, 0, DLLM__RNG_SOLOQ) * (i + 1))]);
    }
    r.sign_bits.assign((size_t)(d + 7) / 8, 0);
    for (int i = 0; i < d; i++)
        if (dllm__uniform(seed, (uint32_t)i, site, 1, DLLM__RNG_SOLOQ) < 0.5) r.sign_bits[(size_t)i / 8] |= (uint8_t)(1u << (i % 8));
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
            for (int i = 0; i < k; i++) acc = fmaf(transpose ? m[(size_t)i * k + j] : m[(size_t)j * k + i], in[(size_t)i * b + c], acc);
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
    if (r.mixer.empty()) memcpy(y, t.data(), sizeof(float) * r.d);
    else dllm__mix_blocks(r.mixer.data(), false, t.data(), r.k, r.b, y);
}

/* x = R^T y for one row (the inverse: R is orthogonal). The forward never needs it (weights are rotated by R as
 * rows: W R^T has rows R w_n); the tests and tools use it to undo a rotation. */
[[maybe_unused]] static void dllm__rotate_inverse(const dllm__rotation &r, const float *y, float *x) {
    if (r.kind == DLLM__ROT_NONE) {
        memcpy(x, y, sizeof(float) * r.d);
        return;
    }
    std::vector<float> t((size_t)r.d);
    if (r.mixer.empty()) memcpy(t.data(), y, sizeof(float) * r.d);
    else dllm__mix_blocks(r.mixer.data(), true, y, r.k, r.b, t.data());
    dllm__fwht_blocks(t.data(), r.k, r.b);
    for (int i = 0; i < r.d; i++) x[r.perm.empty() ? i : r.perm[(size_t)i]] = dllm__rot_sign(r, i) * t[(size_t)i];
}

// ---- 4-bit quantisers: [NVFP4], INT4 mid-rise ([SoloQ-I]), Lloyd-Max and E8P-RVQ ([SoloQ-C]), [RTN-W4A4] ----

enum dllm__q4_format {
    DLLM__Q4_NVFP4 = 0,  // spec 6: E2M1 x UE4M3 per 16 x FP32 per row (S_enc from the row's amax)
    DLLM__Q4_INT4 = 1,   // spec 4.4: mid-rise, step 0.3352 sigma, sigma the row's RMS
    DLLM__Q4_LLOYD = 2,  // spec 4.2: Lloyd-Max 4-bit levels for N(0, 1), INT8 levels / 46
    DLLM__Q4_E8P = 3,    // spec 4.3: E8P-RVQ 4-bit (QuIP#), scale 1.03, residual 3.45, INT8 values / 35.8
    DLLM__Q4_RTN = 4     // symmetric INT4 [-7, 7], step amax / 7
};

static const char *const dllm__q4_names[] = {"NVFP4", "INT4", "Lloyd-Max", "E8P-RVQ4", "RTN INT4"};

/* Rows [rows][cols] quantised in one format (the packing: this section's header). */
struct dllm__q4_rows {
    dllm__q4_format format = DLLM__Q4_INT4;
    int rows = 0, cols = 0;
    std::vector<uint8_t> codes;         // [rows][row_bytes()]
    std::vector<uint8_t> block_scales;  // NVFP4: [rows][blocks()] UE4M3
    std::vector<float> row_scale;       // [rows]: the value of an element is C * row_scale
    size_t row_bytes() const { return (size_t)cols / 2; }  // 4 bits an element in every format (E8P: 32 bits per 8)
    int blocks() const { return (cols + 15) / 16; }         // NVFP4 blocks a row, the last one shorter if cols % 16
};

static const float dllm__int4_step = 0.3352f;  // Gaussian-MSE-optimal 16-level mid-rise step, in sigma units
static const float dllm__lloyd4_thresholds[7] = {0.258222f, 0.522404f, 0.799550f, 1.099286f, 1.437139f, 1.843532f, 2.400803f};
// The Lloyd-Max levels themselves: encoding uses their midpoints (the thresholds), decoding the INT8 levels.
[[maybe_unused]] static const float dllm__lloyd4_levels[8] = {0.128395f, 0.388048f, 0.656759f, 0.942340f, 1.256231f, 1.618046f, 2.069017f, 2.732590f};
static const int dllm__lloyd4_int[8] = {6, 18, 30, 43, 58, 74, 95, 126};
static const float dllm__lloyd4_kappa = 46.0f;
static const float dllm__e8p_scale = 1.03f, dllm__e8p_resid = 3.45f, dllm__e8p_kappa = 35.8f;

/* The magnitude code of an E2M1 value, rounding |v| to nearest even with satfinite (spec 6.2 step 4). */
static uint8_t dllm__f32_to_e2m1(float v) {
    const float a = fabsf(v);
    const int m = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3 : a <= 2.5f ? 4 : a < 3.5f ? 5 : a <= 5.0f ? 6 : 7;
    return m ? (uint8_t)((signbit(v) ? 8 : 0) | m) : 0;
}

static float dllm__e2m1_to_f32(uint8_t c) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return c & 8 ? -mag[c & 7] : mag[c & 7];
}

/* NVFP4 of n elements with the encode scale s_enc (spec 6.2 steps 2-4): e2m1 codes into c4[n], UE4M3 block scales
 * into bs[ceil(n / 16)] (the last block may be shorter), and each element's value before S_dec, e2m1 * s_b, into
 * value[n]. */
static void dllm__nvfp4_encode(const float *x, int n, float s_enc, uint8_t *c4, uint8_t *bs, float *value) {
    const float *e4m3 = dllm__e4m3_table();
    for (int b0 = 0; b0 < n; b0 += 16) {
        const int b1 = std::min(n, b0 + 16);
        const uint8_t sb = dllm__f32_to_e4m3((dllm__amax(x + b0, b1 - b0) / 6.0f) * s_enc);
        const float scale = e4m3[sb], enc = sb ? s_enc / scale : 0.0f;
        bs[b0 / 16] = sb;
        for (int i = b0; i < b1; i++) {
            c4[i] = sb ? dllm__f32_to_e2m1(x[i] * enc) : 0;
            value[i] = dllm__e2m1_to_f32(c4[i]) * scale;
        }
    }
}

/* The global encode scale of an amax (spec 6.2 step 1): 2688 / amax, 1 when amax is 0 or the quotient is 0. */
static float dllm__nvfp4_s_enc(float amax) {
    const float s = fminf(2688.0f / amax, FLT_MAX);
    return amax > 0 && s > 0 ? s : 1.0f;
}

// ---- the E8P lattice codebook (QuIP#'s E8P, spec 4.3) -----------------------------------------------------

/* Abs pattern number `index` (0..255) of E8P: 8 bytes in half units (2|a_i| in {1, 3, 5}): first the 227 patterns of norm^2 <= 10, in
 * lexicographic order of (coordinate 0, ..., 7) with 1 < 3 < 5, then QuIP#'s 29 norm-12 paddings (five 3/2 and three
 * 1/2; listed by the positions of the 1/2s, the deduplicated list of latticee8_padded12_rvq4bit.py). The order is
 * dllm's own: no QuIP# file is ever read. */
static const uint8_t *dllm__e8p_abs(int index) {
    static const std::vector<uint8_t> table = [] {
        std::vector<uint8_t> t;
        for (int code = 0; code < 6561; code++) {
            uint8_t a[8];
            int rest = code, norm4 = 0;  // 4 * norm^2 = sum (2 a_i)^2
            for (int i = 7; i >= 0; i--, rest /= 3) a[i] = (uint8_t)(1 + 2 * (rest % 3));
            for (uint8_t h : a) norm4 += h * h;
            if (norm4 <= 40) t.insert(t.end(), a, a + 8);
        }
        static const char *const pads[29] = {"123", "023", "013", "012", "367", "357", "347", "356", "346", "345", "267", "257", "247", "256", "246",
                                             "245", "167", "157", "147", "156", "146", "045", "067", "057", "047", "056", "046", "014", "237"};
        for (const char *p : pads) {
            uint8_t a[8] = {3, 3, 3, 3, 3, 3, 3, 3};
            for (const char *c = p; *c; c++) a[*c - '0'] = 1;
            t.insert(t.end(), a, a + 8);
        }
        return t;
    }();
    return table.data() + (size_t)index * 8;
}

/* Decodes an E8P code to 4 x its 8 coordinates (odd integers in [-11, 11]). Bits 15..8: abs index; 7..1: the signs
 * of coordinates 1..7 (1 = negative); 0: the shift (1 = +1/4). The sign of coordinate 0 makes the count of negative
 * signs congruent to sum |a| (mod 2), so that sum(s a) is even. */
static void dllm__e8p_decode4(uint16_t code, int out4[8]) {
    const uint8_t *a = dllm__e8p_abs(code >> 8);
    int neg = 0, sum_half = 0;
    for (int i = 0; i < 8; i++) sum_half += a[i];
    for (int i = 1; i < 8; i++) neg += code >> i & 1;
    const bool neg0 = ((sum_half / 2 - neg) & 1) != 0;
    const int shift = code & 1 ? 1 : -1;
    for (int i = 0; i < 8; i++) {
        const bool negative = i == 0 ? neg0 : (code >> i & 1) != 0;
        out4[i] = 2 * (negative ? -a[i] : a[i]) + shift;
    }
}

/* The nearest E8P codeword to x[8] (spec 4.3's exact search, QuIP#'s fast_quantize_part): for each shift (-1/4
 * first) and abs pattern a (index order), cost = sum (|y_i| - a_i)^2 + [parity violated] min_i 4 |y_i| a_i with
 * y = x - shift, each product and sum rounded separately in fp32 in coordinate order; the first strict minimum wins.
 * Signs are sign(y) (0 counts as +), with the cheapest coordinate flipped when the parity is violated. */
static uint16_t dllm__e8p_encode(const float x[8]) {
    float best = INFINITY;
    uint16_t best_code = 0;
    for (int s = 0; s < 2; s++) {
        const float shift = s ? 0.25f : -0.25f;
        float y[8], ay[8];
        int neg_y = 0;
        for (int i = 0; i < 8; i++) {
            y[i] = x[i] - shift;
            ay[i] = fabsf(y[i]);
            neg_y += y[i] < 0;
        }
        for (int p = 0; p < 256; p++) {
            const uint8_t *h = dllm__e8p_abs(p);
            float cost = 0, flip_cost = INFINITY;
            int sum_half = 0, flip = 0;
            for (int i = 0; i < 8; i++) {
                const float a = 0.5f * h[i], e = ay[i] - a;
                cost = cost + e * e;
                const float fc = 4.0f * ay[i] * a;
                if (fc < flip_cost) flip_cost = fc, flip = i;
                sum_half += h[i];
            }
            const bool violated = ((neg_y - sum_half / 2) & 1) != 0;
            if (violated) cost = cost + flip_cost;
            if (cost < best) {
                best = cost;
                uint16_t code = (uint16_t)(p << 8 | s);
                for (int i = 1; i < 8; i++) code |= (uint16_t)(((y[i] < 0) != (violated && flip == i)) << i);
                best_code = code;
            }
        }
    }
    return best_code;
}

/* W_int[e1][e2] = round(35.8 (e1 + e2 / 3.45)) for the 12 x 12 pairs of odd quarter values (index (4v + 11) / 2). */
static int dllm__e8p_int(int e1_4, int e2_4) {
    static const std::vector<int8_t> table = [] {
        std::vector<int8_t> t(144);
        for (int i = 0; i < 12; i++)
            for (int j = 0; j < 12; j++) t[(size_t)i * 12 + j] = (int8_t)lrint(35.8 * ((2 * i - 11) / 4.0 + (2 * j - 11) / 4.0 / 3.45));
        return t;
    }();
    return table[(size_t)((e1_4 + 11) / 2) * 12 + (e2_4 + 11) / 2];
}

// ---- one row, every format -------------------------------------------------------------------------------

/* C of element i of a packed row (the inverse of the packing; NVFP4 reads its block scale). */
static float dllm__q4_value(dllm__q4_format f, const uint8_t *packed, const uint8_t *block_scales, int i) {
    if (f == DLLM__Q4_E8P) {
        const uint8_t *p = packed + (size_t)(i / 8) * 4;
        int e1[8], e2[8];
        dllm__e8p_decode4((uint16_t)(p[0] | p[1] << 8), e1);
        dllm__e8p_decode4((uint16_t)(p[2] | p[3] << 8), e2);
        return (float)dllm__e8p_int(e1[i % 8], e2[i % 8]);
    }
    const uint8_t c = packed[i / 2] >> (4 * (i & 1)) & 15;
    const int signed4 = c & 8 ? (int)c - 16 : (int)c;
    switch (f) {
        case DLLM__Q4_NVFP4: return dllm__e2m1_to_f32(c) * dllm__e4m3_table()[block_scales[i / 16]];
        case DLLM__Q4_INT4: return (float)(2 * signed4 + 1);
        case DLLM__Q4_LLOYD: return (float)(c & 8 ? -dllm__lloyd4_int[c & 7] : dllm__lloyd4_int[c & 7]);
        default: return (float)signed4;
    }
}

/* The encoders of one nonzero row x[n]: 4-bit codes into c4 (E8P: its packed codes), each element's C into value, and
 * the format's own row scale returned. sigma = the row's RMS. */
static float dllm__encode_nvfp4(const float *x, int n, uint8_t *c4, uint8_t *block_scales, float *value) {
    const float s_enc = dllm__nvfp4_s_enc(dllm__amax(x, n));
    dllm__nvfp4_encode(x, n, s_enc, c4, block_scales, value);
    return 1.0f / s_enc;
}

static float dllm__encode_rtn(const float *x, int n, uint8_t *c4, float *value) {
    const float scale = dllm__amax(x, n) / 7.0f;
    for (int i = 0; i < n; i++) {
        const float q = fminf(fmaxf(rintf(x[i] / scale), -7.0f), 7.0f);  // NaN clamps to -7: the row scale is NaN then
        c4[i] = (uint8_t)((int)q & 15);
        value[i] = q;
    }
    return scale;
}

static float dllm__encode_int4(const float *x, int n, float sigma, uint8_t *c4, float *value) {
    const float step = sigma * dllm__int4_step;
    for (int i = 0; i < n; i++) {
        const float q = fminf(fmaxf(floorf(x[i] / step), -8.0f), 7.0f);
        c4[i] = (uint8_t)((int)q & 15);
        value[i] = 2.0f * q + 1.0f;
    }
    return step / 2.0f;
}

static float dllm__encode_lloyd(const float *x, int n, float sigma, uint8_t *c4, float *value) {
    for (int i = 0; i < n; i++) {
        const float z = x[i] / sigma, az = fabsf(z);
        int level = 0;
        while (level < 7 && az >= dllm__lloyd4_thresholds[level]) level++;
        c4[i] = (uint8_t)((z < 0 ? 8 : 0) | level);
        value[i] = (float)(z < 0 ? -dllm__lloyd4_int[level] : dllm__lloyd4_int[level]);
    }
    return sigma / dllm__lloyd4_kappa;
}

/* E8P-RVQ4: stage 1 on v1 = 1.03 z, stage 2 on the residual (v1 - e1) x 3.45; two codes per 8 into packed. */
static float dllm__encode_e8p(const float *x, int n, float sigma, uint8_t *packed, float *value) {
    for (int g = 0; g < n; g += 8) {
        float v1[8], v2[8];
        int e1[8], e2[8];
        for (int i = 0; i < 8; i++) v1[i] = (x[g + i] / sigma) * dllm__e8p_scale;
        const uint16_t c1 = dllm__e8p_encode(v1);
        dllm__e8p_decode4(c1, e1);
        for (int i = 0; i < 8; i++) v2[i] = (v1[i] - 0.25f * (float)e1[i]) * dllm__e8p_resid;
        const uint16_t c2 = dllm__e8p_encode(v2);
        dllm__e8p_decode4(c2, e2);
        uint8_t *p = packed + (size_t)g / 2;
        p[0] = (uint8_t)c1, p[1] = (uint8_t)(c1 >> 8), p[2] = (uint8_t)c2, p[3] = (uint8_t)(c2 >> 8);
        for (int i = 0; i < 8; i++) value[g + i] = (float)dllm__e8p_int(e1[i], e2[i]);
    }
    return sigma / (dllm__e8p_scale * dllm__e8p_kappa);
}

/* Quantises row x[n] in format f. Writes the packed codes (row_bytes), NVFP4's block scales, and returns the row
 * scale; value[n] receives each element's C (the value is C * row scale). With bias_correction the row scale is
 * SoloQ's ||x||^2 / <C, x> (spec 5: the projection of the quantised row on x is exact), otherwise the format's own
 * scale. A zero row gets codes 0 and scale 0; a row holding Inf or NaN gets a NaN scale (non-finite input never
 * turns into finite output); if <C, x> <= 0 the format's own scale stays. */
static float dllm__q4_quantize_row(dllm__q4_format f, const float *x, int n, bool bias_correction, uint8_t *packed, uint8_t *block_scales, float *value) {
    const float ss = dllm__soloq_dot(x, x, n), sigma = sqrtf(ss / (float)n);
    std::vector<uint8_t> c4((size_t)n, 0);
    float scale = 0;
    if (ss == 0) {
        if (f == DLLM__Q4_NVFP4) memset(block_scales, 0, (size_t)(n + 15) / 16);
        if (f == DLLM__Q4_E8P) memset(packed, 0, (size_t)n / 2);
    } else {
        switch (f) {
            case DLLM__Q4_NVFP4: scale = dllm__encode_nvfp4(x, n, c4.data(), block_scales, value); break;
            case DLLM__Q4_RTN: scale = dllm__encode_rtn(x, n, c4.data(), value); break;
            case DLLM__Q4_INT4: scale = dllm__encode_int4(x, n, sigma, c4.data(), value); break;
            case DLLM__Q4_LLOYD: scale = dllm__encode_lloyd(x, n, sigma, c4.data(), value); break;
            case DLLM__Q4_E8P: scale = dllm__encode_e8p(x, n, sigma, packed, value); break;
        }
    }
    if (f != DLLM__Q4_E8P)
        for (int i = 0; i < n; i += 2) packed[i / 2] = (uint8_t)(c4[(size_t)i] | c4[(size_t)i + 1] << 4);
    if (ss == 0)  // codes 0 decode to a nonzero C in some formats (INT4: 1); scale 0 makes the row 0
        for (int i = 0; i < n; i++) value[i] = dllm__q4_value(f, packed, block_scales, i);
    if (!(ss <= FLT_MAX)) return NAN;
    if (bias_correction && ss > 0) {
        const float proj = dllm__soloq_dot(value, x, n);
        if (proj > 0) scale = ss / proj;
    }
    return scale;
}

/* Dequantised row r of q: C * row scale. */
static void dllm__q4_row(const dllm__q4_rows &q, int r, float *dst) {
    const uint8_t *packed = q.codes.data() + (size_t)r * q.row_bytes();
    const uint8_t *bs = q.format == DLLM__Q4_NVFP4 ? q.block_scales.data() + (size_t)r * q.blocks() : nullptr;
    if (q.format == DLLM__Q4_E8P) {  // decode each group once
        for (int g = 0; g < q.cols; g += 8) {
            int e1[8], e2[8];
            const uint8_t *p = packed + (size_t)g / 2;
            dllm__e8p_decode4((uint16_t)(p[0] | p[1] << 8), e1);
            dllm__e8p_decode4((uint16_t)(p[2] | p[3] << 8), e2);
            for (int i = 0; i < 8; i++) dst[g + i] = (float)dllm__e8p_int(e1[i], e2[i]) * q.row_scale[(size_t)r];
        }
        return;
    }
    for (int i = 0; i < q.cols; i++) dst[i] = dllm__q4_value(q.format, packed, bs, i) * q.row_scale[(size_t)r];
}

/* Quantises rows x[rows][cols], each row on its own (per token / per row): the pool splits rows, and a row's codes
 * and scale depend on that row only. cols % 8 == 0 (E8P's groups, whole bytes). */
static dllm__q4_rows dllm__q4_quantize(dllm__pool *pool, dllm__q4_format f, const float *x, int rows, int cols, bool bias_correction) {
    dllm__q4_rows q;
    q.format = f, q.rows = rows, q.cols = cols;
    q.codes.resize((size_t)rows * q.row_bytes());
    if (f == DLLM__Q4_NVFP4) q.block_scales.resize((size_t)rows * q.blocks());
    q.row_scale.resize((size_t)rows);
    auto one = [&](int r) {
        std::vector<float> value((size_t)cols);
        q.row_scale[(size_t)r] = dllm__q4_quantize_row(f, x + (size_t)r * cols, cols, bias_correction, q.codes.data() + (size_t)r * q.row_bytes(),
                                                       f == DLLM__Q4_NVFP4 ? q.block_scales.data() + (size_t)r * q.blocks() : nullptr, value.data());
    };
    if (pool) pool->run(rows, one);
    else for (int r = 0; r < rows; r++) one(r);
    return q;
}

/* x := dequantise(quantise(x)) row by row: the value a GEMM input has under a 4-bit format. */
static void dllm__q4_fake_quantize(dllm__q4_format f, float *x, int rows, int cols, bool bias_correction) {
    std::vector<float> value((size_t)cols);
    std::vector<uint8_t> packed((size_t)cols / 2), bs((size_t)(cols + 15) / 16);
    for (int r = 0; r < rows; r++) {
        float *xr = x + (size_t)r * cols;
        const float scale = dllm__q4_quantize_row(f, xr, cols, bias_correction, packed.data(), bs.data(), value.data());
        for (int i = 0; i < cols; i++) xr[i] = value[(size_t)i] * scale;
    }
}

// ---- SoloQ precisions on the CPU: options, quantised weights, the linear hook -------------------------------

/* How a precision quantises (dllm.h's dllm_precision; the ablation switches DLLM_SOLOQ_ROTATION and
 * DLLM_SOLOQ_BIAS_CORRECTION). */
struct dllm__soloq_options {
    bool enabled = false;
    dllm__q4_format weights = DLLM__Q4_NVFP4, acts = DLLM__Q4_NVFP4;
    bool quantize_acts = true;     // false: -w4a16 (activations rotated, not quantised)
    dllm__rot_kind rotation = DLLM__ROT_KRPBH;
    bool bias_correction = true;
    bool quantize_head = false;
    uint64_t seed = 0x50104b52504248ull;  // "SoloKRPBH"-ish: the rotations' Philox key
};

static bool dllm__precision_is_soloq(int p) { return p >= DLLM_PRECISION_SOLOQ_N && p <= DLLM_PRECISION_RTN_W4A16; }

static const char *dllm__precision_name(int p) {
    static const char *const names[] = {"bf16", "fp8", "fp8-all", "soloq-n", "soloq-i", "soloq-c", "rtn-w4a4",
                                        "soloq-n-w4a16", "soloq-i-w4a16", "soloq-c-w4a16", "rtn-w4a16"};
    return p >= 0 && p <= DLLM_PRECISION_RTN_W4A16 ? names[p] : "(unknown)";
}

static dllm_status dllm__soloq_options_for(int precision, int quantize_head, dllm__soloq_options &o) {
    o = dllm__soloq_options();
    if (!dllm__precision_is_soloq(precision)) return DLLM_OK;
    o.enabled = true;
    o.quantize_head = quantize_head != 0;
    const int base = precision >= DLLM_PRECISION_SOLOQ_N_W4A16 ? precision - 4 : precision;
    o.quantize_acts = precision < DLLM_PRECISION_SOLOQ_N_W4A16;
    static const dllm__q4_format w[] = {DLLM__Q4_NVFP4, DLLM__Q4_INT4, DLLM__Q4_E8P, DLLM__Q4_RTN},
                                 a[] = {DLLM__Q4_NVFP4, DLLM__Q4_INT4, DLLM__Q4_LLOYD, DLLM__Q4_RTN};
    o.weights = w[base - DLLM_PRECISION_SOLOQ_N];
    o.acts = a[base - DLLM_PRECISION_SOLOQ_N];
    if (base == DLLM_PRECISION_RTN_W4A4) {  // the baseline is fixed: no rotation, no correction
        o.rotation = DLLM__ROT_NONE;
        o.bias_correction = false;
        return DLLM_OK;
    }
    if (!dllm__env().soloq_rotation.empty()) {
        const char *e = dllm__env().soloq_rotation.c_str();
        int k = -1;
        for (int i = 0; i < 6; i++)
            if (!strcmp(e, dllm__rot_names[i])) k = i;
        if (k < 0) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "DLLM_SOLOQ_ROTATION=%s: expected none, hadamard, rpbh, mixer, krpbh or haar", e);
        o.rotation = (dllm__rot_kind)k;
    }
    if (!dllm__env().soloq_bias_correction.empty()) {
        const char *e = dllm__env().soloq_bias_correction.c_str();
        if (strcmp(e, "0") && strcmp(e, "1")) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "DLLM_SOLOQ_BIAS_CORRECTION=%s: expected 0 or 1", e);
        o.bias_correction = e[0] == '1';
    }
    return DLLM_OK;
}

/* One quantised linear: the rows of W R^T (each weight row rotated by its input site's R) in 4 bits. */
struct dllm__soloq_linear {
    dllm__q4_rows w;
    std::shared_ptr<const dllm__rotation> rot;
};

/* The quantised linears of one layer by site (Q|K|V and gate|up stacked by rows, as the GPU fuses them), or the LM
 * head alone at DLLM__SOLOQ_HEAD; and how activations are treated. */
struct dllm__soloq_layer {
    dllm__soloq_linear lin[DLLM__SOLOQ_SITES];
    dllm__soloq_options opt;
};

/* Rotation sites are numbered layer * 8 + site (the head: layer n_layer), keying each site's own P, D, Q. */
static uint32_t dllm__soloq_site_id(size_t layer, int site) { return (uint32_t)(layer * 8 + (size_t)site); }

/* Stacks tensors by rows in their BF16 values (what the GPU holds), rotates every row by rot and quantises it. */
static dllm__soloq_linear dllm__soloq_quantize_linear(dllm__pool &pool, std::initializer_list<const dllm__tensor *> parts,
                                                      std::shared_ptr<const dllm__rotation> rot, const dllm__soloq_options &o) {
    const int cols = (int)parts.begin()[0]->shape[1];
    int rows = 0;
    for (const dllm__tensor *t : parts) rows += (int)t->shape[0];
    std::vector<float> w((size_t)rows * cols);
    size_t at = 0;
    for (const dllm__tensor *t : parts)
        for (int64_t i = 0; i < t->numel; i++) w[at++] = dllm__bf16_to_f32(dllm__f32_to_bf16(dllm__tensor_at(*t, i)));
    pool.run(rows, [&](int r) {
        std::vector<float> tmp((size_t)cols);
        dllm__rotate(*rot, w.data() + (size_t)r * cols, tmp.data());
        memcpy(w.data() + (size_t)r * cols, tmp.data(), sizeof(float) * cols);
    });
    dllm__soloq_linear lin;
    lin.w = dllm__q4_quantize(&pool, o.weights, w.data(), rows, cols, o.bias_correction);
    lin.rot = rot;
    return lin;
}

/* Every dimension SoloQ quantises along must hold whole E8P groups of 8 (and be small enough for a dense Haar). */
static dllm_status dllm__soloq_check_dims(const dllm__config &c, const dllm__soloq_options &o) {
    const int dims[] = {c.n_embd, c.n_head * c.head_dim, c.n_ff};
    for (int d : dims) {
        if (d % 8) return dllm__fail(DLLM_ERR_UNSUPPORTED, "SoloQ precisions need every linear's input width to be a multiple of 8; this model has %d", d);
        if (o.rotation == DLLM__ROT_HAAR && d > dllm__haar_max_d)
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "DLLM_SOLOQ_ROTATION=haar builds dense rotations of at most %d dimensions; this model has %d (use krpbh)",
                              dllm__haar_max_d, d);
    }
    return DLLM_OK;
}

/* Storage of SoloQ weights in bytes (codes + block scales + row scales), as the GPU will hold them. */
static size_t dllm__soloq_bytes(const dllm__soloq_layer &q) {
    size_t n = 0;
    for (const dllm__soloq_linear &l : q.lin) n += l.w.codes.size() + l.w.block_scales.size() + 4 * l.w.row_scale.size();
    return n;
}

/* The rotation of a site (its input width d); the head's layer is n_layer. */
static std::shared_ptr<const dllm__rotation> dllm__soloq_site_rotation(const dllm__soloq_options &o, size_t layer, int site, int d) {
    return std::make_shared<const dllm__rotation>(dllm__make_rotation(o.rotation, d, o.seed, dllm__soloq_site_id(layer, site)));
}

/* Layer l's four linears quantised from the model's BF16 tensors. */
static std::shared_ptr<const dllm__soloq_layer> dllm__soloq_quantize_layer(const dllm_model &m, dllm__pool &pool, const dllm__soloq_options &o, size_t l) {
    const dllm__config &c = m.cfg;
    const dllm__layer_weights &L = m.layers[l];
    std::shared_ptr<dllm__soloq_layer> q = std::make_shared<dllm__soloq_layer>();
    q->opt = o;
    q->lin[DLLM__SOLOQ_QKV] = dllm__soloq_quantize_linear(pool, {L.wq, L.wk, L.wv}, dllm__soloq_site_rotation(o, l, DLLM__SOLOQ_QKV, c.n_embd), o);
    q->lin[DLLM__SOLOQ_O] = dllm__soloq_quantize_linear(pool, {L.wo}, dllm__soloq_site_rotation(o, l, DLLM__SOLOQ_O, c.n_head * c.head_dim), o);
    q->lin[DLLM__SOLOQ_GU] = dllm__soloq_quantize_linear(pool, {L.gate, L.up}, dllm__soloq_site_rotation(o, l, DLLM__SOLOQ_GU, c.n_embd), o);
    q->lin[DLLM__SOLOQ_DOWN] = dllm__soloq_quantize_linear(pool, {L.down}, dllm__soloq_site_rotation(o, l, DLLM__SOLOQ_DOWN, c.n_ff), o);
    return q;
}

/* The LM head quantised from the model's BF16 head (at lin[DLLM__SOLOQ_HEAD]). */
static std::shared_ptr<const dllm__soloq_layer> dllm__soloq_quantize_head(const dllm_model &m, dllm__pool &pool, const dllm__soloq_options &o) {
    std::shared_ptr<dllm__soloq_layer> h = std::make_shared<dllm__soloq_layer>();
    h->opt = o;
    h->lin[DLLM__SOLOQ_HEAD] = dllm__soloq_quantize_linear(pool, {m.head}, dllm__soloq_site_rotation(o, m.layers.size(), DLLM__SOLOQ_HEAD, m.cfg.n_embd), o);
    return h;
}

/* [quantised checkpoints] What a directory written by dllm_model_quantize holds (dllm_model::soloq): every layer's
 * SoloQ linears as dllm__soloq_quantize_layer makes them (codes, block scales and row scales read from the file, the
 * rotations rebuilt from (kind, d, seed, site)), the head's if it was quantised, and the options they were made with
 * (opt.quantize_acts: the recorded precision's; a -W4A16 context copies the layers with its own). */
struct dllm__soloq_store {
    int precision = DLLM_PRECISION_BF16;  // as recorded (dllm.precision)
    dllm__soloq_options opt;
    std::vector<std::shared_ptr<const dllm__soloq_layer>> layers;
    std::shared_ptr<const dllm__soloq_layer> head;  // null: the head stays BF16
};

/* The options a context on model m quantises with: on a quantised checkpoint the stored rotation, seed and correction
 * (the activations must meet the weights in their basis), and the head quantised when the file holds it. */
static dllm__soloq_options dllm__soloq_effective_options(const dllm_model &m, const dllm__soloq_options &asked) {
    if (!m.soloq) return asked;
    dllm__soloq_options o = m.soloq->opt;
    o.quantize_acts = asked.quantize_acts;
    o.quantize_head = asked.quantize_head || m.soloq->head;
    return o;
}

/* A stored layer under a context's options: shared as it is, or (another activation treatment) copied. */
static std::shared_ptr<const dllm__soloq_layer> dllm__soloq_stored(const std::shared_ptr<const dllm__soloq_layer> &q, const dllm__soloq_options &o) {
    if (q->opt.quantize_acts == o.quantize_acts) return q;
    std::shared_ptr<dllm__soloq_layer> copy = std::make_shared<dllm__soloq_layer>(*q);
    copy->opt = o;
    return copy;
}

/* Weights of every layer (and the head if asked) quantised once at context creation, or taken from a quantised
 * checkpoint (dllm_model::soloq); layer l's entry points at its SoloQ linears. *head: the quantised LM head or null. */
static std::vector<dllm__fp8_layer> dllm__cpu_soloq_weights(const dllm_model &m, dllm__pool &pool, const dllm__soloq_options &asked,
                                                             std::shared_ptr<const dllm__soloq_layer> &head) {
    const dllm__config &c = m.cfg;
    const dllm__soloq_options o = dllm__soloq_effective_options(m, asked);
    std::vector<dllm__fp8_layer> out(m.layers.size());
    for (size_t l = 0; l < m.layers.size(); l++) out[l].soloq = m.soloq ? dllm__soloq_stored(m.soloq->layers[l], o) : dllm__soloq_quantize_layer(m, pool, o, l);
    head.reset();
    if (m.soloq && m.soloq->head) head = dllm__soloq_stored(m.soloq->head, o);
    else if (o.quantize_head) head = dllm__soloq_quantize_head(m, pool, o);
    size_t bytes = head ? dllm__soloq_bytes(*head) : 0, weights = head ? (size_t)head->lin[DLLM__SOLOQ_HEAD].w.rows * c.n_embd : 0;
    for (const dllm__fp8_layer &l : out) {
        bytes += dllm__soloq_bytes(*l.soloq);
        for (const dllm__soloq_linear &lin : l.soloq->lin) weights += (size_t)lin.w.rows * lin.w.cols;
    }
    dllm__log(DLLM_LOG_INFO, "SoloQ: %s weights%s, %s activations, rotation %s, bias correction %s, LM head %s: %.1f MB, %.3f bits a weight",
              dllm__q4_names[o.weights], m.soloq ? " (stored)" : "", o.quantize_acts ? dllm__q4_names[o.acts] : "unquantised", dllm__rot_names[o.rotation],
              o.bias_correction ? "on" : "off", o.quantize_head ? "quantised" : "BF16", bytes / 1e6, 8.0 * bytes / std::max<size_t>(weights, 1));
    return out;
}

/* The input of a SoloQ linear, in place: each row rotated by the site's R, then (W4A4) quantised and dequantised
 * per token. */
static void dllm__soloq_prepare_input(dllm__pool &pool, const dllm__soloq_layer &q, int site, float *x, int T) {
    const dllm__soloq_linear &lin = q.lin[site];
    const int K = lin.w.cols;
    pool.run(T, [&](int t) {
        float *xr = x + (size_t)t * K;
        std::vector<float> tmp((size_t)K);
        dllm__rotate(*lin.rot, xr, tmp.data());
        if (q.opt.quantize_acts) dllm__q4_fake_quantize(q.opt.acts, tmp.data(), 1, K, q.opt.bias_correction);
        memcpy(xr, tmp.data(), sizeof(float) * K);
    });
}

/* The hook of the CPU forward (declared in section 9): y[T][N] = x . W[row0 .. row0 + N)^T (+ bias) on site's
 * quantised weight; with prepare_x, x is first rotated and quantised in place (the later calls on the same input,
 * K and V after Q, up after gate, pass false). */
static void dllm__cpu_linear_soloq(dllm__pool &pool, float *x, bool prepare_x, int T, const dllm__soloq_layer &q, int site, int row0,
                                   const float *bias, int N, float *y) {
    const dllm__soloq_linear &lin = q.lin[site];
    if (prepare_x) dllm__soloq_prepare_input(pool, q, site, x, T);
    dllm__cpu_linear_rows(pool, x, T, lin.w.cols, [&](int n, float *dst) { dllm__q4_row(lin.w, row0 + n, dst); }, bias, N, y);
}

// ---- [W4 GEMM] twin: y = (sum_k C_a C_w * s_x) * s_w on packed weight rows (GPU: q4_gemm, section 13) ---------------

/* The C values of one packed row of K elements (no row scale): E8P decodes each group once. */
static void dllm__q4_row_values(dllm__q4_format f, const uint8_t *packed, const uint8_t *block_scales, int K, float *dst) {
    if (f != DLLM__Q4_E8P) {
        for (int i = 0; i < K; i++) dst[i] = dllm__q4_value(f, packed, block_scales, i);
        return;
    }
    for (int g = 0; g < K; g += 8) {
        int e1[8], e2[8];
        const uint8_t *p = packed + (size_t)g / 2;
        dllm__e8p_decode4((uint16_t)(p[0] | p[1] << 8), e1);
        dllm__e8p_decode4((uint16_t)(p[2] | p[3] << 8), e2);
        for (int i = 0; i < 8; i++) dst[g + i] = (float)dllm__e8p_int(e1[i], e2[i]);
    }
}

/* Twin of the GPU kernel q4_gemm: y[m * ldy + n] = (acc * s_x[m]) * row_scale[n], acc = the fp32 sum over k ascending
 * of A[m][k] * C_w[n][k] (A: bf16 values held as floats, rows lda apart; s_x null = 1), every product exact. Weights:
 * N packed rows of K elements in format f (section 9b's layout: K / 2 bytes a row, NVFP4's ceil(K / 16) block scales
 * a row). Where every partial sum is an integer below 2^24 (INT4 and RTN weights times integer activations), any
 * order of summation gives these bits, so the GPU must match them exactly; elsewhere the order differs within fp32
 * rounding. */
[[maybe_unused]] static void dllm__cpu_q4_gemm(dllm__q4_format f, const uint8_t *codes, const uint8_t *block_scales, const float *row_scale, const float *A, int lda,
                              const float *s_x, float *y, int ldy, int M, int N, int K) {
    std::vector<float> w((size_t)K);
    const int blocks = (K + 15) / 16;
    for (int n = 0; n < N; n++) {
        dllm__q4_row_values(f, codes + (size_t)n * (K / 2), f == DLLM__Q4_NVFP4 ? block_scales + (size_t)n * blocks : nullptr, K, w.data());
        for (int m = 0; m < M; m++) {
            const float *a = A + (size_t)m * lda;
            float acc = 0;
            for (int k = 0; k < K; k++) acc = fmaf(a[k], w[(size_t)k], acc);
            y[(size_t)m * ldy + n] = (acc * (s_x ? s_x[m] : 1.0f)) * row_scale[n];
        }
    }
}

// ---- [INT8 GEMM] twin: y = ((float)sum_k C_x C_w * s_x) * s_w, the sum exact in int32 (GPU: gemm_q4's INT8 path) -----

/* The largest |C| a format's codes decode to, for the formats whose C values are integers (spec 9.2 path A: INT8
 * tensor cores); 0 for NVFP4, whose C values are not. */
static int dllm__q4_int_max(dllm__q4_format f) {
    switch (f) {
        case DLLM__Q4_INT4: return 15;  // 2q + 1, q in [-8, 7]
        case DLLM__Q4_LLOYD: return dllm__lloyd4_int[7];
        case DLLM__Q4_E8P: return 127;
        case DLLM__Q4_RTN: return 8;  // the quantiser writes [-7, 7], but a stored nibble may hold -8
        default: return 0;
    }
}

/* Whether every partial sum of K products of an activation C (format fa) and a weight C (fw) stays below 2^24 in
 * magnitude: then an fp32 accumulation in any order is exact, so q4_gemm, the BF16 path and the INT8 GEMM give the same
 * bits (SoloQ-I at LLaDA-8B's widest K, 14336: 15 * 15 * 14336 = 3.2e6). SoloQ-C's 126 * 127 per product passes only
 * for K <= 1048. */
static bool dllm__q4_int_sum_exact_in_fp32(dllm__q4_format fa, dllm__q4_format fw, int K) {
    const int64_t product = (int64_t)dllm__q4_int_max(fa) * dllm__q4_int_max(fw);
    return product > 0 && product * K < ((int64_t)1 << 24);
}

/* Twin of gemm_q4's INT8 path (the cuBLASLt INT8 GEMM and soloq_scale_rows_i32): y[m * ldy + n] = ((float)acc * s_x[m])
 * * s_w[n], acc the exact int32 sum over k of X[m][k] * W[n][k] (int8 C values, rows ldx and K apart). |acc| is at
 * most 127 * 127 * K, so K up to 2^31 / 127^2 = 133144 cannot overflow. */
[[maybe_unused]] static void dllm__cpu_i8_gemm(const int8_t *X, int ldx, const int8_t *W, const float *s_x, const float *s_w, float *y, int ldy, int M, int N,
                                               int K) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const int8_t *x = X + (size_t)m * ldx, *w = W + (size_t)n * K;
            int32_t acc = 0;
            for (int k = 0; k < K; k++) acc += (int32_t)x[k] * w[k];
            y[(size_t)m * ldy + n] = ((float)acc * s_x[m]) * s_w[n];
        }
}

// ---- [quantised checkpoints]: SoloQ weights quantised once (dllm_model_quantize) and loaded ---------------------
//     The format (dllm.h's dllm_model_quantize, README.md): standard safetensors, per layer and site the packed codes
//     (U8 [rows][cols / 2]), NVFP4's block scales (U8 [rows][ceil(cols / 16)], NVFP4 only) and the row scales (F32
//     [rows]) exactly as dllm__q4_rows holds them, every tensor that stays unquantised copied from the source, and
//     __metadata__ keys dllm.* naming how they were made. A loaded file is checked against the config and its own
//     metadata; the rotations are not stored (a pure function of kind, d, seed and site).

static const char *const dllm__quant_version = "1";
static const char *const dllm__soloq_site_names[DLLM__SOLOQ_SITES] = {"qkv", "o", "gate_up", "down", "lm_head"};
static const char *const dllm__soloq_parts[3] = {"codes", "block_scales", "row_scale"};

/* "model.layers.{l}.soloq.{site}." or, for the head (layer < 0), "lm_head.soloq.". */
static std::string dllm__soloq_prefix(int layer, int site) {
    return layer < 0 ? std::string("lm_head.soloq.") : dllm__format("model.layers.%d.soloq.%s.", layer, dllm__soloq_site_names[site]);
}

static bool dllm__soloq_tensor_name(const std::string &name) { return name.find(".soloq.") != std::string::npos; }

static bool dllm__soloq_replaces(const dllm_model &m, dllm__wkind kind) {
    if (!m.soloq) return false;
    switch (kind) {
        case DLLM__W_Q: case DLLM__W_K: case DLLM__W_V: case DLLM__W_O: case DLLM__W_GATE: case DLLM__W_UP: case DLLM__W_DOWN: return true;
        case DLLM__W_HEAD: return m.soloq->head != nullptr;
        default: return false;
    }
}

/* Rows and columns of a site's stacked weight (Q|K|V and gate|up by rows). */
static void dllm__soloq_site_shape(const dllm__config &c, int site, int &rows, int &cols) {
    const int q = c.n_head * c.head_dim, kv = c.n_head_kv * c.head_dim;
    switch (site) {
        case DLLM__SOLOQ_QKV: rows = q + 2 * kv, cols = c.n_embd; break;
        case DLLM__SOLOQ_O: rows = c.n_embd, cols = q; break;
        case DLLM__SOLOQ_GU: rows = 2 * c.n_ff, cols = c.n_embd; break;
        case DLLM__SOLOQ_DOWN: rows = c.n_embd, cols = c.n_ff; break;
        default: rows = c.n_vocab, cols = c.n_embd; break;
    }
}

/* The dllm.* metadata of options o made for `precision` (the rotation seed in hex: a JSON number loses bits). */
static std::vector<std::pair<std::string, std::string>> dllm__soloq_metadata(const dllm__soloq_options &o, int precision, const std::string &config) {
    return {{"dllm.quant_version", dllm__quant_version},
            {"dllm.precision", dllm__precision_name(precision)},
            {"dllm.weight_format", dllm__q4_names[o.weights]},
            {"dllm.rotation", dllm__rot_names[o.rotation]},
            {"dllm.rotation_seed", dllm__format("0x%016llx", (unsigned long long)o.seed)},
            {"dllm.bias_correction", o.bias_correction ? "1" : "0"},
            {"dllm.quantize_lm_head", o.quantize_head ? "1" : "0"},
            {"dllm.source_config", config}};
}

/* The dllm.* entries of one file's metadata, in order. */
static std::vector<std::pair<std::string, std::string>> dllm__dllm_metadata(const dllm__safetensors &st) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto &kv : st.metadata)
        if (kv.first.compare(0, 5, "dllm.") == 0) out.push_back(kv);
    return out;
}

static dllm_status dllm__meta_get(const std::vector<std::pair<std::string, std::string>> &meta, const char *file, const char *key, std::string &value) {
    int n = 0;
    for (const auto &kv : meta)
        if (kv.first == key) value = kv.second, n++;
    if (n == 0) return dllm__fail(DLLM_ERR_FORMAT, "%s: quantised checkpoint: __metadata__ has no \"%s\"", file, key);
    if (n > 1) return dllm__fail(DLLM_ERR_FORMAT, "%s: quantised checkpoint: __metadata__ names \"%s\" %d times", file, key, n);
    return DLLM_OK;
}

static dllm_status dllm__meta_flag(const std::vector<std::pair<std::string, std::string>> &meta, const char *file, const char *key, bool &flag) {
    std::string v;
    DLLM__TRY(dllm__meta_get(meta, file, key, v));
    if (v != "0" && v != "1") return dllm__fail(DLLM_ERR_FORMAT, "%s: quantised checkpoint: %s is \"%s\", expected \"0\" or \"1\"", file, key, v.c_str());
    flag = v == "1";
    return DLLM_OK;
}

/* The options and precision a file's dllm.* metadata records, each value checked against the others and against the
 * model's config (dllm.source_config must describe the same shapes as config.json). */
static dllm_status dllm__soloq_parse_metadata(const std::vector<std::pair<std::string, std::string>> &meta, const char *file, const dllm__config &cfg,
                                              dllm__soloq_store &s) {
    std::string v;
    DLLM__TRY(dllm__meta_get(meta, file, "dllm.quant_version", v));
    if (v != dllm__quant_version)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: quantised checkpoint format version \"%s\"; this dllm reads version %s (quantise the model again)", file,
                          v.c_str(), dllm__quant_version);
    DLLM__TRY(dllm__meta_get(meta, file, "dllm.precision", v));
    s.precision = -1;
    for (int p = DLLM_PRECISION_SOLOQ_N; p <= DLLM_PRECISION_RTN_W4A16; p++)
        if (v == dllm__precision_name(p)) s.precision = p;
    if (s.precision < 0)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: quantised checkpoint: dllm.precision \"%s\" is not a SoloQ precision (soloq-n, soloq-i, soloq-c, rtn-w4a4 or a -w4a16 form)",
                          file, v.c_str());
    bool head = false;
    DLLM__TRY(dllm__meta_flag(meta, file, "dllm.quantize_lm_head", head));
    dllm__soloq_options o;  // the precision's formats; the rotation and the correction as recorded (below), not as switched
    DLLM__TRY(dllm__soloq_options_for(s.precision, head, o));
    DLLM__TRY(dllm__meta_get(meta, file, "dllm.weight_format", v));
    if (v != dllm__q4_names[o.weights])
        return dllm__fail(DLLM_ERR_FORMAT, "%s: quantised checkpoint: dllm.weight_format \"%s\" does not match dllm.precision %s (whose weights are %s)", file,
                          v.c_str(), dllm__precision_name(s.precision), dllm__q4_names[o.weights]);
    DLLM__TRY(dllm__meta_get(meta, file, "dllm.rotation", v));
    int rot = -1;
    for (int i = 0; i < 6; i++)
        if (v == dllm__rot_names[i]) rot = i;
    if (rot < 0) return dllm__fail(DLLM_ERR_FORMAT, "%s: quantised checkpoint: dllm.rotation \"%s\" is not none, hadamard, rpbh, mixer, krpbh or haar", file, v.c_str());
    o.rotation = (dllm__rot_kind)rot;
    DLLM__TRY(dllm__meta_get(meta, file, "dllm.rotation_seed", v));
    char *end = nullptr;
    errno = 0;
    const unsigned long long seed = strtoull(v.c_str(), &end, 16);
    if (v.size() != 18 || v.compare(0, 2, "0x") || errno || *end)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: quantised checkpoint: dllm.rotation_seed \"%s\" is not 0x and 16 hex digits", file, v.c_str());
    o.seed = (uint64_t)seed;
    DLLM__TRY(dllm__meta_flag(meta, file, "dllm.bias_correction", o.bias_correction));
    if (o.weights == DLLM__Q4_RTN && (o.rotation != DLLM__ROT_NONE || o.bias_correction))
        return dllm__fail(DLLM_ERR_FORMAT, "%s: quantised checkpoint: %s has no rotation and no bias correction, the metadata says %s and %d", file,
                          dllm__precision_name(s.precision), dllm__rot_names[o.rotation], (int)o.bias_correction);
    DLLM__TRY(dllm__meta_get(meta, file, "dllm.source_config", v));
    dllm__json root;
    dllm__config src;
    const std::string what = std::string(file) + " (dllm.source_config)";
    DLLM__TRY(dllm__json_parse(v.data(), v.size(), what, root));
    DLLM__TRY(dllm__config_parse(root, what, src));
    if (src.family != cfg.family || src.n_layer != cfg.n_layer || src.n_embd != cfg.n_embd || src.n_head != cfg.n_head || src.n_head_kv != cfg.n_head_kv ||
        src.head_dim != cfg.head_dim || src.n_ff != cfg.n_ff || src.n_vocab != cfg.n_vocab || src.tied_embeddings != cfg.tied_embeddings)
        return dllm__fail(DLLM_ERR_SHAPE, "%s: quantised checkpoint: the model it was quantised from (%s, %d layers, d=%d, ff %d, vocab %d) is not the one "
                          "config.json describes (%s, %d layers, d=%d, ff %d, vocab %d)", file, dllm__family_name(src.family), src.n_layer, src.n_embd,
                          src.n_ff, src.n_vocab, dllm__family_name(cfg.family), cfg.n_layer, cfg.n_embd, cfg.n_ff, cfg.n_vocab);
    s.opt = o;
    return DLLM_OK;
}

/* One stored part of a site: present, of dtype and shape, or a clear error. */
static dllm_status dllm__soloq_part(const dllm_model &m, const std::string &name, dllm__dtype dtype, std::vector<int64_t> shape, const dllm__tensor *&t) {
    auto it = m.by_name.find(name);
    if (it == m.by_name.end())
        return dllm__fail(DLLM_ERR_SHAPE, "quantised checkpoint %s: missing tensor %s (%s %s)", m.dir.c_str(), name.c_str(), dllm__dtypes[dtype].name,
                          dllm__shape_str(shape).c_str());
    t = it->second;
    if (t->dtype != dtype || t->shape != shape)
        return dllm__fail(DLLM_ERR_SHAPE, "%s: tensor %s is %s %s, expected %s %s (the config's shapes)", t->file->c_str(), name.c_str(),
                          dllm__dtypes[t->dtype].name, dllm__shape_str(t->shape).c_str(), dllm__dtypes[dtype].name, dllm__shape_str(shape).c_str());
    return DLLM_OK;
}

/* A site's rows read from the file: codes, NVFP4's block scales (UE4M3: no sign, not NaN), finite row scales. */
static dllm_status dllm__soloq_read_site(const dllm_model &m, const dllm__soloq_options &o, int layer, int site, dllm__soloq_linear &lin) {
    const std::string prefix = dllm__soloq_prefix(layer, site);
    dllm__q4_rows &q = lin.w;
    q.format = o.weights;
    dllm__soloq_site_shape(m.cfg, site, q.rows, q.cols);
    const dllm__tensor *codes = nullptr, *bs = nullptr, *scale = nullptr;
    DLLM__TRY(dllm__soloq_part(m, prefix + "codes", DLLM__U8, {q.rows, (int64_t)q.row_bytes()}, codes));
    DLLM__TRY(dllm__soloq_part(m, prefix + "row_scale", DLLM__F32, {q.rows}, scale));
    if (o.weights == DLLM__Q4_NVFP4) DLLM__TRY(dllm__soloq_part(m, prefix + "block_scales", DLLM__U8, {q.rows, q.blocks()}, bs));
    else if (m.by_name.count(prefix + "block_scales"))
        return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %sblock_scales: %s weights have no block scales (only NVFP4 has; the metadata says %s)",
                          m.by_name.at(prefix + "block_scales")->file->c_str(), prefix.c_str(), dllm__q4_names[o.weights], dllm__q4_names[o.weights]);
    q.codes.assign(codes->data, codes->data + codes->nbytes);
    if (bs) {
        q.block_scales.assign(bs->data, bs->data + bs->nbytes);
        for (size_t i = 0; i < q.block_scales.size(); i++)
            if (q.block_scales[i] >= 0x7F)
                return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %sblock_scales holds 0x%02x at %zu: not a UE4M3 scale (sign or NaN); the file is damaged",
                                  bs->file->c_str(), prefix.c_str(), q.block_scales[i], i);
    }
    q.row_scale.resize((size_t)q.rows);
    memcpy(q.row_scale.data(), scale->data, scale->nbytes);
    for (int r = 0; r < q.rows; r++)
        if (!std::isfinite(q.row_scale[(size_t)r]))
            return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %srow_scale holds %g at row %d: the checkpoint is damaged (non-finite scale)", scale->file->c_str(),
                              prefix.c_str(), q.row_scale[(size_t)r], r);
    lin.rot = dllm__soloq_site_rotation(o, (size_t)(layer < 0 ? m.cfg.n_layer : layer), site, q.cols);
    return DLLM_OK;
}

/* [quantised checkpoints] Called by dllm__load_model before the BF16 tensors are bound: when the files' metadata says
 * dllm_model_quantize wrote them, reads every stored linear into m.soloq (the tensors they replace are then not
 * expected). Every file of a sharded checkpoint carries the same dllm.* metadata. */
static dllm_status dllm__soloq_load_store(dllm_model &m) {
    const dllm__safetensors *first = nullptr;
    std::vector<std::pair<std::string, std::string>> meta;
    for (const std::unique_ptr<dllm__safetensors> &f : m.files) {
        std::vector<std::pair<std::string, std::string>> mine = dllm__dllm_metadata(*f);
        if (!first) first = f.get(), meta = mine;
        else if (mine != meta)
            return dllm__fail(DLLM_ERR_FORMAT, "%s and %s carry different dllm.* metadata: the shards of a quantised checkpoint must come from one dllm-quantize run",
                              first->file->path.c_str(), f->file->path.c_str());
    }
    if (!first) return DLLM_OK;
    if (meta.empty()) {
        for (const auto &kv : m.by_name)
            if (dllm__soloq_tensor_name(kv.first))
                return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s looks quantised but the file's __metadata__ has no dllm.* keys (a quantised checkpoint "
                                  "names how it was made; quantise it again with dllm-quantize)", kv.second->file->c_str(), kv.first.c_str());
        return DLLM_OK;
    }
    const char *file = first->file->path.c_str();
    std::shared_ptr<dllm__soloq_store> s = std::make_shared<dllm__soloq_store>();
    DLLM__TRY(dllm__soloq_parse_metadata(meta, file, m.cfg, *s));
    DLLM__TRY(dllm__soloq_check_dims(m.cfg, s->opt));
    for (int l = 0; l < m.cfg.n_layer; l++) {
        std::shared_ptr<dllm__soloq_layer> q = std::make_shared<dllm__soloq_layer>();
        q->opt = s->opt;
        for (int site = 0; site < DLLM__SOLOQ_HEAD; site++) {
            DLLM__TRY(dllm__soloq_read_site(m, s->opt, l, site, q->lin[site]));
            m.n_params += (int64_t)q->lin[site].w.rows * q->lin[site].w.cols;
        }
        s->layers.push_back(q);
    }
    if (s->opt.quantize_head) {
        std::shared_ptr<dllm__soloq_layer> h = std::make_shared<dllm__soloq_layer>();
        h->opt = s->opt;
        DLLM__TRY(dllm__soloq_read_site(m, s->opt, -1, DLLM__SOLOQ_HEAD, h->lin[DLLM__SOLOQ_HEAD]));
        if (!m.cfg.tied_embeddings) m.n_params += (int64_t)m.cfg.n_vocab * m.cfg.n_embd;
        s->head = h;
    }
    // A stored tensor the metadata does not account for (another layer, a head not recorded) means the file lies.
    std::unordered_set<std::string> known;
    for (int l = s->head ? -1 : 0; l < m.cfg.n_layer; l++)
        for (int site = l < 0 ? DLLM__SOLOQ_HEAD : 0; site < (l < 0 ? DLLM__SOLOQ_SITES : DLLM__SOLOQ_HEAD); site++)
            for (const char *part : dllm__soloq_parts) known.insert(dllm__soloq_prefix(l, site) + part);
    for (const auto &kv : m.by_name) {
        if (dllm__soloq_tensor_name(kv.first) && !known.count(kv.first))
            return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s is not part of the quantised checkpoint its metadata describes (%d layers, LM head %s)",
                              kv.second->file->c_str(), kv.first.c_str(), m.cfg.n_layer, s->head ? "quantised" : "BF16");
    }
    m.soloq = s;
    dllm__log(DLLM_LOG_INFO, "%s: quantised checkpoint, %s (%s weights, rotation %s), LM head %s", m.dir.c_str(), dllm__precision_name(s->precision),
              dllm__q4_names[s->opt.weights], dllm__rot_names[s->opt.rotation], s->head ? "quantised" : "BF16");
    return DLLM_OK;
}

/* A context's precision on model m: AUTO resolves to what a quantised checkpoint holds (else BF16); on a quantised
 * checkpoint only the recorded weight format's two precisions (W4A4 and -W4A16) are valid, with the recorded rotation
 * and bias correction (an ablation switch set to anything else is an error: the weights were made without it). */
static dllm_status dllm__resolve_precision(const dllm_model &m, int asked, int &precision) {
    precision = asked;
    if (!m.soloq) {
        if (asked == DLLM_PRECISION_AUTO) precision = DLLM_PRECISION_BF16;
        return DLLM_OK;
    }
    const dllm__soloq_store &s = *m.soloq;
    if (asked == DLLM_PRECISION_AUTO) precision = s.precision;
    auto base = [](int p) { return p >= DLLM_PRECISION_SOLOQ_N_W4A16 ? p - 4 : p; };
    if (!dllm__precision_is_soloq(precision) || base(precision) != base(s.precision))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "%s holds %s weights (quantised by dllm-quantize as %s): --precision %s cannot run them; use --precision %s or "
                          "%s-w4a16 (or leave it out), or load the unquantised model", m.dir.c_str(), dllm__q4_names[s.opt.weights],
                          dllm__precision_name(s.precision), dllm__precision_name(precision), dllm__precision_name(base(s.precision)),
                          dllm__precision_name(base(s.precision)));
    const dllm__env_switches &e = dllm__env();
    if (s.opt.weights != DLLM__Q4_RTN && !e.soloq_rotation.empty() && e.soloq_rotation != dllm__rot_names[s.opt.rotation])
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "DLLM_SOLOQ_ROTATION=%s, but %s was quantised with rotation %s: unset it or quantise again",
                          e.soloq_rotation.c_str(), m.dir.c_str(), dllm__rot_names[s.opt.rotation]);
    if (s.opt.weights != DLLM__Q4_RTN && !e.soloq_bias_correction.empty() && (e.soloq_bias_correction == "1") != s.opt.bias_correction)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "DLLM_SOLOQ_BIAS_CORRECTION=%s, but %s was quantised with bias correction %s: unset it or quantise again",
                          e.soloq_bias_correction.c_str(), m.dir.c_str(), s.opt.bias_correction ? "on" : "off");
    return DLLM_OK;
}

/* One tensor of a quantised checkpoint being written: copied from the source (src) or one part of a site's rows. */
struct dllm__qtensor {
    std::string name;
    dllm__dtype dtype = DLLM__U8;
    std::vector<int64_t> shape;
    size_t nbytes = 0;
    const dllm__tensor *src = nullptr;
    int layer = 0, site = 0, part = 0;  // quantised: layer (-1: the head), site, part (index in dllm__soloq_parts)
};

static void dllm__qplan_site(std::vector<dllm__qtensor> &plan, const dllm__config &c, const dllm__soloq_options &o, int layer, int site) {
    int rows = 0, cols = 0;
    dllm__soloq_site_shape(c, site, rows, cols);
    for (int part = 0; part < 3; part++) {
        if (part == 1 && o.weights != DLLM__Q4_NVFP4) continue;  // only NVFP4 has block scales
        dllm__qtensor t;
        t.name = dllm__soloq_prefix(layer, site) + dllm__soloq_parts[part];
        t.dtype = part == 2 ? DLLM__F32 : DLLM__U8;
        t.shape = part == 0 ? std::vector<int64_t>{rows, cols / 2} : part == 1 ? std::vector<int64_t>{rows, (cols + 15) / 16} : std::vector<int64_t>{rows};
        t.nbytes = (size_t)rows * (part == 0 ? (size_t)cols / 2 : part == 1 ? (size_t)(cols + 15) / 16 : 4);
        t.layer = layer, t.site = site, t.part = part;
        plan.push_back(t);
    }
}

/* The tensors of the checkpoint in file order: the source's, with each layer's linears replaced by its four sites (a
 * layer's parts are contiguous, so it is quantised once, when the writer reaches it). */
static std::vector<dllm__qtensor> dllm__qplan(const dllm_model &m, const dllm__soloq_options &o) {
    std::vector<dllm__qtensor> plan;
    for (const dllm__wspec &spec : dllm__expected_weights(m.cfg)) {
        const dllm__wkind k = spec.kind;
        const int site = k == DLLM__W_Q ? DLLM__SOLOQ_QKV : k == DLLM__W_O ? DLLM__SOLOQ_O : k == DLLM__W_GATE ? DLLM__SOLOQ_GU : k == DLLM__W_DOWN ? DLLM__SOLOQ_DOWN
                         : k == DLLM__W_HEAD && o.quantize_head ? DLLM__SOLOQ_HEAD : -1;
        if (site >= 0) dllm__qplan_site(plan, m.cfg, o, site == DLLM__SOLOQ_HEAD ? -1 : spec.layer, site);
        if (site >= 0 || k == DLLM__W_K || k == DLLM__W_V || k == DLLM__W_UP) continue;
        dllm__qtensor t;
        t.src = dllm__find_weight(m, spec, t.name);
        t.dtype = t.src->dtype, t.shape = t.src->shape, t.nbytes = t.src->nbytes;
        plan.push_back(t);
    }
    if (m.cfg.tied_embeddings && o.quantize_head) dllm__qplan_site(plan, m.cfg, o, -1, DLLM__SOLOQ_HEAD);
    return plan;
}

static std::string dllm__json_quote(const std::string &s) {
    std::string out = "\"";
    for (unsigned char ch : s) {
        if (ch == '"' || ch == '\\') out += '\\', out += (char)ch;
        else if (ch < 0x20) out += dllm__format("\\u%04x", ch);
        else out += (char)ch;
    }
    return out + "\"";
}

/* A safetensors header: __metadata__, then each tensor with offsets in order, padded with spaces to 8 bytes (as the
 * reference writer does, so the data buffer starts aligned). */
static std::string dllm__st_header(const std::vector<const dllm__qtensor *> &ts, const std::vector<std::pair<std::string, std::string>> &meta) {
    std::string h = "{\"__metadata__\":{";
    for (size_t i = 0; i < meta.size(); i++) h += (i ? "," : "") + dllm__json_quote(meta[i].first) + ":" + dllm__json_quote(meta[i].second);
    h += "}";
    size_t at = 0;
    for (const dllm__qtensor *t : ts) {
        h += "," + dllm__json_quote(t->name) + ":{\"dtype\":\"" + dllm__dtypes[t->dtype].name + "\",\"shape\":[";
        for (size_t i = 0; i < t->shape.size(); i++) h += (i ? "," : "") + std::to_string(t->shape[i]);
        h += dllm__format("],\"data_offsets\":[%zu,%zu]}", at, at + t->nbytes);
        at += t->nbytes;
    }
    h += "}";
    while (h.size() % 8) h += ' ';
    return h;
}

/* The source of the quantised parts: one layer at a time, quantised when the writer first needs it. */
struct dllm__qsource {
    const dllm_model &m;
    dllm__pool &pool;
    const dllm__soloq_options &o;
    const dllm_quantize_params &params;
    int layer = -2, done = 0;
    std::shared_ptr<const dllm__soloq_layer> q;

    const dllm__q4_rows &rows(int l, int site) {
        if (l != layer) {
            q = l < 0 ? dllm__soloq_quantize_head(m, pool, o) : dllm__soloq_quantize_layer(m, pool, o, (size_t)l);
            layer = l;
            if (params.progress) params.progress(++done, m.cfg.n_layer + (o.quantize_head ? 1 : 0), params.progress_user_data);
        }
        return q->lin[site].w;
    }
};

static dllm_status dllm__write_all(FILE *f, const void *p, size_t n, const std::string &path) {
    if (n && fwrite(p, 1, n, f) != n) return dllm__fail(DLLM_ERR_IO, "writing %s: %s", path.c_str(), strerror(errno));
    return DLLM_OK;
}

/* Writes one file of the checkpoint (to a temporary name, renamed when complete). */
static dllm_status dllm__write_shard(const std::string &path, const std::vector<const dllm__qtensor *> &ts,
                                     const std::vector<std::pair<std::string, std::string>> &meta, dllm__qsource &src) {
    const std::string tmp = path + ".tmp", header = dllm__st_header(ts, meta);
    std::unique_ptr<FILE, int (*)(FILE *)> file(fopen(tmp.c_str(), "wb"), fclose);  // closed if quantising throws
    if (!file) return dllm__fail(DLLM_ERR_IO, "cannot create %s: %s", tmp.c_str(), strerror(errno));
    FILE *f = file.get();
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)header.size() >> (8 * i));
    dllm_status s = dllm__write_all(f, len, 8, tmp);
    if (s == DLLM_OK) s = dllm__write_all(f, header.data(), header.size(), tmp);
    for (size_t i = 0; i < ts.size() && s == DLLM_OK; i++) {
        const dllm__qtensor &t = *ts[i];
        const void *data = t.src ? (const void *)t.src->data : nullptr;
        if (!t.src) {
            const dllm__q4_rows &q = src.rows(t.layer, t.site);
            data = t.part == 0 ? (const void *)q.codes.data() : t.part == 1 ? (const void *)q.block_scales.data() : (const void *)q.row_scale.data();
        }
        s = dllm__write_all(f, data, t.nbytes, tmp);
    }
    if (fclose(file.release()) != 0 && s == DLLM_OK) s = dllm__fail(DLLM_ERR_IO, "writing %s: %s", tmp.c_str(), strerror(errno));
    if (s == DLLM_OK && rename(tmp.c_str(), path.c_str()) != 0) s = dllm__fail(DLLM_ERR_IO, "renaming %s to %s: %s", tmp.c_str(), path.c_str(), strerror(errno));
    if (s != DLLM_OK) unlink(tmp.c_str());
    return s;
}

static dllm_status dllm__write_text(const std::string &path, const std::string &text) {
    FILE *f = fopen(path.c_str(), "wb");
    if (!f) return dllm__fail(DLLM_ERR_IO, "cannot create %s: %s", path.c_str(), strerror(errno));
    dllm_status s = dllm__write_all(f, text.data(), text.size(), path);
    if (fclose(f) != 0 && s == DLLM_OK) s = dllm__fail(DLLM_ERR_IO, "writing %s: %s", path.c_str(), strerror(errno));
    return s;
}

/* A safetensors file name dllm_model_quantize writes (and, with overwrite, replaces). */
static bool dllm__is_checkpoint_file(const std::string &n) {
    const size_t len = n.size();
    return n == "model.safetensors" || n == "model.safetensors.index.json" ||
           (n.compare(0, 6, "model-") == 0 && len > 12 && n.compare(len - 12, 12, ".safetensors") == 0 && n.find("-of-") != std::string::npos);
}

/* out exists as an empty directory (created, parents too), or holds files and overwrite is set (dllm's checkpoint
 * files in it are removed first, so no stale shard or index survives); never the source directory itself. */
static dllm_status dllm__prepare_out_dir(const std::string &out, const std::string &source, bool overwrite) {
    for (size_t i = 1; i <= out.size(); i++)
        if (i == out.size() || out[i] == '/') mkdir(out.substr(0, i).c_str(), 0755);
    struct stat st;
    if (stat(out.c_str(), &st) != 0) return dllm__fail(DLLM_ERR_IO, "cannot create the output directory %s: %s", out.c_str(), strerror(errno));
    if (!S_ISDIR(st.st_mode)) return dllm__fail(DLLM_ERR_IO, "%s exists and is not a directory: choose another output directory", out.c_str());
    char *a = realpath(out.c_str(), nullptr), *b = realpath(source.c_str(), nullptr);
    const bool same = a && b && !strcmp(a, b);
    free(a);
    free(b);
    if (same)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "the output directory %s is the source model's directory: choose another one", out.c_str());
    DIR *d = opendir(out.c_str());
    if (!d) return dllm__fail(DLLM_ERR_IO, "cannot read the output directory %s: %s", out.c_str(), strerror(errno));
    std::vector<std::string> names;
    while (struct dirent *e = readdir(d))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) names.push_back(e->d_name);
    closedir(d);
    if (!names.empty() && !overwrite)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "the output directory %s exists and is not empty (%s, ...): choose another one, or overwrite it "
                          "(dllm-quantize --force)", out.c_str(), names[0].c_str());
    for (const std::string &n : names)
        if (dllm__is_checkpoint_file(n) && unlink(dllm__join_path(out, n.c_str()).c_str()) != 0)
            return dllm__fail(DLLM_ERR_IO, "cannot remove %s/%s: %s", out.c_str(), n.c_str(), strerror(errno));
    return DLLM_OK;
}

/* The files a model directory holds besides its weights, copied as they are. */
static const char *const dllm__model_side_files[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                                     "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json"};

/* dllm_model_quantize: the checkpoint of model under options o (made for `precision`) into out. */
static dllm_status dllm__soloq_write(const dllm_model &m, const std::string &out, int precision, const dllm__soloq_options &o, const dllm_quantize_params &p) {
    std::string config;
    DLLM__TRY(dllm__read_text(dllm__join_path(m.dir, "config.json"), config));
    DLLM__TRY(dllm__prepare_out_dir(out, m.dir, p.overwrite != 0));
    const std::vector<std::pair<std::string, std::string>> meta = dllm__soloq_metadata(o, precision, config);
    const std::vector<dllm__qtensor> plan = dllm__qplan(m, o);
    std::vector<std::vector<const dllm__qtensor *>> shards(1);
    size_t bytes = 0, total = 0;
    for (const dllm__qtensor &t : plan) {
        if (!shards.back().empty() && bytes + t.nbytes > p.max_shard_bytes) shards.emplace_back(), bytes = 0;
        shards.back().push_back(&t);
        bytes += t.nbytes, total += t.nbytes;
    }
    dllm__pool pool(p.n_threads ? p.n_threads : (int)std::max(1u, std::thread::hardware_concurrency()));
    dllm__qsource src{m, pool, o, p, -2, 0, nullptr};
    std::string weight_map;
    for (size_t i = 0; i < shards.size(); i++) {
        const std::string name = shards.size() == 1 ? std::string("model.safetensors") : dllm__format("model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
        DLLM__TRY(dllm__write_shard(dllm__join_path(out, name.c_str()), shards[i], meta, src));
        for (const dllm__qtensor *t : shards[i]) weight_map += (weight_map.empty() ? "" : ",\n    ") + dllm__json_quote(t->name) + ": " + dllm__json_quote(name);
    }
    if (shards.size() > 1)
        DLLM__TRY(dllm__write_text(dllm__join_path(out, "model.safetensors.index.json"),
                                   dllm__format("{\n  \"metadata\": {\"total_size\": %zu},\n  \"weight_map\": {\n    %s\n  }\n}\n", total, weight_map.c_str())));
    for (const char *name : dllm__model_side_files) {
        const std::string from = dllm__join_path(m.dir, name);
        if (!dllm__file_exists(from)) continue;
        std::string text;
        DLLM__TRY(dllm__read_text(from, text));
        DLLM__TRY(dllm__write_text(dllm__join_path(out, name), text));
    }
    dllm__log(DLLM_LOG_INFO, "%s: %s checkpoint of %s, %zu tensors in %zu file(s), %.1f MB", out.c_str(), dllm__precision_name(precision), m.dir.c_str(),
              plan.size(), shards.size(), total / 1e6);
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 9c. [KV quant] SoloQ's commit-time K/V quantisation for block diffusion (spec soloq.md 7; dllm_kv_quant)
//
//     When a forward commits rows (the prefill of the prompt's whole blocks, a finished block), each layer's new K/V
//     rows are quantised once, after the forward (which itself attended to them at full precision), and never again.
//     The block being denoised, and the block cache, stay full precision.
//       Keys (every mode): KIVI per channel (spec 7.1), asymmetric min/max over one group of committed rows, the
//         group = the generation's block (rows [g G, (g + 1) G) of the sequence; commits are whole blocks at
//         multiples of G), FP16 (scale, min) per (layer, group, kv channel). Post-RoPE keys, no rotation.
//       Values, SoloQ: per (token, kv head) the row v' = R v, R the layer's K-RPBH of head_dim (rotation site
//         layer * 8 + 5, the weight sites being 0-4), quantised by Lloyd-Max on v' / RMS (4 bits: 9b's encoder,
//         INT8 levels / 46; 2 bits: the N(0, 1) levels +-0.452780, +-1.510418 of spec 4.2) with one FP32 row scale
//         that carries SoloQ's bias correction (spec 5: ||v'||^2 / <C, v'>).
//       Values, KIVI: per (token, kv head) asymmetric min/max over the head's channels, FP16 (scale, min).
//       Sinks: rows [0, n_sink) are not quantised (codes 0; left out of their key group's min/max).
//     Packing (the GPU twin's too): a row's kvd = n_kv * head_dim codes, element e at bit e * bits of the row's
//     bytes, low bits first (4 bits: element 2i in the low nibble, 9b's order). KIVI codes are unsigned q in
//     [0, 2^b); SoloQ 4-bit codes are 9b's Lloyd codes (bit 3 sign, bits 0-2 level), 2-bit ones bit 1 sign,
//     bit 0 level.
//     R is applied online at commit rather than folded into v_proj / o_proj (spec 7.2's folding): folding would
//     rotate every weight format's V rows and O columns. The CPU twin decodes a committed row once, from the stored
//     codes, into the fp32 cache that the attention reads, values rotated back (R^T of the decoded v'); attention
//     is linear in V, so this equals attending over v' and rotating each head's output back by R^T.
// ---------------------------------------------------------------------------------------------------

/* float -> IEEE half, round to nearest even, saturating at +-65504 (infinities too); NaN stays NaN. */
static uint16_t dllm__f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)(u >> 16 & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477fe000u) return (uint16_t)(sign | 0x7bffu);  // >= 65504
    if (a < 0x38800000u) {                                     // below 2^-14: a subnormal half, in units of 2^-24
        float m;
        memcpy(&m, &a, 4);
        return (uint16_t)(sign | (uint16_t)rintf(m * 16777216.0f));
    }
    uint32_t h = (a >> 13) - (112u << 10);  // exponent rebiased 127 -> 15, the mantissa's top 10 bits
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static const char *const dllm__kvq_names[] = {"none", "soloq-kv4", "soloq-kv2", "kivi-kv4", "kivi-kv2"};  // dllm_kv_quant order
static const int dllm__kvq_value_site = 5;  // the values' rotation site in each layer (dllm__soloq_site_id)
static const float dllm__lloyd2_threshold = 0.981599f;
static const float dllm__lloyd2_levels[2] = {0.452780f, 1.510418f};

static int dllm__kvq_bits(int mode) { return mode == DLLM_KV_QUANT_SOLOQ_KV4 || mode == DLLM_KV_QUANT_KIVI_KV4 ? 4 : mode ? 2 : 0; }
static bool dllm__kvq_is_soloq(int mode) { return mode == DLLM_KV_QUANT_SOLOQ_KV4 || mode == DLLM_KV_QUANT_SOLOQ_KV2; }

/* The default sinks (dllm_ctx_params.kv_sink_tokens = -1): the SoloQ paper keeps position 2 of Fast-dLLM v2 and
 * position 0 of Nemotron; dllm keeps that position and every one before it. */
static int dllm__kvq_default_sinks(const dllm__config &c) { return c.family == DLLM_FAMILY_FAST_DLLM_V2 ? 3 : 1; }

static dllm_status dllm__kvq_check(const dllm__config &c, int mode, int sinks, int max_tokens) {
    if (mode < DLLM_KV_QUANT_NONE || mode > DLLM_KV_QUANT_KIVI_KV2)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "kv_quant %d must be a dllm_kv_quant, DLLM_KV_QUANT_NONE (0) to _KIVI_KV2 (4)", mode);
    if (sinks < -1 || sinks > max_tokens)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "kv_sink_tokens %d must be in [-1, %d] (-1 = the model's default)", sinks, max_tokens);
    if (mode == DLLM_KV_QUANT_NONE) return DLLM_OK;
    if (!dllm__is_block_diffusion(c))
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "kv_quant %s: a %s model has no committed K/V cache to quantise (block-diffusion models only: Fast-dLLM v2, "
                          "Nemotron-Labs-Diffusion); use kv_quant none",
                          dllm__kvq_names[mode], dllm__family_name(c.family));
    if (c.head_dim % 4)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "kv_quant %s needs head_dim %% 4 == 0 (whole bytes of 2-bit codes a head); head_dim is %d",
                          dllm__kvq_names[mode], c.head_dim);
    return DLLM_OK;
}

/* Committed-cache bytes per token (dllm_kv_bytes_per_token): codes, key pairs amortised over the group, and per
 * (token, kv head) 4 bytes (SoloQ's FP32 factor or KIVI's FP16 pair). */
static double dllm__kvq_bytes_per_token(const dllm__config &c, int mode, int group) {
    const double kvd = (double)c.n_head_kv * c.head_dim;
    if (mode == DLLM_KV_QUANT_NONE) return c.n_layer * 2.0 * kvd * 2.0;
    return c.n_layer * (2.0 * kvd * dllm__kvq_bits(mode) / 8.0 + kvd * 4.0 / group + 4.0 * c.n_head_kv);
}

static inline void dllm__kvq_put(uint8_t *row, int e, int bits, unsigned code) { row[e * bits / 8] |= (uint8_t)(code << (e * bits % 8)); }
static inline unsigned dllm__kvq_get(const uint8_t *row, int e, int bits) { return (unsigned)(row[e * bits / 8] >> (e * bits % 8)) & ((1u << bits) - 1); }

/* KIVI's asymmetric b-bit quantiser (spec 7.1) of n values x[i * stride]: the FP16 pair (scale, min) into pair and
 * codes in [0, 2^b) into q[n]. The pair is rounded to FP16 first and the codes come from the rounded pair, so that a
 * value decodes as fmaf(q, scale, min) from exactly what is stored. max == min, or a scale that rounds to 0, stores
 * scale 0 and codes 0 (KIVI's own code would divide by zero); n = 0 stores (0, 0); a non-finite value makes the
 * pair NaN (non-finite input never decodes to finite values). */
static void dllm__kivi_quantize(const float *x, size_t stride, int n, int bits, uint8_t *q, uint16_t pair[2]) {
    float mn = n ? x[0] : 0.0f, mx = mn;
    bool finite = true;
    for (int i = 0; i < n; i++) {
        const float v = x[(size_t)i * stride];
        finite = finite && std::isfinite(v);
        mn = fminf(mn, v), mx = fmaxf(mx, v);
    }
    const float top = (float)((1 << bits) - 1);
    pair[0] = finite ? dllm__f32_to_f16((mx - mn) / top) : (uint16_t)0x7e00u;
    pair[1] = finite ? dllm__f32_to_f16(mn) : (uint16_t)0x7e00u;
    const float scale = dllm__f16_to_f32(pair[0]), minr = dllm__f16_to_f32(pair[1]);
    if (!(scale > 0) && finite) pair[0] = 0;
    for (int i = 0; i < n; i++)
        q[i] = scale > 0 ? (uint8_t)fminf(fmaxf(rintf((x[(size_t)i * stride] - minr) / scale), 0.0f), top) : 0;
}

static inline float dllm__kivi_decode(unsigned q, const uint16_t pair[2]) { return fmaf((float)q, dllm__f16_to_f32(pair[0]), dllm__f16_to_f32(pair[1])); }

/* C of a SoloQ value code: 4 bits, 9b's Lloyd code (an INT8 level); 2 bits, bit 1 sign and bit 0 the level. */
static float dllm__kvq_soloq_c(unsigned code, int bits) {
    if (bits == 4) return (float)(code & 8 ? -dllm__lloyd4_int[code & 7] : dllm__lloyd4_int[code & 7]);
    return code & 2 ? -dllm__lloyd2_levels[code & 1] : dllm__lloyd2_levels[code & 1];
}

/* SoloQ's quantiser of one rotated value row x[n]: codes packed into `packed` (zeroed by the caller) and the row
 * scale returned (an element's value is C * scale). 4 bits: 9b's Lloyd-Max with the bias correction
 * (dllm__q4_quantize_row); 2 bits: the same steps with the 2-bit levels (nearest level of x / RMS, scale
 * ||x||^2 / <C, x>, the RMS if <C, x> <= 0; a zero row has scale 0, a non-finite one NaN). */
static float dllm__kvq_soloq_row(const float *x, int n, int bits, uint8_t *packed) {
    std::vector<float> value((size_t)n);
    if (bits == 4) return dllm__q4_quantize_row(DLLM__Q4_LLOYD, x, n, true, packed, nullptr, value.data());
    const float ss = dllm__soloq_dot(x, x, n), sigma = sqrtf(ss / (float)n);
    if (ss == 0) return 0.0f;
    for (int i = 0; i < n; i++) {
        const float z = x[i] / sigma;
        const unsigned code = (z < 0 ? 2u : 0u) | (fabsf(z) >= dllm__lloyd2_threshold ? 1u : 0u);
        dllm__kvq_put(packed, i, 2, code);
        value[(size_t)i] = dllm__kvq_soloq_c(code, 2);
    }
    if (!(ss <= FLT_MAX)) return NAN;
    const float proj = dllm__soloq_dot(value.data(), x, n);
    return proj > 0 ? ss / proj : sigma;
}

/* The quantised committed rows of one block-diffusion generation (this section's packing), and how they are made. */
struct dllm__kvq {
    int mode = DLLM_KV_QUANT_NONE, bits = 0, n_sink = 0;
    int n_layer = 0, n_kv = 0, hd = 0, kvd = 0, cap = 0;
    int group = 0;                          // rows per key group: the first commit's block (0: nothing committed yet)
    std::vector<dllm__rotation> rot;        // SoloQ: each layer's R of head_dim
    std::vector<uint8_t> k_codes, v_codes;  // [layer][cap][row_bytes()]
    std::vector<uint16_t> k_pairs;          // [layer][groups()][kvd][2] FP16 (scale, min)
    std::vector<uint16_t> v_pairs;          // KIVI: [layer][cap][n_kv][2] FP16 (scale, min)
    std::vector<float> v_scale;             // SoloQ: [layer][cap][n_kv] row scales

    bool enabled() const { return mode != DLLM_KV_QUANT_NONE; }
    bool soloq() const { return dllm__kvq_is_soloq(mode); }
    size_t row_bytes() const { return (size_t)kvd * bits / 8; }
    int groups() const { return group ? (cap + group - 1) / group : 0; }
    size_t row_at(int l, int r) const { return ((size_t)l * cap + r) * row_bytes(); }              // k_codes, v_codes
    size_t k_pair_at(int l, int r, int e) const { return (((size_t)l * groups() + r / group) * kvd + e) * 2; }  // k_pairs
    size_t head_at(int l, int r, int h) const { return ((size_t)l * cap + r) * n_kv + h; }        // v_scale; v_pairs / 2

    /* A context's settings (validated by dllm__kvq_check); sinks -1 is the model's default. */
    void setup(const dllm__config &c, int mode_, int sinks) {
        mode = mode_, bits = dllm__kvq_bits(mode_), n_sink = sinks < 0 ? dllm__kvq_default_sinks(c) : sinks;
        n_layer = c.n_layer, n_kv = c.n_head_kv, hd = c.head_dim, kvd = n_kv * hd;
        rot.clear();
        for (int l = 0; soloq() && l < n_layer; l++)
            rot.push_back(dllm__make_rotation(DLLM__ROT_KRPBH, hd, dllm__soloq_options().seed, dllm__soloq_site_id((size_t)l, dllm__kvq_value_site)));
    }

    /* A generation starts with `rows` empty rows. */
    void reset(int rows) {
        cap = rows, group = 0;
        k_codes.assign((size_t)n_layer * cap * row_bytes(), 0);
        v_codes.assign(k_codes.size(), 0);
        k_pairs.clear();
        v_pairs.assign(soloq() ? 0 : (size_t)n_layer * cap * n_kv * 2, 0);
        v_scale.assign(soloq() ? (size_t)n_layer * cap * n_kv : 0, 0.0f);
    }
};

/* Key element e of committed row r of layer l, decoded. */
static float dllm__kvq_key(const dllm__kvq &q, int l, int r, int e) {
    return dllm__kivi_decode(dllm__kvq_get(&q.k_codes[q.row_at(l, r)], e, q.bits), &q.k_pairs[q.k_pair_at(l, r, e)]);
}

/* Values of kv head h of committed row r of layer l, decoded into out[hd]: SoloQ's in the rotated basis (C * scale). */
static void dllm__kvq_value(const dllm__kvq &q, int l, int r, int h, float *out) {
    const uint8_t *row = &q.v_codes[q.row_at(l, r)];
    const size_t at = q.head_at(l, r, h);
    for (int i = 0; i < q.hd; i++) {
        const unsigned code = dllm__kvq_get(row, h * q.hd + i, q.bits);
        out[i] = q.soloq() ? dllm__kvq_soloq_c(code, q.bits) * q.v_scale[at] : dllm__kivi_decode(code, &q.v_pairs[2 * at]);
    }
}

/* Keys of layer l's rows [row0, row1) (whole groups; rows below n_sink left out), kv head by kv head (a head's codes
 * are whole bytes): codes and pairs into the store, then the decoded keys over k. */
static void dllm__kvq_commit_keys(dllm__pool &pool, dllm__kvq &q, int l, float *k, int row0, int row1) {
    pool.run(q.n_kv, [&](int h) {
        std::vector<uint8_t> codes((size_t)q.group);
        for (int g0 = row0; g0 < row1; g0 += q.group) {
            const int a = std::max(g0, q.n_sink), n = std::max(0, g0 + q.group - a);
            for (int e = h * q.hd; e < (h + 1) * q.hd; e++) {
                dllm__kivi_quantize(k + (size_t)a * q.kvd + e, (size_t)q.kvd, n, q.bits, codes.data(), &q.k_pairs[q.k_pair_at(l, g0, e)]);
                for (int i = 0; i < n; i++) {
                    dllm__kvq_put(&q.k_codes[q.row_at(l, a + i)], e, q.bits, codes[(size_t)i]);
                    k[(size_t)(a + i) * q.kvd + e] = dllm__kvq_key(q, l, a + i, e);
                }
            }
        }
    });
}

/* Values of layer l's rows [row0, row1) (rows below n_sink left out), row by row: codes and scales into the store,
 * then the decoded values (SoloQ: rotated back) over v. */
static void dllm__kvq_commit_values(dllm__pool &pool, dllm__kvq &q, int l, float *v, int row0, int row1) {
    const int first = std::max(row0, q.n_sink);
    if (first >= row1) return;
    pool.run(row1 - first, [&](int i) {
        const int r = first + i;
        uint8_t *row = &q.v_codes[q.row_at(l, r)];
        std::vector<float> rotated((size_t)q.hd), decoded((size_t)q.hd);
        std::vector<uint8_t> codes((size_t)q.hd);
        for (int h = 0; h < q.n_kv; h++) {
            float *x = v + (size_t)r * q.kvd + (size_t)h * q.hd;
            if (q.soloq()) {
                dllm__rotate(q.rot[(size_t)l], x, rotated.data());
                q.v_scale[q.head_at(l, r, h)] = dllm__kvq_soloq_row(rotated.data(), q.hd, q.bits, row + (size_t)h * q.hd * q.bits / 8);
            } else {
                dllm__kivi_quantize(x, 1, q.hd, q.bits, codes.data(), &q.v_pairs[2 * q.head_at(l, r, h)]);
                for (int c = 0; c < q.hd; c++) dllm__kvq_put(row, h * q.hd + c, q.bits, codes[(size_t)c]);
            }
            dllm__kvq_value(q, l, r, h, decoded.data());
            if (q.soloq()) dllm__rotate_inverse(q.rot[(size_t)l], decoded.data(), x);
            else memcpy(x, decoded.data(), sizeof(float) * q.hd);
        }
    });
}

/* The commit of rows [row0, row0 + T) of kv (every layer; the forward that appended them has run): quantised into q
 * and replaced in kv by their decoded values, which is what later forwards attend to. Commits are whole key groups of
 * `group` rows (the generation's block), the same group all generation long. */
static dllm_status dllm__kvq_commit(dllm__pool &pool, dllm__kvq &q, dllm__bd_kv &kv, int row0, int T, int group) {
    if (!q.group) {
        q.group = group;
        q.k_pairs.assign((size_t)q.n_layer * q.groups() * q.kvd * 2, 0);
    }
    if (group != q.group || group <= 0 || row0 % group || T % group || kv.cap != q.cap)
        return dllm__fail(DLLM_ERR_INTERNAL, "kv_quant: a commit of rows [%d, %d) is not whole key groups of %d rows (the generation's block: %d)", row0,
                          row0 + T, group, q.group);
    for (int l = 0; l < q.n_layer; l++) {
        dllm__kvq_commit_keys(pool, q, l, kv.k.data() + (size_t)l * kv.cap * q.kvd, row0, row0 + T);
        dllm__kvq_commit_values(pool, q, l, kv.v.data() + (size_t)l * kv.cap * q.kvd, row0, row0 + T);
    }
    return DLLM_OK;
}

/* [KV quant] The key splits of the tensor-core attention (DLLM_KVQ_TC=1; device: kvq_split, kvq_n_splits): the bf16
 * sinks [0, min(n_sink, n_committed)), the quantised rows up to n_committed and the bf16 rows past them up to n_keys,
 * each range cut at multiples of split_keys, so that no split mixes the two kinds (SoloQ's quantised values are in the
 * rotated basis). Split s is keys [j0, j1) of one range; quant says which kind. */
static void dllm__kvq_tc_ranges(int n_keys, int n_committed, int n_sink, int lo[3], int hi[3]) {
    const int qa = std::min(n_sink, n_committed);
    lo[0] = 0, hi[0] = qa, lo[1] = qa, hi[1] = n_committed, lo[2] = n_committed, hi[2] = n_keys;
}
static int dllm__kvq_tc_n_splits(int n_keys, int n_committed, int n_sink, int split_keys) {
    int lo[3], hi[3], n = 0;
    dllm__kvq_tc_ranges(n_keys, n_committed, n_sink, lo, hi);
    for (int r = 0; r < 3; r++) n += hi[r] > lo[r] ? (hi[r] - 1) / split_keys - lo[r] / split_keys + 1 : 0;
    return n;
}
static void dllm__kvq_tc_split(int n_keys, int n_committed, int n_sink, int split_keys, int s, int &j0, int &j1, bool &quant) {
    int lo[3], hi[3];
    dllm__kvq_tc_ranges(n_keys, n_committed, n_sink, lo, hi);
    for (int r = 0; r < 3; r++) {
        const int n = hi[r] > lo[r] ? (hi[r] - 1) / split_keys - lo[r] / split_keys + 1 : 0;
        if (s < n) {
            j0 = std::max(lo[r], (lo[r] / split_keys + s) * split_keys), j1 = std::min(hi[r], (lo[r] / split_keys + s + 1) * split_keys);
            quant = r == 1;
            return;
        }
        s -= n;
    }
    j0 = j1 = 0, quant = false;
}

/* The block-causal attention of kvq_flash + kvq_flash_combine (section 13, DLLM_KVQ_TC=1) as they compute it, up to
 * fp32 summation order and the device's ex2.approx: the CPU twin the GPU tests compare them with. Inputs as the device
 * holds them: layer l's codes in q; `cache` [rows][2 kvd] the bf16 K|V rows (as floats) that the sinks and the rows
 * from n_committed on are read from; queries x [q_rows][q_stride] (bf16 values, head h at h * hd); out [q_rows][n_head
 * hd], fp32 (the kernel rounds it to bf16). Per split (dllm__kvq_tc_split) and per 32-key chunk at multiples of 32 (the
 * device's mma step): scores in fp32 against keys rounded to bf16 (a quantised key decoded, fmaf(code, scale, min),
 * then rounded), the online softmax in the log2 domain, probabilities rounded to bf16 before they meet the values
 * (rounded to bf16 too; SoloQ's C * scale in the rotated basis: the row scale is folded into the decoded value). The
 * splits merge in order, SoloQ's quantised ones rotated back once (R^T) before the bf16 ones join. */
DLLM__TEST_HOOK static void dllm__kvq_flash_twin(const dllm__kvq &q, int l, const float *cache, const float *x, int q_stride, int n_head, int q_rows, int n_keys,
                                 int n_committed, int mask_block, int q_index0, float scale, int split_keys, float *out) {
    const int hd = q.hd, kvd = q.kvd, group = n_head / q.n_kv, n_splits = dllm__kvq_tc_n_splits(n_keys, n_committed, q.n_sink, split_keys);
    const float scale_log2 = scale * 1.4426950408889634f;
    auto bf16 = [](float v) { return dllm__bf16_to_f32(dllm__f32_to_bf16(v)); };
    std::vector<float> key((size_t)hd), value((size_t)hd), o((size_t)n_splits * hd), ms((size_t)n_splits), ls((size_t)n_splits);
    std::vector<float> acc((size_t)hd), racc((size_t)hd), back((size_t)hd), sc(32), vals((size_t)32 * hd);
    for (int i = 0; i < q_rows; i++)
        for (int h = 0; h < n_head; h++) {
            const int kvh = h / group, n_visible = mask_block ? std::min(n_keys, ((q_index0 + i) / mask_block + 1) * mask_block) : n_keys;
            const float *qi = x + (size_t)i * q_stride + (size_t)h * hd;
            for (int s = 0; s < n_splits; s++) {
                int j0, j1;
                bool quant;
                dllm__kvq_tc_split(n_keys, n_committed, q.n_sink, split_keys, s, j0, j1, quant);
                float m = -INFINITY, lsum = 0.0f, *os = &o[(size_t)s * hd];
                std::fill(os, os + hd, 0.0f);
                const int end = std::min(j1, n_visible);
                for (int c0 = j0 / 32 * 32; c0 < end; c0 += 32) {
                    const int a = std::max(c0, j0), b = std::min(c0 + 32, end);
                    float mx = -INFINITY;
                    for (int j = a; j < b; j++) {
                        float *v = &vals[(size_t)(j - a) * hd];
                        if (quant) {
                            for (int c = 0; c < hd; c++) key[(size_t)c] = bf16(dllm__kvq_key(q, l, j, kvh * hd + c));
                            dllm__kvq_value(q, l, j, kvh, v);
                            for (int c = 0; c < hd; c++) v[c] = bf16(v[c]);
                        } else {
                            const float *row = cache + (size_t)j * 2 * kvd + (size_t)kvh * hd;
                            for (int c = 0; c < hd; c++) key[(size_t)c] = row[c], v[c] = row[kvd + c];
                        }
                        float dot = 0.0f;
                        for (int c = 0; c < hd; c++) dot = fmaf(qi[c], key[(size_t)c], dot);
                        sc[(size_t)(j - a)] = dot, mx = std::max(mx, dot);
                    }
                    const float n0 = std::max(m, mx * scale_log2), base = n0 == -INFINITY ? 0.0f : n0, corr = exp2f(m - base);
                    m = n0, lsum *= corr;
                    for (int c = 0; c < hd; c++) os[c] *= corr;
                    for (int j = a; j < b; j++) {
                        const float p = exp2f(fmaf(sc[(size_t)(j - a)], scale_log2, -base)), pb = bf16(p);
                        const float *v = &vals[(size_t)(j - a) * hd];
                        lsum += p;
                        for (int c = 0; c < hd; c++) os[c] = fmaf(pb, v[c], os[c]);
                    }
                }
                ms[(size_t)s] = m, ls[(size_t)s] = lsum;
            }
            float mx = -INFINITY, lsum = 0.0f;
            for (int s = 0; s < n_splits; s++) mx = std::max(mx, ms[(size_t)s]);
            std::fill(acc.begin(), acc.end(), 0.0f);
            std::fill(racc.begin(), racc.end(), 0.0f);
            for (int s = 0; s < n_splits; s++) {
                if (ms[(size_t)s] == -INFINITY) continue;
                int j0, j1;
                bool quant;
                dllm__kvq_tc_split(n_keys, n_committed, q.n_sink, split_keys, s, j0, j1, quant);
                const float w = exp2f(ms[(size_t)s] - mx);
                lsum = fmaf(w, ls[(size_t)s], lsum);
                std::vector<float> &dst = quant && q.soloq() ? racc : acc;
                for (int c = 0; c < hd; c++) dst[(size_t)c] = fmaf(w, o[(size_t)s * hd + c], dst[(size_t)c]);
            }
            if (q.soloq()) dllm__rotate_inverse(q.rot[(size_t)l], racc.data(), back.data());
            const float inv = lsum > 0 ? 1.0f / lsum : 0.0f;
            float *oi = out + (size_t)i * n_head * hd + (size_t)h * hd;
            for (int c = 0; c < hd; c++) oi[c] = (acc[(size_t)c] + (q.soloq() ? back[(size_t)c] : 0.0f)) * inv;
        }
}

// ---------------------------------------------------------------------------------------------------
// 10. Token choice: argmax / Gumbel-max, confidences (LLaDA's, Dream's), unmasking rules
//    These are the CPU twins of the GPU sampler kernels. Ties go to the lower vocabulary index and to
//    the lower canvas position, so the result never depends on evaluation order.
// ---------------------------------------------------------------------------------------------------

struct dllm__sampling {
    double temperature = 0;
    dllm_remasking remasking = DLLM_REMASK_LOW_CONFIDENCE;
    bool tempered_conf = false;    // the confidence's softmax is Dream's softmax(l / T), not LLaDA's softmax(l)
    double alg_temp = 0;           // > 0: rank by conf / alg_temp + Gumbel noise (Dream's alg_temp)
    uint64_t seed = 0;
    bool eos_logit_inf = false;    // logits_eos_inf
    bool defer_eos_eot = false;    // confidence_eos_eot_inf
    int32_t eos_id = -1, eot_id = -1;
    int top_k = 0;                 // the filters of dllm_gen_params (dllm.h): 0, 1, 0 = off
    double top_p = 1, min_p = 0;
    bool filters() const { return top_k > 0 || (top_p > 0 && top_p < 1) || min_p > 0; }
};

struct dllm__choice {
    int32_t token;
    double conf;    // the ranking key: the confidence, or with alg_temp its Gumbel-perturbed conf / alg_temp
    bool deferred;  // predicts EOS/EoT under confidence_eos_eot_inf: ranked after every other candidate
};

/* The ranking key of a row from its softmax statistics: z = sum e^x and zx = sum e^x x over the vocabulary,
 * x = (l - max logit) * inv_t, and the x of x0 and of the second largest logit. Twin: row_confidence. */
static double dllm__confidence(const dllm__sampling &s, double z, double zx, double x_best, double x_second, uint32_t pos, uint32_t step) {
    double c;
    switch (s.remasking) {
    case DLLM_REMASK_RANDOM: c = dllm__uniform(s.seed, 0, pos, step, DLLM__RNG_REMASK); break;
    case DLLM_REMASK_ORIGIN: c = -dllm__uniform(s.seed, 0, pos, step, DLLM__RNG_ORIGIN); break;
    case DLLM_REMASK_MARGIN: c = -expm1(x_second) / z; break;  // (e^0 - e^x_second) / z: top1 - top2
    case DLLM_REMASK_ENTROPY: c = zx / z - log(z); break;      // sum q log q with log q = x - log z
    default: c = exp(x_best) / z;
    }
    if (c != c) c = -INFINITY;  // NaN logits never win a slot
    // Gumbel-top-k: the k largest conf / alg_temp + G are a sample without replacement from softmax(conf / alg_temp).
    if (s.alg_temp > 0) c = c / s.alg_temp - log(-log(dllm__uniform(s.seed, 0, pos, step, DLLM__RNG_ALG_TEMP)));
    return c;
}

/* The sampler filters as one cutoff logit: a token is kept iff its logit is >= the cutoff (-inf keeps every
 * non-NaN logit), the largest of the three cutoffs below, each a logit of the row. With x = (l - max) * inv_t,
 * inv_t = 1/T at T > 0 else 1, and p = e^x / Z: top-k's is the k-th largest logit; top-p's the largest
 * logit t whose mass sum_{l >= t} e^x reaches top_p * Z; min-p's the smallest logit with e^x >= min_p.
 * NaN logits count nowhere. Twin: row_cutoff_kernel, which finds the same logits by bisection (the top-p
 * mass is summed in another order there: a cut within float64 rounding of top_p * Z may differ). */
static float dllm__row_cutoff(const std::vector<float> &row, const dllm__sampling &s) {
    std::vector<float> v;
    v.reserve(row.size());
    for (float l : row)
        if (l == l) v.push_back(l);
    float cut = -INFINITY;
    if (v.empty()) return cut;
    std::sort(v.begin(), v.end(), std::greater<float>());
    if (s.top_k > 0 && (size_t)s.top_k <= v.size()) cut = std::max(cut, v[(size_t)s.top_k - 1]);
    if (v[0] == -INFINITY) return cut;
    const double inv_t = s.temperature > 0 ? 1.0 / s.temperature : 1.0, mx = v[0];
    auto weight = [&](float l) { return exp(((double)l - mx) * inv_t); };
    if (s.top_p > 0 && s.top_p < 1) {
        double z = 0, mass = 0;
        for (float l : v) z += weight(l);
        for (size_t i = 0; i < v.size(); i++) {
            mass += weight(v[i]);
            if ((i + 1 == v.size() || v[i + 1] != v[i]) && mass >= s.top_p * z) { cut = std::max(cut, v[i]); break; }  // ties: the whole group
        }
    }
    if (s.min_p > 0) {
        float smallest = v[0];
        for (float l : v)
            if (weight(l) >= s.min_p) smallest = l;
        cut = std::max(cut, smallest);
    }
    return cut;
}

/* x0 and its ranking key for one canvas position from its logits row (generate.py and Dream semantics):
 * x0 = argmax(l) at T = 0, else argmax(exp(l) / (-log u)^T) in float64 (Gumbel-max of softmax(l/T)).
 * The confidence is taken in float64 under q = softmax(l * inv_t), inv_t = 1/T where Dream tempers it, else 1:
 * q(x0) (LOW_CONFIDENCE), q(top1) - q(top2) (MARGIN), sum q log q (ENTROPY), u (RANDOM), or -u (ORIGIN: ranked
 * by ascending draw, the draws below the transfer probability are a prefix of the ranking). */
static dllm__choice dllm__choose(const float *logits, int n_vocab, const dllm__sampling &s, uint32_t pos, uint32_t step) {
    auto raw_logit = [&](int v) { return s.eos_logit_inf && v == s.eos_id ? -INFINITY : logits[v]; };
    float cutoff = -INFINITY;
    const bool filtered = s.filters();
    if (filtered) {
        std::vector<float> row((size_t)n_vocab);
        for (int v = 0; v < n_vocab; v++) row[(size_t)v] = raw_logit(v);
        cutoff = dllm__row_cutoff(row, s);
    }
    // A filtered token (NaN included) is -inf to everything below; with no filter the row is untouched.
    auto logit = [&](int v) { float l = raw_logit(v); return filtered && !(l >= cutoff) ? -INFINITY : l; };
    int best = 0;
    double best_score = -INFINITY;
    float max_logit = -INFINITY, second_logit = -INFINITY;  // a tie for the largest counts twice
    for (int v = 0; v < n_vocab; v++) {
        float l = logit(v);
        second_logit = std::max(second_logit, l > max_logit ? max_logit : l);  // a NaN never enters, as on the GPU
        if (l > max_logit) max_logit = l;
        double score = l;
        if (s.temperature > 0) {
            double u = dllm__uniform(s.seed, (uint32_t)v, pos, step, DLLM__RNG_GUMBEL);
            score = exp((double)l) / pow(-log(u), s.temperature);
        }
        if (score > best_score) { best_score = score; best = v; }
    }
    const double inv_t = s.tempered_conf && s.temperature > 0 ? 1.0 / s.temperature : 1.0;
    double z = 0, zx = 0;
    for (int v = 0; v < n_vocab; v++) {
        double x = ((double)logit(v) - max_logit) * inv_t, e = exp(x);
        z += e;
        if (e > 0) zx += e * x;  // e = 0 at x = -inf: the term is 0, not NaN
    }
    dllm__choice ch;
    ch.token = best;
    ch.conf = dllm__confidence(s, z, zx, ((double)logit(best) - max_logit) * inv_t, ((double)second_logit - max_logit) * inv_t, pos, step);
    ch.deferred = s.defer_eos_eot && (best == s.eos_id || best == s.eot_id);
    return ch;
}

/* How many candidates a step commits (decoding.md 1, 2, 4). Twin: select_commit on the device. */
struct dllm__unmask_rule {
    dllm_unmask kind = DLLM_UNMASK_SCHEDULE;
    double threshold = 0.9, factor = 1.0, eps = 1e-3;
    bool origin = false;  // DLLM_REMASK_ORIGIN (TIMESTEPS only): each candidate transfers with the step's probability
};

/* Dream's timesteps t = linspace(1, eps, s + 1): step i moves the fraction 1 - t[i+1]/t[i] of the masks left,
 * all of them at the last step. In float64 (Dream: float32, so a count can differ where n times this fraction
 * is within float32 rounding of an integer). Twin: timestep_fraction; no product feeds a sum here, so the GPU
 * cannot fuse an FMA that would round differently. */
static double dllm__timestep_fraction(int i, int s, double eps) {
    if (i >= s - 1) return 1.0;
    double t = 1.0 - (1.0 - eps) * i / s, u = 1.0 - (1.0 - eps) * (i + 1) / s;
    return 1.0 - u / t;
}

/* Dream's count for n candidates left at step i of s: floor(n (1 - t[i+1]/t[i])), possibly 0; n at the last step. */
static int dllm__timestep_count(int n, int s, int i, double eps) { return (int)floor(n * dllm__timestep_fraction(i, s, eps)); }

/* Does the candidate of 0-based rank r (best first) pass? A step commits the ranks before the first that
 * fails. Threshold: Fast-dLLM's `conf >= tau` with the best always in. Factor: the n-th best (n = r + 1)
 * needs c_n >= 1 - f / (n + 1); the first always passes. Fast-dLLM's factor code commits one more when the
 * last candidate fails (an off-by-one); dllm stops at the first failure, the rule as published. A deferred
 * candidate (EOS/EoT under confidence_eos_eot_inf) only ever enters as the best. Origin: the draw u = -conf
 * is below the transfer probability. The counted rules: the first k. */
static bool dllm__passes(const dllm__unmask_rule &u, int r, const dllm__choice &c, int k, double p_transfer) {
    switch (u.kind) {
    case DLLM_UNMASK_THRESHOLD: return r == 0 || (!c.deferred && c.conf >= u.threshold);
    case DLLM_UNMASK_FACTOR: return r == 0 || (!c.deferred && c.conf >= 1.0 - u.factor / (r + 2));
    default: return u.origin ? -c.conf < p_transfer : r < k;
    }
}

/* The candidates a step commits, as indices into cand in ascending position order. Rank: non-deferred
 * before deferred, then higher confidence, then lower position; k is a counted rule's count, p_transfer
 * ORIGIN's probability. */
static std::vector<int> dllm__select(const std::vector<int32_t> &cand_pos, const std::vector<dllm__choice> &ch, const dllm__unmask_rule &u, int k,
                                     double p_transfer = 0) {
    std::vector<int> order(cand_pos.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = (int)i;
    auto better = [&](int a, int b) {
        if (ch[(size_t)a].deferred != ch[(size_t)b].deferred) return !ch[(size_t)a].deferred;
        if (ch[(size_t)a].conf != ch[(size_t)b].conf) return ch[(size_t)a].conf > ch[(size_t)b].conf;
        return cand_pos[(size_t)a] < cand_pos[(size_t)b];
    };
    std::sort(order.begin(), order.end(), better);
    size_t n = 0;
    while (n < order.size() && dllm__passes(u, (int)n, ch[(size_t)order[n]], k, p_transfer)) n++;
    order.resize(n);
    std::sort(order.begin(), order.end());
    return order;
}

// ---------------------------------------------------------------------------------------------------
// 10b. [tensor parallelism] (issue 29): the sharding plan, the CPU reference of a sharded forward, the
//      vocab-split token choice. Megatron-LM's split of one model over R ranks (one GPU each):
//      - Q/K/V and gate/up are column-parallel (Megatron's name for splitting Y = XA by A's columns, the output
//        features; in HF's [out, in] layout these are ROWS): rank r computes its attention heads (and the GQA K/V
//        heads they read) and its slice of the FFN width from the whole input;
//      - O and down are row-parallel (A's rows, the input features; COLUMNS of [out, in]): rank r multiplies its
//        heads' / its FFN slice's features and every rank holds a partial sum of the full output, added up by one
//        all-reduce after O and one after down per layer;
//      - the embedding and the LM head are split by vocabulary rows (Megatron's VocabParallelEmbedding: a rank
//        looks up the tokens it holds, zeros elsewhere, one all-reduce; the head's logits stay split and the sampler
//        reduces across ranks); norms and q/k/v biases of a rank's heads follow their rows, norms are replicated.
//      This section is the CPU twin that defines the numerics of the GPU's sharded forward (fp32; the all-reduce
//      sums the ranks' partials in rank order). The GPU side (NCCL through [dlopen], section 12) is not built yet.
// ---------------------------------------------------------------------------------------------------

static const int dllm__tp_max_ranks = DLLM_MAX_DEVICES;

enum dllm__tp_split {
    DLLM__TP_WHOLE,  // replicated: every rank holds the whole tensor (norms)
    DLLM__TP_ROWS,   // rows [begin, end) of HF's [out, in]: Q/K/V (+ biases), gate/up, embedding, LM head
    DLLM__TP_COLS    // columns [begin, end) of [out, in]: O and down
};

struct dllm__tp_slice {
    dllm__wspec spec;                // the whole tensor: HF name and shape
    dllm__tp_split split = DLLM__TP_WHOLE;
    int64_t begin = 0, end = 0;      // the rows (ROWS) or columns (COLS) this rank holds; WHOLE: [0, shape[0])
};

/* What one rank of R holds: its heads, FFN columns and vocabulary rows, and the slice of every weight. */
struct dllm__tp_plan {
    int n_ranks = 1, rank = 0;
    int head0 = 0, n_head = 0;        // attention heads [head0, head0 + n_head)
    int kv_head0 = 0, n_head_kv = 0;  // K/V heads: exactly the ones its query heads read (GQA groups never straddle ranks)
    int ff0 = 0, n_ff = 0;            // FFN width [ff0, ff0 + n_ff)
    int vocab0 = 0, n_vocab = 0;      // embedding / LM head rows [vocab0, vocab0 + n_vocab)
    std::vector<dllm__tp_slice> slices;  // one per tensor of dllm__expected_weights, in its order
};

/* Does the model's shape split over n ranks: heads, K/V heads, FFN width and vocabulary all divisible. */
static bool dllm__tp_divides(const dllm__config &c, int n) {
    return n >= 1 && c.n_head % n == 0 && c.n_head_kv % n == 0 && c.n_ff % n == 0 && c.n_vocab % n == 0;
}

/* "1, 2, 4": the device counts up to dllm__tp_max_ranks the model splits over, for error messages. */
static std::string dllm__tp_valid_counts(const dllm__config &c) {
    std::string s;
    for (int n = 1; n <= dllm__tp_max_ranks; n++)
        if (dllm__tp_divides(c, n)) s += (s.empty() ? "" : ", ") + std::to_string(n);
    return s;
}

static dllm_status dllm__tp_check_count(const dllm__config &c, int n, const char *what, int count) {
    if (count % n == 0) return DLLM_OK;
    return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "tensor parallelism over %d devices (dllm_ctx_params.n_devices): the model's %d %s do not split "
                      "evenly over %d ranks; device counts this model divides: %s", n, count, what, n, dllm__tp_valid_counts(c).c_str());
}

/* The sharding plan of rank `rank` of n_ranks: a pure function of the config. An even split only: heads, K/V
 * heads, FFN width and vocabulary must divide by n_ranks (an error names the count that does not). */
static dllm_status dllm__tp_shard(const dllm__config &c, int n_ranks, int rank, dllm__tp_plan &plan) {
    if (n_ranks < 1 || n_ranks > dllm__tp_max_ranks)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "tensor parallelism over %d devices (dllm_ctx_params.n_devices): must be in [1, %d]", n_ranks,
                          dllm__tp_max_ranks);
    if (rank < 0 || rank >= n_ranks) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "tensor parallelism: rank %d outside [0, %d)", rank, n_ranks);
    DLLM__TRY(dllm__tp_check_count(c, n_ranks, "attention heads", c.n_head));
    DLLM__TRY(dllm__tp_check_count(c, n_ranks, "key/value heads", c.n_head_kv));
    DLLM__TRY(dllm__tp_check_count(c, n_ranks, "FFN columns (intermediate size)", c.n_ff));
    DLLM__TRY(dllm__tp_check_count(c, n_ranks, "vocabulary rows", c.n_vocab));
    plan = dllm__tp_plan();
    plan.n_ranks = n_ranks, plan.rank = rank;
    plan.n_head = c.n_head / n_ranks, plan.head0 = rank * plan.n_head;
    plan.n_head_kv = c.n_head_kv / n_ranks, plan.kv_head0 = rank * plan.n_head_kv;
    plan.n_ff = c.n_ff / n_ranks, plan.ff0 = rank * plan.n_ff;
    plan.n_vocab = c.n_vocab / n_ranks, plan.vocab0 = rank * plan.n_vocab;
    const int64_t hd = c.head_dim;
    for (const dllm__wspec &w : dllm__expected_weights(c)) {
        dllm__tp_slice s;
        s.spec = w;
        switch (w.kind) {
        case DLLM__W_Q: case DLLM__W_BQ: s.split = DLLM__TP_ROWS, s.begin = plan.head0 * hd, s.end = (plan.head0 + plan.n_head) * hd; break;
        case DLLM__W_K: case DLLM__W_V: case DLLM__W_BK: case DLLM__W_BV:
            s.split = DLLM__TP_ROWS, s.begin = plan.kv_head0 * hd, s.end = (plan.kv_head0 + plan.n_head_kv) * hd; break;
        case DLLM__W_O: s.split = DLLM__TP_COLS, s.begin = plan.head0 * hd, s.end = (plan.head0 + plan.n_head) * hd; break;
        case DLLM__W_GATE: case DLLM__W_UP: s.split = DLLM__TP_ROWS, s.begin = plan.ff0, s.end = plan.ff0 + plan.n_ff; break;
        case DLLM__W_DOWN: s.split = DLLM__TP_COLS, s.begin = plan.ff0, s.end = plan.ff0 + plan.n_ff; break;
        case DLLM__W_EMBED: case DLLM__W_HEAD: s.split = DLLM__TP_ROWS, s.begin = plan.vocab0, s.end = plan.vocab0 + plan.n_vocab; break;
        default: s.split = DLLM__TP_WHOLE, s.begin = 0, s.end = w.shape[0]; break;
        }
        plan.slices.push_back(s);
    }
    return DLLM_OK;
}

/* The plans of all n_ranks ranks, rank order. */
[[maybe_unused]] static dllm_status dllm__tp_shard_all(const dllm__config &c, int n_ranks, std::vector<dllm__tp_plan> &plans) {
    plans.clear();
    dllm__tp_plan p;
    DLLM__TRY(dllm__tp_shard(c, n_ranks, 0, p));
    plans.push_back(p);
    for (int r = 1; r < n_ranks; r++) {
        DLLM__TRY(dllm__tp_shard(c, n_ranks, r, p));
        plans.push_back(p);
    }
    return DLLM_OK;
}

/* y[T][N] = x[T][K] . W[row0 + n][col0 + k]^T (+ bias[N]): one rank's block of a [out, in] weight. At row0 = col0 =
 * 0 and the whole width it is dllm__cpu_linear, bit for bit (the same dot, the same order). */
static void dllm__tp_cpu_linear(dllm__pool &pool, const float *x, int T, int K, const dllm__tensor &W, int64_t row0, int64_t col0, const float *bias,
                                int N, float *y) {
    const int64_t width = W.shape[1];
    dllm__cpu_linear_rows(pool, x, T, K, [&](int n, float *dst) {
        for (int k = 0; k < K; k++) dst[k] = dllm__tensor_at(W, (row0 + n) * width + col0 + k);
    }, bias, N, y);
}

/* The all-reduce (sum) this reference defines: out = ((p_0 + p_1) + p_2) + ..., in rank order, fp32. NCCL sums in
 * another order: its ring starts each chunk at another rank, its tree pairs ranks differently. Two ranks give the
 * same bits in any order (fp32 addition commutes); from three on the association differs, so the GPU's sums can
 * differ from this in the last bits, and tokens equal TP=1's except where two candidates are within that rounding
 * (near-ties), the same caveat as every GPU-vs-CPU comparison. */
static void dllm__tp_all_reduce(const std::vector<const float *> &partials, size_t n, float *out) {
    memcpy(out, partials[0], n * sizeof(float));
    for (size_t r = 1; r < partials.size(); r++)
        for (size_t i = 0; i < n; i++) out[i] += partials[r][i];
}

/* One emulated rank's working memory. */
struct dllm__tp_rank_buffers {
    std::vector<float> q, k, v, att, gate, up, partial;
};

/* Rank p's attention partial: partial[T][d] = O[:, its heads] . attention(its heads of RoPE(QKV(a))). Column-parallel
 * Q/K/V: each head's numbers are those of the unsharded forward, bit for bit; only O's sum over heads is split. */
static void dllm__tp_cpu_attention_partial(const dllm_model &m, size_t layer, const dllm__tp_plan &p, dllm__pool &pool, const float *a, int T,
                                           const int32_t *pos, const float *cos_t, const float *sin_t, dllm__tp_rank_buffers &rb) {
    const dllm__config &c = m.cfg;
    const dllm__layer_weights &L = m.layers[layer];
    const int d = c.n_embd, hd = c.head_dim, qd = p.n_head * hd, kvd = p.n_head_kv * hd;
    const int64_t q0 = (int64_t)p.head0 * hd, kv0 = (int64_t)p.kv_head0 * hd;
    rb.q.resize((size_t)T * qd), rb.att.resize((size_t)T * qd), rb.k.resize((size_t)T * kvd), rb.v.resize((size_t)T * kvd);
    rb.partial.resize((size_t)T * d);
    auto bias = [](const std::vector<float> &b, int64_t at) { return b.empty() ? nullptr : b.data() + at; };
    dllm__tp_cpu_linear(pool, a, T, d, *L.wq, q0, 0, bias(L.bq, q0), qd, rb.q.data());
    dllm__tp_cpu_linear(pool, a, T, d, *L.wk, kv0, 0, bias(L.bk, kv0), kvd, rb.k.data());
    dllm__tp_cpu_linear(pool, a, T, d, *L.wv, kv0, 0, bias(L.bv, kv0), kvd, rb.v.data());
    dllm__cpu_rope(rb.q.data(), T, p.n_head, hd, pos, cos_t, sin_t);
    dllm__cpu_rope(rb.k.data(), T, p.n_head_kv, hd, pos, cos_t, sin_t);
    dllm__cpu_attention(pool, rb.q.data(), rb.k.data(), rb.v.data(), T, T, p.n_head, p.n_head_kv, hd, nullptr, rb.att.data());
    dllm__tp_cpu_linear(pool, rb.att.data(), T, qd, *L.wo, 0, q0, nullptr, d, rb.partial.data());
}

/* Rank p's MLP partial: partial[T][d] = down[:, its columns] . (silu(gate_p(a)) * up_p(a)). */
static void dllm__tp_cpu_ffn_partial(const dllm_model &m, size_t layer, const dllm__tp_plan &p, dllm__pool &pool, const float *a, int T,
                                     dllm__tp_rank_buffers &rb) {
    const dllm__layer_weights &L = m.layers[layer];
    const int d = m.cfg.n_embd, ff = p.n_ff;
    rb.gate.resize((size_t)T * ff), rb.up.resize((size_t)T * ff), rb.partial.resize((size_t)T * d);
    dllm__tp_cpu_linear(pool, a, T, d, *L.gate, p.ff0, 0, nullptr, ff, rb.gate.data());
    dllm__tp_cpu_linear(pool, a, T, d, *L.up, p.ff0, 0, nullptr, ff, rb.up.data());
    for (size_t i = 0; i < (size_t)T * ff; i++) rb.gate[i] = dllm__silu(rb.gate[i]) * rb.up[i];
    dllm__tp_cpu_linear(pool, rb.gate.data(), T, ff, *L.down, 0, p.ff0, nullptr, d, rb.partial.data());
}

/* The all-reduce of the ranks' partials into out[n]. */
static void dllm__tp_all_reduce_partials(const std::vector<dllm__tp_rank_buffers> &rb, size_t n, float *out) {
    std::vector<const float *> parts;
    for (const dllm__tp_rank_buffers &r : rb) parts.push_back(r.partial.data());
    dllm__tp_all_reduce(parts, n, out);
}

/* h[n] += the all-reduce of the ranks' partials (the residual add after O and after down). */
static void dllm__tp_add_all_reduced(const std::vector<dllm__tp_rank_buffers> &rb, size_t n, std::vector<float> &sum, float *h) {
    sum.resize(n);
    dllm__tp_all_reduce_partials(rb, n, sum.data());
    for (size_t i = 0; i < n; i++) h[i] += sum[i];
}

/* The vocab-parallel embedding into h[T][d]: rank p writes the rows of the tokens it holds and zeros elsewhere; the
 * all-reduce leaves every row the one rank's row (x + 0 = x), so h equals the unsharded lookup. */
static void dllm__tp_cpu_embed(const dllm_model &m, const std::vector<dllm__tp_plan> &plans, const int32_t *ids, int T,
                               std::vector<dllm__tp_rank_buffers> &rb, float *h) {
    const int d = m.cfg.n_embd;
    for (size_t r = 0; r < plans.size(); r++) {
        rb[r].partial.assign((size_t)T * d, 0.0f);
        for (int t = 0; t < T; t++)
            if (ids[t] >= plans[r].vocab0 && ids[t] < plans[r].vocab0 + plans[r].n_vocab)
                dllm__tensor_row(*m.embed, ids[t], d, rb[r].partial.data() + (size_t)t * d);
    }
    dllm__tp_all_reduce_partials(rb, (size_t)T * d, h);
}

/* The CPU reference of the tensor-parallel forward: the plain bidirectional forward of ids[0..n) (every row, fresh
 * keys, the exact precision of an unquantised checkpoint), each rank of `plans` emulated in turn, the all-reduces
 * after O and after down summed in rank order (dllm__tp_all_reduce). Writes the unshifted output rows [r0, r1):
 * logits[row][v], each rank its own vocabulary columns (the layout an all-gather would give; the sampler needs no
 * gather, dllm__tp_choose). One rank is dllm__cpu_forward bit for bit. */
[[maybe_unused]] static void dllm__tp_cpu_forward(const dllm_model &m, const std::vector<dllm__tp_plan> &plans, dllm__pool &pool, const int32_t *ids, int n,
                                                  const float *cos_t, const float *sin_t, int r0, int r1, float *logits) {
    const dllm__config &c = m.cfg;
    const int d = c.n_embd, rows = r1 - r0;
    std::vector<float> h((size_t)n * d), a((size_t)n * d), sum;
    std::vector<int32_t> pos((size_t)n);
    for (int t = 0; t < n; t++) pos[(size_t)t] = t;
    std::vector<dllm__tp_rank_buffers> rb(plans.size());
    dllm__tp_cpu_embed(m, plans, ids, n, rb, h.data());
    for (size_t l = 0; l < m.layers.size(); l++) {
        dllm__cpu_rmsnorm(h.data(), n, d, m.layers[l].attn_norm.data(), c.norm_eps, a.data());  // replicated: every rank the same bits
        for (size_t r = 0; r < plans.size(); r++)
            dllm__tp_cpu_attention_partial(m, l, plans[r], pool, a.data(), n, pos.data(), cos_t, sin_t, rb[r]);
        dllm__tp_add_all_reduced(rb, (size_t)n * d, sum, h.data());
        dllm__cpu_rmsnorm(h.data(), n, d, m.layers[l].ffn_norm.data(), c.norm_eps, a.data());
        for (size_t r = 0; r < plans.size(); r++) dllm__tp_cpu_ffn_partial(m, l, plans[r], pool, a.data(), n, rb[r]);
        dllm__tp_add_all_reduced(rb, (size_t)n * d, sum, h.data());
    }
    dllm__cpu_rmsnorm(h.data() + (size_t)r0 * d, rows, d, m.final_norm.data(), c.norm_eps, a.data());
    const float scale = c.scale_logits ? 1.0f / sqrtf((float)d) : 1.0f;
    for (const dllm__tp_plan &p : plans) {
        std::vector<float> part((size_t)rows * p.n_vocab);
        dllm__tp_cpu_linear(pool, a.data(), rows, d, *m.head, p.vocab0, 0, nullptr, p.n_vocab, part.data());
        for (int t = 0; t < rows; t++)
            for (int v = 0; v < p.n_vocab; v++) {
                float l = part[(size_t)t * p.n_vocab + v];
                logits[(size_t)t * c.n_vocab + p.vocab0 + v] = c.scale_logits ? l * scale : l;
            }
    }
}

/* One rank's share of dllm__choose's first pass over its vocabulary slice, and the merge of two ranks' shares. */
struct dllm__tp_best {
    double score = -INFINITY;    // the winner's argmax / Gumbel-max score
    int32_t token = 0;           // its global vocabulary index
    float logit = -INFINITY;     // its (filtered) logit
    float max_logit = -INFINITY, second_logit = -INFINITY;  // a tie for the largest counts twice, as in dllm__choose
};

static dllm__tp_best dllm__tp_rank_best(const float *logits, const dllm__tp_plan &p, const dllm__sampling &s, uint32_t pos, uint32_t step) {
    auto logit = [&](int i) { return s.eos_logit_inf && p.vocab0 + i == s.eos_id ? -INFINITY : logits[i]; };
    dllm__tp_best b;
    int best = 0;
    for (int i = 0; i < p.n_vocab; i++) {
        const float l = logit(i);
        b.second_logit = std::max(b.second_logit, l > b.max_logit ? b.max_logit : l);
        if (l > b.max_logit) b.max_logit = l;
        double score = l;
        if (s.temperature > 0)
            score = exp((double)l) / pow(-log(dllm__uniform(s.seed, (uint32_t)(p.vocab0 + i), pos, step, DLLM__RNG_GUMBEL)), s.temperature);
        if (score > b.score) b.score = score, best = i;
    }
    b.token = p.vocab0 + best, b.logit = logit(best);
    return b;
}

/* a from the lower rank (lower indices), b from the next: b wins only with a strictly larger score, so ties go to the
 * lower index as in dllm__choose. max/second merge exactly: the second largest of the union is the larger of the two
 * seconds and the smaller of the two maxima. */
static dllm__tp_best dllm__tp_best_merge(const dllm__tp_best &a, const dllm__tp_best &b) {
    dllm__tp_best m = b.score > a.score ? b : a;
    m.max_logit = std::max(a.max_logit, b.max_logit);
    m.second_logit = std::max(std::max(a.second_logit, b.second_logit), std::min(a.max_logit, b.max_logit));
    return m;
}

/* dllm__choose over a vocabulary split across ranks: rank_logits[r] holds rank r's n_vocab logits of the row. Two
 * reductions, as the GPU's would be: (best, max, second) merged in rank order (exact: the token, the max and the
 * second equal the unsharded ones given the same logits), then the softmax sums z, zx of each rank's slice added in
 * rank order (float64; the association differs from one pass over the row, so the confidence may differ in the last
 * bits). The sampler filters need a cross-rank cutoff that is not built: DLLM_ERR_UNSUPPORTED. */
[[maybe_unused]] static dllm_status dllm__tp_choose(const std::vector<const float *> &rank_logits, const std::vector<dllm__tp_plan> &plans,
                                                    const dllm__sampling &s, uint32_t pos, uint32_t step, dllm__choice &out) {
    if (s.filters()) return dllm__fail(DLLM_ERR_UNSUPPORTED, "tensor parallelism: top-k / top-p / min-p across ranks are not built yet");
    dllm__tp_best best = dllm__tp_rank_best(rank_logits[0], plans[0], s, pos, step);
    for (size_t r = 1; r < plans.size(); r++) best = dllm__tp_best_merge(best, dllm__tp_rank_best(rank_logits[r], plans[r], s, pos, step));
    const double inv_t = s.tempered_conf && s.temperature > 0 ? 1.0 / s.temperature : 1.0;
    double z = 0, zx = 0;
    for (size_t r = 0; r < plans.size(); r++) {
        double zr = 0, zxr = 0;
        for (int i = 0; i < plans[r].n_vocab; i++) {
            const int v = plans[r].vocab0 + i;
            const float l = s.eos_logit_inf && v == s.eos_id ? -INFINITY : rank_logits[r][i];
            double x = ((double)l - best.max_logit) * inv_t, e = exp(x);
            zr += e;
            if (e > 0) zxr += e * x;
        }
        z += zr, zx += zxr;
    }
    out.token = best.token;
    out.conf = dllm__confidence(s, z, zx, ((double)best.logit - best.max_logit) * inv_t, ((double)best.second_logit - best.max_logit) * inv_t, pos, step);
    out.deferred = s.defer_eos_eot && (best.token == s.eos_id || best.token == s.eot_id);
    return DLLM_OK;
}

/* dllm_ctx_params' device list: n_devices in [0, DLLM_MAX_DEVICES], the devices distinct and non-negative, and a count
 * the model splits over (dllm__tp_shard). Whether the devices exist is the GPU backend's check. */
static dllm_status dllm__tp_check_params(const dllm__config &c, const dllm_ctx_params &p) {
    if (p.n_devices < 0 || p.n_devices > DLLM_MAX_DEVICES)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: n_devices %d must be in [0, %d] (0 = one GPU, dllm_ctx_params.device)", p.n_devices,
                          DLLM_MAX_DEVICES);
    for (int i = 0; i < p.n_devices; i++) {
        if (p.devices[i] < 0)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: devices[%d] = %d must be a CUDA device ordinal (>= 0)", i, p.devices[i]);
        for (int j = 0; j < i; j++)
            if (p.devices[j] == p.devices[i])
                return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: devices[%d] and devices[%d] are both CUDA device %d: each GPU holds one rank, "
                                  "list it once", j, i, p.devices[i]);
    }
    dllm__tp_plan plan;
    return p.n_devices > 1 ? dllm__tp_shard(c, p.n_devices, 0, plan) : DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 11. Backends (CPU reference)
//     A backend runs forwards and denoising steps; the SAR schedule above it is shared. The GPU backend
//     implements the same two calls with device kernels.
// ---------------------------------------------------------------------------------------------------

/* The state of one generation, shared by the schedule and the backend. */
struct dllm__decode {
    std::vector<int32_t> canvas;     // prompt ++ generation (on the GPU: current after finish() or a host step)
    std::vector<uint8_t> is_prompt;  // the reference's prompt_index (prompt positions that are not MASK)
    int n_prompt = 0;
    int block_begin = 0, block_end = 0;  // current block; candidates are masked positions before block_end
    int steps_per_block = 0;
    int step_in_block = 0;           // advanced by the schedule after each step
    int global_step = 0;             // counts steps across blocks; keys the RNG
    int n_block_masks = 0;           // masks in the block at its first step (CPU backend)
    int n_block_left = 0;            // masks left in the block after a step (set by threshold/factor steps)
    int cand_lo = 0;                 // no candidate before this position (GPU backend)
    int lacache = 0;                 // dllm_lacache (GPU backend; the CPU computes the same function)
    dllm__unmask_rule unmask;
    dllm_kv_cache kv_cache = DLLM_KV_CACHE_NONE;
    std::vector<int32_t> positions;  // RoPE position of each canvas row (DPad's compacted canvas); empty: the index
    int32_t mask_id = 0;
    float cfg_scale = 0;
    dllm__sampling sampling;
    int forwards = 0;
    void *debug_tag = nullptr;       // the generation's on_step_data: names the sequence to dllm__debug_step_logits
    bool host_steps = false;         // stepped on the host around forward_batch (dllm_generate_batch): no device state of its own
};

/* One canvas of a batched forward (dllm__backend_impl::forward_batch) and the logit rows it wants. */
struct dllm__batch_seq {
    const int32_t *ids = nullptr;
    int n = 0;
    const int32_t *positions = nullptr;  // RoPE position of each row; null: the row index
    int r0 = 0, r1 = 0;                  // logit rows [r0, r1), shift applied
    // [batch] [dual cache] [prefix cache] forward_batch_kv only: the rows forwarded [q0, q1) (dllm__step_rows), their K/V
    // written into cache `slot` (batch_kv_reserve), their queries over its n rows; fill: the block's first step, every
    // row forwarded, the cache (re)started with n rows
    int q0 = 0, q1 = 0, slot = -1;
    bool fill = false;
    // forward_batch_choose only: non-null, the backend chooses the tokens of rows [r0, r1) as dllm__choose does with these
    // parameters at canvas position r and step `step` (dllm__decode::global_step), and returns no logits for them
    const dllm__sampling *sampling = nullptr;
    int step = 0;
};

/* The rows of a block-diffusion step whose tokens are chosen: row i (0 <= i < n) is canvas position pos0 + i, scored
 * by raw logits row (shift0 ? max(i - 1, 0) : i) + lrow0 of the forward's [r0, r1) (the sampler's logits_row). */
struct dllm__bd_pick {
    dllm__sampling sampling;
    int pos0 = 0, n = 0, shift0 = 0, lrow0 = 0;
    int logits_row(int i) const { return (shift0 ? std::max(i - 1, 0) : i) + lrow0; }
};

/* One sequence of a batched block-diffusion forward (dllm__backend_impl::bd_forward_batch). */
struct dllm__bd_seq {
    int slot = -1;                        // its committed K/V cache: an index into bd_batch_reserve's list
    dllm__bd_call call;                   // what bd_forward takes, against that slot's cache (its own committed length)
    const dllm__bd_pick *pick = nullptr;  // non-null: the backend returns this sequence's choices (pick->n of them), no logits
};

/* What a backend does; the SAR schedule (section 17) drives it. */
struct dllm__backend_impl {
    virtual ~dllm__backend_impl() {}
    /* Logits for positions [r0, r1) of one forward over ids[0..n) (shift already applied). */
    virtual dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) = 0;
    /* A generation starts: st.canvas holds prompt ++ masks. */
    virtual dllm_status begin(dllm__decode &) { return DLLM_OK; }
    /* A block starts: st.block_begin/block_end/steps_per_block are set. */
    virtual dllm_status begin_block(dllm__decode &st) = 0;
    /* One denoising step: x0 and confidence at every candidate, commit what the unmasking rule lets through
     * (dllm__select). With want_host, st.canvas and committed (ascending positions) are current on return. */
    virtual dllm_status step(dllm__decode &st, std::vector<int32_t> &committed, bool want_host) = 0;
    /* The generation ends: st.canvas must be current. */
    virtual dllm_status finish(dllm__decode &) { return DLLM_OK; }
    /* Block diffusion (section 17): a generation starts with an empty committed K/V cache of `rows` rows. */
    virtual dllm_status bd_begin(int rows) = 0;
    /* One forward of the block-diffusion schedule (dllm__bd_call); raw logits of rows [call.r0, call.r1). */
    virtual dllm_status bd_forward(const dllm__bd_call &call, float *logits) = 0;
    /* Whether the backend chooses a step's tokens where its logits are (bd_forward_choose: every row of the pick, out[n]);
     * otherwise section 17 runs dllm__choose on the host over bd_forward's logits, which is the twin. */
    virtual bool bd_chooses() const { return false; }
    virtual dllm_status bd_forward_choose(const dllm__bd_call &, const dllm__bd_pick &, dllm__choice *) {
        return dllm__fail(DLLM_ERR_INTERNAL, "this backend chooses block-diffusion tokens on the host");
    }
    /* [FACache] since bd_begin: layer-0 block rows a forward needed the committed state of, and rows that reused it. */
    virtual void bd_facache_rows(int64_t &rows, int64_t &reused) const { rows = reused = 0; }
    /* [batch] [block diffusion] Committed K/V caches for a batch of block-diffusion sequences: slot s empty and sized for
     * rows[s] rows (what bd_begin(rows[s]) does for a generation alone); the empty list releases them. Unsupported (the
     * reason in the message): dllm_generate_batch decodes block-diffusion items one after another through bd_forward. */
    virtual dllm_status bd_batch_reserve(const std::vector<int> &) {
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "this backend has no batched block-diffusion forward");
    }
    /* One forward over several block-diffusion sequences, each against its own slot (a slot appears at most once), each
     * sequence's result bit-identical whatever else is in the batch (a batch of one included; on the CPU also identical
     * to bd_forward alone). Sequences without a pick: their raw logit rows [call.r0, call.r1), one sequence after another
     * in `logits`. Sequences with a pick: pick->n choices each (dllm__choose at pick->pos0 + i, step 0, over raw row
     * pick->logits_row(i) of [r0, r1): what dllm__bd_generation::forward_choose computes), one sequence after another in
     * `choices`. A COMMIT advances its slot's committed length, as bd_forward does. An empty list asks whether the
     * backend has the batched forward (DLLM_OK) or not (UNSUPPORTED, with the reason). */
    virtual dllm_status bd_forward_batch(const std::vector<dllm__bd_seq> &, float *, dllm__choice *) {
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "this backend has no batched block-diffusion forward");
    }
    /* One forward over several canvases (dllm_generate_batch): each sequence's logit rows [r0, r1) (shift applied),
     * one sequence after another in out, each bit-identical to its forward alone. An empty plan asks whether the
     * backend batches at all: the default answers UNSUPPORTED, and dllm_generate_batch then decodes the items one
     * after another through step(). */
    virtual dllm_status forward_batch(const std::vector<dllm__batch_seq> &plan, float *out) {
        (void)plan, (void)out;
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "this backend has no batched forward");
    }
    /* [batch] [dual cache] [prefix cache] The K/V caches of a batched decode: slot i holds up to rows[i] canvas rows, for
     * every layer. Replaces the previous batch's caches; an empty list releases them. */
    virtual dllm_status batch_kv_reserve(const std::vector<int> &rows) {
        (void)rows;
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "this backend has no batched K/V-cache step");
    }
    /* forward_batch over sequences that each have a K/V cache (dllm__batch_seq's q0, q1, slot, fill): their rows in one
     * forward, each sequence's logits bit-identical to its own in a batch of one. An empty plan asks whether the backend
     * has it at all (the default: no, and such items decode one after another). */
    virtual dllm_status forward_batch_kv(const std::vector<dllm__batch_seq> &plan, float *out) {
        (void)plan, (void)out;
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "this backend has no batched K/V-cache step");
    }
    /* [batch] Whether the backend chooses a batched step's tokens where its logits are (forward_batch_choose); otherwise
     * dllm__batch_step runs dllm__choose on the host over forward_batch's logits, which is the twin. */
    virtual bool batch_chooses() const { return false; }
    /* forward_batch (kv false) or forward_batch_kv (kv true) of a plan in which the sequences with a sampling
     * (dllm__batch_seq) have their tokens chosen by the backend: rows [r0, r1) of each, one sequence after another, in
     * choices; the other sequences' logits one after another in logits, as forward_batch returns them. */
    virtual dllm_status forward_batch_choose(const std::vector<dllm__batch_seq> &plan, bool kv, float *logits, dllm__choice *choices) {
        (void)plan, (void)kv, (void)logits, (void)choices;
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "this backend chooses batched tokens on the host");
    }
};

static int dllm__count_masks(const dllm__decode &st, int begin, int end) {
    int n = 0;
    for (int p = begin; p < end; p++) n += st.canvas[(size_t)p] == st.mask_id;
    return n;
}

/* k_i of the LLaDA schedule: n masks over s steps, the remainder to the earliest steps. */
static int dllm__transfer_count(int n_masked, int steps, int i) { return n_masked / steps + (i < n_masked % steps ? 1 : 0); }

/* The count of a counted step: LLaDA's over the block's masks at its start, Dream's over the n_cand candidates
 * left (the block's masks and any [MASK] of the prompt, as Dream counts every mask of its canvas, so that the
 * block's last step commits them all). */
static int dllm__step_count(const dllm__decode &st, int n_cand) {
    if (st.unmask.kind == DLLM_UNMASK_SCHEDULE) return dllm__transfer_count(st.n_block_masks, st.steps_per_block, st.step_in_block);
    if (st.unmask.kind == DLLM_UNMASK_TIMESTEPS) return dllm__timestep_count(n_cand, st.steps_per_block, st.step_in_block, st.unmask.eps);
    return 0;
}

/* The canvas rows a step forwards: every row, or with a K/V cache after the block's first step the block
 * (dual) or the block and everything after it (prefix). A model with shifted logits also needs the row
 * before the block: it predicts the block's first position. */
static void dllm__step_rows(const dllm__decode &st, int shift, int &q0, int &q1) {
    const int n = (int)st.canvas.size();
    q0 = 0, q1 = n;
    if (st.kv_cache == DLLM_KV_CACHE_NONE || st.step_in_block == 0) return;
    q0 = std::max(0, st.block_begin - shift);
    q1 = st.kv_cache == DLLM_KV_CACHE_DUAL ? st.block_end : n;
}

/* The first non-finite element of a BF16/F16/F32 tensor in [begin, end), or -1: the exponent bits all set. */
static int64_t dllm__first_nonfinite(const dllm__tensor &t, int64_t begin, int64_t end) {
    const size_t size = t.dtype == DLLM__F32 ? 4 : 2;
    const uint32_t exponent = t.dtype == DLLM__F32 ? 0x7F800000u : t.dtype == DLLM__BF16 ? 0x7F80u : 0x7C00u;
    for (int64_t i = begin; i < end; i++) {
        uint32_t bits = 0;
        memcpy(&bits, t.data + size * (size_t)i, size);  // little-endian host: the low bytes
        if ((bits & exponent) == exponent) return i;
    }
    return -1;
}

/* A NaN or infinity in a checkpoint's weights would silently turn every logit into NaN: the CPU backend
 * refuses such a model, naming the first bad element. One pass over the weights, in chunks across threads. */
static dllm_status dllm__check_finite_weights(const dllm_model &m, int n_threads) {
    struct chunk { const dllm__tensor *t; int64_t begin, end; };
    const int64_t chunk_elems = (int64_t)1 << 22;
    std::vector<chunk> chunks;
    for (const dllm__wspec &spec : dllm__expected_weights(m.cfg)) {
        auto it = m.by_name.find(spec.name);
        if (it == m.by_name.end()) continue;
        for (int64_t b = 0; b < it->second->numel; b += chunk_elems) chunks.push_back({it->second, b, std::min(it->second->numel, b + chunk_elems)});
    }
    std::vector<int64_t> hit(chunks.size(), -1);
    dllm__pool pool(std::max(1, std::min(n_threads, (int)chunks.size())));
    pool.run((int)chunks.size(), [&](int i) { hit[(size_t)i] = dllm__first_nonfinite(*chunks[(size_t)i].t, chunks[(size_t)i].begin, chunks[(size_t)i].end); });
    for (size_t i = 0; i < chunks.size(); i++) {
        if (hit[i] < 0) continue;
        const dllm__tensor &t = *chunks[i].t;
        return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s %s holds %g at flat index %lld: the checkpoint is damaged (non-finite weights)",
                          t.file->c_str(), t.name.c_str(), dllm__shape_str(t.shape).c_str(), dllm__tensor_at(t, hit[i]), (long long)hit[i]);
    }
    return DLLM_OK;
}

/* The CPU reference's denoising step of one sequence, split around its forward so that the solo step
 * (dllm__cpu_backend::step) and the batched one (dllm__batch_decode) share every line but the forward. */
struct dllm__step_work {
    std::vector<int32_t> cand;  // the candidates: masked positions before the block end, ascending
    int k = 0;                  // a counted rule's count
    double p_transfer = 0;      // DLLM_REMASK_ORIGIN's transfer probability
    int r0 = 0, r1 = 0;         // the logit rows the step reads (shift applied)
};

static void dllm__step_begin(const dllm__decode &st, dllm__step_work &w) {
    w.cand.clear();
    for (int p = 0; p < st.block_end; p++)
        if (st.canvas[(size_t)p] == st.mask_id) w.cand.push_back(p);
    w.k = dllm__step_count(st, (int)w.cand.size());
    w.p_transfer = dllm__timestep_fraction(st.step_in_block, st.steps_per_block, st.unmask.eps);
    // The reference runs the forward even when the step commits nothing; so do we (NFE semantics).
    w.r0 = w.cand.empty() ? st.block_end - 1 : w.cand.front(), w.r1 = st.block_end;
}

/* CFG's unconditional canvas: the prompt's positions masked. */
static void dllm__uncond_canvas(const dllm__decode &st, std::vector<int32_t> &un) {
    un = st.canvas;
    for (size_t p = 0; p < un.size(); p++)
        if (st.is_prompt[p]) un[p] = st.mask_id;
}

/* Tests only: sees the logits (CFG applied) every CPU step chooses from, rows [r0, r1) of the step's canvas. */
static void (*dllm__debug_step_logits)(void *debug_tag, const float *logits, int rows, int n_vocab) = nullptr;

/* The commits of a step whose candidates w.cand have the choices ch (dllm__step_end's, or a backend's: [batch]
 * forward_batch_choose), as the unmasking rule lets them through. */
static void dllm__step_commit(dllm__decode &st, const dllm__step_work &w, const std::vector<dllm__choice> &ch, std::vector<int32_t> &committed) {
    committed.clear();
    for (int i : dllm__select(w.cand, ch, st.unmask, w.k, w.p_transfer)) {
        st.canvas[(size_t)w.cand[(size_t)i]] = ch[(size_t)i].token;
        committed.push_back(w.cand[(size_t)i]);
    }
    st.n_block_left = dllm__count_masks(st, st.block_begin, st.block_end);
}

/* After the step's forwards: CFG's logits = U + (s + 1) (C - U) (uncond null without CFG), then x0 and the
 * confidence at every candidate, and the commits the unmasking rule lets through. */
static void dllm__step_end(dllm__decode &st, const dllm__step_work &w, float *cond, const float *uncond, int V, std::vector<int32_t> &committed) {
    const size_t n = (size_t)(w.r1 - w.r0) * V;
    st.forwards += uncond ? 2 : 1;
    if (uncond) {
        const float scale = st.cfg_scale + 1.0f;
        for (size_t i = 0; i < n; i++) cond[i] = uncond[i] + scale * (cond[i] - uncond[i]);
    }
    if (dllm__debug_step_logits) dllm__debug_step_logits(st.debug_tag, cond, w.r1 - w.r0, V);
    std::vector<dllm__choice> ch;
    for (int32_t p : w.cand) ch.push_back(dllm__choose(cond + (size_t)(p - w.r0) * V, V, st.sampling, (uint32_t)p, (uint32_t)st.global_step));
    dllm__step_commit(st, w, ch, committed);
}

/* Rows [r0, r1) of logits (shift applied) from the unshifted output rows raw[raw0 ..). */
static void dllm__unshift_rows(const dllm__config &c, const float *raw, int raw0, int r0, int r1, float *out) {
    for (int p = r0; p < r1; p++)
        memcpy(out + (size_t)(p - r0) * c.n_vocab, raw + (size_t)(dllm__logit_row(c, p) - raw0) * c.n_vocab, sizeof(float) * c.n_vocab);
}

class dllm__cpu_backend : public dllm__backend_impl {
  public:
    dllm__cpu_backend(const dllm_model &m, int n_threads, int max_tokens, dllm_precision precision, const dllm__soloq_options &soloq,
                      int kv_quant = DLLM_KV_QUANT_NONE, int kv_sinks = -1)
        : m_(m), pool_(n_threads), fp8_(dllm__cpu_fp8_weights(m, precision)) {
        dllm__rope_tables_cfg(m.cfg, max_tokens, cos_, sin_);
        if (soloq.enabled) fp8_ = dllm__cpu_soloq_weights(m, pool_, soloq, head_);
        kvq_.setup(m.cfg, kv_quant, kv_sinks);
    }

    /* Block diffusion's committed cache as attention reads it, and its quantised form (tests). */
    DLLM__TEST_HOOKS_BEGIN
    DLLM__TEST_HOOK const dllm__bd_kv &bd_kv() const { return bd_kv_; }
    DLLM__TEST_HOOK const dllm__kvq &kv_quant() const { return kvq_; }
    DLLM__TEST_HOOKS_END

    dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) override {
        if (dllm__is_block_diffusion(m_.cfg)) return bd_logits(ids, n, r0, r1, out);
        forward(ids, n, dllm__cpu_rows(), r0, r1, out);
        return DLLM_OK;
    }

    dllm_status bd_begin(int rows) override {
        bd_kv_.reset(m_.cfg, rows);
        if (kvq_.enabled()) kvq_.reset(rows);
        return DLLM_OK;
    }

    dllm_status bd_forward(const dllm__bd_call &call, float *logits) override { return bd_forward_on(bd_kv_, kvq_, call, logits); }

    /* [batch] [block diffusion] The reference: a slot is what bd_begin makes for a generation alone (its committed cache,
     * block cache and [FACache] state, and under kv_quant its own codes), and bd_forward_batch runs each sequence through
     * bd_forward's code on its slot, one after another, so every result is bd_forward's bit for bit. */
    dllm_status bd_batch_reserve(const std::vector<int> &rows) override {
        bd_slots_.clear();
        bd_slots_.resize(rows.size());
        for (size_t s = 0; s < rows.size(); s++) {
            bd_slots_[s].kv.reset(m_.cfg, rows[s]);
            bd_slots_[s].kvq.setup(m_.cfg, kvq_.mode, kvq_.n_sink);
            if (kvq_.enabled()) bd_slots_[s].kvq.reset(rows[s]);
        }
        return DLLM_OK;
    }
    /* Each sequence's logits, or a step's choices by dllm__choose over them, as dllm__bd_generation::forward_choose makes
     * them on the host (every row of the pick: the caller reads the masked ones). */
    dllm_status bd_forward_batch(const std::vector<dllm__bd_seq> &seqs, float *logits, dllm__choice *choices) override {
        const int V = m_.cfg.n_vocab;
        std::vector<bool> seen(bd_slots_.size(), false);
        for (size_t i = 0; i < seqs.size(); i++) {
            const int slot = seqs[i].slot;
            if (slot < 0 || (size_t)slot >= bd_slots_.size() || seen[(size_t)slot])
                return dllm__fail(DLLM_ERR_INTERNAL, "batched block diffusion: sequence %zu names slot %d (%zu reserved, each once a forward)", i, slot,
                                  bd_slots_.size());
            if (!(seqs[i].pick ? (void *)choices : (void *)logits))
                return dllm__fail(DLLM_ERR_INTERNAL, "batched block diffusion: sequence %zu has %s to return and no array for them", i,
                                  seqs[i].pick ? "choices" : "logits");
            seen[(size_t)slot] = true;
        }
        for (const dllm__bd_seq &s : seqs) {
            bd_slot &slot = bd_slots_[(size_t)s.slot];
            const size_t rows = (size_t)(s.call.r1 - s.call.r0);
            if (!s.pick) {
                DLLM__TRY(bd_forward_on(slot.kv, slot.kvq, s.call, logits));
                logits += rows * V;
                continue;
            }
            bd_raw_.resize(rows * V);
            DLLM__TRY(bd_forward_on(slot.kv, slot.kvq, s.call, bd_raw_.data()));
            const dllm__bd_pick &pick = *s.pick;
            for (int i = 0; i < pick.n; i++)
                *choices++ = dllm__choose(bd_raw_.data() + (size_t)pick.logits_row(i) * V, V, pick.sampling, (uint32_t)(pick.pos0 + i), 0);
        }
        return DLLM_OK;
    }

    void bd_facache_rows(int64_t &rows, int64_t &reused) const override { rows = bd_kv_.fa.rows, reused = bd_kv_.fa.rows_reused; }

    dllm_status begin_block(dllm__decode &st) override {
        st.n_block_masks = dllm__count_masks(st, st.block_begin, st.block_end);
        return DLLM_OK;
    }

    dllm_status step(dllm__decode &st, std::vector<int32_t> &committed, bool) override {
        const int V = m_.cfg.n_vocab;
        dllm__step_begin(st, work_);
        const size_t n = (size_t)(work_.r1 - work_.r0) * V;
        cond_.resize(n);
        forward(st.canvas.data(), (int)st.canvas.size(), rows_for(st, kv_[0]), work_.r0, work_.r1, cond_.data());
        if (st.cfg_scale > 0) {
            std::vector<int32_t> un;
            dllm__uncond_canvas(st, un);
            uncond_.resize(n);
            forward(un.data(), (int)un.size(), rows_for(st, kv_[1]), work_.r0, work_.r1, uncond_.data());
        }
        dllm__step_end(st, work_, cond_.data(), st.cfg_scale > 0 ? uncond_.data() : nullptr, V, committed);
        return DLLM_OK;
    }

    /* Every canvas's rows in one dllm__cpu_forward_seqs: bit-identical to each alone. */
    dllm_status forward_batch(const std::vector<dllm__batch_seq> &plan, float *out) override {
        const dllm__config &c = m_.cfg;
        std::vector<dllm__cpu_seq> seqs(plan.size());
        size_t raw_rows = 0;
        for (size_t i = 0; i < plan.size(); i++) {
            seqs[i].ids = plan[i].ids, seqs[i].n = plan[i].n, seqs[i].rows.positions = plan[i].positions;
            seqs[i].r0 = dllm__logit_row(c, plan[i].r0), seqs[i].r1 = dllm__logit_row(c, plan[i].r1 - 1) + 1;
            raw_rows += (size_t)(seqs[i].r1 - seqs[i].r0);
        }
        raw_.resize(raw_rows * c.n_vocab);
        if (!plan.empty()) dllm__cpu_forward_seqs(m_, pool_, buf_, seqs, cos_.data(), sin_.data(), raw_.data(), fp8_, head_.get());
        const float *raw = raw_.data();
        for (size_t i = 0; i < plan.size(); i++) {
            dllm__unshift_rows(c, raw, seqs[i].r0, plan[i].r0, plan[i].r1, out);
            raw += (size_t)(seqs[i].r1 - seqs[i].r0) * c.n_vocab;
            out += (size_t)(plan[i].r1 - plan[i].r0) * c.n_vocab;
        }
        return DLLM_OK;
    }

    /* [batch] [dual cache] [prefix cache] The reference: each sequence's cached forward over its own slot, one after
     * another (rows_for's, with the slot in place of kv_), so its logits are those of its step decoded alone. */
    dllm_status batch_kv_reserve(const std::vector<int> &rows) override {
        batch_kv_.assign(rows.size(), dllm__cpu_kv());
        batch_kv_rows_ = rows;
        return DLLM_OK;
    }
    dllm_status forward_batch_kv(const std::vector<dllm__batch_seq> &plan, float *out) override {
        const dllm__config &c = m_.cfg;
        for (size_t i = 0; i < plan.size(); i++) {
            const dllm__batch_seq &s = plan[i];
            if (s.slot < 0 || (size_t)s.slot >= batch_kv_.size() || s.n > batch_kv_rows_[(size_t)s.slot] || s.q0 < 0 || s.q1 > s.n || s.q0 >= s.q1 ||
                (s.fill && (s.q0 != 0 || s.q1 != s.n)))
                return dllm__fail(DLLM_ERR_INTERNAL, "batched K/V-cache step: sequence %zu (slot %d, %d rows, rows [%d, %d)) does not fit its cache", i,
                                  s.slot, s.n, s.q0, s.q1);
            dllm__cpu_kv &kv = batch_kv_[(size_t)s.slot];
            if (s.fill) {
                kv.n = s.n;
                const size_t elems = (size_t)c.n_layer * kv.n * c.n_head_kv * c.head_dim;
                kv.k.assign(elems, 0.0f);
                kv.v.assign(elems, 0.0f);
            } else if (kv.n != s.n) {
                return dllm__fail(DLLM_ERR_INTERNAL, "batched K/V-cache step: sequence %zu has %d rows, its cache %d", i, s.n, kv.n);
            }
            dllm__cpu_rows rows;
            rows.q0 = s.q0, rows.q1 = s.q1, rows.positions = s.positions, rows.kv = &kv;
            forward(s.ids, s.n, rows, s.r0, s.r1, out);
            out += (size_t)(s.r1 - s.r0) * c.n_vocab;
        }
        return DLLM_OK;
    }

  private:
    /* bd_forward on the committed cache kv (kvq: its codes under kv_quant). */
    dllm_status bd_forward_on(dllm__bd_kv &kv, dllm__kvq &kvq, const dllm__bd_call &call, float *logits) {
        if (call.kind == DLLM__BD_SUB_BLOCK && call.offset + call.T > kv.block_rows)
            return dllm__fail(DLLM_ERR_INTERNAL, "block diffusion: a sub-block forward at %d outside the block cache (%d rows)", call.offset, kv.block_rows);
        const int scratch = call.kind == DLLM__BD_SUB_BLOCK ? kv.block_rows : call.T;
        if (kv.n + scratch > kv.cap || kv.n + call.offset + call.T > (int)(cos_.size() / (m_.cfg.head_dim / 2)))
            return dllm__fail(DLLM_ERR_INTERNAL, "block diffusion: a forward of %d rows past %d committed ones overflows the K/V cache (%d rows)",
                              call.T, kv.n, kv.cap);
        const int row0 = kv.n;
        dllm__cpu_bd_forward(m_, pool_, buf_, kv, call, cos_.data(), sin_.data(), logits, fp8_, head_.get());
        if (call.kind == DLLM__BD_COMMIT && kvq.enabled())
            return dllm__kvq_commit(pool_, kvq, kv, row0, call.T, call.kv_group ? call.kv_group : m_.cfg.bd_size);
        return DLLM_OK;
    }

    /* Logits of canvas positions [r0, r1) (shift applied) from a forward over the given rows. */
    void forward(const int32_t *ids, int n, const dllm__cpu_rows &rows, int r0, int r1, float *out) {
        const dllm__config &c = m_.cfg;
        int raw0 = dllm__logit_row(c, r0), raw1 = dllm__logit_row(c, r1 - 1) + 1;
        raw_.resize((size_t)(raw1 - raw0) * c.n_vocab);
        dllm__cpu_forward(m_, pool_, buf_, ids, n, rows, nullptr, cos_.data(), sin_.data(), raw0, raw1, raw_.data(), fp8_, head_.get());
        dllm__unshift_rows(c, raw_.data(), raw0, r0, r1, out);
    }

    /* dllm_logits on a block-diffusion model: its plain forward without a cache, block-causal at the
     * granularity its forward uses when none is named, positions from 0, shift applied. */
    dllm_status bd_logits(const int32_t *ids, int n, int r0, int r1, float *out) {
        const dllm__config &c = m_.cfg;
        dllm__bd_kv kv;
        kv.reset(c, n);
        dllm__bd_call call;
        call.ids = ids, call.T = n, call.mask_block = c.bd_mask_block;
        call.r0 = dllm__logit_row(c, r0), call.r1 = dllm__logit_row(c, r1 - 1) + 1;
        raw_.resize((size_t)(call.r1 - call.r0) * c.n_vocab);
        dllm__cpu_bd_forward(m_, pool_, buf_, kv, call, cos_.data(), sin_.data(), raw_.data(), fp8_, head_.get());
        dllm__unshift_rows(c, raw_.data(), call.r0, r0, r1, out);
        return DLLM_OK;
    }

    /* This step's rows and keys (see dllm__step_rows); the K/V cache is sized at the block's first step. */
    dllm__cpu_rows rows_for(const dllm__decode &st, dllm__cpu_kv &kv) {
        const dllm__config &c = m_.cfg;
        dllm__cpu_rows rows;
        dllm__step_rows(st, c.shift_logits, rows.q0, rows.q1);
        rows.positions = st.positions.empty() ? nullptr : st.positions.data();
        if (st.kv_cache == DLLM_KV_CACHE_NONE) return rows;
        if (st.step_in_block == 0) {
            kv.n = (int)st.canvas.size();
            size_t elems = (size_t)c.n_layer * kv.n * c.n_head_kv * c.head_dim;
            kv.k.assign(elems, 0.0f);
            kv.v.assign(elems, 0.0f);
        }
        rows.kv = &kv;
        return rows;
    }

    const dllm_model &m_;
    dllm__pool pool_;
    std::vector<dllm__fp8_layer> fp8_;  // FP8 / SoloQ precisions: weights kept as codes + scales (1 byte or 4-4.5 bits a weight, as on the GPU)
    std::shared_ptr<const dllm__soloq_layer> head_;  // SoloQ with quantize_lm_head
    dllm__cpu_buffers buf_;
    dllm__cpu_kv kv_[2];  // conditional and (CFG) unconditional canvases
    std::vector<dllm__cpu_kv> batch_kv_;  // [batch] the K/V caches of a batched decode's sequences (batch_kv_reserve)
    std::vector<int> batch_kv_rows_;       // their capacities in rows
    dllm__bd_kv bd_kv_;   // block diffusion's committed blocks and block cache
    dllm__kvq kvq_;       // kv_quant: the committed blocks' codes (bd_kv_ holds their decoded values)
    struct bd_slot {
        dllm__bd_kv kv;
        dllm__kvq kvq;
    };
    std::vector<bd_slot> bd_slots_;  // [batch] the committed caches of a batched block-diffusion decode (bd_batch_reserve)
    std::vector<float> bd_raw_;      // a batched step's logits, before its choice
    std::vector<float> cos_, sin_, raw_, cond_, uncond_;
    dllm__step_work work_;
};

// ---------------------------------------------------------------------------------------------------
// 12. GPU: the CUDA libraries loaded at run time, errors, device memory
//     [dlopen] NVRTC and cuBLASLt are reached through one table of function pointers filled by dlopen when
//     the first GPU context (or JIT compile) needs them: the binaries start in milliseconds on machines
//     without the CUDA Toolkit, and the CPU backend needs nothing from it. The CUDA runtime is linked
//     statically and finds the driver itself.
// ---------------------------------------------------------------------------------------------------

/* The NVRTC and cuBLASLt entry points dllm calls, each named once: the table's member of the same name holds
 * it (decltype of the header's declaration, which is never called directly, so nothing links the library). */
#define DLLM__NVRTC_FUNCS(X)                                                                                        \
    X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcDestroyProgram) X(nvrtcAddNameExpression) \
    X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN)   \
    X(nvrtcGetPTXSize) X(nvrtcGetPTX) X(nvrtcGetLoweredName)
#define DLLM__CUBLASLT_FUNCS(X)                                                                                     \
    X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmul) X(cublasLtMatmulAlgoCapGetAttribute)                     \
    X(cublasLtMatmulAlgoCheck) X(cublasLtMatmulAlgoConfigGetAttribute) X(cublasLtMatmulAlgoConfigSetAttribute)     \
    X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy)                     \
    X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)         \
    X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)

struct dllm__cuda_libs {
#define DLLM__LIB_POINTER(name) decltype(&::name) name = nullptr;
    DLLM__NVRTC_FUNCS(DLLM__LIB_POINTER)
    DLLM__CUBLASLT_FUNCS(DLLM__LIB_POINTER)
#undef DLLM__LIB_POINTER
};
static dllm__cuda_libs dllm__lib;

/* dlopen's search (LD_LIBRARY_PATH, the loader cache), then the toolkit's usual homes. The soname's major
 * version is the one of the headers dllm was built with: another major has another ABI. */
static void *dllm__dlopen_first(const char *stem, int major, std::string &tried) {
    std::vector<std::string> names = {dllm__format("%s.so.%d", stem, major)};
    const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    for (const char *home : homes)
        if (home && *home) names.push_back(dllm__format("%s/lib64/%s.so.%d", home, stem, major));
    for (const std::string &n : names) {
        if (void *h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
        tried += (tried.empty() ? "" : ", ") + n;
    }
    return nullptr;
}

/* Loads one library and resolves its entry points once per process; later calls return the first outcome. */
static dllm_status dllm__load_lib(std::once_flag &once, dllm_status &result, std::string &error, const char *stem, int major, const char *package,
                                  const std::function<bool(void *, std::string &)> &resolve) {
    std::call_once(once, [&] {
        std::string tried, missing;
        void *h = dllm__dlopen_first(stem, major, tried);
        if (!h) {
            result = DLLM_ERR_NO_DEVICE;
            error = dllm__format("cannot load %s.so.%d, which the GPU backend needs (tried %s): install the CUDA Toolkit's %s or add its lib64 "
                                 "folder to LD_LIBRARY_PATH; the CPU backend (--backend cpu) needs no CUDA library", stem, major, tried.c_str(), package);
        } else if (!resolve(h, missing)) {
            result = DLLM_ERR_NO_DEVICE;
            error = dllm__format("%s.so.%d lacks %s: install the CUDA %d.x Toolkit's %s", stem, major, missing.c_str(), major, package);
        } else {
            result = DLLM_OK;
        }
    });
    return result == DLLM_OK ? DLLM_OK : dllm__fail(result, "%s", error.c_str());
}

#define DLLM__LIB_RESOLVE(name)                                                     \
    if (!(dllm__lib.name = (decltype(dllm__lib.name))dlsym(h, #name))) { missing = #name; return false; }

static dllm_status dllm__load_nvrtc() {
    static std::once_flag once;
    static dllm_status result = DLLM_OK;
    static std::string error;
    return dllm__load_lib(once, result, error, "libnvrtc", CUDA_VERSION / 1000, "NVRTC (libnvrtc)", [](void *h, std::string &missing) {
        DLLM__NVRTC_FUNCS(DLLM__LIB_RESOLVE)
        return true;
    });
}

static dllm_status dllm__load_cublaslt() {
    static std::once_flag once;
    static dllm_status result = DLLM_OK;
    static std::string error;
    return dllm__load_lib(once, result, error, "libcublasLt", CUBLAS_VER_MAJOR, "cuBLAS (libcublasLt)", [](void *h, std::string &missing) {
        DLLM__CUBLASLT_FUNCS(DLLM__LIB_RESOLVE)
        return true;
    });
}
#undef DLLM__LIB_RESOLVE

/* [dlopen] NCCL, for tensor parallelism (section 10b). Not part of the CUDA Toolkit, so dllm is built without its
 * header: the few types and entry points it calls are declared here as nccl.h 2.x defines them (result, data type
 * and reduction are C enums, passed as int; the 2.x ABI is stable, the soname libnccl.so.2). */
typedef struct dllm__nccl_comm *dllm__nccl_comm_t;
struct dllm__nccl_unique_id { char internal[128]; };
enum { DLLM__NCCL_SUCCESS = 0, DLLM__NCCL_SUM = 0, DLLM__NCCL_FLOAT32 = 7, DLLM__NCCL_BFLOAT16 = 9 };

#define DLLM__NCCL_FUNCS(X)                                                                                         \
    X(ncclGetVersion, int, (int *version))                                                                         \
    X(ncclGetErrorString, const char *, (int result))                                                              \
    X(ncclGetUniqueId, int, (dllm__nccl_unique_id *id))                                                            \
    X(ncclCommInitAll, int, (dllm__nccl_comm_t *comms, int n_devices, const int *devices))                         \
    X(ncclCommInitRank, int, (dllm__nccl_comm_t *comm, int n_ranks, dllm__nccl_unique_id id, int rank))           \
    X(ncclGroupStart, int, (void))                                                                                 \
    X(ncclGroupEnd, int, (void))                                                                                   \
    X(ncclAllReduce, int, (const void *send, void *recv, size_t count, int dtype, int op, dllm__nccl_comm_t comm,   \
                           cudaStream_t stream))                                                                   \
    X(ncclCommDestroy, int, (dllm__nccl_comm_t comm))

struct dllm__nccl_api {
#define DLLM__NCCL_POINTER(name, ret, args) ret(*name) args = nullptr;
    DLLM__NCCL_FUNCS(DLLM__NCCL_POINTER)
#undef DLLM__NCCL_POINTER
    int version = 0;  // ncclGetVersion's code: major * 10000 + minor * 100 + patch (2.9 and later)
};

/* Where libnccl.so.2 is looked for: dlopen's own search (LD_LIBRARY_PATH, the loader cache), then $NCCL_HOME and
 * the CUDA homes (pip's and NVIDIA's packages put it in lib, the HPC SDK in lib64). */
static std::vector<std::string> dllm__nccl_candidates() {
    std::vector<std::string> names = {"libnccl.so.2"};
    const char *homes[] = {getenv("NCCL_HOME"), getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    for (const char *home : homes)
        if (home && *home)
            for (const char *lib : {"lib", "lib64"}) names.push_back(dllm__format("%s/%s/libnccl.so.2", home, lib));
    return names;
}

/* Opens the first of `candidates` that loads, resolves every entry point and asks its version. Not cached: tests
 * call it with a path that does not exist; dllm__load_nccl is the once-per-process form. */
static dllm_status dllm__nccl_open(const std::vector<std::string> &candidates, dllm__nccl_api &api) {
    std::string tried;
    void *h = nullptr;
    for (const std::string &n : candidates) {
        if ((h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
        tried += (tried.empty() ? "" : ", ") + n;
    }
    if (!h)
        return dllm__fail(DLLM_ERR_NO_DEVICE, "cannot load libnccl.so.2, which tensor parallelism (n_devices > 1) needs (tried %s): install NCCL 2 "
                          "(e.g. the nvidia-nccl-cu12 wheel or the libnccl2 package) and put its lib folder on LD_LIBRARY_PATH or in NCCL_HOME; "
                          "one GPU (n_devices 0 or 1) needs no NCCL", tried.c_str());
#define DLLM__NCCL_RESOLVE(name, ret, args)                                                                       \
    if (!(api.name = (ret(*) args)dlsym(h, #name)))                                                                \
        return dllm__fail(DLLM_ERR_NO_DEVICE, "the NCCL library loaded for tensor parallelism lacks %s: install NCCL 2.x", #name);
    DLLM__NCCL_FUNCS(DLLM__NCCL_RESOLVE)
#undef DLLM__NCCL_RESOLVE
    if (api.ncclGetVersion(&api.version) != DLLM__NCCL_SUCCESS || api.version < 20000)
        return dllm__fail(DLLM_ERR_NO_DEVICE, "the NCCL library loaded for tensor parallelism reports version code %d; dllm needs NCCL 2.9 or later",
                          api.version);
    return DLLM_OK;
}

static dllm__nccl_api dllm__nccl;

/* NCCL loaded once per process into dllm__nccl; later calls return the first outcome and its message. */
static dllm_status dllm__load_nccl() {
    static std::once_flag once;
    static dllm_status result = DLLM_OK;
    static std::string error;
    std::call_once(once, [] {
        result = dllm__nccl_open(dllm__nccl_candidates(), dllm__nccl);
        error = result == DLLM_OK ? "" : dllm__tls_error;
    });
    return result == DLLM_OK ? DLLM_OK : dllm__fail(result, "%s", error.c_str());
}

static dllm_status dllm__cuda_fail(cudaError_t e, const char *what) {
    cudaGetLastError();  // clear a sticky-free error so the next call starts clean
    dllm_status s = e == cudaErrorMemoryAllocation ? DLLM_ERR_OUT_OF_MEMORY : DLLM_ERR_CUDA;
    return dllm__fail(s, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define DLLM__CUDA(expr)                                         \
    do {                                                         \
        cudaError_t dllm__e_ = (expr);                           \
        if (dllm__e_ != cudaSuccess) return dllm__cuda_fail(dllm__e_, #expr); \
    } while (0)

static dllm_status dllm__cublas_fail(cublasStatus_t s, const char *what) {
    return dllm__fail(s == CUBLAS_STATUS_ALLOC_FAILED ? DLLM_ERR_OUT_OF_MEMORY : DLLM_ERR_CUDA, "%s: cuBLASLt status %d", what, (int)s);
}

#define DLLM__CUBLAS(expr)                                       \
    do {                                                         \
        cublasStatus_t dllm__s_ = (expr);                        \
        if (dllm__s_ != CUBLAS_STATUS_SUCCESS) return dllm__cublas_fail(dllm__s_, #expr); \
    } while (0)

/* An owned device allocation; bytes are tracked so benchmarks can report dllm's own footprint. */
static std::atomic<int64_t> dllm__device_bytes{0}, dllm__device_peak{0};
/* Tests: when > 0, the device allocation that brings it to 0 fails as an out-of-memory would (each fit that allocates
 * counts one down), so that every allocation site's error path can be taken in turn. */
static std::atomic<int> dllm__device_alloc_countdown{0};

struct dllm__dbuf {
    void *ptr = nullptr;
    size_t bytes = 0;

    dllm__dbuf() {}
    dllm__dbuf(const dllm__dbuf &) = delete;
    dllm__dbuf &operator=(const dllm__dbuf &) = delete;
    dllm__dbuf(dllm__dbuf &&o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; o.bytes = 0; }
    dllm__dbuf &operator=(dllm__dbuf &&o) noexcept {
        if (this != &o) {
            release();
            ptr = o.ptr, bytes = o.bytes;
            o.ptr = nullptr, o.bytes = 0;
        }
        return *this;
    }
    ~dllm__dbuf() { release(); }
    void release() {
        if (ptr) {
            cudaFree(ptr);
            dllm__device_bytes -= (int64_t)bytes;
        }
        ptr = nullptr;
        bytes = 0;
    }
    /* Makes the buffer at least n bytes (contents are not kept when it grows). */
    dllm_status fit(size_t n, const char *what) {
        if (n <= bytes) return DLLM_OK;
        release();
        const bool injected = dllm__device_alloc_countdown > 0 && --dllm__device_alloc_countdown == 0;
        cudaError_t e = injected ? cudaErrorMemoryAllocation : cudaMalloc(&ptr, n);
        if (e != cudaSuccess) {
            ptr = nullptr;
            cudaGetLastError();
            return dllm__fail(DLLM_ERR_OUT_OF_MEMORY, "cannot allocate %.1f MiB of GPU memory for %s: %s", n / 1048576.0, what, cudaGetErrorString(e));
        }
        bytes = n;
        int64_t now = dllm__device_bytes += (int64_t)n;
        for (int64_t peak = dllm__device_peak; now > peak && !dllm__device_peak.compare_exchange_weak(peak, now);) {}
        return DLLM_OK;
    }
    template <class T> T *as() const { return (T *)ptr; }
};

/* [tensor parallelism] NCCL's result as a status. */
static dllm_status dllm__nccl_check(int result, const char *what) {
    if (result == DLLM__NCCL_SUCCESS) return DLLM_OK;
    return dllm__fail(DLLM_ERR_CUDA, "%s: NCCL error %d (%s)", what, result, dllm__nccl.ncclGetErrorString(result));
}

/* One NCCL communicator per rank over a context's devices, created together by ncclCommInitAll (one process drives
 * every GPU of the host), each with its own stream; destroyed with the owner. Not yet owned by a context: the
 * sharded GPU forward that would use it is not built (section 10b); tests check it on a multi-GPU host. */
struct dllm__tp_comms {
    std::vector<int> devices;
    std::vector<dllm__nccl_comm_t> comms;
    std::vector<cudaStream_t> streams;

    dllm__tp_comms() {}
    dllm__tp_comms(const dllm__tp_comms &) = delete;
    dllm__tp_comms &operator=(const dllm__tp_comms &) = delete;
    ~dllm__tp_comms() {
        for (size_t r = 0; r < comms.size(); r++)
            if (comms[r]) dllm__nccl.ncclCommDestroy(comms[r]);
        for (size_t r = 0; r < streams.size(); r++) {
            cudaSetDevice(devices[r]);
            cudaStreamDestroy(streams[r]);
        }
    }
    dllm_status init(const std::vector<int> &devs) {
        DLLM__TRY(dllm__load_nccl());
        devices = devs;
        for (int d : devices) {
            cudaStream_t st = nullptr;
            DLLM__CUDA(cudaSetDevice(d));
            DLLM__CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
            streams.push_back(st);
        }
        comms.assign(devices.size(), nullptr);
        return dllm__nccl_check(dllm__nccl.ncclCommInitAll(comms.data(), (int)devices.size(), devices.data()), "ncclCommInitAll");
    }
};

/* The all-reduce after O and after down: bufs[r] (count fp32 on rank r's device) := the sum over the ranks, on each
 * rank's stream (so a graph captured there holds it). One group: a thread that drives several ranks must issue all
 * of their calls between ncclGroupStart and ncclGroupEnd, or the first would wait forever for the others. */
static dllm_status dllm__tp_all_reduce_device(const dllm__tp_comms &c, float *const *bufs, size_t count) {
    DLLM__TRY(dllm__nccl_check(dllm__nccl.ncclGroupStart(), "ncclGroupStart"));
    int first_error = DLLM__NCCL_SUCCESS;
    for (size_t r = 0; r < c.comms.size(); r++) {
        int e = dllm__nccl.ncclAllReduce(bufs[r], bufs[r], count, DLLM__NCCL_FLOAT32, DLLM__NCCL_SUM, c.comms[r], c.streams[r]);
        if (first_error == DLLM__NCCL_SUCCESS) first_error = e;
    }
    const int end = dllm__nccl.ncclGroupEnd();  // always closes the group, even after a failed call
    DLLM__TRY(dllm__nccl_check(first_error, "ncclAllReduce"));
    return dllm__nccl_check(end, "ncclGroupEnd");
}

/* Checks NCCL on `devices` against the CPU reference's all-reduce (dllm__tp_all_reduce, rank order): rank r's buffer
 * holds count seeded values, after the device all-reduce every rank must hold the reference's sum. Over two ranks the
 * bits must match (fp32 addition commutes); over more, NCCL's order may differ in the last bits. Reports the largest
 * |difference| over all ranks and the number of elements that differ at all. Needs len(devices) GPUs. */
[[maybe_unused]] static dllm_status dllm__tp_all_reduce_selfcheck(const std::vector<int> &devices, size_t count, double &max_diff, size_t &n_differ) {
    dllm__tp_comms c;
    DLLM__TRY(c.init(devices));
    const size_t n = devices.size();
    std::vector<std::vector<float>> host(n, std::vector<float>(count));
    std::vector<const float *> parts;
    std::vector<dllm__dbuf> dev(n);
    std::vector<float *> bufs;
    for (size_t r = 0; r < n; r++) {
        for (size_t i = 0; i < count; i++) host[r][i] = (float)(dllm__uniform(29, (uint32_t)i, (uint32_t)r, 0, DLLM__RNG_GUMBEL) * 2 - 1) * (float)(1 + i % 7);
        parts.push_back(host[r].data());
        DLLM__CUDA(cudaSetDevice(devices[r]));
        DLLM__TRY(dev[r].fit(count * sizeof(float), "the all-reduce check"));
        DLLM__CUDA(cudaMemcpy(dev[r].ptr, host[r].data(), count * sizeof(float), cudaMemcpyHostToDevice));
        bufs.push_back(dev[r].as<float>());
    }
    std::vector<float> want(count), got(count);
    dllm__tp_all_reduce(parts, count, want.data());
    DLLM__TRY(dllm__tp_all_reduce_device(c, bufs.data(), count));
    max_diff = 0, n_differ = 0;
    for (size_t r = 0; r < n; r++) {
        DLLM__CUDA(cudaSetDevice(devices[r]));
        DLLM__CUDA(cudaStreamSynchronize(c.streams[r]));
        DLLM__CUDA(cudaMemcpy(got.data(), dev[r].ptr, count * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < count; i++) {
            max_diff = std::max(max_diff, (double)fabsf(got[i] - want[i]));
            n_differ += memcmp(&got[i], &want[i], sizeof(float)) != 0;
        }
    }
    for (size_t r = 0; r < n; r++) {  // free on each buffer's own device
        DLLM__CUDA(cudaSetDevice(devices[r]));
        dev[r].release();
    }
    return DLLM_OK;
}


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
/* Put before a kernel source's raw string literal, on the same line: the source's next line is this one. */
#define DLLM__SOURCE_LINE "#line " DLLM__XSTR(__LINE__) " \"dllm_cuda.cu\"\n"

/* The kernels' fixed-width types, the same names on the host (the contract's structs use them on both sides). */
typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;

/* The decoding state that lives on the device so that a captured step graph can replay unchanged. */
#define DLLM__STEP_STATE_FIELDS(X)                                                                                    \
    X(int, block_begin) X(int, block_end) /* current block [begin, end) */                                            \
    X(int, steps_per_block)                                                                                           \
    X(int, step_in_block)   /* advanced by select_commit */                                                           \
    X(int, global_step)     /* keys the RNG; advanced by select_commit */                                             \
    X(int, n_block_masks)   /* masks in the block at its first step */                                               \
    X(int, n_committed)     /* positions committed by the last step */                                               \
    X(int, n_block_left)    /* masks left in the block after the last step */

/* One sampler CTA's statistics of its vocabulary slice for one row (conf_partial_kernel -> conf_combine_kernel). */
#define DLLM__CONF_PARTIAL_FIELDS(X)                                                                                  \
    X(double, best_score)   /* argmax criterion: the logit (T = 0) or the Gumbel score (T > 0) */                     \
    X(double, sum_exp)      /* sum of e^x over the slice, x = (l - max_logit) * inv_t */                              \
    X(double, sum_exp_x)    /* ENTROPY: sum of e^x x over the slice */                                                \
    X(float, max_logit)                                                                                               \
    X(float, second_logit)  /* MARGIN: the second largest logit of the slice (a tie for the largest counts twice) */  \
    X(float, best_logit)                                                                                              \
    X(int, best_idx)

/* The sampler's arguments (one step's token choice over rows of logits). */
#define DLLM__SAMPLER_ARGS_FIELDS(X)                                                                                  \
    X(const float *, cond)  /* [rows][vocab] logits */                                                                \
    X(const float *, uncond) /* CFG: unconditional logits with the same layout, or null */                            \
    X(float, cfg_weight)    /* s + 1: logits = U + (s + 1)(C - U) */                                                  \
    X(int, vocab) X(int, slice) X(int, n_slices) X(int, n_rows)                                                       \
    X(int, pos0)            /* canvas position of row 0 */                                                            \
    X(int, lrow0) X(int, shift0) /* logits row of row r: (shift0 ? max(r - 1, 0) : r) + lrow0 (Dream's shift) */      \
    X(int, raw_rows)        /* logits rows per batch entry in the buffer */                                           \
    X(double, temperature)                                                                                            \
    X(u64, seed)                                                                                                      \
    X(int, eos_inf) X(int, eos_id) X(int, eot_id) X(int, defer_eos_eot)                                               \
    X(int, remasking)       /* dllm_remasking: which confidence */                                                    \
    X(int, conf_tempered)   /* the confidence's softmax is Dream's softmax(l / T), not LLaDA's softmax(l) */          \
    X(double, alg_temp)     /* > 0: the ranking key is conf / alg_temp + Gumbel noise */                              \
    X(int, top_k) X(float, top_p) X(float, min_p) /* the sampler filters (dllm_gen_params), applied through cutoff */ \
    X(const float *, cutoff) /* [n_rows] row_cutoff_kernel's output: a logit below it is -inf; null = no filter */

/* The attention's arguments: query row r of batch b, head h at q + b*q_bstride + r*q_stride + h*HD; key row at
 * k + (b*seq + r)*kv_stride + h*HD; output like the query with o_*. */
#define DLLM__ATTN_ARGS_FIELDS(X)                                                                                     \
    X(const bf16_t *, q) X(const bf16_t *, k) X(const bf16_t *, v) X(bf16_t *, o)                                     \
    X(const unsigned char *, key_valid) /* [batch][seq] or null */                                                    \
    X(int, seq) X(int, q_rows) /* keys and query rows per batch entry (a K/V cache step: q_rows < seq) */             \
    X(int, q_stride) X(int, kv_stride) X(int, o_stride) X(int, group) /* group = n_head / n_kv */                    \
    X(u64, q_bstride) X(u64, o_bstride)                                                                               \
    X(const dllm_step_state *, st) /* current block: its KV tiles are visited last; null or empty: plain order */     \
    X(float, scale_log2)    /* log2(e) / sqrt(HD) */                                                                  \
    X(int, fa_mode)         /* FACache: 0 plain, 1 save the state after the early tiles, 2 resume from it */          \
    X(float *, fa_state)    /* [batch][head][q tile][field][thread] online-softmax registers (modes 1, 2) */          \
    X(int, kv_splits)       /* CTAs per (query tile, head) sharing the KV tiles; > 1: blockIdx.z = batch * kv_splits + split */ \
    X(float *, partial)     /* kv_splits > 1: per-split states for attn_combine (see store_partial) */          \
    X(int, mask_block)      /* > 0: block-causal (block diffusion): query row r sees keys < min(seq, visible_keys) */ \
    X(int, q_index0)        /* the sequence index of query row 0 for that mask (key j's index is j) */               \
    X(const int *, q_offsets) /* varlen (flash_attn<..., true>) [batch + 1]: sequence b's query (and output) rows */  \
    X(const int *, kv_offsets) /* [q_offsets[b], q_offsets[b+1]) of q and o, its keys [kv_offsets[b], ..[b+1]) of k, v */ \
    X(const int *, varlen_masks) /* varlen, or null: [batch][2] sequence b's (mask_block, q_index0), its keys counted from its first */

#define DLLM__GEMM_WG_ARGS_FIELDS(X) X(int, m) X(int, n) X(int, k)

/* soloq_quantize_rows's arguments: bf16 rows of x rotated by R = mixer . FWHT_b . signs . perm (a
 * null array is the identity) and quantised in `format` (dllm__q4_format). */
#define DLLM__SOLOQ_ARGS_FIELDS(X)                                                                                    \
    X(const void *, x) X(u64, x_stride)  /* row r at x + r * x_stride elements */                                     \
    X(const int *, perm) X(const unsigned char *, signs) X(const float *, mixer) /* [d], [d / 8] bits, [k][k] */      \
    X(unsigned char *, codes) X(unsigned char *, block_scales) /* packed rows [rows][d / 2], NVFP4 [rows][d / 16]; or null */ \
    X(float *, row_scale) X(bf16_t *, values) /* [rows]; the C values [rows][d] (or null) */                          \
    X(const float *, h_in) X(float *, h_out) X(const bf16_t *, delta) X(const float *, norm_w) /* producer 1's operands */ \
    X(int, rows) X(int, d) X(int, rot_b) X(int, rot_k) X(int, format) X(int, quantize) X(int, bias_correction)        \
    X(int, producer)     /* 0: the bf16 rows x; 1: add_rmsnorm's row (h_in (+ delta) -> h_out, normed by norm_w); 2: SwiGLU of the [gate | up] rows x */ \
    X(int, cluster)      /* CTAs a row (dllm__soloq_split): a cluster along x */                                      \
    X(float, rot_norm)   /* 1 / sqrt(rot_b), rounded to fp32 once */                                                  \
    X(float, eps)        /* producer 1's RMSNorm epsilon */                                                           \
    X(signed char *, values_i8) /* the C values as int8 [rows][d] (or null): the [INT8 GEMM]'s input; integer formats only */

#define DLLM__FIELD(type, name) type name;
struct dllm_step_state { DLLM__STEP_STATE_FIELDS(DLLM__FIELD) };
struct conf_partial { DLLM__CONF_PARTIAL_FIELDS(DLLM__FIELD) };
struct sampler_args { DLLM__SAMPLER_ARGS_FIELDS(DLLM__FIELD) };
struct attn_args { DLLM__ATTN_ARGS_FIELDS(DLLM__FIELD) };
struct gemm_wg_args { DLLM__GEMM_WG_ARGS_FIELDS(DLLM__FIELD) };
struct soloq_args { DLLM__SOLOQ_ARGS_FIELDS(DLLM__FIELD) };
// Both compilers lay these out by the same C rules for the same member list; the sizes pin what the kernels assume.
static_assert(sizeof(dllm_step_state) == 32 && sizeof(conf_partial) == 40 && sizeof(gemm_wg_args) == 12, "contract layout");
static_assert(sizeof(sampler_args) == 128 && sizeof(attn_args) == 152 && sizeof(soloq_args) == 160, "contract layout");

/* The contract as kernel source: the shared enums and constants, then the structs above. */
static std::string dllm__src_contract() {
    return dllm__format("enum { REMASK_LOW_CONFIDENCE = %d, REMASK_RANDOM = %d, REMASK_MARGIN = %d, REMASK_ENTROPY = %d, REMASK_ORIGIN = %d };\n",
                        DLLM_REMASK_LOW_CONFIDENCE, DLLM_REMASK_RANDOM, DLLM_REMASK_MARGIN, DLLM_REMASK_ENTROPY, DLLM_REMASK_ORIGIN) +
           DLLM__XSTR(struct dllm_step_state { DLLM__STEP_STATE_FIELDS(DLLM__FIELD) };) "\n"
           DLLM__XSTR(struct conf_partial { DLLM__CONF_PARTIAL_FIELDS(DLLM__FIELD) };) "\n"
           DLLM__XSTR(struct sampler_args { DLLM__SAMPLER_ARGS_FIELDS(DLLM__FIELD) };) "\n"
           DLLM__XSTR(struct attn_args { DLLM__ATTN_ARGS_FIELDS(DLLM__FIELD) };) "\n"
           DLLM__XSTR(struct gemm_wg_args { DLLM__GEMM_WG_ARGS_FIELDS(DLLM__FIELD) };) "\n"
           DLLM__XSTR(struct soloq_args { DLLM__SOLOQ_ARGS_FIELDS(DLLM__FIELD) };) "\n";
}

/* A kernel table row X(name, attributes, (parameters)) becomes, in the kernel source, the macro KERNEL_<name> that
 * opens the kernel's definition, and on the host the signature type dllm__sig_<name> its handle is typed by. */
#define DLLM__KERNEL_DECLARE(name, attrs, params) "#define KERNEL_" #name " extern \"C\" __global__ void " #attrs " " #name " " #params "\n"
#define DLLM__KERNEL_SIGNATURE(name, attrs, params) typedef void dllm__sig_##name params;
#define DLLM__KERNEL_NAME(name, attrs, params) #name,

/* A launch configuration: grid, block, dynamic shared memory, CTAs per cluster along x. */
struct dllm__grid {
    dim3 grid, block;
    size_t smem = 0;
    unsigned cluster = 1;
    dllm__grid(dim3 g, dim3 b, size_t sm = 0, unsigned cl = 1) : grid(g), block(b), smem(sm), cluster(cl) {}
};

static dllm_status dllm__launch_raw(cudaKernel_t k, const dllm__grid &g, cudaStream_t stream, void **args, const char *name);

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
    template <class T, size_t... I> dllm_status launch_tuple(const dllm__grid &g, cudaStream_t s, T &values, std::index_sequence<I...>) const {
        void *argv[sizeof...(P) + 1] = {(void *)&std::get<I>(values)...};
        return dllm__launch_raw(fn, g, s, argv, name);
    }
};

/* Shared by every module: fixed-width types, bf16 conversions, Philox (twin: dllm__philox). */
static const char *dllm__src_common = DLLM__SOURCE_LINE R"DLLM(
typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;
#define DLLM_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float bf16_to_f32(bf16_t b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    bf16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}
/* Two floats into one register: lo in the low half (the lower column of an mma fragment). */
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ void philox(u64 seed, u32 c0, u32 c1, u32 c2, u32 c3, u32 out[4]) {
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c1 = lo1; c3 = lo0; c0 = n0; c2 = n2;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}
/* Twin of dllm__uniform: 53 bits, offset by half a unit, strictly inside (0, 1). */
__device__ __forceinline__ double uniform01(u64 seed, u32 index, u32 position, u32 step, u32 stream) {
    u32 o[4];
    philox(seed, index, position, step, stream, o);
    u64 bits = (((u64)o[0] << 32) | o[1]) >> 11;
    return ((double)bits + 0.5) * (1.0 / 9007199254740992.0);
}

/* Programmatic dependent launch (sm_90+, see dllm__launch): this grid may start while the previous one in
 * the stream is still finishing. Every kernel calls this first: it waits until the previous grid has
 * completed and its writes are visible, then lets the next grid start launching, so that the launch of
 * each kernel overlaps the tail of the one before instead of following it. A no-op without the launch
 * attribute and before sm_90. */
__device__ __forceinline__ void pdl_enter() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

)DLLM";

/* [kernel table] the row-wise module's kernels (this section): X(name, attributes, (parameters)). */
#define DLLM__ROWWISE_KERNELS(X) \
    X(embed_gather, , (const int *ids, int n_rows, const bf16_t *table, int d, float *h)) \
    X(add_rmsnorm, __launch_bounds__(1024), (const float *h_in, float *h_out, const bf16_t *delta, const float *w, float eps, bf16_t *y, int d, int n_rows, int row0, int seq_len)) \
    X(rope_qkv, , (bf16_t *qkv, int n_rows, int seq_len, int pos0, const int *positions, int n_head, int n_kv, int head_dim, const float *bias, const float *cos_t, const float *sin_t)) \
    X(swiglu, , (const bf16_t *gu, bf16_t *out, int n_rows, int f)) \
    X(make_uncond, , (const int *canvas, const unsigned char *is_prompt, int n, int mask_id, int *out)) \
    X(block_begin, , (dllm_step_state *st, const int *canvas, int begin, int end, int steps_per_block, int mask_id)) \
    X(fill_random_bf16, , (bf16_t *w, u64 n, u64 seed, float scale, int constant)) \
    X(find_nonfinite_bf16, , (const bf16_t *w, u64 n, u64 *first)) \
    X(llama4_scale_q, , (bf16_t *qkv, int n_rows, int stride, int width, int pos0, float beta, int orig_max))
DLLM__ROWWISE_KERNELS(DLLM__KERNEL_SIGNATURE)

/* What the row-wise module's kernels and SoloQ's fused producers share: 16-byte row accesses, the residual add + RMS
 * of a row, SwiGLU's product. Needs NORM_SLOTS. */
static const char *dllm__src_rows_common = DLLM__SOURCE_LINE R"DLLM(
/* 8 bf16 <-> 8 floats: the 16-byte accesses of the row-wise kernels (sizes are multiples of 8). */
__device__ __forceinline__ void unpack8(uint4 v, float f[8]) {
    u32 w[4] = {v.x, v.y, v.z, v.w};
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ uint4 pack8(const float f[8]) {
    return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
}
__device__ __forceinline__ void load8(const float *p, float f[8]) {
    float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}
__device__ __forceinline__ void store8(float *p, const float f[8]) {
    *(float4 *)p = make_float4(f[0], f[1], f[2], f[3]);
    *(float4 *)(p + 4) = make_float4(f[4], f[5], f[6], f[7]);
}

/* Row-wise norms keep a row in registers between the sum of squares and the scaling: chunk slot j of a thread is
 * the 16-byte chunk threadIdx.x + j * blockDim.x, one slot up to 8192 values a row (1024 threads), at most NORM_SLOTS
 * (from the host's dllm__norm_slots). Re-reading the row after the reduction instead took 16.3 against 15.5 us at
 * LLaDA-8B's 1024 x 4096 on an H200; giving a thread 2 or 4 chunks of a shorter CTA, 19.0-19.6 us.
 *
 * The first half of add_rmsnorm and add_rmsnorm_e4m3, for source row src: v = h_in[src] (+ delta[src]) into the
 * thread's slots (zeros past d), h_out[src] = v (if h_out); returns rsqrt(mean(v^2) + eps). The sum of squares is
 * reduced in a fixed order, so a row's bits never depend on which other rows are computed (LaCache relies on this). */
__device__ __forceinline__ float residual_rms(const float *h_in, float *h_out, const bf16_t *delta, u64 src, int d, float eps,
                                              float (&v)[NORM_SLOTS][8]) {
    uint4 dv[NORM_SLOTS];
    #pragma unroll
    for (int j = 0; j < NORM_SLOTS; j++) {  // all loads first
        const int k = (threadIdx.x + j * blockDim.x) * 8;
        for (int e = 0; e < 8; e++) v[j][e] = 0.f;
        if (k < d) {
            load8(h_in + src * d + k, v[j]);
            if (delta) dv[j] = *(const uint4 *)(delta + src * d + k);
        }
    }
    float ss = 0.f;
    #pragma unroll
    for (int j = 0; j < NORM_SLOTS; j++) {
        const int k = (threadIdx.x + j * blockDim.x) * 8;
        if (k >= d) continue;
        if (delta) {
            float g[8];
            unpack8(dv[j], g);
            for (int e = 0; e < 8; e++) v[j][e] += g[e];
        }
        if (h_out) store8(h_out + src * d + k, v[j]);
        for (int e = 0; e < 8; e++) ss += v[j][e] * v[j][e];
    }
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) part[0] = t;
    }
    __syncthreads();
    return rsqrtf(part[0] / (float)d + eps);
}

/* silu(g) * u for 8 columns of a [gate (f) | up (f)] row: shared by swiglu and swiglu_e4m3, so that the
 * FP8 path quantises exactly the values the BF16 path computes. */
__device__ __forceinline__ void silu_mul8(const bf16_t *gu_row, int f, int col, float g[8]) {
    float u[8];
    unpack8(*(const uint4 *)(gu_row + col), g);
    unpack8(*(const uint4 *)(gu_row + f + col), u);
    for (int e = 0; e < 8; e++) g[e] = g[e] / (1.f + __expf(-g[e])) * u[e];
}

)DLLM";

/* Row-wise kernels: shapes are run-time arguments, so one module serves every model. */
static const char *dllm__src_rowwise = DLLM__SOURCE_LINE R"DLLM(
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
 * adds the fp32 bias, rotates q and k heads by the position p = (row % seq_len) + pos0 (or positions[p]: DPad) with the same
 * cos/sin tables as the CPU. Grid dllm__rows_grid: x over (head, 4 pairs) of a row, one thread each; y over rows, so
 * that a thread divides 32-bit numbers only (a flat 64-bit index took three 64-bit divisions a thread). */
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
        float x1[4] = {__uint_as_float(lo.x << 16), __uint_as_float(lo.x & 0xffff0000u), __uint_as_float(lo.y << 16), __uint_as_float(lo.y & 0xffff0000u)};
        float x2[4] = {__uint_as_float(hi.x << 16), __uint_as_float(hi.x & 0xffff0000u), __uint_as_float(hi.y << 16), __uint_as_float(hi.y & 0xffff0000u)};
        if (bias) {
            const float *bh = bias + hd * head_dim;
            for (int e = 0; e < 4; e++) { x1[e] += bh[j + e]; x2[e] += bh[j + half + e]; }
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
 * heads) of each row of `stride` elements: row r at position pos0 + r is scaled by 1 + beta log(1 + floor(pos / orig_max)).
 * Grid dllm__rows_grid: x over 8-column chunks, y over rows. */
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
        const float u1 = ((float)(z >> 40) + 0.5f) * (1.0f / 16777216.0f), u2 = (float)(z & 0xFFFFFFu) * (1.0f / 16777216.0f);
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
)DLLM";

/* [kernel table] the FP8 quantisers, compiled into the row-wise module: X(name, attributes, (parameters)). */
#define DLLM__FP8_QUANT_KERNELS(X) \
    X(quantize_rows_e4m3, , (const void *x, int x_f32, int k, int n_rows, unsigned char *q, float *scale, int scale_ld, float fixed_scale)) \
    X(add_rmsnorm_e4m3, __launch_bounds__(1024), (const float *h_in, float *h_out, const bf16_t *delta, const float *w, float eps, unsigned char *q, float *scale, int scale_ld, int d, int n_rows, int row0, int seq_len)) \
    X(swiglu_e4m3, , (const bf16_t *gu, int f, int n_rows, unsigned char *q, float *scale, int scale_ld)) \
    X(quantize_weight_blocks, , (const bf16_t *w, int n, int k, unsigned char *q, float *scale, int scale_ld))
DLLM__FP8_QUANT_KERNELS(DLLM__KERNEL_SIGNATURE)

/* FP8 E4M3 quantisation (LaCache 3.4), compiled into the row-wise module. Activations: groups of 1x128
 * along K, codes e4m3(x / s) with s = amax / 448 (1 for an all-zero group), rows padded with zero codes to
 * k_pad = 128 * ceil(k / 128), scales token-contiguous: scale[g * scale_ld + row] (cuBLASLt's VEC128
 * layout for the B operand). Weights: 128x128 blocks (BLK128x128 for the A operand). Each kernel names its
 * twin (section 9); the fused kernels quantise exactly the bf16 values the BF16 path would produce. */
static const char *dllm__src_e4m3 = DLLM__SOURCE_LINE R"DLLM(
__device__ __forceinline__ float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }

/* Twin: dllm__f32_to_e4m3's canonical codes: one zero (0x00), one NaN (0x7f), whatever sign the hardware gave. */
__device__ __forceinline__ u32 e4m3_canonical(u32 c) {
    u32 m = c & 0x7fu;
    return m == 0u ? 0u : (m == 0x7fu ? 0x7fu : c);
}

#if __CUDA_ARCH__ >= 890 && !defined(DLLM_E4M3_SOFTWARE)
/* Two codes, lo in the low byte: round to nearest even, saturate to +-448 (Inf too). */
__device__ __forceinline__ u32 e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return e4m3_canonical(r & 0xffu) | e4m3_canonical((u32)r >> 8) << 8;
}
#else
/* GPUs before sm_89 have no FP8 conversion (and never run the FP8 GEMM): the twin's arithmetic. Also used
 * on newer GPUs when DLLM_E4M3_SOFTWARE is defined, so that the tests check it against the twin. */
__device__ __forceinline__ u32 e4m3_soft(float x) {
    if (x != x) return 0x7fu;
    float a = fabsf(x);
    int mag;
    if (a < 0x1p-6f) {
        mag = (int)rintf(a * 512.f);
    } else if (a >= 448.f) {
        mag = 0x7e;
    } else {
        int e;
        float m = frexpf(a, &e);
        mag = (e + 6) * 8 + (int)rintf(m * 16.f) - 8;
    }
    return mag ? ((__float_as_uint(x) >> 24) & 0x80u) | (u32)mag : 0u;
}
__device__ __forceinline__ u32 e4m3x2(float lo, float hi) { return e4m3_soft(lo) | e4m3_soft(hi) << 8; }
#endif

/* Eight codes of f / s (IEEE division, as the twin divides), first value in the lowest byte. */
__device__ __forceinline__ uint2 e4m3x8(const float f[8], float s) {
    u32 c[4];
    for (int e = 0; e < 4; e++) c[e] = e4m3x2(f[2 * e] / s, f[2 * e + 1] / s);
    return make_uint2(c[0] | c[1] << 16, c[2] | c[3] << 16);
}

/* Twin: dllm__e4m3_scale. */
__device__ __forceinline__ float e4m3_scale(float amax) {
    float s = amax / 448.f;
    return s > 0.f ? s : 1.f;
}
)DLLM";

/* The FP8 quantisers themselves (after dllm__src_e4m3's conversions). */
static const char *dllm__src_fp8 = DLLM__SOURCE_LINE R"DLLM(
/* One 1x128 group held by 16 consecutive lanes, 8 values each; every lane of the warp must call it. Returns
 * the group's scale (fixed_scale instead when > 0) and this lane's codes. fmaxf drops NaN, as the twin's. */
__device__ __forceinline__ float quantize_group8(const float f[8], float fixed_scale, uint2 *codes) {
    float amax = 0.f;
    for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(f[e]));
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float s = fixed_scale > 0.f ? fixed_scale : e4m3_scale(amax);
    *codes = e4m3x8(f, s);
    return s;
}

/* Stores chunk c (8 codes) of a quantised row of n_chunks chunks and, from the group's first chunk, its scale.
 * Chunk c sits in lane c % 32, so the 16 chunks of a group are the 16 lanes that reduced its amax together. */
__device__ __forceinline__ void store_chunk8(unsigned char *q_row, float *scale, int scale_ld, u64 row, int c, int n_chunks, uint2 codes,
                                             float s) {
    if (c >= n_chunks) return;
    *(uint2 *)(q_row + (u64)c * 8) = codes;
    if ((c & 15) == 0) scale[(u64)(c >> 4) * scale_ld + row] = s;
}

__device__ __forceinline__ int e4m3_chunks(int k) { return ((k + 127) >> 7) << 4; }  // 8-code chunks in a padded row

/* Twin: dllm__quantize_groups. Rows of x (bf16, or fp32 when x_f32) [n_rows x k] into q [n_rows x k_pad] and their
 * scales. fixed_scale > 0 replaces every group's scale (one scale for the tensor; the tests use 1 to convert
 * raw values). Grid dllm__e4m3_rows_grid: x over 8-code chunks (blockDim a multiple of 32), y over rows. */
KERNEL_quantize_rows_e4m3 {
    pdl_enter();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, n_chunks = e4m3_chunks(k);
    for (int row = blockIdx.y; row < n_rows; row += gridDim.y) {  // the same trip count in every lane: all reach the shuffles
        float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (c * 8 < k) {
            if (x_f32) load8((const float *)x + (u64)row * k + c * 8, f);
            else unpack8(*(const uint4 *)((const bf16_t *)x + (u64)row * k + c * 8), f);
        }
        uint2 codes;
        float s = quantize_group8(f, fixed_scale, &codes);
        store_chunk8(q + (u64)row * n_chunks * 8, scale, scale_ld, row, c, n_chunks, codes, s);
    }
}

/* Twin: add_rmsnorm (same rows, same arguments) followed by dllm__quantize_groups of its bf16 output: output row
 * b * n_rows + i goes to q [.. x d_pad] and its scales. One CTA per row, blockDim a multiple of 32 with
 * blockDim * NORM_SLOTS >= d_pad / 8: chunk c sits in lane c % 32 (store_chunk8). */
KERNEL_add_rmsnorm_e4m3 {
    pdl_enter();
    int i = blockIdx.x, b = blockIdx.y;
    u64 src = (u64)b * seq_len + row0 + i, dst = (u64)b * n_rows + i;
    float v[NORM_SLOTS][8], g[8];
    const float r = residual_rms(h_in, h_out, delta, src, d, eps, v);
    const int n_chunks = e4m3_chunks(d);
    #pragma unroll
    for (int j = 0; j < NORM_SLOTS; j++) {
        if (j * (int)blockDim.x >= n_chunks) break;  // uniform over the CTA: every lane reaches the shuffles
        const int c = threadIdx.x + j * blockDim.x;
        if (c * 8 < d) {
            load8(w + c * 8, g);
            for (int e = 0; e < 8; e++) v[j][e] = bf16_round((v[j][e] * r) * g[e]);
        }
        uint2 codes;
        float s = quantize_group8(v[j], 0.f, &codes);
        store_chunk8(q + dst * n_chunks * 8, scale, scale_ld, dst, c, n_chunks, codes, s);
    }
}

/* Twin: swiglu followed by dllm__quantize_groups of its bf16 output. gu rows are [gate (f) | up (f)], n_rows of
 * them. Grid dllm__e4m3_rows_grid over f: x over 8-code chunks (blockDim a multiple of 32), y over rows. */
KERNEL_swiglu_e4m3 {
    pdl_enter();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, n_chunks = e4m3_chunks(f);
    for (int row = blockIdx.y; row < n_rows; row += gridDim.y) {  // the same trip count in every lane: all reach the shuffles
        float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (c * 8 < f) {
            silu_mul8(gu + (u64)row * 2 * f, f, c * 8, v);
            for (int e = 0; e < 8; e++) v[e] = bf16_round(v[e]);
        }
        uint2 codes;
        float s = quantize_group8(v, 0.f, &codes);
        store_chunk8(q + (u64)row * n_chunks * 8, scale, scale_ld, row, c, n_chunks, codes, s);
    }
}

/* Twin: dllm__quantize_blocks. One CTA of 256 threads per 128x128 block (kb, nb) of W [n x k] (bf16, row-major):
 * codes into q [n x k_pad] (padding columns 0), the scale into scale[nb * scale_ld + kb]. Each thread owns
 * half a row of the block (64 values). */
KERNEL_quantize_weight_blocks {
    pdl_enter();
    const int kb = blockIdx.x, nb = blockIdx.y, k_pad = e4m3_chunks(k) * 8;
    const int row = nb * 128 + (threadIdx.x >> 1), col0 = kb * 128 + (threadIdx.x & 1) * 64;
    float f[8], amax = 0.f;
    for (int c = col0; row < n && c < col0 + 64 && c < k; c += 8) {
        unpack8(*(const uint4 *)(w + (u64)row * k + c), f);
        for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(f[e]));
    }
    __shared__ float part[8];
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = amax;
    __syncthreads();
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, part[i]);
    const float s = e4m3_scale(amax);
    if (threadIdx.x == 0) scale[(u64)nb * scale_ld + kb] = s;
    for (int c = col0; row < n && c < col0 + 64; c += 8) {
        uint2 codes = make_uint2(0u, 0u);
        if (c < k) {
            unpack8(*(const uint4 *)(w + (u64)row * k + c), f);
            codes = e4m3x8(f, s);
        }
        *(uint2 *)(q + (u64)row * k_pad + c) = codes;
    }
}
)DLLM";

/* [kernel table] SoloQ's module (compiled only for a context with a SoloQ precision): X(name, attributes, (parameters)). */
#define DLLM__SOLOQ_KERNELS(X) \
    X(soloq_quantize_rows, __launch_bounds__(SOLOQ_QUANTIZE_THREADS, 1), (soloq_args a)) \
    X(soloq_produce_rows, __launch_bounds__(1024, 1), (soloq_args a)) \
    X(soloq_dequantize_rows, , (const unsigned char *codes, const unsigned char *block_scales, int format, int rows, int cols, bf16_t *out)) \
    X(soloq_scale_rows, , (const float *acc, int m, int n, const float *s_x, const float *s_w, void *y, int y_f32, u64 ldy)) \
    X(soloq_unpack_rows_i8, , (const unsigned char *codes, int format, int rows, int cols, signed char *out)) \
    X(soloq_scale_rows_i32, , (const int *acc, int m, int n, const float *s_x, const float *s_w, void *y, int y_f32, u64 ldy))
DLLM__SOLOQ_KERNELS(DLLM__KERNEL_SIGNATURE)

/* [SoloQ] on the device: the rotation and quantisers of section 9b, bit for bit (its header states the order of every
 * float operation; here each one is an explicit _rn intrinsic or fmaf, so no contraction can change a bit), the
 * dequantiser of stored weights into their BF16 integer values C, and the GEMM epilogue that applies the row scales.
 * The format's constants come from dllm__src_soloq_tables, printed from the CPU's own tables. */
static const char *dllm__src_soloq = DLLM__SOURCE_LINE R"DLLM(
/* Twin: dllm__soloq_dot. Every lane of one warp calls it: lane l's fmaf chain over i = l, l + 32, ..., then the
 * butterfly; an addition is commutative, so every lane ends with lane 0's bits, which are the twin's. */
__device__ float soloq_dot(const float *a, const float *b, int n) {
    float p = 0.f;
#pragma unroll 8  // the loads run ahead of the fmaf chain
    for (int i = threadIdx.x & 31; i < n; i += 32) p = fmaf(a[i], b[i], p);
    for (int off = 16; off > 0; off >>= 1) p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, off));
    return p;
}

/* Twin: dllm__e4m3_to_f32. */
__device__ __forceinline__ float e4m3_value(u32 c) {
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return __int_as_float(0x7fc00000);
    const float v = e ? __fmul_rn((float)(8 + m), __int_as_float((e - 10 + 127) << 23)) : __fmul_rn((float)m, 0x1p-9f);
    return c & 0x80u ? -v : v;
}

/* Twins: dllm__f32_to_e2m1 and dllm__e2m1_to_f32. */
__device__ __forceinline__ u32 e2m1_code(float v) {
    const float a = fabsf(v);
    const u32 m = a <= 0.25f ? 0u : a < 0.75f ? 1u : a <= 1.25f ? 2u : a < 1.75f ? 3u : a <= 2.5f ? 4u : a < 3.5f ? 5u : a <= 5.0f ? 6u : 7u;
    return m ? ((signbit(v) ? 8u : 0u) | m) : 0u;
}
__device__ __forceinline__ float e2m1_value(u32 c) {
    const u32 m = c & 7u;
    const float v = m < 4u ? 0.5f * (float)m : m == 7u ? 6.f : (float)(m - 2u);
    return c & 8u ? -v : v;
}

/* Twin: dllm__e8p_decode4 (4 x the 8 coordinates of an E8P code). */
__device__ __forceinline__ void e8p_decode4(u32 code, int out4[8]) {
    const unsigned char *a = E8P_ABS + (code >> 8) * 8;
    int neg = 0, sum_half = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) sum_half += a[i];
#pragma unroll
    for (int i = 1; i < 8; i++) neg += code >> i & 1;
    const bool neg0 = ((sum_half / 2 - neg) & 1) != 0;
    const int shift = code & 1 ? 1 : -1;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const bool negative = i == 0 ? neg0 : (code >> i & 1) != 0;
        out4[i] = 2 * (negative ? -(int)a[i] : (int)a[i]) + shift;
    }
}

/* Twin: dllm__e8p_int. */
__device__ __forceinline__ int e8p_int(int e1_4, int e2_4) { return E8P_INT[((e1_4 + 11) / 2) * 12 + (e2_4 + 11) / 2]; }

/* Twin: dllm__e8p_encode (the exact search; every thread of a warp walks the patterns in the same order, so the
 * table reads are constant-cache broadcasts). */
__device__ u32 e8p_encode(const float x[8]) {
    float best = DLLM_INF;
    u32 best_code = 0;
    for (int s = 0; s < 2; s++) {
        const float shift = s ? 0.25f : -0.25f;
        float y[8], ay[8];
        int neg_y = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            y[i] = __fsub_rn(x[i], shift);
            ay[i] = fabsf(y[i]);
            neg_y += y[i] < 0.f;
        }
        for (int p = 0; p < 256; p++) {
            const unsigned char *h = E8P_ABS + p * 8;
            float cost = 0.f, flip_cost = DLLM_INF;
            int sum_half = 0, flip = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float a = 0.5f * (float)h[i], e = __fsub_rn(ay[i], a);
                cost = __fadd_rn(cost, __fmul_rn(e, e));
                const float fc = __fmul_rn(__fmul_rn(4.0f, ay[i]), a);
                if (fc < flip_cost) flip_cost = fc, flip = i;
                sum_half += h[i];
            }
            const bool violated = ((neg_y - sum_half / 2) & 1) != 0;
            if (violated) cost = __fadd_rn(cost, flip_cost);
            if (cost < best) {
                best = cost;
                u32 code = (u32)(p << 8 | s);
#pragma unroll
                for (int i = 1; i < 8; i++) code |= (u32)((y[i] < 0.f) != (violated && flip == i)) << i;
                best_code = code;
            }
        }
    }
    return best_code;
}

/* C of element i of a packed row (twin: dllm__q4_value); bs: the row's NVFP4 block scales. */
__device__ __forceinline__ float q4_value(int format, const unsigned char *packed, const unsigned char *bs, int i) {
    if (format == Q4_E8P) {
        const unsigned char *p = packed + (i / 8) * 4;
        int e1[8], e2[8];
        e8p_decode4(p[0] | p[1] << 8, e1);
        e8p_decode4(p[2] | p[3] << 8, e2);
        int v = 0;
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j == (i & 7)) v = e8p_int(e1[j], e2[j]);
        return (float)v;
    }
    const u32 c = packed[i / 2] >> (4 * (i & 1)) & 15u;
    const int signed4 = c & 8u ? (int)c - 16 : (int)c;
    if (format == Q4_NVFP4) return __fmul_rn(e2m1_value(c), e4m3_value(bs[i / 16]));
    if (format == Q4_INT4) return (float)(2 * signed4 + 1);
    if (format == Q4_LLOYD) return (float)(c & 8u ? -LLOYD_INT[c & 7u] : LLOYD_INT[c & 7u]);
    return (float)signed4;
}

/* The largest |v| over the block (fmaxf drops NaN, as dllm__amax's). */
__device__ float block_amax(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float m = 0.f;
    for (int w = 0; w < (int)(blockDim.x + 31) / 32; w++) m = fmaxf(m, red[w]);
    return m;
}

/* Element i of the row a GEMM would read before the rotation: the bf16 row of x, add_rmsnorm's output (already in
 * `normed`), or SwiGLU's (silu_mul8's arithmetic, rounded to bf16 as swiglu stores it). */
__device__ __forceinline__ float soloq_source(const soloq_args &a, int row, int i, const float *normed) {
    if (a.producer == 1) return normed[i];
    const bf16_t *x = (const bf16_t *)a.x + (u64)row * a.x_stride;
    if (a.producer == 0) return bf16_to_f32(x[i]);
    const float g = bf16_to_f32(x[i]), u = bf16_to_f32(x[a.d + i]);
    return bf16_to_f32(f32_to_bf16(g / (1.f + __expf(-g)) * u));
}

/* add_rmsnorm's row into `normed` (its arithmetic and reduction order: residual_rms), writing h_out when asked. */
__device__ void soloq_norm_row(const soloq_args &a, int row, bool write_h, float *normed) {
    float v[NORM_SLOTS][8], g[8];
    const float r = residual_rms(a.h_in, write_h ? a.h_out : 0, a.delta, (u64)row, a.d, a.eps, v);
#pragma unroll
    for (int j = 0; j < NORM_SLOTS; j++) {
        const int k = (threadIdx.x + j * blockDim.x) * 8;
        if (k >= a.d) continue;
        load8(a.norm_w + k, g);
        for (int e = 0; e < 8; e++) normed[k + e] = bf16_to_f32(f32_to_bf16((v[j][e] * r) * g[e]));
    }
    __syncthreads();
}

/* [SoloQ clusters] A row may be split over a cluster of C CTAs along x (sm_90+, the host's dllm__soloq_split): CTA r owns
 * the rotated row's slice [r n, (r + 1) n), n = d / C, of whole rotation blocks and whole reduction segments; the
 * mixer reads the other slices, and the reductions combine per-CTA partials, through distributed shared memory. */
struct soloq_slice {
    int C, r, i0, n;  // CTAs a row, this one's rank, its slice
};

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void soloq_sync(const soloq_slice &s) {
    if (s.C == 1) {
        __syncthreads();
        return;
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
/* *p in CTA `rank` of the cluster (p: this CTA's address of the same shared variable). */
__device__ __forceinline__ float soloq_remote(const float *p, int rank) {
    u32 remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"((u32)__cvta_generic_to_shared(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote));
    return v;
}
#else
__device__ __forceinline__ void soloq_sync(const soloq_slice &) { __syncthreads(); }
__device__ __forceinline__ float soloq_remote(const float *p, int) { return *p; }  // C is 1 here
#endif

/* y = R x on this CTA's slice (twin: dllm__rotate): signs and permutation gathered into A, block FWHTs, 1/sqrt(b), the
 * mixer Q_k into B. F is the row buffer (d floats) and A = F + i0 this CTA's slice of it; before mixing, a split row's
 * other slices are copied into F from the other CTAs (one coalesced pass over distributed shared memory, rather than a
 * remote load per multiply-add). B holds the slice (element i at i - i0); `normed`, producer 1's whole source row.
 * Returns where the rotated slice is (A or B). */
__device__ float *soloq_rotate(const soloq_args &a, int row, const soloq_slice &s, float *F, float *B, const float *normed) {
    const int tid = threadIdx.x, nt = blockDim.x, i1 = s.i0 + s.n;
    float *A = F + s.i0;
    for (int i = s.i0 + tid; i < i1; i += nt) {
        float v = soloq_source(a, row, a.perm ? a.perm[i] : i, normed);
        if (a.signs && (a.signs[i >> 3] >> (i & 7) & 1)) v = -v;
        A[i - s.i0] = v;
    }
    __syncthreads();
    const int b = a.rot_b, log_b = __ffs(b) - 1;  // b is a power of two: shifts and masks, no integer division
    if (b > 1) {
        for (int log_h = 0; log_h < log_b; log_h++) {
            const int h = 1 << log_h;
            for (int p = s.i0 / 2 + tid; p < i1 / 2; p += nt) {  // butterfly p: block p >> (log_b - 1), pair q within it
                const int q = p & (b / 2 - 1), c = ((p >> (log_b - 1)) << log_b) + ((q >> log_h) << (log_h + 1)) + (q & (h - 1)) - s.i0;
                const float u = A[c], v = A[c + h];
                A[c] = __fadd_rn(u, v);
                A[c + h] = __fsub_rn(u, v);
            }
            __syncthreads();
        }
        for (int i = tid; i < s.n; i += nt) A[i] = __fmul_rn(A[i], a.rot_norm);
    }
    if (!a.mixer) {
        __syncthreads();
        return A;
    }
    soloq_sync(s);  // every slice transformed before any is mixed
    if (s.C > 1) {
        for (int owner = 0; owner < s.C; owner++) {
            if (owner == s.r) continue;
            float *slice = F + owner * s.n;
            for (int i = tid; i < s.n; i += nt) slice[i] = soloq_remote(&slice[i], owner);
        }
        __syncthreads();
    }
    const int k = a.rot_k;
    for (int o = s.i0 + tid; o < i1; o += nt) {
        const int j = o >> log_b, c = o & (b - 1);
        const float *q = a.mixer + j * k, *col = F + c;
        float acc = 0.f;
        for (int i = 0; i < k; i++) acc = fmaf(q[i], col[i * b], acc);
        B[o - s.i0] = acc;
    }
    soloq_sync(s);  // every CTA has copied every slice, and this one mixed, before A is written again
    return B;
}

/* Twin: dllm__soloq_dot over the whole row of which this CTA holds [i0, i0 + n) (x and y: the slice): its segments' sums (one warp each), then all
 * of them added in order from every CTA's `seg` (a cluster-shared array of at most 32 sums). Every thread of every CTA
 * returns the same bits. Ends with a barrier across the cluster. */
__device__ float soloq_row_dot(const float *x, const float *y, int d, const soloq_slice &s, float *seg) {
    const bool segmented = d > SOLOQ_SEGMENT && d % SOLOQ_SEGMENT == 0;
    const int len = segmented ? SOLOQ_SEGMENT : d, mine = s.n / len;
    for (int j = threadIdx.x >> 5; j < mine; j += blockDim.x >> 5) {  // a segment a warp
        const float p = soloq_dot(x + j * len, y + j * len, len);
        if ((threadIdx.x & 31) == 0) seg[j] = p;
    }
    soloq_sync(s);
    float sum = 0.f;
    for (int j = 0; j < d / len; j++) sum = __fadd_rn(sum, j / mine == s.r ? seg[j % mine] : soloq_remote(&seg[j % mine], j / mine));
    if (!segmented) sum = seg[0];  // one segment: its sum as it is (0 + p is p, -0 aside)
    soloq_sync(s);  // every CTA has read every partial before any is overwritten
    return sum;
}

/* The largest |v| over every CTA of the row (fmaxf drops NaN, as dllm__amax's): block_amax, then the CTAs' maxima. */
__device__ float soloq_row_amax(float v, const soloq_slice &s, float *red, float *shared_max) {
    const float m = block_amax(v, red);
    if (s.C == 1) return m;
    if (threadIdx.x == 0) *shared_max = m;
    soloq_sync(s);
    float all = 0.f;
    for (int r = 0; r < s.C; r++) all = fmaxf(all, r == s.r ? *shared_max : soloq_remote(shared_max, r));
    soloq_sync(s);
    return all;
}

/* Codes and C values of this CTA's slice of a nonzero row (y and val: the slice; twins: dllm__encode_nvfp4 / _rtn / _int4 / _lloyd / _e8p):
 * the work split by pairs of elements, NVFP4 blocks of 16 or E8P groups of 8, codes to `codes` when given, C to val. */
template <bool E8P>
__device__ void soloq_encode(int format, const float *y, const soloq_slice &s, float amax, float sigma, unsigned char *codes, unsigned char *bs,
                             float *val) {
    const int tid = threadIdx.x, nt = blockDim.x, i1 = s.i0 + s.n;
    if (format == Q4_NVFP4) {
        const float s_enc = nvfp4_s_enc(amax);
        for (int b0 = s.i0 + tid * 16; b0 < i1; b0 += nt * 16) {
            const int b1 = min(i1, b0 + 16);
            float m = 0.f;
            for (int i = b0; i < b1; i++) m = fmaxf(m, fabsf(y[i - s.i0]));
            const u32 sb = e4m3x2(__fmul_rn(__fdiv_rn(m, 6.0f), s_enc), 0.f) & 0xffu;
            const float scale = e4m3_value(sb), enc = sb ? __fdiv_rn(s_enc, scale) : 0.f;
            if (bs) bs[b0 / 16] = (unsigned char)sb;
            for (int i = b0; i < b1; i += 2) {
                const u32 c0 = sb ? e2m1_code(__fmul_rn(y[i - s.i0], enc)) : 0u, c1 = sb ? e2m1_code(__fmul_rn(y[i + 1 - s.i0], enc)) : 0u;
                if (codes) codes[i / 2] = (unsigned char)(c0 | c1 << 4);
                val[i - s.i0] = __fmul_rn(e2m1_value(c0), scale);
                val[i + 1 - s.i0] = __fmul_rn(e2m1_value(c1), scale);
            }
        }
        return;
    }
    if (E8P && format == Q4_E8P) {
        for (int g = s.i0 + tid * 8; g < i1; g += nt * 8) {
            float v1[8], v2[8];
            int e1[8], e2[8];
#pragma unroll
            for (int i = 0; i < 8; i++) v1[i] = __fmul_rn(__fdiv_rn(y[g + i - s.i0], sigma), E8P_SCALE);
            const u32 c1 = e8p_encode(v1);
            e8p_decode4(c1, e1);
#pragma unroll
            for (int i = 0; i < 8; i++) v2[i] = __fmul_rn(__fsub_rn(v1[i], __fmul_rn(0.25f, (float)e1[i])), E8P_RESID);
            const u32 c2 = e8p_encode(v2);
            e8p_decode4(c2, e2);
            if (codes) *(u32 *)(codes + g / 2) = c1 | c2 << 16;
#pragma unroll
            for (int i = 0; i < 8; i++) val[g + i - s.i0] = (float)e8p_int(e1[i], e2[i]);
        }
        return;
    }
    const float step = __fmul_rn(sigma, INT4_STEP), rtn_scale = __fdiv_rn(amax, 7.0f);
    for (int i = s.i0 + tid * 2; i < i1; i += nt * 2) {
        u32 c[2];
        for (int e = 0; e < 2; e++) {
            const float x = y[i + e - s.i0];
            if (format == Q4_RTN) {
                const float q = fminf(fmaxf(rintf(__fdiv_rn(x, rtn_scale)), -7.f), 7.f);
                c[e] = (u32)(int)q & 15u;
                val[i + e - s.i0] = q;
            } else if (format == Q4_INT4) {
                const float q = fminf(fmaxf(floorf(__fdiv_rn(x, step)), -8.f), 7.f);
                c[e] = (u32)(int)q & 15u;
                val[i + e - s.i0] = __fadd_rn(__fmul_rn(2.f, q), 1.f);
            } else {
                const float z = __fdiv_rn(x, sigma), az = fabsf(z);
                int level = 0;
                while (level < 7 && az >= LLOYD_T[level]) level++;
                c[e] = (z < 0.f ? 8u : 0u) | (u32)level;
                val[i + e - s.i0] = (float)(z < 0.f ? -LLOYD_INT[level] : LLOYD_INT[level]);
            }
        }
        if (codes) codes[i / 2] = (unsigned char)(c[0] | c[1] << 4);
    }
}

/* The format's own row scale from the row's amax and RMS (the return values of the twins' encoders). */
__device__ __forceinline__ float soloq_own_scale(int format, float amax, float sigma) {
    if (format == Q4_NVFP4) return __fdiv_rn(1.0f, nvfp4_s_enc(amax));
    if (format == Q4_RTN) return __fdiv_rn(amax, 7.0f);
    if (format == Q4_INT4) return __fdiv_rn(__fmul_rn(sigma, INT4_STEP), 2.0f);
    if (format == Q4_LLOYD) return __fdiv_rn(sigma, LLOYD_KAPPA);
    return __fdiv_rn(sigma, E8P_ENC_SCALE);
}

/* One row (this CTA's slice of it): its source rotated by R and, with a.quantize, quantised in a.format (twin:
 * dllm__rotate, then dllm__q4_quantize_row): packed codes and NVFP4 block scales (a.codes, a.block_scales: weights), the
 * row scale, and the C values as bf16 (a.values: a GEMM's input; exact, every C is a BF16 number). Without a.quantize the
 * rotated row itself goes to a.values in bf16 (the -w4a16 precisions) and the scale is 1. A and B: two fp32 rows of
 * shared memory. */
template <bool E8P>
__device__ void soloq_row(const soloq_args &a, int row, const soloq_slice &s, float *F, float *B, const float *normed) {
    __shared__ float red[32], seg[32], shared_max;
    const int d = a.d, tid = threadIdx.x, nt = blockDim.x, i1 = s.i0 + s.n;
    float *y = soloq_rotate(a, row, s, F, B, normed), *A = F + s.i0, *val = y == A ? B : A;
    bf16_t *values = a.values ? a.values + (u64)row * d : 0;
    if (!a.quantize) {
        for (int i = s.i0 + tid; i < i1; i += nt) values[i] = f32_to_bf16(y[i - s.i0]);
        if (a.row_scale && tid == 0 && s.r == 0) a.row_scale[row] = 1.f;
        return;
    }
    float m = 0.f;
    for (int i = tid; i < s.n; i += nt) m = fmaxf(m, fabsf(y[i]));
    const float amax = soloq_row_amax(m, s, red, &shared_max);
    const float ss = soloq_row_dot(y, y, d, s, seg), sigma = __fsqrt_rn(__fdiv_rn(ss, (float)d));
    unsigned char *codes = a.codes ? a.codes + (u64)row * (d / 2) : 0;
    unsigned char *bs = a.block_scales ? a.block_scales + (u64)row * ((d + 15) / 16) : 0;
    float scale = 0.f;
    if (ss == 0.f) {  // codes 0 (some decode to a nonzero C, INT4's 1) and scale 0
        if (codes)
            for (int i = s.i0 / 2 + tid; i < i1 / 2; i += nt) codes[i] = 0;
        if (bs)
            for (int i = s.i0 / 16 + tid; i < (i1 + 15) / 16; i += nt) bs[i] = 0;
        const unsigned char zeros[4] = {0, 0, 0, 0};
        for (int i = s.i0 + tid; i < i1; i += nt) val[i - s.i0] = q4_value(a.format, zeros, zeros, i & 7);
    } else {
        soloq_encode<E8P>(a.format, y, s, amax, sigma, codes, bs, val);
        scale = soloq_own_scale(a.format, amax, sigma);
    }
    __syncthreads();
    if (!(ss <= 3.402823466e38f)) {
        scale = __int_as_float(0x7fc00000);
    } else if (a.bias_correction && ss > 0.f) {  // [bias correction] ||x||^2 / <C, x>
        const float proj = soloq_row_dot(val, y, d, s, seg);
        if (proj > 0.f) scale = __fdiv_rn(ss, proj);
    }
    if (tid == 0 && s.r == 0 && a.row_scale) a.row_scale[row] = scale;
    if (values)
        for (int i = s.i0 + tid; i < i1; i += nt) values[i] = f32_to_bf16(val[i - s.i0]);
    if (a.values_i8)  // [INT8 GEMM] the same integers, for gemm_q4's INT8 path
        for (int i = s.i0 + tid; i < i1; i += nt) a.values_i8[(u64)row * d + i] = (signed char)(int)val[i - s.i0];
}

/* A row's CTAs: gridDim.x = rows x C along x, clusters of C (a.cluster). */
__device__ __forceinline__ soloq_slice soloq_slice_of(const soloq_args &a) {
    soloq_slice s;
    s.C = a.cluster, s.r = blockIdx.x % a.cluster, s.n = a.d / a.cluster, s.i0 = s.r * s.n;
    return s;
}

/* Rows of x (producer 0): the weights at load (every format) and a GEMM's bf16 input. */
KERNEL_soloq_quantize_rows {
    pdl_enter();
    extern __shared__ float soloq_smem[];
    const soloq_slice s = soloq_slice_of(a);
    soloq_row<true>(a, blockIdx.x / a.cluster, s, soloq_smem, soloq_smem + a.d, 0);
}

/* [fused producers] A GEMM's input made and quantised in one pass (producer 1: add_rmsnorm, blockDim its norm threads;
 * 2: SwiGLU): the activation formats only (no E8P). */
KERNEL_soloq_produce_rows {
    pdl_enter();
    extern __shared__ float soloq_smem[];
    const soloq_slice s = soloq_slice_of(a);
    float *B = soloq_smem + a.d, *normed = B + s.n;  // the row buffer, a slice; producer 1: every CTA normalises the whole row
    if (a.producer == 1) soloq_norm_row(a, blockIdx.x / a.cluster, s.r == 0, normed);
    soloq_row<false>(a, blockIdx.x / a.cluster, s, soloq_smem, B, normed);
}

/* The C values of elements g .. g + 7 of a stored row (twin: dllm__q4_value). */
__device__ __forceinline__ void soloq_values8(int format, const unsigned char *packed, const unsigned char *bs, int g, float f[8]) {
    if (format == Q4_E8P) {
        int e1[8], e2[8];
        const unsigned char *p = packed + g / 2;
        e8p_decode4(p[0] | p[1] << 8, e1);
        e8p_decode4(p[2] | p[3] << 8, e2);
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = (float)e8p_int(e1[i], e2[i]);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = q4_value(format, packed, bs, g + i);
    }
}

/* Stored weight rows into their C values, bf16 [rows][cols] (twin: dllm__q4_value); 8 elements (4 code bytes) a thread. */
KERNEL_soloq_dequantize_rows {
    pdl_enter();
    const int row = blockIdx.y, g = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (row >= rows || g >= cols) return;
    const unsigned char *packed = codes + (u64)row * (cols / 2), *bs = block_scales ? block_scales + (u64)row * ((cols + 15) / 16) : 0;
    float f[8];
    soloq_values8(format, packed, bs, g, f);
    *(uint4 *)(out + (u64)row * cols + g) = make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
}

/* [INT8 GEMM] Stored weight rows of an integer format (INT4, Lloyd-Max, E8P-RVQ4, RTN: every C in [-127, 127]) into
 * their C values as int8 [rows][cols], the INT8 GEMM's weight operand; 8 elements a thread, one 8-byte store. */
KERNEL_soloq_unpack_rows_i8 {
    pdl_enter();
    const int row = blockIdx.y, g = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (row >= rows || g >= cols) return;
    float f[8];
    soloq_values8(format, codes + (u64)row * (cols / 2), 0, g, f);
    u32 w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; i++) w[i / 4] |= ((u32)(int)f[i] & 0xffu) << (8 * (i % 4));
    *(uint2 *)(out + (u64)row * cols + g) = make_uint2(w[0], w[1]);
}

/* The GEMM epilogue of two quantised operands (twin: dllm__soloq_scale_rows): y[i][j] = (acc[i][j] s_x[i]) s_w[j],
 * s_x null for unquantised activations; y bf16 or fp32 with row stride ldy. */
template <class Acc>
__device__ __forceinline__ void soloq_scale_body(const Acc *acc, int n, const float *s_x, const float *s_w, void *y, int y_f32, u64 ldy) {
    const int i = blockIdx.y;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
        float v = (float)acc[(u64)i * n + j];  // int32: cvt.rn, as the twin's (float) cast
        if (s_x) v = __fmul_rn(v, s_x[i]);
        v = __fmul_rn(v, s_w[j]);
        if (y_f32) ((float *)y)[(u64)i * ldy + j] = v;
        else ((bf16_t *)y)[(u64)i * ldy + j] = f32_to_bf16(v);
    }
}

KERNEL_soloq_scale_rows {
    pdl_enter();
    soloq_scale_body(acc, n, s_x, s_w, y, y_f32, ldy);
}

/* [INT8 GEMM] The same epilogue on the INT8 GEMM's exact int32 sums (twin: dllm__cpu_i8_gemm's last step). */
KERNEL_soloq_scale_rows_i32 {
    pdl_enter();
    soloq_scale_body(acc, n, s_x, s_w, y, y_f32, ldy);
}
)DLLM";

/* [KV quant] commit-time K/V quantisation of block diffusion (section 9c) on the device: the commit's quantisers, bit for
 * bit with 9c on the same inputs (every float operation an explicit _rn intrinsic, fmaf, or one of 9b's SoloQ device
 * functions, which this module compiles beside its own), and the block step's attention reading the quantised
 * committed rows directly (decoded in registers; no decoded copy in device memory). One kvq_args serves all three. */
#define DLLM__KVQ_ARGS_FIELDS(X)                                                                                      \
    X(const bf16_t *, cache) /* the layer's bf16 K|V rows [cap][2 kvd]: sinks, forwarded rows (and the commit's) */   \
    X(unsigned char *, k_codes) X(unsigned char *, v_codes) /* the layer's [cap][kvd bits / 8] (9c's packing) */       \
    X(unsigned short *, k_pairs) /* [cap / group][kvd][2] FP16 (scale, min) */                                         \
    X(unsigned short *, v_pairs) /* KIVI: [cap][n_kv][2] */                                                            \
    X(float *, v_scale)          /* SoloQ: [cap][n_kv] */                                                              \
    X(const int *, perm) X(const unsigned char *, signs) X(const float *, mixer) /* SoloQ: the layer's R (9b) */      \
    X(int, rot_b) X(int, rot_k) X(float, rot_norm)                                                                     \
    X(int, n_kv) X(int, hd) X(int, bits) X(int, soloq) X(int, n_sink) X(int, group)                                    \
    X(int, row0) X(int, rows)    /* commits: rows [row0, row0 + rows) */                                               \
    X(const bf16_t *, q) X(bf16_t *, o) X(int, q_stride) X(int, o_stride) X(int, n_head) /* attention */              \
    X(int, n_keys) X(int, n_committed) X(int, mask_block) X(int, q_index0) X(float, scale)                         \
    X(int, q_rows) X(int, split_keys) X(float *, partial) /* kvq_flash: query rows, keys a split, split states */

#define DLLM__KVQ_KERNELS(X)                                                   \
    X(kvq_commit_keys, , (kvq_args a))                                         \
    X(kvq_commit_values, __launch_bounds__(32), (kvq_args a))                  \
    X(kvq_attention, __launch_bounds__(32), (kvq_args a))

struct kvq_args { DLLM__KVQ_ARGS_FIELDS(DLLM__FIELD) };
DLLM__KVQ_KERNELS(DLLM__KERNEL_SIGNATURE)

/* The warp-per-query online softmax of block diffusion's attention kernels without tensor cores (kvq_attention over
 * the quantised cache, bdfa_part for FACache): keys in chunks of 32, a lane's score each. One step per chunk: the
 * running max m and sum l take the chunk (s: the lane's score, valid: a key there), corr is the factor the accumulators
 * take, the result the lane's weight exp(s - m) (0 past the keys). Twin: dllm__cpu_softmax_part (in double). */
static const char *dllm__src_warp_softmax = DLLM__SOURCE_LINE R"DLLM(
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
)DLLM";

static const char *dllm__src_kvq = DLLM__SOURCE_LINE R"DLLM(
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
    if (e == 0) return m ? (sign ? -__fmul_rn((float)m, 0x1p-24f) : __fmul_rn((float)m, 0x1p-24f)) : __uint_as_float(sign);
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ u32 kvq_get(const unsigned char *row, int e, int bits) { return (u32)(row[e * bits / 8] >> (e * bits % 8)) & ((1u << bits) - 1u); }

/* Twin: dllm__kivi_decode. */
__device__ __forceinline__ float kivi_decode(u32 q, const unsigned short *pair) { return fmaf((float)q, kvq_f16_value(pair[0]), kvq_f16_value(pair[1])); }

/* Twin: dllm__kivi_quantize's pair for the group's range (mn, mx are its min and max as the twin folds them). */
__device__ void kivi_pair(float mn, float mx, bool finite, int bits, unsigned short *pair, float &scale, float &minr) {
    const float top = (float)((1 << bits) - 1);
    pair[0] = finite ? kvq_f16(__fdiv_rn(__fsub_rn(mx, mn), top)) : (unsigned short)0x7e00u;
    pair[1] = finite ? kvq_f16(mn) : (unsigned short)0x7e00u;
    scale = kvq_f16_value(pair[0]), minr = kvq_f16_value(pair[1]);
    if (!(scale > 0.f) && finite) pair[0] = 0;
}
__device__ __forceinline__ u32 kivi_code(float x, float scale, float minr, int bits) {
    return scale > 0.f ? (u32)fminf(fmaxf(rintf(__fdiv_rn(__fsub_rn(x, minr), scale)), 0.f), (float)((1 << bits) - 1)) : 0u;
}

/* Twin: dllm__kvq_soloq_c. */
__device__ __forceinline__ float kvq_soloq_c(u32 code, int bits) {
    if (bits == 4) return (float)(code & 8u ? -LLOYD_INT[code & 7u] : LLOYD_INT[code & 7u]);
    return code & 2u ? -LLOYD2_LEVELS[code & 1u] : LLOYD2_LEVELS[code & 1u];
}

/* Keys of a commit (twin: dllm__kvq_commit_keys): a thread per (key group, byte of a row), i.e. the 8 / bits channels of
 * that byte: their pairs from the group's rows at or past n_sink, then the byte of each of those rows. */
KERNEL_kvq_commit_keys {
    pdl_enter();
    const int kvd = a.n_kv * a.hd, row_bytes = kvd * a.bits / 8, per = 8 / a.bits;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x, byte = idx % row_bytes, gi = idx / row_bytes;
    if (gi * a.group >= a.rows) return;
    const int g0 = a.row0 + gi * a.group, first = max(g0, a.n_sink), n = max(0, g0 + a.group - first);
    float scale[4], minr[4];
    for (int c = 0; c < per; c++) {
        const int e = byte * per + c;
        const bf16_t *x = a.cache + (u64)first * 2 * kvd + e;
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
        const bf16_t *x = a.cache + (u64)(first + i) * 2 * kvd + byte * per;
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
            const bf16_t *x = a.cache + (u64)r * 2 * kvd + kvd + h * hd;
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
                for (int c = 0; c < 8 / a.bits; c++) b |= kivi_code(bf16_to_f32(x[i + c]), scale, minr, a.bits) << (c * a.bits);
                codes[i * a.bits / 8] = (unsigned char)b;
            }
        }
        return;
    }
    soloq_args s = {};
    s.x = a.cache + kvd + h * hd, s.x_stride = (u64)2 * kvd;
    s.perm = a.perm, s.signs = a.signs, s.mixer = a.mixer, s.rot_b = a.rot_b, s.rot_k = a.rot_k, s.rot_norm = a.rot_norm;
    s.d = hd, s.rows = 1, s.cluster = 1;
    soloq_slice sl;
    sl.C = 1, sl.r = 0, sl.i0 = 0, sl.n = hd;
    float *y = soloq_rotate(s, r, sl, A, B, 0), *v = val;
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
        if (!a.mixer) { T0[o] = racc[o]; continue; }
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

/* Key element e (of kv head kvh) of row j: bf16 (a sink, or a row past the committed ones) or decoded from its codes. */
__device__ __forceinline__ bool kvq_quantised(const kvq_args &a, int j) { return j >= a.n_sink && j < a.n_committed; }

/* The block step's attention over the quantised cache (twin: dllm__cpu_attention over 9c's decoded cache):
 * one warp per (query row, head); keys in chunks of 32, a lane's score each, the online softmax in fp32, values
 * accumulated a lane per channel. SoloQ's quantised values are accumulated apart in their rotated basis and rotated
 * back once (kvq_rotate_back). */
KERNEL_kvq_attention {
    pdl_enter();
    __shared__ float q[256], acc[256], racc[256], T0[256], T1[256];
    const int i = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, hd = a.hd, kvd = a.n_kv * hd, kvh = h / (a.n_head / a.n_kv);
    const int row_bytes = kvd * a.bits / 8;
    for (int c = lane; c < hd; c += 32) q[c] = bf16_to_f32(a.q[(u64)i * a.q_stride + h * hd + c]), acc[c] = 0.f, racc[c] = 0.f;
    __syncwarp();
    const int n_visible = a.mask_block ? min(a.n_keys, ((a.q_index0 + i) / a.mask_block + 1) * a.mask_block) : a.n_keys;
    float m = -DLLM_INF, l = 0.f;
    for (int j0 = 0; j0 < n_visible; j0 += 32) {
        const int j = j0 + lane;
        float s = -DLLM_INF;
        if (j < n_visible) {
            const bf16_t *k = a.cache + (u64)j * 2 * kvd + kvh * hd;
            const unsigned char *codes = a.k_codes + (u64)j * row_bytes;
            const unsigned short *pairs = a.k_pairs + ((u64)(j / max(a.group, 1)) * kvd + kvh * hd) * 2;
            float dot = 0.f;
            if (kvq_quantised(a, j))
                for (int c = 0; c < hd; c++) dot = fmaf(q[c], kivi_decode(kvq_get(codes, kvh * hd + c, a.bits), pairs + 2 * c), dot);
            else
                for (int c = 0; c < hd; c++) dot = fmaf(q[c], bf16_to_f32(k[c]), dot);
            s = dot * a.scale;
        }
        float corr;
        const float p = warp_softmax_chunk(s, j < n_visible, m, l, corr);
        for (int c = lane; c < hd; c += 32) acc[c] *= corr, racc[c] *= corr;
        for (int jj = 0; jj < 32 && j0 + jj < n_visible; jj++) {
            const int key = j0 + jj;
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            if (!kvq_quantised(a, key)) {
                const bf16_t *v = a.cache + (u64)key * 2 * kvd + kvd + kvh * hd;
                for (int c = lane; c < hd; c += 32) acc[c] = fmaf(pj, bf16_to_f32(v[c]), acc[c]);
                continue;
            }
            const unsigned char *codes = a.v_codes + (u64)key * row_bytes;
            if (a.soloq) {
                const float sc = __fmul_rn(pj, a.v_scale[(u64)key * a.n_kv + kvh]);
                for (int c = lane; c < hd; c += 32) racc[c] = fmaf(sc, kvq_soloq_c(kvq_get(codes, kvh * hd + c, a.bits), a.bits), racc[c]);
            } else {
                const unsigned short *pair = a.v_pairs + ((u64)key * a.n_kv + kvh) * 2;
                for (int c = lane; c < hd; c += 32) acc[c] = fmaf(pj, kivi_decode(kvq_get(codes, kvh * hd + c, a.bits), pair), acc[c]);
            }
        }
    }
    __syncwarp();
    if (a.soloq) kvq_rotate_back(a, racc, T0, T1, lane);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int c = lane; c < hd; c += 32) a.o[(u64)i * a.o_stride + h * hd + c] = f32_to_bf16((acc[c] + (a.soloq ? T1[c] : 0.f)) * inv);
}
)DLLM";

/* [KV quant] The block step's attention over the quantised cache on tensor cores (DLLM_KVQ_TC=1, unverified on a device;
 * twin: dllm__kvq_flash_twin in 9c). kvq_attention decodes every key's codes once per query head (7 times per kv head at
 * the 7B shape) with scalar FMAs; here the codes are read and decoded once per kv head:
 *   kvq_flash: flash-decoding split over the keys, one CTA per (key split, kv head, tile of query rows). A CTA holds
 *     every query row of its kv head's GQA group (n_head / n_kv heads x q_rows rows, row r = head (r / q_rows), query
 *     r % q_rows), 16 a warp, as many warps as fit (KVQ_TC_THREADS; the host's plan tiles larger groups over
 *     blockIdx.z). Per tile of KVQ_TC_BC keys the CTA decodes K and V into shared memory as bf16 (KIVI keys
 *     fmaf(code, scale, min) from the pair of the key's group and channel; KIVI values from the (row, kv head) pair;
 *     SoloQ values C * scale, the row scale folded into the decoded value, in the rotated basis), then each warp runs
 *     flash_attn's step on it per 32-key chunk: S = Q K^T and O += P V by mma.sync (P rounded to bf16 as the mma
 *     takes it), the online softmax in fp32 (online_softmax). The raw codes and pairs of tile t + 1 are copied
 *     (cp.async) while tile t is decoded and multiplied: two stages of KVQ_TC_STAGE bytes.
 *   Splits (kvq_split) never mix kinds: the bf16 sinks [0, min(n_sink, n_committed)), the quantised rows up to
 *     n_committed, and the bf16 rows past it (the forward's own, or the block cache), each cut at multiples of
 *     split_keys. bf16 splits copy their rows as they are. Each split leaves per (query row, head) the unnormalised
 *     output, the running max (log2 domain) and the normaliser in `partial` [split][n_head][q_rows][hd + 2].
 *   kvq_flash_combine: one warp per (query row, head) merges the splits in split order, the quantised ones of SoloQ
 *     apart and rotated back once (kvq_rotate_back) before they join the bf16 ones.
 * The block-causal mask: row i sees the keys below kvq_visible(i); a CTA visits no tile past its rows' last visible key. */
#define DLLM__KVQ_TC_KERNELS(X)                                                \
    X(kvq_flash, __launch_bounds__(KVQ_TC_THREADS), (kvq_args a))              \
    X(kvq_flash_combine, __launch_bounds__(32), (kvq_args a))
DLLM__KVQ_TC_KERNELS(DLLM__KERNEL_SIGNATURE)

static const char *dllm__src_kvq_tc = DLLM__SOURCE_LINE R"DLLM(
/* f16 -> f32 on the conversion unit: exact for every half, as kvq_f16_value. */
__device__ __forceinline__ float kvq_h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ void kvq_cp_async4(u32 smem, const void *gmem, bool pred) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem), "r"(pred ? 4 : 0));
}

/* Row i's keys [0, kvq_visible(a, i)) under the block-causal mask (kvq_attention's n_visible). */
__device__ __forceinline__ int kvq_visible(const kvq_args &a, int i) {
    return a.mask_block ? min(a.n_keys, ((a.q_index0 + i) / a.mask_block + 1) * a.mask_block) : a.n_keys;
}

/* The key ranges of one kind: 0 the bf16 sinks, 1 the quantised rows, 2 the bf16 rows past the committed ones. */
__device__ __forceinline__ void kvq_range(const kvq_args &a, int r, int &lo, int &hi) {
    const int qb = a.n_committed, qa = min(a.n_sink, qb);
    lo = r == 0 ? 0 : r == 1 ? qa : qb;
    hi = r == 0 ? qa : r == 1 ? qb : a.n_keys;
}
__device__ __forceinline__ int kvq_range_splits(int lo, int hi, int S) { return hi > lo ? (hi - 1) / S - lo / S + 1 : 0; }

/* Split s: keys [j0, j1) of one range, cut at multiples of split_keys (twin: dllm__kvq_tc_split). */
__device__ void kvq_split(const kvq_args &a, int s, int &j0, int &j1, bool &quant) {
    const int S = a.split_keys;
    for (int r = 0; r < 3; r++) {
        int lo, hi;
        kvq_range(a, r, lo, hi);
        const int n = kvq_range_splits(lo, hi, S);
        if (s < n) {
            j0 = max(lo, (lo / S + s) * S), j1 = min(hi, (lo / S + s + 1) * S), quant = r == 1;
            return;
        }
        s -= n;
    }
    j0 = j1 = 0, quant = false;
}
__device__ int kvq_n_splits(const kvq_args &a) {
    int n = 0;
    for (int r = 0; r < 3; r++) {
        int lo, hi;
        kvq_range(a, r, lo, hi);
        n += kvq_range_splits(lo, hi, a.split_keys);
    }
    return n;
}

/* A stage: the raw K and V codes of a tile's keys [KVQ_TC_BC][KVQ_HD / 2] each (2-bit rows use the first half), the K
 * pairs of up to KVQ_TC_PG key groups from group ga = lo / group on [KVQ_TC_PG][KVQ_HD][2], the V side (KIVI pair or SoloQ scale)
 * [KVQ_TC_BC]. Keys outside [lo, hi) are zero-filled. */
#define KVQ_STAGE_VC (KVQ_TC_BC * KVQ_HD / 2)
#define KVQ_STAGE_KP (KVQ_TC_BC * KVQ_HD)
#define KVQ_STAGE_VS (KVQ_TC_BC * KVQ_HD + KVQ_TC_PG * KVQ_HD * 4)
__device__ __forceinline__ int kvq_tc_groups(const kvq_args &a, int lo, int hi);
__device__ void kvq_tc_stage(const kvq_args &a, unsigned char *st, int kvh, int k0, int lo, int hi) {
    const int ga = lo / a.group;
    const int tid = threadIdx.x, nt = blockDim.x, kvd = a.n_kv * KVQ_HD, row_bytes = kvd * a.bits / 8, cb = KVQ_HD * a.bits / 8;
    const u64 off = (u64)kvh * cb;
    if (cb % 16 == 0) {
        const int per = cb / 16;
        for (int u = tid; u < 2 * KVQ_TC_BC * per; u += nt) {
            const bool v = u >= KVQ_TC_BC * per;
            const int w = v ? u - KVQ_TC_BC * per : u, key = w / per, c = w % per, j = k0 + key;
            const bool ok = j >= lo && j < hi;
            const unsigned char *src = v ? a.v_codes : a.k_codes;
            cp_async16(smem_u32(st + (v ? KVQ_STAGE_VC : 0) + key * (KVQ_HD / 2) + c * 16), src + (ok ? (u64)j * row_bytes + off + c * 16 : 0), ok);
        }
    } else {  // a kv head's codes are whole 4-byte words (KVQ_HD % 16 == 0)
        const int per = cb / 4;
        for (int u = tid; u < 2 * KVQ_TC_BC * per; u += nt) {
            const bool v = u >= KVQ_TC_BC * per;
            const int w = v ? u - KVQ_TC_BC * per : u, key = w / per, c = w % per, j = k0 + key;
            const bool ok = j >= lo && j < hi;
            const unsigned char *src = v ? a.v_codes : a.k_codes;
            kvq_cp_async4(smem_u32(st + (v ? KVQ_STAGE_VC : 0) + key * (KVQ_HD / 2) + c * 4), src + (ok ? (u64)j * row_bytes + off + c * 4 : 0), ok);
        }
    }
    const int ng = kvq_tc_groups(a, lo, hi);
    for (int u = tid; u < ng * KVQ_HD / 4; u += nt) {
        const int gi = u / (KVQ_HD / 4), c = u % (KVQ_HD / 4);
        cp_async16(smem_u32(st + KVQ_STAGE_KP + gi * KVQ_HD * 4 + c * 16), a.k_pairs + ((u64)(ga + gi) * kvd + kvh * KVQ_HD) * 2 + c * 8, true);
    }
    for (int u = tid; u < KVQ_TC_BC; u += nt) {
        const int j = k0 + u;
        const bool ok = j >= lo && j < hi;
        const u64 at = ok ? (u64)j * a.n_kv + kvh : 0;
        const void *src = a.soloq ? (const void *)(a.v_scale + at) : (const void *)(a.v_pairs + 2 * at);
        kvq_cp_async4(smem_u32(st + KVQ_STAGE_VS + u * 4), src, ok);
    }
}

/* A stage's FP16 pairs as fp32, once per tile rather than once per decoded element (the conversion unit is a sixteenth
 * of the FMA pipes' rate): the K pairs of its ng key groups into kpf [KVQ_TC_PG][KVQ_HD], KIVI's V pairs into vpf
 * [KVQ_TC_BC] (exact: every half is an fp32). */
__device__ void kvq_tc_convert(const kvq_args &a, const unsigned char *st, float2 *kpf, float2 *vpf, int ng) {
    const unsigned short *kp = (const unsigned short *)(st + KVQ_STAGE_KP), *vp = (const unsigned short *)(st + KVQ_STAGE_VS);
    for (int u = threadIdx.x; u < ng * KVQ_HD; u += blockDim.x) kpf[u] = make_float2(kvq_h2f(kp[2 * u]), kvq_h2f(kp[2 * u + 1]));
    if (!a.soloq)
        for (int u = threadIdx.x; u < KVQ_TC_BC; u += blockDim.x) vpf[u] = make_float2(kvq_h2f(vp[2 * u]), kvq_h2f(vp[2 * u + 1]));
}

/* The stage's key groups: from ga = lo / group, at most KVQ_TC_PG of them. */
__device__ __forceinline__ int kvq_tc_groups(const kvq_args &a, int lo, int hi) { return min(KVQ_TC_PG, (hi - 1) / a.group - lo / a.group + 1); }

/* Code e of an 8-code word as an fp32, exactly, without the conversion unit: 2^23 + code's bits minus 2^23. */
__device__ __forceinline__ float kvq_code_f32(u32 word, int e, int bits, u32 mask) { return __uint_as_float(0x4B000000u | (word >> (e * bits) & mask)) - 8388608.f; }

/* A stage decoded into the bf16 K and V tiles [KVQ_TC_BC][KVQ_HD + 8] (twin: dllm__kvq_flash_twin's keys and values): a
 * thread per 8 channels of a key; the pairs from kvq_tc_convert (a key group past the staged ones: from global memory),
 * SoloQ's levels from `lut` (kvq_soloq_c of each code). Keys outside [lo, hi) become zeros (their scores are masked;
 * P = 0 times a zero value adds nothing, where a NaN would). */
__device__ void kvq_tc_decode(const kvq_args &a, const unsigned char *st, const float2 *kpf, const float2 *vpf, const float *lut, bf16_t *sK,
                              bf16_t *sV, int kvh, int k0, int lo, int hi) {
    constexpr int CPR = KVQ_HD / 8, LD = KVQ_HD + 8;
    const int kvd = a.n_kv * KVQ_HD, bits = a.bits, ga = lo / max(a.group, 1);
    const u32 mask = (1u << bits) - 1u;
    for (int u = threadIdx.x; u < 2 * KVQ_TC_BC * CPR; u += blockDim.x) {
        const bool v = u >= KVQ_TC_BC * CPR;
        const int w = v ? u - KVQ_TC_BC * CPR : u, key = w / CPR, c8 = w % CPR, j = k0 + key;
        u32 packed[4] = {0u, 0u, 0u, 0u};
        if (j >= lo && j < hi) {
            const unsigned char *codes = st + (v ? KVQ_STAGE_VC : 0) + key * (KVQ_HD / 2);
            const u32 word = bits == 4 ? *(const u32 *)(codes + c8 * 4) : (u32)*(const unsigned short *)(codes + c8 * 2);
            const int gi = j / max(a.group, 1) - ga;
            const float2 *kp = kpf + gi * KVQ_HD + c8 * 8;
            const unsigned short *kg = a.k_pairs + ((u64)(j / max(a.group, 1)) * kvd + kvh * KVQ_HD + c8 * 8) * 2;
            const float sc = *(const float *)(st + KVQ_STAGE_VS + key * 4);
            const float2 vp = vpf[key];
            // Two channels at a time, packed as they are made: eight fp32 values and their pairs live at once would
            // not fit beside the 64 output registers at head dim 128.
            #pragma unroll
            for (int e = 0; e < 8; e += 2) {
                float x[2];
                #pragma unroll
                for (int f = 0; f < 2; f++) {
                    const float c = kvq_code_f32(word, e + f, bits, mask);
                    if (!v) {
                        const float2 pr = gi < KVQ_TC_PG ? kp[e + f] : make_float2(kvq_h2f(kg[2 * (e + f)]), kvq_h2f(kg[2 * (e + f) + 1]));
                        x[f] = fmaf(c, pr.x, pr.y);
                    } else {
                        x[f] = a.soloq ? __fmul_rn(lut[word >> ((e + f) * bits) & mask], sc) : fmaf(c, vp.x, vp.y);
                    }
                }
                packed[e / 2] = pack_bf16x2(x[0], x[1]);
            }
        }
        *(uint4 *)((v ? sV : sK) + key * LD + c8 * 8) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
}

/* The bf16 rows [lo, hi) of a tile (sinks, or rows past the committed ones) copied into the K and V tiles as they are. */
__device__ void kvq_tc_load_bf16(const kvq_args &a, bf16_t *sK, bf16_t *sV, int kvh, int k0, int lo, int hi) {
    constexpr int CPR = KVQ_HD / 8, LD = KVQ_HD + 8;
    const int kvd = a.n_kv * KVQ_HD;
    for (int u = threadIdx.x; u < 2 * KVQ_TC_BC * CPR; u += blockDim.x) {
        const bool v = u >= KVQ_TC_BC * CPR;
        const int w = v ? u - KVQ_TC_BC * CPR : u, key = w / CPR, c = w % CPR, j = k0 + key;
        const bool ok = j >= lo && j < hi;
        cp_async16(smem_u32((v ? sV : sK) + key * LD + c * 8), a.cache + (ok ? (u64)j * 2 * kvd + (v ? kvd : 0) + kvh * KVQ_HD + c * 8 : 0), ok);
    }
}

/* The CTA's query rows [r0, r0 + rows) of kv head kvh's group into sQ (rows past R zero-filled). */
__device__ void kvq_tc_load_q(const kvq_args &a, bf16_t *sQ, int kvh, int r0, int rows, int R) {
    constexpr int CPR = KVQ_HD / 8, LD = KVQ_HD + 8;
    const int group = a.n_head / a.n_kv;
    for (int u = threadIdx.x; u < rows * CPR; u += blockDim.x) {
        const int r = u / CPR, c = u % CPR, row = r0 + r;
        const bool ok = row < R;
        const int h = kvh * group + row / a.q_rows, i = row % a.q_rows;
        cp_async16(smem_u32(sQ + r * LD + c * 8), a.q + (ok ? (u64)i * a.q_stride + h * KVQ_HD + c * 8 : 0), ok);
    }
}

/* One warp, one 32-key chunk at key kc of the K and V tiles: flash_tile's step for one m16 tile of query rows (rows
 * g and g + 8 see keys [j0, lim0) and [j0, lim1)). */
__device__ __forceinline__ void kvq_tc_chunk(u32 q_warp, u32 k_s, u32 v_s, int kc, int j0, int lim0, int lim1, int lane, float scale_log2,
                                             float (&o)[KVQ_HD / 8][4], float (&m)[2], float (&l)[2]) {
    constexpr int LD = KVQ_HD + 8, NT = 4, KS = KVQ_HD / 16, DT = KVQ_HD / 8;
    float s[NT][4];
    #pragma unroll
    for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    #pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        u32 qf[4];
        ldmatrix_x4(qf, q_warp + kk * 32);
        #pragma unroll
        for (int j = 0; j < NT; j += 2) {
            u32 kb[4];
            ldmatrix_x4(kb, k_s + ((j * 8 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8) * 2);
            mma_bf16(s[j], qf, kb[0], kb[1]);
            mma_bf16(s[j + 1], qf, kb[2], kb[3]);
        }
    }
    if (kc < j0 || kc + 32 > min(lim0, lim1)) {
        #pragma unroll
        for (int j = 0; j < NT; j++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = kc + j * 8 + 2 * (lane & 3) + (e & 1);
                if (key < j0 || key >= (e >> 1 ? lim1 : lim0)) s[j][e] = -DLLM_INF;
            }
    }
    online_softmax<NT, DT>(s, m, l, o, scale_log2);
    #pragma unroll
    for (int kk = 0; kk < 2; kk++) {
        u32 pa[4];
        pack_p<NT>(s, kk, pa);
        #pragma unroll
        for (int d = 0; d < DT; d += 2) {
            u32 vb[4];
            ldmatrix_x4_trans(vb, v_s + ((kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + d * 8 + (lane >> 4) * 8) * 2);
            mma_bf16(o[d], pa, vb[0], vb[1]);
            mma_bf16(o[d + 1], pa, vb[2], vb[3]);
        }
    }
}

KERNEL_kvq_flash {
    constexpr int HD = KVQ_HD, LD = HD + 8, BC = KVQ_TC_BC, DT = HD / 8;
    pdl_enter();
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float lut[16];  // SoloQ's level of each code (kvq_soloq_c)
    const int warps = blockDim.x >> 5, CR = warps * 16, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    bf16_t *sQ = (bf16_t *)smem, *sK = sQ + CR * LD, *sV = sK + BC * LD;
    float2 *kpf = (float2 *)(sV + BC * LD), *vpf = kpf + KVQ_TC_PG * HD;
    unsigned char *raw = (unsigned char *)(vpf + BC);
    const int split = blockIdx.x, kvh = blockIdx.y, R = a.n_head / a.n_kv * a.q_rows, r0 = blockIdx.z * CR;
    int j0, j1;
    bool quant;
    kvq_split(a, split, j0, j1, quant);
    // The CTA's last query (the largest sequence index among its rows) bounds the keys worth visiting.
    const int r_last = min(R, r0 + CR) - 1;
    const int i_max = r_last / a.q_rows != r0 / a.q_rows ? a.q_rows - 1 : r_last % a.q_rows;
    const int j1c = min(j1, kvq_visible(a, i_max));
    const int rA = r0 + warp * 16 + g, rB = rA + 8;
    const int limA = rA < R ? min(j1, kvq_visible(a, rA % a.q_rows)) : 0, limB = rB < R ? min(j1, kvq_visible(a, rB % a.q_rows)) : 0;
    if (threadIdx.x < 16) lut[threadIdx.x] = a.soloq && threadIdx.x < (1 << a.bits) ? kvq_soloq_c(threadIdx.x, a.bits) : 0.f;
    kvq_tc_load_q(a, sQ, kvh, r0, CR, R);
    cp_async_commit();

    float o[DT][4], m[2] = {-DLLM_INF, -DLLM_INF}, l[2] = {0.f, 0.f};
    #pragma unroll
    for (int d = 0; d < DT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    const bool live = r0 + warp * 16 < R;  // a warp past the group's rows only copies and decodes
    const u32 q_warp = smem_u32(sQ + (warp * 16 + (lane & 15)) * LD + (lane >> 4) * 8), k_s = smem_u32(sK), v_s = smem_u32(sV);
    const float scale_log2 = a.scale * 1.4426950408889634f;
    const int t0 = j0 / BC, t1 = j1c > j0 ? (j1c - 1) / BC + 1 : t0;
    // Quantised splits: tile t's raw codes and pairs are copied (cp.async) while tile t - 1 is multiplied; once they
    // land, its pairs go to fp32 (kvq_tc_convert), then after a barrier its codes are decoded into sK and sV.
    if (quant && t0 < t1) {
        kvq_tc_stage(a, raw, kvh, t0 * BC, j0, min(t0 * BC + BC, j1c));
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        kvq_tc_convert(a, raw, kpf, vpf, kvq_tc_groups(a, j0, min(t0 * BC + BC, j1c)));
    }
    for (int tile = t0; tile < t1; tile++) {
        const int k0 = tile * BC, lo = max(k0, j0), hi = min(k0 + BC, j1c);
        if (quant) {
            if (tile + 1 < t1)  // into the stage of tile - 1, decoded before the last barrier
                kvq_tc_stage(a, raw + ((tile + 1 - t0) & 1) * KVQ_TC_STAGE, kvh, k0 + BC, k0 + BC, min(k0 + 2 * BC, j1c));
            cp_async_commit();
            __syncthreads();  // the pairs converted; sK and sV free
            kvq_tc_decode(a, raw + ((tile - t0) & 1) * KVQ_TC_STAGE, kpf, vpf, lut, sK, sV, kvh, k0, lo, hi);
        } else {
            kvq_tc_load_bf16(a, sK, sV, kvh, k0, lo, hi);
            cp_async_commit();
            cp_async_wait<0>();
        }
        __syncthreads();
        if (live)
            #pragma unroll 1
            for (int sub = 0; sub < BC; sub += 32)
                if (k0 + sub < hi && k0 + sub + 32 > lo)
                    kvq_tc_chunk(q_warp, k_s + sub * LD * 2, v_s + sub * LD * 2, k0 + sub, j0, limA, limB, lane, scale_log2, o, m, l);
        if (quant && tile + 1 < t1) {  // tile + 1's stage landed (it had this tile's decode and mma to): its pairs to fp32
            cp_async_wait<0>();
            __syncthreads();
            kvq_tc_convert(a, raw + ((tile + 1 - t0) & 1) * KVQ_TC_STAGE, kpf, vpf, kvq_tc_groups(a, k0 + BC, min(k0 + 2 * BC, j1c)));
        } else {
            __syncthreads();
        }
    }
    cp_async_wait<0>();  // a split with no visible key never waited for its query rows
    const int group = a.n_head / a.n_kv;
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        float lr = l[r];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        const int row = r ? rB : rA;
        if (row >= R) continue;
        const int h = kvh * group + row / a.q_rows, i = row % a.q_rows;
        float *p = a.partial + (((u64)split * a.n_head + h) * a.q_rows + i) * (HD + 2);
        #pragma unroll
        for (int d = 0; d < DT; d++) *(float2 *)(p + d * 8 + 2 * t) = make_float2(o[d][2 * r], o[d][2 * r + 1]);
        if (t == 0) p[HD] = m[r], p[HD + 1] = lr;
    }
}

/* The splits of one (query row, head) merged in split order (twin: dllm__kvq_flash_twin's last step): weights 2^(m_s - max),
 * SoloQ's quantised splits summed apart and rotated back once, then the bf16 ones added and the sum normalised. */
KERNEL_kvq_flash_combine {
    pdl_enter();
    __shared__ float acc[256], racc[256], T0[256], T1[256];
    const int i = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, hd = a.hd, n_splits = kvq_n_splits(a);
    const u64 stride = (u64)a.n_head * a.q_rows * (hd + 2);
    const float *P = a.partial + ((u64)h * a.q_rows + i) * (hd + 2);
    float mx = -DLLM_INF;
    for (int s = lane; s < n_splits; s += 32) mx = fmaxf(mx, P[s * stride + hd]);
    for (int x = 16; x > 0; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
    for (int c = lane; c < hd; c += 32) acc[c] = 0.f, racc[c] = 0.f;
    float l = 0.f;
    for (int s = 0; s < n_splits; s++) {
        const float ms = P[s * stride + hd];
        if (ms == -DLLM_INF) continue;  // a split with no visible key
        int j0, j1;
        bool quant;
        kvq_split(a, s, j0, j1, quant);
        const float w = exp2_ftz(ms - mx);
        l = fmaf(w, P[s * stride + hd + 1], l);
        float *dst = quant && a.soloq ? racc : acc;
        for (int c = lane; c < hd; c += 32) dst[c] = fmaf(w, P[s * stride + c], dst[c]);
    }
    __syncwarp();
    if (a.soloq) kvq_rotate_back(a, racc, T0, T1, lane);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int c = lane; c < hd; c += 32) a.o[(u64)i * a.o_stride + h * hd + c] = f32_to_bf16((acc[c] + (a.soloq ? T1[c] : 0.f)) * inv);
}
)DLLM";

/* [FACache] on block diffusion, on the device (twins: dllm__cpu_softmax_part, dllm__softmax_merge, dllm__cpu_bd_attend): layer
 * 0's attention split at the committed cache. bdfa_committed computes, for the listed rows of a forward, each head's
 * online-softmax state over the committed keys [0, n_committed) and stores it at the row's block offset; bdfa_merge
 * computes every row's state over the forward's own keys [n_committed, n_visible) and merges it with the stored one.
 * The cached path lists only the rows whose token changed; the uncached path lists every row: the same kernels in the
 * same order, so both give the same bits. bdfa_committed splits the committed keys over DLLM_BDFA_WARPS warps of a CTA
 * per (row, head) and merges their states in warp order (a warp walking 1024 keys alone is latency-bound: 0.7 ms more
 * than flash_attn for a 32-row step of the 7B shape, measured); bdfa_merge (the forward's own keys, a block at most)
 * keeps a warp per (row, head). */
#define DLLM__BDFA_ARGS_FIELDS(X)                                                                                    \
    X(const bf16_t *, cache) /* layer 0's K|V rows [n_keys][2 kvd]: committed, then the forward's own */            \
    X(const bf16_t *, q) X(bf16_t *, o) X(int, q_stride) X(int, o_stride)                                            \
    X(int, n_head) X(int, n_kv) X(int, hd) X(float, scale)                                                           \
    X(int, n_keys) X(int, n_committed) X(int, mask_block) X(int, q_index0)                                           \
    X(const int *, rows) /* bdfa_committed: the forward's rows whose state is computed, one per grid.x */           \
    X(const int *, n_rows) /* null, or how many rows are listed (a graph's launch covers every row) */               \
    X(int, offset)       /* the block offset of the forward's row 0 */                                              \
    X(float *, state)    /* [block offset][n_head][hd + 2]: the unnormalised O, then m and l */

#define DLLM__BDFA_KERNELS(X)                                  \
    X(bdfa_committed, __launch_bounds__(256), (bdfa_args a))   \
    X(bdfa_merge, __launch_bounds__(32), (bdfa_args a))

struct bdfa_args { DLLM__BDFA_ARGS_FIELDS(DLLM__FIELD) };
DLLM__BDFA_KERNELS(DLLM__KERNEL_SIGNATURE)
static const int dllm__bdfa_warps = 8;  // bdfa_committed's warps per (row, head): 256 threads, its __launch_bounds__

static const char *dllm__src_bdfa = DLLM__SOURCE_LINE R"DLLM(
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
    const int n = (a.n_committed + 32 * W - 1) / (32 * W) * 32, j0 = min(a.n_committed, w * n), j1 = min(a.n_committed, j0 + n);
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
    const float l = __fadd_rn(__fmul_rn(l1, a1), __fmul_rn(l2, a2)), inv = mx == -DLLM_INF || !(l > 0.f) ? 0.f : 1.f / l;
    for (int c = threadIdx.x; c < hd; c += 32)
        a.o[(u64)i * a.o_stride + h * hd + c] = f32_to_bf16(__fmul_rn(__fadd_rn(__fmul_rn(st[c], a1), __fmul_rn(acc[c], a2)), inv));
}
)DLLM";

/* Tensor-core plumbing shared by the attention and the FP8 GEMM modules (sm_80+): cp.async copies and
 * ldmatrix. Shared-memory operands are 32-bit shared-window byte addresses: half the registers of generic
 * pointers. */
static const char *dllm__src_mma = DLLM__SOURCE_LINE R"DLLM(
__device__ __forceinline__ u32 smem_u32(const void *p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(u32 smem, const void *gmem, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(u32 r[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
)DLLM";

/* dllm's own FP8 GEMM (DLLM__FP8_MMA): sm_89 (Ada) has FP8 tensor cores but no block-scaled cuBLASLt mode; sm_90 runs
 * it with DLLM_FP8_GEMM=mma. Twin: dllm__fp8_gemm_twin. Y [M x N] (bf16, row-major, leading dimension N) = X . W^T on
 * the cuBLASLt path's operands (struct dllm__gemm_op): X E4M3 [M x K] with an fp32 scale per 1x128 group at
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
static const char *dllm__src_fp8_gemm = DLLM__SOURCE_LINE R"DLLM(
__device__ __forceinline__ void mma_e4m3(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled k-tile. */
__device__ __forceinline__ u32 f8_swizzle(int row, int chunk) { return (u32)(row * 128 + ((chunk ^ (row & 7)) << 4)); }

/* Codes [k0, k0 + 128) of ROWS rows from row0 into a swizzled k-tile; rows at or past n_rows are zero-filled. */
template <int ROWS, int THREADS>
__device__ __forceinline__ void f8_load_tile(u32 dst, const unsigned char *src, int ld, int row0, int n_rows, int k0) {
    static_assert(ROWS * 8 % THREADS == 0, "every thread copies the same number of chunks");
#pragma unroll
    for (int i = 0; i < ROWS * 8 / THREADS; i++) {
        const int c = i * THREADS + threadIdx.x, r = c >> 3, chunk = c & 7;
        const bool ok = row0 + r < n_rows;
        cp_async16(dst + f8_swizzle(r, chunk), src + (u64)(ok ? row0 + r : 0) * ld + k0 + chunk * 16, ok);
    }
}

/* Stores a row's two neighbouring outputs (n even); a u32 store needs an even N for 4-byte alignment. */
__device__ __forceinline__ void f8_store2(bf16_t *y_row, int n, int N, float v0, float v1) {
    if (!(N & 1) && n + 1 < N) {
        *(u32 *)(y_row + n) = pack_bf16x2(v0, v1);
    } else {
        if (n < N) y_row[n] = f32_to_bf16(v0);
        if (n + 1 < N) y_row[n + 1] = f32_to_bf16(v1);
    }
}

/* Grid (ceil(M / BM), ceil(N / BN)): neighbouring CTAs share a weight tile, which is read from DRAM about once. */
template <int BM, int BN, int WM, int WN, int STAGES>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, 1)
fp8_gemm(const unsigned char *X, const float *x_scale, const unsigned char *W, const float *w_scale, bf16_t *Y, int M, int N, int K) {
    constexpr int THREADS = (BM / WM) * (BN / WN) * 32, MT = WM / 16, NT = WN / 8, STAGE_BYTES = (BM + BN) * 128;
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && NT % 2 == 0 && 128 % BN == 0, "fp8_gemm tile");
    pdl_enter();
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN, wm = warp / (BN / WN) * WM, wn = warp % (BN / WN) * WN;
    const int k_tiles = K >> 7;
    const float *ws = w_scale + (u64)(n0 >> 7) * ((k_tiles + 3) & ~3);
    const u32 base = smem_u32(smem);

    for (int s = 0; s < STAGES - 1; s++) {
        if (s < k_tiles) {
            f8_load_tile<BM, THREADS>(base + s * STAGE_BYTES, X, K, m0, M, s * 128);
            f8_load_tile<BN, THREADS>(base + s * STAGE_BYTES + BM * 128, W, K, n0, N, s * 128);
        }
        cp_async_commit();
    }
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
    // ldmatrix row addresses (see m16n8k16): A rows wm + (lane & 15), chunk + (lane >> 4); B rows wn + (lane & 7) +
    // (lane >> 4) * 8, chunk + ((lane >> 3) & 1). Tile rows are multiples of 8 apart, so a row's swizzle is lane & 7.
    const u32 a_row = (u32)(wm + (lane & 15)) * 128, b_row = (u32)(BM + wn + (lane & 7) + (lane >> 4) * 8) * 128;
    const int a_half = lane >> 4, b_half = (lane >> 3) & 1, sw = lane & 7;

    for (int kt = 0; kt < k_tiles; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // k-tile kt has landed everywhere, and every warp is done with the stage it replaces
        const int next = kt + STAGES - 1;
        if (next < k_tiles) {
            const u32 dst = base + (next % STAGES) * STAGE_BYTES;
            f8_load_tile<BM, THREADS>(dst, X, K, m0, M, next * 128);
            f8_load_tile<BN, THREADS>(dst + BM * 128, W, K, n0, N, next * 128);
        }
        cp_async_commit();
        // the scales are loaded first: their latency hides behind the k-tile's mma
        float sx[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int m = m0 + wm + mt * 16 + g + 8 * r;
                sx[mt][r] = m < M ? x_scale[(u64)kt * M + m] : 0.f;
            }
        const float s_w = ws[kt];
        const u32 stage = base + (kt % STAGES) * STAGE_BYTES;
        float part[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) part[mt][nt][0] = part[mt][nt][1] = part[mt][nt][2] = part[mt][nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {  // 4 x k32 = the 128-wide group
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                if (m0 + wm + mt * 16 < M) ldmatrix_x4(a[mt], stage + a_row + mt * 16 * 128 + (((2 * ks + a_half) ^ sw) << 4));
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) {
                u32 b[4];
                ldmatrix_x4(b, stage + b_row + nt * 8 * 128 + (((2 * ks + b_half) ^ sw) << 4));
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    if (m0 + wm + mt * 16 < M) {  // m16 tiles wholly past the padded rows (small M) do no work
                        mma_e4m3(part[mt][nt], a[mt], b[0], b[1]);
                        mma_e4m3(part[mt][nt + 1], a[mt], b[2], b[3]);
                    }
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[mt][nt][e] = fmaf(part[mt][nt][e], sx[mt][e >> 1] * s_w, acc[mt][nt][e]);
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int m = m0 + wm + mt * 16 + g + 8 * r;
            if (m >= M) continue;
            bf16_t *y_row = Y + (u64)m * N;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) f8_store2(y_row, n0 + wn + nt * 8 + 2 * t, N, acc[mt][nt][2 * r], acc[mt][nt][2 * r + 1]);
        }
}
)DLLM";

/* [W4 GEMM] q4_gemm's arguments (host/kernel contract, declared in its own module): y = (A . C_w^T * s_x) * s_w on
 * N packed 4-bit weight rows (section 9b's layout) and M <= 64 bf16 activation rows; partial: split-K's fp32
 * [k_splits][M][N] (k_splits > 1 only). */
#define DLLM__Q4_GEMM_ARGS_FIELDS(X)                                                                                  \
    X(const unsigned char *, codes)        /* [N][K / 2] */                                                           \
    X(const unsigned char *, block_scales) /* NVFP4: [N][ceil(K / 16)] UE4M3; otherwise unused */                    \
    X(const float *, row_scale)            /* [N] */                                                                  \
    X(const bf16_t *, A)                   /* [M][lda], 16-byte aligned, lda % 8 == 0 */                              \
    X(const float *, s_x)                  /* [M] per-token scales, or null (1) */                                    \
    X(void *, y)                           /* y[m * ldy + y_col0 + n], bf16 or fp32 (y_f32) */                        \
    X(float *, partial)                                                                                               \
    X(int, lda) X(int, ldy) X(int, y_col0) X(int, y_f32) X(int, M) X(int, N) X(int, K)                                \
    X(int, k_splits) X(int, chunks_per_split) /* K in chunks of Q4_KC; split s takes chunks [s * cps, (s + 1) * cps) */
struct q4_gemm_args { DLLM__Q4_GEMM_ARGS_FIELDS(DLLM__FIELD) };
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
static int dllm__q4_stage_count(dllm__q4_format f, int M) { return M <= dllm__q4_m32_rows && f != DLLM__Q4_NVFP4 ? dllm__q4_stages_m32 : dllm__q4_stages; }
static size_t dllm__q4_stage_bytes(dllm__q4_format f, int M) {
    const int tiles = 2 * dllm__q4_wt, m_tiles = (M + 7) / 8;
    return (size_t)tiles * dllm__q4_threads * (16 + (f == DLLM__Q4_NVFP4 ? 8 : 0)) + (size_t)m_tiles * 8 * dllm__q4_kc * 2;
}
static size_t dllm__q4_ring_bytes(dllm__q4_format f, int M) { return (size_t)dllm__q4_stage_count(f, M) * dllm__q4_stage_bytes(f, M); }

/* [kernel table] the W4 GEMM module: two entry points per weight format (the dequantiser is a template parameter), for
 * M <= 64 and (_m32) M <= 32 (half the accumulators: NVFP4 then fits 3 CTAs an SM), and split-K's reduction. The 128 of
 * __launch_bounds__ is dllm__q4_threads. */
#define DLLM__Q4_GEMM_KERNELS(X) \
    X(q4_gemm_nvfp4, __launch_bounds__(128), (q4_gemm_args a)) \
    X(q4_gemm_int4, __launch_bounds__(128), (q4_gemm_args a)) \
    X(q4_gemm_lloyd, __launch_bounds__(128), (q4_gemm_args a)) \
    X(q4_gemm_e8p, __launch_bounds__(128), (q4_gemm_args a)) \
    X(q4_gemm_rtn, __launch_bounds__(128), (q4_gemm_args a)) \
    X(q4_gemm_nvfp4_m32, __launch_bounds__(128), (q4_gemm_args a)) \
    X(q4_gemm_int4_m32, __launch_bounds__(128), (q4_gemm_args a)) \
    X(q4_gemm_lloyd_m32, __launch_bounds__(128), (q4_gemm_args a)) \
    X(q4_gemm_e8p_m32, __launch_bounds__(128), (q4_gemm_args a)) \
    X(q4_gemm_rtn_m32, __launch_bounds__(128), (q4_gemm_args a)) \
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
static const char *dllm__src_q4_gemm = DLLM__SOURCE_LINE R"DLLM(
enum { Q4_NVFP4 = 0, Q4_INT4 = 1, Q4_LLOYD = 2, Q4_E8P = 3, Q4_RTN = 4 };

__device__ __forceinline__ void q4_mma(float c[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 q4_fma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
/* A float's bf16 (exact for the constants below) in both halves. */
__device__ __forceinline__ u32 q4_bf16x2(float f) { return (__float_as_uint(f) >> 16) * 0x10001u; }

struct q4_smem {
    u32 e8p_abs[256];                  // q4_e8p_abs_table
    unsigned short e8p_wint[144];      // q4_e8p_wint_table
    unsigned short e4m3[256];          // q4_e4m3_table
    unsigned short lut[16];            // NVFP4: e2m1; Lloyd-Max: +-levels (bf16)
};

/* The tables a format reads, copied from global memory (coalesced; __constant__ would serialise the lanes' distinct
 * addresses). */
template <int FMT>
__device__ __forceinline__ void q4_load_tables(q4_smem &s) {
    if (FMT == Q4_E8P) {
        for (int i = threadIdx.x; i < 256; i += Q4_THREADS) s.e8p_abs[i] = q4_e8p_abs_table[i];
        for (int i = threadIdx.x; i < 144; i += Q4_THREADS) s.e8p_wint[i] = q4_e8p_wint_table[i];
    }
    if (FMT == Q4_NVFP4)
        for (int i = threadIdx.x; i < 256; i += Q4_THREADS) s.e4m3[i] = q4_e4m3_table[i];
    if ((FMT == Q4_NVFP4 || FMT == Q4_LLOYD) && threadIdx.x < 16) s.lut[threadIdx.x] = FMT == Q4_LLOYD ? q4_lloyd_table[threadIdx.x] : q4_e2m1_table[threadIdx.x];
}

/* An E8P code decoded to W_int row/column indices (4 v + 11) / 2 (dllm__e8p_decode4, dllm__e8p_int). Abs pattern
 * entry: bits 2i, 2i+1 = u_i = (2|a_i| - 1) / 2 (2|a_i| in {1, 3, 5}), bit 16 = (sum 2|a_i|) / 2 odd. Coordinate 0's
 * sign gives the negative count that bit's parity; 4 v = +-(4 u + 2) + (shift ? 1 : -1), so the index is
 * 6 + shift + 2 u when positive and 4 + shift - 2 u when negative. */
struct q4_e8p_code {
    u32 pat, signs, shift;
};
__device__ __forceinline__ q4_e8p_code q4_e8p_open(u32 code, const q4_smem &s) {
    const u32 pat = s.e8p_abs[code >> 8];
    return {pat, (code & 0xFEu) | (((pat >> 16) ^ (u32)__popc(code & 0xFEu)) & 1), code & 1};
}
__device__ __forceinline__ u32 q4_e8p_index(const q4_e8p_code &c, int i) {
    const u32 u = (c.pat >> (2 * i)) & 3;
    return (c.signs >> i) & 1 ? 4 + c.shift - 2 * u : 6 + c.shift + 2 * u;
}

/* The 8 C values of one word of codes as the bf16 pairs (e0, e1), (e2, e3), (e4, e5), (e6, e7) (low half first): byte
 * i's two nibbles. scale: the word's UE4M3 block scale (NVFP4). */
template <int FMT>
__device__ __forceinline__ void q4_dequant(u32 w, u32 scale, const q4_smem &s, u32 p[4]) {
    if (FMT == Q4_INT4) {
        // byte i of w << 1 holds element 2i at bits 1..4, byte i of w >> 3 element 2i + 1: prmt puts them in bytes 0
        // and 2, then mantissa fields v = 2 u + 1 under 256's exponent (bf16 0x4380 + v: 256 + 2 v), u = nibble ^ 8
        // = q + 8: (258 + 4 u) / 2 - 144 = 2 u - 15 = 2 q + 1
        const u32 lo = w << 1, hi = w >> 3;
#pragma unroll
        for (int i = 0; i < 4; i++)
            p[i] = q4_fma2((__byte_perm(lo, hi, 0x4400u + 0x1111u * i) & 0x001E001Eu) ^ 0x43914391u, q4_bf16x2(0.5f), q4_bf16x2(-144.0f));
    } else if (FMT == Q4_RTN) {
        // elements 2i, 2i + 1 at bits 0..3 of byte i of w, w >> 4; mantissa fields u = nibble ^ 8 = q + 8 under 128's
        // exponent (bf16 0x4300 + u: 128 + u): 128 + u - 136 = q
        const u32 hi = w >> 4;
#pragma unroll
        for (int i = 0; i < 4; i++)
            p[i] = q4_fma2((__byte_perm(w, hi, 0x4400u + 0x1111u * i) & 0x000F000Fu) ^ 0x43084308u, q4_bf16x2(1.0f), q4_bf16x2(-136.0f));
    } else if (FMT == Q4_E8P) {  // the word is one group: stage-1 code low, stage-2 code high
        const q4_e8p_code c1 = q4_e8p_open(w & 0xFFFFu, s), c2 = q4_e8p_open(w >> 16, s);
#pragma unroll
        for (int i = 0; i < 4; i++)
            p[i] = (u32)s.e8p_wint[q4_e8p_index(c1, 2 * i) * 12 + q4_e8p_index(c2, 2 * i)] |
                   (u32)s.e8p_wint[q4_e8p_index(c1, 2 * i + 1) * 12 + q4_e8p_index(c2, 2 * i + 1)] << 16;
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) p[i] = (u32)s.lut[(w >> (8 * i)) & 15] | (u32)s.lut[(w >> (8 * i + 4)) & 15] << 16;
        if (FMT == Q4_NVFP4) {
            const u32 sc = (u32)s.e4m3[scale] * 0x10001u;
#pragma unroll
            for (int i = 0; i < 4; i++) p[i] = q4_fma2(p[i], sc, 0x80008000u);  // + (-0): the product alone, exact
        }
    }
}

/* The ring: STAGES stages of q4_stage_bytes (dllm__q4_stage_bytes: codes [wt * 2 + h][thread] 16 bytes, NVFP4's
 * block-scale words [(wt * 2 + h) * 2 + i][thread], then the activation rows, 256 bytes each). Every thread copies
 * its own weight slots and a share of the activation rows with cp.async (nothing held in registers); its
 * cp.async.wait_group makes its copies visible to itself, and the CTA barrier at each chunk's start makes every
 * thread's visible to all and orders their reads of the stage being refilled before its new copies (PTX leaves
 * cp.async unordered with other memory operations otherwise). */
__device__ __forceinline__ void q4_cp_async4(u32 smem, const void *gmem, u32 bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void q4_cp_async16(u32 smem, const void *gmem, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(bytes) : "memory");
}
/* The same for weight codes, with an L2 prefetch of the whole 128-byte line: a row's 64 bytes of a chunk are half a
 * line (rows start 128-byte aligned where K % 256 == 0), so DRAM serves whole lines and the next chunk's half is
 * already on its way when its copy is issued. */
__device__ __forceinline__ void q4_cp_async16_line(u32 smem, const void *gmem, u32 bytes) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void q4_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* The "memory" clobber keeps the ring's reads after the wait. */
template <int N> __device__ __forceinline__ void q4_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

template <int FMT> __device__ constexpr int q4_scale_bytes() { return FMT == Q4_NVFP4 ? 2 * Q4_WT * 2 * Q4_THREADS * 4 : 0; }
constexpr int Q4_CODE_BYTES = 2 * Q4_WT * Q4_THREADS * 16;
/* A stage's bytes for m_tiles activation tiles (the host's dllm__q4_stage_bytes). */
template <int FMT> __device__ __forceinline__ u32 q4_stage_bytes(int m_tiles) { return (u32)(Q4_CODE_BYTES + q4_scale_bytes<FMT>() + m_tiles * 8 * Q4_KC * 2); }

/* Activation row r's 16-byte slot for k group q (k0 + 8 q, q = 4 t + j as q4_chunk reads it) is 4 j + t, xor 5 in odd
 * rows: a quarter warp's 8 reads (rows g, g + 1; t = 0..3) land in the 8 distinct 16-byte bank groups (slot mod 8: even
 * rows 4 (j & 1) + t, odd ones 4 (~j & 1) + (t ^ 1)). An involution of q for a given r (the transpose fixes 5), so it
 * is also the group a slot holds. */
__device__ __forceinline__ int q4_act_slot(int q, int r) { return ((q & 3) << 2 | q >> 2) ^ 5 * (r & 1); }

/* The NVFP4 block-scale bytes of one row and chunk: words 0, 1 of thread t lie in block b0 = n * blocks + k0 / 16 + 2 t
 * (an index into the [N][blocks] array), words 2, 3 in b0 + 1; both bytes lie in the 8 from the 4-aligned b0 & ~3;
 * each 4-byte copy reads only the bytes before the array's end (src-size), so nothing past it is touched. */
__device__ __forceinline__ u64 q4_scale_base(const q4_gemm_args &a, int n, int k0, int t) {
    return (u64)n * ((a.K + 15) >> 4) + (k0 >> 4) + 2 * t;
}

/* Issues the copies of one chunk at k0 into the stage at byte `stage` of the ring: this thread's rows n0 + 16 wt + 8 h
 * (h = 0: row g, 1: row g + 8), k0 + 32 t + [0, 32); its share of the activation rows [0, 8 m_tiles). Nothing is read
 * (zeros land) where a row is past N or M, or k past k_end. vec16: K % 32 == 0 and the codes 16-byte aligned, so a
 * thread's 16 bytes of a row are one aligned copy (k_end, a multiple of 32 then, never cuts them). */
template <int FMT>
__device__ __forceinline__ void q4_issue_chunk(const q4_gemm_args &a, u32 stage, int m_tiles, int n0, int t, int k0, int k_end, bool vec16) {
    const int row_bytes = a.K >> 1, k = k0 + 32 * t;
#pragma unroll
    for (int wt = 0; wt < Q4_WT; wt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int n = n0 + 16 * wt + 8 * h;
            const bool row_ok = n < a.N;
            const unsigned char *row = a.codes + (u64)(row_ok ? n : 0) * row_bytes;
            const u32 dst = stage + ((wt * 2 + h) * Q4_THREADS + threadIdx.x) * 16;
            if (vec16) {
                const bool ok = row_ok && k < k_end;
                q4_cp_async16_line(dst, ok ? row + (k >> 1) : a.codes, ok ? 16 : 0);
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const bool ok = row_ok && k + 8 * j < k_end;
                    q4_cp_async4(dst + 4 * j, ok ? row + ((k + 8 * j) >> 1) : a.codes, ok ? 4 : 0);
                }
            }
            if (FMT == Q4_NVFP4) {
                const u64 total = (u64)a.N * ((a.K + 15) >> 4), base = row_ok ? q4_scale_base(a, n, k0, t) & ~(u64)3 : total;
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const u64 at = base + 4 * i, bytes = at < total ? min(total - at, (u64)4) : 0;
                    q4_cp_async4(stage + Q4_CODE_BYTES + (((wt * 2 + h) * 2 + i) * Q4_THREADS + threadIdx.x) * 4, bytes ? a.block_scales + at : a.block_scales,
                                 (u32)bytes);
                }
            }
        }
    const u32 acts = stage + Q4_CODE_BYTES + q4_scale_bytes<FMT>();
    for (int v = threadIdx.x; v < m_tiles * 8 * 16; v += Q4_THREADS) {  // consecutive threads, consecutive slots
        const int r = v >> 4, q = q4_act_slot(v & 15, r), kq = k0 + 8 * q;
        const bool ok = r < a.M && kq < k_end;
        q4_cp_async16(acts + v * 16, ok ? a.A + (u64)r * a.lda + kq : a.A, ok ? 16 : 0);
    }
}

/* This thread's words of the stage at `stage` (landed: see the wait in q4_gemm_body); NVFP4: words 0, 1's block scale
 * in byte 0 of sc, words 2, 3's in byte 1, picked out of the 8 copied bytes at offset b0 & 3. */
template <int FMT>
__device__ __forceinline__ void q4_read_chunk(const q4_gemm_args &a, const unsigned char *stage, int n0, int t, int k0, uint4 w[Q4_WT][2], u32 sc[Q4_WT][2]) {
#pragma unroll
    for (int wt = 0; wt < Q4_WT; wt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            w[wt][h] = *(const uint4 *)(stage + ((wt * 2 + h) * Q4_THREADS + threadIdx.x) * 16);
            sc[wt][h] = 0;
            if (FMT == Q4_NVFP4) {
                const u32 *win = (const u32 *)(stage + Q4_CODE_BYTES + ((wt * 2 + h) * 2 * Q4_THREADS + threadIdx.x) * 4);
                const u32 shift = 8 * (u32)(q4_scale_base(a, n0 + 16 * wt + 8 * h, k0, t) & 3);
                sc[wt][h] = __funnelshift_r(win[0], win[Q4_THREADS], shift);  // the next slot, Q4_THREADS words on
            }
        }
}

__device__ __forceinline__ u32 q4_word(const uint4 &w, int j) { return j == 0 ? w.x : j == 1 ? w.y : j == 2 ? w.z : w.w; }

/* One chunk (its stage's activation rows at acts) into the accumulators: per word j, the two k16 steps of every
 * weight tile against every live activation tile (the tiles past M cost nothing and change no row's arithmetic, and
 * neither does MT, the tiles an instance holds). */
template <int FMT, int MT>
__device__ __forceinline__ void q4_chunk(const q4_smem &s, const unsigned char *acts, int m_tiles, int g, int t, const uint4 w[Q4_WT][2],
                                         const u32 sc[Q4_WT][2], float acc[Q4_WT][MT][4]) {
    const int p = g & 1;
    const unsigned char *acts_even = acts + g * (Q4_KC * 2) + 16 * (t ^ p) + 64 * p, *acts_odd = acts_even - 128 * p;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        u32 p[Q4_WT][2][4];
#pragma unroll
        for (int wt = 0; wt < Q4_WT; wt++)
#pragma unroll
            for (int h = 0; h < 2; h++) q4_dequant<FMT>(q4_word(w[wt][h], j), (sc[wt][h] >> (8 * (j >> 1))) & 255, s, p[wt][h]);
        // row r = 8 mt + g's slot q4_act_slot(4 t + j, r) = 4 (j ^ p) + (t ^ p), p = g & 1, and 4 (j ^ p) = 4 j + 4 p
        // for even j, 4 j - 4 p for odd j: two bases with constant offsets (ptxas keeps a register an address otherwise)
        const unsigned char *b_at = (j & 1 ? acts_odd : acts_even) + 64 * j;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            if (mt < m_tiles) {
                const uint4 b = *(const uint4 *)(b_at + mt * 8 * (Q4_KC * 2));
#pragma unroll
                for (int wt = 0; wt < Q4_WT; wt++) {
                    q4_mma(acc[wt][mt], p[wt][0][0], p[wt][1][0], p[wt][0][1], p[wt][1][1], b.x, b.y);
                    q4_mma(acc[wt][mt], p[wt][0][2], p[wt][1][2], p[wt][0][3], p[wt][1][3], b.z, b.w);
                }
            }
    }
}

/* The epilogue of one output: (acc * s_x) * s_w in fp32, rounded once to the output type. */
__device__ __forceinline__ void q4_store(const q4_gemm_args &a, int m, int n, float acc) {
    const float v = __fmul_rn(__fmul_rn(acc, a.s_x ? a.s_x[m] : 1.0f), a.row_scale[n]);
    const u64 at = (u64)m * a.ldy + a.y_col0 + n;
    if (a.y_f32) ((float *)a.y)[at] = v;
    else ((bf16_t *)a.y)[at] = f32_to_bf16(v);
}

/* The accumulators of one CTA: weight tile `tile` (rows tile * Q4_BN + [0, Q4_BN)) over split `split`'s chunks
 * [split * cps, (split + 1) * cps) of K. STAGES - 1 chunks (weights and activations) are in flight while one is
 * computed; one barrier a chunk. MT: the activation tiles the instance holds (M <= 8 MT); STAGES: the host's
 * dllm__q4_stage_count for them. Leaves only empty cp.async groups outstanding. */
template <int FMT, int MT, int STAGES>
__device__ __forceinline__ void q4_gemm_accumulate(const q4_gemm_args &a, const q4_smem &s, int tile, int split, float acc[Q4_WT][MT][4]) {
    extern __shared__ __align__(16) unsigned char q4_ring[];
    const u32 ring = (u32)__cvta_generic_to_shared(q4_ring);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int m_tiles = (a.M + 7) >> 3, chunks = (a.K + Q4_KC - 1) / Q4_KC;
    const int c_begin = split * a.chunks_per_split, c_end = min(chunks, c_begin + a.chunks_per_split), k_end = min(a.K, c_end * Q4_KC);
    const int n0 = tile * Q4_BN + warp * (16 * Q4_WT) + g, n_chunks = c_end - c_begin;
    const u32 stage_bytes = q4_stage_bytes<FMT>(m_tiles), act_offset = Q4_CODE_BYTES + q4_scale_bytes<FMT>();
    const bool vec16 = (a.K & 31) == 0 && ((u64)a.codes & 15) == 0;
#pragma unroll
    for (int wt = 0; wt < Q4_WT; wt++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++) acc[wt][mt][0] = acc[wt][mt][1] = acc[wt][mt][2] = acc[wt][mt][3] = 0.f;
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) {  // one commit group per chunk, empty past the split's end
        if (i < n_chunks) q4_issue_chunk<FMT>(a, ring + i * stage_bytes, m_tiles, n0, t, (c_begin + i) * Q4_KC, k_end, vec16);
        q4_cp_async_commit();
    }
    for (int i = 0; i < n_chunks; i++) {
        const int c = c_begin + i;
        q4_cp_async_wait<STAGES - 2>();  // this thread's copies of chunk i (and of every older one) have landed
        // every thread's copies of chunk i have landed, and every thread is done with chunk i - 1's stage (and the
        // tables are written): the barrier orders those before the reads and the refill below
        __syncthreads();
        if (i + STAGES - 1 < n_chunks)
            q4_issue_chunk<FMT>(a, ring + ((i + STAGES - 1) % STAGES) * stage_bytes, m_tiles, n0, t, (c + STAGES - 1) * Q4_KC, k_end, vec16);
        q4_cp_async_commit();
        const unsigned char *stage = q4_ring + (i % STAGES) * stage_bytes;
        uint4 w[Q4_WT][2];
        u32 sc[Q4_WT][2];
        q4_read_chunk<FMT>(a, stage, n0, t, c * Q4_KC, w, sc);
        q4_chunk<FMT, MT>(s, stage + act_offset, m_tiles, g, t, w, sc, acc);
    }
}

/* The weight row n and activation row m of accumulator element e of weight tile wt and activation tile mt, for thread
 * `thread` of the CTA of weight tile `tile` (the mma's c0..c3: see q4_gemm's header). */
__device__ __forceinline__ int q4_acc_row_n(int tile, int thread, int wt, int e) {
    return tile * Q4_BN + (thread >> 5) * (16 * Q4_WT) + 16 * wt + 8 * (e >> 1) + ((thread & 31) >> 2);
}
__device__ __forceinline__ int q4_acc_row_m(int thread, int mt, int e) { return mt * 8 + 2 * (thread & 3) + (e & 1); }

/* This thread's outputs: split-K's partial (k_splits > 1: [split][M][N]) or the epilogue. */
template <int MT>
__device__ __forceinline__ void q4_gemm_write(const q4_gemm_args &a, int tile, int split, const float acc[Q4_WT][MT][4]) {
    const int m_tiles = (a.M + 7) >> 3;
#pragma unroll
    for (int wt = 0; wt < Q4_WT; wt++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int n = q4_acc_row_n(tile, threadIdx.x, wt, e), m = q4_acc_row_m(threadIdx.x, mt, e);
                if (mt >= m_tiles || m >= a.M || n >= a.N) continue;
                if (a.k_splits > 1) a.partial[((u64)split * a.M + m) * a.N + n] = acc[wt][mt][e];
                else q4_store(a, m, n, acc[wt][mt][e]);
            }
}

/* Grid (ceil(N / Q4_BN), k_splits), Q4_THREADS threads, dynamic shared memory: the ring (dllm__q4_ring_bytes(M)). */
template <int FMT, int MT, int STAGES>
__device__ __forceinline__ void q4_gemm_body(const q4_gemm_args &a) {
    pdl_enter();
    __shared__ __align__(16) q4_smem s;
    q4_load_tables<FMT>(s);
    float acc[Q4_WT][MT][4];
    q4_gemm_accumulate<FMT, MT, STAGES>(a, s, blockIdx.x, blockIdx.y, acc);
    q4_gemm_write<MT>(a, blockIdx.x, blockIdx.y, acc);
}

KERNEL_q4_gemm_nvfp4 { q4_gemm_body<Q4_NVFP4, Q4_MT, Q4_STAGES>(a); }
KERNEL_q4_gemm_int4 { q4_gemm_body<Q4_INT4, Q4_MT, Q4_STAGES>(a); }
KERNEL_q4_gemm_lloyd { q4_gemm_body<Q4_LLOYD, Q4_MT, Q4_STAGES>(a); }
KERNEL_q4_gemm_e8p { q4_gemm_body<Q4_E8P, Q4_MT, Q4_STAGES>(a); }
KERNEL_q4_gemm_rtn { q4_gemm_body<Q4_RTN, Q4_MT, Q4_STAGES>(a); }
KERNEL_q4_gemm_nvfp4_m32 { q4_gemm_body<Q4_NVFP4, Q4_MT / 2, Q4_STAGES>(a); }
KERNEL_q4_gemm_int4_m32 { q4_gemm_body<Q4_INT4, Q4_MT / 2, Q4_STAGES_M32>(a); }
KERNEL_q4_gemm_lloyd_m32 { q4_gemm_body<Q4_LLOYD, Q4_MT / 2, Q4_STAGES_M32>(a); }
KERNEL_q4_gemm_e8p_m32 { q4_gemm_body<Q4_E8P, Q4_MT / 2, Q4_STAGES_M32>(a); }
KERNEL_q4_gemm_rtn_m32 { q4_gemm_body<Q4_RTN, Q4_MT / 2, Q4_STAGES_M32>(a); }

/* Split-K's partials [k_splits][M][N] summed in split order (one thread an output), then the epilogue. */
KERNEL_q4_gemm_reduce {
    pdl_enter();
    const u64 outputs = (u64)a.M * a.N, i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= outputs) return;
    float acc = a.partial[i];
    for (int s = 1; s < a.k_splits; s++) acc += a.partial[(u64)s * outputs + i];
    q4_store(a, (int)(i / a.N), (int)(i % a.N), acc);
}
)DLLM";

/* [kernel table] the sampler module: X(name, attributes, (parameters)). */
#define DLLM__SAMPLER_KERNELS(X) \
    X(conf_partial_kernel, , (sampler_args a, const dllm_step_state *st, conf_partial *out)) \
    X(conf_combine_kernel, , (sampler_args a, const dllm_step_state *st, const conf_partial *parts, int *x0, double *conf, unsigned char *deferred)) \
    X(select_commit, , (int *canvas, dllm_step_state *st, int cand_lo, int row0, const int *x0, const double *conf, const unsigned char *deferred, int mask_id, int *committed, int rule, double threshold, double factor, double eps)) \
    X(row_cutoff_kernel, , (sampler_args a, float *cutoff))
DLLM__SAMPLER_KERNELS(DLLM__KERNEL_SIGNATURE)

/* Token choice on the device. Twins: dllm__choose and dllm__confidence (per row), dllm__select (per step). */
static const char *dllm__src_sampler = DLLM__SOURCE_LINE R"DLLM(
__device__ __forceinline__ int logits_row(const sampler_args &a, int row) { return (a.shift0 ? max(row - 1, 0) : row) + a.lrow0; }

/* Twin: the CPU's CFG combination and logits_eos_inf. lr is a logits row (see logits_row). */
__device__ __forceinline__ float sampler_logit(const sampler_args &a, int lr, int v) {
    if (a.eos_inf && v == a.eos_id) return -DLLM_INF;
    float c = a.cond[(u64)lr * a.vocab + v];
    if (!a.uncond) return c;
    float u = a.uncond[(u64)lr * a.vocab + v];
    // Rounded op by op, never fused into an FMA: the CPU's combination (apply_cfg) rounds each step, and the filters'
    // cutoffs (row_cutoff_kernel) compare these values exactly.
    return __fadd_rn(u, __fmul_rn(a.cfg_weight, __fsub_rn(c, u)));
}

/* sampler_logit after the filters of sampler row `row`. Twin: the logit lambda of dllm__choose. */
__device__ __forceinline__ float kept_logit(const sampler_args &a, int row, int lr, int v) {
    float l = sampler_logit(a, lr, v);
    return a.cutoff && !(l >= a.cutoff[row]) ? -DLLM_INF : l;
}

__device__ __forceinline__ bool better(double s, int i, double bs, int bi) { return s > bs || (s == bs && i < bi); }

__device__ __forceinline__ double conf_inv_temp(const sampler_args &a) { return a.conf_tempered && a.temperature > 0 ? 1.0 / a.temperature : 1.0; }

/* (m1, m2) := the two largest of the multiset {m1, m2, o1, o2}, given m1 >= m2 and o1 >= o2. */
__device__ __forceinline__ void top2_merge(float &m1, float &m2, float o1, float o2) {
    m2 = fmaxf(fminf(m1, o1), fmaxf(m2, o2));
    m1 = fmaxf(m1, o1);
}

/* Pass 1 for one (slice, row): max logit, best token, sum of e^x relative to the slice max; TOP2 adds the second
 * largest logit (MARGIN), ENT the sum of e^x x (ENTROPY). Compile-time, so the default path runs its old loop. */
template <bool TOP2, bool ENT>
__device__ __forceinline__ void conf_partial_slice(const sampler_args &a, const dllm_step_state *st, conf_partial *out) {
    int slice = blockIdx.x, row = blockIdx.y, lr = logits_row(a, row);
    int v0 = slice * a.slice, v1 = min(a.vocab, v0 + a.slice);
    u32 step = (u32)st->global_step, pos = (u32)(a.pos0 + row);
    float mx = -DLLM_INF, second = -DLLM_INF;
    double best = -1.0 / 0.0;
    int best_i = 0x7fffffff;
    for (int v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
        float l = kept_logit(a, row, lr, v);
        if (TOP2) second = fmaxf(second, l > mx ? mx : l);  // the CPU's update: a NaN never enters
        mx = fmaxf(mx, l);
        double score = l;
        if (a.temperature > 0) score = exp((double)l) / pow(-log(uniform01(a.seed, (u32)v, pos, step, 1u)), a.temperature);
        if (better(score, v, best, best_i)) { best = score; best_i = v; }
    }
    __shared__ float s_mx[32], s_second[32];
    __shared__ double s_best[32];
    __shared__ int s_bi[32];
    __shared__ double s_sum[32], s_sum_x[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float omx = __shfl_xor_sync(0xffffffffu, mx, o);
        if (TOP2) top2_merge(mx, second, omx, __shfl_xor_sync(0xffffffffu, second, o));
        else mx = fmaxf(mx, omx);
        double ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (better(ob, oi, best, best_i)) { best = ob; best_i = oi; }
    }
    if (lane == 0) { s_mx[warp] = mx; s_second[warp] = second; s_best[warp] = best; s_bi[warp] = best_i; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nw; w++) {
            if (TOP2) top2_merge(mx, second, s_mx[w], s_second[w]);
            else mx = fmaxf(mx, s_mx[w]);
            if (better(s_best[w], s_bi[w], best, best_i)) { best = s_best[w]; best_i = s_bi[w]; }
        }
        s_mx[0] = mx;
        s_bi[0] = best_i;
        s_best[0] = best;
    }
    __syncthreads();
    mx = s_mx[0];
    const double inv_t = conf_inv_temp(a);
    double sum = 0, sum_x = 0;
    if (mx > -DLLM_INF)
        for (int v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
            double x = ((double)kept_logit(a, row, lr, v) - (double)mx) * inv_t, e = exp(x);
            sum += e;
            if (ENT) sum_x += e > 0 ? e * x : 0.0;  // e = 0 at x = -inf: the term is 0, not NaN
        }
    for (int o = 16; o > 0; o >>= 1) {
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (ENT) sum_x += __shfl_xor_sync(0xffffffffu, sum_x, o);
    }
    if (lane == 0) { s_sum[warp] = sum; s_sum_x[warp] = sum_x; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nw; w++) {
            sum += s_sum[w];
            if (ENT) sum_x += s_sum_x[w];
        }
        conf_partial p;
        p.best_score = s_best[0];
        p.best_idx = s_bi[0];
        p.best_logit = s_bi[0] < a.vocab ? kept_logit(a, row, lr, s_bi[0]) : -DLLM_INF;
        p.max_logit = mx;
        p.second_logit = second;  // thread 0 merged every warp's pair above
        p.sum_exp = sum;
        p.sum_exp_x = sum_x;
        out[(u64)row * a.n_slices + slice] = p;
    }
}

/* Pass 1: one CTA per (slice, row); the confidence decides, once per CTA, which statistics the slice needs. */
KERNEL_conf_partial_kernel {
    pdl_enter();
    if (a.remasking == REMASK_MARGIN) conf_partial_slice<true, false>(a, st, out);
    else if (a.remasking == REMASK_ENTROPY) conf_partial_slice<false, true>(a, st, out);
    else conf_partial_slice<false, false>(a, st, out);
}

/* Block-wide reductions for row_cutoff_kernel: every thread gets the same value, summed in the same order,
 * so the bisection below takes the same branch in every thread (and on every run). */
__device__ double cut_block_sum(double v) {
    __shared__ double s_part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();  // the previous call's readers are done with s_part
    if ((threadIdx.x & 31) == 0) s_part[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += s_part[w];
    return t;
}
__device__ float cut_block_max(float v) {
    __shared__ float s_part[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s_part[threadIdx.x >> 5] = v;
    __syncthreads();
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) v = fmaxf(v, s_part[w]);
    return v;
}

/* Floats in the order of unsigned integers (-inf lowest, +inf highest), and back. */
__device__ __forceinline__ unsigned cut_key(float f) { unsigned u = __float_as_uint(f); return (u & 0x80000000u) ? ~u : (u | 0x80000000u); }
__device__ __forceinline__ float cut_key_float(unsigned k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

/* Over the row's non-NaN logits l >= the float of key k: their count (mass = false) or sum of e^x
 * (mass = true), x = (l - mx) inv_t. */
__device__ double cut_measure(const sampler_args &a, int lr, unsigned k, bool mass, float mx, double inv_t) {
    double acc = 0;
    for (int v = threadIdx.x; v < a.vocab; v += blockDim.x) {
        float l = sampler_logit(a, lr, v);
        if (l == l && cut_key(l) >= k) acc += mass ? exp(((double)l - (double)mx) * inv_t) : 1.0;
    }
    return cut_block_sum(acc);
}

/* The largest key k whose measure is >= target (32 halvings of the key range): the key of a logit of the
 * row, since the measure only changes at those. Needs measure(0) >= target. */
__device__ unsigned cut_bisect(const sampler_args &a, int lr, bool mass, double target, float mx, double inv_t) {
    unsigned long long lo = 0, hi = 1ull << 32;  // measure(lo) >= target; hi is past every key
    while (hi - lo > 1) {
        unsigned long long mid = (lo + hi) / 2;
        if (cut_measure(a, lr, (unsigned)mid, mass, mx, inv_t) >= target) lo = mid;
        else hi = mid;
    }
    return (unsigned)lo;
}

/* The filters' cutoff logit of each sampler row (one CTA per row): a logit is kept iff it is >= the cutoff.
 * The largest of top-k's k-th largest logit, top-p's largest logit whose mass of logits >= it reaches
 * top_p * Z, min-p's smallest logit with e^x >= min_p. Twin: dllm__row_cutoff. */
KERNEL_row_cutoff_kernel {
    pdl_enter();
    const int row = blockIdx.x, lr = logits_row(a, row);
    float mx = -DLLM_INF;
    for (int v = threadIdx.x; v < a.vocab; v += blockDim.x) mx = fmaxf(mx, sampler_logit(a, lr, v));  // fmaxf drops NaN
    mx = cut_block_max(mx);
    float cut = -DLLM_INF;
    const double inv_t = a.temperature > 0 ? 1.0 / a.temperature : 1.0;
    if (a.top_k > 0 && cut_measure(a, lr, 0u, false, mx, inv_t) >= a.top_k) cut = fmaxf(cut, cut_key_float(cut_bisect(a, lr, false, a.top_k, mx, inv_t)));
    if (mx > -DLLM_INF && a.top_p > 0 && a.top_p < 1) {
        double z = cut_measure(a, lr, 0u, true, mx, inv_t);
        cut = fmaxf(cut, cut_key_float(cut_bisect(a, lr, true, (double)a.top_p * z, mx, inv_t)));
    }
    if (mx > -DLLM_INF && a.min_p > 0) {
        float smallest = mx;
        for (int v = threadIdx.x; v < a.vocab; v += blockDim.x) {
            float l = sampler_logit(a, lr, v);
            if (l == l && exp(((double)l - (double)mx) * inv_t) >= (double)a.min_p) smallest = fminf(smallest, l);
        }
        cut = fmaxf(cut, -cut_block_max(-smallest));
    }
    if (threadIdx.x == 0) cutoff[row] = cut;
}

/* The ranking key from a row's softmax statistics (z, zx, and the x of x0 and of the second largest logit).
 * Twin: dllm__confidence. */
__device__ __forceinline__ double row_confidence(const sampler_args &a, double z, double zx, double x_best, double x_second, u32 pos, u32 step) {
    double c;
    if (a.remasking == REMASK_RANDOM) c = uniform01(a.seed, 0u, pos, step, 2u);
    else if (a.remasking == REMASK_ORIGIN) c = -uniform01(a.seed, 0u, pos, step, 5u);
    else if (a.remasking == REMASK_MARGIN) c = -expm1(x_second) / z;
    else if (a.remasking == REMASK_ENTROPY) c = zx / z - log(z);
    else c = exp(x_best) / z;
    if (c != c) c = -1.0 / 0.0;
    if (a.alg_temp > 0) c = c / a.alg_temp - log(-log(uniform01(a.seed, 0u, pos, step, 6u)));
    return c;
}

/* Pass 2: one thread per row merges the slices in order: x0, ranking key (float64), deferral flag. A slice's sums
 * move from its max m_s to the row's m with d_s = (m_s - m) inv_t: Z = sum_s e^d_s Z_s, and for ENTROPY
 * sum e^x x = sum_s e^d_s (S_s + d_s Z_s), since x = x_s + d_s. */
KERNEL_conf_combine_kernel {
    pdl_enter();
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= a.n_rows) return;
    const conf_partial *p = parts + (u64)row * a.n_slices;
    float mx = -DLLM_INF, second = -DLLM_INF;
    double best = -1.0 / 0.0;
    int bi = 0x7fffffff;
    float bl = -DLLM_INF;
    for (int s = 0; s < a.n_slices; s++) {
        top2_merge(mx, second, p[s].max_logit, p[s].second_logit);
        if (better(p[s].best_score, p[s].best_idx, best, bi)) { best = p[s].best_score; bi = p[s].best_idx; bl = p[s].best_logit; }
    }
    const double inv_t = conf_inv_temp(a);
    double z = 0, zx = 0;
    for (int s = 0; s < a.n_slices; s++)
        if (p[s].max_logit > -DLLM_INF) {
            double d = ((double)p[s].max_logit - (double)mx) * inv_t, w = exp(d);
            z += p[s].sum_exp * w;
            zx += w * (p[s].sum_exp_x + d * p[s].sum_exp);
        }
    double c = row_confidence(a, z, zx, ((double)bl - (double)mx) * inv_t, ((double)second - (double)mx) * inv_t, (u32)(a.pos0 + row),
                              (u32)st->global_step);
    if (bi >= a.vocab) bi = 0;
    x0[row] = bi;
    conf[row] = c;
    deferred[row] = a.defer_eos_eot && (bi == a.eos_id || bi == a.eot_id);
}

/* Twin: dllm__timestep_fraction, the same operations in the same order. */
__device__ __forceinline__ double timestep_fraction(int i, int s, double eps) {
    if (i >= s - 1) return 1.0;
    double t = 1.0 - (1.0 - eps) * i / s, u = 1.0 - (1.0 - eps) * (i + 1) / s;
    return 1.0 - u / t;
}

/* Commits the step's candidates (masked positions in [cand_lo, block_end)) by rank: non-deferred first,
 * then higher key, then lower position. How many: the ranks before the first that fails the rule (rule 0
 * schedule: rank < k with k = n/s, +1 for the first n%s steps; 1 threshold; 2 factor; 3 Dream's timesteps:
 * rank < floor(candidates left * fraction); twin: dllm__passes). Rule 4, ORIGIN, needs no ranking: a candidate
 * commits when its draw (minus its key) is below the step's fraction. One CTA; each candidate's rank is counted
 * directly, which is deterministic and cheap for block-sized sets. Also counts the masks left in the block
 * (threshold decoding loops on it). */
KERNEL_select_commit {
    pdl_enter();
    // No static shared memory: the host grants the dynamic part the whole opt-in limit.
    extern __shared__ int rank_of[];  // [n] rank of each candidate (n: not a candidate), then [n] pass flags by rank
    int lo = cand_lo, hi = st->block_end, n = hi - lo, n_cand = 0;
    unsigned char *pass = (unsigned char *)(rank_of + n);
    for (int i0 = 0; i0 < n; i0 += blockDim.x) {  // the same trip count in every thread: all reach the barrier
        int i = i0 + threadIdx.x;
        bool masked = i < n && canvas[lo + i] == mask_id;
        if (i < n) {
            rank_of[i] = masked ? 0 : n;
            pass[i] = 0;
        }
        n_cand += __syncthreads_count(masked);
    }
    __syncthreads();
    int s = st->steps_per_block, i_step = st->step_in_block, nm = st->n_block_masks;
    const double frac = timestep_fraction(i_step, s, eps);
    const bool counted = rule == 0 || rule == 3;
    int k = rule == 0 ? nm / s + (i_step < nm % s ? 1 : 0) : rule == 3 ? (int)floor(n_cand * frac) : n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        if (rank_of[i] == n) continue;
        int r = lo + i - row0;
        unsigned char di = deferred[r];
        double ci = conf[r];
        if (rule == 4) {  // every transferring candidate is rank 0 and rank 0 passes, so all of them commit
            if (-ci < frac) pass[0] = 1;
            else rank_of[i] = n;
            continue;
        }
        int rank = 0;
        // rank_of[j] is read only to tell whether j is a candidate, which another thread's write of j's rank (< n) never
        // changes: compute-sanitizer's racecheck lists these reads as potential WAR hazards (warnings), never errors.
        for (int j = 0; j < n && rank < k; j++) {
            if (rank_of[j] == n || j == i) continue;
            int rj = lo + j - row0;
            unsigned char dj = deferred[rj];
            double cj = conf[rj];
            rank += dj != di ? !dj : (cj != ci ? cj > ci : j < i);
        }
        if (rank < k) pass[rank] = counted || rank == 0 || (!di && ci >= (rule == 1 ? threshold : 1.0 - factor / (rank + 2))) ? 1 : 2;
        rank_of[i] = rank;  // only this thread reads or writes slot i from here on
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int take = 0, c = 0, left = 0;
        while (take < n && pass[take] == 1) take++;
        for (int i = 0; i < n; i++) {
            int p = lo + i;
            if (rank_of[i] < take) {
                canvas[p] = x0[p - row0];
                committed[c++] = p;
            } else if (p >= st->block_begin && canvas[p] == mask_id) {
                left++;
            }
        }
        st->n_committed = c;
        st->n_block_left = left;
        st->step_in_block++;
        st->global_step++;
    }
}
)DLLM";

/* FlashAttention forward, bidirectional, with a key-padding mask and GQA; mma.sync m16n8k16 BF16 with
 * FP32 accumulation (sm_80+). Twin: dllm__cpu_attention.
 * Compile-time: HD (head dim), BR (query rows per CTA), BC (keys per tile), MT (m16 tiles per warp).
 * KV tiles are visited in the order [0, late_lo) ++ [late_hi, T) ++ [late_lo, late_hi): the tiles that
 * overlap the current block come last. The plain forward and LaCache's FACache use this same order,
 * so a cached online-softmax state is exactly the prefix of the uncached computation. */
static const char *dllm__src_attention = DLLM__SOURCE_LINE R"DLLM(
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}


__device__ __forceinline__ int kv_tile_at(int i, int n_tiles, int lo, int hi) {
    int head = lo, mid = n_tiles - hi;
    return i < head ? i : (i < head + mid ? i - head + hi : i - head - mid + lo);
}

/* flash_attn computes on head dimensions rounded up to a multiple of 16 (the k16 of an mma, and the pairs of 8-column
 * groups ldmatrix x4 loads): the extra columns of the Q, K and V tiles are zeros, so they add nothing to a score or
 * to an output column, and are never stored. 64 and 128 are their own padding (the same code as without it). */
__device__ constexpr int hd_pad(int hd) { return (hd + 15) / 16 * 16; }

/* A ROWS x HD tile from global rows row0.. (stride elements apart; rows at or past n_valid read as zeros) into shared
 * rows hd_pad(HD) + 8 apart, the padding columns zero-filled too, copied by THREADS threads. Where a row's chunks
 * divide THREADS, a thread keeps one 16-byte chunk column and steps STEP rows a pass: with the pass count known at
 * compile time a copy costs a few integer instructions (a generic loop over chunk indices took ~30 a copy). Other
 * head dims (40, 72, 96, ...) take that generic loop, chunk indices divided by a compile-time constant. */
template <int HD, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(bf16_t *dst, const bf16_t *src, int stride, int row0, int n_valid) {
    constexpr int HDP = hd_pad(HD), LD = HDP + 8, CH = HDP / 8;
    if constexpr (THREADS % CH == 0) {
        constexpr int STEP = THREADS / CH, PASSES = (ROWS + STEP - 1) / STEP;
        const int chunk = threadIdx.x % CH, r0 = threadIdx.x / CH;
        const bool real = HDP == HD || chunk < HD / 8;
        const u32 d0 = smem_u32(dst + r0 * LD + chunk * 8);
        const bf16_t *s0 = src + (u64)(row0 + r0) * stride + chunk * 8;
        #pragma unroll
        for (int p = 0; p < PASSES; p++) {
            if (ROWS % STEP != 0 && r0 + p * STEP >= ROWS) break;  // a tile shorter than a pass
            const bool ok = real && row0 + r0 + p * STEP < n_valid;
            cp_async16(d0 + p * STEP * LD * 2, ok ? s0 + (u64)p * STEP * stride : src, ok);
        }
    } else {
        constexpr int CHUNKS = ROWS * CH, PASSES = (CHUNKS + THREADS - 1) / THREADS;
        const u32 d0 = smem_u32(dst);
        #pragma unroll 1  // unrolled, the addresses of every pass stay live: spills at head dims 232 and 240
        for (int p = 0; p < PASSES; p++) {
            const int i = threadIdx.x + p * THREADS, r = i / CH, chunk = i % CH;
            if (CHUNKS % THREADS != 0 && i >= CHUNKS) break;
            const bool ok = chunk < HD / 8 && row0 + r < n_valid;
            cp_async16(d0 + (r * LD + chunk * 8) * 2, ok ? src + (u64)(row0 + r) * stride + chunk * 8 : src, ok);
        }
    }
}

/* The i-th K and V tiles of the visiting order (key tile `tile`) into ring slot i % NS. */
template <int HD, int BC, int NS, int THREADS>
__device__ __forceinline__ void load_kv(bf16_t *sK, bf16_t *sV, const bf16_t *K, const bf16_t *V, const attn_args &a, int i, int tile) {
    constexpr int LD = hd_pad(HD) + 8;
    load_tile<HD, BC, THREADS>(sK + ((unsigned)i % NS) * BC * LD, K, a.kv_stride, tile * BC, a.seq);
    load_tile<HD, BC, THREADS>(sV + ((unsigned)i % NS) * BC * LD, V, a.kv_stride, tile * BC, a.seq);
}

/* Saves (SAVE) or restores the online-softmax registers of one thread: m, l (per-thread partial sums) and
 * the unnormalised O, field by field so that consecutive threads touch consecutive words. Only O's HD real
 * columns (DT = HD / 8 of the hd_pad(HD) / 8 groups): the padding columns stay zero. */
template <int HD, int MT, int THREADS, bool SAVE>
__device__ __forceinline__ void fa_state_io(const attn_args &a, float (&o)[MT][hd_pad(HD) / 8][4], float (&m)[MT][2], float (&l)[MT][2]) {
    constexpr int DT = HD / 8;
    // Computed here, not kept live across the KV loop: registers are the budget at head dim 128.
    float *state = a.fa_state + ((u64)(blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * (MT * (4 + DT * 4) * THREADS) + threadIdx.x;
    int f = 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (SAVE) { state[(f++) * THREADS] = m[mt][r]; state[(f++) * THREADS] = l[mt][r]; }
            else { m[mt][r] = state[(f++) * THREADS]; l[mt][r] = state[(f++) * THREADS]; }
        }
#pragma unroll
        for (int d = 0; d < DT; d++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (SAVE) state[(f++) * THREADS] = o[mt][d][e];
                else o[mt][d][e] = state[(f++) * THREADS];
            }
    }
}

/* The KV tiles [i_begin, i_end) of the visiting order this CTA streams: all of them, those after the
 * cached early tiles (FACache resume), or one contiguous share of them (split-KV). */
__device__ __forceinline__ void kv_range(const attn_args &a, int split, int n_tiles, int n_early, bool resume, int &i_begin, int &i_end) {
    i_begin = resume ? n_early : 0;
    i_end = n_tiles;
    if (a.kv_splits > 1) {
        const int per = (n_tiles + a.kv_splits - 1) / a.kv_splits;
        i_begin = min(n_tiles, split * per);
        i_end = min(n_tiles, i_begin + per);
    }
}

/* Split-KV: a CTA's unnormalised output, running max and normaliser per query row, for attn_combine.
 * Layout: [batch][head][split][q_rows][HD + 2] floats (O's HD real columns, then m, then l). */
template <int HD, int MT, int DT>
__device__ __forceinline__ void store_partial(const attn_args &a, int b, int h, int split, int q0, int warp, int g, int t,
                                              float (&o)[MT][DT][4], float (&m)[MT][2], float (&l)[MT][2]) {
    float *P = a.partial + (((u64)b * gridDim.y + h) * a.kv_splits + split) * a.q_rows * (HD + 2);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lr = l[mt][r];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            const int row = q0 + (warp * MT + mt) * 16 + g + 8 * r;
            if (row >= a.q_rows) continue;
            float *p = P + (u64)row * (HD + 2);
#pragma unroll
            for (int d = 0; d < HD / 8; d++) *(float2 *)(p + d * 8 + 2 * t) = make_float2(o[mt][d][2 * r], o[mt][d][2 * r + 1]);
            if (t == 0) p[HD] = m[mt][r], p[HD + 1] = lr;
        }
}

/* 2^x on the special-function unit, subnormal results flushed to zero: exp2f's subnormal handling costs
 * extra instructions per score, and a probability below 2^-126 of the row's largest adds nothing. */
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* The scores of one m16 row pair in the mma accumulator layout, s[j][e]: row g + 8 (e >> 1), key k0 + 8j + 2t + (e & 1)
 * (a wgmma accumulator has the same layout, 16 rows per warp). The helpers below are the online softmax both
 * attention kernels share. Keys past seq or padded out (valid: null or this sequence's flags) get -inf. */
template <int NT>
__device__ __forceinline__ void mask_keys(float (&s)[NT][4], const unsigned char *valid, int seq, int k0, int t) {
    #pragma unroll
    for (int j = 0; j < NT; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = k0 + j * 8 + 2 * t + (e & 1);
            if (key >= seq || (valid && !valid[key])) s[j][e] = -DLLM_INF;
        }
}

/* [block-causal mask] Block diffusion's (a.mask_block > 0): query row `row` (sequence index q_index0 + row) sees the keys
 * before the end of its block of mask_block indices. Twin: dllm__cpu_attention's n_visible. */
__device__ __forceinline__ int visible_keys(const attn_args &a, int row) {
    return min(a.seq, ((a.q_index0 + row) / a.mask_block + 1) * a.mask_block);
}
/* mask_keys with a key limit per row of the m16 pair (rows g and g + 8): keys at or past end0 / end1 get -inf. */
template <int NT>
__device__ __forceinline__ void mask_keys_rows(float (&s)[NT][4], const unsigned char *valid, int end0, int end1, int k0, int t) {
    #pragma unroll
    for (int j = 0; j < NT; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = k0 + j * 8 + 2 * t + (e & 1);
            if (key >= (e >> 1 ? end1 : end0) || (valid && !valid[key])) s[j][e] = -DLLM_INF;
        }
}

/* The online-softmax update of rows g and g + 8 over one tile of scores, in two halves. softmax_scores: the running
 * max m (scaled, log2 domain), the per-thread partial normaliser l and the correction corr that rescales what was
 * accumulated under the old max; the scores become their unnormalised probabilities. Scores stay unscaled until the
 * exponent, where one FFMA applies scale and max. rescale_o: the unnormalised output o times corr. flash_attn_wg runs
 * the two apart (o is in flight in a wgmma between them); the order of operations on o is the same either way. */
template <int NT>
__device__ __forceinline__ void softmax_scores(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&corr)[2], float scale) {
    float mx0 = -DLLM_INF, mx1 = -DLLM_INF;
    #pragma unroll
    for (int j = 0; j < NT; j++) {
        mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
        mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    #pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    const float n0 = fmaxf(m[0], mx0 * scale), n1 = fmaxf(m[1], mx1 * scale);
    const float base0 = n0 == -DLLM_INF ? 0.f : n0, base1 = n1 == -DLLM_INF ? 0.f : n1;
    corr[0] = exp2_ftz(m[0] - base0);
    corr[1] = exp2_ftz(m[1] - base1);
    m[0] = n0;
    m[1] = n1;
    l[0] *= corr[0];
    l[1] *= corr[1];
    #pragma unroll
    for (int j = 0; j < NT; j++) {
        s[j][0] = exp2_ftz(fmaf(s[j][0], scale, -base0));
        s[j][1] = exp2_ftz(fmaf(s[j][1], scale, -base0));
        s[j][2] = exp2_ftz(fmaf(s[j][2], scale, -base1));
        s[j][3] = exp2_ftz(fmaf(s[j][3], scale, -base1));
        l[0] += s[j][0] + s[j][1];
        l[1] += s[j][2] + s[j][3];
    }
}

template <int DT>
__device__ __forceinline__ void rescale_o(float (&o)[DT][4], const float (&corr)[2]) {
    // Once the running max settles, most tiles leave it unchanged: corr is then exactly 1 and the
    // rescale of O (128 multiplies per thread at head dim 128) is skipped, which changes no bit.
    if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
        #pragma unroll
        for (int d = 0; d < DT; d++) {
            o[d][0] *= corr[0]; o[d][1] *= corr[0];
            o[d][2] *= corr[1]; o[d][3] *= corr[1];
        }
    }
}

template <int NT, int DT>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&o)[DT][4], float scale) {
    float corr[2];
    softmax_scores<NT>(s, m, l, corr, scale);
    rescale_o<DT>(o, corr);
}

/* Keys 16 kk .. 16 kk + 15 of the probabilities as a bf16 A fragment: (g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8). */
template <int NT>
__device__ __forceinline__ void pack_p(const float (&s)[NT][4], int kk, u32 (&pa)[4]) {
    pa[0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
    pa[1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
    pa[2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

/* One warp, one KV tile of BC keys: S = Q K^T, the online-softmax update, O += P V. Keys past the
 * sequence or padded out are masked; full tiles without a padding mask (nearly all) skip that test.
 * HD here is the padded head dimension (a multiple of 16) the shared tiles are laid out for; row0 is the warp's first
 * query row (the block-causal mask's rows). */
template <int HD, int BC, int MT>
__device__ __forceinline__ void flash_tile(const attn_args &a, int b, u32 q_warp, u32 k_s, u32 v_s, int k0, int row0, int lane, int t,
                                           float (&o)[MT][HD / 8][4], float (&m)[MT][2], float (&l)[MT][2]) {
    constexpr int LD = HD + 8, NT = BC / 8, KS = HD / 16, DT = HD / 8;  // LD in elements; addresses advance 2 bytes each
    float s[MT][NT][4];
    #pragma unroll
    for (int mt = 0; mt < MT; mt++)
        #pragma unroll
        for (int j = 0; j < NT; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
    #pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        u32 qf[MT][4];
        #pragma unroll
        for (int mt = 0; mt < MT; mt++) ldmatrix_x4(qf[mt], q_warp + (mt * 16 * LD + kk * 16) * 2);
        #pragma unroll
        for (int j = 0; j < NT; j += 2) {
            u32 kb[4];
            ldmatrix_x4(kb, k_s + ((j * 8 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8) * 2);
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_bf16(s[mt][j], qf[mt], kb[0], kb[1]);
                mma_bf16(s[mt][j + 1], qf[mt], kb[2], kb[3]);
            }
        }
    }
    if (a.key_valid || k0 + BC > a.seq || a.mask_block) {
        const unsigned char *valid = a.key_valid ? a.key_valid + (u64)b * a.seq : 0;
        #pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int row = row0 + mt * 16 + (lane >> 2);
            mask_keys_rows<NT>(s[mt], valid, a.mask_block ? visible_keys(a, row) : a.seq, a.mask_block ? visible_keys(a, row + 8) : a.seq, k0, t);
        }
    }
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) online_softmax<NT, DT>(s[mt], m[mt], l[mt], o[mt], a.scale_log2);
    #pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) {
        u32 pa[MT][4];
        #pragma unroll
        for (int mt = 0; mt < MT; mt++) pack_p<NT>(s[mt], kk, pa[mt]);
        #pragma unroll
        for (int d = 0; d < DT; d += 2) {
            u32 vb[4];
            ldmatrix_x4_trans(vb, v_s + ((kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + d * 8 + (lane >> 4) * 8) * 2);
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_bf16(o[mt][d], pa[mt], vb[0], vb[1]);
                mma_bf16(o[mt][d + 1], pa[mt], vb[2], vb[3]);
            }
        }
    }
}

/* [varlen] A batched forward's attention: CTA z works on sequence z of a concatenation, its queries rows [q_offsets[z], q_offsets[z + 1])
 * of q and o, its keys rows [kv_offsets[z], kv_offsets[z + 1]) of k and v. a becomes that sequence's arguments as a launch
 * of batch 1 would hold them, so its bits never depend on the other sequences (no split-KV, no FACache, no key mask:
 * dllm__attn_varlen_launch). False: the CTA's query tile lies past the sequence's rows (the grid fits the longest). */
__device__ __forceinline__ bool varlen_sequence(attn_args &a, int br) {
    const int z = blockIdx.z, q0 = a.q_offsets[z], k0 = a.kv_offsets[z];
    a.q_rows = a.q_offsets[z + 1] - q0, a.seq = a.kv_offsets[z + 1] - k0;
    a.q += (u64)q0 * a.q_stride, a.o += (u64)q0 * a.o_stride;
    a.k += (u64)k0 * a.kv_stride, a.v += (u64)k0 * a.kv_stride;
    a.q_bstride = a.o_bstride = 0;
    if (a.varlen_masks) a.mask_block = a.varlen_masks[2 * z], a.q_index0 = a.varlen_masks[2 * z + 1];  // [block-causal mask]
    return (int)blockIdx.x * br < a.q_rows;
}

/* Any head dim HD that is a multiple of 8 up to 256, computed on hd_pad(HD) columns (tiles per head dim:
 * dllm__attn_tiles). Each warp owns MT m16 tiles (16 * MT query rows), so every K and V fragment it loads from shared
 * memory feeds MT tensor-core ops (FA2's layout). Q fragments are re-read from shared memory at each
 * k-step rather than held in registers: that keeps HD = 128 with MT = 2 under 255 registers. The online
 * softmax is online_softmax's (softmax_scores, then rescale_o), shared with flash_attn_wg. VARLEN (varlen_sequence): one
 * more instantiation, in its own module loaded by the first batched forward, so the solo paths' code stays as it was. */
template <int HD, int BR, int BC, int MT, int NS, bool VARLEN = false>
__global__ void __launch_bounds__(BR * 2 / MT) flash_attn(attn_args a) {
    pdl_enter();
    if constexpr (VARLEN) {
        if (!varlen_sequence(a, BR)) return;
    }
    // Two m16 tiles per warp hold the scores of only 32 keys in registers at head dim 128: a larger tile
    // (fewer barriers per key) is computed in 32-key slices, in key order.
    constexpr int HDP = hd_pad(HD), LD = HDP + 8, DT = HDP / 8, THREADS = BR * 2 / MT, SUB = BC > 32 && MT > 1 ? 32 : BC;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16_t *sQ = (bf16_t *)smem, *sK = sQ + BR * LD, *sV = sK + NS * BC * LD;  // a ring of NS K and V tiles
    const int qt = blockIdx.x, h = blockIdx.y, b = VARLEN ? 0 : blockIdx.z / a.kv_splits, split = VARLEN ? 0 : blockIdx.z % a.kv_splits;
    const int kvh = h / a.group;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int q0 = qt * BR, n_tiles = (a.seq + BC - 1) / BC;
    const bf16_t *Q = a.q + b * a.q_bstride + h * HD;
    const bf16_t *K = a.k + (u64)b * a.seq * a.kv_stride + kvh * HD;
    const bf16_t *V = a.v + (u64)b * a.seq * a.kv_stride + kvh * HD;
    int late_lo = 0, late_hi = 0;
    if (a.st && a.st->block_end > a.st->block_begin) {
        late_lo = a.st->block_begin / BC;
        late_hi = min(n_tiles, (a.st->block_end + BC - 1) / BC);
    }
    // FACache (LaCache, Algorithm 1): a query tile outside the block keeps, across the block's steps, its
    // state over the KV tiles outside the block. Saved and restored register for register, so resuming
    // continues exactly the computation the plain order performs.
    const int n_early = n_tiles - (late_hi - late_lo);
    const bool q_in_block = late_hi > late_lo && q0 < a.st->block_end && q0 + BR > a.st->block_begin;
    const bool cached = a.fa_mode != 0 && !q_in_block;
    int i_begin, i_end;
    kv_range(a, split, n_tiles, n_early, cached && a.fa_mode == 2, i_begin, i_end);
    // [block-causal mask] In the plain order the key tiles past the query tile's last visible key hold no visible key:
    // not visited (a fully masked tile changes no register of the online softmax, so this changes no bit).
    if (a.mask_block && late_hi == late_lo) i_end = max(i_begin, min(i_end, (visible_keys(a, min(q0 + BR, a.q_rows) - 1) + BC - 1) / BC));

    load_tile<HD, BR, THREADS>(sQ, Q, a.q_stride, q0, a.q_rows);
    cp_async_commit();
    #pragma unroll
    for (int s = 0; s < NS - 1; s++) {
        if (i_begin + s < i_end) load_kv<HD, BC, NS, THREADS>(sK, sV, K, V, a, i_begin + s, kv_tile_at(i_begin + s, n_tiles, late_lo, late_hi));
        cp_async_commit();
    }

    float o[MT][DT][4];
    float m[MT][2], l[MT][2];
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        #pragma unroll
        for (int d = 0; d < DT; d++) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.f;
        m[mt][0] = m[mt][1] = -DLLM_INF;
        l[mt][0] = l[mt][1] = 0.f;
    }
    if (cached && a.fa_mode == 2) fa_state_io<HD, MT, THREADS, false>(a, o, m, l);
    if (cached && a.fa_mode == 1 && n_early == 0) fa_state_io<HD, MT, THREADS, true>(a, o, m, l);
    const u32 q_warp = smem_u32(sQ + (warp * 16 * MT + (lane & 15)) * LD + (lane >> 4) * 8);
    // A warp whose rows are all past the last query (a short K/V-cache step) only helps load tiles.
    const bool live = q0 + warp * 16 * MT < a.q_rows;

    for (int i = i_begin; i < i_end; i++) {
        const int stage = (int)((unsigned)i % NS);
        if (i + NS - 1 < i_end)  // into the slot of tile i - 1, which every warp is done with
            load_kv<HD, BC, NS, THREADS>(sK, sV, K, V, a, i + NS - 1, kv_tile_at(i + NS - 1, n_tiles, late_lo, late_hi));
        cp_async_commit();
        cp_async_wait<NS - 1>();
        __syncthreads();
        const u32 k_s = smem_u32(sK + stage * BC * LD), v_s = smem_u32(sV + stage * BC * LD);
        const int k0 = kv_tile_at(i, n_tiles, late_lo, late_hi) * BC;
        if (live)
            #pragma unroll 1
            for (int sub = 0; sub < BC; sub += SUB)  // not unrolled: two slices in flight would not fit the registers
                flash_tile<HDP, SUB, MT>(a, b, q_warp, k_s + sub * LD * 2, v_s + sub * LD * 2, k0 + sub, q0 + warp * 16 * MT, lane, t, o, m, l);
        if (cached && a.fa_mode == 1 && i == n_early - 1) fa_state_io<HD, MT, THREADS, true>(a, o, m, l);
        __syncthreads();
    }

    if (a.kv_splits > 1) {
        store_partial<HD, MT, DT>(a, b, h, split, q0, warp, g, t, o, m, l);
        return;
    }
    bf16_t *O = a.o + b * a.o_bstride + h * HD;
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float l0 = l[mt][0], l1 = l[mt][1];
        #pragma unroll
        for (int x = 1; x <= 2; x <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, x);
            l1 += __shfl_xor_sync(0xffffffffu, l1, x);
        }
        const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
        const int r0 = q0 + (warp * MT + mt) * 16 + g, r1 = r0 + 8;
        #pragma unroll
        for (int d = 0; d < HD / 8; d++) {  // the real columns
            int col = d * 8 + 2 * t;
            if (r0 < a.q_rows) *(u32 *)(O + (u64)r0 * a.o_stride + col) = pack_bf16x2(o[mt][d][0] * inv0, o[mt][d][1] * inv0);
            if (r1 < a.q_rows) *(u32 *)(O + (u64)r1 * a.o_stride + col) = pack_bf16x2(o[mt][d][2] * inv1, o[mt][d][3] * inv1);
        }
    }
}

/* Split-KV: merges the kv_splits partial states of one query row and head, in split order (fixed, so the
 * result does not depend on scheduling). One thread per output column. */
template <int HD>
__global__ void __launch_bounds__(HD) attn_combine(attn_args a) {
    pdl_enter();
    const int row = blockIdx.x, h = blockIdx.y, b = blockIdx.z, d = threadIdx.x;
    const float *P = a.partial + ((u64)b * gridDim.y + h) * a.kv_splits * a.q_rows * (HD + 2) + (u64)row * (HD + 2);
    const u64 split_stride = (u64)a.q_rows * (HD + 2);
    float mx = -DLLM_INF;
    for (int s = 0; s < a.kv_splits; s++) mx = fmaxf(mx, P[s * split_stride + HD]);
    float acc = 0.f, l = 0.f;
    for (int s = 0; s < a.kv_splits; s++) {
        const float ms = P[s * split_stride + HD];
        if (ms == -DLLM_INF) continue;  // a share with no visible key
        const float w = exp2_ftz(ms - mx);
        acc += w * P[s * split_stride + d];
        l += w * P[s * split_stride + HD + 1];
    }
    a.o[b * a.o_bstride + (u64)row * a.o_stride + h * HD + d] = f32_to_bf16(l > 0.f ? acc / l : 0.f);
}
)DLLM";

/* Hopper's building blocks (sm_90a), shared by flash_attn_wg and gemm_wg: wgmma on shared-memory operands in the
 * 128-byte swizzle, TMA tensor copies and the mbarriers they complete on. A tile sits in shared memory as TMA writes
 * it (CU_TENSOR_MAP_SWIZZLE_128B) and wgmma reads it: rows of 64 bf16 (128 bytes), 16-byte chunk c of row r at chunk
 * c ^ (r % 8), 8-row atoms of 1024 bytes. */
static const char *dllm__src_hopper = DLLM__SOURCE_LINE R"DLLM(
#define WG_ACC8(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WG_ACC_N64(d) WG_ACC8(d, 0), WG_ACC8(d, 1), WG_ACC8(d, 2), WG_ACC8(d, 3), WG_ACC8(d, 4), WG_ACC8(d, 5), WG_ACC8(d, 6), WG_ACC8(d, 7)
#define WG_ACC_N128(d) WG_ACC_N64(d), WG_ACC8(d, 8), WG_ACC8(d, 9), WG_ACC8(d, 10), WG_ACC8(d, 11), WG_ACC8(d, 12), WG_ACC8(d, 13), \
    WG_ACC8(d, 14), WG_ACC8(d, 15)
#define WG_ACC_N256(d) WG_ACC_N128(d), WG_ACC8(d, 16), WG_ACC8(d, 17), WG_ACC8(d, 18), WG_ACC8(d, 19), WG_ACC8(d, 20), \
    WG_ACC8(d, 21), WG_ACC8(d, 22), WG_ACC8(d, 23), WG_ACC8(d, 24), WG_ACC8(d, 25), WG_ACC8(d, 26), WG_ACC8(d, 27), WG_ACC8(d, 28), WG_ACC8(d, 29), \
    WG_ACC8(d, 30), WG_ACC8(d, 31)
#define WG_REGS32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_REGS64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_REGS128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

/* Shared-memory matrix descriptor, 128-byte swizzle: start address, the stride of 8-row groups (1024 bytes) and,
 * for an MN-major operand wider than 64, the distance of its 64-column blocks (K-major operands ignore it). */
__device__ __forceinline__ u64 wg_desc(u32 addr, u32 block_stride = 1024) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(block_stride >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

/* Accumulators are the mma layout's n8 chunks, d[j][e] (see mask_keys), N / 8 of them for a 64 x N product.
 * d = (accumulate ? d : 0) + A (64 x 16, shared) . B (N x 16, shared, K-major)^T. N = 128 where a product is 128
 * wide: one instruction instead of two, 56.6 against 58.1 us at 1024 x 1024 on an H200; 256 for gemm_wg's tile. */
template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], u64 desc_a, u64 desc_b, int accumulate) {
    if constexpr (N == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_REGS32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                     : WG_ACC_N64(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    else if constexpr (N == 128)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_REGS64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                     : WG_ACC_N128(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " WG_REGS128 ", %128, %129, p, 1, 1, 0, 0;\n}\n"
                     : WG_ACC_N256(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* A tensor map (CUtensorMap, built on the host by cuTensorMapEncodeTiled) as a kernel parameter: a
 * [batch][rows][row width] bf16 tensor read in boxes of 64 columns (128 bytes) x rows in the 128-byte swizzle, rows
 * and columns past the tensor read as zeros (dllm__tensor_map). */
struct __align__(64) tensor_map { u64 opaque[16]; };

/* mbarriers (shared memory, 8 bytes each): the TMA copies complete a transaction count on one, consumers arrive on
 * another when they are done with a slot. Waits spin on the phase parity. */
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count)); }
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory"); }
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile("{\n.reg .pred done;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra WAIT;\n}\n" ::"r"(bar), "r"(parity)
                 : "memory");
}

/* One TMA box of map at (column x, row y, batch z) into shared memory at dst, completing on bar. */
__device__ __forceinline__ void tma_load(u32 dst, const tensor_map &map, int x, int y, int z, u32 bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(dst), "l"((u64)&map), "r"(x), "r"(y), "r"(z), "r"(bar) : "memory");
}

/* Waits until at most PENDING of the warpgroup's committed wgmma groups are in flight (they complete in order), then
 * ties the registers the awaited one wrote to this point of the program: without that the compiler, which sees them
 * as written by the issuing asm, may read them before the wait. */
template <int PENDING, int N>
__device__ __forceinline__ void wg_wait_for(float (&d)[N][4]) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
    #pragma unroll
    for (int j = 0; j < N; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[j][e])::"memory");
}

__device__ __forceinline__ void named_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
)DLLM";

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
static const char *dllm__src_attention_wgmma = DLLM__SOURCE_LINE R"DLLM(
/* d += A (64 x 16, registers) . B (16 x N, shared, MN-major: transposed) */
template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const u32 (&a)[4], u64 desc_b) {
    if constexpr (N == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_REGS32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                     : WG_ACC_N64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_REGS64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                     : WG_ACC_N128(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

struct attn_tensor_maps { tensor_map q, k, v; };

/* A ROWS x HD tile at rows y.. of head column col0 into the swizzled layout: column block c64 of all rows, then the
 * next (one box each). */
template <int HD, int ROWS>
__device__ __forceinline__ void tma_tile(u32 dst, const tensor_map &map, int col0, int y, int z, u32 bar) {
    #pragma unroll
    for (int c = 0; c < HD / 64; c++) tma_load(dst + c * ROWS * 128, map, col0 + c * 64, y, z, bar);
}

/* Issues the scores of one warpgroup's 64 rows against a tile of BC keys (not waited for). */
template <int HD, int BC>
__device__ __forceinline__ void wg_scores(float (&s)[BC / 8][4], u32 q_wg, u32 k_s) {
    wg_fence();
    #pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wgmma_ss<BC>(s, wg_desc(q_wg + (kk >> 2) * 128 * 128 + (kk & 3) * 32), wg_desc(k_s + (kk >> 2) * BC * 128 + (kk & 3) * 32), kk > 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* Issues O += P V for a tile of BC keys (not waited for). A 64-wide head is one column block: its descriptor keeps
 * the default block distance, which the hardware does not read then. */
template <int HD, int BC>
__device__ __forceinline__ void wg_pv(float (&o)[HD / 8][4], const u32 (&p)[BC / 16][4], u32 v_s) {
    wg_fence();
    #pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) wgmma_rs<HD>(o, p[kk], wg_desc(v_s + kk * 16 * 128, HD > 64 ? BC * 128 : 1024));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* The producer warpgroup's one working thread: the Q tile, then every K and V tile of the CTA into its ring slot i % NS once both
 * consumer warpgroups have released the slot's previous tile (empty). K and V complete on separate barriers, so the
 * scores may start before V is in. */
template <int HD, int BC, int NS>
__device__ __forceinline__ void wg_produce(const attn_tensor_maps &tm, u32 sQ, u32 sK, u32 sV, u32 q_full, u32 k_full, u32 v_full, u32 empty,
                                           int q0, int h, int kvh, int b, int n_tiles) {
    constexpr int TILE = BC * HD * 2;
    mbar_expect_tx(q_full, 128 * HD * 2);
    tma_tile<HD, 128>(sQ, tm.q, h * HD, q0, b, q_full);
    for (int i = 0; i < n_tiles; i++) {
        const int slot = i % NS;
        if (i >= NS) mbar_wait(empty + slot * 8, (i / NS + 1) & 1);
        mbar_expect_tx(k_full + slot * 8, TILE);
        tma_tile<HD, BC>(sK + slot * TILE, tm.k, kvh * HD, i * BC, b, k_full + slot * 8);
        mbar_expect_tx(v_full + slot * 8, TILE);
        tma_tile<HD, BC>(sV + slot * TILE, tm.v, kvh * HD, i * BC, b, v_full + slot * 8);
    }
}

/* FA3's layout: a producer warpgroup streams Q, K and V by TMA into a ring of NS slots (mbarriers, no CTA barrier in
 * the loop), and two consumer warpgroups of 64 query rows take turns on the tensor cores: each issues a tile's scores
 * when the other's are done (named barriers 1 and 2, strictly alternating), so one's softmax overlaps the other's
 * GEMMs. Every consumer warp releases a slot after its P V is done (a warpgroup whose rows are all past q_rows too:
 * it keeps the barrier protocol). The producer is a whole warpgroup because registers are rebalanced per warpgroup
 * (setmaxnreg): each of the SM's four register banks holds one warp of every warpgroup, 3 x 168 registers a thread
 * as launched; the producer gives its share to the consumers (24 + 2 x 240 <= 512), whose scores, probabilities and
 * output need about 200. */
template <int HD, int BC, int NS>
__global__ void __launch_bounds__(384, 1) flash_attn_wg(attn_args a, const __grid_constant__ attn_tensor_maps tm) {
    constexpr int BR = 128, TILE = BC * HD * 2;
    extern __shared__ __align__(16) unsigned char smem[];
    const u32 sQ = (smem_u32(smem) + 1023) & ~1023u, sK = sQ + BR * HD * 2, sV = sK + NS * TILE;  // 1024-byte swizzle atoms
    const u32 q_full = sV + NS * TILE, k_full = q_full + 8, v_full = k_full + NS * 8, empty = v_full + NS * 8;
    pdl_enter();
    const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / a.group;
    const int q0 = qt * BR, n_tiles = (a.seq + BC - 1) / BC;
    if (threadIdx.x == 256) {
        mbar_init(q_full, 1);
        for (int s = 0; s < NS; s++) {
            mbar_init(k_full + s * 8, 1);
            mbar_init(v_full + s * 8, 1);
            mbar_init(empty + s * 8, 8);  // lane 0 of each consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x >= 256) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (threadIdx.x == 256) wg_produce<HD, BC, NS>(tm, sQ, sK, sV, q_full, k_full, v_full, empty, q0, h, kvh, b, n_tiles);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float o[HD / 8][4], m[2] = {-DLLM_INF, -DLLM_INF}, l[2] = {0.f, 0.f};
    #pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    const u32 q_wg = sQ + wg * 64 * 128;
    const unsigned char *valid = a.key_valid ? a.key_valid + (u64)b * a.seq : 0;
    const float scale = a.scale_log2;
    // Barrier 1 + wg is warpgroup wg's turn; warpgroup 1's last arrival would have no taker.
    auto my_turn = [&] { if (wg == 0) named_bar_sync(1, 256); else named_bar_sync(2, 256); };
    auto their_turn = [&](int i) { if (wg == 0) named_bar_arrive(2, 256); else if (i + 1 < n_tiles) named_bar_arrive(1, 256); };
    auto softmax_of = [&](float (&s)[BC / 8][4], int i, float (&corr)[2]) {
        if (valid || (i + 1) * BC > a.seq) mask_keys<BC / 8>(s, valid, a.seq, i * BC, t);
        softmax_scores<BC / 8>(s, m, l, corr, scale);
    };
    if (wg == 1) named_bar_arrive(1, 256);  // warpgroup 0 takes the first turn
    mbar_wait(q_full, 0);

    // FA3's intra-warpgroup overlap: tile i's scores are issued together with tile i - 1's P V, and tile i's softmax
    // runs while that P V is on the tensor cores; O is rescaled for tile i - 1 just before its P V, as in order. A
    // warpgroup whose rows are all past q_rows computes on TMA's zero rows and stores nothing: no wgmma sits in a
    // branch (ptxas serialises wgmma whose registers it cannot follow through divergent paths).
    float s[BC / 8][4], corr[2];
    u32 p[BC / 16][4];
    mbar_wait(k_full, 0);
    my_turn();
    wg_scores<HD, BC>(s, q_wg, sK);
    their_turn(0);
    wg_wait_for<0>(s);
    softmax_of(s, 0, corr);
    #pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) pack_p<BC / 8>(s, kk, p[kk]);
    for (int i = 1; i < n_tiles; i++) {
        const int slot = i % NS, prev = (i - 1) % NS;
        mbar_wait(k_full + slot * 8, (i / NS) & 1);
        my_turn();
        wg_scores<HD, BC>(s, q_wg, sK + slot * TILE);
        mbar_wait(v_full + prev * 8, ((i - 1) / NS) & 1);
        rescale_o<HD / 8>(o, corr);
        wg_pv<HD, BC>(o, p, sV + prev * TILE);
        their_turn(i);
        wg_wait_for<1>(s);
        softmax_of(s, i, corr);
        wg_wait_for<0>(o);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + prev * 8);
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) pack_p<BC / 8>(s, kk, p[kk]);
    }
    const int last = (n_tiles - 1) % NS;
    mbar_wait(v_full + last * 8, ((n_tiles - 1) / NS) & 1);
    rescale_o<HD / 8>(o, corr);
    wg_pv<HD, BC>(o, p, sV + last * TILE);
    wg_wait_for<0>(o);

    bf16_t *O = a.o + b * a.o_bstride + h * HD;
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        float lr = l[r];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        const float inv = lr > 0.f ? 1.f / lr : 0.f;
        const int row = q0 + wg * 64 + warp * 16 + g + 8 * r;
        if (row >= a.q_rows) continue;
        #pragma unroll
        for (int d = 0; d < HD / 8; d++) *(u32 *)(O + (u64)row * a.o_stride + d * 8 + 2 * t) = pack_bf16x2(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
    }
}
)DLLM";

/* dllm's BF16 GEMM on Hopper (sm_90a): Y [m x n] = X [m x k] . W [n x k]^T, bf16 in and out, fp32 accumulation, X and W
 * row-major (both K-major, as wgmma reads them). A candidate that dllm__gemm times against cuBLASLt's per shape; its
 * rows are independent of m by construction (below). Twin: the float64 product (tests).
 * The layout is DeepGEMM's and CUTLASS's warp-specialised persistent kernel. Output tiles are 128 x 256; CTAs come in
 * clusters of two that take vertically adjacent tiles (m-tiles 2i and 2i + 1 of one column tile) and walk the tile
 * pairs, m fastest, so that the clusters in flight also share weight tiles through L2. In each CTA a producer
 * warpgroup streams 64-wide k-steps by TMA into a ring of NS stages: its own 128 rows of X, and one 128-row half of
 * the weight tile, multicast into both CTAs of the cluster. A stage is refilled once the consumers of both CTAs have
 * released it (16 arrivals on its empty mbarrier). The two consumer warpgroups (64 rows each, m64n256k16,
 * accumulators in registers) hand a finished tile to TMA through shared memory and go on with the next, whose
 * stages the producer has been filling meanwhile. The weights of the first stages are requested before
 * griddepcontrol.wait: they do not depend on the previous kernel.
 * Every output element is summed over k in the same order whatever m is and wherever its tile falls, so a row's bits
 * never depend on how many rows are computed (row-independent, as LaCache needs; the tests check it). */
static const char *dllm__src_gemm_wg = DLLM__SOURCE_LINE R"DLLM(
struct gemm_tensor_maps { tensor_map x, w, y; };  // x, w: boxes of 64 columns x 128 rows; y: 64 x 64

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
/* Arrives on the mbarrier at the same shared-memory offset in CTA `rank` of the cluster. The default (CTA-scope)
 * release: the arrival only says that this warp's wgmma reads of the slot are done. With a cluster-scope release the
 * kernel took about 1.5x as long on an H200. */
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar, u32 rank) {
    asm volatile("{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n"
                 ::"r"(bar), "r"(rank) : "memory");
}
/* tma_load into the same offset of every CTA of the cluster (both here), completing on each one's barrier. */
__device__ __forceinline__ void tma_load_both(u32 dst, const tensor_map &map, int x, int y, u32 bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n"
                 ::"r"(dst), "l"((u64)&map), "r"(x), "r"(y), "r"(0), "r"(bar), "h"((unsigned short)3) : "memory");
}
/* TMA store of a 64-column box from shared memory (128-byte swizzle) at (column x, row y); rows past the tensor are
 * not written. Completion is tracked per thread, in bulk groups. */
__device__ __forceinline__ void tma_store(const tensor_map &map, u32 src, int x, int y) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"((u64)&map), "r"(x), "r"(y), "r"(0), "r"(src)
                 : "memory");
}

/* The j-th k-step job of this CTA: its tile (the cluster's every (gridDim.x / 2)-th tile pair, this CTA's half of
 * it) and k-step. Where the m-tiles are odd the last pair's second tile repeats the first: the two CTAs then store
 * the same bits to the same rows. */
struct gemm_job {
    int m0, c0, ks;
};
__device__ __forceinline__ gemm_job gemm_job_of(int j, int m_tiles, int k_steps) {
    const int m_pairs = (m_tiles + 1) / 2, pair = (blockIdx.x >> 1) + (j / k_steps) * (gridDim.x >> 1);
    return {min((pair % m_pairs) * 2 + (int)(blockIdx.x & 1), m_tiles - 1) * 128, (pair / m_pairs) * 256, j % k_steps};
}

/* The producer's one working thread. The weight boxes of the first NS jobs go out before griddepcontrol.wait, X's
 * after it; later jobs wait until the consumers of both CTAs have released their slot (empty). Weight half `rank`
 * is this CTA's to load for both. */
template <int NS>
__device__ __forceinline__ void gemm_produce(const gemm_tensor_maps &tm, u32 s0, u32 full, u32 empty, int jobs, int m_tiles, int k_steps) {
    constexpr u32 A_BYTES = 128 * 64 * 2, STAGE = A_BYTES + 256 * 64 * 2;
    const int rank = blockIdx.x & 1;
    auto load_w = [&](int j, const gemm_job &q) {
        const u32 slot = j % NS;
        tma_load_both(s0 + slot * STAGE + A_BYTES + rank * 128 * 128, tm.w, q.ks * 64, q.c0 + rank * 128, full + slot * 8);
    };
    auto load_x = [&](int j, const gemm_job &q) { tma_load(s0 + (j % NS) * STAGE, tm.x, q.ks * 64, q.m0, 0, full + (j % NS) * 8); };
    const int first = min(NS, jobs);
    for (int j = 0; j < first; j++) {
        mbar_expect_tx(full + j * 8, STAGE);
        load_w(j, gemm_job_of(j, m_tiles, k_steps));
    }
    pdl_enter();
    for (int j = 0; j < first; j++) load_x(j, gemm_job_of(j, m_tiles, k_steps));
    for (int j = NS; j < jobs; j++) {
        const int slot = j % NS;
        const gemm_job q = gemm_job_of(j, m_tiles, k_steps);
        mbar_wait(empty + slot * 8, (j / NS + 1) & 1);
        mbar_expect_tx(full + slot * 8, STAGE);
        load_w(j, q);
        load_x(j, q);
    }
}

/* A consumer warpgroup's 64 x 256 accumulators (its rows m0 + 64 wg.., columns from c0) to Y, through its 16 KB staging
 * buffer (two 64 x 64 boxes in the 128-byte swizzle, which spreads each warp's stores over all banks) in two passes of
 * 128 columns, each sent by TMA while the warpgroup goes on; a pass first waits until the previous one's store has
 * read the buffer. Storing from registers straight to global memory left the kernel 13-33% slower than cuBLASLt; four
 * passes of 64 columns alternating between the two boxes measured the same as two. */
__device__ __forceinline__ void gemm_store(const gemm_tensor_maps &tm, const float (&acc)[32][4], int m0, int c0, int wg, u32 stage) {
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    const bool issuer = (threadIdx.x & 127) == 0;
    #pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        if (issuer) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
        named_bar_sync(1 + wg, 128);
        #pragma unroll
        for (int jj = 0; jj < 16; jj++)
            #pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = warp * 16 + g + 8 * r, j = pass * 16 + jj;
                const u32 at = stage + (jj >> 3) * 8192 + row * 128 + (((jj & 7) ^ (row & 7)) << 4) + 4 * t;
                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at), "r"(pack_bf16x2(acc[j][2 * r], acc[j][2 * r + 1])) : "memory");
            }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the stores above, visible to TMA
        named_bar_sync(1 + wg, 128);
        if (issuer) {
            tma_store(tm.y, stage, c0 + pass * 128, m0 + wg * 64);
            tma_store(tm.y, stage + 8192, c0 + pass * 128 + 64, m0 + wg * 64);
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
    }
}

/* The consumer warpgroups: one k-step a turn, its four k16 products issued, then the previous step's awaited and its
 * slot released in both CTAs; the tile's last step awaited before the store. */
template <int NS>
__device__ __forceinline__ void gemm_consume(const gemm_tensor_maps &tm, u32 s0, u32 staging, u32 full, u32 empty, int jobs, int m_tiles, int k_steps) {
    constexpr u32 A_BYTES = 128 * 64 * 2, STAGE = A_BYTES + 256 * 64 * 2;
    const int wg = threadIdx.x >> 7;
    auto release = [&](int j) {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) {
            mbar_arrive(empty + (j % NS) * 8);
            mbar_arrive_cluster(empty + (j % NS) * 8, (blockIdx.x & 1) ^ 1);
        }
    };
    float acc[32][4];
    for (int j = 0; j < jobs;) {
        for (int ks = 0; ks < k_steps; ks++, j++) {
            const u32 slot = j % NS, sa = s0 + slot * STAGE;
            mbar_wait(full + slot * 8, (j / NS) & 1);
            wg_fence();
            #pragma unroll
            for (int kk = 0; kk < 4; kk++) wgmma_ss<256>(acc, wg_desc(sa + wg * 64 * 128 + kk * 32), wg_desc(sa + A_BYTES + kk * 32), ks > 0 || kk > 0);
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            if (ks > 0) {
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                release(j - 1);
            }
        }
        wg_wait_for<0>(acc);
        release(j - 1);
        const gemm_job tile = gemm_job_of(j - 1, m_tiles, k_steps);
        gemm_store(tm, acc, tile.m0, tile.c0, wg, staging + wg * 16384);
    }
    if ((threadIdx.x & 127) == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the last stores are done
}

template <int NS>
__global__ void __launch_bounds__(384, 1) gemm_wg(gemm_wg_args a, const __grid_constant__ gemm_tensor_maps tm) {
    constexpr u32 STAGE = (128 + 256) * 64 * 2;
    extern __shared__ __align__(16) unsigned char smem[];
    // The ring, the consumers' staging buffers (16 KB each), the mbarriers; 1024-byte swizzle atoms.
    const u32 s0 = (smem_u32(smem) + 1023) & ~1023u, staging = s0 + NS * STAGE, full = staging + 2 * 16384, empty = full + NS * 8;
    const int m_tiles = (a.m + 127) / 128, pairs = (m_tiles + 1) / 2 * (a.n / 256), k_steps = (a.k + 63) / 64;
    const int clusters = gridDim.x >> 1, cluster = blockIdx.x >> 1;
    const int jobs = cluster < pairs ? (pairs - cluster + clusters - 1) / clusters * k_steps : 0;
    if (threadIdx.x == 256) {
        for (int s = 0; s < NS; s++) {
            mbar_init(full + s * 8, 1);
            mbar_init(empty + s * 8, 16);  // lane 0 of each consumer warp of both CTAs
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_sync();  // both CTAs' barriers exist before either multicasts or arrives
    // Each side meets the cluster barrier again before leaving: no CTA exits while its peer may still arrive on its
    // barriers. ptxas compiles each side for its register count: the producer needs more than the attention's 24.
    if (threadIdx.x >= 256) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x == 256) gemm_produce<NS>(tm, s0, full, empty, jobs, m_tiles, k_steps);
        __syncwarp();
        cluster_sync();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    gemm_consume<NS>(tm, s0, staging, full, empty, jobs, m_tiles, k_steps);
    cluster_sync();
}
)DLLM";

/* [batch] [dual cache] [prefix cache] The batched K/V-cache step's one kernel of its own: the K|V columns of each
 * forwarded row (width elements from src, rows src_stride apart) copied to row cache_rows[r] of one layer's cache (rows
 * cache_stride apart; cache_rows null: row r). Its own module (dllm__module_kv_scatter), loaded by the first batched
 * K/V-cache step or block-diffusion generation. Block diffusion's fresh rows go to the cache through it (rows in order)
 * rather than a 2D memcpy: CUDA updates a captured memcpy node's addresses only when the copy is one-dimensional, so a
 * 2D copy into the rows after a grown committed cache made every [bd graphs] update at a new block fail (error 910).
 * A copy: twin dllm__kv_scatter_rows_ref. */
#define DLLM__BATCH_KV_KERNELS(X)                                                                                               \
    X(kv_scatter_rows, __launch_bounds__(128),                                                                                  \
      (const bf16_t *src, u64 src_stride, bf16_t *cache, u64 cache_stride, const int *cache_rows, int width, int n_rows))
DLLM__BATCH_KV_KERNELS(DLLM__KERNEL_SIGNATURE)

DLLM__TEST_HOOK static void dllm__kv_scatter_rows_ref(const uint16_t *src, size_t src_stride, uint16_t *cache, size_t cache_stride, const int *cache_rows, int width,
                                      int n_rows) {
    for (int r = 0; r < n_rows; r++) memcpy(cache + (size_t)(cache_rows ? cache_rows[r] : r) * cache_stride, src + (size_t)r * src_stride, (size_t)width * 2);
}

static const char *dllm__src_kv_scatter = DLLM__SOURCE_LINE R"DLLM(
/* One CTA a row, 16 bytes a thread a pass (width and both strides are multiples of 8 elements: 16-byte aligned rows). */
KERNEL_kv_scatter_rows {
    pdl_enter();
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    const uint4 *from = (const uint4 *)(src + (u64)r * src_stride);
    uint4 *to = (uint4 *)(cache + (u64)(cache_rows ? cache_rows[r] : r) * cache_stride);
    for (int i = threadIdx.x; i < width / 8; i += blockDim.x) to[i] = from[i];
}
)DLLM";

// ---------------------------------------------------------------------------------------------------
// 14. GPU: NVRTC JIT and the architecture table
//     DeepGEMM's design: kernels are specialised on compile-time constants that belong to the model (head
//     dim, tiles), compiled for the exact GPU, cached in process and on disk under a key that hashes the
//     source, the options, the NVRTC version and the architecture. The DLLM_* switches that steer it (cache,
//     dumps, tiles, GEMM choices) are listed at dllm__env_switches (section 1).
// ---------------------------------------------------------------------------------------------------

/* How a GPU runs the FP8 GEMMs of dllm_precision (1x128 activation groups x 128x128 weight blocks). Only Hopper
 * has them in cuBLASLt; Ada (sm_89) has FP8 tensor cores but no block-scaled cuBLASLt mode, so it runs dllm's own
 * mma.sync kernel (dllm__src_fp8_gemm), which sm_90 can run too (DLLM_FP8_GEMM=mma). */
enum dllm__fp8_gemm {
    DLLM__FP8_NONE = 0,        // FP8 requested: run BF16 and say so in one warning
    DLLM__FP8_CUBLASLT_BLOCK = 1,
    DLLM__FP8_MMA = 2          // fp8_gemm, tiles fp8_wide / fp8_narrow
};

/* A tile of fp8_gemm: BM x BN outputs per CTA in warps of WM x WN, a ring of `stages` 128-wide k-tiles of
 * (BM + BN) * 128 bytes each. */
struct dllm__fp8_tile {
    int bm, bn, wm, wn, stages;
};

/* Tile choices per compute capability. Attention, sm_90: 128 query rows per CTA in 4 warps of 2 m16
 * tiles (FA2's layout) and 32 keys per tile: 245 registers at head dim 128, no spill, two CTAs per SM
 * (measured on an H200). sm_80: ptxas spills that layout, so 8 warps of one m16 tile (128 registers).
 * sm_86/89: 64 rows in 4 single-tile warps (100 KB of shared memory per SM). K/V tiles are double-buffered
 * everywhere: on an H200 a ring of 4 (3 tiles in flight) left the dual-cache block step unchanged (4.98 against
 * 4.97-4.99 ms) and its 32-query attention 0.3 us slower. sm_90a also runs flash_attn_wg (wgmma, 128 query
 * rows in two warpgroups, fa_wg_bc keys per tile, a ring of fa_wg_stages K/V tiles: 3 fill 225 of the 227 KB a CTA
 * may have) where no other path must match flash_attn's bits. sm_90a's BF16 GEMMs time gemm_wg (128 x 256 tiles, a ring
 * of 4 k-steps: 192 KB, and 32 KB of epilogue staging) against cuBLASLt per shape. The tests require every
 * configuration to compile without a stack frame. Newer GPUs run the same code for their own target,
 * FP8 excepted: Blackwell's block-scaled cuBLASLt modes differ (MXFP8), so they run BF16.
 * FP8 GEMM tiles (fp8_gemm; set, not yet tuned on the device): above 64 rows 128 x 128 in 8 warps of 64 x 32, whose
 * two fp32 accumulator sets (total and the fresh 128-K group) take 128 registers a thread, so one CTA per SM; 3 stages
 * fill sm_89's 96 KB of shared memory, 4 on sm_90. Up to 64 rows (block steps), where the GEMM streams the weights,
 * 32 x 64 in 4 warps of 32 x 16: twice the CTAs over N, and more k-tiles in flight per CTA. */
struct dllm__arch {
    int cc;               // compute capability major*10 + minor
    const char *target;   // NVRTC --gpu-architecture
    int fa_br, fa_bc;     // attention query rows per CTA, keys per tile
    int fa_mt;            // m16 tiles per warp: the CTA has fa_br / (16 * fa_mt) warps
    int fa_stages;        // K/V tiles in the ring: stages - 1 are in flight while one is computed
    int fa_kv_ctas_per_sm;  // split-KV (K/V-cache steps) aims at this many attention CTAs per SM
    int fa_wg_bc;         // keys per tile of flash_attn_wg (wgmma, sm_90a only; 0: not used)
    int fa_wg_stages;     // K/V tiles in flash_attn_wg's ring
    dllm__fp8_gemm fp8;   // the FP8 GEMM this architecture runs
    dllm__fp8_tile fp8_wide, fp8_narrow;  // fp8_gemm's tiles above / up to dllm__fp8_narrow_rows rows (sm_89 and newer)
    int gemm_wg_stages;   // gemm_wg's ring of 64-wide k-steps (sm_90a; 0: not used), timed against cuBLASLt per shape
};

static const dllm__arch dllm__arch_table[] = {
    {80, "sm_80", 128, 32, 1, 2, 2, 0, 2, DLLM__FP8_NONE, {}, {}, 0},
    {86, "sm_86", 64, 32, 1, 2, 2, 0, 2, DLLM__FP8_NONE, {}, {}, 0},
    {87, "sm_87", 64, 32, 1, 2, 2, 0, 2, DLLM__FP8_NONE, {}, {}, 0},
    {89, "sm_89", 64, 32, 1, 2, 2, 0, 2, DLLM__FP8_MMA, {128, 128, 64, 32, 3}, {32, 64, 32, 16, 4}, 0},
    {90, "sm_90a", 128, 32, 2, 2, 2, 128, 3, DLLM__FP8_CUBLASLT_BLOCK, {128, 128, 64, 32, 4}, {32, 64, 32, 16, 6}, 4},
};

static const int dllm__fp8_narrow_rows = 64;  // fp8_gemm runs its narrow tile up to this many (padded) rows


/* The table row for a compute capability; GPUs newer than the table use the last row's tiles and
 * their own sm_XY target (NVRTC compiles mma.sync for every architecture it knows). */
static dllm__arch dllm__arch_for(int cc) {
    dllm__arch a = dllm__arch_table[sizeof dllm__arch_table / sizeof dllm__arch_table[0] - 1];
    for (const dllm__arch &row : dllm__arch_table)
        if (row.cc == cc) a = row;
    if (a.cc != cc) {
        static thread_local char target[16];
        snprintf(target, sizeof target, "sm_%d", cc);
        a.target = target;
        a.cc = cc;
        a.fp8 = DLLM__FP8_NONE;
        a.fa_wg_bc = 0;  // wgmma is sm_90a's alone
        a.gemm_wg_stages = 0;
    }
    const dllm__env_switches &env = dllm__env();
    if (!env.gemm_wg) a.gemm_wg_stages = 0;
    if (env.fa_br) a.fa_br = env.fa_br;
    if (env.fa_bc) a.fa_bc = env.fa_bc;
    if (env.fa_mt) a.fa_mt = env.fa_mt;
    a.fa_stages = std::max(2, env.fa_stages ? env.fa_stages : a.fa_stages);
    a.fa_kv_ctas_per_sm = std::max(1, env.fa_kv_ctas ? env.fa_kv_ctas : a.fa_kv_ctas_per_sm);
    a.fa_wg_stages = std::min(3, std::max(2, env.fa_wg_stages ? env.fa_wg_stages : a.fa_wg_stages));
    const int wg_bc = env.fa_wg_bc >= 0 ? env.fa_wg_bc : a.fa_wg_bc;
    if (a.cc == 90 && (wg_bc == 0 || wg_bc == 64 || wg_bc == 128)) a.fa_wg_bc = wg_bc;
    else if (wg_bc != a.fa_wg_bc) dllm__log(DLLM_LOG_WARN, "DLLM_FA_WG_BC=%d ignored: 0, 64 or 128, on sm_90 only", wg_bc);
    return a;
}

static uint64_t dllm__fnv1a(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

static std::string dllm__cache_dir() { return dllm__env().cache_dir; }

static void dllm__mkdirs(const std::string &dir) {
    for (size_t i = 1; i <= dir.size(); i++)
        if (i == dir.size() || dir[i] == '/') mkdir(dir.substr(0, i).c_str(), 0755);
}

/* Writes a file atomically: a unique temporary name in the same folder, then rename(). */
static void dllm__write_atomic(const std::string &path, const std::vector<char> &bytes) {
    std::string tmp = dllm__format("%s.tmp.%d.%llx", path.c_str(), (int)getpid(), (unsigned long long)(uintptr_t)&bytes);
    FILE *f = fopen(tmp.c_str(), "wb");
    if (!f) return;
    bool ok = fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) unlink(tmp.c_str());
}

static bool dllm__read_binary(const std::string &path, std::vector<char> &out) {
    FILE *f = fopen(path.c_str(), "rb");
    if (!f) return false;
    out.clear();
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
    fclose(f);
    return !out.empty();
}

/* A compiled module: its cubin and the kernels looked up in it. */
struct dllm__module {
    cudaLibrary_t lib = nullptr;
    std::unordered_map<std::string, cudaKernel_t> kernels;  // by the name asked for
    ~dllm__module() {
        if (lib) cudaLibraryUnload(lib);
    }
};

struct dllm__jit_request {
    std::string name;                     // module name: spells its compile-time parameters
    std::string source;
    std::vector<std::string> kernels;     // entry points, "k" or template instantiations "k<1,2>"
    std::string target;                   // sm_XY[a]
};

/* The NVRTC log, trimmed to what a user needs: the first lines with "error" and their context. */
static std::string dllm__log_excerpt(const std::string &log) {
    size_t at = log.find("error");
    size_t begin = at == std::string::npos ? 0 : log.rfind('\n', at);
    begin = begin == std::string::npos ? 0 : begin + 1;
    return log.substr(begin, 1200);
}

static int dllm__nvrtc_version() {
    int major = 0, minor = 0;
    if (dllm__load_nvrtc() != DLLM_OK) return 0;  // the compile that follows reports the missing library
    dllm__lib.nvrtcVersion(&major, &minor);
    return major * 100 + minor;
}

/* Parses "N bytes <what>" entries of the ptxas report ("spill stores", "stack frame"); true if any N > 0. */
static bool dllm__log_reports(const std::string &log, const char *what) {
    std::string key = std::string(" bytes ") + what;
    for (size_t at = log.find(key); at != std::string::npos; at = log.find(key, at + 1)) {
        size_t b = log.find_last_of(",.\n", at);
        b = b == std::string::npos ? 0 : b + 1;
        if (atoi(log.c_str() + b) > 0) return true;
    }
    return false;
}

static bool dllm__log_has_spills(const std::string &log) { return dllm__log_reports(log, "spill stores"); }

/* Compiles a module to a cubin (no loading: usable without a GPU, e.g. in CI). */
static dllm_status dllm__nvrtc_compile(const dllm__jit_request &rq, std::vector<char> &cubin, std::vector<std::string> &lowered,
                                       std::string &log, std::string *ptx_out = nullptr) {
    DLLM__TRY(dllm__load_nvrtc());
    nvrtcProgram prog;
    if (dllm__lib.nvrtcCreateProgram(&prog, rq.source.c_str(), (rq.name + ".cu").c_str(), 0, nullptr, nullptr) != NVRTC_SUCCESS)
        return dllm__fail(DLLM_ERR_JIT, "NVRTC could not create program %s", rq.name.c_str());
    for (const std::string &k : rq.kernels) dllm__lib.nvrtcAddNameExpression(prog, k.c_str());
    std::string arch = "--gpu-architecture=" + rq.target;
    const char *opts[] = {arch.c_str(), "-std=c++17", "--ptxas-options=--verbose", "-lineinfo"};
    nvrtcResult r = dllm__lib.nvrtcCompileProgram(prog, 4, opts);
    size_t log_size = 0;
    dllm__lib.nvrtcGetProgramLogSize(prog, &log_size);
    log.assign(log_size, '\0');
    if (log_size) dllm__lib.nvrtcGetProgramLog(prog, &log[0]);
    if (r != NVRTC_SUCCESS) {
        dllm__lib.nvrtcDestroyProgram(&prog);
        return dllm__fail(DLLM_ERR_JIT, "NVRTC failed to compile %s for %s: %s\n%s", rq.name.c_str(), rq.target.c_str(),
                          dllm__lib.nvrtcGetErrorString(r), dllm__log_excerpt(log).c_str());
    }
    size_t n = 0;
    dllm__lib.nvrtcGetCUBINSize(prog, &n);
    cubin.resize(n);
    if (n) dllm__lib.nvrtcGetCUBIN(prog, cubin.data());
    lowered.clear();
    for (const std::string &k : rq.kernels) {
        const char *low = nullptr;
        dllm__lib.nvrtcGetLoweredName(prog, k.c_str(), &low);
        lowered.push_back(low ? low : k);
    }
    if (ptx_out) {  // tests read the kernels' parameter lists from it
        size_t ptx_n = 0;
        dllm__lib.nvrtcGetPTXSize(prog, &ptx_n);
        ptx_out->assign(ptx_n, '\0');
        if (ptx_n) dllm__lib.nvrtcGetPTX(prog, &(*ptx_out)[0]);
    }
    if (!dllm__env().jit_dump.empty()) {
        const char *dump = dllm__env().jit_dump.c_str();
        size_t ptx_n = 0;
        dllm__lib.nvrtcGetPTXSize(prog, &ptx_n);
        std::vector<char> ptx(ptx_n);
        if (ptx_n) dllm__lib.nvrtcGetPTX(prog, ptx.data());
        dllm__mkdirs(dump);
        dllm__write_atomic(std::string(dump) + "/" + rq.name + ".ptx", ptx);
        dllm__write_atomic(std::string(dump) + "/" + rq.name + ".cubin", cubin);
    }
    dllm__lib.nvrtcDestroyProgram(&prog);
    if (n == 0) return dllm__fail(DLLM_ERR_JIT, "NVRTC produced no cubin for %s (%s)", rq.name.c_str(), rq.target.c_str());
    if (dllm__env().jit_fail_on_spill && dllm__log_has_spills(log))
        return dllm__fail(DLLM_ERR_JIT, "%s spills registers on %s (DLLM_JIT_FAIL_ON_SPILL is set):\n%s", rq.name.c_str(), rq.target.c_str(),
                          log.substr(0, 1500).c_str());
    return DLLM_OK;
}

/* In-process cache of loaded modules, keyed like the disk cache. Guarded: contexts may JIT in parallel. */
static std::mutex dllm__jit_mutex;
static std::unordered_map<uint64_t, std::shared_ptr<dllm__module>> dllm__jit_modules;

static uint64_t dllm__jit_key(const dllm__jit_request &rq) {
    uint64_t h = 0xcbf29ce484222325ULL;
    int v = dllm__nvrtc_version();
    h = dllm__fnv1a(h, rq.name.data(), rq.name.size());
    h = dllm__fnv1a(h, rq.source.data(), rq.source.size());
    h = dllm__fnv1a(h, rq.target.data(), rq.target.size());
    h = dllm__fnv1a(h, &v, sizeof v);
    for (const std::string &k : rq.kernels) h = dllm__fnv1a(h, k.data(), k.size() + 1);
    return h;
}

/* The disk cache stores the cubin followed by the lowered names, one per line after a 0 byte. */
static dllm_status dllm__jit_build(const dllm__jit_request &rq, uint64_t key, std::vector<char> &blob, std::vector<std::string> &lowered) {
    std::string dir = dllm__cache_dir(), path = dir.empty() ? "" : dllm__format("%s/%s-%016llx.bin", dir.c_str(), rq.name.c_str(), (unsigned long long)key);
    if (!path.empty() && dllm__read_binary(path, blob)) {
        size_t sep = blob.size();
        while (sep > 0 && blob[sep - 1] != 0) sep--;
        std::string names(blob.begin() + (long)sep, blob.end());
        lowered.clear();
        for (size_t b = 0, e; b < names.size(); b = e + 1) {
            e = names.find('\n', b);
            if (e == std::string::npos) e = names.size();
            if (e > b) lowered.push_back(names.substr(b, e - b));
        }
        if (sep > 0 && lowered.size() == rq.kernels.size()) {
            blob.resize(sep - 1);
            return DLLM_OK;
        }
    }
    double t0 = dllm__now_ms();
    std::string log;
    DLLM__TRY(dllm__nvrtc_compile(rq, blob, lowered, log));
    if (dllm__env().jit_verbose)
        dllm__log_verbose("JIT %s for %s: %.0f ms\n%s", rq.name.c_str(), rq.target.c_str(), dllm__now_ms() - t0, log.c_str());
    if (!path.empty()) {
        std::vector<char> file(blob);
        file.push_back(0);
        for (const std::string &l : lowered) file.insert(file.end(), l.begin(), l.end()), file.push_back('\n');
        dllm__mkdirs(dir);
        dllm__write_atomic(path, file);
    }
    return DLLM_OK;
}

static dllm_status dllm__jit_load(const dllm__jit_request &rq, std::shared_ptr<dllm__module> &out) {
    uint64_t key = dllm__jit_key(rq);
    {
        std::lock_guard<std::mutex> lk(dllm__jit_mutex);
        auto it = dllm__jit_modules.find(key);
        if (it != dllm__jit_modules.end()) { out = it->second; return DLLM_OK; }
    }
    std::vector<char> cubin;
    std::vector<std::string> lowered;
    DLLM__TRY(dllm__jit_build(rq, key, cubin, lowered));
    std::shared_ptr<dllm__module> m(new dllm__module);
    DLLM__CUDA(cudaLibraryLoadData(&m->lib, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    for (size_t i = 0; i < rq.kernels.size(); i++) {
        cudaKernel_t k;
        DLLM__CUDA(cudaLibraryGetKernel(&k, m->lib, lowered[i].c_str()));
        m->kernels[rq.kernels[i]] = k;
    }
    std::lock_guard<std::mutex> lk(dllm__jit_mutex);
    out = dllm__jit_modules.emplace(key, m).first->second;
    return DLLM_OK;
}

/* The most 16-byte chunks of a row a thread of a row-wise norm keeps in registers (NORM_SLOTS in the kernels), and
 * the threads a norm over a row of `chunks` such chunks takes: one a chunk, up to 1024 (n_embd <= 2 * 8192). */
static const int dllm__norm_slots = 2;
static unsigned dllm__norm_threads(int chunks) { return (unsigned)std::min(1024, std::max(32, (chunks + 31) / 32 * 32)); }

/* The modules dllm compiles for one GPU and one head dimension. */
/* Every module starts with the common helpers and the host/kernel contract. */
static std::string dllm__src_prelude() { return std::string(dllm__src_common) + dllm__src_contract(); }

static dllm__jit_request dllm__module_rowwise(const dllm__arch &arch) {
    const std::string slots = dllm__format("#define NORM_SLOTS %d\n", dllm__norm_slots);
    return {"dllm_rowwise",
            dllm__src_prelude() + DLLM__ROWWISE_KERNELS(DLLM__KERNEL_DECLARE) DLLM__FP8_QUANT_KERNELS(DLLM__KERNEL_DECLARE) + slots + dllm__src_rows_common + dllm__src_rowwise +
                dllm__src_e4m3 + dllm__src_fp8,
            {DLLM__ROWWISE_KERNELS(DLLM__KERNEL_NAME) DLLM__FP8_QUANT_KERNELS(DLLM__KERNEL_NAME)}, arch.target};
}

/* [SoloQ] The formats' constants as kernel source, printed from the CPU's tables (section 9b) so that both sides hold
 * the same numbers: the format numbers, the INT4 step, the Lloyd-Max thresholds and INT8 levels, the E8P constants and
 * its 256 abs patterns and 12 x 12 W_int table (constant memory: the encoder walks them in lockstep). */
static std::string dllm__src_soloq_tables() {
    std::string s = dllm__format("enum { Q4_NVFP4 = %d, Q4_INT4 = %d, Q4_LLOYD = %d, Q4_E8P = %d, Q4_RTN = %d };\n", DLLM__Q4_NVFP4, DLLM__Q4_INT4,
                                 DLLM__Q4_LLOYD, DLLM__Q4_E8P, DLLM__Q4_RTN);
    s += dllm__format("#define SOLOQ_SEGMENT %d\n#define SOLOQ_QUANTIZE_THREADS %d\n", dllm__soloq_segment, dllm__soloq_quantize_threads);
    s += dllm__format("#define INT4_STEP %af\n#define LLOYD_KAPPA %af\n#define E8P_SCALE %af\n#define E8P_RESID %af\n#define E8P_ENC_SCALE %af\n",
                      dllm__int4_step, dllm__lloyd4_kappa, dllm__e8p_scale, dllm__e8p_resid, dllm__e8p_scale * dllm__e8p_kappa);
    s += "__constant__ float LLOYD_T[7] = {";
    for (float t : dllm__lloyd4_thresholds) s += dllm__format("%af, ", t);
    s += "};\n__constant__ int LLOYD_INT[8] = {";
    for (int v : dllm__lloyd4_int) s += dllm__format("%d, ", v);
    s += "};\n__constant__ unsigned char E8P_ABS[2048] = {";
    for (int i = 0; i < 2048; i++) s += dllm__format("%d,", dllm__e8p_abs(i / 8)[i % 8]);
    s += "};\n__constant__ signed char E8P_INT[144] = {";
    for (int i = 0; i < 144; i++) s += dllm__format("%d,", dllm__e8p_int(2 * (i / 12) - 11, 2 * (i % 12) - 11));
    s += "};\n";
    // twin: dllm__nvfp4_s_enc
    s += "__device__ __forceinline__ float nvfp4_s_enc(float amax) {\n"
         "    const float s = fminf(__fdiv_rn(2688.0f, amax), 3.402823466e38f);\n"
         "    return amax > 0.f && s > 0.f ? s : 1.0f;\n}\n";
    return s;
}

static dllm__jit_request dllm__module_soloq(const dllm__arch &arch) {
    return {"dllm_soloq", dllm__src_prelude() + DLLM__SOLOQ_KERNELS(DLLM__KERNEL_DECLARE) + dllm__format("#define NORM_SLOTS %d\n", dllm__norm_slots) +
                              dllm__src_rows_common + dllm__src_soloq_tables() + dllm__src_e4m3 + dllm__src_soloq,
            {DLLM__SOLOQ_KERNELS(DLLM__KERNEL_NAME)}, arch.target};
}

/* The FP8 GEMM a GPU runs: its table row's, or DLLM_FP8_GEMM's where this GPU can run that one (so that an H200 can
 * test the kernel Ada runs). A value it cannot run, or a misspelt one, is an error. */
static dllm_status dllm__fp8_gemm_for(const dllm__arch &a, dllm__fp8_gemm &out) {
    out = a.fp8;
    const char *v = dllm__env().fp8_gemm.c_str();
    if (!*v) return DLLM_OK;
    if (strcmp(v, "mma") == 0) {
        if (a.cc < 89)
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "DLLM_FP8_GEMM=mma: the FP8 mma.sync kernel needs compute capability 8.9 or newer, this GPU is sm_%d", a.cc);
        out = DLLM__FP8_MMA;
    } else if (strcmp(v, "cublaslt") == 0) {
        if (a.cc != 90)
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "DLLM_FP8_GEMM=cublaslt: cuBLASLt's block-scaled FP8 runs on sm_90 only, this GPU is sm_%d", a.cc);
        out = DLLM__FP8_CUBLASLT_BLOCK;
    } else {
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "DLLM_FP8_GEMM=%s: expected mma or cublaslt (or unset: the GPU's default)", v);
    }
    return DLLM_OK;
}

static std::string dllm__fp8_gemm_kernel_name(const dllm__fp8_tile &t) {
    return dllm__format("fp8_gemm<%d,%d,%d,%d,%d>", t.bm, t.bn, t.wm, t.wn, t.stages);
}

static size_t dllm__fp8_gemm_smem(const dllm__fp8_tile &t) { return (size_t)t.stages * (t.bm + t.bn) * 128; }

/* Both tiles of fp8_gemm; compiled only where the FP8 GEMM is DLLM__FP8_MMA. */
static dllm__jit_request dllm__module_fp8_gemm(const dllm__arch &arch) {
    const dllm__fp8_tile &w = arch.fp8_wide, &n = arch.fp8_narrow;
    return {dllm__format("dllm_fp8_gemm_%dx%dw%dx%ds%d_%dx%dw%dx%ds%d", w.bm, w.bn, w.wm, w.wn, w.stages, n.bm, n.bn, n.wm, n.wn, n.stages),
            dllm__src_prelude() + dllm__src_mma + dllm__src_fp8_gemm, {dllm__fp8_gemm_kernel_name(w), dllm__fp8_gemm_kernel_name(n)}, arch.target};
}

/* [W4 GEMM] q4_gemm's lookup tables as kernel source, generated from section 9b's decoders so that the kernel and its
 * twin decode the same numbers: the E8P abs patterns (packed as q4_e8p_open reads them), W_int, UE4M3 and the
 * 16-entry tables of NVFP4's e2m1 and Lloyd-Max's levels, all as bf16 (exact: integers up to 127, e2m1 values,
 * UE4M3 values). */
static uint32_t dllm__q4_e8p_abs_entry(int index) {
    const uint8_t *h = dllm__e8p_abs(index);
    uint32_t entry = 0, sum_half = 0;
    for (int i = 0; i < 8; i++) entry |= (uint32_t)((h[i] - 1) / 2) << (2 * i), sum_half += h[i];
    return entry | ((sum_half / 2) & 1) << 16;
}

static std::string dllm__src_q4_tables() {
    auto list = [](const char *decl, int n, const std::function<uint32_t(int)> &at) {
        std::string out = dllm__format("__device__ const %s = {", decl);
        for (int i = 0; i < n; i++) out += dllm__format("%s0x%x", i ? (i % 16 ? "," : ",\n") : "", (unsigned)at(i));
        return out + "};\n";
    };
    return list("u32 q4_e8p_abs_table[256]", 256, dllm__q4_e8p_abs_entry) +
           list("unsigned short q4_e8p_wint_table[144]", 144, [](int i) { return (uint32_t)dllm__f32_to_bf16((float)dllm__e8p_int(2 * (i / 12) - 11, 2 * (i % 12) - 11)); }) +
           list("unsigned short q4_e4m3_table[256]", 256, [](int c) { return (uint32_t)dllm__f32_to_bf16(dllm__e4m3_table()[c]); }) +
           list("unsigned short q4_e2m1_table[16]", 16, [](int c) { return (uint32_t)dllm__f32_to_bf16(dllm__e2m1_to_f32((uint8_t)c)); }) +
           list("unsigned short q4_lloyd_table[16]", 16, [](int c) { return (uint32_t)dllm__f32_to_bf16((float)(c & 8 ? -dllm__lloyd4_int[c & 7] : dllm__lloyd4_int[c & 7])); });
}

/* The W4 GEMM module: every format's entry point and the split-K reduction, with its tile constants and tables. */
static dllm__jit_request dllm__module_q4_gemm(const dllm__arch &arch) {
    const std::string tile = dllm__format("#define Q4_THREADS %d\n#define Q4_WT %d\n#define Q4_MT %d\n#define Q4_KC %d\n#define Q4_BN %d\n"
                                          "#define Q4_STAGES %d\n#define Q4_STAGES_M32 %d\n",
                                          dllm__q4_threads, dllm__q4_wt, dllm__q4_max_rows / 8, dllm__q4_kc, dllm__q4_bn, dllm__q4_stages,
                                          dllm__q4_stages_m32);
    return {"dllm_q4_gemm",
            dllm__src_prelude() + DLLM__XSTR(struct q4_gemm_args { DLLM__Q4_GEMM_ARGS_FIELDS(DLLM__FIELD) };) "\n" DLLM__Q4_GEMM_KERNELS(DLLM__KERNEL_DECLARE) +
                tile + dllm__src_q4_tables() + dllm__src_q4_gemm,
            {DLLM__Q4_GEMM_KERNELS(DLLM__KERNEL_NAME)}, arch.target};
}

static std::string dllm__gemm_wg_name(const dllm__arch &a) { return dllm__format("gemm_wg<%d>", a.gemm_wg_stages); }

/* Shared memory of gemm_wg: the ring, the consumers' staging buffers, the slack that aligns them to 1024 bytes, and the
 * full and empty mbarriers. */
static size_t dllm__gemm_wg_smem(const dllm__arch &a) { return (size_t)a.gemm_wg_stages * (128 + 256) * 128 + 2 * 16384 + 1024 + 16 * a.gemm_wg_stages; }

/* gemm_wg's module (sm_90a, where the table has it). */
static dllm__jit_request dllm__module_gemm_wg(const dllm__arch &arch) {
    return {dllm__format("dllm_gemm_wg_s%d", arch.gemm_wg_stages), dllm__src_prelude() + dllm__src_mma + dllm__src_hopper + dllm__src_gemm_wg,
            {dllm__gemm_wg_name(arch)}, arch.target};
}

static dllm__jit_request dllm__module_sampler(const dllm__arch &arch) {
    return {"dllm_sampler", dllm__src_prelude() + DLLM__SAMPLER_KERNELS(DLLM__KERNEL_DECLARE) + dllm__src_sampler,
            {DLLM__SAMPLER_KERNELS(DLLM__KERNEL_NAME)}, arch.target};
}

/* The table's attention tiles are those of head dims 64 and 128; this is the arch a model of head dim hd runs
 * (dllm__gpu_backend::init keeps it as its arch_). Any multiple of 8 up to 128 runs the table's tiles on
 * round_up(hd, 16) columns (hd_pad in the kernel). Above 128 the output accumulators alone take fa_mt * hd / 2
 * registers a thread (256 at hd 256 with the sm_90 row's two m16 tiles a warp: spills), so one m16 tile a warp, at
 * most 64 query rows a CTA, 32-key tiles in a 2-slot ring: at hd 256 that is 99 KB of shared memory, sm_86 and
 * sm_89's opt-in limit; the DLLM_FA_* overrides do not apply there. flash_attn_wg is built for 64 and 128 only. */
static dllm__arch dllm__attn_tiles(dllm__arch a, int hd) {
    if (hd != 64 && hd != 128) a.fa_wg_bc = 0;
    if (hd > 128) {
        a.fa_mt = 1;
        a.fa_br = std::min(a.fa_br, 64);
        a.fa_bc = 32;
        a.fa_stages = 2;
    }
    return a;
}

/* flash_attn's head dims: multiples of 8 (rope_qkv's quads of pairs, 16-byte copies) up to 256. */
static bool dllm__attn_supports(int hd) { return hd >= 8 && hd <= 256 && hd % 8 == 0; }

static std::string dllm__attn_kernel_name(int hd, const dllm__arch &a) {
    return dllm__format("flash_attn<%d,%d,%d,%d,%d>", hd, a.fa_br, a.fa_bc, a.fa_mt, a.fa_stages);
}

static int dllm__attn_threads(const dllm__arch &a) { return a.fa_br * 2 / a.fa_mt; }

/* flash_attn's varlen instantiation (a batched forward's attention: per-sequence row ranges). */
static std::string dllm__attn_varlen_name(int hd, const dllm__arch &a) {
    return dllm__format("flash_attn<%d,%d,%d,%d,%d,true>", hd, a.fa_br, a.fa_bc, a.fa_mt, a.fa_stages);
}

static std::string dllm__attn_combine_name(int hd) { return dllm__format("attn_combine<%d>", hd); }

static std::string dllm__attn_wide_name(int hd, const dllm__arch &a) { return dllm__format("flash_attn_wg<%d,%d,%d>", hd, a.fa_wg_bc, a.fa_wg_stages); }

static dllm__jit_request dllm__module_attention(const dllm__arch &arch, int head_dim) {
    dllm__jit_request rq = {dllm__format("dllm_attn_hd%d_br%d_bc%d_mt%d_s%d_wg%d_ws%d", head_dim, arch.fa_br, arch.fa_bc, arch.fa_mt, arch.fa_stages,
                                         arch.fa_wg_bc, arch.fa_wg_stages),
                            dllm__src_prelude() + dllm__src_mma + dllm__src_attention,
                            {dllm__attn_kernel_name(head_dim, arch), dllm__attn_combine_name(head_dim)}, arch.target};
    if (arch.fa_wg_bc) {
        rq.source += std::string(dllm__src_hopper) + dllm__src_attention_wgmma;
        rq.kernels.push_back(dllm__attn_wide_name(head_dim, arch));
    }
    return rq;
}

/* The varlen flash_attn alone, in a module of its own: compiled (or read from the disk cache) by the first batched
 * forward, so that contexts that never batch pay nothing for it. */
/* [batch] [dual cache] [prefix cache] kv_scatter_rows, alone in its module: compiled only when a batch has a K/V cache. */
static dllm__jit_request dllm__module_kv_scatter(const dllm__arch &arch) {
    return {"dllm_kv_scatter", dllm__src_prelude() + DLLM__BATCH_KV_KERNELS(DLLM__KERNEL_DECLARE) + dllm__src_kv_scatter,
            {DLLM__BATCH_KV_KERNELS(DLLM__KERNEL_NAME)}, arch.target};
}

static dllm__jit_request dllm__module_attention_varlen(const dllm__arch &arch, int head_dim) {
    return {dllm__format("dllm_attn_varlen_hd%d_br%d_bc%d_mt%d_s%d", head_dim, arch.fa_br, arch.fa_bc, arch.fa_mt, arch.fa_stages),
            dllm__src_prelude() + dllm__src_mma + dllm__src_attention, {dllm__attn_varlen_name(head_dim, arch)}, arch.target};
}

/* Shared memory of flash_attn: the Q tile and the ring of K and V tiles, rows of round_up(hd, 16) columns (hd_pad)
 * padded by 8 (bank spread). */
static size_t dllm__attn_smem(int hd, const dllm__arch &a) { return (size_t)(a.fa_br + 2 * a.fa_stages * a.fa_bc) * ((hd + 15) / 16 * 16 + 8) * 2; }

/* Shared memory of flash_attn_wg: 128 query rows and a ring of fa_wg_stages K and V tiles, unpadded (swizzled), the
 * slack that aligns them to 1024 bytes, and the mbarriers (Q, and K, V, empty per slot). */
static size_t dllm__attn_wide_smem(int hd, const dllm__arch &a) {
    return (size_t)(128 + 2 * a.fa_wg_stages * a.fa_wg_bc) * hd * 2 + 1024 + 8 * (1 + 3 * a.fa_wg_stages);
}

/* Split-KV (flash-decoding) for the short query sets of K/V-cache steps: 32 block rows make one query
 * tile per head, 32 CTAs on a 132-SM GPU, each streaming every key alone. Splitting the KV tiles gives
 * about two CTAs per SM, each with at least two tiles. Only ever asked for where every path that must
 * agree bit for bit takes the same split (the split changes the order of the softmax sums). */
static int dllm__attn_kv_splits(const dllm__arch &a, int q_rows, int seq, int heads_x_batch, int n_sms) {
    const int ctas = (q_rows + a.fa_br - 1) / a.fa_br * heads_x_batch, tiles = (seq + a.fa_bc - 1) / a.fa_bc;
    if (ctas >= n_sms) return 1;
    return std::max(1, std::min(tiles / 2, a.fa_kv_ctas_per_sm * n_sms / ctas));
}

/* Bytes of split-KV partial state any dllm__attn_kv_splits choice on n_sms SMs can need. */
static size_t dllm__attn_partial_bound(const dllm__arch &a, int hd, int n_sms) {
    return (size_t)a.fa_kv_ctas_per_sm * n_sms * a.fa_br * (hd + 2) * 4;
}

/* The attention kernels of one module: flash_attn, for split-KV the combine, and on sm_90a flash_attn_wg. */
struct dllm__attn_tensor_maps;
struct dllm__attn_kernels {
    dllm__kernel<void(attn_args)> attn, combine;
    dllm__kernel<void(attn_args, dllm__attn_tensor_maps)> wide;
};

/* The kernels of a loaded attention module, with the shared memory they need granted. */
static dllm_status dllm__attn_kernels_of(dllm__module &mod, const dllm__arch &arch, int hd, dllm__attn_kernels &k) {
    k.attn.fn = mod.kernels.at(dllm__attn_kernel_name(hd, arch)), k.attn.name = "flash_attn";
    k.combine.fn = mod.kernels.at(dllm__attn_combine_name(hd)), k.combine.name = "attn_combine";
    DLLM__CUDA(cudaFuncSetAttribute((const void *)k.attn.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dllm__attn_smem(hd, arch)));
    if (!arch.fa_wg_bc) return DLLM_OK;
    k.wide.fn = mod.kernels.at(dllm__attn_wide_name(hd, arch)), k.wide.name = "flash_attn_wg";
    DLLM__CUDA(cudaFuncSetAttribute((const void *)k.wide.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dllm__attn_wide_smem(hd, arch)));
    return DLLM_OK;
}

/* Whether kernels on the current device launch with programmatic dependent launch: sm_90 and newer, unless
 * DLLM_PDL=0. A 32-row block step is ~13 short kernels a layer; without it each one's launch waits for the
 * previous kernel to drain (see pdl_enter, which every kernel calls first). */
static bool dllm__pdl_on() {
    static std::atomic<int> cached[16];  // per device: 0 unknown, 1 off, 2 on
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) return false;
    int v = cached[dev].load();
    if (v == 0) {
        int major = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        v = major >= 9 && dllm__env().pdl ? 2 : 1;
        cached[dev].store(v);
    }
    return v == 2;
}

/* The grid of a row-wise kernel that gives each row `per_row` threads in blocks of `threads` (x) and walks the rows
 * in y (a kernel loops over rows past the grid's 65535 limit). */
static dim3 dllm__rows_grid(int n_rows, int per_row, int threads) {
    return dim3((unsigned)((per_row + threads - 1) / threads), (unsigned)std::max(1, std::min(n_rows, 65535)));
}

/* The grid of quantize_rows_e4m3 and swiglu_e4m3 over n_rows rows of k values, in CTAs of 128 threads (one 8-code
 * chunk each). */
static dim3 dllm__e4m3_rows_grid(int n_rows, int k) { return dllm__rows_grid(n_rows, (k + 127) / 128 * 16, 128); }

/* The launch attribute that groups a grid's CTAs in clusters of `ctas` along x. */
static cudaLaunchAttribute dllm__cluster_attr(unsigned ctas) {
    cudaLaunchAttribute a;
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = ctas;
    a.val.clusterDim.y = a.val.clusterDim.z = 1;
    return a;
}

/* Launches a JIT kernel; args are pointers to the argument values, as for cudaLaunchKernel (dllm__kernel::launch
 * builds them from typed arguments). */
static dllm_status dllm__launch_raw(cudaKernel_t k, const dllm__grid &g, cudaStream_t stream, void **args, const char *name) {
    cudaLaunchAttribute attrs[2];
    unsigned n = 0;
    if (g.cluster > 1) attrs[n++] = dllm__cluster_attr(g.cluster);
    if (dllm__pdl_on()) {
        attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g.grid;
    cfg.blockDim = g.block;
    cfg.dynamicSmemBytes = g.smem;
    cfg.stream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = n;
    cudaError_t e = cudaLaunchKernelExC(&cfg, (const void *)k, args);
    if (e != cudaSuccess) return dllm__cuda_fail(e, name);
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 15. GPU: cuBLASLt GEMMs, and dllm's own (gemm_wg: a BF16 candidate; fp8_gemm)
//     Row-major Y[M x N] = X[M x K] . W[N x K]^T is cuBLAS's column-major Y^T = W^T(op T) . X^T: m = N,
//     n = M, k = K, A = W with TRANSA = T, B = X. BF16 in, FP32 accumulate, BF16 or FP32 out; or E4M3
//     in with block scales (dllm_precision), BF16 out. The algorithm is chosen once per (kind, M, N, K,
//     out type) and cached; on sm_90a gemm_wg (TMA and wgmma, through the tensor maps below, which the wgmma
//     attention reads through too) is one more candidate of each BF16 shape. Where cuBLASLt has no block-scaled FP8
//     (sm_89), fp8_gemm takes the same operands. [INT8 GEMM] (run_i8): int8 in, int32 out, exact sums, for SoloQ's
//     integer C values (gemm_q4, section 16).
// ---------------------------------------------------------------------------------------------------

/* cuTensorMapEncodeTiled, fetched from the driver once through the runtime (dllm never links libcuda); null where
 * the driver lacks it. */
static PFN_cuTensorMapEncodeTiled_v12000 dllm__tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            p = nullptr;
        return (PFN_cuTensorMapEncodeTiled_v12000)p;
    }();
    return fn;
}

/* A TMA map over bf16 rows [batch][rows][width], row_stride and batch_stride elements apart, read in boxes of 64
 * columns x box_rows rows in the 128-byte swizzle, zeros past the rows and columns (tensor_map in dllm__src_hopper). */
static bool dllm__tensor_map(CUtensorMap &map, const void *base, int width, int rows, int batch, uint64_t row_stride, uint64_t batch_stride,
                             int box_rows) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = dllm__tensor_map_encoder();
    if (!encode) return false;
    if (batch == 1) batch_stride = (uint64_t)rows * row_stride;  // unused, but must be a valid stride
    cuuint64_t dims[3] = {(cuuint64_t)width, (cuuint64_t)rows, (cuuint64_t)batch}, strides[2] = {row_stride * 2, batch_stride * 2};
    cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, steps[3] = {1, 1, 1};
    return encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void *>(base), dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* gemm_wg's X, W and Y maps (gemm_tensor_maps on the device). */
struct dllm__gemm_tensor_maps {
    CUtensorMap x, w, y;
};

/* dllm's Hopper GEMM (dllm__src_gemm_wg), loaded for one device. */
struct dllm__gemm_wg {
    std::shared_ptr<dllm__module> module;
    dllm__kernel<void(gemm_wg_args, dllm__gemm_tensor_maps)> kernel;
    size_t smem = 0;
    int clusters = 0;  // clusters of two CTAs the GPU holds at once
    /* Whether it runs Y [M x N] = X . W^T: whole 256-wide column tiles, 16-byte rows and bases for TMA. */
    bool fits(const void *X, const void *W, const void *Y, int N, int K) const {
        return kernel.fn && N > 0 && N % 256 == 0 && K % 8 == 0 && ((uintptr_t)X | (uintptr_t)W | (uintptr_t)Y) % 16 == 0;
    }
};

/* Loads gemm_wg for the current device where the table has it and the driver encodes tensor maps; leaves k empty
 * otherwise. */
static dllm_status dllm__gemm_wg_load(const dllm__arch &a, dllm__gemm_wg &k) {
    if (!a.gemm_wg_stages || !dllm__tensor_map_encoder()) return DLLM_OK;
    DLLM__TRY(dllm__jit_load(dllm__module_gemm_wg(a), k.module));
    cudaKernel_t kernel = k.module->kernels.at(dllm__gemm_wg_name(a));
    k.smem = dllm__gemm_wg_smem(a);
    DLLM__CUDA(cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k.smem));
    cudaLaunchAttribute pair = dllm__cluster_attr(2);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(2);
    cfg.blockDim = dim3(384);
    cfg.dynamicSmemBytes = k.smem;
    cfg.attrs = &pair;
    cfg.numAttrs = 1;
    DLLM__CUDA(cudaOccupancyMaxActiveClusters(&k.clusters, (const void *)kernel, &cfg));
    if (k.clusters < 1) return dllm__fail(DLLM_ERR_CUDA, "gemm_wg: the GPU holds no cluster of two of its CTAs");
    k.kernel.fn = kernel, k.kernel.name = "gemm_wg";
    return DLLM_OK;
}

/* Y [M x N] (bf16) = X [M x K] . W [N x K]^T on gemm_wg: as many clusters of two as the GPU holds at once, each walking
 * its tile pairs. */
static dllm_status dllm__gemm_wg_run(const dllm__gemm_wg &k, const void *X, const void *W, void *Y, int M, int N, int K, cudaStream_t stream) {
    if (!k.fits(X, W, Y, N, K)) return dllm__fail(DLLM_ERR_INTERNAL, "gemm_wg cannot run M=%d N=%d K=%d", M, N, K);
    if (M == 0) return DLLM_OK;
    dllm__gemm_tensor_maps maps;
    if (!dllm__tensor_map(maps.x, X, K, M, 1, (uint64_t)K, 0, 128) || !dllm__tensor_map(maps.w, W, K, N, 1, (uint64_t)K, 0, 128) ||
        !dllm__tensor_map(maps.y, Y, N, M, 1, (uint64_t)N, 0, 64))
        return dllm__fail(DLLM_ERR_CUDA, "the driver refused a TMA tensor map for gemm_wg (M=%d N=%d K=%d)", M, N, K);
    const gemm_wg_args args = {M, N, K};
    const int pairs = (M + 255) / 256 * (N / 256);
    return k.kernel.launch({dim3((unsigned)(2 * std::min(pairs, k.clusters))), dim3(384), k.smem, 2}, stream, args, maps);
}

/* Split-K algorithms whose partial sums are reduced in place are dropped: their reduction order can depend
 * on timing. Split-K with an out-of-place reduction (a fixed split, summed by a separate pass) is kept: it is
 * deterministic for a given shape and algorithm, and at a few rows over a deep K (a dual-cache block step)
 * it is often all cuBLASLt offers. Every dllm GEMM is deterministic. */
static int dllm__drop_split_k(cublasLtMatmulHeuristicResult_t *res, int found) {
    int kept = 0;
    for (int i = 0; i < found; i++) {
        int splits = 1;
        uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
        size_t written = 0;
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits, &written);
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme, &written);
        bool ordered = splits <= 1 || scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE || scheme == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
        if (res[i].state == CUBLAS_STATUS_SUCCESS && ordered) res[kept++] = res[i];
    }
    return kept;
}

/* The padding every FP8 GEMM (cuBLASLt's or fp8_gemm) expects of its operands: the quantisers provide it. */
static dllm_status dllm__check_fp8_shape(int M, int K) {
    if (M % 16 || K % dllm__fp8_group)
        return dllm__fail(DLLM_ERR_INTERNAL, "FP8 GEMM with M=%d K=%d: M must be a multiple of 16 and K of 128 (pad them)", M, K);
    return DLLM_OK;
}

static const int dllm__gemm_candidates = 128;  // the heuristic's 32 and their split-K copies
static const int dllm__split_k_max_m = 64;     // rows up to which split-K copies are timed too

struct dllm__gemm_plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
    bool own = false;  // gemm_wg runs this shape instead of cuBLASLt's algo
    ~dllm__gemm_plan() {
        if (desc) dllm__lib.cublasLtMatmulDescDestroy(desc);
        if (a) dllm__lib.cublasLtMatrixLayoutDestroy(a);
        if (b) dllm__lib.cublasLtMatrixLayoutDestroy(b);
        if (c) dllm__lib.cublasLtMatrixLayoutDestroy(c);
    }
};

/* The operands of one GEMM Y[M x N] = X[M x K] . W[N x K]^T. BF16: X and W bf16. FP8 (block-scaled, when
 * x_scale is set): X and W E4M3 with fp32 scales, X per 1x128 group at x_scale[kb * M + m] (VEC128),
 * W per 128x128 block at w_scale[nb * ceil4(K / 128) + kb] (BLK128x128); K a multiple of 128 and M of 16
 * (the quantisers pad), so that the scale tensors' leading dimensions are what cuBLASLt expects. */
struct dllm__gemm_op {
    const void *X, *W;
    void *Y;
    int M, N, K;
    cudaDataType_t out_type;
    const float *x_scale, *w_scale;
    bool i8 = false;  // [INT8 GEMM]: X and W int8, Y int32 (out_type CUDA_R_32I), the sum exact (dllm__gemm::run_i8)
    bool fp8() const { return x_scale != nullptr; }
    const char *kind() const { return i8 ? "INT8 (int32 out)" : fp8() ? "FP8 block-scaled (E4M3, 1x128 x 128x128)" : "BF16"; }
    /* alpha = 1 and beta = 0 in the scale type: int32 for the INT8 GEMM, fp32 otherwise. */
    const void *alpha() const {
        static const float f = 1.0f;
        static const int32_t i = 1;
        return i8 ? (const void *)&i : (const void *)&f;
    }
    const void *beta() const {
        static const float f = 0.0f;
        static const int32_t i = 0;
        return i8 ? (const void *)&i : (const void *)&f;
    }
};

/* The algorithm each GEMM shape runs, chosen once per process and device: every context then computes a shape with the
 * same algorithm, so two contexts (and later the sequences of a batch) give the same bits, and only the first context
 * pays the tuning. Descriptors stay per context (FP8 plans take their scale pointers at each launch). */
struct dllm__gemm_choice {
    cublasLtMatmulAlgo_t algo;
    bool own;
};
static std::mutex dllm__gemm_choices_mutex;
static std::map<std::pair<int, std::string>, dllm__gemm_choice> dllm__gemm_choices;  // (device, plan key)

struct dllm__gemm {
    cublasLtHandle_t handle = nullptr;
    dllm__dbuf workspace;
    const dllm__gemm_wg *own = nullptr;  // dllm's Hopper GEMM, a candidate of every tuned BF16 shape it fits
    std::unordered_map<std::string, std::unique_ptr<dllm__gemm_plan>> plans;
    static const size_t workspace_bytes = 32u << 20;  // Hopper kernels want up to 32 MiB

    ~dllm__gemm() {
        plans.clear();
        if (handle) dllm__lib.cublasLtDestroy(handle);
    }
    dllm_status init() {
        DLLM__TRY(dllm__load_cublaslt());
        DLLM__CUBLAS(dllm__lib.cublasLtCreate(&handle));
        return workspace.fit(workspace_bytes, "the cuBLASLt workspace");
    }
    /* Descriptors for one shape. FP8: weights BLK128x128 (the A operand), activations VEC128 (B), BF16 out;
     * fast accumulation off, so partial sums are promoted to FP32 (DeepSeek-V3's recipe). */
    dllm_status describe(dllm__gemm_plan &p, const dllm__gemm_op &op) {
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;  // TN: the one layout cuBLASLt's INT8 (IMMA) kernels take in column order
        const cudaDataType_t in = op.i8 ? CUDA_R_8I : op.fp8() ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
        if (op.i8) DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32I, CUDA_R_32I));
        else DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        if (op.fp8()) {
            int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
            int8_t fast_accum = 0;
            DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode));
            DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode));
            DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum));
            DLLM__TRY(bind_scales(p, op));  // the heuristic wants to see scale pointers
        }
        DLLM__CUBLAS(dllm__lib.cublasLtMatrixLayoutCreate(&p.a, in, op.K, op.N, op.K));
        DLLM__CUBLAS(dllm__lib.cublasLtMatrixLayoutCreate(&p.b, in, op.K, op.M, op.K));
        DLLM__CUBLAS(dllm__lib.cublasLtMatrixLayoutCreate(&p.c, op.out_type, op.N, op.M, op.N));
        return DLLM_OK;
    }
    /* A plan serves every layer of its shape: the scale pointers are set before each launch. */
    dllm_status bind_scales(dllm__gemm_plan &p, const dllm__gemm_op &op) {
        if (!op.fp8()) return DLLM_OK;
        DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &op.w_scale, sizeof op.w_scale));
        DLLM__CUBLAS(dllm__lib.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &op.x_scale, sizeof op.x_scale));
        return DLLM_OK;
    }
    /* Descriptors and the algorithm for one shape. The first call times cuBLASLt's best candidates on
     * the real operands and keeps the fastest (the heuristic's first pick is often a few % slower). */
    dllm_status plan(const dllm__gemm_op &op, cudaStream_t stream, dllm__gemm_plan *&out, bool tune) {
        std::string key = dllm__format("%s%s%s%d,%d,%d,%d", tune ? "" : "h:", own ? "wg:" : "", op.i8 ? "i8:" : op.fp8() ? "f8:" : "", op.M, op.N, op.K,
                                       (int)op.out_type);
        auto it = plans.find(key);
        if (it != plans.end()) { out = it->second.get(); return DLLM_OK; }
        std::unique_ptr<dllm__gemm_plan> p(new dllm__gemm_plan);
        DLLM__TRY(describe(*p, op));
        int device = 0;
        DLLM__CUDA(cudaGetDevice(&device));
        std::lock_guard<std::mutex> lock(dllm__gemm_choices_mutex);  // held while tuning: a shape is timed once
        auto chosen = dllm__gemm_choices.find({device, key});
        if (chosen != dllm__gemm_choices.end()) {
            p->algo = chosen->second.algo, p->own = chosen->second.own;
            out = p.get();
            plans[key] = std::move(p);
            return DLLM_OK;
        }
        cublasLtMatmulPreference_t pref;
        DLLM__CUBLAS(dllm__lib.cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = workspace_bytes;
        uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;  // no in-place split-K
        dllm__lib.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        dllm__lib.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes);
        cublasLtMatmulHeuristicResult_t res[dllm__gemm_candidates];
        int found = 0;
        cublasStatus_t s = dllm__lib.cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->a, p->b, p->c, p->c, pref, 32, res, &found);
        dllm__lib.cublasLtMatmulPreferenceDestroy(pref);
        if (s != CUBLAS_STATUS_SUCCESS || found == 0)
            return dllm__fail(DLLM_ERR_CUDA, "cuBLASLt has no %s GEMM algorithm for M=%d N=%d K=%d (status %d)", op.kind(), op.M, op.N, op.K, (int)s);
        found = dllm__drop_split_k(res, found);
        if (found == 0) return dllm__fail(DLLM_ERR_CUDA, "cuBLASLt offers only split-K %s algorithms with an in-place (unordered) reduction for M=%d N=%d K=%d", op.kind(), op.M, op.N, op.K);
        p->algo = res[0].algo;
        if (tune && op.M <= dllm__split_k_max_m) found = add_split_k(*p, res, found);
        if (tune && dllm__env().gemm_autotune) DLLM__TRY(fastest(*p, res, found, op, stream));
        dllm__gemm_choices[{device, key}] = {p->algo, p->own};
        out = p.get();
        plans[key] = std::move(p);
        return DLLM_OK;
    }
    /* Appends split-K copies (2..8 shares, reduced out of place, so deterministic) of the heuristic's unsplit
     * picks. At a block step's 32 rows an N = 4096 product is 32 output tiles for 132 SMs; the heuristic
     * rarely offers the split that fills the GPU. Returns the new count; the timing decides. */
    int add_split_k(const dllm__gemm_plan &p, cublasLtMatmulHeuristicResult_t *res, int found) {
        const int unsplit = found;
        for (int i = 0; i < unsplit; i++) {
            int32_t can = 0, splits = 1;
            size_t written = 0;
            dllm__lib.cublasLtMatmulAlgoCapGetAttribute(&res[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &can, sizeof can, &written);
            dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits, &written);
            if (!can || splits > 1) continue;
            for (int32_t k : {2, 3, 4, 6, 8}) {
                if (found == dllm__gemm_candidates) return found;
                cublasLtMatmulHeuristicResult_t r = res[i];
                uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
                dllm__lib.cublasLtMatmulAlgoConfigSetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &k, sizeof k);
                dllm__lib.cublasLtMatmulAlgoConfigSetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme);
                if (dllm__lib.cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.c, p.c, &r.algo, &r) == CUBLAS_STATUS_SUCCESS &&
                    r.workspaceSize <= workspace_bytes)
                    res[found++] = r;
            }
        }
        return found;
    }
    /* One line per tuned shape under DLLM_GEMM_VERBOSE=1: what won, against the heuristic's first pick. */
    void report(const dllm__gemm_plan &p, const dllm__gemm_op &op, int found, float first_us, float best_us) {
        int32_t id = 0, tile = 0, stages = 0, splits = 1;
        uint32_t scheme = 0;
        size_t w = 0;
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits, &w);
        dllm__lib.cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme, &w);
        if (p.own)
            dllm__log_verbose("GEMM %s M=%d N=%d K=%d: gemm_wg, %.1f us; heuristic's first %.1f us; %d cuBLASLt candidates timed", op.kind(), op.M, op.N, op.K,
                              best_us, first_us, found);
        else
            dllm__log_verbose("GEMM %s M=%d N=%d K=%d: algo %d tile %d stages %d split-K %d (scheme %u), %.1f us; heuristic's first %.1f us; %d timed",
                              op.kind(), op.M, op.N, op.K, id, tile, stages, splits, scheme, best_us, first_us, found);
    }
    /* Mean time (ms) of three runs of `launch` on the stream after a warm-up run; infinite if one fails. */
    template <class F>
    static float time_runs(F &&launch, cudaStream_t stream) {
        cudaEvent_t t0, t1;
        if (cudaEventCreate(&t0) != cudaSuccess) return INFINITY;
        if (cudaEventCreate(&t1) != cudaSuccess) { cudaEventDestroy(t0); return INFINITY; }
        float total = 0;
        bool ok = true;
        for (int rep = 0; rep < 4 && ok; rep++) {  // the first run warms up and is not counted
            cudaEventRecord(t0, stream);
            ok = launch();
            cudaEventRecord(t1, stream);
            float ms = 0;
            ok = ok && cudaEventSynchronize(t1) == cudaSuccess && cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess;
            if (rep) total += ms;
        }
        cudaEventDestroy(t0);
        cudaEventDestroy(t1);
        cudaGetLastError();
        dllm__tls_error.clear();
        return ok ? total / 3 : INFINITY;
    }
    /* Times the candidates on the real operands and keeps the fastest: cuBLASLt's, then gemm_wg where it fits. */
    dllm_status fastest(dllm__gemm_plan &p, const cublasLtMatmulHeuristicResult_t *res, int found, const dllm__gemm_op &op, cudaStream_t stream) {
        float best = INFINITY, first = INFINITY;
        for (int i = 0; i < found; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
            const float ms = time_runs([&] {
                return dllm__lib.cublasLtMatmul(handle, p.desc, op.alpha(), op.W, p.a, op.X, p.b, op.beta(), op.Y, p.c, op.Y, p.c, &res[i].algo, workspace.ptr,
                                                workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
            }, stream);
            if (i == 0) first = ms;
            if (ms < best) { best = ms; p.algo = res[i].algo; }
        }
        if (own_fits(op)) {
            const float ms = time_runs([&] { return dllm__gemm_wg_run(*own, op.X, op.W, op.Y, op.M, op.N, op.K, stream) == DLLM_OK; }, stream);
            if (ms < best) { best = ms; p.own = true; }
        }
        if (dllm__env().gemm_verbose) report(p, op, found, first * 1000, best * 1000);
        return DLLM_OK;
    }
    /* Whether gemm_wg can run op: BF16 in and out, on a GPU that has it. */
    bool own_fits(const dllm__gemm_op &op) const {
        return own && !op.fp8() && !op.i8 && op.out_type == CUDA_R_16BF && own->fits(op.X, op.W, op.Y, op.N, op.K);
    }
    /* Row-independent GEMM: whatever M is, the algorithm is the one the heuristic picks for M = pin_m (unordered
     * split-K excluded, no timing), and no launch computes more than pin_m rows, the sizes it was chosen for (at
     * 1024-2048 rows in one launch the first trial of the last layer's pinned GEMMs failed). So the bits of a row
     * never depend on how many rows are computed. LaCache computes some rows alone that the plain path computes
     * among all (lacache.md 2): layer 0's Q/K/V, the last layer after its attention, the LM head. BF16 rows beyond
     * pin_m are done in chunks here; FP8 operands (the last layer's FFN) come in chunks, since their scales'
     * leading dimension is the row count. */
    static constexpr int pin_m = 256;  // constexpr: inline, so std::min may take it by reference
    dllm_status run_pinned(const dllm__gemm_op &op, cudaStream_t stream) {
        if (op.M > pin_m && op.fp8()) return dllm__fail(DLLM_ERR_INTERNAL, "a pinned FP8 GEMM of %d rows (at most %d)", op.M, pin_m);
        const size_t out_bytes = op.out_type == CUDA_R_32F ? 4 : 2;
        for (int m0 = 0; m0 < op.M; m0 += pin_m) {
            dllm__gemm_op part = op;
            part.M = std::min(pin_m, op.M - m0);
            part.X = (const char *)op.X + (size_t)m0 * op.K * 2;
            part.Y = (char *)op.Y + (size_t)m0 * op.N * out_bytes;
            dllm__gemm_plan *p;
            DLLM__TRY(pinned_plan(part, stream, p));
            DLLM__TRY(launch(*p, part, stream));
        }
        return DLLM_OK;
    }
    /* The plan of run_pinned for op's shape: the algorithm chosen at pin_m rows, checked at op.M. */
    dllm_status pinned_plan(const dllm__gemm_op &op, cudaStream_t stream, dllm__gemm_plan *&out) {
        std::string key = dllm__format("pin:%s%d,%d,%d,%d", op.fp8() ? "f8:" : "", op.M, op.N, op.K, (int)op.out_type);
        auto it = plans.find(key);
        if (it == plans.end()) {
            dllm__gemm_op ref_op = op;
            ref_op.M = pin_m;
            dllm__gemm_plan *ref;
            DLLM__TRY(plan(ref_op, stream, ref, false));
            std::unique_ptr<dllm__gemm_plan> pinned(new dllm__gemm_plan);
            DLLM__TRY(describe(*pinned, op));
            pinned->algo = ref->algo;
            cublasLtMatmulHeuristicResult_t check;
            if (dllm__lib.cublasLtMatmulAlgoCheck(handle, pinned->desc, pinned->a, pinned->b, pinned->c, pinned->c, &pinned->algo, &check) != CUBLAS_STATUS_SUCCESS)
                return dllm__fail(DLLM_ERR_CUDA, "the pinned %s GEMM algorithm (chosen at M=%d) does not run at M=%d N=%d K=%d", op.kind(), pin_m, op.M, op.N,
                                  op.K);
            it = plans.emplace(key, std::move(pinned)).first;
        }
        out = it->second.get();
        return DLLM_OK;
    }
    /* Y[M x N] = X[M x K] . W[N x K]^T, BF16 (tests and benchmarks). */
    DLLM__TEST_HOOKS_BEGIN
    DLLM__TEST_HOOK dllm_status run(const void *X, const void *W, void *Y, int M, int N, int K, cudaDataType_t out_type, cudaStream_t stream) {
        return run(dllm__gemm_op{X, W, Y, M, N, K, out_type, nullptr, nullptr}, stream);
    }
    DLLM__TEST_HOOKS_END
    /* The same with E4M3 operands and their block scales (see dllm__gemm_op), BF16 out; pinned: run_pinned's algorithm. */
    dllm_status run_fp8(const void *X, const float *x_scale, const void *W, const float *w_scale, void *Y, int M, int N, int K, cudaStream_t stream,
                        bool pinned = false) {
        DLLM__TRY(dllm__check_fp8_shape(M, K));
        const dllm__gemm_op op{X, W, Y, M, N, K, CUDA_R_16BF, x_scale, w_scale};
        return pinned ? run_pinned(op, stream) : run(op, stream);
    }
    /* [INT8 GEMM] Y[M x N] (int32, leading dimension N) = X[M x K] . W[N x K]^T on int8 operands (leading dimension K),
     * every sum exact: any algorithm, any split gives the same bits, so the fastest is kept whatever rows must stay
     * independent. cuBLASLt's IMMA kernels want the TN layout, K and N multiples of 4 and 4-byte aligned operands
     * (16 bytes for its fast kernels: cudaMalloc'd buffers, K a multiple of 16). */
    dllm_status run_i8(const void *X, const void *W, void *Y, int M, int N, int K, cudaStream_t stream) {
        if (M < 0 || N % 4 || K % 4 || K <= 0 || ((uintptr_t)X | (uintptr_t)W | (uintptr_t)Y) % 4)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "INT8 GEMM M=%d N=%d K=%d: N and K must be multiples of 4 and the operands 4-byte aligned", M, N, K);
        if (M == 0) return DLLM_OK;
        dllm__gemm_op op{X, W, Y, M, N, K, CUDA_R_32I, nullptr, nullptr};
        op.i8 = true;
        return run(op, stream);
    }
    dllm_status run(const dllm__gemm_op &op, cudaStream_t stream) {
        dllm__gemm_plan *p;
        DLLM__TRY(plan(op, stream, p, true));
        return launch(*p, op, stream);
    }
    dllm_status launch(dllm__gemm_plan &p, const dllm__gemm_op &op, cudaStream_t stream) {
        // A plan that chose gemm_wg keeps cuBLASLt's best algorithm too, for operands gemm_wg cannot take.
        if (p.own && own_fits(op)) return dllm__gemm_wg_run(*own, op.X, op.W, op.Y, op.M, op.N, op.K, stream);
        DLLM__TRY(bind_scales(p, op));
        DLLM__CUBLAS(dllm__lib.cublasLtMatmul(handle, p.desc, op.alpha(), op.W, p.a, op.X, p.b, op.beta(), op.Y, p.c, op.Y, p.c, &p.algo, workspace.ptr,
                                    workspace_bytes, stream));
        return DLLM_OK;
    }
};

/* dllm's own FP8 GEMM (dllm__src_fp8_gemm), loaded for one device: both tiles, with the stages they were built with. */
typedef void dllm__sig_fp8_gemm(const unsigned char *X, const float *x_scale, const unsigned char *W, const float *w_scale, bf16_t *Y, int M, int N,
                                 int K);
struct dllm__fp8_mma {
    std::shared_ptr<dllm__module> module;
    dllm__kernel<dllm__sig_fp8_gemm> wide, narrow;
    dllm__fp8_tile wide_tile = {}, narrow_tile = {};
};

/* Compiles and loads fp8_gemm for the current device. A GPU newer than the table runs sm_90's tiles (DLLM_FP8_GEMM=mma),
 * with fewer stages where its shared memory per block is smaller. */
static dllm_status dllm__fp8_mma_load(dllm__arch a, dllm__fp8_mma &out) {
    int dev = 0, optin = 0;
    DLLM__CUDA(cudaGetDevice(&dev));
    DLLM__CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    for (dllm__fp8_tile *t : {&a.fp8_wide, &a.fp8_narrow})
        while (t->stages > 2 && dllm__fp8_gemm_smem(*t) > (size_t)optin) t->stages--;
    DLLM__TRY(dllm__jit_load(dllm__module_fp8_gemm(a), out.module));
    out.wide_tile = a.fp8_wide;
    out.narrow_tile = a.fp8_narrow;
    out.wide.fn = out.module->kernels.at(dllm__fp8_gemm_kernel_name(a.fp8_wide)), out.wide.name = "fp8_gemm";
    out.narrow.fn = out.module->kernels.at(dllm__fp8_gemm_kernel_name(a.fp8_narrow)), out.narrow.name = "fp8_gemm";
    DLLM__CUDA(cudaFuncSetAttribute((const void *)out.wide.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dllm__fp8_gemm_smem(a.fp8_wide)));
    DLLM__CUDA(cudaFuncSetAttribute((const void *)out.narrow.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dllm__fp8_gemm_smem(a.fp8_narrow)));
    return DLLM_OK;
}

/* Y [M x N] (bf16) = X . W^T with fp8_gemm, on the operands and under the contract of dllm__gemm::run_fp8: M and K
 * padded (multiples of 16 and 128), every one of the M rows written. one_tile: the wide tile whatever M, so that a
 * row's bits do not depend on how many rows are computed (the counterpart of dllm__gemm::run_pinned). */
static dllm_status dllm__fp8_mma_run(const dllm__fp8_mma &k, const void *X, const float *x_scale, const void *W, const float *w_scale, void *Y, int M,
                                     int N, int K, cudaStream_t stream, bool one_tile = false) {
    DLLM__TRY(dllm__check_fp8_shape(M, K));
    if (M == 0 || N == 0) return DLLM_OK;
    const bool narrow = !one_tile && M <= dllm__fp8_narrow_rows;
    const dllm__fp8_tile &t = narrow ? k.narrow_tile : k.wide_tile;
    dim3 grid((unsigned)((M + t.bm - 1) / t.bm), (unsigned)((N + t.bn - 1) / t.bn));
    return (narrow ? k.narrow : k.wide).launch({grid, dim3((unsigned)(t.bm / t.wm * (t.bn / t.wn) * 32)), dllm__fp8_gemm_smem(t)}, stream, X, x_scale, W,
                                               w_scale, Y, M, N, K);
}

/* [FP8] [batch] The launches of a batched E4M3 GEMM over M rows quantised once (codes [M_pad][k_pad], M_pad = M
 * rounded up to 16): [m0, m0 + rows) for m0 = 0, limit, 2 limit, ..., rows = min(limit, M_pad - m0). limit is a
 * multiple of 16, so every launch starts on a 16-row boundary and is padded as a quantisation of its own rows would
 * be (only the last is short, and its padding rows are the whole quantisation's). */
struct dllm__row_chunk {
    int m0, rows;
};
static std::vector<dllm__row_chunk> dllm__fp8_row_chunks(int M, int limit) {
    std::vector<dllm__row_chunk> out;
    const int m_pad = (M + 15) / 16 * 16;
    for (int m0 = 0; m0 < m_pad; m0 += limit) out.push_back({m0, std::min(limit, m_pad - m0)});
    return out;
}

/* [W4 GEMM] q4_gemm loaded for one device: an entry point per format, the split-K reduction and the SM count that
 * sizes split-K. */
struct dllm__q4_gemm_kernels {
    std::shared_ptr<dllm__module> module;
#define DLLM__Q4_MEMBER(name, attrs, params) dllm__kernel<dllm__sig_##name> name;
    DLLM__Q4_GEMM_KERNELS(DLLM__Q4_MEMBER)
#undef DLLM__Q4_MEMBER
    int sm_count = 0;
};

/* The entry point of format f for M rows: the _m32 instance where M <= dllm__q4_m32_rows. */
static const dllm__kernel<dllm__sig_q4_gemm_int4> &dllm__q4_gemm_kernel(const dllm__q4_gemm_kernels &k, dllm__q4_format f, int M) {
    const dllm__kernel<dllm__sig_q4_gemm_int4> *kernel[] = {&k.q4_gemm_nvfp4, &k.q4_gemm_int4, &k.q4_gemm_lloyd, &k.q4_gemm_e8p, &k.q4_gemm_rtn};
    const dllm__kernel<dllm__sig_q4_gemm_int4> *m32[] = {&k.q4_gemm_nvfp4_m32, &k.q4_gemm_int4_m32, &k.q4_gemm_lloyd_m32, &k.q4_gemm_e8p_m32,
                                                         &k.q4_gemm_rtn_m32};
    return *(M <= dllm__q4_m32_rows ? m32 : kernel)[f];
}

/* The kernels of out.module (loaded), their shared-memory limits, and the current device's SM count. */
static dllm_status dllm__q4_gemm_bind(dllm__q4_gemm_kernels &out) {
    int dev = 0;
    DLLM__CUDA(cudaGetDevice(&dev));
    DLLM__CUDA(cudaDeviceGetAttribute(&out.sm_count, cudaDevAttrMultiProcessorCount, dev));
#define DLLM__Q4_BIND(kname, attrs, params) out.kname.fn = out.module->kernels.at(#kname), out.kname.name = #kname;
    DLLM__Q4_GEMM_KERNELS(DLLM__Q4_BIND)
#undef DLLM__Q4_BIND
    for (int f = DLLM__Q4_NVFP4; f <= DLLM__Q4_RTN; f++)
        for (int M : {dllm__q4_m32_rows, dllm__q4_max_rows})
            DLLM__CUDA(cudaFuncSetAttribute((const void *)dllm__q4_gemm_kernel(out, (dllm__q4_format)f, M).fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)dllm__q4_ring_bytes((dllm__q4_format)f, M)));
    return DLLM_OK;
}

/* q4_gemm alone (the tests and the bench; the backend compiles its module beside the others and binds it). */
[[maybe_unused]] static dllm_status dllm__q4_gemm_load(const dllm__arch &a, dllm__q4_gemm_kernels &out) {
    DLLM__TRY(dllm__jit_load(dllm__module_q4_gemm(a), out.module));
    return dllm__q4_gemm_bind(out);
}

/* CTAs of q4_gemm an H200 SM holds at once (about 140 registers and at most 76 KB of shared memory (M = 64): 3; NVFP4
 * for M > 32, 184 registers: 2), which split-K aims to fill in one wave: the bytes in flight, and so the bandwidth, grow
 * with the resident warps. */
static const int dllm__q4_ctas_per_sm = 3;

/* Split-K of an N x K weight on sm_count SMs: the 128-wide k chunks a split takes, so that the CTAs come closest to one
 * full wave (gate|up 24576 x 4096 on 132 SMs: 2 splits, 384 CTAs; O 4096 x 4096: 11 splits, 352). A function of
 * (N, K, SMs) only, never of M: a row's partial sums, and so its bits, do not depend on how many rows a launch has. */
static int dllm__q4_gemm_chunks_per_split(int sm_count, int N, int K) {
    const int ctas = (N + dllm__q4_bn - 1) / dllm__q4_bn, chunks = (K + dllm__q4_kc - 1) / dllm__q4_kc;
    const int splits = std::max(1, std::min(chunks, (int)lrint((double)dllm__q4_ctas_per_sm * sm_count / ctas)));
    return (chunks + splits - 1) / splits;
}

static int dllm__q4_gemm_splits(int sm_count, int N, int K) {
    const int chunks = (K + dllm__q4_kc - 1) / dllm__q4_kc, cps = dllm__q4_gemm_chunks_per_split(sm_count, N, K);
    return (chunks + cps - 1) / cps;
}

/* The fp32 workspace dllm__q4_gemm_run needs for M rows of an N x K weight (0 without split-K). */
static size_t dllm__q4_gemm_workspace_floats(const dllm__q4_gemm_kernels &k, int M, int N, int K) {
    const int splits = dllm__q4_gemm_splits(k.sm_count, N, K);
    return splits > 1 ? (size_t)splits * M * N : 0;
}

/* y[m * ldy + y_col0 + n] (out_type CUDA_R_16BF or CUDA_R_32F) = (sum_k A[m][k] C_w[n][k] * s_x[m]) * row_scale[n] for M <= 64
 * activation rows and N packed 4-bit weight rows of K elements in format f (section 9b's layout; NVFP4 with its
 * block scales); s_x null = 1. The twin is dllm__cpu_q4_gemm. Device pointers: A 16-byte aligned with lda % 8 == 0
 * (bf16 elements), codes and block scales 4-byte aligned; N and K multiples of 8. workspace: dllm__q4_gemm_workspace_floats(M, N, K)
 * floats (may be null when that is 0). Deterministic, and a row's result does not depend on M. */
static dllm_status dllm__q4_gemm_run(const dllm__q4_gemm_kernels &k, dllm__q4_format f, const void *codes, const void *block_scales, const float *row_scale,
                                     const void *A, int lda, const float *s_x, void *y, int ldy, int y_col0, cudaDataType_t out_type, int M, int N, int K,
                                     float *workspace, size_t workspace_floats, cudaStream_t stream) {
    if (M < 0 || M > dllm__q4_max_rows)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: %d activation rows; it takes 0 to %d (split larger M into launches)", M, dllm__q4_max_rows);
    if (N < 0 || N % 8 || K <= 0 || K % 8)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: N = %d and K = %d must be multiples of 8 (K > 0)", N, K);
    if ((int)f < DLLM__Q4_NVFP4 || (int)f > DLLM__Q4_RTN) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: unknown weight format %d", (int)f);
    if (!codes || !row_scale || !A || !y || (f == DLLM__Q4_NVFP4 && !block_scales))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: codes, row scales, A and y are required (and block scales for NVFP4)");
    if (lda < K || lda % 8 || (uintptr_t)A % 16 || (uintptr_t)codes % 4 || (uintptr_t)block_scales % 4)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: A needs 16-byte alignment and lda (%d) a multiple of 8 and >= K (%d); codes and block "
                          "scales 4-byte alignment", lda, K);
    if (out_type != CUDA_R_16BF && out_type != CUDA_R_32F) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: the output is bf16 or fp32");
    if (y_col0 < 0 || ldy < y_col0 + N) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: ldy (%d) must be >= y_col0 (%d) + N (%d)", ldy, y_col0, N);
    const size_t need = dllm__q4_gemm_workspace_floats(k, M, N, K);
    if (need > workspace_floats || (need && !workspace))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "q4_gemm: split-K needs a workspace of %zu floats, %zu given", need, workspace_floats);
    if (M == 0 || N == 0) return DLLM_OK;
    q4_gemm_args a = {};
    a.codes = (const unsigned char *)codes, a.block_scales = (const unsigned char *)block_scales, a.row_scale = row_scale;
    a.A = (const bf16_t *)A, a.s_x = s_x, a.y = y, a.partial = workspace;
    a.lda = lda, a.ldy = ldy, a.y_col0 = y_col0, a.y_f32 = out_type == CUDA_R_32F, a.M = M, a.N = N, a.K = K;
    a.chunks_per_split = dllm__q4_gemm_chunks_per_split(k.sm_count, N, K);
    a.k_splits = dllm__q4_gemm_splits(k.sm_count, N, K);
    const dllm__grid grid(dim3((unsigned)((N + dllm__q4_bn - 1) / dllm__q4_bn), (unsigned)a.k_splits), dim3(dllm__q4_threads), dllm__q4_ring_bytes(f, M));
    DLLM__TRY(dllm__q4_gemm_kernel(k, f, M).launch(grid, stream, a));
    if (a.k_splits == 1) return DLLM_OK;
    const unsigned blocks = (unsigned)(((size_t)M * N + 255) / 256);
    return k.q4_gemm_reduce.launch({dim3(blocks), dim3(256)}, stream, a);
}

// ---------------------------------------------------------------------------------------------------
// 16. GPU backend: weight formats, shared weights, activations, forward plan, forward, sampler, step graphs
//     16.1 [weight formats] how a linear's weight is stored, and the one GEMM entry point that takes any of them
//     16.2 [shared weights] the device weights belong to the model: one copy per (device, weight formats), shared
//          by every context on it, freed with the last one
//     16.3 [activations] a context's buffers, named and shaped; [forward plan] which rows each stage computes
//     16.4 the backend: forward (LaCache's [EmbedCache] [RoPECache] [FACache] in layer 0, [truncation] in the last
//          layer, [FP8 fused norm+quantise], [dual cache] / [prefix cache], [DPad] positions), LM head, sampler,
//          [step graphs]; the [batch] forward, its K/V-cache step and the batched block-diffusion forward
//          (bd_forward_batch, DLLM_BD_BATCH=1)
//          16.4.3 [block diffusion]: bd_begin / bd_forward over a committed-block K/V cache, logits to the host
//     16.5 [debug hooks] stage timers and logit recording for tests and benchmarks
//     Weights are BF16 with the projections fused (Q|K|V rows, gate|up rows); norms, biases and RoPE tables stay
//     fp32. The residual stream is fp32. One denoising step (forward, LM head, confidence, top-k commit) is
//     captured once as a CUDA graph and replayed: the step counter, the block bounds and the canvas live on the
//     device, so the host issues one launch per step and never copies logits.
// ---------------------------------------------------------------------------------------------------

static inline int dllm__round_up(int x, int m) { return (x + m - 1) / m * m; }

/* 16.1 [weight formats] How a linear layer's weight W [n x k] (y = x W^T) is stored on the device, and which activation
 * operand its GEMMs take. Adding a format is a row here, its quantiser in dllm__gpu_weights_quantize, its case in
 * dllm__gpu_backend::gemm, and its kernels; nothing else in the forward changes. */
enum dllm__wformat {
    DLLM__W_BF16 = 0,        // bf16 [n x k], row-major: cuBLASLt, or gemm_wg on sm_90a
    DLLM__W_E4M3_BLOCK = 1,  // E4M3 [n x k_pad] (k padded to whole 128-blocks with zero codes), an fp32 scale per 128x128
                             // block at scale[nb * ceil4(k_pad / 128) + kb] (BLK128x128): cuBLASLt block-scaled or fp8_gemm
    DLLM__W_Q4 = 2,          // [SoloQ] rows of W R^T in a 4-bit format (section 9b's packing: codes [n][k / 2], NVFP4 block
                             // scales [n][ceil(k / 16)]), an fp32 row scale each: dequantised to their BF16 values C, then
                             // cuBLASLt with an fp32 epilogue applying the row and token scales
};
enum dllm__aformat {
    DLLM__A_BF16 = 0,        // bf16 rows [M x k]
    DLLM__A_E4M3_1X128 = 1,  // E4M3 rows [M_pad x k_pad] (M_pad = 16 * ceil(M / 16)), an fp32 scale per 1x128 group at
                             // scale[kb * M_pad + m] (VEC128): written by the producers (add_rmsnorm_e4m3, swiglu_e4m3)
    DLLM__A_Q4 = 2,          // [SoloQ] bf16 rows [M x k] rotated by the weight's R and quantised per token: their C values and
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
    dllm__dbuf block_scales;  // NVFP4 [n][ceil(k / 16)] UE4M3
    std::shared_ptr<const dllm__rotation_dev> rot;
};

/* A weight as a GEMM reads it (the tied LM head is a view of the embedding table). */
struct dllm__weight_view {
    dllm__wformat format;
    int n, k;
    const void *data;    // the codes, in the format's layout
    const float *scale;  // the format's scales, or null
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
 * depend on its batch). DLLM_GEMM_ROWS=independent makes every BF16 GEMM INDEPENDENT, to measure what that costs.
 * BATCH (a batched forward, forward_batch) is INDEPENDENT in one launch where the GEMM allows it: gemm_wg where it takes
 * the operands (row-independent at any row count, by construction), else INDEPENDENT's pinned algorithm. The choice
 * depends on the shape alone, so a sequence's rows get the same bits whatever else the batch holds. */
enum dllm__rows { DLLM__ROWS_TUNED, DLLM__ROWS_INDEPENDENT, DLLM__ROWS_BATCH };

// ---------------------------------------------------------------------------------------------------
// 16.2 [shared weights]
// ---------------------------------------------------------------------------------------------------

struct dllm__gpu_layer {
    dllm__linear qkv, o, gu, down;          // Q|K|V rows, the output projection, gate|up rows, down
    dllm__dbuf attn_norm, ffn_norm, b_qkv;  // fp32
};

/* The device weights of one model on one device in one set of weight formats. Immutable once built, so any number of
 * contexts on any threads read them at once; each context holds a reference and the last one frees them. */
struct dllm__gpu_weights {
    int device = 0;
    bool fp8_ffn = false, fp8_attn = false;  // [FP8] layers >= 1 store these linears as DLLM__W_E4M3_BLOCK
    dllm__soloq_options soloq;               // [SoloQ] enabled: every layer's linears (and the head if asked) are DLLM__W_Q4
    std::vector<dllm__gpu_layer> layers;
    dllm__dbuf embed;                        // bf16 [vocab x d]: the embedding table
    dllm__linear head;                       // the LM head; empty when tied to the embedding table
    dllm__dbuf final_norm;                   // fp32 [d]
    size_t bytes = 0;                        // device memory they take
    dllm__weight_view lm_head(const dllm__config &c) const {
        return head.data.ptr ? head.view() : dllm__weight_view{DLLM__W_BF16, c.n_vocab, c.n_embd, embed.ptr, nullptr};
    }
};

/* The row-wise module's kernels (the table's rows), typed. */
struct dllm__rowwise_kernels {
#define DLLM__KERNEL_MEMBER(name, attrs, params) dllm__kernel<dllm__sig_##name> name;
    DLLM__ROWWISE_KERNELS(DLLM__KERNEL_MEMBER)
    DLLM__FP8_QUANT_KERNELS(DLLM__KERNEL_MEMBER)
};
struct dllm__sampler_kernels {
    DLLM__SAMPLER_KERNELS(DLLM__KERNEL_MEMBER)
};
struct dllm__soloq_kernels {
    DLLM__SOLOQ_KERNELS(DLLM__KERNEL_MEMBER)
#undef DLLM__KERNEL_MEMBER
    int max_smem = 0;       // dynamic shared memory a CTA may take here
    bool clusters = false;  // sm_90+: a row may be split over a cluster of CTAs (dllm__soloq_split)
};

/* Fills a typed kernel set from a loaded module, by the table's names. */
#define DLLM__KERNEL_BIND(kname, attrs, params) set.kname.fn = mod.kernels.at(#kname), set.kname.name = #kname;
static void dllm__bind(dllm__rowwise_kernels &set, dllm__module &mod) {
    DLLM__ROWWISE_KERNELS(DLLM__KERNEL_BIND)
    DLLM__FP8_QUANT_KERNELS(DLLM__KERNEL_BIND)
}
static void dllm__bind(dllm__sampler_kernels &set, dllm__module &mod) { DLLM__SAMPLER_KERNELS(DLLM__KERNEL_BIND) }
/* SoloQ's kernels, and the widest row soloq_quantize_rows takes with `smem_optin` bytes of shared memory a block. */
static dllm_status dllm__bind(dllm__soloq_kernels &set, dllm__module &mod, int smem_optin, int cc) {
    DLLM__SOLOQ_KERNELS(DLLM__KERNEL_BIND)
    const int dynamic = smem_optin - 1024;  // the kernel's static shared memory stays below 1 KB
    DLLM__CUDA(cudaFuncSetAttribute((const void *)set.soloq_quantize_rows.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic));
    DLLM__CUDA(cudaFuncSetAttribute((const void *)set.soloq_produce_rows.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic));
    set.max_smem = dynamic;
    set.clusters = cc >= 90;
    return DLLM_OK;
}
#undef DLLM__KERNEL_BIND

/* [KV quant] The commit-time K/V quantisation kernels (dllm__src_kvq), loaded at a kv_quant context's first generation. */
/* [FACache] on block diffusion: the layer-0 split attention (dllm__src_bdfa), loaded at its first use. */
struct dllm__bdfa_kernels {
    std::shared_ptr<dllm__module> module;
    dllm__kernel<dllm__sig_bdfa_committed> committed;
    dllm__kernel<dllm__sig_bdfa_merge> merge;
};

static dllm__jit_request dllm__module_bdfa(const dllm__arch &arch) {
    static_assert(dllm__bdfa_warps * 32 == 256, "bdfa_committed's __launch_bounds__");
    return {"dllm_bdfa",
            dllm__src_prelude() + dllm__format("#define DLLM_BDFA_WARPS %d\n", dllm__bdfa_warps) + DLLM__XSTR(struct bdfa_args { DLLM__BDFA_ARGS_FIELDS(DLLM__FIELD) };) "\n" DLLM__BDFA_KERNELS(DLLM__KERNEL_DECLARE) +
                dllm__src_warp_softmax + dllm__src_bdfa,
            {DLLM__BDFA_KERNELS(DLLM__KERNEL_NAME)}, arch.target};
}

struct dllm__kvq_kernels {
    std::shared_ptr<dllm__module> module;
    dllm__kernel<dllm__sig_kvq_commit_keys> commit_keys;
    dllm__kernel<dllm__sig_kvq_commit_values> commit_values;
    dllm__kernel<dllm__sig_kvq_attention> attention;
};
/* DLLM_KVQ_TC=1: the tensor-core attention over the quantised cache (dllm__src_kvq_tc), a module per head dim. */
struct dllm__kvq_tc_kernels {
    std::shared_ptr<dllm__module> module;
    dllm__kernel<dllm__sig_kvq_flash> flash;
    dllm__kernel<dllm__sig_kvq_flash_combine> combine;
    int hd = 0, smem_optin = 0;
};

static dllm_status dllm__upload_f32(dllm__dbuf &dst, const std::vector<float> &v, const char *what) {
    if (v.empty()) return DLLM_OK;
    DLLM__TRY(dst.fit(v.size() * 4, what));
    DLLM__CUDA(cudaMemcpy(dst.ptr, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return DLLM_OK;
}

/* Copies rows of host tensors (any float dtype) into one bf16 device weight [sum of rows x k], in order. */
static dllm_status dllm__upload_rows(dllm__linear &dst, std::initializer_list<const dllm__tensor *> parts, const char *what) {
    size_t n = 0;
    for (const dllm__tensor *t : parts) n += (size_t)t->numel;
    DLLM__TRY(dst.data.fit(n * 2, what));
    std::vector<uint16_t> host(n);
    size_t at = 0;
    for (const dllm__tensor *t : parts) {
        if (t->dtype == DLLM__BF16) memcpy(host.data() + at, t->data, t->nbytes);
        else for (int64_t i = 0; i < t->numel; i++) host[at + (size_t)i] = dllm__f32_to_bf16(dllm__tensor_at(*t, i));
        at += (size_t)t->numel;
    }
    DLLM__CUDA(cudaMemcpy(dst.data.ptr, host.data(), n * 2, cudaMemcpyHostToDevice));
    dst.format = DLLM__W_BF16;
    dst.k = (int)parts.begin()[0]->shape[1];
    dst.n = (int)(n / (size_t)dst.k);
    return DLLM_OK;
}

/* [non-finite weights] The first NaN or infinity of the bf16 weight uploaded from `parts` (a cheap device pass: a
 * damaged checkpoint is an error that names the tensor, never a model that silently decodes garbage). Twin:
 * dllm__first_nonfinite. */
static dllm_status dllm__check_finite(const dllm__linear &W, std::initializer_list<const dllm__tensor *> parts, const dllm__rowwise_kernels &k,
                                      cudaStream_t stream, dllm__dbuf &scratch) {
    const u64 n = (u64)W.n * (u64)W.k;
    u64 first = n;
    DLLM__TRY(scratch.fit(sizeof first, "the weight check"));
    DLLM__CUDA(cudaMemcpyAsync(scratch.ptr, &first, sizeof first, cudaMemcpyHostToDevice, stream));
    DLLM__TRY(k.find_nonfinite_bf16.launch({dim3(1024), dim3(256)}, stream, W.data.ptr, n, scratch.ptr));
    DLLM__CUDA(cudaMemcpyAsync(&first, scratch.ptr, sizeof first, cudaMemcpyDeviceToHost, stream));
    DLLM__CUDA(cudaStreamSynchronize(stream));
    for (const dllm__tensor *t : parts) {
        if (first < (u64)t->numel) {
            const int64_t cols = t->shape.size() > 1 ? t->shape[1] : 1;
            return dllm__fail(DLLM_ERR_FORMAT, "tensor %s in %s holds a non-finite value (NaN or infinity) at [%lld, %lld]: the checkpoint is damaged",
                              t->name.c_str(), t->file ? t->file->c_str() : "?", (long long)(first / (u64)cols), (long long)(first % (u64)cols));
        }
        first -= std::min(first, (u64)t->numel);
    }
    return DLLM_OK;
}

/* The same for the fp32 vectors (norm gains, biases), on the host: they are small. */
static dllm_status dllm__check_finite(const std::vector<float> &v, const char *what, size_t layer) {
    for (size_t i = 0; i < v.size(); i++)
        if (!std::isfinite(v[i]))
            return dllm__fail(DLLM_ERR_FORMAT, "the %s of layer %zu holds a non-finite value (NaN or infinity) at [%zu]: the checkpoint is damaged", what,
                              layer, i);
    return DLLM_OK;
}

/* [SoloQ] A rotation's arrays on the device. */
static dllm_status dllm__rotation_upload(const dllm__rotation &r, dllm__rotation_dev &out) {
    out.b = r.b, out.k = r.k;
    out.norm = r.b > 1 ? (float)(1.0 / sqrt((double)r.b)) : 1.0f;
    auto put = [](dllm__dbuf &dst, const void *src, size_t bytes) -> dllm_status {
        if (!bytes) return DLLM_OK;
        DLLM__TRY(dst.fit(bytes, "SoloQ rotations"));
        DLLM__CUDA(cudaMemcpy(dst.ptr, src, bytes, cudaMemcpyHostToDevice));
        return DLLM_OK;
    };
    DLLM__TRY(put(out.perm, r.perm.data(), r.perm.size() * 4));
    DLLM__TRY(put(out.signs, r.sign_bits.data(), r.sign_bits.size()));
    return put(out.mixer, r.mixer.data(), r.mixer.size() * 4);
}

/* [quantised checkpoints] A stored SoloQ linear (dllm_model::soloq: checked at load) as a DLLM__W_Q4 weight. */
static dllm_status dllm__upload_q4(dllm__linear &W, const dllm__soloq_linear &stored) {
    const dllm__q4_rows &q = stored.w;
    auto put = [](dllm__dbuf &dst, const void *src, size_t bytes) -> dllm_status {
        DLLM__TRY(dst.fit(bytes, "SoloQ weights"));
        DLLM__CUDA(cudaMemcpy(dst.ptr, src, bytes, cudaMemcpyHostToDevice));
        return DLLM_OK;
    };
    std::unique_ptr<dllm__q4_site> site(new dllm__q4_site);
    site->format = q.format;
    std::shared_ptr<dllm__rotation_dev> rot = std::make_shared<dllm__rotation_dev>();
    DLLM__TRY(dllm__rotation_upload(*stored.rot, *rot));
    site->rot = rot;
    if (!q.block_scales.empty()) DLLM__TRY(put(site->block_scales, q.block_scales.data(), q.block_scales.size()));
    DLLM__TRY(put(W.data, q.codes.data(), q.codes.size()));
    DLLM__TRY(put(W.scale, q.row_scale.data(), q.row_scale.size() * 4));
    W.format = DLLM__W_Q4, W.n = q.rows, W.k = q.cols;
    W.q4 = std::move(site);
    return DLLM_OK;
}

/* The checkpoint's weights, as BF16 with the projections fused, each checked for non-finite values; a quantised
 * checkpoint's linears as they are stored. */
static dllm_status dllm__gpu_weights_upload(const dllm_model &m, const dllm__rowwise_kernels &k, cudaStream_t stream, dllm__gpu_weights &w) {
    dllm__dbuf scratch;
    auto upload = [&](dllm__linear &W, std::initializer_list<const dllm__tensor *> parts, const char *what) -> dllm_status {
        DLLM__TRY(dllm__upload_rows(W, parts, what));
        return dllm__check_finite(W, parts, k, stream, scratch);
    };
    w.layers.resize(m.layers.size());
    for (size_t l = 0; l < m.layers.size(); l++) {
        const dllm__layer_weights &L = m.layers[l];
        dllm__gpu_layer &G = w.layers[l];
        if (m.soloq) {
            const dllm__soloq_layer &S = *m.soloq->layers[l];
            DLLM__TRY(dllm__upload_q4(G.qkv, S.lin[DLLM__SOLOQ_QKV]));
            DLLM__TRY(dllm__upload_q4(G.o, S.lin[DLLM__SOLOQ_O]));
            DLLM__TRY(dllm__upload_q4(G.gu, S.lin[DLLM__SOLOQ_GU]));
            DLLM__TRY(dllm__upload_q4(G.down, S.lin[DLLM__SOLOQ_DOWN]));
        } else {
            DLLM__TRY(upload(G.qkv, {L.wq, L.wk, L.wv}, "attention weights"));
            DLLM__TRY(upload(G.o, {L.wo}, "attention weights"));
            DLLM__TRY(upload(G.gu, {L.gate, L.up}, "MLP weights"));
            DLLM__TRY(upload(G.down, {L.down}, "MLP weights"));
        }
        DLLM__TRY(dllm__check_finite(L.attn_norm, "attention norm", l));
        DLLM__TRY(dllm__check_finite(L.ffn_norm, "MLP norm", l));
        DLLM__TRY(dllm__upload_f32(G.attn_norm, L.attn_norm, "norm weights"));
        DLLM__TRY(dllm__upload_f32(G.ffn_norm, L.ffn_norm, "norm weights"));
        if (!L.bq.empty()) {
            std::vector<float> b(L.bq);
            b.insert(b.end(), L.bk.begin(), L.bk.end());
            b.insert(b.end(), L.bv.begin(), L.bv.end());
            DLLM__TRY(dllm__check_finite(b, "Q/K/V bias", l));
            DLLM__TRY(dllm__upload_f32(G.b_qkv, b, "attention biases"));
        }
    }
    dllm__linear embed;
    DLLM__TRY(upload(embed, {m.embed}, "the embedding table"));
    w.embed = std::move(embed.data);
    if (m.soloq && m.soloq->head) DLLM__TRY(dllm__upload_q4(w.head, m.soloq->head->lin[DLLM__SOLOQ_HEAD]));
    else if (m.head != m.embed) DLLM__TRY(upload(w.head, {m.head}, "the LM head"));
    DLLM__TRY(dllm__check_finite(m.final_norm, "final norm", m.layers.size()));
    return dllm__upload_f32(w.final_norm, m.final_norm, "norm weights");
}

/* Benchmark weights generated on the device (no file, no host copy) as the PyTorch reference draws them: normal with
 * std 0.02, the residual branches' output projections 0.02 / sqrt(2 L); norms 1. */
static dllm_status dllm__gpu_weights_random(const dllm_model &m, const dllm__rowwise_kernels &k, cudaStream_t stream, dllm__gpu_weights &w) {
    const dllm__config &c = m.cfg;
    const int d = c.n_embd, qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim, q = c.n_head * c.head_dim;
    uint64_t seed = m.random_seed;
    auto fill_bf16 = [&](dllm__dbuf &b, size_t n, float std_dev, const char *what) -> dllm_status {
        DLLM__TRY(b.fit(n * 2, what));
        return k.fill_random_bf16.launch({dim3(1024), dim3(256)}, stream, b.ptr, n, seed++, std_dev, 0);
    };
    auto fill_linear = [&](dllm__linear &W, int n, int kk, float std_dev, const char *what) {
        W.format = DLLM__W_BF16, W.n = n, W.k = kk;
        return fill_bf16(W.data, (size_t)n * kk, std_dev, what);
    };
    auto ones = [&](dllm__dbuf &b, size_t n, float value, const char *what) { return dllm__upload_f32(b, std::vector<float>(n, value), what); };
    const float std_in = 0.02f, std_out = std_in / sqrtf(2.f * (float)c.n_layer);
    w.layers.resize((size_t)c.n_layer);
    for (dllm__gpu_layer &G : w.layers) {
        DLLM__TRY(fill_linear(G.qkv, qkv, d, std_in, "attention weights"));
        DLLM__TRY(fill_linear(G.o, d, q, std_out, "attention weights"));
        DLLM__TRY(fill_linear(G.gu, 2 * c.n_ff, d, std_in, "MLP weights"));
        DLLM__TRY(fill_linear(G.down, d, c.n_ff, std_out, "MLP weights"));
        DLLM__TRY(ones(G.attn_norm, (size_t)d, 1.0f, "norm weights"));
        DLLM__TRY(ones(G.ffn_norm, (size_t)d, 1.0f, "norm weights"));
        if (c.qkv_bias) DLLM__TRY(ones(G.b_qkv, (size_t)qkv, 0.0f, "attention biases"));
    }
    DLLM__TRY(fill_bf16(w.embed, (size_t)c.n_vocab * d, std_in, "the embedding table"));
    if (!c.tied_embeddings) DLLM__TRY(fill_linear(w.head, c.n_vocab, d, std_in, "the LM head"));
    DLLM__TRY(ones(w.final_norm, (size_t)d, 1.0f, "norm weights"));
    DLLM__CUDA(cudaStreamSynchronize(stream));
    return DLLM_OK;
}

/* [FP8] A BF16 weight into DLLM__W_E4M3_BLOCK, on the device; the bf16 copy is released. Twin: dllm__quantize_blocks. */
static dllm_status dllm__quantize_linear_e4m3(dllm__linear &W, const dllm__rowwise_kernels &k, cudaStream_t stream) {
    const int kb = dllm__round_up(W.k, 128) / 128, nb = (W.n + 127) / 128, ld = dllm__round_up(kb, 4);
    dllm__dbuf codes, scale;
    DLLM__TRY(codes.fit((size_t)W.n * kb * 128, "FP8 weights"));
    DLLM__TRY(scale.fit((size_t)nb * ld * 4, "FP8 weight scales"));
    DLLM__CUDA(cudaMemsetAsync(scale.ptr, 0, scale.bytes, stream));  // the ld padding is never read, but defined
    DLLM__TRY(k.quantize_weight_blocks.launch({dim3((unsigned)kb, (unsigned)nb), dim3(256)}, stream, W.data.ptr, W.n, W.k, codes.ptr, scale.ptr, ld));
    DLLM__CUDA(cudaStreamSynchronize(stream));
    W.data = std::move(codes);
    W.scale = std::move(scale);
    W.format = DLLM__W_E4M3_BLOCK;
    return DLLM_OK;
}

/* [SoloQ] The arguments of soloq_quantize_rows / soloq_produce_rows for `rows` rows d wide, rotated by rot and, with
 * quantize, quantised in format f into row_scale and values (the GEMM input); sources and other outputs are the caller's. */
static soloq_args dllm__soloq_args(const dllm__rotation_dev &rot, dllm__q4_format f, bool quantize, bool bias_correction, int rows, int d,
                                   void *row_scale, void *values) {
    soloq_args a = {};
    a.rows = rows, a.d = d;
    a.perm = rot.perm.as<int>(), a.signs = (const unsigned char *)rot.signs.ptr, a.mixer = rot.mixer.as<float>();
    a.rot_b = rot.b, a.rot_k = rot.k, a.rot_norm = rot.norm;
    a.row_scale = (float *)row_scale, a.values = (bf16_t *)values;
    a.format = (int)f, a.quantize = quantize, a.bias_correction = bias_correction, a.cluster = 1;
    return a;
}

/* [SoloQ clusters] The CTAs a row of d elements takes: the most, up to 8 (a portable cluster), that split it into slices
 * of whole reduction segments and whole rotation blocks of b; 1 where clusters are unavailable. A 32-row block step
 * then fills the GPU instead of 32 of its SMs. */
static int dllm__soloq_split(const dllm__soloq_kernels &k, int d, int b) {
    if (!k.clusters || d <= dllm__soloq_segment || d % dllm__soloq_segment) return 1;
    for (int C = 8; C > 1; C--)
        if ((d / dllm__soloq_segment) % C == 0 && (d / C) % b == 0) return C;
    return 1;
}

/* The threads of a CTA holding a slice of n elements, `asked` the caller's (producer 1: at least its norm's threads). A
 * row's bits do not depend on them. Many rows: smaller CTAs, several an SM, for the norm producer (its norm's own
 * threads) and producer 0 (256); measured on the H200 (LLaDA-8B, SoloQ-I, N=1024 forward): add+norm 7.8 -> 5.4 ms, the
 * O GEMM's producer 6.0 -> 5.1; 256 threads made the SwiGLU producer (rows of 12288) slower, 8.9 -> 11.4. */
static unsigned dllm__soloq_threads(const soloq_args &a, int n, unsigned asked) {
    if (a.producer == 1) return a.rows > 64 ? dllm__norm_threads(a.d / 8) : asked;
    const unsigned t = std::min<unsigned>(asked, (unsigned)std::max(128, dllm__round_up(n / 4, 32)));
    return a.producer == 0 ? std::min(t, a.rows > 64 ? 256u : dllm__soloq_quantize_threads) : t;
}

/* One CTA of `threads` a row: soloq_quantize_rows for producer 0, else soloq_produce_rows. */
static dllm_status dllm__soloq_launch(const dllm__soloq_kernels &k, soloq_args a, unsigned threads, cudaStream_t stream) {
    // Split only few rows (a block step's), and not the norm producer, whose every CTA would normalise the whole row:
    // measured on the H200 (LLaDA-8B shape, SoloQ-I), splitting every launch took the block step from 8.6 to 9.1 ms and
    // the 1024-row forward from 57 to 100 ms; the SwiGLU producer alone went from 1.38 to 1.09 ms a step, while
    // splitting the norm producer too (DLLM_SOLOQ_SPLIT=2) took its 64 launches from 1.28 to 2.11 ms a step.
    const int split = dllm__env().soloq_split >= 0 ? dllm__env().soloq_split : 1;
    a.cluster = split == 0 || (split == 1 && a.producer == 1) || a.rows > 64 ? 1 : dllm__soloq_split(k, a.d, a.rot_b);
    const int n = a.d / a.cluster;  // shared memory: the row buffer (d), a slice, producer 1's normalised row
    const size_t smem = (size_t)(a.d + n + (a.producer == 1 ? a.d : 0)) * 4;
    if (smem > (size_t)k.max_smem)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "SoloQ on this GPU quantises rows of at most %d KB of shared memory, a row of %d elements needs %zu",
                          k.max_smem / 1024, a.d, smem / 1024);
    const dllm__grid g(dim3((unsigned)a.rows * (unsigned)a.cluster), dim3(dllm__soloq_threads(a, n, threads)), smem, (unsigned)a.cluster);
    return a.producer ? k.soloq_produce_rows.launch(g, stream, a) : k.soloq_quantize_rows.launch(g, stream, a);
}

/* [SoloQ] soloq_quantize_rows over `rows` bf16 rows of x (d wide, x_stride apart): rotated by rot and, with quantize,
 * quantised in format f into whichever of codes, block_scales, row_scale, values and (integer formats) values_i8 are
 * given. */
static dllm_status dllm__soloq_quantize_rows(const dllm__soloq_kernels &k, const dllm__rotation_dev &rot, dllm__q4_format f, bool quantize,
                                             bool bias_correction, const void *x, u64 x_stride, int rows, int d, void *codes,
                                             void *block_scales, void *row_scale, void *values, cudaStream_t stream, void *values_i8 = nullptr) {
    soloq_args a = dllm__soloq_args(rot, f, quantize, bias_correction, rows, d, row_scale, values);
    a.x = x, a.x_stride = x_stride, a.values_i8 = (signed char *)values_i8;
    a.codes = (unsigned char *)codes, a.block_scales = (unsigned char *)block_scales;
    return dllm__soloq_launch(k, a, d >= 4096 ? 1024 : d >= 2048 ? 512 : 256, stream);
}

/* [INT8 GEMM] y [M x N] (bf16 or fp32, row stride ldy) = ((float)(X . C_w^T) s_x) s_w: X the int8 C values of M
 * activation rows [M][K], s_x their token scales, the weights N stored 4-bit rows of an integer format (codes [N][K / 2],
 * row scales s_w). Per chunk of `chunk` weight rows: their C values unpacked into w_i8 (chunk x K bytes), cuBLASLt's
 * INT8 GEMM into acc (M x chunk int32: the sums exact, so any algorithm and split give the same bits and a row's result
 * never depends on M) and the epilogue soloq_scale_rows_i32 into y's columns of the chunk. Twin: dllm__cpu_i8_gemm on
 * the rows' C values (dllm__q4_row_values). K a multiple of 8, N and chunk of 4; device buffers from cudaMalloc. */
static dllm_status dllm__q4_int8_gemm_run(const dllm__soloq_kernels &Q, dllm__gemm &gemm, dllm__q4_format f, const void *codes, const float *s_w,
                                          const void *X, const float *s_x, void *y, int ldy, cudaDataType_t out, int M, int N, int K, int chunk, void *w_i8,
                                          int *acc, cudaStream_t stream) {
    if (!dllm__q4_int_max(f)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "INT8 GEMM: %s weights do not decode to integers", dllm__q4_names[f]);
    if (M < 0 || K <= 0 || K % 8 || N % 4 || chunk <= 0 || chunk % 4 || ldy < N)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "INT8 GEMM: K (%d) must be a positive multiple of 8, N (%d) and the chunk (%d) multiples of 4, ldy (%d) >= N",
                          K, N, chunk, ldy);
    if (!codes || !s_w || !X || !s_x || !y || !w_i8 || !acc) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "INT8 GEMM: a null operand");
    const size_t out_bytes = out == CUDA_R_32F ? 4 : 2;
    for (int n0 = 0; n0 < N && M > 0; n0 += chunk) {
        const int nc = std::min(chunk, N - n0);
        const unsigned char *rows = (const unsigned char *)codes + (size_t)n0 * (K / 2);
        DLLM__TRY(Q.soloq_unpack_rows_i8.launch({dim3((unsigned)(K / 8 + 127) / 128, (unsigned)nc), dim3(128)}, stream, rows, (int)f, nc, K,
                                                (signed char *)w_i8));
        DLLM__TRY(gemm.run_i8(X, w_i8, acc, M, nc, K, stream));
        DLLM__TRY(Q.soloq_scale_rows_i32.launch({dim3((unsigned)(nc + 255) / 256, (unsigned)M), dim3(256)}, stream, acc, M, nc, s_x, s_w + n0,
                                                (char *)y + (size_t)n0 * out_bytes, out == CUDA_R_32F ? 1 : 0, (u64)ldy));
    }
    return DLLM_OK;
}

/* [SoloQ] A BF16 weight into DLLM__W_Q4 on the device, rotated by its site's R (twin: dllm__soloq_quantize_linear); the
 * bf16 copy is released. */
static dllm_status dllm__quantize_linear_q4(dllm__linear &W, const dllm__soloq_options &o, uint32_t site, const dllm__soloq_kernels &k,
                                            cudaStream_t stream) {
    std::shared_ptr<dllm__rotation_dev> rot = std::make_shared<dllm__rotation_dev>();
    DLLM__TRY(dllm__rotation_upload(dllm__make_rotation(o.rotation, W.k, o.seed, site), *rot));
    std::unique_ptr<dllm__q4_site> q(new dllm__q4_site);
    q->format = o.weights;
    q->rot = rot;
    dllm__dbuf codes, scale;
    DLLM__TRY(codes.fit((size_t)W.n * W.k / 2, "SoloQ weights"));
    DLLM__TRY(scale.fit((size_t)W.n * 4, "SoloQ weights"));
    if (o.weights == DLLM__Q4_NVFP4) DLLM__TRY(q->block_scales.fit((size_t)W.n * ((W.k + 15) / 16), "SoloQ weights"));
    DLLM__TRY(dllm__soloq_quantize_rows(k, *rot, o.weights, true, o.bias_correction, W.data.ptr, (u64)W.k, W.n, W.k, codes.ptr,
                                        q->block_scales.ptr, scale.ptr, nullptr, stream));
    DLLM__CUDA(cudaStreamSynchronize(stream));
    W.data = std::move(codes);
    W.scale = std::move(scale);
    W.format = DLLM__W_Q4;
    W.q4 = std::move(q);
    return DLLM_OK;
}

/* [SoloQ] Every layer's linears (layer 0 too, as the CPU reference: rows stay independent, so LaCache stays exact) and,
 * if asked, the LM head (a tied one from a copy of the embedding table); a quantised checkpoint's are there already. */
static dllm_status dllm__gpu_weights_quantize_q4(const dllm_model &m, dllm__gpu_weights &w, const dllm__soloq_kernels &k, cudaStream_t stream) {
    for (size_t l = 0; l < w.layers.size() && !m.soloq; l++) {
        dllm__gpu_layer &G = w.layers[l];
        DLLM__TRY(dllm__quantize_linear_q4(G.qkv, w.soloq, dllm__soloq_site_id(l, DLLM__SOLOQ_QKV), k, stream));
        DLLM__TRY(dllm__quantize_linear_q4(G.o, w.soloq, dllm__soloq_site_id(l, DLLM__SOLOQ_O), k, stream));
        DLLM__TRY(dllm__quantize_linear_q4(G.gu, w.soloq, dllm__soloq_site_id(l, DLLM__SOLOQ_GU), k, stream));
        DLLM__TRY(dllm__quantize_linear_q4(G.down, w.soloq, dllm__soloq_site_id(l, DLLM__SOLOQ_DOWN), k, stream));
    }
    if (!w.soloq.quantize_head || w.head.format == DLLM__W_Q4) return DLLM_OK;
    const dllm__config &c = m.cfg;
    if (!w.head.data.ptr) {  // tied: the head gets its own (quantised) copy, the embedding gather keeps the table
        w.head.format = DLLM__W_BF16, w.head.n = c.n_vocab, w.head.k = c.n_embd;
        DLLM__TRY(w.head.data.fit((size_t)c.n_vocab * c.n_embd * 2, "the LM head"));
        DLLM__CUDA(cudaMemcpyAsync(w.head.data.ptr, w.embed.ptr, w.head.data.bytes, cudaMemcpyDeviceToDevice, stream));
    }
    return dllm__quantize_linear_q4(w.head, w.soloq, dllm__soloq_site_id(w.layers.size(), DLLM__SOLOQ_HEAD), k, stream);
}

/* The weight formats in effect: layer 0 stays BF16 (the paper: quantising it costs accuracy; and LaCache caches its work). */
static dllm_status dllm__gpu_weights_quantize(dllm__gpu_weights &w, const dllm__rowwise_kernels &k, cudaStream_t stream) {
    for (size_t l = 1; l < w.layers.size(); l++) {
        dllm__gpu_layer &G = w.layers[l];
        if (w.fp8_ffn) {
            DLLM__TRY(dllm__quantize_linear_e4m3(G.gu, k, stream));
            DLLM__TRY(dllm__quantize_linear_e4m3(G.down, k, stream));
        }
        if (w.fp8_attn) {
            DLLM__TRY(dllm__quantize_linear_e4m3(G.qkv, k, stream));
            DLLM__TRY(dllm__quantize_linear_e4m3(G.o, k, stream));
        }
    }
    return DLLM_OK;
}

static dllm_status dllm__gpu_weights_build(const dllm_model &m, const dllm__rowwise_kernels &k, const dllm__soloq_kernels *q, dllm__gpu_weights &w) {
    cudaStream_t stream = nullptr;
    DLLM__CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const int64_t before = dllm__device_bytes;
    const double t0 = dllm__now_ms();
    dllm_status s = m.random_weights ? dllm__gpu_weights_random(m, k, stream, w) : dllm__gpu_weights_upload(m, k, stream, w);
    if (s == DLLM_OK) s = dllm__gpu_weights_quantize(w, k, stream);
    if (s == DLLM_OK && w.soloq.enabled) {
        s = q ? dllm__gpu_weights_quantize_q4(m, w, *q, stream) : dllm__fail(DLLM_ERR_INTERNAL, "SoloQ weights without SoloQ kernels");
        if (s == DLLM_OK) dllm__log(DLLM_LOG_INFO, "SoloQ: quantised on the device in %.1f s", (dllm__now_ms() - t0) / 1e3);
    }
    cudaStreamDestroy(stream);
    w.bytes = (size_t)std::max<int64_t>(0, dllm__device_bytes - before);
    return s;
}

/* The model's weights on the current device in the given formats: the copy another context already made, or a new one
 * that the model then shares. The model's lock is held while a copy is built, so two contexts created at once on one
 * model build it once. */
/* Whether two SoloQ option sets quantise weights alike (the activation options do not touch the weights). */
static bool dllm__same_soloq_weights(const dllm__soloq_options &a, const dllm__soloq_options &b) {
    if (!a.enabled || !b.enabled) return a.enabled == b.enabled;
    return a.weights == b.weights && a.rotation == b.rotation && a.bias_correction == b.bias_correction && a.quantize_head == b.quantize_head &&
           a.seed == b.seed;
}

static dllm_status dllm__gpu_weights_for(const dllm_model &m, int device, bool fp8_ffn, bool fp8_attn, const dllm__soloq_options &soloq,
                                         const dllm__rowwise_kernels &k, const dllm__soloq_kernels *q, std::shared_ptr<dllm__gpu_weights> &out) {
    std::lock_guard<std::mutex> lock(m.gpu_weights_mutex);
    auto &cache = m.gpu_weights;
    cache.erase(std::remove_if(cache.begin(), cache.end(), [](const std::weak_ptr<dllm__gpu_weights> &w) { return w.expired(); }), cache.end());
    for (const std::weak_ptr<dllm__gpu_weights> &held : cache)
        if (std::shared_ptr<dllm__gpu_weights> w = held.lock())
            if (w->device == device && w->fp8_ffn == fp8_ffn && w->fp8_attn == fp8_attn && dllm__same_soloq_weights(w->soloq, soloq)) {
                out = w;
                return DLLM_OK;
            }
    std::shared_ptr<dllm__gpu_weights> w = std::make_shared<dllm__gpu_weights>();
    w->device = device, w->fp8_ffn = fp8_ffn, w->fp8_attn = fp8_attn, w->soloq = soloq;
    DLLM__TRY(dllm__gpu_weights_build(m, k, q, *w));
    dllm__log(DLLM_LOG_INFO, "GPU weights on device %d: %.2f GB; layers >= 1: FFN %s, attention projections %s", device, w->bytes / 1e9,
              dllm__wformats[w->layers.size() > 1 ? w->layers[1].gu.format : DLLM__W_BF16].name,
              dllm__wformats[w->layers.size() > 1 ? w->layers[1].qkv.format : DLLM__W_BF16].name);
    cache.push_back(w);
    out = std::move(w);
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 16.3 [activations] [forward plan]
// ---------------------------------------------------------------------------------------------------

/* [SoloQ] Weight rows a DLLM__W_Q4 GEMM dequantises at a time (a multiple of 64, about 16M elements: 32 MB of bf16). */
static int dllm__q4_chunk_rows(int n, int k) { return std::min(n, std::max(64, (16 << 20) / k / 64 * 64)); }

/* [INT8 GEMM] The weight rows of an N x K weight the INT8 path unpacks at a time: as many chunks as the BF16 path's
 * (dllm__q4_chunk_rows) but of equal size, a multiple of 4 and at most the BF16 path's (so act_.q4w and act_.q4acc hold
 * them): down's 4096 rows of K = 12288 go as 4 x 1024 instead of 3 x 1344 + 64, whose last GEMM would be a sliver. N a
 * multiple of 4. */
static int dllm__q4_int8_chunk_rows(int n, int k) {
    const int most = dllm__q4_chunk_rows(n, k), pieces = (n + most - 1) / most;
    return dllm__round_up((n + pieces - 1) / pieces, 4);
}

/* A context's activation buffers. Shapes: M = rows forwarded (sequences x rows), M_pad = 16 ceil(M / 16) (an FP8 GEMM
 * writes whole 16-row tiles), d = n_embd, qkv = (n_head + 2 n_kv) head_dim, q = n_head head_dim, ff = n_ff, L = rows
 * of one LM head chunk (at most dllm__lm_chunk_rows) per sequence, S = canvas rows of one sequence. Grown, never
 * shrunk, to the largest forward seen; a buffer that moves bumps `generation` (captured graphs point into it). */
struct dllm__activations {
    dllm__dbuf h;            // fp32 [M][d]: the residual stream
    dllm__dbuf a;            // bf16 [M][d]: a norm's output, the next GEMM's input
    dllm__dbuf qkv;          // bf16 [M_pad][qkv]: fused projection rows, biased and rotated in place
    dllm__dbuf att;          // bf16 [M][q]: attention output
    dllm__dbuf delta;        // bf16 [M_pad + 16][d]: a branch's output (O projection, then down), added into h
    dllm__dbuf gu;           // bf16 [M_pad][2 ff]: gate|up rows
    dllm__dbuf f;            // bf16 [M][ff]: SwiGLU output
    dllm__dbuf y;            // bf16 [sequences x L][d]: the final norm's output
    dllm__dbuf h_cut;        // fp32 [sequences x L][d]: [truncation] the last layer's residual when it computes the output rows alone
    dllm__dbuf logits;       // fp32 [sequences][L][vocab]: one LM head chunk
    dllm__dbuf partials;     // conf_partial [L][vocab / dllm__vocab_slice]
    dllm__dbuf x0, conf, deferred;  // per candidate row: token (int), ranking key (double), EOS/EoT deferral (uint8)
    dllm__dbuf cutoff;       // fp32 [S]: the sampler filters' cutoff logit per candidate row (top-k / top-p / min-p)
    dllm__dbuf canvas;       // int [sequences][S] (CFG: conditional, then unconditional)
    dllm__dbuf is_prompt;    // uint8 [S]
    dllm__dbuf state;        // dllm_step_state
    dllm__dbuf committed;    // int [S]: the positions the last step committed
    dllm__dbuf positions;    // int [S]: [DPad] the RoPE position of each canvas row
    dllm__dbuf h0;           // fp32 [M][d]: [EmbedCache] layer 0's embeddings
    dllm__dbuf qkv0;         // bf16 [M][qkv]: [RoPECache] layer 0's rotated Q/K/V
    dllm__dbuf fa_state;     // [FACache] layer 0's online-softmax state per query tile outside the block
    dllm__dbuf attn_partial; // split-KV attention states (K/V-cache steps)
    std::vector<dllm__dbuf> kv;      // [dual cache] [prefix cache] per layer the fused rotated Q/K/V rows [sequences][S]
    dllm__dbuf act8, act8_scale;     // [FP8] one GEMM input, E4M3 [M_pad][k_pad], and its scales [k_pad / 128][M_pad]
    dllm__dbuf act8_chunk_scale;     // [FP8] [batch] one launch's scales [k_pad / 128][rows] (gemm_fp8_batch)
    dllm__dbuf q4a, q4a_scale;       // [SoloQ] one GEMM input: bf16 C values [M][k], fp32 token scales [M]
    dllm__dbuf q4w, q4acc;           // [SoloQ] a chunk of dequantised weight rows (bf16), its fp32 GEMM output [M][chunk]
    dllm__dbuf q4a8;                 // [INT8 GEMM] one GEMM input as int8 C values [M][k] (q4w then holds int8 weight rows, q4acc int32)
    int generation = 0;
    /* Every buffer's address, to tell whether growing moved one. */
    std::vector<const void *> addresses() const {
        std::vector<const void *> p = {h.ptr, a.ptr, qkv.ptr, att.ptr, delta.ptr, gu.ptr, f.ptr, y.ptr, h_cut.ptr, logits.ptr, partials.ptr, x0.ptr,
                                       conf.ptr, deferred.ptr, cutoff.ptr, canvas.ptr, is_prompt.ptr, state.ptr, committed.ptr, positions.ptr, h0.ptr,
                                       qkv0.ptr, fa_state.ptr, attn_partial.ptr, act8.ptr, act8_scale.ptr, q4a.ptr, q4a_scale.ptr, q4w.ptr, q4acc.ptr,
                                       q4a8.ptr, act8_chunk_scale.ptr};
        for (const dllm__dbuf &b : kv) p.push_back(b.ptr);
        return p;
    }
};

static const int dllm__lm_chunk_rows = 256;  // LM head rows per GEMM: bounds the logits buffer
static const int dllm__vocab_slice = 8192;   // vocabulary entries per sampler CTA

/* How layer 0 runs: plainly, or with LaCache's caches filled (a block's first step) or reused (its later steps). */
enum dllm__layer0 { DLLM__L0_PLAIN, DLLM__L0_FILL, DLLM__L0_REUSE };

/* [forward plan] Which rows one forward computes, per sequence. Rows are canvas positions; output rows are raw logit
 * rows (a model with shifted logits predicts position p from row p - 1). Computed once per step (plan_step) or
 * forward (prepare_forward), passed by reference to every stage. */
struct dllm__seq_rows {
    int seq = 0;                 // canvas rows (the keys every query attends to)
    int q0 = 0, q1 = 0;          // rows forwarded: every row, or under a K/V cache after a block's first step the block
                                 // (dual) or the block and what follows (prefix)
    int head0 = 0, head1 = 0;    // [truncation] canvas positions whose predictions the LM head computes
    int out0 = 0, out1 = 0;      // the raw rows that predict them: they reach the final norm and the LM head
    int block0 = 0, block1 = 0;  // the current block: LaCache's reuse, and the attention's tile order
    int rows() const { return q1 - q0; }
    int out_rows() const { return out1 - out0; }
};
struct dllm__forward_plan {
    std::vector<dllm__seq_rows> seqs;     // CFG's unconditional canvas is a second sequence
    dllm__layer0 layer0 = DLLM__L0_PLAIN;  // LaCache's layer-0 mode
    int batch() const { return (int)seqs.size(); }
    /* Until batching lands every sequence of a forward has the same rows (CFG's two canvases): the stages take them from
     * the first and run all sequences at once. */
    const dllm__seq_rows &rows() const { return seqs[0]; }
    bool uniform() const {
        for (const dllm__seq_rows &r : seqs)
            if (r.seq != seqs[0].seq || r.q0 != seqs[0].q0 || r.q1 != seqs[0].q1 || r.head0 != seqs[0].head0 || r.head1 != seqs[0].head1 ||
                r.out0 != seqs[0].out0 || r.out1 != seqs[0].out1 ||
                r.block0 != seqs[0].block0 || r.block1 != seqs[0].block1)
                return false;
        return !seqs.empty();
    }
};

/* [forward plan] [batch] A batched forward (dllm__gpu_backend::forward_batch) over the canvases of a plan: their rows
 * concatenated, sequence i's rows [offsets[i], offsets[i + 1]) (offsets[B] = rows), each row at its own RoPE position (its
 * canvas index, or DPad's position), no padding. Without a K/V cache a sequence's queries are its keys, so one offsets
 * array serves both sides of the varlen attention. raw0/raw1: the unshifted logit rows sequence i wants (its plan rows
 * [r0, r1) with the model's shift applied backwards), canvas indices. */
struct dllm__varlen_layout {
    std::vector<int32_t> ids, positions, offsets;
    std::vector<int> raw0, raw1;
    std::vector<int> out0;  // where sequence i's logit rows start among all sequences' (gathered for one LM head)
    int rows = 0;           // all sequences' rows
    int max_rows = 0;       // the longest sequence's: the attention grid
    int out_rows = 0;       // all sequences' logit rows
    std::vector<int> q0;    // sequence i's first forwarded canvas row (0 without a K/V cache)
    // [dual cache] [prefix cache] dllm__kv_layout_of only: the varlen attention's offsets over 2B - 1 entries (2B values:
    // sequence i is entry 2i, its queries rows [offsets[i], offsets[i + 1]) of the forwarded rows, its keys the n rows of
    // its cache slot; entry 2i + 1 has no query row and only bridges to the next slot, which need not follow), and the
    // cache row each forwarded row's K/V goes to. Cache rows count from the start of one layer's cache.
    std::vector<int32_t> attn_q_offsets, attn_kv_offsets, cache_rows;
    // [block diffusion] dllm__bd_batch_layout_of only: per attention entry its (mask_block, q_index0) (attn_args'
    // varlen_masks); empty: no mask
    std::vector<int32_t> attn_masks;
    bool cached() const { return !cache_rows.empty(); }
};

/* The layout of a plan, checked: every canvas non-empty and within the RoPE tables (max_tokens rows), its logit rows a
 * non-empty range inside it, its positions (DPad) inside the tables. */
static dllm_status dllm__varlen_layout_of(const dllm__config &c, const std::vector<dllm__batch_seq> &plan, int max_tokens, dllm__varlen_layout &v) {
    v = dllm__varlen_layout();
    v.offsets.push_back(0);
    for (size_t i = 0; i < plan.size(); i++) {
        const dllm__batch_seq &s = plan[i];
        if (!s.ids || s.n < 1 || s.n > max_tokens || s.r0 < 0 || s.r1 <= s.r0 || s.r1 > s.n)
            return dllm__fail(DLLM_ERR_INTERNAL, "batched forward: sequence %zu has %d rows (at most %d) and logit rows [%d, %d)", i, s.n, max_tokens, s.r0, s.r1);
        if (v.rows > INT32_MAX - s.n) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "batched forward: more than 2^31 rows");
        for (int r = 0; r < s.n; r++) {
            const int32_t pos = s.positions ? s.positions[r] : r;
            if (pos < 0 || pos >= max_tokens)
                return dllm__fail(DLLM_ERR_INTERNAL, "batched forward: sequence %zu row %d at position %d, outside the RoPE tables (%d)", i, r, pos, max_tokens);
            v.positions.push_back(pos);
        }
        v.ids.insert(v.ids.end(), s.ids, s.ids + s.n);
        v.rows += s.n;
        v.offsets.push_back(v.rows);
        v.raw0.push_back(dllm__logit_row(c, s.r0));
        v.raw1.push_back(dllm__logit_row(c, s.r1 - 1) + 1);
        v.out0.push_back(v.out_rows);
        v.out_rows += v.raw1.back() - v.raw0.back();
        v.max_rows = std::max(v.max_rows, s.n);
        v.q0.push_back(0);
    }
    return DLLM_OK;
}

/* [batch] [dual cache] [prefix cache] The layout of a batched K/V-cache step (forward_batch_kv): each sequence's
 * forwarded rows [q0, q1) concatenated (ids, positions), their K/V bound for rows [q0, q1) of its slot (slot s's rows
 * start at slot_base[s] and hold at most slot_rows[s]), its queries over the slot's first n rows. Checked: a sequence's
 * logit rows (shift applied) among its forwarded ones, its rows within its slot and the RoPE tables, a filling step
 * forwarding every row, no slot twice. */
static dllm_status dllm__kv_layout_of(const dllm__config &c, const std::vector<dllm__batch_seq> &plan, const std::vector<int> &slot_base,
                                      const std::vector<int> &slot_rows, int max_tokens, dllm__varlen_layout &v) {
    v = dllm__varlen_layout();
    v.offsets.push_back(0);
    std::vector<bool> used(slot_base.size(), false);
    for (size_t i = 0; i < plan.size(); i++) {
        const dllm__batch_seq &s = plan[i];
        const bool slot_ok = s.slot >= 0 && (size_t)s.slot < slot_base.size() && !used[(size_t)s.slot];
        if (!s.ids || !slot_ok || s.n < 1 || s.n > std::min(max_tokens, slot_rows[(size_t)s.slot]) || s.q0 < 0 || s.q1 <= s.q0 || s.q1 > s.n ||
            (s.fill && (s.q0 != 0 || s.q1 != s.n)) || s.r0 < 0 || s.r1 <= s.r0 || s.r1 > s.n)
            return dllm__fail(DLLM_ERR_INTERNAL, "batched K/V-cache step: sequence %zu (slot %d, %d rows, forwarded [%d, %d), logit rows [%d, %d)) does not fit",
                              i, s.slot, s.n, s.q0, s.q1, s.r0, s.r1);
        used[(size_t)s.slot] = true;
        const int raw0 = dllm__logit_row(c, s.r0), raw1 = dllm__logit_row(c, s.r1 - 1) + 1;
        if (raw0 < s.q0 || raw1 > s.q1)
            return dllm__fail(DLLM_ERR_INTERNAL, "batched K/V-cache step: sequence %zu wants logit rows [%d, %d) outside its forwarded rows [%d, %d)", i, raw0,
                              raw1, s.q0, s.q1);
        if (v.rows > INT32_MAX - s.n) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "batched forward: more than 2^31 rows");
        for (int r = s.q0; r < s.q1; r++) {
            const int32_t pos = s.positions ? s.positions[r] : r;
            if (pos < 0 || pos >= max_tokens)
                return dllm__fail(DLLM_ERR_INTERNAL, "batched forward: sequence %zu row %d at position %d, outside the RoPE tables (%d)", i, r, pos, max_tokens);
            v.positions.push_back(pos);
            v.cache_rows.push_back(slot_base[(size_t)s.slot] + r);
        }
        v.ids.insert(v.ids.end(), s.ids + s.q0, s.ids + s.q1);
        // entry 2i starts here; entry 2i - 1 (from the previous sequence's end to here) is the bridge, with no query row
        v.attn_q_offsets.push_back(v.rows), v.attn_kv_offsets.push_back(slot_base[(size_t)s.slot]);
        v.rows += s.q1 - s.q0;
        v.attn_q_offsets.push_back(v.rows), v.attn_kv_offsets.push_back(slot_base[(size_t)s.slot] + s.n);
        v.offsets.push_back(v.rows);
        v.raw0.push_back(raw0), v.raw1.push_back(raw1);
        v.out0.push_back(v.out_rows);
        v.out_rows += raw1 - raw0;
        v.max_rows = std::max(v.max_rows, s.q1 - s.q0);
        v.q0.push_back(s.q0);
    }
    return DLLM_OK;
}

/* [batch] One sampler launch of a batched step's device choice (forward_batch_choose): canvas positions [pos0, pos0 + n)
 * of plan sequence seq, whose logits are in the LM-head chunk at hand; sampler row r reads the chunk's logits row
 * (shift0 ? max(r - 1, 0) : r) + lrow0 (sampler_args' logits_row) and its choice goes to choices[out + r]. */
struct dllm__sampler_span {
    int seq = 0, pos0 = 0, n = 0, lrow0 = 0, shift0 = 0, out = 0;
};

/* The sampler launches of the LM-head chunk of gathered logit rows [c0, c0 + rows) of layout v: for each sequence i of
 * the plan with choice0[i] >= 0 (its choices start there; -1: its logits go to the host), the positions of its rows
 * [r0, r1) whose logits row (dllm__logit_row, gathered: v.out0[i] + row - v.raw0[i]) is in the chunk. A position reads
 * one row and the rows rise with the position, so each sequence's are one range; under the shift positions 0 and 1
 * both read row 0 (shift0, as the solo step's sample_rows). */
static std::vector<dllm__sampler_span> dllm__batch_sampler_spans(const dllm__config &c, const std::vector<dllm__batch_seq> &plan,
                                                                 const dllm__varlen_layout &v, const std::vector<int> &choice0, int c0, int rows) {
    std::vector<dllm__sampler_span> spans;
    for (size_t i = 0; i < plan.size(); i++) {
        if (choice0[i] < 0) continue;
        auto gathered = [&](int p) { return v.out0[i] + dllm__logit_row(c, p) - v.raw0[i]; };
        int p0 = plan[i].r0, p1 = plan[i].r1;
        while (p0 < p1 && gathered(p0) < c0) p0++;
        while (p1 > p0 && gathered(p1 - 1) >= c0 + rows) p1--;
        if (p0 == p1) continue;
        dllm__sampler_span s;
        s.seq = (int)i, s.pos0 = p0, s.n = p1 - p0, s.lrow0 = gathered(p0) - c0;
        s.shift0 = c.shift_logits && p0 == 0, s.out = choice0[i] + p0 - plan[i].r0;
        spans.push_back(s);
    }
    return spans;
}

/* [batch] [block diffusion] A slot of bd_forward_batch between forwards: its committed rows [0, n) and, after a
 * BLOCK_FULL, the block cache's rows [n, n + block) (0: none). */
struct dllm__bd_slot {
    int n = 0, block = 0;
};

// ---------------------------------------------------------------------------------------------------
// 16.4 The backend
// ---------------------------------------------------------------------------------------------------

/* [bd graphs] A block-diffusion step forward (16.4.3) replayed as a CUDA graph. A block runs many forwards of one shape
 * (only the block's ids change, and they reach the device by a copy before the replay), and the next block the same
 * shapes again over a longer committed cache (only kernel arguments change: the graph is updated in place). A graph is
 * held per slot: `slot` names what fixes its kernels, their grids and the arguments constant for a generation (kind,
 * rows, sub-block offset, mask, output rows, whether a committed cache exists: layer 0's attention path, the split-KV
 * count, the device token choice's rows and sampling); `baked` adds what changes from block to block (the committed
 * length and the block cache's rows, the sampled rows' position) and the device buffers the graph points into. */
struct dllm__bd_graph_id {
    std::string slot, baked;
};
static dllm__bd_graph_id dllm__bd_graph_keys(const dllm__bd_call &call, const dllm__bd_pick *pick, int n_committed, int block_rows, int kv_splits,
                                            const std::string &buffers) {
    dllm__bd_graph_id id;
    id.slot = dllm__format("k%d T%d o%d m%d r%d-%d c%d s%d", (int)call.kind, call.T, call.offset, call.mask_block, call.r0, call.r1, n_committed > 0,
                           kv_splits);
    if (pick) {
        const dllm__sampling &s = pick->sampling;
        id.slot += dllm__format(" pick n%d l%d s%d %.17g %d %d %.17g %llu %d %d %d %d %d %.17g %.17g", pick->n, pick->lrow0, pick->shift0,
                                s.temperature, (int)s.remasking, (int)s.tempered_conf, s.alg_temp, (unsigned long long)s.seed, (int)s.eos_logit_inf,
                                (int)s.defer_eos_eot, s.eos_id, s.eot_id, s.top_k, s.top_p, s.min_p);
    }
    id.baked = id.slot + dllm__format(" | n%d b%d p%d ", n_committed, block_rows, pick ? pick->pos0 : -1) + buffers;
    return id;
}

/* What one forward of a slot does: the slot's first forward runs eagerly (cuBLASLt's and the modules' one-time work
 * stay outside any capture), the next is captured and instantiated; later ones replay it when it baked in the same,
 * else are captured again and update it in place (re-instantiated where CUDA refuses the update). */
enum dllm__graph_action { DLLM__GRAPH_EAGER, DLLM__GRAPH_REPLAY, DLLM__GRAPH_UPDATE, DLLM__GRAPH_INSTANTIATE };
struct dllm__bd_graph {
    cudaGraphExec_t exec = nullptr;  // destroyed by its owner (dllm__gpu_backend)
    std::string baked;
    bool warmed = false;
    bool eager_only = false;  // a capture failed: the slot's forwards run eagerly (bd_replay warns once)
};
static dllm__graph_action dllm__bd_graph_next(dllm__bd_graph &g, const dllm__bd_graph_id &id) {
    if (!g.warmed || g.eager_only) {
        g.warmed = true;
        return DLLM__GRAPH_EAGER;
    }
    if (g.exec && g.baked == id.baked) return DLLM__GRAPH_REPLAY;
    const dllm__graph_action a = g.exec ? DLLM__GRAPH_UPDATE : DLLM__GRAPH_INSTANTIATE;
    g.baked = id.baked;  // what the capture about to run bakes in
    return a;
}
static const size_t dllm__bd_graph_slots = 64;  // a context's captured block-diffusion forwards at most (all dropped past it)

struct dllm__stage_timer;

class dllm__gpu_backend : public dllm__backend_impl {
  public:
    static dllm_status create(const dllm_model &m, const dllm_ctx_params &p, int max_tokens, std::unique_ptr<dllm__backend_impl> &out) {
        std::unique_ptr<dllm__gpu_backend> g(new dllm__gpu_backend(m, max_tokens));
        g->precision_ = p.precision;
        DLLM__TRY(dllm__soloq_options_for(p.precision, p.quantize_lm_head, g->soloq_));
        g->soloq_ = dllm__soloq_effective_options(m, g->soloq_);  // a quantised checkpoint's stored options
        g->kvq_.setup(m.cfg, p.kv_quant, p.kv_sink_tokens);
        DLLM__TRY(g->init(p.device));
        out = std::move(g);
        return DLLM_OK;
    }
    ~dllm__gpu_backend() override {
        if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
        bd_graphs_drop();
        if (stream_) cudaStreamDestroy(stream_);
        if (host_pinned_) cudaFreeHost(host_pinned_);
    }

    dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) override;
    dllm_status begin(dllm__decode &st) override;
    dllm_status begin_block(dllm__decode &st) override;
    dllm_status step(dllm__decode &st, std::vector<int32_t> &committed, bool want_host) override;
    dllm_status finish(dllm__decode &st) override;
    // block diffusion (16.4.3)
    dllm_status bd_begin(int rows) override;
    dllm_status bd_forward(const dllm__bd_call &call, float *logits) override;
    bool bd_chooses() const override { return !bd_host_choice_; }
    dllm_status bd_forward_choose(const dllm__bd_call &call, const dllm__bd_pick &pick, dllm__choice *out) override;
    void bd_facache_rows(int64_t &rows, int64_t &reused) const override { rows = bdfa_rows_seen_, reused = bdfa_rows_reused_; }
    // [batch] decoding (dllm_generate_batch): every canvas's rows in one forward
    dllm_status forward_batch(const std::vector<dllm__batch_seq> &plan, float *out) override;
    /* Why this context's forwards cannot batch (the items then decode one after another), or null. */
    const char *batch_unsupported() const;
    // [batch] [dual cache] [prefix cache] the batched K/V-cache step (16.4.1): its slots and its forward
    const char *batch_kv_unsupported() const;
    dllm_status batch_kv_reserve(const std::vector<int> &rows) override;
    dllm_status forward_batch_kv(const std::vector<dllm__batch_seq> &plan, float *out) override;
    // [batch] [block diffusion] the batched block-diffusion forward (16.4.1; DLLM_BD_BATCH=1): its slots and its forward
    const char *bd_batch_unsupported() const;
    dllm_status bd_batch_reserve(const std::vector<int> &rows) override;
    dllm_status bd_forward_batch(const std::vector<dllm__bd_seq> &seqs, float *logits, dllm__choice *choices) override;
    /* The layout of a plan over the reserved slots (dllm__kv_layout_of), for batch_logits. */
    dllm_status kv_layout(const std::vector<dllm__batch_seq> &plan, dllm__varlen_layout &v) const {
        return dllm__kv_layout_of(m_.cfg, plan, bkv_base_, bkv_rows_, max_tokens_, v);
    }
    /* The batched forward of a layout (dllm__varlen_layout_of) with the LM head over its gathered logit rows in chunks;
     * on_chunk(c0, rows) runs (on the host, stream-ordered) after each chunk's logits are in the logits buffer. Each
     * sequence's logits carry the bits they have in a batch of any other sequences, or alone. */
    template <class F>
    dllm_status batch_logits(const dllm__varlen_layout &v, F &&on_chunk) {
        DLLM__TRY(prepare_batch(v));
        batch_on_ = true;  // every GEMM DLLM__ROWS_BATCH (lacache_rows, layer_rows)
        dllm_status s = forward_varlen(v);
        const dllm__config &c = m_.cfg;
        for (int c0 = 0; s == DLLM_OK && c0 < v.out_rows; c0 += dllm__lm_chunk_rows) {
            const int rows = std::min(dllm__lm_chunk_rows, v.out_rows - c0);
            s = gemm(W_->lm_head(c), (const char *)act_.y.ptr + (size_t)c0 * c.n_embd * 2, act_.logits.ptr, rows, DLLM__ROWS_BATCH, CUDA_R_32F);
            if (s == DLLM_OK) s = on_chunk(c0, rows);
        }
        batch_on_ = false;
        return s;
    }
    dllm_status batch_logits_to_host(const std::vector<dllm__batch_seq> &plan, const dllm__varlen_layout &v, float *out);
    // [batch] the token choice of a batched step on the device
    bool batch_chooses() const override { return !batch_unsupported(); }
    dllm_status forward_batch_choose(const std::vector<dllm__batch_seq> &plan, bool kv, float *logits, dllm__choice *choices) override;
    /* batch_logits with the sampler run over each chunk's rows of the sequences with a sampling (their choices to the
     * host), and the other sequences' logits copied to the host as batch_logits_to_host does. */
    dllm_status batch_choose(const std::vector<dllm__batch_seq> &plan, const dllm__varlen_layout &v, float *logits, dllm__choice *choices);

    // [debug hooks] what tests and benchmarks read (16.5)
    DLLM__TEST_HOOKS_BEGIN
    DLLM__TEST_HOOK const dllm__arch &arch() const { return arch_; }
    DLLM__TEST_HOOK cudaStream_t stream() const { return stream_; }
    /* [batch] Rows whose tokens batch_choose chose on the device, since the context began. */
    DLLM__TEST_HOOK int64_t batch_rows_chosen() const { return bch_rows_; }
    /* Whether layers >= 1 run their FFN / attention projections in FP8 (requested and supported here). */
    DLLM__TEST_HOOK bool fp8_ffn_active() const { return W_->fp8_ffn; }
    DLLM__TEST_HOOK bool fp8_attn_active() const { return W_->fp8_attn; }
    /* The GEMM those run on (DLLM__FP8_NONE when neither is active). */
    DLLM__TEST_HOOK dllm__fp8_gemm fp8_gemm() const { return fp8_gemm_; }
    /* Block diffusion's token choice on the host (bd_forward's logits through dllm__choose) instead of the device's:
     * what gpu.bd_choose_on_device_matches_the_host compares the device's choice with. */
    DLLM__TEST_HOOK void bd_choose_on_host(bool on) { bd_host_choice_ = on; }
    /* [FACache] Layer 0 through flash_attn instead of the split attention: what the split one is compared with. */
    DLLM__TEST_HOOK void bd_split_attention(bool on) { bdfa_off_ = !on; }
    /* The shared device weights this context reads. */
    DLLM__TEST_HOOK const dllm__gpu_weights &weights() const { return *W_; }
    /* A single plain forward of ids[0..n) (no block, so tiles in plain order), for dllm_logits and benchmarks. */
    dllm_status prepare_forward(const int32_t *ids, int n, int raw_rows);
    /* The forward prepared above with the LM head over output rows [raw0, raw1) in chunks; on_chunk(c0, rows) runs (on the
     * host, stream-ordered) after each chunk's logits are in the logits buffer. */
    template <class F>
    dllm_status forward_logits(int n, int raw0, int raw1, F &&on_chunk) {
        dllm__forward_plan plan;
        dllm__seq_rows r;
        r.seq = n, r.q0 = 0, r.q1 = n, r.out0 = raw0, r.out1 = raw1;
        plan.seqs.assign(1, r);
        DLLM__TRY(forward(plan, act_.canvas.as<int>()));
        for (int c0 = 0; c0 < raw1 - raw0; c0 += dllm__lm_chunk_rows) {
            int rows = std::min(dllm__lm_chunk_rows, raw1 - raw0 - c0);
            DLLM__TRY(lm_head(1, raw1 - raw0, c0, rows));
            mark("lm head");
            DLLM__TRY(on_chunk(c0, rows));
        }
        return DLLM_OK;
    }
    DLLM__TEST_HOOK void set_timer(dllm__stage_timer *t) { timer_ = t; }
    DLLM__TEST_HOOK dllm_status profile_step(const dllm__decode &st, dllm__stage_timer &t);
    DLLM__TEST_HOOK void set_debug_rows(std::map<std::pair<int, int>, std::vector<float>> *rows) { debug_rows_ = rows; }
    DLLM__TEST_HOOK int last_layer_rows() const { return last_layer_rows_; }
    DLLM__TEST_HOOK void set_q4_int8(bool on) { q4_int8_ = on; }  // off: gemm_q4's INT8 path never runs (the tests compare)
    DLLM__TEST_HOOK long q4_int8_launches() const { return q4_int8_launches_; }
    DLLM__TEST_HOOK dllm_status kvq_snapshot(dllm__kvq &q, std::vector<float> &k, std::vector<float> &v);
    /* [KV quant] Whether the attention over the quantised cache runs kvq_flash (DLLM_KVQ_TC=1 at the last bd_begin). */
    DLLM__TEST_HOOK bool kvq_tc_active() const { return kvq_tc_on_; }
    /* [bd graphs] Block-diffusion forwards since the context was made, by what they did (dllm__graph_action). */
    DLLM__TEST_HOOK int64_t bd_graph_count(dllm__graph_action a) const { return bd_graph_counts_[a]; }
    DLLM__TEST_HOOK int64_t bd_graph_refusals() const { return bd_graph_refusals_; }
    /* [FP8] [batch] gemm() over M bf16 rows x (device) into y, DLLM__ROWS_BATCH or (batch false, at most pin_m rows)
     * INDEPENDENT, the buffers sized for M rows: what batch_gpu.fp8_gemm_batch_equals_the_solo_pinned_gemm compares. */
    DLLM__TEST_HOOK dllm_status gemm_rows(const dllm__weight_view &W, const void *x, void *y, int M, bool batch) {
        DLLM__TRY(fit_buffers(1, M, 1));
        return gemm(W, x, y, M, batch ? DLLM__ROWS_BATCH : DLLM__ROWS_INDEPENDENT);
    }
    DLLM__TEST_HOOKS_END

  private:
    dllm__gpu_backend(const dllm_model &m, int max_tokens) : m_(m), max_tokens_(max_tokens) {}
    dllm_status init(int device);
    dllm_status load_kernels();
    dllm_status choose_precision(const char *gpu_name, bool &fp8_ffn, bool &fp8_attn);
    dllm_status fit_buffers(int batch, int seq, int lm_rows, bool lacache = false, bool kv_cache = false);
    // the forward and its stages (16.4.1)
    dllm_status forward(const dllm__forward_plan &plan, const int *ids_dev);
    dllm_status gemm(const dllm__weight_view &W, const void *x, void *y, int M, dllm__rows rows, cudaDataType_t out = CUDA_R_16BF);
    dllm_status gemm_q4(const dllm__weight_view &W, const void *x, void *y, int M, dllm__rows rows, cudaDataType_t out);
    /* [SoloQ] Layers whose linears are DLLM__W_Q4; from layer 1 on their attention input is made by the fused producer
     * (layer 0's by LaCache's paths, which quantise it in the GEMM). */
    bool q4(size_t l) const { return W_->layers[l].gu.format == DLLM__W_Q4; }
    bool produced_attn_input(size_t l) const { return fp8_attn(l) || (q4(l) && l > 0); }
    dllm_status soloq_add_rmsnorm(const dllm__weight_view &W, const float *h_in, float *h_out, const void *delta, const void *w, int M);
    dllm_status soloq_swiglu(const dllm__weight_view &W, const void *gu, int M);
    bool q4_int8(const dllm__weight_view &W, int M, bool pinned) const;
    dllm_status gemm_q4_int8(const dllm__weight_view &W, void *y, int M, cudaDataType_t out);
    soloq_args soloq_producer_args(const dllm__weight_view &W, int M);
    dllm__rows lacache_rows() const { return batch_on_ ? DLLM__ROWS_BATCH : kv_on_ ? DLLM__ROWS_TUNED : DLLM__ROWS_INDEPENDENT; }
    dllm__rows layer_rows(size_t l) const { return batch_on_ ? DLLM__ROWS_BATCH : last_cut(l) ? lacache_rows() : DLLM__ROWS_TUNED; }
    /* The last layer (from layer 1 on): its rows after the attention feed only the output rows, so it may compute those
     * alone (forward), and its GEMMs are then row-independent. */
    bool last_cut(size_t l) const { return l > 0 && l + 1 == W_->layers.size(); }
    bool fp8_ffn(size_t l) const { return W_->fp8_ffn && l > 0; }
    bool fp8_attn(size_t l) const { return W_->fp8_attn && l > 0; }
    int act8_rows(int M) const { return dllm__round_up(M, 16); }
    dllm_status embed_gather(const int *ids, int n_rows, float *h);
    dllm_status embed_gather_rows(const int *ids, int batch, int seq, int q0, int rows, float *h);
    dllm_status add_rmsnorm(const float *h_in, float *h_out, const void *delta, const void *w, void *y, int batch, int seq, int row0, int n_rows);
    dllm_status add_rmsnorm_e4m3(const float *h_in, float *h_out, const void *delta, const void *w, int batch, int seq);
    dllm_status quantize_rows_e4m3(const void *x, int M, int K);
    dllm_status gemm_fp8_batch(const dllm__weight_view &W, const void *x, void *y, int M);
    dllm_status rope_qkv(void *qkv, const void *bias, int n_rows, int seq_len, int pos0);
    dllm_status attention(int batch, int seq, int q_rows, const void *q_rows_qkv, size_t q_bstride, const void *keys_qkv, void *out, int fa_mode,
                          bool may_split = false, bool wide = false);
    dllm_status layer0_attention(const dllm__forward_plan &plan, const int *ids);
    dllm_status self_attention(size_t layer, int batch, const dllm__seq_rows &r, int o0, int orows);
    dllm_status output_and_ffn(size_t l, int batch, int rows, int o0, int orows, const float *h_res, float *h_out);
    dllm_status project_o(size_t l, int M, int r0);
    dllm_status ffn(size_t l, int M, const float *h_in, float *h_out, int r0);
    dllm_status lm_head(int batch, int raw_rows, int c0, int rows);
    // the batched forward (16.4.1)
    dllm_status load_varlen();
    dllm_status load_kv_scatter();
    dllm_status prepare_batch(const dllm__varlen_layout &v);
    dllm_status forward_varlen(const dllm__varlen_layout &v);
    dllm_status self_attention_varlen(size_t layer, const dllm__varlen_layout &v);
    dllm_status self_attention_varlen_kv(size_t layer, const dllm__varlen_layout &v);
    dllm_status upload_kv_layout(const dllm__varlen_layout &v);
    dllm_status bkv_alloc(const std::vector<int> &rows);
    dllm_status llama4_scale_varlen(const dllm__varlen_layout &v);
    dllm_status bd_batch_choose(const std::vector<dllm__bd_seq> &seqs, const dllm__varlen_layout &v, float *logits, dllm__choice *choices);
    // the step (16.4.2)
    dllm__forward_plan plan_step(const dllm__decode &st) const;
    dllm_status run_step(const dllm__decode &st);
    sampler_args sampler_over(const dllm__sampling &s, int n_rows, int pos0, int lrow0, int shift0, int raw_rows) const;
    dllm_status sample_rows(const dllm__decode &st, int batch, int cp0, int raw_rows, int s0, int s1);
    dllm_status launch_sampler(const sampler_args &a, int *x0, double *conf, unsigned char *deferred, const dllm_step_state *state = nullptr);
    dllm_status sample_span(const dllm__sampling &s, const dllm__sampler_span &span, int raw_rows);
    dllm_status choices_to_host(const dllm__dbuf &x0, const dllm__dbuf &conf, const dllm__dbuf &deferred, int n, dllm__choice *out);
    dllm_status capture_step(const dllm__decode &st, bool may_update);
    std::string graph_key(const dllm__decode &st) const;
    dllm_status record_rows(const dllm__decode &st, int batch, int cp0, int raw_rows, int s0, int s1);
    void mark(const char *stage);
    // block diffusion (16.4.3)
    dllm_status bd_logits(const int32_t *ids, int n, int r0, int r1, float *out);
    dllm_status bd_check(const dllm__bd_call &call) const;
    dllm_status bd_attention(size_t layer, const dllm__bd_call &call);
    dllm_status bd_head(const dllm__bd_call &call, float *logits);
    dllm_status bd_prepare(const dllm__bd_call &call, int choose_rows = 0);
    dllm_status bd_layers(const dllm__bd_call &call);
    dllm_status bd_body(const dllm__bd_call &call, const dllm__bd_pick *pick, bool head);
    sampler_args bd_sampler_args(const dllm__bd_call &call, const dllm__bd_pick &pick) const;
    // [bd graphs]
    dllm_status bd_run(const dllm__bd_call &call, const dllm__bd_pick *pick, bool head);
    dllm_status bd_replay(const dllm__bd_call &call, const dllm__bd_pick *pick);
    dllm_status bd_capture(const dllm__bd_call &call, const dllm__bd_pick *pick, dllm__bd_graph &g, dllm__graph_action &action);
    dllm__bd_graph_id bd_graph_id(const dllm__bd_call &call, const dllm__bd_pick *pick) const;
    void bd_graphs_drop();
    void bd_graph_refused(const cudaGraphExecUpdateResultInfo &info);

    const dllm_model &m_;
    int max_tokens_;
    int device_ = 0, n_sms_ = 1;
    dllm__arch arch_ = {};
    cudaStream_t stream_ = nullptr;
    std::shared_ptr<const dllm__gpu_weights> W_;  // [shared weights]
    dllm__dbuf rope_cos_, rope_sin_;               // fp32 [max_tokens][head_dim / 2]

    // kernels and GEMMs
    std::shared_ptr<dllm__module> rowwise_module_, sampler_module_, attn_module_;
    dllm__rowwise_kernels K_;
    dllm__sampler_kernels S_;
    dllm__attn_kernels A_;
    dllm__gemm gemm_;
    dllm__gemm_wg gemm_wg_;                        // dllm's Hopper GEMM, a candidate of gemm_
    dllm_precision precision_ = DLLM_PRECISION_BF16;  // requested
    dllm__fp8_gemm fp8_gemm_ = DLLM__FP8_NONE;     // in effect
    dllm__fp8_mma fp8_mma_;                        // loaded when fp8_gemm_ is DLLM__FP8_MMA
    dllm__soloq_options soloq_;                    // [SoloQ] requested (and in effect: the GPU runs every SoloQ precision)
    std::shared_ptr<dllm__module> soloq_module_;   // loaded when soloq_.enabled
    dllm__soloq_kernels Q_;
    dllm__q4_gemm_kernels q4_gemm_;                // [W4 GEMM] the GEMM of DLLM__W_Q4 weights for few rows
    bool q4_int8_ = true;                          // [INT8 GEMM] gemm_q4 may take its INT8 path (see q4_int8)
    int q4a_forms_ = 0;                            // what the last SoloQ producer wrote: 1 bf16 act_.q4a, 2 int8 act_.q4a8
    long q4_int8_launches_ = 0;                    // GEMMs gemm_q4 ran on the INT8 path (the tests check it runs)

    // activations and the generation's state
    dllm__activations act_;
    bool kv_on_ = false;         // forwards read and write act_.kv (a generation with a K/V cache)
    bool batch_on_ = false;      // a batched forward runs (batch_logits): every GEMM DLLM__ROWS_BATCH
    std::shared_ptr<dllm__module> varlen_module_;  // flash_attn's varlen instantiation, loaded by the first batched forward
    dllm__kernel<void(attn_args)> attn_varlen_;
    dllm__dbuf varlen_offsets_;  // int [sequences + 1]: the batched forward's row offsets (dllm__varlen_layout)
    // [batch] [dual cache] [prefix cache] the batched K/V-cache step: every slot's K|V rows, per layer [bkv_total_ rows]
    // [2 n_kv head_dim] bf16 (slot s at rows [bkv_base_[s], + bkv_rows_[s])); the layout's attention offsets and cache rows
    dllm__dbuf bkv_, varlen_attn_q_, varlen_attn_kv_, varlen_cache_rows_;
    std::vector<int> bkv_base_, bkv_rows_;
    int bkv_total_ = 0;
    // [block diffusion] bd_forward_batch: its slots' states (bkv_'s slots; dllm__bd_slot) and the layout's per-sequence masks
    std::vector<dllm__bd_slot> bdb_slots_;
    dllm__dbuf varlen_attn_masks_;
    std::shared_ptr<dllm__module> kv_scatter_module_;
    dllm__kernel<dllm__sig_kv_scatter_rows> kv_scatter_;
    // [batch] batch_choose: each sequence's step state (its global_step keys the draws), the chosen rows' x0, conf, deferred
    dllm__dbuf bch_state_, bch_x0_, bch_conf_, bch_deferred_;
    int64_t bch_rows_ = 0;  // rows chosen on the device by batch_choose since the context began (tests)
    bool positions_on_ = false;  // [DPad] act_.positions holds the canvas rows' RoPE positions
    void *host_pinned_ = nullptr;  // canvas + committed list + state for the step callback
    size_t host_pinned_bytes_ = 0;

    // [step graphs] the captured step
    cudaGraphExec_t graph_exec_ = nullptr;
    std::string graph_key_, graph_config_, warmed_key_;  // graph_config_: graph_key() of the captured step

    // block diffusion (16.4.3): per layer, the committed rows [0, bd_n_) then the rows a forward attends to beyond them
    // (its fresh K/V or the block cache), bf16 K|V rows [layer][bd_cap_][2 n_kv head_dim]; the block cache likewise
    // [layer][bd_block_rows_][...]
    dllm__dbuf bd_cache_, bd_block_, bd_partial_;
    int bd_n_ = 0, bd_cap_ = 0, bd_block_rows_ = 0;
    // [KV quant] (9c on the device): the committed rows' codes beside bd_cache_, whose bf16 rows the sinks and the
    // forwarded rows keep; 9c's layout per layer (kvq_ holds the settings and the host rotations, its vectors empty)
    dllm__kvq kvq_;
    dllm__kvq_kernels KQ_;
    std::vector<dllm__rotation_dev> kvq_rot_;
    dllm__dbuf kvq_k_codes_, kvq_v_codes_, kvq_k_pairs_, kvq_v_side_;  // v_side: KIVI's pairs or SoloQ's scales, 4 bytes a (row, kv head)
    dllm__kvq_tc_kernels KQT_;  // DLLM_KVQ_TC=1: kvq_flash (loaded by kvq_begin; module null: kvq_attention runs)
    dllm__dbuf kvq_partial_;    // its split states (dllm__kvq_tc_partial_bound)
    bool kvq_tc_on_ = false;    // kvq_flash runs: the switch was on at bd_begin and the head dim is one it takes
    dllm_status kvq_begin(int rows);
    dllm_status kvq_tc_begin();
    kvq_args kvq_layer_args(size_t layer) const;
    dllm_status kvq_commit(size_t layer, int row0, int T);
    dllm_status kvq_attention(size_t layer, const dllm__bd_call &call, int n_keys, int pos0);
    // [FACache] on block diffusion: layer 0's committed states
    // per block offset on the device, the tokens they were computed for on the host (-1: none), valid while bd_n_ is
    // bdfa_n_ (a commit or bd_begin drops them); rows seen and reused under call.lacache since bd_begin (dllm_gen_stats)
    dllm__bdfa_kernels FA_;
    dllm__dbuf bdfa_state_, bdfa_rows_;
    std::vector<int32_t> bdfa_token_;
    std::vector<int> bdfa_list_;
    int bdfa_n_ = -1;
    int64_t bdfa_rows_seen_ = 0, bdfa_rows_reused_ = 0;
    bool bdfa_on(size_t layer) const;
    dllm_status bdfa_prepare(const dllm__bd_call &call);
    dllm_status bdfa_attention(const dllm__bd_call &call, int n_keys, int pos0);
    // [bd graphs] the captured block-diffusion forwards by slot (dllm__bd_graph_keys), and what each forward did
    std::map<std::string, dllm__bd_graph> bd_graphs_;
    int64_t bd_graph_counts_[4] = {};
    int64_t bd_graph_refusals_ = 0;  // updates CUDA refused (bd_graph_refused)

    // [debug hooks]
    dllm__stage_timer *timer_ = nullptr;
    bool bd_host_choice_ = false, bdfa_off_ = false;
    std::map<std::pair<int, int>, std::vector<float>> *debug_rows_ = nullptr;
    int last_layer_rows_ = 0;
};

/* flash_attn_wg's Q, K and V maps (attn_tensor_maps on the device); false where TMA is unavailable. */
struct dllm__attn_tensor_maps {
    CUtensorMap q, k, v;
};
static bool dllm__attn_maps(const attn_args &a, const dllm__arch &arch, int hd, int heads, int batch, dllm__attn_tensor_maps &tm) {
    const int kv_width = heads / a.group * hd;
    return dllm__tensor_map(tm.q, a.q, heads * hd, a.q_rows, batch, (uint64_t)a.q_stride, a.q_bstride, 128) &&
           dllm__tensor_map(tm.k, a.k, kv_width, a.seq, batch, (uint64_t)a.kv_stride, (uint64_t)a.seq * a.kv_stride, arch.fa_wg_bc) &&
           dllm__tensor_map(tm.v, a.v, kv_width, a.seq, batch, (uint64_t)a.kv_stride, (uint64_t)a.seq * a.kv_stride, arch.fa_wg_bc);
}

/* Attention for batch x heads over a.q_rows query rows: flash_attn, then (a.kv_splits > 1) the combine of the per-split
 * states in a.partial. With `wide`, a plain forward (no FACache, no split-KV, no block-causal mask) runs flash_attn_wg where the GPU has it;
 * callers ask for it only where no other path must match flash_attn's bits (layers >= 1: LaCache's exactness rests on
 * layer 0). */
static dllm_status dllm__attn_launch(const dllm__attn_kernels &k, const dllm__arch &arch, int hd, int heads, int batch, const attn_args &a,
                                     cudaStream_t s, bool wide = false) {
    if (wide && k.wide.fn && a.fa_mode == 0 && a.kv_splits == 1 && a.mask_block == 0) {
        dllm__attn_tensor_maps tm;
        if (dllm__attn_maps(a, arch, hd, heads, batch, tm)) {
            dim3 grid((unsigned)((a.q_rows + 127) / 128), (unsigned)heads, (unsigned)batch);
            return k.wide.launch({grid, dim3(384), dllm__attn_wide_smem(hd, arch)}, s, a, tm);
        }
        static std::atomic<bool> warned(false);
        if (!warned.exchange(true))
            dllm__log(DLLM_LOG_WARN, "no TMA tensor map for the wgmma attention (driver without cuTensorMapEncodeTiled, or a layout it "
                                     "refuses): attention runs flash_attn (mma.sync)");
    }
    dim3 grid((unsigned)((a.q_rows + arch.fa_br - 1) / arch.fa_br), (unsigned)heads, (unsigned)(batch * a.kv_splits));
    DLLM__TRY(k.attn.launch({grid, dim3((unsigned)dllm__attn_threads(arch)), dllm__attn_smem(hd, arch)}, s, a));
    if (a.kv_splits == 1) return DLLM_OK;
    return k.combine.launch({dim3((unsigned)a.q_rows, (unsigned)heads, (unsigned)batch), dim3((unsigned)hd)}, s, a);
}

/* The varlen flash_attn over `batch` sequences (a.q_offsets, a.kv_offsets): one CTA row per sequence, the grid fitting
 * the longest (max_q_rows query rows); each sequence computed as its own launch would (varlen_sequence). */
static dllm_status dllm__attn_varlen_launch(const dllm__kernel<void(attn_args)> &k, const dllm__arch &arch, int hd, int heads, int batch, int max_q_rows,
                                            const attn_args &a, cudaStream_t s) {
    if (a.fa_mode || a.kv_splits != 1 || a.key_valid || !a.q_offsets || !a.kv_offsets || batch > 65535)
        return dllm__fail(DLLM_ERR_INTERNAL, "varlen attention: %d sequences, FACache %d, %d KV splits, key mask %s (none, 1, none expected)", batch,
                          a.fa_mode, a.kv_splits, a.key_valid ? "set" : "none");
    if (batch == 0 || max_q_rows == 0) return DLLM_OK;
    dim3 grid((unsigned)((max_q_rows + arch.fa_br - 1) / arch.fa_br), (unsigned)heads, (unsigned)batch);
    return k.launch({grid, dim3((unsigned)dllm__attn_threads(arch)), dllm__attn_smem(hd, arch)}, s, a);
}

dllm_status dllm__gpu_backend::init(int device) {
    const dllm__config &c = m_.cfg;
    if (c.scale_logits) return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend does not implement scale_logits; use the CPU backend");
    if (!dllm__attn_supports(c.head_dim))
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend supports head dimensions that are multiples of 8 from 8 to 256, this model has %d; "
                                                "use the CPU backend", c.head_dim);
    if (c.n_embd % 8 || c.n_ff % 8 || c.n_vocab % 8)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend needs hidden (%d), MLP (%d) and vocabulary (%d) sizes divisible by 8", c.n_embd, c.n_ff, c.n_vocab);
    if (dllm__round_up(c.n_embd, 128) / 8 > 1024 * dllm__norm_slots)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend supports hidden sizes up to %d, this model has %d", 1024 * dllm__norm_slots * 8, c.n_embd);
    device_ = device;
    DLLM__CUDA(cudaSetDevice(device));
    cudaDeviceProp prop;
    DLLM__CUDA(cudaGetDeviceProperties(&prop, device));
    arch_ = dllm__attn_tiles(dllm__arch_for(prop.major * 10 + prop.minor), c.head_dim);
    n_sms_ = prop.multiProcessorCount;
    if (arch_.cc < 80) return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s has compute capability %d.%d; dllm needs 8.0 or newer", prop.name, prop.major, prop.minor);
    DLLM__CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DLLM__TRY(gemm_.init());
    DLLM__TRY(load_kernels());
    bool fp8_ffn = false, fp8_attn = false;
    DLLM__TRY(choose_precision(prop.name, fp8_ffn, fp8_attn));
    std::shared_ptr<dllm__gpu_weights> w;
    DLLM__TRY(dllm__gpu_weights_for(m_, device, fp8_ffn, fp8_attn, soloq_, K_, soloq_.enabled ? &Q_ : nullptr, w));
    W_ = std::move(w);
    std::vector<float> cos_t, sin_t;
    dllm__rope_tables_cfg(c, max_tokens_, cos_t, sin_t);  // the CPU's tables, YaRN included
    DLLM__TRY(dllm__upload_f32(rope_cos_, cos_t, "RoPE tables"));
    DLLM__TRY(dllm__upload_f32(rope_sin_, sin_t, "RoPE tables"));
    dllm__log(DLLM_LOG_INFO, "GPU backend on %s (sm_%d, %d SMs): attention tile %dx%d (wgmma: 128x%d), %s", prop.name, arch_.cc, prop.multiProcessorCount,
              arch_.fa_br, arch_.fa_bc, arch_.fa_wg_bc,
              soloq_.enabled ? dllm__precision_name(precision_)
              : fp8_attn   ? "FP8 FFN and attention projections in layers >= 1"
              : fp8_ffn    ? "FP8 FFN in layers >= 1"
                           : "BF16");
    return DLLM_OK;
}

/* The modules compile in parallel: cold JIT time is the slowest one, not the sum. gemm_wg's (sm_90a) compiles beside
 * them; it is only a candidate of the GEMM autotuner, so where it cannot be set up the GEMMs run on cuBLASLt alone,
 * with a warning. */
dllm_status dllm__gpu_backend::load_kernels() {
    std::shared_ptr<dllm__module> gemm_module;
    std::vector<std::pair<dllm__jit_request, std::shared_ptr<dllm__module> *>> jobs = {
        {dllm__module_rowwise(arch_), &rowwise_module_}, {dllm__module_sampler(arch_), &sampler_module_},
        {dllm__module_attention(arch_, m_.cfg.head_dim), &attn_module_}};
    if (soloq_.enabled) {
        jobs.push_back({dllm__module_soloq(arch_), &soloq_module_});
        jobs.push_back({dllm__module_q4_gemm(arch_), &q4_gemm_.module});
    }
    const size_t required = jobs.size();  // gemm_wg's module is optional
    if (arch_.gemm_wg_stages) jobs.push_back({dllm__module_gemm_wg(arch_), &gemm_module});
    std::vector<dllm_status> st(jobs.size(), DLLM_OK);
    std::vector<std::string> err(jobs.size());
    std::vector<std::thread> workers;
    for (size_t i = 0; i < jobs.size(); i++)
        workers.emplace_back([&, i] {
            cudaSetDevice(device_);
            st[i] = dllm__jit_load(jobs[i].first, *jobs[i].second);
            if (st[i] != DLLM_OK) err[i] = dllm__tls_error;
        });
    for (std::thread &t : workers) t.join();
    for (size_t i = 0; i < required; i++)
        if (st[i] != DLLM_OK) return dllm__fail(st[i], "%s", err[i].c_str());
    dllm__bind(K_, *rowwise_module_);
    dllm__bind(S_, *sampler_module_);
    DLLM__TRY(dllm__attn_kernels_of(*attn_module_, arch_, m_.cfg.head_dim, A_));
    if (dllm__gemm_wg_load(arch_, gemm_wg_) != DLLM_OK) {
        dllm__log(DLLM_LOG_WARN, "dllm's sm_90a GEMM is not available, BF16 GEMMs run on cuBLASLt alone: %s", dllm__tls_error.c_str());
        gemm_wg_ = dllm__gemm_wg();
    }
    if (gemm_wg_.kernel.fn) gemm_.own = &gemm_wg_;
    int smem_optin = 0;  // select_commit keeps 5 bytes per canvas position in shared memory
    DLLM__CUDA(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
    DLLM__CUDA(cudaFuncSetAttribute((const void *)S_.select_commit.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
    if (soloq_.enabled) {
        DLLM__TRY(dllm__bind(Q_, *soloq_module_, smem_optin, arch_.cc));
        DLLM__TRY(dllm__q4_gemm_bind(q4_gemm_));
    }
    return DLLM_OK;
}

/* FP8 runs where the architecture table (or DLLM_FP8_GEMM) has an FP8 GEMM; elsewhere BF16, said once. dllm's own
 * kernel is compiled here, only when it will run. */
dllm_status dllm__gpu_backend::choose_precision(const char *gpu_name, bool &fp8_ffn, bool &fp8_attn) {
    if (precision_ == DLLM_PRECISION_BF16 || soloq_.enabled) return DLLM_OK;
    dllm__fp8_gemm mode;
    DLLM__TRY(dllm__fp8_gemm_for(arch_, mode));
    if (mode == DLLM__FP8_NONE) {
        dllm__log(DLLM_LOG_WARN, "FP8 precision requested, but dllm has no FP8 GEMM for %s (sm_%d; its mma.sync kernel runs on sm_89, cuBLASLt's "
                  "block-scaled FP8 on sm_90, and DLLM_FP8_GEMM=mma forces the kernel on newer GPUs): running BF16", gpu_name, arch_.cc);
        return DLLM_OK;
    }
    if (mode == DLLM__FP8_MMA) DLLM__TRY(dllm__fp8_mma_load(arch_, fp8_mma_));
    dllm__log(DLLM_LOG_INFO, "FP8 GEMMs: %s", mode == DLLM__FP8_MMA ? "dllm's mma.sync E4M3 kernel" : "cuBLASLt block-scaled");
    fp8_gemm_ = mode;
    fp8_ffn = true;
    fp8_attn = precision_ == DLLM_PRECISION_FP8_ALL;
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::fit_buffers(int batch, int seq, int lm_rows, bool lacache, bool kv_cache) {
    const dllm__config &c = m_.cfg;
    const size_t M = (size_t)batch * seq, d = (size_t)c.n_embd, qkv = (size_t)(c.n_head + 2 * c.n_head_kv) * c.head_dim;
    const size_t q = (size_t)c.n_head * c.head_dim, ff = (size_t)c.n_ff, rows = (size_t)batch * lm_rows;
    const size_t slices = ((size_t)c.n_vocab + dllm__vocab_slice - 1) / dllm__vocab_slice;
    const bool fp8 = W_->fp8_ffn || W_->fp8_attn;
    const size_t Mo = fp8 ? (size_t)act8_rows((int)M) : M;  // an FP8 GEMM writes its padding rows too
    dllm__activations &A = act_;
    const std::vector<const void *> before = A.addresses();
    DLLM__TRY(A.h.fit(M * d * 4, "the residual stream"));
    DLLM__TRY(A.a.fit(M * d * 2, "activations"));
    // An FP8 GEMM writes whole 16-row tiles, and in a cut last layer (forward) a batch entry's rows may start at any
    // row: its padding may run 15 rows past the last real row.
    DLLM__TRY(A.delta.fit((fp8 ? Mo + 16 : M) * d * 2, "activations"));
    DLLM__TRY(A.qkv.fit(Mo * qkv * 2, "Q/K/V"));
    DLLM__TRY(A.att.fit(M * q * 2, "attention output"));
    DLLM__TRY(A.gu.fit(Mo * 2 * ff * 2, "MLP activations"));
    DLLM__TRY(A.f.fit(M * ff * 2, "MLP activations"));
    DLLM__TRY(A.y.fit(M * d * 2, "final norm output"));
    DLLM__TRY(A.h_cut.fit(rows * d * 4, "the residual stream"));
    DLLM__TRY(A.logits.fit(rows * c.n_vocab * 4, "logits"));
    DLLM__TRY(A.partials.fit((size_t)lm_rows * slices * sizeof(conf_partial), "sampler partials"));
    DLLM__TRY(A.x0.fit((size_t)seq * 4, "sampler output"));
    DLLM__TRY(A.conf.fit((size_t)seq * 8, "sampler output"));
    DLLM__TRY(A.deferred.fit((size_t)seq, "sampler output"));
    DLLM__TRY(A.cutoff.fit((size_t)seq * 4, "sampler filters"));
    DLLM__TRY(A.canvas.fit(M * 4, "the canvas"));
    DLLM__TRY(A.is_prompt.fit((size_t)seq, "the canvas"));
    DLLM__TRY(A.state.fit(sizeof(dllm_step_state), "the step state"));
    DLLM__TRY(A.committed.fit((size_t)seq * 4, "the step state"));
    DLLM__TRY(A.positions.fit((size_t)seq * 4, "the RoPE positions"));
    if (kv_cache) {
        A.kv.resize(W_->layers.size());
        for (dllm__dbuf &b : A.kv) DLLM__TRY(b.fit(M * qkv * 2, "the K/V cache"));
        DLLM__TRY(A.attn_partial.fit(dllm__attn_partial_bound(arch_, c.head_dim, n_sms_), "split-KV attention states"));
    }
    if (lacache) {
        const int q_tiles = (seq + arch_.fa_br - 1) / arch_.fa_br, fields = arch_.fa_mt * (4 + c.head_dim / 2);
        DLLM__TRY(A.h0.fit(M * d * 4, "the LaCache embeddings"));
        DLLM__TRY(A.qkv0.fit(M * qkv * 2, "the LaCache Q/K/V"));
        DLLM__TRY(A.fa_state.fit((size_t)batch * c.n_head * q_tiles * fields * dllm__attn_threads(arch_) * 4, "the LaCache attention state"));
    }
    if (fp8) {
        const size_t k_pad = (size_t)dllm__round_up(std::max(std::max(c.n_embd, c.n_ff), c.n_head * c.head_dim), 128);
        for (auto buf : {std::make_pair(&A.act8, Mo * k_pad), std::make_pair(&A.act8_scale, Mo * (k_pad / 128) * 4)}) {
            const void *was = buf.first->ptr;
            DLLM__TRY(buf.first->fit(buf.second, "FP8 activations"));
            // the padding rows start as zeros: defined inputs for the GEMM rows nobody reads
            if (buf.first->ptr != was) DLLM__CUDA(cudaMemsetAsync(buf.first->ptr, 0, buf.first->bytes, stream_));
        }
        // gemm_fp8_batch's launches of at most pin_m rows over all M rows (act8 and act8_scale above hold them all)
        DLLM__TRY(A.act8_chunk_scale.fit((size_t)dllm__gemm::pin_m * (k_pad / 128) * 4, "FP8 activations"));
    }
    if (W_->soloq.enabled) {  // the widest input and the largest chunk over the model's linears (gemm_q4)
        const size_t k_max = std::max(std::max(d, ff), q);
        size_t chunk_elems = 0, chunk_rows = 0;
        const std::pair<size_t, size_t> shapes[] = {{qkv, d}, {d, q}, {2 * ff, d}, {d, ff}, {(size_t)c.n_vocab, d}};
        for (const auto &nk : shapes) {
            const size_t rows_at_once = (size_t)dllm__q4_chunk_rows((int)nk.first, (int)nk.second);
            chunk_elems = std::max(chunk_elems, rows_at_once * nk.second), chunk_rows = std::max(chunk_rows, rows_at_once);
        }
        DLLM__TRY(A.q4a.fit(M * k_max * 2, "SoloQ activations"));
        DLLM__TRY(A.q4a_scale.fit(M * 4, "SoloQ activations"));
        DLLM__TRY(A.q4w.fit(chunk_elems * 2, "SoloQ weight rows"));
        if (dllm__q4_int_max(soloq_.acts) && dllm__q4_int_max(soloq_.weights) && soloq_.quantize_acts && M > (size_t)dllm__q4_max_rows)
            DLLM__TRY(A.q4a8.fit(M * k_max, "SoloQ INT8 activations"));
        size_t split_k = 0;  // q4_gemm's split-K partials for its most rows
        for (const auto &nk : shapes) split_k = std::max(split_k, dllm__q4_gemm_workspace_floats(q4_gemm_, dllm__q4_max_rows, (int)nk.first, (int)nk.second));
        DLLM__TRY(A.q4acc.fit(std::max(M * chunk_rows, split_k) * 4, "SoloQ GEMM output"));
    }
    size_t pinned = (size_t)seq * 8 + sizeof(dllm_step_state);
    if (pinned > host_pinned_bytes_) {
        if (host_pinned_) cudaFreeHost(host_pinned_);
        host_pinned_ = nullptr;
        DLLM__CUDA(cudaMallocHost(&host_pinned_, pinned));
        host_pinned_bytes_ = pinned;
    }
    if (A.addresses() != before) A.generation++;
    return DLLM_OK;
}

// ---- 16.4.1 The forward and its stages ------------------------------------------------------------

/* [GEMM entry point] y [M x W.n] = x . W^T in W's format; out is bf16 or (the LM head) fp32. x is the activation W's GEMMs
 * take (dllm__wformats[W.format].act): bf16 rows for BF16 weights; for E4M3 weights act_.act8, filled by the kernel that
 * produced the activation (x null), or bf16 rows [M x W.k] that this call quantises into act_.act8 first. `rows` says
 * whether the algorithm may depend on M (dllm__rows). */
dllm_status dllm__gpu_backend::gemm(const dllm__weight_view &W, const void *x, void *y, int M, dllm__rows rows, cudaDataType_t out) {
    const bool all_independent = dllm__env().gemm_rows_independent;
    switch (W.format) {
        case DLLM__W_BF16: {
            const dllm__gemm_op op{x, W.data, y, M, W.n, W.k, out, nullptr, nullptr};
            if (rows == DLLM__ROWS_BATCH && gemm_.own_fits(op)) return dllm__gemm_wg_run(*gemm_.own, x, W.data, y, M, W.n, W.k, stream_);
            return rows != DLLM__ROWS_TUNED || all_independent ? gemm_.run_pinned(op, stream_) : gemm_.run(op, stream_);
        }
        case DLLM__W_E4M3_BLOCK: {
            if (rows == DLLM__ROWS_BATCH) return gemm_fp8_batch(W, x, y, M);
            if (x) DLLM__TRY(quantize_rows_e4m3(x, M, W.k));
            const int m_pad = act8_rows(M), k_pad = dllm__round_up(W.k, 128);
            const bool pinned = rows != DLLM__ROWS_TUNED;
            if (fp8_gemm_ == DLLM__FP8_MMA)
                return dllm__fp8_mma_run(fp8_mma_, act_.act8.ptr, act_.act8_scale.as<float>(), W.data, W.scale, y, m_pad, W.n, k_pad, stream_, pinned);
            return gemm_.run_fp8(act_.act8.ptr, act_.act8_scale.as<float>(), W.data, W.scale, y, m_pad, W.n, k_pad, stream_, pinned);
        }
        case DLLM__W_Q4: return gemm_q4(W, x, y, M, rows == DLLM__ROWS_BATCH ? DLLM__ROWS_INDEPENDENT : rows, out);
    }
    return dllm__fail(DLLM_ERR_INTERNAL, "weight format %d has no GEMM", (int)W.format);
}

/* [FP8] [batch] gemm() for an E4M3 weight under DLLM__ROWS_BATCH: y [M x W.n] (bf16) = x . W^T for M rows of any count
 * (a batched forward's thousands). The pinned FP8 GEMM takes at most dllm__gemm::pin_m rows a launch (cuBLASLt's
 * algorithm is chosen at that count; fp8_gemm's one-tile launch takes any count), so the rows run in the launches of
 * dllm__fp8_row_chunks over one quantisation of them all (x's rows quantised here, or made by the producer, x null).
 * A launch reads its codes at their offset (rows of k_pad codes), but the scales are laid out [k_pad / 128][M_pad]
 * (their leading dimension the row count), so each launch's columns are first gathered into act_.act8_chunk_scale,
 * laid out for its own row count. A row's bits never depend on its launch or on the batch's row count:
 *   - its codes and scales come from the row-wise quantisers (quantize_rows_e4m3, add_rmsnorm_e4m3, swiglu_e4m3: each
 *     1x128 group's scale from that group's amax alone), copied unchanged;
 *   - every launch runs the pinned algorithm (run_fp8 pinned: one algorithm per (N, K) chosen at pin_m rows; fp8_gemm:
 *     the wide tile whatever the rows), on a 16-row multiple starting on a 16-row boundary (padding as the solo
 *     path's chunks have), and computes each output row from its own row of codes and scales only.
 * The solo paths (TUNED, INDEPENDENT) do not come here. */
dllm_status dllm__gpu_backend::gemm_fp8_batch(const dllm__weight_view &W, const void *x, void *y, int M) {
    if (x) DLLM__TRY(quantize_rows_e4m3(x, M, W.k));
    const int m_pad = act8_rows(M), k_pad = dllm__round_up(W.k, 128), groups = k_pad / 128;
    const bool mma = fp8_gemm_ == DLLM__FP8_MMA;  // fp8_gemm: all rows in one launch
    const unsigned char *codes = act_.act8.as<unsigned char>();
    const float *scales = act_.act8_scale.as<float>();
    for (const dllm__row_chunk &ch : dllm__fp8_row_chunks(M, mma ? std::max(m_pad, 16) : dllm__gemm::pin_m)) {
        const float *s = scales;
        if (ch.rows != m_pad) {  // this launch's scale columns, laid out [groups][ch.rows]
            if (act_.act8_chunk_scale.bytes < (size_t)groups * ch.rows * 4)
                return dllm__fail(DLLM_ERR_INTERNAL, "gemm_fp8_batch: %d rows of %d scale groups do not fit the chunk scales", ch.rows, groups);
            DLLM__CUDA(cudaMemcpy2DAsync(act_.act8_chunk_scale.ptr, (size_t)ch.rows * 4, scales + ch.m0, (size_t)m_pad * 4, (size_t)ch.rows * 4, groups,
                                         cudaMemcpyDeviceToDevice, stream_));
            s = act_.act8_chunk_scale.as<float>();
        }
        const unsigned char *X = codes + (size_t)ch.m0 * k_pad;
        void *Y = (char *)y + (size_t)ch.m0 * W.n * 2;
        if (mma) DLLM__TRY(dllm__fp8_mma_run(fp8_mma_, X, s, W.data, W.scale, Y, ch.rows, W.n, k_pad, stream_, true));
        else DLLM__TRY(gemm_.run_fp8(X, s, W.data, W.scale, Y, ch.rows, W.n, k_pad, stream_, true));
    }
    return DLLM_OK;
}

/* [INT8 GEMM] Whether gemm_q4 runs W's M rows on the INT8 path: integer C values on both sides (SoloQ-I, SoloQ-C,
 * RTN-W4A4; not NVFP4, not unquantised activations), more rows than q4_gemm takes, and, where the rows must stay
 * independent (pinned), only where every path's sums are exact (dllm__q4_int_sum_exact_in_fp32: SoloQ-I and RTN at
 * every LLaDA / Dream width), since then the INT8 path gives q4_gemm's bits. A documented rule, not a timing: at more
 * than 64 rows the INT8 path reads the same 4-bit weights, writes int8 rows where the BF16 path writes bf16 ones (half
 * the bytes) and runs at twice the tensor-core rate (dllm-bench --int8-gemm-only measures both paths). */
bool dllm__gpu_backend::q4_int8(const dllm__weight_view &W, int M, bool pinned) const {
    const dllm__q4_format fa = soloq_.acts, fw = W.q4->format;
    if (!q4_int8_ || !soloq_.quantize_acts || !dllm__q4_int_max(fa) || !dllm__q4_int_max(fw) || M <= dllm__q4_max_rows || W.k % 4 || W.n % 4) return false;
    return !pinned || dllm__q4_int_sum_exact_in_fp32(fa, fw, W.k);
}

/* [SoloQ] y = x W^T for a DLLM__W_Q4 weight: x's rows rotated by the weight's R and quantised per token into act_.q4a
 * (their C values, exact in bf16) or, for the INT8 path, act_.q4a8 (int8), and act_.q4a_scale (x null: a fused producer
 * did); then
 *   - [INT8 GEMM] where q4_int8 says so: per chunk of weight rows their C values unpacked into int8 act_.q4w, cuBLASLt's
 *     INT8 GEMM into int32 act_.q4acc (exact) and the epilogue ((float)acc s_x) s_w into y;
 *   - at most dllm__q4_max_rows rows, or rows that must stay INDEPENDENT (in launches of that many): [W4 GEMM] q4_gemm,
 *     which reads the 4-bit rows and dequantises them in registers (its split-K depends on the shape only);
 *   - more rows: per chunk of weight rows their C values dequantised into act_.q4w, a BF16 GEMM into fp32 act_.q4acc and
 *     the epilogue (acc s_x) s_w into y.
 * Every stage works row by row, so a row's result never depends on the other rows of its launch. */
dllm_status dllm__gpu_backend::gemm_q4(const dllm__weight_view &W, const void *x, void *y, int M, dllm__rows rows, cudaDataType_t out) {
    const dllm__q4_site &q = *W.q4;
    const bool quantize = soloq_.quantize_acts, pinned = rows == DLLM__ROWS_INDEPENDENT || dllm__env().gemm_rows_independent;
    const bool int8 = q4_int8(W, M, pinned);
    if (x) {
        DLLM__TRY(dllm__soloq_quantize_rows(Q_, *q.rot, soloq_.acts, quantize, soloq_.bias_correction, x, (u64)W.k, M, W.k, nullptr, nullptr,
                                            act_.q4a_scale.ptr, int8 ? nullptr : act_.q4a.ptr, stream_, int8 ? act_.q4a8.ptr : nullptr));
    } else if (!(q4a_forms_ & (int8 ? 2 : 1))) {  // a fused producer made the input: in the form this path reads?
        return dllm__fail(DLLM_ERR_INTERNAL, "gemm_q4: the producer of this %d-row input did not write the %s C values", M, int8 ? "int8" : "bf16");
    }
    if (int8) return gemm_q4_int8(W, y, M, out);
    const int scale_bytes = (W.k + 15) / 16;
    const size_t out_bytes = out == CUDA_R_32F ? 4 : 2;
    const float *s_x = quantize ? act_.q4a_scale.as<float>() : nullptr;
    if (M <= dllm__q4_max_rows || pinned) {
        for (int m0 = 0; m0 < M; m0 += dllm__q4_max_rows) {
            const int mc = std::min(dllm__q4_max_rows, M - m0);
            DLLM__TRY(dllm__q4_gemm_run(q4_gemm_, q.format, W.data, q.block_scales.ptr, W.scale, (const bf16_t *)act_.q4a.ptr + (size_t)m0 * W.k, W.k,
                                        s_x ? s_x + m0 : nullptr, (char *)y + (size_t)m0 * W.n * out_bytes, W.n, 0, out, mc, W.n, W.k, act_.q4acc.as<float>(),
                                        act_.q4acc.bytes / 4, stream_));
        }
        return DLLM_OK;
    }
    const int chunk = dllm__q4_chunk_rows(W.n, W.k);
    for (int n0 = 0; n0 < W.n; n0 += chunk) {
        const int nc = std::min(chunk, W.n - n0);
        const unsigned char *codes = (const unsigned char *)W.data + (size_t)n0 * (W.k / 2);
        const unsigned char *bs = q.block_scales.ptr ? (const unsigned char *)q.block_scales.ptr + (size_t)n0 * scale_bytes : nullptr;
        DLLM__TRY(Q_.soloq_dequantize_rows.launch({dim3((unsigned)(W.k / 8 + 127) / 128, (unsigned)nc), dim3(128)}, stream_, codes, bs, (int)q.format, nc,
                                                  W.k, act_.q4w.ptr));
        const dllm__gemm_op op{act_.q4a.ptr, act_.q4w.ptr, act_.q4acc.ptr, M, nc, W.k, CUDA_R_32F, nullptr, nullptr};
        DLLM__TRY(pinned ? gemm_.run_pinned(op, stream_) : gemm_.run(op, stream_));
        DLLM__TRY(Q_.soloq_scale_rows.launch({dim3((unsigned)(nc + 255) / 256, (unsigned)M), dim3(256)}, stream_, act_.q4acc.ptr, M, nc,
                                             s_x, W.scale + n0, (char *)y + (size_t)n0 * out_bytes,
                                             out == CUDA_R_32F ? 1 : 0, (u64)W.n));
    }
    return DLLM_OK;
}

/* [INT8 GEMM] gemm_q4's INT8 path on the int8 input act_.q4a8 (M rows) and its token scales (chunks: dllm__q4_int8_chunk_rows). */
dllm_status dllm__gpu_backend::gemm_q4_int8(const dllm__weight_view &W, void *y, int M, cudaDataType_t out) {
    q4_int8_launches_++;
    return dllm__q4_int8_gemm_run(Q_, gemm_, W.q4->format, W.data, W.scale, act_.q4a8.ptr, act_.q4a_scale.as<float>(), y, W.n, out, M, W.n, W.k,
                                  dllm__q4_int8_chunk_rows(W.n, W.k), act_.q4w.ptr, act_.q4acc.as<int>(), stream_);
}

/* [SoloQ fused producers] The arguments of a producer of M rows for W's GEMM: the C values in the forms gemm_q4 will read
 * (q4_int8 for the launch's rows, which the producer does not know: bf16 unless even pinned rows take the INT8 path,
 * int8 where the INT8 path may run), recorded in q4a_forms_ for gemm_q4 to check. */
soloq_args dllm__gpu_backend::soloq_producer_args(const dllm__weight_view &W, int M) {
    const bool bf16 = !q4_int8(W, M, true), int8 = q4_int8(W, M, false);
    q4a_forms_ = (bf16 ? 1 : 0) | (int8 ? 2 : 0);
    soloq_args a = dllm__soloq_args(*W.q4->rot, soloq_.acts, soloq_.quantize_acts, soloq_.bias_correction, M, W.k, act_.q4a_scale.ptr,
                                    bf16 ? act_.q4a.ptr : nullptr);
    a.values_i8 = int8 ? (signed char *)act_.q4a8.ptr : nullptr;
    return a;
}

/* [SoloQ fused producers] add_rmsnorm of M contiguous rows (h_in (+ delta) -> h_out, normed by w) rotated and quantised
 * for W's GEMM into act_.q4a: one kernel instead of a norm, a quantiser and the bf16 row between them. */
dllm_status dllm__gpu_backend::soloq_add_rmsnorm(const dllm__weight_view &W, const float *h_in, float *h_out, const void *delta, const void *w,
                                                 int M) {
    soloq_args a = soloq_producer_args(W, M);
    a.producer = 1, a.h_in = h_in, a.h_out = h_out, a.delta = (const bf16_t *)delta, a.norm_w = (const float *)w, a.eps = m_.cfg.norm_eps;
    // 1024 threads: residual_rms gives the bits it gives at dllm__norm_threads (the extra threads hold no chunk and add
    // zeros), and the rotation and quantiser that follow have twice the threads
    return dllm__soloq_launch(Q_, a, 1024, stream_);
}

/* [SoloQ fused producers] SwiGLU of M [gate | up] rows rotated and quantised for W's (down) GEMM into act_.q4a. */
dllm_status dllm__gpu_backend::soloq_swiglu(const dllm__weight_view &W, const void *gu, int M) {
    soloq_args a = soloq_producer_args(W, M);
    a.producer = 2, a.x = gu, a.x_stride = (u64)2 * W.k;
    return dllm__soloq_launch(Q_, a, 1024, stream_);
}

/* Attention of q_rows query rows (fused projection rows at q, batch entries q_bstride elements apart) over the seq key
 * rows of keys_qkv; the KV tiles that overlap the current block (read from the device step state) are visited last. */
dllm_status dllm__gpu_backend::attention(int batch, int seq, int q_rows, const void *q, size_t q_bstride, const void *keys_qkv, void *out, int fa_mode,
                                         bool may_split, bool wide) {
    const dllm__config &c = m_.cfg;
    const int hd = c.head_dim, stride = (c.n_head + 2 * c.n_head_kv) * hd;
    attn_args a = {};
    a.q = (const bf16_t *)q;
    a.k = (const bf16_t *)keys_qkv + (size_t)c.n_head * hd;
    a.v = (const bf16_t *)keys_qkv + (size_t)(c.n_head + c.n_head_kv) * hd;
    a.o = (bf16_t *)out;
    a.seq = seq, a.q_rows = q_rows;
    a.q_stride = stride, a.kv_stride = stride, a.o_stride = c.n_head * hd, a.group = c.n_head / c.n_head_kv;
    a.q_bstride = q_bstride, a.o_bstride = (u64)q_rows * c.n_head * hd;
    a.st = act_.state.as<dllm_step_state>();
    a.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    a.fa_mode = fa_mode, a.fa_state = act_.fa_state.as<float>();
    a.kv_splits = may_split ? dllm__attn_kv_splits(arch_, q_rows, seq, c.n_head * batch, n_sms_) : 1;
    a.partial = act_.attn_partial.as<float>();
    return dllm__attn_launch(A_, arch_, hd, c.n_head, batch, a, stream_, wide);
}

/* Self-attention of layer `layer` for the rows held in act_.a (r.rows() per sequence, canvas rows [r.q0, r.q1)): fused
 * QKV GEMM, bias + RoPE, attention into act_.att for the queries of rows [o0, o0 + orows) of those (the last layer may
 * need fewer: forward). Without a K/V cache the rows are the whole canvas; with one their Q/K/V overwrite their slots in
 * the layer's cache and attention reads every cached key. A query row's attention does not depend on which other rows
 * are queried. Layer 0's GEMM is row-independent: LaCache may compute its rows apart. */
dllm_status dllm__gpu_backend::self_attention(size_t layer, int batch, const dllm__seq_rows &r, int o0, int orows) {
    const dllm__config &c = m_.cfg;
    const int d = c.n_embd, qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim, rows = r.rows(), seq = r.seq;
    const dllm__gpu_layer &L = W_->layers[layer];
    const dllm__rows gemm_rows = layer == 0 ? lacache_rows() : DLLM__ROWS_TUNED;
    auto stage = [&](const char *name) {  // layer 0's stages are named apart: the LaCache benchmark compares them
        if (timer_) mark((layer == 0 ? std::string("L0 ") + name : std::string(name)).c_str());
    };
    if (!kv_on_) {
        DLLM__TRY(gemm(L.qkv.view(), produced_attn_input(layer) ? nullptr : act_.a.ptr, act_.qkv.ptr, batch * rows, gemm_rows));
        stage("gemm qkv");
        DLLM__TRY(rope_qkv(act_.qkv.ptr, L.b_qkv.ptr, batch * rows, rows, 0));
        stage("rope");
        DLLM__TRY(attention(batch, rows, orows, (const char *)act_.qkv.ptr + (size_t)o0 * qkv * 2, (size_t)rows * qkv, act_.qkv.ptr, act_.att.ptr, 0, false,
                            layer > 0));
        stage("attention");
        return DLLM_OK;
    }
    char *cache = (char *)act_.kv[layer].ptr, *first = cache + (size_t)r.q0 * qkv * 2;
    if (produced_attn_input(layer)) {  // the input is all batch entries' rows (an FP8 GEMM's whole 16-row tiles): project into
                                       // scratch, then copy the rows in
        DLLM__TRY(gemm(L.qkv.view(), nullptr, act_.qkv.ptr, batch * rows, gemm_rows));
        for (int b = 0; b < batch; b++)
            DLLM__CUDA(cudaMemcpyAsync(first + (size_t)b * seq * qkv * 2, (const char *)act_.qkv.ptr + (size_t)b * rows * qkv * 2, (size_t)rows * qkv * 2,
                                       cudaMemcpyDeviceToDevice, stream_));
    } else {
        for (int b = 0; b < batch; b++)
            DLLM__TRY(gemm(L.qkv.view(), (const char *)act_.a.ptr + (size_t)b * rows * d * 2, first + (size_t)b * seq * qkv * 2, rows, gemm_rows));
    }
    stage("gemm qkv");
    for (int b = 0; b < batch; b++) DLLM__TRY(rope_qkv(first + (size_t)b * seq * qkv * 2, L.b_qkv.ptr, rows, rows, r.q0));
    stage("rope");
    DLLM__TRY(attention(batch, seq, orows, first + (size_t)o0 * qkv * 2, (size_t)seq * qkv, cache, act_.att.ptr, 0, true, layer > 0));
    stage("attention");
    return DLLM_OK;
}

/* [FP8 fused norm+quantise] Residual add + RMSNorm over n_rows rows from row0 of each sequence (h_in -> h_out, see the
 * kernel add_rmsnorm). */
dllm_status dllm__gpu_backend::add_rmsnorm(const float *h_in, float *h_out, const void *delta, const void *w, void *y, int batch, int seq, int row0,
                                        int n_rows) {
    const dllm__config &c = m_.cfg;
    const unsigned threads = dllm__norm_threads(c.n_embd / 8);
    return K_.add_rmsnorm.launch({dim3((unsigned)n_rows, (unsigned)batch), dim3(threads)}, stream_, h_in, h_out, delta, w, c.norm_eps, y, c.n_embd,
                                 n_rows, row0, seq);
}

/* add_rmsnorm over every row (row0 = 0, n_rows = seq), writing E4M3 codes and scales to act_.act8 instead of y. */
dllm_status dllm__gpu_backend::add_rmsnorm_e4m3(const float *h_in, float *h_out, const void *delta, const void *w, int batch, int seq) {
    const dllm__config &c = m_.cfg;
    const unsigned threads = dllm__norm_threads(dllm__round_up(c.n_embd, 128) / 8);
    return K_.add_rmsnorm_e4m3.launch({dim3((unsigned)seq, (unsigned)batch), dim3(threads)}, stream_, h_in, h_out, delta, w, c.norm_eps, act_.act8.ptr,
                                      act_.act8_scale.ptr, act8_rows(batch * seq), c.n_embd, seq, 0, seq);
}

/* act_.act8 = E4M3 of the bf16 rows x [M x K] in 1x128 groups. */
dllm_status dllm__gpu_backend::quantize_rows_e4m3(const void *x, int M, int K) {
    return K_.quantize_rows_e4m3.launch({dllm__e4m3_rows_grid(M, K), dim3(128)}, stream_, x, 0, K, M, act_.act8.ptr, act_.act8_scale.ptr, act8_rows(M), 0.0f);
}

/* [EmbedCache] h[0..n_rows) = embedding rows of ids[0..n_rows), in fp32. */
dllm_status dllm__gpu_backend::embed_gather(const int *ids, int n_rows, float *h) {
    return K_.embed_gather.launch({dim3((unsigned)n_rows), dim3(256)}, stream_, ids, n_rows, W_->embed.ptr, m_.cfg.n_embd, h);
}

/* h rows [0, batch * rows) = embeddings of the canvas rows [q0, q0 + rows) of each batch entry. */
dllm_status dllm__gpu_backend::embed_gather_rows(const int *ids, int batch, int seq, int q0, int rows, float *h) {
    if (rows == seq) return embed_gather(ids, batch * seq, h);
    for (int b = 0; b < batch; b++) DLLM__TRY(embed_gather(ids + (size_t)b * seq + q0, rows, h + (size_t)b * rows * m_.cfg.n_embd));
    return DLLM_OK;
}

/* [RoPECache] Bias + RoPE on rows [0, n_rows) of qkv whose positions are pos0 + (row % seq_len) ([DPad]: positions[...]). */
dllm_status dllm__gpu_backend::rope_qkv(void *qkv, const void *bias, int n_rows, int seq_len, int pos0) {
    const dllm__config &c = m_.cfg;
    const int per_row = (c.n_head + (bias ? 2 : 1) * c.n_head_kv) * (c.head_dim / 8);
    const void *positions = positions_on_ ? act_.positions.ptr : nullptr;
    return K_.rope_qkv.launch({dllm__rows_grid(n_rows, per_row, 256), dim3(256)}, stream_, qkv, n_rows, seq_len, pos0, positions, c.n_head, c.n_head_kv,
                              c.head_dim, bias, rope_cos_.ptr, rope_sin_.ptr);
}

/* Layer 0 up to its attention output (act_.att) with LaCache's [EmbedCache], [RoPECache] and [FACache] (lacache.md 1):
 *   FILL (a block's first step): every row, keeping embeddings (h0), rotated Q/K/V (qkv0) and the attention state of
 *         the query tiles outside the block (fa_state);
 *   REUSE (the block's later steps): embed, norm, project and rotate the block's rows only, and resume the attention of
 *         the outside query tiles from their saved state.
 * The QKV GEMM is row-independent (no K/V cache here), so the rows REUSE computes alone carry the same bits as when the
 * plain path (self_attention) computes them among all rows. */
dllm_status dllm__gpu_backend::layer0_attention(const dllm__forward_plan &plan, const int *ids) {
    const dllm__config &c = m_.cfg;
    const dllm__seq_rows &r = plan.rows();
    const int batch = plan.batch(), seq = r.seq, qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim, d = c.n_embd, M = batch * seq;
    const dllm__gpu_layer &L = W_->layers[0];
    float *h = act_.h0.as<float>();
    if (plan.layer0 == DLLM__L0_FILL) {
        DLLM__TRY(embed_gather(ids, M, h));
        DLLM__TRY(add_rmsnorm(h, nullptr, nullptr, L.attn_norm.ptr, act_.a.ptr, batch, seq, 0, seq));
        mark("L0 embed+norm");
        DLLM__TRY(gemm(L.qkv.view(), act_.a.ptr, act_.qkv0.ptr, M, lacache_rows()));
        mark("L0 gemm qkv");
        DLLM__TRY(rope_qkv(act_.qkv0.ptr, L.b_qkv.ptr, M, seq, 0));
        mark("L0 rope");
    } else {
        const int b0 = r.block0, blk = r.block1 - r.block0;
        for (int b = 0; b < batch; b++) DLLM__TRY(embed_gather(ids + (size_t)b * seq + b0, blk, h + ((size_t)b * seq + b0) * d));
        DLLM__TRY(add_rmsnorm(h, nullptr, nullptr, L.attn_norm.ptr, act_.a.ptr, batch, seq, b0, blk));
        mark("L0 embed+norm");
        for (int b = 0; b < batch; b++) {
            char *out = (char *)act_.qkv0.ptr + ((size_t)b * seq + b0) * qkv * 2;
            DLLM__TRY(gemm(L.qkv.view(), (const char *)act_.a.ptr + (size_t)b * blk * d * 2, out, blk, lacache_rows()));
        }
        mark("L0 gemm qkv");
        for (int b = 0; b < batch; b++) DLLM__TRY(rope_qkv((char *)act_.qkv0.ptr + ((size_t)b * seq + b0) * qkv * 2, L.b_qkv.ptr, blk, blk, b0));
        mark("L0 rope");
    }
    DLLM__TRY(attention(batch, seq, seq, act_.qkv0.ptr, (size_t)seq * qkv, act_.qkv0.ptr, act_.att.ptr, plan.layer0 == DLLM__L0_FILL ? 1 : 2));
    mark("L0 attention");
    return DLLM_OK;
}

/* One forward over the plan's sequences (canvas ids_dev [batch][seq]), up to the final norm of the output rows (act_.y). */
dllm_status dllm__gpu_backend::forward(const dllm__forward_plan &plan, const int *ids_dev) {
    if (!plan.uniform()) return dllm__fail(DLLM_ERR_INTERNAL, "a forward over sequences with different rows (batching is not built yet)");
    const dllm__seq_rows &r = plan.rows();
    const int batch = plan.batch(), rows = r.rows(), out_rows = r.out_rows();
    float *h = act_.h.as<float>();
    mark("start");
    if (plan.layer0 == DLLM__L0_PLAIN) {
        DLLM__TRY(embed_gather_rows(ids_dev, batch, r.seq, r.q0, rows, h));
        DLLM__TRY(add_rmsnorm(h, nullptr, nullptr, W_->layers[0].attn_norm.ptr, act_.a.ptr, batch, rows, 0, rows));
        mark("L0 embed+norm");
    } else {
        DLLM__TRY(layer0_attention(plan, ids_dev));
    }
    const float *h_in = plan.layer0 == DLLM__L0_PLAIN ? h : act_.h0.as<float>();  // layer 0's residual input
    const size_t n_layers = W_->layers.size();
    for (size_t l = 0; l < n_layers; l++) {
        // [truncation] Output truncation reaches into the last layer: after its attention only the output rows
        // [out0, out1) matter, so it computes those alone when they are fewer (queries, O, FFN, final norm), its GEMMs
        // row-independent.
        const bool cut = last_cut(l) && out_rows < rows && (size_t)batch * out_rows * m_.cfg.n_embd * 4 <= act_.h_cut.bytes;
        const int o0 = cut ? r.out0 - r.q0 : 0, orows = cut ? out_rows : rows;
        if (l > 0 || plan.layer0 == DLLM__L0_PLAIN) DLLM__TRY(self_attention(l, batch, r, o0, orows));
        float *h_out = cut ? act_.h_cut.as<float>() : h;  // the cut rows' residual stream goes on in h_cut
        DLLM__TRY(output_and_ffn(l, batch, rows, o0, orows, l == 0 ? h_in : h, h_out));
        const bool last = l + 1 == n_layers;
        if (last) last_layer_rows_ = orows;
        // The last layer's residual is only needed for the output rows (LaCache truncates them).
        if (last) DLLM__TRY(add_rmsnorm(h_out, h_out, act_.delta.ptr, W_->final_norm.ptr, act_.y.ptr, batch, orows, cut ? 0 : r.out0 - r.q0, out_rows));
        else if (fp8_attn(l + 1)) DLLM__TRY(add_rmsnorm_e4m3(h, h, act_.delta.ptr, W_->layers[l + 1].attn_norm.ptr, batch, rows));
        else if (q4(l + 1)) DLLM__TRY(soloq_add_rmsnorm(W_->layers[l + 1].qkv.view(), h, h, act_.delta.ptr, W_->layers[l + 1].attn_norm.ptr, batch * rows));
        else DLLM__TRY(add_rmsnorm(h, h, act_.delta.ptr, W_->layers[l + 1].attn_norm.ptr, act_.a.ptr, batch, rows, 0, rows));
        mark("add+norm");
    }
    return DLLM_OK;
}

/* Layer l from its attention output on (O projection, residual add + RMSNorm, FFN) for the query rows [o0, o0 + orows)
 * of each batch entry's `rows`: residual rows read from h_res (laid out [batch][rows]) and written to h_out
 * ([batch][orows]; in place when all rows are computed), act_.att and act_.delta compact [batch][orows]. Rows LaCache
 * computes apart (the last layer without a K/V cache) take row-independent GEMMs in chunks of at most pin_m rows; the
 * FP8 quantisers must see the same chunks as their GEMMs, so the chunks are cut here. */
dllm_status dllm__gpu_backend::output_and_ffn(size_t l, int batch, int rows, int o0, int orows, const float *h_res, float *h_out) {
    const int d = m_.cfg.n_embd;
    const bool whole = orows == rows;  // then one run over the batch's rows end to end
    const int segments = whole ? 1 : batch, seg_rows = whole ? batch * rows : orows;
    const int chunk = layer_rows(l) == DLLM__ROWS_INDEPENDENT ? dllm__gemm::pin_m : seg_rows;
    for (int b = 0; b < segments; b++)
        for (int c0 = 0; c0 < seg_rows; c0 += chunk) {
            const int m = std::min(chunk, seg_rows - c0), r0 = b * seg_rows + c0;
            DLLM__TRY(project_o(l, m, r0));
            mark("gemm o");
            DLLM__TRY(ffn(l, m, h_res + ((size_t)b * rows + o0 + c0) * d, h_out + (size_t)r0 * d, r0));
        }
    return DLLM_OK;
}

/* The attention output projection of layer l for rows [r0, r0 + M) of act_.att into those of act_.delta (under FP8 the
 * GEMM entry point quantises the attention output first). */
dllm_status dllm__gpu_backend::project_o(size_t l, int M, int r0) {
    const dllm__config &c = m_.cfg;
    const char *x = (const char *)act_.att.ptr + (size_t)r0 * c.n_head * c.head_dim * 2;
    char *y = (char *)act_.delta.ptr + (size_t)r0 * c.n_embd * 2;
    return gemm(W_->layers[l].o.view(), x, y, M, layer_rows(l));
}

/* Layer l's post-attention residual add + RMSNorm and its FFN (gate|up GEMM, SwiGLU, down GEMM into act_.delta) for the
 * rows [r0, r0 + M) of act_.delta (the attention output projection in, the FFN output out). h_in: their M residual rows
 * before the attention output is added; the sum goes to h_out (which may be h_in). Under [FP8] (layers >= 1) the two GEMM
 * inputs are quantised by the kernels that produce them: add+norm+quantise and SwiGLU+quantise. */
dllm_status dllm__gpu_backend::ffn(size_t l, int M, const float *h_in, float *h_out, int r0) {
    const dllm__config &c = m_.cfg;
    const dllm__gpu_layer &L = W_->layers[l];
    const int ff = c.n_ff;
    char *delta = (char *)act_.delta.ptr + (size_t)r0 * c.n_embd * 2;
    const dllm__rows rows = layer_rows(l);
    if (fp8_ffn(l)) {
        DLLM__TRY(add_rmsnorm_e4m3(h_in, h_out, delta, L.ffn_norm.ptr, 1, M));
        mark("add+norm");
        DLLM__TRY(gemm(L.gu.view(), nullptr, act_.gu.ptr, M, rows));
        mark("gemm gate+up");
        DLLM__TRY(K_.swiglu_e4m3.launch({dllm__e4m3_rows_grid(M, ff), dim3(128)}, stream_, act_.gu.ptr, ff, M, act_.act8.ptr, act_.act8_scale.ptr,
                                        act8_rows(M)));
        mark("swiglu");
        DLLM__TRY(gemm(L.down.view(), nullptr, delta, M, rows));
        mark("gemm down");
        return DLLM_OK;
    }
    if (q4(l)) {  // [SoloQ fused producers]: each GEMM input made, rotated and quantised by one kernel
        DLLM__TRY(soloq_add_rmsnorm(L.gu.view(), h_in, h_out, delta, L.ffn_norm.ptr, M));
        mark("add+norm");
        DLLM__TRY(gemm(L.gu.view(), nullptr, act_.gu.ptr, M, rows));
        mark("gemm gate+up");
        DLLM__TRY(soloq_swiglu(L.down.view(), act_.gu.ptr, M));
        mark("swiglu");
        DLLM__TRY(gemm(L.down.view(), nullptr, delta, M, rows));
        mark("gemm down");
        return DLLM_OK;
    }
    DLLM__TRY(add_rmsnorm(h_in, h_out, delta, L.ffn_norm.ptr, act_.a.ptr, 1, M, 0, M));
    mark("add+norm");
    DLLM__TRY(gemm(L.gu.view(), act_.a.ptr, act_.gu.ptr, M, rows));
    mark("gemm gate+up");
    DLLM__TRY(K_.swiglu.launch({dllm__rows_grid(M, ff / 8, 256), dim3(256)}, stream_, act_.gu.ptr, act_.f.ptr, M, ff));
    mark("swiglu");
    DLLM__TRY(gemm(L.down.view(), act_.f.ptr, delta, M, rows));
    mark("gemm down");
    return DLLM_OK;
}

/* LM head for output rows [c0, c0 + rows) of the raw_rows of each batch entry into act_.logits [batch][rows][V]. */
dllm_status dllm__gpu_backend::lm_head(int batch, int raw_rows, int c0, int rows) {
    const dllm__config &c = m_.cfg;
    for (int b = 0; b < batch; b++) {
        const char *y = (const char *)act_.y.ptr + ((size_t)b * raw_rows + c0) * c.n_embd * 2;
        char *out = (char *)act_.logits.ptr + (size_t)b * rows * c.n_vocab * 4;
        DLLM__TRY(gemm(W_->lm_head(c), y, out, rows, lacache_rows(), CUDA_R_32F));
    }
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::prepare_forward(const int32_t *ids, int n, int raw_rows) {
    kv_on_ = positions_on_ = false;
    DLLM__TRY(fit_buffers(1, n, std::min(raw_rows, dllm__lm_chunk_rows)));
    DLLM__CUDA(cudaMemcpyAsync(act_.canvas.ptr, ids, (size_t)n * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemsetAsync(act_.state.ptr, 0, sizeof(dllm_step_state), stream_));  // no block: attention visits tiles in plain order
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::logits(const int32_t *ids, int n, int r0, int r1, float *out) {
    const dllm__config &c = m_.cfg;
    if (dllm__is_block_diffusion(c)) return bd_logits(ids, n, r0, r1, out);
    const int raw0 = dllm__logit_row(c, r0), raw1 = dllm__logit_row(c, r1 - 1) + 1;
    DLLM__TRY(prepare_forward(ids, n, raw1 - raw0));
    std::vector<float> raw((size_t)(raw1 - raw0) * c.n_vocab);
    DLLM__TRY(forward_logits(n, raw0, raw1, [&](int c0, int rows) -> dllm_status {
        DLLM__CUDA(cudaMemcpyAsync(raw.data() + (size_t)c0 * c.n_vocab, act_.logits.ptr, (size_t)rows * c.n_vocab * 4, cudaMemcpyDeviceToHost, stream_));
        return DLLM_OK;
    }));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    for (int p = r0; p < r1; p++)
        memcpy(out + (size_t)(p - r0) * c.n_vocab, raw.data() + (size_t)(dllm__logit_row(c, p) - raw0) * c.n_vocab, sizeof(float) * c.n_vocab);
    return DLLM_OK;
}

// ---- [batch] The batched forward: every canvas's rows in one forward (dllm_generate_batch) ----------------------
// Each GEMM runs once over all sequences' rows (DLLM__ROWS_BATCH: the bits of a row never depend on the row count);
// embedding, norms, RoPE (at each row's own position) and SwiGLU work row by row; attention is varlen, every sequence's
// queries over its own keys only. So a sequence's logits are bit-identical whatever the batch's other sequences, their
// lengths and their order, a batch of one included. Not the solo step's bits: that one tunes its GEMMs per row count and
// runs LaCache, the wgmma attention and the current block's tile order. Under FP8 (DLLM_BATCH_FP8=1: unverified on a
// device) an E4M3 GEMM runs its rows in row-independent launches instead (gemm_fp8_batch), with the same guarantee.

const char *dllm__gpu_backend::batch_unsupported() const {
    if (dllm__is_block_diffusion(m_.cfg)) return "for block diffusion";
    if ((W_->fp8_ffn || W_->fp8_attn) && !dllm__env().batch_fp8) return "under FP8 (unverified on a device: DLLM_BATCH_FP8=1 turns it on)";
    return nullptr;
}

dllm_status dllm__gpu_backend::forward_batch(const std::vector<dllm__batch_seq> &plan, float *out) {
    if (const char *why = batch_unsupported()) return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched forward %s", why);
    if (plan.empty()) return DLLM_OK;
    const dllm__config &c = m_.cfg;
    dllm__varlen_layout v;
    DLLM__TRY(dllm__varlen_layout_of(c, plan, max_tokens_, v));
    return batch_logits_to_host(plan, v, out);
}

/* batch_logits with every chunk copied to the host, then each sequence's rows [r0, r1) unshifted into out, one sequence
 * after another (forward_batch's and forward_batch_kv's contract). */
dllm_status dllm__gpu_backend::batch_logits_to_host(const std::vector<dllm__batch_seq> &plan, const dllm__varlen_layout &v, float *out) {
    const dllm__config &c = m_.cfg;
    std::vector<float> raw((size_t)v.out_rows * c.n_vocab);
    DLLM__TRY(batch_logits(v, [&](int c0, int rows) -> dllm_status {
        DLLM__CUDA(cudaMemcpyAsync(raw.data() + (size_t)c0 * c.n_vocab, act_.logits.ptr, (size_t)rows * c.n_vocab * 4, cudaMemcpyDeviceToHost, stream_));
        return DLLM_OK;
    }));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < plan.size(); i++) {
        dllm__unshift_rows(c, raw.data() + (size_t)v.out0[i] * c.n_vocab, v.raw0[i], plan[i].r0, plan[i].r1, out);
        out += (size_t)(plan[i].r1 - plan[i].r0) * c.n_vocab;
    }
    return DLLM_OK;
}

/* flash_attn's varlen instantiation, compiled (or read from the JIT caches) once. */
dllm_status dllm__gpu_backend::load_varlen() {
    if (attn_varlen_.fn) return DLLM_OK;
    const int hd = m_.cfg.head_dim;
    DLLM__TRY(dllm__jit_load(dllm__module_attention_varlen(arch_, hd), varlen_module_));
    cudaKernel_t fn = varlen_module_->kernels.at(dllm__attn_varlen_name(hd, arch_));
    DLLM__CUDA(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dllm__attn_smem(hd, arch_)));
    attn_varlen_.fn = fn, attn_varlen_.name = "flash_attn (varlen)";
    return DLLM_OK;
}

/* The buffers for the layout's rows, and its canvas rows, positions and offsets on the device. */
dllm_status dllm__gpu_backend::prepare_batch(const dllm__varlen_layout &v) {
    DLLM__TRY(load_varlen());
    DLLM__TRY(fit_buffers(1, v.rows, std::max(1, std::min(v.out_rows, dllm__lm_chunk_rows))));
    DLLM__TRY(varlen_offsets_.fit(v.offsets.size() * 4, "the batch's row offsets"));
    positions_on_ = true;  // rope_qkv reads act_.positions[row]
    DLLM__CUDA(cudaMemcpyAsync(act_.canvas.ptr, v.ids.data(), (size_t)v.rows * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(act_.positions.ptr, v.positions.data(), (size_t)v.rows * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(varlen_offsets_.ptr, v.offsets.data(), v.offsets.size() * 4, cudaMemcpyHostToDevice, stream_));
    if (v.cached()) DLLM__TRY(upload_kv_layout(v));
    DLLM__CUDA(cudaStreamSynchronize(stream_));  // the host arrays may go out of scope
    return DLLM_OK;
}

/* The forward of the layout's rows up to the final norm of each sequence's logit rows, gathered into act_.y. The plain
 * forward's stages with batch 1 over all rows (output_and_ffn, the norms, [SoloQ]'s fused producers); attention varlen.
 * No [truncation]: the last layer computes every row, as it would for any other batch. */
dllm_status dllm__gpu_backend::forward_varlen(const dllm__varlen_layout &v) {
    const int T = v.rows, d = m_.cfg.n_embd;
    float *h = act_.h.as<float>();
    DLLM__TRY(embed_gather(act_.canvas.as<int>(), T, h));
    DLLM__TRY(add_rmsnorm(h, nullptr, nullptr, W_->layers[0].attn_norm.ptr, act_.a.ptr, 1, T, 0, T));
    const size_t n_layers = W_->layers.size();
    for (size_t l = 0; l < n_layers; l++) {
        DLLM__TRY(self_attention_varlen(l, v));
        DLLM__TRY(output_and_ffn(l, 1, T, 0, T, h, h));
        if (l + 1 == n_layers) break;
        if (q4(l + 1)) DLLM__TRY(soloq_add_rmsnorm(W_->layers[l + 1].qkv.view(), h, h, act_.delta.ptr, W_->layers[l + 1].attn_norm.ptr, T));
        else if (fp8_attn(l + 1)) DLLM__TRY(add_rmsnorm_e4m3(h, h, act_.delta.ptr, W_->layers[l + 1].attn_norm.ptr, 1, T));
        else DLLM__TRY(add_rmsnorm(h, h, act_.delta.ptr, W_->layers[l + 1].attn_norm.ptr, act_.a.ptr, 1, T, 0, T));
    }
    for (size_t i = 0; i < v.out0.size(); i++)  // the last residual add and the final norm, the wanted rows only
        DLLM__TRY(add_rmsnorm(h, nullptr, act_.delta.ptr, W_->final_norm.ptr, (char *)act_.y.ptr + (size_t)v.out0[i] * d * 2, 1, T,
                              v.offsets[i] + v.raw0[i] - v.q0[i], v.raw1[i] - v.raw0[i]));
    return DLLM_OK;
}

/* Self-attention of one layer over the layout's rows (held in act_.a, or under [SoloQ] from layer 1 on made in act_.q4a
 * by the fused producer): the fused QKV GEMM, bias + RoPE at each row's position, varlen attention into act_.att. */
dllm_status dllm__gpu_backend::self_attention_varlen(size_t layer, const dllm__varlen_layout &v) {
    if (v.cached()) return self_attention_varlen_kv(layer, v);
    const dllm__config &c = m_.cfg;
    const int hd = c.head_dim, stride = (c.n_head + 2 * c.n_head_kv) * hd, T = v.rows;
    const dllm__gpu_layer &L = W_->layers[layer];
    DLLM__TRY(gemm(L.qkv.view(), produced_attn_input(layer) ? nullptr : act_.a.ptr, act_.qkv.ptr, T, DLLM__ROWS_BATCH));
    DLLM__TRY(rope_qkv(act_.qkv.ptr, L.b_qkv.ptr, T, T, 0));
    attn_args a = {};
    a.q = act_.qkv.as<bf16_t>();
    a.k = a.q + (size_t)c.n_head * hd;
    a.v = a.q + (size_t)(c.n_head + c.n_head_kv) * hd;
    a.o = act_.att.as<bf16_t>();
    a.seq = a.q_rows = v.max_rows;  // each CTA reads its sequence's own (varlen_sequence)
    a.q_stride = stride, a.kv_stride = stride, a.o_stride = c.n_head * hd, a.group = c.n_head / c.n_head_kv;
    a.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    a.kv_splits = 1;
    a.q_offsets = a.kv_offsets = varlen_offsets_.as<int>();
    return dllm__attn_varlen_launch(attn_varlen_, arch_, hd, c.n_head, (int)v.out0.size(), v.max_rows, a, stream_);
}

// ---- [batch] [dual cache] [prefix cache] The batched K/V-cache step ------------------------------------------------
// Fast-dLLM's caches for many sequences in one forward: each sequence has its own slot of cached K|V rows (for every
// layer), sized once per batch by its canvas (batch_kv_reserve). A block's first step forwards every row of the canvas
// and fills the slot; its later steps forward the block (dual) or the block and the rows after it (prefix) and write
// their fresh K|V over their slot rows. All sequences' forwarded rows, at any block and of any step kind, go through the
// batched forward (forward_varlen: every GEMM once over all rows, DLLM__ROWS_BATCH); each sequence's queries attend to
// its own slot only, through the varlen flash_attn (no split-KV, one tile shape whatever the batch). So a sequence's
// logits are bit-identical whatever else is in the batch, a batch of one included. A sequence that finishes is simply
// no longer in the plan.

const char *dllm__gpu_backend::batch_kv_unsupported() const { return batch_unsupported(); }

dllm_status dllm__gpu_backend::batch_kv_reserve(const std::vector<int> &rows) {
    bkv_base_.clear(), bkv_rows_.clear(), bkv_total_ = 0;
    bdb_slots_.clear();  // the slots are no longer bd_forward_batch's
    if (rows.empty()) {
        bkv_.release();
        return DLLM_OK;
    }
    if (const char *why = batch_kv_unsupported()) return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched K/V-cache step %s", why);
    for (int n : rows)
        if (n < 1 || n > max_tokens_) return dllm__fail(DLLM_ERR_INTERNAL, "a K/V cache slot of %d rows (1 to %d expected)", n, max_tokens_);
    return bkv_alloc(rows);
}

/* The slots of rows[s] rows each (bkv_, bkv_base_, bkv_rows_), the previous ones released; kv_scatter_rows loaded. */
dllm_status dllm__gpu_backend::bkv_alloc(const std::vector<int> &rows) {
    const dllm__config &c = m_.cfg;
    bkv_base_.clear(), bkv_rows_.clear(), bkv_total_ = 0;
    int64_t total = 0;
    for (int n : rows) total += n;
    if (total > INT32_MAX) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "the batch's K/V caches hold more than 2^31 rows; make the batch smaller");
    const size_t width = (size_t)2 * c.n_head_kv * c.head_dim;
    bkv_.release();  // the previous batch's, before the new ones are allocated
    DLLM__TRY(bkv_.fit((size_t)c.n_layer * (size_t)total * width * 2, "the batch's K/V caches (make the batch or its canvases smaller)"));
    for (int n : rows) bkv_base_.push_back(bkv_total_), bkv_rows_.push_back(n), bkv_total_ += n;
    return load_kv_scatter();
}

/* kv_scatter_rows's module, compiled (or read from the JIT caches) once. */
dllm_status dllm__gpu_backend::load_kv_scatter() {
    if (kv_scatter_.fn) return DLLM_OK;
    DLLM__TRY(dllm__jit_load(dllm__module_kv_scatter(arch_), kv_scatter_module_));
    kv_scatter_.fn = kv_scatter_module_->kernels.at("kv_scatter_rows"), kv_scatter_.name = "kv_scatter_rows";
    return DLLM_OK;
}

/* forward_batch's with the layout of the reserved slots. The empty plan asks whether the step exists here. */
dllm_status dllm__gpu_backend::forward_batch_kv(const std::vector<dllm__batch_seq> &plan, float *out) {
    if (const char *why = batch_kv_unsupported()) return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched K/V-cache step %s", why);
    if (plan.empty()) return DLLM_OK;
    if (!bkv_.ptr) return dllm__fail(DLLM_ERR_INTERNAL, "a batched K/V-cache step before batch_kv_reserve");
    dllm__varlen_layout v;
    DLLM__TRY(kv_layout(plan, v));
    return batch_logits_to_host(plan, v, out);
}

/* The attention's offsets and the rows' cache rows on the device (prepare_batch, before its synchronisation). */
dllm_status dllm__gpu_backend::upload_kv_layout(const dllm__varlen_layout &v) {
    DLLM__TRY(varlen_attn_q_.fit(v.attn_q_offsets.size() * 4, "the batch's attention offsets"));
    DLLM__TRY(varlen_attn_kv_.fit(v.attn_kv_offsets.size() * 4, "the batch's attention offsets"));
    DLLM__TRY(varlen_cache_rows_.fit(v.cache_rows.size() * 4, "the batch's cache rows"));
    DLLM__CUDA(cudaMemcpyAsync(varlen_attn_q_.ptr, v.attn_q_offsets.data(), v.attn_q_offsets.size() * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(varlen_attn_kv_.ptr, v.attn_kv_offsets.data(), v.attn_kv_offsets.size() * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(varlen_cache_rows_.ptr, v.cache_rows.data(), v.cache_rows.size() * 4, cudaMemcpyHostToDevice, stream_));
    if (v.attn_masks.empty()) return DLLM_OK;
    DLLM__TRY(varlen_attn_masks_.fit(v.attn_masks.size() * 4, "the batch's attention masks"));
    DLLM__CUDA(cudaMemcpyAsync(varlen_attn_masks_.ptr, v.attn_masks.data(), v.attn_masks.size() * 4, cudaMemcpyHostToDevice, stream_));
    return DLLM_OK;
}

/* self_attention_varlen under a K/V cache: the fused QKV GEMM over the forwarded rows, bias + RoPE at their positions,
 * their K|V columns into their slot rows of this layer's cache (kv_scatter_rows), then the varlen attention with each
 * sequence's queries (the forwarded rows' Q columns) over its slot's n rows. */
dllm_status dllm__gpu_backend::self_attention_varlen_kv(size_t layer, const dllm__varlen_layout &v) {
    const dllm__config &c = m_.cfg;
    const int hd = c.head_dim, stride = (c.n_head + 2 * c.n_head_kv) * hd, width = 2 * c.n_head_kv * hd, T = v.rows;
    const dllm__gpu_layer &L = W_->layers[layer];
    if (v.attn_q_offsets.size() != v.attn_kv_offsets.size() || v.cache_rows.size() != (size_t)T || !bkv_.ptr)
        return dllm__fail(DLLM_ERR_INTERNAL, "batched K/V-cache step: a layout of %d rows with %zu cache rows, caches %s", T, v.cache_rows.size(),
                          bkv_.ptr ? "reserved" : "not reserved");
    DLLM__TRY(gemm(L.qkv.view(), produced_attn_input(layer) ? nullptr : act_.a.ptr, act_.qkv.ptr, T, DLLM__ROWS_BATCH));
    DLLM__TRY(rope_qkv(act_.qkv.ptr, L.b_qkv.ptr, T, T, 0));
    if (c.llama4_beta != 0) DLLM__TRY(llama4_scale_varlen(v));
    bf16_t *cache = bkv_.as<bf16_t>() + layer * (size_t)bkv_total_ * width;
    DLLM__TRY(kv_scatter_.launch({dim3((unsigned)T), dim3(128)}, stream_, act_.qkv.as<bf16_t>() + (size_t)c.n_head * hd, (u64)stride, cache, (u64)width,
                                 varlen_cache_rows_.as<int>(), width, T));
    attn_args a = {};
    a.q = act_.qkv.as<bf16_t>();
    a.k = cache;
    a.v = cache + (size_t)c.n_head_kv * hd;
    a.o = act_.att.as<bf16_t>();
    a.seq = max_tokens_, a.q_rows = v.max_rows;  // each CTA reads its sequence's own (varlen_sequence)
    a.q_stride = stride, a.kv_stride = width, a.o_stride = c.n_head * hd, a.group = c.n_head / c.n_head_kv;
    a.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    a.kv_splits = 1;
    a.q_offsets = varlen_attn_q_.as<int>(), a.kv_offsets = varlen_attn_kv_.as<int>();
    a.varlen_masks = v.attn_masks.empty() ? nullptr : varlen_attn_masks_.as<int>();
    return dllm__attn_varlen_launch(attn_varlen_, arch_, hd, c.n_head, (int)v.attn_q_offsets.size() - 1, v.max_rows, a, stream_);
}

/* [Llama-4 query scaling] of the layout's rows (act_.qkv, after RoPE) at their own positions (v.positions): one launch
 * per run of consecutive positions (a block-diffusion sequence's rows are one run). Row-wise, so a row's bits never
 * depend on the others. Twin: dllm__cpu_llama4_scale. */
dllm_status dllm__gpu_backend::llama4_scale_varlen(const dllm__varlen_layout &v) {
    const dllm__config &c = m_.cfg;
    const int qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim, width = c.n_head * c.head_dim;
    for (int r0 = 0, r1 = 0; r0 < v.rows; r0 = r1) {
        for (r1 = r0 + 1; r1 < v.rows && v.positions[(size_t)r1] == v.positions[(size_t)r1 - 1] + 1; r1++) {}
        DLLM__TRY(K_.llama4_scale_q.launch({dllm__rows_grid(r1 - r0, width / 8, 256), dim3(256)}, stream_, act_.qkv.as<bf16_t>() + (size_t)r0 * qkv,
                                           r1 - r0, qkv, width, v.positions[(size_t)r0], c.llama4_beta, c.llama4_orig_max));
    }
    return DLLM_OK;
}

// ---- [batch] [block diffusion] The batched block-diffusion forward (bd_forward_batch; DLLM_BD_BATCH=1) --------------
// Many block-diffusion generations in one forward (dllm_generate_batch): each has a slot of K|V rows for every layer
// (bd_batch_reserve, the batched K/V-cache step's bkv_), held by sequence position: its committed rows [0, n), then the
// block being decoded at [n, n + B). Every sequence's forwarded rows, of any kind (dllm__bd_kind), go through the
// batched forward (forward_varlen: every GEMM once over all rows, DLLM__ROWS_BATCH; embedding, norms, RoPE at each row's
// position, the Llama-4 query scaling and [SoloQ]'s producers row by row), their K|V into their slot rows
// (kv_scatter_rows), each sequence's queries over its own slot rows under its own block-causal mask (the varlen
// flash_attn with attn_args' varlen_masks: no split-KV, one tile shape whatever the batch). So a sequence's logits and
// choices are bit-identical whatever else is in the batch, a batch of one included (not the solo bd_forward's bits: that
// one tunes its GEMMs per row count, splits the keys and runs [FACache]'s split attention on layer 0; under call.lacache
// this path reuses nothing and counts no row in bd_facache_rows). Unverified on a device: off unless DLLM_BD_BATCH=1.

/* The layout of a batched block-diffusion forward over the slots (slot s: rows [slot_base[s], + slot_rows[s]) of each
 * layer's K|V rows, its state slots[s]): sequence i's call.T rows concatenated, at RoPE positions n + offset + j (n:
 * its slot's committed rows), their K|V bound for slot row n + j (SUB_BLOCK: n + offset + j, the overwrite persists),
 * its queries over slot rows [0, n + T) (SUB_BLOCK: [0, n + block)) under its block-causal mask (call.mask_block, query
 * j at sequence index n + offset + j, key k at k); its raw logit rows [r0, r1) of the forward. Twin:
 * dllm__cpu_bd_attention's positions, key rows and q_index0, except that the CPU keeps the block cache apart while here
 * it is the slot's rows after the committed ones. Checked as bd_check checks a forward, plus each slot once, a pick's
 * rows among the logit rows and a sub-block only over a block cache. Entry 2i of the attention is sequence i, entry
 * 2i + 1 the bridge to the next slot (no query row, no mask). */
static dllm_status dllm__bd_batch_layout_of(const std::vector<dllm__bd_seq> &seqs, const std::vector<int> &slot_base, const std::vector<int> &slot_rows,
                                            const std::vector<dllm__bd_slot> &slots, int max_tokens, dllm__varlen_layout &v) {
    v = dllm__varlen_layout();
    v.offsets.push_back(0);
    std::vector<bool> used(slot_base.size(), false);
    for (size_t i = 0; i < seqs.size(); i++) {
        const dllm__bd_seq &q = seqs[i];
        const dllm__bd_call &call = q.call;
        if (q.slot < 0 || (size_t)q.slot >= slot_base.size() || used[(size_t)q.slot])
            return dllm__fail(DLLM_ERR_INTERNAL, "batched block diffusion: sequence %zu names slot %d (%zu reserved, each at most once a forward)", i,
                              q.slot, slot_base.size());
        used[(size_t)q.slot] = true;
        const dllm__bd_slot &s = slots[(size_t)q.slot];
        const bool sub = call.kind == DLLM__BD_SUB_BLOCK;
        if (!call.ids || call.T <= 0 || call.offset < 0 || call.r0 < 0 || call.r1 <= call.r0 || call.r1 > call.T)
            return dllm__fail(DLLM_ERR_INTERNAL, "batched block diffusion: sequence %zu forwards %d rows at offset %d and asks for output rows [%d, %d)", i,
                              call.T, call.offset, call.r0, call.r1);
        if (sub && call.offset + call.T > s.block)
            return dllm__fail(DLLM_ERR_INTERNAL, "batched block diffusion: sequence %zu's sub-block of %d rows at %d lies outside its block cache (%d rows)", i,
                              call.T, call.offset, s.block);
        const int n_keys = s.n + (sub ? s.block : call.T);
        if (n_keys > slot_rows[(size_t)q.slot])
            return dllm__fail(DLLM_ERR_INTERNAL, "batched block diffusion: sequence %zu's %d rows past %d committed ones overflow slot %d (%d rows, sized by "
                              "bd_batch_reserve)", i, call.T, s.n, q.slot, slot_rows[(size_t)q.slot]);
        if ((int64_t)s.n + call.offset + call.T > max_tokens)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "batched block diffusion: sequence %zu's positions up to %lld exceed the context's limit of %d tokens "
                              "(max_tokens)", i, (long long)s.n + call.offset + call.T, max_tokens);
        const dllm__bd_pick *p = q.pick;
        if (p && (p->n <= 0 || p->logits_row(0) < 0 || p->logits_row(p->n - 1) >= call.r1 - call.r0))
            return dllm__fail(DLLM_ERR_INTERNAL, "batched block diffusion: sequence %zu chooses %d rows from logits rows %d.. of its %d", i, p->n,
                              p->n > 0 ? p->logits_row(0) : 0, call.r1 - call.r0);
        if (v.rows > INT32_MAX - call.T) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "batched forward: more than 2^31 rows");
        const int base = slot_base[(size_t)q.slot], row0 = s.n + (sub ? call.offset : 0);
        for (int j = 0; j < call.T; j++) v.positions.push_back(s.n + call.offset + j), v.cache_rows.push_back(base + row0 + j);
        v.ids.insert(v.ids.end(), call.ids, call.ids + call.T);
        if (i > 0) v.attn_masks.push_back(0), v.attn_masks.push_back(0);  // the bridge from the previous sequence
        v.attn_q_offsets.push_back(v.rows), v.attn_kv_offsets.push_back(base);
        v.attn_masks.push_back(call.mask_block), v.attn_masks.push_back(s.n + call.offset);
        v.rows += call.T;
        v.attn_q_offsets.push_back(v.rows), v.attn_kv_offsets.push_back(base + n_keys);
        v.offsets.push_back(v.rows);
        v.raw0.push_back(call.r0), v.raw1.push_back(call.r1), v.q0.push_back(0);
        v.out0.push_back(v.out_rows);
        v.out_rows += call.r1 - call.r0;
        v.max_rows = std::max(v.max_rows, call.T);
    }
    return DLLM_OK;
}

/* A slot's state after its forward ran: a COMMIT's rows join the committed ones; a BLOCK_FULL's rows are the block
 * cache; a STEP or a COMMIT wrote over the rows the block cache was in (the schedule follows neither by a sub-block). */
static void dllm__bd_slot_advance(const dllm__bd_call &call, dllm__bd_slot &s) {
    if (call.kind == DLLM__BD_COMMIT) s.n += call.T, s.block = 0;
    else if (call.kind == DLLM__BD_BLOCK_FULL) s.block = call.T;
    else if (call.kind == DLLM__BD_STEP) s.block = 0;
}

/* The sampler launches of the LM-head chunk of gathered logit rows [c0, c0 + rows) of layout v: for each sequence i with
 * a pick (its choices start at choice0[i]), the pick rows j whose logits row (gathered: v.out0[i] +
 * pick->logits_row(j)) is in the chunk, one range since that row never falls as j rises; a range from a shifted pick's
 * row 0 keeps the shift (rows 0 and 1 read the same logits row), any other reads consecutive rows. */
static std::vector<dllm__sampler_span> dllm__bd_sampler_spans(const std::vector<dllm__bd_seq> &seqs, const dllm__varlen_layout &v,
                                                              const std::vector<int> &choice0, int c0, int rows) {
    std::vector<dllm__sampler_span> spans;
    for (size_t i = 0; i < seqs.size(); i++) {
        const dllm__bd_pick *p = seqs[i].pick;
        if (!p) continue;
        auto gathered = [&](int j) { return v.out0[i] + p->logits_row(j); };
        int j0 = 0, j1 = p->n;
        while (j0 < j1 && gathered(j0) < c0) j0++;
        while (j1 > j0 && gathered(j1 - 1) >= c0 + rows) j1--;
        if (j0 == j1) continue;
        dllm__sampler_span s;
        s.seq = (int)i, s.pos0 = p->pos0 + j0, s.n = j1 - j0, s.lrow0 = gathered(j0) - c0;
        s.shift0 = p->shift0 && j0 == 0, s.out = choice0[i] + j0;
        spans.push_back(s);
    }
    return spans;
}

const char *dllm__gpu_backend::bd_batch_unsupported() const {
    if (!dllm__env().bd_batch) return "(unverified on a device: DLLM_BD_BATCH=1 turns it on)";
    if (!dllm__is_block_diffusion(m_.cfg)) return "for a model that is not block diffusion";
    if ((W_->fp8_ffn || W_->fp8_attn) && !dllm__env().batch_fp8) return "under FP8 (unverified on a device: DLLM_BATCH_FP8=1 turns it on)";
    if (kvq_.enabled()) return "under kv_quant (its committed rows are quantised codes the varlen attention does not read)";
    return nullptr;
}

/* Slot s empty, sized for rows[s] rows (the batched K/V-cache step's slots: a batch is one or the other); the empty list
 * releases them. */
dllm_status dllm__gpu_backend::bd_batch_reserve(const std::vector<int> &rows) {
    bdb_slots_.clear();
    if (rows.empty()) return batch_kv_reserve(rows);
    if (const char *why = bd_batch_unsupported()) return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched block-diffusion forward %s", why);
    for (int n : rows)
        if (n < 1) return dllm__fail(DLLM_ERR_INTERNAL, "a block-diffusion slot of %d rows (at least 1 expected)", n);
    DLLM__TRY(bkv_alloc(rows));
    bdb_slots_.assign(rows.size(), dllm__bd_slot());
    return DLLM_OK;
}

/* The layout over the reserved slots, the batched forward with its LM head and the device's choice (bd_batch_choose),
 * then each slot's state advanced. The empty list asks whether the forward exists here. */
dllm_status dllm__gpu_backend::bd_forward_batch(const std::vector<dllm__bd_seq> &seqs, float *logits, dllm__choice *choices) {
    if (const char *why = bd_batch_unsupported()) return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched block-diffusion forward %s", why);
    if (seqs.empty()) return DLLM_OK;
    if (bdb_slots_.empty()) return dllm__fail(DLLM_ERR_INTERNAL, "a batched block-diffusion forward before bd_batch_reserve");
    dllm__varlen_layout v;
    DLLM__TRY(dllm__bd_batch_layout_of(seqs, bkv_base_, bkv_rows_, bdb_slots_, max_tokens_, v));
    DLLM__TRY(bd_batch_choose(seqs, v, logits, choices));
    for (const dllm__bd_seq &q : seqs) dllm__bd_slot_advance(q.call, bdb_slots_[(size_t)q.slot]);
    return DLLM_OK;
}

/* batch_logits over the layout with, after each LM-head chunk, the sampler over the chunk's rows of the sequences with a
 * pick (step 0, as bd_forward_choose: dllm__choose's step for block diffusion; their choices to the host), and the
 * other sequences' raw logit rows copied into `logits`, one sequence after another. */
dllm_status dllm__gpu_backend::bd_batch_choose(const std::vector<dllm__bd_seq> &seqs, const dllm__varlen_layout &v, float *logits, dllm__choice *choices) {
    const size_t V = (size_t)m_.cfg.n_vocab;
    std::vector<int> choice0(seqs.size(), -1), raw0(seqs.size(), 0);  // a picked sequence's first choice; another's first row in logits
    int n_chosen = 0, n_raw = 0;
    for (size_t i = 0; i < seqs.size(); i++) {
        if (seqs[i].pick) choice0[i] = n_chosen, n_chosen += seqs[i].pick->n;
        else raw0[i] = n_raw, n_raw += v.raw1[i] - v.raw0[i];
    }
    if ((n_raw > 0 && !logits) || (n_chosen > 0 && !choices))
        return dllm__fail(DLLM_ERR_INTERNAL, "batched block diffusion: %d logit rows and %d choices to return, %s", n_raw, n_chosen,
                          logits ? "no choices array" : "no logits array");
    // One launch samples at most a chunk's rows and one more: under the shift, a pick's rows 0 and 1 both read one row.
    DLLM__TRY(fit_buffers(1, v.rows + 1, std::min(v.out_rows, dllm__lm_chunk_rows) + 1));
    const size_t n = (size_t)std::max(1, n_chosen);
    const std::vector<dllm_step_state> states(seqs.size(), dllm_step_state());
    DLLM__TRY(bch_state_.fit(states.size() * sizeof(dllm_step_state), "the batch's step states"));
    DLLM__TRY(bch_x0_.fit(n * 4, "sampler output"));
    DLLM__TRY(bch_conf_.fit(n * 8, "sampler output"));
    DLLM__TRY(bch_deferred_.fit(n, "sampler output"));
    DLLM__CUDA(cudaMemcpyAsync(bch_state_.ptr, states.data(), states.size() * sizeof(dllm_step_state), cudaMemcpyHostToDevice, stream_));
    DLLM__TRY(batch_logits(v, [&](int c0, int rows) -> dllm_status {
        for (const dllm__sampler_span &s : dllm__bd_sampler_spans(seqs, v, choice0, c0, rows)) DLLM__TRY(sample_span(seqs[(size_t)s.seq].pick->sampling, s, rows));
        for (size_t i = 0; i < seqs.size(); i++) {  // the other sequences: their rows of this chunk
            const int g0 = std::max(c0, v.out0[i]), g1 = std::min(c0 + rows, v.out0[i] + v.raw1[i] - v.raw0[i]);
            if (choice0[i] < 0 && g0 < g1)
                DLLM__CUDA(cudaMemcpyAsync(logits + (size_t)(raw0[i] + g0 - v.out0[i]) * V, act_.logits.as<float>() + (size_t)(g0 - c0) * V,
                                           (size_t)(g1 - g0) * V * 4, cudaMemcpyDeviceToHost, stream_));
        }
        return DLLM_OK;
    }));
    return choices_to_host(bch_x0_, bch_conf_, bch_deferred_, n_chosen, choices);  // also waits for the logits above
}

// ---- 16.4.2 The denoising step --------------------------------------------------------------------

/* First position that can be a candidate: a [MASK] inside the prompt competes too (reference semantics). */
static int dllm__first_candidate(const dllm__decode &st) {
    for (int p = 0; p < st.n_prompt; p++)
        if (st.canvas[(size_t)p] == st.mask_id) return p;
    return st.n_prompt;
}

dllm_status dllm__gpu_backend::begin(dllm__decode &st) {
    if (st.host_steps) return DLLM_OK;  // a batched item: its canvas lives on the host, its forwards are forward_batch's
    const int n = (int)st.canvas.size(), batch = st.cfg_scale > 0 ? 2 : 1;
    kv_on_ = st.kv_cache != DLLM_KV_CACHE_NONE;
    DLLM__TRY(fit_buffers(batch, n, std::min(n, dllm__lm_chunk_rows), st.lacache == DLLM_LACACHE_ON && !kv_on_, kv_on_));
    positions_on_ = !st.positions.empty();
    if (positions_on_) DLLM__CUDA(cudaMemcpyAsync(act_.positions.ptr, st.positions.data(), (size_t)n * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(act_.canvas.ptr, st.canvas.data(), (size_t)n * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(act_.is_prompt.ptr, st.is_prompt.data(), (size_t)n, cudaMemcpyHostToDevice, stream_));
    dllm_step_state init = {};
    init.global_step = st.global_step;
    DLLM__CUDA(cudaMemcpyAsync(act_.state.ptr, &init, sizeof init, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaStreamSynchronize(stream_));  // the host arrays may go out of scope
    st.cand_lo = dllm__first_candidate(st);
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::begin_block(dllm__decode &st) {
    if (st.host_steps) {  // what the host step (dllm__step_begin) reads, as the CPU backend sets it
        st.n_block_masks = dllm__count_masks(st, st.block_begin, st.block_end);
        return DLLM_OK;
    }
    return K_.block_begin.launch({dim3(1), dim3(256)}, stream_, act_.state.ptr, act_.canvas.ptr, st.block_begin, st.block_end, st.steps_per_block,
                                 st.mask_id);
}

/* The sampler's arguments that come from dllm__sampling (the rest say which logits rows it reads). With the filters off
 * the sampler runs exactly as before they existed: no cutoff launch, no per-logit test. */
static void dllm__sampler_fill(sampler_args &a, const dllm__sampling &s) {
    a.temperature = s.temperature, a.seed = s.seed;
    a.eos_inf = s.eos_logit_inf, a.eos_id = s.eos_id, a.eot_id = s.eot_id, a.defer_eos_eot = s.defer_eos_eot;
    a.remasking = (int)s.remasking, a.conf_tempered = s.tempered_conf, a.alg_temp = s.alg_temp;
    a.top_k = s.top_k, a.top_p = (float)s.top_p, a.min_p = (float)s.min_p, a.cutoff = nullptr;
}

/* Samples positions [s0, s1) from the LM head chunk that starts at position cp0 (raw_rows logits rows per batch entry).
 * x0/conf/deferred are indexed by position - cand_lo. */
/* The sampler's arguments over n_rows rows of the LM-head chunk in act_.logits (raw_rows rows) with sampling s: row r is
 * canvas position pos0 + r, reading logits row (shift0 ? max(r - 1, 0) : r) + lrow0; no CFG (sample_rows adds it). The
 * solo step, block diffusion's step (bd_sampler_args) and the batched step (sample_span) all fill them here. */
sampler_args dllm__gpu_backend::sampler_over(const dllm__sampling &s, int n_rows, int pos0, int lrow0, int shift0, int raw_rows) const {
    const dllm__config &c = m_.cfg;
    sampler_args a = {};
    a.cond = act_.logits.as<float>(), a.uncond = nullptr, a.cfg_weight = 1.0f;
    a.vocab = c.n_vocab, a.slice = dllm__vocab_slice, a.n_slices = (c.n_vocab + dllm__vocab_slice - 1) / dllm__vocab_slice, a.n_rows = n_rows;
    a.pos0 = pos0, a.lrow0 = lrow0, a.shift0 = shift0, a.raw_rows = raw_rows;
    dllm__sampler_fill(a, s);
    if (s.filters()) a.cutoff = act_.cutoff.as<float>();
    return a;
}

dllm_status dllm__gpu_backend::sample_rows(const dllm__decode &st, int batch, int cp0, int raw_rows, int s0, int s1) {
    const dllm__config &c = m_.cfg;
    const int off = s0 - st.cand_lo;
    sampler_args a = sampler_over(st.sampling, s1 - s0, s0, dllm__logit_row(c, s0) - dllm__logit_row(c, cp0), c.shift_logits && s0 == 0, raw_rows);
    a.uncond = batch == 2 ? act_.logits.as<float>() + (size_t)raw_rows * c.n_vocab : nullptr;
    a.cfg_weight = st.cfg_scale + 1.0f;
    return launch_sampler(a, act_.x0.as<int>() + off, act_.conf.as<double>() + off, act_.deferred.as<unsigned char>() + off);
}

/* The sampler's launches over a.n_rows rows (the filters' cutoff first where they are on), reading act_.state's step. */
dllm_status dllm__gpu_backend::launch_sampler(const sampler_args &a, int *x0, double *conf, unsigned char *deferred, const dllm_step_state *state) {
    const unsigned rows = (unsigned)a.n_rows;
    if (!state) state = act_.state.as<dllm_step_state>();  // [batch] batch_choose: each sequence's own
    if (a.cutoff) DLLM__TRY(S_.row_cutoff_kernel.launch({dim3(rows), dim3(256)}, stream_, a, act_.cutoff.ptr));
    DLLM__TRY(S_.conf_partial_kernel.launch({dim3((unsigned)a.n_slices, rows), dim3(256)}, stream_, a, state, act_.partials.ptr));
    return S_.conf_combine_kernel.launch({dim3((rows + 127) / 128), dim3(128)}, stream_, a, state, act_.partials.ptr, x0, conf, deferred);
}

// ---- [batch] The token choice of a batched step on the device ----------------------------------------------------
// A batched step's logits (126k fp32 a row at LLaDA's vocabulary: 260 MB for 16 sequences of 32 rows, ~13 ms over PCIe)
// stay on the device: after each LM-head chunk the solo step's sampler (dllm__sampler_fill, launch_sampler) runs over the
// chunk's rows of each sequence with that sequence's own parameters and step, and 13 bytes a row reach the host. The
// sequences whose choice the host makes (CFG's two canvases, combined there) get their logits as forward_batch gives
// them. At batch 16 of the dual-cache step (LLaDA-8B shape, H200) the choice costs 0.1 ms of a 19.5 ms step; copying
// the logits to the host instead took 196 ms.

dllm_status dllm__gpu_backend::forward_batch_choose(const std::vector<dllm__batch_seq> &plan, bool kv, float *logits, dllm__choice *choices) {
    if (const char *why = kv ? batch_kv_unsupported() : batch_unsupported())
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend has no batched %s %s", kv ? "K/V-cache step" : "forward", why);
    if (plan.empty()) return DLLM_OK;
    if (kv && !bkv_.ptr) return dllm__fail(DLLM_ERR_INTERNAL, "a batched K/V-cache step before batch_kv_reserve");
    dllm__varlen_layout v;
    DLLM__TRY(kv ? kv_layout(plan, v) : dllm__varlen_layout_of(m_.cfg, plan, max_tokens_, v));
    return batch_choose(plan, v, logits, choices);
}

/* The sampler over one span of the LM-head chunk in act_.logits (raw_rows rows), with its sequence's parameters and
 * step state (bch_state_), its choices into bch_x0_/bch_conf_/bch_deferred_ at span.out. */
dllm_status dllm__gpu_backend::sample_span(const dllm__sampling &s, const dllm__sampler_span &span, int raw_rows) {
    const sampler_args a = sampler_over(s, span.n, span.pos0, span.lrow0, span.shift0, raw_rows);
    return launch_sampler(a, bch_x0_.as<int>() + span.out, bch_conf_.as<double>() + span.out, bch_deferred_.as<unsigned char>() + span.out,
                          bch_state_.as<dllm_step_state>() + span.seq);
}

/* The sampler's first n choices (x0, conf, deferred as launch_sampler wrote them) to the host as dllm__choice, after
 * everything queued on the stream: block diffusion's step and the batched step read them so. */
dllm_status dllm__gpu_backend::choices_to_host(const dllm__dbuf &x0, const dllm__dbuf &conf, const dllm__dbuf &deferred, int n, dllm__choice *out) {
    std::vector<int> t((size_t)n);
    std::vector<double> c((size_t)n);
    std::vector<unsigned char> d((size_t)n);
    if (n > 0) {
        DLLM__CUDA(cudaMemcpyAsync(t.data(), x0.ptr, (size_t)n * 4, cudaMemcpyDeviceToHost, stream_));
        DLLM__CUDA(cudaMemcpyAsync(c.data(), conf.ptr, (size_t)n * 8, cudaMemcpyDeviceToHost, stream_));
        DLLM__CUDA(cudaMemcpyAsync(d.data(), deferred.ptr, (size_t)n, cudaMemcpyDeviceToHost, stream_));
    }
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    for (int i = 0; i < n; i++) out[i] = dllm__choice{t[(size_t)i], c[(size_t)i], d[(size_t)i] != 0};
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::batch_choose(const std::vector<dllm__batch_seq> &plan, const dllm__varlen_layout &v, float *logits, dllm__choice *choices) {
    const dllm__config &c = m_.cfg;
    const size_t V = (size_t)c.n_vocab;
    std::vector<int> choice0(plan.size(), -1), raw0(plan.size(), 0);  // a chosen sequence's first choice; another's first row in raw
    std::vector<dllm_step_state> states(plan.size(), dllm_step_state());
    int n_chosen = 0, n_raw = 0;
    for (size_t i = 0; i < plan.size(); i++) {
        if (plan[i].sampling) choice0[i] = n_chosen, n_chosen += plan[i].r1 - plan[i].r0, states[i].global_step = plan[i].step;
        else raw0[i] = n_raw, n_raw += v.raw1[i] - v.raw0[i];
    }
    // One launch samples at most a chunk's rows and one more: under the shift, positions 0 and 1 both read row 0.
    DLLM__TRY(fit_buffers(1, v.rows + 1, std::min(v.out_rows, dllm__lm_chunk_rows) + 1));
    const size_t n = (size_t)std::max(1, n_chosen);
    DLLM__TRY(bch_state_.fit(states.size() * sizeof(dllm_step_state), "the batch's step states"));
    DLLM__TRY(bch_x0_.fit(n * 4, "sampler output"));
    DLLM__TRY(bch_conf_.fit(n * 8, "sampler output"));
    DLLM__TRY(bch_deferred_.fit(n, "sampler output"));
    DLLM__CUDA(cudaMemcpyAsync(bch_state_.ptr, states.data(), states.size() * sizeof(dllm_step_state), cudaMemcpyHostToDevice, stream_));
    std::vector<float> raw((size_t)n_raw * V);
    DLLM__TRY(batch_logits(v, [&](int c0, int rows) -> dllm_status {
        for (const dllm__sampler_span &s : dllm__batch_sampler_spans(c, plan, v, choice0, c0, rows)) DLLM__TRY(sample_span(*plan[(size_t)s.seq].sampling, s, rows));
        for (size_t i = 0; i < plan.size(); i++) {  // the host's sequences: their rows of this chunk
            const int g0 = std::max(c0, v.out0[i]), g1 = std::min(c0 + rows, v.out0[i] + v.raw1[i] - v.raw0[i]);
            if (choice0[i] < 0 && g0 < g1)
                DLLM__CUDA(cudaMemcpyAsync(raw.data() + (size_t)(raw0[i] + g0 - v.out0[i]) * V, act_.logits.as<float>() + (size_t)(g0 - c0) * V,
                                           (size_t)(g1 - g0) * V * 4, cudaMemcpyDeviceToHost, stream_));
        }
        return DLLM_OK;
    }));
    DLLM__TRY(choices_to_host(bch_x0_, bch_conf_, bch_deferred_, n_chosen, choices));  // also waits for the logits above
    bch_rows_ += n_chosen;
    for (size_t i = 0; i < plan.size(); i++) {
        if (choice0[i] >= 0) continue;
        dllm__unshift_rows(c, raw.data() + (size_t)raw0[i] * V, v.raw0[i], plan[i].r0, plan[i].r1, logits);
        logits += (size_t)(plan[i].r1 - plan[i].r0) * V;
    }
    return DLLM_OK;
}

/* The rows the step's forward computes (dllm__step_rows) and those that reach the LM head: [truncation] only rows that
 * can hold a candidate reach the final norm, the LM head and the sampler (the block, plus the prompt's masks if it has
 * any). The plain path computes every row, except under a K/V cache, whose forwards skip rows anyway: there every mode
 * truncates, so the LM head has the same rows in every mode and may take the GEMM tuned for them (lm_head). */
dllm__forward_plan dllm__gpu_backend::plan_step(const dllm__decode &st) const {
    const dllm__config &c = m_.cfg;
    dllm__seq_rows r;
    r.seq = (int)st.canvas.size();
    dllm__step_rows(st, c.shift_logits, r.q0, r.q1);
    const bool truncate = st.lacache != DLLM_LACACHE_OFF || st.kv_cache != DLLM_KV_CACHE_NONE;
    const int lm_lo = truncate ? (st.cand_lo < st.n_prompt ? st.cand_lo : st.block_begin) : r.q0 == 0 ? 0 : st.block_begin;
    const int lm_hi = truncate ? st.block_end : r.q1;
    r.head0 = lm_lo, r.head1 = lm_hi;
    r.out0 = dllm__logit_row(c, lm_lo), r.out1 = dllm__logit_row(c, lm_hi - 1) + 1;
    r.block0 = st.block_begin, r.block1 = st.block_end;
    dllm__forward_plan plan;
    plan.seqs.assign(st.cfg_scale > 0 ? 2 : 1, r);
    const bool layer0_cache = st.lacache == DLLM_LACACHE_ON && st.kv_cache == DLLM_KV_CACHE_NONE;
    plan.layer0 = !layer0_cache ? DLLM__L0_PLAIN : st.step_in_block == 0 ? DLLM__L0_FILL : DLLM__L0_REUSE;
    return plan;
}

/* One denoising step on the device: forward (both CFG halves), LM head (every row as the reference does, or the
 * candidate rows with LaCache), the sampler over the candidate rows, then the commit. With a K/V cache, steps after the
 * block's first forward only the rows dllm__step_rows names. Everything it reads is on the device, so it can be
 * captured once and replayed. */
dllm_status dllm__gpu_backend::run_step(const dllm__decode &st) {
    const dllm__config &c = m_.cfg;
    const int n = (int)st.canvas.size(), batch = st.cfg_scale > 0 ? 2 : 1;
    if (batch == 2)
        DLLM__TRY(K_.make_uncond.launch({dim3((unsigned)(n + 255) / 256), dim3(256)}, stream_, act_.canvas.ptr, act_.is_prompt.ptr, n, st.mask_id,
                                        act_.canvas.as<int>() + n));
    const dllm__forward_plan plan = plan_step(st);
    const dllm__seq_rows &r = plan.rows();
    DLLM__TRY(forward(plan, act_.canvas.as<int>()));
    for (int cp0 = r.head0; cp0 < r.head1; cp0 += dllm__lm_chunk_rows) {
        const int cp1 = std::min(r.head1, cp0 + dllm__lm_chunk_rows);
        const int craw0 = dllm__logit_row(c, cp0), craw1 = dllm__logit_row(c, cp1 - 1) + 1;
        DLLM__TRY(lm_head(batch, r.out_rows(), craw0 - r.out0, craw1 - craw0));
        mark("lm head");
        const int s0 = std::max(cp0, st.cand_lo);
        if (s0 < cp1) DLLM__TRY(sample_rows(st, batch, cp0, craw1 - craw0, s0, cp1));
        mark("sampler");
        if (debug_rows_ && s0 < cp1) DLLM__TRY(record_rows(st, batch, cp0, craw1 - craw0, std::max(s0, st.block_begin), cp1));
    }
    const int rule = st.unmask.origin ? 4 : (int)st.unmask.kind;  // select_commit's rule 4: ORIGIN
    DLLM__TRY(S_.select_commit.launch({dim3(1), dim3(1024), (size_t)(n - st.cand_lo) * 5}, stream_, act_.canvas.ptr, act_.state.ptr, st.cand_lo,
                                      st.cand_lo, act_.x0.ptr, act_.conf.ptr, act_.deferred.ptr, st.mask_id, act_.committed.ptr, rule,
                                      st.unmask.threshold, st.unmask.factor, st.unmask.eps));
    mark("select");
    return DLLM_OK;
}

/* [step graphs] Everything a captured step graph baked in: a different key means a new capture. */
std::string dllm__gpu_backend::graph_key(const dllm__decode &st) const {
    const dllm__sampling &s = st.sampling;
    return dllm__format("%d %d %d %.17g %.9g %llu %d %d %d %d %d %d %d %d %d %.17g %.17g %.17g %.17g %d %d", st.cfg_scale > 0 ? 2 : 1,
                        (int)st.canvas.size(), st.cand_lo, s.temperature, (double)st.cfg_scale, (unsigned long long)s.seed, s.eos_logit_inf,
                        s.defer_eos_eot, (int)s.remasking, s.eos_id, s.eot_id, st.mask_id, st.lacache, (int)st.unmask.kind, st.unmask.threshold,
                        st.unmask.factor, st.unmask.eps, s.alg_temp, (int)st.kv_cache, (int)positions_on_, act_.generation) +
           dllm__format(" %d %.17g %.17g", s.top_k, s.top_p, s.min_p);  // the sampler filters (a graph without them has no cutoff launch)
}

/* Captures run_step as a graph. A new block of the same configuration (may_update) changes only kernel arguments, so the
 * executable graph is updated in place when it can be (cheaper than instantiating again); another configuration has
 * other kernels, so no update is tried. */
dllm_status dllm__gpu_backend::capture_step(const dllm__decode &st, bool may_update) {
    cudaGraph_t graph = nullptr;
    DLLM__CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    dllm_status s = run_step(st);
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (s != DLLM_OK) {
        if (graph) cudaGraphDestroy(graph);
        return s;
    }
    if (e != cudaSuccess) return dllm__cuda_fail(e, "capturing the step graph");
    if (graph_exec_ && may_update) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(graph_exec_, graph, &info) == cudaSuccess) {
            cudaGraphDestroy(graph);
            return DLLM_OK;
        }
        cudaGetLastError();  // refused (the captured kernels differ): instantiate instead
    }
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    graph_exec_ = nullptr;
    e = cudaGraphInstantiate(&graph_exec_, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) return dllm__cuda_fail(e, "instantiating the step graph");
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::step(dllm__decode &st, std::vector<int32_t> &committed, bool want_host) {
    // The first step of a new configuration runs eagerly: cuBLASLt and lazy module loading do their one-time work
    // outside any capture. So does a block's first step when it fills a cache (LaCache's FILL, the K/V cache's full
    // forward): it runs once per block. Graphs that bake in the block (LaCache, K/V caches) are captured per block;
    // the prefix cache's row count changes with the block, so its GEMM shapes are warmed per block too.
    const bool fill = (st.lacache == DLLM_LACACHE_ON || st.kv_cache != DLLM_KV_CACHE_NONE) && st.step_in_block == 0;
    const std::string at_block = dllm__format(" @%d", st.block_begin);
    const std::string config = graph_key(st), shape = config + (st.kv_cache == DLLM_KV_CACHE_PREFIX ? at_block : "");
    const std::string key = shape + (st.lacache != DLLM_LACACHE_OFF || st.kv_cache != DLLM_KV_CACHE_NONE ? at_block : "");
    if (dllm__env().no_graphs || fill || shape != warmed_key_) {
        DLLM__TRY(run_step(st));
        if (!fill) warmed_key_ = shape;
    } else {
        if (!graph_exec_ || key != graph_key_) {
            DLLM__TRY(capture_step(st, config == graph_config_));
            graph_key_ = key;
            graph_config_ = config;
        }
        DLLM__CUDA(cudaGraphLaunch(graph_exec_, stream_));
    }
    st.forwards += st.cfg_scale > 0 ? 2 : 1;
    committed.clear();
    const bool rule_needs_count = st.steps_per_block == 0;  // threshold/factor: the block loops until no mask is left
    if (!want_host && !rule_needs_count) return DLLM_OK;
    const int n = (int)st.canvas.size();
    int *host = (int *)host_pinned_;
    if (want_host) {
        DLLM__CUDA(cudaMemcpyAsync(host, act_.canvas.ptr, (size_t)n * 4, cudaMemcpyDeviceToHost, stream_));
        DLLM__CUDA(cudaMemcpyAsync(host + n, act_.committed.ptr, (size_t)n * 4, cudaMemcpyDeviceToHost, stream_));
    }
    dllm_step_state *state = (dllm_step_state *)(host + 2 * n);
    DLLM__CUDA(cudaMemcpyAsync(state, act_.state.ptr, sizeof *state, cudaMemcpyDeviceToHost, stream_));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    st.n_block_left = state->n_block_left;
    if (!want_host) return DLLM_OK;
    memcpy(st.canvas.data(), host, (size_t)n * 4);
    committed.assign(host + n, host + n + state->n_committed);
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::finish(dllm__decode &st) {
    if (st.host_steps) return DLLM_OK;  // the host canvas is current
    DLLM__CUDA(cudaMemcpyAsync(st.canvas.data(), act_.canvas.ptr, st.canvas.size() * 4, cudaMemcpyDeviceToHost, stream_));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    return DLLM_OK;
}

// ---- 16.4.3 [block diffusion] (Fast-dLLM v2, Nemotron) --------------------------------------------------
// The GPU twin of dllm__cpu_bd_forward (section 9; block-diffusion.md): one forward of the block-diffusion schedule
// over call.T rows against the committed K/V cache, with the same stages as the plain forward (the GEMM entry point,
// so every weight format works) and flash_attn under its block-causal mask. K|V rows of the committed blocks stay on
// the device for the whole generation; the forward's fresh K|V rows are written right after them, so its attention
// reads one contiguous key range (cache ++ fresh, or cache ++ block cache), and a commit only advances bd_n_. The raw
// logits of rows [r0, r1) are copied to the host: the decode loop (section 17) runs there.

/* A generation starts: the committed cache is emptied and sized for `rows` rows (grown, never shrunk). */
dllm_status dllm__gpu_backend::bd_begin(int rows) {
    const dllm__config &c = m_.cfg;
    const size_t row_bytes = (size_t)4 * c.n_head_kv * c.head_dim;  // K|V, bf16
    DLLM__TRY(bd_cache_.fit(W_->layers.size() * (size_t)rows * row_bytes, "the block-diffusion K/V cache"));
    DLLM__TRY(bd_partial_.fit(dllm__attn_partial_bound(arch_, c.head_dim, n_sms_), "split-KV attention states"));
    DLLM__TRY(load_kv_scatter());  // bd_attention's copy of the fresh rows
    bd_n_ = 0, bd_cap_ = rows, bd_block_rows_ = 0;
    bdfa_n_ = -1, bdfa_rows_seen_ = bdfa_rows_reused_ = 0;
    return kvq_.enabled() ? kvq_begin(rows) : DLLM_OK;
}

/* [KV quant] The module (9b's SoloQ device functions with dllm__src_kvq, the 2-bit levels printed from 9c's) and the
 * rotations, once; the codes of `rows` rows zeroed (9c: rows below the sinks keep codes 0). */
static std::string dllm__src_kvq_module() {
    return dllm__src_prelude() + DLLM__XSTR(struct kvq_args { DLLM__KVQ_ARGS_FIELDS(DLLM__FIELD) };) "\n" DLLM__SOLOQ_KERNELS(DLLM__KERNEL_DECLARE)
        DLLM__KVQ_KERNELS(DLLM__KERNEL_DECLARE) + dllm__format("#define NORM_SLOTS %d\n", dllm__norm_slots) + dllm__src_rows_common +
        dllm__src_soloq_tables() +
        dllm__format("#define LLOYD2_THRESHOLD %af\n__constant__ float LLOYD2_LEVELS[2] = {%af, %af};\n", dllm__lloyd2_threshold,
                     dllm__lloyd2_levels[0], dllm__lloyd2_levels[1]) +
        dllm__src_e4m3 + dllm__src_soloq + dllm__src_warp_softmax + dllm__src_kvq;
}
static dllm__jit_request dllm__module_kvq(const dllm__arch &arch) { return {"dllm_kvq", dllm__src_kvq_module(), {DLLM__KVQ_KERNELS(DLLM__KERNEL_NAME)}, arch.target}; }

/* [KV quant] kvq_flash's tiles (DLLM_KVQ_TC=1): keys per tile (64; 32 past head dim 128, where a tile's rows are twice
 * as wide), the key groups whose pairs a stage holds (the 7B shape's tile of 64 keys spans 2 groups of 32; a tile
 * spanning more reads the rest from global memory), warps at most (one m16 tile of query rows each; 14 hold the 7B
 * shape's 7 x 32 rows of a kv head, at 128 registers a thread: 4 warps share a sub-partition's 16K registers; 8 at
 * larger head dims, whose 128 output registers a thread need the 255 of 256 threads). */
static int dllm__kvq_tc_bc(int hd) { return hd > 128 ? 32 : 64; }
static const int dllm__kvq_tc_pair_groups = 4;
static int dllm__kvq_tc_max_warps(int hd) { return hd > 128 ? 8 : 14; }
static size_t dllm__kvq_tc_stage_bytes(int hd) { return (size_t)dllm__kvq_tc_bc(hd) * hd + (size_t)dllm__kvq_tc_pair_groups * hd * 4 + (size_t)dllm__kvq_tc_bc(hd) * 4; }
/* Dynamic shared memory of a CTA of `warps` warps: the query rows, the decoded K and V tiles, a tile's pairs in fp32,
 * two stages of raw codes and pairs. */
static size_t dllm__kvq_tc_smem(int hd, int warps) {
    return (size_t)(warps * 16 + 2 * dllm__kvq_tc_bc(hd)) * (hd + 8) * 2 + (size_t)(dllm__kvq_tc_pair_groups * hd + dllm__kvq_tc_bc(hd)) * 8 +
           2 * dllm__kvq_tc_stage_bytes(hd);
}
static const int dllm__kvq_tc_chunk_rows = 128;  // query rows a launch at most (a prefill's rows go in launches of these)

/* The module of one head dim (a multiple of 16 up to 256: the mma's k16; checked by dllm__kvq_tc_plan_for): the kvq
 * module's source, the tensor-core plumbing and flash_attn's online softmax, then dllm__src_kvq_tc. */
static dllm__jit_request dllm__module_kvq_tc(const dllm__arch &arch, int hd) {
    return {dllm__format("dllm_kvq_tc_hd%d", hd),
            dllm__src_kvq_module() + DLLM__KVQ_TC_KERNELS(DLLM__KERNEL_DECLARE) +
                dllm__format("#define KVQ_HD %d\n#define KVQ_TC_BC %d\n#define KVQ_TC_PG %d\n#define KVQ_TC_THREADS %d\n#define KVQ_TC_STAGE %zu\n", hd,
                             dllm__kvq_tc_bc(hd), dllm__kvq_tc_pair_groups, dllm__kvq_tc_max_warps(hd) * 32, dllm__kvq_tc_stage_bytes(hd)) +
                dllm__src_mma + dllm__src_attention + dllm__src_kvq_tc,
            {DLLM__KVQ_TC_KERNELS(DLLM__KERNEL_NAME)}, arch.target};
}

/* One launch's shape: warps a CTA (16 query rows each), CTAs over the group's rows, keys a split, splits. */
struct dllm__kvq_tc_plan {
    int warps = 0, q_tiles = 0, split_keys = 0, n_splits = 0;
    size_t smem = 0;
};

/* The plan for q_rows query rows over n_keys keys: every row of a kv head's group in one CTA where the shared memory
 * allows, then the keys split so that the grid is about one CTA per SM (a CTA of 14 warps holds a whole SM's
 * registers at head dim 128). A head dim kvq_flash does not take is DLLM_ERR_UNSUPPORTED (kvq_attention takes it). */
static dllm_status dllm__kvq_tc_plan_for(int hd, int n_head, int n_kv, int q_rows, int n_keys, int n_committed, int n_sink, int n_sms, int smem_optin,
                                         dllm__kvq_tc_plan &p) {
    if (hd % 16 || hd > 256 || n_kv <= 0 || n_head % n_kv)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "DLLM_KVQ_TC: the tensor-core attention takes head dims that are multiples of 16 up to 256 and whole GQA "
                          "groups (head dim %d, %d heads over %d kv heads); kvq_attention serves the rest (unset DLLM_KVQ_TC)", hd, n_head, n_kv);
    const int rows = n_head / n_kv * q_rows, bc = dllm__kvq_tc_bc(hd);
    p.warps = std::max(1, std::min(dllm__kvq_tc_max_warps(hd), (rows + 15) / 16));
    while (p.warps > 1 && dllm__kvq_tc_smem(hd, p.warps) > (size_t)smem_optin) p.warps--;
    p.smem = dllm__kvq_tc_smem(hd, p.warps);
    if (p.smem > (size_t)smem_optin)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "DLLM_KVQ_TC: head dim %d needs %zu bytes of shared memory a block, the GPU allows %d; unset DLLM_KVQ_TC", hd,
                          p.smem, smem_optin);
    p.q_tiles = (rows + p.warps * 16 - 1) / (p.warps * 16);
    const int target = std::max(1, n_sms / (n_kv * p.q_tiles));
    p.split_keys = std::max(2 * bc, (std::max(1, (n_keys + target - 1) / target) + bc - 1) / bc * bc);
    p.n_splits = dllm__kvq_tc_n_splits(n_keys, n_committed, n_sink, p.split_keys);
    return DLLM_OK;
}

/* Bytes of split states a launch of at most dllm__kvq_tc_chunk_rows rows can need: splits <= the plan's target + 6 (each
 * of the three ranges adds at most one split to its share of the keys and one for its misaligned start). */
static size_t dllm__kvq_tc_partial_bound(int hd, int n_head, int n_kv, int n_sms, int smem_optin) {
    size_t most = 0;
    for (int rows = 1; rows <= dllm__kvq_tc_chunk_rows; rows++) {
        dllm__kvq_tc_plan p;
        if (dllm__kvq_tc_plan_for(hd, n_head, n_kv, rows, 1, 0, 0, n_sms, smem_optin, p) != DLLM_OK) return 0;
        const size_t splits = (size_t)std::max(1, n_sms / (n_kv * p.q_tiles)) + 6;
        most = std::max(most, splits * n_head * rows * (hd + 2) * 4);
    }
    return most;
}

static dllm_status dllm__kvq_tc_load(const dllm__arch &arch, int hd, int smem_optin, dllm__kvq_tc_kernels &k) {
    DLLM__TRY(dllm__jit_load(dllm__module_kvq_tc(arch, hd), k.module));
    k.flash.fn = k.module->kernels.at("kvq_flash"), k.flash.name = "kvq_flash";
    k.combine.fn = k.module->kernels.at("kvq_flash_combine"), k.combine.name = "kvq_flash_combine";
    k.hd = hd, k.smem_optin = smem_optin;
    const size_t most = std::min((size_t)smem_optin, dllm__kvq_tc_smem(hd, dllm__kvq_tc_max_warps(hd)));
    DLLM__CUDA(cudaFuncSetAttribute((const void *)k.flash.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most));
    return DLLM_OK;
}

/* kvq_flash then kvq_flash_combine for a's q_rows rows (at most dllm__kvq_tc_chunk_rows) under plan p; `partial` holds
 * partial_bytes (dllm__kvq_tc_partial_bound). */
static dllm_status dllm__kvq_tc_launch(const dllm__kvq_tc_kernels &k, kvq_args a, const dllm__kvq_tc_plan &p, float *partial, size_t partial_bytes,
                                       cudaStream_t s) {
    const size_t need = (size_t)p.n_splits * a.n_head * a.q_rows * (a.hd + 2) * 4;
    if (need > partial_bytes || a.hd != k.hd)
        return dllm__fail(DLLM_ERR_INTERNAL, "kvq_flash: %d splits of %d rows need %zu bytes of split states, %zu allocated (head dim %d, kernels for %d)",
                          p.n_splits, a.q_rows, need, partial_bytes, a.hd, k.hd);
    a.split_keys = p.split_keys, a.partial = partial;
    DLLM__TRY(k.flash.launch({dim3((unsigned)p.n_splits, (unsigned)a.n_kv, (unsigned)p.q_tiles), dim3((unsigned)p.warps * 32), p.smem}, s, a));
    return k.combine.launch({dim3((unsigned)a.q_rows, (unsigned)a.n_head), dim3(32)}, s, a);
}

dllm_status dllm__gpu_backend::kvq_begin(int rows) {
    const dllm__config &c = m_.cfg;
    if (c.head_dim > 256) return dllm__fail(DLLM_ERR_UNSUPPORTED, "kv_quant on the GPU takes head dims up to 256, the model's is %d", c.head_dim);
    if (!KQ_.module) {
        DLLM__TRY(dllm__jit_load(dllm__module_kvq(arch_), KQ_.module));
        KQ_.commit_keys.fn = KQ_.module->kernels.at("kvq_commit_keys"), KQ_.commit_keys.name = "kvq_commit_keys";
        KQ_.commit_values.fn = KQ_.module->kernels.at("kvq_commit_values"), KQ_.commit_values.name = "kvq_commit_values";
        KQ_.attention.fn = KQ_.module->kernels.at("kvq_attention"), KQ_.attention.name = "kvq_attention";
    }
    if (kvq_.soloq() && kvq_rot_.empty()) {
        kvq_rot_.resize(kvq_.rot.size());
        for (size_t l = 0; l < kvq_.rot.size(); l++) DLLM__TRY(dllm__rotation_upload(kvq_.rot[l], kvq_rot_[l]));
    }
    kvq_.cap = rows, kvq_.group = 0;
    const size_t codes = (size_t)kvq_.n_layer * rows * kvq_.row_bytes();
    DLLM__TRY(kvq_k_codes_.fit(codes, "the quantised K/V cache"));
    DLLM__TRY(kvq_v_codes_.fit(codes, "the quantised K/V cache"));
    DLLM__TRY(kvq_v_side_.fit((size_t)kvq_.n_layer * rows * kvq_.n_kv * 4, "the quantised K/V cache"));
    DLLM__CUDA(cudaMemsetAsync(kvq_k_codes_.ptr, 0, codes, stream_));
    DLLM__CUDA(cudaMemsetAsync(kvq_v_codes_.ptr, 0, codes, stream_));
    kvq_tc_on_ = false;
    return dllm__env().kvq_tc ? kvq_tc_begin() : DLLM_OK;
}

/* DLLM_KVQ_TC=1: kvq_flash's module for the model's head dim, once, and its split states sized for any launch. A head
 * dim it does not take keeps kvq_attention (a warning says why). */
dllm_status dllm__gpu_backend::kvq_tc_begin() {
    const dllm__config &c = m_.cfg;
    int smem_optin = 0;
    DLLM__CUDA(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
    dllm__kvq_tc_plan probe;
    if (dllm__kvq_tc_plan_for(c.head_dim, c.n_head, c.n_head_kv, 1, 1, 0, 0, n_sms_, smem_optin, probe) != DLLM_OK) {
        dllm__log(DLLM_LOG_WARN, "%s", dllm_last_error());
        return DLLM_OK;
    }
    if (!KQT_.module) DLLM__TRY(dllm__kvq_tc_load(arch_, c.head_dim, smem_optin, KQT_));
    DLLM__TRY(kvq_partial_.fit(dllm__kvq_tc_partial_bound(c.head_dim, c.n_head, c.n_head_kv, n_sms_, smem_optin),
                               "the split states of the tensor-core KV-quant attention (DLLM_KVQ_TC)"));
    kvq_tc_on_ = true;
    return DLLM_OK;
}

/* The arguments of layer `layer`'s kernels: its cache rows and codes (9c's layout), settings and rotation. */
kvq_args dllm__gpu_backend::kvq_layer_args(size_t layer) const {
    const kvq_args none = {};
    kvq_args a = none;
    const size_t row_elems = (size_t)2 * kvq_.kvd, codes = layer * bd_cap_ * kvq_.row_bytes(), side = layer * bd_cap_ * kvq_.n_kv;
    a.cache = (const bf16_t *)bd_cache_.ptr + layer * bd_cap_ * row_elems;
    a.k_codes = (unsigned char *)kvq_k_codes_.ptr + codes, a.v_codes = (unsigned char *)kvq_v_codes_.ptr + codes;
    a.k_pairs = kvq_.group ? (unsigned short *)kvq_k_pairs_.ptr + layer * kvq_.groups() * kvq_.kvd * 2 : nullptr;
    a.v_pairs = kvq_.soloq() ? nullptr : (unsigned short *)kvq_v_side_.ptr + 2 * side;
    a.v_scale = kvq_.soloq() ? (float *)kvq_v_side_.ptr + side : nullptr;
    if (kvq_.soloq()) {
        const dllm__rotation_dev &r = kvq_rot_[layer];
        a.perm = r.perm.as<int>(), a.signs = (const unsigned char *)r.signs.ptr, a.mixer = r.mixer.as<float>();
        a.rot_b = r.b, a.rot_k = r.k, a.rot_norm = r.norm;
    }
    a.n_kv = kvq_.n_kv, a.hd = kvq_.hd, a.bits = kvq_.bits, a.soloq = kvq_.soloq(), a.n_sink = kvq_.n_sink, a.group = kvq_.group;
    return a;
}

/* Layer `layer`'s rows [row0, row0 + T), just forwarded into bd_cache_, quantised (twin: dllm__kvq_commit's loop body,
 * on the bf16 rows). The key groups were checked by bd_forward. */
dllm_status dllm__gpu_backend::kvq_commit(size_t layer, int row0, int T) {
    kvq_args a = kvq_layer_args(layer);
    a.row0 = row0, a.rows = T;
    const unsigned key_threads = (unsigned)(T / kvq_.group) * (unsigned)kvq_.row_bytes();
    DLLM__TRY(KQ_.commit_keys.launch({dim3((key_threads + 127) / 128), dim3(128)}, stream_, a));
    const int first = std::max(row0, kvq_.n_sink);
    if (first < row0 + T) DLLM__TRY(KQ_.commit_values.launch({dim3((unsigned)(row0 + T - first), (unsigned)kvq_.n_kv), dim3(32)}, stream_, a));
    return DLLM_OK;
}

/* The queries' block-causal attention over the committed rows (quantised ones read from their codes) ++ the forwarded
 * rows: kvq_attention, a warp per (query row, head); with DLLM_KVQ_TC=1 kvq_flash, in launches of at most
 * dllm__kvq_tc_chunk_rows query rows. */
dllm_status dllm__gpu_backend::kvq_attention(size_t layer, const dllm__bd_call &call, int n_keys, int pos0) {
    const dllm__config &c = m_.cfg;
    kvq_args a = kvq_layer_args(layer);
    a.q = act_.qkv.as<bf16_t>(), a.o = act_.att.as<bf16_t>();
    a.q_stride = (c.n_head + 2 * c.n_head_kv) * c.head_dim, a.o_stride = c.n_head * c.head_dim, a.n_head = c.n_head;
    a.n_keys = n_keys, a.n_committed = bd_n_, a.mask_block = call.mask_block, a.q_index0 = pos0, a.scale = 1.0f / sqrtf((float)c.head_dim);
    if (!kvq_tc_on_) return KQ_.attention.launch({dim3((unsigned)call.T, (unsigned)c.n_head), dim3(32)}, stream_, a);
    for (int r0 = 0; r0 < call.T; r0 += dllm__kvq_tc_chunk_rows) {
        kvq_args chunk = a;
        chunk.q += (size_t)r0 * a.q_stride, chunk.o += (size_t)r0 * a.o_stride, chunk.q_index0 = pos0 + r0;
        chunk.q_rows = std::min(dllm__kvq_tc_chunk_rows, call.T - r0);
        dllm__kvq_tc_plan p;
        DLLM__TRY(dllm__kvq_tc_plan_for(c.head_dim, c.n_head, c.n_head_kv, chunk.q_rows, n_keys, bd_n_, kvq_.n_sink, n_sms_, KQT_.smem_optin, p));
        DLLM__TRY(dllm__kvq_tc_launch(KQT_, chunk, p, kvq_partial_.as<float>(), kvq_partial_.bytes, stream_));
    }
    return DLLM_OK;
}

/* The limits of one forward, as the CPU backend checks them: its rows fit the cache after the committed ones, its
 * RoPE positions the context's tables, a sub-block the block cache. */
dllm_status dllm__gpu_backend::bd_check(const dllm__bd_call &call) const {
    if (call.T <= 0 || call.r0 < 0 || call.r1 <= call.r0 || call.r1 > call.T)
        return dllm__fail(DLLM_ERR_INTERNAL, "block diffusion: a forward of %d rows asks for output rows [%d, %d)", call.T, call.r0, call.r1);
    if (call.kind == DLLM__BD_SUB_BLOCK && call.offset + call.T > bd_block_rows_)
        return dllm__fail(DLLM_ERR_INTERNAL, "block diffusion: a sub-block forward at %d outside the block cache (%d rows)", call.offset, bd_block_rows_);
    const int scratch = call.kind == DLLM__BD_SUB_BLOCK ? bd_block_rows_ : call.T;
    if (bd_n_ + scratch > bd_cap_)
        return dllm__fail(DLLM_ERR_INTERNAL,
                          "block diffusion: a forward of %d rows past %d committed ones overflows the K/V cache (%d rows, sized by bd_begin)", call.T,
                          bd_n_, bd_cap_);
    if (bd_n_ + call.offset + call.T > max_tokens_)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "block diffusion: positions up to %d exceed the context's limit of %d tokens (max_tokens)",
                          bd_n_ + call.offset + call.T, max_tokens_);
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::bd_forward(const dllm__bd_call &call, float *logits) {
    DLLM__TRY(bd_prepare(call));
    const bool one_chunk = call.r1 - call.r0 <= dllm__lm_chunk_rows;
    DLLM__TRY(bd_run(call, nullptr, one_chunk));
    if (!one_chunk) return bd_head(call, logits);
    DLLM__CUDA(cudaMemcpyAsync(logits, act_.logits.ptr, (size_t)(call.r1 - call.r0) * m_.cfg.n_vocab * 4, cudaMemcpyDeviceToHost, stream_));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    return DLLM_OK;
}

/* Everything the host decides before a forward's launches (none of it may be captured, [bd graphs]): the limits, the
 * key groups of a kv_quant commit, the buffers fitted (the LM head's rows, and the sampler's choose_rows where the
 * device chooses), the ids copied to the device, FACache's row list. */
dllm_status dllm__gpu_backend::bd_prepare(const dllm__bd_call &call, int choose_rows) {
    DLLM__TRY(bd_check(call));
    const dllm__config &c = m_.cfg;
    const int T = call.T, out_rows = call.r1 - call.r0;
    if (call.kind == DLLM__BD_COMMIT && kvq_.enabled()) {  // 9c's rule: whole key groups, the same all generation long
        const int group = call.kv_group ? call.kv_group : c.bd_size;
        if (!kvq_.group) {
            kvq_.group = group;
            DLLM__TRY(kvq_k_pairs_.fit((size_t)kvq_.n_layer * kvq_.groups() * kvq_.kvd * 4, "the quantised K/V cache"));
        }
        if (group != kvq_.group || group <= 0 || bd_n_ % group || T % group)
            return dllm__fail(DLLM_ERR_INTERNAL, "kv_quant: a commit of rows [%d, %d) is not whole key groups of %d rows (the generation's block: %d)",
                              bd_n_, bd_n_ + T, group, kvq_.group);
    }
    // A K/V-cache generation: row-tuned GEMMs, as the dual cache's (no LaCache row-independence to keep); the RoPE
    // positions are this path's own, not DPad's. Only self_attention reads act_.kv, and this path never calls it.
    kv_on_ = true, positions_on_ = false;
    DLLM__TRY(fit_buffers(1, T, std::max(std::min(out_rows, dllm__lm_chunk_rows), choose_rows)));
    if (call.kind == DLLM__BD_BLOCK_FULL) {
        DLLM__TRY(bd_block_.fit(W_->layers.size() * (size_t)T * 4 * c.n_head_kv * c.head_dim, "the block cache"));
        bd_block_rows_ = T;
    }
    DLLM__CUDA(cudaMemcpyAsync(act_.canvas.ptr, call.ids, (size_t)T * 4, cudaMemcpyHostToDevice, stream_));
    if (bdfa_on(0)) DLLM__TRY(bdfa_prepare(call));
    return DLLM_OK;
}

/* The forward's launches up to the final norm of output rows [r0, r1) (act_.y); the committed length moves in bd_run. */
dllm_status dllm__gpu_backend::bd_layers(const dllm__bd_call &call) {
    const int T = call.T, out_rows = call.r1 - call.r0;
    float *h = act_.h.as<float>();
    mark("start");
    DLLM__TRY(embed_gather(act_.canvas.as<int>(), T, h));
    DLLM__TRY(add_rmsnorm(h, nullptr, nullptr, W_->layers[0].attn_norm.ptr, act_.a.ptr, 1, T, 0, T));
    mark("L0 embed+norm");
    const size_t n_layers = W_->layers.size();
    for (size_t l = 0; l < n_layers; l++) {
        DLLM__TRY(bd_attention(l, call));
        DLLM__TRY(output_and_ffn(l, 1, T, 0, T, h, h));
        if (l + 1 == n_layers) DLLM__TRY(add_rmsnorm(h, h, act_.delta.ptr, W_->final_norm.ptr, act_.y.ptr, 1, T, call.r0, out_rows));
        else if (fp8_attn(l + 1)) DLLM__TRY(add_rmsnorm_e4m3(h, h, act_.delta.ptr, W_->layers[l + 1].attn_norm.ptr, 1, T));
        else DLLM__TRY(add_rmsnorm(h, h, act_.delta.ptr, W_->layers[l + 1].attn_norm.ptr, act_.a.ptr, 1, T, 0, T));
        mark("add+norm");
    }
    return DLLM_OK;
}

/* The forward's launches (bd_layers), then with `head` the LM head over its output rows (one chunk: act_.logits), then
 * with `pick` the sampler's choice of pick's rows (act_.x0, act_.conf, act_.deferred; the draws' step in act_.state). */
dllm_status dllm__gpu_backend::bd_body(const dllm__bd_call &call, const dllm__bd_pick *pick, bool head) {
    const int out_rows = call.r1 - call.r0;
    DLLM__TRY(bd_layers(call));
    if (!head) return DLLM_OK;
    DLLM__TRY(lm_head(1, out_rows, 0, out_rows));
    mark("lm head");
    if (!pick) return DLLM_OK;
    return launch_sampler(bd_sampler_args(call, *pick), act_.x0.as<int>(), act_.conf.as<double>(), act_.deferred.as<unsigned char>());
}

/* [bd graphs] A forward's launches, eagerly or as a graph; then a commit advances the committed length. Graphs are taken
 * for the repeated step forwards (STEP, BLOCK_FULL, SUB_BLOCK) whose LM head is one chunk; a commit runs once per block
 * (capturing it would cost what launching it does), and profiling (mark) times stages between launches: both stay
 * eager, as does everything under DLLM_NO_GRAPHS=1. Only with DLLM_BD_GRAPHS=1 (the environment table says why). */
dllm_status dllm__gpu_backend::bd_run(const dllm__bd_call &call, const dllm__bd_pick *pick, bool head) {
    const bool graph = head && call.kind != DLLM__BD_COMMIT && !timer_ && !dllm__env().no_graphs && dllm__env().bd_graphs;
    if (graph) DLLM__TRY(bd_replay(call, pick));
    else DLLM__TRY(bd_body(call, pick, head));
    if (!graph) bd_graph_counts_[DLLM__GRAPH_EAGER]++;
    if (call.kind == DLLM__BD_COMMIT) bd_n_ += call.T;
    return DLLM_OK;
}

/* The buffers and sizes a captured forward points into, beside what the call names (dllm__bd_graph_keys). */
dllm__bd_graph_id dllm__gpu_backend::bd_graph_id(const dllm__bd_call &call, const dllm__bd_pick *pick) const {
    const dllm__config &c = m_.cfg;
    const int n_keys = bd_n_ + (call.kind == DLLM__BD_SUB_BLOCK ? bd_block_rows_ : call.T);
    const int splits = dllm__attn_kv_splits(arch_, call.T, n_keys, c.n_head, n_sms_);
    const std::string buffers = dllm__format("a%d cap%d g%d %p %p %p %p %p %p %p %p %p", act_.generation, bd_cap_, kvq_.group, bd_cache_.ptr,
                                             bd_block_.ptr, bd_partial_.ptr, bdfa_state_.ptr, bdfa_rows_.ptr, kvq_k_codes_.ptr, kvq_v_codes_.ptr,
                                             kvq_k_pairs_.ptr, kvq_v_side_.ptr);
    return dllm__bd_graph_keys(call, pick, bd_n_, bd_block_rows_, splits, buffers);
}

dllm_status dllm__gpu_backend::bd_replay(const dllm__bd_call &call, const dllm__bd_pick *pick) {
    const dllm__bd_graph_id id = bd_graph_id(call, pick);
    if (!bd_graphs_.count(id.slot) && bd_graphs_.size() >= dllm__bd_graph_slots) bd_graphs_drop();
    dllm__bd_graph &g = bd_graphs_[id.slot];
    dllm__graph_action action = dllm__bd_graph_next(g, id);
    if (action == DLLM__GRAPH_UPDATE || action == DLLM__GRAPH_INSTANTIATE) {
        if (bd_capture(call, pick, g, action) != DLLM_OK) {  // a failed capture fails no forward: this and the slot's next run eagerly
            static std::atomic<bool> warned(false);
            if (!warned.exchange(true))
                dllm__log(DLLM_LOG_WARN, "block diffusion: a step forward could not be captured as a CUDA graph (%s); forwards of its shape run "
                                         "eagerly", dllm__tls_error.c_str());
            cudaGetLastError();
            g.eager_only = true, action = DLLM__GRAPH_EAGER;
        }
    }
    if (action == DLLM__GRAPH_EAGER) DLLM__TRY(bd_body(call, pick, true));
    else DLLM__CUDA(cudaGraphLaunch(g.exec, stream_));
    bd_graph_counts_[action]++;
    return DLLM_OK;
}

/* Captures bd_body into slot g: updates g.exec in place (action UPDATE) or instantiates it (INSTANTIATE, or an update
 * CUDA refused: action says which happened). A failure leaves the slot without a graph. */
dllm_status dllm__gpu_backend::bd_capture(const dllm__bd_call &call, const dllm__bd_pick *pick, dllm__bd_graph &g, dllm__graph_action &action) {
    cudaGraph_t graph = nullptr;
    DLLM__CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    const dllm_status s = bd_body(call, pick, true);
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (s == DLLM_OK && e == cudaSuccess && action == DLLM__GRAPH_UPDATE) {
        cudaGraphExecUpdateResultInfo info = {};
        if (cudaGraphExecUpdate(g.exec, graph, &info) == cudaSuccess) {
            cudaGraphDestroy(graph);
            return DLLM_OK;
        }
        cudaGetLastError();  // refused (the captured kernels or their topology differ): instantiate instead
        bd_graph_refused(info);
        action = DLLM__GRAPH_INSTANTIATE;
    }
    if (g.exec) cudaGraphExecDestroy(g.exec);
    g.exec = nullptr;
    if (s == DLLM_OK && e == cudaSuccess) e = cudaGraphInstantiate(&g.exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (s == DLLM_OK && e == cudaSuccess) return DLLM_OK;  // g.baked: set by dllm__bd_graph_next
    g.exec = nullptr;
    return s != DLLM_OK ? s : dllm__cuda_fail(e, "capturing a block-diffusion forward as a graph");
}

/* A refused update is counted (the tests expect none) and, the first time, logged with CUDA's reason and the node it
 * names, so that a device run says which capture changed shape. */
void dllm__gpu_backend::bd_graph_refused(const cudaGraphExecUpdateResultInfo &info) {
    bd_graph_refusals_++;
    static std::atomic<bool> logged(false);
    if (logged.exchange(true)) return;
    cudaGraphNodeType type = cudaGraphNodeTypeCount;
    if (info.errorNode) cudaGraphNodeGetType(info.errorNode, &type);
    cudaGetLastError();
    dllm__log(DLLM_LOG_INFO, "block diffusion: CUDA refused a graph update (cudaGraphExecUpdateResult %d, node type %d); the slot is instantiated "
                             "again", (int)info.result, (int)type);
}

void dllm__gpu_backend::bd_graphs_drop() {
    for (auto &kv : bd_graphs_)
        if (kv.second.exec) cudaGraphExecDestroy(kv.second.exec);
    bd_graphs_.clear();
}

/* Layer `layer` up to its attention output (act_.att) for the rows of act_.a (see dllm__bd_kind): the fused QKV GEMM,
 * bias + RoPE at positions bd_n_ + offset + i, Nemotron's Llama-4 query scaling, the fresh K|V rows into the cache
 * (and the block cache), and the queries' block-causal attention over the cache's key range. Twin:
 * dllm__cpu_bd_attention. */
dllm_status dllm__gpu_backend::bd_attention(size_t layer, const dllm__bd_call &call) {
    const dllm__config &c = m_.cfg;
    const int T = call.T, hd = c.head_dim, kvd = c.n_head_kv * hd, qkv = (c.n_head + 2 * c.n_head_kv) * hd, pos0 = bd_n_ + call.offset;
    const size_t row_bytes = (size_t)kvd * 4;
    const dllm__gpu_layer &L = W_->layers[layer];
    const bool split = bdfa_on(layer);  // [FACache]: a row's Q must not depend on the forward's row count
    DLLM__TRY(gemm(L.qkv.view(), fp8_attn(layer) ? nullptr : act_.a.ptr, act_.qkv.ptr, T, split ? DLLM__ROWS_INDEPENDENT : DLLM__ROWS_TUNED));
    mark("gemm qkv");
    DLLM__TRY(rope_qkv(act_.qkv.ptr, L.b_qkv.ptr, T, T, pos0));
    if (c.llama4_beta != 0)
        DLLM__TRY(K_.llama4_scale_q.launch({dllm__rows_grid(T, c.n_head * hd / 8, 256), dim3(256)}, stream_, act_.qkv.ptr, T, qkv, c.n_head * hd, pos0,
                                           c.llama4_beta, c.llama4_orig_max));
    mark("rope");
    char *cache = (char *)bd_cache_.ptr + layer * (size_t)bd_cap_ * row_bytes, *after = cache + (size_t)bd_n_ * row_bytes;
    const bf16_t *fresh = act_.qkv.as<bf16_t>() + (size_t)c.n_head * hd;  // the K|V part of each projection row
    auto put_fresh = [&](char *dst) {  // rows T of them, in order (kv_scatter_rows: see there why not a 2D memcpy)
        return kv_scatter_.launch({dim3((unsigned)T), dim3(128)}, stream_, fresh, (u64)qkv, (bf16_t *)dst, (u64)(2 * kvd), nullptr, 2 * kvd, T);
    };
    int n_keys = bd_n_ + T;
    if (call.kind == DLLM__BD_SUB_BLOCK) {
        char *block = (char *)bd_block_.ptr + layer * (size_t)bd_block_rows_ * row_bytes;
        DLLM__TRY(put_fresh(block + (size_t)call.offset * row_bytes));  // the overwrite persists (block-diffusion.md)
        DLLM__CUDA(cudaMemcpyAsync(after, block, (size_t)bd_block_rows_ * row_bytes, cudaMemcpyDeviceToDevice, stream_));
        n_keys = bd_n_ + bd_block_rows_;
    } else {
        DLLM__TRY(put_fresh(after));
        if (call.kind == DLLM__BD_BLOCK_FULL) DLLM__TRY(put_fresh((char *)bd_block_.ptr + layer * (size_t)T * row_bytes));
    }
    mark("kv cache");
    attn_args a = {};
    a.q = act_.qkv.as<bf16_t>();
    a.k = (const bf16_t *)cache;
    a.v = (const bf16_t *)cache + kvd;
    a.o = act_.att.as<bf16_t>();
    a.seq = n_keys, a.q_rows = T;
    a.q_stride = qkv, a.kv_stride = 2 * kvd, a.o_stride = c.n_head * hd, a.group = c.n_head / c.n_head_kv;
    a.q_bstride = (u64)T * qkv, a.o_bstride = (u64)T * c.n_head * hd;
    a.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    a.kv_splits = dllm__attn_kv_splits(arch_, T, n_keys, c.n_head, n_sms_);
    a.partial = bd_partial_.as<float>();
    a.mask_block = call.mask_block, a.q_index0 = pos0;
    if (split) DLLM__TRY(bdfa_attention(call, n_keys, pos0));
    else if (kvq_.enabled() && bd_n_ > 0) DLLM__TRY(kvq_attention(layer, call, n_keys, pos0));
    else DLLM__TRY(dllm__attn_launch(A_, arch_, hd, c.n_head, 1, a, stream_));
    mark("attention");
    if (call.kind == DLLM__BD_COMMIT && kvq_.enabled()) DLLM__TRY(kvq_commit(layer, bd_n_, T));
    return DLLM_OK;
}

/* [FACache] Layer 0 of a forward over a non-empty committed cache takes the split attention (bdfa_attention) in every
 * lacache mode, so that ON and OFF give the same bits. Not under kv_quant (its attention reads the codes: kvq_attention). */
bool dllm__gpu_backend::bdfa_on(size_t layer) const {
    return !bdfa_off_ && layer == 0 && bd_n_ > 0 && !kvq_.enabled() && m_.cfg.head_dim <= 256;
}

/* [FACache] The host's part of layer 0's split attention, run before the forward's launches (bd_prepare) so that a
 * captured forward holds launches only [bd graphs]: the module at its first use, the state buffers, and the list of
 * rows whose committed state is computed (those whose token changed since the last commit; every row without
 * call.lacache), copied to the device after its length. The decision stays on the host; a graph reads its outcome. */
dllm_status dllm__gpu_backend::bdfa_prepare(const dllm__bd_call &call) {
    const dllm__config &c = m_.cfg;
    const int T = call.T, hd = c.head_dim, offsets = call.offset + T;
    if (!FA_.module) {
        DLLM__TRY(dllm__jit_load(dllm__module_bdfa(arch_), FA_.module));
        FA_.committed.fn = FA_.module->kernels.at("bdfa_committed"), FA_.committed.name = "bdfa_committed";
        FA_.merge.fn = FA_.module->kernels.at("bdfa_merge"), FA_.merge.name = "bdfa_merge";
    }
    const size_t state_bytes = (size_t)offsets * c.n_head * (hd + 2) * 4;
    if (bdfa_n_ != bd_n_ || state_bytes > bdfa_state_.bytes) bdfa_token_.assign(bdfa_token_.size(), -1);  // other keys, or states lost
    DLLM__TRY(bdfa_state_.fit(state_bytes, "layer 0's attention states (FACache)"));
    DLLM__TRY(bdfa_rows_.fit((size_t)(T + 1) * 4, "layer 0's attention states (FACache)"));
    bdfa_n_ = bd_n_;
    if ((int)bdfa_token_.size() < offsets) bdfa_token_.resize((size_t)offsets, -1);
    bdfa_list_.assign(1, 0);  // [0]: how many rows follow
    for (int t = 0; t < T; t++) {
        int32_t &held = bdfa_token_[(size_t)(call.offset + t)];
        if (call.lacache && held == call.ids[t]) continue;
        bdfa_list_.push_back(t);
        held = call.lacache ? call.ids[t] : -1;
    }
    bdfa_list_[0] = (int)bdfa_list_.size() - 1;
    if (call.lacache) bdfa_rows_seen_ += T, bdfa_rows_reused_ += T - (int64_t)bdfa_list_[0];
    DLLM__CUDA(cudaMemcpyAsync(bdfa_rows_.ptr, bdfa_list_.data(), bdfa_list_.size() * 4, cudaMemcpyHostToDevice, stream_));
    return DLLM_OK;
}

/* [FACache] Layer 0's attention of call's rows (act_.qkv) over the committed rows ++ its own (n_keys in all): the
 * committed state of each listed row (bdfa_prepare) is computed and kept at its block offset, then every row merges it
 * with its own keys' state (dllm__src_bdfa). Eagerly a CTA per listed row; captured, a CTA per row, those past the
 * list's length (on the device, read at each replay) returning at once. */
dllm_status dllm__gpu_backend::bdfa_attention(const dllm__bd_call &call, int n_keys, int pos0) {
    const dllm__config &c = m_.cfg;
    const int T = call.T, hd = c.head_dim;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    DLLM__CUDA(cudaStreamIsCapturing(stream_, &capturing));
    const bool graph = capturing != cudaStreamCaptureStatusNone;
    bdfa_args a = {};
    a.cache = (const bf16_t *)bd_cache_.ptr;  // layer 0's rows come first
    a.q = act_.qkv.as<bf16_t>(), a.o = act_.att.as<bf16_t>();
    a.q_stride = (c.n_head + 2 * c.n_head_kv) * hd, a.o_stride = c.n_head * hd;
    a.n_head = c.n_head, a.n_kv = c.n_head_kv, a.hd = hd, a.scale = 1.0f / sqrtf((float)hd);
    a.n_keys = n_keys, a.n_committed = bd_n_, a.mask_block = call.mask_block, a.q_index0 = pos0;
    a.rows = bdfa_rows_.as<int>() + 1, a.n_rows = graph ? bdfa_rows_.as<int>() : nullptr;
    a.offset = call.offset, a.state = bdfa_state_.as<float>();
    const int ctas = graph ? T : bdfa_list_[0];
    if (ctas > 0) DLLM__TRY(FA_.committed.launch({dim3((unsigned)ctas, (unsigned)c.n_head), dim3(32 * dllm__bdfa_warps)}, stream_, a));
    return FA_.merge.launch({dim3((unsigned)T, (unsigned)c.n_head), dim3(32)}, stream_, a);
}

/* The LM head over the final-normed output rows (act_.y) in chunks, each chunk's fp32 logits copied to the host. */
dllm_status dllm__gpu_backend::bd_head(const dllm__bd_call &call, float *logits) {
    const int V = m_.cfg.n_vocab, out_rows = call.r1 - call.r0;
    for (int c0 = 0; c0 < out_rows; c0 += dllm__lm_chunk_rows) {
        const int rows = std::min(dllm__lm_chunk_rows, out_rows - c0);
        DLLM__TRY(lm_head(1, out_rows, c0, rows));
        mark("lm head");
        if (!logits) continue;  // bd_forward_choose: one chunk, sampled where it is
        DLLM__CUDA(cudaMemcpyAsync(logits + (size_t)c0 * V, act_.logits.ptr, (size_t)rows * V * 4, cudaMemcpyDeviceToHost, stream_));
    }
    if (logits) DLLM__CUDA(cudaStreamSynchronize(stream_));
    return DLLM_OK;
}

/* A step's forward and its token choice on the device (twin: dllm__choose on the host over bd_forward's logits, in
 * dllm__bd_generation::forward_choose). The logits stay in act_.logits and the sampler picks each row's token and
 * confidence, so 13 bytes a row reach the host instead of a vocabulary of fp32 (600 KB a row at Qwen2's), and the
 * host's float64 softmax over it (~2 ms a row on one core) leaves the step: prompt 512 + gen 256 at the 7B shape took
 * 3.18 s with the host's choice, 1.41 s with this (H200, 2026-12-05). */
dllm_status dllm__gpu_backend::bd_forward_choose(const dllm__bd_call &call, const dllm__bd_pick &pick, dllm__choice *out) {
    const int out_rows = call.r1 - call.r0, n = pick.n;
    if (n <= 0 || n > call.T || out_rows > dllm__lm_chunk_rows || pick.logits_row(0) < 0 || pick.logits_row(n - 1) >= out_rows)
        return dllm__fail(DLLM_ERR_INTERNAL, "block diffusion: %d rows to choose from logits rows %d.. of a forward's %d (one LM-head chunk of at most %d)", n,
                          pick.logits_row(0), out_rows, dllm__lm_chunk_rows);
    DLLM__TRY(bd_prepare(call, n));
    const dllm_step_state draws = {};  // global_step 0: dllm__choose's step for block diffusion
    DLLM__CUDA(cudaMemcpyAsync(act_.state.ptr, &draws, sizeof draws, cudaMemcpyHostToDevice, stream_));
    DLLM__TRY(bd_run(call, &pick, true));  // the forward, its LM head and the sampler
    return choices_to_host(act_.x0, act_.conf, act_.deferred, n, out);
}

/* The sampler over pick's rows of the forward's one LM-head chunk (act_.logits, call's output rows). */
sampler_args dllm__gpu_backend::bd_sampler_args(const dllm__bd_call &call, const dllm__bd_pick &pick) const {
    return sampler_over(pick.sampling, pick.n, pick.pos0, pick.lrow0, pick.shift0, call.r1 - call.r0);
}

/* dllm_logits on a block-diffusion model (twin: dllm__cpu_backend::bd_logits): one forward without a committed cache,
 * block-causal at the granularity the model's forward uses when none is named, positions from 0, shift applied. */
dllm_status dllm__gpu_backend::bd_logits(const int32_t *ids, int n, int r0, int r1, float *out) {
    const dllm__config &c = m_.cfg;
    DLLM__TRY(bd_begin(n));
    dllm__bd_call call;
    call.ids = ids, call.T = n, call.mask_block = c.bd_mask_block;
    call.r0 = dllm__logit_row(c, r0), call.r1 = dllm__logit_row(c, r1 - 1) + 1;
    std::vector<float> raw((size_t)(call.r1 - call.r0) * c.n_vocab);
    DLLM__TRY(bd_forward(call, raw.data()));
    for (int p = r0; p < r1; p++)
        memcpy(out + (size_t)(p - r0) * c.n_vocab, raw.data() + (size_t)(dllm__logit_row(c, p) - call.r0) * c.n_vocab, sizeof(float) * c.n_vocab);
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 16.5 [debug hooks]: for tests and benchmarks only
// ---------------------------------------------------------------------------------------------------
DLLM__TEST_HOOKS_BEGIN

/* [KV quant] The device's committed cache as the CPU twin holds it: q with the codes, pairs and scales (9c's vectors,
 * sized for bd_cap_ rows), k and v the bf16 rows as fp32 [layer][cap][kvd]. */
dllm_status dllm__gpu_backend::kvq_snapshot(dllm__kvq &q, std::vector<float> &k, std::vector<float> &v) {
    q = kvq_;
    q.reset(bd_cap_);
    q.group = kvq_.group;
    q.k_pairs.assign((size_t)q.n_layer * q.groups() * q.kvd * 2, 0);
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    DLLM__CUDA(cudaMemcpy(q.k_codes.data(), kvq_k_codes_.ptr, q.k_codes.size(), cudaMemcpyDeviceToHost));
    DLLM__CUDA(cudaMemcpy(q.v_codes.data(), kvq_v_codes_.ptr, q.v_codes.size(), cudaMemcpyDeviceToHost));
    if (!q.k_pairs.empty()) DLLM__CUDA(cudaMemcpy(q.k_pairs.data(), kvq_k_pairs_.ptr, q.k_pairs.size() * 2, cudaMemcpyDeviceToHost));
    if (q.soloq()) DLLM__CUDA(cudaMemcpy(q.v_scale.data(), kvq_v_side_.ptr, q.v_scale.size() * 4, cudaMemcpyDeviceToHost));
    else DLLM__CUDA(cudaMemcpy(q.v_pairs.data(), kvq_v_side_.ptr, q.v_pairs.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<uint16_t> rows((size_t)q.n_layer * bd_cap_ * 2 * q.kvd);
    DLLM__CUDA(cudaMemcpy(rows.data(), bd_cache_.ptr, rows.size() * 2, cudaMemcpyDeviceToHost));
    k.resize(rows.size() / 2), v.resize(rows.size() / 2);
    for (size_t r = 0; r < (size_t)q.n_layer * bd_cap_; r++)
        for (int e = 0; e < q.kvd; e++) {
            k[r * q.kvd + e] = dllm__bf16_to_f32(rows[r * 2 * q.kvd + e]);
            v[r * q.kvd + e] = dllm__bf16_to_f32(rows[r * 2 * q.kvd + q.kvd + e]);
        }
    return DLLM_OK;
}

/* Per-stage timing of the forward (benchmarks): an event after each stage, named. */
struct dllm__stage_timer {
    std::vector<std::pair<std::string, cudaEvent_t>> marks;
    ~dllm__stage_timer() {
        for (auto &m : marks) cudaEventDestroy(m.second);
    }
    void mark(const char *name, cudaStream_t s) {
        cudaEvent_t e;
        if (cudaEventCreate(&e) != cudaSuccess) return;
        cudaEventRecord(e, s);
        marks.push_back({name, e});
    }
    /* Milliseconds per stage name, summed over repeats (call after synchronising). */
    DLLM__TEST_HOOK std::vector<std::pair<std::string, double>> totals() const {
        std::vector<std::pair<std::string, double>> out;
        for (size_t i = 1; i < marks.size(); i++) {
            float ms = 0;
            cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second);
            auto it = std::find_if(out.begin(), out.end(), [&](const std::pair<std::string, double> &p) { return p.first == marks[i].first; });
            if (it == out.end()) out.push_back({marks[i].first, ms});
            else it->second += ms;
        }
        return out;
    }
};

void dllm__gpu_backend::mark(const char *stage) {
    if (timer_) timer_->mark(stage, stream_);
}

/* Benchmarks: one eager step with every stage timed. */
dllm_status dllm__gpu_backend::profile_step(const dllm__decode &st, dllm__stage_timer &t) {
    timer_ = &t;
    dllm_status s = run_step(st);
    timer_ = nullptr;
    return s;
}

/* Tests (set_debug_rows): the logits the sampler sees at each (global step, block position), cond then uncond rows
 * (eager steps only: set DLLM_NO_GRAPHS). */
dllm_status dllm__gpu_backend::record_rows(const dllm__decode &st, int batch, int cp0, int raw_rows, int s0, int s1) {
    const dllm__config &c = m_.cfg;
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    for (int p = s0; p < s1; p++) {
        std::vector<float> &row = (*debug_rows_)[{st.global_step, p}];
        row.resize((size_t)batch * c.n_vocab);
        for (int b = 0; b < batch; b++) {
            size_t lr = (size_t)b * raw_rows + (size_t)(dllm__logit_row(c, p) - dllm__logit_row(c, cp0));
            DLLM__CUDA(cudaMemcpy(row.data() + (size_t)b * c.n_vocab, act_.logits.as<float>() + lr * c.n_vocab, (size_t)c.n_vocab * 4,
                                  cudaMemcpyDeviceToHost));
        }
    }
    return DLLM_OK;
}

DLLM__TEST_HOOKS_END

// ---------------------------------------------------------------------------------------------------
// 17. SAR decoding (LLaDA generate.py)
//     x = prompt ++ [MASK] * G; for each block, n masks get s steps, k_i = n / s (+1 for the first n % s
//     steps); each step commits the top k_i candidates (masked positions before the block end).
// ---------------------------------------------------------------------------------------------------

}  // namespace
struct dllm_ctx {
    dllm_model *model = nullptr;
    dllm_ctx_params params;
    dllm_backend backend = DLLM_BACKEND_CPU;
    int max_tokens = 0;
    std::string last_error;
    std::unique_ptr<dllm__backend_impl> impl;
};
namespace {

struct dllm__gen_plan {
    int n_blocks = 0, steps_per_block = 0;  // steps_per_block 0: threshold/factor (data-dependent)
    int32_t mask_id = 0, eos_id = -1, eot_id = -1;
};

static dllm_status dllm__check_token(const char *what, int32_t id, int n_vocab) {
    if (id < -1 || id >= n_vocab) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "%s %d is outside the vocabulary [0, %d)", what, id, n_vocab);
    return DLLM_OK;
}

static bool dllm__finite_in(double v, double lo, double hi) { return v >= lo && v <= hi; }  // false for NaN

/* Dream's sampler options (decoding.md 4): ranges, and the combinations that mean something. The remasking
 * and unmask values are already validated. */
static dllm_status dllm__check_dream(const dllm_gen_params &p) {
    const int unmask = dllm__enum_int(p.unmask), remasking = dllm__enum_int(p.remasking);
    const bool counted = unmask == DLLM_UNMASK_SCHEDULE || unmask == DLLM_UNMASK_TIMESTEPS;
    if (unmask == DLLM_UNMASK_TIMESTEPS && !(p.eps > 0 && p.eps < 1)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "eps must be in (0, 1), got %g", p.eps);
    if (!(p.alg_temp >= 0 && p.alg_temp <= DBL_MAX)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "alg_temp must be finite and >= 0, got %g", p.alg_temp);
    if (remasking == DLLM_REMASK_ORIGIN && unmask != DLLM_UNMASK_TIMESTEPS)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "DLLM_REMASK_ORIGIN transfers each mask with the probability of Dream's timestep schedule: "
                          "it needs unmask = DLLM_UNMASK_TIMESTEPS (got %d)", unmask);
    if (remasking == DLLM_REMASK_ORIGIN && p.confidence_eos_eot_inf)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "DLLM_REMASK_ORIGIN does not rank candidates, so confidence_eos_eot_inf cannot put EOS/EoT last");
    if (p.alg_temp > 0 && (!counted || remasking == DLLM_REMASK_ORIGIN))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "alg_temp samples the k positions of a counted step (DLLM_UNMASK_SCHEDULE or _TIMESTEPS); "
                          "threshold/factor rules and DLLM_REMASK_ORIGIN have no k to sample");
    return DLLM_OK;
}

/* DLLM_UNMASK_THRESHOLD's tau: a probability, or with ENTROPY a bound on sum p log p <= 0 (minus the entropy). */
static dllm_status dllm__check_threshold(const dllm_gen_params &p) {
    if (dllm__enum_int(p.remasking) != DLLM_REMASK_ENTROPY) {
        if (!(p.threshold > 0 && p.threshold <= 1)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "threshold must be in (0, 1], got %g", p.threshold);
    } else if (!(p.threshold <= 0 && p.threshold >= -DBL_MAX)) {
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "with DLLM_REMASK_ENTROPY the confidence is sum p log p <= 0 (minus the entropy in nats): "
                          "threshold must be finite and <= 0 (e.g. -0.5), got %g", p.threshold);
    }
    return DLLM_OK;
}

/* The sampler filters: each off or inside its range (dllm.h). */
static dllm_status dllm__check_filters(const dllm_gen_params &p) {
    if (p.top_k < 0) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "top_k must be >= 0 (0 = off), got %d", p.top_k);
    if (!(p.top_p > 0 && p.top_p <= 1)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "top_p must be in (0, 1] (1 = off), got %g", (double)p.top_p);
    if (!(p.min_p >= 0 && p.min_p <= 1)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "min_p must be in [0, 1] (0 = off), got %g", (double)p.min_p);
    return DLLM_OK;
}

/* The schedule options beyond LLaDA's (Fast-dLLM, DPad, Dream): ranges and combinations. */
static dllm_status dllm__check_schedulers(const dllm_gen_params &p, const int32_t *prompt, int n_prompt, int32_t mask_id) {
    int unmask = dllm__enum_int(p.unmask), kv = dllm__enum_int(p.kv_cache), dpad = dllm__enum_int(p.dpad);
    if (unmask < DLLM_UNMASK_SCHEDULE || unmask > DLLM_UNMASK_TIMESTEPS)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "unmask must be DLLM_UNMASK_SCHEDULE, _THRESHOLD, _FACTOR or _TIMESTEPS, got %d", unmask);
    if (unmask == DLLM_UNMASK_THRESHOLD) DLLM__TRY(dllm__check_threshold(p));
    if (unmask == DLLM_UNMASK_FACTOR && !dllm__finite_in(p.factor, 1e-9, 1e9))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "factor must be > 0, got %g", p.factor);
    if (kv < DLLM_KV_CACHE_NONE || kv > DLLM_KV_CACHE_DUAL)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "kv_cache must be DLLM_KV_CACHE_NONE, _PREFIX or _DUAL, got %d", kv);
    if (kv != DLLM_KV_CACHE_NONE)
        for (int i = 0; i < n_prompt; i++)
            if (prompt[i] == mask_id)
                return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "the prompt has a [MASK] at %d: with a K/V cache only the block's rows are recomputed, "
                                  "so masks outside it cannot be decoded (use kv_cache NONE)", i);
    if (dpad < DLLM_DPAD_OFF || dpad > DLLM_DPAD_UNIFORM)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dpad must be DLLM_DPAD_OFF, _GAUSSIAN or _UNIFORM, got %d", dpad);
    if (dpad == DLLM_DPAD_GAUSSIAN && (p.dpad_window < 2 || !dllm__finite_in(p.dpad_k, 0, 1e6) || !dllm__finite_in(p.dpad_scale, 0, 1e6)))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "DPad (Gaussian) needs dpad_window >= 2, dpad_k >= 0 and dpad_scale >= 0 (got %d, %g, %g)",
                          p.dpad_window, (double)p.dpad_k, (double)p.dpad_scale);
    if (dpad == DLLM_DPAD_UNIFORM && (p.dpad_window < 1 || p.dpad_n < 0))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "DPad (uniform) needs dpad_window >= 1 and dpad_n >= 0 (got %d, %d)", p.dpad_window, p.dpad_n);
    return dllm__check_dream(p);
}

static dllm_status dllm__plan_generation(const dllm_ctx &ctx, const int32_t *prompt, int n_prompt, const dllm_gen_params &p,
                                         int32_t *out, int out_capacity, dllm__gen_plan &plan) {
    const dllm__config &c = ctx.model->cfg;
    if (n_prompt < 0 || (n_prompt > 0 && !prompt)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt is NULL or n_prompt < 0");
    const int unmask = dllm__enum_int(p.unmask);  // read as int: the value is not validated yet
    const bool scheduled = unmask == DLLM_UNMASK_SCHEDULE || unmask == DLLM_UNMASK_TIMESTEPS;  // steps fixed per block
    if (p.gen_length <= 0 || p.block_length <= 0 || (scheduled && p.steps <= 0))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "gen_length (%d), block_length (%d) and steps (%d) must be positive", p.gen_length, p.block_length, p.steps);
    if (p.gen_length % p.block_length)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "gen_length %d is not a multiple of block_length %d", p.gen_length, p.block_length);
    plan.n_blocks = p.gen_length / p.block_length;
    if (scheduled && p.steps % plan.n_blocks)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "steps %d is not a multiple of the number of blocks %d (gen_length / block_length)", p.steps, plan.n_blocks);
    plan.steps_per_block = scheduled ? p.steps / plan.n_blocks : 0;
    if ((int64_t)n_prompt + p.gen_length > ctx.max_tokens)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt (%d) + gen_length (%d) = %lld tokens exceeds the context's limit of %d", n_prompt,
                          p.gen_length, (long long)n_prompt + p.gen_length, ctx.max_tokens);
    if (!(p.temperature >= 0) || !(p.temperature < 1e6)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "temperature must be >= 0, got %g", (double)p.temperature);
    if (!(p.cfg_scale >= 0) || !(p.cfg_scale < 1e6)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "cfg_scale must be >= 0, got %g", (double)p.cfg_scale);
    DLLM__TRY(dllm__check_filters(p));
    int lacache = dllm__enum_int(p.lacache);
    if (lacache < DLLM_LACACHE_OFF || lacache > DLLM_LACACHE_ON)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "lacache must be DLLM_LACACHE_OFF, _TRUNCATE or _ON, got %d", lacache);
    int remasking = dllm__enum_int(p.remasking);
    if (remasking < DLLM_REMASK_LOW_CONFIDENCE || remasking > DLLM_REMASK_ORIGIN)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "remasking must be DLLM_REMASK_LOW_CONFIDENCE, _RANDOM, _MARGIN, _ENTROPY or _ORIGIN, got %d", remasking);
    if (!out || out_capacity < p.gen_length)
        return dllm__fail(!out ? DLLM_ERR_INVALID_ARGUMENT : DLLM_ERR_BUFFER_TOO_SMALL, "the output buffer must hold gen_length = %d ids (capacity %d)", p.gen_length, out ? out_capacity : 0);
    DLLM__TRY(dllm__check_token("mask_id", p.mask_id, c.n_vocab));
    DLLM__TRY(dllm__check_token("eos_id", p.eos_id, c.n_vocab));
    DLLM__TRY(dllm__check_token("eot_id", p.eot_id, c.n_vocab));
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c.n_vocab)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt[%d] = %d is outside the vocabulary [0, %d)", i, prompt[i], c.n_vocab);
    plan.mask_id = p.mask_id >= 0 ? p.mask_id : c.mask_id;
    plan.eos_id = p.eos_id >= 0 ? p.eos_id : c.eos_id;
    plan.eot_id = p.eot_id >= 0 ? p.eot_id : c.eot_id;
    if (p.early_stop && plan.eos_id < 0 && plan.eot_id < 0)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "early_stop needs an EOS or EoT id (the model has none; set eos_id)");
    return dllm__check_schedulers(p, prompt, n_prompt, plan.mask_id);
}

static void dllm__init_decode(const int32_t *prompt, int n_prompt, const dllm_gen_params &p, const dllm__gen_plan &plan, dllm__decode &st) {
    st.n_prompt = n_prompt;
    st.mask_id = plan.mask_id;
    st.cfg_scale = p.cfg_scale;
    st.canvas.assign(prompt, prompt + n_prompt);
    st.canvas.resize((size_t)n_prompt + p.gen_length, plan.mask_id);
    st.is_prompt.assign(st.canvas.size(), 0);
    for (int i = 0; i < n_prompt; i++) st.is_prompt[(size_t)i] = prompt[i] != plan.mask_id;
    st.sampling.temperature = p.temperature;
    st.sampling.remasking = p.remasking;
    // Dream's confidences use its tempered softmax; LOW_CONFIDENCE keeps LLaDA's untempered one unless it runs
    // as Dream's maskgit_plus, under the timestep schedule.
    st.sampling.tempered_conf = p.remasking == DLLM_REMASK_MARGIN || p.remasking == DLLM_REMASK_ENTROPY ||
                                (p.remasking == DLLM_REMASK_LOW_CONFIDENCE && p.unmask == DLLM_UNMASK_TIMESTEPS);
    st.sampling.alg_temp = p.alg_temp;
    st.sampling.seed = p.seed;
    st.sampling.eos_logit_inf = p.logits_eos_inf != 0 && plan.eos_id >= 0;
    st.sampling.defer_eos_eot = p.confidence_eos_eot_inf != 0;
    st.sampling.eos_id = plan.eos_id;
    st.sampling.eot_id = plan.eot_id;
    st.sampling.top_k = p.top_k;
    st.sampling.top_p = p.top_p;
    st.sampling.min_p = p.min_p;
    st.lacache = p.lacache;
    st.unmask.kind = p.unmask;
    st.unmask.threshold = p.threshold;
    st.unmask.factor = p.factor;
    st.unmask.eps = p.eps;
    st.unmask.origin = p.remasking == DLLM_REMASK_ORIGIN;
    st.kv_cache = p.kv_cache;
    st.steps_per_block = plan.steps_per_block;
    st.debug_tag = p.on_step_data;
}

/* DPad (decoding.md 3): the suffix positions a block keeps, ascending. Gaussian: distance d in [0, W) from
 * the block end is kept with probability a * phi(k d / (W - 1)); uniform: the n positions of the window
 * with the smallest draws. Draws come from stream DLLM__RNG_DPAD keyed by (d, position, block): the same
 * seed keeps the same positions on every backend. */
static std::vector<int32_t> dllm__dpad_keep(const dllm_gen_params &p, int block_end, int canvas_end, int block) {
    const int window = std::min(p.dpad_window, canvas_end - block_end);
    std::vector<std::pair<double, int32_t>> draws;
    for (int d = 0; d < window; d++)
        draws.push_back({dllm__uniform(p.seed, (uint32_t)d, (uint32_t)(block_end + d), (uint32_t)block, DLLM__RNG_DPAD), block_end + d});
    std::vector<int32_t> keep;
    if (p.dpad == DLLM_DPAD_GAUSSIAN) {
        for (int d = 0; d < window; d++) {
            double x = (double)p.dpad_k * d / (p.dpad_window - 1);
            if (draws[(size_t)d].first < (double)p.dpad_scale * exp(-0.5 * x * x) / sqrt(2 * M_PI)) keep.push_back(draws[(size_t)d].second);
        }
    } else {
        std::sort(draws.begin(), draws.end());
        for (int i = 0; i < std::min(p.dpad_n, window); i++) keep.push_back(draws[(size_t)i].second);
        std::sort(keep.begin(), keep.end());
    }
    return keep;
}

/* Under DPad a block runs on a compacted canvas: the whole canvas up to the block end, then the kept
 * suffix masks, each row with its original RoPE position. */
static void dllm__dpad_view(const std::vector<int32_t> &full, int block_end, const std::vector<int32_t> &keep, int32_t mask_id, dllm__decode &st) {
    st.canvas.assign(full.begin(), full.begin() + block_end);
    st.canvas.resize((size_t)block_end + keep.size(), mask_id);
    st.positions.resize(st.canvas.size());
    for (int i = 0; i < block_end; i++) st.positions[(size_t)i] = i;
    for (size_t i = 0; i < keep.size(); i++) st.positions[(size_t)block_end + i] = keep[i];
    st.is_prompt.resize(st.canvas.size(), 0);
}

/* Copies the generated part to out; with stop_at_eos it ends before the first EOS/EoT. */
static int dllm__emit_output(const std::vector<int32_t> &canvas, int n_prompt, const dllm__gen_plan &plan, bool stop_at_eos, int32_t *out) {
    int n = 0;
    for (size_t p = (size_t)n_prompt; p < canvas.size(); p++) {
        int32_t t = canvas[p];
        if (stop_at_eos && (t == plan.eos_id || t == plan.eot_id) && t >= 0) break;
        out[n++] = t;
    }
    return n;
}

/* The decoding loop of one generation: blocks left to right, steps until the schedule or the rule says the
 * block is done. The full canvas lives here; under DPad the backend sees one compacted view per block. */
struct dllm__generation {
    dllm_ctx &ctx;
    const dllm_gen_params &p;
    const dllm__gen_plan &plan;
    dllm__decode st;
    std::vector<int32_t> full;  // prompt ++ generation (current after each block, or each step with a callback)
    int steps_done = 0;

    int block = 0, step_in_loop = 0;  // the block being decoded and the steps it has run
    bool done = false;                // every block decoded (or early_stop)

    int total_steps() const { return plan.steps_per_block ? plan.n_blocks * plan.steps_per_block : p.gen_length; }

    /* Threshold/factor commit at least one candidate per step, so a block ends within its masks' count of steps
     * (plus the prompt's masks); the bound only guards against a bug. */
    int max_steps() const { return plan.steps_per_block ? plan.steps_per_block : st.block_end + 1; }

    /* The decoding loop, one step at a time: dllm_generate's, while dllm__batch_decode steps several
     * generations through start / end_step / finish with one batched forward per step. */
    dllm_status run() {
        dllm_status s = start();
        std::vector<int32_t> committed;
        while (s == DLLM_OK && !done) {
            s = ctx.impl->step(st, committed, p.on_step != nullptr);
            if (s == DLLM_OK) s = end_step(committed);
        }
        return finish(s);
    }

    dllm_status start() {
        full = st.canvas;
        if (p.dpad == DLLM_DPAD_OFF) DLLM__TRY(ctx.impl->begin(st));
        return open_block(0);
    }

    dllm_status open_block(int b) {
        const int begin = st.n_prompt + b * p.block_length, end = begin + p.block_length;
        block = b, step_in_loop = 0;
        if (p.dpad != DLLM_DPAD_OFF) {
            dllm__dpad_view(full, end, dllm__dpad_keep(p, end, (int)full.size(), b), plan.mask_id, st);
            DLLM__TRY(ctx.impl->begin(st));
        }
        st.block_begin = begin, st.block_end = end, st.step_in_block = 0;
        return ctx.impl->begin_block(st);
    }

    /* After a step: the counters, the callback, and the next block once this one is done. */
    dllm_status end_step(const std::vector<int32_t> &committed) {
        st.step_in_block++;
        st.global_step++;
        steps_done++;
        if (p.on_step) DLLM__TRY(report(block, step_in_loop, committed));
        const int limit = max_steps();
        step_in_loop++;
        if (plan.steps_per_block ? step_in_loop < limit : st.n_block_left > 0) {
            if (!plan.steps_per_block && step_in_loop == limit) return dllm__fail(DLLM_ERR_INTERNAL, "block %d still has masks after %d steps", block, limit);
            return DLLM_OK;
        }
        // The next DPad view is cut from the full canvas, so the block's tokens must be in it.
        if (p.dpad != DLLM_DPAD_OFF) DLLM__TRY(sync_canvas());
        done = block + 1 == plan.n_blocks || (p.early_stop && stop_early(block));
        return done ? DLLM_OK : open_block(block + 1);
    }

    /* The generation ends (s: how): the canvas comes to the host, also after a cancellation. */
    dllm_status finish(dllm_status s) {
        done = true;
        if (s == DLLM_OK || s == DLLM_ERR_CANCELLED) {
            dllm_status fin = sync_canvas();
            if (s == DLLM_OK) s = fin;
        }
        return s;
    }

    /* Brings the backend's canvas to the host and into the full canvas. */
    dllm_status sync_canvas() {
        DLLM__TRY(ctx.impl->finish(st));
        std::copy(st.canvas.begin(), st.canvas.begin() + std::min(st.canvas.size(), (size_t)st.block_end), full.begin());
        return DLLM_OK;
    }

    /* Early termination (DPad): once a finished block holds EOS/EoT, the rest becomes that token. */
    bool stop_early(int b) {
        if (sync_canvas() != DLLM_OK) return false;
        const int begin = st.n_prompt + b * p.block_length, end = begin + p.block_length;
        for (int q = begin; q < end; q++) {
            int32_t t = full[(size_t)q];
            if (t >= 0 && (t == plan.eos_id || t == plan.eot_id)) {
                std::fill(full.begin() + end, full.end(), plan.eos_id >= 0 ? plan.eos_id : plan.eot_id);
                return true;
            }
        }
        return false;
    }

    dllm_status report(int b, int i, const std::vector<int32_t> &committed) {
        std::copy(st.canvas.begin(), st.canvas.begin() + st.block_end, full.begin());
        int masks = 0;
        for (size_t q = (size_t)st.n_prompt; q < full.size(); q++) masks += full[q] == plan.mask_id;
        dllm_step_info info = {b, plan.n_blocks, i, plan.steps_per_block, steps_done, total_steps(), (int)committed.size(),
                               committed.data(), full.data(), (int)full.size(), st.n_prompt, masks};
        if (p.on_step(&info, p.on_step_data) != 0)
            return dllm__fail(DLLM_ERR_CANCELLED, "generation cancelled by the step callback after step %d", steps_done);
        return DLLM_OK;
    }
};

// ---- Block diffusion: Fast-dLLM v2's generate (block-diffusion.md) --------------------------------------
// x = prompt; if L > B the prompt's whole blocks are prefilled into the committed K/V cache. Per block: pad x
// with masks to the next multiple of B; the block is x's last B tokens; sub-blocks of S left to right, each
// stepped until it has no mask; the finished block is forwarded once more to append its K/V, and the argmax of
// its last logit row is appended as the next block's first token. Line-by-line twin: tools/make_bd_fixtures.py.

/* Validated options of one block-diffusion generation. */
struct dllm__bd_plan {
    int B = 0, S = 0, n_blocks = 0, max_out = 0;
    double tau = 1.0;          // commit p(x0) > tau, plus the best candidate
    int32_t mask_id = -1, stop_id = -1;
    bool block_cache = false;
    int prefill_mask = 0;      // granularity of the prefill and commit forwards: B, or 1 (token-causal)
    int step_mask = 0;         // granularity of the diffusion-step forwards: the model forward's default
};

/* Options that mean nothing to block diffusion are errors that say so, never silently ignored. */
static dllm_status dllm__check_bd_options(const dllm_gen_params &p) {
    struct { bool set; const char *what; } unsupported[] = {
        {!(p.temperature == 0), "temperature > 0 (dllm decodes block diffusion greedily, the official default)"},
        {!(p.cfg_scale == 0), "cfg_scale"},
        {dllm__enum_int(p.remasking) != DLLM_REMASK_LOW_CONFIDENCE, "remasking other than DLLM_REMASK_LOW_CONFIDENCE"},
        {dllm__enum_int(p.unmask) != DLLM_UNMASK_SCHEDULE && dllm__enum_int(p.unmask) != DLLM_UNMASK_THRESHOLD,
         "unmask other than DLLM_UNMASK_SCHEDULE (one token a step) or DLLM_UNMASK_THRESHOLD"},
        {dllm__enum_int(p.kv_cache) != DLLM_KV_CACHE_NONE, "kv_cache (block diffusion has its own committed-block cache; see block_cache)"},
        {dllm__enum_int(p.dpad) != DLLM_DPAD_OFF, "DPad"},
        {!(p.alg_temp == 0), "alg_temp"},
        {p.early_stop != 0, "early_stop (block diffusion stops at its stop token)"},
        {p.logits_eos_inf != 0, "logits_eos_inf"},
        {p.confidence_eos_eot_inf != 0, "confidence_eos_eot_inf"},
    };
    for (auto &u : unsupported)
        if (u.set) return dllm__fail(DLLM_ERR_UNSUPPORTED, "block diffusion does not take %s", u.what);
    if (dllm__enum_int(p.unmask) == DLLM_UNMASK_THRESHOLD && !(p.threshold > 0 && p.threshold <= 1))
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "threshold must be in (0, 1], got %g", p.threshold);
    if (p.block_cache != 0 && p.block_cache != 1) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "block_cache must be 0 or 1, got %d", p.block_cache);
    const int lacache = dllm__enum_int(p.lacache);
    if (lacache < DLLM_LACACHE_OFF || lacache > DLLM_LACACHE_ON)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "lacache must be DLLM_LACACHE_OFF, _TRUNCATE or _ON, got %d", lacache);
    return DLLM_OK;
}

static dllm_status dllm__plan_block_diffusion(const dllm_ctx &ctx, const int32_t *prompt, int n_prompt, const dllm_gen_params &p, int32_t *out,
                                              int out_capacity, dllm__bd_plan &plan) {
    const dllm__config &c = ctx.model->cfg;
    if (n_prompt < 0 || (n_prompt > 0 && !prompt)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt is NULL or n_prompt < 0");
    DLLM__TRY(dllm__check_bd_options(p));
    plan.B = p.block_length;
    plan.S = p.sub_block_length ? p.sub_block_length : 8;
    if (p.gen_length <= 0 || plan.B <= 0 || p.gen_length % plan.B)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "gen_length (%d) must be a positive multiple of block_length (%d)", p.gen_length, plan.B);
    if (plan.S <= 0 || plan.B % plan.S)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "sub_block_length %d%s must divide block_length %d", plan.S, p.sub_block_length ? "" : " (the default)", plan.B);
    plan.n_blocks = p.gen_length / plan.B;
    plan.max_out = plan.n_blocks * plan.B + 1 - n_prompt % plan.B;
    if ((int64_t)n_prompt + p.gen_length + 1 > ctx.max_tokens)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt (%d) + gen_length (%d) + 1 tokens exceeds the context's limit of %d", n_prompt, p.gen_length,
                          ctx.max_tokens);
    if (!out || out_capacity < plan.max_out)
        return dllm__fail(!out ? DLLM_ERR_INVALID_ARGUMENT : DLLM_ERR_BUFFER_TOO_SMALL,
                          "block diffusion writes up to %d ids for this prompt (n_blocks * block_length + 1 - n_prompt %% block_length): "
                          "the output buffer holds %d", plan.max_out, out ? out_capacity : 0);
    DLLM__TRY(dllm__check_token("mask_id", p.mask_id, c.n_vocab));
    DLLM__TRY(dllm__check_token("stop_id", p.stop_id, c.n_vocab));
    plan.mask_id = p.mask_id >= 0 ? p.mask_id : c.mask_id;
    plan.stop_id = p.stop_id >= 0 ? p.stop_id : c.stop_id;
    if (plan.mask_id < 0) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "the model names no mask id: set mask_id (--mask-id)");
    for (int i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= c.n_vocab)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt[%d] = %d is outside the vocabulary [0, %d)", i, prompt[i], c.n_vocab);
        if (prompt[i] == plan.mask_id)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt[%d] is the mask id %d: block diffusion decodes only the masks it appends", i, plan.mask_id);
    }
    plan.tau = dllm__enum_int(p.unmask) == DLLM_UNMASK_THRESHOLD ? p.threshold : 1.0;
    plan.block_cache = p.block_cache != 0;
    plan.prefill_mask = c.bd_causal_context ? 1 : plan.B;
    plan.step_mask = c.bd_mask_block;
    return DLLM_OK;
}

/* The state of one block-diffusion generation; x is the official code's input_ids / x_t. The official loop advances
 * one forward at a time so that dllm_generate (run: one sequence, bd_forward / bd_forward_choose) and
 * dllm_generate_batch (dllm__bd_batch_round: every live sequence's next forward in one bd_forward_batch) run the same
 * code: next() walks the loop up to its next forward and describes it, apply_logits (a COMMIT: the prefill or a
 * finished block) or apply_choices (a step) consumes its result. `at` is where the loop stands: PREFILL, BLOCK (the top
 * of block blk's iteration), LOOP (the block's `while not stopped`), SUB (sub-block s0's `while it has a mask`), DONE. */
struct dllm__bd_generation {
    enum phase { PREFILL, BLOCK, LOOP, SUB, DONE };
    dllm_ctx &ctx;
    const dllm_gen_params &p;
    const dllm__bd_plan &plan;
    int n_prompt = 0;
    std::vector<int32_t> x;
    std::vector<float> logits;  // run's: the last bd_forward's rows
    int steps = 0, forwards = 0;
    phase at = PREFILL;
    int blk = 0, pl = 0, bs = 0, s0 = 0, step_in_block = 0;  // the block, its prompt/seed end, its start, the sub-block, its steps
    bool block_cache_valid = false;
    dllm__bd_call call;  // the forward next() described last
    dllm__bd_pick pick;  // a step's: the rows it chooses

    dllm__bd_generation(dllm_ctx &c, const dllm_gen_params &params, const dllm__bd_plan &bd_plan, int n) : ctx(c), p(params), plan(bd_plan), n_prompt(n) {}

    bool is_mask(size_t i) const { return x[i] == plan.mask_id; }

    /* The first stop token at or after `from`, or -1. */
    int first_stop(int from) const {
        for (size_t i = (size_t)from; plan.stop_id >= 0 && i < x.size(); i++)
            if (x[i] == plan.stop_id) return (int)i;
        return -1;
    }

    /* The official stop rule: a stop token at or after `from` with no mask between `from` and it. */
    bool stopped(int from) const {
        int s = first_stop(from);
        if (s < 0) return false;
        for (int i = from; i < s; i++)
            if (is_mask((size_t)i)) return false;
        return true;
    }

    int masks_in(int begin, int end) const {
        int n = 0;
        for (int i = begin; i < end; i++) n += is_mask((size_t)i);
        return n;
    }

    /* The committed K/V rows the generation needs: the backend's bd_begin, or its batch slot. */
    int cache_rows() const { return n_prompt / plan.B * plan.B + plan.n_blocks * plan.B + plan.B; }

    bool done() const { return at == DONE; }

    /* The generation starts at the prompt: a prefill of its whole blocks only if it is strictly longer than a block (a
     * prompt of exactly B is never forwarded). */
    void start(const int32_t *prompt) {
        x.assign(prompt, prompt + n_prompt);
        at = n_prompt > plan.B ? PREFILL : BLOCK, blk = 0;
    }

    dllm__bd_call make_call(dllm__bd_kind kind, int start, int T, int offset, int mask_block, int r0, int r1) {
        dllm__bd_call c;
        c.kind = kind, c.ids = x.data() + start, c.T = T, c.offset = offset, c.mask_block = mask_block, c.r0 = r0, c.r1 = r1;
        c.kv_group = plan.B;
        c.lacache = dllm__enum_int(p.lacache) == DLLM_LACACHE_ON;
        return c;
    }

    /* Walks the official loop to its next forward and describes it in seq (call, and pick for a step; seq.slot is the
     * caller's), counting it; done() when the generation has no forward left. */
    dllm_status next(dllm__bd_seq &seq) {
        const int B = plan.B, S = plan.S;
        for (;;) {
            switch (at) {
            case PREFILL: {
                const int P = n_prompt / B * B;
                call = make_call(DLLM__BD_COMMIT, 0, P, 0, plan.prefill_mask, P - 1, P);
                break;
            }
            case BLOCK:
                if (blk == plan.n_blocks || first_stop(n_prompt) >= 0) {  // also catches an AR seed equal to the stop token
                    at = DONE;
                    continue;
                }
                pl = (int)x.size();
                x.resize((size_t)(pl + B - pl % B), plan.mask_id);
                bs = (int)x.size() - B, block_cache_valid = false, step_in_block = 0, at = LOOP;
                continue;
            case LOOP:
                if (stopped(pl)) {
                    blk++, at = BLOCK;
                    continue;
                }
                if (masks_in(bs, bs + B) == 0) {  // the finished block's commit forward; its last row seeds the next block
                    call = make_call(DLLM__BD_COMMIT, bs, B, 0, plan.prefill_mask, B - 1, B);
                    break;
                }
                s0 = 0, at = SUB;
                continue;
            case SUB:
                if (s0 >= B || stopped(pl)) {
                    at = LOOP;
                    continue;
                }
                if (masks_in(bs + s0, bs + s0 + S) == 0) {
                    s0 += S;
                    continue;
                }
                if (step_in_block == B) return dllm__fail(DLLM_ERR_INTERNAL, "block %d still has masks after %d steps", blk, B);
                step_call();  // each step commits at least one mask
                break;
            case DONE:
                return DLLM_OK;
            }
            seq.call = call, seq.pick = at == SUB ? &pick : nullptr;
            forwards++;
            return DLLM_OK;
        }
    }

    /* The raw output row (relative to logits) that scores row q of a forward starting at r0: the shift maps
     * q to q - 1 and row 0 to itself (block-diffusion.md). */
    int scoring_row(int q, int r0) const { return (ctx.model->cfg.shift_logits && q > 0 ? q - 1 : q) - r0; }

    /* The forward of one diffusion step on sub-block [s0, s0 + S) of the block at bs, and the rows it chooses. */
    void step_call() {
        const int B = plan.B, S = plan.S, shift = ctx.model->cfg.shift_logits ? 1 : 0;
        // dllm's one deliberate change: the mask token is never predicted. Committing it would leave the position
        // masked and the official loop would never end (a trained model gives it ~0 mass).
        pick = dllm__bd_pick();
        pick.sampling.eos_logit_inf = true, pick.sampling.eos_id = plan.mask_id;
        pick.pos0 = bs + s0, pick.n = S;
        auto score_from = [&](int first, int r0) {  // `first`: the forward's first row, as a block offset
            const int q0 = s0 - first;  // the sub-block's first row in the forward: scoring_row(q0 + i, r0) for row i
            pick.shift0 = shift && q0 == 0, pick.lrow0 = scoring_row(q0, r0);
        };
        if (plan.block_cache && block_cache_valid && !is_mask((size_t)(bs + s0))) {
            score_from(s0, 0);
            call = make_call(DLLM__BD_SUB_BLOCK, bs + s0, S, s0, 0, 0, S);
        } else {
            const int r0 = std::max(0, s0 - shift);
            score_from(0, r0);
            call = make_call(plan.block_cache ? DLLM__BD_BLOCK_FULL : DLLM__BD_STEP, bs, B, 0, plan.step_mask, r0, std::max(s0 + S - shift, r0 + 1));
        }
    }

    /* A COMMIT's result (its one raw logit row): the prefill's or the finished block's K/V are committed, and the
     * argmax of the row (the first index on ties, torch's argmax) seeds the next block (after the prefill: only when
     * the prompt ends on a block boundary). */
    dllm_status apply_logits(const float *row) {
        if (at != PREFILL && at != LOOP) return dllm__fail(DLLM_ERR_INTERNAL, "block diffusion: logits given to a step");
        const int V = ctx.model->cfg.n_vocab;
        const int32_t seed = (int32_t)(std::max_element(row, row + V) - row);
        if (at == LOOP || n_prompt % plan.B == 0) x.push_back(seed);
        if (at == LOOP) blk++;
        at = BLOCK;
        return DLLM_OK;
    }

    /* A step's result, the choice of each row of pick (all[i]; only masked rows are read): the masked positions with
     * conf > tau (strict) plus the single highest-conf one (first on ties) are committed, then the step callback. */
    dllm_status apply_choices(const dllm__choice *all) {
        if (at != SUB) return dllm__fail(DLLM_ERR_INTERNAL, "block diffusion: choices given to a commit");
        if (call.kind != DLLM__BD_SUB_BLOCK) block_cache_valid = plan.block_cache;
        const int i_step = step_in_block++;
        steps++;
        std::vector<int32_t> cand, committed;
        std::vector<dllm__choice> ch;
        int best = -1;
        for (int i = 0; i < plan.S; i++) {
            const int pos = bs + s0 + i;
            if (!is_mask((size_t)pos)) continue;
            cand.push_back(pos);
            ch.push_back(all[i]);
            if (best < 0 || ch.back().conf > ch[(size_t)best].conf) best = (int)ch.size() - 1;  // first on ties
        }
        for (size_t k = 0; k < cand.size(); k++)
            if ((int)k == best || ch[k].conf > plan.tau) {
                x[(size_t)cand[k]] = ch[k].token;
                committed.push_back(cand[k]);
            }
        return report(blk, i_step, committed);
    }

    dllm_status report(int b, int step_in_b, const std::vector<int32_t> &committed) {
        if (!p.on_step) return DLLM_OK;
        dllm_step_info info = {b, plan.n_blocks, step_in_b, 0, steps, plan.n_blocks * plan.B, (int)committed.size(), committed.data(), x.data(),
                               (int)x.size(), n_prompt, masks_in(n_prompt, (int)x.size())};
        if (p.on_step(&info, p.on_step_data) != 0) return dllm__fail(DLLM_ERR_CANCELLED, "generation cancelled by the step callback after step %d", steps);
        return DLLM_OK;
    }

    /* A step's forward and the choice of pick's rows (ch[i] for row i; only masked rows matter): on the device where the
     * backend chooses there, else dllm__choose here over the forward's logits (the twin). */
    dllm_status forward_choose(std::vector<dllm__choice> &ch) {
        ch.assign((size_t)pick.n, dllm__choice{0, -INFINITY, false});
        if (ctx.impl->bd_chooses()) return ctx.impl->bd_forward_choose(call, pick, ch.data());
        const int V = ctx.model->cfg.n_vocab;
        logits.resize((size_t)(call.r1 - call.r0) * V);
        DLLM__TRY(ctx.impl->bd_forward(call, logits.data()));
        for (int i = 0; i < pick.n; i++)
            if (is_mask((size_t)(pick.pos0 + i)))
                ch[(size_t)i] = dllm__choose(logits.data() + (size_t)pick.logits_row(i) * V, V, pick.sampling, (uint32_t)(pick.pos0 + i), 0);
        return DLLM_OK;
    }

    /* dllm_generate: the loop alone on the backend's own committed cache, one forward after another. */
    dllm_status run(const int32_t *prompt) {
        start(prompt);
        DLLM__TRY(ctx.impl->bd_begin(cache_rows()));
        dllm__bd_seq seq;
        std::vector<dllm__choice> ch;
        for (;;) {
            DLLM__TRY(next(seq));
            if (done()) return DLLM_OK;
            if (seq.pick) {
                DLLM__TRY(forward_choose(ch));
                DLLM__TRY(apply_choices(ch.data()));
            } else {
                logits.resize((size_t)(call.r1 - call.r0) * ctx.model->cfg.n_vocab);
                DLLM__TRY(ctx.impl->bd_forward(call, logits.data()));
                DLLM__TRY(apply_logits(logits.data()));
            }
        }
    }

    /* The generated ids, truncated at the first stop token (kept without stop_at_eos, as the official output). */
    int emit(bool stop_at_eos, int32_t *out) const {
        int s = first_stop(n_prompt), end = s < 0 ? (int)x.size() : stop_at_eos ? s : s + 1;
        for (int i = n_prompt; i < end; i++) out[i - n_prompt] = x[(size_t)i];
        return end - n_prompt;
    }
};

/* A finished (or failed, or cancelled) block-diffusion generation's output and stats; facache: the backend's [FACache]
 * row counts since bd_begin, where it has them for this generation (a batched one: 0, the backend counts no slot). */
static void dllm__bd_result(const dllm__bd_generation &g, dllm_status status, int32_t *out, int *n_out, dllm_gen_stats *stats, double t0, bool facache) {
    int n = g.emit(status == DLLM_OK && g.p.stop_at_eos != 0, out);
    if (n_out) *n_out = n;
    if (!stats) return;
    stats->n_prompt = g.n_prompt;
    stats->n_generated = n;
    stats->steps = g.steps;
    stats->forwards = g.forwards;
    stats->wall_ms = dllm__now_ms() - t0;
    int64_t rows = 0, reused = 0;
    if (facache) g.ctx.impl->bd_facache_rows(rows, reused);
    stats->facache_rows = (int)std::min<int64_t>(rows, INT32_MAX);
    stats->facache_rows_reused = (int)std::min<int64_t>(reused, INT32_MAX);
}

static dllm_status dllm__bd_generate_impl(dllm_ctx &ctx, const int32_t *prompt, int n_prompt, const dllm_gen_params &p, int32_t *out,
                                          int out_capacity, int *n_out, dllm_gen_stats *stats) {
    dllm__bd_plan plan;
    DLLM__TRY(dllm__plan_block_diffusion(ctx, prompt, n_prompt, p, out, out_capacity, plan));
    double t0 = dllm__now_ms();
    dllm__bd_generation g{ctx, p, plan, n_prompt};
    dllm_status status = g.run(prompt);
    dllm__bd_result(g, status, out, n_out, stats, t0, true);
    return status;
}

/* A finished generation's output (cut at EOS/EoT only when it finished) and stats. */
static void dllm__generation_result(const dllm__generation &g, dllm_status status, int32_t *out, int *n_out, dllm_gen_stats *stats, double t0) {
    int n = dllm__emit_output(g.full, g.st.n_prompt, g.plan, status == DLLM_OK && g.p.stop_at_eos != 0, out);
    if (n_out) *n_out = n;
    if (stats) {
        stats->n_prompt = g.st.n_prompt;
        stats->n_generated = n;
        stats->steps = g.steps_done;
        stats->forwards = g.st.forwards;
        stats->wall_ms = dllm__now_ms() - t0;
        stats->facache_rows = stats->facache_rows_reused = 0;
    }
}

static dllm_status dllm__generate_impl(dllm_ctx &ctx, const int32_t *prompt, int n_prompt, const dllm_gen_params &p, int32_t *out,
                                       int out_capacity, int *n_out, dllm_gen_stats *stats) {
    if (dllm__is_block_diffusion(ctx.model->cfg)) return dllm__bd_generate_impl(ctx, prompt, n_prompt, p, out, out_capacity, n_out, stats);
    dllm__gen_plan plan;
    DLLM__TRY(dllm__plan_generation(ctx, prompt, n_prompt, p, out, out_capacity, plan));
    double t0 = dllm__now_ms();
    dllm__generation g{ctx, p, plan, dllm__decode(), {}, 0};
    dllm__init_decode(prompt, n_prompt, p, plan, g.st);
    dllm_status status = g.run();
    dllm__generation_result(g, status, out, n_out, stats, t0);
    return status;
}

// ---- Batched decoding (dllm_generate_batch; decoding.md 6) ---------------------------------------------
// Every batched item is a dllm__generation of its own, stepped in lock step: each step plans every active
// sequence's rows (dllm__step_begin), runs ONE forward over all of them (CFG's unconditional canvas is one more
// sequence of it), then chooses and commits per sequence (dllm__step_end, dllm__generation::end_step), exactly
// as the solo step does. A sequence that finishes, fails or is cancelled leaves the batch at once.

/* Why an item cannot join a batched forward (it then decodes alone), or null. kv_why: why the backend has no batched
 * K/V-cache step (forward_batch_kv), or null when it has one. */
static const char *dllm__batch_excluded(const dllm_gen_params &p, const char *kv_why) {
    if (dllm__enum_int(p.kv_cache) != DLLM_KV_CACHE_NONE && kv_why) return kv_why;
    return nullptr;
}

/* One item of a batched decode, while it runs. */
struct dllm__batch_member {
    const dllm_batch_item *item = nullptr;
    dllm_batch_result *result = nullptr;
    dllm__gen_plan plan;
    std::unique_ptr<dllm__generation> g;
    dllm__step_work work;
    std::vector<int32_t> uncond, committed;
    double t0 = 0;
    int slot = -1;  // [dual cache] [prefix cache] its K/V cache (CFG's unconditional canvas: slot + 1), or -1
};

/* An item's outcome; its error message is kept with it, since later items overwrite the thread's. */
static void dllm__batch_set_status(dllm_batch_result &r, dllm_status s) {
    r.status = s;
    snprintf(r.error, sizeof r.error, "%s", s == DLLM_OK ? "" : dllm__tls_error.c_str());
}

static void dllm__batch_retire(dllm__batch_member &m, dllm_status s) {
    s = m.g->finish(s);
    dllm__generation_result(*m.g, s, m.item->out, &m.result->n_out, &m.result->stats, m.t0);
    dllm__batch_set_status(*m.result, s);
}

/* [batch] [dual cache] [prefix cache] A member's canvas (c = 1: CFG's unconditional one) as a sequence of this step's
 * forward: with a K/V cache, the rows dllm__step_rows names over its slot, the block's first step filling it. */
static dllm__batch_seq dllm__batch_seq_of(const dllm__batch_member &m, int c, int shift) {
    const dllm__decode &st = m.g->st;
    dllm__batch_seq s;
    s.ids = c ? m.uncond.data() : st.canvas.data(), s.n = (int)st.canvas.size();
    s.positions = st.positions.empty() ? nullptr : st.positions.data();
    s.r0 = m.work.r0, s.r1 = m.work.r1;
    if (m.slot >= 0) {
        dllm__step_rows(st, shift, s.q0, s.q1);
        s.slot = m.slot + c, s.fill = st.step_in_block == 0;
    }
    return s;
}

/* [batch] Whether the backend chooses a member's tokens (forward_batch_choose): where it chooses at all, for every member
 * but CFG's (its two canvases' logits are combined on the host) and none while dllm__debug_step_logits (tests) wants
 * the logits. */
static bool dllm__batch_device_choice(const dllm_ctx &ctx, const dllm__decode &st) {
    return ctx.impl->batch_chooses() && !dllm__debug_step_logits && st.cfg_scale <= 0;
}

/* [batch] A forward of a step's plan (k = 1: the members with a K/V cache): the logits of every sequence, or where the
 * backend chooses some (a sampling in the plan) theirs chosen and the others' logits. */
static dllm_status dllm__batch_forward(dllm_ctx &ctx, const std::vector<dllm__batch_seq> &plan, int k, float *logits, dllm__choice *choices) {
    if (plan.empty()) return DLLM_OK;
    for (const dllm__batch_seq &s : plan)
        if (s.sampling) return ctx.impl->forward_batch_choose(plan, k == 1, logits, choices);
    return k == 1 ? ctx.impl->forward_batch_kv(plan, logits) : ctx.impl->forward_batch(plan, logits);
}

/* One batched step: every active member's rows (and CFG's unconditional canvas) in one forward (members with a K/V
 * cache in a second one, forward_batch_kv), then each member's choice and commits. Where the backend chooses tokens
 * (dllm__batch_device_choice) it returns a member's choices in place of its logits. A failing forward is every member's
 * failure: the step of none can go on. */
static dllm_status dllm__batch_step(dllm_ctx &ctx, std::vector<dllm__batch_member *> &active, std::vector<float> &logits) {
    const int V = ctx.model->cfg.n_vocab;
    std::vector<dllm__batch_seq> plan[2];  // without, with a K/V cache
    size_t rows[2] = {0, 0}, chosen[2] = {0, 0};  // logit rows to the host, rows chosen by the backend
    for (dllm__batch_member *m : active) {
        dllm__decode &st = m->g->st;
        dllm__step_begin(st, m->work);
        const int n_canvas = st.cfg_scale > 0 ? 2 : 1;
        if (n_canvas == 2) dllm__uncond_canvas(st, m->uncond);
        const bool device = dllm__batch_device_choice(ctx, st);
        for (int c = 0; c < n_canvas; c++) {
            dllm__batch_seq s = dllm__batch_seq_of(*m, c, ctx.model->cfg.shift_logits);
            if (device) s.sampling = &st.sampling, s.step = st.global_step;
            plan[m->slot >= 0].push_back(s);
            (device ? chosen : rows)[m->slot >= 0] += (size_t)(s.r1 - s.r0);
        }
    }
    logits.resize((rows[0] + rows[1]) * V);
    std::vector<dllm__choice> choices(chosen[0] + chosen[1]);
    DLLM__TRY(dllm__batch_forward(ctx, plan[0], 0, logits.data(), choices.data()));
    DLLM__TRY(dllm__batch_forward(ctx, plan[1], 1, logits.data() + rows[0] * V, choices.data() + chosen[0]));
    float *next[2] = {logits.data(), logits.data() + rows[0] * V};
    const dllm__choice *next_choice[2] = {choices.data(), choices.data() + chosen[0]};
    std::vector<dllm__batch_member *> still;
    for (dllm__batch_member *m : active) {
        dllm__decode &st = m->g->st;
        const dllm__step_work &w = m->work;
        if (dllm__batch_device_choice(ctx, st)) {  // the backend's choice of rows [r0, r1): the candidates' are the host's ch
            const dllm__choice *&row = next_choice[m->slot >= 0];
            std::vector<dllm__choice> ch;
            for (int32_t p : w.cand) ch.push_back(row[p - w.r0]);
            row += w.r1 - w.r0;
            st.forwards++;
            dllm__step_commit(st, w, ch, m->committed);
        } else {
            const size_t n = (size_t)(w.r1 - w.r0) * V;
            float *&cond = next[m->slot >= 0];
            float *uncond = st.cfg_scale > 0 ? cond + n : nullptr;
            dllm__step_end(st, w, cond, uncond, V, m->committed);
            cond += uncond ? 2 * n : n;
        }
        dllm_status s = m->g->end_step(m->committed);
        if (s != DLLM_OK || m->g->done) dllm__batch_retire(*m, s);
        else still.push_back(m);
    }
    active.swap(still);
    return DLLM_OK;
}

/* Decodes members together until every one is done; stats->steps and ->forwards count batched steps. */
static dllm_status dllm__batch_decode(dllm_ctx &ctx, std::vector<dllm__batch_member> &members, dllm_gen_stats &stats) {
    std::vector<dllm__batch_member *> active;
    for (dllm__batch_member &m : members) {
        dllm_status s = m.g->start();
        if (s == DLLM_OK) active.push_back(&m);
        else dllm__batch_retire(m, s);
    }
    std::vector<float> logits;
    while (!active.empty()) {
        dllm_status s = dllm__batch_step(ctx, active, logits);
        if (s != DLLM_OK) {
            for (dllm__batch_member *m : active) dllm__batch_retire(*m, s);
            return s;
        }
        stats.steps++, stats.forwards++;
    }
    return DLLM_OK;
}

/* Checks an item as dllm_generate would and prepares its generation; false (with its status set) if it is bad. */
static bool dllm__batch_admit(dllm_ctx &ctx, const dllm_batch_item &it, dllm_batch_result &r, dllm__batch_member &m) {
    m.item = &it, m.result = &r, m.t0 = dllm__now_ms();
    dllm_status s = dllm__plan_generation(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, m.plan);
    if (s != DLLM_OK) {
        if (s == DLLM_ERR_BUFFER_TOO_SMALL) r.n_out = it.params.gen_length;  // the size needed, as dllm_generate reports it
        dllm__batch_set_status(r, s);
        return false;
    }
    m.g.reset(new dllm__generation{ctx, it.params, m.plan, dllm__decode(), {}, 0});
    dllm__init_decode(it.prompt, it.n_prompt, it.params, m.plan, m.g->st);
    m.g->st.host_steps = true;
    return true;
}

/* [batch] [dual cache] [prefix cache] The K/V cache slots of the items that join the batch with a K/V cache: slot_of[i]
 * is item i's (CFG's unconditional canvas: the next one), -1 for the others; slot_rows[s] its canvas's rows (prompt
 * + gen_length, which DPad's views never exceed). An item whose lengths are invalid gets none: its admission fails. */
static int dllm__batch_kv_plan(const dllm_ctx &ctx, const dllm_batch_item *items, int n_items, const std::vector<bool> &batched,
                               std::vector<int> &slot_of, std::vector<int> &slot_rows) {
    slot_of.assign((size_t)n_items, -1), slot_rows.clear();
    for (int i = 0; i < n_items; i++) {
        const dllm_gen_params &p = items[i].params;
        const int64_t n = (int64_t)items[i].n_prompt + p.gen_length;
        if (!batched[(size_t)i] || dllm__enum_int(p.kv_cache) == DLLM_KV_CACHE_NONE || items[i].n_prompt < 0 || p.gen_length <= 0 || n > ctx.max_tokens)
            continue;
        slot_of[(size_t)i] = (int)slot_rows.size();
        slot_rows.insert(slot_rows.end(), p.cfg_scale > 0 ? 2 : 1, (int)n);
    }
    return (int)slot_rows.size();
}

/* An item decoded alone inside dllm_generate_batch (dllm_generate's result, its status and message kept with it); its
 * steps and forwards count in the batch's. */
static dllm_status dllm__batch_decode_alone(dllm_ctx &ctx, const dllm_batch_item &it, dllm_batch_result &r, dllm_gen_stats &stats) {
    dllm_status s = dllm__generate_impl(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, &r.n_out, &r.stats);
    if (s == DLLM_ERR_BUFFER_TOO_SMALL) r.n_out = it.params.gen_length;
    dllm__batch_set_status(r, s);
    if (s != DLLM_ERR_OUT_OF_MEMORY) stats.steps += r.stats.steps, stats.forwards += r.stats.forwards;
    return s;
}

// ---- Batched block diffusion (dllm_generate_batch on a block-diffusion model) ------------------------------------
// Every item is a dllm__bd_generation of its own over a committed K/V cache slot of its own (bd_batch_reserve). Each
// round asks every live generation for its next forward (dllm__bd_generation::next) and runs them all in ONE
// bd_forward_batch, whatever their blocks, kinds, row counts and steps; each result goes back to its generation. A
// generation that is done, fails or is cancelled leaves at once. Each item runs the loop dllm_generate runs, so it
// decodes exactly as alone wherever the backend's batched forward gives each sequence its bd_forward's result.

/* One block-diffusion item of a batched decode, while it runs. */
struct dllm__bd_member {
    const dllm_batch_item *item = nullptr;
    dllm_batch_result *result = nullptr;
    dllm__bd_plan plan;
    std::unique_ptr<dllm__bd_generation> g;
    dllm__bd_seq seq;  // this round's forward; seq.slot: its K/V cache slot
    double t0 = 0;
};

/* An item's end: its output, stats and status; the batch's steps are the most any item ran. */
static void dllm__bd_batch_retire(dllm__bd_member &m, dllm_status s, dllm_gen_stats &stats) {
    dllm__bd_result(*m.g, s, m.item->out, &m.result->n_out, &m.result->stats, m.t0, false);
    dllm__batch_set_status(*m.result, s);
    stats.steps = std::max(stats.steps, m.g->steps);
}

/* Checks an item as dllm_generate would and starts its generation on slot `slot`; false (its status set) if it is bad. */
static bool dllm__bd_batch_admit(dllm_ctx &ctx, const dllm_batch_item &it, dllm_batch_result &r, dllm__bd_member &m, int slot) {
    m.item = &it, m.result = &r, m.t0 = dllm__now_ms();
    dllm_status s = dllm__plan_block_diffusion(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, m.plan);
    if (s != DLLM_OK) {
        if (s == DLLM_ERR_BUFFER_TOO_SMALL) r.n_out = it.params.gen_length;  // the size needed, as dllm_generate reports it
        dllm__batch_set_status(r, s);
        return false;
    }
    m.g.reset(new dllm__bd_generation{ctx, it.params, m.plan, it.n_prompt});
    m.g->start(it.prompt);
    m.seq.slot = slot;
    return true;
}

/* One round: every active member's next forward in one bd_forward_batch (its logits or, for a step, its choices), then
 * each member's result. A member with no forward left, or whose loop or step callback fails, leaves; a failing batched
 * forward is every member's failure. */
static dllm_status dllm__bd_batch_round(dllm_ctx &ctx, std::vector<dllm__bd_member *> &active, std::vector<float> &logits,
                                        std::vector<dllm__choice> &choices, dllm_gen_stats &stats) {
    std::vector<dllm__bd_member *> live;
    std::vector<dllm__bd_seq> seqs;
    size_t rows = 0, picked = 0;
    for (dllm__bd_member *m : active) {
        dllm_status s = m->g->next(m->seq);
        if (s != DLLM_OK || m->g->done()) {
            dllm__bd_batch_retire(*m, s, stats);
            continue;
        }
        live.push_back(m);
        seqs.push_back(m->seq);
        if (m->seq.pick) picked += (size_t)m->seq.pick->n;
        else rows += (size_t)(m->seq.call.r1 - m->seq.call.r0);
    }
    active.clear();
    if (live.empty()) return DLLM_OK;
    logits.resize(rows * ctx.model->cfg.n_vocab);
    choices.assign(picked, dllm__choice{0, -INFINITY, false});
    stats.forwards++;
    dllm_status s = ctx.impl->bd_forward_batch(seqs, logits.data(), choices.data());
    if (s != DLLM_OK) {
        for (dllm__bd_member *m : live) dllm__bd_batch_retire(*m, s, stats);
        return s;
    }
    const float *row = logits.data();
    const dllm__choice *ch = choices.data();
    for (dllm__bd_member *m : live) {
        const dllm__bd_seq &q = m->seq;
        s = q.pick ? m->g->apply_choices(ch) : m->g->apply_logits(row);
        if (q.pick) ch += q.pick->n;
        else row += (size_t)(q.call.r1 - q.call.r0) * ctx.model->cfg.n_vocab;
        if (s != DLLM_OK) dllm__bd_batch_retire(*m, s, stats);
        else active.push_back(m);
    }
    return DLLM_OK;
}

/* dllm_generate_batch on a block-diffusion model: the items decode together where the backend has bd_forward_batch and
 * the slots fit, else one after another through dllm_generate's path (an INFO log names the backend's reason).
 * stats->forwards counts the batched forwards (the most any item ran), stats->steps the most steps any item ran. */
static dllm_status dllm__bd_generate_batch_impl(dllm_ctx &ctx, const dllm_batch_item *items, int n_items, dllm_batch_result *results,
                                                dllm_gen_stats &stats) {
    std::string why;
    if (ctx.impl->bd_forward_batch({}, nullptr, nullptr) != DLLM_OK) why = dllm__tls_error;
    std::vector<dllm__bd_member> members;
    members.reserve((size_t)n_items);  // a generation holds its member's plan: no reallocation
    std::vector<int> rows;
    for (int i = 0; why.empty() && i < n_items; i++) {
        members.emplace_back();
        if (dllm__bd_batch_admit(ctx, items[i], results[i], members.back(), (int)rows.size())) rows.push_back(members.back().g->cache_rows());
        else members.pop_back();
    }
    if (!rows.empty() && ctx.impl->bd_batch_reserve(rows) != DLLM_OK) why = dllm__tls_error, members.clear();  // (memory)
    if (!why.empty()) {
        if (n_items > 0)
            dllm__log(DLLM_LOG_INFO, "dllm_generate_batch: %d block-diffusion items decode one after another, outside a batched forward (%s)", n_items,
                      why.c_str());
        for (int i = 0; i < n_items; i++)
            if (dllm__batch_decode_alone(ctx, items[i], results[i], stats) == DLLM_ERR_OUT_OF_MEMORY) return DLLM_ERR_OUT_OF_MEMORY;
        return DLLM_OK;
    }
    std::vector<dllm__bd_member *> active;
    for (dllm__bd_member &m : members) active.push_back(&m);
    std::vector<float> logits;
    std::vector<dllm__choice> choices;
    dllm_status s = DLLM_OK;
    while (s == DLLM_OK && !active.empty()) s = dllm__bd_batch_round(ctx, active, logits, choices, stats);
    if (!rows.empty()) {  // the caches go with the batch; a failure's message stays the thread's
        const std::string error = dllm__tls_error;
        ctx.impl->bd_batch_reserve({});
        dllm__tls_error = error;
    }
    return s;
}

/* dllm_generate_batch: the items a batched forward can take decode together, the others one after another. */
static dllm_status dllm__generate_batch_impl(dllm_ctx &ctx, const dllm_batch_item *items, int n_items, dllm_batch_result *results,
                                             dllm_gen_stats &stats) {
    if (dllm__is_block_diffusion(ctx.model->cfg)) return dllm__bd_generate_batch_impl(ctx, items, n_items, results, stats);
    const bool batches = ctx.impl->forward_batch({}, nullptr) == DLLM_OK;
    const std::string no_batch = batches ? std::string() : dllm__tls_error;  // the backend's reason
    std::string kv_why;  // why items with a K/V cache cannot batch (the backend's reason), empty if they can
    if (batches && ctx.impl->forward_batch_kv({}, nullptr) != DLLM_OK) kv_why = "a K/V cache: " + dllm__tls_error;
    std::vector<dllm__batch_member> members;
    members.reserve((size_t)n_items);
    std::vector<int> alone;
    const char *why = batches ? nullptr : no_batch.c_str();
    std::vector<bool> batched((size_t)n_items);
    for (int i = 0; i < n_items; i++) batched[(size_t)i] = batches && !dllm__batch_excluded(items[i].params, kv_why.empty() ? nullptr : kv_why.c_str());
    std::vector<int> slot_of, slot_rows;
    const bool kv_slots = dllm__batch_kv_plan(ctx, items, n_items, batched, slot_of, slot_rows) > 0;
    if (kv_slots && ctx.impl->batch_kv_reserve(slot_rows) != DLLM_OK) {  // (memory): those items decode one after another
        kv_why = "a K/V cache: " + dllm__tls_error;
        for (int i = 0; i < n_items; i++) batched[(size_t)i] = batched[(size_t)i] && slot_of[(size_t)i] < 0;
    }
    for (int i = 0; i < n_items; i++) {
        const char *excluded = !batches ? why : !batched[(size_t)i] ? dllm__batch_excluded(items[i].params, kv_why.c_str()) : nullptr;
        if (excluded) {
            if (alone.empty()) why = excluded;
            alone.push_back(i);
            continue;
        }
        members.emplace_back();
        members.back().slot = slot_of[(size_t)i];
        if (!dllm__batch_admit(ctx, items[i], results[i], members.back())) members.pop_back();
    }
    if (!alone.empty())
        dllm__log(DLLM_LOG_INFO, "dllm_generate_batch: %zu of %d items decode one after another, outside the batched forward (item %d: %s)",
                  alone.size(), n_items, alone[0], why);
    const dllm_status decoded = dllm__batch_decode(ctx, members, stats);
    if (kv_slots) {  // the caches go with the batch; a failure's message stays the thread's
        const std::string error = dllm__tls_error;
        ctx.impl->batch_kv_reserve({});
        dllm__tls_error = error;
    }
    DLLM__TRY(decoded);
    for (int i : alone)
        if (dllm__batch_decode_alone(ctx, items[i], results[i], stats) == DLLM_ERR_OUT_OF_MEMORY) return DLLM_ERR_OUT_OF_MEMORY;  // global: the items after it would fail the same way
    return DLLM_OK;
}

/* Is a CUDA device usable? Never fails hard: a machine without a driver just answers no. */
static bool dllm__gpu_usable(int device, std::string &why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) {
        why = e == cudaErrorNoDevice ? std::string("no NVIDIA GPU found")
                                     : dllm__format("no NVIDIA driver found, or one older than CUDA %d.%d needs", CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
        cudaGetLastError();
        return false;
    }
    if (e != cudaSuccess) {
        why = dllm__format("no usable CUDA driver/device (%s)", cudaGetErrorString(e));
        cudaGetLastError();
        return false;
    }
    if (device < 0 || device >= n) {
        why = dllm__format("CUDA device %d requested but %d device(s) present", device, n);
        return false;
    }
    // A GPU without the libraries is no GPU for dllm: AUTO then runs the CPU backend, GPU says why.
    if (dllm__load_nvrtc() != DLLM_OK || dllm__load_cublaslt() != DLLM_OK) {
        why = dllm__tls_error;
        return false;
    }
    return true;
}

/* A context over n_devices > 1 (validated by dllm__tp_check_params): the GPU backend over every listed device, which
 * is not built yet. Says why not for each way there: the CPU backend, a device that is not usable, NCCL missing, then
 * the path itself. */
static dllm_status dllm__tp_create_backend(const dllm_ctx &ctx) {
    const dllm_ctx_params &p = ctx.params;
    if (p.backend == DLLM_BACKEND_CPU)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "n_devices %d: tensor parallelism runs on the GPU backend only; the CPU backend takes n_devices 0 or 1",
                          p.n_devices);
    for (int i = 0; i < p.n_devices; i++) {
        std::string why;
        if (!dllm__gpu_usable(p.devices[i], why))
            return dllm__fail(DLLM_ERR_NO_DEVICE, "n_devices %d asks for tensor parallelism over GPUs, but devices[%d] = %d is not usable: %s", p.n_devices, i,
                              p.devices[i], why.c_str());
    }
    DLLM__TRY(dllm__load_nccl());
    return dllm__fail(DLLM_ERR_UNSUPPORTED, "tensor parallelism over %d GPUs is not built yet (the sharding plan and its CPU reference exist, the "
                      "NCCL forward does not: README, tensor parallelism); use n_devices 0 or 1", p.n_devices);
}

static dllm_status dllm__create_backend(dllm_ctx &ctx) {
    if (ctx.params.n_devices > 1) return dllm__tp_create_backend(ctx);
    int threads = ctx.params.n_threads ? ctx.params.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    dllm__soloq_options soloq;
    DLLM__TRY(dllm__soloq_options_for(ctx.params.precision, ctx.params.quantize_lm_head, soloq));
    if (soloq.enabled) DLLM__TRY(dllm__soloq_check_dims(ctx.model->cfg, soloq));
    std::string why;
    bool gpu = dllm__gpu_usable(ctx.params.device, why);
    if (ctx.params.backend == DLLM_BACKEND_GPU && !gpu) return dllm__fail(DLLM_ERR_NO_DEVICE, "GPU backend requested: %s", why.c_str());
    if (gpu && ctx.params.backend != DLLM_BACKEND_CPU) {
        ctx.backend = DLLM_BACKEND_GPU;
        return dllm__gpu_backend::create(*ctx.model, ctx.params, ctx.max_tokens, ctx.impl);
    }
    if (ctx.model->random_weights)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "a model with random weights lives on the GPU only; the CPU backend needs a checkpoint (%s)",
                          gpu ? "CPU backend requested" : why.c_str());
    DLLM__TRY(dllm__check_finite_weights(*ctx.model, threads));
    ctx.backend = DLLM_BACKEND_CPU;
    ctx.impl.reset(new dllm__cpu_backend(*ctx.model, threads, ctx.max_tokens, ctx.params.precision, soloq, ctx.params.kv_quant, ctx.params.kv_sink_tokens));
    dllm__log(DLLM_LOG_INFO, "CPU reference backend, %d thread(s)", threads);
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 18. Public API
//     Every entry point converts C++ exceptions (allocation failure) into a status and records the
//     error detail for dllm_last_error() and, where there is a context, dllm_ctx_last_error().
// ---------------------------------------------------------------------------------------------------

template <class F>
static dllm_status dllm__guard(dllm_ctx *ctx, F &&body) {
    dllm_status st;
    try {
        st = body();
    } catch (const std::bad_alloc &) {
        st = dllm__fail(DLLM_ERR_OUT_OF_MEMORY, "out of host memory");
    } catch (const std::exception &e) {
        st = dllm__fail(DLLM_ERR_INTERNAL, "unexpected exception: %s", e.what());
    } catch (...) {
        st = dllm__fail(DLLM_ERR_INTERNAL, "unexpected exception");
    }
    if (st != DLLM_OK && ctx) ctx->last_error = dllm__tls_error;
    return st;
}

}  // namespace
#pragma GCC visibility pop

extern "C" {

const char *dllm_status_str(dllm_status s) {
    switch (dllm__enum_int(s)) {
        case DLLM_OK: return "DLLM_OK";
        case DLLM_ERR_INVALID_ARGUMENT: return "DLLM_ERR_INVALID_ARGUMENT";
        case DLLM_ERR_IO: return "DLLM_ERR_IO";
        case DLLM_ERR_FORMAT: return "DLLM_ERR_FORMAT";
        case DLLM_ERR_SHAPE: return "DLLM_ERR_SHAPE";
        case DLLM_ERR_UNSUPPORTED: return "DLLM_ERR_UNSUPPORTED";
        case DLLM_ERR_OUT_OF_MEMORY: return "DLLM_ERR_OUT_OF_MEMORY";
        case DLLM_ERR_NO_DEVICE: return "DLLM_ERR_NO_DEVICE";
        case DLLM_ERR_CUDA: return "DLLM_ERR_CUDA";
        case DLLM_ERR_JIT: return "DLLM_ERR_JIT";
        case DLLM_ERR_CANCELLED: return "DLLM_ERR_CANCELLED";
        case DLLM_ERR_BUFFER_TOO_SMALL: return "DLLM_ERR_BUFFER_TOO_SMALL";
        case DLLM_ERR_INTERNAL: return "DLLM_ERR_INTERNAL";
    }
    return "DLLM_ERR_UNKNOWN";
}

const char *dllm_last_error(void) { return dllm__tls_error.c_str(); }

double dllm_rng_uniform(uint64_t seed, uint32_t index, uint32_t position, uint32_t step, uint32_t stream) {
    return dllm__uniform(seed, index, position, step, stream);
}

void dllm_log_set(dllm_log_fn fn, void *user_data, dllm_log_level max_level) {
    dllm__log_fn = fn ? fn : dllm__default_log;
    dllm__log_data = fn ? user_data : nullptr;
    dllm__log_max = fn ? max_level : DLLM_LOG_WARN;
}

dllm_model_params dllm_model_default_params(void) {
    dllm_model_params p;
    p.use_mmap = 1;
    return p;
}

dllm_status dllm_model_load(const char *dir, dllm_model_params params, dllm_model **out_model) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!out_model) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_load: out_model is NULL");
        *out_model = nullptr;
        if (!dir) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_load: dir is NULL");
        std::unique_ptr<dllm_model> m;
        DLLM__TRY(dllm__load_model(dir, params, m));
        dllm__log(DLLM_LOG_INFO, "loaded %s: %s, %d layers, d=%d, %lld parameters", dir,
                  dllm__family_name(m->cfg.family), m->cfg.n_layer, m->cfg.n_embd, (long long)m->n_params);
        *out_model = m.release();
        return DLLM_OK;
    });
}

dllm_status dllm_model_load_random(const char *config_path, uint64_t seed, dllm_model **out_model) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!out_model) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_load_random: out_model is NULL");
        *out_model = nullptr;
        if (!config_path) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_load_random: config_path is NULL");
        std::unique_ptr<dllm_model> m(new dllm_model);
        std::string path = config_path;
        if (!dllm__file_exists(path)) path = dllm__join_path(path, "config.json");
        dllm__json cfg;
        DLLM__TRY(dllm__json_load(path, cfg));
        DLLM__TRY(dllm__config_parse(cfg, path, m->cfg));
        DLLM__TRY(dllm__find_block_tokens(path.substr(0, path.find_last_of('/') + 1) + ".", m->cfg));
        for (const dllm__wspec &s : dllm__expected_weights(m->cfg)) {
            int64_t n = 1;
            for (int64_t d : s.shape) n *= d;
            m->n_params += n;
        }
        m->random_weights = true;
        m->random_seed = seed;
        *out_model = m.release();
        return DLLM_OK;
    });
}

void dllm_model_free(dllm_model *model) { delete model; }

dllm_status dllm_model_get_info(const dllm_model *m, dllm_model_info *out) {
    if (!m || !out) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_get_info: NULL argument");
    const dllm__config &c = m->cfg;
    out->family = c.family;
    out->n_vocab = c.n_vocab;
    out->n_embd = c.n_embd;
    out->n_layer = c.n_layer;
    out->n_head = c.n_head;
    out->n_head_kv = c.n_head_kv;
    out->head_dim = c.head_dim;
    out->n_ff = c.n_ff;
    out->max_seq_len = c.max_seq_len;
    out->shift_logits = c.shift_logits;
    out->mask_id = c.mask_id;
    out->eos_id = c.eos_id;
    out->eot_id = c.eot_id;
    out->bos_id = c.bos_id;
    out->n_params = m->n_params;
    out->block_size = dllm__is_block_diffusion(c) ? c.bd_size : 0;
    out->stop_id = dllm__is_block_diffusion(c) ? c.stop_id : -1;
    out->precision = m->soloq ? m->soloq->precision : DLLM_PRECISION_BF16;
    out->quantized_lm_head = m->soloq && m->soloq->head ? 1 : 0;
    return DLLM_OK;
}

dllm_ctx_params dllm_ctx_default_params(void) {
    dllm_ctx_params p;
    p.backend = DLLM_BACKEND_AUTO;
    p.device = 0;
    p.max_tokens = 0;
    p.n_threads = 0;
    p.precision = DLLM_PRECISION_AUTO;
    p.quantize_lm_head = 0;
    p.kv_quant = DLLM_KV_QUANT_NONE;
    p.kv_sink_tokens = -1;
    p.n_devices = 0;
    for (int i = 0; i < DLLM_MAX_DEVICES; i++) p.devices[i] = i;
    return p;
}

dllm_status dllm_kv_bytes_per_token(const dllm_model *model, dllm_kv_quant kv_quant, int block_length, double *bytes) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!model || !bytes) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_kv_bytes_per_token: model and bytes must not be NULL");
        const int mode = dllm__enum_int(kv_quant), group = block_length ? block_length : model->cfg.bd_size;
        DLLM__TRY(dllm__kvq_check(model->cfg, mode, -1, model->cfg.max_seq_len));
        if (mode != DLLM_KV_QUANT_NONE && (block_length < 0 || group <= 0))
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_kv_bytes_per_token: block_length %d must be positive (0 = the model's)", block_length);
        *bytes = dllm__kvq_bytes_per_token(model->cfg, mode, group);
        return DLLM_OK;
    });
}

dllm_status dllm_ctx_create(dllm_model *model, dllm_ctx_params params, dllm_ctx **out_ctx) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!out_ctx) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: out_ctx is NULL");
        *out_ctx = nullptr;
        if (!model) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: model is NULL");
        int backend = dllm__enum_int(params.backend);
        if (backend < DLLM_BACKEND_AUTO || backend > DLLM_BACKEND_GPU)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: unknown backend %d", backend);
        if (params.max_tokens < 0 || params.max_tokens > model->cfg.max_seq_len)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: max_tokens %d must be in [0, %d] (0 = the model's limit)", params.max_tokens, model->cfg.max_seq_len);
        if (params.n_threads < 0 || params.n_threads > 1024)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: n_threads %d must be in [0, 1024]", params.n_threads);
        int precision = dllm__enum_int(params.precision);
        if (precision < DLLM_PRECISION_AUTO || precision > DLLM_PRECISION_RTN_W4A16)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: precision %d must be a dllm_precision, DLLM_PRECISION_AUTO (-1) to _RTN_W4A16 (10)", precision);
        DLLM__TRY(dllm__resolve_precision(*model, precision, precision));  // AUTO never reaches a backend
        params.precision = (dllm_precision)precision;
        if (params.quantize_lm_head != 0 && params.quantize_lm_head != 1)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_ctx_create: quantize_lm_head %d must be 0 or 1", params.quantize_lm_head);
        DLLM__TRY(dllm__kvq_check(model->cfg, dllm__enum_int(params.kv_quant), params.kv_sink_tokens,
                                  params.max_tokens ? params.max_tokens : model->cfg.max_seq_len));
        DLLM__TRY(dllm__tp_check_params(model->cfg, params));
        if (params.n_devices == 1) params.device = params.devices[0];
        std::unique_ptr<dllm_ctx> ctx(new dllm_ctx);
        ctx->model = model;
        ctx->params = params;
        ctx->max_tokens = params.max_tokens ? params.max_tokens : model->cfg.max_seq_len;
        DLLM__TRY(dllm__create_backend(*ctx));
        *out_ctx = ctx.release();
        return DLLM_OK;
    });
}

dllm_quantize_params dllm_quantize_default_params(void) {
    dllm_quantize_params p;
    memset(&p, 0, sizeof p);
    p.precision = DLLM_PRECISION_SOLOQ_N;
    p.max_shard_bytes = (size_t)4 << 30;
    return p;
}

dllm_status dllm_model_quantize(const dllm_model *model, const char *out_dir, const dllm_quantize_params *params) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!model || !out_dir || !*out_dir) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_quantize: model and out_dir must not be NULL or empty");
        const dllm_quantize_params p = params ? *params : dllm_quantize_default_params();
        const int precision = dllm__enum_int(p.precision);
        if (!dllm__precision_is_soloq(precision))
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_quantize: precision %s is not one dllm-quantize writes: use soloq-n, soloq-i, soloq-c or "
                              "rtn-w4a4 (or a -w4a16 form)", dllm__precision_name(precision));
        if (p.quantize_lm_head != 0 && p.quantize_lm_head != 1)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_quantize: quantize_lm_head %d must be 0 or 1", p.quantize_lm_head);
        if (p.n_threads < 0 || p.n_threads > 1024) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_quantize: n_threads %d must be in [0, 1024]", p.n_threads);
        if (p.max_shard_bytes == 0) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_quantize: max_shard_bytes must be positive (default 4 GiB)");
        if (model->random_weights)
            return dllm__fail(DLLM_ERR_UNSUPPORTED, "dllm_model_quantize: a model with random weights has no checkpoint to quantise; load one with dllm_model_load");
        if (model->soloq)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_model_quantize: %s is already quantised (%s); quantise the unquantised model", model->dir.c_str(),
                              dllm__precision_name(model->soloq->precision));
        dllm__soloq_options o;
        DLLM__TRY(dllm__soloq_options_for(precision, p.quantize_lm_head, o));
        DLLM__TRY(dllm__soloq_check_dims(model->cfg, o));
        return dllm__soloq_write(*model, out_dir, precision, o, p);
    });
}

void dllm_ctx_free(dllm_ctx *ctx) { delete ctx; }

const char *dllm_ctx_last_error(const dllm_ctx *ctx) { return ctx ? ctx->last_error.c_str() : ""; }

dllm_backend dllm_ctx_get_backend(const dllm_ctx *ctx) { return ctx ? ctx->backend : DLLM_BACKEND_AUTO; }

dllm_status dllm_logits(dllm_ctx *ctx, const int32_t *ids, int n_ids, int row_begin, int row_end, float *out, size_t out_count) {
    return dllm__guard(ctx, [&]() -> dllm_status {
        if (!ctx || !ids || !out) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_logits: NULL argument");
        const dllm__config &c = ctx->model->cfg;
        if (n_ids <= 0 || n_ids > ctx->max_tokens)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_logits: n_ids %d must be in [1, %d]", n_ids, ctx->max_tokens);
        if (row_begin < 0 || row_end <= row_begin || row_end > n_ids)
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_logits: rows [%d, %d) must be a non-empty range inside [0, %d)", row_begin, row_end, n_ids);
        if (out_count < (size_t)(row_end - row_begin) * c.n_vocab)
            return dllm__fail(DLLM_ERR_BUFFER_TOO_SMALL, "dllm_logits: out holds %zu floats, %zu needed", out_count, (size_t)(row_end - row_begin) * c.n_vocab);
        for (int i = 0; i < n_ids; i++)
            if (ids[i] < 0 || ids[i] >= c.n_vocab)
                return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_logits: ids[%d] = %d is outside the vocabulary [0, %d)", i, ids[i], c.n_vocab);
        return ctx->impl->logits(ids, n_ids, row_begin, row_end, out);
    });
}

dllm_gen_params dllm_gen_default_params(void) {
    dllm_gen_params p;
    memset(&p, 0, sizeof p);
    p.gen_length = 128;
    p.steps = 128;
    p.block_length = 32;
    p.temperature = 0.0f;
    p.cfg_scale = 0.0f;
    p.remasking = DLLM_REMASK_LOW_CONFIDENCE;
    p.seed = 0;
    p.stop_at_eos = 1;
    p.lacache = DLLM_LACACHE_ON;
    p.mask_id = -1;
    p.eos_id = -1;
    p.eot_id = -1;
    p.unmask = DLLM_UNMASK_SCHEDULE;
    p.threshold = 0.9;
    p.factor = 1.0;
    p.eps = 1e-3;
    p.alg_temp = 0.0;
    p.kv_cache = DLLM_KV_CACHE_NONE;
    p.dpad = DLLM_DPAD_OFF;
    p.dpad_window = 256;
    p.dpad_k = 4.0f;
    p.dpad_scale = 2.0f;
    p.dpad_n = 64;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.sub_block_length = 0;
    p.block_cache = 0;
    p.stop_id = -1;
    return p;
}

dllm_status dllm_generate(dllm_ctx *ctx, const int32_t *prompt, int n_prompt, dllm_gen_params params, int32_t *out, int out_capacity,
                          int *n_out, dllm_gen_stats *stats) {
    if (n_out) *n_out = 0;
    return dllm__guard(ctx, [&]() -> dllm_status {
        if (!ctx) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_generate: ctx is NULL");
        dllm_status s = dllm__generate_impl(*ctx, prompt, n_prompt, params, out, out_capacity, n_out, stats);
        if (s == DLLM_ERR_BUFFER_TOO_SMALL && n_out) *n_out = params.gen_length;  // the size needed, as dllm_tokenize reports it
        return s;
    });
}

dllm_status dllm_generate_batch(dllm_ctx *ctx, const dllm_batch_item *items, int n_items, dllm_batch_result *results, dllm_gen_stats *batch_stats) {
    const dllm_status pending = (dllm_status)1;  // not a status: an item the call has not finished
    if (batch_stats) memset(batch_stats, 0, sizeof *batch_stats);
    if (results && n_items > 0)
        for (int i = 0; i < n_items; i++) memset(&results[i], 0, sizeof results[i]), results[i].status = pending;
    const double t0 = dllm__now_ms();
    dllm_gen_stats stats;
    memset(&stats, 0, sizeof stats);
    dllm_status global = dllm__guard(ctx, [&]() -> dllm_status {
        if (!ctx) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_generate_batch: ctx is NULL");
        if (n_items < 0 || (n_items > 0 && (!items || !results)))
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_generate_batch: n_items %d must be >= 0, with items and results non-NULL when > 0", n_items);
        return dllm__generate_batch_impl(*ctx, items, n_items, results, stats);
    });
    dllm_status first = global;  // a global failure is every unfinished item's; else the first failing item's status
    std::string message = dllm__tls_error;
    for (int i = 0; results && i < n_items; i++) {
        if (results[i].status == pending) dllm__batch_set_status(results[i], global != DLLM_OK ? global : DLLM_ERR_INTERNAL);
        if (first == DLLM_OK && results[i].status != DLLM_OK) first = results[i].status, message = results[i].error;
        stats.n_prompt += results[i].stats.n_prompt, stats.n_generated += results[i].stats.n_generated;
    }
    stats.wall_ms = dllm__now_ms() - t0;
    if (batch_stats) *batch_stats = stats;
    if (first != DLLM_OK) {
        dllm__tls_error = message;
        if (ctx) ctx->last_error = message;
    }
    return first;
}

const char *dllm_version(void) { return DLLM__XSTR(DLLM_VERSION_MAJOR) "." DLLM__XSTR(DLLM_VERSION_MINOR) "." DLLM__XSTR(DLLM_VERSION_PATCH); }

dllm_status dllm_tokenizer_load(const char *dir, dllm_tokenizer **out_tok) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (!out_tok) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_tokenizer_load: out_tok is NULL");
        *out_tok = nullptr;
        if (!dir) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_tokenizer_load: dir is NULL");
        std::unique_ptr<dllm_tokenizer> t;
        DLLM__TRY(dllm__tok_load(dir, t));
        dllm__log(DLLM_LOG_INFO, "tokenizer %s: %d ids, %zu merges, %zu added tokens", dir, t->n_vocab, t->merges.size(), t->added.size());
        *out_tok = t.release();
        return DLLM_OK;
    });
}

void dllm_tokenizer_free(dllm_tokenizer *tok) { delete tok; }

int dllm_tokenizer_n_vocab(const dllm_tokenizer *tok) { return tok ? tok->n_vocab : 0; }

int32_t dllm_tokenizer_token_id(const dllm_tokenizer *tok, const char *token) {
    if (!tok || !token) return -1;
    auto added = tok->added_ids.find(token);
    if (added != tok->added_ids.end()) return added->second;
    auto it = tok->vocab.find(token);
    return it == tok->vocab.end() ? -1 : it->second;
}

dllm_status dllm_tokenizer_check_model(const dllm_tokenizer *tok, const dllm_model *model) {
    if (!tok || !model) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_tokenizer_check_model: NULL argument");
    if (tok->n_vocab > model->cfg.n_vocab)
        return dllm__fail(DLLM_ERR_SHAPE, "the tokenizer in %s produces ids up to %d but the model in %s has %d embedding rows: they do not belong together",
                          tok->dir.c_str(), tok->n_vocab - 1, model->dir.c_str(), model->cfg.n_vocab);
    return DLLM_OK;
}

dllm_status dllm_tokenize(const dllm_tokenizer *tok, const char *text, size_t text_len, int parse_special, int32_t *ids, int capacity, int *n_ids) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (n_ids) *n_ids = 0;
        if (!tok || !n_ids || (!text && text_len)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_tokenize: NULL argument");
        if (capacity < 0 || (!ids && capacity)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_tokenize: capacity %d with %s ids", capacity, ids ? "non-NULL" : "NULL");
        std::vector<int32_t> out;
        dllm__tokenize(*tok, text, text_len, parse_special != 0, out);
        if (out.size() > (size_t)INT32_MAX) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_tokenize: the text makes more than 2^31 tokens");
        *n_ids = (int)out.size();
        if (out.size() > (size_t)capacity)
            return dllm__fail(DLLM_ERR_BUFFER_TOO_SMALL, "dllm_tokenize: the text makes %zu tokens, the buffer holds %d", out.size(), capacity);
        if (!out.empty()) memcpy(ids, out.data(), out.size() * sizeof(int32_t));
        return DLLM_OK;
    });
}

dllm_status dllm_detokenize(const dllm_tokenizer *tok, const int32_t *ids, int n_ids, int skip_special, char *text, size_t capacity, size_t *text_len) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (text_len) *text_len = 0;
        if (!tok || (!ids && n_ids) || n_ids < 0) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_detokenize: NULL argument or negative n_ids");
        std::string out;
        DLLM__TRY(dllm__detokenize(*tok, ids, n_ids, skip_special != 0, out));
        return dllm__copy_out("dllm_detokenize", out, text, capacity, text_len);
    });
}

dllm_chat_template dllm_tokenizer_chat_template(const dllm_tokenizer *tok) { return tok ? tok->chat : DLLM_CHAT_NONE; }

dllm_status dllm_chat_render(const dllm_tokenizer *tok, const dllm_chat_message *msgs, int n_msgs, int add_assistant, char *text, size_t capacity,
                             size_t *text_len) {
    return dllm__guard(nullptr, [&]() -> dllm_status {
        if (text_len) *text_len = 0;
        if (!tok) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_chat_render: tok is NULL");
        std::string out;
        DLLM__TRY(dllm__chat_render(*tok, msgs, n_msgs, add_assistant != 0, out));
        return dllm__copy_out("dllm_chat_render", out, text, capacity, text_len);
    });
}

}  // extern "C"
