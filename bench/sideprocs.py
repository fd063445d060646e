"""The processes and cluster fixtures a burst side-run uses (bench/burst.py's :class:`~bench.burst.Harness`).

Contract: :class:`Child` is one side's process (``python -m bench.peers '<args>'``) spoken to by lines on
stdin/stdout (``go``, ``release`` / ``READY``, ``RUN <id>``...), its stderr drained so a chatty side never blocks;
:class:`BenchCA` is the bench's own cluster-autoscaler (the dev cluster's CA profile flags minus the
ProvisioningRequest ones) over node group :data:`CA_POOL`; :class:`Canary` proves KWOK turns a fresh pod Running
before a side's t0. Each ``close``/``stop`` leaves nothing of its own behind.
"""

from __future__ import annotations

import collections
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from bench.common import ROOT, kubeconfig, pin_to, uid
from bench.world import GPUS
from kfp_gpu_rehearsal.devcluster.nodes import (
    BOOT_DELAY_ANNOTATION,
    BOOT_INJECTION_LABEL,
    POOL_LABEL,
    READY_AT_ANNOTATION,
)

__all__ = ["CA_POOL", "BenchCA", "Canary", "Child"]

CA_POOL = "bench-ca"


class BenchCA:
    """The bench's own cluster-autoscaler (profile flags minus ProvisioningRequests), node group ``bench-ca``."""

    def __init__(self, api: client.ApiClient) -> None:
        from kfp_gpu import accelerators
        from kfp_gpu_rehearsal.devcluster import autoscaler, ca_profile
        from kfp_gpu_rehearsal.devcluster.nodes import make_gpu_node

        acc = accelerators.get("a100-80gb")
        node = make_gpu_node("template", CA_POOL, acc.gke_label, "us-central1-a", GPUS, False, 1.0,
                             {BOOT_INJECTION_LABEL: "pending", "kfp-gpu.io/bench": "ca"})
        node["metadata"]["annotations"].pop(BOOT_DELAY_ANNOTATION, None)
        node["metadata"]["annotations"].pop(READY_AT_ANNOTATION, None)
        node["metadata"]["labels"].pop("kubernetes.io/hostname", None)
        node["metadata"]["annotations"].update({"cluster-autoscaler.kwok.nodegroup/min-count": "0",
                                                "cluster-autoscaler.kwok.nodegroup/max-count": "600"})
        autoscaler.install_provider_config(client.CoreV1Api(api), [node], group_label=POOL_LABEL,
                                           gpu_label="cloud.google.com/gke-accelerator", gpu_types=[acc.gke_label])
        self.flags = bench_ca_flags(ca_profile.FLAGS)
        self.proc = autoscaler.Autoscaler(kubeconfig(), extra_args=self.flags)
        self.proc.start()

    def stop(self) -> None:
        self.proc.stop(timeout_s=30.0)


def bench_ca_flags(profile_flags: tuple[str, ...]) -> list[str]:
    """The bench CA's flags: the CA profile's (its scan interval and scale-down rate, ca_profile.py) minus its
    ProvisioningRequest and status-ConfigMap ones (two CAs serving the same requests would fight over their
    status; autoscaler.Autoscaler names the bench CA's own status ConfigMap)."""
    skip = ("--enable-provisioning-requests", "--provisioning-request", "--status-config-map-name",
            "--write-status-configmap")
    return [f for f in profile_flags if not f.startswith(skip)]


