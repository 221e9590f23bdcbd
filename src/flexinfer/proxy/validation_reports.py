"""A model server's report that the request failed its validation, recognised in an error answer's message
and summarised as one clean line.

FastAPI servers (llama.cpp's Python server among them) validate the body before the model sees it. The
stock answer is a ``422`` with ``{"detail": [{"loc", "msg", "type"}, ...]}``, but llama.cpp's Python server
catches the validation error itself and answers ``500`` with ``str(error)`` as the message::

    1 validation error:
      {'type': 'int_parsing', 'loc': ('body', 'max_tokens'), 'msg': 'Input should be a valid integer, …',
       'input': 'lots'}
      File "/…/app.py", line 42, in create_chat_completion

That is the client's mistake, not the server's failure. ``request_report`` recognises the two formats
(FastAPI's, whose locations must all be parts of the request: ``body``, ``query``, ``header``, ``path``, so a
server's invalid *response* stays a 500; and pydantic's ``N validation errors for <Name>Request``) and returns
``loc: msg`` pairs without the echoed input (which may be a whole prompt) and the single field when there is
one. Used by ``upstream_errors.py``.
"""

from __future__ import annotations

import ast
import itertools
import re
from typing import NamedTuple

_FASTAPI = re.compile(r"\A\s*\d+ validation errors?:\s*\n")
_PYDANTIC = re.compile(r"\A\s*\d+ validation errors? for \w*Request\s*\n")
_PYDANTIC_TAIL = re.compile(r"\s*\[type=.*$")
_LOC = re.compile(r"'loc': \(([^)]*)\)")
_MSG = re.compile(r"""'msg': (?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")
_REQUEST_PARTS = frozenset(("body", "query", "header", "path", "cookie"))
MAX_ITEMS = 5
"""Problems listed in the summary (the rest are counted)."""


class Report(NamedTuple):
    """A request-validation report: its problems as ``loc: msg`` text, and the one field when there is one."""

    summary: str
    param: str | None


def request_report(message: str) -> Report | None:
    """The report in ``message`` when it is a request-validation report (see the module docstring)."""
    if _FASTAPI.match(message):
        return _fastapi(message)
    if _PYDANTIC.match(message):
        return _pydantic(message)
    return None


def _fastapi(message: str) -> Report | None:
    """Each problem is a ``dict`` repr on its own line; ``loc`` and ``msg`` are read from it (the rest, the echoed
    ``input`` and a ``ctx`` that may hold exception objects, is not evaluated)."""
    problems: list[tuple[str, str]] = []
    for line in message.splitlines()[1:]:
        if not line.strip().startswith("{"):
            continue  # the endpoint's file and line, printed after the problems
        loc, msg = _LOC.search(line), _MSG.search(line)
        if loc is None or msg is None:
            return None
        parts = [part.strip().strip("'\"") for part in loc.group(1).split(",") if part.strip()]
        if not parts or parts[0] not in _REQUEST_PARTS:
            return None
        problems.append((".".join(parts[1:]) or parts[0], _unquote(msg.group(0)[len("'msg': "):])))
    return _report(problems)


def _unquote(literal: str) -> str:
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return literal.strip("'\"")
    return value if isinstance(value, str) else literal


def _pydantic(message: str) -> Report | None:
    problems: list[tuple[str, str]] = []
    lines = message.splitlines()[1:]
    for field, detail in itertools.pairwise(lines):
        if not field.startswith(" ") and detail.startswith("  ") and not detail.startswith("    "):
            problems.append((field.strip(), _PYDANTIC_TAIL.sub("", detail.strip())))
    return _report(problems)


def _report(problems: list[tuple[str, str]]) -> Report | None:
    if not problems:
        return None
    listed = "; ".join(f"{loc}: {msg}" for loc, msg in problems[:MAX_ITEMS])
    if len(problems) > MAX_ITEMS:
        listed += f"; and {len(problems) - MAX_ITEMS} more"
    fields = {loc for loc, _ in problems}
    param = next(iter(fields)) if len(fields) == 1 and "." not in next(iter(fields)) else None
    return Report(listed, param if param not in _REQUEST_PARTS else None)
