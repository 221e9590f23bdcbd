"""Property tests over random event sequences for the arbiter (flexinfer.core.arbiter.machine).

Invariants: at most one running model per shared group; every ticket ends exactly once (granted,
rejected, or withdrawn by its caller); no model is stopped while it has in-flight requests unless the
drain timeout expired; and a waiting model is served within the starvation bound, given an engine that
starts and stops within bounded time (the harness answers after at most ``S`` seconds). The express lane
(``Arbiter.admit``/``finish``) is equivalent to ``handle``: a twin arbiter that takes it whenever it is open
gives the same effects (wake-ups aside: never later) and ends in the same state.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flexinfer.api.model import Model
from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.machine import Arbiter
from flexinfer.core.arbiter.policy import ArbiterPolicy
from support.arbiter_harness import Harness, arbiter_state, comparable_effects, express_effects
from support.recording_engine import key, make_model

S = 4.0  # engine start/stop bound used by the harness
POLICY = ArbiterPolicy(max_wait=30, min_hold=10, drain_timeout=15, cold_start_timeout=10_000,
                       queue_limit=50, restart_backoff=2, restart_backoff_max=8)
NAMES = ("a", "b", "c", "d")
MODELS = [make_model("a", group="g", priority=300), make_model("b", group="g", priority=200, parallel=1),
          make_model("c", group="g", priority=100, parallel=2), make_model("d", idleTimeout="20s")]
UNCAPPED = [make_model("a", group="g", priority=300), make_model("b", group="g", priority=200),
            make_model("c", group="g", priority=100), make_model("d", idleTimeout="20s")]
"""For the starvation bound: a request waiting for a place behind requests that never end waits as long as
they run, whatever the arbiter does; the bound is about the GPU."""

ops = st.lists(st.one_of(
    st.tuples(st.just("request"), st.sampled_from(NAMES)),
    st.tuples(st.just("finish"), st.integers(0, 30)),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("advance"), st.floats(0, 12)),
    st.tuples(st.just("fail"), st.sampled_from(NAMES)),
    st.tuples(st.just("unload"), st.sampled_from(NAMES)),
), max_size=60)


class Checked(Harness):
    """The harness plus invariant checks on every effect."""

    def _record(self, effect: ev.Effect) -> None:
        super()._record(effect)
        if isinstance(effect, ev.StartModel):
            group = self.arbiter.slots[effect.model].group
            others = {m for m in self.holding if self.arbiter.slots[m].group == group} if group else set()
            assert not others, f"{effect.model} started while {others} hold group {group}"
            self.holding.add(effect.model)
        elif isinstance(effect, (ev.StopModel,)):
            busy = [t for t in self.in_flight() if self.arbiter.tickets.get(t, None) and
                    self.arbiter.tickets[t].model == effect.model]
            assert not busy or effect.forced, f"{effect.model} stopped with {busy} in flight"
        elif isinstance(effect, ev.GrantTicket):
            assert effect.ticket not in self.cancelled
            slot = self.arbiter.slots[effect.model]
            assert not slot.capacity or len(slot.in_flight) <= slot.capacity, f"{effect.model} over its capacity"

    def send(self, event: ev.Event) -> list[ev.Effect]:
        if isinstance(event, ev.ModelStopped | ev.ModelStartFailed):
            self.holding.discard(event.model)  # the engine reports the GPU free before the arbiter hears it
        return super().send(event)


class Twin(Checked):
    """``Checked`` driving a second arbiter that answers requests through the express lane whenever it is open;
    after every event both must have given the same effects (wake-ups aside) and hold the same state."""

    def send(self, event: ev.Event) -> list[ev.Effect]:
        if not hasattr(self, "twin"):
            self.twin, self.express_hits = Arbiter(self.models, self.policy), 0
        twin_fx = self._twin_effects(event)
        effects = super().send(event)
        assert comparable_effects(twin_fx) == comparable_effects(effects), event
        assert arbiter_state(self.twin) == arbiter_state(self.arbiter), event
        wake, twin_wake = self.arbiter.next_wake(), self.twin.next_wake()
        assert wake is None or (twin_wake is not None and twin_wake <= wake), "the express lane woke up late"
        self.wake = min((w for w in (self.wake, twin_wake) if w is not None), default=None)
        return effects

    def _twin_effects(self, event: ev.Event) -> list[ev.Effect]:
        effects, express = express_effects(self.twin, event, self.now)
        self.express_hits += express
        return effects



def run(script: list[tuple[str, object]], delays: dict[str, float], cls: type[Checked] = Checked,
        policy: ArbiterPolicy = POLICY, models: list[Model] = MODELS) -> Checked:
    h = cls.__new__(cls)
    h.holding = set()  # type: ignore[attr-defined]
    cls.__init__(h, models, policy, start_delay=delays, stop_delay=S)
    for op, arg in script:
        if h.play(op, arg):
            continue
        if op == "fail":
            h.failing[f"default/{arg}"] = h.failing.get(f"default/{arg}", 0) + 1
        elif op == "unload":
            h.send(ev.Unload(key(str(arg))))
        elif op == "late":
            h.now += float(arg)  # type: ignore[arg-type]  # time passes, the wake-up is not delivered yet
    return h


def quiesce(h: Checked) -> None:
    """Clients finish everything; time runs on until nothing waits."""
    for _ in range(40):
        for t in sorted(h.in_flight()):
            h.finish(t)
        h.advance(10)


busy_ops = st.lists(st.one_of(
    st.tuples(st.just("request"), st.sampled_from(NAMES)),
    st.tuples(st.just("advance"), st.floats(0, 12)),
), min_size=10, max_size=60)
"""Clients that never finish: the high-priority holder stays busy, so only the bound gets others in."""

delays_st = st.fixed_dictionaries({f"default/{n}": st.floats(0.0, S) for n in NAMES})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=ops, delays=delays_st)
def test_every_ticket_ends_exactly_once(script: list[tuple[str, object]], delays: dict[str, float]) -> None:
    h = run(script, delays)
    quiesce(h)
    undecided = set(h.arrived) - set(h.outcome) - h.cancelled
    assert not undecided, f"tickets never answered: {undecided}"
    assert not h.arbiter.tickets.keys() - h.in_flight(), "the arbiter still tracks ended tickets"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.one_of(ops, busy_ops), delays=delays_st)
def test_waiting_model_is_served_within_the_starvation_bound(
        script: list[tuple[str, object]], delays: dict[str, float]) -> None:
    h = run(script, delays, models=UNCAPPED)
    quiesce(h)
    members = 3
    cycle = POLICY.drain_timeout + 2 * S  # drain the holder, stop it, start the next
    bound = POLICY.max_wait + S + members * cycle
    for ticket, (kind, at) in h.outcome.items():
        if kind == "granted":
            assert at - h.arrived[ticket] <= bound + 1e-6, (ticket, at - h.arrived[ticket])


@settings(max_examples=200, deadline=None)
@given(script=ops, delays=delays_st)
def test_shutdown_always_completes(script: list[tuple[str, object]], delays: dict[str, float]) -> None:
    h = run(script, delays)
    h.send(ev.Shutdown())
    h.advance(POLICY.drain_timeout + 2 * S)
    assert h.effects(ev.ShutdownComplete) == [ev.ShutdownComplete()]
    assert all(k == "granted" or k != "" for k, _ in h.outcome.values())
    assert not any(s.queue for s in h.arbiter.slots.values())


late_ops = st.lists(st.one_of(
    st.tuples(st.just("request"), st.sampled_from(NAMES)),
    st.tuples(st.just("finish"), st.integers(0, 30)),
    st.tuples(st.just("advance"), st.floats(0, 12)),
    st.tuples(st.just("late"), st.floats(0, 40)),
), max_size=60)
"""Events that arrive after a deadline but before its wake-up (a busy event loop runs the timer late)."""


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.one_of(ops, busy_ops, late_ops), delays=delays_st,
       owns_scaling=st.booleans())
@example(script=[("request", "d"), ("advance", 5.0), ("finish", 0), ("request", "a"), ("advance", 5.0),
                 ("late", 30.0), ("request", "a")],  # d's idle timeout is due when a request for a arrives
         delays={f"default/{n}": 1.0 for n in NAMES}, owns_scaling=True)
def test_express_lane_gives_the_same_effects_and_state_as_handle(
        script: list[tuple[str, object]], delays: dict[str, float], owns_scaling: bool) -> None:
    h = run(script, delays, Twin, dataclasses.replace(POLICY, owns_scaling=owns_scaling))
    quiesce(h)
    h.send(ev.Shutdown())
    h.advance(POLICY.drain_timeout + 2 * S)


def test_express_lane_is_taken_for_a_ready_unchallenged_model() -> None:
    """The equivalence above is not vacuous: requests for a Ready model skip ``handle``."""
    h = run([("request", "d"), ("advance", 5.0), ("request", "d"), ("request", "d"), ("finish", 1),
             ("finish", 2), ("request", "a"), ("advance", 5.0), ("request", "a"), ("finish", 3)],
            {f"default/{n}": 1.0 for n in NAMES}, Twin)
    assert h.express_hits >= 5  # type: ignore[attr-defined]
