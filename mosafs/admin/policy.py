"""`mosafs policy set|show|apply`: pruning policies and series patterns of folders
(docs/lifecycle.md)."""

from __future__ import annotations

import argparse
from typing import Any

from mosafs.admin.common import (
    MountPath,
    add_manager_arguments,
    ask,
    emit,
    find_manager,
    resolve,
    size,
    when,
)
from mosafs.argtypes import bounded_int, take_negative_values
from mosafs.errors import ConfigError, NotADirectory

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "set": ("set the pruning policy or series pattern of a folder (applied at once: it "
            "lists what it removed)",
            "  mosafs policy set /mnt/ckpt --keep-last 2\n"
            "  mosafs policy set /mnt/ckpt --keep-last 3 --purge-after 7d\n"
            "  mosafs policy set /mnt/ckpt --keep-last 5 --keep-every 10\n"
            "  mosafs policy set /mnt/ckpt/tmp --purge-after 12h\n"
            "  mosafs policy set /mnt/ckpt --series-pattern '{app}_{rank}_{step}.ckpt'\n"
            "  mosafs policy set /mnt/ckpt/keep --keep-all\n"
            "  mosafs policy set /mnt/ckpt/run2 --inherit"),
    "show": ("show the policy of a folder (with where it comes from), or every folder's",
             "  mosafs policy show /mnt/ckpt\n  mosafs policy show --json"),
    "apply": ("prune now (a folder, or every folder with a policy); --dry-run lists what "
              "would go",
              "  mosafs policy apply /mnt/ckpt --dry-run\n  mosafs policy apply --json"),
}


def duration_ms(text: str) -> int:
    """A duration such as 90s, 30m, 12h, 7d, 2w (humanfriendly's parser) in ms."""
    import humanfriendly

    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"durations are positive, like 7d: got {text!r}")
    try:
        seconds = humanfriendly.parse_timespan(text)
    except humanfriendly.InvalidTimespan:
        raise argparse.ArgumentTypeError(
            f"malformed duration {text!r}: use a number and a unit, e.g. 90s, 30m, 12h, "
            f"7d") from None
    if not 0 < seconds < 100 * 365 * 86400:
        raise argparse.ArgumentTypeError(f"duration {text!r} must be more than 0 and less "
                                         f"than a century")
    return max(1, round(seconds * 1000))


_count = bounded_int(1, 1_000_000)


def add_set_arguments(parser: argparse.ArgumentParser) -> None:
    take_negative_values(parser)  # --purge-after -5d: "durations are positive", not a usage
    parser.add_argument("folder", help="a directory inside a mounted mosafs")
    rules = parser.add_argument_group("policy (applied per series; subfolders inherit)")
    rules.add_argument("--keep-all", action="store_true",
                       help="never prune here (the default; overrides an inherited policy)")
    rules.add_argument("--keep-last", type=_count, metavar="N",
                       help="keep the newest N steps of each series, each with its newest "
                            "version; a file outside any series keeps its newest N versions "
                            "(automated replace)")
    rules.add_argument("--keep-every", type=_count, metavar="K",
                       help="with --keep-last: also keep every step that is a multiple of K")
    rules.add_argument("--purge-after", type=duration_ms, metavar="DURATION",
                       help="delete checkpoints committed longer ago, e.g. 90s, 12h, 7d "
                            "(automated purge)")
    rules.add_argument("--inherit", action="store_true",
                       help="drop this folder's own policy: the parent's applies")
    pattern = parser.add_argument_group("series")
    pattern.add_argument("--series-pattern", metavar="TEMPLATE",
                         help="names of the steps of one series, e.g. '{app}.{node}.{step}' "
                              "(the default): {step} is the step number, the other "
                              "placeholders together name the series")
    pattern.add_argument("--inherit-series-pattern", action="store_true",
                         help="drop this folder's own series pattern")
    parser.add_argument("--dry-run", action="store_true",
                        help="store nothing: list what the policy given would remove here")
    add_manager_arguments(parser)


