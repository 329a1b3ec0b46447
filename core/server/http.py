"""How uvicorn serves the app: its HTTP parser and event loop, with the request head bounded.

httptools (llhttp, in C) and uvloop when both are installed (the `server` extra has them):
they take much of the HTTP layer's CPU time per request off (bench/writes.py reports the
server's CPU per write). h11 (pure Python) otherwise.

Either way a client cannot make the server buffer an unbounded request head: h11 refuses
heads it would have to buffer beyond `max_header_bytes`; httptools buffers a header until it
ends, so `BoundedHttpToolsProtocol` counts the bytes of a head that has not ended yet and
answers 400 and closes once they pass the bound. A large head that arrives whole still
reaches the app, whose `HeaderSizeLimit` answers 431 in the envelope.

A request llhttp cannot parse (a control character in a header value, a broken request
line) is answered 400 `MALFORMED_HTTP` in the error envelope, then the connection closes.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

from ..errors import APIError


def fast_http_available() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("httptools", "uvloop"))


def uvicorn_options(max_header_bytes: int, *, fast: bool = True) -> dict[str, Any]:
    """`uvicorn.Config`/`uvicorn.run` keyword arguments for the parser and loop (see above)."""
    if fast and fast_http_available():
        return {"http": bounded_httptools_protocol(max_header_bytes), "loop": "uvloop"}
    return {"http": "h11", "h11_max_incomplete_event_size": max_header_bytes}


def worker_uvicorn_options(max_header_bytes: int) -> dict[str, Any]:
    """`uvicorn_options` for worker processes (`ampkit serve --workers`): uvicorn hands each
    worker its configuration pickled, so the protocol is named by import string
    (`WorkerHttpToolsProtocol`, made in the worker from its own settings)."""
    options = uvicorn_options(max_header_bytes)
    if options["http"] != "h11":
        options["http"] = f"{__name__}:WorkerHttpToolsProtocol"
    return options


def __getattr__(name: str) -> Any:
    # `WorkerHttpToolsProtocol`: the bounded protocol of a worker process, bounded by the
    # `max_header_bytes` of the settings the worker reads from its environment.
    if name == "WorkerHttpToolsProtocol":
        from ..bootstrap import load_settings

        return bounded_httptools_protocol(load_settings().max_header_bytes)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def bounded_httptools_protocol(max_header_bytes: int) -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, refusing a request head that grows past the bound
        before it ends (checked after each read, so at most one read more is held)."""

        max_head_bytes = max_header_bytes

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_open = True
            self._head_bytes = 0

        def data_received(self, data: bytes) -> None:
            if self._head_open:
                self._head_bytes += len(data)
            super().data_received(data)
            if self._head_open and self._head_bytes > self.max_head_bytes and not self.transport.is_closing():
                self.send_400_response(f"request head exceeds {self.max_head_bytes} bytes")

        def send_400_response(self, msg: str) -> None:
            err = APIError(msg, code="MALFORMED_HTTP")
            body = json.dumps(err.envelope()).encode()
            head = [b"HTTP/1.1 400 Bad Request\r\n"]
            for name, value in self.server_state.default_headers:
                head.append(name + b": " + value + b"\r\n")
            head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
            self.transport.write(b"".join(head) + body)
            self.transport.close()

        def on_headers_complete(self) -> None:
            self._head_open = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_open = True  # the next request on this connection starts its head
            self._head_bytes = 0

    return BoundedHttpToolsProtocol


__all__ = ["bounded_httptools_protocol", "fast_http_available", "uvicorn_options", "worker_uvicorn_options"]
