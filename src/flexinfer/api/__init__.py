"""Resource types (Model v1alpha2, ModelCache v1alpha1, GPULease v1alpha2), loading and validation.

The innermost layer: depends only on pydantic, PyYAML and the stdlib.

The names below are re-exported lazily (PEP 562): importing ``flexinfer.api.errors`` or
``flexinfer.api.units`` (the CLI's argument parsing, the flash-loader init container) must not build every
pydantic model first; ``from flexinfer.api import Model`` imports ``flexinfer.api.model`` on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flexinfer.api.errors import FieldProblem, FlexInferError, InvalidResourceError
    from flexinfer.api.gpulease import GPULease
    from flexinfer.api.loading import Manifest, Resource, load_manifests, load_paths, parse_documents, parse_resource
    from flexinfer.api.model import Model
    from flexinfer.api.modelcache import ModelCache

_SOURCES = {
    "FieldProblem": "errors", "FlexInferError": "errors", "InvalidResourceError": "errors",
    "GPULease": "gpulease", "Manifest": "loading", "Resource": "loading", "load_manifests": "loading",
    "load_paths": "loading", "parse_documents": "loading", "parse_resource": "loading", "Model": "model",
    "ModelCache": "modelcache",
}

__all__ = [
    "FieldProblem", "FlexInferError", "GPULease", "InvalidResourceError", "Manifest", "Model", "ModelCache",
    "Resource", "load_manifests", "load_paths", "parse_documents", "parse_resource",
]


def __getattr__(name: str) -> object:
    """Import the submodule that defines ``name`` on first access (``AttributeError`` for anything else)."""
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
