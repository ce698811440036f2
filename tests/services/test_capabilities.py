"""Per-client capabilities and revocation, attacked over raw RPCs (the generated stubs) on a
real TLS manager and benefactor: a client certificate restricted to /jobA (uid 1000)
reaches nothing outside /jobA and cannot act as another uid inside it; a read-only one
changes nothing; POSIX permissions hold for the uid a request acts as (device nodes only
by root, setgid dropped as Linux does); a write lease serves only the certificate that
opened it; folder queries show only what the caller may see; a revoked certificate is
refused by the manager and the benefactor within 5 s."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mosafs import certs
from mosafs._proto import benefactor_pb2 as bpb
from mosafs._proto import benefactor_pb2_grpc as bgrpc
from mosafs._proto import manager_pb2 as mpb
from mosafs._proto import manager_pb2_grpc as mgrpc
from mosafs.capability import GIDS_KEY, UID_KEY
from mosafs.rpc.channels import channel
from tests import harness
from tests.harness import cli, scrape

Code = grpc.StatusCode
ROOT = 1


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    assert cli("certs", "init", "--dir", str(directory)).returncode == 0
    for name in ("manager", "benefactor", "admin"):
        assert cli("certs", "issue", name, "--role", name, "--dir", str(directory)).returncode == 0
    assert cli("certs", "issue", "impostor", "--role", "benefactor", "--dir",
               str(directory)).returncode == 0
    issued = [("jobA", ["--path", "/jobA", "--uid", "1000", "--gids", "1000"]),
              ("reader", ["--path", "/jobA", "--read-only", "--uid", "1000"]),
              ("anyuser", []), ("doomed", ["--allow-root"])]
    for name, flags in issued:
        done = cli("certs", "issue", name, "--role", "client", "--dir", str(directory), *flags)
        assert done.returncode == 0, done.stderr
    return directory


@pytest.fixture(scope="module")
def cluster(tls: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("caps")
    manager = harness.start("manager", ["manager", "--data-dir", str(work / "m"),
                                        "--tls-dir", str(tls)], work)
    benefactor = harness.start("benefactor", [
        "benefactor", "--data-dir", str(work / "b"), "--manager", manager.address,
        "--tls-dir", str(tls)], work)
    try:
        admin = stub(manager.address, tls, "admin")
        # /jobA (uid 1000), /jobB (root's, 0700) with a 0600 file, /jobA/private (uid 1001).
        a = admin.Mkdir(mpb.MkdirRequest(parent=ROOT, name="jobA", mode=0o755, uid=1000,
                                         gid=1000)).inode
        b = admin.Mkdir(mpb.MkdirRequest(parent=ROOT, name="jobB", mode=0o700)).inode
        secret = admin.Create(mpb.CreateRequest(parent=b, name="secret", mode=0o600)).inode
        other = admin.Mkdir(mpb.MkdirRequest(parent=a, name="private", mode=0o700, uid=1001,
                                             gid=1001)).inode
        mine = admin.Create(mpb.CreateRequest(parent=a, name="mine", mode=0o644, uid=1000,
                                              gid=1000)).inode
        yield {"manager": manager, "benefactor": benefactor, "jobA": a, "jobB": b,
               "secret": secret, "private": other, "mine": mine}
    finally:
        harness.stop_every([manager, benefactor])


def stub(address: str, tls: Path, name: str) -> mgrpc.ManagerStub:
    return mgrpc.ManagerStub(channel(address, certs.load(tls, name)))


def refused(call: Callable[[], Any]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()  # type: ignore[no-any-return]


def as_uid(uid: int, *gids: int) -> dict[str, Any]:
    return {"metadata": ((UID_KEY, str(uid)), (GIDS_KEY, ",".join(map(str, gids or (uid,)))))}


class Acting:
    """A stub whose every call says it acts as one uid (as the mount does)."""

    def __init__(self, target: Any, uid: int) -> None:
        self._target = target
        self._uid = uid

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._target, name)
        return lambda request: method(request, **as_uid(self._uid))


def test_services_restricted_client_reaches_nothing_outside_its_subtree(
        cluster: dict[str, Any], tls: Path) -> None:
    job: Any = Acting(stub(cluster["manager"].address, tls, "jobA"), 1000)
    b, secret = cluster["jobB"], cluster["secret"]
    attempts: list[tuple[str, Callable[[], Any]]] = [
        ("lookup jobB", lambda: job.Lookup(mpb.LookupRequest(parent=ROOT, name="jobB"))),
        ("lookup a name that does not exist",
         lambda: job.Lookup(mpb.LookupRequest(parent=ROOT, name="nothing"))),
        ("getattr", lambda: job.GetAttr(mpb.GetAttrRequest(inode=secret))),
        ("readdir", lambda: job.ReadDir(mpb.ReadDirRequest(inode=b))),
        ("blockmap", lambda: job.GetBlockMap(mpb.GetBlockMapRequest(inode=secret))),
        ("create", lambda: job.Create(mpb.CreateRequest(parent=b, name="x", mode=0o644,
                                                        uid=1000, gid=1000))),
        ("create at the root", lambda: job.Create(mpb.CreateRequest(
            parent=ROOT, name="x", mode=0o644, uid=1000, gid=1000))),
        ("mkdir", lambda: job.Mkdir(mpb.MkdirRequest(parent=b, name="d", mode=0o755,
                                                     uid=1000, gid=1000))),
        ("unlink", lambda: job.Unlink(mpb.UnlinkRequest(parent=b, name="secret"))),
        ("unlink jobB", lambda: job.Rmdir(mpb.RmdirRequest(parent=ROOT, name="jobB"))),
        ("rename out", lambda: job.Rename(mpb.RenameRequest(
            old_parent=b, old_name="secret", new_parent=cluster["jobA"], new_name="s"))),
        ("rename jobA itself", lambda: job.Rename(mpb.RenameRequest(
            old_parent=ROOT, old_name="jobA", new_parent=ROOT, new_name="jobC"))),
        ("chmod", lambda: job.SetAttr(mpb.SetAttrRequest(inode=secret, mode=0o4777))),
        ("chown", lambda: job.SetAttr(mpb.SetAttrRequest(inode=secret, uid=1000))),
        ("chmod the root", lambda: job.SetAttr(mpb.SetAttrRequest(inode=ROOT, mode=0))),
        ("setxattr", lambda: job.SetXattr(mpb.SetXattrRequest(inode=secret, name="user.x",
                                                              value=b"1"))),
        ("getxattr", lambda: job.GetXattr(mpb.GetXattrRequest(inode=secret, name="user.x"))),
        ("listxattr", lambda: job.ListXattr(mpb.ListXattrRequest(inode=secret))),
        ("openwrite", lambda: job.OpenWrite(mpb.OpenWriteRequest(inode=secret))),
        ("link in", lambda: job.Link(mpb.LinkRequest(inode=secret,
                                                     new_parent=cluster["jobA"],
                                                     new_name="stolen"))),
        ("versions", lambda: job.ListVersions(mpb.ListVersionsRequest(inode=secret))),
        ("fsck (admin)", lambda: job.Fsck(mpb.FsckRequest())),
    ]
    for what, call in attempts:
        assert refused(call) == Code.PERMISSION_DENIED, what
    # The way down is visible, and only it: the root lists jobA alone.
    listing = job.ReadDir(mpb.ReadDirRequest(inode=ROOT))
    assert [e.name for e in listing.entries] == ["jobA"]
    # Nor do the mounts' change lists tell it of the rest: it gets none (its mount keeps
    # entries for the attribute timeout), where an unrestricted client gets jobB's names.
    for name in ("jobA", "anyuser"):  # a subtree; any uid but root, who owns jobB
        told = stub(cluster["manager"].address, tls, name).Changes(mpb.ChangesRequest())
        assert not told.coherent and told.reset and not told.names and not told.inodes
    root = stub(cluster["manager"].address, tls, "doomed")  # sees everything
    first = root.Changes(mpb.ChangesRequest())
    assert first.coherent and first.reset  # a first question: no position yet
    assert (b, "secret") in {(n.parent, n.name) for n in root.Changes(
        mpb.ChangesRequest(instance=first.instance, since=0)).names}
    assert job.Lookup(mpb.LookupRequest(parent=ROOT, name="jobA")).inode == cluster["jobA"]


def test_services_restricted_client_acts_only_as_its_uid_with_posix_permissions(
        cluster: dict[str, Any], tls: Path) -> None:
    job = stub(cluster["manager"].address, tls, "jobA")
    a = cluster["jobA"]
    # Another uid, root included, and a group outside the capability: refused.
    for metadata in (as_uid(1001), as_uid(0), as_uid(1000, 1000, 1001)):
        assert refused(lambda m=metadata: job.GetAttr(mpb.GetAttrRequest(inode=a), **m)) \
            == Code.PERMISSION_DENIED
    # A name owned by someone else, and the 0700 directory of uid 1001: refused by POSIX.
    assert refused(lambda: job.Create(mpb.CreateRequest(
        parent=a, name="f", mode=0o644, uid=1001, gid=1001), **as_uid(1000))) \
        == Code.PERMISSION_DENIED
    assert refused(lambda: job.ReadDir(mpb.ReadDirRequest(inode=cluster["private"]),
                                       **as_uid(1000))) == Code.PERMISSION_DENIED
    assert refused(lambda: job.Create(mpb.CreateRequest(
        parent=cluster["private"], name="f", mode=0o644, uid=1000, gid=1000),
        **as_uid(1000))) == Code.PERMISSION_DENIED
    # Inside, as itself: works, and the new file is its own.
    made = job.Create(mpb.CreateRequest(parent=a, name="ok", mode=0o644, uid=1000, gid=1000),
                      **as_uid(1000))
    assert (made.uid, made.gid) == (1000, 1000)
    assert job.SetAttr(mpb.SetAttrRequest(inode=made.inode, mode=0o600),
                       **as_uid(1000)).mode & 0o7777 == 0o600
    # 2^32-1 leaves the owner as it is (chown(2)'s -1): allowed to the owner.
    unchanged = 2**32 - 1
    kept = job.SetAttr(mpb.SetAttrRequest(inode=made.inode, uid=unchanged, gid=unchanged,
                                          mode=0o640), **as_uid(1000))
    assert (kept.uid, kept.gid, kept.mode & 0o7777) == (1000, 1000, 0o640)
    # It may not give its file away.
    assert refused(lambda: job.SetAttr(mpb.SetAttrRequest(inode=made.inode, uid=1001),
                                       **as_uid(1000))) == Code.PERMISSION_DENIED
    job.Unlink(mpb.UnlinkRequest(parent=a, name="ok"), **as_uid(1000))


def test_services_malformed_acting_metadata_is_refused_and_the_manager_goes_on(
        cluster: dict[str, Any], tls: Path) -> None:
    """A uid or group list that is not numbers is refused with its key named; the same
    certificate's next well-formed call is served."""
    job = stub(cluster["manager"].address, tls, "jobA")
    a = cluster["jobA"]
    for metadata, key in ((((UID_KEY, "root"), (GIDS_KEY, "1000")), UID_KEY),
                          (((UID_KEY, "1000"), (GIDS_KEY, "1000,wheel")), GIDS_KEY)):
        with pytest.raises(grpc.RpcError) as info:
            job.GetAttr(mpb.GetAttrRequest(inode=a), metadata=metadata)
        assert info.value.code() == Code.PERMISSION_DENIED
        assert f"metadata {key} is not a number list" in (info.value.details() or "")
    assert job.GetAttr(mpb.GetAttrRequest(inode=a), **as_uid(1000)).inode == a


