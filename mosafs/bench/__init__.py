"""Benchmarks that need real processes: `mosafs bench write` (write and read through a FUSE
mount, against a null pyfuse3 file system as the ceiling). See docs/benchmarks.md."""
