"""The scenario's gpu_faults block and the world's GPU fate rules (no cluster: a recording core API)."""

from __future__ import annotations

from typing import Any

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.plan.health import EXIT_DCGM_DIAG, EXIT_DEVICE_COUNT
from kfp_gpu_rehearsal.sim import from_dict
from kfp_gpu_rehearsal.sim.gpuhealth import DIAG_S, EXIT_ANNOTATION, GpuFault, fate
from kfp_gpu_rehearsal.sim.ranks import rfc3339
from tests.sim._helpers import scenario


def _pool() -> str:
    return str(scenario()["pools"][0]["name"])


def test_gpu_faults_parse_with_defaults() -> None:
    pool = _pool()
    sc = from_dict(scenario(gpu_faults={"born_bad": [{"pool": pool, "count": 2, "kind": "missing"}],
                                        "xid": [{"at_s": 600, "pool": pool}]}))
    (b,) = sc.gpu_faults.born_bad
    assert (b.pool, b.count, b.fault) == (pool, 2, GpuFault("missing", 120.0, False))
    (x,) = sc.gpu_faults.xid
    assert (x.at_s, x.count, x.fault) == (600.0, 1, GpuFault("xid", 120.0, True))
    assert from_dict(scenario()).gpu_faults.born_bad == ()


@pytest.mark.parametrize(("block", "field"), [
    ({"born_bad": [{"pool": "nope"}]}, "gpu_faults.born_bad[0].pool"),
    ({"born_bad": [{"pool": "POOL", "kind": "melted"}]}, "gpu_faults.born_bad[0].kind"),
    ({"xid": [{"pool": "POOL", "at_s": -1}]}, "gpu_faults.xid[0].at_s"),
    ({"xid": [{"pool": "POOL", "when": 3}]}, "gpu_faults.xid[0].when"),
    ({"born_bad": [{"pool": "POOL", "condition": "yes"}]}, "gpu_faults.born_bad[0].condition"),
])
def test_gpu_faults_errors_name_the_field(block: dict[str, Any], field: str) -> None:
    pool = _pool()
    for entries in block.values():
        for e in entries:
            if e.get("pool") == "POOL":
                e["pool"] = pool
    with pytest.raises(InvalidSpec, match=field.replace("[", r"\[").replace("]", r"\]")):
        from_dict(scenario(gpu_faults=block))


OWNED = frozenset({"good", "bad"})


def _pod(name: str, node: str, *, probe: bool = False, level: int = 1, gpu: bool = True) -> dict[str, Any]:
    env = [{"name": "KFP_GPU_DCGM_LEVEL", "value": str(level)}]
    limits = {"nvidia.com/gpu": "8"} if gpu else {}
    return {"metadata": {"name": name, "namespace": "ns", "uid": name,
                         "labels": {"kfp-gpu.io/gpu-probe": "run"} if probe else {}},
            "spec": {"nodeName": node, "containers": [{"env": env, "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}


def test_probes_are_answered_by_the_node_and_the_dcgm_level() -> None:
    bad = {"bad": GpuFault("missing")}
    good = fate(_pod("p-good", "good", probe=True, level=2), OWNED, bad, 0.0)
    assert good is not None and good[EXIT_ANNOTATION] == "0"
    assert float(good["kfp-gpu.io/sim-duration"].rstrip("s")) == pytest.approx(DIAG_S[2] / 120.0, abs=0.01)
    failed = fate(_pod("p-bad", "bad", probe=True), OWNED, bad, 0.0)
    assert failed is not None and failed[EXIT_ANNOTATION] == str(EXIT_DEVICE_COUNT)
    assert fate(_pod("p-other", "someone-elses-node", probe=True), OWNED, bad, 0.0) is None
    done = _pod("p-done", "good", probe=True)
    done["status"]["phase"] = "Succeeded"
    assert fate(done, OWNED, bad, 0.0) is None
    assert GpuFault("dcgm").probe_exit == EXIT_DCGM_DIAG


def test_gpu_pods_crash_only_on_bad_nodes() -> None:
    bad = {"bad": GpuFault("dcgm", crash_after_s=60.0)}
    assert fate(_pod("rank-0", "good"), OWNED, bad, 1000.0) is None
    assert fate(_pod("cpu-sidecar", "bad", gpu=False), OWNED, bad, 1000.0) is None
    crash = fate(_pod("rank-1", "bad"), OWNED, bad, 1000.0)
    assert crash is not None and crash[EXIT_ANNOTATION] == "1"
    assert crash["kfp-gpu.io/sim-duration"] == rfc3339(1000.0 + 60.0 / 120.0)
