"""Training progress, per rank, written beside the checkpoints: the stall and straggler signal.

The trainer already has write rights on its checkpoint store (a path, ``gs://``, ``s3://``), so progress needs no
extra cluster rights: each rank overwrites one small JSON object, ``_progress/rank-00007.json``, newest wins. A
supervisor lists the ``_progress/`` prefix (one listing and one small read per rank at any gang size) and hands
the observations to :func:`kfp_gpu.plan.stall.assess`::

    from kfp_gpu.checkpoint.progress import Progress

    progress = Progress.from_env()            # KFP_GPU_CHECKPOINT_URI, RANK; a no-op when no URI is set
    for step in range(start, steps):
        ...train one step...
        progress.step(step)                    # step time measured between calls

Writes are throttled (``min_interval_s``, default :data:`DEFAULT_INTERVAL_S`; env ``KFP_GPU_PROGRESS_INTERVAL_S``)
so a fast loop does not turn into a PUT per step. The throttle has a trailing edge: a step held back is written by a
timer once the interval has passed (with the time it was done), so the newest finished step always reaches the store
even when no further step comes (a rank hung in a collective still writes the step it finished; its timer thread runs
while the main thread blocks). ``flush()`` writes a held-back step at once (the callbacks call it when training
ends). A failed write is logged and never stops training. Framework
callbacks (Hugging Face Trainer, Lightning) are in :mod:`kfp_gpu.checkpoint.callbacks`.

Stdlib only (plus the store's SDK, imported by :func:`kfp_gpu.checkpoint.backends.open_backend` when used).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from kfp_gpu.checkpoint.backends import Backend, BlobNotFound, open_backend
from kfp_gpu.checkpoint.env import CHECKPOINT_URI_ENV

log = logging.getLogger(__name__)

PREFIX = "_progress/"
INTERVAL_ENV = "KFP_GPU_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 5.0  # real seconds between two writes of one rank (the first step is always written)
_EWMA = 0.3  # weight of the newest step in the reported step time


Cancel = Callable[[], None]
Schedule = Callable[[float, Callable[[], None]], Cancel]
"""``schedule(delay_s, fn)`` runs ``fn`` once, ``delay_s`` seconds from now, and returns a function that cancels it."""


def timer(delay_s: float, fn: Callable[[], None]) -> Cancel:
    """The default :data:`Schedule`: a daemon ``threading.Timer`` (it never keeps a finished trainer alive)."""
    t = threading.Timer(max(0.0, delay_s), fn)
    t.daemon = True
    t.start()
    return t.cancel


def key_for(rank: int) -> str:
    """The object one rank overwrites: ``_progress/rank-00007.json``."""
    return f"{PREFIX}rank-{rank:05d}.json"


@dataclass(frozen=True)
class Record:
    """One rank's newest progress: its step, its recent step time (seconds, a moving average), when it was written
    (the writer's clock, Unix seconds; the rehearsal world writes world time), and where it runs."""

    rank: int
    step: int
    step_time_s: float | None
    at: float
    node: str = ""
    pod: str = ""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Record | None:
        """None for an object that is not a progress record (logged at debug)."""
        try:
            d = json.loads(raw)
            st = d.get("step_time_s")
            return cls(int(d["rank"]), int(d["step"]), None if st is None else float(st), float(d["at"]),
                       str(d.get("node", "")), str(d.get("pod", "")))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.debug("not a progress record (%s): %r", exc, raw[:200])
            return None


def write(backend: Backend, record: Record) -> None:
    """Overwrite ``record.rank``'s progress object. The one writer: trainers (:class:`Progress`) and the rehearsal
    world's simulated ranks both call it. Raises: what the backend's ``put`` raises."""
    backend.put(key_for(record.rank), record.to_json())


def read(backend: Backend) -> dict[int, Record]:
    """Every rank's newest record under ``_progress/`` (a rank whose object vanished between the listing and the
    read is skipped). Raises: what the backend's ``list`` / ``get`` raise, except BlobNotFound."""
    out: dict[int, Record] = {}
    for key in backend.list(PREFIX):
        if not key.startswith(PREFIX) or not key.endswith(".json"):
            continue
        try:
            rec = Record.from_json(backend.get(key))
        except BlobNotFound:
            continue
        if rec is not None:
            out[rec.rank] = rec
    return out


def clear(backend: Backend) -> None:
    """Delete every progress object (a supervisor does this before it starts a new attempt, so the old attempt's
    records are not read as the new one's)."""
    backend.delete_prefix(PREFIX)


def interval_from_env(environ: Mapping[str, str] | None = None) -> float:
    """``KFP_GPU_PROGRESS_INTERVAL_S`` or the default; a bad value is logged and ignored (progress is advisory)."""
    raw = ((os.environ if environ is None else environ).get(INTERVAL_ENV) or "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
        if value >= 0:
            return value
    except ValueError:
        pass
    log.warning("%s=%r is not a non-negative number of seconds; using %g", INTERVAL_ENV, raw, DEFAULT_INTERVAL_S)
    return DEFAULT_INTERVAL_S


class Progress:
    """A rank's progress reporter. ``step(n)`` after each optimizer step; ``report(n, step_time_s)`` when the
    caller measures step time itself. ``backend=None`` makes every call a no-op (no checkpoint store configured).

    ``clock`` and ``schedule`` (the trailing write's timer, :data:`Schedule`) are injectable (tests, the rehearsal
    world); both in seconds. Thread-safe: the trailing write runs on the timer's thread.
    """

    def __init__(self, backend: Backend | None, rank: int = 0, *, min_interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.time, node: str = "", pod: str = "",
                 schedule: Schedule = timer) -> None:
        self.backend, self.rank, self.min_interval_s, self.clock = backend, rank, min_interval_s, clock
        self.node, self.pod, self.schedule = node, pod, schedule
        self._last_step_at: float | None = None
        self._step_time: float | None = None
        self._written_at: float | None = None
        self._pending: Record | None = None  # the newest step held back by the throttle
        self._cancel: Cancel | None = None  # the trailing write's timer, while one is set
        self._lock = threading.RLock()
        self.last: Record | None = None

    @classmethod
    def from_env(cls, uri: str | None = None, rank: int | None = None,
                 environ: Mapping[str, str] | None = None) -> Progress:
        """A reporter for this process: ``uri`` (default ``$KFP_GPU_CHECKPOINT_URI``), ``rank`` (default ``$RANK``),
        the node from ``$NODE_NAME`` (set it from the downward API) and the pod from ``$HOSTNAME``.
        Raises: StorageUnavailable / StorageError when the store cannot be opened (as the checkpoint store would)."""
        env = os.environ if environ is None else environ
        uri = uri or (env.get(CHECKPOINT_URI_ENV) or "").strip() or None
        if rank is None:
            try:
                rank = int(env.get("RANK", "0") or 0)
            except ValueError:
                rank = 0
        return cls(open_backend(uri) if uri else None, rank, min_interval_s=interval_from_env(env),
                   node=env.get("NODE_NAME", ""), pod=env.get("HOSTNAME", "") or socket.gethostname())

    def step(self, step: int) -> None:
        """Step ``step`` just finished: measure its time since the previous call, and report."""
        now = self.clock()
        if self._last_step_at is not None:
            dt = max(0.0, now - self._last_step_at)
            self._step_time = dt if self._step_time is None else (1 - _EWMA) * self._step_time + _EWMA * dt
        self._last_step_at = now
        self.report(step, self._step_time, now=now)

    def report(self, step: int, step_time_s: float | None, *, now: float | None = None, force: bool = False) -> bool:
        """Write ``step`` and ``step_time_s`` unless the last write was less than ``min_interval_s`` ago (``force``
        writes anyway); a step held back is written by the trailing timer when the interval has passed, unless a
        newer one replaces it first. True when written now. A failed write is logged and returns False: progress
        never stops training."""
        now = self.clock() if now is None else now
        rec = Record(self.rank, int(step), None if step_time_s is None else round(float(step_time_s), 6), now,
                     self.node, self.pod)
        self.last = rec
        if self.backend is None:
            return False
        with self._lock:
            if not force and self._written_at is not None and now - self._written_at < self.min_interval_s:
                self._pending = rec
                if self._cancel is None:
                    self._cancel = self.schedule(self._written_at + self.min_interval_s - now, self._trailing)
                return False
            self._drop_pending()
            return self._write(rec, now)

    def flush(self) -> bool:
        """Write the step held back by the throttle now (training ended, or is about to block). True when one was
        written; False when none was held back or the write failed."""
        with self._lock:
            rec = self._pending
            self._drop_pending()
            return rec is not None and self._write(rec, max(self.clock(), rec.at))

    def _trailing(self) -> None:
        with self._lock:
            self._cancel = None  # fired: nothing left to cancel
            self.flush()

    def _drop_pending(self) -> None:
        self._pending = None
        if self._cancel is not None:
            self._cancel()
            self._cancel = None

    def _write(self, rec: Record, now: float) -> bool:
        if self.backend is None:
            return False
        try:
            write(self.backend, rec)
        except Exception as exc:  # noqa: BLE001 - advisory signal; the checkpoint path reports storage errors
            log.warning("progress of rank %d not written to %s: %s", self.rank, self.backend.uri, exc)
            return False
        self._written_at = now
        return True
