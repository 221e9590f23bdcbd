"""Reconcile scale: how long ``flexinfer manager`` takes to reconcile N existing Models, and its memory.

For each N (default 100, 500, 1000; 10 Models per shared group) the benchmark creates N Models in a fresh
namespace of the testbed apiserver, then starts the manager as a subprocess watching that namespace and
measures the time until every Model has a phase and a Deployment, the reconciles per second (from the
manager's own ``flexinfer_reconcile_duration_seconds_count``), and the manager's peak RSS (VmHWM).
It prints a table plus per-model cost, so linear growth is visible.

    .venv/bin/python bench/reconcile_scale.py                 # starts its own testbed (built if missing)
    .venv/bin/python bench/reconcile_scale.py --sizes 100 500 --kubeconfig /path/to/kubeconfig
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from lightkube import AsyncClient, KubeConfig
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Namespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))

from flexinfer.manager.client import ModelResource  # noqa: E402
from support.kube_testbed import KubeTestbed  # noqa: E402

GROUP_SIZE = 10
TIMEOUT_S = 1800.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def model(name: str, namespace: str, group: str, priority: int) -> dict[str, object]:
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"backend": "vllm", "source": f"HF://bench/{name}",
                     "gpu": {"vendor": "amd", "shared": group, "priority": priority}, "cache": {"strategy": "Local"}}}


async def create_models(client: AsyncClient, namespace: str, count: int) -> float:
    started = time.monotonic()
    await client.create(Namespace.from_dict({"metadata": {"name": namespace}}))
    gate = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with gate:
            body = model(f"m{i:04d}", namespace, f"g{i // GROUP_SIZE:03d}", 100 + i % GROUP_SIZE)
            await client.create(ModelResource.from_dict(body))

    await asyncio.gather(*(one(i) for i in range(count)))
    return time.monotonic() - started


def metric(port: int, name: str) -> float:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def phased(port: int) -> int:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return 0
    return sum(1 for line in text.splitlines() if line.startswith("flexinfer_model_phase{") and line.endswith(" 1.0"))


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def manager(kubeconfig: Path, namespace: str, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "POD_NAMESPACE": namespace, "FLEXINFER_OTEL_ENABLED": "false"}
    cmd = [sys.executable, "-m", "flexinfer.cli.main", "manager", "--kubeconfig", str(kubeconfig),
           "--namespace", namespace, "--metrics-bind-address", f"127.0.0.1:{port}",
           "--health-probe-bind-address", f"127.0.0.1:{free_port()}", "--log-level", "WARNING"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def deployments(client: AsyncClient, namespace: str) -> int:
    return len([d async for d in client.list(Deployment, namespace=namespace)])


async def run_size(kubeconfig: Path, count: int) -> dict[str, float]:
    client = AsyncClient(KubeConfig.from_file(kubeconfig), field_manager="bench")
    namespace = f"bench-{count}-{os.getpid() % 10000}"
    created = await create_models(client, namespace, count)
    port, log = free_port(), Path(tempfile.gettempdir()) / f"{namespace}-manager.log"
    with manager(kubeconfig, namespace, port, log) as proc:
        started = time.monotonic()
        while phased(port) < count:
            if proc.poll() is not None or time.monotonic() - started > TIMEOUT_S:
                raise RuntimeError(f"manager exited or timed out; see {log}")
            await asyncio.sleep(0.2)
        elapsed = time.monotonic() - started
        reconciles = metric(port, 'flexinfer_reconcile_duration_seconds_count{controller="model"}')
        errors = metric(port, 'flexinfer_reconcile_errors_total{controller="model"}')
        rss = peak_rss_mb(proc.pid)
    found = await deployments(client, namespace)
    await client.close()
    assert found == count, f"{found} Deployments for {count} Models"
    return {"n": count, "create_s": created, "reconciled_s": elapsed, "reconciles": reconciles,
            "per_s": reconciles / elapsed, "rss_mb": rss, "errors": errors}


def table(rows: list[dict[str, float]]) -> str:
    head = (f"{'Models':>7} {'create (s)':>11} {'all reconciled (s)':>19} {'ms/model':>9} {'reconciles':>11} "
            f"{'reconciles/s':>13} {'errors':>7} {'peak RSS (MB)':>14}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{int(r['n']):>7} {r['create_s']:>11.1f} {r['reconciled_s']:>19.1f} "
                     f"{1000 * r['reconciled_s'] / r['n']:>9.1f} {int(r['reconciles']):>11} {r['per_s']:>13.0f} "
                     f"{int(r['errors']):>7} {r['rss_mb']:>14.1f}")
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        ratio = last["n"] / first["n"]
        lines.append(f"\n{ratio:.0f}x Models -> {last['reconciled_s'] / first['reconciled_s']:.1f}x time, "
                     f"RSS +{(last['rss_mb'] - first['rss_mb']) * 1024 / (last['n'] - first['n']):.0f} KB/Model")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--kubeconfig", type=Path, help="an apiserver with the CRDs applied (default: a new testbed)")
    args = parser.parse_args()
    testbed: KubeTestbed | None = None
    if args.kubeconfig is None:
        testbed = KubeTestbed(Path(tempfile.mkdtemp(prefix="bench-kube-")) / "tb").start()
        testbed.kubectl("apply", "-f", str(REPO / "charts" / "flexinfer" / "crds"))
        testbed.kubectl("wait", "--for=condition=established", "--timeout=60s", "crd", "--all")
        assert testbed.kubeconfig is not None
        args.kubeconfig = testbed.kubeconfig
    try:
        rows = []
        for size in args.sizes:
            rows.append(asyncio.run(run_size(args.kubeconfig, size)))
            print(f"N={size}: {rows[-1]['reconciled_s']:.1f}s", flush=True)
        print(table(rows))
    finally:
        if testbed is not None:
            testbed.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
