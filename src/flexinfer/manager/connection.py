"""How the manager reaches the API server: one kubeconfig source for both clients.

``load_kubeconfig`` picks ``--kubeconfig``, else ``KUBECONFIG``, else the in-cluster service account
(when ``KUBERNETES_SERVICE_HOST`` is set), else ``~/.kube/config``; the lightkube client uses it
directly and ``connection_info`` turns it into kopf credentials (the token file is re-read on every kopf
login, so rotated service-account tokens keep working). ``bounded_session`` hands kopf those credentials as
an aiohttp session with a connection limit: kopf's own session is unlimited and opens one TLS connection per
concurrent request, i.e. about one per object when a large fleet starts (~300 KB of memory each). Used by
``flexinfer.manager.program`` and ``flexinfer.manager.operator``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import kopf
from lightkube import KubeConfig
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core.exceptions import ConfigError as LightkubeConfigError

from flexinfer.core.errors import ConfigError
from flexinfer.runtime.kube_connections import kube_connector

DEFAULT_KUBECONFIG = Path.home() / ".kube" / "config"


def load_kubeconfig(path: str | None, env: Mapping[str, str]) -> KubeConfig:
    """The cluster configuration (see the module docstring); ``ConfigError`` naming the source."""
    source = path or env.get("KUBECONFIG", "").split(":")[0] or None
    try:
        if source:
            return KubeConfig.from_file(source)
        if env.get("KUBERNETES_SERVICE_HOST"):
            return KubeConfig.from_service_account()
        return KubeConfig.from_file(DEFAULT_KUBECONFIG)
    except (LightkubeConfigError, OSError, KeyError, ValueError) as error:
        where = source or ("the in-cluster service account" if env.get("KUBERNETES_SERVICE_HOST")
                           else str(DEFAULT_KUBECONFIG))
        raise ConfigError(f"cannot load the Kubernetes configuration from {where}: {error}") from None


def _data(text: str | None) -> bytes | None:
    return base64.b64decode(text) if text else None


def _path(config: SingleConfig, name: str | None) -> str | None:
    return str(config.abs_file(name)) if name else None


def connection_info(kubeconfig: KubeConfig) -> kopf.ConnectionInfo:
    """kopf credentials equivalent to ``kubeconfig``'s current context."""
    config = kubeconfig.get()
    if config is None:
        raise ConfigError("the Kubernetes configuration has no current context")
    cluster, user = config.cluster, config.user
    token = user.token if user is not None else None
    if user is not None and user.token_file:
        token = Path(str(config.abs_file(user.token_file))).read_text(encoding="utf-8").strip()
    ca_data = _data(cluster.certificate_auth_data)
    return kopf.ConnectionInfo(
        server=cluster.server,
        ca_path=None if ca_data else _path(config, cluster.certificate_auth),
        ca_data=ca_data,
        insecure=cluster.insecure or None,
        scheme="Bearer" if token else None,
        token=token,
        username=user.username if user is not None else None,
        password=user.password if user is not None else None,
        certificate_path=_path(config, user.client_cert) if user is not None else None,
        certificate_data=_data(user.client_cert_data) if user is not None else None,
        private_key_path=_path(config, user.client_key) if user is not None else None,
        private_key_data=_data(user.client_key_data) if user is not None else None,
        default_namespace=config.namespace,
    )


def bounded_session(info: kopf.ConnectionInfo, limit: int) -> kopf.AiohttpSession:
    """``info`` as kopf credentials on a session that keeps at most ``limit`` connections (call it inside the
    operator's event loop; kopf closes the session when it logs in again or stops)."""
    session = aiohttp.ClientSession(
        connector=kube_connector(info.as_ssl_context(), limit=limit),
        headers=info.as_http_headers(), proxy=info.proxy_url, trust_env=info.trust_env,
    )
    return kopf.AiohttpSession(server=info.server, default_namespace=info.default_namespace,
                               aiohttp_session=session)
