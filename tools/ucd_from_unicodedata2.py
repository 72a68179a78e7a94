#!/usr/bin/env python3
"""ucd_from_unicodedata2.py - the three Unicode Character Database files tools/gen_unicode_tables.py reads
(UnicodeData.txt, PropList.txt's White_Space, DerivedNormalizationProps.txt's Full_Composition_Exclusion),
written from the `unicodedata2` package, for a Unicode version no Debian package ships.

dllm's tables follow the Unicode version of the Oniguruma inside Hugging Face `tokenizers` (0.23: Unicode
16.0.0; tools/tokenizer_diff.py finds the letters a mismatch misplaces):

    pip install --target /tmp/ud16 unicodedata2==16.0.0
    PYTHONPATH=/tmp/ud16 python3 tools/ucd_from_unicodedata2.py /tmp/ucd16
    python3 tools/gen_unicode_tables.py /tmp/ucd16 dllm_cuda.cu

With unicodedata2==15.0.0 this reproduces the tables generated from Debian's unicode-data 15.0.0 byte for
byte. Only the fields the generator reads are filled in. White_Space has not changed since Unicode 6.3; a
character with a canonical decomposition is Full_Composition_Exclusion exactly when NFC does not give it
back.
"""
import os
import sys

import unicodedata2 as ud

WHITE_SPACE = ["0009..000D", "0020", "0085", "00A0", "1680", "2000..200A", "2028", "2029", "202F", "205F", "3000"]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "UnicodeData.txt"), "w") as f:
        for cp in range(0x110000):
            gc = ud.category(chr(cp))
            if gc != "Cn":
                f.write("%04X;X;%s;%d;;%s;;;;;;;;;\n" % (cp, gc, ud.combining(chr(cp)), ud.decomposition(chr(cp))))
    with open(os.path.join(out, "PropList.txt"), "w") as f:
        f.writelines("%s ; White_Space\n" % r for r in WHITE_SPACE)
    with open(os.path.join(out, "DerivedNormalizationProps.txt"), "w") as f:
        f.write("# DerivedNormalizationProps-%s.txt\n" % ud.unidata_version)
        for cp in range(0x110000):
            d = ud.decomposition(chr(cp))
            if d and not d.startswith("<") and ud.normalize("NFC", chr(cp)) != chr(cp):
                f.write("%04X ; Full_Composition_Exclusion\n" % cp)


if __name__ == "__main__":
    main()
