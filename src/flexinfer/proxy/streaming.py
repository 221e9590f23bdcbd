"""The client-facing side of one proxied request: a reply that is not started, started early as an SSE
stream (to send loading comments while a model activates), or mirroring the upstream response.

``Reply.fail`` is the one place that decides how an error reaches a client whose response may already be
under way: a JSON envelope if nothing was sent, an SSE error event on an event stream, otherwise a cut
connection (the client sees a truncated body). Used by ``handler.py``, ``admission.py`` and
``forwarding.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aiohttp import web

from flexinfer.core.errors import RequestError
from flexinfer.proxy.errors import error_response, sse_error_event

log = logging.getLogger(__name__)

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def loading_comment(model: str, elapsed: float) -> bytes:
    """An SSE comment line (ignored by SSE parsers) saying the model is still loading."""
    return f": loading {model} … {elapsed:.0f}s\n\n".encode()


class Reply:
    """Owns the client response of one request; at most one of ``start_sse``/``start_mirror`` is used."""

    __slots__ = ("_extra_headers", "_request", "response", "sse")

    def __init__(self, request: web.Request, extra_headers: Mapping[str, str]) -> None:
        self._request = request
        self._extra_headers = extra_headers
        self.response: web.StreamResponse | None = None
        self.sse = False

    @property
    def started(self) -> bool:
        return self.response is not None

    async def start_sse(self) -> web.StreamResponse:
        """Send ``200 text/event-stream`` headers now (before the upstream is known)."""
        response = web.StreamResponse(status=200, headers={**SSE_HEADERS, **self._extra_headers})
        await response.prepare(self._request)
        self.response, self.sse = response, True
        return response

    async def start_mirror(self, status: int, reason: str | None, headers: Mapping[str, str],
                           length: int | None) -> web.StreamResponse:
        """Send the upstream's status and headers (or keep the early SSE response if already started)."""
        if self.response is not None:
            return self.response
        response = web.StreamResponse(status=status, reason=reason, headers={**headers, **self._extra_headers})
        if length is not None:
            response.content_length = length
        await response.prepare(self._request)
        self.response = response
        self.sse = headers.get("Content-Type", "").startswith("text/event-stream")
        return response

    async def start_whole(self, status: int, reason: str | None, headers: Mapping[str, str],
                          body: bytes) -> web.StreamResponse:
        """Answer with the upstream's status, headers and whole body, which have all arrived: ``finish`` then
        writes the head and the body in one send instead of two."""
        response = web.Response(status=status, reason=reason, headers={**headers, **self._extra_headers}, body=body)
        await response.prepare(self._request)
        self.response = response
        self.sse = headers.get("Content-Type", "").startswith("text/event-stream")
        return response

    async def finish(self) -> web.StreamResponse:
        """End the body normally."""
        assert self.response is not None
        await self.response.write_eof()
        return self.response

    async def fail(self, error: RequestError) -> web.StreamResponse:
        """Deliver ``error`` as well as the response state allows (see the module docstring)."""
        if self.response is None:
            response = error_response(error)
            response.headers.update(self._extra_headers)
            return response
        if self.sse:
            await self._write_quietly(sse_error_event(error))
        else:
            self.response.force_close()
            transport = self._request.transport
            if transport is not None:
                transport.close()
        return self.response

    async def _write_quietly(self, data: bytes) -> None:
        assert self.response is not None
        try:
            await self.response.write(data)
            await self.response.write_eof()
        except ConnectionError:
            log.debug("client went away before the error event could be sent")
