"""FLASH_* parsing: required paths, defaults, Go fallback rules, exclude merging, variants."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer.core.errors import ConfigError
from flexinfer.flashloader.config import ALWAYS_EXCLUDED, StageSettings, from_env, parse_exclude

BASE = {"FLASH_SRC": "/models/m", "FLASH_DST": "/dev/shm/m"}


def test_defaults_when_only_paths_given() -> None:
    request = from_env(BASE)
    assert request.src == Path("/models/m") and request.dst == Path("/dev/shm/m")
    settings = request.settings
    assert (settings.concurrency, settings.buffer_kb, settings.verify, settings.variant) == (4, 4096, False, None)
    assert settings.exclude == ALWAYS_EXCLUDED


@pytest.mark.parametrize("missing", ["FLASH_SRC", "FLASH_DST"])
def test_missing_required_path_names_variable_and_flag(missing: str) -> None:
    env = {**BASE, missing: "  "}
    with pytest.raises(ConfigError, match=rf"{missing} is required .*--{missing[6:].lower()}"):
        from_env(env)


def test_values_parsed() -> None:
    env = {**BASE, "FLASH_CONCURRENCY": "8", "FLASH_BUFFER_KB": "64", "FLASH_VERIFY": "Yes",
           "FLASH_EXCLUDE": " originals/, ,*.pt", "FLASH_VARIANT": "FP16"}
    settings = from_env(env).settings
    assert (settings.concurrency, settings.buffer_bytes, settings.verify, settings.variant) == (8, 65536, True, "fp16")
    assert settings.exclude == ("originals/", "*.pt", ".cache/", ".git/")


def test_the_rate_cap_is_bytes_per_second_from_a_quantity() -> None:
    assert from_env({**BASE, "FLASH_MAX_RATE": "2Mi"}).settings.max_rate == 2 * 1024 * 1024
    assert from_env(BASE).settings.max_rate == 0
    warnings: list[str] = []
    assert from_env({**BASE, "FLASH_MAX_RATE": "fast"}, warnings.append).settings.max_rate == 0
    assert warnings and warnings[0].startswith("FLASH_MAX_RATE='fast'")


@pytest.mark.parametrize("value", ["0", "-3", "many", "16 gigs"])
def test_bad_numbers_fall_back_to_defaults_with_a_warning_naming_them(value: str) -> None:
    warnings: list[str] = []
    settings = from_env({**BASE, "FLASH_CONCURRENCY": value, "FLASH_BUFFER_KB": value}, warnings.append).settings
    assert (settings.concurrency, settings.buffer_kb) == (4, 4096)
    assert [w.split("=")[0] for w in warnings] == ["FLASH_CONCURRENCY", "FLASH_BUFFER_KB"]
    assert f"={value!r}" in warnings[0] and "using the default 4" in warnings[0]


def test_empty_numbers_are_defaults_without_warning() -> None:
    warnings: list[str] = []
    settings = from_env({**BASE, "FLASH_CONCURRENCY": " ", "FLASH_VERIFY": ""}, warnings.append).settings
    assert (settings.concurrency, settings.verify, warnings) == (4, False, [])


def test_unparsable_verify_warns() -> None:
    warnings: list[str] = []
    assert from_env({**BASE, "FLASH_VERIFY": "maybe"}, warnings.append).settings.verify is False
    assert warnings and warnings[0].startswith("FLASH_VERIFY='maybe'")


def test_unknown_variant_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"FLASH_VARIANT.*bf16.*fp16"):
        from_env({**BASE, "FLASH_VARIANT": "bf16"})


def test_exclude_always_has_defaults_without_duplicates() -> None:
    assert parse_exclude(".git/,.git/") == (".git/", ".cache/")
    assert StageSettings(exclude=("x",)).exclude == ("x", ".cache/", ".git/")


@pytest.mark.parametrize("field", ["concurrency", "buffer_kb", "chunk_bytes"])
def test_direct_construction_rejects_non_positive(field: str) -> None:
    with pytest.raises(ConfigError):
        StageSettings(**{field: 0})
