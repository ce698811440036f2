"""A latency over a phase of a benchmark, from a process's Prometheus histogram (one RPC
method's handling time, `mosafs_rpc_server_seconds`, or another histogram of
mosafs.metrics such as the manager's `mosafs_manager_commit_flush_seconds`): read before
and after, the difference is the phase's observations, and their quantiles are known to
the bucket (an upper bound: "p99 <= 5 ms" holds when 99 % fall in buckets up to 5 ms)."""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Iterator
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

FAMILY = "mosafs_rpc_server_seconds"


def _samples(url: str, family: str) -> Iterator[Sample]:
    """The samples of metric FAMILY on the /metrics page at URL."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    for found in text_string_to_metric_families(text):
        if found.name == family:
            yield from found.samples


def buckets(url: str, method: str | None, family: str = FAMILY) -> dict[float, float]:
    """Cumulative counts by upper bound (seconds; inf last) of histogram FAMILY at the
    /metrics page URL (of METHOD's calls; None: a histogram without labels)."""
    out: dict[float, float] = {}
    for sample in _samples(url, family):
        if sample.name.endswith("_bucket") and sample.labels.get("method") == method:
            out[float(sample.labels["le"])] = sample.value
    return dict(sorted(out.items()))


def totals(urls: list[str], family: str, label: str) -> dict[str, tuple[float, float]]:
    """(observations, seconds) so far of histogram FAMILY by the value of its LABEL,
    summed over the /metrics pages URLS (one per process: the benefactors, say)."""
    out: dict[str, tuple[float, float]] = {}
    for url in urls:
        for sample in _samples(url, family):
            key = sample.labels.get(label)
            if key is None or not sample.name.endswith(("_count", "_sum")):
                continue
            count, seconds = out.get(key, (0.0, 0.0))
            if sample.name.endswith("_count"):
                count += sample.value
            else:
                seconds += sample.value
            out[key] = (count, seconds)
    return out


def means(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
          ) -> dict[str, dict[str, float]]:
    """Per label value, the observations between BEFORE and AFTER (totals()) and their
    mean in milliseconds."""
    out = {}
    for key, (count, seconds) in sorted(after.items()):
        n = count - before.get(key, (0.0, 0.0))[0]
        took = seconds - before.get(key, (0.0, 0.0))[1]
        out[key] = {"count": int(n), "mean_ms": round(took / n * 1e3, 3) if n else 0.0}
    return out


def quantiles(before: dict[float, float], after: dict[float, float],
              qs: tuple[float, ...] = (0.5, 0.99)) -> dict[str, Any]:
    """The calls between BEFORE and AFTER: their number and, for each quantile, the upper
    bound of the bucket it falls in (seconds; None past the last finite bound)."""
    delta = {le: after[le] - before.get(le, 0.0) for le in after}
    calls = delta.get(math.inf, 0.0)
    out: dict[str, Any] = {"calls": int(calls)}
    for q in qs:
        bound = next((le for le, n in delta.items() if calls and n >= q * calls), None)
        out[f"p{round(q * 100):d}_at_most_s"] = None if bound in (None, math.inf) else bound
    return out
