"""Provisioner backends behind one contract (:mod:`kfp_gpu.provisioners.base`).

* ``node-pool`` (:mod:`.node_pool`): the run resizes dedicated node pools through the cloud provider.
* ``provisioning-request`` (:mod:`.provreq`): the cluster's autoscaler provisions the gang for an
  ``autoscaling.x-k8s.io/v1`` ProvisioningRequest (cluster-autoscaler's atomic scale-up, GKE's DWS).
* ``karpenter`` (:mod:`.karpenter`): Karpenter launches the gang for a NodePool scoped to the run.
* ``compute-class`` (:mod:`.compute_class`): GKE's node auto-provisioning brings the gang for a custom ComputeClass
  made from the spec's capacity chain (or named by ``target.compute_class``).

:func:`select` picks one for a run (the spec's ``target.provisioner``, or detection for ``"auto"``, see
:func:`detect`); a capacity remembers its backend, so later steps use the same one. :func:`backends` lists
every backend, for teardown and the janitor, which release whatever any of them holds.
"""

from __future__ import annotations

from kubernetes import client

from kfp_gpu.cluster import provreq as api_req
from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.errors import KfpGpuError
from kfp_gpu.plan.placement import matching_pools
from kfp_gpu.plan.provreq import BackendChoice, choose_backend
from kfp_gpu.providers.base import CapacityProvider
from kfp_gpu.provisioners.base import GangRequest, Provisioner, Released
from kfp_gpu.provisioners.compute_class import ComputeClassProvisioner
from kfp_gpu.provisioners.karpenter import KarpenterProvisioner
from kfp_gpu.provisioners.kueue_admission import KueueAdmissionProvisioner
from kfp_gpu.provisioners.node_pool import NodePoolProvisioner
from kfp_gpu.provisioners.provreq import ProvisioningRequestProvisioner
from kfp_gpu.spec import ProvisioningSpec, TargetKind

__all__ = ["GangRequest", "Provisioner", "Released", "backends", "capabilities", "detect", "provider_for", "select"]

_CLASSES: dict[str, type[Provisioner]] = {
    cls.name: cls for cls in (NodePoolProvisioner, ProvisioningRequestProvisioner, KueueAdmissionProvisioner,
                              KarpenterProvisioner, ComputeClassProvisioner)}


def capabilities(name: str) -> type[Provisioner] | None:
    """The backend class named ``name`` (a ``Capacity.extra["provisioner"]`` or a detected choice), whose class
    attributes are the contract's capabilities (:mod:`kfp_gpu.provisioners.base`); None for a name no backend has
    ("unknown" when no cluster was reachable). Pure; raises nothing."""
    return _CLASSES.get(name)


def detect(spec: ProvisioningSpec, api: client.ApiClient, provider: CapacityProvider | None) -> BackendChoice:
    """Which backend serves ``spec`` on this cluster, and why (the preflight report shows both).

    Observed: the ProvisioningRequest CRD; a cluster-autoscaler in the cluster (its status ConfigMap is
    fresh) or, on GKE, the control plane's autoscaler serving the pools that have autoscaling enabled; the
    matching pools' autoscaling and queued-provisioning settings (from the provider; unknown pools count as
    neither). Raises: nothing; an API that cannot be read counts as absent.
    """
    if spec.target.provisioner != "auto":
        return BackendChoice(spec.target.provisioner, f"target.provisioner={spec.target.provisioner!r} in the spec")
    check = _kueue_provisioning(spec, api)
    if check is not None:
        return check
    cclass = _compute_class(spec, api)
    if cclass is not None:
        return cclass
    karpenter = _karpenter(spec, api, provider)
    if karpenter is not None:
        return karpenter
    try:
        crd = api_req.api_served(api)
        groups = api_req.autoscaler_node_groups(api) if crd else None
    except client.ApiException:
        crd, groups = False, None
    autoscaled: list[str] = []
    queued: list[str] = []
    if provider is not None:
        try:
            for st in matching_pools(spec, provider.pools(spec.target.region, sizes=False)):
                if st.autoscaling:
                    autoscaled.append(st.ref.pool)
                if st.queued_provisioning:
                    queued.append(st.ref.pool)
        except KfpGpuError:
            pass
    # pools an autoscaler serves: a cluster-autoscaler's node groups (self-managed, e.g. EKS or the local
    # profile) that target.pools names; on GKE the control plane's autoscaler serves every autoscaled pool
    served = [g for g in groups or [] if g in spec.target.pools]  # named: the status says nothing of accelerators
    if spec.target.kind is TargetKind.GKE:
        served += autoscaled
    return choose_backend("auto", capacity=spec.capacity.value, crd=crd, autoscaler=bool(served),
                          autoscaled_pools=sorted(set(served)), queued_pools=sorted(set(queued)))


def _kueue_provisioning(spec: ProvisioningSpec, api: client.ApiClient) -> BackendChoice | None:
    """kueue-admission when the run's LocalQueue leads to a ClusterQueue with a ProvisioningRequest AdmissionCheck:
    Kueue will create the request itself, and a second one from kfp-gpu would provision the gang twice."""
    from kfp_gpu.cluster.kueue import read_queue_setup, resolve_local_queue
    from kfp_gpu.plan.kueue import provisioning_check

    try:
        lq = resolve_local_queue(api, spec.target.namespace, spec.target.queue)
        check = provisioning_check(read_queue_setup(api, lq)) if lq is not None else ""
    except (KfpGpuError, client.ApiException):
        return None  # the train step and preflight report a queue that cannot be resolved
    if not check or lq is None:
        return None
    return BackendChoice("kueue-admission", f"LocalQueue {lq.name} -> ClusterQueue {lq.cluster_queue} has the "
                         f"ProvisioningRequest AdmissionCheck {check}: Kueue provisions the gang when it admits the job")


