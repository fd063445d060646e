"""The Trainer profile of the dev cluster: the real JobSet (v0.12) and Kubeflow Trainer v2 (v2.3) controllers (built
by :mod:`kfp_gpu.devcluster.trainer`), their CRDs, their webhooks served by processes outside the cluster, and the
``torch-distributed`` ClusterTrainingRuntime.

``python -m kfp_gpu.devcluster up --with trainer`` (``make cluster-up TRAINER=1``,
``kfp-gpu dev-cluster up --with trainer``) runs both as managed processes of the dev cluster
(``jobset.{pid,args,log}`` and ``trainer.{pid,args,log}`` in the state dir, Configurations in ``trainer/``),
shown by ``status``, stopped by ``down`` (``down --only trainer``), re-used by a later ``up`` while healthy with the same flags (else restarted). A plain ``up`` leaves them running, and
removes their webhook configurations when they are not running (JobSet's pod webhooks refuse every pod carrying a
``jobset.sigs.k8s.io/jobset-name`` label while nobody serves them).

What it installs (server-side apply, field manager ``kfp-gpu-devcluster``), in this order:

1. CRDs: ``jobsets.jobset.x-k8s.io`` (one version, v1alpha2: upstream's conversion-webhook patch is not applied, a
   single-version CRD never converts) and ``trainjobs`` / ``trainingruntimes`` / ``clustertrainingruntimes``
   (``trainer.kubeflow.org/v1alpha1``), Established.
2. JobSet, then ``jobset-{mutating,validating}-webhook-configuration`` (upstream's, with upstream's kustomize patch that
   limits the pod webhooks to pods labelled ``jobset.sigs.k8s.io/jobset-name``), ``clientConfig.url`` on 127.0.0.1.
3. The Trainer (needs the JobSet CRD at start), then ``defaulter.trainer.kubeflow.org`` /
   ``validator.trainer.kubeflow.org`` (upstream names and objectSelectors), ``clientConfig.url`` on 127.0.0.1.
4. ``torch-distributed`` ClusterTrainingRuntime, unchanged from ``manifests/base/runtimes/torch_distributed.yaml``
   (its image is never pulled: KWOK fakes the pods), admitted by the Trainer's own validating webhook.

Serving certs: the dev cluster's webhook cert (``pki/webhook.crt``, SAN 127.0.0.1, CA ``webhook-ca``); both managers
run with internal cert management off. JobSet reads them from ``webhook.certDir`` (``trainer/jobset-certs``); the
Trainer's Configuration has no cert dir, so it runs with ``TMPDIR=trainer/tmp`` and reads controller-runtime's
default ``$TMPDIR/k8s-webhook-server/serving-certs``. Both: no leader election, metrics off (``bindAddress: "0"``),
webhook and health on 127.0.0.1 ports (``KFP_GPU_{JOBSET,TRAINER}_{WEBHOOK,HEALTH}_PORT``). The Trainer's runtime
status server is behind the ``TrainJobStatus`` gate (off by default) and is not started.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from . import procs
from . import trainer as build
from .boot import Component, Ctx

NAME = "trainer"  # the registry entry; the processes are "jobset" and "trainer"
JOBSET = build.JOBSET.name
TRAINER = build.TRAINER.name
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
RUNTIME = "torch-distributed"
PORTS: dict[str, tuple[str, int]] = {
    "jobset-webhook": ("KFP_GPU_JOBSET_WEBHOOK_PORT", 19451),
    "jobset-health": ("KFP_GPU_JOBSET_HEALTH_PORT", 18091),
    "trainer-webhook": ("KFP_GPU_TRAINER_WEBHOOK_PORT", 19452),
    "trainer-health": ("KFP_GPU_TRAINER_HEALTH_PORT", 18092),
}


def ports() -> dict[str, int]:
    return {k: int(os.environ.get(env, default)) for k, (env, default) in PORTS.items()}


def state_dir(c: Ctx) -> Path:
    return c.state / "trainer"


def jobset_cert_dir(c: Ctx) -> Path:
    return state_dir(c) / "jobset-certs"


def trainer_tmp(c: Ctx) -> Path:
    return state_dir(c) / "tmp"


def trainer_cert_dir(c: Ctx) -> Path:
    return trainer_tmp(c) / "k8s-webhook-server" / "serving-certs"


def jobset_config(p: dict[str, int], certs: Path) -> dict[str, Any]:
    """JobSet's ``config.jobset.x-k8s.io/v1alpha1`` Configuration for an out-of-cluster controller."""
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": p["jobset-webhook"], "certDir": str(certs)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{p['jobset-health']}"},
        "clientConnection": {"qps": 100, "burst": 200},
    }


def trainer_config(p: dict[str, int]) -> dict[str, Any]:
    """The Trainer's ``config.trainer.kubeflow.org/v1alpha1`` Configuration for an out-of-cluster controller."""
    return {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": p["trainer-webhook"]},
        "metrics": {"bindAddress": "0", "secureServing": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{p['trainer-health']}",
                   "readinessEndpointName": "readyz", "livenessEndpointName": "healthz"},
        "clientConnection": {"qps": 100, "burst": 200},
    }


