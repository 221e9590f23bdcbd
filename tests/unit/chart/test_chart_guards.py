"""Chart guards: values the chart refuses (several managers without leader election) and ``extraEnv``
merged with the chart-set env (the user's value wins; never two entries of one name)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from support.helm_chart import Helm, HelmError, container, find

COMPONENTS = (("controller", "manager"), ("proxy", "proxy"))


DEPLOYMENTS = {"manager": "flexinfer-controller", "proxy": "flexinfer-proxy"}


def env_list(docs: list[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    return list(container(find(docs, "Deployment", DEPLOYMENTS[component]), component).get("env", []))


def test_several_managers_without_leader_election_are_refused(helm: Helm) -> None:
    with pytest.raises(HelmError, match=re.escape("controller.replicas=2 needs controller.leaderElect=true")):
        helm.template("controller.replicas=2", "controller.leaderElect=false")


@pytest.mark.parametrize(("replicas", "elect"), [(1, "false"), (2, "true"), (3, "true")])
def test_allowed_replica_and_election_combinations_render(helm: Helm, replicas: int, elect: str) -> None:
    docs = helm.template(f"controller.replicas={replicas}", f"controller.leaderElect={elect}")
    assert find(docs, "Deployment", DEPLOYMENTS["manager"])["spec"]["replicas"] == replicas


@pytest.mark.parametrize(("key", "component"), COMPONENTS)
def test_extra_env_repeating_a_chart_variable_replaces_it(helm: Helm, key: str, component: str) -> None:
    docs = helm.template(f"{key}.extraEnv[0].name=POD_NAMESPACE", f"{key}.extraEnv[0].value=pinned",
                         f"{key}.extraEnv[1].name=EXTRA", f"{key}.extraEnv[1].value=x")
    env = env_list(docs, component)
    names = [e["name"] for e in env]
    assert len(names) == len(set(names)), names
    by_name = {e["name"]: e for e in env}
    assert by_name["POD_NAMESPACE"] == {"name": "POD_NAMESPACE", "value": "pinned"}
    assert by_name["EXTRA"] == {"name": "EXTRA", "value": "x"}
    assert "POD_NAME" in by_name


def test_extra_env_overrides_a_value_rendered_from_values(helm: Helm) -> None:
    docs = helm.template("controller.extraEnv[0].name=DEFAULT_SHM_SIZE_LIMIT",
                         "controller.extraEnv[0].value=16Gi")
    shm = [e for e in env_list(docs, "manager") if e["name"] == "DEFAULT_SHM_SIZE_LIMIT"]
    assert shm == [{"name": "DEFAULT_SHM_SIZE_LIMIT", "value": "16Gi"}]


@pytest.mark.parametrize(("key", "component"), COMPONENTS)
def test_extra_env_naming_a_variable_twice_is_refused(helm: Helm, key: str, component: str) -> None:
    with pytest.raises(HelmError, match=re.escape(f"{key}.extraEnv names FOO twice")):
        helm.template(f"{key}.extraEnv[0].name=FOO", f"{key}.extraEnv[0].value=a",
                      f"{key}.extraEnv[1].name=FOO", f"{key}.extraEnv[1].value=b")
