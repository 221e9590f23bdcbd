"""A real Kubernetes control plane for integration tests, driven through ``hack/kube-testbed``.

Integration tests (and their fixtures) use :class:`KubeTestbed` to get etcd + kube-apiserver
(optionally kube-controller-manager) on loopback with a token kubeconfig, and :func:`run_kubectl`
to talk to it with the pinned kubectl from ``hack/get-helm``. Missing binaries are built on first
use (about 5 minutes, cached under ``$FLEXINFER_CACHE``); a failed build raises, it never skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = REPO_ROOT / "charts" / "flexinfer" / "crds"
HACK_DIR = REPO_ROOT / "hack"
KUBE_COMPONENTS = ("kube-apiserver", "kube-controller-manager")
BUILD_TIMEOUT_S = 40 * 60


class KubeTestbedError(RuntimeError):
    """A testbed script failed; the message carries the tail of its output."""


def cache_dir() -> Path:
    """The shared build/download cache (``$FLEXINFER_CACHE`` or ``~/.cache/flexinfer``)."""
    configured = os.environ.get("FLEXINFER_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "flexinfer"


def _run_script(args: Sequence[str | Path], timeout: float) -> str:
    """Run a hack/ script; return its stdout, raise KubeTestbedError with its stderr on failure."""
    proc = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-30:])
        raise KubeTestbedError(f"{' '.join(map(str, args))} exited {proc.returncode}:\n{tail}")
    return proc.stdout


def ensure_kube_binaries() -> Path:
    """Return the directory holding kube-apiserver/kube-controller-manager, building them if needed."""
    bin_dir = cache_dir() / "kube" / "bin"
    if not all(os.access(bin_dir / name, os.X_OK) for name in KUBE_COMPONENTS):
        _run_script([HACK_DIR / "kube-testbed", "build"], timeout=BUILD_TIMEOUT_S)
    return bin_dir


def ensure_kubectl() -> Path:
    """Return the pinned kubectl binary, fetching it (with helm) through hack/get-helm if needed."""
    kubectl = cache_dir() / "bin" / "kubectl"
    if not os.access(kubectl, os.X_OK):
        _run_script([HACK_DIR / "get-helm"], timeout=300)
    return kubectl


def ensure_helm() -> Path:
    """Return the pinned helm binary (fetched together with kubectl)."""
    ensure_kubectl()
    return cache_dir() / "bin" / "helm"


def run_kubectl(
    kubeconfig: Path, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run the pinned kubectl against ``kubeconfig``; raise KubeTestbedError on failure if ``check``."""
    cmd = [
        str(ensure_kubectl()),
        "--kubeconfig",
        str(kubeconfig),
        "--cache-dir",
        str(Path(kubeconfig).parent / "kubectl-cache"),
        *args,
    ]
    proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise KubeTestbedError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _read_env(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key: value for key, value in pairs}


class KubeTestbed:
    """etcd + kube-apiserver (+ optional kube-controller-manager) in a directory of its own.

    Use ``with KubeTestbed(directory=tmp) as tb:`` or ``tb = KubeTestbed().start(tmp)`` / ``tb.stop()``.
    After start: ``kubeconfig`` (Path), ``server`` (https URL), ``token`` (bearer, system:masters).
    """

    def __init__(
        self,
        directory: Path | str | None = None,
        *,
        with_controller_manager: bool = False,
        controllers: Sequence[str] | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.with_controller_manager = with_controller_manager or controllers is not None
        self.controllers = tuple(controllers) if controllers is not None else None
        self.timeout = timeout
        self.kubeconfig: Path | None = None
        self.server: str | None = None
        self.token: str | None = None

    def start(self, directory: Path | str | None = None) -> KubeTestbed:
        """Start the control plane (building binaries first if absent) and wait until it is ready."""
        if directory is not None:
            self.directory = Path(directory)
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="kube-testbed-"))
        ensure_kube_binaries()
        ensure_kubectl()
        out = _run_script(self._start_args(), timeout=self.timeout + 30)
        self.kubeconfig = Path(out.strip().splitlines()[-1])
        env = _read_env(self.directory / "testbed.env")
        self.server, self.token = env["KUBE_SERVER"], env["KUBE_TOKEN"]
        return self

    def _start_args(self) -> list[str]:
        args = [
            str(HACK_DIR / "kube-testbed"),
            "start",
            "--dir",
            str(self.directory),
            "--timeout",
            str(int(self.timeout)),
        ]
        if self.controllers is not None:
            args += ["--controllers", ",".join(self.controllers)]
        elif self.with_controller_manager:
            args.append("--with-controller-manager")
        return args

    def pids(self) -> dict[str, int]:
        """PIDs of the running components, by name (empty once stopped)."""
        if self.directory is None or not self.directory.is_dir():
            return {}
        return {p.stem: int(p.read_text()) for p in self.directory.glob("*.pid")}

    def stop(self) -> None:
        """Stop every component by PID (SIGTERM, then SIGKILL after a grace) and remove the directory."""
        if self.directory is not None and self.directory.exists():
            _run_script([HACK_DIR / "kube-testbed", "stop", "--dir", str(self.directory)], timeout=60)
        self.kubeconfig = None

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this testbed."""
        if self.kubeconfig is None:
            raise KubeTestbedError("testbed is not started")
        return run_kubectl(self.kubeconfig, *args, input=input, check=check, timeout=timeout)

    def install_crds(self) -> KubeTestbed:
        """Apply the chart's CRDs and wait until every CRD is established."""
        self.kubectl("apply", "-f", str(CRD_DIR))
        self.kubectl("wait", "--for=condition=established", "--timeout=60s", "crd", "--all")
        return self

    def kubectl_json(self, *args: str, timeout: float = 60.0) -> Any:
        """Run ``kubectl ... -o json`` and return the decoded document."""
        return json.loads(self.kubectl(*args, "-o", "json", timeout=timeout).stdout)

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG pointing at this testbed (for child processes, e.g. kopf)."""
        if self.kubeconfig is None:
            raise KubeTestbedError("testbed is not started")
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def __enter__(self) -> KubeTestbed:
        if self.kubeconfig is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
