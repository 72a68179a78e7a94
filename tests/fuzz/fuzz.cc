/* dllm-fuzz: the libFuzzer harnesses of dllm's parsers, one per parser, in one binary so that
 * dllm_cuda.cu is compiled once. Each harness is a file of this directory; the program's name picks one
 * (build/fuzz/<harness> are links to build/fuzz/dllm-fuzz), or DLLM_FUZZ_TARGET does.
 *
 *   ./build.sh fuzz [SECONDS]                  build all, run each SECONDS (default 10) on its corpus
 *   build/fuzz/json -dict=tests/fuzz/json.dict tests/fuzz/corpus/json     one harness, libFuzzer flags
 *   build/fuzz/json crash-1234                 reproduce a crash
 *
 * Run from the repository root: the encode, decode and chat harnesses load the shipped tokenizers
 * (models/, tests/data/tokenizer). A harness aborts when a property it checks fails, so libFuzzer
 * reports the input like a crash.
 */
#include "../../dllm_cuda.cu"

#include <dirent.h>

#define FUZZ_CHECK(cond)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, \
                    #cond, dllm_last_error());                                                \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

// ---- Shared helpers -----------------------------------------------------------------------------------

/* A private directory for the harnesses that parse files, removed at exit. */
static std::string fuzz_dir;

static void fuzz_remove_dir() {
    if (fuzz_dir.empty()) return;
    if (DIR *d = opendir(fuzz_dir.c_str())) {
        while (struct dirent *e = readdir(d))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink((fuzz_dir + "/" + e->d_name).c_str());
        closedir(d);
    }
    rmdir(fuzz_dir.c_str());
}

static void fuzz_make_dir() {
    const char *t = getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/dllm-fuzz-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back(0);
    if (!mkdtemp(buf.data())) { perror("dllm-fuzz: mkdtemp"); exit(1); }
    fuzz_dir = buf.data();
    atexit(fuzz_remove_dir);
}

static std::string fuzz_path(const char *name) { return fuzz_dir + "/" + name; }

static void fuzz_write(const char *name, const void *data, size_t n) {
    FILE *f = fopen(fuzz_path(name).c_str(), "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) { perror("dllm-fuzz: write"); exit(1); }
}

static void fuzz_write(const char *name, const std::string &s) { fuzz_write(name, s.data(), s.size()); }

static void fuzz_unlink(const char *name) { unlink(fuzz_path(name).c_str()); }

/* Input split at each "\n@@\n" (the separator is in json.dict): one part per file of a directory. */
static std::vector<std::string> fuzz_split(const uint8_t *data, size_t n, size_t max_parts) {
    static const char sep[] = "\n@@\n";
    std::string s((const char *)data, n);
    std::vector<std::string> parts;
    size_t pos = 0;
    while (parts.size() + 1 < max_parts) {
        size_t at = s.find(sep, pos);
        if (at == std::string::npos) break;
        parts.push_back(s.substr(pos, at - pos));
        pos = at + 4;
    }
    parts.push_back(s.substr(pos));
    return parts;
}

static bool fuzz_valid_utf8(const std::string &s) { return dllm__utf8_sanitize(s.data(), s.size()) == s; }

/* Errors are expected by the thousand: keep the log quiet. */
static void fuzz_quiet_log(dllm_log_level, const char *, void *) {}

static std::string fuzz_root() {
    const char *r = getenv("DLLM_FUZZ_ROOT");
    return r && *r ? r : ".";
}

static dllm_tokenizer *fuzz_load_tokenizer(const std::string &dir) {
    dllm_tokenizer *t = nullptr;
    if (dllm_tokenizer_load(dir.c_str(), &t) != DLLM_OK) {
        fprintf(stderr, "dllm-fuzz: cannot load the tokenizer in %s (run from the repository root): %s\n", dir.c_str(),
                dllm_last_error());
        exit(1);
    }
    return t;
}

// ---- The harnesses ------------------------------------------------------------------------------------

#include "json.inl"
#include "safetensors.inl"
#include "st_index.inl"
#include "config.inl"
#include "tokenizer_json.inl"
#include "tokenizer_files.inl"
#include "encode.inl"
#include "decode.inl"
#include "chat.inl"
#include "quantized.inl"

static const struct {
    const char *name;
    void (*init)();
    int (*run)(const uint8_t *, size_t);
} fuzz_harnesses[] = {
    {"json", nullptr, fuzz_json},
    {"safetensors", fuzz_make_dir, fuzz_safetensors},
    {"st_index", fuzz_st_index_init, fuzz_st_index},
    {"config", nullptr, fuzz_config},
    {"tokenizer_json", fuzz_make_dir, fuzz_tokenizer_json},
    {"tokenizer_files", fuzz_make_dir, fuzz_tokenizer_files},
    {"encode", fuzz_encode_init, fuzz_encode},
    {"decode", fuzz_decode_init, fuzz_decode},
    {"chat", fuzz_chat_init, fuzz_chat},
    {"quantized", fuzz_quantized_init, fuzz_quantized},
};

static int (*fuzz_run)(const uint8_t *, size_t) = nullptr;

extern "C" int LLVMFuzzerInitialize(int *, char ***argv) {
    const char *target = getenv("DLLM_FUZZ_TARGET");
    if (!target || !*target) {
        const char *slash = strrchr((*argv)[0], '/');
        target = slash ? slash + 1 : (*argv)[0];
    }
    for (const auto &h : fuzz_harnesses)
        if (!strcmp(h.name, target)) fuzz_run = h.run;
    if (!fuzz_run) {
        fprintf(stderr,
                "dllm-fuzz: unknown harness \"%s\"; run it as build/fuzz/<harness> or set DLLM_FUZZ_TARGET to one of:",
                target);
        for (const auto &h : fuzz_harnesses) fprintf(stderr, " %s", h.name);
        fprintf(stderr, "\n");
        exit(2);
    }
    dllm_log_set(fuzz_quiet_log, nullptr, DLLM_LOG_ERROR);
    for (const auto &h : fuzz_harnesses)
        if (h.run == fuzz_run && h.init) h.init();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_run(data, size); }
