"""The one place where domain errors become gRPC status codes and back.

Servers: every servicer class is wrapped with `@servicer`, which turns a MosafsError into
`context.abort(code, message)` with the error's kind in the trailing metadata, and any other
exception (a bug) into INTERNAL after logging its traceback. A server never dies of a
request. Clients: `call(stub.Method, request)` re-raises the same MosafsError class.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import grpc

from mosafs import errors

log = logging.getLogger(__name__)

KIND_KEY = "mosafs-error-kind"

_CODES: dict[type[errors.MosafsError], grpc.StatusCode] = {
    errors.MosafsError: grpc.StatusCode.UNKNOWN,
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ConfigError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.NotADirectory: grpc.StatusCode.FAILED_PRECONDITION,
    errors.IsADirectory: grpc.StatusCode.FAILED_PRECONDITION,
    errors.DirectoryNotEmpty: grpc.StatusCode.FAILED_PRECONDITION,
    errors.NameTooLong: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotPermitted: grpc.StatusCode.PERMISSION_DENIED,
    errors.NotSupported: grpc.StatusCode.UNIMPLEMENTED,
    errors.ReadOnly: grpc.StatusCode.PERMISSION_DENIED,
    errors.AccessDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.TokenRefused: grpc.StatusCode.PERMISSION_DENIED,
    errors.NoAttribute: grpc.StatusCode.NOT_FOUND,
    errors.ValueTooLarge: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NoSpace: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.LeaseExpired: grpc.StatusCode.FAILED_PRECONDITION,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.IntegrityError: grpc.StatusCode.DATA_LOSS,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.InternalError: grpc.StatusCode.INTERNAL,
}
# Status codes that did not come from a MosafsError (transport failures, grpc's own checks).
_FALLBACK: dict[grpc.StatusCode, type[errors.MosafsError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.DATA_LOSS: errors.IntegrityError,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    # A call the other side cancelled: a server stopping cancels the calls it is serving.
    # The peer is going away, as with UNAVAILABLE (a call this process cancelled itself is
    # never looked at: its caller has gone).
    grpc.StatusCode.CANCELLED: errors.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.INTERNAL: errors.InternalError,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: errors.AccessDenied,  # the role check (security.py)
    grpc.StatusCode.UNAUTHENTICATED: errors.AccessDenied,
}


def status_code(exc: errors.MosafsError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in _CODES:
            return _CODES[cls]  # type: ignore[index]
    return grpc.StatusCode.UNKNOWN


def _abort(context: grpc.ServicerContext, exc: errors.MosafsError) -> None:
    context.set_trailing_metadata(((KIND_KEY, exc.kind),))
    context.abort(status_code(exc), exc.message)


@contextlib.contextmanager
def _mapped(context: grpc.ServicerContext, method: Callable[..., Any]) -> Iterator[None]:
    """A MosafsError raised inside aborts the call with its status; anything else is a bug:
    logged with its traceback, answered INTERNAL."""
    try:
        yield
    except errors.MosafsError as exc:
        _abort(context, exc)
    except Exception:
        if getattr(context, "code", lambda: None)() is not None:  # aborted by grpc itself
            raise
        log.exception("bug in %s", method.__qualname__)
        context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method.__name__}")


def _wrap(method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isgeneratorfunction(method):
        return _wrap_stream(method)

    @functools.wraps(method)
    def handler(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        with _mapped(context, method):
            return method(self, request, context)
        return None  # unreachable: abort raises

    return handler


def _wrap_stream(method: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """The same for a server-streaming method: errors raised while it yields abort too."""
    @functools.wraps(method)
    def handler(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        with _mapped(context, method):
            yield from method(self, request, context)

    return handler


S = TypeVar("S", bound=type)


def servicer(cls: S) -> S:
    """Class decorator: wrap every public RPC method of a generated servicer subclass."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(member):
            setattr(cls, name, _wrap(member))
    return cls


def from_rpc_error(exc: grpc.RpcError) -> errors.MosafsError:
    """The domain error an RpcError stands for."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or str(code)
    kind = None
    trailing: Any = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == KIND_KEY:
            kind = value
    return error_of(code, kind, details)


def error_of(code: grpc.StatusCode | int, kind: str | None, message: str) -> errors.MosafsError:
    """The domain error of a status CODE (or its number) and error KIND, as a failed call
    or a refused blob of a grouped put (PutOutcome) reports them."""
    if isinstance(code, int):
        code = _BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    cls = errors.BY_KIND.get(kind) if kind else None
    if cls is None:
        cls = _FALLBACK.get(code, errors.MosafsError)
    return cls(message or str(code))


_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


R = TypeVar("R")


def call(method: Callable[..., R], request: Any, *, timeout: float | None = None,
         wait_for_ready: bool | None = None,
         metadata: tuple[tuple[str, str | bytes], ...] = ()) -> R:
    """Call a unary stub method; raise the domain error a failure stands for.
    WAIT_FOR_READY: while the server is unreachable, wait (up to TIMEOUT) for it to come
    back instead of failing at once; a call is still sent at most once."""
    try:
        extra: dict[str, Any] = {"metadata": metadata} if metadata else {}
        if wait_for_ready is None:
            return method(request, timeout=timeout, **extra)
        return method(request, timeout=timeout, wait_for_ready=wait_for_ready, **extra)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


def stream(method: Callable[..., Iterable[R]], request: Any, *,
           timeout: float | None = None) -> Iterator[R]:
    """Call a server-streaming stub method and yield its messages; raise the domain error
    a failure stands for (also one that arrives in the middle of the stream)."""
    try:
        yield from method(request, timeout=timeout)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None
