"""The one-pass body scan and the byte-level ``model`` rewrite agree with ``json.loads`` + ``json.dumps``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer.proxy.json_body import KEPT, SMALL_BODY, NotJsonObject, scan, set_model

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner,
                                                                                           max_size=4), max_leaves=12)
objects = st.dictionaries(st.text() | st.sampled_from(["model", "stream", "messages", "max_tokens", "n"]), values,
                          max_size=6)
names = st.text(min_size=1)


def json_rewrite(body: bytes, name: str) -> Any:
    """The reference: parse, replace ``model``, serialize."""
    return {**json.loads(body), "model": name}


def render(obj: dict[str, Any], indent: int | None, ascii_only: bool) -> bytes:
    return json.dumps(obj, indent=indent, ensure_ascii=ascii_only).encode()


@settings(max_examples=300, deadline=None)
@given(obj=objects, name=names, indent=st.sampled_from([None, 0, 2]), ascii_only=st.booleans())
def test_byte_rewrite_equals_the_json_rewrite(obj: dict[str, Any], name: str, indent: int | None,
                                              ascii_only: bool) -> None:
    body = render(obj, indent, ascii_only)
    fields = scan(body)
    assert fields.model == obj.get("model") and fields.stream == obj.get("stream")
    assert json.loads(set_model(body, fields, name)) == json_rewrite(body, name)


@settings(max_examples=200, deadline=None)
@given(obj=objects, pad=st.sampled_from([0, SMALL_BODY]))
def test_the_kept_values_are_the_objects_values(obj: dict[str, Any], pad: int) -> None:
    """Small bodies keep the whole object, large ones the ``KEPT`` keys; either way those agree with json.loads."""
    body = json.dumps(obj).encode() + b" " * pad
    fields = scan(body)
    assert fields.values is not None and fields.whole == (pad == 0)
    assert {k: v for k, v in fields.values.items() if k in KEPT} == {k: v for k, v in obj.items() if k in KEPT}
    assert fields.whole or set(fields.values) <= KEPT


@settings(max_examples=200, deadline=None)
@given(first=values, last=values, name=names, padding=st.sampled_from(["", " ", "\n\t "]))
def test_duplicate_keys_and_whitespace_follow_json_loads(first: Any, last: Any, name: str, padding: str) -> None:
    body = (f'{padding}{{{padding}"model"{padding}:{padding}{json.dumps(first)}{padding},'
            f'"x":1,"model":{json.dumps(last)}{padding}}}{padding}').encode()
    fields = scan(body)
    assert fields.model == json.loads(body)["model"]
    assert json.loads(set_model(body, fields, name)) == json_rewrite(body, name)


@given(text=st.text(max_size=40))
def test_scan_rejects_exactly_what_json_loads_rejects_for_objects(text: str) -> None:
    body = ("{" + text).encode()
    try:
        expected = json.loads(body)
    except ValueError:
        expected = None
    if not isinstance(expected, dict):
        with pytest.raises(NotJsonObject):
            scan(body)
    else:
        assert scan(body).model == expected.get("model")


@pytest.mark.parametrize("body", [b"", b"[]", b'{"model": "a"} x', b'{"model": "a",}', b'{"model" "a"}', b"{",
                                  b'{"a": tru}'])
def test_invalid_or_non_object_bodies_are_rejected(body: bytes) -> None:
    with pytest.raises(NotJsonObject):
        scan(body)


def test_utf16_and_bom_bodies_take_the_full_parse_fallback() -> None:
    for body in ('{"model": "é"}'.encode("utf-16"), b'\xef\xbb\xbf{"model": "a", "stream": true}'):
        fields = scan(body)
        assert fields.parsed is not None and fields.model == json.loads(body)["model"]
        assert json.loads(set_model(body, fields, "served")) == json_rewrite(body, "served")


def test_a_missing_model_is_added() -> None:
    for body in (b"{}", b"{ }", b'{"stream": true}'):
        assert json.loads(set_model(body, scan(body), "m")) == json_rewrite(body, "m")


def test_a_large_prompt_is_copied_once_not_reserialized() -> None:
    prompt = "word " * 200_000
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "model": "alias"}).encode()
    rewritten = set_model(body, scan(body), "served")
    assert rewritten[: len(body) - len(b'"alias"}')] == body[: len(body) - len(b'"alias"}')]
    assert rewritten.endswith(b'"served"}')
