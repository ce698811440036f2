# Sourced (`. scripts/device_env.sh`) by the device_*.sh scripts on a lent GPU machine,
# from the repository root: Python's environment and the FUSE tools.
#   - the wheels in .whl (Python 3.12 builds of our dependencies the machine lacks:
#     blake3, trio, grpcio, protobuf, lmdb, pyfuse3, pyeclib, cryptography, ...) go to
#     /tmp/site once, and shadow the machine's (the generated protobuf code needs its
#     version);
#   - the Debian packages in .devcarry/debs (libfuse3, fusermount3) are unpacked under
#     /tmp/fuseroot for the mount tests and benchmarks.
# Also: PY, the variables NCCL and torch need on these machines, and step NAME (whether
# STEPS names NAME).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
if [ -d .whl ] && [ ! -d /tmp/site/blake3 ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
if [ -d /tmp/site ]; then
    export PYTHONPATH=/tmp/site:$PWD PATH=$PATH:/tmp/site/bin
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -d .devcarry/debs ] && ! command -v fusermount3 >/dev/null; then
    for f in .devcarry/debs/*.deb; do dpkg -x "$f" /tmp/fuseroot; done
    export LD_LIBRARY_PATH=/tmp/fuseroot/lib/x86_64-linux-gnu:/tmp/fuseroot/usr/lib/x86_64-linux-gnu
    export PATH=$PATH:/tmp/fuseroot/bin:/tmp/fuseroot/usr/bin
fi
step() { case " $STEPS " in *" $1 "*) return 0;; *) return 1;; esac; }
