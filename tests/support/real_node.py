"""The one-node cluster where pods run (``hack/kube-node``) and the images it runs (``hack/build-images``).

Used by the ``realnode`` integration tests (tests/integration/realnode). Starting a node changes the host
(iptables, sysctls, cgroups, bridges; ``hack/kube-node down`` restores it), so it needs root, and
``FLEXINFER_SKIP_REALNODE=1`` skips those tests on a developer's workstation. A node that is already up is
reused and left running; a node these helpers started is stopped by ``stop``.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.helm_chart import CHART_DIR, pinned_helm
from support.kube_testbed import HACK_DIR, KubeTestbedError, run_kubectl
from support.tiny_gguf import write_tiny_gguf

SKIP_ENV = "FLEXINFER_SKIP_REALNODE"
NAMESPACE = "flexinfer-system"
RELEASE = "flexinfer"
WEIGHTS_CLAIM = "tiny-weights"
"""PersistentVolumeClaim (over a hostPath PV) holding tiny-a.gguf and tiny-b.gguf (conftest ``weights``)."""
NODE_TIMEOUT_S = 300.0
IMAGE_TIMEOUT_S = 45 * 60.0
LLAMACPP_IMAGE = "localhost/flexinfer/llamacpp-server:0.3.36"
"""The CPU model-server image ``hack/build-images llamacpp`` builds: llama.cpp's ``llama-server`` (tag = the
pinned llama-cpp-python sdist it is built from)."""
GROUP_IMAGE = "localhost/flexinfer/flexinfer-llamacpp:0.1.0-0.3.36"
"""The group-pod image ``hack/build-images group`` builds: FlexInfer with llama.cpp's ``llama-server`` beside it
(tag = FlexInfer's version and the llama-server's)."""
IMAGE_VALUES = (
    f"controller.runtime.backendImages.llamacpp={LLAMACPP_IMAGE}",
    "controller.runtime.modelImagePullPolicy=IfNotPresent",
)
"""The only values the testbed adds to `helm install`: the local llama.cpp server image, used as present."""
SHARED_GROUP = "node-gpu"
TIMINGS: dict[str, float] = {}
"""Measured durations of the session's steps, printed by the real-node conftest at the end."""


def record(step: str, seconds: float) -> None:
    TIMINGS[step] = seconds


def readme_quickstart(block: int = 0) -> list[str]:
    """The commands of README's "Quickstart: Kubernetes" command blocks (0: the gfx1100 one with `helm install`,
    1: examples/cpu-node's), comments stripped, in order."""
    from support.kube_testbed import REPO_ROOT

    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("## Quickstart: Kubernetes", 1)[1].split("\n## ", 1)[0]
    blocks = [part for part in section.split("\n\n") if part.strip() and all(
        line.startswith("    ") for line in part.strip("\n").splitlines())]
    return [line.split("  #", 1)[0].strip() for line in blocks[block].splitlines() if line.startswith("    ")]


def runbook_command(*words: str) -> str:
    """The one command line of docs/operations/rocm-gfx1100.md's shell blocks containing every one of ``words``,
    comment stripped (the journey tests run the runbook's steps as written)."""
    from support.kube_testbed import REPO_ROOT

    text = (REPO_ROOT / "docs" / "operations" / "rocm-gfx1100.md").read_text()
    blocks = [part.split("```", 1)[0] for part in text.split("```sh\n")[1:]]
    lines = [line.strip().split("  #", 1)[0].strip() for block in blocks for line in block.splitlines()]
    found = [line for line in lines if all(word in line for word in words)]
    assert len(found) == 1, f"the runbook has {len(found)} commands with {words}: {found}"
    return found[0]


def unavailable_reason() -> str | None:
    """Why the real-node tests cannot run here, or ``None`` when they can."""
    if os.environ.get(SKIP_ENV, "").strip() in ("1", "true", "yes"):
        return f"{SKIP_ENV} is set: real-node tests skipped (they change iptables, sysctls, cgroups, bridges)"
    if os.geteuid() != 0:
        return "real-node tests need root (hack/kube-node changes iptables, sysctls, cgroups and links)"
    return None


def _script(args: Sequence[str | Path], timeout: float) -> str:
    env = {**os.environ, "FLEXINFER_NODE_PYTHON": sys.executable}
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-30:])
        raise KubeTestbedError(f"{' '.join(map(str, args))} exited {proc.returncode}:\n{tail}")
    return proc.stdout


