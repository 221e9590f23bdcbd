"""One member's reconcile decisions: preemption, drain gate, activation record, swap source, wake-ups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer.api.base import Condition
from flexinfer.api.model import ActivationStatus, Model, SharedGroupStatus
from flexinfer.core.election import MemberDecision
from flexinfer.core.model_status.build import DeploymentFacts
from flexinfer.core.model_status.plan import (
    WAKE_MARGIN,
    ManagerPolicy,
    MemberInputs,
    activation_clock,
    busy_proxies,
    finish_member,
    next_activation,
    next_wakeup,
    plan_member,
    swap_source,
)
from support.resource_builders import make_model

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = ManagerPolicy(drain_timeout=60.0, busy_ttl=30.0)


def member(name: str, priority: int = 100, **status: Any) -> Model:
    model = make_model(name, gpu={"vendor": "amd", "shared": "g", "priority": priority})
    return model.model_copy(update={"status": model.status.model_copy(update=status)})


LOSE = MemberDecision("Preempted", 1, "high", True)


def test_busy_proxies_ignore_stale_and_foreign_annotations() -> None:
    annotations = {"inflight.flexinfer.ai/p1": "2026-01-01T00:00:10Z",
                   "inflight.flexinfer.ai/p2": "2025-12-31T23:00:00Z",
                   "inflight.flexinfer.ai/p3": "garbage", "other": "2026-01-01T00:00:10Z"}
    assert busy_proxies(annotations, T0 + timedelta(seconds=20), 30) == ["p1"]


def test_a_ready_loser_is_preempted_and_scaled_to_zero() -> None:
    loser = member("low", phase="Ready")
    plan = plan_member(MemberInputs(loser, DeploymentFacts(1, 1, 0), LOSE), T0, POLICY)
    assert plan.replicas == 0 and plan.preempt_now
    assert plan.shared is not None and (plan.shared.state, plan.shared.preempted_at) == ("Preempted", T0)


def test_the_drain_gate_holds_the_replica_while_proxies_report_requests_until_the_deadline() -> None:
    inputs = MemberInputs(member("low", phase="Ready"), DeploymentFacts(1, 1, 0), LOSE, busy=True)
    held = plan_member(inputs, T0, POLICY)
    assert held.replicas == 1
    preempted = member("low", phase="Preempted", shared_group=SharedGroupStatus(
        group_name="g", state="Preempted", preempted_by="high", preempted_at=T0))
    later = MemberInputs(preempted, DeploymentFacts(1, 1, 0), MemberDecision("Preempted", 1, "high", False), busy=True)
    assert plan_member(later, T0 + timedelta(seconds=61), POLICY).replicas == 0
    idle = MemberInputs(preempted, DeploymentFacts(1, 1, 0), MemberDecision("Preempted", 1, "high", False))
    assert plan_member(idle, T0 + timedelta(seconds=5), POLICY).replicas == 0


def test_the_winner_of_a_swap_opens_a_swap_activation_at_the_decision() -> None:
    winner = member("high", 200, phase="Idle", last_active_time=T0 - timedelta(seconds=1))
    inputs = MemberInputs(winner, DeploymentFacts(0, 0, 0), MemberDecision("Active", 0, "", False),
                          swap=("low", T0 - timedelta(seconds=2)))
    plan = plan_member(inputs, T0, POLICY)
    assert plan.replicas == 1
    finished = finish_member(inputs, plan, DeploymentFacts(1, 0, 0), None, T0)
    act = finished.activation
    assert finished.phase == "Pending" and act is not None
    assert (act.kind, act.decided_at, act.preempted) == ("swap", T0 - timedelta(seconds=2), "low")
    assert act.demand_since is None  # demand after the decision is not queue time


def test_activation_lifecycle_open_keep_clear() -> None:
    fresh = make_model("m")
    opened = next_activation(MemberInputs(fresh, None), 1, "Pending", T0)
    assert opened is not None and (opened.kind, opened.decided_at) == ("cold_start", T0)
    running = fresh.model_copy(update={"status": fresh.status.model_copy(update={"activation": opened,
                                                                                 "phase": "Pending"})})
    kept = next_activation(MemberInputs(running, DeploymentFacts(1, 0, 0)), 1, "Loading", T0 + timedelta(seconds=3))
    assert kept == opened
    assert next_activation(MemberInputs(running, DeploymentFacts(1, 0, 0)), 0, "Idle", T0) is None
    assert next_activation(MemberInputs(running, DeploymentFacts(1, 1, 0)), 1, "Ready", T0) is None


def test_a_ready_model_that_stops_being_ready_with_its_replicas_kept_opens_a_restart_activation() -> None:
    """A crash, an OOM kill, a replaced pod: the way back to Ready is measured from the moment it is seen,
    with no queue time (the last request served is not a wait)."""
    model = make_model("m")
    ready = model.model_copy(update={"status": model.status.model_copy(update={
        "phase": "Ready", "last_active_time": T0 - timedelta(seconds=40)})})
    restarted = DeploymentFacts(1, 0, 1)
    for phase in ("Loading", "Pending"):
        act = next_activation(MemberInputs(ready, restarted), 1, phase, T0)
        assert act == ActivationStatus(kind="cold_start", decided_at=T0), phase
    assert next_activation(MemberInputs(ready, restarted), 0, "Idle", T0) is None, "scaled to zero: no restart"
    assert next_activation(MemberInputs(ready, restarted), 1, "Failed", T0) is None, "a failure ends it"
    assert next_activation(MemberInputs(ready, DeploymentFacts(1, 1, 0)), 1, "Ready", T0) is None
    loading = ready.model_copy(update={"status": ready.status.model_copy(update={"phase": "Loading"})})
    assert next_activation(MemberInputs(loading, restarted), 1, "Loading", T0) is None, "only at the flip"


def test_activation_clock_survives_a_restart_through_status() -> None:
    model = make_model("m")
    act = ActivationStatus(kind="swap", decided_at=T0, demand_since=T0 - timedelta(seconds=4), preempted="x")
    model = model.model_copy(update={"status": model.status.model_copy(update={"activation": act})})
    clock = activation_clock(model)
    assert clock is not None
    done = clock.finish(T0.timestamp() + 12.5)
    assert (done.cold_start, done.swap) == (12.5, 12.5)
    assert [s.stage for s in done.stages] == ["queue"], "the drain's end was not seen: no drain sample"


def test_swap_source_is_consumed_once_the_winner_changed_readiness() -> None:
    preempted = SharedGroupStatus(group_name="g", state="Preempted", preempted_by="high", preempted_at=T0)
    before = Condition(type="Ready", status="False", reason="WaitingForActivation",
                       last_transition_time=T0 - timedelta(minutes=1))
    winner = member("high", 200, conditions=[before])
    assert swap_source(winner, [("low", preempted), ("high", None)]) == ("low", T0)
    after = before.model_copy(update={"status": "True", "last_transition_time": T0 + timedelta(seconds=30)})
    assert swap_source(member("high", 200, conditions=[after]), [("low", preempted)]) is None


def test_next_wakeup_is_the_earliest_time_driven_change() -> None:
    model = make_model("m", serverless={"idleTimeout": "30s"})
    model = model.model_copy(update={"status": model.status.model_copy(update={"last_active_time": T0})})
    wake = next_wakeup([model], [], T0 + timedelta(seconds=1), POLICY)
    assert wake is not None and timedelta(seconds=30) <= wake - T0 < timedelta(seconds=31)
    assert next_wakeup([make_model("idle")], [], T0, POLICY) is None


def test_the_idle_timer_also_wakes_after_ready_and_when_an_in_flight_report_goes_stale() -> None:
    """The idle clock starts again at Ready, and a proxy that stopped refreshing its in-flight report (it crashed)
    stops counting after ``busy_ttl``: both are time-driven changes of the replica decision."""
    ready = Condition(type="Ready", status="True", reason="BackendReady", last_transition_time=T0)
    model = make_model("m", serverless={"idleTimeout": "15s"})
    model = model.model_copy(update={"status": model.status.model_copy(update={
        "phase": "Ready", "last_active_time": T0 - timedelta(seconds=50), "conditions": [ready]})})
    wake = next_wakeup([model], [], T0 + timedelta(seconds=11), POLICY)
    assert wake is not None and timedelta(seconds=15) <= wake - T0 < timedelta(seconds=16)
    reported = model.model_copy(update={"metadata": model.metadata.model_copy(update={
        "annotations": {"inflight.flexinfer.ai/p1": "2026-01-01T00:00:10Z"}})})
    wake = next_wakeup([reported], [], T0 + timedelta(seconds=11), POLICY)
    assert wake is not None and timedelta(seconds=15) <= wake - T0 < timedelta(seconds=16)
    wake = next_wakeup([reported], [], T0 + timedelta(seconds=16), POLICY)
    assert wake is not None and timedelta(seconds=40) <= wake - T0 < timedelta(seconds=41)


def test_a_model_that_never_idles_out_arms_no_idle_timer_at_ready() -> None:
    """Not serverless (or never active): the replica count does not read the idle time, so Ready arms nothing."""
    ready = Condition(type="Ready", status="True", reason="BackendReady", last_transition_time=T0)
    for serverless in ({"enabled": False}, {"idleTimeout": "15s"}):
        model = make_model("m", serverless=serverless)
        model = model.model_copy(update={"status": model.status.model_copy(update={
            "phase": "Ready", "conditions": [ready]})})
        assert next_wakeup([model], [], T0 + timedelta(seconds=1), POLICY) is None


def test_a_group_holder_wakes_the_group_when_its_hold_ends() -> None:
    """The election decides again when a Ready holder's hold (``min_hold``, or a longer ``gpu.swapCooldown``)
    is over: a waiting member may take an idle holder's GPU then, without any other event."""
    ready = Condition(type="Ready", status="True", reason="BackendReady", last_transition_time=T0)
    holder = member("b", 200, phase="Ready", conditions=[ready])
    waiting = member("a", 100, phase="Preempted")
    wake = next_wakeup([holder, waiting], [], T0 + timedelta(seconds=1), POLICY)
    assert wake is not None and wake - T0 == timedelta(seconds=POLICY.election.min_hold) + WAKE_MARGIN
    longer = make_model("a", gpu={"vendor": "amd", "shared": "g", "swapCooldown": "40s"})
    wake = next_wakeup([holder, longer], [], T0 + timedelta(seconds=1), POLICY)
    assert wake is not None and wake - T0 == timedelta(seconds=40) + WAKE_MARGIN
