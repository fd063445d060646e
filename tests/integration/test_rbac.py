"""Least privilege, proven: the steps and the janitor hold exactly the permissions deploy/rbac.yaml grants.

* Sufficient: every integration test of the steps runs them as the kfp-gpu ServiceAccount (``step_api``),
  the janitor as kfp-gpu-janitor (``janitor_api``); a rule missing from the manifest fails those tests.
* Exact: ``STEP_NEEDS`` / ``JANITOR_NEEDS`` (tests/integration/rbac_needs.py) list each permission with the
  reason; the manifest and docs/rbac-iam.md grant those and nothing else; every Kubernetes client method and
  raw request the code makes (found by parsing kfp_gpu/) maps to permissions in those lists (``CODE_CALLS``,
  ``RAW_CALLS``), and every listed permission is used. A new call without its rule fails.
* Live: each permission is checked with a SelfSubjectAccessReview sent with the ServiceAccount's own token
  (``kubectl auth can-i``), and so are some it must not have.
* Negative: with one verb taken out of the manifest, the step fails with a one-line PermissionDenied
  naming the verb and the resource, not a traceback.
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

from kfp_gpu.cluster import balloons, ledger, pytorchjob
from kfp_gpu.plan.quota import Verdict
from kfp_gpu.providers.base import LABEL_RUN_ID, Owner, label_safe
from kfp_gpu.steps import janitor, scale_up, warm_pool
from tests.integration import test_provisioning
from tests.integration.conftest import IdentityFactory
from tests.integration.rbac_needs import (
    ADMIN_ONLY,
    CLUSTER,
    CODE_CALLS,
    JANITOR_NEEDS,
    NAMED,
    NEVER,
    NS,
    OWNED_KINDS,
    RAW_CALLS,
    STEP_NEEDS,
    Need,
)
from tests.integration.rbac_support import (
    DOC_NAMESPACE,
    JANITOR_SA,
    MANIFEST,
    STEP_SA,
    Identity,
    Obj,
    manifest_docs,
    render,
)
from tests.waiting import wait_until

integration = pytest.mark.integration  # the manifest/code/docs checks need no cluster; the rest do
env = test_provisioning.env  # the GKE stand-in fixture
_step_proc = test_provisioning._step_proc
PKG = Path(__file__).resolve().parents[2] / "kfp_gpu"
DOCS = PKG.parent / "docs" / "rbac-iam.md"
NOT_THE_CLIENT = ("devcluster", "sim")  # the local cluster and the cloud stand-in run as admin, not as a step

def _api_methods() -> set[str]:
    apis = [getattr(client, n) for n in dir(client) if n.endswith("Api") and n not in ("ApiClient",)]
    return {m for a in apis if isinstance(a, type) for m in vars(a)
            if not m.startswith("_") and not m.endswith("_with_http_info") and m != "api_client"}


def _referenced_methods() -> dict[str, list[str]]:
    """Client methods referenced (called or passed to a watch) outside the dev cluster and the stand-in."""
    methods, found = _api_methods(), dict[str, list[str]]()
    for rel, tree in _modules():
        skip = {id(n) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and (rel, fn.name) in ADMIN_ONLY
                for n in ast.walk(fn)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in methods and id(node) not in skip:
                found.setdefault(node.attr, []).append(f"{rel}:{node.lineno}")
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
        if not rel.startswith(NOT_THE_CLIENT):
            out.append((rel, ast.parse(path.read_text())))
    return out


def _granted(objs: list[Obj], sa: str) -> dict[Need, str]:
    """(group, resource, verb) -> scope the rendered manifest grants ``sa`` ("namespace" or "cluster")."""
    bindings = [b for b in objs if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in b["subjects"])]
    out: dict[Need, str] = {}
    for b in bindings:
        role = next(o for o in objs if o["kind"] == b["roleRef"]["kind"] and o["metadata"]["name"] ==
                    b["roleRef"]["name"])
        scope = CLUSTER if b["kind"] == "ClusterRoleBinding" else NS
        for rule in role["rules"]:
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        if out.get((g, r, v)) != CLUSTER:
                            out[(g, r, v)] = scope
    return out


def _can(ident: Identity, need: Need, namespace: str) -> bool:
    group, resource, verb = need
    res, _, sub = resource.partition("/")
    return ident.can(verb, res, group, namespace=namespace, subresource=sub, name=NAMED.get(need, ""))


# ---- the manifest ---------------------------------------------------------------------------------------

def test_manifest_documents_its_namespace_and_renders_like_the_documented_sed() -> None:
    text = MANIFEST.read_text()
    assert f"sed 's/{DOC_NAMESPACE}/ml-team/g' deploy/rbac.yaml" in text  # the instruction users follow
    assert render(DOC_NAMESPACE) == manifest_docs()  # applied as-is, the file is what we test
    sedded = [d for d in yaml.safe_load_all(text.replace(DOC_NAMESPACE, "ml-team")) if d]
    assert render("ml-team") == sedded
    a, b = render("team-a"), render("team-b")
    names = {o["metadata"]["name"] for o in a + b if o["kind"] == "ClusterRoleBinding"}
    assert len(names) == 4, "a second namespace must add ClusterRoleBindings, not replace the first ones"


def test_manifest_grants_exactly_the_listed_permissions() -> None:
    objs = render("ns")
    for sa, needs in ((STEP_SA, STEP_NEEDS), (JANITOR_SA, JANITOR_NEEDS)):
        granted = _granted(objs, sa)
        assert granted == {k: scope for k, (scope, _) in needs.items()}, (
            f"{sa}: granted but not listed: {sorted(set(granted) - set(needs))}; "
            f"listed but not granted: {sorted(set(needs) - set(granted))}")
    names = {(g, r, v): rule.get("resourceNames") for o in objs for rule in o.get("rules") or []
             for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert {k: v[0] for k, v in names.items() if v} == NAMED


def test_every_client_call_is_covered() -> None:
    found = _referenced_methods()
    unmapped = {m: where for m, where in found.items() if m not in CODE_CALLS}
    assert not unmapped, f"Kubernetes client calls without permissions in CODE_CALLS (and the manifest): {unmapped}"
    raw = _raw_calls()
    unmapped_raw = {k: where for k, where in raw.items() if k not in RAW_CALLS}
    assert not unmapped_raw, f"raw API requests without permissions in RAW_CALLS (and the manifest): {unmapped_raw}"
    listed = set(STEP_NEEDS) | set(JANITOR_NEEDS)
    needs = {m: CODE_CALLS[m] for m in found} | {f"{k[0]}:{k[1]} {k[2]}": RAW_CALLS[k] for k in raw}
    missing = {m: sorted(n - listed) for m, n in needs.items() if n - listed}
    assert not missing, f"calls whose permissions deploy/rbac.yaml does not grant: {missing}"
    used = set().union(*needs.values())
    unused = sorted(listed - used)
    assert not unused, f"granted but no call in kfp_gpu needs it (drop it from the manifest and the lists): {unused}"


def test_the_owned_kinds_table_matches_raw_calls() -> None:
    """RAW_CALLS assumes kfp_gpu.cluster.owned's Kind table; a new kind must be added there too."""
    from kfp_gpu.cluster import owned

    kinds = {(k.prefix.split("/")[2] if k.prefix.startswith("/apis/") else "", k.plural)
             for k in vars(owned).values() if isinstance(k, owned.Kind)}
    assert kinds == OWNED_KINDS


