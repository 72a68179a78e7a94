/* Shared helpers for the tests: fixture paths, temporary directories, hand-made safetensors files. */
#ifndef DLLM_TEST_HELPERS_H
#define DLLM_TEST_HELPERS_H

#include <dirent.h>
#include <stdlib.h>
#include <string>
#include <vector>

static std::string test_data_dir() {
    const char *e = getenv("DLLM_TEST_DATA");
    return e && *e ? e : "tests/data";
}

static std::string test_data(const char *rel) { return test_data_dir() + "/" + rel; }

/* A DLLM_* switch changed for a test: dllm reads the switches once, so they are read again. */
static void test_setenv(const char *name, const char *value, int overwrite) {
    setenv(name, value, overwrite);
    dllm__env_reload();
}
static void test_unsetenv(const char *name) {
    unsetenv(name);
    dllm__env_reload();
}
/* One of dllm's internal switches (dllm__env_switches: a feature's on/off state, a tile) set by name for a test; create
 * contexts after it. test_knob_reset() (or dllm__env_reload) puts every switch back to what the environment says. */
static void test_knob_set(const char *name, const char *value) {
    if (!dllm__env_set(name, value)) {
        fprintf(stderr, "test_knob_set: no internal switch %s=%s\n", name, value);
        abort();  // a misspelt switch would make a comparison of two paths compare one path with itself
    }
}
static void test_knob_reset() { dllm__env_reload(); }
/* The same for a test's scope: the switch is set at construction, and every switch is as before at its end. */
struct test_knob {
    dllm__env_switches saved = dllm__env_storage();
    test_knob(const char *name, bool on) : test_knob(name, on ? "1" : "0") {}
    test_knob(const char *name, const char *value) { test_knob_set(name, value); }
    ~test_knob() { dllm__env_storage() = saved; }
};

static bool test_write_file(const std::string &path, const std::string &bytes) {
    FILE *f = fopen(path.c_str(), "wb");
    if (!f) return false;
    bool ok = fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    return fclose(f) == 0 && ok;
}

static std::string test_read_file(const std::string &path) {
    std::string s;
    dllm__read_text(path, s);
    return s;
}

/* A fresh directory under $TMPDIR, removed with its files when it goes out of scope. */
struct test_tmpdir {
    std::string path;
    test_tmpdir() {
        const char *t = getenv("TMPDIR");
        std::string tmpl = std::string(t && *t ? t : "/tmp") + "/dllm-test-XXXXXX";
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back(0);
        path = mkdtemp(buf.data()) ? buf.data() : "";
    }
    ~test_tmpdir() {
        if (path.empty()) return;
        if (DIR *d = opendir(path.c_str())) {
            while (struct dirent *e = readdir(d))
                if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink((path + "/" + e->d_name).c_str());
            closedir(d);
        }
        rmdir(path.c_str());
    }
    std::string file(const char *name) const { return path + "/" + name; }
};

/* Builds a safetensors file: tensors are laid out in the order added; header padded to 8 bytes unless
 * told otherwise. Tests edit header_json() before bytes() to make broken files. */
struct test_st_builder {
    struct entry { std::string name, dtype; std::vector<int64_t> shape; std::string data; };
    std::vector<entry> entries;
    std::string metadata = "{\"format\":\"pt\"}";

    void add(const std::string &name, const std::string &dtype, std::vector<int64_t> shape, std::string data) {
        entries.push_back({name, dtype, std::move(shape), std::move(data)});
    }
    void add_f32(const std::string &name, std::vector<int64_t> shape, const std::vector<float> &v) {
        add(name, "F32", std::move(shape), std::string((const char *)v.data(), v.size() * 4));
    }
    std::string header_json() const {
        std::string h = "{";
        if (!metadata.empty()) h += "\"__metadata__\":" + metadata;
        size_t off = 0;
        for (const entry &e : entries) {
            if (h.size() > 1) h += ",";
            h += "\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[";
            for (size_t i = 0; i < e.shape.size(); i++) h += (i ? "," : "") + std::to_string(e.shape[i]);
            h += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + e.data.size()) + "]}";
            off += e.data.size();
        }
        return h + "}";
    }
    std::string data() const {
        std::string d;
        for (const entry &e : entries) d += e.data;
        return d;
    }
    static std::string assemble(std::string header, const std::string &data, bool pad = true) {
        if (pad) while ((8 + header.size()) % 8) header += ' ';
        std::string out(8, '\0');
        uint64_t n = header.size();
        for (int i = 0; i < 8; i++) out[(size_t)i] = (char)((n >> (8 * i)) & 0xFF);
        return out + header + data;
    }
    std::string bytes(bool pad = true) const { return assemble(header_json(), data(), pad); }
};

static std::string test_bf16_bytes(const std::vector<float> &v) {
    std::string s;
    for (float f : v) {
        uint16_t b = dllm__f32_to_bf16(f);
        s.append((const char *)&b, 2);
    }
    return s;
}

