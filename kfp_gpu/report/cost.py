"""The three-tier cost-risk model, computed from a spec and an observed node timeline.

Tiers (all USD)::

    base    = GPUs x price per GPU-hour x expected hours
    risk    = base x jitter
    penalty = SLA penalty per hour x expected delay (hours)
    total   = base + risk + penalty

* GPUs = ``spec.total_gpus``; price = ``spec.price_per_gpu_hour()`` (``spec.cost.price_per_gpu_hour``
  or the catalog list price, spot or on-demand per ``spec.capacity``); expected hours =
  ``spec.cost.expected_hours``; SLA penalty = ``spec.cost.sla_penalty_per_hour``.
* **jitter** is *measured*, never assumed: ``Timeline.jitter()`` = (max - median) / median of the
  per-node request->Ready latencies L. 0 when fewer than two nodes got Ready.
* **expected delay** = max(L) - median(L) (= jitter x median(L)). The gang starts only when its
  slowest node is Ready, so the tail beyond the typical node latency is the delay this provisioning
  pattern adds to the run; it is charged at the SLA rate. 0 when fewer than two nodes got Ready.

Utilisation, from the same timeline:

* **provisioned GPU-hours** = sum over nodes of (Ready -> first of preempted/released, or the end of
  the timeline if still up) x the node's GPUs (``NodeTimeline.gpus``, else ``spec.gpus_per_node``).
* **used GPU-hours** = sum over job-running intervals of duration x GPUs. Intervals come from
  run-level events: ``job-running`` opens one; ``job-finished``, ``job-failed``, ``job-preempted`` or
  ``job-cancelled`` closes it (an open one ends at the end of the timeline). GPUs is the opening
  event's ``gpus`` field, else ``spec.total_gpus``.
* **idle GPU-minutes** = max(0, provisioned - used) x 60.

Reservations, from run-level events ``reservation-held`` (fields ``name``, ``gpus`` = reserved GPUs, optional
``pools``: the pools whose nodes consume it, default every node) and ``reservation-released`` (``name``):

* **reserved GPU-hours** = the reservations' GPUs x how long each was held (until released, else the end).
* **billed GPU-hours** = the integral over time of max(reserved GPUs, GPUs of the Ready nodes that consume
  them) + the GPUs of the other Ready nodes. A reserved VM that a node consumes is paid once (it is the
  node); what the reservation holds beyond its nodes is paid as idle reservation. Without reservation events,
  billed = provisioned.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from kfp_gpu.report._common import duration, job_intervals, span
from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.timeline import NodeState, Timeline


@dataclass(frozen=True)
class CostReport:
    run_id: str
    accelerator: str
    capacity: str
    gpus: int
    price_per_gpu_hour: float
    expected_hours: float
    base_usd: float
    jitter: float
    risk_usd: float
    median_ready_s: float | None
    max_ready_s: float | None
    expected_delay_s: float
    sla_penalty_per_hour: float
    penalty_usd: float
    total_usd: float
    provisioned_gpu_hours: float
    used_gpu_hours: float
    idle_gpu_minutes: float
    provisioned_cost_usd: float
    nodes_ready: int
    nodes_preempted: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    reserved_gpu_hours: float = 0.0
    billed_gpu_hours: float = 0.0  # provisioned + reserved GPU-hours no node consumed (never both)
    billed_cost_usd: float = 0.0

    @property
    def utilisation(self) -> float | None:
        """used / provisioned GPU-hours, None when nothing was provisioned."""
        if self.provisioned_gpu_hours <= 0:
            return None
        return min(1.0, self.used_gpu_hours / self.provisioned_gpu_hours)

    def rows(self) -> list[tuple[str, str, str]]:
        """(item, value, how it was computed) rows shared by every rendering."""
        med = "n/a" if self.median_ready_s is None else duration(self.median_ready_s)
        mx = "n/a" if self.max_ready_s is None else duration(self.max_ready_s)
        util = "n/a" if self.utilisation is None else f"{self.utilisation:.0%}"
        return [
            ("base", _usd(self.base_usd),
             f"{self.gpus} GPUs x {_usd(self.price_per_gpu_hour)}/GPU-h x {self.expected_hours:g} h"),
            ("risk", _usd(self.risk_usd), f"base x jitter {self.jitter:.3f} (Ready latency median {med}, max {mx})"),
            ("penalty", _usd(self.penalty_usd),
             f"SLA {_usd(self.sla_penalty_per_hour)}/h x expected delay {duration(self.expected_delay_s)}"),
            ("total", _usd(self.total_usd), "base + risk + penalty"),
            ("GPU-hours provisioned", f"{self.provisioned_gpu_hours:.2f}",
             f"Ready -> released per node ({self.nodes_ready} Ready, {self.nodes_preempted} preempted); "
             f"{_usd(self.provisioned_cost_usd)} at list price"),
            ("GPU-hours used", f"{self.used_gpu_hours:.2f}", f"job-running intervals; utilisation {util}"),
            ("idle GPU-minutes", f"{self.idle_gpu_minutes:.1f}", "provisioned - used"),
        ] + ([("GPU-hours billed", f"{self.billed_gpu_hours:.2f}",
               f"max(reserved, consuming nodes) + other nodes; {self.reserved_gpu_hours:.2f} reserved; "
               f"{_usd(self.billed_cost_usd)} at list price")] if self.reserved_gpu_hours > 0 else [])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["utilisation"] = self.utilisation
        return d

    def to_markdown(self) -> str:
        lines = [
            f"### Cost risk: {self.gpus} x {self.accelerator} ({self.capacity})",
            "",
            "| item | value | how |",
            "|---|---:|---|",
        ]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in self.rows()]
        lines += [f"\n> {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def to_terminal(self, width: int = 100) -> str:
        rows = self.rows()
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        room = max(10, width - w0 - w1 - 6)
        head = f"Cost risk: {self.gpus} x {self.accelerator} ({self.capacity})"
        out = [head, "\u2500" * min(width, max(len(head), w0 + w1 + 6 + 20))]
        for a, b, c in rows:
            c = c if len(c) <= room else c[: room - 1] + "\u2026"
            out.append(f"{a:<{w0}}  {b:>{w1}}  {c}")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def _usd(v: float) -> str:
    return f"${v:,.2f}"


def _provisioned_gpu_hours(tl: Timeline, default_gpus: int, t_end: float) -> float:
    total = 0.0
    for n in tl.nodes.values():
        ready = n.at(NodeState.READY)
        if ready is None:
            continue
        ends = [v for s in (NodeState.PREEMPTED, NodeState.RELEASED) if (v := n.at(s)) is not None]
        end = min(ends) if ends else t_end
        total += max(0.0, end - ready) / 3600.0 * (n.gpus or default_gpus)
    return total


RESERVATION_HELD, RESERVATION_RELEASED = "reservation-held", "reservation-released"


def _reservations(tl: Timeline, t_end: float) -> list[tuple[float, float, int, frozenset[str]]]:
    """(start, end, GPUs, consuming pools (empty = every node)) per held reservation."""
    released = {str(e.get("name")): float(e["t"]) for e in tl.events if e.get("kind") == RESERVATION_RELEASED}
    out = []
    for e in tl.events:
        if e.get("kind") == RESERVATION_HELD and int(e.get("gpus", 0)) > 0:
            start = float(e["t"])
            end = max(start, released.get(str(e.get("name")), t_end))
            out.append((start, end, int(e["gpus"]), frozenset(str(p) for p in e.get("pools") or ())))
    return out


def _billed_gpu_hours(tl: Timeline, default_gpus: int, t_end: float,
                      held: list[tuple[float, float, int, frozenset[str]]]) -> float:
    """Integral of max(reserved, consuming Ready nodes) + other Ready nodes (see the module docstring)."""
    spans = []
    for n in tl.nodes.values():
        ready = n.at(NodeState.READY)
        if ready is None:
            continue
        ends = [v for s in (NodeState.PREEMPTED, NodeState.RELEASED) if (v := n.at(s)) is not None]
        spans.append((ready, min(ends) if ends else t_end, n.gpus or default_gpus, n.pool))
    cuts = sorted({t for a, b, *_ in spans for t in (a, b)} | {t for a, b, *_ in held for t in (a, b)})
    total = 0.0
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        mid = (lo + hi) / 2
        live = [(g, pool) for a, b, g, pool in spans if a <= mid < b]
        reserved = [(g, pools) for a, b, g, pools in held if a <= mid < b]
        inside = sum(g for g, pool in live if any(not pools or pool in pools for _, pools in reserved))
        outside = sum(g for g, _ in live) - inside
        total += (max(sum(g for g, _ in reserved), inside) + outside) * (hi - lo) / 3600.0
    return total


def cost_report(spec: ProvisioningSpec, tl: Timeline) -> CostReport:
    """Compute the cost-risk report (see the module docstring for every formula).

    Raises:
        Nothing: missing data yields zeros plus an explanatory entry in ``notes``.
    """
    notes: list[str] = []
    price = spec.price_per_gpu_hour()
    hours = spec.cost.expected_hours
    base = spec.total_gpus * price * hours
    lat = tl.ready_latencies()
    jitter = tl.jitter()
    med = statistics.median(lat) if lat else None
    mx = max(lat) if lat else None
    delay = (mx - med) if (mx is not None and med is not None and len(lat) >= 2) else 0.0
    if len(lat) < 2:
        notes.append("fewer than two nodes reached Ready: jitter and expected delay are 0 (not measured)")
    risk = base * jitter
    penalty = spec.cost.sla_penalty_per_hour * delay / 3600.0
    _, t_end = span(tl)
    prov = _provisioned_gpu_hours(tl, spec.gpus_per_node, t_end)
    used = sum((e - s) / 3600.0 * (g if g is not None else spec.total_gpus) for s, e, g in job_intervals(tl, t_end))
    if not job_intervals(tl, t_end):
        notes.append("no job-running event recorded: used GPU-hours is 0")
    if used > prov + 1e-9:
        notes.append("used exceeds provisioned GPU-hours: the timeline is missing some nodes")
    held = _reservations(tl, t_end)
    reserved = sum((b - a) / 3600.0 * g for a, b, g, _ in held)
    billed = _billed_gpu_hours(tl, spec.gpus_per_node, t_end, held) if held else prov
    return CostReport(
        run_id=tl.run_id,
        accelerator=spec.accelerator,
        capacity=spec.capacity.value,
        gpus=spec.total_gpus,
        price_per_gpu_hour=price,
        expected_hours=hours,
        base_usd=round(base, 4),
        jitter=round(jitter, 6),
        risk_usd=round(risk, 4),
        median_ready_s=med,
        max_ready_s=mx,
        expected_delay_s=round(delay, 3),
        sla_penalty_per_hour=spec.cost.sla_penalty_per_hour,
        penalty_usd=round(penalty, 4),
        total_usd=round(base + risk + penalty, 4),
        provisioned_gpu_hours=round(prov, 6),
        used_gpu_hours=round(used, 6),
        idle_gpu_minutes=round(max(0.0, prov - used) * 60.0, 3),
        provisioned_cost_usd=round(prov * price, 4),
        nodes_ready=sum(1 for n in tl.nodes.values() if n.at(NodeState.READY) is not None),
        nodes_preempted=sum(1 for n in tl.nodes.values() if n.at(NodeState.PREEMPTED) is not None),
        notes=tuple(notes),
        reserved_gpu_hours=round(reserved, 6),
        billed_gpu_hours=round(billed, 6),
        billed_cost_usd=round(billed * price, 4),
    )
