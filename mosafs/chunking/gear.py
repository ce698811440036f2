"""The gear table and the window of the gear hash (DESIGN §5)."""

from __future__ import annotations

import blake3
import numpy as np
import numpy.typing as npt

GEAR_SEED = b"mosafs-gear-v1"
WINDOW = 64
"""h_p depends on bytes p-63..p: each byte's table entry is shifted out after 64 steps."""
HISTORY = WINDOW - 1
"""Bytes before a position that must be rolled in for its hash to be exact."""


def gear_table() -> npt.NDArray[np.uint64]:
    """G[i] = first 8 bytes, little-endian, of BLAKE3(b"mosafs-gear-v1" + bytes([i]))."""
    values = [
        int.from_bytes(blake3.blake3(GEAR_SEED + bytes([i])).digest()[:8], "little")
        for i in range(256)
    ]
    table = np.array(values, dtype=np.uint64)
    table.flags.writeable = False
    return table


GEAR = gear_table()
