"""torch.distributed.checkpoint with mosafs.checkpoint.torch and tensors on the GPU: the
scenario of tests/fuse/test_fuse_checkpoint_dcp.py with two rank processes sharing cuda:0
(gloo: NCCL refuses two ranks on one device; DCP's collectives are object collectives,
which gloo runs on the host), so each rank's file is saved by the device path (chunked and
hashed on the GPU) and loaded back into tensors on the GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gpu.conftest import GPU

pytestmark = GPU
UP = ("--benefactors", "3", "--hash-backend", "gpu", "--chunker", "cdc:16384:65536:262144")


def test_gpu_checkpoint_dcp_two_ranks_share_cuda0(start_cluster: Any, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is needed for GPU tensors")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device (a CPU build of torch?)")
    from mosafs.checkpoint.cluster import close_all
    from tests.fuse.test_fuse_checkpoint_dcp import two_rank_scenario

    up = start_cluster(*UP)
    try:
        two_rank_scenario(up.mountpoint, tmp_path / "ranks", "cuda:0")
    finally:
        close_all()
