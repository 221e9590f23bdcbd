"""Raw HTTP over a socket, for requests no HTTP client would send (malformed heads, HTTP/0.9 lines).

Used by the integration tests of the proxy's front server (``test_serve_client_errors``,
``test_serve_openai_surface``).
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def raw_exchange(url: str, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` to ``url``'s host and port and read until the server closes the connection."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)
