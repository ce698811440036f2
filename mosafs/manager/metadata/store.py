"""The metadata store: the operations of every concern joined over one base."""

from __future__ import annotations

from pathlib import Path

from mosafs.manager.metadata.chunks import ChunkIndexOps
from mosafs.manager.metadata.cluster import ClusterOps
from mosafs.manager.metadata.namespace import NamespaceOps
from mosafs.manager.metadata.replica import ReplicaOps
from mosafs.manager.metadata.schema import DEFAULT_MAP_SIZE
from mosafs.manager.metadata.versions import VersionOps
from mosafs.manager.metadata.xattrs import XattrOps


class MetadataStore(NamespaceOps, XattrOps, VersionOps, ChunkIndexOps, ClusterOps,
                    ReplicaOps):
    """All metadata operations, each in its own LMDB transaction (one write transaction per
    mutating operation). Thread-safe: LMDB serialises writers and gives every reader a
    snapshot; one store is shared by all gRPC worker threads."""

    def __init__(self, path: str | Path, *, map_size: int = DEFAULT_MAP_SIZE) -> None:
        super().__init__(path, map_size=map_size)
        try:
            self.settle_journal()  # a standby's confirmed entries, before anyone reads
        except BaseException:
            self.close()
            raise
