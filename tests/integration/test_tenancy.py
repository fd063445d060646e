"""Tenancy on the local control plane: `kfp-gpu install` (no controller), `kfp-gpu tenant add` for two fresh
namespaces, then what a tenant's step identity (ServiceAccount kfp-gpu, a TokenRequest token) may and may not do,
the GpuGang CRD's own rules, and the claim-toleration admission policy.

Install is idempotent and shared: the CRDs, ClusterRoles and admission policy stay installed; the tenants (their
namespaces, RoleBindings and GpuPolicies) are removed afterwards.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu import install, ownership
from kfp_gpu.cli import main
from kfp_gpu.errors import KfpGpuError
from kfp_gpu.gang import api as gang
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu_rehearsal.devcluster.client import Kube
from tests.integration.rbac_support import Identity, identity
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

G, V, P = gang.GROUP, gang.VERSION, gang.PLURAL
CLAIM = ".claims.kfp-gpu.io/run"


@pytest.fixture(scope="module")
def installed(kube: Kube) -> Kube:
    install.apply(kube.api, controller=False)
    return kube


@pytest.fixture
def tenants(installed: Kube) -> Iterator[tuple[str, str]]:
    """Two fresh tenants: team-a exists before `tenant add` (as a Kubeflow profile would), team-b does not."""
    suffix = uuid.uuid4().hex[:6]
    a, b = f"t-tenancy-a-{suffix}", f"t-tenancy-b-{suffix}"
    installed.core.create_namespace({"metadata": {"name": a, "labels": {"kfp-gpu.io/test": "true"}}})
    try:
        for ns in (a, b):
            install.tenant_add(installed.api, ns)
        yield a, b
    finally:
        for ns in (a, b):
            _drop_gangs(installed, ns)
            install.tenant_remove(installed.api, ns, force=True)
            try:
                installed.core.delete_namespace(ns, propagation_policy="Background")
            except ApiException as e:
                if e.status != 404:
                    raise


def _drop_gangs(kube: Kube, ns: str) -> None:
    """Delete the namespace's gangs, finalizers and all (no controller runs here to release them)."""
    for g in kube.custom.list_namespaced_custom_object(G, V, ns, P).get("items") or []:
        name = g["metadata"]["name"]
        kube.custom.patch_namespaced_custom_object(G, V, ns, P, name, {"metadata": {"finalizers": None}})
        try:
            kube.custom.delete_namespaced_custom_object(G, V, ns, P, name)
        except ApiException as e:
            if e.status != 404:
                raise


def step_identity(kube: Kube, ns: str, tmp_path: Path) -> Identity:
    ident = identity(kube.api, ns, gang.STEP_SA, tmp_path)
    wait_until(f"RBAC of {ns}/{gang.STEP_SA}", lambda: ident.can("create", P, G, namespace=ns), timeout=10, every=0.1)
    return ident


def new_gang(ns: str, run_id: str, **spec_over: Any) -> dict[str, Any]:
    body = gang.body(run_id, ns, ProvisioningSpec(accelerator="a100-80gb", nodes=2).to_json(),
                     {"local": "local:test:1"})
    body["spec"].update(spec_over)
    return body


def status_of(fn: Callable[[], Any]) -> int:
    """The HTTP status ``fn`` was answered with (200 when it succeeded)."""
    try:
        fn()
    except ApiException as exc:
        return int(exc.status)
    return 200


def refusal(fn: Callable[[], Any]) -> tuple[int, str]:
    try:
        fn()
    except ApiException as exc:
        return int(exc.status), str(json.loads(exc.body or "{}").get("message", ""))
    return 200, ""


# ---- install and tenant add -------------------------------------------------------------------------------

def test_install_is_idempotent(installed: Kube):
    lines = install.apply(installed.api, controller=False)
    assert len(lines) == len(install.manifests(controller=False))
    assert all(line.endswith("serverside-applied") for line in lines), lines
    ext = client.ApiextensionsV1Api(installed.api)
    for name in (f"{P}.{G}", f"{gang.POLICY_PLURAL}.{G}"):
        conds = {c.type: c.status for c in ext.read_custom_resource_definition(name).status.conditions}
        assert conds.get("Established") == "True", name


