"""``flexinfer uninstall``: stop the manager and every model before the manager is removed.

The Helm chart runs it as its pre-delete hook (``helm uninstall``); run it by hand before removing a release
without hooks. What it does, in order, is in ``flexinfer.manager.uninstall``. The controller defaults come from
the same environment as the manager's (``DEFAULT_FLASH_LOADER_IMAGE``: the cleanup Jobs' image). Exit 0 when
nothing is left running, 1 when something is (named on stderr).
"""

from __future__ import annotations

import argparse
from typing import Any

from flexinfer.cli.arguments import add_log_arguments, duration, start_logging
from flexinfer.settings import environment

DEFAULT_TIMEOUT = "4m"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "uninstall", help="stop the manager and every model before removing a release (the chart's pre-delete hook)",
        description="Stop the manager, stop every Model (Deployment, Service and finalizer removed, the node's tmpfs "
                    "emptied; the Model objects are kept), then wait for the cleanup Jobs and the model pods.")
    parser.add_argument("--namespace", required=True, metavar="NS", help="the release namespace (the manager's)")
    parser.add_argument("--manager", required=True, metavar="NAME", help="the manager's Deployment")
    parser.add_argument("--model-namespace", action="append", default=[], metavar="NS",
                        help="only the Models of this namespace (repeatable; default: all, as the manager watches)")
    parser.add_argument("--timeout", type=duration, default=duration(DEFAULT_TIMEOUT), metavar="DURATION",
                        help=f"give up waiting after this long (default {DEFAULT_TIMEOUT})")
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig file (default: KUBECONFIG, in-cluster, "
                        "~/.kube/config)")
    add_log_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    import asyncio  # the Kubernetes client: imported only for a run

    from lightkube import AsyncClient

    from flexinfer.core.controller_defaults import controller_defaults
    from flexinfer.manager.client import FIELD_MANAGER
    from flexinfer.manager.connection import load_kubeconfig
    from flexinfer.manager.uninstall import Uninstall, UninstallPlan
    from flexinfer.settings import warn

    env = environment()
    start_logging(args, env)
    plan = UninstallPlan(namespace=args.namespace, manager=args.manager, timeout=args.timeout,
                         defaults=controller_defaults(env, warn=warn), model_namespaces=tuple(args.model_namespace))
    kubeconfig = load_kubeconfig(args.kubeconfig, env)

    async def main() -> int:
        client = AsyncClient(kubeconfig, field_manager=FIELD_MANAGER)
        try:
            return await Uninstall(client, plan).run()
        finally:
            await client.close()

    return asyncio.run(main())
