"""Scenario tests for the pure swap arbiter (flexinfer.core.arbiter.machine): admission, joins, swaps, drains,
the hold and the starvation bound, timeouts, failures, idle reaping, preload/unload, shutdown, removal."""

from __future__ import annotations

from dataclasses import replace

from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.policy import ArbiterPolicy
from support.arbiter_harness import Harness
from support.recording_engine import key, make_model

A, B, C = "default/a", "default/b", "default/c"
POLICY = ArbiterPolicy(max_wait=30, min_hold=10, drain_timeout=20, cold_start_timeout=600, queue_limit=3)


def shared(**prios: int) -> Harness:
    return Harness([make_model(n, group="gpu0", priority=p) for n, p in prios.items()], POLICY)


def starts(h: Harness) -> list[str]:
    return [e.model for e in h.effects(ev.StartModel)]  # type: ignore[attr-defined]


def stops(h: Harness) -> list[tuple[str, bool]]:
    return [(e.model, e.forced) for e in h.effects(ev.StopModel)]  # type: ignore[attr-defined]


def bring_up(h: Harness, key: str) -> int:
    t = h.request(key)
    h.send(ev.ModelReady(key, f"ep:{key}"))
    return t


def test_cold_start_grants_every_joiner_once_at_ready() -> None:
    h = Harness([make_model("a")], POLICY)
    t1 = h.request("a")
    h.advance(2)
    t2 = h.request("a")
    assert starts(h) == [A]
    h.advance(3)
    fx = h.send(ev.ModelReady(A, "ep"))
    grants = [e for e in fx if isinstance(e, ev.GrantTicket)]
    assert [(g.ticket, g.waited, g.activation) for g in grants] == [(t1, 5.0, "cold_start"), (t2, 3.0, "cold_start")]
    assert ev.ObserveColdStart(A, 5.0) in fx
    assert [e.new for e in h.effects(ev.PhaseChanged)] == ["Pending", "Loading", "Ready"]  # type: ignore[attr-defined]


def test_ready_model_grants_immediately() -> None:
    h = Harness([make_model("a")], POLICY)
    bring_up(h, A)
    t = h.request("default/a")
    assert h.outcome[t] == ("granted", 0.0)


def test_same_name_in_two_namespaces_each_key_reaches_its_own_model_and_a_bare_name_is_no_key() -> None:
    other = make_model("a").model_copy(update={"metadata": make_model("a").metadata.model_copy(
        update={"namespace": "team-b"})})
    h = Harness([make_model("a"), other], POLICY)
    t_team = h.request("team-b/a")
    assert starts(h) == ["team-b/a"]
    h.send(ev.ModelReady(key("team-b/a"), "ep:team-b"))
    assert h.outcome[t_team][0] == "granted"
    grants = {e.ticket: (e.model, e.endpoint) for e in h.effects(ev.GrantTicket)}  # type: ignore[attr-defined]
    assert grants[t_team] == ("team-b/a", "ep:team-b")
    t_default = h.request("default/a")
    assert starts(h) == ["team-b/a", "default/a"] and t_default not in h.outcome
    h.send(ev.RequestArrived(99, "a", None))  # type: ignore[arg-type]  # a bare name is not a key
    assert h.outcome[99][0] == "model_not_found"


def test_unknown_model_queue_full_and_shutdown_rejections() -> None:
    h = Harness([make_model("a")], POLICY)
    assert h.outcome[h.request("nope")][0] == "model_not_found"
    for _ in range(3):
        h.request("a")
    assert h.outcome[h.request("a")][0] == "queue_full"
    h.send(ev.Shutdown())
    assert [k for k, _ in h.outcome.values()].count("service_unavailable") == 3
    assert h.outcome[h.request("a")][0] == "service_unavailable"


def test_cold_start_timeout_from_spec_and_from_caller_deadline() -> None:
    h = Harness([make_model("a", coldStartTimeout="10s"), make_model("b")], POLICY)
    ta = h.request("a")
    tb = h.request("b", deadline=h.now + 4)
    h.advance(4)
    assert h.outcome[tb] == ("timeout", 4.0)
    assert ta not in h.outcome
    h.advance(6)
    assert h.outcome[ta] == ("timeout", 10.0)


def test_failed_start_rejects_queue_then_backs_off_then_retries() -> None:
    h = Harness([make_model("a")], ArbiterPolicy(restart_backoff=5))
    t1, t2 = h.request("a"), h.request("a")
    h.send(ev.ModelStartFailed(A, "no such file"))
    assert h.outcome[t1][0] == h.outcome[t2][0] == "activation_failed"
    err = h.effects(ev.RejectTicket)[0].error  # type: ignore[attr-defined]
    assert "no such file" in str(err) and err.retry_after == 5
    assert h.outcome[h.request("a")][0] == "activation_failed"
    h.advance(5)
    h.request("a")
    assert starts(h) == [A, A]


