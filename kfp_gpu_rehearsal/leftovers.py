"""What a rehearsal run left behind, and the guaranteed teardown when its exit handler never ran.

Contract: :func:`leftovers` lists every object a run still owns (by the run-id label: its GpuGang, ledgers - also
those a controller keeps in its own namespace -, balloons, claimed Nodes, jobs, Leases, ProvisioningRequests,
PodTemplates, Karpenter NodePools) and polls until none is left or its timeout; empty means clean.
:func:`release_leftover_gangs` deletes the run's GpuGang so the controller's finalizer releases the rest.
:func:`teardown_output` and :func:`run_of` read the teardown step's output that kfp.local wrote. Used by
:mod:`kfp_gpu_rehearsal.demo` (``kfp-gpu run``) and the integration tests' leak checks.
"""

from __future__ import annotations

import glob
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kfp_gpu.timeline import Timeline

__all__ = ["leftovers", "release_leftover_gangs", "run_of", "teardown_output"]


def teardown_output(root: str) -> dict[str, object]:
    for path in sorted(glob.glob(f"{root}/**/executor_output.json", recursive=True)):
        if "teardown" in path:
            params = json.loads(Path(path).read_text()).get("parameterValues", {})
            if "Output" in params:
                return dict(json.loads(params["Output"]))
    for path in sorted(glob.glob(f"{root}/**/teardown/**/Output", recursive=True)):
        return dict(json.loads(Path(path).read_text()))
    return {}


def leftovers(api: Any, namespace: str, run_id: str, deleted_nodes: Sequence[str] = (),
              timeout_s: float = 20.0, ledger_home: str = "") -> dict[str, list[str]]:
    """What ``run_id`` still owns: its GpuGang, ledger ConfigMaps, balloon pods, claimed Nodes, PyTorchJobs/TrainJobs, run
    Leases, ProvisioningRequests and PodTemplates in ``namespace`` (Nodes and Karpenter NodePools cluster-wide),
    plus any of ``deleted_nodes`` (the Nodes teardown deleted through the cloud or with the run's NodePool) still
    registered. Polls until nothing is left or ``timeout_s`` (deletions finish
    asynchronously). Empty means clean.

    Raises: kubernetes ApiException (refused or failed listing).
    """
    from kfp_gpu.cluster import owned
    from kfp_gpu.gang import api as gang_api
    from kfp_gpu.ownership import LABEL_RUN_ID

    gangs = owned.Kind("gpugang", f"/apis/{gang_api.API_VERSION}", gang_api.PLURAL, True, LABEL_RUN_ID)
    kinds = (owned.LEDGER, owned.BALLOON, owned.NODE, *owned.JOBS, owned.LEASE, owned.PROVREQ, owned.PODTEMPLATE,
             *owned.CLUSTER_SCOPED, gangs)
    deadline = time.monotonic() + timeout_s
    while True:
        found: dict[str, list[str]] = {}
        for kind, obj in owned.run_objects(api, namespace, run_id, kinds):
            found.setdefault(kind.name, []).append(str(owned.meta(obj).get("name")))
        for obj in _controller_ledgers(api, namespace, run_id, ledger_home):
            found.setdefault(owned.LEDGER.name, []).append(str(owned.meta(obj).get("name")))
        if deleted_nodes:
            names = {str(owned.meta(n).get("name")) for n in owned.list_objects(api, owned.NODE, None, "")}
            if gone_not := sorted(names & set(deleted_nodes)):
                found["node"] = gone_not
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.5)


def _controller_ledgers(api: Any, namespace: str, run_id: str, home: str) -> list[dict[str, Any]]:
    """The run's ledgers a controller keeps in its own namespace ``home`` (kfp_gpu/cluster/ledger.py; "" or
    ``namespace``: none apart). Raises: ApiException."""
    from kfp_gpu.cluster import ledger, owned

    if not home or home == namespace:
        return []
    selector = owned.run_selector(owned.LEDGER, run_id) + f",{ledger.TENANT_LABEL}={namespace}"
    return owned.list_objects(api, owned.LEDGER, home, selector)


def run_of(teardown_output: Mapping[str, Any]) -> str:
    tl = str(teardown_output.get("timeline") or "")
    return Timeline.from_json(tl).run_id if tl else ""


def release_leftover_gangs(api: Any, namespace: str, run_id: str, timeout_s: float = 300.0) -> str:
    """Guaranteed teardown for a rehearsal whose exit handler never ran (kfp.local stopped early): delete the run's
    GpuGang while the controller still runs, so its finalizer releases everything. Returns the gang's name ("" when
    none was left). Raises: ApiException (refused)."""
    from kubernetes import client as k8s

    from kfp_gpu.gang import api as gang_api
    from kfp_gpu.gang.client import GangClient

    if not run_id:
        return ""
    c = GangClient(api, namespace, run_id)
    if c.get() is None:
        return ""
    k8s.CustomObjectsApi(api).delete_namespaced_custom_object(gang_api.GROUP, gang_api.VERSION, namespace,
                                                              gang_api.PLURAL, c.name)
    c.wait(lambda o: False, timeout_s=timeout_s)
    return c.name
