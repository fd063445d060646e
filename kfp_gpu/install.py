"""``kfp-gpu install`` and ``kfp-gpu tenant add|remove``: the control plane and its tenants, server-side applied.

The control plane is the kustomize base ``kfp_gpu/manifests/`` (package data; ``kubectl apply -k deploy/`` applies
the same objects): the GpuGang/GpuPolicy CRDs, the controller's ServiceAccount and RBAC, the
claim-toleration ValidatingAdmissionPolicy and the controller Deployment. Its ``kustomization.yaml`` is expanded
here (``resources`` and ``images`` only: no kustomize binary is needed).

A tenant is a namespace whose pipelines may ask for GPUs (:func:`tenant_objects`): labelled
``kfp-gpu.io/tenant=true`` (the admission policy then guards its pods), ServiceAccount ``kfp-gpu`` for the steps
with a Role that reaches GpuGangs and the step's own pod only, a RoleBinding that gives the controller its namespaced rights
there (ClusterRole ``kfp-gpu-controller-tenant``) and a GpuPolicy ``tenant-<namespace>`` with its limits.

Everything is applied with field manager ``kfp-gpu`` and ``force``, so running a command again converges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kfp_gpu import job_fields, kubeapply, ownership
from kfp_gpu.errors import InvalidSpec, KfpGpuError, NotFound
from kfp_gpu.gang import api as gang
from kfp_gpu.ownership import LABEL_MANAGED, TENANT_NAMESPACE_LABEL

Obj = dict[str, Any]
Log = Callable[[str], None]

MANIFESTS = Path(__file__).resolve().parent / "manifests"
CONTROLLER_KINDS = frozenset({"Deployment", "Service"})  # left out by --no-controller
CONTROLLER_IMAGE = "kfp-gpu"  # the image name controller.yaml uses, set by kustomization.yaml's `images`
TENANT_CLUSTER_ROLE = "kfp-gpu-controller-tenant"
CONTROLLER_BINDING = "kfp-gpu-controller"

# The steps' Role in a tenant namespace: the GpuGang API (kfp_gpu/gang/client.py) and reading the step's own pod;
# nothing else (no pod writes, nodes or jobs). tests/integration/test_rbac.py checks it against the code's calls.
STEP_RULES: list[Obj] = [
    {"apiGroups": [gang.GROUP], "resources": [gang.PLURAL],
     "verbs": ["get", "list", "watch", "create", "patch", "delete"]},  # the run's gang: intent, answer, release
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},  # the step's own pod: its Argo Workflow (the owner)
]

# GpuPolicy limits: keyword (tenant_add / tenant_objects) -> spec field, and the defaults of `kfp-gpu tenant add`.
LIMIT_FIELDS = {
    "accelerators": "accelerators", "capacity_types": "capacityTypes", "pools": "pools", "backends": "backends",
    "max_gpus_per_gang": "maxGpusPerGang", "max_gpus_per_namespace": "maxGpusPerNamespace",
    "max_run_seconds": "maxRunSeconds", "allow_quota_requests": "allowQuotaRequests",
}
DEFAULT_LIMITS: dict[str, Any] = {
    "max_gpus_per_gang": 64, "max_gpus_per_namespace": 128, "max_run_seconds": 604800.0,
    "allow_quota_requests": False,
}



# ---- the manifests ------------------------------------------------------------------------------------------

def manifests(controller: bool = True, image: str = "") -> list[Obj]:
    """The control plane's objects, in apply order (``kfp_gpu/manifests/kustomization.yaml`` expanded).

    ``controller=False`` leaves out the controller's Deployment and Service; ``image`` replaces the controller's
    image reference. Raises: InvalidSpec (a bad ``image``); KfpGpuError (a kustomization this expander cannot
    read).
    """
    objs = _kustomize(MANIFESTS, {CONTROLLER_IMAGE: _valid_image(image)} if image else {})
    return [o for o in objs if controller or o["kind"] not in CONTROLLER_KINDS]


def optional(name: str) -> list[Obj]:
    """The objects of ``manifests/optional/<name>.yaml`` (not in the base: ``kfp-gpu install --<name>``)."""
    return [d for d in yaml.safe_load_all((MANIFESTS / "optional" / f"{name}.yaml").read_text()) if d]


def kueue_topology(scheme: str) -> list[Obj]:
    """``kfp-gpu install --kueue-topology gke|eks``: the Kueue ``Topology`` named ``kfp-gpu-<scheme>`` whose levels are
    that cloud's node topology labels (kfp_gpu.plan.topology.kueue_topology); a TAS ResourceFlavor names it in
    ``spec.topologyName``. Raises: InvalidSpec (an unknown scheme)."""
    from kfp_gpu.cluster import node_labels
    from kfp_gpu.errors import InvalidSpec
    from kfp_gpu.plan.topology import kueue_topology as build

    if scheme not in ("gke", "eks"):
        raise InvalidSpec("--kueue-topology", scheme, "allowed: 'gke', 'eks'",
                          remediation="gke for GKE's gce-topology-* labels, eks for EKS's network-node-layer-* labels")
    return [build(f"kfp-gpu-{scheme}", node_labels.get(scheme).topology)]


def _valid_image(image: str) -> str:
    from kfp_gpu.image import validate_image

    return validate_image(image, "--image")


def _kustomize(directory: Path, override: Mapping[str, str]) -> list[Obj]:
    """The objects of the kustomization in ``directory``; ``override`` maps an image name to the reference
    that replaces it (over the kustomization's own ``images``)."""
    path = directory / "kustomization.yaml"
    spec = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    unknown = set(spec) - {"apiVersion", "kind", "resources", "images"}
    if unknown:
        raise KfpGpuError(f"{path} uses {sorted(unknown)}, which kfp_gpu/install.py does not expand",
                          remediation="teach kfp_gpu.install._kustomize those fields, or drop them")
    objs: list[Obj] = []
    for entry in spec.get("resources") or []:
        target = (directory / entry).resolve()
        if target.is_dir():
            objs += _kustomize(target, override)
        else:
            objs += [dict(d) for d in yaml.safe_load_all(target.read_text(encoding="utf-8")) if d]
    images = [*(i for i in spec.get("images") or [] if i["name"] not in override),
              *({"name": k, "newName": v} for k, v in override.items())]
    for img in images:
        ref = str(img.get("newName") or img["name"])
        if img.get("newTag"):
            ref += f":{img['newTag']}"
        if img.get("digest"):
            ref += f"@{img['digest']}"
        _set_image(objs, str(img["name"]), ref)
    return objs


def _set_image(objs: Iterable[Obj], name: str, ref: str) -> None:
    """Point every container whose image is ``name`` at ``ref`` (kustomize's ``images``)."""
    for obj in objs:
        for c in _containers(obj):
            if c.get("image") == name:
                c["image"] = ref


def _containers(obj: Obj) -> list[Obj]:
    pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    return [*(pod.get("containers") or []), *(pod.get("initContainers") or [])]


def to_yaml(objs: Iterable[Obj]) -> str:
    """Multi-document YAML of ``objs`` (what ``--dry-run`` prints)."""
    return yaml.safe_dump_all(list(objs), sort_keys=False, default_flow_style=False)


# ---- tenants ------------------------------------------------------------------------------------------------

def policy_name(namespace: str) -> str:
    return f"tenant-{namespace}"


def tenant_objects(namespace: str, **limits: Any) -> list[Obj]:
    """What ``kfp-gpu tenant add NAMESPACE`` applies (see the module docstring), limits over the defaults.

    Raises: InvalidSpec (a namespace that cannot be a tenant, an unknown limit or a bad value).
    """
    ns = check_namespace(namespace)
    managed = {LABEL_MANAGED: "true"}

    def meta(name: str, **extra: Any) -> Obj:
        return {"name": name, "namespace": ns, "labels": dict(managed), **extra}

    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {ownership.TENANT_LABEL: "true"}}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(gang.STEP_SA)},
        {"apiVersion": rbac, "kind": "Role", "metadata": meta(gang.STEP_SA), "rules": [dict(r) for r in STEP_RULES]},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": meta(gang.STEP_SA),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": gang.STEP_SA},
         "subjects": [{"kind": "ServiceAccount", "name": gang.STEP_SA, "namespace": ns}]},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": meta(CONTROLLER_BINDING),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": TENANT_CLUSTER_ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": gang.CONTROLLER_SA, "namespace": gang.CONTROLLER_NAMESPACE}]},
        {"apiVersion": gang.API_VERSION, "kind": gang.POLICY_KIND,
         "metadata": {"name": policy_name(ns), "labels": {**managed, TENANT_NAMESPACE_LABEL: ns}},
         "spec": policy_spec(ns, **limits)},
    ]


