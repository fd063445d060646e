"""The controller's two replicas (kfp_gpu/manifests/controller.yaml: ``replicas: 2``), run as two local processes
the way the Deployment runs them: a leader-election Lease (``--leader-elect-resource-name``), ``POD_NAME`` per
replica, each under the controller's ServiceAccount token. Only the Lease's holder runs kopf and the gangs' work
units (kfp_gpu/controller/handlers.py). A sampler reads every ~20 ms which replica has work-unit processes: never
both, from the instant both start through every handover. The tests use short timings (4 s / 3 s / 0.5 s) so a
handover takes seconds; the Deployment's are 15 s / 10 s / 2 s."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu.gang import api as gang
from kfp_gpu.ownership import LEDGER_GANG_NAMESPACE_LABEL
from kfp_gpu_rehearsal.devcluster.controller import LocalController
from tests.integration.controller_support import holder, lease_spec, new_run, small
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

LEASE_S, RENEW_S, RETRY_S = 4, 3.0, 0.5
JOB_S = LEASE_S + 8.0  # the job outlives the handover: the standby re-attaches to it running


def _pools_total(t: Any) -> int:
    return sum(int(p.target) for p in t.sim.state.pools.values())


def _descendants(pid: int, units_only: bool = False) -> set[int]:
    """The live (non-zombie) work processes of the replica ``pid``: its forkserver and the work units forked from it
    (all run the forkserver's command line), found by session (LocalController starts each replica in its own), so
    also once ``kill -9`` orphaned them. multiprocessing's resource tracker, which acts on nothing and exits once
    the replica is gone, is not counted. ``units_only``: the units, not the forkserver (the replica's own child),
    which acts on nothing by itself."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == pid:
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[3]) != pid or (units_only and int(fields[1]) == pid):
                continue
            if b"multiprocessing.forkserver" in (d / "cmdline").read_bytes():
                out.add(int(d.name))
        except OSError:
            continue
    return out


class Sampler:
    """Every ``every_s``: which replicas have work-unit processes. ``both`` lists the instants two had at once."""

    def __init__(self, replicas: dict[str, LocalController], every_s: float = 0.02, units_only: bool = False) -> None:
        self.replicas, self.every_s, self.units_only = replicas, every_s, units_only
        self.samples = 0
        self.both: list[tuple[float, dict[str, int]]] = []
        self.worked: set[str] = set()
        self.first_work: dict[str, float] = {}
        self._stop = threading.Event()
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            working = {n: len(_descendants(c.pid, self.units_only)) for n, c in self.replicas.items()
                       if c.proc is not None}
            working = {n: k for n, k in working.items() if k}
            self.samples += 1
            for n in working:
                self.worked.add(n)
                self.first_work.setdefault(n, now)
            if len(working) > 1:
                self.both.append((now - self.t0, working))
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _take(t: Any, lease: str, holder: str) -> bool:
    """Write ``holder`` into the Lease as a replica would (conditional on the resourceVersion read): False when the
    leader renewed in between (409)."""
    coord = client.CoordinationV1Api(t.kube.api)
    obj = coord.read_namespaced_lease(lease, gang.CONTROLLER_NAMESPACE)
    obj.spec.holder_identity = holder
    try:
        coord.replace_namespaced_lease(lease, gang.CONTROLLER_NAMESPACE, obj)
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


def _two_replicas(t: Any, lease: str, units_only: bool = False) -> tuple[dict[str, LocalController], Sampler]:
    """Start the Deployment's two replicas back to back (the same instant, as a rollout of a new ReplicaSet or a
    cluster restart does) with the sampler already running."""
    replicas = {f"kfp-gpu-controller-{t.ns}-{r}": LocalController(
        t.ctl_kubeconfig, [t.ns], t.workdir / r / "controller.log", lease=lease, replica=f"kfp-gpu-controller-{t.ns}-{r}",
        lease_timings=(LEASE_S, RENEW_S, RETRY_S)) for r in ("a", "b")}
    sampler = Sampler(replicas, units_only=units_only)
    for c in replicas.values():
        c.start()
        t.controllers.append(c)
    sampler.start()
    return replicas, sampler


def _standby_works(standby: LocalController, killed_at: float) -> float:
    wait_until("the standby works the gang", lambda: _descendants(standby.pid), timeout=LEASE_S + 30, every=0.02)
    return time.monotonic() - killed_at


def _scale_up_under_a_leader(t: Any, lease: str, replicas: dict[str, LocalController], nodes: int) -> tuple[
        str, LocalController, LocalController, Any, str, dict[str, Any], threading.Thread]:
    """Once a replica leads: preflight and warm pool of a ``nodes``-node gang, then its scale-up in a thread.
    (leader's name, the leader, the standby, spec, run id, the box the scale-up's result lands in, its thread)."""
    leader = wait_until("a leader", lambda: holder(t, lease, replicas), timeout=30, every=0.05)
    active, standby = replicas[leader], next(c for n, c in replicas.items() if n != leader)
    spec, run = t.spec(nodes, zones=("us-central1-a",)), new_run()
    t.step("preflight", spec, run)
    t.step("warm_pool", spec, run)
    box: dict[str, Any] = {}
    th = threading.Thread(target=lambda: box.update(result=t.step("scale_up", spec, run)), daemon=True)
    th.start()
    return leader, active, standby, spec, run, box, th


def _job_under_a_leader(t: Any, lease: str, replicas: dict[str, LocalController]) -> tuple[
        LocalController, LocalController, Any, str, dict[str, Any], threading.Thread, str, int]:
    """Once a replica leads: preflight, warm pool and scale-up of a 2-node gang, then its train step in a thread until
    both job pods run. (the leader, the standby, spec, run id, the train result's box, its thread, the job's name,
    the cloud resizes so far)."""
    from kfp_gpu.cluster import pytorchjob
    from tests.integration.test_train_support import job_json, running_pods

    leader = wait_until("a leader", lambda: holder(t, lease, replicas), timeout=30, every=0.05)
    active, standby = replicas[leader], next(c for n, c in replicas.items() if n != leader)
    spec, run = t.spec(2, zones=("us-central1-a",)), new_run()
    for s in ("preflight", "warm_pool", "scale_up"):
        t.step(s, spec, run)
    resizes = t.resizes()
    box: dict[str, Any] = {}
    th = threading.Thread(target=lambda: box.update(result=t.step(
        "train", spec, run, job_json=job_json(JOB_S), dataset_uri="", queue_timeout_s=60.0)), daemon=True)
    th.start()
    job = pytorchjob.job_name(run, "train")
    wait_until("2 job pods running", lambda: running_pods(client.CoreV1Api(t.kube.api), t.ns, job, 2), timeout=60)
    return active, standby, spec, run, box, th, job, resizes


def test_two_replicas_started_at_once_never_both_work_and_a_killed_leaders_gang_moves_to_the_standby(lease, tenant):
    t = tenant(median_s=5.0, start=False)
    replicas, sampler = _two_replicas(t, lease)
    try:
        leader, active, standby, spec, run, box, th = _scale_up_under_a_leader(t, lease, replicas, 4)
        wait_until("scale-up running", lambda: ((t.gang(run) or {}).get("status") or {}).get("phase")
                   == "Provisioning" and _pools_total(t) == 4, timeout=30, every=0.05)
        assert t.resizes() == 1, t.sim.request_counts()  # one replica asked the cloud, once
        assert _descendants(active.pid), "the leader runs the gang's work"
        assert not _descendants(standby.pid), "the standby runs nothing"

        active.kill()  # kill -9, mid-provisioning
        killed_at = time.monotonic()
        assert not gang.is_true(t.gang(run) or {}, gang.PROVISIONED)
        acting = _standby_works(standby, killed_at)
        th.join(90)
        ready = time.monotonic() - killed_at
    finally:
        sampler.stop()
    print(f"kill -9 of the leader -> standby working {acting:.2f}s, gang Ready {ready:.1f}s (lease {LEASE_S}s, "
          f"retry {RETRY_S}s); {sampler.samples} samples, both working in {len(sampler.both)}")
    assert sampler.both == [], sampler.both[:5]
    assert sampler.samples > 200 and sampler.worked == set(replicas)  # the sampler saw each replica's work
    assert LEASE_S - RETRY_S <= acting <= LEASE_S + 10, acting  # bounded by the lease duration (+ kopf's start)
    assert lease_spec(t, lease) == {"holder": lease_spec(t, lease)["holder"], "transitions": 1,
                                     "duration": LEASE_S}
    assert holder(t, lease, replicas) != leader
    assert "result" in box, f"{box}\n{t.controller_log()}"
    assert small(box["result"].output_json)
    assert (t.gang(run) or {})["status"]["phase"] == "Ready"
    assert len(t.claimed(run)) == 4 and _pools_total(t) == 4
    assert len(t.sim_nodes()) == 4  # nothing added twice
    assert t.resizes() <= 2, t.sim.request_counts()  # at most the same absolute size again

    t.step("teardown", spec, run)
    assert t.claimed(run) == []
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)
    core = client.CoreV1Api(t.kube.api)
    sel = f"{LEDGER_GANG_NAMESPACE_LABEL}={t.ns}"
    assert core.list_namespaced_config_map(gang.CONTROLLER_NAMESPACE, label_selector=sel).items == []
    assert not _descendants(active.pid)


