"""The client-facing side of one proxied request: a reply that is not started, started early as an SSE
stream (to send loading comments while a model activates), or mirroring the upstream response.

``Reply.fail`` is the one place that decides how an error reaches a client whose response may already be
under way: a JSON envelope if nothing was sent, an SSE error event on an event stream, otherwise a cut
connection (the client sees a truncated body). ``EventWatch`` tells whether a relayed event stream carried
any event at all (a model server can end one cleanly without a single event when it fails after its head).
Writes go through the front server's ``front.message.ResponseWriter``. Used by ``handler.py``,
``admission.py``, ``forwarding.py`` and the front server's relay to the control application.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from flexinfer.core.errors import RequestError
from flexinfer.proxy.errors import error_payload, sse_error_event
from flexinfer.proxy.front.message import ResponseWriter

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
    """Owns the client response of one request; it is started at most once (``start_sse``, ``start_mirror``
    or ``start_whole``)."""

    __slots__ = ("_extra", "sse", "writer")

    def __init__(self, writer: ResponseWriter, extra_headers: Mapping[str, str]) -> None:
        self.writer = writer
        self._extra = tuple(extra_headers.items())
        self.sse = False

    @property
    def started(self) -> bool:
        return self.writer.started

    @property
    def status(self) -> int:
        """The status sent (0 before the reply started)."""
        return self.writer.status

    def _headers(self, headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        return [*headers, *self._extra]

    async def start_sse(self) -> ResponseWriter:
        """Send ``200 text/event-stream`` headers now (before the upstream is known)."""
        await self.writer.start(200, None, self._headers(SSE_HEADERS.items()))
        self.sse = True
        return self.writer

    async def start_mirror(self, status: int, reason: str | None, headers: Sequence[tuple[str, str]],
                           length: int | None) -> ResponseWriter:
        """Send the upstream's status and headers (or keep the early SSE response if already started)."""
        if self.writer.started:
            return self.writer
        await self.writer.start(status, reason, self._headers(headers), length)
        self.sse = event_stream(headers)
        return self.writer

    async def start_whole(self, status: int, reason: str | None, headers: Sequence[tuple[str, str]],
                          body: bytes) -> None:
        """Answer with the upstream's status, headers and whole body, which have all arrived (one send)."""
        self.sse = event_stream(headers)
        await self.writer.whole(status, reason, self._headers(headers), body)

    async def finish(self) -> None:
        """End the body normally."""
        await self.writer.write_eof()

    async def fail(self, error: RequestError) -> None:
        """Deliver ``error`` as well as the response state allows (see the module docstring)."""
        if not self.writer.started:
            status, headers, body = error_payload(error)
            await self.writer.whole(status, None, self._headers(headers), body)
        elif self.sse and not self.writer.done:
            try:
                await self.writer.write(sse_error_event(error))
                await self.writer.write_eof()
            except ConnectionError:
                log.debug("client went away before the error event could be sent")
        else:
            self.writer.abort()


def event_stream(headers: Sequence[tuple[str, str]]) -> bool:
    """The answer is an SSE stream (its ``Content-Type``, whatever the name's case)."""
    return any(name.lower() == "content-type" and value.startswith("text/event-stream") for name, value in headers)


_FIELD = b"data:"


class EventWatch:
    """Whether an event stream's body, fed piece by piece as relayed, held at least one event (a ``data:``
    field, also when split across pieces); comments (``: ping``) and blank lines are not events."""

    __slots__ = ("_tail", "seen")

    def __init__(self) -> None:
        self.seen = False
        self._tail = b""

    def feed(self, piece: bytes) -> None:
        if self.seen:
            return
        joined = self._tail + piece
        self.seen = _FIELD in joined
        self._tail = joined[-(len(_FIELD) - 1):]
