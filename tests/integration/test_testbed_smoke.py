"""Smoke test for the kube testbed: a real kube-apiserver starts, serves kubectl, and stops cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.kube_testbed import KubeTestbed

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def test_apiserver_roundtrips_namespace_and_configmap(tmp_path: Path) -> None:
    testbed = KubeTestbed(tmp_path / "kube").start()
    pids = testbed.pids()
    try:
        assert set(pids) == {"etcd", "kube-apiserver"}
        assert testbed.server is not None and testbed.server.startswith("https://127.0.0.1:")
        assert testbed.token == "test-token"

        testbed.kubectl("create", "namespace", "smoke")
        testbed.kubectl("-n", "smoke", "create", "configmap", "demo", "--from-literal=greeting=hello")
        cm = testbed.kubectl_json("-n", "smoke", "get", "configmap", "demo")

        assert cm["data"] == {"greeting": "hello"}
        assert cm["metadata"]["namespace"] == "smoke"
        assert cm["metadata"]["resourceVersion"]
    finally:
        testbed.stop()
    assert not any(_alive(pid) for pid in pids.values())
    assert not (tmp_path / "kube").exists()


def test_controller_manager_provides_service_accounts_and_namespace_deletion(tmp_path: Path) -> None:
    with KubeTestbed(tmp_path / "kube", with_controller_manager=True) as testbed:
        assert "kube-controller-manager" in testbed.pids()
        testbed.kubectl("create", "namespace", "doomed")
        # serviceaccount controller: every namespace gets a "default" ServiceAccount
        testbed.kubectl(
            "-n", "doomed", "wait", "--for=jsonpath={.metadata.name}=default", "serviceaccount/default", "--timeout=60s"
        )
        # namespace controller: deletion finalizes instead of hanging in Terminating
        testbed.kubectl("delete", "namespace", "doomed", "--wait=true", "--timeout=90s", timeout=120)
        gone = testbed.kubectl("get", "namespace", "doomed", check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr
