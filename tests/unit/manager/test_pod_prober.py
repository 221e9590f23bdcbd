"""``PodProber.first_answers``: a pass waits for the first answer of the asks it started, never longer than its
budget; an answer that comes later still wakes the unit."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from flexinfer.core.pod_answer import run_key
from flexinfer.manager.pod_prober import PodProber

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def starting_pod(port: int) -> dict[str, Any]:
    return {"metadata": {"name": "m-1", "namespace": "ns"},
            "spec": {"containers": [{"name": "model", "ports": [{"name": "http", "containerPort": port}],
                                     "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}}}]},
            "status": {"podIP": "127.0.0.1", "containerStatuses": [
                {"name": "model", "restartCount": 0, "state": {"running": {"startedAt": "2026-12-05T12:00:00Z"}}}]}}


async def test_a_server_slower_than_the_budget_is_left_to_wake_the_unit_when_it_answers() -> None:
    release, woken = asyncio.Event(), asyncio.Event()

    async def health(_request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(status=200)

    app = web.Application()
    app.router.add_get("/health", health)
    async with TestServer(app, host="127.0.0.1") as server:
        pod = starting_pod(server.port or 0)
        prober: PodProber[str] = PodProber(lambda _unit: woken.set(), lambda: NOW)
        try:
            prober.track("unit", [pod])
            assert await prober.first_answers("unit", budget=0.05) is False
            assert prober.answered([pod]) == {}, "no answer yet: the pass goes on without one"
            release.set()
            await woken.wait()
            assert prober.answered([pod]) == {run_key(pod): NOW}
            assert await prober.first_answers("unit", budget=0.05) is False, "nothing asked any more"
        finally:
            await prober.close()


async def test_the_first_answer_of_a_listening_server_is_there_when_the_wait_ends() -> None:
    async def health(_request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    app.router.add_get("/health", health)
    async with TestServer(app, host="127.0.0.1") as server:
        pod = starting_pod(server.port or 0)
        prober: PodProber[str] = PodProber(lambda _unit: None, lambda: NOW)
        try:
            prober.track("unit", [pod])
            assert await prober.first_answers("unit", budget=30.0) is True
            assert prober.answered([pod]) == {run_key(pod): NOW}
        finally:
            await prober.close()
