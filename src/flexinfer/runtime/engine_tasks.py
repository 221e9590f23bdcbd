"""Child tasks that run the slow engine calls for the dispatcher and post completion events back.

``EngineTasks.start``/``stop`` are called by ``flexinfer.runtime.dispatcher`` while it executes
``StartModel``/``StopModel`` effects. A stop cancels a start still in progress (the Engine contract: a
cancelled ``start`` leaves nothing running) and then calls ``engine.stop``; exactly one completion event
is posted per call: ``ModelReady``/``ModelStartFailed`` for a start that was not cancelled, ``ModelStopped``
for every stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.core.arbiter.events import (
    Event,
    MemoryNeedReported,
    ModelCrashed,
    ModelReady,
    ModelStartFailed,
    ModelStopped,
    StageReached,
)
from flexinfer.runtime.ports import Endpoint, Engine, ServerReporter, Stage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Reporter:
    """The ``ServerReporter`` of one start: stages become ``StageReached``, a measurement
    ``MemoryNeedReported``, an exit ``ModelCrashed``."""

    key: ModelKey
    post: Callable[[Event], None]

    def stage(self, stage: Stage) -> None:
        self.post(StageReached(self.key, stage))

    def measured(self, mib: float) -> None:
        self.post(MemoryNeedReported(self.key, mib, "measured"))

    def exited(self, reason: str) -> None:
        self.post(ModelCrashed(self.key, reason))


class EngineTasks:
    """Owns the start/stop tasks, one start and one stop at most per model."""

    def __init__(self, engine: Engine, post: Callable[[Event], None]) -> None:
        self._engine, self._post = engine, post
        self._starts: dict[str, asyncio.Task[None]] = {}
        self._stops: dict[str, asyncio.Task[None]] = {}

    def start(self, model: Model) -> None:
        key = model.key
        report = _Reporter(key, self._post)
        self._starts[key] = asyncio.create_task(self._start(model, report), name=f"flexinfer-start-{key}")

    async def _start(self, model: Model, report: ServerReporter) -> None:
        try:
            endpoint: Endpoint = await self._engine.start(model, report)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("model %s failed to start: %s", model.key, exc)
            self._post(ModelStartFailed(model.key, str(exc) or type(exc).__name__))
        else:
            self._post(ModelReady(model.key, endpoint))
        finally:
            self._starts.pop(model.key, None)

    def stop(self, model: Model) -> None:
        key = model.key
        self._stops[key] = asyncio.create_task(self._stop(model), name=f"flexinfer-stop-{key}")

    async def _stop(self, model: Model) -> None:
        try:
            start = self._starts.pop(model.key, None)
            if start is not None and not start.done():
                start.cancel()
                await asyncio.gather(start, return_exceptions=True)
            await self._engine.stop(model)
        except Exception as exc:
            log.warning("stopping model %s failed: %s", model.key, exc)
        finally:
            self._stops.pop(model.key, None)
            self._post(ModelStopped(model.key))

    def busy(self) -> bool:
        return bool(self._starts or self._stops)

    async def aclose(self) -> None:
        """Cancel whatever is still running (used after shutdown, or when the dispatcher is torn down)."""
        tasks = [*self._starts.values(), *self._stops.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
