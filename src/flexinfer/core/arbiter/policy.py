"""The arbiter's policy knobs: starvation bound, anti-thrash hold, drain, queue limit, restart backoff, the
memory budgets of the groups that pack by memory."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ArbiterPolicy:
    """Tunable swap/queue policy. Defaults are the documented ones (docs/design/swapping.md)."""

    max_wait: float = 30.0
    """Starvation bound: a model whose oldest waiting ticket is this old wins the GPU next."""
    min_hold: float = 15.0
    """Anti-thrash: a model keeps the GPU this long after Ready (never delays a starving model)."""
    drain_timeout: float = 30.0
    """How long an outgoing model may finish in-flight requests before it is stopped anyway."""
    cold_start_timeout: float = 60.0
    """Per-ticket wait budget when the model has no ``spec.serverless.coldStartTimeout``."""
    queue_limit: int = 100
    """Waiting tickets per model; one more is rejected with ``QueueFullError``."""
    max_concurrency: int = 0
    """Granted tickets per model at once on top of the model's own parallel capacity (``spec.config.parallel``,
    1 for llama.cpp): the smaller one applies, 0 = only the model's own (``PROXY_MAX_CONCURRENCY_PER_MODEL``).
    A request beyond it waits in the model's queue, under its one deadline, like a request for a cold model."""
    restart_backoff: float = 5.0
    """Backoff after the first failed start; doubles per consecutive failure up to the max."""
    restart_backoff_max: float = 300.0
    restart_changed: bool = False
    """A model whose manifest changed restarts (drain, stop, start): the local engine runs the manifest itself.
    Off where something else rolls the server out (the in-cluster proxy: the manager does)."""
    owns_scaling: bool = True
    """This arbiter decides when a model runs without requests: it keeps pinned models running (``minReplicas >=
    1``, or ``serverless.enabled: false``, started without a request) and stops a Ready model nobody used for
    its ``idleTimeout``. Off where another program owns scaling (the in-cluster proxy: the manager keeps
    ``minReplicas`` and scales idle models to zero): a model then starts only for a request or a preload and
    stops only when told (unload, removal, shutdown) or when its engine reports it stopped."""
    group_budgets: Mapping[str, float] = field(default_factory=dict)
    """MiB by shared group (``namespace/group``, or a bare group name for every namespace): a group with a budget
    keeps as many members running as fit (``flexinfer.core.arbiter.packing``); the others run one at a time."""

    def backoff(self, failures: int) -> float:
        """Backoff after ``failures`` consecutive failed starts (``failures`` >= 1)."""
        return float(min(self.restart_backoff * 2 ** max(failures - 1, 0), self.restart_backoff_max))
