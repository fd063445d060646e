"""The kfp-gpu controller on the local cluster: its own process and ServiceAccount token, the steps as the tenant
namespace's ``kfp-gpu`` ServiceAccount (tests/integration/controller_support.py).

Each test drives the gang only through the step client, then checks the world (the stand-in's pools and call
counts, the Nodes, the gang object) as the admin."""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu import ownership
from kfp_gpu.errors import KfpGpuError, PermissionDenied
from kfp_gpu.gang import api as gang
from kfp_gpu.gang.client import OWNER_PID_ENV
from kfp_gpu.ownership import LABEL_RUN_ID, label_safe
from tests.integration.controller_support import new_run, small, wait_gone
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def _in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, box


def _train_then_preempt(t: Any, spec: Any, run: str, ckpt: Any, *, seconds: float
                        ) -> tuple[threading.Thread, dict[str, Any], str]:
    """Start the train step (a 2-pod job for ``seconds``), wait for its pods, save a checkpoint at step 10, then
    preempt one of the gang's nodes; (the train thread, its result box, the preempted node)."""
    from kfp_gpu.checkpoint.store import CheckpointStore
    from kfp_gpu.cluster import pytorchjob
    from tests.integration.test_train_support import job_json, running_pods

    th, box = _in_thread(t.step, "train", spec, run, job_json=job_json(seconds), dataset_uri="", queue_timeout_s=60.0)
    job = pytorchjob.job_name(run, "train")
    core = client.CoreV1Api(t.kube.api)
    wait_until("2 pods running", lambda: running_pods(core, t.ns, job, 2), timeout=90)
    CheckpointStore(str(ckpt)).save(10, {"model.pt": b"w10"}, meta={"loss": 2.5})
    victim = sorted(t.claimed(run))[0]
    t.sim.preempt(victim)
    return th, box, victim


def _pools_total(t: Any) -> int:
    return sum(int(p.target) for p in t.sim.state.pools.values())


def test_gang_goes_through_every_stage_and_release_leaves_nothing(tenant):
    t = tenant()
    spec, run = t.spec(2), new_run()
    outs = [t.step(s, spec, run).output_json for s in ("preflight", "warm_pool", "scale_up")]
    assert all(small(o) for o in outs), outs
    g = t.gang(run)
    assert g is not None
    st = g["status"]
    assert st["phase"] == "Ready" and st["ready"] == "2/2", st
    assert {c["type"] for c in st["conditions"] if c["status"] == "True"} >= {
        gang.POLICY_ADMITTED, gang.PREFLIGHTED, gang.WARM_POOL_HELD, gang.PROVISIONED}
    assert sorted(st["gangNodes"]) == sorted(t.claimed(run))
    events = client.CoreV1Api(t.kube.api).list_namespaced_event(
        t.ns, field_selector=f"involvedObject.name={gang.gang_name(run)}").items
    assert {"PolicyAdmitted", gang.PROVISIONED, "ScaleUpStarted"} <= {e.reason for e in events}
    out = t.step("teardown", spec, run)
    assert "nodes_released" in out.output_json
    assert t.gang(run) is None or wait_gone(t, run) >= 0
    assert t.claimed(run) == []
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)


def test_the_jobs_pods_take_the_warm_pool_nodes_without_preempting_its_balloons(tenant):
    """A warm pool of 2 balloons holds the gang's nodes until the job is created; then the train unit deletes them,
    and the job's pods bind to the claimed nodes without one scheduler preemption (no Preempted event)."""
    import dataclasses

    from kfp_gpu.cluster import pytorchjob
    from kfp_gpu.ownership import BALLOON_LABEL
    from kfp_gpu.spec import WarmPool
    from tests.integration.test_train_support import job_json, running_pods

    t = tenant()
    spec = dataclasses.replace(t.spec(2, zones=("us-central1-a",)), warm_pool=WarmPool(nodes=2, ttl_s=600))
    run = new_run()
    core = client.CoreV1Api(t.kube.api)
    for s in ("preflight", "warm_pool", "scale_up"):
        t.step(s, spec, run)
    # the balloons are created by the warm pool; the scheduler binds them once the nodes are Ready with GPUs, which
    # can come a scheduling cycle (its backoff for unschedulable pods) after scale-up has seen the nodes Ready
    def bound() -> list[Any] | None:
        held = core.list_namespaced_pod(t.ns, label_selector=f"{BALLOON_LABEL}=true").items
        return held if len(held) == 2 and all(p.spec.node_name for p in held) else None
    wait_until("the warm pool's 2 balloons bound", bound, timeout=30)
    th, box = _in_thread(t.step, "train", spec, run, job_json=job_json(4.0), dataset_uri="", queue_timeout_s=60.0)
    job = pytorchjob.job_name(run, "train")
    pods = wait_until("2 job pods running", lambda: running_pods(core, t.ns, job, 2), timeout=90)
    assert {p.spec.node_name for p in pods} == set(t.claimed(run))
    assert core.list_namespaced_pod(t.ns, label_selector=f"{BALLOON_LABEL}=true").items == []
    preempted = [e.message for e in core.list_namespaced_event(t.ns).items if e.reason == "Preempted"]
    assert preempted == [], preempted
    th.join(120)
    assert "error" not in box, f"{box.get('error')}\n{t.controller_log()}"
    t.step("teardown", spec, run)
    assert t.claimed(run) == []


