"""Property-based fuzzing of every RPC under every role (issue 18): a real cluster (`mosafs
up`: a manager, three benefactors and a mount, mutual TLS), files written through the
mount first, then hypothesis drives every RPC of the Manager and Benefactor services
(enumerated from the generated descriptors, so a new RPC is fuzzed without a change here)
with random and extreme values, under the certificate of each role: admin, a client with
full access, a client restricted to /jobA as uid/gid 1000, a benefactor and the manager.

Every answer must be a proper status (OK or a client error), never UNKNOWN, INTERNAL,
DATA_LOSS or a timeout. Afterwards every process serves, `mosafs fsck` is clean, the root
directory lists and takes a new file for root through the mount, every file written before
reads back byte for byte, and no process logged a warning, an error or a traceback.

What the fuzz may not touch, and why: the files written before (the "keep" directory) are
the postcondition's witnesses. Their names are never generated, so no Unlink, Rmdir or
Rename can reach them; their inodes are left out of OpenWrite (a client with write access
may legitimately overwrite a file it may write), and the root and the keep directory out
of SetFolderSettings and Prune (a purge-after policy there would legitimately delete them,
also later, by the manager's own pruning pass). Everything else is fair game for every
role, those inodes included: SetAttr of any value on the root, the keep directory and the
files (root must still list and read them), SetXattr, Link, GetBlockMap, CommitVersion
naming them with another file's lease, RestoreVersion (of their only version: the same
bytes), benefactor registrations, drains, pools, scrub, garbage collection, fsck --repair.
Benefactor ids the fuzz names are never the cluster's own (a RemoveBenefactor of a live
one is refused anyway, a forced removal of a stopped one is what an administrator asks).
Addresses are loopback ports nobody listens on or malformed ones: a benefactor registered
by the fuzz is unreachable, never a host that would make a call wait for DNS or a timeout.
Such a benefactor is a placement target until its lease lapses (5 s), and a write placed
on it fails at close (the mount does not try another benefactor): the mount is used again
once every registration of the fuzz has lapsed. Likewise the default pool's settings, which
an administrator may set to what no write can meet (R above the number of benefactors), are
set back first, as an administrator would.

Requests are drawn from the descriptors: every field, by type and by name (inodes, names,
chunk ids and leases the cluster holds three times in four, else extremes and random
values), unset one time in four, repeated fields empty, short or over the servers' limits;
one request in ten is raw bytes (random, or a string field of invalid UTF-8); some carry
the uid/groups metadata a mount sends, valid or not. Each role has its own fixed seed, so a
run is deterministic as far as the cluster's answers are. MOSAFS_FUZZ_SAMPLES=1 (with -s)
prints one answer of each kind for every RPC and role.
"""

from __future__ import annotations

import json
import os
import random
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor, message_factory
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from mosafs import capability, certs
from mosafs._proto import benefactor_pb2, manager_pb2
from mosafs.certs import SERVER_NAME
from mosafs.ids import chunk_id
from mosafs.manager.metadata import MAX_TIME_NS, MIN_TIME_NS
from mosafs.rpc import security
from tests import harness
from tests.conftest import UpCluster, fuse_available, launch_up

Code = grpc.StatusCode
FD = descriptor.FieldDescriptor
MiB = 1 << 20
EXAMPLES = 16  # per role; every example calls every RPC once
CALL_TIMEOUT = 30.0
# Answers that are never a proper status for a request, whatever it holds: a bug
# (UNKNOWN, INTERNAL), a corrupt answer (DATA_LOSS: nothing here is corrupt), a hang.
BAD_CODES = {Code.UNKNOWN, Code.INTERNAL, Code.DATA_LOSS, Code.DEADLINE_EXCEEDED,
             Code.CANCELLED}
# Role -> the certificate of DATA/tls it calls with ("restricted" is issued here).
ROLES = {"manager": "manager", "benefactor": "benefactor-0", "restricted": "restricted",
         "client": "client", "admin": "admin"}
KEEP = "keep-7fq3Zx"  # names the fuzz never generates (see the docstring)
KEEP_FILES = {"empty.7fq3Zx": 0, "small.7fq3Zx": 100, "multi.7fq3Zx": 3 * MiB + 12345}
ADDRESSES = ["127.0.0.1:1", "127.0.0.1:9", "[::1]:2", "localhost:3", "127.0.0.1:65535",
             "", ":", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:-1",
             "a b:1", "/x:1", "host:port", "x" * 400 + ":1"]
