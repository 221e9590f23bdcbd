"""The small command-line defects, each driven through the real command (a subprocess): bad ports and taken
ports, ``flash-load`` flag errors and overlapping trees, ``status``/``logs`` against a running ``serve``, the
restart-backoff 503 seen by the official ``openai`` client, and ``serve``'s own drain-delay default."""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from flexinfer.api.units import parse_duration
from flexinfer.assembly.local import SERVE_PROXY_DEFAULTS, local_proxy_config
from support.cli_process import CliProcess
from support.local_serve import ServeProcess, fake_server_command, model_manifest, serve_env, write_manifests

ROOT = Path(__file__).resolve().parents[3]


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    command = CliProcess(args, env or dict(os.environ))
    code = command.finish()
    assert "Traceback" not in command.log, command.log
    return code, command.log


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("serve")
    manifests = write_manifests(tmp / "m" / "m.yaml", [
        model_manifest("idle", tmp, config={"command": fake_server_command()}),
        model_manifest("crashy", tmp, config={"command": fake_server_command("--crash-at-start")}),
    ])
    process = ServeProcess.start(manifests.parent, serve_env(tmp / "state", FLEXINFER_RESTART_BACKOFF="60s"))
    yield process
    process.stop()


@pytest.mark.parametrize("command", [["serve", "-f", "."], ["proxy"]])
def test_port_out_of_range_is_a_usage_error(command: list[str]) -> None:
    code, log = _run(*command, "--port", "99999")
    assert code == 2 and "--port: must be a TCP port from 0 to 65535, got 99999" in log


def test_serve_on_a_taken_port_says_so_without_leaking_a_session(tmp_path: Path) -> None:
    manifests = write_manifests(tmp_path / "m.yaml", [model_manifest("m", tmp_path, config={"command": ["x"]})])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, log = _run("serve", "-f", str(manifests), "--port", str(port))
    assert code == 1 and f"error: cannot listen on 127.0.0.1:{port}" in log
    assert "Unclosed" not in log, log


def test_flash_load_variant_error_names_the_flag(tmp_path: Path) -> None:
    code, log = _run("flash-load", "--src", str(tmp_path), "--dst", str(tmp_path / "d"), "--variant", "fp8")
    assert code == 2 and "--variant: invalid choice: 'fp8'" in log and "FLASH_VARIANT" not in log


def test_flash_load_dst_inside_src_leaves_nothing_behind(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"x")
    code, log = _run("flash-load", "--src", str(src), "--dst", str(src / "staged" / "here"), "--quiet")
    assert code == 1 and "overlap" in log
    assert sorted(p.name for p in src.iterdir()) == ["w.bin"]


def test_logs_negative_tail_is_rejected() -> None:
    code, log = _run("logs", "m", "--tail", "-1")
    assert code == 2 and "--tail: must be ≥ 0, got -1" in log


def test_status_accepts_a_url_without_scheme(serve: ServeProcess) -> None:
    code, log = _run("status", "--url", serve.url.removeprefix("http://"))
    assert code == 0 and "idle" in log and "crashy" in log


def test_logs_of_a_model_that_has_not_run_says_so(serve: ServeProcess) -> None:
    code, log = _run("logs", "idle", "--url", serve.url)
    assert code == 1
    assert "error: model default/idle has not run since this `flexinfer serve` started" in log


def test_restart_backoff_rejection_says_when_and_why(serve: ServeProcess) -> None:
    client = openai.OpenAI(base_url=serve.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="crashy", messages=messages)  # the failed start itself
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="crashy", messages=messages)
    assert caught.value.status_code == 503
    message = caught.value.body["message"]  # type: ignore[index]
    assert "restart backoff after 1 failed start, next start in " in message
    assert "(last failure: " in message and message.rstrip(")").split("(last failure: ")[1]
    code, log = _run("logs", "crashy", "--url", serve.url)
    assert code == 0 and "crashing at start as scripted" in log


def test_serve_drain_delay_default_is_documented_as_used() -> None:
    used = local_proxy_config({}).shutdown_drain_delay
    assert used == parse_duration(SERVE_PROXY_DEFAULTS["PROXY_SHUTDOWN_DRAIN_DELAY"]) == 0
    code, listing = _run("settings")
    assert code == 0
    serve_part = listing.split("flexinfer manager:")[0]
    assert "PROXY_SHUTDOWN_DRAIN_DELAY=0s " in serve_part
    doc = (ROOT / "docs" / "CONFIGURATION.md").read_text()
    assert "| `PROXY_SHUTDOWN_DRAIN_DELAY` | `5s` (`serve`: `0s`) |" in doc



def test_admin_errors_do_not_echo_huge_names(serve: ServeProcess) -> None:
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{serve.url}/admin/logs/{'x' * 5000}", timeout=10)
    assert caught.value.code == 404
    message = json.loads(caught.value.read())["error"]["message"]
    assert len(message) < 1200 and "more characters" in message
