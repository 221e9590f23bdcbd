"""The manager's lifecycle lines (``flexinfer.lifecycle``): activation requested, ready with the total and the
stage breakdown, scaled to zero, failed with its message, a Ready model's server gone (``crash``) — one line per
transition, none on a repeat."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from flexinfer.api.model import ActivationStatus, Model, ModelStatus
from flexinfer.manager.lifecycle import LifecycleTracker, PassFacts
from flexinfer.runtime.observer import NullObserver
from support.resource_builders import make_model

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def step(tracker: LifecycleTracker, model: Model, status: ModelStatus, after: ModelStatus, seconds: float,
         ready: float | None = None) -> ModelStatus:
    facts = PassFacts(ready_condition_at=T0 + timedelta(seconds=ready) if ready is not None else None)
    tracker.observe(model.model_copy(update={"status": status}), after, T0 + timedelta(seconds=seconds), facts)
    return after


def test_cold_start_stop_and_failure_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="flexinfer.lifecycle")
    tracker, model = LifecycleTracker(NullObserver()), make_model("m")
    act = ActivationStatus(kind="cold_start", decided_at=T0)
    status = ModelStatus(phase="Idle")
    status = step(tracker, model, status, ModelStatus(phase="Pending", activation=act), 0)
    status = step(tracker, model, status, ModelStatus(phase="Loading", activation=act,
                                                       loading_substage="LoadingWeights"), 1.0)
    status = step(tracker, model, status, ModelStatus(phase="Loading", activation=act,
                                                       loading_substage="HealthCheckPending"), 4.0)
    status = step(tracker, model, status, ModelStatus(phase="Ready"), 5.0, ready=5.0)
    status = step(tracker, model, status, ModelStatus(phase="Ready"), 6.0)
    status = step(tracker, model, status, ModelStatus(phase="Idle"), 60.0)
    step(tracker, model, status, ModelStatus(phase="Failed", message="image pull failed"), 70.0)
    events = [(r.__dict__["event"], r.levelname) for r in caplog.records]
    assert events == [("activation_requested", "INFO"), ("ready", "INFO"), ("stopped", "INFO"),
                      ("failed", "WARNING")]
    ready = caplog.records[1]
    assert ready.getMessage() == ("model default/m: ready after 5.000s (cold start: server_start 1.000s, "
                                  "staging 3.000s, health 1.000s)")
    assert ready.__dict__["stages"] == {"server_start": 1.0, "staging": 3.0, "health": 1.0}
    assert caplog.records[3].getMessage() == "model default/m: failed: image pull failed"


def test_a_ready_model_that_goes_with_its_replica_kept_is_logged_as_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="flexinfer.lifecycle")
    tracker, model = LifecycleTracker(NullObserver()), make_model("m")
    restart = ActivationStatus(kind="cold_start", decided_at=T0)
    after = ModelStatus(phase="Loading", activation=restart, message="model running, readiness probe not passing yet")
    status = step(tracker, model, ModelStatus(phase="Ready"), after, 0)
    step(tracker, model, status, ModelStatus(phase="Ready"), 4.0, ready=4.0)
    events = [r.__dict__["event"] for r in caplog.records]
    assert events == ["crash", "ready"]
    assert caplog.records[0].getMessage() == ("model default/m: not ready any more (model running, readiness probe "
                                              "not passing yet) with its replicas kept: its server restarts")
    assert caplog.records[1].__dict__["seconds"] == 4.0
