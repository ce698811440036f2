"""Read-ahead sized to the link (mosafs/client/files/readahead.py), through a real mount:
a cold sequential reader stalls on chunks not fetched yet, and each stall doubles its
handle's window up to the ceiling; a seek sets it back to the minimum. The mount logs each
change at DEBUG, which is what this test reads."""

from __future__ import annotations

import re
from pathlib import Path

import blake3

from tests.cluster.conftest import Cluster, start_cluster

MiB = 1 << 20


def _windows(log: str) -> list[tuple[int, int, str]]:
    return [(int(a), int(b), why) for a, b, why in
            re.findall(r"read-ahead window (\d+) -> (\d+) bytes \((stall|not seq)", log)]


def test_cluster_readahead_grows_on_stalls_and_resets_on_a_seek(
        cluster_factory: list[Cluster], tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path)
    cluster_factory.append(cluster)
    writer = cluster.mount("writer")
    data = blake3.blake3(b"readahead").digest(length=48 * MiB)
    (writer / "ckpt").write_bytes(data)
    # A second mount: its chunk cache is cold, as a restarted job's is.
    # A 64 MiB cache: the window's ceiling is half of it, 32 MiB.
    reader = cluster.mount("reader", "--log-level", "debug", "--cache-mib", "64")
    with open(reader / "ckpt", "rb", buffering=0) as f:
        got = b"".join(f.read(MiB) for _ in range(24))  # the first half, in order
        assert got == data[:24 * MiB]
        grown = _windows(cluster.mounts[-1].log())
        assert grown and all(why == "stall" for _, _, why in grown), grown
        assert [b for _, b, _ in grown] == [8 * MiB, 16 * MiB, 32 * MiB][:len(grown)]
        f.seek(44 * MiB)  # past what was read (and what the kernel read ahead): not sequential
        assert f.read(MiB) == data[44 * MiB:45 * MiB]
    after = _windows(cluster.mounts[-1].log())
    assert after[len(grown):] and after[len(grown)] == (grown[-1][1], 4 * MiB, "not seq")
