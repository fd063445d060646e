"""The run lifecycle under the realistic stand-in: overlapping preemptions, MIG recreation, on-demand fallback.

Everything is real: the GKE stand-in with its default (hard) world (async operations, boot latency in
minutes compressed by ``kfp_gpu_rehearsal.devcluster.worldtime.TIME_SCALE``, preemption notices, same-name VM recreation), the
google-cloud clients through GkeProvider, the local control plane with the Training Operator, and the steps
running as the controller's identity (kfp_gpu/manifests/controller-rbac.yaml).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kfp_gpu import ownership
from kfp_gpu.checkpoint.store import CheckpointStore
from kfp_gpu.cluster import ledger, pytorchjob
from kfp_gpu.ownership import LABEL_RUN_ID, label_safe
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Recovery, Target
from kfp_gpu.steps import scale_up, teardown
from kfp_gpu.steps.capacity import Capacity
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim import scenario as scenario_mod
from kfp_gpu_rehearsal.sim.server import SimServer
from tests.integration.test_train_support import StepThread, job_json, running_pods, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _world(kube: Kube, **changes: Any) -> SimServer:
    """The default scenario (the realistic world, untouched) under a cluster name of its own."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
    data["cluster"] = f"c{uuid.uuid4().hex[:6]}"
    data.update(changes)
    server = SimServer(scenario_mod.from_dict(data), kube.kubeconfig)
    server.start()
    return server


@pytest.fixture
def sim(kube: Kube) -> Iterator[SimServer]:
    server = _world(kube)
    yield server
    _stop(kube, server)


def _stop(kube: Kube, server: SimServer) -> None:
    server.stop()
    core = client.CoreV1Api(kube.api)
    for n in core.list_node(label_selector=f"kfp-gpu.io/sim-cluster={server.state.scenario.cluster}").items:
        core.delete_node(n.metadata.name)


class Copies(threading.Thread):
    """Samples, every 50 ms, how many PyTorchJobs of the run exist and how many of their pods are live."""

    def __init__(self, kube: Kube, namespace: str, run_id: str) -> None:
        super().__init__(daemon=True)
        self.kube, self.namespace, self.selector = kube, namespace, f"{LABEL_RUN_ID}={label_safe(run_id)}"
        self.max_jobs = self.max_pods = 0
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        core = client.CoreV1Api(self.kube.api)
        while not self._halt.is_set():
            jobs = self.kube.custom.list_namespaced_custom_object(
                pytorchjob.GROUP, pytorchjob.VERSION, self.namespace, pytorchjob.PLURAL,
                label_selector=self.selector)["items"]
            pods = [p for p in core.list_namespaced_pod(self.namespace, label_selector=ownership.JOB_LABEL).items
                    if p.metadata.deletion_timestamp is None and p.status.phase in ("Pending", "Running")]
            self.max_jobs = max(self.max_jobs, len(jobs))
            # two copies of a 4-node gang would show up as more than 4 live pods at once
            self.max_pods = max(self.max_pods, len(pods))
            self.samples += 1
            self._halt.wait(0.05)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(5)


def _spec(sim: SimServer, namespace: str, ckpt: Path, *, pools: tuple[str, ...] = (), **recovery: int
          ) -> ProvisioningSpec:
    return ProvisioningSpec(
        "a100-80gb", 4, capacity=CapacityType.SPOT,
        target=Target(kind="local", cluster=sim.state.scenario.cluster, region="us-central1", endpoint=sim.url,
                      namespace=namespace, pools=pools),
        zones=("us-central1-a", "us-central1-b"), scale_up_deadline_s=120, checkpoint_uri=str(ckpt),
        recovery=Recovery(**recovery),
    )


def _uid(kube: Kube, name: str) -> str:
    nodes = client.CoreV1Api(kube.api).list_node(field_selector=f"metadata.name={name}").items
    return str(nodes[0].metadata.uid) if nodes else ""


def _fresh_node(kube: Kube, name: str, old_uid: str) -> bool:
    """``name`` is a new Node (another uid than the preempted one) and Ready: the recreated VM is back. (The preempted
    Node lingers, Ready=False "node is shutting down", until its notice ends; GKE adds no taint.)"""
    nodes = client.CoreV1Api(kube.api).list_node(field_selector=f"metadata.name={name}").items
    return bool(nodes) and nodes[0].metadata.uid != old_uid and any(
        c.type == "Ready" and c.status == "True" for c in nodes[0].status.conditions or [])


def _train_ledger(kube: Kube, namespace: str, run: str) -> dict[str, Any]:
    return ledger.read(kube.api, namespace, run, "train")


