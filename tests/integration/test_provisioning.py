"""End-to-end provisioning against the real control plane + KWOK + the GKE stand-in (the fault table).

The steps run as the controller's identity (kfp_gpu/manifests/controller-rbac.yaml; ``Env.step_api``, a
token-only client); ``Env.api`` is the admin, for assertions. The stand-in (the cloud) keeps the admin kubeconfig.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from kfp_gpu.cluster import ledger
from kfp_gpu.cluster.nodes import run_toleration
from kfp_gpu.errors import CapacityUnavailable, ProvisioningTimeout
from kfp_gpu.ownership import BALLOON_LABEL, LABEL_RUN_ID, label_safe
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target, WarmPool
from kfp_gpu.steps import janitor, scale_up, teardown, warm_pool
from kfp_gpu_rehearsal.sim.server import SimServer
from tests.integration.controller_support import scenario
from tests.integration.rbac_support import Identity
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


class Env:
    def __init__(self, kube, namespace: str, sim: SimServer, cluster: str, step: Identity) -> None:
        self.kube, self.ns, self.sim, self.cluster = kube, namespace, sim, cluster
        self.api = kube.api  # admin: setup and assertions
        self.step = step
        self.step_api = step.api  # what the steps run with

    def spec(self, nodes: int = 4, *, zones=("us-central1-a", "us-central1-b"), deadline: float = 30.0,
             warm: int = 0, pools=()) -> ProvisioningSpec:
        return ProvisioningSpec(
            "a100-80gb", nodes, capacity=CapacityType.SPOT,
            target=Target(kind="local", cluster=self.cluster, region="us-central1", endpoint=self.sim.url,
                          namespace=self.ns, pools=tuple(pools)),
            zones=zones, scale_up_deadline_s=deadline, warm_pool=WarmPool(nodes=warm, ttl_s=600),
        )

    def provider(self, spec: ProvisioningSpec) -> GkeProvider:
        return GkeProvider.from_target(spec.target)

    def pool_size(self, pool: str) -> int:
        return int(self.sim.state.pools[pool].target) if pool in self.sim.state.pools else -1

    def nodes(self, selector: str = "") -> list[client.V1Node]:
        sel = f"kfp-gpu.io/sim-cluster={self.cluster}" + (f",{selector}" if selector else "")
        return client.CoreV1Api(self.api).list_node(label_selector=sel).items

    def leftovers(self, run_id: str) -> dict[str, list[str]]:
        sel = f"{LABEL_RUN_ID}={label_safe(run_id)}"
        core = client.CoreV1Api(self.api)
        jobs = client.CustomObjectsApi(self.api).list_namespaced_custom_object(
            "kubeflow.org", "v1", self.ns, "pytorchjobs", label_selector=sel)["items"]
        return {
            "ledgers": [c.metadata.name for c in ledger.list_for_run(self.api, self.ns, run_id)],
            "balloons": [p.metadata.name for p in core.list_namespaced_pod(self.ns, label_selector=sel).items],
            "claimed_nodes": [n.metadata.name for n in self.nodes(sel)],
            "jobs": [j["metadata"]["name"] for j in jobs],
        }

    def wait_pool(self, pool: str, size: int, timeout: float = 20.0) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if self.pool_size(pool) == size and len(self.nodes(f"cloud.google.com/gke-nodepool={pool}")) == size:
                return
            time.sleep(0.1)
        raise AssertionError(f"pool {pool} size {self.pool_size(pool)} nodes "
                             f"{len(self.nodes(f'cloud.google.com/gke-nodepool={pool}'))} != {size}")


_scenario = scenario  # the bundled scenario, renamed per test, fast boots (controller_support.scenario)


@pytest.fixture
def env(kube, namespace, step_identity):
    sims: list[tuple[SimServer, str]] = []

    def make(**changes) -> Env:
        cluster = f"c{uuid.uuid4().hex[:6]}"
        sim = SimServer(_scenario(cluster, **changes), kube.kubeconfig)
        sim.start()
        sims.append((sim, cluster))
        return Env(kube, namespace, sim, cluster, step_identity)

    yield make
    core = client.CoreV1Api(kube.api)
    for sim, cluster in sims:
        sim.stop()
        for n in core.list_node(label_selector=f"kfp-gpu.io/sim-cluster={cluster}").items:
            core.delete_node(n.metadata.name)


def test_scale_up_makes_the_gang_ready_and_teardown_restores(env):
    e = env()
    spec = e.spec(4)
    run = f"run-{uuid.uuid4().hex[:6]}"
    res = scale_up.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    cap = json.loads(res.output_json)
    assert sum(len(p["nodes"]) for p in cap["placements"]) == 4
    assert {p["zone"] for p in cap["placements"]} == {"us-central1-a"}  # whole gang in one zone
    assert res.metrics["nodes_ready"] == 4
    assert len(e.nodes(f"{LABEL_RUN_ID}={label_safe(run)}")) == 4
    tl = json.loads(cap["timeline"])
    assert all({"requested", "registered", "ready"} <= set(n["times"]) for n in tl["nodes"])
    out = teardown.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    assert json.loads(out.output_json)["pools_restored"] == {"a100-80gb-spot-a|us-central1-a": 0}
    e.wait_pool("a100-80gb-spot-a", 0)
    assert e.leftovers(run) == {"ledgers": [], "balloons": [], "claimed_nodes": [], "jobs": []}
    again = teardown.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    assert json.loads(again.output_json)["noop"] is True


def test_stockout_in_first_zone_fails_over_to_second(env):
    e = env(stockouts=[{"zone": "us-central1-a", "window": "always"}])
    spec = e.spec(2)
    run = f"run-{uuid.uuid4().hex[:6]}"
    cap = json.loads(scale_up.run(spec, run, "", api=e.step_api, provider=e.provider(spec)).output_json)
    assert {p["zone"] for p in cap["placements"]} == {"us-central1-b"}
    hist = ledger.read(e.api, e.ns, run, "scale_up")["failover"]["history"]
    assert hist[0]["zone"] == "us-central1-a" and hist[0]["error"] == "CapacityUnavailable"
    teardown.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    e.wait_pool("a100-80gb-spot-b", 0)
    assert e.pool_size("a100-80gb-spot-a") == 0


def test_stockout_everywhere_fails_with_history(env):
    e = env(stockouts=[{"zone": z, "window": "always"} for z in ("us-central1-a", "us-central1-b")])
    spec = e.spec(2)
    with pytest.raises(CapacityUnavailable) as ei:
        scale_up.run(spec, "run-x", "", api=e.step_api, provider=e.provider(spec))
    assert [h["zone"] for h in ei.value.fields["failover_history"]] == ["us-central1-a", "us-central1-b"]
    teardown.run(spec, "run-x", "", api=e.step_api, provider=e.provider(spec))


def test_deadline_exceeded_rolls_back_to_the_original_size(env):
    e = env()
    spec = e.spec(3, deadline=0.05)
    run = f"run-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ProvisioningTimeout) as ei:
        scale_up.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    assert "timeline" in ei.value.fields
    e.wait_pool("a100-80gb-spot-a", 0)


def _step_proc(step: str, spec: ProvisioningSpec, run: str, kubeconfig: Path,
               upstream: str = "") -> subprocess.Popen[str]:
    """A work unit in its own process, reaching the cluster through ``kubeconfig`` (the controller's identity)."""
    code = ("import sys\nfrom kfp_gpu.controller.work import execute\n"
            f"raise SystemExit(execute({step!r}, sys.argv[1], {run!r}, sys.argv[2]))\n")
    return subprocess.Popen([sys.executable, "-c", code, spec.to_json(), upstream], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "KUBECONFIG": str(kubeconfig)})


