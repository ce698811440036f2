from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ChunkRef(_message.Message):
    __slots__ = ("id", "length")
    ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    id: bytes
    length: int
    def __init__(self, id: _Optional[bytes] = ..., length: _Optional[int] = ...) -> None: ...

class BenefactorAddress(_message.Message):
    __slots__ = ("id", "address")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class PoolSettings(_message.Message):
    __slots__ = ("name", "replication", "stripe_width", "chunker", "write_semantics", "hash_backend", "ec_k", "ec_m", "ec_min_chunk")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    STRIPE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    CHUNKER_FIELD_NUMBER: _ClassVar[int]
    WRITE_SEMANTICS_FIELD_NUMBER: _ClassVar[int]
    HASH_BACKEND_FIELD_NUMBER: _ClassVar[int]
    EC_K_FIELD_NUMBER: _ClassVar[int]
    EC_M_FIELD_NUMBER: _ClassVar[int]
    EC_MIN_CHUNK_FIELD_NUMBER: _ClassVar[int]
    name: str
    replication: int
    stripe_width: int
    chunker: str
    write_semantics: str
    hash_backend: str
    ec_k: int
    ec_m: int
    ec_min_chunk: int
    def __init__(self, name: _Optional[str] = ..., replication: _Optional[int] = ..., stripe_width: _Optional[int] = ..., chunker: _Optional[str] = ..., write_semantics: _Optional[str] = ..., hash_backend: _Optional[str] = ..., ec_k: _Optional[int] = ..., ec_m: _Optional[int] = ..., ec_min_chunk: _Optional[int] = ...) -> None: ...
