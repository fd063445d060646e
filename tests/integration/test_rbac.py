"""Least privilege, proven: the controller, the tenants' steps and the janitor hold exactly what their code needs.

* Sufficient: every integration test of the step functions runs them as the controller's identity (``step_api``:
  kfp_gpu/manifests/controller-rbac.yaml's ClusterRoles bound to a test ServiceAccount the way ``kfp-gpu install``
  and ``kfp-gpu tenant add`` bind them to kfp-gpu-controller), the janitor as kfp-gpu-janitor (``janitor_api``,
  deploy/janitor-rbac.yaml), and the GpuGang client as a tenant's ``kfp-gpu`` (test_tenancy.py,
  controller_support.py); a rule missing from a manifest fails those tests.
* Exact: ``STEP_NEEDS`` (the controller's), ``TENANT_NEEDS`` and ``JANITOR_NEEDS`` (tests/integration/rbac_needs.py)
  list each permission with the reason; controller-rbac.yaml, the tenant Role of :func:`kfp_gpu.install.
  tenant_objects`, deploy/janitor-rbac.yaml and docs/rbac-iam.md grant those and nothing else; every Kubernetes
  client method and raw request the code makes (found by parsing kfp_gpu/) maps to permissions in its identity's
  list (``CODE_CALLS``, ``RAW_CALLS``), and every listed permission is used (kopf's own requests excepted). A new
  call without its rule fails.
* Live: each permission is checked with a SelfSubjectAccessReview sent with the ServiceAccount's own token
  (``kubectl auth can-i``), and so are some it must not have.
* Negative: with one verb taken out of the controller's rights, the step function fails with a one-line
  PermissionDenied naming the verb and the resource, not a traceback.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kfp_gpu import install, ownership
from kfp_gpu.cluster import balloons, ledger, pytorchjob
from kfp_gpu.gang import api as gang
from kfp_gpu.ownership import LABEL_RUN_ID, Owner, label_safe
from kfp_gpu.plan.quota import Verdict
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps import janitor, scale_up, warm_pool
from tests.integration import test_provisioning
from tests.integration.conftest import IdentityFactory
from tests.integration.rbac_needs import (
    ADMIN_MODULES,
    ADMIN_ONLY,
    CLUSTER,
    CODE_CALLS,
    JANITOR_NEEDS,
    KOPF_NEEDS,
    NAMED,
    NEVER,
    NS,
    OWNED_KINDS,
    RAW_CALLS,
    STEP_NEEDS,
    TENANT_CODE_CALLS,
    TENANT_HELPERS,
    TENANT_MODULES,
    TENANT_NEEDS,
    Need,
)
from tests.integration.rbac_support import (
    CONTROLLER_MANIFEST,
    CONTROLLER_ROLE,
    CONTROLLER_SA,
    DOC_NAMESPACE,
    JANITOR_MANIFEST,
    JANITOR_SA,
    TENANT_ROLE,
    Identity,
    Obj,
    bind,
    by_name,
    manifest_docs,
    render,
    render_controller,
)
from tests.waiting import wait_until

integration = pytest.mark.integration  # the manifest/code/docs checks need no cluster; the rest do
env = test_provisioning.env  # the GKE stand-in fixture
PKG = Path(__file__).resolve().parents[2] / "kfp_gpu"
DOCS = PKG.parent / "docs" / "rbac-iam.md"
STEP_SA = gang.STEP_SA  # a tenant's pipeline steps


def _api_methods() -> set[str]:
    apis = [getattr(client, n) for n in dir(client) if n.endswith("Api") and n not in ("ApiClient",)]
    return {m for a in apis if isinstance(a, type) for m in vars(a)
            if not m.startswith("_") and not m.endswith("_with_http_info") and m != "api_client"}


def _referenced_methods() -> dict[tuple[str, str], list[str]]:
    """(module, client method) -> where: client methods referenced (called or passed to a watch) outside the
    platform admin's code."""
    methods, found = _api_methods(), dict[tuple[str, str], list[str]]()
    for rel, tree in _modules():
        skip = {id(n) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and (rel, fn.name) in ADMIN_ONLY
                for n in ast.walk(fn)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in methods and id(node) not in skip:
                found.setdefault((rel, node.attr), []).append(f"{rel}:{node.lineno}")
    return found


def _raw_calls() -> dict[tuple[str, str, str], list[str]]:
    """Raw requests: ``x.call_api(path, METHOD, ...)``, ``owned.request(api, METHOD, ...)`` (and ``request``
    inside owned.py) by (module, enclosing function, METHOD literal or "*")."""
    found: dict[tuple[str, str, str], list[str]] = {}
    for rel, tree in _modules():
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                raw = (isinstance(f, ast.Attribute) and (f.attr == "call_api" or (
                    f.attr == "request" and isinstance(f.value, ast.Name) and f.value.id == "owned"))) or (
                    isinstance(f, ast.Name) and f.id == "request" and rel == "cluster/owned.py")
                if not raw:
                    continue
                arg = node.args[1] if len(node.args) > 1 else None
                method = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else "*"
                found.setdefault((rel, fn.name, method), []).append(f"{rel}:{node.lineno}")
    return {k: sorted(set(v)) for k, v in found.items()}


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = str(path.relative_to(PKG))
        if not rel.startswith(tuple(ADMIN_MODULES)):
            out.append((rel, ast.parse(path.read_text())))
    return out


def _names_in(rel: str) -> set[str]:
    """Every attribute and name a module mentions (is a helper called from it?)."""
    tree = ast.parse((PKG / rel).read_text())
    return {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(tree)
            if isinstance(n, (ast.Attribute, ast.Name))}


def _granted(objs: list[Obj], sa: str) -> dict[Need, str]:
    """(group, resource, verb) -> scope the rendered objects grant ``sa`` ("namespace" or "cluster")."""
    bindings = [b for b in objs if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in b["subjects"])]
    out: dict[Need, str] = {}
    for b in bindings:
        role = by_name(objs, b["roleRef"]["kind"], b["roleRef"]["name"])
        scope = CLUSTER if b["kind"] == "ClusterRoleBinding" else NS
        for rule in role["rules"]:
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        if out.get((g, r, v)) != CLUSTER:
                            out[(g, r, v)] = scope
    return out


