"""Validation and normalisation of the JobTemplate's Kubernetes-shaped fields (no I/O, no kfp imports).

Every function takes the user's value and the field name it came from, and returns the normalised value
(plain JSON types, mappings as sorted tuples of pairs) or raises :class:`~kfp_gpu.errors.InvalidSpec` naming
that field. A *placeholder* (``{"__kfp_gpu_param__": "p0"}``, a pipeline parameter or upstream output the
train component resolves at run time) stands for a string: it is kept as is and not validated here; the
train step validates the resolved value when it parses the template again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.ownership import RESUME_STEP_ANNOTATION, RUN_ID_RAW_ANNOTATION

PLACEHOLDER_KEY = "__kfp_gpu_param__"
GPU_RESOURCE = "nvidia.com/gpu"
SHM_PATH = "/dev/shm"
SHM_VOLUME = "dshm"
#: label keys kfp-gpu sets on the job and its pods (ownership, job name, operator bookkeeping)
RESERVED_LABEL_PREFIXES = ("kfp-gpu.io/", "training.kubeflow.org/")
RESERVED_ANNOTATIONS = (RUN_ID_RAW_ANNOTATION, RESUME_STEP_ANNOTATION)
VOLUME_SOURCES = ("persistentVolumeClaim", "secret", "configMap", "emptyDir")
_SOURCE_NAME_KEY = {"persistentVolumeClaim": "claimName", "secret": "secretName", "configMap": "name"}
MOUNT_KEYS = ("name", "mountPath", "readOnly", "subPath", "subPathExpr", "mountPropagation")
TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
NODE_AFFINITY_KEYS = ("requiredDuringSchedulingIgnoredDuringExecution", "preferredDuringSchedulingIgnoredDuringExecution")
#: container / pod fields passed through unchanged (everything kfp-gpu does not fill in itself)
CONTAINER_EXTRA_KEYS = ("workingDir", "imagePullPolicy", "securityContext", "envFrom", "ports")
POD_EXTRA_KEYS = ("priorityClassName", "securityContext", "terminationGracePeriodSeconds", "runtimeClassName",
                  "dnsPolicy", "dnsConfig", "enableServiceLinks")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+)?$")
_SUFFIX = {"": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}
_NATIVE = ("cpu", "memory", "ephemeral-storage")


def is_placeholder(value: Any) -> bool:
    """True for a run-time value marker ``{"__kfp_gpu_param__": ...}`` (stands for a string)."""
    return isinstance(value, dict) and set(value) == {PLACEHOLDER_KEY}


def plain(value: Any) -> Any:
    """A Kubernetes / kubeflow-training client model (or a structure of them) as plain camelCase JSON."""
    if hasattr(value, "openapi_types") or isinstance(value, (list, tuple)) and any(
            hasattr(v, "openapi_types") for v in value):
        from kubernetes.client import ApiClient

        return ApiClient().sanitize_for_serialization(value)
    return value


def text(field: str, value: Any, *, allow_empty: bool = True) -> Any:
    """A string (numbers are turned into strings) or a placeholder. Raises: InvalidSpec."""
    if is_placeholder(value):
        return dict(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = f"{value:g}" if isinstance(value, float) else str(value)
    if not isinstance(value, str):
        raise InvalidSpec(field, value, "must be a string (or a pipeline parameter)")
    if not allow_empty and not value:
        raise InvalidSpec(field, value, "must not be empty")
    return value


def name(field: str, value: Any, pattern: re.Pattern[str] = _DNS_SUBDOMAIN, what: str = "a Kubernetes name") -> Any:
    """A lowercase RFC 1123 name (or a placeholder). Raises: InvalidSpec."""
    value = text(field, value, allow_empty=False)
    if isinstance(value, str) and not pattern.match(value):
        raise InvalidSpec(field, value, f"must be {what} (lowercase letters, digits and '-')")
    return value


def namespace(field: str, value: Any) -> str:
    """A namespace name (a DNS-1123 label, at most 63 characters). Raises: InvalidSpec naming the fix."""
    if not isinstance(value, str) or not _DNS_LABEL.match(value):
        raise InvalidSpec(field, value, "must be a namespace name, a DNS-1123 label (lower-case letters, digits, '-'; "
                          "at most 63 characters)", remediation="use a name such as ml-team")
    return value


def pairs(field: str, value: Any) -> tuple[tuple[str, Any], ...]:
    """A mapping (or sequence of pairs) as a sorted tuple of pairs. Raises: InvalidSpec."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items = list(value.items())
    else:
        try:
            items = [(k, v) for k, v in value]
        except (TypeError, ValueError):
            raise InvalidSpec(field, value, "must be a mapping of names to values") from None
    for k, _ in items:
        if not isinstance(k, str) or not k:
            raise InvalidSpec(field, k, "keys must be non-empty strings")
    return tuple(sorted(items, key=lambda kv: kv[0]))


