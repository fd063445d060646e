"""The controller's kopf peering settings (kfp_gpu/controller/handlers.py ``_configure``): what makes one of the
Deployment's two replicas act and the other take over (tests/integration/test_controller_replicas.py runs them)."""

from __future__ import annotations

import kopf
import pytest

from kfp_gpu.controller import handlers


def _configured(monkeypatch: pytest.MonkeyPatch, pod: str, peering: str = "kfp-gpu-controller") -> kopf.OperatorSettings:
    monkeypatch.setenv("POD_NAME", pod)
    settings = kopf.OperatorSettings()
    settings.peering.name = peering  # what kopf.run(peering_name=...) sets before the startup handlers run
    handlers._configure(settings)
    return settings


def test_each_replica_gets_its_own_priority_from_its_pod_name(monkeypatch: pytest.MonkeyPatch) -> None:
    a = _configured(monkeypatch, "kfp-gpu-controller-7d9f-abcde").peering.priority
    b = _configured(monkeypatch, "kfp-gpu-controller-7d9f-fghij").peering.priority
    assert a != b and min(a, b) > 0  # equal priorities would freeze both; 0 is kopf's default (a stray operator)
    assert _configured(monkeypatch, "kfp-gpu-controller-7d9f-abcde").peering.priority == a  # stable per pod


def test_the_peering_is_the_cluster_object_named_by_peering_with_a_short_lifetime(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = _configured(monkeypatch, "pod-a", peering="kfp-gpu-test-1234")
    assert s.peering.name == "kfp-gpu-test-1234"  # --peering is not overridden by the startup handler
    assert s.peering.clusterwide  # also for --namespace: the controller's RBAC grants ClusterKopfPeerings only
    assert s.peering.lifetime == handlers.PEERING_LIFETIME_S == 15  # the standby's takeover bound after kill -9