def test_tenant_add_writes_the_tenant(installed: Kube, tenants: tuple[str, str]):
    a, b = tenants
    for ns in (a, b):
        assert installed.core.read_namespace(ns).metadata.labels[ownership.TENANT_LABEL] == "true"
        pol = installed.custom.get_cluster_custom_object(G, V, gang.POLICY_PLURAL, install.policy_name(ns))
        assert pol["spec"]["namespaces"] == [ns] and pol["spec"]["maxGpusPerGang"] == 64
    assert installed.core.read_namespace(a).metadata.labels["kfp-gpu.io/test"] == "true"  # labels kept
    again = install.tenant_add(installed.api, a, max_gpus_per_gang=8)  # idempotent; flags change the policy
    assert all(line.endswith("serverside-applied") for line in again)
    pol = installed.custom.get_cluster_custom_object(G, V, gang.POLICY_PLURAL, install.policy_name(a))
    assert pol["spec"]["maxGpusPerGang"] == 8
    assert [(o["kind"], o["name"], o["uid"]) for o in pol["metadata"]["ownerReferences"]] == [
        ("Namespace", a, installed.core.read_namespace(a).metadata.uid)]  # deleted with its namespace


def test_a_deleted_tenant_namespace_takes_its_policy_with_it(installed: Kube) -> None:
    ns = f"t-tenancy-gone-{uuid.uuid4().hex[:6]}"
    install.tenant_add(installed.api, ns)
    installed.core.delete_namespace(ns)

    def policy_gone() -> bool:
        try:
            installed.custom.get_cluster_custom_object(G, V, gang.POLICY_PLURAL, install.policy_name(ns))
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return False

    wait_until("the garbage collector to delete the tenant's GpuPolicy", policy_gone, timeout=60, every=0.5)


# ---- the step identity ------------------------------------------------------------------------------------

def test_step_identity_has_no_cluster_scoped_rights(installed: Kube, tenants: tuple[str, str], tmp_path: Path):
    a, _ = tenants
    me = step_identity(installed, a, tmp_path)
    assert not me.can("patch", "nodes") and not me.can("create", "priorityclasses", "scheduling.k8s.io")
    assert not me.can("create", "nodepools", "karpenter.sh")
    assert not me.can("create", "computeclasses", "cloud.google.com")  # the compute-class backend's: the controller's
    assert not me.can("create", "pods", namespace=a) and not me.can("list", "configmaps", namespace=a)
    core = client.CoreV1Api(me.api)
    assert status_of(lambda: core.patch_node("any-node", {"metadata": {"labels": {"x": "y"}}})) == 403
    pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": f"x-{a}"}, "value": 1}
    assert status_of(lambda: client.SchedulingV1Api(me.api).create_priority_class(pc)) == 403
    pool = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": f"x-{a}"}, "spec": {}}
    assert status_of(lambda: client.CustomObjectsApi(me.api).create_cluster_custom_object(
        "karpenter.sh", "v1", "nodepools", pool)) == 403
    assert status_of(lambda: core.list_namespaced_pod(a)) == 403


def test_install_and_tenant_add_refuse_a_tenant_in_one_line(installed: Kube, tenants: tuple[str, str],
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]):
    a, b = tenants
    me = step_identity(installed, a, tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(me.kubeconfig))
    for argv, what in ((["install", "--no-controller"], "namespace/kfp-gpu-system"),
                       (["tenant", "add", b, "--max-gpus", "4096"], "customresourcedefinition/gpupolicies.kfp-gpu.io"),
                       (["tenant", "remove", b, "--force"], f"the GpuGangs of namespace {b}")):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("kfp-gpu: the Kubernetes API refused to ") and what in err, err
        assert "(fix: run it with cluster-admin credentials" in err and len(err.splitlines()) == 1, err
    pol = installed.custom.get_cluster_custom_object(G, V, gang.POLICY_PLURAL, install.policy_name(b))
    assert pol["spec"]["maxGpusPerNamespace"] == 128  # unchanged


