"""Cluster fixtures for every test directory (defined in tests/integration/conftest.py); the tier rule
(tests/tiers.py): a test that uses the dev cluster or an emulator must carry the ``integration`` mark; and the
stand-ins' controller credentials: the test process plays the controller when it calls a provider against a stand-in,
so it holds exactly the shipped roles (deploy/gcp-role.yaml, deploy/aws-policy.json; kfp_gpu_rehearsal.sim.gcp_iam,
kfp_gpu_rehearsal.sim.aws.iam).
"""

from __future__ import annotations

import os

import pytest

from kfp_gpu import iam
from tests.gcs_support import gcs, gcs_emulator  # noqa: F401 - the GCS emulator fixtures (tests/gcs_support.py)
from tests.integration.conftest import kube, kwok_nodes, namespace  # noqa: F401 - re-exported fixtures
from tests.tiers import unmarked_integration


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    bad = unmarked_integration(items)
    if bad:
        raise pytest.UsageError(
            "these tests use the dev cluster or an emulator but carry no integration mark (add "
            "`pytestmark = pytest.mark.integration` or @pytest.mark.integration): " + ", ".join(bad))


for _k, _v in iam.sim_controller_env().items():
    os.environ.setdefault(_k, _v)
