"""A seeded storm of OpenAI requests against one FlexInfer endpoint, for the contention test and the soak
benchmark (``bench/soak.py``).

``plan_storm(seed, ...)`` draws the requests (model, kind, arrival time) from one ``random.Random``, so a
failing run replays with its seed. ``run_storm`` sends them with the official ``openai`` client, at most
``concurrency`` at once, and records each one's outcome: ``ok`` (a complete answer: content and a
``finish_reason``), ``error`` (an OpenAI error status with an error body), ``cancelled`` (this client gave up
on purpose: a stream dropped mid-way, a request abandoned before its answer), or ``bad`` (anything else: a
truncated stream, a body that is no OpenAI error, a hang past the budget).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import openai

from support.llama_server import TINY_ARGS
from support.local_serve import model_manifest, write_manifests
from support.tiny_gguf import write_tiny_gguf

STORM_MODELS = {"tiny-a": 100, "tiny-b": 100, "tiny-c": 150, "tiny-d": 200}
"""The storm's models (name → priority), all in GPU group ``gpu0``."""
KINDS = ("plain", "stream", "cancel", "abandon")
WEIGHTS = (0.35, 0.45, 0.1, 0.1)


@dataclass(frozen=True)
class Planned:
    """One request of the storm."""

    index: int
    model: str
    kind: str
    at: float
    """Seconds after the storm's start at which it is sent (or later, when ``concurrency`` is reached)."""
    give_up_after: float
    """For ``cancel``/``abandon``: seconds after sending at which the client drops it."""


@dataclass
class Outcome:
    """What happened to one request."""

    planned: Planned
    result: str = "bad"
    status: int | None = None
    code: str | None = None
    message: str = ""
    started: float = 0.0
    ended: float = 0.0

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass
class Storm:
    """The outcomes of one run, in plan order."""

    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, result: str) -> int:
        return sum(o.result == result for o in self.outcomes)

    def errors_by_code(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            if o.result in ("error", "bad"):
                status = o.status or "SSE"  # an error event on a stream whose head was sent
                key = f"{status} {o.code}" if o.result == "error" else f"bad: {o.message[:60]}"
                counts[key] = counts.get(key, 0) + 1
        return counts


def storm_manifests(workdir: Path) -> Path:
    """Write the ``STORM_MODELS`` (tiny llama.cpp models served by ``llama-server``, generated weights, one thread
    each) into one group; returns the manifest directory for ``flexinfer serve -f``."""
    config = {"args": TINY_ARGS}
    documents = []
    for i, (name, priority) in enumerate(STORM_MODELS.items()):
        doc = model_manifest(name, write_tiny_gguf(workdir / f"{name}.gguf", seed=i), "gpu0", config)
        doc["spec"]["gpu"]["priority"] = priority
        documents.append(doc)
    return write_manifests(workdir / "models" / "models.yaml", documents).parent


def plan_storm(seed: int, models: Sequence[str], count: int, duration: float) -> list[Planned]:
    """``count`` requests over ``duration`` seconds, uniformly spread, drawn from ``seed``."""
    rng = random.Random(seed)
    times = sorted(rng.uniform(0.0, duration) for _ in range(count))
    return [Planned(i, rng.choice(list(models)), rng.choices(KINDS, WEIGHTS)[0], at, rng.uniform(0.05, 3.0))
            for i, at in enumerate(times)]


async def run_storm(base_url: str, plan: Sequence[Planned], *, concurrency: int, budget: float,
                    max_tokens: int = 12) -> Storm:
    """Send ``plan`` against ``base_url`` (``http://host:port``); each request is bounded by ``budget``
    seconds on the client side (past it: ``bad``, hung)."""
    gate = asyncio.Semaphore(concurrency)
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                                timeout=budget)
    start = time.monotonic()
    storm = Storm([Outcome(p) for p in plan])

    async def one(outcome: Outcome) -> None:
        delay = outcome.planned.at - (time.monotonic() - start)
        if delay > 0:
            await asyncio.sleep(delay)  # the storm's arrival schedule, not a wait for state
        async with gate:
            outcome.started = time.monotonic()
            try:
                await asyncio.wait_for(_send(client, outcome, max_tokens), budget)
            except TimeoutError:
                outcome.result, outcome.message = "bad", f"no answer within {budget}s"
            outcome.ended = time.monotonic()

    try:
        await asyncio.gather(*(one(o) for o in storm.outcomes))
    finally:
        await client.close()
    return storm


async def _send(client: openai.AsyncOpenAI, outcome: Outcome, max_tokens: int) -> None:
    planned = outcome.planned
    messages = [{"role": "user", "content": f"storm request {planned.index}"}]
    streaming = planned.kind in ("stream", "cancel")
    answer = (_stream if streaming else _plain)(client, outcome, messages, max_tokens)
    try:
        if planned.kind in ("cancel", "abandon"):
            try:
                await asyncio.wait_for(answer, planned.give_up_after)
            except TimeoutError:
                outcome.result = "cancelled"
        else:
            await answer
    except openai.APIStatusError as error:
        body = error.body if isinstance(error.body, dict) else None
        outcome.status = error.status_code
        if body is not None and isinstance(body.get("message"), str) and "code" in body:
            outcome.result, outcome.code, outcome.message = "error", str(body.get("code")), body["message"]
        else:
            outcome.result, outcome.message = "bad", f"status {error.status_code} without an OpenAI body: {body!r}"
    except openai.APIError as error:  # a stream that ended with an SSE error event, a dropped connection
        body = error.body if isinstance(error.body, dict) else None
        if body is not None and isinstance(body.get("message"), str):
            outcome.result, outcome.code, outcome.message = "error", str(body.get("code")), body["message"]
        else:
            outcome.result, outcome.message = "bad", f"{type(error).__name__}: {error}"[:200]


async def _plain(client: openai.AsyncOpenAI, outcome: Outcome, messages: list[dict[str, str]],
                 max_tokens: int) -> None:
    answer = await client.chat.completions.create(model=outcome.planned.model, messages=messages,  # type: ignore[arg-type]
                                                  max_tokens=max_tokens, temperature=0)
    choice = answer.choices[0]
    complete = choice.finish_reason is not None and choice.message.content is not None
    outcome.result = "ok" if complete else "bad"
    outcome.message = "" if complete else f"incomplete answer {answer!r}"[:200]


async def _stream(client: openai.AsyncOpenAI, outcome: Outcome, messages: list[dict[str, str]],
                  max_tokens: int) -> None:
    stream = await client.chat.completions.create(model=outcome.planned.model, messages=messages,  # type: ignore[arg-type]
                                                  max_tokens=max_tokens, temperature=0, stream=True)
    finished = False
    try:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason is not None:
                finished = True
    finally:
        await stream.close()
    outcome.result = "ok" if finished else "bad"
    outcome.message = "" if finished else "stream ended without a finish_reason"