def test_gang_beyond_policy_is_refused_naming_the_rule_and_no_cloud_call_is_made(tenant):
    t = tenant(max_gpus_per_gang=8)
    spec, run = t.spec(2), new_run()  # 2 nodes x 8 GPUs = 16 > 8
    before = dict(t.sim.request_counts())
    with pytest.raises(PermissionDenied, match="maxGpusPerGang") as ei:
        t.step("preflight", spec, run)
    assert "16" in str(ei.value) and "8" in str(ei.value)
    g = t.gang(run)
    assert g is not None and g["status"]["phase"] == "Denied"
    cond = gang.condition(g, gang.POLICY_ADMITTED)
    assert cond is not None and cond["status"] == "False" and "maxGpusPerGang" in cond["message"]
    time.sleep(1.0)  # give a wrongly admitted gang the time to call the cloud
    assert t.sim.request_counts() == before
    t.step("teardown", spec, run)
    assert t.sim.request_counts() == before


def test_tenant_cannot_write_the_status_the_controller_owns(tenant):
    t = tenant()
    spec, run = t.spec(1), new_run()
    t.step("preflight", spec, run)
    api = t.step_api
    with pytest.raises(ApiException) as ei:
        client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            gang.GROUP, gang.VERSION, t.ns, gang.PLURAL, gang.gang_name(run),
            {"status": {"conditions": [{"type": gang.PROVISIONED, "status": "True"}]}})
    assert ei.value.status == 403
    api.close()
    t.step("teardown", spec, run)


def test_the_ledgers_that_steer_pool_release_are_out_of_the_tenants_reach(tenant):
    """Teardown restores node pools to the sizes the scale-up ledger records: the controller keeps that ledger in
    its own namespace, where the tenant's identity can neither read nor write it, and drops it on release."""
    from kfp_gpu.cluster import ledger

    t = tenant()
    spec, run = t.spec(1, zones=("us-central1-a",)), new_run()
    for s in ("preflight", "warm_pool", "scale_up"):
        t.step(s, spec, run)
    core = client.CoreV1Api(t.kube.api)
    sel = f"{ledger.LEDGER_LABEL}=true,{ledger.TENANT_LABEL}={t.ns},{LABEL_RUN_ID}={label_safe(run)}"
    mine = core.list_namespaced_config_map(gang.CONTROLLER_NAMESPACE, label_selector=sel).items
    assert {(cm.metadata.labels or {}).get("kfp-gpu.io/step") for cm in mine} >= {"scale_up"}, [
        cm.metadata.name for cm in mine]
    assert "targets" in ledger.data_of(next(cm for cm in mine if cm.metadata.labels["kfp-gpu.io/step"] == "scale_up"))
    in_tenant = core.list_namespaced_config_map(t.ns, label_selector=f"{ledger.LEDGER_LABEL}=true").items
    assert in_tenant == [], [cm.metadata.name for cm in in_tenant]
    api = t.step_api
    tenant_core = client.CoreV1Api(api)
    target = mine[0].metadata.name
    for call in (lambda: tenant_core.read_namespaced_config_map(target, gang.CONTROLLER_NAMESPACE),
                 lambda: tenant_core.patch_namespaced_config_map(target, gang.CONTROLLER_NAMESPACE,
                                                                 {"data": {"ledger": "{}"}})):
        with pytest.raises(ApiException) as ei:
            call()
        assert ei.value.status == 403
    api.close()
    t.step("teardown", spec, run)
    assert core.list_namespaced_config_map(gang.CONTROLLER_NAMESPACE, label_selector=sel).items == []
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)


