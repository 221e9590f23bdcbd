"""``GET /v1/models`` and ``GET /v1/models/{id}``: the catalog as OpenAI model objects, with FlexInfer state in
``metadata``.

A model's ``id`` is what a client sends to reach it: its name, or ``namespace/name`` when several namespaces
have a Model of that name (the bare name is then ambiguous, 409). ``metadata.key`` is always
``namespace/name``. Parked models are hidden (requests to them get 404 too) but still count when deciding
whether a name is shared. A retrieved model (``GET /v1/models/{id}``) is its entry in the list, so both
always agree on ids. Called by ``app.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from flexinfer.runtime.ports import Catalog, ModelView


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


def model_entry_for(model_id: str, catalog: Catalog) -> dict[str, object] | None:
    """``GET /v1/models/{id}``: the ``model_list`` entry whose ``id`` is ``model_id``, else the entry of the model
    ``model_id`` resolves to (an alias, a served name or ``namespace/name``); ``None`` when there is none or it is
    parked. An ambiguous bare name raises the catalog's ``AmbiguousModelError`` (409)."""
    listed: list[dict[str, object]] = model_list(catalog.models())["data"]  # type: ignore[assignment]
    for entry in listed:
        if entry["id"] == model_id:
            return entry
    view = catalog.resolve(model_id)
    if view is None:
        return None
    return next((e for e in listed if _metadata_key(e) == view.key), None)


def _metadata_key(entry: dict[str, object]) -> object:
    metadata = entry.get("metadata")
    return metadata.get("key") if isinstance(metadata, dict) else None
