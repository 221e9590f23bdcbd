"""``KubeApi.record_event``: an Event posted in the background, sent before the client closes."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from lightkube import AsyncClient

from flexinfer.manager import client as client_module
from flexinfer.manager.client import KubeApi

MODEL = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
         "metadata": {"name": "tiny-a", "namespace": "ns", "uid": "u1", "resourceVersion": "7"}}


class GatedClient:
    """A lightkube client whose ``create`` waits for ``gate``; records what it created and when it closed."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.created: list[Any] = []
        self.closed_after: list[int] = []

    async def create(self, obj: Any) -> Any:
        await self.gate.wait()
        self.created.append(obj)
        return obj

    async def close(self) -> None:
        self.closed_after.append(len(self.created))


async def test_record_event_does_not_wait_and_close_sends_it_first() -> None:
    fake = GatedClient()
    api = KubeApi(cast(AsyncClient, fake))
    api.record_event(MODEL, "Normal", "Preempted", "Preempted by tiny-b with priority 200")
    await asyncio.sleep(0)  # the post has started and waits on the API server
    assert fake.created == []
    closing = asyncio.create_task(api.close())
    await asyncio.sleep(0)
    assert not closing.done() and fake.closed_after == []
    fake.gate.set()
    await closing
    assert fake.closed_after == [1]
    event = fake.created[0]
    assert (event.reason, event.type, event.involvedObject.name) == ("Preempted", "Normal", "tiny-a")


async def test_close_gives_up_on_an_event_that_never_lands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "EVENT_FLUSH_S", 0.01)
    fake = GatedClient()
    api = KubeApi(cast(AsyncClient, fake))
    api.record_event(MODEL, "Normal", "Preempted", "never answered")
    await api.close()
    assert fake.closed_after == [0]
