"""Groups that pack by memory in the pure arbiter (flexinfer.core.arbiter.packing through machine.Arbiter):
models that fit run side by side, a model that does not fit evicts by cost (idle, lower priority, least recently
used; never pinned; busy ones drain), the hold and the starvation bound keep working, a model larger than the
budget is refused, an out-of-memory start evicts and retries once; plus property tests over random event
sequences (never over budget, never a pinned victim, no stop with requests in flight before the drain ends,
every ticket ends once, the starvation bound)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexinfer.api.model import Model
from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.machine import Arbiter
from flexinfer.core.arbiter.policy import ArbiterPolicy
from support.arbiter_harness import Harness, arbiter_state, comparable_effects, express_effects
from support.recording_engine import key

G = "default/gpu0"
BUDGET = 1000.0
POLICY = ArbiterPolicy(max_wait=30, min_hold=10, drain_timeout=20, cold_start_timeout=600, queue_limit=5,
                       restart_backoff=5, group_budgets={"gpu0": BUDGET})
OOM = "model default/c: server (llama-server) exited with status 1 before it was ready: failed to allocate buffer"


def member(name: str, mib: float | None, priority: int = 100, parallel: int = 8, **config: Any) -> Model:
    gpu: dict[str, Any] = {"vendor": "amd", "shared": "gpu0", "priority": priority}
    if mib is not None:
        gpu["vramEstimateMB"] = mib
    serverless = config.pop("serverless", None)
    spec: dict[str, Any] = {"backend": "llamacpp", "source": f"file:///m/{name}.gguf", "gpu": gpu,
                            "config": {"parallel": parallel, **config}}
    if serverless is not None:
        spec["serverless"] = serverless
    return Model.model_validate({"metadata": {"name": name}, "spec": spec})


def starts(h: Harness) -> list[str]:
    return [e.model for e in h.effects(ev.StartModel)]  # type: ignore[attr-defined]


def stops(h: Harness) -> list[str]:
    return [e.model for e in h.effects(ev.StopModel)]  # type: ignore[attr-defined]


def up(h: Harness, name: str) -> int:
    """A request for ``name``; the engine reports it Ready at once when it was started for it."""
    ticket = h.request(name)
    if key(name) in starts(h)[-1:]:
        h.send(ev.ModelReady(key(name), f"ep:{name}"))
    return ticket


def test_models_that_fit_run_side_by_side_and_serve_without_any_swap() -> None:
    h = Harness([member("a", 300), member("b", 300), member("c", 300)], POLICY)
    for round_ in range(3):
        for name in "abc":
            h.finish(up(h, name))
            h.advance(1)
        assert starts(h) == [key("a"), key("b"), key("c")], f"round {round_}"
    assert stops(h) == [] and h.effects(ev.Preempted) == []
    assert {s.phase for s in h.arbiter.slots.values()} == {"Ready"}


def test_a_model_that_does_not_fit_evicts_the_least_recently_used_idle_member_only() -> None:
    h = Harness([member("a", 300), member("b", 300), member("c", 500)], POLICY)
    h.finish(up(h, "a"))
    h.advance(20)
    h.finish(up(h, "b"))
    h.advance(20)
    h.finish(up(h, "a"))  # a is used again: b is now the least recently used
    tc = h.request("c")
    assert h.effects(ev.Preempted) == [ev.Preempted(G, key("b"), key("c"))]
    assert stops(h) == [key("b")] and starts(h) == [key("a"), key("b")]
    h.send(ev.ModelStopped(key("b")))
    assert starts(h)[-1] == key("c") and tc not in h.outcome
    fx = h.send(ev.ModelReady(key("c"), "ep:c"))
    assert h.outcome[tc][0] == "granted" and any(isinstance(e, ev.ObserveSwap) for e in fx)
    assert h.arbiter.slots[key("a")].phase == "Ready", "a fits beside c and keeps running"
    assert h.arbiter.memory.evictions == {(G, "make_room"): 1}
    detail = [e.detail for e in h.effects(ev.PhaseChanged) if e.model == key("b") and e.new == "Preempted"]  # type: ignore[attr-defined]
    assert detail == [f"evicted from GPU group {G} to make room for default/c (needs 500 MiB (declared); "
                      f"400 of 1000 MiB free)"]


def test_idle_lower_priority_goes_first_and_a_busy_member_drains_only_for_a_higher_priority() -> None:
    h = Harness([member("low", 400, priority=50), member("busy", 400, priority=100), member("new", 400, 150),
                 member("peer", 400, priority=100)], POLICY)
    up(h, "busy")
    h.advance(11)
    h.finish(up(h, "low"))
    h.advance(11)
    t_new = h.request("new")  # needs 400 of the 200 free: low (idle, lowest priority) goes
    assert stops(h) == [key("low")]
    h.send(ev.ModelStopped(key("low")))
    h.send(ev.ModelReady(key("new"), "ep:new"))
    h.finish(t_new)
    h.advance(11)
    t_peer = h.request("peer")  # equal priority: busy is not drained for it; new is idle and goes
    assert stops(h) == [key("low"), key("new")]
    h.send(ev.ModelStopped(key("new")))
    h.send(ev.ModelReady(key("peer"), "ep:peer"))
    assert h.outcome[t_peer][0] == "granted"
    h.advance(11)
    h.request("new")  # a higher priority than the busy members: the busy one with the lowest priority drains
    assert h.effects(ev.Preempted)[-1] == ev.Preempted(G, key("busy"), key("new"))
    assert stops(h) == [key("low"), key("new")], "it drains first: its request is still in flight"


def test_a_busy_member_drains_before_it_stops_and_the_starvation_bound_takes_it_in_the_end() -> None:
    h = Harness([member("a", 600), member("b", 600)], POLICY)
    ta = up(h, "a")
    h.advance(11)
    tb = h.request("b")
    assert stops(h) == [] and h.effects(ev.Preempted) == []
    h.advance(29.9)
    assert stops(h) == []
    h.advance(0.1)  # b starves: a drains (its request runs on) and is stopped at the drain's end
    assert h.effects(ev.Preempted) == [ev.Preempted(G, key("a"), key("b"))] and stops(h) == []
    h.advance(20)
    assert [(e.model, e.forced) for e in h.effects(ev.StopModel)] == [(key("a"), True)]  # type: ignore[attr-defined]
    h.finish(ta)
    h.send(ev.ModelStopped(key("a")))
    h.send(ev.ModelReady(key("b"), "ep:b"))
    assert h.outcome[tb] == ("granted", 61.0)


def test_the_hold_protects_a_fresh_member_until_it_ends() -> None:
    h = Harness([member("a", 600), member("b", 600)], POLICY)
    h.finish(up(h, "a"))
    h.advance(2)
    h.request("b")
    assert stops(h) == [] and h.arbiter.next_wake() == 10.0
    h.advance(8)
    assert stops(h) == [key("a")]


def test_pinned_members_are_never_evicted_and_a_model_over_the_budget_is_refused_at_once() -> None:
    pinned = member("pinned", 600, serverless={"minReplicas": 1})
    h = Harness([pinned, member("b", 600), member("huge", 1500)], POLICY)
    h.send(ev.ModelReady(key("pinned"), "ep:pinned"))
    assert starts(h) == [key("pinned")]
    h.advance(60)
    tb = h.request("b", deadline=h.now + 50)
    h.advance(50)
    assert h.outcome[tb][0] == "timeout" and stops(h) == []
    th = h.request("huge")
    assert h.outcome[th][0] == "activation_failed"
    error = h.effects(ev.RejectTicket)[-1].error  # type: ignore[attr-defined]
    assert "needs 1500 MiB (declared) but GPU group default/gpu0 has a memory budget of 1000 MiB" in str(error)
    assert key("huge") not in starts(h)


def test_a_pinned_member_without_requests_evicts_nobody_and_starts_once_it_fits() -> None:
    h = Harness([member("a", 800), member("e", 300, serverless={"minReplicas": 1})], POLICY)
    h.send(ev.ModelReady(key("e"), "ep:e"))
    h.send(ev.ModelCrashed(key("e"), "model server exited with signal SIGSEGV"))  # Failed, back after 5 s
    h.finish(up(h, "a"))
    h.advance(30)
    assert starts(h) == [key("e"), key("a")] and stops(h) == [], "e waits: it does not evict the idle a"
    h.send(ev.Unload(key("a")))
    h.send(ev.ModelStopped(key("a")))
    assert starts(h)[-1] == key("e")


def test_a_waiting_model_that_fits_starts_while_a_larger_one_waits_for_a_busy_member() -> None:
    h = Harness([member("busy", 700), member("big", 600), member("small", 200)], POLICY)
    up(h, "busy")
    h.advance(11)
    t_big = h.request("big")
    t_small = h.request("small")
    assert starts(h) == [key("busy"), key("small")] and t_big not in h.outcome and t_small not in h.outcome


def test_an_out_of_memory_start_evicts_the_residents_and_retries_once_then_fails_naming_need_and_budget() -> None:
    h = Harness([member("a", 300), member("b", 300), member("c", 300)], POLICY)
    h.finish(up(h, "a"))
    h.finish(up(h, "b"))
    h.advance(11)
    tc = h.request("c")
    assert starts(h)[-1] == key("c")
    h.send(ev.ModelStartFailed(key("c"), OOM))
    assert tc not in h.outcome and h.arbiter.slots[key("c")].phase == "Pending"
    assert sorted(stops(h)) == [key("a"), key("b")]
    assert h.arbiter.memory.evictions == {(G, "out_of_memory"): 2}
    h.send(ev.ModelStopped(key("a")))
    assert starts(h).count(key("c")) == 1, "the retry waits until every evicted member is gone"
    h.send(ev.ModelStopped(key("b")))
    assert starts(h).count(key("c")) == 2
    h.send(ev.ModelStartFailed(key("c"), OOM))
    assert h.outcome[tc][0] == "activation_failed"
    error = str(h.effects(ev.RejectTicket)[-1].error)  # type: ignore[attr-defined]
    assert "out of memory starting model default/c: it needs 300 MiB (declared), GPU group default/gpu0 has a " \
           "budget of 1000 MiB (0 MiB held by other models)" in error and "failed to allocate buffer" in error


def test_an_out_of_memory_start_alone_in_its_group_fails_at_once_and_other_failures_are_not_retried() -> None:
    h = Harness([member("a", 300), member("b", 300)], POLICY)
    ta = h.request("a")
    h.send(ev.ModelStartFailed(key("a"), "killed: exited with signal SIGKILL before it was ready"))
    assert h.outcome[ta][0] == "activation_failed" and "it needs 300 MiB" in str(h.effects(ev.RejectTicket)[-1].error)  # type: ignore[attr-defined]
    h.finish(up(h, "b"))
    h.advance(11)
    h.advance(5)
    ta = h.request("a")
    h.send(ev.ModelStartFailed(key("a"), "no such file"))
    assert h.outcome[ta][0] == "activation_failed" and stops(h) == []


def test_a_measured_need_replaces_the_estimate_and_an_unknown_need_takes_the_whole_budget() -> None:
    h = Harness([member("a", None), member("b", None), member("c", None)], POLICY)
    h.send(ev.MemoryNeedReported(key("a"), 300, "estimated"))
    h.send(ev.MemoryNeedReported(key("b"), 300, "estimated"))
    h.finish(up(h, "a"))
    h.finish(up(h, "b"))
    assert stops(h) == []
    h.send(ev.MemoryNeedReported(key("a"), 650, "measured"))
    assert h.arbiter.memory.need(h.arbiter.slots[key("a")].model).describe() == "650 MiB (measured)"
    h.advance(11)
    h.request("c")  # unknown: the whole budget, so both residents go
    assert sorted(stops(h)) == [key("a"), key("b")]


busy_ops = st.lists(st.one_of(
    st.tuples(st.just("request"), st.sampled_from("abcde")),
    st.tuples(st.just("finish"), st.integers(0, 30)),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("advance"), st.floats(0, 12)),
    st.tuples(st.just("oom"), st.sampled_from("abcde")),
    st.tuples(st.just("measure"), st.sampled_from("abcde")),
), max_size=60)
S = 4.0


class Packed(Harness):
    """The harness plus invariant checks: memory held never over the budget, no pinned victim, no stop with
    requests in flight before the drain's end."""

    needs: dict[str, float]
    holding: set[str]
    oom: dict[str, int]

    def _record(self, effect: ev.Effect) -> None:
        if isinstance(effect, ev.StartModel) and self.oom.get(effect.model, 0) > 0:
            self.oom[effect.model] -= 1
            self._later(1.0, ev.ModelStartFailed(effect.model, OOM))
            self.log.append((self.now, effect))
            self._check_start(effect.model)
            return
        super()._record(effect)
        if isinstance(effect, ev.StartModel):
            self._check_start(effect.model)
        elif isinstance(effect, ev.StopModel):
            busy = [t for t in self.in_flight() if (tk := self.arbiter.tickets.get(t)) and tk.model == effect.model]
            assert not busy or effect.forced, f"{effect.model} stopped with {busy} in flight"
        elif isinstance(effect, ev.Preempted):
            assert not self.arbiter.slots[effect.loser].pinned(self.arbiter.policy), f"pinned {effect.loser} evicted"

    def _check_start(self, model: str) -> None:
        self.holding.add(model)
        held = sum(self.arbiter.memory.need(self.arbiter.slots[m].model).mib for m in self.holding)
        assert held <= BUDGET + 1e-6, f"{model} started with {sorted(self.holding)} holding {held} MiB"

    def send(self, event: ev.Event) -> list[ev.Effect]:
        if isinstance(event, ev.ModelStopped | ev.ModelStartFailed):
            self.holding.discard(event.model)
        return super().send(event)


