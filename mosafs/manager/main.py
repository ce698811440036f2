"""`mosafs manager`: the metadata server process.

Opens (or creates) the LMDB environment in DATA_DIR/metadata.lmdb, applies the pool flags
given on the command line to the default pool, serves the Manager gRPC service, writes the
ready file {address, pid, data_dir}, and stops cleanly (exit 0) on SIGTERM/SIGINT. One
manager per data directory: a lock file (DATA_DIR/manager.lock, flock) refuses a second.

Heavy modules (grpc, lmdb, protobuf) are imported inside run() so `mosafs --help` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mosafs.argtypes import MiB, bounded_int, byte_size, ec_min_chunk_arg, redundancy_arg
from mosafs.errors import ConfigError, MosafsError
from mosafs.procutil import add_daemon_arguments

log = logging.getLogger("mosafs.manager")

DEFAULT_LISTEN = "127.0.0.1:0"
STOP_GRACE_S = 2.0  # in-flight RPCs get this long to finish on SIGTERM


_positive_int = bounded_int(1, (1 << 32) - 1)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", metavar="DIR",
                        help="directory of the metadata (created if missing)")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"address to serve on; port 0 picks a free port "
                             f"(default {DEFAULT_LISTEN})")
    pool = parser.add_argument_group(
        "default pool", "given on any start, these update the default pool; left out, the "
        "pool keeps its settings (first start: cdc:262144:1048576:4194304, R=1, W=3, "
        "pessimistic)")
    pool.add_argument("--chunker", metavar="SPEC",
                      help="fixed:SIZE or cdc:MIN:AVG:MAX (bytes)")
    pool.add_argument("--replication", type=_positive_int, metavar="R",
                      help="copies of every chunk (short for --redundancy replicas:R)")
    pool.add_argument("--redundancy", type=redundancy_arg, metavar="replicas:R|ec:K+M",
                      help="R whole copies of every chunk, or K data + M parity fragments "
                           "on K+M distinct benefactors (docs/erasure_pools.md)")
    pool.add_argument("--ec-min-chunk", type=ec_min_chunk_arg, metavar="SIZE",
                      help="in an ec:K+M pool, chunks smaller than this are kept as M+1 "
                           "copies (default 128K)")
    pool.add_argument("--stripe-width", type=_positive_int, metavar="W",
                      help="benefactors one write stripes over")
    pool.add_argument("--write-semantics", choices=["optimistic", "pessimistic"],
                      help="close returns once every chunk has R copies (pessimistic, the "
                           "default) or one (optimistic: readable at close, redundant "
                           "within seconds)")
    parser.add_argument("--heartbeat-interval", type=_seconds, default=1.0, metavar="SECONDS",
                        help="how often benefactors send heartbeats (default 1)")
    parser.add_argument("--benefactor-lease", type=_seconds, default=5.0, metavar="SECONDS",
                        help="a benefactor silent this long is dead, and its chunks are "
                             "copied elsewhere at once (default 5)")
    parser.add_argument("--write-lease", type=_seconds, default=60.0, metavar="SECONDS",
                        help="a write session not renewed this long expires (default 60)")
    parser.add_argument("--scan-interval", type=_seconds, default=60.0, metavar="SECONDS",
                        help="the safety net: a full scan of the chunk index for chunks "
                             "short of copies starts at most this often (default 60); "
                             "replication itself reacts to commits, deaths and reports "
                             "at once")
    parser.add_argument("--gc-grace", type=_seconds, default=600.0, metavar="SECONDS",
                        help="an unreferenced chunk is deleted only after this long "
                             "(default 600)")
    parser.add_argument("--map-size", type=byte_size(MiB), default=16 << 30, metavar="SIZE",
                        help="the ceiling of the metadata store, e.g. 64G (K, M, G, T "
                             "units; default 16G): its map grows by itself up to it, and "
                             "the disk's free space; near it, creates fail with ENOSPC "
                             "while deletions still work (docs/metadata.md)")
    tokens = parser.add_argument_group(
        "chunk access tokens", "benefactors serve and take chunk bytes only against "
        "tokens this manager signs for the caller's certificate (docs/operations.md); a "
        "plaintext manager (--insecure) issues none")
    tokens.add_argument("--chunk-tokens", choices=["on", "off"], default="on",
                        help="off: issue none, and benefactors check none; only to measure "
                             "their cost (docs/benchmarks.md), never in production "
                             "(default on)")
    tokens.add_argument("--token-ttl", type=_seconds, default=600.0, metavar="SECONDS",
                        help="how long a token is valid (default 600); a reader whose "
                             "token expired asks for the block-map again")
    tokens.add_argument("--token-rotate", type=_seconds, default=600.0, metavar="SECONDS",
                        help="a new signing key this often (default 600; at least 4 "
                             "heartbeat intervals, so benefactors know a key before it "
                             "signs); a key is kept until its tokens have expired")
    ha = parser.add_argument_group(
        "standby managers", "a standby follows the active manager's log of committed "
        "changes into its own LMDB (docs/standby.md)")
    ha.add_argument("--standbys", type=bounded_int(0, 16), metavar="N",
                    help="keep a replication log for standbys, and acknowledge no change "
                         "before N in-sync standbys have it on disk (0: standbys follow, "
                         "nobody waits for them); left out, no log is kept")
    ha.add_argument("--standby-wait", type=_seconds, default=30.0, metavar="SECONDS",
                    help="how long a change waits for its standby confirmations before "
                         "its client is told it failed (it stays stored here; default 30); "
                         "a standby silent on a change for a sixth of this, at most 5 s, "
                         "leaves the in-sync set")
    ha.add_argument("--standby-of", metavar="HOST:PORT",
                    help="run as a standby of the active manager at HOST:PORT")
    parser.add_argument("--ready-file", metavar="PATH",
                        help="write {address, pid, data_dir, metrics} as JSON here once "
                             "serving")
    add_daemon_arguments(parser, "manager")


def run(args: argparse.Namespace) -> int:
    from mosafs.addresses import advertised_address, split_address
    from mosafs.procutil import (
        exclusive,
        listen,
        start_daemon,
        stop_event,
        wait_for_stop,
        write_ready_file,
    )

    if not args.data_dir:
        raise ConfigError("--data-dir is required (or data-dir in the [manager] section of "
                          "the config file)")
    stop = stop_event()  # first: a signal during start-up still stops us cleanly
    metrics_url = start_daemon(args, "manager")
    listen_host, _ = split_address(args.listen, "--listen")
    if args.benefactor_lease < args.heartbeat_interval:
        raise ConfigError("--benefactor-lease must be at least --heartbeat-interval "
                          "(otherwise live benefactors flap between alive and dead)")
    if args.token_ttl < args.write_lease:
        raise ConfigError("--token-ttl must be at least --write-lease: a write session's "
                          "token is replaced at each lease renewal (every third of the "
                          "lease), so it must outlive the lease")
    if args.token_rotate < 4 * args.heartbeat_interval:
        raise ConfigError("--token-rotate must be at least 4 times --heartbeat-interval: "
                          "benefactors learn the next key from heartbeat answers before "
                          "it signs a token")
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    if args.standby_of:
        if args.standbys is not None:
            raise ConfigError("--standbys is for the active manager; a standby "
                              "(--standby-of) keeps no log of its own")
        from mosafs.manager.standby_main import run_standby
        return run_standby(args, data_dir, stop, listen_host)

    from mosafs.manager import follow_servicer, pools
    from mosafs.manager.core import Manager, ManagerConfig
    from mosafs.manager.metadata import MetadataStore
    from mosafs.manager.pools import DEFAULT_POOL
    from mosafs.manager.servicer import add_to_server
    from mosafs.rpc.peers import BenefactorPeers

    # Two managers on one data directory would each hand out leases and placements the
    # other does not know about.
    busy = f"another manager is running on {data_dir}"
    with exclusive(data_dir / "manager.lock", busy), MetadataStore(data_dir / "metadata.lmdb",
                                             map_size=args.map_size) as store:
        pool = store.update_pool(
            DEFAULT_POOL, replication=args.replication, stripe_width=args.stripe_width,
            chunker=args.chunker, write_semantics=args.write_semantics,
            redundancy=args.redundancy, ec_min_chunk=args.ec_min_chunk)
        config = ManagerConfig(heartbeat_interval_s=args.heartbeat_interval,
                               benefactor_lease_s=args.benefactor_lease,
                               write_lease_s=args.write_lease,
                               scan_interval_s=args.scan_interval,
                               gc_grace_s=args.gc_grace)
        peers = BenefactorPeers()
        manager = Manager(store, config, copy=peers.replicate,
                          run_round=peers.run_garbage_round, scrub=peers.scrub,
                          has=peers.has, tokens=_token_authority(args, data_dir),
                          recode=peers.recode, delete=peers.delete_chunks)
        _register_metrics(manager)
        journal = _replication_log(args, store)
        serve_standbys = follow_servicer.add_to_server(journal, store, data_dir / "spool")

        def add_services(server: Any) -> None:
            add_to_server(manager)(server)
            serve_standbys(server)

        srv, port = listen(add_services, args.listen, label="manager")
        replicator, repairer = manager.replicator, manager.repairer
        assert replicator is not None and repairer is not None
        background = [
            BackgroundLoop("replication", replicator.step, wakeup=replicator.wakeup),
            BackgroundLoop("fragment repair", repairer.step, wakeup=repairer.wakeup),
            BackgroundLoop("pruning", manager.prune_pass, wakeup=manager.prune_wakeup),
            BackgroundLoop("garbage collection", manager.collect_step),
        ]
        try:
            for loop in background:
                loop.start()
            address = advertised_address(listen_host, port)
            write_ready_file(args.ready_file, address=address, data_dir=str(data_dir),
                             metrics=metrics_url)
            log.info("manager serving %s on %s (default pool: %s, %s, W=%d, %s)", data_dir,
                     address, pool.chunker, pools.scheme(pool), pool.stripe_width,
                     pool.write_semantics)
            wait_for_stop(stop)
            log.info("stopping")
        finally:
            for loop in background:
                loop.stop()
            if journal is not None:
                journal.close()
            srv.stop(STOP_GRACE_S).wait()
            repairer.close()
            replicator.close()
            peers.close()
    log.info("stopped")
    return 0


def _replication_log(args: argparse.Namespace, store: Any) -> Any:
    """The replication log standbys follow (--standbys), attached to STORE; None without
    --standbys. This manager's epoch is one past the last its database holds."""
    if args.standbys is None:
        return None
    from mosafs.manager.replog import LAG_TIMEOUT_S, ReplicationLog

    seq, epoch = store.log_position()
    journal = ReplicationLog(epoch=epoch + 1, last_seq=seq, last_epoch=epoch,
                             standbys=args.standbys, wait_timeout_s=args.standby_wait,
                             lag_timeout_s=min(LAG_TIMEOUT_S, args.standby_wait / 6))
    store.attach_log(journal)
    log.info("replication log from entry %d (epoch %d); %d standby confirmation(s) per "
             "change", seq, epoch + 1, args.standbys)
    return journal


