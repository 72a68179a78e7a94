#!/bin/sh
# tests/cli_newuser.sh - the commands a new user tried (issue 27), each of which must either succeed or end
# with exit status 1 and one line on stderr naming the flag to change. Run from anywhere after ./build.sh:
#
#   sh tests/cli_newuser.sh          (build/dllm-test runs it as cli.new_user_commands_succeed_or_name_the_flag)
#
# Prints one line per command; the exit status is the number of commands that broke the rule.
cd "$(dirname "$0")/.." || exit 1
M=models/tiny-llada
G=build/dllm-generate
E=build/dllm-eval
failures=0
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

succeeds() {  # succeeds CMD...: exit status 0
    if err=$("$@" 2>&1 >"$tmp/out"); then
        echo "ok    $*"
    else
        echo "FAIL  $*: exit $?, stderr: $err"
        failures=$((failures + 1))
    fi
}

names_flag() {  # names_flag FLAG CMD...: exit status 1 and one line on stderr that contains FLAG
    flag=$1
    shift
    err=$("$@" 2>&1 >/dev/null)
    rc=$?
    lines=$(printf '%s\n' "$err" | wc -l)
    if [ "$rc" = 1 ] && [ "$lines" = 1 ] && printf '%s' "$err" | grep -qF -- "$flag"; then
        echo "ok    $*  ->  $err"
    else
        echo "FAIL  $*: exit $rc, $lines line(s), want one naming $flag: $err"
        failures=$((failures + 1))
    fi
}

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
[ -s "$tmp/out" ] && ! grep -q '^ids:' "$tmp/out" || { echo "FAIL  --ids printed no text"; failures=$((failures + 1)); }
succeeds "$G" -m "$M" -p "Tell me a story about a dog." -n 128 --steps 128 --block 32
succeeds "$G" -m "$M" -p "Tell me a story about a dog." -n 32 --progress
names_flag "--nll /nonexistent: No such file" "$E" -m "$M" --nll /nonexistent
names_flag "--add README.md:1" "$E" -m models/tiny-add --add README.md
names_flag "-m" "$G" -m /nonexistent -p hi
names_flag --block "$G" -m "$M" -p hi -n 16 --block 5
printf '316 198 998\n316\n' | succeeds build/dllm-tokenize -m "$M" --decode
[ "$(wc -l < "$tmp/out")" = 2 ] || { echo "FAIL  dllm-tokenize --decode: $(wc -l < "$tmp/out") lines for 2"; failures=$((failures + 1)); }
# ./build.sh run, without its build step (which would rebuild here if a carried build looks older than its sources)
succeeds "$G" -m "$M" -p "Tell me something wise about computers." -n 64 --steps 64 --block 16

echo "$failures command(s) broke the rule"
exit "$failures"
