"""`mosafs bench metadata`: the manager's metadata throughput as applications see it through
a mount, against MooseFS' master on the same machine, in one run.

On a `mosafs up` cluster (3 benefactors, mutual TLS unless --insecure, chunker
fixed:4096 so that the commits below are of many small chunks; nothing else writes data),
for each client count N of --clients, N client processes (mosafs.bench.metadata_ops, one
process each, released together) run the phases in order, each timed per operation and
in aggregate (operations / first start -> last end):

- creates, all N clients in one shared directory, then each in its own directory:
  open(O_CREAT|O_EXCL|O_WRONLY) + close of --files new names per client;
- stat_cached: os.stat of the files each client just created in its own directory. The
  mount and the kernel keep attributes for the coherent timeout while the mount's caches
  are coherent (docs/client.md, "Coherent caches"; else for the attribute timeout, 1 s),
  so "cached" means the caches may answer;
- lookups_missing: os.stat of names that do not exist (ENOENT);
- stat_uncached: the same stats after `echo 2 > /proc/sys/vm/drop_caches` (the kernel's
  dentries and inodes; root only, "caches_dropped" says whether it worked) and a wait of
  the attribute timeout: the kernel asks the mount for each, which answers from its
  coherent cache where it holds the file (without coherent caches it asks the manager);
- commits: each client writes --commit-files new files of --commit-chunks 4 KiB chunks,
  one os.write each, and closes them: close() waits for the chunks' copies and commits the
  block-map to the manager; its latency is the figure.

Then one directory of --dir-entries entries, made by 8 clients (untimed in the verdicts,
its rate reported), listed by one client: `ls -l` (os.scandir and lstat of every entry)
with the caches dropped as above, then again warm; and os.listdir alone, cold and warm.

The peer (--peer, as `mosafs bench write`): a private MooseFS cluster
(mosafs.bench.moosefs) and the same create phases with 8 clients on its mount.

The floor (unless --no-floor): the null namespace (mosafs.bench.nullns, a pyfuse3 file
system that keeps its tree in a dict and answers at once, served as `mosafs mount` is) and
the create and stat phases with 8 clients on it: what pyfuse3, trio and the kernel's FUSE
module allow on this machine at this moment, before any file system's own work. Each
target on creates and stats reports it beside mosafs' figure ("floor_per_s", "of_floor").

The manager at scale (--scale-chunks, --scale-files; mosafs.bench.manager_scale): a
synthetic store of 10 million chunk records and 1 million files written straight into
LMDB (mosafs.bench.synthetic), a real manager on it with six stand-in benefactors: its
idle CPU, GetClusterStatus latency, and the time from a benefactor's death being declared
to the first copy request.

Per phase: the CPU seconds of every process of the cluster over it (/proc/PID/stat), the
manager's and the mount's summed, and the clients' own. The issue's targets are judged in
"targets" ("pass" None where this run cannot judge one); a missed target is a figure, not
a failure. Every process started is stopped, and every mount detached, on success, error
or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import select
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mosafs.bench import moosefs, procs, rpcstats
from mosafs.bench.metadata_figures import (
    LISTINGS,
    TARGET_CLIENTS,
    TARGET_ENTRIES,
    Roles,
    num,
    overall,
    summarize,
    targets,
)
from mosafs.bench.procs import BenchError
from mosafs.bench.timing import CpuMeter, drop_caches
from mosafs.bench.write import (
    _check_all_stopped,
    _Mosafs,
    _signals_interrupt,
    _uninterrupted,
    _work_dir,
    machine_info,
    progress,
)
from mosafs.errors import ConfigError
from mosafs.procutil import python_command

MAX_CLIENTS = 64
CHUNK_BYTES = 4096          # the cluster's chunker: fixed:4096
FILL_CLIENTS = 8            # clients making the large directory
ATTR_TIMEOUT_S = 1.0        # the mount's attribute and entry timeout (ClientConfig)
EXPIRE_WAIT_S = ATTR_TIMEOUT_S + 0.5
ANSWER_TIMEOUT = 4 * 3600.0  # one phase of one client; a hung mount ends the run
Pids = Callable[[], dict[str, int]]
MOSAFS_ROLES: Roles = {"manager": ("manager",), "mount": ("mount",)}  # mount + its workers
MOOSEFS_ROLES: Roles = {"master": ("mfsmaster",), "mount": ("mfsmount",)}
NULL_ROLES: Roles = {"mount": ("nullns",)}


@dataclass
class Options:
    clients: tuple[int, ...] = (1, 8, 16)
    files: int = 2000            # creates (and stats, lookups) per client and phase
    dir_entries: int = TARGET_ENTRIES
    commit_files: int = 200      # files each client writes and closes
    commit_chunks: int = 64      # chunks of CHUNK_BYTES per file
    peer: str = "auto"           # auto | moosefs | none
    tls: bool = True
    keep: Path | None = None
    scale_chunks: int = 10_000_000  # the synthetic manager (0: not run)
    scale_files: int = 1_000_000
    scale_idle_s: int = 30
    managers: int = 1            # `mosafs up --managers`: 2 puts a standby on every commit
    coherent_timeout: float | None = None  # the mount's --coherent-timeout (None: default)
    floor: bool = True           # the null namespace's create and stat phases

    def check(self) -> Options:
        """The options as they are, or ConfigError (exit code 2) naming the bad one."""
        if not self.clients or any(not 1 <= n <= MAX_CLIENTS for n in self.clients):
            raise ConfigError(f"clients must be 1..{MAX_CLIENTS} each, got "
                              f"{','.join(map(str, self.clients)) or 'none'}")
        for what, value, high in (("files", self.files, 1_000_000),
                                  ("dir-entries", self.dir_entries, 10_000_000),
                                  ("commit-files", self.commit_files, 100_000),
                                  ("commit-chunks", self.commit_chunks, 16384)):
            if not 1 <= value <= high:
                raise ConfigError(f"--{what} must be 1..{high}, got {value}")
        if self.scale_chunks and not 0 <= self.scale_files <= self.scale_chunks <= 100_000_000:
            raise ConfigError(f"--scale-files ({self.scale_files}) must be 0..--scale-chunks "
                              f"({self.scale_chunks}), at most 100000000")
        if not 1 <= self.scale_idle_s <= 3600:
            raise ConfigError(f"--scale-idle-s must be 1..3600, got {self.scale_idle_s}")
        if self.peer not in moosefs.PEERS:
            raise ConfigError(f"--peer must be one of {', '.join(moosefs.PEERS)}, "
                              f"got {self.peer!r}")
        return self


def split(total: int, parts: int) -> list[tuple[int, int]]:
    """TOTAL names in PARTS ranges (first index, count), sizes at most one apart; none
    empty."""
    base, extra = divmod(total, parts)
    out, first = [], 0
    for i in range(parts):
        count = base + (i < extra)
        if count:
            out.append((first, count))
        first += count
    return out


def client_commands(op: str, dirs: Sequence[Path], count: int, tag: str = "",
                    **extra: Any) -> list[dict[str, Any]]:
    """Client k's command: COUNT names in DIRS[k], prefixed TAG + "cKK-": no two clients
    use one name, even where DIRS name one directory for all."""
    return [{"op": op, "dir": str(d), "prefix": f"{tag}c{k:02d}-", "count": count, **extra}
            for k, d in enumerate(dirs)]


def own_dirs(base: Path, n: int) -> list[Path]:
    return [base / "own" / f"c{k:02d}" for k in range(n)]


# -- the client processes --------------------------------------------------------------------

class Clients:
    """N client processes (mosafs.bench.metadata_ops), each in a session of its own (a
    Ctrl-C reaches the benchmark alone, which stops them), stderr to a log file each."""

    def __init__(self, n: int, logs: Path, label: str) -> None:
        self.n, self.logs, self.label = n, logs, label
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Clients:
        try:
            for k in range(self.n):
                with open(self.logs / f"{self.label}.client{k}.log", "wb") as log_file:
                    child = subprocess.Popen(
                        python_command("mosafs.bench.metadata_ops"), stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=log_file, start_new_session=True)
                self.procs.append(child)
                procs.STARTED.append((f"{self.label}-client-{k}", child.pid))
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self.stop(graceful=kind is None)

    def run(self, commands: Sequence[dict[str, Any]], pids: Pids,
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """COMMANDS[k] to client k (the first len(COMMANDS) clients), prepared untimed,
        then released together; their answers and the CPU of PIDS meanwhile."""
        busy = self.procs[:len(commands)]
        for child, command in zip(busy, commands, strict=True):
            self._send(child, json.dumps(command))
        for child in busy:
            self._receive(child)  # {"ready": true}
        with CpuMeter(pids) as cpu:
            for child in busy:
                self._send(child, "go")
            answers = [self._receive(child) for child in busy]
        return answers, cpu.result

    def _send(self, child: subprocess.Popen[bytes], line: str) -> None:
        assert child.stdin is not None
        try:
            child.stdin.write(line.encode() + b"\n")
            child.stdin.flush()
        except BrokenPipeError:
            raise BenchError(f"client {child.pid} exited: {self._log(child)}") from None

    def _receive(self, child: subprocess.Popen[bytes]) -> dict[str, Any]:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], ANSWER_TIMEOUT)
        line = child.stdout.readline() if ready else b""
        if not line:
            raise BenchError(f"client {child.pid} gave no answer "
                             f"({'exited' if ready else 'timed out'}): {self._log(child)}")
        answer = dict(json.loads(line))
        if "error" in answer:
            raise BenchError(f"client {child.pid}: {answer['error']}")
        return answer

    def _log(self, child: subprocess.Popen[bytes]) -> str:
        k = self.procs.index(child)
        path = self.logs / f"{self.label}.client{k}.log"
        with contextlib.suppress(OSError):
            return path.read_text(errors="replace").strip()[-2000:] or f"log {path} empty"
        return f"no log {path}"

    def stop(self, *, graceful: bool = False) -> None:
        """End of input (each exits by itself), then SIGTERM/SIGKILL by pid to the rest.
        Not GRACEFUL (an error, a Ctrl-C): no wait, clients may be in the middle of a
        phase."""
        with _uninterrupted():
            for child in self.procs:
                with contextlib.suppress(OSError):
                    assert child.stdin is not None
                    child.stdin.close()
            deadline = time.monotonic() + (5 if graceful else 0)
            for child in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=max(0.0, deadline - time.monotonic()))
            procs.kill_pids([c.pid for c in self.procs if c.poll() is None])
            for child in self.procs:
                child.wait()
                if child.stdout is not None:
                    child.stdout.close()
            self.procs = []


# -- the phases ------------------------------------------------------------------------------

def expire_caches() -> dict[str, Any]:
    """Drop the kernel's dentries, then wait out the attribute timeout: the mount's own
    caches keep entries as long as the kernel is told to."""
    dropped = drop_caches(pages=False)  # the kernel's dentries and inodes
    time.sleep(EXPIRE_WAIT_S)
    return {"caches_dropped": dropped, "waited_s": EXPIRE_WAIT_S}


def _phase(clients: Clients, name: str, label: str, commands: Sequence[dict[str, Any]],
           pids: Pids, roles: Roles) -> dict[str, Any]:
    answers, cpu = clients.run(commands, pids)
    out = summarize(answers, cpu, roles)
    lat = out["latency_ms"]
    progress(f"{label} {name}: {num(out['ops_per_s'])}/s "
             f"(p50 {num(lat['p50'], 3)} ms, p99 {num(lat['p99'], 3)} ms)")
    return out


def creates(clients: Clients, base: Path, files: int, pids: Pids,
            roles: Roles, label: str) -> dict[str, Any]:
    """Both create phases: every client in BASE/shared, then each in BASE/own/cKK."""
    shared, own = base / "shared", own_dirs(base, clients.n)
    for d in (shared, *own):  # untimed
        d.mkdir(parents=True)
    return {
        "creates_shared_dir": _phase(clients, "creates, shared directory", label,
                                     client_commands("create", [shared] * clients.n, files),
                                     pids, roles),
        "creates_own_dirs": _phase(clients, "creates, own directories", label,
                                   client_commands("create", own, files), pids, roles),
    }


def _count_run(m: _Mosafs, n: int, options: Options, logs: Path) -> dict[str, Any]:
    """Every phase with N clients, in MNT/nN."""
    base, label = m.mnt / f"n{n}", f"mosafs {n} clients"
    own = own_dirs(base, n)
    commit_dirs = [base / "commits" / f"c{k:02d}" for k in range(n)]
    with Clients(n, logs, f"n{n}") as clients:
        run: dict[str, Any] = {"clients": n, **creates(clients, base, options.files, m.pids,
                                                        MOSAFS_ROLES, label)}

        def phase(name: str, commands: list[dict[str, Any]]) -> dict[str, Any]:
            return _phase(clients, name, label, commands, m.pids, MOSAFS_ROLES)

        run["stat_cached"] = phase("stat_cached", client_commands("stat", own, options.files))
        run["lookups_missing"] = phase("lookups_missing", client_commands(
            "missing", own, options.files, tag="missing-"))
        expired = expire_caches()
        run["stat_uncached"] = {**phase("stat_uncached", client_commands(
            "stat", own, options.files)), **expired}
        for d in commit_dirs:
            d.mkdir(parents=True)
        url = (m.cluster.ready.get("metrics") or {}).get("manager")
        flush = "mosafs_manager_commit_flush_seconds"
        before = rpcstats.buckets(url, "CommitVersion") if url else {}
        flushed = rpcstats.buckets(url, None, flush) if url else {}
        run["commits"] = phase("commits (close latency)", client_commands(
            "commit", commit_dirs, options.commit_files, chunks=options.commit_chunks,
            chunk_bytes=CHUNK_BYTES))
        if url:  # the commit RPC, and of it the LMDB commits (their disk flushes)
            run["commits"]["commit_rpc"] = rpcstats.quantiles(
                before, rpcstats.buckets(url, "CommitVersion"))
            run["commits"]["commit_flush"] = rpcstats.quantiles(
                flushed, rpcstats.buckets(url, None, flush))
    return run


def _large_dir(m: _Mosafs, entries: int, logs: Path) -> dict[str, Any]:
    """MNT/large with ENTRIES empty files (by FILL_CLIENTS clients), then listed by one."""
    folder = m.mnt / "large"
    folder.mkdir()
    parts = split(entries, FILL_CLIENTS)
    progress(f"large directory: making {entries} entries with {len(parts)} clients")
    commands = [{"op": "create", "dir": str(folder), "prefix": "e", "first": first,
                 "count": count} for first, count in parts]
    with Clients(len(parts), logs, "large") as clients:
        out: dict[str, Any] = {"entries": entries, "fill": _phase(
            clients, "large directory made", "mosafs", commands, m.pids, MOSAFS_ROLES)}
        for name in LISTINGS:
            op = "ls" if name.startswith("ls_l") else "listdir"
            expired = expire_caches() if name.endswith("cold") else {}
            answers, cpu = clients.run([{"op": op, "dir": str(folder)}], m.pids)
            got = summarize(answers, cpu, MOSAFS_ROLES)
            if got["ops"] != entries:
                raise BenchError(f"{op} of {folder} gave {got['ops']} entries, not {entries}")
            out[name] = {**got, **expired}
            progress(f"mosafs {LISTINGS[name]}: {got['seconds']:.3f}s for {entries} entries")
    return out


def _mosafs(workdir: Path, options: Options, logs: Path) -> dict[str, Any]:
    up_args = ["--chunker", f"fixed:{CHUNK_BYTES}"]
    if options.managers > 1:
        up_args += ["--managers", str(options.managers)]
    if options.coherent_timeout is not None:
        up_args += ["--coherent-timeout", f"{options.coherent_timeout:g}"]
    m = _Mosafs(workdir, up_args, tls=options.tls)
    try:
        m.start()
        out: dict[str, Any] = {"cluster": {"up_args": up_args, "tls": options.tls,
                                           "pids": m.pids()}}
        out["runs"] = [_count_run(m, n, options, logs) for n in options.clients]
        out["large_dir"] = _large_dir(m, options.dir_entries, logs)
        return out
    finally:
        m.stop()


def _peer(workdir: Path, options: Options, skipped: str | None, logs: Path) -> dict[str, Any]:
    """The create phases with TARGET_CLIENTS clients on a private MooseFS cluster, where it
    runs (--peer moosefs where it cannot was refused before the run)."""
    if skipped is None:
        skipped = moosefs.space_reason(workdir, 0)  # empty files: no chunk is stored
        if skipped and options.peer == "moosefs":
            raise BenchError(skipped)
    if skipped:
        progress(f"MooseFS peer skipped: {skipped}")
        return {"skipped": skipped}
    fs = moosefs.MooseFs(workdir / "moosefs")
    try:
        started = time.perf_counter()
        fs.start()
        progress(f"MooseFS: ready in {time.perf_counter() - started:.1f}s")
        out: dict[str, Any] = {"config": fs.describe(), "clients": TARGET_CLIENTS}
        with Clients(TARGET_CLIENTS, logs, "moosefs") as clients:
            out.update(creates(clients, fs.mnt / f"n{TARGET_CLIENTS}", options.files,
                               fs.pids, MOOSEFS_ROLES, "MooseFS"))
        return out
    finally:
        with _uninterrupted():
            fs.stop()


def _floor(workdir: Path, options: Options, logs: Path) -> dict[str, Any]:
    """The create and stat phases with TARGET_CLIENTS clients on the null namespace."""
    if not options.floor:
        return {"skipped": "not asked for (--no-floor)"}
    fs = procs.NullFs(workdir, "nullns")
    try:
        fs.start()

        def pids() -> dict[str, int]:
            return {"nullns": fs.pid}

        label, base = "null namespace", fs.mountpoint / f"n{TARGET_CLIENTS}"
        out: dict[str, Any] = {"clients": TARGET_CLIENTS}
        with Clients(TARGET_CLIENTS, logs, "nullns") as clients:
            out.update(creates(clients, base, options.files, pids, NULL_ROLES, label))
            own = own_dirs(base, TARGET_CLIENTS)
            out["stat_cached"] = _phase(clients, "stat_cached", label, client_commands(
                "stat", own, options.files), pids, NULL_ROLES)
            expired = expire_caches()
            out["stat_uncached"] = {**_phase(clients, "stat_uncached", label, client_commands(
                "stat", own, options.files), pids, NULL_ROLES), **expired}
        return out
    finally:
        with _uninterrupted():
            fs.stop()


# -- the run ---------------------------------------------------------------------------------

def run_metadata(options: Options, command: str = "mosafs bench metadata") -> dict[str, Any]:
    """The whole benchmark; the result as one JSON-able dict. Cleans up whatever happens."""
    options.check()
    skipped = moosefs.choose_peer(options.peer)  # `moosefs` that cannot run: error now
    started = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "mosafs bench metadata",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command, "machine": machine_info(),
        "params": {"clients": list(options.clients), "files": options.files,
                   "dir_entries": options.dir_entries, "commit_files": options.commit_files,
                   "commit_chunks": options.commit_chunks, "chunk_bytes": CHUNK_BYTES,
                   "fill_clients": FILL_CLIENTS, "peer": options.peer, "tls": options.tls,
                   "floor": options.floor,
                   "benefactors": 3, "attr_timeout_s": ATTR_TIMEOUT_S,
                   "units": "ops_per_s: operations per second, aggregate (first start -> "
                            "last end); latencies in ms; seconds"},
    }
    with _signals_interrupt(), _work_dir(options.keep, "mosafs-bench-metadata-") as workdir:
        progress(f"work directory {workdir}")
        logs = workdir / "clients"
        logs.mkdir()
        result.update(_mosafs(workdir / "mosafs", options, logs))
        result["floor"] = _floor(workdir / "floor", options, logs)
        result["moosefs"] = _peer(workdir, options, skipped, logs)
        result["scale"] = _scale(workdir, options)
        result["targets"] = targets(result)
        result["targets_pass"] = overall(result["targets"])
        result["notes"] = _notes(result)
        result["processes"] = _check_all_stopped()
        result["elapsed_s"] = round(time.perf_counter() - started, 1)
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if options.keep is not None:
            (workdir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _scale(workdir: Path, options: Options) -> dict[str, Any]:
    """The manager on a synthetic store (mosafs.bench.manager_scale), or why not."""
    if not options.scale_chunks:
        return {"skipped": "not asked for (--scale-chunks 0)"}
    from mosafs.bench.manager_scale import run_scale

    progress(f"the manager at scale: {options.scale_chunks} chunk records, "
             f"{options.scale_files} files")
    return run_scale(chunks=options.scale_chunks, files=max(1, options.scale_files),
                     keep=workdir / "scale", idle_s=options.scale_idle_s)


def _notes(result: dict[str, Any]) -> list[str]:
    notes = ["stat_cached: the mount and the kernel keep attributes for the coherent "
             f"timeout while the mount's caches are coherent, else for {ATTR_TIMEOUT_S:g} s",
             "stat_uncached: the kernel's caches dropped; the mount's coherent cache may "
             "answer", "commits: close() of a file of commit_chunks chunks "
             "written in one os.write; it waits for every chunk's copies (pessimistic "
             "writes, R=2) and the commit of the block-map"]
    if not all(r["stat_uncached"]["caches_dropped"] for r in result["runs"]):
        notes.append("the kernel's dentries and inodes could not be dropped (not root): "
                     "uncached figures rely on the attribute timeout alone")
    return notes

