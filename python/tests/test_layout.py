"""The ctypes mirrors against dllm.h, through the C compiler: struct sizes, field names, order, offsets and sizes,
and every enum constant's value. A drift between the header and dllm/_types.py fails here."""
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dllm  # noqa: E402
from dllm import _types as T  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def find_header():
    """The header of the library under test: $DLLM_HEADER, the one beside the loaded library, the repository's."""
    candidates = [os.environ.get("DLLM_HEADER"), os.path.join(os.path.dirname(dllm.library_path()), "dllm.h"),
                  os.path.join(REPO, "dllm.h")]
    return next(path for path in candidates if path and os.path.exists(path))


def header_declarations(source):
    """{typedef name: [member names in order]} of the header's `typedef struct` and `typedef enum` bodies."""
    source = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    source = re.sub(r"//[^\n]*", "", source)
    structs, enums = {}, {}
    for kind, body, name in re.findall(r"typedef\s+(struct|enum)\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", source, flags=re.S):
        if kind == "enum":
            enums[name] = re.findall(r"\b([A-Z][A-Z0-9_]*)\s*=", body)
        else:  # the last identifier of each declaration, before an optional [N]
            structs[name] = [re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", decl).group(1)
                             for decl in body.split(";") if decl.strip()]
    return structs, enums


def probe_source():
    """A C program printing `name value` for every struct size, field offset and size, and enum constant."""
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "dllm.h"', 'int main(void) {']
    for c_name, mirror in T.C_STRUCTS.items():
        lines.append(f'printf("{c_name} %zu\\n", sizeof({c_name}));')
        for field, _ in mirror._fields_:
            lines.append(f'printf("{c_name}.{field} %zu %zu\\n", offsetof({c_name}, {field}), '
                         f'sizeof((({c_name} *)0)->{field}));')
    for enum_cls, prefix in T.C_ENUMS.values():
        for member in enum_cls:
            lines.append(f'printf("{prefix}{member.name} %lld\\n", (long long){prefix}{member.name});')
    return "\n".join(lines + ["return 0;", "}"]) + "\n"


class LayoutTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        names = (os.environ.get("CC"), "cc", "gcc", "clang")
        cls.compiler = compiler = next((shutil.which(name) for name in names if name and shutil.which(name)), None)
        if not compiler:
            return  # each test skips (setUp), so that the runner counts them
        cls.header = find_header()
        with open(cls.header, encoding="utf-8") as f:
            cls.c_structs, cls.c_enums = header_declarations(f.read())
        with tempfile.TemporaryDirectory() as tmp:
            src, exe = os.path.join(tmp, "probe.c"), os.path.join(tmp, "probe")
            with open(src, "w") as f:
                f.write(probe_source())
            build = subprocess.run([compiler, "-std=c99", "-I", os.path.dirname(cls.header), src, "-o", exe],
                                   capture_output=True, text=True)
            if build.returncode:
                raise AssertionError(f"the layout probe does not compile against {cls.header} (a field or constant "
                                     f"the mirrors name is gone?):\n{build.stderr}")
            output = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
        cls.c = {key: [int(v) for v in values] for key, *values in (line.split() for line in output.splitlines())}

    def setUp(self):
        if not self.compiler:
            self.skipTest("no C compiler (cc, gcc or clang, or $CC) to read dllm.h's layout")

    def test_struct_fields_follow_the_header(self):
        for c_name, mirror in T.C_STRUCTS.items():
            with self.subTest(struct=c_name):
                self.assertEqual([name for name, _ in mirror._fields_], self.c_structs[c_name])

    def test_struct_sizes_and_offsets(self):
        for c_name, mirror in T.C_STRUCTS.items():
            with self.subTest(struct=c_name):
                self.assertEqual(self.c[c_name], [ctypes.sizeof(mirror)])
                for field, _ in mirror._fields_:
                    descr = getattr(mirror, field)
                    self.assertEqual(self.c[f"{c_name}.{field}"], [descr.offset, descr.size], f"{c_name}.{field}")

    def test_enum_constants(self):
        for c_name, (enum_cls, prefix) in T.C_ENUMS.items():
            with self.subTest(enum=c_name):
                self.assertEqual(sorted(self.c_enums[c_name]), sorted(prefix + m.name for m in enum_cls))
                for member in enum_cls:
                    self.assertEqual(self.c[prefix + member.name], [int(member)])


if __name__ == "__main__":
    unittest.main()
