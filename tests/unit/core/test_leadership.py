"""Leader-election decisions: acquire, renew, respect a live holder, take over an expired one."""

from datetime import UTC, datetime, timedelta

from flexinfer.core.leadership import LeaseRecord, decide, release

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_no_lease_object_is_acquired() -> None:
    decision = decide(None, "a", T0, 15)
    assert decision.leader
    assert decision.write == LeaseRecord("a", 15, T0, T0, 0)


def test_live_lease_of_another_holder_keeps_us_follower() -> None:
    held = LeaseRecord("b", 15, T0, T0)
    decision = decide(held, "a", T0 + timedelta(seconds=14), 15)
    assert not decision.leader
    assert decision.write is None


def test_expired_lease_is_taken_over_and_counts_a_transition() -> None:
    held = LeaseRecord("b", 15, T0, T0, transitions=3)
    decision = decide(held, "a", T0 + timedelta(seconds=15), 15)
    assert decision.leader
    assert decision.write is not None
    assert (decision.write.holder, decision.write.transitions) == ("a", 4)


def test_own_lease_is_renewed_without_a_transition() -> None:
    held = LeaseRecord("a", 15, T0, T0, transitions=2)
    now = T0 + timedelta(seconds=5)
    decision = decide(held, "a", now, 15)
    assert decision.leader
    assert decision.write is not None
    assert (decision.write.renew_time, decision.write.acquire_time, decision.write.transitions) == (now, T0, 2)


def test_released_lease_is_free_for_the_next_candidate() -> None:
    held = LeaseRecord("a", 15, T0, T0)
    freed = release(held, "a")
    assert freed is not None and freed.expired(T0)
    assert decide(freed, "b", T0, 15).leader
    assert release(held, "b") is None