def seq(field: str, value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise InvalidSpec(field, value, "must be a list")
    return tuple(value)


def quantity(field: str, value: Any) -> Any:
    """A Kubernetes quantity like '8', '500m', '64Gi' (or a placeholder). Raises: InvalidSpec."""
    value = text(field, value, allow_empty=False)
    if isinstance(value, str) and not _QUANTITY.match(value):
        raise InvalidSpec(field, value, "must be a Kubernetes quantity like '8', '500m' or '64Gi'")
    return value


def amount(q: str) -> float:
    m = _QUANTITY.match(q)
    assert m is not None
    suffix = m.group(3) or ""
    mult = 10.0 ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _SUFFIX[suffix]
    return float(m.group(1)) * mult


def env(field: str, value: Any) -> tuple[tuple[str, Any], ...]:
    """Env as sorted (name, value) pairs; a value is a string, a placeholder or ``{"valueFrom": {...}}``."""
    out = []
    for k, v in pairs(field, value):
        if not _ENV_NAME.match(k):
            raise InvalidSpec(f"{field}.{k}", k, "is not a valid environment variable name")
        if isinstance(v, dict) and set(v) == {"valueFrom"} and isinstance(v["valueFrom"], dict):
            out.append((k, {"valueFrom": dict(v["valueFrom"])}))
        else:
            out.append((k, text(f"{field}.{k}", v)))
    return tuple(out)


def resources(field: str, value: Any) -> dict[str, dict[str, Any]]:
    """``{"requests": {...}, "limits": {...}}`` with valid names and quantities. Raises: InvalidSpec."""
    value = plain(value) or {}
    if not isinstance(value, Mapping):
        raise InvalidSpec(field, value, "must be {'requests': {...}, 'limits': {...}}")
    out: dict[str, dict[str, Any]] = {}
    for part, amounts in value.items():
        if part not in ("requests", "limits"):
            raise InvalidSpec(f"{field}.{part}", amounts, "resources take 'requests' and 'limits' mappings, e.g. "
                              "{'requests': {'cpu': '8', 'memory': '64Gi'}, 'limits': {'memory': '64Gi'}}")
        if not amounts:
            continue
        got = {}
        for res, q in pairs(f"{field}.{part}", amounts):
            where = f"{field}.{part}.{res}"
            if res == GPU_RESOURCE:
                raise InvalidSpec(where, q, "is always the node's GPUs (spec.gpus_per_node); remove it")
            if not (res in _NATIVE or res.startswith("hugepages-") or "/" in res) or not _QUALIFIED.match(res):
                raise InvalidSpec(where, q, "unknown resource: use cpu, memory, ephemeral-storage, hugepages-<size> "
                                  "or an extended resource with a domain (vpc.amazonaws.com/efa, rdma/hca)")
            got[res] = quantity(where, q)
        out[part] = got
    req, lim = out.get("requests", {}), out.get("limits", {})
    for res, q in req.items():
        extended = "/" in res or res.startswith("hugepages-")
        if extended and res not in lim:
            raise InvalidSpec(f"{field}.requests.{res}", q, "extended resources need a limit equal to the request",
                              remediation=f"set {field}.limits.{res} (requests default to limits)")
        if res in lim and isinstance(q, str) and isinstance(lim[res], str):
            if amount(q) > amount(lim[res]) or extended and amount(q) != amount(lim[res]):
                rule = "must equal" if extended else "must not exceed"
                raise InvalidSpec(f"{field}.requests.{res}", q, f"{rule} limits.{res}={lim[res]!r}")
    return out


def volumes(field: str, value: Any) -> tuple[dict[str, Any], ...]:
    """Pod volumes of the supported kinds (PVC, secret, configMap, emptyDir). Raises: InvalidSpec."""
    out, seen = [], set()
    for i, vol in enumerate(seq(field, plain(value))):
        where = f"{field}[{i}]"
        if not isinstance(vol, Mapping):
            raise InvalidSpec(where, vol, "must be a Kubernetes volume like {'name': 'data', "
                              "'persistentVolumeClaim': {'claimName': 'datasets'}}")
        vname = name(f"{where}.name", vol.get("name"), _DNS_LABEL, "a DNS label")
        if vname == SHM_VOLUME:
            raise InvalidSpec(f"{where}.name", vname, "is reserved for /dev/shm: set shm_size instead")
        if vname in seen:
            raise InvalidSpec(f"{where}.name", vname, "duplicate volume name")
        seen.add(vname)
        sources = [k for k in vol if k != "name"]
        if len(sources) != 1 or sources[0] not in VOLUME_SOURCES:
            raise InvalidSpec(f"{where}", sorted(sources), f"needs exactly one source of: {', '.join(VOLUME_SOURCES)}")
        kind = sources[0]
        src = dict(vol[kind] or {})
        if kind in _SOURCE_NAME_KEY:
            key = _SOURCE_NAME_KEY[kind]
            src[key] = name(f"{where}.{kind}.{key}", src.get(key))
        elif src.get("sizeLimit") is not None:
            src["sizeLimit"] = quantity(f"{where}.emptyDir.sizeLimit", src["sizeLimit"])
        out.append({"name": vname, kind: src})
    return tuple(out)


def mounts(field: str, value: Any, volume_names: set[str]) -> tuple[dict[str, Any], ...]:
    """Container volume mounts naming declared volumes at distinct absolute paths. Raises: InvalidSpec."""
    out, paths = [], set()
    for i, m in enumerate(seq(field, plain(value))):
        where = f"{field}[{i}]"
        if not isinstance(m, Mapping):
            raise InvalidSpec(where, m, "must be a mount like {'name': 'data', 'mountPath': '/data'}")
        extra = sorted(set(m) - set(MOUNT_KEYS))
        if extra:
            raise InvalidSpec(f"{where}.{extra[0]}", m[extra[0]], f"unknown mount field; known: {', '.join(MOUNT_KEYS)}")
        if m.get("name") not in volume_names:
            raise InvalidSpec(f"{where}.name", m.get("name"), f"names no volume; declared: {sorted(volume_names)}",
                              remediation="add the volume to volumes or fix the mount's name")
        path = m.get("mountPath")
        if not isinstance(path, str) or not path.startswith("/") or ":" in path or ".." in path.split("/"):
            raise InvalidSpec(f"{where}.mountPath", path, "must be an absolute path without ':' or '..'")
        if path.rstrip("/") == SHM_PATH:
            raise InvalidSpec(f"{where}.mountPath", path, "kfp-gpu mounts /dev/shm itself: set shm_size instead")
        if path in paths:
            raise InvalidSpec(f"{where}.mountPath", path, "two mounts at the same path")
        paths.add(path)
        out.append({k: m[k] for k in MOUNT_KEYS if m.get(k) is not None})
    return tuple(out)


def tolerations(field: str, value: Any) -> tuple[dict[str, Any], ...]:
    out = []
    for i, t in enumerate(seq(field, plain(value))):
        where = f"{field}[{i}]"
        if not isinstance(t, Mapping) or set(t) - set(TOLERATION_KEYS):
            raise InvalidSpec(where, t, f"must be a toleration with keys among {', '.join(TOLERATION_KEYS)}")
        t = {k: v for k, v in t.items() if v is not None}
        if t.get("operator", "Equal") not in ("Equal", "Exists"):
            raise InvalidSpec(f"{where}.operator", t["operator"], "must be 'Equal' or 'Exists'")
        if t.get("effect", "") not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise InvalidSpec(f"{where}.effect", t["effect"], "must be NoSchedule, PreferNoSchedule or NoExecute")
        out.append(t)
    return tuple(out)


def node_affinity(field: str, value: Any) -> dict[str, Any]:
    """A NodeAffinity; kfp-gpu ANDs its required terms with the gang's placement. Raises: InvalidSpec."""
    value = plain(value) or {}
    if not isinstance(value, Mapping) or set(value) - set(NODE_AFFINITY_KEYS):
        raise InvalidSpec(field, value, f"must be a NodeAffinity with keys among {', '.join(NODE_AFFINITY_KEYS)}")
    out = {k: v for k, v in value.items() if v}
    req = out.get(NODE_AFFINITY_KEYS[0])
    if req is not None:
        terms = req.get("nodeSelectorTerms") if isinstance(req, Mapping) else None
        if not isinstance(terms, list) or not terms or not all(isinstance(t, Mapping) for t in terms):
            raise InvalidSpec(f"{field}.{NODE_AFFINITY_KEYS[0]}", req, "must be {'nodeSelectorTerms': [{...}]}")
    pref = out.get(NODE_AFFINITY_KEYS[1])
    if pref is not None and not isinstance(pref, list):
        raise InvalidSpec(f"{field}.{NODE_AFFINITY_KEYS[1]}", pref, "must be a list of weighted terms")
    return out


def label_key_ok(key: Any) -> bool:
    """``key`` is a valid Kubernetes label (or taint) key: an optional DNS-subdomain prefix and a name."""
    return isinstance(key, str) and bool(_QUALIFIED.match(key))


def label_value_ok(value: Any) -> bool:
    """``value`` is a valid label (or taint) value: <= 63 chars of [A-Za-z0-9._-], alphanumeric ends, or empty."""
    return isinstance(value, str) and bool(_LABEL_VALUE.match(value))


def label_map(field: str, value: Any) -> tuple[tuple[str, Any], ...]:
    out = pairs(field, value)
    for k, v in out:
        if not _QUALIFIED.match(k):
            raise InvalidSpec(f"{field}.{k}", k, "is not a valid label key")
        if k.startswith(RESERVED_LABEL_PREFIXES):
            raise InvalidSpec(f"{field}.{k}", v, "collides with the labels kfp-gpu and the Training Operator set",
                              remediation=f"use a key outside {', '.join(RESERVED_LABEL_PREFIXES)}")
        v = text(f"{field}.{k}", v)
        if isinstance(v, str) and not _LABEL_VALUE.match(v):
            raise InvalidSpec(f"{field}.{k}", v, "label values are <= 63 chars of [A-Za-z0-9._-], alphanumeric ends")
    return tuple((k, text(f"{field}.{k}", v)) for k, v in out)


def annotation_map(field: str, value: Any) -> tuple[tuple[str, Any], ...]:
    out = pairs(field, value)
    for k, _ in out:
        if not _QUALIFIED.match(k):
            raise InvalidSpec(f"{field}.{k}", k, "is not a valid annotation key")
        if k in RESERVED_ANNOTATIONS:
            raise InvalidSpec(f"{field}.{k}", k, "is set by kfp-gpu; use another key")
    return tuple((k, text(f"{field}.{k}", v)) for k, v in out)


def nproc(field: str, value: Any) -> Any:
    """PyTorchJob ``spec.nprocPerNode``: '' (unset), 'auto', 'cpu', 'gpu' or a positive integer."""
    if value is None:
        return ""
    value = text(field, value)
    if isinstance(value, str) and value not in ("", "auto", "cpu", "gpu") and not (value.isdigit() and int(value) >= 1):
        raise InvalidSpec(field, value, "must be 'auto', 'cpu', 'gpu' or a positive integer (processes per node)")
    return value


def extra(field: str, value: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    value = plain(value) or {}
    if not isinstance(value, Mapping):
        raise InvalidSpec(field, value, "must be a mapping")
    for k in value:
        if k not in allowed:
            raise InvalidSpec(f"{field}.{k}", value[k], f"is not passed through; supported: {', '.join(allowed)}")
    return {k: v for k, v in sorted(value.items()) if v is not None}


# ---- the job kind --------------------------------------------------------------------------------------
JOB_KINDS = ("pytorchjob", "trainjob")
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
DEFAULT_RUNTIME = "torch-distributed"
KIND_DEFAULTS = {"kind": "pytorchjob", "runtime": "", "runtime_kind": ""}
#: what a TrainJob's runtime patch (trainer.kubeflow.org/v1alpha1 PodSpecPatch / ContainerPatch) can carry
TRAINJOB_POD_EXTRA_KEYS = ("securityContext", "terminationGracePeriodSeconds")
TRAINJOB_CONTAINER_EXTRA_KEYS = ("securityContext",)


def job_kind(t: Any) -> tuple[str, str, str]:
    """``(kind, runtime, runtime_kind)`` of a JobTemplate ``t``, defaults filled in, checked against what the kind
    can carry: a TrainJob takes its runtime's name (default ``torch-distributed``, a ClusterTrainingRuntime unless
    ``runtime_kind="TrainingRuntime"``), an integer, ``auto`` or ``gpu`` ``nproc_per_node``, and only the pod and
    container fields a Trainer v2.3 runtime patch has; a PyTorchJob takes no runtime.

    Raises: InvalidSpec naming the field, its value and what is allowed.
    """
    kind = t.kind if t.kind is not None else "pytorchjob"
    if kind not in JOB_KINDS:
        raise InvalidSpec("train.kind", kind, f"allowed: {', '.join(JOB_KINDS)}")
    runtime, runtime_kind = t.runtime or "", t.runtime_kind or ""
    if kind == "pytorchjob":
        for key, value in (("runtime", runtime), ("runtime_kind", runtime_kind)):
            if value:
                raise InvalidSpec(f"train.{key}", value, "is a TrainJob setting", remediation="pass kind='trainjob' "
                                  f"with {key}=, or drop {key}=")
        return kind, "", ""
    runtime = name("train.runtime", runtime or DEFAULT_RUNTIME, what="a runtime name")
    runtime_kind = runtime_kind or RUNTIME_KINDS[0]
    if runtime_kind not in RUNTIME_KINDS:
        raise InvalidSpec("train.runtime_kind", runtime_kind, f"allowed: {', '.join(RUNTIME_KINDS)}")
    if not _DNS_LABEL.match(t.name) or not t.name[0].isalpha():
        raise InvalidSpec("train.name", t.name, "a TrainJob name part must start with a letter (RFC 1035 label)")
    reserved = [k for k, _ in t.env if k.startswith("PET_")]
    if reserved:
        raise InvalidSpec(f"train.env.{reserved[0]}", reserved[0], "PET_* variables are set by the Trainer's torch "
                          "runtime and refused in a TrainJob", remediation="drop it; set nproc_per_node for "
                          "PET_NPROC_PER_NODE")
    if t.nproc_per_node == "cpu":
        raise InvalidSpec("train.nproc_per_node", "cpu", "a TrainJob's numProcPerNode takes an integer, 'auto' or "
                          "'gpu' (the node's GPUs)")
    for where, extra_, allowed in (("pod_extra", t.pod_extra, TRAINJOB_POD_EXTRA_KEYS),
                                   ("container_extra", t.container_extra, TRAINJOB_CONTAINER_EXTRA_KEYS)):
        bad = sorted(set(extra_) - set(allowed))
        if bad:
            raise InvalidSpec(f"train.{where}.{bad[0]}", extra_[bad[0]], "a TrainJob runtime patch cannot set it; "
                              f"allowed: {', '.join(allowed)}", remediation="set it in the TrainingRuntime instead")
    return kind, runtime, runtime_kind
