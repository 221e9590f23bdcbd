"""The dispatcher: ONE asyncio task that owns the arbiter (``flexinfer.core.arbiter.machine``) and executes its
effects. It is the ``Activator`` the proxy awaits, the control surface of ``flexinfer serve`` (preload,
unload, status, replace models, shutdown), and the source of lifecycle metrics/traces (through a
``LifecycleObserver``).

Everything that mutates swap state goes through the inbox and is applied by ``run``; slow engine work runs
in child tasks (``flexinfer.runtime.engine_tasks``) that post completion events back. Time comes from an
injectable ``clock``; with ``auto_tick=False`` nothing fires on its own and tests drive deadlines with
``tick()``. Built by ``flexinfer.assembly`` (local engine; in-cluster proxy); used by ``flexinfer.proxy``.

Groups that pack by memory (``ArbiterPolicy.group_budgets``): the engine's ``estimate`` of a member's need
(for models without ``spec.gpu.vramEstimateMB``) runs in a worker thread before the arbiter first sees the
model (at ``run``, and in ``replace_models``), and reaches it as ``MemoryNeedReported``; ``memory_groups`` and
the ``need`` of each ``ModelState`` are what the admin views show.

The express lane: while the inbox is empty, ``acquire`` and ``Grant.release`` for a model that is Ready and
unchallenged are answered in the caller's own step by ``Arbiter.admit``/``finish`` (synchronous, on the
loop, so still one writer and the same order of events), without the inbox round trip or a full decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.events import Effect, Event
from flexinfer.core.arbiter.machine import Arbiter
from flexinfer.core.arbiter.memory import EVICTION_REASONS, GroupMemory
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.errors import ModelNotFoundError, ShuttingDownError
from flexinfer.core.phases import FAILED, READY
from flexinfer.runtime.dispatcher_effects import EffectRunner, Waiter
from flexinfer.runtime.engine_tasks import EngineTasks
from flexinfer.runtime.observer import LifecycleObserver, NullObserver
from flexinfer.runtime.ports import Endpoint, Engine, Grant

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelState:
    """One model as ``flexinfer status`` and ``/v1/models`` show it."""

    key: ModelKey
    name: str
    namespace: str
    group: str | None
    priority: int
    phase: str
    queue_depth: int
    in_flight: int
    endpoint: Endpoint | None
    last_swap_age: float | None
    """Seconds since this model last became Ready through a swap (``None``: never)."""
    draining: bool = False
    last_error: str | None = None
    """Why the model last failed to start or crashed (``None``: never since ``serve`` started)."""
    ready_for: float | None = None
    """Seconds since it became Ready (``None`` unless Ready)."""
    retry_in: float | None = None
    """Seconds until a Failed model may start again (``None``: no backoff pending)."""
    need_mib: float | None = None
    """What the model takes of its group's memory budget (``None``: no figure, outside a group with one)."""
    need_source: str | None = None
    """Where ``need_mib`` comes from: ``measured``, ``declared``, ``estimated`` or ``unknown``."""


