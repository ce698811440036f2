"""mosafs: a distributed file system for checkpoint data."""

__version__ = "0.1.0"
