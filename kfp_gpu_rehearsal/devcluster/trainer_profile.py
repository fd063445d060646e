"""The Trainer profile of the dev cluster: the real JobSet (v0.12) and Kubeflow Trainer v2 (v2.3) controllers (built
by :mod:`kfp_gpu_rehearsal.devcluster.trainer`), their CRDs, their webhooks served by processes outside the cluster, and the
``torch-distributed`` ClusterTrainingRuntime.

``python -m kfp_gpu_rehearsal.devcluster up --with trainer`` (``make cluster-up TRAINER=1``,
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import ports, procs, runner
from . import trainer as build
from .runner import Component, Ctx

NAME = "trainer"  # the registry entry; the processes are "jobset" and "trainer"
JOBSET = build.JOBSET.name
TRAINER = build.TRAINER.name
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
RUNTIME = "torch-distributed"
PORTS = ports.TRAINER
JOBSET_CERTS, TRAINER_TMP = Path("trainer/jobset-certs"), Path("trainer/tmp")  # under the state dir


def trainer_cert_dir(c: Ctx) -> Path:
    return c.state / TRAINER_TMP / "k8s-webhook-server" / "serving-certs"


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
    return [str(c.bins[JOBSET]), f"--config={c.unit_dir('trainer') / 'jobset.yaml'}", "--zap-log-level=info"]


def _trainer_argv(c: Ctx) -> list[str]:
    return [str(c.bins[TRAINER]), f"--config={c.unit_dir('trainer') / 'trainer.yaml'}", "--zap-log-level=info"]


def _ready(key: str) -> Callable[[Ctx], bool]:
    """``/readyz`` answers 200: the manager's webhook server is listening (upstream's readiness check)."""
    return lambda c: procs.http_ok(f"http://127.0.0.1:{c.ports[key]}/readyz")


JOBSET_COMPONENT = Component(JOBSET, ("jobset-webhook", "jobset-health"), _jobset_argv, _ready("jobset-health"),
                             timeout=90.0, env=lambda c: {"KUBECONFIG": str(c.kubeconfig)}, stop_timeout=20.0,
                             after=lambda c: _after_jobset(c))
TRAINER_COMPONENT = Component(TRAINER, ("trainer-webhook", "trainer-health"), _trainer_argv,
                              _ready("trainer-health"), timeout=90.0,
                              env=lambda c: {"KUBECONFIG": str(c.kubeconfig), "TMPDIR": str(c.state / TRAINER_TMP)},
                              stop_timeout=20.0, after=lambda c: _after_trainer(c))


def context(c: Ctx) -> Ctx:
    """``c`` with both binaries and ports (kept out of the core components' state.json ports)."""
    return runner.extend(c, {JOBSET: build.JOBSET.binary(), TRAINER: build.TRAINER.binary()}, PORTS)


def prepare(c: Ctx) -> Ctx:
    """Check the binaries, apply the CRDs (wait Established), write the certs and both Configurations.

    Raises: procs.BootError (missing binary or manifests, CRD not Established), trainer.TrainerError.
    """
    from . import crds

    cx = context(c)
    runner.require_binaries(cx, (JOBSET, TRAINER), "`make cluster-build TRAINER=1` "
                                                  "(python -m kfp_gpu_rehearsal.devcluster build --with trainer)")
    api = crds.api_client(c.kubeconfig)
    try:
        objs = build.crd_objects(build.JOBSET.share(), build.TRAINER.share())
        for crd in objs:
            crds.apply(api, crd)
        for crd in objs:
            crds.wait_established(api, crd["metadata"]["name"])
    finally:
        api.close()
    for d in (cx.state / JOBSET_CERTS, trainer_cert_dir(cx)):
        for src, dst in (("webhook.crt", "tls.crt"), ("webhook.key", "tls.key")):
            _install_file(c.pki / src, d / dst)
    (cx.unit_dir("trainer") / "jobset.yaml").write_text(yaml.safe_dump(jobset_config(cx.ports, cx.state / JOBSET_CERTS)))
    (cx.unit_dir("trainer") / "trainer.yaml").write_text(yaml.safe_dump(trainer_config(cx.ports)))
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
    from . import crds

    return crds.delete_webhooks(c.kubeconfig, [*build.TRAINER_CONFIG_NAMES.items(), *build.JOBSET_CONFIG_NAMES.items()])


def _after_jobset(c: Ctx) -> str:
    install_webhooks(c, JOBSET)
    return ""


def _after_trainer(c: Ctx) -> str:
    install_webhooks(c, TRAINER)
    install_runtime(c)
    return f", ClusterTrainingRuntime {RUNTIME} installed"


UNIT = runner.Unit(NAME, (JOBSET_COMPONENT, TRAINER_COMPONENT), off_hint="up --with trainer starts it",
                   context=context, prepare=prepare, cleanup=remove_webhooks)


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
    c, pids = runner.ensure_running(UNIT, extras=(NAME,))
    return Profile(kubeconfig=c.kubeconfig, jobset_log=c.state / "jobset.log", trainer_log=c.state / "trainer.log",
                   pids=pids)
