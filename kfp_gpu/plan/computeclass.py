"""GKE custom ComputeClass decisions, pure: the class kfp-gpu creates for a run, which rungs of the capacity chain
it may hold, the spec rules GKE refuses, and the verdict on a gang GKE's autoscaler is bringing.

The class (``cloud.google.com/v1`` ``ComputeClass``, https://cloud.google.com/kubernetes-engine/docs/reference/crds/
computeclass) has one ``priorities[]`` rule per capacity type of the spec's chain (``capacity`` then ``fallback``):
``reservation`` -> ``reservations: {affinity: Specific, specific: [{name}]}``; ``flex-start`` -> ``flexStart:
{enabled: true}`` (+ ``maxRunDurationSeconds``); ``spot`` -> ``spot: true``; ``on-demand`` -> ``spot: false``. Every
rule names the machine family and the GPU (``gpu: {type, count}``) of the accelerator, and the zones go in
``priorityDefaults.location.zones``. ``nodePoolAutoCreation.enabled: true`` lets node auto-provisioning create a pool
per rule; ``activeMigration.optimizeRulePriority`` is the spec's ``active_migration``; ``whenUnsatisfiable:
DoNotScaleUp`` keeps GKE from creating nodes outside the rules when none of them can be satisfied.

All-or-nothing: GKE documents all-at-once allocation only for flex-start *with* queued provisioning ("GKE allocates all
requested resources at the same time", https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest);
without it GKE provisions VMs "when capacity becomes available" (https://cloud.google.com/kubernetes-engine/docs/concepts/dws).
That a ComputeClass ``flexStart`` rule therefore obtains each node on its own is our reading (docs/computeclass.md),
an assumption on the safe side; a gang of more than one node that asks for flex-start
gets it through queued provisioning (a ProvisioningRequest, class ``queued-provisioning.gke.io``, which is atomic)
before the class's other rules: :func:`split`. Which backend is atomic is the contract's ``all_or_nothing``
attribute, never a backend name.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu.errors import InvalidSpec, ProvisioningTimeout
from kfp_gpu.spec import CapacityType, ProvisioningSpec, TargetKind

GROUP, VERSION, PLURAL, KIND = "cloud.google.com", "v1", "computeclasses", "ComputeClass"
CRD_NAME = f"{PLURAL}.{GROUP}"
CLASS_LABEL = "cloud.google.com/compute-class"  # the pods' nodeSelector; GKE labels the class's nodes with it
DOCS = "https://cloud.google.com/kubernetes-engine/docs/reference/crds/computeclass"
FLEX = CapacityType.FLEX_START.value


def class_name(run_id: str) -> str:
    """The run's ComputeClass: a DNS-1123 name (and label value) derived from the run id."""
    safe = "".join(c if c.isalnum() else "-" for c in run_id.lower()).strip("-")[:40].strip("-") or "run"
    return f"kfp-gpu-{safe}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


def check(spec: ProvisioningSpec) -> None:
    """Refuse, in one line, what GKE's ComputeClass refuses or cannot express for ``spec``.

    Raises: InvalidSpec naming the field."""
    if spec.target.kind is TargetKind.EKS:
        raise InvalidSpec("target.provisioner", "compute-class", "ComputeClass is a GKE API; EKS serves none",
                          remediation="use target.provisioner='karpenter' or 'node-pool' on EKS")
    if spec.target.compute_class and spec.fallback:
        raise InvalidSpec("fallback", list(spec.fallback), f"the named ComputeClass {spec.target.compute_class!r} "
                          "holds the chain in its priorities", remediation="drop fallback, or drop "
                          "target.compute_class to let the controller create a class from the chain")
    if CapacityType.RESERVATION in spec.chain and spec.reservation.startswith(("cr-", "arn:")):
        raise InvalidSpec("reservation", spec.reservation, "a ComputeClass rule names a Compute Engine reservation, "
                          "not an EC2 capacity reservation", remediation="set reservation to the GKE reservation name")
    check_topology(spec.topology)
    if spec.warm_pool.cloud_reservation:
        raise InvalidSpec("warm_pool.cloud_reservation", True, "the compute-class backend holds no reservation of "
                          "its own; put the reservation in the chain", remediation="set capacity='reservation', "
                          "reservation=NAME and warm_pool.cloud_reservation=False")


def check_topology(topology: str) -> None:
    """Refuse ``topology="required"``: the class kfp-gpu writes cannot keep a gang inside one network domain. GKE
    documents compact placement for node pools (``placementPolicy.type: COMPACT``) and for Autopilot pods (the
    ``cloud.google.com/gke-placement-group`` node selector, A100/L4/H100 GPUs only,
    https://cloud.google.com/kubernetes-engine/docs/how-to/compact-placement); a ComputeClass priority rule naming a
    placement policy we could not confirm in the ComputeClass reference (:data:`DOCS`), so the class carries none and
    its nodes land where GKE has room. ``preferred`` runs (it may span domains). Raises: InvalidSpec."""
    if topology == "required":
        raise InvalidSpec("topology", topology, "the compute-class provisioner cannot keep a gang in one network "
                          "domain (its ComputeClass names no compact placement policy)",
                          remediation="use target.provisioner='node-pool' (without fallback) with a GKE node pool "
                          "whose placementPolicy is COMPACT, or topology='preferred'")


