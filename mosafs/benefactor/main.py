"""`mosafs benefactor`: serve a data directory's chunks over gRPC and keep the manager told.

The process opens the chunk store (scanning it once), starts a thread-pool gRPC server,
writes the ready file, and, when a manager is named, registers with it and sends heartbeats
from a background thread. SIGTERM/SIGINT stop it cleanly with exit code 0.

Heavy modules (grpc, protobuf, blake3) are imported inside run() and the Registrar so that
`mosafs --help` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mosafs.argtypes import bounded_int, byte_size
from mosafs.errors import (
    ConfigError,
    DeadlineExceeded,
    FailedPrecondition,
    MosafsError,
    NotFound,
    Unavailable,
)
from mosafs.procutil import add_daemon_arguments

if TYPE_CHECKING:
    import grpc

    from mosafs._proto import benefactor_pb2
    from mosafs.benefactor.store import ChunkStore

log = logging.getLogger("mosafs.benefactor")

DEFAULT_LISTEN = "127.0.0.1:0"
MANAGER_ENV = "MOSAFS_MANAGER"
STOP_GRACE_S = 2.0          # in-flight RPCs get this long to finish on SIGTERM
RPC_TIMEOUT_S = 5.0         # one registration or heartbeat call
BACKOFF_FIRST_S = 0.1       # registration retries: 0.1 s doubling ...
BACKOFF_MAX_S = 5.0         # ... up to 5 s
DEFAULT_HEARTBEAT_S = 2.0   # when the manager's answer names no interval
SLOW_START_WARN_S = 30.0    # a manager never reached for this long is worth a WARNING
# A manager we had reached and that misses a heartbeat or two (busy, a standby taking over)
# is news; one gone this long is worth a WARNING.
OUTAGE_WARN_S = 5.0
INVENTORY_TIMEOUT_S = 60.0  # one inventory page
DEFAULT_SCRUB_RATE = 8 << 20  # bytes/s: a full pass over 1 TiB takes about 36 hours


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", metavar="DIR",
                        help="directory donated to mosafs (created if missing; required to "
                             "run a benefactor)")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"address to serve on; port 0 picks a free port "
                             f"(default {DEFAULT_LISTEN})")
    parser.add_argument("--advertise", metavar="HOST:PORT",
                        help="address the manager and clients should use (default: the bound "
                             "address; the host name when listening on all interfaces)")
    parser.add_argument("--manager", metavar="HOST:PORT",
                        help=f"manager to register with (default ${MANAGER_ENV}; with neither, "
                             "the benefactor runs standalone)")
    parser.add_argument("--capacity", type=byte_size(), metavar="SIZE",
                        help="most bytes of chunks to store, e.g. 500G (units K, M, G, T "
                             "are powers of 1024; default: the whole file system)")
    parser.add_argument("--pool", default="", metavar="NAME",
                        help="pool to join at registration (default: the pool it is in, "
                             "which `mosafs benefactor move` may have changed; 'default' for "
                             "a new benefactor)")
    parser.add_argument("--inventory-interval", type=float, default=3600.0, metavar="SECONDS",
                        help="how often to report every stored chunk to the manager, the "
                             "safety net of garbage collection for uploads that no commit "
                             "named (default 3600; also after every registration and on "
                             "`mosafs gc`; chunks whose files went are deleted when the "
                             "manager asks, without waiting for it)")
    parser.add_argument("--inventory-rate", type=float, default=2000.0, metavar="IDS_PER_S",
                        help="pace of the periodic inventory, in chunk ids a second "
                             "(default 2000: a million chunks in about 8 minutes; rounds "
                             "after a registration and on `mosafs gc` go at full speed)")
    parser.add_argument("--scrub-rate", type=byte_size(0), default=DEFAULT_SCRUB_RATE,
                        metavar="BYTES_PER_S",
                        help="re-verify stored chunks in the background at this many bytes "
                             "a second, each chunk counting as at least 64 KiB, e.g. 8M (K, "
                             "M, G suffixes; default 8M; 0 turns background scrubbing off; "
                             "`mosafs scrub` runs a pass now)")
    parser.add_argument("--ingest-rate", type=byte_size(0), default=0, metavar="BYTES_PER_S",
                        help="take chunk bytes no faster than this, e.g. 125M (a 1 Gbit/s "
                             "link; K, M, G suffixes; default 0: no limit)")
    parser.add_argument("--local-io", choices=["on", "off"], default="on",
                        help="hand chunk files to readers on this host and take chunks from "
                             "writers on it in memory files (OpenLocal and a Unix socket, "
                             "tokens checked first; docs/benefactor.md, \"Local reads and "
                             "puts\"; default on)")
    parser.add_argument("--ready-file", metavar="PATH",
                        help="write {address, pid, id, data_dir} as JSON here once serving")
    parser.add_argument("--max-concurrent-rpcs", type=bounded_int(1, 100_000), default=256,
                        metavar="N",
                        help="RPCs served at once; more are answered RESOURCE_EXHAUSTED at "
                             "once and clients retry with backoff (default 256)")
    add_daemon_arguments(parser, "benefactor")


def run(args: argparse.Namespace) -> int:
    from mosafs.addresses import advertised_address, split_address
    from mosafs.benefactor.servicer import add_to_server
    from mosafs.procutil import (
        listen,
        serving,
        start_daemon,
        stop_event,
        wait_for_stop,
    )

    if not args.data_dir:
        raise ConfigError("--data-dir is required to run a benefactor (or give an action: "
                          "list, drain, remove, move)")
    stop = stop_event()  # first: a signal during start-up still stops us cleanly
    metrics_url = start_daemon(args, "benefactor")
    manager = args.manager or os.environ.get(MANAGER_ENV) or None
    listen_host, _ = split_address(args.listen, "--listen")
    if manager:
        from mosafs.rpc.managers import parse_managers

        parse_managers(manager)  # HOST:PORT, or several: a cluster's managers
    if args.advertise:
        split_address(args.advertise, "--advertise")

    from mosafs.benefactor.chunkstore import FileChunkStore, load_or_create_identity
    from mosafs.benefactor.garbage import GarbageRounds
    from mosafs.benefactor.ingest import IngestLimiter
    from mosafs.benefactor.localreads import LocalReads
    from mosafs.benefactor.puts import Puts
    from mosafs.benefactor.recode import Recoder
    from mosafs.benefactor.recovery import RecoveryRecords
    from mosafs.benefactor.replication import ChunkReplicator
    from mosafs.benefactor.scrub import Scrubber, ScrubLoop
    from mosafs.benefactor.tokens import TokenChecker
    from mosafs.rpc import security
    from mosafs.rpc.peers import BenefactorPeers

    if not 0 < args.inventory_interval < 1e7:
        raise ConfigError("--inventory-interval must be a positive number of seconds")
    if not 0 < args.inventory_rate < 1e9:
        raise ConfigError("--inventory-rate must be a positive number of ids a second")
    data_dir = os.path.abspath(args.data_dir)  # the ready file is read from other cwds
    with FileChunkStore(data_dir, capacity=args.capacity) as store:
        info = InfoSource(store, load_or_create_identity(store.data_dir), args.pool)
        peers = BenefactorPeers()
        replicator = ChunkReplicator(store, peers.put)
        # Tokens bind to certificates and come from a manager: without either, none.
        tokens = TokenChecker(required=bool(manager) and security.current() is not None)
        registrar = Registrar(manager, info, SecurityUpdates(tokens)) if manager else None
        rounds = GarbageRounds(store, _reviewer(registrar, info))
        scrubber = Scrubber(store, _corrupt_reporter(registrar, info) if registrar else None)
        scrubs = ScrubLoop(scrubber, args.scrub_rate)
        ingest = IngestLimiter(args.ingest_rate) if args.ingest_rate else None
        recoder = Recoder(store, peers.get, peers.put, check=scrubber.check)
        puts = Puts(store)
        local = LocalReads(store.path_of, put=_local_put(puts, ingest)) \
            if args.local_io == "on" else None
        _register_metrics(store)
        records = RecoveryRecords(store.data_dir)
        srv, port = listen(lambda srv: add_to_server(srv, store, info, replicator, rounds,
                                                     scrubber, ingest, tokens, recoder, puts,
                                                     local, records),
                           args.listen,
                           label="benefactor", max_concurrent_rpcs=args.max_concurrent_rpcs)
        info.address = advertised_address(listen_host, port, args.advertise)
        inventory = (InventoryLoop(registrar, rounds, args.inventory_interval,
                                   args.inventory_rate) if registrar else None)
        try:
            if registrar and inventory:
                registrar.start()
                inventory.start()
            scrubs.start()
            serving(args.ready_file, address=info.address, id=info.id,
                    data_dir=str(store.data_dir), listen=f"{listen_host}:{port}",
                    metrics=metrics_url)
            log.info("benefactor %s serving %s on port %d as %s (pool %s, %s)",
                     info.id, store.data_dir, port, info.address,
                     args.pool or "as registered",
                     f"manager {manager}" if manager else "standalone: no manager")
            wait_for_stop(stop)
            log.info("stopping")
        finally:
            scrubs.stop()
            if inventory:
                inventory.stop()
            if registrar:
                registrar.stop()
            srv.stop(STOP_GRACE_S).wait()
            recoder.close()
            puts.close()
            if local is not None:
                local.close()
            peers.close()
    log.info("stopped")
    return 0


def _local_put(puts: Any, ingest: Any) -> Any:
    """What a local put does with the blobs (id, offset, length) of its memory file FD:
    the ingest limit, then each read out of the file and stored (Puts.from_file)."""

    def put(fd: int, spans: list[tuple[bytes, int, int]]) -> Any:
        if ingest is not None:
            ingest.take(sum(n for _, _, n in spans))
        return puts.from_file(fd, spans)

    return put


def _register_metrics(store: ChunkStore) -> None:
    """The store's figures as gauges, read at every scrape (mosafs.metrics)."""
    from mosafs import metrics

    def figures() -> Any:
        usage = store.usage()
        for name, text, value in (("chunks", "Chunks stored", usage.chunks),
                                  ("stored_bytes", "Bytes of chunks stored",
                                   usage.stored_bytes),
                                  ("free_bytes", "Bytes this benefactor may still store",
                                   usage.free_bytes)):
            yield (f"mosafs_benefactor_{name}", text, value, "gauge", {})

    metrics.register(metrics.ValuesCollector(figures))


