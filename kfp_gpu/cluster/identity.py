"""Which cluster do the credentials reach? A step must work on the cluster its spec names, not on whatever
cluster it happens to run in.

Sources, strongest first:

1. the ConfigMap ``kube-public/kfp-gpu-cluster-info`` that ``kfp_gpu_rehearsal.devcluster`` boot writes into the local
   control plane (:func:`record_local`): the credentials reach the kfp-gpu dev cluster;
2. the kubeconfig context's cluster name as the cloud CLIs write it: ``gke_{project}_{location}_{cluster}``
   (``gcloud container clusters get-credentials``), ``arn:aws:eks:{region}:{account}:cluster/{name}``
   (``aws eks update-kubeconfig``) or ``{name}.{region}.eksctl.io`` (eksctl);
3. inside a pod on GKE, the metadata server's ``instance/attributes/cluster-name`` and ``cluster-location``
   (header ``Metadata-Flavor: Google``; ``$GCE_METADATA_HOST`` overrides the host, as in google-auth).

A ``local`` target's ``target.cluster`` names a *simulated* cluster; many share the one local control plane
(nodes labelled ``kfp-gpu.io/sim-cluster``), so any of them is accepted as long as the control plane is the
kfp-gpu dev cluster, and refused when the ConfigMap is absent (the credentials reach some other cluster).
When no source answers, the step proceeds after one warning line on stderr.
"""

from __future__ import annotations

import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from kfp_gpu.errors import WrongCluster
from kfp_gpu.ownership import LABEL_MANAGED
from kfp_gpu.spec import Target, TargetKind

INFO_NAMESPACE = "kube-public"
INFO_NAME = "kfp-gpu-cluster-info"
LOCAL_KIND = "kfp-gpu-dev"
LOCAL_NAME = "kfp-gpu-local"
OTHER = "other"
METADATA_TIMEOUT_S = 1.0

_GKE_CONTEXT = re.compile(r"^gke_([a-z][-a-z0-9.:]*)_([a-z]+-[a-z]+\d+(?:-[a-z])?)_([a-z0-9][-a-z0-9]*)$")
_EKS_ARN = re.compile(r"^arn:aws[a-z-]*:eks:([a-z]{2}(?:-gov)?-[a-z]+-\d+):(\d{12}):cluster/(.+)$")
_EKSCTL = re.compile(r"^([A-Za-z][-A-Za-z0-9]*)\.([a-z]{2}(?:-gov)?-[a-z]+-\d+)\.eksctl\.io$")


@dataclass(frozen=True)
class ClusterIdentity:
    kind: str  # "gke" | "eks" | "local" | OTHER (known only not to be the dev cluster)
    name: str
    project: str = ""  # GCP project or AWS account
    location: str = ""  # GCP zone or region, AWS region
    source: str = ""  # where the identity was read

    def describe(self) -> str:
        if self.kind == "local":
            return f"the local kfp-gpu dev cluster ({self.source})"
        if self.kind == OTHER:
            return f"cluster {self.name or '?'!r} of the kubeconfig, which is not the local kfp-gpu dev cluster ({self.source})"
        where = ", ".join(x for x in (self.project, self.location) if x)
        return f"{self.kind.upper()} cluster {self.name!r}" + (f" ({where})" if where else "") + f" [{self.source}]"


def parse_context_cluster(name: str) -> ClusterIdentity | None:
    """The identity in a kubeconfig cluster name written by gcloud, the AWS CLI or eksctl; None otherwise."""
    src = f"kubeconfig cluster {name}"
    if m := _GKE_CONTEXT.match(name):
        return ClusterIdentity("gke", m.group(3), project=m.group(1), location=m.group(2), source=src)
    if m := _EKS_ARN.match(name):
        return ClusterIdentity("eks", m.group(3), project=m.group(2), location=m.group(1), source=src)
    if m := _EKSCTL.match(name):
        return ClusterIdentity("eks", m.group(1), location=m.group(2), source=src)
    return None


def mismatch(found: ClusterIdentity, target: Target) -> str:
    """Why ``found`` is not the cluster ``target`` names ("" when it is). Pure."""
    if target.kind is TargetKind.LOCAL:
        return "" if found.kind == "local" else f"target.kind is local, but the credentials reach {found.describe()}"
    if target.rehearsal and found.kind == "local":  # a GKE/EKS target rehearsed against a stand-in on this machine
        return ""
    want = f"{target.kind.value.upper()} cluster {target.cluster!r}"
    if found.kind != target.kind.value:
        return f"the spec names {want}, but the credentials reach {found.describe()}"
    if found.name != target.cluster:
        return f"the spec names {want}, but the credentials reach {found.describe()}"
    if target.kind is TargetKind.GKE and found.project and found.project != target.project:
        return f"the spec names {want} in project {target.project!r}, but the credentials reach {found.describe()}"
    if found.location and not (found.location == target.region or found.location.startswith(target.region + "-")):
        return f"the spec names {want} in {target.region}, but the credentials reach {found.describe()}"
    return ""