def check_namespace(namespace: str) -> str:
    """``namespace`` if it can be a tenant. Raises: InvalidSpec naming the value and the fix."""
    ns = job_fields.namespace("namespace", namespace.strip())
    if ns == gang.CONTROLLER_NAMESPACE or ns.startswith("kube-"):
        raise InvalidSpec("namespace", namespace, f"is a system namespace ({gang.CONTROLLER_NAMESPACE}, kube-*): "
                          "the controller must not get pod rights there", remediation="pass the namespace your "
                          "pipelines run in")
    return ns


def policy_spec(namespace: str, **limits: Any) -> Obj:
    """The GpuPolicy spec of a tenant: ``namespaces: [namespace]`` and the limits (defaults overridden).

    Lists (accelerators, capacity_types, pools, backends) left empty allow any value. Raises: InvalidSpec.
    """
    unknown = set(limits) - set(LIMIT_FIELDS)
    if unknown:
        raise InvalidSpec("limit", sorted(unknown)[0], f"is not a GpuPolicy limit; one of {sorted(LIMIT_FIELDS)}")
    merged = {**DEFAULT_LIMITS, **{k: v for k, v in limits.items() if v is not None}}
    spec: Obj = {"namespaces": [namespace]}
    for key, field in LIMIT_FIELDS.items():
        if key in merged:
            value = _check_limit(key, merged[key])
            if value != []:
                spec[field] = value
    return spec


