"""The Kueue profile of the dev cluster: the real Kueue controller (built by :mod:`kfp_gpu_rehearsal.devcluster.kueue`), its
CRDs and its webhooks, served by a process outside the cluster.

``python -m kfp_gpu_rehearsal.devcluster up --kueue`` (``make cluster-up KUEUE=1``, ``kfp-gpu dev-cluster up --kueue``) runs it
as a managed process of the dev cluster: pid, args and log in the state dir (``kueue.{pid,args,log}``), its
Configuration in ``kueue/config.yaml``, shown by ``status``, stopped by ``down`` (``down --only-kueue`` stops only
Kueue), re-used by a later ``up`` while healthy with the same flags and configuration (else restarted). A plain
``up`` leaves a running Kueue alone, and removes Kueue's webhook configurations when no Kueue runs (so a dead Kueue
never blocks Job / PyTorchJob creation in the shared cluster). Combine with ``--autoscaler cluster-autoscaler``:
the real cluster-autoscaler then serves the ProvisioningRequests Kueue's provisioning admission check creates.

What it installs (server-side apply, field manager ``kfp-gpu-devcluster``):

- Kueue's CRDs (``kueue.x-k8s.io``: v1beta2 served and stored, v1beta1 served), from the module, Established;
  the CRDs upstream converts through a webhook (its kustomization's patches) get ``conversion.strategy: Webhook``
  with ``url: https://127.0.0.1:<webhook port>/convert``.
- ``kueue-mutating-webhook-configuration`` / ``kueue-validating-webhook-configuration``: upstream's webhooks for
  Kueue's own CRDs and for the enabled integrations only (:data:`FRAMEWORKS`; a webhook for a framework Kueue does
  not serve would refuse every such object), ``clientConfig.url`` on 127.0.0.1, applied once Kueue is ready.
- Serving certs: the dev cluster's webhook cert (``pki/webhook.crt``, SAN 127.0.0.1, CA ``webhook-ca``), copied to
  ``kueue/certs`` for the webhook server and the metrics server (internal cert management is off).

Configuration (``config.kueue.x-k8s.io/v1beta2``): integrations ``batch/job`` and ``kubeflow.org/pytorchjob``, plus
``jobset.x-k8s.io/jobset`` and ``trainer.kubeflow.org/trainjob`` when the JobSet and Trainer CRDs exist at Kueue's start
(the ``trainer`` extra boots before ``kueue``; a changed Configuration restarts a running Kueue on the next ``up``);
``manageJobsWithoutQueueName: false`` (jobs without the ``kueue.x-k8s.io/queue-name`` label are left alone: other
tests share this cluster); no leader election; webhook, metrics and health on 127.0.0.1 ports
(``KFP_GPU_KUEUE_{WEBHOOK,METRICS,HEALTH}_PORT``); the ``VisibilityOnDemand`` gate off (its aggregated API server
is not needed here). The ProvisioningRequest admission check controller has no gate in v0.17: it starts when the
API server serves ``autoscaling.x-k8s.io/v1`` ProvisioningRequests, which the dev cluster always does.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import kueue, ports, procs, runner
from .runner import Component, Ctx

NAME = kueue.NAME  # component name: kueue.{pid,args,log} in the state dir
API_GROUP = "kueue.x-k8s.io"
API_VERSION = "v1beta2"
NAMESPACE = "kueue-system"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
FRAMEWORKS = ("batch/job", "kubeflow.org/pytorchjob")
#: enabled as well when the Trainer's and JobSet's CRDs exist at Kueue's start (:func:`frameworks`)
TRAINER_FRAMEWORKS = ("jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob")
TRAINER_CRDS = ("jobsets.jobset.x-k8s.io", "trainjobs.trainer.kubeflow.org", "trainingruntimes.trainer.kubeflow.org",
                "clustertrainingruntimes.trainer.kubeflow.org")
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
PORTS = ports.KUEUE
CERTS, CONFIG = Path("kueue/certs"), Path("kueue/config.yaml")  # under the state dir


def configuration(p: dict[str, int], certs: Path, frameworks: tuple[str, ...] = FRAMEWORKS) -> dict[str, Any]:
    """Kueue's ``Configuration`` for an out-of-cluster controller on the 127.0.0.1 ports ``p``, with the
    ``frameworks`` integrations."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": p["kueue-webhook"], "certDir": str(certs)},
        "metrics": {"bindAddress": f"127.0.0.1:{p['kueue-metrics']}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{p['kueue-health']}"},
        "clientConnection": {"qps": 100, "burst": 200},
        "integrations": {"frameworks": list(frameworks)},
        "featureGates": {"VisibilityOnDemand": False},
    }


