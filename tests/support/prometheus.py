"""Prometheus test helpers: ``promtool check metrics`` on an exposition, and a throwaway server.

Used by metrics/observability integration tests. Both ``promtool`` and ``prometheus`` are taken from
PATH (Debian's packages, installed by ``hack/install-system-deps``); a missing binary raises.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

LINT_FINDINGS_RC = 3  # promtool's exit code for "parsed, but lint problems found"


class PrometheusToolError(RuntimeError):
    """A Prometheus binary is missing, failed to start, or answered with an error."""


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise PrometheusToolError(f"{name} not on PATH; run hack/install-system-deps")
    return path


@dataclass(frozen=True)
class PromtoolResult:
    """Outcome of ``promtool check metrics``: lint findings, or a parse error."""

    returncode: int
    findings: tuple[str, ...]  # one "metric_name problem" line per lint finding
    error: str | None  # set when promtool could not parse the exposition at all

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.findings and self.error is None


def check_metrics(exposition: str | bytes) -> PromtoolResult:
    """Lint a text exposition (e.g. ``prometheus_client.generate_latest()``) with promtool."""
    data = exposition.encode() if isinstance(exposition, str) else exposition
    proc = subprocess.run(
        [_binary("promtool"), "check", "metrics"], input=data, capture_output=True, timeout=60, check=False
    )
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).decode().splitlines() if ln.strip()]
    if proc.returncode in (0, LINT_FINDINGS_RC):
        return PromtoolResult(proc.returncode, tuple(lines), None)
    return PromtoolResult(proc.returncode, (), "\n".join(lines) or f"promtool exited {proc.returncode}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _http_get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class PrometheusServer:
    """A Prometheus server on a free loopback port scraping ``targets`` ("host:port") every interval.

    ``with PrometheusServer(["127.0.0.1:8000"], tmp_path) as prom: prom.wait_for('up == 1')``
    Ready in ~0.1 s, but the first sample lands ~5 s after start (Prometheus hands discovered targets
    to the scraper on a fixed 5 s tick), so share one server per test module where possible.
    """

    def __init__(
        self,
        targets: Sequence[str],
        workdir: Path | str,
        *,
        job: str = "test",
        scrape_interval: str = "1s",
        rule_files: Sequence[Path | str] = (),
        metrics_path: str = "/metrics",
        startup_timeout: float = 30.0,
    ) -> None:
        self.targets = list(targets)
        self.workdir = Path(workdir)
        self.job, self.scrape_interval, self.metrics_path = job, scrape_interval, metrics_path
        self.rule_files = [str(Path(p).resolve()) for p in rule_files]
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise PrometheusToolError("prometheus is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _write_config(self) -> Path:
        interval = {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval}
        config = {  # JSON is valid YAML, so no YAML library is needed
            "global": interval,
            "rule_files": self.rule_files,
            "scrape_configs": [
                {"job_name": self.job, "metrics_path": self.metrics_path, "static_configs": [{"targets": self.targets}]}
            ],
        }
        path = self.workdir / "prometheus.yml"
        path.write_text(json.dumps(config, indent=2))
        return path

    def start(self) -> PrometheusServer:
        """Start the server and wait (with a deadline) until /-/ready answers."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        for _attempt in range(3):  # a free port can be taken between probing and binding
            self.port = _free_port()
            self._spawn(config)
            if self._wait_ready():
                return self
            if "address already in use" not in self._log_tail():
                break
        tail = self._log_tail()
        self.stop()
        raise PrometheusToolError(f"prometheus did not become ready:\n{tail}")

    def _spawn(self, config: Path) -> None:
        log = open(self.workdir / "prometheus.log", "ab")  # noqa: SIM115 (owned by the child)
        with log:
            self._proc = subprocess.Popen(
                [
                    _binary("prometheus"),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (self.workdir / "prometheus.pid").write_text(str(self._proc.pid))

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2):
                    return True
            except OSError:
                time.sleep(0.1)
        return False

    def _log_tail(self, lines: int = 20) -> str:
        log = self.workdir / "prometheus.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; returns ``data.result`` (list of {"metric": ..., "value": [ts, "v"]})."""
        body = _http_get_json(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        if body.get("status") != "success":
            raise PrometheusToolError(f"query {expr!r} failed: {body}")
        return list(body["data"]["result"])

    def targets_health(self) -> dict[str, str]:
        """scrapeUrl -> health ("up", "down", "unknown") of the active targets."""
        body = _http_get_json(f"{self.url}/api/v1/targets")
        return {t["scrapeUrl"]: t["health"] for t in body["data"]["activeTargets"]}

    def wait_for(
        self, expr: str, predicate: Callable[[list[dict[str, Any]]], bool] = bool, timeout: float = 30.0
    ) -> list[dict[str, Any]]:
        """Poll ``expr`` until ``predicate(result)`` holds (default: non-empty); raise at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() >= deadline:
                raise PrometheusToolError(f"{expr!r} did not satisfy the predicate in {timeout}s: {result}")
            time.sleep(0.25)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM by PID, SIGKILL after ``grace`` seconds; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        (self.workdir / "prometheus.pid").unlink(missing_ok=True)

    def __enter__(self) -> PrometheusServer:
        return self.start() if self._proc is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
