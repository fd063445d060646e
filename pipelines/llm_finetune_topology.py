"""Example: the fine-tune as a topology-required gang under Kueue: both nodes in one GKE block.

The platform team runs Kueue with Topology Aware Scheduling: a Kueue ``Topology`` over GKE's
``cloud.google.com/gce-topology-{block,subblock,host}`` node labels (then ``kubernetes.io/hostname``), a
ResourceFlavor naming it (``spec.topologyName``), a ClusterQueue and this team's LocalQueue ``topology`` in namespace
``team-topology``. The GPU pool has a compact placement policy, so its nodes land in one block. kfp-gpu resizes the
pool, claims two nodes of one block (topology="required"), and submits the PyTorchJob to the LocalQueue with
``kueue.x-k8s.io/podset-required-topology`` on both pod sets (and one ``podset-group-name``): Kueue admits the gang
into one block. Preflight refuses the run in one line when no block can hold the gang. Locally (after the admin
objects exist, see tests/integration/test_example_backends.py):

    kfp-gpu run pipelines/llm_finetune_topology.py --scenario topology
"""

from kfp import dsl

import kfp_gpu
from kfp_gpu.spec import CapacityType, CostInputs, ProvisioningSpec, Recovery, Target
from pipelines.llm_finetune import finetune_dag

SPEC = ProvisioningSpec(
    accelerator="h100-80gb",
    nodes=2,
    gpus_per_node=8,
    capacity=CapacityType.ON_DEMAND,
    topology="required",  # never across two blocks; "preferred" would span blocks rather than wait
    topology_level="block",
    target=Target(
        kind="local",  # type: ignore[arg-type]
        cluster="kfp-gpu-topology",  # the stand-in's bundled "topology" scenario
        region="us-central1",
        namespace="team-topology",
        pools=("h100-80gb-compact-a",),  # the compact placement pool
        queue="topology",  # the team's Kueue LocalQueue (TAS flavor behind it)
        provisioner="node-pool",
    ),
    zones=("us-central1-a",),
    scale_up_deadline_s=300,
    recovery=Recovery(max_preemptions=2),
    checkpoint_uri="/tmp/kfp-gpu/checkpoints/llm-finetune-topology",
    cost=CostInputs(expected_hours=2.0),
)


@kfp_gpu.provisioned(SPEC, runtime=("scale_up_deadline_s",))
@dsl.pipeline(name="llm-finetune-topology", description="Data prep -> 2x8 GPU PyTorchJob in one block (Kueue TAS) -> eval")
def llm_finetune_topology(num_docs: int = 256, train_steps: int = 30) -> None:
    finetune_dag(num_docs, train_steps)
