"""Group-pod mode (issue #28): one request through the in-cluster proxy into the group pod is one trace.

The real in-cluster proxy (``start_proxy``) in front, the manager in-process against the real kube-apiserver
testbed, and a real ``flexinfer serve`` started with the group Deployment's own command and literal environment
standing in for the group pod's container (``support.group_pod.StandIn``); its member is the scripted fake model
server, which records the headers it receives. Proxy and pod export to one real OTLP/HTTP receiver.

The manager's tracing variables reach the pod through the manager's own configuration (``GROUP_POD_ENV`` →
``ManagerPolicy.group_pod_env`` → the group Deployment's container env); the test adds a short batch delay so the
pod exports while it runs. Then: the proxy's request span and the pod's spans share one trace id, the pod's
request span is the child of the proxy's ``proxy.upstream`` client span, and the member's server received a
``traceparent`` in that trace whose parent is the pod's own ``proxy.upstream`` span. The member's start inside the
pod is a ``model.activation`` trace of the pod's with its stages (the proxy alone cannot break it down).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.apps_v1 import Deployment

from flexinfer.assembly.proxy import start_proxy
from flexinfer.manager.config import manager_config as manager_config_from_env
from support.group_pod import StandIn, chat, group_object_name, member, pod
from support.kube_testbed import KubeTestbed
from support.local_serve import fake_server_command
from support.manager_harness import TEST_POLICY, cluster, kube_testbed, manager_config, start_manager
from support.otlp_receiver import OTLPReceiver, ReceivedSpan
from support.polling import eventually

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed", "pod"]
GROUP = "traced"
NAME = group_object_name(GROUP)
SERVER, CLIENT = 2, 3
NAMESPACE_ATTRIBUTE = "group-pod-test"
"""``FLEXINFER_OTEL_SERVICE_NAMESPACE`` of the manager, handed on to the pod: its spans must carry it."""
PROXY_SERVICE, POD_SERVICE = "flexinfer-proxy", "flexinfer"
"""``service.name`` of the in-cluster proxy's spans and of the group pod's ``serve`` (the manager's own
``OTEL_SERVICE_NAME`` is not handed on)."""


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as running:
        yield running


def tracing_env(receiver: OTLPReceiver) -> dict[str, str]:
    return {"FLEXINFER_OTEL_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "FLEXINFER_OTEL_SERVICE_NAMESPACE": NAMESPACE_ATTRIBUTE}


def handed_on(receiver: OTLPReceiver) -> tuple[tuple[str, str], ...]:
    """What a manager with tracing on hands its group pods, from its configuration as ``flexinfer manager``
    reads it; plus a 50 ms batch delay (not a variable the manager hands on) so the pod exports at once."""
    env = {**tracing_env(receiver), "OTEL_SERVICE_NAME": "flexinfer-manager", "FLEXINFER_GROUP_STRATEGIES":
           f"{GROUP}=TimeSliced"}
    return (*manager_config_from_env(env).policy.group_pod_env, ("OTEL_BSP_SCHEDULE_DELAY", "50"))


def fake_member(tmp_path: Path, name: str, record: Path) -> dict[str, Any]:
    weights = tmp_path / name / "weights.bin"
    weights.parent.mkdir(parents=True, exist_ok=True)
    weights.write_bytes(b"w")
    command = fake_server_command("--model-name", name, "--record", str(record))
    return member(GROUP, weights, config={"command": command}, gpu={"shared": GROUP, "vramEstimateMB": 100},
                  serverless={"idleTimeout": "60s"})


def member_requests(record: Path) -> list[dict[str, Any]]:
    """The requests the fake member's server received (``--record``), with their headers."""
    return [json.loads(line) for line in record.read_text().splitlines()]


def one(spans: list[ReceivedSpan], what: str) -> ReceivedSpan:
    assert len(spans) == 1, (what, [(s.name, s.resource.get("service.name")) for s in spans])
    return spans[0]


