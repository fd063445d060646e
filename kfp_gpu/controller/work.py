"""One unit of a gang's work in a child process of the controller: a step function, run under the controller's
identity (its kubeconfig or in-cluster token, its cloud credentials).

Why a process: a step may run for minutes (scale-up) or hours (training supervision), and it must be stoppable at
any point the way a step pod is: SIGTERM raises :class:`~kfp_gpu.errors.Cancelled` in the step, whose ``finally``
blocks clean up what it started (:func:`kfp_gpu.steps.entry.cancellable`). Units are forked from a forkserver that
imported the step modules once (:func:`_context`), so a unit starts in milliseconds. Every unit dies with the
controller (``PR_SET_PDEATHSIG`` on the forkserver, which exits with the controller): a controller killed with
``kill -9`` leaves no worker acting on its own, and the restarted controller runs the unit again, which the steps'
ledgers make converge.

A unit reads a JSON request ``{step, spec_json, run_id, upstream_json, kwargs}`` and writes its outcome as
``{ok, output_json, metrics, markdown}`` or ``{ok: false, error: KfpGpuError.to_dict()}``; ``python -m
kfp_gpu.controller.work REQUEST RESULT`` runs one by hand.
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_gpu import progress
from kfp_gpu.errors import KfpGpuError

PR_SET_PDEATHSIG = 1
FENCED_EXIT = 75  # a unit that stopped itself at the leader's renew deadline (EX_TEMPFAIL: the next leader reruns it)
# Set when this replica stops acting (leadership lost, SIGTERM): no unit starts after it, and the runner neither
# records the outcome of a unit killed then nor writes the gang's status (kfp_gpu.controller.handlers._fence)
FENCE = threading.Event()
_held: Any = None  # shared with every unit: the time.monotonic() this replica may act until (+inf: no election)


def _deadline() -> Any:
    global _held
    if _held is None:
        _held = _context().Value("d", math.inf, lock=False)  # one aligned double: its reads and writes are atomic
    return _held


def hold_until(deadline: float) -> None:
    """The leader renewed its Lease: this replica and every unit may act until ``deadline`` (``time.monotonic``,
    the renewal's send time + the renew deadline, :class:`kfp_gpu.controller.election.LeaderElector`)."""
    _deadline().value = deadline


def fenced(now: float | None = None) -> bool:
    """True once this replica may no longer act: :data:`FENCE` is set, or its last renewal is a renew deadline old.

    The second is the fence of a *frozen* leader (SIGSTOP, a stalled VM, a long pause): its renew thread is frozen
    with it and cannot step down, while its units, children of the forkserver, keep running. Every unit watches the
    same deadline (:func:`watch_fence`) and exits at it, before the Lease can expire for another replica (the renew
    deadline is shorter than the lease duration); the runner writes nothing past it either."""
    return FENCE.is_set() or (time.monotonic() if now is None else now) >= float(_deadline().value)


def watch_fence(held: Any, *, clock: Callable[[], float] = time.monotonic, wait: Callable[[float], Any] = time.sleep,
                leave: Callable[[int], Any] = os._exit, every_s: float = 0.2) -> None:
    """A unit's guard (run in a thread of its own): exit with :data:`FENCED_EXIT` as soon as ``held.value`` (the
    leader's renew deadline, :func:`hold_until`) has passed, without cleanup, as if the controller had been killed:
    the next leader re-attaches through the steps' ledgers. ``clock``/``wait``/``leave`` are injectable for tests."""
    while True:
        left = float(held.value) - clock()
        if left <= 0:
            logging.getLogger(__name__).error(
                "work unit fenced: the controller has not renewed its leadership for a renew deadline "
                "(frozen or cut off); stopping before the Lease can pass to another replica")
            leave(FENCED_EXIT)
            return
        wait(min(left, every_s))


@dataclass
class Outcome:
    ok: bool
    output_json: str = ""
    metrics: dict[str, float] | None = None
    markdown: str = ""
    error: dict[str, Any] | None = None


# imported once by the forkserver, so a unit does not pay for them (~1 s of cloud client imports per unit
# measured at 512 GPUs); a module that is not installed (no google-cloud on an EKS-only install) is skipped
PRELOAD = ["kfp_gpu.controller.work", "kfp_gpu.steps.preflight_step", "kfp_gpu.steps.warm_pool",
           "kfp_gpu.steps.scale_up", "kfp_gpu.steps.train", "kfp_gpu.steps.teardown",
           "kfp_gpu.providers.gke.provider", "kfp_gpu.providers.eks.provider", "google.auth",
           "google.api_core.client_options", "google.cloud.compute_v1", "google.cloud.container_v1",
           "google.cloud.cloudquotas_v1", "boto3"]
_ctx: Any = None


def _context() -> Any:
    """A forkserver that imported the step modules once: a unit starts in milliseconds, not the seconds a fresh
    interpreter needs to import the Kubernetes and cloud clients. The forkserver exits when the controller does
    (its end of the pipe closes), and every unit dies with the forkserver (``PR_SET_PDEATHSIG``)."""
    global _ctx
    if _ctx is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _ctx = ctx
    return _ctx


def _unit(request: str, result: str, log_path: str, held: Any) -> None:
    """The unit's process: die with the forkserver, stop at the leader's renew deadline ``held``
    (:func:`watch_fence`), log to ``log_path``, run the step, write the outcome."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() == 1:  # the forkserver is already gone
        os._exit(1)
    _drop_forkserver_alive_fd()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own stdout
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    threading.Thread(target=watch_fence, args=(held,), daemon=True, name="kfp-gpu-fence").start()
    os.environ[progress.ENV] = str(Path(request).with_name("progress.json"))
    req = json.loads(Path(request).read_text(encoding="utf-8"))
    code = execute(req["step"], req["spec_json"], req["run_id"], req["upstream_json"], result, **req["kwargs"])
    logging.getLogger(__name__).info("work unit %s ended with exit code %d, peak RSS %.0f MiB", req["step"], code,
                                     resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _drop_forkserver_alive_fd() -> None:
    """Close this unit's copy of the controller's end of the forkserver's liveness pipe. multiprocessing hands it to
    every child it forks; while a unit held it, the forkserver never saw the controller die, so it never exited and
    its units (which die with it, PR_SET_PDEATHSIG) outlived a ``kill -9`` of the controller."""
    from multiprocessing import forkserver

    fd = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_alive_fd", None)
    if isinstance(fd, int):
        try:
            os.close(fd)
        except OSError:
            pass


class Work:
    """A running unit: ``poll()`` is None until it ended, then its :class:`Outcome`."""

    def __init__(self, key: str, step: str, spec_json: str, run_id: str, upstream_json: str,
                 log_path: Path, *, on_exit: Callable[[], None] | None = None, **kwargs: Any) -> None:
        if fenced():
            raise RuntimeError(f"not starting {key}: this controller replica is stopping or no longer leads")
        self.key, self.step = key, step
        self._dir = Path(tempfile.mkdtemp(prefix=f"kfp-gpu-work-{step}-"))
        req = self._dir / "request.json"
        req.write_text(json.dumps({"step": step, "spec_json": spec_json, "run_id": run_id,
                                   "upstream_json": upstream_json, "kwargs": kwargs}), encoding="utf-8")
        self._result = self._dir / "result.json"
        self.proc = _context().Process(target=_unit, args=(str(req), str(self._result), str(log_path), _deadline()),
                                       name=f"kfp-gpu-work-{key}", daemon=False)
        self.proc.start()
        if on_exit is not None:  # wake the gang's loop the moment the unit ends, not on its next turn
            sentinel = self.proc.sentinel

            def watch() -> None:
                multiprocessing.connection.wait([sentinel])
                on_exit()

            threading.Thread(target=watch, daemon=True, name=f"kfp-gpu-work-exit-{key}").start()
        self.outcome: Outcome | None = None
        self.cancelled = False
        self._progress_seq = 0

    def progress(self) -> dict[str, Any] | None:
        """The unit's newest progress report (:mod:`kfp_gpu.progress`) when it is new since the last call, else
        None."""
        rep = progress.read(str(self._dir / "progress.json"))
        if rep is None or int(rep.get("seq", 0)) == self._progress_seq:
            return None
        self._progress_seq = int(rep.get("seq", 0))
        return rep

    @property
    def pid(self) -> int:
        return int(self.proc.pid or 0)

    def poll(self) -> Outcome | None:
        if self.outcome is None and self.proc.exitcode is not None:
            self.outcome = self._finish()
        return self.outcome

    def cancel(self) -> None:
        """SIGTERM, once: the step cancels and cleans up what it started (its ``finally`` blocks). A second
        SIGTERM would raise Cancelled again inside that cleanup, so later calls do nothing."""
        if self.proc.exitcode is None and not self.cancelled:
            self.cancelled = True
            self.proc.terminate()

    def kill(self) -> None:
        """SIGKILL: no cleanup (as when the controller itself is killed); the next controller re-attaches."""
        if self.proc.exitcode is None:
            self.proc.kill()
            self.proc.join(10)

    def wait(self, timeout_s: float) -> Outcome:
        self.proc.join(timeout_s)
        if self.proc.exitcode is None:
            self.kill()
        out = self.poll()
        assert out is not None
        return out

    def _finish(self) -> Outcome:
        try:
            data = json.loads(self._result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            code = self.proc.exitcode
            return Outcome(False, error=KfpGpuError(
                f"the controller's {self.step} worker ended with exit code {code} and no result",
                remediation="see the controller log; the controller runs the step again").to_dict())
        finally:
            for p in self._dir.iterdir():
                p.unlink()
            self._dir.rmdir()
        return Outcome(bool(data.get("ok")), str(data.get("output_json", "")), data.get("metrics"),
                       str(data.get("markdown", "")), data.get("error"))


def execute(step: str, spec_json: str, run_id: str, upstream_json: str, result_path: str = "",
            **kwargs: Any) -> int:
    """Run one step function here and now (:func:`kfp_gpu.steps.entry.run_step`), as a work unit does: the output
    on stdout, an error as one line on stderr; the outcome also to ``result_path`` when given. Returns the exit
    code (the error's, e.g. 130 for Cancelled)."""
    from kfp_gpu.steps.entry import run_step

    code = 0
    try:
        res = run_step(step, spec_json, run_id, upstream_json, **kwargs)
        out: dict[str, Any] = {"ok": True, "output_json": res.output_json, "metrics": res.metrics,
                               "markdown": res.markdown}
        print(res.output_json, flush=True)
    except KfpGpuError as err:
        print(f"kfp-gpu {step} failed: {err}", file=sys.stderr, flush=True)
        out, code = {"ok": False, "error": err.to_dict()}, err.exit_code
    except Exception as exc:  # noqa: BLE001 - a bug must still reach the gang's status, not vanish
        logging.exception("step %s failed", step)
        out, code = {"ok": False, "error": KfpGpuError(f"{type(exc).__name__}: {exc}").to_dict()}, 1
    if result_path:
        tmp = result_path + ".tmp"
        Path(tmp).write_text(json.dumps(out), encoding="utf-8")
        os.replace(tmp, result_path)
    return code


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    req = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    return execute(req["step"], req["spec_json"], req["run_id"], req["upstream_json"], argv[1], **req["kwargs"])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
