"""A user pipeline whose job takes run-time values: a pipeline parameter and an upstream task output in
``train()`` args and env, and the size fields of the spec chosen at run time.

tests/integration/test_runtime_params.py rehearses it with ``kfp-gpu run ... --arg train_steps=7 --arg nodes=3``.
The cluster and namespace come from the environment (``RT_CLUSTER``, ``RT_NAMESPACE``) so concurrent runs on
the shared local cluster never meet; ``record_job`` writes the PyTorchJob it finds (before teardown deletes it)
to the file named by ``RT_RECORD``.
"""

import os

from kfp import dsl

import kfp_gpu
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target

NAMESPACE = os.environ.get("RT_NAMESPACE", "default")

SPEC = ProvisioningSpec(
    accelerator="l4",
    nodes=2,
    gpus_per_node=1,
    capacity=CapacityType.ON_DEMAND,
    target=Target(
        kind="local",  # type: ignore[arg-type]
        cluster=os.environ.get("RT_CLUSTER", "kfp-gpu-local"),
        region="us-central1",
        pools=("l4-a", "l4-b"),
        namespace=NAMESPACE,
    ),
    zones=("us-central1-a", "us-central1-b"),
    scale_up_deadline_s=120,
)
RUNTIME = ("nodes", "accelerator", "gpus_per_node", "capacity", "zones", "scale_up_deadline_s")


@dsl.component(base_image="python:3.11-slim", install_kfp_package=False)
def tag_of(run_tag: str) -> str:
    """An upstream task whose output the job takes."""
    return f"{run_tag}-upstream"


@dsl.component(base_image="python:3.11-slim", install_kfp_package=False)
def record_job(namespace: str, train_result: str) -> str:
    """Write the PyTorchJob(s) of this namespace as the Training Operator got them (runs before teardown)."""
    import json
    import os

    from kubernetes import client, config

    config.load_kube_config()
    jobs = client.CustomObjectsApi().list_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs")
    out = []
    for job in jobs["items"]:
        for rtype, rs in job["spec"]["pytorchReplicaSpecs"].items():
            c = rs["template"]["spec"]["containers"][0]
            out.append({"job": job["metadata"]["name"], "replica": rtype, "replicas": rs.get("replicas", 1),
                        "args": c.get("args"), "env": {e["name"]: e.get("value") for e in c.get("env") or []}})
    with open(os.environ["RT_RECORD"], "w", encoding="utf-8") as f:
        json.dump(out, f)
    return json.dumps(out)


@kfp_gpu.provisioned(SPEC, runtime=RUNTIME)
@dsl.pipeline(name="runtime-params", description="upstream tag -> L4 PyTorchJob with run-time args -> record")
def runtime_params(train_steps: int = 60, run_tag: str = "default") -> None:
    tag = tag_of(run_tag=run_tag)
    job = kfp_gpu.train(
        name="rt-train",
        command=["python", "-c", "print('training')"],
        args=["--steps", train_steps, f"--tag={tag.output}"],
        env={"RUN_TAG": run_tag},
    )
    record_job(namespace=NAMESPACE, train_result=job.outputs["Output"])
