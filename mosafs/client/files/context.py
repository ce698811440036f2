"""Everything the client's file layer shares: configuration, RPC clients, limiters, the
chunk cache and the root nursery in which background work runs."""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import trio

from mosafs.chunking import available_backends, make_chunker
from mosafs.client.files.chunkcache import ChunkFetcher
from mosafs.client.files.putgroups import PutGroups
from mosafs.client.files.remote import WorkerPool
from mosafs.client.rpc import Benefactors, ManagerClient, Rpc
from mosafs.rpc.channels import PROCESS_IDENTITY

log = logging.getLogger(__name__)
T = TypeVar("T")
MiB = 1 << 20
GPU_PINNED_BYTES = 256 * MiB  # the default bound of a process's pinned pool (GPU backend)


@dataclass(frozen=True)
class ClientConfig:
    manager: str
    hash_backend: str = "auto"
    window_bytes: int = 64 * MiB      # sliding write window per file (back-pressure bound)
    batch_bytes: int = 4 * MiB        # writes are handed to the chunker in pieces this big
    uploads_per_file: int = 8         # chunk puts in flight per file
    cache_bytes: int = 256 * MiB      # LRU chunk cache for reads
    # The most bytes fetched ahead of a sequential reader. Each handle's window starts
    # small and doubles while the reader waits for chunks (files/readahead.py), so this is
    # the ceiling a long fat link may need (a 10 Gbit/s link at 50 ms holds 62 MB), not
    # what every reader pulls; bounded by half the chunk cache, which keeps them.
    readahead_bytes: int = 64 * MiB
    rpc_threads: int = 32
    cpu_threads: int = 2              # chunking/hashing threads (the GIL is released there)
    # The GPU backend's pinned pool in this process (gpu_runtime.GpuRuntime): resident
    # memory, so part of the mount's (or each worker's) RSS budget.
    gpu_pinned_bytes: int = GPU_PINNED_BYTES
    spill_dir: Path | None = None     # temp files for non-sequential writes
    attr_timeout: float = 1.0
    # How long metadata stays cached (here and in the kernel) while the manager's change
    # lists keep the caches coherent (docs/client.md, "Coherent caches"); 0: never longer
    # than attr_timeout (no change lists asked for).
    coherent_timeout: float = 60.0
    dedupe_with_index: bool = True    # also ask the manager's chunk index before sending
    dedupe_with_base: bool = True     # skip chunks of the base version (off: benchmarks'
                                      # "content addressing off" baseline sends everything)
    write_semantics: str | None = None  # None: the pool's; "optimistic" | "pessimistic"
    manager_timeout: float = 30.0     # a call waits this long for an unreachable manager
    tls_dir: str = ""                 # where this mount's certificates are (user.mosafs.tls)


class ClientContext:
    """Create with `await ClientContext.create(config, nursery)`; call `close()` at exit."""

    def __init__(self, config: ClientConfig, nursery: trio.Nursery, *,
                 identity: Any = PROCESS_IDENTITY) -> None:
        self.config = config
        self.nursery = nursery
        self.client_id = uuid.uuid4().hex
        self.rpc = Rpc(config.rpc_threads)
        self.cpu_limiter = trio.CapacityLimiter(config.cpu_threads)
        # IDENTITY: the certificate of every channel (default: the process's; a library
        # client in an application's process brings its own).
        self.manager = ManagerClient(config.manager, self.rpc, timeout=config.manager_timeout,
                                     identity=identity, mount_id=self.client_id)
        self.benefactors = Benefactors(self.rpc, identity=identity)
        self.puts = PutGroups(self.benefactors)  # the write pipelines' chunk puts
        self.fetcher = ChunkFetcher(self.benefactors, config.cache_bytes, self.spawn,
                                    cpu=self.cpu, coder=self.coder)
        self._chunkers: dict[tuple[str, str], Any] = {}
        self._coder: Any = None
        self._noted: set[str] = set()
        self.workers: WorkerPool | None = None  # data-path worker processes, if any

    @classmethod
    async def create(cls, config: ClientConfig, nursery: trio.Nursery, *,
                     eager: bool = True, identity: Any = PROCESS_IDENTITY) -> ClientContext:
        """EAGER: make the default chunker now, so that a backend that cannot run fails
        the mount, not the first write. A mount whose data-path workers chunk for it
        leaves the backend to them (each sets it up and reports it at start,
        WorkerPool.start): a GPU backend here would hold a CUDA context and its pinned
        pool in the FUSE process for nothing."""
        ctx = cls(config, nursery, identity=identity)
        if eager:
            log.info("hash backend: %s", ctx.chunker(_default_spec()).backend)
        return ctx

    def warm_up(self) -> None:
        """Chunk one small buffer with the default chunker (call it in a thread as a
        process that chunks starts): its kernels get compiled or loaded (numba's cache, or
        NVRTC and the GPU context) before the first write, whose close would otherwise
        wait for them (0.2-1.6 s with numba's cache on the 2-CPU machine)."""
        started = time.monotonic()
        chunker = self.chunker(_default_spec())
        stream = chunker.stream()
        stream.feed(bytes(1 << 20))
        stream.finish()
        log.info("chunker ready (%s backend, %.2f s)", chunker.backend,
                 time.monotonic() - started)

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Start a background task in the root nursery. A bug in it is logged and stays
        there: an exception reaching the root nursery would unmount the file system."""
        self.nursery.start_soon(_guarded, fn, *args)

    def chunker(self, spec: str, preferred: str = "auto") -> Any:
        """The chunker of SPEC on this mount's backend. A mount started with `auto` follows
        the pool's PREFERRED backend where it can run here."""
        backend = self._backend(preferred)
        chunker = self._chunkers.get((spec, backend))
        if chunker is None:
            chunker = self._chunkers[(spec, backend)] = make_chunker(
                spec, backend, pinned_bytes=self.config.gpu_pinned_bytes)
        return chunker

    def _backend(self, preferred: str) -> str:
        if self.config.hash_backend != "auto" or preferred == "auto":
            return self.config.hash_backend  # the mount's own choice wins
        if preferred in available_backends():
            return preferred
        if preferred not in self._noted:  # a pool's preference, not a request: say it once
            self._noted.add(preferred)
            log.info("a pool prefers the %s hash backend, which cannot run here; this mount "
                     "uses auto", preferred)
        return "auto"

    def coder(self) -> Any:
        """The erasure coder (mosafs.erasure, docs/erasure_pools.md), made on first use:
        ISA-L on the CPU. It releases the GIL, and the pipeline and the fetcher call it
        in worker threads (cpu()), so the FUSE loop never waits on it. ConfigError (EINVAL
        at the write or read) where ISA-L cannot be loaded."""
        if self._coder is None:
            from mosafs.erasure.registry import make_coder

            self._coder = make_coder("isal")
            log.info("erasure coder: %s", getattr(self._coder, "library", "isal"))
        return self._coder

    async def cpu(self, fn: Callable[..., T], *args: Any) -> T:
        """Run chunking/hashing work in a thread, at most cpu_threads at a time."""
        return await trio.to_thread.run_sync(functools.partial(fn, *args),
                                             limiter=self.cpu_limiter)

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
        self.manager.close()
        self.benefactors.close()
        self.puts.close()


async def _guarded(fn: Callable[..., Awaitable[object]], *args: Any) -> None:
    try:
        await fn(*args)
    except Exception:
        log.exception("bug in background task %s", getattr(fn, "__qualname__", fn))


def _default_spec() -> str:
    from mosafs.chunking import DEFAULT_SPEC

    return DEFAULT_SPEC
