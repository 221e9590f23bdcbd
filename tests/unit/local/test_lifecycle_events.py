"""``LifecycleEvents``: cold starts and swaps numbered from 1 in order, polled with ``after``; a bounded ring
whose overrun (and a poller's number from an earlier ``serve``) is reported as ``lost``."""

from __future__ import annotations

from flexinfer.local.lifecycle_events import LifecycleEvents
from flexinfer.runtime.observer import ObserverGroup
from support.local_processes import make_model

A, B = make_model("a", "file:///a"), make_model("b", "file:///b")


class Clock:
    def __init__(self) -> None:
        self.now = 1_767_225_600.0  # 2026-01-01T00:00:00Z

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


def test_events_are_numbered_in_order_and_polled_after_a_number() -> None:
    events = LifecycleEvents(clock=Clock())
    assert events.after(0).as_json() == {"next": 0, "events": [], "lost": False}
    group = ObserverGroup([events])  # as the dispatcher reaches it
    group.cold_start(A, 1.5)
    group.phase_changed(B, "Idle", "Loading")
    group.swap(B, 0.75)
    group.stage(B, "weights", 0.5)
    first = events.after(0).as_json()
    assert first == {"next": 2, "lost": False, "events": [
        {"seq": 1, "model": "default/a", "kind": "cold_start", "seconds": 1.5, "at": "2026-01-01T00:00:00.250Z"},
        {"seq": 2, "model": "default/b", "kind": "swap", "seconds": 0.75, "at": "2026-01-01T00:00:00.500Z"}]}
    assert events.after(2).as_json() == {"next": 2, "events": [], "lost": False}
    events.cold_start(A, 2.0)
    later = events.after(2)
    assert [(e.seq, e.kind) for e in later.events] == [(3, "cold_start")] and later.next == 3
    assert [e.seq for e in events.after(1).events] == [2, 3]


def test_an_overrun_ring_keeps_the_newest_and_says_events_were_lost() -> None:
    events = LifecycleEvents(capacity=3, clock=Clock())
    for i in range(5):
        events.swap(A, float(i))
    held = events.after(0)
    assert [e.seq for e in held.events] == [3, 4, 5] and held.next == 5 and held.lost
    assert events.after(1).lost, "seq 2 left the ring unseen"
    assert not events.after(2).lost, "everything after 2 is still held"
    assert [e.seq for e in events.after(2).events] == [3, 4, 5]
    assert events.after(5).events == () and not events.after(5).lost


def test_a_number_from_an_earlier_serve_gets_every_event_held() -> None:
    events = LifecycleEvents(clock=Clock())
    events.cold_start(B, 1.0)
    stale = events.after(57)
    assert [e.seq for e in stale.events] == [1] and stale.next == 1 and stale.lost
