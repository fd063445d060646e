"""Pure parts of the dev cluster's Kueue profile: the build's wrapper module and patch, the Configuration, the CRD
conversion webhooks and the webhook configurations reduced to the enabled integrations."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kfp_gpu_rehearsal.devcluster import kueue, kueue_profile
from kfp_gpu_rehearsal.devcluster.cli import main as devcluster_main
from kfp_gpu_rehearsal.devcluster.procs import BootError

UPSTREAM_MAIN = (
    "func main() {\n"
    "\tif cfg.InternalCertManagement == nil {\n"
    '\t\tmetricsCertPath := "/etc/kueue/metrics/certs"\n'
    "\t\tuse(metricsCertPath)\n"
    "\t}\n"
    "}\n"
)


def test_patched_main_lets_the_env_override_the_metrics_cert_dir() -> None:
    out = kueue.patched_main(UPSTREAM_MAIN)
    assert out.index('"/etc/kueue/metrics/certs"') < out.index(f'os.Getenv("{kueue.METRICS_CERT_ENV}")') \
        < out.index("use(metricsCertPath)")
    with pytest.raises(kueue.KueueError, match="anchor not found"):
        kueue.patched_main(UPSTREAM_MAIN.replace("metricsCertPath :=", "certPath :="))


def test_wrapper_gomod_copies_requires_and_module_replaces_only() -> None:
    upstream = {
        "Go": "1.25.0",
        "Require": [{"Path": "k8s.io/api", "Version": "v0.35.3"}, {"Path": kueue.MODULE, "Version": "v0.0.0"}],
        "Replace": [{"Old": {"Path": "a.example/x"}, "New": {"Path": "b.example/x", "Version": "v1.2.3"}},
                    {"Old": {"Path": "c.example/y"}, "New": {"Path": "./local"}}],
    }
    text = kueue.wrapper_gomod(upstream, "v0.17.0")
    assert "go 1.25.0" in text
    assert f"\t{kueue.MODULE} v0.17.0\n" in text and "v0.0.0" not in text
    assert "\tk8s.io/api v0.35.3\n" in text
    assert "a.example/x => b.example/x v1.2.3" in text and "./local" not in text


def test_configuration_runs_out_of_cluster_and_leaves_unlabelled_jobs_alone() -> None:
    ports = {"kueue-webhook": 1, "kueue-metrics": 2, "kueue-health": 3}
    cfg = kueue_profile.configuration(ports, Path("/state/kueue/certs"))
    assert cfg["apiVersion"] == "config.kueue.x-k8s.io/v1beta2" and cfg["kind"] == "Configuration"
    assert cfg["manageJobsWithoutQueueName"] is False
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 1, "certDir": "/state/kueue/certs"}
    assert cfg["metrics"]["bindAddress"] == "127.0.0.1:2"
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:3"
    assert cfg["integrations"]["frameworks"] == ["batch/job", "kubeflow.org/pytorchjob"]


def _hook(name: str, path: str) -> dict[str, object]:
    return {"name": name, "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
            "rules": [], "sideEffects": "None", "admissionReviewVersions": ["v1"]}


def test_webhooks_only_for_kueue_crds_and_enabled_frameworks(tmp_path: Path) -> None:
    manifest = tmp_path / "manifests.yaml"
    manifest.write_text(yaml.safe_dump_all([
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "mutating-webhook-configuration"},
         "webhooks": [_hook("mpod.kb.io", "/mutate--v1-pod"), _hook("mjob.kb.io", "/mutate-batch-v1-job"),
                      _hook("mpytorchjob.kb.io", "/mutate-kubeflow-org-v1-pytorchjob"),
                      _hook("mtfjob.kb.io", "/mutate-kubeflow-org-v1-tfjob"),
                      _hook("mworkload.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-workload")]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "validating-webhook-configuration"},
         "webhooks": [_hook("vpytorchjob.kb.io", "/validate-kubeflow-org-v1-pytorchjob")]},
    ]))
    mut, val = kueue_profile.webhook_objects(manifest, 19445, "Q0E=")
    assert mut["metadata"]["name"] == kueue_profile.MUTATING and val["metadata"]["name"] == kueue_profile.VALIDATING
    assert [h["name"] for h in mut["webhooks"]] == ["mjob.kb.io", "mpytorchjob.kb.io", "mworkload.kb.io"]
    assert mut["webhooks"][1]["clientConfig"] == {"url": "https://127.0.0.1:19445/mutate-kubeflow-org-v1-pytorchjob",
                                                  "caBundle": "Q0E="}
    with pytest.raises(BootError, match="no webhook for"):
        kueue_profile.webhook_objects(manifest, 19445, "Q0E=", frameworks=("batch/job", "kubeflow.org/pytorchjob",
                                                                           "kubeflow.org/jaxjob"))


def test_only_the_crds_upstream_converts_get_the_conversion_webhook(tmp_path: Path) -> None:
    bases, patches = tmp_path / kueue.CRD_DIR, tmp_path / kueue.CRD_PATCH_DIR
    bases.mkdir(parents=True)
    patches.mkdir(parents=True)
    for plural in ("workloads", "resourceflavors"):
        (bases / f"kueue.x-k8s.io_{plural}.yaml").write_text(yaml.safe_dump(
            {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
             "metadata": {"name": f"{plural}.kueue.x-k8s.io"}, "spec": {"versions": []}}))
        (patches / f"webhook_in_{plural}.yaml").write_text(yaml.safe_dump(
            {"metadata": {"name": f"{plural}.kueue.x-k8s.io"}, "spec": {"conversion": {"strategy": "Webhook"}}}))
    (tmp_path / kueue.CRD_KUSTOMIZATION).write_text("patches:\n- path: patches/webhook_in_workloads.yaml\n")
    crds = {c["metadata"]["name"]: c for c in kueue_profile.crd_objects(tmp_path, 7, "Q0E=")}
    assert "conversion" not in crds["resourceflavors.kueue.x-k8s.io"]["spec"]
    conv = crds["workloads.kueue.x-k8s.io"]["spec"]["conversion"]
    assert conv["strategy"] == "Webhook"
    assert conv["webhook"]["clientConfig"] == {"url": "https://127.0.0.1:7/convert", "caBundle": "Q0E="}
    with pytest.raises(BootError, match="build --with-kueue"):
        kueue_profile.crd_objects(tmp_path / "nothing", 7, "Q0E=")


def test_cli_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}
    from kfp_gpu_rehearsal.devcluster import boot, build

    monkeypatch.setattr(boot, "main_up", lambda autoscaler, kueue, extras: seen.update(up=(autoscaler, kueue)) or 0)
    monkeypatch.setattr(boot, "main_down", lambda **kw: seen.update(down=kw) or 0)
    monkeypatch.setattr(build, "main", lambda **kw: seen.update(build=kw) or 0)
    assert devcluster_main(["up", "--kueue", "--autoscaler", "cluster-autoscaler"]) == 0
    assert devcluster_main(["down", "--only-kueue"]) == 0
    assert devcluster_main(["build", "--with-kueue"]) == 0
    assert seen == {"up": ("cluster-autoscaler", True),
                    "down": {"purge": False, "only_autoscaler": False, "only_kueue": True, "only": []},
                    "build": {"with_autoscaler": False, "with_kueue": True, "extras": []}}


def test_trainer_integrations_get_their_webhooks_and_a_dashed_group_matches_only_its_own(tmp_path: Path) -> None:
    manifest = tmp_path / "manifests.yaml"
    manifest.write_text(yaml.safe_dump_all([
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "mutating-webhook-configuration"},
         "webhooks": [_hook("mjob.kb.io", "/mutate-batch-v1-job"),
                      _hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset"),
                      _hook("mtrainjob.kb.io", "/mutate-trainer-kubeflow-org-v1alpha1-trainjob"),
                      _hook("mlws.kb.io", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset")]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "validating-webhook-configuration"},
         "webhooks": [_hook("vtrainjob.kb.io", "/validate-trainer-kubeflow-org-v1alpha1-trainjob")]},
    ]))
    fws = ("batch/job", *kueue_profile.TRAINER_FRAMEWORKS)
    mut, val = kueue_profile.webhook_objects(manifest, 19445, "Q0E=", fws)
    assert [h["name"] for h in mut["webhooks"]] == ["mjob.kb.io", "mjobset.kb.io", "mtrainjob.kb.io"]
    assert [h["name"] for h in val["webhooks"]] == ["vtrainjob.kb.io"]
    mut, _ = kueue_profile.webhook_objects(manifest, 19445, "Q0E=", ("batch/job",))
    assert [h["name"] for h in mut["webhooks"]] == ["mjob.kb.io"]
    cfg = kueue_profile.configuration({"kueue-webhook": 1, "kueue-metrics": 2, "kueue-health": 3}, tmp_path, fws)
    assert cfg["integrations"]["frameworks"] == list(fws) and cfg["manageJobsWithoutQueueName"] is False


def test_the_trainer_extra_boots_before_kueue_and_stops_after_it() -> None:
    from kfp_gpu_rehearsal.devcluster import extras

    order = extras.names()
    assert order.index("trainer") < order.index("kueue")
    assert [e.name for e in extras.select(["kueue", "trainer"])] == ["trainer", "kueue"]
