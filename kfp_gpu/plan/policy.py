"""GpuPolicy admission: may this namespace's gang have what it asks for? Pure: the caller passes the policies,
the namespace's labels, the gang's spec and the GPUs the namespace's other gangs hold.

A GpuPolicy (cluster-scoped, ``kfp_gpu/manifests/crds.yaml``) *selects* a namespace when the namespace is in its
``namespaces`` list or matches its ``namespaceSelector`` (a Kubernetes LabelSelector: ``matchLabels`` and
``matchExpressions`` with In / NotIn / Exists / DoesNotExist; ``{}`` selects every namespace; an absent selector
selects none). A gang is admitted when *any* selecting policy admits it; when none does, the verdict is the refusal
of the first selecting policy by name, naming the rule, the value asked, the limit and the fix. A namespace that no
policy selects gets no GPUs (rule ``no-policy``).

A policy's rules, in the order they are checked (a list left empty and a limit left out allow anything):

* ``accelerators``, ``capacityTypes``: the gang's ``accelerator`` / ``capacityType`` is in the list;
* ``pools``: the gang names pools (``target.pools``) and all of them are in the list;
* ``backends``: the gang's ``backend`` (``target.provisioner``; ``auto`` only when listed) is in the list;
* ``maxGpusPerGang``: ``nodes * gpusPerNode`` is at most the limit;
* ``maxGpusPerNamespace``: that plus ``namespace_gpus_in_use`` (the namespace's other admitted, unreleased gangs)
  is at most the limit;
* ``maxRunSeconds``: the gang's ``maxRunSeconds`` is at most the limit; a gang that asks for none (0) is admitted and
  gets the limit (:attr:`Verdict.max_run_seconds`, which the controller enforces);
* ``allowQuotaRequests``: a gang that wants quota increase requests filed needs it true.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NO_POLICY = "no-policy"
RULES = ("accelerators", "capacityTypes", "pools", "backends", "maxGpusPerGang", "maxGpusPerNamespace",
         "maxRunSeconds", "allowQuotaRequests")


@dataclass(frozen=True)
class Verdict:
    """``admitted`` or not, by which ``policy`` (its name; "" when none selects the namespace) and, when refused,
    which ``rule``; ``message`` is one line naming the value, the limit and the fix.

    ``max_run_seconds``: the run-time limit the controller enforces on an admitted gang (the gang's own, else the
    admitting policy's ``maxRunSeconds``; 0 = none).
    """

    admitted: bool
    policy: str
    rule: str
    message: str
    max_run_seconds: float = 0.0


def evaluate(policies: Sequence[Mapping[str, Any]], namespace: str, namespace_labels: Mapping[str, str],
             gang_spec: Mapping[str, Any], namespace_gpus_in_use: int, quota_request: bool = False) -> Verdict:
    """The verdict of ``policies`` (GpuPolicy objects as the API returns them) on a gang of ``namespace`` whose spec
    is ``gang_spec`` (the GpuGang spec: accelerator, nodes, gpusPerNode, capacityType, pools, backend,
    maxRunSeconds). ``quota_request``: the gang wants cloud quota increase requests filed. Raises: nothing."""
    chosen = sorted((p for p in policies if selects(p, namespace, namespace_labels)), key=_name)
    if not chosen:
        return Verdict(False, "", NO_POLICY, f"no GpuPolicy selects namespace {namespace}, so its pipelines get no "
                       f"GPUs (fix: ask the platform admin to run `kfp-gpu tenant add {namespace}`)")
    verdicts = [_check(p, namespace, gang_spec, namespace_gpus_in_use, quota_request) for p in chosen]
    return next((v for v in verdicts if v.admitted), verdicts[0])


def selects(policy: Mapping[str, Any], namespace: str, labels: Mapping[str, str]) -> bool:
    """Whether ``policy`` selects ``namespace`` (by name, or its ``labels`` by the namespaceSelector)."""
    spec = policy.get("spec") or {}
    if namespace in (spec.get("namespaces") or []):
        return True
    selector = spec.get("namespaceSelector")
    return selector is not None and matches(selector, labels)


def matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes LabelSelector semantics: every matchLabels pair and every matchExpression holds ({} matches
    everything). An unknown operator matches nothing."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), list(expr.get("values") or [])
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels,
              "DoesNotExist": key not in labels}.get(op, False)
        if not ok:
            return False
    return True


def _name(policy: Mapping[str, Any]) -> str:
    return str((policy.get("metadata") or {}).get("name", ""))


def _check(policy: Mapping[str, Any], namespace: str, gang: Mapping[str, Any], in_use: int,
           quota_request: bool) -> Verdict:
    name, spec = _name(policy), policy.get("spec") or {}
    nodes, per_node = int(gang.get("nodes") or 0), int(gang.get("gpusPerNode") or 0)
    gpus = nodes * per_node
    fix_admin = f"or ask the platform admin to change GpuPolicy {name} (kubectl edit gpupolicy {name})"

    def refuse(rule: str, asked: str, limit: str, fix: str) -> Verdict:
        return Verdict(False, name, rule, f"GpuPolicy {name} refuses the gang of namespace {namespace}: {asked}, "
                       f"but {rule} {limit} (fix: {fix}, {fix_admin})")

    accelerator = str(gang.get("accelerator") or "")
    allowed = _strings(spec, "accelerators")
    if allowed and accelerator not in allowed:
        return refuse("accelerators", f"accelerator={accelerator!r}", _one_of(allowed),
                      "set the ProvisioningSpec's accelerator to an allowed one")
    capacity = str(gang.get("capacityType") or "")
    allowed = _strings(spec, "capacityTypes")
    if allowed and capacity not in allowed:
        return refuse("capacityTypes", f"capacityType={capacity!r}", _one_of(allowed),
                      "set the ProvisioningSpec's capacity to an allowed type")
    pools = [str(p) for p in gang.get("pools") or []]
    allowed = _strings(spec, "pools")
    outside = [p for p in pools if p not in allowed]
    if allowed and (not pools or outside):
        asked = f"pools={outside}" if outside else "any pool (target.pools is empty)"
        return refuse("pools", asked, _one_of(allowed), "set target.pools to some of the allowed pools")
    backend = str(gang.get("backend") or "auto")
    allowed = _strings(spec, "backends")
    if allowed and backend not in allowed:
        return refuse("backends", f"backend={backend!r}", _one_of(allowed),
                      "set target.provisioner to an allowed backend")
    per_gang = _limit(spec, "maxGpusPerGang")
    if per_gang is not None and gpus > per_gang:
        return refuse("maxGpusPerGang", f"{gpus} GPUs ({nodes} nodes x {per_node})", f"allows at most {per_gang:g}",
                      "ask for fewer nodes or GPUs per node")
    per_ns = _limit(spec, "maxGpusPerNamespace")
    if per_ns is not None and in_use + gpus > per_ns:
        return refuse("maxGpusPerNamespace", f"{gpus} GPUs while its other gangs hold {in_use}",
                      f"allows at most {per_ns:g} at once", "wait for the namespace's other runs to finish, or ask for fewer")
    asked_s = float(gang.get("maxRunSeconds") or 0.0)
    max_s = _limit(spec, "maxRunSeconds")
    if max_s is not None and asked_s > max_s:
        return refuse("maxRunSeconds", f"maxRunSeconds={asked_s:g}", f"allows at most {max_s:g}",
                      "set the ProvisioningSpec's max_run_duration_s within the limit")
    if quota_request and not spec.get("allowQuotaRequests", False):
        return refuse("allowQuotaRequests", "the gang wants quota increase requests filed", "is false",
                      "ask for quota out of band (kfp-gpu quota request)")
    effective = asked_s or (max_s or 0.0)
    return Verdict(True, name, "", f"GpuPolicy {name} admits {gpus} {accelerator} GPUs ({nodes} nodes x "
                   f"{per_node}) for namespace {namespace}", max_run_seconds=effective)


def _strings(spec: Mapping[str, Any], key: str) -> list[str]:
    return [str(v) for v in spec.get(key) or []]


def _limit(spec: Mapping[str, Any], key: str) -> float | None:
    value = spec.get(key)
    return None if value is None else float(value)


def _one_of(values: Sequence[str]) -> str:
    return "allows only " + ", ".join(values)
