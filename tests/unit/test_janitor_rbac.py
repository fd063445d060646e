"""The janitor (`kfp-gpu gc`, an admin tool since the controller releases gangs whose owner is gone): the documented
command line parses, and deploy/janitor-rbac.yaml defines its ServiceAccount and binds it cluster-wide."""

from __future__ import annotations

from pathlib import Path

import yaml

from kfp_gpu.cli import parser

ROOT = Path(__file__).resolve().parents[2]
SA = "kfp-gpu-janitor"


def test_the_documented_gc_command_parses_and_sweeps_every_namespace():
    args = parser().parse_args(["gc", "--all-namespaces"])
    assert args.all_namespaces and not args.dry_run and args.run == []


def test_janitor_service_account_is_defined_and_bound_cluster_wide():
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/janitor-rbac.yaml").read_text()) if d]
    assert any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == SA for d in docs)
    assert any(d["kind"] == "ClusterRoleBinding" and any(s["name"] == SA for s in d.get("subjects") or [])
               for d in docs), f"{SA} must be bound cluster-wide for --all-namespaces"
    assert not [d for d in docs if d["kind"] not in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole",
                                                      "ClusterRoleBinding")], "RBAC only: no CronJob ships"
