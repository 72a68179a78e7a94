/* src/gpu/cuda_libs.cpp - the CUDA libraries loaded at run time, errors, device memory, NCCL. */

// ---------------------------------------------------------------------------------------------------
// 12. GPU: the CUDA libraries loaded at run time, errors, device memory
//     [dlopen] NVRTC and cuBLASLt are reached through one table of function pointers filled by dlopen when
//     the first GPU context (or JIT compile) needs them: the binaries start in milliseconds on machines
//     without the CUDA Toolkit, and the CPU backend needs nothing from it. The CUDA runtime is linked
//     statically and finds the driver itself.
// ---------------------------------------------------------------------------------------------------

/* The NVRTC and cuBLASLt entry points dllm calls, each named once: the table's member of the same name holds
 * it (decltype of the header's declaration, which is never called directly, so nothing links the library). */
#define DLLM__NVRTC_FUNCS(X)                                                                                           \
    X(nvrtcVersion)                                                                                                    \
    X(nvrtcGetErrorString)                                                                                             \
    X(nvrtcCreateProgram)                                                                                              \
    X(nvrtcDestroyProgram) X(nvrtcAddNameExpression) X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize)                  \
        X(nvrtcGetProgramLog) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN) X(nvrtcGetPTXSize) X(nvrtcGetPTX)                  \
            X(nvrtcGetLoweredName)
#define DLLM__CUBLASLT_FUNCS(X)                                                                                        \
    X(cublasLtCreate)                                                                                                  \
    X(cublasLtDestroy)                                                                                                 \
    X(cublasLtMatmul)                                                                                                  \
    X(cublasLtMatmulAlgoCapGetAttribute) X(cublasLtMatmulAlgoCheck) X(cublasLtMatmulAlgoConfigGetAttribute)            \
        X(cublasLtMatmulAlgoConfigSetAttribute) X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulDescCreate)          \
            X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulPreferenceCreate)           \
                X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)                             \
                    X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)

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
static dllm_status dllm__load_lib(std::once_flag &once, dllm_status &result, std::string &error, const char *stem,
                                  int major, const char *package,
                                  const std::function<bool(void *, std::string &)> &resolve) {
    std::call_once(once, [&] {
        std::string tried, missing;
        void *h = dllm__dlopen_first(stem, major, tried);
        if (!h) {
            result = DLLM_ERR_NO_DEVICE;
            error = dllm__format(
                "cannot load %s.so.%d, which the GPU backend needs (tried %s): install the CUDA Toolkit's %s or add "
                "its lib64 "
                "folder to LD_LIBRARY_PATH; the CPU backend (--backend cpu) needs no CUDA library",
                stem, major, tried.c_str(), package);
        } else if (!resolve(h, missing)) {
            result = DLLM_ERR_NO_DEVICE;
            error = dllm__format("%s.so.%d lacks %s: install the CUDA %d.x Toolkit's %s", stem, major, missing.c_str(),
                                 major, package);
        } else {
            result = DLLM_OK;
        }
    });
    return result == DLLM_OK ? DLLM_OK : dllm__fail(result, "%s", error.c_str());
}

