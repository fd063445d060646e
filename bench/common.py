"""Shared pieces of the benchmarks: cluster handle, request counting, node watches, statistics, results."""

from __future__ import annotations

import copy
import re
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch

from kfp_gpu.plan import readiness
from kfp_gpu_rehearsal.devcluster.nodes import BOOT_DELAY_ANNOTATION, POOL_LABEL

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = Path(__file__).with_name("scenarios")
RESULTS = Path(__file__).with_name("results")
BOOT_SAMPLE_ANNOTATION = "kfp-gpu.io/boot-sample"  # set by bench's injector (cluster-autoscaler nodes)
GPU = "nvidia.com/gpu"


def uid(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:6]}"


def kubeconfig() -> Path:
    from kfp_gpu_rehearsal.devcluster import boot

    return boot.kubeconfig_path()


def new_api() -> client.ApiClient:
    """A fresh ApiClient for the dev cluster (one per measured side, so request counts stay separate)."""
    from kfp_gpu_rehearsal.devcluster import crds

    return crds.api_client(kubeconfig())


class RequestCounter:
    """Counts HTTP requests an ``ApiClient`` sends (a watch counts once: one request per (re)connect)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.count = 0
        self.by_verb: dict[str, int] = {}
        self._lock = threading.Lock()
        inner = api.request

        def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.count += 1
                verb = method + (" watch" if "watch=true" in url or (kwargs.get("query_params") and any(
                    k == "watch" for k, _ in kwargs["query_params"])) else "")
                self.by_verb[verb] = self.by_verb.get(verb, 0) + 1
            return inner(method, url, *args, **kwargs)

        api.request = counted  # type: ignore[method-assign]

    def reset(self) -> None:
        with self._lock:
            self.count = 0
            self.by_verb = {}


def scenario_dict(name: str, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())
    data = copy.deepcopy(data)
    data.update(changes)
    return data


_DUR = re.compile(r"^([0-9.]+)(ms|s|m)$")


def parse_go_duration(text: str) -> float:
    """'1.234s' / '850ms' / '2m' -> seconds (the forms the stand-in and bench write)."""
    m = _DUR.match(text.strip())
    if not m:
        raise ValueError(f"unsupported duration {text!r}")
    v = float(m.group(1))
    return v / 1000.0 if m.group(2) == "ms" else v * 60.0 if m.group(2) == "m" else v


def sampled_boot_s(node: client.V1Node) -> float | None:
    """The boot latency sampled for ``node`` (stand-in: boot-delay; injector: boot-sample)."""
    ann = node.metadata.annotations or {}
    if BOOT_SAMPLE_ANNOTATION in ann:
        return float(ann[BOOT_SAMPLE_ANNOTATION])
    if BOOT_DELAY_ANNOTATION in ann:
        try:
            return parse_go_duration(ann[BOOT_DELAY_ANNOTATION])
        except ValueError:
            return None
    return 0.0


def is_ready(node: client.V1Node) -> bool:
    """kfp-gpu's one readiness predicate (kfp_gpu.plan.readiness): Ready, and no startup taint left."""
    return readiness.is_ready(node.to_dict())


class ReadyWatch:
    """Watches Nodes matching ``selector``; records first-seen and Ready times (one list + one watch)."""

    def __init__(self, api: client.ApiClient, selector: str) -> None:
        self.core = client.CoreV1Api(api)
        self.selector = selector
        self.seen: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._w = watch.Watch()
        self._t = threading.Thread(target=self._run, daemon=True, name=f"readywatch-{selector}")
        self.on_added: Callable[[client.V1Node, float], None] | None = None

    def start(self) -> ReadyWatch:
        lst = self.core.list_node(label_selector=self.selector)
        now = time.time()
        for n in lst.items:
            self._observe(n, now, "ADDED")
        self._rv = lst.metadata.resource_version
        self._t.start()
        return self

    def _observe(self, n: client.V1Node, now: float, kind: str) -> None:
        name = n.metadata.name
        with self.cond:
            if kind == "DELETED":
                self.seen.pop(name, None)
                self.ready.pop(name, None)
            else:
                new = name not in self.seen
                self.seen.setdefault(name, now)
                if is_ready(n):
                    self.ready.setdefault(name, now)
                if new and self.on_added is not None:
                    self.on_added(n, now)
            self.cond.notify_all()

    def _run(self) -> None:
        rv = self._rv
        while not self._stop.is_set():
            try:
                for ev in self._w.stream(self.core.list_node, label_selector=self.selector, resource_version=rv,
                                         timeout_seconds=300, allow_watch_bookmarks=True):
                    obj = ev["object"]
                    rv = obj.metadata.resource_version
                    if ev["type"] != "BOOKMARK":
                        self._observe(obj, time.time(), ev["type"])
                    if self._stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - reconnect (counts as another request)
                if self._stop.is_set():
                    return
                time.sleep(0.1)

    def wait_ready(self, n: int, timeout_s: float) -> bool:
        end = time.time() + timeout_s
        with self.cond:
            while len(self.ready) < n:
                left = end - time.time()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.5))
        return True

    def stop(self) -> None:
        self._stop.set()
        self._w.stop()


