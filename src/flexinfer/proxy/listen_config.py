"""Where ``flexinfer serve`` and ``flexinfer proxy`` listen: ``--host``/``--port``, else ``FLEXINFER_HOST``/
``FLEXINFER_PORT`` (as ``OLLAMA_HOST`` works for Ollama), else the command's default. Pure; the CLI passes
the environment snapshot. A bad port is an error naming its variable.
"""

from __future__ import annotations

from collections.abc import Mapping

from flexinfer.core.envvalues import EnvVar
from flexinfer.core.errors import ConfigError

HOST = "FLEXINFER_HOST"
PORT = "FLEXINFER_PORT"
DEFAULT_PORT = 8080

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(HOST, "127.0.0.1", "Listen address of `serve` (`proxy`: all interfaces); `--host` wins."),
    EnvVar(PORT, str(DEFAULT_PORT), "Listen port (0 picks a free one); `--port` wins."),
)


def listen_address(env: Mapping[str, str], *, host: str | None, port: int | None,
                   default_host: str) -> tuple[str, int]:
    """The (host, port) to bind: each flag given wins over its variable, which wins over the default."""
    chosen_host = host or env.get(HOST, "").strip() or default_host
    if port is not None:
        return chosen_host, port
    text = env.get(PORT, "").strip()
    if not text:
        return chosen_host, DEFAULT_PORT
    if not text.isdigit() or int(text) > 65535:
        raise ConfigError(f"{PORT}={text!r}: expected a TCP port from 0 to 65535")
    return chosen_host, int(text)