def test_step_identity_reaches_only_its_own_gangs(installed: Kube, tenants: tuple[str, str], tmp_path: Path):
    a, b = tenants
    theirs = new_gang(b, f"run-b-{uuid.uuid4().hex[:6]}")
    installed.custom.create_namespaced_custom_object(G, V, b, P, theirs)
    me = step_identity(installed, a, tmp_path)
    mine = client.CustomObjectsApi(me.api)
    name_b = theirs["metadata"]["name"]
    assert not me.can("get", P, G, namespace=b)
    assert status_of(lambda: mine.get_namespaced_custom_object(G, V, b, P, name_b)) == 403
    assert status_of(lambda: mine.patch_namespaced_custom_object(G, V, b, P, name_b, {"spec": {"release": True}})) \
        == 403
    assert status_of(lambda: mine.delete_namespaced_custom_object(G, V, b, P, name_b)) == 403
    assert status_of(lambda: mine.create_namespaced_custom_object(G, V, b, P, new_gang(b, "intruder"))) == 403

    own = new_gang(a, f"run-a-{uuid.uuid4().hex[:6]}")
    name = own["metadata"]["name"]
    mine.create_namespaced_custom_object(G, V, a, P, own)
    got = mine.get_namespaced_custom_object(G, V, a, P, name)
    assert got["spec"]["provisioning"] == own["spec"]["provisioning"]  # nothing pruned
    assert got["spec"]["owner"] == {"local": "local:test:1"}
    mine.patch_namespaced_custom_object(G, V, a, P, name, {"spec": {"stage": gang.PREFLIGHTED}})
    assert mine.get_namespaced_custom_object(G, V, a, P, name)["spec"]["stage"] == gang.PREFLIGHTED  # status too
    assert status_of(lambda: mine.patch_namespaced_custom_object_status(
        G, V, a, P, name, {"status": {"phase": "Ready"}})) == 403  # status is the controller's
    mine.delete_namespaced_custom_object(G, V, a, P, name)


def test_gang_crd_refuses_changes_to_what_was_asked(installed: Kube, tenants: tuple[str, str], tmp_path: Path):
    a, _ = tenants
    mine = client.CustomObjectsApi(step_identity(installed, a, tmp_path).api)
    own = new_gang(a, f"run-c-{uuid.uuid4().hex[:6]}")
    name = own["metadata"]["name"]
    mine.create_namespaced_custom_object(G, V, a, P, own)
    status, msg = refusal(lambda: mine.patch_namespaced_custom_object(
        G, V, a, P, name, {"spec": {"provisioning": {"nodes": 64}}}))
    assert status == 422 and "spec.provisioning is immutable" in msg, msg
    renamed = {"spec": {"provisioning": {"nodes": None, "nodez": 64}}}  # a key swapped for another: same size
    status, msg = refusal(lambda: mine.patch_namespaced_custom_object(G, V, a, P, name, renamed))
    assert status == 422 and "spec.provisioning is immutable" in msg, msg
    status, msg = refusal(lambda: mine.patch_namespaced_custom_object(G, V, a, P, name, {"spec": {"provisioning": None}}))
    assert status == 422 and "cannot be removed" in msg, msg
    status, msg = refusal(lambda: mine.patch_namespaced_custom_object(G, V, a, P, name, {"spec": {"runId": "other"}}))
    assert status == 422 and "spec.runId is immutable" in msg, msg
    status, msg = refusal(lambda: mine.create_namespaced_custom_object(
        G, V, a, P, new_gang(a, "too-big", nodes=5000, gpusPerNode=16)))
    assert status == 422 and "65536" in msg, msg
    mine.patch_namespaced_custom_object(G, V, a, P, name, {"spec": {"release": True}})  # the rest stays writable


def test_tenant_remove_refuses_while_gangs_remain(installed: Kube, tenants: tuple[str, str]):
    _, b = tenants
    installed.custom.create_namespaced_custom_object(G, V, b, P, new_gang(b, f"run-d-{uuid.uuid4().hex[:6]}"))
    with pytest.raises(KfpGpuError, match="still has 1 GpuGang"):
        install.tenant_remove(installed.api, b)
    _drop_gangs(installed, b)
    lines = install.tenant_remove(installed.api, b)
    assert f"gpupolicy/{install.policy_name(b)} deleted" in lines
    assert ownership.TENANT_LABEL not in (installed.core.read_namespace(b).metadata.labels or {})
    assert status_of(lambda: client.RbacAuthorizationV1Api(installed.api).read_namespaced_role(gang.STEP_SA, b)) \
        == 404