class Phases:
    """A wall clock split into named phases (a side-run's ``wall_phases_s``: where the harness's time goes); a
    phase named twice adds up."""

    def __init__(self) -> None:
        self.last = time.time()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.time()
        self.laps[name] = round(self.laps.get(name, 0.0) + now - self.last, 2)
        self.last = now


def delete_nodes(api: client.ApiClient, selector: str, timeout_s: float = 60.0) -> int:
    """Delete every Node matching ``selector`` in one ``deletecollection`` call (not one DELETE per node: 512 of
    them cost the harness seconds of round trips) and wait up to ``timeout_s`` for them to be gone. Returns how
    many there were. Raises: ValueError on an empty selector (it would match every node of the shared cluster);
    ApiException."""
    if not selector.strip():
        raise ValueError("delete_nodes: an empty label selector would delete every node of the shared cluster")
    core = client.CoreV1Api(api)
    names = [n.metadata.name for n in core.list_node(label_selector=selector).items]
    if names:
        core.delete_collection_node(label_selector=selector, grace_period_seconds=0)
    end = time.time() + timeout_s
    while time.time() < end and core.list_node(label_selector=selector).items:
        time.sleep(0.2)
    return len(names)


def pool_selector(pool: str) -> str:
    return f"{POOL_LABEL}={pool}"


# ---- statistics & results ----------------------------------------------------------------------

def stats(xs: Sequence[float]) -> dict[str, float]:
    if not xs:
        return {}
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4),
            "n": len(xs)}


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 4)


@dataclass
class Result:
    """One scenario's numbers. ``sides`` maps a side name ("ours", a baseline, "limit") to its samples."""

    name: str
    title: str
    unit: str = "s"
    baselines: tuple[str, ...] = ()
    sides: dict[str, list[float]] = field(default_factory=dict)
    target: str = ""
    notes: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # side -> why it has no numbers (never silent)
    extra: dict[str, Any] = field(default_factory=dict)
    met: bool | None = None

    def add(self, side: str, value: float) -> None:
        self.sides.setdefault(side, []).append(float(value))

    def median(self, side: str) -> float | None:
        xs = self.sides.get(side)
        return round(statistics.median(xs), 4) if xs else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"title": self.title, "unit": self.unit}
        names = ["ours", *self.baselines, *[s for s in self.sides if s not in ("ours", *self.baselines)]]
        for side in names:
            out[side] = self.median(side) if side in self.sides else None
        if "limit" not in out:
            out["limit"] = None
        for b in (*self.baselines, *(["limit"] if "limit" in self.sides else [])):
            out[f"ratio_vs_{b}"] = ratio(self.median("ours"), self.median(b))
            per = [ratio(o, x) for o, x in zip(self.sides.get("ours", []), self.sides.get(b, []), strict=False)]
            if len(per) > 1:
                out[f"ratio_vs_{b}_per_repeat"] = per
        out["stats"] = {s: stats(v) for s, v in self.sides.items()}
        out["samples"] = {s: [round(x, 4) for x in v] for s, v in self.sides.items()}
        if self.target:
            out["target"] = self.target
            out["target_met"] = self.met
        if self.errors:
            out["errors"] = self.errors
        if self.notes:
            out["notes"] = self.notes
        out.update(self.extra)
        return out


def flatten(xs: Iterable[Iterable[float]]) -> list[float]:
    return [x for row in xs for x in row]


def pin_to(node: str) -> dict[str, Any]:
    """Node affinity to exactly ``node`` (a ``metadata.name`` field match: CA-made nodes carry no hostname label)."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