def _exactly(granted: dict[Need, str], needs: dict[Need, tuple[str, str]], who: str) -> None:
    want = {k: scope for k, (scope, _) in needs.items()}
    assert granted == want, (
        f"{who}: granted but not listed: {sorted(set(granted) - set(want))}; "
        f"listed but not granted: {sorted(set(want) - set(granted))}; "
        f"other scope: {sorted(k for k in set(want) & set(granted) if want[k] != granted[k])}")


def _tenant_rbac(namespace: str) -> list[Obj]:
    """What ``kfp-gpu tenant add`` gives the steps: ServiceAccount, Role and RoleBinding ``kfp-gpu``."""
    return [o for o in install.tenant_objects(namespace)
            if o["kind"] in ("ServiceAccount", "Role", "RoleBinding") and o["metadata"]["name"] == STEP_SA]


def _can(ident: Identity, need: Need, namespace: str) -> bool:
    group, resource, verb = need
    res, _, sub = resource.partition("/")
    return ident.can(verb, res, group, namespace=namespace, subresource=sub, name=NAMED.get(need, ""))


# ---- the manifests --------------------------------------------------------------------------------------

def test_controller_rights_are_rendered_as_installed() -> None:
    """The test identity gets the installed ClusterRoles as they are, bound as install and tenant add bind them."""
    installed = install.manifests(controller=False)
    objs = render_controller("team-a")
    for name in (CONTROLLER_ROLE, TENANT_ROLE):
        assert by_name(objs, "ClusterRole", name) == by_name(installed, "ClusterRole", name)
    crb = by_name(installed, "ClusterRoleBinding", CONTROLLER_ROLE)
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": gang.CONTROLLER_SA,
                                "namespace": gang.CONTROLLER_NAMESPACE}]
    ours = [o for o in objs if o["kind"] == "ClusterRoleBinding"]
    assert [o["roleRef"] for o in ours] == [crb["roleRef"]]
    tenant_rb = by_name(install.tenant_objects("team-a"), "RoleBinding", install.CONTROLLER_BINDING)
    rb = by_name(objs, "RoleBinding", install.CONTROLLER_BINDING)
    assert (rb["roleRef"], rb["metadata"]["namespace"]) == (tenant_rb["roleRef"], "team-a")
    for b in (*ours, rb):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": CONTROLLER_SA, "namespace": "team-a"}]
    isolated = render_controller("team-a", isolate="t1")
    cluster_scoped = {o["metadata"]["name"] for o in isolated if o["kind"].startswith("Cluster")}
    assert cluster_scoped == {f"{CONTROLLER_ROLE}-t1", f"{TENANT_ROLE}-t1"}
    assert {o["roleRef"]["name"] for o in isolated if "roleRef" in o} == cluster_scoped | {f"{CONTROLLER_ROLE}-ledgers"}
    ledger_rules = by_name(objs, "Role", f"{CONTROLLER_ROLE}-ledgers")["rules"]  # the installed Role's ledger rule
    assert ledger_rules and ledger_rules == [r for r in by_name(installed, "Role", CONTROLLER_ROLE)["rules"]
                                             if "configmaps" in r["resources"]]
    assert {d["kind"] for d in manifest_docs(CONTROLLER_MANIFEST)} == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def test_janitor_manifest_documents_its_namespace_and_renders_like_the_documented_sed() -> None:
    text = JANITOR_MANIFEST.read_text()
    assert f"sed 's/{DOC_NAMESPACE}/ml-team/g' deploy/janitor-rbac.yaml" in text  # the instruction users follow
    assert render(DOC_NAMESPACE) == manifest_docs(JANITOR_MANIFEST)  # applied as-is, the file is what we test
    sedded = [d for d in yaml.safe_load_all(text.replace(DOC_NAMESPACE, "ml-team")) if d]
    assert render("ml-team") == sedded
    a, b = render("team-a"), render("team-b")
    names = {o["metadata"]["name"] for o in a + b if o["kind"] == "ClusterRoleBinding"}
    assert len(names) == 2, "a second namespace must add a ClusterRoleBinding, not replace the first one"


