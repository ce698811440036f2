"""Registering servicers so that undecodable requests are bad input, not bugs.

grpc decodes a request before the servicer runs; bytes that do not parse (a string field
that is not UTF-8, a corrupt wire format) get INTERNAL and an ERROR traceback in the log,
as if the server had a bug. Moving the decoding into the handler answers them with
INVALID_ARGUMENT, quietly, like any other bad input. Every mosafs service registers
through `add_decoding_in_handlers`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

Ctx = grpc.ServicerContext


class _HandlerCapture:
    """Stands in for a grpc.Server so that a generated add_*_to_server function hands us
    the method handlers it would register."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers arrive through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service = service
        self.handlers = dict(handlers)


Codec = tuple[Callable[[bytes], Any] | None, Callable[[Any], bytes] | None]


def add_decoding_in_handlers(add_to_server: Callable[[Any, Any], None], servicer_obj: Any,
                             server: grpc.Server, codecs: dict[str, Codec] | None = None,
                             ) -> None:
    """Register SERVICER_OBJ like ADD_TO_SERVER (generated) would, with request decoding
    done inside each handler with a single request (unary-unary, unary-stream). CODECS
    replaces the generated (request decoder, response encoder) of the methods it names
    (None: keep the generated one), for messages that carry chunk bytes
    (mosafs.rpc.chunkwire)."""
    capture = _HandlerCapture()
    add_to_server(servicer_obj, capture)
    codecs = codecs or {}
    handlers = {name: _decode_inside(h, *codecs.get(name, (None, None)))
                if h.unary_unary is not None or h.unary_stream is not None else h
                for name, h in capture.handlers.items()}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(capture.service, handlers),))
    server.add_registered_method_handlers(capture.service, handlers)  # type: ignore[attr-defined]


def _decode_inside(handler: Any, decoder: Callable[[bytes], Any] | None = None,
                   encoder: Callable[[Any], bytes] | None = None) -> Any:
    parse = decoder or handler.request_deserializer
    streaming = handler.unary_stream is not None
    behavior = handler.unary_stream if streaming else handler.unary_unary

    def run(raw: bytes, context: Ctx) -> Any:
        try:
            request = parse(raw)
        except DecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {exc}")
        return behavior(request, context)

    make = (grpc.unary_stream_rpc_method_handler if streaming
            else grpc.unary_unary_rpc_method_handler)
    return make(run, request_deserializer=None,
                response_serializer=encoder or handler.response_serializer)
