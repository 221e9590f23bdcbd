"""Controller env defaults: ``DEFAULT_SHM_SIZE_LIMIT`` and ``DEFAULT_FLASH_LOADER_*`` parsing rules."""

from __future__ import annotations

import pytest

from flexinfer.core.controller_defaults import (
    ENV_VARS,
    FLEXINFER_IMAGE,
    backend_image_env_name,
    controller_defaults,
    flash_loader_defaults,
)


def test_empty_environment_gives_documented_defaults() -> None:
    defaults = controller_defaults({})
    assert defaults.shm_size_limit == "8Gi"
    flash = defaults.flash_loader
    assert (flash.enabled, flash.image, flash.concurrency, flash.buffer_size_kb) == (False, FLEXINFER_IMAGE, 4, 4096)
    assert (flash.verify_integrity, flash.exclude_patterns, flash.tmpfs_size_limit) == (False, "", None)


def test_default_flash_loader_image_is_the_flexinfer_image() -> None:
    import flexinfer

    assert f"ghcr.io/flexinfer/flexinfer:{flexinfer.__version__}" == FLEXINFER_IMAGE


@pytest.mark.parametrize(("word", "expected"), [
    ("1", True), ("true", True), ("YES", True), (" on ", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
    ("maybe", False), ("", False),
])
def test_enabled_bool_words(word: str, expected: bool) -> None:
    assert flash_loader_defaults({"DEFAULT_FLASH_LOADER_ENABLED": word}).enabled is expected
    assert flash_loader_defaults({"DEFAULT_FLASH_LOADER_VERIFY": word}).verify_integrity is expected


@pytest.mark.parametrize(("text", "expected"), [("8", 8), (" 16 ", 16), ("0", 4), ("-3", 4), ("four", 4), ("", 4)])
def test_concurrency_invalid_or_non_positive_uses_default(text: str, expected: int) -> None:
    assert flash_loader_defaults({"DEFAULT_FLASH_LOADER_CONCURRENCY": text}).concurrency == expected


@pytest.mark.parametrize(("text", "expected"), [("1024", 1024), ("0", 4096), ("big", 4096)])
def test_buffer_kb(text: str, expected: int) -> None:
    assert flash_loader_defaults({"DEFAULT_FLASH_LOADER_BUFFER_KB": text}).buffer_size_kb == expected


@pytest.mark.parametrize(("text", "expected"), [("16Gi", "16Gi"), ("", None), ("lots", None), ("2G", "2G")])
def test_tmpfs_size_limit_unparsable_is_unset(text: str, expected: str | None) -> None:
    assert flash_loader_defaults({"DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT": text}).tmpfs_size_limit == expected


@pytest.mark.parametrize(("text", "expected"), [("16Gi", "16Gi"), ("", "8Gi"), ("huge", "8Gi")])
def test_shm_size_limit(text: str, expected: str) -> None:
    assert controller_defaults({"DEFAULT_SHM_SIZE_LIMIT": text}).shm_size_limit == expected


def test_image_precedence_default_env_over_package_env_over_builtin() -> None:
    assert flash_loader_defaults({"FLEXINFER_FLASH_LOADER_IMAGE": "reg/fl:1"}).image == "reg/fl:1"
    both = {"FLEXINFER_FLASH_LOADER_IMAGE": "reg/fl:1", "DEFAULT_FLASH_LOADER_IMAGE": " reg/fl:2 "}
    assert flash_loader_defaults(both).image == "reg/fl:2"
    assert flash_loader_defaults({"DEFAULT_FLASH_LOADER_IMAGE": "  "}).image == FLEXINFER_IMAGE


def test_exclude_is_kept_as_text() -> None:
    assert flash_loader_defaults({"DEFAULT_FLASH_LOADER_EXCLUDE": " *.bin,onnx/ "}).exclude_patterns == "*.bin,onnx/"


def test_backend_image_overrides_only_for_named_backends() -> None:
    env = {"DEFAULT_VLLM_IMAGE": "my/vllm:1", "DEFAULT_MLC_LLM_IMAGE": "my/mlc:1", "DEFAULT_OLLAMA_IMAGE": ""}
    defaults = controller_defaults(env, ("vllm", "mlc-llm", "ollama"))
    assert dict(defaults.backend_images) == {"vllm": "my/vllm:1", "mlc-llm": "my/mlc:1"}
    assert backend_image_env_name("mlc-llm") == "DEFAULT_MLC_LLM_IMAGE"
    assert dict(controller_defaults({"DEFAULT_LLAMACPP_IMAGE": "my/llama"}).backend_images) == {"llamacpp": "my/llama"}


def test_env_table_names_every_variable_read() -> None:
    names = {s.name for s in ENV_VARS}
    assert {"DEFAULT_SHM_SIZE_LIMIT", "DEFAULT_FLASH_LOADER_ENABLED", "DEFAULT_FLASH_LOADER_IMAGE",
            "DEFAULT_FLASH_LOADER_CONCURRENCY", "DEFAULT_FLASH_LOADER_BUFFER_KB", "DEFAULT_FLASH_LOADER_VERIFY",
            "DEFAULT_FLASH_LOADER_EXCLUDE", "DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT",
            "FLEXINFER_FLASH_LOADER_IMAGE"} <= names
    assert all(s.description for s in ENV_VARS)
