"""``flexinfer manager``: run the Kubernetes operator (flags and environment as spec §7).

Flags override ``METRICS_BIND_ADDRESS``, ``HEALTH_PROBE_BIND_ADDRESS`` and ``LEADER_ELECT``; see
``flexinfer.manager.config`` for every variable. Exit 0 on SIGTERM/SIGINT, 1 when leadership is lost.
"""

from __future__ import annotations

import argparse
from typing import Any

from flexinfer.cli.arguments import add_log_arguments, start_logging
from flexinfer.settings import environment


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "manager", help="run the Kubernetes manager (reconciles Models)",
        description="Reconcile Model resources into Deployments and Services; shared-GPU swaps; status.")
    parser.add_argument("--metrics-bind-address", metavar="ADDR",
                        help="Prometheus /metrics address ([HOST]:PORT, 0 = off; env METRICS_BIND_ADDRESS, :8080)")
    parser.add_argument("--health-probe-bind-address", metavar="ADDR",
                        help="/healthz and /readyz address (env HEALTH_PROBE_BIND_ADDRESS, default :8081)")
    parser.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=None,
                        help="hold the flexinfer-manager Lease in POD_NAMESPACE before acting (env LEADER_ELECT)")
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default: KUBECONFIG, in-cluster, "
                        "~/.kube/config)")
    parser.add_argument("--namespace", action="append", default=[], metavar="NS",
                        help="watch only this namespace (repeatable; default: all namespaces)")
    add_log_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    import asyncio  # the operator's whole stack: imported only when the manager runs

    from flexinfer.assembly.manager import run_manager
    from flexinfer.manager.config import manager_config

    env = environment()
    start_logging(args, env)
    config = manager_config(env, metrics_bind_address=args.metrics_bind_address,
                            health_probe_bind_address=args.health_probe_bind_address,
                            leader_elect=args.leader_elect, kubeconfig=args.kubeconfig, namespaces=args.namespace)
    return asyncio.run(run_manager(config, env=env, handle_signals=True))
