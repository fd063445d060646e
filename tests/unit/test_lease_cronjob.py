"""The janitor CronJob runs a `kfp-gpu gc` command line the CLI accepts, as a ServiceAccount rbac.yaml defines."""

from __future__ import annotations

from pathlib import Path

import yaml

from kfp_gpu.cli import parser

ROOT = Path(__file__).resolve().parents[2]


def _pod_spec() -> dict:
    cron = yaml.safe_load((ROOT / "deploy/janitor-cronjob.yaml").read_text())
    return cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def test_cronjob_command_parses_and_sweeps_every_namespace():
    (container,) = _pod_spec()["containers"]
    command = container["command"]
    assert command[:2] == ["kfp-gpu", "gc"]
    args = parser().parse_args(command[1:])
    assert args.all_namespaces and not args.dry_run and args.run == []


def test_cronjob_lock_namespace_comes_from_the_downward_api():
    (container,) = _pod_spec()["containers"]
    env = {e["name"]: e for e in container.get("env", [])}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_cronjob_service_account_is_defined_in_rbac_manifest():
    sa = _pod_spec()["serviceAccountName"]
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/rbac.yaml").read_text()) if d]
    assert any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == sa for d in docs)
    assert any(d["kind"] == "ClusterRoleBinding" and any(s["name"] == sa for s in d.get("subjects") or [])
               for d in docs), f"{sa} must be bound cluster-wide for --all-namespaces"
