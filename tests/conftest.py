"""Cluster fixtures for every test directory (defined in tests/integration/conftest.py)."""

from tests.gcs_support import gcs, gcs_emulator  # noqa: F401 - the GCS emulator fixtures (tests/gcs_support.py)
from tests.integration.conftest import kube, kwok_nodes, namespace  # noqa: F401 - re-exported fixtures
