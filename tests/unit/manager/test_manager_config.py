"""``flexinfer manager`` settings: flags over environment over defaults; bad values named."""

from __future__ import annotations

import pytest

from flexinfer.core.errors import ConfigError
from flexinfer.manager.config import manager_config
from flexinfer.manager.http import parse_bind_address


def test_defaults_follow_the_spec() -> None:
    config = manager_config({})
    assert (config.metrics_bind_address, config.health_probe_bind_address) == (":8080", ":8081")
    assert not config.leader_elect and config.pod_namespace == "default"
    assert config.policy.drain_timeout == 60.0 and config.identity


def test_environment_and_flags() -> None:
    env = {"METRICS_BIND_ADDRESS": ":9090", "LEADER_ELECT": "true", "POD_NAMESPACE": "fi", "POD_NAME": "mgr-0",
           "FLEXINFER_SWAP_DRAIN_TIMEOUT": "2m", "DEFAULT_SHM_SIZE_LIMIT": "4Gi"}
    config = manager_config(env, metrics_bind_address="127.0.0.1:0", leader_elect=False)
    assert config.metrics_bind_address == "127.0.0.1:0" and not config.leader_elect
    assert (config.pod_namespace, config.identity, config.policy.drain_timeout) == ("fi", "mgr-0", 120.0)
    assert config.defaults.shm_size_limit == "4Gi"


@pytest.mark.parametrize(("env", "fragment"), [
    ({"METRICS_BIND_ADDRESS": "localhost"}, "--metrics-bind-address"),
    ({"HEALTH_PROBE_BIND_ADDRESS": ":99999"}, "--health-probe-bind-address"),
    ({"FLEXINFER_SWAP_DRAIN_TIMEOUT": "soon"}, "FLEXINFER_SWAP_DRAIN_TIMEOUT"),
])
def test_bad_values_are_named(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        manager_config(env)


def test_bind_addresses() -> None:
    assert parse_bind_address(":8080", "x") == ("0.0.0.0", 8080)
    assert parse_bind_address("[::1]:0", "x") == ("::1", 0)
    assert parse_bind_address("0", "x") is None
