"""The permissions kfp-gpu's code needs, each with its reason: the lists the RBAC manifests must match.

Three identities (docs/rbac-iam.md):

* ``STEP_NEEDS``: the controller (ServiceAccount kfp-gpu-system/kfp-gpu-controller,
  kfp_gpu/manifests/controller-rbac.yaml). It runs the step functions (kfp_gpu/steps/*.py, in its work units) and
  kfp_gpu/controller/*.py (kopf's handlers, the runner, admission, owner-gone release). Scope ``CLUSTER``: ClusterRole
  kfp-gpu-controller, bound cluster-wide; scope ``NS``: ClusterRole kfp-gpu-controller-tenant, bound by a RoleBinding
  in each tenant namespace (``kfp-gpu tenant add``).
* ``TENANT_NEEDS``: a tenant's pipeline steps (ServiceAccount ``kfp-gpu``, the Role of
  :func:`kfp_gpu.install.tenant_objects`): kfp_gpu/gang/client.py, the GpuGang API.
* ``JANITOR_NEEDS``: ``kfp-gpu gc`` (ServiceAccount kfp-gpu-janitor, deploy/janitor-rbac.yaml), an admin tool.

Keep in sync with the code. tests/integration/test_rbac.py fails when a Kubernetes client call or raw request
in kfp_gpu/ is missing from ``CODE_CALLS`` / ``RAW_CALLS``, when a call needs a permission its identity's list
lacks, when a listed permission is used by no call (``KOPF_NEEDS`` excepted: kopf's own requests, which no scan
sees), and when a manifest or docs/rbac-iam.md differ from these lists. Code that runs as the platform admin
(``ADMIN_MODULES``) is not scanned.
"""

from __future__ import annotations

from kfp_gpu.cluster.kueue import CRD as KUEUE_CRD
from kfp_gpu.gang import api as gang

Need = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)
_PR = "autoscaling.x-k8s.io"
_TR = "trainer.kubeflow.org"
_KS = "karpenter.sh"
_CC = "cloud.google.com"
_GG = gang.GROUP
_GANGS, _GSTATUS, _POLICIES = gang.PLURAL, f"{gang.PLURAL}/status", gang.POLICY_PLURAL
_CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
NS, CLUSTER = "namespace", "cluster"

