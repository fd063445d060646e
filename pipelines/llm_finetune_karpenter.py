"""Example: the EKS fine-tune (pipelines/llm_finetune_eks.py) with its capacity from Karpenter instead of managed
node groups (the ``karpenter`` backend).

The run creates a Karpenter NodePool scoped to itself (p4d.24xlarge, ``karpenter.sh/capacity-type`` spot, one
zone at a time; ``limits`` = the gang's GPUs; a disruption budget of zero; a taint only the run's pods tolerate)
and placeholder pods that make Karpenter launch the nodes; an insufficient-capacity launch (ICE) moves the
NodePool to the next zone, then to on-demand. The warm pool is one of those placeholders, launched early.
A Spot interruption is what Karpenter makes of one: the NodeClaim is deleted and its node drained; the train step
resumes from the newest checkpoint on a replacement from the same NodePool. Teardown deletes the NodePool, and
Karpenter terminates its NodeClaims and nodes.

On a real cluster, drop ``endpoint`` and give the step ServiceAccount the Karpenter RBAC of docs/user-guide.md
("EKS"). Locally, Karpenter's kwok provider launches KWOK nodes with AWS instance types and per-zone offerings
(kfp_gpu_rehearsal.devcluster.karpenter_types); the endpoint is the AWS stand-in, which teardown asks about node groups
and reservations:

    make cluster-up AUTOSCALER=karpenter
    kfp-gpu compile pipelines/llm_finetune_karpenter.py -o llm_finetune_karpenter.yaml
    kfp-gpu run pipelines/llm_finetune_karpenter.py
"""

from kfp import dsl

import kfp_gpu
from kfp_gpu.spec import CapacityType, CostInputs, ProvisioningSpec, Recovery, Target, WarmPool
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
        endpoint=AWS_STANDIN,
        provisioner="karpenter",  # no pools: Karpenter launches for a NodePool the run creates
    ),
    zones=("us-east-1a", "us-east-1b"),
    scale_up_deadline_s=120,
    warm_pool=WarmPool(nodes=1, ttl_s=900),
    recovery=Recovery(max_preemptions=3, on_demand_after=2),
    checkpoint_uri="/tmp/kfp-gpu/checkpoints/llm-finetune-karpenter",
    cost=CostInputs(expected_hours=2.0),
)


@kfp_gpu.provisioned(SPEC, runtime=("nodes", "scale_up_deadline_s"))
@dsl.pipeline(name="llm-finetune-karpenter",
              description="Data prep -> 2x8 A100 PyTorchJob on EKS nodes Karpenter launches -> eval")
def llm_finetune_karpenter(num_docs: int = 256, train_steps: int = 30) -> None:
    finetune_dag(num_docs, train_steps)