def _reviewer(registrar: Registrar | None, info: InfoSource) -> Any:
    """The review function of garbage rounds: one ReportInventory call per page."""

    def review(items: Any) -> tuple[list[bytes], int]:
        from mosafs._proto import manager_pb2

        if registrar is None:
            raise Unavailable("this benefactor runs without a manager: nothing to collect")
        request = manager_pb2.InventoryReport(benefactor_id=info.id, entries=[
            manager_pb2.InventoryEntry(id=i.id, touched_ns=i.touched_ns, length=i.length)
            for i in items])
        reply = registrar.call("ReportInventory", request, INVENTORY_TIMEOUT_S)
        return list(reply.release), int(reply.waiting)

    return review


def _corrupt_reporter(registrar: Registrar, info: InfoSource) -> Any:
    """The report function of the scrubber: one ReportCorruptChunks call."""

    def report(ids: Any) -> None:
        from mosafs._proto import manager_pb2

        registrar.call("ReportCorruptChunks",
                       manager_pb2.CorruptChunksReport(benefactor_id=info.id, ids=list(ids)),
                       RPC_TIMEOUT_S)

    return report


class InventoryLoop:
    """Runs an inventory round after every registration (at full speed: a returning
    benefactor's copies count again at once) and every INTERVAL seconds (RATE ids a
    second: the safety net, which must not cost the manager more than a small share of a
    core on a large store)."""

    def __init__(self, registrar: Registrar, rounds: Any, interval: float,
                 rate: float) -> None:
        self._registrar = registrar
        self._rounds = rounds
        self._interval = interval
        self._rate = rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inventory", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._registrar.registered.set()  # wakes the loop
        self._thread.join(timeout=RPC_TIMEOUT_S + 1)

    def _run(self) -> None:
        while True:
            self._registrar.registered.wait(self._interval)
            if self._stop.is_set():
                return
            registered = self._registrar.registered.is_set()
            if not registered and not self._registrar.contacted:
                continue  # never registered yet: nothing to report to
            self._registrar.registered.clear()
            try:
                self._rounds.run(0.0 if registered else self._rate)
            except MosafsError as exc:
                log.info("inventory round skipped: %s", exc.message)
            except Exception:
                log.exception("bug in the inventory round")


