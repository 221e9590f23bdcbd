"""What the Kubernetes engine needs from its neighbours, as Protocols (adapters never import each other).

``flexinfer.assembly.run_manager`` passes ``flexinfer.observability.metrics.LifecycleMetrics`` as the
``LifecycleSink`` and ``functools.partial(reconcile_span, tracing, metrics=...)`` as the ``ReconcileScope``;
tests pass recorders.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from flexinfer.api.model import Model


class LifecycleSink(Protocol):
    """Lifecycle metrics the manager observes on transitions."""

    def cold_start(self, model: Model, seconds: float) -> None: ...

    def swap(self, model: Model, seconds: float) -> None: ...

    def stage(self, model: Model, stage: str, seconds: float) -> None: ...

    def phase_changed(self, model: Model, old: str | None, new: str, reason: str = "reconcile") -> None: ...

    def group_state(self, model: Model, state: str) -> None: ...

    def preemption(self, loser: Model, to: str) -> None: ...

    def declared(self, model: Model) -> None: ...

    def forgotten(self, model: Model) -> None: ...


class ReconcileScope(Protocol):
    """A factory of per-reconcile scopes (a span + reconcile metrics); an escaping error is recorded."""

    def __call__(self, controller: str, namespace: str, name: str) -> AbstractAsyncContextManager[Any]: ...
