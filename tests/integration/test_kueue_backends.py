"""Kueue with the provisioner contract, on the real Kueue and the real cluster-autoscaler (issue 14):

* a ClusterQueue with a ProvisioningRequest AdmissionCheck: `auto` picks the kueue-admission backend, kfp-gpu's
  steps create no ProvisioningRequest of their own, Kueue's request is served by the cluster-autoscaler, and the
  job runs on the nodes it provisioned;
* the example pipeline (its DAG, pipelines/llm_finetune.finetune_dag) admitted through a LocalQueue and finishing,
  run with `kfp-gpu run` as a person runs it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kfp_gpu.plan import provreq as plan
from kfp_gpu.provisioners import detect
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target
from kfp_gpu.steps import scale_up, teardown
from kfp_gpu.steps.capacity import Capacity
from kfp_gpu_rehearsal.devcluster import ca_profile
from tests.integration.test_kueue_profile import Queues
from tests.integration.test_train_support import StepThread, job_json, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _requests(api: client.ApiClient, ns: str) -> list[dict[str, Any]]:
    return client.CustomObjectsApi(api).list_namespaced_custom_object(plan.GROUP, plan.VERSION, ns, plan.PLURAL)["items"]


def test_admission_check_provisions_through_kueue_and_the_autoscaler(kube, kueue, autoscaler, namespace, step_api):
    q = Queues(kube, namespace)
    try:
        lq = q.queue(gpus=16, check=q.provisioning_check())
        spec = ProvisioningSpec(
            "a100-80gb", 2, capacity=CapacityType.ON_DEMAND, zones=("us-central1-a",), scale_up_deadline_s=60,
            target=Target(kind="local", cluster=ca_profile.CLUSTER, region="us-central1", namespace=namespace,
                          pools=("ca-a100-a",), tolerations=(ca_profile.TAINT,)))
        choice = detect(spec, step_api, None)
        assert choice.name == "kueue-admission" and lq in choice.reason, choice
        run = f"run-{uuid.uuid4().hex[:6]}"
        cap_json = scale_up.run(spec, run, "", api=step_api).output_json
        cap = Capacity.from_json(cap_json)
        assert cap.extra["provisioner"] == "kueue-admission" and cap.nodes == (), cap
        assert _requests(kube.api, namespace) == []  # kfp-gpu asked for nothing: Kueue will
        th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(3.0), api=step_api)
        th.start()
        try:
            # Kueue's own request (owned by the Workload), served by the cluster-autoscaler
            reqs = wait_until("Kueue's ProvisioningRequest", lambda: _requests(kube.api, namespace), timeout=60)
            owners = {o["kind"] for r in reqs for o in r["metadata"].get("ownerReferences") or []}
            assert owners == {"Workload"}, reqs
            out = json.loads(th.outcome(180).output_json)
        finally:
            teardown.run(spec, run, "", api=step_api)
        assert out["status"] == "Succeeded", out
        (adopted,) = out["ledger"].get("adopted_nodes") or [[]]  # one attempt: the nodes its pods bound to
        assert len(adopted) == 2 and all(n.startswith("ca-a100-a-") for n in adopted), out["ledger"]
    finally:
        q.cleanup()


def test_example_pipeline_is_admitted_through_a_local_queue(kube, kueue, namespace, tmp_path):
    q = Queues(kube, namespace)
    try:
        lq = q.queue(gpus=32)
        cluster = f"kq{uuid.uuid4().hex[:6]}"
        scenario = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
        scenario["cluster"] = cluster
        (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(scenario))
        pipeline = tmp_path / "queued_finetune.py"
        pipeline.write_text(textwrap.dedent(f'''
            from kfp import dsl

            import kfp_gpu
            from kfp_gpu.spec import ProvisioningSpec, Target
            from pipelines.llm_finetune import finetune_dag

            SPEC = ProvisioningSpec("a100-80gb", 2, zones=("us-central1-a",), scale_up_deadline_s=120,
                                    target=Target(kind="local", cluster="{cluster}", namespace="{namespace}",
                                                  queue="{lq}"))


            @kfp_gpu.provisioned(SPEC)
            @dsl.pipeline(name="queued-finetune")
            def queued_finetune(num_docs: int = 64, train_steps: int = 20) -> None:
                finetune_dag(num_docs, train_steps)
        '''))
        env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
        env.pop("KFP_GPU_SIM_ENDPOINT", None)
        res = subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "run", str(pipeline), "--scenario",
                              str(tmp_path / "scenario.yaml")], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=400)
        term = res.stdout + res.stderr
        assert res.returncode == 0 and "SUCCEEDED" in res.stdout and "nothing left" in res.stdout, term[-4000:]
        (log,) = set(re.findall(r"^executor logs: (\S+)$", res.stdout, re.M))
        text = Path(log).read_text()
        assert '\\"queue\\": \\"' + lq in text or f'"queue": "{lq}"' in text, "the train output names no queue"
        assert "job-admitted" in text, "no admission on the timeline"
    finally:
        q.cleanup()
