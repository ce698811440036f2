"""`mosafs certs init|issue|revoke|list`: the cluster's certificate authority, the
certificates of its processes and clients with their capabilities (mosafs.certs,
mosafs.capability, mosafs.revocation; docs/operations.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mosafs.admin.common import emit

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "init": ("make a new certificate authority for a cluster",
             "  mosafs certs init --dir /etc/mosafs/tls"),
    "issue": ("issue a certificate (role manager, benefactor, client or admin) signed by "
              "the CA", "  mosafs certs issue manager --role manager --dir /etc/mosafs/tls\n"
              "  mosafs certs issue node07 --role benefactor --dir /etc/mosafs/tls "
              "--host node07.example.org\n"
              "  mosafs certs issue alice --role admin --dir /etc/mosafs/tls\n"
              "  mosafs certs issue jobA --role client --dir /etc/mosafs/tls "
              "--path /ckpt/jobA --uid 1000 --gids 1000,1001"),
    "revoke": ("revoke a certificate: the manager and every benefactor refuse it within "
               "seconds", "  mosafs certs revoke jobA --dir /etc/mosafs/tls"),
    "list": ("list the certificates of a TLS directory with their roles",
             "  mosafs certs list --dir /etc/mosafs/tls --json"),
}


def _dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", required=True, type=Path, metavar="DIR",
                        help="the TLS directory (ca.crt, ca.key, NAME.crt, NAME.key)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_init_arguments(parser: argparse.ArgumentParser) -> None:
    _dir(parser)


def add_issue_arguments(parser: argparse.ArgumentParser) -> None:
    from mosafs.argtypes import bounded_int
    from mosafs.certs import ROLES

    parser.add_argument("name", help="the certificate's name: NAME.crt and NAME.key")
    parser.add_argument("--role", required=True, choices=ROLES,
                        help="what the holder may do (docs/operations.md)")
    parser.add_argument("--host", action="append", default=[], metavar="HOST",
                        help="a host name or IP address to add to the certificate "
                             "(repeatable)")
    parser.add_argument("--force", action="store_true", help="replace an existing NAME")
    cap = parser.add_argument_group(
        "capability (client certificates; without these: any path, any uid, root squashed)")
    cap.add_argument("--path", action="append", default=[], metavar="PATH",
                     help="a subtree the holder may reach (repeatable; default /)")
    cap.add_argument("--read-only", action="store_true", help="refuse every change")
    cap.add_argument("--uid", type=bounded_int(0, 2**32 - 2, what="a uid"), metavar="UID",
                     help="the only uid the holder may act as")
    cap.add_argument("--gids", metavar="GID,GID", help="the groups the holder may act as")
    cap.add_argument("--allow-root", action="store_true",
                     help="the holder may act as any uid, root included (full access "
                          "with the whole tree: what `mosafs up` gives its own mount)")
    _dir(parser)


def add_revoke_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the certificate's name (NAME.crt in DIR)")
    _dir(parser)


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    _dir(parser)


def run_init(args: argparse.Namespace) -> int:
    from mosafs.certs import init_ca

    path = init_ca(args.dir)
    return emit({"ca": str(path)}, args.json, lambda r: print(f"made {r['ca']} (and ca.key: "
                                                              f"keep it safe)"))


def _capability(args: argparse.Namespace) -> Any:
    """The Capability the issue flags ask for; None for full access."""
    from mosafs import capability
    from mosafs.errors import ConfigError

    asked = args.path or args.read_only or args.uid is not None or args.gids or args.allow_root
    if args.role != "client":
        if asked:
            raise ConfigError(f"--path, --read-only, --uid, --gids and --allow-root are for "
                              f"client certificates (a {args.role} has its role's access)")
        return None
    if args.allow_root and (args.uid is not None or args.gids):
        raise ConfigError("--allow-root lets the holder act as any uid: leave out --uid and "
                          "--gids, or --allow-root")
    if args.gids and args.uid is None:
        raise ConfigError("--gids needs --uid")
    try:
        gids = [int(g) for g in args.gids.split(",")] if args.gids else None
    except ValueError:
        raise ConfigError(f"--gids must be numbers separated by commas: {args.gids!r}") from None
    uids = [args.uid] if args.uid is not None else None
    cap = capability.make(args.path, read_only=args.read_only, uids=uids,
                          gids=gids if gids is not None else uids,
                          allow_root=args.allow_root)
    return None if cap.full else cap


def run_issue(args: argparse.Namespace) -> int:
    from mosafs.certs import issue

    cap = _capability(args)
    path = issue(args.dir, args.name, args.role, hosts=tuple(args.host), overwrite=args.force,
                 capability=cap)
    return emit({"certificate": str(path), "key": str(path.with_suffix(".key")),
                 "role": args.role,
                 "capability": cap.describe() if cap is not None else "full"}, args.json,
                lambda r: print(f"made {r['certificate']} and {r['key']} ({r['role']}; "
                                f"{r['capability']})"))


def run_revoke(args: argparse.Namespace) -> int:
    from mosafs.certs import check_name
    from mosafs.revocation import REVOKED_FILE, revoke

    fingerprint, before = revoke(args.dir, check_name(args.name))
    return emit({"revoked": args.name, "fingerprint": fingerprint.hex(),
                 "already": before, "list": str(args.dir / REVOKED_FILE)}, args.json,
                lambda r: print(f"{r['revoked']} was revoked already" if r["already"] else
                                f"revoked {r['revoked']} (listed in {r['list']}; servers "
                                f"using this directory refuse it within seconds, and the "
                                f"manager tells its benefactors)"))


def run_list(args: argparse.Namespace) -> int:
    from mosafs.certs import peer_certificate
    from mosafs.errors import ConfigError, NotFound
    from mosafs.revocation import read

    if not args.dir.exists():
        raise NotFound(f"no TLS directory {args.dir} (make one with `mosafs certs init --dir "
                       f"{args.dir}`)")
    if not args.dir.is_dir():
        raise ConfigError(f"{args.dir} is not a directory")
    out: list[dict[str, Any]] = []
    revoked = read(args.dir)
    for path in sorted(args.dir.glob("*.crt")):
        if path.name == "ca.crt":
            continue
        try:
            peer = peer_certificate(path.read_bytes())
        except ConfigError as exc:
            out.append({"file": path.name, "name": "", "role": f"unusable: {exc.message}",
                        "capability": "", "revoked": False})
            continue
        out.append({"file": path.name, "name": peer.name, "role": peer.role,
                    "capability": "full" if peer.capability.full
                    else peer.capability.describe(),
                    "revoked": peer.fingerprint in revoked})
    return emit({"dir": str(args.dir), "certificates": out}, args.json, _print_list)


def _print_list(report: dict[str, Any]) -> None:
    if not report["certificates"]:
        print(f"no certificates in {report['dir']} (`mosafs certs issue` makes them)")
    for cert in report["certificates"]:
        note = " (revoked)" if cert["revoked"] else ""
        cap = f"  {cert['capability']}" if cert["capability"] not in ("", "full") else ""
        print(f"{cert['file']:<24} {cert['role']}{note}{cap}")
