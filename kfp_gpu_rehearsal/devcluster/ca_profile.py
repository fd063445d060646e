"""The cluster-autoscaler profile of the dev cluster: the real cluster-autoscaler (kwok cloud provider) with GPU
node groups, serving ProvisioningRequests.

``python -m kfp_gpu_rehearsal.devcluster up --autoscaler cluster-autoscaler`` (``make cluster-up AUTOSCALER=cluster-autoscaler``)
runs the binary built by :mod:`kfp_gpu_rehearsal.devcluster.autoscaler` as a managed process of the dev cluster: pid, args and
log in the cluster state dir (``cluster-autoscaler.{pid,args,log}``), shown by ``status``, stopped by ``down``,
re-used by a later ``up`` while healthy with the same flags and node groups (else restarted). On exit CA deletes
the nodes it created and its status ConfigMap.

Node groups (:data:`NODE_GROUPS`) live in the kwok provider's ConfigMaps ``kube-system/kfp-gpu-ca-provider-config``
and ``kfp-gpu-ca-provider-templates`` (names of their own: the benchmark's CA uses the provider's default names).
Every group's template carries the dedicated-pool taint :data:`TAINT`, so only pods that tolerate it can trigger
a scale-up; the other tests sharing this cluster never do. Groups are found by the label :data:`GROUP_LABEL`,
which nothing else sets. Template nodes look like GKE GPU nodes (node pool, accelerator, zone, region,
instance-type, spot labels; ``nvidia.com/gpu`` capacity; the ``nvidia.com/gpu=present:NoSchedule`` taint) and
carry ``kwok.x-k8s.io/node=fake`` (CA's kwok provider sets it too), so our KWOK makes them Ready after the
``kfp-gpu.io/boot-delay`` of :data:`BOOT_DELAY_S` (the GKE stand-in's median GPU VM boot, compressed). The
benchmark's group :data:`BENCH_GROUP` instead carries ``kfp-gpu.io/boot-injection=pending``: KWOK holds each of its
nodes NotReady until the bench's injector (bench/burst.py) annotates it with a boot drawn from the bench world's
seeded sampler, so its nodes boot as every other side's (a node of that group stays NotReady while no bench runs).
Known difference: CA copies the template as is, so CA nodes carry no ``kubernetes.io/hostname`` label (the
template leaves it out rather than give every node the same one).

Flags beyond the kwok provider basics (``--cloud-provider=kwok --leader-elect=false --address --namespace``):

- ``--enable-provisioning-requests``: serve ``autoscaling.x-k8s.io/v1`` ProvisioningRequests (off by default).
- ``--kube-api-content-type=application/json``: CA's default protobuf cannot encode the ProvisioningRequest
  (a CRD), so without it CA never writes a request's status (docs/architecture.md, verified facts).
- ``--scan-interval=1s`` (default 10 s): the test world is time-compressed; a request is answered within ~1 s.
  (One loop here is 120 real seconds of world time, 12 real loops: the per-loop budgets below are scaled by it.)
- ``--scale-down-unneeded-time=5s``, ``--scale-down-delay-after-add=5s``, ``--scale-down-delay-after-failure=5s``,
  ``--unremovable-node-recheck-timeout=5s`` (defaults 10 min, 10 min, 3 min, 5 min): nodes left after a test
  deletes its request are removed within seconds instead of 10 minutes.
- ``--provisioning-request-initial-backoff-time=1s``, ``--provisioning-request-max-backoff-time=5s`` (defaults 1 min
  and 10 min, compressed by the stand-in's TIME_SCALE=120 to 0.5 s and 5 s, floored at the 1 s scan interval): an
  atomic request answered CapacityIsNotFound is retried after this back-off, as on a real cluster.
- ``--max-scale-down-parallelism=120`` and ``--node-delete-delay-after-taint=42ms`` (defaults 10 and 5 s): empty
  nodes go at CA's real rate per world minute. CA removes at most ``--max-scale-down-parallelism`` nodes at once,
  each ``--node-delete-delay-after-taint`` after tainting it (k8s.io/autoscaler cluster-autoscaler FAQ, "Empty
  nodes ... can be terminated in bulk, up to 10 nodes at a time", and its parameter table; the vendored
  ``config/flags/flags.go`` and ``core/scaledown/actuation/actuator.go``, budget ``core/scaledown/budgets``). On a
  real cluster a loop is 10 s and removes 10 empty nodes: 60 a real minute, 512 nodes in ~8.5 real minutes (4.3 s
  of world time here). Here one loop (``--scan-interval=1s``) stands for :data:`SCAN_WORLD_S` = 120 real seconds,
  12 real loops, so it may start 12 x 10 = 120 deletions (:data:`SCALE_DOWN_PARALLELISM`); the taint delay is
  compressed like every other duration (5 s real = 42 ms). With the defaults the delay was 5 s of wall per batch
  of 10 (10 real minutes per batch): 512 empty nodes took ~280 s here (measured, bench N=512), 33 world hours
  instead of 8.5 minutes; with these flags the bench CA deleted 520 in ~30 s (measured under a load average of
  ~7: still above the real rate, bounded by CA's 5 concurrent taint calls and this 2-core apiserver). Assumption: a deletion finishes within one real loop (the kwok provider's delete is one
  Node DELETE; a real MIG deleteInstances can take longer, which would make the real rate lower, not higher).
- ``--ok-total-unready-count=100000 --max-total-unready-percentage=100`` (defaults 3 and 45 %): CA halts all
  scaling while the cluster has "too many" NotReady nodes; the other tests' KWOK nodes (booting, preempted)
  are not CA's and must not switch it off.
- ``--kube-client-qps=100 --kube-client-burst=200`` (defaults 5/10): CA's client-side throttle, lifted as for
  the other control-plane components.
- ``--write-status-configmap=true`` (the default, stated): ``kube-system/cluster-autoscaler-status`` is how the
  provisioning-request backend detects a serving autoscaler.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kfp_gpu import accelerators, rehearsal_seam

from . import autoscaler, procs, runner
from .nodes import BOOT_DELAY_ANNOTATION, BOOT_INJECTION_LABEL, GPU_TAINT, make_gpu_node
from .runner import Component, Ctx
from .worldtime import TIME_SCALE, compress

NAME = autoscaler.NAME  # component name: cluster-autoscaler.{pid,args,log} in the state dir
NAMESPACE = autoscaler.NAMESPACE
CONFIG_CM = "kfp-gpu-ca-provider-config"
TEMPLATES_CM = "kfp-gpu-ca-provider-templates"
STATUS_CM = "cluster-autoscaler-status"
PORT_ENV, DEFAULT_PORT = "KFP_GPU_CA_PORT", 18086  # the benchmark's own CA uses 18085

CLUSTER = "ca"  # value of kfp-gpu.io/sim-cluster on CA nodes
CLUSTER_LABEL = rehearsal_seam.LOCAL_CLUSTER_LABEL
TAINT = "kfp-gpu.io/dedicated=training:NoSchedule"
GROUP_LABEL = "kfp-gpu.io/ca-node-group"  # the kwok provider's fromNodeLabelKey
GPU_LABEL = "cloud.google.com/gke-accelerator"
REGION = "us-central1"
BOOT_DELAY_S = compress(240.0)  # a GPU VM boots in ~4 min (the stand-in scenario's median): 2 s here
BENCH_GROUP = "ca-a100-bench"  # the benchmark's ProvisioningRequest sides only (see NODE_GROUPS)
BENCH_ZONE = "us-central1-c"
BENCH_TAINT = "kfp-gpu.io/bench=ca:NoSchedule"  # only pods that tolerate it (the bench's) land there


def taint_dict(spec: str = TAINT) -> dict[str, str]:
    """``key=value:Effect`` as a Node/Pod taint dict. Raises: ValueError on another shape."""
    kv, sep, effect = spec.partition(":")
    key, eq, value = kv.partition("=")
    if not (sep and eq and key and effect):
        raise ValueError(f"taint {spec!r}: want key=value:Effect")
    return {"key": key, "value": value, "effect": effect}


def toleration(spec: str = TAINT) -> dict[str, str]:
    """The toleration of :data:`TAINT` (operator Equal) for a pod or PodTemplate."""
    t = taint_dict(spec)
    return {"key": t["key"], "operator": "Equal", "value": t["value"], "effect": t["effect"]}


@dataclass(frozen=True)
class NodeGroup:
    name: str  # node group = GKE node pool name; CA names its nodes <name>-<5 random chars>
    zone: str
    accelerator: str  # kfp_gpu.accelerators catalog name
    gpus: int  # per node
    max_size: int
    spot: bool = False
    taints: tuple[str, ...] = ()  # beyond GPU_TAINT and TAINT, as ``key=value:Effect``

    @property
    def machine(self) -> accelerators.MachineShape:
        return accelerators.get(self.accelerator).gce_machine_for(self.gpus)

    @property
    def gke_label(self) -> str:
        return accelerators.get(self.accelerator).gke_label


def default_gpus(accelerator: str) -> int:
    """GPUs per node of the catalog's default GCE machine for ``accelerator`` (its largest: a whole-host VM)."""
    return max(m.gpus for m in accelerators.get(accelerator).gce_machines)


