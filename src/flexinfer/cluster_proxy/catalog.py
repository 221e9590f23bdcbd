"""The in-cluster proxy's ``Catalog``: request names → Models, answered from the watch cache (no API call).

A request may name a model by ``namespace/name``, by its name (when unique across the watched
namespaces; a name used in several is ambiguous, 409), by ``spec.litellm.servedModelName`` or by one of
``spec.litellm.aliases``; a model's own name always wins over another model's alias, and among alias
claimants the oldest Model wins (then the key). The rule is ``flexinfer.core.model_index``.
``spec.litellm.enabled: false`` parks a model (the proxy answers 404 and ``/v1/models`` hides it). The
phase shown is the manager's ``status.phase`` (and, in a group that packs by memory, the need from
``status.sharedGroup``). The name index is rebuilt only after the store changed.
Built by ``flexinfer.assembly.cluster_proxy``; used by the proxy (``flexinfer.proxy``) through the ``Catalog`` port.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.cluster_proxy.model_watch import ModelStore
from flexinfer.core.model_index import EMPTY, ModelIndex, aliases
from flexinfer.core.phases import READY
from flexinfer.core.profiles import served_name, served_name_args
from flexinfer.runtime.ports import ModelView

_SOURCE_PREFIXES = ("HF://", "hf://", "ollama://", "file://")


def backend_model_name(model: Model) -> str:
    """The ``model`` field the backend expects (spec §6.4): ``served_name`` (``spec.config.servedModelName``,
    else the model's name, as locally) when it is configured or the manager tells the server that name
    (``served_name_args``: llama.cpp, vLLM); else the model id from ``spec.source`` (scheme stripped;
    ``pvc://claim/sub/path`` → ``/sub/path``), what servers told no name answer to."""
    if model.spec.config.get("servedModelName") or served_name_args(model):
        return served_name(model)
    source = model.spec.source
    if source.startswith("pvc://"):
        _, _, sub = source[len("pvc://"):].partition("/")
        return "/" + sub
    for prefix in _SOURCE_PREFIXES:
        if source.startswith(prefix):
            return source[len(prefix):]
    return source


def parked(model: Model) -> bool:
    """``spec.litellm.enabled: false``: the model is not served through the proxy."""
    return model.spec.litellm is not None and not model.spec.litellm.enabled


def view(model: Model) -> ModelView:
    """The proxy's view of a Model as the manager last reported it."""
    status = model.status
    phase = status.phase or "Idle"
    created = model.metadata.creation_timestamp
    shared = status.shared_group
    need = shared.memory_need_mib if shared is not None else None
    return ModelView(
        name=model.name, namespace=model.namespace, backend=model.backend,
        served_model_name=backend_model_name(model), phase=phase, group=model.group,
        priority=model.priority, aliases=aliases(model), parked=parked(model),
        created=created.timestamp() if created is not None else 0.0,
        metadata={"key": model.key, "source": model.spec.source, "ready": phase == READY,
                  "loading_substage": status.loading_substage, "message": status.message,
                  "need_mib": need, "need_source": shared.memory_need_source if shared is not None else None},
    )


def _age_order(model: Model) -> tuple[float, str]:
    created: datetime | None = model.metadata.creation_timestamp
    return (created.timestamp() if created is not None else float("inf"), model.key)


class WatchCatalog:
    """Name/alias resolution over a ``ModelStore`` (see the module docstring)."""

    def __init__(self, store: ModelStore) -> None:
        self._store = store
        self._index = EMPTY
        self._indexed = -1
        self._views: dict[ModelKey, ModelView] = {}
        """Views made since the store last changed: resolving a name on every request makes none."""

    def key(self, name: str) -> ModelKey | None:
        """The Model key a request name routes to, if any (``AmbiguousModelError`` for an ambiguous name)."""
        if self._indexed != self._store.version:
            self._index = ModelIndex.build(sorted(self._store.all(), key=_age_order))
            self._views = {}
            self._indexed = self._store.version
        return self._index.lookup(name)

    def model(self, name: str) -> Model | None:
        """The cached Model a request name routes to, if any."""
        key = self.key(name)
        return self._store.get(key) if key is not None else None

    def resolve(self, name: str) -> ModelView | None:
        key = self.key(name)
        if key is None:
            return None
        made = self._views.get(key)
        if made is None:
            model = self._store.get(key)
            if model is None:
                return None
            made = self._views[key] = view(model)
        return made

    def models(self) -> Sequence[ModelView]:
        return [view(m) for m in sorted(self._store.all(), key=lambda m: m.key)]
