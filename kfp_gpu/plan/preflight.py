"""The preflight verdict: ranked placements + cluster checks, the Markdown report, and the error.

Pure data and formatting (no I/O); :mod:`kfp_gpu.steps.preflight` gathers the observations.
The result is JSON round-trippable because it travels to the next DAG step.

Overall verdict: SHORT when no placement fits or any cluster check is short; UNKNOWN when the best
placement or any cluster check could not be verified, or the autoscaler's check-capacity was asked and gave no
answer; FITS only when everything was checked and fits.

The report also names the provisioner backend the run will use and why
(:func:`kfp_gpu.provisioners.detect`), and the autoscaler's "is there capacity now" answer
(:class:`CapacityNow`, from a ``check-capacity.autoscaling.x-k8s.io`` ProvisioningRequest). cluster-autoscaler
answers check-capacity by simulating the gang's pods on the nodes the cluster has now (existing nodes plus the
ones a scale-up in progress is bringing, less capacity booked by other Provisioned requests); it never scales
up and ignores the node groups' room to grow (cluster-autoscaler provisioningrequest/checkcapacity
provisioningclass.go, FAQ.md "check-capacity"). So "no capacity now" is a warning, never a failure: the
scale-up may still add the nodes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kfp_gpu.errors import QuotaExceeded, Scope
from kfp_gpu.plan.placement import Placement
from kfp_gpu.plan.provreq import Observed, ReqState
from kfp_gpu.plan.quota import QuotaCheck, Verdict, worst

FOUND, NOT_FOUND, NO_ANSWER, NOT_ASKED = "found", "not-found", "unknown", "not-asked"
ANSWER_TEXT = {FOUND: "capacity available now", NOT_FOUND: "no capacity now (warning)", NO_ANSWER: "unknown",
               NOT_ASKED: "not asked"}
CHECK_SCOPE = ("check-capacity counts the nodes the cluster has now (and those a scale-up in progress brings); "
               "it never scales up")


@dataclass(frozen=True)
class CapacityNow:
    """The autoscaler's check-capacity answer for the whole gang (see the module docstring for its meaning).

    ``answer``: FOUND, NOT_FOUND, NO_ANSWER (asked, no answer in time or the ask failed: never ok) or
    NOT_ASKED (no autoscaler serves ProvisioningRequests here)."""

    answer: str
    detail: str
    request: str = ""
    elapsed_s: float = 0.0

    @property
    def text(self) -> str:
        return ANSWER_TEXT.get(self.answer, self.answer)

    def to_dict(self) -> dict[str, Any]:
        return {"answer": self.answer, "text": self.text, "detail": self.detail, "request": self.request,
                "elapsed_s": self.elapsed_s}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CapacityNow:
        return cls(str(d["answer"]), str(d.get("detail", "")), str(d.get("request", "")),
                   float(d.get("elapsed_s", 0.0)))


def capacity_answer(obs: Observed, *, request: str, waited_s: float, elapsed_s: float) -> CapacityNow:
    """The check-capacity request's last observed state as an answer. Provisioned=True (CapacityIsFound): found.
    Failed=True or Provisioned=False with CapacityIsNotFound (noRetry, or an autoscaler that ignores it): not
    found. Anything else (no condition, Accepted only, another failure reason): no answer."""
    why = f"{obs.reason}: {obs.message}".strip(": ") if obs.reason or obs.message else ""
    if obs.state is ReqState.PROVISIONED:
        return CapacityNow(FOUND, f"the autoscaler fits the gang on free nodes ({why}); {CHECK_SCOPE}",
                           request, elapsed_s)
    if obs.state in (ReqState.FAILED, ReqState.WAITING) and obs.reason == "CapacityIsNotFound":
        return CapacityNow(NOT_FOUND, f"the cluster's nodes cannot hold the gang now ({why}); {CHECK_SCOPE}, so "
                           "the scale-up may still get the nodes", request, elapsed_s)
    state = obs.state.value + (f" ({why})" if why else "")
    return CapacityNow(NO_ANSWER, f"no check-capacity answer in {waited_s:g}s (last state {state})", request,
                       elapsed_s)


@dataclass(frozen=True)
class ClusterCheck:
    """A Kubernetes-side (or storage) check: namespace quota, GPU capacity, Kueue, checkpoint URI."""

    name: str
    verdict: Verdict
    detail: str
    needed: float | None = None
    free: float | None = None
    remediation: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "verdict": self.verdict.value, "detail": self.detail,
                "needed": self.needed, "free": self.free, "remediation": self.remediation}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClusterCheck:
        return cls(str(d["name"]), Verdict(d["verdict"]), str(d.get("detail", "")), d.get("needed"),
                   d.get("free"), str(d.get("remediation", "")))


@dataclass
class PreflightResult:
    accelerator: str
    nodes: int
    gpus_per_node: int
    capacity: str
    placements: list[Placement] = field(default_factory=list)  # ranked, best first
    cluster_checks: list[ClusterCheck] = field(default_factory=list)
    elapsed_s: float = 0.0
    provisioner: dict[str, str] = field(default_factory=dict)  # {"name", "reason"}: the backend choice
    capacity_now: CapacityNow | None = None
    reservation: dict[str, Any] = field(default_factory=dict)  # capacity=reservation: {"name", "free", "nodes"}

    # ---- verdict ---------------------------------------------------------------------------
    @property
    def fitting(self) -> list[Placement]:
        return [p for p in self.placements if p.verdict is Verdict.FITS]

    @property
    def best(self) -> Placement | None:
        return self.placements[0] if self.placements else None

    @property
    def verdict(self) -> Verdict:
        cluster = worst([c.verdict for c in self.cluster_checks]) if self.cluster_checks else Verdict.FITS
        if not self.placements or all(p.verdict is Verdict.SHORT for p in self.placements):
            return Verdict.SHORT
        if cluster is Verdict.SHORT:
            return Verdict.SHORT
        placement = Verdict.FITS if self.fitting else Verdict.UNKNOWN
        asked = Verdict.UNKNOWN if self.capacity_now is not None and self.capacity_now.answer == NO_ANSWER else Verdict.FITS
        return worst([placement, cluster, asked])

    @property
    def ok(self) -> bool:
        """True only when everything was checked and fits (unknown is never ok)."""
        return self.verdict is Verdict.FITS

    @property
    def unknowns(self) -> list[str]:
        out = [f"{p.label}: {r}" for p in self.placements if p.verdict is Verdict.UNKNOWN for r in p.reasons]
        out += [f"{c.name}: {c.detail}" for c in self.cluster_checks if c.verdict is Verdict.UNKNOWN]
        if self.capacity_now is not None and self.capacity_now.answer == NO_ANSWER:
            out.append(f"check-capacity: {self.capacity_now.detail}")
        return out

    def shortfalls(self) -> list[QuotaCheck]:
        """Distinct short quota checks across placements (metric, location)."""
        seen: dict[tuple[str, str], QuotaCheck] = {}
        for p in self.placements:
            for c in p.shortfalls:
                seen.setdefault((c.metric, c.location), c)
        return list(seen.values())

    def error(self) -> QuotaExceeded:
        """The QuotaExceeded to raise when nothing fits, with remediation and lead times."""
        want = f"{self.nodes} x {self.gpus_per_node} {self.accelerator} ({self.capacity})"
        shorts = self.shortfalls()
        parts = [f"{c.metric}@{c.location} short by {c.short_by:g} {c.unit}" for c in shorts]
        parts += [f"{p.label}: {r}" for p in self.placements for r in p.reasons if p.verdict is Verdict.SHORT
                  and not r.startswith(tuple(c.metric for c in p.checks))]
        parts += [f"{c.name}: {c.detail}" for c in self.cluster_checks if c.verdict is Verdict.SHORT]
        fixes = [
            f"raise {c.metric} in {c.location} to >= {(c.limit or 0) + c.short_by:g} {c.unit} via "
            f"{c.raise_path or 'the cloud console'} (typical lead time {c.lead_time_days:g} days; "
            f"`kfp-gpu quota request --metric {c.metric} --region {c.location} --value "
            f"{(c.limit or 0) + c.short_by:g}`)"
            for c in shorts
        ]
        fixes += [c.remediation for c in self.cluster_checks if c.verdict is Verdict.SHORT and c.remediation]
        fixes.append("or add candidate regions/zones, fewer nodes, or another capacity type")
        return QuotaExceeded(
            f"preflight: no placement can fit {want}: " + ("; ".join(dict.fromkeys(parts)) or "nothing fits"),
            remediation="; ".join(fixes), scope=Scope.PROVIDER,
            shortfalls=[c.to_dict() for c in shorts],
            lead_time_days=max([c.lead_time_days for c in shorts], default=0.0),
        )

    # ---- JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "accelerator": self.accelerator, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
            "capacity": self.capacity, "placements": [p.to_dict() for p in self.placements],
            "cluster_checks": [c.to_dict() for c in self.cluster_checks], "elapsed_s": self.elapsed_s,
            "verdict": self.verdict.value, "provisioner": dict(self.provisioner),
            "capacity_now": self.capacity_now.to_dict() if self.capacity_now is not None else None,
            "reservation": dict(self.reservation),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PreflightResult:
        return cls(
            str(d["accelerator"]), int(d["nodes"]), int(d["gpus_per_node"]), str(d["capacity"]),
            [Placement.from_dict(p) for p in d.get("placements", [])],
            [ClusterCheck.from_dict(c) for c in d.get("cluster_checks", [])], float(d.get("elapsed_s", 0.0)),
            {str(k): str(v) for k, v in dict(d.get("provisioner") or {}).items()},
            CapacityNow.from_dict(d["capacity_now"]) if d.get("capacity_now") else None,
            dict(d.get("reservation") or {}),
        )

    @classmethod
    def from_json(cls, text: str) -> PreflightResult:
        return cls.from_dict(json.loads(text))

    # ---- report ----------------------------------------------------------------------------
    def to_markdown(self) -> str:
        icon = {Verdict.FITS: "fits", Verdict.UNKNOWN: "UNKNOWN", Verdict.SHORT: "SHORT"}
        lines = [
            f"# kfp-gpu preflight: {icon[self.verdict]}",
            "",
            f"Request: {self.nodes} node(s) x {self.gpus_per_node} {self.accelerator} "
            f"= {self.nodes * self.gpus_per_node} GPUs, capacity {self.capacity}. "
            f"Checked in {self.elapsed_s:.2f}s.",
            "",
        ]
        if self.provisioner:
            lines += [f"Provisioner backend: **{self.provisioner.get('name', '?')}** "
                      f"({self.provisioner.get('reason', '')}).", ""]
        lines += [
            "## Placements (best first)",
            "",
            "| # | region | zone | verdict | pool capacity (nodes) | notes |",
            "|---|---|---|---|---|---|",
        ]
        for i, p in enumerate(self.placements, 1):
            cap = "?" if p.pool_capacity_nodes is None else str(p.pool_capacity_nodes)
            notes = "; ".join(p.reasons).replace("|", "/") or "-"
            lines.append(f"| {i} | {p.region} | {p.zone or '(any)'} | {icon[p.verdict]} | {cap} | {notes} |")
        lines += ["", "## Quotas", "",
                  "| quota | location | needed | free | limit | verdict | how to raise | typical lead time |",
                  "|---|---|---|---|---|---|---|---|"]
        seen: set[tuple[str, str]] = set()
        for p in self.placements:
            for c in p.checks:
                if (c.metric, c.location) in seen:
                    continue
                seen.add((c.metric, c.location))
                free = "unknown" if c.free is None else f"{c.free:g} {c.unit}"
                limit = "?" if c.limit is None else f"{c.limit:g}"
                verdict = icon[c.verdict] + (f" (short by {c.short_by:g})" if c.short_by else "")
                if c.verdict is Verdict.UNKNOWN and c.reason:
                    verdict += f": {c.reason}"
                lead = f"{c.lead_time_days:g} days" if c.lead_time_days else "-"
                lines.append(f"| {c.metric} | {c.location} | {c.needed:g} {c.unit} | {free} | {limit} | "
                             f"{verdict.replace('|', '/')} | {(c.raise_path or '-').replace('|', '/')} | {lead} |")
        lines += self._reservation_lines() + self._capacity_now_lines()
        if self.cluster_checks:
            lines += ["", "## Cluster", "", "| check | verdict | needed | free | detail |", "|---|---|---|---|---|"]
            for cc in self.cluster_checks:
                needed = "-" if cc.needed is None else f"{cc.needed:g}"
                free = "-" if cc.free is None else f"{cc.free:g}"
                detail = (cc.detail + (f" (fix: {cc.remediation})" if cc.remediation else "")).replace("|", "/")
                lines.append(f"| {cc.name} | {icon[cc.verdict]} | {needed} | {free} | {detail} |")
        if self.verdict is Verdict.SHORT:
            err = self.error()
            lines += ["", "## What to do", "", err.remediation.replace("; ", "\n- ").join(["- ", ""])]
        elif self.unknowns:
            lines += ["", "## Could not verify (never counted as ok)", ""] + [f"- {u}" for u in self.unknowns]
        return "\n".join(lines) + "\n"

    def _reservation_lines(self) -> list[str]:
        r = self.reservation
        if not r:
            return []
        if r.get("free") is None:
            return ["", f"Reservation {r.get('name')}: free count unknown (every node counted against quota)."]
        return ["", f"Reservation {r.get('name')}: {r['free']} VM(s) free; {r.get('nodes', 0)} of the gang's "
                    f"{self.nodes} node(s) land in it and need no new quota (counted out of the amounts above)."]

    def _capacity_now_lines(self) -> list[str]:
        c = self.capacity_now
        if c is None:
            return []
        took = f" in {c.elapsed_s:.1f}s" if c.answer in (FOUND, NOT_FOUND) else ""
        req = f", request {c.request}" if c.request else ""
        return ["", "## Capacity now (autoscaler check-capacity)", "",
                f"**{c.text}**{took}{req}: {c.detail.replace('|', '/')}"]
