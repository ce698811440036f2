"""A mount chunks a small buffer while it starts, so that its first write does not wait for
the chunker's kernels (numba's cache load took 0.1-0.3 s of the first close on the 2-CPU
machine; docs/client.md, "Starting")."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A fresh interpreter: in this one, other tests may have run the kernels already.
_PROBE = textwrap.dedent("""
    import time, trio
    from mosafs.chunking import _kernels
    from mosafs.client.files.context import ClientConfig, ClientContext
    from mosafs.rpc import security

    security.configure(None)
    assert not _kernels.find_cuts.signatures, "kernels ran before the context"

    async def main():
        async with trio.open_nursery() as nursery:
            ctx = await ClientContext.create(
                ClientConfig(manager="127.0.0.1:9", hash_backend="cpu"), nursery)
            deadline = time.monotonic() + 30
            while not _kernels.find_cuts.signatures and time.monotonic() < deadline:
                await trio.sleep(0.05)
            print("warm" if _kernels.find_cuts.signatures else "cold")
            ctx.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
""")


def test_a_context_made_eagerly_runs_the_default_chunker_before_any_write() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["warm"], (out.stdout, out.stderr)
