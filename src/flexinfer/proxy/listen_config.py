"""Where ``flexinfer serve`` and ``flexinfer proxy`` listen: ``--host``/``--port``, else ``FLEXINFER_HOST``/
``FLEXINFER_PORT`` (as ``OLLAMA_HOST`` works for Ollama), else the command's default. Pure; the CLI passes
the environment snapshot. A bad port is an error naming its variable.
"""

from __future__ import annotations

from collections.abc import Mapping

from flexinfer.core.envvalues import EnvReader, EnvVar, Kind, Policy

HOST = "FLEXINFER_HOST"
PORT = "FLEXINFER_PORT"
DEFAULT_PORT = 8080
MAX_PORT = 65535

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(HOST, "127.0.0.1", "Listen address of `serve` (`proxy`: all interfaces); `--host` wins."),
    EnvVar(PORT, str(DEFAULT_PORT), "Listen port (0 picks a free one); `--port` wins.", Kind.INT),
)


def listen_address(env: Mapping[str, str], *, host: str | None, port: int | None,
                   default_host: str) -> tuple[str, int]:
    """The (host, port) to bind: each flag given wins over its variable, which wins over the default."""
    read = EnvReader(env)
    chosen_host = host or read.text(HOST, default_host)
    if port is not None:
        return chosen_host, port
    chosen_port = read.integer(PORT, DEFAULT_PORT, minimum=0)
    if chosen_port > MAX_PORT:
        return chosen_host, read.invalid(PORT, read.raw(PORT), f"above the maximum {MAX_PORT}", DEFAULT_PORT,
                                         Policy.STRICT)
    return chosen_host, chosen_port