def test_controller_rights_are_exactly_the_listed_permissions() -> None:
    objs = render_controller("ns")
    _exactly(_granted(objs, CONTROLLER_SA), STEP_NEEDS, "the controller (controller-rbac.yaml)")
    names = {(g, r, v): rule.get("resourceNames") for o in objs for rule in o.get("rules") or []
             for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert {k: v[0] for k, v in names.items() if v} == NAMED
    assert KOPF_NEEDS <= set(STEP_NEEDS), sorted(KOPF_NEEDS - set(STEP_NEEDS))


def test_janitor_rights_are_exactly_the_listed_permissions() -> None:
    objs = render("ns")
    _exactly(_granted(objs, JANITOR_SA), JANITOR_NEEDS, f"{JANITOR_SA} (deploy/janitor-rbac.yaml)")
    assert not any(rule.get("resourceNames") for o in objs for rule in o.get("rules") or [])


def test_tenant_role_grants_exactly_what_the_gang_client_needs() -> None:
    objs = install.tenant_objects("ns")
    assert not [o for o in objs if o["kind"] == "ClusterRoleBinding"], "the steps get no cluster-wide rights"
    _exactly(_granted(objs, STEP_SA), TENANT_NEEDS, f"the steps' {STEP_SA} (kfp_gpu.install.STEP_RULES)")
    assert not any(rule.get("resourceNames") for o in objs for rule in o.get("rules") or [])


def test_every_client_call_is_covered() -> None:
    found, raw = _referenced_methods(), _raw_calls()

    def calls(rel: str) -> dict[str, set[Need]]:
        return TENANT_CODE_CALLS if rel in TENANT_MODULES else CODE_CALLS

    unmapped = {f"{rel}: {m}": where for (rel, m), where in found.items() if m not in calls(rel)}
    assert not unmapped, f"Kubernetes client calls without permissions in CODE_CALLS / TENANT_CODE_CALLS: {unmapped}"
    unmapped_raw = {k: where for k, where in raw.items() if k not in RAW_CALLS}
    assert not unmapped_raw, f"raw API requests without permissions in RAW_CALLS (and the manifest): {unmapped_raw}"
    stale = sorted(set(RAW_CALLS) - set(raw))
    assert not stale, f"RAW_CALLS entries for requests the code no longer makes: {stale}"

    controller: dict[str, set[Need]] = {}
    tenant: dict[str, set[Need]] = {}
    for (rel, m) in found:
        (tenant if rel in TENANT_MODULES else controller)[f"{rel}: {m}"] = calls(rel)[m]
    for k in raw:
        (tenant if k[0] in TENANT_MODULES else controller)[f"{k[0]}:{k[1]} {k[2]}"] = RAW_CALLS[k]
    for k, name in TENANT_HELPERS.items():
        assert k in raw and any(name in _names_in(m) for m in TENANT_MODULES), f"TENANT_HELPERS: {k} not called"
        tenant[f"{k[0]}:{k[1]} {k[2]}"] = RAW_CALLS[k]

    listed = set(STEP_NEEDS) | set(JANITOR_NEEDS)
    missing = {m: sorted(n - listed) for m, n in controller.items() if n - listed}
    assert not missing, f"calls whose permissions controller-rbac.yaml / janitor-rbac.yaml do not grant: {missing}"
    used = set().union(*controller.values())
    unused = sorted(listed - used - KOPF_NEEDS)
    assert not unused, f"granted but no call in kfp_gpu needs it (drop it from the manifest and the lists): {unused}"
    by_code = sorted(KOPF_NEEDS & used)
    assert not by_code, f"KOPF_NEEDS that kfp_gpu's own calls use (drop them from KOPF_NEEDS): {by_code}"

    missing = {m: sorted(n - set(TENANT_NEEDS)) for m, n in tenant.items() if n - set(TENANT_NEEDS)}
    assert not missing, f"step-side calls the tenant Role (kfp_gpu.install.STEP_RULES) does not grant: {missing}"
    unused = sorted(set(TENANT_NEEDS) - set().union(*tenant.values()))
    assert not unused, f"the tenant Role grants what no step-side call needs: {unused}"


def test_the_owned_kinds_table_matches_raw_calls() -> None:
    """RAW_CALLS assumes kfp_gpu.cluster.owned's Kind table; a new kind must be added there too."""
    from kfp_gpu.cluster import owned

    kinds = {(k.prefix.split("/")[2] if k.prefix.startswith("/apis/") else "", k.plural)
             for k in vars(owned).values() if isinstance(k, owned.Kind)}
    assert kinds == OWNED_KINDS


Row = tuple[str, str, tuple[str, ...]]  # (apiGroup, resource, resourceNames)


def _rows(rules: list[Obj]) -> dict[Row, set[str]]:
    out: dict[Row, set[str]] = {}
    for rule in rules:
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                out.setdefault((g, r, tuple(sorted(rule.get("resourceNames") or []))), set()).update(rule["verbs"])
    return out


def _doc_tables(section: str) -> list[dict[Row, set[str]]]:
    """The tables of a docs section: "| `resource` [`name`, ...] (group[, group]) | verb, verb | why |" rows."""
    tables: list[dict[Row, set[str]]] = []
    in_table = False
    for line in section.splitlines():
        if line.startswith("|") and not in_table:
            tables.append({})
        in_table = line.startswith("|")
        if line.startswith("| `"):
            first, verbs = [c.strip() for c in line.strip("|").split("|")][:2]
            resource, *names = first.split("`")[1::2]
            for group in first.rsplit("(", 1)[1].rstrip(")").split(", "):
                row = ("" if group == "core" else group, resource, tuple(sorted(names)))
                assert row not in tables[-1], f"docs/rbac-iam.md: {row} twice in one table"
                tables[-1][row] = set(verbs.split(", "))
    return tables


def test_docs_tables_match_the_manifests() -> None:
    """docs/rbac-iam.md section 1 has six tables: the steps' Role (``kfp-gpu tenant add``), ClusterRole
    kfp-gpu-controller, ClusterRole kfp-gpu-controller-tenant, the controller's Role in kfp-gpu-system, the janitor's
    ClusterRole and its lock Role; each row must be what the manifest grants."""
    text = DOCS.read_text()
    tables = _doc_tables(text[text.index("## 1. Kubernetes RBAC"):text.index("## 2.")])
    controller, janitor_docs = manifest_docs(CONTROLLER_MANIFEST), manifest_docs(JANITOR_MANIFEST)
    want = [_rows(by_name(install.tenant_objects("ns"), "Role", STEP_SA)["rules"]),
            _rows(by_name(controller, "ClusterRole", CONTROLLER_ROLE)["rules"]),
            _rows(by_name(controller, "ClusterRole", TENANT_ROLE)["rules"]),
            _rows(by_name(controller, "Role", CONTROLLER_ROLE)["rules"]),
            _rows(by_name(janitor_docs, "ClusterRole", JANITOR_SA)["rules"]),
            _rows(by_name(janitor_docs, "Role", f"{JANITOR_SA}-lock")["rules"])]
    assert len(tables) == len(want), f"docs/rbac-iam.md section 1: {len(tables)} tables, want {len(want)}"
    for i, (doc, manifest) in enumerate(zip(tables, want, strict=True)):
        assert doc == manifest, (f"docs/rbac-iam.md table {i + 1}: the docs say "
                                 f"{ {k: sorted(v) for k, v in doc.items() if manifest.get(k) != v} }, the manifest "
                                 f"{ {k: sorted(v) for k, v in manifest.items() if doc.get(k) != v} }")


# ---- live access checks ---------------------------------------------------------------------------------

@integration
def test_controller_identity_can_exactly_what_the_step_functions_do(step_identity: Identity, namespace: str) -> None:
    assert step_identity.username == f"system:serviceaccount:{namespace}:{CONTROLLER_SA}"
    denied = [n for n in STEP_NEEDS if not _can(step_identity, n, namespace)]
    assert denied == [], f"the controller's identity is missing {denied}"
    # namespaced rules stay in the (tenant) namespace; the CRD read stays on its names; the rest is never granted
    elsewhere = [n for n, (scope, _) in STEP_NEEDS.items() if scope == NS and _can(step_identity, n, "default")]
    assert elsewhere == [], f"the controller's identity reaches into namespace default (no tenant): {elsewhere}"
    assert not step_identity.can("get", "customresourcedefinitions", "apiextensions.k8s.io", name=pytorchjob.PLURAL
                                 + "." + pytorchjob.GROUP)
    allowed = [n for n, scope in NEVER if _can(step_identity, n, namespace if scope == NS else "")]
    assert allowed == [], f"the controller's identity may {allowed}"


@integration
def test_tenant_step_identity_can_exactly_what_the_gang_client_does(kube, namespace: str, tmp_path: Path) -> None:
    me = bind(kube.api, namespace, STEP_SA, tmp_path, _tenant_rbac(namespace))
    denied = [n for n in TENANT_NEEDS if not _can(me, n, namespace)]
    assert denied == [], f"the steps' {STEP_SA} is missing {denied}"
    reach = [n for n in TENANT_NEEDS if _can(me, n, "default")]
    assert reach == [], f"the steps' {STEP_SA} reaches into namespace default: {reach}"
    beyond = [n for n in (*STEP_NEEDS, *(n for n, _ in NEVER)) if n not in TENANT_NEEDS and _can(me, n, namespace)]
    assert beyond == [], f"the steps' {STEP_SA} may {beyond}"


@integration
def test_janitor_service_account_can_exactly_what_gc_does(janitor_identity: Identity, namespace: str) -> None:
    denied = [n for n, (scope, _) in JANITOR_NEEDS.items()
              if not _can(janitor_identity, n, namespace if scope == NS else "")]
    assert denied == [], f"{JANITOR_SA} is missing {denied}"
    assert not _can(janitor_identity, ("coordination.k8s.io", "leases", "get"), "default")
    creates = [n for n in (("", "pods", "create"), ("kubeflow.org", "pytorchjobs", "create"), ("", "configmaps",
                                                                                              "create"))
               if _can(janitor_identity, n, namespace)]
    assert creates == [], f"the janitor must never create workloads: {creates}"
    allowed = [n for n, scope in NEVER if _can(janitor_identity, n, namespace if scope == NS else "")]
    assert allowed == [], f"{JANITOR_SA} may {allowed}"


# ---- behaviour ------------------------------------------------------------------------------------------

@integration
def test_a_missing_rule_fails_the_step_with_a_one_line_permission_error(env, kube, tmp_path: Path,
                                                                        rbac_identity: IdentityFactory) -> None:
    e = env()
    spec = e.spec(2, zones=("us-central1-a",), deadline=60)
    crippled = rbac_identity(CONTROLLER_SA, drop=(("", "nodes", "patch"),))
    wait_until("nodes patch revoked", lambda: not crippled.can("patch", "nodes"), timeout=10, every=0.05)
    run = f"run-{uuid.uuid4().hex[:6]}"
    result = tmp_path / "outcome.json"
    try:
        proc = _unit_proc("scale_up", spec, run, crippled.kubeconfig, result)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode not in (0, None), err
        assert "Traceback" not in err, f"a 403 must not surface as a traceback:\n{err}"
        failed = [line for line in err.splitlines() if line.startswith("kfp-gpu scale_up failed:")]
        assert len(failed) == 1 and "patch" in failed[0] and "nodes" in failed[0], err
        error = json.loads(result.read_text())["error"]  # what the runner records in the gang's status
        assert error["type"] == "PermissionDenied", error
        assert "controller-rbac.yaml" in error["remediation"], error
    finally:
        from kfp_gpu.steps import teardown

        teardown.run(spec, run, "", api=kube.api, provider=e.provider(spec))  # admin cleanup
    e.wait_pool("a100-80gb-spot-a", 0)


@integration
def test_preflight_reads_the_cluster_as_the_controller_identity(env, rbac_identity: IdentityFactory) -> None:
    from kfp_gpu.steps.preflight import run_preflight

    e = env()
    spec = e.spec(2)
    res = run_preflight(spec, e.provider(spec), e.step_api)
    checks = {c.name: c for c in res.cluster_checks}
    assert {"gpu-capacity", "namespace-quota", "kueue"} <= set(checks)
    unknown = {n: c.detail for n, c in checks.items() if c.verdict is Verdict.UNKNOWN}
    assert unknown == {}, f"cluster checks preflight could not make as the controller's identity: {unknown}"
    # without "list resourcequotas" that check cannot be made, and says so (no traceback, no silent FITS)
    crippled = rbac_identity(CONTROLLER_SA, drop=(("", "resourcequotas", "list"),))
    wait_until("resourcequotas list revoked", lambda: not crippled.can("list", "resourcequotas",
                                                                       namespace=e.ns), timeout=10, every=0.05)
    quota = {c.name: c for c in run_preflight(spec, e.provider(spec), crippled.api).cluster_checks}["namespace-quota"]
    assert quota.verdict is Verdict.UNKNOWN and "403" in quota.detail and "RBAC" in quota.remediation, quota


@integration
def test_janitor_service_account_releases_a_run_and_its_orphans(env, kube, janitor_api) -> None:
    e = env()
    spec = e.spec(2, warm=1, zones=("us-central1-a",))
    run, orphan = f"run-{uuid.uuid4().hex[:6]}", f"orph-{uuid.uuid4().hex[:6]}"
    warm_pool.run(spec, run, "", api=e.step_api, provider=e.provider(spec))
    cap = json.loads(scale_up.run(spec, run, "", api=e.step_api, provider=e.provider(spec)).output_json)
    nodes = [n for p in cap["placements"] for n in p["nodes"]]
    job = pytorchjob.job_name(run, "train")  # the run's job, created with the controller's identity
    client.CustomObjectsApi(e.step_api).create_namespaced_custom_object(
        pytorchjob.GROUP, pytorchjob.VERSION, e.ns, pytorchjob.PLURAL,
        {"apiVersion": f"{pytorchjob.GROUP}/{pytorchjob.VERSION}", "kind": "PyTorchJob",
         "metadata": {"name": job, "labels": {LABEL_RUN_ID: label_safe(run)}},
         "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {
             "nodeSelector": {"kfp-gpu.io/none": "x"},
             "containers": [{"name": "pytorch", "image": "busybox"}]}}}}}})
    # an orphan: a balloon of a run that never wrote a ledger, its lease long expired
    expired = Owner.for_step(orphan, "warm_pool", -60)
    balloons.create_balloons(e.step_api, e.ns, expired, 1, 8, "nvidia-a100-80gb", [])

    # --all-namespaces as the janitor's account: lists (and checks owners) across the cluster, changes nothing
    wide = janitor.collect(e.ns, api=janitor_api, dry_run=True, all_namespaces=True)
    assert wide.runs.get(label_safe(run)) == "live", str(wide)
    rep = janitor.collect(e.ns, api=janitor_api, provider=e.provider(spec), now=time.time() + spec.lease_ttl_s + 1)
    assert rep.runs[label_safe(run)] == "released", str(rep)
    assert any(o.startswith("pod/") for o in rep.orphans), str(rep)
    assert ledger.list_for_run(kube.api, e.ns, run) == []
    assert e.nodes(f"{LABEL_RUN_ID}={label_safe(run)}") == [], f"claims left on {nodes}"
    wait_until("the run's job deleted", lambda: pytorchjob.get(kube.api, e.ns, job) is None, timeout=30)
    wait_until("balloons deleted", lambda: kube.core.list_namespaced_pod(
        e.ns, label_selector=f"{ownership.BALLOON_LABEL}=true").items == [], timeout=30)
    e.wait_pool("a100-80gb-spot-a", 0)


