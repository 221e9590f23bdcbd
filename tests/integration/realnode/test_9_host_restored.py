"""The very last step: `hack/kube-node down` gives the host back as it was before `up`.

Every writable sysctl has its value of before `up` again (the node's components change several: kube-proxy
`bridge-nf-call-iptables` and `route_localnet`, the kubelet `kernel.panic*`, `kernel.keys.*` and
`vm.overcommit_memory`, the bridge plugin `ip_forward`), and nothing is left in the host directories the node's
pods create through hostPath volumes (`/dev/shm/flexinfer`: shared models' flash tmpfs; `/var/lib/flexinfer`:
Local caches). Runs only when this session started the node (else the host before `up` is not known here); the
node is down afterwards, so this module must stay the last one.
"""

from __future__ import annotations

import pytest

from support import real_node
from support.real_node import TIMINGS, RealNode


def test_down_restores_every_sysctl_and_removes_what_the_node_created(node: RealNode) -> None:
    if not node.started or node.host_before is None:
        pytest.skip("the node was up before this session: the host's state before `up` is not known here")
    before = node.host_before
    TIMINGS["node down"] = real_node.stop()
    node.started = False  # down already: the package fixture does not stop it again
    after = real_node.host_state()
    changed = {key: (value, after.sysctls[key]) for key, value in before.sysctls.items()
               if key in after.sysctls and after.sysctls[key] != value}
    assert changed == {}, f"sysctls not restored (before, after): {changed}"
    assert sorted(after.paths - before.paths) == [], "host directories the node created are left"
