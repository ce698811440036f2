from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FeedAddressRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FeedAddressReply(_message.Message):
    __slots__ = ("port",)
    PORT_FIELD_NUMBER: _ClassVar[int]
    port: int
    def __init__(self, port: _Optional[int] = ...) -> None: ...

class LogOp(_message.Message):
    __slots__ = ("db", "key", "value", "delete")
    DB_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    db: int
    key: bytes
    value: bytes
    delete: bool
    def __init__(self, db: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., delete: _Optional[bool] = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("seq", "epoch", "ops")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    epoch: int
    ops: _containers.RepeatedCompositeFieldContainer[LogOp]
    def __init__(self, seq: _Optional[int] = ..., epoch: _Optional[int] = ..., ops: _Optional[_Iterable[_Union[LogOp, _Mapping]]] = ...) -> None: ...

class FollowHello(_message.Message):
    __slots__ = ("member", "last_seq", "last_epoch")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    member: str
    last_seq: int
    last_epoch: int
    def __init__(self, member: _Optional[str] = ..., last_seq: _Optional[int] = ..., last_epoch: _Optional[int] = ...) -> None: ...

class FollowRequest(_message.Message):
    __slots__ = ("hello", "acked_seq")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    hello: FollowHello
    acked_seq: int
    def __init__(self, hello: _Optional[_Union[FollowHello, _Mapping]] = ..., acked_seq: _Optional[int] = ...) -> None: ...

class SnapshotPart(_message.Message):
    __slots__ = ("offset", "data", "total_bytes", "done", "seq", "epoch")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    total_bytes: int
    done: bool
    seq: int
    epoch: int
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., total_bytes: _Optional[int] = ..., done: _Optional[bool] = ..., seq: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class FollowMessage(_message.Message):
    __slots__ = ("snapshot", "entries", "error")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    snapshot: SnapshotPart
    entries: LogEntries
    error: FeedError
    def __init__(self, snapshot: _Optional[_Union[SnapshotPart, _Mapping]] = ..., entries: _Optional[_Union[LogEntries, _Mapping]] = ..., error: _Optional[_Union[FeedError, _Mapping]] = ...) -> None: ...

class FeedError(_message.Message):
    __slots__ = ("kind", "message")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    message: str
    def __init__(self, kind: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class LogEntries(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, entries: _Optional[_Iterable[bytes]] = ...) -> None: ...
