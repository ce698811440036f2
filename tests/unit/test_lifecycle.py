"""The checkpoint lifecycle in the manager's domain, on a real LMDB store: series patterns,
the pruning rules, folder settings and their inheritance, the series base of a new write,
pruning itself, versions and restore, pools, benefactor moves, drains and removal, and the
fsck findings of the new metadata."""

from __future__ import annotations

import pytest

from mosafs._proto import manager_pb2
from mosafs.errors import (
    AlreadyExists,
    ConfigError,
    FailedPrecondition,
    InvalidArgument,
    NoSpace,
    NotADirectory,
    NotFound,
    NotPermitted,
)
from mosafs.manager import pools
from mosafs.manager.core import Manager
from mosafs.manager.fsck import fsck
from mosafs.manager.metadata import ROOT_INODE, MetadataStore
from mosafs.manager.pruning import Image, Policy, check_policy, format_ms, select
from mosafs.manager.redundancy_view import Redundancy
from mosafs.manager.replication import Replicator
from mosafs.manager.series import DEFAULT_PATTERN, compile_pattern
from tests.unit.managers import Clock, cid, commit, consistent, new_file, register

S = 1_000_000_000  # ns


# --- series patterns ------------------------------------------------------------------------

def test_unit_default_series_pattern_is_app_node_step() -> None:
    pattern = compile_pattern(DEFAULT_PATTERN)
    hit = pattern.match("app.n0.12")
    assert hit is not None and (hit.key, hit.step) == (("app", "n0"), 12)
    other = pattern.match("my.app.n0.3")
    assert other is not None and other.step == 3
    assert pattern.match("my.app.n0.4").key == other.key  # type: ignore[union-attr]
    for name in ("app.n0", "app.n0.x", "app.n0.1.tmp", "notes.txt", "app..1"):
        assert pattern.match(name) is None, name


def test_unit_custom_series_pattern_with_literal_braces() -> None:
    pattern = compile_pattern("{run}_{rank}_{step}.ckpt{{v}}")
    hit = pattern.match("lulesh_7_00120.ckpt{v}")
    assert hit is not None and (hit.key, hit.step) == (("lulesh", "7"), 120)
    assert pattern.match("lulesh_7_120.ckpt") is None


