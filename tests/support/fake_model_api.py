"""An in-memory ``flexinfer.cluster_proxy.model_api.ModelApi`` for fault injection in the proxy-side unit tests.

Objects get increasing resourceVersions; ``list_models`` returns a snapshot, ``watch_models`` streams every
change after the given resourceVersion, and tests inject faults: ``expire()`` ends open watches with
410 Gone (and forgets history, so re-watching from an old version also gets 410), ``break_watches(error)``
ends them with another error, ``watch_gate`` holds what they deliver (a lagging watch), ``patch_failures`` makes
the next report writes fail. The proxy's
``ModelDemand`` reports live in ``demands`` (merge patches merged as the API server does; 404 for an absent
object, 409 for a second create); ``writes`` records every report write per Model as
(namespace, model, fields), and ``report(model)`` reads one Model's entry of every replica.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Mapping
from typing import Any

from flexinfer.cluster_proxy.model_api import KubeApiError, ModelList, WatchEvent, WatchExpiredError


def model_body(name: str, namespace: str = "default", *, phase: str | None = None,
               annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A Model document as the API server would return it (status optional)."""
    body: dict[str, Any] = {"backend": "vllm", "source": f"HF://org/{name}"}
    body.update(spec)
    doc: dict[str, Any] = {
        "apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": body,
    }
    if phase is not None:
        doc["status"] = {"phase": phase}
    return doc


