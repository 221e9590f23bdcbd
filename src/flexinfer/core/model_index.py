"""How a client's model name becomes a ``ModelKey``: the one resolution rule of both engines' catalogs.

A request may name a model as (first match wins):

1. ``namespace/name``: always, for every declared Model;
2. its name, when exactly one declared Model has that name; a name several namespaces use is ambiguous
   (``AmbiguousModelError``, 409, listing the candidates), even if some other Model lists it as an alias;
3. ``spec.litellm.servedModelName`` or one of ``spec.litellm.aliases``; among several claimants the first in
   the order given wins (the local catalog passes manifest order, the cluster catalog oldest first).

Only the catalogs (``flexinfer.local.catalog``, ``flexinfer.cluster_proxy.catalog``) call this; everything after
them carries the key. Pure: built from a model list, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.core.errors import AmbiguousModelError


def aliases(model: Model) -> tuple[str, ...]:
    """Client-facing names routed to ``model`` besides its own: served model name, then aliases."""
    litellm = model.spec.litellm
    if litellm is None:
        return ()
    names = [litellm.served_model_name or "", *litellm.aliases]
    return tuple(dict.fromkeys(n for n in names if n and n != model.name))


@dataclass(frozen=True)
class ModelIndex:
    """Client names → keys for one model list (see the module docstring)."""

    names: Mapping[str, ModelKey]
    """Every key, every unique name and every alias that is neither a key nor a name."""
    ambiguous: Mapping[str, tuple[ModelKey, ...]]
    """Names that several namespaces use, with their keys (sorted)."""

    @classmethod
    def build(cls, models: Iterable[Model]) -> ModelIndex:
        """Index ``models``; their order decides between alias claimants."""
        ordered = list(models)
        by_name: dict[str, list[ModelKey]] = {}
        for model in ordered:
            by_name.setdefault(model.name, []).append(model.key)
        names: dict[str, ModelKey] = {m.key: m.key for m in ordered}
        for name, keys in by_name.items():
            if len(keys) == 1:
                names.setdefault(name, keys[0])
        ambiguous = {name: tuple(sorted(keys)) for name, keys in by_name.items() if len(keys) > 1}
        for model in ordered:
            for alias in aliases(model):
                if alias not in ambiguous:
                    names.setdefault(alias, model.key)
        return cls(names, ambiguous)

    def lookup(self, name: str) -> ModelKey | None:
        """The key ``name`` routes to; ``None`` when none does; ``AmbiguousModelError`` for a bare name that
        several namespaces use."""
        candidates = self.ambiguous.get(name)
        if candidates is not None:
            raise AmbiguousModelError(name, candidates)
        return self.names.get(name)


EMPTY = ModelIndex({}, {})
