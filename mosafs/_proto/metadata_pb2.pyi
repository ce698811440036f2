from mosafs._proto import common_pb2 as _common_pb2
from mosafs._proto import manager_pb2 as _manager_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InodeRecord(_message.Message):
    __slots__ = ("kind", "mode", "nlink", "uid", "gid", "atime_ns", "mtime_ns", "ctime_ns", "newest_version", "size", "parent", "symlink_target", "name", "rdev")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    NLINK_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    ATIME_NS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    CTIME_NS_FIELD_NUMBER: _ClassVar[int]
    NEWEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    kind: _manager_pb2.FileKind
    mode: int
    nlink: int
    uid: int
    gid: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    newest_version: int
    size: int
    parent: int
    symlink_target: bytes
    name: bytes
    rdev: int
    def __init__(self, kind: _Optional[_Union[_manager_pb2.FileKind, str]] = ..., mode: _Optional[int] = ..., nlink: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., atime_ns: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., ctime_ns: _Optional[int] = ..., newest_version: _Optional[int] = ..., size: _Optional[int] = ..., parent: _Optional[int] = ..., symlink_target: _Optional[bytes] = ..., name: _Optional[bytes] = ..., rdev: _Optional[int] = ...) -> None: ...

class VersionRecord(_message.Message):
    __slots__ = ("size", "chunks", "shared_chunks", "base_inode", "base_version", "new_bytes", "commit_time_ns", "mtime_ns", "shared_bytes", "stored_chunks", "stored_bytes", "indexed_chunks", "indexed_bytes", "repeated_chunks", "repeated_bytes", "provisional", "session", "stored_entries", "replaced_versions")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SHARED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    BASE_INODE_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEW_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    SHARED_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    INDEXED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    INDEXED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPEATED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    REPEATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROVISIONAL_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    STORED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    REPLACED_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    size: int
    chunks: int
    shared_chunks: int
    base_inode: int
    base_version: int
    new_bytes: int
    commit_time_ns: int
    mtime_ns: int
    shared_bytes: int
    stored_chunks: int
    stored_bytes: int
    indexed_chunks: int
    indexed_bytes: int
    repeated_chunks: int
    repeated_bytes: int
    provisional: bool
    session: bytes
    stored_entries: bytes
    replaced_versions: int
    def __init__(self, size: _Optional[int] = ..., chunks: _Optional[int] = ..., shared_chunks: _Optional[int] = ..., base_inode: _Optional[int] = ..., base_version: _Optional[int] = ..., new_bytes: _Optional[int] = ..., commit_time_ns: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., shared_bytes: _Optional[int] = ..., stored_chunks: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., indexed_chunks: _Optional[int] = ..., indexed_bytes: _Optional[int] = ..., repeated_chunks: _Optional[int] = ..., repeated_bytes: _Optional[int] = ..., provisional: _Optional[bool] = ..., session: _Optional[bytes] = ..., stored_entries: _Optional[bytes] = ..., replaced_versions: _Optional[int] = ...) -> None: ...

class ChunkRecord(_message.Message):
    __slots__ = ("length", "refcount", "benefactor_ids", "pool", "ec_k", "ec_m", "fragment_ids", "fragment_holders", "unreferenced_ns")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    REFCOUNT_FIELD_NUMBER: _ClassVar[int]
    BENEFACTOR_IDS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    EC_K_FIELD_NUMBER: _ClassVar[int]
    EC_M_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    UNREFERENCED_NS_FIELD_NUMBER: _ClassVar[int]
    length: int
    refcount: int
    benefactor_ids: _containers.RepeatedScalarFieldContainer[str]
    pool: str
    ec_k: int
    ec_m: int
    fragment_ids: _containers.RepeatedScalarFieldContainer[bytes]
    fragment_holders: _containers.RepeatedScalarFieldContainer[str]
    unreferenced_ns: int
    def __init__(self, length: _Optional[int] = ..., refcount: _Optional[int] = ..., benefactor_ids: _Optional[_Iterable[str]] = ..., pool: _Optional[str] = ..., ec_k: _Optional[int] = ..., ec_m: _Optional[int] = ..., fragment_ids: _Optional[_Iterable[bytes]] = ..., fragment_holders: _Optional[_Iterable[str]] = ..., unreferenced_ns: _Optional[int] = ...) -> None: ...

class BenefactorRecord(_message.Message):
    __slots__ = ("address", "pool", "capacity_bytes", "free_bytes", "chunks", "registered_ns", "draining", "certificate")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_NS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    address: str
    pool: str
    capacity_bytes: int
    free_bytes: int
    chunks: int
    registered_ns: int
    draining: bool
    certificate: str
    def __init__(self, address: _Optional[str] = ..., pool: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., chunks: _Optional[int] = ..., registered_ns: _Optional[int] = ..., draining: _Optional[bool] = ..., certificate: _Optional[str] = ...) -> None: ...

class PoolRecord(_message.Message):
    __slots__ = ("settings",)
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    settings: _common_pb2.PoolSettings
    def __init__(self, settings: _Optional[_Union[_common_pb2.PoolSettings, _Mapping]] = ...) -> None: ...

class FolderRecord(_message.Message):
    __slots__ = ("settings",)
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    settings: _manager_pb2.FolderSettings
    def __init__(self, settings: _Optional[_Union[_manager_pb2.FolderSettings, _Mapping]] = ...) -> None: ...