_wait_for = functools.partial(wait_until, "the condition", timeout=30.0, every=0.05)


def test_sigkill_then_retry_does_not_double_resize(env):
    e = env()
    spec = e.spec(4, deadline=60)
    run = f"run-{uuid.uuid4().hex[:6]}"
    proc = _step_proc("scale_up", spec, run, e.step.kubeconfig)
    _wait_for(lambda: ledger.read(e.api, e.ns, run, "scale_up").get("targets"))
    _wait_for(lambda: e.pool_size("a100-80gb-spot-a") == 4)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    res = scale_up.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    assert res.metrics["nodes_ready"] == 4
    assert e.pool_size("a100-80gb-spot-a") == 4
    assert len(e.nodes("cloud.google.com/gke-nodepool=a100-80gb-spot-a")) == 4
    teardown.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    e.wait_pool("a100-80gb-spot-a", 0)


@pytest.mark.parametrize("step", ["warm_pool", "scale_up"])
def test_cancel_then_teardown_leaves_nothing(env, step):
    e = env()
    spec = e.spec(4, deadline=60, warm=2)
    run = f"run-{uuid.uuid4().hex[:6]}"
    proc = _step_proc(step, spec, run, e.step.kubeconfig)
    _wait_for(lambda: ledger.read(e.api, e.ns, run, step).get("targets"))
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode not in (0, None), err
    teardown.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    assert e.leftovers(run) == {"ledgers": [], "balloons": [], "claimed_nodes": [], "jobs": []}
    e.wait_pool("a100-80gb-spot-a", 0)


