"""Tests for flexinfer.core.phases: the transition table and condition upsert semantics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flexinfer.core.errors import IllegalTransitionError
from flexinfer.core.phases import PHASES, check_transition, ready_condition, set_condition

T0 = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("old", "new"), [("Idle", "Preempted"), ("Pending", "Preempted"), ("Failed", "Preempted")])
def test_illegal_transitions_raise(old: str, new: str) -> None:
    with pytest.raises(IllegalTransitionError, match=f"{old} -> {new}"):
        check_transition(old, new)


def test_legal_paths_and_unknown_phase() -> None:
    for old, new in [(None, "Idle"), ("Idle", "Pending"), ("Pending", "Loading"), ("Loading", "Ready"),
                     ("Ready", "Preempted"), ("Preempted", "Loading"), ("Loading", "Failed"), ("Failed", "Pending")]:
        check_transition(old, new)
    for phase in PHASES:
        check_transition(phase, phase)
    with pytest.raises(IllegalTransitionError):
        check_transition("Idle", "Sleeping")


def test_ready_condition_reasons() -> None:
    assert ready_condition("Ready") == ("True", "BackendReady")
    assert ready_condition("Preempted") == ("False", "Preempted")
    assert ready_condition("Loading") == ("False", "StartingBackend")
    assert ready_condition("Idle") == ("False", "WaitingForActivation")


def test_last_transition_time_only_moves_when_status_flips() -> None:
    conds = set_condition([], "Ready", "False", "WaitingForActivation", now=T0)
    assert conds[0].last_transition_time == T0
    same = set_condition(conds, "Ready", "False", "WaitingForActivation", now=T0 + timedelta(minutes=1))
    assert same is conds
    reason = set_condition(conds, "Ready", "False", "StartingBackend", message="pulling", now=T0 + timedelta(hours=1))
    assert reason[0].reason == "StartingBackend" and reason[0].last_transition_time == T0
    flipped = set_condition(reason, "Ready", "True", "BackendReady", now=T0 + timedelta(hours=2))
    assert flipped[0].last_transition_time == T0 + timedelta(hours=2)
    other = set_condition(flipped, "Cached", "True", "BackendReady", now=T0)
    assert [c.type for c in other] == ["Ready", "Cached"]
