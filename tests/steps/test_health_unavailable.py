"""The GPU health gate where it cannot run before the job (a gang formed at Kueue admission): said once, in the
ledger, the timeline and the log, never a silent pass (no cluster: a plain state object)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kfp_gpu.spec import Health, ProvisioningSpec
from kfp_gpu.steps.health_gate import HealthGate


class Timeline:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, kind: str, at: float, **fields: Any) -> None:
        self.events.append((kind, fields))


def _state(probe: bool) -> Any:
    spec = ProvisioningSpec(accelerator="nvidia-h100-80gb", nodes=2, health=Health(probe=probe))
    return SimpleNamespace(spec=spec, ledger={}, timeline=Timeline())


def test_a_gate_that_cannot_run_is_recorded_once() -> None:
    st, gate = _state(True), HealthGate()
    assert gate.unavailable(st, "no nodes before admission") is True
    assert gate.unavailable(st, "no nodes before admission") is False  # the next attempt: said already
    [entry] = st.ledger["health"]
    assert entry["action"] == "skipped" and entry["message"] == "no nodes before admission"
    assert [k for k, _ in st.timeline.events] == ["health-skipped"]


def test_nothing_is_said_when_the_probe_is_off() -> None:
    st = _state(False)
    assert HealthGate().unavailable(st, "no nodes before admission") is False
    assert "health" not in st.ledger and st.timeline.events == []