def _assert_nothing_left(kube: Kube, sim: SimServer, namespace: str, run: str) -> None:
    """Zero leaked nodes, claims, jobs or ledgers once teardown ran (the MIGs converge asynchronously)."""
    sel = f"{LABEL_RUN_ID}={label_safe(run)}"
    core = client.CoreV1Api(kube.api)
    wait_until("no claimed nodes", lambda: not core.list_node(label_selector=sel).items, timeout=30)
    wait_until("stand-in pools back to 0", lambda: sum(len(p.nodes) for p in sim.state.pools.values()) == 0
               and all(p.target == 0 for p in sim.state.pools.values()), timeout=60)
    assert not ledger.list_for_run(kube.api, namespace, run)
    assert not kube.custom.list_namespaced_custom_object(
        pytorchjob.GROUP, pytorchjob.VERSION, namespace, pytorchjob.PLURAL, label_selector=sel)["items"]


def test_overlapping_preemptions_converge_with_one_job_copy_and_nothing_left(
    kube: Kube, namespace: str, sim: SimServer, step_api: client.ApiClient, tmp_path: Path,
) -> None:
    """1st preemption while training; a survivor preempted while that recovery is in flight; then the
    replacement itself preempted before the job is back. Exactly one job copy at every moment."""
    ckpt = tmp_path / "ckpt"
    spec = _spec(sim, namespace, ckpt, max_preemptions=5)
    run = f"run-{uuid.uuid4().hex[:6]}"
    provider = GkeProvider.from_target(spec.target)
    copies = Copies(kube, namespace, run)
    try:
        cap_json = scale_up.run(spec, run, "", api=step_api, provider=provider).output_json
        cap = Capacity.from_json(cap_json)
        th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(6.0), api=step_api)
        copies.start()
        th.start()
        job = pytorchjob.job_name(run, "train")
        wait_until("4 pods running", lambda: running_pods(kube.core, namespace, job, 4), timeout=120)
        CheckpointStore(str(ckpt)).save(15, {"w": b"15"}, meta={"loss": 3.0})
        first, second = cap.nodes[1], cap.nodes[2]
        first_uid = _uid(kube, first)
        sim.preempt(first)
        wait_until("recovery under way", lambda: len(_train_ledger(kube, namespace, run).get("preemptions", [])) >= 1,
                   timeout=60)
        sim.preempt(second)  # a survivor, while the first replacement is still booting
        # the first node's replacement (its instance group recreates it under the same name), preempted as soon
        # as it is back, before the job can be
        wait_until("first node recreated", lambda: _fresh_node(kube, first, first_uid), timeout=60)
        sim.preempt(first)
        out = json.loads(th.outcome(300).output_json)
        # the default pools are autoscaled and the spec says "protect": every node the run holds now, however
        # it was (re)claimed, is kept from the cluster-autoscaler's scale-down
        held = [n for p in out["capacity"]["placements"] for n in p["nodes"]]
        marks = {n: (kube.core.read_node(n).metadata.annotations or {}).get(
            "cluster-autoscaler.kubernetes.io/scale-down-disabled") for n in held}
    finally:
        copies.stop()
        teardown.run(spec, run, "", api=step_api, provider=provider)
    assert out["status"] == "Succeeded", out
    pre = out["ledger"]["preemptions"]
    lost = [n for p in pre for n in p["lost_nodes"]]
    assert lost.count(first) == 2 and second in lost, json.dumps(pre, indent=1)
    assert 2 <= out["preemptions"] <= 5, json.dumps(pre, indent=1)  # losses decided together count once
    assert [p for p in pre if p.get("during") == "recovery"], pre
    assert set(marks.values()) == {"true"}, marks
    final = [n for p in out["capacity"]["placements"] for n in p["nodes"]]
    assert len(set(final)) == 4, out["capacity"]
    assert all(p["replacement_nodes"] for p in pre), json.dumps(pre, indent=1)
    assert copies.samples > 20 and copies.max_jobs == 1 and copies.max_pods <= 4, vars(copies)
    _assert_nothing_left(kube, sim, namespace, run)


