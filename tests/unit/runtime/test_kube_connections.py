"""API server connections are kept ``KEEPALIVE_S`` when idle: a request after a quiet spell longer than the clients'
defaults (httpx 5 s, aiohttp 15 s) reuses the connection instead of opening a new one, and one idle past the keep-alive
is not reused. The clients' clocks are moved, not waited for."""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace

import aiohttp
import httpcore2._async.http11 as httpcore_http11
import pytest
from aiohttp import web
from aiohttp.test_utils import BaseTestServer, TestServer
from lightkube import KubeConfig
from lightkube.core.exceptions import ConfigError
from lightkube.resources.core_v1 import Namespace

from flexinfer.runtime.kube_connections import KEEPALIVE_S, kube_client, kube_connector


class Peers:
    """A plain-HTTP stand-in for the API server's ``GET namespaces/default`` that records each request's client
    port (one port per TCP connection)."""

    def __init__(self) -> None:
        self.ports: list[int] = []

    async def namespace(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        self.ports.append(peer[1] if peer else -1)
        return web.json_response({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})


@pytest.fixture
async def server() -> AsyncIterator[tuple[BaseTestServer, Peers]]:
    peers = Peers()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/default", peers.namespace)
    async with TestServer(app, host="127.0.0.1") as running:
        yield running, peers


def kubeconfig(port: int) -> KubeConfig:
    """A kubeconfig for the plain-HTTP stand-in, with a token user."""
    return KubeConfig.from_dict({
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x"})


def later(seconds: float) -> Callable[[], float]:
    """A monotonic clock ``seconds`` ahead of the real one."""
    return lambda: time.monotonic() + seconds


@pytest.mark.parametrize(("idle", "connections"), [(KEEPALIVE_S - 5, 1), (KEEPALIVE_S + 5, 2)],
                         ids=["within-keepalive", "past-keepalive"])
async def test_the_lightkube_client_keeps_an_idle_connection_for_the_keepalive(
        server: tuple[BaseTestServer, Peers], monkeypatch: pytest.MonkeyPatch, idle: float, connections: int) -> None:
    running, peers = server
    client = kube_client(kubeconfig(running.port or 0), field_manager="test")
    try:
        await client.get(Namespace, "default")
        monkeypatch.setattr(httpcore_http11, "time", SimpleNamespace(monotonic=later(idle)))
        await client.get(Namespace, "default")
    finally:
        await client.close()
    assert len(set(peers.ports)) == connections, peers.ports


@pytest.mark.parametrize(("idle", "connections"), [(KEEPALIVE_S - 5, 1), (KEEPALIVE_S + 5, 2)],
                         ids=["within-keepalive", "past-keepalive"])
async def test_the_aiohttp_connector_keeps_an_idle_connection_for_the_keepalive(
        server: tuple[BaseTestServer, Peers], monkeypatch: pytest.MonkeyPatch, idle: float, connections: int) -> None:
    running, peers = server
    url = f"http://127.0.0.1:{running.port}/api/v1/namespaces/default"
    async with aiohttp.ClientSession(connector=kube_connector(ssl.create_default_context(), limit=4)) as session:
        async with session.get(url) as first:
            await first.read()
        monkeypatch.setattr(aiohttp.connector, "monotonic", later(idle))
        async with session.get(url) as second:
            await second.read()
    assert len(set(peers.ports)) == connections, peers.ports


def test_a_kubeconfig_without_a_user_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        kube_client(KubeConfig.from_server("http://127.0.0.1:1"), field_manager="test")


def test_the_keepalive_is_longer_than_a_swaps_hold_and_shorter_than_the_api_servers_idle_timeout() -> None:
    assert 15 < KEEPALIVE_S < 90
