"""What a model server's error answer (status >= 400) becomes for the client: an OpenAI error envelope.

Model servers answer errors in many shapes: an OpenAI envelope, FastAPI's ``{"detail": ...}``, plain text,
HTML, or a 500 whose body is a traceback full of server file paths. ``upstream_error`` keeps the status and
the server's message (the envelope's ``type``/``code``/``param`` too, when the body is one) and drops the
internals: traceback frames, source lines and file paths are removed and the message is bounded. One exception
to keeping the status: a 5xx whose message reports that the request failed the server's validation
(FastAPI/pydantic request validation, ``validation_reports.py``: llama.cpp's Python server answers a wrong
parameter type or range, or a body sent as ``text/plain``, with a 500) is the client's mistake, a
``400 invalid_request_error`` naming the fields and their problems without the echoed input. (A ``422``
keeps its status: it already says the request was wrong.) The body is read up to ``MAX_ERROR_BODY`` bytes.
Used by ``forwarding.py``, before the first byte of the client's response (a JSON error) or on an
already-started event stream (an SSE error event).
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

from flexinfer.core.errors import RequestError
from flexinfer.proxy.validation_reports import Report, request_report

MAX_ERROR_BODY = 64 * 1024
"""Bytes of an upstream error body read for its message (the rest is discarded)."""
MAX_MESSAGE = 512
"""Characters of the upstream message kept."""

_TRACEBACK_NOISE = re.compile(
    r"^\s*(Traceback \(most recent call last\):|File \".*\", line \d+.*|at \S+\s*\(.*\)|at \S+:\d+.*|[\^~]+\s*|"
    r"During handling of the above exception.*|The above exception was the direct cause.*)$"
)
_PATH = re.compile(r"(?<![\w:/.])(?:[A-Za-z]:\\|~?/)(?:[\w.@+-]+[/\\])+[\w.@+-]*")
_TAG = re.compile(r"<[^>]*>")
_STATUS_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
                 422: "invalid_request_error", 429: "rate_limit_error"}


class UpstreamStatusError(RequestError):
    """A model server answered an error status; relayed with that status as an OpenAI error."""

    def __init__(self, status: int, message: str, *, type_: str, code: str | None,
                 param: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.type, self.param, self.retry_after = status, type_, param, retry_after
        self.code = code  # type: ignore[assignment]  # an upstream envelope may carry ``"code": null``


def scrub(text: str) -> str:
    """``text`` as one line without traceback frames, source lines or file paths, at most ``MAX_MESSAGE``
    characters."""
    kept: list[str] = []
    in_frame = False
    for line in text.splitlines():
        if _TRACEBACK_NOISE.match(line):
            in_frame = line.lstrip().startswith("File ")
            continue
        if in_frame and line.startswith("    "):
            continue  # the source line printed under a traceback frame
        in_frame = False
        kept.append(_PATH.sub("<path>", line))
    one_line = " ".join(" ".join(kept).split())
    return one_line if len(one_line) <= MAX_MESSAGE else one_line[: MAX_MESSAGE - 1] + "…"


def decode_body(body: bytes, content_encoding: str) -> str:
    """The body as text (gzip/deflate undone, bounded; invalid UTF-8 replaced); empty when undecodable."""
    encoding = content_encoding.strip().lower()
    if encoding in ("gzip", "deflate", "x-gzip"):
        try:
            body = zlib.decompressobj(wbits=47).decompress(body, MAX_ERROR_BODY)
        except zlib.error:
            return ""
    elif encoding not in ("", "identity"):
        return ""
    return body.decode("utf-8", errors="replace")


def upstream_error(status: int, body: bytes, *, content_type: str = "", content_encoding: str = "",
                   retry_after: str | None = None) -> UpstreamStatusError:
    """The client-facing error for an upstream answer ``status`` with ``body`` (see the module docstring)."""
    text = decode_body(body, content_encoding)
    fields = _envelope_fields(text)
    if fields is not None:
        raw, type_, code, param = fields
    else:
        if "html" in content_type.lower() or text.lstrip().startswith("<"):
            text = _TAG.sub(" ", text)
        raw = _json_message(text) if _looks_json(text) else text
        type_ = _STATUS_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        code, param = "upstream_error", None
    report = request_report(raw) if status >= 500 else None
    if report is not None:
        return _rejected(report)
    detail = scrub(raw)
    if fields is None:
        message = f"model server answered {status}" + (f": {detail}" if detail else "")
    else:
        message = detail or f"model server answered {status}"
    return UpstreamStatusError(status, message, type_=type_, code=code, param=param,
                               retry_after=_seconds(retry_after))


def _rejected(report: Report) -> UpstreamStatusError:
    """The model server refused the request as invalid: a 400 for the client."""
    return UpstreamStatusError(400, f"The model server rejected the request: {scrub(report.summary)}",
                               type_="invalid_request_error", code="invalid_request_error",
                               param=None if report.param is None else scrub(report.param))


def _envelope_fields(text: str) -> tuple[str, str, str | None, str | None] | None:
    """``(message, type, code, param)`` of an OpenAI error envelope body, else ``None``."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None
    type_ = error.get("type")
    code, param = error.get("code"), error.get("param")
    return (error["message"], scrub(type_) if isinstance(type_, str) and type_ else "upstream_error",
            scrub(str(code)) if isinstance(code, str | int) and not isinstance(code, bool) else None,
            scrub(param) if isinstance(param, str) else None)


def _looks_json(text: str) -> bool:
    return text.lstrip()[:1] in ("{", "[")


def _json_message(text: str) -> str:
    """The message of a non-OpenAI JSON error: ``error``/``detail``/``message`` (FastAPI validation lists
    become ``loc: msg`` pairs); empty when there is none."""
    try:
        parsed: Any = json.loads(text)
    except ValueError:
        return ""
    if not isinstance(parsed, dict):
        return ""
    for key in ("error", "detail", "message"):
        value = parsed.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return "; ".join(_detail_item(item) for item in value)
    return ""


def _detail_item(item: object) -> str:
    if not isinstance(item, dict):
        return str(item)
    loc = ".".join(str(part) for part in item.get("loc", ()) if isinstance(part, str | int))
    msg = str(item.get("msg", ""))
    return f"{loc}: {msg}" if loc else msg


def _seconds(value: str | None) -> float | None:
    try:
        seconds = float(value) if value else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 86400 else None
