"""Demand and readiness for the in-cluster proxy: the proxy's half of the manager ↔ proxy contract.

The contract (docs/design/kubernetes-proxy.md): the proxy signals demand by writing ``lastActiveTime``
(RFC 3339, UTC, microseconds) for the Model into this replica's ``ModelDemand`` report
(``flexinfer.cluster_proxy.demand_report``; the proxy never writes Models); the manager reacts to that watch event
(scale up, shared-group election) and reports ``status.phase``/``endpoint`` on the Model.

- ``DemandSignal``: ``signal`` writes now (one write per activation; concurrent callers join the write in
  flight; retriable failures retried); ``keep_alive`` writes in the background at most once per
  ``throttle`` (60 s) per model.
- ``KubeEngine``: the ``Engine`` port for the proxy's dispatcher. ``start`` = signal demand, then wait on
  the watch cache until Ready with an endpoint, reporting each new loading stage the manager writes
  (``loadingSubstage`` → ``server_start``/``staging``/``health``, so the proxy's activation trace and stage
  metrics show where the time went) (Failed → ``EngineError`` with ``status.message``; a load
  stalled in LoadingWeights for ``stall_after`` (``PROXY_STALL_TIMEOUT``, 120 s), a model held behind a warm
  primary (``preemptedBy: primary/…``) and
  the model's cold-start budget, unless the model still waits its turn for its group's GPU → ``EngineError``).
  ``stop`` does nothing: the manager owns scale-down. The endpoint is ``status.podEndpoint`` (the Ready
  model's one pod), else ``status.endpoint`` (its Service) or, only with the test-only override switched on,
  the ``flexinfer.ai/endpoint-override`` annotation; a member of a group that runs in a group pod is forwarded
  to that pod (``status.sharedGroup.groupEndpoint``) whatever its phase but Failed (``forwarding_endpoint``).
Built by ``flexinfer.assembly.cluster_proxy``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_incrementing

from flexinfer.api.conventions import ENDPOINT_OVERRIDE_ANNOTATION
from flexinfer.api.model import Model
from flexinfer.cluster_proxy.model_api import KubeApiError
from flexinfer.cluster_proxy.model_watch import ModelStore
from flexinfer.core.errors import EngineError
from flexinfer.core.model_status.plan import STAGE_OF_SUBSTAGE
from flexinfer.core.phases import COND_CONFIG_VALID, READY, find_condition
from flexinfer.core.replicas import cold_start_timeout_seconds
from flexinfer.runtime.background import Background
from flexinfer.runtime.ports import Endpoint, ServerReporter

if TYPE_CHECKING:
    from flexinfer.cluster_proxy.demand_report import DemandReport

log = logging.getLogger(__name__)

STALL_AFTER = 120.0
"""A load is stalled when LoadingWeights has reported no progress for this long (spec §6.5); the default of
``PROXY_STALL_TIMEOUT``."""
WARM_PRIMARY_PREFIX = "primary/"
"""``status.sharedGroup.preemptedBy`` prefix: the model cannot be promoted past a warm primary (fail fast)."""
KEEP_ALIVE_THROTTLE = 60.0
CONFLICT_GRACE = 30.0
"""A failed demand write still counts when this replica's last written ``lastActiveTime`` is at most this old."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def rfc3339(moment: datetime) -> str:
    """``2025-01-02T03:04:05.123456Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class DemandSignal:
    """Writes ``lastActiveTime`` into this replica's demand report (see the module docstring)."""

    def __init__(self, report: DemandReport, store: ModelStore, *, now: Callable[[], datetime] = utc_now,
                 clock: Callable[[], float] = time.monotonic, throttle: float = KEEP_ALIVE_THROTTLE,
                 attempts: int = 3, retry_delay: float = 0.2) -> None:
        self._report, self._store, self._now, self._clock = report, store, now, clock
        self._throttle, self._attempts, self._retry_delay = throttle, attempts, retry_delay
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        self._last: dict[str, float] = {}
        self._written: dict[str, datetime] = {}
        """key → the last ``lastActiveTime`` this replica wrote."""
        self._background = Background()
        self.patches = 0
        """Successful demand writes (for tests and logs)."""

    async def signal(self, model: Model) -> None:
        """Write ``lastActiveTime`` now (joining a write already in flight); ``EngineError`` on failure."""
        task = self._in_flight.get(model.key)
        if task is None:
            task = asyncio.create_task(self._patch(model.namespace, model.name), name=f"demand-{model.key}")
            self._in_flight[model.key] = task
            task.add_done_callback(lambda _: self._in_flight.pop(model.key, None))
        await asyncio.shield(task)

    def keep_alive(self, model: Model) -> None:
        """Write in the background unless this replica recorded demand within the throttle window."""
        if model.key in self._in_flight or not self._due(model):
            return
        self._last[model.key] = self._clock()
        self._background.spawn(self._quiet_patch(model), name=f"keep-alive-{model.key}")

    def _due(self, model: Model) -> bool:
        last = self._last.get(model.key)
        return last is None or self._clock() - last >= self._throttle

    async def _quiet_patch(self, model: Model) -> None:
        try:
            await self.signal(model)
        except EngineError as exc:
            log.warning("keep-alive for model %s failed: %s", model.key, exc)

    async def _patch(self, namespace: str, name: str) -> None:
        key = f"{namespace}/{name}"
        moment = self._now()
        try:
            async for attempt in self._retrying():
                with attempt:
                    moment = self._now()
                    await self._report.write(namespace, name, {"lastActiveTime": rfc3339(moment)})
        except KubeApiError as exc:
            if self._recent(key):
                log.info("demand write for %s failed (%s) but lastActiveTime is fresh", key, exc)
                return
            raise EngineError(f"cannot signal demand for model {key}: {exc}") from None
        self.patches += 1
        self._last[key] = self._clock()
        self._written[key] = moment

    def _retrying(self) -> AsyncRetrying:
        """Retriable API errors (conflict, 5xx) wait ``retry_delay`` times the attempt number; ``attempts`` in all."""
        return AsyncRetrying(stop=stop_after_attempt(self._attempts),
                             wait=wait_incrementing(start=self._retry_delay, increment=self._retry_delay),
                             retry=retry_if_exception(lambda exc: isinstance(exc, KubeApiError) and exc.retriable),
                             reraise=True)

    def _recent(self, key: str) -> bool:
        stamp = self._written.get(key)
        return stamp is not None and (self._now() - stamp).total_seconds() <= CONFLICT_GRACE

    async def aclose(self) -> None:
        """Cancel background keep-alive patches and shared writes still retrying (their waiters are gone at
        shutdown; a waiter cancelled earlier leaves the write to the others that joined it)."""
        shared = list(self._in_flight.values())
        for task in shared:
            task.cancel()
        await self._background.close(wait=0)
        await asyncio.gather(*shared, return_exceptions=True)


