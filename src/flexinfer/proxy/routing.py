"""Which model a request is for, and what to forward: the proxy's request routing rules.

Sources in order (spec §6.3 step 4): the ``X-Model-ID`` header; a ``/model/<name>/…`` path prefix (stripped
before forwarding); the JSON body's top-level ``model``, or for a ``multipart/form-data`` body its ``model``
field (``form_model.py``). None → 400 ``missing_required_field``. Every source accepts the same forms (a name,
an alias or ``namespace/name``; the catalog resolves them); in the path, ``/model/<namespace>/<name>/…``
names a model by its key when the catalog confirms that key (``path_key_candidate``), else the first segment
is the name. A JSON object body must pass the proxy's own checks (``field_checks.py``: parameter types and
counts, lone surrogates), else 400. A JSON body is rewritten so its ``model`` is
the backend's served model name (a byte-level splice, ``json_body.py``: the body is scanned once and never
re-serialized); a form body is forwarded unchanged. Pure functions over bytes and strings;
called by ``handler.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from flexinfer.core.errors import BadRequestError
from flexinfer.proxy.field_checks import check_body
from flexinfer.proxy.form_model import form_boundary, form_field
from flexinfer.proxy.json_body import JsonBody, NotJsonObject, scan, set_model

MODEL_HEADER = "X-Model-ID"
WORKLOAD_CLASS_HEADER = "X-FlexInfer-Internal-Workload-Class"
"""``background``: the request may only use an already-Ready model (spec §6.3 step 1); never forwarded."""
PATH_PREFIX = "/model/"


class RoutedRequest(NamedTuple):
    """A request's model name, where it came from, and the upstream path (prefix stripped, query kept)."""

    model: str
    source: str
    """``header``, ``path``, ``body`` (JSON) or ``form`` (multipart)."""
    upstream_path: str
    payload: JsonBody | None
    """The JSON body's top-level fields when it is an object, else ``None`` (then the body is forwarded
    untouched)."""

    @property
    def streaming(self) -> bool:
        """True when the client asked for an SSE stream (``"stream": true``)."""
        return bool(self.payload is not None and self.payload.stream is True)


def route(headers: Mapping[str, str], path: str, query: str, body: bytes,
          path_key: str | None = None) -> RoutedRequest:
    """Resolve the requested model name; raise ``BadRequestError`` when there is none. ``path_key`` is the
    ``namespace/name`` the caller confirmed for a ``/model/<namespace>/<name>/…`` path."""
    operation, path_model = split_model_prefix(path, path_key)
    upstream_path = f"{operation}?{query}" if query else operation
    header_model = headers.get(MODEL_HEADER, "").strip()
    boundary = form_boundary(headers.get("Content-Type", ""))
    named = bool(header_model or path_model)
    payload = None if boundary is not None else _payload(body, required=not named)
    if payload is not None:
        check_body(body, payload, operation)
    if header_model:
        return RoutedRequest(header_model, "header", upstream_path, payload)
    if path_model:
        return RoutedRequest(path_model, "path", upstream_path, payload)
    if boundary is not None:
        form_model = form_field(boundary, body)
        if form_model:
            return RoutedRequest(form_model, "form", upstream_path, None)
    else:
        body_model = payload.model if payload is not None else None
        if isinstance(body_model, str) and body_model.strip():
            return RoutedRequest(body_model.strip(), "body", upstream_path, payload)
    raise BadRequestError(
        "you must provide a model parameter (JSON body `model`, multipart form field `model`, header X-Model-ID, "
        "or /model/<name>/ prefix)",
        code="missing_required_field", param="model",
    )


def is_background(headers: Mapping[str, str]) -> bool:
    """Whether the request declares the ``background`` workload class."""
    return headers.get(WORKLOAD_CLASS_HEADER, "").strip().lower() == "background"


def path_key_candidate(path: str) -> str | None:
    """``namespace/name`` from ``/model/<namespace>/<name>/…`` (whether it is a model key is the catalog's call)."""
    if not path.startswith(PATH_PREFIX):
        return None
    first, second = [*path[len(PATH_PREFIX):].split("/", 2), "", ""][:2]
    return f"{first}/{second}" if first and second else None


def split_model_prefix(path: str, path_key: str | None = None) -> tuple[str, str | None]:
    """``/model/<name>/rest`` → (``/rest``, name); with ``path_key`` = ``namespace/name``,
    ``/model/<namespace>/<name>/rest`` → (``/rest``, ``namespace/name``); any other path → (path, None)."""
    if not path.startswith(PATH_PREFIX):
        return path, None
    if path_key is not None and path_key == path_key_candidate(path):
        rest = path[len(PATH_PREFIX) + len(path_key):]
        return rest or "/", path_key
    name, sep, rest = path[len(PATH_PREFIX):].partition("/")
    if not name:
        return path, None
    return "/" + rest if sep else "/", name


def rewrite_body(body: bytes, payload: JsonBody | None, served_model_name: str) -> bytes:
    """The body with its ``model`` set to the served model name (unchanged when not a JSON object or when
    it already names the served model)."""
    if payload is None or payload.model == served_model_name:
        return body
    return set_model(body, payload, served_model_name)


def _payload(body: bytes, required: bool) -> JsonBody | None:
    """Scan a JSON object body; a body that is not JSON is an error only when the model must come from it."""
    stripped = body.lstrip()
    if not stripped.startswith(b"{"):
        if required and stripped:
            raise BadRequestError("request body is not a JSON object", param="model")
        return None
    try:
        return scan(body)
    except NotJsonObject:
        if required:
            raise BadRequestError("request body is not valid JSON") from None
        return None
