"""Composition root of ``flexinfer manager`` (the Kubernetes operator).

The Kubernetes engine (``flexinfer.manager.program``) with the lifecycle metrics and the memory metrics of groups
that pack by memory on an injected registry (served on ``/metrics``) and ``model.reconcile`` spans from opt-in
tracing. Called by ``flexinfer.cli.manager`` and the integration tests.
"""

from __future__ import annotations

import asyncio
import functools
import signal
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from flexinfer.manager.config import ManagerConfig, manager_config
from flexinfer.manager.connection import load_kubeconfig
from flexinfer.manager.program import Manager
from flexinfer.observability.exposition import exposition
from flexinfer.observability.memory_metrics import MemoryMetrics
from flexinfer.observability.metrics import LifecycleMetrics
from flexinfer.observability.tracing.config import tracing_settings
from flexinfer.observability.tracing.provider import init_tracing
from flexinfer.observability.tracing.reconcile import reconcile_span
from flexinfer.settings import Environment, environment


async def run_manager(config: ManagerConfig | None = None, *, env: Environment | None = None,
                      stop: asyncio.Event | None = None, registry: CollectorRegistry | None = None,
                      on_serving: Callable[[Manager], None] | None = None, handle_signals: bool = False) -> int:
    """``flexinfer manager``: run until ``stop`` is set (or SIGTERM/SIGINT with ``handle_signals``).

    Returns 0 on a requested stop and 1 when leadership or the kopf operator is lost. ``on_serving`` gets
    the ``Manager`` once its HTTP endpoints listen (tests read ``manager.endpoints`` from it).
    """
    env = env if env is not None else environment()
    config = config if config is not None else manager_config(env)
    registry = registry if registry is not None else CollectorRegistry()
    stop = stop if stop is not None else asyncio.Event()
    trace_settings = tracing_settings(env)  # every setting is checked before anything connects
    kubeconfig = load_kubeconfig(config.kubeconfig, env)
    tracing = init_tracing("flexinfer-manager", trace_settings)
    metrics = LifecycleMetrics(registry)
    scope = functools.partial(reconcile_span, tracing, metrics=metrics)
    manager = Manager(config, kubeconfig, functools.partial(exposition, registry), metrics, scope)
    memory = manager.reconciler.memory
    MemoryMetrics(memory.groups, memory.needs).register(registry)
    if handle_signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    try:
        return await manager.run(stop, on_serving)
    finally:
        tracing.shutdown()
