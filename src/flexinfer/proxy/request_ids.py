"""Request ids: the proxy owns ``X-Request-ID``.

A client's id is used (forwarded to the model server and echoed in the response) when a model server accepts
it: a UUID (llama.cpp's server answers 400 with an empty body to anything else). Otherwise the proxy
generates a UUID4 and keeps the client's value, bounded and made safe, for the log and the request span
(``request.client_id``). Used by ``handler.py``.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from flexinfer.core.errors import echo_safe

REQUEST_ID_HEADER = "X-Request-ID"
MAX_CLIENT_ID = 128
"""Characters of an unusable client id kept for logs and spans."""
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32}")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestId:
    """The id a request is handled under, and the client's own value when it could not be used."""

    value: str
    client_value: str | None = None


def request_id(headers: Mapping[str, str]) -> RequestId:
    """The request's id (see the module docstring)."""
    given = headers.get(REQUEST_ID_HEADER)
    if given is None:
        return RequestId(str(uuid.uuid4()))
    stripped = given.strip()
    if _UUID.fullmatch(stripped):
        return RequestId(stripped)
    chosen = RequestId(str(uuid.uuid4()), echo_safe(repr(given), MAX_CLIENT_ID))
    log.info("client request id %s is not a UUID; handling the request as %s", chosen.client_value, chosen.value)
    return chosen
