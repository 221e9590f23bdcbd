"""The in-cluster proxy's watch cache of Models: an in-memory store kept current by list + watch.

``ModelStore`` holds the latest valid ``Model`` per key (``namespace/name``), tells listeners about every
change (``old``/``new``, ``None`` for absent), and offers ``wait_until(key, check)``: resolved by watch
events, never by polling. Its ``epoch`` counts full listings: between two, each Model's versions arrived in the
order they were written (the in-flight reports rely on it). ``ModelWatcher.run`` lists Models, then watches
from the list's resourceVersion; a 410 Gone lists again (the store is reconciled against the new snapshot,
deletions included); any other failure re-watches from the last resourceVersion after an exponential backoff.
Built by ``flexinfer.assembly.cluster_proxy``; read by ``catalog`` (name resolution) and ``demand``
(readiness).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from pydantic import ValidationError

from flexinfer.api.loading import validate_stored
from flexinfer.api.model import Model
from flexinfer.cluster_proxy.model_api import KubeApiError, ModelApi, WatchEvent, WatchExpiredError

log = logging.getLogger(__name__)

T = TypeVar("T")
ChangeListener = Callable[[Model | None, Model | None], None]
"""Called with ``(old, new)`` after each change; ``None`` means absent (added / deleted)."""
Check = Callable[[Model | None], T | None]
"""A readiness check: a value (not ``None``) ends the wait; raising ends it with that error."""


def parse_model(doc: dict[str, Any]) -> Model | None:
    """The document as a ``Model``; ``None`` (logged) when it does not validate. A quantity or duration stored
    before the CRD's pattern existed is ignored, as the manager does (``parse_stored``)."""
    meta = doc.get("metadata") or {}
    try:
        model, _, ignored = validate_stored(Model, doc)
    except ValidationError as exc:
        log.warning("ignoring Model %s/%s: %s", meta.get("namespace"), meta.get("name"),
                    "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
        return None
    if ignored:
        log.debug("Model %s/%s: ignoring %s", meta.get("namespace"), meta.get("name"), "; ".join(map(str, ignored)))
    return model


class ModelStore:
    """The latest Models by key, with change listeners and event-driven waits (one event loop only)."""

    def __init__(self) -> None:
        self._models: dict[str, Model] = {}
        self._listeners: list[ChangeListener] = []
        self._waiters: dict[str, list[tuple[Check[Any], asyncio.Future[Any]]]] = {}
        self.synced = asyncio.Event()
        """Set once the first full list has been applied."""
        self.version = 0
        """Increments on every change (cheap staleness check for derived indexes)."""
        self.epoch = 0
        """Increments on every full snapshot (``replace_all``): within one epoch the watch delivered each Model's
        versions in the order they were written; a listing may be older than a version delivered before it."""

    def get(self, key: str) -> Model | None:
        return self._models.get(key)

    def all(self) -> list[Model]:
        return list(self._models.values())

    def subscribe(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def upsert(self, model: Model) -> None:
        self._set(model.key, model)

    def delete(self, key: str) -> None:
        self._set(key, None)

    def replace_all(self, models: Iterable[Model]) -> None:
        """Reconcile with a full snapshot: absent keys are deleted, the rest upserted (a new ``epoch``)."""
        fresh = {m.key: m for m in models}
        self.epoch += 1
        for key in [k for k in self._models if k not in fresh]:
            self._set(key, None)
        for key, model in fresh.items():
            self._set(key, model)
        self.synced.set()

    def _set(self, key: str, model: Model | None) -> None:
        old = self._models.get(key)
        if old is None and model is None:
            return
        if old is not None and model is not None and _same_version(old, model):
            return
        if model is None:
            del self._models[key]
        else:
            self._models[key] = model
        self.version += 1
        for listener in list(self._listeners):
            try:
                listener(old, model)
            except Exception:
                log.exception("model store listener failed for %s", key)
        self._wake(key, model)

    async def wait_until(self, key: str, check: Check[T]) -> T:
        """Wait until ``check(model)`` returns a value (evaluated now and on each change of ``key``)."""
        result = check(self._models.get(key))
        if result is not None:
            return result
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        entry = (check, future)
        self._waiters.setdefault(key, []).append(entry)
        try:
            return await future
        finally:
            waiting = self._waiters.get(key, [])
            with contextlib.suppress(ValueError):
                waiting.remove(entry)
            if not waiting:
                self._waiters.pop(key, None)

    def _wake(self, key: str, model: Model | None) -> None:
        for check, future in list(self._waiters.get(key, ())):
            if future.done():
                continue
            try:
                result = check(model)
            except Exception as exc:
                future.set_exception(exc)
                continue
            if result is not None:
                future.set_result(result)


def _same_version(old: Model, new: Model) -> bool:
    version = new.metadata.resource_version
    return version is not None and version == old.metadata.resource_version


class ModelWatcher:
    """Keeps a ``ModelStore`` in sync with the API server (``namespace=None``: all namespaces)."""

    def __init__(self, api: ModelApi, store: ModelStore, namespace: str | None, *,
                 backoff_initial: float = 0.5, backoff_max: float = 30.0) -> None:
        self._api, self._store, self._namespace = api, store, namespace
        self._initial, self._max = backoff_initial, backoff_max
        self._delay = backoff_initial
        self.resource_version: str | None = None
        """Where the next watch resumes; ``None`` = list first."""
        self.relists = 0
        self.last_error: str | None = None
        """The most recent failure (cleared by a successful list)."""
        """How many full lists ran (the first one plus one per 410 Gone or list retry)."""

    async def run(self) -> None:
        """List, then watch forever (cancel to stop)."""
        while True:
            try:
                if self.resource_version is None:
                    await self._relist()
                await self._follow()
            except WatchExpiredError:
                log.info("model watch expired (410 Gone); listing again")
                self.resource_version = None
            except KubeApiError as exc:
                await self._backoff(str(exc))
            except Exception as exc:
                log.exception("model watch failed unexpectedly")
                await self._backoff(type(exc).__name__)

    async def _relist(self) -> None:
        listing = await self._api.list_models(self._namespace)
        self.relists += 1
        self._store.replace_all(m for doc in listing.items if (m := parse_model(doc)) is not None)
        self._delay, self.last_error = self._initial, None
        self.resource_version = listing.resource_version
        log.info("model cache synced: %d models at resourceVersion %s", len(listing.items), listing.resource_version)

    async def _follow(self) -> None:
        """Apply events until the stream ends, remembering the last resourceVersion (a re-watch resumes there)."""
        async for event in self._api.watch_models(self._namespace, self.resource_version or ""):
            self.resource_version = self._apply(event) or self.resource_version
            self._delay = self._initial

    def _apply(self, event: WatchEvent) -> str | None:
        meta = event.object.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        if event.type == "DELETED":
            self._store.delete(key)
        elif event.type in ("ADDED", "MODIFIED"):
            model = parse_model(event.object)
            if model is None:
                self._store.delete(key)
            else:
                self._store.upsert(model)
        version = meta.get("resourceVersion")
        return str(version) if version else None

    async def _backoff(self, reason: str) -> None:
        self.last_error = reason
        log.warning("model watch interrupted (%s); retrying in %.1fs", reason, self._delay)
        await asyncio.sleep(self._delay)
        self._delay = min(self._delay * 2, self._max)
