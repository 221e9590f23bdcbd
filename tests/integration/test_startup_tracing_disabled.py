"""Every command starts (and stops cleanly) with tracing off, whatever the ``OTEL_*`` variables hold; with
tracing on and a real OTLP receiver the long-running commands start too and their spans arrive.

Each command runs as a real child process (``python -m flexinfer.cli.main ...``): ``serve`` over a tiny
manifest directory, ``proxy`` and ``manager`` against the real testbed apiserver with the CRDs applied,
``flash-load`` over a tiny tree. Off: ``FLEXINFER_OTEL_ENABLED=false`` plus an endpoint, protocol and sampler
that would each stop start-up if tracing were on. Long-running commands must answer ``/healthz`` and exit 0 on
SIGTERM. On: ``serve``/``proxy`` export a ``proxy.handle_request`` span for a request, the manager a
``model.reconcile`` span once a Model exists, each under its process's ``service.name``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.cli_process import CliProcess
from support.kube_testbed import KubeTestbed
from support.local_serve import TESTS_DIR, model_manifest, write_manifests
from support.manager_harness import kube_testbed
from support.otlp_receiver import OTLPReceiver, ReceivedSpan

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]  # the testbed fixture (session scope, CRDs established) comes from the manager harness

OFF = {
    "FLEXINFER_OTEL_ENABLED": "false",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "::not a url::",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "::not a url::",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    "OTEL_TRACES_SAMPLER": "no-such-sampler",
}
TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def child_env(extra: Mapping[str, str], **more: str) -> dict[str, str]:
    """``os.environ`` without any ``OTEL_*``/``FLEXINFER_OTEL_*`` variable, plus ``extra`` (tests importable, ahead
    of an inherited ``PYTHONPATH``, which stays so the child runs the same ``flexinfer`` as the test)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FLEXINFER_OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return {**env, **extra, **more}


def tracing_on(receiver: OTLPReceiver) -> dict[str, str]:
    return {"FLEXINFER_OTEL_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100", "FLEXINFER_OTEL_SERVICE_NAMESPACE": "startup"}


@pytest.fixture
def commands() -> Iterator[list[CliProcess]]:
    started: list[CliProcess] = []
    yield started
    for command in started:
        command.stop()


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as running:
        yield running


@pytest.fixture
def namespace(kube_testbed: KubeTestbed) -> str:
    name = f"startup-{uuid.uuid4().hex[:8]}"
    kube_testbed.kubectl("create", "namespace", name)
    return name