@pytest.mark.parametrize("template, why", [
    ("{app}.{node}", "exactly once"),
    ("{step}.{step}", "exactly once"),
    ("{app}.{app}.{step}", "twice"),
    ("{App}.{step}", "bad placeholder"),
    ("{app!r}.{step}", "bad placeholder"),
    ("{app:>3}.{step}", "bad placeholder"),
    ("{app.{step}", "literal braces"),
    ("a/{step}", "no '/'"),
    ("", "1.."),
    ("x" * 300 + "{step}", "1.."),
])
def test_unit_bad_series_patterns_are_config_errors(template: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        compile_pattern(template)


# --- pruning rules --------------------------------------------------------------------------

def steps(*numbers: int, age_s: int = 0, now: int = 100 * S) -> list[Image]:
    """One image per step (each its own file, version 1), committed a second apart."""
    return [Image(inode=n, version=1, step=n, commit_time_ns=now - age_s * S - (100 - n) * S,
                  newest=True) for n in numbers]


def gone(images: list[Image], policy: Policy, now: int = 100 * S) -> list[int]:
    return sorted(image.step for image, _ in select(images, policy, now))


def test_unit_keep_all_and_keep_last() -> None:
    images = steps(1, 2, 3, 4, 5, 6)
    assert gone(images, Policy()) == []
    assert gone(images, Policy(keep_last=2)) == [1, 2, 3, 4]
    assert gone(images, Policy(keep_last=10)) == []
    reasons = {reason for _, reason in select(images, Policy(keep_last=2), 100 * S)}
    assert reasons == {"keep-last 2"}


def test_unit_keep_every_keeps_multiples_on_top_of_the_last() -> None:
    images = steps(*range(1, 13))
    assert gone(images, Policy(keep_last=2, keep_every=5)) == [1, 2, 3, 4, 6, 7, 8, 9]


def test_unit_purge_after_removes_old_images_whatever_else_says() -> None:
    images = steps(1, 2, 3, 4, 5, 6)  # step n committed (100 - n) s before now
    assert gone(images, Policy(purge_after_ms=96_500)) == [1, 2, 3]
    assert gone(images, Policy(keep_last=2, purge_after_ms=95_500)) == [1, 2, 3, 4]
    assert gone(images, Policy(keep_last=5, purge_after_ms=92_000)) == [1, 2, 3, 4, 5, 6]


def test_unit_versions_of_one_file_go_oldest_first() -> None:
    """A file of its own: its versions are the series, the version number is the step."""
    images = [Image(7, v, v, v * S, newest=v == 4) for v in (1, 2, 3, 4)]
    assert [(i.version, r) for i, r in select(images, Policy(keep_last=1), 10 * S)] == [
        (3, "keep-last 1"), (2, "keep-last 1"), (1, "keep-last 1")]
    assert [i.version for i, _ in select(images, Policy(keep_last=2, keep_every=2),
                                         10 * S)] == [1]


def rewritten(versions_of: dict[int, int]) -> list[Image]:
    """Step n (its own file, inode n) with versions_of[n] versions, committed in order."""
    return [Image(n, v, n, (10 * n + v) * S, newest=v == count)
            for n, count in versions_of.items() for v in range(1, count + 1)]


def test_unit_keep_last_counts_steps_not_versions() -> None:
    """The bug report: app.n0.5 and app.n0.6 have two versions each (a commit repeated);
    keep-last 2 keeps both steps, each with its newest version."""
    images = rewritten({1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 2})
    chosen = {(i.inode, i.version): r for i, r in select(images, Policy(keep_last=2), 0)}
    assert chosen == {(1, 1): "keep-last 2", (2, 1): "keep-last 2", (3, 1): "keep-last 2",
                      (4, 1): "keep-last 2",
                      (5, 1): "keep-last 2, superseded by version 2",
                      (6, 1): "keep-last 2, superseded by version 2"}
    assert select(rewritten({5: 3, 6: 1}), Policy(keep_last=2), 0) == [
        (Image(5, 2, 5, 52 * S), "keep-last 2, superseded by version 3"),
        (Image(5, 1, 5, 51 * S), "keep-last 2, superseded by version 3")]


def test_unit_keep_every_keeps_the_newest_version_of_a_multiple() -> None:
    images = rewritten({8: 1, 9: 1, 10: 3, 11: 1, 12: 2})
    kept = set(images) - {i for i, _ in select(images, Policy(keep_last=1, keep_every=10), 0)}
    assert sorted((i.step, i.version) for i in kept) == [(10, 3), (12, 2)]


def test_unit_policy_checks_and_text() -> None:
    with pytest.raises(ConfigError, match="keep-every needs keep-last"):
        check_policy(Policy(keep_every=3))
    with pytest.raises(ConfigError, match="keep-last must be"):
        check_policy(Policy(keep_last=-1))
    assert Policy(keep_last=3, keep_every=10, purge_after_ms=7 * 86_400_000).describe() == \
        "keep-last 3, keep-every 10, purge-after 1w"
    assert [format_ms(ms) for ms in (90_000, 2000, 1500, 43_200_000)] == \
        ["90s", "2s", "1500ms", "12h"]


# --- folder settings ------------------------------------------------------------------------

def test_unit_folder_settings_inherit_and_clear(mgr: Manager) -> None:
    store = mgr.store
    top = store.mkdir(ROOT_INODE, "ckpt", 0o755).inode
    sub = store.mkdir(top, "run1", 0o755).inode
    store.update_pool("fast", create=True, replication=1, stripe_width=2)
    mgr.set_folder(top, pool="fast", series_pattern="{app}_{step}",
                   policy=Policy(keep_last=2), clear_policy=False)
    eff = mgr.folders.get(sub).effective
    assert (eff.pool, eff.pool_from, eff.series_pattern, eff.policy.keep_last,
            eff.policy_from) == ("fast", top, "{app}_{step}", 2, top)
    assert mgr.folders.get(sub).path == "/ckpt/run1"
    mgr.set_folder(sub, pool=None, series_pattern=None, policy=Policy(), clear_policy=False)
    assert mgr.folders.get(sub).effective.policy.keep_last == 0  # keep-all overrides
    assert mgr.folders.get(sub).effective.policy_from == sub
    mgr.set_folder(sub, pool=None, series_pattern=None, policy=None, clear_policy=True)
    assert mgr.folders.get(sub).effective.policy_from == top
    mgr.set_folder(top, pool="", series_pattern="", policy=None, clear_policy=True)
    assert mgr.folders.all() == []  # a folder that sets nothing has no record
    root = mgr.folders.get(ROOT_INODE)
    assert (root.path, root.effective.pool, root.effective.series_pattern) == \
        ("/", "default", DEFAULT_PATTERN)


def test_unit_folder_settings_refuse_bad_input(mgr: Manager) -> None:
    store = mgr.store
    f = new_file(store, "f")
    with pytest.raises(NotADirectory, match="set on folders"):
        mgr.set_folder(f, pool=None, series_pattern=None, policy=Policy(keep_last=1),
                       clear_policy=False)
    with pytest.raises(NotFound, match="no pool 'nope'"):
        mgr.set_folder(ROOT_INODE, pool="nope", series_pattern=None, policy=None,
                       clear_policy=False)
    with pytest.raises(ConfigError, match="exactly once"):
        mgr.set_folder(ROOT_INODE, pool=None, series_pattern="{app}", policy=None,
                       clear_policy=False)
    with pytest.raises(NotFound):
        mgr.folders.get(999)
    assert mgr.folders.all() == []


def test_unit_rmdir_drops_the_folder_settings(mgr: Manager) -> None:
    d = mgr.store.mkdir(ROOT_INODE, "d", 0o755).inode
    mgr.set_folder(d, pool=None, series_pattern=None, policy=Policy(keep_last=1),
                   clear_policy=False)
    mgr.store.rmdir(ROOT_INODE, "d")
    assert mgr.folders.all() == []
    assert fsck(mgr.store).findings == []


# --- series base and the folder of a file ---------------------------------------------------

def test_unit_new_step_dedupes_against_the_newest_committed_step(mgr: Manager,
                                                                 clock: Clock) -> None:
    register(mgr, "b1")
    store = mgr.store
    d = store.mkdir(ROOT_INODE, "ckpt", 0o755).inode
    one, two = new_file(store, "app.n0.1", d), new_file(store, "app.n0.2", d)
    other = new_file(store, "app.n1.9", d)
    commit(mgr, one, [(cid(1), 10)])
    commit(mgr, two, [(cid(2), 10)])
    commit(mgr, other, [(cid(9), 10)])
    three = new_file(store, "app.n0.3", d)
    lease = mgr.open_write(three, "t")
    assert (lease.base_inode, lease.base_version) == (two, 1)
    assert [c.id for c in lease.base_chunks] == [cid(2)]
    mgr.commit_version(lease.lease_id, three, [(cid(2), 10), (cid(3), 10)],
                       [(cid(3), ["b1"])])
    stats = store.version_stats(three)
    assert (stats.base_inode, stats.shared_chunks, stats.shared_bytes) == (two, 1, 10)
    lone = new_file(store, "notes.txt", d)
    assert mgr.open_write(lone, "t").base_version == 0
    assert mgr.open_write(one, "t").base_inode == one  # its own newest version first


def test_unit_a_file_follows_its_name_for_its_folder(mgr: Manager) -> None:
    register(mgr, "b1")
    store = mgr.store
    a = store.mkdir(ROOT_INODE, "a", 0o755).inode
    b = store.mkdir(ROOT_INODE, "b", 0o755).inode
    store.update_pool("p", create=True)
    mgr.set_folder(b, pool="p", series_pattern=None, policy=None, clear_policy=False)
    register(mgr, "pb", port=7001)
    mgr.registry.update("pb", pool="p")
    f = new_file(store, "tmp", a)
    assert mgr.folders.write_context(f).folder == a
    store.rename(a, "tmp", b, "app.n0.1")  # the atomic-rename idiom of checkpointers
    context = mgr.folders.write_context(f)
    assert (context.folder, context.pool) == (b, "p")
    assert [t.id for t in mgr.open_write(f, "t").targets] == ["pb"]
    store.link(f, a, "second")
    store.unlink(b, "app.n0.1")  # its folder's name goes; the other stays
    assert mgr.folders.write_context(f).folder == 0
    store.rename(a, "second", a, "third")
    assert mgr.folders.write_context(f).folder == a
    assert fsck(store).findings == []


def test_unit_versions_view_name_is_reserved(store: MetadataStore) -> None:
    f = new_file(store, "f")
    with pytest.raises(NotPermitted, match="reserved"):
        store.create(ROOT_INODE, ".versions", 0o644)
    with pytest.raises(NotPermitted, match="reserved"):
        store.mkdir(ROOT_INODE, ".versions", 0o755)
    with pytest.raises(NotPermitted, match="reserved"):
        store.rename(ROOT_INODE, "f", ROOT_INODE, ".versions")
    with pytest.raises(NotPermitted, match="reserved"):
        store.link(f, ROOT_INODE, ".versions")
    assert names(store, ROOT_INODE) == ["f"]


# --- pruning in the store -------------------------------------------------------------------

def series_folder(mgr: Manager, count: int, *, policy: Policy) -> tuple[int, list[int]]:
    register(mgr, "b1")
    d = mgr.store.mkdir(ROOT_INODE, "ckpt", 0o755).inode
    mgr.set_folder(d, pool=None, series_pattern=None, policy=policy, clear_policy=False)
    files = []
    for step in range(1, count + 1):
        f = new_file(mgr.store, f"app.n0.{step}", d)
        commit(mgr, f, [(cid(step), 100), (cid(1000), 5)])  # one chunk shared by all
        files.append(f)
    return d, files


def names(store: MetadataStore, d: int) -> list[str]:
    return [name for name, _ in store.readdir(d)[0]]


def test_unit_keep_last_prunes_on_commit(mgr: Manager) -> None:
    d, _ = series_folder(mgr, 6, policy=Policy(keep_last=2))
    store = mgr.store
    assert names(store, d) == ["app.n0.5", "app.n0.6"]
    for step in range(1, 5):
        assert store.chunk(cid(step)).refcount == 0  # type: ignore[union-attr]
    assert store.chunk(cid(1000)).refcount == 2  # type: ignore[union-attr]
    assert consistent(store)
    assert fsck(store).findings == []


def test_unit_dry_run_lists_and_changes_nothing(mgr: Manager) -> None:
    d, _ = series_folder(mgr, 4, policy=Policy())
    # Stored only (the background pass's view): Manager.set_folder would prune at once.
    mgr.folders.set(d, policy=Policy(keep_last=1))
    dry = mgr.prune(d, dry_run=True)
    assert sorted(i.path for i in dry.pruned) == [f"/ckpt/app.n0.{n}" for n in (1, 2, 3)]
    assert all(i.whole_file and i.reason == "keep-last 1" for i in dry.pruned)
    assert len(names(mgr.store, d)) == 4
    expected = (3, 3, 315, 3, 300, 300)  # the shared chunk stays: app.n0.4 has it
    assert figures(dry.report(dry_run=True)) == expected
    assert figures(mgr.prune(0).report(dry_run=False)) == expected
    assert names(mgr.store, d) == ["app.n0.4"]


def test_unit_setting_a_policy_applies_it_and_reports_what_went(mgr: Manager) -> None:
    top, _ = series_folder(mgr, 4, policy=Policy())
    sub = mgr.store.mkdir(top, "sub", 0o755).inode  # inherits: pruned with it
    for step in (1, 2):
        commit(mgr, new_file(mgr.store, f"x.n.{step}", sub), [(cid(50 + step), 7)])
    reply = mgr.set_folder(top, pool=None, series_pattern=None, policy=Policy(keep_last=1),
                           clear_policy=False)
    assert sorted(i.path for i in reply.prune.pruned) == [
        "/ckpt/app.n0.1", "/ckpt/app.n0.2", "/ckpt/app.n0.3", "/ckpt/sub/x.n.1"]
    assert figures(reply.prune) == (4, 4, 322, 4, 307, 307)
    assert names(mgr.store, top) == ["app.n0.4", "sub"]
    assert names(mgr.store, sub) == ["x.n.2"]
    pool_only = mgr.set_folder(top, pool="default", series_pattern=None, policy=None,
                               clear_policy=False)
    assert not pool_only.HasField("prune")  # nothing about pruning changed


def figures(report: manager_pb2.PruneReport) -> tuple[int, ...]:
    return (report.files_removed, report.versions_removed, report.bytes_released,
            report.chunks_unreferenced, report.bytes_unreferenced,
            report.stored_bytes_unreferenced)


def test_unit_pruning_spares_open_and_hard_linked_files(mgr: Manager) -> None:
    d, files = series_folder(mgr, 3, policy=Policy())
    mgr.store.link(files[1], ROOT_INODE, "pinned")
    lease = mgr.open_write(files[0], "t")
    mgr.set_folder(d, pool=None, series_pattern=None, policy=Policy(keep_last=1),
                   clear_policy=False)
    result = mgr.prune(d)
    assert names(mgr.store, d) == ["app.n0.1", "app.n0.2", "app.n0.3"]
    assert sorted(result.skipped) == ["/ckpt/app.n0.1: open for writing",
                                      "/ckpt/app.n0.2: hard-linked"]
    mgr.abort_write(lease.lease_id)
    mgr.prune(d)
    assert names(mgr.store, d) == ["app.n0.2", "app.n0.3"]


def test_unit_keep_last_counts_a_step_open_for_writing(mgr: Manager) -> None:
    """A file left alone (here: the newest step, open for a rewrite) still counts as a step:
    exactly the N newest steps stay, whoever is writing what."""
    d, files = series_folder(mgr, 4, policy=Policy())
    lease = mgr.open_write(files[3], "t")
    mgr.folders.set(d, policy=Policy(keep_last=2))
    result = mgr.prune(d)
    assert names(mgr.store, d) == ["app.n0.3", "app.n0.4"]
    assert result.skipped == []  # nothing of step 4 goes, so it is not skipped either
    mgr.commit_version(lease.lease_id, files[3], [(cid(44), 100)], [(cid(44), ["b1"])])
    assert names(mgr.store, d) == ["app.n0.3", "app.n0.4"]  # its old version superseded
    assert [v.version for v in mgr.store.list_versions(files[3])] == [2]
    assert consistent(mgr.store) and fsck(mgr.store).findings == []


def test_unit_keep_last_of_a_lone_file_drops_old_versions(mgr: Manager) -> None:
    register(mgr, "b1")
    store = mgr.store
    f = new_file(store, "model.pt")
    for n in range(1, 5):
        commit(mgr, f, [(cid(n), 10)])
    mgr.set_folder(ROOT_INODE, pool=None, series_pattern=None, policy=Policy(keep_last=2),
                   clear_policy=False)
    mgr.prune(0)
    assert [v.version for v in store.list_versions(f)] == [3, 4]
    assert store.getattr(f).version == 4
    assert consistent(store) and fsck(store).findings == []


def test_unit_purge_after_reports_the_next_expiry(mgr: Manager) -> None:
    d, _ = series_folder(mgr, 2, policy=Policy(purge_after_ms=30_000))
    result = mgr.prune(d)
    assert result.pruned == []
    assert result.next_expiry_ns is not None
    assert 25 < mgr.prune_pass() <= 30  # the loop sleeps until the oldest image expires
    mgr.set_folder(d, pool=None, series_pattern=None, policy=Policy(purge_after_ms=3_600_000),
                   clear_policy=False)
    assert 3500 < mgr.prune_pass() <= 3600  # the expiry, and at most the interval


def test_unit_background_pass_prunes_only_the_folders_with_an_image_due(
        mgr: Manager) -> None:
    """After the first pass over every folder with a policy, a pass prunes the folders
    where a purge-after rule has an image due, not every folder under a policy: its cost
    follows what expired."""
    import time

    register(mgr, "b1")
    store = mgr.store
    for i in range(20):
        other = store.mkdir(ROOT_INODE, f"kept{i}", 0o755).inode
        mgr.set_folder(other, pool=None, series_pattern=None, policy=Policy(keep_last=1),
                       clear_policy=False)
        commit(mgr, new_file(store, "app.n0.1", other), [(cid(100 + i), 10)])
    d = store.mkdir(ROOT_INODE, "short", 0o755).inode
    mgr.set_folder(d, pool=None, series_pattern=None, policy=Policy(purge_after_ms=400),
                   clear_policy=False)
    commit(mgr, new_file(store, "app.n0.1", d), [(cid(1), 10)])
    before = store.write_transactions
    assert mgr.prune_pass() <= 0.4  # the first pass: every folder, and the expiry found
    assert store.write_transactions - before == 21
    time.sleep(0.5)
    before = store.write_transactions
    mgr.prune_pass()
    assert store.write_transactions - before == 1  # the one folder with an image due
    assert names(store, d) == []
    assert mgr.prune_pass() > 3000  # nothing due any more: the next full pass


def test_unit_pruned_subfolders_inherit_unless_they_set_their_own(mgr: Manager) -> None:
    register(mgr, "b1")
    store = mgr.store
    top = store.mkdir(ROOT_INODE, "top", 0o755).inode
    inherits = store.mkdir(top, "a", 0o755).inode
    own = store.mkdir(top, "b", 0o755).inode
    for folder in (inherits, own):
        for step in (1, 2, 3):
            commit(mgr, new_file(store, f"x.n.{step}", folder), [(cid(folder * 10 + step), 1)])
    mgr.set_folder(own, pool=None, series_pattern=None, policy=Policy(), clear_policy=False)
    mgr.set_folder(top, pool=None, series_pattern=None, policy=Policy(keep_last=1),
                   clear_policy=False)
    mgr.prune(0)
    assert names(store, inherits) == ["x.n.3"]
    assert names(store, own) == ["x.n.1", "x.n.2", "x.n.3"]


# --- versions and restore -------------------------------------------------------------------

def test_unit_list_and_restore_versions(mgr: Manager) -> None:
    register(mgr, "b1")
    store = mgr.store
    f = new_file(store, "f")
    commit(mgr, f, [(cid(1), 10), (cid(2), 20)])
    commit(mgr, f, [(cid(1), 10), (cid(3), 30)])
    listed = store.list_versions(f)
    assert [(v.version, v.size, v.shared_bytes) for v in listed] == [(1, 30, 0), (2, 40, 10)]
    version, attr = mgr.restore_version(f, 1)
    assert (version, attr.size, attr.version) == (3, 30, 3)
    assert store.block_map(f).chunks == store.block_map(f, 1).chunks
    assert store.chunk(cid(2)).refcount == 2  # type: ignore[union-attr]
    assert consistent(store)
    with pytest.raises(NotFound, match="no version 9"):
        mgr.restore_version(f, 9)
    with pytest.raises(InvalidArgument):
        mgr.restore_version(f, 0)
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode
    with pytest.raises(Exception, match="directory"):
        store.list_versions(d)


# --- pools and benefactors ------------------------------------------------------------------

def test_unit_pools_create_update_delete(mgr: Manager) -> None:
    store = mgr.store
    created = store.update_pool("fast", create=True, replication=2, stripe_width=4)
    assert (created.replication, created.stripe_width, created.chunker) == \
        (2, 4, pools.DEFAULT_CHUNKER)
    with pytest.raises(AlreadyExists):
        store.update_pool("fast", create=True)
    with pytest.raises(ConfigError, match="bad pool name"):
        store.update_pool("no/slash", create=True)
    with pytest.raises(ConfigError, match="replication must be"):
        store.update_pool("fast", replication=99)
    with pytest.raises(NotFound):
        store.update_pool("nope", replication=2)
    assert sorted(p.name for p in store.pools()) == ["default", "fast"]
    with pytest.raises(NotPermitted):
        store.delete_pool("default")
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode
    mgr.set_folder(d, pool="fast", series_pattern=None, policy=None, clear_policy=False)
    with pytest.raises(FailedPrecondition, match="assigned to /d"):
        store.delete_pool("fast")
    mgr.set_folder(d, pool="", series_pattern=None, policy=None, clear_policy=False)
    register(mgr, "b9")
    mgr.registry.update("b9", pool="fast")
    with pytest.raises(FailedPrecondition, match="still has benefactors b9"):
        store.delete_pool("fast")
    assert store.pool_users("fast") == (["b9"], [])
    mgr.registry.update("b9", pool="default")
    store.delete_pool("fast")
    assert [p.name for p in store.pools()] == ["default"]


def test_unit_registration_keeps_a_moved_pool_and_draining(mgr: Manager) -> None:
    store = mgr.store
    store.update_pool("fast", create=True)
    register(mgr, "b1")
    mgr.registry.update("b1", pool="fast", draining=True)
    register(mgr, "b1")  # a restart: no pool named
    rec = store.benefactor("b1")
    assert rec is not None and (rec.pool, rec.draining) == ("fast", True)
    assert [s.draining for s in mgr.registry.statuses()] == [True]
    with pytest.raises(NoSpace, match="pool 'default' has no benefactors"):
        mgr.open_write(new_file(store, "f"), "t")  # b1 moved away: none left in default


def test_unit_drain_replication_and_removal(store: MetadataStore, clock: Clock) -> None:
    copies: list[tuple[str, str, int]] = []

    def copy(source: str, target: str, ids: list[bytes],
             timeout: float) -> tuple[list[bool], str]:
        copies.append((source, target, len(ids)))
        return [True] * len(ids), ""

    from mosafs.manager.core import ManagerConfig

    mgr = Manager(store, ManagerConfig(scan_interval_s=1), clock=clock, copy=copy)
    for i, bid in enumerate(("b1", "b2", "b3")):
        register(mgr, bid, port=7000 + i)
    f = new_file(store, "f")
    commit(mgr, f, [(cid(1), 10), (cid(2), 20)])  # on b1 only; default R is 1
    clock.now += 10  # past the first lease: replication may start
    for i, bid in enumerate(("b1", "b2", "b3")):
        register(mgr, bid, port=7000 + i)
    replicator = mgr.replicator
    assert isinstance(replicator, Replicator)
    status = mgr.drain("b1")
    assert (status.draining, status.chunks, status.pending_chunks, status.done) == \
        (True, 2, 2, False)
    replicator.run_once()
    assert copies and {target for _, target, _ in copies} <= {"127.0.0.1:7001",
                                                              "127.0.0.1:7002"}
    status = mgr.drain_status("b1")
    assert (status.pending_chunks, status.done) == (0, True)
    with pytest.raises(FailedPrecondition, match="is alive"):
        mgr.remove_benefactor("b1")
    clock.now += 100  # every lease runs out; b2/b3 heartbeat again
    for i, bid in enumerate(("b2", "b3")):
        register(mgr, bid, port=7001 + i)
    assert mgr.remove_benefactor("b1") == 2
    assert store.benefactor("b1") is None
    assert all("b1" not in store.chunk(c).benefactor_ids for c in (cid(1), cid(2)))  # type: ignore[union-attr]
    assert fsck(store).findings == []


def test_unit_chunk_pool_decides_r_and_targets(store: MetadataStore, clock: Clock) -> None:
    from mosafs.manager.core import ManagerConfig

    mgr = Manager(store, ManagerConfig(), clock=clock,
                  copy=lambda s, t, ids, timeout: ([True] * len(ids), ""))
    store.update_pool("fast", create=True, replication=2, stripe_width=1)
    for i, bid in enumerate(("d1", "f1", "f2")):
        register(mgr, bid, port=7000 + i)
    mgr.registry.update("f1", pool="fast")
    mgr.registry.update("f2", pool="fast")
    d = store.mkdir(ROOT_INODE, "fast", 0o755).inode
    mgr.set_folder(d, pool="fast", series_pattern=None, policy=None, clear_policy=False)
    f = new_file(store, "x", d)
    lease = mgr.open_write(f, "t")
    assert {t.id for t in lease.targets} == {"f1", "f2"}
    mgr.commit_version(lease.lease_id, f, [(cid(1), 10)], [(cid(1), ["f1"])])
    rec = store.chunk(cid(1))
    assert rec is not None and rec.pool == "fast"
    view = Redundancy(store, mgr.registry)
    assert (view.want(rec), view.counted(rec), view.missing(rec)) == (2, ["f1"], 1)
    clock.now += 10  # past the first lease: replication may start
    for i, bid in enumerate(("d1", "f1", "f2")):
        register(mgr, bid, port=7000 + i)
    assert mgr.replicator is not None
    mgr.replicator.run_once()
    assert sorted(store.chunk(cid(1)).benefactor_ids) == ["f1", "f2"]  # type: ignore[union-attr]
    store.update_pool("fast", replication=3)  # more than the pool has: stays short
    assert Redundancy(store, mgr.registry).missing(store.chunk(cid(1))) == 1  # type: ignore[arg-type]


# --- fsck of the new metadata ---------------------------------------------------------------

def test_unit_fsck_finds_and_repairs_folder_damage(mgr: Manager) -> None:
    store = mgr.store
    store.update_pool("gone", create=True)
    d = store.mkdir(ROOT_INODE, "d", 0o755).inode
    f = new_file(store, "f", d)
    mgr.set_folder(d, pool="gone", series_pattern=None, policy=None, clear_policy=False)
    register(mgr, "b1")
    mgr.registry.update("b1", pool="gone")
    with store.transaction(write=True) as tx:
        tx.txn.delete(b"gone", db=tx.db.pools)
        tx.put_folder(f, manager_pb2.FolderSettings(pool="default"))
        rec = tx.inode(f)
        rec.name = b"elsewhere"
        tx.put_inode(f, rec)
    found = sorted(x.kind for x in fsck(store).findings)
    assert found == ["dangling_folder", "file_folder", "unknown_pool", "unknown_pool"]
    assert sorted(x.kind for x in fsck(store, repair=True).findings) == found
    assert fsck(store).findings == []
    assert store.benefactor("b1").pool == "default"  # type: ignore[union-attr]
    assert mgr.folders.get(d).effective.pool == "default"


def test_unit_a_commit_prunes_its_own_folder_only(mgr: Manager) -> None:
    """The new image is in the committed file's folder: that folder alone is pruned, and
    not at all when its policy keeps everything (before, every commit walked the folder's
    whole subtree and wrote one transaction per subfolder)."""
    register(mgr, "b1")
    store = mgr.store
    top = store.mkdir(ROOT_INODE, "top", 0o755).inode
    for i in range(30):
        store.mkdir(top, f"sub{i}", 0o755)
    f = new_file(store, "app.n0.1", top)
    before = store.write_transactions
    commit(mgr, f, [(cid(1), 10)])
    assert store.write_transactions - before == 1  # the commit itself
    mgr.set_folder(top, pool=None, series_pattern=None, policy=Policy(keep_last=1),
                   clear_policy=False)
    g = new_file(store, "app.n0.2", top)
    before = store.write_transactions
    commit(mgr, g, [(cid(2), 10)])
    assert store.write_transactions - before == 2  # the commit, then its folder pruned
    assert "app.n0.2" in names(store, top) and "app.n0.1" not in names(store, top)
