"""A group pod's container on loopback, for the group-pod integration tests (no kubelet runs in the testbed).

``StandIn.start(c, tmp_path)`` does what the group Deployment's ReplicaSet and the kubelet would: it reads the
objects the manager rendered (the Deployment's container command and literal environment, the ConfigMap's
manifests, the admin token from the Secret, which must exist before any pod does: the kubelet resolves the
container's ``secretKeyRef`` when it starts it), runs ``flexinfer serve`` with that command's own arguments (``-f``
pointing at a copy of the manifests, ``--host``/``--port`` left to the test: loopback and a free port), then
writes the pod object (a new name and uid each time, ``podIP`` 127.0.0.1, its ``http`` port the one ``serve``
listens on, phase ``Running``). ``kill()`` SIGKILLs ``serve`` and every process under it at once, as a
container's end does; ``delete_pod()`` removes the pod object; ``stop()`` ends a ``serve`` still running.
Also: a group member's spec, the pod's admin status and a chat request.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import glob
import os
import signal
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from lightkube import ApiError
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import ConfigMap, Pod, Secret, ServiceAccount
from lightkube.types import PatchType

from support.llama_server import TINY_ARGS
from support.local_serve import ServeProcess, serve_env
from support.manager_harness import Cluster

Body = dict[str, Any]
IMAGE = "ghcr.io/example/flexinfer-llamacpp:1"
LOCAL_ENV = frozenset({"FLEXINFER_STATE_DIR", "FLEXINFER_SHM_ROOT", "FLEXINFER_ADMIN_TOKEN"})
"""Variables the stand-in sets itself: paths on this machine, and the token (a ``secretKeyRef`` in the pod)."""


def group_object_name(group: str) -> str:
    """The group pod's Deployment, Service and ConfigMap name for ``group`` (short test groups only)."""
    return f"flexinfer-group-{group}"


def member(group: str, weights: Path, image: str = IMAGE, **extra: Any) -> Body:
    """A tiny llama.cpp member of ``group`` (``extra`` overrides spec fields)."""
    return {"backend": "llamacpp", "source": weights.resolve().as_uri(), "image": image,
            "gpu": {"shared": group}, "config": {"args": TINY_ARGS},
            "serverless": {"idleTimeout": "2s"}, **extra}


def serve_arguments(command: Sequence[str], manifests: Path) -> list[str]:
    """The container's ``flexinfer serve`` arguments minus ``-f``, ``--host`` and ``--port`` (the stand-in
    gives its own), checked to be a ``serve`` command over the rendered manifests."""
    assert list(command[:2]) == ["flexinfer", "serve"], command
    rest, kept = list(command[2:]), []
    while rest:
        arg = rest.pop(0)
        if arg in ("-f", "--host", "--port"):
            value = rest.pop(0)
            assert arg != "-f" or value.endswith(manifests.name), (value, manifests)
            continue
        kept.append(arg)
    return kept


async def admin(url: str, token: str | None, path: str = "/admin/status") -> tuple[int, Body]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.get(f"{url}{path}", headers=headers) as reply:
        return reply.status, await reply.json()


