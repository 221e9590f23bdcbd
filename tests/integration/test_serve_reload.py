"""Reloading the manifests of a real ``flexinfer serve`` process (file watch and SIGHUP) under load.

A steady stream of requests (streamed and not, through the official ``openai`` client) goes to an untouched
model while another model is added, changed, edited invalidly and removed: none of those requests fails and
the untouched model's server keeps its pid; the added model answers; the changed one restarts (new pid) and
answers with its new configuration; the invalid edit is rejected with ``flexinfer validate``'s errors, shown
in the admin status's ``config`` section, and changes nothing; the removed model finishes its stream in
flight, then answers 404. SIGHUP (with ``--no-watch``) does the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from support.cli_process import CliProcess
from support.local_serve import ServeProcess, fake_server_command, model_manifest, serve_env, write_manifests
from support.polling import poll_until

pytestmark = pytest.mark.integration
DEADLINE = 30.0


def manifest(name: str, weights: Path, chunks: int = 2, **extra: Any) -> list[dict[str, Any]]:
    """One model whose fake server answers with ``chunks`` tokens (its configuration shows in its answers)."""
    command = fake_server_command("--chunks", str(chunks), "--chunk-interval", "0.02")
    return [model_manifest(name, weights, config={"command": command, **extra})]


def status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/admin/status", timeout=10) as response:
        body: dict[str, Any] = json.loads(response.read())
    return body


def metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return str(response.read().decode())


def pid(url: str, name: str) -> int | None:
    return next((m["pid"] for m in status(url)["models"] if m["name"] == name), None)


async def answer(client: openai.AsyncOpenAI, model: str) -> str:
    reply = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    return reply.choices[0].message.content or ""


async def answers(client: openai.AsyncOpenAI, model: str, expected: str) -> bool:
    try:
        return await answer(client, model) == expected
    except openai.NotFoundError:
        return False


async def reloaded(url: str, count: int, result: str) -> dict[str, Any]:
    """The admin status's ``config`` once the ``count``-th reload ended with ``result``."""

    async def probe() -> dict[str, Any] | None:
        config: dict[str, Any] = status(url)["config"]
        return config if config["reloads"] >= count and config["result"] == result else None

    return await poll_until(probe, DEADLINE, f"reload #{count} {result}")


@dataclass
class SteadyLoad:
    """Requests to one model back to back, alternating streamed and not, until stopped."""

    client: openai.AsyncOpenAI
    model: str
    done: int = 0
    failures: list[str] = field(default_factory=list)
    stopping: bool = False

    async def run(self) -> None:
        while not self.stopping:
            try:
                if self.done % 2:
                    stream = await self.client.chat.completions.create(
                        model=self.model, messages=[{"role": "user", "content": "hi"}], stream=True)
                    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                else:
                    text = await answer(self.client, self.model)
                assert text == "tok0 tok1 ", text
                self.done += 1
            except Exception as exc:  # every failure is the finding: keep counting
                self.failures.append(repr(exc))


@contextlib.asynccontextmanager
async def steady_load(client: openai.AsyncOpenAI, model: str) -> AsyncIterator[SteadyLoad]:
    load = SteadyLoad(client, model)
    task = asyncio.create_task(load.run())
    try:
        await poll_until(lambda: asyncio.sleep(0, load.done >= 2), DEADLINE, "the first steady answers")
        yield load
    finally:
        load.stopping = True
        await task


@pytest.fixture
def client_for() -> Iterator:
    clients: list[openai.AsyncOpenAI] = []

    def make(url: str) -> openai.AsyncOpenAI:
        clients.append(openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=DEADLINE))
        return clients[-1]

    yield make


def start_serve(models: Path, state: Path, *options: str) -> ServeProcess:
    serve = ServeProcess(["serve", "-f", str(models), "--port", "0", *options], serve_env(state))
    try:
        serve.listening()
    except AssertionError:
        serve.stop()
        raise
    return serve


def validate_errors(models: Path, state: Path) -> list[str]:
    """What ``flexinfer validate`` says about ``models``: its ``error:`` lines without the prefix."""
    check = CliProcess(["validate", "--offline", "-f", str(models)], serve_env(state))
    assert check.finish() == 1
    return [line.removeprefix("error: ").strip() for line in check.output if line.startswith("error: ")]


