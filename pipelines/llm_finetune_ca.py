"""Example: the same fine-tune, with capacity from the cluster's own autoscaler (provisioning-request backend).

The platform team runs cluster-autoscaler with ProvisioningRequests enabled and dedicated, tainted, autoscaled GPU
node groups; the pipeline never resizes a pool. kfp-gpu detects the autoscaler at preflight (target.provisioner
"auto"), asks it for the whole gang with one ProvisioningRequest (best-effort-atomic-scale-up), and the job's pods
consume it. Locally:

    make cluster-up AUTOSCALER=cluster-autoscaler      # the real cluster-autoscaler, kwok provider
    kfp-gpu run pipelines/llm_finetune_ca.py
"""

from kfp import dsl

import kfp_gpu
from kfp_gpu.spec import CapacityType, CostInputs, ProvisioningSpec, Recovery, Target
from pipelines.llm_finetune import finetune_dag

SPEC = ProvisioningSpec(
    accelerator="a100-80gb",
    nodes=2,
    gpus_per_node=8,
    capacity=CapacityType.ON_DEMAND,
    target=Target(
        kind="local",  # type: ignore[arg-type]
        cluster="ca",  # the dev cluster's cluster-autoscaler profile (kfp_gpu_rehearsal.devcluster.ca_profile)
        region="us-central1",
        pools=("ca-a100-a", "ca-a100-b"),  # the autoscaler's node groups this team may use
        tolerations=("kfp-gpu.io/dedicated=training:NoSchedule",),  # the groups' dedicated-pool taint
    ),
    zones=("us-central1-a", "us-central1-b"),
    scale_up_deadline_s=120,
    recovery=Recovery(max_preemptions=2),
    checkpoint_uri="/tmp/kfp-gpu/checkpoints/llm-finetune-ca",
    cost=CostInputs(expected_hours=2.0),
)


@kfp_gpu.provisioned(SPEC, runtime=("nodes", "scale_up_deadline_s"))
@dsl.pipeline(name="llm-finetune-ca", description="Data prep -> 2x8 GPU PyTorchJob on autoscaler capacity -> eval")
def llm_finetune_ca(num_docs: int = 256, train_steps: int = 30) -> None:
    finetune_dag(num_docs, train_steps)
