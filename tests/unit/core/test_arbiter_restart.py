"""Crash restarts in the pure arbiter: a Ready model whose server exits and that the arbiter brings back by itself
(pinned: ``minReplicas >= 1``) gives one cold-start sample from the crash to Ready again, with the stage
breakdown (the restart backoff counts as ``server_start``); a model that is not kept running, or that loses its
group's GPU meanwhile, is measured from its own next start, never from the old crash."""

from __future__ import annotations

from flexinfer.core.arbiter import events as ev
from flexinfer.core.arbiter.policy import ArbiterPolicy
from support.arbiter_harness import Harness
from support.recording_engine import make_model

A, B = "default/a", "default/b"
POLICY = ArbiterPolicy(restart_backoff=5, min_hold=0, max_wait=1000, cold_start_timeout=600)


def cold_starts(h: Harness, model: str = A) -> list[float]:
    return [e.seconds for e in h.effects(ev.ObserveColdStart) if e.model == model]  # type: ignore[attr-defined]


def stages_since(h: Harness, index: int, model: str = A) -> dict[str, float]:
    """The stage samples of ``model`` after the first ``index`` effects of the log."""
    later = [e for _, e in h.log[index:] if isinstance(e, ev.ObserveStage) and e.model == model]
    return {e.stage: e.seconds for e in later}


def crash_ready_pinned_model() -> Harness:
    """a (minReplicas 1) starts by itself and is Ready 2 s later; at t=10 its server exits."""
    h = Harness([make_model("a", minReplicas=1)], POLICY)
    assert [e.model for e in h.effects(ev.StartModel)] == [A]  # type: ignore[attr-defined]
    h.advance(2)
    h.send(ev.ModelReady(A, "ep:a"))
    h.advance(8)
    fx = h.send(ev.ModelCrashed(A, "model server exited with code 137"))
    assert [e.new for e in fx if isinstance(e, ev.PhaseChanged)] == ["Failed"]
    return h


def test_a_pinned_model_whose_ready_server_crashes_is_measured_from_the_crash_to_ready_again() -> None:
    h = crash_ready_pinned_model()
    mark = len(h.log)
    h.advance(5)  # the restart backoff
    assert [e.model for e in h.effects(ev.StartModel)] == [A, A]  # type: ignore[attr-defined]
    h.send(ev.StageReached(A, "staging"))
    h.advance(2)
    h.send(ev.StageReached(A, "health"))
    h.advance(1)
    h.send(ev.ModelReady(A, "ep:a"))
    assert h.now == 18.0
    assert cold_starts(h) == [2.0, 8.0], "one sample for the way back, from the crash (t=10) to Ready (t=18)"
    assert stages_since(h, mark) == {"server_start": 5.0, "staging": 2.0, "health": 1.0}
    done = [e for e in h.effects(ev.ActivationDone) if e.model == A][-1]  # type: ignore[attr-defined]
    assert (done.kind, done.started_at, done.ended_at, done.result) == ("cold_start", 10.0, 18.0, "success")


def test_a_restart_whose_start_fails_records_no_sample_and_the_next_one_counts_from_its_own_start() -> None:
    h = crash_ready_pinned_model()
    h.advance(5)
    h.send(ev.ModelStartFailed(A, "out of memory"))  # t=15; the next backoff is 10 s
    assert [e.result for e in h.effects(ev.ActivationDone)][-1] == "failure"  # type: ignore[attr-defined]
    h.advance(10)
    assert len(h.effects(ev.StartModel)) == 3
    h.advance(3)
    h.send(ev.ModelReady(A, "ep:a"))
    assert cold_starts(h) == [2.0, 3.0]


def test_a_crashed_model_that_is_not_kept_running_waits_for_a_request_and_is_measured_from_it() -> None:
    h = Harness([make_model("a")], POLICY)
    first = h.request("a")
    h.advance(2)
    h.send(ev.ModelReady(A, "ep:a"))
    h.finish(first)
    h.send(ev.ModelCrashed(A, "exited"))
    h.advance(100)
    assert len(h.effects(ev.StartModel)) == 1, "no request, no restart"
    start_on_request(h, 3)
    assert cold_starts(h) == [2.0, 3.0], "from the request after the backoff, not from the crash"


def test_unloading_a_crashed_pinned_model_drops_its_restart() -> None:
    h = crash_ready_pinned_model()
    h.send(ev.Unload(A))
    h.advance(60)
    assert len(h.effects(ev.StartModel)) == 1, "unloaded: not restarted"
    start_on_request(h, 4)
    assert cold_starts(h) == [2.0, 4.0], "measured from the request, not from the crash a minute earlier"


def test_a_crashed_member_that_loses_the_gpu_is_measured_from_its_own_next_start() -> None:
    h = Harness([make_model("a", group="g", minReplicas=1), make_model("b", group="g", idleTimeout="30s")], POLICY)
    h.advance(2)
    h.send(ev.ModelReady(A, "ep:a"))
    h.send(ev.ModelCrashed(A, "exited"))  # t=2: a backs off until t=7
    ticket = h.request("b")  # the GPU is free: b takes it
    assert [e.model for e in h.effects(ev.StartModel)] == [A, B]  # type: ignore[attr-defined]
    h.advance(1)
    h.send(ev.ModelReady(B, "ep:b"))
    h.finish(ticket)
    h.advance(31)  # b's idle timeout (from t=3): b stops, a (pinned) starts at t=34
    h.send(ev.ModelStopped(B))
    assert [e.model for e in h.effects(ev.StartModel)][-1] == A  # type: ignore[attr-defined]
    h.advance(2)
    h.send(ev.ModelReady(A, "ep:a"))
    assert cold_starts(h) == [2.0, 2.0], "from a's own start once b gave the GPU back, not from its crash"


def start_on_request(h: Harness, seconds: float) -> None:
    """A request for ``a`` starts it; its server is Ready ``seconds`` later."""
    h.request("a")
    h.advance(seconds)
    h.send(ev.ModelReady(A, "ep:a"))
