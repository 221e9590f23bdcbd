"""Free loopback TCP ports for model servers.

The kernel picks an unused port (bind to port 0); the allocator remembers ports it handed out and not yet
got back, so two servers starting at the same time never get the same one. Used by
``flexinfer.local.engine``.
"""

from __future__ import annotations

import socket

from flexinfer.core.errors import EngineError

MAX_ATTEMPTS = 50


def probe_free_port(host: str = "127.0.0.1") -> int:
    """A port that nothing listens on right now (the kernel's choice)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class PortAllocator:
    """Hands out free ports on ``host`` and tracks which are in use by this process's children."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._taken: set[int] = set()

    @property
    def taken(self) -> frozenset[int]:
        """Ports currently handed out."""
        return frozenset(self._taken)

    def allocate(self) -> int:
        """A free port not already handed out; ``EngineError`` if the kernel keeps returning taken ones."""
        for _ in range(MAX_ATTEMPTS):
            try:
                port = probe_free_port(self.host)
            except OSError as exc:
                raise EngineError(f"cannot allocate a port on {self.host}: {exc}") from exc
            if port not in self._taken:
                self._taken.add(port)
                return port
        raise EngineError(f"no free port on {self.host} after {MAX_ATTEMPTS} attempts")

    def release(self, port: int) -> None:
        """Give a port back (idempotent)."""
        self._taken.discard(port)