NODE_GROUPS: tuple[NodeGroup, ...] = (
    NodeGroup("ca-a100-a", "us-central1-a", "a100-80gb", 8, 4),
    NodeGroup("ca-a100-b", "us-central1-b", "a100-80gb", 8, 4),
    NodeGroup("ca-a100-spot-a", "us-central1-a", "a100-80gb", 8, 4, spot=True),
    NodeGroup("ca-l4-a", "us-central1-a", "l4", default_gpus("l4"), 2),
    # the benchmark's bursts up to N=512 (bench/burst.yaml): a zone no other group uses and a taint of its own,
    # so a request that tolerates only TAINT (every test's) never scales it; the groups above keep max 4
    NodeGroup(BENCH_GROUP, BENCH_ZONE, "a100-80gb", 8, 512, taints=(BENCH_TAINT,)),
)


def template_node(g: NodeGroup) -> dict[str, Any]:
    """The kwok provider's template Node for ``g`` (every node of the group is a copy of it)."""
    m = g.machine
    labels = {
        "node.kubernetes.io/instance-type": m.name,
        "cloud.google.com/machine-family": m.name.split("-", 1)[0],
        "cloud.google.com/gke-provisioning": "spot" if g.spot else "standard",
        CLUSTER_LABEL: CLUSTER,
        GROUP_LABEL: g.name,
    }
    node = make_gpu_node(f"{g.name}-template", g.name, g.gke_label, g.zone, g.gpus, g.spot, 0.0, labels,
                         cpu=str(m.vcpus), memory=f"{m.vcpus * 8}Gi")  # as the GKE stand-in's nodes
    node["metadata"]["labels"].pop("kubernetes.io/hostname", None)  # would be shared by every copy
    node["metadata"]["annotations"].update({
        "cluster-autoscaler.kwok.nodegroup/min-count": "0",
        "cluster-autoscaler.kwok.nodegroup/max-count": str(g.max_size),
    })
    if g.name == BENCH_GROUP:  # each node boots on the bench's seeded sampler (bench/burst.py Injector)
        node["metadata"]["labels"][BOOT_INJECTION_LABEL] = "pending"
    else:
        node["metadata"]["annotations"][BOOT_DELAY_ANNOTATION] = f"{BOOT_DELAY_S:g}s"  # counted from when KWOK sees it
    node["spec"]["taints"] = [dict(GPU_TAINT), taint_dict(), *(taint_dict(t) for t in g.taints)]
    node["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                                     "message": "simulated boot"}]
    return node


def provider_config() -> str:
    return autoscaler.provider_config(group_label=GROUP_LABEL, gpu_label=GPU_LABEL,
                                      gpu_types=sorted({g.gke_label for g in NODE_GROUPS}),
                                      templates_cm=TEMPLATES_CM)


def config_digest() -> str:
    """Hash of what CA reads once at startup (provider config + templates): a change restarts CA."""
    blob = json.dumps([provider_config(), [template_node(g) for g in NODE_GROUPS]], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


SCAN_S = 1.0  # --scan-interval here (CA's default: 10 s)
SCAN_WORLD_S = SCAN_S * TIME_SCALE  # real-world seconds one loop here stands for (120)
REAL_SCAN_S, REAL_SCALE_DOWN_PARALLELISM, REAL_DELETE_DELAY_AFTER_TAINT_S = 10.0, 10, 5.0  # CA's defaults (FAQ)
# the deletions a real CA starts in the world time of one loop here: 12 real loops x 10 (docstring)
SCALE_DOWN_PARALLELISM = round(REAL_SCALE_DOWN_PARALLELISM * SCAN_WORLD_S / REAL_SCAN_S)
DELETE_DELAY_AFTER_TAINT_MS = round(compress(REAL_DELETE_DELAY_AFTER_TAINT_S) * 1000)  # 42 ms

FLAGS: tuple[str, ...] = (
    "--enable-provisioning-requests",
    "--kube-api-content-type=application/json",
    f"--scan-interval={SCAN_S:g}s",
    "--scale-down-unneeded-time=5s",
    "--scale-down-delay-after-add=5s",
    "--scale-down-delay-after-failure=5s",
    "--unremovable-node-recheck-timeout=5s",
    f"--max-scale-down-parallelism={SCALE_DOWN_PARALLELISM}",
    f"--node-delete-delay-after-taint={DELETE_DELAY_AFTER_TAINT_MS}ms",
    "--provisioning-request-initial-backoff-time=1s",
    "--provisioning-request-max-backoff-time=5s",
    "--ok-total-unready-count=100000",
    "--max-total-unready-percentage=100",
    "--kube-client-qps=100",
    "--kube-client-burst=200",
    "--write-status-configmap=true",
    f"--status-config-map-name={STATUS_CM}",
)


def port() -> int:
    return int(os.environ.get(PORT_ENV, DEFAULT_PORT))


def _argv(c: Ctx) -> list[str]:
    return autoscaler.base_argv(c.bins[NAME], c.kubeconfig, c.ports[NAME]) + list(FLAGS)


def _env(c: Ctx) -> dict[str, str]:
    env = autoscaler.base_env(c.kubeconfig, CONFIG_CM)
    env["KFP_GPU_CA_CONFIG_SHA256"] = config_digest()  # not read by CA: puts the config into the fingerprint
    return env


def _healthy(c: Ctx) -> bool:
    """``/health-check`` answers 200 and CA has written its status ConfigMap (after its first loop)."""
    if not procs.http_ok(f"http://127.0.0.1:{c.ports[NAME]}/health-check"):
        return False
    from kubernetes import client

    from . import crds

    api = crds.api_client(c.kubeconfig)
    try:
        client.CoreV1Api(api).read_namespaced_config_map(STATUS_CM, NAMESPACE)
    except Exception:  # noqa: BLE001 - a health probe: 404, or the API server not answering, is "not yet"
        return False
    finally:
        api.close()
    return True


COMPONENT = Component(NAME, (NAME,), _argv, _healthy, timeout=90.0, env=_env, stop_timeout=30.0)  # SIGTERM: CA deletes its nodes first


def context(c: Ctx) -> Ctx:
    """``c`` with CA's binary and health port (kept out of the core components' state.json ports)."""
    return replace(c, bins={**c.bins, NAME: autoscaler.binary()}, ports={**c.ports, NAME: port()})


def prepare(c: Ctx) -> Ctx:
    """Check the binary and write the provider ConfigMaps; returns :func:`context`.

    Raises: procs.BootError when the binary is missing (names the build command).
    """
    from kubernetes import client

    from . import crds

    cx = context(c)
    runner.require_binaries(cx, (NAME,), "`make cluster-build-ca` (python -m kfp_gpu_rehearsal.devcluster build --with-autoscaler)")
    core_api = client.CoreV1Api(crds.api_client(c.kubeconfig))
    autoscaler.install_provider_config(core_api, [template_node(g) for g in NODE_GROUPS], group_label=GROUP_LABEL,
                                       gpu_label=GPU_LABEL, gpu_types=sorted({g.gke_label for g in NODE_GROUPS}),
                                       config_cm=CONFIG_CM, templates_cm=TEMPLATES_CM)
    return cx


UNIT = runner.Unit(NAME, (COMPONENT,), off_hint="up --autoscaler cluster-autoscaler starts it", context=context,
                   prepare=prepare)


@dataclass(frozen=True)
class Profile:
    """What the ``autoscaler`` test fixture hands out."""

    kubeconfig: Path
    node_groups: tuple[NodeGroup, ...]
    log: Path
    pid: int


def ensure_up() -> Profile:
    """Boot (or re-use) the dev cluster with the profile running: ``up --autoscaler cluster-autoscaler``.

    Raises: procs.BootError, certs.CertError, autoscaler.AutoscalerError (the caller decides how to fail).
    """
    c, pids = runner.ensure_running(UNIT, autoscaler=NAME)
    return Profile(kubeconfig=c.kubeconfig, node_groups=NODE_GROUPS, log=c.state / f"{NAME}.log", pid=pids[NAME])
