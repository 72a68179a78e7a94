#!/usr/bin/env bash
# build.sh - builds dllm's programs and tests with nvcc; no GPU is needed to build or to run the CPU tests.
#
#   ./build.sh          regenerate dllm_cuda.cu from src/ (tools/amalgamate.py) when a source changed, then
#                       build build/dllm-generate, dllm-tokenize, dllm-eval, dllm-quantize, dllm-test, dllm-bench and the shared
#                       library build/libdllm.so with its pkg-config file build/dllm.pc; only what is older than
#                       its sources (or build.sh) is rebuilt, so a second run on an unchanged tree does nothing
#   ./build.sh run [PROMPT] [FLAGS...]  build what changed, then run the main job: the embedded default model
#                       (models/tiny-llada) answers a text prompt, streamed; FLAGS go on to dllm-generate
#                       (e.g. ./build.sh run "Why is the sky blue?" -n 8; -m DIR picks another model);
#                       DLLM_REUSE_BUILD=1 runs the programs already in build/ without rebuilding
#   ./build.sh install PREFIX   build the library and the CLI programs, then copy dllm.h, libdllm.so, dllm.pc and
#                       dllm-generate, -tokenize, -eval, -quantize under PREFIX/include, lib, lib/pkgconfig and bin
#   ./build.sh test     build, run the test suite, then the CPU tests again under ASan + UBSan, then the Python
#                       package's tests and dllm-server's, twice: the server as built and under ASan + UBSan (skipped
#                       without libmicrohttpd and cJSON); the last line is "N passed, N failed, N skipped" over the
#                       five runs
#   ./build.sh gpu      on a GPU machine, in one go: build, the tests that touch the GPU (DLLM_GPU_TESTS:
#                       a --filter list, or "all" for the whole suite, which CI runs on the CPU anyway), a
#                       compute-sanitizer memcheck run, the PyTorch anchors from .carry/anchors, the
#                       benchmark, a fixture reproducibility check; a short table last. Logs go to $OUT.
#                       DLLM_SKIP_TESTS=1 / DLLM_SKIP_ANCHORS=1 / DLLM_SKIP_BENCH=1 leave those out;
#                       DLLM_REUSE_BUILD=1 runs binaries carried from a build machine.
#   ./build.sh fuzz [SECONDS]  build the libFuzzer harnesses (tests/fuzz/, clang) and run each for SECONDS
#                       (default 10) on its corpus; non-zero on any crash. Inputs with new coverage edges are
#                       merged into tests/fuzz/corpus/ (DLLM_FUZZ_MERGE=0 leaves the corpora alone).
#   ./build.sh tsan     the concurrency tests under ThreadSanitizer (clang)
#   ./build.sh server   the library, then build/dllm-server (libmicrohttpd and cJSON: tests/server_deps.sh)
#   ./build.sh --help   this text
#
# Environment: CUDA_HOME (default /usr/local/cuda), JOBS (parallel compiles, default 2), DLLM_REBUILD=1 (rebuild
# everything regardless of timestamps).
set -euo pipefail
cd "$(dirname "$0")"

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC="$CUDA_HOME/bin/nvcc"
CXXFLAGS=(-O2 -std=c++17 -Xcompiler -Wall,-Wextra)
# Every link of dllm's code takes these (the one place to change how NVRTC, cuBLASLt and cudart are linked): NVRTC and
# cuBLASLt are loaded at run time (dlopen), cudart is static.
LIBS=(-cudart static -ldl)
# The CUDA libraries as a host compiler (g++, clang++) links them: the sanitizer and fuzzing builds.
HOST_LIBS=(-L"$CUDA_HOME/lib64" -lcudart_static -ldl -lpthread -lrt)
DEFAULT_MODEL=models/tiny-llada

die() { echo "build.sh: $*" >&2; exit 1; }
say() { echo "build.sh: $*" >&2; }  # what is being built (stderr: stdout stays the programs')

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
case "${1:-}" in -h|--help|help) usage; exit 0 ;; esac

[ -x "$NVCC" ] || die "nvcc not found at $NVCC (set CUDA_HOME)"

