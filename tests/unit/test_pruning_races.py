"""Versions' lifecycle at its edges (docs/lifecycle.md): pruning leaves alone every file a
write was opened on before its folder's transaction began (open_write and pruning's
transactions take the store's writer lock in turn), and a file of no folder (its folder
name went while another link stayed) to the defaults; `.versions` names past u64 are no
version; series patterns whose matching could take seconds are refused when set. Real Manager and
LMDB store."""

from __future__ import annotations

import threading
import time
import types

import pytest
import trio

from mosafs import errors
from mosafs._proto import manager_pb2 as mpb
from mosafs.client.files.versions import Node, VersionView, parse_version
from mosafs.client.rpc import ManagerClient
from mosafs.errors import ConfigError, NotFound
from mosafs.manager.core import Manager
from mosafs.manager.fsck import fsck
from mosafs.manager.metadata import ROOT_INODE
from mosafs.manager.pruning import Policy
from mosafs.manager.series import MAX_KEYS, check_pattern, compile_pattern
from tests.unit.managers import cid, commit, consistent, new_file, register


def test_a_write_opened_while_a_folder_is_pruned_waits_or_finds_no_file(
        mgr: Manager) -> None:
    register(mgr, "b1")
    store = mgr.store
    d = store.mkdir(ROOT_INODE, "ckpt", 0o755).inode
    files = []
    for step in (1, 2, 3):
        f = new_file(store, f"app.n0.{step}", d)
        commit(mgr, f, [(cid(step), 10)])
        files.append(f)
    mgr.folders.set(d, policy=Policy(keep_last=1))
    real = mgr.leases.inodes
    outcome: dict[str, object] = {}

    def open_oldest() -> None:
        try:
            outcome["lease"] = mgr.open_write(files[0], "client")
        except NotFound as exc:
            outcome["error"] = exc

    writer = threading.Thread(target=open_oldest)

    def inodes() -> frozenset[int]:
        busy = real()
        if not writer.is_alive() and "started" not in outcome:
            # A client opens app.n0.1 for a rewrite while its folder is being pruned.
            outcome["started"] = True
            writer.start()
            time.sleep(0.3)
            outcome["waited"] = writer.is_alive()  # for the folder's transaction to end
        return busy

    mgr.leases.inodes = inodes  # type: ignore[method-assign]
    try:
        mgr.prune()
    finally:
        mgr.leases.inodes = real  # type: ignore[method-assign]
    writer.join(10)
    assert outcome["waited"] is True
    assert isinstance(outcome.get("error"), NotFound), outcome  # pruned first: told so
    assert consistent(store) and fsck(store).findings == []


def test_prune_leaves_a_file_of_no_folder_to_the_defaults(mgr: Manager) -> None:
    register(mgr, "b1")
    store = mgr.store
    d = store.mkdir(ROOT_INODE, "pruned", 0o755).inode
    f = new_file(store, "model.pt")  # made in the root (keep-all)
    for n in (1, 2, 3):
        commit(mgr, f, [(cid(n), 10)])
    store.link(f, d, "model.pt")
    store.unlink(ROOT_INODE, "model.pt")  # the name it was made under went: no folder
    mgr.set_folder(d, pool=None, series_pattern=None, policy=Policy(keep_last=1),
                   clear_policy=False)
    assert mgr.folders.write_context(f).folder == 0
    assert [v.version for v in store.list_versions(f)] == [1, 2, 3]


def test_a_version_name_past_u64_is_no_version() -> None:
    for name in (str(2**64), "9" * 21, "0", "01", "x"):
        with pytest.raises(NotFound):
            parse_version(name)
    assert parse_version(str(2**64 - 1)) == 2**64 - 1

    async def call(method: str, request: object) -> object:  # no such version
        raise errors.NotFound(f"{method}: no version")

    async def getattr_(inode: int) -> mpb.Attr:
        return mpb.Attr(inode=inode, kind=mpb.FILE_KIND_REGULAR, mode=0o644, version=1)

    client = types.SimpleNamespace(_call=call, getattr=getattr_)
    client.version_stats = types.MethodType(ManagerClient.version_stats, client)
    view = VersionView(client)  # type: ignore[arg-type]
    parent = view.nodes.number(Node("file-versions", ROOT_INODE, 5, "f"))

    async def main() -> None:
        with pytest.raises(errors.NotFound):
            await view.lookup(parent, str(2**64))

    trio.run(main)


def test_series_patterns_that_would_match_slowly_are_refused() -> None:
    with pytest.raises(ConfigError, match="literal between placeholders"):
        check_pattern("{a}{b}.{step}")
    keys = ".".join(f"{{k{i}}}" for i in range(MAX_KEYS + 1))
    with pytest.raises(ConfigError, match="placeholders besides"):
        check_pattern(keys + ".{step}")
    # One stored before the limits is used as it is: its folder's writes go on.
    assert compile_pattern("{a}{b}.{step}").match("xy.3") is not None
    assert compile_pattern("{app}{step}").match("ckpt12") is not None  # step bounds it
    widest = compile_pattern(".".join(f"{{k{i}}}" for i in range(MAX_KEYS)) + ".{step}")
    started = time.perf_counter()
    assert widest.match("." * 254 + "x") is None
    assert time.perf_counter() - started < 2.0  # 40 ms here; four keys took 2.4 s