def test_services_batched_operations_are_checked_one_by_one(
        cluster: dict[str, Any], tls: Path) -> None:
    """A Batch call's operations get the checks of their own RPCs, as the call's acting
    uid: the ones outside the capability or POSIX permissions are refused, alone."""
    job = stub(cluster["manager"].address, tls, "jobA")
    a, b = cluster["jobA"], cluster["jobB"]
    ops = [mpb.BatchOp(create=mpb.CreateRequest(parent=a, name="batched", mode=0o644,
                                                uid=1000, gid=1000)),
           mpb.BatchOp(create=mpb.CreateRequest(parent=b, name="x", mode=0o644, uid=1000,
                                                gid=1000)),
           mpb.BatchOp(create=mpb.CreateRequest(parent=cluster["private"], name="x",
                                                mode=0o644, uid=1000, gid=1000)),
           mpb.BatchOp(getattr=mpb.GetAttrRequest(inode=cluster["secret"])),
           mpb.BatchOp(lookup=mpb.LookupRequest(parent=ROOT, name="jobA"))]
    out = job.Batch(mpb.BatchRequest(ops=ops), **as_uid(1000)).outcomes
    assert out[0].code == 0 and (out[0].attr.uid, out[0].attr.gid) == (1000, 1000)
    assert [o.code for o in out[1:4]] == [Code.PERMISSION_DENIED.value[0]] * 3
    assert out[4].code == 0 and out[4].attr.inode == a
    # Acting as another uid refuses the whole call, as for any RPC.
    assert refused(lambda: job.Batch(mpb.BatchRequest(ops=ops[:1]), **as_uid(0))) \
        == Code.PERMISSION_DENIED
    job.Unlink(mpb.UnlinkRequest(parent=a, name="batched"), **as_uid(1000))


