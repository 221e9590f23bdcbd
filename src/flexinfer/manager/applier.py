"""Applies rendered Deployments and Services only when needed.

A server-side apply of an unchanged object is already a no-op on the server (no new resourceVersion),
but it is still a round trip. ``Applier`` remembers, per object, the hash of what it applied and the
live object's fingerprint afterwards (``metadata.generation`` for Deployments, whose status changes do
not bump it; ``resourceVersion`` otherwise). The next apply is skipped while both match the store, so a
reconcile caused by a status-only change costs no API call; an edit by someone else, a deletion or a
restart (empty memory) re-applies. Apply responses go into the store. Used by ``flexinfer.manager.reconciler``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from flexinfer.manager.client import KubeApi
from flexinfer.manager.store import Store

Body = dict[str, Any]


def _fingerprint(body: Body | None) -> str | None:
    if body is None:
        return None
    meta = body.get("metadata") or {}
    generation = meta.get("generation")
    return f"g{generation}" if generation else f"rv{meta.get('resourceVersion')}"


def _digest(body: Body) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Applier:
    """See the module docstring."""

    def __init__(self, api: KubeApi, store: Store) -> None:
        self._api = api
        self._store = store
        self._applied: dict[tuple[str, str, str], tuple[str, str | None]] = {}
        self.applies = 0

    def pending(self, body: Body) -> bool:
        """``apply(body)`` would send a write (it is not the same content over an unchanged live object)."""
        return self._unchanged(body, _digest(body)) is None

    def _unchanged(self, body: Body, digest: str) -> Body | None:
        """The live object when ``body`` (whose digest is ``digest``) was applied already and the live object is
        unchanged since."""
        meta = body["metadata"]
        live = self._store.live(body["kind"], meta["namespace"], meta["name"])
        remembered = self._applied.get((body["kind"], meta["namespace"], meta["name"]))
        return live if live is not None and remembered == (digest, _fingerprint(live)) else None

    async def apply(self, body: Body) -> Body:
        """Apply ``body`` unless the same content was applied and the live object is unchanged since."""
        digest = _digest(body)
        unchanged = self._unchanged(body, digest)
        if unchanged is not None:
            return unchanged
        result = await self._api.apply(body)
        self.applies += 1
        self._store.put(body["kind"], result)
        meta = body["metadata"]
        self._applied[(body["kind"], meta["namespace"], meta["name"])] = (digest, _fingerprint(result))
        return result

    def forget(self, namespace: str, name: str) -> None:
        for kind in ("Deployment", "Service"):
            self._applied.pop((kind, namespace, name), None)
