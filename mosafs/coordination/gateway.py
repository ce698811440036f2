"""The one place that talks to etcd: its v3 JSON gateway over HTTP, through etcd3gw.

Everything here turns etcd's answers into plain values (keys and values as bytes,
revisions and lease ids as ints) and every failure into CoordinationUnavailable, so the
rest of mosafs never sees a `requests` traceback. Reads and writes all go through
transactions (`Etcd3Client.transaction`): unlike etcd3gw's `get`, a transaction's answer
carries the store's revision, which a watch needs to start right after a read without
missing an event.

A Gateway is used by one thread at a time (a requests.Session is not promised to be
thread-safe): every keepalive thread and every watching loop makes its own.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import queue
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from etcd3gw import exceptions as etcd_exceptions
from etcd3gw.client import Etcd3Client
from etcd3gw.lease import Lease
from etcd3gw.watch import Watcher

from mosafs.errors import ConfigError, Unavailable

log = logging.getLogger("mosafs.coordination")

T = TypeVar("T")
# etcd 3.4 and later serve the gateway here; a fixed path spares a /version request per
# client (etcd3gw would discover it), and Debian 12 ships 3.4.
_API_PATH = "/v3/"
# How often a watch looks at its STOP (a timed wait on a queue: no request to etcd).
STOP_CHECK_S = 0.1


class CoordinationUnavailable(Unavailable):
    """etcd cannot be reached, or refused a request (no quorum, a timeout, a malformed
    answer). Whoever depends on a lease treats it as "the lease may be lapsing": the
    leader's own valid() decides, never this error."""


class LeaseNotFound(CoordinationUnavailable):
    """etcd does not know the lease (it expired or was revoked): the keys it carried are
    gone."""


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd holds it. `create_revision` is the store revision that created
    this incarnation of the key: it changes whenever the key is deleted and created again,
    which is what makes it a fencing token."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def parse_endpoint(text: str) -> tuple[str, str, int]:
    """(protocol, host, port) of `http://HOST:PORT`, `https://HOST:PORT` or `HOST:PORT`
    (IPv6 hosts in brackets); ConfigError otherwise."""
    url = urllib.parse.urlsplit(text if "://" in text else f"http://{text}")
    try:
        port = url.port
    except ValueError:
        port = None
    if url.scheme not in ("http", "https") or not url.hostname or port is None:
        raise ConfigError(f"an etcd endpoint must be http://HOST:PORT, got {text!r}")
    return url.scheme, url.hostname, port


def lease_seconds(ttl_s: float) -> int:
    """The whole seconds to ask etcd for (it grants whole seconds, and never less than
    asked: at least its minimum, 2 s with its default election timeout). Rounding up
    is safe: a holder judges its lease by TTL_S, which is never longer."""
    return max(1, math.ceil(ttl_s))


class _TimeoutSession(requests.Session):
    """A Session whose requests time out even where etcd3gw passes no timeout (its
    watch): a watch on an etcd that stopped answering would otherwise block forever.
    TIMEOUT is requests' (connect, read) pair."""

    def __init__(self, timeout: tuple[float, float]) -> None:
        super().__init__()
        self._default_timeout = timeout

    def request(self, method: Any, url: Any, *args: Any,  # type: ignore[override]
                **kwargs: Any) -> requests.Response:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self._default_timeout
        return super().request(method, url, *args, **kwargs)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _kv(raw: dict[str, Any]) -> KeyValue:
    # The gateway writes int64 fields as strings and leaves out zero values.
    return KeyValue(key=base64.b64decode(raw["key"]),
                    value=base64.b64decode(raw.get("value", "")),
                    create_revision=int(raw.get("create_revision", 0)),
                    mod_revision=int(raw.get("mod_revision", 0)),
                    lease=int(raw.get("lease", 0)))


def prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with PREFIX."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def op_range(key: bytes, *, prefix: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key)}
    if prefix:
        body["range_end"] = _b64(prefix_end(key))
    return {"request_range": body}


