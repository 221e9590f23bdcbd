"""Reconcile scale: how long ``flexinfer manager`` takes to reconcile N existing Models, and its memory.

For each N (default 100, 500, 1000; 10 Models per shared group) the benchmark creates N Models in a fresh
namespace of the testbed apiserver, then starts the manager as a subprocess watching that namespace and
measures the time until every Model has a phase in its status (seen through a watch on the Models, so the
benchmark puts no load on the manager while it works), the reconciles per second (from the manager's own
``flexinfer_reconcile_duration_seconds_count``, one scrape at the end), the manager's CPU time (which other load
on the machine moves far less than the wall time) and its peak RSS (VmHWM, after that scrape, so a scrape's cost
counts). An empty manager (no Models, one scrape) is measured first as the memory baseline.

It prints a table with the peak RSS each step adds per Model, then the growth exponents: the slope of log(time)
against log(N) over the sizes, and of log(peak RSS above the empty manager) against log(N). 1.0 is linear (fixed
costs pull both below 1 at small sizes); a pass whose cost grows with the Models outside its unit shows as an
exponent above 1, and as ms/model and KB/model that grow from row to row.

    .venv/bin/python bench/reconcile_scale.py                 # starts its own testbed (built if missing)
    .venv/bin/python bench/reconcile_scale.py --sizes 100 500 --kubeconfig /path/to/kubeconfig
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
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


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read().decode()


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def cpu_s(pid: int) -> float:
    """CPU time (user + system) the process has used: unlike the wall time, barely moved by other load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def manager(kubeconfig: Path, namespace: str, port: int, health: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "POD_NAMESPACE": namespace, "FLEXINFER_OTEL_ENABLED": "false"}
    cmd = [sys.executable, "-m", "flexinfer.cli.main", "manager", "--kubeconfig", str(kubeconfig),
           "--namespace", namespace, "--metrics-bind-address", f"127.0.0.1:{port}",
           "--health-probe-bind-address", f"127.0.0.1:{health}", "--log-level", "WARNING"]
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


async def until_phased(client: AsyncClient, namespace: str, count: int) -> None:
    """Return once every one of the ``count`` Models of ``namespace`` has ``status.phase`` (a watch, no polling)."""
    phased: set[str] = set()
    async for _, obj in client.watch(ModelResource, namespace=namespace):
        if (obj.status or {}).get("phase"):
            phased.add(obj.metadata.name)
        if len(phased) >= count:
            return


async def supervised(work: asyncio.Task[None], proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait for ``work``; fail when the manager exits first or ``TIMEOUT_S`` passes (checked every second)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not work.done():
        await asyncio.wait({work}, timeout=1.0)
        if not work.done() and (proc.poll() is not None or time.monotonic() > deadline):
            work.cancel()
            raise RuntimeError(f"manager exited or timed out; see {log}")
    await work


def ready(port: int) -> bool:
    try:
        return bool(urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).status == 200)
    except OSError:
        return False


async def empty_namespace(kubeconfig: Path) -> str:
    client = AsyncClient(KubeConfig.from_file(kubeconfig), field_manager="bench")
    namespace = f"bench-0-{os.getpid() % 10000}"
    await client.create(Namespace.from_dict({"metadata": {"name": namespace}}))
    await client.close()
    return namespace


def baseline(kubeconfig: Path, timeout: float = 120.0) -> float:
    """Peak RSS (MB) of a manager watching an empty namespace, once ready (snapshot loaded, kopf running) and
    scraped once."""
    namespace = asyncio.run(empty_namespace(kubeconfig))
    port, health, log = free_port(), free_port(), Path(tempfile.gettempdir()) / f"{namespace}-manager.log"
    with manager(kubeconfig, namespace, port, health, log) as proc:
        deadline = time.monotonic() + timeout
        while not ready(health):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"manager exited or never became ready; see {log}")
            time.sleep(0.2)
        scrape(port)
        return peak_rss_mb(proc.pid)


