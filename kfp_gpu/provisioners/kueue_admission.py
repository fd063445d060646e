"""The ``kueue-admission`` provisioner: Kueue provisions the gang when it admits the job.

On a cluster whose ClusterQueue (behind the run's LocalQueue) has an AdmissionCheck with controller
``kueue.x-k8s.io/provisioning-request`` (and a ProvisioningRequestConfig), Kueue itself creates a
ProvisioningRequest for the job's Workload once it reserves quota, the cluster's autoscaler provisions it, and
Kueue admits (unsuspends) the job with the consume annotations on its pods. kfp-gpu must not create a second
request, so this backend asks for nothing:

* acquire: resolves the LocalQueue -> ClusterQueue -> AdmissionCheck and returns a capacity with no nodes that
  records them; the gang forms when the job is admitted (the train step then claims the nodes its pods landed on).
* replace: the capacity without the lost nodes; Kueue's admission makes the new request when the job is re-admitted.
* before_job, pod_annotations, revoked: nothing to add (Kueue writes the pods' consume annotations itself).
* release: nothing: Kueue deletes the requests it made with the Workload, which goes with the job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kubernetes import client

from kfp_gpu import accelerators
from kfp_gpu.cluster import node_labels
from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.plan.kueue import provisioning_check
from kfp_gpu.provisioners.base import GangRequest, NothingExtra, Released
from kfp_gpu.spec import ProvisioningSpec

NAME = "kueue-admission"


class KueueAdmissionProvisioner(NothingExtra):
    """The kueue-admission backend (contract: :mod:`kfp_gpu.provisioners.base`)."""

    name = NAME
    gang_forms_at_admission = True  # Kueue's ProvisioningRequest admission check provisions it at admission
    releases_one_node = False  # Kueue's request, not the run's: a node given up stays cordoned for the autoscaler

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def acquire(self, spec: ProvisioningSpec, run_id: str, request: GangRequest) -> Capacity:
        """Raises: InvalidSpec (no LocalQueue, or its ClusterQueue has no ProvisioningRequest AdmissionCheck)."""
        from kfp_gpu.cluster.kueue import read_queue_setup, resolve_local_queue

        ns = spec.target.namespace
        lq = resolve_local_queue(self.api, ns, spec.target.queue)
        if lq is None:
            raise InvalidSpec("target.provisioner", NAME, f"namespace {ns} has no Kueue LocalQueue",
                              remediation="create a LocalQueue, or use target.provisioner='provisioning-request'")
        setup = read_queue_setup(self.api, lq)
        check = provisioning_check(setup)
        if not check:
            raise InvalidSpec("target.provisioner", NAME, f"ClusterQueue {lq.cluster_queue} (LocalQueue {lq.name}) has "
                              "no AdmissionCheck with controller kueue.x-k8s.io/provisioning-request",
                              remediation="add one (with a ProvisioningRequestConfig) or use "
                              "target.provisioner='provisioning-request'")
        extra: dict[str, Any] = {"provisioner": NAME, "queue": lq.name, "cluster_queue": lq.cluster_queue,
                                 "admission_check": check, "pools": list(spec.target.pools), "zones": list(spec.zones)}
        if spec.target.tolerations:
            extra["tolerations"] = list(spec.target.tolerations)
        return Capacity(run_id, (), spec.gpus_per_node, accelerators.get(spec.accelerator).gke_label, spec.spot,
                        "", extra, scheme=node_labels.for_target(spec.target.kind.value).name,
                        accelerator=spec.accelerator, namespace=spec.target.namespace)

    def replace(self, spec: ProvisioningSpec, run_id: str, capacity: Capacity, lost: Sequence[str], *,
                extra: int, zone_hint: str, on_demand: bool, attempt: int, lost_uids: Sequence[str]) -> Capacity:
        gone = set(lost)
        placements = tuple(dataclasses.replace(p, nodes=tuple(n for n in p.nodes if n not in gone))
                           for p in capacity.placements)
        return dataclasses.replace(capacity, placements=tuple(p for p in placements if p.nodes))

    def release(self, spec: ProvisioningSpec, run_id: str) -> Released:
        return Released()
