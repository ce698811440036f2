"""Folder settings and what they decide (docs/lifecycle.md): the pool a new write uses,
the version it dedupes against (the newest file of its series), and which checkpoint
images pruning removes.

A directory may set a pool, a series pattern and a pruning policy (LMDB `folders`:
u64be directory inode -> FolderRecord). Each setting a directory does not set is
inherited from its parent, up to the root; past the root the built-in defaults apply
(pool "default", pattern `{app}.{node}.{step}`, keep-all). A regular file belongs to the
folder of its name (InodeRecord.parent/.name, docs/metadata.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from mosafs._proto import manager_pb2, metadata_pb2
from mosafs.errors import InvalidArgument, NotADirectory, NotFound
from mosafs.manager import pools, pruning, series
from mosafs.manager.metadata import (
    DIRECTORY,
    REGULAR,
    ROOT_INODE,
    MetadataStore,
    Tx,
    WriteBase,
)

log = logging.getLogger(__name__)
# Which of some directories a caller may see (mosafs.manager.permissions.Guard.seen_by):
# listings of folders leave out the others.
Seen = Callable[[Sequence[int]], list[int]]


@dataclass(frozen=True)
class Effective:
    """A folder's settings after inheritance; *_from: the directory that set each (0: the
    built-in default)."""

    pool: str = pools.DEFAULT_POOL
    pool_from: int = 0
    pattern: str = series.DEFAULT_PATTERN
    pattern_from: int = 0
    policy: pruning.Policy = field(default_factory=pruning.Policy)
    policy_from: int = 0


@dataclass(frozen=True)
class WriteContext:
    """What OpenWrite needs to know about a file: its folder, pool and base version."""

    folder: int  # 0: no known folder (the defaults apply)
    pool: str
    base: WriteBase


@dataclass
class PruneResult:
    pruned: list[manager_pb2.PrunedImage] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    # The directories pruned, and of those the soonest a purge-after rule removes another
    # image in each that has one.
    examined: list[int] = field(default_factory=list)
    expiries: dict[int, int] = field(default_factory=dict)
    # Chunks left without a reference (what `mosafs gc` deletes): count, bytes (one copy),
    # bytes on the benefactors (every copy).
    chunks_unreferenced: int = 0
    bytes_unreferenced: int = 0
    stored_bytes_unreferenced: int = 0
    # A dry run changes nothing: the references earlier folders of the pass would drop.
    _dropped: Counter[bytes] = field(default_factory=Counter)

    @property
    def next_expiry_ns(self) -> int | None:
        """The soonest a purge-after rule removes another image (None: none will)."""
        return min(self.expiries.values(), default=None)

    def report(self, dry_run: bool) -> manager_pb2.PruneReport:
        return manager_pb2.PruneReport(
            pruned=self.pruned, dry_run=dry_run, skipped=self.skipped,
            files_removed=len({i.inode for i in self.pruned if i.whole_file}),
            versions_removed=len(self.pruned),
            bytes_released=sum(i.size for i in self.pruned),
            chunks_unreferenced=self.chunks_unreferenced,
            bytes_unreferenced=self.bytes_unreferenced,
            stored_bytes_unreferenced=self.stored_bytes_unreferenced)

    def count_unreferenced(self, tx: Tx, released: Counter[bytes], *, dry_run: bool) -> None:
        """Count the chunks whose last references RELEASED (chunk id -> references the
        removals drop) takes, before the removals are applied."""
        for cid, count in released.items():
            rec = tx.chunk(cid)
            if rec is None:
                continue
            earlier = self._dropped[cid] if dry_run else 0
            if dry_run:
                self._dropped[cid] += count
            if rec.refcount - earlier - count > 0:
                continue  # a kept version still references it
            self.chunks_unreferenced += 1
            self.bytes_unreferenced += rec.length
            self.stored_bytes_unreferenced += rec.length * len(rec.benefactor_ids)


class _Listing:
    """The regular files of one folder as pruning sees them, in one transaction: their
    images grouped by series, and the files pruning must leave alone (open for writing,
    hard-linked). Those still count as steps of their series (so timing cannot make
    pruning count fewer steps than there are), but none of their versions is removed."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.groups: dict[tuple[object, ...], list[pruning.Image]] = defaultdict(list)
        self.names: dict[int, bytes] = {}
        self.sizes: dict[tuple[int, int], int] = {}
        self.versions: Counter[int] = Counter()  # inode -> versions it keeps
        self.going: Counter[int] = Counter()     # inode -> versions chosen to go
        self.protected: dict[int, str] = {}      # inode -> why it is left alone
        self._listed: set[int] = set()           # protected files already in skipped

    @classmethod
    def read(cls, tx: Tx, folder: int, pattern: series.Pattern,
             busy: frozenset[int]) -> _Listing:
        listing = cls(tx.path_of(folder).rstrip("/"))
        for raw, child in list(tx.entries(folder, b"")):
            rec = tx.find_inode(child)
            if rec is None or rec.kind != REGULAR or not rec.newest_version:
                continue
            if child in listing.names:
                continue  # a second name of a hard-linked file: weighed once, never removed
            if rec.nlink <= 1 and tx.origin(child) != (folder, raw):
                # Named here, but of no folder (the name it was made under went while
                # another link stayed, docs/metadata.md): the defaults apply to it, not
                # this folder's policy, as for its writes (write_context).
                continue
            if child in busy:
                listing.protected[child] = "open for writing"
            elif rec.nlink > 1:
                listing.protected[child] = "hard-linked"
            listing._add(child, raw, rec.newest_version, pattern.match(raw.decode("utf-8")),
                         tx.versions_of(child))
        return listing

    def _add(self, inode: int, raw: bytes, newest: int, match: series.SeriesName | None,
             versions: Iterable[tuple[int, metadata_pb2.VersionRecord]]) -> None:
        self.names[inode] = raw
        key: tuple[object, ...] = ("series", *match.key) if match else ("file", inode)
        for version, vrec in versions:
            self.sizes[(inode, version)] = vrec.size
            self.versions[inode] += 1
            step = match.step if match else version
            self.groups[key].append(pruning.Image(inode, version, step, vrec.commit_time_ns,
                                                  newest=version == newest))

    def path(self, inode: int) -> str:
        return f"{self.prefix}/{self.names[inode].decode('utf-8')}"

    def spare_protected(self, chosen: list[tuple[pruning.Image, str]],
                        result: PruneResult) -> list[tuple[pruning.Image, str]]:
        """CHOSEN without the images of protected files (each listed as skipped once)."""
        out = []
        for image, reason in chosen:
            why = self.protected.get(image.inode)
            if why is None:
                out.append((image, reason))
                self.going[image.inode] += 1
            elif image.inode not in self._listed:
                self._listed.add(image.inode)
                result.skipped.append(f"{self.path(image.inode)}: {why}")
        return out

    def all_go(self, inode: int) -> bool:
        return self.going[inode] == self.versions[inode]

    @staticmethod
    def released(tx: Tx, removed: list[tuple[pruning.Image, str]]) -> Counter[bytes]:
        """Chunk id -> references the REMOVED images hold."""
        refs: Counter[bytes] = Counter()
        for image, _ in removed:
            refs.update(cid for cid, _ in tx.blockmap(image.inode, image.version))
        return refs


