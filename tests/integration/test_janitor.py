"""The janitor (`kfp-gpu gc`): it sweeps only orphans, the objects of runs whose GpuGang is gone, and never a run the
controller still owns.

Real control plane, real objects: a run's ledger ConfigMap, a balloon pod and a claimed KWOK node, written with the
controller's identity (controller-rbac.yaml); ``janitor.collect`` runs with its own (deploy/janitor-rbac.yaml), not as
cluster-admin. No step holds a heartbeat any more: the GpuGang is the run's liveness, and the controller releases it
when its owner is gone (tests/integration/test_controller.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kfp_gpu.cluster import balloons, ledger
from kfp_gpu.cluster.lease import JanitorLock
from kfp_gpu.cluster.nodes import claim, read_node
from kfp_gpu.errors import NotFound
from kfp_gpu.gang import api as gang
from kfp_gpu.ownership import LABEL_RUN_ID, Owner, label_safe
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps import janitor
from tests.integration.conftest import NodeFactory, scoped_namespace
from tests.integration.rbac_support import Identity
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TTL = 10.0  # the spec's minimum lease_ttl_s


def _hold(api: client.ApiClient, kube_api: client.ApiClient, ns: str, owner: Owner, node: str) -> None:
    """What a step holding capacity leaves in the cluster: a ledger, a balloon, a claimed node."""
    ledger.write(api, ns, owner, {"balloons": [balloons.balloon_name(owner.run_id, 0)]})
    balloons.create_balloons(api, ns, owner, 1, 8, "nvidia-h100-80gb", [])
    found = read_node(kube_api, node)
    assert found is not None and claim(api, found, owner.run_id, owner.lease_expires, namespace=ns)


def _held(kube_api: client.ApiClient, ns: str, run: str) -> dict[str, list[str]]:
    sel = f"{LABEL_RUN_ID}={label_safe(run)}"
    core = client.CoreV1Api(kube_api)
    return {
        "ledgers": [c.metadata.name for c in ledger.list_for_run(kube_api, ns, run)],
        "balloons": [p.metadata.name for p in core.list_namespaced_pod(ns, label_selector=sel).items],
        "claimed_nodes": [n.metadata.name for n in core.list_node(label_selector=sel).items],
    }


def _gc(api: client.ApiClient, ns: str, run: str, **kw: object) -> janitor.GcReport:
    return janitor.collect(ns, api=api, runs=[run], lock_namespace=ns, **kw)  # type: ignore[arg-type]


def test_a_run_with_a_gpugang_is_the_controllers_and_is_swept_only_once_the_gang_is_gone(
        kube, namespace: str, kwok_nodes: NodeFactory, step_api: client.ApiClient,
        janitor_api: client.ApiClient) -> None:
    """Objects whose lease labels expired long ago are kept while their run's GpuGang exists (the controller releases
    that run); once the gang is gone without a release (its finalizer removed by hand), they are orphans and go."""
    run = f"gc-gang-{uuid.uuid4().hex[:6]}"
    _, (node,) = kwok_nodes(1)
    custom = client.CustomObjectsApi(kube.api)
    spec = ProvisioningSpec("nvidia-h100-80gb", 1)
    body = gang.body(run, namespace, spec.to_json(), {"local": "local:elsewhere:1"})
    body["metadata"]["finalizers"] = ["kfp-gpu.io/release"]  # as the controller would have added it
    custom.create_namespaced_custom_object(gang.GROUP, gang.VERSION, namespace, gang.PLURAL, body)
    _hold(step_api, kube.api, namespace, Owner.for_step(run, "train", -60), node)  # expired a minute ago
    for _ in range(3):
        rep = _gc(janitor_api, namespace, run)
        assert rep.runs == {label_safe(run): "live"}, str(rep)
        assert f"GpuGang {namespace}/{gang.gang_name(run)} exists" in rep.reasons[label_safe(run)], str(rep)
    assert all(_held(kube.api, namespace, run).values()), _held(kube.api, namespace, run)
    custom.delete_namespaced_custom_object(gang.GROUP, gang.VERSION, namespace, gang.PLURAL, gang.gang_name(run))
    custom.patch_namespaced_custom_object(gang.GROUP, gang.VERSION, namespace, gang.PLURAL, gang.gang_name(run),
                                          {"metadata": {"finalizers": None}})  # by hand: nobody released it
    rep = wait_until("the janitor releases the orphan", lambda: (
        r := _gc(janitor_api, namespace, run)).runs.get(label_safe(run)) == "released" and r, timeout=30, every=0.5)
    assert f"pod/{namespace}/{balloons.balloon_name(run, 0)}" in str(rep), str(rep)
    wait_until("nothing left", lambda: not any(_held(kube.api, namespace, run).values()), timeout=30)


def _expired_run(api: client.ApiClient, ns: str) -> str:
    """A run whose exit handler never ran, from before heartbeats: labels only, long expired."""
    run = f"lease-dead-{uuid.uuid4().hex[:6]}"
    owner = Owner.for_step(run, "warm_pool", -60)
    ledger.write(api, ns, owner, {"balloons": [balloons.balloon_name(run, 0)]})
    balloons.create_balloons(api, ns, owner, 1, 8, "nvidia-h100-80gb", [])
    return run


def test_two_janitors_never_sweep_at_once(kube, namespace: str, step_api: client.ApiClient,
                                          janitor_api: client.ApiClient) -> None:
    run = _expired_run(step_api, namespace)
    first = JanitorLock(janitor_api, namespace, "janitor-a", duration_s=60)
    assert first.acquire()
    rep = _gc(janitor_api, namespace, run, holder="janitor-b")
    assert rep.lock_held_by == "janitor-a" and rep.runs == {}, str(rep)
    assert f"lease {namespace}/kfp-gpu-janitor held by janitor-a" in str(rep)
    assert _held(kube.api, namespace, run)["ledgers"]  # the second janitor touched nothing
    first.release()

    racers = [JanitorLock(janitor_api, namespace, f"racer-{i}", duration_s=60) for i in range(4)]
    gate, won = threading.Barrier(len(racers)), [False] * len(racers)

    def race(i: int) -> None:
        gate.wait()
        won[i] = racers[i].acquire()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(racers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(won) == 1, won
    winner = racers[won.index(True)]
    assert {r.held_by for r, w in zip(racers, won, strict=True) if not w} == {winner.holder}
    winner.release()

    stale = JanitorLock(janitor_api, namespace, "crashed-janitor", duration_s=1)
    assert stale.acquire()  # and never released: it expires
    time.sleep(1.5)
    rep = _gc(janitor_api, namespace, run, holder="janitor-c")
    assert not rep.lock_held_by and rep.runs[label_safe(run)] == "released", str(rep)
    lock = client.CoordinationV1Api(kube.api).read_namespaced_lease("kfp-gpu-janitor", namespace)
    assert not lock.spec.holder_identity  # released at the end


def test_a_lock_namespace_that_does_not_exist_is_named_in_one_line(kube) -> None:
    """An admin's `kfp-gpu gc` (deploy/janitor-rbac.yaml binds its ClusterRole cluster-wide, so the janitor gets the
    same answer) creating its lock in a namespace that is not there: the apiserver's 404 on the Lease POST becomes
    NotFound naming the namespace (it was a bare '404 Not Found')."""
    gone = f"t-no-such-{uuid.uuid4().hex[:6]}"
    with pytest.raises(NotFound) as err:
        JanitorLock(kube.api, gone, "janitor-x", duration_s=60).acquire()
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"namespace '{gone}' does not exist (the janitor lock lease {gone}/"
                                                "kfp-gpu-janitor lives there) (fix: pass --lock-namespace NS"), text


@pytest.fixture
def other_namespace(kube) -> Iterator[str]:
    yield from scoped_namespace(kube, f"t-leases-other-{uuid.uuid4().hex[:6]}")


def test_all_namespaces_finds_a_dead_run_in_another_namespace(
        kube, namespace: str, other_namespace: str, janitor_identity: Identity) -> None:
    run = _expired_run(kube.api, other_namespace)  # setup as admin: the controller's identity is a tenant of `namespace` only
    assert _gc(janitor_identity.api, namespace, run).runs == {}  # a namespaced janitor does not see it
    env = {**os.environ, "KUBECONFIG": str(janitor_identity.kubeconfig), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "gc", "--all-namespaces", "--run", run,
                          "--lock-namespace", namespace], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "kfp-gpu gc (all namespaces)" in out.stdout
    assert f"run {label_safe(run)} [{other_namespace}]: released" in out.stdout, out.stdout
    assert f"pod/{other_namespace}/{balloons.balloon_name(run, 0)}" in out.stdout, out.stdout
    wait_until("nothing left in the other namespace",
               lambda: not any(_held(kube.api, other_namespace, run).values()), timeout=30)
