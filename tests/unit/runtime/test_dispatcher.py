"""End-to-end tests of flexinfer.runtime.dispatcher with the recording engine and a hand-driven clock:
joins, swaps with drains, cancellation, timeouts, failures, preload/unload, snapshots, replace, shutdown, and
the express lane (grant and release of a Ready model in the caller's step)."""

from __future__ import annotations

import asyncio
import contextvars

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.errors import (
    ColdStartTimeoutError,
    ModelFailedError,
    ModelNotFoundError,
    QueueFullError,
    ShuttingDownError,
)
from flexinfer.runtime.dispatcher import Dispatcher
from flexinfer.runtime.observer import ActivationRecord, NullObserver
from flexinfer.runtime.ports import Grant
from support.garbage import kinds, unreachable_cycles
from support.recording_engine import FakeClock, RecordingEngine, key, make_model

POLICY = ArbiterPolicy(max_wait=30, min_hold=0, drain_timeout=20, cold_start_timeout=60, queue_limit=2)
A, B = "default/a", "default/b"
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


class Records(NullObserver):
    def __init__(self) -> None:
        self.activations: list[ActivationRecord] = []

    def activation(self, record: ActivationRecord) -> None:
        self.activations.append(record)


def pair(engine: RecordingEngine, clock: FakeClock, **kw: object) -> Dispatcher:
    models = [make_model("a", group="g", priority=100), make_model("b", group="g", priority=200)]
    return Dispatcher(engine, models, policy=POLICY, clock=clock, auto_tick=False, **kw)  # type: ignore[arg-type]


async def test_joiners_share_one_start_and_on_wait_fires_once(engine: RecordingEngine, clock: FakeClock) -> None:
    engine.hold(A)
    reasons: list[str] = []
    records = Records()
    async with pair(engine, clock, observer=records) as d:
        async def call(rid: str) -> float:
            request_id.set(rid)
            grant = await d.acquire(key("a"), on_wait=reasons.append)
            grant.release()
            return grant.waited_seconds
        tasks = [asyncio.create_task(call(f"r{i}")) for i in range(2)]
        await engine.wait_call("start", A)
        await d.wait_for(lambda: d.snapshot()[0].queue_depth == 2, 5)
        clock.advance(3)
        engine.open(A)
        assert await asyncio.gather(*tasks) == [3.0, 3.0]
    assert engine.count("start", A) == 1 and reasons == ["cold_start", "cold_start"]
    [record] = records.activations
    assert record.kind == "cold_start" and record.end - record.start == 3.0
    assert sorted(ctx.run(request_id.get) for ctx in record.triggers) == ["r0", "r1"]


async def test_swap_waits_for_in_flight_then_starts_winner(engine: RecordingEngine, clock: FakeClock) -> None:
    async with pair(engine, clock) as d:
        grant_a = await d.acquire(key("a"))
        waiting_b = asyncio.create_task(d.acquire(key("b")))
        await d.wait_for(lambda: d.snapshot()[0].draining, 5)
        assert engine.count("stop", A) == 0, "in-flight request on a: no stop yet"
        grant_a.release()
        grant_b = await waiting_b
        assert grant_b.activation == "swap"
        assert engine.calls.index(("stop", A)) < engine.calls.index(("start", B))
        states = {s.name: s for s in d.snapshot()}
        assert states["a"].phase == "Preempted" and states["b"].phase == "Ready"
        assert states["b"].last_swap_age == 0.0 and states["b"].endpoint is not None
        grant_b.release()


async def test_drain_timeout_stops_a_stuck_incumbent(engine: RecordingEngine, clock: FakeClock) -> None:
    async with pair(engine, clock) as d:
        await d.acquire(key("a"))  # never released
        waiting_b = asyncio.create_task(d.acquire(key("b")))
        await d.wait_for(lambda: d.snapshot()[0].draining, 5)
        assert d.next_wake == clock.now + 20
        clock.advance(20)
        await d.tick()
        (await waiting_b).release()
        assert engine.count("stop", A) == 1


async def test_cancelled_waiter_is_withdrawn(engine: RecordingEngine, clock: FakeClock) -> None:
    engine.hold(A)
    async with pair(engine, clock) as d:
        task = asyncio.create_task(d.acquire(key("a")))
        await engine.wait_call("start", A)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await d.wait_for(lambda: d.snapshot()[0].queue_depth == 0, 5)
        engine.open(A)
        await d.wait_for(lambda: d.snapshot()[0].phase == "Ready", 5)
        assert d.snapshot()[0].in_flight == 0


