#!/bin/sh
# tests/cli_newuser.sh - the CLI contract as a new user meets it: every command either succeeds with the output
# it promises, or ends with exit status 1 and one line on stderr naming the flag to change. Run from anywhere
# after ./build.sh (POSIX sh; bash works too):
#
#   sh tests/cli_newuser.sh          (build/dllm-test runs it as cli.new_user_commands_succeed_or_name_the_flag)
#
# Prints one line per check and last "N passed, N failed"; the exit status is 0 only when none failed.
cd "$(dirname "$0")/.." || exit 1
M=models/tiny-llada
D=models/tiny-dream
F=models/tiny-fast-dllm-v2
A=models/tiny-add
G=build/dllm-generate
E=build/dllm-eval
T=build/dllm-tokenize
Q=build/dllm-quantize
passed=0
failed=0
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
NL='
'

pass() { printf 'ok    %s\n' "$1"; passed=$((passed + 1)); }
flunk() { printf 'FAIL  %s\n' "$1"; failed=$((failed + 1)); }

for b in "$G" "$E" "$T" "$Q"; do
    if [ ! -x "$b" ]; then
        echo "FAIL  $b is not built: run ./build.sh first"
        echo "0 passed, 1 failed"
        exit 1
    fi
done

# run CMD...: stdout in $tmp/out, stderr in $tmp/err, the exit status in $rc.
run() {
    "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
}

# Library field and constant names that must not reach a CLI user (the flags are the user's words).
leaks_fields() { grep -qE 'gen_length|sub_block_length|block_length|block_cache|DLLM_[A-Z_]+|n_devices|kv_cache|cfg_scale|alg_temp' "$tmp/err"; }

succeeds() {  # succeeds CMD...: exit status 0 and something on stdout
    run "$@"
    if [ "$rc" = 0 ] && [ -s "$tmp/out" ]; then pass "$*"; else flunk "$*: exit $rc, stdout $(wc -c <"$tmp/out") bytes, stderr: $(cat "$tmp/err")"; fi
}

names_flag() {  # names_flag TEXT CMD...: exit status 1, one line on stderr that contains TEXT, no library field names
    want=$1
    shift
    run "$@"
    lines=$(wc -l <"$tmp/err")
    if [ "$rc" = 1 ] && [ "$lines" = 1 ] && grep -qF -- "$want" "$tmp/err" && ! leaks_fields; then
        pass "$*  ->  $(cat "$tmp/err")"
    else
        flunk "$*: exit $rc, $lines line(s), want one naming '$want' (and no field names): $(cat "$tmp/err")"
    fi
}

warns() {  # warns TEXT CMD...: exit status 0, an answer on stdout, and one "warning:" line on stderr that contains TEXT
    want=$1
    shift
    run "$@"
    if [ "$rc" = 0 ] && [ -s "$tmp/out" ] && [ "$(grep -c 'warning:' "$tmp/err")" = 1 ] && grep 'warning:' "$tmp/err" | grep -qF -- "$want"; then
        pass "$*  ->  $(grep 'warning:' "$tmp/err")"
    else
        flunk "$*: exit $rc, want an answer and one warning naming '$want': $(cat "$tmp/err")"
    fi
}

expect() {  # expect DESCRIPTION CMD...: CMD (a test of the last run's files) succeeds
    what=$1
    shift
    if "$@"; then pass "$what"; else flunk "$what"; fi
}

