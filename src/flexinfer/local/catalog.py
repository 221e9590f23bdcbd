"""The proxy's ``Catalog`` in local mode: the loaded manifests, with each model's current phase.

A request names a model by ``namespace/name``, by its name when unique, by ``spec.litellm.servedModelName``
or by one of ``spec.litellm.aliases`` (the first manifest claiming an alias wins); the rule is
``flexinfer.core.model_index``, and a name used in several namespaces is ambiguous (409).
``spec.litellm.enabled: false`` parks a model (listed as parked; the proxy answers 404). Phases come from a
callable (the dispatcher's ``phase``), so the catalog itself holds no swap state. Built by
``flexinfer.assembly.run_local``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.core.model_index import EMPTY, ModelIndex, aliases
from flexinfer.core.profiles import served_name
from flexinfer.runtime.ports import ModelView

PhaseLookup = Callable[[ModelKey], "str | None"]
"""The current phase of a model key (``None`` → ``Idle``)."""


def view(model: Model, phase: str) -> ModelView:
    """The proxy's view of ``model``."""
    return ModelView(
        name=model.name, namespace=model.namespace, backend=model.backend, served_model_name=served_name(model),
        phase=phase, group=model.group, priority=model.priority, aliases=aliases(model),
        parked=model.spec.litellm is not None and not model.spec.litellm.enabled,
        metadata={"key": model.key},
    )


def _no_phase(key: ModelKey) -> None:
    """Every model Idle (a catalog without a dispatcher)."""
    return None


class ManifestCatalog:
    """Name/alias resolution over a fixed model list (see the module docstring)."""

    def __init__(self, models: Iterable[Model], phases: PhaseLookup | None = None) -> None:
        self._models: dict[ModelKey, Model] = {}
        self._views: dict[tuple[ModelKey, str], ModelView] = {}
        """Views already built, per (key, phase): resolving a name on every request builds nothing."""
        self._index = EMPTY
        self._phase: PhaseLookup = phases or _no_phase
        self.replace(models)

    def replace(self, models: Iterable[Model]) -> None:
        """Use a new model list (manifest order decides between alias claimants)."""
        self._models = {m.key: m for m in models}
        self._views = {}
        self._index = ModelIndex.build(self._models.values())

    def key(self, name: str) -> ModelKey | None:
        """The model key a name or alias routes to (``AmbiguousModelError`` for an ambiguous name)."""
        return self._index.lookup(name)

    def model(self, name: str) -> Model | None:
        """The manifest a name or alias routes to."""
        key = self.key(name)
        return self._models.get(key) if key else None

    def resolve(self, name: str) -> ModelView | None:
        key = self.key(name)
        model = self._models.get(key) if key is not None else None
        if key is None or model is None:
            return None
        phase = self._phase(key) or "Idle"
        cached = self._views.get((key, phase))
        if cached is None:
            cached = self._views[(key, phase)] = view(model, phase)
        return cached

    def models(self) -> Sequence[ModelView]:
        return [view(m, self._phase(key) or "Idle") for key, m in self._models.items()]
