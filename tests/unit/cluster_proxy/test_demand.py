"""Demand signalling (lastActiveTime in the replica's ModelDemand: one write per activation, retries, 1 m
keep-alive throttle) and the
KubeEngine's watch-driven readiness (Ready, endpoint override, Failed, stalled, deleted, cold-start budget)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer.api.conventions import ENDPOINT_OVERRIDE_ANNOTATION
from flexinfer.api.model import Model
from flexinfer.cluster_proxy.demand import STALL_AFTER, DemandSignal, KubeEngine, rfc3339
from flexinfer.cluster_proxy.demand_report import DemandReport
from flexinfer.cluster_proxy.model_api import KubeApiError
from flexinfer.cluster_proxy.model_watch import ModelStore, ModelWatcher
from flexinfer.core.errors import EngineError
from flexinfer.runtime.ports import Endpoint
from support.fake_model_api import FakeModelApi, model_body
from support.local_processes import Stages
from support.polling import eventually

T0 = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


class Clock:
    """Wall clock and monotonic clock moved together by tests."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> datetime:
        return T0 + timedelta(seconds=self.offset)

    def mono(self) -> float:
        return self.offset


class Cluster:
    """A fake API, a synced store fed by a real ModelWatcher, and the demand/engine under test."""

    def __init__(self, api: FakeModelApi, store: ModelStore, clock: Clock) -> None:
        self.api, self.store, self.clock = api, store, clock
        self.report = DemandReport(api, "proxy-a", now=clock.now, clock=clock.mono)
        self.demand = DemandSignal(self.report, store, now=clock.now, clock=clock.mono, retry_delay=0.0)

    def engine(self, override: bool = False, now: Callable[[], datetime] | None = None,
               stall_after: float = STALL_AFTER) -> KubeEngine:
        return KubeEngine(self.store, self.demand, endpoint_override=override, cold_start_timeout=5.0,
                          stall_after=stall_after, now=now or self.clock.now)

    def model(self, name: str = "m") -> Model:
        found = self.store.get(f"default/{name}")
        assert found is not None
        return found

    async def seen(self, predicate: Callable[[ModelStore], bool]) -> None:
        await eventually(lambda: predicate(self.store))


@contextlib.asynccontextmanager
async def cluster(*docs: dict[str, Any]) -> AsyncIterator[Cluster]:
    api, store = FakeModelApi(), ModelStore()
    for doc in docs:
        await api.put(doc)
    task = asyncio.create_task(ModelWatcher(api, store, "default").run())
    await asyncio.wait_for(store.synced.wait(), 5)
    try:
        yield Cluster(api, store, Clock())
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task




async def test_signal_writes_last_active_time_into_the_replicas_report_never_the_model() -> None:
    async with cluster(model_body("m", phase="Idle")) as c:
        before = dict(c.api.objects)
        await c.demand.signal(c.model())
        assert c.api.demand_writes == [("default", "m", rfc3339(T0))]
        assert c.api.report("m") == {"proxy-a": {"lastActiveTime": rfc3339(T0)}}
        assert c.api.demands["default/proxy-a"]["metadata"]["labels"] == {"flexinfer.ai/proxy": "proxy-a"}
        assert c.api.objects == before
        assert rfc3339(T0) == "2025-06-01T12:00:00.000000Z"


async def test_a_burst_of_signals_shares_one_patch() -> None:
    async with cluster(model_body("m", phase="Idle")) as c:
        c.api.patch_gate = asyncio.Event()
        burst = [asyncio.create_task(c.demand.signal(c.model())) for _ in range(20)]
        # the write starts after every signal has joined it (tasks run in creation order)
        await eventually(lambda: c.api.held_patches == 1)
        c.api.patch_gate.set()
        await asyncio.gather(*burst)
        assert len(c.api.demand_writes) == 1 and c.demand.patches == 1


