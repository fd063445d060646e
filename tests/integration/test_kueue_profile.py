"""The Kueue profile of the dev cluster (issue 14): the real Kueue controller (v0.17, ``kueue.x-k8s.io/v1beta2``),
its webhooks served out of cluster, the Training Operator's PyTorchJobs, and the provisioning admission check
served by the real cluster-autoscaler.

Every test makes its own ResourceFlavor / ClusterQueue (/ AdmissionCheck / ProvisioningRequestConfig) with unique
names, a ClusterQueue that admits only the test's namespace, and deletes the cluster-scoped objects at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu.cluster import pytorchjob
from kfp_gpu_rehearsal.devcluster import ca_profile
from kfp_gpu_rehearsal.devcluster.ca_profile import CLUSTER, CLUSTER_LABEL, NODE_GROUPS
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.devcluster.kueue_profile import API_GROUP, API_VERSION, QUEUE_LABEL, Profile
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"
ACCEL_LABEL = "cloud.google.com/gke-accelerator"
A100 = "nvidia-a100-80gb"
POOL_LABEL = "cloud.google.com/gke-nodepool"
PROVREQ = ("autoscaling.x-k8s.io", "v1", "provisioningrequests")
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
PR_CONTROLLER = "kueue.x-k8s.io/provisioning-request"


class Queues:
    """Kueue objects of one test: cluster-scoped ones deleted at the end (jobs first, so quota is released)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.id = uuid.uuid4().hex[:6]
        self.cluster_scoped: list[tuple[str, str]] = []  # (plural, name)
        self.jobs: list[str] = []

    def create(self, plural: str, body: dict[str, Any], namespaced: bool = False) -> dict[str, Any]:
        body = {"apiVersion": f"{API_GROUP}/{API_VERSION}", **body}
        if namespaced:
            return dict(self.kube.custom.create_namespaced_custom_object(
                API_GROUP, API_VERSION, self.namespace, plural, body))
        out = self.kube.custom.create_cluster_custom_object(API_GROUP, API_VERSION, plural, body)
        self.cluster_scoped.append((plural, body["metadata"]["name"]))
        return dict(out)

    def get(self, plural: str, name: str) -> dict[str, Any]:
        return dict(self.kube.custom.get_cluster_custom_object(API_GROUP, API_VERSION, plural, name))

    def queue(self, *, gpus: int = 16, check: str | None = None) -> str:
        """ResourceFlavor (A100 node label) + ClusterQueue (this namespace only) + LocalQueue; the LocalQueue name."""
        rf, cq, lq = f"kfpgpu-rf-{self.id}", f"kfpgpu-cq-{self.id}", "gpus"
        self.create("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": rf},
                                        "spec": {"nodeLabels": {ACCEL_LABEL: A100}}})
        spec: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
            "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU], "flavors": [{"name": rf, "resources": [
                {"name": "cpu", "nominalQuota": "64"}, {"name": "memory", "nominalQuota": "512Gi"},
                {"name": GPU, "nominalQuota": str(gpus)}]}]}],
        }
        if check:
            spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": check}]}
        self.create("clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": cq}, "spec": spec})
        self.create("localqueues", {"kind": "LocalQueue", "metadata": {"name": lq, "namespace": self.namespace},
                                    "spec": {"clusterQueue": cq}}, namespaced=True)
        wait_until(f"ClusterQueue {cq} Active", lambda: _cond(self.get("clusterqueues", cq), "Active") == "True",
                   timeout=30)
        return lq

    def provisioning_check(self) -> str:
        """ProvisioningRequestConfig (atomic class) + AdmissionCheck of Kueue's provisioning controller; its name."""
        prc, ac = f"kfpgpu-prc-{self.id}", f"kfpgpu-ac-{self.id}"
        self.create("provisioningrequestconfigs", {"kind": "ProvisioningRequestConfig", "metadata": {"name": prc},
                                                   "spec": {"provisioningClassName": ATOMIC}})
        self.create("admissionchecks", {"kind": "AdmissionCheck", "metadata": {"name": ac}, "spec": {
            "controllerName": PR_CONTROLLER,
            "parameters": {"apiGroup": API_GROUP, "kind": "ProvisioningRequestConfig", "name": prc}}})
        wait_until(f"AdmissionCheck {ac} Active", lambda: _cond(self.get("admissionchecks", ac), "Active") == "True",
                   timeout=30)
        return ac

    def job(self, name: str, *, queue: str | None, pod: dict[str, Any], workers: int = 1) -> dict[str, Any]:
        """A PyTorchJob (Master + ``workers`` Workers, 8 GPUs each); the object the API server returned."""
        labels = {QUEUE_LABEL: queue} if queue else {}
        replica = {"restartPolicy": "Never", "template": {
            "metadata": {"annotations": {pytorchjob.SIM_DURATION_ANNOTATION: "600s"}}, "spec": pod}}
        body = {"apiVersion": f"{pytorchjob.GROUP}/{pytorchjob.VERSION}", "kind": pytorchjob.KIND,
                "metadata": {"name": name, "labels": labels},
                "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, **replica},
                                                 **({"Worker": {"replicas": workers, **replica}} if workers else {})}}}
        self.jobs.append(name)
        return dict(self.kube.custom.create_namespaced_custom_object(
            pytorchjob.GROUP, pytorchjob.VERSION, self.namespace, pytorchjob.PLURAL, body))

    def read_job(self, name: str) -> dict[str, Any]:
        return dict(self.kube.custom.get_namespaced_custom_object(
            pytorchjob.GROUP, pytorchjob.VERSION, self.namespace, pytorchjob.PLURAL, name))

    def workloads_of(self, job: str) -> list[dict[str, Any]]:
        items = self.kube.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, self.namespace,
                                                               "workloads")["items"]
        return [w for w in items if any(o.get("kind") == pytorchjob.KIND and o.get("name") == job
                                        for o in w["metadata"].get("ownerReferences") or [])]

    def pods_of(self, job: str) -> list[Any]:
        return list(self.kube.core.list_namespaced_pod(
            self.namespace, label_selector=f"training.kubeflow.org/job-name={job}").items)

    def cleanup(self) -> None:
        for name in self.jobs:
            try:
                self.kube.custom.delete_namespaced_custom_object(
                    pytorchjob.GROUP, pytorchjob.VERSION, self.namespace, pytorchjob.PLURAL, name,
                    propagation_policy="Foreground")
            except ApiException as e:
                if e.status != 404:
                    raise
        for plural, name in reversed(self.cluster_scoped):
            try:
                self.kube.custom.delete_cluster_custom_object(API_GROUP, API_VERSION, plural, name)
            except ApiException as e:
                if e.status != 404:
                    raise


