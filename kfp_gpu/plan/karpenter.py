"""Karpenter decisions, pure: the run's NodePool, what its NodeClaims and pods say, failover order, errors.

How Karpenter (sigs.k8s.io/karpenter v1.14, ``pkg/controllers/nodeclaim/lifecycle/launch.go`` and
``pkg/controllers/provisioning``) reports a launch it cannot make, which is what :func:`assess` reads:

* **Insufficient capacity at launch** (AWS ``InsufficientInstanceCapacity``, a spot pool with no capacity): the
  cloud provider's Create returns an InsufficientCapacityError; Karpenter publishes a Warning event
  ``InsufficientCapacityError`` on the NodeClaim and **deletes the NodeClaim** before it is ever
  ``Launched=True`` (the AWS provider also marks the offering unavailable for a few minutes). So a NodeClaim of
  the run's NodePool that disappears without having launched is an ICE.
* **Other launch errors**: ``Launched`` stays ``Unknown`` with the error's reason (``LaunchFailed`` or the
  provider's) and message; Karpenter retries. ``Launched=False`` is terminal.
* **No offering at all** (every offering of the allowed instance types, zone and capacity type unavailable, or
  the NodePool's limits reached): no NodeClaim is made; the pending pods get a Warning ``FailedScheduling``
  event from Karpenter whose message starts ``Failed to schedule pod, `` (e.g. "... had a required offering",
  "all available instance types exceed limits for nodepool").

The run's NodePool asks for one (zone, capacity type) candidate at a time (:func:`candidates`), so the gang
forms in one zone; a blocked candidate is replaced by the next one by patching the NodePool's requirements.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kfp_gpu.errors import CapacityUnavailable, InvalidSpec, ProvisioningTimeout, Scope
from kfp_gpu.ownership import POOL_TAINT_SUFFIX

GROUP, VERSION = "karpenter.sh", "v1"
NODEPOOLS, NODECLAIMS = "nodepools", "nodeclaims"
CRD_NAME = f"{NODEPOOLS}.{GROUP}"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"  # pod annotation: Karpenter never disrupts its node voluntarily
DISRUPTED_TAINT = "karpenter.sh/disrupted"  # Karpenter taints a node it is about to drain and delete
ICE_REASON = "InsufficientCapacityError"  # the NodeClaim event Karpenter publishes before deleting it
KARPENTER_SCHEDULE_PREFIX = "Failed to schedule pod, "  # Karpenter's FailedScheduling events (not the scheduler's)
GPU = "nvidia.com/gpu"
NO_OFFERING_GRACE_S = 10.0  # Karpenter says "no offering" this long with no NodeClaim: the candidate is blocked
LAUNCH_STUCK_S = 120.0
ICE_RETRIES_ANY_ZONE = 3  # ICEs Karpenter may route around before a candidate with no zone is given up  # a NodeClaim whose launch keeps failing (Launched=Unknown + reason) this long: blocked

# spec.capacity -> karpenter.sh/capacity-type
CAPACITY_TYPES = {"on-demand": "on-demand", "spot": "spot", "reservation": "reserved"}


def nodepool_name(run_id: str) -> str:
    """A DNS-1123 name stable per run (<= 63 chars): the run's NodePool."""
    base = "".join(c if c.isalnum() else "-" for c in run_id.lower()).strip("-")
    return f"kfpgpu-{base[:46].strip('-')}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


def capacity_type(capacity: str) -> str:
    """``karpenter.sh/capacity-type`` for ``spec.capacity``. Raises: InvalidSpec for flex-start (GKE's DWS)."""
    try:
        return CAPACITY_TYPES[capacity]
    except KeyError:
        raise InvalidSpec("capacity", capacity, "the karpenter provisioner serves 'on-demand', 'spot' and "
                          "'reservation' (karpenter.sh/capacity-type on-demand, spot, reserved)",
                          remediation="pick one of those, or target.provisioner='provisioning-request' for "
                          "flex-start on GKE") from None


def check_topology(topology: str) -> None:
    """Refuse ``topology="required"``: the run's NodePool cannot keep a gang inside one network domain. Karpenter
    core has no placement-group field; the AWS provider's ``EC2NodeClass.spec.placementGroupSelector`` is recent
    (aws/karpenter-provider-aws#9030, for issue #3324) and kfp-gpu neither sets nor checks it yet, so the gang's
    nodes land where EC2 has room. ``preferred`` runs (it may span domains). Raises: InvalidSpec."""
    if topology == "required":
        raise InvalidSpec("topology", topology, "the karpenter provisioner cannot keep a gang in one network domain "
                          "(its NodePool places no EC2 placement group)",
                          remediation="use target.provisioner='node-pool' with a node group whose launch template "
                          "names a placement group of strategy 'cluster', or topology='preferred'")


