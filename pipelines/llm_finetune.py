"""Example: fine-tune a causal LM on 4 nodes x 8 A100-80GB with latency-aware provisioning.

    kfp-gpu compile pipelines/llm_finetune.py -o llm_finetune.yaml            # Kubeflow UI
    kfp-gpu compile pipelines/llm_finetune.py -o vertex.yaml --target vertex  # Vertex AI Pipelines
    make demo                                                                  # rehearse locally

Launching it, the run form offers num_docs, train_steps and the size fields of SPEC (nodes, accelerator,
gpus_per_node, capacity, zones, scale_up_deadline_s), each defaulting to the value below.

Data preparation runs in parallel with quota preflight, warm pool and scale-up; only the
PyTorchJob waits for the GPUs. Evaluation runs after training.
"""


from kfp import dsl
from kfp.dsl import Dataset, Metrics, Output

import kfp_gpu
from kfp_gpu.spec import CapacityType, CostInputs, ProvisioningSpec, Recovery, Target, WarmPool

IMAGE = "python:3.11-slim"

SPEC = ProvisioningSpec(
    accelerator="a100-80gb",
    nodes=4,
    gpus_per_node=8,
    capacity=CapacityType.SPOT,
    target=Target(
        kind="local",  # type: ignore[arg-type]
        cluster="kfp-gpu-local",
        project="local-project",
        region="us-central1",
        pools=("a100-80gb-spot-a", "a100-80gb-spot-b"),
    ),
    zones=("us-central1-a", "us-central1-b"),
    scale_up_deadline_s=120,
    warm_pool=WarmPool(nodes=1, ttl_s=900),
    recovery=Recovery(max_preemptions=3, on_demand_after=2),
    checkpoint_uri="/tmp/kfp-gpu/checkpoints/llm-finetune",
    cost=CostInputs(expected_hours=2.0, sla_penalty_per_hour=500.0),
)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def prepare_data(num_docs: int, dataset: Output[Dataset]) -> None:
    """Tokenise a tiny corpus (stands in for the real data preparation step)."""
    import json
    import os
    import time

    time.sleep(float(os.environ.get("KFP_GPU_DEMO_DATA_SECONDS", "0")))
    words = "the quick brown fox jumps over the lazy dog while gpus wait for nobody".split()
    docs = [" ".join(words[(i + j) % len(words)] for j in range(12)) for i in range(num_docs)]
    with open(dataset.path, "w") as f:
        json.dump({"docs": docs}, f)
    dataset.metadata["docs"] = num_docs


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate(train_result: str, metrics: Output[Metrics]) -> None:
    """Read the training result and publish evaluation metrics."""
    import json

    result = json.loads(train_result)
    metrics.log_metric("final_loss", float(result.get("final_loss") or 0.0))
    metrics.log_metric("gpu_hours_used", float(result.get("gpu_hours_used") or 0.0))
    metrics.log_metric("preemptions", float(result.get("preemptions") or 0))


def finetune_dag(num_docs: int, train_steps: int) -> None:
    """The user's steps: data prep -> training job on the provisioned gang -> evaluation (shared by the examples
    that get their capacity elsewhere: llm_finetune_ca.py, llm_finetune_flex.py)."""
    data = prepare_data(num_docs=num_docs)
    data.set_display_name("prepare data")
    job = kfp_gpu.train(
        name="finetune",
        command=["python", "-m", "pipelines.trainer.train_lm"],
        args=["--steps", train_steps, "--checkpoint-every", "10"],  # train_steps is resolved at run time
        dataset=data.outputs["dataset"],
        checkpoint_every=10,
    )
    ev = evaluate(train_result=job.outputs["Output"])
    ev.set_display_name("evaluate")


# The size fields are pipeline parameters (defaults from SPEC): choose them in the Kubeflow UI run form or
# Vertex parameter_values; every kfp-gpu step runs with the values chosen, and preflight validates them.
RUNTIME = ("nodes", "accelerator", "gpus_per_node", "capacity", "zones", "scale_up_deadline_s")


@kfp_gpu.provisioned(SPEC, runtime=RUNTIME)
@dsl.pipeline(name="llm-finetune", description="Data prep -> 4x8 GPU PyTorchJob fine-tune -> evaluation")
def llm_finetune(num_docs: int = 256, train_steps: int = 60) -> None:
    finetune_dag(num_docs, train_steps)