# Keep in sync with the code: test_every_client_call_is_covered fails on a call missing from CODE_CALLS /
# RAW_CALLS, or whose permission is not listed for its identity; test_controller_rights_are_exactly_the_listed_
# permissions fails when controller-rbac.yaml and this list differ.
STEP_NEEDS: dict[Need, tuple[str, str]] = {  # the controller's -> (scope, why)
    # ---- the controller itself (kfp_gpu/controller/*.py) and kopf
    (_GG, _GANGS, "get"): (CLUSTER, "runner: re-read its gang"),
    (_GG, _GANGS, "list"): (CLUSTER, "kopf: every tenant's gangs; admission: the GPUs a namespace's gangs hold"),
    (_GG, _GANGS, "watch"): (CLUSTER, "kopf: every tenant's gangs (one daemon per gang)"),
    (_GG, _GANGS, "patch"): (CLUSTER, "kopf: the release finalizer and its progress annotations"),
    (_GG, _GANGS, "delete"): (CLUSTER, "runner: delete a gang whose owner is gone (the finalizer releases it)"),
    (_GG, _GSTATUS, "patch"): (CLUSTER, "runner: conditions, phase, outputs, results (the only status writer)"),
    (_GG, _POLICIES, "list"): (CLUSTER, "admission: the GpuPolicies a gang must satisfy"),
    ("", "namespaces", "get"): (CLUSTER, "admission: the gang's namespace labels (a policy's namespaceSelector)"),
    ("", "namespaces", "list"): (CLUSTER, "kopf with --namespace: which of the namespaces exist"),
    ("", "namespaces", "watch"): (CLUSTER, "kopf with --namespace: namespaces that come and go"),
    ("", "events", "create"): (CLUSTER, "runner and kopf: events on the gangs (kubectl describe gpugang)"),
    (*_CRDS, "list"): (CLUSTER, "kopf: which resources are served"),
    (*_CRDS, "watch"): (CLUSTER, "kopf: resources that come and go"),
    ("argoproj.io", "workflows", "get"): (NS, "owner-gone release: is the gang's Argo Workflow still running"),
    # ---- the step functions (kfp_gpu/steps/*.py), run by the controller's work units
    ("", "nodes", "get"): (CLUSTER, "train: is a gang node gone; claim: re-read a node on conflict"),
    ("", "nodes", "list"): (CLUSTER, "scale_up/train/teardown/preflight: GPU nodes, claimed nodes"),
    ("", "nodes", "watch"): (CLUSTER, "scale_up: nodes to Ready; train: gang nodes (preemption taints)"),
    ("", "nodes", "patch"): (CLUSTER, "claim/release a node (run-id + lease labels, the run's taint)"),
    ("", "pods", "get"): (NS, "re-read a balloon"),
    ("", "pods", "list"): (NS, "balloons of a run; the gang's pods (train watch)"),
    ("", "pods", "watch"): (NS, "train: the gang's pods (placement, eviction, exit codes)"),
    ("", "pods", "create"): (NS, "warm_pool: balloon pods"),
    ("", "pods", "delete"): (NS, "teardown: balloons; train: pods stuck on a vanished node"),
    ("", "pods/log", "get"): (NS, "train: last log lines of a failed trainer in the error"),
    ("", "configmaps", "get"): (NS, "every step: read its ledger (a retried pod re-attaches)"),
    ("", "configmaps", "list"): (NS, "teardown: every ledger of the run"),
    ("", "configmaps", "create"): (NS, "every step: write its ledger"),
    ("", "configmaps", "update"): (NS, "every step: update its ledger"),
    ("", "configmaps", "delete"): (NS, "teardown: drop the run's ledgers"),
    ("", "resourcequotas", "list"): (NS, "preflight: namespace GPU quota"),
    ("kubeflow.org", "pytorchjobs", "get"): (NS, "train: re-attach to the run's job"),
    ("kubeflow.org", "pytorchjobs", "list"): (NS, "train: watch the job; teardown: the run's jobs"),
    ("kubeflow.org", "pytorchjobs", "watch"): (NS, "train: the job's conditions"),
    ("kubeflow.org", "pytorchjobs", "create"): (NS, "train: the gang job"),
    ("kubeflow.org", "pytorchjobs", "delete"): (NS, "train: recovery/cancel; teardown"),
    (_TR, "trainjobs", "get"): (NS, "train: re-attach to the run's TrainJob"),
    (_TR, "trainjobs", "list"): (NS, "train: watch the TrainJob; teardown: the run's TrainJobs"),
    (_TR, "trainjobs", "watch"): (NS, "train: the TrainJob's conditions"),
    (_TR, "trainjobs", "create"): (NS, "train: the gang job as a TrainJob"),
    (_TR, "trainjobs", "delete"): (NS, "train: recovery/cancel; teardown"),
    (_TR, "trainingruntimes", "get"): (NS, "train: a TrainJob's namespaced runtime"),
    (_TR, "clustertrainingruntimes", "get"): (CLUSTER, "train: a TrainJob's runtime"),
    ("coordination.k8s.io", "leases", "list"): (NS, "teardown: the run's Leases"),
    ("coordination.k8s.io", "leases", "delete"): (NS, "teardown: the run's Leases"),
    ("kueue.x-k8s.io", "localqueues", "list"): (NS, "preflight/train: the namespace's LocalQueue"),
    ("kueue.x-k8s.io", "workloads", "list"): (NS, "train: the job's Workload (admission, eviction)"),
    ("kueue.x-k8s.io", "workloads", "watch"): (NS, "train: the Workload's conditions while queued and running"),
    ("kueue.x-k8s.io", "clusterqueues", "get"): (CLUSTER, "preflight: its ClusterQueue's free GPUs"),
    ("kueue.x-k8s.io", "resourceflavors", "list"): (CLUSTER, "preflight: which accelerator each flavor is"),
    ("kueue.x-k8s.io", "admissionchecks", "get"): (CLUSTER, "preflight: the ProvisioningRequest AdmissionCheck"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "get"): (CLUSTER, f"preflight: is {KUEUE_CRD} there"),
    ("scheduling.k8s.io", "priorityclasses", "create"): (CLUSTER, "warm_pool: the balloon PriorityClass"),
    ("", "podtemplates", "list"): (NS, "teardown: the run's PodTemplates"),
    ("", "podtemplates", "create"): (NS, "provisioning-request: the gang's pod shape"),
    ("", "podtemplates", "delete"): (NS, "provisioning-request: a given-up request's; teardown"),
    (_PR, "provisioningrequests", "get"): (NS, "provisioning-request: re-attach; booking and revocation checks"),
    (_PR, "provisioningrequests", "list"): (NS, "provisioning-request: watch one request; teardown: the run's"),
    (_PR, "provisioningrequests", "watch"): (NS, "provisioning-request: the request's conditions"),
    (_PR, "provisioningrequests", "create"): (NS, "provisioning-request: ask the autoscaler for the gang"),
    (_PR, "provisioningrequests", "delete"): (NS, "provisioning-request: a given-up request; teardown"),
    ("", "events", "list"): (NS, "karpenter: Karpenter's FailedScheduling events on the placeholder pods"),
    ("", "events", "watch"): (NS, "karpenter: Karpenter's FailedScheduling events on the placeholder pods"),
    (_KS, "nodepools", "get"): (CLUSTER, "karpenter: re-attach to the run's NodePool"),
    (_KS, "nodepools", "list"): (CLUSTER, "karpenter: teardown waits for the run's NodePools to go"),
    (_KS, "nodepools", "create"): (CLUSTER, "karpenter: the NodePool scoped to the run"),
    (_KS, "nodepools", "patch"): (CLUSTER, "karpenter: next zone/capacity type; recovery raises the limit"),
    (_KS, "nodepools", "delete"): (CLUSTER, "karpenter: teardown; a failed scale-up rolls it back"),
    (_KS, "nodeclaims", "list"): (CLUSTER, "karpenter: the NodePool's NodeClaims (launch, ICE)"),
    (_KS, "nodeclaims", "watch"): (CLUSTER, "karpenter: the NodePool's NodeClaims (launch, ICE)"),
    (_KS, "nodeclaims", "delete"): (CLUSTER, "karpenter: the NodeClaims of a blocked zone"),
    (_CC, "computeclasses", "get"): (CLUSTER, "compute-class: the ComputeClass target.compute_class names"),
    (_CC, "computeclasses", "list"): (CLUSTER, "compute-class: teardown finds the run's ComputeClass"),
    (_CC, "computeclasses", "create"): (CLUSTER, "compute-class: the ComputeClass made from the run's capacity chain"),
    (_CC, "computeclasses", "patch"): (CLUSTER, "compute-class: a retried step converges on its class"),
    (_CC, "computeclasses", "delete"): (CLUSTER, "compute-class: teardown"),
    ("karpenter.k8s.aws", "ec2nodeclasses", "list"): (CLUSTER, "karpenter: the NodePool's node class (AWS)"),
    ("karpenter.kwok.sh", "kwoknodeclasses", "list"): (CLUSTER, "karpenter: the NodePool's node class (kwok)"),
}
# Requests kopf makes itself (the scan sees only kfp_gpu's): listed in STEP_NEEDS, used by no scanned call.
KOPF_NEEDS: set[Need] = {
    (_GG, _GANGS, "watch"), (_GG, _GANGS, "patch"), ("", "namespaces", "list"), ("", "namespaces", "watch"),
    (*_CRDS, "list"), (*_CRDS, "watch"),
}
# The pipeline steps (kfp_gpu/gang/client.py, through kfp_gpu/steps/entry.py's request_step): one tenant namespace.
TENANT_NEEDS: dict[Need, tuple[str, str]] = {
    (_GG, _GANGS, "get"): (NS, "every step: the run's gang (teardown: is there one)"),
    (_GG, _GANGS, "create"): (NS, "the first step of a run creates its gang (spec, owner)"),
    (_GG, _GANGS, "patch"): (NS, "raise spec.stage; ask for a job (spec.jobs); teardown sets spec.release"),
    (_GG, _GANGS, "delete"): (NS, "teardown: the released gang"),
    (_GG, _GANGS, "list"): (NS, "wait for the controller's answer (a watch on the one gang)"),
    (_GG, _GANGS, "watch"): (NS, "wait for the controller's answer (a watch on the one gang)"),
    ("", "pods", "get"): (NS, "the step's own pod: its Argo Workflow, recorded as the gang's owner"),
}
TENANT_MODULES = {"gang/client.py"}  # the code that runs as a tenant's step; the rest runs as the controller
# Helpers outside TENANT_MODULES a step reaches (module, function, method), and the name the step calls them by.
TENANT_HELPERS: dict[tuple[str, str, str], str] = {("cluster/lease.py", "detect_identity", "GET"): "detect_identity"}
# Client methods a tenant module calls -> what they need there (the controller's CODE_CALLS cover every kind).
TENANT_CODE_CALLS: dict[str, set[Need]] = {"list_namespaced_custom_object": {(_GG, _GANGS, "list"),
                                                                             (_GG, _GANGS, "watch")}}