def split(spec: ProvisioningSpec, *, class_atomic: bool) -> tuple[bool, list[str]]:
    """(``queued_first``, the class's capacity types in order). A gang of more than one node whose chain has
    flex-start gets flex-start through queued provisioning first (``queued_first``) when the class's flex-start
    is not all-or-nothing (``class_atomic`` False, as GKE documents it); the class keeps the other rungs."""
    chain = [c.value for c in spec.chain]
    if FLEX in chain and spec.nodes > 1 and not class_atomic:
        return True, [c for c in chain if c != FLEX]
    return False, chain


def rule(spec: ProvisioningSpec, capacity: str) -> dict[str, Any]:
    """One ``priorities[]`` rule for ``capacity`` (GKE refuses ``reservations`` or ``flexStart`` beside ``spot:
    true`` in one rule: each capacity type is its own rule)."""
    acc = accelerators.get(spec.accelerator)
    machine = acc.gce_machine_for(spec.gpus_per_node)
    out: dict[str, Any] = {"machineFamily": machine.name.split("-", 1)[0],
                           "gpu": {"type": acc.gke_label, "count": spec.gpus_per_node}}
    if capacity == CapacityType.RESERVATION.value:
        out["reservations"] = {"affinity": "Specific", "specific": [{"name": spec.reservation}]}
    elif capacity == FLEX:
        out["flexStart"] = {"enabled": True}
        if spec.max_run_duration_s:
            out["maxRunDurationSeconds"] = int(spec.max_run_duration_s)
    else:
        out["spot"] = capacity == CapacityType.SPOT.value
    return out


def class_body(name: str, spec: ProvisioningSpec, capacities: Sequence[str], *, labels: Mapping[str, str],
               annotations: Mapping[str, str]) -> dict[str, Any]:
    """The ComputeClass for ``capacities`` (from :func:`split`). Raises: InvalidSpec (empty chain)."""
    if not capacities:
        raise InvalidSpec("fallback", list(spec.fallback), "leaves the ComputeClass no rule",
                          remediation="add a capacity type other than flex-start to the chain")
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
        "metadata": {"name": name, "labels": dict(labels), "annotations": dict(annotations)},
        "spec": {"priorities": [rule(spec, c) for c in capacities],
                 "nodePoolAutoCreation": {"enabled": True},
                 "activeMigration": {"optimizeRulePriority": bool(spec.active_migration)},
                 "whenUnsatisfiable": "DoNotScaleUp"},
    }
    if spec.zones:
        body["spec"]["priorityDefaults"] = {"location": {"zones": list(spec.zones)}}
    return body


def rule_of(priorities: Sequence[Mapping[str, Any]], node_labels: Mapping[str, str]) -> int:
    """Index of the rule a node of the class came from (-1: unknown), read from the labels GKE puts on it:
    ``cloud.google.com/reservation-name``, ``cloud.google.com/gke-flex-start``, ``cloud.google.com/gke-spot``."""
    for i, r in enumerate(priorities):
        if r.get("reservations"):
            names = {str(s.get("name", "")) for s in (r["reservations"].get("specific") or [])}
            if node_labels.get("cloud.google.com/reservation-name", "") in names:
                return i
        elif (r.get("flexStart") or {}).get("enabled"):
            if node_labels.get("cloud.google.com/gke-flex-start") == "true":
                return i
        elif bool(r.get("spot")) == (node_labels.get("cloud.google.com/gke-spot") == "true") and not (
                node_labels.get("cloud.google.com/reservation-name") or node_labels.get("cloud.google.com/gke-flex-start")):
            return i
    return -1


def capacity_of(rule_dict: Mapping[str, Any]) -> str:
    """The capacity type a rule stands for."""
    if rule_dict.get("reservations"):
        return CapacityType.RESERVATION.value
    if (rule_dict.get("flexStart") or {}).get("enabled"):
        return FLEX
    return CapacityType.SPOT.value if rule_dict.get("spot") else CapacityType.ON_DEMAND.value


class Verdict(str, enum.Enum):
    WAIT = "Wait"
    READY = "Ready"
    TIMEOUT = "Timeout"


@dataclass(frozen=True)
class Assessment:
    verdict: Verdict
    message: str = ""


def assess(*, ready: int, wanted: int, now: float, deadline: float) -> Assessment:
    """A gang GKE is bringing for the class: READY at ``wanted`` Ready nodes; TIMEOUT past ``deadline``; else WAIT.
    There is no earlier give-up: GKE's autoscaler backs a refused rule off and asks again, so a class whose every rule
    is short now may still get the nodes before the deadline."""
    if ready >= wanted:
        return Assessment(Verdict.READY)
    if now >= deadline:
        return Assessment(Verdict.TIMEOUT, f"{ready}/{wanted} nodes Ready at the deadline")
    return Assessment(Verdict.WAIT)


def timed_out(*, ready: int, wanted: int, name: str, deadline_s: float, rules: Sequence[str]) -> ProvisioningTimeout:
    return ProvisioningTimeout(
        f"ComputeClass {name}: {ready}/{wanted} nodes Ready after {deadline_s:g}s (rules {' > '.join(rules)})",
        remediation="raise scale_up_deadline_s, add a rung to fallback, or widen zones")

