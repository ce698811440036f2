"""The client's middle layer: write sessions, readers and caches, between the FUSE
operations and the RPC layer. See docs/client.md for the concurrency rules."""

from mosafs.client.files.context import ClientConfig, ClientContext
from mosafs.client.files.filesystem import FileSystem

__all__ = ["ClientConfig", "ClientContext", "FileSystem"]
