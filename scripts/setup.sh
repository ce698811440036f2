#!/usr/bin/env bash
# Everything mosafs needs on a fresh Debian (12, Python 3.11): FUSE 3, a compiler for
# pyfuse3, ISA-L (erasure coding, docs/erasure.md), etcd (standby managers and failover,
# docs/coordination.md: mosafs and the tests start etcd processes of their own, never
# the package's service), a virtualenv in .venv with the package. `--dev` adds the test
# and lint tools, and the programs the tool tests run on the mount (rsync, git).
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(fuse3 libfuse3-dev pkg-config gcc python3-dev python3-venv libisal2 etcd-server)
[ "${1:-}" = "--dev" ] && packages+=(rsync git)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>/dev/null || true
if [ "${1:-}" = "--dev" ]; then
  # The checkpoint tests need torch: its CPU build (the default wheel brings gigabytes of
  # CUDA libraries the tests never use). --retries 0: a local mirror answers at once.
  .venv/bin/python -c "import torch" 2>/dev/null ||
    .venv/bin/python -m pip install -q --retries 0 \
      --index-url https://download.pytorch.org/whl/cpu \
      --extra-index-url https://download.pytorch.org/whl/cpu "torch>=2.2"
  .venv/bin/python -m pip install -q -e '.[dev]'
else
  .venv/bin/python -m pip install -q -e .
fi
