"""Multi-rank commits (kfp_gpu.checkpoint.sharded) and the collective emergency save (on_preemption agree=).

No torch and no processes: ranks are RankedSave objects on one store; time is virtual (clock/sleep injected).
The 2-process proofs with real signals are in tests/trainer/test_sharded_resume.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
from pathlib import Path

import pytest

from kfp_gpu.checkpoint import MARKER, CheckpointStore, on_preemption
from kfp_gpu.checkpoint.layout import attempt_name
from kfp_gpu.checkpoint.sharded import RankedSave, RanksIncomplete, done_name


class VirtualTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _ranks(store: CheckpointStore, step: int, world: int = 2) -> list[RankedSave]:
    attempt = attempt_name(step)
    return [RankedSave(store, step, attempt, rank=r, world=world) for r in range(world)]


def test_commit_after_every_rank_lists_all_files(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    r0, r1 = _ranks(store, 20)
    r0.writer.put("__0_0.distcp", b"zero")
    r1.writer.put("__1_0.distcp", b"one")
    r1.writer.put("rank-1/extra.pt", b"rng1")
    store.backend.put(f"{r0.attempt}/.metadata", b"dcp")  # DCP's file: written by DCP, recorded by rank 0
    r0.record(".metadata", hashlib.sha256(b"dcp").hexdigest(), 3)
    r1.finish_rank()
    r0.finish_rank()
    ckpt = r0.commit({"run": "x"}, require=(".metadata",))
    assert ckpt.name == "step-000000020" and ckpt.meta["ranks"] == 2
    assert set(ckpt.files) == {"__0_0.distcp", "__1_0.distcp", "rank-1/extra.pt", ".metadata",
                               "rank-0.done", "rank-1.done"}
    marker = json.loads((tmp_path / ckpt.name / MARKER).read_text())
    assert marker["ranks"] == 2
    found = store.load_latest()  # every sha256 in the marker verifies
    assert found is not None and found[1]["__1_0.distcp"] == b"one"


def test_missing_rank_leaves_the_attempt_uncommitted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(str(tmp_path))
    store.save(10, {"model.pt": b"old"})
    r0, r1 = _ranks(store, 20)
    r0.writer.put("__0_0.distcp", b"zero")
    r1.writer.put("__1_0.distcp", b"one")  # rank 1 wrote its shard, then died before its manifest
    r0.finish_rank()
    vt = VirtualTime()
    with pytest.raises(RanksIncomplete, match="rank-1.done") as err:
        r0.commit(timeout_s=5, clock=vt.clock, sleep=vt.sleep)
    assert 5 <= vt.now < 5.2 and err.value.transient
    assert not (tmp_path / r0.attempt / MARKER).exists()
    with caplog.at_level(logging.WARNING, logger="kfp_gpu.checkpoint"):
        latest = store.latest()
    assert latest is not None and latest.step == 10
    assert r0.attempt in caplog.text and "1 rank(s) finished their part" in caplog.text


def test_manifest_naming_a_file_that_never_landed_is_not_committed(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    r0, r1 = _ranks(store, 3)
    r1.writer.put("__1_0.distcp", b"one")
    r1.finish_rank()
    store.backend.delete(f"{r1.attempt}/__1_0.distcp")  # the barrier said "done"; the store says otherwise
    r0.finish_rank()
    vt = VirtualTime()
    with pytest.raises(RanksIncomplete, match=r"__1_0.distcp \(rank 1\)"):
        r0.commit(timeout_s=1, clock=vt.clock, sleep=vt.sleep)
    assert store.latest() is None


def test_required_dcp_metadata_missing_is_not_committed(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    r0, r1 = _ranks(store, 3)
    r0.finish_rank()
    r1.finish_rank()
    vt = VirtualTime()
    with pytest.raises(RanksIncomplete, match=r"\.metadata"):
        r0.commit(timeout_s=1, require=(".metadata",), clock=vt.clock, sleep=vt.sleep)


def test_late_rank_is_waited_for_within_the_timeout(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    r0, r1 = _ranks(store, 4)
    r0.finish_rank()
    vt = VirtualTime()

    def sleep(s: float) -> None:
        vt.sleep(s)
        if vt.now >= 0.5 and not r1.files():
            r1.writer.put("__1_0.distcp", b"late")
            r1.finish_rank()

    ckpt = r0.commit(timeout_s=2, poll_s=0.1, clock=vt.clock, sleep=sleep)
    assert ckpt.step == 4 and "__1_0.distcp" in ckpt.files and 0.5 <= vt.now < 1.0


def test_manifest_from_another_attempt_is_inconsistent(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    r0, _ = _ranks(store, 5)
    stray = RankedSave(store, 6, r0.attempt, rank=1, world=2)  # a rank that thinks it saves step 6
    stray.finish_rank()
    r0.finish_rank()
    with pytest.raises(RanksIncomplete, match="rank-1.done names step 6"):
        r0.commit(timeout_s=0)


def test_only_rank_zero_commits_and_ranks_are_checked(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    _, r1 = _ranks(store, 1)
    with pytest.raises(ValueError, match="only rank 0"):
        r1.commit()
    with pytest.raises(ValueError, match="rank=2 world=2"):
        RankedSave(store, 1, attempt_name(1), rank=2, world=2)
    assert done_name(3) == "rank-3.done"


# ---- collective emergency save ---------------------------------------------------------------------


def test_agree_runs_the_save_on_a_rank_that_got_no_signal() -> None:
    saved: list[int] = []
    votes: list[bool] = []

    def agree(flag: bool) -> bool:  # the peer got SIGTERM at step 2
        votes.append(flag)
        return len(votes) >= 2

    guard = on_preemption(lambda: saved.append(len(votes)), 30, exit_code=None, agree=agree)
    try:
        for _ in range(4):
            with guard.critical():
                if guard.saved:
                    break
        assert votes == [False, False] and saved == [2] and guard.requested
        assert 0 < guard.remaining_s() <= 28
    finally:
        guard.uninstall()


def test_agree_with_a_local_signal_saves_after_the_block_not_before() -> None:
    order: list[str] = []
    guard = on_preemption(lambda: order.append("save"), 30, exit_code=None, agree=lambda flag: flag)
    try:
        with guard.critical():
            os.kill(os.getpid(), signal.SIGTERM)
            order.append("step")
        assert order == ["step", "save"]
    finally:
        guard.uninstall()


def test_agree_failure_saves_alone_when_signalled_and_raises_otherwise() -> None:
    def broken(flag: bool) -> bool:
        raise RuntimeError("Connection closed by peer")

    saved: list[bool] = []
    guard = on_preemption(lambda: saved.append(True), 30, exit_code=None, agree=broken)
    try:
        with pytest.raises(RuntimeError, match="closed by peer"), guard.critical():
            pass
        assert saved == []
        with guard.critical():
            os.kill(os.getpid(), signal.SIGTERM)
        assert saved == [True]
    finally:
        guard.uninstall()