def test_a_leader_that_loses_its_lease_stops_its_work_before_the_standby_starts(lease, tenant):
    """The Lease is taken from the leader while it provisions (as when it was cut off from the API server and
    another replica took over): it kills its work units and exits at its next renewal; the standby takes over the
    stolen Lease once it expired; never both working."""
    t = tenant(median_s=5.0, start=False)
    replicas, sampler = _two_replicas(t, lease)
    try:
        leader, active, standby, spec, run, box, th = _scale_up_under_a_leader(t, lease, replicas, 2)
        wait_until("the leader provisions", lambda: _descendants(active.pid) and _pools_total(t) == 2, timeout=30,
                   every=0.05)
        wait_until("the Lease taken", lambda: _take(t, lease, "someone-else"), timeout=10, every=0.01)
        stolen_at = time.monotonic()
        assert active.proc is not None
        wait_until("the old leader exited", lambda: active.proc is not None and active.proc.poll() is not None,
                   timeout=RENEW_S + 10, every=0.02)
        stopped = time.monotonic() - stolen_at
        assert not _descendants(active.pid), "its work units died with it"
        acting = _standby_works(standby, stolen_at)
        th.join(90)
    finally:
        sampler.stop()
    print(f"lease taken -> old leader stopped its work and exited {stopped:.2f}s, standby working {acting:.2f}s; "
          f"{sampler.samples} samples, both working in {len(sampler.both)}")
    assert active.proc.returncode == 1, active.proc.returncode
    assert "leader election lost" in active.log_path.read_text(errors="replace")
    assert stopped <= 2 * RETRY_S + 2.0, stopped  # at its next renewal, not at the lease's end
    assert acting >= LEASE_S - RETRY_S, acting  # the stolen lease was waited out
    assert sampler.both == [], sampler.both[:5]
    assert "result" in box, f"{box}\n{t.controller_log()}"
    assert (t.gang(run) or {})["status"]["phase"] == "Ready" and len(t.claimed(run)) == 2
    assert t.resizes() <= 2, t.sim.request_counts()
    t.step("teardown", spec, run)
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)