def _token_authority(args: argparse.Namespace, data_dir: Path) -> Any:
    """The signer of chunk access tokens (docs/operations.md), or None: plaintext (no
    certificate to bind a token to), or --chunk-tokens off."""
    from mosafs.manager.tokens import KEYS_FILE, TokenAuthority
    from mosafs.rpc import security

    if security.current() is None:
        log.info("chunk access tokens off: plaintext cluster (--insecure)")
        return None
    if args.chunk_tokens == "off":
        log.warning("chunk access tokens off (--chunk-tokens off): any client certificate "
                    "may read and write every chunk by id; use this only to measure their "
                    "cost")
        return None
    return TokenAuthority(ttl_s=args.token_ttl, rotate_s=args.token_rotate,
                          path=data_dir / KEYS_FILE)


def _register_metrics(manager: Any) -> None:
    """The manager's figures as gauges, read at every scrape (mosafs.metrics)."""
    from mosafs import metrics

    def figures() -> Any:
        status = manager.cluster_status()
        yield ("mosafs_manager_metadata_write_transactions", "LMDB write transactions",
               status.metadata_write_transactions, "counter", {})
        for name, text, value in (
                ("chunks", "Referenced chunks in the index", status.chunks),
                ("under_replicated_chunks", "Chunks with fewer than R copies",
                 status.under_replicated_chunks),
                ("replication_backlog_bytes", "Bytes still to copy to restore every R",
                 status.replication_backlog_bytes),
                ("lost_chunks", "Referenced chunks with no live copy", status.lost_chunks),
                ("replication_rate_bytes", "Recent replication rate, bytes/s",
                 status.replication_rate_bytes_s),
                ("ec_short_chunks", "Erasure-coded chunks with fewer than K+M fragments",
                 status.ec_short_chunks),
                ("ec_missing_fragments", "Fragments erasure-coded chunks lack",
                 status.ec_missing_fragments),
                ("ec_lost_chunks", "Erasure-coded chunks with fewer than K live fragments",
                 status.ec_lost_chunks)):
            yield (f"mosafs_manager_{name}", text, value, "gauge", {})
        for conv in status.conversions:
            yield ("mosafs_manager_conversion_remaining_chunks",
                   "Chunks still to re-encode to their pool's redundancy",
                   conv.remaining_chunks, "gauge", {"pool": conv.pool})
        alive = sum(b.alive for b in status.benefactors)
        for state, count in (("alive", alive), ("dead", len(status.benefactors) - alive)):
            yield ("mosafs_manager_benefactors", "Registered benefactors", count, "gauge",
                   {"state": state})

    metrics.register(metrics.ValuesCollector(figures))


class BackgroundLoop:
    """Runs PASS in a daemon thread until stop(): each pass returns the seconds to wait
    before the next; WAKEUP, when set by someone, ends a wait early. A pass that fails is
    logged and the loop goes on (a bug gets its traceback)."""

    def __init__(self, name: str, work: Callable[[], float], *,
                 wakeup: threading.Event | None = None, first_wait: float = 0.0) -> None:
        self._name = name
        self._work = work
        self._wakeup = wakeup or threading.Event()
        self._first_wait = first_wait
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wakeup.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        wait = self._first_wait
        while not self._stop.is_set():
            self._wakeup.wait(wait)
            self._wakeup.clear()
            if self._stop.is_set():
                return
            try:
                wait = self._work()
            except MosafsError as exc:
                log.warning("%s pass failed: %s", self._name, exc)
                wait = 1.0
            except Exception:
                log.exception("bug in the %s pass", self._name)
                wait = 1.0
