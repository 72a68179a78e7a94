/* dllm_cuda.cu - the implementation of dllm.h: diffusion LLM inference in one translation unit.
 *
 * What it does: loads Hugging Face checkpoints of LLaDA and Dream models (config.json + safetensors,
 * single file or sharded) with strict validation, runs their bidirectional transformer forward, and
 * decodes with LLaDA's semi-autoregressive block schedule. The CPU backend is an fp32 reference written
 * for clarity; it is the twin every GPU kernel is tested against.
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
 *  11. SAR decoding
 *  12. Public API
 *
 * Build: see README.md (one nvcc command). Private names are static or prefixed dllm__.
 */
#include "dllm.h"

#include <cuda_runtime.h>

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
    std::vector<int32_t> canvas;     // prompt ++ generation
    std::vector<uint8_t> is_prompt;  // the reference's prompt_index (prompt positions that are not MASK)
    int n_prompt = 0;
    int block_end = 0;               // candidates are masked positions before this
    int global_step = 0;             // counts steps across blocks; keys the RNG
    int32_t mask_id = 0;
    float cfg_scale = 0;
    dllm__sampling sampling;
    int forwards = 0;
};

struct dllm__backend_impl {
    virtual ~dllm__backend_impl() {}
    /* Logits for positions [r0, r1) of one forward over ids[0..n) (shift already applied). */
    virtual dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) = 0;
    /* One denoising step: choose x0 and confidence at every candidate, commit the best k. Writes the
     * committed positions (ascending) to committed. */
    virtual dllm_status step(dllm__decode &st, int k, std::vector<int32_t> &committed) = 0;
};

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

    dllm_status step(dllm__decode &st, int k, std::vector<int32_t> &committed) override {
        const int V = m_.cfg.n_vocab, n = (int)st.canvas.size();
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
// 11. SAR decoding (LLaDA generate.py)
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

static int dllm__transfer_count(int n_masked, int steps, int i) { return n_masked / steps + (i < n_masked % steps ? 1 : 0); }

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
    dllm_status status = DLLM_OK;
    int steps_done = 0;
    const int total = plan.n_blocks * plan.steps_per_block;
    for (int b = 0; b < plan.n_blocks && status == DLLM_OK; b++) {
        int begin = n_prompt + b * p.block_length;
        st.block_end = begin + p.block_length;
        int n_masked = dllm__count_masks(st, begin, st.block_end);
        for (int i = 0; i < plan.steps_per_block && status == DLLM_OK; i++) {
            status = ctx.impl->step(st, dllm__transfer_count(n_masked, plan.steps_per_block, i), committed);
            if (status != DLLM_OK) break;
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
    if (ctx.params.backend == DLLM_BACKEND_GPU) {
        if (!dllm__gpu_usable(ctx.params.device, why)) return dllm__fail(DLLM_ERR_NO_DEVICE, "GPU backend requested: %s", why.c_str());
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend is not available in this build yet; use the CPU backend");
    }
    ctx.backend = DLLM_BACKEND_CPU;
    ctx.impl.reset(new dllm__cpu_backend(*ctx.model, threads, ctx.max_tokens));
    dllm__log(DLLM_LOG_INFO, "CPU reference backend, %d thread(s)", threads);
    return DLLM_OK;
}

// ---------------------------------------------------------------------------------------------------
// 12. Public API
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
