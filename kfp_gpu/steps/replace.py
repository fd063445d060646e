"""Replacing lost gang nodes during spot recovery, and the capacity bookkeeping that goes with it.

A lost node is replaced through the run's reprovision hook (default :func:`kfp_gpu.steps.scale_up.reprovision`),
which first counts what the cloud is already bringing back: a GKE managed instance group keeps its target
size through a preemption and recreates the VM under the same name, so the replacement is usually that
recreated Node, claimed again, and no extra resize is issued. The merged capacity keeps the survivors and
adds the replacements, whatever their names.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client

from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps.capacity import Capacity, Placement

Reprovision = Callable[..., Capacity]
"""``(spec, run_id, api, provider, *, lost: int, zone_hint: str, on_demand: bool) -> Capacity``: the
replacement nodes, or the whole gang (:func:`kfp_gpu.steps.scale_up.reprovision`); merged either way."""


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
            *, zone_hint: str, on_demand: bool, attempt: int, reprovision: Reprovision | None) -> Capacity:
    """Capacity for ``lost`` nodes of ``capacity``; returns the merged gang (survivors + replacements).

    Raises: ProvisioningTimeout, CapacityUnavailable, QuotaExceeded, NotFound (no matching, e.g. on-demand,
    pool), PermissionDenied: as :func:`kfp_gpu.steps.scale_up.provision`.
    """
    if reprovision is None:
        from kfp_gpu.providers import for_target
        from kfp_gpu.steps.scale_up import reprovision as default_reprovision

        # attempt keys the provider's idempotency: each recovery is a distinct (run_id, step) mutation
        new = default_reprovision(spec, run_id, api, for_target(spec.target), lost=len(lost), zone_hint=zone_hint,
                                  on_demand=on_demand, attempt=attempt, lost_nodes=list(lost))
    else:
        new = reprovision(spec, run_id, api, None, lost=len(lost), zone_hint=zone_hint, on_demand=on_demand)
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
    return Capacity(old.run_id, tuple(Placement(pool, zone, tuple(ns)) for (pool, zone), ns in merged.items()),
                    old.gpus_per_node, old.accelerator_label, spot=old.spot and new.spot,
                    timeline_json=old.timeline_json, extra=dict(old.extra))
