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
.venv/bin/python -m pytest -q "$@"
