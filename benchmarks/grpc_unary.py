"""A small unary call (a Lookup's request and answer, answered at once) between two
processes on loopback: calls per second and CPU per call in the client and in the server.
The floor of every metadata operation the mount sends the manager (docs/benchmarks.md,
"Metadata"), for each way Python's grpcio can make and serve the call:

    server  sync   grpc.server with a thread pool (what mosafs' servers are)
            aio    grpc.aio.server on an asyncio loop
    client  block  blocking calls, one thread per concurrent caller (the mount's
                   metadata calls run so, from trio.to_thread)
            future callable.future(...) from one thread, CONCURRENCY in flight
            aio    grpc.aio channel on an asyncio loop, CONCURRENCY tasks

    .venv/bin/python benchmarks/grpc_unary.py [--server sync|aio] [--client block|future|aio]
        [--concurrency N] [--seconds S] [--batch B]

--batch B answers B lookups per call (a repeated field), to show what batching saves.
Plaintext: TLS adds a per-byte cost that these small messages hardly pay. Prints one JSON
object: calls/s, lookups/s, client_us and server_us of CPU per lookup (user + system).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc

from mosafs._proto import manager_pb2 as pb

METHOD = "/bench.Unary/Lookup"


def _answer(raw: bytes) -> bytes:
    request = pb.ReadDirRequest.FromString(raw)  # stands for a batch of lookups
    out = pb.ReadDirResponse()
    for _ in range(max(1, request.limit)):
        out.entries.add(name="f123", attr=pb.Attr(inode=12345, mode=0o100644, nlink=1,
                                                  size=0, mtime_ns=time.time_ns()))
    return out.SerializeToString()


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _serve_sync(port_out: Any, stop: Any, cpu_out: Any) -> None:
    def handler(raw: bytes, context: Any) -> bytes:
        return _answer(raw)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Unary", {"Lookup": grpc.unary_unary_rpc_method_handler(handler)}),))
    port_out.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    cpu0 = _cpu()
    stop.wait()
    cpu_out.put(_cpu() - cpu0)
    server.stop(0)


def _serve_aio(port_out: Any, stop: Any, cpu_out: Any) -> None:
    async def main() -> None:
        async def handler(raw: bytes, context: Any) -> bytes:
            return _answer(raw)

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "bench.Unary", {"Lookup": grpc.unary_unary_rpc_method_handler(handler)}),))
        port_out.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        cpu0 = _cpu()
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        cpu_out.put(_cpu() - cpu0)
        await server.stop(0)

    asyncio.run(main())


def _client(kind: str, port: int, concurrency: int, seconds: float, batch: int) -> int:
    request = pb.ReadDirRequest(inode=1, start_after="name", limit=batch).SerializeToString()
    target = f"127.0.0.1:{port}"
    if kind == "aio":
        return asyncio.run(_client_aio(target, request, concurrency, seconds))
    channel = grpc.insecure_channel(target)
    call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    call(request, timeout=10)  # connected
    deadline = time.monotonic() + seconds
    count = [0]
    lock = threading.Lock()
    if kind == "block":
        def loop() -> None:
            n = 0
            while time.monotonic() < deadline:
                call(request, timeout=10)
                n += 1
            with lock:
                count[0] += n

        threads = [threading.Thread(target=loop) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        done = threading.Semaphore(0)

        def start() -> None:
            future = call.future(request, timeout=10)
            future.add_done_callback(finished)

        def finished(future: Any) -> None:
            future.result()
            with lock:
                count[0] += 1
            if time.monotonic() < deadline:
                start()
            else:
                done.release()

        for _ in range(concurrency):
            start()
        for _ in range(concurrency):
            done.acquire()
    channel.close()
    return count[0]


async def _client_aio(target: str, request: bytes, concurrency: int, seconds: float) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        await call(request, timeout=10)
        deadline = time.monotonic() + seconds
        count = 0

        async def loop() -> None:
            nonlocal count
            while time.monotonic() < deadline:
                await call(request, timeout=10)
                count += 1

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=["sync", "aio"], default="sync")
    parser.add_argument("--client", choices=["block", "future", "aio"], default="block")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    port_q, cpu_q, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    serve = _serve_sync if args.server == "sync" else _serve_aio
    server = ctx.Process(target=serve, args=(port_q, stop, cpu_q))
    server.start()
    port = port_q.get(timeout=30)
    cpu0, wall0 = _cpu(), time.monotonic()
    calls = _client(args.client, port, args.concurrency, args.seconds, args.batch)
    client_cpu, wall = _cpu() - cpu0, time.monotonic() - wall0
    stop.set()
    server_cpu = cpu_q.get(timeout=30)
    server.join(timeout=30)
    lookups = calls * args.batch
    print(json.dumps({
        "server": args.server, "client": args.client, "concurrency": args.concurrency,
        "batch": args.batch, "calls_per_s": round(calls / wall), "lookups_per_s":
        round(lookups / wall), "client_us": round(client_cpu / lookups * 1e6, 1),
        "server_us": round(server_cpu / lookups * 1e6, 1)}))


if __name__ == "__main__":
    main()
