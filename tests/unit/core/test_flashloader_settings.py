"""Flash-loader precedence (spec §2.2): env defaults → matching ModelCache → Model, auto-enable, gate.

The table is ``support.flashloader_cases`` (the engine parity test in tests/unit/assembly uses it too).
"""

from __future__ import annotations

import pytest

from flexinfer.core.controller_defaults import ControllerDefaults, FlashLoaderDefaults, controller_defaults
from flexinfer.core.flashloader_settings import cache_matches_model, matching_model_cache, resolve_flash_loader
from support.flashloader_cases import CASES, Case, build_cache, case_model
from support.resource_builders import make_cache, make_model


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_precedence(case: Case) -> None:
    model = case_model(case)
    warnings: list[str] = []
    defaults = controller_defaults(case.env, warn=warnings.append)
    config = resolve_flash_loader(defaults, model, [build_cache(c) for c in case.caches])
    assert bool(warnings) is ("unparsable" in case.name)
    actual = {key: getattr(config, key) for key in case.expected}
    assert actual == case.expected


@pytest.mark.parametrize(("name", "defaults", "concurrency", "buffer"), [
    ("concurrency below 1 becomes 4", FlashLoaderDefaults(enabled=True, concurrency=0), 4, 4096),
    ("buffer below 32 KiB becomes 4096", FlashLoaderDefaults(enabled=True, buffer_size_kb=16), 4, 4096),
    ("valid values are kept", FlashLoaderDefaults(enabled=True, concurrency=2, buffer_size_kb=32), 2, 32),
])
def test_normalisation(name: str, defaults: FlashLoaderDefaults, concurrency: int, buffer: int) -> None:
    config = resolve_flash_loader(ControllerDefaults(flash_loader=defaults), make_model(), [])
    assert (config.concurrency, config.buffer_size_kb) == (concurrency, buffer), name


@pytest.mark.parametrize(("name", "model_source", "cache_name", "cache_source", "matches"), [
    ("same name", "HF://a/b", "m", "HF://x/y", True),
    ("<model>-cache name", "HF://a/b", "m-cache", "HF://x/y", True),
    ("HF source contained in cache source", "HF://a/b", "z", "huggingface://a/b", True),
    ("lower-case hf scheme also matches", "hf://a/b", "z", "HF://a/b", True),
    ("different HF source", "HF://a/b", "z", "HF://a/c", False),
    ("non-HF sources never match by source", "ollama://a:b", "z", "ollama://a:b", False),
    ("other name suffix", "HF://a/b", "m-cache-2", "HF://x/y", False),
])
def test_model_cache_match_rules(
    name: str, model_source: str, cache_name: str, cache_source: str, matches: bool,
) -> None:
    cache = make_cache(name=cache_name, source=cache_source, flash_loader={"enabled": True})
    assert cache_matches_model(cache, make_model(name="m", source=model_source)) is matches, name


def test_matching_model_cache_returns_none_without_candidates() -> None:
    assert matching_model_cache(make_model(name="m"), [make_cache(name="x")]) is None
