"""The tier rule: a test that uses the dev cluster or an emulator carries the ``integration`` mark, so
``-m "not integration"`` (``make test-unit``) never boots or reaches either.

Checked twice: at collection (:func:`unmarked_integration`, over each test's fixture closure; tests/conftest.py stops
the collection naming the offenders), and when such a fixture is set up (:func:`require_integration`, called first
by ``kube`` and ``gcs_emulator``), which also catches ``request.getfixturevalue``, before anything boots.
"""

from __future__ import annotations

import pytest

# kube boots (or re-uses) the dev cluster; every cluster fixture depends on it. gcs_emulator starts fake-gcs-server.
NEEDS_INTEGRATION = frozenset({"kube", "gcs_emulator"})


def unmarked_integration(items: list[pytest.Item]) -> list[str]:
    """The node ids of tests that use a cluster/emulator fixture but carry no ``integration`` mark."""
    return [item.nodeid for item in items
            if NEEDS_INTEGRATION & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("integration") is None]


def require_integration(request: pytest.FixtureRequest, what: str) -> None:
    """Fail the asking test (not skip) when it carries no ``integration`` mark."""
    item = getattr(request, "_pyfuncitem", None)  # the test that asked, also through getfixturevalue
    if item is not None and item.get_closest_marker("integration") is None:
        pytest.fail(f"{item.nodeid} uses {what} but carries no integration mark: add "
                    "`pytestmark = pytest.mark.integration` or @pytest.mark.integration", pytrace=False)
