"""A cluster upgraded without the new ModelDemand CRD yet: the manager starts and honours demand written on
the Models (Go or older proxies); once the CRD is applied it honours the proxies' ModelDemand reports too.
Own testbed (the shared one has every CRD)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.kube_testbed import CRD_DIR, KubeTestbed
from support.manager_harness import cluster, manager_config, start_manager

pytestmark = pytest.mark.integration
OLD_CRDS = ("ai.flexinfer_models.yaml", "ai.flexinfer_modelcaches.yaml", "ai.flexinfer_gpuleases.yaml")


@pytest.fixture(scope="module")
def old_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeTestbed]:
    testbed = KubeTestbed(Path(tmp_path_factory.mktemp("kube-old")) / "tb").start()
    try:
        for name in OLD_CRDS:
            testbed.kubectl("apply", "-f", str(CRD_DIR / name))
        testbed.kubectl("wait", "--for=condition=established", "--timeout=60s", "crd", "--all")
        yield testbed
    finally:
        testbed.stop()


async def test_the_manager_runs_without_the_modeldemand_crd_and_picks_it_up_later(old_testbed: Any) -> None:
    async with cluster(old_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await c.create_model("legacy")
            await c.phase_is("legacy", "Idle")
            await c.demand("legacy", legacy=True)
            await c.replicas_are("legacy", 1)

            old_testbed.kubectl("apply", "-f", str(CRD_DIR / "ai.flexinfer_modeldemands.yaml"))
            old_testbed.kubectl("wait", "--for=condition=established", "--timeout=60s",
                                "crd/modeldemands.ai.flexinfer")
            await c.create_model("fresh")
            await c.phase_is("fresh", "Idle")
            await c.demand("fresh")
            await c.replicas_are("fresh", 1)
        finally:
            assert await running.close() == 0
