"""Client mistakes and failed streams through a real ``flexinfer serve`` in front of a real llama.cpp model
server (a tiny generated model), as issue 23 found them: every answer is an OpenAI error a client can act on,
never a 500 for the client's own mistake and never an empty 200 stream.

Most cases run llama-cpp-python's server, chosen explicitly (``spec.config.llamacppServer: python``): it
answers a stream it cannot serve (a prompt over the context window, a lone surrogate) with ``200
text/event-stream`` and no event at all; the proxy turns that into an SSE error event (or a 502 when nothing
was sent yet). Its 500s carrying FastAPI validation text become 400s; the proxy's own checks answer wrong
parameter types, negative counts and lone surrogates before the model sees them. llama.cpp's own
``llama-server`` (the default) refuses the same overflowing stream with a 400 before any event, which the
client gets as it is."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import openai
import pytest

from support.llama_server import PYTHON_SERVER, TINY_ARGS, needs_llama_server, needs_python_server
from support.local_serve import ServeProcess, model_manifest, serve_env, write_manifests
from support.raw_http import raw_exchange

pytestmark = pytest.mark.integration
MESSAGES = [{"role": "user", "content": "hi"}]
OVERFLOW = [{"role": "user", "content": "hello world " * 400}]  # ~4,800 tokens for a 512-token context


@contextlib.contextmanager
def _serve(tmp_path: Path, config: dict[str, Any] = PYTHON_SERVER) -> Iterator[ServeProcess]:
    """``serve`` with one llama.cpp model, ``tiny`` (512-token context; llama-cpp-python's server unless
    ``config`` says otherwise); its log must hold no traceback."""
    from support.tiny_gguf import write_tiny_gguf

    weights = write_tiny_gguf(tmp_path / "tiny" / "model.gguf", seed=0)
    doc = model_manifest("tiny", weights, config=config)
    process = ServeProcess.start(write_manifests(tmp_path / "m" / "m.yaml", [doc]).parent,
                                 serve_env(tmp_path / "state"))
    try:
        yield process
    finally:
        process.stop()
    assert "Traceback" not in process.log, process.log


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Message, str]:
    """Status, headers and the whole body text of a POST (error statuses included)."""
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers, error.read().decode()


def _events(body: str) -> list[str]:
    return [block.removeprefix("data: ") for block in body.split("\n\n") if block.startswith("data: ")]


@needs_python_server
def test_a_stream_the_model_server_fails_ends_with_an_error_event(tmp_path: Path) -> None:
    """The first request finds the model cold: the proxy's 200 and loading comments go out before the model
    server fails the stream after its own 200; the client must still learn that it failed. Once the model is
    Ready, the official client gets an error too (a 502 when the empty stream arrived whole, an SSE error
    event when its head came first)."""
    body = {"model": "tiny", "messages": OVERFLOW, "max_tokens": 4, "stream": True}
    with _serve(tmp_path) as serve:
        status, headers, text = _post(serve.url + "/v1/chat/completions", json.dumps(body).encode())
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        assert text.startswith(": loading tiny")
        events = _events(text)
        assert len(events) == 1 and "data: [DONE]" not in text, text
        error = json.loads(events[0])["error"]
        assert error["code"] == "bad_gateway" and "without sending any event" in error["message"], error

        client = openai.OpenAI(base_url=serve.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        for _ in range(3):
            with pytest.raises(openai.APIError) as caught:
                for _chunk in client.chat.completions.create(model="tiny", messages=OVERFLOW, max_tokens=4,
                                                             stream=True):
                    pass
            assert "without sending any event" in caught.value.body["message"]  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as refused:  # the same request unstreamed: the server's 400
            client.chat.completions.create(model="tiny", messages=OVERFLOW, max_tokens=4)
        assert refused.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
        assert client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2).choices


CHAT_BODY = b'{"model":"tiny","messages":[{"role":"user","content":"%s"}]%s}'
MISTAKES = {  # what the client sent → (extra headers, the error's param, words of its message)
    "max_tokens -5": (CHAT_BODY % (b"hi", b',"max_tokens":-5'), {}, "max_tokens", "expected a positive integer"),
    "max_tokens lots": (CHAT_BODY % (b"hi", b',"max_tokens":"lots"'), {}, "max_tokens",
                        "expected an integer, but got a string"),
    "lone surrogate": (CHAT_BODY % (b"a\\ud800b", b""), {}, None, "lone UTF-16 surrogate"),
    "lone surrogate streamed": (CHAT_BODY % (b"a\\ud800b", b',"stream":true'), {}, None, "lone UTF-16 surrogate"),
    "text/plain": (CHAT_BODY % (b"hi", b',"max_tokens":2'), {"Content-Type": "text/plain"}, None,
                   "model server rejected the request: body: Input should be a valid"),
    "a type only the model server checks": (CHAT_BODY % (b"hi", b',"max_tokens":2,"top_k":"many"'), {}, "top_k",
                                            "model server rejected the request: top_k: Input should be a valid"),
}
UNPARSEABLE = {  # raw bytes → the status
    "HTTP/0.9": (b"GET /v1/models\r\n", 400),
    "HTTP/0.9 with a blank line": (b"GET /v1/models\r\n\r\n", 400),
    "HTTP/9.9": (b"GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n", 400),
    "garbage": (b"BREW /pot HTCPCP\r\n\r\n", 400),
    "NUL in a header": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400),
    "1 MB header": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * (1 << 20) + b"\r\n\r\n", 431),
    "5,000 headers": (b"GET /v1/models HTTP/1.1\r\n" + b"X-A: b\r\n" * 5000 + b"\r\n", 431),
    "both lengths": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n{}", 400),
    "negative length": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400),
}


@needs_llama_server
def test_llama_server_refuses_an_overflowing_stream_with_a_400(tmp_path: Path) -> None:
    with _serve(tmp_path, {"args": TINY_ARGS}) as serve:
        client = openai.OpenAI(base_url=serve.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2).choices  # Ready
        for stream in (True, False):
            with pytest.raises(openai.BadRequestError) as refused:  # a streamed one: before any chunk
                list(client.chat.completions.create(model="tiny", messages=OVERFLOW, max_tokens=4, stream=True)
                     ) if stream else client.chat.completions.create(model="tiny", messages=OVERFLOW, max_tokens=4)
            assert "exceeds the available context size" in refused.value.body["message"]  # type: ignore[index]


@needs_python_server
def test_client_mistakes_are_openai_400s_with_a_clean_message(tmp_path: Path) -> None:
    with _serve(tmp_path) as serve:
        for case, (body, headers, param, words) in MISTAKES.items():
            status, answer_headers, text = _post(serve.url + "/v1/chat/completions", body, headers)
            assert status == 400, (case, text)
            assert answer_headers["Content-Type"].startswith("application/json"), case
            error = json.loads(text)["error"]
            assert (error["type"], error["param"]) == ("invalid_request_error", param), (case, error)
            assert words in error["message"], (case, error)
            assert "File " not in error["message"] and "'input'" not in error["message"], (case, error)
            assert len(error["message"]) <= 300, (case, error)
        for case, (raw, expected) in UNPARSEABLE.items():
            head, _, answer = raw_exchange(serve.url, raw).partition(b"\r\n\r\n")
            assert int(head.split(b" ", 2)[1]) == expected, (case, head)
            assert b"content-type: application/json" in head.lower(), (case, head)
            assert json.loads(answer)["error"]["type"] == "invalid_request_error", case
    assert serve.log.count("rejected a malformed request") == len(UNPARSEABLE)
