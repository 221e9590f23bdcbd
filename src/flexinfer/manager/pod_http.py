"""The manager's own HTTP line to pods: one aiohttp session, opened on first use, and the tasks that use it.

The pod prober (``flexinfer.manager.pod_prober``: a starting model pod's health) and the group pods' link
(``flexinfer.manager.group_pod_link``: a group pod's admin API) each keep one ``PodHttp``: the session never
reads proxy settings from the environment (pods are reached directly), and ``close`` cancels the tasks given
and waits for them before closing the connections. ``starting_intervals`` is how often both ask a server that
has not answered yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import Final

import aiohttp

FIRST_INTERVAL: Final = 0.02
"""Between two asks of a server that has not answered, for its first ``FIRST_ASKS`` asks: a tiny model's server
(llama.cpp starts in milliseconds) is seen up within 20 ms, what the manager adds to a fast start."""
FIRST_ASKS: Final = 100
LATER_INTERVAL: Final = 0.1
"""After the first ``FIRST_ASKS`` asks (about 2 s, more with connect times): a server that takes longer is
loading weights for seconds or minutes, and 0.1 s late is negligible; ten asks a second, not fifty, for that long."""


def starting_intervals() -> Iterator[float]:
    """The pauses between asks of a server that has not answered yet (see ``FIRST_INTERVAL``)."""
    for _ in range(FIRST_ASKS):
        yield FIRST_INTERVAL
    while True:
        yield LATER_INTERVAL


class PodHttp:
    """A lazily opened session with a total ``timeout`` per request (seconds)."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout),
                                                  trust_env=False)
        return self._session

    async def close(self, tasks: Iterable[asyncio.Task[None]]) -> None:
        """Cancel ``tasks``, wait for them, then close the connections."""
        pending = list(tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
