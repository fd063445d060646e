"""The GKE stand-in's reclaim of a spot VM, seen by the Job controller: the kubelet's graceful node shutdown reports
the pod Failed before the VM goes, and the pod object outlives its Node until the Job controller has counted it, so a
Job (and a JobSet's Job) counts the failure (docs/sim.md, rule A8 / "GKE spot shutdown").

Without the hold the stand-in deleted the Failed pod while the Job's ``batch.kubernetes.io/job-tracking`` finalizer
was still on it (this test's ordering assertion failed 2/2 against that code), and KWOK's pod-delete stage strips a
deleted pod's finalizers: when that beats the Job controller (a loaded machine), the failure is never counted (tried
by hand: a Job with backoffLimit 0 made a new pod instead of failing). On an idle machine the Job controller still won
the race in those 2 runs, so the count alone could not catch it; the ordering is the stand-in's contract.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import pytest
from kubernetes import client, watch

from kfp_gpu.cluster.podtemplate import SIM_DURATION_ANNOTATION
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim.kube import KubeBackend
from tests.integration.test_train_support import wait_until

pytestmark = pytest.mark.integration
NodeFactory = Callable[..., tuple[str, list[str]]]
JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"  # the Job controller's, on every pod it tracks


def test_a_pod_killed_by_the_reclaim_is_counted_by_its_job_before_it_goes(
    kube: Kube, namespace: str, kwok_nodes: NodeFactory,
) -> None:
    _, (node,) = kwok_nodes(1, gpus=8, spot=True)
    batch = client.BatchV1Api(kube.api)
    name = f"j-{uuid.uuid4().hex[:5]}"
    batch.create_namespaced_job(namespace, {"metadata": {"name": name}, "spec": {
        "backoffLimit": 0, "template": {"metadata": {"annotations": {SIM_DURATION_ANNOTATION: "300s"}}, "spec": {
            "restartPolicy": "Never", "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "trainer", "image": "busybox"}]}}}})
    sel = f"job-name={name}"
    (pod,) = wait_until("the Job's pod Running", lambda: [p for p in kube.core.list_namespaced_pod(
        namespace, label_selector=sel).items if p.status.phase == "Running"], timeout=30)
    events: list[tuple[bool, bool]] = []  # (deletion requested, job-tracking finalizer still on) per pod event
    stop = threading.Event()

    def record() -> None:
        w = watch.Watch()
        for ev in w.stream(kube.core.list_namespaced_pod, namespace, label_selector=sel, timeout_seconds=30,
                           resource_version=pod.metadata.resource_version):
            o = ev["object"]
            events.append((o.metadata.deletion_timestamp is not None,
                           JOB_TRACKING_FINALIZER in (o.metadata.finalizers or [])))
            if stop.is_set() or ev["type"] == "DELETED":
                w.stop()

    watcher = threading.Thread(target=record, daemon=True)
    watcher.start()
    world = KubeBackend(str(kube.kubeconfig))
    world.notice(node)
    world.kill(node)  # the grace ran out: the kubelet reports the pod Failed
    world.delete(node)  # at once: the harshest timing the world can give (the VM goes with no gap)
    t0 = time.time()

    def failed() -> bool:
        job = batch.read_namespaced_job(name, namespace)
        return any(c.type == "Failed" and c.status == "True" for c in job.status.conditions or [])

    wait_until("the Job counts the failure", failed, timeout=20)
    job = batch.read_namespaced_job(name, namespace)
    assert job.status.failed == 1, job.status
    pods = kube.core.list_namespaced_pod(namespace, label_selector=sel).items
    assert [p.metadata.uid for p in pods] in ([], [pod.metadata.uid]), pods  # no replacement pod was made
    wait_until("the pod GC deletes the counted pod", lambda: not kube.core.list_namespaced_pod(
        namespace, label_selector=sel).items, timeout=20)
    stop.set()
    watcher.join(30)
    # the stand-in asked for the deletion only once the Job controller had taken its finalizer off (KWOK strips the
    # finalizers of a pod being deleted, so a deletion before that can lose the count)
    assert events and not [e for e in events if e == (True, True)], events
    print(f"\nreclaimed pod counted by its Job {time.time() - t0:.2f} s after the VM went")
