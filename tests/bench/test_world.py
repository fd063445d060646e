"""The one world of the burst benchmark: every side's nodes boot on the same seeded sampler (no cluster)."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any

from bench.run import _modes
from bench.world import DEVICE_PLUGIN_S, PENDING_S, BootDraws, Injector, scenario
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.scenario import from_dict
from kfp_gpu_rehearsal.sim.state import PoolRuntime


def test_the_injector_draws_the_stand_ins_sequence_for_the_same_seed() -> None:
    seed = 16003
    pool = from_dict(scenario("c", seed)).pools[0]
    rt = PoolRuntime(pool, rng=pool.boot.sampler())  # as the stand-in seeds each pool (kfp_gpu_rehearsal/sim/state.py)
    stand_in = [compress(pool.boot.sample(rt.rng)) for _ in range(16)]
    draws = BootDraws(seed)
    injected = [draws.next() for _ in range(16)]
    assert [s - compress(PENDING_S) for s, _ in injected] == [pytest_approx(x) for x in stand_in]
    assert all(abs(r - s - compress(DEVICE_PLUGIN_S)) < 1e-9 for s, r in injected)  # GPUs usable 90 s later
    assert len(set(stand_in)) == 16  # a lognormal, not one constant
    other = BootDraws(seed + 1)
    assert [other.next()[0] for _ in range(4)] != [s for s, _ in injected[:4]]  # the seed is what makes them equal


def pytest_approx(x: float) -> Any:
    import pytest

    return pytest.approx(x, abs=1e-9)


def test_the_injector_annotates_only_pending_nodes_with_the_next_draw() -> None:
    got: list[tuple[str, dict[str, Any]]] = []
    statuses: list[tuple[str, dict[str, Any]]] = []
    done = threading.Event()

    def patch(name: str, body: dict[str, Any]) -> None:
        got.append((name, body))
        done.set()

    inj = Injector(patch, lambda name, body: statuses.append((name, body)))
    inj.seed(4000)
    seen = 1_800_000_000.0
    inj.on_node({"metadata": {"name": "other", "labels": {}}}, seen)  # not the bench's: untouched
    inj.on_node({"metadata": {"name": "done", "labels": {"kfp-gpu.io/boot-injection": "pending"},
                              "annotations": {"kfp-gpu.io/boot-delay": "1s"}}}, seen)  # already injected
    inj.on_node({"metadata": {"name": "n1", "labels": {"kfp-gpu.io/boot-injection": "pending"}}}, seen)
    assert done.wait(10.0)
    sample, ready_in = BootDraws(4000).next()
    [(name, body)] = got
    notes = body["metadata"]["annotations"]
    assert name == "n1" and float(notes["kfp-gpu.io/boot-sample"]) == round(sample, 6)
    at = datetime.strptime(notes["kfp-gpu.io/ready-at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert abs(at.timestamp() - (seen + ready_in)) < 1e-5  # absolute: counted from when the watch saw the node
    # n1 had no Ready condition (as Karpenter's kwok nodes): NotReady first, so its not-ready taint stays
    assert [(n, b["status"]["conditions"][0]["status"]) for n, b in statuses] == [("n1", "False")]
    done.clear()
    inj.on_node({"metadata": {"name": "n2", "labels": {"kfp-gpu.io/boot-injection": "pending"}},
                 "status": {"conditions": [{"type": "Ready", "status": "False"}]}}, seen)  # a CA template's copy
    assert done.wait(10.0)
    assert [n for n, _ in got] == ["n1", "n2"] and len(statuses) == 1


def test_the_full_mode_runs_5_repeats_up_to_64_and_3_at_128_and_512() -> None:
    full, quick = _modes()["full"], _modes()["quick"]
    assert {n: full.burst_repeats(n) for n in full.burst_ns} == {4: 5, 16: 5, 64: 5, 128: 3, 512: 3}
    assert quick.burst_repeats(4) == 1 and full.sequential_max == 4  # the one cut that keeps make bench < 120 min


def test_a_node_the_side_does_not_own_never_takes_one_of_its_draws() -> None:
    inj = Injector(lambda name, body: None)
    inj.seed(4000, lambda labels: labels.get("pool") == "mine")
    stray = inj.body(1.0, {"pool": "someone-elses"})  # another controller's scale-up, between the side's nodes
    mine = [inj.body(1.0, {"pool": "mine"}) for _ in range(3)]
    expected = BootDraws(4000)
    assert [float(b["metadata"]["annotations"]["kfp-gpu.io/boot-sample"]) for b in mine] == \
        [round(expected.next()[0], 6) for _ in range(3)]
    assert stray["metadata"]["annotations"]["kfp-gpu.io/boot-sample"] != mine[0]["metadata"]["annotations"][
        "kfp-gpu.io/boot-sample"]



def test_every_side_pays_the_same_image_pull_and_the_report_says_so() -> None:
    from bench.peers import _gang_pod
    from bench.report import _world
    from bench.world import PULL, description

    assert from_dict(scenario("c", 1)).world.image_pull == PULL  # the stand-in's nodes
    assert from_dict(scenario("c", 1, zero_boot=True)).world.image_pull.pull_s() == 0.0  # overhead world: no pull
    assert _gang_pod("t", 0)["metadata"]["annotations"]["kfp-gpu.io/image-pull"] == "world"  # every side's pods
    line = _world(description())
    assert "10 GB image at 125 MiB/s" in line and f"{compress(PULL.pull_s()):.4g}" in line, line
    assert "not modelled" in _world({**description(), "image_pull": "not modelled (no side pays it)"})