def _unit_proc(step: str, spec: ProvisioningSpec, run: str, kubeconfig: Path, result: Path) -> subprocess.Popen[str]:
    """A controller work unit (:func:`kfp_gpu.controller.work.execute`) in its own process, reaching the cluster
    through ``kubeconfig``; its outcome (what the runner records) goes to ``result``."""
    code = ("import sys\nfrom kfp_gpu.controller.work import execute\n"
            f"raise SystemExit(execute({step!r}, sys.argv[1], {run!r}, '', sys.argv[2]))\n")
    return subprocess.Popen([sys.executable, "-c", code, spec.to_json(), str(result)], cwd=PKG.parent, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "KUBECONFIG": str(kubeconfig)})


def _gc_cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kfp-gpu gc`` as an admin runs it with the janitor's token (tests/unit covers the parsing)."""
    return subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "gc", *args], cwd=PKG.parent, text=True,
                          capture_output=True, timeout=120, env={**os.environ, "KUBECONFIG": str(kubeconfig)})


@integration
def test_the_gc_command_runs_as_the_janitor_account(janitor_identity: Identity, kube, namespace: str) -> None:
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"  # --run: sweep every namespace, but release nothing of other runs
    res = _gc_cli(janitor_identity.kubeconfig, "--all-namespaces", "--lock-namespace", namespace, "--run", ghost)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "held by this janitor" in res.stdout, res.stdout
    lock = client.CoordinationV1Api(kube.api).read_namespaced_lease("kfp-gpu-janitor", namespace)
    assert lock.spec.renew_time is not None and not lock.spec.holder_identity  # taken, then released


@integration
def test_a_janitor_without_its_lock_rule_fails_in_one_line(rbac_identity: IdentityFactory, namespace: str) -> None:
    crippled = rbac_identity(JANITOR_SA, drop=(("coordination.k8s.io", "leases", "create"),))
    wait_until("leases create revoked", lambda: not crippled.can("create", "leases", "coordination.k8s.io",
                                                                 namespace=namespace), timeout=10, every=0.05)
    res = _gc_cli(crippled.kubeconfig, "--all-namespaces", "--lock-namespace", namespace, "--run", "ghost")
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "create" in lines[0] and "leases" in lines[0], res.stderr


@integration
def test_step_identity_is_a_service_account_not_the_admin(step_identity: Identity, kube) -> None:
    """The step functions' client carries only the ServiceAccount's bearer token: no client certificate, same
    apiserver."""
    cfg = step_identity.api.configuration
    assert not cfg.cert_file and not cfg.key_file
    assert cfg.host == kube.api.configuration.host
    review = client.AuthenticationV1Api(step_identity.api).create_self_subject_review(client.V1SelfSubjectReview())
    assert review.status.user_info.username == step_identity.username
