"""The proxy's dispatcher as the cluster sees it: the watch cache mirrored into it, and the way in to it.

The manager elects shared-group members and owns scaling, so the dispatcher gets every Model without its
shared group (``dispatch_model``) and a policy that leaves scaling to the manager (built by
``flexinfer.assembly.cluster_proxy``). ``DispatcherSync`` subscribes to the watch cache: spec changes
redeclare the model set (batched per loop turn, and always before a request is admitted, so a new Model is
never answered 404 once the catalog knows it), and a model that leaves Ready in the cluster (preempted,
scaled down, deleted, endpoint changed; ``left_ready``) is marked stopped so the next request activates
it again. Its ``acquire`` is the dispatcher's, after that redeclaration; ``DemandActivator``
(``flexinfer.cluster_proxy.demand_activator``) admits requests through it. Data flows one way: watch
events → projection → dispatcher.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from flexinfer.api.base import ObjectMeta
from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.cluster_proxy.demand import forwarding_endpoint
from flexinfer.cluster_proxy.model_watch import ModelStore
from flexinfer.core.arbiter import events as ev
from flexinfer.core.phases import READY
from flexinfer.runtime.dispatcher import Dispatcher
from flexinfer.runtime.ports import Grant

log = logging.getLogger(__name__)


def dispatch_model(model: Model) -> Model:
    """The Model as the proxy's dispatcher sees it: no shared group (the manager elects the members), the spec
    otherwise as stored. Status and server-side metadata are dropped (they change on every event)."""
    spec = model.spec
    gpu = spec.gpu.model_copy(update={"shared": None}) if spec.gpu is not None else None
    return Model(metadata=ObjectMeta(name=model.name, namespace=model.namespace),
                 spec=spec.model_copy(update={"gpu": gpu}))


def left_ready(old: Model, new: Model | None, override: bool) -> bool:
    """The change ``old`` → ``new`` takes the model away from ``old``'s forwarding endpoint (not Ready any more,
    deleted, Ready elsewhere; a group pod's member whose pod went away or that failed)."""
    before = forwarding_endpoint(old, override)
    if before is None:
        return False
    return new is None or forwarding_endpoint(new, override) != before


class DispatcherSync:
    """Mirrors the watch cache into the proxy's dispatcher and admits requests to it (module docstring)."""

    def __init__(self, store: ModelStore, dispatcher: Dispatcher, override: bool) -> None:
        self._dispatcher, self._override = dispatcher, override
        self._declared: dict[str, Model] = {}
        self._dirty = False
        self._scheduled = False
        store.subscribe(self._changed)

    async def acquire(self, model: ModelKey, timeout: float | None = None,
                      on_wait: Callable[[str], None] | None = None) -> Grant:
        """The dispatcher's ``acquire``, after declaring the current model set."""
        self.flush()
        return await self._dispatcher.acquire(model, timeout, on_wait)

    def forget_endpoint(self, model: Model) -> None:
        """Tell the dispatcher the model's server is gone (a stop, not a crash: no Failed phase)."""
        self._dispatcher.post(ev.ModelStopped(model.key))

    def flush(self) -> None:
        """Declare the current model set now (before a request is admitted, so it never races a new Model)."""
        self._scheduled = False
        if self._dirty:
            self._dirty = False
            self._dispatcher.post(ev.ModelsReplaced(tuple(self._declared.values())))

    def _changed(self, old: Model | None, new: Model | None) -> None:
        current = new if new is not None else old
        if current is None:
            return
        key = current.key
        projected = dispatch_model(new) if new is not None else None
        if self._declared.get(key) != projected:
            if projected is None:
                self._declared.pop(key, None)
            else:
                self._declared[key] = projected
            self._mark_dirty()
        if old is not None and left_ready(old, new, self._override):
            self._stopped(old)

    def _mark_dirty(self) -> None:
        self._dirty = True
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def _stopped(self, model: Model) -> None:
        self.flush()
        if self._dispatcher.phase(model.key) == READY:
            log.info("model %s left Ready in the cluster; the next request activates it again", model.key)
            self.forget_endpoint(model)
