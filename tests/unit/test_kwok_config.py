"""The dev cluster's KWOK config and its node stages agree on how a fake node stays Ready.

``node-heartbeat-with-lease`` rewrites a Ready node's status only every 10-20 min: that is a kubelet with Leases
(status every few minutes, a Lease renewal every 10 s). kube-controller-manager marks a node Unknown when neither
moved for its node-monitor grace period (50 s by default in Kubernetes 1.34; boot.py does not change it), so KWOK
must renew node Leases with a duration under that grace, or every node flaps Ready -> Unknown -> Ready under the
tests and the bench (unreachable taints, pods marked NotReady; see docs/local-cluster.md).
"""

from __future__ import annotations

from typing import Any

import yaml

from kfp_gpu_rehearsal.devcluster import boot

GRACE_S = 50.0  # kube-controller-manager --node-monitor-grace-period default (Kubernetes 1.32+)


def _stages() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(boot.STAGES_FILE.read_text()) if d}


def _heartbeat_s(stage: dict[str, Any]) -> float:
    return float(stage["spec"].get("delay", {}).get("durationMilliseconds", 0)) / 1000.0


def test_kwok_renews_leases_when_the_heartbeat_stage_is_slower_than_the_grace_period() -> None:
    hb = _stages()["node-heartbeat-with-lease"]
    options = yaml.safe_load(boot.KWOK_CONFIG_FILE.read_text())["options"]
    lease_s = float(options.get("nodeLeaseDurationSeconds") or 0)
    if _heartbeat_s(hb) < GRACE_S:
        return  # status heartbeats alone keep nodes Ready
    assert lease_s > 0, (f"{boot.KWOK_CONFIG_FILE.name}: nodeLeaseDurationSeconds is unset (no node Leases) while "
                         f"{hb['metadata']['name']} writes status every {_heartbeat_s(hb):g} s > the {GRACE_S:g} s "
                         "node-monitor grace period: every node would go Unknown (set it to 40, the kubelet's default)")
    assert lease_s * 0.25 < GRACE_S  # KWOK renews at a quarter of the duration, as the kubelet does
