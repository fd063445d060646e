"""What `kfp-gpu gc` prints: one line per run with its namespaces, state and reason; a held lock says so."""

from __future__ import annotations

from kfp_gpu.steps.janitor import GcReport


def test_report_lists_every_run_with_its_reason():
    rep = GcReport(scope="all namespaces", lock="lease kfp/kfp-gpu-janitor held by this janitor (j/1/ab)")
    rep.runs = {"run-a": "released", "run-b": "live", "run-c": "live"}
    rep.reasons = {"run-a": "lease expired 900s ago; pod kf/a-impl gone", "run-b": "lease valid for 5400s more",
                   "run-c": "lease expired 40s ago but its owner pod kf/c-impl is alive"}
    rep.namespaces = {"run-a": ["team-1"], "run-b": ["team-2"], "run-c": ["team-1", "team-2"]}
    rep.orphans = ["pod/team-1/kfp-gpu-balloon-run-a-0"]
    text = str(rep).splitlines()
    assert text[0] == "kfp-gpu gc (all namespaces): 3 run(s) seen: 1 released, 2 live; 1 object(s) released"
    assert "  run run-a [team-1]: released (lease expired 900s ago; pod kf/a-impl gone)" in text
    assert "  run run-c [team-1,team-2]: live (lease expired 40s ago but its owner pod kf/c-impl is alive)" in text
    assert "  released pod/team-1/kfp-gpu-balloon-run-a-0" in text


def test_a_janitor_that_lost_the_lock_race_says_who_holds_it_and_nothing_else():
    rep = GcReport(scope="namespace kf", lock="lease kf/kfp-gpu-janitor held by j/7/cd (until 10:15:00Z); nothing done",
                   lock_held_by="j/7/cd")
    assert str(rep) == ("kfp-gpu gc (namespace kf): lease kf/kfp-gpu-janitor held by j/7/cd (until 10:15:00Z); "
                        "nothing done")