def policy_of(message: manager_pb2.PrunePolicy) -> pruning.Policy:
    return pruning.Policy(message.keep_last, message.keep_every, message.purge_after_ms)


def policy_message(policy: pruning.Policy) -> manager_pb2.PrunePolicy:
    return manager_pb2.PrunePolicy(keep_last=policy.keep_last, keep_every=policy.keep_every,
                                   purge_after_ms=policy.purge_after_ms)


def effective(tx: Tx, directory: int) -> Effective:
    """Settings of DIRECTORY after inheritance (walking parent pointers up to the root)."""
    pool = pattern = policy = None
    ino, seen = directory, set()
    while ino and ino not in seen:
        seen.add(ino)
        own = tx.folder(ino)
        if own is not None:
            if pool is None and own.HasField("pool"):
                pool = (own.pool, ino)
            if pattern is None and own.HasField("series_pattern"):
                pattern = (own.series_pattern, ino)
            if policy is None and own.HasField("policy"):
                policy = (policy_of(own.policy), ino)
        rec = tx.find_inode(ino)
        if ino == ROOT_INODE or rec is None:
            break
        ino = rec.parent
    default = Effective()
    return Effective(*(pool or (default.pool, 0)), *(pattern or (default.pattern, 0)),
                     *(policy or (default.policy, 0)))


