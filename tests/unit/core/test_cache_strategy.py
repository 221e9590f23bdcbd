"""Effective cache strategy and the persistent-volume rule."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.core.cache_strategy import (
    cache_pvc_name,
    effective_cache_strategy,
    local_cache_dir,
    pvc_source_parts,
    uses_persistent_volume,
)
from support.resource_builders import make_model


@pytest.mark.parametrize(("name", "spec", "strategy", "persistent"), [
    ("exclusive defaults to SharedPVC", {}, "SharedPVC", True),
    ("shared defaults to Memory", {"gpu": {"shared": "g"}}, "Memory", False),
    ("explicit Local wins for shared", {"gpu": {"shared": "g"}, "cache": {"strategy": "Local"}}, "Local", True),
    ("explicit Memory wins for exclusive", {"cache": {"strategy": "Memory"}}, "Memory", False),
    ("None is not persistent", {"cache": {"strategy": "None"}}, "None", False),
    ("cache block without strategy", {"cache": {"size": "10Gi"}}, "SharedPVC", True),
    ("pvc source is persistent even when shared", {"source": "pvc://claim/m", "gpu": {"shared": "g"}}, "Memory", True),
    ("pvc source with None", {"source": "pvc://claim", "cache": {"strategy": "None"}}, "None", True),
])
def test_strategy_and_persistence(name: str, spec: dict[str, Any], strategy: str, persistent: bool) -> None:
    model = make_model(**spec)
    assert effective_cache_strategy(model) == strategy, name
    assert uses_persistent_volume(model) is persistent, name


def test_pvc_source_parts() -> None:
    assert pvc_source_parts(make_model(source="pvc://weights/qwen/7b/")) == ("weights", "qwen/7b")
    assert pvc_source_parts(make_model(source="pvc://weights")) == ("weights", "")


def test_cache_pvc_name_and_local_dir() -> None:
    assert cache_pvc_name(make_model(name="a")) == "a-cache"
    assert cache_pvc_name(make_model(cache={"pvcName": "shared"})) == "shared"
    assert local_cache_dir(make_model(name="a", namespace="ml")) == "/var/lib/flexinfer/models/ml/a"
    assert local_cache_dir(make_model(name="a", cache={"hostPath": "/data/"})) == "/data/default/a"
