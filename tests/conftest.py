"""Cluster fixtures for every test directory (defined in tests/integration/conftest.py), and the stand-ins'
controller credentials: the test process plays the controller when it calls a provider against a stand-in, so it
holds exactly the shipped roles (deploy/gcp-role.yaml, deploy/aws-policy.json; kfp_gpu.sim.gcp_iam, kfp_gpu.sim.aws.iam).
"""

import os

from kfp_gpu import iam
from tests.gcs_support import gcs, gcs_emulator  # noqa: F401 - the GCS emulator fixtures (tests/gcs_support.py)
from tests.integration.conftest import kube, kwok_nodes, namespace  # noqa: F401 - re-exported fixtures

for _k, _v in iam.sim_controller_env().items():
    os.environ.setdefault(_k, _v)
