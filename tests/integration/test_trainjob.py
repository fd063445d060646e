"""The example pipeline's DAG with ``kind="trainjob"``, end to end on the real Trainer v2 and JobSet controllers.

``kfp-gpu run`` (a subprocess from the repo root, as a person runs it) rehearses
tests/integration/pipelines/trainjob_pipeline.py: prepare data -> quota preflight -> warm pool -> scale-up ->
a TrainJob on the torch-distributed ClusterTrainingRuntime -> evaluate, teardown. The Trainer's own webhook admits
the TrainJob (nothing mocked); the JobSet controller makes the Jobs and pods. While the first attempt runs, the test
writes a checkpoint (step 15) and has the GKE stand-in preempt one gang node; the train step deletes the TrainJob,
replaces the node and creates the next attempt from that checkpoint. Afterwards nothing of the run is left: no
TrainJob, JobSet, Job or pod, and none of kfp-gpu's labelled objects.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kfp_gpu import ownership
from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu.cluster import owned, trainjob
from kfp_gpu.cluster.nodes import claim_taint_key
from kfp_gpu.cluster.podtemplate import ENV_RESUME_PATH, ENV_RESUME_STEP
from kfp_gpu.ownership import JOB_LABEL, LABEL_RUN_ID
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "tests/integration/pipelines/trainjob_pipeline.py"
TJ = trainjob.RESOURCE
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")


class Run:
    """``kfp-gpu run`` in the background; its output lines as they come."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "kfp_gpu.cli", "run", *args], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def sim_url(self) -> str:
        m = re.search(r"stand-in on (http://[^;\s]+)", self.out)
        return m.group(1) if m else ""


def _trainjobs(custom: client.CustomObjectsApi, ns: str) -> list[dict[str, Any]]:
    return list(custom.list_namespaced_custom_object(TJ.group, TJ.version, ns, TJ.plural)["items"])


