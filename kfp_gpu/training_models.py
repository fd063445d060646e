"""A kubeflow-training SDK PyTorchJob as JobTemplate fields.

Accepts ``kubeflow.training.models.KubeflowOrgV1PyTorchJob``, ``KubeflowOrgV1PyTorchJobSpec`` or the same
as a plain (camelCase) dict. kfp-gpu takes the Master/Worker pod template (both must be the same, since
every gang node runs one) and keeps what the user set there; it fills in placement, gang size (replicas),
restarts, ownership labels and the resume env itself, so ``runPolicy`` and ``elasticPolicy`` must be empty.
The SDK is imported lazily (only to serialise its models).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from kfp_gpu import job_fields as f
from kfp_gpu.errors import InvalidSpec

_POD_TAKEN = {"containers", "volumes", "serviceAccountName", "serviceAccount", "tolerations", "affinity",
              "nodeSelector", "imagePullSecrets", "restartPolicy"}
_CONTAINER_TAKEN = {"name", "image", "command", "args", "env", "resources", "volumeMounts"}


def template_fields(job: Any) -> dict[str, Any]:
    """JobTemplate keyword arguments from a kubeflow-training PyTorchJob (or its spec).

    Raises:
        InvalidSpec: naming the part of ``job`` kfp-gpu cannot keep and what to do instead.
    """
    d = _plain(job)
    if not isinstance(d, Mapping):
        raise InvalidSpec("job", type(job).__name__, "must be a kubeflow-training KubeflowOrgV1PyTorchJob, "
                          "KubeflowOrgV1PyTorchJobSpec or the same as a dict")
    meta: Mapping[str, Any] = {}
    where = "job"
    if "pytorchReplicaSpecs" not in d and isinstance(d.get("spec"), Mapping):
        kind = d.get("kind")
        if kind not in (None, "PyTorchJob"):
            raise InvalidSpec("job.kind", kind, "only a PyTorchJob can be handed to kfp_gpu.train()")
        meta, d, where = d.get("metadata") or {}, d["spec"], "job.spec"
    replicas = d.get("pytorchReplicaSpecs")
    if not isinstance(replicas, Mapping) or not replicas:
        raise InvalidSpec(f"{where}.pytorchReplicaSpecs", replicas, "must hold a Master (and/or Worker) replica spec")
    for key in sorted(k for k, v in d.items() if k not in ("pytorchReplicaSpecs", "nprocPerNode") and v):
        what = ("kfp-gpu owns the run policy (restarts, gang size, cleanup)" if key == "runPolicy"
                else "kfp-gpu runs a fixed-size gang; set nproc_per_node instead" if key == "elasticPolicy"
                else "is not supported")
        raise InvalidSpec(f"{where}.{key}", d[key], what, remediation=f"remove {where}.{key}")
    other = sorted(set(replicas) - {"Master", "Worker"})
    if other:
        raise InvalidSpec(f"{where}.pytorchReplicaSpecs.{other[0]}", "...", "only Master and Worker are supported")
    templates = {}
    for rtype in ("Master", "Worker"):
        if rtype in replicas:
            rs = replicas[rtype] or {}
            templates[rtype] = _pod_fields(f"{where}.pytorchReplicaSpecs.{rtype}.template", rs.get("template") or {})
    fields = templates.get("Master") or templates["Worker"]
    if len(templates) == 2 and templates["Master"] != templates["Worker"]:
        diff = sorted(k for k in fields if templates["Master"].get(k) != templates["Worker"].get(k))
        raise InvalidSpec(f"{where}.pytorchReplicaSpecs.Worker.template", diff,
                          "differs from the Master template in these fields; every gang node runs the same pod",
                          remediation="make Master and Worker templates identical (or give only Master)")
    if d.get("nprocPerNode") is not None:
        fields["nproc_per_node"] = d["nprocPerNode"]
    labels = {**(meta.get("labels") or {}), **dict(fields.get("labels", {}))}
    annotations = {**(meta.get("annotations") or {}), **dict(fields.get("annotations", {}))}
    if labels:
        fields["labels"] = labels
    if annotations:
        fields["annotations"] = annotations
    if meta.get("name"):
        fields["name"] = meta["name"]
    return fields


def _pod_fields(where: str, template: Mapping[str, Any]) -> dict[str, Any]:
    meta, spec = template.get("metadata") or {}, template.get("spec") or {}
    out: dict[str, Any] = {}
    if meta.get("labels"):
        out["labels"] = dict(meta["labels"])
    if meta.get("annotations"):
        out["annotations"] = dict(meta["annotations"])
    containers = spec.get("containers") or []
    if len(containers) != 1:
        raise InvalidSpec(f"{where}.spec.containers", [c.get("name") for c in containers],
                          "must hold exactly one container (named 'pytorch')",
                          remediation="move sidecars into the training image; kfp-gpu runs one container per node")
    pod_extra = _extras(spec, _POD_TAKEN, f.POD_EXTRA_KEYS, f"{where}.spec", "pod")
    if pod_extra:
        out["pod_extra"] = pod_extra
    c = containers[0]
    cwhere = f"{where}.spec.containers[0]"
    if c.get("name") not in ("pytorch", None):
        raise InvalidSpec(f"{cwhere}.name", c.get("name"), "the Training Operator requires the name 'pytorch'")
    container_extra = _extras(c, _CONTAINER_TAKEN, f.CONTAINER_EXTRA_KEYS, cwhere, "container")
    if container_extra:
        out["container_extra"] = container_extra
    if not c.get("image"):
        raise InvalidSpec(f"{cwhere}.image", c.get("image"), "the container needs an image")
    out["image"] = c["image"]
    if c.get("command"):
        out["command"] = list(c["command"])
    if c.get("args"):
        out["args"] = list(c["args"])
    env = {}
    for e in c.get("env") or []:
        env[e["name"]] = {"valueFrom": e["valueFrom"]} if e.get("valueFrom") else e.get("value", "")
    if env:
        out["env"] = env
    res = {k: {r: q for r, q in (v or {}).items() if r != f.GPU_RESOURCE}  # kfp-gpu sets the node's GPUs
           for k, v in (c.get("resources") or {}).items() if k in ("requests", "limits")}
    res = {k: v for k, v in res.items() if v}
    if set(c.get("resources") or {}) - {"requests", "limits"}:
        extra = sorted(set(c["resources"]) - {"requests", "limits"})
        raise InvalidSpec(f"{cwhere}.resources.{extra[0]}", c["resources"][extra[0]], "is not supported; "
                          "use requests and limits")
    if res:
        out["resources"] = res
    _volumes(where, spec, c, out)
    sa = spec.get("serviceAccountName") or spec.get("serviceAccount")
    if sa:
        out["service_account"] = sa
    if spec.get("tolerations"):
        out["tolerations"] = list(spec["tolerations"])
    _affinity(where, spec, out)
    if spec.get("imagePullSecrets"):
        out["image_pull_secrets"] = [s.get("name") for s in spec["imagePullSecrets"]]
    return out


def _volumes(where: str, spec: Mapping[str, Any], c: Mapping[str, Any], out: dict[str, Any]) -> None:
    """Volumes and mounts; an emptyDir (medium Memory) mounted at /dev/shm becomes ``shm_size``."""
    vols = list(spec.get("volumes") or [])
    mounts = list(c.get("volumeMounts") or [])
    shm = [m for m in mounts if str(m.get("mountPath", "")).rstrip("/") == f.SHM_PATH]
    for m in shm:
        vol = next((v for v in vols if v.get("name") == m.get("name")), None)
        src = (vol or {}).get("emptyDir")
        if src is None or src.get("medium") != "Memory" or not src.get("sizeLimit"):
            raise InvalidSpec(f"{where}.spec.volumes[{m.get('name')}]", vol, "/dev/shm must be an emptyDir with "
                              "medium Memory and a sizeLimit", remediation="set emptyDir.sizeLimit (e.g. '16Gi')")
        out["shm_size"] = src["sizeLimit"]
        vols.remove(vol)
        mounts.remove(m)
    if vols:
        out["volumes"] = vols
    if mounts:
        out["volume_mounts"] = mounts


def _affinity(where: str, spec: Mapping[str, Any], out: dict[str, Any]) -> None:
    """nodeAffinity and nodeSelector (as match expressions) become extra node affinity."""
    aff = dict(spec.get("affinity") or {})
    for key in sorted(k for k, v in aff.items() if k != "nodeAffinity" and v):
        raise InvalidSpec(f"{where}.spec.affinity.{key}", aff[key], "kfp-gpu places one pod on each gang node itself",
                          remediation=f"remove affinity.{key}")
    node = dict(aff.get("nodeAffinity") or {})
    selector = spec.get("nodeSelector") or {}
    if selector:
        exprs = [{"key": k, "operator": "In", "values": [v]} for k, v in sorted(selector.items())]
        req_key = f.NODE_AFFINITY_KEYS[0]
        terms = (node.get(req_key) or {}).get("nodeSelectorTerms") or [{}]
        node[req_key] = {"nodeSelectorTerms": [
            {**t, "matchExpressions": list(t.get("matchExpressions") or []) + exprs} for t in terms]}
    node = {k: v for k, v in node.items() if v}
    if node:
        out["node_affinity"] = node


def _plain(job: Any) -> Any:
    if isinstance(job, Mapping):
        return job
    if hasattr(job, "openapi_types"):
        try:
            from kubeflow.training import ApiClient
        except ImportError:  # pragma: no cover - the SDK that built ``job`` is installed
            from kubernetes.client import ApiClient
        return _drop_none(ApiClient().sanitize_for_serialization(job))
    return job


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def _extras(obj: dict[str, Any], taken: Collection[str], kept: Sequence[str], where: str, what: str
            ) -> dict[str, Any]:
    """The fields of ``obj`` kfp-gpu does not set itself, passed through as they are.

    Raises: InvalidSpec naming the first field that is neither set by kfp-gpu nor in ``kept``.
    """
    extra = {k: v for k, v in obj.items() if k not in taken and v is not None}
    bad = sorted(set(extra) - set(kept))
    if bad:
        raise InvalidSpec(f"{where}.{bad[0]}", extra[bad[0]], f"kfp-gpu cannot keep this {what} field",
                          remediation=f"remove it; kept {what} fields: {', '.join(kept)}")
    return extra
