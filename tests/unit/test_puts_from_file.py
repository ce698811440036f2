"""`Puts.from_file`, how a benefactor stores a local put's blobs (docs/benefactor.md,
"Local reads and puts"): each blob read out of the writer's memory file and stored from
the storing thread's own buffer, each answered on its own."""

from __future__ import annotations

import os
from pathlib import Path

from mosafs.benefactor.chunkstore import FileChunkStore
from mosafs.benefactor.puts import Puts
from mosafs.errors import InvalidArgument
from mosafs.ids import chunk_id


def test_blobs_are_stored_from_the_file_and_a_blob_past_its_end_is_refused(
        tmp_path: Path) -> None:
    blobs = [os.urandom(5000 + i) for i in range(6)]
    fd = os.memfd_create("test-from-file")
    with FileChunkStore(tmp_path / "b") as store:
        puts = Puts(store, threads=3)
        try:
            os.write(fd, b"".join(blobs))
            spans, at = [], 0
            for blob in blobs:
                spans.append((chunk_id(blob), at, len(blob)))
                at += len(blob)
            # the writer shortened its file after the benefactor checked the spans
            spans.append((chunk_id(b"gone"), at - 10, 100))
            outcomes = puts.from_file(fd, spans)
            again = puts.from_file(fd, spans[:2])
        finally:
            puts.close()
            os.close(fd)
        assert [o.present for o in outcomes[:6]] == [False] * 6
        assert all(o.error is None for o in outcomes[:6])
        assert isinstance(outcomes[6].error, InvalidArgument)
        assert "ends inside a blob" in outcomes[6].error.message
        assert [o.present for o in again] == [True, True]
        for blob in blobs:  # stored whole, each from a buffer the threads reuse
            assert store.get(chunk_id(blob)) == blob
        assert not store.has(chunk_id(b"gone"))
