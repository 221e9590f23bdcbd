"""The top-level fields the proxy needs from a JSON request body (``model``, ``stream``, and the parameters
``field_checks.py`` checks), found in one pass, and the byte-level rewrite of ``model``.

``scan(body)`` walks the top-level object with the standard library's C scanner (``json`` decoder's
``scan_once`` for each value, ``scanstring`` for each key): every value is validated as ``json.loads`` would,
but only the ``KEPT`` keys are kept, together with the byte span of the (last) ``model`` value.
``set_model(body, fields, name)`` splices the new name into that span, so a prompt of any size is copied
once and never re-serialized; ``json.loads`` of the result equals ``json.loads`` of the body with ``model``
replaced (``tests/unit/proxy/test_json_body.py`` proves it with property tests). A body of at most
``SMALL_BODY`` bytes (most chat requests) is read with one ``json.loads`` (C, faster than the key-by-key scan
there); its ``model`` span is found only if it must be rewritten. Bodies in UTF-16/32 or with a byte-order
mark take the full-parse fallback (``json.loads`` + ``json.dumps``). Used by ``routing.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

_DECODER = json.JSONDecoder()
_SCAN_VALUE: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
_SCAN_STRING: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_SPACE = re.compile(r"[ \t\n\r]*")
KEPT = frozenset(("model", "stream", "max_tokens", "max_completion_tokens", "n", "temperature", "top_p",
                  "frequency_penalty", "presence_penalty"))
"""The top-level keys a large body's scan keeps (``model`` and ``stream`` for routing, the rest for
``field_checks.py``)."""
SMALL_BODY = 16384
"""Bodies up to this size are parsed whole to find ``model`` and ``stream``."""
_INVALID = (ValueError, StopIteration, IndexError, RecursionError)


class NotJsonObject(ValueError):
    """The body is not one valid JSON object."""


class JsonBody(NamedTuple):
    """A JSON object body's ``model`` and ``stream`` values (``None`` when absent)."""

    model: Any = None
    stream: Any = None
    model_span: tuple[int, int] | None = None
    """Byte offsets of the last top-level ``model`` value (``None``: absent, or the fallback parse)."""
    parsed: dict[str, Any] | None = None
    """The whole object, only for the full-parse fallback."""
    spanned: bool = True
    """False for a small body read whole: ``model_span`` is found when a rewrite needs it."""
    values: Mapping[str, Any] | None = None
    """Top-level values: the whole object when it was parsed whole (``whole``), else the ``KEPT`` keys found."""

    @property
    def whole(self) -> bool:
        """``values`` is the whole object (a small body, or the full-parse fallback)."""
        return not self.spanned or self.parsed is not None


def scan(body: bytes) -> JsonBody:
    """The top-level fields of a JSON object body; ``NotJsonObject`` when it is not valid JSON or not an
    object (``json.loads`` rules: surrounding whitespace allowed, duplicate keys → the last one counts)."""
    if len(body) <= SMALL_BODY:
        small = _small(body)
        if small is not None:
            return small
        fields = _fallback(body)
        if json.detect_encoding(body) != "utf-8":
            return fields
        return JsonBody(model=fields.model, stream=fields.stream, spanned=False, values=fields.values)
    return _scan(body)


def _small(body: bytes) -> JsonBody | None:
    """The common case in one step: strict UTF-8 text holding one JSON object (``None``: anything else, which
    the full rules then judge: byte-order marks, UTF-16/32, lone surrogates, errors)."""
    try:
        parsed = _DECODER.decode(body.decode())
    except _INVALID:
        return None
    if not isinstance(parsed, dict):
        return None
    return JsonBody(model=parsed.get("model"), stream=parsed.get("stream"), spanned=False, values=parsed)


def _scan(body: bytes) -> JsonBody:
    if json.detect_encoding(body) != "utf-8":
        return _fallback(body)
    try:
        text = body.decode("utf-8", "surrogatepass")
        return _scan_text(text, body, len(text) == len(body))
    except _INVALID:
        raise NotJsonObject("request body is not valid JSON") from None


def _scan_text(text: str, body: bytes, ascii_only: bool) -> JsonBody:
    found: dict[str, tuple[Any, int, int]] = {}
    kept = KEPT
    i = _SPACE.match(text, 0).end()  # type: ignore[union-attr]
    if text[i] != "{":
        raise NotJsonObject("request body is not a JSON object")
    i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
    if text[i] != "}":
        while True:
            if text[i] != '"':
                raise NotJsonObject("expected a property name")
            key, i = _SCAN_STRING(text, i + 1)
            i = _SPACE.match(text, i).end()  # type: ignore[union-attr]
            if text[i] != ":":
                raise NotJsonObject("expected ':'")
            start = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
            value, i = _SCAN_VALUE(text, start)
            if key in kept:
                found[key] = (value, start, i)
            i = _SPACE.match(text, i).end()  # type: ignore[union-attr]
            if text[i] == "}":
                break
            if text[i] != ",":
                raise NotJsonObject("expected ',' or '}'")
            i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
    if _SPACE.match(text, i + 1).end() != len(text):  # type: ignore[union-attr]
        raise NotJsonObject("extra data after the JSON object")
    model = found.get("model")
    span = None
    if model is not None:
        _, start, end = model
        span = (start, end) if ascii_only else _byte_span(text, start, end)
    return JsonBody(model=model[0] if model else None, stream=found["stream"][0] if "stream" in found else None,
                    model_span=span, values={key: value for key, (value, _, _) in found.items()})


def _byte_span(text: str, start: int, end: int) -> tuple[int, int]:
    """UTF-8 byte offsets of ``text[start:end]`` (only for bodies with non-ASCII characters)."""
    byte_start = len(text[:start].encode("utf-8", "surrogatepass"))
    return byte_start, byte_start + len(text[start:end].encode("utf-8", "surrogatepass"))


def _fallback(body: bytes) -> JsonBody:
    try:
        parsed = json.loads(body)
    except _INVALID:
        raise NotJsonObject("request body is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise NotJsonObject("request body is not a JSON object")
    return JsonBody(model=parsed.get("model"), stream=parsed.get("stream"), parsed=parsed, values=parsed)


def set_model(body: bytes, fields: JsonBody, name: str) -> bytes:
    """``body`` with its top-level ``model`` set to ``name`` (added when absent)."""
    if not fields.spanned:
        fields = _scan(body)
    if fields.parsed is not None:
        return json.dumps({**fields.parsed, "model": name}, separators=(",", ":")).encode()
    value = json.dumps(name).encode()
    if fields.model_span is not None:
        start, end = fields.model_span
        return b"".join((body[:start], value, body[end:]))
    opening = body.index(b"{") + 1
    return b"".join((body[:opening], b'"model":', value, b"," if body[opening:].strip()[:1] != b"}" else b"",
                     body[opening:]))
