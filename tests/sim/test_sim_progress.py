"""The rehearsal trainer's rules (kfp_gpu_rehearsal.sim.progress, docs/sim.md "Training ranks"): pure functions, virtual time,
and the ``training`` scenario key's validation."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

from kfp_gpu.checkpoint import CheckpointStore
from kfp_gpu.checkpoint import progress as rank_progress
from kfp_gpu.checkpoint.backends import open_backend
from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim import from_dict
from kfp_gpu_rehearsal.sim.progress import STEP_ANNOTATION, ProgressWorld, incarnation, ours, rank_of, step_at
from kfp_gpu_rehearsal.sim.trainingspec import RankFault, TrainingSpec, parse_training
from tests.sim._helpers import scenario


def test_ranks_of_pytorchjob_and_jobset_pods() -> None:
    t, i = "training.kubeflow.org/replica-type", "training.kubeflow.org/replica-index"
    assert rank_of({t: "master", i: "0"}) == 0
    assert rank_of({t: "worker", i: "0"}) == 1 and rank_of({t: "worker", i: "6"}) == 7
    js = "jobset.sigs.k8s.io/jobset-name"
    assert rank_of({js: "a", "jobset.sigs.k8s.io/job-global-index": "3"}) == 3  # one pod per Job
    assert rank_of({js: "a", "batch.kubernetes.io/job-completion-index": "5"}) == 5  # one indexed Job (TrainJob)
    assert rank_of({"app": "x"}) is None and rank_of({t: "worker", i: "x"}) is None


def _pod(labels: dict[str, str], owner: str = "u1") -> Any:
    return SimpleNamespace(metadata=SimpleNamespace(namespace="ns", labels=labels,
                                                    owner_references=[SimpleNamespace(uid=owner)]))


def test_a_recreated_job_and_a_restarted_jobset_are_new_incarnations() -> None:
    job = {"training.kubeflow.org/job-name": "j"}
    assert incarnation(_pod(job, "u1")) != incarnation(_pod(job, "u2"))
    js = {"jobset.sigs.k8s.io/jobset-name": "s", "jobset.sigs.k8s.io/restart-attempt": "0"}
    assert incarnation(_pod(js, "job-a")) == incarnation(_pod(js, "job-b")) == ("ns", "s", "0")  # one gang
    assert incarnation(_pod({**js, "jobset.sigs.k8s.io/restart-attempt": "1"})) == ("ns", "s", "1")


def test_steps_count_from_the_start_and_the_resume_step_and_stop_at_a_stall() -> None:
    assert step_at(10.0, started=0.0, resume=0, step_s=2.0) == 5
    assert step_at(10.0, started=0.0, resume=60, step_s=2.0) == 65
    assert step_at(100.0, started=0.0, resume=0, step_s=2.0, stopped_at=9.0) == 4  # hung: never more
    # a peer of a lost rank that re-rendezvoused trains again from resumes_at
    assert step_at(30.0, started=0.0, resume=0, step_s=2.0, stopped_at=10.0, resumes_at=20.0) == 10
    assert step_at(15.0, started=0.0, resume=0, step_s=2.0, stopped_at=10.0, resumes_at=20.0) == 5
    # compressed times: a hang at 240 s of 2 s steps (world time / 120), its peers one step later
    t0, gs = 1_700_000_000.25, 2.0 / 120
    hung_at = t0 + 240.0 / 120
    assert step_at(hung_at + 5, started=t0, resume=0, step_s=gs, stopped_at=hung_at) == 120
    assert step_at(hung_at + 5, started=t0, resume=0, step_s=gs, stopped_at=hung_at + gs) == 121


def test_training_key_parses_and_names_bad_fields() -> None:
    assert parse_training(None) is None
    assert parse_training({"step_s": 2, "hang": {"rank": 1, "after_s": 60}, "slow": {"rank": 2, "factor": 1.5}}) == \
        TrainingSpec(2.0, RankFault(1, after_s=60.0), RankFault(2, factor=1.5))
    sc = from_dict(scenario(training={"hang": {"rank": 0}}))
    assert sc.training is not None and sc.training.hang == RankFault(0)
    assert from_dict(scenario()).training is None  # no key: the world writes no progress
    assert parse_training({"checkpoint_every": 50}) == TrainingSpec(checkpoint_every=50)
    for bad, f in [({"hang": {"rank": -1}}, "training.hang.rank"), ({"slow": {"rank": 1, "factor": 0.5}},
                   "training.slow.factor"), ({"step_s": 0}, "training.step_s"), ({"hang": {"rank": 1, "at": 3}},
                   "training.hang.at"), ({"jitter": 1}, "training.jitter"),
                  ({"checkpoint_every": 2.5}, "training.checkpoint_every"),
                  ({"checkpoint_every": -1}, "training.checkpoint_every")]:
        with pytest.raises(InvalidSpec) as err:
            parse_training(bad)
        assert err.value.field == f, (bad, err.value)


def _rank_pod(rank: int, uri: str) -> Any:
    labels = {"training.kubeflow.org/job-name": "j", "training.kubeflow.org/replica-type": "master" if rank == 0
              else "worker", "training.kubeflow.org/replica-index": str(max(0, rank - 1))}
    env = [SimpleNamespace(name="KFP_GPU_CHECKPOINT_URI", value=uri)]
    return SimpleNamespace(
        metadata=SimpleNamespace(namespace="ns", name=f"j-{rank}", uid=f"u{rank}", labels=labels, deletion_timestamp=None,
                                 annotations={STEP_ANNOTATION: "2"}, owner_references=[SimpleNamespace(uid="job1")]),
        spec=SimpleNamespace(node_name=f"n{rank}", containers=[SimpleNamespace(env=env)]),
        status=SimpleNamespace(phase="Running"))


def test_the_world_gang_saves_its_checkpoint_before_any_rank_reports_a_step_past_it(tmp_path: Path) -> None:
    """training.checkpoint_every: a tick that finds the gang past a multiple (here a late tick: from step 0 to step
    130 at once) saves the newest multiple (100) before it writes progress at 130, so a reader never sees progress
    beyond a checkpoint that is not there yet; nothing is saved twice or below the resume step."""
    uri = str(tmp_path / "ckpt")
    pw = ProgressWorld(client.ApiClient(), TrainingSpec(step_s=2.0, checkpoint_every=50))
    pw.pods = [_rank_pod(r, uri) for r in (0, 1)]
    t0 = 1_700_000_000.0
    pw.first_seen = {"u0": t0, "u1": t0}
    store = CheckpointStore(uri)
    pw.write(t0 + 130 * 2.0 / 120)
    latest = store.latest()
    assert latest is not None and latest.step == 100
    assert {r: rec.step for r, rec in rank_progress.read(open_backend(uri)).items()} == {0: 130, 1: 130}
    pw.write(t0 + 140 * 2.0 / 120)  # no new multiple: nothing saved
    pw.write(t0 + 150 * 2.0 / 120)
    assert [c.step for c in store.list()] == [100, 150]


def test_no_rank_steps_while_a_peer_is_not_bound_to_a_node_yet(tmp_path: Path) -> None:
    """The rendezvous holds every rank until the last one runs: a rank the scheduler has not bound yet (no node)
    is still a member of the gang, so its bound peers report nothing; another world's nodes' pods are not ours."""
    uri = str(tmp_path / "ckpt")
    pods = [_rank_pod(r, uri) for r in range(4)]
    for p in pods[2:]:
        p.spec.node_name, p.status.phase = None, "Pending"
    other = _rank_pod(0, uri)
    other.spec.node_name = "elsewhere"
    assert ours([*pods, other], {"n0", "n1"}) == pods
    pw = ProgressWorld(client.ApiClient(), TrainingSpec(step_s=2.0))
    pw.pods, pw.first_seen = ours(pods, {"n0", "n1"}), {"u0": 1_700_000_000.0, "u1": 1_700_000_000.0}
    pw.write(1_700_000_000.0 + 10.0)
    assert rank_progress.read(open_backend(uri)) == {}


class _Recorder(rank_progress.Progress):
    """The trainers' reporter, recording each step offered to it (schedule: no trailing timer in this test)."""

    def __init__(self, uri: str, rank: int) -> None:
        super().__init__(open_backend(uri), rank, min_interval_s=1e9, schedule=lambda delay, fn: lambda: None)
        self.offered: list[int] = []

    def report(self, step: int, step_time_s: float | None, *, now: float | None = None, force: bool = False) -> bool:
        self.offered.append(step)
        return super().report(step, step_time_s, now=now, force=force)


def test_a_rank_reports_each_step_once_as_a_trainer_does(tmp_path: Path) -> None:
    """A trainer calls ``step(n)`` once per step; a step the throttle holds back reaches the store only by the
    reporter's trailing write. The world offered a held-back step again on every tick until one got through (kinder
    than a trainer: a rank that hung right after it still wrote it)."""
    uri = str(tmp_path / "ckpt")
    pw = ProgressWorld(client.ApiClient(), TrainingSpec(step_s=2.0))
    pw.pods = [_rank_pod(0, uri)]
    t0 = 1_700_000_000.0
    pw.first_seen = {"u0": t0}
    rec = _Recorder(uri, 0)
    pw.reporters["u0"] = rec
    one = 2.0 / 120  # one step, compressed
    for ticks in ((1.2, 1.5), (2.1, 2.4, 2.7, 2.9), (3.3,)):
        for k in ticks:
            pw.write(t0 + k * one)
    assert rec.offered == [1, 2, 3]
    assert rank_progress.read(open_backend(uri))[0].step == 1  # 2 and 3 held back (no timer here), never re-offered
