"""The admin API of ``flexinfer serve`` (what ``flexinfer status`` and ``flexinfer logs`` talk to).

Routes, added to the proxy's aiohttp application by ``flexinfer.assembly.run_local``:

- ``GET /admin/status`` → ``{"models": [{key, name, namespace, group, priority, phase, queue_depth, in_flight,
  endpoint, last_swap_age, draining, pid, last_error, ready_for, retry_in, memory, need}], "groups": [{group,
  budget_mib, used_mib, reserved_mib, models, evictions}], "config": {loaded_at, models, last_reload, trigger,
  result, error, errors, reloads}}`` (``need``: ``{mib, source}``, what the model takes of its group's memory
  budget; ``groups``: the groups that pack by memory; ``config``: the manifest reloads,
  ``flexinfer.local.reloading.ConfigStatus``)
- ``GET /admin/logs/{model}?tail=N`` → ``{"model": key, "lines": [...], "started": bool}`` (the server's captured
  output; ``started`` is false when the model has not run since ``serve`` started)
- ``POST /admin/models/{model}/load[?wait=true]`` / ``POST /admin/models/{model}/unload`` →
  ``{"model": key, "phase": ...}``
- ``GET /admin/models/{model}/logs?after=N&since=SECONDS&tail=N`` → ``{"model", "lines", "next", "started"}``
  (``flexinfer logs --since/--follow``: ``next`` is the ``after`` of the following poll)
- ``PUT /admin/manifests`` (a YAML stream or JSON of Models and ModelCaches, at most ``MAX_MANIFEST_BYTES``) →
  the ``config`` section once the text is in force (``result`` ``applied`` or ``unchanged``); rejected: 422, the
  error envelope naming the first problem plus ``"errors"``, every problem (``pushed:line:column: …``), and the
  previous configuration stays (``flexinfer.local.reloading.ManifestReloader.push``: a file reload's checks)
- ``GET /admin/lifecycle?after=N`` → ``{"next", "events": [{seq, model, kind, seconds, at}], "lost"}``: the cold
  starts and swaps numbered above ``N`` (``flexinfer.local.lifecycle_events``)

``{model}`` is a name, alias or ``namespace/name`` (resolved once, by the catalog, to the model key). Errors
use the OpenAI error envelope (unknown model → 404, a name several namespaces use → 409). When a token is
given, every route needs ``Authorization: Bearer <token>`` (the assembly gives ``FLEXINFER_ADMIN_TOKEN`` when set,
else the proxy's token when its auth is on).
"""

from __future__ import annotations

import functools
import hmac
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from flexinfer.api.key import ModelKey
from flexinfer.core.errors import (
    BadRequestError,
    ModelNotFoundError,
    PayloadTooLargeError,
    RequestError,
    UnauthorizedError,
    echo_safe,
)
from flexinfer.core.server_memory import ServerMemory
from flexinfer.local.catalog import ManifestCatalog
from flexinfer.local.lifecycle_events import LifecycleEvents
from flexinfer.local.logs import LogStore
from flexinfer.local.reloading import ConfigStatus
from flexinfer.runtime.dispatcher import ModelState

DEFAULT_TAIL = 200
MAX_TAIL = 100_000
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
"""Largest pushed manifest text (``PUT /admin/manifests``)."""
Handler = Callable[[web.Request], Awaitable[web.Response]]
Push = Callable[[bytes], Awaitable[ConfigStatus]]


def error_body(error: RequestError) -> dict[str, object]:
    """The OpenAI error envelope for ``error`` (its message bounded and escaped: it echoes the model asked for)."""
    return {"error": {"message": echo_safe(str(error)), "type": error.type, "param": error.param, "code": error.code}}


