"""The recovery bench's measures (bench/recovery_metrics.py): pure, virtual time, no cluster."""

from __future__ import annotations

import pytest

from bench.recovery_metrics import (
    Rank,
    best_baseline,
    idle_gpu_s,
    lowest_without_overlap,
    steps_lost,
    training_ranks,
    trains,
)

T0 = 100.0
LOST = frozenset({"n1"})


def _gang(**over: Rank) -> dict[str, Rank]:
    ranks = {f"r{i}": Rank(f"r{i}", f"n{i}", seen=10.0, running=True) for i in range(4)}
    ranks.update(over)
    return ranks


def test_before_the_loss_every_running_unstalled_rank_trains() -> None:
    g = _gang(r3=Rank("r3", "n3", 10.0, running=False))
    assert training_ranks(g.values(), now=50.0) == 3


def test_right_after_the_notice_nothing_trains_although_all_pods_still_run() -> None:
    # the victim is inside its 15 s grace, the survivors are not yet marked stalled: Running is not training
    assert training_ranks(_gang().values(), now=T0 + 0.01, t0=T0, lost_nodes=LOST) == 0


def test_a_hung_survivor_never_trains_again_while_it_runs() -> None:
    hung = Rank("r2", "n2", 10.0, running=True, stalled_at=T0 + 0.1)
    assert not trains(hung, now=T0 + 1000.0, t0=T0, lost_nodes=LOST)


def test_an_elastic_survivor_trains_from_its_resume_time_only() -> None:
    r = Rank("r2", "n2", 10.0, running=True, stalled_at=T0 + 0.1, resumes_at=T0 + 0.35)
    assert not trains(r, now=T0 + 0.3, t0=T0, lost_nodes=LOST)
    assert trains(r, now=T0 + 0.35, t0=T0, lost_nodes=LOST)


def test_a_rendezvous_from_an_earlier_loss_does_not_count_for_this_one() -> None:
    r = Rank("r2", "n2", 10.0, running=True, stalled_at=T0 - 50.0, resumes_at=T0 - 40.0)
    assert trains(r, now=T0 - 1.0)  # it trained after the earlier loss
    assert not trains(r, now=T0 + 1.0, t0=T0, lost_nodes=LOST)


def test_a_survivor_that_hangs_after_an_earlier_rendezvous_does_not_train() -> None:
    # 2 of 4 ranks lost 0.1 s apart, elastic min 3: the first loss re-rendezvoused it, the second hangs it
    r = Rank("r2", "n2", 10.0, running=True, stalled_at=T0 + 0.225, resumes_at=T0 + 0.2)
    assert not trains(r, now=T0 + 3.0, t0=T0, lost_nodes=LOST)


def test_the_lost_nodes_old_pod_never_trains_and_a_new_pod_on_the_recreated_node_does() -> None:
    old = Rank("r1", "n1", 10.0, running=True)
    new = Rank("r1b", "n1", T0 + 2.0, running=True)
    assert not trains(old, now=T0 + 3.0, t0=T0, lost_nodes=LOST)
    assert trains(new, now=T0 + 3.0, t0=T0, lost_nodes=LOST)
    assert not trains(Rank("r1c", "n1", T0 + 2.0, running=False), now=T0 + 3.0, t0=T0, lost_nodes=LOST)


def test_plain_job_needs_every_rank_new_elastic_job_trains_with_its_minimum() -> None:
    survivors = {f"r{i}": Rank(f"r{i}", f"n{i}", 10.0, True, T0 + 0.1, T0 + 0.35) for i in (0, 2, 3)}
    g = {**_gang(), **survivors}
    assert training_ranks(g.values(), now=T0 + 0.4, t0=T0, lost_nodes=LOST) == 3  # elastic min 3: trains
    g["r1b"] = Rank("r1b", "n1", T0 + 2.0, running=True)
    assert training_ranks(g.values(), now=T0 + 2.1, t0=T0, lost_nodes=LOST) == 4


def test_idle_gpus_survivors_from_the_loss_replacement_from_its_ready() -> None:
    # 3 survivors idle 5 s; the replacement Ready at +2 idles until all ranks train at +5: (15 + 3) x 8
    assert idle_gpu_s(t0=T0, gpus_per_node=8, survivors=3, t_train=T0 + 5, t_full=T0 + 5,
                      replacement_ready=[T0 + 2]) == pytest.approx(144.0)
    # elastic: survivors train again at +0.35; the replacement idles from +2 until it joins at +2.2
    assert idle_gpu_s(t0=T0, gpus_per_node=8, survivors=3, t_train=T0 + 0.35, t_full=T0 + 2.2,
                      replacement_ready=[T0 + 2]) == pytest.approx((3 * 0.35 + 0.2) * 8)
    # a replacement Ready after everyone trains idles nothing
    assert idle_gpu_s(t0=T0, gpus_per_node=8, survivors=3, t_train=T0 + 1, t_full=T0 + 1,
                      replacement_ready=[T0 + 3]) == pytest.approx(24.0)


def test_idle_gpus_refuse_times_out_of_order() -> None:
    with pytest.raises(ValueError, match="out of order"):
        idle_gpu_s(t0=T0, gpus_per_node=8, survivors=3, t_train=T0 + 2, t_full=T0 + 1, replacement_ready=[])


def test_steps_lost_and_a_resume_ahead_of_progress_is_an_error() -> None:
    assert steps_lost(27, 20) == 7
    assert steps_lost(27, 0) == 27
    with pytest.raises(ValueError, match="resume step 30"):
        steps_lost(27, 30)


def test_best_baseline_is_the_lowest_realistic_median() -> None:
    assert best_baseline({"training_operator": 5.4, "training_operator_elastic": 0.4, "ours": 0.1},
                         ("training_operator", "training_operator_elastic")) == "training_operator_elastic"
    assert best_baseline({"training_operator": None}, ("training_operator",)) is None


def test_lowest_is_claimed_only_without_overlap() -> None:
    assert lowest_without_overlap({"a": [1.0, 1.2], "b": [1.3, 2.0], "c": [5.0]}) == "a"
    assert lowest_without_overlap({"a": [1.0, 1.4], "b": [1.3, 2.0]}) is None
    assert lowest_without_overlap({"a": [1.0], "b": []}) is None
