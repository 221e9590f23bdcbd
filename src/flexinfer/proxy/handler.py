"""The per-request flow of a proxied OpenAI call.

auth → body limit (413) → model resolution (400/404/409, aliases, parked; a ``background`` workload-class
request for a model that is not Ready → 503 without activating it). Resolution happens once, here, through the
catalog; from then on the request carries the model's key (``namespace/name``): the rate limit, the activator,
the grant and the metrics all use it → rate limit (429) → ``Activator.acquire`` (one wait under one budget:
the model's concurrency cap, cold start or swap; comments on waiting streams) → body rewrite to
the served model name → forward and relay → ``Grant.release`` exactly once. Every failure becomes an
OpenAI error via ``Reply.fail``. Metrics and the request span are closed in one ``finally``. Built by
``app.create_app``; the front server (``front.server``) calls ``handle`` for every proxied route.
"""

from __future__ import annotations

import asyncio
import logging
import time

from flexinfer.api.key import ModelKey
from flexinfer.core.errors import ModelNotFoundError, PayloadTooLargeError, RequestError, ShuttingDownError
from flexinfer.proxy.access_log import AccessLog, Entry
from flexinfer.proxy.admission import Admission
from flexinfer.proxy.auth import BearerAuth
from flexinfer.proxy.config import ProxyConfig
from flexinfer.proxy.draining import DrainState
from flexinfer.proxy.errors import BackgroundNotReadyError, InternalError, ModelParkedError, metric_status
from flexinfer.proxy.forwarding import HOP_BY_HOP, Forwarder, upstream_headers
from flexinfer.proxy.front.message import FrontRequest, ResponseWriter
from flexinfer.proxy.hooks import NullTracer, ProxyMetrics, ProxyTracer, RequestTrace
from flexinfer.proxy.limits import RateLimiter, RateLimitExceededError
from flexinfer.proxy.request_ids import REQUEST_ID_HEADER, request_id
from flexinfer.proxy.routing import (
    MODEL_HEADER,
    WORKLOAD_CLASS_HEADER,
    RoutedRequest,
    is_background,
    path_key_candidate,
    rewrite_body,
    route,
)
from flexinfer.proxy.streaming import Reply
from flexinfer.runtime.ports import Activator, Catalog, ModelView

log = logging.getLogger(__name__)
ROUTE_IN_THREAD_BYTES = 1 << 20
"""Bodies at least this large are parsed for the model name off the event loop (a 25 MB audio form or a
long JSON prompt would otherwise stall every other request for tens of milliseconds)."""


class _Outcome:
    """What the metrics, the span and the access log record about one request."""

    __slots__ = ("error", "http_status", "model", "status", "stream", "upstream", "waited")

    def __init__(self) -> None:
        self.model: ModelKey | None = None
        self.http_status: int | None = None
        self.status = "error"
        self.error: str | None = None
        self.stream = False
        self.waited = 0.0
        self.upstream: float | None = None


