/* dllm_cuda.cu - the implementation of dllm.h: diffusion LLM inference in one translation unit.
 *
 * What it does: loads Hugging Face checkpoints of LLaDA and Dream models (config.json + safetensors,
 * single file or sharded) with strict validation, runs their bidirectional transformer forward, and
 * decodes with LLaDA's semi-autoregressive block schedule. The CPU backend is an fp32 reference written
 * for clarity; it is the twin every GPU kernel is tested against. The GPU backend JIT-compiles its
 * kernels with NVRTC for the GPU it finds, runs GEMMs through cuBLASLt and replays each denoising step
 * as a CUDA graph with the canvas, the step counter and the sampler state on the device.
 *
 * The clever part, in one place: every random draw (Gumbel noise, random remasking) comes from a
 * counter-based Philox generator keyed by (seed) and counted by (vocab index, position, step, stream),
 * so a run is reproducible on any backend, in any order of evaluation, and a PyTorch script
 * (tools/make_fixtures.py) reproduces the exact token traces.
 *
 * Table of contents (sections are in data-flow order):
 *   1. Utilities: errors, logging, numbers, files
 *   2. JSON parser
 *   3. safetensors reader
 *   4. Model config (LLaDA, Dream)
 *   5. Weights: expected tensors, binding, loading
 *   6. Philox counter-based RNG
 *   7. CPU thread pool
 *   8. CPU fp32 reference forward
 *   9. Token choice: argmax / Gumbel-max, confidence, top-k selection
 *  10. Backends (CPU reference)
 *  11. GPU: errors, device memory
 *  12. GPU kernel sources (NVRTC strings): row-wise ops, sampler, FlashAttention
 *  13. GPU: NVRTC JIT and the architecture table
 *  14. GPU: cuBLASLt GEMMs
 *  15. GPU backend: weights, forward, sampler, step graphs
 *  16. SAR decoding
 *  17. Public API
 *
 * Build: see README.md (one nvcc command). Private names are static or prefixed dllm__.
 */
#include "dllm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nvrtc.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
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
#include <utility>
#include <vector>

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

static void dllm__log(dllm_log_level level, const char *fmt, ...) {
    if (level > dllm__log_max || !dllm__log_fn) return;
    va_list ap;
    va_start(ap, fmt);
    std::string s = dllm__vformat(fmt, ap);
    va_end(ap);
    dllm__log_fn(level, s.c_str(), dllm__log_data);
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
};

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
    DLLM__TRY(r.number("rope_theta", 1.0, 1e12, c.rope_theta));
    DLLM__TRY(r.number("rms_norm_eps", 0.0, 1.0, c.norm_eps));
    DLLM__TRY(r.token("mask_token_id", c.mask_id));
    DLLM__TRY(r.token("eos_token_id", c.eos_id));
    DLLM__TRY(r.token("pad_token_id", c.pad_id));
    DLLM__TRY(r.token("bos_token_id", c.bos_id));
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
    DLLM__TRY(r.number("rope_theta", 1.0, 1e12, c.rope_theta));
    DLLM__TRY(r.number("rms_norm_eps", 0.0, 1.0, c.norm_eps));
    DLLM__TRY(r.token("mask_token_id", c.mask_id));
    DLLM__TRY(r.token("eos_token_id", c.eos_id));
    DLLM__TRY(r.token("pad_token_id", c.pad_id));
    DLLM__TRY(r.token("bos_token_id", c.bos_id));
    if (c.n_embd % c.n_head) return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: hidden_size %d is not a multiple of num_attention_heads %d", r.path.c_str(), c.n_embd, c.n_head);
    c.head_dim = c.n_embd / c.n_head;
    int head_dim = c.head_dim;
    DLLM__TRY(r.integer("head_dim", c.head_dim, c.head_dim, head_dim, false, c.head_dim));
    c.n_vocab = c.vocab_size;
    c.qkv_bias = true;  // Qwen2 always has q/k/v biases
    c.shift_logits = true;
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
    } else {
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not supported (supported: llada, Dream)", path.c_str(), mt->str.c_str());
    }
    if (c.n_head % c.n_head_kv)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: %d attention heads are not a multiple of %d key/value heads", path.c_str(), c.n_head, c.n_head_kv);
    if (c.head_dim % 2) return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: head dimension %d is odd; rotary embeddings need an even one", path.c_str(), c.head_dim);
    if (c.mask_id < 0) return dllm__fail(DLLM_ERR_FORMAT, "%s: \"mask_token_id\" is missing; a diffusion model needs its [MASK] id", path.c_str());
    if (c.mask_id >= c.n_vocab) return dllm__fail(DLLM_ERR_FORMAT, "%s: mask_token_id %d is outside the vocabulary (%d)", path.c_str(), c.mask_id, c.n_vocab);
    return DLLM_OK;
}