# Ordinary values of string fields that a deep check would only reach with them.
DOMAIN = ["default", "cdc:262144:1048576:4194304", "fixed:1048576", "cdc:1:2:3",
          "pessimistic", "optimistic", "auto", "cpu", "gpu", "oracle", "{name}.{step}",
          "ckpt.{step}", "{step}", "(", "[", "user.a", "user.mosafs.version", "user.",
          "trusted.x", "security.x", "system.posix_acl_access", ".versions", "jobA", "play"]
ODD_STRINGS = ["", "a", ".", "..", "/", "a/b", "/jobA", "\0", "a\0b", " ", "\n", "\t",
               "x" * 255, "x" * 256, "é" * 127 + "x", "é" * 128, "\U0001f642" * 64,
               "\u202e", "\ufeff", "\uffff", "\U0010ffff", "A" * 1000]
ODD_BYTES = [b"", b"\0", bytes(32), b"\xff" * 32, b"x" * 31, b"x" * 33, b"\0" * 4096,
             b"a" * 4095, b"a" * 4096, b"a/b", b"\xc3\x28"]
U32 = [0, 1, 2, 0o777, 0o7777, 0o10000, 0o40755, 0o100644, 0o170000, 1000, 65534, 65535,
       2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1]
U64 = [*U32, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]
MODES = [0, 0o700, 0o755, 0o644, 0o7777, 0o4755, 0o1777, 0o40755, 0o100644, 0o120777,
         0o10000, 0o170000, 2**32 - 1]
I32 = [0, 1, -1, 2**31 - 1, -(2**31)]
I64 = [0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), -(2**63) + 1, MIN_TIME_NS,
       MAX_TIME_NS, MIN_TIME_NS - 1, MAX_TIME_NS + 1, 1_795_000_000 * 10**9]
METADATA = [*[None] * 30, [("mosafs-uid", "0")], [("mosafs-uid", "1000"),
            ("mosafs-gids", "1000")], [("mosafs-uid", "4294967295")],
            [("mosafs-uid", "-1")], [("mosafs-uid", "x")], [("mosafs-gids", "1,2,,3")],
            [("mosafs-uid", "65534"), ("mosafs-gids", ",".join(map(str, range(200))))],
            [("mosafs-uid", "99999999999999999999999")]]
UNSIGNED = {FD.TYPE_UINT32, FD.TYPE_FIXED32, FD.TYPE_UINT64, FD.TYPE_FIXED64}
SIGNED = {FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32, FD.TYPE_INT64, FD.TYPE_SINT64,
          FD.TYPE_SFIXED64}
BITS32 = {FD.TYPE_UINT32, FD.TYPE_FIXED32, FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32}


@dataclass(frozen=True)
class Rpc:
    service: str  # full name, e.g. "mosafs.v1.Manager"
    name: str
    request: descriptor.Descriptor
    response: descriptor.Descriptor
    streaming: bool

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    @property
    def on_manager(self) -> bool:
        return self.service.endswith(".Manager")


def every_rpc() -> list[Rpc]:
    """Every RPC of the two services, from the generated descriptors."""
    out = []
    for module, name in ((manager_pb2, "Manager"), (benefactor_pb2, "Benefactor")):
        service = module.DESCRIPTOR.services_by_name[name]
        for m in service.methods:
            assert not m.client_streaming, f"{m.full_name}: no request streams exist"
            out.append(Rpc(service.full_name, m.name, m.input_type, m.output_type,
                           m.server_streaming))
    return out


RPCS = every_rpc()


@dataclass
class World:
    """What the cluster holds, as far as the fuzz knows: values worth drawing."""

    manager: str
    benefactors: dict[str, str]  # the cluster's own: id -> address (never fuzzed by id)
    keep: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # name -> inode, bytes
    keep_dir: int = 0
    inodes: list[int] = field(default_factory=list)  # every inode known, root included
    names: list[str] = field(default_factory=list)  # names of the sandbox (never KEEP's)
    chunks: list[tuple[bytes, int]] = field(default_factory=list)  # (id, length) stored
    leases: list[int] = field(default_factory=list)
    lease_inodes: dict[int, int] = field(default_factory=dict)  # lease -> its inode
    bids: list[str] = field(default_factory=lambda: ["fuzz-b1", "x", "a" * 128])
    pools: list[str] = field(default_factory=lambda: ["default", "fuzzpool"])
    codes: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    default_pool: Any = None  # PoolSettings of "default" before the fuzz

    @property
    def protected(self) -> set[int]:
        return {self.keep_dir, *(ino for ino, _ in self.keep.values())}

    def remember(self, values: list[Any], value: Any, limit: int = 64) -> None:
        if value not in values:
            values.append(value)
            del values[:-limit]


