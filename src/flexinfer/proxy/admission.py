"""Waiting for the right to forward: one call to ``Activator.acquire``, the one queue a request waits in, under
one budget, whether its model is cold, being swapped in, or Ready with all of its concurrent places taken
(the arbiter keeps each model's parallel capacity). Around it: the queue metrics, the activation metric and
span (cold start or swap only) and, for streaming requests, SSE comments while it waits (``: loading <model>
…`` during an activation, ``: queued for <model> …`` while a Ready model's places are full).

The model is the key the catalog resolved (``namespace/name``); metrics and comments carry it. The acquire
call is cancelled if the client goes away (the request is then withdrawn and never counts as
in flight); a grant that arrives after the request was abandoned is released at once. Called by
``handler.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from types import TracebackType

from flexinfer.api.key import ModelKey
from flexinfer.core.errors import (
    ColdStartTimeoutError,
    QueueFullError,
    RequestError,
)
from flexinfer.proxy.hooks import ProxyMetrics, RequestTrace, Span
from flexinfer.proxy.streaming import Reply, loading_comment
from flexinfer.runtime.ports import Activator, Grant


def outcome_of(error: BaseException) -> str:
    """The bounded outcome label of a failed wait."""
    if isinstance(error, ColdStartTimeoutError):
        return "timeout"
    if isinstance(error, QueueFullError):
        return "rejected"
    if isinstance(error, RequestError):
        return "failed"
    return "cancelled"


QUEUE_REASON = "queue"
"""The ``on_wait`` reason of a request that waits for a free place on a Ready model (no activation)."""


def waiting_comment(model: str, reason: str, elapsed: float) -> bytes:
    """The SSE comment sent to a waiting stream: loading during an activation, queued otherwise."""
    if reason == QUEUE_REASON:
        return f": queued for {model} … {elapsed:.0f}s\n\n".encode()
    return loading_comment(model, elapsed)


class _Wait:
    """One request's wait for its model (the activator's ``on_wait``: called once, with the reason, when the
    request has to wait). The queue metrics count it once, from the wait to the grant; the activation
    histogram and the ``proxy.cold_start`` span cover a wait for an activation (not a queue wait)."""

    __slots__ = ("_activating", "_done", "_metrics", "_model", "_since", "_trace", "reason", "signal", "span")

    def __init__(self, model: ModelKey, metrics: ProxyMetrics, trace: RequestTrace) -> None:
        self._model, self._metrics, self._trace = model, metrics, trace
        self.signal: asyncio.Future[None] | None = None
        """Set when an activation wait begins; created only for streaming requests (``Admission``)."""
        self.span: Span | None = None
        self.reason = ""
        self._since: float | None = None
        self._activating: float | None = None
        self._done = False

    def queued(self) -> None:
        """The request has to wait at a gate (counted once per request)."""
        if self._since is None and not self._done:
            self._since = time.monotonic()
            self._metrics.wait_started(self._model)

    def __call__(self, reason: str) -> None:
        if self.reason or self._done:
            return
        self.queued()
        self.reason = reason
        if self.signal is not None and not self.signal.done():
            self.signal.set_result(None)
        if reason == QUEUE_REASON:
            return
        self._activating = self._since
        self.span = self._trace.cold_start(self._model.name)
        self.span.set_attribute("flexinfer.activation", reason)

    @property
    def elapsed(self) -> float:
        """Seconds since the wait began."""
        return time.monotonic() - (self._since or time.monotonic())

    def finish(self, error: BaseException | None) -> None:
        """The wait ended: granted (``error`` None) or not; only the first call counts."""
        if self._done:
            return
        self._done = True
        now, outcome = time.monotonic(), "granted" if error is None else outcome_of(error)
        if self._since is not None:
            self._metrics.wait_finished(self._model, now - self._since, outcome)
        if self._activating is not None:
            self._metrics.activation_finished(self._model, now - self._activating, outcome)
        if self.span is not None:
            self.span.set_attribute("flexinfer.outcome", outcome)
            self.span.end(error=None if error is None else outcome)


class Admission:
    """Admits requests for one proxy: a grant from the activator, one wait under one budget."""

    def __init__(self, activator: Activator, metrics: ProxyMetrics, timeout: float, interval: float) -> None:
        self._activator, self._metrics = activator, metrics
        self._timeout, self._interval = timeout, interval

    def admit(self, model: ModelKey, trace: RequestTrace, reply: Reply | None) -> _Admitted:
        """Give the activator's grant for ``model`` for the ``async with`` block (released on exit); with a
        ``reply`` (streaming request) send SSE comments while the request waits."""
        return _Admitted(self, model, trace, reply)

    def _acquire(self, model: ModelKey, wait: _Wait, reply: Reply | None) -> Awaitable[Grant]:
        """The activator's own coroutine for a plain request (no frame of this one stays while it waits)."""
        if reply is None:
            return self._activator.acquire(model, self._timeout, wait)
        return self._acquire_streaming(model, wait, reply)

    async def _acquire_streaming(self, model: ModelKey, wait: _Wait, reply: Reply) -> Grant:
        wait.signal = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._activator.acquire(model, self._timeout, wait))
        try:
            await asyncio.wait((task, wait.signal), return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                await self._comment_until_done(model, wait, reply, task)
            return await task
        except BaseException:
            # Abandoned (client gone, error event failed, shutdown): the grant may already have arrived
            # in the same loop iteration, so release it whether the acquire is still running or not.
            task.cancel()
            task.add_done_callback(_release_late_grant)
            raise

    async def _comment_until_done(self, model: ModelKey, wait: _Wait, reply: Reply,
                                  task: asyncio.Future[Grant]) -> None:
        response = await reply.start_sse()
        while not task.done():
            await response.write(waiting_comment(model.name, wait.reason, wait.elapsed))
            await asyncio.wait((task,), timeout=self._interval)


class _Admitted:
    """The ``async with`` of ``Admission.admit`` (a plain class: no generator frames per request)."""

    __slots__ = ("_admission", "_grant", "_model", "_reply", "_trace")

    def __init__(self, admission: Admission, model: ModelKey, trace: RequestTrace, reply: Reply | None) -> None:
        self._admission, self._model, self._trace, self._reply = admission, model, trace, reply
        self._grant: Grant | None = None

    async def __aenter__(self) -> Grant:
        admission = self._admission
        wait = _Wait(self._model, admission._metrics, self._trace)
        try:
            grant = await admission._acquire(self._model, wait, self._reply)
        except BaseException as error:
            wait.finish(error)
            raise
        wait.finish(None)
        self._grant = grant
        return grant

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        if self._grant is not None:
            self._grant.release()


def _release_late_grant(task: asyncio.Future[Grant]) -> None:
    """A grant that completed after its request was abandoned must not stay in flight."""
    if not task.cancelled() and task.exception() is None:
        task.result().release()
