from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from kfp_gpu.errors import InvalidSpec, PermissionDenied
from kfp_gpu.providers.base import QuotaAmount
from kfp_gpu.providers.fake import FakeProvider
from kfp_gpu.quota_plan import load_schedule, parse_schedule, plan_quota

TODAY = dt.date(2026, 12, 1)
A100 = "NVIDIA_A100_80GB_GPUS"


def _sched(*runs: str, cloud: str = "") -> str:
    head = f"cloud: {cloud}\n" if cloud else ""
    return head + "runs:\n" + "".join(runs)


def _run(name: str, date: str, gpus: int, regions: str = "[us-central1]", acc: str = "a100-80gb",
         spot: str = "false") -> str:
    return (f"  - name: {name}\n    date: {date}\n    accelerator: {acc}\n    gpus: {gpus}\n"
            f"    regions: {regions}\n    spot: {spot}\n")


def _fake(**free: float) -> FakeProvider:
    p = FakeProvider()
    p.set_quota("GPUS_ALL_REGIONS", "global", 1000, 0)
    for region, f in free.items():
        p.set_quota(A100, region.replace("_", "-"), 64, 64 - f, lead_time_days=7)
    return p


def test_everything_fits() -> None:
    s = parse_schedule(_sched(_run("a", "2026-12-20", 16)))
    plan = plan_quota(s, _fake(us_central1=32), today=TODAY)
    assert plan.ok and plan.placements == {"a": "us-central1"}
    assert "fit current quota" in plan.to_markdown() and "fit current quota" in plan.to_terminal()


def test_short_quota_raise_amount_and_deadline() -> None:
    s = parse_schedule(_sched(_run("big", "2026-12-20", 48, "[us-central1, us-east4]")))
    plan = plan_quota(s, _fake(us_central1=8, us_east4=24), today=TODAY)
    assert plan.placements == {"big": "us-east4"}  # smaller shortfall than the preferred region
    (r,) = plan.raises
    assert (r.metric, r.location, r.status) == (A100, "us-east4", "short")
    assert r.increase == 24 and r.new_limit == 64 + 24 and r.peak_demand == 48
    assert r.needed_by == dt.date(2026, 12, 20) and r.request_by == dt.date(2026, 12, 13)
    assert not r.too_late and r.runs == ("big",)
    md = plan.to_markdown()
    assert "+24 gpus (to 88)" in md and "2026-12-13" in md


def test_first_fitting_region_is_preferred() -> None:
    s = parse_schedule(_sched(_run("a", "2026-12-20", 16, "[us-central1, us-east4]")))
    plan = plan_quota(s, _fake(us_central1=8, us_east4=16), today=TODAY)
    assert plan.ok and plan.placements["a"] == "us-east4"
    plan = plan_quota(s, _fake(us_central1=16, us_east4=64), today=TODAY)
    assert plan.placements["a"] == "us-central1"


def test_same_day_runs_stack_other_days_do_not() -> None:
    same = parse_schedule(_sched(_run("a", "2026-12-20", 16), _run("b", "2026-12-20", 16)))
    plan = plan_quota(same, _fake(us_central1=24), today=TODAY)
    (r,) = plan.raises
    assert r.increase == 8 and r.runs == ("a", "b")
    apart = parse_schedule(_sched(_run("a", "2026-12-20", 16), _run("b", "2026-12-21", 16)))
    assert plan_quota(apart, _fake(us_central1=24), today=TODAY).ok


def test_too_late_flag() -> None:
    s = parse_schedule(_sched(_run("soon", "2026-12-04", 32)))
    (r,) = plan_quota(s, _fake(us_central1=8), today=TODAY).raises
    assert r.request_by == dt.date(2026, 11, 27) and r.too_late
    assert "TOO LATE" in plan_quota(s, _fake(us_central1=8), today=TODAY).to_terminal()


def test_unknown_quota_is_never_ok() -> None:
    p = _fake()
    p.set_quota(A100, "us-central1", None, None, status="unknown", reason="403 on cloudquotas")
    plan = plan_quota(parse_schedule(_sched(_run("a", "2026-12-20", 8))), p, today=TODAY)
    assert not plan.ok
    (r,) = plan.raises
    assert r.status == "unknown" and r.increase is None and "403" in r.reason


def test_global_quota_sums_across_regions() -> None:
    p = _fake(us_central1=64, us_east4=64)
    p.set_quota("GPUS_ALL_REGIONS", "global", 40, 0)
    s = parse_schedule(_sched(_run("a", "2026-12-20", 32, "[us-central1]"),
                              _run("b", "2026-12-20", 32, "[us-east4]")))
    (r,) = plan_quota(s, p, today=TODAY).raises
    assert (r.metric, r.location, r.increase, r.new_limit) == ("GPUS_ALL_REGIONS", "global", 24, 64)


def test_file_requests_and_partial_failure() -> None:
    p = _fake(us_central1=8)
    p.set_quota("GPUS_ALL_REGIONS", "global", 16, 0)
    s = parse_schedule(_sched(_run("a", "2026-12-20", 32)))
    p.fail("request_quota_increase", PermissionDenied("no cloudquotas.quotaPreferences.create"), region="global")
    plan = plan_quota(s, p, today=TODAY, file_requests=True)
    by = {r.metric: r for r in plan.raises}
    assert by[A100].request_id.startswith("fake-qr-") and not by[A100].request_error
    assert "quotaPreferences" in by["GPUS_ALL_REGIONS"].request_error
    (call,) = p.mutations("request_quota_increase")
    assert call.target == f"{A100}@us-central1" and call.args["value"] == 64 + 24
    assert "a" in call.args["justification"]