# --- request strategies --------------------------------------------------------------------

def _pick(known: Callable[[], list[Any]] | list[Any], extremes: list[Any],
          other: st.SearchStrategy[Any] | None = None) -> st.SearchStrategy[Any]:
    """A known value or an extreme one, three times in four; else one of OTHER. KNOWN may
    be a function: what the world holds when the value is drawn. The draw is an index,
    whatever the world holds, so that hypothesis sees the same strategy every time."""
    def choose(i: int) -> Any:
        pool = [*(known() if callable(known) else known), *extremes]
        return pool[i % len(pool)]
    base = st.integers(0, 1023).map(choose)
    return base if other is None else st.one_of(base, base, base, other)


def _inodes(world: World, rpc: Rpc) -> st.SearchStrategy[int]:
    if rpc.name == "OpenWrite":
        return _pick(lambda: [i for i in world.inodes if i not in world.protected],
                     [0, 1, 2**64 - 1], st.integers(0, 2**64 - 1))
    if rpc.name in ("SetFolderSettings", "Prune"):
        return _pick(lambda: [i for i in world.inodes if i not in world.protected | {1}],
                     [0, 2**64 - 1], st.integers(10_000, 2**64 - 1))
    return _pick(lambda: world.inodes, [0, 1, 2**63 - 1, 2**64 - 1],
                 st.integers(0, 2**64 - 1))


def _unsigned(fd: FD, world: World, rpc: Rpc) -> st.SearchStrategy[int]:
    top = 2**32 - 1 if fd.type in BITS32 else 2**64 - 1
    name = fd.name
    if "inode" in name or "parent" in name:
        return _inodes(world, rpc)
    if name == "lease_id":
        return _pick(lambda: world.leases, [0, 1, 2**64 - 1], st.integers(0, top))
    if name == "length":
        return _pick(lambda: [n for _, n in world.chunks], [0, 1, 64 * MiB, 64 * MiB + 1, top],
                     st.integers(0, top))
    if "version" in name:
        return st.sampled_from([0, 1, 2, 3, 7, top])
    if name == "mode":
        return _pick([], MODES, st.integers(0, top))
    if name in ("uid", "gid"):
        return _pick([], [0, 1000, 65534, 2**31, 2**32 - 2, 2**32 - 1], st.integers(0, top))
    if name in ("replication", "stripe_width", "keep_last", "keep_every", "limit"):
        return _pick([], [0, 1, 2, 3, 4, 64, 10_000, 10_001, top], st.integers(0, top))
    extremes = U32 if top < 2**64 - 1 else U64
    return st.one_of(st.sampled_from(extremes), st.integers(0, top))


def _signed(fd: FD) -> st.SearchStrategy[int]:
    if fd.type in BITS32:
        return st.one_of(st.sampled_from(I32), st.integers(-(2**31), 2**31 - 1))
    if fd.name.endswith("_ns"):  # times: mostly where they may be, often at the edges
        return _pick([], I64, st.one_of(st.integers(MIN_TIME_NS, MAX_TIME_NS),
                                         st.integers(-(2**63), 2**63 - 1)))
    return st.one_of(st.sampled_from(I64), st.integers(-(2**63), 2**63 - 1))


def _text() -> st.SearchStrategy[str]:
    # Proto strings are UTF-8: no lone surrogates (invalid UTF-8 goes raw, see _raw).
    return st.text(st.characters(exclude_categories=("Cs",)), max_size=24)


def _string(fd: FD, world: World, rpc: Rpc) -> st.SearchStrategy[str]:
    name = fd.name
    odd = st.one_of(st.sampled_from(ODD_STRINGS + DOMAIN), _text())
    if "address" in name:
        return st.sampled_from(ADDRESSES)
    if name in ("id", "benefactor_id", "benefactor_ids"):
        return _pick(lambda: world.bids, [], odd)
    if name == "pool" or (name == "name" and "Pool" in rpc.name):
        return _pick(lambda: world.pools, [], odd)
    if "Xattr" in rpc.name:
        return _pick(["user.a", "user.b", "user.mosafs.version"], [], odd)
    if name in ("name", "old_name", "new_name", "start_after"):
        return _pick(lambda: world.names, ["new", "n2"], odd)
    return odd


