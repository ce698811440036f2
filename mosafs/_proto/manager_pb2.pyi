from mosafs._proto import benefactor_pb2 as _benefactor_pb2
from mosafs._proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FileKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_KIND_UNSPECIFIED: _ClassVar[FileKind]
    FILE_KIND_DIRECTORY: _ClassVar[FileKind]
    FILE_KIND_REGULAR: _ClassVar[FileKind]
    FILE_KIND_SYMLINK: _ClassVar[FileKind]
    FILE_KIND_FIFO: _ClassVar[FileKind]
    FILE_KIND_SOCKET: _ClassVar[FileKind]
    FILE_KIND_BLOCK_DEVICE: _ClassVar[FileKind]
    FILE_KIND_CHAR_DEVICE: _ClassVar[FileKind]
FILE_KIND_UNSPECIFIED: FileKind
FILE_KIND_DIRECTORY: FileKind
FILE_KIND_REGULAR: FileKind
FILE_KIND_SYMLINK: FileKind
FILE_KIND_FIFO: FileKind
FILE_KIND_SOCKET: FileKind
FILE_KIND_BLOCK_DEVICE: FileKind
FILE_KIND_CHAR_DEVICE: FileKind

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Attr(_message.Message):
    __slots__ = ("inode", "kind", "mode", "nlink", "uid", "gid", "size", "atime_ns", "mtime_ns", "ctime_ns", "version", "rdev")
    INODE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    NLINK_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ATIME_NS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    CTIME_NS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    inode: int
    kind: FileKind
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    version: int
    rdev: int
    def __init__(self, inode: _Optional[int] = ..., kind: _Optional[_Union[FileKind, str]] = ..., mode: _Optional[int] = ..., nlink: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., size: _Optional[int] = ..., atime_ns: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., ctime_ns: _Optional[int] = ..., version: _Optional[int] = ..., rdev: _Optional[int] = ...) -> None: ...

class BatchOp(_message.Message):
    __slots__ = ("lookup", "getattr", "create")
    LOOKUP_FIELD_NUMBER: _ClassVar[int]
    GETATTR_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    lookup: LookupRequest
    getattr: GetAttrRequest
    create: CreateRequest
    def __init__(self, lookup: _Optional[_Union[LookupRequest, _Mapping]] = ..., getattr: _Optional[_Union[GetAttrRequest, _Mapping]] = ..., create: _Optional[_Union[CreateRequest, _Mapping]] = ...) -> None: ...

class BatchRequest(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[BatchOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[BatchOp, _Mapping]]] = ...) -> None: ...

class BatchOutcome(_message.Message):
    __slots__ = ("attr", "code", "kind", "error")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    attr: Attr
    code: int
    kind: str
    error: str
    def __init__(self, attr: _Optional[_Union[Attr, _Mapping]] = ..., code: _Optional[int] = ..., kind: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[BatchOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[BatchOutcome, _Mapping]]] = ...) -> None: ...

class ChangesRequest(_message.Message):
    __slots__ = ("instance", "since")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    instance: str
    since: int
    def __init__(self, instance: _Optional[str] = ..., since: _Optional[int] = ...) -> None: ...

