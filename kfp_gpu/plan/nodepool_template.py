"""The platform admin's additions to every run's Karpenter NodePool template: node labels and startup taints.

Pure: a JSON string in (the controller's ``$KFP_GPU_KARPENTER_TEMPLATE``, :func:`kfp_gpu.cluster.karpenter.
template_extras`), keyword arguments of :func:`kfp_gpu.plan.karpenter.nodepool_body` out, or one line naming the
variable, the value and the fix. A tenant cannot set them: they are the controller's configuration.
"""

from __future__ import annotations

import json
from typing import Any

from kfp_gpu.errors import KfpGpuError
from kfp_gpu.job_fields import label_key_ok, label_value_ok
from kfp_gpu.ownership import (
    CLAIM_TAINT_SUFFIX,
    LABEL_LEASE,
    LABEL_MANAGED,
    LABEL_RUN_ID,
    LABEL_STEP,
    LEGACY_RUN_TAINT_KEY,
    POOL_TAINT_SUFFIX,
    UNHEALTHY_TAINT,
)

# Node label keys and taint keys kfp-gpu itself sets on a gang's nodes: the admin's template may not set them (a
# template label kfp-gpu.io/run-id would make every node of the NodePool look claimed).
OWN_NODE_LABELS = (LABEL_RUN_ID, LABEL_STEP, LABEL_LEASE, LABEL_MANAGED)
TEMPLATE_KEYS = ("labels", "startupTaints")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def template_extras(source: str, raw: str) -> dict[str, Any]:
    """Parse the platform admin's additions to every run's NodePool template (``raw``: JSON, from ``source``, an
    environment variable of the controller): ``{"labels": {key: value}, "startupTaints": [{"key", "value"?,
    "effect"}]}``, both optional. They are what Karpenter users set on a NodePool anyway: labels their DaemonSets
    select, and the startup taints an agent removes once the node is usable (Karpenter's NodePool
    ``spec.template.spec.startupTaints``, e.g. a CNI's or the GPU operator's). Returns the keyword arguments
    ``node_labels`` and ``startup_taints`` of :func:`nodepool_body` ({} for an empty ``raw``).

    Raises: KfpGpuError, one line naming ``source``, the value and the fix.
    """
    if not raw.strip():
        return {}

    def bad(what: str, value: Any) -> KfpGpuError:
        return KfpGpuError(f"{source}: {what}: {value!r}",
                           remediation=f'set {source} to JSON such as {{"labels": {{"team": "ml"}}, "startupTaints": '
                           f'[{{"key": "example.com/agent-not-ready", "effect": "NoSchedule"}}]}}, or unset it')
    try:
        doc = json.loads(raw)
    except ValueError:
        raise bad("not JSON", raw) from None
    if not isinstance(doc, dict) or set(doc) - set(TEMPLATE_KEYS):
        raise bad(f"must be an object with keys among {', '.join(TEMPLATE_KEYS)}", doc)
    labels, taints = doc.get("labels") or {}, doc.get("startupTaints") or []
    if not isinstance(labels, dict):
        raise bad("labels must be an object of label key to value", labels)
    for k, v in labels.items():
        if not label_key_ok(k) or not isinstance(v, str) or not label_value_ok(v):
            raise bad("not a valid label", {k: v})
        if k in OWN_NODE_LABELS:
            raise bad("kfp-gpu sets this node label itself (its claim)", k)
    if not isinstance(taints, list):
        raise bad("startupTaints must be a list of taints", taints)
    for t in taints:
        if (not isinstance(t, dict) or set(t) - {"key", "value", "effect"} or not label_key_ok(t.get("key"))
                or t.get("effect") not in TAINT_EFFECTS or not isinstance(t.get("value", ""), str)
                or not label_value_ok(t.get("value", ""))):
            raise bad(f"not a taint (key, optional value, effect among {', '.join(TAINT_EFFECTS)})", t)
        key = str(t["key"])
        if key in (LEGACY_RUN_TAINT_KEY, UNHEALTHY_TAINT) or key.endswith((CLAIM_TAINT_SUFFIX, POOL_TAINT_SUFFIX)):
            raise bad("kfp-gpu sets and removes this taint itself", key)
    return {"node_labels": {str(k): str(v) for k, v in labels.items()}, "startup_taints": [dict(t) for t in taints]}
