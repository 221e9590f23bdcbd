"""The proxy's own body checks: OpenAI parameter types and counts on the generation routes, and lone
surrogates anywhere, judged exactly as a model server's tokenizer would (a string that is not Unicode)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer.core.errors import BadRequestError
from flexinfer.proxy.field_checks import CHECKED, check_body, lone_surrogate
from flexinfer.proxy.json_body import KEPT, SMALL_BODY, scan

CHAT = "/v1/chat/completions"


def _check(obj: dict[str, Any], path: str = CHAT, *, pad: int = 0) -> None:
    body = json.dumps(obj).encode() + b" " * pad
    check_body(body, scan(body), path)


@pytest.mark.parametrize("pad", [0, SMALL_BODY], ids=["small body", "large body"])
@pytest.mark.parametrize(("field", "value", "code", "message"), [
    ("max_tokens", "lots", "invalid_type", "Invalid type for 'max_tokens': expected an integer, but got a string"),
    ("max_tokens", 2.5, "invalid_type", "expected an integer, but got a number"),
    ("max_tokens", True, "invalid_type", "expected an integer, but got a boolean"),
    ("max_tokens", -5, "invalid_value", "expected a positive integer (or -1: no limit), but got -5"),
    ("max_completion_tokens", [], "invalid_type", "expected an integer, but got an array"),
    ("n", 0, "invalid_value", "Invalid value for 'n': expected a positive integer, but got 0"),
    ("temperature", "hot", "invalid_type", "expected a number, but got a string"),
    ("top_p", {}, "invalid_type", "expected a number, but got an object"),
    ("stream", "true", "invalid_type", "Invalid type for 'stream': expected a boolean, but got a string"),
])
def test_a_wrong_parameter_is_a_400_naming_it(field: str, value: object, code: str, message: str, pad: int) -> None:
    with pytest.raises(BadRequestError) as caught:
        _check({"model": "m", field: value}, pad=pad)
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, code, field)
    assert message in str(caught.value)


@pytest.mark.parametrize("values", [
    {"max_tokens": 16, "temperature": 0, "top_p": 0.9, "n": 1, "stream": False},
    {"max_tokens": -1}, {"max_tokens": 0}, {"max_tokens": 16.0}, {"temperature": 3.5},
    {"max_tokens": None, "temperature": None, "stream": None}, {"max_output_tokens": "x", "seed": "y"},
])
def test_values_a_model_server_may_take_pass(values: dict[str, object]) -> None:
    _check({"model": "m", **values})


def test_types_are_checked_on_the_generation_routes_only() -> None:
    _check({"model": "m", "max_tokens": "lots"}, "/v1/rerank")
    with pytest.raises(BadRequestError):
        _check({"model": "m", "max_tokens": "lots"}, "/v1/completions")


def test_every_checked_parameter_is_kept_by_the_large_body_scan() -> None:
    assert CHECKED <= KEPT


@pytest.mark.parametrize("raw", [
    b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
    b'{"model": "m", "prompt": "\\udc00"}',
    b'{"model": "m", "prompt": "\\uDBFF\\uDBFF\\uDC00"}',
    b'{"model": "m", "stop": ["ok", "x\\ud83d"]}',
    b'{"model": "m", "bad\\udfff key": 1}',
    b'{"model": "m", "prompt": "a\xed\xa0\x80b"}',
])
@pytest.mark.parametrize("path", [CHAT, "/v1/embeddings", "/v1/anything"])
def test_a_lone_surrogate_anywhere_is_a_400(raw: bytes, path: str) -> None:
    for body in (raw, raw[:-1] + b" " * SMALL_BODY + b"}"):
        with pytest.raises(BadRequestError) as caught:
            check_body(body, scan(body), path)
        assert caught.value.code == "invalid_unicode" and "lone UTF-16 surrogate \\ud" in str(caught.value)
        str(caught.value).encode("utf-8")


@pytest.mark.parametrize("raw", [
    b'{"model": "m", "prompt": "emoji \\ud83d\\ude00 and \\uD83D\\uDE00"}',
    '{"model": "m", "prompt": "emoji 😀 and Hangul 한국어 \\u00e9"}'.encode(),
    b'{"model": "m", "prompt": "not an escape: \\\\ud800"}',
    b'{"model": "m", "prompt": "\\ud7ff\\ue000"}',
])
def test_valid_unicode_passes(raw: bytes) -> None:
    check_body(raw, scan(raw), CHAT)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.characters(categories=["Cs", "Ll", "Lo", "Nd", "So", "Zs", "Cc"])),
       ascii_only=st.booleans())
def test_lone_surrogate_agrees_with_utf8_encoding(text: str, ascii_only: bool) -> None:
    """Whatever the string (lone surrogates, pairs, escaped or raw), the check finds one exactly when the
    decoded string cannot be encoded as UTF-8."""
    body = json.dumps({"prompt": text}, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    try:
        json.loads(body)["prompt"].encode("utf-8")  # "\\ud83d\\ude00" escapes decode to one emoji
        expected = False
    except UnicodeEncodeError:
        expected = True
    assert (lone_surrogate(body) is not None) == expected
    assert (lone_surrogate(body, json.loads(body)) is not None) == expected
