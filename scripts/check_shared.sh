#!/usr/bin/env bash
# The repository carries copies of what the project's shared folder holds, so that a clone
# is complete: the design contract (docs/design.md) and its test vectors (tests/vectors/).
# Where that folder sits beside the checkout (argument 1, default ../shared), the copies
# must still equal it: each vector byte for byte (and no vector the folder lacks), the
# contract except for its header comment and the path it names the vectors by. Without the
# folder there is nothing to compare with, and the repository's copies are what counts.
# Run by scripts/test.sh before the tests; exit 1, naming every difference, when they differ.
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."
shared=${1:-../shared}
if [ ! -d "$shared" ]; then
  echo "check_shared: no $shared beside the checkout: nothing to compare the copies with"
  exit 0
fi
status=0
fail() { echo "check_shared: $*" >&2; status=1; }

if [ -d "$shared/vectors" ]; then
  for original in "$shared"/vectors/*; do
    copy="tests/vectors/$(basename "$original")"
    if [ ! -f "$copy" ]; then
      fail "$copy is missing (cp $original tests/vectors/)"
    elif ! cmp -s "$original" "$copy"; then
      fail "$copy differs from $original (cp $original tests/vectors/)"
    fi
  done
  for copy in tests/vectors/*; do
    [ -e "$shared/vectors/$(basename "$copy")" ] || fail "$copy is not in $shared/vectors/"
  done
fi

# docs/design.md without its header comment (up to the first line ending in -->, and the
# blank line after it), with the vectors named as the shared folder names them.
contract() {
  sed '1,/-->$/d' docs/design.md | sed '1{/^$/d;}' | sed 's#tests/vectors/#../shared/vectors/#g'
}
if [ -f "$shared/DESIGN.md" ] && ! differences=$(diff <(contract) "$shared/DESIGN.md"); then
  fail "docs/design.md differs from $shared/DESIGN.md (beyond its header and the vectors' path):"
  echo "$differences" | head -n 40 >&2
fi

if [ "$status" -eq 0 ]; then
  echo "check_shared: tests/vectors/ and docs/design.md agree with $shared"
fi
exit "$status"
