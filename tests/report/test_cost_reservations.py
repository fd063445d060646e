"""The cost report bills a reserved GPU once: a node that consumes a reservation is the reservation's VM."""

from __future__ import annotations

from kfp_gpu.report.cost import RESERVATION_HELD, RESERVATION_RELEASED, cost_report
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.timeline import NodeState, Timeline

H = 3600.0


def timeline(nodes: int, *, reserved_gpus: int = 0, pools: tuple[str, ...] = ()) -> Timeline:
    """``nodes`` 8-GPU nodes of pool p Ready from hour 1 to hour 3; a reservation held from hour 0 to 3."""
    tl = Timeline("run-1")
    for i in range(nodes):
        n = tl.node(f"n{i}", pool="p", gpus=8)
        n.advance(NodeState.REQUESTED, 0.0)
        n.advance(NodeState.REGISTERED, 0.5 * H)
        n.advance(NodeState.READY, 1 * H)
        n.advance(NodeState.RELEASED, 3 * H)
    if reserved_gpus:
        tl.event(RESERVATION_HELD, 0.0, name="r", gpus=reserved_gpus, pools=list(pools))
        tl.event(RESERVATION_RELEASED, 3 * H, name="r")
    return tl


SPEC = ProvisioningSpec("a100-80gb", nodes=2)


def test_without_reservations_billed_is_provisioned() -> None:
    rep = cost_report(SPEC, timeline(2))
    assert rep.provisioned_gpu_hours == 32.0 and rep.billed_gpu_hours == 32.0 and rep.reserved_gpu_hours == 0.0
    assert "GPU-hours billed" not in [r[0] for r in rep.rows()]


def test_consumed_reservation_is_billed_once() -> None:
    rep = cost_report(SPEC, timeline(2, reserved_gpus=16))
    # hour 0-1: 16 reserved, idle; hour 1-3: the 16 GPUs of the nodes ARE the reservation: 16 + 32, not 16 x 3 + 32
    assert rep.reserved_gpu_hours == 48.0 and rep.billed_gpu_hours == 48.0
    assert rep.billed_cost_usd == round(48.0 * SPEC.price_per_gpu_hour(), 4)
    assert "GPU-hours billed" in [r[0] for r in rep.rows()]


def test_nodes_beyond_the_reservation_and_of_other_pools_are_billed_on_top() -> None:
    assert cost_report(SPEC, timeline(3, reserved_gpus=16)).billed_gpu_hours == 16.0 + 48.0 + 0.0
    other_pool = cost_report(SPEC, timeline(2, reserved_gpus=16, pools=("q",)))
    assert other_pool.billed_gpu_hours == 48.0 + 32.0  # nothing consumed it: reservation + nodes
