"""The one fan-out for concurrent reads: a process-wide pool of reused threads, caller-runs when it is busy.

A fresh ``ThreadPoolExecutor`` per fan-out starts a thread per task, and ``Thread.start`` waits until the new
thread holds the GIL: on a busy 2-core pod that is milliseconds per request before it is even sent (measured:
a preflight over 6 regions issued its 10th read ~35 ms after its 1st). Here threads are started once and reused.

Semantics (what callers may rely on):

* :func:`run_all` returns the results in the order of ``fns``; the first exception a task raised is raised
  from it (after every task has finished), like ``list(executor.map(...))``.
* :func:`spawn` starts one task and returns a :class:`Task`; ``Task.result()`` (any thread, any number of
  times) returns its value or raises its exception, running it in the waiting thread if it is still queued.
* :func:`run_all`'s calling thread runs the first task itself, and any task no pool thread has picked up by the time the
  caller comes to wait for it (``Future.cancel`` succeeds only on a queued task). So a nested fan-out never
  waits on queued work and cannot deadlock however full the pool is; at worst it runs serially.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")

MAX_THREADS = 64


class _Pool:
    """Threads started on demand and kept. Unlike ``ThreadPoolExecutor`` (whose idle count grows by one per
    finished task, so it stops adding threads while its threads are busy and queues reads behind 100 ms calls),
    a task is handed to a thread known to be idle, or to a new one, up to ``MAX_THREADS``; only then it queues."""

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max_threads
        self._q: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        number = 0  # of the thread to start, if one is
        with self._lock:
            self._q.put((fut, fn))
            if self._idle:
                self._idle -= 1
            elif self._threads < self.max_threads:
                self._threads += 1
                number = self._threads
        if number:
            threading.Thread(target=self._work, name=f"kfp-gpu-fanout-{number}", daemon=True).start()
        return fut

    def _work(self) -> None:
        while True:
            fut, fn = self._q.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                    fut.set_exception(exc)
            del fut, fn
            with self._lock:
                self._idle += 1


_pool = _Pool(MAX_THREADS)


def run_all(fns: Sequence[Callable[[], T]]) -> list[T]:
    """Run ``fns`` concurrently and return their results in order.

    Raises: the first exception (in ``fns`` order) any of them raised, once all have finished.
    """
    if len(fns) <= 1:
        return [fn() for fn in fns]
    tasks = [Task(fn) for fn in fns[1:]]
    outcomes = [_outcome(fns[0]), *(_outcome(t.result) for t in tasks)]  # the caller runs the first
    for _, exc in outcomes:
        if exc is not None:
            raise exc
    return [cast(T, value) for value, _ in outcomes]  # no exception: every outcome is a value


def _outcome(fn: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    try:
        return fn(), None
    except BaseException as exc:  # noqa: BLE001 - re-raised by run_all, after the others finished
        return None, exc


class Task(Generic[T]):
    """One task on the shared pool (see :func:`spawn`)."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._inline: Future[T] | None = None
        self._fut: Future[T] = _pool.submit(fn)

    def result(self) -> T:
        """The task's value, run here if no pool thread has started it.

        Raises: whatever the task raised.
        """
        with self._lock:
            if self._inline is None and self._fut.cancel():
                self._inline = Future()
                try:
                    self._inline.set_result(self._fn())
                except BaseException as exc:  # noqa: BLE001 - kept for every caller of result()
                    self._inline.set_exception(exc)
        return (self._inline or self._fut).result()


def spawn(fn: Callable[[], T]) -> Task[T]:
    """Start ``fn`` on the shared pool."""
    return Task(fn)
