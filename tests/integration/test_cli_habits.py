"""The operator CLI against a real ``flexinfer serve``: ``ps`` (alias of ``status``) piped and in every ``-o``,
``load``/``unload`` with progress, ``logs --since`` and ``logs -f``, and shell completion answered by the
real entry point.

The models are the scripted fake server (``support.fake_openai``); one has a name longer than any terminal; a
ConfigMap beside them is skipped by ``serve`` with a warning.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from support.cli_process import CliProcess
from support.local_serve import ServeProcess, fake_server_command, model_manifest, serve_env, write_manifests
from support.polling import wait_until

pytestmark = pytest.mark.integration
LONG = "model-with-a-name-longer-than-a-narrow-table-column-shows"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flexinfer.cli.main", *args], capture_output=True, text=True,
                          timeout=120, check=False, env=env)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    docs = [model_manifest(m, weights, "pair", {"command": fake_server_command("--model-name", m)})
            for m in ("left", LONG)]
    docs.append(model_manifest("broken", weights, None, {"command": fake_server_command("--crash-at-start")}))
    directory = write_manifests(tmp_path / "models" / "m.yaml", docs).parent
    (directory / "notes.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n")
    process = ServeProcess.start(directory, serve_env(tmp_path / "state"))
    yield process
    process.stop()


def test_ps_load_unload(serve: ServeProcess) -> None:
    url = ["--url", serve.url]
    assert "WARNING flexinfer.serve: skipped " in serve.log  # serve leaves other kinds out, naming them
    assert "notes.yaml:2:1: kind: ConfigMap (v1) is not a FlexInfer kind" in serve.log
    loaded = cli("load", "left", *url)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith("default/left: Ready at http://127.0.0.1:")
    assert "default/left: Loading" in loaded.stderr and "default/left: Ready" in loaded.stderr

    piped = cli("ps", *url)  # stdout is a pipe here
    assert piped.returncode == 0, piped.stderr
    rows = [line.split() for line in piped.stdout.splitlines()]
    assert rows[0] == ["NAMESPACE", "NAME", "GROUP", "PHASE", "ACTIVE", "FOR", "QUEUE", "REASON"]
    by_name = {r[1]: r for r in rows[1:]}
    assert by_name["left"][:4] == ["default", "left", "pair", "Ready"] and by_name["left"][4] != "-"
    assert by_name[LONG][:4] == ["default", LONG, "pair", "Idle"]

    # a load that cannot preempt says who holds the group; a failed start is an error with its reason
    pending = cli("load", LONG, "--timeout", "1s", *url)
    assert pending.returncode == 1
    assert "GPU group pair is held by default/left" in pending.stderr and "--timeout" in pending.stderr
    broken = cli("load", "broken", *url)
    assert broken.returncode == 1 and "error: model default/broken failed to start:" in broken.stderr
    failed = next(line for line in cli("status", *url).stdout.splitlines() if " broken " in line)
    assert "Failed" in failed and "exited" in failed and "retry in" in failed

    as_json = json.loads(cli("ps", "-o", "json", *url).stdout)
    assert {m["key"] for m in as_json["models"]} == {"default/left", f"default/{LONG}", "default/broken"}
    as_yaml = yaml.safe_load(cli("status", "-o", "yaml", *url).stdout)
    assert [m["key"] for m in as_yaml["models"]] == [m["key"] for m in as_json["models"]]
    wide = cli("ps", "-o", "wide", *url).stdout
    assert "ENDPOINT" in wide.splitlines()[0] and "http://127.0.0.1:" in wide

    unloaded = cli("unload", "left", *url)
    assert unloaded.returncode == 0, unloaded.stderr
    assert unloaded.stdout == "default/left: Idle\n"
    missing = cli("unload", "nope", *url)
    assert missing.returncode == 1 and missing.stderr.startswith("error: ") and "nope" in missing.stderr


def test_logs_since_and_follow(serve: ServeProcess) -> None:
    url = ["--url", serve.url]
    follow = CliProcess(["logs", "left", "-f", *url], dict(os.environ))
    try:
        assert cli("load", "left", *url).returncode == 0
        wait_until(lambda: "FAKE_OPENAI_PORT=" in follow.log, timeout=30, message="followed output")
        assert cli("unload", "left", *url).returncode == 0
        assert cli("load", "left", *url).returncode == 0  # a restart: its new lines follow
        wait_until(lambda: follow.log.count("FAKE_OPENAI_PORT=") == 2, timeout=30, message="second start")
    finally:
        follow.proc.send_signal(signal.SIGINT)
        assert follow.finish() == 0
    recent = cli("logs", "left", "--since", "10m", *url)
    assert recent.returncode == 0 and recent.stdout.count("FAKE_OPENAI_PORT=") == 2
    assert cli("logs", "left", "--since", "0s", *url).stdout == ""
    bad = cli("logs", "left", "--since", "ten", *url)
    assert bad.returncode == 2 and "--since" in bad.stderr


@contextlib.contextmanager
def sigint_left(state: str) -> Iterator[None]:
    """What a parent leaves its children: SIGINT as is, ignored (a job a script started with ``&``) or blocked."""
    if state == "ignored":
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
    elif state == "blocked":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    else:
        yield


@pytest.mark.parametrize("inherited", ["default", "ignored", "blocked"])
def test_logs_follow_ends_on_interrupt_from_the_start(serve: ServeProcess, inherited: str) -> None:
    """SIGINT from the moment it runs, again until it ends: ``logs -f`` always ends, with exit 0 once it can see
    the signal, even when its parent left SIGINT ignored or blocked (it was then left running forever)."""
    command = [sys.executable, "-m", "flexinfer.cli.main", "logs", "left", "-f", "--url", serve.url]
    for attempt in range(3):
        with sigint_left(inherited):
            follow = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda proc=follow: proc.send_signal(signal.SIGINT) or proc.poll() is not None, timeout=30,
                       message=f"logs -f ended by SIGINT (attempt {attempt}, SIGINT {inherited})")
        finally:
            if follow.poll() is None:
                follow.kill()
            stderr = follow.communicate(timeout=30)[1]
        assert "Traceback" not in stderr, stderr
        # as is, SIGINT may end it before Python has a handler (killed by it) or during start-up (130)
        expected = {0, 130, -signal.SIGINT} if inherited == "default" else {0}
        assert follow.returncode in expected, (follow.returncode, stderr)


def test_completion_scripts_and_callback(tmp_path: Path) -> None:
    for shell, marker in (("bash", "complete "), ("zsh", "#compdef flexinfer"), ("fish", "complete ")):
        done = cli("completion", shell)
        assert done.returncode == 0 and marker in done.stdout, (shell, done.stderr)
    answers = tmp_path / "answers"
    script = (f'COMP_LINE="flexinfer status -o " COMP_POINT=20 _ARGCOMPLETE=1 _ARGCOMPLETE_IFS=" " '
              f'"{sys.executable}" -m flexinfer.cli.main 8>"{answers}" 9>/dev/null')
    subprocess.run(["bash", "-c", script], check=True, timeout=60)
    assert answers.read_text().split() == ["table", "wide", "json", "yaml"]
    script = script.replace("flexinfer status -o ", "flexinfer unl").replace("COMP_POINT=20", "COMP_POINT=13")
    subprocess.run(["bash", "-c", script], check=True, timeout=60)
    assert answers.read_text().split() == ["unload"]
