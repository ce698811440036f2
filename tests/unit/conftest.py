"""Fixtures of the manager's unit tests: a real LMDB store in tmp_path, a test clock (lease
and liveness expiry are exact and instant) and a Manager over both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mosafs.manager.core import Manager, ManagerConfig
from mosafs.manager.metadata import MetadataStore
from tests.unit.managers import Clock, MiB


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetadataStore]:
    with MetadataStore(tmp_path / "metadata.lmdb", map_size=256 * MiB) as s:
        yield s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def mgr(store: MetadataStore, clock: Clock) -> Manager:
    config = ManagerConfig(heartbeat_interval_s=1, benefactor_lease_s=5, write_lease_s=60)
    return Manager(store, config, clock=clock)
