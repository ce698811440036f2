"""The client side of `mosafs.checkpoint` in a training process: the cluster a path is
in, found as the admin commands find it (mosafs.admin.common.resolve: the mount's
manager and certificates, $MOSAFS_MANAGER, $MOSAFS_TLS_DIR), and one client per cluster
running in a thread of its own (docs/checkpoint.md, "Threads").

The client is the mount's own file layer (mosafs.client.files: WriteSession, the chunk
fetcher, grouped puts) without FUSE: saves and loads are trio tasks in that thread, and
the caller's thread waits on a concurrent.futures.Future (a non-blocking save returns
it inside its handle). Calls act as the calling process's uid and groups, as a write
through the mount would.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import trio

from mosafs import errors
from mosafs.client import acting
from mosafs.client.files.context import ClientConfig, ClientContext

T = TypeVar("T")
MiB = 1 << 20
UPLOADS_PER_FILE = 16  # put groups in flight per save (each with a pinned staging buffer)


@dataclass(frozen=True)
class Target:
    """A file path inside a mount: its cluster (manager, identity) and folder inode."""

    path: Path
    manager: str
    identity: Any
    parent: int
    name: str


def target(path: str | os.PathLike[str]) -> Target:
    """Where PATH is. Its folder must exist inside a mosafs mount (ConfigError if not)."""
    from mosafs.admin.common import resolve

    full = Path(os.path.abspath(os.fspath(path)))
    if not full.name or full.name in (".", ".."):
        raise errors.InvalidArgument(f"{path}: not a file name")
    args = argparse.Namespace(manager=None, insecure=None, tls_dir=None, tls_name=None)
    folder = resolve(str(full.parent), args)
    if not folder.is_dir:
        raise errors.NotADirectory(f"{full.parent} is not a folder")
    return Target(full, folder.manager.address, folder.manager.identity, folder.inode,
                  full.name)


class Client:
    """One cluster's client: a trio loop in a daemon thread holding a ClientContext."""

    def __init__(self, manager: str, identity: Any) -> None:
        self.manager = manager
        self.identity = identity
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop = trio.Event()
        self._ids = (os.geteuid(), tuple(dict.fromkeys((os.getegid(), *os.getgroups()))))
        self._thread = threading.Thread(target=self._main, name="mosafs-checkpoint",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failed is not None:
            raise self._failed

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # reported to the constructor's caller
            self._failed = exc
            self._ready.set()

    async def _serve(self) -> None:
        config = ClientConfig(manager=self.manager, hash_backend="cpu",
                              cpu_threads=max(2, min(8, os.cpu_count() or 2)),
                              window_bytes=256 * MiB, uploads_per_file=UPLOADS_PER_FILE)
        async with trio.open_nursery() as nursery:
            # The identity goes to this client's channels only: the application's process
            # keeps its own (mosafs.rpc.security's process-wide one is not touched).
            ctx = await ClientContext.create(config, nursery, eager=False,
                                             identity=self.identity)
            self.ctx = ctx
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                ctx.close()
                nursery.cancel_scope.cancel()

    def submit(self, fn: Callable[..., Awaitable[T]], *args: Any
               ) -> concurrent.futures.Future[T]:
        """Run `fn(ctx, *args)` in the client's loop; its outcome in the future."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()

        async def run() -> None:
            acting.ACTING.set(self._ids)
            try:
                future.set_result(await fn(self.ctx, *args))
            except BaseException as exc:  # handed to the waiting caller
                future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise

        assert self._nursery is not None
        trio.from_thread.run_sync(self._nursery.start_soon, run, trio_token=self._token)
        return future

    def close(self) -> None:
        if self._token is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()


_clients: dict[tuple[str, Any], Client] = {}  # (manager, identity) -> client
_lock = threading.Lock()


def client(where: Target) -> Client:
    """The client of WHERE's cluster and certificate (made on first use, kept for the
    process's life)."""
    key = (where.manager, where.identity)
    with _lock:
        found = _clients.get(key)
        if found is None:
            found = _clients[key] = Client(where.manager, where.identity)
        return found


def close_all() -> None:
    """Stop every client (tests; a process's exit stops them anyway: daemon threads)."""
    with _lock:
        found = list(_clients.values())
        _clients.clear()
    for c in found:
        c.close()
