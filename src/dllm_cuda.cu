/* src/dllm_cuda.cu - the root of dllm's implementation of dllm.h: diffusion LLM inference in one translation unit.
 *
 * tools/amalgamate.py expands this file into the top-level dllm_cuda.cu that users copy: each #include "..." of a
 * file under src/ below is replaced by that file (they are parts of one translation unit, in data-flow order, not
 * separate ones), and each DLLM__KERNEL_FILE("x.cuh") by the text of src/kernels/x.cuh as the source string NVRTC
 * compiles. ./build.sh runs it when a source changed. src/README.md is the map of the tree.
 *
 * What it does: loads Hugging Face checkpoints of LLaDA, Dream, Fast-dLLM v2 and Nemotron-Labs-Diffusion models
 * (config.json + safetensors, single file or sharded) with strict validation, runs their transformer forward, and
 * decodes with their schedules. The CPU backend is an fp32 reference written for clarity; it is the twin every GPU
 * kernel is tested against. The GPU backend JIT-compiles its kernels with NVRTC for the GPU it finds, runs GEMMs
 * through cuBLASLt or its own kernels and replays denoising steps as CUDA graphs with the canvas, the step counter and
 * the sampler state on the device. Text goes in and out through the model's Hugging Face byte-level BPE tokenizer and
 * chat template, reimplemented id for id (tokenizer/).
 *
 * The clever part, in one place: every random draw (Gumbel noise, random remasking, Dream's origin
 * transfers and alg_temp noise) comes from a counter-based Philox generator keyed by (seed) and counted by
 * (vocab index, position, step, stream), so a run is reproducible on any backend, in any order of
 * evaluation, and a PyTorch script (tools/make_fixtures.py) reproduces the exact token traces.
 *
 * Private names are prefixed dllm__ and live in an anonymous namespace.
 */
#include "dllm.h"

#include <cublasLt.h>
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes from the driver at run time
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
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
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

// Everything but the public API has internal linkage: nothing of dllm's leaks into the program that links it. The four
// public handles (dllm_model, dllm_tokenizer, dllm_ctx, dllm_stepper) are declared in dllm.h, so they live at global
// scope, between the namespace's parts; GCC would warn that they hold members of the namespace's types when this file
// is #included (the tests do), which is what is intended.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wsubobject-linkage"
#endif
// nvcc's front end turns the anonymous namespace into a uniquely named one (for device code), whose inline functions
// would stay global symbols: hidden visibility keeps them out of a shared library's exports too.
#pragma GCC visibility push(hidden)
namespace {

#include "util.cpp"
#include "json.cpp"
#include "model/safetensors.cpp"
#include "model/config.cpp"
#include "model/weights.cpp"
#include "model/llada2.cpp"
#include "tokenizer/unicode.cpp"
#include "tokenizer/normalize.cpp"
#include "tokenizer/pretokenize.cpp"
#include "tokenizer/bpe.cpp"
#include "tokenizer/load.cpp"
#include "tokenizer/chat.cpp"
#include "philox.cpp"
#include "cpu/thread_pool.cpp"
#include "cpu/forward.cpp"
#include "cpu/fp8.cpp"
#include "cpu/linears.cpp"
#include "cpu/moe.cpp"
#include "cpu/layers.cpp"
#include "cpu/block_diffusion.cpp"
#include "soloq/rotation.cpp"
#include "soloq/quantizers.cpp"
#include "soloq/precisions.cpp"
#include "soloq/gemm_twins.cpp"
#include "soloq/checkpoint.cpp"
#include "soloq/kv_quant.cpp"
#include "cpu/token_choice.cpp"
#include "cpu/tensor_parallel.cpp"
#include "backend.cpp"
#include "cpu/backend.cpp"
#include "gpu/cuda_libs.cpp"
#include "gpu/kernel_table.cpp"
#include "gpu/jit.cpp"
#include "gpu/modules.cpp"
#include "gpu/gemm.cpp"
#include "gpu/gemm_lowbit.cpp"
#include "gpu/gemm_splitk.cpp"
#include "gpu/weight_formats.cpp"
#include "gpu/q4_wgmma.cpp"
#include "gpu/weights.cpp"
#include "gpu/quantize.cpp"
#include "gpu/activations.cpp"
#include "gpu/backend.cpp"
#include "gpu/forward.cpp"
#include "gpu/moe.cpp"
#include "gpu/batch.cpp"
#include "gpu/batch_kv.cpp"
#include "gpu/batch_bd.cpp"
#include "gpu/step.cpp"
#include "gpu/batch_choice.cpp"
#include "gpu/block_diffusion.cpp"
#include "gpu/kv_quant.cpp"
#include "gpu/batch_kvq.cpp"
#include "gpu/bd_forward.cpp"
#include "gpu/debug_hooks.cpp"
#include "decode/generate.cpp"
#include "decode/llada2.cpp"
#include "decode/block_diffusion.cpp"
#include "decode/batch.cpp"
#include "decode/batch_bd.cpp"
#include "decode/stepper.cpp"
#include "decode/backend_choice.cpp"
#include "api.cpp"
