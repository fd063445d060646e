"""Example: the same fine-tune on Amazon EKS managed node groups (the node-pool backend, boto3).

Two p4d.24xlarge instances (8x A100 40GB each) from Spot managed node groups in two Availability Zones of
us-east-1; a Spot interruption (two minutes' notice) is recovered from the newest checkpoint, and after two of
them the run falls back to the On-Demand node groups. Teardown terminates the run's own instances
(Auto Scaling TerminateInstanceInAutoScalingGroup with decrement), never ones AWS picks.

On a real cluster, drop ``endpoint`` and give the step ServiceAccount an IAM role (docs/user-guide.md, "EKS").
Locally the endpoint is the AWS stand-in (kfp_gpu_rehearsal.sim.aws), whose node groups become KWOK nodes:

    make cluster-up                                   # starts the GKE stand-in and the AWS one (port 8788)
    kfp-gpu compile pipelines/llm_finetune_eks.py -o llm_finetune_eks.yaml
    kfp-gpu run pipelines/llm_finetune_eks.py
"""

from kfp import dsl

import kfp_gpu
from kfp_gpu.spec import CapacityType, CostInputs, ProvisioningSpec, Recovery, Target
from pipelines.llm_finetune import finetune_dag

AWS_STANDIN = "http://127.0.0.1:8788"  # kfp_gpu_rehearsal.sim.daemon's AWS stand-in; "" = real AWS

SPEC = ProvisioningSpec(
    accelerator="a100-40gb",  # p4d.24xlarge (kfp_gpu.accelerators: aws_instances)
    nodes=2,
    gpus_per_node=8,
    capacity=CapacityType.SPOT,
    target=Target(
        kind="eks",  # type: ignore[arg-type]
        cluster="kfp-gpu-eks",
        region="us-east-1",
        pools=("p4d-spot-a", "p4d-spot-b"),  # managed node groups, in priority order
        endpoint=AWS_STANDIN,
        provisioner="node-pool",
    ),
    zones=("us-east-1a", "us-east-1b"),
    scale_up_deadline_s=180,
    recovery=Recovery(max_preemptions=3, on_demand_after=2),
    checkpoint_uri="/tmp/kfp-gpu/checkpoints/llm-finetune-eks",
    cost=CostInputs(expected_hours=2.0),
)


@kfp_gpu.provisioned(SPEC, runtime=("nodes", "scale_up_deadline_s"))
@dsl.pipeline(name="llm-finetune-eks", description="Data prep -> 2x8 A100 PyTorchJob on EKS managed node groups -> eval")
def llm_finetune_eks(num_docs: int = 256, train_steps: int = 30) -> None:
    finetune_dag(num_docs, train_steps)
