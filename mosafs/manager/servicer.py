"""The Manager gRPC service: each method unpacks its request, calls the domain (core.Manager
and its metadata store) and packs the answer. Errors are domain errors; `@servicer` turns
them into status codes (mosafs.rpc.errors)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc

from mosafs._proto import manager_pb2 as pb
from mosafs._proto import manager_pb2_grpc
from mosafs.capability import ORIGIN
from mosafs.errors import FailedPrecondition, MosafsError
from mosafs.manager.batches import Batches
from mosafs.manager.core import Manager
from mosafs.manager.folders import policy_of
from mosafs.manager.metadata import Fragments, Planned, SessionCommit
from mosafs.manager.permissions import Guard
from mosafs.rpc.errors import servicer, status_code
from mosafs.rpc.handlers import add_decoding_in_handlers
from mosafs.rpc.security import current_caller, revocations

Ctx = grpc.ServicerContext


def _optional(request: Any, name: str) -> Any:
    return getattr(request, name) if request.HasField(name) else None


@servicer
class ManagerServicer(manager_pb2_grpc.ManagerServicer):
    def __init__(self, manager: Manager) -> None:
        self._m = manager
        self._store = manager.store
        # Who may do what (mosafs.manager.permissions): checked before each call below.
        self._guard = Guard(manager.store)
        self._batch = Batches({"lookup": self._lookup, "getattr": self._getattr},
                              {"create": self._plan_create}, manager.store.run_planned)

    # --- namespace ------------------------------------------------------------------------

    def Lookup(self, request: pb.LookupRequest, context: Ctx) -> pb.Attr:
        return self._lookup(request)

    def _lookup(self, request: pb.LookupRequest) -> pb.Attr:
        self._guard.lookup(current_caller(), request.parent, request.name)
        return self._store.lookup(request.parent, request.name)

    def GetAttr(self, request: pb.GetAttrRequest, context: Ctx) -> pb.Attr:
        return self._getattr(request)

    def _getattr(self, request: pb.GetAttrRequest) -> pb.Attr:
        self._guard.stat(current_caller(), request.inode)
        return self._store.getattr(request.inode)

    def Changes(self, request: pb.ChangesRequest, context: Ctx) -> pb.ChangesReply:
        if not current_caller().capability.sees_everything:
            # A certificate limited to part of the namespace, or to some uids, is not told
            # names it may not see: its mount keeps entries for the attribute timeout.
            return pb.ChangesReply(reset=True, coherent=False)
        answer = self._m.changes.since(request.instance, request.since, ORIGIN.get())
        return pb.ChangesReply(
            instance=answer.instance, seq=answer.seq, reset=answer.reset, coherent=True,
            inodes=answer.inodes,
            names=[pb.ChangedName(parent=p, name=n) for p, n in answer.names])

    def Batch(self, request: pb.BatchRequest, context: Ctx) -> pb.BatchResponse:
        return _outcomes(self._batch.run(request.ops))

    def BatchRead(self, request: pb.BatchRequest, context: Ctx) -> pb.BatchResponse:
        return _outcomes(self._batch.run(request.ops, writes=False))


    def SetAttr(self, request: pb.SetAttrRequest, context: Ctx) -> pb.Attr:
        mode = self._guard.setattr(
            current_caller(), request.inode, mode=_optional(request, "mode"),
            uid=_optional(request, "uid"), gid=_optional(request, "gid"),
            times=any(request.HasField(f) for f in ("atime_ns", "mtime_ns", "ctime_ns")))
        return self._store.setattr(
            request.inode, mode=mode, uid=_optional(request, "uid"),
            gid=_optional(request, "gid"), atime_ns=_optional(request, "atime_ns"),
            mtime_ns=_optional(request, "mtime_ns"), ctime_ns=_optional(request, "ctime_ns"))

    def ReadDir(self, request: pb.ReadDirRequest, context: Ctx) -> pb.ReadDirResponse:
        names = self._guard.visible(current_caller(), request.inode)
        return self._store.readdir_page(request.inode, request.start_after, request.limit,
                                        names)

    def Mkdir(self, request: pb.MkdirRequest, context: Ctx) -> pb.Attr:
        self._guard.create(current_caller(), request.parent, request.uid, request.gid,
                           "Mkdir")
        return self._store.mkdir(request.parent, request.name, request.mode, request.uid,
                                 request.gid)

    def Create(self, request: pb.CreateRequest, context: Ctx) -> pb.Attr:
        return self._create(request)

    def _create(self, request: pb.CreateRequest) -> pb.Attr:
        return self._store.run_plan(self._plan_create(request))

    def _plan_create(self, request: pb.CreateRequest) -> Planned[pb.Attr]:
        """A create checked and made ready to run: alone (Create) or with a batch's other
        writes (Batch)."""
        self._guard.create(current_caller(), request.parent, request.uid, request.gid,
                           "Create")
        return self._store.plan_create(request.parent, request.name, request.mode,
                                       request.uid, request.gid, exclusive=request.exclusive)

    def Unlink(self, request: pb.UnlinkRequest, context: Ctx) -> pb.Empty:
        self._guard.remove(current_caller(), request.parent, request.name, "Unlink")
        self._store.unlink(request.parent, request.name)
        return pb.Empty()

    def Rmdir(self, request: pb.RmdirRequest, context: Ctx) -> pb.Empty:
        self._guard.remove(current_caller(), request.parent, request.name, "Rmdir")
        self._store.rmdir(request.parent, request.name)
        return pb.Empty()

    def Rename(self, request: pb.RenameRequest, context: Ctx) -> pb.Empty:
        self._guard.rename(current_caller(), request.old_parent, request.old_name,
                           request.new_parent, request.new_name)
        self._store.rename(request.old_parent, request.old_name, request.new_parent,
                           request.new_name, no_replace=request.no_replace)
        return pb.Empty()

    def StatFs(self, request: pb.StatFsRequest, context: Ctx) -> pb.StatFsResponse:
        return self._m.statfs()

    def Symlink(self, request: pb.SymlinkRequest, context: Ctx) -> pb.Attr:
        self._guard.create(current_caller(), request.parent, request.uid, request.gid,
                           "Symlink")
        return self._store.symlink(request.parent, request.name, request.target, request.uid,
                                   request.gid)

    def Readlink(self, request: pb.ReadlinkRequest, context: Ctx) -> pb.ReadlinkResponse:
        self._guard.inside(current_caller(), request.inode, "Readlink")
        return pb.ReadlinkResponse(target=self._store.readlink(request.inode))

    def Mknod(self, request: pb.MknodRequest, context: Ctx) -> pb.Attr:
        self._guard.mknod(current_caller(), request.parent, request.kind, request.uid,
                          request.gid)
        return self._store.mknod(request.parent, request.name, request.kind, request.mode,
                                 request.uid, request.gid, request.rdev)

    def Link(self, request: pb.LinkRequest, context: Ctx) -> pb.Attr:
        self._guard.link(current_caller(), request.inode, request.new_parent)
        return self._store.link(request.inode, request.new_parent, request.new_name)

    # --- extended attributes --------------------------------------------------------------

    def SetXattr(self, request: pb.SetXattrRequest, context: Ctx) -> pb.Empty:
        self._guard.write(current_caller(), request.inode, "SetXattr")
        self._store.setxattr(request.inode, request.name, request.value,
                             create=request.create, replace=request.replace)
        return pb.Empty()

    def GetXattr(self, request: pb.GetXattrRequest, context: Ctx) -> pb.GetXattrResponse:
        self._guard.read(current_caller(), request.inode, "GetXattr")
        return pb.GetXattrResponse(value=self._store.getxattr(request.inode, request.name))

    def ListXattr(self, request: pb.ListXattrRequest, context: Ctx) -> pb.ListXattrResponse:
        self._guard.read(current_caller(), request.inode, "ListXattr")
        return pb.ListXattrResponse(names=self._store.listxattr(request.inode))

    def RemoveXattr(self, request: pb.RemoveXattrRequest, context: Ctx) -> pb.Empty:
        self._guard.write(current_caller(), request.inode, "RemoveXattr")
        self._store.removexattr(request.inode, request.name)
        return pb.Empty()

    # --- write sessions -------------------------------------------------------------------

    def OpenWrite(self, request: pb.OpenWriteRequest, context: Ctx) -> pb.OpenWriteResponse:
        self._guard.write(current_caller(), request.inode, "OpenWrite")
        return self._m.open_write(request.inode, request.client_id,
                                  current_caller().fingerprint)

    def RenewLease(self, request: pb.RenewLeaseRequest, context: Ctx) -> pb.RenewLeaseResponse:
        caller = current_caller()
        self._guard.writes_chunks(caller, "RenewLease")
        ttl = self._m.renew_lease(request.lease_id, caller.fingerprint)
        return pb.RenewLeaseResponse(lease_ttl_ms=ttl, write_token=self._m.write_token(
            request.lease_id, caller.fingerprint))

    def CommitVersion(self, request: pb.CommitVersionRequest,
                      context: Ctx) -> pb.CommitVersionResponse:
        caller = current_caller()
        self._guard.inside(caller, request.inode, "CommitVersion", changes=True)
        version, attr = self._m.commit_version(
            request.lease_id, request.inode,
            [(c.id, c.length) for c in request.chunks],
            [(p.id, list(p.benefactor_ids)) for p in request.placements
             if p.benefactor_ids or not (p.ec_k or p.ec_m)],
            mtime_ns=request.mtime_ns, new_bytes=request.new_bytes,
            session=SessionCommit(provisional=request.provisional,
                                  replaces_version=request.replaces_version,
                                  session=request.session),
            fragments=[(p.id, Fragments(p.ec_k, p.ec_m, tuple(p.fragment_ids),
                                        tuple(p.fragment_holders)))
                       for p in request.placements if p.ec_k or p.ec_m],
            holder=caller.fingerprint)
        return pb.CommitVersionResponse(version=version, attr=attr)

    def AbortWrite(self, request: pb.AbortWriteRequest, context: Ctx) -> pb.Empty:
        caller = current_caller()
        self._guard.writes_chunks(caller, "AbortWrite")
        self._m.abort_write(request.lease_id, caller.fingerprint)
        return pb.Empty()

    def FindChunks(self, request: pb.FindChunksRequest, context: Ctx) -> pb.FindChunksResponse:
        self._guard.writes_chunks(current_caller(), "FindChunks")
        return pb.FindChunksResponse(present=self._m.find_chunks(list(request.ids)))

    def LocateChunks(self, request: pb.LocateChunksRequest,
                     context: Ctx) -> pb.LocateChunksResponse:
        caller = current_caller()
        # Tokens by id are for writers, who read back their base and what they stored; a
        # read-only certificate reads through block-maps (docs/operations.md).
        holder = b"" if caller.capability.read_only else caller.fingerprint
        return self._m.locate_chunks(list(request.ids), holder)

    # --- reads ----------------------------------------------------------------------------

    def GetBlockMap(self, request: pb.GetBlockMapRequest, context: Ctx) -> pb.BlockMap:
        self._guard.read(current_caller(), request.inode, "GetBlockMap")
        return self._m.block_map(request.inode, request.version,
                                 current_caller().fingerprint)

    def GetVersionStats(self, request: pb.GetVersionStatsRequest,
                        context: Ctx) -> pb.VersionStats:
        self._guard.read(current_caller(), request.inode, "GetVersionStats")
        return self._m.version_stats(request.inode, request.version)

    # --- benefactor registry --------------------------------------------------------------

    def RegisterBenefactor(self, request: pb.RegisterBenefactorRequest,
                           context: Ctx) -> pb.RegisterBenefactorResponse:
        caller = current_caller()
        self._m.registry.register(request.info, caller.name, caller.fingerprint)
        config = self._m.config
        return pb.RegisterBenefactorResponse(
            heartbeat_interval_ms=int(config.heartbeat_interval_s * 1000),
            lease_ms=int(config.benefactor_lease_s * 1000),
            security=self._m.security_state(revocations().fingerprints()))

    def Heartbeat(self, request: pb.HeartbeatRequest, context: Ctx) -> pb.HeartbeatResponse:
        caller = current_caller()
        self._m.registry.heartbeat(request.info, caller.name, caller.fingerprint)
        return pb.HeartbeatResponse(
            security=self._m.security_state(revocations().fingerprints()))

    def ListBenefactors(self, request: pb.ListBenefactorsRequest,
                        context: Ctx) -> pb.ListBenefactorsResponse:
        return pb.ListBenefactorsResponse(benefactors=self._m.registry.statuses())

    def GetClusterStatus(self, request: pb.ClusterStatusRequest,
                         context: Ctx) -> pb.ClusterStatus:
        return self._m.cluster_status()

    def ReportInventory(self, request: pb.InventoryReport, context: Ctx) -> pb.InventoryReply:
        self._m.registry.vouch(request.benefactor_id, current_caller().name)
        entries = [(e.id, e.touched_ns) for e in request.entries]
        release, waiting = self._m.report_inventory(request.benefactor_id, entries)
        return pb.InventoryReply(release=release, waiting=waiting)

    def CollectGarbage(self, request: pb.CollectGarbageRequest, context: Ctx) -> pb.GarbageReport:
        return self._m.collect_garbage()

    # --- integrity ------------------------------------------------------------------------

    def ReportCorruptChunks(self, request: pb.CorruptChunksReport, context: Ctx) -> pb.Empty:
        self._m.registry.vouch(request.benefactor_id, current_caller().name)
        self._m.report_corrupt(request.benefactor_id, list(request.ids))
        return pb.Empty()

    def Scrub(self, request: pb.ClusterScrubRequest, context: Ctx) -> Iterator[pb.ScrubEvent]:
        yield from self._m.scrub()

    # --- metadata backups (mosafs.manager.backups) -----------------------------------------

    def SnapshotMetadata(self, request: pb.SnapshotMetadataRequest,
                         context: Ctx) -> Iterator[pb.MetadataPart]:
        for p in self._backups().snapshot():
            yield pb.MetadataPart(data=p.data, total_bytes=p.total, seq=p.seq, epoch=p.epoch,
                                  counter=p.counter, taken_ms=p.taken_ms)

    def RecordBackup(self, request: pb.RecordBackupRequest,
                     context: Ctx) -> pb.RecordBackupResponse:
        name, kept = self._backups().record(request.inode, request.version, request.seq,
                                            request.epoch, counter=request.counter,
                                            taken_ms=request.taken_ms)
        return pb.RecordBackupResponse(name=name, benefactors=kept)

    def _backups(self) -> Any:
        if self._m.backups is None:
            raise FailedPrecondition("this manager takes no metadata backups")
        return self._m.backups

    def Fsck(self, request: pb.FsckRequest, context: Ctx) -> pb.FsckReport:
        result = self._m.fsck(repair=request.repair)
        out = pb.FsckReport(repaired=result.repaired, inodes=result.inodes,
                            versions=result.versions, chunks=result.chunks,
                            dirents=result.dirents)
        out.findings.extend(pb.FsckFinding(kind=f.kind, detail=f.detail,
                                           repairable=f.repairable) for f in result.findings)
        return out

    # --- versions and folders -------------------------------------------------------------

    def ListVersions(self, request: pb.ListVersionsRequest,
                     context: Ctx) -> pb.ListVersionsResponse:
        self._guard.read(current_caller(), request.inode, "ListVersions")
        return pb.ListVersionsResponse(versions=self._store.list_versions(request.inode))

    def RestoreVersion(self, request: pb.RestoreVersionRequest,
                       context: Ctx) -> pb.CommitVersionResponse:
        self._guard.write(current_caller(), request.inode, "RestoreVersion")
        version, attr = self._m.restore_version(request.inode, request.version)
        return pb.CommitVersionResponse(version=version, attr=attr)

    def SetFolderSettings(self, request: pb.SetFolderSettingsRequest,
                          context: Ctx) -> pb.FolderSettingsReply:
        return self._m.set_folder(
            request.inode, pool=_optional(request, "pool"),
            series_pattern=_optional(request, "series_pattern"),
            policy=policy_of(request.policy) if request.HasField("policy") else None,
            clear_policy=request.clear_policy)

    def GetFolderSettings(self, request: pb.GetFolderSettingsRequest,
                          context: Ctx) -> pb.FolderSettingsReply:
        self._guard.stat(current_caller(), request.inode, "GetFolderSettings")
        return self._m.folders.get(request.inode)

    def ListFolderSettings(self, request: pb.ListFolderSettingsRequest,
                           context: Ctx) -> pb.ListFolderSettingsResponse:
        return pb.ListFolderSettingsResponse(
            folders=self._m.folders.all(self._guard.seen_by(current_caller())))

    def Prune(self, request: pb.PruneRequest, context: Ctx) -> pb.PruneReport:
        policy = policy_of(request.policy) if request.HasField("policy") else None
        result = self._m.prune(request.inode, dry_run=request.dry_run, policy=policy)
        return result.report(request.dry_run)

    # --- pools and benefactors ------------------------------------------------------------

    def _pool_update(self, request: pb.PoolRequest, *, create: bool) -> pb.PoolInfo:
        settings = self._store.update_pool(
            request.name, create=create, replication=_optional(request, "replication"),
            stripe_width=_optional(request, "stripe_width"),
            chunker=_optional(request, "chunker"),
            write_semantics=_optional(request, "write_semantics"),
            hash_backend=_optional(request, "hash_backend"),
            redundancy=_optional(request, "redundancy"),
            ec_min_chunk=_optional(request, "ec_min_chunk"))
        self._m.pool_changed(request.name)
        return self._m.pool_info(settings)

    def CreatePool(self, request: pb.PoolRequest, context: Ctx) -> pb.PoolInfo:
        return self._pool_update(request, create=True)

    def UpdatePool(self, request: pb.PoolRequest, context: Ctx) -> pb.PoolInfo:
        return self._pool_update(request, create=False)

    def GetPool(self, request: pb.GetPoolRequest, context: Ctx) -> pb.PoolInfo:
        return self._m.pool_info(self._store.pool(request.name),
                                 self._guard.seen_by(current_caller()))

    def ListPools(self, request: pb.ListPoolsRequest, context: Ctx) -> pb.ListPoolsResponse:
        seen = self._guard.seen_by(current_caller())
        return pb.ListPoolsResponse(pools=[self._m.pool_info(p, seen)
                                           for p in self._store.pools()])

    def DeletePool(self, request: pb.DeletePoolRequest, context: Ctx) -> pb.Empty:
        self._store.delete_pool(request.name)
        return pb.Empty()

    def MoveBenefactor(self, request: pb.MoveBenefactorRequest,
                       context: Ctx) -> pb.BenefactorStatus:
        return self._m.move_benefactor(request.id, request.pool)

    def DrainBenefactor(self, request: pb.DrainBenefactorRequest,
                        context: Ctx) -> pb.DrainStatus:
        return self._m.drain(request.id, cancel=request.cancel)

    def GetDrainStatus(self, request: pb.DrainStatusRequest, context: Ctx) -> pb.DrainStatus:
        return self._m.drain_status(request.id)

    def RemoveBenefactor(self, request: pb.RemoveBenefactorRequest, context: Ctx) -> pb.Empty:
        self._m.remove_benefactor(request.id, force=request.force)
        return pb.Empty()


def add_to_server(manager: Manager) -> Callable[[grpc.Server], None]:
    """The `add_servicer` callback for mosafs.rpc.channels.server."""
    def add(server: grpc.Server) -> None:
        add_decoding_in_handlers(manager_pb2_grpc.add_ManagerServicer_to_server,
                                 ManagerServicer(manager), server)
    return add


def _outcomes(results: list[Any]) -> pb.BatchResponse:
    """A batch's answers: each operation's Attr, or its error as the status code, kind
    and message its own RPC would have failed with."""
    out = pb.BatchResponse()
    for result in results:
        if isinstance(result, MosafsError):
            out.outcomes.add(code=status_code(result).value[0], kind=result.kind,
                             error=result.message)
        else:
            out.outcomes.add(attr=result)
    return out
