"""The active manager's serving (`mosafs manager`, and the failover member once elected,
mosafs.manager.ha_main): the store, the Manager service and its standbys' log, the
background loops, until asked to stop or until its leadership lapses."""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mosafs.errors import ConfigError, MosafsError

log = logging.getLogger("mosafs.manager")

STOP_GRACE_S = 2.0  # in-flight RPCs get this long to finish on SIGTERM
EXIT_DEPOSED = 75  # EX_TEMPFAIL: no longer the active manager; start again (as a standby)


def serve_active(args: argparse.Namespace, data_dir: Path, stop: threading.Event,
                 listen_host: str, metrics_url: str | None, *, leadership: Any = None,
                 on_in_sync: Any = None,
                 directory: Callable[[], dict[str, str]] | None = None) -> int:
    """Serve as the active manager until STOP (0), or until LEADERSHIP (failover,
    docs/standby.md) is lost (EXIT_DEPOSED): from then on nothing is acknowledged.
    DIRECTORY: the managers' addresses by member id, for `mosafs status`."""
    from mosafs.addresses import advertised_address
    from mosafs.manager import follow_servicer, pools
    from mosafs.manager.backups import Backups
    from mosafs.manager.core import Manager, ManagerConfig
    from mosafs.manager.metadata import MetadataStore
    from mosafs.manager.pools import DEFAULT_POOL
    from mosafs.manager.servicer import add_to_server
    from mosafs.manager.standby_main import member_id
    from mosafs.procutil import listen, serving
    from mosafs.rpc.peers import BenefactorPeers

    with MetadataStore(data_dir / "metadata.lmdb", map_size=args.map_size) as store:
        journal = _replication_log(args, store, leadership, on_in_sync)
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
                          has=peers.has, tokens=_token_authority(args, store),
                          recode=peers.recode, delete=peers.delete_chunks)
        _register_metrics(manager)
        manager.backups = Backups(store, lambda: [b.info.address for b in
                                                  manager.registry.statuses() if b.alive],
                                  peers.put_recovery_record, data_dir / "spool")
        standby_feed = _feed(args, journal, store, data_dir, listen_host)
        serve_standbys = follow_servicer.add_to_server(
            standby_feed.port if standby_feed is not None else None)

        def add_services(server: Any) -> None:
            add_to_server(manager)(server)
            serve_standbys(server)

        if journal is not None:
            # Before the port opens, not after: a client's write that came in between
            # was acknowledged without waiting for the standbys. Nothing writes between
            # here and listen(), and no standby can connect before it (FeedAddress).
            journal.serve()
        try:
            srv, port = listen(add_services, args.listen, label="manager")
        except BaseException:
            if standby_feed is not None:
                standby_feed.close()
            raise
        replicator, repairer = manager.replicator, manager.repairer
        assert replicator is not None and repairer is not None
        background = [
            BackgroundLoop("replication", replicator.step, wakeup=replicator.wakeup),
            BackgroundLoop("fragment repair", repairer.step, wakeup=repairer.wakeup),
            BackgroundLoop("pruning", manager.prune_pass, wakeup=manager.prune_wakeup),
            BackgroundLoop("garbage collection", manager.collect_step),
        ]
        status = 0
        try:
            address = advertised_address(listen_host, port)
            if journal is not None:
                manager.managers = _members(journal, member_id(data_dir), address, directory)
            for loop in background:
                loop.start()
            serving(args.ready_file, address=address, data_dir=str(data_dir),
                    metrics=metrics_url, role="active")
            log.info("manager serving %s on %s (default pool: %s, %s, W=%d, %s)", data_dir,
                     address, pool.chunker, pools.scheme(pool), pool.stripe_width,
                     pool.write_semantics)
            status = _serve_until_stopped(stop, leadership, journal)
        finally:
            for loop in background:
                loop.stop()
            if journal is not None:
                journal.close()
            if standby_feed is not None:
                standby_feed.close()
            srv.stop(STOP_GRACE_S).wait()
            repairer.close()
            replicator.close()
            peers.close()
    return status


