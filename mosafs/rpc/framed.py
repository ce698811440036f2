"""Length-prefixed messages on one TCP connection, with the process's mutual TLS
(mosafs.rpc.security) or in plaintext (`--insecure`): the transport of a standby's feed
(docs/standby.md, "The feed connection"). A gRPC stream cost 180-260 µs of CPU per message
at each end; frames on a socket cost a tenth of that (docs/benchmarks.md, "Standby
managers").

A frame is a 4-byte big-endian length and that many bytes (at most MAX_FRAME). A server
(`Listener`) requires a client certificate of the cluster's CA, refuses a revoked one and
a role the method does not allow (as `security.Policy` does for RPCs), and hands each
accepted connection to its handler in a thread of its own; a client (`connect`) checks
that the server's certificate is of the role it expects.

Threads: one thread may receive while another sends. OpenSSL allows one call at a time on
a connection, and CPython's ssl module does not serialize them (two threads reading and
writing one SSLSocket corrupt its state: python/cpython#151508), so the socket is
non-blocking, every call on it is made under a lock, and the waits for it to become
readable or writable are made outside the lock.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import socket
import ssl
import struct
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from mosafs import certs
from mosafs.errors import AccessDenied, InvalidArgument, MosafsError, Unavailable
from mosafs.rpc import security

log = logging.getLogger(__name__)

MAX_FRAME = 64 * (1 << 20) + 64 * 1024  # as gRPC messages (mosafs.rpc.channels)
HANDSHAKE_S = 10.0   # a peer that has not finished its TLS handshake by then is dropped
MAX_CONNECTIONS = 16  # authorized connections open at once on one listener (standbys
# are few); handshakes in progress have their own limit, and when it is reached the
# oldest gives way: a peer that connects and says nothing (no certificate needed for
# that) must not lock the standbys out, whose handshakes take milliseconds
MAX_HANDSHAKES = 64
WAKE_MS = 1000  # a waiting thread looks at least this often whether close() ended it
_LENGTH = struct.Struct(">I")
PROCESS_IDENTITY = object()  # `identity` left out: the process's (mosafs.rpc.security)
_READ_BYTES = 256 * 1024


class Closed(Unavailable):
    """The connection ended (the peer closed it, or it broke)."""


class Connection:
    """One framed connection (made by `connect` or a `Listener`): `send` and `receive`
    frames, `close` from any thread (a thread waiting in the other call wakes)."""

    def __init__(self, sock: socket.socket, peer: certs.PeerCertificate | None) -> None:
        self.peer = peer  # the other end's certificate (None in plaintext)
        self._sock = sock
        self._fd = sock.fileno()
        self._lock = threading.Lock()
        self._closed = False
        self._buffer = bytearray()
        sock.setblocking(False)

    def send(self, data: bytes) -> None:
        """Send one frame (Closed if the connection ended)."""
        if len(data) > MAX_FRAME:
            raise InvalidArgument(f"a frame of {len(data)} bytes (at most {MAX_FRAME})")
        view = memoryview(_LENGTH.pack(len(data)) + data)
        while view:
            sent = self._io(self._sock.send, view[:1 << 20], select.POLLOUT)
            view = view[sent:]

    def receive(self) -> bytes | None:
        """The next frame; None when the peer closed the connection between frames.
        Closed if it broke, InvalidArgument for a frame longer than MAX_FRAME."""
        while (frame := self._whole()) is None:
            self._readable()
            data = self._io(self._sock.recv, _READ_BYTES, select.POLLIN)
            if not data:
                if self._buffer:
                    raise Closed(f"the connection ended inside a frame ({len(self._buffer)} "
                                 f"bytes of it)")
                return None
            self._buffer += data
        return frame

    def readable(self, timeout: float) -> bool:
        """Whether receiving can start at once: bytes are held already, or arrive within
        TIMEOUT seconds. A closed connection is readable (receive reports it)."""
        with self._lock:
            if self._closed or self._buffer or self._tls_pending():
                return True
        return self._wait(select.POLLIN, max(0, int(timeout * 1000)))

    def receive_ready(self) -> bytes | None:
        """The next frame if it is here already (None: receiving it would wait; the end
        of the connection is left for `receive` to report)."""
        frame = self._whole()
        if frame is None:
            with self._lock:
                if self._closed:
                    raise Closed("the connection was closed")
                try:
                    self._buffer += self._sock.recv(_READ_BYTES)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                    return None
                except (OSError, ssl.SSLError) as exc:
                    raise Closed(f"the connection broke: {exc}") from None
            frame = self._whole()
        return frame

    def _whole(self) -> bytes | None:
        """The first frame of the buffer, if it is whole there (taken out)."""
        if len(self._buffer) < _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(self._buffer)
        if length > MAX_FRAME:
            raise InvalidArgument(f"a frame of {length} bytes announced (at most {MAX_FRAME})")
        end = _LENGTH.size + length
        if len(self._buffer) < end:
            return None
        frame = bytes(self._buffer[_LENGTH.size:end])
        del self._buffer[:end]
        return frame

    def close(self) -> None:
        """End the connection; a thread blocked in send or receive gets Closed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a thread waiting in poll
        with self._lock:
            self._sock.close()

    def _io(self, call: Callable[[Any], Any], arg: Any, event: int) -> Any:
        """CALL(ARG) on the non-blocking socket under the lock, waiting outside it until
        the socket is ready for what the call (or the TLS layer below it) needs."""
        while True:
            with self._lock:
                if self._closed:
                    raise Closed("the connection was closed")
                try:
                    return call(arg)
                except ssl.SSLWantReadError:
                    wait = select.POLLIN
                except ssl.SSLWantWriteError:
                    wait = select.POLLOUT
                except BlockingIOError:
                    wait = event
                except (OSError, ssl.SSLError) as exc:
                    raise Closed(f"the connection broke: {exc}") from None
            self._wait(wait)

    def _readable(self) -> None:
        """Wait until there is something to read, unless TLS holds decrypted bytes already:
        a read that finds nothing costs a failed call and an exception (most reads of a
        feed come when the other end is idle)."""
        with self._lock:
            held = self._tls_pending()
        if not held:
            self._wait(select.POLLIN)

    def _tls_pending(self) -> bool:
        """Under the lock: whether TLS holds decrypted bytes not read yet (poll cannot
        see them)."""
        return isinstance(self._sock, ssl.SSLSocket) and not self._closed and \
            self._sock.pending() > 0

    def _wait(self, event: int, timeout_ms: int = WAKE_MS) -> bool:
        """Whether the socket became ready for EVENT within TIMEOUT_MS. The default,
        WAKE_MS, is for callers that wait in a loop: a close() between the lock and the
        poll may have let the number of this socket's descriptor go to another one."""
        poller = select.poll()
        poller.register(self._fd, event)
        return bool(poller.poll(timeout_ms))


