"""Helpers for the local-engine tests: Model builders, model-server commands (the scripted fake OpenAI server
and the process-fault stub in tests/unit/local), a liveness check for process ids, and a stage recorder."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from flexinfer.api.model import Model

TESTS_DIR = Path(__file__).resolve().parents[1]
STUB = TESTS_DIR / "unit" / "local" / "stub_server.py"


def fake_openai_command(*extra: str) -> list[str]:
    """``spec.config.command`` running ``support.fake_openai`` on the engine's port."""
    return [sys.executable, "-m", "support.fake_openai", "--port", "{port}", *extra]


def stub_command(*extra: str) -> list[str]:
    """``spec.config.command`` running the process-fault stub on the engine's port."""
    return [sys.executable, str(STUB), "--port", "{port}", "--model", "{model_path}", *extra]


def make_model(name: str, source: str, config: dict[str, Any] | None = None, **spec: Any) -> Model:
    """A Model with the given source/config (backend llamacpp unless ``spec`` says otherwise)."""
    body: dict[str, Any] = {"backend": "llamacpp", "source": source, "config": config or {}, **spec}
    return Model.model_validate({"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
                                 "metadata": {"name": name, "namespace": "default"}, "spec": body})


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


class Stages:
    """A ``ServerReporter`` that records the stages, memory measurements and exits it was told."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.memory: list[float] = []
        self.exits: list[str] = []
        self.exited_event = asyncio.Event()

    def stage(self, stage: str) -> None:
        self.seen.append(stage)

    def measured(self, mib: float) -> None:
        self.memory.append(mib)

    def exited(self, reason: str) -> None:
        self.exits.append(reason)
        self.exited_event.set()