def test_a_frozen_leaders_work_units_stop_by_themselves_before_its_lease_can_pass(lease, tenant):
    """The leader is frozen whole (SIGSTOP: a paused VM, a stopped container) while it supervises the gang's job.
    Its renew thread is frozen with it, but its work units, children of its forkserver, are not: each stops by
    itself at the leader's renew deadline (kfp_gpu.controller.work.watch_fence), before the Lease can pass to the
    standby, which re-attaches to the same job. Resumed (SIGCONT) after the standby took over, the old leader steps
    down and exits without renewing; never two replicas' units at once, one job copy, no resize."""
    import os
    import signal

    t = tenant()
    replicas, sampler = _two_replicas(t, lease, units_only=True)
    try:
        active, standby, spec, run, box, th, job, resizes = _job_under_a_leader(t, lease, replicas)
        custom = client.CustomObjectsApi(t.kube.api)
        uid = custom.get_namespaced_custom_object("kubeflow.org", "v1", t.ns, "pytorchjobs", job)["metadata"]["uid"]
        assert _descendants(active.pid, True) and not _descendants(standby.pid, True)
        os.kill(active.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            wait_until("the frozen leader's units gone", lambda: not _descendants(active.pid, True),
                       timeout=RENEW_S + 10, every=0.02)
            stopped = time.monotonic() - frozen_at
            acting = _standby_works(standby, frozen_at)
        finally:
            os.kill(active.pid, signal.SIGCONT)
        assert active.proc is not None
        wait_until("the resumed leader exited", lambda: active.proc is not None and active.proc.poll() is not None,
                   timeout=RENEW_S + 10, every=0.05)
        th.join(90)
    finally:
        sampler.stop()
    log_text = active.log_path.read_text(errors="replace")
    unit_logs = "".join(f.read_text(errors="replace") for f in (active.log_path.parent / "controller-work").glob("*"))
    print(f"SIGSTOP of the leader during the job -> its units stopped {stopped:.2f}s, standby working {acting:.2f}s "
          f"(renew deadline {RENEW_S}s, lease {LEASE_S}s); {sampler.samples} samples, both working in "
          f"{len(sampler.both)}")
    assert "work unit fenced" in unit_logs, unit_logs[-3000:]  # the train unit stopped itself, mid-job
    assert RENEW_S - 2 * RETRY_S <= stopped <= RENEW_S + 1.0, stopped  # at its renew deadline, not at once
    assert acting >= LEASE_S - RETRY_S, acting  # the standby waited the frozen leader's Lease out
    assert sampler.both == [], sampler.both[:5]
    assert active.proc.returncode == 1, active.proc.returncode
    assert "leader election lost" in log_text and "paused or cut off" in log_text, log_text[-2000:]
    assert "result" in box, f"{box}\n{t.controller_log()}"
    jobs = custom.list_namespaced_custom_object("kubeflow.org", "v1", t.ns, "pytorchjobs")["items"]
    assert [(j["metadata"]["name"], j["metadata"]["uid"]) for j in jobs] == [(job, uid)]  # the same job: one copy
    assert t.resizes() == resizes, t.sim.request_counts()
    t.step("teardown", spec, run)
    assert t.claimed(run) == []
    wait_until("no job left", lambda: not custom.list_namespaced_custom_object(
        "kubeflow.org", "v1", t.ns, "pytorchjobs")["items"], timeout=60)
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)