class Folders:
    def __init__(self, store: MetadataStore, *, clock_ns: Callable[[], int] = time.time_ns):
        self._store = store
        self._clock_ns = clock_ns
        # Held around each folder's pruning transaction, and by Manager.open_write from
        # its look at a file to its lease: pruning sees every write opened before it.
        self.pruning = threading.Lock()

    # --- settings -------------------------------------------------------------------------

    def get(self, inode: int) -> manager_pb2.FolderSettingsReply:
        with self._store.transaction() as tx:
            self._directory(tx, inode)
            return self._reply(tx, inode)

    def set(self, inode: int, *, pool: str | None = None, series_pattern: str | None = None,
            policy: pruning.Policy | None = None,
            clear_policy: bool = False) -> manager_pb2.FolderSettingsReply:
        """Change what directory INODE sets itself; "" for POOL or SERIES_PATTERN (and
        CLEAR_POLICY) makes it inherit that setting again."""
        if series_pattern:
            series.check_pattern(series_pattern)
        if policy is not None:
            pruning.check_policy(policy)
        with self._store.transaction(write=True) as tx:
            self._directory(tx, inode)
            own = tx.folder(inode) or manager_pb2.FolderSettings()
            if pool is not None:
                if pool and tx.pool(pool) is None:
                    raise NotFound(f"no pool {pool!r} (mosafs pool list)")
                if pool:
                    own.pool = pool
                else:
                    own.ClearField("pool")
            if series_pattern is not None:
                if series_pattern:
                    own.series_pattern = series_pattern
                else:
                    own.ClearField("series_pattern")
            if clear_policy:
                own.ClearField("policy")
            elif policy is not None:
                own.policy.CopyFrom(policy_message(policy))
                own.policy.SetInParent()  # keep-all (all zero) is a setting too
            tx.put_folder(inode, own)
            return self._reply(tx, inode)

    def all(self, seen: Seen | None = None) -> list[manager_pb2.FolderSettingsReply]:
        """Every directory that sets something itself, by inode; with SEEN, only those it
        keeps (the ones a restricted caller may see, mosafs.manager.permissions)."""
        with self._store.transaction() as tx:
            inodes = [ino for ino, _ in tx.folders()]
        if seen is not None:
            inodes = seen(inodes)
        with self._store.transaction() as tx:
            return [self._reply(tx, ino) for ino in inodes if tx.find_inode(ino) is not None]

    @staticmethod
    def _directory(tx: Tx, inode: int) -> None:
        rec = tx.inode(inode)
        if rec.kind != DIRECTORY:
            raise NotADirectory(f"inode {inode} is not a directory: pools, series patterns "
                                f"and policies are set on folders")

    @staticmethod
    def _reply(tx: Tx, inode: int) -> manager_pb2.FolderSettingsReply:
        eff = effective(tx, inode)
        out = manager_pb2.FolderSettingsReply(inode=inode, path=tx.path_of(inode))
        out.own.CopyFrom(tx.folder(inode) or manager_pb2.FolderSettings())
        out.effective.CopyFrom(manager_pb2.EffectiveSettings(
            pool=eff.pool, pool_from=eff.pool_from, series_pattern=eff.pattern,
            series_pattern_from=eff.pattern_from, policy=policy_message(eff.policy),
            policy_from=eff.policy_from))
        return out

    # --- writes ---------------------------------------------------------------------------

    def write_context(self, inode: int) -> WriteContext:
        """The folder, pool and base version of a new write of regular file INODE: its own
        newest version, else the most recently committed file of its series (DESIGN §3)."""
        with self._store.transaction() as tx:
            rec = tx.regular_file(inode)
            origin = tx.origin(inode)
            folder = origin[0] if origin else 0
            eff = effective(tx, folder) if folder else Effective()
            pool = eff.pool if tx.pool(eff.pool) is not None else pools.DEFAULT_POOL
            if rec.newest_version:
                base = WriteBase(inode, rec.newest_version, rec.size,
                                 tx.blockmap(inode, rec.newest_version))
            elif origin is not None:
                base = self._series_base(tx, inode, folder, origin[1], eff.pattern)
            else:
                base = WriteBase(inode, 0, 0)
            return WriteContext(folder, pool, base)

    @staticmethod
    def _series_base(tx: Tx, inode: int, folder: int, raw: bytes, template: str) -> WriteBase:
        pattern = series.compile_pattern(template)
        mine = pattern.match(raw.decode("utf-8"))
        if mine is None:
            return WriteBase(inode, 0, 0)
        best: tuple[int, int, int] | None = None  # (commit time, inode, version)
        for name, child in tx.entries(folder, b""):
            if child == inode:
                continue
            other = pattern.match(name.decode("utf-8"))
            if other is None or other.key != mine.key:
                continue
            crec = tx.find_inode(child)
            if crec is None or crec.kind != REGULAR or not crec.newest_version:
                continue
            committed = tx.version(child, crec.newest_version).commit_time_ns
            if best is None or committed > best[0]:
                best = (committed, child, crec.newest_version)
        if best is None:
            return WriteBase(inode, 0, 0)
        _, child, version = best
        return WriteBase(child, version, tx.version(child, version).size,
                         tx.blockmap(child, version))

    # --- pruning --------------------------------------------------------------------------

    def prune(self, folder: int = 0, *, dry_run: bool = False,
              busy: Callable[[], frozenset[int]] = frozenset,
              policy: pruning.Policy | None = None, subtree: bool = True) -> PruneResult:
        """Apply the pruning policies of FOLDER and its subfolders that inherit from it
        (0: every folder with a policy, and the folders that inherit it; not SUBTREE:
        FOLDER alone) now, one write transaction per folder. Files in BUSY() (an open
        write lease; asked again in each folder's transaction, since a pass over many
        folders takes a while and a write opened meanwhile must find its file) and
        hard-linked files are left alone. DRY_RUN changes nothing;
        with POLICY (dry runs of one folder only) that policy is weighed instead."""
        if policy is not None:
            pruning.check_policy(policy)
            if not (dry_run and folder):
                raise InvalidArgument("a policy to weigh needs a folder and a dry run")
        result = PruneResult()
        targets = self._targets(folder) if subtree or not folder else self._alone(folder)
        for directory in targets:
            with self.pruning, self._store.transaction(write=not dry_run) as tx:
                if tx.find_inode(directory) is None:
                    continue  # removed since the targets were listed
                self._prune_folder(tx, directory, result, dry_run=dry_run, busy=busy,
                                   policy=policy)
            result.examined.append(directory)
        return result

    def _alone(self, folder: int) -> list[int]:
        """[FOLDER] if its effective policy prunes anything, else nothing to do: a commit
        in a keep-all folder costs one read of its settings and its ancestors', not a
        write transaction (before, it walked FOLDER's whole subtree)."""
        with self._store.transaction() as tx:
            if tx.find_inode(folder) is None:
                return []
            return [] if effective(tx, folder).policy.keeps_all else [folder]

    def _targets(self, folder: int) -> list[int]:
        """The directories to prune: FOLDER and its subfolders that inherit its policy, or
        every directory whose effective policy is not keep-all (the folders setting one and
        their subtrees that inherit it)."""
        with self._store.transaction() as tx:
            if folder:
                self._directory(tx, folder)
                return list(self._inheriting(tx, folder))
            roots = [ino for ino, own in list(tx.folders()) if own.HasField("policy")
                     and not policy_of(own.policy).keeps_all]
            out: list[int] = []
            for root in roots:
                out.extend(self._inheriting(tx, root))
            return out

    @staticmethod
    def _inheriting(tx: Tx, root: int) -> Iterator[int]:
        """ROOT and its subdirectories that do not set a policy of their own (below one
        that does, its own walk covers them)."""
        stack = [root]
        while stack:
            ino = stack.pop()
            yield ino
            for _, child in tx.entries(ino, b""):
                crec = tx.find_inode(child)
                if crec is None or crec.kind != DIRECTORY:
                    continue
                own = tx.folder(child)
                if own is None or not own.HasField("policy"):
                    stack.append(child)

    def _prune_folder(self, tx: Tx, folder: int, result: PruneResult, *, dry_run: bool,
                      busy: Callable[[], frozenset[int]],
                      policy: pruning.Policy | None) -> None:
        eff = effective(tx, folder)
        rules = eff.policy if policy is None else policy
        if rules.keeps_all:
            return
        now = self._clock_ns()
        listing = _Listing.read(tx, folder, series.compile_pattern(eff.pattern), busy())
        removed: list[tuple[pruning.Image, str]] = []
        for images in listing.groups.values():
            chosen = pruning.select(images, rules, now)
            removed.extend(listing.spare_protected(chosen, result))
            self._note_expiry(folder, images, chosen, rules, result)
        result.count_unreferenced(tx, listing.released(tx, removed), dry_run=dry_run)
        for image, reason in removed:
            self._remove(tx, folder, listing, image, reason, result, dry_run=dry_run, now=now)

    @staticmethod
    def _remove(tx: Tx, folder: int, listing: _Listing, image: pruning.Image, reason: str,
                result: PruneResult, *, dry_run: bool, now: int) -> None:
        """Remove one chosen image: a file all of whose versions go loses its name (and
        with it every version: drop_file) with its newest; otherwise single versions go."""
        whole = listing.all_go(image.inode)
        result.pruned.append(manager_pb2.PrunedImage(
            path=listing.path(image.inode), inode=image.inode, version=image.version,
            whole_file=whole, size=listing.sizes[(image.inode, image.version)],
            commit_time_ns=image.commit_time_ns, reason=reason))
        if dry_run:
            return
        if not whole:
            tx.drop_version(image.inode, image.version)
        elif image.newest:
            MetadataStore.remove_name(tx, folder, listing.names[image.inode], image.inode, now)

    @staticmethod
    def _note_expiry(folder: int, images: list[pruning.Image],
                     chosen: list[tuple[pruning.Image, str]], policy: pruning.Policy,
                     result: PruneResult) -> None:
        if not policy.purge_after_ms:
            return
        gone = {(i.inode, i.version) for i, _ in chosen}
        left = [i.commit_time_ns for i in images if (i.inode, i.version) not in gone]
        if left:
            expiry = min(left) + policy.purge_after_ms * 1_000_000
            result.expiries[folder] = min(expiry, result.expiries.get(folder, expiry))