def _check_limit(key: str, value: Any) -> Any:
    """``value`` of limit ``key`` in its GpuPolicy form. Raises: InvalidSpec naming the flag and the value."""
    from kfp_gpu import accelerators
    from kfp_gpu.spec import CapacityType
    from kfp_gpu.spec_target import PROVISIONERS

    flag = "--" + key.replace("_", "-")
    choices: dict[str, tuple[str, ...]] = {
        "accelerators": accelerators.names(), "capacity_types": tuple(c.value for c in CapacityType),
        "backends": PROVISIONERS, "pools": (),
    }
    if key in choices:
        items = [value] if isinstance(value, str) else list(value)
        items = [str(v).strip() for v in items if str(v).strip()]
        for v in items:
            if choices[key] and v not in choices[key]:
                raise InvalidSpec(flag, v, f"must be one of {', '.join(choices[key])}")
        return items
    if key == "allow_quota_requests":
        if not isinstance(value, bool):
            raise InvalidSpec(flag, value, "must be true or false")
        return value
    if key == "max_run_seconds":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise InvalidSpec(flag, value, "must be a number of seconds >= 0")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidSpec(flag, value, "must be a whole number of GPUs >= 0")
    return value


# ---- applying -----------------------------------------------------------------------------------------------

def apply(api: client.ApiClient | None, *, dry_run: bool = False, controller: bool = True, image: str = "",
          autoscaler_status: bool = False, log: Log | None = None, topology: str = "") -> list[str]:
    """Server-side apply the control plane; one line per object (also passed to ``log`` as it goes).
    ``autoscaler_status``: also the optional read of a self-managed cluster-autoscaler's status ConfigMap
    (``manifests/optional/autoscaler-status.yaml``).

    The Namespace and the CRDs go first and are waited for (Established) before anything that needs them.
    ``dry_run`` changes nothing and needs no cluster. Raises: KfpGpuError (PermissionDenied, NotFound...) naming
    the object and the fix; InvalidSpec (a bad ``image``).
    """
    objs = manifests(controller=controller, image=image) + (optional("autoscaler-status") if autoscaler_status else [])
    objs += kueue_topology(topology) if topology else []  # ``topology``: --kueue-topology (Kueue must be installed)
    if dry_run or api is None:
        return _emit([f"{kubeapply.describe(o)} (dry run: not applied)" for o in objs], log)
    first = [o for o in objs if o["kind"] in ("Namespace", "CustomResourceDefinition")]
    lines = _apply_all(api, first, log)
    kubeapply.wait_established(api, [o["metadata"]["name"] for o in first if o["kind"] == "CustomResourceDefinition"])
    return lines + _apply_all(api, [o for o in objs if o not in first], log)


def tenant_add(api: client.ApiClient | None, namespace: str, *, dry_run: bool = False, log: Log | None = None,
               **limits: Any) -> list[str]:
    """Make ``namespace`` a tenant (:func:`tenant_objects`); idempotent. ``dry_run`` changes nothing and needs no
    cluster. Raises: InvalidSpec; NotFound (``kfp-gpu install`` has not run); PermissionDenied; KfpGpuError."""
    objs = tenant_objects(namespace, **limits)
    if dry_run or api is None:
        return _emit([f"{kubeapply.describe(o)} (dry run: not applied)" for o in objs], log)
    crd = f"{gang.POLICY_PLURAL}.{gang.GROUP}"
    if not kubeapply.crd_exists(api, crd):
        raise NotFound(f"the kfp-gpu API is not installed in this cluster (CRD {crd} is missing)",
                       remediation="run `kfp-gpu install` first (as a cluster admin)")
    lines = _apply_all(api, objs[:1], log)
    with kubeapply.refusal(f"namespace/{namespace}", "get"):
        uid = kubeapply.request(api, "GET", kubeapply.path(objs[0]))["metadata"]["uid"]
    policy = objs[-1]  # owned by the Namespace: the garbage collector deletes it with the namespace, so a deleted
    # tenant leaves no GpuPolicy behind for a later namespace of the same name
    policy["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Namespace", "name": namespace.strip(),
                                              "uid": uid}]
    lines += _apply_all(api, objs[1:], log)
    return lines + _emit([f"warning: {w}" for w in legacy_bindings(api, objs[0]["metadata"]["name"])], log)


