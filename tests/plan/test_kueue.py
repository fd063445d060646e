"""Kueue decisions: which LocalQueue a job goes to, and the ClusterQueue verdict for the gang."""

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.plan.kueue import (
    FlavorQuota,
    LocalQueueRef,
    QueueSetup,
    choose_local_queue,
    evaluate,
    flavor_match,
    provisioning_check,
)
from kfp_gpu.plan.quota import Verdict

A100 = {"cloud.google.com/gke-accelerator": "nvidia-a100-80gb"}
H100 = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
LQ = LocalQueueRef("team-a", "cq-a")


# ---- choose_local_queue -------------------------------------------------------------------------------------

def test_no_local_queue_and_none_wanted_is_not_gated():
    assert choose_local_queue("ns", "", []) is None


def test_the_only_local_queue_is_chosen():
    assert choose_local_queue("ns", "", [LQ]) == LQ


def test_the_wanted_local_queue_is_chosen_among_several():
    other = LocalQueueRef("team-b", "cq-b")
    assert choose_local_queue("ns", "team-b", [LQ, other]) == other


def test_a_missing_wanted_queue_names_field_value_and_the_queues_there():
    with pytest.raises(InvalidSpec) as e:
        choose_local_queue("ns", "nope", [LQ, LocalQueueRef("team-b", "cq-b")])
    assert e.value.field == "target.queue" and e.value.value == "nope"
    assert "no LocalQueue nope in namespace ns; have: team-a, team-b" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_wanted_queue_in_a_namespace_without_queues_is_an_error():
    with pytest.raises(InvalidSpec, match="have: none"):
        choose_local_queue("ns", "team-a", [])


def test_several_queues_without_a_choice_asks_for_target_queue():
    with pytest.raises(InvalidSpec) as e:
        choose_local_queue("ns", "", [LocalQueueRef("b", "x"), LocalQueueRef("a", "y")])
    assert "several Kueue LocalQueues: a, b" in e.value.message and "target.queue" in e.value.remediation


def test_several_queues_with_one_named_default_follow_kueue_defaulting():
    default = LocalQueueRef("default", "cq")
    assert choose_local_queue("ns", "", [LQ, default]) == default


# ---- flavor_match ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("labels", "want"), [
    (A100, "match"), (H100, "other"), ({}, "unknown"), ({"pool": "x"}, "unknown"), (None, "unknown"),
    ({"node.kubernetes.io/instance-type": "p4de.24xlarge"}, "match"),
    ({"node.kubernetes.io/instance-type": "m5.large"}, "other"),
])
def test_flavor_match_by_node_labels(labels, want):
    assert flavor_match(labels, "a100-80gb") == want


# ---- evaluate -------------------------------------------------------------------------------------------------

def _setup(*flavors, cohort="", checks=(), **kw):
    return QueueSetup(LQ, cohort=cohort, flavors=tuple(flavors), provisioning_checks=tuple(checks), **kw)


def test_fits_within_nominal_minus_reserved():
    c = evaluate(_setup(FlavorQuota("a100", 32, reserved=16, node_labels=A100)), "a100-80gb", 16)
    assert c.verdict is Verdict.FITS and c.free == 16 and c.needed == 16
    assert "nominal 32, reserved 16, borrowing limit none, lending limit none" in c.detail


def test_mismatched_flavors_are_not_counted():
    # 64 H100 GPUs free do not help an A100 run; the A100 flavor alone is too small
    cq = _setup(FlavorQuota("h100", 64, node_labels=H100), FlavorQuota("a100", 8, node_labels=A100))
    c = evaluate(cq, "a100-80gb", 16)
    assert c.verdict is Verdict.SHORT and c.free == 8
    assert "other accelerators not counted: h100 is nvidia-h100-80gb" in c.detail
    assert "at least 16" in c.remediation


def test_only_mismatched_flavors_is_short_with_the_label_to_add():
    c = evaluate(_setup(FlavorQuota("h100", 64, node_labels=H100)), "a100-80gb", 8)
    assert c.verdict is Verdict.SHORT and "no flavor for a100-80gb" in c.detail
    assert "cloud.google.com/gke-accelerator=nvidia-a100-80gb" in c.remediation


def test_a_flavor_without_accelerator_label_is_unknown_not_fits():
    c = evaluate(_setup(FlavorQuota("default-flavor", 1000, node_labels={})), "a100-80gb", 8)
    assert c.verdict is Verdict.UNKNOWN and "default-flavor" in c.detail and "unknown" in c.detail
    assert "node label cloud.google.com/gke-accelerator=nvidia-a100-80gb" in c.remediation


