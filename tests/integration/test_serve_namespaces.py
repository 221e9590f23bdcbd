"""``flexinfer serve`` with the same model name in two namespaces (``default/chat``, ``team-b/chat``).

A real ``flexinfer serve`` child with two fake OpenAI servers (each recording what it receives), driven
through the official ``openai`` client: ``namespace/name`` reaches exactly that model in every form a client
can name it (body, ``X-Model-ID``, ``/model/<namespace>/<name>/…``), the bare name is a 409 naming both
candidates, ``/v1/models`` lists both distinguishably, and the proxy metrics keep them apart.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from support.local_serve import ServeProcess, fake_server_command, model_manifest, serve_env, write_manifests

pytestmark = pytest.mark.integration
NAMESPACES = ("default", "team-b")


def recorded(path: Path) -> list[dict[str, Any]]:
    """The API requests one fake server received (one JSON line each)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def two_chats(tmp_path: Path) -> Iterator[tuple[ServeProcess, dict[str, Path]]]:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    records = {ns: tmp_path / f"{ns}.jsonl" for ns in NAMESPACES}
    docs = []
    for ns in NAMESPACES:
        doc = model_manifest("chat", weights, None, {"command": fake_server_command("--record", str(records[ns]))})
        doc["metadata"]["namespace"] = ns
        docs.append(doc)
    manifests = write_manifests(tmp_path / "models" / "chat.yaml", docs)
    serve = ServeProcess.start(manifests.parent, serve_env(tmp_path / "state"))
    try:
        yield serve, records
    finally:
        serve.stop()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def ask(api: openai.OpenAI, model: str, **extra: Any) -> str:
    reply = api.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], **extra)
    return reply.choices[0].message.content or ""


def test_each_key_reaches_its_own_model_and_the_bare_name_is_a_409(
        two_chats: tuple[ServeProcess, dict[str, Path]]) -> None:
    serve, records = two_chats
    api = client(serve.url + "/v1")
    with pytest.raises(openai.ConflictError) as ambiguous:
        ask(api, "chat")
    body = ambiguous.value.body
    assert isinstance(body, dict) and body["code"] == "model_ambiguous" and body["param"] == "model"
    assert "'default/chat', 'team-b/chat'" in body["message"]
    assert records["default"].exists() is False and records["team-b"].exists() is False, "nothing activated"

    assert ask(api, "team-b/chat").startswith("tok0")
    assert [r["body"]["model"] for r in recorded(records["team-b"])] == ["chat"]  # the served name upstream
    assert recorded(records["default"]) == []
    assert ask(api, "default/chat").startswith("tok0")
    assert len(recorded(records["default"])) == 1

    ask(api, "anything", extra_headers={"X-Model-ID": "team-b/chat"})
    ask(client(serve.url + "/model/team-b/chat/v1"), "anything")
    team_b = recorded(records["team-b"])
    assert len(team_b) == 3 and {r["path"] for r in team_b} == {"/v1/chat/completions"}
    assert len(recorded(records["default"])) == 1

    listed = {m.id: m for m in api.models.list()}
    assert sorted(listed) == ["default/chat", "team-b/chat"]
    assert listed["team-b/chat"].model_extra["metadata"]["namespace"] == "team-b"  # type: ignore[index]

    with urllib.request.urlopen(serve.url + "/metrics", timeout=30) as page:
        metrics = page.read().decode()
    assert 'flexinfer_proxy_requests_total{model="chat",namespace="team-b",status="success"} 3.0' in metrics
    assert 'flexinfer_proxy_requests_total{model="chat",namespace="default",status="success"} 1.0' in metrics
    assert 'flexinfer_proxy_requests_total{model="",namespace="",status="error"} 1.0' in metrics


def test_the_admin_api_takes_keys_and_refuses_the_ambiguous_name(
        two_chats: tuple[ServeProcess, dict[str, Path]]) -> None:
    serve, _ = two_chats
    with pytest.raises(urllib.error.HTTPError) as ambiguous:
        urllib.request.urlopen(urllib.request.Request(serve.url + "/admin/models/chat/load", method="POST"),
                               timeout=30)
    assert ambiguous.value.code == 409
    assert json.loads(ambiguous.value.read())["error"]["code"] == "model_ambiguous"
    load = urllib.request.Request(serve.url + "/admin/models/team-b/chat/load?wait=true", method="POST")
    with urllib.request.urlopen(load, timeout=60) as answer:
        assert json.loads(answer.read()) == {"model": "team-b/chat", "phase": "Ready"}
    with urllib.request.urlopen(serve.url + "/admin/status", timeout=30) as status:
        phases = {m["key"]: m["phase"] for m in json.loads(status.read())["models"]}
    assert phases == {"default/chat": "Idle", "team-b/chat": "Ready"}