@pytest.mark.timeout(180)
async def test_a_request_through_the_proxy_into_the_group_pod_is_one_trace(
        kube_testbed: KubeTestbed, tmp_path: Path, pod: StandIn, receiver: OTLPReceiver) -> None:
    record = tmp_path / "member-requests.jsonl"
    policy = replace(TEST_POLICY, group_strategies=((GROUP, "TimeSliced"),), group_pod_env=handed_on(receiver))
    async with cluster(kube_testbed) as c:
        manager = await start_manager(manager_config(c, policy=policy))
        proxy = await start_proxy(host="127.0.0.1", port=0, env={
            "POD_NAMESPACE": c.namespace, "POD_NAME": "proxy-0", "PROXY_SHUTDOWN_DRAIN_DELAY": "0",
            "PROXY_COLD_START_TIMEOUT": "60s", "KUBECONFIG": str(c.kubeconfig), "OTEL_BSP_SCHEDULE_DELAY": "50",
            **tracing_env(receiver)})
        try:
            await c.create_model("a", **fake_member(tmp_path, "a", record))
            await c.demand("a")
            await c.replicas_are(NAME, 1)
            deployment = (await c.client.get(Deployment, NAME, namespace=c.namespace)).to_dict()
            container = deployment["spec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert {k: env.get(k) for k in tracing_env(receiver)} == tracing_env(receiver)
            assert "OTEL_SERVICE_NAME" not in env
            run = await pod.start(c, tmp_path)

            async def linked() -> bool:
                return bool((await c.status("a")).get("sharedGroup", {}).get("groupEndpoint") == run.url)
            await c.wait_for(linked, 20, f"a forwarded to {run.url}")
            assert (await chat(proxy.url, "a"))["model"] == "a"

            def request_spans(service: str) -> list[ReceivedSpan]:
                return [s for s in receiver.spans() if s.name == "proxy.handle_request"
                        and s.attributes.get("url.path") == "/v1/chat/completions"
                        and s.resource.get("service.name") == service]
            await eventually(lambda: bool(request_spans(PROXY_SERVICE) and request_spans(POD_SERVICE)), 15)
            front = one(request_spans(PROXY_SERVICE), "the proxy's request span")
            trace = [s for s in receiver.spans() if s.trace_id == front.trace_id]
            forward = one([s for s in trace if s.name == "proxy.upstream" and s.parent_span_id == front.span_id],
                          "the proxy's upstream span")
            inside = one(request_spans(POD_SERVICE), "the pod's request span")
            assert (front.kind, forward.kind, inside.kind) == (SERVER, CLIENT, SERVER)
            assert forward.resource["service.name"] == PROXY_SERVICE
            assert forward.attributes["url.full"].startswith(run.url), forward.attributes
            assert (inside.trace_id, inside.parent_span_id) == (front.trace_id, forward.span_id)
            assert inside.resource["service.namespace"] == NAMESPACE_ATTRIBUTE

            await eventually(lambda: any(s.name == "proxy.upstream" and s.parent_span_id == inside.span_id
                                         for s in receiver.spans()), 15)
            call = one([s for s in receiver.spans() if s.parent_span_id == inside.span_id
                        and s.name == "proxy.upstream"], "the pod's upstream span")
            assert (call.trace_id, call.kind, call.resource["service.name"]) == (front.trace_id, CLIENT, POD_SERVICE)
            [served] = [r for r in member_requests(record) if r["path"] == "/v1/chat/completions"]
            _, trace_id, parent_id, _ = served["headers"]["traceparent"].split("-")
            assert (trace_id, parent_id) == (front.trace_id, call.span_id)

            def activations() -> list[ReceivedSpan]:
                return [s for s in receiver.spans() if s.name == "model.activation"
                        and s.resource.get("service.name") == POD_SERVICE]
            await eventually(lambda: bool(activations()), 15)
            started = one(activations(), "the member's start in the pod")
            facts = {k: started.attributes[f"flexinfer.{k}"] for k in ("model", "namespace", "outcome")}
            assert facts == {"model": "a", "namespace": c.namespace, "outcome": "ready"}
            stages = {s.name for s in receiver.spans() if s.parent_span_id == started.span_id}
            assert {"activation.server_start", "activation.health"} <= stages, stages
        finally:
            await proxy.close()
            assert await manager.close() == 0
