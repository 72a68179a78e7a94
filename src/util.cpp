/* src/util.cpp - errors, logging, numbers, files and the environment switches. */

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

#define DLLM__TRY(expr)                                                                                                \
    do {                                                                                                               \
        dllm_status dllm__st_ = (expr);                                                                                \
        if (dllm__st_ != DLLM_OK) return dllm__st_;                                                                    \
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
template <class E> static int dllm__enum_int(const E &e) {
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
            do {
                man <<= 1;
                e++;
            } while (!(man & 1024));
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
                return dllm__fail(DLLM_ERR_IO, "cannot read %s: %s", path.c_str(),
                                  r < 0 ? strerror(errno) : "short read");
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
 *   DLLM_BD_GRAPHS=0         block diffusion's step forwards launched eagerly, not replayed as CUDA graphs ([bd graphs])
 *   DLLM_BD_BATCH=0          no batched block-diffusion forward (bd_forward_batch: dllm_generate_batch's block-diffusion
 *                            items in one forward): those items decode one after another
 *   DLLM_BATCH_FP8=0         no batched forwards (forward_batch, forward_batch_kv, bd_forward_batch) under FP8 precisions
 *                            (their E4M3 GEMMs in row-independent launches, gemm_fp8_batch): FP8 items decode one after
 *                            another
 *   DLLM_BATCH_GRAPHS=0      the batched forwards' layers launched eagerly, not replayed as CUDA graphs ([batch graphs],
 *                            one per batch layout)
 *   DLLM_BATCH_GEMM_N=256|128|64  the batched forwards' BF16 GEMMs (DLLM__ROWS_BATCH) on gemm_wg's tiles of that width
 *                            only; by default each shape and row count takes the fastest of the three
 *                            (dllm__batch_gemm_width)
 *   DLLM_KVQ_TC=0            [KV quant] block diffusion's attention over the quantised cache on kvq_attention (a warp per
 *                            query row and head) instead of the tensor cores' kvq_flash (the codes decoded once per kv
 *                            head, mma.sync, split over the keys: ~300x faster at 32k keys on the H200) */
struct dllm__env_switches {
    std::string cache_dir, jit_dump, fp8_gemm, soloq_rotation, soloq_bias_correction;
    bool jit_verbose = false, jit_fail_on_spill = false;
    int fa_br = 0, fa_bc = 0, fa_mt = 0, fa_stages = 0, fa_kv_ctas = 0, fa_wg_bc = -1,
        fa_wg_stages = 0;  // 0 (-1): the table's
    bool gemm_wg = true, gemm_autotune = true, gemm_verbose = false, gemm_rows_independent = false, pdl = true,
         no_graphs = false;
    int soloq_split = -1;  // -1: dllm__soloq_launch's default
    bool bd_graphs = false, bd_batch = false, batch_fp8 = false, batch_graphs = false, kvq_tc = false;
    int batch_gemm_n = 0;  // gemm_wg's tile width in the batched forwards: 256, 128 or 64; 0 the fastest of the three
};

static dllm__env_switches dllm__env_read() {
    auto str = [](const char *name) {
        const char *v = getenv(name);
        return std::string(v ? v : "");
    };
    auto num = [](const char *name, int dflt) {
        const char *v = getenv(name);
        return v && *v ? atoi(v) : dflt;
    };
    dllm__env_switches e;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    e.cache_dir = str("DLLM_CACHE_DIR");
    if (e.cache_dir == "off")
        e.cache_dir.clear();
    else if (e.cache_dir.empty())
        e.cache_dir = xdg && *xdg     ? std::string(xdg) + "/dllm"
                      : home && *home ? std::string(home) + "/.cache/dllm"
                                      : "";
    e.jit_dump = str("DLLM_JIT_DUMP");
    e.fp8_gemm = str("DLLM_FP8_GEMM");
    e.jit_verbose = num("DLLM_JIT_VERBOSE", 0) != 0;
    e.jit_fail_on_spill = num("DLLM_JIT_FAIL_ON_SPILL", 0) != 0;
    e.fa_br = num("DLLM_FA_BR", 0), e.fa_bc = num("DLLM_FA_BC", 0), e.fa_mt = num("DLLM_FA_MT", 0),
    e.fa_stages = num("DLLM_FA_STAGES", 0);
    e.fa_kv_ctas = num("DLLM_FA_KV_CTAS", 0), e.fa_wg_bc = num("DLLM_FA_WG_BC", -1),
    e.fa_wg_stages = num("DLLM_FA_WG_STAGES", 0);
    e.gemm_wg = num("DLLM_GEMM_WG", 1) != 0;
    e.gemm_autotune = num("DLLM_GEMM_AUTOTUNE", 1) != 0;
    e.gemm_verbose = num("DLLM_GEMM_VERBOSE", 0) != 0;
    e.gemm_rows_independent = str("DLLM_GEMM_ROWS") == "independent";
    e.pdl = num("DLLM_PDL", 1) != 0;
    e.no_graphs = num("DLLM_NO_GRAPHS", 0) != 0;
    e.soloq_rotation = str("DLLM_SOLOQ_ROTATION");
    e.soloq_bias_correction = str("DLLM_SOLOQ_BIAS_CORRECTION");
    e.soloq_split = num("DLLM_SOLOQ_SPLIT", -1);
    e.bd_graphs = num("DLLM_BD_GRAPHS", 1) != 0;
    e.bd_batch = num("DLLM_BD_BATCH", 1) != 0;
    e.batch_fp8 = num("DLLM_BATCH_FP8", 1) != 0;
    e.batch_graphs = num("DLLM_BATCH_GRAPHS", 1) != 0;
    const int width = num("DLLM_BATCH_GEMM_N", 0);
    e.batch_gemm_n = width == 64 || width == 128 || width == 256 ? width : 0;
    e.kvq_tc = num("DLLM_KVQ_TC", 1) != 0;
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