def add_show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", nargs="?",
                        help="a directory inside a mounted mosafs (default: every folder that "
                             "sets something)")
    add_manager_arguments(parser)


def add_apply_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", nargs="?",
                        help="a directory inside a mounted mosafs (default: every folder "
                             "with a policy)")
    parser.add_argument("--dry-run", action="store_true",
                        help="only list what the policies would remove")
    add_manager_arguments(parser)


def folder(args: argparse.Namespace, path: str) -> MountPath:
    target = resolve(path, args)
    if not target.is_dir:
        raise NotADirectory(f"{path} is a file: policies, series patterns and pools are set "
                            f"on folders")
    return target


def run_set(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    request = mpb.SetFolderSettingsRequest()
    policy = _policy(args)
    if policy is not None:
        request.policy.CopyFrom(policy)
    request.clear_policy = args.inherit
    if args.series_pattern is not None and args.inherit_series_pattern:
        raise ConfigError("give --series-pattern or --inherit-series-pattern, not both")
    if args.series_pattern is not None:
        if not args.series_pattern:
            raise ConfigError("an empty --series-pattern: use --inherit-series-pattern")
        request.series_pattern = args.series_pattern
    elif args.inherit_series_pattern:
        request.series_pattern = ""
    if policy is None and not args.inherit and not request.HasField("series_pattern"):
        raise ConfigError("nothing to set: give --keep-all, --keep-last, --purge-after, "
                          "--inherit or --series-pattern")
    target = folder(args, args.folder)
    if args.dry_run:
        if policy is None or args.inherit:
            raise ConfigError("--dry-run weighs a policy: give --keep-last, --keep-every or "
                              "--purge-after")
        reply = ask(target.manager, "Prune", mpb.PruneRequest(
            inode=target.inode, dry_run=True, policy=policy), timeout=600)
        return emit(prune_report(reply), args.json, _print_pruned)
    request.inode = target.inode
    reply = ask(target.manager, "SetFolderSettings", request, timeout=600)
    report = folder_report(reply)
    if reply.HasField("prune"):  # the manager applied the policy at once
        report["prune"] = prune_report(reply.prune)
    return emit(report, args.json, _print_set)


def _print_set(report: dict[str, Any]) -> None:
    _print_folder(report)
    if "prune" in report:
        _print_pruned(report["prune"])


def _policy(args: argparse.Namespace) -> Any:
    from mosafs._proto import manager_pb2 as mpb

    rules = args.keep_last or args.keep_every or args.purge_after
    if args.keep_all and (rules or args.inherit):
        raise ConfigError("--keep-all cannot be combined with --keep-last, --keep-every, "
                          "--purge-after or --inherit")
    if args.inherit and rules:
        raise ConfigError("--inherit drops the folder's policy: give no rules with it")
    if args.keep_every and not args.keep_last:
        raise ConfigError("--keep-every needs --keep-last (the newest checkpoints are kept by "
                          "count, every Kth step on top of them)")
    if not (args.keep_all or rules):
        return None
    return mpb.PrunePolicy(keep_last=args.keep_last or 0, keep_every=args.keep_every or 0,
                           purge_after_ms=args.purge_after or 0)


def run_show(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    if args.folder:
        target = folder(args, args.folder)
        reply = ask(target.manager, "GetFolderSettings",
                    mpb.GetFolderSettingsRequest(inode=target.inode))
        return emit(folder_report(reply), args.json, _print_folder)
    reply = ask(find_manager(args), "ListFolderSettings", mpb.ListFolderSettingsRequest())
    report = {"folders": [folder_report(f) for f in reply.folders]}
    return emit(report, args.json, _print_folders)


def policy_report(policy: Any) -> dict[str, Any]:
    from mosafs.manager.pruning import Policy

    rules = Policy(policy.keep_last, policy.keep_every, policy.purge_after_ms)
    return {"keep_last": policy.keep_last or None, "keep_every": policy.keep_every or None,
            "purge_after_ms": policy.purge_after_ms or None, "text": rules.describe()}


def folder_report(reply: Any) -> dict[str, Any]:
    """The JSON object of one folder's settings (policy show, policy set, pool assign)."""
    own, eff = reply.own, reply.effective
    return {
        "path": reply.path, "inode": reply.inode,
        "own": {
            "pool": own.pool if own.HasField("pool") else None,
            "series_pattern": own.series_pattern if own.HasField("series_pattern") else None,
            "policy": policy_report(own.policy) if own.HasField("policy") else None,
        },
        "effective": {
            "pool": eff.pool, "pool_from": eff.pool_from or None,
            "series_pattern": eff.series_pattern,
            "series_pattern_from": eff.series_pattern_from or None,
            "policy": policy_report(eff.policy), "policy_from": eff.policy_from or None,
        },
    }


def _origin(report: dict[str, Any], key: str) -> str:
    source = report["effective"][f"{key}_from"]
    if source is None:
        return "built-in default"
    return "set here" if source == report["inode"] else f"inherited from inode {source}"


def _print_folder(report: dict[str, Any]) -> None:
    eff = report["effective"]
    print(f"{report['path']}")
    print(f"  policy:         {eff['policy']['text']} ({_origin(report, 'policy')})")
    print(f"  series pattern: {eff['series_pattern']} ({_origin(report, 'series_pattern')})")
    print(f"  pool:           {eff['pool']} ({_origin(report, 'pool')})")


def _print_folders(report: dict[str, Any]) -> None:
    if not report["folders"]:
        print("no folder sets a policy, series pattern or pool: keep-all everywhere")
    for entry in report["folders"]:
        _print_folder(entry)


def run_apply(args: argparse.Namespace) -> int:
    from mosafs._proto import manager_pb2 as mpb

    if args.folder:
        target = folder(args, args.folder)
        manager, inode = target.manager, target.inode
    else:
        manager, inode = find_manager(args), 0
    reply = ask(manager, "Prune", mpb.PruneRequest(inode=inode, dry_run=args.dry_run),
                timeout=600)
    return emit(prune_report(reply), args.json, _print_pruned)


def prune_report(reply: Any) -> dict[str, Any]:
    return {
        "dry_run": reply.dry_run, "files_removed": reply.files_removed,
        "versions_removed": reply.versions_removed, "bytes_released": reply.bytes_released,
        "pruned": [{"path": i.path, "inode": i.inode, "version": i.version,
                    "whole_file": i.whole_file, "size": i.size,
                    "commit_time": when(i.commit_time_ns), "reason": i.reason}
                   for i in reply.pruned],
        "skipped": list(reply.skipped),
        "chunks_unreferenced": reply.chunks_unreferenced,
        "bytes_unreferenced": reply.bytes_unreferenced,
        "stored_bytes_unreferenced": reply.stored_bytes_unreferenced,
    }


def _print_pruned(report: dict[str, Any]) -> None:
    dry = report["dry_run"]
    verb = "would remove" if dry else "removed"
    for image in report["pruned"]:
        what = "file" if image["whole_file"] else "version"
        print(f"{verb} {what} {image['path']} v{image['version']} ({size(image['size'])}, "
              f"committed {image['commit_time']}): {image['reason']}")
    for line in report["skipped"]:
        print(f"skipped {line}")
    print(f"{verb} {report['versions_removed']} versions, {report['files_removed']} files "
          f"({size(report['bytes_released'])} of checkpoint data)")
    if report["chunks_unreferenced"]:
        left = "would leave" if dry else "left"
        print(f"{left} {report['chunks_unreferenced']} chunks unreferenced "
              f"({size(report['bytes_unreferenced'])}, "
              f"{size(report['stored_bytes_unreferenced'])} with every copy): `mosafs gc` "
              f"frees them")
