#!/usr/bin/env bash
# soloq_eval.sh - SoloQ's accuracy table for BENCHMARKS.md: dllm-eval on the CPU backend, one line per
# (model, precision, rotation, bias correction), tab-separated, on stdout.
#
#   nice -n 10 tools/soloq_eval.sh [WINDOWS] [ADD_LIMIT] > soloq_eval.tsv
#
# tiny-llada and tiny-dream: masked-token NLL at mask ratios 0.15 / 0.5 / 0.9 (dllm-eval --nll on
# tests/data/heldout.txt, WINDOWS windows of 128 ids, default 32; the same masks for every configuration).
# tiny-add: exact match on the first ADD_LIMIT problems of tests/data/add_test.txt (default 500; its
# context is 20 tokens, too short for the NLL protocol). Configurations: bf16, fp8, rtn-w4a4, then each
# SoloQ quantiser (soloq-n, soloq-i, soloq-c) under Hadamard-only, RPBH, K-RPBH without and with the bias
# correction (DLLM_SOLOQ_ROTATION, DLLM_SOLOQ_BIAS_CORRECTION; dllm.h); the headline configurations first.
# Needs ./build.sh build first.
set -euo pipefail
cd "$(dirname "$0")/.."
WINDOWS=${1:-32}
ADD_LIMIT=${2:-500}

key_configs() {  # precision rotation bias_correction
    echo "bf16 - -"
    echo "fp8 - -"
    echo "rtn-w4a4 none 0"
    for q in soloq-n soloq-i soloq-c; do echo "$q krpbh 1"; done
}

ablation_configs() {
    for q in soloq-n soloq-i soloq-c; do
        echo "$q hadamard 1"
        echo "$q rpbh 1"
        echo "$q krpbh 0"
    done
}

value() { awk -v k="$1" '$1 == k { print $2 }'; }

run() {  # model precision rotation bias_correction
    local model=$1 precision=$2 rotation=$3 bc=$4 out env=()
    [ "$rotation" != - ] && env+=(DLLM_SOLOQ_ROTATION="$rotation" DLLM_SOLOQ_BIAS_CORRECTION="$bc")
    if [ "$model" = tiny-add ]; then
        out=$(env "${env[@]}" build/dllm-eval -m "models/$model" --backend cpu --precision "$precision" --add tests/data/add_test.txt --limit "$ADD_LIMIT")
        printf '%s\t%s\t%s\t%s\t-\t-\t-\t%s\n' "$model" "$precision" "$rotation" "$bc" "$(value exact_match <<<"$out")"
    else
        out=$(env "${env[@]}" build/dllm-eval -m "models/$model" --backend cpu --precision "$precision" --nll tests/data/heldout.txt --windows "$WINDOWS")
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t-\n' "$model" "$precision" "$rotation" "$bc" "$(value nll_0.15 <<<"$out")" "$(value nll_0.50 <<<"$out")" \
            "$(value nll_0.90 <<<"$out")"
    fi
}

printf 'model\tprecision\trotation\tbias_correction\tnll_0.15\tnll_0.50\tnll_0.90\texact_match\n'
for configs in key_configs ablation_configs; do  # the headline numbers first
    for model in tiny-llada tiny-dream tiny-add; do
        $configs | while read -r precision rotation bc; do run "$model" "$precision" "$rotation" "$bc"; done
    done
done
