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

/* Stores a message where an exception must not escape (dllm__guard's handlers, and after its body): a message that
 * finds no memory becomes "out of memory", which fits std::string's inline buffer (15 characters in libstdc++ and MSVC,
 * 22 in libc++) and so needs none. */
static void dllm__set_error_nothrow(std::string &dst, const char *message) noexcept {
    try {
        dst = message;
    } catch (...) {
        dst = "out of memory";
    }
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

/* A caller's progress callback (dllm_ctx_params.progress): `done` of `total` steps of a long job; a no-op unset. */
struct dllm__progress {
    dllm_quantize_progress_fn fn = nullptr;
    void *user_data = nullptr;
    void report(int done, int total) const {
        if (fn) fn(done, total, user_data);
    }
};

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

/* [environment] The DLLM_* switches, read once (at first use); all optional, for operating and debugging only (what
 * changes results is a parameter of dllm.h). README.md lists them too:
 *   DLLM_CACHE_DIR=DIR       the JIT disk cache (default $XDG_CACHE_HOME/dllm or ~/.cache/dllm); "off" disables it
 *   DLLM_JIT_VERBOSE=1       print each compile, its time and registers
 *   DLLM_JIT_DUMP=DIR        write the PTX and cubin of every compiled module (cuobjdump -sass for SASS)
 *   DLLM_JIT_FAIL_ON_SPILL=1 a kernel that spills registers is a DLLM_ERR_JIT error
 *   DLLM_GEMM_VERBOSE=1      one line per tuned GEMM shape: what won, against the heuristic's first pick
 *   DLLM_DEBUG_PLAIN=1       for bisecting a wrong result or a crash: no CUDA graphs, no programmatic dependent launch,
 *                            cuBLASLt's heuristic algorithm for every BF16 GEMM (no gemm_wg, nothing timed), the
 *                            attention on mma.sync (no flash_attn_wg) and over a quantised K/V cache on kvq_attention,
 *                            SoloQ's 4-bit GEMMs on q4_gemm and the INT8 path (no q4wg)
 *   DLLM_TILES=K=V,...       tile and kernel overrides for tuning, K one of fa_br, fa_bc, fa_mt, fa_stages
 *                            (the attention tile: query rows per CTA, keys per tile, m16 tiles per warp, K/V ring),
 *                            fa_kv_ctas (split-KV CTAs per SM), fa_wg_bc
 *                            (the wgmma attention's keys per tile: 64 or 128), fa_wg_stages (its ring: 2 or 3),
 *                            batch_gemm_n (the batched forwards' gemm_wg width: 256, 128 or 64), soloq_split
 *                            (SoloQ producers over clusters: 0 never, 1 all but the norm producer, 2 all), fp8_gemm
 *                            (mma or cublaslt: the FP8 GEMM instead of the architecture table's)
 * The other members are the features' own state, on by default; the tests turn one off to compare paths. */
struct dllm__env_switches {
    std::string cache_dir, jit_dump, fp8_gemm;
    bool jit_verbose = false, jit_fail_on_spill = false, gemm_verbose = false;
    int fa_br = 0, fa_bc = 0, fa_mt = 0, fa_stages = 0, fa_kv_ctas = 0, fa_wg_bc = -1,
        fa_wg_stages = 0;  // 0 (-1): the table's
    int soloq_split = -1;  // -1: dllm__soloq_launch's default
    int batch_gemm_n = 0;  // gemm_wg's tile width in the batched forwards: 256, 128 or 64; 0 the fastest of the three
    // features (DLLM_DEBUG_PLAIN turns off the first seven)
    bool gemm_wg = true, gemm_autotune = true, pdl = true, no_graphs = false, kvq_tc = true, q4wg = true;
    bool bd_graphs = true, bd_batch = true, batch_fp8 = true, batch_graphs = true;
    std::string tiles_error;  // a DLLM_TILES entry that was not understood (dllm__env_tiles), reported once
};

/* DLLM_TILES's "key=value,..." into e; an unknown key or a bad value leaves the table's choice and is remembered. */
static void dllm__env_tiles(const char *spec, dllm__env_switches &e) {
    struct knob {
        const char *key;
        int *value;
    } knobs[] = {{"fa_br", &e.fa_br},
                 {"fa_bc", &e.fa_bc},
                 {"fa_mt", &e.fa_mt},
                 {"fa_stages", &e.fa_stages},
                 {"fa_kv_ctas", &e.fa_kv_ctas},
                 {"fa_wg_bc", &e.fa_wg_bc},
                 {"fa_wg_stages", &e.fa_wg_stages},
                 {"batch_gemm_n", &e.batch_gemm_n},
                 {"soloq_split", &e.soloq_split}};
    std::string all = spec;
    for (size_t at = 0; at <= all.size();) {
        size_t end = all.find(',', at);
        if (end == std::string::npos) end = all.size();
        const std::string item = all.substr(at, end - at), key = item.substr(0, item.find('='));
        const std::string value = item.find('=') == std::string::npos ? "" : item.substr(item.find('=') + 1);
        at = end + 1;
        if (item.empty()) continue;
        if (key == "fp8_gemm") {  // checked against the GPU by dllm__fp8_gemm_for
            e.fp8_gemm = value;
            continue;
        }
        bool known = false;
        for (const knob &k : knobs)
            if (key == k.key && !value.empty() && strspn(value.c_str(), "0123456789") == value.size()) {
                *k.value = atoi(value.c_str());
                known = true;
            }
        if (!known && e.tiles_error.empty()) e.tiles_error = item;
    }
    if (e.batch_gemm_n != 64 && e.batch_gemm_n != 128 && e.batch_gemm_n != 256) e.batch_gemm_n = 0;
}

static dllm__env_switches dllm__env_read() {
    auto str = [](const char *name) {
        const char *v = getenv(name);
        return std::string(v ? v : "");
    };
    auto on = [](const char *name) {
        const char *v = getenv(name);
        return v && *v && atoi(v) != 0;
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
    e.jit_verbose = on("DLLM_JIT_VERBOSE");
    e.jit_fail_on_spill = on("DLLM_JIT_FAIL_ON_SPILL");
    e.gemm_verbose = on("DLLM_GEMM_VERBOSE");
    dllm__env_tiles(str("DLLM_TILES").c_str(), e);
    if (on("DLLM_DEBUG_PLAIN")) {
        e.gemm_wg = e.gemm_autotune = e.pdl = e.kvq_tc = e.q4wg = false;
        e.no_graphs = true;
        e.fa_wg_bc = 0;
    }
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

/* Tests: one internal switch by its member's name ("bd_batch", "fp8_gemm", a DLLM_TILES key...) set to value ("0"/"1"
 * for the features); false for an unknown name. Not thread-safe against running contexts. */
DLLM__TEST_HOOK static bool dllm__env_set(const std::string &name, const std::string &value) {
    dllm__env_switches &e = dllm__env_storage();
    struct feature {
        const char *name;
        bool *on;
    } features[] = {{"gemm_wg", &e.gemm_wg},
                    {"gemm_autotune", &e.gemm_autotune},
                    {"pdl", &e.pdl},
                    {"no_graphs", &e.no_graphs},
                    {"kvq_tc", &e.kvq_tc},
                    {"q4wg", &e.q4wg},
                    {"bd_graphs", &e.bd_graphs},
                    {"bd_batch", &e.bd_batch},
                    {"batch_fp8", &e.batch_fp8},
                    {"batch_graphs", &e.batch_graphs}};
    for (const feature &f : features)
        if (name == f.name) return *f.on = value != "0", true;
    if (name == "fp8_gemm") return e.fp8_gemm = value, true;
    e.tiles_error.clear();
    dllm__env_tiles((name + "=" + value).c_str(), e);
    return e.tiles_error.empty();
}
