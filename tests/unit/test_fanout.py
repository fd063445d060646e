"""kfp_gpu.fanout: order, errors, thread reuse, and no deadlock when nested fan-outs fill the pool."""

from __future__ import annotations

import threading
import time

import pytest

from kfp_gpu import fanout


def test_results_come_back_in_order_and_run_concurrently() -> None:
    def slow(i: int) -> int:
        time.sleep(0.2)
        return i

    t0 = time.monotonic()
    out = fanout.run_all([lambda i=i: slow(i) for i in range(8)])
    took = time.monotonic() - t0
    assert out == list(range(8))
    assert took < 0.6, f"8 x 0.2 s tasks took {took:.2f}s: not concurrent"


def test_the_first_error_in_order_is_raised_after_every_task_finished() -> None:
    done: list[int] = []

    def task(i: int) -> int:
        time.sleep(0.05 * (3 - i))
        done.append(i)
        if i in (1, 2):
            raise ValueError(f"task {i}")
        return i

    with pytest.raises(ValueError, match="task 1"):
        fanout.run_all([lambda i=i: task(i) for i in range(3)])
    assert sorted(done) == [0, 1, 2]


def test_threads_are_reused_across_fan_outs() -> None:
    fanout.run_all([lambda: time.sleep(0.05) for _ in range(6)])
    before = {t.ident for t in threading.enumerate() if t.name.startswith("kfp-gpu-fanout")}
    names: set[int | None] = set()
    for _ in range(5):
        names |= set(fanout.run_all([lambda: (time.sleep(0.05), threading.get_ident())[1] for _ in range(6)]))
    after = {t.ident for t in threading.enumerate() if t.name.startswith("kfp-gpu-fanout")}
    assert after == before, "a fan-out of 6 after one of 6 started new threads"
    assert names - {threading.get_ident()} <= before


def test_nested_fan_outs_beyond_the_pool_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = fanout._Pool(2)  # two threads for 4 x 4 nested tasks: the callers run what is still queued
    monkeypatch.setattr(fanout, "_pool", pool)

    def inner(i: int) -> list[int]:
        return fanout.run_all([lambda j=j: (time.sleep(0.01), i * 10 + j)[1] for j in range(4)])

    result: list[list[int]] = []
    t = threading.Thread(target=lambda: result.extend(fanout.run_all([lambda i=i: inner(i) for i in range(4)])))
    t.start()
    t.join(10)
    assert not t.is_alive(), "nested fan-outs deadlocked on a full pool"
    assert result == [[i * 10 + j for j in range(4)] for i in range(4)]


def test_a_task_waited_on_is_run_once_and_its_error_kept() -> None:
    calls: list[int] = []

    def boom() -> int:
        calls.append(1)
        raise KeyError("x")

    task = fanout.spawn(boom)
    for _ in range(2):
        with pytest.raises(KeyError):
            task.result()
    assert calls == [1]
