"""The arbiter announces every model it knows (``ModelDeclared``) before anything else happens to it, so
observers can create its series at zero: the initial models with the first event, later ones when they are
added or their spec changes."""

from __future__ import annotations

from flexinfer.core.arbiter import events as ev
from support.arbiter_harness import Harness
from support.recording_engine import make_model


def declared(h: Harness) -> list[str]:
    return [e.model.name for e in h.effects(ev.ModelDeclared)]


def test_initial_models_are_declared_first_and_once() -> None:
    h = Harness([make_model("a"), make_model("b")])
    assert [type(e) for _, e in h.log][:2] == [ev.ModelDeclared, ev.ModelDeclared]
    h.send(ev.Tick(h.now))
    assert declared(h) == ["a", "b"]


def test_added_and_changed_models_are_declared_and_unchanged_ones_are_not() -> None:
    a, b = make_model("a"), make_model("b")
    h = Harness([a, b])
    h.send(ev.ModelsReplaced((a, make_model("b", group="g"), make_model("c"))))
    assert declared(h) == ["a", "b", "b", "c"]
    assert [e.model.group for e in h.effects(ev.ModelDeclared)][2] == "g"