def _running(core: client.CoreV1Api, ns: str, job: dict[str, Any]) -> list[client.V1Pod]:
    attempt = job["metadata"]["annotations"][ownership.ATTEMPT]
    pods = core.list_namespaced_pod(ns, label_selector=f"{ownership.ATTEMPT}={attempt}").items
    return [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def test_example_dag_as_a_trainjob_survives_a_preemption_and_leaves_nothing(kube, trainer, namespace, tmp_path):
    cluster = f"tj{uuid.uuid4().hex[:6]}"
    scenario = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
    scenario["cluster"] = cluster
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "TRAINJOB_CLUSTER": cluster,
           "TRAINJOB_NAMESPACE": namespace, "TRAINJOB_CKPT": str(ckpt), "TRAINJOB_SECONDS": "15"}
    env.pop("KFP_GPU_SIM_ENDPOINT", None)
    custom, core = client.CustomObjectsApi(kube.api), client.CoreV1Api(kube.api)

    run = Run([PIPELINE, "--scenario", str(tmp_path / "scenario.yaml")], env)
    try:
        # attempt 1: the Trainer admitted our TrainJob and the JobSet's pods run on the gang
        wait_until("the TrainJob's 2 pods running", lambda: (
            run.proc.poll() is None or pytest.fail(run.out[-4000:])) and len(_trainjobs(custom, namespace)) == 1
            and len(_running(core, namespace, _trainjobs(custom, namespace)[0])) == 2, timeout=240)
        (first,) = _trainjobs(custom, namespace)
        name = first["metadata"]["name"]
        js = custom.get_namespaced_custom_object(*JOBSET[:2], namespace, JOBSET[2], name)
        assert js["metadata"]["ownerReferences"][0]["uid"] == first["metadata"]["uid"]  # the Trainer made it
        pods = _running(core, namespace, first)
        run_label = first["metadata"]["labels"][LABEL_RUN_ID]
        for pod in pods:  # run-id labelled, pinned to the run's claimed nodes, tolerating the run's claim taint
            assert pod.metadata.labels[LABEL_RUN_ID] == run_label and pod.metadata.labels[JOB_LABEL] == name
            node = core.read_node(pod.spec.node_name)
            assert node.metadata.labels[LABEL_RUN_ID] == run_label
            assert any(t.key == claim_taint_key(namespace) and t.value == run_label for t in pod.spec.tolerations or [])
            assert pod.spec.node_selector[LABEL_RUN_ID] == run_label
        env1 = {e["name"]: e.get("value") for e in first["spec"]["trainer"]["env"]}
        assert env1[ENV_RESUME_STEP] == "0"

        # preempt one gang node after a checkpoint at step 15
        CheckpointStore(str(ckpt)).save(15, {"w": b"15"}, meta={"loss": 2.5})
        victim = pods[0].spec.node_name
        req = urllib.request.Request(f"{run.sim_url()}/sim/v1/preempt", data=json.dumps({"node": victim}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        assert urllib.request.urlopen(req, timeout=10).status == 200

        # attempt 2: a new TrainJob (new attempt) resuming from step 15
        def resumed() -> dict[str, Any] | None:
            jobs = [j for j in _trainjobs(custom, namespace)
                    if j["metadata"]["annotations"][ownership.ATTEMPT] != first["metadata"]["annotations"][
                        ownership.ATTEMPT]]
            return jobs[0] if jobs else None

        wait_until("the resumed TrainJob", lambda: resumed() is not None, timeout=180)
        second = resumed()
        assert second is not None and second["metadata"]["annotations"]["kfp-gpu.io/resume-step"] == "15"
        env2 = {e["name"]: e.get("value") for e in second["spec"]["trainer"]["env"]}
        assert env2[ENV_RESUME_STEP] == "15" and env2[ENV_RESUME_PATH].endswith("15"), env2
        assert run.proc.wait(timeout=300) == 0, run.out[-4000:]
    finally:
        if run.proc.poll() is None:  # a failed assertion: stop the run and drop the stand-in's nodes
            run.proc.terminate()
            try:
                run.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                run.proc.kill()
            for n in core.list_node(label_selector=f"kfp-gpu.io/sim-cluster={cluster}").items:
                core.delete_node(n.metadata.name)
        run.reader.join(timeout=10)
    out = run.out
    assert "=== pipeline llm-finetune-trainjob SUCCEEDED" in out and "nothing left" in out, out[-3000:]
    assert re.search(rf"deleted jobs \[.*'{name}'.*\]", out), out[-2000:]
    log = Path(re.findall(r"^executor logs: (\S+)$", out, re.M)[0]).read_text()
    assert re.search(r'\\?"job_kind\\?": \\?"trainjob', log), "the train result does not name the job kind"
    assert re.search(r'\\?"preemptions\\?": 1\b', log), "the train result does not count the preemption"

    # nothing of the run left: TrainJobs, JobSets, Jobs, pods, kfp-gpu's labelled objects, the stand-in's nodes
    wait_until("the run's nodes gone", lambda: not core.list_node(
        label_selector=f"kfp-gpu.io/sim-cluster={cluster}").items, timeout=60)
    wait_until("no pods", lambda: not core.list_namespaced_pod(namespace).items, timeout=60)
    assert _trainjobs(custom, namespace) == []
    assert custom.list_namespaced_custom_object(*JOBSET[:2], namespace, JOBSET[2])["items"] == []
    assert client.BatchV1Api(kube.api).list_namespaced_job(namespace).items == []
    for kind in (owned.LEDGER, owned.BALLOON, owned.NODE, *owned.JOBS, owned.LEASE, owned.PROVREQ):
        ns = namespace if kind.namespaced else None
        assert owned.list_objects(kube.api, kind, ns, f"{LABEL_RUN_ID}={run_label}") == [], kind.name


def test_the_runtime_is_read_first_and_a_missing_one_or_its_gang_scheduler_is_named(kube, trainer, namespace, step_api):
    """The train step reads the TrainJob's runtime (as the controller's identity) before it creates anything: a missing
    runtime is named with how to list them; a runtime's podGroupPolicy whose PodGroup API is missing is named too."""
    from kfp_gpu.errors import CrdMissing, InvalidSpec
    from kfp_gpu.jobkinds import TrainJobKind

    with pytest.raises(InvalidSpec) as err:
        TrainJobKind("no-such-runtime").prepare(step_api, namespace)
    assert "no-such-runtime" in str(err.value) and "ClusterTrainingRuntime" in str(err.value)
    rt = TrainJobKind().prepare(step_api, namespace)
    assert rt["replicated_job"] == "node" and rt["runtime"] == "torch-distributed"
    assert rt["gang_scheduler"].startswith("none")

    # a namespaced runtime that gang-schedules with coscheduling (admitted by the Trainer's runtime webhook):
    # the PodGroup API it needs is not served here, which the step says before creating anything
    custom = client.CustomObjectsApi(kube.api)
    base = custom.get_cluster_custom_object(TJ.group, TJ.version, "clustertrainingruntimes", "torch-distributed")
    custom.create_namespaced_custom_object(TJ.group, TJ.version, namespace, "trainingruntimes", {
        "apiVersion": TJ.api_version, "kind": "TrainingRuntime", "metadata": {"name": "gang-torch"},
        "spec": {**base["spec"], "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 60}}}})
    with pytest.raises(CrdMissing) as missing:
        TrainJobKind("gang-torch", "TrainingRuntime").prepare(step_api, namespace)
    assert "podGroupPolicy coscheduling" in str(missing.value) and missing.value.fields["crd"] == (
        "podgroups.scheduling.x-k8s.io")
    assert _trainjobs(custom, namespace) == []