def test_killed_train_pod_is_retried_and_reattaches_without_a_second_copy_or_resize(
    kube: Kube, namespace: str, sim: SimServer, step_identity: Any, tmp_path: Path,
) -> None:
    """SIGKILL the train step's process mid-training (the pod died); its retry re-attaches to the same job."""
    import os
    import signal
    import subprocess
    import sys

    ckpt = tmp_path / "ckpt"
    spec = _spec(sim, namespace, ckpt, max_preemptions=2)
    run = f"run-{uuid.uuid4().hex[:6]}"
    provider = GkeProvider.from_target(spec.target)
    copies = Copies(kube, namespace, run)
    env = {**os.environ, "KUBECONFIG": str(step_identity.kubeconfig)}
    args = tmp_path / "args.json"
    out = tmp_path / "out.json"
    try:
        cap_json = scale_up.run(spec, run, "", api=step_identity.api, provider=provider).output_json
        args.write_text(json.dumps({"spec": spec.to_json(), "run_id": run, "capacity_json": cap_json,
                                    "job_json": job_json(8.0), "out": str(out)}))
        copies.start()
        cmd = [sys.executable, "-m", "tests.integration.train_proc", str(args)]
        first = subprocess.Popen(cmd, cwd=ROOT, env=env)
        job = pytorchjob.job_name(run, "train")
        wait_until("4 pods running", lambda: running_pods(kube.core, namespace, job, 4), timeout=120)
        uid = kube.custom.get_namespaced_custom_object(
            pytorchjob.GROUP, pytorchjob.VERSION, namespace, pytorchjob.PLURAL, job)["metadata"]["uid"]
        resizes = sim.request_counts()
        first.send_signal(signal.SIGKILL)  # no cleanup runs: the pod is gone
        first.wait(10)
        retry = subprocess.run(cmd, cwd=ROOT, env=env, timeout=180, capture_output=True, text=True)
        assert retry.returncode == 0, retry.stderr[-2000:]
        result = json.loads(out.read_text())
        after = sim.request_counts()
    finally:
        copies.stop()
        teardown.run(spec, run, "", api=step_identity.api, provider=provider)
    assert result["status"] == "Succeeded" and result["attempts"] == 2, result
    events = json.loads(result["timeline"])["events"]
    # the retry attached to the job the killed process created, and created none of its own
    assert [e["job"] for e in events if e["kind"] == "job-attached"] == [job], events
    assert not [e for e in events if e["kind"] == "job-created"], events
    assert copies.max_jobs == 1 and copies.max_pods <= 4, vars(copies)
    assert {k: v for k, v in after.items() if "setSize" in k} == {k: v for k, v in resizes.items() if "setSize" in k}
    assert uid
    _assert_nothing_left(kube, sim, namespace, run)


def _stockout_now(sim: SimServer, zone: str) -> None:
    """The zone runs out of stock from now on (the world's clock; windows are in real-world seconds)."""
    import dataclasses

    from kfp_gpu_rehearsal.sim.clock import expand
    from kfp_gpu_rehearsal.sim.eventspec import Stockout

    with sim.state.lock:
        sc = sim.state.scenario
        sim.state.scenario = dataclasses.replace(
            sc, stockouts=(*sc.stockouts, Stockout(zone, start_s=expand(sim.state.elapsed()))))


def test_stockout_while_replacing_fails_over_without_the_stuck_recreation(
    kube: Kube, namespace: str, sim: SimServer, step_api: client.ApiClient, tmp_path: Path,
) -> None:
    """Zone a stocks out; a spot node there is preempted. Its instance group cannot recreate it (listErrors:
    ZONE_RESOURCE_POOL_EXHAUSTED), so recovery gives that slot up and replaces the node in zone b."""
    ckpt = tmp_path / "ckpt"
    spec = _spec(sim, namespace, ckpt, max_preemptions=3)
    run = f"run-{uuid.uuid4().hex[:6]}"
    provider = GkeProvider.from_target(spec.target)
    copies = Copies(kube, namespace, run)
    try:
        cap_json = scale_up.run(spec, run, "", api=step_api, provider=provider).output_json
        cap = Capacity.from_json(cap_json)
        assert [p.zone for p in cap.placements] == ["us-central1-a"], cap
        th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(6.0), api=step_api)
        copies.start()
        th.start()
        job = pytorchjob.job_name(run, "train")
        wait_until("4 pods running", lambda: running_pods(kube.core, namespace, job, 4), timeout=120)
        _stockout_now(sim, "us-central1-a")
        victim = cap.nodes[0]
        sim.preempt(victim)
        out = json.loads(th.outcome(300).output_json)
        targets = {name: p.target for name, p in sim.state.pools.items() if p.target}
    finally:
        copies.stop()
        teardown.run(spec, run, "", api=step_api, provider=provider)
    assert out["status"] == "Succeeded" and out["preemptions"] == 1, out
    zones = {p["zone"]: p["nodes"] for p in out["capacity"]["placements"]}
    assert len(zones.get("us-central1-b", [])) == 1 and victim not in zones.get("us-central1-a", []), zones
    # the stuck recreation was given up: spot-a holds 3, spot-b 1; nothing over-provisioned
    assert targets == {"a100-80gb-spot-a": 3, "a100-80gb-spot-b": 1}, targets
    assert copies.max_jobs == 1 and copies.max_pods <= 4, vars(copies)
    _assert_nothing_left(kube, sim, namespace, run)


