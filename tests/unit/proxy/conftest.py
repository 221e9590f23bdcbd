"""Fixtures for the proxy tests: an in-test Activator and Catalog (not the dispatcher), the fake OpenAI
upstream on a real socket, and a factory that starts the proxy on a real socket."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from flexinfer.api.key import ModelKey
from flexinfer.api.model import Model
from flexinfer.core.arbiter.policy import ArbiterPolicy
from flexinfer.core.errors import RequestError
from flexinfer.proxy.app import ProxyServer, create_app
from flexinfer.proxy.config import ProxyConfig
from flexinfer.proxy.hooks import ProxyMetrics, ProxyTracer
from flexinfer.runtime.dispatcher import Dispatcher
from flexinfer.runtime.ports import Catalog, Endpoint, Grant, ModelView
from support.fake_openai import FakeOpenAI, Script
from support.polling import eventually
from support.recording_engine import RecordingEngine


class StubCatalog:
    """Models by name or key, resolvable by their aliases too."""

    def __init__(self, views: Sequence[ModelView]) -> None:
        self.views = list(views)

    def resolve(self, name: str) -> ModelView | None:
        for view in self.views:
            if name in (view.name, view.key) or name in view.aliases:
                return view
        return None

    def models(self) -> Sequence[ModelView]:
        return self.views


@dataclass
class StubActivator:
    """Grants at once unless scripted: ``gates[name]`` makes requests wait (calling on_wait) until the event
    is set; ``errors[name]`` raises after the wait. Counts every grant's releases and records the keys asked
    for (the proxy hands the activator resolved keys)."""

    base_url: str = ""
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    errors: dict[str, RequestError] = field(default_factory=dict)
    acquired: int = 0
    withdrawn: int = 0
    releases: Counter[int] = field(default_factory=Counter)
    waiting: asyncio.Event = field(default_factory=asyncio.Event)
    timeouts: list[float | None] = field(default_factory=list)
    keys: list[ModelKey] = field(default_factory=list)

    async def acquire(self, model: ModelKey, timeout: float | None = None,
                      on_wait: Callable[[str], None] | None = None) -> Grant:
        self.timeouts.append(timeout)
        self.keys.append(model)
        gate = self.gates.get(model.name)
        if gate is not None and not gate.is_set():
            if on_wait is not None:
                on_wait("cold_start")
            self.waiting.set()
            try:
                await gate.wait()
            except asyncio.CancelledError:
                self.withdrawn += 1
                raise
        if model.name in self.errors:
            raise self.errors[model.name]
        self.acquired += 1
        number = self.acquired
        self.releases[number] += 0
        return Grant(model, Endpoint(self.base_url), lambda: self.releases.update([number]))

    def assert_released_once(self) -> None:
        assert all(count == 1 for count in self.releases.values()), dict(self.releases)

    async def wait_released(self, count: int, timeout: float = 5.0) -> None:
        """Poll (with a deadline) until ``count`` grants were released."""
        await eventually(lambda: sum(1 for c in self.releases.values() if c) >= count, timeout)


def view(name: str, **kwargs: object) -> ModelView:
    defaults: dict[str, object] = {"namespace": "default", "backend": "llamacpp", "served_model_name": f"{name}-served",
                                   "phase": "Ready", "group": "gpu0", "created": 1700000000.0}
    defaults.update(kwargs)
    return ModelView(name=name, **defaults)  # type: ignore[arg-type]


DEFAULT_VIEWS = [view("alpha", aliases=("a",)), view("beta"), view("sleepy", parked=True)]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI(Script(chunks=4))
    test_server = TestServer(server.app())
    await test_server.start_server()
    server.base_url = str(test_server.make_url("")).rstrip("/")
    yield server
    await test_server.close()


@dataclass
class Proxy:
    """A started proxy plus what it was built with."""

    url: str
    activator: Any
    """The ``StubActivator`` unless the test passed another one."""
    catalog: StubCatalog | Catalog
    server: ProxyServer
    session: aiohttp.ClientSession
    registry: CollectorRegistry


ProxyFactory = Callable[..., Awaitable[Proxy]]


@pytest.fixture
async def make_proxy(fake: FakeOpenAI) -> AsyncIterator[ProxyFactory]:
    started: list[Proxy] = []

    async def factory(config: ProxyConfig | None = None, *, metrics: ProxyMetrics | None = None,
                      tracer: ProxyTracer | None = None, catalog: Catalog | None = None,
                      registry: CollectorRegistry | None = None, activator: Any = None,
                      **overrides: object) -> Proxy:
        """``activator``: a real one (a ``Dispatcher``) instead of the ``StubActivator``."""
        cfg = replace(config or ProxyConfig(shutdown_drain_delay=0.0, loading_comment_interval=0.05), **overrides)
        activator = activator or StubActivator(base_url=fake.base_url)
        catalog, registry = catalog or StubCatalog(DEFAULT_VIEWS), registry or CollectorRegistry()
        app = create_app(cfg, activator, catalog, registry=registry, metrics=metrics, tracer=tracer)
        server = ProxyServer(app, cfg)
        port = await server.start("127.0.0.1", 0)
        proxy = Proxy(f"http://127.0.0.1:{port}", activator, catalog, server, aiohttp.ClientSession(), registry)
        started.append(proxy)
        return proxy

    yield factory
    for proxy in started:
        await proxy.session.close()
        if proxy.server.port and not proxy.server.closed:
            await proxy.server.shutdown()


@pytest.fixture
async def make_dispatcher(fake: FakeOpenAI) -> AsyncIterator[Callable[..., Dispatcher]]:
    """Real dispatchers (the arbiter's queue, capacity and deadlines) over a recording engine whose models all
    answer at the fake upstream; each is started, and shut down after the test."""
    started: list[Dispatcher] = []

    def factory(models: Sequence[Model], policy: ArbiterPolicy | None = None,
                engine: RecordingEngine | None = None) -> Dispatcher:
        dispatcher = Dispatcher(engine or RecordingEngine(base_url=fake.base_url), models, policy=policy)
        dispatcher.start()
        started.append(dispatcher)
        return dispatcher

    yield factory
    for dispatcher in started:
        await dispatcher.shutdown()
