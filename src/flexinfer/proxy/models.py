"""``GET /v1/models`` and ``GET /v1/models/{id}``: the catalog as OpenAI model objects, with FlexInfer state in
``metadata``.

Parked models are hidden (requests to them get 404 too). A retrieved model is its entry in the list (so both
always agree on ids). Called by ``app.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from flexinfer.runtime.ports import Catalog, ModelView


def model_entry(view: ModelView) -> dict[str, object]:
    """One OpenAI model object."""
    metadata: dict[str, object] = {
        "backend": view.backend,
        "phase": view.phase,
        "group": view.group,
        "priority": view.priority,
        "served_model_name": view.served_model_name,
        "aliases": list(view.aliases),
        "namespace": view.namespace,
    }
    metadata.update(view.metadata)
    return {
        "id": view.name,
        "object": "model",
        "created": int(view.created),
        "owned_by": "flexinfer",
        "metadata": metadata,
    }


def model_list(views: Sequence[ModelView]) -> dict[str, object]:
    """The ``{"object": "list", "data": [...]}`` body, sorted by name."""
    visible = sorted((v for v in views if not v.parked), key=lambda v: v.name)
    return {"object": "list", "data": [model_entry(v) for v in visible]}


def model_entry_for(model_id: str, catalog: Catalog) -> dict[str, object] | None:
    """``GET /v1/models/{id}``: the ``model_list`` entry whose ``id`` is ``model_id``, else the entry of the model
    ``model_id`` resolves to (an alias or another accepted spelling); ``None`` when there is none or it is parked."""
    listed: list[dict[str, object]] = model_list(catalog.models())["data"]  # type: ignore[assignment]
    for entry in listed:
        if entry["id"] == model_id:
            return entry
    view = catalog.resolve(model_id)
    if view is None:
        return None
    resolved: list[dict[str, object]] = model_list([view])["data"]  # type: ignore[assignment]
    return resolved[0] if resolved else None
