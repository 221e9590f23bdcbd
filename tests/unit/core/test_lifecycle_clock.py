"""Tests for flexinfer.core.lifecycle_clock, including the two acceptance timelines run through the arbiter:
(a) the Go contract (a swap back in, Ready 35 s after the swap decision → one swap and one cold-start sample)
and (b) a model idle for an hour is measured from its activation only (the Go formula gives the hour)."""

from __future__ import annotations

from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.lifecycle_clock import Activation, StageSpan, observed_ready
from support.arbiter_harness import Harness
from support.recording_engine import make_model

A, B = "default/a", "default/b"
POLICY = ArbiterPolicy(min_hold=0, max_wait=1000, drain_timeout=30, cold_start_timeout=600)


def go_cold_start(ready_false_since: float, ready_at: float) -> float:
    """The Go formula (spec §3.7): now - lastTransitionTime of the Ready condition when it went False."""
    return ready_at - ready_false_since


def samples(h: Harness, kind: type) -> list[float]:
    return [e.seconds for e in h.effects(kind)]  # type: ignore[attr-defined]


def test_stage_spans_close_at_the_next_stage_and_ignore_unknown_names() -> None:
    act = Activation("m", decided_at=10, kind="swap", preempted="x", demand_since=4)
    act.start(11)
    act.mark("staging", 12)
    act.mark("staging", 13)
    act.mark("bogus", 14)
    act.mark("server_start", 15)
    act.mark("health", 19)
    obs = act.finish(20)
    assert obs.cold_start == 10 and obs.swap == 10
    assert obs.stages == (StageSpan("queue", 4, 10), StageSpan("drain", 10, 11), StageSpan("staging", 11, 15),
                          StageSpan("server_start", 15, 19), StageSpan("health", 19, 20))
    assert act.fail(20).cold_start is None
    bare = Activation("m", decided_at=0)
    bare.start(1)
    assert bare.finish(5).stages == (StageSpan("server_start", 1, 5),)


def test_go_contract_timeline_swap_back_in_ready_35s_after_decision() -> None:
    h = Harness([make_model("a", group="fast-models", priority=200),
                 make_model("b", group="fast-models", priority=100)], POLICY)
    h.request("b")
    h.send(ev.ModelReady(B, "ep:b"))  # b holds the GPU, a is parked (it was preempted long ago)
    h.finish(1)
    h.advance(100)
    t = h.now
    h.request("a")  # swap decision at t: b (idle) loses the GPU to a
    assert h.effects(ev.Preempted) == [ev.Preempted("default/fast-models", B, A)]
    h.advance(4)
    h.send(ev.ModelStopped(B))
    h.send(ev.StageReached(A, "staging"))
    h.advance(6)
    h.send(ev.StageReached(A, "server_start"))
    h.advance(20)
    h.send(ev.StageReached(A, "health"))
    h.advance(5)
    h.send(ev.ModelReady(A, "ep:a"))
    assert h.now == t + 35
    assert samples(h, ev.ObserveSwap) == [35.0]
    assert samples(h, ev.ObserveColdStart) == [0.0, 35.0]  # b's first start, then a's swap-in
    stages = {e.stage: e.seconds for e in h.effects(ev.ObserveStage) if e.model == A}  # type: ignore[attr-defined]
    assert stages == {"drain": 4.0, "staging": 6.0, "server_start": 20.0, "health": 5.0}


def test_idle_hour_is_not_counted_in_the_cold_start() -> None:
    h = Harness([make_model("a", idleTimeout="5m")], POLICY)
    h.request("a")
    h.send(ev.ModelReady(A, "ep"))
    h.finish(1)
    h.advance(300)  # idle timeout: stopped, Ready went False here (the Go start point)
    assert [e.model for e in h.effects(ev.StopModel)] == [A]  # type: ignore[attr-defined]
    h.send(ev.ModelStopped(A))
    ready_false_since = h.now
    h.advance(3600)
    h.request("a")
    h.advance(20)
    h.send(ev.ModelReady(A, "ep"))
    assert samples(h, ev.ObserveColdStart) == [0.0, 20.0]
    assert samples(h, ev.ObserveSwap) == []
    assert go_cold_start(ready_false_since, h.now) == 3620.0, "the Go formula would have reported the idle hour"


# The Ready instant's choice rule (``observed_ready``): the watch time when the transition was seen live, the
# condition's whole second only when it was not. Condition at 100 (stored "…:40Z": Ready happened in [100, 101)).

def test_a_transition_seen_live_is_the_watch_time_whenever_the_manager_noticed_it() -> None:
    assert observed_ready(seen=100.42, condition=100.0, watched=100.41) == 100.41
    assert observed_ready(seen=103.9, condition=100.0, watched=100.41) == 100.41, "noticed late: still the watch"
    assert observed_ready(seen=101.2, condition=100.0, watched=101.03) == 101.03, "Ready at the second's end"
    assert observed_ready(seen=5.0, condition=None, watched=4.2) == 4.2


def test_a_transition_not_seen_live_falls_back_to_the_condition() -> None:
    assert observed_ready(seen=100.42, condition=100.0, watched=None) == 100.42, "seen within the second"
    assert observed_ready(seen=103.9, condition=100.0, watched=None) == 100.5, "seen later: the second's middle"
    assert observed_ready(seen=99.0, condition=100.0, watched=None) == 99.0, "a condition from the future"
    assert observed_ready(seen=7.0, condition=None, watched=None) == 7.0


def test_a_watch_event_long_after_the_conditions_second_was_not_seen_live() -> None:
    """A reconnecting watch replays what it missed: delivered 1.3 s after the second ended is no witness."""
    assert observed_ready(seen=102.4, condition=100.0, watched=101.2) == 101.2
    assert observed_ready(seen=102.4, condition=100.0, watched=102.3) == 100.5
    assert observed_ready(seen=100.5, condition=100.0, watched=100.6) == 100.5, "never after it was seen"


def test_ready_time_uses_the_watch_and_never_ends_before_the_decision_or_a_witnessed_stage() -> None:
    act = Activation("m", decided_at=90.0)
    act.start(90.0)
    act.mark("health", 100.3)
    assert act.ready_time(seen=103.0, condition=100.0, watched=100.2) == 100.3
    assert act.ready_time(seen=103.0, condition=100.0, watched=100.7) == 100.7
    assert act.ready_time(seen=103.0, condition=60.0, watched=60.2) == 103.0, "an older pod's condition"


def test_a_restart_activation_is_decided_and_started_at_the_loss() -> None:
    act = Activation.for_restart("m", 50.0)
    assert (act.decided_at, act.started_at, act.restart, act.kind) == (50.0, 50.0, True, "cold_start")
    act.mark("staging", 55.0)
    act.mark("health", 57.0)
    obs = act.finish(58.0)
    assert obs.cold_start == 8.0 and obs.swap is None
    assert obs.stages == (StageSpan("server_start", 50, 55), StageSpan("staging", 55, 57), StageSpan("health", 57, 58))
