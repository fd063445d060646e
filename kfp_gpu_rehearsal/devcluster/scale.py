"""Create many KWOK GPU nodes and time until all are Ready (``nodes`` sub-command)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kfp_gpu.plan.readiness import is_ready

from .client import connect
from .nodes import POOL_LABEL, make_gpu_node


@dataclass(frozen=True)
class ScaleResult:
    count: int
    create_seconds: float  # all create calls returned
    ready_seconds: float  # all nodes Ready (from the first create call)


def _is_ready(node: client.V1Node) -> bool:
    return is_ready(node.to_dict())  # the one predicate (kfp_gpu.plan.readiness): these keys read the same


def create_and_wait(count: int, pool: str = "scale", boot_delay_s: float = 0.0, threads: int = 16,
                    timeout: float = 600.0) -> ScaleResult:
    kube = connect()
    core = kube.core
    names = [f"{pool}-{i:05d}" for i in range(count)]
    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda n: core.create_node(make_gpu_node(n, pool, "nvidia-h100-80gb", "us-central1-a",
                                                             boot_delay_s=boot_delay_s)), names))
    created = time.monotonic() - t0
    selector = f"{POOL_LABEL}={pool}"
    ready: set[str] = set()
    w = watch.Watch()
    while len(ready) < count:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"only {len(ready)}/{count} nodes Ready after {timeout:.0f}s")
        lst = core.list_node(label_selector=selector)
        ready = {n.metadata.name for n in lst.items if _is_ready(n)}
        if len(ready) >= count:
            break
        try:
            for ev in w.stream(core.list_node, label_selector=selector,
                               resource_version=lst.metadata.resource_version, timeout_seconds=30):
                node = ev["object"]
                if _is_ready(node):
                    ready.add(node.metadata.name)
                if len(ready) >= count:
                    w.stop()
                    break
        except ApiException as e:
            if e.status != 410:  # resource version expired: re-list
                raise
    return ScaleResult(count=count, create_seconds=round(created, 2), ready_seconds=round(time.monotonic() - t0, 2))


def delete_pool(pool: str = "scale") -> int:
    core = connect().core
    names = [n.metadata.name for n in core.list_node(label_selector=f"{POOL_LABEL}={pool}").items]
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(core.delete_node, names))
    return len(names)