async def test_errors_are_typed(engine: RecordingEngine, clock: FakeClock) -> None:
    engine.hold(A)
    async with pair(engine, clock) as d:
        with pytest.raises(ModelNotFoundError):
            await d.acquire(key("zzz"))
        waiting = [asyncio.create_task(d.acquire(key("a"))) for _ in range(2)]
        await d.wait_for(lambda: d.snapshot()[0].queue_depth == 2, 5)
        with pytest.raises(QueueFullError):
            await d.acquire(key("a"))
        clock.advance(60)
        await d.tick()
        for task in waiting:
            with pytest.raises(ColdStartTimeoutError):
                await task
        engine.open(A)


async def test_start_failure_rejects_with_model_failed(engine: RecordingEngine, clock: FakeClock) -> None:
    engine.fail_next(A, "weights missing")
    async with pair(engine, clock) as d:
        with pytest.raises(ModelFailedError, match="weights missing"):
            await d.acquire(key("a"))
        assert d.snapshot()[0].phase == "Failed"


async def test_preload_unload_replace_and_shutdown(engine: RecordingEngine, clock: FakeClock) -> None:
    d = pair(engine, clock)
    d.start()
    assert await d.preload(key("a"), wait=True, timeout=5) == "Ready"
    await d.unload(key("a"))
    await engine.wait_call("stop", A)
    await d.replace_models([make_model("b", group="g", priority=200)])
    assert [s.name for s in d.snapshot()] == ["b"]
    grant = await d.acquire(key("b"))
    waiting = asyncio.create_task(d.shutdown(drain_timeout=5))
    await d.wait_for(lambda: d.snapshot()[0].draining, 5)
    with pytest.raises(ShuttingDownError):
        await d.acquire(key("b"))
    grant.release()
    await waiting
    assert engine.running == set()
    with pytest.raises(ShuttingDownError):
        await d.acquire(key("b"))


async def test_auto_tick_fires_deadlines_on_the_real_clock(engine: RecordingEngine) -> None:
    engine.hold(A)
    models = [make_model("a", coldStartTimeout="50ms")]
    async with Dispatcher(engine, models) as d:
        with pytest.raises(ColdStartTimeoutError):
            await asyncio.wait_for(d.acquire(key("a")), 5)
        engine.open(A)


async def test_wake_ups_leave_no_reference_cycles(engine: RecordingEngine) -> None:
    """The wake-up timer is armed at every deadline (each swap has several): what it leaves once it fired or
    was replaced must be freed at once, not by the cyclic collector that ``serve`` runs rarely."""
    engine.hold(A)
    with unreachable_cycles() as cycles:
        async with Dispatcher(engine, [make_model("a", coldStartTimeout="50ms")]) as d:
            with pytest.raises(ColdStartTimeoutError):
                await asyncio.wait_for(d.acquire(key("a")), 5)
            engine.open(A)
    assert not {kind for kind in kinds(cycles) if kind.startswith("function:flexinfer.")}


async def test_one_name_in_two_namespaces_each_key_starts_and_grants_its_own_model(
        engine: RecordingEngine, clock: FakeClock) -> None:
    chat = make_model("chat")
    team_b = chat.model_copy(update={"metadata": chat.metadata.model_copy(update={"namespace": "team-b"})})
    async with Dispatcher(engine, [chat, team_b], policy=POLICY, clock=clock, auto_tick=False) as d:
        grant = await d.acquire(key("team-b/chat"))
        assert grant.model == "team-b/chat" and grant.model.namespace == "team-b"
        assert [c for c in engine.calls if c[0] == "start"] == [("start", "team-b/chat")]
        grant.release()
        assert await d.preload(key("default/chat"), wait=True, timeout=5) == "Ready"
        assert {s.key: s.phase for s in d.snapshot()} == {"default/chat": "Ready", "team-b/chat": "Ready"}


def _without_suspending(coro: object) -> object:
    """Run a coroutine that must finish without awaiting anything; return its result."""
    try:
        coro.send(None)  # type: ignore[attr-defined]
    except StopIteration as done:
        return done.value
    with pytest.raises(asyncio.CancelledError):
        coro.throw(asyncio.CancelledError())  # type: ignore[attr-defined]  # withdraw the request
    raise AssertionError("the coroutine suspended: it went through the dispatcher's inbox")


