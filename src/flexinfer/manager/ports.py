"""What the manager needs from its neighbours that no other layer defines (adapters never import each other).

``flexinfer.assembly.run_manager`` passes ``functools.partial(reconcile_span, tracing, metrics=...)`` as the
``ReconcileScope``; tests pass recorders. Lifecycle facts go through the one
``flexinfer.runtime.observer.LifecycleObserver`` port (``LifecycleMetrics`` in production). ``/metrics`` serves an
``Exposition`` (``flexinfer.observability.exposition.exposition`` bound to the registry).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

Exposition = Callable[[], Iterable[bytes]]
"""The Prometheus text of the manager's metrics, in chunks written one after another."""


class ReconcileScope(Protocol):
    """A factory of per-reconcile scopes (a span + reconcile metrics); an escaping error is recorded."""

    def __call__(self, controller: str, namespace: str, name: str) -> AbstractAsyncContextManager[Any]: ...
