"""What scale-up does with node pools the cluster autoscaler manages (``Target.autoscaled_pools``).

kfp-gpu never fights the autoscaler silently. A pool it resizes that the autoscaler also manages is either

* ``"protect"``: resized, and every node the run claims there is annotated
  ``cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"`` while the run holds it (the autoscaler does
  not remove such a node: https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/FAQ.md
  "How can I prevent Cluster Autoscaler from scaling down a particular node?"), removed at release; or
* ``"refuse"``: not touched: the run fails before any resize, naming the pool and the way out.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.providers.base import PoolRef, PoolState


def protected_pools(states: Iterable[PoolState], policy: str) -> frozenset[str]:
    """Names of the pools whose claimed nodes must carry the scale-down-disabled annotation: the autoscaled
    ones under ``"protect"``, none under ``"refuse"``."""
    if policy != "protect":
        return frozenset()
    return frozenset(s.ref.pool for s in states if s.autoscaling)


def refusal(states: Iterable[PoolState], resized: Iterable[PoolRef], policy: str) -> InvalidSpec | None:
    """The error to raise before any resize when ``policy`` is ``"refuse"`` and a pool in ``resized`` (the
    pools a plan would change) is autoscaled; None when the plan may go ahead."""
    if policy != "refuse":
        return None
    auto = {(s.ref.pool, s.ref.zone): s for s in states if s.autoscaling}
    for ref in resized:
        st = auto.get((ref.pool, ref.zone))
        if st is None:
            continue
        limits = f" ({st.autoscaling_min}..{st.autoscaling_max} nodes)" if st.autoscaling_max else ""
        return InvalidSpec(
            "target.autoscaled_pools", policy,
            f"node pool {ref.pool} ({ref.zone}) is autoscaled{limits}: the cluster autoscaler manages its size, "
            "so kfp-gpu refuses to resize it",
            remediation="use a ProvisioningRequest or a dedicated node pool without autoscaling (target.pools), "
            "or set target.autoscaled_pools='protect' to resize it and mark the run's nodes scale-down-disabled",
        )
    return None