@dataclass(frozen=True)
class Candidate:
    zone: str  # "" = any zone the NodePool allows
    capacity_type: str
    avoid: tuple[str, ...] = ()  # with no zone: zones a gang was pinned to and blocked in (NotIn)

    @property
    def label(self) -> str:
        where = self.zone or ("any zone but " + ", ".join(self.avoid) if self.avoid else "any zone")
        return f"{where}/{self.capacity_type}"


def candidates(zones: Sequence[str], capacity: str, *, on_demand_fallback: bool) -> list[Candidate]:
    """Failover order: every zone with the spec's capacity type, then (spot with an on-demand fallback,
    ``recovery.on_demand_after > 0``) every zone on-demand. Raises: InvalidSpec (see :func:`capacity_type`)."""
    ct = capacity_type(capacity)
    zs = list(zones) or [""]
    out = [Candidate(z, ct) for z in zs]
    if ct == "spot" and on_demand_fallback:
        out += [Candidate(z, "on-demand") for z in zs]
    return out


def lead_again(base: Candidate, placed: Candidate, *, recovering: bool) -> Candidate | None:
    """After ``placed`` was blocked: the candidate to try next in its place, or None to move on to the next one.
    ``placed`` is ``base`` (no zone) pinned to the zone its leader placeholder launched in; a blocked leader zone
    is excluded and the gang led again, until ``ICE_RETRIES_ANY_ZONE`` zones were tried. A recovery (pinned to
    its survivors' zone) and a candidate that named its zone move on."""
    if base.zone or not placed.zone or recovering or placed.zone in base.avoid:
        return None
    if len(base.avoid) + 1 >= ICE_RETRIES_ANY_ZONE:
        return None
    return dataclasses.replace(base, avoid=(*base.avoid, placed.zone))


def requirements(instance_types: Sequence[str], cand: Candidate) -> list[dict[str, Any]]:
    """The NodePool's requirements for one candidate: the catalog's instance types, the capacity type, the zone."""
    out: list[dict[str, Any]] = [
        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": list(instance_types)},
        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": [cand.capacity_type]},
    ]
    if cand.zone:
        out.append({"key": ZONE_LABEL, "operator": "In", "values": [cand.zone]})
    elif cand.avoid:
        out.append({"key": ZONE_LABEL, "operator": "NotIn", "values": list(cand.avoid)})
    return out


def pool_taint_key(namespace: str) -> str:
    """The NodePool taint's key for a run of ``namespace``: like the claim taint it carries the namespace, so the
    tenant admission policy lets a pod tolerate only its own namespace's (nothing else lands on the run's nodes
    between Karpenter registering them and the run claiming them)."""
    return f"{namespace}{POOL_TAINT_SUFFIX}"


def pool_taint(run_label: str, namespace: str) -> dict[str, str]:
    return {"key": pool_taint_key(namespace), "value": run_label, "effect": "NoSchedule"}


def pool_toleration(run_label: str, namespace: str) -> str:
    """The taint above as a ``Capacity.extra["tolerations"]`` string."""
    return f"{pool_taint_key(namespace)}={run_label}:NoSchedule"


def gpu_limit(nodes: int, gpus_per_node: int) -> dict[str, str]:
    return {GPU: str(max(0, nodes) * gpus_per_node)}


def nodepool_body(name: str, *, labels: Mapping[str, str], annotations: Mapping[str, str],
                  instance_types: Sequence[str], cand: Candidate, limit_nodes: int, gpus_per_node: int,
                  node_class: Mapping[str, str], run_label: str, namespace: str,
                  node_labels: Mapping[str, str] | None = None,
                  startup_taints: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    """The run's NodePool: its nodes carry the run's taint, ``limits`` cap it at the gang's GPUs, a budget of
    ``nodes: "0"`` stops every voluntary disruption (consolidation, drift, expiry) while the run holds it.
    ``node_labels``/``startup_taints``: the platform admin's template additions
    (:func:`kfp_gpu.plan.nodepool_template.template_extras`)."""
    template: dict[str, Any] = {  # no ownership labels on the nodes: a claim (kfp_gpu.cluster.nodes.claim) sets them
        "spec": {"nodeClassRef": dict(node_class), "requirements": requirements(instance_types, cand),
                 "taints": [pool_taint(run_label, namespace)], "expireAfter": "Never"},
    }
    if node_labels:
        template["metadata"] = {"labels": dict(node_labels)}
    if startup_taints:
        template["spec"]["startupTaints"] = [dict(t) for t in startup_taints]
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "NodePool",
        "metadata": {"name": name, "labels": dict(labels), "annotations": dict(annotations)},
        "spec": {
            "template": template,
            "limits": gpu_limit(limit_nodes, gpus_per_node),
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never",
                           "budgets": [{"nodes": "0"}]},
        },
    }