def test_a_missing_resource_flavor_is_unknown():
    c = evaluate(_setup(FlavorQuota("ghost", 100, node_labels=None)), "a100-80gb", 8)
    assert c.verdict is Verdict.UNKNOWN and "no such ResourceFlavor" in c.detail


def test_a_matching_fit_wins_over_unknown_flavors():
    c = evaluate(_setup(FlavorQuota("plain", 0, node_labels={}), FlavorQuota("a100", 16, node_labels=A100)),
                 "a100-80gb", 16)
    assert c.verdict is Verdict.FITS


def test_borrowing_limit_is_not_free_quota():
    f = FlavorQuota("a100", 8, reserved=0, borrowing_limit=16, node_labels=A100)
    c = evaluate(_setup(f, cohort="pool"), "a100-80gb", 16)
    assert c.verdict is Verdict.UNKNOWN and c.free == 8
    assert "fits if the cohort lends" in c.detail and "needs 8 more borrowed from cohort pool" in c.detail
    assert "borrowing limit 16" in c.detail


def test_no_borrowing_limit_in_a_cohort_may_borrow_without_bound():
    c = evaluate(_setup(FlavorQuota("a100", 0, node_labels=A100), cohort="pool"), "a100-80gb", 64)
    assert c.verdict is Verdict.UNKNOWN and "fits if the cohort lends" in c.detail


def test_beyond_the_borrowing_limit_is_short():
    # reserved 12 of nominal 8: 4 already borrowed of the limit 8, so 4 more at most
    f = FlavorQuota("a100", 8, reserved=12, borrowing_limit=8, node_labels=A100)
    assert evaluate(_setup(f, cohort="pool"), "a100-80gb", 4).verdict is Verdict.UNKNOWN
    c = evaluate(_setup(f, cohort="pool"), "a100-80gb", 8)
    assert c.verdict is Verdict.SHORT and c.free == 0


def test_without_a_cohort_nothing_is_borrowed():
    c = evaluate(_setup(FlavorQuota("a100", 8, node_labels=A100)), "a100-80gb", 16)
    assert c.verdict is Verdict.SHORT and "fits if the cohort lends" not in c.detail


def test_lending_limit_neither_adds_nor_removes_nominal_room():
    f = FlavorQuota("a100", 16, reserved=0, lending_limit=4, node_labels=A100)
    ok = evaluate(_setup(f, cohort="pool"), "a100-80gb", 16)
    assert ok.verdict is Verdict.FITS and "lending limit 4" in ok.detail
    assert evaluate(_setup(f, cohort="pool"), "a100-80gb", 17).verdict is Verdict.UNKNOWN  # cohort may lend 1


def test_full_queue_is_short_with_the_amounts():
    c = evaluate(_setup(FlavorQuota("a100", 16, reserved=16, node_labels=A100)), "a100-80gb", 8)
    assert c.verdict is Verdict.SHORT and c.free == 0 and c.needed == 8
    assert "full" in c.detail and "nominal 16, reserved 16" in c.detail
    assert "ClusterQueue cq-a" in c.remediation


def test_split_across_flavors_is_unknown():
    cq = _setup(FlavorQuota("a100-a", 8, node_labels=A100), FlavorQuota("a100-b", 8, node_labels=A100))
    c = evaluate(cq, "a100-80gb", 16)
    assert c.verdict is Verdict.UNKNOWN and "split across flavors" in c.detail


def test_queue_without_gpu_or_missing_or_inactive_is_short():
    assert evaluate(_setup(covers_gpu=False), "a100-80gb", 8).verdict is Verdict.SHORT
    gone = evaluate(QueueSetup(LQ, found=False), "a100-80gb", 8)
    assert gone.verdict is Verdict.SHORT and "does not exist" in gone.detail
    off = evaluate(_setup(FlavorQuota("a100", 16, node_labels=A100), inactive="references missing flavor"),
                   "a100-80gb", 8)
    assert off.verdict is Verdict.SHORT and "references missing flavor" in off.detail


def test_provisioning_admission_check_is_reported():
    cq = _setup(FlavorQuota("a100", 16, node_labels=A100), checks=[("dws", ("a100",))])
    c = evaluate(cq, "a100-80gb", 8)
    assert "ProvisioningRequest AdmissionCheck: dws" in c.detail
    assert provisioning_check(cq, "a100") == "dws" and provisioning_check(cq, "other") == ""
    assert "AdmissionCheck" not in evaluate(_setup(FlavorQuota("a100", 16, node_labels=A100)), "a100-80gb", 8).detail
