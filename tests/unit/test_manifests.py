"""The control-plane manifests (kfp_gpu/manifests/, deploy/kustomization.yaml) and `kfp-gpu install|tenant --dry-run`.
No cluster: tests/integration/test_tenancy.py applies them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kfp_gpu import install, ownership
from kfp_gpu.cli import main
from kfp_gpu.gang import api as gang
from kfp_gpu.image import VERSION
from kfp_gpu.spec import ProvisioningSpec

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "kfp_gpu" / "manifests"
Obj = dict[str, Any]


def by_kind(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


OBJS = install.manifests()


def crd(name: str) -> Obj:
    return by_kind(OBJS, "CustomResourceDefinition", name)


def version_schema(name: str) -> Obj:
    (v,) = crd(name)["spec"]["versions"]
    return dict(v)


# ---- the files ----------------------------------------------------------------------------------------------

def test_every_manifest_parses_and_is_listed():
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    files = sorted(p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == files, "every manifest file is in kustomization.yaml's resources, and only those"
    for f in files:
        docs = [d for d in yaml.safe_load_all((BASE / f).read_text()) if d]
        assert docs and all({"apiVersion", "kind", "metadata"} <= set(d) for d in docs), f


def test_deploy_kustomization_is_the_base():
    assert install._kustomize(ROOT / "deploy", {}) == OBJS


def test_image_tag_follows_the_package_version():
    (deployment,) = [o for o in OBJS if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == f"localhost/kfp-gpu:{VERSION}"


def test_package_data_ships_the_manifests():
    assert '"manifests/*.yaml"' in (ROOT / "pyproject.toml").read_text()


def test_every_object_has_a_known_home():
    for o in OBJS:
        assert install.kubeapply.path(o).endswith("/" + o["metadata"]["name"])


# ---- GpuGang CRD ------------------------------------------------------------------------------------------

def check(value: Any, schema: Obj, where: str) -> list[str]:
    """A small structural-schema check (types, enums, bounds, required, unknown fields): the errors."""
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return [] if isinstance(value, dict) or schema.get("type") != "object" else [f"{where}: not an object"]
    t = schema.get("type")
    kinds = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}
    if t and (not isinstance(value, kinds[t]) or (t in ("integer", "number") and isinstance(value, bool))):
        return [f"{where}: {value!r} is not {t}"]
    errs = []
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{where}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        errs.append(f"{where}: {value!r} < {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        errs.append(f"{where}: {value!r} > {schema['maximum']}")
    if t == "array":
        errs += [e for i, v in enumerate(value) for e in check(v, schema["items"], f"{where}[{i}]")]
    if t == "object":
        props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        errs += [f"{where}: {k} missing" for k in schema.get("required") or [] if k not in value]
        for k, v in value.items():
            if k in props:
                errs += check(v, props[k], f"{where}.{k}")
            elif isinstance(extra, dict):
                errs += check(v, extra, f"{where}.{k}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                errs.append(f"{where}: unknown field {k} (the API server would prune it)")
    return errs


def gang_body() -> Obj:
    spec = ProvisioningSpec(accelerator="a100-80gb", nodes=2).to_json()
    return gang.body("run-1", "team-a", spec, {"pod": "team-a/p", "podUid": "u", "workflow": "team-a/w",
                                                "local": ""})


def gang_schema() -> Obj:
    return dict(version_schema(f"{gang.PLURAL}.{gang.GROUP}")["schema"]["openAPIV3Schema"])


def test_gpugang_schema_holds_every_field_body_writes():
    body, schema = gang_body(), gang_schema()
    spec_props = schema["properties"]["spec"]["properties"]
    assert set(body["spec"]) <= set(spec_props), set(body["spec"]) - set(spec_props)
    assert check(body["spec"], schema["properties"]["spec"], "spec") == []


@pytest.mark.parametrize("field, value", [("capacityType", "cheap"), ("gpusPerNode", 17), ("nodes", 0),
                                          ("stage", "Training"), ("release", "yes"), ("nodes", 2.5)])
def test_the_schema_check_catches_a_bad_mirror(field, value):
    body = gang_body()
    body["spec"][field] = value
    assert check(body["spec"], gang_schema()["properties"]["spec"], "spec"), f"{field}={value!r} passed"


def test_gpugang_crd_shape():
    c = crd(f"{gang.PLURAL}.{gang.GROUP}")["spec"]
    assert c["scope"] == "Namespaced" and c["group"] == gang.GROUP
    assert c["names"]["kind"] == gang.KIND and c["names"]["shortNames"] == ["gg"]
    assert c["names"]["categories"] == ["kfp-gpu"]
    v = version_schema(f"{gang.PLURAL}.{gang.GROUP}")
    assert v["name"] == gang.VERSION and v["subresources"] == {"status": {}}
    cols = {col["name"]: col["jsonPath"] for col in v["additionalPrinterColumns"]}
    assert cols == {"Accelerator": ".spec.accelerator", "Nodes": ".status.ready", "Phase": ".status.phase",
                    "Backend": ".status.backend", "Age": ".metadata.creationTimestamp"}
    spec = v["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["runId"]
    assert spec["properties"]["stage"]["enum"] == ["", *gang.STAGES]
    for field, rule in (("runId", "self == oldSelf"), ("provisioning", "self == oldSelf && oldSelf == self")):
        rules = [r["rule"] for r in spec["properties"][field]["x-kubernetes-validations"]]
        assert rules == [rule], field
    rules = " ".join(r["rule"] for r in spec["x-kubernetes-validations"])
    assert "self.nodes * self.gpusPerNode <= 65536" in rules and "has(oldSelf.provisioning)" in rules
    status = v["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["x-kubernetes-preserve-unknown-fields"] is True


def test_provisioning_declares_every_spec_field():
    """The immutability rule sees a removed key only among declared ones (crds.yaml says why)."""
    import dataclasses

    declared = gang_schema()["properties"]["spec"]["properties"]["provisioning"]["properties"]
    fields = {f.name for f in dataclasses.fields(ProvisioningSpec)} | {"version"}
    assert set(declared) == fields
    assert set(gang_body()["spec"]["provisioning"]) <= fields


def test_gpupolicy_crd_shape():
    c = crd(f"{gang.POLICY_PLURAL}.{gang.GROUP}")["spec"]
    assert c["scope"] == "Cluster" and c["names"]["kind"] == gang.POLICY_KIND and c["names"]["shortNames"] == ["gpol"]
    schema = version_schema(f"{gang.POLICY_PLURAL}.{gang.GROUP}")["schema"]["openAPIV3Schema"]
    props = schema["properties"]["spec"]["properties"]
    assert set(props) == {"namespaces", "namespaceSelector", *install.LIMIT_FIELDS.values()}
    for p in install.tenant_objects("team-a", accelerators=["h100-80gb"], pools=["a"], backends=["karpenter"],
                                    capacity_types=["spot"], allow_quota_requests=True)[-1:]:
        assert check(p["spec"], schema["properties"]["spec"], "spec") == []


# ---- RBAC -------------------------------------------------------------------------------------------------

def grants(rules: list[Obj]) -> set[tuple[str, str, str, str]]:
    return {(g, r, v, n) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"] for n in rule.get("resourceNames") or ["*"]}


def test_step_role_reaches_gangs_and_reads_pods_only():
    """tests/integration/test_rbac.py checks the verbs against the calls of kfp_gpu/gang/client.py."""
    role = by_kind(install.tenant_objects("team-a"), "Role", gang.STEP_SA)
    assert role["metadata"]["namespace"] == "team-a"
    allowed = {(gang.GROUP, gang.PLURAL), ("", "pods")}
    assert {(g, r) for g, r, _, _ in grants(role["rules"])} == allowed
    assert {v for g, r, v, _ in grants(role["rules"]) if r == "pods"} == {"get"}  # its own pod: the run's owner
    assert not {v for g, r, v, _ in grants(role["rules"]) if r == gang.PLURAL} & {"update", "deletecollection"}


def test_tenant_objects_bind_the_step_and_the_controller():
    objs = install.tenant_objects("team-a")
    assert by_kind(objs, "Namespace", "team-a")["metadata"]["labels"] == {ownership.TENANT_LABEL: "true"}
    rb = by_kind(objs, "RoleBinding", "kfp-gpu-controller")
    assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": install.TENANT_CLUSTER_ROLE}
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": gang.CONTROLLER_SA,
                               "namespace": gang.CONTROLLER_NAMESPACE}]
    pol = by_kind(objs, gang.POLICY_KIND, "tenant-team-a")["spec"]
    assert pol == {"namespaces": ["team-a"], "maxGpusPerGang": 64, "maxGpusPerNamespace": 128,
                   "maxRunSeconds": 604800.0, "allowQuotaRequests": False}


def janitor(kind: str) -> list[Obj]:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "janitor-rbac.yaml").read_text()) if d]
    return [r for d in docs if d["kind"] == kind for r in d["rules"]]


def test_controller_can_release_whatever_the_janitor_releases():
    """Owner-gone release moved into the controller: in a tenant namespace it may do all `kfp-gpu gc` does
    (deploy/janitor-rbac.yaml; its ClusterRole is bound cluster-wide, the controller's namespaced rights per tenant).
    The janitor's Role is its own lock (two janitors never sweep at once), which the controller has no use for.
    Ledgers: the controller keeps them in its own namespace (its Role there), out of the tenants' reach."""
    cluster = grants(by_kind(OBJS, "ClusterRole", "kfp-gpu-controller")["rules"])
    tenant = grants(by_kind(OBJS, "ClusterRole", install.TENANT_CLUSTER_ROLE)["rules"])
    home = grants(by_kind(OBJS, "Role", "kfp-gpu-controller")["rules"])
    missing = grants(janitor("ClusterRole")) - cluster - tenant - home
    assert not missing, missing


def test_controller_cluster_role_has_the_gang_api_and_kopf():
    cluster = grants(by_kind(OBJS, "ClusterRole", "kfp-gpu-controller")["rules"])
    need = {(gang.GROUP, gang.PLURAL, v, "*") for v in ("get", "list", "watch", "patch", "delete")}
    need |= {(gang.GROUP, f"{gang.PLURAL}/status", "patch", "*"), (gang.GROUP, gang.POLICY_PLURAL, "list", "*")}
    need |= {("", "namespaces", v, "*") for v in ("get", "list", "watch")}
    need |= {("", "events", "create", "*")}
    need |= {("apiextensions.k8s.io", "customresourcedefinitions", v, "*") for v in ("list", "watch")}
    assert need <= cluster, need - cluster


def test_no_rule_grants_secrets_escalation_or_wildcards():
    for o in OBJS + install.tenant_objects("team-a"):
        for g, r, v, _ in grants(o.get("rules") or []):
            assert "*" not in (g, r, v) and r not in ("secrets", "pods/exec") and v not in (
                "escalate", "bind", "impersonate"), (o["metadata"]["name"], g, r, v)


def test_each_rbac_rule_says_why():
    text = (BASE / "controller-rbac.yaml").read_text()
    verbs = [line for line in text.splitlines() if line.strip().startswith("verbs:")]
    assert verbs and all("#" in line for line in verbs), [v for v in verbs if "#" not in v]


def test_tenant_cluster_role_is_never_bound_cluster_wide():
    for o in OBJS:
        if o["kind"] == "ClusterRoleBinding":
            assert o["roleRef"]["name"] != install.TENANT_CLUSTER_ROLE


# ---- controller and admission -----------------------------------------------------------------------------

def test_controller_deployment_and_metrics_service():
    dep = by_kind(OBJS, "Deployment", "kfp-gpu-controller")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert dep["spec"]["replicas"] == 2 and pod["serviceAccountName"] == gang.CONTROLLER_SA
    assert [*c["command"], *c["args"]] == ["kfp-gpu", "controller", "--all-namespaces"]
    assert {"name": "metrics", "containerPort": 8080, "protocol": "TCP"} in c["ports"]
    svc = by_kind(OBJS, "Service", "kfp-gpu-controller-metrics")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["port"] == 8080
    assert not [o for o in OBJS if o["apiVersion"].startswith("kopf.dev/")]  # no kopf peering: a Lease elects
    env = {e["name"]: e.get("valueFrom") for e in c["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # the Lease holder's name
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}  # where the Lease is


def test_controller_lease_rights_are_its_one_lease():
    """The Role in kfp-gpu-system grants get/update on the leader-election Lease by name, and create (which RBAC
    cannot restrict by name); the ClusterRoles grant no Lease write anywhere else."""
    home = by_kind(OBJS, "Role", "kfp-gpu-controller")
    assert home["metadata"]["namespace"] == gang.CONTROLLER_NAMESPACE
    leases = [r for r in home["rules"] if "leases" in r["resources"]]
    assert sorted((tuple(r["verbs"]), tuple(r.get("resourceNames") or ())) for r in leases) == [
        (("create",), ()), (("get", "update"), ("kfp-gpu-controller",))]
    for name in ("kfp-gpu-controller", install.TENANT_CLUSTER_ROLE):
        rules = by_kind(OBJS, "ClusterRole", name)["rules"]
        assert not {v for r in rules if "leases" in r["resources"] for v in r["verbs"]} & {"create", "update",
                                                                                          "patch"}


def test_claim_admission_policy():
    vap = by_kind(OBJS, "ValidatingAdmissionPolicy", "kfp-gpu-claim-tolerations")["spec"]
    binding = by_kind(OBJS, "ValidatingAdmissionPolicyBinding", "kfp-gpu-claim-tolerations")["spec"]
    assert binding == {"policyName": "kfp-gpu-claim-tolerations", "validationActions": ["Deny"]}
    match = vap["matchConstraints"]
    assert match["namespaceSelector"] == {"matchLabels": {ownership.TENANT_LABEL: "true"}}
    assert match["resourceRules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                                       "resources": ["pods"]}]
    cel = " ".join(v["expression"] for v in vap["variables"])
    assert "request.namespace + '.claims.kfp-gpu.io/run'" in cel and "k == 'kfp-gpu.io/run'" in cel
    assert "request.namespace + '.nodepools.kfp-gpu.io/run'" in cel and "nodeName" in str(vap["validations"])
    assert "'Exists'" in cel and len(vap["validations"]) == 3
    assert all(v.get("messageExpression") and "fix:" in v["messageExpression"] for v in vap["validations"])


# ---- the commands, without a cluster ----------------------------------------------------------------------

def test_install_dry_run_prints_every_object(capsys):
    assert main(["install", "--dry-run"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [(o["kind"], o["metadata"]["name"]) for o in OBJS]


def test_install_dry_run_without_controller_and_with_an_image(capsys):
    assert main(["install", "--dry-run", "--no-controller"]) == 0
    kinds = {d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out) if d}
    assert "CustomResourceDefinition" in kinds and not kinds & install.CONTROLLER_KINDS
    assert main(["install", "--dry-run", "--image", "reg.example.com/ml/kfp-gpu:9.9"]) == 0
    assert "image: reg.example.com/ml/kfp-gpu:9.9" in capsys.readouterr().out


def test_install_kueue_topology_adds_a_topology_over_the_cloud_s_labels(capsys):
    assert main(["install", "--dry-run", "--kueue-topology", "gke"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert len(docs) == len(OBJS) + 1 and (docs[-1]["kind"], docs[-1]["metadata"]["name"]) == ("Topology", "kfp-gpu-gke")
    assert docs[-1]["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert [lv["nodeLabel"] for lv in docs[-1]["spec"]["levels"]] == [
        "cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock",
        "cloud.google.com/gce-topology-host", "kubernetes.io/hostname"]
    assert install.apply(None, dry_run=True, topology="eks")[-1] == "topology/kfp-gpu-eks (dry run: not applied)"


def test_apply_dry_run_needs_no_cluster():
    lines = install.apply(None, dry_run=True)
    assert len(lines) == len(OBJS) and all(line.endswith("(dry run: not applied)") for line in lines)
    assert install.tenant_add(None, "team-a", dry_run=True)[0] == "namespace/team-a (dry run: not applied)"


def test_tenant_add_dry_run_prints_the_policy_with_the_flags(capsys):
    assert main(["tenant", "add", "ml-team", "--dry-run", "--max-gpus", "32", "--accelerators", "a100-80gb,h100-80gb",
                 "--capacity-types", "spot", "--max-run-seconds", "3600", "--allow-quota-requests"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert docs[-1]["spec"] == {"namespaces": ["ml-team"], "accelerators": ["a100-80gb", "h100-80gb"],
                                "capacityTypes": ["spot"], "maxGpusPerGang": 64, "maxGpusPerNamespace": 32,
                                "maxRunSeconds": 3600.0, "allowQuotaRequests": True}


@pytest.mark.parametrize("argv, needle", [
    (["tenant", "add", "Team_A", "--dry-run"], "invalid namespace='Team_A'"),
    (["tenant", "add", "kube-system", "--dry-run"], "system namespace"),
    (["tenant", "add", gang.CONTROLLER_NAMESPACE, "--dry-run"], "system namespace"),
    (["tenant", "add", "ml", "--dry-run", "--capacity-types", "cheap"], "invalid --capacity-types='cheap'"),
    (["tenant", "add", "ml", "--dry-run", "--accelerators", "tpu"], "invalid --accelerators='tpu'"),
    (["tenant", "add", "ml", "--dry-run", "--max-gpus", "-1"], "invalid --max-gpus-per-namespace=-1"),
    (["install", "--dry-run", "--image", "kfp-gpu"], "invalid --image='kfp-gpu'"),
    (["install", "--dry-run", "--kueue-topology", "aks"], "invalid --kueue-topology='aks'"),
])
def test_bad_input_is_one_line_with_the_fix(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "(fix:" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unknown_limit_is_refused():
    with pytest.raises(install.InvalidSpec, match="not a GpuPolicy limit"):
        install.tenant_objects("team-a", max_gpu=3)


def test_kustomization_fields_the_expander_does_not_know_are_refused(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\npatches: [{path: p.yaml}]\n")
    with pytest.raises(install.KfpGpuError, match=re.escape("['patches']")):
        install._kustomize(tmp_path, {})
