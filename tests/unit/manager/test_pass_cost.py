"""The work of one reconcile pass does not grow with what lies outside its unit.

One pass over a shared group of ten Models is run twice: in a store that holds only that group, and in one that
also holds 30 other groups (each with a GPULease) and 30 exclusive Models in the same namespace, a proxy's
``ModelDemand`` report of every Model there, and a ModelCache, a GPULease of a group of the same name and a
ModelDemand in each of 30 other namespaces. The pass must
make the same API calls and execute the same number of lines of FlexInfer code (counted with ``sys.settrace``,
a measure of work that no machine load can change): any scan over the store's other objects, a cache
rebuilt per pass or a series per Model made by the metrics it calls shows up as more lines.

A pass writes each member at most three times (its Deployment, its Service, one status patch); what it wrote,
coming back through the watch, asks for nothing more (the queue runs the one follow-up pass of a pass that wrote,
tests/unit/manager/test_manager_queue.py), nor does kopf's finalizer, and the follow-up pass writes nothing: fewer
writes and parses per Model are what let the manager reconcile 1,000 Models within the benchmark's budget
(docs/performance.md)."""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, cast

from prometheus_client import CollectorRegistry

import flexinfer
from flexinfer.api.conventions import FINALIZER
from flexinfer.cluster_proxy.demand import rfc3339
from flexinfer.core.controller_defaults import ControllerDefaults
from flexinfer.core.model_status.plan import ManagerPolicy
from flexinfer.manager.client import KubeApi
from flexinfer.manager.reconciler import Reconciler
from flexinfer.manager.store import Store, Unit
from flexinfer.observability.metrics import LifecycleMetrics
from support.recording_kube import RecordingKubeApi
from support.resource_builders import model_doc

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
GROUP = Unit("ns", "g000", True)
MEMBERS = 10
OUTSIDE = 30
SOURCE = str(Path(flexinfer.__file__).parent)
Body = dict[str, Any]


def stored(doc: Body) -> Body:
    doc["metadata"]["resourceVersion"] = "1"
    return doc


def shared(name: str, namespace: str, group: str, priority: int) -> Body:
    return stored(model_doc(name, namespace, gpu={"vendor": "amd", "shared": group, "priority": priority}))


def demand(namespace: str, proxy: str, models: list[str]) -> Body:
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDemand",
            "metadata": {"name": proxy, "namespace": namespace, "resourceVersion": "1"},
            "spec": {"proxy": proxy, "renewTime": rfc3339(NOW),
                     "models": {m: {"lastActiveTime": rfc3339(NOW)} for m in models}}}


def lease(namespace: str, name: str, group: str) -> Body:
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "GPULease",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": {"group": group, "owner": "someone-else", "expiresAt": rfc3339(NOW)}}


def outside(store: Store) -> None:
    """Everything the pass over ``GROUP`` has no business reading."""
    names = []
    for g in range(1, OUTSIDE + 1):
        for i in range(MEMBERS):
            names.append(f"g{g:03d}-m{i}")
            store.put("Model", shared(names[-1], "ns", f"g{g:03d}", 100 + i))
        store.put("GPULease", lease("ns", f"l{g:03d}", f"g{g:03d}"))
        names.append(f"solo{g:03d}")
        store.put("Model", stored(model_doc(names[-1], "ns")))
    store.put("ModelDemand", demand("ns", "proxy-a", names + [f"m{i}" for i in range(MEMBERS)]))
    for n in range(OUTSIDE):
        namespace = f"other-{n:03d}"
        store.put("ModelCache", {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
                                 "metadata": {"name": "c", "namespace": namespace, "resourceVersion": "1"},
                                 "spec": {"source": "HF://org/model"}})
        store.put("GPULease", lease(namespace, "l", GROUP.name))
        store.put("ModelDemand", demand(namespace, "proxy-b", [f"m{i}" for i in range(MEMBERS)]))


def counting_lines(counter: list[int]) -> Callable[[FrameType, str, Any], Any]:
    """A ``sys.settrace`` function that counts the lines executed in FlexInfer's own modules."""
    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            counter[0] += 1
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(SOURCE) else None
    return tracer


