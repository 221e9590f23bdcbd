"""``TicketQueue`` (flexinfer.core.arbiter.state): the earliest deadline and arrival it keeps at hand are
always those of the tickets it holds, whatever order they come and go in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flexinfer.api.key import ModelKey
from flexinfer.core.arbiter.state import Ticket, TicketQueue

KEY = ModelKey("default", "a")
steps = st.lists(st.one_of(
    st.tuples(st.just("add"), st.floats(0, 100), st.floats(0, 100)),
    st.tuples(st.just("pop"), st.integers(0, 40), st.just(0.0)),
    st.tuples(st.just("clear"), st.just(0.0), st.just(0.0)),
    st.tuples(st.just("due"), st.floats(0, 100), st.just(0.0)),
), max_size=80)


@given(steps)
def test_minimums_match_the_tickets_held(script: list[tuple[str, float, float]]) -> None:
    queue, model, ids = TicketQueue(), {}, iter(range(1, 1000))
    for op, a, b in script:
        if op == "add":
            ticket = Ticket(next(ids), KEY, arrived=b, deadline=a)
            queue[ticket.id] = model[ticket.id] = ticket
        elif op == "pop" and model:
            ticket_id = sorted(model)[int(a) % len(model)]
            assert queue.pop(ticket_id) is model.pop(ticket_id)
        elif op == "clear":
            queue.clear()
            model.clear()
        elif op == "due":
            assert queue.due(a) == [t for t in model.values() if t.deadline <= a]
        assert dict(queue) == model and list(queue) == list(model)
        assert queue.earliest_deadline() == min((t.deadline for t in model.values()), default=None)
        assert queue.oldest_arrival() == min((t.arrived for t in model.values()), default=None)
    assert queue.pop(10_000) is None
