"""An erasure-coded default pool under `mosafs up` (mutual TLS, chunk access tokens on):
`up --redundancy ec:2+1` over three benefactors; a file written and read back through
the `.versions` view (fragments fetched with their own read tokens from the block-map;
their puts grouped per benefactor), a
file edited in place before its first commit (its fragments read back with tokens asked
for by fragment id), `up` refusing a redundancy wider than its benefactors."""

from __future__ import annotations

import json
from pathlib import Path

import blake3

from tests.harness import cli, scrape

MiB = 1 << 20


def _data(seed: str, size: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=size)


def test_fuse_erasure_up_write_read_and_spill(start_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = start_cluster("--benefactors", "3", "--redundancy", "ec:2+1",
                            "--ec-min-chunk", "16K", "--chunker", "cdc:65536:262144:1048576")
    mnt = cluster.mountpoint
    first = _data("first", 4 * MiB + 777)
    (mnt / "first").write_bytes(first)
    # Appended, then edited in place before the first commit: the session's own coded
    # chunks are read back from their fragments for the spill.
    second = bytearray(_data("second", 3 * MiB))
    with open(mnt / "second", "wb") as f:
        f.write(second)
        f.seek(100)
        f.write(b"edited")
    second[100:106] = b"edited"

    # A version file is a fresh inode: read from the benefactors, not the page cache.
    assert (mnt / ".versions" / "first" / "1").read_bytes() == first
    assert (mnt / ".versions" / "second" / "1").read_bytes() == bytes(second)
    stats = json.loads(cli("stats", str(mnt / "first"), "--json").stdout)
    assert {r["redundancy"] for r in stats["redundancy"]} >= {"ec:2+1"}
    assert stats["fully_redundant"]
    # The fragments queued for one benefactor left in grouped calls (PutChunks, or local
    # puts: memory files to a benefactor on this host), several per call: the writer's
    # puts were grouped.
    blobs = groups = 0.0
    for url in cluster.info["metrics"]["benefactors"].values():
        figures = scrape(url)
        blobs += figures.get("mosafs_benefactor_put_chunks_total{outcome=stored}", 0.0)
        groups += figures.get("mosafs_benefactor_put_calls_total{method=PutChunks}", 0.0)
        groups += figures.get("mosafs_benefactor_put_calls_total{method=local}", 0.0)
    assert 0 < groups < blobs, (groups, blobs)
    pools = json.loads(cli("pool", "list", "--json", "--data-dir",
                           str(cluster.data_dir)).stdout)["pools"]
    assert [p["redundancy"] for p in pools] == ["ec:2+1"]

    # Wider than the benefactors `up` starts: refused before anything starts.
    refused = cli("up", str(tmp_path / "other"), "--data-dir", str(tmp_path / "other-data"),
                  "--benefactors", "3", "--redundancy", "ec:4+2")
    assert refused.returncode == 2
    assert "needs 6 benefactors" in refused.stderr and len(refused.stderr.splitlines()) == 1
    refused = cli("up", str(tmp_path / "other"), "--data-dir", str(tmp_path / "other-data"),
                  "--redundancy", "ec:0+2")
    assert refused.returncode == 2 and "K (data fragments) must be 1..16" in refused.stderr