def test_the_standby_takes_over_a_running_job_with_one_job_copy(lease, tenant):
    """The leader is killed while the gang's job runs: the standby re-attaches to the train unit's job through its
    ledger; one job copy ever, no second resize, nothing left."""
    t = tenant()
    replicas, sampler = _two_replicas(t, lease)
    try:
        active, standby, spec, run, box, th, job, resizes = _job_under_a_leader(t, lease, replicas)
        custom = client.CustomObjectsApi(t.kube.api)
        assert not _descendants(standby.pid), "the standby runs nothing"
        uid = custom.get_namespaced_custom_object("kubeflow.org", "v1", t.ns, "pytorchjobs", job)["metadata"]["uid"]
        active.kill()
        killed_at = time.monotonic()
        jobs_state = ((t.gang(run) or {}).get("status") or {}).get("jobs") or {}
        assert jobs_state.get("train", {}).get("state") == gang.JOB_RUNNING, jobs_state  # killed while it runs
        acting = _standby_works(standby, killed_at)
        th.join(90)
    finally:
        sampler.stop()
    print(f"kill -9 during the job -> standby working {acting:.2f}s; both working in {len(sampler.both)} samples")
    assert sampler.both == [], sampler.both[:5]
    assert "result" in box, f"{box}\n{t.controller_log()}"
    jobs = custom.list_namespaced_custom_object("kubeflow.org", "v1", t.ns, "pytorchjobs")["items"]
    assert [(j["metadata"]["name"], j["metadata"]["uid"]) for j in jobs] == [(job, uid)]  # the same job: one copy
    assert t.resizes() == resizes, t.sim.request_counts()  # the train takeover asked the cloud nothing
    t.step("teardown", spec, run)
    assert t.claimed(run) == []
    wait_until("no job left", lambda: not custom.list_namespaced_custom_object(
        "kubeflow.org", "v1", t.ns, "pytorchjobs")["items"], timeout=60)
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)


