"""The one mapping from ``RequestError`` to the OpenAI error envelope, as JSON or as an SSE error event.

``{"error": {"message", "type", "param", "code"}}`` with ``Retry-After`` on 429/503. Used by the proxy's
error middleware (``app.py``) and by the streaming paths (``streaming.py``, ``forwarding.py``) once a
response has already started. Also defines the edge-only errors (unknown route, wrong method) the core
hierarchy does not need.
"""

from __future__ import annotations

import json
import math

from aiohttp import web

from flexinfer.core.errors import ModelNotFoundError, RequestError


class RouteNotFoundError(RequestError):
    """No proxy route matches the path."""

    status, type, code = 404, "invalid_request_error", "unknown_url"


class MethodNotAllowedError(RequestError):
    """The route exists but not for this HTTP method."""

    status, type, code = 405, "invalid_request_error", "method_not_allowed"


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
    """The OpenAI error body for ``error``."""
    return {"error": {
        "message": str(error) or error.code,
        "type": error.type,
        "param": error.param,
        "code": error.code,
    }}


def error_headers(error: RequestError) -> dict[str, str]:
    """``Retry-After`` (whole seconds, rounded up) for errors that carry one on 429/503."""
    if error.retry_after is None or error.status not in (429, 503):
        return {}
    return {"Retry-After": str(max(1, math.ceil(error.retry_after)))}


def error_response(error: RequestError) -> web.Response:
    """A complete JSON error response."""
    return web.json_response(envelope(error), status=error.status, headers=error_headers(error))


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
