"""An in-memory ``flexinfer.kube.model_api.ModelApi`` for fault injection in the proxy-side unit tests.

Objects get increasing resourceVersions; ``list_models`` returns a snapshot, ``watch_models`` streams every
change after the given resourceVersion, and tests inject faults: ``expire()`` ends open watches with
410 Gone (and forgets history, so re-watching from an old version also gets 410), ``break_watches(error)``
ends them with another error, ``patch_failures`` makes the next status patches fail. Status and metadata
patches are merged into the stored object and broadcast as MODIFIED events, like the real API server;
JSON patches (``test``/``add``/``remove``/``replace``) are all-or-nothing and answer 422 when a ``test`` fails
or a path is missing, as the real API server does.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from flexinfer.kube.model_api import KubeApiError, ModelList, WatchEvent, WatchExpiredError


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


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """RFC 7386 JSON merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def json_patch_op(doc: dict[str, Any], op: Mapping[str, Any]) -> None:
    """Apply one RFC 6902 operation (object paths only) in place; 422 ``KubeApiError`` when it fails."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    target: Any = doc
    for part in parents:
        target = target.get(part) if isinstance(target, dict) else None
    if not isinstance(target, dict):
        if op["op"] == "test" and op.get("value") is None:
            return
        raise KubeApiError(f"{op['op']} {op['path']}: missing path", 422)
    if op["op"] == "test":
        if target.get(last) != op.get("value"):
            raise KubeApiError(f"test {op['path']}: testing value failed", 422)
    elif op["op"] in ("add", "replace"):
        if op["op"] == "replace" and last not in target:
            raise KubeApiError(f"replace {op['path']}: missing path", 422)
        target[last] = copy.deepcopy(op["value"])
    elif op["op"] == "remove":
        if last not in target:
            raise KubeApiError(f"remove {op['path']}: missing path", 422)
        del target[last]
    else:
        raise KubeApiError(f"unsupported op {op['op']}", 422)


class FakeModelApi:
    """See the module docstring."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[int, WatchEvent]] = []
        self.version = 0
        self.oldest = 0
        """Watching from a version below this answers 410 Gone."""
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.patch_failures: list[KubeApiError] = []
        self.metadata_patches: list[tuple[str, str, dict[str, Any]]] = []
        self.json_patches: list[tuple[str, str, list[dict[str, Any]], bool]] = []
        """(namespace, name, operations, applied) for every JSON patch, refused ones included."""
        self.patch_gate: asyncio.Event | None = None
        """When set, patches wait for this event (to observe concurrent callers)."""
        self.list_calls = 0
        self.watch_calls: list[str] = []
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
            for version, event in pending:
                since = version
                if namespace is None or event.object["metadata"]["namespace"] == namespace:
                    yield copy.deepcopy(event)

    async def patch_model_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        if self.patch_gate is not None:
            await self.patch_gate.wait()
        if self.patch_failures:
            raise self.patch_failures.pop(0)
        await self._merge_patch(namespace, name, patch, self.patches)

    async def patch_model(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        await self._merge_patch(namespace, name, patch, self.metadata_patches)

    async def _merge_patch(self, namespace: str, name: str, patch: Mapping[str, Any],
                           record: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Record ``patch`` in ``record``, merge it into the stored Model and emit MODIFIED (404 if absent)."""
        key = f"{namespace}/{name}"
        if key not in self.objects:
            raise KubeApiError(f"models {name} not found", 404)
        record.append((namespace, name, copy.deepcopy(dict(patch))))
        doc = copy.deepcopy(self.objects[key])
        merge(doc, patch)
        await self._store(key, doc, "MODIFIED")

    async def json_patch_model(self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]) -> None:
        key = f"{namespace}/{name}"
        if key not in self.objects:
            raise KubeApiError(f"models {name} not found", 404)
        ops = [copy.deepcopy(dict(op)) for op in operations]
        doc = copy.deepcopy(self.objects[key])
        try:
            for op in ops:
                json_patch_op(doc, op)
        except KubeApiError:
            self.json_patches.append((namespace, name, ops, False))
            raise
        self.json_patches.append((namespace, name, ops, True))
        await self._store(key, doc, "MODIFIED")

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
