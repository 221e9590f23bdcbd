"""The one mapping from ``RequestError`` to the OpenAI error envelope, as JSON or as an SSE error event.

``{"error": {"message", "type", "param", "code"}}`` with ``Retry-After`` on 429/503 and ``Allow`` on 405.
Every text field is made safe to echo (``core.errors.echo_safe``): bounded, so a 1 MB model name is not sent
back whole, and valid UTF-8 (lone surrogates become backslash-escaped text). Used by the control application's
error middleware (``app.py``), the front server and the streaming paths (``streaming.py``, ``forwarding.py``).
Also defines the edge-only errors (unknown route, wrong method, malformed HTTP) the core hierarchy does not
need.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

from aiohttp import web

from flexinfer.core.errors import ModelNotFoundError, RequestError, echo_safe


class RouteNotFoundError(RequestError):
    """No proxy route matches the path."""

    status, type, code = 404, "invalid_request_error", "unknown_url"


class MethodNotAllowedError(RequestError):
    """The route exists but not for this HTTP method; ``allow`` fills the ``Allow`` header."""

    status, type, code = 405, "invalid_request_error", "method_not_allowed"

    def __init__(self, method: str, path: str, allow: Iterable[str]) -> None:
        self.allow = tuple(sorted(allow))
        super().__init__(f"Method {method} not allowed on {path} (allowed: {', '.join(self.allow)})")


class MalformedHttpError(RequestError):
    """A request the front server could not parse (bad syntax, an HTTP version other than 1.0/1.1, a head
    over the limits): answered with ``status`` before any handler runs, then the connection is closed."""

    type = "invalid_request_error"

    def __init__(self, message: str, status: int = 400, code: str = "malformed_http_request") -> None:
        super().__init__(message)
        self.status, self.code = status, code


class ModelParkedError(ModelNotFoundError):
    """The model exists but is parked (not served through the proxy): answered as 404 model_not_found."""


class BackgroundNotReadyError(RequestError):
    """A background-class request for a model that is not Ready: background work never activates a model."""

    status, type, code = 503, "service_unavailable_error", "model_not_ready"

    def __init__(self, model: str, phase: str) -> None:
        super().__init__(f"model '{model}' is {phase}, not Ready; background requests only use a Ready model "
                         "and never start one")


class InternalError(RequestError):
    """An unexpected failure inside the proxy (details go to the log, never to the client)."""

    status, type, code = 500, "server_error", "server_error"

    def __init__(self) -> None:
        super().__init__("internal proxy error")


def envelope(error: RequestError) -> dict[str, object]:
    """The OpenAI error body for ``error`` (every text field passed through ``echo_safe``)."""
    return {"error": {
        "message": echo_safe(str(error) or str(error.code)),
        "type": echo_safe(error.type),
        "param": None if error.param is None else echo_safe(error.param),
        "code": None if error.code is None else echo_safe(error.code),
    }}


def error_headers(error: RequestError) -> dict[str, str]:
    """``Retry-After`` (whole seconds, rounded up) for errors that carry one on 429/503; ``Allow`` on 405."""
    if isinstance(error, MethodNotAllowedError):
        return {"Allow": ", ".join(error.allow)}
    if error.retry_after is None or error.status not in (429, 503):
        return {}
    return {"Retry-After": str(max(1, math.ceil(error.retry_after)))}


def error_payload(error: RequestError) -> tuple[int, list[tuple[str, str]], bytes]:
    """The status, headers and JSON body of a complete error answer."""
    headers = [("Content-Type", "application/json; charset=utf-8"), *error_headers(error).items()]
    return error.status, headers, json.dumps(envelope(error)).encode()


def error_response(error: RequestError) -> web.Response:
    """A complete JSON error response (the control application's)."""
    status, headers, body = error_payload(error)
    return web.Response(status=status, headers=headers, body=body)


def sse_error_event(error: RequestError) -> bytes:
    """The error as one SSE ``data:`` event, for streams whose 200 headers were already sent."""
    return b"data: " + json.dumps(envelope(error)).encode() + b"\n\n"


def metric_status(error: RequestError) -> str:
    """The bounded ``status`` label of ``flexinfer_proxy_requests_total`` for a failed request."""
    if error.status == 429:
        return "rate_limited"
    if isinstance(error, ModelParkedError):
        return "parked"
    if isinstance(error, BackgroundNotReadyError):
        return "background_not_ready"
    return "error"
