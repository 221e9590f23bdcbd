"""Scripted reconcile timelines through the Kubernetes engine's ``LifecycleTracker``, with explicit times,
asserting the total and EVERY stage sample of each activation:

- a swap whose incumbent drains 38.0 s (no loading substage seen) — the drain sample used to swallow the
  whole swap (40.17 s) and there was no ``server_start`` sample;
- a swap with a 32 ms drain (it used to record 2.61 s of drain);
- a swap with loading substages, one seen before the drain ended;
- Ready while the manager was down (restart) or lagging: the Ready instant comes from the pod's Ready
  condition (whole seconds), not from when the manager noticed (it used to add the downtime);
- a cold start, fresh and rebuilt after a restart mid-load (stages under way at the restart: no sample);
- Ready seen live: the moment the manager's watch delivered the pod's transition, not the condition's second;
- a crash restart: a Ready model whose server went away with its replica kept, measured from the moment the
  manager saw it go (the restart activation the plan opens) to Ready again, with every stage.

Each pass gives the tracker what the reconciler would: the member's status before and after, the pass
time, and ``PassFacts`` (the incumbent's scale-down instant; the Ready condition's time; when the watch showed
it turn True)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from flexinfer.api.model import ActivationStatus, LoadingSubstage, Model, ModelStatus, Phase
from flexinfer.manager.lifecycle import LifecycleTracker, PassFacts
from support.resource_builders import make_model

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Sink:
    """Records the samples the tracker emits, per model."""

    def __init__(self) -> None:
        self.totals: dict[tuple[str, str], list[float]] = {}
        self.stages: dict[str, dict[str, float]] = {}

    def cold_start(self, model: Model, seconds: float) -> None:
        self.totals.setdefault((model.name, "cold_start"), []).append(round(seconds, 6))

    def swap(self, model: Model, seconds: float) -> None:
        self.totals.setdefault((model.name, "swap"), []).append(round(seconds, 6))

    def stage(self, model: Model, stage: str, seconds: float) -> None:
        stages = self.stages.setdefault(model.name, {})
        assert stage not in stages, f"two {stage} samples for {model.name}"
        stages[stage] = round(seconds, 6)

    def phase_changed(self, model: Model, old: str | None, new: str) -> None:
        pass

    def group_state(self, model: Model, state: str) -> None:
        pass

    def preempted(self, model: Model, by: str) -> None:
        pass

    def forgotten(self, model: Model) -> None:
        pass


@dataclass
class Member:
    """One model's persisted status across passes (what the manager wrote last)."""

    model: Model
    status: ModelStatus = field(default_factory=ModelStatus)

    def step(self, tracker: LifecycleTracker, now: float, phase: Phase, *, activation: ActivationStatus | None = None,
             substage: LoadingSubstage | None = None, stopped_at: float | None = None,
             ready_condition: float | None = None, ready_seen: float | None = None) -> None:
        after = ModelStatus(phase=phase, activation=activation, loading_substage=substage)
        before = self.model.model_copy(update={"status": self.status})
        facts = PassFacts(stopped_at=at(stopped_at) if stopped_at is not None else None,
                          ready_condition_at=at(ready_condition) if ready_condition is not None else None,
                          ready_seen_at=at(ready_seen) if ready_seen is not None else None)
        tracker.observe(before, after, at(now), facts)
        self.status = after


def swap_activation(demand: float | None = None) -> ActivationStatus:
    return ActivationStatus(kind="swap", decided_at=T0, preempted="low",
                            demand_since=at(demand) if demand is not None else None)


def group() -> tuple[Sink, LifecycleTracker, Member, Member]:
    sink = Sink()
    tracker = LifecycleTracker(sink)  # type: ignore[arg-type]
    low = Member(make_model("low"), ModelStatus(phase="Ready"))
    high = Member(make_model("high"), ModelStatus(phase="Idle"))
    return sink, tracker, low, high


