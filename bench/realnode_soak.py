"""Soak on the real node: ``bench/soak.py``'s storm windows against the in-cluster proxy (``hack/kube-node``; root).

Uses the node if it is up (else starts it and stops it at the end), the images ``hack/build-images`` builds and
the chart installed as in tests/integration/realnode, with the proxy's JSON access lines, its request budget
(``--proxy-budget``: PROXY_COLD_START_TIMEOUT and PROXY_QUEUE_TIMEOUT) and the swap knobs (``--min-hold``,
``--max-wait``: swap.minHold, swap.maxWait; the proxy refuses to start unless maxWait is shorter than its budget).
Two or more of the storm's tiny llama.cpp Models (``--models``; tests/support/storm.py, same priorities) share
the node's single ``amd.com/gpu`` in one group, without a coldStartTimeout of their own, so the proxy's budget is
every waiting request's budget. The storm (the local soak's mix: plain requests, streams, dropped streams,
abandoned requests) goes to the proxy's ClusterIP Service from the host; the client's budget (``--budget``) is
longer than the proxy's, so a request the proxy gives up on is a typed error and only one nobody answered is
``bad``. Defaults: all four storm models (tiny-a and tiny-b 100, tiny-c 150, tiny-d 200), 300 requests per 5-minute
window (1/s), at most 32 at once, client budget 180 s, proxy budget 150 s, the chart's swap.minHold 15 s and
swap.maxWait 30 s. A swap on the node takes 6 to 15 s, sometimes ~60 s (the winner's pod stays Pending after the
loser's is gone), so a rotation of four members outlasts the 30 s bound and every member starves: the load that
found the wait-marker gap and the one-request-per-swap rotation (docs/performance.md, "Soak").

Each window's row has soak.py's columns, with the figures taken in the cluster: queue waits from the proxy's
access lines (``kubectl logs --timestamps`` of the window), swaps from the manager's
``flexinfer_model_swap_duration_seconds_count`` (decision → incoming model Ready, summed over the Models), the
resident memory and open descriptors of the proxy's and the manager's processes (the containers' init processes:
the pods run on this host, found by container ID in ``/proc/*/cgroup``), and the proxy's
``flexinfer_proxy_event_loop_tasks``. Last, the growth line, the pods' restarts and the egress guard's drops.

    sudo .venv/bin/python bench/realnode_soak.py --duration 1800            # docs/performance.md
    sudo .venv/bin/python bench/realnode_soak.py --duration 600 --window 180 --requests 180

Not part of the test suite: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from soak import (
    Figures,
    arguments,
    event_loop_tasks,
    granted_waits,
    json_lines,
    metric_samples,
    process_figures,
    soak,
)

from support import real_node
from support.real_node import NAMESPACE, RealNode, wait_for
from support.storm import STORM_MODELS

COMPONENTS = ("proxy", "manager")
"""The chart's components whose processes are watched (label ``app.kubernetes.io/component``, container name)."""
SERVERLESS = "{enabled: true, idleTimeout: 10m}"
"""No coldStartTimeout of the Models' own: the proxy's PROXY_COLD_START_TIMEOUT is the budget."""
DEFAULT_MODELS = ("tiny-a", "tiny-b", "tiny-c", "tiny-d")
"""The lowest and the highest priority of the storm's models (docs/performance.md says why not all four)."""
MANAGER_METRICS_PORT = 8080
SWAPS = "flexinfer_model_swap_duration_seconds_count"


def container_pid(container_id: str) -> int:
    """The host PID of the init process (PID 1 in its namespace) of the container ``container_id``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if container_id not in (proc / "cgroup").read_text():
                continue
            nspid = next(line for line in (proc / "status").read_text().splitlines() if line.startswith("NSpid:"))
        except OSError:  # the process ended meanwhile
            continue
        if nspid.split()[-1] == "1":
            return int(proc.name)
    raise LookupError(f"no process of container {container_id} on this host")


class ClusterTarget:
    """The release's proxy Service, with probes of the proxy and manager pods (``Target`` of bench/soak.py)."""

    processes = COMPONENTS

    def __init__(self, node: RealNode) -> None:
        self.node = node
        self.url = "http://" + node.get("service", "flexinfer-proxy", "-n", NAMESPACE)["spec"]["clusterIP"]
        self._pids: dict[str, int] = {}
        self._since = datetime.now(UTC)
        self._swaps = self._swap_count()

    def pod(self, component: str) -> dict[str, Any]:
        items: list[dict[str, Any]] = self.node.get(
            "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component={component}")["items"]
        return next(p for p in items if p["status"].get("phase") == "Running")

    def restarts(self, component: str) -> int:
        return sum(c.get("restartCount", 0) for c in self.pod(component)["status"].get("containerStatuses", []))

    def _process(self, component: str) -> tuple[float, int]:
        status = next(c for c in self.pod(component)["status"]["containerStatuses"] if c["name"] == component)
        container_id = status["containerID"].split("://", 1)[1]
        if container_id not in self._pids:
            self._pids[container_id] = container_pid(container_id)
        return process_figures(self._pids[container_id])

    def _swap_count(self) -> float:
        ip = self.pod("manager")["status"]["podIP"]
        samples = metric_samples(f"http://{ip}:{MANAGER_METRICS_PORT}/metrics")
        return sum(value for name, _, value in samples if name == SWAPS)

    def _waits(self, since: datetime, until: datetime) -> list[float]:
        """``queue_wait_s`` of the proxy's access lines logged after ``since`` and up to ``until``."""
        out = self.node.kubectl("logs", "-n", NAMESPACE, self.pod("proxy")["metadata"]["name"], "-c", "proxy",
                                "--timestamps", f"--since-time={since.strftime('%Y-%m-%dT%H:%M:%SZ')}").stdout
        kept = []
        for line in out.splitlines():
            stamp, _, text = line.partition(" ")
            at = datetime.fromisoformat(stamp[:26] + "+00:00")
            if since < at <= until:
                kept.append(text)
        return granted_waits(json_lines(kept))

    def figures(self) -> Figures:
        until = datetime.now(UTC)
        waits, self._since = self._waits(self._since, until), until
        total = self._swap_count()
        swaps, self._swaps = int(total - self._swaps if total >= self._swaps else total), total  # reset: restart
        return Figures(waits, swaps, [self._process(c) for c in COMPONENTS], event_loop_tasks(self.url))


