"""Read-ahead sized to the link: the window of one open handle, in bytes.

Policy (Linux's on-demand read-ahead ramp, grown like TCP's congestion window):

- The window starts at `MINIMUM` (4 MiB: a few chunks of the default 1 MiB-average
  chunker, so a short or random reader pulls little it will not read).
- A sequential read (one that starts where the previous read of the handle ended) that
  has to wait for a chunk not yet in the cache is a stall: the chunks in flight did not
  cover what the link delivers in one fetch's latency. Each stall doubles the window, up
  to the maximum (`readahead_bytes`, at most half the chunk cache, which keeps the
  chunks fetched ahead). Concurrent reads waiting for the same chunk are one stall.
- Any other read (a seek, the first read of the handle) sets the window back to the
  minimum: random reads never grow it.

So a fast, near link keeps a small window and a long fat one grows it until the reader no
longer waits, without a fixed byte count that is too small for one and wasteful for the
other. The window does not shrink while the reader stays sequential (as in Linux)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

MiB = 1 << 20
MINIMUM = 4 * MiB


class ReadAhead:
    """How many bytes to fetch ahead of one handle's reader. Not thread-safe; the FUSE
    layer calls it from one trio thread."""

    def __init__(self, minimum: int, maximum: int) -> None:
        self.maximum = max(maximum, 0)
        self.minimum = min(max(minimum, 0), self.maximum)  # a small cache caps both
        self.window = self.minimum
        self._next: int | None = None  # where the previous read ended; None: no read yet
        self._stalled_at = -1  # start of the chunk whose stall last doubled the window

    def read(self, offset: int, size: int) -> bool:
        """Note a read of SIZE bytes at OFFSET before it waits for anything (concurrent
        reads of a sequential reader arrive in order); whether it is sequential. A read
        that is not resets the window to the minimum."""
        sequential = offset == self._next
        self._next = offset + size
        if not sequential:
            self._reset()
        return sequential

    def stalled(self, chunk_start: int) -> None:
        """A sequential read waited for the chunk at file offset CHUNK_START: double the
        window. Reads waiting for a chunk at or before the last one that doubled it are the
        same stall (the kernel sends a sequential reader's reads several at a time)."""
        if chunk_start <= self._stalled_at:
            return
        self._stalled_at = chunk_start
        grown = min(self.window * 2, self.maximum)
        if grown != self.window:
            log.debug("read-ahead window %d -> %d bytes (stall at %d)", self.window, grown,
                      chunk_start)
            self.window = grown

    def _reset(self) -> None:
        self._stalled_at = -1
        if self.window != self.minimum:
            log.debug("read-ahead window %d -> %d bytes (not sequential)", self.window,
                      self.minimum)
            self.window = self.minimum
