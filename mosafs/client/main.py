"""`mosafs mount`: the FUSE client process.

Trio structure: one root nursery; the context and the file system are created with
`await X.create(...)` inside it and closed by the shutdown path right after; the FUSE loop
runs until unmount or SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path

from mosafs.errors import ConfigError, domain_error
from mosafs.procutil import add_daemon_arguments

log = logging.getLogger(__name__)


def add_hash_backend_argument(parser: argparse.ArgumentParser) -> None:
    """--hash-backend, as `mosafs mount` and `mosafs up` (which passes it on) take it."""
    parser.add_argument("--hash-backend", choices=["auto", "cpu", "gpu"],
                        default=os.environ.get("MOSAFS_HASH_BACKEND", "auto"),
                        help="where chunking and hashing run: gpu (CuPy and a CUDA device; "
                             "an error without one), cpu, or auto (the GPU when there is one); "
                             "default: $MOSAFS_HASH_BACKEND, else auto")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mountpoint", help="an existing empty directory")
    parser.add_argument("--manager", default=os.environ.get("MOSAFS_MANAGER"),
                        help="HOST:PORT of the manager (default: $MOSAFS_MANAGER)")
    add_hash_backend_argument(parser)
    parser.add_argument("--window-mib", type=int, default=64,
                        help="sliding write window per open file, MiB (default: 64)")
    parser.add_argument("--cache-mib", type=int, default=256,
                        help="LRU chunk cache for reads, MiB (default: 256)")
    parser.add_argument("--write-semantics", choices=["optimistic", "pessimistic"],
                        help="close returns once every chunk has one copy (optimistic; the "
                             "manager replicates in the background) or R copies "
                             "(pessimistic); default: the pool's setting")
    parser.add_argument("--spill-dir", help="directory for temp files of non-sequential writes")
    parser.add_argument("--writeback-cache", action="store_true",
                        help="let the kernel gather small writes (much faster small writes); "
                             "only for a mount that is the sole writer of its files: other "
                             "mounts' changes to a file's size are then not seen here")
    parser.add_argument("--allow-other", action="store_true",
                        help="let users other than the mounting one use the mount")
    parser.add_argument("--manager-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="how long a file-system call waits for an unreachable manager "
                             "before it fails with ETIMEDOUT (default 30)")
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)
    add_daemon_arguments(parser, "client")


def _interrupted_replies(record: logging.LogRecord) -> bool:
    """libfuse answers a reply to a request the kernel no longer waits for (interrupted,
    or the connection is going away at unmount) with ENOENT, and pyfuse3 logs that as an
    ERROR. Nothing is lost (nobody waits for the answer): it is noted at DEBUG instead."""
    message = record.getMessage()
    if "fuse_reply_" in message and "No such file or directory" in message:
        log.debug("reply to an interrupted request dropped: %s", message)
        return False
    return True


def _return_big_buffers_to_the_os() -> None:
    """Serve every allocation of 1 MiB or more (write requests, batches, chunks) with its own
    mmap, returned to the kernel when freed. glibc's default raises that threshold as big
    blocks are freed and keeps them in per-thread arenas, and the client's resident memory
    then grows to several times its write window."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    libc = ctypes.CDLL(name)
    if hasattr(libc, "mallopt"):
        m_mmap_threshold, m_arena_max = -3, -8
        libc.mallopt(m_mmap_threshold, 4 << 20)
        libc.mallopt(m_arena_max, 2)


def run(args: argparse.Namespace) -> int:
    import trio

    from mosafs.client.files import ClientConfig
    from mosafs.procutil import start_daemon

    if not 0.5 <= args.manager_timeout <= 3600:
        raise ConfigError("--manager-timeout must be 0.5..3600 seconds")
    args.metrics_url = start_daemon(args, "client")
    logging.getLogger("pyfuse3").addFilter(_interrupted_replies)
    _return_big_buffers_to_the_os()
    if not args.manager:
        raise ConfigError("no manager address: pass --manager HOST:PORT or set MOSAFS_MANAGER")
    mountpoint = Path(args.mountpoint)
    if not mountpoint.is_dir():
        raise ConfigError(f"mount point {mountpoint} is not a directory")
    if args.window_mib < 4 or args.cache_mib < 16:
        raise ConfigError("--window-mib must be >= 4 and --cache-mib >= 16")
    from mosafs.chunking import resolve_backend

    resolve_backend(args.hash_backend)  # one line, not a traceback, when it cannot be had
    config = ClientConfig(
        manager=args.manager, hash_backend=args.hash_backend,
        window_bytes=args.window_mib << 20, cache_bytes=args.cache_mib << 20,
        spill_dir=Path(args.spill_dir) if args.spill_dir else None,
        write_semantics=args.write_semantics, manager_timeout=args.manager_timeout,
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
    from mosafs.procutil import write_ready_file

    options = set(pyfuse3.default_options)
    options |= {"fsname=mosafs", "subtype=mosafs"}
    if args.allow_other:
        options.add("allow_other")
    async with trio.open_nursery() as nursery:
        ctx = await ClientContext.create(config, nursery)  # type: ignore[arg-type]
        try:
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
        try:
            log.info("mounted %s (manager %s)", mountpoint, config.manager)  # type: ignore[attr-defined]
            write_ready_file(args.ready_file, address=str(mountpoint),
                             mountpoint=str(mountpoint), metrics=args.metrics_url)
            nursery.start_soon(_terminate_on_signal)
            await pyfuse3.main()
        finally:
            await fs.close()
            pyfuse3.close(unmount=True)
            log.info("unmounted %s", mountpoint)
            nursery.cancel_scope.cancel()


async def _terminate_on_signal() -> None:
    import pyfuse3
    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            pyfuse3.terminate()
            return
