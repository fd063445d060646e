"""Preflight's Kueue check against the real Kueue controller (v0.17, the ``kueue`` fixture), run as the
controller's identity (``step_api``): ClusterQueues with mismatched flavors, borrowing from a cohort, a full queue
(quota reserved by a Workload Kueue really admitted), a ProvisioningRequest AdmissionCheck, and the queue choice.

ResourceFlavors, ClusterQueues, AdmissionChecks and ProvisioningRequestConfigs are cluster-scoped: unique names,
deleted afterwards. LocalQueues and Workloads live in the test's namespace.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu.plan.kueue import GROUP, PROVISIONING_CONTROLLER, VERSION
from kfp_gpu.plan.preflight import ClusterCheck
from kfp_gpu.plan.quota import Verdict
from kfp_gpu.steps.preflight import run_preflight
from tests.integration import test_provisioning
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
env = test_provisioning.env  # the GKE stand-in fixture (the cloud side of preflight)
GPU = "nvidia.com/gpu"
A100 = {"cloud.google.com/gke-accelerator": "nvidia-a100-80gb"}
H100 = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}


class Kueue:
    """Creates Kueue objects as the admin; cluster-scoped names get a per-test suffix."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom, self.ns = client.CustomObjectsApi(api), namespace
        self.suffix = uuid.uuid4().hex[:6]
        self.made: list[tuple[str, str]] = []  # (plural, name), cluster-scoped

    def _cluster(self, plural: str, kind: str, name: str, spec: dict[str, Any]) -> str:
        name = f"{name}-{self.suffix}"
        self.custom.create_cluster_custom_object(GROUP, VERSION, plural, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, "spec": spec})
        self.made.append((plural, name))
        return name

    def flavor(self, name: str, labels: dict[str, str]) -> str:
        return self._cluster("resourceflavors", "ResourceFlavor", name, {"nodeLabels": labels} if labels else {})

    def cluster_queue(self, name: str, flavors: list[dict[str, Any]], cohort: str = "",
                      checks: tuple[str, ...] = ()) -> str:
        """``flavors``: {"name", "nominal", optional "borrowing", "lending"} for nvidia.com/gpu."""
        def quota(f: dict[str, Any]) -> dict[str, Any]:
            r: dict[str, Any] = {"name": GPU, "nominalQuota": str(f["nominal"])}
            if "borrowing" in f:
                r["borrowingLimit"] = str(f["borrowing"])
            if "lending" in f:
                r["lendingLimit"] = str(f["lending"])
            return {"name": f["name"], "resources": [r]}

        spec: dict[str, Any] = {"namespaceSelector": {}, "resourceGroups": [
            {"coveredResources": [GPU], "flavors": [quota(f) for f in flavors]}]}
        if cohort:
            spec["cohortName"] = f"{cohort}-{self.suffix}"
        if checks:
            spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
        return self._cluster("clusterqueues", "ClusterQueue", name, spec)

    def provisioning_check(self, name: str) -> str:
        config = self._cluster("provisioningrequestconfigs", "ProvisioningRequestConfig", f"{name}-config",
                               {"provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
                                "managedResources": [GPU]})
        return self._cluster("admissionchecks", "AdmissionCheck", name, {
            "controllerName": PROVISIONING_CONTROLLER,
            "parameters": {"apiGroup": GROUP, "kind": "ProvisioningRequestConfig", "name": config}})

    def local_queue(self, name: str, cluster_queue: str) -> str:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, "localqueues", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "LocalQueue", "metadata": {"name": name},
            "spec": {"clusterQueue": cluster_queue}})
        return name

    def workload(self, name: str, queue: str, pods: int, gpus: int) -> None:
        """A Workload Kueue admits against the queue's quota (nothing runs it: the reservation is what counts)."""
        container = {"name": "c", "image": "busybox",
                     "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}}}
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, "workloads", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Workload", "metadata": {"name": name},
            "spec": {"queueName": queue, "podSets": [
                {"name": "main", "count": pods,
                 "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}]}})

    def cq(self, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", name)
        return got

    def wait_active(self, name: str) -> None:
        def active() -> bool:
            conds = (self.cq(name).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Active" and c["status"] == "True" for c in conds)
        wait_until(f"ClusterQueue {name} Active", active, timeout=30)

    def reserved(self, name: str) -> float:
        rows = (self.cq(name).get("status") or {}).get("flavorsReservation") or []
        return sum(float(r.get("total", 0)) for f in rows for r in f.get("resources") or [] if r.get("name") == GPU)

    def cleanup(self) -> None:
        for plural, name in reversed(self.made):
            try:
                self.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def kq(kueue, kube, namespace) -> Iterator[Kueue]:
    k = Kueue(kube.api, namespace)
    yield k
    # Workloads first (namespace deletion would do it later), so the ClusterQueues' finalizers let go
    for w in k.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")["items"]:
        k.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "workloads", w["metadata"]["name"])
    k.cleanup()


def _check(e: Any, queue: str = "", nodes: int = 2) -> ClusterCheck:
    """Preflight as the controller's identity for ``nodes`` x 8 a100 GPUs; its kueue check."""
    spec = e.spec(nodes)
    spec = dataclasses.replace(spec, target=dataclasses.replace(spec.target, queue=queue))
    res = run_preflight(spec, e.provider(spec), e.step_api, capacity_wait_s=1.0)
    return next(c for c in res.cluster_checks if c.name == "kueue")


def test_only_flavors_of_the_accelerator_count(env, kq: Kueue) -> None:
    a100, h100 = kq.flavor("a100", A100), kq.flavor("h100", H100)
    cq = kq.cluster_queue("mixed", [{"name": h100, "nominal": 64}, {"name": a100, "nominal": 8}])
    kq.local_queue("team", cq)
    kq.wait_active(cq)
    c = _check(env())  # needs 16 a100; 72 GPUs of quota, but only 8 of them a100
    assert c.verdict is Verdict.SHORT and (c.needed, c.free) == (16, 8), c
    assert f"{h100} is nvidia-h100-80gb" in c.detail and f"LocalQueue team -> ClusterQueue {cq}" in c.detail


def test_a_flavor_without_accelerator_label_is_unknown(env, kq: Kueue) -> None:
    plain = kq.flavor("plain", {})
    cq = kq.cluster_queue("plain", [{"name": plain, "nominal": 1000}])
    kq.local_queue("team", cq)
    kq.wait_active(cq)
    c = _check(env())
    assert c.verdict is Verdict.UNKNOWN and plain in c.detail and "cloud.google.com/gke-accelerator" in c.remediation


def test_borrowing_is_fits_if_the_cohort_lends_and_lending_is_reported(env, kq: Kueue) -> None:
    a100 = kq.flavor("a100", A100)
    borrower = kq.cluster_queue("borrower", [{"name": a100, "nominal": 8, "borrowing": 16}], cohort="pool")
    lender = kq.cluster_queue("lender", [{"name": a100, "nominal": 16, "lending": 12}], cohort="pool")
    kq.local_queue("borrower", borrower)
    kq.local_queue("lender", lender)
    for cq in (borrower, lender):
        kq.wait_active(cq)
    e = env()
    c = _check(e, "borrower")
    assert c.verdict is Verdict.UNKNOWN and "fits if the cohort lends" in c.detail and c.free == 8, c
    assert "nominal 8, reserved 0, borrowing limit 16, lending limit none" in c.detail
    assert f"cohort pool-{kq.suffix}" in c.detail
    own = _check(e, "lender")
    assert own.verdict is Verdict.FITS and "lending limit 12" in own.detail, own
    ambiguous = _check(e)  # two LocalQueues, none named default, no target.queue
    assert ambiguous.verdict is Verdict.SHORT and "several Kueue LocalQueues: borrower, lender" in ambiguous.detail
    assert "target.queue" in ambiguous.remediation


def test_a_full_queue_is_short_with_the_amounts(env, kq: Kueue) -> None:
    a100 = kq.flavor("a100", A100)
    cq = kq.cluster_queue("full", [{"name": a100, "nominal": 24}])
    kq.local_queue("team", cq)
    kq.wait_active(cq)
    e = env()
    assert _check(e).verdict is Verdict.FITS  # 24 free, needs 16
    kq.workload("other-team", "team", pods=2, gpus=8)  # Kueue admits it: 16 of 24 reserved
    wait_until(f"16 {GPU} reserved in {cq}", lambda: kq.reserved(cq) == 16, timeout=30)
    c = _check(e)
    assert c.verdict is Verdict.SHORT and (c.needed, c.free) == (16, 8), c
    assert "nominal 24, reserved 16" in c.detail and "full" in c.detail and cq in c.remediation
    missing = _check(e, "nope")
    assert missing.verdict is Verdict.SHORT and "no LocalQueue nope in namespace" in missing.detail


def test_the_provisioning_admission_check_is_named(env, kq: Kueue) -> None:
    a100 = kq.flavor("a100", A100)
    check = kq.provisioning_check("dws")
    cq = kq.cluster_queue("prov", [{"name": a100, "nominal": 32}], checks=(check,))
    kq.local_queue("default", cq)
    kq.wait_active(cq)  # the AdmissionCheck is Active: its controller runs and its config exists
    c = _check(env())
    assert c.verdict is Verdict.FITS and f"ProvisioningRequest AdmissionCheck: {check}" in c.detail, c
