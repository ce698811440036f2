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
from pathlib import Path

from mosafs.argtypes import MiB, bounded_int, byte_size, ec_min_chunk_arg, redundancy_arg
from mosafs.errors import ConfigError
from mosafs.procutil import add_daemon_arguments

log = logging.getLogger("mosafs.manager")

DEFAULT_LISTEN = "127.0.0.1:0"


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
    ha.add_argument("--feed-port", type=bounded_int(0, 65535), default=0, metavar="PORT",
                    help="the port, on the host of --listen, where the active manager feeds "
                         "its log to standbys (they ask for it; default 0: any free port)")
    ha.add_argument("--standby-of", metavar="HOST:PORT",
                    help="run as a standby of the active manager at HOST:PORT")
    ha.add_argument("--recover", metavar="HOST:PORT[,HOST:PORT]",
                    help="every manager is lost: rebuild this one, in an empty --data-dir, "
                         "from the newest metadata backup recorded on these benefactors "
                         "(`mosafs backup`), report what they hold that is newer, then "
                         "serve (docs/coordination.md, \"Metadata backups\")")
    failover = parser.add_argument_group(
        "failover", "managers that elect the active one among themselves through etcd "
        "(docs/coordination.md): each starts as a standby, and the one elected serves as "
        "active; one whose election lease lapses exits with status 75 (start it again: it "
        "comes back as a standby)")
    failover.add_argument("--etcd", metavar="URL[,URL]",
                          help="etcd's client URLs, e.g. http://127.0.0.1:2379 (needs "
                               "--standbys 1 or more)")
    failover.add_argument("--cluster-name", default="mosafs", metavar="NAME",
                          help="the cluster's keys in etcd (/mosafs/NAME/; default mosafs)")
    failover.add_argument("--lease-ttl", type=bounded_int(2, 60), default=5, metavar="SECONDS",
                          help="the active manager's election lease: a standby takes over "
                               "within about this long of its loss (default 5)")
    parser.add_argument("--ready-file", metavar="PATH",
                        help="write {address, pid, data_dir, metrics} as JSON here once "
                             "serving")
    add_daemon_arguments(parser, "manager")


def run(args: argparse.Namespace) -> int:
    from mosafs.addresses import split_address
    from mosafs.procutil import (
        exclusive,
        start_daemon,
        stop_event,
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
    if args.standby_of and args.etcd:
        raise ConfigError("--standby-of and --etcd exclude each other: a failover member "
                          "follows whoever etcd names as active")
    if args.recover and (args.standby_of or args.etcd):
        raise ConfigError("--recover rebuilds a lone manager: start it without --standby-of "
                          "and --etcd, then the others as its standbys")
    if args.standby_of:
        if args.standbys is not None:
            raise ConfigError("--standbys is for the active manager; a standby "
                              "(--standby-of) keeps no log of its own")
        from mosafs.manager.standby_main import run_standby
        return run_standby(args, data_dir, stop, listen_host)

    # Two managers on one data directory would each hand out leases and placements the
    # other does not know about.
    with exclusive(data_dir / "manager.lock", f"another manager is running on {data_dir}"):
        if args.recover:
            _recover(args, data_dir)
        if args.etcd:
            from mosafs.manager.ha_main import run_ha
            status = run_ha(args, data_dir, stop, listen_host, metrics_url)
        else:
            from mosafs.manager.active import serve_active
            status = serve_active(args, data_dir, stop, listen_host, metrics_url)
    log.info("stopped")
    return status


def _recover(args: argparse.Namespace, data_dir: Path) -> None:
    """--recover: the metadata rebuilt from the benefactors (mosafs.manager.recovery)."""
    from mosafs.manager.recovery import REPORT_FILE, recover
    from mosafs.rpc.managers import parse_managers
    from mosafs.rpc.peers import BenefactorPeers

    peers = BenefactorPeers()
    try:
        report = recover(data_dir, parse_managers(args.recover, "--recover"), peers,
                         map_size=args.map_size)
    finally:
        peers.close()
    log.info("recovered from backup %s (log entry %d) through %d benefactor(s); %d blob(s) "
             "newer than it kept%s; %d version(s) of it unreadable (chunks on no "
             "benefactor); report in %s", report.backup, report.seq,
             len(report.benefactors), len(report.after_backup),
             f" in {report.kept_in}" if report.kept_in else "",
             len(report.unreadable_versions), data_dir / REPORT_FILE)
