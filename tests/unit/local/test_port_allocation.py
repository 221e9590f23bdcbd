"""Free-port allocation for model servers."""

from __future__ import annotations

import socket

from flexinfer.local.ports import PortAllocator, probe_free_port


def test_probe_returns_a_bindable_port() -> None:
    port = probe_free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        assert sock.getsockname()[1] == port > 0


def test_allocated_ports_are_distinct_until_released() -> None:
    allocator = PortAllocator()
    ports = [allocator.allocate() for _ in range(20)]
    assert len(set(ports)) == 20
    assert allocator.taken == frozenset(ports)
    allocator.release(ports[0])
    allocator.release(ports[0])
    assert ports[0] not in allocator.taken


def test_never_hands_out_a_taken_port(monkeypatch) -> None:
    allocator = PortAllocator()
    answers = iter([5000, 5000, 5001])
    monkeypatch.setattr("flexinfer.local.ports.probe_free_port", lambda host: next(answers))
    assert allocator.allocate() == 5000
    assert allocator.allocate() == 5001
