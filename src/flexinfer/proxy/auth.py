"""Optional bearer-token authentication for the proxy's API routes.

Constant-time comparison (``hmac.compare_digest``); the token is never logged or echoed. Called by
``handler.py`` before anything else about the request is read.
"""

from __future__ import annotations

import hmac

from flexinfer.core.errors import UnauthorizedError

_SCHEME = "bearer "


class BearerAuth:
    """Checks ``Authorization: Bearer <token>`` against the configured token (disabled when token is empty)."""

    __slots__ = ("_token",)

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def check(self, authorization: str | None) -> None:
        """Raise ``UnauthorizedError`` unless auth is off or the header carries the right token."""
        if self._token is None:
            return
        header = authorization or ""
        if header[: len(_SCHEME)].lower() != _SCHEME:
            raise UnauthorizedError("missing bearer token (Authorization: Bearer <token>)")
        presented = header[len(_SCHEME):].strip().encode()
        if not hmac.compare_digest(presented, self._token):
            raise UnauthorizedError("invalid API key")
