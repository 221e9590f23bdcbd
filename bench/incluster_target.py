"""The ``proxy`` target of ``bench/proxy_overhead.py`` (``--in-cluster``): the real ``flexinfer proxy`` command
against a real kube-apiserver, with its watch-driven catalog.

``in_cluster_proxy(upstream, directory, src)`` starts etcd + kube-apiserver on loopback (the project's apiserver
testbed, ``tests/support/kube_testbed.py``; the binaries are built on first use), installs the chart's CRDs
and creates, in namespace ``default``, the two Models the ``serve`` target has: ``bench`` (source
``HF://bench``: the backend's model name is the source's id, ``bench``, so no body is rewritten) and ``bench-rw``
(``spec.config.servedModelName: bench-served``, so the body's ``model`` is rewritten). Their status is
written as the manager writes it for a running replica: ``phase: Ready`` and ``endpoint`` = the benchmark's
one upstream, which is where the proxy forwards a Ready model's requests (``status.endpoint``; the test-only
endpoint-override annotation is not used). No manager runs: with both models Ready the proxy starts nothing;
it writes its usual ``ModelDemand`` report (demand and in-flight stamps) on the first request for a model
and then at most every few seconds, as it does in a cluster.

``flexinfer proxy --host 127.0.0.1 --port 0 --kubeconfig …`` runs from ``src`` (its listen line on stdout
gives the port; it has listed the Models before it listens); one request per model must answer 200 before
the context manager yields the proxy's URL and process. On exit, also on an error or Ctrl-C, the proxy is
stopped (SIGTERM, graceful drain), then the testbed's processes by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from lightkube import Client, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.kube_testbed import KubeTestbed

NAMESPACE = "default"
MODELS = (("bench", None), ("bench-rw", "bench-served"))
"""Model name and ``spec.config.servedModelName`` (``None``: the source's model id, ``bench``)."""
ModelResource = create_namespaced_resource("ai.flexinfer", "v1alpha2", "Model", "models")


def _create_ready_models(kubeconfig: Path, upstream: str) -> None:
    """The two Models, each Ready at ``upstream`` (the status a manager writes for a running replica)."""
    client = Client(KubeConfig.from_file(str(kubeconfig)), namespace=NAMESPACE)
    try:
        for name, served in MODELS:
            # ``parallel``: the benchmark's upstream takes any number of requests at once, as ``serve``'s
            # ``spec.config.command`` models declare (llama.cpp's default of 1 would queue c=64 in the proxy)
            config: dict[str, object] = {"parallel": 1024, **({"servedModelName": served} if served else {})}
            client.create(ModelResource.from_dict({
                "apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"backend": "llamacpp", "source": f"HF://{name}", "config": config}}))
            client.patch(ModelResource.Status, name, {"status": {"phase": "Ready", "endpoint": upstream}},
                         patch_type=PatchType.MERGE)
    finally:
        client.close()


def _start_proxy(kubeconfig: Path, src: Path, log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(src), "POD_NAMESPACE": NAMESPACE, "POD_NAME": "bench-proxy",
           "KUBECONFIG": str(kubeconfig)}
    with log.open("wb") as errors:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "flexinfer.cli.main", "proxy", "--host", "127.0.0.1", "--port", "0",
             "--kubeconfig", str(kubeconfig)],
            env=env, stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL)
    assert process.stdout is not None
    line = process.stdout.readline()  # "flexinfer proxy: listening on URL"; EOF if it exits first
    found = re.search(r"listening on (http://\S+)", line.decode(errors="replace"))
    if found is None:
        process.terminate()
        process.wait(60)
        raise RuntimeError(f"flexinfer proxy did not start (exit {process.returncode}); see {log}")
    return found.group(1), process


def _check_routes(url: str) -> None:
    """One answered request per model: the proxy routes both to the upstream before anything is measured."""
    for name, _ in MODELS:
        body = json.dumps({"model": name, "messages": [{"role": "user", "content": "hi"}]}).encode()
        request = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            if response.status != 200:
                raise RuntimeError(f"flexinfer proxy answered {response.status} for model {name}")


@contextlib.contextmanager
def in_cluster_proxy(upstream: str, directory: Path, src: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The running in-cluster proxy's URL and process, with both Models Ready at ``upstream`` (module docstring)."""
    with KubeTestbed(directory / "kube") as bed:
        bed.install_crds()
        assert bed.kubeconfig is not None
        _create_ready_models(bed.kubeconfig, upstream)
        url, process = _start_proxy(bed.kubeconfig, src, directory / "proxy.log")
        try:
            _check_routes(url)
            yield url, process
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                print("flexinfer proxy did not stop within 60s: killed")
                process.kill()
                process.wait()
