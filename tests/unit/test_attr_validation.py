"""Validation of every attribute input of the metadata store (issue 18, docs/metadata.md
"Attribute values"), on a real LMDB store: uid/gid 2^32-1 means "unchanged" in SetAttr and
owns nothing, modes are permission bits only, times stay where the kernel and os.stat can
represent them, versions stay within the largest file, and no SetAttr makes the root
directory unusable. Stores written before the checks are repaired by fsck."""

from __future__ import annotations

import itertools
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mosafs import capability
from mosafs._proto import manager_pb2, metadata_pb2
from mosafs.client.files.writer import MAX_FILE_SIZE as CLIENT_MAX_FILE_SIZE
from mosafs.client.operations import _clamp_time
from mosafs.errors import InvalidArgument, NotFound, NotSupported, ResourceExhausted
from mosafs.manager import metadata
from mosafs.manager.core import Manager
from mosafs.manager.fsck import NOBODY, fsck
from mosafs.manager.metadata import (
    MAX_FILE_SIZE,
    MAX_OWNER_ID,
    MAX_RDEV,
    MAX_TIME_NS,
    MIN_TIME_NS,
    ROOT_INODE,
    UNCHANGED_ID,
    MetadataStore,
)
from tests.unit.managers import BLK, DIR, FIFO, LNK, REG, MiB, cid, commit, register

U32 = (1 << 32) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

# Random and extreme values of the request fields that reach the store.
EXTREME_U = st.sampled_from([0, 1, 0o777, 0o7777, 0o10000, stat.S_IFDIR | 0o755,
                             stat.S_IFREG | 0o644, stat.S_IFLNK | 0o777, 65534, 65535,
                             (1 << 31) - 1, 1 << 31, U32 - 1, U32])
UINT32 = st.one_of(EXTREME_U, st.integers(0, U32))
INT64 = st.one_of(st.sampled_from([0, 1, -1, I64_MIN, I64_MIN + 1, I64_MAX, MIN_TIME_NS,
                                   MIN_TIME_NS - 1, MAX_TIME_NS, MAX_TIME_NS + 1]),
                  st.integers(I64_MIN, I64_MAX))
OPTIONAL_U32 = st.none() | UINT32
OPTIONAL_I64 = st.none() | INT64
_names = itertools.count()


def _attrs(attr: manager_pb2.Attr) -> tuple[Any, ...]:
    return (attr.kind, attr.mode, attr.uid, attr.gid, attr.atime_ns, attr.mtime_ns,
            attr.ctime_ns, attr.size, attr.rdev)


def assert_representable(attr: manager_pb2.Attr) -> None:
    """What a getattr hands back is what stat, chmod and chown can work with."""
    assert 0 <= attr.mode <= 0o7777
    assert 0 <= attr.uid <= MAX_OWNER_ID and 0 <= attr.gid <= MAX_OWNER_ID
    for t in (attr.atime_ns, attr.mtime_ns, attr.ctime_ns):
        assert MIN_TIME_NS <= t <= MAX_TIME_NS
        sec, nsec = divmod(t, 10**9)
        assert sec * 10**9 > I64_MIN and sec * 10**9 + nsec == t  # joins without overflow
    assert attr.size <= MAX_FILE_SIZE
    if attr.kind == LNK:
        assert attr.mode == 0o777
    if attr.inode == ROOT_INODE:
        assert attr.kind == DIR and attr.mode & 0o700 == 0o700


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetadataStore]:
    """One store for the property tests (hypothesis runs many examples in one test)."""
    path = tmp_path_factory.mktemp("attrs") / "metadata.lmdb"
    with MetadataStore(path, map_size=256 * MiB) as s:
        yield s


# --- the ranges themselves ----------------------------------------------------------------