def candidate_of(nodepool: Mapping[str, Any]) -> Candidate | None:
    """The candidate a NodePool currently asks for (None when it is not one of ours)."""
    zone, ct = "", ""
    for r in ((nodepool.get("spec") or {}).get("template") or {}).get("spec", {}).get("requirements") or []:
        vals = list(r.get("values") or [])
        if r.get("key") == ZONE_LABEL and len(vals) == 1:
            zone = str(vals[0])
        if r.get("key") == CAPACITY_TYPE_LABEL and len(vals) == 1:
            ct = str(vals[0])
    return Candidate(zone, ct) if ct else None


# ---- observing ------------------------------------------------------------------------------------------

class ClaimState(str, enum.Enum):
    PENDING = "Pending"  # no Launched condition yet
    LAUNCHING = "Launching"  # Launched=Unknown with a reason: the launch failed and is retried
    LAUNCHED = "Launched"
    REGISTERED = "Registered"
    INITIALIZED = "Initialized"
    FAILED = "Failed"  # Launched=False
    DELETING = "Deleting"


@dataclass(frozen=True)
class ClaimView:
    name: str
    state: ClaimState
    reason: str = ""
    message: str = ""
    node: str = ""  # status.nodeName once registered
    zone: str = ""
    capacity_type: str = ""
    launched: bool = False  # Launched=True was ever seen (by the caller's memory or the object)
    since: float = 0.0  # when the caller first saw it


