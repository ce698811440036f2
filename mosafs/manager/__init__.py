"""The manager: mosafs's metadata server (DESIGN §2-§4, §8).

Domain modules (no grpc, no FUSE, no trio):
  metadata  the LMDB store: namespace, versions, block-maps, chunk index, registrations, pools
  pools     pool defaults and validation of pool settings
  registry  benefactor soft state (liveness, free space) and placement
  leases    write leases of open write sessions (in memory)
  core      the write/read protocol on top of the three: OpenWrite, CommitVersion, ...
Process and wire:
  servicer  the gRPC servicer (unpack, call the domain, pack)
  main      `mosafs manager`
"""
