"""Example: the same fine-tune on flex-start capacity from GKE's Dynamic Workload Scheduler.

capacity="flex-start" with node pools that have queued provisioning: kfp-gpu asks for the whole gang with one
ProvisioningRequest of class queued-provisioning.gke.io (maxRunDurationSeconds from max_run_duration_s); GKE queues
it, then creates every node at once. Locally the GKE stand-in serves the class (docs/sim.md, section 12):

    kfp-gpu run pipelines/llm_finetune_flex.py --scenario kfp_gpu_rehearsal/sim/scenarios/flex-start.yaml
"""

from kfp import dsl

import kfp_gpu
from kfp_gpu.spec import CapacityType, CostInputs, ProvisioningSpec, Recovery, Target
from pipelines.llm_finetune import finetune_dag

SPEC = ProvisioningSpec(
    accelerator="a100-80gb",
    nodes=2,
    gpus_per_node=8,
    capacity=CapacityType.FLEX_START,
    max_run_duration_s=4 * 3600,  # DWS returns the nodes after this (at most 7 days)
    target=Target(kind="local", cluster="kfp-gpu-local", region="us-central1"),  # type: ignore[arg-type]
    zones=("us-central1-a", "us-central1-b"),
    scale_up_deadline_s=300,
    recovery=Recovery(max_preemptions=2),
    checkpoint_uri="/tmp/kfp-gpu/checkpoints/llm-finetune-flex",
    cost=CostInputs(expected_hours=2.0),
)


@kfp_gpu.provisioned(SPEC, runtime=("nodes", "scale_up_deadline_s"))
@dsl.pipeline(name="llm-finetune-flex", description="Data prep -> 2x8 GPU PyTorchJob on DWS flex-start -> eval")
def llm_finetune_flex(num_docs: int = 256, train_steps: int = 30) -> None:
    finetune_dag(num_docs, train_steps)
