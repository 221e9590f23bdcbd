"""``flexinfer proxy [--host 0.0.0.0] [--port 8080] [--kubeconfig PATH]``: the in-cluster OpenAI-compatible proxy.

Serves every Model of ``POD_NAMESPACE`` behind one endpoint: Models come from a watch cache, a request for a
model that is not Ready signals demand (its ``ModelDemand`` report) and waits on the watch until the manager
reports it Ready, then it is forwarded to ``status.endpoint``. Settings: ``PROXY_*`` (validated at start,
exit 1 naming the variable), ``POD_NAMESPACE``, ``FLEXINFER_PROXY_ALL_NAMESPACES``, ``FLEXINFER_OTEL_*``.
Runs ``flexinfer.assembly.run_proxy`` until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
from typing import Any

from flexinfer.cli.arguments import add_listen_arguments, add_log_arguments, start_logging
from flexinfer.settings import environment


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "proxy", help="run the in-cluster OpenAI-compatible proxy (scale-from-zero, swap-aware queueing)",
        description="Run the in-cluster proxy: resolves request model names from a watch cache of Models, "
                    "signals demand to the manager through its ModelDemand report, holds requests until the "
                    "model is Ready and forwards them to its Service. Environment: PROXY_* (queue, timeouts, "
                    "auth, rate limits, shutdown), POD_NAMESPACE (default 'default'), "
                    "FLEXINFER_PROXY_ALL_NAMESPACES, FLEXINFER_OTEL_ENABLED and OTEL_EXPORTER_OTLP_*.",
    )
    add_listen_arguments(parser, "0.0.0.0")
    parser.add_argument("--kubeconfig", metavar="PATH", default=None,
                        help="kubeconfig file (default: $KUBECONFIG, the in-cluster service account, "
                             "then ~/.kube/config)")
    add_log_arguments(parser, access_log=True)
    return parser


def run(args: argparse.Namespace) -> int:
    # the proxy's whole stack: imported only when the proxy runs
    from flexinfer.assembly.proxy import run_proxy
    from flexinfer.proxy.listen_config import listen_address

    env = environment()
    host, port = listen_address(env, host=args.host, port=args.port, default_host="0.0.0.0")
    start_logging(args, env)
    return run_proxy(host=host, port=port, kubeconfig=args.kubeconfig)