def test_services_unrestricted_client_is_still_bound_by_posix_and_root_squash(
        cluster: dict[str, Any], tls: Path) -> None:
    """A client certificate without --allow-root: any uid but root, which is squashed."""
    anyone = stub(cluster["manager"].address, tls, "anyuser")
    secret, b = cluster["secret"], cluster["jobB"]
    # As root (squashed to nobody) and as uid 1000: root's 0600 file in a 0700 directory.
    for metadata in (as_uid(0), as_uid(1000), {}):
        assert refused(lambda m=metadata: anyone.Lookup(
            mpb.LookupRequest(parent=b, name="secret"), **m)) == Code.PERMISSION_DENIED
        assert refused(lambda m=metadata: anyone.GetBlockMap(
            mpb.GetBlockMapRequest(inode=secret), **m)) == Code.PERMISSION_DENIED
        assert refused(lambda m=metadata: anyone.Unlink(
            mpb.UnlinkRequest(parent=b, name="secret"), **m)) == Code.PERMISSION_DENIED
        assert refused(lambda m=metadata: anyone.SetAttr(
            mpb.SetAttrRequest(inode=secret, mode=0o4777), **m)) == Code.PERMISSION_DENIED
    # The admin certificate, acting as root, may.
    admin = stub(cluster["manager"].address, tls, "admin")
    assert admin.Lookup(mpb.LookupRequest(parent=b, name="secret")).inode == secret