def guarded(handler: Handler) -> Handler:
    """Answer ``RequestError`` with its status and envelope (independent of the host app's middleware)."""

    @functools.wraps(handler)
    async def wrapper(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except RequestError as error:
            return web.json_response(error_body(error), status=error.status)

    return wrapper


class Control(Protocol):
    """The dispatcher's control surface used here."""

    def snapshot(self) -> list[ModelState]: ...

    async def preload(self, model: ModelKey, wait: bool = False, timeout: float | None = None) -> str: ...

    async def unload(self, model: ModelKey) -> None: ...


@dataclass(frozen=True)
class AdminApi:
    """The admin handlers over the dispatcher, the catalog and the engine's logs."""

    control: Control
    catalog: ManifestCatalog
    logs: LogStore
    pid: Callable[[str], int | None]
    token: str = ""
    config: Callable[[], dict[str, object]] | None = None
    memory: Callable[[str], ServerMemory | None] | None = None
    """A model's measured memory (``LocalEngine.memory``)."""
    groups: Callable[[], list[dict[str, object]]] | None = None
    """The groups that pack by memory (``memory_groups``)."""
    push: Push | None = None
    """Checks and applies a pushed manifest text (``ManifestReloader.push``); no ``PUT /admin/manifests`` without."""
    lifecycle: LifecycleEvents | None = None
    """The cold starts and swaps; no ``GET /admin/lifecycle`` without."""

    def routes(self) -> Sequence[web.RouteDef]:
        routes = [
            web.get("/admin/status", guarded(self.status)),
            web.get("/admin/logs/{model:.+}", guarded(self.model_logs)),
            web.post("/admin/models/{model:.+}/load", guarded(self.load)),
            web.post("/admin/models/{model:.+}/unload", guarded(self.unload)),
            web.get("/admin/models/{model:.+}/logs", guarded(self.log_window)),
        ]
        if self.push is not None:
            routes.append(web.put("/admin/manifests", guarded(self.manifests)))
        if self.lifecycle is not None:
            routes.append(web.get("/admin/lifecycle", guarded(self.lifecycle_events)))
        return routes

    def _check(self, request: web.Request) -> None:
        if not self.token:
            return
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            raise UnauthorizedError("Invalid or missing bearer token")

    def _key(self, request: web.Request) -> ModelKey:
        name = request.match_info["model"]
        key = self.catalog.key(name)
        if key is None:
            raise ModelNotFoundError(name)
        return key

    async def status(self, request: web.Request) -> web.Response:
        self._check(request)
        body: dict[str, object] = {"models": [self._state(s) for s in self.control.snapshot()]}
        if self.groups is not None:
            body["groups"] = self.groups()
        if self.config is not None:
            body["config"] = self.config()
        return web.json_response(body)

    def _state(self, state: ModelState) -> dict[str, object]:
        return {
            "key": state.key, "name": state.name, "namespace": state.namespace, "group": state.group,
            "priority": state.priority, "phase": state.phase, "queue_depth": state.queue_depth,
            "in_flight": state.in_flight, "endpoint": state.endpoint.base_url if state.endpoint else None,
            "last_swap_age": state.last_swap_age, "draining": state.draining, "pid": self.pid(state.key),
            "last_error": state.last_error, "ready_for": state.ready_for, "retry_in": state.retry_in,
            "memory": self._memory(state.key),
            "need": None if state.need_mib is None else {"mib": round(state.need_mib, 2), "source": state.need_source},
        }

    def _memory(self, key: str) -> dict[str, object] | None:
        memory = self.memory(key) if self.memory is not None else None
        return memory.as_json() if memory is not None else None

    async def model_logs(self, request: web.Request) -> web.Response:
        self._check(request)
        key = self._key(request)
        tail = request.query.get("tail", str(DEFAULT_TAIL))
        if not tail.isdigit() or int(tail) > MAX_TAIL:
            raise BadRequestError(f"tail must be an integer between 0 and {MAX_TAIL}", param="tail")
        lines = self.logs.tail(key, int(tail))
        return web.json_response({"model": key, "lines": lines or [], "started": lines is not None})

    async def load(self, request: web.Request) -> web.Response:
        self._check(request)
        key = self._key(request)
        wait = request.query.get("wait", "").lower() in ("1", "true", "yes")
        phase = await self.control.preload(key, wait=wait)
        return web.json_response({"model": key, "phase": phase})

    async def unload(self, request: web.Request) -> web.Response:
        self._check(request)
        key = self._key(request)
        await self.control.unload(key)
        phase = next((s.phase for s in self.control.snapshot() if s.key == key), "Idle")
        return web.json_response({"model": key, "phase": phase})

    async def log_window(self, request: web.Request) -> web.Response:
        """``GET /admin/models/{model}/logs?after=N&since=SECONDS&tail=N`` → ``{"model", "lines", "next",
        "started"}``: lines numbered from ``after`` (``next`` continues, for ``flexinfer logs --follow``),
        written in the last ``since`` seconds, at most ``tail`` of them."""
        self._check(request)
        key = self._key(request)
        after = _number(request, "after", int)
        since = _number(request, "since", float)
        tail = _number(request, "tail", int)
        if tail is not None and tail > MAX_TAIL:
            raise BadRequestError(f"tail must be an integer between 0 and {MAX_TAIL}", param="tail")
        window = self.logs.window(key, after, None if since is None else time.time() - since, tail)
        if window is None:
            return web.json_response({"model": key, "lines": [], "next": 0, "started": False})
        return web.json_response({"model": key, "lines": window.lines, "next": window.next, "started": True})

    async def manifests(self, request: web.Request) -> web.Response:
        """``PUT /admin/manifests``: the pushed text through a file reload's checks; 200 with the ``config``
        section once in force, 422 with every problem when rejected (the previous configuration stays)."""
        self._check(request)
        assert self.push is not None
        status = await self.push(await _body(request, MAX_MANIFEST_BYTES))
        if status.result != "rejected":
            return web.json_response(status.as_json())
        errors = [echo_safe(e) for e in status.errors] or ["the manifests were rejected"]
        more = f" (and {len(errors) - 1} more problem(s), listed in errors)" if len(errors) > 1 else ""
        body = {"error": {"message": f"{errors[0]}{more}", "type": "invalid_request_error", "param": None,
                          "code": "invalid_manifests"}, "errors": errors}
        return web.json_response(body, status=422)

    async def lifecycle_events(self, request: web.Request) -> web.Response:
        """``GET /admin/lifecycle?after=N``: the cold starts and swaps numbered above ``N`` (default 0)."""
        self._check(request)
        assert self.lifecycle is not None
        after = _number(request, "after", int)
        return web.json_response(self.lifecycle.after(after or 0).as_json())


async def _body(request: web.Request, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes (``PayloadTooLargeError`` past it, read no further)."""
    too_large = PayloadTooLargeError(f"Request body exceeds the limit of {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _number(request: web.Request, name: str, kind: type[int] | type[float]) -> Any:
    """An optional non-negative number from the query (``BadRequestError`` naming it otherwise)."""
    text = request.query.get(name)
    if text is None or text == "":
        return None
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if not value >= 0 or value == float("inf"):
        what = "integer" if kind is int else "number"
        raise BadRequestError(f"{name} must be a non-negative {what}, got {echo_safe(text, 64)!r}", param=name)
    return value
