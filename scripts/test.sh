#!/usr/bin/env bash
# The test command of the README and of CI: set-up, then every check and every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repository's copies of the design contract and its test vectors equal the shared
# folder, where one sits beside the checkout (a clone on its own uses its copies).
bash scripts/check_shared.sh
bash scripts/setup.sh --dev
.venv/bin/python scripts/gen_proto.py --check
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports
# Python's bytecode cache on, where the environment turns it off (PYTHONDONTWRITEBYTECODE):
# the tests start some thousands of Python processes (every daemon and command of their
# clusters) and three test processes each collect every test module, and without the
# cache each of them compiles the same sources again (tests/fuse/test_fuse_lifecycle.py:
# 72-76 CPU-seconds without it, 60-64 with it; docs/benchmarks.md, "The test suite's CPU").
unset PYTHONDONTWRITEBYTECODE
# Three test processes (pytest-xdist), each taking a whole file at a time so that a file's
# shared cluster is started once: most tests wait on real processes, timeouts and kills,
# so three share even a 2-CPU machine well (there: 18 min of tests with two, 12.5-16.6
# with three, the CPUs 75 % and 88 % busy; 17.8 in a slow phase where commit e3246d8,
# before the bytecode cache and each command's own options, took 26.9).
# MOSAFS_TEST_WORKERS=0 runs them in this process.
.venv/bin/python -m pytest -q -n "${MOSAFS_TEST_WORKERS:-3}" --dist loadfile "$@"
