"""The proxy's ``Catalog`` in local mode: the loaded manifests, with each model's current phase.

A request names a model by its name, ``namespace/name``, ``spec.litellm.servedModelName`` or one of
``spec.litellm.aliases`` (the first model claiming an alias wins). ``spec.litellm.enabled: false`` parks a
model (listed as parked; the proxy answers 404). Phases come from a callable (the dispatcher's snapshot),
so the catalog itself holds no swap state. Built by ``flexinfer.assembly.run_local``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from flexinfer.api.model import Model
from flexinfer.core.profiles import declared_parallel
from flexinfer.local.profiles import served_name
from flexinfer.runtime.ports import ModelView

PhaseLookup = Callable[[], Mapping[str, str]]
"""Returns the current phase per model key (``Idle`` for models it does not list)."""


def aliases(model: Model) -> tuple[str, ...]:
    """Client-facing names that route to ``model`` besides its own name."""
    litellm = model.spec.litellm
    if litellm is None:
        return ()
    names = [litellm.served_model_name] if litellm.served_model_name else []
    names += [a for a in litellm.aliases if a]
    return tuple(dict.fromkeys(n for n in names if n != model.name))


def view(model: Model, phase: str) -> ModelView:
    """The proxy's view of ``model``."""
    return ModelView(
        name=model.name, namespace=model.namespace, backend=model.backend, served_model_name=served_name(model),
        phase=phase, group=model.group, priority=model.priority, aliases=aliases(model),
        parked=model.spec.litellm is not None and not model.spec.litellm.enabled,
        metadata={"key": model.key}, parallel=declared_parallel(model),
    )


class ManifestCatalog:
    """Name/alias resolution over a fixed model list (see the module docstring)."""

    def __init__(self, models: Iterable[Model], phases: PhaseLookup | None = None) -> None:
        self._models: dict[str, Model] = {}
        self._names: dict[str, str] = {}
        self._phases = phases or dict
        self.replace(models)

    def replace(self, models: Iterable[Model]) -> None:
        """Use a new model list (names first, then aliases, so a model's own name always wins)."""
        self._models = {m.key: m for m in models}
        names: dict[str, str] = {}
        by_name: dict[str, list[str]] = {}
        for key, model in self._models.items():
            names[key] = key
            by_name.setdefault(model.name, []).append(key)
        names.update({name: keys[0] for name, keys in by_name.items() if len(keys) == 1})
        for key, model in self._models.items():
            for alias in aliases(model):
                names.setdefault(alias, key)
        self._names = names

    def key(self, name: str) -> str | None:
        """The model key a name or alias routes to."""
        return self._names.get(name)

    def model(self, name: str) -> Model | None:
        """The manifest a name or alias routes to."""
        key = self._names.get(name)
        return self._models.get(key) if key else None

    def resolve(self, name: str) -> ModelView | None:
        model = self.model(name)
        if model is None:
            return None
        return view(model, self._phases().get(model.key, "Idle"))

    def models(self) -> Sequence[ModelView]:
        phases = self._phases()
        return [view(m, phases.get(key, "Idle")) for key, m in self._models.items()]
