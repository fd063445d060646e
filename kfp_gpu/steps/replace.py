"""Replacing lost gang nodes during spot recovery, and the capacity bookkeeping that goes with it.

A lost node is replaced through the run's provisioner (:meth:`kfp_gpu.provisioners.base.Provisioner.replace`,
the backend the capacity names), or a reprovision hook (tests, custom capacity). The node-pool backend first
counts what the cloud is already bringing back: a GKE managed instance group keeps its target size through a
preemption and recreates the VM under the same name, so the replacement is usually that recreated Node,
claimed again, and no extra resize is issued. The merged capacity keeps the survivors and adds the
replacements, whatever their names.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client

from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps.capacity import Capacity, Placement

log = logging.getLogger(__name__)

Reprovision = Callable[..., Capacity]
"""``(spec, run_id, api, provider, *, lost: int, zone_hint: str, on_demand: bool) -> Capacity``: the
replacement nodes, or the whole gang; merged either way."""


class Background:
    """Run ``fn`` on a daemon thread (a cancelled step must not wait for it); ``result()`` re-raises."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._error: BaseException | None = None
        self._done = threading.Event()

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # handed to the step thread by result()
                self._error = exc
            finally:
                self._done.set()

        threading.Thread(target=run, name="kfp-gpu-reprovision", daemon=True).start()

    def result(self) -> None:
        """Wait for ``fn``; re-raise what it raised."""
        while not self._done.wait(0.2):  # short waits keep the step thread responsive to SIGTERM
            pass
        if self._error is not None:
            raise self._error


def replace(spec: ProvisioningSpec, run_id: str, api: client.ApiClient, capacity: Capacity, lost: Sequence[str],
            *, zone_hint: str, on_demand: bool, attempt: int, hook: Reprovision | None,
            lost_uids: Sequence[str] = (), deficit: int = 0) -> Capacity:
    """Capacity for ``lost`` nodes of ``capacity``; returns the merged gang (survivors + replacements).

    Raises: ProvisioningTimeout, CapacityUnavailable, QuotaExceeded, NotFound (no matching, e.g. on-demand,
    pool), PermissionDenied: as the provisioner's ``replace``. ``hook`` replaces the provisioner (tests,
    custom capacity). ``deficit`` more nodes are asked for besides ``lost``'s.
    """
    count = len(lost) + deficit
    if hook is None:
        from kfp_gpu import provisioners

        # attempt keys the idempotency: each recovery is a distinct (run_id, step) request
        backend = provisioners.select(spec, api, None, capacity)
        new = backend.replace(spec, run_id, capacity, lost, extra=count, zone_hint=zone_hint, on_demand=on_demand,
                              attempt=attempt, lost_uids=lost_uids)
    else:
        new = hook(spec, run_id, api, None, lost=count, zone_hint=zone_hint, on_demand=on_demand)
    return merge_capacity(capacity, set(lost), new)


def merge_capacity(old: Capacity, lost: set[str], new: Capacity) -> Capacity:
    """``old`` without the ``lost`` nodes, plus the nodes of ``new`` (deduplicated by name).

    A node of ``new`` may carry a lost node's name: the instance group recreated that VM, and the fresh
    Node is the replacement.
    """
    seen: set[str] = set()
    placements: list[Placement] = []
    for p in old.placements:
        nodes = tuple(n for n in p.nodes if n not in lost and n not in seen)
        seen.update(nodes)
        if nodes:
            placements.append(Placement(p.pool, p.zone, nodes))
    for p in new.placements:
        nodes = tuple(n for n in p.nodes if n not in seen)
        seen.update(nodes)
        if nodes:
            placements.append(Placement(p.pool, p.zone, nodes))
    merged: dict[tuple[str, str], list[str]] = {}
    for p in placements:
        merged.setdefault((p.pool, p.zone), []).extend(p.nodes)
    extra = {**old.extra, **{k: v for k, v in new.extra.items() if k != "protected_pools"}}  # the provisioner's
    protected = sorted(set(old.extra.get("protected_pools", [])) | set(new.extra.get("protected_pools", [])))
    if protected:
        extra["protected_pools"] = protected
    return Capacity(old.run_id, tuple(Placement(pool, zone, tuple(ns)) for (pool, zone), ns in merged.items()),
                    old.gpus_per_node, old.accelerator_label, spot=old.spot and new.spot,
                    timeline_json=old.timeline_json, extra=extra, scheme=old.scheme, accelerator=old.accelerator,
                    namespace=old.namespace)
