"""Out-of-memory starts in the Kubernetes engine's active set (flexinfer.core.oom_retry through
flexinfer.core.active_set): the first one evicts the group's evictable members and retries once in a new pod,
after they are gone and before anyone else; a second one, in another pod, fails with the need and the budget; with
nobody to evict it fails at once; Ready drops the record; a group without a limit, a Ready member and one that is
leaving do not take part."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from flexinfer.api.model import OutOfMemoryStatus
from flexinfer.core.active_set import elect_active_set
from flexinfer.core.election import Election, ElectionPolicy, Member
from flexinfer.core.memory_need import MemoryNeed
from flexinfer.core.model_status.plan import REASON_OUT_OF_MEMORY, MemberInputs, refusal_failure
from flexinfer.core.model_status.pod_failure import OutOfMemorySign
from flexinfer.core.oom_retry import OutOfMemoryFacts
from support.resource_builders import make_model

NOW = datetime(2025, 1, 1, tzinfo=UTC)
POLICY = ElectionPolicy(min_hold=15.0, max_wait=60.0)
GROUP = "ns/gpu0"
NEEDS = {name: MemoryNeed(mib, "declared") for name, mib in (("x", 1000), ("a", 1000), ("p", 500), ("y", 500))}
SIGN = OutOfMemorySign("x-1", "container model OOMKilled, exit code 137")
FAILURE = ("out of memory starting model ns/x: it needs 1000 MiB (declared), GPU group ns/gpu0 has a budget of "
           "3000 MiB (500 MiB held by other models); container model OOMKilled, exit code 137")


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def ready(name: str, **kw: Any) -> Member:
    return Member(**{"name": name, "phase": "Ready", "state": "Active", "ready_since": ago(60),
                     "last_active": ago(600), **kw})


def starting(name: str = "x", **kw: Any) -> Member:
    """Active and loading, a request waiting for it."""
    return Member(**{"name": name, "phase": "Loading", "state": "Active", "last_active": ago(5),
                     "waiting_since": ago(5), **kw})


def queued(name: str, **kw: Any) -> Member:
    return Member(**{"name": name, "phase": "Idle", "state": "Queued", "last_active": ago(5),
                     "waiting_since": ago(5), **kw})


def record(pod: str = "x-1", failure: str = "") -> OutOfMemoryStatus:
    return OutOfMemoryStatus(pod=pod, seen_at=ago(30), observed_generation=1, failure=failure)


def elect(members: list[Member], *, signs: dict[str, OutOfMemorySign] | None = None,
          records: dict[str, OutOfMemoryStatus] | None = None, holding: tuple[str, ...] = (),
          budget: float = 3000) -> Election:
    facts = OutOfMemoryFacts(signs or {}, records or {}, dict.fromkeys(NEEDS, 1))
    return elect_active_set(members, NOW, POLICY, group=GROUP, budget_mib=budget, needs=NEEDS,
                            holding=holding or tuple(m.name for m in members if m.state == "Active"), oom=facts)


def active(result: Election) -> set[str]:
    return {name for name, d in result.members.items() if d.state == "Active"}


def test_the_first_out_of_memory_start_evicts_the_evictable_members_and_leaves_the_active_set() -> None:
    old = OutOfMemorySign("a-1", "container model OOMKilled, exit code 137")  # a's own crash before it was Ready
    result = elect([starting(), ready("a"), ready("p", min_replicas=1)], signs={"x": SIGN, "a": old})
    assert active(result) == {"p"}, "the pinned member stays; the starting one leaves for its retry"
    a, x = result.members["a"], result.members["x"]
    assert (a.state, a.preempted_by, a.preempt_now) == ("Preempted", "x", True)
    assert a.cause == "evicted from GPU group ns/gpu0: model ns/x ran out of memory starting beside it (retrying once)"
    assert x.out_of_memory == OutOfMemoryStatus(pod="x-1", seen_at=NOW, observed_generation=1)
    assert (x.state, x.refusal, x.budget_mib) == ("Queued", "", 3000)
    assert result.memory is not None
    assert (result.memory.evicted, result.memory.evicted_for_oom) == ((), ("a",))


def test_the_retry_waits_for_the_evicted_and_nobody_else_starts_until_it_is_ready() -> None:
    members = [queued("x"), Member("a", phase="Preempted", state="Preempted", preempted_by="x",
                                   preempted_at=ago(2), last_active=ago(600)), queued("y")]
    waiting = elect(members, records={"x": record()}, holding=("a",))
    assert active(waiting) == set(), "the evicted member still holds the device: nobody starts"
    assert waiting.members["x"].out_of_memory == record()
    gone = elect(members, records={"x": record()}, holding=())
    assert active(gone) == {"x"}, "the retry first, alone (y would fit beside it)"
    retried = elect([starting("x"), members[1], queued("y")], records={"x": record()}, holding=("x",))
    assert active(retried) == {"x"} and retried.members["x"].out_of_memory == record()
    served = elect([ready("x"), members[1], queued("y")], records={"x": record()}, holding=("x",))
    assert active(served) == {"x", "y"} and served.members["x"].out_of_memory is None, "Ready ends the retry"


def test_a_second_out_of_memory_in_the_retry_pod_fails_with_the_need_and_the_budget() -> None:
    members = [starting(), ready("p", min_replicas=1)]
    same_pod = elect(members, signs={"x": SIGN}, records={"x": record()})
    assert same_pod.members["x"].refusal == "", "the first pod's own failure is not a second one"
    second = OutOfMemorySign("x-2", SIGN.detail)
    failed = elect(members, signs={"x": second}, records={"x": record()})
    x = failed.members["x"]
    assert (active(failed), x.refusal, x.out_of_memory and x.out_of_memory.failure) == ({"p"}, FAILURE, FAILURE)
    later = elect([Member("x", phase="Failed", state="Queued"), members[1]], records={"x": record(failure=FAILURE)})
    assert later.members["x"].refusal == FAILURE, "the failure stays until the spec changes"
    failure = refusal_failure(MemberInputs(make_model("x", gpu={"vendor": "amd", "shared": "gpu0"}), None, x))
    assert failure is not None and (failure.reason, failure.message) == (REASON_OUT_OF_MEMORY, FAILURE)


def test_with_nobody_to_evict_it_fails_at_once() -> None:
    result = elect([starting(), ready("p", min_replicas=1)], signs={"x": SIGN})
    assert result.members["x"].refusal == FAILURE and active(result) == {"p"}
    assert result.memory is not None and result.memory.evicted_for_oom == ()


def test_a_group_without_a_limit_a_ready_member_and_a_leaving_one_do_not_take_part() -> None:
    unlimited = elect([starting(), ready("a")], signs={"x": SIGN}, budget=math.inf)
    assert active(unlimited) == {"x", "a"} and unlimited.members["x"].out_of_memory is None
    assert unlimited.members["x"].budget_mib is None
    served = elect([ready("x"), ready("a")], signs={"x": SIGN})
    assert active(served) == {"x", "a"}, "a Ready member's old termination is not a start that failed"
    leaving = Member("x", phase="Preempted", state="Preempted", preempted_by="a", preempted_at=ago(2))
    evicted = elect([leaving, ready("a")], signs={"x": SIGN}, holding=("x", "a"))
    assert active(evicted) == {"a"} and evicted.members["x"].out_of_memory is None, "a leaving member retries nothing"
