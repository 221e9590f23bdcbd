"""A recording fake ``Engine`` (``flexinfer.runtime.ports.Engine``) for dispatcher and proxy tests.

Records every start/stop in order, can hold a start at a gate until the test opens it, can fail the next
start(s) of a model, reports the startup stages it passes (and, from ``memory``, the memory it measured once
Ready), and can crash a running server (``crash``).
``make_model`` builds a minimal Model and ``FakeClock`` is a clock the test advances by hand. Used by
tests/unit/runtime and any test that needs deterministic model lifecycles without processes.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.core.errors import EngineError
from flexinfer.runtime.ports import Endpoint, ServerReporter


@dataclass
class RecordingEngine:
    """``calls`` holds ``(action, model_key)`` with action ``start``/``ready``/``failed``/``cancelled``/``stop``/
    ``crash``."""

    stages: tuple[str, ...] = ("staging", "server_start", "health")
    base_url: str | None = None
    """The endpoint every started model reports (default: an address per model that nothing listens on)."""
    calls: list[tuple[str, str]] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    memory: dict[str, float] = field(default_factory=dict)
    """MiB reported as measured (``ServerReporter.measured``) when the model of that key becomes Ready."""
    _gates: dict[str, asyncio.Event] = field(default_factory=dict)
    _failures: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _reporters: dict[str, ServerReporter] = field(default_factory=dict)

    def hold(self, key: str) -> None:
        """Make the next starts of ``key`` wait until ``open(key)``."""
        self._gates[key] = asyncio.Event()

    def open(self, key: str) -> None:
        gate = self._gates.pop(key, None)
        if gate is not None:
            gate.set()

    def fail_next(self, key: str, message: str = "boom", times: int = 1) -> None:
        self._failures[key].extend([message] * times)

    async def start(self, model: Model, report: ServerReporter) -> Endpoint:
        key = model.key
        self._record("start", key)
        self._reporters[key] = report
        try:
            for stage in self.stages:
                report.stage(stage)
            gate = self._gates.get(key)
            if gate is not None:
                await gate.wait()
            if self._failures[key]:
                message = self._failures[key].pop(0)
                self._record("failed", key)
                raise EngineError(message)
        except asyncio.CancelledError:
            self._record("cancelled", key)
            raise
        self.running.add(key)
        if key in self.memory:
            report.measured(self.memory[key])
        self._record("ready", key)
        return Endpoint(self.base_url or f"http://fake.invalid/{model.name}")

    def crash(self, key: str, reason: str = "model server exited with code 137") -> None:
        """The running server of ``key`` exits on its own (an OOM kill, a crash): reported as its start's
        ``ServerReporter.exited``, as the local engine does."""
        self.running.discard(key)
        self._record("crash", key)
        self._reporters[key].exited(reason)

    async def stop(self, model: Model) -> None:
        self.running.discard(model.key)
        self._record("stop", model.key)

    def count(self, action: str, key: str) -> int:
        return self.calls.count((action, key))

    async def wait_call(self, action: str, key: str, times: int = 1, timeout: float = 5.0) -> None:
        """Wait (bounded) until ``(action, key)`` has been recorded ``times`` times."""
        async with asyncio.timeout(timeout):
            while self.count(action, key) < times:
                await self._changed.wait()

    def _record(self, action: str, key: str) -> None:
        self.calls.append((action, key))
        self._changed.set()
        self._changed = asyncio.Event()


def key(model: str) -> ModelKey:
    """``namespace/name`` as a model key; a bare test name means namespace ``default``."""
    return ModelKey.parse(model) or ModelKey("default", model)


def make_model(name: str, group: str | None = None, priority: int = 100, parallel: int = 64,
               **serverless: Any) -> Model:
    """A llama.cpp model; ``parallel`` is its server's capacity (``spec.config.parallel``: how many requests the
    arbiter grants at once), large by default so scenarios about swapping are not about the cap."""
    spec: dict[str, Any] = {"backend": "llamacpp", "source": f"file:///models/{name}.gguf",
                            "config": {"parallel": parallel}}
    if group is not None:
        spec["gpu"] = {"vendor": "amd", "shared": group, "priority": priority}
    if serverless:
        spec["serverless"] = serverless
    return Model.model_validate({"metadata": {"name": name}, "spec": spec})


class FakeClock:
    """A clock the test advances by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
