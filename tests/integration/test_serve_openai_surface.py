"""The OpenAI surface of a real ``flexinfer serve`` process, driven by the official ``openai`` client and raw
sockets: ``models.retrieve``, request ids forwarded to the model server, a model server's traceback-laden 500
relayed without internals, and malformed HTTP answered 400 with one log line (no traceback on stderr)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest

from support.llama_server import PYTHON_SERVER, TINY_ARGS, needs_llama_server, needs_python_server
from support.local_serve import ServeProcess, fake_server_command, model_manifest, serve_env, write_manifests
from support.raw_http import raw_exchange

pytestmark = pytest.mark.integration
TRACEBACK = b"""Traceback (most recent call last):
  File "/srv/llm/app/server.py", line 88, in chat
    raise RuntimeError("kv cache exhausted in /srv/llm/app/cache.py")
RuntimeError: kv cache exhausted in /srv/llm/app/cache.py
"""


def test_openai_surface_of_a_running_serve(tmp_path: Path) -> None:
    record, body_file = tmp_path / "requests.jsonl", tmp_path / "traceback.txt"
    body_file.write_bytes(TRACEBACK)
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"x")
    good = model_manifest("good", weights, config={"command": fake_server_command("--record", str(record))})
    broken = model_manifest("broken", weights, config={"command": fake_server_command(
        "--status", "500", "--error-body-file", str(body_file))})
    manifests = write_manifests(tmp_path / "models" / "m.yaml", [good, broken])
    serve = ServeProcess.start(manifests.parent, serve_env(tmp_path / "state"))
    try:
        client = openai.OpenAI(base_url=serve.url + "/v1", api_key="unused", max_retries=0)
        assert client.models.retrieve("good").id == "good"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("missing")

        raw = client.chat.completions.with_raw_response.create(
            model="good", messages=[{"role": "user", "content": "hi"}], extra_headers={"X-Request-ID": "abc"})
        used = raw.headers["X-Request-ID"]
        assert str(uuid.UUID(used)) == used
        forwarded = json.loads(record.read_text().splitlines()[-1])["headers"]["x-request-id"]
        assert forwarded == used

        for stream in (False, True):  # the second finds the model Ready: the error comes before the first byte
            with pytest.raises(openai.InternalServerError) as caught:
                client.chat.completions.create(model="broken", messages=[{"role": "user", "content": "hi"}],
                                               stream=stream)
            assert caught.value.body["message"] == (  # type: ignore[index]
                "model server answered 500: RuntimeError: kv cache exhausted in <path>")

        answer = raw_exchange(serve.url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n"
                                 b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}")
        assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
    finally:
        serve.stop()
    assert "Traceback" not in serve.log, serve.log
    assert serve.log.count("rejected a malformed request") == 1


@pytest.mark.parametrize(("config", "not_found"), [
    pytest.param({"args": TINY_ARGS}, "File Not Found", marks=needs_llama_server, id="llama-server"),
    pytest.param(PYTHON_SERVER, "model server answered 404", marks=needs_python_server, id="python"),
])
def test_llama_cpp_model_accepts_any_client_request_id_and_unknown_model_routes(
        tmp_path: Path, config: dict[str, Any], not_found: str) -> None:
    """llama.cpp's Python server answers 400 with an empty body to a non-UUID request id, and 404 with
    FastAPI's ``{"detail": ...}`` to an unknown path; ``llama-server`` answers 404 with its own error body:
    through the proxy all of them are fine for the official client."""
    from support.tiny_gguf import write_tiny_gguf

    weights = write_tiny_gguf(tmp_path / "tiny" / "model.gguf", seed=0)
    doc = model_manifest("tiny", weights, config=config)
    serve = ServeProcess.start(write_manifests(tmp_path / "m" / "m.yaml", [doc]).parent,
                               serve_env(tmp_path / "state"))
    try:
        client = openai.OpenAI(base_url=serve.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        for rid in ("abc", "", "x" * 300, str(uuid.uuid4())):
            raw = client.chat.completions.with_raw_response.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                extra_headers={"X-Request-ID": rid})
            assert raw.parse().choices[0].finish_reason is not None
            used = raw.headers["X-Request-ID"]
            assert used == rid if rid.count("-") == 4 else str(uuid.UUID(used)) == used
        with pytest.raises(openai.NotFoundError) as caught:
            client.post("/nothing/here", cast_to=object, body={"model": "tiny"})
        assert caught.value.body["message"].startswith(not_found)  # type: ignore[index]
    finally:
        serve.stop()
    assert "Traceback" not in serve.log
