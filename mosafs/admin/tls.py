"""`mosafs certs init|issue|list`: the cluster's certificate authority and the certificates
of its processes (mosafs.certs, docs/operations.md)."""

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
              "  mosafs certs issue alice --role admin --dir /etc/mosafs/tls"),
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
    from mosafs.certs import ROLES

    parser.add_argument("name", help="the certificate's name: NAME.crt and NAME.key")
    parser.add_argument("--role", required=True, choices=ROLES,
                        help="what the holder may do (docs/operations.md)")
    parser.add_argument("--host", action="append", default=[], metavar="HOST",
                        help="a host name or IP address to add to the certificate "
                             "(repeatable)")
    parser.add_argument("--force", action="store_true", help="replace an existing NAME")
    _dir(parser)


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    _dir(parser)


def run_init(args: argparse.Namespace) -> int:
    from mosafs.certs import init_ca

    path = init_ca(args.dir)
    return emit({"ca": str(path)}, args.json, lambda r: print(f"made {r['ca']} (and ca.key: "
                                                              f"keep it safe)"))


def run_issue(args: argparse.Namespace) -> int:
    from mosafs.certs import issue

    path = issue(args.dir, args.name, args.role, hosts=tuple(args.host), overwrite=args.force)
    return emit({"certificate": str(path), "key": str(path.with_suffix(".key")),
                 "role": args.role}, args.json,
                lambda r: print(f"made {r['certificate']} and {r['key']} ({r['role']})"))


def run_list(args: argparse.Namespace) -> int:
    from mosafs.certs import role_of
    from mosafs.errors import ConfigError, NotFound

    if not args.dir.exists():
        raise NotFound(f"no TLS directory {args.dir} (make one with `mosafs certs init --dir "
                       f"{args.dir}`)")
    if not args.dir.is_dir():
        raise ConfigError(f"{args.dir} is not a directory")
    out: list[dict[str, Any]] = []
    for path in sorted(args.dir.glob("*.crt")):
        if path.name == "ca.crt":
            continue
        try:
            role, name = role_of(path.read_bytes())
        except ConfigError as exc:
            role, name = f"unusable: {exc.message}", ""
        out.append({"file": path.name, "name": name, "role": role})
    return emit({"dir": str(args.dir), "certificates": out}, args.json, _print_list)


def _print_list(report: dict[str, Any]) -> None:
    if not report["certificates"]:
        print(f"no certificates in {report['dir']} (`mosafs certs issue` makes them)")
    for cert in report["certificates"]:
        print(f"{cert['file']:<24} {cert['role']}")
