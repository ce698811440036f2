from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RecoveryRecord(_message.Message):
    __slots__ = ("name", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    data: bytes
    def __init__(self, name: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class PutRecoveryRecordResponse(_message.Message):
    __slots__ = ("kept",)
    KEPT_FIELD_NUMBER: _ClassVar[int]
    kept: int
    def __init__(self, kept: _Optional[int] = ...) -> None: ...

class ListRecoveryRecordsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRecoveryRecordsResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[RecoveryRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[RecoveryRecord, _Mapping]]] = ...) -> None: ...

class ListChunksRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ChunkInventoryPage(_message.Message):
    __slots__ = ("ids", "sizes")
    IDS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[bytes]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[bytes]] = ..., sizes: _Optional[_Iterable[int]] = ...) -> None: ...

class PutChunkRequest(_message.Message):
    __slots__ = ("id", "data")
    ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    data: bytes
    def __init__(self, id: _Optional[bytes] = ..., data: _Optional[bytes] = ...) -> None: ...

class PutChunkResponse(_message.Message):
    __slots__ = ("already_present",)
    ALREADY_PRESENT_FIELD_NUMBER: _ClassVar[int]
    already_present: bool
    def __init__(self, already_present: _Optional[bool] = ...) -> None: ...

class PutChunksRequest(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[PutChunkRequest]
    def __init__(self, chunks: _Optional[_Iterable[_Union[PutChunkRequest, _Mapping]]] = ...) -> None: ...

class PutOutcome(_message.Message):
    __slots__ = ("already_present", "code", "kind", "error")
    ALREADY_PRESENT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    already_present: bool
    code: int
    kind: str
    error: str
    def __init__(self, already_present: _Optional[bool] = ..., code: _Optional[int] = ..., kind: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class PutChunksResponse(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[PutOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[PutOutcome, _Mapping]]] = ...) -> None: ...

class GetChunkRequest(_message.Message):
    __slots__ = ("id", "verify")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    verify: bool
    def __init__(self, id: _Optional[bytes] = ..., verify: _Optional[bool] = ...) -> None: ...

class GetChunkResponse(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class HasChunksRequest(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class HasChunksResponse(_message.Message):
    __slots__ = ("present",)
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    present: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, present: _Optional[_Iterable[bool]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BenefactorInfo(_message.Message):
    __slots__ = ("id", "address", "capacity_bytes", "free_bytes", "chunks", "stored_bytes", "pool")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    capacity_bytes: int
    free_bytes: int
    chunks: int
    stored_bytes: int
    pool: str
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., chunks: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., pool: _Optional[str] = ...) -> None: ...

class ReplicateChunksRequest(_message.Message):
    __slots__ = ("ids", "target_address")
    IDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[bytes]
    target_address: str
    def __init__(self, ids: _Optional[_Iterable[bytes]] = ..., target_address: _Optional[str] = ...) -> None: ...

class ReplicateChunksResponse(_message.Message):
    __slots__ = ("copied", "errors", "target_problem")
    COPIED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    copied: _containers.RepeatedScalarFieldContainer[bool]
    errors: _containers.RepeatedScalarFieldContainer[str]
    target_problem: str
    def __init__(self, copied: _Optional[_Iterable[bool]] = ..., errors: _Optional[_Iterable[str]] = ..., target_problem: _Optional[str] = ...) -> None: ...

class GarbageRoundRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GarbageRound(_message.Message):
    __slots__ = ("reported", "deleted_chunks", "freed_bytes", "waiting_chunks")
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    DELETED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAITING_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    reported: int
    deleted_chunks: int
    freed_bytes: int
    waiting_chunks: int
    def __init__(self, reported: _Optional[int] = ..., deleted_chunks: _Optional[int] = ..., freed_bytes: _Optional[int] = ..., waiting_chunks: _Optional[int] = ...) -> None: ...

class DeleteChunksRequest(_message.Message):
    __slots__ = ("ids", "put_before_ns")
    IDS_FIELD_NUMBER: _ClassVar[int]
    PUT_BEFORE_NS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[bytes]
    put_before_ns: int
    def __init__(self, ids: _Optional[_Iterable[bytes]] = ..., put_before_ns: _Optional[int] = ...) -> None: ...

class DeleteChunksResponse(_message.Message):
    __slots__ = ("deleted_chunks", "freed_bytes")
    DELETED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    deleted_chunks: int
    freed_bytes: int
    def __init__(self, deleted_chunks: _Optional[int] = ..., freed_bytes: _Optional[int] = ...) -> None: ...

class ScrubRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ScrubProgress(_message.Message):
    __slots__ = ("checked_chunks", "checked_bytes", "total_chunks", "total_bytes", "corrupt_chunks", "done", "corrupt_ids")
    CHECKED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHECKED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_IDS_FIELD_NUMBER: _ClassVar[int]
    checked_chunks: int
    checked_bytes: int
    total_chunks: int
    total_bytes: int
    corrupt_chunks: int
    done: bool
    corrupt_ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, checked_chunks: _Optional[int] = ..., checked_bytes: _Optional[int] = ..., total_chunks: _Optional[int] = ..., total_bytes: _Optional[int] = ..., corrupt_chunks: _Optional[int] = ..., done: _Optional[bool] = ..., corrupt_ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class BlobSource(_message.Message):
    __slots__ = ("index", "address", "token")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    index: int
    address: str
    token: bytes
    def __init__(self, index: _Optional[int] = ..., address: _Optional[str] = ..., token: _Optional[bytes] = ...) -> None: ...

class RecodeTarget(_message.Message):
    __slots__ = ("index", "address")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    index: int
    address: str
    def __init__(self, index: _Optional[int] = ..., address: _Optional[str] = ...) -> None: ...

class RecodeChunkRequest(_message.Message):
    __slots__ = ("chunk_id", "length", "copies", "ec_k", "ec_m", "fragment_ids", "fragments", "out_k", "out_m", "targets")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    EC_K_FIELD_NUMBER: _ClassVar[int]
    EC_M_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    OUT_K_FIELD_NUMBER: _ClassVar[int]
    OUT_M_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    chunk_id: bytes
    length: int
    copies: _containers.RepeatedCompositeFieldContainer[BlobSource]
    ec_k: int
    ec_m: int
    fragment_ids: _containers.RepeatedScalarFieldContainer[bytes]
    fragments: _containers.RepeatedCompositeFieldContainer[BlobSource]
    out_k: int
    out_m: int
    targets: _containers.RepeatedCompositeFieldContainer[RecodeTarget]
    def __init__(self, chunk_id: _Optional[bytes] = ..., length: _Optional[int] = ..., copies: _Optional[_Iterable[_Union[BlobSource, _Mapping]]] = ..., ec_k: _Optional[int] = ..., ec_m: _Optional[int] = ..., fragment_ids: _Optional[_Iterable[bytes]] = ..., fragments: _Optional[_Iterable[_Union[BlobSource, _Mapping]]] = ..., out_k: _Optional[int] = ..., out_m: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[RecodeTarget, _Mapping]]] = ...) -> None: ...

class RecodeChunkResponse(_message.Message):
    __slots__ = ("fragment_ids", "stored", "errors", "target_problems", "unreadable")
    FRAGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    fragment_ids: _containers.RepeatedScalarFieldContainer[bytes]
    stored: _containers.RepeatedScalarFieldContainer[bool]
    errors: _containers.RepeatedScalarFieldContainer[str]
    target_problems: _containers.RepeatedScalarFieldContainer[str]
    unreadable: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, fragment_ids: _Optional[_Iterable[bytes]] = ..., stored: _Optional[_Iterable[bool]] = ..., errors: _Optional[_Iterable[str]] = ..., target_problems: _Optional[_Iterable[str]] = ..., unreadable: _Optional[_Iterable[int]] = ...) -> None: ...

class OpenLocalRequest(_message.Message):
    __slots__ = ("ids", "tokens", "put", "put_tickets")
    IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PUT_FIELD_NUMBER: _ClassVar[int]
    PUT_TICKETS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[bytes]
    tokens: _containers.RepeatedScalarFieldContainer[bytes]
    put: bool
    put_tickets: int
    def __init__(self, ids: _Optional[_Iterable[bytes]] = ..., tokens: _Optional[_Iterable[bytes]] = ..., put: _Optional[bool] = ..., put_tickets: _Optional[int] = ...) -> None: ...

class OpenLocalResponse(_message.Message):
    __slots__ = ("socket", "ticket", "host", "ticket_ttl_ms", "more_tickets")
    SOCKET_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    TICKET_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    MORE_TICKETS_FIELD_NUMBER: _ClassVar[int]
    socket: str
    ticket: bytes
    host: str
    ticket_ttl_ms: int
    more_tickets: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, socket: _Optional[str] = ..., ticket: _Optional[bytes] = ..., host: _Optional[str] = ..., ticket_ttl_ms: _Optional[int] = ..., more_tickets: _Optional[_Iterable[bytes]] = ...) -> None: ...
