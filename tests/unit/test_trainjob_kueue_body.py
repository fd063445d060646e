"""The TrainJob body survives Kueue's update: Kueue v0.17 decodes TrainJobs with the Trainer v2.2 Go types and
writes them back whole, and ``spec.trainer`` is immutable, so the body kfp-gpu sends must already be what the Go
types write (tests/integration/test_kueue_trainjob.py runs it on the real controllers)."""

from __future__ import annotations

import pytest

from kfp_gpu.cluster.capacity import Capacity, Placement
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.job import JobTemplate
from kfp_gpu.jobkinds import JobRequest, TrainJobKind
from kfp_gpu.jobkinds.trainjob import as_go_writes_it, canonical_quantity


@pytest.mark.parametrize(("given", "go"), [
    ("8", "8"), (8, "8"), ("1000m", "1"), ("0.5", "500m"), ("1.5", "1500m"), ("1500", "1500"), ("2000", "2k"),
    ("1024Mi", "1Gi"), ("1536Mi", "1536Mi"), ("1.5Gi", "1536Mi"), ("32Gi", "32Gi"), ("100Mi", "100Mi"),
    ("0", "0"), ("1e3", "1e3"),
])
def test_quantities_as_go_writes_them(given: object, go: str) -> None:
    assert canonical_quantity(given) == go


def _req(queue: str = "", **tpl: object) -> JobRequest:
    t = JobTemplate(name="train", image="busybox", command=("true",), kind="trainjob", **tpl)  # type: ignore[arg-type]
    cap = Capacity("r1", (Placement("pool", "us-central1-a", ("n1", "n2")),), 8, "nvidia-h100-80gb", spot=True)
    return JobRequest(name="x", template=t, capacity=cap, labels={"kfp-gpu.io/run-id": "r1"}, nodes=2,
                      run_id="r1", checkpoint_uri="/tmp/c", queue=queue)


def test_the_body_has_no_empty_env_value_and_canonical_quantities() -> None:
    body = TrainJobKind().build(_req("q", resources={"requests": {"cpu": "1000m", "memory": "0.5Gi"}},
                                     shm_size="1.5Gi"))
    tr = body["spec"]["trainer"]
    assert all(e.get("value", None) != "" for e in tr["env"])
    assert {"name": "KFP_GPU_DATASET_URI"} in tr["env"]  # no value: "" as far as Kubernetes is concerned
    assert tr["resourcesPerNode"] == {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"nvidia.com/gpu": "8"}}
    [patch] = body["spec"]["runtimePatches"]
    vols = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"]["volumes"]
    assert [v["emptyDir"]["sizeLimit"] for v in vols if "emptyDir" in v] == ["1536Mi"]
    assert body["spec"]["suspend"] is True
    assert as_go_writes_it(body) == body  # already canonical


def test_a_grace_period_is_refused_on_a_queued_trainjob_only() -> None:
    with pytest.raises(InvalidSpec) as err:
        TrainJobKind().build(_req("team", pod_extra={"terminationGracePeriodSeconds": 45}))
    msg = str(err.value)
    assert "terminationGracePeriodSeconds" in msg and "LocalQueue team" in msg and "\n" not in msg
    body = TrainJobKind().build(_req("", pod_extra={"terminationGracePeriodSeconds": 45}))
    pod = body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 45