# ---- admission: claim tolerations -------------------------------------------------------------------------

def pod(ns: str, *tolerations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "tolerates-", "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "tolerations": list(tolerations)}}


def dry_create(kube: Kube, ns: str, body: dict[str, Any]) -> tuple[int, str]:
    """(200, "") when the pod would be created (dry run), else (status, message)."""
    return refusal(lambda: kube.core.create_namespaced_pod(ns, body, dry_run="All"))


def refused(kube: Kube, ns: str, body: dict[str, Any]) -> str:
    """The claim-toleration policy's message refusing ``body``, or "" (admitted, or refused by something else,
    e.g. while the namespace's default ServiceAccount does not exist yet)."""
    status, msg = dry_create(kube, ns, body)
    return msg if status in (403, 422) and "kfp-gpu tenant namespace" in msg else ""


def test_tenant_pods_may_not_tolerate_other_tenants_claims(installed: Kube, tenants: tuple[str, str],
                                                           namespace: str):
    a, b = tenants
    foreign = {"key": f"{b}{CLAIM}", "operator": "Exists", "effect": "NoSchedule"}
    # the policy and the namespace label reach the admission plugin's caches within seconds: poll (bounded)
    msg = wait_until("the claim-toleration policy to refuse a foreign claim toleration",
                     lambda: refused(installed, a, pod(a, foreign)), timeout=30, every=0.5)
    assert f"tolerates {b}{CLAIM}" in msg and f"tolerate {a}{CLAIM}" in msg and "(fix:" in msg, msg

    everything = {"operator": "Exists"}
    msg = refused(installed, a, pod(a, everything))
    assert "operator Exists and no key" in msg and "tolerates every taint" in msg, msg
    msg = refused(installed, a, pod(a, {"key": "kfp-gpu.io/run", "operator": "Exists"}))
    assert "tolerates kfp-gpu.io/run" in msg, msg
    msg = refused(installed, a, pod(a, {"key": f"{b}.nodepools.kfp-gpu.io/run", "operator": "Exists"}))
    assert f"tolerates {b}.nodepools.kfp-gpu.io/run" in msg, msg  # team-b's Karpenter nodes before their claim

    own = {"key": f"{a}{CLAIM}", "operator": "Equal", "value": "run-1", "effect": "NoSchedule"}
    other = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    wait_until("a pod tolerating its own namespace's claim to be admitted",
               lambda: dry_create(installed, a, pod(a, own, other)) == (200, ""), timeout=30, every=0.5)
    # a namespace that is no tenant is not guarded
    wait_until("a pod tolerating everything in a namespace that is no tenant to be admitted",
               lambda: dry_create(installed, namespace, pod(namespace, everything)) == (200, ""), timeout=30,
               every=0.5)


def test_tenant_pods_may_not_bypass_the_scheduler_with_a_node_name(installed: Kube, tenants: tuple[str, str],
                                                                   namespace: str):
    """spec.nodeName skips the scheduler and every NoSchedule taint: a team-a pod could sit on team-b's claimed GPU
    node without tolerating anything. Refused in a tenant namespace, naming the fix; allowed elsewhere."""
    a, _ = tenants
    pinned = pod(a)
    pinned["spec"]["nodeName"] = "gke-team-b-gpu-0001"
    msg = wait_until("the policy to refuse a pod created with spec.nodeName",
                     lambda: refused(installed, a, pinned), timeout=30, every=0.5)
    assert "sets spec.nodeName=gke-team-b-gpu-0001" in msg and "metadata.name In [gke-team-b-gpu-0001]" in msg, msg
    selected = pod(a)
    selected["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                "values": ["gke-team-b-gpu-0001"]}]}]}}}  # the scheduler decides
    wait_until("the same placement through the scheduler to be admitted",
               lambda: dry_create(installed, a, selected) == (200, ""), timeout=30, every=0.5)
    elsewhere = pod(namespace)
    elsewhere["spec"]["nodeName"] = "gke-team-b-gpu-0001"
    wait_until("a pod with spec.nodeName in a namespace that is no tenant to be admitted",
               lambda: dry_create(installed, namespace, elsewhere) == (200, ""), timeout=30, every=0.5)
