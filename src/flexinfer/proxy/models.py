"""``GET /v1/models``: the catalog as an OpenAI model list, with FlexInfer state in ``metadata``.

Parked models are hidden (requests to them get 404 too). Called by ``app.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from flexinfer.runtime.ports import ModelView


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
