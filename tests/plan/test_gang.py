"""The controller's decision table (kfp_gpu.plan.gang): one row per test, plain dicts, no cluster."""

from __future__ import annotations

from typing import Any

from kfp_gpu.gang import api
from kfp_gpu.plan.gang import FAILED, Do, next_action, phase


def gang(stage: str = "", conds: dict[str, tuple[str, str]] | None = None, **spec: Any) -> dict[str, Any]:
    conditions = [{"type": t, "status": s, "reason": r} for t, (s, r) in (conds or {}).items()]
    return {"metadata": {"name": "g", "namespace": "team-a"},
            "spec": {"stage": stage, "jobs": {}, "release": False, "nodes": 2, **spec},
            "status": {"conditions": conditions}}


ADMITTED = {api.POLICY_ADMITTED: ("True", "Admitted")}


def test_admission_comes_first() -> None:
    assert next_action(gang(api.PROVISIONED), set()).do is Do.ADMIT


def test_policy_refused_gang_runs_nothing() -> None:
    g = gang(api.PROVISIONED, {api.POLICY_ADMITTED: ("False", "PolicyDenied")})
    assert next_action(g, set()).do is Do.WAIT
    assert phase(g, set()) == "Denied"


def test_stages_run_in_order_up_to_the_asked_one() -> None:
    g = gang(api.WARM_POOL_HELD, ADMITTED)
    assert next_action(g, set()) == next_action(g, set())
    act = next_action(g, set())
    assert (act.do, act.what) == (Do.RUN_STAGE, api.PREFLIGHTED)
    g = gang(api.WARM_POOL_HELD, {**ADMITTED, api.PREFLIGHTED: ("True", "Done")})
    act = next_action(g, set())
    assert (act.do, act.what) == (Do.RUN_STAGE, api.WARM_POOL_HELD)
    g = gang(api.WARM_POOL_HELD, {**ADMITTED, api.PREFLIGHTED: ("True", "Done"), api.WARM_POOL_HELD: ("True", "Done")})
    assert next_action(g, set()).do is Do.WAIT  # Provisioned not asked yet


def test_running_stage_is_not_started_twice() -> None:
    g = gang(api.PREFLIGHTED, ADMITTED)
    assert next_action(g, {api.PREFLIGHTED}).do is Do.WAIT
    assert phase(g, {api.PREFLIGHTED}) == "Preflighting"


def test_interrupted_stage_runs_again() -> None:
    """A controller killed mid-stage left no condition and no work: the stage runs again (ledgers converge)."""
    g = gang(api.PROVISIONED, {**ADMITTED, api.PREFLIGHTED: ("True", "Done"), api.WARM_POOL_HELD: ("True", "Done")})
    act = next_action(g, set())
    assert (act.do, act.what) == (Do.RUN_STAGE, api.PROVISIONED)


def test_failed_stage_is_not_retried_and_nothing_after_it_runs() -> None:
    g = gang(api.PROVISIONED, {**ADMITTED, api.PREFLIGHTED: ("False", FAILED)},
             jobs={"train": {"job": {}}})
    act = next_action(g, set())
    assert (act.do, act.what) == (Do.WAIT, api.PREFLIGHTED)
    assert phase(g, set()) == "Failed"


def test_jobs_run_only_on_a_provisioned_gang() -> None:
    done = {**ADMITTED, api.PREFLIGHTED: ("True", "Done"), api.WARM_POOL_HELD: ("True", "Done")}
    g = gang(api.PROVISIONED, done, jobs={"train": {"job": {}}})
    assert next_action(g, set()).what == api.PROVISIONED
    g = gang(api.PROVISIONED, {**done, api.PROVISIONED: ("True", "Done")}, jobs={"train": {"job": {}}})
    act = next_action(g, set())
    assert (act.do, act.what) == (Do.RUN_JOB, "train")
    assert next_action(g, {"job:train"}).do is Do.WAIT
    g["status"]["jobs"] = {"train": {"state": api.JOB_SUCCEEDED}}
    assert next_action(g, set()).do is Do.WAIT
    assert phase(g, set()) == "Ready"


def test_job_marked_running_without_work_is_resumed() -> None:
    """After a controller restart: status says Running but no work runs, so the train work re-attaches."""
    g = gang(api.PROVISIONED, {**ADMITTED, **{s: ("True", "Done") for s in api.STAGES}}, jobs={"t": {"job": {}}})
    g["status"]["jobs"] = {"t": {"state": api.JOB_RUNNING}}
    assert next_action(g, set()) .do is Do.RUN_JOB


def test_release_cancels_running_work_first() -> None:
    g = gang(api.PROVISIONED, ADMITTED, release=True)
    assert next_action(g, {api.PROVISIONED}).do is Do.CANCEL
    assert next_action(g, set()).do is Do.RELEASE
    assert phase(g, set()) == "Releasing"


def test_a_gang_never_admitted_is_released_without_any_work() -> None:
    """Nothing was provisioned, so nothing is called (no teardown unit, no cloud call)."""
    g = gang(api.PROVISIONED, {api.POLICY_ADMITTED: ("False", "PolicyDenied")}, release=True)
    assert next_action(g, set()).do is Do.RELEASED
    g = gang(api.PROVISIONED)
    g["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    assert next_action(g, set()).do is Do.RELEASED


def test_deleting_an_admitted_gang_releases_it() -> None:
    g = gang(api.PROVISIONED, ADMITTED)
    g["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    assert next_action(g, set()).do is Do.RELEASE


def test_owner_gone_releases() -> None:
    g = gang(api.PROVISIONED, {**ADMITTED, **{s: ("True", "Done") for s in api.STAGES}})
    act = next_action(g, {"job:t"}, owner_gone="local:h:12")
    assert act.do is Do.CANCEL and "owner is gone" in act.reason
    assert next_action(g, set(), owner_gone="local:h:12").do is Do.RELEASE


def test_released_gang_is_left_alone() -> None:
    g = gang(api.PROVISIONED, {api.RELEASED: ("True", "Released")}, release=True)
    assert next_action(g, set()).do is Do.WAIT
    assert phase(g, set()) == "Released"


def test_gang_name_is_stable_dns_and_distinct() -> None:
    a, b = api.gang_name("run-ABC_1"), api.gang_name("run-abc-1")
    assert a != b and a == api.gang_name("run-ABC_1")
    assert len(api.gang_name("x" * 300)) <= 63 and api.gang_name("x" * 300).replace("-", "").isalnum()


def test_policy_run_deadline_releases_once_passed() -> None:
    g = gang(api.PROVISIONED, {**ADMITTED, **{s: ("True", "Done") for s in api.STAGES}})
    g["status"]["runDeadline"] = 1000.0
    assert next_action(g, set(), now=999.0).do is Do.WAIT
    act = next_action(g, {"job:t"}, now=1000.0)
    assert act.do is Do.CANCEL and "maxRunSeconds" in act.reason
    assert next_action(g, set(), now=1001.0).do is Do.RELEASE