class SecurityUpdates:
    """Applies the manager's SecurityState (registration and heartbeat answers): the chunk
    token keys, and the certificates it revoked."""

    def __init__(self, tokens: Any) -> None:
        self._tokens = tokens
        self._announced = False

    def __call__(self, state: Any) -> None:
        from mosafs.rpc import security

        if self._tokens.update((k.id, k.secret, k.not_after_ms) for k in state.token_keys):
            log.info("the manager sent new keys only for chunk access tokens (it lost the "
                     "old ones): tokens signed before are refused, and readers ask again")
        security.revocations().add_remote(state.revoked)
        if not self._announced and self._tokens.required:
            self._announced = True
            log.info("chunk access tokens %s", "checked" if state.token_keys
                     else "off: the manager issues none (--chunk-tokens off)")


class InfoSource:
    """Builds the BenefactorInfo for GetInfo and heartbeats; the address is set once bound."""

    def __init__(self, store: ChunkStore, benefactor_id: str, pool: str) -> None:
        self.store = store
        self.id = benefactor_id
        self.pool = pool
        self.address = ""

    def __call__(self) -> benefactor_pb2.BenefactorInfo:
        from mosafs.benefactor.servicer import Identity, info_message

        return info_message(Identity(self.id, self.address, self.pool), self.store)


