"""Waiting for the right to forward: one call to ``Activator.acquire`` with its metrics, span and, for
streaming requests, the ``: loading <model> …`` SSE comments sent while a cold start or swap runs.

The acquire call is cancelled if the client goes away (the request is then withdrawn and never counts as
in flight); a grant that arrives after the request was abandoned is released at once. Called by
``handler.py``.
"""

from __future__ import annotations

import asyncio
import time

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


class _Wait:
    """Bookkeeping for one request that had to wait for an activation (``on_wait`` fired)."""

    __slots__ = ("_metrics", "_model", "_started", "_trace", "reason", "signal", "span")

    def __init__(self, model: str, metrics: ProxyMetrics, trace: RequestTrace) -> None:
        self._model, self._metrics, self._trace = model, metrics, trace
        self.signal: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.span: Span | None = None
        self.reason = ""
        self._started = 0.0

    def __call__(self, reason: str) -> None:
        if self.span is not None:
            return
        self._started, self.reason = time.monotonic(), reason
        self.span = self._trace.cold_start(self._model)
        self.span.set_attribute("flexinfer.activation", reason)
        self._metrics.wait_started(self._model)
        if not self.signal.done():
            self.signal.set_result(None)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def finish(self, error: BaseException | None) -> None:
        if self.span is None:
            return
        outcome = "granted" if error is None else outcome_of(error)
        self._metrics.wait_finished(self._model, self.elapsed, outcome)
        self.span.set_attribute("flexinfer.outcome", outcome)
        self.span.end(error=None if error is None else outcome)


class Admission:
    """Acquires grants from the activator for one proxy."""

    def __init__(self, activator: Activator, metrics: ProxyMetrics, timeout: float, interval: float) -> None:
        self._activator, self._metrics = activator, metrics
        self._timeout, self._interval = timeout, interval

    async def acquire(self, model: str, trace: RequestTrace, reply: Reply | None) -> Grant:
        """Wait for a grant; with a ``reply`` (streaming request) start it early and send loading comments."""
        wait = _Wait(model, self._metrics, trace)
        error: BaseException | None = None
        try:
            if reply is None:
                return await self._activator.acquire(model, self._timeout, wait)
            return await self._acquire_streaming(model, wait, reply)
        except BaseException as exc:
            error = exc
            raise
        finally:
            wait.finish(error)

    async def _acquire_streaming(self, model: str, wait: _Wait, reply: Reply) -> Grant:
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

    async def _comment_until_done(self, model: str, wait: _Wait, reply: Reply, task: asyncio.Future[Grant]) -> None:
        response = await reply.start_sse()
        while not task.done():
            await response.write(loading_comment(model, wait.elapsed))
            await asyncio.wait((task,), timeout=self._interval)


def _release_late_grant(task: asyncio.Future[Grant]) -> None:
    """A grant that completed after its request was abandoned must not stay in flight."""
    if not task.cancelled() and task.exception() is None:
        task.result().release()