def test_controller_killed_during_provisioning_converges_without_a_second_resize(tenant):
    t = tenant(median_s=8.0)
    spec, run = t.spec(4, zones=("us-central1-a",)), new_run()
    t.step("preflight", spec, run)
    t.step("warm_pool", spec, run)
    th, box = _in_thread(t.step, "scale_up", spec, run)
    wait_until("scale-up running", lambda: ((t.gang(run) or {}).get("status") or {}).get("phase") == "Provisioning"
               and _pools_total(t) == 4, timeout=30, every=0.05)
    first = t.controllers[-1]
    first.kill()
    wait_until("work died with the controller", lambda: not t.work_processes(), timeout=10)
    g = t.gang(run) or {}
    assert not gang.is_true(g, gang.PROVISIONED) and g["status"]["phase"] == "Provisioning"  # killed mid-stage
    resizes_before = t.resizes()
    t.start_controller()
    th.join(120)
    assert "error" not in box, f"{box.get('error')}\n{t.controller_log()}"
    assert small(box["result"].output_json)
    assert len(t.claimed(run)) == 4 and _pools_total(t) == 4
    assert len(t.sim_nodes()) == 4  # nothing added twice
    assert t.resizes() - resizes_before <= 1, t.sim.request_counts()  # at most the same absolute size again
    t.step("teardown", spec, run)
    assert t.claimed(run) == []
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)


def test_controller_killed_during_recovery_converges_with_one_job_copy(tenant, tmp_path):
    """A spot node of the running gang is reclaimed; while the train unit recovers, the controller is killed. The
    restarted controller re-attaches (the train ledger): one job copy, the preemption counted once, nothing left."""
    from kfp_gpu.cluster import ledger

    t = tenant()
    ckpt = tmp_path / "ckpt"
    spec, run = t.spec(2, zones=("us-central1-a",), checkpoint_uri=str(ckpt)), new_run()
    for s in ("preflight", "warm_pool", "scale_up"):
        t.step(s, spec, run)
    th, box, _ = _train_then_preempt(t, spec, run, ckpt, seconds=8.0)
    wait_until("recovery under way", lambda: (ledger.read(t.kube.api, t.ns, run, "train").get("budget") or {})
               .get("preemptions") == 1, timeout=60, every=0.05)
    t.controllers[-1].kill()
    wait_until("work died with the controller", lambda: not t.work_processes(), timeout=10)
    t.start_controller()
    th.join(240)
    assert "error" not in box, f"{box.get('error')}\n{t.controller_log()}"
    jobs = client.CustomObjectsApi(t.kube.api).list_namespaced_custom_object(
        "kubeflow.org", "v1", t.ns, "pytorchjobs")["items"]
    assert len(jobs) <= 1, [j["metadata"]["name"] for j in jobs]  # one job copy, ever
    assert ledger.read(t.kube.api, t.ns, run, "train")["budget"]["preemptions"] == 1
    t.step("teardown", spec, run)
    assert t.claimed(run) == []
    wait_until("no job left", lambda: not client.CustomObjectsApi(t.kube.api).list_namespaced_custom_object(
        "kubeflow.org", "v1", t.ns, "pytorchjobs")["items"], timeout=60)
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)


def _condition(g: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    return next((c for c in ((g or {}).get("status") or {}).get("conditions") or [] if c.get("type") == ctype), {})


def test_a_preempted_gang_is_degraded_while_recovering_then_whole_again(tenant, tmp_path):
    """A spot node of the running gang is reclaimed: the gang's Degraded condition turns True (phase Recovering, a
    Warning Event naming the node) while the train unit replaces it, then False (Recovered) once the job runs again
    on a whole gang."""

    t = tenant()
    ckpt = tmp_path / "ckpt"
    spec, run = t.spec(2, zones=("us-central1-a",), checkpoint_uri=str(ckpt)), new_run()
    for s in ("preflight", "warm_pool", "scale_up"):
        t.step(s, spec, run)
    assert _condition(t.gang(run), gang.DEGRADED) == {}  # nothing lost yet: no such condition
    th, box, victim = _train_then_preempt(t, spec, run, ckpt, seconds=6.0)
    seen: list[tuple[str, str]] = []

    def phases() -> bool:
        g = t.gang(run)
        c = _condition(g, gang.DEGRADED)
        seen.append((str(((g or {}).get("status") or {}).get("phase")), f"{c.get('status')}/{c.get('reason')}"))
        return c.get("status") == "False" and c.get("reason") == "Recovered"

    wait_until("the gang whole again", phases, timeout=120, every=0.05)
    assert ("Recovering", "True/Recovering") in seen, seen
    events = client.CoreV1Api(t.kube.api).list_namespaced_event(
        t.ns, field_selector=f"involvedObject.name={gang.gang_name(run)}").items
    warn = [e for e in events if e.reason == "Recovering"]
    assert warn and warn[0].type == "Warning" and victim in warn[0].message, [(e.reason, e.message) for e in events]
    th.join(240)
    assert "error" not in box, f"{box.get('error')}\n{t.controller_log()}"
    t.step("teardown", spec, run)
    assert t.claimed(run) == []


def test_controller_killed_during_release_converges_and_leaves_nothing(tenant):
    t = tenant()
    spec, run = t.spec(4, zones=("us-central1-a",)), new_run()
    for s in ("preflight", "warm_pool", "scale_up"):
        t.step(s, spec, run)
    th, box = _in_thread(t.step, "teardown", spec, run)
    wait_until("releasing", lambda: ((t.gang(run) or {}).get("spec") or {}).get("release") is True, timeout=30,
               every=0.02)
    t.controllers[-1].kill()
    t.start_controller()
    th.join(120)
    assert "error" not in box, f"{box.get('error')}\n{t.controller_log()}"
    assert t.gang(run) is None or wait_gone(t, run) >= 0
    assert t.claimed(run) == []
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)


