"""`mosafs mount`: the FUSE client process.

Trio structure: one root nursery; the context and the file system are created with
`await X.create(...)` inside it and closed by the shutdown path right after; the FUSE loop
runs until unmount or SIGINT/SIGTERM. A signal first lets the files open for writing be
closed (and committed) by their applications, for up to --stop-timeout (see "stopping"
below).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mosafs.argtypes import MiB, bounded_float, byte_size
from mosafs.errors import ConfigError, MosafsError, domain_error
from mosafs.procutil import add_daemon_arguments

if TYPE_CHECKING:
    from mosafs.client.operations import Operations

log = logging.getLogger(__name__)
DEFAULT_STOP_TIMEOUT = 120.0
STATUS_INTERVAL = 0.5  # seconds between two looks at the open files while stopping
# pyfuse3's request tasks kept waiting for the next request. With its default of one, a
# request that waits (for the manager) makes pyfuse3 start a task for the next request,
# which ends again once two are idle: 0.75 tasks started and ended per file created by 8
# processes (docs/benchmarks.md, "The mount's scheduler passes").
FUSE_IDLE_TASKS = 16


def add_hash_backend_argument(parser: argparse.ArgumentParser) -> None:
    """--hash-backend, as `mosafs mount` and `mosafs up` (which passes it on) take it."""
    parser.add_argument("--hash-backend", choices=["auto", "cpu", "gpu"],
                        default=os.environ.get("MOSAFS_HASH_BACKEND", "auto"),
                        help="where chunking and hashing run: gpu (CuPy and a CUDA device; "
                             "an error without one), cpu, or auto (the GPU when there is one); "
                             "default: $MOSAFS_HASH_BACKEND, else auto")


def add_stop_timeout_argument(parser: argparse.ArgumentParser) -> None:
    """--stop-timeout, as `mosafs mount` and `mosafs up` (which passes it on) take it."""
    parser.add_argument("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT,
                        metavar="SECONDS",
                        help="at SIGINT/SIGTERM, how long to wait for the applications to "
                             "close (and so commit) the files they are writing; after it, or "
                             "at a second signal, uncommitted writes are discarded and those "
                             "files keep their previous version (default "
                             f"{DEFAULT_STOP_TIMEOUT:g}; 0: do not wait)")


def check_stop_timeout(seconds: float) -> None:
    if not 0 <= seconds <= 86400:
        raise ConfigError(f"--stop-timeout must be 0..86400 seconds, got {seconds:g}")


def add_coherent_timeout_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coherent-timeout", type=bounded_float(0, 86400), default=60.0,
                        metavar="SECONDS",
                        help="how long the mount's names and attributes stay cached, there "
                             "and in the kernel, while the manager's change lists keep them "
                             "coherent (other mounts' changes are seen within 0.2-1 s "
                             "either way); 0: one second, without change lists (default 60)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mountpoint", help="an existing empty directory")
    parser.add_argument("--manager", default=os.environ.get("MOSAFS_MANAGER"),
                        help="HOST:PORT of the manager (default: $MOSAFS_MANAGER)")
    add_hash_backend_argument(parser)
    parser.add_argument("--window-mib", type=byte_size(MiB, unit=MiB), default=64,
                        help="sliding write window per open file, in MiB or with a unit "
                             "(1G) (default: 64)")
    parser.add_argument("--cache-mib", type=byte_size(MiB, unit=MiB), default=256,
                        help="LRU chunk cache for reads, in MiB or with a unit (1G) "
                             "(default: 256)")
    parser.add_argument("--write-semantics", choices=["optimistic", "pessimistic"],
                        help="close returns once every chunk has one copy (optimistic; the "
                             "manager replicates in the background) or R copies "
                             "(pessimistic); default: the pool's setting")
    parser.add_argument("--gpu-pinned-mib", type=byte_size(MiB, unit=MiB), default=256,
                        help="page-locked host memory for the GPU hash backend, per process "
                             "that chunks (the mount, or each data-path worker), in MiB or "
                             "with a unit; slots past it use pageable memory (default: 256)")
    parser.add_argument("--spill-dir", help="directory for temp files of non-sequential writes")
    parser.add_argument("--datapath-workers", type=_workers, metavar="N",
                        default=os.environ.get("MOSAFS_DATAPATH_WORKERS", "auto"),
                        help="processes that chunk, hash and upload written files, so that "
                             "writing uses more than the FUSE loop's core (0: in the mount "
                             "process; default: $MOSAFS_DATAPATH_WORKERS, else auto: one "
                             "per 4 CPUs, at most 8, none below 4 CPUs)")
    parser.add_argument("--writeback-cache", action="store_true",
                        help="let the kernel gather small writes (much faster small writes); "
                             "only for a mount that is the sole writer of its files: other "
                             "mounts' changes to a file's size are then not seen here")
    parser.add_argument("--allow-other", action="store_true",
                        help="let users other than the mounting one use the mount")
    parser.add_argument("--manager-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="how long a file-system call waits for an unreachable manager "
                             "before it fails with ETIMEDOUT (default 30)")
    add_coherent_timeout_argument(parser)
    add_stop_timeout_argument(parser)
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)
    # `mosafs up` reads this while the mount stops: files open for writing, and their bytes.
    parser.add_argument("--status-file", help=argparse.SUPPRESS)
    add_daemon_arguments(parser, "client")


def _workers(text: str) -> int:
    """--datapath-workers: N (0..64) or auto."""
    if text == "auto":
        return auto_workers()
    if not (text.isascii() and text.isdigit()) or int(text) > 64:
        raise argparse.ArgumentTypeError(f"expected 0..64 or auto, got {text!r}")
    return int(text)


def auto_workers(cpus: int | None = None) -> int:
    """The default: none on a small machine, where the FUSE loop and the cluster's other
    processes already share the cores, else one per 4 CPUs up to 8."""
    cpus = cpus or len(os.sched_getaffinity(0))
    return 0 if cpus < 4 else min(8, cpus // 4)


def _interrupted_replies(record: logging.LogRecord) -> bool:
    """libfuse answers a reply to a request the kernel no longer waits for (interrupted,
    or the connection is going away at unmount) with ENOENT, and pyfuse3 logs that as an
    ERROR. Nothing is lost (nobody waits for the answer): it is noted at DEBUG instead."""
    message = record.getMessage()
    if "fuse_reply_" in message and "No such file or directory" in message:
        log.debug("reply to an interrupted request dropped: %s", message)
        return False
    return True


def run(args: argparse.Namespace) -> int:
    import trio

    from mosafs.client.files import ClientConfig
    from mosafs.procutil import start_daemon

    if not 0.5 <= args.manager_timeout <= 3600:
        raise ConfigError("--manager-timeout must be 0.5..3600 seconds")
    check_stop_timeout(args.stop_timeout)
    args.metrics_url = start_daemon(args, "client")
    logging.getLogger("pyfuse3").addFilter(_interrupted_replies)
    if not args.manager:
        raise ConfigError("no manager address: pass --manager HOST:PORT or set MOSAFS_MANAGER")
    mountpoint = Path(args.mountpoint)
    if not mountpoint.is_dir():
        raise ConfigError(f"mount point {mountpoint} is not a directory")
    if args.window_mib < 4 or args.cache_mib < 16:
        raise ConfigError("--window-mib must be >= 4 and --cache-mib >= 16")
    if not args.datapath_workers:  # else each worker sets it up, and says so at start
        from mosafs.chunking import resolve_backend

        resolve_backend(args.hash_backend)  # one line, not a traceback, when it cannot be had
    config = ClientConfig(
        manager=args.manager, hash_backend=args.hash_backend,
        window_bytes=args.window_mib << 20, cache_bytes=args.cache_mib << 20,
        gpu_pinned_bytes=args.gpu_pinned_mib << 20,
        spill_dir=Path(args.spill_dir) if args.spill_dir else None,
        write_semantics=args.write_semantics, manager_timeout=args.manager_timeout,
        coherent_timeout=args.coherent_timeout,
        tls_dir=str(Path(args.tls_dir or os.environ.get("MOSAFS_TLS_DIR", "")).absolute())
        if (args.tls_dir or os.environ.get("MOSAFS_TLS_DIR")) else "")
    try:
        trio.run(_serve, config, mountpoint, args)
    except BaseExceptionGroup as group:
        # The root nursery failed with a domain error (a manager that never answered):
        # it reaches the user as one line; anything else is a bug and keeps its traceback.
        error = domain_error(group)
        if error is None:
            raise
        raise error from None
    return 0


async def _serve(config: object, mountpoint: Path, args: argparse.Namespace) -> None:
    import pyfuse3
    import trio

    from mosafs.client.files import ClientContext, FileSystem
    from mosafs.client.operations import Operations
    from mosafs.procutil import serving

    options = set(pyfuse3.default_options)
    options |= {"fsname=mosafs", "subtype=mosafs"}
    if args.allow_other:
        options.add("allow_other")
    async with trio.open_nursery() as nursery:
        ctx = await ClientContext.create(config, nursery,  # type: ignore[arg-type]
                                         eager=not args.datapath_workers)
        try:
            await _start_workers(ctx, args, nursery)
            if not args.datapath_workers:  # each worker warms its own
                ctx.spawn(ctx.cpu, ctx.warm_up)
            fs = await FileSystem.create(ctx)
        except BaseException:
            ctx.close()
            raise
        try:
            ops = Operations(fs, attr_timeout=ctx.config.attr_timeout,
                             writeback_cache=args.writeback_cache)
            pyfuse3.init(ops, str(mountpoint), options)
        except BaseException:
            await fs.close()
            raise
        ops.keep_coherent()
        try:
            log.info("mounted %s (manager %s)", mountpoint, config.manager)  # type: ignore[attr-defined]
            serving(args.ready_file, address=str(mountpoint),
                    mountpoint=str(mountpoint), metrics=args.metrics_url)
            nursery.start_soon(_stop_on_signal, ops, args)
            await pyfuse3.main(min_tasks=FUSE_IDLE_TASKS)
        finally:
            discarded = await fs.close()
            _write_status(args.status_file, state="stopped", discarded=discarded)
            pyfuse3.close(unmount=True)
            log.info("unmounted %s", mountpoint)
            nursery.cancel_scope.cancel()


async def _start_workers(ctx: Any, args: argparse.Namespace, nursery: Any) -> None:
    """The data-path workers (mosafs.client.files.remote), with this mount's settings."""
    if not args.datapath_workers:
        return
    import dataclasses

    from mosafs.client.files.remote import WorkerPool
    from mosafs.rpc import security

    ctx.workers = WorkerPool(args.datapath_workers, {
        "config": dataclasses.asdict(ctx.config), "identity": security.current(),
        "log_level": args.log_level, "log_format": args.log_format})
    log.info("hash backend: %s (in the data-path workers)", await ctx.workers.start(nursery))
    ctx.fetcher.workers = ctx.workers  # chunk fetches for readers too


