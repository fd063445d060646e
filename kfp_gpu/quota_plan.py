"""Quota planning for a schedule of future runs: what to raise, by how much, and by when.

Schedule YAML::

    cloud: gke            # optional: gke | eks (default: the provider's name if it is one, else gke)
    runs:
      - name: llm-pretrain
        date: 2026-12-14   # the day the run starts
        accelerator: h100-80gb
        gpus: 64
        regions: [us-central1, us-east4]   # candidates, preferred first
        spot: false
        gpus_per_node: 8   # optional; default 8, or the largest VM shape of that accelerator

How the plan is made (pure arithmetic over ``provider.quota()`` amounts):

1. Each run needs ``ceil(gpus / gpus_per_node)`` nodes; its quota needs per metric come from
   :func:`kfp_gpu.plan.quota.needs` (GPUs on GCP incl. ``GPUS_ALL_REGIONS``; vCPUs on AWS).
2. Runs on the same date are concurrent, so their needs add up. Runs are placed in date order into
   the first candidate region where every need still fits; if none fits, into the region with the
   smallest total shortfall (unknown quotas rank last).
3. For every (metric, location) the peak demand over dates is compared with ``free``; a shortfall
   becomes a :class:`QuotaRaise`: ``increase = peak - free``, ``new_limit = limit + increase``,
   ``request_by = first date short - lead_time_days`` (from the :class:`QuotaAmount`), and
   ``too_late`` when ``request_by`` is before ``today``. Unknown quotas are listed as such, never ok.
4. ``file_requests=True`` files each raise with ``provider.request_quota_increase(metric, location,
   new_limit, justification)``; a failure is recorded on that item and the others still proceed.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kfp_gpu import accelerators
from kfp_gpu.errors import InvalidSpec, KfpGpuError, yaml_problem
from kfp_gpu.plan import quota as quota_math
from kfp_gpu.providers.base import CapacityProvider, QuotaAmount
from kfp_gpu.spec import CapacityType, ProvisioningSpec, Target, TargetKind

_RUN_KEYS = {"name", "date", "accelerator", "gpus", "regions", "spot", "gpus_per_node"}


@dataclass(frozen=True)
class ScheduledRun:
    name: str
    date: _dt.date
    accelerator: str
    gpus: int
    regions: tuple[str, ...]
    spot: bool = False
    gpus_per_node: int = 0  # 0 = choose

    def spec_for(self, region: str, cloud: TargetKind) -> ProvisioningSpec:
        """The provisioning spec this run would use in ``region``. Raises: InvalidSpec."""
        gpn = self.gpus_per_node or _default_gpn(self.accelerator, cloud)
        return ProvisioningSpec(
            accelerator=self.accelerator, nodes=max(1, math.ceil(self.gpus / gpn)), gpus_per_node=gpn,
            capacity=CapacityType.SPOT if self.spot else CapacityType.ON_DEMAND,
            target=Target(kind=cloud, region=region),
        )


@dataclass(frozen=True)
class Schedule:
    runs: tuple[ScheduledRun, ...]
    cloud: TargetKind = TargetKind.GKE


def _default_gpn(accelerator: str, cloud: TargetKind) -> int:
    acc = accelerators.get(accelerator)
    shapes = acc.aws_instances if cloud is TargetKind.EKS else acc.gce_machines
    gpus = sorted({m.gpus for m in shapes})
    return 8 if 8 in gpus else gpus[-1]


def _date(value: Any, where: str) -> _dt.date:
    if isinstance(value, _dt.datetime):
        return value.date()
    if isinstance(value, _dt.date):
        return value
    try:
        return _dt.date.fromisoformat(str(value))
    except ValueError:
        raise InvalidSpec(where, value, "must be a date like 2026-12-14") from None


def parse_schedule(text: str, *, default_cloud: str = "gke", source: str = "<text>") -> Schedule:
    """Parse and validate schedule YAML text (``source``: the file it came from, named by a YAML error).

    Raises:
        InvalidSpec: naming the offending field, e.g. ``runs[2].gpus``.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidSpec("schedule", source, f"is not valid YAML ({yaml_problem(exc)})",
                          remediation="fix the YAML at that line (docs/user-guide.md shows a schedule)") from None
    if not isinstance(data, dict):
        raise InvalidSpec("schedule", type(data).__name__, "must be a mapping with a 'runs' list")
    unknown = set(data) - {"runs", "cloud"}
    if unknown:
        raise InvalidSpec(sorted(unknown)[0], data[sorted(unknown)[0]], "unknown field; known: cloud, runs")
    cloud_raw = str(data.get("cloud", default_cloud))
    try:
        cloud = TargetKind(cloud_raw)
    except ValueError:
        raise InvalidSpec("cloud", cloud_raw, "allowed: 'gke', 'eks'") from None
    if cloud is TargetKind.LOCAL:
        cloud = TargetKind.GKE
    runs_raw = data.get("runs")
    if not isinstance(runs_raw, list) or not runs_raw:
        raise InvalidSpec("runs", runs_raw, "must be a non-empty list of runs")
    runs: list[ScheduledRun] = []
    names: set[str] = set()
    for i, r in enumerate(runs_raw):
        at = f"runs[{i}]"
        if not isinstance(r, dict):
            raise InvalidSpec(at, r, "must be a mapping with name, date, accelerator, gpus, regions")
        for key in sorted(set(r) - _RUN_KEYS):
            raise InvalidSpec(f"{at}.{key}", r[key], f"unknown field; known: {', '.join(sorted(_RUN_KEYS))}")
        for key in ("name", "date", "accelerator", "gpus", "regions"):
            if key not in r:
                raise InvalidSpec(f"{at}.{key}", None, "is required")
        name = str(r["name"])
        if not name or name in names:
            raise InvalidSpec(f"{at}.name", name, "must be non-empty and unique")
        names.add(name)
        gpus = r["gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 65536:
            raise InvalidSpec(f"{at}.gpus", gpus, "must be an integer in [1, 65536]")
        regions = r["regions"]
        if isinstance(regions, str):
            regions = [regions]
        if not isinstance(regions, list) or not regions or not all(isinstance(x, str) for x in regions):
            raise InvalidSpec(f"{at}.regions", regions, "must be a non-empty list of region names")
        spot = r.get("spot", False)
        if not isinstance(spot, bool):
            raise InvalidSpec(f"{at}.spot", spot, "must be true or false")
        gpn = r.get("gpus_per_node", 0)
        if isinstance(gpn, bool) or not isinstance(gpn, int) or gpn < 0:
            raise InvalidSpec(f"{at}.gpus_per_node", gpn, "must be a positive integer")
        try:
            acc = accelerators.get(str(r["accelerator"])).name
        except InvalidSpec as exc:
            raise InvalidSpec(f"{at}.accelerator", r["accelerator"], str(exc.fields.get("allowed", ""))) from None
        run = ScheduledRun(name, _date(r["date"], f"{at}.date"), acc, gpus, tuple(regions), spot, gpn)
        for region in run.regions:  # validate shape + region format now, naming the run's field
            try:
                run.spec_for(region, cloud)
            except InvalidSpec as exc:
                field_name = "regions" if exc.field.startswith("target.region") else exc.field
                raise InvalidSpec(f"{at}.{field_name}", exc.value, str(exc.fields.get("allowed", ""))) from None
        runs.append(run)
    return Schedule(tuple(runs), cloud)


def load_schedule(path: str | Path, *, default_cloud: str = "gke") -> Schedule:
    """Read and parse a schedule file. Raises: InvalidSpec (missing file or bad content)."""
    p = Path(path)
    if not p.is_file():
        raise InvalidSpec("schedule", str(p), "is a directory, not a file" if p.is_dir() else "no such file",
                          remediation="pass --schedule PATH of a YAML file with a 'runs' list")
    return parse_schedule(p.read_text(encoding="utf-8"), default_cloud=default_cloud, source=str(p))


@dataclass
class QuotaRaise:
    metric: str
    location: str
    unit: str
    status: str  # "short" | "unknown"
    peak_demand: float
    limit: float | None
    usage: float | None
    free: float | None
    increase: float | None  # None when unknown
    new_limit: float | None
    needed_by: _dt.date
    request_by: _dt.date | None
    lead_time_days: float
    too_late: bool
    runs: tuple[str, ...]
    raise_path: str = ""
    reason: str = ""
    request_id: str = ""
    request_error: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["needed_by"] = self.needed_by.isoformat()
        d["request_by"] = self.request_by.isoformat() if self.request_by else None
        d["runs"] = list(self.runs)
        return d


@dataclass
class QuotaPlan:
    today: _dt.date
    raises: list[QuotaRaise] = field(default_factory=list)
    placements: dict[str, str] = field(default_factory=dict)  # run name -> chosen region

    @property
    def ok(self) -> bool:
        return not self.raises

    def to_dict(self) -> dict[str, Any]:
        return {"today": self.today.isoformat(), "ok": self.ok, "placements": dict(self.placements),
                "raises": [r.to_dict() for r in self.raises]}

    def _rows(self) -> list[list[str]]:
        rows = []
        for r in self.raises:
            amt = "?" if r.increase is None else f"+{r.increase:g} {r.unit} (to {r.new_limit:g})"
            by = "?" if r.request_by is None else r.request_by.isoformat()
            flag = "TOO LATE" if r.too_late else ("unknown" if r.status == "unknown" else "")
            req = r.request_id or (f"error: {r.request_error}" if r.request_error else "")
            rows.append([r.metric, r.location, amt, r.needed_by.isoformat(), by, flag, ", ".join(r.runs), req])
        return rows

    def to_markdown(self) -> str:
        head = f"### Quota plan (as of {self.today.isoformat()})\n\n"
        place = "".join(f"- `{k}` \u2192 {v}\n" for k, v in self.placements.items())
        if self.ok:
            return head + place + "\nAll scheduled runs fit current quota.\n"
        lines = ["| quota | location | raise | needed by | request by | flag | runs | request |",
                 "|---|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(r) + " |" for r in self._rows()]
        return head + place + "\n" + "\n".join(lines) + "\n"

    def to_terminal(self) -> str:
        out = [f"Quota plan as of {self.today.isoformat()}"]
        out += [f"  {k} -> {v}" for k, v in self.placements.items()]
        if self.ok:
            return "\n".join([*out, "all scheduled runs fit current quota"])
        hdr = ["quota", "location", "raise", "needed by", "request by", "flag", "runs", "request"]
        rows = [hdr, *self._rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(hdr))]
        out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        return "\n".join(out)


def _fits_with(checks: Sequence[quota_math.QuotaCheck], taken: dict[tuple[str, str], float]) -> tuple[int, float]:
    """(unknown count, total shortfall) of placing ``checks`` on top of already-placed demand."""
    unknown, short = 0, 0.0
    for c in checks:
        if c.free is None:
            unknown += 1
            continue
        short += max(0.0, taken.get((c.metric, c.location), 0.0) + c.needed - c.free)
    return unknown, short


def plan_quota(
    schedule: Schedule,
    provider: CapacityProvider,
    *,
    today: _dt.date | None = None,
    file_requests: bool = False,
    justification: str = "",
) -> QuotaPlan:
    """Compare the schedule with current quota; optionally file the increase requests.

    Raises:
        PermissionDenied, NotFound: from ``provider.quota`` (no credentials / no such region).
        InvalidSpec: a run cannot be expressed as a spec in one of its regions.
    """
    today = today or _dt.date.today()
    rows_cache: dict[tuple[str, str, bool], list[QuotaAmount]] = {}
    rows_by_key: dict[tuple[str, str], QuotaAmount] = {}
    demand: dict[_dt.date, dict[tuple[str, str], float]] = defaultdict(lambda: defaultdict(float))
    who: dict[_dt.date, dict[tuple[str, str], list[str]]] = defaultdict(lambda: defaultdict(list))
    plan = QuotaPlan(today=today)
    checks_by_key: dict[tuple[str, str], quota_math.QuotaCheck] = {}
    for run in sorted(schedule.runs, key=lambda r: (r.date, r.name)):
        options = []
        for idx, region in enumerate(run.regions):
            key = (run.accelerator, region, run.spot)
            if key not in rows_cache:
                rows_cache[key] = provider.quota(run.accelerator, region, spot=run.spot)
                for row in rows_cache[key]:
                    rows_by_key.setdefault((row.metric, row.location), row)
            checks = quota_math.evaluate(run.spec_for(region, schedule.cloud), region, rows_cache[key])
            unknown, short = _fits_with(checks, demand[run.date])
            options.append(((short > 0, unknown > 0, short, idx), region, checks))
        _, region, checks = min(options, key=lambda o: o[0])
        plan.placements[run.name] = region
        for c in checks:
            demand[run.date][(c.metric, c.location)] += c.needed
            who[run.date][(c.metric, c.location)].append(run.name)
            checks_by_key.setdefault((c.metric, c.location), c)
    for (metric, location), c in sorted(checks_by_key.items()):
        dates = sorted(d for d in demand if (metric, location) in demand[d])
        peak = max(demand[d][(metric, location)] for d in dates)
        qrow = rows_by_key.get((metric, location))
        lead = qrow.lead_time_days if qrow else c.lead_time_days
        if c.free is None:
            first = dates[0]
            plan.raises.append(QuotaRaise(
                metric, location, c.unit, "unknown", peak, c.limit, c.usage, None, None, None, first,
                first - _dt.timedelta(days=math.ceil(lead)), lead,
                first - _dt.timedelta(days=math.ceil(lead)) < today,
                tuple(who[first][(metric, location)]), c.raise_path, c.reason or "quota could not be read",
            ))
            continue
        short_dates = [d for d in dates if demand[d][(metric, location)] > c.free]
        if not short_dates:
            continue
        first = short_dates[0]
        increase = peak - c.free
        request_by = first - _dt.timedelta(days=math.ceil(lead))
        runs = tuple(dict.fromkeys(n for d in short_dates for n in who[d][(metric, location)]))
        plan.raises.append(QuotaRaise(
            metric, location, c.unit, "short", peak, c.limit, c.usage, c.free, increase,
            (c.limit or 0.0) + increase, first, request_by, lead, request_by < today, runs, c.raise_path,
            f"peak {peak:g} {c.unit} vs {c.free:g} free",
        ))
    if file_requests:
        _file(plan, provider, justification)
    return plan


def _file(plan: QuotaPlan, provider: CapacityProvider, justification: str) -> None:
    for r in plan.raises:
        if r.status != "short" or r.new_limit is None:
            continue
        why = justification or (
            f"kfp-gpu scheduled runs {', '.join(r.runs)} need {r.peak_demand:g} {r.unit} of {r.metric} "
            f"in {r.location} from {r.needed_by.isoformat()}"
        )
        try:
            r.request_id = provider.request_quota_increase(r.metric, r.location, r.new_limit, why)
        except KfpGpuError as exc:
            r.request_error = exc.message
