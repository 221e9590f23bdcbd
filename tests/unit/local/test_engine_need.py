"""LocalEngine reports a Ready server's memory need through its ``ServerReporter``: llama.cpp's own buffer
figures from its log (the real ``llama-server``), else the resident memory of its process group."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from flexinfer.core.server_memory import parse_memory
from flexinfer.local.engine import LocalEngine, LocalEngineSettings
from support.llama_server import TINY_ARGS, needs_llama_server
from support.local_processes import Stages, fake_openai_command, make_model
from support.polling import eventually
from support.tiny_gguf import write_tiny_gguf


async def test_a_server_without_buffer_lines_reports_its_resident_memory(
        settings: LocalEngineSettings, weights: Path) -> None:
    engine = LocalEngine(dataclasses.replace(settings, need_wait=0.2))
    try:
        stages = Stages()
        await engine.start(make_model("fake", weights.as_uri(), {"command": fake_openai_command()}), stages)
        await eventually(lambda: bool(stages.memory), timeout=10)
        assert 5 < stages.memory[0] < 1000  # a Python process: MiB, not bytes or pages
    finally:
        await engine.aclose()


@needs_llama_server
async def test_llama_server_reports_the_buffers_its_log_shows(settings: LocalEngineSettings, tmp_path: Path) -> None:
    engine = LocalEngine(settings)
    try:
        stages = Stages()
        source = write_tiny_gguf(tmp_path / "w" / "tiny.gguf")
        model = make_model("tiny", source.as_uri(), {"args": TINY_ARGS})
        await engine.start(model, stages)
        await eventually(lambda: bool(stages.memory), timeout=10)
        logged = parse_memory(engine.logs.tail(model.key) or [])
        assert logged is not None and logged.complete and stages.memory == [logged.total_mib]
    finally:
        await engine.aclose()
