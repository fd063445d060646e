"""An autoscaled node pool is protected or refused as ``target.autoscaled_pools`` says (issue 13, node-pool).

Real control plane + KWOK + the GKE stand-in; the steps run as the controller's identity (``step_api``). The
stand-in reports the pool's ``autoscaling`` block in nodePools.get/list as GKE does; no autoscaler runs, so
the annotation is checked on the Nodes and the resizes are counted in the stand-in's own operations.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kfp_gpu.cluster.nodes import SCALE_DOWN_DISABLED
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.ownership import LABEL_RUN_ID, PROTECTED_BY, label_safe
from kfp_gpu.providers.gke import GkeProvider
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target
from kfp_gpu.steps import scale_up, teardown
from kfp_gpu_rehearsal.sim import scenario as scenario_mod
from kfp_gpu_rehearsal.sim.server import SimServer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
POOL = "a100-80gb-spot-a"


@pytest.fixture
def world(kube):
    """make(autoscaled) -> (sim, cluster): the bundled scenario, renamed, fast boots, with POOL's autoscaling
    set explicitly (the other pools as the bundled scenario has them)."""
    made: list[tuple[SimServer, str]] = []

    def make(autoscaled: bool) -> tuple[SimServer, str]:
        cluster = f"c{uuid.uuid4().hex[:6]}"
        data = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
        data["cluster"] = cluster
        for i, p in enumerate(data["pools"]):
            p["boot"] = {"dist": "lognormal", "median_s": 0.3, "sigma": 0.3, "seed": i}
            if p["name"] == POOL:
                p["autoscaling"] = {"enabled": autoscaled, "min_nodes": 0, "max_nodes": 16}
        sim = SimServer(scenario_mod.from_dict(data), kube.kubeconfig)
        sim.start()
        made.append((sim, cluster))
        return sim, cluster

    yield make
    core = client.CoreV1Api(kube.api)
    for sim, cluster in made:
        sim.stop()
        for n in core.list_node(label_selector=f"kfp-gpu.io/sim-cluster={cluster}").items:
            core.delete_node(n.metadata.name)


def _spec(sim: SimServer, cluster: str, ns: str, policy: str, nodes: int = 2) -> ProvisioningSpec:
    return ProvisioningSpec(
        "a100-80gb", nodes, capacity=CapacityType.SPOT,
        target=Target(kind="local", cluster=cluster, region="us-central1", endpoint=sim.url, namespace=ns,
                      autoscaled_pools=policy),
        zones=("us-central1-a",), scale_up_deadline_s=30.0,
    )


def _nodes(api: client.ApiClient, cluster: str) -> list[client.V1Node]:
    return client.CoreV1Api(api).list_node(label_selector=f"kfp-gpu.io/sim-cluster={cluster}").items


def _set_size_ops(sim: SimServer) -> int:
    return sum(1 for op in list(sim.state.gke_ops.values()) if op.get("operationType") == "SET_NODE_POOL_SIZE")


def _annotated(api: client.ApiClient, cluster: str) -> dict[str, dict[str, str]]:
    return {n.metadata.name: {k: v for k, v in (n.metadata.annotations or {}).items()
                              if k in (SCALE_DOWN_DISABLED, PROTECTED_BY)}
            for n in _nodes(api, cluster) if SCALE_DOWN_DISABLED in (n.metadata.annotations or {})}


def test_protect_annotates_the_held_nodes_and_teardown_removes_it(kube, namespace, step_api, world):
    sim, cluster = world(autoscaled=True)
    spec = _spec(sim, cluster, namespace, "protect")
    assert any(p.autoscaling for p in GkeProvider.from_target(spec.target).pools("us-central1")
               if p.ref.pool == POOL)
    run = f"run-{uuid.uuid4().hex[:6]}"
    scale_up.run(spec, run, "", api=step_api, provider=GkeProvider.from_target(spec.target))
    held = [n.metadata.name for n in _nodes(kube.api, cluster)
            if (n.metadata.labels or {}).get(LABEL_RUN_ID) == label_safe(run)]
    assert len(held) == 2
    assert _annotated(kube.api, cluster) == {
        name: {SCALE_DOWN_DISABLED: "true", PROTECTED_BY: label_safe(run)} for name in held}
    teardown.run(spec, run, "", api=step_api, provider=GkeProvider.from_target(spec.target))
    assert _annotated(kube.api, cluster) == {}  # none left on any node, deleted or still there
    wait_until("pool restored to 0", lambda: sim.state.pools[POOL].target == 0, 20.0)


def test_protect_leaves_a_pool_without_autoscaling_unannotated(kube, namespace, step_api, world):
    sim, cluster = world(autoscaled=False)
    spec = _spec(sim, cluster, namespace, "protect")
    run = f"run-{uuid.uuid4().hex[:6]}"
    scale_up.run(spec, run, "", api=step_api, provider=GkeProvider.from_target(spec.target))
    assert len([n for n in _nodes(kube.api, cluster)
                if (n.metadata.labels or {}).get(LABEL_RUN_ID) == label_safe(run)]) == 2
    assert _annotated(kube.api, cluster) == {}
    teardown.run(spec, run, "", api=step_api, provider=GkeProvider.from_target(spec.target))


def test_refuse_fails_before_any_resize_naming_the_pool(namespace, step_api, world):
    sim, cluster = world(autoscaled=True)
    spec = _spec(sim, cluster, namespace, "refuse")
    run = f"run-{uuid.uuid4().hex[:6]}"
    with pytest.raises(InvalidSpec) as err:
        scale_up.run(spec, run, "", api=step_api, provider=GkeProvider.from_target(spec.target))
    text = str(err.value)
    assert "\n" not in text
    assert f"node pool {POOL} (us-central1-a) is autoscaled" in text
    assert "autoscaled_pools='protect'" in text and "ProvisioningRequest" in text
    assert _set_size_ops(sim) == 0
    assert sim.state.pools[POOL].target == 0