async def test_conflicts_are_retried() -> None:
    async with cluster(model_body("m")) as c:
        c.api.patch_failures = [KubeApiError("conflict", 409), KubeApiError("unavailable", 503)]
        await c.demand.signal(c.model())
        assert len(c.api.demand_writes) == 1


async def test_persistent_failure_is_an_engine_error_unless_demand_is_fresh() -> None:
    async with cluster(model_body("m")) as c:
        c.api.patch_failures = [KubeApiError("conflict", 409)] * 3
        with pytest.raises(EngineError, match="cannot signal demand"):
            await c.demand.signal(c.model())
        await c.demand.signal(c.model())  # delivered at T0
        c.clock.offset = 10
        c.api.patch_failures = [KubeApiError("conflict", 409)] * 3
        await c.demand.signal(c.model())  # fails, but our demand of 10 s ago still stands
        c.clock.offset = 40
        c.api.patch_failures = [KubeApiError("conflict", 409)] * 3
        with pytest.raises(EngineError, match="cannot signal demand"):
            await c.demand.signal(c.model())


async def test_forbidden_is_not_retried() -> None:
    async with cluster(model_body("m")) as c:
        c.api.patch_failures = [KubeApiError("forbidden", 403), KubeApiError("never reached", 409)]
        with pytest.raises(EngineError, match="forbidden"):
            await c.demand.signal(c.model())
        assert len(c.api.patch_failures) == 1