def test_services_read_only_client_changes_nothing(cluster: dict[str, Any], tls: Path) -> None:
    reader = stub(cluster["manager"].address, tls, "reader")
    a, mine = cluster["jobA"], cluster["mine"]
    assert reader.GetAttr(mpb.GetAttrRequest(inode=mine), **as_uid(1000)).inode == mine
    for call in (
        lambda: reader.Create(mpb.CreateRequest(parent=a, name="w", mode=0o644, uid=1000,
                                                gid=1000), **as_uid(1000)),
        lambda: reader.SetAttr(mpb.SetAttrRequest(inode=mine, mode=0o600), **as_uid(1000)),
        lambda: reader.OpenWrite(mpb.OpenWriteRequest(inode=mine), **as_uid(1000)),
        lambda: reader.Unlink(mpb.UnlinkRequest(parent=a, name="mine"), **as_uid(1000)),
    ):
        assert refused(call) == Code.PERMISSION_DENIED


def test_services_a_write_lease_serves_only_the_certificate_that_opened_it(
        cluster: dict[str, Any], tls: Path) -> None:
    """OpenWrite checks write permission; the lease it answers must not let a client that
    may not write the file (another certificate) commit a version of it, take its write
    token, or end its session. Lease ids are random: no counter to guess from."""
    address, a = cluster["manager"].address, cluster["jobA"]
    owner = stub(address, tls, "anyuser")  # any uid but root: acts as 2000
    job = stub(address, tls, "jobA")  # /jobA only, uid 1000
    theirs = stub(address, tls, "admin").Create(mpb.CreateRequest(
        parent=a, name="theirs", mode=0o644, uid=2000, gid=2000)).inode
    assert refused(lambda: job.OpenWrite(mpb.OpenWriteRequest(inode=theirs),
                                         **as_uid(1000))) == Code.PERMISSION_DENIED
    lease = owner.OpenWrite(mpb.OpenWriteRequest(inode=theirs), **as_uid(2000)).lease_id
    mine = job.OpenWrite(mpb.OpenWriteRequest(inode=cluster["mine"]), **as_uid(1000))
    assert abs(mine.lease_id - lease) > 1
    for what, call in (
        ("commit", lambda: job.CommitVersion(mpb.CommitVersionRequest(
            lease_id=lease, inode=theirs), **as_uid(1000))),
        ("renew", lambda: job.RenewLease(mpb.RenewLeaseRequest(lease_id=lease),
                                         **as_uid(1000))),
        ("abort", lambda: job.AbortWrite(mpb.AbortWriteRequest(lease_id=lease),
                                         **as_uid(1000))),
    ):
        assert refused(call) == Code.PERMISSION_DENIED, what
    assert job.GetAttr(mpb.GetAttrRequest(inode=theirs), **as_uid(1000)).version == 0
    # The owner's session is intact: it renews and commits its lease.
    owner.RenewLease(mpb.RenewLeaseRequest(lease_id=lease), **as_uid(2000))
    done = owner.CommitVersion(mpb.CommitVersionRequest(lease_id=lease, inode=theirs),
                               **as_uid(2000))
    assert done.version == 1
    job.AbortWrite(mpb.AbortWriteRequest(lease_id=mine.lease_id), **as_uid(1000))