def endpoint_of(model: Model, override_enabled: bool) -> str | None:
    """Where a Ready model answers: the override annotation (only when enabled), else its one pod's own URL
    (``status.podEndpoint``, which the manager publishes unless told to route through Services), else
    ``status.endpoint`` (the Service)."""
    if override_enabled:
        override = model.metadata.annotations.get(ENDPOINT_OVERRIDE_ANNOTATION, "").strip()
        if override:
            return override
    return model.status.pod_endpoint or model.status.endpoint or None


def forwarding_endpoint(model: Model, override_enabled: bool) -> str | None:
    """Where the proxy sends the model's requests now: a Ready model's ``endpoint_of``; a member of a group that
    runs in a group pod (``status.sharedGroup.groupEndpoint`` set while that pod runs), in any phase, the group
    pod, which starts or swaps the member in and holds the request meanwhile (a member that failed to start there
    too: the pod's engine answers with the failure and starts it again once its backoff has passed) — but not a
    member the manager refused (``ConfigValid`` False: the pod does not serve it); else ``None`` (signal demand
    and wait)."""
    if model.status.phase == READY:
        return endpoint_of(model, override_enabled)
    shared = model.status.shared_group
    if shared is None or not shared.group_endpoint:
        return None
    valid = find_condition(model.status.conditions, COND_CONFIG_VALID)
    return None if valid is not None and valid.status == "False" else shared.group_endpoint


def failure_message(model: Model) -> str:
    """``status.message``, else the first False condition's message, else the phase."""
    if model.status.message:
        return model.status.message
    failed = next((c for c in model.status.conditions if c.status == "False" and c.message), None)
    return failed.message if failed is not None else "phase Failed"


def preempted(model: Model) -> bool:
    """The manager took the model's turn on its group's GPU away (``Preempted``): its replica drains."""
    shared = model.status.shared_group
    return model.status.phase == "Preempted" or (shared is not None and shared.state == "Preempted")


def waiting_its_turn(model: Model) -> bool:
    """A shared-group member that the election has not made Active (``Queued``/``Preempted``): it waits for the
    GPU, it is not failing to start."""
    shared = model.status.shared_group
    return model.group is not None and shared is not None and shared.state != "Active"


def _loading_stage(model: Model | None) -> str | None:
    """The activation stage the manager's ``loadingSubstage`` shows while Loading (``None`` otherwise)."""
    if model is None or model.status.phase != "Loading" or model.status.loading_substage is None:
        return None
    return STAGE_OF_SUBSTAGE.get(model.status.loading_substage)