JANITOR_NEEDS: dict[Need, tuple[str, str]] = {
    ("", "configmaps", "list"): (CLUSTER, "ledgers of every run"),
    ("", "configmaps", "delete"): (CLUSTER, "ledgers of a released run"),
    ("", "pods", "get"): (CLUSTER, "is a run's step pod (its lease owner) still there"),
    ("", "pods", "list"): (CLUSTER, "orphaned balloons"),
    ("", "pods", "delete"): (CLUSTER, "orphaned balloons"),
    ("", "nodes", "list"): (CLUSTER, "claimed nodes"),
    ("", "nodes", "patch"): (CLUSTER, "release node claims"),
    ("kubeflow.org", "pytorchjobs", "list"): (CLUSTER, "the job of a released run"),
    ("kubeflow.org", "pytorchjobs", "delete"): (CLUSTER, "the job of a released run"),
    (_TR, "trainjobs", "list"): (CLUSTER, "the TrainJob of a released run"),
    (_TR, "trainjobs", "delete"): (CLUSTER, "the TrainJob of a released run"),
    ("coordination.k8s.io", "leases", "list"): (CLUSTER, "the runs' ownership Leases"),
    ("coordination.k8s.io", "leases", "delete"): (CLUSTER, "the Leases of a released run"),
    ("argoproj.io", "workflows", "get"): (CLUSTER, "is a run's Argo Workflow (its lease owner) still running"),
    (_GG, _GANGS, "list"): (CLUSTER, "a run with a GpuGang is the controller's: never swept"),
    (_PR, "provisioningrequests", "list"): (CLUSTER, "the ProvisioningRequests of a released run"),
    (_PR, "provisioningrequests", "delete"): (CLUSTER, "the ProvisioningRequests of a released run"),
    ("", "podtemplates", "list"): (CLUSTER, "the PodTemplates of a released run"),
    ("", "podtemplates", "delete"): (CLUSTER, "the PodTemplates of a released run"),
    (_KS, "nodepools", "list"): (CLUSTER, "the NodePools of a released run"),
    (_KS, "nodepools", "delete"): (CLUSTER, "the NodePools of a released run"),
    (_CC, "computeclasses", "list"): (CLUSTER, "the ComputeClasses of a released run"),
    (_CC, "computeclasses", "delete"): (CLUSTER, "the ComputeClasses of a released run"),
    ("coordination.k8s.io", "leases", "get"): (NS, "the janitor's lock"),
    ("coordination.k8s.io", "leases", "create"): (NS, "the janitor's lock"),
    ("coordination.k8s.io", "leases", "update"): (NS, "the janitor's lock"),
}
# Names a rule is restricted to (resourceNames in the manifest).
NAMED = {("apiextensions.k8s.io", "customresourcedefinitions", "get"): KUEUE_CRD}

