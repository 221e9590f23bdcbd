"""The multi-model active set (flexinfer.core.active_set): property tests over random groups (never over budget,
never a pinned, starting or held victim unless the candidate starves, a busy one only by the drain rule, evictions
only for a waiting request, too-large members refused and never Active, no limit = everyone who wants to run), and
scenarios: Go's greedy packing by priority, eviction by cost, waiting for the victims' pods, no thrash after an
eviction, the starvation bound, leases."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer.api.gpulease import GPULease
from flexinfer.api.model import MeasuredMemoryStatus, Model, SharedGroupStatus
from flexinfer.core.active_set import elect_active_set, holding, need_of, wants
from flexinfer.core.election import Election, ElectionPolicy, Member
from flexinfer.core.memory_need import MemoryNeed

NOW = datetime(2025, 1, 1, tzinfo=UTC)
POLICY = ElectionPolicy(min_hold=15.0, max_wait=60.0)
GROUP = "ns/gpu0"


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def declared(**mib: float) -> dict[str, MemoryNeed]:
    return {name: MemoryNeed(value, "declared") for name, value in mib.items()}


def ready(name: str, **kw: Any) -> Member:
    """An Active Ready member, Ready for a minute (past the hold), idle."""
    return Member(**{"name": name, "phase": "Ready", "state": "Active", "ready_since": ago(60),
                     "last_active": ago(600), **kw})


def asked(name: str, waited: float = 1.0, **kw: Any) -> Member:
    """A member a request waits for."""
    return Member(**{"name": name, "phase": "Idle", "state": "Queued", "last_active": ago(waited),
                     "waiting_since": ago(waited), **kw})


def active(result: Election) -> set[str]:
    return {name for name, d in result.members.items() if d.state == "Active"}


def elect(members: list[Member], budget: float, needs: dict[str, MemoryNeed], holding_: tuple[str, ...] = (),
          **kw: Any) -> Election:
    return elect_active_set(members, NOW, POLICY, group=GROUP, budget_mib=budget, needs=needs, holding=holding_, **kw)


# ---------------------------------------------------------------- properties

names = "abcdef"
member_st = st.builds(
    Member,
    name=st.sampled_from(names),
    priority=st.sampled_from([50, 100, 200]),
    phase=st.sampled_from([None, "Idle", "Pending", "Loading", "Ready", "Preempted", "Failed"]),
    state=st.sampled_from([None, "Active", "Queued", "Preempted"]),
    last_active=st.one_of(st.none(), st.integers(0, 900).map(ago)),
    waiting_since=st.one_of(st.none(), st.integers(0, 120).map(ago)),
    ready_since=st.one_of(st.none(), st.integers(0, 60).map(ago)),
    min_replicas=st.sampled_from([0, 0, 0, 1]),
    warm_primary=st.sampled_from([False, False, False, True]),
    force=st.sampled_from([False] * 7 + [True]),
    busy=st.booleans(),
    can_take_demand=st.sampled_from([True, True, True, False]),
    idle_timeout=st.sampled_from([None, 300.0]),
)
group_st = st.lists(member_st, min_size=1, max_size=6, unique_by=lambda m: m.name)
need_values = st.sampled_from([0.0, 500.0, 1000.0, 1500.0, 3000.0, 5000.0])


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[Member], float, dict[str, MemoryNeed], tuple[str, ...]]:
    members = draw(group_st)
    budget = draw(st.sampled_from([1000.0, 3000.0, 4000.0, math.inf]))
    needs = {m.name: MemoryNeed(draw(need_values), "declared") for m in members}
    held = tuple(m.name for m in members if draw(st.booleans()))
    return members, budget, needs, held


def _starving(m: Member) -> bool:
    return m.force or (m.waiting_since is not None and (NOW - m.waiting_since).total_seconds() >= POLICY.max_wait)


@settings(max_examples=1500, deadline=None)
@given(scenario())
def test_the_active_set_never_goes_over_budget_and_evicts_only_what_it_may(
        case: tuple[list[Member], float, dict[str, MemoryNeed], tuple[str, ...]]) -> None:
    members, budget, needs, held = case
    result = elect(members, budget, needs, held)
    by_name = {m.name: m for m in members}
    now_active = active(result)
    before = {m.name for m in members if m.state == "Active"}
    evicted = {name: d for name, d in result.members.items() if d.cause}
    assert result.memory is not None and set(result.memory.evicted) == set(evicted)
    assert set(result.members) == set(by_name)
    for name, decision in result.members.items():
        over = needs[name].mib > budget
        assert bool(decision.refusal) == over, name
        assert not (over and name in now_active), "a member larger than the budget never runs"
        assert decision.need == needs[name]
    if now_active - before and not math.isinf(budget):
        occupied = now_active | set(held) | set(evicted)
        assert sum(needs[n].mib for n in occupied) <= budget + 1e-6, "a member starts only where it fits"
    for name, decision in evicted.items():
        victim, taker = by_name[name], by_name[decision.preempted_by]
        assert name in before and name not in now_active and decision.preempt_now
        assert not (victim.min_replicas >= 1 or victim.warm_primary or victim.force), "never a pinned member"
        assert victim.phase == "Ready", "never one still starting"
        hold_over = victim.ready_since is None or (NOW - victim.ready_since).total_seconds() >= POLICY.min_hold
        assert hold_over or _starving(taker), "the hold protects it unless the taker starves"
        if victim.busy or victim.waiting_since is not None:
            assert taker.priority > victim.priority or _starving(taker), "a busy member drains only for these"
        assert taker.waiting_since is not None or taker.force, "only a request that waits evicts"
        assert decision.state == "Preempted" and taker.name not in now_active, "the taker waits for the memory"
    if math.isinf(budget):
        wanting = {m.name for m in members if wants(m, NOW, POLICY) and (m.name in before or m.name not in held)}
        assert now_active == wanting, "no limit: every member that wants to run (and is not leaving) is Active"


@settings(max_examples=500, deadline=None)
@given(scenario())
def test_members_that_do_not_want_to_run_are_never_made_active(
        case: tuple[list[Member], float, dict[str, MemoryNeed], tuple[str, ...]]) -> None:
    members, budget, needs, held = case
    result = elect(members, budget, needs, held)
    for m in members:
        if m.name in active(result):
            assert wants(m, NOW, POLICY)
    assert (result.leader is None) == (not active(result))


# ---------------------------------------------------------------- scenarios


def test_members_that_fit_together_are_all_active() -> None:
    members = [asked("a"), asked("b"), asked("c")]
    result = elect(members, 3000.0, declared(a=1000, b=1000, c=1000))
    assert active(result) == {"a", "b", "c"}
    assert result.memory is not None and result.memory.reserved_mib == 3000 and result.memory.used_mib == 0
    assert all(d.queue_position == 0 and not d.preempted_by for d in result.members.values())


def test_go_packing_adds_by_priority_with_a_name_tiebreak_while_it_fits() -> None:
    demand = {"phase": "Idle", "last_active": ago(5)}  # Go's demand signal only: lastActiveTime, no waiting marker
    members = [Member("a", priority=100, **demand), Member("b", priority=200, **demand),
               Member("c", priority=150, **demand), Member("d", priority=150, **demand)]
    result = elect(members, 2500.0, declared(a=500, b=1000, c=1500, d=1000))
    assert result.leader == "b" and active(result) == {"b", "c"}, "b, then c (150, name before d); d and a do not fit"
    assert [result.members[n].queue_position for n in ("d", "a")] == [1, 2]


def test_a_member_that_does_not_fit_evicts_by_cost_and_starts_once_the_victims_are_gone() -> None:
    residents = [ready("a", priority=100, last_active=ago(300)), ready("b", priority=50, last_active=ago(200)),
                 ready("c", priority=100, last_active=ago(100))]
    needs = declared(a=1000, b=1000, c=1000, d=1000)
    result = elect([*residents, asked("d")], 3000.0, needs, ("a", "b", "c"))
    victim = result.members["b"]
    assert active(result) == {"a", "c"}, "the lowest priority goes first"
    assert (victim.state, victim.preempted_by, victim.preempt_now) == ("Preempted", "d", True)
    assert "to make room for ns/d (needs 1000 MiB (declared); 0 of 3000 MiB free)" in victim.cause
    assert result.members["d"].state == "Queued", "d waits until b's pod is gone"
    assert result.memory is not None and result.memory.evicted == ("b",) and result.memory.used_mib == 3000

    gone = replace(residents[1], state="Preempted", phase="Preempted", preempted_by="d")
    still = elect([residents[0], gone, residents[2], asked("d")], 3000.0, needs, ("a", "b", "c"))
    assert active(still) == {"a", "c"} and not still.memory.evicted, "b still holds the device: wait, evict no more"

    after = elect([residents[0], gone, residents[2], asked("d")], 3000.0, needs, ("a", "c"))
    assert active(after) == {"a", "c", "d"}
    assert after.members["b"].preempted_by == "d", "kept: d's start is the swap from b"


def test_idle_before_busy_then_least_recently_used() -> None:
    residents = [ready("a", busy=True, ready_since=ago(2000)), ready("b", last_active=ago(100), ready_since=ago(100)),
                 ready("c", last_active=ago(900), ready_since=ago(1000))]
    result = elect([*residents, asked("d", priority=200)], 3000.0, declared(a=1000, b=1000, c=1000, d=1000))
    assert {n for n, d in result.members.items() if d.cause} == {"c"}


def test_busy_held_and_pinned_members_block_an_equal_priority_request() -> None:
    residents = [ready("a", busy=True), ready("b", ready_since=ago(5)), ready("c", min_replicas=1)]
    result = elect([*residents, asked("d")], 3000.0, declared(a=1000, b=1000, c=1000, d=1000))
    assert active(result) == {"a", "b", "c"} and not result.memory.evicted
    assert result.members["d"].state == "Queued"


def test_a_request_past_the_starvation_bound_evicts_a_busy_held_member() -> None:
    residents = [ready("a", busy=True, ready_since=ago(5), priority=200), ready("c", min_replicas=1)]
    result = elect([*residents, asked("d", waited=90)], 2000.0, declared(a=1000, c=1000, d=1000))
    assert result.members["a"].preempted_by == "d", "waited 90 s > max_wait 60 s"


def test_recent_activity_alone_joins_when_it_fits_but_never_evicts() -> None:
    """``lastActiveTime`` within the demand window (no waiting request) lets a member start beside the others,
    never evict: two recently used idle members would otherwise take turns evicting each other."""
    residents = [ready("a"), ready("b")]
    recent = Member("c", phase="Preempted", state="Preempted", last_active=ago(10), preempted_by="x")
    needs = declared(a=1000, b=1000, c=1000)
    assert active(elect([*residents, recent], 2000.0, needs)) == {"a", "b"}
    assert active(elect([*residents, recent], 3000.0, needs)) == {"a", "b", "c"}


def test_a_smaller_member_fits_beside_while_a_larger_one_waits_but_not_into_freed_memory() -> None:
    residents = [ready("a", busy=True), ready("b")]
    needs = declared(a=1000, b=1000, big=2000, small=500)
    result = elect([*residents, asked("big", priority=200), asked("small")], 3000.0, needs)
    assert result.members["b"].preempted_by == "big" and active(result) == {"a"}, "a is busy: only b goes"
    assert result.members["small"].state == "Queued", "the memory b frees is big's"


def test_a_member_larger_than_the_budget_is_refused_with_both_figures() -> None:
    result = elect([asked("big"), asked("a")], 3000.0, declared(big=4000, a=1000))
    assert active(result) == {"a"}
    assert result.members["big"].refusal == ("model ns/big needs 4000 MiB (declared) but GPU group ns/gpu0 has a "
                                             "memory budget of 3000 MiB")


def test_no_limit_keeps_everyone_who_wants_to_run() -> None:
    members = [ready("a"), asked("b"), Member("c", min_replicas=1), Member("idle")]
    result = elect(members, math.inf, declared(a=9000, b=9000, c=9000, idle=1))
    assert active(result) == {"a", "b", "c"}


def test_an_unknown_need_takes_the_whole_budget() -> None:
    needs = {"a": MemoryNeed(3000.0, "unknown"), "b": MemoryNeed(1, "declared")}
    result = elect([asked("a"), asked("b")], 3000.0, needs)
    assert len(active(result)) == 1


def test_a_lease_parks_every_member() -> None:
    lease = GPULease.model_validate({"metadata": {"name": "train", "namespace": "ns"}, "spec": {"group": "gpu0"}})
    result = elect([ready("a"), asked("b")], 3000.0, declared(a=1000, b=1000), lease=lease)
    assert not active(result) and result.members["a"].preempt_now and result.leader is None
    assert result.members["a"].need == MemoryNeed(1000, "declared")


def model(name: str, **gpu: Any) -> Model:
    return Model.model_validate({"metadata": {"name": name, "namespace": "ns"},
                                 "spec": {"backend": "llamacpp", "source": "file:///m.gguf",
                                          "gpu": {"shared": "gpu0", **gpu}}})


def test_needs_come_from_vram_estimate_mb_else_the_whole_budget() -> None:
    assert need_of(model("a", vramEstimateMB=1200), 3000.0) == MemoryNeed(1200.0, "declared")
    assert need_of(model("a"), 3000.0) == MemoryNeed(3000.0, "unknown")
    assert need_of(model("a"), math.inf) == MemoryNeed(0.0, "unknown")


def vllm_member(*args: str, status: dict[str, Any] | None = None, **gpu: Any) -> Model:
    return Model.model_validate({"metadata": {"name": "v", "namespace": "ns", "generation": 2},
                                 "spec": {"backend": "vllm", "source": "HF://org/model", "config": {"args": list(args)},
                                          "gpu": {"vendor": "amd", "shared": "gpu0", **gpu}},
                                 "status": status or {}})


def test_a_vllm_member_on_a_gpu_is_estimated_at_its_share_of_the_profiles_card() -> None:
    assert need_of(vllm_member("--gpu-memory-utilization", "0.25"), 24576.0) == MemoryNeed(6144.0, "estimated")
    assert need_of(vllm_member(), 10000.0) == MemoryNeed(9000.0, "estimated")  # vLLM's default share: 0.9
    assert need_of(vllm_member("--gpu-memory-utilization=0.5", vramEstimateMB=3000), 24576.0) == MemoryNeed(
        3000.0, "declared")
    assert need_of(vllm_member("--gpu-memory-utilization", "2"), 24576.0) == MemoryNeed(24576.0, "unknown")
    assert need_of(vllm_member(), math.inf) == MemoryNeed(0.0, "unknown")
    cpu = vllm_member(vendor="cpu")
    assert need_of(cpu, 8192.0) == MemoryNeed(8192.0, "unknown"), "the manager cannot read the weights"


def test_a_measured_figure_wins_over_a_vllm_estimate() -> None:
    record = MeasuredMemoryStatus(need_mib=5000.0, observed_generation=2, server_run="v-1#0@t")
    member = vllm_member("--gpu-memory-utilization", "0.25", status={
        "sharedGroup": SharedGroupStatus(memory_measured=record).model_dump(by_alias=True, exclude_none=True)})
    assert need_of(member, 24576.0) == MemoryNeed(5000.0, "measured")


def test_a_member_holds_the_device_while_its_deployment_wants_replicas_or_a_pod_exists() -> None:
    models = [model("a"), model("b"), model("c")]
    deployments = {"a": {"spec": {"replicas": 1}}, "b": {"spec": {"replicas": 0}}}
    assert holding(models, deployments, {"c": [{"metadata": {"name": "c-1"}}], "b": []}) == {"a", "c"}


def test_behind_a_member_that_must_wait_for_a_busy_one_a_smaller_member_still_starts() -> None:
    residents = [ready("a", busy=True)]
    result = elect([*residents, asked("big"), asked("small")], 2000.0, declared(a=1000, big=1500, small=500))
    assert active(result) == {"a", "small"} and not result.memory.evicted
    assert result.members["big"].state == "Queued"


def test_the_memory_freed_for_a_member_goes_to_it_first() -> None:
    """``b`` was evicted for ``d`` a moment ago and is gone; a newer request now waits for ``b`` too. ``d`` starts
    (the election would rank ``b`` first, but the memory was freed for ``d``), and ``b`` has to evict in turn."""
    residents = [ready("a", last_active=ago(900)), ready("c")]
    evicted = asked("b", waited=1, phase="Preempted", state="Preempted", preempted_by="d", preempted_at=ago(3))
    result = elect([*residents, evicted, asked("d", waited=2)], 3000.0, declared(a=1000, b=1000, c=1000, d=1000))
    assert result.members["d"].state == "Active" and result.members["b"].state == "Preempted"
    stale = replace(evicted, preempted_at=ago(600))
    result = elect([*residents, stale, asked("d", waited=2)], 3000.0, declared(a=1000, b=1000, c=1000, d=1000))
    assert result.members["b"].state == "Active", "an old eviction reserves nothing: b's request is newer"
