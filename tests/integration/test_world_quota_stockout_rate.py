"""The product against the harder world (issue 28, world realism): a partial stockout and a quota that GCE
reports as managed-instance-group creation errors (not as setSize refusals), and a request budget that binds
per wall second. Scale-up still fails over, says QuotaExceeded in one line, and retries rate limits."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from kfp_gpu.cluster import ledger
from kfp_gpu.errors import QuotaExceeded
from kfp_gpu.steps import scale_up, teardown
from tests.integration.test_provisioning import env  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _regions(**quotas: Any) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
    regions = copy.deepcopy(data["regions"])
    regions["us-central1"]["quotas"].update(quotas)
    return dict(regions)


def test_partial_stockout_reported_as_mig_errors_fails_over_to_the_next_zone(env):  # noqa: F811
    # us-central1-a has room for one A100 VM: setSize 2 is DONE, one VM boots, the other is a
    # ZONE_RESOURCE_POOL_EXHAUSTED instance error the group keeps retrying
    e = env(stockouts=[{"zone": "us-central1-a", "window": "always", "capacity": 1}])
    spec = e.spec(2)
    run = f"run-{uuid.uuid4().hex[:6]}"
    cap = json.loads(scale_up.run(spec, run, "", api=e.step_api, provider=e.provider(spec)).output_json)
    assert {p["zone"] for p in cap["placements"]} == {"us-central1-b"}
    assert sum(len(p["nodes"]) for p in cap["placements"]) == 2
    hist = ledger.read(e.api, e.ns, run, "scale_up")["failover"]["history"]
    assert hist[0]["zone"] == "us-central1-a" and hist[0]["error"] == "CapacityUnavailable"
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in hist[0]["message"]
    assert e.pool_size("a100-80gb-spot-a") == 0  # the failed zone was rolled back
    teardown.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    e.wait_pool("a100-80gb-spot-b", 0)


def test_quota_exceeded_in_the_groups_instance_errors_is_the_one_line_quota_error(env):  # noqa: F811
    # room in quota for one 8-GPU spot VM: the resize is accepted, the second VM is a QUOTA_EXCEEDED instance error
    e = env(regions=_regions(PREEMPTIBLE_NVIDIA_A100_80GB_GPUS={"limit": 8, "usage": 0}))
    spec = e.spec(2)
    run = f"run-{uuid.uuid4().hex[:6]}"
    with pytest.raises(QuotaExceeded) as ei:
        scale_up.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    err = ei.value
    assert err.fields["metric"] == "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS" and "\n" not in str(err)
    assert "request more PREEMPTIBLE_NVIDIA_A100_80GB_GPUS quota" in err.remediation
    assert [h["error"] for h in err.fields["failover_history"]] == ["QuotaExceeded"]  # no zone of the region tried
    teardown.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    e.wait_pool("a100-80gb-spot-a", 0)


def test_rate_limited_world_is_retried_and_the_gang_is_made(env):  # noqa: F811
    # 120 requests per minute = 2 per wall second per service: scale-up's own reads and polls exceed it
    e = env(api={"requests_per_minute": 120, "error_rate": 0.0})
    spec = e.spec(2, deadline=60.0)
    run = f"run-{uuid.uuid4().hex[:6]}"
    cap = json.loads(scale_up.run(spec, run, "", api=e.step_api, provider=e.provider(spec)).output_json)
    assert sum(len(p["nodes"]) for p in cap["placements"]) == 2
    assert e.sim.gate.snapshot().get("rateLimited", 0) > 0, "the budget never bound: the test shows nothing"
    teardown.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    e.wait_pool("a100-80gb-spot-a", 0, timeout=60.0)