async def idle_model_api(name: str = "m") -> FakeModelApi:
    """A fake API server holding one Idle Model ``name`` in ``default`` (nothing asked for it yet)."""
    api = FakeModelApi()
    await api.put(model_body(name, phase="Idle"))
    return api


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """RFC 7386 JSON merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping):  # a new object gets the patch's non-null members only
            if not isinstance(target.get(key), dict):
                target[key] = {}
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeModelApi:
    """See the module docstring."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[int, WatchEvent]] = []
        self.version = 0
        self.oldest = 0
        """Watching from a version below this answers 410 Gone."""
        self.demands: dict[str, dict[str, Any]] = {}
        """``namespace/name`` → ModelDemand document."""
        self.writes: list[tuple[str, str, dict[str, Any]]] = []
        """(namespace, model, fields) for every successful report write about a Model."""
        self.patch_failures: list[KubeApiError] = []
        self.patch_gate: asyncio.Event | None = None
        """When set, report writes wait for this event (to observe concurrent callers)."""
        self.held_patches = 0
        """Demand patches waiting at ``patch_gate``."""
        self.get_calls = 0
        self.after_write: list[Any] = []
        """Coroutine functions awaited after each report write (to change the Model in between)."""
        self.list_calls = 0
        self.watch_calls: list[str] = []
        self.watch_gate: asyncio.Event | None = None
        """When set, open watches deliver nothing until this event is set (a lagging watch)."""
        self._changed = asyncio.Condition()
        self._fault: BaseException | None = None

    # ------------------------------------------------------------ test controls

    async def put(self, doc: dict[str, Any]) -> dict[str, Any]:
        meta = doc["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        kind = "MODIFIED" if key in self.objects else "ADDED"
        await self._store(key, copy.deepcopy(doc), kind)
        return self.objects[key]

    async def set_status(self, name: str, status: dict[str, Any], namespace: str = "default") -> None:
        doc = copy.deepcopy(self.objects[f"{namespace}/{name}"])
        merge(doc.setdefault("status", {}), status)
        await self._store(f"{namespace}/{name}", doc, "MODIFIED")

    async def remove(self, name: str, namespace: str = "default") -> None:
        doc = self.objects.pop(f"{namespace}/{name}")
        await self._record(WatchEvent("DELETED", copy.deepcopy(doc)))

    async def expire(self) -> None:
        """410 Gone for open watches and for any resume point up to now."""
        self.oldest = self.version + 1
        await self.break_watches(WatchExpiredError())

    async def break_watches(self, error: BaseException) -> None:
        async with self._changed:
            self._fault = error
            self._changed.notify_all()

    # ------------------------------------------------------------ ModelApi

    async def list_models(self, namespace: str | None) -> ModelList:
        self.list_calls += 1
        prefix = f"{namespace}/" if namespace is not None else ""
        items = [copy.deepcopy(d) for k, d in self.objects.items() if k.startswith(prefix)]
        return ModelList(items, str(self.version))

    async def watch_models(self, namespace: str | None, resource_version: str) -> AsyncIterator[WatchEvent]:
        self.watch_calls.append(resource_version)
        since = int(resource_version or 0)
        if since < self.oldest - 1:
            raise WatchExpiredError()
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda since=since: self._fault is not None or self._after(since))
                if self._fault is not None:
                    fault, self._fault = self._fault, None
                    raise fault
                pending = [(v, e) for v, e in self.history if v > since]
            if self.watch_gate is not None:
                await self.watch_gate.wait()
            for version, event in pending:
                since = version
                if namespace is None or event.object["metadata"]["namespace"] == namespace:
                    yield copy.deepcopy(event)

    async def get_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.get_calls += 1
        doc = self.objects.get(f"{namespace}/{name}")
        return copy.deepcopy(doc) if doc is not None else None

    async def create_demand(self, namespace: str, body: Mapping[str, Any]) -> None:
        key = f"{namespace}/{body['metadata']['name']}"
        if key in self.demands:
            raise KubeApiError(f"modeldemands {key} already exists", 409)
        self.demands[key] = copy.deepcopy(dict(body))

    async def patch_demand(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        if self.patch_gate is not None:
            self.held_patches += 1
            try:
                await self.patch_gate.wait()
            finally:
                self.held_patches -= 1
        if self.patch_failures:
            raise self.patch_failures.pop(0)
        key = f"{namespace}/{name}"
        if key not in self.demands:
            raise KubeApiError(f"modeldemands {name} not found", 404)
        merge(self.demands[key], patch)
        for model, fields in ((patch.get("spec") or {}).get("models") or {}).items():
            self.writes.append((namespace, model, copy.deepcopy(fields)))
        for hook in list(self.after_write):
            await hook()

    async def replace_demand_spec(self, namespace: str, name: str, spec: Mapping[str, Any]) -> None:
        key = f"{namespace}/{name}"
        if key not in self.demands:
            raise KubeApiError(f"modeldemands {name} not found", 404)
        self.demands[key]["spec"] = copy.deepcopy(dict(spec))

    async def delete_demand(self, namespace: str, name: str) -> None:
        if self.demands.pop(f"{namespace}/{name}", None) is None:
            raise KubeApiError(f"modeldemands {name} not found", 404)

    # ------------------------------------------------------------ test reads

    def report(self, model: str, namespace: str = "default") -> dict[str, dict[str, Any]]:
        """Every replica's entry about ``model``: {replica: fields}."""
        out = {}
        for key, doc in self.demands.items():
            entry = ((doc.get("spec") or {}).get("models") or {}).get(model)
            if key.startswith(f"{namespace}/") and entry is not None:
                out[doc["spec"]["proxy"]] = entry
        return out

    @property
    def demand_writes(self) -> list[tuple[str, str, Any]]:
        """(namespace, model, lastActiveTime) of every demand write."""
        return self.field_writes("lastActiveTime")

    def field_writes(self, field: str) -> list[tuple[str, str, Any]]:
        """(namespace, model, value) of every write of ``field``."""
        return [(ns, m, f[field]) for ns, m, f in self.writes if field in f]

    # ------------------------------------------------------------ internals

    def _after(self, since: int) -> bool:
        return any(v > since for v, _ in self.history)

    async def _store(self, key: str, doc: dict[str, Any], kind: str) -> None:
        if doc["metadata"].get("annotations") == {}:
            del doc["metadata"]["annotations"]  # the API server omits an empty map
        self.objects[key] = doc
        await self._record(WatchEvent(kind, doc))

    async def _record(self, event: WatchEvent) -> None:
        async with self._changed:
            self.version += 1
            event.object["metadata"]["resourceVersion"] = str(self.version)
            self.history.append((self.version, WatchEvent(event.type, copy.deepcopy(event.object))))
            self._changed.notify_all()
