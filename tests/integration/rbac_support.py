"""Run code as the controller's identity or the janitor's (no tests here; fixtures in conftest.py).

* :func:`render_controller` turns kfp_gpu/manifests/controller-rbac.yaml into the controller's rights for a
  ServiceAccount of a test namespace: ClusterRole ``kfp-gpu-controller`` through a ClusterRoleBinding and
  ClusterRole ``kfp-gpu-controller-tenant`` through the RoleBinding ``kfp-gpu tenant add`` writes
  (:func:`kfp_gpu.install.tenant_objects`), both renamed per test and optionally with rules taken out (negative
  tests). That is the identity the step functions run under (the controller's work units).
* :func:`render` does the same for deploy/janitor-rbac.yaml (the janitor, ``kfp-gpu gc``; the documented
  ``kubeflow-user`` replaced structurally).
* :func:`apply` creates them with the admin client; :func:`delete_cluster_scoped` removes what the
  namespace's deletion does not.
* :func:`identity` mints a token for a ServiceAccount with the TokenRequest API and returns an ApiClient
  that talks to the same apiserver with only that bearer token (no client certificate), plus a kubeconfig
  file for step subprocesses.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kfp_gpu import install
from kfp_gpu.gang import api as gang
from kfp_gpu_rehearsal.devcluster.controller import token_kubeconfig
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
CONTROLLER_MANIFEST = install.MANIFESTS / "controller-rbac.yaml"
JANITOR_MANIFEST = ROOT / "deploy" / "janitor-rbac.yaml"
DOC_NAMESPACE = "kubeflow-user"  # the namespace janitor-rbac.yaml documents (its header says to replace it)
CONTROLLER_SA, JANITOR_SA = gang.CONTROLLER_SA, "kfp-gpu-janitor"
CONTROLLER_ROLE, TENANT_ROLE = "kfp-gpu-controller", install.TENANT_CLUSTER_ROLE  # controller-rbac.yaml's ClusterRoles
NAMESPACED = {"ServiceAccount", "Role", "RoleBinding"}
CLUSTER = {"ClusterRole", "ClusterRoleBinding"}

Obj = dict[str, Any]
# (apiGroup, resource, verb) -> keep the rule? Used to take one permission out of a rendered manifest.
Drop = tuple[str, str, str]


def manifest_docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_name(objs: list[Obj], kind: str, name: str) -> Obj:
    """The one object of ``kind`` named ``name``. Raises: AssertionError naming what is missing."""
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: found {len(found)}"
    return found[0]


def render_controller(namespace: str, *, isolate: str = "", drop: Iterable[Drop] = (),
                      sa: str = CONTROLLER_SA) -> list[Obj]:
    """The controller's rights (controller-rbac.yaml) for ServiceAccount ``namespace/sa``, ``namespace`` being a
    tenant: the ServiceAccount, both ClusterRoles (renamed ``<name>-<isolate>`` so a test's copy never changes
    another test's rules), a ClusterRoleBinding of ``kfp-gpu-controller`` (named after ``isolate`` or the
    namespace) and the tenant RoleBinding of :func:`kfp_gpu.install.tenant_objects` pointed at ``sa``. ``drop``
    removes single verbs from every rule that grants them. Of the controller's own Role in kfp-gpu-system, only its
    ledger rule (configmaps: the step functions' ledgers live in the controller's namespace) is rendered, as a Role
    ``kfp-gpu-controller-ledgers`` in ``namespace`` (a step function run by a test keeps its ledgers in the gang's
    namespace, kfp_gpu/cluster/ledger.py); the rest of that Role (kopf's leases and peering) is no step function's.
    """
    docs = manifest_docs(CONTROLLER_MANIFEST)
    suffix = f"-{isolate}" if isolate else ""
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]
    managed = {"kfp-gpu.io/managed": "true"}
    roles = [copy.deepcopy(by_name(docs, "ClusterRole", n)) for n in (CONTROLLER_ROLE, TENANT_ROLE)]
    for role in roles:
        role["metadata"]["name"] += suffix
    binding = copy.deepcopy(by_name(docs, "ClusterRoleBinding", CONTROLLER_ROLE))
    binding["metadata"]["name"] = f"{CONTROLLER_ROLE}-{isolate or namespace}"
    binding["roleRef"]["name"] += suffix
    binding["subjects"] = subject
    tenant = copy.deepcopy(by_name(install.tenant_objects(namespace), "RoleBinding", install.CONTROLLER_BINDING))
    assert tenant["roleRef"]["name"] == TENANT_ROLE, tenant
    tenant["roleRef"]["name"] += suffix
    tenant["subjects"] = subject
    home = copy.deepcopy(by_name(docs, "Role", CONTROLLER_ROLE))
    home["metadata"] = {"name": f"{CONTROLLER_ROLE}-ledgers", "namespace": namespace, "labels": dict(managed)}
    home["rules"] = [r for r in home["rules"] if "configmaps" in r["resources"]]
    home_binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": f"{CONTROLLER_ROLE}-ledgers", "namespace": namespace,
                                 "labels": dict(managed)},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                "name": f"{CONTROLLER_ROLE}-ledgers"},
                    "subjects": subject}
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": sa, "namespace": namespace, "labels": dict(managed)}}
    return [account, *_dropped([*roles, home], set(drop)), binding, tenant, home_binding]


def render(namespace: str, *, isolate: str = "", drop: Iterable[Drop] = (), path: Path = JANITOR_MANIFEST) -> list[Obj]:
    """A per-namespace manifest's objects (deploy/janitor-rbac.yaml) for ``namespace``.

    ``isolate`` (a suffix) renames the ClusterRoles so a test's copy never changes another test's rules
    (the manifest shares them between namespaces). ``drop`` removes single verbs from every rule that
    grants them.

    Raises: AssertionError for a kind this renderer does not know (extend it with the manifest).
    """
    out: list[Obj] = []
    for doc in manifest_docs(path):
        doc = copy.deepcopy(doc)
        kind, meta = doc["kind"], doc["metadata"]
        assert kind in NAMESPACED | CLUSTER, f"{path.name}: unexpected kind {kind}"
        if kind in NAMESPACED:
            meta["namespace"] = namespace
        if kind == "ClusterRoleBinding":
            assert meta["name"].endswith(f"-{DOC_NAMESPACE}"), f"{meta['name']}: must end in -{DOC_NAMESPACE}"
            meta["name"] = meta["name"][: -len(DOC_NAMESPACE)] + namespace
        if kind == "ClusterRole" and isolate:
            meta["name"] = f"{meta['name']}-{isolate}"
        ref = doc.get("roleRef")
        if ref and ref["kind"] == "ClusterRole" and isolate:
            ref["name"] = f"{ref['name']}-{isolate}"
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
        out.append(doc)
    return _dropped(out, set(drop))


def _dropped(objs: list[Obj], dropped: set[Drop]) -> list[Obj]:
    for doc in objs:
        if dropped and "rules" in doc:
            doc["rules"] = [_without(rule, dropped) for rule in doc["rules"]]
            doc["rules"] = [r for r in doc["rules"] if r["verbs"]]
    return objs


def _without(rule: Obj, dropped: set[Drop]) -> Obj:
    rule = dict(rule)
    rule["verbs"] = [v for v in rule["verbs"]
                     if not any((g, r, v) in dropped for g in rule["apiGroups"] for r in rule["resources"])]
    return rule


def apply(api: client.ApiClient, objs: list[Obj]) -> None:
    """Create (or replace) ``objs`` as the admin. Raises: ApiException."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    calls: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
        "ServiceAccount": (core.create_namespaced_service_account, core.replace_namespaced_service_account),
        "Role": (rbac.create_namespaced_role, rbac.replace_namespaced_role),
        "RoleBinding": (rbac.create_namespaced_role_binding, rbac.replace_namespaced_role_binding),
        "ClusterRole": (rbac.create_cluster_role, rbac.replace_cluster_role),
        "ClusterRoleBinding": (rbac.create_cluster_role_binding, rbac.replace_cluster_role_binding),
    }
    for obj in objs:
        create, replace = calls[obj["kind"]]
        ns = [obj["metadata"]["namespace"]] if obj["kind"] in NAMESPACED else []
        try:
            create(*ns, obj)
        except ApiException as exc:
            if exc.status != 409:
                raise
            replace(obj["metadata"]["name"], *ns, obj)


