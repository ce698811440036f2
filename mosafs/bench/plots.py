"""PNG figures of the storage benchmarks (`--plot DIR`), in the manner of the stdchk and
MosaStore papers: bandwidth per configuration, bandwidth against stripe width, aggregate
throughput against writers. matplotlib (the `bench` extra) draws them off-screen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mosafs.errors import ConfigError


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'mosafs[bench]'") from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def plot(result: dict[str, Any], directory: Path) -> list[Path]:
    """Draw RESULT's figures into DIRECTORY; the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    name = result["benchmark"].rsplit(" ", 1)[-1]
    draw = {"series": _series, "stripe": _stripe, "clients": _clients, "write": _write,
            "hash": _hash}.get(name)
    if draw is None:
        raise ConfigError(f"no figure for {result['benchmark']}")
    plt = _pyplot()
    path = directory / f"{name}.png"
    figure = draw(plt, result)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return [path]


def _caption(result: dict[str, Any]) -> str:
    links = result["params"].get("links")
    where = (f"{links['rate_bit_s'] / 1e9:g} Gbit/s links ({links.get('mode', 'netns')})"
             if links else "loopback")
    return f"{where}, {result['machine'].get('cpus')} CPUs, {result['date'][:10]}"


def _series(plt: Any, result: dict[str, Any]) -> Any:
    runs = result["runs"]
    labels = [r["config"] for r in runs]
    x = range(len(runs))
    figure, (bw, sent) = plt.subplots(2, 1, figsize=(max(8, len(runs) * 0.6), 8),
                                      sharex=True)
    width = 0.4
    bw.bar([i - width / 2 for i in x], [r["later"]["oab_mb_s"] for r in runs], width,
           label="OAB")
    bw.bar([i + width / 2 for i in x], [r["later"]["asb_mb_s"] for r in runs], width,
           label="ASB")
    bw.set_ylabel("MB/s (checkpoint steps)")
    bw.legend()
    w = result["params"]["workload"]
    bw.set_title(f"series: {w['kind']} {w['size'] >> 20} MiB x {w['steps']} steps "
                 f"({_caption(result)})")
    written = [r["bytes_written"] / 2**20 for r in runs]
    sent.bar(x, written, color="lightgray", label="written")
    sent.bar(x, [r["bytes_sent"] / 2**20 for r in runs], label="sent")
    for i, r in enumerate(runs):
        sent.annotate(f"{r['later']['similarity']:.0%}", (i, r["bytes_sent"] / 2**20),
                      ha="center", va="bottom", fontsize=7)
    sent.set_ylabel("MiB (labels: detected similarity)")
    sent.legend()
    sent.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=8)
    return figure


def _stripe(plt: Any, result: dict[str, Any]) -> Any:
    runs = result["runs"]
    widths = [r["stripe_width"] for r in runs]
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(widths, [r["oab_mb_s"] for r in runs], "o-", label="OAB")
    axes.plot(widths, [r["asb_mb_s"] for r in runs], "s-", label="ASB")
    if runs and runs[0]["asb_mb_s"]:
        axes.plot(widths, [runs[0]["asb_mb_s"] * w for w in widths], ":", color="gray",
                  label="linear (W x W=1)")
    axes.set_xlabel("stripe width W (benefactors)")
    axes.set_ylabel("MB/s")
    axes.set_xticks(widths)
    axes.set_title(f"stripe: new data, 1 writer ({_caption(result)})")
    axes.legend()
    return figure


def _clients(plt: Any, result: dict[str, Any]) -> Any:
    runs = result["runs"]
    writers = [r["writers"] for r in runs]
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(writers, [r["aggregate_mb_s"] for r in runs], "o-", label="aggregate MB/s")
    axes.set_xlabel("concurrent writers")
    axes.set_ylabel("MB/s")
    axes.set_xticks(writers)
    tx = axes.twinx()
    tx.plot(writers, [r.get("manager_transactions_per_s", 0) for r in runs], "s--",
            color="tab:red", label="manager transactions/s")
    tx.set_ylabel("manager write transactions/s")
    axes.set_title(f"clients: {result['params']['file_bytes'] >> 20} MiB each "
                   f"({_caption(result)})")
    lines = axes.get_legend_handles_labels()
    more = tx.get_legend_handles_labels()
    axes.legend(lines[0] + more[0], lines[1] + more[1], loc="lower right")
    return figure


def _bars(plt: Any, labels: list[str], values: list[float], ylabel: str, title: str) -> Any:
    figure, axes = plt.subplots(figsize=(max(6, len(labels) * 0.9), 4))
    axes.bar(range(len(labels)), values)
    for i, value in enumerate(values):
        axes.annotate(f"{value:.4g}", (i, value), ha="center", va="bottom", fontsize=8)
    axes.set_xticks(list(range(len(labels))), labels, rotation=30, ha="right", fontsize=8)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    return figure


def _write(plt: Any, result: dict[str, Any]) -> Any:
    """mosafs bench write: the mount's OAB/ASB and reads against the null file system."""
    null, mosafs = result["nullfs"], result["mosafs"]
    figures = [
        ("null write 1M", null["write_1m"]["mb_s"]),
        ("mosafs OAB 1M", mosafs["write_1m"]["oab_mb_s"]),
        ("mosafs ASB 1M", mosafs["write_1m"]["asb_mb_s"]),
        ("null write 4K", null["write_4k"]["mb_s"]),
        ("mosafs OAB 4K", mosafs["write_4k"]["oab_mb_s"]),
        ("null read", null["read_1m"]["mb_s"]),
        ("mosafs read cold", mosafs["read_cold"]["mb_s"]),
        ("mosafs read warm", mosafs["read_warm"]["mb_s"]),
    ]
    size = result["params"]["size_bytes"] >> 20
    return _bars(plt, [f[0] for f in figures], [f[1] for f in figures], "MB/s",
                 f"write and read through the mount, {size} MiB "
                 f"({result['machine'].get('cpus')} CPUs, {result['date'][:10]})")


def _hash(plt: Any, result: dict[str, Any]) -> Any:
    """mosafs bench hash: every GB/s figure of every backend measured."""
    labels, values = [], []
    for backend in ("cpu", "gpu", "oracle"):
        for key, value in (result.get(backend) or {}).items():
            if key.endswith("GBps") and isinstance(value, int | float):
                labels.append(f"{backend} {key.removesuffix('_GBps')}")
                values.append(float(value))
    return _bars(plt, labels, values, "GB/s (10^9 bytes/s)",
                 f"content addressing, {result['spec']} ({result['host'].get('cpus')} CPUs)")
