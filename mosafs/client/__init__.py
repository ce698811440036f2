"""The mosafs client (SAI): a FUSE file system.

Layers, outermost first (an import-linter contract keeps them in order):
`operations` (pyfuse3 handlers, errno mapping) -> `files` (write sessions, readers, caches)
-> `rpc` (gRPC calls run in worker threads).
"""