def op_put(key: bytes, value: bytes, lease: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = lease
    return {"request_put": body}


def cmp_equal(key: bytes, target: str, number: int) -> dict[str, Any]:
    """Compare TARGET (CREATE, MOD, VERSION, LEASE) of KEY with NUMBER; a key that does
    not exist has 0 for every one of them."""
    field = {"CREATE": "create_revision", "MOD": "mod_revision", "VERSION": "version",
             "LEASE": "lease"}[target]
    return {"key": _b64(key), "target": target, "result": "EQUAL", field: number}


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the transaction
    ranges: list[list[KeyValue]]  # the keys each range operation found, in order


class Gateway:
    """etcd3gw clients for ENDPOINTS (one etcd cluster). A request goes to the endpoint
    that answered last; when it cannot be reached, to the next, each tried once."""

    def __init__(self, endpoints: list[str], timeout: float,
                 watch_timeout: float | None = None) -> None:
        """TIMEOUT bounds every request; WATCH_TIMEOUT (default TIMEOUT) the wait for a
        watch's answer, which must outlast the longest wait_change."""
        if not endpoints:
            raise ConfigError("no etcd endpoint given")
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self._clients: list[Etcd3Client] = []
        for text in endpoints:
            protocol, host, port = parse_endpoint(text)
            session = _TimeoutSession((timeout, watch_timeout or timeout))
            self._clients.append(Etcd3Client(host=host, port=port, protocol=protocol,
                                             timeout=timeout, api_path=_API_PATH,
                                             session=session))
        self._current = 0

    def close(self) -> None:
        for client in self._clients:
            client.session.close()

    def call(self, what: str, fn: Callable[[Etcd3Client], T]) -> T:
        """FN(client) on the first endpoint that answers; CoordinationUnavailable (saying
        WHAT failed) when none does or etcd refuses. A request that timed out may have
        been applied: callers retry only what is safe to repeat (every write here is a
        compare-and-set, or idempotent)."""
        failures = []
        for step in range(len(self._clients)):
            index = (self._current + step) % len(self._clients)
            client = self._clients[index]
            try:
                result = fn(client)
            except (etcd_exceptions.ConnectionFailedError,
                    etcd_exceptions.ConnectionTimeoutError,
                    etcd_exceptions.InternalServerError,
                    requests.RequestException) as exc:
                # InternalServerError: this member has no leader or timed out; another
                # member of the cluster may do better.
                failures.append(f"{self.endpoints[index]}: {_reason(exc)}")
                continue
            except etcd_exceptions.Etcd3Exception as exc:
                raise _refused(what, self.endpoints[index], exc) from None
            except (ValueError, KeyError, TypeError) as exc:
                raise CoordinationUnavailable(
                    f"etcd at {self.endpoints[index]} gave a malformed answer to {what}: "
                    f"{exc!r}") from None
            self._current = index
            return result
        raise CoordinationUnavailable(f"etcd cannot be reached for {what}: "
                                      + "; ".join(failures))

    # -- key-value ------------------------------------------------------------------------

    def txn(self, what: str, compare: list[dict[str, Any]], success: list[dict[str, Any]],
            failure: list[dict[str, Any]] | None = None) -> TxnResult:
        """One transaction: if every COMPARE holds, SUCCESS's operations, else FAILURE's."""
        body = {"compare": compare, "success": success, "failure": failure or []}
        reply = self.call(what, lambda client: client.transaction(body))
        ranges = [[_kv(kv) for kv in response["response_range"].get("kvs", [])]
                  for response in reply.get("responses", [])
                  if "response_range" in response]
        return TxnResult(bool(reply.get("succeeded", False)),
                         int(reply["header"]["revision"]), ranges)

    def read(self, what: str, *ranges: dict[str, Any]) -> TxnResult:
        """RANGES (op_range's) read at one revision (a transaction of reads only, which
        etcd serves without a raft proposal)."""
        return self.txn(what, [], list(ranges))

    # -- leases ---------------------------------------------------------------------------

    def grant(self, ttl_s: float) -> int:
        """A new lease of TTL_S (rounded up to whole seconds); its id."""
        lease = self.call("a lease grant",
                          lambda client: client.lease(lease_seconds(ttl_s)))
        return lease.id

    def refresh(self, lease_id: int) -> int:
        """Keep LEASE_ID alive: the TTL etcd gives it again. LeaseNotFound when it is
        gone."""
        ttl = self.call("a lease refresh", lambda client: Lease(lease_id, client).refresh())
        if ttl <= 0:
            raise LeaseNotFound(f"etcd lease {lease_id:x} has expired")
        return ttl

    def revoke(self, lease_id: int) -> None:
        """Revoke LEASE_ID, deleting its keys; a lease already gone is no error."""
        with contextlib.suppress(LeaseNotFound):
            self.call("a lease revoke", lambda client: Lease(lease_id, client).revoke())

    def revoke_quietly(self, lease_id: int) -> None:
        """Revoke LEASE_ID if etcd can be reached; else it lapses by itself."""
        try:
            self.revoke(lease_id)
        except CoordinationUnavailable as exc:
            log.debug("lease %x left to lapse: %s", lease_id, exc)

    # -- watch ----------------------------------------------------------------------------

    def wait_change(self, key: bytes, after_revision: int, timeout: float,
                    stop: threading.Event | None = None) -> bool:
        """Block until KEY changes after AFTER_REVISION, at most TIMEOUT seconds, or until
        STOP is set (looked at every STOP_CHECK_S); whether it changed. A watch that
        cannot be made or breaks counts as a timeout: callers poll anyway, the watch only
        wakes them early. The wait can be long (a watch's thread and HTTP stream are made
        once per wait, etcd3gw's way) because STOP ends it at once."""
        def watch(client: Etcd3Client) -> bool:
            changes: queue.SimpleQueue[object] = queue.SimpleQueue()
            watcher = Watcher(client, key, changes.put, start_revision=after_revision + 1)
            try:
                return _first(changes, deadline, stop)
            finally:
                watcher.stop()

        deadline = time.monotonic() + timeout
        try:
            return self.call("a watch", watch)
        except CoordinationUnavailable as exc:
            log.debug("watch on %r failed (polling instead): %s", key, exc)
            # Wait out the time all the same (the caller's loop must not spin), or less
            # once STOP is set.
            left = max(0.0, deadline - time.monotonic())
            if stop is None:
                time.sleep(left)
            else:
                stop.wait(left)
            return False


def _first(changes: queue.SimpleQueue[object], deadline: float,
           stop: threading.Event | None) -> bool:
    """Whether CHANGES gets an item before DEADLINE (time.monotonic), giving up early once
    STOP is set."""
    while (left := deadline - time.monotonic()) > 0:
        if stop is not None and stop.is_set():
            return False
        try:
            changes.get(timeout=min(left, STOP_CHECK_S))
        except queue.Empty:
            continue
        return True
    return False


class FailureStreak:
    """Logs a run of failures to reach etcd once (a warning, then quietly), and the
    recovery once: a loop that retries every quarter second must not flood the log."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failing = False

    def fail(self, exc: Exception) -> None:
        (log.debug if self.failing else log.warning)("%s: %s", self.what, exc)
        self.failing = True

    def ok(self) -> None:
        if self.failing:
            log.info("%s: etcd answers again", self.what)
        self.failing = False


def _reason(exc: BaseException) -> str:
    detail = getattr(exc, "detail_text", None)
    text = detail or str(exc) or type(exc).__name__
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _refused(what: str, endpoint: str, exc: etcd_exceptions.Etcd3Exception) -> Exception:
    """The error for etcd's refusal EXC: its message, from the JSON body if it has one."""
    message = _reason(exc)
    with contextlib.suppress(ValueError, KeyError, TypeError):
        message = str(json.loads(exc.detail_text or "")["error"])
    if "lease not found" in message:
        return LeaseNotFound(f"etcd at {endpoint} refused {what}: {message}")
    return CoordinationUnavailable(f"etcd at {endpoint} refused {what}: {message}")
