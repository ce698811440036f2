"""Who may call what (docs/operations.md): for every RPC of the Manager and Benefactor
services, the certificate roles (mosafs.certs.ROLES) allowed to call it. An RPC missing
here is refused to everyone (a unit test checks that every RPC has an entry).

Admin RPCs (pools, policies, pruning, drains, removal, gc, scrub, fsck) need the `admin`
role; an ordinary client certificate gets PERMISSION_DENIED. Plaintext servers
(`--insecure`) check nothing: there is no identity to check.
"""

from __future__ import annotations

ANY = frozenset({"manager", "benefactor", "client", "admin"})
USERS = frozenset({"client", "admin"})
ADMIN = frozenset({"admin"})
BENEFACTOR = frozenset({"benefactor"})
MANAGER = frozenset({"manager", "admin"})

_NAMESPACE = ("Lookup", "GetAttr", "Batch", "BatchRead", "Changes", "SetAttr", "ReadDir", "Mkdir",
              "Create", "Unlink", "Rmdir", "Rename", "StatFs", "Symlink", "Readlink", "Mknod",
              "Link", "SetXattr", "GetXattr", "ListXattr", "RemoveXattr")
_WRITES = ("OpenWrite", "RenewLease", "CommitVersion", "AbortWrite", "FindChunks",
           "LocateChunks", "GetBlockMap", "GetVersionStats", "ListVersions", "RestoreVersion")
# Open to every role; the folder queries (and a pool's folders) name directories by path,
# so the manager answers a client restricted to subtrees only about those it may stat
# (mosafs.manager.permissions.Guard.stat and .seen_by).
_STATUS = ("ListBenefactors", "GetClusterStatus", "GetFolderSettings", "ListFolderSettings",
           "GetPool", "ListPools", "GetDrainStatus")
_ADMIN = ("CollectGarbage", "Scrub", "Fsck", "SetFolderSettings", "Prune", "CreatePool",
          "UpdatePool", "DeletePool", "MoveBenefactor", "DrainBenefactor", "RemoveBenefactor",
          "SnapshotMetadata", "RecordBackup")
_REGISTRY = ("RegisterBenefactor", "Heartbeat", "ReportInventory", "ReportCorruptChunks")

MANAGER_ACCESS: dict[str, frozenset[str]] = {
    **dict.fromkeys(_NAMESPACE, USERS),
    **dict.fromkeys(_WRITES, USERS),
    **dict.fromkeys(_STATUS, ANY),
    **dict.fromkeys(_ADMIN, ADMIN),
    **dict.fromkeys(_REGISTRY, BENEFACTOR),
}

BENEFACTOR_ACCESS: dict[str, frozenset[str]] = {
    # Clients store and read; a benefactor pushing a replica puts to its peer.
    "PutChunk": USERS | BENEFACTOR,
    "PutChunks": USERS | BENEFACTOR,
    # A manager rebuilt from the benefactors reads its backup's chunks (it has no token
    # keys yet: its certificate is the root the keys derive from anyway).
    "GetChunk": USERS | BENEFACTOR | MANAGER,
    "OpenLocal": USERS,
    "HasChunks": USERS | MANAGER,
    "GetInfo": ANY,
    # Maintenance the manager runs (and an administrator may).
    "ReplicateChunks": MANAGER,
    "RunGarbageRound": MANAGER,
    "DeleteChunks": MANAGER,
    "Scrub": MANAGER,
    "RecodeChunk": MANAGER,
    # Disaster recovery (docs/coordination.md, "Metadata backups").
    "PutRecoveryRecord": MANAGER,
    "ListRecoveryRecords": MANAGER,
    "ListChunks": MANAGER,
}

# A standby manager follows the active one's log (docs/standby.md): it asks where the
# feed listens, and the feed's own connections (mosafs.rpc.framed) check FEED_ACCESS.
REPLICATION_ACCESS: dict[str, frozenset[str]] = {"FeedAddress": MANAGER}
FEED_ACCESS = MANAGER

ACCESS = {"mosafs.v1.Manager": MANAGER_ACCESS, "mosafs.v1.Benefactor": BENEFACTOR_ACCESS,
          "mosafs.v1.ManagerReplication": REPLICATION_ACCESS}
