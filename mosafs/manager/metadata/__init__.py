"""The manager's metadata store: one LMDB environment holding the namespace, file versions
and their block-maps, extended attributes, the chunk index, benefactor registrations and
pools (docs/metadata.md is the reference for its schema and invariants).

  schema      the sub-databases, key and block-map encodings, schema version, inode
              kinds, limits; its docstring has the schema table and the invariants
  checks      validation of requests: names, ids, chunk lists, modes, owners, times, ...
  records     small value types (Fragments, Layout, WriteBase, SessionCommit, ...), the
              rules that read a chunk record, the replies built from records
  tx          Tx, the one transaction type: typed access to every sub-database
  base        StoreBase: the environment, its map, read and write transactions
  namespace   NamespaceOps: lookups, attributes, directories, files, links, nodes
  xattrs      XattrOps: extended attributes
  versions    VersionOps: versions and block-maps, commits and restores
  chunks      ChunkIndexOps: chunk records, copies, fragments, reference counts
  cluster     ClusterOps: benefactor registrations and pools
  store       MetadataStore, every concern's operations over one base
"""

from mosafs.manager.metadata.base import Planned
from mosafs.manager.metadata.checks import (
    check_benefactor_id,
    check_certificate,
    check_chunks,
    check_ids,
)
from mosafs.manager.metadata.records import (
    FINAL_COMMIT,
    FragmentMove,
    Fragments,
    Layout,
    SessionCommit,
    WriteBase,
    blob_needed_on,
    fragment_needed_on,
    wants_whole_copy,
)
from mosafs.manager.metadata.schema import (
    BLOCKMAP_ENTRY,
    DB_NAMES,
    DEVICES,
    DIRECTORY,
    KINDS,
    MAX_CHUNK_BYTES,
    MAX_DBS,
    MAX_FILE_SIZE,
    MAX_OWNER_ID,
    MAX_RDEV,
    MAX_TIME_NS,
    MIN_TIME_NS,
    READDIR_DEFAULT,
    READDIR_MAX,
    REGULAR,
    ROOT_INODE,
    ROOT_OWNER_BITS,
    SYMLINK,
    UNCHANGED_ID,
    ChunkEntry,
    kind_name,
    pack_blockmap,
    unpack_blockmap,
)
from mosafs.manager.metadata.store import MetadataStore
from mosafs.manager.metadata.tx import Tx

__all__ = [
    "BLOCKMAP_ENTRY",
    "DB_NAMES",
    "DEVICES",
    "DIRECTORY",
    "FINAL_COMMIT",
    "KINDS",
    "MAX_CHUNK_BYTES",
    "MAX_DBS",
    "MAX_FILE_SIZE",
    "MAX_OWNER_ID",
    "MAX_RDEV",
    "MAX_TIME_NS",
    "MIN_TIME_NS",
    "READDIR_DEFAULT",
    "READDIR_MAX",
    "REGULAR",
    "ROOT_INODE",
    "ROOT_OWNER_BITS",
    "SYMLINK",
    "UNCHANGED_ID",
    "ChunkEntry",
    "FragmentMove",
    "Fragments",
    "Layout",
    "MetadataStore",
    "Planned",
    "SessionCommit",
    "Tx",
    "WriteBase",
    "blob_needed_on",
    "check_benefactor_id",
    "check_certificate",
    "check_chunks",
    "check_ids",
    "fragment_needed_on",
    "kind_name",
    "pack_blockmap",
    "unpack_blockmap",
    "wants_whole_copy",
]