def test_swap_drains_incumbent_before_starting_winner() -> None:
    h = shared(a=100, b=200)
    ta = bring_up(h, A)
    h.advance(15)
    tb = h.request("b")
    assert h.effects(ev.Preempted) == [ev.Preempted("default/gpu0", A, B)]
    assert stops(h) == []
    ta2 = h.request("a")
    assert ta2 not in h.outcome, "a draining model gets no new grants"
    h.advance(3)
    h.finish(ta)
    assert stops(h) == [(A, False)]
    assert starts(h) == [A]
    h.send(ev.ModelStopped(A))
    assert starts(h) == [A, B]
    h.advance(7)
    fx = h.send(ev.ModelReady(B, "ep:b"))
    assert ev.ObserveSwap(B, "default/gpu0", 10.0) in fx and ev.ObserveColdStart(B, 10.0) in fx
    assert h.outcome[tb] == ("granted", h.now)
    phases = [(e.model, e.new) for e in h.effects(ev.PhaseChanged)]  # type: ignore[attr-defined]
    assert (A, "Preempted") in phases


def test_drain_timeout_forces_the_stop() -> None:
    h = shared(a=100, b=200)
    bring_up(h, A)
    h.advance(15)
    h.request("b")
    h.advance(19.9)
    assert stops(h) == []
    h.advance(0.1)
    assert stops(h) == [(A, True)]


def test_min_hold_delays_a_higher_priority_challenger() -> None:
    h = shared(a=100, b=200)
    bring_up(h, A)
    h.advance(2)
    h.request("b")
    assert h.effects(ev.Preempted) == []
    h.advance(7.9)
    assert h.effects(ev.Preempted) == []
    h.advance(0.1)
    assert h.effects(ev.Preempted) == [ev.Preempted("default/gpu0", A, B)]


def test_starvation_bound_beats_a_busy_higher_priority_model() -> None:
    h = shared(a=200, b=100)
    bring_up(h, A)
    h.advance(15)
    tb = h.request("b")
    for _ in range(29):
        h.request("a")  # keeps A busy: every request stays in flight
        h.advance(1)
    assert h.effects(ev.Preempted) == []
    h.advance(1)
    assert h.effects(ev.Preempted) == [ev.Preempted("default/gpu0", A, B)]
    assert h.arbiter.slots[B].queue and tb not in h.outcome


def test_idle_incumbent_yields_to_lower_priority_after_hold() -> None:
    h = shared(a=200, b=100)
    h.finish(bring_up(h, A))
    h.advance(10)
    h.request("b")
    assert stops(h) == [(A, False)]


def test_cancelled_tickets_never_pin_a_model() -> None:
    h = shared(a=200, b=100)
    ta = bring_up(h, A)
    h.advance(15)
    tb = h.request("b")
    h.cancel(tb)
    h.advance(60)
    assert h.effects(ev.Preempted) == []
    h.advance(0)
    tb2 = h.request("b")
    h.cancel(ta)  # a granted request whose client went away no longer counts as in flight
    assert h.effects(ev.Preempted) == [ev.Preempted("default/gpu0", A, B)]
    assert stops(h) == [(A, False)]
    assert tb2 not in h.outcome


def test_idle_timeout_stops_serverless_but_keeps_min_replicas_warm() -> None:
    h = Harness([make_model("a", idleTimeout="60s"), make_model("w", minReplicas=1)], POLICY)
    assert starts(h) == ["default/w"], "minReplicas >= 1 starts without a request"
    h.send(ev.ModelReady("default/w", "ep"))
    h.finish(bring_up(h, A))
    h.advance(59)
    assert stops(h) == []
    h.advance(1)
    assert stops(h) == [(A, False)]
    h.advance(3600)
    assert stops(h) == [(A, False)]


def test_without_owning_scaling_an_idle_model_keeps_running_and_min_replicas_waits_for_a_request() -> None:
    policy = replace(POLICY, owns_scaling=False)
    h = Harness([make_model("a", idleTimeout="60s"), make_model("w", minReplicas=1)], policy)
    assert starts(h) == [], "another program keeps minReplicas running"
    h.finish(bring_up(h, A))
    h.advance(3600)
    assert stops(h) == [] and h.arbiter.next_wake() is None, "another program stops idle models"
    h.finish(bring_up(h, "default/w"))
    assert starts(h) == [A, "default/w"]
    h.send(ev.ModelStopped(A))
    h.advance(3600)
    assert starts(h) == [A, "default/w"], "a model stopped elsewhere starts again only for a request"
    h.send(ev.Unload(key("w")))
    assert stops(h) == [("default/w", False)], "explicit control still stops it"