def _bytes(fd: FD, world: World) -> st.SearchStrategy[bytes]:
    odd = st.one_of(st.sampled_from(ODD_BYTES), st.binary(max_size=48))
    if fd.name in ("id", "ids"):
        return _pick(lambda: [c for c, _ in world.chunks], [bytes(32)],
                     st.one_of(odd, st.binary(min_size=32, max_size=32)))
    if fd.name == "value":
        return st.one_of(odd, st.just(b"v" * 65537))
    return odd


def _scalar(fd: FD, world: World, rpc: Rpc, depth: int) -> st.SearchStrategy[Any]:
    if fd.type == FD.TYPE_MESSAGE:
        return _message(fd.message_type, world, rpc, depth + 1)
    if fd.type == FD.TYPE_ENUM:
        return st.sampled_from([v.number for v in fd.enum_type.values] + [99, *I32])
    if fd.type == FD.TYPE_BOOL:
        return st.booleans()
    if fd.type == FD.TYPE_STRING:
        return _string(fd, world, rpc)
    if fd.type == FD.TYPE_BYTES:
        return _bytes(fd, world)
    if fd.type in UNSIGNED:
        return _unsigned(fd, world, rpc)
    if fd.type in SIGNED:
        return _signed(fd)
    return st.floats(allow_nan=True, allow_infinity=True)


def _repeated(element: st.SearchStrategy[Any], depth: int) -> st.SearchStrategy[list[Any]]:
    """Empty, short, or (in a request itself, not inside its repeated parts: lengths would
    multiply) longer than the servers' per-request limits (16384 ids)."""
    def of_length(n: int) -> st.SearchStrategy[list[Any]]:
        if n <= 4:
            return st.lists(element, min_size=n, max_size=n)
        return element.map(lambda x: [x] * n)
    return st.sampled_from([0, 0, 1, 1, 2, 4, 16385] if depth == 0 else [0, 1, 2]).flatmap(
        of_length)


def _message(desc: descriptor.Descriptor, world: World, rpc: Rpc,
             depth: int = 0) -> st.SearchStrategy[Message]:
    cls = message_factory.GetMessageClass(desc)
    if depth > 3:
        return st.just(cls())
    if desc.full_name == "mosafs.v1.ChunkRef":
        # A chunk stored with its true length, three times in four: commits that may pass.
        known = _pick(lambda: world.chunks, []).map(lambda c: cls(id=c[0], length=c[1]))
        return st.one_of(known, known, known, _fields(desc, cls, world, rpc, depth))
    return _fields(desc, cls, world, rpc, depth)


def _fields(desc: descriptor.Descriptor, cls: Any, world: World, rpc: Rpc,
            depth: int) -> st.SearchStrategy[Message]:
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for fd in desc.fields:
        if fd.is_repeated:
            parts[fd.name] = _repeated(_scalar(fd, world, rpc, depth + 1), depth)
        else:  # None: not set (absent, for optionals), one time in four
            value = _scalar(fd, world, rpc, depth)
            parts[fd.name] = st.one_of(value, value, value, st.none())

    def build(values: dict[str, Any]) -> Message:
        msg = cls()
        for fd in desc.fields:
            value = values[fd.name]
            if fd.is_repeated:
                getattr(msg, fd.name).extend(value)
            elif value is None:
                continue
            elif fd.type == FD.TYPE_MESSAGE:
                getattr(msg, fd.name).CopyFrom(value)
            else:
                setattr(msg, fd.name, value)
        return msg
    return st.fixed_dictionaries(parts).map(build)


def _raw(rpc: Rpc, data: st.DataObject) -> bytes:
    """Bytes no well-formed client sends: random, or a string field holding invalid
    UTF-8 (which no proto library would encode)."""
    strings = [fd.number for fd in rpc.request.fields
               if fd.type == FD.TYPE_STRING and fd.number < 16]
    if strings and data.draw(st.booleans(), label="bad utf-8"):
        number = data.draw(st.sampled_from(strings))
        return bytes([number << 3 | 2, 3, 0xFF, 0xFE, 0xC3])
    return data.draw(st.binary(max_size=64), label="raw bytes")


