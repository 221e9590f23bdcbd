"""Tests for flexinfer.core.election (spec §3.3 decision order, tie-breaks, §3.4 lease park-and-hold)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer.api.gpulease import GPULease
from flexinfer.api.model import Model
from flexinfer.core.election import (
    WAITING_SINCE_ANNOTATION,
    ElectionPolicy,
    Member,
    active_lease,
    elect,
    group_cooldown,
    parse_waiting_since,
    waiting_since_of,
)

NOW = datetime(2025, 1, 1, tzinfo=UTC)
GO = ElectionPolicy(max_wait=None)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def m(name: str, **kw: Any) -> Member:
    return Member(name=name, **kw)


def test_tie_breaks_priority_then_recency_then_name() -> None:
    assert elect([m("b"), m("a")], NOW, GO).leader == "a"
    assert elect([m("a", last_active=ago(50)), m("b", last_active=ago(10))], NOW, GO).leader == "b"
    assert elect([m("a"), m("z", priority=101)], NOW, GO).leader == "z"


def test_force_promotion_beats_cooldown_and_ready() -> None:
    members = [m("a", phase="Ready", state="Active", preempted_at=ago(1)), m("b", force=True, priority=1)]
    result = elect(members, NOW, GO)
    assert (result.leader, result.reason) == ("b", "force_promotion")
    assert result.members["a"].preempt_now and result.members["a"].preempted_by == "b"


def test_cooldown_keeps_the_active_member_using_the_max_member_cooldown() -> None:
    members = [m("a", state="Active", phase="Ready"), m("b", priority=900, phase="Idle", last_active=ago(1),
                                                        preempted_at=ago(400), swap_cooldown=600)]
    assert group_cooldown(members, GO) == 600
    assert elect(members, NOW, GO).reason == "swap_cooldown"
    assert elect([members[0], replace(members[1], swap_cooldown=None)], NOW, GO).leader == "b"


def test_in_flight_cold_start_is_protected() -> None:
    members = [m("a", state="Active", phase="Loading", last_active=ago(200)), m("b", priority=900, last_active=ago(1))]
    assert elect(members, NOW, GO).reason == "cold_start_in_flight"


def test_demand_preemption_rules() -> None:
    ready = m("r", phase="Ready", state="Active", priority=100, last_active=ago(10))
    higher = m("d", phase="Idle", priority=200, last_active=ago(5))
    equal = replace(higher, priority=100)
    assert elect([ready, higher], NOW, GO).reason == "demand_preemption"
    assert elect([ready, equal], NOW, GO).leader == "r", "a busy ready leader keeps the GPU against equal priority"
    idle_ready = replace(ready, last_active=ago(121))
    assert elect([idle_ready, equal], NOW, GO).leader == "d"


def test_a_member_idle_past_its_own_timeout_is_not_restarted_ahead_of_a_waiting_one() -> None:
    """tiny-b (priority 200, idle timeout 15 s) served a request 30 s ago and was scaled to zero as idle; a request
    now waits for tiny-a. The GPU goes to tiny-a, not to tiny-b, which nobody asked for since."""
    lapsed = m("tiny-b", priority=200, phase="Idle", last_active=ago(30), idle_timeout=15)
    waiting = m("tiny-a", priority=100, phase="Idle", last_active=ago(1), waiting_since=ago(1), idle_timeout=15)
    assert (elect([lapsed, waiting], NOW, GO).leader, elect([lapsed, waiting], NOW, GO).reason) == ("tiny-a", "recent")
    assert elect([replace(lapsed, waiting_since=ago(1)), waiting], NOW, GO).leader == "tiny-b", "its own request waits"
    assert elect([replace(lapsed, idle_timeout=600), waiting], NOW, GO).leader == "tiny-b", "still warm: Go order"
    ready = m("r", phase="Ready", state="Active", priority=100, last_active=ago(200))
    assert elect([ready, lapsed], NOW, GO).leader == "r", "a lapsed member is no demand against a Ready one"
    # Right after a swap (cooldown running), the winner served its request and idled out: the card is empty.
    leader = replace(lapsed, state="Active")
    loser = replace(waiting, phase="Preempted", state="Preempted", preempted_at=ago(60))
    assert elect([leader, loser], NOW, GO).leader == "tiny-a"
    assert elect([replace(leader, phase="Ready"), loser], NOW, GO).reason == "swap_cooldown", "still serving"
    assert elect([ready, replace(lapsed, idle_timeout=None)], NOW, GO).reason == "demand_preemption"


def test_warm_primary_reclaims_from_idle_leader_and_categories() -> None:
    idle = m("r", phase="Ready", priority=500, last_active=ago(200))
    primary = m("p", warm_primary=True, priority=1)
    assert elect([idle, primary], NOW, GO).reason == "warm_primary_reclaim"
    assert elect([m("x", can_take_demand=False, priority=900), m("y")], NOW, GO).reason == "runnable"
    assert elect([m("x", can_take_demand=False)], NOW, GO).reason == "fallback"
    assert elect([m("x", min_replicas=1, priority=1), m("y")], NOW, GO).reason == "warm_pinned"


def test_starvation_bound_overrides_priority_and_cooldown() -> None:
    busy = m("hi", phase="Ready", state="Active", priority=900, last_active=ago(1), preempted_at=ago(10))
    low = m("lo", priority=1, waiting_since=ago(301))
    assert elect([busy, low], NOW, ElectionPolicy(max_wait=300)).leader == "lo"
    assert elect([busy, low], NOW, GO).leader == "hi"


def test_queue_positions_and_states() -> None:
    result = elect([m("a", phase="Ready", priority=1), m("b", priority=5), m("c", priority=9, last_active=ago(1))],
                   NOW, GO)
    assert result.leader == "c"
    assert result.members["b"].queue_position == 1 and result.members["a"].queue_position == 2
    assert result.members["a"].state == "Preempted" and result.members["b"].state == "Queued"


def lease(priority: int | None = None, expires: datetime | None = None) -> GPULease:
    return GPULease.model_validate({"metadata": {"name": "l"}, "spec": {
        "group": "g", "owner": "finetune", "priority": priority, "expiresAt": expires}})


def test_lease_parks_the_group() -> None:
    members = [m("a", phase="Ready", priority=100)]
    parked = elect(members, NOW, GO, lease())
    assert parked.leader is None and parked.members["a"].preempted_by == "gpu-lease/finetune"
    assert elect(members, NOW, GO, lease(priority=100)).leader == "a", "priority gate: members not strictly below"
    assert elect(members, NOW, GO, lease(priority=101)).leader is None
    assert active_lease([lease(expires=ago(1))], "g", NOW) is None
    assert active_lease([lease(expires=NOW + timedelta(seconds=1))], "g", NOW) is not None


def test_member_from_model() -> None:
    model = Model.model_validate({"metadata": {"name": "q"}, "spec": {
        "backend": "vllm", "source": "hf://x/y", "gpu": {"shared": "g", "priority": 7, "swapCooldown": "10m"},
        "serverless": {"coldStartTimeout": "90s", "idleTimeout": "2m"}},
        "status": {"phase": "Ready", "cache": {"ready": False}}})
    member = Member.from_model(model)
    assert (member.priority, member.swap_cooldown, member.cold_start_timeout, member.idle_timeout) == (7, 600, 90, 120)
    assert not member.can_take_demand


def test_the_wait_marker_parses_rfc3339_with_an_offset_only() -> None:
    assert parse_waiting_since("2025-01-02T03:04:05.123456Z") == datetime(2025, 1, 2, 3, 4, 5, 123456, UTC)
    assert parse_waiting_since(" 2025-01-02T04:04:05+01:00 ") == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    for garbage in ("soon", "", "2025-01-02T03:04:05"):
        with pytest.raises(ValueError):
            parse_waiting_since(garbage)

    def marked(value: str | None) -> Model:
        annotations = {} if value is None else {WAITING_SINCE_ANNOTATION: value}
        return Model.model_validate({"metadata": {"name": "q", "annotations": annotations},
                                     "spec": {"backend": "vllm", "source": "hf://x/y"}})
    assert waiting_since_of(marked("2025-01-02T03:04:05Z")) == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert waiting_since_of(marked("garbage")) is None and waiting_since_of(marked(None)) is None
