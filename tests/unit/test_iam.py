"""The shipped cloud roles (deploy/) against the calls the code makes, both ways, and docs/rbac-iam.md against them.

The calls are found by parsing the providers' source (``_call("kind", "method"`` and the direct client calls), so a
new call fails here until its permission is in the role, and a permission no call needs fails here too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kfp_gpu import iam
from kfp_gpu_rehearsal.sim import routes
from kfp_gpu_rehearsal.sim.gcp_iam import denied

PKG = Path(iam.__file__).parent
GKE = PKG / "providers" / "gke"
EKS = PKG / "providers" / "eks"

# google-cloud client (kind, method) -> the REST call it sends (what the google clients' REST transports do)
_C, _Z = "/compute/v1/projects/p", "/compute/v1/projects/p/zones/z"
_G = "/v1/projects/p/locations/l"
CLIENT_REST = {
    ("igm", "get"): ("GET", f"{_Z}/instanceGroupManagers/g"),
    ("igm", "list_errors"): ("GET", f"{_Z}/instanceGroupManagers/g/listErrors"),
    ("igm", "aggregated_list"): ("GET", f"{_C}/aggregated/instanceGroupManagers"),
    ("igm", "delete_instances_unary"): ("POST", f"{_Z}/instanceGroupManagers/g/deleteInstances"),
    ("zone_ops", "get"): ("GET", f"{_Z}/operations/o"),
    ("reservations", "get"): ("GET", f"{_Z}/reservations/r"),
    ("reservations", "insert_unary"): ("POST", f"{_Z}/reservations"),
    ("reservations", "delete_unary"): ("DELETE", f"{_Z}/reservations/r"),
    ("reservations", "aggregated_list"): ("GET", f"{_C}/aggregated/reservations"),
    ("regions", "get"): ("GET", f"{_C}/regions/r"),
    ("projects", "get"): ("GET", _C),
    ("container", "list_node_pools"): ("GET", f"{_G}/clusters/c/nodePools"),
    ("container", "get_node_pool"): ("GET", f"{_G}/clusters/c/nodePools/np"),
    ("container", "set_node_pool_size"): ("POST", f"{_G}/clusters/c/nodePools/np:setSize"),
    ("container", "get_operation"): ("GET", f"{_G}/operations/o"),
    ("quotas", "get_quota_info"): ("GET", f"{_G}/services/compute.googleapis.com/quotaInfos/q"),
    ("quotas", "get_quota_preference"): ("GET", f"{_G}/quotaPreferences/q"),
    ("quotas", "list_quota_preferences"): ("GET", f"{_G}/quotaPreferences"),
    ("quotas", "create_quota_preference"): ("POST", f"{_G}/quotaPreferences"),
    ("quotas", "update_quota_preference"): ("PATCH", f"{_G}/quotaPreferences/q"),
}
# the quota request's own reads of the current limit (quota.request_increase -> _current_limit)
QUOTA_REQUEST_READS = {"compute.regions.get", "compute.projects.get"}
# what EksProvider.request_quota_increase calls (kfp-gpu quota request), besides AWS_QUOTA_REQUEST_ONLY
AWS_QUOTA_REQUEST_READS = {"servicequotas:GetServiceQuota", "servicequotas:GetAWSDefaultServiceQuota"}


def _gke_calls(path: Path) -> set[tuple[str, str]]:
    text = path.read_text()
    found = set(re.findall(r'_call[(,]\s*"(\w+)",\s*"(\w+)"', text))
    found |= {(kind, m) for kind, m in re.findall(r'client\("(\w+)"\)\.(\w+)\(', text)}
    return found


def _gcp_perms(calls: set[tuple[str, str]]) -> set[str]:
    unknown = calls - CLIENT_REST.keys()
    assert not unknown, f"calls with no REST mapping here (add them to CLIENT_REST and their permission to the role): {unknown}"
    perms = {iam.gcp_permission(*CLIENT_REST[c]) for c in calls}
    assert "" not in perms, f"a call kfp_gpu.iam.GCP_CALLS does not know: {calls}"
    return perms


def test_the_gcp_roles_grant_exactly_what_the_code_calls() -> None:
    files = sorted(GKE.glob("*.py"))
    controller = set().union(*(_gke_calls(f) for f in files if f.name != "preferences.py"))
    requester = _gke_calls(GKE / "preferences.py")
    assert ("igm", "delete_instances_unary") in controller  # teardown's pool restore, recovery's slot release
    assert iam.gcp_permissions(iam.GCP_ROLE) == _gcp_perms(controller)
    assert iam.gcp_permissions(iam.GCP_QUOTA_ROLE) == _gcp_perms(requester) | QUOTA_REQUEST_READS


def test_the_pre_fix_role_lacked_delete_instances_permission() -> None:
    """The role docs/rbac-iam.md shipped before (kfpGpuProvisioner) against the calls: deleteInstances was uncovered."""
    old = {"container.clusters.get", "container.nodePools.get", "container.nodePools.list", "container.nodePools.update",
           "container.operations.get", "compute.instanceGroupManagers.get", "compute.instanceGroupManagers.list",
           "compute.zoneOperations.get", "compute.regions.get", "compute.projects.get", "compute.reservations.create",
           "compute.reservations.delete", "compute.reservations.list", "compute.reservations.get",
           "cloudquotas.quotas.get", "serviceusage.services.use"}
    needed = iam.gcp_permissions(iam.GCP_ROLE)
    assert needed - old == {"compute.instanceGroupManagers.update", "container.clusters.update"}
    # GKE has no container.nodePools.* permissions (nodePools.get/list need container.clusters.get, setSize
    # container.clusters.update: docs/sim.md); serviceusage.services.use: no call sets a quota project
    assert old - needed == {"container.nodePools.get", "container.nodePools.list", "container.nodePools.update",
                            "serviceusage.services.use"}


def _route_samples() -> list[tuple[str, str, str]]:
    """(method, a concrete path, route name) for every Google route the GKE stand-in serves."""
    out = []
    for method, rx, name, _ in routes.ROUTES:
        if name.startswith("sim."):
            continue
        pattern = rx.pattern.strip("^$")
        alts = re.findall(r"\(\?P<\w+>([\w|]+)\)", pattern)  # (?P<kind>zones|regions)
        for alt in (alts[0].split("|") if alts else [""]):
            path = re.sub(r"\(\?P<\w+>[\w|]+\)", alt, pattern) if alt else pattern
            out.append((method, re.sub(r"\(\?P<(\w+)>[^)]*\)", r"\1", path), name))
    return out


def test_every_stand_in_route_has_its_permission_in_the_one_table() -> None:
    """The stand-in checks the permission of :data:`kfp_gpu.iam.GCP_CALLS`; a route it lacks would go unchecked."""
    samples = _route_samples()
    assert len(samples) >= 25
    missing = [(m, p, n) for m, p, n in samples if not iam.gcp_permission(m, p)]
    assert not missing, missing
    # every table row is a route the stand-in serves (no dead rows)
    for call in iam.GCP_CALLS:
        assert any(m == call.method and re.fullmatch(call.path, p) for m, p, _ in samples), call


def test_the_route_names_agree_with_the_table() -> None:
    for method, path, name in _route_samples():
        perm = iam.gcp_permission(method, path)
        service, resource = name.split(".")[:2]
        if resource == "operations" and service == "compute":
            assert perm in ("compute.zoneOperations.get", "compute.regionOperations.get"), (name, perm)
        elif resource in ("quotaInfos", "quotaPreferences"):
            assert perm.startswith("cloudquotas.quotas."), (name, perm)
        elif resource == "nodePools":  # checked on the cluster
            assert perm == ("container.clusters.update" if method == "POST" else "container.clusters.get"), (name, perm)
        else:
            assert perm.startswith(f"{service}.{resource}."), (name, perm)


def _aws_api_names() -> dict[tuple[str, str], str]:
    import botocore.session
    from botocore import xform_name

    session = botocore.session.get_session()
    out = {}
    for client in iam.AWS_PREFIX:
        model = session.get_service_model(client)
        out.update({(client, xform_name(op)): op for op in model.operation_names})
    return out


def test_the_aws_policies_allow_exactly_what_the_code_calls() -> None:
    text = "\n".join(f.read_text() for f in sorted(EKS.glob("*.py")))
    calls = set(re.findall(r'_call\(\s*"([\w-]+)",\s*"(\w+)"', text))
    calls |= {("ec2", op) for op in re.findall(r'get_paginator\("(\w+)"\)', text)}
    names = _aws_api_names()
    unknown = calls - names.keys()
    assert not unknown, unknown
    actions = {f"{iam.AWS_PREFIX[c]}:{names[(c, op)]}" for c, op in calls}
    assert "TagSpecifications" in (EKS / "reservations.py").read_text()  # tag on create: AWS_IMPLIED applies
    implied = {x for a in actions for x in iam.AWS_IMPLIED.get(a, ())}
    assert iam.AWS_QUOTA_REQUEST_ONLY <= actions
    assert iam.aws_actions(iam.AWS_POLICY) == (actions - iam.AWS_QUOTA_REQUEST_ONLY) | implied
    assert iam.aws_actions(iam.AWS_QUOTA_POLICY) == set(iam.AWS_QUOTA_REQUEST_ONLY) | AWS_QUOTA_REQUEST_READS


def test_the_gcp_role_file_is_what_gcloud_takes() -> None:
    for rel in (iam.GCP_ROLE, iam.GCP_QUOTA_ROLE):
        role = iam.gcp_role(rel)
        assert set(role) <= {"title", "description", "stage", "includedPermissions"}, rel
        assert role["stage"] in ("ALPHA", "BETA", "GA") and len(role["title"]) <= 100, rel
        perms = role["includedPermissions"]
        assert len(perms) == len(set(perms)) and all(re.fullmatch(r"[a-z]+\.[A-Za-z]+\.[A-Za-z]+", p) for p in perms)


def test_the_aws_policy_files_are_policy_documents() -> None:
    for rel in (iam.AWS_POLICY, iam.AWS_QUOTA_POLICY):
        doc = iam.aws_policy(rel)
        assert doc["Version"] == "2012-10-17", rel
        for st in doc["Statement"]:
            assert st["Effect"] == "Allow" and st["Resource"] and "*" not in "".join(st["Action"]), (rel, st)


def test_docs_rbac_iam_cloud_sections_are_generated_from_the_files() -> None:
    text = (iam.REPO / iam.DOC).read_text()
    assert iam.render_doc(text) == text, "docs/rbac-iam.md is stale: run python -m kfp_gpu.iam --write-doc"
    for perm in iam.gcp_permissions():
        assert f"| `{perm}` |" in text


@pytest.mark.parametrize(("path", "shape"), [
    (f"{_Z}/instanceGroupManagers/g/deleteInstances",
     "Required 'compute.instanceGroupManagers.update' permission for 'projects/p/zones/z/instanceGroupManagers/g'"),
    (f"{_G}/clusters/c/nodePools/np:setSize",
     'Required "compute.instanceGroupManagers.update" permission(s) for "projects/p/locations/l/clusters/c".'),
    (f"{_G}/quotaPreferences", "Permission 'compute.instanceGroupManagers.update' denied on resource "
     "'//cloudquotas.googleapis.com/projects/p/locations/l/quotaPreferences' (or it may not exist)."),
])
def test_the_stand_in_refusal_names_the_permission_in_the_apis_shape(path: str, shape: str) -> None:
    err = denied(path, "compute.instanceGroupManagers.update")
    assert err.status == 403 and err.body["error"]["message"] == shape
