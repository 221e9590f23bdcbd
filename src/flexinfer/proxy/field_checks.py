"""The request-body checks the proxy makes itself, before a model server sees the body: the JSON types of a
few well-known OpenAI parameters on the generation routes, and strings that are not Unicode.

Why here: model servers answer these mistakes badly. llama.cpp's Python server answers a wrong type with a
500 carrying its validation text, and a prompt holding a lone UTF-16 surrogate (``"a\\ud800b"``: JSON's escapes
allow it, no tokenizer takes it) with a 500, or, streaming, with a ``200`` event stream that ends without a
single event. The types are the OpenAI API's own, the same for every backend: ``max_tokens``,
``max_completion_tokens`` and ``n`` take an integer, ``temperature``, ``top_p``, ``frequency_penalty`` and
``presence_penalty`` a number, ``stream`` a boolean; ``null`` is always accepted. Values of the right type
are the model server's call, except counts no server takes: ``n`` below 1, ``max_tokens`` or
``max_completion_tokens`` below -1 (-1 stays: llama.cpp servers and LM Studio read it as "no limit"; llama.cpp's
Python server even generates until the context is full for ``max_tokens: -5``). Other refusals by a model
server reach the client as 400s through ``upstream_errors.py``.

The Unicode check searches the body for a surrogate escape (``\\uD800``-``\\uDFFF``) and for surrogate
bytes (UTF-8 as Python's ``surrogatepass`` writes them): two ``memchr`` scans when the body has neither a
backslash nor the byte ``0xED``, about 0.5 ms per MB of prose otherwise, 2.5 ms per MB when nearly every
character is an escape (``ensure_ascii`` JSON of non-Latin text). Only a body holding one (emoji written as
escape pairs, mostly) is serialized once more to find a lone surrogate.

Called by ``routing.py``; a failed check raises ``BadRequestError`` (``param`` naming the field).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from flexinfer.core.errors import BadRequestError
from flexinfer.proxy.json_body import JsonBody

TYPED_PATHS = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/responses"))
"""Upstream paths whose parameters are type-checked (the Unicode check applies to every JSON body)."""


def _integer(value: object) -> bool:
    if isinstance(value, float):
        return value.is_integer()  # 16.0 is an integer to JSON
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _boolean(value: object) -> bool:
    return isinstance(value, bool)


_RULES: dict[str, tuple[Callable[[object], bool], str]] = {
    "max_tokens": (_integer, "an integer"), "max_completion_tokens": (_integer, "an integer"),
    "n": (_integer, "an integer"), "temperature": (_number, "a number"), "top_p": (_number, "a number"),
    "frequency_penalty": (_number, "a number"), "presence_penalty": (_number, "a number"),
    "stream": (_boolean, "a boolean"),
}
_MINIMUMS: dict[str, tuple[int, str]] = {
    "max_tokens": (-1, "a positive integer (or -1: no limit)"),
    "max_completion_tokens": (-1, "a positive integer (or -1: no limit)"),
    "n": (1, "a positive integer"),
}
CHECKED = frozenset(_RULES)
"""The type-checked parameters (all among ``json_body.KEPT``, so a large body's scan keeps them)."""
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_BYTES = re.compile(b"\xed[\xa0-\xbf]")
_JSON_TYPES = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
               (list, "an array"), (dict, "an object"))


def check_body(body: bytes, fields: JsonBody, path: str) -> None:
    """Raise ``BadRequestError`` when a checked parameter has the wrong type (on ``TYPED_PATHS``) or a string
    of the body holds a lone surrogate."""
    values = fields.values or {}
    if path in TYPED_PATHS:
        _check_types(values)
    surrogate = lone_surrogate(body, values if fields.whole else None)
    if surrogate is not None:
        raise BadRequestError(
            f"Invalid request body: a string holds the lone UTF-16 surrogate \\u{ord(surrogate):04x}, which is not "
            "Unicode text; pair every \\uD800-\\uDBFF escape with a \\uDC00-\\uDFFF one",
            code="invalid_unicode")


def _check_types(values: Mapping[str, Any]) -> None:
    rules = _RULES
    for name, value in values.items():  # a request has a handful of top-level keys
        rule = rules.get(name)
        if rule is None or value is None:
            continue
        valid, expected = rule
        if not valid(value):
            got = next((label for kind, label in _JSON_TYPES if isinstance(value, kind)), "another type")
            raise BadRequestError(f"Invalid type for '{name}': expected {expected}, but got {got} instead",
                                  code="invalid_type", param=name)
        minimum = _MINIMUMS.get(name)
        if minimum is not None and value < minimum[0]:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:39] + "…"
            raise BadRequestError(f"Invalid value for '{name}': expected {minimum[1]}, but got {shown}",
                                  code="invalid_value", param=name)


def lone_surrogate(body: bytes, parsed: Mapping[str, Any] | None = None) -> str | None:
    """The first lone surrogate in the strings (keys included) of a UTF-8 JSON ``body``, else ``None``;
    ``parsed`` is the body's object when it is at hand (else it is parsed again, only if a surrogate may be
    there)."""
    escaped = b"\\" in body and _SURROGATE_ESCAPE.search(body) is not None
    if not escaped and (b"\xed" not in body or _SURROGATE_BYTES.search(body) is None):
        return None
    try:
        text = json.dumps(json.loads(body) if parsed is None else parsed, ensure_ascii=False)
    except (ValueError, RecursionError):
        return None  # the body's own scan judged it; nothing more to find here
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return str(exc.object[exc.start])
    return None