def _compute_class(spec: ProvisioningSpec, api: client.ApiClient) -> BackendChoice | None:
    """compute-class where the cluster serves cloud.google.com/v1 ComputeClasses and the spec asks for a capacity
    chain (``fallback``) or names a class (``target.compute_class``). Raises: nothing."""
    from kfp_gpu.cluster import computeclass as api_cc

    if spec.target.kind is TargetKind.EKS or not (spec.fallback or spec.target.compute_class):
        return None
    try:
        if not api_cc.crd_served(api):
            return None
    except client.ApiException:
        return None
    why = (f"names the ComputeClass {spec.target.compute_class}" if spec.target.compute_class else
           f"asks for the chain {' > '.join(c.value for c in spec.chain)}")
    return BackendChoice("compute-class", f"the cluster serves cloud.google.com/v1 ComputeClasses and the spec {why}: "
                         "GKE's node auto-provisioning walks the class's priorities")


def _karpenter(spec: ProvisioningSpec, api: client.ApiClient, provider: CapacityProvider | None
               ) -> BackendChoice | None:
    """karpenter for an EKS target whose cluster serves karpenter.sh/v1 NodePools, unless ``target.pools`` names
    a node group that exists (then the run resizes the named managed node groups). Raises: nothing."""
    from kfp_gpu.cluster import karpenter as api_k

    if spec.target.kind is not TargetKind.EKS:
        return None
    try:
        if not api_k.crd_served(api):
            return None
    except client.ApiException:
        return None
    if spec.target.pools and provider is not None:
        try:
            groups = sorted({st.ref.pool for st in provider.pools(spec.target.region, sizes=False)}
                            & set(spec.target.pools))
        except KfpGpuError:
            return None  # the node groups cannot be listed: the node-pool backend reports why
        if groups:
            return None
        return BackendChoice("karpenter", f"the EKS cluster serves karpenter.sh/v1 NodePools and none of "
                             f"target.pools ({', '.join(spec.target.pools)}) is a managed node group: Karpenter "
                             "launches the gang for a NodePool scoped to the run")
    return BackendChoice("karpenter", "the EKS cluster serves karpenter.sh/v1 NodePools and target.pools names no "
                         "node group: Karpenter launches the gang for a NodePool scoped to the run")


def select(spec: ProvisioningSpec, api: client.ApiClient, provider: CapacityProvider | None = None,
           capacity: Capacity | None = None) -> Provisioner:
    """The backend of ``capacity`` when it names one, else the spec's choice (detected for ``"auto"``).
    ``provider`` None: the target's provider, made only when the backend (or detection) needs it.

    Raises: InvalidSpec, PermissionDenied: the node-pool backend cannot reach the target's cloud.
    """
    if capacity is not None:  # a capacity from before backends were recorded is node-pool capacity
        name = str(capacity.extra.get("provisioner", "node-pool"))
    else:
        provider = provider if provider is not None else provider_for(spec)
        name = detect(spec, api, provider).name
    if provider is None and name == "node-pool":
        provider = provider_for(spec)  # raises the one-line error naming what is missing
    elif provider is None:  # the provisioning-request backend reads pools only for DWS, and copes without
        try:
            provider = provider_for(spec)
        except KfpGpuError:
            provider = None
    return _make(name, api, provider)


def provider_for(spec: ProvisioningSpec) -> CapacityProvider | None:
    """The target's cloud provider; None for a local target with no stand-in anywhere (no endpoint, no
    KFP_GPU_SIM_ENDPOINT, no stand-in daemon): a local cluster whose own autoscaler is the only source of
    capacity. Raises: InvalidSpec, PermissionDenied (cloud targets)."""
    from kfp_gpu.errors import InvalidSpec
    from kfp_gpu.providers import for_target

    try:
        return for_target(spec.target)
    except InvalidSpec:
        if spec.target.kind is TargetKind.LOCAL:
            return None
        raise


def backends(api: client.ApiClient, provider: CapacityProvider | None) -> list[Provisioner]:
    """Every backend that can hold something (teardown releases what any of them holds for a run); without a
    provider nothing can have been resized, so the node-pool backend is left out."""
    out: list[Provisioner] = [] if provider is None else [_make("node-pool", api, provider)]
    return [*out, _make("provisioning-request", api, provider), _make("kueue-admission", api, provider),
            _make("karpenter", api, provider), _make("compute-class", api, provider)]


def _make(name: str, api: client.ApiClient, provider: CapacityProvider | None) -> Provisioner:
    if name == "kueue-admission":
        return KueueAdmissionProvisioner(api)
    if name == "karpenter":
        return KarpenterProvisioner(api)
    if name == "compute-class":  # a multi-node flex-start rung goes through the all-or-nothing queued backend
        return ComputeClassProvisioner(api, queued=ProvisioningRequestProvisioner(api, provider))
    if name == "provisioning-request":
        return ProvisioningRequestProvisioner(api, provider)
    return NodePoolProvisioner(api, provider)
