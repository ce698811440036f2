"""The benefactor: a storage daemon that donates a directory and stores chunks by id.

- `mosafs.benefactor.chunkstore`: the ChunkStore interface and its filesystem backend
  (domain code: no gRPC).
- `mosafs.benefactor.servicer`: the gRPC Benefactor service over a ChunkStore.
- `mosafs.benefactor.main`: the `mosafs benefactor` process (server, registration and
  heartbeats with the manager).

See docs/benefactor.md.
"""
