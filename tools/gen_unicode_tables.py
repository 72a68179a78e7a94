#!/usr/bin/env python3
"""gen_unicode_tables.py - writes the Unicode tables of dllm's tokenizer into dllm_cuda.cu.

The pre-tokenizer needs the classes of the Hugging Face split regexes (\\p{L}, \\p{N}, \\s) and the NFC
normalizer needs canonical combining classes, canonical decompositions and the composition exclusions.
dllm may not depend on ICU or utf8proc, so this script turns the Unicode Character Database into compact
range tables and pastes them between the markers `// BEGIN GENERATED: unicode tables` and
`// END GENERATED: unicode tables` in dllm_cuda.cu. Standard-library Python 3 only.

    apt-get download unicode-data && dpkg -x unicode-data_15.0.0-1_all.deb /tmp/ucd
    python3 tools/gen_unicode_tables.py /tmp/ucd/usr/share/unicode dllm_cuda.cu

Without the second argument the tables are printed to stdout.
"""
import os
import re
import sys


def read_unicode_data(ucd):
    """Yields (code point, name, general category, combining class, decomposition) for every assigned
    code point, expanding the <..., First>/<..., Last> ranges."""
    first = None
    with open(os.path.join(ucd, "UnicodeData.txt"), encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split(";")
            cp, name, gc, ccc, decomp = int(fields[0], 16), fields[1], fields[2], int(fields[3]), fields[5]
            if name.endswith(", First>"):
                first = cp
                continue
            start = first if name.endswith(", Last>") else cp
            first = None
            for c in range(start, cp + 1):
                yield c, gc, ccc, decomp


def read_property(path, prop):
    """Code points listed with `prop` in a PropList-style file."""
    out = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"([0-9A-F]+)(?:\.\.([0-9A-F]+))?\s*;\s*(\w+)", line)
            if m and m.group(3) == prop:
                lo = int(m.group(1), 16)
                hi = int(m.group(2), 16) if m.group(2) else lo
                out.update(range(lo, hi + 1))
    return out


def ranges(cps):
    """Sorted inclusive [lo, hi] ranges covering a set of code points."""
    out = []
    for c in sorted(cps):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def c_array(decl, numbers, per_line=24):
    lines = [decl + " = {"]
    for i in range(0, len(numbers), per_line):
        lines.append("    " + ", ".join(str(n) for n in numbers[i:i + per_line]) + ",")
    lines.append("};")
    return "\n".join(lines)


def generate(ucd):
    letters, numbers, ccc_of, decomps = set(), set(), {}, []
    for cp, gc, ccc, decomp in read_unicode_data(ucd):
        if gc.startswith("L"):
            letters.add(cp)
        if gc.startswith("N"):
            numbers.add(cp)
        if ccc:
            ccc_of[cp] = ccc
        if decomp and not decomp.startswith("<"):  # canonical only; <tag> marks compatibility mappings
            decomps.append((cp, [int(x, 16) for x in decomp.split()]))
    space = read_property(os.path.join(ucd, "PropList.txt"), "White_Space")
    excluded = read_property(os.path.join(ucd, "DerivedNormalizationProps.txt"), "Full_Composition_Exclusion")

    ccc_runs = []  # [lo, hi, class] over runs of equal non-zero classes
    for cp in sorted(ccc_of):
        if ccc_runs and ccc_runs[-1][1] == cp - 1 and ccc_runs[-1][2] == ccc_of[cp]:
            ccc_runs[-1][1] = cp
        else:
            ccc_runs.append([cp, cp, ccc_of[cp]])
    decomp_rows = []
    for cp, parts in decomps:
        assert len(parts) in (1, 2), (cp, parts)
        flag = 1 << 31 if cp in excluded else 0
        decomp_rows += [cp | flag, parts[0], parts[1] if len(parts) == 2 else 0]

    flat = lambda rs: [n for r in rs for n in r]
    with open(os.path.join(ucd, "DerivedNormalizationProps.txt"), encoding="utf-8") as f:
        m = re.search(r"DerivedNormalizationProps-([0-9.]+)\.txt", f.readline())
    version = m.group(1) if m else "(unknown version)"
    parts = [
        "// BEGIN GENERATED: unicode tables",
        "// Written by tools/gen_unicode_tables.py from the Unicode Character Database %s." % version,
        "// Ranges are inclusive [lo, hi] pairs sorted by lo.",
        c_array("static const uint32_t dllm__uc_letter[]", flat(ranges(letters))) + "  // General_Category L*",
        c_array("static const uint32_t dllm__uc_number[]", flat(ranges(numbers))) + "  // General_Category N*",
        c_array("static const uint32_t dllm__uc_space[]", flat(ranges(space))) + "  // White_Space (= Oniguruma \\s)",
        "// Canonical_Combining_Class runs: lo, hi, class (class 0 elsewhere).",
        c_array("static const uint32_t dllm__uc_ccc[]", flat(ccc_runs), 21),
        "// Canonical decompositions (one level): code point, first, second (0 for a singleton); the top bit",
        "// of the code point marks Full_Composition_Exclusion. Hangul syllables are algorithmic.",
        c_array("static const uint32_t dllm__uc_decomp[]", decomp_rows, 18),
        "// END GENERATED: unicode tables",
    ]
    return "\n".join(parts) + "\n"


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    tables = generate(sys.argv[1])
    if len(sys.argv) == 2:
        sys.stdout.write(tables)
        return
    path = sys.argv[2]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    begin, end = "// BEGIN GENERATED: unicode tables\n", "// END GENERATED: unicode tables\n"
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        sys.exit("%s: the markers %r and %r are missing" % (path, begin.strip(), end.strip()))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:i] + tables + text[j + len(end):])


if __name__ == "__main__":
    main()
