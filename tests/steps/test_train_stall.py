"""The train step's stall supervisor: which nodes it swaps and when (no cluster: a plain state object, a local store,
virtual time for the progress)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kfp_gpu.plan.recovery import Cause
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps.train_stall import StallSupervisor


class Timeline:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, kind: str, at: float, **fields: Any) -> None:
        self.events.append((kind, fields))


def _state(tmp_path: Path, **spec: Any) -> Any:
    s = ProvisioningSpec(accelerator="nvidia-h100-80gb", nodes=4, checkpoint_uri=str(tmp_path), **spec)
    return SimpleNamespace(spec=s, ledger={}, capacity=SimpleNamespace(nodes=("n0", "n1", "n2", "n3")),
                           timeline=Timeline(), job="j", ckpt=None, checkpoint=lambda: None,
                           watch=SimpleNamespace(pods={}, gang=frozenset()), kind=SimpleNamespace(TRAINER_STATUS=False))


def test_a_node_first_to_stop_in_two_stalls_is_an_offender(tmp_path: Path) -> None:
    st = _state(tmp_path)
    sup = StallSupervisor.for_state(st, scale=1.0)
    assert sup is not None
    st.ledger["stalls"] = [{"first_stopped_nodes": {"1": "n1"}}]
    assert sup.offenders() == []
    st.ledger["stalls"].append({"first_stopped_nodes": {"2": "n2"}})
    assert sup.offenders() == []  # two stalls, two different nodes
    st.ledger["stalls"].append({"first_stopped_nodes": {"3": "n1"}})
    assert sup.offenders() == ["n1"]
    st.capacity.nodes = ("n0", "n2", "n3", "n4")  # already swapped out: not again
    assert sup.offenders() == []


def test_an_offender_of_a_gang_formed_at_admission_is_found_among_the_nodes_its_pods_bound_to(tmp_path: Path) -> None:
    st = _state(tmp_path)  # Kueue admission: the capacity names no nodes; the attempt adopted the bound ones
    st.capacity.nodes = ()
    st.watch.gang = frozenset({"a0", "a1"})
    sup = StallSupervisor.for_state(st, scale=1.0)
    assert sup is not None
    st.ledger["stalls"] = [{"first_stopped_nodes": {"1": "a1"}}, {"first_stopped_nodes": {"1": "a1"}}]
    assert sup.offenders() == ["a1"]
    st.watch.gang = frozenset({"a0", "a2"})  # the re-admitted attempt landed elsewhere: not again
    assert sup.offenders() == []


def test_a_straggler_swap_waits_for_a_newer_checkpoint(tmp_path: Path) -> None:
    st = _state(tmp_path, stragglers="replace")
    sup = StallSupervisor.for_state(st, scale=1.0)
    assert sup is not None
    sup.swap = {"n2": 100}  # found slow while checkpoint 100 was the newest
    assert sup._swap_due(5.0) is None
    st.checkpoint = lambda: SimpleNamespace(step=100)
    assert sup._swap_due(5.0) is None  # the same checkpoint: not a boundary yet
    st.checkpoint = lambda: SimpleNamespace(step=150)
    v = sup._swap_due(6.0)
    assert v is not None and v.cause is Cause.STRAGGLER and "n2" in v.reason and "150" in v.reason


def test_no_checkpoint_store_means_no_supervisor(tmp_path: Path) -> None:
    st = _state(tmp_path)
    st.spec = st.spec.replace(checkpoint_uri="")
    assert StallSupervisor.for_state(st) is None
