"""Model-name sources, prefix stripping and the served-model-name body rewrite."""

from __future__ import annotations

import json

import pytest

from flexinfer.core.errors import BadRequestError
from flexinfer.proxy.routing import path_key_candidate, rewrite_body, route, split_model_prefix

BODY = json.dumps({"model": "in-body", "stream": True}).encode()


def test_header_wins_over_path_and_body():
    routed = route({"X-Model-ID": "hdr"}, "/model/pfx/v1/chat/completions", "", BODY)
    assert (routed.model, routed.source, routed.upstream_path) == ("hdr", "header", "/v1/chat/completions")


def test_path_prefix_wins_over_body_and_is_stripped():
    routed = route({}, "/model/pfx/v1/completions", "a=1", BODY)
    assert (routed.model, routed.source, routed.upstream_path) == ("pfx", "path", "/v1/completions?a=1")


def test_body_model_and_stream_flag():
    routed = route({}, "/v1/chat/completions", "", BODY)
    assert (routed.model, routed.source, routed.streaming) == ("in-body", "body", True)


@pytest.mark.parametrize("body", [b"", b"{}", b'{"model": ""}', b'{"model": 3}'])
def test_missing_model_is_missing_required_field(body):
    with pytest.raises(BadRequestError) as caught:
        route({}, "/v1/chat/completions", "", body)
    assert caught.value.code == "missing_required_field" and caught.value.param == "model"


def test_garbage_body_is_only_an_error_when_the_model_comes_from_it():
    with pytest.raises(BadRequestError):
        route({}, "/v1/x", "", b"{oops")
    routed = route({"X-Model-ID": "m"}, "/v1/x", "", b"{oops")
    assert routed.payload is None and not routed.streaming


@pytest.mark.parametrize("path,expected", [
    ("/model/m/v1/x", ("/v1/x", "m")), ("/model/m", ("/", "m")), ("/model/m/", ("/", "m")),
    ("/v1/x", ("/v1/x", None)), ("/model//v1", ("/model//v1", None)),
])
def test_split_model_prefix(path, expected):
    assert split_model_prefix(path) == expected


@pytest.mark.parametrize("path,candidate", [
    ("/model/team-b/chat/v1/x", "team-b/chat"), ("/model/team-b/chat", "team-b/chat"),
    ("/model/chat/v1", "chat/v1"), ("/model/chat", None), ("/model/chat/", None), ("/v1/x", None),
])
def test_path_key_candidate(path, candidate):
    assert path_key_candidate(path) == candidate


def test_a_confirmed_key_in_the_path_names_the_model_else_the_first_segment_does():
    routed = route({}, "/model/team-b/chat/v1/chat/completions", "a=1", BODY, path_key="team-b/chat")
    assert (routed.model, routed.source, routed.upstream_path) == ("team-b/chat", "path", "/v1/chat/completions?a=1")
    assert split_model_prefix("/model/team-b/chat", "team-b/chat") == ("/", "team-b/chat")
    assert split_model_prefix("/model/chat/v1/x", None) == ("/v1/x", "chat")
    assert split_model_prefix("/model/chat/v1/x", "other/key") == ("/v1/x", "chat")


def test_rewrite_body_sets_served_name_and_keeps_other_fields():
    payload = route({}, "/v1/chat/completions", "", BODY).payload
    rewritten = json.loads(rewrite_body(BODY, payload, "served"))
    assert rewritten == {"model": "served", "stream": True}
    assert rewrite_body(BODY, payload, "in-body") is BODY
    assert rewrite_body(b"raw", None, "served") == b"raw"


def form(*fields: tuple[str, bytes, str | None], boundary: str = "b0undary") -> tuple[dict[str, str], bytes]:
    """A multipart/form-data request: (headers, body) with ``(name, value, filename)`` parts in order."""
    parts = []
    for name, value, filename in fields:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        parts.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return {"Content-Type": f"multipart/form-data; boundary={boundary}"}, body


def test_form_field_names_the_model_after_a_large_file_and_the_body_is_kept():
    audio = bytes(range(256)) * 40_000  # 10 MB of binary, including CR/LF and the boundary's letters
    headers, body = form(("file", audio, "a.wav"), ("model", b" whisper-large \r\n", None),
                         ("model", b"second", None))
    routed = route(headers, "/v1/audio/transcriptions", "", body)
    assert (routed.model, routed.source, routed.payload) == ("whisper-large", "form", None)
    assert rewrite_body(body, routed.payload, "served-name") is body


def test_header_and_prefix_still_win_over_a_form():
    headers, body = form(("model", b"in-form", None))
    assert route({**headers, "X-Model-ID": "hdr"}, "/v1/audio/transcriptions", "", body).model == "hdr"
    assert route(headers, "/model/pfx/v1/audio/transcriptions", "", body).model == "pfx"


@pytest.mark.parametrize("fields", [(), (("file", b"x", "a.wav"),), (("model", b"  ", None),)])
def test_a_form_without_a_model_is_missing_required_field(fields):
    headers, body = form(*fields)
    with pytest.raises(BadRequestError) as caught:
        route(headers, "/v1/audio/transcriptions", "", body)
    assert caught.value.code == "missing_required_field" and "multipart form field" in str(caught.value)


@pytest.mark.parametrize("value,problem", [(b"m" * 2000, "longer than 1024 bytes"), (b"\xff\xfe", "not UTF-8")])
def test_bad_form_values_are_named(value, problem):
    headers, body = form(("model", value, None))
    with pytest.raises(BadRequestError, match=problem) as caught:
        route(headers, "/v1/audio/transcriptions", "", body)
    assert caught.value.param == "model"


def test_a_malformed_form_is_a_bad_request():
    headers, _ = form()
    with pytest.raises(BadRequestError, match="multipart/form-data body is malformed"):
        route(headers, "/v1/audio/transcriptions", "", b"--other\r\nno boundary here")
