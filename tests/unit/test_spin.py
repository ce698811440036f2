"""mosafs.rpc.spin against gRPC itself (a server in this process, answering any bytes
with the same bytes, after a pause for those that ask for one): calls made one after
another on a held channel complete in one thread, where gRPC alone starts one per call;
a released channel's thread ends with its last call, and closing the channel then
reports nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from mosafs.rpc import spin

METHOD = "/test.Echo/Echo"


def _echo(request: bytes, context: Any) -> bytes:
    if request.startswith(b"slow"):
        time.sleep(0.05)  # still in flight when the test takes the thread
    return request


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_echo)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0).wait()


@pytest.fixture
def uncaught() -> Iterator[list[threading.ExceptHookArgs]]:
    """What threads raised and nobody caught while the test ran (gRPC's spin thread
    reports a channel closed under it this way)."""
    seen: list[threading.ExceptHookArgs] = []
    before = threading.excepthook
    threading.excepthook = seen.append
    yield seen
    threading.excepthook = before


def _completing_threads(echo: Any, kept: spin.Spin | None, calls: int) -> list[threading.Thread]:
    """The thread each of CALLS calls, made one after another, completed in."""
    threads: list[threading.Thread] = []
    for i in range(calls):
        done = threading.Event()
        future = echo.future(b"slow %d" % i if i == 0 else b"%d" % i, timeout=10)
        if kept is not None:
            kept.started()
        future.add_done_callback(lambda _, done=done: (
            threads.append(threading.current_thread()), done.set()))
        assert done.wait(10)
        assert future.result().endswith(b"%d" % i)
    return threads


def test_calls_one_after_another_complete_in_one_held_thread(
        address: str, uncaught: list[threading.ExceptHookArgs]) -> None:
    channel = grpc.insecure_channel(address)
    echo = channel.unary_unary(METHOD)
    kept = spin.Spin(grpc.intercept_channel(channel))  # as mosafs.rpc.channels makes them
    threads = _completing_threads(echo, kept, 20)
    assert kept.held
    assert len({id(t) for t in threads}) == 1 and threads[0].is_alive()
    spin.finish([kept.release(lambda: echo.future(b"last", timeout=5))])
    assert not kept.held
    threads[0].join(5)
    assert not threads[0].is_alive()  # it ended with the release's call
    channel.close()
    time.sleep(0.2)
    assert not uncaught


def test_without_spin_grpc_starts_a_thread_per_call(address: str) -> None:
    """The behaviour Spin exists for: without it, the thread gRPC starts to complete a lone
    call ends with that call, so the next lone call starts another (if gRPC stops doing
    this, Spin is not needed). Each thread is waited for before the next call: a call made
    while the last one's thread was still winding down would be completed by it (a loaded
    CI machine saw 4 threads for 5 calls made back to back)."""
    threads: list[threading.Thread] = []
    with grpc.insecure_channel(address) as channel:
        echo = channel.unary_unary(METHOD)
        for _ in range(3):
            (thread,) = _completing_threads(echo, None, 1)
            thread.join(5)
            assert not thread.is_alive()  # gRPC kept no thread after its last call
            threads.append(thread)
    assert len({id(t) for t in threads}) == 3


def test_a_channel_closed_under_a_held_thread_is_what_release_prevents(
        address: str, uncaught: list[threading.ExceptHookArgs]) -> None:
    channel = grpc.insecure_channel(address)
    echo = channel.unary_unary(METHOD)
    kept = spin.Spin(channel)
    (thread, *_) = _completing_threads(echo, kept, 2)
    channel.close()  # no release: the waiting thread gets an event without a callback
    thread.join(10)
    assert not thread.is_alive()
    assert [type(u.exc_value) for u in uncaught] == [TypeError]


def test_a_probe_done_before_release_sees_it_leaves_no_thread_behind(
        address: str, uncaught: list[threading.ExceptHookArgs]) -> None:
    """The race a mount's stop hit on a loaded machine: the release's probe completed (a
    fast failure) before the release gave the held count back. The thread must still end,
    and closing the channel must report nothing."""
    channel = grpc.insecure_channel(address)
    echo = channel.unary_unary(METHOD)
    kept = spin.Spin(channel)
    (thread, *_) = _completing_threads(echo, kept, 2)
    probes: list[Any] = []

    def probe() -> Any:
        future = echo.future(b"probe", timeout=5)
        if not probes:  # the first one completes before release gets it back
            future.result(timeout=5)
        probes.append(future)
        return future

    spin.finish([kept.release(probe)])
    assert not kept.held
    thread.join(5)
    assert not thread.is_alive()
    channel.close()
    time.sleep(0.2)
    assert not uncaught
    assert len(probes) == 2  # the thread ended with the second probe


def test_release_without_a_held_thread_starts_no_call(address: str) -> None:
    kept = spin.Spin(grpc.insecure_channel(address))
    assert kept.release(lambda: pytest.fail("a probe of a channel never held")) is None


def test_a_channel_without_grpc_s_call_count_is_left_alone() -> None:
    kept = spin.Spin(object())
    kept.started()
    assert not kept.held
    spin.finish([None])  # nothing to wait for
