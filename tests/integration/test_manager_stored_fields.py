"""Objects stored before the CRDs carried the quantity ``pattern``, against a real kube-apiserver.

The honest way to get such objects: apply the CRDs as they were before (the same schemas without the
``pattern``/``minimum`` on quantities and durations), create a ModelCache and a Model with
``tmpfsSizeLimit: "16 gigs"``, then apply the current CRDs. The API server keeps the stored objects and from
then on rejects new ones. The manager must ignore only the bad field — the ModelCache's ``enabled: true`` and
``concurrency: 7`` still reach the Deployment, the Model is rendered instead of going Failed — and name the field
in a Warning event (on the object that holds it) and in the ``ConfigValid`` condition of the Models it affects.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
import yaml
from lightkube import ApiError

from flexinfer.api.crds import crd_documents
from flexinfer.manager.sync import ModelCacheResource
from support.kube_testbed import KubeTestbed
from support.manager_harness import Cluster, cluster, kube_testbed, manager_config, start_manager
from support.polling import poll_until

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]

BAD = "16 gigs"


def without_patterns(node: Any) -> Any:
    """A schema as before the quantity rule: no ``pattern`` and no ``minimum`` on int-or-string quantities."""
    if isinstance(node, dict):
        drop = {"pattern"} | ({"minimum"} if node.get("x-kubernetes-int-or-string") else set())
        return {k: without_patterns(v) for k, v in node.items() if k not in drop}
    if isinstance(node, list):
        return [without_patterns(v) for v in node]
    return node


def cache_body(namespace: str, tmpfs: str) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "coder-cache", "namespace": namespace},
            "spec": {"source": "HF://org/coder",
                     "flashLoader": {"enabled": True, "concurrency": 7, "tmpfsSizeLimit": tmpfs}}}


def server_accepts(testbed: KubeTestbed, body: dict[str, Any]) -> bool:
    """Does the API server accept ``body`` (server-side dry run: validated, not stored)?"""
    done = testbed.kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", input=json.dumps(body), check=False)
    return done.returncode == 0


async def use_crds(testbed: KubeTestbed, docs: list[dict[str, Any]], probe: dict[str, Any], accepted: bool) -> None:
    """Apply ``docs`` and wait until the server's verdict on ``probe`` is ``accepted`` (schemas load async)."""
    testbed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))

    async def settled() -> bool:
        return await asyncio.to_thread(server_accepts, testbed, probe) is accepted
    await poll_until(settled, 30.0, f"CRD schema in effect (accepts {BAD!r}: {accepted})")


async def flash_loader(c: Cluster, name: str) -> dict[str, Any] | None:
    deployment = await c.deployment(name)
    init = (deployment or {}).get("spec", {}).get("template", {}).get("spec", {}).get("initContainers") or []
    return next((x for x in init if x["name"] == "flash-loader"), None)


async def test_stored_unparsable_quantities_are_ignored_field_by_field(kube_testbed: KubeTestbed) -> None:
    current = crd_documents()
    async with cluster(kube_testbed) as c:
        probe = cache_body(c.namespace, BAD)
        await use_crds(kube_testbed, [without_patterns(copy.deepcopy(d)) for d in current], probe, accepted=True)
        try:
            await c.client.create(ModelCacheResource.from_dict(cache_body(c.namespace, BAD)))
            await c.create_model("coder", source="HF://org/coder", cache={"strategy": "Local"})
            await c.create_model("sized", source="HF://org/sized",
                                 cache={"strategy": "Local", "flashLoader": {"enabled": True, "tmpfsSizeLimit": BAD}})
        finally:
            await use_crds(kube_testbed, current, probe, accepted=False)

        with pytest.raises(ApiError) as rejected:  # new objects: the schema says no, naming the field
            await c.client.create(ModelCacheResource.from_dict({**cache_body(c.namespace, BAD),
                                                                "metadata": {"name": "new", "namespace": c.namespace}}))
        assert rejected.value.status.code == 422 and "tmpfsSizeLimit" in str(rejected.value.status.message)

        running = await start_manager(manager_config(c))
        try:
            loader = await c.wait_for(lambda: flash_loader(c, "coder"), what="coder's flash-loader")
            env = {e["name"]: e.get("value") for e in loader.get("env", [])}
            assert env.get("FLASH_CONCURRENCY") == "7", loader  # the cache's other fields survived
            status = await c.phase_is("coder", "Idle")
            condition = next(x for x in status["conditions"] if x["type"] == "ConfigValid")
            assert (condition["status"], condition["reason"]) == ("False", "InvalidFieldIgnored")
            assert "ModelCache coder-cache spec.flashLoader.tmpfsSizeLimit" in condition["message"]

            # The Model with the bad field itself is rendered and runs (it used to go Failed). This API server
            # (1.20, no validation ratcheting) re-validates the whole object on a status write, so it cannot get
            # a status until the field is fixed; the Warning event says so.
            assert await c.wait_for(lambda: flash_loader(c, "sized"), what="sized's flash-loader")
            assert (await c.status("sized")).get("phase") != "Failed"

            async def warnings(name: str) -> list[Any]:
                return [e for e in await c.events(name) if e["reason"] == "InvalidFieldIgnored"]
            for name in ("coder-cache", "coder", "sized"):
                events = await c.wait_for(lambda n=name: warnings(n), what=f"InvalidFieldIgnored event on {name}")
                assert events[0]["type"] == "Warning" and "tmpfsSizeLimit" in events[0]["message"]
            cache_events = await warnings("coder-cache")
            assert cache_events[0]["involvedObject"]["kind"] == "ModelCache"
            sized_events = await warnings("sized")
            assert f"spec.cache.flashLoader.tmpfsSizeLimit: invalid quantity '{BAD}'" in sized_events[0]["message"]
            assert "refuses status updates" in sized_events[0]["message"]
        finally:
            await running.close()