VOLATILE_SYSCTLS = ("kernel.ns_last_pid", "kernel.random.", "kernel.perf_event_max_sample_rate", "kernel.tainted")
"""Writable sysctls that are counters or kernel-tuned values, not settings: never compared."""
HOST_ROOTS = (Path("/dev/shm/flexinfer"), Path("/var/lib/flexinfer"))
"""Host directories the node's pods create (hostPath volumes: shared models' flash tmpfs, Local caches)."""


@dataclass(frozen=True)
class HostState:
    """What ``hack/kube-node down`` must give back: every writable sysctl's value, and the entries (three levels
    deep) of the host directories the node's pods create."""

    sysctls: dict[str, str]
    paths: frozenset[str]


def host_state() -> HostState:
    """This host's writable sysctls (``sysctl -a``, a value of several lines joined) and ``HOST_ROOTS`` entries."""
    values: dict[str, list[str]] = {}
    for line in subprocess.run(["sysctl", "-a"], capture_output=True, text=True, check=False).stdout.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and not key.startswith(VOLATILE_SYSCTLS):
            values.setdefault(key, []).append(value)
    sysctls = {key: "\n".join(lines) for key, lines in values.items()
               if os.access(Path("/proc/sys") / key.replace(".", "/"), os.W_OK)}
    paths = {str(p) for root in HOST_ROOTS if root.is_dir()
             for p in (root, *(q for q in root.rglob("*") if len(q.relative_to(root).parts) <= 3))}
    return HostState(sysctls, frozenset(paths))


@dataclass
class RealNode:
    """A running node: its env file's values, whether this process started it, and (then) the host before."""

    env: dict[str, str]
    started: bool
    timings: dict[str, float] = field(default_factory=dict)
    host_before: HostState | None = None

    @property
    def kubeconfig(self) -> Path:
        return Path(self.env["KUBECONFIG"])

    @property
    def state_dir(self) -> Path:
        return Path(self.env["FLEXINFER_NODE_DIR"])

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return run_kubectl(self.kubeconfig, *args, input=input, check=check, timeout=timeout)

    def get(self, *args: str) -> dict[str, Any]:
        """``kubectl get ... -o json`` parsed."""
        out: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return out

    def apply(self, manifest: str) -> None:
        self.kubectl("apply", "-f", "-", input=manifest)

    def guard_drops(self) -> int:
        """Packets the egress guard dropped since ``up`` (IPv4 + IPv6)."""
        return int(_script([HACK_DIR / "kube-node", "guard-drops"], timeout=30).strip())

    def import_images(self, *tars: Path) -> None:
        _script([HACK_DIR / "kube-node", "import", *tars], timeout=300)