def test_ranges_are_those_of_the_kernel_and_the_client() -> None:
    assert (UNCHANGED_ID, MAX_OWNER_ID) == (U32, U32 - 1)
    assert MAX_OWNER_ID == capability.MAX_ID  # what a capability may name
    assert MAX_FILE_SIZE == CLIENT_MAX_FILE_SIZE == 4 << 40
    assert os.makedev(4095, (1 << 20) - 1) == MAX_RDEV  # the largest number FUSE carries
    # Linux's KTIME_SEC_MAX whole seconds either way; INT64_MIN is outside.
    assert MAX_TIME_NS == 9_223_372_036 * 10**9 and MIN_TIME_NS == -MAX_TIME_NS
    assert I64_MIN < MIN_TIME_NS and MAX_TIME_NS <= I64_MAX
    # The mount clamps what the kernel passes (touch -d 1000-01-01) into the same range.
    assert (_clamp_time(-30610224000 * 10**9), _clamp_time(I64_MAX), _clamp_time(5)) == (
        MIN_TIME_NS, MAX_TIME_NS, 5)
    import datetime
    utc = datetime.UTC
    assert str(datetime.datetime.fromtimestamp(MAX_TIME_NS // 10**9, utc)) == \
        "2262-04-11 23:47:16+00:00"
    assert str(datetime.datetime.fromtimestamp(MIN_TIME_NS // 10**9, utc)) == \
        "1677-09-21 00:12:44+00:00"


# --- owners -------------------------------------------------------------------------------

def test_setattr_owner_all_ones_means_unchanged(store: MetadataStore) -> None:
    f = store.create(ROOT_INODE, "f", 0o644, uid=10, gid=20)
    out = store.setattr(f.inode, uid=UNCHANGED_ID, gid=UNCHANGED_ID)
    assert (out.uid, out.gid) == (10, 20) and out.ctime_ns >= f.ctime_ns  # as chown(-1, -1)
    out = store.setattr(f.inode, uid=UNCHANGED_ID, gid=7)
    assert (out.uid, out.gid) == (10, 7)
    out = store.setattr(f.inode, uid=8, gid=UNCHANGED_ID)
    assert (out.uid, out.gid) == (8, 7)
    out = store.setattr(f.inode, uid=MAX_OWNER_ID, gid=0)
    assert (out.uid, out.gid) == (MAX_OWNER_ID, 0)
    for bad in ({"uid": -1}, {"gid": -1}, {"uid": U32 + 1}, {"gid": 1 << 63}):
        with pytest.raises(InvalidArgument):
            store.setattr(f.inode, **bad)
    assert store.getattr(f.inode) == out  # a refusal changes nothing


@pytest.mark.parametrize("uid, gid", [(UNCHANGED_ID, 0), (0, UNCHANGED_ID), (-1, 0),
                                      (0, U32 + 1)])
def test_creates_refuse_owners_outside_the_range(store: MetadataStore, uid: int,
                                                 gid: int) -> None:
    calls = {
        "create": lambda: store.create(ROOT_INODE, "f", 0o644, uid, gid),
        "mkdir": lambda: store.mkdir(ROOT_INODE, "d", 0o755, uid, gid),
        "symlink": lambda: store.symlink(ROOT_INODE, "l", b"target", uid, gid),
        "mknod": lambda: store.mknod(ROOT_INODE, "p", FIFO, 0o644, uid, gid),  # type: ignore[arg-type]
    }
    for what, make in calls.items():
        with pytest.raises(InvalidArgument, match=r"uid|gid"):
            make()
        assert store.readdir(ROOT_INODE) == ([], False), what
    assert store.create(ROOT_INODE, "ok", 0o644, MAX_OWNER_ID, MAX_OWNER_ID).uid == MAX_OWNER_ID


# --- modes --------------------------------------------------------------------------------

def test_setattr_mode_is_permission_bits_and_never_the_kind(store: MetadataStore) -> None:
    f = store.create(ROOT_INODE, "f", 0o644)
    d = store.mkdir(ROOT_INODE, "d", 0o755)
    for perm in (0, 0o7777, 0o4755, 0o2750, 0o1777):
        assert store.setattr(f.inode, mode=perm).mode == perm
    # The inode's own type bits are tolerated (as in Create); the kind stays.
    assert store.setattr(f.inode, mode=stat.S_IFREG | 0o600).mode == 0o600
    assert store.setattr(d.inode, mode=stat.S_IFDIR | 0o700).kind == DIR
    before = store.getattr(f.inode)
    for bad in (stat.S_IFDIR | 0o600, stat.S_IFLNK | 0o777, 0o10000, 0o170000, U32, -1,
                1 << 32):
        with pytest.raises(InvalidArgument, match="permission bits"):
            store.setattr(f.inode, mode=bad)
    assert store.getattr(f.inode) == before
    assert (store.getattr(f.inode).kind, store.getattr(d.inode).kind) == (REG, DIR)


def test_symlinks_keep_mode_0777(store: MetadataStore) -> None:
    link = store.symlink(ROOT_INODE, "l", b"target")
    assert store.setattr(link.inode, mode=0o777).mode == 0o777
    assert store.setattr(link.inode, mode=stat.S_IFLNK | 0o777).mode == 0o777
    with pytest.raises(NotSupported, match="symbolic link"):
        store.setattr(link.inode, mode=0o600)
    assert store.setattr(link.inode, uid=5, atime_ns=1).uid == 5  # owner and times: yes
    assert store.getattr(link.inode).mode == 0o777


def test_device_numbers_are_those_fuse_carries(store: MetadataStore) -> None:
    assert store.mknod(ROOT_INODE, "b", BLK, 0o600, rdev=MAX_RDEV).rdev == MAX_RDEV  # type: ignore[arg-type]
    for rdev in (MAX_RDEV + 1, os.makedev(4096, 0), (1 << 64) - 1):
        with pytest.raises(InvalidArgument):
            store.mknod(ROOT_INODE, "c", BLK, 0o600, rdev=rdev)  # type: ignore[arg-type]


# --- times --------------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["atime_ns", "mtime_ns", "ctime_ns"])
def test_setattr_times_within_the_representable_range(store: MetadataStore,
                                                      field: str) -> None:
    f = store.create(ROOT_INODE, "f", 0o644)
    for t in (MIN_TIME_NS, MAX_TIME_NS, -1, 0, 1):
        out = store.setattr(f.inode, **{field: t})
        assert getattr(out, field) == t
        assert_representable(out)
    before = store.getattr(f.inode)
    for t in (MIN_TIME_NS - 1, MAX_TIME_NS + 1, I64_MIN, I64_MAX, 1 << 64):
        with pytest.raises(InvalidArgument, match=field):
            store.setattr(f.inode, mode=0o600, **{field: t})  # nothing of it is applied
    assert store.getattr(f.inode) == before


def test_ctime_is_the_managers_clock_unless_given(store: MetadataStore) -> None:
    f = store.create(ROOT_INODE, "f", 0o644)
    out = store.setattr(f.inode, mtime_ns=5, atime_ns=6)
    assert (out.mtime_ns, out.atime_ns) == (5, 6) and out.ctime_ns >= f.ctime_ns
    assert store.setattr(f.inode, ctime_ns=MIN_TIME_NS).ctime_ns == MIN_TIME_NS
    assert store.setattr(f.inode, uid=1).ctime_ns > MIN_TIME_NS  # the clock again


def test_commit_mtime_and_size_are_bounded(mgr: Manager) -> None:
    register(mgr, "b1")
    ino = mgr.store.create(ROOT_INODE, "f", 0o644).inode
    for mtime in (MIN_TIME_NS - 1, MAX_TIME_NS + 1, I64_MIN):
        lease = mgr.open_write(ino, "test")
        with pytest.raises(InvalidArgument, match="mtime_ns"):
            mgr.commit_version(lease.lease_id, ino, [(cid(1), 10)], [(cid(1), ["b1"])],
                               mtime_ns=mtime)
    lease = mgr.open_write(ino, "test")
    _, attr = mgr.commit_version(lease.lease_id, ino, [(cid(1), 10)], [(cid(1), ["b1"])],
                                 mtime_ns=MIN_TIME_NS)
    assert attr.mtime_ns == MIN_TIME_NS and attr.version == 1
    # One chunk of 64 MiB named 65537 times: 4 TiB + 64 MiB, over the largest file.
    big = metadata.MAX_CHUNK_BYTES
    lease = mgr.open_write(ino, "test")
    with pytest.raises(ResourceExhausted, match="4 TiB"):
        mgr.commit_version(lease.lease_id, ino, [(cid(2), big)] * (MAX_FILE_SIZE // big + 1),
                           [(cid(2), ["b1"])])
    assert mgr.store.getattr(ino).version == 1 and mgr.store.chunk(cid(2)) is None
    # Exactly the largest file is accepted.
    version = commit(mgr, ino, [(cid(2), big)] * (MAX_FILE_SIZE // big))
    assert mgr.store.getattr(ino).size == MAX_FILE_SIZE and version == 2


# --- the root directory -------------------------------------------------------------------

def test_root_directory_keeps_its_owner_rwx(store: MetadataStore) -> None:
    for bad in (0, 0o000, 0o077, 0o600, 0o500, 0o7077, stat.S_IFDIR):
        with pytest.raises(InvalidArgument, match="root directory"):
            store.setattr(ROOT_INODE, mode=bad)
    for good in (0o700, 0o755, 0o1777, 0o7777, stat.S_IFDIR | 0o750):
        assert store.setattr(ROOT_INODE, mode=good).mode == good & 0o7777
    # Its owner may change (a mount shared with --allow-other), never to 2^32-1.
    root = store.setattr(ROOT_INODE, uid=1000, gid=1000)
    assert (root.uid, root.gid, root.kind) == (1000, 1000, DIR)
    root = store.setattr(ROOT_INODE, uid=UNCHANGED_ID, gid=UNCHANGED_ID, mode=0o700,
                         mtime_ns=MIN_TIME_NS)
    assert (root.uid, root.gid, root.mode) == (1000, 1000, 0o700)
    assert_representable(root)
    assert store.readdir(ROOT_INODE) == ([], False)


@SETTINGS
@given(inode=st.sampled_from(["root", "file", "dir", "symlink", "fifo"]), mode=OPTIONAL_U32,
       uid=OPTIONAL_U32, gid=OPTIONAL_U32, atime=OPTIONAL_I64, mtime=OPTIONAL_I64,
       ctime=OPTIONAL_I64)
def test_no_setattr_leaves_an_unusable_inode(shared: MetadataStore, inode: str,
                                             mode: int | None, uid: int | None,
                                             gid: int | None, atime: int | None,
                                             mtime: int | None, ctime: int | None) -> None:
    """Whatever a SetAttr asks: refused and nothing changed, or accepted and every
    attribute is one stat/chmod/chown can handle (the root directory stays usable)."""
    inodes = _playground(shared)
    ino = inodes[inode]
    before = shared.getattr(ino)
    try:
        after = shared.setattr(ino, mode=mode, uid=uid, gid=gid, atime_ns=atime,
                               mtime_ns=mtime, ctime_ns=ctime)
    except (InvalidArgument, NotSupported) as exc:
        event(f"refused: {type(exc).__name__}")
        assert shared.getattr(ino) == before
        return
    event("accepted")
    assert shared.getattr(ino) == after
    assert_representable(after)
    assert after.kind == before.kind and after.inode == ino
    assert (after.uid, after.gid) == (before.uid if uid in (None, UNCHANGED_ID) else uid,
                                      before.gid if gid in (None, UNCHANGED_ID) else gid)
    if mode is not None:
        assert after.mode == mode & 0o7777
    assert shared.readdir(ROOT_INODE)[0]  # the root still lists
    assert fsck(shared).findings == []


@SETTINGS
@given(call=st.sampled_from(["create", "mkdir", "symlink", "mknod"]), mode=UINT32,
       uid=UINT32, gid=UINT32)
def test_no_create_makes_an_unusable_inode(shared: MetadataStore, call: str, mode: int,
                                           uid: int, gid: int) -> None:
    inodes = _playground(shared)
    parent = inodes["dir"]
    name = f"n{next(_names)}"
    make = {
        "create": lambda: shared.create(parent, name, mode, uid, gid),
        "mkdir": lambda: shared.mkdir(parent, name, mode, uid, gid),
        "symlink": lambda: shared.symlink(parent, name, b"t", uid, gid),
        "mknod": lambda: shared.mknod(parent, name, FIFO, mode, uid, gid),  # type: ignore[arg-type]
    }[call]
    try:
        attr = make()
    except InvalidArgument:
        event("refused")
        with pytest.raises(NotFound):
            shared.lookup(parent, name)
        return
    event("accepted")
    assert_representable(attr)
    assert UNCHANGED_ID not in (attr.uid, attr.gid) and (attr.uid, attr.gid) == (uid, gid)


def _playground(store: MetadataStore) -> dict[str, int]:
    """The inodes the property tests work on, made once per store."""
    found = {name: attr.inode for name, attr in store.readdir(ROOT_INODE)[0]}
    if "file" not in found:
        found["file"] = store.create(ROOT_INODE, "file", 0o644).inode
        found["dir"] = store.mkdir(ROOT_INODE, "dir", 0o755).inode
        found["symlink"] = store.symlink(ROOT_INODE, "symlink", b"file").inode
        found["fifo"] = store.mknod(ROOT_INODE, "fifo", FIFO, 0o600).inode  # type: ignore[arg-type]
    found["root"] = ROOT_INODE
    return found


# --- stores written before the checks -----------------------------------------------------

def test_fsck_repairs_attributes_written_before_the_checks(tmp_path: Path) -> None:
    """The state issue 18 found (root mode 0000, uid 2^32-1, mtime -2^63; a file of gid
    2^32-1), written raw as an older manager could have: fsck reports and repairs it."""
    path = tmp_path / "metadata.lmdb"
    with MetadataStore(path, map_size=64 * MiB) as store:
        f = store.create(ROOT_INODE, "f", 0o4755, uid=5, gid=6).inode
        link = store.symlink(ROOT_INODE, "l", b"f").inode
        good = store.create(ROOT_INODE, "good", 0o640, uid=1, gid=2)
    env = lmdb.open(str(path), subdir=True, max_dbs=metadata.MAX_DBS)
    inodes = env.open_db(b"inodes")

    def rewrite(txn: Any, ino: int, **values: int) -> None:
        key = struct.pack(">Q", ino)
        rec = metadata_pb2.InodeRecord.FromString(txn.get(key, db=inodes))
        for name, value in values.items():
            setattr(rec, name, value)
        txn.put(key, rec.SerializeToString(), db=inodes)

    with env.begin(write=True) as txn:
        rewrite(txn, ROOT_INODE, mode=0, uid=U32, mtime_ns=I64_MIN, atime_ns=I64_MAX)
        rewrite(txn, f, gid=U32, mode=stat.S_IFREG | 0o4755)
        rewrite(txn, link, mode=0o600)
    env.close()
    with MetadataStore(path, map_size=64 * MiB) as store:
        findings = fsck(store).findings
        assert sorted(x.detail.split(" has ")[0] for x in findings) == [
            "inode 1 (a directory)", f"inode {f} (a regular file)",
            f"inode {link} (a symbolic link)"]
        assert {x.kind for x in findings} == {"attribute"} and all(x.repairable
                                                                    for x in findings)
        assert len(fsck(store, repair=True).findings) == 3
        assert fsck(store).findings == []
        root = store.getattr(ROOT_INODE)
        assert (root.mode, root.uid, root.gid) == (0o700, NOBODY, 0)
        assert (root.mtime_ns, root.atime_ns) == (MIN_TIME_NS, MAX_TIME_NS)
        fattr = store.getattr(f)
        assert (fattr.mode, fattr.uid, fattr.gid) == (0o755, 5, NOBODY)  # setuid cleared
        assert store.getattr(link).mode == 0o777
        assert store.getattr(good.inode) == good  # nothing else touched
        for attr in (root, fattr, store.getattr(link)):
            assert_representable(attr)