# --- TLS ------------------------------------------------------------------------------------

def _context(identity: certs.Identity, purpose: int) -> ssl.SSLContext:
    """A TLS context presenting IDENTITY and trusting only the cluster's CA."""
    ctx = ssl.SSLContext(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(cadata=identity.ca.decode())
    ctx.verify_mode = ssl.CERT_REQUIRED
    # The ssl module loads a certificate and key only from files: a private folder for the
    # moment it reads them.
    with tempfile.TemporaryDirectory(prefix="mosafs-tls-") as folder:
        cert, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        cert.write_bytes(identity.cert)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(identity.key)
        ctx.load_cert_chain(cert, key)
    return ctx


def _resolved(identity: Any) -> certs.Identity | None:
    return security.current() if identity is PROCESS_IDENTITY else \
        cast(certs.Identity | None, identity)


def _peer_of(tls: ssl.SSLSocket) -> bytes:
    der = tls.getpeercert(binary_form=True)
    if der is None:  # CERT_REQUIRED: a handshake without one fails first
        raise AccessDenied("the peer presented no certificate")
    return ssl.DER_cert_to_PEM_cert(der).encode()


def connect(host: str, port: int, *, role: str, timeout: float = HANDSHAKE_S,
            identity: Any = PROCESS_IDENTITY) -> Connection:
    """A connection to HOST:PORT with the process's identity (or IDENTITY; None:
    plaintext), whose server must hold a certificate of ROLE. Unavailable if it cannot be
    reached, AccessDenied for a server of another role."""
    identity = _resolved(identity)
    try:
        sock = socket.create_connection((host.strip("[]"), port), timeout=timeout)
    except OSError as exc:
        raise Unavailable(f"cannot connect to {host}:{port}: {exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if identity is None:
        return Connection(sock, None)
    try:
        # Servers' certificates name SERVER_NAME whatever their address (docs/operations.md).
        tls = _context(identity, ssl.PROTOCOL_TLS_CLIENT).wrap_socket(
            sock, server_hostname=certs.SERVER_NAME)
        peer = certs.peer_certificate(_peer_of(tls))
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        raise Unavailable(f"TLS with {host}:{port} failed: {exc}") from None
    except MosafsError:
        sock.close()
        raise
    if peer.role != role:
        tls.close()
        raise AccessDenied(f"{host}:{port} presented a certificate of role {peer.role}, "
                           f"not {role}")
    return Connection(tls, peer)


# --- the server side --------------------------------------------------------------------------

class Listener:
    """Accepts framed connections on HOST (PORT 0: a free port) and runs HANDLE(connection)
    in a thread for each caller whose certificate's role is in ALLOWED (METHOD names what
    it calls, in the audit log); refused callers get REFUSE(connection, error) first.
    IDENTITY: the process's unless given (None: plaintext)."""

    def __init__(self, host: str, port: int, handle: Callable[[Connection], None], *,
                 method: str, allowed: frozenset[str],
                 refuse: Callable[[Connection, MosafsError], None],
                 identity: Any = PROCESS_IDENTITY) -> None:
        self._identity = _resolved(identity)
        self._context = (_context(self._identity, ssl.PROTOCOL_TLS_SERVER)
                         if self._identity is not None else None)
        self._handle, self._method, self._allowed, self._refuse = handle, method, allowed, \
            refuse
        self._sock = socket.create_server((host.strip("[]"), port),
                                          family=_family(host.strip("[]")))
        self.port: int = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._connections: set[Connection] = set()
        # Accepted, TLS handshake not done: key -> the socket that holds the descriptor
        # (the plain one, then its TLS wrapper), oldest first.
        self._handshaking: dict[int, socket.socket] = {}
        self._keys = itertools.count()
        self._threads: set[threading.Thread] = set()
        self._stopping = False
        self._acceptor = threading.Thread(target=self._accept, name="feed-accept",
                                          daemon=True)

    def start(self) -> Listener:
        self._acceptor.start()
        return self

    def close(self) -> None:
        """Stop accepting, end every connection, and wait for the handlers."""
        with self._lock:
            self._stopping = True
            sockets, connections = list(self._open), list(self._connections)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._sock.close()
        for sock in sockets:  # not yet connections: accepted, or in their TLS handshake
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for conn in connections:
            conn.close()
        self._acceptor.join()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join()

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._sock.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._stopping or len(self._connections) >= MAX_CONNECTIONS:
                    sock.close()
                    log.info("feed connection from %s dropped: %s", addr[0],
                             "stopping" if self._stopping else "too many open")
                    continue
                if len(self._handshaking) >= MAX_HANDSHAKES:
                    oldest = self._handshaking.pop(next(iter(self._handshaking)))
                    with contextlib.suppress(OSError):
                        oldest.shutdown(socket.SHUT_RDWR)  # its handshake fails at once
                key = next(self._keys)
                self._handshaking[key] = sock
                self._open.add(sock)
                thread = threading.Thread(target=self._serve, args=(sock, addr[0], key),
                                          name=f"feed-{addr[0]}", daemon=True)
                self._threads.add(thread)
            thread.start()

    def _serve(self, sock: socket.socket, host: str, key: int) -> None:
        conn: Connection | None = None
        try:
            conn = self._accepted(sock, host, key)
            if conn is not None:
                self._handle(conn)
        except Exception:  # a bug: logged, and only this connection ends
            log.exception("feed connection from %s failed", host)
        finally:
            if conn is not None:
                conn.close()
            sock.close()
            with self._lock:
                self._open.discard(sock)
                self._handshaking.pop(key, None)
                if conn is not None:
                    self._connections.discard(conn)
                self._threads.discard(threading.current_thread())

    def _accepted(self, sock: socket.socket, host: str, key: int) -> Connection | None:
        """The connection on SOCK once its TLS handshake is done and its caller allowed
        (None: dropped, or refused with a frame saying why). KEY: its place among the
        handshakes in progress."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._context is None:
            with self._lock:
                self._handshaking.pop(key, None)
            return self._track(Connection(sock, None))
        sock.settimeout(HANDSHAKE_S)
        tls = self._context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        with self._lock:  # the TLS socket holds the descriptor now: close() shuts this one
            self._open.add(tls)
            stopping = self._stopping
            evicted = key not in self._handshaking  # gave way to newer ones meanwhile
            if not evicted:
                self._handshaking[key] = tls
        try:
            if stopping or evicted:
                raise OSError("the listener is closing" if stopping else
                              "too many handshakes in progress")
            tls.do_handshake()
            pem = _peer_of(tls)
        except (OSError, ssl.SSLError, AccessDenied) as exc:
            # As a gRPC server does: a failed handshake (no certificate, another CA, not
            # TLS at all) is the peer's problem, not this server's.
            log.info("feed connection from %s dropped: TLS handshake failed: %s", host, exc)
            tls.close()
            return None
        finally:
            with self._lock:
                self._open.discard(tls)
                self._handshaking.pop(key, None)
        conn = Connection(tls, None)
        try:
            conn.peer = security.authorize(pem, self._method, self._allowed)
        except AccessDenied as exc:
            self._refuse(conn, exc)
            conn.close()
            return None
        return self._track(conn)

    def _track(self, conn: Connection) -> Connection | None:
        with self._lock:
            if self._stopping:
                conn.close()
                return None
            self._connections.add(conn)
        return conn


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
