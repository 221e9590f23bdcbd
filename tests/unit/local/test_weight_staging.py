"""Flash-loader staging in the local engine: when it applies (the cluster's resolution: environment defaults,
a matching ModelCache, the Model), the settings the stager gets, where weights go, and refusing on no space."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from flexinfer.api.model import Model
from flexinfer.core.controller_defaults import FlashLoaderDefaults
from flexinfer.core.errors import EngineError, InsufficientSpaceError
from flexinfer.core.flashloader_settings import FlashLoaderConfig
from flexinfer.local.engine import LocalEngine, LocalEngineSettings
from flexinfer.local.flash_settings import FlashSettings
from support.local_processes import Stages, make_model, stub_command
from support.resource_builders import make_cache


class CopyStager:
    """A stager that copies for real (the flash-loader library is wired in by assembly)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Path, Path]] = []
        self.configs: list[FlashLoaderConfig] = []

    async def __call__(self, model: Model, src: Path, dst: Path, config: FlashLoaderConfig) -> None:
        self.calls.append((model.key, src, dst))
        self.configs.append(config)
        await asyncio.to_thread(copy_into, src, dst)


def copy_into(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)


def same_bytes(a: Path, b: Path) -> bool:
    return a.read_bytes() == b.read_bytes()


class FullStager:
    async def __call__(self, model: Model, src: Path, dst: Path, config: FlashLoaderConfig) -> None:
        raise InsufficientSpaceError(needed=10_000, available=10, path=str(dst))


async def start_staged(settings: LocalEngineSettings, model: Model, flash: FlashSettings) -> CopyStager:
    stager = CopyStager()
    engine = LocalEngine(settings, stager=stager, flash=flash)
    try:
        await engine.start(model, Stages())
    finally:
        await engine.aclose()
    return stager


async def test_a_matching_model_cache_decides_staging_and_its_settings(settings: LocalEngineSettings,
                                                                      weights: Path) -> None:
    model = make_model("cached", weights.as_uri(), {"command": stub_command()})
    assert (await start_staged(settings, model, FlashSettings())).calls == [], "off without any layer enabling it"
    cache = make_cache("cached-cache", flash_loader={"enabled": True, "concurrency": 7, "tmpfsSizeLimit": "2Gi"})
    stager = await start_staged(settings, model, FlashSettings(caches=(cache,)))
    assert [(c.enabled, c.concurrency, c.tmpfs_size_limit) for c in stager.configs] == [(True, 7, "2Gi")]


async def test_environment_defaults_enable_staging_and_the_model_overrides(settings: LocalEngineSettings,
                                                                           weights: Path) -> None:
    flash = FlashSettings(FlashLoaderDefaults(enabled=True, concurrency=2))
    plain = make_model("plain", weights.as_uri(), {"command": stub_command()})
    assert [c.concurrency for c in (await start_staged(settings, plain, flash)).configs] == [2]
    off = make_model("off", weights.as_uri(), {"command": stub_command()}, cache={"flashLoader": {"enabled": False}})
    assert (await start_staged(settings, off, flash)).calls == []


async def test_server_starts_on_the_staged_copy(settings: LocalEngineSettings, weights: Path) -> None:
    stager = CopyStager()
    engine = LocalEngine(settings, stager=stager)
    model = make_model("staged", weights.as_uri(), {"command": stub_command()},
                       cache={"flashLoader": {"enabled": True}})
    stages = Stages()
    try:
        await engine.start(model, stages)
    finally:
        await engine.aclose()
    staged = settings.shm_root / "default" / "staged" / weights.name
    assert stager.calls == [("default/staged", weights.parent, staged.parent)]
    assert same_bytes(staged, weights)
    assert stages.seen == ["staging", "server_start", "health"]
    assert any(f"--model {staged}" in line for line in engine.logs.tail(model.key) or [])


async def test_insufficient_space_refuses_to_start(settings: LocalEngineSettings, weights: Path) -> None:
    engine = LocalEngine(settings, stager=FullStager())
    model = make_model("full", weights.as_uri(), {"command": stub_command()}, cache={"flashLoader": {"enabled": True}})
    try:
        with pytest.raises(EngineError, match=r"refusing to start.*insufficient tmpfs space"):
            await engine.start(model, Stages())
        assert engine.child_pids == []
    finally:
        await engine.aclose()


async def test_enabled_without_stager_is_an_error(engine: LocalEngine, weights: Path) -> None:
    model = make_model("nostager", weights.as_uri(), {"command": stub_command()},
                       cache={"flashLoader": {"enabled": True}})
    with pytest.raises(EngineError, match="no stager"):
        await engine.start(model, Stages())