def _shown(msg: Message) -> str:
    """A request for a failure message: its text, shortened (a request with 16385 entries
    takes long to format whole)."""
    short = message_factory.GetMessageClass(msg.DESCRIPTOR)()
    short.CopyFrom(msg)
    for fd in msg.DESCRIPTOR.fields:
        if fd.is_repeated and len(getattr(msg, fd.name)) > 3:
            del getattr(short, fd.name)[3:]
    extra = {fd.name: len(getattr(msg, fd.name)) for fd in msg.DESCRIPTOR.fields
             if fd.is_repeated and len(getattr(msg, fd.name)) > 3}
    text = str(short).replace("\n", " ")[:600]
    return f"{text} (entries: {extra})" if extra else text


def _request(rpc: Rpc, world: World,
             data: st.DataObject) -> tuple[bytes, Callable[[], str]]:
    """The serialized request, and how to show it (for a failure message)."""
    if data.draw(st.sampled_from([False] * 9 + [True]), label="raw?"):
        raw = _raw(rpc, data)
        return raw, lambda: f"raw {raw[:64]!r}"
    msg = data.draw(_message(rpc.request, world, rpc), label=rpc.name)
    if rpc.name == "PutChunk" and data.draw(st.booleans(), label="matching id"):
        msg.id = chunk_id(msg.data)  # type: ignore[attr-defined]
    if rpc.name == "PutChunks" and data.draw(st.booleans(), label="matching ids"):
        for entry in msg.chunks:  # type: ignore[attr-defined]
            entry.id = chunk_id(entry.data)
    if rpc.name == "CommitVersion":  # half the time a lease with its own inode
        lease = data.draw(st.sampled_from([*[None] * 8, *range(8)]), label="own lease")
        if lease is not None and world.leases:
            msg.lease_id = world.leases[lease % len(world.leases)]  # type: ignore[attr-defined]
            msg.inode = world.lease_inodes[msg.lease_id]  # type: ignore[attr-defined]
    return msg.SerializeToString(), lambda: _shown(msg)


# --- the cluster ---------------------------------------------------------------------------