/* Finds the end-of-turn token (LLaDA <|eot_id|>, Qwen <|im_end|>) in tokenizer_config.json, if any. */
static dllm_status dllm__find_eot(const std::string &dir, dllm__config &c) {
    std::string path = dllm__join_path(dir, "tokenizer_config.json");
    if (!dllm__file_exists(path)) return DLLM_OK;
    dllm__json root;
    DLLM__TRY(dllm__json_load(path, root));
    const dllm__json *dec = root.find("added_tokens_decoder");
    if (!dec || dec->kind != dllm__json::OBJ) return DLLM_OK;
    for (size_t i = 0; i < dec->keys.size(); i++) {
        const dllm__json *content = dec->items[i].find("content");
        if (!content || content->kind != dllm__json::STR) continue;
        if (content->str == "<|eot_id|>" || content->str == "<|im_end|>") {
            char *endp = nullptr;
            long id = strtol(dec->keys[i].c_str(), &endp, 10);
            if (endp && *endp == 0 && id >= 0 && id < c.n_vocab) c.eot_id = (int32_t)id;
        }
    }
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
    std::vector<dllm__wspec> w;
    w.push_back({llada ? "model.transformer.wte.weight" : "model.embed_tokens.weight", {c.n_vocab, d}, -1, DLLM__W_EMBED});
    for (int l = 0; l < c.n_layer; l++) {
        std::string p = llada ? dllm__format("model.transformer.blocks.%d.", l) : dllm__format("model.layers.%d.", l);
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
    w.push_back({llada ? "model.transformer.ln_f.weight" : "model.norm.weight", {d}, -1, DLLM__W_FINAL_NORM});
    if (!c.tied_embeddings) w.push_back({llada ? "model.transformer.ff_out.weight" : "lm_head.weight", {c.n_vocab, d}, -1, DLLM__W_HEAD});
    return w;
}

struct dllm__layer_weights {
    const dllm__tensor *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
    const dllm__tensor *gate = nullptr, *up = nullptr, *down = nullptr;
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv;  // small vectors, kept in fp32
};

struct dllm_model {
    dllm__config cfg;
    std::string dir;
    std::vector<std::unique_ptr<dllm__safetensors>> files;
    std::unordered_map<std::string, const dllm__tensor *> by_name;
    const dllm__tensor *embed = nullptr, *head = nullptr;
    std::vector<float> final_norm;
    std::vector<dllm__layer_weights> layers;
    int64_t n_params = 0;
    bool random_weights = false;  // dllm_model_load_random: weights are generated on the GPU
    uint64_t random_seed = 0;
};

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

/* gemma_rms norms compute x * (1 + w): folding the 1 into the weights keeps one norm everywhere. */
static void dllm__fold_gemma_norms(dllm_model &m) {
    auto fold = [](std::vector<float> &w) { for (float &x : w) x += 1.0f; };
    fold(m.final_norm);
    for (dllm__layer_weights &L : m.layers) { fold(L.attn_norm); fold(L.ffn_norm); }
}

/* Resolves every expected tensor; missing, misshapen or wrongly typed tensors are errors. */
static dllm_status dllm__bind_weights(dllm_model &m) {
    const dllm__config &c = m.cfg;
    m.layers.assign((size_t)c.n_layer, dllm__layer_weights());
    std::vector<dllm__wspec> specs = dllm__expected_weights(c);
    std::unordered_set<std::string> used;
    for (const dllm__wspec &spec : specs) {
        auto it = m.by_name.find(spec.name);
        const dllm__tensor *t = it == m.by_name.end() ? nullptr : it->second;
        DLLM__TRY(dllm__check_tensor(spec, t));
        dllm__bind_tensor(m, spec, t);
        used.insert(spec.name);
        m.n_params += t->numel;
    }
    if (c.tied_embeddings) m.head = m.embed;
    if (c.gemma_norm) dllm__fold_gemma_norms(m);
    std::vector<std::string> extra;
    for (auto &kv : m.by_name)
        if (!used.count(kv.first)) extra.push_back(kv.first);
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
    if (!dllm__file_exists(cfg_path)) return dllm__fail(DLLM_ERR_IO, "%s: no config.json in this directory", dir);
    dllm__json cfg_json;
    DLLM__TRY(dllm__json_load(cfg_path, cfg_json));
    DLLM__TRY(dllm__config_parse(cfg_json, cfg_path, m->cfg));
    DLLM__TRY(dllm__find_eot(m->dir, m->cfg));
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
    DLLM__TRY(dllm__bind_weights(*m));
    out = std::move(m);
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 6. Philox counter-based RNG
//    Philox4x32-10 (Salmon et al. 2011). A draw is a pure function of (seed; vocab index, position,
//    step, stream), so the CPU, the GPU and tools/make_fixtures.py produce the same numbers in any order.
// ---------------------------------------------------------------------------------------------------

enum dllm__rng_stream : uint32_t {
    DLLM__RNG_GUMBEL = 1,  // token noise for temperature > 0, counter (vocab index, position, step)
    DLLM__RNG_REMASK = 2   // 'random' remasking confidence, counter (0, position, step)
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
// 7. CPU thread pool
//    The caller runs tasks too. Each output element is computed by exactly one task in a fixed order,
//    so results do not depend on the thread count.
// ---------------------------------------------------------------------------------------------------

class dllm__pool {
  public:
    explicit dllm__pool(int n_threads) {
        for (int i = 1; i < n_threads; i++) workers_.emplace_back([this] { worker(); });
    }
    ~dllm__pool() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            quit_ = true;
        }
        wake_.notify_all();
        for (std::thread &t : workers_) t.join();
    }
    int size() const { return (int)workers_.size() + 1; }

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
// 8. CPU fp32 reference forward
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

/* y[T][N] = x[T][K] . W[N][K]^T (+ bias[N]). W may be BF16, F16 or F32. */
static void dllm__cpu_linear(dllm__pool &pool, const float *x, int T, int K, const dllm__tensor &W, const float *bias, int N, float *y) {
    const int rows_per_task = 16;
    pool.run((N + rows_per_task - 1) / rows_per_task, [&](int task) {
        std::vector<float> w((size_t)K);
        int n_end = std::min(N, (task + 1) * rows_per_task);
        for (int n = task * rows_per_task; n < n_end; n++) {
            dllm__tensor_row(W, n, K, w.data());
            float b = bias ? bias[n] : 0.0f;
            for (int t = 0; t < T; t++) y[(size_t)t * N + n] = dllm__dot(x + (size_t)t * K, w.data(), K) + b;
        }
    });
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

/* cos/sin tables [n_pos][head_dim/2] computed in float32 exactly as HF does (inv_freq, then pos * inv_freq).
 * The GPU backend uploads these same tables, so both backends rotate by identical numbers. */
static void dllm__rope_tables(float theta, int head_dim, int n_pos, std::vector<float> &cos_t, std::vector<float> &sin_t) {
    int half = head_dim / 2;
    std::vector<float> inv((size_t)half);
    for (int j = 0; j < half; j++) inv[(size_t)j] = 1.0f / powf(theta, (float)(2 * j) / (float)head_dim);
    cos_t.resize((size_t)n_pos * half);
    sin_t.resize((size_t)n_pos * half);
    for (int p = 0; p < n_pos; p++)
        for (int j = 0; j < half; j++) {
            float angle = (float)p * inv[(size_t)j];
            cos_t[(size_t)p * half + j] = cosf(angle);
            sin_t[(size_t)p * half + j] = sinf(angle);
        }
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

/* Bidirectional softmax(q k^T / sqrt(hd)) v per head; key_valid (nullable) masks padded keys. */
static void dllm__cpu_attention(dllm__pool &pool, const float *q, const float *k, const float *v, int T, int n_head, int n_kv,
                                int hd, const uint8_t *key_valid, float *out) {
    const int group = n_head / n_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    pool.run(n_head, [&](int h) {
        int kvh = h / group;
        std::vector<double> p((size_t)T);
        std::vector<double> acc((size_t)hd);
        for (int i = 0; i < T; i++) {
            const float *qi = q + ((size_t)i * n_head + h) * hd;
            double m = -INFINITY;
            for (int j = 0; j < T; j++) {
                if (key_valid && !key_valid[j]) { p[(size_t)j] = -INFINITY; continue; }
                p[(size_t)j] = (double)(dllm__dot(qi, k + ((size_t)j * n_kv + kvh) * hd, hd) * scale);
                m = std::max(m, p[(size_t)j]);
            }
            double l = 0;
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int j = 0; m > -INFINITY && j < T; j++) {
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

/* One transformer layer over all T rows of b.h, in place. */
static void dllm__cpu_layer(const dllm_model &m, const dllm__layer_weights &L, dllm__pool &pool, dllm__cpu_buffers &b, int T,
                            const uint8_t *key_valid, const float *cos_t, const float *sin_t) {
    const dllm__config &c = m.cfg;
    const int d = c.n_embd, qd = c.n_head * c.head_dim, kvd = c.n_head_kv * c.head_dim;
    dllm__cpu_rmsnorm(b.h.data(), T, d, L.attn_norm.data(), c.norm_eps, b.a.data());
    dllm__cpu_linear(pool, b.a.data(), T, d, *L.wq, L.bq.empty() ? nullptr : L.bq.data(), qd, b.q.data());
    dllm__cpu_linear(pool, b.a.data(), T, d, *L.wk, L.bk.empty() ? nullptr : L.bk.data(), kvd, b.k.data());
    dllm__cpu_linear(pool, b.a.data(), T, d, *L.wv, L.bv.empty() ? nullptr : L.bv.data(), kvd, b.v.data());
    dllm__cpu_rope(b.q.data(), T, c.n_head, c.head_dim, b.pos.data(), cos_t, sin_t);
    dllm__cpu_rope(b.k.data(), T, c.n_head_kv, c.head_dim, b.pos.data(), cos_t, sin_t);
    dllm__cpu_attention(pool, b.q.data(), b.k.data(), b.v.data(), T, c.n_head, c.n_head_kv, c.head_dim, key_valid, b.att.data());
    dllm__cpu_linear(pool, b.att.data(), T, qd, *L.wo, nullptr, d, b.tmp.data());
    for (size_t i = 0; i < (size_t)T * d; i++) b.h[i] += b.tmp[i];
    dllm__cpu_rmsnorm(b.h.data(), T, d, L.ffn_norm.data(), c.norm_eps, b.a.data());
    dllm__cpu_linear(pool, b.a.data(), T, d, *L.gate, nullptr, c.n_ff, b.gate.data());
    dllm__cpu_linear(pool, b.a.data(), T, d, *L.up, nullptr, c.n_ff, b.up.data());
    for (size_t i = 0; i < (size_t)T * c.n_ff; i++) b.gate[i] = dllm__silu(b.gate[i]) * b.up[i];
    dllm__cpu_linear(pool, b.gate.data(), T, c.n_ff, *L.down, nullptr, d, b.tmp.data());
    for (size_t i = 0; i < (size_t)T * d; i++) b.h[i] += b.tmp[i];
}

/* Forward over ids[0..T) (positions 0..T-1); writes the unshifted output rows [r0, r1) to logits. */
static void dllm__cpu_forward(const dllm_model &m, dllm__pool &pool, dllm__cpu_buffers &b, const int32_t *ids, int T,
                              const uint8_t *key_valid, const float *cos_t, const float *sin_t, int r0, int r1, float *logits) {
    const dllm__config &c = m.cfg;
    const int d = c.n_embd;
    b.fit(c, T);
    for (int t = 0; t < T; t++) {
        b.pos[(size_t)t] = t;
        dllm__tensor_row(*m.embed, ids[t], d, b.h.data() + (size_t)t * d);
    }
    for (const dllm__layer_weights &L : m.layers) dllm__cpu_layer(m, L, pool, b, T, key_valid, cos_t, sin_t);
    dllm__cpu_rmsnorm(b.h.data() + (size_t)r0 * d, r1 - r0, d, m.final_norm.data(), c.norm_eps, b.a.data());
    dllm__cpu_linear(pool, b.a.data(), r1 - r0, d, *m.head, nullptr, c.n_vocab, logits);
    if (c.scale_logits) {
        const float s = 1.0f / sqrtf((float)d);
        for (size_t i = 0; i < (size_t)(r1 - r0) * c.n_vocab; i++) logits[i] *= s;
    }
}

/* The output row that predicts position pos: Dream shifts by one (position 0 keeps row 0). */
static inline int dllm__logit_row(const dllm__config &c, int pos) { return c.shift_logits && pos > 0 ? pos - 1 : pos; }

// ---------------------------------------------------------------------------------------------------
// 9. Token choice: argmax / Gumbel-max, confidence, top-k selection
//    These are the CPU twins of the GPU sampler kernels. Ties go to the lower vocabulary index and to
//    the lower canvas position, so the result never depends on evaluation order.
// ---------------------------------------------------------------------------------------------------

struct dllm__sampling {
    double temperature = 0;
    dllm_remasking remasking = DLLM_REMASK_LOW_CONFIDENCE;
    uint64_t seed = 0;
    bool eos_logit_inf = false;    // logits_eos_inf
    bool defer_eos_eot = false;    // confidence_eos_eot_inf
    int32_t eos_id = -1, eot_id = -1;
};

struct dllm__choice {
    int32_t token;
    double conf;
    bool deferred;  // predicts EOS/EoT under confidence_eos_eot_inf: ranked after every other candidate
};

/* x0 and its confidence for one canvas position from its logits row (generate.py semantics):
 * x0 = argmax(l) at T = 0, else argmax(exp(l) / (-log u)^T) in float64 (Gumbel-max of softmax(l/T));
 * conf = softmax(l)[x0] ('low_confidence', no temperature) or u ('random'). */
static dllm__choice dllm__choose(const float *logits, int n_vocab, const dllm__sampling &s, uint32_t pos, uint32_t step) {
    auto logit = [&](int v) { return s.eos_logit_inf && v == s.eos_id ? -INFINITY : logits[v]; };
    int best = 0;
    double best_score = -INFINITY;
    float max_logit = -INFINITY;
    for (int v = 0; v < n_vocab; v++) {
        float l = logit(v);
        if (l > max_logit) max_logit = l;
        double score = l;
        if (s.temperature > 0) {
            double u = dllm__uniform(s.seed, (uint32_t)v, pos, step, DLLM__RNG_GUMBEL);
            score = exp((double)l) / pow(-log(u), s.temperature);
        }
        if (score > best_score) { best_score = score; best = v; }
    }
    dllm__choice ch;
    ch.token = best;
    if (s.remasking == DLLM_REMASK_RANDOM) {
        ch.conf = dllm__uniform(s.seed, 0, pos, step, DLLM__RNG_REMASK);
    } else {
        double z = 0;
        for (int v = 0; v < n_vocab; v++) z += exp((double)logit(v) - max_logit);
        ch.conf = exp((double)logit(best) - max_logit) / z;
    }
    if (ch.conf != ch.conf) ch.conf = -INFINITY;  // NaN logits never win a slot
    ch.deferred = s.defer_eos_eot && (best == s.eos_id || best == s.eot_id);
    return ch;
}

/* The k best candidates: non-deferred before deferred, then higher confidence, then lower position.
 * Returns their indices into cand, in ascending position order. */
static std::vector<int> dllm__select_topk(const std::vector<int32_t> &cand_pos, const std::vector<dllm__choice> &ch, int k) {
    std::vector<int> order(cand_pos.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = (int)i;
    auto better = [&](int a, int b) {
        if (ch[(size_t)a].deferred != ch[(size_t)b].deferred) return !ch[(size_t)a].deferred;
        if (ch[(size_t)a].conf != ch[(size_t)b].conf) return ch[(size_t)a].conf > ch[(size_t)b].conf;
        return cand_pos[(size_t)a] < cand_pos[(size_t)b];
    };
    k = std::min(k, (int)order.size());
    std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
    order.resize((size_t)k);
    std::sort(order.begin(), order.end());
    return order;
}

// ---------------------------------------------------------------------------------------------------
// 10. Backends (CPU reference)
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
    int cand_lo = 0;                 // no candidate before this position (GPU backend)
    int lacache = 0;                 // dllm_lacache (GPU backend; the CPU computes the same function)
    int32_t mask_id = 0;
    float cfg_scale = 0;
    dllm__sampling sampling;
    int forwards = 0;
};

/* What a backend does; the SAR schedule (section 16) drives it. */
struct dllm__backend_impl {
    virtual ~dllm__backend_impl() {}
    /* Logits for positions [r0, r1) of one forward over ids[0..n) (shift already applied). */
    virtual dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) = 0;
    /* A generation starts: st.canvas holds prompt ++ masks. */
    virtual dllm_status begin(dllm__decode &) { return DLLM_OK; }
    /* A block starts: st.block_begin/block_end/steps_per_block are set. */
    virtual dllm_status begin_block(dllm__decode &st) = 0;
    /* One denoising step: x0 and confidence at every candidate, commit the best k = n/s (+1 for the first
     * n%s steps). With want_host, st.canvas and committed (ascending positions) are current on return. */
    virtual dllm_status step(dllm__decode &st, std::vector<int32_t> &committed, bool want_host) = 0;
    /* The generation ends: st.canvas must be current. */
    virtual dllm_status finish(dllm__decode &) { return DLLM_OK; }
};

/* k_i of the LLaDA schedule: n masks over s steps, the remainder to the earliest steps. */
static int dllm__transfer_count(int n_masked, int steps, int i) { return n_masked / steps + (i < n_masked % steps ? 1 : 0); }

class dllm__cpu_backend : public dllm__backend_impl {
  public:
    dllm__cpu_backend(const dllm_model &m, int n_threads, int max_tokens) : m_(m), pool_(n_threads) {
        dllm__rope_tables(m.cfg.rope_theta, m.cfg.head_dim, max_tokens, cos_, sin_);
    }

    dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) override {
        const dllm__config &c = m_.cfg;
        int raw0 = dllm__logit_row(c, r0), raw1 = dllm__logit_row(c, r1 - 1) + 1;
        raw_.resize((size_t)(raw1 - raw0) * c.n_vocab);
        dllm__cpu_forward(m_, pool_, buf_, ids, n, nullptr, cos_.data(), sin_.data(), raw0, raw1, raw_.data());
        for (int p = r0; p < r1; p++)
            memcpy(out + (size_t)(p - r0) * c.n_vocab, raw_.data() + (size_t)(dllm__logit_row(c, p) - raw0) * c.n_vocab,
                   sizeof(float) * c.n_vocab);
        return DLLM_OK;
    }

    dllm_status begin_block(dllm__decode &st) override {
        st.n_block_masks = 0;
        for (int p = st.block_begin; p < st.block_end; p++) st.n_block_masks += st.canvas[(size_t)p] == st.mask_id;
        return DLLM_OK;
    }

    dllm_status step(dllm__decode &st, std::vector<int32_t> &committed, bool) override {
        const int V = m_.cfg.n_vocab, n = (int)st.canvas.size();
        const int k = dllm__transfer_count(st.n_block_masks, st.steps_per_block, st.step_in_block);
        std::vector<int32_t> cand;
        for (int p = 0; p < st.block_end; p++)
            if (st.canvas[(size_t)p] == st.mask_id) cand.push_back(p);
        committed.clear();
        // The reference runs the forward even when the step commits nothing; so do we (NFE semantics).
        int r0 = cand.empty() ? st.block_end - 1 : cand.front(), r1 = st.block_end;
        cond_.resize((size_t)(r1 - r0) * V);
        DLLM__TRY(logits(st.canvas.data(), n, r0, r1, cond_.data()));
        st.forwards++;
        if (st.cfg_scale > 0) DLLM__TRY(apply_cfg(st, r0, r1));
        std::vector<dllm__choice> ch;
        for (int32_t p : cand) ch.push_back(dllm__choose(cond_.data() + (size_t)(p - r0) * V, V, st.sampling, (uint32_t)p, (uint32_t)st.global_step));
        for (int i : dllm__select_topk(cand, ch, k)) {
            st.canvas[(size_t)cand[(size_t)i]] = ch[(size_t)i].token;
            committed.push_back(cand[(size_t)i]);
        }
        return DLLM_OK;
    }

  private:
    /* logits = U + (s + 1) (C - U) with U from the canvas whose prompt positions are masked. */
    dllm_status apply_cfg(dllm__decode &st, int r0, int r1) {
        const int V = m_.cfg.n_vocab;
        std::vector<int32_t> un = st.canvas;
        for (size_t p = 0; p < un.size(); p++)
            if (st.is_prompt[p]) un[p] = st.mask_id;
        uncond_.resize((size_t)(r1 - r0) * V);
        DLLM__TRY(logits(un.data(), (int)un.size(), r0, r1, uncond_.data()));
        st.forwards++;
        const float w = st.cfg_scale + 1.0f;
        for (size_t i = 0; i < uncond_.size(); i++) cond_[i] = uncond_[i] + w * (cond_[i] - uncond_[i]);
        return DLLM_OK;
    }

    const dllm_model &m_;
    dllm__pool pool_;
    dllm__cpu_buffers buf_;
    std::vector<float> cos_, sin_, raw_, cond_, uncond_;
};

// ---------------------------------------------------------------------------------------------------
// 11. GPU: errors, device memory
// ---------------------------------------------------------------------------------------------------

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

struct dllm__dbuf {
    void *ptr = nullptr;
    size_t bytes = 0;

    dllm__dbuf() {}
    dllm__dbuf(const dllm__dbuf &) = delete;
    dllm__dbuf &operator=(const dllm__dbuf &) = delete;
    dllm__dbuf(dllm__dbuf &&o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; o.bytes = 0; }
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
        cudaError_t e = cudaMalloc(&ptr, n);
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


// ---------------------------------------------------------------------------------------------------
// 12. GPU kernel sources (compiled by NVRTC at first use)
//     Strings, not __global__ functions: dllm_cuda.cu holds no device code, so it builds anywhere and a
//     kernel is compiled only for the GPU it runs on. No headers: bf16 is handled as raw 16-bit values
//     with PTX conversions, so the JIT needs nothing but libnvrtc at run time.
//     Each kernel names its CPU twin; tests/test_gpu.inl compares every pair on fresh random inputs.
// ---------------------------------------------------------------------------------------------------

/* Shared by every module: fixed-width types, bf16 conversions, Philox (twin: dllm__philox). */
static const char *dllm__src_common = R"DLLM(
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

/* The decoding state that lives on the device so that a captured step graph can replay unchanged. */
struct dllm_step_state {
    int block_begin, block_end;   // current block [begin, end)
    int steps_per_block;
    int step_in_block;            // advanced by select_commit
    int global_step;              // keys the RNG; advanced by select_commit
    int n_block_masks;            // masks in the block at its first step
    int n_committed;              // positions committed by the last step
};
)DLLM";

/* Row-wise kernels: shapes are run-time arguments, so one module serves every model. */
static const char *dllm__src_rowwise = R"DLLM(
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

/* Twin: dllm__tensor_row on the embedding table. h[row] = embed[ids[row]] in fp32. */
extern "C" __global__ void embed_gather(const int *ids, int n_rows, const bf16_t *table, int d, float *h) {
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
 * y[b * n_rows + i] = bf16(norm(v) * w). One CTA per row; the sum of squares is reduced in a fixed order,
 * so a row's bits never depend on which other rows are computed (LaCache relies on this). */
extern "C" __global__ void add_rmsnorm(const float *h_in, float *h_out, const bf16_t *delta, const float *w, float eps, bf16_t *y,
                                       int d, int n_rows, int row0, int seq_len) {
    int i = blockIdx.x, b = blockIdx.y;
    u64 src = (u64)b * seq_len + row0 + i, dst = (u64)b * n_rows + i;
    const float *hr = (h_out ? h_out : h_in) + src * d;  // where v is after the first pass
    float f[8], g[8];
    const bf16_t *dr = delta ? delta + src * d : 0;
    float ss = 0.f;
    for (int k = threadIdx.x * 8; k < d; k += blockDim.x * 8) {
        load8(h_in + src * d + k, f);
        if (dr) {
            unpack8(*(const uint4 *)(dr + k), g);
            for (int e = 0; e < 8; e++) f[e] += g[e];
        }
        if (h_out) store8(h_out + src * d + k, f);
        for (int e = 0; e < 8; e++) ss += f[e] * f[e];
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
    float r = rsqrtf(part[0] / (float)d + eps);
    bf16_t *yr = y + dst * d;
    for (int k = threadIdx.x * 8; k < d; k += blockDim.x * 8) {
        load8(hr + k, f);  // h_out holds v; without h_out, v = h_in (no delta is added then)
        load8(w + k, g);
        for (int e = 0; e < 8; e++) f[e] = (f[e] * r) * g[e];
        *(uint4 *)(yr + k) = pack8(f);
    }
}

/* Twin: bias add + dllm__cpu_rope. In place on the fused projection rows [q heads | k heads | v heads]:
 * adds the fp32 bias, rotates q and k heads by the position (row % seq_len) + pos0 with the same
 * cos/sin tables as the CPU. One thread per (row, head, 4 pairs). */
extern "C" __global__ void rope_qkv(bf16_t *qkv, int n_rows, int seq_len, int pos0, int n_head, int n_kv, int head_dim,
                                    const float *bias, const float *cos_t, const float *sin_t) {
    // Without a bias the V heads are left alone: the pass touches q and k only.
    int half = head_dim >> 1, quads = half >> 2, heads = n_head + 2 * n_kv, active = bias ? heads : n_head + n_kv;
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (u64)n_rows * active * quads) return;
    int j = (int)(idx % quads) * 4, hd = (int)((idx / quads) % active), row = (int)(idx / ((u64)quads * active));
    bf16_t *x = qkv + (u64)row * heads * head_dim + hd * head_dim;
    uint2 lo = *(const uint2 *)(x + j), hi = *(const uint2 *)(x + j + half);
    float x1[4] = {__uint_as_float(lo.x << 16), __uint_as_float(lo.x & 0xffff0000u), __uint_as_float(lo.y << 16), __uint_as_float(lo.y & 0xffff0000u)};
    float x2[4] = {__uint_as_float(hi.x << 16), __uint_as_float(hi.x & 0xffff0000u), __uint_as_float(hi.y << 16), __uint_as_float(hi.y & 0xffff0000u)};
    if (bias) {
        const float *bh = bias + hd * head_dim;
        for (int e = 0; e < 4; e++) { x1[e] += bh[j + e]; x2[e] += bh[j + half + e]; }
    }
    if (hd < n_head + n_kv) {
        u64 t = (u64)(row % seq_len + pos0) * half + j;
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

/* Twin: the CPU's silu(gate) * up. gu rows are [gate (f) | up (f)]; out rows are f wide. 8 per thread. */
extern "C" __global__ void swiglu(const bf16_t *gu, bf16_t *out, int n_rows, int f) {
    u64 idx = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (u64)n_rows * f) return;
    u64 row = idx / f, col = idx % f;
    float g[8], u[8];
    unpack8(*(const uint4 *)(gu + row * 2 * f + col), g);
    unpack8(*(const uint4 *)(gu + row * 2 * f + f + col), u);
    for (int e = 0; e < 8; e++) g[e] = g[e] / (1.f + __expf(-g[e])) * u[e];
    *(uint4 *)(out + idx) = pack8(g);
}

/* The CFG unconditional canvas: prompt positions become MASK (twin: dllm__cpu_backend::apply_cfg). */
extern "C" __global__ void make_uncond(const int *canvas, const unsigned char *is_prompt, int n, int mask_id, int *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = is_prompt[i] ? mask_id : canvas[i];
}

/* Starts a block: bounds, schedule length, masks in the block (the n of k_i = n/s + (i < n%s)). */
extern "C" __global__ void block_begin(dllm_step_state *st, const int *canvas, int begin, int end, int steps_per_block, int mask_id) {
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

/* Random weights for benchmarks (no file): uniform in [-scale, scale], or the constant `scale` when
 * constant != 0 (norm weights). A cheap integer hash: speed matters for 16 GB, quality does not. */
extern "C" __global__ void fill_random_bf16(bf16_t *w, u64 n, u64 seed, float scale, int constant) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u64 z = (i + seed * 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
        z ^= z >> 31;
        z *= 0x94D049BB133111EBull;
        z ^= z >> 29;
        float u = (float)(z >> 40) * (1.0f / 16777216.0f);
        w[i] = f32_to_bf16(constant ? scale : (2.f * u - 1.f) * scale);
    }
}
)DLLM";

/* Token choice on the device. Twins: dllm__choose (per row) and dllm__select_topk (per step). */
static const char *dllm__src_sampler = R"DLLM(
struct conf_partial {
    double best_score;  // argmax criterion: the logit (T = 0) or the Gumbel score (T > 0)
    double sum_exp;     // sum of exp(l - max_logit) over the slice
    float max_logit;
    float best_logit;
    int best_idx;
    int pad;
};

struct sampler_args {
    const float *cond;        // [rows][vocab] logits
    const float *uncond;      // CFG: unconditional logits with the same layout, or null
    float cfg_weight;         // s + 1: logits = U + (s + 1)(C - U)
    int vocab, slice, n_slices, n_rows;
    int pos0;                 // canvas position of row 0
    int lrow0, shift0;        // logits row of row r: (shift0 ? max(r - 1, 0) : r) + lrow0 (Dream's shift)
    int raw_rows;             // logits rows per batch entry in the buffer
    double temperature;
    u64 seed;
    int eos_inf, eos_id, eot_id, defer_eos_eot, random_remask;
};

__device__ __forceinline__ int logits_row(const sampler_args &a, int row) { return (a.shift0 ? max(row - 1, 0) : row) + a.lrow0; }

/* Twin: the CPU's CFG combination and logits_eos_inf. lr is a logits row (see logits_row). */
__device__ __forceinline__ float sampler_logit(const sampler_args &a, int lr, int v) {
    if (a.eos_inf && v == a.eos_id) return -DLLM_INF;
    float c = a.cond[(u64)lr * a.vocab + v];
    if (!a.uncond) return c;
    float u = a.uncond[(u64)lr * a.vocab + v];
    return u + a.cfg_weight * (c - u);
}

__device__ __forceinline__ bool better(double s, int i, double bs, int bi) { return s > bs || (s == bs && i < bi); }

/* Pass 1: one CTA per (slice, row): max logit, best token, sum of exp relative to the slice max. */
extern "C" __global__ void conf_partial_kernel(sampler_args a, const dllm_step_state *st, conf_partial *out) {
    int slice = blockIdx.x, row = blockIdx.y, lr = logits_row(a, row);
    int v0 = slice * a.slice, v1 = min(a.vocab, v0 + a.slice);
    u32 step = (u32)st->global_step, pos = (u32)(a.pos0 + row);
    float mx = -DLLM_INF;
    double best = -1.0 / 0.0;
    int best_i = 0x7fffffff;
    for (int v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
        float l = sampler_logit(a, lr, v);
        mx = fmaxf(mx, l);
        double score = l;
        if (a.temperature > 0) score = exp((double)l) / pow(-log(uniform01(a.seed, (u32)v, pos, step, 1u)), a.temperature);
        if (better(score, v, best, best_i)) { best = score; best_i = v; }
    }
    __shared__ float s_mx[32];
    __shared__ double s_best[32];
    __shared__ int s_bi[32];
    __shared__ double s_sum[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        double ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (better(ob, oi, best, best_i)) { best = ob; best_i = oi; }
    }
    if (lane == 0) { s_mx[warp] = mx; s_best[warp] = best; s_bi[warp] = best_i; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nw; w++) {
            mx = fmaxf(mx, s_mx[w]);
            if (better(s_best[w], s_bi[w], best, best_i)) { best = s_best[w]; best_i = s_bi[w]; }
        }
        s_mx[0] = mx;
        s_bi[0] = best_i;
        s_best[0] = best;
    }
    __syncthreads();
    mx = s_mx[0];
    double sum = 0;
    if (mx > -DLLM_INF)
        for (int v = v0 + threadIdx.x; v < v1; v += blockDim.x) sum += exp((double)sampler_logit(a, lr, v) - (double)mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) s_sum[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nw; w++) sum += s_sum[w];
        conf_partial p;
        p.best_score = s_best[0];
        p.best_idx = s_bi[0];
        p.best_logit = s_bi[0] < a.vocab ? sampler_logit(a, lr, s_bi[0]) : -DLLM_INF;
        p.max_logit = mx;
        p.sum_exp = sum;
        p.pad = 0;
        out[(u64)row * a.n_slices + slice] = p;
    }
}

/* Pass 2: one thread per row merges the slices in order: x0, confidence (float64), deferral flag. */
extern "C" __global__ void conf_combine_kernel(sampler_args a, const dllm_step_state *st, const conf_partial *parts,
                                               int *x0, double *conf, unsigned char *deferred) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= a.n_rows) return;
    const conf_partial *p = parts + (u64)row * a.n_slices;
    float mx = -DLLM_INF;
    double best = -1.0 / 0.0;
    int bi = 0x7fffffff;
    float bl = -DLLM_INF;
    for (int s = 0; s < a.n_slices; s++) {
        mx = fmaxf(mx, p[s].max_logit);
        if (better(p[s].best_score, p[s].best_idx, best, bi)) { best = p[s].best_score; bi = p[s].best_idx; bl = p[s].best_logit; }
    }
    double z = 0;
    for (int s = 0; s < a.n_slices; s++)
        if (p[s].max_logit > -DLLM_INF) z += p[s].sum_exp * exp((double)p[s].max_logit - (double)mx);
    double c;
    if (a.random_remask) c = uniform01(a.seed, 0u, (u32)(a.pos0 + row), (u32)st->global_step, 2u);
    else c = exp((double)bl - (double)mx) / z;
    if (c != c) c = -1.0 / 0.0;
    if (bi >= a.vocab) bi = 0;
    x0[row] = bi;
    conf[row] = c;
    deferred[row] = a.defer_eos_eot && (bi == a.eos_id || bi == a.eot_id);
}

/* Commits the step's k best candidates (masked positions in [cand_lo, block_end)): non-deferred first,
 * then higher confidence, then lower position; k = n/s (+1 for the first n%s steps). One CTA; each
 * candidate's rank is counted directly, which is deterministic and cheap for block-sized sets. */
extern "C" __global__ void select_commit(int *canvas, dllm_step_state *st, int cand_lo, int row0, const int *x0,
                                         const double *conf, const unsigned char *deferred, int mask_id, int *committed) {
    extern __shared__ unsigned char is_cand[];
    int lo = cand_lo, hi = st->block_end, n = hi - lo;
    for (int i = threadIdx.x; i < n; i += blockDim.x) is_cand[i] = canvas[lo + i] == mask_id;
    __syncthreads();
    int s = st->steps_per_block, i_step = st->step_in_block, nm = st->n_block_masks;
    int k = nm / s + (i_step < nm % s ? 1 : 0);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        if (!is_cand[i]) continue;
        int r = lo + i - row0;
        unsigned char di = deferred[r];
        double ci = conf[r];
        int rank = 0;
        for (int j = 0; j < n && rank < k; j++) {
            if (!is_cand[j] || j == i) continue;
            int rj = lo + j - row0;
            unsigned char dj = deferred[rj];
            double cj = conf[rj];
            bool b = dj != di ? !dj : (cj != ci ? cj > ci : j < i);
            rank += b;
        }
        if (rank >= k) is_cand[i] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int c = 0;
        for (int i = 0; i < n; i++)
            if (is_cand[i]) {
                canvas[lo + i] = x0[lo + i - row0];
                committed[c++] = lo + i;
            }
        st->n_committed = c;
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
static const char *dllm__src_attention = R"DLLM(
__device__ __forceinline__ u32 smem_u32(const void *p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::); }

__device__ __forceinline__ void ldmatrix_x4(u32 r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void mma_bf16(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct attn_args {
    const bf16_t *q, *k, *v;     // row r of batch b, head h at q + (b*seq + r)*q_stride + h*HD
    bf16_t *o;                   // same addressing with o_stride
    const unsigned char *key_valid;  // [batch][seq] or null
    int seq, q_stride, kv_stride, o_stride, group;  // group = n_head / n_kv
    const dllm_step_state *st;   // current block: its KV tiles are visited last; null or empty: plain order
    float scale_log2;            // log2(e) / sqrt(HD)
    int fa_mode;                 // FACache: 0 plain, 1 save the state after the early tiles, 2 resume from it
    float *fa_state;             // [batch][head][q tile][field][thread] online-softmax registers (modes 1, 2)
};

__device__ __forceinline__ int kv_tile_at(int i, int n_tiles, int lo, int hi) {
    int head = lo, mid = n_tiles - hi;
    return i < head ? i : (i < head + mid ? i - head + hi : i - head - mid + lo);
}

template <int HD, int THREADS>
__device__ __forceinline__ void load_tile(bf16_t *dst, const bf16_t *src, int stride, int row0, int rows, int n_valid) {
    constexpr int CHUNKS = HD / 8, LD = HD + 8;
    for (int c = threadIdx.x; c < rows * CHUNKS; c += THREADS) {
        int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        bool ok = row0 + r < n_valid;
        cp_async16(dst + r * LD + col, src + (u64)(ok ? row0 + r : 0) * stride + col, ok);
    }
}

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

/* Saves (SAVE) or restores the online-softmax registers of one thread: m, l (per-thread partial sums) and
 * the unnormalised O, field by field so that consecutive threads touch consecutive words. */
template <int MT, int DT, int THREADS, bool SAVE>
__device__ __forceinline__ void fa_state_io(const attn_args &a, float (&o)[MT][DT][4], float (&m)[MT][2], float (&l)[MT][2]) {
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

/* Each warp owns MT m16 tiles (16 * MT query rows), so every K and V fragment it loads from shared
 * memory feeds MT tensor-core ops (FA2's layout). Q fragments are re-read from shared memory at each
 * k-step rather than held in registers: that keeps HD = 128 with MT = 2 under 255 registers. */
template <int HD, int BR, int BC, int MT>
__global__ void __launch_bounds__(BR * 2 / MT) flash_attn(attn_args a) {
    constexpr int LD = HD + 8, NT = BC / 8, KS = HD / 16, DT = HD / 8, THREADS = BR * 2 / MT;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16_t *sQ = (bf16_t *)smem, *sK = sQ + BR * LD, *sV = sK + 2 * BC * LD;
    const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / a.group;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int q0 = qt * BR, n_tiles = (a.seq + BC - 1) / BC;
    const bf16_t *Q = a.q + (u64)b * a.seq * a.q_stride + h * HD;
    const bf16_t *K = a.k + (u64)b * a.seq * a.kv_stride + kvh * HD;
    const bf16_t *V = a.v + (u64)b * a.seq * a.kv_stride + kvh * HD;
    const unsigned char *valid = a.key_valid ? a.key_valid + (u64)b * a.seq : 0;
    int late_lo = 0, late_hi = 0;
    if (a.st && a.st->block_end > a.st->block_begin) {
        late_lo = a.st->block_begin / BC;
        late_hi = min(n_tiles, (a.st->block_end + BC - 1) / BC);
    }

    load_tile<HD, THREADS>(sQ, Q, a.q_stride, q0, BR, a.seq);
    cp_async_commit();
    int tile = kv_tile_at(0, n_tiles, late_lo, late_hi);
    load_tile<HD, THREADS>(sK, K, a.kv_stride, tile * BC, BC, a.seq);
    load_tile<HD, THREADS>(sV, V, a.kv_stride, tile * BC, BC, a.seq);
    cp_async_commit();

    float o[MT][DT][4];
    float m[MT][2], l[MT][2];
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        #pragma unroll
        for (int d = 0; d < DT; d++) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.f;
        m[mt][0] = m[mt][1] = -DLLM_INF;
        l[mt][0] = l[mt][1] = 0.f;
    }
    const bf16_t *q_warp = sQ + (warp * 16 * MT + (lane & 15)) * LD + (lane >> 4) * 8;

    // FACache (LaCache, Algorithm 1): a query tile outside the block keeps, across the block's steps, its
    // state over the KV tiles outside the block. Saved and restored register for register, so resuming
    // continues exactly the computation the plain order performs.
    const int n_early = n_tiles - (late_hi - late_lo);
    const bool q_in_block = late_hi > late_lo && q0 < a.st->block_end && q0 + BR > a.st->block_begin;
    const bool cached = a.fa_mode != 0 && !q_in_block;
    int i_begin = 0;
    if (cached && a.fa_mode == 2) {
        fa_state_io<MT, DT, THREADS, false>(a, o, m, l);
        i_begin = n_early;
    }
    if (cached && a.fa_mode == 1 && n_early == 0) fa_state_io<MT, DT, THREADS, true>(a, o, m, l);
    if (i_begin > 0) {  // the prefetched tile 0 is not needed: fetch the first late tile instead
        cp_async_wait_all();
        __syncthreads();
        int first = kv_tile_at(i_begin, n_tiles, late_lo, late_hi);
        load_tile<HD, THREADS>(sK + (i_begin & 1) * BC * LD, K, a.kv_stride, first * BC, BC, a.seq);
        load_tile<HD, THREADS>(sV + (i_begin & 1) * BC * LD, V, a.kv_stride, first * BC, BC, a.seq);
        cp_async_commit();
    }

    for (int i = i_begin; i < n_tiles; i++) {
        const int stage = i & 1;
        if (i + 1 < n_tiles) {
            int next = kv_tile_at(i + 1, n_tiles, late_lo, late_hi);
            load_tile<HD, THREADS>(sK + (stage ^ 1) * BC * LD, K, a.kv_stride, next * BC, BC, a.seq);
            load_tile<HD, THREADS>(sV + (stage ^ 1) * BC * LD, V, a.kv_stride, next * BC, BC, a.seq);
        }
        cp_async_commit();
        cp_async_wait_1();
        __syncthreads();
        const bf16_t *k_s = sK + stage * BC * LD, *v_s = sV + stage * BC * LD;
        const int k0 = kv_tile_at(i, n_tiles, late_lo, late_hi) * BC;

        float s[MT][NT][4];
        #pragma unroll
        for (int mt = 0; mt < MT; mt++)
            #pragma unroll
            for (int j = 0; j < NT; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
        #pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            u32 qf[MT][4];
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) ldmatrix_x4(qf[mt], q_warp + mt * 16 * LD + kk * 16);
            #pragma unroll
            for (int j = 0; j < NT; j += 2) {
                u32 kb[4];
                ldmatrix_x4(kb, k_s + (j * 8 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
                #pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(s[mt][j], qf[mt], kb[0], kb[1]);
                    mma_bf16(s[mt][j + 1], qf[mt], kb[2], kb[3]);
                }
            }
        }

        #pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float mx0 = -DLLM_INF, mx1 = -DLLM_INF;
            #pragma unroll
            for (int j = 0; j < NT; j++)
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = k0 + j * 8 + 2 * t + (e & 1);
                    bool ok = key < a.seq && (!valid || valid[key]);
                    s[mt][j][e] = ok ? s[mt][j][e] * a.scale_log2 : -DLLM_INF;
                }
            #pragma unroll
            for (int j = 0; j < NT; j++) {
                mx0 = fmaxf(mx0, fmaxf(s[mt][j][0], s[mt][j][1]));
                mx1 = fmaxf(mx1, fmaxf(s[mt][j][2], s[mt][j][3]));
            }
            #pragma unroll
            for (int x = 1; x <= 2; x <<= 1) {
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
            }
            const float n0 = fmaxf(m[mt][0], mx0), n1 = fmaxf(m[mt][1], mx1);
            const float base0 = n0 == -DLLM_INF ? 0.f : n0, base1 = n1 == -DLLM_INF ? 0.f : n1;
            const float corr0 = exp2f(m[mt][0] - base0), corr1 = exp2f(m[mt][1] - base1);
            m[mt][0] = n0;
            m[mt][1] = n1;
            l[mt][0] *= corr0;
            l[mt][1] *= corr1;
            #pragma unroll
            for (int d = 0; d < DT; d++) {
                o[mt][d][0] *= corr0; o[mt][d][1] *= corr0;
                o[mt][d][2] *= corr1; o[mt][d][3] *= corr1;
            }
            #pragma unroll
            for (int j = 0; j < NT; j++) {
                s[mt][j][0] = exp2f(s[mt][j][0] - base0);
                s[mt][j][1] = exp2f(s[mt][j][1] - base0);
                s[mt][j][2] = exp2f(s[mt][j][2] - base1);
                s[mt][j][3] = exp2f(s[mt][j][3] - base1);
                l[mt][0] += s[mt][j][0] + s[mt][j][1];
                l[mt][1] += s[mt][j][2] + s[mt][j][3];
            }
        }
        #pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            u32 pa[MT][4];
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                pa[mt][0] = pack_bf16x2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = pack_bf16x2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = pack_bf16x2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = pack_bf16x2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
            #pragma unroll
            for (int d = 0; d < DT; d += 2) {
                u32 vb[4];
                ldmatrix_x4_trans(vb, v_s + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + d * 8 + (lane >> 4) * 8);
                #pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(o[mt][d], pa[mt], vb[0], vb[1]);
                    mma_bf16(o[mt][d + 1], pa[mt], vb[2], vb[3]);
                }
            }
        }
        if (cached && a.fa_mode == 1 && i == n_early - 1) fa_state_io<MT, DT, THREADS, true>(a, o, m, l);
        __syncthreads();
    }

    bf16_t *O = a.o + (u64)b * a.seq * a.o_stride + h * HD;
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
        for (int d = 0; d < DT; d++) {
            int col = d * 8 + 2 * t;
            if (r0 < a.seq) *(u32 *)(O + (u64)r0 * a.o_stride + col) = pack_bf16x2(o[mt][d][0] * inv0, o[mt][d][1] * inv0);
            if (r1 < a.seq) *(u32 *)(O + (u64)r1 * a.o_stride + col) = pack_bf16x2(o[mt][d][2] * inv1, o[mt][d][3] * inv1);
        }
    }
}
)DLLM";

