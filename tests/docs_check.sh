#!/usr/bin/env bash
# tests/docs_check.sh - the user-facing docs (README.md, docs/*.md, dllm.h) name only files that exist in the
# repository and tell no project history. Exit status 0 when clean, 1 with one line per offender otherwise.
#
# Paths checked:
#   - markdown links [text](target) in README.md and docs/*.md (relative to the linking file; web links and
#     #anchors are skipped);
#   - `backticked` spans and prose words that look like repository paths: a word whose first component is a
#     top-level entry of the repository (or src/, docs/, python/, examples/, tools/, tests/, models/), or any
#     word ending in .md .c .h .cu .cuh .py .sh .inl; in fenced code blocks, words that start with one of those
#     directories or with ./ ;
#   - in dllm.h, the same words anywhere in its comments.
#   A path must exist when the check runs (so src/... passes once the source tree is merged). Globs and
#   placeholders (*, <name>, {l}) pass when something matches. Allowed without existing: build outputs
#   (build/...), absolute paths, $VARIABLES, ~/..., PREFIX-style placeholders (an upper-case first component),
#   and the reference implementations' own file names listed in EXTERNAL below. ../ (outside the repository)
#   always fails.
# History narration (README.md, docs/*.md, dllm.h): issue numbers, sessions, work periods, numbered runs, device
#   calls, "has not run on ...", the build machine. History belongs in CHANGELOG.md and BENCHMARKS.md.
# The shipped code (src/, examples/, tools/, python/dllm/) too: no issue numbers, work periods, numbered runs, device
#   calls or dates (a measurement in a comment names its card, not its day). ("session" is allowed there: the CLI's
#   struct has that name. The tests may name the issue a requirement came from.)
set -u
cd "$(dirname "$0")/.."

# File names of the upstream reference implementations and of NVIDIA headers that the docs cite by name.
EXTERNAL=" generate.py generation_utils.py modeling.py chat.py eval.py generation_functions.py cuda_fp8.h "
# ... and the user's own program in build commands.
EXTERNAL+=" app.c "
TOPDIRS="examples|tools|tests|src|docs|python|models"
fail=0
bad() { echo "docs_check: $*"; fail=1; }