def test_services_a_restricted_client_reaches_its_own_symlinks_and_fifos(
        cluster: dict[str, Any], tls: Path) -> None:
    """Every kind of inode is placed by its entry, not only regular files and
    directories: a symlink or FIFO in the client's own subtree is inside it."""
    job: Any = Acting(stub(cluster["manager"].address, tls, "jobA"), 1000)
    a = cluster["jobA"]
    link = job.Symlink(mpb.SymlinkRequest(parent=a, name="ln", target=b"mine", uid=1000,
                                          gid=1000))
    fifo = job.Mknod(mpb.MknodRequest(parent=a, name="fifo", kind=mpb.FILE_KIND_FIFO,
                                      mode=0o600, uid=1000, gid=1000))
    assert job.GetAttr(mpb.GetAttrRequest(inode=link.inode)).inode == link.inode
    assert job.Readlink(mpb.ReadlinkRequest(inode=link.inode)).target == b"mine"
    assert job.GetAttr(mpb.GetAttrRequest(inode=fifo.inode)).kind == mpb.FILE_KIND_FIFO
    # Outside its subtree they stay out of reach.
    admin = stub(cluster["manager"].address, tls, "admin")
    far = admin.Symlink(mpb.SymlinkRequest(parent=cluster["jobB"], name="ln", target=b"x"))
    assert refused(lambda: job.Readlink(mpb.ReadlinkRequest(inode=far.inode))) \
        == Code.PERMISSION_DENIED
    for name in ("ln", "fifo"):
        job.Unlink(mpb.UnlinkRequest(parent=a, name=name))


