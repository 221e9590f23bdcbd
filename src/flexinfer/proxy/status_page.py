"""The status page: a small static web page (``GET /ui``) that polls a JSON endpoint.

Routes, added to the proxy application by ``install(app, page)`` (called by ``flexinfer.assembly`` for
``flexinfer serve`` and ``flexinfer proxy``):

- ``GET /ui`` and ``GET /ui/static/{file}``: the page (HTML, CSS, plain JavaScript shipped as package data,
  no build step, no external resources). They hold no data, so they need no token.
- ``GET /ui/api/status``: models (the ``flexinfer status`` fields), which model holds each GPU group, the
  memory of the groups that pack by memory (``memory_groups``: budget, used, reserved for loading, members,
  evictions; the page draws a bar per group), the last activations with their stage breakdown, recent
  cold-start/swap durations and recent errors.
- ``GET /ui/api/logs/{model}?tail=N``: the last lines of a model server's output (local engine only;
  ``404`` with ``code: logs_unavailable`` in cluster mode).

The API routes need ``Authorization: Bearer <token>`` when the proxy's auth is on (the page asks for the
token and keeps it in the browser's session storage). ``install`` also copies WARNING-and-above records of
the ``flexinfer`` loggers into the activity log while the application runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web

from flexinfer.core.errors import BadRequestError, ModelNotFoundError, RequestError
from flexinfer.proxy.auth import BearerAuth
from flexinfer.proxy.errors import RouteNotFoundError
from flexinfer.runtime.activity import ActivityLog, ErrorLogHandler
from flexinfer.runtime.dispatcher import ModelState
from flexinfer.runtime.ports import Catalog

STATIC_FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
DEFAULT_TAIL = 200
MAX_TAIL = 5000
HOLDING_PHASES = ("Loading", "Ready")
"""A model in one of these phases holds (or is taking) its GPU group."""
LogTail = Callable[[str, int], "list[str] | None"]


class LogsUnavailableError(RequestError):
    """The proxy cannot see model server output (cluster mode)."""

    status, type, code, param = 404, "not_found_error", "logs_unavailable", None

    def __init__(self) -> None:
        super().__init__("model server logs are not available in cluster mode (use kubectl logs)")


def model_row(state: ModelState) -> dict[str, object]:
    """One model as the page (and ``flexinfer status``) shows it."""
    return {
        "key": state.key, "name": state.name, "namespace": state.namespace, "group": state.group,
        "priority": state.priority, "phase": state.phase, "queue_depth": state.queue_depth,
        "in_flight": state.in_flight, "last_swap_age": state.last_swap_age, "draining": state.draining,
        "need": None if state.need_mib is None else {"mib": round(state.need_mib, 2), "source": state.need_source},
    }


def catalog_states(catalog: Catalog, snapshot: Callable[[], list[ModelState]]) -> Callable[[], list[ModelState]]:
    """Model states for the cluster proxy: identity, group, phase and memory need from the catalog (the Models'
    status), queue depth and in-flight counts from the proxy's own dispatcher (which runs every model ungrouped)."""

    def states() -> list[ModelState]:
        local = {s.key: s for s in snapshot()}
        out = []
        for view in sorted(catalog.models(), key=lambda v: (v.namespace, v.name)):
            mine = local.get(view.key)
            out.append(ModelState(
                key=view.key, name=view.name, namespace=view.namespace, group=view.group, priority=view.priority,
                phase=view.phase, queue_depth=mine.queue_depth if mine else 0,
                in_flight=mine.in_flight if mine else 0, endpoint=None, last_swap_age=None,
                draining=mine.draining if mine else False, **_need(view.metadata)))
        return out

    return states


def _need(metadata: Mapping[str, object]) -> dict[str, Any]:
    """``need_mib``/``need_source`` of a catalog view that carries them (a member of a group that packs by memory)."""
    mib, source = metadata.get("need_mib"), metadata.get("need_source")
    if not isinstance(mib, int | float) or not isinstance(source, str):
        return {}
    return {"need_mib": float(mib), "need_source": source}


def group_holders(states: Sequence[ModelState]) -> dict[str, str | None]:
    """GPU group → the key of the model holding it, or the keys of those holding it (comma-separated, in a
    group that packs by memory); ``None`` when the group is free."""
    holders: dict[str, str | None] = {}
    for state in states:
        if state.group is None:
            continue
        held = holders.setdefault(state.group, None)
        if state.phase in HOLDING_PHASES:
            holders[state.group] = state.key if held is None else f"{held}, {state.key}"
    return holders


@dataclass(frozen=True)
class StatusPage:
    """The page's handlers over the dispatcher snapshot, the activity log and (locally) the model logs."""

    snapshot: Callable[[], list[ModelState]]
    activity: ActivityLog
    auth: BearerAuth
    mode: str
    """``local`` or ``cluster`` (shown on the page)."""
    logs: LogTail | None = None
    """``(model key, lines) -> lines or None``; ``None`` where the proxy cannot see server output."""
    memory: Callable[[], list[dict[str, object]]] | None = None
    """The groups that pack by memory (``Dispatcher.memory_report``; in cluster mode
    ``flexinfer.cluster_proxy.memory_groups``, without evictions); ``None``: none here."""

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/ui", self.index),
            web.get("/ui/", self.index),
            web.get("/ui/static/{file}", self.static),
            web.get("/ui/api/status", self.status),
            web.get("/ui/api/logs/{model:.+}", self.model_logs),
        ]

    async def index(self, _: web.Request) -> web.Response:
        return _asset("index.html")

    async def static(self, request: web.Request) -> web.Response:
        return _asset(request.match_info["file"])

    async def status(self, request: web.Request) -> web.Response:
        self.auth.check(request.headers.get("Authorization"))
        states = self.snapshot()
        body: dict[str, object] = {
            "mode": self.mode, "now": time.time(), "logs_available": self.logs is not None,
            "models": [model_row(s) for s in states], "groups": group_holders(states),
            "memory_groups": self.memory() if self.memory is not None else [],
        }
        body.update(self.activity.snapshot())
        return web.json_response(body)

    async def model_logs(self, request: web.Request) -> web.Response:
        self.auth.check(request.headers.get("Authorization"))
        if self.logs is None:
            raise LogsUnavailableError()
        key, tail = request.match_info["model"], request.query.get("tail", str(DEFAULT_TAIL))
        if not tail.isdigit() or int(tail) > MAX_TAIL:
            raise BadRequestError(f"tail must be an integer between 0 and {MAX_TAIL}", param="tail")
        if key not in {s.key for s in self.snapshot()}:
            raise ModelNotFoundError(key)
        return web.json_response({"model": key, "lines": self.logs(key, int(tail)) or []})


def _asset(name: str) -> web.Response:
    content_type = STATIC_FILES.get(name)
    if content_type is None:
        raise RouteNotFoundError(f"Unknown path /ui/static/{name}")
    data = resources.files("flexinfer.proxy").joinpath("static", name).read_bytes()
    return web.Response(body=data, content_type=content_type, headers={"Cache-Control": "no-cache"})


def install(app: web.Application, page: StatusPage) -> None:
    """Add the page's routes to ``app`` and capture ``flexinfer`` warnings while ``app`` runs."""
    app.router.add_routes(page.routes())
    handler = ErrorLogHandler(page.activity)
    logger = logging.getLogger("flexinfer")

    async def attach(_: web.Application) -> None:
        logger.addHandler(handler)

    async def detach(_: web.Application) -> None:
        logger.removeHandler(handler)

    app.on_startup.append(attach)
    app.on_cleanup.append(detach)