async def run_size(kubeconfig: Path, count: int) -> dict[str, float]:
    client = AsyncClient(KubeConfig.from_file(kubeconfig), field_manager="bench")
    namespace = f"bench-{count}-{os.getpid() % 10000}"
    created = await create_models(client, namespace, count)
    port, log = free_port(), Path(tempfile.gettempdir()) / f"{namespace}-manager.log"
    watching = asyncio.create_task(until_phased(client, namespace, count))
    with manager(kubeconfig, namespace, port, free_port(), log) as proc:
        started = time.monotonic()
        await supervised(watching, proc, log)
        elapsed = time.monotonic() - started
        cpu = cpu_s(proc.pid)
        text = scrape(port)
        rss = peak_rss_mb(proc.pid)
    reconciles = metric(text, 'flexinfer_reconcile_duration_seconds_count{controller="model"}')
    errors = metric(text, 'flexinfer_reconcile_errors_total{controller="model"}')
    found = await deployments(client, namespace)
    await client.close()
    assert found == count, f"{found} Deployments for {count} Models"
    return {"n": count, "create_s": created, "reconciled_s": elapsed, "reconciles": reconciles,
            "per_s": reconciles / elapsed, "cpu_s": cpu, "rss_mb": rss, "errors": errors}


def exponent(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of log(y) against log(x): 1.0 for linear growth, 2.0 for quadratic."""
    xs, ys = [math.log(x) for x, _ in points], [math.log(y) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def table(rows: list[dict[str, float]], base_mb: float) -> str:
    head = (f"{'Models':>7} {'create (s)':>11} {'all reconciled (s)':>19} {'ms/model':>9} {'reconciles':>11} "
            f"{'reconciles/s':>13} {'errors':>7} {'CPU (s)':>8} {'peak RSS (MB)':>14} {'KB/model':>9}")
    lines = [head, "-" * len(head)]
    previous = (0.0, base_mb)
    for r in rows:
        step = (r["rss_mb"] - previous[1]) * 1024 / (r["n"] - previous[0])
        previous = (r["n"], r["rss_mb"])
        lines.append(f"{int(r['n']):>7} {r['create_s']:>11.1f} {r['reconciled_s']:>19.1f} "
                     f"{1000 * r['reconciled_s'] / r['n']:>9.1f} {int(r['reconciles']):>11} {r['per_s']:>13.0f} "
                     f"{int(r['errors']):>7} {r['cpu_s']:>8.1f} {r['rss_mb']:>14.1f} {step:>9.0f}")
    lines.append(f"\nCPU: the manager's, start to all reconciled. Empty manager: {base_mb:.1f} MB peak RSS; KB/model: "
                 "the peak RSS added per Model since the row above (the first row: since the empty manager)")
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        time_exp = exponent([(r["n"], r["reconciled_s"]) for r in rows])
        above = [(r["n"], r["rss_mb"] - base_mb) for r in rows if r["rss_mb"] > base_mb]
        mem_exp = f"N^{exponent(above):.2f}" if len(above) > 1 else "n/a"
        per_model = (last["rss_mb"] - first["rss_mb"]) * 1024 / (last["n"] - first["n"])
        times = last["reconciled_s"] / first["reconciled_s"]
        lines.append(f"{last['n'] / first['n']:.0f}x Models -> {times:.1f}x time, RSS +{per_model:.0f} KB/Model; "
                     f"growth exponents (1.00 = linear): time N^{time_exp:.2f}, peak RSS above the empty manager "
                     f"{mem_exp}")
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
        base_mb = baseline(args.kubeconfig)
        print(f"empty manager: {base_mb:.1f} MB", flush=True)
        rows = []
        for size in args.sizes:
            rows.append(asyncio.run(run_size(args.kubeconfig, size)))
            print(f"N={size}: {rows[-1]['reconciled_s']:.1f}s", flush=True)
        print(table(rows, base_mb))
    finally:
        if testbed is not None:
            testbed.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
