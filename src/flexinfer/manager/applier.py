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

    async def apply(self, body: Body) -> Body:
        """Apply ``body`` unless the same content was applied and the live object is unchanged since."""
        kind, meta = body["kind"], body["metadata"]
        ident = (kind, meta["namespace"], meta["name"])
        digest = _digest(body)
        live = self._store.live(kind, meta["namespace"], meta["name"])
        remembered = self._applied.get(ident)
        if live is not None and remembered == (digest, _fingerprint(live)):
            return live
        result = await self._api.apply(body)
        self.applies += 1
        self._store.put(kind, result)
        self._applied[ident] = (digest, _fingerprint(result))
        return result

    def forget(self, namespace: str, name: str) -> None:
        for kind in ("Deployment", "Service"):
            self._applied.pop((kind, namespace, name), None)
