"""The slot routes of llama.cpp's ``llama-server`` that prompt caches use: list, save, restore, erase.

- ``GET /slots`` → one object per slot (``id``, ``is_processing``, ...);
- ``POST /slots/{id}?action=save`` with ``{"filename": NAME}`` writes the slot's prompt and KV cache to
  ``NAME`` in the server's ``--slot-save-path`` → ``{"n_saved": tokens, "n_written": bytes}``;
- ``POST /slots/{id}?action=restore`` with ``{"filename": NAME}`` loads it back → ``{"n_restored": tokens}``;
  a missing, truncated or foreign file is a 400 (``invalid slot save file``) and the server keeps running;
- ``POST /slots/{id}?action=erase`` empties the slot.

A failure of any kind (a refused connection, a non-200 answer, a body that is not the expected JSON) raises
``SlotError`` with the server's message. Used by ``flexinfer.local.prompt_cache``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp


class SlotError(Exception):
    """A slot request failed (the message says how, with the server's own words when it gave some)."""


@dataclass(frozen=True)
class Slot:
    """One server slot as ``GET /slots`` lists it."""

    id: int
    busy: bool


@dataclass(frozen=True)
class Saved:
    """What one save wrote: tokens and bytes."""

    tokens: int
    size: int


class SlotApi:
    """The slot routes of one server (``base_url``: ``http://host:port``), over one client session."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self._session = session
        self._base = base_url.rstrip("/")

    async def slots(self) -> list[Slot]:
        body = await self._call("GET", "/slots")
        if not isinstance(body, list):
            raise SlotError(f"GET /slots answered {_short(body)}, not a list of slots")
        return [Slot(int(item["id"]), bool(item.get("is_processing"))) for item in body
                if isinstance(item, dict) and isinstance(item.get("id"), int)]

    async def save(self, slot: int, filename: str) -> Saved:
        body = await self._action(slot, "save", {"filename": filename})
        return Saved(_count(body, "n_saved"), _count(body, "n_written"))

    async def restore(self, slot: int, filename: str) -> int:
        """Tokens restored into ``slot`` from ``filename``."""
        return _count(await self._action(slot, "restore", {"filename": filename}), "n_restored")

    async def erase(self, slot: int) -> None:
        await self._action(slot, "erase", {})

    async def _action(self, slot: int, action: str, payload: dict[str, str]) -> Any:
        return await self._call("POST", f"/slots/{slot}?action={action}", payload)

    async def _call(self, method: str, path: str, payload: dict[str, str] | None = None) -> Any:
        try:
            async with self._session.request(method, self._base + path, json=payload) as response:
                text = await response.text()
        except (aiohttp.ClientError, OSError) as exc:
            raise SlotError(f"{method} {path}: {exc or type(exc).__name__}") from None
        try:
            body = json.loads(text)
        except ValueError:
            raise SlotError(f"{method} {path} answered {response.status}: {text[:200]!r}") from None
        if response.status != 200:
            raise SlotError(f"{method} {path} answered {response.status}: {_message(body)}")
        return body


def _count(body: Any, name: str) -> int:
    value = body.get(name) if isinstance(body, dict) else None
    if not isinstance(value, int):
        raise SlotError(f"the answer has no {name}: {_short(body)}")
    return value


def _message(body: Any) -> str:
    """The server's error message (``{"error": {"message": ...}}``), else the body, shortened."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])[:300]
    return _short(body)


def _short(body: Any) -> str:
    return json.dumps(body)[:200]