# ---- the commands of the first new-user report --------------------------------------------------------
succeeds "$G" -m "$M" -p hi -n 16
names_flag --threshold "$G" -m "$M" -p hi --alg origin --threshold 0.9
names_flag --cache "$G" -m "$M" -p "hi <|mdm_mask|> there" -n 16 --cache dual
succeeds "$G" --version
succeeds "$G" -m "$M" -p hi -n 16 --json
names_flag "unknown option --bogus" "$E" -m "$M" --nll tests/data/heldout.txt --bogus
names_flag --factor "$G" -m "$M" -p hi --factor 1 --threshold 0.9
names_flag --timesteps "$G" -m "$M" -p hi --timesteps --threshold 0.9
names_flag -p "$G" -m "$M" -p a -p b
succeeds "$G" -m "$M" -p hi -n 16 --seed -1 --temp 0.7
succeeds "$G" -m "$M" --ids "316 998" -n 32 --steps 32 --block 8
expect "--ids prints text, not ids, with a tokenizer" eval '! grep -q "^ids:" "$tmp/out"'
succeeds "$G" -m "$M" -p "Tell me a story about a dog." -n 128 --steps 128 --block 32
succeeds "$G" -m "$M" -p "Tell me a story about a dog." -n 32 --progress
names_flag "--nll /nonexistent: No such file" "$E" -m "$M" --nll /nonexistent
names_flag "--add README.md:1" "$E" -m "$A" --add README.md
names_flag "-m" "$G" -m /nonexistent -p hi
names_flag --block "$G" -m "$M" -p hi -n 16 --block 5
printf '316 198 998\n316\n' >"$tmp/ids"
succeeds "$T" -m "$M" --decode <"$tmp/ids"
expect "dllm-tokenize --decode: one line out per line in" [ "$(wc -l <"$tmp/out")" = 2 ]

# ---- --steps beyond what can commit: refused with the limit, quickly --------------------------------------
names_flag "--steps 32 or less" "$G" -m "$M" -p hi -n 32 --steps 256
names_flag "--steps 32 or less" timeout 20 "$G" -m "$M" -p hi -n 32 --steps 1000000
succeeds "$G" -m "$M" -p hi -n 32 --steps 32 --json
expect "--steps at the limit (-n) runs" grep -q '"steps": 32' "$tmp/out"
warns "--steps is ignored with --threshold" "$G" -m "$M" -p hi -n 16 --threshold 0.9 --steps 16

# ---- --prompts: a bad prompt is named, the others print, one line per answer --------------------------------
python_free_long_prompt() { i=0; while [ $i -lt 300 ]; do printf 'word '; i=$((i + 1)); done; }
{ echo "Tell me a story."; python_free_long_prompt; echo; echo "hi"; } >"$tmp/prompts"
run "$G" -m "$M" --prompts "$tmp/prompts" -n 16
expect "--prompts with a too-long prompt 1: exit 1" [ "$rc" = 1 ]
expect "--prompts: 'prompt 1: ...' names it and the flag" eval 'grep -q "^dllm-generate: prompt 1: .*lower -n" "$tmp/err" && [ "$(grep -c "prompt [0-9]*:" "$tmp/err")" = 1 ]'
expect "--prompts: prompts 0 and 2 still print, 1 does not" eval 'grep -q "^\[0\] ." "$tmp/out" && grep -q "^\[2\] ." "$tmp/out" && ! grep -q "^\[1\]" "$tmp/out" && [ "$(wc -l <"$tmp/out")" = 2 ]'
run "$G" -m "$M" --prompts "$tmp/prompts" -n 16 --json
expect "--prompts --json: one object per line, in order, the failed one with its error" eval '[ "$(wc -l <"$tmp/out")" = 3 ] &&
    sed -n 1p "$tmp/out" | grep -q "^{\"index\": 0, \"text\": .*\"ids\": \[.*}}$" &&
    sed -n 2p "$tmp/out" | grep -q "^{\"index\": 1, \"error\": \"the prompt is [0-9]* tokens.*\"}$" &&
    sed -n 3p "$tmp/out" | grep -q "^{\"index\": 2, \"text\": "'
printf 'hi\nx <|mdm_mask|> y\nok\n' >"$tmp/masked"
run "$G" -m "$M" --prompts "$tmp/masked" -n 16 --cache dual
expect "--prompts: a typed mask with --cache fails its prompt only" eval '[ "$rc" = 1 ] && grep -q "^dllm-generate: prompt 1: .*drop --cache" "$tmp/err" &&
    grep -q "^\[0\] " "$tmp/out" && grep -q "^\[2\] " "$tmp/out"'
