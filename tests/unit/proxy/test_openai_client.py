"""The official ``openai`` Python client works through the proxy: plain, streaming, streaming with loading
comments (ignored by its SSE parser), and an activation failure reported as a stream error."""

from __future__ import annotations

import asyncio

import openai
import pytest

from flexinfer.core.errors import ModelFailedError
from flexinfer.proxy import admission
from flexinfer.proxy.streaming import loading_comment

MESSAGES = [{"role": "user", "content": "hi"}]


def _client(proxy) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)


async def test_plain_chat_completion(make_proxy, fake):
    proxy = await make_proxy()
    async with _client(proxy) as client:
        reply = await client.chat.completions.create(model="alpha", messages=MESSAGES)
    assert reply.choices[0].message.content == "tok0 tok1 tok2 tok3 "
    assert fake.requests[-1].body["model"] == "alpha-served"


async def test_streaming_chat_completion(make_proxy):
    proxy = await make_proxy()
    async with _client(proxy) as client:
        stream = await client.chat.completions.create(model="a", messages=MESSAGES, stream=True)
        pieces = [chunk.choices[0].delta.content async for chunk in stream]
    assert "".join(pieces) == "tok0 tok1 tok2 tok3 "


async def test_streaming_with_loading_comments_parses(make_proxy, monkeypatch):
    proxy = await make_proxy()
    gate = proxy.activator.gates["beta"] = asyncio.Event()
    comments: list[bytes] = []

    def counted(model: str, elapsed: float) -> bytes:
        comments.append(loading_comment(model, elapsed))
        if len(comments) == 3:
            gate.set()
        return comments[-1]

    monkeypatch.setattr(admission, "loading_comment", counted)
    async with _client(proxy) as client:
        task = asyncio.ensure_future(client.completions.create(model="beta", prompt="hi", stream=True))
        stream = await task
        pieces = [chunk.choices[0].text async for chunk in stream]
    assert "".join(pieces) == "tok0 tok1 tok2 tok3 "


async def test_activation_failure_mid_wait_raises_api_error(make_proxy):
    proxy = await make_proxy()
    gate = proxy.activator.gates["alpha"] = asyncio.Event()
    proxy.activator.errors["alpha"] = ModelFailedError("Failed to activate model: out of memory")
    async with _client(proxy) as client:
        task = asyncio.ensure_future(client.chat.completions.create(model="alpha", messages=MESSAGES, stream=True))
        await asyncio.wait_for(proxy.activator.waiting.wait(), 5)
        gate.set()
        stream = await task
        with pytest.raises(openai.APIError, match="out of memory"):
            async for _ in stream:
                pass


async def test_plain_errors_map_to_openai_exceptions(make_proxy):
    proxy = await make_proxy()
    async with _client(proxy) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(model="missing", messages=MESSAGES)
    assert caught.value.code == "model_not_found"


async def test_embeddings_and_model_list(make_proxy):
    proxy = await make_proxy()
    async with _client(proxy) as client:
        embedding = await client.embeddings.create(model="beta", input="hi")
        models = await client.models.list()
    assert embedding.data[0].embedding == [0.25, 0.5, 0.75]
    assert [m.id for m in models.data] == ["alpha", "beta"]


async def test_audio_transcription_form_is_routed_by_its_model_field_and_forwarded_unchanged(make_proxy, fake):
    proxy = await make_proxy()
    gate = proxy.activator.gates["beta"] = asyncio.Event()
    audio = bytes(range(256)) * 4096
    async with _client(proxy) as client:
        task = asyncio.ensure_future(client.audio.transcriptions.create(
            model="beta", file=("clip.wav", audio, "audio/wav")))
        await asyncio.wait_for(proxy.activator.waiting.wait(), 5)  # held for beta's activation
        gate.set()
        await task
    received = fake.requests[-1]
    assert received.path == "/v1/audio/transcriptions"
    assert received.headers["Content-Type"].startswith("multipart/form-data; boundary=")
    assert audio in received.raw and b'name="model"\r\n\r\nbeta\r\n' in received.raw
