"""Builders for Model / ModelCache resources in unit tests.

``make_model(spec_overrides...)`` returns a validated ``Model`` so tests state only what matters.
"""

from __future__ import annotations

from typing import Any

from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache


def model_doc(name: str = "m", namespace: str = "default", uid: str | None = None, **spec: Any) -> dict[str, Any]:
    """A Model document; ``spec`` keys are camelCase YAML keys (default backend vllm, an HF source)."""
    body: dict[str, Any] = {"backend": "vllm", "source": "HF://org/model"}
    body.update(spec)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        metadata["uid"] = uid
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": metadata, "spec": body}


def make_model(name: str = "m", namespace: str = "default", uid: str | None = None, **spec: Any) -> Model:
    return Model.model_validate(model_doc(name, namespace, uid, **spec))


def make_cache(name: str = "c", namespace: str = "default", source: str = "HF://org/other",
               flash_loader: dict[str, Any] | None = None) -> ModelCache:
    spec: dict[str, Any] = {"source": source}
    if flash_loader is not None:
        spec["flashLoader"] = flash_loader
    return ModelCache.model_validate({
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": name, "namespace": namespace}, "spec": spec,
    })
