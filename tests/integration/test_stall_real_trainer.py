"""A SIGSTOP of one rank of the real trainer (pipelines/trainer/train_lm.py, 2 ranks on gloo, local processes) is
detected by the stall detector from the ranks' progress objects beside the checkpoints, and the run resumes from the
newest checkpoint.

The stopped rank's gloo peer blocks in the next all-reduce (gloo's own timeout is 30 minutes): nothing fails, no
process exits. The supervisor here is what the train step does with its pods: it polls
:class:`kfp_gpu.steps.stall_watch.StallWatch`, and on a stall kills both ranks and starts them again, and they resume
from the newest complete checkpoint.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kfp_gpu.checkpoint import CheckpointStore  # noqa: E402
from kfp_gpu.checkpoint import progress as rank_progress  # noqa: E402
from kfp_gpu.checkpoint.backends import open_backend  # noqa: E402
from kfp_gpu.plan.stall import StallPolicy, State  # noqa: E402
from kfp_gpu.steps.stall_watch import StallWatch  # noqa: E402
from tests.trainer.test_sharded_resume import EVERY, STEPS, Job  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# auto timeout: max(floor, 10 x median step time). The floor is above a sharded save under CPU contention (a save
# pauses progress), so a checkpoint is never mistaken for a stall.
POLICY = StallPolicy(floor_s=6.0, startup_s=60.0)
ENV = {rank_progress.INTERVAL_ENV: "0"}  # every step is written (the default throttles to one write per 5 s)


def test_sigstop_of_one_rank_is_a_stall_detected_from_progress_and_the_run_resumes(tmp_path: Path) -> None:
    uri = str(tmp_path / "ckpt")
    watch = StallWatch(uri, 2, POLICY, backend=open_backend(uri))
    watch.begin()
    job = Job(tmp_path / "run1", uri, env=ENV, step_sleep=0.1)
    try:
        job.wait_for(1, lambda e: e["event"] == "step" and e["step"] >= 2 * EVERY + 2)
        assert watch.poll().state is State.HEALTHY
        recs = rank_progress.read(watch.backend)
        assert sorted(recs) == [0, 1] and all(r.step >= 2 * EVERY for r in recs.values())  # the real trainer reports
        os.kill(job.procs[1].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        while True:
            a = watch.poll()
            if a.state is State.STALLED:
                break
            assert time.monotonic() - stopped < 60, f"no stall detected in 60 s: {a}\n{job.logs()}"
            assert all(p.poll() is None for p in job.procs), f"a rank exited: {job.logs()}"
            time.sleep(0.1)
        detected = time.monotonic() - stopped
        assert all(p.poll() is None for p in job.procs), "the peer must still hang in the collective, not exit"
        assert 1 in a.first_stopped and a.timeout_s >= POLICY.floor_s
        assert POLICY.floor_s * 0.9 <= detected < a.timeout_s + 10, detected
        last = max(job.steps(1))
        ck = CheckpointStore(uri).latest()
        assert ck is not None and ck.step % EVERY == 0 and ck.step <= last
    finally:
        job.kill()  # SIGKILL reaches a stopped process too

    watch.begin()  # the supervisor restarts the gang from the newest checkpoint
    resumed = Job(tmp_path / "run2", uri, env=ENV)
    try:
        assert [p.wait(timeout=180) for p in resumed.procs] == [0, 0], resumed.logs()
    finally:
        resumed.kill()
    for rank in (0, 1):
        (ev,) = [e for e in resumed.events(rank) if e["event"] == "resume"]
        assert ev["step"] == ck.step
        assert resumed.steps(rank) == list(range(ck.step + 1, STEPS + 1))
    assert rank_progress.read(watch.backend)[0].step == STEPS
    print(f"stall detected {detected:.1f} s after SIGSTOP (timeout {a.timeout_s:.1f} s, median step "
          f"{a.median_step_s}); steps lost {last - ck.step}")
