"""Cluster fixtures for every test directory (defined in tests/integration/conftest.py)."""

from tests.integration.conftest import kube, kwok_nodes, namespace  # noqa: F401 - re-exported fixtures
