"""What the surviving ranks of a job do when one rank is lost (kfp_gpu_rehearsal.sim.ranks.peer_fate), in virtual time."""

from __future__ import annotations

from kfp_gpu_rehearsal.sim.ranks import DEFAULT_PG_TIMEOUT_S, HANG_EXIT_CODE, JobShape, peer_fate


def test_rank_loss_peers_hang_until_torchs_default_timeout_then_exit_non_zero() -> None:
    fate = peer_fate(JobShape(replicas=4), lost=1, lost_at=100.0)
    assert (fate.kind, fate.until, fate.exit_code) == ("hang", 100.0 + 600.0, HANG_EXIT_CODE)
    assert DEFAULT_PG_TIMEOUT_S == 600.0  # torch: NCCL process groups time out after 10 minutes by default
    assert fate.progressing(99.9) and not fate.exited(99.9)
    for t in (100.0, 400.0, 699.9):  # Running, blocked in the collective: no progress, no exit
        assert not fate.progressing(t) and not fate.exited(t)
    assert fate.exited(700.0) and not fate.progressing(10_000.0)


def test_rank_loss_hang_follows_the_jobs_own_timeout() -> None:
    fate = peer_fate(JobShape(replicas=8, pg_timeout_s=120.0), lost=2, lost_at=5.0)
    assert fate.kind == "hang" and fate.until == 125.0 and not fate.exited(124.9) and fate.exited(125.0)


def test_rank_loss_elastic_job_re_rendezvous_and_trains_again() -> None:
    job = JobShape(replicas=4, elastic_min=2, max_restarts=3, rendezvous_s=30.0)
    fate = peer_fate(job, lost=1, lost_at=50.0)
    assert (fate.kind, fate.until, fate.exit_code) == ("rendezvous", 80.0, 0)
    assert not fate.progressing(79.9) and fate.progressing(80.0) and not fate.exited(1e9)


def test_rank_loss_elastic_job_below_its_minimum_or_out_of_restarts_hangs() -> None:
    below = peer_fate(JobShape(replicas=4, elastic_min=4, max_restarts=3), lost=1, lost_at=0.0)
    spent = peer_fate(JobShape(replicas=4, elastic_min=2, max_restarts=2, restarts_used=2), lost=1, lost_at=0.0)
    assert below.kind == spent.kind == "hang" and below.until == spent.until == DEFAULT_PG_TIMEOUT_S
