"""The GPU health probe pod body (kfp_gpu/cluster/probe.py): pinned, tolerated, all the node's GPUs, least privilege."""

from __future__ import annotations

from kfp_gpu.cluster.probe import PROBE_LABEL, ROUND_LABEL, pod_name, probe_image, probe_pod
from kfp_gpu.spec import Health
from kfp_gpu.steps.capacity import Capacity, Placement


def _cap() -> Capacity:
    return Capacity("run-1", (Placement("pool-a", "us-central1-a", ("n0", "n1")),), 8, "nvidia-h100-80gb", spot=True,
                    namespace="team-a")


def test_probe_pod_is_pinned_tolerated_and_holds_every_gpu() -> None:
    body = probe_pod(Health(probe=True, dcgm_level=2, nccl=True, probe_timeout_s=90), _cap(), "run-1", "n1", 2,
                     {"kfp-gpu.io/run-id": "run-1"})
    meta, spec = body["metadata"], body["spec"]
    assert meta["namespace"] == "team-a" and meta["labels"][PROBE_LABEL] == "run-1"
    assert meta["labels"][ROUND_LABEL] == "2" and meta["labels"]["kfp-gpu.io/run-id"] == "run-1"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    keys = {t["key"] for t in spec["tolerations"]}
    assert "nvidia.com/gpu" in keys and "team-a.claims.kfp-gpu.io/run" in keys  # the run's own claim taint
    (c,) = spec["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert {e["name"]: e["value"] for e in c["env"]} == {"KFP_GPU_EXPECTED_GPUS": "8", "KFP_GPU_DCGM_LEVEL": "2",
                                                         "KFP_GPU_NCCL": "1"}
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    assert spec["activeDeadlineSeconds"] == 90 and spec["restartPolicy"] == "Never"


def test_probe_names_are_per_node_and_round_and_valid() -> None:
    names = {pod_name("Run_With.Odd-ID" * 5, n, r) for n in ("n0", "n1") for r in (1, 2)}
    assert len(names) == 4
    assert all(len(n) <= 63 and n == n.lower() and n[0].isalpha() for n in names)


def test_probe_image_default_and_override() -> None:
    assert probe_image(Health()).startswith("ghcr.io/kfp-gpu/gpu-probe:")
    assert probe_image(Health(image="registry.example/gpu-probe:1")) == "registry.example/gpu-probe:1"