def _cond(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def read_claim(obj: Mapping[str, Any], *, since: float = 0.0, launched_before: bool = False) -> ClaimView:
    """A NodeClaim's state from its conditions (Launched / Registered / Initialized) and deletion mark."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    launched = _cond(obj, "Launched")
    st, reason, message = ClaimState.PENDING, "", ""
    if launched is not None:
        reason, message = str(launched.get("reason", "")), str(launched.get("message", ""))
        status = str(launched.get("status"))
        st = {"True": ClaimState.LAUNCHED, "False": ClaimState.FAILED}.get(status, ClaimState.PENDING)
        if status == "Unknown" and reason and reason not in ("AwaitingReconciliation", "Unknown"):
            st = ClaimState.LAUNCHING
    for kind, state in (("Registered", ClaimState.REGISTERED), ("Initialized", ClaimState.INITIALIZED)):
        c = _cond(obj, kind)
        if c is not None and str(c.get("status")) == "True":
            st = state
    got = obj.get("status") or {}
    # a launch sets providerID; a deleting claim keeps its conditions, so a launched one never reads as an ICE
    launched_now = st in (ClaimState.LAUNCHED, ClaimState.REGISTERED, ClaimState.INITIALIZED) or bool(
        got.get("providerID") or got.get("nodeName"))
    if meta.get("deletionTimestamp"):
        st = ClaimState.DELETING
    return ClaimView(str(meta.get("name", "")), st, reason, message, str(got.get("nodeName", "")),
                     str(labels.get(ZONE_LABEL, "")), str(labels.get(CAPACITY_TYPE_LABEL, "")),
                     launched_before or launched_now, since)


@dataclass(frozen=True)
class Signal:
    """One piece of evidence that the current candidate cannot be served."""

    kind: str  # "ice" (a NodeClaim deleted before launch / its ICE event) | "no-offering" (pod events) | "failed"
    at: float
    reason: str
    message: str = ""
    claim: str = ""


def karpenter_scheduling_message(event: Mapping[str, Any]) -> str:
    """The message of a Karpenter FailedScheduling event on a pod ("" for the kube-scheduler's own)."""
    msg = str(event.get("message", ""))
    if str(event.get("reason", "")) != "FailedScheduling":
        return ""
    source = str((event.get("source") or {}).get("component", "")) + str(event.get("reportingComponent", ""))
    if "karpenter" in source or msg.startswith(KARPENTER_SCHEDULE_PREFIX):
        return msg
    return ""


class Verdict(str, enum.Enum):
    WAIT = "wait"
    READY = "ready"
    BLOCKED = "blocked"  # fail over to the next candidate
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class Assessment:
    verdict: Verdict
    reason: str = ""
    message: str = ""


def assess(*, ready: int, wanted: int, claims: Iterable[ClaimView], signals: Iterable[Signal], asked_at: float,
           now: float, deadline: float, pinned: bool = True, no_offering_grace_s: float = NO_OFFERING_GRACE_S,
           launch_stuck_s: float = LAUNCH_STUCK_S) -> Assessment:
    """What to do with the current candidate.

    READY when ``wanted`` nodes are Ready. BLOCKED on an ICE (a NodeClaim deleted before it launched, or its
    ``InsufficientCapacityError`` event), on ``Launched=False``, on a launch still failing after
    ``launch_stuck_s``, or when Karpenter kept saying "no offering" (pod events since ``asked_at``) for
    ``no_offering_grace_s`` while no live NodeClaim is on the way. A candidate not ``pinned`` to one zone lets
    Karpenter choose among zones: an ICE there is Karpenter's to route around (AWS marks the offering unavailable
    and launches elsewhere), so it blocks only after :data:`ICE_RETRIES_ANY_ZONE` of them. TIMEOUT past the
    deadline; else WAIT.
    """
    if ready >= wanted:
        return Assessment(Verdict.READY)
    live = [c for c in claims if c.state is not ClaimState.DELETING]
    recent = [s for s in signals if s.at >= asked_at]
    ices = [s for s in recent if s.kind in ("ice", "failed")]
    if ices and (pinned or len(ices) >= ICE_RETRIES_ANY_ZONE):
        return Assessment(Verdict.BLOCKED, ices[-1].reason, ices[-1].message)
    for c in live:
        if c.state is ClaimState.FAILED:
            return Assessment(Verdict.BLOCKED, c.reason or "LaunchFailed", c.message)
        if c.state is ClaimState.LAUNCHING and now - c.since >= launch_stuck_s:
            return Assessment(Verdict.BLOCKED, c.reason, c.message)
    offering = [s for s in recent if s.kind == "no-offering"]
    coming = [c for c in live if c.state in (ClaimState.PENDING, ClaimState.LAUNCHING, ClaimState.LAUNCHED)]
    if offering and not coming:  # Karpenter says "no offering" and launches nothing
        first = min(s.at for s in offering)
        if now - first >= no_offering_grace_s:
            last = max(offering, key=lambda s: s.at)
            return Assessment(Verdict.BLOCKED, last.reason, last.message)
    if now >= deadline:
        return Assessment(Verdict.TIMEOUT, "deadline", f"{ready}/{wanted} nodes Ready")
    return Assessment(Verdict.WAIT)


def short_reason(message: str) -> str:
    """A one-phrase reason from a Karpenter scheduling message ("no offering", "nodepool limits")."""
    m = message.lower()
    if "exceed limits" in m:
        return "NodePoolLimitReached"
    if "offering" in m:
        return "NoOfferingAvailable"
    if "incompatible" in m or "requirements" in m:
        return "NoCompatibleInstanceType"
    return "FailedScheduling"


# ---- errors ---------------------------------------------------------------------------------------------

def exhausted(history: Sequence[Mapping[str, Any]], *, nodes: int, gpus_per_node: int, accelerator: str,
              nodepool: str) -> CapacityUnavailable:
    """Every candidate blocked: the error names each (zone, capacity type) and Karpenter's reason."""
    tried = "; ".join(f"{h.get('zone') or 'any zone'}/{h.get('capacity_type')}: {h.get('reason')}"
                      + (f" ({str(h.get('message'))[:160]})" if h.get("message") else "") for h in history)
    return CapacityUnavailable(
        f"Karpenter could not launch {nodes} x {gpus_per_node} {accelerator} nodes for NodePool {nodepool} in any "
        f"candidate zone ({tried or 'no candidate'})",
        remediation="add zones, allow on-demand fallback (recovery.on_demand_after>0 with capacity='spot'), pick "
        "another accelerator, or retry later", scope=Scope.REGION, failover_history=list(history),
        zones=sorted({str(h.get("zone")) for h in history if h.get("zone")}))


def timed_out(*, ready: int, wanted: int, nodepool: str, cand: Candidate, deadline_s: float,
              history: Sequence[Mapping[str, Any]]) -> ProvisioningTimeout:
    return ProvisioningTimeout(
        f"NodePool {nodepool}: {ready}/{wanted} nodes Ready in {cand.label} at scale_up_deadline_s={deadline_s:g}",
        remediation="raise scale_up_deadline_s, add zones, or check the Karpenter controller's logs and the NodeClaims",
        nodepool=nodepool, failover_history=list(history))


def limit_for_replace(*, gang: int, still_listed: int, gpus_per_node: int) -> dict[str, str]:
    """Recovery's NodePool limit: the gang plus the lost nodes Karpenter still counts while they drain (a
    deleting NodeClaim counts against the limit until it is gone), never less than the gang."""
    return gpu_limit(gang + max(0, still_listed), gpus_per_node)
