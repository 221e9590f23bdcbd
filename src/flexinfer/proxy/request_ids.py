"""Request ids: the proxy owns ``X-Request-ID``.

A client's id is used (forwarded to the model server and echoed in the response) when a model server accepts
it: a UUID (llama.cpp's server answers 400 with an empty body to anything else). Otherwise the proxy
generates a UUID4 and keeps the client's value, bounded and made safe, for the log and the request span
(``request.client_id``). Generated ids come from the ``random`` module's generator (seeded by the OS,
reseeded after a fork): they correlate lines and are not secrets, and one call costs less than a system call
and a ``uuid.UUID`` object per request. Used by ``handler.py``.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass

from flexinfer.core.errors import echo_safe

REQUEST_ID_HEADER = "X-Request-ID"
MAX_CLIENT_ID = 128
"""Characters of an unusable client id kept for logs and spans."""
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32}")

log = logging.getLogger(__name__)
_VERSION_MASK = ~((0xF000 << 64) | (0xC000 << 48))
_VERSION_4 = (0x4000 << 64) | (0x8000 << 48)


def new_request_id() -> str:
    """A random (version 4, RFC 9562 variant) UUID in its canonical form."""
    digits = f"{random.getrandbits(128) & _VERSION_MASK | _VERSION_4:032x}"
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


@dataclass(frozen=True, slots=True)
class RequestId:
    """The id a request is handled under, and the client's own value when it could not be used."""

    value: str
    client_value: str | None = None


def request_id(headers: Mapping[str, str]) -> RequestId:
    """The request's id (see the module docstring)."""
    given = headers.get(REQUEST_ID_HEADER)
    if given is None:
        return RequestId(new_request_id())
    stripped = given.strip()
    if _UUID.fullmatch(stripped):
        return RequestId(stripped)
    chosen = RequestId(new_request_id(), echo_safe(repr(given), MAX_CLIENT_ID))
    log.info("client request id %s is not a UUID; handling the request as %s", chosen.client_value, chosen.value)
    return chosen
