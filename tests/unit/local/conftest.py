"""Fixtures for the local-engine tests: a weights file, engine settings under tmp_path, an engine that is
always closed. Helpers live in ``support.local_processes``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flexinfer.local.engine import LocalEngine, LocalEngineSettings
from support.local_processes import TESTS_DIR


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "tiny.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + b"\0" * 60)
    return path


@pytest.fixture
def settings(tmp_path: Path) -> LocalEngineSettings:
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR)}
    return LocalEngineSettings(stop_grace=5.0, close_grace=1.0, start_timeout=20.0, log_dir=tmp_path / "logs",
                               shm_root=tmp_path / "shm", base_dir=tmp_path, env=env)


@pytest.fixture
async def engine(settings: LocalEngineSettings) -> AsyncIterator[LocalEngine]:
    engine = LocalEngine(settings)
    try:
        yield engine
    finally:
        await engine.aclose()
