"""A rehearsal's step metrics through the controller are in the world's clock: the controller runs with
KFP_GPU_WORLD_TIME_SCALE (as `kfp-gpu run` starts it), its work unit scales the step's wall-clock metrics
(kfp_gpu.steps.entry.run_step), and the tenant's step client reads them back from the GpuGang."""

from __future__ import annotations

import time

import pytest

from kfp_gpu.rehearsal_seam import TIME_SCALE_ENV
from tests.integration.controller_support import new_run

pytestmark = pytest.mark.integration


def test_scale_up_seconds_come_back_in_world_seconds_and_counts_as_they_are(tenant, monkeypatch) -> None:
    monkeypatch.setenv(TIME_SCALE_ENV, "120")  # the controller's environment, as `kfp-gpu run` sets it
    t = tenant()
    spec, run = t.spec(2), new_run()
    for s in ("preflight", "warm_pool"):
        t.step(s, spec, run)
    t0 = time.monotonic()
    m = t.step("scale_up", spec, run).metrics
    wall = time.monotonic() - t0  # the client's round trip: longer than the step's own wall-clock seconds
    assert wall < m["scale_up_seconds"] <= 120 * wall, (wall, m)
    assert m["nodes_ready"] == 2.0 and m["gpus_ready"] == 16.0, m
    t.step("teardown", spec, run)
