"""Cross-field rules of ``flexinfer.api.rules`` (the Go CRD's CEL rules), each named by field path."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.api import InvalidResourceError, parse_resource
from flexinfer.api.rules import model_problems
from support.resource_builders import make_model, model_doc


def problems(**spec: Any) -> list[str]:
    with pytest.raises(InvalidResourceError) as info:
        parse_resource(model_doc(**spec))
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize("source", ["s3://bucket/m", "org/model", "HTTP://x"])
def test_source_needs_a_known_scheme(source: str) -> None:
    [problem] = problems(source=source)
    assert problem.startswith("spec.source: must start with one of HF://")


def test_source_must_name_something_after_the_scheme() -> None:
    assert problems(source="pvc://") == ["spec.source: names no model after the scheme: 'pvc://'"]


@pytest.mark.parametrize("strategy", ["Memory"])
def test_pvc_source_forbids_memory_strategy(strategy: str) -> None:
    [problem] = problems(source="pvc://claim/sub", cache={"strategy": strategy})
    assert problem == "spec.cache.strategy: must be SharedPVC, Local or None (or unset) for pvc:// sources, got Memory"


@pytest.mark.parametrize("strategy", [None, "SharedPVC", "Local", "None"])
def test_pvc_source_allows_other_strategies(strategy: str | None) -> None:
    cache = {"strategy": strategy} if strategy else {}
    assert model_problems(make_model(source="pvc://claim/sub", cache=cache)) == []


def test_cpu_vendor_forbids_count_vram_and_shared() -> None:
    assert problems(gpu={"vendor": "cpu", "count": 1, "vramEstimateMB": 10, "shared": "g"}) == [
        "spec.gpu.count: must not be set when spec.gpu.vendor is cpu",
        "spec.gpu.vramEstimateMB: must not be set when spec.gpu.vendor is cpu",
        "spec.gpu.shared: must be empty when spec.gpu.vendor is cpu",
    ]


def test_gpu_vendor_allows_count_vram_and_shared() -> None:
    model = make_model(gpu={"vendor": "amd", "count": 2, "vramEstimateMB": 10, "shared": "g"})
    assert model_problems(model) == []


@pytest.mark.parametrize("key", ["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915"])
def test_gpu_keys_in_resources_are_rejected(key: str) -> None:
    assert problems(resources={"limits": {key: "1"}, "requests": {key: "1"}}) == [
        f"spec.resources.limits[{key}]: GPU resources are set with spec.gpu.count, not here",
        f"spec.resources.requests[{key}]: GPU resources are set with spec.gpu.count, not here",
    ]


def test_ordinary_resources_are_fine() -> None:
    assert model_problems(make_model(resources={"limits": {"cpu": "2", "memory": "4Gi"}})) == []


@pytest.mark.parametrize(("spec", "expected"), [
    ({"gpu": {"priority": 5000}}, "spec.gpu.priority: must be ≤ 1000, got 5000"),
    ({"gpu": {"priority": -1}}, "spec.gpu.priority: must be ≥ 0, got -1"),
    ({"gpu": {"count": 9}}, "spec.gpu.count: must be ≤ 8, got 9"),
    ({"serverless": {"minReplicas": 11}}, "spec.serverless.minReplicas: must be ≤ 10, got 11"),
    ({"cache": {"flashLoader": {"concurrency": 33}}}, "spec.cache.flashLoader.concurrency: must be ≤ 32, got 33"),
    ({"cache": {"flashLoader": {"bufferSizeKB": 16}}}, "spec.cache.flashLoader.bufferSizeKB: must be ≥ 32, got 16"),
    ({"serviceLabels": [str(i) for i in range(11)]}, "spec.serviceLabels: must have at most 10 items"),
    ({"gpu": {"shared": "Bad_Name"}}, "spec.gpu.shared: must match ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$, got 'Bad_Name'"),
    ({"serverless": {"idleTimeout": "soon"}},
     "spec.serverless.idleTimeout: invalid duration 'soon' (use e.g. 90s, 5m, 1h30m)"),
])
def test_field_bounds_have_path_and_message(spec: dict[str, Any], expected: str) -> None:
    assert problems(**spec) == [expected]


def test_vendor_defaults_and_cpu_without_gpu_block() -> None:
    assert make_model().gpu_vendor == "cpu" and make_model().gpu_count == 0
    gpu = make_model(gpu={"shared": "g"})
    assert (gpu.gpu_vendor, gpu.gpu_count, gpu.priority, gpu.group) == ("auto", 1, 100, "g")
