"""The controller's two replicas (kfp_gpu/manifests/controller.yaml: ``replicas: 2``, kopf peering), run as two
local processes the way the Deployment runs them: ``--peering`` (a ClusterKopfPeering), ``POD_NAME`` per replica,
each under the controller's ServiceAccount token. One acts; ``kill -9`` of it hands the gang to the other within
the peering lifetime (kfp_gpu.controller.handlers.PEERING_LIFETIME_S)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu.controller.handlers import PEERING_LIFETIME_S
from kfp_gpu.gang import api as gang
from kfp_gpu.ownership import LEDGER_GANG_NAMESPACE_LABEL
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.devcluster.controller import LocalController
from tests.integration.controller_support import new_run, small
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

_KOPF = ("kopf.dev", "v1", "clusterkopfpeerings")
JOB_S = PEERING_LIFETIME_S + 10.0  # the job outlives the handover: the standby re-attaches to it running


def _peers(custom: client.CustomObjectsApi, name: str) -> dict[str, dict[str, Any]]:
    return dict(custom.get_cluster_custom_object(*_KOPF, name).get("status") or {})


def _pools_total(t: Any) -> int:
    return sum(int(p.target) for p in t.sim.state.pools.values())


def _descendants(pid: int) -> set[int]:
    """Live (non-zombie) processes below ``pid``: the replica's forkserver and work units."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