async def test_a_ready_unchallenged_model_grants_and_releases_in_the_callers_step(
        engine: RecordingEngine, clock: FakeClock) -> None:
    """The express lane: no inbox round trip for a Ready model, and in-flight counting still exact."""
    async with pair(engine, clock) as d:
        (await d.acquire(key("a"))).release()  # cold start through the inbox
        await d.wait_for(lambda: d.state(key("a")).in_flight == 0, 5)  # type: ignore[union-attr]
        grants = [_without_suspending(d.acquire(key("a"))) for _ in range(3)]
        assert d.state(key("a")).in_flight == 3  # type: ignore[union-attr]
        watcher = asyncio.create_task(d.wait_for(lambda: d.state(key("a")).in_flight == 0, 5))  # type: ignore[union-attr]
        await asyncio.sleep(0)
        for grant in grants:
            grant.release()  # type: ignore[attr-defined]
            grant.release()  # type: ignore[attr-defined]  # once only
        assert d.state(key("a")).in_flight == 0  # type: ignore[union-attr]
        await watcher  # wait_for callers are woken by an express release too
        assert engine.count("start", A) == 1


async def test_a_request_for_a_draining_model_queues_behind_the_swap(engine: RecordingEngine, clock: FakeClock) -> None:
    """No express grant for a model that lost its GPU: it drains, its new requests wait for its next turn."""
    async with pair(engine, clock) as d:
        grant_a = await d.acquire(key("a"))
        waiting_b = asyncio.create_task(d.acquire(key("b")))
        await d.wait_for(lambda: d.state(key("a")).draining, 5)  # type: ignore[union-attr]
        late_a = asyncio.create_task(d.acquire(key("a")))
        await d.wait_for(lambda: d.state(key("a")).queue_depth == 1, 5)  # type: ignore[union-attr]
        assert not late_a.done() and d.state(key("a")).in_flight == 1  # type: ignore[union-attr]
        grant_a.release()
        (await waiting_b).release()
        clock.advance(POLICY.max_wait)
        await d.tick()
        (await late_a).release()
        assert [c for c in engine.calls if c[0] == "start"] == [("start", A), ("start", B), ("start", A)]


async def test_an_event_waiting_in_the_inbox_is_applied_before_an_express_request(
        engine: RecordingEngine, clock: FakeClock) -> None:
    """Order is kept: an unload posted before a request is applied first, so the request waits for a start."""
    async with pair(engine, clock) as d:
        (await d.acquire(key("a"))).release()
        await d.wait_for(lambda: d.state(key("a")).in_flight == 0, 5)  # type: ignore[union-attr]
        d.post(ev.Unload(key("a")))
        grant = await d.acquire(key("a"))
        grant.release()
        assert engine.count("stop", A) == 1 and engine.count("start", A) == 2


script_ops = st.lists(st.one_of(
    st.tuples(st.just("request"), st.sampled_from("ab")),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("advance"), st.sampled_from((0.5, 5.0, 25.0))),
    st.tuples(st.just("unload"), st.sampled_from("ab")),
), max_size=30)


async def _scripted(script: list[tuple[str, object]], express: bool) -> list[object]:
    """Run ``script`` against a dispatcher (with or without the express lane); what a client and the engine
    saw after every step."""
    engine, clock = RecordingEngine(), FakeClock()
    seen: list[object] = []
    async with pair(engine, clock) as d:
        if not express:
            d._arbiter.admit = lambda *_: None  # type: ignore[method-assign]  # every request takes handle()
            d._arbiter.finish = lambda *_: None  # type: ignore[method-assign]
        calls: list[asyncio.Task[Grant]] = []
        released: set[int] = set()
        for op, arg in script:
            if op == "request":
                calls.append(asyncio.create_task(d.acquire(key(str(arg)))))
            elif op == "release":
                live = [i for i, c in enumerate(calls) if c.done() and not c.exception() and i not in released]
                if live:
                    index = live[int(arg) % len(live)]  # type: ignore[call-overload]
                    released.add(index)
                    calls[index].result().release()
            elif op == "advance":
                clock.advance(float(arg))  # type: ignore[arg-type]
            else:
                await d.unload(key(str(arg)))
            for _ in range(30):  # let grants, engine tasks and their events run (no timers: all ready now)
                await asyncio.sleep(0)
            await d.tick()
            outcomes = [("pending" if not c.done() else type(c.exception()).__name__ if c.exception() else "granted")
                        for c in calls]
            states = [(s.key, s.phase, s.queue_depth, s.in_flight, s.draining) for s in d.snapshot()]
            seen.append((outcomes, list(engine.calls), states))
        for i, call in enumerate(calls):
            if call.done() and not call.exception() and i not in released:
                call.result().release()
            call.cancel()
    return seen


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=script_ops)
def test_the_express_lane_changes_nothing_a_client_or_the_engine_can_see(script: list[tuple[str, object]]) -> None:
    """The same scripted clients against a dispatcher with the express lane and one without: the same
    grants, rejections and waits, the same engine calls and the same model states after every step."""
    assert asyncio.run(_scripted(script, express=True)) == asyncio.run(_scripted(script, express=False))