class ChangedName(_message.Message):
    __slots__ = ("parent", "name")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    parent: int
    name: str
    def __init__(self, parent: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class ChangesReply(_message.Message):
    __slots__ = ("instance", "seq", "reset", "inodes", "names", "coherent")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    INODES_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    COHERENT_FIELD_NUMBER: _ClassVar[int]
    instance: str
    seq: int
    reset: bool
    inodes: _containers.RepeatedScalarFieldContainer[int]
    names: _containers.RepeatedCompositeFieldContainer[ChangedName]
    coherent: bool
    def __init__(self, instance: _Optional[str] = ..., seq: _Optional[int] = ..., reset: _Optional[bool] = ..., inodes: _Optional[_Iterable[int]] = ..., names: _Optional[_Iterable[_Union[ChangedName, _Mapping]]] = ..., coherent: _Optional[bool] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("parent", "name")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    parent: int
    name: str
    def __init__(self, parent: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class GetAttrRequest(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: int
    def __init__(self, inode: _Optional[int] = ...) -> None: ...

class SetAttrRequest(_message.Message):
    __slots__ = ("inode", "mode", "uid", "gid", "atime_ns", "mtime_ns", "ctime_ns")
    INODE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    ATIME_NS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    CTIME_NS_FIELD_NUMBER: _ClassVar[int]
    inode: int
    mode: int
    uid: int
    gid: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    def __init__(self, inode: _Optional[int] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., atime_ns: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., ctime_ns: _Optional[int] = ...) -> None: ...

class ReadDirRequest(_message.Message):
    __slots__ = ("inode", "start_after", "limit")
    INODE_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    inode: int
    start_after: str
    limit: int
    def __init__(self, inode: _Optional[int] = ..., start_after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class DirEntry(_message.Message):
    __slots__ = ("name", "attr")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    name: str
    attr: Attr
    def __init__(self, name: _Optional[str] = ..., attr: _Optional[_Union[Attr, _Mapping]] = ...) -> None: ...

class ReadDirResponse(_message.Message):
    __slots__ = ("entries", "more")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DirEntry]
    more: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[DirEntry, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class MkdirRequest(_message.Message):
    __slots__ = ("parent", "name", "mode", "uid", "gid")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    parent: int
    name: str
    mode: int
    uid: int
    gid: int
    def __init__(self, parent: _Optional[int] = ..., name: _Optional[str] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("parent", "name", "mode", "uid", "gid", "exclusive")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    parent: int
    name: str
    mode: int
    uid: int
    gid: int
    exclusive: bool
    def __init__(self, parent: _Optional[int] = ..., name: _Optional[str] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., exclusive: _Optional[bool] = ...) -> None: ...

class UnlinkRequest(_message.Message):
    __slots__ = ("parent", "name")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    parent: int
    name: str
    def __init__(self, parent: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class RmdirRequest(_message.Message):
    __slots__ = ("parent", "name")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    parent: int
    name: str
    def __init__(self, parent: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class RenameRequest(_message.Message):
    __slots__ = ("old_parent", "old_name", "new_parent", "new_name", "no_replace")
    OLD_PARENT_FIELD_NUMBER: _ClassVar[int]
    OLD_NAME_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    NO_REPLACE_FIELD_NUMBER: _ClassVar[int]
    old_parent: int
    old_name: str
    new_parent: int
    new_name: str
    no_replace: bool
    def __init__(self, old_parent: _Optional[int] = ..., old_name: _Optional[str] = ..., new_parent: _Optional[int] = ..., new_name: _Optional[str] = ..., no_replace: _Optional[bool] = ...) -> None: ...

class SymlinkRequest(_message.Message):
    __slots__ = ("parent", "name", "target", "uid", "gid")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    parent: int
    name: str
    target: bytes
    uid: int
    gid: int
    def __init__(self, parent: _Optional[int] = ..., name: _Optional[str] = ..., target: _Optional[bytes] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ...) -> None: ...

class ReadlinkRequest(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: int
    def __init__(self, inode: _Optional[int] = ...) -> None: ...

class ReadlinkResponse(_message.Message):
    __slots__ = ("target",)
    TARGET_FIELD_NUMBER: _ClassVar[int]
    target: bytes
    def __init__(self, target: _Optional[bytes] = ...) -> None: ...

class MknodRequest(_message.Message):
    __slots__ = ("parent", "name", "kind", "mode", "uid", "gid", "rdev")
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    parent: int
    name: str
    kind: FileKind
    mode: int
    uid: int
    gid: int
    rdev: int
    def __init__(self, parent: _Optional[int] = ..., name: _Optional[str] = ..., kind: _Optional[_Union[FileKind, str]] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., rdev: _Optional[int] = ...) -> None: ...

class LinkRequest(_message.Message):
    __slots__ = ("inode", "new_parent", "new_name")
    INODE_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    inode: int
    new_parent: int
    new_name: str
    def __init__(self, inode: _Optional[int] = ..., new_parent: _Optional[int] = ..., new_name: _Optional[str] = ...) -> None: ...

class SetXattrRequest(_message.Message):
    __slots__ = ("inode", "name", "value", "create", "replace")
    INODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    inode: int
    name: str
    value: bytes
    create: bool
    replace: bool
    def __init__(self, inode: _Optional[int] = ..., name: _Optional[str] = ..., value: _Optional[bytes] = ..., create: _Optional[bool] = ..., replace: _Optional[bool] = ...) -> None: ...

class GetXattrRequest(_message.Message):
    __slots__ = ("inode", "name")
    INODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    inode: int
    name: str
    def __init__(self, inode: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class GetXattrResponse(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    def __init__(self, value: _Optional[bytes] = ...) -> None: ...

class ListXattrRequest(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: int
    def __init__(self, inode: _Optional[int] = ...) -> None: ...

class ListXattrResponse(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoveXattrRequest(_message.Message):
    __slots__ = ("inode", "name")
    INODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    inode: int
    name: str
    def __init__(self, inode: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class StatFsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatFsResponse(_message.Message):
    __slots__ = ("capacity_bytes", "free_bytes", "files")
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    capacity_bytes: int
    free_bytes: int
    files: int
    def __init__(self, capacity_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., files: _Optional[int] = ...) -> None: ...

class OpenWriteRequest(_message.Message):
    __slots__ = ("inode", "client_id")
    INODE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    inode: int
    client_id: str
    def __init__(self, inode: _Optional[int] = ..., client_id: _Optional[str] = ...) -> None: ...

class OpenWriteResponse(_message.Message):
    __slots__ = ("lease_id", "lease_ttl_ms", "pool", "targets", "base_inode", "base_version", "base_chunks", "base_size", "write_token")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    BASE_INODE_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    BASE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    lease_ttl_ms: int
    pool: _common_pb2.PoolSettings
    targets: _containers.RepeatedCompositeFieldContainer[_common_pb2.BenefactorAddress]
    base_inode: int
    base_version: int
    base_chunks: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChunkRef]
    base_size: int
    write_token: bytes
    def __init__(self, lease_id: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., pool: _Optional[_Union[_common_pb2.PoolSettings, _Mapping]] = ..., targets: _Optional[_Iterable[_Union[_common_pb2.BenefactorAddress, _Mapping]]] = ..., base_inode: _Optional[int] = ..., base_version: _Optional[int] = ..., base_chunks: _Optional[_Iterable[_Union[_common_pb2.ChunkRef, _Mapping]]] = ..., base_size: _Optional[int] = ..., write_token: _Optional[bytes] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    def __init__(self, lease_id: _Optional[int] = ...) -> None: ...

class RenewLeaseResponse(_message.Message):
    __slots__ = ("lease_ttl_ms", "write_token")
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    WRITE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    lease_ttl_ms: int
    write_token: bytes
    def __init__(self, lease_ttl_ms: _Optional[int] = ..., write_token: _Optional[bytes] = ...) -> None: ...

class ChunkPlacement(_message.Message):
    __slots__ = ("id", "benefactor_ids", "ec_k", "ec_m", "fragment_ids", "fragment_holders")
    ID_FIELD_NUMBER: _ClassVar[int]
    BENEFACTOR_IDS_FIELD_NUMBER: _ClassVar[int]
    EC_K_FIELD_NUMBER: _ClassVar[int]
    EC_M_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    benefactor_ids: _containers.RepeatedScalarFieldContainer[str]
    ec_k: int
    ec_m: int
    fragment_ids: _containers.RepeatedScalarFieldContainer[bytes]
    fragment_holders: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[bytes] = ..., benefactor_ids: _Optional[_Iterable[str]] = ..., ec_k: _Optional[int] = ..., ec_m: _Optional[int] = ..., fragment_ids: _Optional[_Iterable[bytes]] = ..., fragment_holders: _Optional[_Iterable[str]] = ...) -> None: ...

class CommitVersionRequest(_message.Message):
    __slots__ = ("lease_id", "inode", "chunks", "placements", "mtime_ns", "new_bytes", "provisional", "replaces_version", "session")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    NEW_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROVISIONAL_FIELD_NUMBER: _ClassVar[int]
    REPLACES_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    inode: int
    chunks: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChunkRef]
    placements: _containers.RepeatedCompositeFieldContainer[ChunkPlacement]
    mtime_ns: int
    new_bytes: int
    provisional: bool
    replaces_version: int
    session: bytes
    def __init__(self, lease_id: _Optional[int] = ..., inode: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[_common_pb2.ChunkRef, _Mapping]]] = ..., placements: _Optional[_Iterable[_Union[ChunkPlacement, _Mapping]]] = ..., mtime_ns: _Optional[int] = ..., new_bytes: _Optional[int] = ..., provisional: _Optional[bool] = ..., replaces_version: _Optional[int] = ..., session: _Optional[bytes] = ...) -> None: ...

class CommitVersionResponse(_message.Message):
    __slots__ = ("version", "attr")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    version: int
    attr: Attr
    def __init__(self, version: _Optional[int] = ..., attr: _Optional[_Union[Attr, _Mapping]] = ...) -> None: ...

class AbortWriteRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    def __init__(self, lease_id: _Optional[int] = ...) -> None: ...

class FindChunksRequest(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class FindChunksResponse(_message.Message):
    __slots__ = ("present",)
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    present: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, present: _Optional[_Iterable[bool]] = ...) -> None: ...

class LocateChunksRequest(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class LocateChunksResponse(_message.Message):
    __slots__ = ("locations", "benefactors", "unindexed")
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    BENEFACTORS_FIELD_NUMBER: _ClassVar[int]
    UNINDEXED_FIELD_NUMBER: _ClassVar[int]
    locations: _containers.RepeatedCompositeFieldContainer[ChunkLocation]
    benefactors: _containers.RepeatedCompositeFieldContainer[_common_pb2.BenefactorAddress]
    unindexed: _containers.RepeatedCompositeFieldContainer[ChunkLocation]
    def __init__(self, locations: _Optional[_Iterable[_Union[ChunkLocation, _Mapping]]] = ..., benefactors: _Optional[_Iterable[_Union[_common_pb2.BenefactorAddress, _Mapping]]] = ..., unindexed: _Optional[_Iterable[_Union[ChunkLocation, _Mapping]]] = ...) -> None: ...

class GetBlockMapRequest(_message.Message):
    __slots__ = ("inode", "version")
    INODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    inode: int
    version: int
    def __init__(self, inode: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class ChunkLocation(_message.Message):
    __slots__ = ("id", "benefactor_ids", "token", "ec_k", "ec_m", "fragment_ids", "fragment_holders", "fragment_tokens", "fragment_live", "length")
    ID_FIELD_NUMBER: _ClassVar[int]
    BENEFACTOR_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EC_K_FIELD_NUMBER: _ClassVar[int]
    EC_M_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_LIVE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    benefactor_ids: _containers.RepeatedScalarFieldContainer[str]
    token: bytes
    ec_k: int
    ec_m: int
    fragment_ids: _containers.RepeatedScalarFieldContainer[bytes]
    fragment_holders: _containers.RepeatedScalarFieldContainer[str]
    fragment_tokens: _containers.RepeatedScalarFieldContainer[bytes]
    fragment_live: _containers.RepeatedScalarFieldContainer[bool]
    length: int
    def __init__(self, id: _Optional[bytes] = ..., benefactor_ids: _Optional[_Iterable[str]] = ..., token: _Optional[bytes] = ..., ec_k: _Optional[int] = ..., ec_m: _Optional[int] = ..., fragment_ids: _Optional[_Iterable[bytes]] = ..., fragment_holders: _Optional[_Iterable[str]] = ..., fragment_tokens: _Optional[_Iterable[bytes]] = ..., fragment_live: _Optional[_Iterable[bool]] = ..., length: _Optional[int] = ...) -> None: ...

class BlockMap(_message.Message):
    __slots__ = ("inode", "version", "size", "chunks", "locations", "benefactors")
    INODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    BENEFACTORS_FIELD_NUMBER: _ClassVar[int]
    inode: int
    version: int
    size: int
    chunks: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChunkRef]
    locations: _containers.RepeatedCompositeFieldContainer[ChunkLocation]
    benefactors: _containers.RepeatedCompositeFieldContainer[_common_pb2.BenefactorAddress]
    def __init__(self, inode: _Optional[int] = ..., version: _Optional[int] = ..., size: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[_common_pb2.ChunkRef, _Mapping]]] = ..., locations: _Optional[_Iterable[_Union[ChunkLocation, _Mapping]]] = ..., benefactors: _Optional[_Iterable[_Union[_common_pb2.BenefactorAddress, _Mapping]]] = ...) -> None: ...

class GetVersionStatsRequest(_message.Message):
    __slots__ = ("inode", "version")
    INODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    inode: int
    version: int
    def __init__(self, inode: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class VersionStats(_message.Message):
    __slots__ = ("inode", "version", "size", "chunks", "shared_chunks", "base_inode", "base_version", "new_bytes", "commit_time_ns", "mtime_ns", "shared_bytes", "fully_redundant", "short_chunks", "lost_chunks", "stored_chunks", "stored_bytes", "indexed_chunks", "indexed_bytes", "repeated_chunks", "repeated_bytes", "sources_known", "base_path", "base_removed", "base_version_kept", "provisional", "replaced_versions", "redundancy")
    INODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SHARED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    BASE_INODE_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEW_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    SHARED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FULLY_REDUNDANT_FIELD_NUMBER: _ClassVar[int]
    SHORT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    LOST_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    STORED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    INDEXED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    INDEXED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPEATED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    REPEATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCES_KNOWN_FIELD_NUMBER: _ClassVar[int]
    BASE_PATH_FIELD_NUMBER: _ClassVar[int]
    BASE_REMOVED_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_KEPT_FIELD_NUMBER: _ClassVar[int]
    PROVISIONAL_FIELD_NUMBER: _ClassVar[int]
    REPLACED_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    REDUNDANCY_FIELD_NUMBER: _ClassVar[int]
    inode: int
    version: int
    size: int
    chunks: int
    shared_chunks: int
    base_inode: int
    base_version: int
    new_bytes: int
    commit_time_ns: int
    mtime_ns: int
    shared_bytes: int
    fully_redundant: bool
    short_chunks: int
    lost_chunks: int
    stored_chunks: int
    stored_bytes: int
    indexed_chunks: int
    indexed_bytes: int
    repeated_chunks: int
    repeated_bytes: int
    sources_known: bool
    base_path: str
    base_removed: bool
    base_version_kept: bool
    provisional: bool
    replaced_versions: int
    redundancy: _containers.RepeatedCompositeFieldContainer[RedundancyCount]
    def __init__(self, inode: _Optional[int] = ..., version: _Optional[int] = ..., size: _Optional[int] = ..., chunks: _Optional[int] = ..., shared_chunks: _Optional[int] = ..., base_inode: _Optional[int] = ..., base_version: _Optional[int] = ..., new_bytes: _Optional[int] = ..., commit_time_ns: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., shared_bytes: _Optional[int] = ..., fully_redundant: _Optional[bool] = ..., short_chunks: _Optional[int] = ..., lost_chunks: _Optional[int] = ..., stored_chunks: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., indexed_chunks: _Optional[int] = ..., indexed_bytes: _Optional[int] = ..., repeated_chunks: _Optional[int] = ..., repeated_bytes: _Optional[int] = ..., sources_known: _Optional[bool] = ..., base_path: _Optional[str] = ..., base_removed: _Optional[bool] = ..., base_version_kept: _Optional[bool] = ..., provisional: _Optional[bool] = ..., replaced_versions: _Optional[int] = ..., redundancy: _Optional[_Iterable[_Union[RedundancyCount, _Mapping]]] = ...) -> None: ...

class RedundancyCount(_message.Message):
    __slots__ = ("redundancy", "chunks", "bytes")
    REDUNDANCY_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    redundancy: str
    chunks: int
    bytes: int
    def __init__(self, redundancy: _Optional[str] = ..., chunks: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class RegisterBenefactorRequest(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: _benefactor_pb2.BenefactorInfo
    def __init__(self, info: _Optional[_Union[_benefactor_pb2.BenefactorInfo, _Mapping]] = ...) -> None: ...

class RegisterBenefactorResponse(_message.Message):
    __slots__ = ("heartbeat_interval_ms", "lease_ms", "security")
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    SECURITY_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_ms: int
    lease_ms: int
    security: SecurityState
    def __init__(self, heartbeat_interval_ms: _Optional[int] = ..., lease_ms: _Optional[int] = ..., security: _Optional[_Union[SecurityState, _Mapping]] = ...) -> None: ...

class SecurityState(_message.Message):
    __slots__ = ("revoked", "token_keys")
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_KEYS_FIELD_NUMBER: _ClassVar[int]
    revoked: _containers.RepeatedScalarFieldContainer[bytes]
    token_keys: _containers.RepeatedCompositeFieldContainer[TokenKey]
    def __init__(self, revoked: _Optional[_Iterable[bytes]] = ..., token_keys: _Optional[_Iterable[_Union[TokenKey, _Mapping]]] = ...) -> None: ...

class TokenKey(_message.Message):
    __slots__ = ("id", "secret", "not_after_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    secret: bytes
    not_after_ms: int
    def __init__(self, id: _Optional[int] = ..., secret: _Optional[bytes] = ..., not_after_ms: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: _benefactor_pb2.BenefactorInfo
    def __init__(self, info: _Optional[_Union[_benefactor_pb2.BenefactorInfo, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("security",)
    SECURITY_FIELD_NUMBER: _ClassVar[int]
    security: SecurityState
    def __init__(self, security: _Optional[_Union[SecurityState, _Mapping]] = ...) -> None: ...

class ListBenefactorsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BenefactorStatus(_message.Message):
    __slots__ = ("info", "alive", "last_heartbeat_age_ms", "draining", "full")
    INFO_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    info: _benefactor_pb2.BenefactorInfo
    alive: bool
    last_heartbeat_age_ms: int
    draining: bool
    full: bool
    def __init__(self, info: _Optional[_Union[_benefactor_pb2.BenefactorInfo, _Mapping]] = ..., alive: _Optional[bool] = ..., last_heartbeat_age_ms: _Optional[int] = ..., draining: _Optional[bool] = ..., full: _Optional[bool] = ...) -> None: ...

class ListBenefactorsResponse(_message.Message):
    __slots__ = ("benefactors",)
    BENEFACTORS_FIELD_NUMBER: _ClassVar[int]
    benefactors: _containers.RepeatedCompositeFieldContainer[BenefactorStatus]
    def __init__(self, benefactors: _Optional[_Iterable[_Union[BenefactorStatus, _Mapping]]] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("benefactors", "chunks", "under_replicated_chunks", "replication_backlog_bytes", "lost_chunks", "replication_rate_bytes_s", "time_to_full_redundancy_s", "scanned_age_ms", "metadata_write_transactions", "redundancy_unreachable", "full_scan_age_ms", "ec_short_chunks", "ec_missing_fragments", "ec_lost_chunks", "ec_rebuilt_fragments", "ec_rebuilt_bytes", "ec_rebuild_rate_bytes_s", "conversions", "gc_waiting_chunks", "gc_collected_chunks", "gc_deleted_blobs", "gc_freed_bytes", "managers")
    BENEFACTORS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_BACKLOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOST_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_RATE_BYTES_S_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FULL_REDUNDANCY_S_FIELD_NUMBER: _ClassVar[int]
    SCANNED_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    METADATA_WRITE_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    REDUNDANCY_UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    FULL_SCAN_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    EC_SHORT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    EC_MISSING_FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    EC_LOST_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    EC_REBUILT_FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    EC_REBUILT_BYTES_FIELD_NUMBER: _ClassVar[int]
    EC_REBUILD_RATE_BYTES_S_FIELD_NUMBER: _ClassVar[int]
    CONVERSIONS_FIELD_NUMBER: _ClassVar[int]
    GC_WAITING_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    GC_COLLECTED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    GC_DELETED_BLOBS_FIELD_NUMBER: _ClassVar[int]
    GC_FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MANAGERS_FIELD_NUMBER: _ClassVar[int]
    benefactors: _containers.RepeatedCompositeFieldContainer[BenefactorStatus]
    chunks: int
    under_replicated_chunks: int
    replication_backlog_bytes: int
    lost_chunks: int
    replication_rate_bytes_s: float
    time_to_full_redundancy_s: float
    scanned_age_ms: int
    metadata_write_transactions: int
    redundancy_unreachable: _containers.RepeatedScalarFieldContainer[str]
    full_scan_age_ms: int
    ec_short_chunks: int
    ec_missing_fragments: int
    ec_lost_chunks: int
    ec_rebuilt_fragments: int
    ec_rebuilt_bytes: int
    ec_rebuild_rate_bytes_s: float
    conversions: _containers.RepeatedCompositeFieldContainer[ConversionProgress]
    gc_waiting_chunks: int
    gc_collected_chunks: int
    gc_deleted_blobs: int
    gc_freed_bytes: int
    managers: _containers.RepeatedCompositeFieldContainer[ManagerMember]
    def __init__(self, benefactors: _Optional[_Iterable[_Union[BenefactorStatus, _Mapping]]] = ..., chunks: _Optional[int] = ..., under_replicated_chunks: _Optional[int] = ..., replication_backlog_bytes: _Optional[int] = ..., lost_chunks: _Optional[int] = ..., replication_rate_bytes_s: _Optional[float] = ..., time_to_full_redundancy_s: _Optional[float] = ..., scanned_age_ms: _Optional[int] = ..., metadata_write_transactions: _Optional[int] = ..., redundancy_unreachable: _Optional[_Iterable[str]] = ..., full_scan_age_ms: _Optional[int] = ..., ec_short_chunks: _Optional[int] = ..., ec_missing_fragments: _Optional[int] = ..., ec_lost_chunks: _Optional[int] = ..., ec_rebuilt_fragments: _Optional[int] = ..., ec_rebuilt_bytes: _Optional[int] = ..., ec_rebuild_rate_bytes_s: _Optional[float] = ..., conversions: _Optional[_Iterable[_Union[ConversionProgress, _Mapping]]] = ..., gc_waiting_chunks: _Optional[int] = ..., gc_collected_chunks: _Optional[int] = ..., gc_deleted_blobs: _Optional[int] = ..., gc_freed_bytes: _Optional[int] = ..., managers: _Optional[_Iterable[_Union[ManagerMember, _Mapping]]] = ...) -> None: ...

class ManagerMember(_message.Message):
    __slots__ = ("member", "address", "active", "in_sync", "lag_entries", "epoch", "log_seq")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    LAG_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOG_SEQ_FIELD_NUMBER: _ClassVar[int]
    member: str
    address: str
    active: bool
    in_sync: bool
    lag_entries: int
    epoch: int
    log_seq: int
    def __init__(self, member: _Optional[str] = ..., address: _Optional[str] = ..., active: _Optional[bool] = ..., in_sync: _Optional[bool] = ..., lag_entries: _Optional[int] = ..., epoch: _Optional[int] = ..., log_seq: _Optional[int] = ...) -> None: ...

class ConversionProgress(_message.Message):
    __slots__ = ("pool", "redundancy", "done_chunks", "done_bytes", "remaining_chunks", "remaining_bytes", "counted", "stuck_chunks")
    POOL_FIELD_NUMBER: _ClassVar[int]
    REDUNDANCY_FIELD_NUMBER: _ClassVar[int]
    DONE_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DONE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REMAINING_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    REMAINING_BYTES_FIELD_NUMBER: _ClassVar[int]
    COUNTED_FIELD_NUMBER: _ClassVar[int]
    STUCK_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    redundancy: str
    done_chunks: int
    done_bytes: int
    remaining_chunks: int
    remaining_bytes: int
    counted: bool
    stuck_chunks: int
    def __init__(self, pool: _Optional[str] = ..., redundancy: _Optional[str] = ..., done_chunks: _Optional[int] = ..., done_bytes: _Optional[int] = ..., remaining_chunks: _Optional[int] = ..., remaining_bytes: _Optional[int] = ..., counted: _Optional[bool] = ..., stuck_chunks: _Optional[int] = ...) -> None: ...

class InventoryEntry(_message.Message):
    __slots__ = ("id", "touched_ns", "length")
    ID_FIELD_NUMBER: _ClassVar[int]
    TOUCHED_NS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    touched_ns: int
    length: int
    def __init__(self, id: _Optional[bytes] = ..., touched_ns: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class InventoryReport(_message.Message):
    __slots__ = ("benefactor_id", "entries")
    BENEFACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    benefactor_id: str
    entries: _containers.RepeatedCompositeFieldContainer[InventoryEntry]
    def __init__(self, benefactor_id: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[InventoryEntry, _Mapping]]] = ...) -> None: ...

class InventoryReply(_message.Message):
    __slots__ = ("release", "waiting")
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    release: _containers.RepeatedScalarFieldContainer[bytes]
    waiting: int
    def __init__(self, release: _Optional[_Iterable[bytes]] = ..., waiting: _Optional[int] = ...) -> None: ...

class CollectGarbageRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GarbageReport(_message.Message):
    __slots__ = ("benefactors", "deleted_chunks", "freed_bytes", "waiting_chunks", "failures")
    BENEFACTORS_FIELD_NUMBER: _ClassVar[int]
    DELETED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAITING_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    benefactors: int
    deleted_chunks: int
    freed_bytes: int
    waiting_chunks: int
    failures: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, benefactors: _Optional[int] = ..., deleted_chunks: _Optional[int] = ..., freed_bytes: _Optional[int] = ..., waiting_chunks: _Optional[int] = ..., failures: _Optional[_Iterable[str]] = ...) -> None: ...

class CorruptChunksReport(_message.Message):
    __slots__ = ("benefactor_id", "ids")
    BENEFACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    benefactor_id: str
    ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, benefactor_id: _Optional[str] = ..., ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ClusterScrubRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BenefactorScrub(_message.Message):
    __slots__ = ("id", "address", "checked_chunks", "checked_bytes", "corrupt_chunks", "missing_chunks", "repaired_chunks", "unrepaired_chunks", "error", "total_chunks")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CHECKED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHECKED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    MISSING_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    REPAIRED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    UNREPAIRED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    checked_chunks: int
    checked_bytes: int
    corrupt_chunks: int
    missing_chunks: int
    repaired_chunks: int
    unrepaired_chunks: int
    error: str
    total_chunks: int
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., checked_chunks: _Optional[int] = ..., checked_bytes: _Optional[int] = ..., corrupt_chunks: _Optional[int] = ..., missing_chunks: _Optional[int] = ..., repaired_chunks: _Optional[int] = ..., unrepaired_chunks: _Optional[int] = ..., error: _Optional[str] = ..., total_chunks: _Optional[int] = ...) -> None: ...

class ScrubEvent(_message.Message):
    __slots__ = ("progress", "benefactor_index", "benefactors", "repairing", "done", "results", "unrepaired_ids")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    BENEFACTOR_INDEX_FIELD_NUMBER: _ClassVar[int]
    BENEFACTORS_FIELD_NUMBER: _ClassVar[int]
    REPAIRING_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    UNREPAIRED_IDS_FIELD_NUMBER: _ClassVar[int]
    progress: BenefactorScrub
    benefactor_index: int
    benefactors: int
    repairing: bool
    done: bool
    results: _containers.RepeatedCompositeFieldContainer[BenefactorScrub]
    unrepaired_ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, progress: _Optional[_Union[BenefactorScrub, _Mapping]] = ..., benefactor_index: _Optional[int] = ..., benefactors: _Optional[int] = ..., repairing: _Optional[bool] = ..., done: _Optional[bool] = ..., results: _Optional[_Iterable[_Union[BenefactorScrub, _Mapping]]] = ..., unrepaired_ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class FsckRequest(_message.Message):
    __slots__ = ("repair",)
    REPAIR_FIELD_NUMBER: _ClassVar[int]
    repair: bool
    def __init__(self, repair: _Optional[bool] = ...) -> None: ...

class FsckFinding(_message.Message):
    __slots__ = ("kind", "detail", "repairable")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REPAIRABLE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    detail: str
    repairable: bool
    def __init__(self, kind: _Optional[str] = ..., detail: _Optional[str] = ..., repairable: _Optional[bool] = ...) -> None: ...

class FsckReport(_message.Message):
    __slots__ = ("findings", "repaired", "inodes", "versions", "chunks", "dirents")
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    REPAIRED_FIELD_NUMBER: _ClassVar[int]
    INODES_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DIRENTS_FIELD_NUMBER: _ClassVar[int]
    findings: _containers.RepeatedCompositeFieldContainer[FsckFinding]
    repaired: bool
    inodes: int
    versions: int
    chunks: int
    dirents: int
    def __init__(self, findings: _Optional[_Iterable[_Union[FsckFinding, _Mapping]]] = ..., repaired: _Optional[bool] = ..., inodes: _Optional[int] = ..., versions: _Optional[int] = ..., chunks: _Optional[int] = ..., dirents: _Optional[int] = ...) -> None: ...

class ListVersionsRequest(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: int
    def __init__(self, inode: _Optional[int] = ...) -> None: ...

class ListVersionsResponse(_message.Message):
    __slots__ = ("versions",)
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[VersionStats]
    def __init__(self, versions: _Optional[_Iterable[_Union[VersionStats, _Mapping]]] = ...) -> None: ...

class RestoreVersionRequest(_message.Message):
    __slots__ = ("inode", "version")
    INODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    inode: int
    version: int
    def __init__(self, inode: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class PrunePolicy(_message.Message):
    __slots__ = ("keep_last", "keep_every", "purge_after_ms")
    KEEP_LAST_FIELD_NUMBER: _ClassVar[int]
    KEEP_EVERY_FIELD_NUMBER: _ClassVar[int]
    PURGE_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    keep_last: int
    keep_every: int
    purge_after_ms: int
    def __init__(self, keep_last: _Optional[int] = ..., keep_every: _Optional[int] = ..., purge_after_ms: _Optional[int] = ...) -> None: ...

class FolderSettings(_message.Message):
    __slots__ = ("pool", "series_pattern", "policy")
    POOL_FIELD_NUMBER: _ClassVar[int]
    SERIES_PATTERN_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    pool: str
    series_pattern: str
    policy: PrunePolicy
    def __init__(self, pool: _Optional[str] = ..., series_pattern: _Optional[str] = ..., policy: _Optional[_Union[PrunePolicy, _Mapping]] = ...) -> None: ...

class SetFolderSettingsRequest(_message.Message):
    __slots__ = ("inode", "pool", "series_pattern", "policy", "clear_policy")
    INODE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SERIES_PATTERN_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CLEAR_POLICY_FIELD_NUMBER: _ClassVar[int]
    inode: int
    pool: str
    series_pattern: str
    policy: PrunePolicy
    clear_policy: bool
    def __init__(self, inode: _Optional[int] = ..., pool: _Optional[str] = ..., series_pattern: _Optional[str] = ..., policy: _Optional[_Union[PrunePolicy, _Mapping]] = ..., clear_policy: _Optional[bool] = ...) -> None: ...

class GetFolderSettingsRequest(_message.Message):
    __slots__ = ("inode",)
    INODE_FIELD_NUMBER: _ClassVar[int]
    inode: int
    def __init__(self, inode: _Optional[int] = ...) -> None: ...

class EffectiveSettings(_message.Message):
    __slots__ = ("pool", "pool_from", "series_pattern", "series_pattern_from", "policy", "policy_from")
    POOL_FIELD_NUMBER: _ClassVar[int]
    POOL_FROM_FIELD_NUMBER: _ClassVar[int]
    SERIES_PATTERN_FIELD_NUMBER: _ClassVar[int]
    SERIES_PATTERN_FROM_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_FROM_FIELD_NUMBER: _ClassVar[int]
    pool: str
    pool_from: int
    series_pattern: str
    series_pattern_from: int
    policy: PrunePolicy
    policy_from: int
    def __init__(self, pool: _Optional[str] = ..., pool_from: _Optional[int] = ..., series_pattern: _Optional[str] = ..., series_pattern_from: _Optional[int] = ..., policy: _Optional[_Union[PrunePolicy, _Mapping]] = ..., policy_from: _Optional[int] = ...) -> None: ...

class FolderSettingsReply(_message.Message):
    __slots__ = ("inode", "own", "effective", "path", "prune")
    INODE_FIELD_NUMBER: _ClassVar[int]
    OWN_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PRUNE_FIELD_NUMBER: _ClassVar[int]
    inode: int
    own: FolderSettings
    effective: EffectiveSettings
    path: str
    prune: PruneReport
    def __init__(self, inode: _Optional[int] = ..., own: _Optional[_Union[FolderSettings, _Mapping]] = ..., effective: _Optional[_Union[EffectiveSettings, _Mapping]] = ..., path: _Optional[str] = ..., prune: _Optional[_Union[PruneReport, _Mapping]] = ...) -> None: ...

class ListFolderSettingsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListFolderSettingsResponse(_message.Message):
    __slots__ = ("folders",)
    FOLDERS_FIELD_NUMBER: _ClassVar[int]
    folders: _containers.RepeatedCompositeFieldContainer[FolderSettingsReply]
    def __init__(self, folders: _Optional[_Iterable[_Union[FolderSettingsReply, _Mapping]]] = ...) -> None: ...

class PruneRequest(_message.Message):
    __slots__ = ("inode", "dry_run", "policy")
    INODE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    inode: int
    dry_run: bool
    policy: PrunePolicy
    def __init__(self, inode: _Optional[int] = ..., dry_run: _Optional[bool] = ..., policy: _Optional[_Union[PrunePolicy, _Mapping]] = ...) -> None: ...

class PrunedImage(_message.Message):
    __slots__ = ("path", "inode", "version", "whole_file", "size", "commit_time_ns", "reason")
    PATH_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WHOLE_FILE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    path: str
    inode: int
    version: int
    whole_file: bool
    size: int
    commit_time_ns: int
    reason: str
    def __init__(self, path: _Optional[str] = ..., inode: _Optional[int] = ..., version: _Optional[int] = ..., whole_file: _Optional[bool] = ..., size: _Optional[int] = ..., commit_time_ns: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class PruneReport(_message.Message):
    __slots__ = ("pruned", "dry_run", "files_removed", "versions_removed", "bytes_released", "skipped", "chunks_unreferenced", "bytes_unreferenced", "stored_bytes_unreferenced")
    PRUNED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    FILES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_RELEASED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_UNREFERENCED_FIELD_NUMBER: _ClassVar[int]
    BYTES_UNREFERENCED_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_UNREFERENCED_FIELD_NUMBER: _ClassVar[int]
    pruned: _containers.RepeatedCompositeFieldContainer[PrunedImage]
    dry_run: bool
    files_removed: int
    versions_removed: int
    bytes_released: int
    skipped: _containers.RepeatedScalarFieldContainer[str]
    chunks_unreferenced: int
    bytes_unreferenced: int
    stored_bytes_unreferenced: int
    def __init__(self, pruned: _Optional[_Iterable[_Union[PrunedImage, _Mapping]]] = ..., dry_run: _Optional[bool] = ..., files_removed: _Optional[int] = ..., versions_removed: _Optional[int] = ..., bytes_released: _Optional[int] = ..., skipped: _Optional[_Iterable[str]] = ..., chunks_unreferenced: _Optional[int] = ..., bytes_unreferenced: _Optional[int] = ..., stored_bytes_unreferenced: _Optional[int] = ...) -> None: ...

class PoolRequest(_message.Message):
    __slots__ = ("name", "replication", "stripe_width", "chunker", "write_semantics", "hash_backend", "redundancy", "ec_min_chunk")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    STRIPE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    CHUNKER_FIELD_NUMBER: _ClassVar[int]
    WRITE_SEMANTICS_FIELD_NUMBER: _ClassVar[int]
    HASH_BACKEND_FIELD_NUMBER: _ClassVar[int]
    REDUNDANCY_FIELD_NUMBER: _ClassVar[int]
    EC_MIN_CHUNK_FIELD_NUMBER: _ClassVar[int]
    name: str
    replication: int
    stripe_width: int
    chunker: str
    write_semantics: str
    hash_backend: str
    redundancy: str
    ec_min_chunk: int
    def __init__(self, name: _Optional[str] = ..., replication: _Optional[int] = ..., stripe_width: _Optional[int] = ..., chunker: _Optional[str] = ..., write_semantics: _Optional[str] = ..., hash_backend: _Optional[str] = ..., redundancy: _Optional[str] = ..., ec_min_chunk: _Optional[int] = ...) -> None: ...

class PoolInfo(_message.Message):
    __slots__ = ("settings", "benefactors", "folders", "folder_paths")
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    BENEFACTORS_FIELD_NUMBER: _ClassVar[int]
    FOLDERS_FIELD_NUMBER: _ClassVar[int]
    FOLDER_PATHS_FIELD_NUMBER: _ClassVar[int]
    settings: _common_pb2.PoolSettings
    benefactors: _containers.RepeatedScalarFieldContainer[str]
    folders: _containers.RepeatedScalarFieldContainer[int]
    folder_paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, settings: _Optional[_Union[_common_pb2.PoolSettings, _Mapping]] = ..., benefactors: _Optional[_Iterable[str]] = ..., folders: _Optional[_Iterable[int]] = ..., folder_paths: _Optional[_Iterable[str]] = ...) -> None: ...

class GetPoolRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolInfo]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolInfo, _Mapping]]] = ...) -> None: ...

class DeletePoolRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class MoveBenefactorRequest(_message.Message):
    __slots__ = ("id", "pool")
    ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    id: str
    pool: str
    def __init__(self, id: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class DrainBenefactorRequest(_message.Message):
    __slots__ = ("id", "cancel")
    ID_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    id: str
    cancel: bool
    def __init__(self, id: _Optional[str] = ..., cancel: _Optional[bool] = ...) -> None: ...

class DrainStatusRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DrainStatus(_message.Message):
    __slots__ = ("id", "draining", "alive", "chunks", "pending_chunks", "pending_bytes", "done")
    ID_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    PENDING_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    PENDING_BYTES_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    id: str
    draining: bool
    alive: bool
    chunks: int
    pending_chunks: int
    pending_bytes: int
    done: bool
    def __init__(self, id: _Optional[str] = ..., draining: _Optional[bool] = ..., alive: _Optional[bool] = ..., chunks: _Optional[int] = ..., pending_chunks: _Optional[int] = ..., pending_bytes: _Optional[int] = ..., done: _Optional[bool] = ...) -> None: ...

class RemoveBenefactorRequest(_message.Message):
    __slots__ = ("id", "force")
    ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    force: bool
    def __init__(self, id: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class SnapshotMetadataRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MetadataPart(_message.Message):
    __slots__ = ("data", "total_bytes", "seq", "epoch", "counter", "taken_ms")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    TAKEN_MS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    total_bytes: int
    seq: int
    epoch: int
    counter: int
    taken_ms: int
    def __init__(self, data: _Optional[bytes] = ..., total_bytes: _Optional[int] = ..., seq: _Optional[int] = ..., epoch: _Optional[int] = ..., counter: _Optional[int] = ..., taken_ms: _Optional[int] = ...) -> None: ...

class RecordBackupRequest(_message.Message):
    __slots__ = ("inode", "version", "seq", "epoch", "counter", "taken_ms")
    INODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    TAKEN_MS_FIELD_NUMBER: _ClassVar[int]
    inode: int
    version: int
    seq: int
    epoch: int
    counter: int
    taken_ms: int
    def __init__(self, inode: _Optional[int] = ..., version: _Optional[int] = ..., seq: _Optional[int] = ..., epoch: _Optional[int] = ..., counter: _Optional[int] = ..., taken_ms: _Optional[int] = ...) -> None: ...

class RecordBackupResponse(_message.Message):
    __slots__ = ("name", "benefactors")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BENEFACTORS_FIELD_NUMBER: _ClassVar[int]
    name: str
    benefactors: int
    def __init__(self, name: _Optional[str] = ..., benefactors: _Optional[int] = ...) -> None: ...