def test_preload_and_unload() -> None:
    h = Harness([make_model("a"), make_model("w", minReplicas=1)], POLICY)
    h.send(ev.Preload(key("a")))
    assert A in starts(h)
    h.send(ev.ModelReady(A, "ep"))
    h.send(ev.Unload(key("w")))
    h.send(ev.ModelStopped("default/w"))
    h.advance(100)
    assert starts(h).count("default/w") == 1, "an unloaded minReplicas model waits for a request"
    h.request("w")
    assert starts(h).count("default/w") == 2


def test_shutdown_drains_then_completes() -> None:
    h = Harness([make_model("a"), make_model("b")], POLICY)
    ta = bring_up(h, A)
    tb = h.request("b")
    h.send(ev.Shutdown(drain_timeout=5))
    assert h.outcome[tb][0] == "service_unavailable"
    assert stops(h) == [("default/b", False)]
    h.send(ev.ModelStopped(B))
    assert h.effects(ev.ShutdownComplete) == []
    h.finish(ta)
    h.send(ev.ModelStopped(A))
    assert h.effects(ev.ShutdownComplete) == [ev.ShutdownComplete()]


def test_removed_model_rejects_waiters_drains_and_is_forgotten() -> None:
    a, b = make_model("a"), make_model("b")
    h = Harness([a, b], POLICY)
    ta = bring_up(h, A)
    tb = h.request("b")
    h.send(ev.ModelsReplaced((make_model("c"),)))
    assert h.outcome[tb][0] == "model_not_found"
    assert h.outcome[h.request("a")][0] == "model_not_found"
    assert stops(h) == [(B, False)], "b was loading: stopped at once; a drains"
    h.send(ev.ModelStopped(B))
    h.finish(ta)
    h.send(ev.ModelStopped(A))
    forgotten = {e.model.name for e in h.effects(ev.ModelForgotten)}  # type: ignore[attr-defined]
    assert forgotten == {"a", "b"}
    assert set(h.arbiter.slots) == {C}


def test_models_without_a_group_run_side_by_side() -> None:
    h = Harness([make_model("a"), make_model("b")], POLICY)
    bring_up(h, A)
    bring_up(h, B)
    assert stops(h) == [] and h.effects(ev.Preempted) == []


def test_waiting_reason_and_wake_schedule() -> None:
    h = shared(a=100, b=200)
    bring_up(h, A)
    h.request("b")
    assert h.arbiter.waiting_reason(B) == "swap"
    assert h.wake == 10.0, "the hold's end is the next decision point"


def test_server_crash_after_ready_fails_the_model_and_backs_off_before_restarting() -> None:
    h = Harness([make_model("a")], ArbiterPolicy(restart_backoff=5, cold_start_timeout=600))
    bring_up(h, A)
    waiting_before_crash = h.request("a")
    fx = h.send(ev.ModelCrashed(A, "model server exited with code 1"))
    assert [e.new for e in fx if isinstance(e, ev.PhaseChanged)] == ["Failed"]
    assert h.outcome[waiting_before_crash] == ("granted", 0.0)
    during_backoff = h.request("a")
    assert h.outcome[during_backoff][0] == "activation_failed"
    assert starts(h) == [A]
    h.advance(6)
    h.request("a")
    assert starts(h) == [A, A]


def test_crash_reported_while_a_stop_is_in_progress_is_an_ordinary_stop() -> None:
    h = shared(a=100, b=200)
    h.finish(bring_up(h, A))
    h.request(B)
    h.advance(11)
    assert (A, False) in stops(h)
    fx = h.send(ev.ModelCrashed(A, "exited"))
    assert "Failed" not in [e.new for e in fx if isinstance(e, ev.PhaseChanged)]


def test_a_stop_the_arbiter_did_not_ask_for_says_so_and_an_asked_stop_names_its_cause() -> None:
    h = Harness([make_model("a", idleTimeout="60s"), make_model("b")], POLICY)
    h.finish(bring_up(h, A))
    h.send(ev.ModelStopped(A))  # e.g. in a cluster the manager scaled it down
    h.finish(bring_up(h, "default/b"))
    h.send(ev.Unload("default/b"))
    h.send(ev.ModelStopped("default/b"))
    stopped = [(c.model, c.detail) for c in h.effects(ev.PhaseChanged) if c.new == "Idle"]
    assert stopped == [(A, "stopped outside this process (in a cluster: by the manager)"),
                       ("default/b", "unloaded")]
