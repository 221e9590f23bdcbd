"""What the manager needs from its neighbours that no other layer defines (adapters never import each other).

``flexinfer.assembly.run_manager`` passes ``functools.partial(reconcile_span, tracing, metrics=...)`` as the
``ReconcileScope``; tests pass recorders. Lifecycle facts go through the one
``flexinfer.runtime.observer.LifecycleObserver`` port (``LifecycleMetrics`` in production).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol


class ReconcileScope(Protocol):
    """A factory of per-reconcile scopes (a span + reconcile metrics); an escaping error is recorded."""

    def __call__(self, controller: str, namespace: str, name: str) -> AbstractAsyncContextManager[Any]: ...
