"""Every field's wire name is the Go CRD's: camelCase as Kubernetes writes it (``p2pPort``, not ``p2PPort``)."""

from __future__ import annotations

import re

from flexinfer.api.modelcache import ModelCache
from flexinfer.assembly.model_reference import field_rows
from support.resource_builders import make_cache


def test_modelcache_accepts_the_go_p2p_keys() -> None:
    cache = make_cache(flash_loader={"enabled": True, "p2p": True, "p2pPort": 9000})
    assert cache.spec.flash_loader is not None
    assert cache.spec.flash_loader.p2p is True and cache.spec.flash_loader.p2p_port == 9000
    assert cache.to_dict()["spec"]["flashLoader"]["p2pPort"] == 9000


def test_no_wire_name_capitalises_after_a_digit() -> None:
    odd = [path for path, _ in field_rows(ModelCache) if re.search(r"[0-9][A-Z]", path)]
    assert odd == []
