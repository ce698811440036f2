"""argparse types shared by the commands: a bad value is a one-line error naming it."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in LOW..HIGH."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low}..{high}, got {text!r}")
        return value
    return parse