# dllm_cuda.cu, the file users copy, is generated from the development tree src/ (tools/amalgamate.py rewrites it only
# when its text changes, so an unchanged tree rebuilds nothing). Without python3 the checked-in file is used as it is.
amalgamate() {
    if command -v python3 >/dev/null; then
        python3 tools/amalgamate.py || die "generating dllm_cuda.cu from src/ failed"
    else
        echo "build.sh: python3 not found: building the checked-in dllm_cuda.cu, not src/" >&2
    fi
}
amalgamate

# stale TARGET SOURCE...: true when TARGET is missing or older than a source (build.sh counts as a source of
# everything: a flag change rebuilds). DLLM_REBUILD=1 makes everything stale.
stale() {
    local target=$1 src
    shift
    [ "${DLLM_REBUILD:-0}" = 1 ] && return 0
    [ -e "$target" ] || return 0
    for src in "$@" build.sh; do
        [ "$src" -nt "$target" ] && return 0
    done
    return 1
}

# The library object is compiled once, position-independent with hidden visibility, so that it serves both the
# CLI programs and build/libdllm.so (whose version script exports the dllm_ names only).
build_lib() {
    local major
    major=$(sed -n 's/^#define DLLM_VERSION_MAJOR \([0-9]*\)$/\1/p' dllm.h)
    if stale build/dllm_cuda.o dllm_cuda.cu dllm.h; then
        say "compiling the library: dllm_cuda.cu -> build/dllm_cuda.o (one large translation unit: minutes on a few cores; kept for later builds)"
        "$NVCC" "${CXXFLAGS[@]}" -Xcompiler -fPIC,-fvisibility=hidden -c -o build/dllm_cuda.o dllm_cuda.cu || die "building dllm_cuda.cu failed"
    fi
    if stale build/libdllm.so build/dllm_cuda.o; then
        say "linking build/libdllm.so (SONAME libdllm.so.$major)"
        printf '{ global: dllm_*; local: *; };\n' > build/dllm.map
        # The SONAME carries the major version: programs linked against it record libdllm.so.MAJOR, which the link below
        # (and ./build.sh install) provides.
        "$NVCC" -shared -o build/libdllm.so build/dllm_cuda.o "${LIBS[@]}" -Xlinker --version-script=build/dllm.map -Xlinker "-soname=libdllm.so.$major" ||
            die "linking build/libdllm.so failed"
    fi
    ln -sf libdllm.so "build/libdllm.so.$major"
    if stale build/dllm.pc dllm.h; then
        local version
        version=$(sed -n 's/^#define DLLM_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' dllm.h | paste -sd. -)
        # In build/ the file points at the source tree; ./build.sh install rewrites the paths.
        {
            echo "prefix=$PWD"
            echo 'includedir=${prefix}'
            echo 'libdir=${prefix}/build'
            echo
            echo 'Name: dllm'
            echo 'Description: diffusion LLM inference (LLaDA, Dream) on NVIDIA GPUs, with a CPU reference backend'
            echo "Version: $version"
            echo 'Cflags: -I${includedir}'
            # the rpath: a program built with these flags finds libdllm.so without LD_LIBRARY_PATH
            echo 'Libs: -L${libdir} -Wl,-rpath,${libdir} -ldllm'
        } > build/dllm.pc
    fi
}

# The library and the CLI programs (examples/), which link its object.
build_programs() {
    mkdir -p build
    build_lib
    local tool
    for tool in dllm-generate dllm-tokenize dllm-eval dllm-quantize simple; do
        if stale "build/$tool" "examples/$tool.c" build/dllm_cuda.o; then
            say "building build/$tool"
            "$NVCC" "${CXXFLAGS[@]}" -I. -o "build/$tool" "examples/$tool.c" build/dllm_cuda.o "${LIBS[@]}" || die "building build/$tool failed"
        fi
    done
}

