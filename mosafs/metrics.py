"""Prometheus metrics of every mosafs process (prometheus_client), served over HTTP at
`--metrics-listen HOST:PORT` (`/metrics`). Every series is named `mosafs_...`; the
process's own (CPU, memory, open files) come with prometheus_client's default collectors.

RPCs (every process, server and client side):
  mosafs_rpc_server_seconds{service,method}            histogram of handling time
  mosafs_rpc_server_errors_total{service,method,code}  answers other than OK
  mosafs_rpc_client_seconds{service,method}            histogram of call time
  mosafs_rpc_client_errors_total{service,method,code}
Client (mount):
  mosafs_client_written_bytes_total        bytes applications wrote (committed files)
  mosafs_client_sent_bytes_total           bytes of chunks sent to benefactors
  mosafs_client_deduplicated_bytes_total   bytes written that were found stored, not sent
  mosafs_client_chunks_total{outcome}      chunks committed: sent | deduplicated
  mosafs_client_hashed_bytes_total{backend}, mosafs_client_hash_seconds_total{backend}
                                           the chunking engine's input and busy time:
                                           their rates' ratio is its throughput
  mosafs_client_read_bytes_total, mosafs_client_commits_total
Manager:
  mosafs_manager_commits_total, mosafs_manager_committed_bytes_total,
  mosafs_manager_pruned_versions_total, mosafs_manager_metadata_write_transactions_total,
  mosafs_manager_commit_flush_seconds (histogram: LMDB's commit of a group, its two disk
  flushes), mosafs_manager_commit_group_operations (histogram: operations per group),
  mosafs_manager_chunks, mosafs_manager_under_replicated_chunks,
  mosafs_manager_replication_backlog_bytes, mosafs_manager_lost_chunks,
  mosafs_manager_replication_rate_bytes, mosafs_manager_benefactors{state},
  mosafs_manager_replicated_bytes_total (copies, and fragments rebuilt or moved),
  mosafs_manager_ec_short_chunks, mosafs_manager_ec_missing_fragments,
  mosafs_manager_ec_lost_chunks, mosafs_manager_conversion_remaining_chunks{pool}
Benefactor:
  mosafs_benefactor_put_chunks_total{outcome} (stored | present), mosafs_benefactor_put_bytes_total,
  mosafs_benefactor_put_calls_total{method}, mosafs_benefactor_put_seconds{stage}
  (histogram: local_wait | wait | store),
  mosafs_benefactor_served_bytes_total, mosafs_benefactor_corrupt_chunks_total,
  mosafs_benefactor_chunks, mosafs_benefactor_stored_bytes, mosafs_benefactor_free_bytes
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from mosafs.errors import ConfigError

log = logging.getLogger(__name__)

# Finer between 1 and 50 ms, where the metadata targets lie (a commit's p99 of 5 ms):
# a quantile read from these buckets is known only to the bucket's upper bound.
_LATENCY = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02,
            0.025, 0.035, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

RPC_SERVER_SECONDS = Histogram("mosafs_rpc_server_seconds", "Time to handle an RPC",
                               ["service", "method"], buckets=_LATENCY)
RPC_SERVER_ERRORS = Counter("mosafs_rpc_server_errors", "RPCs answered with an error",
                            ["service", "method", "code"])
REFUSALS = Counter("mosafs_refusals", "Requests refused by who asked: reason bad_certificate "
                   "(revoked, unreadable), role, capability (subtree, read-only, uid), "
                   "permission (POSIX), token (chunk access)", ["reason"])
RPC_CLIENT_SECONDS = Histogram("mosafs_rpc_client_seconds", "Time an RPC call took",
                               ["service", "method"], buckets=_LATENCY)
RPC_CLIENT_ERRORS = Counter("mosafs_rpc_client_errors", "RPC calls that failed",
                            ["service", "method", "code"])

CLIENT_WRITTEN = Counter("mosafs_client_written_bytes", "Bytes of committed file versions")
CLIENT_SENT = Counter("mosafs_client_sent_bytes", "Bytes of chunks sent to benefactors")
CLIENT_DEDUPED = Counter("mosafs_client_deduplicated_bytes",
                         "Bytes written that were found stored and not sent")
CLIENT_CHUNKS = Counter("mosafs_client_chunks", "Chunks committed", ["outcome"])
CLIENT_HASHED = Counter("mosafs_client_hashed_bytes", "Bytes fed to the chunking engine",
                        ["backend"])
CLIENT_HASH_SECONDS = Counter("mosafs_client_hash_seconds",
                              "Time spent in the chunking engine's calls", ["backend"])
CLIENT_READ = Counter("mosafs_client_read_bytes", "Bytes read by applications")
CLIENT_COMMITS = Counter("mosafs_client_commits", "Versions committed by this mount")

MANAGER_COMMITS = Counter("mosafs_manager_commits", "Versions committed")
MANAGER_COMMIT_FLUSH_SECONDS = Histogram(
    "mosafs_manager_commit_flush_seconds",
    "Time LMDB took to commit a group of operations (its flushes to disk)", buckets=_LATENCY)
MANAGER_COMMIT_GROUP = Histogram(
    "mosafs_manager_commit_group_operations", "Operations per group commit",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
MANAGER_COMMITTED = Counter("mosafs_manager_committed_bytes", "Bytes of versions committed")
MANAGER_PRUNED = Counter("mosafs_manager_pruned_versions", "Versions removed by pruning")
MANAGER_REPLICATED = Counter("mosafs_manager_replicated_bytes",
                             "Bytes copied between benefactors by replication, and of "
                             "fragments rebuilt or moved")
MANAGER_REPLICATION_FAILURES = Counter("mosafs_manager_replication_failures",
                                       "Replication requests that stopped early", ["reason"])
MANAGER_REDUNDANT_SECONDS = Histogram(
    "mosafs_manager_close_to_redundant_seconds",
    "From a commit to every chunk of it having R copies (0: redundant at close)",
    buckets=(0, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800))

BENEFACTOR_PUTS = Counter("mosafs_benefactor_put_chunks", "Chunk puts", ["outcome"])
BENEFACTOR_PUT_BYTES = Counter("mosafs_benefactor_put_bytes", "Bytes of chunk puts")
BENEFACTOR_PUT_CALLS = Counter("mosafs_benefactor_put_calls",
                               "Put calls: PutChunk (one blob), PutChunks (grouped)",
                               ["method"])
BENEFACTOR_PUT_SECONDS = Histogram(
    "mosafs_benefactor_put_seconds",
    "A put, by stage: a local connection (a read's or a put's) waiting for a thread to "
    "serve it (local_wait), a grouped put's blob waiting for a storing thread (wait), a blob "
    "stored (store: read out of a local put's file, checked, written, synced, renamed)",
    ["stage"], buckets=_LATENCY)
BENEFACTOR_SERVED = Counter("mosafs_benefactor_served_bytes", "Bytes of chunks served")
BENEFACTOR_CORRUPT = Counter("mosafs_benefactor_corrupt_chunks",
                             "Copies found corrupt (and deleted)")


class ValuesCollector(Collector):
    """Gauges and counters read from the process at every scrape: FIGURES() returns
    (name, help, value, kind, labels) tuples, kind "gauge" or "counter"."""

    def __init__(self, figures: Callable[[], Iterable[tuple[str, str, float, str,
                                                            dict[str, str]]]]) -> None:
        self._figures = figures

    def collect(self) -> Iterable[Any]:
        try:
            figures = list(self._figures())
        except Exception:  # a scrape must not fail the process; say why once per scrape
            log.exception("collecting metrics failed")
            return
        families: dict[str, Any] = {}
        for name, text, value, kind, labels in figures:
            family = families.get(name)
            if family is None:
                cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                family = families[name] = cls(name, text, labels=list(labels))
            family.add_metric(list(labels.values()), value)
        yield from families.values()

    def describe(self) -> Iterable[Any]:
        return []  # collected fresh at every scrape


def register(collector: Collector) -> None:
    REGISTRY.register(collector)


def serve(address: str) -> str:
    """Serve /metrics on ADDRESS (HOST:PORT, port 0: a free one); the URL."""
    from mosafs.addresses import split_address

    host, port = split_address(address, "--metrics-listen")
    try:
        server, _ = start_http_server(port, addr=host or "0.0.0.0")
    except OSError as exc:
        raise ConfigError(f"--metrics-listen {address}: cannot listen: {exc.strerror}") \
            from None
    bound = server.server_port
    shown = "127.0.0.1" if host in ("", "0.0.0.0") else host
    return f"http://{shown}:{bound}/metrics"
