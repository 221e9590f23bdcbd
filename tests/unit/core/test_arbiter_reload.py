"""A manifest reload (``ModelsReplaced``) restarts only the models whose manifest changed: a running changed
model drains, stops and starts again with its new manifest; untouched models keep running; a changed model
that failed forgets its backoff. Without ``restart_changed`` (the in-cluster proxy, where the manager rolls
servers out) a changed model keeps running unless it moved to another group."""

from __future__ import annotations

from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.policy import ArbiterPolicy
from support.arbiter_harness import Harness
from support.recording_engine import make_model

A, B = "default/a", "default/b"
POLICY = ArbiterPolicy(max_wait=30, min_hold=10, drain_timeout=20, cold_start_timeout=600, queue_limit=3,
                       restart_changed=True)


def starts(h: Harness) -> list[str]:
    return [e.model for e in h.effects(ev.StartModel)]  # type: ignore[attr-defined]


def stops(h: Harness) -> list[str]:
    return [e.model for e in h.effects(ev.StopModel)]  # type: ignore[attr-defined]


def bring_up(h: Harness, key: str) -> int:
    t = h.request(key)
    h.send(ev.ModelReady(key, f"ep:{key}"))
    return t


def test_changed_running_model_drains_then_restarts_with_its_new_manifest_and_untouched_ones_keep_running() -> None:
    a, b = make_model("a"), make_model("b")
    h = Harness([a, b], POLICY)
    bring_up(h, A)
    tb = bring_up(h, B)
    changed = make_model("b", idleTimeout="10m")
    h.send(ev.ModelsReplaced((a, changed)))
    assert stops(h) == [], "b has a request in flight: it drains first"
    waiting = h.request("b")
    assert waiting not in h.outcome, "a request during the drain waits for the restarted server"
    h.finish(tb)
    assert stops(h) == [B]
    h.send(ev.ModelStopped(B))
    assert starts(h) == [A, B, B]
    assert h.arbiter.slots[B].model == changed
    h.send(ev.ModelReady(B, "ep:b2"))
    assert h.outcome[waiting][0] == "granted"
    assert h.outcome[h.request("a")][0] == "granted" and stops(h) == [B], "a was never stopped"


def test_unchanged_models_are_not_touched_and_idle_changed_ones_do_not_start() -> None:
    a, b = make_model("a"), make_model("b")
    h = Harness([a, b], POLICY)
    bring_up(h, A)
    h.send(ev.ModelsReplaced((a, make_model("b", idleTimeout="10m"))))
    assert stops(h) == [] and starts(h) == [A]


def test_changed_model_forgets_its_failed_starts() -> None:
    h = Harness([make_model("a")], POLICY)
    h.request("a")
    h.send(ev.ModelStartFailed(A, "bad command"))
    assert h.outcome[h.request("a")][0] != "granted", "backing off"
    h.send(ev.ModelsReplaced((make_model("a", idleTimeout="10m"),)))
    h.request("a")
    assert starts(h) == [A, A], "the fixed manifest starts at once"


def test_a_model_removed_and_added_back_while_draining_keeps_its_state_and_starts_once() -> None:
    a = make_model("a")
    h = Harness([a], POLICY)
    ta = bring_up(h, A)
    h.send(ev.ModelsReplaced(()))
    h.send(ev.ModelsReplaced((a,)))
    waiting = h.request("a")
    assert stops(h) == [] and starts(h) == [A], "still draining its request in flight"
    h.finish(ta)
    assert stops(h) == [A]
    h.send(ev.ModelStopped(A))
    assert starts(h) == [A, A], "started again for the waiting request"
    h.send(ev.ModelReady(A, "ep:a2"))
    assert h.outcome[waiting][0] == "granted"
    assert h.effects(ev.ModelForgotten) == [] and A in h.arbiter.slots


def test_without_restart_changed_a_changed_model_keeps_running_unless_it_moved_group() -> None:
    policy = ArbiterPolicy(restart_changed=False)
    h = Harness([make_model("a", group="g"), make_model("b")], policy)
    bring_up(h, A)
    bring_up(h, B)
    h.send(ev.ModelsReplaced((make_model("a", group="g", idleTimeout="10m"), make_model("b", idleTimeout="10m"))))
    assert stops(h) == []
    h.send(ev.ModelsReplaced((make_model("a", group="h"), make_model("b", idleTimeout="10m"))))
    assert stops(h) == [], "a drains its request in flight off the old group"
    assert h.arbiter.slots[A].drain_until is not None and not h.arbiter.slots[A].wanted
