"""A tenant namespace with the kfp-gpu controller running beside it, as `kfp-gpu run` arranges it: the controller
as its own process under its ServiceAccount token, the steps (``gang_client.request``) as the namespace's
``kfp-gpu`` ServiceAccount, and a GKE stand-in whose node pools become KWOK nodes."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu.gang import api as gang
from kfp_gpu.gang import client as gang_client
from kfp_gpu.ownership import LABEL_RUN_ID, label_safe
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target
from kfp_gpu.steps.result import StepResult
from kfp_gpu_rehearsal.devcluster import controller as local_controller
from kfp_gpu_rehearsal.devcluster import crds
from kfp_gpu_rehearsal.devcluster.client import Kube
from kfp_gpu_rehearsal.sim import scenario as scenario_mod
from kfp_gpu_rehearsal.sim.server import SimServer
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def scenario(cluster: str, median_s: float = 0.3, **changes: Any) -> Any:
    """The bundled scenario, renamed so parallel tests never share nodes, with fast boots."""
    data = yaml.safe_load((ROOT / "kfp_gpu_rehearsal/sim/scenarios/default.yaml").read_text())
    data["cluster"] = cluster
    for i, p in enumerate(data["pools"]):
        p["boot"] = {"dist": "lognormal", "median_s": median_s, "sigma": 0.3, "seed": i}
    data.update(changes)
    return scenario_mod.from_dict(data)


@dataclass
class Tenant:
    kube: Kube
    ns: str
    sim: SimServer
    cluster: str
    workdir: Path
    ctl_kubeconfig: Path
    step_kubeconfig: Path
    controllers: list[local_controller.LocalController] = field(default_factory=list)

    @property
    def step_api(self) -> client.ApiClient:
        return crds.api_client(self.step_kubeconfig)

    def start_controller(self) -> local_controller.LocalController:
        ctl = local_controller.LocalController(self.ctl_kubeconfig, [self.ns],
                                               self.workdir / f"controller-{len(self.controllers)}.log").start()
        self.controllers.append(ctl)
        return ctl

    def controller_log(self) -> str:
        return "\n".join(c.log_path.read_text(errors="replace")[-4000:] for c in self.controllers
                         if c.log_path.exists())

    def spec(self, nodes: int = 2, *, zones: tuple[str, ...] = ("us-central1-a", "us-central1-b"),
             deadline: float = 60.0, checkpoint_uri: str = "") -> ProvisioningSpec:
        return ProvisioningSpec("a100-80gb", nodes, capacity=CapacityType.SPOT, zones=zones,
                                scale_up_deadline_s=deadline, checkpoint_uri=checkpoint_uri,
                                target=Target(kind="local", cluster=self.cluster, region="us-central1",
                                              endpoint=self.sim.url, namespace=self.ns))

    def step(self, step: str, spec: ProvisioningSpec, run: str, **kwargs: Any) -> StepResult:
        api = self.step_api
        try:
            return gang_client.request(step, spec, spec.to_json(), run, api, **kwargs)
        finally:
            api.close()

    def gang(self, run: str) -> dict[str, Any] | None:
        try:
            return dict(client.CustomObjectsApi(self.kube.api).get_namespaced_custom_object(
                gang.GROUP, gang.VERSION, self.ns, gang.PLURAL, gang.gang_name(run)))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def claimed(self, run: str) -> list[str]:
        sel = f"{LABEL_RUN_ID}={label_safe(run)}"
        return [n.metadata.name for n in client.CoreV1Api(self.kube.api).list_node(label_selector=sel).items]

    def sim_nodes(self) -> list[str]:
        sel = f"kfp-gpu.io/sim-cluster={self.cluster}"
        return [n.metadata.name for n in client.CoreV1Api(self.kube.api).list_node(label_selector=sel).items]

    def pool_target(self, pool: str) -> int:
        return int(self.sim.state.pools[pool].target) if pool in self.sim.state.pools else -1

    def resizes(self) -> int:
        return sum(v for k, v in self.sim.request_counts().items() if "setSize" in k)

    def work_processes(self) -> list[int]:
        """Processes running with the controller's credentials other than a live controller: its forkserver and
        work units."""
        mine = f"KUBECONFIG={self.ctl_kubeconfig}".encode()
        live = {c.proc.pid for c in self.controllers if c.proc is not None and c.proc.poll() is None}
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) in live:
                continue
            try:
                env = (d / "environ").read_bytes().split(b"\0")
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if mine in env and state != "Z":
                out.append(int(d.name))
        return out


def new_run() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def tenant(kube: Kube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Tenant]]:
    from kfp_gpu.cluster import ledger

    # the controller keeps the gangs' ledgers in its namespace (kfp_gpu/cluster/ledger.py): a test that reads one
    # (ledger.read with the gang's namespace) looks there, as the controller's work units do
    monkeypatch.setenv(ledger.HOME_ENV, gang.CONTROLLER_NAMESPACE)
    made: list[Tenant] = []

    def make(max_gpus_per_gang: int = 64, max_gpus: int = 128, median_s: float = 0.3, start: bool = True,
             **scenario_changes: Any) -> Tenant:
        ns = f"tc-{uuid.uuid4().hex[:8]}"
        work = tmp_path / ns
        ctl_kc, step_kc = local_controller.prepare(kube.api, ns, work, max_gpus_per_gang=max_gpus_per_gang,
                                                   max_gpus_per_namespace=max_gpus)
        cluster = f"c{uuid.uuid4().hex[:6]}"
        sim = SimServer(scenario(cluster, median_s, **scenario_changes), kube.kubeconfig)
        sim.start()
        t = Tenant(kube, ns, sim, cluster, work, ctl_kc, step_kc)
        made.append(t)
        if start:
            t.start_controller()
        return t

    yield make
    from kfp_gpu import install

    custom, core = client.CustomObjectsApi(kube.api), client.CoreV1Api(kube.api)
    for t in made:
        live = [c for c in t.controllers if c.proc is not None and c.proc.poll() is None]
        if not live:
            t.start_controller()
        for g in custom.list_namespaced_custom_object(gang.GROUP, gang.VERSION, t.ns, gang.PLURAL)["items"]:
            custom.delete_namespaced_custom_object(gang.GROUP, gang.VERSION, t.ns, gang.PLURAL,
                                                   g["metadata"]["name"])
        try:
            wait_until("gangs released", lambda t=t: not custom.list_namespaced_custom_object(
                gang.GROUP, gang.VERSION, t.ns, gang.PLURAL)["items"], timeout=120)
        finally:
            for c in t.controllers:
                c.stop()
            t.sim.stop()
            for n in t.sim_nodes():
                core.delete_node(n)
            install.tenant_remove(kube.api, t.ns)
            core.delete_namespace(t.ns, propagation_policy="Background")


def small(output_json: str) -> bool:
    """A step output that names the gang and nothing that grows with it."""
    return len(output_json) < 512 and json.loads(output_json).get("gang", "") != ""


def wait_gone(t: Tenant, run: str, timeout: float = 60.0) -> float:
    t0 = time.monotonic()
    wait_until("gang gone", lambda: t.gang(run) is None, timeout=timeout)
    return time.monotonic() - t0


@pytest.fixture
def lease(kube: Kube) -> Iterator[str]:
    """A Lease name of this test's own (the Deployment's is kfp-gpu-controller), so parallel worlds never elect
    each other, and a Role granting the controller get/update on that name only, as the shipped Role does for
    kfp-gpu-controller (an operator who renames the Lease adds its name the same way). Requested before
    ``tenant``, it outlives the tenant's clean-up (which needs a replica working)."""
    name = f"kfp-gpu-test-{uuid.uuid4().hex[:8]}"
    ns, rbac = gang.CONTROLLER_NAMESPACE, client.RbacAuthorizationV1Api(kube.api)
    meta = {"name": name, "namespace": ns, "labels": {"kfp-gpu.io/managed": "true"}}
    rbac.create_namespaced_role(ns, {"metadata": meta, "rules": [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [name],
         "verbs": ["get", "update"]}]})
    rbac.create_namespaced_role_binding(ns, {
        "metadata": meta, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": gang.CONTROLLER_SA, "namespace": ns}]})
    yield name
    coord = client.CoordinationV1Api(kube.api)
    for delete in (lambda: coord.delete_namespaced_lease(name, ns), lambda: rbac.delete_namespaced_role(name, ns),
                   lambda: rbac.delete_namespaced_role_binding(name, ns)):
        try:
            delete()
        except ApiException as exc:
            if exc.status != 404:
                raise


def lease_spec(t: Any, name: str) -> dict[str, Any]:
    try:
        obj = client.CoordinationV1Api(t.kube.api).read_namespaced_lease(name, gang.CONTROLLER_NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    s = obj.spec
    return {"holder": s.holder_identity or "", "transitions": s.lease_transitions or 0,
            "duration": s.lease_duration_seconds}


def holder(t: Any, lease: str, replicas: Iterable[str]) -> str:
    """The replica (POD_NAME) holding the Lease; its holderIdentity is ``<POD_NAME>_<uuid>``."""
    held = lease_spec(t, lease).get("holder", "")
    return next((n for n in replicas if held.startswith(f"{n}_")), "")
