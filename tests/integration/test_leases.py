"""Leases renewed while their owner lives, and a janitor that releases only dead runs (issue 11, section 2).

Real control plane, real objects: a run's ledger ConfigMap, a balloon pod and a claimed KWOK node, held by a
:class:`Heartbeat` with a 10 s lease, while ``janitor.collect`` runs in a loop beside it. Heartbeats run with
the controller's identity (controller-rbac.yaml) and the janitor with its own (deploy/janitor-rbac.yaml), not as
cluster-admin.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu.cluster import balloons, ledger, owned, owners
from kfp_gpu.cluster.lease import A_LOCAL, A_POD, Heartbeat, JanitorLock, OwnerIdentity, lease_name
from kfp_gpu.cluster.nodes import claim, read_node
from kfp_gpu.providers.base import LABEL_LEASE, LABEL_RUN_ID, Owner, label_safe
from kfp_gpu.steps import janitor
from tests.integration.conftest import NodeFactory
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
        "leases": [x.metadata.name for x in
                   client.CoordinationV1Api(kube_api).list_namespaced_lease(ns, label_selector=sel).items],
    }


def _lease_labels(kube_api: client.ApiClient, ns: str, run: str, node: str) -> dict[str, float]:
    core = client.CoreV1Api(kube_api)
    return {
        "ledger": float(ledger.list_for_run(kube_api, ns, run)[0].metadata.labels[LABEL_LEASE]),
        "balloon": float(core.read_namespaced_pod(balloons.balloon_name(run, 0), ns).metadata.labels[LABEL_LEASE]),
        "node": float(core.read_node(node).metadata.labels[LABEL_LEASE]),
    }


def _gc(api: client.ApiClient, ns: str, run: str, **kw: object) -> janitor.GcReport:
    return janitor.collect(ns, api=api, runs=[run], lock_namespace=ns, **kw)  # type: ignore[arg-type]


def test_a_live_heartbeat_keeps_its_run_through_janitor_passes_longer_than_the_ttl(
        kube, namespace: str, kwok_nodes: NodeFactory, step_api: client.ApiClient,
        janitor_api: client.ApiClient) -> None:
    run = f"lease-live-{uuid.uuid4().hex[:6]}"
    _, (node,) = kwok_nodes(1)
    with Heartbeat(step_api, namespace, run, "train", TTL) as hb:
        _hold(step_api, kube.api, namespace, hb.owner, node)
        first = _lease_labels(kube.api, namespace, run, node)
        passes, end = 0, time.monotonic() + 2.5 * TTL
        while time.monotonic() < end:  # the janitor loops beside the step for 2.5 lease lifetimes
            rep = _gc(janitor_api, namespace, run)
            assert rep.runs == {label_safe(run): "live"}, str(rep)
            passes += 1
            time.sleep(0.5)
        assert passes >= 10
        assert all(_held(kube.api, namespace, run).values()), _held(kube.api, namespace, run)
        later = _lease_labels(kube.api, namespace, run, node)
        assert all(later[k] >= first[k] + 1.5 * TTL for k in first), (first, later)  # every label moved on
        assert hb.failures == 0, hb.last_error
        lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(lease_name(run, "train"), namespace)
        assert lease.spec.holder_identity == hb.identity.holder and lease.spec.lease_duration_seconds == 10
        assert lease.metadata.annotations[A_LOCAL] == hb.identity.local
    lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(lease_name(run, "train"), namespace)
    assert not lease.spec.holder_identity  # stop() released it; its expiry alone now protects the run
    assert _gc(janitor_api, namespace, run).runs[label_safe(run)] == "live"
    rep = wait_until("the janitor releases the stopped run", lambda: (
        r := _gc(janitor_api, namespace, run)).runs.get(label_safe(run)) == "released" and r, timeout=TTL + 20,
        every=1.0)
    assert "no step holds it" in rep.reasons[label_safe(run)], str(rep)
    wait_until("nothing left", lambda: not any(_held(kube.api, namespace, run).values()), timeout=30)


_BEAT = """
import sys, time
from kfp_gpu.cluster.kube import api_client
from kfp_gpu.cluster.lease import Heartbeat
Heartbeat(api_client(None), sys.argv[1], sys.argv[2], "train", float(sys.argv[3])).start()
print("beating", flush=True)
time.sleep(3600)
"""


@pytest.fixture
def beating(step_identity: Identity) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _start(step_identity: Identity, ns: str, run: str, procs: list[subprocess.Popen[str]],
           **env: str) -> subprocess.Popen[str]:
    """A step process: a Heartbeat, as a train step would hold one, with the controller's identity."""
    full = {k: v for k, v in os.environ.items() if k not in ("KFP_POD_NAME", "POD_NAME", "POD_NAMESPACE")}
    full.update(KUBECONFIG=str(step_identity.kubeconfig), PYTHONPATH=str(ROOT), **env)
    proc = subprocess.Popen([sys.executable, "-c", _BEAT, ns, run, str(TTL)], env=full, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "beating", proc.stderr
    return proc


def _until_expired_then_kept(api: client.ApiClient, ns: str, run: str, why: str) -> janitor.GcReport:
    """Janitor passes for longer than the TTL: the lease runs out, and the run must still be kept."""
    end = time.monotonic() + TTL + 5
    rep = _gc(api, ns, run)
    while time.monotonic() < end:
        rep = _gc(api, ns, run)
        assert rep.runs[label_safe(run)] == "live", str(rep)
        time.sleep(1.0)
    assert "lease expired" in rep.reasons[label_safe(run)] and why in rep.reasons[label_safe(run)], str(rep)
    return rep


def test_a_crashed_step_whose_pod_still_exists_is_kept_until_the_pod_is_gone(
        kube, namespace: str, kwok_nodes: NodeFactory, step_identity: Identity, janitor_api: client.ApiClient,
        beating: list[subprocess.Popen[str]]) -> None:
    run = f"lease-pod-{uuid.uuid4().hex[:6]}"
    _, (node,) = kwok_nodes(1)
    pod = f"step-{run}"
    kube.core.create_namespaced_pod(namespace, {"metadata": {"name": pod}, "spec": {
        "nodeSelector": {"kfp-gpu.io/nowhere": "x"},  # stays Pending: exists and has not finished
        "containers": [{"name": "main", "image": "busybox"}]}})
    proc = _start(step_identity, namespace, run, beating, KFP_POD_NAME=pod, POD_NAMESPACE=namespace)
    _hold(step_identity.api, kube.api, namespace, Owner.for_step(run, "train", TTL), node)
    lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(lease_name(run, "train"), namespace)
    assert lease.metadata.annotations[A_POD] == f"{namespace}/{pod}"
    proc.send_signal(signal.SIGKILL)  # the step dies without stopping its heartbeat; its pod stays
    proc.wait()
    _until_expired_then_kept(janitor_api, namespace, run, f"pod {namespace}/{pod} is alive")
    assert all(_held(kube.api, namespace, run).values())
    kube.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    rep = wait_until("released once the pod is gone", lambda: (
        r := _gc(janitor_api, namespace, run)).runs.get(label_safe(run)) == "released" and r, timeout=30, every=1.0)
    assert f"pod {namespace}/{pod} gone" in rep.reasons[label_safe(run)]
    wait_until("nothing left", lambda: not any(_held(kube.api, namespace, run).values()), timeout=30)


def test_a_stalled_local_step_is_kept_while_its_process_lives(
        kube, namespace: str, kwok_nodes: NodeFactory, step_identity: Identity, janitor_api: client.ApiClient,
        beating: list[subprocess.Popen[str]]) -> None:
    run = f"lease-local-{uuid.uuid4().hex[:6]}"
    _, (node,) = kwok_nodes(1)
    proc = _start(step_identity, namespace, run, beating)
    _hold(step_identity.api, kube.api, namespace, Owner.for_step(run, "train", TTL), node)
    proc.send_signal(signal.SIGSTOP)  # alive but no longer renewing
    _until_expired_then_kept(janitor_api, namespace, run, f"local:{socket.gethostname()}:{proc.pid} is alive")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rep = _gc(janitor_api, namespace, run)
    assert rep.runs[label_safe(run)] == "released", str(rep)
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


@pytest.fixture
def other_namespace(kube) -> Iterator[str]:
    name = f"t-leases-other-{uuid.uuid4().hex[:6]}"
    kube.core.create_namespace({"metadata": {"name": name, "labels": {"kfp-gpu.io/test": "true"}}})
    yield name
    try:
        kube.core.delete_namespace(name, propagation_policy="Background")
    except ApiException as e:
        if e.status != 404:
            raise


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


def test_a_step_writing_with_an_old_owner_never_shortens_the_lease(kube, namespace: str,
                                                                   step_api: client.ApiClient) -> None:
    run = f"lease-write-{uuid.uuid4().hex[:6]}"
    with Heartbeat(step_api, namespace, run, "train", 600.0, interval_s=0.5) as hb:
        stale = hb.owner
        ledger.write(step_api, namespace, stale, {"n": 1})
        wait_until("the heartbeat raised the ledger's lease", lambda: float(
            ledger.list_for_run(kube.api, namespace, run)[0].metadata.labels[LABEL_LEASE]) > int(stale.lease_expires))
        raised = ledger.list_for_run(kube.api, namespace, run)[0].metadata.labels[LABEL_LEASE]
        ledger.write(step_api, namespace, stale, {"n": 2})  # a write with the owner taken before the beats
    cm = ledger.list_for_run(kube.api, namespace, run)[0]
    assert ledger.data_of(cm) == {"n": 2}
    assert float(cm.metadata.labels[LABEL_LEASE]) >= float(raised)
    assert owned.RUN_LEASE_LABEL not in cm.metadata.labels


def test_a_retried_pod_takes_the_lease_over_and_the_old_one_cannot_release_it(kube, namespace: str,
                                                                              step_api: client.ApiClient) -> None:
    run = f"lease-retry-{uuid.uuid4().hex[:6]}"
    old = OwnerIdentity(holder="train-impl-1/7", pod=f"{namespace}/train-impl-1")
    new = OwnerIdentity(holder="train-impl-2/7", pod=f"{namespace}/train-impl-2")
    first = Heartbeat(step_api, namespace, run, "train", 600.0, identity=old).start()
    second = Heartbeat(step_api, namespace, run, "train", 600.0, identity=new).start()  # the retry re-attaches
    first.stop()  # the evicted pod's finally block runs late
    lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(lease_name(run, "train"), namespace)
    assert lease.spec.holder_identity == new.holder and lease.spec.lease_transitions == 1
    assert lease.metadata.annotations[A_POD] == new.pod
    second.stop()
    lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(lease_name(run, "train"), namespace)
    assert not lease.spec.holder_identity


WORKFLOW_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "workflows.argoproj.io"},
    "spec": {"group": "argoproj.io", "scope": "Namespaced",
             "names": {"kind": "Workflow", "plural": "workflows", "singular": "workflow", "listKind": "WorkflowList"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}


@pytest.fixture
def argo_workflows(kube) -> None:
    """The Argo Workflow CRD (as Argo installs it: no status subresource), installed if absent.

    It is left installed: deleting it while another run of this test uses it would make that run's Workflow
    vanish (a dead owner), and a CRD still terminating from an earlier deletion is waited out first.
    """
    ext = client.ApiextensionsV1Api(kube.api)

    def terminating() -> bool:
        try:
            return ext.read_custom_resource_definition("workflows.argoproj.io").metadata.deletion_timestamp is not None
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    wait_until("no Workflow CRD terminating", lambda: not terminating(), timeout=120)
    try:
        ext.create_custom_resource_definition(WORKFLOW_CRD)
    except ApiException as e:
        if e.status != 409:
            raise
    wait_until("Workflow CRD established", lambda: any(
        c.type == "Established" and c.status == "True"
        for c in (ext.read_custom_resource_definition("workflows.argoproj.io").status.conditions or [])), timeout=30)
    wait_until("workflows served", lambda: _served(kube.api), timeout=30)


def _served(api: client.ApiClient) -> bool:
    try:
        return any(r["name"] == "workflows" for r in owned.request(api, "GET", owners.ARGO).get("resources", []))
    except ApiException:
        return False


def test_a_run_whose_workflow_still_runs_is_kept_after_its_step_pod_is_gone(
        kube, namespace: str, kwok_nodes: NodeFactory, step_identity: Identity, janitor_api: client.ApiClient,
        beating: list[subprocess.Popen[str]], argo_workflows: None) -> None:
    run = f"lease-wf-{uuid.uuid4().hex[:6]}"
    _, (node,) = kwok_nodes(1)
    wf, pod = f"llm-{run}", f"llm-{run}-system-container-impl-1"
    custom = client.CustomObjectsApi(kube.api)
    custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "workflows", {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": wf},
        "spec": {"entrypoint": "entrypoint"}, "status": {"phase": "Running"}})
    kube.core.create_namespaced_pod(namespace, {
        "metadata": {"name": pod, "labels": {"workflows.argoproj.io/workflow": wf}},
        "spec": {"nodeSelector": {"kfp-gpu.io/nowhere": "x"}, "containers": [{"name": "main", "image": "busybox"}]}})
    proc = _start(step_identity, namespace, run, beating, KFP_POD_NAME=pod, POD_NAMESPACE=namespace)
    _hold(step_identity.api, kube.api, namespace, Owner.for_step(run, "train", TTL), node)
    lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(lease_name(run, "train"), namespace)
    assert lease.metadata.annotations["kfp-gpu.io/owner-workflow"] == f"{namespace}/{wf}"  # from the pod's label
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kube.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)  # evicted; Argo will retry it
    wait_until("pod gone", lambda: not kube.core.list_namespaced_pod(
        namespace, field_selector=f"metadata.name={pod}").items, timeout=30)
    _until_expired_then_kept(janitor_api, namespace, run, f"workflow {namespace}/{wf} is alive")
    custom.patch_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "workflows", wf,
                                          {"status": {"phase": "Failed", "finishedAt": "2026-01-01T00:00:00Z"}})
    rep = _gc(janitor_api, namespace, run)
    assert rep.runs[label_safe(run)] == "released", str(rep)
    assert f"workflow {namespace}/{wf} gone" in rep.reasons[label_safe(run)]


