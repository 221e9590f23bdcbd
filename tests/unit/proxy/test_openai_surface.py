"""The OpenAI surface of the proxy under the official ``openai`` client: upstream errors relayed as OpenAI
errors without server internals, ``models.retrieve``, request ids, and the error bodies hostile input gets
(bounded, valid UTF-8, 405 for a wrong method)."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import replace

import openai
import pytest

from support.fake_openai import Script

MESSAGES = [{"role": "user", "content": "hi"}]
TRACEBACK_500 = b"""Internal Server Error
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/llama_cpp/server/app.py", line 412, in create_chat_completion
    result = await run_in_threadpool(llama.create_chat_completion, **kwargs)
  File "/opt/models/.venv/lib/python3.12/site-packages/starlette/concurrency.py", line 39, in run
    return await anyio.to_thread.run_sync(func)
RuntimeError: failed to decode batch from /opt/models/gemma/weights.gguf
"""


def _client(proxy) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)


def _script(status: int, body: bytes, content_type: str = "application/json") -> Script:
    return Script(status=status, error_body=body, error_content_type=content_type)


@pytest.mark.parametrize(("status", "body", "content_type", "exception", "message"), [
    (404, b'{"detail":"Not Found"}', "application/json", openai.NotFoundError,
     "model server answered 404: Not Found"),
    (404, b"Not Found", "text/plain", openai.NotFoundError, "model server answered 404: Not Found"),
    (422, b'{"detail":[{"loc":["body","messages"],"msg":"field required","type":"missing"}]}',
     "application/json", openai.UnprocessableEntityError, "model server answered 422: body.messages: field required"),
    (500, TRACEBACK_500, "text/plain", openai.InternalServerError,
     "model server answered 500: Internal Server Error RuntimeError: failed to decode batch from <path>"),
    (502, b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html", openai.APIStatusError,
     "model server answered 502: 502 Bad Gateway"),
])
async def test_upstream_errors_become_openai_errors_without_internals(make_proxy, fake, status, body, content_type,
                                                                      exception, message):
    fake.script = _script(status, body, content_type)
    proxy = await make_proxy()
    async with _client(proxy) as client:
        for call in (lambda: client.chat.completions.create(model="alpha", messages=MESSAGES),
                     lambda: client.chat.completions.create(model="alpha", messages=MESSAGES, stream=True),
                     lambda: client.embeddings.create(model="alpha", input="hi")):
            with pytest.raises(exception) as caught:
                await call()
            assert caught.value.status_code == status
            assert caught.value.body["message"] == message  # type: ignore[index]
            assert caught.value.body["code"] == "upstream_error"  # type: ignore[index]
            assert "/opt/" not in json.dumps(caught.value.body) and "File " not in json.dumps(caught.value.body)
    proxy.activator.assert_released_once()


LLAMA_VALIDATION_500 = json.dumps({"error": {
    "message": "1 validation error:\n  {'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input should be "
               "a valid dictionary or object to extract fields from', 'input': b'{\"prompt\": \"a secret\"}'}\n\n"
               "  File \"/srv/venv/llama_cpp/server/app.py\", line 376, in create_chat_completion",
    "type": "internal_server_error", "param": None, "code": None}}).encode()


async def test_a_model_servers_validation_500_reaches_the_client_as_a_400(make_proxy, fake):
    """What llama.cpp's Python server answers to a body sent as ``text/plain``: a 500 with FastAPI's
    validation text. The client made the mistake: a 400 with the problem, not the echoed body or file paths."""
    fake.script = _script(500, LLAMA_VALIDATION_500)
    proxy = await make_proxy()
    async with _client(proxy) as client:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="alpha", messages=MESSAGES, stream=stream)
            assert caught.value.body == {  # type: ignore[comparison-overlap]
                "message": "The model server rejected the request: body: Input should be a valid dictionary or "
                           "object to extract fields from",
                "type": "invalid_request_error", "param": None, "code": "invalid_request_error"}
    proxy.activator.assert_released_once()


@pytest.mark.parametrize(("extra", "param", "code"), [
    ({"max_tokens": "lots"}, "max_tokens", "invalid_type"), ({"max_tokens": -5}, "max_tokens", "invalid_value"),
    ({"temperature": "warm"}, "temperature", "invalid_type"), ({"stream": "yes"}, "stream", "invalid_type"),
])
async def test_wrong_parameters_are_400s_that_never_reach_the_model(make_proxy, fake, extra, param, code):
    proxy = await make_proxy()
    async with proxy.session.post(proxy.url + "/v1/chat/completions",
                                  json={"model": "alpha", "messages": MESSAGES, **extra}) as response:
        assert response.status == 400 and response.content_type == "application/json"
        error = (await response.json())["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert not fake.requests and proxy.activator.acquired == 0


async def test_max_tokens_minus_one_is_left_to_the_model_server(make_proxy, fake):
    """llama.cpp servers read -1 as "no limit": the proxy forwards it."""
    proxy = await make_proxy()
    async with _client(proxy) as client:
        await client.chat.completions.create(model="alpha", messages=MESSAGES, max_tokens=-1)
    assert fake.requests[-1].body["max_tokens"] == -1  # type: ignore[index]


async def test_upstream_openai_envelope_keeps_its_fields_but_is_sanitized(make_proxy, fake):
    error = {"message": "cannot open /srv/secret/weights.gguf", "type": "invalid_request_error",
             "param": "model", "code": "model_load_failed"}
    fake.script = _script(400, json.dumps({"error": error}).encode())
    proxy = await make_proxy()
    async with _client(proxy) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model="alpha", prompt="hi")
    assert caught.value.body == {"message": "cannot open <path>", "type": "invalid_request_error",
                                 "param": "model", "code": "model_load_failed"}


async def test_upstream_error_on_any_route_and_huge_bodies_are_bounded(make_proxy, fake):
    fake.script = _script(500, b"x" * (2 << 20), "text/plain")
    proxy = await make_proxy()
    async with proxy.session.post(proxy.url + "/v1/some/other/route", json={"model": "beta"}) as response:
        assert response.status == 500
        body = await response.json()
    assert body["error"]["message"].startswith("model server answered 500: xxx")
    assert len(body["error"]["message"]) <= 600


async def test_models_retrieve_returns_the_listed_entry(make_proxy):
    proxy = await make_proxy()
    coder = replace(proxy.catalog.views[1], name="coder", served_model_name="coder", aliases=())
    proxy.catalog.views += [replace(coder, namespace="team"), replace(coder, namespace="prod")]
    async with _client(proxy) as client:
        listed = {m.id: m for m in (await client.models.list()).data}
        alpha = await client.models.retrieve("alpha")
        by_alias = await client.models.retrieve("a")
        slashed = await client.models.retrieve("team/coder")
        for missing in ("nope", "sleepy"):  # parked models are hidden here too
            with pytest.raises(openai.NotFoundError) as caught:
                await client.models.retrieve(missing)
            assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert alpha.model_dump() == listed["alpha"].model_dump()
    assert by_alias.id == "alpha"
    assert slashed.id == "team/coder" and slashed.model_dump() == listed["team/coder"].model_dump()


async def test_models_retrieve_wrong_method_is_405(make_proxy):
    proxy = await make_proxy()
    async with proxy.session.delete(proxy.url + "/v1/models/alpha") as response:
        assert response.status == 405
        assert response.headers["Allow"] == "GET"
        assert (await response.json())["error"]["code"] == "method_not_allowed"


async def test_non_uuid_request_id_is_replaced_forwarded_and_logged(make_proxy, fake, caplog):
    proxy = await make_proxy()
    caplog.set_level(logging.INFO, "flexinfer.proxy")
    async with _client(proxy) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="alpha", messages=MESSAGES, extra_headers={"X-Request-ID": "abc"})
    used = raw.headers["X-Request-ID"]
    assert str(uuid.UUID(used)) == used
    assert fake.requests[-1].headers["X-Request-ID"] == used
    assert any("'abc'" in r.getMessage() and used in r.getMessage() for r in caplog.records)


async def test_uuid_request_id_is_kept_and_forwarded(make_proxy, fake):
    proxy = await make_proxy()
    rid = str(uuid.uuid4())
    async with _client(proxy) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="alpha", messages=MESSAGES, extra_headers={"X-Request-ID": rid})
    assert raw.headers["X-Request-ID"] == rid
    assert fake.requests[-1].headers["X-Request-ID"] == rid


async def test_missing_request_id_is_generated_and_forwarded(make_proxy, fake):
    proxy = await make_proxy()
    async with proxy.session.post(proxy.url + "/v1/chat/completions", json={"model": "alpha"}) as response:
        used = response.headers["X-Request-ID"]
    assert str(uuid.UUID(used)) == used and fake.requests[-1].headers["X-Request-ID"] == used


async def test_huge_model_name_is_not_echoed_whole(make_proxy):
    proxy = await make_proxy()
    async with _client(proxy) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(model="m" * (1 << 20), messages=MESSAGES)
    message = caught.value.body["message"]  # type: ignore[index]
    assert len(message) < 1200 and "more characters" in message


async def test_a_lone_surrogate_in_the_body_is_a_400_with_a_valid_utf8_message(make_proxy, fake):
    proxy = await make_proxy()
    body = b'{"model": "bad\\ud800name", "messages": []}'
    async with proxy.session.post(proxy.url + "/v1/chat/completions", data=body,
                                  headers={"Content-Type": "application/json"}) as response:
        assert response.status == 400
        raw = await response.read()
    error = json.loads(raw.decode("utf-8"))["error"]
    error["message"].encode("utf-8")  # a lone surrogate would raise UnicodeEncodeError here
    assert error["code"] == "invalid_unicode" and "\\ud800" in error["message"]
    assert not fake.requests and proxy.activator.acquired == 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
async def test_get_on_a_post_route_is_405_with_allow(make_proxy, path):
    proxy = await make_proxy()
    async with proxy.session.get(proxy.url + path) as response:
        assert response.status == 405
        assert response.headers["Allow"] == "POST"
        body = await response.json()
    assert body["error"]["code"] == "method_not_allowed" and body["error"]["type"] == "invalid_request_error"
    assert proxy.activator.acquired == 0