_PODS, _CMS, _NODES = "pods", "configmaps", "nodes"
_JOBS = ("kubeflow.org", "pytorchjobs")
_TJOBS = (_TR, "trainjobs")
_LEASES = ("coordination.k8s.io", "leases")
# Kubernetes client method -> the permissions it (or the watch built on it) needs.
CODE_CALLS: dict[str, set[Need]] = {
    "read_node": {("", _NODES, "get")},
    "list_node": {("", _NODES, "list"), ("", _NODES, "watch")},
    "patch_node": {("", _NODES, "patch")},
    "read_namespaced_pod": {("", _PODS, "get")},
    "list_namespaced_pod": {("", _PODS, "list"), ("", _PODS, "watch")},
    "list_pod_for_all_namespaces": {("", _PODS, "list")},
    "create_namespaced_pod": {("", _PODS, "create")},
    "delete_namespaced_pod": {("", _PODS, "delete")},
    "read_namespaced_pod_log": {("", "pods/log", "get")},
    "read_namespaced_config_map": {("", _CMS, "get")},
    "list_namespaced_config_map": {("", _CMS, "list")},
    "list_config_map_for_all_namespaces": {("", _CMS, "list")},
    "create_namespaced_config_map": {("", _CMS, "create")},
    "replace_namespaced_config_map": {("", _CMS, "update")},
    "delete_namespaced_config_map": {("", _CMS, "delete")},
    "list_namespaced_resource_quota": {("", "resourcequotas", "list")},
    "get_namespaced_custom_object": {(*_JOBS, "get"), (*_TJOBS, "get"), (_TR, "trainingruntimes", "get"), (_PR, "provisioningrequests", "get")},
    "list_namespaced_custom_object": {(*_JOBS, "list"), (*_JOBS, "watch"), (*_TJOBS, "list"), (*_TJOBS, "watch"),
                                      ("kueue.x-k8s.io", "localqueues", "list"),
                                      ("kueue.x-k8s.io", "workloads", "list"), ("kueue.x-k8s.io", "workloads", "watch"),
                                      (_PR, "provisioningrequests", "list"), (_PR, "provisioningrequests", "watch")},
    "create_namespaced_custom_object": {(*_JOBS, "create"), (*_TJOBS, "create"), (_PR, "provisioningrequests", "create")},
    "delete_namespaced_custom_object": {(*_JOBS, "delete"), (*_TJOBS, "delete"), (_PR, "provisioningrequests", "delete")},
    "create_namespaced_pod_template": {("", "podtemplates", "create")},
    "delete_namespaced_pod_template": {("", "podtemplates", "delete")},
    "list_namespaced_pod_template": {("", "podtemplates", "list")},
    "get_cluster_custom_object": {(_TR, "clustertrainingruntimes", "get"), ("kueue.x-k8s.io", "clusterqueues", "get"), ("kueue.x-k8s.io", "admissionchecks", "get"),
                                  (_KS, "nodepools", "get"), (_CC, "computeclasses", "get")},
    "list_cluster_custom_object": {("kueue.x-k8s.io", "resourceflavors", "list"), (_KS, "nodepools", "list"),
                                   (_KS, "nodeclaims", "list"), (_KS, "nodeclaims", "watch"),
                                   ("karpenter.k8s.aws", "ec2nodeclasses", "list"),
                                   ("karpenter.kwok.sh", "kwoknodeclasses", "list"), (_CC, "computeclasses", "list")},
    "create_cluster_custom_object": {(_KS, "nodepools", "create"), (_CC, "computeclasses", "create")},
    "patch_cluster_custom_object": {(_KS, "nodepools", "patch"), (_CC, "computeclasses", "patch")},
    "delete_cluster_custom_object": {(_KS, "nodepools", "delete"), (_KS, "nodeclaims", "delete"),
                                     (_CC, "computeclasses", "delete")},
    "list_namespaced_event": {("", "events", "list"), ("", "events", "watch")},
    "read_custom_resource_definition": {("apiextensions.k8s.io", "customresourcedefinitions", "get")},
    "create_priority_class": {("scheduling.k8s.io", "priorityclasses", "create")},
    "create_self_subject_access_review": set(),  # every authenticated user may ask what it may do
    "get_code": set(),  # GET /version: readable by every authenticated user (system:public-info-viewer)
}
# Modules (paths under kfp_gpu/, or their prefixes) that run as the platform admin, never as one of the identities.
ADMIN_MODULES = {
    "devcluster": "the local cluster: boots and sets it up as admin",
    "sim": "the cloud stand-in, as admin",
    "install.py": "kfp-gpu install / tenant add|remove: the platform admin",
    "kubeapply.py": "server-side apply for kfp_gpu/install.py",
}
# Functions that hold client calls but never run as the controller, a step or the janitor.
ADMIN_ONLY = {("cluster/identity.py", "record_local"): "the dev cluster's boot writes its identity, as admin"}
_REQS, _TEMPLATES = (_PR, "provisioningrequests"), ("", "podtemplates")
OWNED_KINDS = {("", _CMS), ("", _PODS), ("", _NODES), _JOBS, _TJOBS, _LEASES, _REQS, _TEMPLATES, (_KS, "nodepools"),
               (_CC, "computeclasses")}  # owned.py's Kind table
