"""PyTorch distributed checkpoints (torch.distributed.checkpoint, "DCP") in a mosafs folder
(docs/checkpoint.md, "Distributed checkpoints"): a StorageWriter and StorageReader pair, so
that `dcp.save(state_dict, storage_writer=MosafsStorageWriter(folder))` and `dcp.load`
run with any number of ranks, each rank saving its shard through mosafs.checkpoint.

The folder holds what FileSystemWriter's would, in safetensors instead of torch.save:

- `__<rank>_0.safetensors`: every item rank RANK writes, saved with one
  `mosafs.checkpoint.save` (one new version of the file, deduplicated against the last
  one, GPU tensors chunked and hashed where they are). Each item is a tensor of its own:
  under its fully qualified name when the item is a whole tensor or a non-tensor value
  (torch.save bytes, as uint8), else `<fqn>@<offsets>` (a shard). The names do not change
  from save to save, so neither does a file whose tensors did not.
- `.metadata`: DCP's Metadata, pickled (as FileSystemWriter writes it), written by the
  coordinator once every rank's file is committed, through a temporary name renamed into
  place. Its storage_data names, for each item, the file, the tensor and the file's
  VERSION that save made.

The reader reads exactly those versions, through the mount's `.versions` view: a later
save interrupted after some ranks committed (the old `.metadata` still in place) or
running while a load reads, never mixes two checkpoints' shards.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import (
    LoadPlan,
    LoadPlanner,
    Metadata,
    ReadItem,
    SavePlan,
    SavePlanner,
    StorageReader,
    StorageWriter,
)
from torch.distributed.checkpoint.metadata import MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from mosafs import checkpoint
from mosafs.errors import InvalidArgument

METADATA = ".metadata"
VERSIONS = ".versions"  # the mount's read-only view of every file's versions

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class MosafsStorageInfo:
    """Where one item is: tensor KEY of version VERSION of FILE (a name in the folder)."""

    file: str
    key: str
    version: int


def rank_file(rank: int) -> str:
    """The file rank RANK writes (FileSystemWriter's name, with safetensors' suffix)."""
    return f"__{rank}_0.safetensors"


def item_key(item: WriteItem) -> str:
    """ITEM's tensor name in its file: the fqn for a whole tensor or a value, the fqn and
    the chunk's offsets for a shard (the same on every save of the same layout)."""
    fqn = item.index.fqn
    data = item.tensor_data
    if data is None or tuple(data.chunk.sizes) == tuple(data.size):
        return fqn
    return f"{fqn}@{','.join(str(o) for o in data.chunk.offsets)}"


def _inside_mount(path: PathLike) -> bool:
    from mosafs.admin.common import XATTR_MANAGER

    here = Path(os.path.abspath(os.fspath(path)))
    if VERSIONS in here.parts:
        return False
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        os.getxattr(here, XATTR_MANAGER)
    except OSError:
        return False
    return True