async def test_watched_manifests_reload_under_load_without_touching_the_untouched_model(
        tmp_path: Path, client_for: Any) -> None:
    weights, models = tmp_path / "w.bin", tmp_path / "models"
    weights.write_bytes(b"w")
    write_manifests(models / "steady.yaml", manifest("steady", weights))
    changing = write_manifests(models / "changing.yaml", manifest("changing", weights))
    serve = start_serve(models, tmp_path / "state", "--watch-interval", "0.2")
    try:
        client = client_for(serve.url)
        assert await answer(client, "changing") == "tok0 tok1 "
        changing_pid = pid(serve.url, "changing")
        async with steady_load(client, "steady") as load:
            steady_pid = pid(serve.url, "steady")
            assert steady_pid is not None

            added = write_manifests(models / "added.yaml", manifest("added", weights, chunks=150))
            await reloaded(serve.url, 1, "applied")
            assert await answer(client, "added") == "".join(f"tok{i} " for i in range(150))
            assert 'model="added"' in metrics(serve.url), "the added model's series exist"

            write_manifests(changing, manifest("changing", weights, chunks=3))
            await poll_until(lambda: answers(client, "changing", "tok0 tok1 tok2 "), DEADLINE, "the new config")
            assert pid(serve.url, "changing") not in (None, changing_pid), "the changed model restarted"
            changed_pid = pid(serve.url, "changing")

            write_manifests(changing, manifest("changing", weights, chunks=3, startupTimeout="soon"))
            config = await reloaded(serve.url, 3, "rejected")
            expected = validate_errors(models, tmp_path / "state")
            assert expected and config["errors"] == expected, (config, expected)
            assert "spec.config.startupTimeout" in config["error"]
            assert "reload (watch) rejected" in serve.log
            assert await answer(client, "changing") == "tok0 tok1 tok2 "
            assert pid(serve.url, "changing") == changed_pid, "the previous configuration stays in force"

            write_manifests(changing, manifest("changing", weights, chunks=3))
            await reloaded(serve.url, 4, "unchanged")
            in_flight = await client.chat.completions.create(
                model="added", messages=[{"role": "user", "content": "hi"}], stream=True)
            first = await anext(in_flight)
            added.unlink()
            await reloaded(serve.url, 5, "applied")
            rest = [c.choices[0].delta.content or "" async for c in in_flight if c.choices]
            assert len([first, *rest]) >= 150, "the removed model's stream in flight finished"
            with pytest.raises(openai.NotFoundError):
                await answer(client, "added")
            await poll_until(lambda: asyncio.sleep(0, pid(serve.url, "added") is None), DEADLINE, "added stopped")
            await poll_until(lambda: asyncio.sleep(0, 'model="added"' not in metrics(serve.url)), DEADLINE,
                             "the removed model's series gone")
        assert load.failures == [] and load.done > 10, (load.failures, load.done)
        assert pid(serve.url, "steady") == steady_pid, "the untouched model's server kept running"
    finally:
        serve.stop()


async def test_sighup_reloads_and_an_invalid_edit_keeps_the_previous_configuration(
        tmp_path: Path, client_for: Any) -> None:
    weights, models = tmp_path / "w.bin", tmp_path / "models"
    weights.write_bytes(b"w")
    write_manifests(models / "steady.yaml", manifest("steady", weights))
    changing = write_manifests(models / "changing.yaml", manifest("changing", weights))
    serve = start_serve(models, tmp_path / "state", "--no-watch")
    try:
        client = client_for(serve.url)
        assert await answer(client, "changing") == "tok0 tok1 "
        changing_pid = pid(serve.url, "changing")
        async with steady_load(client, "steady") as load:
            steady_pid = pid(serve.url, "steady")

            write_manifests(changing, [*manifest("changing", weights, chunks=3), *manifest("added", weights)])
            serve.proc.send_signal(signal.SIGHUP)
            await reloaded(serve.url, 1, "applied")
            assert await answer(client, "added") == "tok0 tok1 "
            await poll_until(lambda: answers(client, "changing", "tok0 tok1 tok2 "), DEADLINE, "the new config")
            assert pid(serve.url, "changing") not in (None, changing_pid)

            changing.write_text("apiVersion: ai.flexinfer/v1alpha2\nkind: Model\nmetadata: {name: changing}\n"
                                "spec: {backend: nope}\n")
            serve.proc.send_signal(signal.SIGHUP)
            config = await reloaded(serve.url, 2, "rejected")
            assert config["trigger"] == "signal" and "spec.backend" in config["error"]
            assert config["errors"] == validate_errors(models, tmp_path / "state")
            shown = CliProcess(["status", "--url", serve.url], serve_env(tmp_path / "state", COLUMNS="1000"))
            assert shown.finish() == 0
            assert "(signal): rejected, the previous configuration stays in force" in shown.log
            assert all(f"error: {error}" in shown.log for error in config["errors"]), shown.log
            assert await answer(client, "added") == "tok0 tok1 "
            assert await answer(client, "changing") == "tok0 tok1 tok2 "
        assert load.failures == [] and load.done > 4, (load.failures, load.done)
        assert pid(serve.url, "steady") == steady_pid
    finally:
        serve.stop()
