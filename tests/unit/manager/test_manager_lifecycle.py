"""Lifecycle metrics of the Kubernetes engine: phase changes once, cold start/swap when Ready."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flexinfer.api.model import ActivationStatus, Model, ModelStatus
from flexinfer.manager.lifecycle import LifecycleTracker
from support.resource_builders import make_model

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        def record(model: Model, *args: object) -> None:
            self.calls.append((name, model.name, *map(str, args)))
        return record


def with_status(model: Model, **fields: object) -> Model:
    return model.model_copy(update={"status": model.status.model_copy(update=fields)})


def test_phase_is_reported_on_first_sight_and_on_change_only() -> None:
    sink = Recorder()
    tracker = LifecycleTracker(sink)
    model = with_status(make_model("m"), phase="Idle")
    tracker.observe(model, ModelStatus(phase="Idle"), T0)
    tracker.observe(model, ModelStatus(phase="Idle"), T0)
    tracker.observe(model, ModelStatus(phase="Pending"), T0)
    assert [c for c in sink.calls if c[0] == "phase_changed"] == [
        ("phase_changed", "m", "None", "Idle"), ("phase_changed", "m", "Idle", "Pending")]


def test_cold_start_and_swap_are_observed_from_the_persisted_decision() -> None:
    sink = Recorder()
    tracker = LifecycleTracker(sink)
    act = ActivationStatus(kind="swap", decided_at=T0, preempted="low")
    loading = with_status(make_model("high"), phase="Loading", activation=act)
    tracker.observe(loading, ModelStatus(phase="Ready"), T0 + timedelta(seconds=7))
    observed = {c[0]: float(c[2]) for c in sink.calls if c[0] in ("cold_start", "swap")}
    assert observed == {"cold_start": 7.0, "swap": 7.0}
    assert not [c for c in sink.calls if c[0] == "stage"], "stages under way before the restart are unknown"


def test_an_abandoned_activation_observes_nothing() -> None:
    sink = Recorder()
    tracker = LifecycleTracker(sink)
    act = ActivationStatus(kind="cold_start", decided_at=T0)
    pending = with_status(make_model("m"), phase="Pending", activation=act)
    tracker.observe(pending, ModelStatus(phase="Idle"), T0 + timedelta(seconds=3))
    assert not [c for c in sink.calls if c[0] in ("cold_start", "swap")]