def test_services_only_root_makes_device_nodes(cluster: dict[str, Any], tls: Path) -> None:
    """mknod(2) of a block or character device needs CAP_MKNOD: a client key that may not
    act as root gets EPERM, which a mount host would otherwise honour (no nodev)."""
    job: Any = Acting(stub(cluster["manager"].address, tls, "jobA"), 1000)
    a = cluster["jobA"]
    for kind in (mpb.FILE_KIND_BLOCK_DEVICE, mpb.FILE_KIND_CHAR_DEVICE):
        assert refused(lambda k=kind: job.Mknod(mpb.MknodRequest(
            parent=a, name="sda", kind=k, mode=0o666, uid=1000, gid=1000,
            rdev=os.makedev(8, 0)))) == Code.PERMISSION_DENIED
    anyone = stub(cluster["manager"].address, tls, "anyuser")  # root squashed
    assert refused(lambda: anyone.Mknod(mpb.MknodRequest(
        parent=a, name="sda", kind=mpb.FILE_KIND_BLOCK_DEVICE, mode=0o600,
        rdev=os.makedev(8, 0)))) == Code.PERMISSION_DENIED
    admin = stub(cluster["manager"].address, tls, "admin")  # root
    made = admin.Mknod(mpb.MknodRequest(parent=a, name="sda", kind=mpb.FILE_KIND_BLOCK_DEVICE,
                                        mode=0o600, rdev=os.makedev(8, 0)))
    assert made.rdev == os.makedev(8, 0)
    admin.Unlink(mpb.UnlinkRequest(parent=a, name="sda"))


def test_services_chmod_by_an_owner_outside_the_group_drops_setgid(
        cluster: dict[str, Any], tls: Path) -> None:
    """As Linux's chmod: the setgid bit stays only for root or a member of the file's
    group, so that no one makes a program setgid to a group they are not in."""
    a = cluster["jobA"]
    admin = stub(cluster["manager"].address, tls, "admin")
    prog = admin.Create(mpb.CreateRequest(parent=a, name="prog", mode=0o755, uid=1000,
                                          gid=3000)).inode
    job: Any = Acting(stub(cluster["manager"].address, tls, "jobA"), 1000)
    got = job.SetAttr(mpb.SetAttrRequest(inode=prog, mode=0o2755))
    assert (got.mode & 0o7777, got.gid) == (0o755, 3000)
    # In the group (its own, set in the same request): kept. Root keeps it too.
    got = job.SetAttr(mpb.SetAttrRequest(inode=prog, mode=0o2750, gid=1000))
    assert (got.mode & 0o7777, got.gid) == (0o2750, 1000)
    assert admin.SetAttr(mpb.SetAttrRequest(inode=prog, mode=0o2755, gid=3000)).mode \
        & 0o7777 == 0o2755
    job.Unlink(mpb.UnlinkRequest(parent=a, name="prog"))


def test_services_folder_queries_show_a_restricted_client_only_its_own(
        cluster: dict[str, Any], tls: Path) -> None:
    """Folder settings and a pool's folders name directories by path: a client restricted
    to /jobA is not told of /jobB's."""
    address, a, b = cluster["manager"].address, cluster["jobA"], cluster["jobB"]
    admin = stub(address, tls, "admin")
    admin.CreatePool(mpb.PoolRequest(name="hidden"))
    for folder in (a, b):
        admin.SetFolderSettings(mpb.SetFolderSettingsRequest(inode=folder, pool="hidden"))
    job = stub(address, tls, "jobA")
    try:
        assert refused(lambda: job.GetFolderSettings(
            mpb.GetFolderSettingsRequest(inode=b), **as_uid(1000))) == Code.PERMISSION_DENIED
        assert job.GetFolderSettings(mpb.GetFolderSettingsRequest(inode=a),
                                     **as_uid(1000)).path == "/jobA"
        listed = job.ListFolderSettings(mpb.ListFolderSettingsRequest(), **as_uid(1000))
        assert [f.path for f in listed.folders] == ["/jobA"]
        for pool in (job.GetPool(mpb.GetPoolRequest(name="hidden"), **as_uid(1000)),
                     *[p for p in job.ListPools(mpb.ListPoolsRequest(), **as_uid(1000)).pools
                       if p.settings.name == "hidden"]):
            assert (list(pool.folders), list(pool.folder_paths)) == ([a], ["/jobA"])
        # An unrestricted certificate sees them all.
        assert sorted(f.path for f in admin.ListFolderSettings(
            mpb.ListFolderSettingsRequest()).folders) == ["/jobA", "/jobB"]
        assert sorted(admin.GetPool(mpb.GetPoolRequest(name="hidden")).folder_paths) == [
            "/jobA", "/jobB"]
    finally:
        for folder in (a, b):
            admin.SetFolderSettings(mpb.SetFolderSettingsRequest(inode=folder, pool=""))
        admin.DeletePool(mpb.DeletePoolRequest(name="hidden"))


