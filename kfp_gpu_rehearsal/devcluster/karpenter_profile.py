"""The Karpenter profile of the dev cluster: the real Karpenter controller with its kwok cloud provider (built by
:mod:`kfp_gpu_rehearsal.devcluster.karpenter`), launching AWS-shaped GPU instances (:mod:`.karpenter_types`) as KWOK nodes.

``python -m kfp_gpu_rehearsal.devcluster up --autoscaler karpenter`` (``make cluster-up AUTOSCALER=karpenter``, ``kfp-gpu
dev-cluster up --autoscaler karpenter``; ``--autoscaler cluster-autoscaler,karpenter`` runs both) runs it as a
managed process of the dev cluster: pid, args and log in the state dir (``karpenter.{pid,args,log}``), its
instance-types file in ``karpenter/instance-types.json``, shown by ``status``, stopped by ``down`` (``down --only
karpenter`` stops only it), re-used by a later ``up`` while healthy with the same flags and file (else restarted).
A plain ``up`` leaves a running Karpenter alone.

What it installs (server-side apply, field manager ``kfp-gpu-devcluster``): the CRDs of the pinned module
(``karpenter.sh`` NodePool, NodeClaim, NodeOverlay; ``karpenter.kwok.sh`` KWOKNodeClass), Established, and the
KWOKNodeClass :data:`NODE_CLASS` (``nodeRegistrationDelay`` :data:`REGISTRATION_DELAY`: the Node object appears that
long after the launch, the GPU VM's boot compressed as for the cluster-autoscaler profile). It installs **no
NodePool**: Karpenter provisions only for pods some NodePool admits, so with none it never acts; kfp-gpu's karpenter
backend creates a NodePool per run (with its own taint and requirements), and tests create their own. Pods of the
other profiles (cluster-autoscaler's ``kfp-gpu.io/dedicated`` taint, Kueue's queues) are left alone as long as no
NodePool admits them.

Nodes: the kwok provider creates each Node itself (annotation ``kwok.x-k8s.io/node=fake``, providerID ``kwok://``),
so the dev cluster's KWOK (``--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake``) makes it Ready and
runs its pods; Karpenter then registers and initializes the NodeClaim (removing ``karpenter.sh/unregistered``).

Process: out of cluster, ``KUBECONFIG`` to the dev cluster, ``--disable-leader-election``, metrics and health probes
on 127.0.0.1 (:data:`PORTS`; ``KARPENTER_BIND_HOST``), ``KWOK_OFFERING_STOCKOUTS=true`` (offerings the file marks
unavailable fail at launch with an insufficient-capacity error; see :mod:`.karpenter`). No webhooks (Karpenter v1
validates its CRDs with CEL rules in the CRDs themselves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import karpenter, karpenter_types, ports, procs, runner
from .runner import Component, Ctx
from .worldtime import compress

NAME = karpenter.NAME  # component name: karpenter.{pid,args,log} in the state dir
GROUP = "karpenter.sh"
VERSION = "v1"
NODECLASS_GROUP = "karpenter.kwok.sh"
NODECLASS_VERSION = "v1alpha1"
NODE_CLASS = "default"  # the name Karpenter's getting-started gives its node class; the backend prefers it
# over any other node class in the cluster (a killed bench leaves its own behind: CI failed on two, none "default")
REGISTRATION_DELAY = f"{max(1, math.ceil(compress(240.0)))}s"  # as ca_profile.BOOT_DELAY_S
# The CRDs the profile installs (the module's charts also carry autoscaling.x-k8s.io CapacityBuffers, behind a gate
# that is off; not installed).
CRD_NAMES = ("nodepools.karpenter.sh", "nodeclaims.karpenter.sh", "nodeoverlays.karpenter.sh",
             "kwoknodeclasses.karpenter.kwok.sh")
PORTS = ports.KARPENTER


def instance_types_path(c: Ctx) -> Path:
    return c.unit_dir("karpenter") / "instance-types.json"


def node_class() -> dict[str, Any]:
    return {"apiVersion": f"{NODECLASS_GROUP}/{NODECLASS_VERSION}", "kind": "KWOKNodeClass",
            "metadata": {"name": NODE_CLASS, "labels": {"app.kubernetes.io/managed-by": "kfp-gpu-devcluster"}},
            "spec": {"nodeRegistrationDelay": REGISTRATION_DELAY}}


def crd_objects(share: Path) -> list[dict[str, Any]]:
    """The CRDs of :data:`CRD_NAMES` from the shared dir.

    Raises: procs.BootError when one is missing (names the build command).
    """
    loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    found = {}
    for f in sorted((share / "crds").glob("*.yaml")):
        crd = yaml.load(f.read_text(), Loader=loader)  # noqa: S506 - a safe loader
        found[crd["metadata"]["name"]] = crd
    missing = [n for n in CRD_NAMES if n not in found]
    if missing:
        raise procs.BootError(f"Karpenter CRDs {missing} missing under {share / 'crds'}: run "
                              "`python -m kfp_gpu_rehearsal.devcluster build --with karpenter`")
    return [found[n] for n in CRD_NAMES]


def _argv(c: Ctx) -> list[str]:
    return [str(c.bins[NAME]), f"--instance-types-file-path={instance_types_path(c)}",
            "--disable-leader-election=true", f"--metrics-port={c.ports['karpenter-metrics']}",
            f"--health-probe-port={c.ports['karpenter-health']}", "--log-level=info",
            "--kube-client-qps=100", "--kube-client-burst=200"]


def _env(c: Ctx) -> dict[str, str]:
    return {"KUBECONFIG": str(c.kubeconfig), "DISABLE_LEADER_ELECTION": "true",
            karpenter.BIND_HOST_ENV: "127.0.0.1", karpenter.STOCKOUTS_ENV: "true",
            # not read by Karpenter: puts the instance types (read once at startup) into the fingerprint
            "KFP_GPU_KARPENTER_TYPES_SHA256": _digest(instance_types_path(c))}


def _digest(p: Path) -> str:
    import hashlib

    return hashlib.sha256(p.read_bytes()).hexdigest()[:16] if p.exists() else "-"


def _healthy(c: Ctx) -> bool:
    """``/readyz`` on the health port answers 200 (its caches synced, controllers started)."""
    return procs.http_ok(f"http://127.0.0.1:{c.ports['karpenter-health']}/readyz")


COMPONENT = Component(NAME, tuple(PORTS), _argv, _healthy, timeout=120.0, env=_env, stop_timeout=20.0)


def context(c: Ctx) -> Ctx:
    """``c`` with Karpenter's binary and ports (kept out of the core components' state.json ports)."""
    return runner.extend(c, {NAME: karpenter.binary()}, PORTS)


def apply_node_class(api: Any) -> None:
    """Create or update :data:`NODE_CLASS` (its spec only; Karpenter owns the status)."""
    from kubernetes import client
    from kubernetes.client import ApiException

    co = client.CustomObjectsApi(api)
    obj = node_class()
    args = (NODECLASS_GROUP, NODECLASS_VERSION, "kwoknodeclasses")
    try:
        co.create_cluster_custom_object(*args, obj)
    except ApiException as e:
        if e.status != 409:
            raise
        co.patch_cluster_custom_object(*args, NODE_CLASS, {"spec": obj["spec"]})


def prepare(c: Ctx) -> Ctx:
    """Check the binary, apply the CRDs (wait Established) and the KWOKNodeClass, write the instance-types file.

    Raises: procs.BootError (missing binary or CRDs, CRD not Established), karpenter.KarpenterError.
    """
    from . import crds

    cx = context(c)
    runner.require_binaries(cx, (NAME,), "`make cluster-build AUTOSCALER=karpenter` "
                                         "(python -m kfp_gpu_rehearsal.devcluster build --with karpenter)")
    api = crds.api_client(c.kubeconfig)
    try:
        objs = crd_objects(karpenter.share())
        for crd in objs:
            crds.apply(api, crd)
        for crd in objs:
            crds.wait_established(api, crd["metadata"]["name"])
        apply_node_class(api)
    finally:
        api.close()
    karpenter_types.instance_types_file(instance_types_path(cx))
    return cx


UNIT = runner.Unit(NAME, (COMPONENT,), off_hint="up --autoscaler karpenter starts it", context=context,
                   prepare=prepare)  # stopping it leaves its NodePools, NodeClaims and nodes


@dataclass(frozen=True)
class Profile:
    """What the ``karpenter`` test fixture hands out."""

    kubeconfig: Path
    log: Path
    pid: int
    node_class: str = NODE_CLASS
    api_version: str = f"{GROUP}/{VERSION}"


def ensure_up() -> Profile:
    """Boot (or re-use) the dev cluster with Karpenter running: ``up --autoscaler karpenter``.

    Raises: procs.BootError, certs.CertError, karpenter.KarpenterError (the caller decides how to fail).
    """
    c, pids = runner.ensure_running(UNIT, autoscaler=NAME)
    return Profile(kubeconfig=c.kubeconfig, log=c.state / f"{NAME}.log", pid=pids[NAME])