def stall_deadline(model: Model | None, stall_after: float = STALL_AFTER) -> datetime | None:
    """When the current load counts as stalled (Loading/LoadingWeights only), else ``None``."""
    if model is None or model.status.phase != "Loading" or model.status.loading_substage != "LoadingWeights":
        return None
    progress = model.status.loading_progress_at
    return None if progress is None else progress + timedelta(seconds=stall_after)


class KubeEngine:
    """The ``Engine`` the proxy's dispatcher drives in the cluster (see the module docstring)."""

    def __init__(self, store: ModelStore, demand: DemandSignal, *, endpoint_override: bool = False,
                 cold_start_timeout: float = 60.0, stall_after: float = STALL_AFTER,
                 now: Callable[[], datetime] = utc_now) -> None:
        self._store, self._demand, self._override = store, demand, endpoint_override
        self._cold_start_timeout, self._stall_after, self._now = cold_start_timeout, stall_after, now

    async def start(self, model: Model, report: ServerReporter) -> Endpoint:
        """Signal demand, then wait (watch-driven) until the manager reports the model Ready. The cold-start
        budget fails a model that is starting (or that nothing starts); a member still waiting its turn for its
        group's GPU when the budget runs out (``waiting_its_turn``) is not failing: its demand is signalled again
        and the wait goes on, bounded by each waiting request's own deadline (a request that arrived a second
        ago must not get the error of an activation that began before it)."""
        budget = cold_start_timeout_seconds(model, self._cold_start_timeout)
        await self._demand.signal(model)
        while True:
            try:
                async with asyncio.timeout(budget):
                    return await self._await_ready(model.key, report)
            except TimeoutError:
                current = self._store.get(model.key)
                if current is None or not waiting_its_turn(current):
                    raise EngineError(f"model {model.key} was not Ready within {budget:.0f}s") from None
                log.info("model %s: still waiting for its group's GPU after %.0fs (%s); demand signalled again",
                         model.key, budget, current.status.phase)
                await self._demand.signal(current)

    async def stop(self, model: Model) -> None:
        """Nothing to do: the manager scales models down (idle timeout, shared-group election)."""
        return None

    async def _await_ready(self, key: str, report: ServerReporter) -> Endpoint:
        stages: list[str] = []

        def progress(model: Model | None) -> Endpoint | None:
            stage = _loading_stage(model)
            if stage is not None and stage not in stages[-1:]:
                stages.append(stage)
                report.stage(stage)
            return self._readiness(model)

        loop = asyncio.get_running_loop()

        def due(deadline: datetime | None) -> float | None:
            """The event-loop time of a stall deadline (a hundredth of a second late, so it has passed)."""
            return None if deadline is None else loop.time() + max((deadline - self._now()).total_seconds(), 0.0) + 0.01

        while True:
            armed = stall_deadline(self._store.get(key), self._stall_after)
            timer = asyncio.timeout_at(due(armed))

            def check(model: Model | None, timer: asyncio.Timeout = timer) -> Endpoint | None:
                """Progress and readiness; a moved stall deadline (a load that entered LoadingWeights after this
                wait began, or whose progress moved) re-arms the timer."""
                nonlocal armed
                endpoint = progress(model)
                deadline = stall_deadline(model, self._stall_after)
                if endpoint is None and deadline != armed:
                    armed = deadline
                    timer.reschedule(due(deadline))
                return endpoint

            try:
                async with timer:
                    return await self._store.wait_until(key, check)
            except TimeoutError:
                if not timer.expired():
                    raise
            self._readiness(self._store.get(key))

    def _readiness(self, model: Model | None) -> Endpoint | None:
        """The endpoint once the model is served (``forwarding_endpoint``); raises ``EngineError`` for Failed,
        stalled or deleted models that are not."""
        if model is None:
            raise EngineError("the Model was deleted")
        url = forwarding_endpoint(model, self._override)
        if url:
            return Endpoint(url)
        phase = model.status.phase
        if phase == "Failed":
            raise EngineError(failure_message(model))
        shared = model.status.shared_group
        if phase == "Preempted" and shared is not None and shared.preempted_by.startswith(WARM_PRIMARY_PREFIX):
            raise EngineError(f"held behind warm primary {shared.preempted_by[len(WARM_PRIMARY_PREFIX):]}")
        deadline = stall_deadline(model, self._stall_after)
        if deadline is not None and self._now() >= deadline:
            raise EngineError(f"stalled: no loading progress since {model.status.loading_progress_at} "
                              f"({model.status.message or 'LoadingWeights'})")
        return None