def test_a_38s_drain_without_substages_is_drain_then_server_start() -> None:
    sink, tracker, low, high = group()
    act = swap_activation(demand=-1.5)
    low.step(tracker, 0, "Preempted")  # in-flight requests: the replica is held
    high.step(tracker, 0, "Pending", activation=act)
    low.step(tracker, 38.0, "Preempted", stopped_at=38.0)  # the last report went: scaled to zero
    high.step(tracker, 38.0, "Pending", activation=act)
    high.step(tracker, 39.0, "Loading", activation=act)  # pod state unknown to the manager: no substage
    high.step(tracker, 40.17, "Ready", ready_condition=40.0)
    assert sink.totals == {("high", "cold_start"): [40.17], ("high", "swap"): [40.17]}
    assert sink.stages == {"high": {"queue": 1.5, "drain": 38.0, "server_start": 2.17}}


def test_a_32ms_drain_is_32ms() -> None:
    sink, tracker, low, high = group()
    act = swap_activation()
    low.step(tracker, 0, "Preempted", stopped_at=0.032)  # nothing in flight: scaled down in the same pass
    high.step(tracker, 0, "Pending", activation=act)
    high.step(tracker, 2.61, "Ready", ready_condition=2.0)
    assert sink.totals == {("high", "cold_start"): [2.61], ("high", "swap"): [2.61]}
    assert sink.stages == {"high": {"drain": 0.032, "server_start": 2.578}}


def test_substages_count_from_the_drain_end_even_when_one_was_seen_during_the_drain() -> None:
    sink, tracker, low, high = group()
    act = swap_activation()
    low.step(tracker, 0, "Preempted")
    high.step(tracker, 0, "Pending", activation=act)
    high.step(tracker, 0.5, "Loading", activation=act, substage="Initializing")  # pod pending for the GPU
    low.step(tracker, 38.0, "Preempted", stopped_at=38.0)
    high.step(tracker, 38.0, "Loading", activation=act, substage="Initializing")
    high.step(tracker, 40.0, "Loading", activation=act, substage="LoadingWeights")
    high.step(tracker, 45.0, "Loading", activation=act, substage="HealthCheckPending")
    high.step(tracker, 47.3, "Ready", ready_condition=47.0)
    assert sink.totals == {("high", "cold_start"): [47.3], ("high", "swap"): [47.3]}
    assert sink.stages == {"high": {"drain": 38.0, "server_start": 2.0, "staging": 5.0, "health": 2.3}}


def test_ready_while_the_manager_was_down_is_taken_from_the_pod_condition() -> None:
    sink, tracker, low, high = group()
    act = swap_activation(demand=-2.0)
    low.step(tracker, 0, "Preempted", stopped_at=0.01)
    high.step(tracker, 0, "Pending", activation=act)
    high.step(tracker, 0.2, "Loading", activation=act, substage="Initializing")
    # The manager dies at 0.25; the pod turns Ready at 0.43 (condition stored as 12:00:00); a new manager
    # process sees it at 3.89.
    sink2 = Sink()
    restarted = LifecycleTracker(sink2)  # type: ignore[arg-type]
    high.step(restarted, 3.89, "Ready", ready_condition=0.0)
    assert sink2.totals == {("high", "cold_start"): [0.5], ("high", "swap"): [0.5]}
    assert sink2.stages == {"high": {"queue": 2.0}}, "the drain end and the stages died with the old process"
    assert sink.totals == {} and sink.stages == {}


def test_ready_seen_late_by_a_lagging_manager_keeps_every_stage() -> None:
    sink, tracker, low, high = group()
    act = swap_activation()
    low.step(tracker, 0, "Preempted", stopped_at=0.01)
    high.step(tracker, 0, "Pending", activation=act)
    high.step(tracker, 1.2, "Loading", activation=act, substage="LoadingWeights")
    high.step(tracker, 6.0, "Ready", ready_condition=2.0)  # Ready at 2.43, noticed at 6.0
    assert sink.totals == {("high", "cold_start"): [2.5], ("high", "swap"): [2.5]}
    assert sink.stages == {"high": {"drain": 0.01, "server_start": 1.19, "staging": 1.3}}


def test_a_condition_from_an_older_pod_or_from_the_future_is_not_the_ready_instant() -> None:
    for condition in (-30.0, 9.0):
        sink = Sink()
        tracker = LifecycleTracker(sink)  # type: ignore[arg-type]
        member = Member(make_model("m"), ModelStatus(phase="Idle"))
        act = ActivationStatus(kind="cold_start", decided_at=T0)
        member.step(tracker, 0, "Pending", activation=act)
        member.step(tracker, 5.0, "Ready", ready_condition=condition)
        assert sink.totals == {("m", "cold_start"): [5.0]}
        assert sink.stages == {"m": {"server_start": 5.0}}


