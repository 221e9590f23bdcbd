"""What a model server's error body becomes: message kept, internals dropped, shapes normalised."""

from __future__ import annotations

import gzip
import json

from flexinfer.proxy.upstream_errors import MAX_MESSAGE, upstream_error

TRACEBACK = b"""Traceback (most recent call last):
  File "/a/b.py", line 3, in f
    x = g()
        ~~~^^
  File "/a/c.py", line 9, in g
    raise ValueError("bad value for /etc/passwd")
ValueError: bad value for /etc/passwd
"""


def test_traceback_frames_source_lines_and_paths_are_dropped() -> None:
    error = upstream_error(500, TRACEBACK, content_type="text/plain")
    assert str(error) == "model server answered 500: ValueError: bad value for <path>"
    assert (error.status, error.type, error.code) == (500, "server_error", "upstream_error")


def test_urls_and_ratios_are_not_taken_for_paths() -> None:
    error = upstream_error(400, b"see https://example.test/a/b for 1/2 of it", content_type="text/plain")
    assert str(error) == "model server answered 400: see https://example.test/a/b for 1/2 of it"


def test_retry_after_is_kept_for_rate_limits() -> None:
    error = upstream_error(429, b'{"error": "slow down"}', retry_after="7")
    assert (str(error), error.type, error.retry_after) == ("model server answered 429: slow down",
                                                           "rate_limit_error", 7.0)


def test_compressed_envelope_keeps_its_fields() -> None:
    body = gzip.compress(json.dumps({"error": {"message": "bad", "type": "invalid_request_error",
                                               "code": None, "param": "n"}}).encode())
    error = upstream_error(400, body, content_encoding="gzip")
    assert (str(error), error.type, error.code, error.param) == ("bad", "invalid_request_error", None, "n")


def test_undecodable_and_empty_bodies_still_say_the_status() -> None:
    assert str(upstream_error(503, b"", content_type="text/plain")) == "model server answered 503"
    assert str(upstream_error(502, b"\x00\x01", content_encoding="br")) == "model server answered 502"
    message = str(upstream_error(500, "é".encode() * 5000 + b"\xff", content_type="text/plain"))
    assert len(message) <= len("model server answered 500: ") + MAX_MESSAGE and message.endswith("…")


LLAMA_VALIDATION_500 = json.dumps({"error": {
    "message": "1 validation error:\n  {'type': 'int_parsing', 'loc': ('body', 'max_tokens'), 'msg': 'Input should "
               "be a valid integer, unable to parse string as an integer', 'input': 'lots'}\n\n  File \"/srv/venv/lib/"
               "python3.11/site-packages/llama_cpp/server/app.py\", line 376, in create_chat_completion\n    POST "
               "/v1/chat/completions",
    "type": "internal_server_error", "param": None, "code": None}}).encode()


def test_a_request_validation_report_in_a_500_is_the_clients_400() -> None:
    """llama.cpp's Python server answers a wrong parameter with a 500 carrying FastAPI's validation text."""
    error = upstream_error(500, LLAMA_VALIDATION_500, content_type="application/json")
    assert (error.status, error.type, error.code, error.param) == (400, "invalid_request_error",
                                                                   "invalid_request_error", "max_tokens")
    assert str(error) == ("The model server rejected the request: max_tokens: Input should be a valid integer, "
                          "unable to parse string as an integer")


def test_a_server_failure_that_is_no_validation_report_stays_a_500() -> None:
    body = json.dumps({"error": {"message": "'utf-8' codec can't encode character '\\ud800': surrogates not allowed",
                                 "type": "internal_server_error", "param": None, "code": None}}).encode()
    assert upstream_error(500, body).status == 500
    assert upstream_error(422, b'{"detail": "bad"}').status == 422  # a 4xx keeps its status