def start() -> RealNode:
    """The node, started unless already up (``hack/kube-node up`` is idempotent); when this call starts it, the
    host's state before ``up`` is kept (``host_before``) for the check that ``down`` restores it."""
    probe = subprocess.run([str(HACK_DIR / "kube-node"), "status"], capture_output=True, text=True,
                           timeout=60, check=False)
    before = host_state() if probe.returncode != 0 else None
    began = time.monotonic()
    env_file = Path(_script([HACK_DIR / "kube-node", "up"], timeout=NODE_TIMEOUT_S).strip().splitlines()[-1])
    pairs = (line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    node = RealNode(dict(pairs), started=probe.returncode != 0, host_before=before)
    node.timings["up"] = time.monotonic() - began
    return node


def stop() -> float:
    """``hack/kube-node down``; returns how long it took."""
    began = time.monotonic()
    _script([HACK_DIR / "kube-node", "down"], timeout=NODE_TIMEOUT_S)
    return time.monotonic() - began


def build_images(*names: str) -> list[Path]:
    """``hack/build-images NAME`` for each name (cached by content): the docker-archive tarballs."""
    return [Path(_script([HACK_DIR / "build-images", name], timeout=IMAGE_TIMEOUT_S).strip().splitlines()[-1])
            for name in names]


def wait_for(probe: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``probe`` until it returns a truthy value; ``AssertionError`` with the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}: last={last!r}")


def install_chart(node: RealNode, *values: str) -> None:
    """``helm upgrade --install`` of the chart as RELEASE in NAMESPACE with ``IMAGE_VALUES`` and ``values``
    (``key=value`` each; the chart's defaults for the rest), waiting until the manager and the proxy are Ready."""
    helm = pinned_helm(node.state_dir / "bench-helm").with_kubeconfig(node.kubeconfig)
    sets = [arg for value in (*IMAGE_VALUES, *values) for arg in ("--set", value)]
    helm.run("upgrade", "--install", RELEASE, str(CHART_DIR), "-n", NAMESPACE, "--create-namespace", *sets,
             "--wait", "--timeout", "300s", timeout=330)


WEIGHTS_MANIFEST = """
apiVersion: v1
kind: PersistentVolume
metadata: {{name: flexinfer-{claim}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadOnlyMany]
  storageClassName: local-weights
  persistentVolumeReclaimPolicy: Retain
  hostPath: {{path: {path}, type: Directory}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {claim}, namespace: {namespace}}}
spec:
  accessModes: [ReadOnlyMany]
  storageClassName: local-weights
  volumeName: flexinfer-{claim}
  resources: {{requests: {{storage: 1Gi}}}}
"""



def create_weights(node: RealNode, names: Sequence[str] = ("tiny-a", "tiny-b")) -> str:
    """``<name>.gguf`` for each of ``names`` (default tiny-a.gguf and tiny-b.gguf) on a hostPath PV under the
    node's state dir, bound to WEIGHTS_CLAIM."""
    path = node.state_dir / "weights"
    path.mkdir(exist_ok=True)
    path.chmod(0o755)  # model servers and the flash-loader run as uid 65532
    for seed, name in enumerate(names, start=1):
        write_tiny_gguf(path / f"{name}.gguf", seed=seed).chmod(0o644)
    node.apply(WEIGHTS_MANIFEST.format(claim=WEIGHTS_CLAIM, path=path, namespace=NAMESPACE))
    wait_for(lambda: node.get("pvc", WEIGHTS_CLAIM, "-n", NAMESPACE)["status"].get("phase") == "Bound", 60,
             "the weights claim to be bound")
    return WEIGHTS_CLAIM


EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "cpu-node"
"""README's example that runs on any node: two llama.cpp Models in one shared group, ``Local`` weights."""
LOCAL_CACHE_ROOT = Path("/var/lib/flexinfer/models")
"""Where a ``Local`` cache lives on the node (``<root>/<namespace>/<model>``): the examples' ``model.gguf``."""


def write_example_weights(namespace: str, names: Sequence[str] = ("tiny-a", "tiny-b")) -> list[Path]:
    """A tiny GGUF as ``model.gguf`` in each model's ``Local`` cache directory on this (the node's) host, where
    examples/cpu-node/README.md tells an operator to put one; returns the paths created (never an existing one,
    so ``remove_created`` leaves a host's own files alone)."""
    created: list[Path] = []
    for seed, name in enumerate(names, start=1):
        folder = LOCAL_CACHE_ROOT / namespace / name
        missing = [p for p in (*reversed(folder.parents), folder) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        for path in missing:
            path.chmod(0o755)
        weights = folder / "model.gguf"
        if not weights.exists():
            write_tiny_gguf(weights, seed=seed).chmod(0o644)
            missing.append(weights)
        created += [p for p in missing if p not in created]
    return created


def remove_created(paths: Sequence[Path]) -> None:
    """Remove what ``write_example_weights`` created, deepest first (a directory only when empty)."""
    for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):
        if path.is_dir():
            if not any(path.iterdir()):
                path.rmdir()
        else:
            path.unlink(missing_ok=True)


SHARED_PAIR = {"tiny-a": 100, "tiny-b": 200}
SERVERLESS = "{enabled: true, idleTimeout: 10m, coldStartTimeout: 240s}"


def shared_models_manifest(priorities: Mapping[str, int] = SHARED_PAIR, serverless: str = SERVERLESS) -> str:
    """llama.cpp Models (name → priority; default tiny-a 100 and tiny-b 200) in one shared group on amd.com/gpu,
    weights ``<name>.gguf`` on WEIGHTS_CLAIM (``create_weights``), with ``serverless`` as their spec.serverless."""
    return "".join(f"""
---
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  backend: llamacpp
  source: pvc://{WEIGHTS_CLAIM}/{name}.gguf
  gpu: {{vendor: amd, shared: {SHARED_GROUP}, priority: {priority}}}
  serverless: {serverless}
  cache: {{compilationCache: {{enabled: false}}}}
  resources: {{requests: {{cpu: 50m, memory: 64Mi}}, limits: {{memory: 1Gi}}}}
""" for name, priority in priorities.items())


WATCH_WINDOW_S = 2
"""Server-side timeout of one watch request: how soon a closed ``ApiWatch`` lets its threads go."""


class ApiWatch:
    """Local receipt times (``time.monotonic``) of Deployment, Pod and Model changes in the release namespace (and
    the proxies' ModelDemand reports with ``demands``: their CRD must be installed), from API watch streams (one
    daemon thread each), so tests and benchmarks can time what users cannot see."""

    def __init__(self, node: RealNode, *, demands: bool = False) -> None:
        self.api = node.env["FLEXINFER_NODE_API"]
        self.token = (node.state_dir / "pki" / "admin.token").read_text().strip()
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.tls = ssl.create_default_context()
        self.tls.check_hostname, self.tls.verify_mode = False, ssl.CERT_NONE
        paths = (f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", f"/api/v1/namespaces/{NAMESPACE}/pods",
                 f"/apis/ai.flexinfer/v1alpha2/namespaces/{NAMESPACE}/models")
        if demands:
            paths += (f"/apis/ai.flexinfer/v1alpha1/namespaces/{NAMESPACE}/modeldemands",)
        connected = [threading.Event() for _ in paths]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._watch, args=(path, event), daemon=True)
                         for path, event in zip(paths, connected, strict=True)]
        for thread in self._threads:
            thread.start()
        for event in connected:
            if not event.wait(30):
                self.close()
                raise AssertionError("an API watch did not connect within 30 s")

    def __enter__(self) -> ApiWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop watching: each stream ends within its server-side timeout (``WATCH_WINDOW_S``)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(WATCH_WINDOW_S + 10)

    def _watch(self, path: str, connected: threading.Event) -> None:
        """Short watch windows resumed from the last resourceVersion (no re-list: a re-listed object would
        look like a new change), until ``close``."""
        version = ""
        while not self._stop.is_set():
            query = f"watch=1&timeoutSeconds={WATCH_WINDOW_S}" + (f"&resourceVersion={version}" if version else "")
            req = urllib.request.Request(f"{self.api}{path}?{query}",
                                         headers={"Authorization": f"Bearer {self.token}"})
            with urllib.request.urlopen(req, context=self.tls, timeout=WATCH_WINDOW_S + 30) as stream:
                connected.set()
                for line in stream:
                    item = json.loads(line)
                    obj = item["object"]
                    if item.get("type") == "ERROR":  # the version expired: start over from the current state
                        version = ""
                        break
                    version = obj["metadata"].get("resourceVersion", version)
                    obj["watchEventType"] = item.get("type")  # ADDED, MODIFIED, DELETED: for ``first``'s predicates
                    with self.lock:
                        self.events.append((time.monotonic(), obj["kind"], obj))

    def first(self, after: float, kind: str, name: str | None,
              predicate: Callable[[dict[str, Any]], bool]) -> float | None:
        """When the first change after ``after`` of ``kind`` for model ``name`` (any object: ``None``) matching
        ``predicate`` arrived."""
        with self.lock:
            events = list(self.events)
        for at, k, obj in events:
            meta = obj["metadata"]
            label = meta.get("labels", {}).get("flexinfer.ai/model", meta["name"])
            if at >= after and k == kind and name in (None, label) and predicate(obj):
                return at
        return None


def pod_ready(pod: dict[str, Any]) -> bool:
    """The pod's ``Ready`` condition is True."""
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def manager_pod(node: RealNode) -> dict[str, Any]:
    """The live manager pod: Ready and not terminating (a chart upgrade's rollout leaves the old one listed, with
    an address nothing answers on, until the kubelet removes it); waits for one."""
    def live() -> dict[str, Any] | None:
        pods = node.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=manager")["items"]
        return next((p for p in pods if not p["metadata"].get("deletionTimestamp") and pod_ready(p)), None)
    found: dict[str, Any] = wait_for(live, 120, "a Ready manager pod")
    return found


def manager_metrics_text(node: RealNode) -> str:
    """The live manager pod's /metrics exposition (the host reaches pod IPs)."""
    with urllib.request.urlopen(f"http://{manager_pod(node)['status']['podIP']}:8080/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
    return text


def manager_metrics(node: RealNode) -> dict[tuple[str, str], float]:
    """``(sample name, model)`` → value from the live manager pod's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, s.labels.get("model", "")): s.value
            for family in text_string_to_metric_families(manager_metrics_text(node)) for s in family.samples}
