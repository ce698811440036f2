"""What the parsers of `mosafs bench` (mosafs.bench.cli and the families beside it) share:
the size bound, the options of every benchmark that starts a cluster, list arguments,
and how a result is printed."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_MIB = 1 << 20  # the largest size in MiB a benchmark takes (1 TiB)


def print_result(result: dict[str, Any], as_json: bool,
                  table: Callable[[dict[str, Any]], str]) -> int:
    if as_json:
        json.dump(result, sys.stdout)
        print()
    else:
        print(table(result))
    return 0  # a missed target is a figure, not a failure: see "targets" in the JSON


def add_run_options(p: argparse.ArgumentParser) -> None:
    """--json, --keep and --log-level, alike for every benchmark that starts a cluster."""
    p.add_argument("--json", action="store_true", help="print only the JSON object on stdout")
    p.add_argument("--keep", type=Path, metavar="DIR",
                   help="run in DIR (empty or absent) and keep data and logs there")
    p.add_argument("--log-level", default="WARNING")


def numbers(low: int, high: int) -> Callable[[str], tuple[int, ...]]:
    """An argparse type: a comma-separated list of whole numbers in LOW..HIGH."""
    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"a comma-separated list of whole numbers, "
                                             f"got {text!r}") from None
        if not values or any(not low <= v <= high for v in values):
            raise argparse.ArgumentTypeError(f"numbers {low}..{high}, got {text!r}")
        return values
    return parse