@dataclass
class Fuzz:
    up: UpCluster
    world: World
    channels: dict[tuple[str, str], grpc.Channel]  # (role, address) -> channel
    last_details: str = ""
    samples: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def channel(self, role: str, address: str) -> grpc.Channel:
        key = (role, address)
        if key not in self.channels:
            identity = certs.load(self.up.data_dir / "tls", ROLES[role])
            self.channels[key] = grpc.secure_channel(
                address, security.channel_credentials(identity),
                options=[("grpc.ssl_target_name_override", SERVER_NAME),
                         ("grpc.max_send_message_length", 80 * MiB),
                         ("grpc.max_receive_message_length", 80 * MiB)])
        return self.channels[key]

    def call(self, role: str, rpc: Rpc, payload: bytes, address: str,
             metadata: list[tuple[str, str]] | None = None) -> tuple[Code, bytes | None]:
        """Status code and (unary, OK) the response bytes of one call."""
        ch = self.channel(role, address)
        ident: Callable[[bytes], bytes] = lambda b: b  # noqa: E731
        try:
            if rpc.streaming:
                for _ in ch.unary_stream(rpc.path, request_serializer=ident,
                                         response_deserializer=ident)(
                        payload, timeout=CALL_TIMEOUT, metadata=metadata):
                    pass
                return Code.OK, None
            reply = ch.unary_unary(rpc.path, request_serializer=ident,
                                   response_deserializer=ident)(
                payload, timeout=CALL_TIMEOUT, metadata=metadata)
            return Code.OK, reply
        except grpc.RpcError as exc:
            self.last_details = str(exc.details())  # type: ignore[attr-defined]
            return exc.code(), None  # type: ignore[attr-defined]

    def admin(self, rpc_name: str, request: Message) -> Any:
        rpc = next(r for r in RPCS if r.name == rpc_name and r.on_manager)
        code, reply = self.call("admin", rpc, request.SerializeToString(), self.world.manager)
        assert code == Code.OK, f"{rpc_name} by admin: {code}"
        return message_factory.GetMessageClass(rpc.response).FromString(reply or b"")

    def serving(self) -> None:
        """The manager and every benefactor of the cluster answer; nothing exited."""
        assert self.up.proc.alive(), "mosafs up exited:\n" + self.up.proc.log()[-5000:]
        status = self.admin("GetClusterStatus", manager_pb2.ClusterStatusRequest())
        alive = {b.info.id for b in status.benefactors if b.alive}
        assert set(self.world.benefactors) <= alive, f"benefactors not alive: {status}"
        info = next(r for r in RPCS if r.name == "GetInfo")
        for bid, address in self.world.benefactors.items():
            code, reply = self.call("admin", info, b"", address)
            assert code == Code.OK and reply is not None, f"benefactor {bid}: {code}"
            assert benefactor_pb2.BenefactorInfo.FromString(reply).id == bid

    def learn(self, rpc: Rpc, payload: bytes, reply: bytes | None) -> None:
        """Values of a successful call worth drawing later (new inodes, leases, ids)."""
        world = self.world
        try:
            request = message_factory.GetMessageClass(rpc.request).FromString(payload)
        except Exception:
            return
        if reply is None:
            return
        response = message_factory.GetMessageClass(rpc.response).FromString(reply)
        if rpc.name in ("Create", "Mkdir", "Symlink", "Mknod", "Link"):
            world.remember(world.inodes, response.inode)  # type: ignore[attr-defined]
            world.remember(world.names, getattr(request, "name", "") or
                           getattr(request, "new_name", ""))
        elif rpc.name == "OpenWrite":
            world.remember(world.leases, response.lease_id)  # type: ignore[attr-defined]
            world.lease_inodes[response.lease_id] = request.inode  # type: ignore[attr-defined]
        elif rpc.name == "RegisterBenefactor":
            world.remember(world.bids, request.info.id)  # type: ignore[attr-defined]
        elif rpc.name == "CreatePool":
            world.remember(world.pools, request.name)  # type: ignore[attr-defined]


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzz]:
    reason = fuse_available()
    if reason:
        pytest.skip(reason)
    up = launch_up(tmp_path_factory.mktemp("fuzz"))
    mnt, data = up.mountpoint, up.data_dir
    channels: dict[tuple[str, str], grpc.Channel] = {}
    try:
        certs.issue(data / "tls", "restricted", "client",
                    capability=capability.make(["/jobA"], uids=[1000], gids=[1000]))
        info = json.loads((data / "cluster.json").read_text())
        world = World(manager=info["manager"],
                      benefactors={b["id"]: b["address"] for b in info["benefactors"]})
        rng = random.Random(18)
        (mnt / KEEP).mkdir()
        keep = {name: rng.randbytes(size) for name, size in KEEP_FILES.items()}
        for name, content in keep.items():
            _write(mnt / KEEP / name, content)
        # The sandbox: the restricted client's subtree (owned by its uid) and another.
        for d in ("jobA", "jobA/sub", "play"):
            (mnt / d).mkdir()
        for f, size in (("jobA/f", 200_000), ("jobA/sub/g", 10), ("play/f", 5000)):
            _write(mnt / f, rng.randbytes(size))
        for p in ("jobA", "jobA/sub", "jobA/f", "jobA/sub/g"):
            os.chown(mnt / p, 1000, 1000)
        world.keep_dir = os.stat(mnt / KEEP).st_ino
        world.keep = {n: (os.stat(mnt / KEEP / n).st_ino, c) for n, c in keep.items()}
        world.names = ["jobA", "sub", "f", "g", "play"]
        files = ["jobA/f", "jobA/sub/g", "play/f", *(f"{KEEP}/{n}" for n in keep)]
        world.inodes = [1, *(os.stat(mnt / p).st_ino
                             for p in ("jobA", "jobA/sub", "play", KEEP, *files))]
        fz = Fuzz(up, world, channels)
        for p in files:
            bm = fz.admin("GetBlockMap",
                          manager_pb2.GetBlockMapRequest(inode=os.stat(mnt / p).st_ino))
            for c in bm.chunks:
                world.remember(world.chunks, (bytes(c.id), c.length))
        assert world.chunks, "no chunk stored"
        world.default_pool = fz.admin("GetPool",
                                      manager_pb2.GetPoolRequest(name="default")).settings
        fz.serving()
        yield fz
    finally:
        for ch in channels.values():
            ch.close()
        try:
            up.stop()  # fails on noise of the shutdown too
        finally:
            if os.path.ismount(mnt):
                os.system(f"fusermount3 -u -z {mnt}")


# --- the tests -----------------------------------------------------------------------------

def test_rpc_fuzz_enumerates_every_rpc() -> None:
    names = {(r.service.rsplit(".", 1)[-1], r.name) for r in RPCS}
    assert len(names) == len(RPCS) >= 58
    assert {("Manager", "SetAttr"), ("Manager", "Scrub"), ("Benefactor", "PutChunk"),
            ("Benefactor", "PutChunks"), ("Benefactor", "Scrub")} <= names


