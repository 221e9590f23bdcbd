"""GPU profiles (flexinfer.core.gpu_profiles): Go's GPUProfile fields read from FLEXINFER_GPU_PROFILES, bad values
named by entry and field, and which groups pack by memory (one architecture with multiModel) with which budget."""

from __future__ import annotations

import math
from typing import Any

import pytest

from flexinfer.api.model import Model
from flexinfer.core.errors import ConfigError
from flexinfer.core.gpu_profiles import GPUProfile, architecture, group_budget, parse_gpu_profiles
from flexinfer.manager.config import manager_config

GFX = '{"architecture": "gfx1100", "vendor": "amd", "vramMB": 24576, "features": {"multiModel": true}}'


def model(name: str, **spec: Any) -> Model:
    body = {"backend": "llamacpp", "source": "file:///m.gguf", "gpu": {"shared": "g"}, **spec}
    return Model.model_validate({"metadata": {"name": name, "namespace": "ns"}, "spec": body})


def test_go_field_names_are_read() -> None:
    text = f'[{GFX}, {{"architecture": "cpu", "vramMB": 0, "features": {{"multiModel": true}}}}, ' \
           '{"architecture": "nvidia", "vramMB": 8000}]'
    assert parse_gpu_profiles(text) == (GPUProfile("gfx1100", 24576, True, "amd"), GPUProfile("cpu", 0, True),
                                        GPUProfile("nvidia", 8000, False))
    assert parse_gpu_profiles("  ") == ()


@pytest.mark.parametrize(("text", "fragment"), [
    ("{not json", r"FLEXINFER_GPU_PROFILES: not JSON"),
    ('{"architecture": "gfx1100"}', r"expected a JSON list"),
    ('["gfx1100"]', r"FLEXINFER_GPU_PROFILES\[0\]: expected an object"),
    ('[{"vramMB": 1}]', r"\[0\]\.architecture: expected a non-empty string"),
    ('[{"architecture": "gfx1100", "vramMB": "24Gi"}]', r"\[0\]\.vramMB: expected an integer number of MiB"),
    ('[{"architecture": "gfx1100", "vramMB": true}]', r"\[0\]\.vramMB"),
    ('[{"architecture": "gfx1100", "vramMB": 1, "features": {"multiModel": "yes"}}]',
     r"\[0\]\.features\.multiModel: expected true or false"),
    ('[{"architecture": "gfx1100", "vramMB": 1, "vramGB": 1}]', r"\[0\]: unknown field 'vramGB'"),
    (f"[{GFX}, {GFX}]", r"architecture 'gfx1100' is given twice"),
])
def test_bad_profiles_name_the_entry_and_the_field(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_gpu_profiles(text)
    with pytest.raises(ConfigError, match="FLEXINFER_GPU_PROFILES"):
        manager_config({"FLEXINFER_GPU_PROFILES": text})


def test_the_manager_reads_the_profiles() -> None:
    assert manager_config({"FLEXINFER_GPU_PROFILES": f"[{GFX}]"}).policy.gpu_profiles == (
        GPUProfile("gfx1100", 24576, True, "amd"),)
    assert manager_config({}).policy.gpu_profiles == ()


def test_a_member_runs_on_its_runtime_profile_architecture() -> None:
    assert architecture(model("a")) == "gfx1100", "vendor auto without a node label: FlexInfer's first target"
    assert architecture(model("a", config={"runtimeProfile": "cpu"})) == "cpu"
    assert architecture(model("a", gpu={"shared": "g", "vendor": "nvidia"})) == "nvidia"
    assert architecture(model("a", config={"runtimeProfile": "tpu"})) is None


def test_a_group_packs_by_memory_only_on_one_multi_model_architecture() -> None:
    cpu = '{"architecture": "cpu", "vramMB": -1, "features": {"multiModel": true}}'
    profiles = parse_gpu_profiles(f'[{GFX}, {cpu}, {{"architecture": "nvidia", "vramMB": 8000}}]')
    assert group_budget(profiles, [model("a"), model("b")]) == 24576.0
    assert group_budget(profiles, [model("a", config={"runtimeProfile": "cpu"})]) == math.inf, "vramMB <= 0"
    assert group_budget(profiles, [model("a", gpu={"shared": "g", "vendor": "nvidia"})]) is None, "multiModel off"
    assert group_budget(profiles, [model("a"), model("b", config={"runtimeProfile": "cpu"})]) is None, "mixed"
    assert group_budget((), [model("a")]) is None and group_budget(profiles, []) is None
