"""Session fixtures of the real-node journey: the node (hack/kube-node), the images built offline and
imported into its containerd (hack/build-images), and the chart installed as an operator would.

The modules run in file order (test_1_… to test_9_…), each one a step of the operator's journey; the last
asserts that the egress guard dropped nothing. The fixtures are package-scoped: a node started here is stopped
right after the last real-node test, before the rest of the suite runs. Timings are printed at the end.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import real_node
from support.helm_chart import CHART_DIR, Helm, pinned_helm
from support.real_node import IMAGE_VALUES, NAMESPACE, RELEASE, TIMINGS, WEIGHTS_CLAIM, RealNode


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.realnode)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        terminalreporter.write_sep("-", "real-node timings")
        for step, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{step:<50} {seconds:9.3f} s")


@pytest.fixture(scope="package")
def node() -> Iterator[RealNode]:
    reason = real_node.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    began = time.monotonic()
    tars = real_node.build_images("flexinfer", "llamacpp")
    TIMINGS["images (build or cache hit)"] = time.monotonic() - began
    node = real_node.start()
    TIMINGS["node up"] = node.timings["up"]
    began = time.monotonic()
    node.import_images(*tars)
    TIMINGS["image import"] = time.monotonic() - began
    try:
        yield node
    finally:
        if node.started:
            TIMINGS["node down"] = real_node.stop()


@pytest.fixture(scope="package")
def helm(node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return pinned_helm(tmp_path_factory.mktemp("helm")).with_kubeconfig(node.kubeconfig)


@pytest.fixture(scope="package")
def release(node: RealNode, helm: Helm) -> str:
    """README's `helm install` line verbatim (from the repository root), plus the image values and --wait."""
    install = next(c for c in real_node.readme_quickstart() if c.startswith("helm install "))
    args = shlex.split(install)[1:]
    assert args[:3] == ["install", RELEASE, "charts/flexinfer"] and args[args.index("-n") + 1] == NAMESPACE
    args[2] = str(CHART_DIR)
    helm.run("uninstall", RELEASE, "-n", NAMESPACE, "--wait", check=False, timeout=180)
    sets = [arg for value in IMAGE_VALUES for arg in ("--set", value)]
    began = time.monotonic()
    helm.run(*args, *sets, "--wait", "--timeout", "300s", timeout=330)
    TIMINGS["helm install --wait"] = time.monotonic() - began
    return RELEASE


@pytest.fixture(scope="package")
def weights(node: RealNode, release: str) -> Iterator[str]:
    """Tiny GGUF models (tiny-a.gguf, tiny-b.gguf) on a hostPath PV, bound to the claim WEIGHTS_CLAIM."""
    yield real_node.create_weights(node)
    # Pods still stopping hold the claim (pvc-protection): ask for the deletion, do not wait for it; the
    # node and its state go right after this package anyway.
    node.kubectl("delete", "pvc", WEIGHTS_CLAIM, "-n", NAMESPACE, "--wait=false", check=False)
    node.kubectl("delete", "pv", f"flexinfer-{WEIGHTS_CLAIM}", "--wait=false", check=False)
