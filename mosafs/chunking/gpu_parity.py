"""The erasure parity stage of a GPU chunk stream (mosafs.chunking.gpu_stream, `parity=`):
the chunks' parity computed on the device from the bytes the hash kernels read, with the
coding kernel of mosafs.erasure.gpu_batch (DESIGN §10, docs/gpu.md); only the parity is
copied back.

Imported only by the GPU backend, lazily: it imports CuPy at module import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mosafs.chunking.gpu_runtime import D2H, GpuRuntime, HostArray, I64Array, Slot, cupy

if TYPE_CHECKING:
    from mosafs.erasure.gpu_batch import BatchParity, RaggedEncoder, RaggedPlan


class ParityStage:
    """A stream's erasure parity: per segment, after the hash kernels on the slot's CUDA
    stream (the launch plan came in with theirs), one ragged kernel launch over the
    segment's chunks of at least MIN_CHUNK bytes (read from the slot's device buffer,
    where the hash kernels read them), and one copy of their packed parity into a host
    block from the runtime's pool. The slot's hash event is recorded after that copy,
    so a segment is collected when its digests and its parity are both on the host: no
    extra wait."""

    def __init__(self, rt: GpuRuntime, k: int, m: int, min_chunk: int) -> None:
        from mosafs.erasure.spec import Code

        Code.of(k, m)  # a bad K or M is the pool's ConfigError, before any kernel builds
        self.k, self.m, self.min_chunk = k, m, max(1, int(min_chunk))
        self._rt = rt
        # Built at the first segment, in the thread that feeds: a stream is often made on
        # the client's event loop, which must not wait for a compiler.
        self._encoders: dict[int, RaggedEncoder] = {}

    def _encoder(self, device: int) -> RaggedEncoder:
        found = self._encoders.get(device)
        if found is None:
            from mosafs.erasure.gpu_batch import ragged_encoder

            found = self._encoders[device] = ragged_encoder(device, self.k, self.m)
        return found

    def plan(self, offs: I64Array, lens: I64Array) -> RaggedPlan:
        """The launch plan of a segment's chunks at OFFS (from slot.dev_ptr) of LENS bytes;
        its meta travels with the hash stage's (launch_hash's EXTRA)."""
        from mosafs.erasure.gpu_batch import ragged_plan

        return ragged_plan(offs, lens, self.k, self.m, self.min_chunk)

    def queue(self, slot: Slot, plan: RaggedPlan,
              meta_ptr: int) -> tuple[RaggedPlan, HostArray | None]:
        """Queue PLAN's kernel (its meta at META_PTR on the device, copied in by
        launch_hash) and the parity's copy to a host block on the slot's stream (its device
        current); (the plan, the host block the parity lands in)."""
        if not plan.count:
            return plan, None
        stream = slot.stream
        out_ptr = slot.parity_out().ensure(plan.parity_bytes)
        self._encoder(slot.device.index).launch(slot.dev_ptr, meta_ptr, plan, out_ptr, stream)
        block = self._rt.take_parity(plan.parity_bytes, slot.pinned)
        cupy.cuda.runtime.memcpyAsync(block.ptr, out_ptr, plan.parity_bytes, D2H,
                                      stream.ptr)
        slot.hash_ev.record(stream)
        return plan, block

    def hand_over(self, queued: tuple[RaggedPlan, HostArray | None], nchunks: int
                  ) -> BatchParity:
        """The collected segment's parity for its batch of NCHUNKS chunks: the batch owns
        the host block until it is released."""
        from mosafs.erasure.gpu_batch import BatchParity

        plan, block = queued
        if block is None:
            return BatchParity.of_plan(plan, nchunks, None)
        rt = self._rt
        return BatchParity.of_plan(plan, nchunks, block.array[:plan.parity_bytes],
                                   lambda: rt.give_parity(block))
