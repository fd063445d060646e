"""Cloud Quotas QuotaPreference routes of the stand-in: create, get, patch, list.

Served as Cloud Quotas v1 documents them (sources in docs/sim.md, "Cloud Quotas preferences").
"""

from __future__ import annotations

import re
from typing import Any

from kfp_gpu import accelerators
from kfp_gpu_rehearsal.sim import shapes
from kfp_gpu_rehearsal.sim.routes import _FAMILY_QUOTA, _G, route
from kfp_gpu_rehearsal.sim.state import SimState

# QuotaPreference rules (docs/sim.md "Cloud Quotas preferences"): one per (service, quotaId, dimensions);
# contactEmail (input only) required on an increase; patch honours etag, updateMask, allowMissing, validateOnly.
_PREF_MASK = {"quotaConfig.preferredValue", "quotaConfig", "justification", "contactEmail", "dimensions",
              "service", "quotaId"}


def _camel(path: str) -> str:
    return ".".join(re.sub(r"_([a-z])", lambda x: x[1].upper(), part) for part in path.split("."))


def _current_value(st: SimState, quota_id: str, dims: dict[str, str]) -> float | None:
    """The quota's value today, to tell an increase from a decrease (None: unknown, treated as increase)."""
    region = st.scenario.regions.get(dims.get("region", ""))
    if quota_id == "GPUS-ALL-REGIONS-per-project":
        g = st.scenario.global_quotas.get(accelerators.GCP_ALL_REGIONS_METRIC)
        return g.limit if g else None
    if quota_id == _FAMILY_QUOTA:
        return region.gpu_families.get(dims.get("gpu_family", ""), 0.0) if region else None
    if quota_id.endswith("-per-project-region") and region:
        q = region.quotas.get(quota_id.removesuffix("-per-project-region").replace("-", "_"))
        return q.limit if q else None
    return None


def _pref_out(pref: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in pref.items() if k != "contactEmail"}  # contactEmail is input only


def _pref_validate(st: SimState, pref: dict[str, Any], body: dict[str, Any]) -> None:
    cfg = pref.get("quotaConfig") or {}
    if not pref.get("quotaId") or not pref.get("service") or "preferredValue" not in cfg:
        raise shapes.http_error(400, "quotaId, service and quotaConfig.preferredValue are required.")
    current = _current_value(st, str(pref["quotaId"]), dict(pref.get("dimensions") or {}))
    if (current is None or float(cfg["preferredValue"]) > current) and not body.get("contactEmail"):
        raise shapes.http_error(400, "contact_email is required when requesting a quota increase: set "
                                "QuotaPreference.contact_email.", reason="badRequest")


def _pref_store(st: SimState, name: str, pref: dict[str, Any], created: str) -> dict[str, Any]:
    cfg = pref.get("quotaConfig") or {}
    out = {**pref, "name": name, "createTime": created, "updateTime": shapes.now_rfc3339(), "etag": shapes.next_id(),
           "reconciling": True, "quotaConfig": {**cfg, "grantedValue": cfg.get("grantedValue", "0"),
                                                "requestOrigin": "ORIGIN_UNSPECIFIED"}}
    st.quota_prefs[name] = out
    return out


def _pref_twin(st: SimState, name: str, pref: dict[str, Any]) -> str:
    """Another preference for the same quota and dimensions ("" when none)."""
    key = (pref.get("service"), pref.get("quotaId"), dict(pref.get("dimensions") or {}))
    return next((n for n, o in st.quota_prefs.items()
                 if n != name and (o.get("service"), o.get("quotaId"), dict(o.get("dimensions") or {})) == key), "")


