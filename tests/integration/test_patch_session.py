"""The manager's aiohttp writes (``flexinfer.manager.patch_session``) against a real kube-apiserver: they write
what lightkube's client writes, a refused token is read again once, and an error answer is lightkube's
``ApiError`` with the API server's status."""

from __future__ import annotations

import dataclasses
from typing import Any

import kopf
import pytest
from lightkube import ApiError, KubeConfig

from flexinfer.manager.client import FIELD_MANAGER, KubeApi
from flexinfer.manager.connection import connection_info
from flexinfer.manager.patch_session import PatchSession
from support.manager_harness import cluster, kube_testbed

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]


async def test_writes_match_lightkube_a_refused_token_is_read_again_and_errors_keep_their_status(
        kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        await c.create_model("m")
        good = connection_info(KubeConfig.from_file(c.kubeconfig))
        handed: list[str | None] = []

        def credentials() -> kopf.ConnectionInfo:
            """The first login gets a token the API server refuses, the next the right one (a rotated token)."""
            info = good if handed else dataclasses.replace(good, token="not-a-token")
            handed.append(info.token)
            return info

        session = PatchSession(credentials)
        try:
            fast, plain = KubeApi(c.client, session), KubeApi(c.client)
            answer = await fast.patch_model_status(c.namespace, "m", {"phase": "Idle", "message": "over aiohttp"})
            assert handed == ["not-a-token", good.token], "one 401, the credentials read again, the write sent again"
            stored = await c.model("m")
            assert answer["status"]["message"] == stored["status"]["message"] == "over aiohttp"
            assert answer["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]

            service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "m", "namespace": c.namespace},
                       "spec": {"selector": {"app": "m"}, "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}]}}
            created = await fast.apply(service)
            same = await plain.apply(service)
            assert created["spec"]["clusterIP"] == same["spec"]["clusterIP"]
            assert created["metadata"]["uid"] == same["metadata"]["uid"]
            assert {f["manager"] for f in same["metadata"]["managedFields"]} == {FIELD_MANAGER}

            with pytest.raises(ApiError) as refused:
                await fast.patch_model_status(c.namespace, "m", {"phase": "Sleeping"})
            assert refused.value.status.code == 422 and "phase" in str(refused.value)
            with pytest.raises(ApiError) as missing:
                await fast.patch_model_status(c.namespace, "absent", {"phase": "Idle"})
            assert missing.value.status.code == 404
            assert len(handed) == 2, "no other login"
        finally:
            await session.close()