def test_docs_tables_match_the_manifest() -> None:
    """docs/rbac-iam.md section 1 has four tables: components' Role, components' ClusterRole, janitor's
    ClusterRole, janitor's lock Role; each row must be what the manifest grants."""
    text = DOCS.read_text()
    section = text[text.index("## 1. Kubernetes RBAC"):text.index("## 2.")]
    tables: list[dict[tuple[str, str], set[str]]] = []
    in_table = False
    for line in section.splitlines():
        if line.startswith("|") and not in_table:
            tables.append({})
        in_table = line.startswith("|")
        if line.startswith("| `"):
            first, verbs = [c.strip() for c in line.strip("|").split("|")][:2]
            group = first.rsplit("(", 1)[1].rstrip(")")
            tables[-1][("" if group == "core" else group, first.split("`")[1])] = set(verbs.split(", "))
    objs = render("ns")
    want = []
    for sa, scope in ((STEP_SA, NS), (STEP_SA, CLUSTER), (JANITOR_SA, CLUSTER), (JANITOR_SA, NS)):
        rows: dict[tuple[str, str], set[str]] = {}
        for (g, r, v), sc in _granted(objs, sa).items():
            if sc == scope:
                rows.setdefault((g, r), set()).add(v)
        want.append(rows)
    assert tables == want


# ---- live access checks ---------------------------------------------------------------------------------

