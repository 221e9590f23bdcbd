"""The manager's lifecycle series exist at zero as soon as it knows a Model (so ``increase()`` counts the first
swap, preemption and cold start) and disappear with the Model — against a real kube-apiserver."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.manager.client import ModelResource
from support.manager_harness import cluster, kube_testbed, manager_config, start_manager

pytestmark = pytest.mark.integration
__all__ = ["kube_testbed"]

SHARED = {"gpu": {"vendor": "amd", "shared": "gfx1100-0"}}


def sample(text: str, name: str, **labels: str) -> float | None:
    """One sample's value in Prometheus text, ``None`` when no such series exists."""
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_series_exist_at_zero_once_a_model_is_known_and_go_with_it(kube_testbed: Any) -> None:
    async with cluster(kube_testbed) as c:
        running = await start_manager(manager_config(c))
        try:
            await c.create_model("low", **SHARED)
            await c.create_model("high", **SHARED)
            await c.phase_is("low", "Idle")
            await c.phase_is("high", "Idle")
            text = await running.metrics()
            for model in ("low", "high"):
                assert sample(text, "flexinfer_model_swap_duration_seconds_count", model=model) == 0
                assert sample(text, "flexinfer_model_cold_start_duration_seconds_count", model=model) == 0
                assert sample(text, "flexinfer_model_startup_stage_duration_seconds_count", model=model,
                              stage="health") == 0
            for loser, winner in (("low", "high"), ("high", "low")):
                assert sample(text, "flexinfer_sharedgroup_preemptions_total", group="gfx1100-0",
                              **{"from": loser, "to": winner}) == 0

            await c.client.delete(ModelResource, "low", namespace=c.namespace)

            async def low_gone() -> str | None:
                text = await running.metrics()
                return None if '"low"' in text else text
            text = await c.wait_for(low_gone, what="every series naming low removed")
            assert sample(text, "flexinfer_model_swap_duration_seconds_count", model="high") == 0
        finally:
            assert await running.close() == 0