def test_deleting_the_gang_releases_everything_through_the_finalizer(tenant):
    t = tenant()
    spec, run = t.spec(2, zones=("us-central1-a",)), new_run()
    for s in ("preflight", "warm_pool", "scale_up"):
        t.step(s, spec, run)
    assert len(t.claimed(run)) == 2
    client.CustomObjectsApi(t.step_api).delete_namespaced_custom_object(
        gang.GROUP, gang.VERSION, t.ns, gang.PLURAL, gang.gang_name(run))
    wait_gone(t, run, timeout=60)
    assert t.claimed(run) == []
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)


def test_owner_gone_releases_within_seconds_without_a_lease_wait(tenant, monkeypatch):
    t = tenant()
    owner = subprocess.Popen(["sleep", "600"])
    monkeypatch.setenv(OWNER_PID_ENV, str(owner.pid))
    spec, run = t.spec(2, zones=("us-central1-a",)), new_run()
    for s in ("preflight", "warm_pool", "scale_up"):
        t.step(s, spec, run)
    assert (t.gang(run) or {})["spec"]["owner"]["local"].endswith(f":{owner.pid}")
    assert len(t.claimed(run)) == 2
    owner.kill()
    owner.wait()
    took = wait_gone(t, run, timeout=30)
    print(f"owner killed -> gang released and gone in {took:.2f}s")
    assert took < 15.0, took  # owner check every 1 s, then the release itself
    assert t.claimed(run) == []
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)


def test_an_unobservable_owner_keeps_its_gang_by_heartbeat_and_loses_it_when_the_beats_stop(tenant, monkeypatch):
    """Steps from a host the controller cannot observe (as on Vertex AI: no Argo Workflow, no local process on the
    controller's host) record ``heartbeat: "true"`` and beat on the gang while they wait. The beats keep the gang
    past its lease_ttl_s; once they stop, the controller releases it within lease_ttl_s plus its owner check."""
    import dataclasses
    import socket

    from kfp_gpu.gang.client import GangClient

    t = tenant()
    monkeypatch.delenv(OWNER_PID_ENV, raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "vertex-worker-7")  # this process only, not the controller
    spec, run = dataclasses.replace(t.spec(2, zones=("us-central1-a",)), lease_ttl_s=10.0), new_run()
    for s in ("preflight", "warm_pool", "scale_up"):
        t.step(s, spec, run)
    owner = (t.gang(run) or {})["spec"]["owner"]
    assert owner.get("heartbeat") == "true" and owner["local"].startswith("local:vertex-worker-7:"), owner
    c = GangClient(t.step_api, t.ns, run)
    assert c.get() is not None and c.beat_every_s == 2.5
    with pytest.raises(KfpGpuError, match="did not answer within 15s"):
        c.wait(lambda o: gang.is_true(o, gang.RELEASED), timeout_s=15.0)  # a step waiting 1.5 x lease_ttl_s
    assert not gang.is_true(t.gang(run) or {}, gang.RELEASED) and len(t.claimed(run)) == 2
    last = float(((t.gang(run) or {})["metadata"].get("annotations") or {})[ownership.HEARTBEAT_ANNOTATION])
    took = wait_gone(t, run, timeout=60)
    silent = time.time() - last
    print(f"beats stopped -> gang released and gone {silent:.1f}s after the last beat (lease_ttl_s 10)")
    assert 10.0 <= silent < 25.0, silent
    assert took > 0 and t.claimed(run) == []
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)


def test_a_failed_stage_fails_the_step_with_the_controllers_error(tenant):
    t = tenant(stockouts=[{"zone": "us-central1-a", "window": "always"}])
    spec, run = t.spec(2, zones=("us-central1-a",), deadline=10.0), new_run()
    t.step("preflight", spec, run)
    t.step("warm_pool", spec, run)
    with pytest.raises(KfpGpuError) as ei:
        t.step("scale_up", spec, run)
    assert type(ei.value).__name__ in ("CapacityUnavailable", "ProvisioningTimeout"), ei.value
    assert (t.gang(run) or {})["status"]["phase"] == "Failed"
    t.step("teardown", spec, run)
    assert t.claimed(run) == []
