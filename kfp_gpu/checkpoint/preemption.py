"""Emergency checkpoint on preemption: SIGTERM -> save within the grace period -> exit 143.

Kubernetes sends SIGTERM when a spot/preemptible node is reclaimed, then SIGKILL when the grace period
ends: 15 s for a (non-system) pod on a GKE Spot/preemptible node (the kubelet's graceful node shutdown splits the
VM's 30 s notice into 15 s for ordinary pods, then 15 s for system-critical ones), 30 s for a process on a bare GCE
Spot VM, up to 2 minutes on AWS spot (the interruption notice; the node is drained, so the pod's own
``terminationGracePeriodSeconds`` applies, capped by the notice). The
handler installed by :func:`on_preemption` runs the save callback and exits with 143 (128 + SIGTERM),
which the launcher reads as "preempted", not "failed".

Saving from inside a half-finished optimizer step would checkpoint a torn state, so a training loop wraps
each step in ``guard.critical()``. Once a program has entered ``critical()``, the signal handler never
saves by itself: a SIGTERM inside a block is deferred to the block's end, one between blocks to the entry
of the next block (before the next step starts). A program that never uses ``critical()`` gets the save
run straight from the signal handler, interrupting whatever the main thread was doing; that is only safe
when the callback shares no state with it (not even a buffered stream: Python raises "reentrant call"
if the interrupted code was inside ``print`` on the same stream). A watchdog ends the process with 143
shortly before the grace period runs out, so a save that hangs, or a loop that never reaches its next
block, never turns into a SIGKILL in the middle of some other work
(a torn save is harmless anyway: without its commit marker it is never used).

Multi-rank jobs pass ``agree`` (e.g. :func:`kfp_gpu.checkpoint.dcp_io.any_rank`): the ranks then vote at the
end of every step and all run the (collective) save after the same step, though the kubelet signals only
the pods of the reclaimed node, and not at the same instant.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

log = logging.getLogger("kfp_gpu.checkpoint")

GKE_SPOT_GRACE_S = 15.0
"""A non-system pod on a GKE Spot/preemptible node: GKE's kubelet runs graceful node shutdown with
``shutdownGracePeriod`` 30 s and ``shutdownGracePeriodCriticalPods`` 15 s, so ordinary pods get 15 s
(cloud.google.com/kubernetes-engine/docs/concepts/spot-vms, "Termination and graceful shutdown of Spot VMs")."""
GCE_SPOT_GRACE_S = 30.0
"""A process on a bare GCE Spot/preemptible VM (no Kubernetes): ACPI soft-off, then hard stop 30 s later."""
AWS_SPOT_GRACE_S = 120.0
"""AWS spot: the two-minute interruption notice (the pod's ``terminationGracePeriodSeconds`` applies within it)."""
SPOT_GRACE_S: dict[str, float] = {"gke": GKE_SPOT_GRACE_S, "gce": GCE_SPOT_GRACE_S, "aws": AWS_SPOT_GRACE_S,
                                  "eks": AWS_SPOT_GRACE_S}
DEFAULT_GRACE_S = GKE_SPOT_GRACE_S  # the shortest of the documented budgets
EXIT_CODE_PREEMPTED = 143
"""128 + SIGTERM: what a process killed by SIGTERM reports; the launcher maps it to Preempted."""
SAFETY_MARGIN_S = 2.0


def spot_grace_s(platform: str, termination_grace_s: float | None = None) -> float:
    """The emergency-save budget on ``platform`` (gke | gce | eks | aws): the platform's grace, capped by the pod's
    ``terminationGracePeriodSeconds`` when given (the kubelet never waits longer than either).

    Raises: ValueError naming an unknown platform.
    """
    try:
        grace = SPOT_GRACE_S[platform.lower()]
    except KeyError:
        raise ValueError(f"platform {platform!r} has no documented spot grace; use one of "
                         f"{', '.join(sorted(SPOT_GRACE_S))}") from None
    return grace if termination_grace_s is None else min(grace, max(0.0, termination_grace_s))


class PreemptionGuard:
    """Installed by :func:`on_preemption`. Use ``critical()`` around each training step."""

    def __init__(
        self,
        callback: Callable[[], object],
        grace_s: float,
        *,
        exit_code: int | None,
        signals: tuple[signal.Signals, ...],
        save_on_error: bool = False,
        agree: Callable[[bool], bool] | None = None,
        poll_only: bool = False,
    ) -> None:
        """``poll_only``: the signal handler never saves by itself; a framework's loop reads :attr:`requested` at
        its step boundary and saves its own way (:mod:`kfp_gpu.checkpoint.notice`). The watchdog still runs."""
        self.callback = callback
        self.agree = agree
        self.grace_s = grace_s
        self.exit_code = exit_code
        self.signals = signals
        self.save_on_error = save_on_error
        self.requested_at: float | None = None
        self.saved = False
        self._depth = 0
        self._uses_critical = poll_only
        self._handled = False
        self._running = False
        self._previous: dict[signal.Signals, object] = {}

    @property
    def requested(self) -> bool:
        """True once a preemption signal arrived."""
        return self.requested_at is not None

    def install(self) -> PreemptionGuard:
        """Install the signal handlers (main thread only). Raises: ValueError off the main thread."""
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def uninstall(self) -> None:
        """Restore the handlers that were in place before :meth:`install`."""
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)  # type: ignore[arg-type]
        self._previous.clear()

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """Defer a preemption signal to the end of this block (or, if it arrived between blocks, to the
        start of this one), so the save never sees a half-applied step.

        If the block raises after a preemption signal arrived and ``save_on_error`` is set (e.g. a
        collective failed because a preempted peer already exited), the save still runs, then the
        process exits; the callback must then save the last *completed* step, not the failed one.
        """
        self._uses_critical = True
        if self._depth == 0 and self.requested and not self._handled and self.agree is None:
            self._run()  # the signal arrived between blocks: save before starting another step
        self._depth += 1
        try:
            yield
        except Exception:
            self._depth -= 1
            if self._depth == 0 and self.requested and not self._handled and self.save_on_error:
                log.warning("step failed after the preemption signal; saving the last completed step")
                self._run()
            raise
        self._depth -= 1
        if self._depth == 0 and not self._handled and (self.requested or self.agree is not None):
            if self.agree is None or self._agreed():
                self._run()

    def _agreed(self) -> bool:
        """Collective (every rank, at the end of every outermost block): did *any* rank get the signal?"""
        assert self.agree is not None
        try:
            anyone = bool(self.agree(self.requested))
        except Exception:
            if not self.requested:
                raise  # a peer died and we were not preempted: a failure, not a preemption
            log.warning("ranks could not agree on the emergency step (a peer is gone); saving alone")
            return True
        if anyone and not self.requested:
            self.requested_at = time.monotonic()
            log.warning("another rank received the preemption signal: emergency checkpoint within %.0f s",
                        self.grace_s)
            self._start_watchdog()
        return anyone

    def remaining_s(self) -> float:
        """Seconds left of the grace period (minus the watchdog's margin); the full budget before a signal."""
        budget = self._budget()
        if self.requested_at is None:
            return budget
        return max(0.0, budget - (time.monotonic() - self.requested_at))

    def _budget(self) -> float:
        return max(0.5, self.grace_s - min(SAFETY_MARGIN_S, self.grace_s * 0.1))

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.requested:
            log.warning("signal %d again while handling preemption; ignoring", signum)
            return
        self.requested_at = time.monotonic()
        log.warning("received signal %d: emergency checkpoint within %.0f s grace", signum, self.grace_s)
        self._start_watchdog()
        if self._depth == 0 and not self._uses_critical and self.agree is None:
            self._run()

    def _start_watchdog(self) -> None:
        budget = self._budget()
        code = self.exit_code if self.exit_code is not None else EXIT_CODE_PREEMPTED

        def expire() -> None:
            # No logging or stream flushes here: the main thread may hold their locks (it was interrupted
            # mid-write, or the hung save holds them), and waiting on them would deadlock past the grace.
            msg = f"kfp_gpu.checkpoint: emergency checkpoint did not finish within {budget:.1f} s; exiting {code}\n"
            with contextlib.suppress(OSError):
                os.write(2, msg.encode())
            os._exit(code)

        if self.exit_code is not None:
            timer = threading.Timer(budget, expire)
            timer.daemon = True
            timer.start()

    def _run(self) -> None:
        """Run the save callback once, then exit with ``exit_code`` (unless it is None)."""
        self._running = self._handled = True
        t0 = time.monotonic()
        try:
            self.callback()
            self.saved = True
            log.warning("emergency checkpoint saved in %.2f s", time.monotonic() - t0)
        except Exception:
            log.exception("emergency checkpoint failed")
        finally:
            self._running = False
        if self.exit_code is not None:
            _flush()
            raise SystemExit(self.exit_code)