async def traced(work: Callable[[], Awaitable[None]]) -> int:
    counter = [0]
    sys.settrace(counting_lines(counter))
    try:
        await work()
    finally:
        sys.settrace(None)
    return counter[0]


def reconciler_of(store: Store) -> tuple[Reconciler, RecordingKubeApi]:
    api = RecordingKubeApi(store)
    reconciler = Reconciler(cast(KubeApi, api), store, ControllerDefaults(), ManagerPolicy(),
                            sink=LifecycleMetrics(CollectorRegistry()),
                            scope=lambda *_: contextlib.nullcontext(),  # type: ignore[arg-type,return-value]
                            wake=lambda *_: None, clock=lambda: NOW)
    return reconciler, api


async def one_pass(with_outside: bool) -> tuple[int, list[tuple[str, ...]]]:
    """Lines executed and API calls made by the first pass over ``GROUP``."""
    store = Store(clock=lambda: NOW)
    for i in range(MEMBERS):
        store.put("Model", shared(f"m{i}", "ns", GROUP.name, 100 + i))
    if with_outside:
        outside(store)
    else:
        store.put("ModelDemand", demand("ns", "proxy-a", [f"m{i}" for i in range(MEMBERS)]))
    reconciler, api = reconciler_of(store)
    lines = await traced(lambda: reconciler.reconcile(GROUP))
    return lines, api.calls


async def test_a_pass_over_a_group_does_the_same_work_whatever_else_the_store_holds() -> None:
    alone_lines, alone_calls = await one_pass(with_outside=False)
    crowded_lines, crowded_calls = await one_pass(with_outside=True)
    assert crowded_calls == alone_calls
    assert [c[:2] for c in alone_calls[:2]] == [("apply", "Deployment"), ("apply", "Service")]
    assert crowded_lines == alone_lines, (
        f"one pass over {MEMBERS} Models ran {alone_lines} lines alone and {crowded_lines} with "
        f"{OUTSIDE * (MEMBERS + 1)} other Models and {OUTSIDE} other namespaces in the store")


async def test_a_pass_writes_each_member_once_and_its_echoes_ask_for_nothing() -> None:
    """The first pass over a fresh group writes, per member, its Deployment, its Service and one status patch.
    The watch then delivering those same versions, or a Model that only gained kopf's finalizer, asks for no pass
    and costs no new parse; the follow-up pass over the unchanged unit writes nothing. A change of the spec
    still asks."""
    store = Store(clock=lambda: NOW)
    names = [f"m{i}" for i in range(MEMBERS)]
    for i, name in enumerate(names):
        store.put("Model", shared(name, "ns", GROUP.name, 100 + i))
    reconciler, api = reconciler_of(store)
    await reconciler.reconcile(GROUP)
    assert api.calls == [call for name in names for call in (
        ("apply", "Deployment", name, "0"), ("apply", "Service", name, ""), ("status", name, "Idle"))]

    for name in names:
        stored = store.model("ns", name)
        assert stored is not None
        echoes = {"Model": stored.body, "Deployment": store.deployment("ns", name),
                  "Service": store.service("ns", name)}
        for kind, body in echoes.items():
            assert body is not None
            assert store.put(kind, copy.deepcopy(body)) == [], f"the echo of {kind} {name}"
        finalized = copy.deepcopy(stored.body)
        finalized["metadata"].update(finalizers=[FINALIZER], resourceVersion=str(api.rv + 1))
        assert store.put("Model", finalized) == [], f"{name} with kopf's finalizer"
        kept = store.model("ns", name)
        assert kept is not None and kept.body is finalized and kept.model is stored.model
    await reconciler.reconcile(GROUP)
    assert len(api.calls) == 3 * MEMBERS

    changed = copy.deepcopy(finalized)
    changed["metadata"]["resourceVersion"] = str(api.rv + 2)
    changed["spec"]["gpu"]["priority"] = 500
    assert store.put("Model", changed) == [GROUP]
