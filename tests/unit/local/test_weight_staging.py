"""Flash-loader staging in the local engine: when it applies, where weights go, and refusing on no space."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from flexinfer.api.model import Model
from flexinfer.core.errors import EngineError, InsufficientSpaceError
from flexinfer.local.engine import LocalEngine, LocalEngineSettings, flash_enabled
from support.local_processes import Stages, make_model, stub_command


class CopyStager:
    """A stager that copies for real (the flash-loader library is wired in by assembly)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Path, Path]] = []

    async def __call__(self, model: Model, src: Path, dst: Path) -> None:
        self.calls.append((model.key, src, dst))
        await asyncio.to_thread(copy_into, src, dst)


def copy_into(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)


def same_bytes(a: Path, b: Path) -> bool:
    return a.read_bytes() == b.read_bytes()


class FullStager:
    async def __call__(self, model: Model, src: Path, dst: Path) -> None:
        raise InsufficientSpaceError(needed=10_000, available=10, path=str(dst))


def test_flash_enabled_rule() -> None:
    assert not flash_enabled(make_model("a", "file:///w"))
    assert flash_enabled(make_model("a", "file:///w", cache={"flashLoader": {"enabled": True}}))
    assert not flash_enabled(make_model("a", "file:///w", cache={"flashLoader": {"enabled": False},
                                                                "strategy": "Local"}, gpu={"shared": "g"}))
    assert flash_enabled(make_model("a", "file:///w", cache={"strategy": "Local"}, gpu={"shared": "g"}))
    assert not flash_enabled(make_model("a", "file:///w", cache={"strategy": "Local"}))


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
