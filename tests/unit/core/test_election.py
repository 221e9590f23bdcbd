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
    group_hold,
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


def test_force_promotion_beats_the_hold_and_ready() -> None:
    members = [m("a", phase="Ready", state="Active", ready_since=ago(1)), m("b", force=True, priority=1)]
    result = elect(members, NOW, GO)
    assert (result.leader, result.reason) == ("b", "force_promotion")
    assert result.members["a"].preempt_now and result.members["a"].preempted_by == "b"


def test_the_hold_keeps_a_ready_holder_using_the_longest_member_swap_cooldown() -> None:
    holder = m("a", state="Active", phase="Ready", ready_since=ago(20))
    challenger = m("b", priority=900, phase="Idle", last_active=ago(1), waiting_since=ago(1), swap_cooldown=600)
    assert group_hold([holder, challenger], GO) == 600
    assert group_hold([holder], GO) == GO.min_hold == 15
    assert elect([holder, challenger], NOW, GO).reason == "min_hold"
    assert elect([holder, replace(challenger, swap_cooldown=None)], NOW, GO).leader == "b", "20 s > min_hold 15 s"
    assert elect([replace(holder, ready_since=ago(5)), replace(challenger, swap_cooldown=None)], NOW,
                 GO).reason == "min_hold"


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


@pytest.mark.parametrize("busy", [True, False])
def test_demand_from_before_the_holder_became_ready_does_not_take_the_gpu_from_it(busy: bool) -> None:
    """A manager restarted while flash-a, priority 100, holds the GPU Ready since 60 s and flash-b, priority 200,
    answered its last request 70 s ago, before flash-a took over: flash-b is inside Go's 2-minute demand window,
    but that demand was served, so flash-a keeps the GPU. A request for flash-b since flash-a became Ready (a Go
    proxy's ``lastActiveTime``, or a waiting request) takes it."""
    holder = m("flash-a", phase="Ready", state="Active", priority=100, last_active=ago(20), ready_since=ago(60),
               busy=busy)
    asked = m("flash-b", phase="Preempted", state="Preempted", priority=200, last_active=ago(70),
              preempted_at=ago(65))
    for policy in (GO, ElectionPolicy()):
        result = elect([holder, asked], NOW, policy)
        assert (result.leader, result.reason) == ("flash-a", "ready")
        assert not result.members["flash-a"].preempt_now
        for again in (replace(asked, last_active=ago(59)), replace(asked, waiting_since=ago(1))):
            taken = elect([holder, again], NOW, policy)
            assert (taken.leader, taken.reason) == ("flash-b", "demand_preemption")
            assert taken.members["flash-a"].preempt_now


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
    # Right after a swap, the winner served its request and idled out: the card is empty.
    leader = replace(lapsed, state="Active")
    loser = replace(waiting, phase="Preempted", state="Preempted", preempted_at=ago(60))
    assert elect([leader, loser], NOW, GO).leader == "tiny-a"
    holding = replace(leader, phase="Ready", ready_since=ago(40))
    assert elect([holding, loser], NOW, GO).reason == "idle_holder", "an idle holder past min_hold yields"
    assert elect([replace(holding, busy=True), loser], NOW, GO).reason == "ready", "a busy one keeps it"
    assert elect([ready, replace(lapsed, idle_timeout=None)], NOW, GO).reason == "demand_preemption"


def test_warm_primary_reclaims_from_idle_leader_and_categories() -> None:
    idle = m("r", phase="Ready", priority=500, last_active=ago(200))
    primary = m("p", warm_primary=True, priority=1)
    assert elect([idle, primary], NOW, GO).reason == "warm_primary_reclaim"
    assert elect([m("x", can_take_demand=False, priority=900), m("y")], NOW, GO).reason == "runnable"
    assert elect([m("x", can_take_demand=False)], NOW, GO).reason == "fallback"
    assert elect([m("x", min_replicas=1, priority=1), m("y")], NOW, GO).reason == "warm_pinned"


def test_starvation_bound_overrides_priority_and_the_hold() -> None:
    busy = m("hi", phase="Ready", state="Active", priority=900, last_active=ago(1), ready_since=ago(2), busy=True)
    low = m("lo", priority=1, waiting_since=ago(301))
    assert elect([busy, low], NOW, ElectionPolicy(max_wait=300)).reason == "starvation_bound"
    assert elect([busy, low], NOW, ElectionPolicy(max_wait=302)).reason == "min_hold"
    assert elect([busy, low], NOW, GO).leader == "hi"


