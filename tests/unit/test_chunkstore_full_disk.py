"""A put into a file system that runs out of room part way (docs/benefactor.md, "Put"):
after the temporary file took the last inode, making the fan-out directory chunks/ab/cd
fails with ENOSPC. The put must be NoSpace (RESOURCE_EXHAUSTED: the writer tries another
benefactor), leave nothing behind, and in a grouped put answer that blob only.

A real tmpfs with few inodes (needs root); nothing is mocked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest

from mosafs.benefactor.chunkstore import FileChunkStore
from mosafs.benefactor.puts import Puts
from mosafs.errors import NoSpace
from mosafs.ids import chunk_id

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")


def blob(seed: str, size: int) -> bytes:
    return blake3.blake3(seed.encode()).digest(length=size)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of 600 inodes: room for bytes, few names."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,nr_inodes=600", "tmpfs",
                    str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def fill_inodes(fs: Path, leave: int) -> Path:
    """Empty files in FS/filler until LEAVE inodes are free; the filler directory."""
    filler = fs / "filler"
    filler.mkdir(exist_ok=True)
    while os.statvfs(fs).f_ffree > leave:
        (filler / uuid.uuid4().hex).touch()
    assert os.statvfs(fs).f_ffree == leave
    return filler


def test_unit_filechunkstore_full_while_making_fan_out_dir_is_no_space(
        tiny_fs: Path) -> None:
    # The store made chunks/ab at start; the put's temporary file takes the last free
    # inode, and chunks/ab/cd finds none.
    data = blob("goes nowhere", 5000)
    raw = chunk_id(data)
    with FileChunkStore(tiny_fs / "data") as store:
        filler = fill_inodes(tiny_fs, 1)
        with pytest.raises(NoSpace, match="file system is full"):
            store.put(raw, data)
        assert not store.has(raw)
        assert (store.usage().chunks, store.usage().stored_bytes) == (0, 0)
        assert os.listdir(tiny_fs / "data" / "tmp") == []  # the temporary file went
        shutil.rmtree(filler)  # room again: the same put stores it
        assert store.put(raw, data) is False
        assert store.get(raw) == data
        assert (store.usage().chunks, store.usage().stored_bytes) == (1, 5000)


def test_unit_puts_grouped_put_on_a_full_disk_answers_each_blob(tiny_fs: Path) -> None:
    """PutChunks (Puts.group): the blob refused for space is that blob's NoSpace, not an
    exception failing the call, and the blob stored before it stays stored."""
    first, second = blob("fits", 3000), blob("does not fit", 3000)
    with FileChunkStore(tiny_fs / "data") as store:
        # FIRST's fan-out directories are there (as an earlier put there left them): it
        # needs one inode, its temporary file. SECOND needs three and finds one.
        store.path_of(chunk_id(first)).parent.mkdir(parents=True)
        fill_inodes(tiny_fs, 2)

        class Blob:
            def __init__(self, data: bytes) -> None:
                self.id, self.data = chunk_id(data), data

        puts = Puts(store, threads=1)  # one thread: FIRST is stored before SECOND
        try:
            outcomes = puts.group([Blob(first), Blob(second)])
        finally:
            puts.close()
        assert outcomes[0].error is None and not outcomes[0].present
        assert isinstance(outcomes[1].error, NoSpace)
        assert store.get(chunk_id(first)) == first
        assert not store.has(chunk_id(second))
        assert os.listdir(tiny_fs / "data" / "tmp") == []
