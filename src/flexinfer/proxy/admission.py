"""Waiting for the right to forward: a per-model concurrency slot (``limits.ConcurrencyLimiter``), then one
call to ``Activator.acquire``, with the queue metrics (a wait at either gate is one wait), the activation
metric and span and, for streaming requests, the ``: loading <model> …`` SSE comments sent while a cold
start or swap runs.

The model is the key the catalog resolved (``namespace/name``); metrics and comments carry it. The acquire
call is cancelled if the client goes away (the request is then withdrawn and never counts as
in flight); a grant that arrives after the request was abandoned is released at once. Called by
``handler.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from types import TracebackType

from flexinfer.api.key import ModelKey
from flexinfer.core.errors import (
    ColdStartTimeoutError,
    QueueFullError,
    RequestError,
)
from flexinfer.proxy.hooks import ProxyMetrics, RequestTrace, Span
from flexinfer.proxy.limits import ConcurrencyLimiter
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
    """One request's wait for its model, whichever gate holds it: a per-model concurrency slot (``queued``)
    or an activation (``__call__``, the activator's ``on_wait``). The queue metrics count it once, from the
    first wait to the grant; the activation histogram and the ``proxy.cold_start`` span cover the activation."""

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
        if self.span is not None or self._done:
            return
        self.queued()
        self._activating, self.reason = time.monotonic(), reason
        self.span = self._trace.cold_start(self._model.name)
        self.span.set_attribute("flexinfer.activation", reason)
        if self.signal is not None and not self.signal.done():
            self.signal.set_result(None)

    @property
    def elapsed(self) -> float:
        """Seconds since the activation wait began."""
        return time.monotonic() - (self._activating or time.monotonic())

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
    """Admits requests for one proxy: a per-model concurrency slot, then a grant from the activator."""

    def __init__(self, activator: Activator, metrics: ProxyMetrics, timeout: float, interval: float) -> None:
        self._activator, self._metrics = activator, metrics
        self._timeout, self._interval = timeout, interval

    def admit(self, model: ModelKey, trace: RequestTrace, reply: Reply | None,
              slots: ConcurrencyLimiter, parallel: int | None = None) -> _Admitted:
        """Hold one of ``slots``' places for ``model`` (``parallel``: the model's own capacity) for the whole
        ``async with`` block and give the activator's grant (the caller releases it); with a ``reply``
        (streaming request) send loading comments while a model activates. A wait at either gate is one wait
        in the queue metrics."""
        return _Admitted(self, model, trace, reply, slots=slots, parallel=parallel)

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
            await response.write(loading_comment(model.name, wait.elapsed))
            await asyncio.wait((task,), timeout=self._interval)


class _Admitted:
    """The ``async with`` of ``Admission.admit`` (a plain class: no generator frames per request)."""

    __slots__ = ("_admission", "_model", "_parallel", "_reply", "_slot", "_slots", "_trace")

    def __init__(self, admission: Admission, model: ModelKey, trace: RequestTrace, reply: Reply | None, *,
                 slots: ConcurrencyLimiter, parallel: int | None) -> None:
        self._admission, self._model, self._trace, self._reply, self._slots = admission, model, trace, reply, slots
        self._parallel = parallel
        self._slot: AbstractAsyncContextManager[None] | None = None

    async def __aenter__(self) -> Grant:
        admission = self._admission
        wait = _Wait(self._model, admission._metrics, self._trace)
        slot = self._slots.slot(self._model, admission._timeout, self._parallel, wait.queued)
        try:
            await slot.__aenter__()
        except BaseException as error:
            wait.finish(error)
            raise
        try:
            grant = await admission._acquire(self._model, wait, self._reply)
        except BaseException as error:
            wait.finish(error)
            await slot.__aexit__(type(error), error, error.__traceback__)
            raise
        wait.finish(None)
        self._slot = slot
        return grant

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        assert self._slot is not None
        await self._slot.__aexit__(kind, error, traceback)


def _release_late_grant(task: asyncio.Future[Grant]) -> None:
    """A grant that completed after its request was abandoned must not stay in flight."""
    if not task.cancelled() and task.exception() is None:
        task.result().release()