# an answer that spans lines stays on one line, escaped; unescaped it is the -p answer
echo "Tell me a story." >"$tmp/one"
run "$G" -m "$M" -p "Tell me a story." -n 32
awk '{ gsub(/\\/, "\\\\"); printf "%s%s", (NR > 1 ? "\\n" : ""), $0 }' "$tmp/out" >"$tmp/alone"
run "$G" -m "$M" --prompts "$tmp/one" -n 32
expect "--prompts: a multi-line answer is one line, newlines written \\n, equal to the -p answer" eval '[ "$(wc -l <"$tmp/out")" = 1 ] &&
    grep -qF "\\n" "$tmp/out" && [ "$(sed "s/^\[0\] //" "$tmp/out")" = "$(cat "$tmp/alone")" ]'

# ---- --temp: any finite temperature samples (log-space Gumbel keys); a hot one spreads over the vocabulary ----
succeeds "$G" -m "$M" --ids "316 998" -n 32 --steps 32 --temp 500 --seed 3 --print-ids --no-stop-at-eos
sed -n 's/^ids: //p' "$tmp/out" | tr ' ' '\n' >"$tmp/hot_ids"
expect "--temp 500 draws many ids, not only the lowest" eval '[ "$(sort -u "$tmp/hot_ids" | wc -l)" -ge 16 ] && [ "$(sort -n "$tmp/hot_ids" | head -n 1)" -gt 0 ]'
succeeds "$G" -m "$M" -p hi -n 16 --temp 1e9 --seed 3
names_flag "--temp must be a finite number" "$G" -m "$M" -p hi --temp inf

# ---- flags that do not apply are refused (or warned), naming the flag --------------------------------------
names_flag "drop --block-cache" "$G" -m "$M" -p hi -n 16 --block-cache
names_flag "drop --sub-block" "$G" -m "$D" --raw -p hi -n 16 --sub-block 4
names_flag "drop --steps" "$G" -m "$F" --raw -p hi -n 32 --steps 32
names_flag "drop --temp" "$G" -m "$F" --raw -p hi -n 32 --temp 0.5
names_flag "drop --cache" "$G" -m "$F" --raw -p hi -n 32 --cache dual
succeeds "$G" -m "$F" --raw -p "Life is" -n 32 --block-cache --sub-block 4 --threshold 0.9

# ---- block-diffusion and other errors in flag names ----------------------------------------------------------
names_flag "--block" "$G" -m "$F" --raw -p hi -n 30
names_flag "--sub-block 5 must divide" "$G" -m "$F" --raw -p hi -n 32 --sub-block 5
names_flag "drop --alg" "$G" -m "$F" --raw -p hi -n 32 --alg entropy
names_flag "drop --devices" "$G" -m "$M" -p hi -n 16 --devices 0,1 --backend cpu
run "$G" -m "$M" -p hi -n 16 --devices 0,1
expect "--devices 0,1: answers (two GPUs) or says drop --devices" eval '[ "$rc" = 0 ] || { [ "$rc" = 1 ] && grep -q "drop --devices" "$tmp/err" && ! leaks_fields; }'
names_flag "-n 99999999999999999999 is too large" "$G" -m "$M" -p hi -n 99999999999999999999
names_flag "--steps 99999999999999999999 is too large" "$G" -m "$M" -p hi --steps 99999999999999999999

# ---- --stop: the ids and their count are those of the cut text -----------------------------------------------
run "$G" -m "$M" -p "Tell me a story" -n 32 --print-ids --stop " never"
sed '$d' "$tmp/out" >"$tmp/text"
sed -n '$s/^ids: //p' "$tmp/out" >"$tmp/stop_ids"
n_ids=$(wc -w <"$tmp/stop_ids")
expect "--stop: the decoding ended at the stop string, which is not printed" eval '[ "$rc" = 0 ] && grep -q "ended at a stop string" "$tmp/err" &&
    ! grep -q " never" "$tmp/text" && [ "$n_ids" -gt 0 ]'
expect "--stop --print-ids: the stats line counts the ids printed" grep -q "^generated $n_ids tokens" "$tmp/err"
run "$T" -m "$M" --decode --raw-newlines <"$tmp/stop_ids"
expect "--stop --print-ids: the ids decode to the text printed" cmp -s "$tmp/out" "$tmp/text"
run "$G" -m "$M" -p "Tell me a story" -n 32 --json --stop " never"
expect "--stop --json: n_generated is the number of ids" eval 'grep -q "\"n_generated\": $n_ids," "$tmp/out" &&
    [ "$(sed "s/.*\"ids\": \[\([^]]*\)\].*/\1/" "$tmp/out" | tr -d , | wc -w)" = "$n_ids" ]'

# ---- --visual marks where the answer ends; empty prompts warn ------------------------------------------------
run "$G" -m "$M" -p hi -n 16 --visual
expect "--visual draws [EOS] where the answer ends, and '1 mask left'" eval '[ "$rc" = 0 ] && grep -q "\[EOS\]" "$tmp/out" &&
    grep -q "1 mask left$" "$tmp/out" && ! grep -q " 1 masks" "$tmp/out"'
warns '-p "" is an empty prompt' "$G" -m "$M" -p "" -n 8
: >"$tmp/empty"
warns "-f $tmp/empty is empty" "$G" -m "$M" -f "$tmp/empty" -n 8
warns "--ids is empty" "$G" -m "$M" --ids "" -n 8

# ---- dllm-tokenize and dllm-eval -------------------------------------------------------------------------------
printf '316 198\n316 abc 5\n' >"$tmp/badids"
names_flag 'line 2: bad id "abc"' "$T" -m "$M" --decode <"$tmp/badids"
printf '316\n\n316 99999\n' >"$tmp/badids"
names_flag "line 3: id 99999 is outside" "$T" -m "$M" --decode <"$tmp/badids"
names_flag "--add $tmp/empty holds no problem" "$E" -m "$A" --add "$tmp/empty"
names_flag "--limit must be an integer >= 1" "$E" -m "$A" --add tests/data/add_test.txt --limit 0
run "$E" --help
expect "dllm-eval --help documents --limit's default" grep -q -- "--limit N .*default: all" "$tmp/out"

# ---- plurals, -t ------------------------------------------------------------------------------------------------
run "$G" -m "$M" --raw -p "Life is" -n 1
expect "one token: 'generated 1 token (', '1 step', '1 forward'" grep -q "^generated 1 token (prompt [0-9]*) in 1 step, 1 forward," "$tmp/err"
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
if [ "$cores" -lt 1000 ]; then
    run "$G" -m "$M" -p hi -n 8 -t 1000
    expect "-t above the cores is clamped, with a note" eval '[ "$rc" = 0 ] && grep -q "note: -t 1000 is more than the $cores core.* using $cores$" "$tmp/err"'
fi

# ---- quantising at load says so on a terminal (a pseudo-terminal from util-linux `script`), then erases the line ----
if command -v script >/dev/null 2>&1; then
    script -qec "$G -m $M -p hi -n 8 --precision soloq-i --backend cpu" /dev/null >"$tmp/tty" 2>&1 </dev/null
    expect "--precision soloq-i at load: a 'quantising' line on the terminal, then the answer" eval 'grep -q "quantising the linears to soloq-i at load" "$tmp/tty" &&
        grep -q "generated [0-9]* tokens" "$tmp/tty"'
fi

# ---- the library, the build script, the bundled models ------------------------------------------------------------
if [ -f build/libdllm.so ]; then
    expect "libdllm.so has a SONAME, and build/ holds the file it names" eval 'so=$(readelf -d build/libdllm.so | sed -n "s/.*SONAME.*\[\(.*\)\]/\1/p") &&
        [ -n "$so" ] && [ -e "build/$so" ]'
    if command -v gcc >/dev/null 2>&1 && command -v pkg-config >/dev/null 2>&1; then
        printf '#include <dllm.h>\n#include <stdio.h>\nint main(void) { printf("%%s\\n", dllm_version()); return 0; }\n' >"$tmp/app.c"
        # shellcheck disable=SC2046
        gcc -std=c99 -o "$tmp/app" "$tmp/app.c" $(PKG_CONFIG_PATH=build pkg-config --cflags --libs dllm 2>/dev/null) >"$tmp/err" 2>&1
        run env -u LD_LIBRARY_PATH "$tmp/app"
        expect "a pkg-config build runs without LD_LIBRARY_PATH" eval '[ "$rc" = 0 ] && "$G" --version | grep -qF "dllm $(cat "$tmp/out"))"'
        # shellcheck disable=SC2046
        gcc -std=c99 -o "$tmp/simple" examples/simple.c $(PKG_CONFIG_PATH=build pkg-config --cflags --libs dllm 2>/dev/null) >"$tmp/err" 2>&1
        run env -u LD_LIBRARY_PATH "$tmp/simple" -m "$M" "What is the meaning of life?"
        expect "the pkg-config build of examples/simple.c answers without LD_LIBRARY_PATH, as build/simple does" eval '[ "$rc" = 0 ] && [ -s "$tmp/out" ] &&
            build/simple -m "$M" "What is the meaning of life?" 2>/dev/null | cmp -s - "$tmp/out"'
    fi
fi
# examples/simple.c, built by ./build.sh: text in, text out, the answer dllm-generate gives with the same settings
succeeds build/simple -m "$M" "What is the meaning of life?"
cp "$tmp/out" "$tmp/simple_out"
run "$G" -m "$M" -p "What is the meaning of life?" -n 64
expect "build/simple's answer is dllm-generate's for the same prompt (-n 64, early stop on in both)" cmp -s "$tmp/out" "$tmp/simple_out"
run ./build.sh --help
expect "./build.sh --help prints the usage" eval '[ "$rc" = 0 ] && grep -q "^  ./build.sh run" "$tmp/out" && grep -q "^  ./build.sh install PREFIX" "$tmp/out"'
run env DLLM_REUSE_BUILD=1 ./build.sh run "Life is" --raw -n 8 --json
expect "./build.sh run \"Q\" -n 8 passes the flags on" eval '[ "$rc" = 0 ] && grep -q "\"n_prompt\": 2, .*\"steps\": 8," "$tmp/out"'
run env DLLM_REUSE_BUILD=1 ./build.sh run
expect "./build.sh run's default prompt gets an answer of words" eval '[ "$rc" = 0 ] && [ "$(head -n 1 "$tmp/out" | grep -oE "[A-Za-z]+" | wc -l)" -ge 3 ]'
run "$G" --help
expect "dllm-generate --help says what each bundled model needs" eval 'grep -q "models/tiny-add .*--raw .*-n 8" "$tmp/out" && grep -q "models/tiny-dream .*--raw" "$tmp/out"'
expect "models/README.md describes every bundled model" eval '(for m in models/*/; do grep -qF "\`$(basename "$m")\`" models/README.md 2>/dev/null || exit 1; done)'
succeeds "$G" -m "$A" --raw -p "12345+54321=" -n 8
expect "tiny-add with --raw -n 8 adds" grep -qx "66666" "$tmp/out"
names_flag "--raw leaves it out" "$G" -m "$A" -p "12345+54321=" -n 8

# ---- --mask-id: a Fast-dLLM v2 checkpoint with neither tokenizer files nor mask_token_id loads; generating asks for it ----
mkdir "$tmp/bare"
cp "$F/config.json" "$F/model.safetensors" "$tmp/bare/"
names_flag "--mask-id" "$G" -m "$tmp/bare" --ids "5 17 42 9 3" -n 32
succeeds "$G" -m "$tmp/bare" --ids "5 17 42 9 3" -n 32 --mask-id 155

# ---- a cold build says what it is building: ./build.sh in a copy of the sources, with an nvcc that only writes its -o file ----
mkdir -p "$tmp/cold/cuda/bin" "$tmp/cold/tree/tools"
printf '#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && : >"$2"; shift; done\nexit 0\n' >"$tmp/cold/cuda/bin/nvcc"
chmod +x "$tmp/cold/cuda/bin/nvcc"
cp -R build.sh dllm.h dllm_cuda.cu src examples "$tmp/cold/tree/" && cp tools/amalgamate.py "$tmp/cold/tree/tools/"
run env CUDA_HOME="$tmp/cold/cuda" "$tmp/cold/tree/build.sh"
expect "a cold ./build.sh says what it builds, on stderr: the library, its link, each program, the tests, the benchmark" eval '[ "$rc" = 0 ] && [ ! -s "$tmp/out" ] &&
    grep -q "^build.sh: compiling the library" "$tmp/err" && grep -q "^build.sh: linking build/libdllm.so" "$tmp/err" &&
    grep -q "^build.sh: building build/dllm-generate" "$tmp/err" && grep -q "^build.sh: building build/simple" "$tmp/err" &&
    grep -q "^build.sh: compiling the test suite" "$tmp/err" && grep -q "^build.sh: compiling the benchmark" "$tmp/err"'
run env CUDA_HOME="$tmp/cold/cuda" "$tmp/cold/tree/build.sh"
expect "a second ./build.sh on an unchanged tree builds nothing and says nothing" eval '[ "$rc" = 0 ] && ! grep -q "^build.sh: " "$tmp/err"'

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
