"""Capacity providers. ``for_target`` picks one; cloud SDKs load only inside the chosen package."""

from __future__ import annotations

import os

from kfp_gpu import rehearsal_seam
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.providers.base import CapacityProvider
from kfp_gpu.spec import Target, TargetKind


def for_target(target: Target) -> CapacityProvider:
    """The provider for ``target``. ``local`` is the GKE provider pointed at the kfp_gpu_rehearsal.sim stand-in.

    Raises:
        InvalidSpec: a local target with no stand-in endpoint.
        PermissionDenied: cloud credentials are missing.
    """
    if target.kind is TargetKind.EKS:
        from kfp_gpu.providers.eks import EksProvider

        eks: CapacityProvider = EksProvider.from_target(target)
        return eks
    from kfp_gpu.providers.gke import GkeProvider

    endpoint = target.endpoint
    if target.kind is TargetKind.LOCAL:
        endpoint = endpoint or local_endpoint(target.cluster)
        if not endpoint:
            raise InvalidSpec(
                "target.endpoint", endpoint, "a local target needs the kfp_gpu_rehearsal.sim stand-in URL",
                remediation=f"run `make cluster-up` (it starts the stand-in) or export {rehearsal_seam.SIM_ENDPOINT_ENV}",
            )
    gke: CapacityProvider = GkeProvider.from_target(target, endpoint=endpoint)
    return gke


def local_endpoint(cluster: str) -> str:
    """The GKE stand-in a ``local`` target without an ``endpoint`` talks to: this process's own
    (``$KFP_GPU_SIM_ENDPOINT``), else the one serving the world of ``cluster`` (a ``kfp-gpu run``'s, which the dev
    cluster's one controller serves beside other runs), else the daemon's; "" when none answers. Raises: nothing."""
    return (os.environ.get(rehearsal_seam.SIM_ENDPOINT_ENV, "")
            or (rehearsal_seam.running_sim_url(cluster) if cluster else "") or rehearsal_seam.running_sim_url())