def _cond(obj: dict[str, Any], type_: str) -> str:
    return next((c["status"] for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), "")


def _suspended(job: dict[str, Any]) -> bool:
    return bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))


def _nowhere_pod(tag: str) -> dict[str, Any]:
    """A pod no node matches (the tests here never take GPU nodes that other tests use)."""
    return {"nodeSelector": {"kfp-gpu.io/kueue-test": tag}, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "pytorch", "image": "pytorch/pytorch",
                            "resources": {"requests": {GPU: "8", "cpu": "1"}, "limits": {GPU: "8"}}}]}


@pytest.fixture
def queues(kube: Kube, kueue: Profile, namespace: str) -> Iterator[Queues]:
    q = Queues(kube, namespace)
    yield q
    q.cleanup()


def test_profile_serves_v1beta2(kube: Kube, kueue: Profile) -> None:
    """The CRDs are served as v1beta2 (stored) and v1beta1; the process is the one in the state dir."""
    crd = client.ApiextensionsV1Api(kube.api).read_custom_resource_definition("workloads.kueue.x-k8s.io")
    versions = {v.name: (v.served, v.storage) for v in crd.spec.versions}
    assert versions == {"v1beta1": (True, False), "v1beta2": (True, True)}
    assert crd.spec.conversion.strategy == "Webhook"
    assert kueue.api_version == "kueue.x-k8s.io/v1beta2"


def test_labelled_pytorchjob_is_suspended_admitted_and_resumed(queues: Queues) -> None:
    lq = queues.queue()
    created = queues.job("queued", queue=lq, pod=_nowhere_pod(queues.id))
    assert _suspended(created), "Kueue's mutating webhook did not suspend the labelled PyTorchJob on create"
    wl = wait_until("a Workload for the job", lambda: queues.workloads_of("queued"), timeout=30)[0]
    assert wl["metadata"]["name"].startswith("pytorchjob-queued-")
    assert wl["spec"]["queueName"] == lq
    assert sorted(ps["name"] for ps in wl["spec"]["podSets"]) == ["master", "worker"]
    admitted = wait_until("Workload admitted", lambda: [w for w in queues.workloads_of("queued")
                                                        if _cond(w, "Admitted") == "True"], timeout=30)[0]
    assert admitted["status"]["admission"]["clusterQueue"] == f"kfpgpu-cq-{queues.id}"
    assert _cond(admitted, "QuotaReserved") == "True"
    wait_until("job unsuspended", lambda: not _suspended(queues.read_job("queued")), timeout=30)
    pods = wait_until("the operator creates the pods", lambda: len(queues.pods_of("queued")) == 2 and
                      queues.pods_of("queued"), timeout=30)
    for p in pods:  # Kueue injected the flavor's node labels into the pod template
        assert p.spec.node_selector.get(ACCEL_LABEL) == A100, p.spec.node_selector


