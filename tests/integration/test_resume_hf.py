"""Spot recovery resumes from a Hugging Face Trainer checkpoint: the recreated job gets its path and step (env) and
the user's ``resume_args`` (``--resume_from_checkpoint <path>``), against the real control plane."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu.checkpoint.backends import open_backend
from kfp_gpu.cluster import pytorchjob
from kfp_gpu.job import JobTemplate
from kfp_gpu_rehearsal.devcluster.client import Kube
from tests.checkpoint.test_formats import hf_checkpoint
from tests.integration.test_train_support import (
    Reprovisioner,
    StepThread,
    make_capacity,
    make_spec,
    preempt,
    running_pods,
    wait_until,
)

pytestmark = pytest.mark.integration
NodeFactory = Callable[..., tuple[str, list[str]]]
RESUME_ARGS = ("--resume_from_checkpoint", "{path}")


@pytest.fixture
def reprov(kube: Kube) -> Iterator[list[Reprovisioner]]:
    made: list[Reprovisioner] = []
    yield made
    for r in made:
        r.cleanup()


def _container(kube: Kube, namespace: str, job: str) -> dict[str, Any]:
    obj: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        pytorchjob.GROUP, pytorchjob.VERSION, namespace, pytorchjob.PLURAL, job)
    c: dict[str, Any] = obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    return c


def _env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


def test_spot_recovery_resumes_from_a_hugging_face_checkpoint(
    kube: Kube, namespace: str, step_api: client.ApiClient, kwok_nodes: NodeFactory, tmp_path: Path,
    reprov: list[Reprovisioner],
) -> None:
    pool, names = kwok_nodes(2, gpus=8, spot=True)
    run_id = f"run-hf-{namespace}"
    ckpt = tmp_path / "ckpt"
    spec = make_spec(namespace, ckpt, nodes=2, max_preemptions=2)
    rp = Reprovisioner(kube.core, pool)
    reprov.append(rp)
    template = JobTemplate(name="train", image="busybox", command=("python", "finetune.py"), args=("--epochs", "1"),
                           checkpoint_every=10, resume_args=RESUME_ARGS,
                           annotations={pytorchjob.SIM_DURATION_ANNOTATION: "8s"})
    th = StepThread(spec=spec, run_id=run_id, capacity_json=make_capacity(run_id, pool, names).to_json(),
                    job_json=template.to_json(), api=step_api, reprovision=rp)
    th.start()
    job = pytorchjob.job_name(run_id, "train")
    wait_until("2 pods running", lambda: running_pods(kube.core, namespace, job, 2), timeout=90)
    first = _container(kube, namespace, job)
    assert first["args"] == ["--epochs", "1"]  # a fresh start: no resume args
    assert _env(first)[pytorchjob.ENV_RESUME_STEP] == "0"

    # the user's Trainer writes checkpoint-20 and is preempted while writing checkpoint-30 (no trainer_state.json)
    be = open_backend(str(ckpt))
    hf_checkpoint(be, 20)
    hf_checkpoint(be, 30, state=b"")
    path = f"{ckpt}/out/checkpoint-20"
    preempt(kube.kubeconfig, kube.core, names[1])
    wait_until("replacement", lambda: rp.calls, timeout=60)
    wait_until("resumed gang running", lambda: [p for p in running_pods(kube.core, namespace, job, 2)
                                                if p.spec.node_name in rp.calls[0]["nodes"]], timeout=60)
    resumed = _container(kube, namespace, job)
    out = json.loads(th.outcome(180).output_json)

    assert out["status"] == "Succeeded" and out["preemptions"] == 1 and out["attempts"] == 2, out
    assert resumed["args"] == ["--epochs", "1", "--resume_from_checkpoint", path]
    env = _env(resumed)
    assert (env[pytorchjob.ENV_RESUME_STEP], env[pytorchjob.ENV_RESUME_PATH], env[pytorchjob.ENV_RESUME_FORMAT],
            env[pytorchjob.ENV_CHECKPOINT_URI]) == ("20", path, "hf-trainer", str(ckpt))
    p = out["ledger"]["preemptions"][0]
    assert p["checkpoint_step"] == 20 and p["checkpoint_uri"] == path, p
    assert out["final_step"] == 20