/* Copies a fixture model directory into a temp dir so a test can break one file of it. */
static void test_copy_model(const std::string &from, const test_tmpdir &to) {
    const char *files[] = {"config.json",
                           "model.safetensors",
                           "tokenizer_config.json",
                           "generation_config.json",
                           "model.safetensors.index.json",
                           "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors"};
    for (const char *f : files) {
        std::string src = from + "/" + f;
        if (dllm__file_exists(src)) test_write_file(to.file(f), test_read_file(src));
    }
}

static dllm_model *test_load(const std::string &dir) {
    dllm_model *m = nullptr;
    if (dllm_model_load(dir.c_str(), dllm_model_default_params(), &m) != DLLM_OK) {
        fprintf(stdout, "    cannot load %s: %s\n", dir.c_str(), dllm_last_error());
        return nullptr;
    }
    return m;
}

/* A context of params p on m; null (the reason printed) when it is not created. */
static dllm_ctx *test_ctx_params(dllm_model *m, const dllm_ctx_params &p) {
    dllm_ctx *c = nullptr;
    if (dllm_ctx_create(m, p, &c) != DLLM_OK) fprintf(stdout, "    cannot create a context: %s\n", dllm_last_error());
    return c;
}

static dllm_ctx *test_ctx(dllm_model *m, dllm_backend backend = DLLM_BACKEND_CPU, int threads = 2) {
    dllm_ctx_params p = dllm_ctx_default_params();
    p.backend = backend;
    p.n_threads = threads;
    return test_ctx_params(m, p);
}

/* A context with a precision (FP8, SoloQ, ...) on 2 threads. */
static dllm_ctx *test_ctx_precision(dllm_model *m, dllm_backend backend, dllm_precision precision) {
    dllm_ctx_params p = dllm_ctx_default_params();
    p.backend = backend;
    p.n_threads = 2;
    p.precision = precision;
    return test_ctx_params(m, p);
}

/* LLaDA-8B's shape (tests/data/real-configs) with random weights: the tests of the real shapes run on it. Null after a
 * failed check. */
static dllm_model *test_llada_8b_shape(dllm_test_state &T_, uint64_t seed = 3) {
    dllm_model *m = nullptr;
    CHECK_STATUS(dllm_model_load_random(test_data("real-configs/llada-8b-instruct.config.json").c_str(), seed, &m),
                 DLLM_OK, nullptr);
    return m;
}

/* A GPU context on m for max_tokens tokens at a precision (AUTO: the default); null after a failed check. */
static dllm_ctx *test_gpu_ctx(dllm_test_state &T_, dllm_model *m, int max_tokens,
                              dllm_precision precision = DLLM_PRECISION_AUTO) {
    dllm_ctx_params cp = dllm_ctx_default_params();
    cp.backend = DLLM_BACKEND_GPU;
    cp.max_tokens = max_tokens;
    cp.precision = precision;
    dllm_ctx *ctx = nullptr;
    CHECK_STATUS(dllm_ctx_create(m, cp, &ctx), DLLM_OK, nullptr);
    return ctx;
}

/* The exact CPU forward's state before layer 0 over ids (the layer-by-layer accuracy tests): the embedded rows in b.h
 * at positions 0..T-1, the RoPE tables, every row a query row. */
struct test_cpu_layer0 {
    dllm__cpu_buffers b;
    std::vector<float> cos_t, sin_t;
    dllm__cpu_rows rows;
    test_cpu_layer0(const dllm_model &m, const std::vector<int32_t> &ids) {
        const dllm__config &c = m.cfg;
        const int T = (int)ids.size(), d = c.n_embd;
        dllm__rope_tables(c.rope_theta, c.head_dim, T, cos_t, sin_t);
        b.fit(c, T);
        for (int t = 0; t < T; t++) {
            b.pos[(size_t)t] = t;
            dllm__tensor_row(*m.embed, ids[(size_t)t], d, b.h.data() + (size_t)t * d);
        }
        rows.q0 = 0, rows.q1 = T;
    }
};

/* A model directory (a fixture: test_data(NAME)) and a default context on it (test_ctx), freed together; ctx is null
 * when either does not come up. */
struct test_tiny_ctx {
    dllm_model *model = nullptr;
    dllm_ctx *ctx = nullptr;
    explicit test_tiny_ctx(const std::string &dir, dllm_backend backend = DLLM_BACKEND_CPU) {
        model = test_load(dir);
        if (model) ctx = test_ctx(model, backend);
    }
    ~test_tiny_ctx() {
        dllm_ctx_free(ctx);
        dllm_model_free(model);
    }
    test_tiny_ctx(const test_tiny_ctx &) = delete;
    test_tiny_ctx &operator=(const test_tiny_ctx &) = delete;
};

#endif