build() {
    mkdir -p build
    local pids=() names=()
    if stale build/dllm-test dllm_cuda.cu dllm.h tests/*; then
        say "compiling the test suite: tests/dllm_test.cu -> build/dllm-test (beside the library; minutes)"
        "$NVCC" "${CXXFLAGS[@]}" -o build/dllm-test tests/dllm_test.cu tests/header_c99.c "${LIBS[@]}" &
        pids+=($!) names+=(build/dllm-test)
    fi
    if stale build/dllm-bench dllm_cuda.cu dllm.h tools/dllm_bench.cu; then
        say "compiling the benchmark: tools/dllm_bench.cu -> build/dllm-bench (beside the library; minutes)"
        "$NVCC" "${CXXFLAGS[@]}" -o build/dllm-bench tools/dllm_bench.cu "${LIBS[@]}" &
        pids+=($!) names+=(build/dllm-bench)
    fi
    build_programs
    local i
    for i in "${!pids[@]}"; do  # a failed build leaves no binary behind, so the next run retries it
        wait "${pids[$i]}" || { rm -f "${names[$i]}"; die "building ${names[$i]} failed"; }
    done
    # The binaries must start on machines without a GPU driver: cudart is static, libcuda never linked.
    if readelf -d build/dllm-generate build/dllm-tokenize build/dllm-quantize build/dllm-test build/libdllm.so | grep -qE 'NEEDED.*lib(cuda|nvrtc|cublasLt|nccl)\.so'; then
        die "a binary links libcuda, libnvrtc, libcublasLt or libnccl directly; it would not start without the CUDA Toolkit, NCCL and a GPU driver"
    fi
}

install_lib() {
    local prefix=${1:-}
    [ -n "$prefix" ] || die "usage: ./build.sh install PREFIX"
    mkdir -p "$prefix" && prefix=$(cd "$prefix" && pwd)  # absolute: dllm.pc's paths (and rpath) must not depend on the caller's directory
    build_programs
    mkdir -p "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/bin"
    cp dllm.h "$prefix/include/"
    local major
    major=$(sed -n 's/^#define DLLM_VERSION_MAJOR \([0-9]*\)$/\1/p' dllm.h)
    rm -f "$prefix/lib/libdllm.so" "$prefix/lib/libdllm.so.$major"
    cp build/libdllm.so "$prefix/lib/libdllm.so.$major"  # the file its SONAME names, and the link the linker looks for
    ln -s "libdllm.so.$major" "$prefix/lib/libdllm.so"
    cp build/dllm-generate build/dllm-tokenize build/dllm-eval build/dllm-quantize "$prefix/bin/"
    sed -e "s|^prefix=.*|prefix=$prefix|" -e 's|^includedir=.*|includedir=${prefix}/include|' -e 's|^libdir=.*|libdir=${prefix}/lib|' \
        build/dllm.pc > "$prefix/lib/pkgconfig/dllm.pc"
    echo "installed dllm.h, libdllm.so, dllm.pc and the CLI programs (bin/) under $prefix"
}

# The CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer. dllm_cuda.cu holds no device code
# (kernels are NVRTC strings), so the host compiler builds it directly with the sanitizers.
build_sanitized() {
    stale build/dllm-test-asan dllm_cuda.cu dllm.h tests/* || return 0
    local c_flags=(-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined)
    gcc -std=c99 -pedantic -Wall -Wextra -Werror "${c_flags[@]}" -c tests/header_c99.c -o build/header_c99.asan.o
    g++ -std=c++17 -x c++ "${c_flags[@]}" -I"$CUDA_HOME/include" tests/dllm_test.cu -x none build/header_c99.asan.o \
        "${HOST_LIBS[@]}" -o build/dllm-test-asan
}

summary_counts() {  # prints "passed failed skipped" from a log's last line
    tail -n 1 "$1" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped$/\1 \2 \3/p'
}

run_tests() {
    build
    build_sanitized &
    local asan=$!
    local rc=0
    build/dllm-test | tee build/test.log || rc=1
    wait $asan || die "building the sanitizer tests failed"
    echo "== CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer"
    ASAN_OPTIONS=detect_leaks=1:protect_shadow_gap=0 UBSAN_OPTIONS=print_stacktrace=1 \
        build/dllm-test-asan | tee build/test-asan.log || rc=1
    echo "== the Python package's tests (python/, over build/libdllm.so)"
    python/run_tests.sh 2>&1 | tee build/test-python.log || rc=1
    echo "== dllm-server's tests (tests/server_test.py; tests/server_deps.sh installs what they need)"
    if pkg-config --exists libmicrohttpd libcjson 2>/dev/null; then
        { build_server && python3 tests/server_test.py; } 2>&1 | tee build/test-server.log || rc=1
        echo "== dllm-server's tests again, the server under AddressSanitizer + UndefinedBehaviorSanitizer (leaks too)"
        { build_server asan && ASAN_OPTIONS=detect_leaks=1:protect_shadow_gap=0 UBSAN_OPTIONS=print_stacktrace=1 \
            DLLM_SERVER_BIN=build/dllm-server-asan python3 tests/server_test.py; } 2>&1 |
            tee build/test-server-asan.log || rc=1
    else
        echo "libmicrohttpd or cJSON missing (tests/server_deps.sh installs them): the server's tests are skipped"
        echo "0 passed, 0 failed, 1 skipped" > build/test-server.log
        echo "0 passed, 0 failed, 1 skipped" > build/test-server-asan.log
    fi
    local a b p v w
    a=$(summary_counts build/test.log)
    b=$(summary_counts build/test-asan.log)
    p=$(summary_counts build/test-python.log)
    v=$(summary_counts build/test-server.log)
    w=$(summary_counts build/test-server-asan.log)
    # A run that died before its summary line counts as one failure.
    [ -n "$a" ] || { a="0 1 0"; rc=1; }
    [ -n "$b" ] || { b="0 1 0"; rc=1; }
    [ -n "$p" ] || { p="0 1 0"; rc=1; }
    [ -n "$v" ] || { v="0 1 0"; rc=1; }
    [ -n "$w" ] || { w="0 1 0"; rc=1; }
    set -- $a $b $p $v $w
    echo "$(($1 + $4 + $7 + ${10} + ${13})) passed, $(($2 + $5 + $8 + ${11} + ${14})) failed," \
        "$(($3 + $6 + $9 + ${12} + ${15})) skipped"
    exit $rc
}

# ./build.sh run [PROMPT] [FLAGS...]: the flags go on to dllm-generate; the defaults (-m, -n, -p) only where they are
# not given.
run_main_job() {
    # what the answer needs: the tests and the benchmark are not built here (DLLM_REUSE_BUILD=1: not even that, when
    # build/dllm-generate exists; tests/cli_newuser.sh runs it so, as a carried build may look older than its sources)
    [ "${DLLM_REUSE_BUILD:-0}" = 1 ] && [ -x build/dllm-generate ] || build_programs
    # The embedded default: tiny-llada (trained by tools/train_tiny.py on fortune quotes, in models/), a text prompt
    # through its chat template, streamed as it decodes; on the GPU when there is one, else on the CPU reference. The
    # default prompt is one the tiny model answers in kind (it knows quotes, not conversation).
    local prompt="What is the meaning of life?" a has_model=0 has_n=0 has_prompt=0
    if [ $# -gt 0 ] && [ "${1:0:1}" != - ]; then prompt=$1; shift; fi
    for a in "$@"; do
        case $a in
            -m|--model) has_model=1 ;;
            -n|--gen-length|--n-predict) has_n=1 ;;
            -p|--prompt|-f|--file|--ids|-i|--interactive|--prompts) has_prompt=1 ;;
        esac
    done
    local args=()
    [ $has_model = 1 ] || args+=(-m "$DEFAULT_MODEL")
    [ $has_n = 1 ] || args+=(-n 64)
    [ $has_prompt = 1 ] || args+=(-p "$prompt")
    build/dllm-generate "${args[@]}" "$@"
}

# Everything the GPU machine should do in one call (device time is scarce): see the header.
run_gpu() {
    local out=/tmp/dllm-gpu-out
    rm -rf "$out"
    mkdir -p "$out"
    # DLLM_REUSE_BUILD=1: use binaries carried from a build machine when they start here
    if [ "${DLLM_REUSE_BUILD:-0}" = 1 ] && build/dllm-test --list >/dev/null 2>&1 && [ -x build/dllm-bench ]; then
        echo "== reusing the carried build"
    else
        DLLM_REBUILD=1 build  # carried files' timestamps say nothing about which sources built them
    fi
    export DLLM_CACHE_DIR=/tmp/dllm-jit-cache
    if [ "${DLLM_SKIP_TESTS:-0}" != 1 ]; then
        # The tests that touch the GPU (CI runs the whole suite on the CPU): the full suite no longer fits one device
        # call beside the anchors and the benchmark. DLLM_GPU_TESTS=all runs everything, or give a --filter list.
        local filter=${DLLM_GPU_TESTS:-gpu,block_diffusion,batch,kv_quant,api.,jit.arch_table,soloq.precisions}
        echo "== tests (GPU: ${filter})"
        if [ "$filter" = all ]; then filter=.; fi
        timeout 400 build/dllm-test --filter "$filter" 2>&1 | tee "$out/test.log" || true
    fi
    echo "== compute-sanitizer memcheck (small run)"
    if command -v compute-sanitizer >/dev/null; then
        local memcheck=0  # a failure is reported in the summary; the rest of the run goes on
        timeout 300 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 build/dllm-test --filter gpu.graphs_equal \
            > "$out/memcheck.log" 2>&1 || memcheck=$?
        echo "memcheck exit status $memcheck" >> "$out/memcheck.log"
        tail -n 5 "$out/memcheck.log"
    else
        echo "compute-sanitizer not found" | tee "$out/memcheck.log"
    fi
    local anchors=""
    if [ -f .carry/anchors/torch_reference.py ] && [ "${DLLM_SKIP_ANCHORS:-0}" != 1 ]; then
        echo "== PyTorch anchors"
        (cd "$out" && OUT="$PWD" PYTHONUNBUFFERED=1 timeout 300 python3 "$OLDPWD/.carry/anchors/torch_reference.py") > "$out/anchor.log" 2>&1 || echo "torch anchor failed"
        PYTHONUNBUFFERED=1 timeout 200 python3 .carry/anchors/torch_reference_graphs.py > "$out/anchor_graphs.log" 2>&1 || echo "torch graphs anchor failed"
        (cd "$out" && OUT="$PWD" PYTHONUNBUFFERED=1 timeout 120 python3 "$OLDPWD/.carry/anchors/torch_reference_v2.py") > "$out/anchor_v2.log" 2>&1 ||
            echo "torch Fast-dLLM v2 anchor failed"
        anchors="--anchors $out/anchor_torch.json --anchor-graphs $out/anchor_graphs.log --anchors-v2 $out/anchor_v2.json"
    fi
    if [ "${DLLM_SKIP_BENCH:-0}" != 1 ]; then
        echo "== benchmark"
        # shellcheck disable=SC2086
        timeout 400 build/dllm-bench $anchors --json "$out/bench.json" 2>&1 | tee "$out/bench.log" || echo "benchmark failed"
    fi
    if [ "${DLLM_SKIP_BENCH:-0}" != 1 ]; then
        # Batched decoding (issue 26): the batched forward and the batched dual-cache step at batch 1 to 64 beside the
        # PyTorch batch anchor's dual_block32_N1024 rows (eager and CUDA graphs).
        echo "== batched decoding: the batch anchor and dllm-bench --batch-rows"
        if [ -f .carry/anchors/torch_reference_batch.py ] && [ "${DLLM_SKIP_ANCHORS:-0}" != 1 ]; then
            (cd "$out" && OUT="$PWD" PYTHONUNBUFFERED=1 timeout 120 python3 "$OLDPWD/.carry/anchors/torch_reference_batch.py") > "$out/anchor_batch.log" 2>&1 ||
                echo "torch batch anchor failed"
            grep -E "^dual_block32_N1024_B(1|16)_|_err " "$out/anchor_batch.log" || true
        fi
        timeout 300 build/dllm-bench --batch-rows > "$out/bench_batch.log" 2>&1 || echo "batch benchmark failed"
        grep -E "^(bf16_gemm_8192|batch(1|16)_dual_N1024_|batch16_fwd)" "$out/bench_batch.log" || tail -n 3 "$out/bench_batch.log"
    fi
    echo "== tiny trained models on the GPU (NLL, exact match, agreement between decoding modes)"
    {
        for m in tiny-llada tiny-dream; do
            echo "-- $m NLL, GPU BF16 (the card holds the float64 reference)"; build/dllm-eval -m models/$m --nll tests/data/heldout.txt --backend gpu
            echo "-- $m agreement, GPU LaCache on vs GPU off"; build/dllm-eval -m models/$m --agree tests/data/prompts.txt --backend gpu --ref-backend gpu --lacache on --ref-lacache off
            echo "-- $m agreement, GPU truncate vs GPU off"; build/dllm-eval -m models/$m --agree tests/data/prompts.txt --backend gpu --ref-backend gpu --lacache truncate --ref-lacache off
            echo "-- $m agreement, GPU LaCache vs CPU fp32 reference"; build/dllm-eval -m models/$m --agree tests/data/prompts.txt --backend gpu --ref-backend cpu
            echo "-- $m NLL, GPU FP8"; build/dllm-eval -m models/$m --nll tests/data/heldout.txt --backend gpu --precision fp8
            echo "-- $m agreement, GPU FP8 vs GPU BF16"; build/dllm-eval -m models/$m --agree tests/data/prompts.txt --backend gpu --ref-backend gpu --precision fp8 --ref-precision bf16 --ref-lacache on
            echo "-- $m agreement, GPU FP8 vs CPU FP8 reference"; build/dllm-eval -m models/$m --agree tests/data/prompts.txt --backend gpu --ref-backend cpu --precision fp8 --ref-precision fp8 --ref-lacache on
        done
        echo "-- tiny-add exact match, GPU LaCache"; build/dllm-eval -m models/tiny-add --add tests/data/add_test.txt --backend gpu
        echo "-- tiny-add exact match, GPU LaCache FP8"; build/dllm-eval -m models/tiny-add --add tests/data/add_test.txt --backend gpu --precision fp8
        for p in soloq-n soloq-i soloq-c rtn-w4a4; do
            echo "-- tiny-llada NLL, GPU $p"; build/dllm-eval -m models/tiny-llada --nll tests/data/heldout.txt --backend gpu --precision $p
            echo "-- tiny-add exact match, GPU LaCache $p"; build/dllm-eval -m models/tiny-add --add tests/data/add_test.txt --backend gpu --precision $p
        done
    } > "$out/eval.log" 2>&1 || echo "tiny-model evaluation failed"
    grep -E "^--|^(nll_0|agree_token|agree_sequence|exact_match)" "$out/eval.log" || true
    echo "== fixtures reproduce with this machine's PyTorch"
    python3 tools/make_fixtures.py --check tests/data > "$out/fixtures.log" 2>&1 || true
    cat "$out/fixtures.log"
    if [ -n "${OUT:-}" ]; then  # the device returns at most 8 files: the main logs, and everything in one archive
        cp "$out/test.log" "$out/bench.log" "$out/bench.json" "$out/memcheck.log" "$OUT/" 2>/dev/null || true
        tar czf "$OUT/gpu-logs.tgz" -C "$out" .
    fi
    echo "== summary"
    tail -n 1 "$out/test.log"
    grep -E "^(FAIL|skip) " "$out/test.log" || true
    tail -n 1 "$out/memcheck.log"
    tail -n 1 "$out/fixtures.log" 2>/dev/null || true
    if [ -f "$out/bench.log" ]; then
        sed -n '/^| LaCache component/,/^$/p' "$out/bench.log"
        sed -n '/^| scheduler/,/^$/p' "$out/bench.log"
        sed -n '/^| workload/,$p' "$out/bench.log"
    fi
}

FUZZ_HARNESSES=(json safetensors st_index config tokenizer_json tokenizer_files encode decode chat quantized)

# One binary holds every harness (dllm_cuda.cu compiles once); build/fuzz/<harness> links pick one.
build_fuzz() {
    command -v clang++ >/dev/null || die "clang++ not found (apt-get install clang libclang-rt-14-dev)"
    mkdir -p build/fuzz
    clang++ -std=c++17 -x c++ -O1 -g -Wall -Wextra -Wno-unused-function -fsanitize=fuzzer,address,undefined \
        -fno-sanitize-recover=all -I"$CUDA_HOME/include" tests/fuzz/fuzz.cc "${HOST_LIBS[@]}" -o build/fuzz/dllm-fuzz ||
        die "building the fuzz harnesses failed (the libFuzzer runtime: apt-get install libclang-rt-14-dev)"
    local h
    for h in "${FUZZ_HARNESSES[@]}"; do ln -sf dllm-fuzz "build/fuzz/$h"; done
}

run_fuzz() {
    local seconds=${1:-10} h rc=0
    build_fuzz
    for h in "${FUZZ_HARNESSES[@]}"; do
        local corpus=tests/fuzz/corpus/$h work=build/fuzz/corpus/$h
        mkdir -p "$work" build/fuzz/artifacts
        echo "== fuzz $h (${seconds} s)"
        # New inputs go to the build directory; the committed corpus is read only until the merge below. DLLM_FUZZ_SEED
        # fixes libFuzzer's mutation sequence (CI's smoke: the same inputs every run, as far as its time allows).
        if ! build/fuzz/$h ${DLLM_FUZZ_SEED:+-seed=$DLLM_FUZZ_SEED} -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len=16384 -print_final_stats=1 \
            -dict=tests/fuzz/json.dict -artifact_prefix="build/fuzz/artifacts/$h-" "$work" "$corpus" > "build/fuzz/$h.log" 2>&1; then
            rc=1
            echo "build.sh: fuzz $h FAILED; the input is in build/fuzz/artifacts/, the log in build/fuzz/$h.log" >&2
            grep -E "ERROR|FUZZ_CHECK|SUMMARY|Test unit written" "build/fuzz/$h.log" | head -n 8 >&2 || true
            continue
        fi
        { grep -E "^stat::number_of_executed_units|^stat::new_units_added" "build/fuzz/$h.log" | tr '\n' ' '; } || true
        { grep -oE "cov: [0-9]+ ft: [0-9]+" "build/fuzz/$h.log" | tail -n 1; } || true
        if [ "${DLLM_FUZZ_MERGE:-1}" = 1 ]; then  # new edges only (-use_counters=0): hit-count features would bloat the
            # corpora past the device's 64 MiB working tree
            build/fuzz/$h -merge=1 -use_counters=0 -max_len=16384 -timeout=20 -rss_limit_mb=4096 "$corpus" "$work" > "build/fuzz/$h.merge.log" 2>&1 ||
                echo "build.sh: merging into $corpus failed (build/fuzz/$h.merge.log)" >&2
        fi
    done
    [ $rc = 0 ] && echo "fuzz: every harness ran ${seconds} s without a crash"
    return $rc
}

# The concurrency tests (and the tokenizer shared by threads) under ThreadSanitizer, on the CPU backend.
run_tsan() {
    command -v clang++ >/dev/null || die "clang++ not found (apt-get install clang)"
    mkdir -p build
    clang -std=c99 -c -o build/header_c99.tsan.o tests/header_c99.c
    clang++ -std=c++17 -x c++ -O1 -g -fsanitize=thread -Wall -Wextra -Wno-unused-function -I"$CUDA_HOME/include" tests/dllm_test.cu \
        -x none build/header_c99.tsan.o "${HOST_LIBS[@]}" -o build/dllm-test-tsan || die "building build/dllm-test-tsan failed"
    local rc=0
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build/dllm-test-tsan --filter concurrency. | tee build/test-tsan.log || rc=1
    TSAN_OPTIONS="halt_on_error=1" build/dllm-test-tsan --filter tokenizer.shared_by_threads | tee -a build/test-tsan.log || rc=1
    return $rc
}

# ---- dllm-server (examples/dllm-server.c, examples/server/): ./build.sh server -------------------------------------
# The library, then build/dllm-server linked to it by examples/server/build.sh, which needs pkg-config to find
# libmicrohttpd and libcjson (tests/server_deps.sh installs them) and says so clearly when it does not.
build_server() {
    mkdir -p build
    build_lib
    DLLM_LIB_DIR=build examples/server/build.sh "$@"
}

# The Qwen2.5 tokenizer fixture ships packed (4.4 MB of vocab.json and merges.txt in 1.3 MB) and is unpacked beside the
# archive the first time anything runs; the unpacked folder is git-ignored. A copy of the sources without tests/ has none.
unpack_fixtures() {
    local dir=tests/data/tokenizer
    [ ! -f "$dir/qwen2.5.tar.xz" ] || [ -f "$dir/qwen2.5/vocab.json" ] || tar -xJf "$dir/qwen2.5.tar.xz" -C "$dir" ||
        die "unpacking $dir/qwen2.5.tar.xz failed"
}

unpack_fixtures
case "${1:-build}" in
    build) build ;;
    run) shift; run_main_job "$@" ;;
    install) shift; mkdir -p build; install_lib "$@" ;;
    test) run_tests ;;
    gpu) run_gpu ;;
    fuzz) shift; run_fuzz "$@" ;;
    tsan) run_tsan ;;
    server) shift; build_server "$@" ;;
    *) die "unknown command '$1' (build | run | install PREFIX | test | gpu | fuzz | tsan | server; see ./build.sh --help)" ;;
esac
