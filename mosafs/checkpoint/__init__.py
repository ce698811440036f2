"""GPU-native checkpoints in safetensors files (docs/checkpoint.md): `save` writes a state
dict as a new version of a file inside a mosafs mount, chunking and hashing tensors where
they live and sending only what the cluster does not have; `load` reads one back."""

from mosafs.checkpoint.api import SaveHandle, load, load_numpy, prepare, save
from mosafs.checkpoint.saving import SaveResult

__all__ = ["SaveHandle", "SaveResult", "load", "load_numpy", "prepare", "save"]
