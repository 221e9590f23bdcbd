"""The one place that reads the process environment.

Everything else receives an immutable snapshot (``Environment``) and parses the part it owns with pure
functions (``flexinfer.core.controller_defaults``, ``flexinfer.proxy.config``,
``flexinfer.observability.tracing``), so tests pass plain dicts instead of patching the process environment. They all
parse through ``flexinfer.core.envvalues.EnvReader``; ``warn`` is the sink for the values that fall back to
their default (a WARNING on the ``flexinfer.settings`` logger naming the variable, the value and the default).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

Environment = Mapping[str, str]
log = logging.getLogger("flexinfer.settings")


def warn(message: str) -> None:
    """Log one settings warning (an unparsable value that falls back to its default)."""
    log.warning("%s", message)


def environment() -> Environment:
    """A read-only snapshot of the process environment, taken once at start-up."""
    return MappingProxyType(dict(os.environ))


def read_env_file(path: str | Path) -> dict[str, str]:
    """Parse a dotenv file such as ``flexinfer render --env-file`` (python-dotenv's grammar: ``#`` comments,
    ``export``, single/double quotes with escapes, multi-line quoted values). Strict where python-dotenv only
    logs: a line that is not ``KEY=VALUE`` is a ``ValueError`` naming ``path:line``. ``${VAR}`` is kept
    literally (no interpolation), so a rendering never depends on the caller's shell."""
    from dotenv.parser import parse_stream  # only ``render --env-file`` reads a file; keeps CLI start-up light

    values: dict[str, str] = {}
    with Path(path).open(encoding="utf-8") as stream:
        for binding in parse_stream(stream):
            if binding.key is None and not binding.error:
                continue  # blank line or comment
            if binding.error or binding.key is None or binding.value is None:
                text = binding.original.string  # starts with the blank lines before the statement
                line = binding.original.line + text[:len(text) - len(text.lstrip())].count("\n")
                raise ValueError(f"{path}:{line}: expected KEY=VALUE, got {text.strip()!r}")
            values[binding.key] = binding.value
    return values