async def test_a_write_in_its_retry_wait_ends_with_the_signal_and_retries_no_more() -> None:
    """A cancelled waiter leaves the shared write to the others that joined it; closing the signal ends it."""
    async with cluster(model_body("m")) as c:
        demand = DemandSignal(c.report, c.store, now=c.clock.now, clock=c.clock.mono, retry_delay=60.0)
        c.api.patch_failures = [KubeApiError("conflict", 409), KubeApiError("never reached", 409)]
        task = asyncio.create_task(demand.signal(c.model()))
        await eventually(lambda: len(c.api.patch_failures) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await demand.aclose()
        assert len(c.api.patch_failures) == 1 and demand.patches == 0


async def test_keep_alive_patches_at_most_once_a_minute() -> None:
    async with cluster(model_body("m", phase="Ready")) as c:
        for _ in range(5):
            c.demand.keep_alive(c.model())
        await c.seen(lambda _: len(c.api.demand_writes) == 1)
        c.clock.offset = 30
        c.demand.keep_alive(c.model())
        c.clock.offset = 61
        c.demand.keep_alive(c.model())
        await c.seen(lambda _: len(c.api.demand_writes) == 2)
        await eventually(lambda: not c.demand._background)  # every keep-alive started has finished
        assert len(c.api.demand_writes) == 2


async def test_keep_alive_skips_when_this_replica_signalled_recently() -> None:
    async with cluster(model_body("m", phase="Ready")) as c:
        await c.demand.signal(c.model())
        c.clock.offset = 20
        c.demand.keep_alive(c.model())
        assert not c.demand._background  # the throttle decides at once: no write was started
        assert len(c.api.demand_writes) == 1


async def test_start_signals_demand_then_returns_when_the_watch_reports_ready() -> None:
    async with cluster(model_body("m", phase="Idle")) as c:
        start = asyncio.create_task(c.engine().start(c.model(), Stages()))
        await c.seen(lambda _: len(c.api.demand_writes) == 1)
        await c.api.set_status("m", {"phase": "Loading"})
        await c.api.set_status("m", {"phase": "Ready"})  # Ready without an endpoint is not enough
        await c.seen(lambda _: c.model().status.phase == "Ready")  # the store ran the engine's check on it
        assert not start.done()
        await c.api.set_status("m", {"endpoint": "http://m.default.svc:8000"})
        assert await asyncio.wait_for(start, 2) == Endpoint("http://m.default.svc:8000")


async def test_endpoint_override_is_used_only_when_enabled() -> None:
    doc = model_body("m", phase="Ready", annotations={ENDPOINT_OVERRIDE_ANNOTATION: "http://127.0.0.1:9"})
    doc["status"]["endpoint"] = "http://m.default.svc:8000"
    async with cluster(doc) as c:
        assert await c.engine(override=False).start(c.model(), Stages()) == Endpoint("http://m.default.svc:8000")
        assert await c.engine(override=True).start(c.model(), Stages()) == Endpoint("http://127.0.0.1:9")


async def test_a_ready_models_pod_endpoint_is_where_requests_go_and_the_override_still_wins() -> None:
    """Issue #28: the manager publishes the Ready model's one pod (``status.podEndpoint``); the proxy forwards
    there instead of to the Service, whose endpoint kube-proxy programs only about a second later."""
    doc = model_body("m", phase="Ready", annotations={ENDPOINT_OVERRIDE_ANNOTATION: "http://127.0.0.1:9"})
    doc["status"].update(endpoint="http://m.default.svc:8000", podEndpoint="http://10.88.0.7:8000")
    async with cluster(doc) as c:
        assert await c.engine(override=False).start(c.model(), Stages()) == Endpoint("http://10.88.0.7:8000")
        assert await c.engine(override=True).start(c.model(), Stages()) == Endpoint("http://127.0.0.1:9")
        await c.api.set_status("m", {"podEndpoint": None})
        await c.seen(lambda _: c.model().status.pod_endpoint is None)
        assert await c.engine(override=False).start(c.model(), Stages()) == Endpoint("http://m.default.svc:8000")


async def test_a_group_pods_member_is_forwarded_to_the_pod_in_any_phase_unless_refused() -> None:
    """Issue #28 group-pod mode: while the group pod runs, the manager publishes it as
    ``sharedGroup.groupEndpoint`` and a member's request goes there at once, whatever the member's phase (the pod
    starts or swaps it in and holds the request; one that failed to start there is answered and retried by the
    pod); with the pod gone the request waits for it to come back; a member the manager refused is not
    forwarded."""
    doc = model_body("m", phase="Idle", gpu={"shared": "gpu0"})
    doc["status"]["sharedGroup"] = {"groupName": "gpu0", "strategy": "TimeSliced", "state": "Queued"}
    async with cluster(doc) as c:
        start = asyncio.create_task(c.engine().start(c.model(), Stages()))
        await c.seen(lambda _: len(c.api.demand_writes) == 1)
        await c.api.set_status("m", {"phase": "Loading"})
        await c.seen(lambda _: c.model().status.phase == "Loading")
        assert not start.done()  # no group pod yet: the request waits
        await c.api.set_status("m", {"sharedGroup": {"groupEndpoint": "http://10.88.0.9:8080"}})
        assert await asyncio.wait_for(start, 2) == Endpoint("http://10.88.0.9:8080")
        await c.api.set_status("m", {"phase": "Failed", "message": "llama-server exited with status 1"})
        await c.seen(lambda _: c.model().status.phase == "Failed")  # the pod answers it, and retries it later
        assert await c.engine().start(c.model(), Stages()) == Endpoint("http://10.88.0.9:8080")
        refused = {"type": "ConfigValid", "status": "False", "reason": "ValidationFailed",
                   "lastTransitionTime": "2026-01-01T00:00:00Z"}
        await c.api.set_status("m", {"message": "runs another image than its group", "conditions": [refused]})
        await c.seen(lambda _: bool(c.model().status.conditions))
        with pytest.raises(EngineError, match="runs another image than its group"):
            await c.engine().start(c.model(), Stages())


async def test_failed_is_an_engine_error_with_the_status_message() -> None:
    async with cluster(model_body("m", phase="Pending")) as c:
        start = asyncio.create_task(c.engine().start(c.model(), Stages()))
        await c.seen(lambda _: len(c.api.demand_writes) == 1)
        await c.api.set_status("m", {"phase": "Failed", "message": "image pull back-off"})
        with pytest.raises(EngineError, match="image pull back-off"):
            await asyncio.wait_for(start, 2)


async def test_a_stalled_load_fails_when_its_deadline_passes() -> None:
    base = time.monotonic()

    def moving_now() -> datetime:
        return T0 + timedelta(seconds=time.monotonic() - base)

    doc = model_body("m", phase="Loading")
    doc["status"].update(loadingSubstage="LoadingWeights", loadingProgressAt=rfc3339(T0 - timedelta(seconds=119.9)),
                         message="shard 3/8")
    async with cluster(doc) as c:
        started = time.monotonic()
        with pytest.raises(EngineError, match=r"stalled.*shard 3/8"):
            await c.engine(now=moving_now).start(c.model(), Stages())
        assert time.monotonic() - started < 2


async def test_a_load_that_starts_after_the_request_is_still_watched_for_a_stall() -> None:
    """The usual cold start: the request arrives while the model is Pending; its weights load (LoadingWeights)
    begins later and then makes no progress. The deadline is armed when the load begins, not only when the
    request started."""
    base = time.monotonic()

    def moving_now() -> datetime:
        return T0 + timedelta(seconds=time.monotonic() - base)

    async with cluster(model_body("m", phase="Pending")) as c:
        start = asyncio.create_task(c.engine(now=moving_now, stall_after=10.0).start(c.model(), Stages()))
        await c.seen(lambda _: len(c.api.demand_writes) == 1)
        await c.api.set_status("m", {"phase": "Loading", "loadingSubstage": "LoadingWeights",
                                     "loadingProgressAt": rfc3339(T0 - timedelta(seconds=9.5))})
        with pytest.raises(EngineError, match="stalled"):
            await asyncio.wait_for(start, 3)


async def test_the_stall_deadline_is_the_configured_one() -> None:
    """``PROXY_STALL_TIMEOUT`` (here 10 s): a load without progress for 10 s is stalled, long before 120 s."""
    doc = model_body("m", phase="Loading")
    doc["status"].update(loadingSubstage="LoadingWeights", loadingProgressAt=rfc3339(T0 - timedelta(seconds=10.5)))
    async with cluster(doc) as c:
        with pytest.raises(EngineError, match="stalled"):
            await asyncio.wait_for(c.engine(stall_after=10.0).start(c.model(), Stages()), 2)


async def test_progress_moves_the_stall_deadline() -> None:
    """The test's clock moves only when told to, so however slow the machine, the first deadline is still
    ahead when the progress stamp arrives; the engine then arms its timer for the new deadline. Past the old
    deadline, the next status event finds the load in time (seen as the engine reading the moved clock)."""
    doc = model_body("m", phase="Loading")
    doc["status"].update(loadingSubstage="LoadingWeights", loadingProgressAt=rfc3339(T0 - timedelta(seconds=119.9)))
    async with cluster(doc) as c:
        readings: list[datetime] = []

        def watched_now() -> datetime:
            readings.append(c.clock.now())
            return readings[-1]

        start = asyncio.create_task(c.engine(now=watched_now).start(c.model(), Stages()))
        await c.seen(lambda _: len(c.api.demand_writes) == 1)
        await c.api.set_status("m", {"loadingProgressAt": rfc3339(T0 + timedelta(seconds=1))})
        await c.seen(lambda _: c.model().status.loading_progress_at == T0 + timedelta(seconds=1))
        c.clock.offset = 5.0  # past the first deadline (T0 + 0.1 s), far before the new one (T0 + 121 s)
        moved = T0 + timedelta(seconds=5)
        await c.api.set_status("m", {"message": "shard 3/8"})
        await eventually(lambda: any(reading >= moved for reading in readings))
        assert not start.done()
        await c.api.set_status("m", {"phase": "Ready", "endpoint": "http://m:8000"})
        assert await asyncio.wait_for(start, 2) == Endpoint("http://m:8000")


async def test_deleted_while_waiting_and_cold_start_budget_are_engine_errors() -> None:
    async with cluster(model_body("m", phase="Idle"), model_body("slow", phase="Idle",
                                                                 serverless={"coldStartTimeout": "200ms"})) as c:
        start = asyncio.create_task(c.engine().start(c.model(), Stages()))
        await c.seen(lambda _: len(c.api.demand_writes) == 1)
        await c.api.remove("m")
        with pytest.raises(EngineError, match="deleted"):
            await asyncio.wait_for(start, 2)
        with pytest.raises(EngineError, match="not Ready within"):
            await asyncio.wait_for(c.engine().start(c.model("slow"), Stages()), 2)


async def test_a_member_waiting_its_turn_past_the_budget_keeps_waiting_and_signals_demand_again() -> None:
    """A shared member Queued or Preempted when the cold-start budget runs out is not failing (a swap storm keeps
    it waiting): the activation goes on, so requests that arrived since it began are not failed with it; a member
    the election made Active that is still not Ready after the budget is failing."""
    doc = model_body("m", phase="Preempted", serverless={"coldStartTimeout": "200ms"}, gpu={"shared": "g"})
    doc["status"]["sharedGroup"] = {"groupName": "g", "state": "Queued", "preemptedBy": "other"}
    async with cluster(doc) as c:
        start = asyncio.create_task(c.engine().start(c.model(), Stages()))
        await c.seen(lambda _: len(c.api.demand_writes) >= 2)  # the budget ran out once: demand signalled again
        assert not start.done()
        await c.api.set_status("m", {"phase": "Ready", "endpoint": "http://m:8000",
                                     "sharedGroup": {"groupName": "g", "state": "Active"}})
        assert await asyncio.wait_for(start, 2) == Endpoint("http://m:8000")
        await c.api.set_status("m", {"phase": "Loading", "sharedGroup": {"groupName": "g", "state": "Active"}})
        with pytest.raises(EngineError, match="not Ready within"):
            await asyncio.wait_for(c.engine().start(c.model(), Stages()), 2)


async def test_a_model_held_behind_a_warm_primary_fails_fast() -> None:
    doc = model_body("m", phase="Preempted")
    doc["status"]["sharedGroup"] = {"groupName": "g", "state": "Queued", "preemptedBy": "primary/big"}
    async with cluster(doc) as c:
        with pytest.raises(EngineError, match="warm primary big"):
            await asyncio.wait_for(c.engine().start(c.model(), Stages()), 2)


async def test_stop_does_nothing() -> None:
    async with cluster(model_body("m", phase="Ready")) as c:
        await c.engine().stop(c.model())
        assert c.api.demand_writes == []


async def test_each_new_loading_stage_the_manager_writes_is_reported_once() -> None:
    async with cluster(model_body("m", phase="Idle")) as c:
        reported = Stages()
        start = asyncio.create_task(c.engine().start(c.model(), reported))
        await c.seen(lambda _: len(c.api.demand_writes) == 1)
        for substage, message in (("ImagePulling", "pulling"), ("Initializing", "model running"),
                                  ("LoadingWeights", "loading weights (1/4 shards)"),
                                  ("LoadingWeights", "loading weights (2/4 shards)"),
                                  ("HealthCheckPending", "server up")):
            await c.api.set_status("m", {"phase": "Loading", "loadingSubstage": substage, "message": message,
                                         "loadingProgressAt": rfc3339(T0)})
        await c.api.set_status("m", {"phase": "Ready", "loadingSubstage": None, "endpoint": "http://m:8000"})
        assert await asyncio.wait_for(start, 2) == Endpoint("http://m:8000")
        assert reported.seen == ["server_start", "staging", "health"]
