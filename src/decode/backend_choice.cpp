/* src/decode/backend_choice.cpp - which backend a context gets. */

/* Is a CUDA device usable? Never fails hard: a machine without a driver just answers no. */
static bool dllm__gpu_usable(int device, std::string &why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) {
        why = e == cudaErrorNoDevice ? std::string("no NVIDIA GPU found")
                                     : dllm__format("no NVIDIA driver found, or one older than CUDA %d.%d needs",
                                                    CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
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
    // A GPU older than sm_80 (no bf16 mma, no cp.async) or without the libraries is no GPU for dllm: AUTO then runs
    // the CPU backend, GPU says why.
    int major = 8, minor = 0;  // a query that fails leaves the check to the backend's init
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    cudaGetLastError();
    if (major < 8) {
        why = dllm__format("CUDA device %d has compute capability %d.%d; dllm's GPU backend needs 8.0 or newer", device,
                           major, minor);
        return false;
    }
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
        return dllm__fail(
            DLLM_ERR_UNSUPPORTED,
            "n_devices (--devices) %d: tensor parallelism runs on the GPU backend only; the CPU backend runs on one "
            "device",
            p.n_devices);
    for (int i = 0; i < p.n_devices; i++) {
        std::string why;
        if (!dllm__gpu_usable(p.devices[i], why))
            return dllm__fail(
                DLLM_ERR_NO_DEVICE,
                "n_devices (--devices) %d asks for tensor parallelism over GPUs, but devices[%d] = %d is not usable: "
                "%s",
                p.n_devices, i, p.devices[i], why.c_str());
    }
    DLLM__TRY(dllm__load_nccl());
    return dllm__fail(
        DLLM_ERR_UNSUPPORTED,
        "tensor parallelism over %d GPUs is not built yet (the sharding plan and its CPU reference exist, the "
        "NCCL forward does not: README, tensor parallelism); use one device (n_devices 0 or 1, one --devices entry)",
        p.n_devices);
}

static dllm_status dllm__create_backend(dllm_ctx &ctx) {
    if (ctx.params.n_devices > 1) return dllm__tp_create_backend(ctx);
    int threads = ctx.params.n_threads ? ctx.params.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
    dllm__soloq_options soloq;
    DLLM__TRY(dllm__soloq_options_for(ctx.params.precision, ctx.params.quantize_lm_head, ctx.params.soloq_rotation,
                                      ctx.params.soloq_bias_correction, soloq));
    if (soloq.enabled) DLLM__TRY(dllm__soloq_check_dims(ctx.model->cfg, soloq));
    std::string why;
    bool gpu = dllm__gpu_usable(ctx.params.device, why);
    if (ctx.params.backend == DLLM_BACKEND_GPU && !gpu)
        return dllm__fail(DLLM_ERR_NO_DEVICE, "GPU backend requested: %s", why.c_str());
    if (gpu && ctx.params.backend != DLLM_BACKEND_CPU) {
        ctx.backend = DLLM_BACKEND_GPU;
        return dllm__gpu_backend::create(*ctx.model, ctx.params, ctx.max_tokens, ctx.impl);
    }
    if (ctx.model->random_weights)
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "a model with random weights lives on the GPU only; the CPU backend needs a checkpoint (%s)",
                          gpu ? "CPU backend requested" : why.c_str());
    DLLM__TRY(dllm__check_finite_weights(*ctx.model, threads));
    ctx.backend = DLLM_BACKEND_CPU;
    ctx.impl.reset(new dllm__cpu_backend(*ctx.model, threads, ctx.max_tokens, ctx.params.precision, soloq,
                                         ctx.params.kv_quant, ctx.params.kv_sink_tokens,
                                         {ctx.params.progress, ctx.params.progress_user_data}));
    dllm__log(DLLM_LOG_INFO, "CPU reference backend, %d thread(s)", threads);
    return DLLM_OK;
}