async def chat(url: str, model: str, max_tokens: int = 4) -> Body:
    """A chat completion that must answer 200 with choices; returns the body."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "temperature": 0}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/chat/completions", json=body) as reply:
        assert reply.status == 200, await reply.text()
        answer: Body = await reply.json()
    assert answer["choices"]
    return answer


@dataclass
class Running:
    """One run of the stand-in: its ``serve``, URL, token and pod object."""

    serve: ServeProcess
    url: str
    token: str
    pod: str
    args: list[str]


class StandIn:
    """See the module docstring."""

    def __init__(self, group: str) -> None:
        self.name = group_object_name(group)
        self.runs: list[Running] = []

    @property
    def current(self) -> Running:
        assert self.runs, "the stand-in never started"
        return self.runs[-1]

    async def start(self, c: Cluster, tmp_path: Path, phase: str = "Running") -> Running:
        """``serve`` as the Deployment's container runs it, then the pod object that says so (``phase``
        ``Pending``: as the kubelet reports it once the sandbox has its address, before its relist sees the
        container started)."""
        deployment = (await c.client.get(Deployment, self.name, namespace=c.namespace)).to_dict()
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        configmap = (await c.client.get(ConfigMap, self.name, namespace=c.namespace)).to_dict()
        secret = (await c.client.get(Secret, f"{self.name}-admin", namespace=c.namespace)).to_dict()
        token = base64.b64decode(secret["data"]["token"]).decode()
        run = len(self.runs)
        manifests = tmp_path / f"pod-{run}" / "models.yaml"
        manifests.parent.mkdir(parents=True, exist_ok=True)
        manifests.write_text(configmap["data"]["models.yaml"])
        args = serve_arguments(container["command"], manifests)
        rendered = {e["name"]: e["value"] for e in container.get("env") or () if "value" in e}
        env = serve_env(tmp_path / f"pod-state-{run}",
                        **{k: v for k, v in rendered.items() if k not in LOCAL_ENV}, FLEXINFER_ADMIN_TOKEN=token)
        serve = await asyncio.to_thread(ServeProcess.start, manifests, env, 60.0, tuple(args))
        try:
            pod = await self._write_pod(c, deployment, int(serve.url.rsplit(":", 1)[1]), phase)
        except BaseException:
            serve.stop()
            raise
        self.runs.append(Running(serve, serve.url, token, pod, args))
        return self.runs[-1]

    async def _write_pod(self, c: Cluster, deployment: Body, port: int, phase: str) -> str:
        template = deployment["spec"]["template"]
        with_port = [{"name": "flexinfer", "image": template["spec"]["containers"][0]["image"],
                      "ports": [{"name": "http", "containerPort": port}]}]
        try:  # no service-account controller runs in the testbed; the admission plugin still wants the account
            await c.client.create(ServiceAccount.from_dict({"metadata": {"name": "default",
                                                                         "namespace": c.namespace}}))
        except ApiError as error:
            if error.status.code != 409:
                raise
        name = f"{self.name}-{uuid.uuid4().hex[:5]}-{uuid.uuid4().hex[:5]}"
        await c.client.create(Pod.from_dict({
            "metadata": {"name": name, "namespace": c.namespace, "labels": template["metadata"]["labels"]},
            "spec": {"automountServiceAccountToken": False, "containers": with_port}}))
        await c.client.patch(Pod.Status, name, {"status": {"phase": phase, "podIP": "127.0.0.1"}},
                             namespace=c.namespace, patch_type=PatchType.MERGE)
        return name

    async def delete_pod(self, c: Cluster) -> None:
        """The pod object goes (grace period 0: no kubelet is there to confirm)."""
        await c.client.delete(Pod, self.current.pod, namespace=c.namespace, grace_period=0)

    def kill(self) -> set[int]:
        """SIGKILL ``serve`` and everything under it at once (its model servers run in their own sessions);
        returns the pids killed under ``serve``."""
        serve = self.current.serve
        tree = descendants(serve.proc.pid)
        groups = {g for g in map(_group_of, tree) if g is not None and g != os.getpgrp()}
        serve.proc.kill()
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        serve.proc.wait(10)
        return tree

    def stop(self) -> None:
        """End every run's ``serve`` (SIGTERM, then SIGKILL after the harness's timeout)."""
        for run in self.runs:
            run.serve.stop()


def descendants(pid: int) -> set[int]:
    """Every live process under ``pid``, from ``/proc``."""
    found: set[int] = set()
    for listing in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(listing) as text:
                children = {int(child) for child in text.read().split()}
        except OSError:
            continue
        for child in children:
            found |= {child} | descendants(child)
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.fixture
async def pod(request: pytest.FixtureRequest) -> AsyncIterator[StandIn]:
    """The stand-in of the group pod of the requesting module's ``GROUP``, stopped after the test."""
    stand_in = StandIn(request.module.GROUP)
    try:
        yield stand_in
    finally:
        stand_in.stop()
