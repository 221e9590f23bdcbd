"""The one place that reads the process environment.

Everything else receives an immutable snapshot (``Environment``) and parses the part it owns with pure
functions (``flexinfer.core.controller_defaults``, ``flexinfer.proxy.config``,
``flexinfer.observability.tracing``), so tests pass plain dicts instead of patching ``os.environ``. They all
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
    """Parse a ``KEY=VALUE`` file (``#`` comments, optional quotes) such as ``flexinfer render --env-file``."""
    values: dict[str, str] = {}
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):]
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{path}:{number}: expected KEY=VALUE, got {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return values