@pytest.fixture
def peering(kube: Kube) -> Iterator[str]:
    """A ClusterKopfPeering of this test's own (the Deployment's is kfp-gpu-controller, kopf-peering.yaml): parallel
    worlds never pause each other. Requested before ``tenant``, it outlives the tenant's clean-up (which needs a
    replica working)."""
    name = f"kfp-gpu-test-{uuid.uuid4().hex[:8]}"
    custom = client.CustomObjectsApi(kube.api)
    custom.create_cluster_custom_object(*_KOPF, {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                                                 "metadata": {"name": name}})
    yield name
    try:
        custom.delete_cluster_custom_object(*_KOPF, name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _two_replicas(t: Any, peering: str) -> tuple[str, LocalController, LocalController]:
    """Start the Deployment's two replicas; (the active one's name, the active one, the standby)."""
    custom = client.CustomObjectsApi(t.kube.api)
    replicas = {}
    for r in ("a", "b"):
        name = f"kfp-gpu-controller-{t.ns}-{r}"
        replicas[name] = LocalController(t.ctl_kubeconfig, [t.ns], t.workdir / r / "controller.log",
                                         peering=peering, replica=name).start()
        t.controllers.append(replicas[name])
    peers = wait_until("both replicas in the peering", lambda: len(_peers(custom, peering)) == 2 and
                       _peers(custom, peering), timeout=30)
    assert set(peers) == set(replicas), peers  # the peer records are the pods' names
    active_name = max(peers, key=lambda p: peers[p]["priority"])
    return active_name, replicas[active_name], next(c for n, c in replicas.items() if n != active_name)


def _handover(t: Any, peering: str, active_name: str, standby: LocalController) -> tuple[float, float]:
    """After ``kill -9`` of the active replica: (seconds until its peer record is gone, until the standby works)."""
    custom = client.CustomObjectsApi(t.kube.api)
    killed_at = time.monotonic()
    wait_until("the killed replica's record expired", lambda: active_name not in _peers(custom, peering),
               timeout=PEERING_LIFETIME_S + 15, every=0.1)
    handover = time.monotonic() - killed_at
    wait_until("the standby works the gang", lambda: _descendants(standby.pid), timeout=15, every=0.05)
    return handover, time.monotonic() - killed_at


def test_two_replicas_one_acts_and_the_standby_takes_over_a_killed_ones_gang(peering, tenant):
    t = tenant(median_s=5.0, start=False)
    active_name, active, standby = _two_replicas(t, peering)

    spec, run = t.spec(4, zones=("us-central1-a",)), new_run()
    t.step("preflight", spec, run)
    t.step("warm_pool", spec, run)
    box: dict[str, Any] = {}
    th = threading.Thread(target=lambda: box.update(result=t.step("scale_up", spec, run)), daemon=True)
    th.start()
    wait_until("scale-up running", lambda: ((t.gang(run) or {}).get("status") or {}).get("phase")
               == "Provisioning" and _pools_total(t) == 4, timeout=30, every=0.05)
    assert t.resizes() == 1, t.sim.request_counts()  # one replica asked the cloud, once
    assert _descendants(active.pid), "the active replica runs the gang's work"
    assert not _descendants(standby.pid), "the standby runs nothing"

    active.kill()  # kill -9, mid-provisioning
    killed_at = time.monotonic()
    g = t.gang(run) or {}
    assert not gang.is_true(g, gang.PROVISIONED), g.get("status")
    handover, acting = _handover(t, peering, active_name, standby)
    th.join(90)
    ready = time.monotonic() - killed_at
    print(f"kill -9 -> peer record gone {handover:.1f}s, standby working {acting:.1f}s, gang Ready "
          f"{ready:.1f}s (peering lifetime {PEERING_LIFETIME_S}s)")
    assert handover <= PEERING_LIFETIME_S + 5, handover
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


def test_the_standby_takes_over_a_running_job_with_one_job_copy(peering, tenant):
    """The active replica is killed while the gang's job runs: the standby re-attaches to the train unit's job
    through its ledger; one job copy ever, no second resize, nothing left."""
    from kfp_gpu.cluster import pytorchjob
    from tests.integration.test_train_support import job_json, running_pods

    t = tenant()
    active_name, active, standby = _two_replicas(t, peering)
    spec, run = t.spec(2, zones=("us-central1-a",)), new_run()
    for s in ("preflight", "warm_pool", "scale_up"):
        t.step(s, spec, run)
    resizes = t.resizes()
    box: dict[str, Any] = {}
    th = threading.Thread(target=lambda: box.update(result=t.step(
        "train", spec, run, job_json=job_json(JOB_S), dataset_uri="", queue_timeout_s=60.0)), daemon=True)
    th.start()
    core, custom = client.CoreV1Api(t.kube.api), client.CustomObjectsApi(t.kube.api)
    job = pytorchjob.job_name(run, "train")
    wait_until("2 job pods running", lambda: running_pods(core, t.ns, job, 2), timeout=60)
    assert not _descendants(standby.pid), "the standby runs nothing"
    uid = custom.get_namespaced_custom_object("kubeflow.org", "v1", t.ns, "pytorchjobs", job)["metadata"]["uid"]
    active.kill()
    jobs_state = ((t.gang(run) or {}).get("status") or {}).get("jobs") or {}
    assert jobs_state.get("train", {}).get("state") == gang.JOB_RUNNING, jobs_state  # killed while the job runs
    handover, acting = _handover(t, peering, active_name, standby)
    th.join(90)
    print(f"kill -9 during the job -> peer record gone {handover:.1f}s, standby working {acting:.1f}s")
    assert "result" in box, f"{box}\n{t.controller_log()}"
    jobs = custom.list_namespaced_custom_object("kubeflow.org", "v1", t.ns, "pytorchjobs")["items"]
    assert [(j["metadata"]["name"], j["metadata"]["uid"]) for j in jobs] == [(job, uid)]  # the same job: one copy
    assert t.resizes() == resizes, t.sim.request_counts()  # the train takeover asked the cloud nothing
    t.step("teardown", spec, run)
    assert t.claimed(run) == []
    wait_until("no job left", lambda: not custom.list_namespaced_custom_object(
        "kubeflow.org", "v1", t.ns, "pytorchjobs")["items"], timeout=60)
    wait_until("pools back to 0", lambda: _pools_total(t) == 0, timeout=30)