class TinyProvider:
    """Only what the planner needs: quota() and request_quota_increase()."""

    name = "tiny"

    def __init__(self, rows: list[QuotaAmount]) -> None:
        self.rows = rows
        self.requests: list[tuple[str, str, float]] = []

    def quota(self, accelerator: str, region: str, *, spot: bool) -> list[QuotaAmount]:
        return [r for r in self.rows if r.location in (region, "global")]

    def request_quota_increase(self, metric: str, region: str, value: float, justification: str) -> str:
        self.requests.append((metric, region, value))
        return f"req-{len(self.requests)}"


def test_eks_counts_vcpus_and_spot_metric() -> None:
    tiny = TinyProvider([QuotaAmount("L-7212CCBC", "us-east-1", 192, 0, unit="vcpus", lead_time_days=3)])
    s = parse_schedule(_sched(_run("s", "2026-12-20", 32, "[us-east-1]", spot="true"), cloud="eks"))
    plan = plan_quota(s, tiny, today=TODAY, file_requests=True)  # type: ignore[arg-type]
    (r,) = plan.raises
    assert r.unit == "vcpus" and r.peak_demand == 4 * 96 and r.increase == 4 * 96 - 192
    assert tiny.requests == [("L-7212CCBC", "us-east-1", 384.0)] and r.request_id == "req-1"


@pytest.mark.parametrize("text,field", [
    ("runs: [", "schedule"),
    ("- a\n- b\n", "schedule"),
    ("runs: []\n", "runs"),
    ("runz: []\n", "runz"),
    ("cloud: azure\nruns: []\n", "cloud"),
    (_sched("  - name: a\n    date: 2026-12-20\n    accelerator: a100\n    regions: [us-central1]\n"), "runs[0].gpus"),
    (_sched(_run("a", "2026-12-20", 0)), "runs[0].gpus"),
    (_sched(_run("a", "next week", 8)), "runs[0].date"),
    (_sched(_run("a", "2026-12-20", 8, acc="tpu-v5")), "runs[0].accelerator"),
    (_sched(_run("a", "2026-12-20", 8, regions="[us-central1-a]")), "runs[0].regions"),
    (_sched(_run("a", "2026-12-20", 8, regions="[]")), "runs[0].regions"),
    (_sched(_run("a", "2026-12-20", 8, spot="maybe")), "runs[0].spot"),
    (_sched(_run("a", "2026-12-20", 8), _run("a", "2026-12-21", 8)), "runs[1].name"),
    (_sched(_run("a", "2026-12-20", 8) + "    colour: red\n"), "runs[0].colour"),
])
def test_bad_schedule_names_the_field(text: str, field: str) -> None:
    with pytest.raises(InvalidSpec) as ei:
        parse_schedule(text)
    assert ei.value.field == field, ei.value


def test_load_schedule_file(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(_sched(_run("a", "2026-12-20", 8)))
    s = load_schedule(f)
    assert s.runs[0].date == dt.date(2026, 12, 20) and s.runs[0].accelerator == "a100-80gb"
    with pytest.raises(InvalidSpec):
        load_schedule(tmp_path / "missing.yaml")


def test_plan_serialises(tmp_path: Path) -> None:
    import json

    s = parse_schedule(_sched(_run("a", "2026-12-20", 32)))
    d: dict[str, Any] = json.loads(json.dumps(plan_quota(s, _fake(us_central1=8), today=TODAY).to_dict()))
    assert d["ok"] is False and d["raises"][0]["request_by"] == "2026-12-13"


def test_filed_against_cloud_quotas_one_preference_per_quota_updated_in_place() -> None:
    from google.oauth2.credentials import Credentials

    from kfp_gpu.providers.gke import GkeProvider
    from kfp_gpu_rehearsal.sim.gcp_iam import QUOTA_TOKEN
    from tests.sim._helpers import CLUSTER, PROJECT, running

    with running() as sim:  # a planner job: the quota requester's role (deploy/gcp-quota-requester-role.yaml)
        p = GkeProvider(PROJECT, "us-central1", CLUSTER, endpoint=sim.url, contact_email="ml@example.com",
                        credentials=Credentials(token=QUOTA_TOKEN))
        first = plan_quota(parse_schedule(_sched(_run("a", "2026-12-20", 256))), p, today=TODAY, file_requests=True)
        names = {r.metric: r.request_id for r in first.raises}
        assert A100 in names and all(n.startswith(f"projects/{PROJECT}/") for n in names.values())
        assert not any(r.request_error for r in first.raises)
        more = plan_quota(parse_schedule(_sched(_run("a", "2026-12-20", 384))), p, today=TODAY, file_requests=True)
        assert {r.metric: r.request_id for r in more.raises} == names  # the same preferences, patched
        assert sorted(sim.state.quota_prefs) == sorted(names.values())
        a100 = sim.state.quota_prefs[names[A100]]
        assert int(a100["quotaConfig"]["preferredValue"]) == next(r.new_limit for r in more.raises if r.metric == A100)
        p.contact_email = ""
        again = plan_quota(parse_schedule(_sched(_run("a", "2026-12-20", 512))), p, today=TODAY, file_requests=True)
        assert all("contact_email" in r.request_error for r in again.raises if r.status == "short")
