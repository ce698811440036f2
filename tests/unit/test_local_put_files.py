"""The memory files a writer keeps for its local puts (mosafs.client.files.localputs,
`MemoryFiles`): per benefactor process, a few of bounded size, none once closed."""

from __future__ import annotations

import os

from mosafs.client.files.localputs import (
    KEEP_BENEFACTORS,
    KEEP_MAX_BYTES,
    KEEP_PER_BENEFACTOR,
    MemoryFiles,
)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_files_are_kept_per_socket_bounded_and_closed_at_the_end() -> None:
    before = _open_fds()
    files = MemoryFiles()
    fd, size = files.take("sock-a", 100)
    assert size == 0 and files.made == 1
    files.give("sock-a", fd, 100)
    assert files.take("sock-a", 50) == (fd, 100)   # the same file again
    other, _ = files.take("sock-b", 50)             # another benefactor: a file of its own
    assert other != fd and files.made == 2
    files.give("sock-a", fd, 100)
    files.give("sock-b", other, KEEP_MAX_BYTES + 1)  # too large to keep: closed
    assert _open_fds() == before + 1
    taken = [files.take("sock-a", 10)[0] for _ in range(KEEP_PER_BENEFACTOR + 2)]
    for f in taken:
        files.give("sock-a", f, 10)
    assert _open_fds() == before + KEEP_PER_BENEFACTOR
    for i in range(KEEP_BENEFACTORS + 3):  # the benefactors used longest ago lose theirs
        f, _ = files.take(f"sock-{i}", 10)
        files.give(f"sock-{i}", f, 10)
    assert _open_fds() == before + KEEP_BENEFACTORS
    kept, _ = files.take("sock-a", 10)
    assert files.made > KEEP_PER_BENEFACTOR + 2  # sock-a's files were closed: a new one
    files.close()
    files.give("sock-a", kept, 10)  # after close: closed, not kept
    assert _open_fds() == before