def on_preemption(
    callback: Callable[[], object],
    grace_s: float = DEFAULT_GRACE_S,
    *,
    exit_code: int | None = EXIT_CODE_PREEMPTED,
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM,),
    save_on_error: bool = False,
    agree: Callable[[bool], bool] | None = None,
) -> PreemptionGuard:
    """Install a SIGTERM handler that runs ``callback`` (the emergency save) and exits with 143.

    ``grace_s`` is the platform's grace period (:func:`spot_grace_s`: :data:`GKE_SPOT_GRACE_S` 15 s on a GKE
    Spot node, :data:`AWS_SPOT_GRACE_S` on EKS, capped by the pod's ``terminationGracePeriodSeconds``); a
    watchdog exits just before it ends. ``exit_code=None``
    only records the save (for tests and for loops that exit by themselves). ``save_on_error`` also saves
    when a ``critical()`` block fails after the signal (distributed jobs: a peer that was preempted first
    breaks the collective). Returns the guard; wrap each training step in ``guard.critical()`` so the
    save never sees a half-applied step.

    ``agree`` makes the emergency save collective (torch.distributed): it is called on every rank at the
    end of every outermost ``critical()`` block with "did this rank get the signal?" and must return
    whether *any* rank did (an all-reduce MAX, e.g. :func:`kfp_gpu.checkpoint.dcp_io.any_rank`). All
    ranks then run the callback after the same step, also those the kubelet has not signalled yet (their
    watchdog starts then). If the agreement itself fails (a peer is gone), a signalled rank saves alone
    (a multi-rank save then stays uncommitted) and an unsignalled one re-raises.

    Raises: ValueError when called off the main thread (Python only delivers signals there).
    """
    if grace_s <= 0:
        raise ValueError(f"grace_s must be > 0, got {grace_s}")
    guard = PreemptionGuard(callback, grace_s, exit_code=exit_code, signals=tuple(signals),
                            save_on_error=save_on_error, agree=agree)
    return guard.install()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
