"""Where a gang's ledgers live (kfp_gpu/cluster/ledger.py): the controller's namespace when it sets
KFP_GPU_LEDGER_NAMESPACE, the gang's own namespace otherwise; names never collide across gang namespaces."""

from __future__ import annotations

import pytest

from kfp_gpu.cluster import ledger


def test_without_a_home_the_ledger_stays_in_the_gangs_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ledger.HOME_ENV, raising=False)
    assert ledger.home("team-a") == "team-a"
    assert ledger.ledger_name("run-1", "scale_up", "team-a") == "kfp-gpu-ledger-run-1-scale-up"


def test_the_controllers_home_holds_every_gangs_ledgers_under_distinct_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ledger.HOME_ENV, "kfp-gpu-system")
    assert ledger.home("team-a") == ledger.home("team-b") == "kfp-gpu-system"
    a = ledger.ledger_name("run-1", "scale_up", "team-a")
    b = ledger.ledger_name("run-1", "scale_up", "team-b")
    assert a != b and "team-a" in a and "team-b" in b
    long_ns = "n" * 63
    name = ledger.ledger_name("r" * 200, "warm_pool", long_ns)
    assert len(name) <= 253 and name == name.lower()  # a ConfigMap name is a DNS subdomain