MODELS = [member("a", 300, priority=200), member("b", 400), member("c", 500), member("d", 250, priority=50),
          member("e", 300, serverless={"minReplicas": 1})]


def run(script: list[tuple[str, object]], delays: dict[str, float], models: list[Model] = MODELS,
        cls: type[Packed] = Packed) -> Packed:
    h = cls.__new__(cls)
    h.holding, h.oom = set(), {}
    Harness.__init__(h, models, POLICY, start_delay=delays, stop_delay=S)
    for op, arg in script:
        if h.play(op, arg):
            continue
        if op == "oom":
            h.oom[key(str(arg))] = h.oom.get(key(str(arg)), 0) + 1
        elif op == "measure":  # the server reports more than declared: a later plan counts the new figure
            h.send(ev.MemoryNeedReported(key(str(arg)), 350.0, "measured"))
    return h


delays_st = st.fixed_dictionaries({key(n): st.floats(0.0, S) for n in "abcde"})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=busy_ops, delays=delays_st)
def test_a_packed_group_never_goes_over_budget_and_every_ticket_ends_once(
        script: list[tuple[str, object]], delays: dict[str, float]) -> None:
    h = run(script, delays)
    for _ in range(40):
        for t in sorted(h.in_flight()):
            h.finish(t)
        h.advance(10)
    undecided = set(h.arrived) - set(h.outcome) - h.cancelled
    assert not undecided, f"tickets never answered: {undecided}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(st.one_of(st.tuples(st.just("request"), st.sampled_from("abcd")),
                                 st.tuples(st.just("advance"), st.floats(0, 12))), min_size=10, max_size=60),
       delays=delays_st)