def test_a_fresh_cold_start_measures_every_stage() -> None:
    sink = Sink()
    tracker = LifecycleTracker(sink)  # type: ignore[arg-type]
    member = Member(make_model("m"), ModelStatus(phase="Idle"))
    act = ActivationStatus(kind="cold_start", decided_at=T0, demand_since=at(-0.2))
    member.step(tracker, 0, "Pending", activation=act)
    member.step(tracker, 1.0, "Loading", activation=act, substage="ImagePulling")
    member.step(tracker, 4.0, "Loading", activation=act, substage="LoadingWeights")
    member.step(tracker, 9.0, "Loading", activation=act, substage="Compiling")
    member.step(tracker, 12.0, "Loading", activation=act, substage="HealthCheckPending")
    member.step(tracker, 12.6, "Ready", ready_condition=12.0)
    assert sink.totals == {("m", "cold_start"): [12.6]}
    # Compiling is a server_start substage: its 3 s join the 4 s before the weights (one sample, 7 s).
    assert sink.stages == {"m": {"queue": 0.2, "server_start": 7.0, "staging": 5.0, "health": 0.6}}


@pytest.mark.parametrize("restart_at", [4.5, 8.0])
def test_a_cold_start_rebuilt_mid_load_samples_only_stages_it_saw_begin(restart_at: float) -> None:
    sink = Sink()
    member = Member(make_model("m"), ModelStatus(phase="Idle"))
    act = ActivationStatus(kind="cold_start", decided_at=T0)
    member.step(LifecycleTracker(Sink()), 0, "Pending", activation=act)  # the first process
    member.status = ModelStatus(phase="Loading", activation=act, loading_substage="LoadingWeights")
    restarted = LifecycleTracker(sink)  # type: ignore[arg-type]
    member.step(restarted, restart_at, "Loading", activation=act, substage="LoadingWeights")
    member.step(restarted, 10.0, "Loading", activation=act, substage="HealthCheckPending")
    member.step(restarted, 12.4, "Ready", ready_condition=12.0)
    assert sink.totals == {("m", "cold_start"): [12.4]}
    assert sink.stages == {"m": {"health": 2.4}}


def test_a_ready_transition_seen_live_ends_at_the_watch_time_not_at_the_conditions_second() -> None:
    sink = Sink()
    tracker = LifecycleTracker(sink)  # type: ignore[arg-type]
    member = Member(make_model("m"), ModelStatus(phase="Idle"))
    act = ActivationStatus(kind="cold_start", decided_at=T0)
    member.step(tracker, 0, "Pending", activation=act)
    member.step(tracker, 1.0, "Loading", activation=act, substage="HealthCheckPending")
    # The pod turned Ready at 2.804 (condition "…:02Z"); the watch delivered it at 2.811; the Deployment's
    # readyReplicas came 40 ms later and the pass ran at 3.27 (the old answer: the second's middle, 2.5).
    member.step(tracker, 3.27, "Ready", ready_condition=2.0, ready_seen=2.811)
    assert sink.totals == {("m", "cold_start"): [2.811]}
    assert sink.stages == {"m": {"server_start": 1.0, "health": 1.811}}


def test_a_crash_restart_is_measured_from_the_moment_the_manager_saw_the_model_go() -> None:
    sink = Sink()
    tracker = LifecycleTracker(sink)  # type: ignore[arg-type]
    member = Member(make_model("m"), ModelStatus(phase="Ready"))
    restart = ActivationStatus(kind="cold_start", decided_at=at(100.0))  # opened by the plan: ``restarting``
    member.step(tracker, 100.0, "Loading", activation=restart, substage="Initializing")  # OOM-killed, restarting
    member.step(tracker, 104.0, "Loading", activation=restart, substage="HealthCheckPending")
    member.step(tracker, 105.4, "Ready", ready_condition=105.0, ready_seen=105.21)
    assert sink.totals == {("m", "cold_start"): [5.21]}
    assert sink.stages == {"m": {"server_start": 4.0, "health": 1.21}}