class MosafsStorageWriter(StorageWriter):
    """Saves a distributed checkpoint into PATH, a folder inside a mosafs mount (made if
    missing): one safetensors file per rank, then `.metadata`. Saving again into the
    same folder makes new versions of the same files."""

    def __init__(self, path: PathLike) -> None:
        super().__init__()
        self.path = Path(os.fspath(path))
        self.save_id = uuid.uuid4().hex

    @property
    def checkpoint_id(self) -> Path:
        return self.path

    def reset(self, checkpoint_id: PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = Path(os.fspath(checkpoint_id))
        self.save_id = uuid.uuid4().hex

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: PathLike) -> bool:
        return _inside_mount(checkpoint_id)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.path), save_id=self.save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        # Without collectives every rank would write a `.metadata` of its own, which the
        # reader does not look for: refused rather than saved unreadable.
        if not kwargs.get("use_collectives", True):
            raise InvalidArgument("MosafsStorageWriter writes one .metadata for every rank: "
                                  "save with use_collectives=True")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        # Every rank, before any writes: concurrent makers of one folder are harmless.
        os.makedirs(self.path, exist_ok=True)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(plan, storage_data=rank_file(rank))
                for rank, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Every item of PLAN as a tensor of one file, saved as that file's new version.
        Items are resolved all at once (DCP suggests lazily): one file is one save, and
        DefaultSavePlanner's tensors are the state dict's own (views, no copies)."""
        name: str = plan.storage_data
        tensors: dict[str, Any] = {}
        placed: list[tuple[MetadataIndex, str, int]] = []
        for item in plan.items:
            key = item_key(item)
            if key in tensors:
                raise InvalidArgument(f"two checkpoint items are both named {key!r}")
            data = planner.resolve_data(item)
            if isinstance(data, torch.Tensor):
                value: Any = data.detach().contiguous()
                nbytes = value.numel() * value.element_size()
            else:  # BYTE_IO: numpy takes the bytes without a copy (torch.frombuffer
                # would warn: they are read-only); safetensors stores them as U8.
                assert item.type == WriteItemType.BYTE_IO and isinstance(data, io.BytesIO)
                value = np.frombuffer(data.getvalue(), dtype=np.uint8)
                nbytes = int(value.nbytes)
            tensors[key] = value
            placed.append((item.index, key, nbytes))
        _unshare(tensors)
        result = checkpoint.save(tensors, self.path / name)
        assert isinstance(result, checkpoint.SaveResult)  # a blocking save
        done: Future[list[WriteResult]] = Future()
        done.set_result([WriteResult(index, nbytes, MosafsStorageInfo(name, key, result.version))
                         for index, key, nbytes in placed])
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """`.metadata`, once every rank's file is committed (DCP calls this after all
        write_data calls succeeded), renamed into place whole."""
        metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
        metadata.storage_meta = self.storage_meta()
        temporary = self.path / f"{METADATA}.{self.save_id}.tmp"
        with open(temporary, "wb") as f:
            pickle.dump(metadata, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path / METADATA)


def _unshare(tensors: dict[str, Any]) -> None:
    """Clone the tensors whose bytes overlap an earlier one's (tied weights, views of one
    buffer): mosafs.checkpoint, like safetensors, refuses tensors that share bytes. Those
    that share nothing are saved from their own memory."""
    spans = sorted((str(t.device), t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(),
                    key) for key, t in tensors.items()
                   if isinstance(t, torch.Tensor) and t.numel())
    device, end = "", 0  # the furthest byte kept so far on DEVICE
    for where, start, stop, key in spans:
        if where != device:
            device, end = where, stop
        elif start < end:
            tensors[key] = tensors[key].clone()
        else:
            end = stop


class MosafsStorageReader(StorageReader):
    """Loads a distributed checkpoint that MosafsStorageWriter saved into PATH.

    Files are read through the mount with the stock `safetensors.safe_open`, not with
    mosafs.checkpoint.load: the versions `.metadata` names are files of the `.versions`
    view, which only the mount offers (load reads a file's newest version), and safe_open
    reads only the slices a rank asks for (a rank loading a resharded or deduplicated
    item from another rank's file reads that item, not the whole file)."""

    def __init__(self, path: PathLike) -> None:
        super().__init__()
        self.path = Path(os.fspath(path))
        self.load_id = uuid.uuid4().hex
        self.storage_data: dict[MetadataIndex, MosafsStorageInfo] = {}

    @property
    def checkpoint_id(self) -> Path:
        return self.path

    def reset(self, checkpoint_id: PathLike | None = None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self.path = Path(os.fspath(checkpoint_id))
        self.load_id = uuid.uuid4().hex

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: PathLike) -> bool:
        return _inside_mount(checkpoint_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with open(self.path / METADATA, "rb") as f:
            metadata: Metadata = pickle.load(f)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        if not metadata.storage_data:
            raise InvalidArgument(f"{self.path / METADATA} names no stored items")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Every item of PLAN, each file version opened once."""
        from safetensors import safe_open

        by_file: dict[tuple[str, int], list[ReadItem]] = defaultdict(list)
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            by_file[info.file, info.version].append(item)
        for (name, version), items in by_file.items():
            path = self.path / VERSIONS / name / str(version)
            if not path.exists():
                raise FileNotFoundError(f"{path}: version {version} of {name}, which "
                                        f"{self.path / METADATA} names, is not kept (pruned?)")
            with safe_open(str(path), framework="pt") as f:
                for item in items:
                    key = self.storage_data[item.storage_index].key
                    if item.type == LoadItemType.BYTE_IO:
                        planner.load_bytes(item, io.BytesIO(f.get_tensor(key).numpy().tobytes()))
                        continue
                    piece = _slice(f, key, item.storage_offsets, item.lengths)
                    target = planner.resolve_tensor(item).detach()
                    if target.size() != piece.size():
                        raise InvalidArgument(f"{name}: {key!r} gives {tuple(piece.size())}, "
                                              f"the state dict wants {tuple(target.size())}")
                    target.copy_(piece)
                    planner.commit_tensor(item, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done


def _slice(f: Any, key: str, offsets: torch.Size, lengths: torch.Size) -> torch.Tensor:
    """Part [OFFSETS, OFFSETS + LENGTHS) of tensor KEY of an open safetensors file; the
    whole tensor with get_tensor (a 0-d tensor has no slice to take)."""
    part = f.get_slice(key)
    if all(o == 0 for o in offsets) and list(lengths) == list(part.get_shape()):
        return f.get_tensor(key)  # type: ignore[no-any-return]
    return part[tuple(slice(o, o + n) for o, n in zip(offsets, lengths, strict=True))]  # type: ignore[no-any-return]
