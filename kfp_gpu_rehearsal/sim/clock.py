"""The stand-in's one time-compression factor, and the timeline its world runs on.

Scenario durations are written in **real-world seconds** (a GPU VM boots in ~4 minutes, so
``median_s: 240``). The stand-in, and every consumer that reasons about its timing (tests, demo,
bench), divides them by the one factor (:func:`scale`, :data:`kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE`): one real-world minute lasts 0.5 s here.

:class:`Timeline` runs the world's timed events (a VM finishing its boot, an operation turning DONE,
a preemption notice running out). On the wall clock a daemon thread fires them when due; with
``virtual=True`` nothing moves until :meth:`Timeline.advance` is called, so tests of the world's logic
need no sleeps.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from kfp_gpu_rehearsal.devcluster.worldtime import compress as compress
from kfp_gpu_rehearsal.devcluster.worldtime import expand as expand
from kfp_gpu_rehearsal.devcluster.worldtime import scale as scale

log = logging.getLogger(__name__)



class Timeline:
    """Timed callbacks in stand-in seconds since the timeline began.

    Callbacks run one at a time, in time order (ties in scheduling order): on a daemon thread for the
    wall clock, or in the caller of :meth:`advance` for virtual time. A failing callback is logged
    and does not stop the timeline. ``changed`` is notified after every callback.
    """

    def __init__(self, *, virtual: bool = False) -> None:
        self.virtual = virtual
        self._t0 = time.monotonic()
        self._now = 0.0  # virtual time
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self.changed = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        if not virtual:
            self._thread = threading.Thread(target=self._loop, name="sim-timeline", daemon=True)
            self._thread.start()

    def now(self) -> float:
        if self.virtual:
            return self._now
        return time.monotonic() - self._t0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at timeline time ``t`` (at once if ``t`` is past)."""
        with self._cv:
            heapq.heappush(self._heap, (t, next(self._seq), fn))
            self._cv.notify()

    def after(self, dt: float, fn: Callable[[], None]) -> None:
        self.at(self.now() + max(0.0, dt), fn)

    def advance(self, dt: float) -> None:
        """Virtual time only: move ``dt`` seconds forward, running every callback that falls due.

        Raises: RuntimeError on a wall-clock timeline.
        """
        if not self.virtual:
            raise RuntimeError("advance() needs a virtual timeline")
        end = self._now + dt
        while True:
            with self._cv:
                if not self._heap or self._heap[0][0] > end:
                    break
                t, _, fn = heapq.heappop(self._heap)
                self._now = max(self._now, t)
            self._run(fn)
        self._now = end

    def pending(self) -> int:
        with self._cv:
            return len(self._heap)

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._heap.clear()
            self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                if self._stopped:
                    return
                if not self._heap:
                    self._cv.wait()
                    continue
                wait = self._heap[0][0] - self.now()
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                _, _, fn = heapq.heappop(self._heap)
            self._run(fn)

    def _run(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - one failing event must not stop the world
            log.exception("sim: timed event failed")
        with self.changed:
            self.changed.notify_all()
