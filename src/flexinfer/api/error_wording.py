"""How a pydantic validation error is worded for people: the field path it names and its message.

``flexinfer.api.loading`` turns every schema error into a ``FieldProblem`` with these (``flexinfer validate``,
``serve``, the operator's stored objects all print them the same way).
"""

from __future__ import annotations

from typing import Any


def field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a printed path: ``spec.gpu.priority``, list items and dotted keys bracketed
    (``spec.tolerations[0]``, ``spec.resources.limits[example.com/x]``)."""
    out = ""
    for part in loc:
        if isinstance(part, int) or "." in part or "/" in part:
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


_TEMPLATES = {
    "less_than_equal": "must be ≤ {le}, got {input}",
    "greater_than_equal": "must be ≥ {ge}, got {input}",
    "less_than": "must be < {lt}, got {input}",
    "greater_than": "must be > {gt}, got {input}",
    "extra_forbidden": "unknown field",
    "missing": "required field is missing",
    "literal_error": "must be one of {expected}, got {input!r}",
    "string_pattern_mismatch": "must match {pattern}, got {input!r}",
    "too_long": "must have at most {max_length} items",
    "string_too_long": "must be at most {max_length} characters",
    "string_too_short": "must be at least {min_length} characters",
}


def error_message(err: Any) -> str:
    """One pydantic error as people read it (``must be ≤ 1000, got 5000``; pydantic's own text otherwise)."""
    template = _TEMPLATES.get(err["type"])
    ctx = dict(err.get("ctx") or {})
    if template:
        try:
            return template.format(input=err.get("input"), **ctx)
        except (KeyError, IndexError):
            pass
    msg = str(err["msg"])
    return msg[len("Value error, "):] if msg.startswith("Value error, ") else msg