def test_an_idle_ready_holder_past_min_hold_yields_to_a_waiting_lower_priority_member() -> None:
    """Issue #23, defect 7: tiny-a (100) cold started, tiny-b (200) took the GPU, and tiny-a is asked for again.
    tiny-b is Ready and idle: past ``min_hold`` it yields, as under ``flexinfer serve``; a busy tiny-b keeps the
    GPU until tiny-a's wait reaches ``max_wait``, and a tiny-b Ready for less than ``min_hold`` keeps it too."""
    policy = ElectionPolicy()  # the shared defaults: min_hold 15 s, max_wait 30 s
    b = m("tiny-b", priority=200, phase="Ready", state="Active", last_active=ago(20), ready_since=ago(20),
          idle_timeout=600)
    a = m("tiny-a", priority=100, phase="Preempted", state="Preempted", last_active=ago(2), waiting_since=ago(2),
          preempted_at=ago(40), idle_timeout=600)
    result = elect([b, a], NOW, policy)
    assert (result.leader, result.reason) == ("tiny-a", "idle_holder")
    assert result.members["tiny-b"].preempt_now and result.members["tiny-b"].preempted_by == "tiny-a"
    assert elect([replace(b, ready_since=ago(10)), a], NOW, policy).reason == "min_hold"
    assert elect([replace(b, busy=True), a], NOW, policy).leader == "tiny-b"
    starving = replace(a, waiting_since=ago(policy.max_wait or 0))
    assert elect([replace(b, busy=True), starving], NOW, policy).reason == "starvation_bound"
    assert elect([replace(b, busy=True, ready_since=ago(1)), starving], NOW, policy).leader == "tiny-a"


def test_a_starving_member_never_preempts_a_winner_that_is_still_starting() -> None:
    winner = m("b", state="Active", phase="Loading", last_active=ago(40), waiting_since=None)
    starving = m("c", phase="Idle", waiting_since=ago(45), last_active=ago(45))
    assert elect([winner, starving], NOW, ElectionPolicy()).reason == "cold_start_in_flight"


def test_a_failed_holder_keeps_the_gpu_only_while_no_other_member_wants_it() -> None:
    failed = m("f", state="Active", phase="Failed", can_take_demand=False, last_active=ago(5))
    other = m("o", phase="Idle", idle_timeout=300)
    result = elect([failed, other], NOW, GO)
    assert (result.leader, result.reason) == ("f", "failed_holder")
    wanted = replace(other, last_active=ago(1), waiting_since=ago(1))
    assert elect([failed, wanted], NOW, GO).leader == "o"
    assert elect([replace(failed, state="Queued"), other], NOW, GO).leader == "o"


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


def test_a_holder_whose_own_requests_waited_longer_keeps_the_gpu_until_they_are_forwarded() -> None:
    """Found by the real-node soak: a pod swap that outlasted ``max_wait`` left both members with requests older
    than the bound; the winner, Ready 50 ms, lost the GPU to the other before the proxy forwarded anything, and
    the two alternated until every request timed out. Oldest first includes the holder."""
    policy = ElectionPolicy()
    a = m("tiny-a", priority=100, phase="Ready", state="Active", ready_since=ago(0.05), last_active=ago(0.05),
          waiting_since=ago(40), busy=True)
    c = m("tiny-c", priority=100, phase="Preempted", state="Preempted", preempted_at=ago(1),
          last_active=ago(35), waiting_since=ago(35))
    assert elect([a, c], NOW, policy).leader == "tiny-a"
    forwarded = replace(a, waiting_since=None)  # its requests were forwarded: the marker is gone
    assert elect([forwarded, c], NOW, policy).reason == "starvation_bound"
    since_ready = replace(a, waiting_since=ago(0.01))  # a younger request, which arrived after Ready
    assert elect([since_ready, c], NOW, policy).reason == "starvation_bound"


def test_a_holder_keeps_the_gpu_while_it_serves_the_backlog_it_was_started_for() -> None:
    """Found by the real-node soak with four members and the chart's 30 s bound: a rotation of 10 s pod swaps
    leaves every member starving, and oldest first alone handed the GPU on as soon as the holder's oldest request
    was forwarded: one request per swap, 504s for the rest. A request that was already waiting when the holder
    became Ready is its backlog; once it has gone out, the starving member wins as before."""
    policy = ElectionPolicy()
    a = m("tiny-a", priority=100, phase="Ready", state="Active", ready_since=ago(0.5), last_active=ago(0.5),
          waiting_since=ago(20), busy=True)  # its next request waited 20 s, since before it became Ready
    c = m("tiny-c", priority=100, phase="Preempted", state="Preempted", preempted_at=ago(5),
          last_active=ago(40), waiting_since=ago(40))  # older, starving
    assert elect([a, c], NOW, policy).leader == "tiny-a"
    served = replace(a, waiting_since=ago(0.2))  # the backlog went out; this one arrived after Ready
    decision = elect([served, c], NOW, policy)
    assert (decision.leader, decision.reason) == ("tiny-c", "starvation_bound")
