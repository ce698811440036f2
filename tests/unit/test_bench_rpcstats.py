"""The quantiles of one RPC method's handling time over a phase, from two readings of its
Prometheus histogram (mosafs.bench.rpcstats): bounded by the bucket they fall in."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from mosafs.bench import rpcstats


def test_quantiles_of_the_calls_between_two_readings() -> None:
    before = {0.001: 10.0, 0.005: 10.0, 0.01: 10.0, math.inf: 10.0}
    after = {0.001: 60.0, 0.005: 108.0, 0.01: 109.0, math.inf: 110.0}
    got = rpcstats.quantiles(before, after)
    assert got == {"calls": 100, "p50_at_most_s": 0.001, "p99_at_most_s": 0.01}
    assert rpcstats.quantiles(after, after) == {"calls": 0, "p50_at_most_s": None,
                                                "p99_at_most_s": None}
    slow = {**after, math.inf: 200.0}  # most calls past the last finite bound
    assert rpcstats.quantiles(before, slow)["p99_at_most_s"] is None


@pytest.fixture
def page() -> Iterator[tuple[str, Histogram]]:
    registry = CollectorRegistry()
    hist = Histogram("mosafs_rpc_server_seconds", "Time to handle an RPC",
                     ["service", "method"], buckets=(0.001, 0.005, 0.01), registry=registry)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", hist
    finally:
        server.shutdown()
        server.server_close()


def test_buckets_read_one_method_from_a_metrics_page(page: tuple[str, Histogram]) -> None:
    url, hist = page
    commit = hist.labels("mosafs.v1.Manager", "CommitVersion")
    for seconds in (0.0005, 0.002, 0.002, 0.5):
        commit.observe(seconds)
    hist.labels("mosafs.v1.Manager", "Lookup").observe(0.0001)
    got = rpcstats.buckets(url, "CommitVersion")
    assert got == {0.001: 1.0, 0.005: 3.0, 0.01: 3.0, math.inf: 4.0}
    assert rpcstats.buckets(url, "CommitVersion", "mosafs_other_seconds") == {}


def test_totals_and_means_by_label_over_several_pages(page: tuple[str, Histogram]) -> None:
    url, hist = page
    hist.labels("s", "store").observe(0.004)
    hist.labels("s", "wait").observe(0.001)
    before = rpcstats.totals([url], "mosafs_rpc_server_seconds", "method")
    hist.labels("s", "store").observe(0.002)
    hist.labels("s", "store").observe(0.006)
    # Two pages of the same process stand for two processes: every sample counts twice.
    after = rpcstats.totals([url, url], "mosafs_rpc_server_seconds", "method")
    assert after["store"] == (6.0, pytest.approx(0.024))
    assert rpcstats.means({k: (2 * n, 2 * s) for k, (n, s) in before.items()}, after) == {
        "store": {"count": 4, "mean_ms": pytest.approx(4.0)},
        "wait": {"count": 0, "mean_ms": 0.0}}
    assert rpcstats.totals([url], "mosafs_no_such_family", "method") == {}
