"""The storage benchmarks' parts that need no cluster: deterministic workloads, the
configurations, the targets' arithmetic and the figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from mosafs.bench import storage
from mosafs.bench.plots import plot
from mosafs.bench.workloads import Workload, steps
from mosafs.chunking import make_chunker
from mosafs.errors import ConfigError

MiB = 1 << 20


def shared(spec: str, a: bytes, b: bytes) -> float:
    """Share of B's bytes in chunks A has too."""
    chunker = make_chunker(spec, "cpu")
    have = {c.id for c in chunker.chunk_all(a)}
    return sum(c.length for c in chunker.chunk_all(b) if c.id in have) / len(b)


def test_unit_workloads_are_deterministic_and_keep_their_size() -> None:
    w = Workload("checkpoint", 4 * MiB, 3, change=0.2, regions=4, insertions=3, seed="t")
    first, again = list(steps(w)), list(steps(w))
    assert first == again
    assert [len(s) for s in first] == [4 * MiB] * 3
    assert first[0] != first[1] != first[2]
    assert next(steps(Workload("checkpoint", 4 * MiB, 3, seed="u"))) != first[0]


def test_unit_workload_kinds_have_their_similarity() -> None:
    similar = list(steps(Workload("similar", MiB, 3)))
    assert similar[0] == similar[1] == similar[2]
    different = list(steps(Workload("different", MiB, 2)))
    assert shared("cdc:4096:16384:65536", different[0], different[1]) == 0.0
    one, two = steps(Workload("checkpoint", 8 * MiB, 2, change=0.1, regions=4, insertions=4))
    cdc = shared("cdc:4096:16384:65536", one, two)
    assert 0.8 <= cdc <= 0.9  # designed 0.9, minus chunks cut by edits and insertions
    assert shared("fixed:16384", one, two) < 0.2 < cdc  # insertions shift fixed chunks


@pytest.mark.parametrize("bad", [
    Workload("random"), Workload(size=1000), Workload(size=2 << 30), Workload(steps=0),
    Workload(change=1.5), Workload(regions=0), Workload(insertions=-1)])
def test_unit_bad_workloads_are_config_errors(bad: Workload) -> None:
    with pytest.raises(ConfigError):
        bad.check()


def test_unit_series_configurations() -> None:
    names = [c.name for c in storage.series_configs(storage.AVERAGES, gpu=False)]
    assert len(names) == 3 + 6 + 6 and "non-CA fixed 256K" in names
    assert "CA-oracle cdc 4096K" in names and not any("GPU" in n for n in names)
    assert len(storage.series_configs(storage.AVERAGES, gpu=True)) == 21
    non_ca = storage.series_configs((MiB,), gpu=False)[0]
    assert (non_ca.chunker, non_ca.backend, non_ca.content_addressing) == \
        ("fixed:1048576", "oracle", False)
    assert storage.chunker_spec("cdc", MiB) == "cdc:262144:1048576:4194304"


def run(name: str, asb: float, similarity: float = 0.0) -> dict:  # type: ignore[type-arg]
    return {"config": name, "later": {"asb_mb_s": asb, "similarity": similarity}}


def test_unit_series_targets() -> None:
    targets = storage.series_targets([
        run("non-CA fixed 1024K", 100), run("CA-CPU cdc 1024K", 210, 0.75),
        run("CA-GPU cdc 1024K", 190, 0.75), run("CA-oracle cdc 1024K", 200, 0.75)])
    assert targets["ca-cpu_asb_vs_non_ca"] == {"ratio": 2.1, "target": 2.0,
                                               "similarity": 0.75, "pass": True}
    assert targets["ca-gpu_vs_oracle"] == {"ratio": 0.95, "gap": 0.05, "target": 0.9,
                                           "pass": True}
    assert targets["ca-cpu_vs_oracle"]["gap"] == -0.05
    low = storage.series_targets([run("non-CA fixed 1024K", 100),
                                  run("CA-CPU cdc 1024K", 300, 0.5)])
    assert low["ca-cpu_asb_vs_non_ca"]["pass"] is False  # 3x, but only 50% similar


def test_unit_figures_are_png_files(tmp_path: Path) -> None:
    machine = {"cpus": 2}
    links = {"rate_bit_s": 1e9}
    series = {"benchmark": "mosafs bench series", "date": "2026-11-23", "machine": machine,
              "params": {"links": links, "workload": Workload().to_json()},
              "runs": [{"config": "CA-CPU cdc 1024K", "bytes_written": 10 * MiB,
                        "bytes_sent": 3 * MiB, "later": {"oab_mb_s": 900.0,
                                                         "asb_mb_s": 300.0,
                                                         "similarity": 0.7}}]}
    stripe = {"benchmark": "mosafs bench stripe", "date": "2026-11-23", "machine": machine,
              "params": {"links": None},
              "runs": [{"stripe_width": w, "oab_mb_s": 100.0 * w, "asb_mb_s": 90.0 * w}
                       for w in (1, 2)]}
    clients = {"benchmark": "mosafs bench clients", "date": "2026-11-23", "machine": machine,
               "params": {"links": links, "file_bytes": 100 * MiB},
               "runs": [{"writers": n, "aggregate_mb_s": 200.0,
                         "manager_transactions_per_s": 5.0 * n} for n in (1, 8)]}
    for result in (series, stripe, clients):
        (path,) = plot(result, tmp_path)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    hashed = {"benchmark": "hash", "spec": "cdc:4096:16384:65536", "host": {"cpus": 2},
              "cpu": {"bytes": 1, "one_core_GBps": 1.2, "all_cores_one_stream_GBps": 2.1},
              "gpu": None}
    (path,) = plot(hashed, tmp_path)
    assert path.name == "hash.png" and path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ConfigError, match="no figure"):
        plot({"benchmark": "mosafs bench backends"}, tmp_path)