def _feed(args: argparse.Namespace, journal: Any, store: Any, data_dir: Path,
          host: str) -> Any:
    """The listener of the standbys' feed (None without a log to feed)."""
    from mosafs.manager.follow_servicer import Feed

    if journal is None:
        return None
    try:
        return Feed(journal, store, data_dir / "spool", host, args.feed_port).start()
    except OSError as exc:
        raise ConfigError(f"cannot listen for standbys on {host}:{args.feed_port} (in use, "
                          f"or not an address of this host): {exc}") from None


def _members(journal: Any, member: str, address: str,
             directory: Callable[[], dict[str, str]] | None) -> Callable[[], list[Any]]:
    """The managers as `mosafs status` shows them: this one (active) and the standbys
    following its log, with their addresses where DIRECTORY knows them."""
    from mosafs._proto import manager_pb2 as mpb

    def describe() -> list[Any]:
        addresses = directory() if directory is not None else {}
        out = [mpb.ManagerMember(member=member, address=address, active=True, in_sync=True,
                                 epoch=journal.epoch, log_seq=journal.last_seq)]
        out += [mpb.ManagerMember(member=m, address=addresses.get(m, ""), in_sync=in_sync,
                                  lag_entries=lag)
                for m, lag, in_sync in journal.followers()]
        return out
    return describe


def _serve_until_stopped(stop: threading.Event, leadership: Any, journal: Any) -> int:
    """0 once STOP is set; EXIT_DEPOSED as soon as LEADERSHIP (if any) is no longer valid,
    or the replication log JOURNAL (if any) is broken (a change reached the standbys that
    this manager could not store: a standby has to take over)."""
    from mosafs.procutil import wait_for_stop

    if leadership is None and journal is None:
        wait_for_stop(stop)
        log.info("stopping")
        return 0
    while not stop.wait(0.2):
        if leadership is not None and not leadership.valid():
            log.error("this manager is no longer the active one (its lease in the "
                      "coordination service lapsed); stopping, acknowledging nothing more")
            return EXIT_DEPOSED
        if journal is not None and (why := journal.broken):
            # Its lease is resigned by its owner (ha_main) as it stops.
            log.error("%s; stopping, so that a standby takes over", why)
            return EXIT_DEPOSED
    log.info("stopping")
    if leadership is not None:
        leadership.resign()
    return 0


def _replication_log(args: argparse.Namespace, store: Any, leadership: Any,
                     on_in_sync: Any) -> Any:
    """The replication log standbys follow (--standbys), attached to STORE; None without
    --standbys. This manager's epoch (its term) is one past the last its database holds
    and past every term begun on it before (stored, and synced, before anything of the
    new term can be shipped: ReplicaOps.start_term), and with LEADERSHIP at least its
    fencing token (the coordination service's revision, which is the term unless the
    database holds one as high: etcd's data lost and started again)."""
    if args.standbys is None:
        return None
    from mosafs.manager.replog import LAG_TIMEOUT_S, ReplicationLog

    seq, epoch, term = store.start_term(leadership.epoch if leadership is not None else 0)
    journal = ReplicationLog(epoch=term, last_seq=seq, last_epoch=epoch,
                             standbys=args.standbys, wait_timeout_s=args.standby_wait,
                             lag_timeout_s=min(LAG_TIMEOUT_S, args.standby_wait / 6),
                             fence=leadership.valid if leadership is not None else None,
                             on_in_sync=on_in_sync)
    store.attach_log(journal)
    log.info("replication log from entry %d (epoch %d); %d standby confirmation(s) per "
             "change", seq, term, args.standbys)
    return journal


def _token_authority(args: argparse.Namespace, store: Any) -> Any:
    """The signer of chunk access tokens (docs/operations.md), or None: plaintext (no
    certificate to bind a token to), or --chunk-tokens off. Its keys derive from the
    store's master secret, the same on every manager of a failover group."""
    from mosafs.manager.tokens import TokenAuthority
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
                          master=store.token_master())


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
