"""A mount runs its chunker once as it starts, so that the first write does not wait for
the kernels to be compiled or loaded (docs/client.md, "Starting": the first close after
`mosafs up` took 0.2-1.6 s on the 2-CPU machine before)."""

from __future__ import annotations

import os

from tests import harness


def test_fuse_the_chunker_is_ready_before_any_write(start_cluster) -> None:
    cluster = start_cluster()
    mount_log = cluster.data_dir / "logs" / "mount.log"
    harness.wait_for(lambda: "chunker ready" in mount_log.read_text(), timeout=60,
                     what="the mount's chunker warm-up")
    assert os.listdir(cluster.mountpoint) == []  # nothing was written to get there
    (cluster.mountpoint / "f").write_bytes(b"x" * 300_000)
    assert (cluster.mountpoint / "f").read_bytes() == b"x" * 300_000
