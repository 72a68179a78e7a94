#!/usr/bin/env bash
# run_device.sh -- the one device run (from the repo root: bash dev/q4wg/run_device.sh). Host emulation, build, SASS
# count, then the bench (SoloQ-I / RTN: every old and new config checked bit-exactly and timed; SoloQ-N: checked against
# the twin within the fp32-order tolerance and for bit-reproducibility, timed). ~2 min in all. Prints to stdout and, if
# $OUT is set, to $OUT/q4wg2_bench.log. Set Q4WG_QUICK=1 for --quick.
# Exit status: the bench's (0 all ok, 1 mismatch, 2 CUDA error) or 3 if the build failed.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log="${OUT:+$OUT/q4wg2_bench.log}"
main() {
  cd "$here" || return 3
  echo "== q4wg2 device run: $(date -u +%FT%TZ) =="
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total,power.limit --format=csv 2>/dev/null || true
  nvcc --version | tail -1
  if command -v g++ >/dev/null; then
    g++ -O2 -o emu_test emu_test.cpp && ./emu_test || echo "emu_test FAILED (host-side index arithmetic)"
  fi
  echo "== build: nvcc -arch=sm_90a -O3 -o bench bench.cu -lcublasLt =="
  if ! nvcc -arch=sm_90a -O3 -o bench bench.cu -lcublasLt -Xptxas -v 2> ptxas.txt; then
    cat ptxas.txt; echo "BUILD FAILED"; return 3
  fi
  grep -E "Compiling entry|spill stores|Used" ptxas.txt | paste - - - | sed -E "s/ptxas info +: //g; s/Compiling entry function '([^']*)' for 'sm_90a'/\1/" \
    | awk -F'\t' '{gsub(/^ +/, "", $2); print "  " $1 ": " $3 "; " $2}'
  echo "== SASS count (main loop) =="
  timeout 60 bash sass_count.sh 2>&1 | grep -v "^  _Z" || true
  echo "== bench =="
  timeout 140 ./bench ${Q4WG_QUICK:+--quick}
  local rc=$?
  echo "bench exit status: $rc"
  return $rc
}
if [ -n "$log" ]; then
  mkdir -p "$OUT"; main 2>&1 | tee "$log"; exit "${PIPESTATUS[0]}"
else
  main 2>&1; exit $?
fi
