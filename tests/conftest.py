"""Cluster fixtures for every test directory (defined in tests/integration/conftest.py), and the tier rule
(tests/tiers.py): a test that uses the dev cluster or an emulator must carry the ``integration`` mark."""

from __future__ import annotations

import pytest

from tests.gcs_support import gcs, gcs_emulator  # noqa: F401 - the GCS emulator fixtures (tests/gcs_support.py)
from tests.integration.conftest import kube, kwok_nodes, namespace  # noqa: F401 - re-exported fixtures
from tests.tiers import unmarked_integration


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    bad = unmarked_integration(items)
    if bad:
        raise pytest.UsageError(
            "these tests use the dev cluster or an emulator but carry no integration mark (add "
            "`pytestmark = pytest.mark.integration` or @pytest.mark.integration): " + ", ".join(bad))