def delete_cluster_scoped(api: client.ApiClient, objs: list[Obj]) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    for obj in objs:
        fn = {"ClusterRole": rbac.delete_cluster_role,
              "ClusterRoleBinding": rbac.delete_cluster_role_binding}.get(obj["kind"])
        if fn is None:
            continue
        try:
            fn(obj["metadata"]["name"])
        except ApiException as exc:
            if exc.status != 404:
                raise


class RecordingApiClient(client.ApiClient):
    """An ApiClient that remembers every 401/403 answer, including those the code catches and only logs
    (heartbeats, watch retries, preflight checks that turn into UNKNOWN)."""

    def __init__(self, configuration: client.Configuration) -> None:
        super().__init__(configuration)
        self.denied: list[str] = []

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().request(method, url, *args, **kwargs)
        except ApiException as exc:
            msg = _message(exc)
            if exc.status == 401 or (exc.status == 403 and _RBAC_DENIAL.search(msg)):  # not webhook denials
                self.denied.append(f"{method} {url.split('?')[0]}: {msg}")
            raise


_RBAC_DENIAL = re.compile(r'User ".*" cannot ')


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


@dataclass(frozen=True)
class Identity:
    """A ServiceAccount as seen by the apiserver: ``api`` sends only its bearer token."""

    namespace: str
    name: str
    api: RecordingApiClient
    kubeconfig: Path

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    def can(self, verb: str, resource: str, group: str = "", namespace: str = "", subresource: str = "",
            name: str = "") -> bool:
        """``kubectl auth can-i`` as this identity (a SelfSubjectAccessReview sent with its token)."""
        review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, resource=resource, group=group, namespace=namespace or None,
                subresource=subresource or None, name=name or None)))
        res = client.AuthorizationV1Api(self.api).create_self_subject_access_review(review)
        return bool(res.status.allowed)


