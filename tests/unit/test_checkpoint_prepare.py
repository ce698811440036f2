"""mosafs.checkpoint.prepare refuses what it cannot do, with a clear error: a device that
is not a GPU, and a GPU where the GPU backend cannot run (never a silent CPU fallback).
What it does on a GPU: tests/gpu/test_gpu_checkpoint.py."""

from __future__ import annotations

import pytest

from mosafs import checkpoint
from mosafs.chunking.gpu import gpu_unavailable_reason
from mosafs.errors import ConfigError


def test_prepare_is_for_gpus_only() -> None:
    pytest.importorskip("torch", reason="prepare names its device as torch does")
    with pytest.raises(ConfigError, match="saves from a GPU, not from 'cpu'"):
        checkpoint.prepare("cpu")


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="this host has a usable GPU")
def test_prepare_without_a_usable_gpu_says_why() -> None:
    pytest.importorskip("torch", reason="prepare names its device as torch does")
    with pytest.raises(ConfigError, match="the GPU backend cannot run: ") as err:
        checkpoint.prepare("cuda")
    assert err.value.exit_code != 0
