"""The store's small value types (fragment layouts, a write's base, a commit's place in
its write session), the rules that read a chunk record (which copies and fragments are
needed), and the replies built from records."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mosafs._proto import manager_pb2, metadata_pb2
from mosafs.errors import InvalidArgument
from mosafs.ids import ID_LEN
from mosafs.manager import pools
from mosafs.manager.metadata.checks import _check_u64, check_benefactor_id
from mosafs.manager.metadata.schema import MAX_SESSION_BYTES, ChunkEntry


@dataclass(frozen=True)
class Fragments:
    """Where an erasure-coded chunk's K+M fragments are: fragment i is the blob ids[i]
    (its BLAKE3) on benefactor holders[i] ("": not stored, or not known)."""

    k: int
    m: int
    ids: tuple[bytes, ...]
    holders: tuple[str, ...]

    @classmethod
    def of(cls, rec: metadata_pb2.ChunkRecord) -> Fragments | None:
        if not rec.ec_k:
            return None
        return cls(rec.ec_k, rec.ec_m, tuple(bytes(f) for f in rec.fragment_ids),
                   tuple(rec.fragment_holders))


@dataclass(frozen=True)
class Layout:
    """How a chunk record stores its chunk: K+M and the fragment ids (k == 0: whole
    copies). A conversion swaps a record only if it still has the layout it read."""

    k: int = 0
    m: int = 0
    ids: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, rec: metadata_pb2.ChunkRecord) -> Layout:
        if not rec.ec_k:
            return cls()
        return cls(rec.ec_k, rec.ec_m, tuple(bytes(f) for f in rec.fragment_ids))


@dataclass(frozen=True)
class FragmentMove:
    """Fragment `fid`, slot `index` of a chunk, now held by `holder` in place of `old`."""

    index: int
    fid: bytes
    old: str
    holder: str


def check_fragments(cid: bytes, frag: Fragments) -> Fragments:
    """Validate an erasure-coded placement from a peer (InvalidArgument, naming CID)."""
    what = f"erasure-coded chunk {bytes(cid).hex()}"
    if not (1 <= frag.k <= pools.MAX_EC_K and 1 <= frag.m <= pools.MAX_EC_M):
        raise InvalidArgument(f"{what}: ec:{frag.k}+{frag.m} is outside 1..{pools.MAX_EC_K} "
                              f"+ 1..{pools.MAX_EC_M}")
    width = frag.k + frag.m
    if len(frag.ids) != width or len(frag.holders) != width:
        raise InvalidArgument(f"{what}: ec:{frag.k}+{frag.m} needs {width} fragment ids and "
                              f"holders, got {len(frag.ids)} and {len(frag.holders)}")
    for i, fid in enumerate(frag.ids):
        if len(fid) != ID_LEN:
            raise InvalidArgument(f"{what}: fragment {i} id must be {ID_LEN} bytes, got "
                                  f"{len(fid)}")
    named = [h for h in frag.holders if h]
    for bid in named:
        check_benefactor_id(bid)
    if len(set(named)) != len(named):
        raise InvalidArgument(f"{what}: a benefactor holds two of its fragments (each must "
                              f"be on a distinct benefactor)")
    if len(named) < frag.k:
        raise InvalidArgument(f"{what}: {len(named)} fragments stored, at least {frag.k} "
                              f"are needed to read it")
    return Fragments(frag.k, frag.m, tuple(bytes(f) for f in frag.ids), tuple(frag.holders))


def _has_copies(rec: metadata_pb2.ChunkRecord) -> bool:
    """Whether REC names any stored bytes: a whole copy or a fragment."""
    return bool(rec.benefactor_ids) or any(rec.fragment_holders)


def wants_whole_copy(rec: metadata_pb2.ChunkRecord, bid: str) -> bool:
    """Whether a whole copy of referenced chunk REC on benefactor BID is needed: always
    for a chunk kept as copies (a copy the record does not name is counted again:
    reconciliation); for an erasure-coded one only where the record names it, or where
    its fragments are too few to read it (a conversion to fragments leaves the old copies
    to garbage collection, docs/erasure_pools.md)."""
    if not rec.ec_k or bid in rec.benefactor_ids:
        return True
    return sum(bool(h) for h in rec.fragment_holders) < rec.ec_k


def fragment_needed_on(blob: bytes, bid: str, owner: metadata_pb2.ChunkRecord) -> bool:
    """Whether fragment blob BLOB on BID is needed by referenced chunk record OWNER: a
    slot names BID for it, or a slot for it is empty and BID holds no other fragment of
    the chunk (reconciliation records it there). A fragment whose slot another benefactor
    took meanwhile (rebuilt or moved while BID was away) is not."""
    if owner.refcount == 0:
        return False
    slots = list(zip(owner.fragment_ids, owner.fragment_holders, strict=True))
    if any(f == blob and h == bid for f, h in slots):
        return True
    return bid not in owner.fragment_holders and any(f == blob and not h for f, h in slots)


def garbage_since(records: Iterable[metadata_pb2.ChunkRecord | None]) -> int:
    """When the latest of RECORDS (a blob's own record and those it is a fragment of) that
    is unreferenced became garbage (ChunkRecord.unreferenced_ns; 0: none, or not known:
    records from before the field)."""
    return max((r.unreferenced_ns for r in records if r is not None and r.refcount == 0),
               default=0)


def blob_needed_on(blob: bytes, bid: str, rec: metadata_pb2.ChunkRecord | None,
                   owners: Iterable[metadata_pb2.ChunkRecord]) -> bool:
    """Whether blob BLOB stored on benefactor BID must stay: a needed whole copy of its own
    chunk record REC, or a needed fragment of one of OWNERS (the records whose fragments
    include it). Garbage collection releases the rest (after its grace period)."""
    if rec is not None and rec.refcount > 0 and wants_whole_copy(rec, bid):
        return True
    return any(fragment_needed_on(blob, bid, owner) for owner in owners)


@dataclass(frozen=True)
class WriteBase:
    """What a new write of a file dedupes against: its newest committed version."""

    inode: int
    version: int  # 0: none
    size: int
    chunks: list[ChunkEntry] = field(default_factory=list)


@dataclass(frozen=True)
class SessionCommit:
    """How a commit stands in its client's write session (docs/lifecycle.md, Versions).

    PROVISIONAL: committed by fsync, or by a close while the file stays open for writing:
    the session's next commit may replace it. REPLACES_VERSION: this session's provisional
    version that the commit replaces if it is still the file's newest. SESSION: the
    client's random id of its write session, which both need."""

    provisional: bool = False
    replaces_version: int = 0
    session: bytes = b""

    def check(self) -> None:
        _check_u64(self.replaces_version, "replaces_version")
        if len(self.session) > MAX_SESSION_BYTES:
            raise InvalidArgument(f"a write session id has at most {MAX_SESSION_BYTES} "
                                  f"bytes, got {len(self.session)}")
        if (self.provisional or self.replaces_version) and not self.session:
            raise InvalidArgument("a provisional commit, or one that replaces a version, "
                                  "must name its write session")


FINAL_COMMIT = SessionCommit()  # final, replaces nothing: every commit before sessions


def _attr(inode: int, rec: metadata_pb2.InodeRecord) -> manager_pb2.Attr:
    out = manager_pb2.Attr()
    fill_attr(out, inode, rec)
    return out


def fill_attr(out: manager_pb2.Attr, inode: int, rec: metadata_pb2.InodeRecord) -> None:
    """OUT := the attributes of INODE from its record REC, field by field. OUT may be a
    field of a message being built: ReadDir's pages fill their entries in place (building
    an Attr and copying it into its entry, then the entry into the page, was a third of
    the manager's work per entry)."""
    out.inode = inode
    out.kind = rec.kind
    out.mode = rec.mode
    out.nlink = rec.nlink
    out.uid = rec.uid
    out.gid = rec.gid
    out.size = rec.size
    out.atime_ns = rec.atime_ns
    out.mtime_ns = rec.mtime_ns
    out.ctime_ns = rec.ctime_ns
    out.version = rec.newest_version
    out.rdev = rec.rdev


def _location(cid: bytes, rec: metadata_pb2.ChunkRecord,
              named: dict[str, None]) -> manager_pb2.ChunkLocation:
    """Where CID's copies (and fragments) are, as readers get it; the benefactors it names
    are added to NAMED."""
    out = manager_pb2.ChunkLocation(id=cid, benefactor_ids=rec.benefactor_ids,
                                    length=rec.length)
    named.update(dict.fromkeys(rec.benefactor_ids))
    if rec.ec_k:
        out.ec_k, out.ec_m = rec.ec_k, rec.ec_m
        out.fragment_ids.extend(rec.fragment_ids)
        out.fragment_holders.extend(rec.fragment_holders)
        named.update(dict.fromkeys(h for h in rec.fragment_holders if h))
    return out
