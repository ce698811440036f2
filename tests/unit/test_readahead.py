"""The adaptive read-ahead window (mosafs/client/files/readahead.py)."""

from __future__ import annotations

from mosafs.client.files.readahead import MINIMUM, ReadAhead

MiB = 1 << 20
CHUNK = 1 * MiB


def _sequential_reader(ahead: ReadAhead, reads: int, size: int = CHUNK) -> list[bool]:
    return [ahead.read(i * size, size) for i in range(reads)]


def test_starts_at_minimum() -> None:
    ahead = ReadAhead(4 * MiB, 64 * MiB)
    assert ahead.window == 4 * MiB
    assert ReadAhead(MINIMUM, 64 * MiB).window == MINIMUM == 4 * MiB


def test_sequential_detection() -> None:
    ahead = ReadAhead(4 * MiB, 64 * MiB)
    assert ahead.read(0, 4096) is False  # the first read continues nothing
    assert ahead.read(4096, 4096) is True
    assert ahead.read(8192, 100) is True
    assert ahead.read(8292, 4096) is True  # where the previous read ended, whatever its size
    assert ahead.read(8292, 4096) is False  # the same bytes again
    assert ahead.read(0, 4096) is False  # backwards
    assert ahead.read(1 * MiB, 4096) is False  # forwards, past a gap


def test_doubles_on_each_stall() -> None:
    ahead = ReadAhead(4 * MiB, 64 * MiB)
    _sequential_reader(ahead, 2)
    windows = []
    for chunk in range(1, 4):
        ahead.stalled(chunk * CHUNK)
        windows.append(ahead.window)
    assert windows == [8 * MiB, 16 * MiB, 32 * MiB]


def test_reads_without_stalls_keep_the_window() -> None:
    ahead = ReadAhead(4 * MiB, 64 * MiB)
    ahead.read(0, CHUNK)
    ahead.stalled(0)
    assert all(ahead.read(i * CHUNK, CHUNK) for i in range(1, 50))
    assert ahead.window == 8 * MiB


def test_concurrent_waits_for_one_chunk_are_one_stall() -> None:
    ahead = ReadAhead(4 * MiB, 64 * MiB)
    ahead.stalled(5 * CHUNK)
    ahead.stalled(5 * CHUNK)  # another read of the same chunk, waiting too
    ahead.stalled(3 * CHUNK)  # a read of an earlier chunk, still waiting
    assert ahead.window == 8 * MiB
    ahead.stalled(6 * CHUNK)
    assert ahead.window == 16 * MiB


def test_never_exceeds_maximum() -> None:
    ahead = ReadAhead(4 * MiB, 48 * MiB)  # not a power-of-two multiple of the minimum
    seen = []
    for chunk in range(20):
        ahead.stalled(chunk * CHUNK)
        seen.append(ahead.window)
    assert max(seen) == 48 * MiB
    assert seen[-1] == 48 * MiB
    assert seen[:4] == [8 * MiB, 16 * MiB, 32 * MiB, 48 * MiB]


def test_seek_resets_to_minimum() -> None:
    ahead = ReadAhead(4 * MiB, 64 * MiB)
    _sequential_reader(ahead, 4)
    for chunk in range(4):
        ahead.stalled(chunk * CHUNK)
    assert ahead.window == 64 * MiB
    assert ahead.read(100 * MiB, 4096) is False
    assert ahead.window == 4 * MiB
    # After the seek, stalls at offsets before the old ones count again.
    ahead.stalled(0)
    assert ahead.window == 8 * MiB


def test_random_reads_stay_at_minimum() -> None:
    ahead = ReadAhead(4 * MiB, 64 * MiB)
    for offset in (7 * MiB, 1 * MiB, 90 * MiB, 3 * MiB, 50 * MiB):
        ahead.stalled(offset)  # a sequential reader's stall, just before the seek
        assert ahead.read(offset, 4096) is False
        assert ahead.window == 4 * MiB


def test_small_cache_caps_the_minimum() -> None:
    ahead = ReadAhead(4 * MiB, 1 * MiB)
    assert ahead.window == 1 * MiB
    ahead.stalled(0)
    assert ahead.window == 1 * MiB
    off = ReadAhead(4 * MiB, 0)  # read-ahead turned off
    off.stalled(0)
    assert off.window == 0