def _b64(p: Path) -> str:
    return base64.b64encode(p.read_bytes()).decode()


def _install_file(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` unless equal, by rename: a running manager's cert watcher never reads a half file."""
    data = src.read_bytes()
    if dst.exists() and dst.read_bytes() == data:
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o600)
    os.replace(tmp, dst)


def _jobset_argv(c: Ctx) -> list[str]:
    return [str(c.bins[JOBSET]), f"--config={state_dir(c) / 'jobset.yaml'}", "--zap-log-level=info"]


def _trainer_argv(c: Ctx) -> list[str]:
    return [str(c.bins[TRAINER]), f"--config={state_dir(c) / 'trainer.yaml'}", "--zap-log-level=info"]


def _ready(key: str) -> Callable[[Ctx], bool]:
    """``/readyz`` answers 200: the manager's webhook server is listening (upstream's readiness check)."""
    return lambda c: procs.http_ok(f"http://127.0.0.1:{c.ports[key]}/readyz")


JOBSET_COMPONENT = Component(JOBSET, ("jobset-webhook", "jobset-health"), _jobset_argv, _ready("jobset-health"),
                             timeout=90.0, env=lambda c: {"KUBECONFIG": str(c.kubeconfig)})
TRAINER_COMPONENT = Component(TRAINER, ("trainer-webhook", "trainer-health"), _trainer_argv,
                              _ready("trainer-health"), timeout=90.0,
                              env=lambda c: {"KUBECONFIG": str(c.kubeconfig), "TMPDIR": str(trainer_tmp(c))})


def context(c: Ctx) -> Ctx:
    """``c`` with both binaries and ports (kept out of the core components' state.json ports)."""
    return replace(c, bins={**c.bins, JOBSET: build.JOBSET.binary(), TRAINER: build.TRAINER.binary()},
                   ports={**c.ports, **ports()})


def prepare(c: Ctx) -> Ctx:
    """Check the binaries, apply the CRDs (wait Established), write the certs and both Configurations.

    Raises: procs.BootError (missing binary or manifests, CRD not Established), trainer.TrainerError.
    """
    from . import crds

    cx = context(c)
    missing = [str(cx.bins[n]) for n in (JOBSET, TRAINER) if not cx.bins[n].exists()]
    if missing:
        raise procs.BootError(f"{', '.join(missing)} missing: run `make cluster-build TRAINER=1` "
                              "(python -m kfp_gpu.devcluster build --with trainer)")
    api = crds.api_client(c.kubeconfig)
    try:
        objs = build.crd_objects(build.JOBSET.share(), build.TRAINER.share())
        for crd in objs:
            crds.apply(api, crd)
        for crd in objs:
            crds.wait_established(api, crd["metadata"]["name"])
    finally:
        api.close()
    for d in (jobset_cert_dir(cx), trainer_cert_dir(cx)):
        for src, dst in (("webhook.crt", "tls.crt"), ("webhook.key", "tls.key")):
            _install_file(c.pki / src, d / dst)
    (state_dir(cx) / "jobset.yaml").write_text(yaml.safe_dump(jobset_config(cx.ports, jobset_cert_dir(cx))))
    (state_dir(cx) / "trainer.yaml").write_text(yaml.safe_dump(trainer_config(cx.ports)))
    return cx


def _webhooks(c: Ctx, which: str) -> list[dict[str, Any]]:
    comp, manifest, patches, names, port = (
        (build.JOBSET, build.JOBSET_WEBHOOKS, build.JOBSET_WEBHOOK_PATCHES, build.JOBSET_CONFIG_NAMES, "jobset-webhook")
        if which == JOBSET else
        (build.TRAINER, build.TRAINER_WEBHOOKS, build.TRAINER_WEBHOOK_PATCHES, build.TRAINER_CONFIG_NAMES,
         "trainer-webhook"))
    s = comp.share()
    return build.webhook_objects(s / manifest, {k: s / v for k, v in patches.items()}, names, context(c).ports[port],
                                 _b64(c.pki / "webhook-ca.crt"))


def install_webhooks(c: Ctx, which: str) -> None:
    """Apply one controller's webhook configurations (after it is ready: until then they refuse its objects)."""
    from . import crds

    api = crds.api_client(c.kubeconfig)
    try:
        for obj in _webhooks(c, which):
            crds.apply(api, obj)
    finally:
        api.close()


def install_runtime(c: Ctx) -> None:
    """Create or update the ``torch-distributed`` ClusterTrainingRuntime (through the Trainer's webhook).

    Raises: kubernetes ApiException when the API server (or the webhook) refuses it.
    """
    from kubernetes import client
    from kubernetes.client import ApiException

    from . import crds

    obj = build.runtime_object(build.TRAINER.share())
    api = crds.api_client(c.kubeconfig)
    custom = client.CustomObjectsApi(api)
    try:
        try:
            cur = custom.get_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", RUNTIME)
        except ApiException as e:
            if e.status != 404:
                raise
            custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", obj)
            return
        if cur.get("spec") != obj["spec"]:
            obj["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
            custom.replace_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", RUNTIME, obj)
    finally:
        api.close()


def remove_webhooks(c: Ctx) -> list[str]:
    """Delete both controllers' webhook configurations; the names deleted."""
    from kubernetes import client
    from kubernetes.client import ApiException

    from . import crds

    api = crds.api_client(c.kubeconfig)
    adm = client.AdmissionregistrationV1Api(api)
    gone = []
    try:
        for names in (build.TRAINER_CONFIG_NAMES, build.JOBSET_CONFIG_NAMES):
            for kind, name in names.items():
                delete = (adm.delete_mutating_webhook_configuration if kind.startswith("Mutating")
                          else adm.delete_validating_webhook_configuration)
                try:
                    delete(name)
                    gone.append(name)
                except ApiException as e:
                    if e.status != 404:
                        raise
    finally:
        api.close()
    return gone


def up(c: Ctx, wanted: bool, status: dict[str, str], t0: float) -> None:
    """``boot.up``'s Trainer step: start/re-use JobSet and the Trainer when ``wanted``; else leave running ones
    alone, or remove the webhook configurations stopped ones left.

    Raises: procs.BootError, trainer.TrainerError, kubernetes ApiException (the runtime refused).
    """
    from .boot import _ensure

    if wanted:
        cx = prepare(c)
        status[JOBSET] = _ensure(cx, JOBSET_COMPONENT)
        install_webhooks(cx, JOBSET)
        print(f"[up] {JOBSET}: {status[JOBSET]} ({time.monotonic() - t0:.1f}s)", flush=True)
        status[TRAINER] = _ensure(cx, TRAINER_COMPONENT)
        install_webhooks(cx, TRAINER)
        install_runtime(cx)
        print(f"[up] {TRAINER}: {status[TRAINER]}, ClusterTrainingRuntime {RUNTIME} installed "
              f"({time.monotonic() - t0:.1f}s)", flush=True)
    elif running_pids(c):
        print(f"[up] {NAME}: left running (started by an earlier up --with trainer; `down --only trainer` stops "
              "it)", flush=True)
    elif remove_webhooks(c):
        print(f"[up] {NAME}: not running; removed its stale webhook configurations", flush=True)


def running_pids(c: Ctx) -> dict[str, int]:
    cx = context(c)
    out = {}
    for n in (JOBSET, TRAINER):
        pid = procs.running_pid(cx.state, n, cx.bins[n])
        if pid is not None:
            out[n] = pid
    return out


def stop(c: Ctx) -> bool:
    """Stop the Trainer and JobSet and remove their webhook configurations. True if either was running."""
    cx = context(c)
    was = [procs.stop(cx.state, n, cx.bins[n], timeout=20.0) for n in (TRAINER, JOBSET)]
    try:
        remove_webhooks(cx)
    except Exception as e:  # noqa: BLE001 - the API server may already be gone (down after a crash)
        print(f"[down] could not remove JobSet/Trainer webhook configurations: {str(e)[:200]}", flush=True)
    return any(was)


def status_line(c: Ctx) -> str:
    pids = running_pids(c)
    if not pids:
        return "stopped (profile off; up --with trainer starts it)"
    cx = context(c)
    parts = []
    for comp in (JOBSET_COMPONENT, TRAINER_COMPONENT):
        pid = pids.get(comp.name)
        parts.append(f"{comp.name} " + ("STOPPED" if pid is None else
                                        f"pid={pid} " + ("healthy" if comp.healthy(cx) else "UNHEALTHY")))
    return "running " + ", ".join(parts)


@dataclass(frozen=True)
class Profile:
    """What the ``trainer`` test fixture hands out."""

    kubeconfig: Path
    jobset_log: Path
    trainer_log: Path
    pids: dict[str, int]
    runtime: str = RUNTIME
    api_version: str = f"{GROUP}/{VERSION}"


def ensure_up() -> Profile:
    """Boot (or re-use) the dev cluster with JobSet and the Trainer running: ``up --with trainer``.

    Raises: procs.BootError, certs.CertError, trainer.TrainerError (the caller decides how to fail).
    """
    from . import boot

    c = boot.up(extras=(NAME,))
    pids = running_pids(c)
    if set(pids) != {JOBSET, TRAINER}:
        raise procs.BootError(f"JobSet/Trainer not running after up (running: {sorted(pids)}); see "
                              f"{c.state / 'jobset.log'} and {c.state / 'trainer.log'}")
    return Profile(kubeconfig=c.kubeconfig, jobset_log=c.state / "jobset.log", trainer_log=c.state / "trainer.log",
                   pids=pids)
