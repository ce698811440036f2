"""PutChunk over gRPC between two processes on loopback: CPU per byte in the client and in
the server. The floor of the transport under every mosafs write; `--tls` runs it over
mutual TLS with certificates of mosafs' own CA (what `mosafs up` does). Modes, each a
step closer to a benefactor's put:

    none       generated protobuf messages, a servicer that drops the bytes
    hash       the same, and the servicer verifies BLAKE3
    wire       mosafs' own framing (mosafs.rpc.chunkwire: one copy less on each side,
               as the mount and the benefactor use it), bytes dropped
    wire-hash  chunkwire, and BLAKE3 verified
    store      chunkwire into a real FileChunkStore in a temporary directory: BLAKE3,
               write, fsync, rename, directory fsync (a benefactor's put, less its
               servicer's metrics)

    .venv/bin/python benchmarks/grpc_put.py [--tls] [--size BYTES] MODE \
        ['[["grpc.option", value], ...]']

Prints one JSON object: MB/s (512 MiB in puts of SIZE, default 1 MiB, 4 in flight),
client_ns_B, server_ns_B, and the server's CPU per put (server_us_put): comparing sizes
splits a put's cost into a part per put and a part per byte (an `ec:4+2` pool puts
fragments of a quarter chunk, 6 per chunk, where `replicas:3` puts 3 whole chunks).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import blake3
import grpc

from mosafs import certs
from mosafs._proto import benefactor_pb2 as pb
from mosafs._proto import benefactor_pb2_grpc as pbg
from mosafs.benefactor.chunkstore import FileChunkStore
from mosafs.rpc import chunkwire, security
from mosafs.rpc.handlers import add_decoding_in_handlers

MAX = 65 << 20
BASE = [("grpc.max_send_message_length", MAX), ("grpc.max_receive_message_length", MAX)]
TOTAL = 512 << 20


PUT_METHOD = "/mosafs.v1.Benefactor/PutChunk"
MODES = ["none", "hash", "wire", "wire-hash", "store"]


class _Sink(pbg.BenefactorServicer):
    def __init__(self, mode: str, store_dir: str) -> None:
        self.mode = mode
        self.store = FileChunkStore(store_dir) if mode == "store" else None

    def PutChunk(self, request: Any, context: Any) -> Any:
        if self.store is not None:
            self.store.put(request.id, request.data)
        elif (self.mode.endswith("hash")
              and blake3.blake3(request.data).digest() != request.id):
            raise ValueError("id mismatch")
        return pb.PutChunkResponse()


def _serve(ports: Any, mode: str, options: list[tuple[str, Any]], tls: str | None,
           store_dir: str) -> None:
    srv = grpc.server(futures.ThreadPoolExecutor(16), options=BASE + options)
    sink = _Sink(mode, store_dir)
    if mode in ("none", "hash"):
        pbg.add_BenefactorServicer_to_server(sink, srv)
    else:
        add_decoding_in_handlers(pbg.add_BenefactorServicer_to_server, sink, srv,
                                 codecs={"PutChunk": (chunkwire.decode_put, None)})
    if tls:
        identity = certs.load(Path(tls), "benefactor")
        ports.put(srv.add_secure_port("127.0.0.1:0", security.server_credentials(identity)))
    else:
        ports.put(srv.add_insecure_port("127.0.0.1:0"))
    srv.start()
    srv.wait_for_termination()


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tls_dir() -> str:
    """A CA with a benefactor and a client certificate, in a temporary directory."""
    directory = Path(tempfile.mkdtemp(prefix="grpc-put-tls-"))
    certs.init_ca(directory)
    certs.issue(directory, "benefactor", "benefactor")
    certs.issue(directory, "client", "client")
    return str(directory)


def _channel(address: str, options: list[tuple[str, Any]], tls: str | None) -> grpc.Channel:
    if not tls:
        return grpc.insecure_channel(address, options=BASE + options)
    credentials = security.channel_credentials(certs.load(Path(tls), "client"))
    return grpc.secure_channel(address, credentials, options=[
        *BASE, *options, ("grpc.ssl_target_name_override", certs.SERVER_NAME)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="none", choices=MODES)
    parser.add_argument("options", nargs="?", default="[]", help="JSON list of gRPC options")
    parser.add_argument("--tls", action="store_true", help="mutual TLS (mosafs certs)")
    parser.add_argument("--size", type=int, default=1 << 20, help="bytes per put")
    args = parser.parse_args()
    mode = args.mode
    options = [tuple(o) for o in json.loads(args.options)]
    tls = _tls_dir() if args.tls else None
    # On the disk under the temporary directory (TMPDIR): what a benefactor's would be.
    store_dir = tempfile.mkdtemp(prefix="grpc-put-store-")
    try:
        _run(mode, options, tls, store_dir, args.size)
    finally:
        for directory in (tls, store_dir):
            if directory:
                shutil.rmtree(directory, ignore_errors=True)


def _run(mode: str, options: list[tuple[str, Any]], tls: str | None, store_dir: str,
         size: int) -> None:
    puts = max(1, TOTAL // size)
    ports: Any = mp.Queue()
    server = mp.Process(target=_serve, args=(ports, mode, options, tls, store_dir),
                        daemon=True)
    server.start()
    channel = _channel(f"127.0.0.1:{ports.get()}", options, tls)
    stub = pbg.BenefactorStub(channel)
    # Distinct chunks, so that `store` writes every put (a stored id is only touched).
    blobs = [os.urandom(size) for _ in range(puts + 1)]
    ids = [blake3.blake3(b).digest() for b in blobs]
    raw_put = channel.unary_unary(PUT_METHOD, request_serializer=None,
                                  response_deserializer=pb.PutChunkResponse.FromString)

    def put(i: int) -> None:
        if mode in ("none", "hash"):
            stub.PutChunk(pb.PutChunkRequest(id=ids[i], data=blobs[i]))
        else:
            raw_put(chunkwire.encode_put(ids[i], blobs[i]))

    put(puts)
    with futures.ThreadPoolExecutor(4) as pool:
        c0, s0, t0 = time.process_time(), _cpu_s(server.pid or 0), time.perf_counter()
        list(pool.map(put, range(puts)))
        t1, c1, s1 = time.perf_counter(), time.process_time(), _cpu_s(server.pid or 0)
    total = puts * size
    print(json.dumps({"mode": mode, "tls": bool(tls), "options": options, "size": size,
                      "MB_s": round(total / (t1 - t0) / 1e6),
                      "client_ns_B": round((c1 - c0) / total * 1e9, 2),
                      "server_ns_B": round((s1 - s0) / total * 1e9, 2),
                      "server_us_put": round((s1 - s0) / puts * 1e6)}))
    server.kill()


if __name__ == "__main__":
    main()
