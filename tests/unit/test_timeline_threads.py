"""A step saves its timeline (``to_json``) while its node watch thread records new nodes into it: the save must
not fail with "dictionary changed size during iteration" (seen in the bench's control-plane stage at 512 nodes)."""

from __future__ import annotations

import json
import threading

from kfp_gpu.timeline import NodeState, Timeline


def test_to_json_while_a_watch_thread_adds_nodes_and_events() -> None:
    tl = Timeline("run-1")
    stop = threading.Event()

    def watch() -> None:  # what GangTracker.on_event does per Node event, until the saves are done (<= 10,000)
        for i in range(10000):
            if stop.is_set():
                return
            n = tl.node(f"node-{i}", pool="p", zone="z", gpus=8)
            n.advance(NodeState.REGISTERED, float(i))
            tl.event("seen", float(i), node=n.name)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        sizes = [len(json.loads(tl.to_json())["nodes"]) for _ in range(20)]
    finally:
        stop.set()
        t.join()
    assert sizes[-1] > sizes[0]  # the thread was adding nodes while the saves ran
    assert len(json.loads(tl.to_json())["nodes"]) == len(tl.nodes)
