"""What shipping one replication-log entry costs in CPU, by transport (docs/benchmarks.md,
"Standby managers"): a leader sends entries of ENTRY bytes to a follower, which confirms
each; at most WINDOW entries unconfirmed. Two processes on loopback, plaintext; CPU per
entry in each (/proc, user + system).

    grpc    a bidirectional gRPC stream, as the Follow call is: the leader's entries are
            the responses of a generator (sync server, thread pool), the confirmations
            the requests of an iterator (a queue, fed by the follower's thread)
    socket  one TCP connection: length-prefixed frames, each side one thread writing
            and one reading (what a transport of the log's own would be)

    .venv/bin/python benchmarks/stream_cost.py [--transport grpc socket] [--entries N]
        [--entry BYTES] [--window W]
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

FRAME = struct.Struct(">I")
ACK = struct.Struct(">Q")


def cpu_s() -> float:
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- gRPC ------------------------------------------------------------------------------------


def grpc_leader(port: int, entries: int, entry: int, window: int) -> None:
    import grpc

    sent = threading.Semaphore(window)
    done = threading.Event()
    payload = os.urandom(entry)

    def follow(requests: Iterator[bytes], context: object) -> Iterator[bytes]:
        def confirmations() -> None:
            for _ in requests:
                sent.release()
            done.set()

        threading.Thread(target=confirmations, daemon=True).start()
        for _ in range(entries):
            sent.acquire()
            yield payload

    handler = grpc.method_handlers_generic_handler("bench.Log", {
        "Follow": grpc.stream_stream_rpc_method_handler(follow)})
    from concurrent.futures import ThreadPoolExecutor

    server = grpc.server(ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    sys.stdin.readline()
    start = cpu_s()
    print("start", flush=True)
    done.wait()
    print(f"leader_cpu {cpu_s() - start}", flush=True)
    server.stop(1)


def grpc_follower(port: int, entries: int) -> float:
    import grpc

    acks: queue.Queue[bytes | None] = queue.Queue()

    def requests() -> Iterator[bytes]:
        while (item := acks.get()) is not None:
            yield item

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.stream_stream("/bench.Log/Follow", request_serializer=None,
                                response_deserializer=None)(requests())
        start = cpu_s()
        for n, _ in enumerate(call, 1):
            acks.put(ACK.pack(n))
            if n == entries:
                acks.put(None)
        return cpu_s() - start


# -- socket ----------------------------------------------------------------------------------


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise EOFError
        buf += got
    return bytes(buf)


def socket_leader(port: int, entries: int, entry: int, window: int) -> None:
    listener = socket.create_server(("127.0.0.1", port))
    print("ready", flush=True)
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sys.stdin.readline()
    start = cpu_s()
    print("start", flush=True)
    sent = threading.Semaphore(window)
    payload = FRAME.pack(entry) + os.urandom(entry)

    def confirmations() -> None:
        reader = conn.makefile("rb")
        for _ in range(entries):
            reader.read(ACK.size)
            sent.release()

    reader = threading.Thread(target=confirmations)
    reader.start()
    for _ in range(entries):
        sent.acquire()
        conn.sendall(payload)
    reader.join()
    print(f"leader_cpu {cpu_s() - start}", flush=True)
    conn.close()


def socket_follower(port: int, entries: int) -> float:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = sock.makefile("rb")
    start = cpu_s()
    for n in range(1, entries + 1):
        (size,) = FRAME.unpack(reader.read(FRAME.size))
        reader.read(size)
        sock.sendall(ACK.pack(n))
    return cpu_s() - start


# -- the run ---------------------------------------------------------------------------------


def run(transport: str, entries: int, entry: int, window: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    leader = subprocess.Popen(
        [sys.executable, __file__, "--role", "leader", "--transport", transport,
         "--port", str(port), "--entries", str(entries), "--entry", str(entry),
         "--window", str(window)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert leader.stdout is not None and leader.stdin is not None
    assert leader.stdout.readline().strip() == "ready"
    result: dict[str, float] = {}

    def follow() -> None:
        fn = grpc_follower if transport == "grpc" else socket_follower
        result["follower"] = fn(port, entries)

    thread = threading.Thread(target=follow)
    if transport == "socket":
        thread.start()  # the leader accepts before it starts
    leader.stdin.write("go\n")
    leader.stdin.flush()
    assert leader.stdout.readline().strip() == "start"
    started = time.perf_counter()
    if transport == "grpc":
        thread.start()
    thread.join()
    wall = time.perf_counter() - started
    line = leader.stdout.readline().split()
    leader.wait(30)
    lead = float(line[1])
    print(f"{transport:6} {entries} entries of {entry} B, window {window}: "
          f"{entries / wall:,.0f} entries/s; CPU per entry: leader {lead / entries * 1e6:.0f} "
          f"us, follower {result['follower'] / entries * 1e6:.0f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", nargs="+", default=["grpc", "socket"])
    parser.add_argument("--entries", type=int, default=20000)
    parser.add_argument("--entry", type=int, default=600)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "leader":
        fn = grpc_leader if args.transport[0] == "grpc" else socket_leader
        fn(args.port, args.entries, args.entry, args.window)
        return
    for transport in args.transport:
        run(transport, args.entries, args.entry, args.window)


if __name__ == "__main__":
    main()
