"""Resource types (Model v1alpha2, ModelCache v1alpha1, GPULease v1alpha2), loading and validation.

The innermost layer: depends only on pydantic, PyYAML and the stdlib.
"""

from flexinfer.api.errors import FieldProblem, FlexInferError, InvalidResourceError
from flexinfer.api.gpulease import GPULease
from flexinfer.api.loading import Manifest, Resource, load_manifests, load_paths, parse_documents, parse_resource
from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache

__all__ = [
    "FieldProblem", "FlexInferError", "GPULease", "InvalidResourceError", "Manifest", "Model", "ModelCache",
    "Resource", "load_manifests", "load_paths", "parse_documents", "parse_resource",
]