def test_services_refusals_are_counted_and_audited(cluster: dict[str, Any], tls: Path) -> None:
    job = stub(cluster["manager"].address, tls, "jobA")
    refused(lambda: job.GetAttr(mpb.GetAttrRequest(inode=cluster["secret"]), **as_uid(1000)))
    metrics = scrape(cluster["manager"].ready["metrics"])
    assert metrics.get('mosafs_refusals_total{reason=capability}', 0) >= 1
    assert "refused GetAttr to jobA" in cluster["manager"].log()


def test_services_revoked_certificate_is_refused_within_5s(
        cluster: dict[str, Any], tls: Path) -> None:
    manager = stub(cluster["manager"].address, tls, "doomed")
    benefactor = bgrpc.BenefactorStub(channel(cluster["benefactor"].address,
                                              certs.load(tls, "doomed")))
    assert manager.GetAttr(mpb.GetAttrRequest(inode=ROOT)).inode == ROOT
    benefactor.GetInfo(bpb.GetInfoRequest())
    done = cli("certs", "revoke", "doomed", "--dir", str(tls))
    assert done.returncode == 0, done.stderr
    started = time.monotonic()
    for call in (lambda: manager.GetAttr(mpb.GetAttrRequest(inode=ROOT)),
                 lambda: benefactor.GetInfo(bpb.GetInfoRequest())):
        while True:  # the same connections as before: refused per call, not per handshake
            try:
                call()
            except grpc.RpcError as exc:
                assert exc.code() == Code.UNAUTHENTICATED
                break
            assert time.monotonic() - started < 5.0, "still served 5 s after the revocation"
            time.sleep(0.1)
    listed = cli("certs", "list", "--dir", str(tls))
    assert "doomed.crt" in listed.stdout and "(revoked)" in listed.stdout


def test_services_a_benefactor_certificate_speaks_only_for_its_own_id(
        cluster: dict[str, Any], tls: Path) -> None:
    """A stolen benefactor key cannot re-register, heartbeat or report for another
    benefactor (a corruption report would drop that benefactor's copies)."""
    admin = stub(cluster["manager"].address, tls, "admin")
    real = admin.ListBenefactors(mpb.ListBenefactorsRequest()).benefactors[0].info
    impostor = stub(cluster["manager"].address, tls, "impostor")
    for call in (
        lambda: impostor.RegisterBenefactor(mpb.RegisterBenefactorRequest(info=real)),
        lambda: impostor.Heartbeat(mpb.HeartbeatRequest(info=real)),
        lambda: impostor.ReportCorruptChunks(mpb.CorruptChunksReport(
            benefactor_id=real.id, ids=[bytes(32)])),
        lambda: impostor.ReportInventory(mpb.InventoryReport(benefactor_id=real.id)),
    ):
        assert refused(call) == Code.PERMISSION_DENIED
    assert admin.ListBenefactors(mpb.ListBenefactorsRequest()).benefactors[0].info.address \
        == real.address
