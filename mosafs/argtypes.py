"""argparse types shared by the commands: a bad value is a one-line error naming it.

The config file and the environment (mosafs.config) go through the same types, so a size
reads the same in `--map-size 2M`, `map-size = "2M"` and MOSAFS_MANAGER_MAP_SIZE=2M.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from fractions import Fraction

MiB = 1 << 20

# Every unit is a power of 1024, however it is spelt (K, KB, KiB, Ki, k): these are
# memory maps, disks and windows, where binary sizes are what people mean, and one rule is
# easier to remember than two. A decimal point is allowed before a unit (1.5G).
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50,
          "E": 1 << 60}
_SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>[KMGTPE]?)(?P<tail>I?B?)",
                   re.IGNORECASE | re.ASCII)
_SIZE_HELP = "a number, optionally with a unit K, M, G, T (powers of 1024): " \
             "512K, 2M, 1.5G, 1GiB"
MAX_SIZE = (1 << 63) - 1  # what a signed 64-bit field (and the kernel's off_t) holds


def bounded_int(low: int, high: int = MAX_SIZE, *, what: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number in LOW..HIGH (HIGH left out: at most what a signed
    64-bit request field holds). WHAT names the value in the refusal, in the words the
    manager uses for the same bound ("replication must be 1..16, got '99'"), so that a
    value is refused alike whichever side sees it first."""
    subject = f"{what} " if what else ""
    bounds = f"at least {low}" if high == MAX_SIZE else f"{low}..{high}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{what} must be a whole number {bounds}, got {text!r}" if what
                else f"not a whole number: {text!r}") from None
        if value > high and high == MAX_SIZE:
            raise argparse.ArgumentTypeError(f"too large: {text!r} (at most {MAX_SIZE})")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{subject}must be {bounds}, got {text!r}")
        return value
    return parse


def parse_size(text: str) -> int:
    """Bytes from '1048576', '512K', '2M', '1.5G', '1GiB', '16gb' (binary units). With a
    unit, a fraction of a byte is dropped (1.1T is a rounded figure anyway); without one,
    a fraction is refused ('1.3' bytes is a mistake). ArgumentTypeError for anything else."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or (match["tail"].upper().startswith("I") and not match["unit"]):
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} ({_SIZE_HELP})")
    # Fraction, not float: 1.1T is exact, and whole counts beyond 2**53 stay exact.
    value = Fraction(match["number"]) * _UNITS[match["unit"].upper()]
    if value.denominator != 1 and not match["unit"]:
        raise argparse.ArgumentTypeError(f"not a whole number of bytes: {text!r} "
                                         f"({_SIZE_HELP})")
    if value > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"too large: {text!r} (at most {MAX_SIZE} bytes)")
    return int(value)


def byte_size(minimum: int = 1, maximum: int = MAX_SIZE, *,
              unit: int = 1) -> Callable[[str], int]:
    """An argparse type: a size (parse_size) in MINIMUM..MAXIMUM bytes. With UNIT, a bare
    number counts UNITs (`--window-mib 64` is 64 MiB) and the result is in UNITs, which the
    size must be a whole number of (`--window-mib 1G` is 1024)."""
    def parse(text: str) -> int:
        bare = text.strip().isascii() and text.strip().isdigit()
        size = parse_size(text) * (unit if bare else 1)
        if size % unit:
            raise argparse.ArgumentTypeError(
                f"not a whole number of {_name(unit).removeprefix('1 ')}: {text!r}")
        if not minimum <= size <= maximum:
            span = f"at least {_name(minimum)}" if maximum == MAX_SIZE else \
                f"{_name(minimum)}..{_name(maximum)}"
            raise argparse.ArgumentTypeError(f"must be {span}, got {text!r}")
        return size // unit
    return parse


def _name(size: int) -> str:
    """SIZE in bytes as people write it: 1 MiB, 512 KiB, 1000 bytes."""
    for suffix, unit in (("EiB", 1 << 60), ("PiB", 1 << 50), ("TiB", 1 << 40),
                         ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= unit and size % unit == 0:
            return f"{size // unit} {suffix}"
    return f"{size} bytes" if size != 1 else "1 byte"


def bounded_float(low: float, high: float = math.inf) -> Callable[[str], float]:
    """An argparse type: a finite number (fractions allowed) in LOW..HIGH."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:g}, got {text!r}")
        return value
    return parse


# A minus sign, then a digit (or a point and a digit): -5, -1.5, -.5, and also -5d, -2G.
_NEGATIVE_VALUE = re.compile(r"^-\.?\d")


def take_negative_values(parser: argparse.ArgumentParser) -> None:
    """Let PARSER's option values that start with a minus sign and a digit (-5d, -1.5G)
    reach their option's type, which says what is wrong with them ("durations are
    positive"). argparse takes only plain negative numbers (-5, -1.5) as values: it reads
    '-5d' as an unknown option and says "expected one argument", which hides the mistake.
    PARSER must have no option that itself looks like a negative number."""
    parser._negative_number_matcher = _NEGATIVE_VALUE  # argparse has no public setting


def redundancy_arg(text: str) -> str:
    """An argparse type: a pool's redundancy, `replicas:R` or `ec:K+M`, checked as the
    manager checks it (the same one-line reason)."""
    from mosafs.errors import ConfigError
    from mosafs.redundancy import parse_redundancy

    try:
        return str(parse_redundancy(text))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def ec_min_chunk_arg(text: str) -> int:
    """An argparse type: an EC pool's threshold, a size of 0..64 MiB (the largest chunk)."""
    return byte_size(0, 64 * MiB)(text)
