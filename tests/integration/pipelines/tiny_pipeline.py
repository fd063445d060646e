"""A small user pipeline that is not the example: 2 x 1 L4 on-demand, one user step before training.

tests/integration/test_run_cli.py rehearses it with ``kfp-gpu run ... --arg greeting=...``. The cluster
and namespace come from the environment so concurrent test runs on the shared local cluster never meet:
``TINY_CLUSTER`` (the stand-in scenario's cluster name) and ``TINY_NAMESPACE``.
"""

import os

from kfp import dsl

import kfp_gpu
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target

SPEC = ProvisioningSpec(
    accelerator="l4",
    nodes=2,
    gpus_per_node=1,
    capacity=CapacityType.ON_DEMAND,
    target=Target(
        kind="local",  # type: ignore[arg-type]
        cluster=os.environ.get("TINY_CLUSTER", "kfp-gpu-local"),
        region="us-central1",
        pools=("l4-a", "l4-b"),
        namespace=os.environ.get("TINY_NAMESPACE", "default"),
    ),
    zones=("us-central1-a", "us-central1-b"),
    scale_up_deadline_s=120,
)


@dsl.component(base_image="python:3.11-slim", install_kfp_package=False)
def greet(greeting: str, repeat: int, shout: bool) -> str:
    """Print a marker line the test looks for in the executor log (never on the terminal)."""
    text = " ".join([greeting.upper() if shout else greeting] * repeat)
    print(f"tiny-marker: {text}")
    return text


@kfp_gpu.provisioned(SPEC)
@dsl.pipeline(name="tiny-l4", description="greet -> 2x1 L4 PyTorchJob")
def tiny(greeting: str = "hello", repeat: int = 1, shout: bool = False) -> None:
    hello = greet(greeting=greeting, repeat=repeat, shout=shout)
    kfp_gpu.train(name="tiny-train", command=["python", "-c", "print('training')"], after=[hello])
