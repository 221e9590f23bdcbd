"""The manager asks a model pod's server itself whether it is up, instead of waiting for the kubelet's probe.

On each pass over a unit the reconciler hands ``PodProber.track`` the unit's pods. For every pod that
``flexinfer.core.pod_answer.health_target`` names (its model container starts or runs, it is not Ready yet) and that
has not answered in its current container run, a task sends a GET (``ANSWER_TIMEOUT``) at the pod HTTP line's
``starting_intervals`` (every 20 ms at first, then 0.1 s) until a 2xx answer; it then remembers the time and wakes the
unit, whose next pass counts the pod Ready from that instant (``UnitFacts.answered``), until a pass shows the
kubelet's own ``Ready``: the answer is dropped then, and the kubelet's view alone counts. The pass that started
the asks may wait for their first answers (``first_answers``, bounded): a server that already listens when its
pod is first seen (the kubelet reports the running container and the address together, often after the server
started) is then Ready in that very pass, with one status write instead of two in a row. A target that is gone from
the unit's next pass (the pod was deleted, turned Ready, restarted) has its task cancelled. Answers are kept for
``ANSWER_TTL``. Built by the reconciler (``flexinfer.manager.reconciler``), closed with the manager.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Hashable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Generic, TypeVar

import aiohttp

from flexinfer.core.pod_answer import HealthTarget, health_target, kubelet_ready, run_key
from flexinfer.manager.pod_http import PodHttp, starting_intervals

ANSWER_TIMEOUT: Final = 0.5
"""A server that listens answers a health request in milliseconds; a slower one is asked again."""
FIRST_ASK_BUDGET: Final = 0.05
"""The longest a pass waits for the first answers of the asks it started (``first_answers``): a listening server
answers in milliseconds, one that does not listen yet refuses at once."""
ANSWER_TTL: Final = 600.0
"""An answer is kept this long: by then the kubelet has seen the pod Ready (its own probe every second), or it
disagrees, and the kubelet's view wins."""


U = TypeVar("U", bound=Hashable)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class PodProber(Generic[U]):
    """Health requests to model pods and the answers they gave (see the module docstring)."""

    def __init__(self, wake: Callable[[U], None], clock: Callable[[], datetime] = _utcnow) -> None:
        self._wake, self._clock = wake, clock
        self._answers: dict[str, datetime] = {}
        self._tasks: dict[U, dict[str, asyncio.Task[None]]] = {}
        self._first: dict[str, asyncio.Future[None]] = {}
        """Run key → done once its first ask came back (answered or not)."""
        self._http = PodHttp(ANSWER_TIMEOUT)

    def track(self, unit: U, pods: Iterable[Mapping[str, Any]]) -> None:
        """Ask the unit's pods that have a health target and no answer; stop asking those that have none now."""
        now = self._clock()
        for key in [k for k, at in self._answers.items() if (now - at).total_seconds() > ANSWER_TTL]:
            del self._answers[key]
        pods = list(pods)
        for pod in pods:  # the kubelet saw it Ready: from now on its view alone counts
            if kubelet_ready(pod) and (run := run_key(pod)) is not None:
                self._answers.pop(run, None)
        targets = {t.key: t for p in pods if (t := health_target(p)) is not None and t.key not in self._answers}
        asking = self._tasks.setdefault(unit, {})
        for key in [k for k in asking if k not in targets]:
            asking.pop(key).cancel()
            self._asked(key)
        loop = asyncio.get_running_loop()
        for key, target in targets.items():
            if key not in asking:
                self._first[key] = loop.create_future()
                asking[key] = loop.create_task(self._poll(unit, target))
        if not asking:
            del self._tasks[unit]

    async def first_answers(self, unit: U, budget: float = FIRST_ASK_BUDGET) -> bool:
        """Wait, at most ``budget`` seconds, until each pod of ``unit`` being asked had its first ask come back;
        whether any of them answered (a new entry in ``answered``)."""
        keys = list(self._tasks.get(unit, {}))
        pending = [first for key in keys if (first := self._first.get(key)) is not None]
        if not pending:
            return False
        await asyncio.wait(pending, timeout=budget)
        return any(key in self._answers for key in keys)

    def _asked(self, key: str) -> None:
        first = self._first.pop(key, None)
        if first is not None and not first.done():
            first.set_result(None)

    def answered(self, pods: Iterable[Mapping[str, Any]]) -> dict[str, datetime]:
        """Run key → when that run's server answered, for these pods."""
        return {key: self._answers[key] for pod in pods if (key := run_key(pod)) is not None and key in self._answers}

    async def _poll(self, unit: U, target: HealthTarget) -> None:
        pauses = starting_intervals()
        while True:  # a remote server to ask again, not a local state to wait for
            if await self._ask(target):
                break
            self._asked(target.key)
            await asyncio.sleep(next(pauses))
        self._answers[target.key] = self._clock()
        self._asked(target.key)
        asking = self._tasks.get(unit, {})
        asking.pop(target.key, None)
        if not asking:
            self._tasks.pop(unit, None)
        self._wake(unit)

    async def _ask(self, target: HealthTarget) -> bool:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
            async with self._http.session().get(target.url, allow_redirects=False) as response:
                return 200 <= response.status < 300
        return False

    async def close(self) -> None:
        """Stop asking; close the connections."""
        tasks = [task for asking in self._tasks.values() for task in asking.values()]
        self._tasks.clear()
        for key in list(self._first):
            self._asked(key)
        await self._http.close(tasks)
