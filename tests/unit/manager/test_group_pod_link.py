"""``GroupPodLinks``: a group pod's first answer is kept and wakes its unit before anything else is asked of the
pod (the lifecycle events it then reads feed only the histograms); events still reach ``replay``."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from flexinfer.manager.group_pod_link import GroupPodLinks, LifecycleEvent, LinkTarget

STATUS = {"models": [{"key": "ns/tiny-a", "phase": "Ready"}], "config": {"revision": "r1"}}
EVENT = {"model": "ns/tiny-a", "kind": "cold_start", "seconds": 0.05, "at": "2026-12-05T12:00:00Z"}


async def test_the_first_answer_wakes_the_unit_while_the_events_are_still_being_read() -> None:
    release, woken, lifecycle_asked, replayed_any = asyncio.Event(), asyncio.Event(), asyncio.Event(), asyncio.Event()
    replayed: list[LifecycleEvent] = []
    asked_before_wake: list[bool] = []

    def wake(_unit: str) -> None:
        asked_before_wake.append(lifecycle_asked.is_set())
        woken.set()

    def replay(_unit: str, events: list[LifecycleEvent]) -> None:
        replayed.extend(events)
        replayed_any.set()

    async def status(_request: web.Request) -> web.Response:
        return web.json_response(STATUS)

    async def lifecycle(request: web.Request) -> web.Response:
        lifecycle_asked.set()
        if request.query.get("after") == "0":
            await release.wait()
            return web.json_response({"events": [EVENT], "next": 1})
        return web.json_response({"events": [], "next": 1})

    app = web.Application()
    app.router.add_get("/admin/status", status)
    app.router.add_get("/admin/lifecycle", lifecycle)
    async with TestServer(app, host="127.0.0.1") as server:
        links: GroupPodLinks[str] = GroupPodLinks(wake, replay)
        try:
            links.track("group", LinkTarget("uid-1", f"http://127.0.0.1:{server.port}", "token"))
            await woken.wait()
            assert asked_before_wake == [False], "woken before the pod was asked for its events"
            report = links.report("group")
            assert report is not None and report.members["ns/tiny-a"].phase == "Ready"
            await lifecycle_asked.wait()
            assert replayed == [], "the events come after the wake, not before it"
            release.set()
            await replayed_any.wait()
            assert replayed == [LifecycleEvent("ns/tiny-a", "cold_start", 0.05, "2026-12-05T12:00:00Z")]
        finally:
            await links.close()
