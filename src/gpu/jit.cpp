/* src/gpu/jit.cpp - the architecture table and the NVRTC JIT with its caches. */

// ---------------------------------------------------------------------------------------------------
// 14. GPU: NVRTC JIT and the architecture table
//     DeepGEMM's design: kernels are specialised on compile-time constants that belong to the model (head
//     dim, tiles), compiled for the exact GPU, cached in process and on disk under a key that hashes the
//     source, the options, the NVRTC version and the architecture. The DLLM_* switches that steer it (cache,
//     dumps, tiles, GEMM choices) are listed at dllm__env_switches (section 1).
// ---------------------------------------------------------------------------------------------------

/* How a GPU runs the FP8 GEMMs of dllm_precision (1x128 activation groups x 128x128 weight blocks). Only Hopper
 * has them in cuBLASLt; Ada (sm_89) has FP8 tensor cores but no block-scaled cuBLASLt mode, so it runs dllm's own
 * mma.sync kernel (dllm__src_fp8_gemm), which sm_90 can run too (DLLM_TILES=fp8_gemm=mma). */
enum dllm__fp8_gemm {
    DLLM__FP8_NONE = 0,  // FP8 requested: run BF16 and say so in one warning
    DLLM__FP8_CUBLASLT_BLOCK = 1,
    DLLM__FP8_MMA = 2  // fp8_gemm, tiles fp8_wide / fp8_narrow
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
    int cc;                               // compute capability major*10 + minor
    const char *target;                   // NVRTC --gpu-architecture
    int fa_br, fa_bc;                     // attention query rows per CTA, keys per tile
    int fa_mt;                            // m16 tiles per warp: the CTA has fa_br / (16 * fa_mt) warps
    int fa_stages;                        // K/V tiles in the ring: stages - 1 are in flight while one is computed
    int fa_kv_ctas_per_sm;                // split-KV (K/V-cache steps) aims at this many attention CTAs per SM
    int fa_wg_bc;                         // keys per tile of flash_attn_wg (wgmma, sm_90a only; 0: not used)
    int fa_wg_stages;                     // K/V tiles in flash_attn_wg's ring
    dllm__fp8_gemm fp8;                   // the FP8 GEMM this architecture runs
    dllm__fp8_tile fp8_wide, fp8_narrow;  // fp8_gemm's tiles above / up to dllm__fp8_narrow_rows rows (sm_89 and newer)
    int gemm_wg_stages;  // gemm_wg's ring of 64-wide k-steps (sm_90a; 0: not used), timed against cuBLASLt per shape
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
    if (a.cc == 90 && (wg_bc == 0 || wg_bc == 64 || wg_bc == 128))
        a.fa_wg_bc = wg_bc;
    else if (wg_bc != a.fa_wg_bc)
        dllm__log(DLLM_LOG_WARN, "DLLM_TILES fa_wg_bc=%d ignored: 0, 64 or 128, on sm_90 only", wg_bc);
    static std::once_flag tiles_warned;
    if (!env.tiles_error.empty())
        std::call_once(tiles_warned, [&] {
            dllm__log(DLLM_LOG_WARN,
                      "DLLM_TILES: \"%s\" not understood (keys fa_br, fa_bc, fa_mt, fa_stages, fa_kv_ctas, fa_wg_bc, "
                      "fa_wg_stages, batch_gemm_n, soloq_split with a number; fp8_gemm=mma or cublaslt)",
                      env.tiles_error.c_str());
        });
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
    std::string tmp =
        dllm__format("%s.tmp.%d.%llx", path.c_str(), (int)getpid(), (unsigned long long)(uintptr_t)&bytes);
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
    std::string name;  // module name: spells its compile-time parameters
    std::string source;
    std::vector<std::string> kernels;  // entry points, "k" or template instantiations "k<1,2>"
    std::string target;                // sm_XY[a]
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
static dllm_status dllm__nvrtc_compile(const dllm__jit_request &rq, std::vector<char> &cubin,
                                       std::vector<std::string> &lowered, std::string &log,
                                       std::string *ptx_out = nullptr) {
    DLLM__TRY(dllm__load_nvrtc());
    nvrtcProgram prog;
    if (dllm__lib.nvrtcCreateProgram(&prog, rq.source.c_str(), (rq.name + ".cu").c_str(), 0, nullptr, nullptr) !=
        NVRTC_SUCCESS)
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
    if (n == 0)
        return dllm__fail(DLLM_ERR_JIT, "NVRTC produced no cubin for %s (%s)", rq.name.c_str(), rq.target.c_str());
    if (dllm__env().jit_fail_on_spill && dllm__log_has_spills(log))
        return dllm__fail(DLLM_ERR_JIT, "%s spills registers on %s (DLLM_JIT_FAIL_ON_SPILL is set):\n%s",
                          rq.name.c_str(), rq.target.c_str(), log.substr(0, 1500).c_str());
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
static dllm_status dllm__jit_build(const dllm__jit_request &rq, uint64_t key, std::vector<char> &blob,
                                   std::vector<std::string> &lowered) {
    std::string dir = dllm__cache_dir(), path = dir.empty() ? ""
                                                            : dllm__format("%s/%s-%016llx.bin", dir.c_str(),
                                                                           rq.name.c_str(), (unsigned long long)key);
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
        dllm__log_verbose("JIT %s for %s: %.0f ms\n%s", rq.name.c_str(), rq.target.c_str(), dllm__now_ms() - t0,
                          log.c_str());
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
        if (it != dllm__jit_modules.end()) {
            out = it->second;
            return DLLM_OK;
        }
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