// ---------------------------------------------------------------------------------------------------
// 13. GPU: NVRTC JIT and the architecture table
//     DeepGEMM's design: kernels are specialised on compile-time constants that belong to the model (head
//     dim, tiles), compiled for the exact GPU, cached in process and on disk under a key that hashes the
//     source, the options, the NVRTC version and the architecture. Environment:
//       DLLM_CACHE_DIR     disk cache folder (default $XDG_CACHE_HOME/dllm or ~/.cache/dllm); "off" disables
//       DLLM_JIT_VERBOSE=1 print each compile, its time, registers and the chosen tile configs
//       DLLM_JIT_DUMP=DIR  write the PTX and cubin of every compiled module (cuobjdump -sass for SASS)
//       DLLM_JIT_FAIL_ON_SPILL=1  a kernel that spills registers is a DLLM_ERR_JIT error
//       DLLM_FA_BR, DLLM_FA_BC, DLLM_FA_MT  override the attention tile (rows per CTA, keys per tile,
//                          m16 tiles per warp)
// ---------------------------------------------------------------------------------------------------

/* Tile choices per compute capability. Attention, sm_90: 128 query rows per CTA in 4 warps of 2 m16
 * tiles (FA2's layout) and 32 keys per tile: 245 registers at head dim 128, no spill, two CTAs per SM
 * (measured on an H200). sm_80: ptxas spills that layout, so 8 warps of one m16 tile (128 registers).
 * sm_86/89: 64 rows in 4 single-tile warps (100 KB of shared memory per SM). The tests require every
 * configuration to compile without a stack frame. Newer GPUs run the same code for their own target. */