@pytest.mark.parametrize("role", list(ROLES))
def test_rpc_fuzz_every_rpc_answers_a_proper_status(fuzz: Fuzz, role: str) -> None:
    world = fuzz.world
    real = sorted(world.benefactors.values())

    @seed(zlib.crc32(role.encode()))  # deterministic, and another sequence per role
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def every_rpc_once(data: st.DataObject) -> None:
        for rpc in RPCS:
            payload, shown = _request(rpc, world, data)
            metadata = data.draw(st.sampled_from(METADATA), label="metadata")
            address = world.manager if rpc.on_manager else data.draw(
                st.sampled_from(real), label="benefactor")
            started = time.monotonic()
            code, reply = fuzz.call(role, rpc, payload, address, metadata)
            took = time.monotonic() - started
            if took > 1 and os.environ.get("MOSAFS_FUZZ_SAMPLES"):
                print(f"SLOW {took:.1f}s {rpc.name} by {role}: {code.name} "
                      f"{fuzz.last_details[:200]} <- {shown()[:300]}")
            seen = world.codes.setdefault((role, rpc.name), {})
            seen[code.name] = seen.get(code.name, 0) + 1
            if code != Code.OK and os.environ.get("MOSAFS_FUZZ_SAMPLES"):
                fuzz.samples.setdefault((role, rpc.name, code.name),
                                        f"{fuzz.last_details[:150]} <- {shown()[:200]}")
            assert code not in BAD_CODES, (
                f"{rpc.name} by {role} ({metadata}) answered {code.name}: {shown()}")
            if code == Code.OK:
                fuzz.learn(rpc, payload, reply)
        fuzz.serving()

    every_rpc_once()


def test_rpc_fuzz_extreme_benefactor_figures(fuzz: Fuzz) -> None:
    """Figures a benefactor states are its own, up to 2^64-1 each: sums over several (the
    capacity StatFs reports) stay within what the protocol carries (they overflowed a
    uint64 into INTERNAL before)."""
    world = fuzz.world
    rpc = next(r for r in RPCS if r.name == "RegisterBenefactor")
    for i in range(2):
        info = benefactor_pb2.BenefactorInfo(id=f"fuzz-huge-{i}", address=f"127.0.0.1:{i + 1}",
                                             capacity_bytes=2**64 - 1, free_bytes=2**64 - 1,
                                             chunks=2**64 - 1, stored_bytes=2**64 - 1)
        request = manager_pb2.RegisterBenefactorRequest(info=info)
        code, _ = fuzz.call("benefactor", rpc, request.SerializeToString(), world.manager)
        assert code == Code.OK
        world.remember(world.bids, info.id)
    for role in ("client", "admin", "restricted"):
        for name in ("StatFs", "GetClusterStatus", "ListBenefactors", "ListPools"):
            call = next(r for r in RPCS if r.name == name and r.on_manager)
            code, _ = fuzz.call(role, call, b"", world.manager)
            assert code == Code.OK, f"{name} by {role}: {code.name} {fuzz.last_details}"
    statfs = fuzz.admin("StatFs", manager_pb2.StatFsRequest())
    assert statfs.capacity_bytes == statfs.free_bytes == 2**64 - 1