# -- stopping ----------------------------------------------------------------------------------
# The first SIGINT/SIGTERM refuses new opens for writing and waits, up to --stop-timeout, for
# the applications to close the files they have open for writing: closing commits a file
# whole. The timeout, or a second signal, stops at once, and what was not committed is
# discarded: such a file keeps its previous version (a commit is all or nothing). Committing
# the bytes written so far instead would make a cut-off checkpoint the newest version (one
# that pruning would keep in place of a whole one), and the application, whose next write
# fails, could not tell the cut-off version from its own.


async def _stop_on_signal(ops: Operations, args: argparse.Namespace) -> None:
    import pyfuse3
    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        await signals.__anext__()
        ops.stopping = True
        outcome = await _wait_for_writers(ops, signals, args)
        files, size = await _open_writes(ops)
        if files:
            log.warning("stopping %s with %d file(s) still open for writing (%d bytes): "
                        "their writes since their last commit are discarded",
                        outcome, files, size)
        await ops.end_invalidations()
        pyfuse3.terminate()
        # Still ours until the unmount cancels this task: a third signal must not bring
        # back the default action (an exit with the mount left dead).
        async for _ in signals:
            log.info("already stopping")


async def _wait_for_writers(ops: Operations, signals: AsyncIterator[int],
                            args: argparse.Namespace) -> str:
    """Until no file is open for writing, a second signal, or the timeout: which one, in
    words for the log."""
    import trio

    outcome = f"after the --stop-timeout of {args.stop_timeout:g} s"
    async with trio.open_nursery() as nursery:

        async def second_signal() -> None:
            nonlocal outcome
            await signals.__anext__()
            outcome = "at a second signal"
            nursery.cancel_scope.cancel()

        nursery.start_soon(second_signal)
        with trio.move_on_after(args.stop_timeout):
            await _until_closed(ops, args)
            outcome = "with every file closed"
        nursery.cancel_scope.cancel()
    return outcome


