"""Write and read bandwidth through a mosafs FUSE mount, against a null pyfuse3 file system.

    .venv/bin/python benchmarks/write_fuse.py [--quick] [--json] [--size-mib N] [--memory]
                                              [--keep DIR]

The same as `mosafs bench write ...` (mosafs/bench/write.py describes every figure;
docs/benchmarks.md has the results). Run it as root: it drops the page cache before the
cold read and resets the mount's peak RSS before each write.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mosafs.cli import main

if __name__ == "__main__":
    main(["bench", "write", *sys.argv[1:]])