def test_job_without_queue_label_is_left_alone(queues: Queues) -> None:
    lq = queues.queue()
    plain = queues.job("plain", queue=None, pod=_nowhere_pod(queues.id))
    queued = queues.job("control", queue=lq, pod=_nowhere_pod(queues.id))
    assert not _suspended(plain)
    assert _suspended(queued)
    # The control job shows Kueue watches this namespace; by the time the operator has made the plain job's
    # pods, a Workload for it would exist.
    wait_until("a Workload for the labelled job", lambda: queues.workloads_of("control"), timeout=30)
    pods = wait_until("the plain job's pods", lambda: len(queues.pods_of("plain")) == 2 and
                      queues.pods_of("plain"), timeout=30)
    assert queues.workloads_of("plain") == []
    assert not _suspended(queues.read_job("plain"))
    for p in pods:
        assert ACCEL_LABEL not in (p.spec.node_selector or {})
    # batch/job is an enabled integration too: an unlabelled Job is not suspended and gets no Workload.
    batch = client.BatchV1Api(queues.kube.api)
    job = batch.create_namespaced_job(queues.namespace, {
        "metadata": {"name": "plain-batch"},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", **_nowhere_pod(queues.id)}}}})
    assert not job.spec.suspend
    wait_until("the Job's pod", lambda: queues.kube.core.list_namespaced_pod(
        queues.namespace, label_selector="job-name=plain-batch").items, timeout=30)
    items = queues.kube.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, queues.namespace,
                                                             "workloads")["items"]
    assert [w for w in items if any(o.get("kind") == "Job" for o in w["metadata"].get("ownerReferences") or [])] == []
    assert not batch.read_namespaced_job("plain-batch", queues.namespace).spec.suspend


def test_admission_check_provisioning_request_served_by_cluster_autoscaler(
        queues: Queues, autoscaler: ca_profile.Profile) -> None:
    group = next(g for g in NODE_GROUPS if g.name == "ca-a100-b")
    ac = queues.provisioning_check()
    lq = queues.queue(check=ac)
    pod = {"nodeSelector": {POOL_LABEL: group.name, CLUSTER_LABEL: CLUSTER},
           "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}, ca_profile.toleration()],
           "terminationGracePeriodSeconds": 0,
           "containers": [{"name": "pytorch", "image": "pytorch/pytorch",
                           "resources": {"requests": {GPU: str(group.gpus), "cpu": "1"},
                                         "limits": {GPU: str(group.gpus)}}}]}
    assert _suspended(queues.job("gated", queue=lq, pod=pod))
    kube, ns = queues.kube, queues.namespace

    def provreqs() -> list[dict[str, Any]]:
        return list(kube.custom.list_namespaced_custom_object(*PROVREQ[:2], ns, PROVREQ[2])["items"])

    pr = wait_until("Kueue creates a ProvisioningRequest", provreqs, timeout=60)[0]
    assert pr["spec"]["provisioningClassName"] == ATOMIC
    assert sorted(ps["count"] for ps in pr["spec"]["podSets"]) == [1, 1]
    wait_until("the ProvisioningRequest is Provisioned (cluster-autoscaler)",
               lambda: _cond(provreqs()[0], "Provisioned") == "True", timeout=120)
    wait_until("Workload admitted after the check", lambda: [w for w in queues.workloads_of("gated")
                                                             if _cond(w, "Admitted") == "True"], timeout=60)
    wait_until("job unsuspended", lambda: not _suspended(queues.read_job("gated")), timeout=30)

    def running_on_ca() -> list[Any]:
        pods = queues.pods_of("gated")
        if len(pods) != 2 or any(p.status.phase != "Running" or not p.spec.node_name for p in pods):
            return []
        nodes = [kube.core.read_node(p.spec.node_name) for p in pods]
        return nodes if all(n.metadata.labels.get(CLUSTER_LABEL) == CLUSTER and
                            n.metadata.labels.get(POOL_LABEL) == group.name for n in nodes) else []

    nodes = wait_until("both pods Running on cluster-autoscaler nodes", running_on_ca, timeout=120)
    assert len({n.metadata.name for n in nodes}) == 2
    wait_until("PyTorchJob Running", lambda: _cond(queues.read_job("gated"), "Running") == "True", timeout=60)
