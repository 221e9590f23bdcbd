"""The swap policy's knobs, one set for both engines: ``FLEXINFER_SWAP_MIN_HOLD`` and ``FLEXINFER_SWAP_MAX_WAIT``.

The same two rules decide who holds a shared GPU under ``flexinfer serve`` (the arbiter,
``flexinfer.core.arbiter.policy.ArbiterPolicy``) and in a cluster (the manager's election,
``flexinfer.core.election.ElectionPolicy``), with the same names and defaults
(docs/design/swapping.md rule 5):

- ``min_hold``: a model keeps the GPU this long after it became Ready (anti-thrash);
- ``max_wait``: a model whose oldest request has waited this long takes the GPU next, whatever the
  priorities and the hold (the starvation bound), unless the holder still serves older requests or the
  backlog it was started for (``holds_against_starving``).

The starvation bound only helps a request that is still waiting when it fires, so it must be shorter than the
waiting request's budget (``PROXY_COLD_START_TIMEOUT``; ``check_bound_fits``). ``flexinfer serve`` and
``flexinfer proxy`` check it at start-up and stop with a ``ConfigError`` naming both settings; the chart
renders ``swap.maxWait`` into the manager and the proxy alike, so the proxy's check covers the cluster.

``ENV_VARS`` is the documentation table (docs/CONFIGURATION.md, section "Swap policy"). Pure: the callers
pass the environment snapshot. Read by ``flexinfer.local.config``, ``flexinfer.manager.config`` and
``flexinfer.assembly.cluster_proxy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final, TypeVar

from flexinfer.api.units import format_duration
from flexinfer.core.envvalues import EnvReader, EnvVar, Kind
from flexinfer.core.errors import ConfigError

MIN_HOLD: Final = "FLEXINFER_SWAP_MIN_HOLD"
MAX_WAIT: Final = "FLEXINFER_SWAP_MAX_WAIT"
DEFAULT_MIN_HOLD: Final = 15.0
DEFAULT_MAX_WAIT: Final = 30.0
BUDGET_SETTING: Final = "PROXY_COLD_START_TIMEOUT"
"""The setting that bounds how long a request waits for its model (a Model's ``coldStartTimeout`` wins)."""

Moment = TypeVar("Moment", float, datetime)
"""A point in time: the arbiter's monotonic seconds or the election's UTC instants."""


def holds_against_starving(own_oldest: Moment | None, ready_since: Moment | None, starving_oldest: Moment) -> bool:
    """The starvation bound's exception for a Ready holder, in the arbiter and the election alike: its own oldest
    waiting request is at least as old as the starving model's (oldest first: two starving models must not take
    the GPU from each other before either serves), or was already waiting when the holder became Ready (the
    backlog it was started for: when every member starves, a rotation of swaps longer than ``max_wait``, oldest
    first alone would hand the GPU on after one request per swap)."""
    if own_oldest is None:
        return False
    return own_oldest <= starving_oldest or (ready_since is not None and own_oldest < ready_since)


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(MIN_HOLD, "15s", "A model keeps a shared GPU at least this long after Ready; then an idle holder "
           "yields to any waiting model and a busy one to a higher-priority model (anti-thrash; never delays a "
           "starving model). In a cluster `gpu.swapCooldown` can lengthen it for a group.", Kind.DURATION),
    EnvVar(MAX_WAIT, "30s", "Starvation bound: a model whose oldest request waited this long gets the GPU next, "
           "whatever the priorities. Must be shorter than `PROXY_COLD_START_TIMEOUT` (checked at start-up).",
           Kind.DURATION),
)


@dataclass(frozen=True)
class SwapKnobs:
    """The two knobs in seconds."""

    min_hold: float = DEFAULT_MIN_HOLD
    max_wait: float = DEFAULT_MAX_WAIT


def swap_knobs(env: Mapping[str, str]) -> SwapKnobs:
    """Parse both knobs (unset → default); a malformed value is a ``ConfigError`` naming the variable."""
    read = EnvReader(env)
    return SwapKnobs(min_hold=read.duration(MIN_HOLD, DEFAULT_MIN_HOLD),
                     max_wait=read.duration(MAX_WAIT, DEFAULT_MAX_WAIT))


def check_bound_fits(max_wait: float, budget: float, budget_setting: str = BUDGET_SETTING) -> None:
    """``ConfigError`` unless the starvation bound ``max_wait`` is shorter than a waiting request's ``budget``
    (both in seconds): a bound at or past the budget can never fire for a request that still waits."""
    if max_wait < budget:
        return
    raise ConfigError(f"{MAX_WAIT} ({format_duration(max_wait)}) must be shorter than {budget_setting} "
                      f"({format_duration(budget)}): a request would time out before the starvation bound "
                      f"gives its model the GPU; lower {MAX_WAIT} or raise {budget_setting}")