@integration
def test_step_service_account_can_exactly_what_the_steps_do(step_identity: Identity, namespace: str) -> None:
    assert step_identity.username == f"system:serviceaccount:{namespace}:{STEP_SA}"
    denied = [n for n, (scope, _) in STEP_NEEDS.items() if not _can(step_identity, n, namespace)]
    assert denied == [], f"{STEP_SA} is missing {denied}"
    # namespaced rules stay in the namespace; the CRD read stays on its one name; the rest is never granted
    elsewhere = [n for n, (scope, _) in STEP_NEEDS.items() if scope == NS and _can(step_identity, n, "default")]
    assert elsewhere == [], f"{STEP_SA} reaches into namespace default: {elsewhere}"
    assert not step_identity.can("get", "customresourcedefinitions", "apiextensions.k8s.io", name=pytorchjob.PLURAL
                                 + "." + pytorchjob.GROUP)
    allowed = [n for n, scope in NEVER if _can(step_identity, n, namespace if scope == NS else "")]
    assert allowed == [], f"{STEP_SA} may {allowed}"


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
def test_a_missing_rule_fails_the_step_with_a_one_line_permission_error(env, kube,
                                                                        rbac_identity: IdentityFactory) -> None:
    e = env()
    spec = e.spec(2, zones=("us-central1-a",), deadline=60)
    crippled = rbac_identity(STEP_SA, drop=(("", "nodes", "patch"),))
    wait_until("nodes patch revoked", lambda: not crippled.can("patch", "nodes"), timeout=10, every=0.05)
    run = f"run-{uuid.uuid4().hex[:6]}"
    try:
        proc = _step_proc("scale_up", spec, run, crippled.kubeconfig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode not in (0, None), err
        assert "Traceback" not in err, f"a 403 must not surface as a traceback:\n{err}"
        first = err.strip().splitlines()[0]
        assert first.startswith("kfp-gpu scale_up failed:") and "patch" in first and "nodes" in first, err
        error = json.loads(err.strip().splitlines()[-1])["error"]
        assert error["type"] == "PermissionDenied", error
        assert "deploy/rbac.yaml" in error["remediation"], error
    finally:
        from kfp_gpu.steps import teardown

        teardown.run(spec, run, "", api=kube.api, provider=e.provider(spec))  # admin cleanup
    e.wait_pool("a100-80gb-spot-a", 0)


@integration
def test_preflight_reads_the_cluster_as_the_step_service_account(env, rbac_identity: IdentityFactory) -> None:
    from kfp_gpu.steps.preflight import run_preflight

    e = env()
    spec = e.spec(2)
    res = run_preflight(spec, e.provider(spec), e.step_api)
    checks = {c.name: c for c in res.cluster_checks}
    assert {"gpu-capacity", "namespace-quota", "kueue"} <= set(checks)
    unknown = {n: c.detail for n, c in checks.items() if c.verdict is Verdict.UNKNOWN}
    assert unknown == {}, f"cluster checks the step could not make as {STEP_SA}: {unknown}"
    # without "list resourcequotas" that check cannot be made, and says so (no traceback, no silent FITS)
    crippled = rbac_identity(STEP_SA, drop=(("", "resourcequotas", "list"),))
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
    job = pytorchjob.job_name(run, "train")  # the run's job, created by the step's account
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
        e.ns, label_selector=f"{balloons.BALLOON_LABEL}=true").items == [], timeout=30)
    e.wait_pool("a100-80gb-spot-a", 0)


def _gc_cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kfp-gpu gc`` as the CronJob runs it, with the janitor's token (tests/unit covers the parsing)."""
    return subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "gc", *args], cwd=PKG.parent, text=True,
                          capture_output=True, timeout=120, env={**os.environ, "KUBECONFIG": str(kubeconfig)})


@integration
def test_the_cronjob_command_runs_as_the_janitor_account(janitor_identity: Identity, kube, namespace: str) -> None:
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
def test_step_client_is_the_service_account_not_the_admin(step_identity: Identity, kube) -> None:
    """The step client carries only the ServiceAccount's bearer token: no client certificate, same apiserver."""
    cfg = step_identity.api.configuration
    assert not cfg.cert_file and not cfg.key_file
    assert cfg.host == kube.api.configuration.host
    review = client.AuthenticationV1Api(step_identity.api).create_self_subject_review(client.V1SelfSubjectReview())
    assert review.status.user_info.username == step_identity.username
