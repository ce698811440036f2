"""`mosafs pool create|list|show|set|delete|assign|unassign` and `mosafs benefactor
list|drain|remove|move` (docs/lifecycle.md)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from mosafs.admin.common import (
    Manager,
    add_manager_arguments,
    ask,
    emit,
    find_manager,
    progress,
    size,
    warn,
)
from mosafs.admin.policy import folder, folder_report
from mosafs.argtypes import bounded_float, bounded_int
from mosafs.errors import ConfigError, MosafsError, NotFound

POOL_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "create": ("create a pool (settings not given take the defaults)",
               "  mosafs pool create fast --replication 2 --stripe-width 4\n"
               "  mosafs pool create cold --redundancy ec:4+2 --ec-min-chunk 256K\n"
               "  mosafs pool create scratch --replication 1 --chunker fixed:1048576 "
               "--write-semantics optimistic"),
    "list": ("list the pools with their settings, benefactors and folders",
             "  mosafs pool list\n  mosafs pool list --json"),
    "show": ("show one pool", "  mosafs pool show fast --json"),
    "set": ("change a pool's settings (new writes use them; a higher R re-replicates)",
            "  mosafs pool set default --replication 3\n"
            "  mosafs pool set cold --redundancy ec:8+2\n"
            "  mosafs pool set fast --write-semantics pessimistic --hash-backend gpu"),
    "delete": ("delete a pool that no benefactor and no folder uses",
               "  mosafs pool delete scratch"),
    "assign": ("assign a folder to a pool (subfolders inherit; new writes only)",
               "  mosafs pool assign /mnt/ckpt/fast-runs fast"),
    "unassign": ("drop a folder's own pool: it inherits its parent's again",
                 "  mosafs pool unassign /mnt/ckpt/fast-runs"),
}
# An id as `benefactor list` prints it, and a prefix of it as people type one.
_ID, _PREFIX = "3f2a9c0e5b7d41c8a6e2f0b9d4c7e1a5", "3f2a9c"
BENEFACTOR_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "list": ("list the benefactors (pool, liveness, space, draining)",
             "  mosafs benefactor list\n  mosafs benefactor list --json"),
    "drain": ("move every chunk off a benefactor (it takes no new ones), with progress",
              f"  mosafs benefactor drain {_ID}\n  mosafs benefactor drain {_PREFIX} --no-wait\n"
              f"  mosafs benefactor drain {_PREFIX} --cancel"),
    "remove": ("forget a stopped benefactor (drain it first)",
               f"  mosafs benefactor remove {_PREFIX}\n"
               f"  mosafs benefactor remove {_PREFIX} --force"),
    "move": ("move a benefactor to another pool (its copies are re-replicated in the old one)",
             f"  mosafs benefactor move {_PREFIX} fast"),
}
DRAIN_POLL_S = 0.5
MIN_PREFIX = 4  # characters of an id given in part, as git takes a commit's


# --- pools -----------------------------------------------------------------------------------

def _settings_arguments(parser: argparse.ArgumentParser) -> None:
    from mosafs.argtypes import ec_min_chunk_arg, redundancy_arg
    from mosafs.chunking.base import BACKEND_CHOICES
    from mosafs.manager.pools import MAX_EC_K, MAX_EC_M, MAX_REPLICATION, MAX_STRIPE_WIDTH

    parser.add_argument("--replication", type=bounded_int(1, MAX_REPLICATION, what="replication"),
                        metavar="R", help=f"copies of every chunk (1..{MAX_REPLICATION}); "
                                          f"short for --redundancy replicas:R")
    parser.add_argument("--redundancy", type=redundancy_arg, metavar="replicas:R|ec:K+M",
                        help=f"R whole copies of every chunk, or K data + M parity fragments "
                             f"on K+M distinct benefactors (K 1..{MAX_EC_K}, M 1..{MAX_EC_M}; "
                             f"survives M failures at (K+M)/K the space)")
    parser.add_argument("--ec-min-chunk", type=ec_min_chunk_arg, metavar="SIZE",
                        help="in an ec:K+M pool, chunks smaller than this are kept as M+1 "
                             "whole copies (default 128K)")
    parser.add_argument("--stripe-width", metavar="W",
                        type=bounded_int(1, MAX_STRIPE_WIDTH, what="stripe width"),
                        help=f"benefactors one write stripes over (1..{MAX_STRIPE_WIDTH})")
    parser.add_argument("--chunker", metavar="SPEC", type=_chunker,
                        help="fixed:SIZE or cdc:MIN:AVG:MAX (bytes)")
    parser.add_argument("--write-semantics", choices=["optimistic", "pessimistic"],
                        help="close returns after one copy (optimistic) or R copies; in "
                             "an ec:K+M pool after K (optimistic) or all K+M fragments")
    parser.add_argument("--hash-backend", choices=list(BACKEND_CHOICES),
                        help="preferred hash backend of mounts started with auto")


def _chunker(text: str) -> str:
    """A chunker spec, checked here as the manager would check it."""
    from mosafs.chunking.spec import parse_spec

    try:
        parse_spec(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def add_create_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="1..64 characters of A-Z a-z 0-9 . _ -")
    _settings_arguments(parser)
    add_manager_arguments(parser)


add_set_arguments = add_create_arguments


def add_name_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the pool")
    add_manager_arguments(parser)


add_show_arguments = add_delete_arguments = add_name_arguments


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    add_manager_arguments(parser)


def add_assign_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="a directory inside a mounted mosafs")
    parser.add_argument("pool", help="the pool its new writes use")
    add_manager_arguments(parser)


def add_unassign_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", help="a directory inside a mounted mosafs")
    add_manager_arguments(parser)


def _pool_request(args: argparse.Namespace) -> Any:
    from mosafs._proto import manager_pb2 as mpb

    if args.replication is not None and args.redundancy is not None and \
            args.redundancy != f"replicas:{args.replication}":
        raise ConfigError(f"--replication {args.replication} and --redundancy "
                          f"{args.redundancy} disagree: give one of them")
    request = mpb.PoolRequest(name=args.name)
    for field in ("replication", "stripe_width", "chunker", "write_semantics", "hash_backend",
                  "redundancy", "ec_min_chunk"):
        value = getattr(args, field)
        if value is not None:
            setattr(request, field, value)
    return request


def pool_report(info: Any) -> dict[str, Any]:
    from mosafs.manager.pools import ec_min_chunk, scheme

    s = info.settings
    kind = scheme(s)
    return {"name": s.name, "redundancy": str(kind), "replication": s.replication,
            "ec": ({"k": kind.k, "m": kind.m, "min_chunk": ec_min_chunk(s)}
                   if kind.coded else None),
            "stripe_width": s.stripe_width,
            "chunker": s.chunker, "write_semantics": s.write_semantics,
            "hash_backend": s.hash_backend, "benefactors": list(info.benefactors),
            "folders": list(info.folder_paths)}


def _print_pool(report: dict[str, Any]) -> None:
    ec = report["ec"]
    small = (f" (chunks under {size(ec['min_chunk'])}: {report['replication']} copies)"
             if ec else "")
    print(f"{report['name']}: {report['redundancy']}{small} W={report['stripe_width']} "
          f"{report['chunker']} {report['write_semantics']} hash={report['hash_backend']}")
    print(f"  benefactors: {', '.join(report['benefactors']) or '-'}")
    print(f"  folders:     {', '.join(report['folders']) or '-'}")


def run_create(args: argparse.Namespace) -> int:
    manager = find_manager(args)
    info = ask(manager, "CreatePool", _pool_request(args))
    _warn_short(args, manager, info.settings)
    return emit(pool_report(info), args.json, _print_pool)


def run_set(args: argparse.Namespace) -> int:
    manager = find_manager(args)
    info = ask(manager, "UpdatePool", _pool_request(args))
    if args.replication is not None or args.redundancy is not None:
        _warn_short(args, manager, info.settings)
    return emit(pool_report(info), args.json, _print_pool)


def _live(manager: Manager) -> dict[str, int] | None:
    """Pool -> how many of its benefactors are live and take new chunks (not draining);
    None if the manager could not say: a warning is not worth failing a command that did
    what it was asked."""
    from mosafs._proto import manager_pb2 as mpb

    try:
        reply = ask(manager, "ListBenefactors", mpb.ListBenefactorsRequest())
    except MosafsError:
        return None
    counts: dict[str, int] = {}
    for b in reply.benefactors:
        if b.alive and not b.draining:
            counts[b.info.pool] = counts.get(b.info.pool, 0) + 1
    return counts


def _join_hint(pool: str) -> str:
    return (f"add benefactors to it: `mosafs benefactor move ID {pool}`, or start one with "
            f"`mosafs benefactor --pool {pool}`")


def _warn_short(args: argparse.Namespace, manager: Manager, settings: Any) -> None:
    """Warn when the pool of SETTINGS has fewer live benefactors than its R (writes there
    store fewer copies than asked, or fail with ENOSPC when it has none) or its K+M
    (writes there fail)."""
    from mosafs.manager.pools import scheme

    pool, kind = settings.name, scheme(settings)
    live = _live(manager)
    if live is None or live.get(pool, 0) >= kind.width:
        return
    have, everywhere = live.get(pool, 0), sum(live.values())
    if kind.coded:
        cluster = f" (the whole cluster has {everywhere} live)" if everywhere < kind.width else ""
        warn(args, f"pool {pool!r} is {kind}: every chunk needs {kind.width} distinct "
                   f"benefactors{cluster} but it has {have} live: writes in its folders "
                   f"fail until enough join; {_join_hint(pool)}")
        return
    replication = kind.replicas
    if have == 0:
        state = "has no live benefactor: writes in its folders fail until one joins"
    else:
        state = (f"has {have} live benefactor{'' if have == 1 else 's'}: chunks get "
                 f"{have} cop{'y' if have == 1 else 'ies'} until more join")
    cluster = f" (the whole cluster has {everywhere} live)" if everywhere < replication else ""
    warn(args, f"pool {pool!r} keeps R={replication} copies{cluster} but {state}; "
               f"{_join_hint(pool)}")


def run_show(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    info = ask(find_manager(args), "GetPool", mpb.GetPoolRequest(name=args.name))
    return emit(pool_report(info), args.json, _print_pool)


def run_list(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    reply = ask(find_manager(args), "ListPools", mpb.ListPoolsRequest())
    report = {"pools": [pool_report(p) for p in reply.pools]}
    return emit(report, args.json, _print_pools)


def _print_pools(report: dict[str, Any]) -> None:
    for pool in report["pools"]:
        _print_pool(pool)


def run_delete(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    ask(find_manager(args), "DeletePool", mpb.DeletePoolRequest(name=args.name))
    return emit({"deleted": args.name}, args.json, lambda r: print(f"deleted pool {r['deleted']}"))


def _assign(args: argparse.Namespace, pool: str) -> int:
    from mosafs._proto import manager_pb2 as mpb
    from mosafs.admin.policy import _print_folder

    target = folder(args, args.folder)
    reply = ask(target.manager, "SetFolderSettings",
                mpb.SetFolderSettingsRequest(inode=target.inode, pool=pool))
    return emit(folder_report(reply), args.json, _print_folder)


def run_assign(args: argparse.Namespace) -> int:
    code = _assign(args, args.pool)
    live = _live(find_manager(args, args.folder))
    if live is not None and not live.get(args.pool):
        warn(args, f"pool {args.pool!r} has no live benefactor: writes in {args.folder} fail "
                   f"until one joins; {_join_hint(args.pool)}")
    return code


def run_unassign(args: argparse.Namespace) -> int:
    return _assign(args, "")


# --- benefactors -----------------------------------------------------------------------------

def add_id_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help=f"the benefactor's id (`mosafs benefactor list`), or its "
                                   f"first {MIN_PREFIX} or more characters if no other id "
                                   f"starts with them")
    add_manager_arguments(parser)


def benefactor_id(manager: Manager, given: str) -> str:
    """The id of the benefactor GIVEN names: its id, or a unique prefix of at least
    MIN_PREFIX characters (hex ids are compared in any case)."""
    from mosafs._proto import manager_pb2 as mpb

    reply = ask(manager, "ListBenefactors", mpb.ListBenefactorsRequest())
    return match_id(given, [b.info.id for b in reply.benefactors])


def match_id(given: str, ids: list[str]) -> str:
    """GIVEN among IDS: itself, else the one id it is a prefix of (at least MIN_PREFIX
    characters). NotFound for none, ConfigError for several or too short a prefix."""
    if given in ids:
        return given
    matches = sorted(i for i in ids if i.lower().startswith(given.lower()))
    if matches and len(given) < MIN_PREFIX:
        raise ConfigError(f"benefactor id {given!r} is too short: give at least {MIN_PREFIX} "
                          f"characters of it")
    if len(matches) > 1:
        raise ConfigError(f"benefactor id {given!r} is ambiguous: {len(matches)} ids start "
                          f"with it ({', '.join(matches)}); give more characters")
    if not matches:
        raise NotFound(f"no benefactor {given!r} (`mosafs benefactor list` lists them)")
    return matches[0]


def add_drain_arguments(parser: argparse.ArgumentParser) -> None:
    add_id_arguments(parser)
    parser.add_argument("--no-wait", action="store_true",
                        help="start draining and return (`mosafs benefactor drain ID` again "
                             "shows the progress)")
    parser.add_argument("--cancel", action="store_true", help="take new chunks again")
    parser.add_argument("--timeout", type=bounded_float(0), default=0, metavar="SECONDS",
                        help="give up waiting after this long (exit 1); default: no limit")


def add_remove_arguments(parser: argparse.ArgumentParser) -> None:
    add_id_arguments(parser)
    parser.add_argument("--force", action="store_true",
                        help="remove even if chunks are left with fewer than R copies")


def add_move_arguments(parser: argparse.ArgumentParser) -> None:
    add_id_arguments(parser)
    parser.add_argument("pool", help="the pool it joins")


def benefactor_report(status: Any) -> dict[str, Any]:
    info = status.info
    return {"id": info.id, "address": info.address, "pool": info.pool, "alive": status.alive,
            "draining": status.draining, "capacity_bytes": info.capacity_bytes,
            "free_bytes": info.free_bytes, "chunks": info.chunks,
            "stored_bytes": info.stored_bytes}


def run_benefactor_list(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    reply = ask(find_manager(args), "ListBenefactors", mpb.ListBenefactorsRequest())
    report = {"benefactors": [benefactor_report(b) for b in reply.benefactors]}
    return emit(report, args.json, _print_benefactors)


def _print_benefactors(report: dict[str, Any]) -> None:
    for b in report["benefactors"]:
        state = ("alive" if b["alive"] else "DEAD") + (", draining" if b["draining"] else "")
        print(f"{b['id']}  {b['address']:<22} pool {b['pool']:<10} {state:<16} "
              f"{b['chunks']:>9} chunks  {size(b['free_bytes'])} of "
              f"{size(b['capacity_bytes'])} free")


def drain_report(status: Any) -> dict[str, Any]:
    return {"id": status.id, "draining": status.draining, "alive": status.alive,
            "chunks": status.chunks, "pending_chunks": status.pending_chunks,
            "pending_bytes": status.pending_bytes, "done": status.done}


def run_drain(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    manager = find_manager(args)
    bid = benefactor_id(manager, args.id)
    status = ask(manager, "DrainBenefactor",
                 mpb.DrainBenefactorRequest(id=bid, cancel=args.cancel))
    if not (args.cancel or args.no_wait or status.done):
        status = _wait_drained(manager, bid, status, args.timeout)
    report = drain_report(status)
    emit(report, args.json, _print_drain)
    return 0 if args.cancel or args.no_wait or status.done else 1


def _wait_drained(manager: Manager, bid: str, status: Any, timeout: float) -> Any:
    """Poll the drain until nothing is pending (a bar of the chunks moved, on a terminal)."""
    from mosafs._proto import manager_pb2 as mpb

    deadline = time.monotonic() + timeout if timeout else None
    first = max(status.pending_chunks, 1)
    with progress(first, "chunk", f"drain {bid}") as bar:
        while not status.done:
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(DRAIN_POLL_S)
            status = ask(manager, "GetDrainStatus", mpb.DrainStatusRequest(id=bid))
            bar.n = max(0, first - status.pending_chunks)
            bar.refresh()
    return status


def _print_drain(report: dict[str, Any]) -> None:
    if not report["draining"]:
        print(f"{report['id']} takes new chunks again")
    elif report["done"]:
        print(f"{report['id']} is drained: every chunk it held has R copies elsewhere; stop it "
              f"and `mosafs benefactor remove {report['id']}`")
    else:
        print(f"{report['id']} is draining: {report['pending_chunks']} of {report['chunks']} "
              f"chunks ({size(report['pending_bytes'])}) still to copy")


def run_remove(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    manager = find_manager(args)
    bid = benefactor_id(manager, args.id)
    ask(manager, "RemoveBenefactor", mpb.RemoveBenefactorRequest(id=bid, force=args.force))
    return emit({"removed": bid}, args.json,
                lambda r: print(f"removed benefactor {r['removed']}"))


def run_move(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    manager = find_manager(args)
    status = ask(manager, "MoveBenefactor",
                 mpb.MoveBenefactorRequest(id=benefactor_id(manager, args.id), pool=args.pool))
    return emit(benefactor_report(status), args.json,
                lambda r: print(f"{r['id']} is in pool {r['pool']}"))
