"""The one table of the dev cluster's components, in start order (stopped in reverse).

Each row is a :class:`kfp_gpu_rehearsal.devcluster.runner.Unit`, run by :mod:`kfp_gpu_rehearsal.devcluster.runner` (start, stop, status,
fingerprint); the modules named hold only what is particular to a row (argv, health probe, CRDs, webhooks):

======================  =====================================================  ====================================
unit                    processes                                              module
======================  =====================================================  ====================================
core                    etcd, kube-apiserver, kube-controller-manager,          :mod:`.boot`
                        kube-scheduler, kwok, training-operator
cluster-autoscaler      cluster-autoscaler (kwok provider)                     :mod:`.ca_profile`
trainer                 jobset, trainer (Kubeflow Trainer v2)                  :mod:`.trainer_profile`
kueue                   kueue                                                  :mod:`.kueue_profile`
gcs                     fake-gcs-server                                        :mod:`.gcs_profile`
karpenter               karpenter (kwok provider)                              :mod:`.karpenter_profile`
controller              kfp-gpu-controller (``kfp-gpu controller``, its        :mod:`.controller_profile`
                        ServiceAccount token, ``$KFP_GPU_CONTROLLER_NAMESPACES``)
======================  =====================================================  ====================================

Order: the trainer before Kueue (Kueue enables its TrainJob/JobSet integrations only when their CRDs exist at its
start; on the way down Kueue, whose webhooks then guard TrainJobs and JobSets, stops first); every optional unit
after the core, whose API server they need; the controller last (it stops first, before what its work uses).

The controller row is the controller ``kfp-gpu run`` and ``make demo`` use (each run adds its namespace:
:func:`kfp_gpu_rehearsal.devcluster.controller_profile.serve`). It serves the namespaces it is given, never all: the
integration tier starts controllers of its own (the same
:class:`kfp_gpu_rehearsal.devcluster.controller.LocalController` process) for its own namespaces.
"""

from __future__ import annotations

from . import (
    boot,
    ca_profile,
    controller_profile,
    gcs_profile,
    karpenter_profile,
    kueue_profile,
    trainer_profile,
)
from .runner import Unit

UNITS: tuple[Unit, ...] = (
    boot.CORE,
    ca_profile.UNIT,
    trainer_profile.UNIT,
    kueue_profile.UNIT,
    gcs_profile.UNIT,
    karpenter_profile.UNIT,
    controller_profile.UNIT,
)


def get(name: str) -> Unit:
    """Raises: KeyError naming the choices."""
    for u in UNITS:
        if u.name == name:
            return u
    raise KeyError(f"no dev-cluster unit {name!r}: choose from {', '.join(u.name for u in UNITS)}")