class Dispatcher:
    """The single writer of swap state. ``start()`` it (or await ``run()``), then ``acquire`` grants."""

    def __init__(
        self, engine: Engine, models: Iterable[Model] = (), *, policy: ArbiterPolicy | None = None,
        observer: LifecycleObserver | None = None, clock: Callable[[], float] = time.monotonic,
        auto_tick: bool = True, estimate: Callable[[Model], float | None] | None = None,
    ) -> None:
        self._arbiter = Arbiter(models, policy)
        self._estimate = estimate
        """The engine's estimate of a model's memory need in MiB (blocking: run in a worker thread)."""
        self._clock, self._auto_tick = clock, auto_tick
        self._inbox: asyncio.Queue[tuple[Event, asyncio.Future[None] | None]] = asyncio.Queue()
        self._waiters: dict[int, Waiter] = {}
        self._ids = itertools.count(1)
        self._tasks = EngineTasks(engine, self.post)
        self._effects = EffectRunner(self._arbiter, self._tasks, self._waiters,
                                     observer=observer or NullObserver(), post=self.post, release=self._release)
        self._changed = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._closed = False
        self._applying = False
        self._watchers = 0

    @property
    def policy(self) -> ArbiterPolicy:
        return self._arbiter.policy

    # ------------------------------------------------------------ the loop

    def start(self) -> asyncio.Task[None]:
        """Run the loop in a background task (idempotent); returns the task."""
        if self._runner is None:
            self._runner = asyncio.create_task(self.run(), name="flexinfer-dispatcher")
        return self._runner

    async def run(self) -> None:
        """Apply events until shutdown completes. The only place the arbiter is mutated."""
        for estimated in await self._estimates([s.model for s in self._arbiter.slots.values()]):
            self._apply(estimated)
        self.post(ev.Tick(self._clock()))
        while not self._done.is_set():
            event, processed = await self._inbox.get()
            self._apply(event)
            if processed is not None and not processed.done():
                processed.set_result(None)
        await self._tasks.aclose()
        self._effects.cancel_wake()

    def _apply(self, event: Event) -> None:
        self._applying = True
        try:
            effects = self._arbiter.handle(event, self._clock())
        except Exception:
            log.exception("arbiter failed on %r", event)
            return
        finally:
            self._applying = False
        self._execute(effects)
        if isinstance(event, ev.RequestArrived):
            self._effects.notify_waiting(event.ticket, self._arbiter)
        self._notify()

    def _notify(self) -> None:
        """Wake ``wait_for`` callers: the state changed."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _express(self) -> bool:
        """The express lane is open: no event is waiting in the inbox (so answering now keeps the order of
        events) and the arbiter is not in the middle of one."""
        return not self._applying and self._inbox.empty()

    def _execute(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, ev.ShutdownComplete):
                self._closed = True
                self._done.set()
            elif isinstance(effect, ev.ScheduleWake):
                self._effects.schedule_wake(effect.at, self._clock, self._auto_tick)
            else:
                self._effects.run(effect)

    def post(self, event: Event) -> None:
        """Queue an event for the loop (safe from any coroutine or callback on the loop)."""
        self._inbox.put_nowait((event, None))

    async def send(self, event: Event) -> None:
        """Queue an event and wait until the loop has applied it."""
        processed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inbox.put_nowait((event, processed))
        await processed

    # ------------------------------------------------------------ Activator

    async def acquire(
        self, model: ModelKey, timeout: float | None = None, on_wait: Callable[[str], None] | None = None,
    ) -> Grant:
        """Wait until ``model`` may take one more request; see ``flexinfer.runtime.ports.Activator``."""
        if self._closed:
            raise ShuttingDownError("FlexInfer is shutting down")
        ticket = next(self._ids)
        if self._express():
            granted = self._arbiter.admit(ticket, model, self._clock())
            if granted is not None:
                if self._watchers:
                    self._notify()
                return self._effects.grant(granted)
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = Waiter(future, on_wait, contextvars.copy_context(), self._clock())
        deadline = None if timeout is None else self._clock() + timeout
        self.post(ev.RequestArrived(ticket, model, deadline))
        try:
            return await future
        except asyncio.CancelledError:
            self._waiters.pop(ticket, None)
            self.post(ev.RequestCancelled(ticket))
            raise

    def _release(self, ticket: int) -> None:
        if self._express():
            effects = self._arbiter.finish(ticket, self._clock())
            if effects is not None:
                self._execute(effects)
                if self._watchers:
                    self._notify()
                return
        self.post(ev.RequestFinished(ticket))

    # ------------------------------------------------------------ control surface

    async def preload(self, model: ModelKey, wait: bool = False, timeout: float | None = None) -> str:
        """Start ``model`` without a request; with ``wait`` return once it is Ready or Failed.
        Returns the phase (raises ``ModelNotFoundError`` for an unknown key)."""
        key = self._declared(model)
        await self.send(ev.Preload(key))
        if wait:
            await self.wait_for(lambda: self._phase(key) in (READY, FAILED), timeout)
        return self._phase(key)

    async def unload(self, model: ModelKey) -> None:
        """Drain and stop ``model`` now; it stays stopped (also with ``minReplicas``) until a request."""
        await self.send(ev.Unload(self._declared(model)))

    async def replace_models(self, models: Iterable[Model]) -> None:
        """Declare the model set: new models are added, changed ones updated, missing ones removed (their
        waiting requests get ``ModelNotFoundError``; a running one drains and stops)."""
        models = tuple(models)
        for estimated in await self._estimates(models):
            self.post(estimated)
        await self.send(ev.ModelsReplaced(models))

    async def _estimates(self, models: Iterable[Model]) -> list[ev.MemoryNeedReported]:
        """The engine's estimates for the members of groups with a budget that declare no need (a worker
        thread reads their weights); a model it cannot estimate keeps an unknown need (logged)."""
        ledger, estimate = self._arbiter.memory, self._estimate
        wanted = [m for m in models if m.group and ledger.budget(f"{m.namespace}/{m.group}") > 0
                  and not (m.spec.gpu and m.spec.gpu.vram_estimate_mb is not None)]
        if estimate is None or not wanted:
            return []

        def run() -> list[ev.MemoryNeedReported]:
            out = []
            for model in wanted:
                try:
                    mib = estimate(model)
                except Exception as exc:
                    log.warning("model %s: no memory estimate (%s); it counts as its group's whole budget until "
                                "it ran once (or set spec.gpu.vramEstimateMB)", model.key, exc)
                    continue
                if mib is not None:
                    out.append(ev.MemoryNeedReported(model.key, mib, "estimated"))
            return out

        return await asyncio.to_thread(run)

    async def shutdown(self, drain_timeout: float | None = None) -> None:
        """Reject waiting requests, drain in-flight ones (bounded), stop every model, end the loop."""
        if self._runner is None and not self._done.is_set():
            self.start()
        if not self._done.is_set():
            await self.send(ev.Shutdown(drain_timeout))
        await self._done.wait()
        if self._runner is not None:
            await asyncio.gather(self._runner, return_exceptions=True)

    async def tick(self) -> None:
        """Apply a ``Tick`` at the current clock reading (tests with ``auto_tick=False``)."""
        await self.send(ev.Tick(self._clock()))

    @property
    def next_wake(self) -> float | None:
        return self._arbiter.next_wake()

    def phases(self) -> dict[str, str]:
        """The current phase of every declared model."""
        return {key: slot.phase for key, slot in self._arbiter.slots.items()}

    def phase(self, key: ModelKey) -> str | None:
        """The current phase of one declared model (``None``: not declared); the per-request lookup."""
        slot = self._arbiter.slots.get(key)
        return None if slot is None else slot.phase

    def snapshot(self) -> list[ModelState]:
        """The current state of every declared model, sorted by key."""
        now = self._clock()
        return [self._state(slot_key, now) for slot_key in sorted(self._arbiter.slots)]

    def memory_groups(self) -> list[GroupMemory]:
        """Every group with a memory budget: its budget, used and reserved MiB, its running members."""
        return self._arbiter.memory.groups(self._arbiter.slots.values())

    def evictions(self) -> dict[tuple[str, str], int]:
        """Evictions so far by ``(group, reason)`` (``make_room``, ``out_of_memory``)."""
        return dict(self._arbiter.memory.evictions)

    def memory_report(self) -> list[dict[str, object]]:
        """``memory_groups`` as JSON objects, each with its evictions by reason (the admin API, the status page)."""
        evictions = self.evictions()
        return [{**g.as_json(), "evictions": {r: evictions.get((g.group, r), 0) for r in EVICTION_REASONS}}
                for g in self.memory_groups()]

    def _state(self, key: ModelKey, now: float) -> ModelState:
        s = self._arbiter.slots[key]
        endpoint = s.endpoint if isinstance(s.endpoint, Endpoint) and s.servable else None
        need = self._arbiter.memory.need(s.model)
        known = need.source != "unknown" or self._arbiter.memory.budget(s.group) > 0
        return ModelState(
            key=key, name=s.model.name, namespace=s.model.namespace, group=s.model.group,
            priority=s.model.priority, phase=s.phase, queue_depth=len(s.queue), in_flight=len(s.in_flight),
            endpoint=endpoint, last_swap_age=None if s.last_swap is None else now - s.last_swap,
            draining=s.drain_until is not None, last_error=s.last_error,
            ready_for=None if s.ready_since is None or not s.servable else now - s.ready_since,
            retry_in=None if s.retry_at is None or s.retry_at <= now else s.retry_at - now,
            need_mib=need.mib if known else None, need_source=need.source if known else None)

    def state(self, key: ModelKey) -> ModelState | None:
        """The current state of one model (``None`` when it is not declared)."""
        return self._state(key, self._clock()) if key in self._arbiter.slots else None

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> None:
        """Wait until ``predicate()`` holds after some event (``TimeoutError`` after ``timeout``)."""
        self._watchers += 1
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    await self._changed.wait()
        finally:
            self._watchers -= 1

    def _phase(self, key: ModelKey) -> str:
        slot = self._arbiter.slots.get(key)
        return slot.phase if slot is not None else "Idle"

    def _declared(self, key: ModelKey) -> ModelKey:
        """``key`` when it names a declared model (keys come resolved from a catalog), else
        ``ModelNotFoundError``."""
        slot = self._arbiter.slots.get(key)
        if slot is None or slot.removed:
            raise ModelNotFoundError(key)
        return key

    async def __aenter__(self) -> Dispatcher:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self.shutdown()
