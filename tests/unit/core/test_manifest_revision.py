"""``manifest_revision``: ``sha256:`` and 32 hex digits of the bytes' SHA-256; any byte changes it."""

from __future__ import annotations

import hashlib
import re

from flexinfer.core.manifest_revision import manifest_revision


def test_the_revision_is_a_prefix_of_the_sha256_of_the_bytes() -> None:
    text = b"apiVersion: ai.flexinfer/v1alpha2\nkind: Model\n"
    revision = manifest_revision(text)
    assert re.fullmatch(r"sha256:[0-9a-f]{32}", revision)
    assert hashlib.sha256(text).hexdigest().startswith(revision.removeprefix("sha256:"))
    assert manifest_revision(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb924", "the well-known empty digest"


def test_every_byte_counts() -> None:
    text = b"metadata: {name: a}\n"
    assert manifest_revision(text) == manifest_revision(bytes(text))
    assert manifest_revision(text) != manifest_revision(text + b"\n")
    assert manifest_revision(text) != manifest_revision(text.replace(b"\n", b"\r\n"))
