"""Runtime profiles and backend defaults: selection rules and the compile cache."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.core.errors import ConfigError
from flexinfer.core.profiles import (
    BACKENDS,
    backend_defaults,
    compile_cache_host_dir,
    declared_parallel,
    effective_limit,
    parallel_requests,
    runtime_profile,
)
from support.resource_builders import make_model


@pytest.mark.parametrize(("name", "spec", "profile"), [
    ("no gpu block is cpu", {}, "cpu"),
    ("amd vendor is gfx1100", {"gpu": {"vendor": "amd"}}, "rocm-gfx1100"),
    ("nvidia vendor", {"gpu": {"vendor": "nvidia"}}, "nvidia"),
    ("cpu vendor", {"gpu": {"vendor": "cpu"}}, "cpu"),
    ("auto follows the vendor node label", {"gpu": {}, "nodeSelector": {"node.flexstack.io/gpu-vendor": "nvidia"}},
     "nvidia"),
    ("auto without a label is the first target", {"gpu": {}}, "rocm-gfx1100"),
    ("config names a profile explicitly", {"gpu": {"vendor": "amd"}, "config": {"runtimeProfile": "cpu"}}, "cpu"),
])
def test_profile_selection(name: str, spec: dict[str, Any], profile: str) -> None:
    assert runtime_profile(make_model(**spec)).name == profile, name


def test_unknown_profile_is_a_config_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"default/m: spec.config.runtimeProfile: unknown profile 'tpu'"):
        runtime_profile(make_model(name="m", config={"runtimeProfile": "tpu"}))


def test_rocm_profile_facts() -> None:
    rocm = runtime_profile(make_model(gpu={"vendor": "amd"}))
    assert rocm.gpu_resource == "amd.com/gpu" and rocm.supplemental_groups == (109, 992)
    assert dict(rocm.env) == {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}
    assert all(value.startswith("/cache/compile/") for _, value in rocm.compile_cache_env)
    assert {name for name, _ in rocm.compile_cache_env} == {
        "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR", "TRITON_CACHE_DIR"}


@pytest.mark.parametrize(("name", "spec", "expected"), [
    ("shared amd gets one", {"gpu": {"vendor": "amd", "shared": "g"}},
     "/var/lib/flexinfer/compile-cache/default/m"),
    ("shared auto gets one", {"gpu": {"shared": "g"}}, "/var/lib/flexinfer/compile-cache/default/m"),
    ("exclusive amd gets none by default", {"gpu": {"vendor": "amd"}}, None),
    ("explicit enable with own base", {"gpu": {"vendor": "amd"},
                                       "cache": {"compilationCache": {"enabled": True, "hostPath": "/k/"}}},
     "/k/default/m"),
    ("explicit disable wins", {"gpu": {"vendor": "amd", "shared": "g"},
                               "cache": {"compilationCache": {"enabled": False}}}, None),
    ("cpu never", {"cache": {"compilationCache": {"enabled": True}}}, None),
])
def test_compile_cache(name: str, spec: dict[str, Any], expected: str | None) -> None:
    model = make_model(name="m", **spec)
    assert compile_cache_host_dir(model, runtime_profile(model)) == expected, name


@pytest.mark.parametrize(("backend", "port"), [
    ("vllm", 8000), ("llamacpp", 8080), ("llama.cpp", 8080), ("ollama", 11434), ("mlc", 8000), ("comfyui", 8188),
])
def test_backend_ports_follow_aliases(backend: str, port: int) -> None:
    assert backend_defaults(make_model(backend=backend)).port == port


def test_every_backend_has_an_image_per_profile_flavour() -> None:
    for backend in BACKENDS.values():
        assert set(backend.images) == {"rocm", "cuda", "cpu"}, backend.name
        assert backend.readiness_path.startswith("/") and backend.startup_path.startswith("/")


@pytest.mark.parametrize(("backend", "config", "parallel"), [
    ("llamacpp", {}, 1),  # one slot unless configured
    ("llamacpp", {"parallel": 4}, 4),
    ("llamacpp", {"args": ["--parallel=3"]}, 3),
    ("llamacpp", {"command": ["my-server"]}, None),  # a custom server: capacity unknown, no cap
    ("llamacpp", {"command": ["my-server"], "parallel": 2}, 2),
    ("vllm", {}, None),
    ("vllm", {"args": ["--max-num-seqs", "64"]}, 64),
    ("ollama", {}, None),
])
def test_parallel_requests(backend: str, config: dict[str, Any], parallel: int | None) -> None:
    model = make_model(backend=backend, config=config)
    assert parallel_requests(model) == parallel == declared_parallel(model)


def test_invalid_parallel_falls_back_to_the_backend_default_for_the_proxy() -> None:
    model = make_model(backend="llamacpp", config={"parallel": True})
    with pytest.raises(ConfigError, match=r"spec\.config\.parallel"):
        parallel_requests(model)
    assert declared_parallel(model) == 1


@pytest.mark.parametrize(("proxy", "parallel", "limit"), [(0, None, 0), (0, 1, 1), (8, None, 8), (8, 2, 2), (1, 4, 1)])
def test_effective_limit_is_the_smaller_set_one(proxy: int, parallel: int | None, limit: int) -> None:
    assert effective_limit(proxy, parallel) == limit
