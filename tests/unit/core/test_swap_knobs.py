"""One set of swap knobs for both engines (``flexinfer.core.swap_knobs``): ``serve``, the manager and the in-cluster
proxy read the same variables with the same defaults, and a starvation bound that does not fit inside a waiting
request's budget stops ``serve`` and the proxy at start-up with an error naming both settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer.assembly.cluster_proxy import cluster_proxy_settings
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.election import ElectionPolicy
from flexinfer.core.errors import ConfigError
from flexinfer.core.swap_knobs import SwapKnobs, check_bound_fits, swap_knobs
from flexinfer.local.config import local_config
from flexinfer.manager.config import manager_config


def test_both_engines_default_to_the_same_knobs() -> None:
    knobs = swap_knobs({})
    assert knobs == SwapKnobs(min_hold=15.0, max_wait=30.0)
    assert (ArbiterPolicy().min_hold, ArbiterPolicy().max_wait) == (knobs.min_hold, knobs.max_wait)
    assert (ElectionPolicy().min_hold, ElectionPolicy().max_wait) == (knobs.min_hold, knobs.max_wait)


def test_serve_and_the_manager_read_the_same_variables(tmp_path: Path) -> None:
    env = {"FLEXINFER_SWAP_MIN_HOLD": "2s", "FLEXINFER_SWAP_MAX_WAIT": "20s"}
    local = local_config(env, tmp_path).policy
    election = manager_config(env).policy.election
    assert (local.min_hold, local.max_wait) == (election.min_hold, election.max_wait) == (2.0, 20.0)


def test_a_bound_that_does_not_fit_the_budget_is_refused_naming_both_settings(tmp_path: Path) -> None:
    check_bound_fits(59.0, 60.0)
    message = "FLEXINFER_SWAP_MAX_WAIT \\(5m\\) must be shorter than PROXY_COLD_START_TIMEOUT \\(1m\\)"
    with pytest.raises(ConfigError, match=message):
        check_bound_fits(300.0, 60.0)
    too_long = {"FLEXINFER_SWAP_MAX_WAIT": "5m"}
    with pytest.raises(ConfigError, match=message):
        local_config(too_long, tmp_path, cold_start_timeout=60.0)
    with pytest.raises(ConfigError, match=message):
        cluster_proxy_settings(too_long, cold_start_timeout=60.0)
    assert cluster_proxy_settings(too_long, cold_start_timeout=600.0).cold_start_timeout == 600.0
