#!/bin/sh
# The Python package's tests (unittest, no pytest needed). The last line is "N passed, N failed, N skipped", the
# project's test runner convention; the exit status is non-zero if a test failed. The library is found as the
# package finds it: $DLLM_LIB, python/dllm/libdllm.so, then the repository's build/libdllm.so.
cd "$(dirname "$0")" || exit 1
exec python3 - "$@" <<'PY'
import sys
import unittest

suite = unittest.defaultTestLoader.discover("tests", top_level_dir="tests")
result = unittest.TextTestRunner(verbosity=2).run(suite)


def test_id(test):  # a failing subtest counts as its test
    return getattr(test, "test_case", test).id()


# a failure outside any test (a setUpClass error) counts as one failure
failed = {test_id(t) for t, _ in result.failures + result.errors} | {test_id(t) for t in result.unexpectedSuccesses}
skipped = {test_id(t) for t, _ in result.skipped} - failed
ran_and_failed = {k for k in failed if "(" not in k}  # setUpClass holders are named "setUpClass (module.Class)"
passed = result.testsRun - len(ran_and_failed) - len(skipped)
print(f"{passed} passed, {len(failed)} failed, {len(skipped)} skipped")
sys.exit(1 if failed else 0)
PY
