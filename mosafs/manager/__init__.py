"""The manager: mosafs's metadata server (DESIGN §2-§4, §8).

Domain modules (no grpc, no FUSE, no trio):
  metadata  the LMDB store: namespace, versions, block-maps, chunk index, registrations, pools
  pools     pool defaults and validation of pool settings
  folders   folder settings (pool, series pattern, policy), a write's base, pruning
  pruning   the pruning rules (pure)
  series    series patterns (pure)
  registry  benefactor soft state (liveness, free space) and placement
  leases    write leases of open write sessions (in memory)
  core      the write/read protocol and administration on top of them: OpenWrite,
            CommitVersion, restore, pruning, drains, ...
Process and wire:
  servicer  the gRPC servicer (unpack, call the domain, pack)
  main      `mosafs manager`
"""
