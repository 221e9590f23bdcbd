"""What ``flexinfer serve`` imports before it listens: the real command in a child process with Python's import
profiling on (``PYTHONPROFILEIMPORTTIME``, the variable form of ``-X importtime``), stopped once it printed
``listening on``; its import lines are checked (never a timing).

Every group-pod cold start runs ``serve`` in a fresh container, so what it imports is on the cold-start path.
With tracing off (the default) it loads only OpenTelemetry's API (no-op tracers, propagators): not the SDK, the
OTLP exporter or its protobuf messages, nor rich (the flash-loader's terminal bar). With
``FLEXINFER_OTEL_ENABLED=true`` the SDK and the exporter are loaded (by ``init_tracing``) before it listens.
"""

from __future__ import annotations

from pathlib import Path

from support.cli_process import CliProcess
from support.local_serve import model_manifest, serve_env, write_manifests

TRACING_SDK = ("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.proto")
NOT_FOR_SERVE = ("rich",)
TRACING_ON = {"FLEXINFER_OTEL_ENABLED": "true", "OTEL_SDK_DISABLED": "false",
              "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
"""Tracing on, exporting to a port nothing listens on: nothing is exported before a span ends."""


def serve_imports(tmp_path: Path, **env: str) -> set[str]:
    """Start ``flexinfer serve`` over one Model (its weights an empty placeholder: no model server starts before
    a request), wait for ``listening on``, stop it; the modules it imported by then."""
    weights = tmp_path / "tiny.gguf"
    weights.touch()
    manifests = write_manifests(tmp_path / "models" / "tiny.yaml", [model_manifest("tiny", weights)])
    serve = CliProcess(["serve", "-f", str(manifests.parent), "--port", "0", "--no-watch"],
                       serve_env(tmp_path / "state", PYTHONPROFILEIMPORTTIME="1", **env))
    try:
        serve.listening()
    finally:
        code = serve.stop()
    assert code == 0, serve.log
    assert "Traceback" not in serve.log, serve.log
    listened_at = next(index for index, line in enumerate(serve.output) if "listening on" in line)
    before = [line for line in serve.output[:listened_at] if line.startswith("import time:")]
    return {line.rsplit("|", 1)[1].strip() for line in before} - {"imported package"}


def loaded(modules: set[str], stacks: tuple[str, ...]) -> list[str]:
    """The modules that belong to any of ``stacks`` (a package or one of its submodules)."""
    return sorted(name for name in modules if any(name == top or name.startswith(top + ".") for top in stacks))


def test_serve_with_tracing_off_listens_without_the_tracing_sdk_or_rich(tmp_path: Path) -> None:
    modules = serve_imports(tmp_path, FLEXINFER_OTEL_ENABLED="false")
    assert {"flexinfer.assembly.local", "opentelemetry.trace"} <= modules  # the probe sees the imports at all
    assert loaded(modules, TRACING_SDK + NOT_FOR_SERVE) == []


def test_serve_with_tracing_on_loads_the_sdk_and_exporter_before_listening(tmp_path: Path) -> None:
    modules = serve_imports(tmp_path, **TRACING_ON)
    assert {"opentelemetry.sdk.trace", "opentelemetry.sdk.trace.export",
            "opentelemetry.exporter.otlp.proto.http.trace_exporter"} <= modules
    assert loaded(modules, NOT_FOR_SERVE) == []
