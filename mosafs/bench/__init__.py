"""Benchmarks behind `mosafs bench`: `write` (write and read through a FUSE mount, against
a null pyfuse3 file system as the ceiling; real processes) and `hash` (content addressing
on the CPU, the GPU and the oracle backend; in-process). See docs/benchmarks.md."""