@route("POST", _G + "/quotaPreferences", "cloudquotas.quotaPreferences.create")
def quota_pref_create(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    pid = q.get("quotaPreferenceId") or f"pref-{shapes.next_id()}"
    name = f"projects/{m['p']}/locations/{m['loc']}/quotaPreferences/{pid}"
    _pref_validate(st, b, b)
    with st.lock:
        if name in st.quota_prefs:
            raise shapes.http_error(409, f"QuotaPreference {name} already exists.", reason="alreadyExists")
        twin = _pref_twin(st, name, b)
        if twin:
            raise shapes.http_error(409, f"QuotaPreference {twin} already exists for quota {b['quotaId']} and "
                                    "these dimensions; update it instead.", reason="alreadyExists")
        return 200, _pref_out(_pref_store(st, name, b, shapes.now_rfc3339()))


@route("GET", _G + "/quotaPreferences/(?P<qp>[^/]+)", "cloudquotas.quotaPreferences.get")
def quota_pref_get(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    name = f"projects/{m['p']}/locations/{m['loc']}/quotaPreferences/{m['qp']}"
    with st.lock:
        if name not in st.quota_prefs:
            raise shapes.http_error(404, f"QuotaPreference {name} not found.")
        return 200, _pref_out(st.quota_prefs[name])


@route("PATCH", _G + "/quotaPreferences/(?P<qp>[^/]+)", "cloudquotas.quotaPreferences.patch")
def quota_pref_patch(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    name = f"projects/{m['p']}/locations/{m['loc']}/quotaPreferences/{m['qp']}"
    mask = [_camel(x) for x in q.get("updateMask", "").split(",") if x]
    for path in mask:
        if path not in _PREF_MASK:
            raise shapes.http_error(400, f"Invalid update mask path: {path}.")
    with st.lock:
        old = st.quota_prefs.get(name)
        if old is None:
            if q.get("allowMissing") != "true":
                raise shapes.http_error(404, f"QuotaPreference {name} not found.")
            _pref_validate(st, b, b)  # allowMissing: created from the body, updateMask ignored
            if _pref_twin(st, name, b):
                raise shapes.http_error(409, f"A QuotaPreference for quota {b['quotaId']} and these dimensions "
                                        "already exists.", reason="alreadyExists")
            return 200, _pref_out(b if q.get("validateOnly") == "true" else _pref_store(st, name, b, shapes.now_rfc3339()))
        if b.get("etag") and b["etag"] != old["etag"]:
            err = shapes.http_error(409, f"The etag of QuotaPreference {name} does not match.", reason="aborted")
            err.body["error"]["status"] = "ABORTED"
            raise err
        new = {k: v for k, v in old.items() if k != "contactEmail"}
        for path in mask or ["quotaConfig", "justification", "contactEmail"]:
            top, _, sub = path.partition(".")
            if top in ("dimensions", "service", "quotaId") and b.get(top) != old.get(top):
                raise shapes.http_error(400, f"QuotaPreference.{top} is immutable.")
            if sub:
                new[top] = {**(new.get(top) or {}), sub: (b.get(top) or {}).get(sub)}
            elif top in b:
                new[top] = b[top]
        _pref_validate(st, new, b)
        if q.get("validateOnly") == "true":
            return 200, _pref_out(new)
        return 200, _pref_out(_pref_store(st, name, new, str(old["createTime"])))


@route("GET", _G + "/quotaPreferences", "cloudquotas.quotaPreferences.list")
def quota_pref_list(st: SimState, m: re.Match[str], q: dict[str, str], b: dict[str, Any]) -> tuple[int, Any]:
    st.check_project(m["p"])
    want: dict[str, str] = {}
    for term in (t.strip() for t in re.split(r"\s+AND\s+", q.get("filter", "")) if t.strip()):
        key, eq, val = term.partition("=")
        if not eq or key.strip() != "reconciling" or val.strip() not in ("true", "false"):
            raise shapes.http_error(400, f"Invalid filter: {q['filter']}.")
        want["reconciling"] = val.strip()
    prefix = f"projects/{m['p']}/locations/{m['loc']}/quotaPreferences/"
    with st.lock:
        rows = [_pref_out(p) for n, p in st.quota_prefs.items() if n.startswith(prefix)
                and ("reconciling" not in want or str(bool(p.get("reconciling"))).lower() == want["reconciling"])]
    size = int(q.get("pageSize") or 50)
    start = int(q.get("pageToken") or 0)
    body: dict[str, Any] = {"quotaPreferences": rows[start:start + size]}
    if start + size < len(rows):
        body["nextPageToken"] = str(start + size)
    return 200, body
