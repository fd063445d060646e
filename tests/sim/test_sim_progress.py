"""The rehearsal trainer's rules (kfp_gpu_rehearsal.sim.progress, docs/sim.md "Training ranks"): pure functions, virtual time,
and the ``training`` scenario key's validation."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.sim import from_dict
from kfp_gpu_rehearsal.sim.progress import incarnation, rank_of, step_at
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


def test_training_key_parses_and_names_bad_fields() -> None:
    assert parse_training(None) is None
    assert parse_training({"step_s": 2, "hang": {"rank": 1, "after_s": 60}, "slow": {"rank": 2, "factor": 1.5}}) == \
        TrainingSpec(2.0, RankFault(1, after_s=60.0), RankFault(2, factor=1.5))
    sc = from_dict(scenario(training={"hang": {"rank": 0}}))
    assert sc.training is not None and sc.training.hang == RankFault(0)
    assert from_dict(scenario()).training is None  # no key: the world writes no progress
    for bad, f in [({"hang": {"rank": -1}}, "training.hang.rank"), ({"slow": {"rank": 1, "factor": 0.5}},
                   "training.slow.factor"), ({"step_s": 0}, "training.step_s"), ({"hang": {"rank": 1, "at": 3}},
                   "training.hang.at"), ({"jitter": 1}, "training.jitter")]:
        with pytest.raises(InvalidSpec) as err:
            parse_training(bad)
        assert err.value.field == f, (bad, err.value)
