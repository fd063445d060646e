"""The train step: a gang-safe training job on the provisioned capacity, seen through to the end.

The job's kind (a Training Operator PyTorchJob or a Trainer v2 TrainJob, the JobTemplate's ``kind``) is one seam,
:mod:`kfp_gpu.jobkinds`: this module builds, creates, watches and deletes the job only through that contract.

Flow: gate on the whole gang Ready (node watch) -> create the job, or re-attach to the one a previous try
of this step created -> watch job, pods and nodes -> on preemption (decided in
:mod:`kfp_gpu.plan.recovery`, watch-driven, well under a second) delete the job, wait until its pods are
gone (force-deleting pods stuck on vanished nodes), re-provision only the lost nodes, and recreate the job
from the newest complete checkpoint. Application failures are retried ``recovery.app_failure_retries``
times, then fail with the pods' log tails. Every incident is written to the step ledger (so a retried step
keeps counting) and to the timeline (:mod:`kfp_gpu.steps.train_recovery` counts, replaces and re-converges).
Cancel (SIGTERM -> ``Cancelled``) deletes the job, then re-raises.

On a Kueue-gated namespace (:mod:`kfp_gpu.steps.admission`) the job goes to the run's LocalQueue, created
suspended; the step waits for its admission (own deadline ``queue_timeout_s``, progress lines), and an eviction
by Kueue (``Preempted``, ``PodsReadyTimeout``...) is a recovery of its own cause: counted as a preemption, the
nodes kept, the job recreated from the newest checkpoint to wait in its queue again.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Mapping

from kubernetes import client

from kfp_gpu import fanout, progress
from kfp_gpu.cluster import balloons
from kfp_gpu.errors import (
    Cancelled,
    GangPlacementFailed,
    KfpGpuError,
    TrainingFailed,
)
from kfp_gpu.job import JobTemplate
from kfp_gpu.jobkinds import JobRequest, for_template
from kfp_gpu.plan import topology
from kfp_gpu.plan.recovery import (
    Action,
    Cause,
    decide,
)
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps import admission
from kfp_gpu.steps.capacity import Capacity
from kfp_gpu.steps.health_gate import await_listed
from kfp_gpu.steps.replace import Background, Reprovision, merge_capacity
from kfp_gpu.steps.result import StepResult
from kfp_gpu.steps.train_recovery import HEALTH_ATTEMPT_BASE, converge, exhausted, record, replace_nodes
from kfp_gpu.steps.train_report import result as _result
from kfp_gpu.steps.train_stall import StallSupervisor
from kfp_gpu.steps.train_state import STEP, TrainState

log = logging.getLogger(__name__)
__all__ = ["STEP", "run", "merge_capacity", "Reprovision", "TrainState"]


def run(
    spec: ProvisioningSpec, run_id: str, capacity_json: str, *, job_json: str, dataset_uri: str = "",
    reprovision: Reprovision | None = None, api: client.ApiClient | None = None,
    admission_timeout_s: float = 120.0, placement_timeout_s: float = 300.0, gate_timeout_s: float = 600.0,
    cleanup_timeout_s: float = 120.0, pod_annotations: Mapping[str, str] | None = None,
    queue_timeout_s: float = 3600.0,
) -> StepResult:
    """Run the training job on ``capacity_json`` (a scale-up output) and recover from preemptions.

    The ``*_timeout_s`` bounds drive the gate and the watchdog (``admission_timeout_s``: no pods after the job
    was created or admitted; ``queue_timeout_s``: not admitted by its Kueue queue); ``pod_annotations`` are added
    to every pod (e.g. ``kfp-gpu.io/sim-exit-code`` in the local rehearsal).

    Raises:
        InvalidSpec: ``capacity_json`` or ``job_json`` is malformed, ``queue_timeout_s`` is not positive, or
            ``target.queue`` names no LocalQueue of the namespace (or several are there and none is chosen), or a
            TrainJob's runtime does not exist (or has no trainer ``node`` container).
        CrdMissing: the cluster does not serve the job kind (Training Operator / Trainer v2 not installed).
        GangPlacementFailed: the gang's nodes never became Ready, the job got no pods, only part of the
            gang was placed within the watchdog bounds, or Kueue did not admit the job within
            ``queue_timeout_s`` (the job is deleted).
        TrainingFailed: the application failed more than ``recovery.app_failure_retries`` times.
        RecoveryBudgetExhausted: more than ``recovery.max_preemptions`` preemptions.
        Cancelled: SIGTERM/SIGINT; the job was deleted first.
        PermissionDenied: no Kubernetes credentials.
    """
    from kfp_gpu.cluster.kube import api_client

    admission.check_timeout(queue_timeout_s)
    # the job's pods live in the target namespace, so they tolerate that namespace's claim taint (the one scale-up
    # put on the gang; a capacity written before it carried a namespace says "default")
    capacity = dataclasses.replace(Capacity.from_json(capacity_json), namespace=spec.target.namespace)
    template = JobTemplate.from_json(job_json)
    own_api = api is None
    api = api if api is not None else api_client(spec.target)
    kind = for_template(template)
    st = TrainState(spec, run_id, api, capacity, kind.job_name(run_id, template.name), kind=kind)
    st.stall = StallSupervisor.for_state(st)
    started = time.time()
    st.load_ledger()
    try:
        status = _supervise(st, template, dataset_uri, reprovision, admission_timeout_s, placement_timeout_s,
                            gate_timeout_s, cleanup_timeout_s, dict(pod_annotations or {}), queue_timeout_s)
    except Cancelled:
        st.ledger["status"] = "cancelled"
        _cleanup(st, cleanup_timeout_s)
        raise
    except KfpGpuError as err:  # GangPlacementFailed, TrainingFailed, RecoveryBudgetExhausted, provider errors
        st.ledger["status"] = type(err).__name__
        st.ledger["error"] = err.message
        _cleanup(st, cleanup_timeout_s)
        raise
    finally:
        st.watch.stop()
        if own_api:
            api.close()
    return _result(st, status, time.time() - started)


def _tas(st: TrainState) -> dict[str, str]:
    """Kueue Topology Aware Scheduling's pod set annotations for the spec's topology, when Kueue gates the job."""
    if not st.queue:
        return {}
    return topology.kueue_annotations(st.spec.topology, st.capacity.labels.topology_label(st.spec.topology_level))


def _supervise(
    st: TrainState, template: JobTemplate, dataset_uri: str, reprovision: Reprovision | None,
    admission_s: float, placement_s: float, gate_s: float, cleanup_s: float, annotations: dict[str, str],
    queue_s: float,
) -> str:
    spec, kind = st.spec, st.kind
    st.ledger["job_kind"] = {"kind": kind.NAME, **kind.prepare(st.api, st.namespace)}
    st.use_queue(admission.resolve_queue(st))
    st.watch.start()
    attach = kind.get(st.api, st.namespace, st.job)
    if attach is not None and attach["metadata"].get("deletionTimestamp"):
        kind.wait_gone(st.api, st.namespace, st.job, timeout_s=cleanup_s)
        attach = None
    while True:
        if attach is None:
            st.capacity = st.backend.before_job(spec, st.run_id, st.capacity)  # a lapsed booking is re-requested
            if not st.provisioned_at_admission:  # else Kueue provisions the gang when it admits the job
                converge(st, reprovision, gate_s)
                while bad := st.health.run(st):  # GPU health gate (spec.health.probe): replace bad nodes first
                    st.degraded = True  # the gang's Degraded condition says why, until the job runs on a whole gang
                    progress.report(progress.DEGRADED, "UnhealthyGpu", f"job {st.job}: GPU health probe failed on "
                                    f"{', '.join(bad)}; replacing before the job starts"[:1000], lost_nodes=len(bad))
                    replace_nodes(st, bad, st.budget.on_demand, reprovision,
                                  attempt=HEALTH_ATTEMPT_BASE + st.health.rounds)
                    await_listed(st, min(gate_s, 30.0))
                    converge(st, reprovision, gate_s)
            else:  # no node is known before admission, and once the pods bind they hold every GPU the probe needs
                st.health.unavailable(st, "the gang forms when the queue admits the job (gang_forms_at_admission): "
                                      "no nodes to probe before it starts; GPU-fault node conditions are still watched")
            ck = st.checkpoint()
            ckpt_step = int(ck.step) if ck is not None else 0
            body = kind.build(JobRequest(
                st.job, template, st.capacity, st.owner.labels(), spec.nodes, st.run_id,
                checkpoint_uri=spec.checkpoint_uri, resume=ck, dataset_uri=dataset_uri,
                pod_annotations={**annotations, **_tas(st), **st.backend.pod_annotations(st.capacity)},
                local=spec.target.rehearsal, queue=st.queue, pin=not st.provisioned_at_admission,
            ))
            releasing = fanout.spawn(lambda: _release_warm_pool(st)) if not st.provisioned_at_admission else None
            try:
                job, created = kind.create_or_get(st.api, st.namespace, body)
            except BaseException:
                if releasing is not None:
                    releasing.result()
                raise
        else:
            job, created, ckpt_step, releasing = attach, False, kind.resume_step(attach), None
        attach = None
        try:
            st.begin_attempt(job, resume_step=ckpt_step, created=created)
        finally:  # joined once the attempt's watch has begun: the balloons' deletes never delay the job's watch
            if releasing is not None:
                releasing.result()
        if st.stall is not None:
            st.stall.begin(clear=created)  # a re-attached attempt keeps its ranks' progress
        if st.degraded or (created and st.attempt > 1):  # a restarted unit recovers what its predecessor began
            progress.report(progress.HEALTHY, "Recovered", f"job {st.job} restarted on a whole gang from step "
                            f"{ckpt_step} (attempt {st.attempt})", preemptions=st.budget.preemptions)
            st.degraded = False
        outcome = admission.wait_admitted(st, queue_s) or st.watch_attempt(admission_s=admission_s,
                                                                           placement_s=placement_s)
        if isinstance(outcome, str):  # "Succeeded"
            return outcome
        decision = decide(spec.recovery, spot=spec.spot, budget=st.budget, verdict=outcome)
        record(st, outcome, decision, template)
        if decision.action is Action.EXHAUSTED:
            raise exhausted(st, decision, outcome)
        if outcome.cause in (Cause.STALL, Cause.STRAGGLER):
            st.degraded = True
            progress.report(progress.DEGRADED, "Stalled" if outcome.cause is Cause.STALL else "StragglerSwap",
                            f"job {st.job}: {outcome.reason}; {decision.message}"[:1000],
                            preemptions=st.budget.preemptions)
        if outcome.cause in (Cause.PREEMPTION, Cause.QUEUE_EVICTION):
            st.degraded = True
            progress.report(progress.DEGRADED, "Recovering" if outcome.cause is Cause.PREEMPTION else "Evicted",
                            f"job {st.job}: {outcome.reason}; {decision.message}"[:1000],
                            preemptions=st.budget.preemptions, lost_nodes=len(outcome.lost_nodes))
        if decision.action is Action.FAIL:
            logs = st.watch.log_tails(outcome.pods)
            st.ledger.setdefault("app_failures", [])[-1]["logs"] = logs
            raise TrainingFailed(
                f"job {st.job}: {outcome.reason}; {decision.message}\n" + "\n".join(
                    f"--- {pod} (last lines) ---\n{text}" for pod, text in logs.items()),
                remediation="fix the training code or inputs (see the log tail); this was not a preemption",
                pods=list(outcome.pods), logs=logs,
            )
        replacing = None
        if outcome.cause is Cause.PREEMPTION:
            lost = st.watch.lost_nodes(outcome)  # + nodes the platform revoked that may still be listed
            taken = st.backend.revoked(spec, st.capacity)
            lost = [*lost, *[n for n in taken if n not in lost]]
            st.counted |= {(i.node, i.at) for i in st.watch.incidents.values()}
            st.ledger["preemptions"][-1]["lost_nodes"] = lost
            st.midrun.release(lost)  # a node flagged by a GPU-fault condition: released before it is replaced
            if lost:  # ask for the replacement capacity now; it boots while the old job is torn down
                replacing = Background(functools.partial(replace_nodes, st, lost, decision.on_demand, reprovision))
        elif outcome.cause in (Cause.STALL, Cause.STRAGGLER) and st.stall is not None:  # swap a bad/slow node
            replacing = st.stall.remediate(outcome, lambda bad: replace_nodes(st, bad, False, reprovision,
                                                                              entry=st.ledger["stalls"][-1]))
        kind.delete(st.api, st.namespace, st.job)
        if not kind.wait_gone(st.api, st.namespace, st.job, timeout_s=cleanup_s):
            raise GangPlacementFailed(
                f"job {st.job}: old pods still present after {cleanup_s:g}s; refusing to start a second copy",
                remediation="check for pods stuck Terminating and delete them with --grace-period=0 --force",
            )
        if replacing is not None:
            replacing.result()
        st.save_ledger()


def _release_warm_pool(st: TrainState) -> None:
    """The warm pool's balloons have done their job once the gang is Ready and claimed: delete them (at once, grace
    0) while the job is created, so its pods bind as they come instead of preempting one balloon per node through
    the scheduler (bench control plane, 64 nodes: balloons deleted by preemption until 3.2 s after the train
    request, the last pod bound at 3.5 s). Beside the create and the attempt's start, not before them: the job's pods
    come one POST at a time from the Training Operator, and waiting for 512 deletes first put 12.9 s before the
    first of them; joined after the attempt's watch has begun, so its job-created time is the create's. The
    claim taint keeps the emptied nodes the run's. A failed delete is logged: the scheduler still preempts what is
    left, and teardown deletes it."""
    try:
        gone = balloons.delete_balloons(st.api, st.namespace, st.run_id)
    except Exception as exc:  # noqa: BLE001
        log.warning("job %s: warm pool balloons not deleted (the job's pods preempt them): %s", st.job, exc)
        return
    if gone:
        st.timeline.event("warm-pool-released", time.time(), balloons=len(gone), job=st.job)


def _cleanup(st: TrainState, timeout_s: float) -> None:
    """Delete the job (foreground) and wait for its pods; never raises (we are already failing)."""
    try:
        st.kind.delete(st.api, st.namespace, st.job)
        st.timeline.event("job-finished", time.time(), job=st.job, status=str(st.ledger.get("status")),
                          attempt=st.attempt)
        st.close_usage(time.time())
        if not st.kind.wait_gone(st.api, st.namespace, st.job, timeout_s=timeout_s):
            log.warning("job %s: pods still present after %.0fs of cleanup", st.job, timeout_s)
        st.save_ledger()
    except Cancelled:
        log.warning("job %s: second cancel during cleanup; job deletion was already requested", st.job)
    except Exception as exc:  # cleanup must not mask the original error
        log.warning("job %s: cleanup failed: %s", st.job, exc)