def setup(node: RealNode, args: argparse.Namespace) -> ClusterTarget:
    """Images, the chart with the soak's values, the chosen storm Models (only they) in one shared group."""
    node.import_images(*real_node.build_images("flexinfer", "llamacpp"))
    budget = f"{args.proxy_budget:g}s"
    real_node.install_chart(node, "proxy.logging.format=json", f"proxy.timeouts.coldStart={budget}",
                            f"proxy.timeouts.queue={budget}", f"swap.minHold={args.min_hold:g}s",
                            f"swap.maxWait={args.max_wait:g}s")
    node.kubectl("delete", "mdl", *STORM_MODELS, "-n", NAMESPACE, "--ignore-not-found", "--wait=true",
                 "--timeout=180s", timeout=200)  # a reused node: every run starts from the same state
    wait_for(lambda: not node.get("pods", "-n", NAMESPACE, "-l", "flexinfer.ai/model")["items"], 180,
             "no model pods left")
    real_node.create_weights(node, args.models)
    node.apply(real_node.shared_models_manifest({m: STORM_MODELS[m] for m in args.models}, SERVERLESS))
    wait_for(lambda: all(node.get("mdl", m, "-n", NAMESPACE).get("status", {}).get("phase") in ("Idle", "Ready")
                         for m in args.models), 120, "the soak's Models Idle (or Ready: a proxy's recent demand)")
    return ClusterTarget(node)


def main() -> int:
    parser = arguments(__doc__.splitlines()[0], requests=300, concurrency=32, budget=180.0)
    parser.add_argument("--proxy-budget", type=float, default=150.0,
                        help="the proxy's PROXY_COLD_START_TIMEOUT and PROXY_QUEUE_TIMEOUT, s (150)")
    parser.add_argument("--min-hold", type=float, default=15.0, help="the chart's swap.minHold, s (15)")
    parser.add_argument("--max-wait", type=float, default=30.0, help="the chart's swap.maxWait, s (30)")
    parser.add_argument("--models", type=lambda text: tuple(text.split(",")), default=DEFAULT_MODELS,
                        help=f"two or more of the storm's models, comma-separated ({','.join(DEFAULT_MODELS)})")
    args = parser.parse_args()
    if not set(args.models) <= set(STORM_MODELS) or len(set(args.models)) < 2:
        parser.error(f"--models: two or more of {', '.join(STORM_MODELS)}")
    if not args.max_wait < args.proxy_budget < args.budget:
        parser.error("need --max-wait < --proxy-budget < --budget: the starvation bound must fire within the "
                     "proxy's budget, and the proxy must answer (or fail) a request before its client gives up")
    reason = real_node.unavailable_reason()
    if reason:
        print(reason)
        return 1
    node = real_node.start()
    try:
        target = setup(node, args)
        print(f"proxy {target.url}, models {', '.join(f'{m} ({STORM_MODELS[m]})' for m in args.models)}: "
              f"{args.requests} requests per {args.window:g} s window, at most "
              f"{args.concurrency} at once, client budget {args.budget:g} s; proxy budget {args.proxy_budget:g} s, "
              f"swap.minHold {args.min_hold:g} s, swap.maxWait {args.max_wait:g} s\n", flush=True)
        asyncio.run(soak(target, args))
        print(f"restarts: {', '.join(f'{c} {target.restarts(c)}' for c in COMPONENTS)}; "
              f"egress guard drops: {node.guard_drops()}")
    finally:
        if node.started:
            real_node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
