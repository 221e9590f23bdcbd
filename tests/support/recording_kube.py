"""A recording stand-in for the manager's ``KubeApi`` in reconciler unit tests (the integration tests use the real
API server): status patches are merged into the stored body (RFC 7386) and applies answered with the stored
status, each with a new resourceVersion; every call is recorded in order."""

from __future__ import annotations

import copy
from typing import Any

from flexinfer.manager.store import Store

Body = dict[str, Any]


def merged(before: Body, patch: Body) -> Body:
    out = dict(before)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


class RecordingKubeApi:
    """Answers the reconciler's calls as the API server would and records them in order."""

    def __init__(self, store: Store, reports: list[Body] | None = None, log: list[str] | None = None) -> None:
        self.store, self.reports, self.log = store, reports, log or []
        self.calls: list[tuple[str, ...]] = []
        self.rv = 100

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    async def patch_model_status(self, namespace: str, name: str, patch: Body) -> Body:
        self.calls.append(("status", name, str(patch.get("phase") or "")))
        parsed = self.store.model(namespace, name)
        assert parsed is not None
        body = copy.deepcopy(parsed.body)
        body["status"] = merged(body.get("status") or {}, patch)
        body["metadata"]["resourceVersion"] = self._next_rv()
        return body

    async def post_event(self, _body: Body, type_: str, reason: str, _message: str) -> None:
        self.calls.append(("event", type_, reason))

    def record_event(self, _body: Body, type_: str, reason: str, _message: str) -> None:
        self.calls.append(("event", type_, reason))

    async def list_demands(self, namespace: str) -> list[Body] | None:
        self.calls.append(("list_demands", namespace))
        return self.reports

    async def apply(self, body: Body) -> Body:
        meta = body["metadata"]
        self.calls.append(("apply", body["kind"], meta["name"], str(body.get("spec", {}).get("replicas", ""))))
        live = self.store.live(body["kind"], meta["namespace"], meta["name"])
        out = copy.deepcopy(body)
        out["metadata"]["resourceVersion"] = self._next_rv()
        out["status"] = (live or {}).get("status") or {}
        return out

    async def pod_log_tail(self, namespace: str, pod: str, container: str, lines: int,
                           previous: bool = False) -> list[str]:
        self.calls.append(("previous-log" if previous else "log", pod, container))
        return self.log[-lines:]

    async def delete(self, kind: str, namespace: str, name: str, *, grace_period: int | None = None) -> bool:
        self.calls.append(("delete", kind, name, str(grace_period)))
        return True