def test_warm_pool_balloons_are_labelled_and_preempted_by_training_pods(env):
    e = env()
    spec = e.spec(2, warm=2, zones=("us-central1-a",))
    run = f"run-{uuid.uuid4().hex[:6]}"
    out = json.loads(warm_pool.run(spec, run, "", api=e.step_api, provider=e.provider(spec)).output_json)
    assert len(out["balloons"]) == 2
    core = client.CoreV1Api(e.api)
    pods = core.list_namespaced_pod(e.ns, label_selector=f"{BALLOON_LABEL}=true").items
    assert all(p.metadata.labels[LABEL_RUN_ID] == label_safe(run) and "kfp-gpu.io/lease-expires" in p.metadata.labels
               for p in pods)
    _wait_for(lambda: all(p.spec.node_name for p in core.list_namespaced_pod(
        e.ns, label_selector=f"{BALLOON_LABEL}=true").items))
    cap = json.loads(scale_up.run(spec, run, "", api=e.step_api, provider=e.provider(spec)).output_json)
    assert e.pool_size("a100-80gb-spot-a") == 2  # the warm nodes are the gang: no extra resize
    node = cap["placements"][0]["nodes"][0]
    real = client.V1Pod(
        metadata=client.V1ObjectMeta(name="trainer-0"),
        spec=client.V1PodSpec(node_selector={"kubernetes.io/hostname": node}, containers=[client.V1Container(
            name="t", image="x", resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "8"}))],
            tolerations=[client.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
                         client.V1Toleration(**run_toleration(run, spec.target.namespace))]))  # the run's own pod: tolerates its claim
    core.create_namespaced_pod(e.ns, real)
    _wait_for(lambda: core.read_namespaced_pod("trainer-0", e.ns).spec.node_name == node)
    teardown.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    assert e.leftovers(run)["balloons"] == []


def test_parallel_runs_teardown_only_their_own(env):
    e = env()
    a, b = f"run-a-{uuid.uuid4().hex[:4]}", f"run-b-{uuid.uuid4().hex[:4]}"
    spec = e.spec(2, zones=("us-central1-a",))
    scale_up.run(spec, a, "", api=e.step_api, provider=e.provider(spec))
    scale_up.run(spec, b, "", api=e.step_api, provider=e.provider(spec))
    assert e.pool_size("a100-80gb-spot-a") == 4
    b_nodes = {n.metadata.name for n in e.nodes(f"{LABEL_RUN_ID}={label_safe(b)}")}
    assert len(b_nodes) == 2
    teardown.run(spec, a, "", api=e.step_api, provider=e.provider(spec))
    e.wait_pool("a100-80gb-spot-a", 2)
    assert {n.metadata.name for n in e.nodes(f"{LABEL_RUN_ID}={label_safe(b)}")} == b_nodes
    assert ledger.list_for_run(e.api, e.ns, b)
    teardown.run(spec, b, "", api=e.step_api, provider=e.provider(spec))
    e.wait_pool("a100-80gb-spot-a", 0)


def test_gc_reclaims_runs_whose_exit_handler_never_ran(env, janitor_api):
    e = env()
    spec = e.spec(2, warm=1, zones=("us-central1-a",))
    run = f"run-{uuid.uuid4().hex[:6]}"
    warm_pool.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    scale_up.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    dry = janitor.collect(e.ns, dry_run=True, api=janitor_api, provider=e.provider(spec))
    assert dry.runs[label_safe(run)] == "live"  # leases not expired yet: nothing touched
    later = time.time() + spec.lease_ttl_s + 1
    rep = janitor.collect(e.ns, api=janitor_api, provider=e.provider(spec), now=later)
    assert rep.runs[label_safe(run)] == "released"
    assert e.leftovers(run) == {"ledgers": [], "balloons": [], "claimed_nodes": [], "jobs": []}
    e.wait_pool("a100-80gb-spot-a", 0)