@pytest.mark.parametrize("role", ["admin", "client"])
def test_rpc_fuzz_setattr_of_the_root_and_the_files(fuzz: Fuzz, role: str) -> None:
    """SetAttr of any values on the root, the keep directory and its files: each answer is
    a proper status, and what GetAttr gives back after an accepted one is what stat,
    chmod and chown can handle (docs/metadata.md, "Attribute values")."""
    world = fuzz.world
    rpc = next(r for r in RPCS if r.name == "SetAttr")
    targets = [1, world.keep_dir, *(ino for ino, _ in world.keep.values())]

    @seed(zlib.crc32(b"setattr " + role.encode()))
    @settings(max_examples=40, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def setattr_once(data: st.DataObject) -> None:
        request = data.draw(_message(rpc.request, world, rpc), label="SetAttr")
        request.inode = data.draw(st.sampled_from(targets), label="inode")  # type: ignore[attr-defined]
        code, reply = fuzz.call(role, rpc, request.SerializeToString(), world.manager)
        assert code not in BAD_CODES, f"SetAttr by {role}: {code.name} {request}"
        if code != Code.OK:
            return
        attr = fuzz.admin("GetAttr", manager_pb2.GetAttrRequest(inode=request.inode))  # type: ignore[attr-defined]
        assert attr == manager_pb2.Attr.FromString(reply or b"")
        assert 0 <= attr.mode <= 0o7777 and attr.uid < 2**32 - 1 and attr.gid < 2**32 - 1
        assert all(MIN_TIME_NS <= t <= MAX_TIME_NS
                   for t in (attr.atime_ns, attr.mtime_ns, attr.ctime_ns))
        if attr.inode == 1:
            assert attr.kind == manager_pb2.FILE_KIND_DIRECTORY and attr.mode & 0o700 == 0o700

    setattr_once()


def _through_the_mount(world: World, mnt: Path) -> None:
    """Root lists the root directory, makes a file in it and reads it back; every file
    written before reads back byte for byte."""
    # The kernel may hold the root's attributes from before the fuzz for the attribute
    # timeout: they are asked again after.
    time.sleep(1.5)
    names = os.listdir(mnt)
    assert KEEP in names
    probe = mnt / "probe-after-fuzz"
    _write(probe, b"still usable")
    assert probe.read_bytes() == b"still usable"
    probe.unlink()
    for name, (ino, content) in world.keep.items():
        path = mnt / KEEP / name
        assert os.stat(path).st_ino == ino
        assert path.read_bytes() == content, f"{name} does not read back"
    # Times out of the range a mount stores are clamped into it, as Linux does.
    small = mnt / KEEP / "small.7fq3Zx"
    os.utime(small, ns=(-30610224000 * 10**9, 2**70))
    st_small = os.stat(small)
    assert (st_small.st_atime_ns, st_small.st_mtime_ns) == (MIN_TIME_NS, MAX_TIME_NS)


def test_rpc_fuzz_leaves_the_cluster_sound(fuzz: Fuzz) -> None:
    """After the fuzz (or on its own): every process serves, fsck is clean, the root
    directory is usable by root through the mount and every file reads back."""
    world, mnt = fuzz.world, fuzz.up.mountpoint
    fuzz.serving()
    done = harness.cli("fsck", "--data-dir", str(fuzz.up.data_dir), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["findings"] == []
    # The fuzz may have set the default pool as an administrator may (R above the number
    # of benefactors: every write fails at close); an administrator sets it back.
    pool = world.default_pool
    fuzz.admin("UpdatePool", manager_pb2.PoolRequest(
        name="default", replication=pool.replication, stripe_width=pool.stripe_width,
        chunker=pool.chunker, write_semantics=pool.write_semantics,
        hash_backend=pool.hash_backend))
    # Benefactors the fuzz registered (unreachable addresses) are placement targets until
    # their lease lapses (5 s without a heartbeat); a write placed on one fails at close
    # (EIO: the mount does not try another benefactor), so the mount is used after that.
    deadline = time.monotonic() + 30
    while True:
        status = fuzz.admin("ListBenefactors", manager_pb2.ListBenefactorsRequest())
        if {b.info.id for b in status.benefactors if b.alive} <= set(world.benefactors):
            break
        assert time.monotonic() < deadline, f"registrations of the fuzz still alive: {status}"
        time.sleep(0.5)
    try:
        _through_the_mount(world, mnt)
    except (OSError, AssertionError) as exc:
        pools = fuzz.admin("ListPools", manager_pb2.ListPoolsRequest())
        benefactors = fuzz.admin("ListBenefactors", manager_pb2.ListBenefactorsRequest())
        mount_log = (fuzz.up.data_dir / "logs" / "mount.log").read_text()[-4000:]
        raise AssertionError(f"{exc!r}\npools: {pools}\nbenefactors: {benefactors}\n"
                             f"root: {fuzz.admin('GetAttr', manager_pb2.GetAttrRequest(inode=1))}"
                             f"\nmount log: {mount_log}") from exc
    noise = fuzz.up.proc.noise()
    assert not noise, "noise in the logs:\n" + "\n".join(noise[:50])
    for (role, name), seen in sorted(world.codes.items()):  # with -s: what the fuzz got
        print(f"{role:10} {name:20} {seen}")
    if os.environ.get("MOSAFS_FUZZ_SAMPLES"):
        for key, sample in sorted(fuzz.samples.items()):
            print(*key, sample)

