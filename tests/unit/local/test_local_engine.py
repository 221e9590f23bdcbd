"""LocalEngine against real child processes: the scripted fake OpenAI server and the process-fault stub."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest

from flexinfer.api.model import Model
from flexinfer.core.errors import EngineError
from flexinfer.local.engine import LocalEngine, LocalEngineSettings
from support.local_processes import Stages, alive, fake_openai_command, make_model, stub_command
from support.polling import eventually


async def get_json(url: str) -> dict:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        return await response.json()


def grandchild_pid(engine: LocalEngine, model: Model) -> int:
    lines = engine.logs.tail(model.key) or []
    pids = [int(m.group(1)) for line in lines if (m := re.search(r"grandchild pid (\d+)", line))]
    assert pids, lines
    return pids[-1]


async def test_start_returns_once_ready_and_serves(engine: LocalEngine, weights: Path) -> None:
    model = make_model("alpha", weights.as_uri(), {"command": fake_openai_command("--startup-delay", "0.3"),
                                                    "healthPath": "/health"})
    stages = Stages()
    endpoint = await engine.start(model, stages)
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", endpoint.base_url)
    body = await get_json(endpoint.base_url + "/v1/models")
    assert body["data"][0]["id"] == "fake-model"
    assert stages.seen == ["server_start", "health"]
    assert engine.endpoint(model.key) == endpoint
    assert await engine.start(model, stages) == endpoint  # already running: same server


async def test_loading_server_is_not_ready_until_health_answers_200(engine: LocalEngine, weights: Path) -> None:
    model = make_model("loading", weights.as_uri(), {"command": stub_command("--loading-for", "0.3")})
    stages = Stages()
    endpoint = await engine.start(model, stages)
    assert (await get_json(endpoint.base_url + "/v1/models"))["data"][0]["id"] == "stub"
    assert stages.seen == ["server_start", "health"]


async def test_crash_at_start_raises_with_log_tail(engine: LocalEngine, weights: Path) -> None:
    model = make_model("broken", weights.as_uri(), {"command": fake_openai_command("--crash-at-start")})
    with pytest.raises(EngineError) as info:
        await engine.start(model, Stages())
    message = str(info.value)
    # the first line (what `flexinfer ps` and `load` show) ends with the server's own last line
    assert re.search(r"exited with status 1 before it was ready: .*crashing at start as scripted.*; last output",
                     message.splitlines()[0]), message
    assert engine.child_pids == []
    assert engine.endpoint(model.key) is None


async def test_not_ready_within_startup_timeout(engine: LocalEngine, weights: Path) -> None:
    model = make_model("slow", weights.as_uri(), {"command": stub_command("--startup-delay", "30"),
                                                   "startupTimeout": "300ms"})
    with pytest.raises(EngineError, match=r"not ready within 0\.3s"):
        await engine.start(model, Stages())
    assert engine.child_pids == []


async def test_crash_after_ready_is_reported(settings: LocalEngineSettings, weights: Path) -> None:
    engine, report = LocalEngine(settings), Stages()
    model = make_model("crashy", weights.as_uri(), {"command": fake_openai_command("--crash-mid-stream")})
    try:
        endpoint = await engine.start(model, report)
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "stream": True, "messages": []}
            with pytest.raises(aiohttp.ClientError):
                async with session.post(endpoint.base_url + "/v1/chat/completions", json=body) as response:
                    await response.read()
        await asyncio.wait_for(report.exited_event.wait(), 10)
        assert report.exits == ["model server exited with status 3"]
        assert engine.endpoint(model.key) is None
        assert engine.child_pids == []
        assert any("exited with status 3" in line for line in engine.logs.tail(model.key) or [])
    finally:
        await engine.aclose()


async def test_stop_kills_the_whole_group(engine: LocalEngine, weights: Path) -> None:
    model = make_model("tree", weights.as_uri(), {"command": stub_command("--grandchild")})
    await engine.start(model, Stages())
    leader, grandchild = engine.pid(model.key), grandchild_pid(engine, model)
    assert leader is not None and alive(leader) and alive(grandchild)
    await engine.stop(model)
    assert not alive(leader)
    await eventually(lambda: not alive(grandchild), 10)
    assert engine.endpoint(model.key) is None
    await engine.stop(model)  # idempotent


async def test_stop_escalates_to_sigkill_after_grace(settings: LocalEngineSettings, weights: Path) -> None:
    engine = LocalEngine(LocalEngineSettings(**{**settings.__dict__, "stop_grace": 0.2}))
    model = make_model("stubborn", weights.as_uri(), {"command": stub_command("--ignore-term")})
    try:
        await engine.start(model, Stages())
        pid = engine.pid(model.key)
        assert pid is not None
        await engine.stop(model)
        assert not alive(pid)
        assert any("signal SIGKILL" in line for line in engine.logs.tail(model.key) or [])
    finally:
        await engine.aclose()


async def test_cancel_during_start_leaves_nothing(engine: LocalEngine, weights: Path) -> None:
    command = stub_command("--grandchild", "--startup-delay", "30")
    model = make_model("cancelled", weights.as_uri(), {"command": command})
    task = asyncio.create_task(engine.start(model, Stages()))

    def grandchild_started() -> bool:
        assert not task.done(), f"start ended before the server was up: {task}"
        return any("grandchild pid" in line for line in engine.logs.tail(model.key) or [])
    try:
        await eventually(grandchild_started, 30)
    except AssertionError as failure:
        raise AssertionError(f"{failure}; children {engine.child_pids}; output {engine.logs.tail(model.key)}") \
            from None
    leader, grandchild = engine.child_pids[0], grandchild_pid(engine, model)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.child_pids == []
    assert not alive(leader)
    await eventually(lambda: not alive(grandchild), 10)


async def test_aclose_leaves_no_orphans_and_refuses_new_starts(settings: LocalEngineSettings, weights: Path) -> None:
    engine = LocalEngine(settings)
    models = [make_model(f"m{i}", weights.as_uri(), {"command": stub_command("--grandchild")}) for i in range(3)]
    await asyncio.gather(*(engine.start(m, Stages()) for m in models))
    pids = [engine.pid(m.key) for m in models] + [grandchild_pid(engine, m) for m in models]
    assert all(p is not None and alive(p) for p in pids)
    await engine.aclose()
    await eventually(lambda: not any(alive(p) for p in pids if p is not None), 10)
    with pytest.raises(EngineError, match="shutting down"):
        await engine.start(models[0], Stages())


async def test_missing_backend_fails_only_when_activated(settings: LocalEngineSettings, weights: Path) -> None:
    engine = LocalEngine(LocalEngineSettings(**{**settings.__dict__, "env": {"PATH": "/nonexistent"}}),
                         installed=None)
    model = make_model("vllm-model", weights.as_uri(), backend="vllm")
    try:
        with pytest.raises(EngineError, match=r"no vllm backend is installed.*spec\.config\.command"):
            await engine.start(model, Stages())
        assert engine.child_pids == []
    finally:
        await engine.aclose()


async def test_non_file_source_is_a_clear_error(engine: LocalEngine) -> None:
    model = make_model("remote", "hf://org/model", {"command": stub_command()})
    with pytest.raises(EngineError, match=r"uses hf://.*download the weights.*file://"):
        await engine.start(model, Stages())


async def test_missing_weights_file(engine: LocalEngine, tmp_path: Path) -> None:
    model = make_model("nofile", (tmp_path / "absent.gguf").as_uri(), {"command": stub_command()})
    with pytest.raises(EngineError, match="weights not found"):
        await engine.start(model, Stages())


async def test_placeholders_and_env_reach_the_server(engine: LocalEngine, weights: Path) -> None:
    command = stub_command("--print-env", "FLEXINFER_TEST_VALUE")
    model = make_model("argv", weights.as_uri(), {"command": command, "env": {"FLEXINFER_TEST_VALUE": 42}})
    endpoint = await engine.start(model, Stages())
    port = endpoint.base_url.rsplit(":", 1)[1]
    lines = engine.logs.tail(model.key) or []
    assert f"stub argv: --port {port} --model {weights} --print-env FLEXINFER_TEST_VALUE" in lines
    assert "stub env FLEXINFER_TEST_VALUE=42" in lines


async def test_port_is_released_after_stop(engine: LocalEngine, weights: Path) -> None:
    model = make_model("ports", weights.as_uri(), {"command": stub_command()})
    endpoint = await engine.start(model, Stages())
    port = int(endpoint.base_url.rsplit(":", 1)[1])
    assert port in engine._ports.taken
    await engine.stop(model)
    assert port not in engine._ports.taken


async def test_log_file_mirrors_output(engine: LocalEngine, weights: Path, settings: LocalEngineSettings) -> None:
    model = make_model("logged", weights.as_uri(), {"command": stub_command()})
    await engine.start(model, Stages())
    await engine.stop(model)
    assert settings.log_dir is not None
    text = (settings.log_dir / "default_logged.log").read_text()
    assert "stub listening on" in text and "--- flexinfer: starting" in text
