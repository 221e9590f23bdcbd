"""Last step before the node goes down (test_9_host_restored.py): nothing any cluster process or pod sent left
the machine (the egress guard of hack/kube-node counted no drop). A non-zero count is a bug to fix at its
source, never to hide; the kernel log names each dropped packet (prefix ``flexinfer-node-guard:``).

A packet the host sends to a ClusterIP is routed before kube-proxy's rules translate it. When no rule
translates it (the Service was removed a moment ago and the host's connection still closes with a FIN, or the
Service is not programmed yet), it used to follow the default route to the external interface, where the guard
dropped it. ``hack/kube-node up`` routes the Service range to the node's empty bridge instead; the first test
sends such a packet on purpose and checks that it never reaches the guard."""

from __future__ import annotations

import ipaddress
import socket

from support.real_node import RealNode

SERVICE_RANGE = ipaddress.ip_network("10.96.0.0/24")
"""hack/kube-node's ``SVC_CIDR``."""


def unallocated_cluster_ip(node: RealNode) -> str:
    """An address of the Service range that no Service holds: no rule of kube-proxy translates it."""
    taken = {item["spec"].get("clusterIP") for item in node.get("services", "--all-namespaces")["items"]}
    return next(str(ip) for ip in reversed(list(SERVICE_RANGE.hosts())) if str(ip) not in taken)


def test_an_untranslated_packet_to_the_service_range_stays_on_the_host(node: RealNode) -> None:
    before = node.guard_drops()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        # Sends a SYN nobody translates; fails (timeout, or no route to host once the neighbour lookup gives up).
        assert sock.connect_ex((unallocated_cluster_ip(node), 80)) != 0
    assert node.guard_drops() == before, "the host's packet to the Service range took the default route"


def test_the_egress_guard_dropped_nothing(node: RealNode) -> None:
    assert node.guard_drops() == 0
