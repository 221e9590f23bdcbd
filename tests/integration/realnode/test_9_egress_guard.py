"""Last step: nothing any cluster process or pod sent left the machine (the egress guard of hack/kube-node
counted no drop). A non-zero count is a bug to fix at its source, never to hide."""

from __future__ import annotations

from support.real_node import RealNode


def test_the_egress_guard_dropped_nothing(node: RealNode) -> None:
    assert node.guard_drops() == 0