shopt -s nullglob
docs=(README.md docs/*.md)

# The candidate words of a file, cleaned and filtered to those that name repository paths, as
# "LINE<TAB>KIND<TAB>PATH" (KIND: link, for markdown links, resolved relative to the file; path otherwise).
# MODE md: markdown (links, code spans, prose; in fenced blocks only words under TOPDIRS or ./); MODE h: every word.
candidates() {
    awk -v mode="$1" -v topdirs="$TOPDIRS" -v top="$(ls -A | grep -v '^\.git$' | tr '\n' '|' | sed 's/[.]/[.]/g; s/|$//')" '
    function is_path(w, kind,   first) {
        sub(/#.*/, "", w)                                   # anchors
        sub(/[.:,;!?*]+$/, "", w); sub(/:[0-9][0-9-]*$/, "", w)
        if (w == "" || w ~ /[ \t]/) return ""
        if (w ~ /^(https?|mailto):/) return ""
        if (w ~ /^\.\.\//) return w
        if (w ~ /^(\/|\$|~|build\/|build$)/) return ""
        if (kind == "link") return w
        if (w !~ /\//) return (w ~ /^[A-Za-z0-9_.-]+\.(md|c|h|cu|cuh|py|sh|inl)$/) ? w : ""
        if (w !~ /^[A-Za-z0-9_.{}<>*-]+(\/[A-Za-z0-9_.{}<>*-]*)+$/) return ""
        first = w; sub(/\/.*/, "", first)
        if (first ~ /^[A-Z][A-Z0-9_]*$/) return ""          # PREFIX/bin, DIR/config.json: placeholders
        if (first ~ ("^(" topdirs ")$") || first ~ ("^(" top ")$") || first ~ /^\./ ||
            w ~ /\.(md|c|h|cu|cuh|py|sh|inl|json|txt)$/) return w
        return ""
    }
    function emit(kind, w,   p) { p = is_path(w, kind); if (p != "") print FNR "\t" (kind == "link" ? "link" : "path") "\t" p }
    mode == "h" { n = split($0, ws, /[ \t"'\''`(),;|]+/); for (i = 1; i <= n; i++) emit("prose", ws[i]); next }
    /^[ \t]*```/ { fence = !fence; next }
    fence {
        n = split($0, ws, /[ \t"'\''=(),;|<>]+/)
        for (i = 1; i <= n; i++) if (ws[i] ~ ("^(\\./|(" topdirs ")/)")) emit("fence", ws[i])
        next
    }
    {
        line = $0
        while (match(line, /\]\([^)]+\)/)) { emit("link", substr(line, RSTART + 2, RLENGTH - 3)); line = substr(line, RSTART + RLENGTH) }
        line = $0
        while (match(line, /`[^`]+`/)) { emit("code", substr(line, RSTART + 1, RLENGTH - 2)); line = substr(line, RSTART + RLENGTH) }
        line = $0
        gsub(/`[^`]+`/, " ", line); gsub(/\]\([^)]+\)/, " ", line)
        n = split(line, ws, /[ \t"(),;|]+/)
        for (i = 1; i <= n; i++) emit("prose", ws[i])
    }' "$2"
}

# Exit 0 if PATH (relative to DIR) exists; placeholders (<name>, {l}) and globs match anything.
exists() {
    local dir=$1 p=$2 g
    g=$(printf '%s' "$p" | sed -e 's/<[^>]*>/*/g' -e 's/{[^}]*}/*/g')
    if [[ "$g" == *"*"* ]]; then
        local m=( $dir/$g )
        [ ${#m[@]} -gt 0 ]
    else
        [ -e "$dir/$p" ]
    fi
}

check_file() {
    local f=$1 line kind p dir
    while IFS=$'\t' read -r line kind p; do
        dir=.
        [ "$kind" = link ] && dir=$(dirname "$f")
        if [[ "$p" == ../* ]]; then                 # a relative link may climb to the root, not above it
            case "$(realpath -m --relative-to=. "$dir/$p")" in
                ..|../*) bad "$f:$line: names $p, outside the repository"; continue ;;
            esac
        fi
        if [[ "$p" != */* ]]; then                  # a bare file name: anywhere in the repository
            [[ "$EXTERNAL" == *" $p "* ]] && continue
            [ -e "$p" ] && continue
            [ -n "$(find . -path ./.git -prune -o -path ./build -prune -o -name "$p" -print -quit)" ] && continue
            bad "$f:$line: names $p, which is not a file in the repository"
            continue
        fi
        exists "$dir" "$p" || bad "$f:$line: names $p, which does not exist"
    done
}

for f in "${docs[@]}"; do
    [ -f "$f" ] || { bad "$f: missing"; continue; }
    check_file "$f" < <(candidates md "$f")
done
if [ -f dllm.h ]; then check_file dllm.h < <(candidates h dllm.h); else bad "dllm.h: missing"; fi

# History narration.
history='issue #?[0-9]|\bsessions?\b|work period|\b(in|of|from|since|after|before) runs? [0-9]+|device calls?\b|has not (yet )?(been )?run on|not (yet )?(been )?run on (a|the) (device|gpu|h100|h200)|build machine'
for f in "${docs[@]}" dllm.h; do
    [ -f "$f" ] || continue
    while IFS= read -r hit; do
        bad "$f:${hit%%:*}: history narration (belongs in CHANGELOG.md or BENCHMARKS.md): ${hit#*:}"
    done < <(grep -n -i -E "$history" "$f" | cut -c1-160)
done

code_history='issue #?[0-9]|work period|\b(in|of|from|since|after|before) runs? [0-9]+|device calls?\b|has not (yet )?(been )?run on|not (yet )?(been )?run on (a|the) (device|gpu|h100|h200)|build machine|\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b'
while IFS= read -r hit; do
    bad "${hit%%:*}: history in the code (belongs in CHANGELOG.md or BENCHMARKS.md): $(echo "${hit#*:}" | cut -c1-140)"
done < <(grep -rnEi --include='*.c' --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' --include='*.py' --include='*.sh' \
    --include='*.html' "$code_history" src examples tools python/dllm 2>/dev/null)

if [ "$fail" = 0 ]; then echo "docs_check: README.md, docs/*.md, dllm.h and the code: every named path exists, no history narration"; fi
exit "$fail"
