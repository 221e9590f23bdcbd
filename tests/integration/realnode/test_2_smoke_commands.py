"""Journey step 2: the design note's runtime smoke commands, verbatim (grep where rg is absent), on the
installed release: the manager's Deployment is `deploy/flexinfer-controller` with the runtime env, and a
port-forward to 8080 serves /metrics with both lifecycle histograms. Then the runbook's names section: its
label-selector commands find the release's objects, and the metrics Service has the Go chart's name,
`flexinfer-controller-metrics`, and serves the same /metrics."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from support.kube_testbed import REPO_ROOT, ensure_kubectl
from support.real_node import RealNode, wait_for

GET_ENV = ("kubectl -n flexinfer-system get deploy flexinfer-controller -o yaml"
           " | grep -E 'DEFAULT_SHM_SIZE_LIMIT|DEFAULT_FLASH_LOADER|FLEXINFER_OTEL|OTEL_EXPORTER_OTLP_ENDPOINT'")
PORT_FORWARD = "kubectl -n flexinfer-system port-forward deploy/flexinfer-controller {local}:8080"
METRICS = "curl -s localhost:{local}/metrics | grep -E 'flexinfer_model_(cold_start|swap)_duration_seconds'"
SERVICE_FORWARD = "kubectl -n flexinfer-system port-forward svc/flexinfer-controller-metrics {local}:8080"
RUNBOOK = REPO_ROOT / "docs" / "operations" / "rocm-gfx1100.md"


def shell_env(node: RealNode) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(node.kubeconfig),
            "PATH": f"{ensure_kubectl().parent}{os.pathsep}{os.environ['PATH']}"}


def sh(node: RealNode, command: str) -> str:
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True,
                          env=shell_env(node), timeout=60, check=False)
    assert proc.returncode == 0, f"{command!r} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout


def local_port() -> int:
    """8080 as in the note; another free port only when 8080 is taken on this machine."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 8080))
            return 8080
        except OSError:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])


@contextmanager
def port_forward(node: RealNode, local: int, command: str = PORT_FORWARD) -> Iterator[None]:
    with subprocess.Popen(["bash", "-c", "exec " + command.format(local=local)], env=shell_env(node),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        try:
            yield
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_the_controller_deployment_carries_the_runtime_env(node: RealNode, release: str) -> None:
    out = sh(node, GET_ENV)
    assert "DEFAULT_SHM_SIZE_LIMIT" in out and "DEFAULT_FLASH_LOADER_ENABLED" in out
    assert "FLEXINFER_OTEL" not in out  # tracing is off by default


def test_port_forward_serves_both_lifecycle_histograms(node: RealNode, release: str) -> None:
    local = local_port()
    with port_forward(node, local):
        command = ["bash", "-c", METRICS.format(local=local)]
        out = wait_for(lambda: subprocess.run(command, capture_output=True, text=True, timeout=10, check=False).stdout,
                       30, "/metrics via port-forward")
    assert "# TYPE flexinfer_model_cold_start_duration_seconds histogram" in out
    assert "# TYPE flexinfer_model_swap_duration_seconds histogram" in out


def names_block() -> list[str]:
    """The shell lines of the runbook's names section (release `flexinfer` in `flexinfer-system`)."""
    section = RUNBOOK.read_text().split("## Names of the installed objects", 1)[1].split("\n## ", 1)[0]
    return section.split("```sh\n", 1)[1].split("```", 1)[0].strip().splitlines()


def test_the_runbook_selectors_find_the_release_objects(node: RealNode, release: str) -> None:
    lines = [line for line in names_block() if "port-forward" not in line]
    out = sh(node, "\n".join([*lines, 'echo "MANAGER=$MANAGER"']))
    assert "MANAGER=deployment.apps/flexinfer-controller" in out
    for name in ("deployment.apps/flexinfer-controller", "deployment.apps/flexinfer-proxy",
                 "service/flexinfer-controller-metrics", "service/flexinfer-proxy"):
        assert name in out, out


def test_the_metrics_service_serves_the_manager_metrics(node: RealNode, release: str) -> None:
    local = local_port()
    with port_forward(node, local, SERVICE_FORWARD):
        command = ["bash", "-c", METRICS.format(local=local)]
        out = wait_for(lambda: subprocess.run(command, capture_output=True, text=True, timeout=10, check=False).stdout,
                       30, "/metrics via the metrics Service")
    assert "# TYPE flexinfer_model_cold_start_duration_seconds histogram" in out
