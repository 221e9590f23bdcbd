"""The memory planner (flexinfer.core.memory_plan): property tests over random groups (never over budget,
never a pinned, loading or held victim, a busy one only by the drain rule, idle before busy, no unnecessary
victim, too-large refused) and a few scenarios that name the order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer.core.memory_plan import (
    Blocked,
    Candidate,
    Evict,
    Fits,
    Resident,
    TooLarge,
    evictable,
    eviction_order,
    plan,
)

needs_st = st.one_of(st.sampled_from([0.0, 100.0, 250.0, 500.0, 1000.0]), st.floats(0, 4000, allow_nan=False))
"""Round figures make ties and exact fits common; any float covers the rest."""
rarely = st.sampled_from([False, False, False, True])
"""Flags mostly off, so most residents are evictable and the order matters."""
residents_st = st.lists(st.builds(
    Resident,
    key=st.sampled_from("abcdefgh"),
    need_mib=needs_st,
    priority=st.sampled_from([50, 100, 200]),
    last_used=st.floats(0, 100),
    busy=rarely,
    oldest_wait=st.one_of(st.none(), st.floats(0, 100)),
    pinned=rarely,
    loading=rarely,
    leaving=rarely,
    held=rarely,
), max_size=7, unique_by=lambda r: r.key)
candidate_st = st.builds(Candidate, need_mib=st.one_of(needs_st, needs_st.map(lambda n: n * 3)),
                         priority=st.sampled_from([50, 100, 200]), urgent=st.booleans(),
                         oldest_wait=st.one_of(st.none(), st.floats(0, 100)))
budget_st = st.one_of(st.just(0.0), st.sampled_from([500.0, 1000.0, 2000.0]), st.floats(1, 10000, allow_nan=False))


def _held(residents: list[Resident]) -> float:
    return sum(r.need_mib for r in residents)


@settings(max_examples=2000, deadline=None)
@given(budget=budget_st, residents=residents_st, candidate=candidate_st)
def test_a_plan_never_goes_over_budget_and_evicts_only_what_it_may(
        budget: float, residents: list[Resident], candidate: Candidate) -> None:
    result = plan(budget, residents, candidate)
    slack = 1e-3
    if budget <= 0:
        assert isinstance(result, Fits) == (not residents)
        if isinstance(result, Evict):
            gone = {r.key for r in result.victims} | {r.key for r in residents if r.leaving}
            assert gone == {r.key for r in residents}, "one model at a time: every resident leaves"
    elif isinstance(result, TooLarge):
        assert candidate.need_mib > budget
    else:
        assert candidate.need_mib <= budget + slack, "a model larger than the budget was not refused"
    if isinstance(result, Fits):
        assert budget <= 0 or _held(residents) + candidate.need_mib <= budget + slack
    if isinstance(result, Evict):
        victims = set(result.victims)
        for victim in result.victims:
            assert not victim.pinned and not victim.loading and not victim.leaving
            assert not victim.held or candidate.urgent
            if victim.busy:  # drained, and only for a higher priority or an older starving request
                assert candidate.priority > victim.priority or candidate.urgent
        busy = [v.busy for v in result.victims]
        assert busy == sorted(busy), "idle victims come before busy (drained) ones"
        if budget > 0:
            staying = [r for r in residents if r not in victims and not r.leaving]
            assert _held(staying) + candidate.need_mib <= budget + slack, "over budget after the evictions"
            for victim in result.victims:  # none of them was unnecessary
                assert _held(staying) + victim.need_mib + candidate.need_mib > budget - slack
            order = eviction_order(residents, candidate)
            deficit = candidate.need_mib - budget + _held([r for r in residents if not r.leaving])
            prefix, freed = [], 0.0
            for resident in order:
                if freed >= deficit - 1e-6:
                    break
                prefix.append(resident)
                freed += resident.need_mib
            assert victims <= set(prefix), "a victim past the cheapest prefix that frees enough"
    if isinstance(result, Blocked):
        assert result.blockers and (budget <= 0 or result.short_mib > 0)
        assert all(not evictable(b, candidate) for b in result.blockers)


@settings(max_examples=500, deadline=None)
@given(residents=residents_st, candidate=candidate_st)
def test_without_pinned_busy_or_held_residents_a_model_within_the_budget_always_gets_in(
        residents: list[Resident], candidate: Candidate) -> None:
    idle = [Resident(r.key, r.need_mib, r.priority, r.last_used) for r in residents]
    budget = max(candidate.need_mib, 1.0)
    assert isinstance(plan(budget, idle, candidate), Fits | Evict)


def test_idle_before_busy_then_lower_priority_then_least_recently_used() -> None:
    residents = [Resident("busy-low", 100, priority=50, last_used=1, busy=True),
                 Resident("idle-high", 100, priority=200, last_used=1),
                 Resident("idle-low-recent", 100, priority=50, last_used=9),
                 Resident("idle-low-old", 100, priority=50, last_used=2)]
    candidate = Candidate(400, priority=100)
    order = [r.key for r in eviction_order(residents, candidate)]
    assert order == ["idle-low-old", "idle-low-recent", "idle-high", "busy-low"]
    result = plan(400, residents, candidate)
    assert isinstance(result, Evict) and [v.key for v in result.victims] == order


def test_a_model_that_fits_beside_the_residents_evicts_nobody() -> None:
    assert plan(1000, [Resident("a", 300), Resident("b", 300)], Candidate(400)) == Fits()


def test_the_smallest_sufficient_set_drops_a_cheap_victim_the_big_one_makes_unnecessary() -> None:
    residents = [Resident("small-idle", 100), Resident("big-busy", 900, priority=50, busy=True)]
    result = plan(1000, residents, Candidate(900, priority=100))
    assert isinstance(result, Evict) and [v.key for v in result.victims] == ["big-busy"]


def test_pinned_loading_and_held_residents_block_and_are_named() -> None:
    residents = [Resident("pinned", 400, pinned=True), Resident("loading", 300, loading=True),
                 Resident("held", 200, held=True)]
    result = plan(1000, residents, Candidate(500))
    assert isinstance(result, Blocked)
    assert {b.key for b in result.blockers} == {"pinned", "loading", "held"} and result.short_mib == 400
    urgent = plan(1000, residents, Candidate(500, urgent=True))
    assert isinstance(urgent, Blocked) and urgent.short_mib == 200  # the hold gives way, the others do not


def test_a_busy_resident_of_equal_priority_is_drained_only_for_an_older_starving_request() -> None:
    busy = Resident("busy", 800, busy=True, oldest_wait=50.0)
    assert isinstance(plan(1000, [busy], Candidate(500)), Blocked)
    assert isinstance(plan(1000, [busy], Candidate(500, urgent=True, oldest_wait=60.0)), Blocked)
    result = plan(1000, [busy], Candidate(500, urgent=True, oldest_wait=40.0))
    assert isinstance(result, Evict) and result.victims == (busy,)


def test_leaving_residents_free_enough_so_the_candidate_waits_without_new_victims() -> None:
    residents = [Resident("leaving", 600, leaving=True), Resident("idle", 300)]
    assert plan(1000, residents, Candidate(600)) == Evict(())


def test_need_over_the_whole_budget_is_refused_and_no_budget_means_one_at_a_time() -> None:
    assert plan(1000, [], Candidate(1500)) == TooLarge(1500, 1000)
    assert plan(0, [], Candidate(1e9)) == Fits()
    one = plan(0, [Resident("a", 1), Resident("b", 1, busy=True)], Candidate(1, priority=200))
    assert isinstance(one, Evict) and [v.key for v in one.victims] == ["a", "b"]