class _LinkLog:
    """Logs the manager's reachability by transitions, not by attempts.

    Unreachable before the first contact is normal (the manager may start later): INFO,
    and one WARNING if that lasts SLOW_START_WARN_S. Losing a manager we had reached: one
    INFO when the outage starts, one WARNING if it lasts OUTAGE_WARN_S (a heartbeat missed
    under load is not an operator's problem), one INFO when it ends. A refusal (any other
    error, e.g. an unknown pool) is a WARNING once per distinct message, and an INFO when
    it ends.
    """

    def __init__(self, manager: str) -> None:
        self.manager = manager
        self.contacted = False
        self.down_since: float | None = None
        self.slow_start_warned = False
        self.outage_warned = False
        self.last_refusal = ""

    def failed(self, exc: MosafsError) -> None:
        from mosafs.rpc.managers import refused_by_standby

        if refused_by_standby(exc):  # one of several managers: the next one is asked
            log.info("manager %s: %s", self.manager, exc.message)
        elif isinstance(exc, Unavailable | DeadlineExceeded):
            self._unreachable(exc)
        elif exc.message != self.last_refusal:
            self.last_refusal = exc.message
            log.warning("manager %s refused this benefactor: %s; retrying",
                        self.manager, exc.message)

    def _unreachable(self, exc: MosafsError) -> None:
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = now
            if self.contacted:
                log.info("manager %s unreachable: %s; retrying", self.manager, exc.message)
            else:
                log.info("manager %s not reachable yet (%s); retrying until it is",
                         self.manager, exc.message)
        elif (self.contacted and not self.outage_warned
              and now - self.down_since >= OUTAGE_WARN_S):
            self.outage_warned = True
            log.warning("manager %s unreachable for %.0fs (%s); retrying",
                        self.manager, now - self.down_since, exc.message)
        elif (not self.contacted and not self.slow_start_warned
              and now - self.down_since >= SLOW_START_WARN_S):
            self.slow_start_warned = True
            log.warning("manager %s still unreachable after %.0fs (%s); is --manager right?",
                        self.manager, now - self.down_since, exc.message)

    def succeeded(self) -> None:
        if self.down_since is not None and (self.contacted or self.slow_start_warned):
            log.info("manager %s reachable again after %.1fs",
                     self.manager, time.monotonic() - self.down_since)
        if self.last_refusal:
            log.info("manager %s accepts this benefactor again", self.manager)
        self.contacted = True
        self.down_since = None
        self.slow_start_warned = False
        self.outage_warned = False
        self.last_refusal = ""


