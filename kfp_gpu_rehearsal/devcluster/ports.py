"""Every port of the dev cluster in one table: name -> (environment variable that overrides it, default). All
listen on 127.0.0.1 (docs/local-cluster.md). cluster-autoscaler (``KFP_GPU_CA_PORT``, 18086) and fake-gcs-server
(``KFP_GPU_GCS_PORT``, else a free port it records) are chosen by their profiles."""

from __future__ import annotations

Table = dict[str, tuple[str, int]]

KUEUE: Table = {
    "kueue-webhook": ("KFP_GPU_KUEUE_WEBHOOK_PORT", 19445),
    "kueue-metrics": ("KFP_GPU_KUEUE_METRICS_PORT", 18444),
    "kueue-health": ("KFP_GPU_KUEUE_HEALTH_PORT", 18082),
}
TRAINER: Table = {
    "jobset-webhook": ("KFP_GPU_JOBSET_WEBHOOK_PORT", 19451),
    "jobset-health": ("KFP_GPU_JOBSET_HEALTH_PORT", 18091),
    "trainer-webhook": ("KFP_GPU_TRAINER_WEBHOOK_PORT", 19452),
    "trainer-health": ("KFP_GPU_TRAINER_HEALTH_PORT", 18092),
}
KARPENTER: Table = {
    "karpenter-metrics": ("KFP_GPU_KARPENTER_METRICS_PORT", 18095),
    "karpenter-health": ("KFP_GPU_KARPENTER_HEALTH_PORT", 18096),
}
CONTROLLER: Table = {
    "controller-metrics": ("KFP_GPU_CONTROLLER_METRICS_PORT", 18097),  # the kfp-gpu controller row (its /metrics)
}
