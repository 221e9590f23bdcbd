"""Cross-field validation rules that a Kubernetes 1.20 structural schema cannot express.

The Go CRD states these as CEL rules; here they run in the loader (CLI, local engine) and in the
operator before anything is rendered. Each problem names the field path.
"""

from __future__ import annotations

from flexinfer.api.errors import FieldProblem
from flexinfer.api.model import SOURCE_SCHEMES, Model
from flexinfer.api.units import parse_quantity

GPU_RESOURCE_KEYS = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915")


def model_problems(model: Model) -> list[FieldProblem]:
    """All rule violations of one Model (empty when valid)."""
    return [*_source_problems(model), *_gpu_problems(model), *_resource_problems(model), *_size_problems(model)]


def _source_problems(model: Model) -> list[FieldProblem]:
    source = model.spec.source
    if not source.startswith(SOURCE_SCHEMES):
        return [FieldProblem("spec.source", f"must start with one of {', '.join(SOURCE_SCHEMES)}, got {source!r}")]
    if source.split("://", 1)[1].strip("/") == "":
        return [FieldProblem("spec.source", f"names no model after the scheme: {source!r}")]
    strategy = model.spec.cache.strategy if model.spec.cache else None
    if source.startswith("pvc://") and strategy == "Memory":
        return [FieldProblem(
            "spec.cache.strategy",
            "must be SharedPVC, Local or None (or unset) for pvc:// sources, got Memory",
        )]
    return []


def _gpu_problems(model: Model) -> list[FieldProblem]:
    gpu = model.spec.gpu
    if gpu is None or gpu.vendor != "cpu":
        return []
    problems = []
    if gpu.count is not None:
        problems.append(FieldProblem("spec.gpu.count", "must not be set when spec.gpu.vendor is cpu"))
    if gpu.vram_estimate_mb is not None:
        problems.append(FieldProblem("spec.gpu.vramEstimateMB", "must not be set when spec.gpu.vendor is cpu"))
    if gpu.shared:
        problems.append(FieldProblem("spec.gpu.shared", "must be empty when spec.gpu.vendor is cpu"))
    return problems


def _resource_problems(model: Model) -> list[FieldProblem]:
    resources = model.spec.resources
    if resources is None:
        return []
    problems = []
    for section, values in (("limits", resources.limits), ("requests", resources.requests)):
        for key in values:
            if key in GPU_RESOURCE_KEYS:
                problems.append(FieldProblem(
                    f"spec.resources.{section}[{key}]", "GPU resources are set with spec.gpu.count, not here",
                ))
    return problems


def _size_problems(model: Model) -> list[FieldProblem]:
    """Sizes and resource amounts are never negative (the schema's quantity syntax allows a sign)."""
    cache = model.spec.cache
    sizes: list[tuple[str, str | None]] = []
    if cache is not None:
        sizes.append(("spec.cache.size", cache.size))
        if cache.flash_loader is not None:
            sizes.append(("spec.cache.flashLoader.tmpfsSizeLimit", cache.flash_loader.tmpfs_size_limit))
        if cache.compilation_cache is not None:
            sizes.append(("spec.cache.compilationCache.sizeLimit", cache.compilation_cache.size_limit))
    if model.spec.resources is not None:
        for section, values in (("limits", model.spec.resources.limits),
                                ("requests", model.spec.resources.requests)):
            sizes += [(f"spec.resources.{section}[{key}]", value) for key, value in values.items()]
    return [FieldProblem(path, f"must not be negative, got {value!r}")
            for path, value in sizes if value is not None and parse_quantity(value) < 0]