async def _until_closed(ops: Operations, args: argparse.Namespace) -> None:
    """Until no handle is open for writing; the log and the status file say how many are."""
    import trio

    told = None
    while True:
        files, size = await _open_writes(ops)
        _write_status(args.status_file, state="stopping", files=files, bytes=size,
                      stop_timeout=args.stop_timeout)
        if files and files != told:
            log.info("stopping: waiting for %d file(s) open for writing to be closed "
                     "(%d bytes so far; at most %g s)", files, size, args.stop_timeout)
        told = files
        if not files:
            return
        await trio.sleep(STATUS_INTERVAL)


async def _open_writes(ops: Operations) -> tuple[int, int]:
    """How many files are open for writing, and their sizes as this mount sees them (what
    their applications wrote so far)."""
    inodes = ops.open_for_writing()
    size = 0
    for inode in inodes:
        with contextlib.suppress(MosafsError):  # gone meanwhile: counted without its bytes
            size += (await ops.fs.getattr(inode)).size
    return len(inodes), size


def _write_status(path: str | None, **status: Any) -> None:
    """Replace PATH with STATUS as JSON (no fsync: a reader of this run needs it, not a
    reader after a crash)."""
    if not path:
        return
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, path)
    except OSError as exc:
        log.info("cannot write the status file %s: %s", path, exc)
