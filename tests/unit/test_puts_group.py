"""`Puts.group`, how a benefactor stores a grouped put (PutChunks): each blob answered on
its own, a bug included (docs/benefactor.md, "Put")."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from mosafs.benefactor.chunkstore import FileChunkStore
from mosafs.benefactor.puts import Puts
from mosafs.errors import InternalError
from mosafs.ids import chunk_id


class Blob:
    def __init__(self, data: bytes) -> None:
        self.id, self.data = chunk_id(data), data


def test_unit_puts_a_bug_answers_its_blob_only_and_is_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good, broken = Blob(os.urandom(4000)), Blob(os.urandom(4000))
    with FileChunkStore(tmp_path / "b") as store:
        # A file where BROKEN's fan-out directory should be (another tool's doing): its
        # rename fails with ENOTDIR, an OSError no put expects.
        store.path_of(broken.id).parent.write_bytes(b"not a directory")
        puts = Puts(store, threads=2)
        try:
            with caplog.at_level(logging.ERROR, logger="mosafs.benefactor.puts"):
                outcomes = puts.group([good, broken])
        finally:
            puts.close()
        assert outcomes[0].error is None
        assert isinstance(outcomes[1].error, InternalError)
        assert "traceback" in outcomes[1].error.message
        bugs = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(bugs) == 1 and bugs[0].exc_info is not None
        assert isinstance(bugs[0].exc_info[1], NotADirectoryError)
        assert store.get(good.id) == good.data  # stored, whatever happened to the other
        assert not store.has(broken.id)
        assert os.listdir(tmp_path / "b" / "tmp") == []
