from __future__ import annotations

import pytest

from kfp_gpu.spec import CostInputs, ProvisioningSpec


@pytest.fixture
def spec() -> ProvisioningSpec:
    return ProvisioningSpec(
        accelerator="h100-80gb", nodes=4, gpus_per_node=8, capacity="spot",  # type: ignore[arg-type]
        cost=CostInputs(price_per_gpu_hour=4.0, expected_hours=2.0, sla_penalty_per_hour=1000.0),
    )