struct dllm__arch {
    int cc;               // compute capability major*10 + minor
    const char *target;   // NVRTC --gpu-architecture
    int fa_br, fa_bc;     // attention query rows per CTA, keys per tile
    int fa_mt;            // m16 tiles per warp: the CTA has fa_br / (16 * fa_mt) warps
};

static const dllm__arch dllm__arch_table[] = {
    {80, "sm_80", 128, 32, 1},
    {86, "sm_86", 64, 32, 1},
    {87, "sm_87", 64, 32, 1},
    {89, "sm_89", 64, 32, 1},
    {90, "sm_90a", 128, 32, 2},
};

static int dllm__env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

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
    }
    a.fa_br = dllm__env_int("DLLM_FA_BR", a.fa_br);
    a.fa_bc = dllm__env_int("DLLM_FA_BC", a.fa_bc);
    a.fa_mt = dllm__env_int("DLLM_FA_MT", a.fa_mt);
    return a;
}

static uint64_t dllm__fnv1a(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

static std::string dllm__cache_dir() {
    const char *e = getenv("DLLM_CACHE_DIR");
    if (e && *e) return strcmp(e, "off") == 0 ? std::string() : std::string(e);
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) return std::string(xdg) + "/dllm";
    return home && *home ? std::string(home) + "/.cache/dllm" : std::string();
}

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
    nvrtcVersion(&major, &minor);
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
                                       std::string &log) {
    nvrtcProgram prog;
    if (nvrtcCreateProgram(&prog, rq.source.c_str(), (rq.name + ".cu").c_str(), 0, nullptr, nullptr) != NVRTC_SUCCESS)
        return dllm__fail(DLLM_ERR_JIT, "NVRTC could not create program %s", rq.name.c_str());
    for (const std::string &k : rq.kernels) nvrtcAddNameExpression(prog, k.c_str());
    std::string arch = "--gpu-architecture=" + rq.target;
    const char *opts[] = {arch.c_str(), "-std=c++17", "--ptxas-options=--verbose", "-lineinfo"};
    nvrtcResult r = nvrtcCompileProgram(prog, 4, opts);
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    log.assign(log_size, '\0');
    if (log_size) nvrtcGetProgramLog(prog, &log[0]);
    if (r != NVRTC_SUCCESS) {
        nvrtcDestroyProgram(&prog);
        return dllm__fail(DLLM_ERR_JIT, "NVRTC failed to compile %s for %s: %s\n%s", rq.name.c_str(), rq.target.c_str(),
                          nvrtcGetErrorString(r), dllm__log_excerpt(log).c_str());
    }
    size_t n = 0;
    nvrtcGetCUBINSize(prog, &n);
    cubin.resize(n);
    if (n) nvrtcGetCUBIN(prog, cubin.data());
    lowered.clear();
    for (const std::string &k : rq.kernels) {
        const char *low = nullptr;
        nvrtcGetLoweredName(prog, k.c_str(), &low);
        lowered.push_back(low ? low : k);
    }
    if (const char *dump = getenv("DLLM_JIT_DUMP")) {
        size_t ptx_n = 0;
        nvrtcGetPTXSize(prog, &ptx_n);
        std::vector<char> ptx(ptx_n);
        if (ptx_n) nvrtcGetPTX(prog, ptx.data());
        dllm__mkdirs(dump);
        dllm__write_atomic(std::string(dump) + "/" + rq.name + ".ptx", ptx);
        dllm__write_atomic(std::string(dump) + "/" + rq.name + ".cubin", cubin);
    }
    nvrtcDestroyProgram(&prog);
    if (n == 0) return dllm__fail(DLLM_ERR_JIT, "NVRTC produced no cubin for %s (%s)", rq.name.c_str(), rq.target.c_str());
    if (dllm__env_int("DLLM_JIT_FAIL_ON_SPILL", 0) && dllm__log_has_spills(log))
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
    if (dllm__env_int("DLLM_JIT_VERBOSE", 0))
        dllm__log(DLLM_LOG_INFO, "JIT %s for %s: %.0f ms\n%s", rq.name.c_str(), rq.target.c_str(), dllm__now_ms() - t0, log.c_str());
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

/* The modules dllm compiles for one GPU and one head dimension. */
static dllm__jit_request dllm__module_rowwise(const dllm__arch &arch) {
    return {"dllm_rowwise", std::string(dllm__src_common) + dllm__src_rowwise,
            {"embed_gather", "add_rmsnorm", "rope_qkv", "swiglu", "make_uncond", "block_begin", "fill_random_bf16"}, arch.target};
}

static dllm__jit_request dllm__module_sampler(const dllm__arch &arch) {
    return {"dllm_sampler", std::string(dllm__src_common) + dllm__src_sampler, {"conf_partial_kernel", "conf_combine_kernel", "select_commit"}, arch.target};
}

static std::string dllm__attn_kernel_name(int hd, const dllm__arch &a) { return dllm__format("flash_attn<%d,%d,%d,%d>", hd, a.fa_br, a.fa_bc, a.fa_mt); }

static int dllm__attn_threads(const dllm__arch &a) { return a.fa_br * 2 / a.fa_mt; }

static dllm__jit_request dllm__module_attention(const dllm__arch &arch, int head_dim) {
    return {dllm__format("dllm_attn_hd%d_br%d_bc%d_mt%d", head_dim, arch.fa_br, arch.fa_bc, arch.fa_mt),
            std::string(dllm__src_common) + dllm__src_attention, {dllm__attn_kernel_name(head_dim, arch)}, arch.target};
}

static size_t dllm__attn_smem(int hd, int br, int bc) { return (size_t)(br + 4 * bc) * (hd + 8) * 2; }

/* Launches a JIT kernel; args are pointers to the argument values, as for cudaLaunchKernel. */
static dllm_status dllm__launch(cudaKernel_t k, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void **args, const char *name) {
    cudaError_t e = cudaLaunchKernel((const void *)k, grid, block, args, smem, stream);
    if (e != cudaSuccess) return dllm__cuda_fail(e, name);
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 14. GPU: cuBLASLt GEMMs
//     Row-major Y[M x N] = X[M x K] . W[N x K]^T is cuBLAS's column-major Y^T = W^T(op T) . X^T: m = N,
//     n = M, k = K, A = W with TRANSA = T, B = X. BF16 in, FP32 accumulate, BF16 or FP32 out. The
//     algorithm is chosen once per (M, N, K, out type) and cached.
// ---------------------------------------------------------------------------------------------------

/* Split-K algorithms are dropped: their partial-sum reduction makes a row's bits depend on the
 * problem split (and, for in-place reduction, on timing). Every dllm GEMM is deterministic. */
static int dllm__drop_split_k(cublasLtMatmulHeuristicResult_t *res, int found) {
    int kept = 0;
    for (int i = 0; i < found; i++) {
        int splits = 1;
        size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits, &written);
        if (res[i].state == CUBLAS_STATUS_SUCCESS && splits <= 1) res[kept++] = res[i];
    }
    return kept;
}

struct dllm__gemm_plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
    ~dllm__gemm_plan() {
        if (desc) cublasLtMatmulDescDestroy(desc);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (c) cublasLtMatrixLayoutDestroy(c);
    }
};

