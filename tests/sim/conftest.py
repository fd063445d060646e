from __future__ import annotations

from collections.abc import Iterator

import pytest

from kfp_gpu_rehearsal.sim import SimServer
from tests.sim._helpers import running


@pytest.fixture
def sim() -> Iterator[SimServer]:
    """A stand-in on a free port with the bundled default scenario and in-memory nodes."""
    with running() as s:
        yield s
