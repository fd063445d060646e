"""The burst benchmark's sides: their names and run order, which of them a stand-in serves, and whether one can
run on this cluster at a given N.

Contract: :data:`SIDES` is the run order (sides sharing a node group are apart); :data:`STANDIN_SIDES` get their
nodes from a fresh stand-in per side-run, :data:`CLOUD_ONLY_SIDES` only its cloud answers; :func:`not_run_reason`
is '' or the one-line reason a side is reported as not run (a missing autoscaler profile, a node-group limit, the
sequential baseline's cap), never an exception for a side that simply cannot run here.
"""

from __future__ import annotations

from kubernetes import client

from bench.world import profile_boot_drawn

__all__ = ["CLOUD_ONLY_SIDES", "KARPENTER_CLUSTER", "KARPENTER_NODE_CLASS", "PROFILE_MAX", "PROFILE_POOL", "SEQUENTIAL_MAX", "SIDES",
           "STANDIN_SIDES", "not_run_reason"]

SIDES = ("cluster_autoscaler", "naive", "cluster_autoscaler_provreq", "ours_node_pool", "karpenter", "sequential",
         "ours_provisioning_request", "ours_karpenter", "ours_compute_class")  # run in this order; shared node groups are apart
STANDIN_SIDES = ("naive", "sequential", "ours_node_pool", "ours_compute_class")
# Sides whose nodes come from an autoscaler on the shared cluster but whose steps still ask the cloud (quota, pools):
# they get the side-run's stand-in for those calls, so their quota is the bench world's (65,536 GPUs), as every
# stand-in side's, not the dev cluster's default world (128 A100 GPUs in us-central1), which refused N >= 64.
CLOUD_ONLY_SIDES = ("ours_provisioning_request",)
PROFILE_POOL = "ca-a100-bench"  # kfp_gpu_rehearsal.devcluster.ca_profile.BENCH_GROUP: us-central1-c, its own taint
PROFILE_MAX = 512
SEQUENTIAL_MAX = 16
KARPENTER_CLUSTER = "kfp-gpu-karpenter"  # the EKS cluster ours_karpenter's spec names (its AWS stand-in's)
KARPENTER_NODE_CLASS = "kfp-gpu-bench"  # the bench's own KWOKNodeClass: registration at once, boot by the Injector


def karpenter_controller_env() -> dict[str, str]:
    """The bench controller's Karpenter settings (the platform admin's, docs/operator-guide.md): the run's NodePool
    uses the bench's node class, and its template carries the boot-injection label and the not-ready startup taint,
    as the karpenter peer's NodePool does, so ours' Karpenter nodes boot on the world's sampler like the peer's."""
    import json

    from kfp_gpu.cluster.karpenter import NODE_CLASS_ENV, TEMPLATE_ENV
    from kfp_gpu_rehearsal.devcluster import karpenter_profile as kp
    from kfp_gpu_rehearsal.devcluster.nodes import BOOT_INJECTION_LABEL, NOT_READY_TAINT

    return {NODE_CLASS_ENV: f"{kp.NODECLASS_GROUP}/KWOKNodeClass/{KARPENTER_NODE_CLASS}",
            TEMPLATE_ENV: json.dumps({"labels": {BOOT_INJECTION_LABEL: "pending"},
                                      "startupTaints": [dict(NOT_READY_TAINT)]})}


def not_run_reason(api: client.ApiClient, core: client.CoreV1Api, side: str, n: int, *, ca_started: bool,
                   ca_error: str, sequential_max: int = SEQUENTIAL_MAX) -> str:
    """'' when ``side`` can run at this ``n`` on this cluster, else the reason it is not run (it goes into the
    results as ``not_run``). ``ca_started``/``ca_error``: whether the bench's own cluster-autoscaler started.

    Raises: ApiException when the cluster cannot be read.
    """
    if side == "sequential" and n > sequential_max:
        return (f"the one-at-a-time loop is the anecdotal baseline, run up to N={sequential_max}: it takes about "
                f"N x the median boot ({n} x 1.75 s) per repeat, and cannot be the lowest at large N")
    if side == "cluster_autoscaler" and not ca_started:
        return ca_error or "not started"
    if side in ("cluster_autoscaler_provreq", "ours_provisioning_request"):
        if n > PROFILE_MAX:
            return (f"the dev cluster's CA profile (the only CA serving ProvisioningRequests here) has node group "
                    f"{PROFILE_POOL} of max {PROFILE_MAX} nodes (kfp_gpu_rehearsal/devcluster/ca_profile.py NODE_GROUPS)")
        from kfp_gpu.cluster import provreq

        if provreq.autoscaler_node_groups(api) is None:
            return "the dev cluster's CA profile is not running (make cluster-up AUTOSCALER=cluster-autoscaler)"
        why = profile_boot_drawn(core, PROFILE_POOL)
        if why:
            return why
    if side in ("karpenter", "ours_karpenter"):
        from kfp_gpu_rehearsal.devcluster import karpenter_profile as kp

        try:  # the profile's own node class: make cluster-up AUTOSCALER=karpenter creates it
            client.CustomObjectsApi(api).get_cluster_custom_object(
                kp.NODECLASS_GROUP, kp.NODECLASS_VERSION, "kwoknodeclasses", kp.NODE_CLASS)
        except client.ApiException as exc:
            return (f"Karpenter's kwok provider is not installed (make cluster-up AUTOSCALER=karpenter): "
                    f"KWOKNodeClass {kp.NODE_CLASS}: {exc.status} {exc.reason}")
    return ""
