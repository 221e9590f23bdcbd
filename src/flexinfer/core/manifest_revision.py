"""The revision of a manifest text: a short, stable name for the exact bytes a configuration was loaded from.

``flexinfer serve`` shows the revision of the manifests in force (``/admin/status`` → ``config.revision``:
``flexinfer.local.reloading``), so a client that pushed a text (``PUT /admin/manifests``) or wrote the files can
tell whether that text is the one in force. Pure; called by the reloader and the start-up of ``serve``.
"""

from __future__ import annotations

import hashlib

PREFIX = "sha256:"
HEX_DIGITS = 32
"""Hex digits kept of the SHA-256 digest (128 bits: no accidental collision between configurations)."""


def manifest_revision(text: bytes) -> str:
    """``sha256:`` and the first 32 hex digits of the SHA-256 of ``text`` (the bytes, not a parsed form)."""
    return PREFIX + hashlib.sha256(text).hexdigest()[:HEX_DIGITS]
