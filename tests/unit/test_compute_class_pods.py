"""What a compute-class reconcile pass reads of a placeholder pod (raw JSON, no client models)."""

from __future__ import annotations

from kfp_gpu.provisioners.compute_class import Pod


def test_a_pending_placeholder_is_live_and_on_no_node() -> None:
    pod = Pod.of({"metadata": {"name": "p-0", "resourceVersion": "41"}, "spec": {}, "status": {"phase": "Pending"}})
    assert (pod.name, pod.node, pod.resource_version, pod.live) == ("p-0", "", "41", True)


def test_a_bound_placeholder_names_its_node() -> None:
    pod = Pod.of({"metadata": {"name": "p-1", "resourceVersion": "7"}, "spec": {"nodeName": "gke-a-0001"},
                  "status": {"phase": "Running"}})
    assert (pod.node, pod.live) == ("gke-a-0001", True)


def test_a_placeholder_being_deleted_or_finished_brings_no_node() -> None:
    deleting = Pod.of({"metadata": {"name": "p-2", "deletionTimestamp": "2026-12-07T00:00:00Z"},
                       "spec": {"nodeName": "n"}, "status": {"phase": "Running"}})
    failed = Pod.of({"metadata": {"name": "p-3"}, "spec": {}, "status": {"phase": "Failed"}})
    done = Pod.of({"metadata": {"name": "p-4"}, "spec": {}, "status": {"phase": "Succeeded"}})
    assert [deleting.live, failed.live, done.live] == [False, False, False]


def test_a_pod_with_missing_fields_reads_as_empty_not_an_error() -> None:
    pod = Pod.of({})
    assert (pod.name, pod.node, pod.resource_version, pod.live) == ("", "", "", True)
