#!/usr/bin/env bash
# sass_count.sh -- compile the q4wg kernels for sm_90a (exactly as bench.cu instantiates them), dump SASS and print,
# per kernel, the main loop's SASS thread-instructions per weight and its instruction mix (sass_loop.py).
# Counting: the loop = the backward branch whose range holds the most IGMMA; regions inside it that a forward branch
# skips and that hold RED/ATOM/STG (the segment flush, once per tile segment) are reported apart; every other
# instruction in the loop is counted (predicated-off fillers too: they issue). Weights a pass = IGMMA x 64 x 32
# (m64 k32, 8-bit A); per weight = hot instructions x 128 threads / weights (per warpgroup).
# Needs cuobjdump + nvdisasm: /usr/local/cuda/bin, PATH, or `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
for d in /usr/local/cuda/bin $(python3 -c 'import nvidia, os; [print(os.path.join(p, "cu13", "bin")) for p in nvidia.__path__]' 2>/dev/null || true); do
  [ -d "$d" ] && PATH="$PATH:$d"
done
if ! command -v cuobjdump >/dev/null || ! command -v nvdisasm >/dev/null; then
  echo "sass_count: cuobjdump / nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"; exit 3
fi
chmod +x "$(command -v cuobjdump)" "$(command -v nvdisasm)" 2>/dev/null || true
nvcc -arch=sm_90a -O3 -cubin -o "$tmp/bench.cubin" "$here/bench.cu" -Xptxas -v 2> "$tmp/ptxas.txt"
echo "ptxas (registers / spills per kernel):"
grep -E "Compiling entry|spill stores|Used" "$tmp/ptxas.txt" | paste - - - | sed -E "s/ptxas info +: //g; s/Compiling entry function '([^']*)' for 'sm_90a'/\1/" \
  | awk -F'\t' '{gsub(/^ +/, "", $2); print "  " $1 ": " $3 "; " $2}'
cuobjdump -sass "$tmp/bench.cubin" > "$tmp/bench.sass"
python3 "$here/sass_loop.py" "$tmp/bench.sass"
