"""Parallel streams to one llama.cpp model through ``flexinfer serve`` all finish (the real ``llama-server``
with a tiny GGUF model, two slots).

The server is started with ``--parallel 2`` (``spec.config.parallel``) and the proxy admits two requests at a
time (queueing the rest), so four overlapping streams run two by two in the server's real slots; every one
must end with a ``finish_reason`` and ``[DONE]``, and the server must have run two at once. The
``python -m llama_cpp.server`` profile (one request at a time, ``--interrupt_requests False``) and vLLM's
are covered where their commands are built (``tests/unit/local/test_launch_profiles.py``,
``tests/unit/core/test_manifests.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from support.llama_server import TINY_ARGS, needs_llama_server
from support.local_serve import ServeProcess, model_manifest, serve_env, write_manifests

pytestmark = [pytest.mark.integration, needs_llama_server]
STREAMS = 4


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    from support.tiny_gguf import write_tiny_gguf

    config = {"args": TINY_ARGS, "parallel": 2}
    doc = model_manifest("tiny", write_tiny_gguf(tmp_path / "tiny.gguf"), None, config)
    manifests = write_manifests(tmp_path / "models" / "models.yaml", [doc])
    process = ServeProcess.start(manifests.parent, serve_env(tmp_path / "state"))
    yield process
    process.stop()


async def stream_chat(session: aiohttp.ClientSession, url: str, index: int) -> tuple[int, list[dict]]:
    """One streaming chat; returns the status and every parsed chunk (``[DONE]`` as ``{"done": True}``)."""
    body = {"model": "tiny", "stream": True, "max_tokens": 96, "temperature": 0,
            "logit_bias": {"2": -100},  # never end early at </s>: the streams must overlap
            "messages": [{"role": "user", "content": f"hello {index}"}]}
    chunks: list[dict] = []
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        async for raw in response.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                data = line[len("data: "):]
                chunks.append({"done": True} if data == "[DONE]" else json.loads(data))
    return response.status, chunks


async def test_parallel_streams_all_end_with_a_finish_reason(serve: ServeProcess) -> None:
    async with aiohttp.ClientSession() as session:
        async with asyncio.timeout(240):
            results = await asyncio.gather(*(stream_chat(session, serve.url, i) for i in range(STREAMS)))
    for status, chunks in results:
        assert status == 200, chunks
        assert chunks and chunks[-1] == {"done": True}, chunks[-3:]
        reasons = [c["choices"][0].get("finish_reason") for c in chunks[:-1] if c.get("choices")]
        assert reasons and reasons[-1] is not None, f"stream truncated without a finish_reason: {chunks[-3:]}"
    assert "Traceback" not in serve.log, serve.log
    async with aiohttp.ClientSession() as session, session.get(serve.url + "/admin/logs/tiny?tail=5000") as response:
        lines = (await response.json())["lines"]
    slots = {line.split("| task")[0].split("id")[-1].strip() for line in lines if "processing task" in line}
    assert slots == {"0", "1"}, "the server's two slots did not both serve"
