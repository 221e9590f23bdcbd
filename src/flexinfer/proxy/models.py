"""``GET /v1/models``: the catalog as an OpenAI model list, with FlexInfer state in ``metadata``.

A model's ``id`` is what a client sends to reach it: its name, or ``namespace/name`` when several namespaces
have a Model of that name (the bare name is then ambiguous, 409). ``metadata.key`` is always
``namespace/name``. Parked models are hidden (requests to them get 404 too) but still count when deciding
whether a name is shared. Called by ``app.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from flexinfer.runtime.ports import ModelView


def model_entry(view: ModelView, shared_name: bool = False) -> dict[str, object]:
    """One OpenAI model object; ``shared_name``: another namespace has a model of the same name."""
    metadata: dict[str, object] = {
        "backend": view.backend,
        "phase": view.phase,
        "group": view.group,
        "priority": view.priority,
        "served_model_name": view.served_model_name,
        "aliases": list(view.aliases),
        "namespace": view.namespace,
        "key": str(view.key),
    }
    metadata.update(view.metadata)
    return {
        "id": str(view.key) if shared_name else view.name,
        "object": "model",
        "created": int(view.created),
        "owned_by": "flexinfer",
        "metadata": metadata,
    }


def model_list(views: Sequence[ModelView]) -> dict[str, object]:
    """The ``{"object": "list", "data": [...]}`` body, sorted by id."""
    uses = Counter(v.name for v in views)
    entries = [model_entry(v, uses[v.name] > 1) for v in views if not v.parked]
    return {"object": "list", "data": sorted(entries, key=lambda e: str(e["id"]))}
