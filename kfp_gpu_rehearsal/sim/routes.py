"""REST routes of the stand-in: Compute v1, GKE (container v1), Cloud Quotas v1 and /sim/v1.

Each route is ``(method, path regex, name, handler)``; a handler gets the state, the regex match,
the query dict and the JSON body and returns ``(http status, JSON body)`` or raises SimHttpError.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu_rehearsal.sim import reservations as rsv
from kfp_gpu_rehearsal.sim import shapes, vmquota
from kfp_gpu_rehearsal.sim.api import sim_time_scale
from kfp_gpu_rehearsal.sim.state import SimState

Handler = Callable[[SimState, "re.Match[str]", dict[str, str], dict[str, Any]], tuple[int, Any]]
ROUTES: list[tuple[str, re.Pattern[str], str, Handler]] = []

_C = "/compute/v1/projects/(?P<p>[^/]+)"
_G = "/v1/projects/(?P<p>[^/]+)/locations/(?P<loc>[^/]+)"
_FAMILY_QUOTA = accelerators.GCP_GPU_FAMILY_QUOTA_ID


def route(method: str, pattern: str, name: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        ROUTES.append((method, re.compile(f"^{pattern}$"), name, fn))
        return fn
    return deco


# ---- Compute ---------------------------------------------------------------------------------
@route("GET", _C, "compute.projects.get")
def project_get(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    quotas = [
        shapes.quota_row(metric, g.limit, g.usage + (st.all_regions_usage() if metric == "GPUS_ALL_REGIONS" else 0))
        for metric, g in st.scenario.global_quotas.items()
    ]
    return 200, {
        "kind": "compute#project", "id": "4242424242", "name": m["p"], "quotas": quotas,
        "selfLink": f"{shapes.COMPUTE}/projects/{m['p']}", "defaultNetworkTier": "PREMIUM",
    }


@route("GET", _C + "/regions/(?P<r>[^/]+)", "compute.regions.get")
def region_get(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    r = st.region(m["r"])
    base = f"{shapes.COMPUTE}/projects/{m['p']}"
    quotas = [shapes.quota_row(k, v.limit, v.usage + st.usage(r.name, k) + vmquota.cpu_usage(st, r.name, k))
              for k, v in r.quotas.items()]
    return 200, {
        "kind": "compute#region", "id": "1000", "name": r.name, "status": "UP",
        "description": r.name, "selfLink": f"{base}/regions/{r.name}",
        "zones": [f"{base}/zones/{z}" for z in r.zones], "quotas": quotas,
    }


@route("GET", _C + "/zones/(?P<z>[^/]+)/instanceGroupManagers/(?P<igm>[^/]+)", "compute.instanceGroupManagers.get")
def igm_get(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    return 200, st.igm_json(m["z"], m["igm"])


@route("GET", _C + "/aggregated/instanceGroupManagers", "compute.instanceGroupManagers.aggregatedList")
def igm_aggregated(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    """instanceGroupManagers.aggregatedList: ``items`` keyed ``zones/{z}``, paged by ``maxResults`` (default and
    maximum 500) and ``pageToken``."""
    st.check_project(m["p"])
    groups = st.igm_names()
    size = max(1, min(500, int(q.get("maxResults") or 500)))
    start = int(q.get("pageToken") or 0)
    items: dict[str, Any] = {}
    for zone, name in groups[start:start + size]:
        items.setdefault(f"zones/{zone}", {"instanceGroupManagers": []})["instanceGroupManagers"].append(
            st.igm_json(zone, name))
    out: dict[str, Any] = {"kind": "compute#instanceGroupManagerAggregatedList",
                           "id": f"projects/{m['p']}/aggregated/instanceGroupManagers", "items": items,
                           "selfLink": f"{shapes.COMPUTE}/projects/{m['p']}/aggregated/instanceGroupManagers"}
    if start + size < len(groups):
        out["nextPageToken"] = str(start + size)
    return 200, out


@route("POST", _C + "/zones/(?P<z>[^/]+)/instanceGroupManagers/(?P<igm>[^/]+)/deleteInstances",
       "compute.instanceGroupManagers.deleteInstances")
def igm_delete_instances(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    names = [str(x) for x in b.get("instances") or []]
    if b.get("skipInstancesOnValidationError"):  # members only: already-gone instances are skipped
        with st.lock:  # an instance being created or recreated is a member too (listManagedInstances shows it)
            members = {n for p in st.pools.values() for n in p.instances}
        names = [n for n in names if n.rsplit("/", 1)[-1] in members]
    return 200, st.delete_instances(m["z"], m["igm"], names)


@route("GET", _C + "/zones/(?P<z>[^/]+)/instanceGroupManagers/(?P<igm>[^/]+)/listErrors",
       "compute.instanceGroupManagers.listErrors")
def igm_list_errors(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    """instanceGroupManagers.listErrors: ``{"items": [...], "nextPageToken"?}`` (maxResults <= 500)."""
    st.check_project(m["p"])
    st.igm_json(m["z"], m["igm"])  # 404 for an unknown group
    items = st.igm_errors(m["z"], m["igm"])
    size = int(q.get("maxResults") or 500)
    start = int(q["pageToken"]) if q.get("pageToken", "").isdigit() else 0
    out: dict[str, Any] = {"items": items[start:start + size]}
    if start + size < len(items):
        out["nextPageToken"] = str(start + size)
    return 200, out


@route("POST", _C + "/zones/(?P<z>[^/]+)/instanceGroupManagers/(?P<igm>[^/]+)/listManagedInstances",
       "compute.instanceGroupManagers.listManagedInstances")
def igm_list_managed(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    """instanceGroupManagers.listManagedInstances: ``{"managedInstances": [...], "nextPageToken"?}`` (maxResults
    <= 500), each with ``currentAction``, ``instanceStatus`` and ``lastAttempt.errors``."""
    st.check_project(m["p"])
    items = st.igm_instances(m["z"], m["igm"])
    size = int(q.get("maxResults") or 500)
    start = int(q["pageToken"]) if q.get("pageToken", "").isdigit() else 0
    out: dict[str, Any] = {"managedInstances": items[start:start + size]}
    if start + size < len(items):
        out["nextPageToken"] = str(start + size)
    return 200, out


def _reservation_key(st: SimState, m: re.Match[str], name: str) -> tuple[str, str]:
    st.check_project(m["p"])
    st.zone_region(m["z"])
    return m["z"], name


@route("POST", _C + "/zones/(?P<z>[^/]+)/reservations", "compute.reservations.insert")
def reservation_insert(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    zone, name = _reservation_key(st, m, str(b.get("name", "")))
    if not re.match(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", name):
        raise shapes.http_error(400, f"Invalid value for field 'resource.name': '{name}'.", reason="invalid")
    target = f"{shapes.COMPUTE}/projects/{m['p']}/zones/{zone}/reservations/{name}"
    sr = b.get("specificReservation") or {}
    props = sr.get("instanceProperties") or {}
    count = int(sr.get("count", 0))
    accs = props.get("guestAccelerators") or []
    gpus_per_vm = sum(int(a.get("acceleratorCount", 0)) for a in accs)
    acc_type = str(accs[0].get("acceleratorType", "")).rsplit("/", 1)[-1] if accs else ""
    metric = accelerators.get(acc_type).gcp_quota_metric if acc_type else ""
    acc_name = accelerators.get(acc_type).name if acc_type else ""
    specific = bool(b.get("specificReservationRequired", False))

    def book() -> None:  # matching running VMs with affinity ANY consume a new automatic reservation at once
        st.reservations[(zone, name)] = rsv.make(
            m["p"], zone, name, b, accelerator=acc_name, gpus_per_vm=gpus_per_vm, count=count,
            machine=str(props.get("machineType", "")).rsplit("/", 1)[-1], specific=specific)
        rsv.adopt(st.reservations, (zone, name), st.pools.values())

    with st.lock:
        if (zone, name) in st.reservations:
            raise shapes.http_error(409, f"The resource '{target}' already exists", reason="alreadyExists")
        region = st.zone_region(zone).name
        items: list[dict[str, Any]] = []
        status = 0
        family = accelerators.get(acc_type).gcp_gpu_family if acc_type else None
        before = st.usage(region, metric)
        book()  # quota grows by what the reservation adds beyond the VMs it adopts
        extra = st.usage(region, metric) - before
        rsv.forget(st.reservations, (zone, name), st.pools.values())
        err = st.quota_check(region, metric, family, extra) if metric else None
        if err is not None:
            meta = err.body["error"]["details"][0]["metadata"]
            items, status = [shapes.quota_error_item(meta["metric"], meta["region"], float(meta["limit"]))], 403
        else:
            so = st.stockout(zone, accelerators.get(acc_type).name) if acc_type else None
            if so is not None:
                items, status = [so], 503
        op = shapes.compute_operation(m["p"], zone, "insert", target, error_items=items, http_status=status)
        st.compute_ops[op["name"]] = op
        if not items:
            book()
    return 200, op


_public = rsv.public


@route("GET", _C + "/zones/(?P<z>[^/]+)/reservations/(?P<n>[^/]+)", "compute.reservations.get")
def reservation_get(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    key = _reservation_key(st, m, m["n"])
    with st.lock:
        if key not in st.reservations:
            raise shapes.compute_not_found(f"projects/{m['p']}/zones/{m['z']}/reservations/{m['n']}")
        return 200, _public(st.reservations[key])


@route("DELETE", _C + "/zones/(?P<z>[^/]+)/reservations/(?P<n>[^/]+)", "compute.reservations.delete")
def reservation_delete(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    key = _reservation_key(st, m, m["n"])
    with st.lock:
        if key not in st.reservations:
            raise shapes.compute_not_found(f"projects/{m['p']}/zones/{m['z']}/reservations/{m['n']}")
        rsv.forget(st.reservations, key, st.pools.values())
        target = f"{shapes.COMPUTE}/projects/{m['p']}/zones/{m['z']}/reservations/{m['n']}"
        op = shapes.compute_operation(m["p"], m["z"], "delete", target)
        st.compute_ops[op["name"]] = op
    return 200, op


@route("GET", _C + "/zones/(?P<z>[^/]+)/reservations", "compute.reservations.list")
def reservation_list(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    _reservation_key(st, m, "")
    with st.lock:
        items = [_public(r) for (z, _), r in sorted(st.reservations.items()) if z == m["z"]]
    return 200, {"kind": "compute#reservationList", "id": f"projects/{m['p']}/zones/{m['z']}/reservations",
                 "items": items, "selfLink": f"{shapes.COMPUTE}/projects/{m['p']}/zones/{m['z']}/reservations"}


@route("GET", _C + "/aggregated/reservations", "compute.reservations.aggregatedList")
def reservation_aggregated(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    items: dict[str, Any] = {}
    with st.lock:
        for (zone, _), r in sorted(st.reservations.items()):
            items.setdefault(f"zones/{zone}", {"reservations": []})["reservations"].append(_public(r))
    return 200, {"kind": "compute#reservationAggregatedList", "id": f"projects/{m['p']}/aggregated/reservations",
                 "items": items}


@route("GET", _C + "/(?P<kind>zones|regions)/(?P<z>[^/]+)/operations/(?P<op>[^/]+)", "compute.operations.get")
def compute_op_get(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    with st.lock:
        op = st.compute_ops.get(m["op"])
    if op is None:
        raise shapes.compute_not_found(f"projects/{m['p']}/{m['kind']}/{m['z']}/operations/{m['op']}")
    return 200, op


@route("POST", _C + "/(?P<kind>zones|regions)/(?P<z>[^/]+)/operations/(?P<op>[^/]+)/wait", "compute.operations.wait")
def compute_op_wait(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    """Like get, but returns when the op is DONE or after 2 (compressed) minutes, as Compute does."""
    deadline = time.monotonic() + 120.0 / sim_time_scale()
    status, op = compute_op_get(st, m, q, b)
    while op.get("status") != "DONE" and time.monotonic() < deadline:
        time.sleep(0.02)
        status, op = compute_op_get(st, m, q, b)
    return status, op


# ---- GKE -------------------------------------------------------------------------------------
@route("GET", _G + "/clusters/(?P<c>[^/]+)/nodePools", "container.nodePools.list")
def node_pools_list(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    pools = st.pools_in(m["loc"], m["c"])
    return 200, {"nodePools": [st.node_pool_json(p, m["loc"], m["c"]) for p in pools]}


@route("GET", _G + "/clusters/(?P<c>[^/]+)/nodePools/(?P<np>[^/:]+)", "container.nodePools.get")
def node_pool_get(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    return 200, st.node_pool_json(st.pool(m["loc"], m["c"], m["np"]), m["loc"], m["c"])


@route("POST", _G + "/clusters/(?P<c>[^/]+)/nodePools/(?P<np>[^/:]+):setSize", "container.nodePools.setSize")
def node_pool_set_size(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    count = b.get("nodeCount", 0)
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if not isinstance(count, int):
        raise shapes.http_error(400, f"Invalid value for field 'nodeCount': {count!r}.")
    return 200, st.set_size(m["loc"], m["c"], m["np"], count)


@route("GET", _G + "/operations/(?P<op>[^/]+)", "container.operations.get")
def gke_op_get(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    with st.lock:
        op = st.gke_ops.get(m["op"])
        if op is None:
            raise shapes.container_not_found(f"projects/{m['p']}/locations/{m['loc']}/operations/{m['op']}")
        return 200, dict(op)


# ---- Cloud Quotas ----------------------------------------------------------------------------
def _family_quota_info(st: SimState, project: str) -> dict[str, Any]:
    infos = [
        {"dimensions": {"region": r.name, "gpu_family": fam}, "details": {"value": str(int(limit))},
         "applicableLocations": [r.name]}
        for r in st.scenario.regions.values() for fam, limit in r.gpu_families.items()
    ]
    return {
        "name": f"projects/{project}/locations/global/services/compute.googleapis.com/quotaInfos/{_FAMILY_QUOTA}",
        "quotaId": _FAMILY_QUOTA, "metric": "compute.googleapis.com/gpus_per_gpu_family",
        "service": "compute.googleapis.com", "isPrecise": True, "containerType": "PROJECT",
        "dimensions": ["region", "gpu_family"], "metricDisplayName": "GPUs per GPU family",
        "quotaDisplayName": "GPUs per GPU family per project per region", "metricUnit": "1",
        "quotaIncreaseEligibility": {"isEligible": True}, "dimensionsInfos": infos,
    }


@route("GET", _G + "/services/(?P<svc>[^/]+)/quotaInfos", "cloudquotas.quotaInfos.list")
def quota_infos_list(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    infos = [_family_quota_info(st, m["p"])] if m["svc"] == "compute.googleapis.com" else []
    return 200, {"quotaInfos": infos}


@route("GET", _G + "/services/(?P<svc>[^/]+)/quotaInfos/(?P<qid>[^/]+)", "cloudquotas.quotaInfos.get")
def quota_info_get(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    if m["svc"] != "compute.googleapis.com" or m["qid"] != _FAMILY_QUOTA:
        raise shapes.http_error(404, f"QuotaInfo {m['qid']} of service {m['svc']} not found.")
    return 200, _family_quota_info(st, m["p"])


# ---- /sim/v1 control plane -------------------------------------------------------------------
@route("POST", "/sim/v1/preempt", "sim.preempt")
def sim_preempt(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    if b.get("node"):
        return 200, st.preempt(str(b["node"]))
    if b.get("pool") in st.pools:
        return 200, {"nodes": st.preempt_pool(str(b["pool"]), int(b.get("count", 1)))}
    raise shapes.http_error(400, "body must name a 'node' or a known 'pool' (+ 'count')")


@route("GET", "/sim/v1/requests", "sim.requests")
def sim_requests(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    with st.lock:
        return 200, {"total": sum(st.requests.values()), "byPath": dict(st.requests), "byRoute": dict(st.routes)}


@route("GET", "/sim/v1/state", "sim.state")
def sim_state(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    with st.lock:
        return 200, {
            "elapsedS": st.elapsed(),
            "pools": {n: {"target": p.target, "nodes": list(p.nodes), "runningOp": p.running_op}
                      for n, p in st.pools.items()},
            "reservations": [f"{z}/{n}" for z, n in st.reservations],
            "quotaPreferences": list(st.quota_prefs), "preempted": list(st.preempted),
        }


from kfp_gpu_rehearsal.sim import quota_prefs as _quota_prefs  # noqa: E402,F401 - registers its routes