def tenant_remove(api: client.ApiClient, namespace: str, *, force: bool = False,
                  log: Log | None = None) -> list[str]:
    """Undo :func:`tenant_add`: the GpuPolicy, both RoleBindings, the Role, the ServiceAccount and the namespace's
    tenant label (the namespace itself stays).

    Refuses while the namespace still has GpuGangs (the controller needs its RoleBinding there to release them)
    unless ``force``. Raises: KfpGpuError naming the gangs and the fix; InvalidSpec; PermissionDenied.
    """
    ns = check_namespace(namespace)
    objs = tenant_objects(ns)
    gangs = gang_names(api, ns)
    if gangs and not force:
        raise KfpGpuError(f"namespace {ns} still has {len(gangs)} GpuGang(s): {', '.join(gangs[:5])}",
                          remediation=f"wait for their runs to finish or release them (kubectl delete gpugangs --all "
                          f"-n {ns}), or pass --force (the controller then cannot clean up after them)", gangs=gangs)
    lines = [_emit([kubeapply.delete(api, o)], log)[0] for o in reversed(objs[1:])]
    unlabel = {"metadata": {"labels": {ownership.TENANT_LABEL: None}}}
    with kubeapply.refusal(f"namespace/{ns}", "unlabel"):
        found = kubeapply.ignore_404(lambda: kubeapply.request(
            api, "PATCH", kubeapply.path(objs[0]), body=unlabel, content_type="application/merge-patch+json"))
    return lines + _emit([f"namespace/{ns} {'unlabelled ' + ownership.TENANT_LABEL if found else 'not found'}"], log)


def gang_names(api: client.ApiClient, namespace: str) -> list[str]:
    """The GpuGangs of ``namespace`` (none when the API is not installed). Raises: PermissionDenied."""
    url = f"/apis/{gang.API_VERSION}/namespaces/{namespace}/{gang.PLURAL}"
    items: list[Obj] = []

    def read() -> None:
        items.extend(kubeapply.request(api, "GET", url).get("items") or [])

    with kubeapply.refusal(f"the GpuGangs of namespace {namespace}", "list"):
        kubeapply.ignore_404(read)
    return sorted(str(i["metadata"]["name"]) for i in items)


def legacy_bindings(api: client.ApiClient, namespace: str) -> list[str]:
    """ClusterRoleBindings that still give the steps' ServiceAccount of ``namespace`` cluster-wide rights (the
    per-namespace deploy/rbac.yaml did): with the controller the steps need none. One warning each."""
    try:
        items = kubeapply.request(api, "GET", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings").get("items")
    except ApiException:  # not allowed to list them: nothing to say
        return []
    out = []
    for b in items or []:
        if any(s.get("kind") == "ServiceAccount" and s.get("name") == gang.STEP_SA and s.get("namespace") == namespace
               for s in b.get("subjects") or []):
            name = b["metadata"]["name"]
            out.append(f"clusterrolebinding/{name} still grants ServiceAccount {namespace}/{gang.STEP_SA} the "
                       f"ClusterRole {b['roleRef']['name']} (the older deploy/rbac.yaml); the steps need no "
                       f"cluster-wide rights now: kubectl delete clusterrolebinding {name}")
    return out


def limits_from(values: Mapping[str, Any]) -> dict[str, Any]:
    """The limits among ``values`` (e.g. parsed CLI flags) that were given (not None)."""
    return {k: values[k] for k in LIMIT_FIELDS if values.get(k) is not None}


def _apply_all(api: client.ApiClient, objs: list[Obj], log: Log | None) -> list[str]:
    """Apply ``objs`` in order, logging each line as it is applied."""
    return [_emit([kubeapply.apply(api, o)], log)[0] for o in objs]


def _emit(lines: list[str], log: Log | None) -> list[str]:
    for line in lines:
        if log is not None:
            log(line)
    return lines
