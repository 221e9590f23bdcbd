"""A small blocking client for the admin API of a running ``flexinfer serve`` (used by ``flexinfer status``,
``logs``, ``load`` and ``unload``). Failures become one-line ``FlexInferError`` messages."""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from flexinfer.api.errors import FlexInferError
from flexinfer.settings import environment

DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT = 10.0


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """``--url`` and ``--token`` (default: ``FLEXINFER_ADMIN_TOKEN``, else ``PROXY_AUTH_TOKEN``, from the
    environment)."""
    parser.add_argument("--url", default=DEFAULT_URL,
                        help=f"the server's base URL, http:// assumed without a scheme (default {DEFAULT_URL})")
    parser.add_argument("--token", default=None,
                        help="bearer token (default: $FLEXINFER_ADMIN_TOKEN, else $PROXY_AUTH_TOKEN)")


def get_json(args: argparse.Namespace, path: str, query: dict[str, str] | None = None) -> Any:
    """GET ``path`` from the admin API; the decoded JSON body."""
    return call_json(args, "GET", path, query)


def post_json(args: argparse.Namespace, path: str, query: dict[str, str] | None = None) -> Any:
    """POST (no body) to ``path`` of the admin API; the decoded JSON body."""
    return call_json(args, "POST", path, query)


def call_json(args: argparse.Namespace, method: str, path: str, query: dict[str, str] | None = None) -> Any:
    """One admin API call; the decoded JSON body (``FlexInferError`` with the server's message otherwise)."""
    import urllib.error  # with urllib.request: for a call, not for ``--help`` or completion
    import urllib.request

    url = base_url(args.url) + path + ("?" + urllib.parse.urlencode(query) if query else "")
    env = environment()
    token = args.token if args.token is not None else (env.get("FLEXINFER_ADMIN_TOKEN", "").strip()
                                                       or env.get("PROXY_AUTH_TOKEN", ""))
    request = urllib.request.Request(url, method=method,
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise FlexInferError(f"{url}: {exc.code} {error_message(exc.read())}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FlexInferError(f"cannot reach flexinfer serve at {args.url}: {reason}") from None


def base_url(text: str) -> str:
    """``--url`` as a base URL: ``http://`` is assumed when no scheme is given (``localhost:8080``)."""
    url = text.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FlexInferError(f"--url {text!r}: expected http(s)://HOST[:PORT] or HOST[:PORT]")
    return url


def error_message(body: bytes) -> str:
    """The ``error.message`` of an OpenAI error envelope, else the raw text."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace").strip()
