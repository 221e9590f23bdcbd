"""kopf's retries of the Model deletion handler, with the real kopf against the real kube-apiserver.

The manager side of the handler is replaced by a bridge that raises scripted errors (fault injection): a
permanent error (``ConfigError``) must not be retried — kopf releases the finalizer at once and the Model is
gone — and a temporary one (``EngineError``) is retried after the mapped delay, then succeeds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from lightkube import ApiError, KubeConfig

from flexinfer.core.errors import ConfigError, EngineError
from flexinfer.manager import operator
from flexinfer.manager.client import ModelResource
from flexinfer.manager.connection import connection_info
from flexinfer.manager.operator import OperatorThread, build_registry, operator_settings
from support.kube_testbed import KubeTestbed
from support.manager_harness import Cluster, cluster, kube_testbed

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]


class ScriptedBridge:
    """Raises the scripted errors from ``deleting``, one per call, then succeeds."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        self.calls: list[float] = []

    def event(self, kind: str, type_: str | None, body: dict[str, Any]) -> None:
        return None

    async def deleting(self, body: dict[str, Any]) -> None:
        self.calls.append(time.monotonic())
        if self.errors:
            raise self.errors.pop(0)


async def gone(c: Cluster, name: str) -> bool:
    try:
        await c.client.get(ModelResource, name, namespace=c.namespace)
    except ApiError as error:
        return error.status.code == 404
    return False


async def with_finalizer(c: Cluster, name: str) -> bool:
    model = await c.model(name)
    return "flexinfer.ai/model-cleanup" in (model["metadata"].get("finalizers") or [])


async def delete_with(testbed: KubeTestbed, errors: list[Exception]) -> tuple[ScriptedBridge, float]:
    """Run kopf with a scripted bridge, create and delete a Model; return the bridge and the seconds until the
    Model was gone."""
    assert testbed.kubeconfig is not None
    kubeconfig = KubeConfig.from_file(testbed.kubeconfig)
    bridge = ScriptedBridge(errors)
    async with cluster(testbed) as c:
        registry = build_registry(bridge, lambda: connection_info(kubeconfig), asyncio.get_running_loop(),
                                  namespaces=1)
        kopf_thread = OperatorThread(registry, operator_settings(), (c.namespace,))
        kopf_thread.start()
        try:
            assert await kopf_thread.wait_ready(60), kopf_thread.error
            await c.create_model("doomed")
            await c.wait_for(lambda: with_finalizer(c, "doomed"), what="kopf's finalizer")
            started = time.monotonic()
            await c.client.delete(ModelResource, "doomed", namespace=c.namespace)
            await c.wait_for(lambda: gone(c, "doomed"), timeout=30, what="the Model deleted")
            return bridge, time.monotonic() - started
        finally:
            await kopf_thread.stop()


async def test_a_permanent_error_is_not_retried(kube_testbed: KubeTestbed) -> None:
    bridge, elapsed = await delete_with(kube_testbed, [ConfigError("cannot clean up: bad setting")])
    assert len(bridge.calls) == 1
    assert elapsed < operator.RETRY_DELAY  # released at once, not after a retry


async def test_a_temporary_error_is_retried_after_the_delay(
    kube_testbed: KubeTestbed, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(operator, "RETRY_DELAY", 1.5)
    bridge, _ = await delete_with(kube_testbed, [EngineError("apiserver hiccup")])
    assert len(bridge.calls) == 2
    assert bridge.calls[1] - bridge.calls[0] >= 1.5
