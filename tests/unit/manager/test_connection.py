"""kopf's credentials from a kubeconfig, and the connection-bounded session kopf logs in with."""

from __future__ import annotations

from pathlib import Path

import kopf
from lightkube import KubeConfig

from flexinfer.manager.connection import bounded_session, connection_info
from flexinfer.manager.operator import PATCH_CONNECTIONS, WATCHES, connection_limit


def kubeconfig(tmp_path: Path) -> KubeConfig:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    return KubeConfig.from_dict({
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"tokenFile": str(token)}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ops"}}],
        "current-context": "x",
    })


def test_the_token_file_is_read_into_bearer_credentials(tmp_path: Path) -> None:
    info = connection_info(kubeconfig(tmp_path))
    assert (info.server, info.scheme, info.token, info.default_namespace) == (
        "https://127.0.0.1:6443", "Bearer", "s3cret", "ops")


async def test_kopf_logs_in_with_a_session_bounded_to_its_watches_plus_patches(tmp_path: Path) -> None:
    limit = connection_limit(namespaces=3)
    assert limit == len(WATCHES) * 3 + PATCH_CONNECTIONS and connection_limit(0) == len(WATCHES) + PATCH_CONNECTIONS
    credentials = bounded_session(connection_info(kubeconfig(tmp_path)), limit)
    try:
        assert isinstance(credentials, kopf.AiohttpSession)
        assert (credentials.server, credentials.default_namespace) == ("https://127.0.0.1:6443", "ops")
        session = credentials.aiohttp_session
        assert session.connector is not None and session.connector.limit == limit
        assert session.headers["Authorization"] == "Bearer s3cret"
    finally:
        await credentials.aiohttp_session.close()