class ProxyHandler:
    """The handler for ``/v1/*`` and ``/model/<name>/*``."""

    def __init__(self, config: ProxyConfig, *, activator: Activator, catalog: Catalog, forwarder: Forwarder,
                 metrics: ProxyMetrics, tracer: ProxyTracer, drain: DrainState) -> None:
        self._config, self._catalog, self._forwarder = config, catalog, forwarder
        self._metrics, self._tracer, self._drain = metrics, tracer, drain
        self.auth = BearerAuth(config.auth_token if config.auth_enabled else None)
        self._limiter = RateLimiter(
            config.rate_limit_per_model, config.rate_limit_burst,
            config.rate_limit_global, config.rate_limit_global_burst,
        ) if config.rate_limit_enabled else None
        self._admission = Admission(activator, metrics, config.wait_timeout, config.loading_comment_interval)
        dropped = {MODEL_HEADER.lower(), WORKLOAD_CLASS_HEADER.lower()}
        if config.auth_enabled:
            dropped.add("authorization")
        self._dropped_headers = HOP_BY_HOP | dropped
        self.access = AccessLog(deferred=isinstance(tracer, NullTracer))

    async def handle(self, request: FrontRequest, writer: ResponseWriter, route: str) -> None:
        """Answer one proxied request; ``route`` is its template (``/v1/chat/completions``, ``/v1/{tail}``,
        ``/model/{name}/{tail}``), a bounded ``http.route`` value whatever path the client sent."""
        started = time.perf_counter()
        trace = self._tracer.start_request(request.method, route, request.headers)
        rid = request_id(request.headers)
        reply, outcome = Reply(writer, {REQUEST_ID_HEADER: rid.value}), _Outcome()
        trace.set_attribute("url.path", request.path)
        trace.set_attribute("request.id", rid.value)
        if rid.client_value is not None:
            trace.set_attribute("request.client_id", rid.client_value)
        self._drain.enter()
        try:
            await self._answer(request, reply, trace, outcome, rid.value)
        finally:
            self._drain.leave()
            elapsed = time.perf_counter() - started
            self._metrics.request_finished(outcome.model, outcome.status, elapsed)
            if self.access.enabled():
                status = 499 if outcome.status == "cancelled" else outcome.http_status or reply.status or 499
                self.access.add(Entry(request.method, request.path, outcome.model or "-", status, outcome.waited,
                                      outcome.upstream, elapsed, reply.writer.bytes_sent, outcome.stream, rid.value,
                                      time.time()))
            trace.end(outcome.http_status, outcome.error)

    async def _answer(self, request: FrontRequest, reply: Reply, trace: RequestTrace, outcome: _Outcome,
                      rid: str) -> None:
        try:
            await self._serve(request, reply, trace, outcome, rid)
            outcome.http_status = reply.status
            outcome.status = "success" if reply.status < 400 else "error"
        except RequestError as error:
            outcome.status, outcome.error, outcome.http_status = metric_status(error), error.code, error.status
            await reply.fail(error)
        except asyncio.CancelledError:
            if not self._drain.aborted:
                _client_gone(outcome)
                raise
            await self._aborted(reply, outcome)
        except ConnectionError:
            _client_gone(outcome)
            reply.writer.abort()
        except Exception:
            log.exception("unexpected error while proxying %s %s", request.method, request.path)
            outcome.error = "internal"
            await reply.fail(InternalError())

    async def _aborted(self, reply: Reply, outcome: _Outcome) -> None:
        """The proxy ended this request to shut down now: tell the client (503 or an SSE error event)."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        error = ShuttingDownError("The proxy is shutting down; this request was stopped before it finished")
        outcome.status, outcome.error, outcome.http_status = metric_status(error), error.code, error.status
        await reply.fail(error)

    async def _serve(self, request: FrontRequest, reply: Reply, trace: RequestTrace, outcome: _Outcome,
                     rid: str) -> None:
        if not self._drain.accepting:
            raise ShuttingDownError("The proxy is shutting down, retry on another instance")
        self.auth.check(request.headers.get("Authorization"))
        background = is_background(request.headers)
        trace.set_attribute("flexinfer.workload.background", background)
        body = await self._read_body(request)
        args = (request.headers, request.path, request.query_string, body, self._path_key(request.path))
        routed = await asyncio.to_thread(route, *args) if len(body) >= ROUTE_IN_THREAD_BYTES else route(*args)
        view = self._resolve(routed.model, outcome)
        key = view.key
        trace.set_attribute("flexinfer.model", view.name)
        trace.set_attribute("flexinfer.namespace", view.namespace)
        if background and view.phase != "Ready":
            raise BackgroundNotReadyError(key, view.phase)
        self._rate_limit(key)
        outcome.stream = routed.streaming
        async with self._admission.admit(key, trace, reply if routed.streaming else None) as grant:
            self._metrics.connection_opened(key)
            outcome.waited, forwarded = grant.waited_seconds, time.perf_counter()
            try:
                await self._forward(request, reply, trace, routed=routed, view=view, body=body,
                                    base_url=grant.endpoint.base_url, rid=rid)
            finally:
                outcome.upstream = time.perf_counter() - forwarded
                self._metrics.connection_closed(key)

    async def _forward(self, request: FrontRequest, reply: Reply, trace: RequestTrace, *, routed: RoutedRequest,
                       view: ModelView, body: bytes, base_url: str, rid: str) -> None:
        self.access.write_soon()  # while the model server works
        headers = upstream_headers(request.headers, self._dropped_headers)
        headers[REQUEST_ID_HEADER] = rid
        new_body = rewrite_body(body, routed.payload, view.served_model_name)
        await self._forwarder.relay(reply, method=request.method, base_url=base_url, path=routed.upstream_path,
                                    headers=headers, body=new_body, trace=trace)
        await reply.finish()

    async def _read_body(self, request: FrontRequest) -> bytes:
        limit, length = self._config.max_body_bytes, request.content_length
        if length is not None and length > limit:
            raise PayloadTooLargeError(f"Request body of {length} bytes exceeds the limit of {limit}")
        return await request.read()

    def _path_key(self, path: str) -> str | None:
        """The ``namespace/name`` of a ``/model/<namespace>/<name>/…`` path when it is a model's key."""
        candidate = path_key_candidate(path)
        if candidate is None:
            return None
        view = self._catalog.resolve(candidate)
        return candidate if view is not None and view.key == candidate else None

    def _resolve(self, name: str, outcome: _Outcome) -> ModelView:
        view = self._catalog.resolve(name)
        if view is None:
            raise ModelNotFoundError(name)
        outcome.model = view.key
        if view.parked:
            raise ModelParkedError(name)
        return view

    def _rate_limit(self, model: ModelKey) -> None:
        if self._limiter is None:
            return
        try:
            self._limiter.check(model)
        except RateLimitExceededError as error:
            self._metrics.rate_limited(model, error.scope)
            raise


def _client_gone(outcome: _Outcome) -> None:
    """The client went away before its answer was complete (the access log says 499, nginx's "client closed
    request", whatever part of the answer was already on its way)."""
    outcome.status, outcome.error = "cancelled", "client disconnected"