struct dllm__gemm {
    cublasLtHandle_t handle = nullptr;
    dllm__dbuf workspace;
    std::unordered_map<std::string, std::unique_ptr<dllm__gemm_plan>> plans;
    static const size_t workspace_bytes = 32u << 20;  // Hopper kernels want up to 32 MiB

    ~dllm__gemm() {
        plans.clear();
        if (handle) cublasLtDestroy(handle);
    }
    dllm_status init() {
        DLLM__CUBLAS(cublasLtCreate(&handle));
        return workspace.fit(workspace_bytes, "the cuBLASLt workspace");
    }
    /* Descriptors and the algorithm for one shape. The first call times cuBLASLt's best candidates on
     * the real operands and keeps the fastest (the heuristic's first pick is often a few % slower). */
    dllm_status describe(dllm__gemm_plan &p, int M, int N, int K, cudaDataType_t out_type) {
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        DLLM__CUBLAS(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        DLLM__CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        DLLM__CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        DLLM__CUBLAS(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, K, N, K));
        DLLM__CUBLAS(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, K));
        DLLM__CUBLAS(cublasLtMatrixLayoutCreate(&p.c, out_type, N, M, N));
        return DLLM_OK;
    }
    dllm_status plan(const void *X, const void *W, void *Y, int M, int N, int K, cudaDataType_t out_type, cudaStream_t stream,
                     dllm__gemm_plan *&out, bool tune) {
        std::string key = dllm__format("%s%d,%d,%d,%d", tune ? "" : "h:", M, N, K, (int)out_type);
        auto it = plans.find(key);
        if (it != plans.end()) { out = it->second.get(); return DLLM_OK; }
        std::unique_ptr<dllm__gemm_plan> p(new dllm__gemm_plan);
        DLLM__TRY(describe(*p, M, N, K, out_type));
        cublasLtMatmulPreference_t pref;
        DLLM__CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = workspace_bytes;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        cublasLtMatmulHeuristicResult_t res[16];
        int found = 0;
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->a, p->b, p->c, p->c, pref, 16, res, &found);
        cublasLtMatmulPreferenceDestroy(pref);
        if (s != CUBLAS_STATUS_SUCCESS || found == 0)
            return dllm__fail(DLLM_ERR_CUDA, "cuBLASLt has no BF16 GEMM algorithm for M=%d N=%d K=%d (status %d)", M, N, K, (int)s);
        found = dllm__drop_split_k(res, found);
        if (found == 0) return dllm__fail(DLLM_ERR_CUDA, "cuBLASLt offers only split-K algorithms for M=%d N=%d K=%d", M, N, K);
        p->algo = res[0].algo;
        if (tune && found > 1 && dllm__env_int("DLLM_GEMM_AUTOTUNE", 1)) DLLM__TRY(fastest(*p, res, found, X, W, Y, stream));
        out = p.get();
        plans[key] = std::move(p);
        return DLLM_OK;
    }
    dllm_status fastest(dllm__gemm_plan &p, const cublasLtMatmulHeuristicResult_t *res, int found, const void *X, const void *W, void *Y,
                        cudaStream_t stream) {
        cudaEvent_t t0, t1;
        DLLM__CUDA(cudaEventCreate(&t0));
        DLLM__CUDA(cudaEventCreate(&t1));
        float best = INFINITY;
        const float alpha = 1.0f, beta = 0.0f;
        for (int i = 0; i < found; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
            float total = 0;
            bool ok = true;
            for (int rep = 0; rep < 4 && ok; rep++) {  // the first run warms up and is not counted
                cudaEventRecord(t0, stream);
                ok = cublasLtMatmul(handle, p.desc, &alpha, W, p.a, X, p.b, &beta, Y, p.c, Y, p.c, &res[i].algo, workspace.ptr,
                                    workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
                cudaEventRecord(t1, stream);
                float ms = 0;
                ok = ok && cudaEventSynchronize(t1) == cudaSuccess && cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess;
                if (rep) total += ms;
            }
            if (ok && total < best) { best = total; p.algo = res[i].algo; }
        }
        cudaEventDestroy(t0);
        cudaEventDestroy(t1);
        cudaGetLastError();
        return DLLM_OK;
    }
    /* Row-independent GEMM: whatever M is, the algorithm is the one the heuristic picks for M = pin_m
     * (split-K excluded, no timing), so the bits of a row never depend on how many rows are computed.
     * LaCache computes some rows alone that the plain path computes among all (lacache.md 2). */
    dllm_status run_pinned(const void *X, const void *W, void *Y, int M, int N, int K, cudaDataType_t out_type, cudaStream_t stream) {
        const int pin_m = 256;
        std::string key = dllm__format("pin:%d,%d,%d,%d", M, N, K, (int)out_type);
        auto it = plans.find(key);
        if (it == plans.end()) {
            dllm__gemm_plan *ref;
            DLLM__TRY(plan(nullptr, nullptr, nullptr, pin_m, N, K, out_type, stream, ref, false));
            std::unique_ptr<dllm__gemm_plan> pinned(new dllm__gemm_plan);
            DLLM__TRY(describe(*pinned, M, N, K, out_type));
            pinned->algo = ref->algo;
            cublasLtMatmulHeuristicResult_t check;
            if (cublasLtMatmulAlgoCheck(handle, pinned->desc, pinned->a, pinned->b, pinned->c, pinned->c, &pinned->algo, &check) != CUBLAS_STATUS_SUCCESS)
                return dllm__fail(DLLM_ERR_CUDA, "the pinned GEMM algorithm (chosen at M=%d) does not run at M=%d N=%d K=%d", pin_m, M, N, K);
            it = plans.emplace(key, std::move(pinned)).first;
        }
        return launch(*it->second, X, W, Y, stream);
    }
    /* Y[M x N] = X[M x K] . W[N x K]^T. */
    dllm_status run(const void *X, const void *W, void *Y, int M, int N, int K, cudaDataType_t out_type, cudaStream_t stream) {
        dllm__gemm_plan *p;
        DLLM__TRY(plan(X, W, Y, M, N, K, out_type, stream, p, true));
        return launch(*p, X, W, Y, stream);
    }
    dllm_status launch(const dllm__gemm_plan &p, const void *X, const void *W, void *Y, cudaStream_t stream) {
        const float alpha = 1.0f, beta = 0.0f;
        DLLM__CUBLAS(cublasLtMatmul(handle, p.desc, &alpha, W, p.a, X, p.b, &beta, Y, p.c, Y, p.c, &p.algo, workspace.ptr,
                                    workspace_bytes, stream));
        return DLLM_OK;
    }
};

// ---------------------------------------------------------------------------------------------------
// 15. GPU backend: weights, forward, sampler, step graphs
//     Weights are BF16 with the projections fused (Q|K|V rows, gate|up rows); norms, biases and RoPE
//     tables stay fp32. The residual stream is fp32. One denoising step (forward, LM head, confidence,
//     top-k commit) is captured once as a CUDA graph and replayed: the step counter, the block bounds and
//     the canvas live on the device, so the host issues one launch per step and never copies logits.
// ---------------------------------------------------------------------------------------------------

