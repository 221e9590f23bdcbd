"""Model-name sources, prefix stripping and the served-model-name body rewrite."""

from __future__ import annotations

import json

import pytest

from flexinfer.core.errors import BadRequestError
from flexinfer.proxy.routing import rewrite_body, route, split_model_prefix

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


def test_rewrite_body_sets_served_name_and_keeps_other_fields():
    payload = json.loads(BODY)
    rewritten = json.loads(rewrite_body(BODY, payload, "served"))
    assert rewritten == {"model": "served", "stream": True}
    assert rewrite_body(BODY, payload, "in-body") is BODY
    assert rewrite_body(b"raw", None, "served") == b"raw"