def test_on_demand_fallback_uses_the_clusters_on_demand_pool_for_real(
    kube: Kube, namespace: str, sim: SimServer, step_api: client.ApiClient, tmp_path: Path,
) -> None:
    """The spec lists only spot pools; after recovery.on_demand_after=1 preemption the replacement comes from
    the cluster's on-demand a100 pool, and the spot group's recreation of the lost VM is given up."""
    ckpt = tmp_path / "ckpt"
    spec = _spec(sim, namespace, ckpt, pools=("a100-80gb-spot-a", "a100-80gb-spot-b"), max_preemptions=2,
                 on_demand_after=1)
    run = f"run-{uuid.uuid4().hex[:6]}"
    provider = GkeProvider.from_target(spec.target)
    try:
        cap_json = scale_up.run(spec, run, "", api=step_api, provider=provider).output_json
        cap = Capacity.from_json(cap_json)
        th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(6.0), api=step_api)
        th.start()
        job = pytorchjob.job_name(run, "train")
        wait_until("4 pods running", lambda: running_pods(kube.core, namespace, job, 4), timeout=120)
        victim = cap.nodes[2]
        sim.preempt(victim)
        out = json.loads(th.outcome(300).output_json)
        targets = {name: p.target for name, p in sim.state.pools.items() if p.target}
    finally:
        teardown.run(spec, run, "", api=step_api, provider=provider)
    assert out["status"] == "Succeeded" and out["on_demand"] is True, out
    pools = {p["pool"]: p["nodes"] for p in out["capacity"]["placements"]}
    assert len(pools.get("a100-80gb-a", [])) == 1, pools  # on-demand, same zone as the lost spot node
    assert targets == {"a100-80gb-spot-a": 3, "a100-80gb-a": 1}, targets
    _assert_nothing_left(kube, sim, namespace, run)


def test_run_longer_than_its_lease_survives_the_janitor_running_in_a_loop(
    kube: Kube, namespace: str, sim: SimServer, step_api: client.ApiClient, janitor_api: client.ApiClient,
    tmp_path: Path,
) -> None:
    """lease_ttl_s=10 s, training ~25 s, `kfp-gpu gc` sweeping every second beside it as the janitor's
    ServiceAccount: the run's GpuGang (no heartbeat) keeps it the controller's, nothing is released, the run
    succeeds."""
    from kfp_gpu.gang import api as gang
    from kfp_gpu.steps import janitor
    from kfp_gpu.steps.janitor import GcReport

    ckpt = tmp_path / "ckpt"
    spec = _spec(sim, namespace, ckpt, max_preemptions=1).replace(lease_ttl_s=10.0)
    run = f"run-{uuid.uuid4().hex[:6]}"
    provider = GkeProvider.from_target(spec.target)
    reports: list[GcReport] = []
    halt = threading.Event()

    def sweep() -> None:
        while not halt.is_set():
            reports.append(janitor.collect(namespace, api=janitor_api, provider=provider))
            halt.wait(1.0)

    gc = threading.Thread(target=sweep, daemon=True)
    copies = Copies(kube, namespace, run)
    custom = client.CustomObjectsApi(kube.api)  # the gang as the run's first step opens it (no controller here)
    custom.create_namespaced_custom_object(gang.GROUP, gang.VERSION, namespace, gang.PLURAL,
                                           gang.body(run, namespace, spec.to_json(), {"local": "local:test:1"}))
    try:
        cap_json = scale_up.run(spec, run, "", api=step_api, provider=provider).output_json
        gc.start()
        copies.start()
        t0 = time.time()
        th = StepThread(spec=spec, run_id=run, capacity_json=cap_json, job_json=job_json(25.0), api=step_api)
        th.start()
        out = json.loads(th.outcome(300).output_json)
        trained = time.time() - t0
    finally:
        halt.set()
        gc.join(30)
        copies.stop()
        teardown.run(spec, run, "", api=step_api, provider=provider)
        custom.delete_namespaced_custom_object(gang.GROUP, gang.VERSION, namespace, gang.PLURAL, gang.gang_name(run))
    assert out["status"] == "Succeeded" and out["attempts"] == 1, out
    assert trained > 2 * spec.lease_ttl_s, trained
    label = label_safe(run)
    seen = [r.runs.get(label) for r in reports if label in r.runs]
    assert len(seen) >= 15 and set(seen) == {"live"}, [str(r) for r in reports][-3:]
    # live because the gang exists, though every lease label expired after 10 s (nothing renews them)
    why = [r.reasons.get(label, "") for r in reports if label in r.runs]
    assert all(w.startswith(f"GpuGang {namespace}/{gang.gang_name(run)} exists") for w in why), why
    assert not [o for r in reports for o in r.orphans if label in o or "gke-" in o], [r.orphans for r in reports]
    assert copies.max_jobs == 1, vars(copies)
    _assert_nothing_left(kube, sim, namespace, run)