def from_local_info(api: client.ApiClient) -> tuple[ClusterIdentity | None, bool]:
    """The dev cluster's own record, and whether it is known to be absent (404: not the dev cluster).

    Forbidden or a dropped connection is (None, False): this source does not know.
    """
    try:
        cm = client.CoreV1Api(api).read_namespaced_config_map(INFO_NAME, INFO_NAMESPACE, _request_timeout=5)
    except ApiException as exc:
        return None, exc.status == 404
    except HTTPError:
        return None, False
    data = cm.data or {}
    if data.get("kind") != LOCAL_KIND:
        return None, True
    return ClusterIdentity("local", data.get("cluster", LOCAL_NAME), source=f"ConfigMap {INFO_NAMESPACE}/{INFO_NAME}"), False


def from_gce_metadata(timeout_s: float = METADATA_TIMEOUT_S) -> ClusterIdentity | None:
    """The GKE cluster this pod's node belongs to, from the metadata server; None off GKE or on any error."""
    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")

    def get(path: str) -> str:
        req = urllib.request.Request(f"http://{host}/computeMetadata/v1/{path}", headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - fixed http metadata URL
            if resp.headers.get("Metadata-Flavor") != "Google":
                raise urllib.error.URLError("not a metadata server")
            return str(resp.read().decode().strip())

    try:
        name = get("instance/attributes/cluster-name")
    except (OSError, ValueError):
        return None
    location = project = ""
    try:
        location = get("instance/attributes/cluster-location")
        project = get("project/project-id")
    except (OSError, ValueError):
        pass
    return ClusterIdentity("gke", name, project=project, location=location, source=f"metadata server {host}")


def identify(api: client.ApiClient, *, kube_cluster: str = "", in_pod: bool = False) -> ClusterIdentity | None:
    """The cluster the credentials reach, from the strongest source that answers; None when none does."""
    found, absent = from_local_info(api)
    if found is None and kube_cluster:
        found = parse_context_cluster(kube_cluster)
    if found is None and in_pod:
        found = from_gce_metadata()
    if found is None and absent:  # some cluster, and certainly not the dev cluster (boot always records it)
        return ClusterIdentity(OTHER, kube_cluster, source=f"no ConfigMap {INFO_NAMESPACE}/{INFO_NAME}")
    return found


def verify(api: client.ApiClient, target: Target, *, kube_cluster: str = "", in_pod: bool = False,
           warn: Callable[[str], None] | None = None) -> ClusterIdentity | None:
    """Refuse to work on another cluster than the one ``target`` names.

    Raises:
        WrongCluster: the credentials demonstrably reach another cluster (names both, and the fix).
    """
    found = identify(api, kube_cluster=kube_cluster, in_pod=in_pod)
    if found is not None and found.kind == OTHER and target.kind is not TargetKind.LOCAL:
        found = None  # "not the dev cluster" says nothing about which GKE/EKS cluster it is
    if found is None:
        (warn or _stderr)(
            f"kfp-gpu: warning: cannot tell which cluster the credentials reach (kubeconfig cluster "
            f"{kube_cluster or '-'}); assuming it is {target.kind.value} cluster {target.cluster!r}")
        return None
    why = mismatch(found, target)
    if why:
        raise WrongCluster(
            f"refusing to run on the wrong cluster: {why}",
            remediation=_fix(target),
            target_cluster=target.cluster, found=found.describe(),
        )
    return found


def _fix(target: Target) -> str:
    if target.kind is TargetKind.GKE:
        return (f"run the step in (or point KUBECONFIG at) {target.cluster!r}: gcloud container clusters get-credentials "
                f"{target.cluster} --location {target.region} --project {target.project}, or set target.kube_context; "
                "or correct target.cluster/project/region in the spec")
    if target.kind is TargetKind.EKS:
        return (f"run the step in (or point KUBECONFIG at) {target.cluster!r}: aws eks update-kubeconfig --name "
                f"{target.cluster} --region {target.region}, or set target.kube_context; or correct target.cluster")
    return ("point KUBECONFIG at the local dev cluster (make cluster-up boots it, records its identity and writes "
            "~/.cache/kfp-gpu/cluster/kubeconfig), or use a gke/eks target for a real cluster")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def record_local(api: client.ApiClient, server: str) -> None:
    """Write the dev cluster's identity (kube-public, readable by every authenticated user, like kubeadm's
    cluster-info), so steps running as any ServiceAccount can tell they reach it. Idempotent.

    Raises:
        ApiException: the ConfigMap, Role or RoleBinding cannot be written.
    """
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    labels = {LABEL_MANAGED: "true"}
    cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=INFO_NAME, labels=labels),
                            data={"kind": LOCAL_KIND, "cluster": LOCAL_NAME, "server": server})
    role = client.V1Role(metadata=client.V1ObjectMeta(name=f"{INFO_NAME}-reader", labels=labels), rules=[
        client.V1PolicyRule(api_groups=[""], resources=["configmaps"], resource_names=[INFO_NAME], verbs=["get"])])
    binding = client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name=f"{INFO_NAME}-reader", labels=labels),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=f"{INFO_NAME}-reader"),
        subjects=[client.RbacV1Subject(api_group="rbac.authorization.k8s.io", kind="Group", name="system:authenticated")])
    for create, replace, body in (
        (core.create_namespaced_config_map, core.replace_namespaced_config_map, cm),
        (rbac.create_namespaced_role, rbac.replace_namespaced_role, role),
        (rbac.create_namespaced_role_binding, rbac.replace_namespaced_role_binding, binding),
    ):
        try:
            create(INFO_NAMESPACE, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            replace(body.metadata.name, INFO_NAMESPACE, body)
