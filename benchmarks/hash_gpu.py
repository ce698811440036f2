"""Content-addressing throughput, CPU and GPU (mosafs.bench.hash), as one JSON object.

    .venv/bin/python benchmarks/hash_gpu.py [--quick] [--backend auto|cpu|gpu|oracle|all]
                                            [--spec SPEC] [--json] ...

See mosafs/bench/hash.py for the figures and options; docs/gpu.md for measured results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mosafs.bench import hash as hash_bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    hash_bench.add_arguments(parser)
    return hash_bench.run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
