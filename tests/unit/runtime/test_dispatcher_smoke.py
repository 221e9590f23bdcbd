"""First end-to-end check: a cold start through the dispatcher with the recording engine."""

from __future__ import annotations

from flexinfer.runtime.dispatcher import Dispatcher
from support.recording_engine import FakeClock, RecordingEngine, key, make_model


async def test_cold_start_grants_after_ready(engine: RecordingEngine, clock: FakeClock) -> None:
    model = make_model("tiny")
    async with Dispatcher(engine, [model], clock=clock, auto_tick=False) as d:
        grant = await d.acquire(key("tiny"))
        assert grant.endpoint.base_url == "http://fake.invalid/tiny"
        assert grant.activation == "cold_start"
        assert d.snapshot()[0].in_flight == 1
        grant.release()
        await d.wait_for(lambda: d.snapshot()[0].in_flight == 0, 5)
    assert engine.calls == [("start", "default/tiny"), ("ready", "default/tiny"), ("stop", "default/tiny")]
