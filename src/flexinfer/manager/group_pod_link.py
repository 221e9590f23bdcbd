"""The manager's line to each running group pod: its admin status, its lifecycle events, and manifest pushes.

``GroupPodLinks.track(unit, target)`` keeps one polling task per group unit whose pod runs (``target``: the pod run, its
own URL and the admin token; ``None`` stops it). The task GETs ``/admin/status`` at the pod HTTP line's
``starting_intervals`` (every 20 ms at first, then 0.1 s) until the pod answers, then every ``POLL_RUNNING``; each
answer that differs from the last (a member's phase, errors, need, the manifest revision) is kept as the unit's
``report`` and wakes the unit before anything else is asked of the pod. A pod that stops answering (``MISSES``
polls in a row) loses its report, which wakes the unit too. With each status it reads ``/admin/lifecycle?after=N``
and hands the new cold starts and swaps to ``replay`` (the manager's histograms, ``flexinfer.manager.group_pods``).
``push`` PUTs the manifests the manager rendered (``/admin/manifests``); routes in docs/reference/admin-api.md.
Built by the reconciler, closed with the manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import aiohttp

from flexinfer.core.group_pod_report import PodReport
from flexinfer.manager.pod_http import PodHttp, starting_intervals

log = logging.getLogger("flexinfer.manager")
POLL_RUNNING: Final = 0.5
"""Between two reads of a running pod's status (how late ``kubectl get mdl`` shows a swap inside the pod)."""
REQUEST_TIMEOUT: Final = 2.0
MISSES: Final = 3
"""Unanswered polls in a row after which the pod counts as not answering."""

U = TypeVar("U")


@dataclass(frozen=True)
class LinkTarget:
    """A group pod run to talk to."""

    run: str
    """The pod's uid: a new pod (or a restarted one) starts a new line."""
    url: str
    token: str


@dataclass(frozen=True)
class LifecycleEvent:
    """A cold start or swap the pod's dispatcher measured."""

    model: str
    kind: str
    seconds: float
    at: str


class GroupPodLinks(Generic[U]):
    """See the module docstring."""

    def __init__(self, wake: Callable[[U], None], replay: Callable[[U, list[LifecycleEvent]], None]) -> None:
        self._wake, self._replay = wake, replay
        self._targets: dict[U, LinkTarget] = {}
        self._tasks: dict[U, asyncio.Task[None]] = {}
        self._reports: dict[U, PodReport] = {}
        self._missed: set[U] = set()
        self._http = PodHttp(REQUEST_TIMEOUT)

    def report(self, unit: U) -> PodReport | None:
        """The pod's last answer, while it answers."""
        return self._reports.get(unit)

    def asking(self, unit: U) -> bool:
        """A pod is being polled that has neither answered nor missed ``MISSES`` polls yet (its members' status
        waits for the first answer rather than being written without it)."""
        return unit in self._tasks and unit not in self._reports and unit not in self._missed


    def track(self, unit: U, target: LinkTarget | None) -> None:
        """Poll ``target`` for ``unit`` (a different run replaces the old task; ``None`` stops polling)."""
        if self._targets.get(unit) == target:
            return
        task = self._tasks.pop(unit, None)
        if task is not None:
            task.cancel()
        self._targets.pop(unit, None)
        self._missed.discard(unit)
        if self._reports.pop(unit, None) is not None:
            self._wake(unit)
        if target is not None:
            self._targets[unit] = target
            self._tasks[unit] = asyncio.get_running_loop().create_task(self._poll(unit, target),
                                                                        name=f"group-pod-{unit}")

    async def push(self, unit: U, text: str) -> bool:
        """PUT the manifests to the unit's pod; ``True`` when it accepted them (its next status says so)."""
        target = self._targets.get(unit)
        if target is None:
            return False
        try:
            async with self._http.session().put(f"{target.url}/admin/manifests", data=text.encode(),
                                        headers={**_auth(target), "Content-Type": "application/yaml"}) as response:
                if response.status == 200:
                    return True
                body = await response.text()
                log.error("group pod %s refused the manifests (HTTP %d): %s", unit, response.status, body[:2000])
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("group pod %s: cannot push the manifests: %s", unit, exc)
        return False

    async def _poll(self, unit: U, target: LinkTarget) -> None:
        misses, after, pauses = 0, 0, starting_intervals()
        while True:  # a remote server to ask again, not a local state to wait for
            body = await self._get(target, "/admin/status")
            if body is None:
                misses += 1
                if misses >= MISSES and unit not in self._missed:
                    self._missed.add(unit)
                    if self._reports.pop(unit, None) is not None:
                        log.info("group pod %s stopped answering", unit)
                    self._wake(unit)
            else:
                misses = 0
                self._missed.discard(unit)
                report = PodReport.from_status(target.run, target.url, body)
                if report != self._reports.get(unit):
                    self._reports[unit] = report
                    self._wake(unit)
                # After the wake: a new pod's first answer is on a cold start's path (its members' endpoint is
                # published from it), the events only feed the histograms.
                after = await self._events(unit, target, after)
            if unit in self._reports:
                pauses = starting_intervals()  # asked afresh should it stop answering
                await asyncio.sleep(POLL_RUNNING)
            else:
                await asyncio.sleep(next(pauses))

    async def _events(self, unit: U, target: LinkTarget, after: int) -> int:
        body = await self._get(target, f"/admin/lifecycle?after={after}")
        if body is None:
            return after
        events = [LifecycleEvent(str(e.get("model")), str(e.get("kind")), float(e.get("seconds") or 0.0),
                                 str(e.get("at") or ""))
                  for e in body.get("events") or () if isinstance(e, Mapping)]
        if events:
            self._replay(unit, events)
        following = body.get("next")  # smaller than ``after``: serve restarted in the pod and counts anew
        return following if isinstance(following, int) and following >= 0 else after

    async def _get(self, target: LinkTarget, path: str) -> Mapping[str, Any] | None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError, ValueError):
            async with self._http.session().get(f"{target.url}{path}", headers=_auth(target)) as response:
                if response.status == 200:
                    body = await response.json()
                    return body if isinstance(body, Mapping) else None
        return None

    async def close(self) -> None:
        """Stop polling; close the connections."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        self._targets.clear()
        await self._http.close(tasks)


def _auth(target: LinkTarget) -> dict[str, str]:
    return {"Authorization": f"Bearer {target.token}"} if target.token else {}