class Registrar:
    """Registers with the manager (retrying with backoff), then heartbeats; re-registers
    when the manager no longer knows us. Runs in a daemon thread until stop()."""

    def __init__(self, manager: str, info: Callable[[], benefactor_pb2.BenefactorInfo],
                 security: Callable[[Any], None] | None = None) -> None:
        from mosafs.rpc.managers import Managers, parse_managers

        # Several managers (A,B,C): the active one is followed (mosafs.rpc.managers).
        self._managers = Managers(parse_managers(manager))
        self._manager = self._managers.addresses[0]
        self._info = info
        self._security = security or (lambda state: None)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # guards the channel against stop() closing it
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._link = _LinkLog(manager)
        self._thread = threading.Thread(target=self._run, name="registrar", daemon=True)
        self.registered = threading.Event()  # set on every (re-)registration

    @property
    def contacted(self) -> bool:
        return self._link.contacted

    def call(self, method: str, request: Any, timeout: float) -> Any:
        """One manager RPC on the registrar's channel (domain errors on failure)."""
        return self._call(method, request, timeout)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._channel is not None:
                self._channel.close()  # cancels a call in flight, so the thread ends now
                self._channel = None
        self._thread.join(timeout=RPC_TIMEOUT_S + 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                interval = self._register()
                if interval is None:
                    return
                self._heartbeats(interval)
            except Exception:
                if self._stop.is_set():
                    return  # stop() closed the channel under a call
                log.exception("bug in the registration thread; retrying")
                self._stop.wait(BACKOFF_MAX_S)

    def _call(self, method: str, request: Any, timeout: float) -> Any:
        from mosafs.rpc.errors import call
        from mosafs.rpc.managers import refused_by_standby

        with self._lock:
            if self._stop.is_set():
                raise Unavailable("stopping")
            if self._channel is None:
                from mosafs._proto import manager_pb2_grpc
                from mosafs.rpc.channels import channel

                self._manager = self._managers.addresses[self._managers.current]
                self._channel = channel(self._manager)
                self._stub = manager_pb2_grpc.ManagerStub(self._channel)
            stub = self._stub
        try:
            return call(getattr(stub, method), request, timeout=timeout)
        except (Unavailable, DeadlineExceeded, FailedPrecondition) as exc:
            # grpc waits up to two minutes between reconnects of a failed channel; a fresh
            # channel connects at once, so a returning manager is noticed within our backoff.
            # With several managers the next one is asked from now on (a standby refused,
            # or this one is gone); the caller's retry sends it there.
            if not isinstance(exc, FailedPrecondition) or refused_by_standby(exc):
                with self._lock:
                    self._managers.failed(self._managers.addresses.index(self._manager))
                self._drop_channel()
            raise

    def _drop_channel(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    def _register(self) -> float | None:
        """Register until it succeeds; the heartbeat interval in seconds (None: stopping)."""
        from mosafs._proto import manager_pb2

        delay = BACKOFF_FIRST_S
        while not self._stop.is_set():
            request = manager_pb2.RegisterBenefactorRequest(info=self._info())
            try:
                response = self._call("RegisterBenefactor", request, RPC_TIMEOUT_S)
            except MosafsError as exc:
                if self._stop.is_set():
                    return None
                self._link.failed(exc)
                self._stop.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            self._link.succeeded()
            self._security(response.security)
            self.registered.set()  # an inventory round follows: copies count again
            interval = response.heartbeat_interval_ms / 1000 or DEFAULT_HEARTBEAT_S
            log.info("registered with manager %s as %s (heartbeat every %.1fs)",
                     self._manager, request.info.id, interval)
            return interval
        return None

    def _heartbeats(self, interval: float) -> None:
        """Heartbeat every INTERVAL seconds; return when the manager asks us to register."""
        from mosafs._proto import manager_pb2

        timeout = min(RPC_TIMEOUT_S, max(interval, 1.0))
        while not self._stop.wait(interval):
            request = manager_pb2.HeartbeatRequest(info=self._info())
            try:
                reply = self._call("Heartbeat", request, timeout)
            except NotFound:
                self._link.succeeded()
                log.info("manager %s does not know this benefactor (restarted or expired "
                         "it): registering again", self._manager)
                return
            except MosafsError as exc:
                if self._stop.is_set():
                    return
                self._link.failed(exc)
                continue
            self._link.succeeded()
            self._security(reply.security)
