"""The example pipeline's DAG (pipelines/llm_finetune.py: prepare data -> train -> evaluate) with the training
step as a Kubeflow Trainer v2 TrainJob on the torch-distributed ClusterTrainingRuntime.

tests/integration/test_trainjob.py rehearses it with ``kfp-gpu run`` and preempts a node of the gang while it
trains. The example's SPEC, made small and isolated from the environment: ``TRAINJOB_CLUSTER`` (the stand-in
scenario's cluster), ``TRAINJOB_NAMESPACE``, ``TRAINJOB_CKPT`` (the checkpoint store the test writes to) and
``TRAINJOB_SECONDS`` (how long each attempt's KWOK pods run).
"""

import dataclasses
import os

from kfp import dsl

import kfp_gpu
from kfp_gpu.cluster.podtemplate import SIM_DURATION_ANNOTATION
from pipelines.llm_finetune import SPEC as EXAMPLE
from pipelines.llm_finetune import evaluate, prepare_data

SPEC = dataclasses.replace(
    EXAMPLE, nodes=2,
    target=dataclasses.replace(EXAMPLE.target, cluster=os.environ.get("TRAINJOB_CLUSTER", "kfp-gpu-local"),
                               namespace=os.environ.get("TRAINJOB_NAMESPACE", "default")),
    checkpoint_uri=os.environ.get("TRAINJOB_CKPT", "/tmp/kfp-gpu/checkpoints/trainjob"),
)


@kfp_gpu.provisioned(SPEC)
@dsl.pipeline(name="llm-finetune-trainjob", description="Data prep -> 2x8 GPU TrainJob fine-tune -> evaluation")
def llm_finetune_trainjob(num_docs: int = 64, train_steps: int = 30) -> None:
    data = prepare_data(num_docs=num_docs)
    data.set_display_name("prepare data")
    job = kfp_gpu.train(
        name="finetune", kind="trainjob", runtime="torch-distributed",
        command=["python", "-m", "pipelines.trainer.train_lm"],
        args=["--steps", train_steps, "--checkpoint-every", "10"],
        dataset=data.outputs["dataset"], checkpoint_every=10,
        annotations={SIM_DURATION_ANNOTATION: f"{os.environ.get('TRAINJOB_SECONDS', '12')}s"},
    )
    ev = evaluate(train_result=job.outputs["Output"])
    ev.set_display_name("evaluate")