def test_a_waiting_model_is_served_within_the_starvation_bound_in_a_packed_group(
        script: list[tuple[str, object]], delays: dict[str, float]) -> None:
    """Clients that never finish: only the bound gets a model in past busy members."""
    uncapped = [m.model_copy(update={"spec": m.spec.model_copy(update={"config": {"parallel": 64}})})
                for m in MODELS[:4]]  # a request waiting for a place behind requests that never end is not the bound's
    h = run(script, delays, uncapped)
    for _ in range(40):
        h.advance(10)
    bound = POLICY.max_wait + S + 4 * (POLICY.drain_timeout + 2 * S)
    for ticket, (kind, at) in h.outcome.items():
        if kind == "granted":
            assert at - h.arrived[ticket] <= bound + 1e-6, (ticket, at - h.arrived[ticket])
    assert not set(h.arrived) - set(h.outcome), "a request still waits after every bound passed"


class PackedTwin(Packed):
    """``Packed`` driving a second arbiter that answers requests through the express lane whenever it is open:
    after every event both gave the same effects (wake-ups aside) and hold the same state."""

    def send(self, event: ev.Event) -> list[ev.Effect]:
        if not hasattr(self, "twin"):
            self.twin = Arbiter(self.models, self.policy)
        twin_fx, _ = express_effects(self.twin, event, self.now)
        effects = super().send(event)
        assert comparable_effects(twin_fx) == comparable_effects(effects), event
        assert arbiter_state(self.twin) == arbiter_state(self.arbiter), event
        self.wake = min((w for w in (self.wake, self.twin.next_wake()) if w is not None), default=None)
        return effects



@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=busy_ops, delays=delays_st)
def test_the_express_lane_gives_the_same_effects_and_state_in_a_packed_group(
        script: list[tuple[str, object]], delays: dict[str, float]) -> None:
    run(script, delays, cls=PackedTwin)
