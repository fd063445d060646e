"""The one list -> watch -> relist loop (kfp_gpu.cluster.listwatch) against the real API server: the paths the
step tests rarely hit (410 Gone relist, a refused watch)."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from kfp_gpu.cluster.gang import GangTracker
from kfp_gpu.cluster.listwatch import ERROR, SYNC, Event
from kfp_gpu.cluster.nodes import GKE_POOL_LABEL, NodeWatch, list_nodes
from kfp_gpu.cluster.watch import GangWatch
from kfp_gpu.errors import PermissionDenied
from kfp_gpu.timeline import Timeline
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def _recorder() -> tuple[list[tuple[str, str, float]], threading.Lock, object]:
    seen: list[tuple[str, str, float]] = []
    lock = threading.Lock()

    def on_event(kind: str, node: dict, at: float) -> None:
        with lock:
            seen.append((kind, str((node.get("metadata") or {}).get("name", "")), at))

    return seen, lock, on_event


def test_node_watch_follows_from_the_callers_list_and_relists_on_410(kube, kwok_nodes):
    pool, names = kwok_nodes(1, gpus=8)
    selector = f"{GKE_POOL_LABEL}={pool}"
    nodes, rv = list_nodes(kube.api, selector)
    assert [n["metadata"]["name"] for n in nodes] == names
    seen, lock, on_event = _recorder()
    w = NodeWatch(kube.api, selector, rv, on_event).start()
    try:
        before = time.time()
        kube.core.patch_node(names[0], {"metadata": {"labels": {"kfp-gpu.io/touched": "1"}}})
        wait_until("a MODIFIED event for the node", lambda: ("MODIFIED", names[0]) in [s[:2] for s in seen])
        with lock:
            assert not any(k == SYNC for k, _, _ in seen), "started from the caller's resourceVersion: no list"
            at = next(at for k, n, at in seen if (k, n) == ("MODIFIED", names[0]))
        assert before <= at <= time.time(), "events carry their receive time"
    finally:
        w.stop()
    # a resourceVersion far too old for the watch cache: the server answers 410 Gone, the loop lists again
    seen2, _, on_event2 = _recorder()
    w2 = NodeWatch(kube.api, selector, "1", on_event2).start()
    try:
        wait_until("the node replayed as SYNC after 410 Gone", lambda: (SYNC, names[0]) in [s[:2] for s in seen2])
        assert w2.error is None
    finally:
        w2.stop()


def test_a_refused_watch_is_reported_not_retried(kube, namespace, rbac_identity):
    crippled = rbac_identity(drop=(("", "nodes", "watch"),))
    # scale-up's watch: one ERROR event to the tracker, kept on the watch
    nodes, rv = list_nodes(crippled.api, "")
    tracker = GangTracker("run-x", {"no-such-pool"}, Timeline("run-x"), 8, False)
    w = NodeWatch(crippled.api, "", rv, tracker.on_event).start()
    try:
        wait_until("the refusal reaches the tracker", lambda: tracker.watch_error is not None, timeout=20)
        assert getattr(w.error, "status", None) == 403 and tracker.watch_error is w.error
    finally:
        w.stop()
    # the train step's watches: the queue carries an ERROR event and GangWatch.apply raises PermissionDenied
    gw = GangWatch(crippled.api, namespace, "job-x", "kubeflow.org", "v1", "pytorchjobs", "app=none")
    try:
        with pytest.raises(PermissionDenied) as info:
            gw.start(timeout_s=20)
            deadline = time.time() + 20
            while time.time() < deadline:  # the refusal may come right after the list that set `synced`
                gw.wait(1.0)
        assert "watch" in str(info.value) and "nodes" in str(info.value)
    finally:
        gw.stop()


def test_scale_up_fails_at_once_on_a_refused_node_watch(kube, namespace, rbac_identity):
    """The wait for the gang does not sit until its deadline when the Node watch was refused."""
    from kfp_gpu.provisioners.gang_wait import wait_gang

    crippled = rbac_identity(drop=(("", "nodes", "watch"),))
    nodes, rv = list_nodes(crippled.api, "")
    tracker = GangTracker("run-x", {"no-such-pool"}, Timeline("run-x"), 8, False)
    w = NodeWatch(crippled.api, "", rv, tracker.on_event).start()
    t0 = time.time()
    try:
        with pytest.raises(PermissionDenied) as info:
            wait_gang(tracker, 1, ("us-central1-a",), t0 + 120, None, [])  # type: ignore[arg-type]
    finally:
        w.stop()
    assert time.time() - t0 < 30 and "watch" in str(info.value) and "nodes" in str(info.value)


def test_watcher_hands_raw_json_to_any_callback(kube, kwok_nodes):
    from kubernetes import client

    from kfp_gpu.cluster.listwatch import Watcher

    pool, names = kwok_nodes(2, gpus=8)
    q: queue.Queue[Event] = queue.Queue()
    w = Watcher("node", client.CoreV1Api(kube.api).list_node, q.put, label_selector=f"{GKE_POOL_LABEL}={pool}")
    w.start()
    try:
        assert w.synced.wait(20)
        first = [q.get(timeout=5) for _ in names]
        assert {e.type for e in first} == {SYNC} and sorted(e.obj["metadata"]["name"] for e in first) == names
        kube.core.delete_node(names[0])
        later = []  # KWOK's status updates (MODIFIED) come too
        while not any(e.type == "DELETED" for e in later):
            later.append(q.get(timeout=20))
        assert [e.obj["metadata"]["name"] for e in later if e.type == "DELETED"] == [names[0]]
        assert all(type(e.obj) is dict and e.type != ERROR for e in first + later), "raw JSON, never models"
    finally:
        w.stop()