def test_a_renewal_raises_every_label_of_a_large_run_concurrently(kube, namespace: str,
                                                                 step_api: client.ApiClient) -> None:
    """A warm pool of N balloons is N label writes per beat: they go out together, not one after another
    (in series they held scale-up's start for ~15 s at 512 nodes: bench control plane, 4,096 GPUs)."""
    run = f"lease-many-{uuid.uuid4().hex[:6]}"
    owner = Owner.for_step(run, "warm_pool", TTL)
    ledger.write(step_api, namespace, owner, {})
    count = 24
    balloons.create_balloons(step_api, namespace, owner, count, 8, "nvidia-h100-80gb", [])
    in_flight, peak, lock = 0, 0, threading.Lock()
    call_api = step_api.call_api

    def counting(path: str, method: str, *a: object, **k: object) -> object:
        nonlocal in_flight, peak
        if method != "PATCH":
            return call_api(path, method, *a, **k)
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        try:
            return call_api(path, method, *a, **k)
        finally:
            with lock:
                in_flight -= 1

    step_api.call_api = counting  # type: ignore[method-assign]
    hb = Heartbeat(step_api, namespace, run, "train", TTL * 3, identity=OwnerIdentity(holder="test"))
    try:
        assert hb.renew() is True
    finally:
        step_api.call_api = call_api  # type: ignore[method-assign]
    sel = f"{LABEL_RUN_ID}={label_safe(run)}"
    pods = client.CoreV1Api(kube.api).list_namespaced_pod(namespace, label_selector=sel).items
    raised = [p for p in pods if float(p.metadata.labels[LABEL_LEASE]) > owner.lease_expires]
    assert (len(pods), len(raised)) == (count, count)
    assert peak > 1, "the label writes went out one after another"