class Child:
    """A side's process (``python -m bench.peers '<args>'``; ``cmd`` replaces it in tests): stdout lines queued for
    :meth:`expect`, stderr drained into a short tail (an unread stderr pipe would block a chatty child)."""

    def __init__(self, args: dict[str, Any], cmd: list[str] | None = None) -> None:
        self.p = subprocess.Popen(cmd or [sys.executable, "-m", "bench.peers", json.dumps(args)], cwd=str(ROOT),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.run_id = ""  # ours' step run id, from the child's "RUN <id>" line (its teardown if the child dies)
        self.err: collections.deque[str] = collections.deque(maxlen=40)
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()  # an unread stderr pipe blocks the child

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith("RUN "):
                self.run_id = line[4:].strip()
                continue
            self.lines.put(line.rstrip("\n"))
        self.lines.put("EOF")

    def _drain(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self.err.append(line.rstrip("\n"))

    def expect(self, prefix: str, timeout_s: float) -> str:
        end = time.time() + timeout_s
        while time.time() < end:
            try:
                line = self.lines.get(timeout=max(0.01, end - time.time()))
            except queue.Empty:
                break
            if line.startswith(prefix) or line == "EOF" or line.startswith("FAILED"):
                return line
        return "TIMEOUT"

    def say(self, word: str) -> None:
        assert self.p.stdin is not None
        try:
            self.p.stdin.write(word + "\n")
            self.p.stdin.flush()
        except OSError:
            pass

    def stderr_tail(self) -> str:
        return " | ".join(list(self.err)[-6:])[-600:]

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


CANARY_TOLERATES = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable", "nvidia.com/gpu")


class Canary:
    """A GPU-less KWOK node of the bench's own and a pod bound to it: :meth:`ping` is True once KWOK has turned a
    fresh pod Running (on this 2-core machine KWOK's pod pipeline was seen to stall for minutes after a large gang
    was deleted: a side starting then would be charged for it)."""

    NAME = "kfp-gpu-bench-canary"

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        from kfp_gpu_rehearsal.devcluster.nodes import make_gpu_node

        self.core, self.ns = client.CoreV1Api(api), namespace
        node = make_gpu_node(self.NAME, "bench-canary", "none", "us-central1-a", 0, False, 0.0,
                             {"kfp-gpu.io/bench": "canary"})
        try:
            self.core.create_node(node)
        except client.ApiException as exc:
            if exc.status != 409:
                raise

    def ping(self, timeout_s: float) -> bool:
        end = time.time() + timeout_s
        while time.time() < end:
            name = uid("canary-")
            self.core.create_namespaced_pod(self.ns, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"kfp-gpu.io/bench": "canary"}},
                "spec": {"affinity": pin_to(self.NAME), "terminationGracePeriodSeconds": 0,
                         # keyed: the bench namespace is a kfp-gpu tenant, whose admission policy refuses a pod
                         # tolerating every taint (the canary node itself has none)
                         "tolerations": [{"key": k, "operator": "Exists"} for k in CANARY_TOLERATES],
                         "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "infinity"]}]}})
            try:
                until = min(end, time.time() + 60.0)  # a pod KWOK never picked up is replaced after a minute
                while time.time() < until:
                    if self.core.read_namespaced_pod(name, self.ns).status.phase == "Running":
                        return True
                    time.sleep(0.1)
            finally:
                self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)
        return False

    def close(self) -> None:
        try:
            self.core.delete_node(self.NAME, grace_period_seconds=0)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def ensure_node_class(api: client.ApiClient) -> bool:
    """The bench's KWOKNodeClass (:data:`bench.sides.KARPENTER_NODE_CLASS`): Karpenter's kwok provider creates the
    Node at launch (registration delay 0 s) and the Injector boots it from the world's sampler, as every other
    side's nodes. True (it exists). Raises: ApiException."""
    from bench.sides import KARPENTER_NODE_CLASS

    body = {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
            "metadata": {"name": KARPENTER_NODE_CLASS, "labels": {"kfp-gpu.io/bench": "true"}},
            "spec": {"nodeRegistrationDelay": "0s"}}
    try:
        client.CustomObjectsApi(api).create_cluster_custom_object("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses",
                                                                  body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    return True


def delete_node_class(api: client.ApiClient, log: Callable[[str], None] | None = None) -> None:
    """Delete the bench's KWOKNodeClass (gone already: nothing). Another API error is logged with ``log``, or
    raised (ApiException) without it."""
    from bench.sides import KARPENTER_NODE_CLASS

    try:
        client.CustomObjectsApi(api).delete_cluster_custom_object("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses",
                                                                  KARPENTER_NODE_CLASS)
    except client.ApiException as exc:
        if exc.status == 404:
            return
        if log is None:
            raise
        log(f"  cleanup: KWOKNodeClass {KARPENTER_NODE_CLASS}: {exc.status} {exc.reason}")
