"""Content-addressing throughput, CPU and GPU (mosafs.bench.hash), as one JSON object.

    .venv/bin/python benchmarks/hash_gpu.py [--quick] [--backend auto|cpu|gpu|oracle|all]
                                            [--spec SPEC] [--json] ...

The same as `mosafs bench hash`. See mosafs/bench/hash.py for the figures and options;
docs/benchmarks.md for measured results, docs/gpu.md for the design.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mosafs.bench import hash as hash_bench
from mosafs.errors import MosafsError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    hash_bench.add_arguments(parser)
    try:
        return hash_bench.run(parser.parse_args())
    except MosafsError as exc:  # e.g. --backend gpu without a GPU: one line, its exit code
        print(f"hash_gpu.py: {exc.message}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