def post_unknown_model(url: str) -> int:
    request = urllib.request.Request(url + "/v1/chat/completions", method="POST", data=b'{"model": "absent"}',
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def wait_for_span(receiver: OTLPReceiver, name: str, **attributes: Any) -> ReceivedSpan:
    """The first received span called ``name`` with these attributes (deadline-bounded, no sleeps)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        spans = receiver.spans()
        for span in spans:
            if span.name == name and all(span.attributes.get(k) == v for k, v in attributes.items()):
                return span
        receiver.wait_for_spans(len(spans) + 1, timeout=max(deadline - time.monotonic(), 0.01))


# ---------------------------------------------------------------- flexinfer serve


def start_serve(tmp_path: Path, env: Mapping[str, str], commands: list[CliProcess]) -> CliProcess:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    manifests = write_manifests(tmp_path / "models" / "m.yaml", [model_manifest("tiny", weights)])
    command = CliProcess(["serve", "-f", str(manifests.parent), "--host", "127.0.0.1", "--port", "0"],
                      child_env(env, FLEXINFER_STATE_DIR=str(tmp_path / "state")))
    commands.append(command)
    command.healthy(command.listening() + "/healthz")
    return command


def test_serve_starts_with_tracing_off_and_garbage_otel_env(tmp_path: Path, commands: list[CliProcess]) -> None:
    serve = start_serve(tmp_path, OFF, commands)
    assert post_unknown_model(serve.url) == 404
    assert serve.stop() == 0, serve.log
    assert "Traceback" not in serve.log, serve.log


def test_serve_starts_with_tracing_on_and_exports(tmp_path: Path, commands: list[CliProcess],
                                                  receiver: OTLPReceiver) -> None:
    serve = start_serve(tmp_path, tracing_on(receiver), commands)
    assert post_unknown_model(serve.url) == 404
    span = wait_for_span(receiver, "proxy.handle_request", **{"http.response.status_code": 404})
    assert (span.resource["service.name"], span.resource["service.namespace"]) == ("flexinfer", "startup")
    assert serve.stop() == 0, serve.log


# ---------------------------------------------------------------- flexinfer proxy (against the testbed)


def start_proxy(testbed: KubeTestbed, namespace: str, env: Mapping[str, str], commands: list[CliProcess]) -> CliProcess:
    assert testbed.kubeconfig is not None
    command = CliProcess(["proxy", "--host", "127.0.0.1", "--port", "0",  # the OS picks: no race for a free port
                       "--kubeconfig", str(testbed.kubeconfig)],
                      child_env(env, POD_NAMESPACE=namespace, PROXY_SHUTDOWN_DRAIN_DELAY="0s"))
    commands.append(command)
    command.healthy(command.listening() + "/healthz")
    return command


def test_proxy_starts_with_tracing_off_and_garbage_otel_env(kube_testbed: KubeTestbed, namespace: str,
                                                            commands: list[CliProcess]) -> None:
    proxy = start_proxy(kube_testbed, namespace, OFF, commands)
    assert post_unknown_model(proxy.url) == 404
    assert proxy.stop() == 0, proxy.log
    assert "Traceback" not in proxy.log, proxy.log


def test_proxy_starts_with_tracing_on_and_exports(kube_testbed: KubeTestbed, namespace: str,
                                                  commands: list[CliProcess], receiver: OTLPReceiver) -> None:
    proxy = start_proxy(kube_testbed, namespace, {**tracing_on(receiver), "FLEXINFER_LOG_FORMAT": "json"}, commands)
    assert post_unknown_model(proxy.url) == 404
    span = wait_for_span(receiver, "proxy.handle_request", **{"http.response.status_code": 404})
    assert (span.resource["service.name"], span.resource["service.namespace"]) == ("flexinfer-proxy", "startup")
    # the access line, in JSON, carries the request span's ids
    access = next((json.loads(line) for line in proxy.output if '"flexinfer.access"' in line), None)
    assert access is not None, proxy.log
    assert (access["status"], access["trace_id"], access["span_id"]) == (404, span.trace_id, span.span_id)
    assert proxy.stop() == 0, proxy.log


# ---------------------------------------------------------------- flexinfer manager (against the testbed)


def start_manager(testbed: KubeTestbed, namespace: str, env: Mapping[str, str],
                  commands: list[CliProcess]) -> CliProcess:
    assert testbed.kubeconfig is not None
    health = free_port()
    command = CliProcess(["manager", "--kubeconfig", str(testbed.kubeconfig), "--namespace", namespace,
                       "--no-leader-elect", "--health-probe-bind-address", f"127.0.0.1:{health}",
                       "--metrics-bind-address", f"127.0.0.1:{free_port()}"],
                      child_env(env, POD_NAMESPACE=namespace))
    commands.append(command)
    command.healthy(f"http://127.0.0.1:{health}/healthz")
    return command


def test_manager_starts_with_tracing_off_and_garbage_otel_env(kube_testbed: KubeTestbed, namespace: str,
                                                              commands: list[CliProcess]) -> None:
    manager = start_manager(kube_testbed, namespace, OFF, commands)
    assert manager.stop() == 0, manager.log
    assert "Traceback" not in manager.log, manager.log


def test_manager_starts_with_tracing_on_and_exports_reconcile_spans(
    kube_testbed: KubeTestbed, namespace: str, commands: list[CliProcess], receiver: OTLPReceiver,
) -> None:
    manager = start_manager(kube_testbed, namespace, {**tracing_on(receiver), "FLEXINFER_LOG_FORMAT": "json"},
                            commands)
    model = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
             "metadata": {"name": "traced", "namespace": namespace},
             "spec": {"backend": "vllm", "source": "HF://org/model"}}
    kube_testbed.kubectl("apply", "-f", "-", input=yaml.safe_dump(model))
    span = wait_for_span(receiver, "model.reconcile", **{"k8s.name": "traced", "k8s.namespace": namespace})
    assert span.attributes["controller"] == "model"
    assert (span.resource["service.name"], span.resource["service.namespace"]) == ("flexinfer-manager", "startup")
    assert manager.stop() == 0, manager.log
    lines = [json.loads(line) for line in manager.output]  # --log-format json from FLEXINFER_LOG_FORMAT: all JSON
    assert any(line["logger"].startswith("flexinfer.") and line["level"] == "INFO" for line in lines)


# ---------------------------------------------------------------- flexinfer flash-load


def test_flash_load_runs_with_tracing_off_and_garbage_otel_env(tmp_path: Path, commands: list[CliProcess]) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    (src / "model.gguf").write_bytes(os.urandom(64 << 10))
    (src / "sub" / "config.json").write_text('{"a": 1}')
    done = subprocess.run([sys.executable, "-m", "flexinfer.cli.main", "flash-load", "--src", str(src),
                           "--dst", str(dst), "--quiet"], env=child_env(OFF), capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (dst / "model.gguf").read_bytes() == (src / "model.gguf").read_bytes()
    assert (dst / "sub" / "config.json").read_text() == '{"a": 1}'
    assert "Traceback" not in done.stderr
