"""Controller env defaults: ``DEFAULT_SHM_SIZE_LIMIT`` and ``DEFAULT_FLASH_LOADER_*`` parsing rules. Unparsable
values keep the Go fallback but are reported to the ``warn`` sink by name; without a sink they are errors."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.core.controller_defaults import (
    ENV_VARS,
    FLASH_LOADER_ENV_VARS,
    FLEXINFER_IMAGE,
    backend_image_env_name,
    controller_defaults,
    flash_loader_defaults,
)
from flexinfer.core.errors import ConfigError


def test_empty_environment_gives_documented_defaults() -> None:
    defaults = controller_defaults({})
    assert defaults.shm_size_limit == "8Gi"
    flash = defaults.flash_loader
    assert (flash.enabled, flash.image, flash.concurrency, flash.buffer_size_kb) == (False, FLEXINFER_IMAGE, 4, 4096)
    assert (flash.verify_integrity, flash.exclude_patterns, flash.tmpfs_size_limit) == (False, "", None)


def test_default_flash_loader_image_is_the_flexinfer_image() -> None:
    import flexinfer

    assert f"ghcr.io/flexinfer/flexinfer:{flexinfer.__version__}" == FLEXINFER_IMAGE


def flash(name: str, text: str) -> tuple[Any, list[str]]:
    """The flash-loader defaults for one variable, with the warnings it produced."""
    warnings: list[str] = []
    return flash_loader_defaults({name: text}, warn=warnings.append), warnings


@pytest.mark.parametrize(("word", "expected"), [
    ("1", True), ("true", True), ("YES", True), (" on ", True),
    ("0", False), ("false", False), ("No", False), ("off", False), ("", False),
])
def test_enabled_bool_words(word: str, expected: bool) -> None:
    assert flash_loader_defaults({"DEFAULT_FLASH_LOADER_ENABLED": word}).enabled is expected
    assert flash_loader_defaults({"DEFAULT_FLASH_LOADER_VERIFY": word}).verify_integrity is expected


@pytest.mark.parametrize("name", ["DEFAULT_FLASH_LOADER_ENABLED", "DEFAULT_FLASH_LOADER_VERIFY"])
def test_unparsable_bool_keeps_default_and_warns(name: str) -> None:
    defaults, warnings = flash(name, "maybe")
    assert (defaults.enabled, defaults.verify_integrity) == (False, False)
    assert warnings == [f"{name}='maybe' is not a boolean (use 1/true/yes/on or 0/false/no/off); "
                        "using the default False"]


@pytest.mark.parametrize(("text", "expected"), [("8", 8), (" 16 ", 16), ("", 4)])
def test_concurrency(text: str, expected: int) -> None:
    defaults, warnings = flash("DEFAULT_FLASH_LOADER_CONCURRENCY", text)
    assert (defaults.concurrency, warnings) == (expected, [])


@pytest.mark.parametrize("text", ["0", "-5", "abc", "16 gigs"])
def test_concurrency_invalid_or_non_positive_uses_default_with_a_warning(text: str) -> None:
    defaults, warnings = flash("DEFAULT_FLASH_LOADER_CONCURRENCY", text)
    assert defaults.concurrency == 4
    assert len(warnings) == 1 and warnings[0].startswith(f"DEFAULT_FLASH_LOADER_CONCURRENCY={text!r} is ")
    assert warnings[0].endswith("using the default 4")


@pytest.mark.parametrize(("text", "expected", "warned"), [("1024", 1024, False), ("0", 4096, True),
                                                          ("big", 4096, True)])
def test_buffer_kb(text: str, expected: int, warned: bool) -> None:
    defaults, warnings = flash("DEFAULT_FLASH_LOADER_BUFFER_KB", text)
    assert (defaults.buffer_size_kb, bool(warnings)) == (expected, warned)


@pytest.mark.parametrize(("text", "expected", "warned"), [
    ("16Gi", "16Gi", False), ("", None, False), ("lots", None, True), ("2G", "2G", False), ("16 gigs", None, True),
    ("-1Gi", None, True),
])
def test_tmpfs_size_limit_unparsable_is_unset_with_a_warning(text: str, expected: str | None, warned: bool) -> None:
    defaults, warnings = flash("DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT", text)
    assert (defaults.tmpfs_size_limit, bool(warnings)) == (expected, warned)
    if warned:
        assert warnings[0].endswith("using the default (unset)")


@pytest.mark.parametrize(("text", "expected", "warned"), [("16Gi", "16Gi", False), ("", "8Gi", False),
                                                          ("huge", "8Gi", True), ("8Gigs", "8Gi", True)])
def test_shm_size_limit(text: str, expected: str, warned: bool) -> None:
    warnings: list[str] = []
    assert controller_defaults({"DEFAULT_SHM_SIZE_LIMIT": text}, warn=warnings.append).shm_size_limit == expected
    assert bool(warnings) is warned
    if warned:
        assert warnings == [f"DEFAULT_SHM_SIZE_LIMIT={text!r} is not a Kubernetes quantity (use e.g. 8Gi, 512Mi, 2G); "
                            "using the default '8Gi'"]


@pytest.mark.parametrize(("name", "text"), [("DEFAULT_SHM_SIZE_LIMIT", "8Gigs"),
                                             ("DEFAULT_FLASH_LOADER_CONCURRENCY", "-5")])
def test_without_a_warning_sink_unparsable_values_are_errors(name: str, text: str) -> None:
    with pytest.raises(ConfigError, match=name):
        controller_defaults({name: text})


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
    names = {s.name for s in (*ENV_VARS, *FLASH_LOADER_ENV_VARS)}
    assert {"DEFAULT_SHM_SIZE_LIMIT", "DEFAULT_FLASH_LOADER_ENABLED", "DEFAULT_FLASH_LOADER_IMAGE",
            "DEFAULT_FLASH_LOADER_CONCURRENCY", "DEFAULT_FLASH_LOADER_BUFFER_KB", "DEFAULT_FLASH_LOADER_VERIFY",
            "DEFAULT_FLASH_LOADER_EXCLUDE", "DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT",
            "FLEXINFER_FLASH_LOADER_IMAGE"} <= names
    assert all(s.description for s in (*ENV_VARS, *FLASH_LOADER_ENV_VARS))