def identity(admin: client.ApiClient, namespace: str, sa: str, tmp: Path, ttl_s: int = 3600) -> Identity:
    """Mint a token for ``namespace/sa`` (TokenRequest) and a client using only it. Raises: ApiException."""
    req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[],
                                                                             expiration_seconds=ttl_s))
    token = client.CoreV1Api(admin).create_namespaced_service_account_token(sa, namespace, req).status.token
    src = admin.configuration
    cfg = client.Configuration()
    cfg.host = src.host
    cfg.ssl_ca_cert = src.ssl_ca_cert
    cfg.verify_ssl = True
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    cfg.connection_pool_maxsize = 64
    kubeconfig = token_kubeconfig(admin, namespace, sa, token, tmp / f"kubeconfig-{namespace}-{sa}")
    return Identity(namespace, sa, RecordingApiClient(cfg), kubeconfig)


def bind(admin: client.ApiClient, namespace: str, sa: str, tmp: Path, objs: list[Obj]) -> Identity:
    """Apply ``objs`` and return ``sa``'s identity once the apiserver's RBAC cache grants its first rule."""
    apply(admin, objs)
    ident = identity(admin, namespace, sa, tmp)
    for probe in _probes(objs, sa):
        wait_until(f"RBAC for {sa} to take effect ({probe})", lambda p=probe: ident.can(*p, namespace=namespace),
                   timeout=10, every=0.05)
    return ident


def _probes(objs: list[Obj], sa: str) -> list[tuple[str, str, str]]:
    """One plain rule of every role bound to ``sa``: granted once the apiserver has seen all bindings."""
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in objs
             if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
             and any(s["name"] == sa for s in b.get("subjects") or [])}
    out = []
    for obj in objs:
        if (obj["kind"], obj["metadata"]["name"]) in bound:
            out += [(r["verbs"][0], r["resources"][0], r["apiGroups"][0]) for r in obj.get("rules") or []
                    if r["verbs"] and not r.get("resourceNames") and "/" not in r["resources"][0]][:1]
    return out
