"""The logs of ``flexinfer serve``, read from a real process: access lines, lifecycle lines, JSON format,
trace ids, the level and access-log switches (flags and environment), and the listen address from the
environment.

Two fake model servers share one GPU group, so a request to each makes a cold start and a swap; a third one
crashes at start (failure and backoff).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.local_serve import ServeProcess, fake_server_command, model_manifest, serve_env, write_manifests
from support.otlp_receiver import OTLPReceiver
from support.polling import wait_until

pytestmark = pytest.mark.integration


def post(url: str, body: dict[str, Any]) -> tuple[int, str]:
    """POST JSON; (status, request id header)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return response.status, response.headers["X-Request-Id"]
    except urllib.error.HTTPError as error:
        return error.code, error.headers["X-Request-Id"]


def chat(model: str, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


def json_lines(serve: ServeProcess) -> list[dict[str, Any]]:
    """Every log line of ``serve`` that is a JSON object (the announcement line is plain text)."""
    return [json.loads(line) for line in serve.output if line.startswith("{")]


def events(lines: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("event") == event]


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    docs = [model_manifest(m, weights, "pair", {"command": fake_server_command("--model-name", m)})
            for m in ("left", "right")]
    docs.append(model_manifest("broken", weights, None, {"command": fake_server_command("--crash-at-start")}))
    return write_manifests(tmp_path / "models" / "models.yaml", docs).parent


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[ServeProcess]]:
    processes: list[ServeProcess] = []
    yield processes
    for process in processes:
        process.stop()


def test_json_access_and_lifecycle_lines(manifests: Path, tmp_path: Path, started: list[ServeProcess]) -> None:
    serve = ServeProcess.start(manifests, serve_env(tmp_path / "state"), extra=["--log-format", "json"])
    started.append(serve)
    url = serve.url + "/v1/chat/completions"
    assert post(url, chat("left"))[0] == 200
    status, streamed_id = post(url, chat("right", stream=True))
    assert status == 200
    assert post(url, chat("broken"))[0] == 503

    def settled() -> list[dict[str, Any]]:
        lines = json_lines(serve)
        return lines if len(events(lines, "start_failed")) and len(
            [x for x in lines if x["logger"] == "flexinfer.access"]) == 3 else []

    lines = wait_until(settled, timeout=30, message="access and failure lines")
    access = {line["model"]: line for line in lines if line["logger"] == "flexinfer.access"}
    assert set(access) == {"default/left", "default/right", "default/broken"}
    right = access["default/right"]
    assert right["status"] == 200 and right["stream"] is True and right["request_id"] == streamed_id
    assert right["bytes"] > 0 and right["upstream_s"] >= 0 and right["queue_wait_s"] > 0
    assert access["default/left"]["stream"] is False and access["default/broken"]["status"] == 503
    assert all(line["level"] == "INFO" and "time" in line for line in access.values())

    requested = {line["model"] for line in events(lines, "activation_requested")}
    assert {"default/left", "default/right", "default/broken"} <= requested
    assert {line["model"] for line in events(lines, "server_started")} >= {"default/left", "default/right"}
    swap = events(lines, "swap_decided")
    assert [(s["model"], s["loser"], s["group"]) for s in swap] == [("default/right", "default/left", "pair")]
    ready = {line["model"]: line for line in events(lines, "ready")}
    assert ready["default/left"]["kind"] == "cold_start" and ready["default/right"]["kind"] == "swap"
    assert {"server_start", "health"} <= set(ready["default/left"]["stages"])
    assert "drain" in ready["default/right"]["stages"] and ready["default/right"]["seconds"] > 0
    stopped = events(lines, "stopped")
    assert stopped[0]["model"] == "default/left" and "preempted by default/right" in stopped[0]["reason"]
    failed = events(lines, "start_failed")[0]
    assert failed["level"] == "WARNING" and failed["backoff_s"] > 0 and failed["error"]


def test_log_switches_and_listen_address_from_the_environment(manifests: Path, tmp_path: Path,
                                                              started: list[ServeProcess]) -> None:
    env = serve_env(tmp_path / "state", FLEXINFER_ACCESS_LOG="false", FLEXINFER_LOG_LEVEL="warning",
                    FLEXINFER_HOST="127.0.0.2")
    serve = ServeProcess.start(manifests, env)
    started.append(serve)
    assert serve.url.startswith("http://127.0.0.2:")
    assert post(serve.url + "/v1/chat/completions", chat("left"))[0] == 200
    assert post(serve.url + "/v1/chat/completions", chat("broken"))[0] == 503
    wait_until(lambda: "failed to start" in serve.log, timeout=30, message="the WARNING failure line")
    assert " INFO " not in serve.log and "flexinfer.access" not in serve.log
    serve.stop()

    # the flags win over the environment: text access lines at INFO
    again = ServeProcess.start(manifests, env, extra=["--access-log", "--log-level", "INFO"])
    started.append(again)
    assert post(again.url + "/v1/chat/completions", chat("left"))[0] == 200
    line = wait_until(lambda: next((x for x in again.output if "flexinfer.access" in x), None), timeout=30,
                      message="a text access line")
    assert "model=default/left status=200" in line and "stream=false" in line and "request_id=" in line


def test_bad_log_settings_exit_naming_the_variable(manifests: Path, tmp_path: Path) -> None:
    serve = ServeProcess(["serve", "-f", str(manifests), "--port", "0"],
                         serve_env(tmp_path / "state", FLEXINFER_LOG_FORMAT="yaml"))
    assert serve.finish() == 1
    assert "FLEXINFER_LOG_FORMAT='yaml' is not one of text, json" in serve.log
    port = ServeProcess(["serve", "-f", str(manifests)], serve_env(tmp_path / "state", FLEXINFER_PORT="http"))
    assert port.finish() == 1 and "FLEXINFER_PORT='http'" in port.log


def test_json_lines_carry_the_request_trace_id(manifests: Path, tmp_path: Path,
                                               started: list[ServeProcess]) -> None:
    with OTLPReceiver() as receiver:
        env = serve_env(tmp_path / "state", FLEXINFER_OTEL_ENABLED="true",
                        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
        env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
        serve = ServeProcess.start(manifests, env, extra=["--log-format", "json"])
        started.append(serve)
        assert post(serve.url + "/v1/chat/completions", chat("left"))[0] == 200
        line = wait_until(lambda: next((x for x in json_lines(serve) if x["logger"] == "flexinfer.access"), None),
                          timeout=30, message="the access line")
        handle = wait_until(lambda: next((s for s in receiver.spans() if s.name == "proxy.handle_request"), None),
                            timeout=30, message="the request span")
        assert (line["trace_id"], line["span_id"]) == (handle.trace_id, handle.span_id)