def test_a_replica_whose_lease_the_rbac_does_not_grant_stops_with_one_line(tenant):
    """--leader-elect-resource-name names a Lease the controller's Role does not grant: the candidate exits at its
    first read with the API server's refusal and where to grant it, no traceback, no work."""
    t = tenant(start=False)
    c = LocalController(t.ctl_kubeconfig, [t.ns], t.workdir / "ungranted" / "controller.log",
                        lease=f"not-granted-{uuid.uuid4().hex[:6]}", replica="kfp-gpu-controller-x",
                        lease_timings=(LEASE_S, RENEW_S, RETRY_S)).start()
    t.controllers.append(c)
    assert c.proc is not None
    code = c.proc.wait(60)
    lines = [ln for ln in c.log_path.read_text(errors="replace").splitlines() if ln.startswith("kfp-gpu")]
    assert code != 0 and len(lines) == 1, c.log_path.read_text(errors="replace")[-3000:]
    assert "cannot get resource \"leases\"" in lines[0] and "controller-rbac.yaml" in lines[0], lines[0]
    assert "Traceback" not in c.log_path.read_text(errors="replace")


def test_a_leader_stopped_cleanly_hands_the_lease_over_without_the_wait(lease, tenant):
    """SIGTERM (a rollout, ``kubectl delete pod``): the leader stops its work, then releases the Lease (empty
    holder), and the standby takes it at its next round instead of waiting out the lease duration."""
    t = tenant(start=False)
    replicas, sampler = _two_replicas(t, lease)
    sampler.stop()
    leader = wait_until("a leader", lambda: holder(t, lease, replicas), timeout=30, every=0.05)
    active, standby = replicas[leader], next(c for n, c in replicas.items() if n != leader)
    assert active.proc is not None
    stop_at = time.monotonic()
    active.stop()
    took = wait_until("the standby holds the Lease", lambda: holder(t, lease, replicas) not in ("", leader)
                      and time.monotonic() - stop_at, timeout=LEASE_S + 10, every=0.02)
    print(f"SIGTERM of the leader -> standby holds the Lease {took:.2f}s (lease {LEASE_S}s)")
    assert active.proc.returncode == 0, active.proc.returncode
    assert "released the Lease" in active.log_path.read_text(errors="replace")
    # the standby logs its acquisition just after its update returns: the Lease can show it a moment before the log
    took_over = wait_until("the standby's log says it acquired the Lease", lambda: [
        ln for ln in standby.log_path.read_text(errors="replace").splitlines() if "acquired the Lease" in ln],
        timeout=5, every=0.05)
    assert len(took_over) == 1 and "(released by its last holder)" in took_over[0], took_over  # not expired
    assert lease_spec(t, lease)["transitions"] == 1
