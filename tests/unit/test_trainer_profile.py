"""Pure parts of the dev cluster's Trainer profile (JobSet + Kubeflow Trainer v2): the Configurations, upstream's
kustomize webhook patches and the webhook configurations pointing at 127.0.0.1, and the pins."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kfp_gpu_rehearsal.devcluster import extras, trainer, trainer_profile
from kfp_gpu_rehearsal.devcluster.procs import BootError

PORTS = {"jobset-webhook": 1, "jobset-health": 2, "trainer-webhook": 3, "trainer-health": 4}


def test_pins_and_registry_entry() -> None:
    assert trainer.JOBSET.version() == "v0.12.0" and trainer.TRAINER.version() == "v2.3.0"
    assert trainer.JOBSET.binary().name == "jobset-v0.12.0" and trainer.TRAINER.binary().name == "trainer-v2.3.0"
    e = extras.get("trainer")
    assert e.build_fn() is trainer.build and e.profile_module() is trainer_profile


def test_missing_pin_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer, "load_versions", lambda: {"KUEUE_VERSION": "v0.17.0"})
    with pytest.raises(trainer.TrainerError, match="JOBSET_VERSION is empty in kfp_gpu_rehearsal/devcluster/versions.env"):
        trainer.JOBSET.version()


def test_configurations_run_out_of_cluster_on_loopback() -> None:
    js = trainer_profile.jobset_config(PORTS, Path("/s/certs"))
    assert js["apiVersion"] == "config.jobset.x-k8s.io/v1alpha1"
    assert js["leaderElection"] == {"leaderElect": False} and js["internalCertManagement"] == {"enable": False}
    assert js["webhook"] == {"host": "127.0.0.1", "port": 1, "certDir": "/s/certs"}
    assert js["health"]["healthProbeBindAddress"] == "127.0.0.1:2" and js["metrics"]["bindAddress"] == "0"
    tr = trainer_profile.trainer_config(PORTS)
    assert tr["apiVersion"] == "config.trainer.kubeflow.org/v1alpha1"
    assert tr["leaderElection"] == {"leaderElect": False} and tr["certManagement"] == {"enable": False}
    assert tr["webhook"] == {"host": "127.0.0.1", "port": 3}
    assert tr["health"]["healthProbeBindAddress"] == "127.0.0.1:4" and tr["metrics"]["bindAddress"] == "0"
    assert "featureGates" not in tr  # TrainJobStatus (the runtime status server on a 0.0.0.0 port) stays off


def _hook(name: str, path: str) -> dict[str, object]:
    return {"name": name, "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
            "failurePolicy": "Fail", "rules": [], "sideEffects": "None", "admissionReviewVersions": ["v1"]}


def test_jobset_pod_webhooks_get_upstreams_object_selector(tmp_path: Path) -> None:
    manifest = tmp_path / "manifests.yaml"
    manifest.write_text(yaml.safe_dump_all([
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "mutating-webhook-configuration"},
         "webhooks": [_hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset"),
                      _hook("mpod.kb.io", "/mutate--v1-pod")]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "validating-webhook-configuration"},
         "webhooks": [_hook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset"),
                      _hook("vpod.kb.io", "/validate--v1-pod")]},
    ]))
    selector = {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}
    patches = {}
    for kind, name, path in (("MutatingWebhookConfiguration", "mpod.kb.io", "/mutate--v1-pod"),
                             ("ValidatingWebhookConfiguration", "vpod.kb.io", "/validate--v1-pod")):
        patches[kind] = tmp_path / f"{kind}.yaml"
        patches[kind].write_text(yaml.safe_dump([{"op": "replace", "path": "/webhooks/1",
                                                  "value": {**_hook(name, path), "objectSelector": selector}}]))
    mut, val = trainer.webhook_objects(manifest, patches, trainer.JOBSET_CONFIG_NAMES, 19451, "Q0E=")
    assert mut["metadata"]["name"] == "jobset-mutating-webhook-configuration"
    assert val["metadata"]["name"] == "jobset-validating-webhook-configuration"
    for doc in (mut, val):
        assert "objectSelector" not in doc["webhooks"][0]
        assert doc["webhooks"][1]["objectSelector"] == selector
        for h in doc["webhooks"]:
            assert h["clientConfig"]["url"].startswith("https://127.0.0.1:19451/")
            assert h["clientConfig"]["caBundle"] == "Q0E=" and "service" not in h["clientConfig"]
    assert val["webhooks"][1]["clientConfig"]["url"] == "https://127.0.0.1:19451/validate--v1-pod"


def test_apply_patch_refuses_what_it_cannot_apply() -> None:
    doc = {"metadata": {"name": "x"}, "webhooks": [{"name": "a"}]}
    out = trainer.apply_patch(doc, [{"op": "add", "path": "/webhooks/0/objectSelector", "value": {"k": 1}},
                                            {"op": "replace", "path": "/metadata/name", "value": "y"}])
    assert out == {"metadata": {"name": "y"}, "webhooks": [{"name": "a", "objectSelector": {"k": 1}}]}
    assert doc["metadata"]["name"] == "x"  # the input is left alone
    with pytest.raises(BootError, match="does not resolve"):
        trainer.apply_patch(doc, [{"op": "replace", "path": "/webhooks/3/name", "value": "z"}])
    with pytest.raises(BootError, match="unsupported op 'remove'"):
        trainer.apply_patch(doc, [{"op": "remove", "path": "/metadata/name"}])


def test_missing_shared_files_name_the_build_command(tmp_path: Path) -> None:
    with pytest.raises(BootError, match="build --with trainer"):
        trainer.crd_objects(tmp_path / "jobset", tmp_path / "trainer")
    with pytest.raises(BootError, match="build --with trainer"):
        trainer.runtime_object(tmp_path)
    with pytest.raises(BootError, match="build --with trainer"):
        trainer.webhook_objects(tmp_path / "m.yaml", {}, {}, 1, "")