# Raw requests (api.call_api / owned.request): (module, function, HTTP method) -> permissions. Discovery
# (GET /apis/<group>/<version>) needs none: every authenticated user may read it.
RAW_CALLS: dict[tuple[str, str, str], set[Need]] = {
    ("cluster/owned.py", "request", "*"): set(),  # the helper itself; its callers are listed
    ("cluster/owned.py", "list_objects", "GET"): {(g, r, "list") for g, r in OWNED_KINDS},
    ("cluster/owned.py", "delete", "DELETE"): {(g, r, "delete") for g, r in OWNED_KINDS - {("", _NODES)}},
    ("cluster/customjob.py", "served", "GET"): set(),  # discovery (every job kind)
    ("cluster/lease.py", "detect_identity", "GET"): {("", _PODS, "get")},
    ("cluster/lease.py", "release", "GET"): {(*_LEASES, "get")},
    ("cluster/lease.py", "release", "PUT"): {(*_LEASES, "update")},
    ("cluster/lease.py", "_write", "GET"): {(*_LEASES, "get")},
    ("cluster/lease.py", "_write", "POST"): {(*_LEASES, "create")},
    ("cluster/lease.py", "_write", "PUT"): {(*_LEASES, "update")},
    ("cluster/owners.py", "_check", "GET"): {("", _PODS, "get"), ("argoproj.io", "workflows", "get")},
    ("cluster/owners.py", "_argo_served", "GET"): set(),  # discovery
    ("steps/janitor.py", "_gangs", "GET"): {(_GG, _GANGS, "list")},  # the janitor: a run with a gang is live
    # leader election: the Role kfp-gpu-controller in kfp-gpu-system (get/update on its Lease by name, create);
    # tests/unit/test_manifests.py::test_controller_lease_rights_are_its_one_lease checks that Role's Lease rules
    ("controller/election.py", "round", "GET"): {(*_LEASES, "get")},
    ("controller/election.py", "round", "POST"): {(*_LEASES, "create")},
    ("controller/election.py", "round", "PUT"): {(*_LEASES, "update")},
    ("controller/election.py", "release", "PUT"): {(*_LEASES, "update")},
    ("controller/runner.py", "post_event", "POST"): {("", "events", "create")},
    ("controller/runner.py", "read", "GET"): {(_GG, _GANGS, "get")},
    ("controller/runner.py", "flush", "PATCH"): {(_GG, _GSTATUS, "patch")},
    ("controller/runner.py", "_delete", "DELETE"): {(_GG, _GANGS, "delete")},
    ("controller/runner.py", "_verdict", "GET"): {(_GG, _POLICIES, "list"), ("", "namespaces", "get"),
                                                  (_GG, _GANGS, "list")},
    # the steps' side (TENANT_MODULES)
    ("gang/client.py", "get", "GET"): {(_GG, _GANGS, "get")},
    ("gang/client.py", "ensure", "POST"): {(_GG, _GANGS, "create")},
    ("gang/client.py", "patch", "PATCH"): {(_GG, _GANGS, "patch")},
    ("gang/client.py", "beat", "PATCH"): {(_GG, _GANGS, "patch")},  # the heartbeat of an unobservable owner
    ("gang/client.py", "delete", "DELETE"): {(_GG, _GANGS, "delete")},
}
# Things neither the controller nor the janitor may do (so the access checks can fail).
NEVER: list[tuple[Need, str]] = [
    (("", "secrets", "get"), NS), (("", "nodes", "delete"), CLUSTER), (("", "nodes", "create"), CLUSTER),
    (("", "pods/exec", "create"), NS), (("rbac.authorization.k8s.io", "rolebindings", "create"), NS),
    (("scheduling.k8s.io", "priorityclasses", "delete"), CLUSTER), (("", "namespaces", "delete"), CLUSTER),
]
