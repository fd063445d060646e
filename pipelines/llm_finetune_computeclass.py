"""Example: the same fine-tune on GKE's capacity chain, through a custom ComputeClass.

capacity="reservation" with fallback=("flex-start", "spot", "on-demand"): the controller creates a ComputeClass for
the run (cloud.google.com/v1, one priority rule per rung: the reservation, flex-start, Spot, on-demand, all on
A100 80GB x8 in the two zones) and GKE's node auto-provisioning walks it for the gang's pods. The gang has two nodes,
so the flex-start rung goes through queued provisioning (a ProvisioningRequest: all nodes or none) before the class
takes the other rungs; see docs/computeclass.md. Locally the GKE stand-in serves ComputeClasses (docs/sim.md,
section 14) once the dev cluster has the CRD:

    python -m kfp_gpu_rehearsal.devcluster.computeclass_crd   # once: GKE serves this CRD in every cluster
    kfp-gpu run pipelines/llm_finetune_computeclass.py --scenario kfp_gpu_rehearsal/sim/scenarios/flex-start.yaml
"""

from kfp import dsl

import kfp_gpu
from kfp_gpu.spec import CapacityType, CostInputs, ProvisioningSpec, Recovery, Target
from pipelines.llm_finetune import finetune_dag

SPEC = ProvisioningSpec(
    accelerator="a100-80gb",
    nodes=2,
    gpus_per_node=8,
    capacity=CapacityType.RESERVATION,
    reservation="a100-train-res",  # a SPECIFIC Compute Engine reservation of a2-ultragpu-8g VMs
    fallback=("flex-start", "spot", "on-demand"),
    max_run_duration_s=4 * 3600,  # the flex-start rung returns its nodes after this (at most 7 days)
    target=Target(kind="local", cluster="kfp-gpu-local", region="us-central1",  # type: ignore[arg-type]
                  provisioner="compute-class"),
    zones=("us-central1-a", "us-central1-b"),
    scale_up_deadline_s=600,
    recovery=Recovery(max_preemptions=3),  # a Spot node can be reclaimed; the job resumes from the checkpoint
    checkpoint_uri="/tmp/kfp-gpu/checkpoints/llm-finetune-computeclass",
    cost=CostInputs(expected_hours=2.0),
)


@kfp_gpu.provisioned(SPEC, runtime=("nodes", "scale_up_deadline_s"))
@dsl.pipeline(name="llm-finetune-computeclass",
              description="Data prep -> 2x8 GPU PyTorchJob on reservation > flex-start > spot > on-demand -> eval")
def llm_finetune_computeclass(num_docs: int = 256, train_steps: int = 30) -> None:
    finetune_dag(num_docs, train_steps)