#define DLLM__LIB_RESOLVE(name)                                                                                        \
    if (!(dllm__lib.name = (decltype(dllm__lib.name))dlsym(h, #name))) {                                               \
        missing = #name;                                                                                               \
        return false;                                                                                                  \
    }

static dllm_status dllm__load_nvrtc() {
    static std::once_flag once;
    static dllm_status result = DLLM_OK;
    static std::string error;
    return dllm__load_lib(once, result, error, "libnvrtc", CUDA_VERSION / 1000, "NVRTC (libnvrtc)",
                          [](void *h, std::string &missing) {
                              DLLM__NVRTC_FUNCS(DLLM__LIB_RESOLVE)
                              return true;
                          });
}

static dllm_status dllm__load_cublaslt() {
    static std::once_flag once;
    static dllm_status result = DLLM_OK;
    static std::string error;
    return dllm__load_lib(once, result, error, "libcublasLt", CUBLAS_VER_MAJOR, "cuBLAS (libcublasLt)",
                          [](void *h, std::string &missing) {
                              DLLM__CUBLASLT_FUNCS(DLLM__LIB_RESOLVE)
                              return true;
                          });
}
#undef DLLM__LIB_RESOLVE

/* [dlopen] NCCL, for tensor parallelism (section 10b). Not part of the CUDA Toolkit, so dllm is built without its
 * header: the few types and entry points it calls are declared here as nccl.h 2.x defines them (result, data type
 * and reduction are C enums, passed as int; the 2.x ABI is stable, the soname libnccl.so.2). */
typedef struct dllm__nccl_comm *dllm__nccl_comm_t;
struct dllm__nccl_unique_id {
    char internal[128];
};
enum { DLLM__NCCL_SUCCESS = 0, DLLM__NCCL_SUM = 0, DLLM__NCCL_FLOAT32 = 7, DLLM__NCCL_BFLOAT16 = 9 };

#define DLLM__NCCL_FUNCS(X)                                                                                            \
    X(ncclGetVersion, int, (int *version))                                                                             \
    X(ncclGetErrorString, const char *, (int result))                                                                  \
    X(ncclGetUniqueId, int, (dllm__nccl_unique_id * id))                                                               \
    X(ncclCommInitAll, int, (dllm__nccl_comm_t * comms, int n_devices, const int *devices))                            \
    X(ncclCommInitRank, int, (dllm__nccl_comm_t * comm, int n_ranks, dllm__nccl_unique_id id, int rank))               \
    X(ncclGroupStart, int, (void))                                                                                     \
    X(ncclGroupEnd, int, (void))                                                                                       \
    X(ncclAllReduce, int,                                                                                              \
      (const void *send, void *recv, size_t count, int dtype, int op, dllm__nccl_comm_t comm, cudaStream_t stream))    \
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
        return dllm__fail(
            DLLM_ERR_NO_DEVICE,
            "cannot load libnccl.so.2, which tensor parallelism (n_devices > 1) needs (tried %s): install NCCL 2 "
            "(e.g. the nvidia-nccl-cu12 wheel or the libnccl2 package) and put its lib folder on LD_LIBRARY_PATH or in "
            "NCCL_HOME; "
            "one GPU (n_devices 0 or 1) needs no NCCL",
            tried.c_str());
#define DLLM__NCCL_RESOLVE(name, ret, args)                                                                            \
    if (!(api.name = (ret(*) args)dlsym(h, #name)))                                                                    \
        return dllm__fail(DLLM_ERR_NO_DEVICE,                                                                          \
                          "the NCCL library loaded for tensor parallelism lacks %s: install NCCL 2.x", #name);
    DLLM__NCCL_FUNCS(DLLM__NCCL_RESOLVE)
#undef DLLM__NCCL_RESOLVE
    if (api.ncclGetVersion(&api.version) != DLLM__NCCL_SUCCESS || api.version < 20000)
        return dllm__fail(
            DLLM_ERR_NO_DEVICE,
            "the NCCL library loaded for tensor parallelism reports version code %d; dllm needs NCCL 2.9 or later",
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

#define DLLM__CUDA(expr)                                                                                               \
    do {                                                                                                               \
        cudaError_t dllm__e_ = (expr);                                                                                 \
        if (dllm__e_ != cudaSuccess) return dllm__cuda_fail(dllm__e_, #expr);                                          \
    } while (0)

static dllm_status dllm__cublas_fail(cublasStatus_t s, const char *what) {
    return dllm__fail(s == CUBLAS_STATUS_ALLOC_FAILED ? DLLM_ERR_OUT_OF_MEMORY : DLLM_ERR_CUDA,
                      "%s: cuBLASLt status %d", what, (int)s);
}

#define DLLM__CUBLAS(expr)                                                                                             \
    do {                                                                                                               \
        cublasStatus_t dllm__s_ = (expr);                                                                              \
        if (dllm__s_ != CUBLAS_STATUS_SUCCESS) return dllm__cublas_fail(dllm__s_, #expr);                              \
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
    dllm__dbuf(dllm__dbuf &&o) noexcept : ptr(o.ptr), bytes(o.bytes) {
        o.ptr = nullptr;
        o.bytes = 0;
    }
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
            return dllm__fail(DLLM_ERR_OUT_OF_MEMORY, "cannot allocate %.1f MiB of GPU memory for %s: %s",
                              n / 1048576.0, what, cudaGetErrorString(e));
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
        return dllm__nccl_check(dllm__nccl.ncclCommInitAll(comms.data(), (int)devices.size(), devices.data()),
                                "ncclCommInitAll");
    }
};

/* The all-reduce after O and after down: bufs[r] (count fp32 on rank r's device) := the sum over the ranks, on each
 * rank's stream (so a graph captured there holds it). One group: a thread that drives several ranks must issue all
 * of their calls between ncclGroupStart and ncclGroupEnd, or the first would wait forever for the others. */
static dllm_status dllm__tp_all_reduce_device(const dllm__tp_comms &c, float *const *bufs, size_t count) {
    DLLM__TRY(dllm__nccl_check(dllm__nccl.ncclGroupStart(), "ncclGroupStart"));
    int first_error = DLLM__NCCL_SUCCESS;
    for (size_t r = 0; r < c.comms.size(); r++) {
        int e = dllm__nccl.ncclAllReduce(bufs[r], bufs[r], count, DLLM__NCCL_FLOAT32, DLLM__NCCL_SUM, c.comms[r],
                                         c.streams[r]);
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
[[maybe_unused]] static dllm_status dllm__tp_all_reduce_selfcheck(const std::vector<int> &devices, size_t count,
                                                                  double &max_diff, size_t &n_differ) {
    dllm__tp_comms c;
    DLLM__TRY(c.init(devices));
    const size_t n = devices.size();
    std::vector<std::vector<float>> host(n, std::vector<float>(count));
    std::vector<const float *> parts;
    std::vector<dllm__dbuf> dev(n);
    std::vector<float *> bufs;
    for (size_t r = 0; r < n; r++) {
        for (size_t i = 0; i < count; i++)
            host[r][i] =
                (float)(dllm__uniform(29, (uint32_t)i, (uint32_t)r, 0, DLLM__RNG_GUMBEL) * 2 - 1) * (float)(1 + i % 7);
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