static inline uint16_t dllm__f32_to_bf16(float f) {  // round to nearest even; twin of the PTX cvt.rn
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

struct dllm__gpu_layer {
    dllm__dbuf w_qkv, w_o, w_gu, w_down;      // bf16 [out, in]
    dllm__dbuf attn_norm, ffn_norm, b_qkv;    // fp32
};



/* Optional per-stage timing of the forward (benchmarks): an event after each stage, named. */
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
    std::vector<std::pair<std::string, double>> totals() const {
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

static const int dllm__lm_chunk_rows = 256;   // LM head rows per GEMM: bounds the logits buffer

/* How layer 0 runs (see dllm__gpu_backend::layer0_attention). */
enum dllm__layer0 { DLLM__L0_PLAIN, DLLM__L0_FILL, DLLM__L0_REUSE };

class dllm__gpu_backend : public dllm__backend_impl {
  public:
    static dllm_status create(const dllm_model &m, const dllm_ctx_params &p, int max_tokens, std::unique_ptr<dllm__backend_impl> &out) {
        std::unique_ptr<dllm__gpu_backend> g(new dllm__gpu_backend(m, max_tokens));
        DLLM__TRY(g->init(p.device));
        out = std::move(g);
        return DLLM_OK;
    }
    ~dllm__gpu_backend() override {
        if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
        if (stream_) cudaStreamDestroy(stream_);
        if (host_pinned_) cudaFreeHost(host_pinned_);
    }

    dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) override;
    dllm_status begin(dllm__decode &st) override;
    dllm_status begin_block(dllm__decode &st) override;
    dllm_status step(dllm__decode &st, std::vector<int32_t> &committed, bool want_host) override;
    dllm_status finish(dllm__decode &st) override;

    const dllm__arch &arch() const { return arch_; }
    cudaStream_t stream() const { return stream_; }
    void set_timer(dllm__stage_timer *t) { timer_ = t; }
    /* Benchmarks: one eager step with every stage timed. */
    dllm_status profile_step(const dllm__decode &st, dllm__stage_timer &t) {
        timer_ = &t;
        dllm_status s = run_step(st);
        timer_ = nullptr;
        return s;
    }
    /* Tests: record the logits the sampler sees at each (global step, block position), cond then uncond
     * rows (eager steps only: set DLLM_NO_GRAPHS). */
    void set_debug_rows(std::map<std::pair<int, int>, std::vector<float>> *rows) { debug_rows_ = rows; }
    /* One forward over batch x seq tokens of ids_dev; final norm on the output rows [raw0, raw1). */
    dllm_status forward(int batch, int seq, const int *ids_dev, int raw0, int raw1, dllm__layer0 mode = DLLM__L0_PLAIN, int b0 = 0, int b1 = 0);
    /* LM head for output rows [raw0 + c0, raw0 + c0 + rows) of every batch entry into logits [batch][rows][V]. */
    dllm_status lm_head(int batch, int raw_rows, int c0, int rows);
    /* A single plain forward of ids[0..n) (no block, so tiles in plain order), for dllm_logits and benchmarks. */
    dllm_status prepare_forward(const int32_t *ids, int n, int raw_rows);
    /* The forward prepared above with the LM head over output rows [raw0, raw1) in chunks; on_chunk(c0, rows)
     * runs (on the host, stream-ordered) after each chunk's logits are in the logits buffer. */
    template <class F>
    dllm_status forward_logits(int n, int raw0, int raw1, F &&on_chunk) {
        DLLM__TRY(forward(1, n, canvas_.as<int>(), raw0, raw1));
        for (int c0 = 0; c0 < raw1 - raw0; c0 += dllm__lm_chunk_rows) {
            int rows = std::min(dllm__lm_chunk_rows, raw1 - raw0 - c0);
            DLLM__TRY(lm_head(1, raw1 - raw0, c0, rows));
            mark("lm head");
            DLLM__TRY(on_chunk(c0, rows));
        }
        return DLLM_OK;
    }

  private:
    dllm__gpu_backend(const dllm_model &m, int max_tokens) : m_(m), max_tokens_(max_tokens) {}
    dllm_status init(int device);
    dllm_status upload_weights();
    dllm_status random_weights();
    dllm_status fit_buffers(int batch, int seq, int lm_rows, bool lacache = false);
    dllm_status load_kernels();
    dllm_status run_step(const dllm__decode &st);
    dllm_status capture_step(const dllm__decode &st);
    dllm_status sample_rows(const dllm__decode &st, int batch, int cp0, int raw_rows, int s0, int s1);
    dllm_status attention(int batch, int seq, const void *qkv, void *out, int fa_mode);
    dllm_status add_norm(const float *h_in, float *h_out, const void *delta, const void *w, void *y, int batch, int seq, int row0, int n_rows);
    dllm_status rope(void *qkv, const void *bias, int n_rows, int seq_len, int pos0);
    dllm_status layer0_attention(int batch, int seq, const int *ids, dllm__layer0 mode, int b0, int b1);
    std::string graph_key(const dllm__decode &st) const;

    const dllm_model &m_;
    int max_tokens_;
    int device_ = 0;
    dllm__arch arch_ = {};
    cudaStream_t stream_ = nullptr;
    dllm__gemm gemm_;
    std::shared_ptr<dllm__module> rowwise_, sampler_, attn_;
    cudaKernel_t k_embed_, k_norm_, k_rope_, k_swiglu_, k_uncond_, k_block_, k_fill_, k_partial_, k_combine_, k_select_, k_attn_;

    // weights
    dllm__dbuf embed_, head_, final_norm_, rope_cos_, rope_sin_;
    std::vector<dllm__gpu_layer> layers_;
    bool tied_ = false;

    // activations, grown to the largest (batch, seq) seen
    dllm__dbuf h_, a_, qkv_, att_, delta_, gu_, f_, y_, logits_, partials_, x0_, conf_, deferred_;
    dllm__dbuf canvas_, is_prompt_, state_, committed_;
    dllm__dbuf h0_, qkv0_, fa_state_;  // LaCache: layer 0's embeddings, rotated Q/K/V and attention state
    void *host_pinned_ = nullptr;  // canvas + committed list + state for the step callback
    size_t host_pinned_bytes_ = 0;

    // the captured step
    cudaGraphExec_t graph_exec_ = nullptr;
    std::string graph_key_, warmed_key_;
    dllm__stage_timer *timer_ = nullptr;
    std::map<std::pair<int, int>, std::vector<float>> *debug_rows_ = nullptr;
    dllm_status record_rows(const dllm__decode &st, int batch, int cp0, int raw_rows, int s0, int s1);
    void mark(const char *stage) {
        if (timer_) timer_->mark(stage, stream_);
    }
    int buffer_generation_ = 0;
};

/* Host mirrors of the device argument structs (same members, same order, so the same layout). */
struct dllm__sampler_args {
    const void *cond, *uncond;
    float cfg_weight;
    int vocab, slice, n_slices, n_rows, pos0, lrow0, shift0, raw_rows;
    double temperature;
    uint64_t seed;
    int eos_inf, eos_id, eot_id, defer_eos_eot, random_remask;
};

struct dllm__attn_args {
    const void *q, *k, *v;
    void *o;
    const unsigned char *key_valid;
    int seq, q_stride, kv_stride, o_stride, group;
    const void *state;
    float scale_log2;
    int fa_mode;
    float *fa_state;
};

static const size_t dllm__conf_partial_bytes = 32;  // sizeof(conf_partial) on the device

static const int dllm__vocab_slice = 8192;    // vocabulary entries per sampler CTA

dllm_status dllm__gpu_backend::init(int device) {
    const dllm__config &c = m_.cfg;
    if (c.scale_logits) return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend does not implement scale_logits; use the CPU backend");
    if (c.head_dim != 64 && c.head_dim != 128)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend supports head dimensions 64 and 128, this model has %d", c.head_dim);
    if (c.n_embd % 8 || c.n_ff % 8 || c.n_vocab % 8)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend needs hidden (%d), MLP (%d) and vocabulary (%d) sizes divisible by 8", c.n_embd, c.n_ff, c.n_vocab);
    device_ = device;
    DLLM__CUDA(cudaSetDevice(device));
    cudaDeviceProp prop;
    DLLM__CUDA(cudaGetDeviceProperties(&prop, device));
    arch_ = dllm__arch_for(prop.major * 10 + prop.minor);
    if (arch_.cc < 80) return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s has compute capability %d.%d; dllm needs 8.0 or newer", prop.name, prop.major, prop.minor);
    DLLM__CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DLLM__TRY(gemm_.init());
    DLLM__TRY(load_kernels());
    DLLM__TRY(m_.random_weights ? random_weights() : upload_weights());
    std::vector<float> cos_t, sin_t;
    dllm__rope_tables(c.rope_theta, c.head_dim, max_tokens_, cos_t, sin_t);
    DLLM__TRY(rope_cos_.fit(cos_t.size() * 4, "RoPE tables"));
    DLLM__TRY(rope_sin_.fit(sin_t.size() * 4, "RoPE tables"));
    DLLM__CUDA(cudaMemcpy(rope_cos_.ptr, cos_t.data(), cos_t.size() * 4, cudaMemcpyHostToDevice));
    DLLM__CUDA(cudaMemcpy(rope_sin_.ptr, sin_t.data(), sin_t.size() * 4, cudaMemcpyHostToDevice));
    dllm__log(DLLM_LOG_INFO, "GPU backend on %s (sm_%d, %d SMs): attention tile %dx%d", prop.name, arch_.cc, prop.multiProcessorCount, arch_.fa_br, arch_.fa_bc);
    return DLLM_OK;
}

/* The three modules compile in parallel: cold JIT time is the slowest one, not the sum. */
dllm_status dllm__gpu_backend::load_kernels() {
    dllm__jit_request rq[3] = {dllm__module_rowwise(arch_), dllm__module_sampler(arch_), dllm__module_attention(arch_, m_.cfg.head_dim)};
    std::shared_ptr<dllm__module> *dst[3] = {&rowwise_, &sampler_, &attn_};
    dllm_status st[3];
    std::string err[3];
    std::vector<std::thread> workers;
    for (int i = 0; i < 3; i++)
        workers.emplace_back([&, i] {
            cudaSetDevice(device_);
            st[i] = dllm__jit_load(rq[i], *dst[i]);
            if (st[i] != DLLM_OK) err[i] = dllm__tls_error;
        });
    for (std::thread &t : workers) t.join();
    for (int i = 0; i < 3; i++)
        if (st[i] != DLLM_OK) return dllm__fail(st[i], "%s", err[i].c_str());
    auto &R = rowwise_->kernels, &S = sampler_->kernels;
    k_embed_ = R["embed_gather"]; k_norm_ = R["add_rmsnorm"]; k_rope_ = R["rope_qkv"]; k_swiglu_ = R["swiglu"];
    k_uncond_ = R["make_uncond"]; k_block_ = R["block_begin"]; k_fill_ = R["fill_random_bf16"];
    k_partial_ = S["conf_partial_kernel"]; k_combine_ = S["conf_combine_kernel"]; k_select_ = S["select_commit"];
    k_attn_ = attn_->kernels[dllm__attn_kernel_name(m_.cfg.head_dim, arch_)];
    DLLM__CUDA(cudaFuncSetAttribute((const void *)k_attn_, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dllm__attn_smem(m_.cfg.head_dim, arch_.fa_br, arch_.fa_bc)));
    return DLLM_OK;
}

/* Copies rows of host tensors (any float dtype) into one bf16 device matrix, in order. */
static dllm_status dllm__upload_rows(dllm__dbuf &dst, std::initializer_list<const dllm__tensor *> parts, const char *what) {
    size_t n = 0;
    for (const dllm__tensor *t : parts) n += (size_t)t->numel;
    DLLM__TRY(dst.fit(n * 2, what));
    std::vector<uint16_t> host(n);
    size_t at = 0;
    for (const dllm__tensor *t : parts) {
        if (t->dtype == DLLM__BF16) memcpy(host.data() + at, t->data, t->nbytes);
        else for (int64_t i = 0; i < t->numel; i++) host[at + (size_t)i] = dllm__f32_to_bf16(dllm__tensor_at(*t, i));
        at += (size_t)t->numel;
    }
    DLLM__CUDA(cudaMemcpy(dst.ptr, host.data(), n * 2, cudaMemcpyHostToDevice));
    return DLLM_OK;
}

static dllm_status dllm__upload_f32(dllm__dbuf &dst, const std::vector<float> &v, const char *what) {
    if (v.empty()) return DLLM_OK;
    DLLM__TRY(dst.fit(v.size() * 4, what));
    DLLM__CUDA(cudaMemcpy(dst.ptr, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::upload_weights() {
    layers_.resize(m_.layers.size());
    for (size_t l = 0; l < m_.layers.size(); l++) {
        const dllm__layer_weights &L = m_.layers[l];
        dllm__gpu_layer &G = layers_[l];
        DLLM__TRY(dllm__upload_rows(G.w_qkv, {L.wq, L.wk, L.wv}, "attention weights"));
        DLLM__TRY(dllm__upload_rows(G.w_o, {L.wo}, "attention weights"));
        DLLM__TRY(dllm__upload_rows(G.w_gu, {L.gate, L.up}, "MLP weights"));
        DLLM__TRY(dllm__upload_rows(G.w_down, {L.down}, "MLP weights"));
        DLLM__TRY(dllm__upload_f32(G.attn_norm, L.attn_norm, "norm weights"));
        DLLM__TRY(dllm__upload_f32(G.ffn_norm, L.ffn_norm, "norm weights"));
        if (!L.bq.empty()) {
            std::vector<float> b(L.bq);
            b.insert(b.end(), L.bk.begin(), L.bk.end());
            b.insert(b.end(), L.bv.begin(), L.bv.end());
            DLLM__TRY(dllm__upload_f32(G.b_qkv, b, "attention biases"));
        }
    }
    DLLM__TRY(dllm__upload_rows(embed_, {m_.embed}, "the embedding table"));
    tied_ = m_.head == m_.embed;
    if (!tied_) DLLM__TRY(dllm__upload_rows(head_, {m_.head}, "the LM head"));
    return dllm__upload_f32(final_norm_, m_.final_norm, "norm weights");
}

/* Benchmark weights generated on the device (no file, no host copy): uniform with the torch
 * reference's scale (std 0.02), norms 1. */
dllm_status dllm__gpu_backend::random_weights() {
    const dllm__config &c = m_.cfg;
    const size_t d = (size_t)c.n_embd, qkv = (size_t)(c.n_head + 2 * c.n_head_kv) * c.head_dim, q = (size_t)c.n_head * c.head_dim;
    uint64_t seed = m_.random_seed;
    auto fill = [&](dllm__dbuf &b, size_t n, float scale, int constant, const char *what, bool bf16) -> dllm_status {
        DLLM__TRY(b.fit(n * (bf16 ? 2 : 4), what));
        if (!bf16) {
            std::vector<float> v(n, scale);
            DLLM__CUDA(cudaMemcpy(b.ptr, v.data(), n * 4, cudaMemcpyHostToDevice));
            return DLLM_OK;
        }
        uint64_t nn = n, s = seed++;
        void *args[] = {&b.ptr, &nn, &s, &scale, &constant};
        return dllm__launch(k_fill_, dim3(1024), dim3(256), 0, stream_, args, "fill_random_bf16");
    };
    const float w = 0.0346f;  // uniform(-a, a) with std 0.02
    layers_.resize((size_t)c.n_layer);
    for (dllm__gpu_layer &G : layers_) {
        DLLM__TRY(fill(G.w_qkv, qkv * d, w, 0, "attention weights", true));
        DLLM__TRY(fill(G.w_o, d * q, w, 0, "attention weights", true));
        DLLM__TRY(fill(G.w_gu, 2 * (size_t)c.n_ff * d, w, 0, "MLP weights", true));
        DLLM__TRY(fill(G.w_down, d * c.n_ff, w, 0, "MLP weights", true));
        DLLM__TRY(fill(G.attn_norm, d, 1.0f, 1, "norm weights", false));
        DLLM__TRY(fill(G.ffn_norm, d, 1.0f, 1, "norm weights", false));
        if (c.qkv_bias) DLLM__TRY(fill(G.b_qkv, qkv, 0.0f, 1, "attention biases", false));
    }
    DLLM__TRY(fill(embed_, (size_t)c.n_vocab * d, w, 0, "the embedding table", true));
    tied_ = c.tied_embeddings;
    if (!tied_) DLLM__TRY(fill(head_, (size_t)c.n_vocab * d, w, 0, "the LM head", true));
    DLLM__TRY(fill(final_norm_, d, 1.0f, 1, "norm weights", false));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::fit_buffers(int batch, int seq, int lm_rows, bool lacache) {
    const dllm__config &c = m_.cfg;
    const size_t M = (size_t)batch * seq, d = (size_t)c.n_embd, qkv = (size_t)(c.n_head + 2 * c.n_head_kv) * c.head_dim;
    const size_t q = (size_t)c.n_head * c.head_dim, ff = (size_t)c.n_ff, rows = (size_t)batch * lm_rows;
    const size_t slices = ((size_t)c.n_vocab + dllm__vocab_slice - 1) / dllm__vocab_slice;
    // Growing a buffer moves it: a captured graph pointing into the old one must be re-captured.
    const void *before[] = {h_.ptr, a_.ptr, delta_.ptr, qkv_.ptr, att_.ptr, gu_.ptr, f_.ptr, y_.ptr, logits_.ptr, partials_.ptr,
                            x0_.ptr, conf_.ptr, deferred_.ptr, canvas_.ptr, is_prompt_.ptr, state_.ptr, committed_.ptr,
                            h0_.ptr, qkv0_.ptr, fa_state_.ptr};
    DLLM__TRY(h_.fit(M * d * 4, "the residual stream"));
    DLLM__TRY(a_.fit(M * d * 2, "activations"));
    DLLM__TRY(delta_.fit(M * d * 2, "activations"));
    DLLM__TRY(qkv_.fit(M * qkv * 2, "Q/K/V"));
    DLLM__TRY(att_.fit(M * q * 2, "attention output"));
    DLLM__TRY(gu_.fit(M * 2 * ff * 2, "MLP activations"));
    DLLM__TRY(f_.fit(M * ff * 2, "MLP activations"));
    DLLM__TRY(y_.fit(M * d * 2, "final norm output"));
    DLLM__TRY(logits_.fit(rows * c.n_vocab * 4, "logits"));
    DLLM__TRY(partials_.fit((size_t)lm_rows * slices * dllm__conf_partial_bytes, "sampler partials"));
    DLLM__TRY(x0_.fit((size_t)seq * 4, "sampler output"));
    DLLM__TRY(conf_.fit((size_t)seq * 8, "sampler output"));
    DLLM__TRY(deferred_.fit((size_t)seq, "sampler output"));
    DLLM__TRY(canvas_.fit(M * 4, "the canvas"));
    DLLM__TRY(is_prompt_.fit((size_t)seq, "the canvas"));
    DLLM__TRY(state_.fit(64, "the step state"));
    DLLM__TRY(committed_.fit((size_t)seq * 4, "the step state"));
    if (lacache) {
        const int q_tiles = (seq + arch_.fa_br - 1) / arch_.fa_br, fields = arch_.fa_mt * (4 + c.head_dim / 2);
        DLLM__TRY(h0_.fit(M * d * 4, "the LaCache embeddings"));
        DLLM__TRY(qkv0_.fit(M * qkv * 2, "the LaCache Q/K/V"));
        DLLM__TRY(fa_state_.fit((size_t)batch * c.n_head * q_tiles * fields * dllm__attn_threads(arch_) * 4, "the LaCache attention state"));
    }
    size_t pinned = (size_t)seq * 8 + 64;
    if (pinned > host_pinned_bytes_) {
        if (host_pinned_) cudaFreeHost(host_pinned_);
        host_pinned_ = nullptr;
        DLLM__CUDA(cudaMallocHost(&host_pinned_, pinned));
        host_pinned_bytes_ = pinned;
    }
    const void *after[] = {h_.ptr, a_.ptr, delta_.ptr, qkv_.ptr, att_.ptr, gu_.ptr, f_.ptr, y_.ptr, logits_.ptr, partials_.ptr,
                           x0_.ptr, conf_.ptr, deferred_.ptr, canvas_.ptr, is_prompt_.ptr, state_.ptr, committed_.ptr,
                           h0_.ptr, qkv0_.ptr, fa_state_.ptr};
    if (memcmp(before, after, sizeof before) != 0) buffer_generation_++;
    return DLLM_OK;
}

/* Attention over the fused projection rows; the KV tiles that overlap the current block (read from the
 * device step state) are visited last. */
dllm_status dllm__gpu_backend::attention(int batch, int seq, const void *qkv, void *out, int fa_mode) {
    const dllm__config &c = m_.cfg;
    const int hd = c.head_dim, stride = (c.n_head + 2 * c.n_head_kv) * hd;
    dllm__attn_args args = {qkv, (const char *)qkv + (size_t)c.n_head * hd * 2, (const char *)qkv + (size_t)(c.n_head + c.n_head_kv) * hd * 2,
                            out, nullptr, seq, stride, stride, c.n_head * hd, c.n_head / c.n_head_kv, state_.ptr,
                            1.4426950408889634f / sqrtf((float)hd), fa_mode, fa_state_.as<float>()};
    void *argv[] = {&args};
    dim3 grid((unsigned)((seq + arch_.fa_br - 1) / arch_.fa_br), (unsigned)c.n_head, (unsigned)batch);
    return dllm__launch(k_attn_, grid, dim3((unsigned)dllm__attn_threads(arch_)), dllm__attn_smem(hd, arch_.fa_br, arch_.fa_bc), stream_, argv, "flash_attn");
}

/* Residual add + RMSNorm over n_rows rows from row0 of each sequence (h_in -> h_out, see the kernel). */
dllm_status dllm__gpu_backend::add_norm(const float *h_in, float *h_out, const void *delta, const void *w, void *y, int batch, int seq,
                                        int row0, int n_rows) {
    const dllm__config &c = m_.cfg;
    int d = c.n_embd;
    float eps = c.norm_eps;
    void *args[] = {&h_in, &h_out, &delta, &w, &eps, &y, &d, &n_rows, &row0, &seq};
    const unsigned threads = (unsigned)std::min(1024, std::max(32, (d / 8 + 31) / 32 * 32));  // one 16-byte chunk each
    return dllm__launch(k_norm_, dim3((unsigned)n_rows, (unsigned)batch), dim3(threads), 0, stream_, args, "add_rmsnorm");
}

/* Bias + RoPE on rows [0, n_rows) of qkv whose positions are pos0 + (row % seq_len). */
dllm_status dllm__gpu_backend::rope(void *qkv, const void *bias, int n_rows, int seq_len, int pos0) {
    const dllm__config &c = m_.cfg;
    int n_head = c.n_head, n_kv = c.n_head_kv, hd = c.head_dim;
    unsigned threads = (unsigned)((size_t)n_rows * (n_head + (bias ? 2 : 1) * n_kv) * (hd / 8));
    void *args[] = {&qkv, &n_rows, &seq_len, &pos0, &n_head, &n_kv, &hd, &bias, &rope_cos_.ptr, &rope_sin_.ptr};
    return dllm__launch(k_rope_, dim3((threads + 255) / 256), dim3(256), 0, stream_, args, "rope_qkv");
}

/* Layer 0 up to its attention output (att_), in one of three ways (LaCache's EmbedCache, RoPECache and
 * FACache, lacache.md 1):
 *   PLAIN: every row, in the shared buffers;
 *   FILL (a block's first step): every row, keeping embeddings (h0_), rotated Q/K/V (qkv0_) and the
 *         attention state of the query tiles outside the block (fa_state_);
 *   REUSE (the block's later steps): embed, norm, project and rotate the block's rows only, and resume the
 *         attention of the outside query tiles from their saved state.
 * The QKV GEMM is row-independent (run_pinned), so the rows REUSE computes alone carry the same bits as
 * when PLAIN computes them among all rows. */
dllm_status dllm__gpu_backend::layer0_attention(int batch, int seq, const int *ids, dllm__layer0 mode, int b0, int b1) {
    const dllm__config &c = m_.cfg;
    const int d = c.n_embd, qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim, M = batch * seq;
    const dllm__gpu_layer &L = layers_[0];
    float *h = mode == DLLM__L0_PLAIN ? h_.as<float>() : h0_.as<float>();
    void *qkv_buf = mode == DLLM__L0_PLAIN ? qkv_.ptr : qkv0_.ptr;
    if (mode != DLLM__L0_REUSE) {
        int M_ = M;
        void *args[] = {&ids, &M_, &embed_.ptr, (void *)&d, &h};
        DLLM__TRY(dllm__launch(k_embed_, dim3((unsigned)M), dim3(256), 0, stream_, args, "embed_gather"));
        DLLM__TRY(add_norm(h, nullptr, nullptr, L.attn_norm.ptr, a_.ptr, batch, seq, 0, seq));
        mark("L0 embed+norm");
        DLLM__TRY(gemm_.run_pinned(a_.ptr, L.w_qkv.ptr, qkv_buf, M, qkv, d, CUDA_R_16BF, stream_));
        mark("L0 gemm qkv");
        DLLM__TRY(rope(qkv_buf, L.b_qkv.ptr, M, seq, 0));
        mark("L0 rope");
    } else {
        const int blk = b1 - b0;
        for (int b = 0; b < batch; b++) {
            const int *ids_b = ids + (size_t)b * seq + b0;
            float *h_b = h + ((size_t)b * seq + b0) * d;
            int blk_ = blk;
            void *args[] = {&ids_b, &blk_, &embed_.ptr, (void *)&d, &h_b};
            DLLM__TRY(dllm__launch(k_embed_, dim3((unsigned)blk), dim3(256), 0, stream_, args, "embed_gather"));
        }
        DLLM__TRY(add_norm(h, nullptr, nullptr, L.attn_norm.ptr, a_.ptr, batch, seq, b0, blk));
        mark("L0 embed+norm");
        for (int b = 0; b < batch; b++) {
            char *out = (char *)qkv0_.ptr + ((size_t)b * seq + b0) * qkv * 2;
            DLLM__TRY(gemm_.run_pinned((const char *)a_.ptr + (size_t)b * blk * d * 2, L.w_qkv.ptr, out, blk, qkv, d, CUDA_R_16BF, stream_));
        }
        mark("L0 gemm qkv");
        for (int b = 0; b < batch; b++)
            DLLM__TRY(rope((char *)qkv0_.ptr + ((size_t)b * seq + b0) * qkv * 2, L.b_qkv.ptr, blk, blk, b0));
        mark("L0 rope");
    }
    DLLM__TRY(attention(batch, seq, qkv_buf, att_.ptr, mode == DLLM__L0_PLAIN ? 0 : mode == DLLM__L0_FILL ? 1 : 2));
    mark("L0 attention");
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::forward(int batch, int seq, const int *ids_dev, int raw0, int raw1, dllm__layer0 mode, int b0, int b1) {
    const dllm__config &c = m_.cfg;
    const int M = batch * seq, d = c.n_embd, hd = c.head_dim, qkv = (c.n_head + 2 * c.n_head_kv) * hd, ff = c.n_ff;
    mark("start");
    DLLM__TRY(layer0_attention(batch, seq, ids_dev, mode, b0, b1));
    const float *h_in = mode == DLLM__L0_PLAIN ? h_.as<float>() : h0_.as<float>();  // layer 0's residual input
    for (size_t l = 0; l < layers_.size(); l++) {
        dllm__gpu_layer &L = layers_[l];
        if (l > 0) {
            DLLM__TRY(gemm_.run(a_.ptr, L.w_qkv.ptr, qkv_.ptr, M, qkv, d, CUDA_R_16BF, stream_));
            mark("gemm qkv");
            DLLM__TRY(rope(qkv_.ptr, L.b_qkv.ptr, M, seq, 0));
            mark("rope");
            DLLM__TRY(attention(batch, seq, qkv_.ptr, att_.ptr, 0));
            mark("attention");
        }
        DLLM__TRY(gemm_.run(att_.ptr, L.w_o.ptr, delta_.ptr, M, d, c.n_head * hd, CUDA_R_16BF, stream_));
        mark("gemm o");
        DLLM__TRY(add_norm(l == 0 ? h_in : h_.as<float>(), h_.as<float>(), delta_.ptr, L.ffn_norm.ptr, a_.ptr, batch, seq, 0, seq));
        mark("add+norm");
        DLLM__TRY(gemm_.run(a_.ptr, L.w_gu.ptr, gu_.ptr, M, 2 * ff, d, CUDA_R_16BF, stream_));
        mark("gemm gate+up");
        {
            unsigned n = (unsigned)((size_t)M * ff / 8);
            void *args[] = {&gu_.ptr, &f_.ptr, (void *)&M, (void *)&ff};
            DLLM__TRY(dllm__launch(k_swiglu_, dim3((n + 255) / 256), dim3(256), 0, stream_, args, "swiglu"));
        }
        mark("swiglu");
        DLLM__TRY(gemm_.run(f_.ptr, L.w_down.ptr, delta_.ptr, M, d, ff, CUDA_R_16BF, stream_));
        mark("gemm down");
        const bool last = l + 1 == layers_.size();
        // The last layer's residual is only needed for the output rows (LaCache truncates them).
        if (last) DLLM__TRY(add_norm(h_.as<float>(), h_.as<float>(), delta_.ptr, final_norm_.ptr, y_.ptr, batch, seq, raw0, raw1 - raw0));
        else DLLM__TRY(add_norm(h_.as<float>(), h_.as<float>(), delta_.ptr, layers_[l + 1].attn_norm.ptr, a_.ptr, batch, seq, 0, seq));
        mark("add+norm");
    }
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::lm_head(int batch, int raw_rows, int c0, int rows) {
    const dllm__config &c = m_.cfg;
    const void *W = tied_ ? embed_.ptr : head_.ptr;
    for (int b = 0; b < batch; b++) {
        const char *y = (const char *)y_.ptr + ((size_t)b * raw_rows + c0) * c.n_embd * 2;
        char *out = (char *)logits_.ptr + (size_t)b * rows * c.n_vocab * 4;
        DLLM__TRY(gemm_.run_pinned(y, W, out, rows, c.n_vocab, c.n_embd, CUDA_R_32F, stream_));  // truncation-safe
    }
    return DLLM_OK;
}


dllm_status dllm__gpu_backend::prepare_forward(const int32_t *ids, int n, int raw_rows) {
    DLLM__TRY(fit_buffers(1, n, std::min(raw_rows, dllm__lm_chunk_rows)));
    DLLM__CUDA(cudaMemcpyAsync(canvas_.ptr, ids, (size_t)n * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemsetAsync(state_.ptr, 0, 64, stream_));  // no block: attention visits tiles in plain order
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::logits(const int32_t *ids, int n, int r0, int r1, float *out) {
    const dllm__config &c = m_.cfg;
    const int raw0 = dllm__logit_row(c, r0), raw1 = dllm__logit_row(c, r1 - 1) + 1;
    DLLM__TRY(prepare_forward(ids, n, raw1 - raw0));
    std::vector<float> raw((size_t)(raw1 - raw0) * c.n_vocab);
    DLLM__TRY(forward_logits(n, raw0, raw1, [&](int c0, int rows) -> dllm_status {
        DLLM__CUDA(cudaMemcpyAsync(raw.data() + (size_t)c0 * c.n_vocab, logits_.ptr, (size_t)rows * c.n_vocab * 4, cudaMemcpyDeviceToHost, stream_));
        return DLLM_OK;
    }));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    for (int p = r0; p < r1; p++)
        memcpy(out + (size_t)(p - r0) * c.n_vocab, raw.data() + (size_t)(dllm__logit_row(c, p) - raw0) * c.n_vocab, sizeof(float) * c.n_vocab);
    return DLLM_OK;
}

/* First position that can be a candidate: a [MASK] inside the prompt competes too (reference semantics). */
static int dllm__first_candidate(const dllm__decode &st) {
    for (int p = 0; p < st.n_prompt; p++)
        if (st.canvas[(size_t)p] == st.mask_id) return p;
    return st.n_prompt;
}

dllm_status dllm__gpu_backend::begin(dllm__decode &st) {
    const int n = (int)st.canvas.size(), batch = st.cfg_scale > 0 ? 2 : 1;
    DLLM__TRY(fit_buffers(batch, n, std::min(n, dllm__lm_chunk_rows), st.lacache == DLLM_LACACHE_ON));
    DLLM__CUDA(cudaMemcpyAsync(canvas_.ptr, st.canvas.data(), (size_t)n * 4, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaMemcpyAsync(is_prompt_.ptr, st.is_prompt.data(), (size_t)n, cudaMemcpyHostToDevice, stream_));
    int init[16] = {0};
    init[4] = st.global_step;  // dllm_step_state.global_step
    DLLM__CUDA(cudaMemcpyAsync(state_.ptr, init, sizeof init, cudaMemcpyHostToDevice, stream_));
    DLLM__CUDA(cudaStreamSynchronize(stream_));  // the host arrays may go out of scope
    st.cand_lo = dllm__first_candidate(st);
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::begin_block(dllm__decode &st) {
    int begin = st.block_begin, end = st.block_end, s = st.steps_per_block, mask = st.mask_id;
    void *args[] = {&state_.ptr, &canvas_.ptr, &begin, &end, &s, &mask};
    return dllm__launch(k_block_, dim3(1), dim3(256), 0, stream_, args, "block_begin");
}

/* Samples positions [s0, s1) from the LM head chunk that starts at position cp0 (raw_rows logits rows
 * per batch entry). x0/conf/deferred are indexed by position - cand_lo. */
dllm_status dllm__gpu_backend::sample_rows(const dllm__decode &st, int batch, int cp0, int raw_rows, int s0, int s1) {
    const dllm__config &c = m_.cfg;
    const int slices = (c.n_vocab + dllm__vocab_slice - 1) / dllm__vocab_slice, rows = s1 - s0, off = s0 - st.cand_lo;
    const dllm__sampling &s = st.sampling;
    dllm__sampler_args a = {logits_.ptr, batch == 2 ? (const char *)logits_.ptr + (size_t)raw_rows * c.n_vocab * 4 : nullptr,
                            st.cfg_scale + 1.0f, c.n_vocab, dllm__vocab_slice, slices, rows, s0,
                            dllm__logit_row(c, s0) - dllm__logit_row(c, cp0), c.shift_logits && s0 == 0, raw_rows, s.temperature, s.seed,
                            s.eos_logit_inf, s.eos_id, s.eot_id, s.defer_eos_eot, s.remasking == DLLM_REMASK_RANDOM};
    void *pargs[] = {&a, &state_.ptr, &partials_.ptr};
    DLLM__TRY(dllm__launch(k_partial_, dim3((unsigned)slices, (unsigned)rows), dim3(256), 0, stream_, pargs, "conf_partial_kernel"));
    int *x0 = x0_.as<int>() + off;
    double *conf = conf_.as<double>() + off;
    unsigned char *def = deferred_.as<unsigned char>() + off;
    void *cargs[] = {&a, &state_.ptr, &partials_.ptr, &x0, &conf, &def};
    return dllm__launch(k_combine_, dim3((unsigned)(rows + 127) / 128), dim3(128), 0, stream_, cargs, "conf_combine_kernel");
}

/* One denoising step on the device: forward (both CFG halves), LM head (every row as the reference does,
 * or the candidate rows with LaCache), the sampler over the candidate rows, then the top-k commit.
 * Everything it reads is on the device, so it can be captured once and replayed. */
dllm_status dllm__gpu_backend::run_step(const dllm__decode &st) {
    const dllm__config &c = m_.cfg;
    const int n = (int)st.canvas.size(), batch = st.cfg_scale > 0 ? 2 : 1, mask = st.mask_id;
    if (batch == 2) {
        int *un = canvas_.as<int>() + n;
        void *args[] = {&canvas_.ptr, &is_prompt_.ptr, (void *)&n, (void *)&mask, &un};
        DLLM__TRY(dllm__launch(k_uncond_, dim3((unsigned)(n + 255) / 256), dim3(256), 0, stream_, args, "make_uncond"));
    }
    // Output truncation: only rows that can hold a candidate reach the final norm, the LM head and the
    // sampler (the block, plus the prompt's masks if it has any). The plain path computes every row.
    const bool truncate = st.lacache != DLLM_LACACHE_OFF;
    const int lm_lo = truncate ? (st.cand_lo < st.n_prompt ? st.cand_lo : st.block_begin) : 0, lm_hi = truncate ? st.block_end : n;
    const int raw0 = dllm__logit_row(c, lm_lo), raw1 = dllm__logit_row(c, lm_hi - 1) + 1;
    const dllm__layer0 mode = st.lacache != DLLM_LACACHE_ON ? DLLM__L0_PLAIN : st.step_in_block == 0 ? DLLM__L0_FILL : DLLM__L0_REUSE;
    DLLM__TRY(forward(batch, n, canvas_.as<int>(), raw0, raw1, mode, st.block_begin, st.block_end));
    for (int cp0 = lm_lo; cp0 < lm_hi; cp0 += dllm__lm_chunk_rows) {
        const int cp1 = std::min(lm_hi, cp0 + dllm__lm_chunk_rows);
        const int craw0 = dllm__logit_row(c, cp0), craw1 = dllm__logit_row(c, cp1 - 1) + 1;
        DLLM__TRY(lm_head(batch, raw1 - raw0, craw0 - raw0, craw1 - craw0));
        mark("lm head");
        const int s0 = std::max(cp0, st.cand_lo);
        if (s0 < cp1) DLLM__TRY(sample_rows(st, batch, cp0, craw1 - craw0, s0, cp1));
        mark("sampler");
        if (debug_rows_ && s0 < cp1) DLLM__TRY(record_rows(st, batch, cp0, craw1 - craw0, std::max(s0, st.block_begin), cp1));
    }
    int lo = st.cand_lo;
    void *args[] = {&canvas_.ptr, &state_.ptr, &lo, &lo, &x0_.ptr, &conf_.ptr, &deferred_.ptr, (void *)&mask, &committed_.ptr};
    DLLM__TRY(dllm__launch(k_select_, dim3(1), dim3(1024), (size_t)(n - lo), stream_, args, "select_commit"));
    mark("select");
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::record_rows(const dllm__decode &st, int batch, int cp0, int raw_rows, int s0, int s1) {
    const dllm__config &c = m_.cfg;
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    for (int p = s0; p < s1; p++) {
        std::vector<float> &row = (*debug_rows_)[{st.global_step, p}];
        row.resize((size_t)batch * c.n_vocab);
        for (int b = 0; b < batch; b++) {
            size_t lr = (size_t)b * raw_rows + (size_t)(dllm__logit_row(c, p) - dllm__logit_row(c, cp0));
            DLLM__CUDA(cudaMemcpy(row.data() + (size_t)b * c.n_vocab, (const float *)logits_.ptr + lr * c.n_vocab, (size_t)c.n_vocab * 4,
                                  cudaMemcpyDeviceToHost));
        }
    }
    return DLLM_OK;
}

/* Everything a captured step graph baked in: a different key means a new capture. */
std::string dllm__gpu_backend::graph_key(const dllm__decode &st) const {
    const dllm__sampling &s = st.sampling;
    return dllm__format("%d %d %d %.17g %.9g %llu %d %d %d %d %d %d %d %d", st.cfg_scale > 0 ? 2 : 1, (int)st.canvas.size(), st.cand_lo,
                        s.temperature, (double)st.cfg_scale, (unsigned long long)s.seed, s.eos_logit_inf, s.defer_eos_eot,
                        (int)s.remasking, s.eos_id, s.eot_id, st.mask_id, st.lacache, buffer_generation_);
}

/* Captures run_step as a graph. A new block changes only kernel arguments, so the executable graph is
 * updated in place when it can be (cheaper than instantiating again). */
dllm_status dllm__gpu_backend::capture_step(const dllm__decode &st) {
    cudaGraph_t graph = nullptr;
    DLLM__CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    dllm_status s = run_step(st);
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (s != DLLM_OK) {
        if (graph) cudaGraphDestroy(graph);
        return s;
    }
    if (e != cudaSuccess) return dllm__cuda_fail(e, "capturing the step graph");
    cudaGraphExecUpdateResultInfo info;
    if (graph_exec_ && cudaGraphExecUpdate(graph_exec_, graph, &info) == cudaSuccess) {
        cudaGraphDestroy(graph);
        return DLLM_OK;
    }
    cudaGetLastError();
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    graph_exec_ = nullptr;
    e = cudaGraphInstantiate(&graph_exec_, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) return dllm__cuda_fail(e, "instantiating the step graph");
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::step(dllm__decode &st, std::vector<int32_t> &committed, bool want_host) {
    // The first step of a new configuration runs eagerly: cuBLASLt and lazy module loading do their
    // one-time work outside any capture. So does LaCache's FILL step, which runs once per block. The
    // graph is captured from the next step on; with LaCache it bakes in the block, so each block has its own.
    const bool fill = st.lacache == DLLM_LACACHE_ON && st.step_in_block == 0;
    const std::string shape = graph_key(st), key = shape + (st.lacache != DLLM_LACACHE_OFF ? dllm__format(" @%d", st.block_begin) : "");
    if (dllm__env_int("DLLM_NO_GRAPHS", 0) || fill || shape != warmed_key_) {
        DLLM__TRY(run_step(st));
        if (!fill) warmed_key_ = shape;
    } else {
        if (!graph_exec_ || key != graph_key_) {
            DLLM__TRY(capture_step(st));
            graph_key_ = key;
        }
        DLLM__CUDA(cudaGraphLaunch(graph_exec_, stream_));
    }
    st.forwards += st.cfg_scale > 0 ? 2 : 1;
    committed.clear();
    if (!want_host) return DLLM_OK;
    const int n = (int)st.canvas.size();
    int *host = (int *)host_pinned_;
    DLLM__CUDA(cudaMemcpyAsync(host, canvas_.ptr, (size_t)n * 4, cudaMemcpyDeviceToHost, stream_));
    DLLM__CUDA(cudaMemcpyAsync(host + n, committed_.ptr, (size_t)n * 4, cudaMemcpyDeviceToHost, stream_));
    DLLM__CUDA(cudaMemcpyAsync(host + 2 * n, state_.ptr, 64, cudaMemcpyDeviceToHost, stream_));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    memcpy(st.canvas.data(), host, (size_t)n * 4);
    int n_committed = host[2 * n + 6];  // dllm_step_state.n_committed
    committed.assign(host + n, host + n + n_committed);
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::finish(dllm__decode &st) {
    DLLM__CUDA(cudaMemcpyAsync(st.canvas.data(), canvas_.ptr, st.canvas.size() * 4, cudaMemcpyDeviceToHost, stream_));
    DLLM__CUDA(cudaStreamSynchronize(stream_));
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 16. SAR decoding (LLaDA generate.py)
//     x = prompt ++ [MASK] * G; for each block, n masks get s steps, k_i = n / s (+1 for the first n % s
//     steps); each step commits the top k_i candidates (masked positions before the block end).
// ---------------------------------------------------------------------------------------------------

struct dllm_ctx {
    dllm_model *model = nullptr;
    dllm_ctx_params params;
    dllm_backend backend = DLLM_BACKEND_CPU;
    int max_tokens = 0;
    std::string last_error;
    std::unique_ptr<dllm__backend_impl> impl;
};

struct dllm__gen_plan {
    int n_blocks = 0, steps_per_block = 0;
    int32_t mask_id = 0, eos_id = -1, eot_id = -1;
};

static dllm_status dllm__check_token(const char *what, int32_t id, int n_vocab) {
    if (id < -1 || id >= n_vocab) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "%s %d is outside the vocabulary [0, %d)", what, id, n_vocab);
    return DLLM_OK;
}

static dllm_status dllm__plan_generation(const dllm_ctx &ctx, const int32_t *prompt, int n_prompt, const dllm_gen_params &p,
                                         int32_t *out, int out_capacity, dllm__gen_plan &plan) {
    const dllm__config &c = ctx.model->cfg;
    if (n_prompt < 0 || (n_prompt > 0 && !prompt)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt is NULL or n_prompt < 0");
    if (p.gen_length <= 0 || p.block_length <= 0 || p.steps <= 0)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "gen_length (%d), block_length (%d) and steps (%d) must be positive", p.gen_length, p.block_length, p.steps);
    if (p.gen_length % p.block_length)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "gen_length %d is not a multiple of block_length %d", p.gen_length, p.block_length);
    plan.n_blocks = p.gen_length / p.block_length;
    if (p.steps % plan.n_blocks)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "steps %d is not a multiple of the number of blocks %d (gen_length / block_length)", p.steps, plan.n_blocks);
    plan.steps_per_block = p.steps / plan.n_blocks;
    if ((int64_t)n_prompt + p.gen_length > ctx.max_tokens)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "prompt (%d) + gen_length (%d) = %lld tokens exceeds the context's limit of %d", n_prompt,
                          p.gen_length, (long long)n_prompt + p.gen_length, ctx.max_tokens);
    if (!(p.temperature >= 0) || !(p.temperature < 1e6)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "temperature must be >= 0, got %g", (double)p.temperature);
    if (!(p.cfg_scale >= 0) || !(p.cfg_scale < 1e6)) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "cfg_scale must be >= 0, got %g", (double)p.cfg_scale);
    int lacache = dllm__enum_int(p.lacache);
    if (lacache < DLLM_LACACHE_OFF || lacache > DLLM_LACACHE_ON)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "lacache must be DLLM_LACACHE_OFF, _TRUNCATE or _ON, got %d", lacache);
    int remasking = dllm__enum_int(p.remasking);
    if (remasking != DLLM_REMASK_LOW_CONFIDENCE && remasking != DLLM_REMASK_RANDOM)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "remasking must be DLLM_REMASK_LOW_CONFIDENCE or DLLM_REMASK_RANDOM, got %d", remasking);
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
    return DLLM_OK;
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
    st.sampling.seed = p.seed;
    st.sampling.eos_logit_inf = p.logits_eos_inf != 0 && plan.eos_id >= 0;
    st.sampling.defer_eos_eot = p.confidence_eos_eot_inf != 0;
    st.sampling.eos_id = plan.eos_id;
    st.sampling.eot_id = plan.eot_id;
    st.lacache = p.lacache;
}

static int dllm__count_masks(const dllm__decode &st, int begin, int end) {
    int n = 0;
    for (int p = begin; p < end; p++) n += st.canvas[(size_t)p] == st.mask_id;
    return n;
}

/* Copies the generated part to out; with stop_at_eos it ends before the first EOS/EoT. */
static int dllm__emit_output(const dllm__decode &st, const dllm__gen_plan &plan, bool stop_at_eos, int32_t *out) {
    int n = 0;
    for (size_t p = (size_t)st.n_prompt; p < st.canvas.size(); p++) {
        int32_t t = st.canvas[p];
        if (stop_at_eos && (t == plan.eos_id || t == plan.eot_id) && t >= 0) break;
        out[n++] = t;
    }
    return n;
}

static dllm_status dllm__generate_impl(dllm_ctx &ctx, const int32_t *prompt, int n_prompt, const dllm_gen_params &p, int32_t *out,
                                       int out_capacity, int *n_out, dllm_gen_stats *stats) {
    dllm__gen_plan plan;
    DLLM__TRY(dllm__plan_generation(ctx, prompt, n_prompt, p, out, out_capacity, plan));
    double t0 = dllm__now_ms();
    dllm__decode st;
    dllm__init_decode(prompt, n_prompt, p, plan, st);
    std::vector<int32_t> committed;
    int steps_done = 0;
    const int total = plan.n_blocks * plan.steps_per_block;
    st.steps_per_block = plan.steps_per_block;
    dllm_status status = ctx.impl->begin(st);
    for (int b = 0; b < plan.n_blocks && status == DLLM_OK; b++) {
        st.block_begin = n_prompt + b * p.block_length;
        st.block_end = st.block_begin + p.block_length;
        st.step_in_block = 0;
        status = ctx.impl->begin_block(st);
        for (int i = 0; i < plan.steps_per_block && status == DLLM_OK; i++) {
            status = ctx.impl->step(st, committed, p.on_step != nullptr);
            if (status != DLLM_OK) break;
            st.step_in_block++;
            st.global_step++;
            steps_done++;
            if (p.on_step) {
                dllm_step_info info = {b, plan.n_blocks, i, plan.steps_per_block, steps_done, total, (int)committed.size(),
                                       committed.data(), st.canvas.data(), (int)st.canvas.size(), n_prompt,
                                       dllm__count_masks(st, n_prompt, (int)st.canvas.size())};
                if (p.on_step(&info, p.on_step_data) != 0)
                    status = dllm__fail(DLLM_ERR_CANCELLED, "generation cancelled by the step callback after step %d of %d", steps_done, total);
            }
        }
    }
    if (status == DLLM_OK || status == DLLM_ERR_CANCELLED) {
        dllm_status fin = ctx.impl->finish(st);
        if (status == DLLM_OK) status = fin;
    }
    int n = status == DLLM_OK ? dllm__emit_output(st, plan, p.stop_at_eos != 0, out) : dllm__emit_output(st, plan, false, out);
    if (n_out) *n_out = n;
    if (stats) {
        stats->n_prompt = n_prompt;
        stats->n_generated = n;
        stats->steps = steps_done;
        stats->forwards = st.forwards;
        stats->wall_ms = dllm__now_ms() - t0;
    }
    return status;
}

/* Is a CUDA device usable? Never fails hard: a machine without a driver just answers no. */
static bool dllm__gpu_usable(int device, std::string &why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        why = dllm__format("no usable CUDA driver/device (%s)", cudaGetErrorString(e));
        cudaGetLastError();
        return false;
    }
    if (device < 0 || device >= n) {
        why = dllm__format("CUDA device %d requested but %d device(s) present", device, n);
        return false;
    }
    return true;
}

static dllm_status dllm__create_backend(dllm_ctx &ctx) {
    int threads = ctx.params.n_threads ? ctx.params.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
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
    ctx.backend = DLLM_BACKEND_CPU;
    ctx.impl.reset(new dllm__cpu_backend(*ctx.model, threads, ctx.max_tokens));
    dllm__log(DLLM_LOG_INFO, "CPU reference backend, %d thread(s)", threads);
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 17. Public API
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
                  m->cfg.family == DLLM_FAMILY_LLADA ? "LLaDA" : "Dream", m->cfg.n_layer, m->cfg.n_embd, (long long)m->n_params);
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
    return DLLM_OK;
}

dllm_ctx_params dllm_ctx_default_params(void) {
    dllm_ctx_params p;
    p.backend = DLLM_BACKEND_AUTO;
    p.device = 0;
    p.max_tokens = 0;
    p.n_threads = 0;
    return p;
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
        std::unique_ptr<dllm_ctx> ctx(new dllm_ctx);
        ctx->model = model;
        ctx->params = params;
        ctx->max_tokens = params.max_tokens ? params.max_tokens : model->cfg.max_seq_len;
        DLLM__TRY(dllm__create_backend(*ctx));
        *out_ctx = ctx.release();
        return DLLM_OK;
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
    return p;
}

dllm_status dllm_generate(dllm_ctx *ctx, const int32_t *prompt, int n_prompt, dllm_gen_params params, int32_t *out, int out_capacity,
                          int *n_out, dllm_gen_stats *stats) {
    if (n_out) *n_out = 0;
    return dllm__guard(ctx, [&]() -> dllm_status {
        if (!ctx) return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "dllm_generate: ctx is NULL");
        return dllm__generate_impl(*ctx, prompt, n_prompt, params, out, out_capacity, n_out, stats);
    });
}

}  // extern "C"