def _b64(p: Path) -> str:
    return base64.b64encode(p.read_bytes()).decode()


def crd_objects(share: Path, port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's CRDs; those upstream converts through its webhook get a conversion webhook on 127.0.0.1.

    Raises: procs.BootError when the shared files are missing (names the build command).
    """
    crd_dir = share / kueue.CRD_DIR
    files = sorted(crd_dir.glob("*.yaml"))
    kust = share / kueue.CRD_KUSTOMIZATION
    if not files or not kust.exists():
        raise procs.BootError(f"Kueue CRDs missing under {share}: run `python -m kfp_gpu_rehearsal.devcluster build --with-kueue`")
    converted = set()
    for p in yaml.safe_load(kust.read_text()).get("patches") or []:
        patch = yaml.safe_load((kust.parent / p["path"]).read_text())
        if (patch.get("spec") or {}).get("conversion", {}).get("strategy") == "Webhook":
            converted.add(patch["metadata"]["name"])
    out = []
    for f in files:
        crd = yaml.load(f.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe
        if crd["metadata"]["name"] in converted:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": f"https://127.0.0.1:{port}/convert", "caBundle": ca_bundle},
                "conversionReviewVersions": ["v1"]}}
        out.append(crd)
    return out


def webhook_objects(manifest: Path, port: int, ca_bundle: str,
                    frameworks: tuple[str, ...] = FRAMEWORKS) -> list[dict[str, Any]]:
    """Upstream's webhook configurations, reduced to Kueue's own CRDs and ``frameworks``, pointing at 127.0.0.1.

    Raises: procs.BootError when the manifest is missing or a framework has no webhook in it.
    """
    if not manifest.exists():
        raise procs.BootError(f"{manifest} is missing: run `python -m kfp_gpu_rehearsal.devcluster build --with-kueue`")
    out = []
    for doc in (d for d in yaml.safe_load_all(manifest.read_text()) if d):
        hooks = []
        for h in doc.get("webhooks", []):
            path = h["clientConfig"]["service"]["path"]
            if _for_kueue(path) or any(_for_framework(path, f) for f in frameworks):
                h["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
                h["timeoutSeconds"] = 10
                hooks.append(h)
        name = MUTATING if doc["kind"] == "MutatingWebhookConfiguration" else VALIDATING
        out.append({"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": {"name": name}, "webhooks": hooks})
    paths = [h["clientConfig"]["url"].split("/", 3)[-1] for d in out for h in d["webhooks"]]
    missing = [f for f in frameworks if not any(_for_framework("/" + p, f) for p in paths)]
    if missing:
        raise procs.BootError(f"{manifest}: no webhook for {missing}")
    return out


def _for_kueue(path: str) -> bool:
    return path.split("/")[-1].split("-", 1)[-1].startswith("kueue-x-k8s-io-")


def _for_framework(path: str, framework: str) -> bool:
    """``/mutate-kubeflow-org-v1-pytorchjob`` serves ``kubeflow.org/pytorchjob`` (kubebuilder's path scheme)."""
    group, _, kind = framework.rpartition("/")
    prefix = group.replace(".", "-") + "-"  # jobset.x-k8s.io -> jobset-x-k8s-io-
    rest = path.split("/")[-1].split("-", 1)[-1]  # after mutate- / validate-
    return rest.startswith(prefix) and rest.endswith("-" + kind) and rest.count("-") == prefix.count("-") + 1


def _argv(c: Ctx) -> list[str]:
    return [str(c.bins[NAME]), f"--config={c.state / CONFIG}"]


def _env(c: Ctx) -> dict[str, str]:
    """The process env; ``KFP_GPU_KUEUE_CONFIG`` (a digest of the Configuration, unread by Kueue) makes a changed
    Configuration (e.g. the Trainer's integrations) restart a running Kueue on the next ``up``."""
    cfg = c.state / CONFIG
    digest = hashlib.sha256(cfg.read_bytes()).hexdigest()[:16] if cfg.exists() else ""
    return {"KUBECONFIG": str(c.kubeconfig), kueue.METRICS_CERT_ENV: str(c.state / CERTS), "KFP_GPU_KUEUE_CONFIG": digest}


def _healthy(c: Ctx) -> bool:
    """``/readyz`` answers 200: Kueue's webhook server is listening (upstream's readiness check)."""
    return procs.http_ok(f"http://127.0.0.1:{c.ports['kueue-health']}/readyz")


COMPONENT = Component(NAME, tuple(PORTS), _argv, _healthy, timeout=120.0, env=_env, stop_timeout=20.0,
                      after=lambda c: _after(c))


def context(c: Ctx) -> Ctx:
    """``c`` with Kueue's binary and ports (kept out of the core components' state.json ports)."""
    return runner.extend(c, {NAME: kueue.binary()}, PORTS)


def prepare(c: Ctx) -> Ctx:
    """Check the binary, apply the CRDs (wait Established), write the certs and the Configuration.

    Raises: procs.BootError (missing binary or manifests, CRD not Established), kueue.KueueError.
    """
    from . import crds

    cx = context(c)
    runner.require_binaries(cx, (NAME,), "`make cluster-build KUEUE=1` (python -m kfp_gpu_rehearsal.devcluster build --with-kueue)")
    ca = _b64(c.pki / "webhook-ca.crt")
    api = crds.api_client(c.kubeconfig)
    try:
        crds.apply(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        objs = crd_objects(kueue.share(), cx.ports["kueue-webhook"], ca)
        for crd in objs:
            crds.apply(api, crd)
        for crd in objs:
            crds.wait_established(api, crd["metadata"]["name"])
        fws = frameworks(api)
    finally:
        api.close()
    (cx.state / CERTS).mkdir(parents=True, exist_ok=True)
    for src, dst in (("webhook.crt", "tls.crt"), ("webhook.key", "tls.key")):
        shutil.copyfile(c.pki / src, cx.state / CERTS / dst)
    (cx.state / CONFIG).write_text(yaml.safe_dump(configuration(cx.ports, cx.state / CERTS, fws), sort_keys=False))
    return cx


def frameworks(api: Any) -> tuple[str, ...]:
    """The integrations to enable: :data:`FRAMEWORKS`, plus :data:`TRAINER_FRAMEWORKS` when the JobSet and Trainer
    CRDs (:data:`TRAINER_CRDS`) are installed (the ``trainer`` extra comes first in the registry, so
    ``up --with kueue --with trainer`` installs them before Kueue starts; Kueue reads its integrations at start).

    Raises: kubernetes ApiException (other than 404).
    """
    from kubernetes import client
    from kubernetes.client import ApiException

    ext = client.ApiextensionsV1Api(api)
    for name in TRAINER_CRDS:
        try:
            ext.read_custom_resource_definition(name)
        except ApiException as e:
            if e.status == 404:
                return FRAMEWORKS
            raise
    return FRAMEWORKS + TRAINER_FRAMEWORKS


def configured_frameworks(c: Ctx) -> tuple[str, ...]:
    """The integrations in the Configuration :func:`prepare` wrote (:data:`FRAMEWORKS` when there is none)."""
    cfg = context(c).state / CONFIG
    if not cfg.exists():
        return FRAMEWORKS
    return tuple((yaml.safe_load(cfg.read_text()).get("integrations") or {}).get("frameworks") or FRAMEWORKS)


def install_webhooks(c: Ctx) -> None:
    """Apply the webhook configurations for the configured integrations (after Kueue is ready: until then they
    would refuse every labelled job). Server-side apply drops the webhooks this field manager applied before and
    no longer applies, so the webhooks of an integration no longer enabled go too."""
    from . import crds

    cx = context(c)
    api = crds.api_client(c.kubeconfig)
    try:
        for obj in webhook_objects(kueue.share() / kueue.WEBHOOK_MANIFEST, cx.ports["kueue-webhook"],
                                   _b64(c.pki / "webhook-ca.crt"), configured_frameworks(cx)):
            crds.apply(api, obj)
    finally:
        api.close()


def remove_webhooks(c: Ctx) -> list[str]:
    """Delete Kueue's webhook configurations (none are left pointing at a stopped Kueue); the names deleted."""
    from . import crds

    return crds.delete_webhooks(c.kubeconfig, [("MutatingWebhookConfiguration", MUTATING),
                                               ("ValidatingWebhookConfiguration", VALIDATING)])


def _after(c: Ctx) -> str:
    install_webhooks(c)
    return ""


UNIT = runner.Unit(NAME, (COMPONENT,), off_hint="up --kueue starts it", context=context, prepare=prepare,
                   cleanup=remove_webhooks)


@dataclass(frozen=True)
class Profile:
    """What the ``kueue`` test fixture hands out."""

    kubeconfig: Path
    log: Path
    pid: int
    api_version: str = f"{API_GROUP}/{API_VERSION}"


def ensure_up() -> Profile:
    """Boot (or re-use) the dev cluster with Kueue running: ``up --kueue``.

    Raises: procs.BootError, certs.CertError, kueue.KueueError (the caller decides how to fail).
    """
    c, pids = runner.ensure_running(UNIT, kueue=True)
    return Profile(kubeconfig=c.kubeconfig, log=c.state / f"{NAME}.log", pid=pids[NAME])
