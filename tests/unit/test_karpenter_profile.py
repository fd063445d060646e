"""The Karpenter profile's instance-types file (kfp_gpu_rehearsal.devcluster.karpenter_types) and its process flags, without a
cluster: AWS shapes, one offering per zone and capacity type, prices, the stockouts the profile documents."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kfp_gpu import accelerators
from kfp_gpu_rehearsal.devcluster import karpenter, karpenter_profile, karpenter_types, procs
from kfp_gpu_rehearsal.devcluster.runner import Ctx
from kfp_gpu_rehearsal.devcluster.versions import Versions

AWS_NAME = re.compile(r"^\w+\.(nano|micro|small|medium|large|\d*xlarge|metal)$")  # the kwok provider's awsRegexp

# AWS's published shapes: (GPUs, vCPUs, memory GiB). docs/local-cluster.md cites the instance-type pages.
AWS_SHAPES = {
    "p4d.24xlarge": (8, 96, 1152),
    "p5.48xlarge": (8, 192, 2048),
    "g6.xlarge": (1, 4, 16),
    "g6.2xlarge": (1, 8, 32),
    "g6.4xlarge": (1, 16, 64),
    "g6.8xlarge": (1, 32, 128),
    "g6.16xlarge": (1, 64, 256),
    "g6.12xlarge": (4, 48, 192),
    "g6.24xlarge": (4, 96, 384),
    "g6.48xlarge": (8, 192, 768),
}


def _file(tmp_path: Path) -> list[dict]:
    return json.loads(karpenter_types.instance_types_file(tmp_path / "types.json").read_text())


def _req(offering: dict, key: str) -> str:
    [r] = [r for r in offering["Requirements"] if r["key"] == key]
    assert r["operator"] == "In" and len(r["values"]) == 1, r
    return str(r["values"][0])


def test_types_have_the_aws_shapes(tmp_path: Path) -> None:
    got = {t["name"]: t for t in _file(tmp_path)}
    assert set(got) == set(AWS_SHAPES)
    for name, (gpus, cpu, mem) in AWS_SHAPES.items():
        res = got[name]["resources"]
        assert AWS_NAME.match(name), name
        assert (res["nvidia.com/gpu"], res["cpu"], res["memory"]) == (str(gpus), str(cpu), f"{mem}Gi"), name
        assert got[name]["architecture"] == "amd64" and got[name]["operatingSystems"] == ["linux"]


def test_types_agree_with_the_accelerator_catalog() -> None:
    for t in karpenter_types.INSTANCE_TYPES:
        acc = accelerators.get(t.accelerator)
        shapes = {m.name: m for m in acc.aws_instances}
        if t.name in shapes:  # the catalog lists the sizes kfp-gpu plans with; the file has more g6 sizes
            assert (shapes[t.name].gpus, shapes[t.name].vcpus) == (t.gpus, t.vcpus), t.name
    catalog_types = {m.name for a in ("a100-40gb", "h100-80gb", "l4") for m in accelerators.get(a).aws_instances}
    assert catalog_types <= {t.name for t in karpenter_types.INSTANCE_TYPES}


def test_one_offering_per_zone_and_capacity_type_with_gpu_labels(tmp_path: Path) -> None:
    for t in _file(tmp_path):
        keys = [(_req(o, "topology.kubernetes.io/zone"), _req(o, "karpenter.sh/capacity-type")) for o in t["offerings"]]
        assert sorted(keys) == sorted((z, c) for z in ("us-east-1a", "us-east-1b", "us-east-1c")
                                      for c in ("on-demand", "spot")), t["name"]
        for o in t["offerings"]:
            assert _req(o, "karpenter.k8s.aws/instance-gpu-count") == t["resources"]["nvidia.com/gpu"]
            assert _req(o, "karpenter.k8s.aws/instance-gpu-manufacturer") == "nvidia"
        assert {_req(o, "karpenter.k8s.aws/instance-gpu-name") for o in t["offerings"]} == \
            {karpenter_types.get(t["name"]).gpu_name}


def test_prices_on_demand_flat_across_zones_spot_cheaper_and_zonal(tmp_path: Path) -> None:
    for t in _file(tmp_path):
        od = {o["Price"] for o in t["offerings"] if _req(o, "karpenter.sh/capacity-type") == "on-demand"}
        spot = [o["Price"] for o in t["offerings"] if _req(o, "karpenter.sh/capacity-type") == "spot"]
        assert len(od) == 1 and od.pop() == karpenter_types.ON_DEMAND_USD[t["name"]]
        assert len(set(spot)) == 3, t["name"]  # spot prices differ by zone
        assert max(spot) < karpenter_types.ON_DEMAND_USD[t["name"]] * 0.6, t["name"]
    assert karpenter_types.ON_DEMAND_USD["p5.48xlarge"] > karpenter_types.ON_DEMAND_USD["p4d.24xlarge"] > \
        karpenter_types.ON_DEMAND_USD["g6.48xlarge"]


def test_stockouts_are_the_unavailable_offerings_and_each_has_an_alternative(tmp_path: Path) -> None:
    unavailable = {(t["name"], _req(o, "topology.kubernetes.io/zone"), _req(o, "karpenter.sh/capacity-type"))
                   for t in _file(tmp_path) for o in t["offerings"] if o["Available"] is False}
    assert unavailable == set(karpenter_types.STOCKOUTS)
    assert ("p4d.24xlarge", "us-east-1c", "spot") in unavailable  # the one the integration test launches into
    for name, zone, ct in unavailable:
        assert karpenter_types.in_stock(name, zone, "spot" if ct == "on-demand" else "on-demand") or any(
            karpenter_types.in_stock(name, z, ct) for z in karpenter_types.ZONES if z != zone), (name, zone, ct)


def test_file_is_rewritten_only_when_its_content_changes(tmp_path: Path) -> None:
    p = karpenter_types.instance_types_file(tmp_path / "t.json")
    mtime = p.stat().st_mtime_ns
    p2 = karpenter_types.instance_types_file(tmp_path / "t.json")
    assert p2.stat().st_mtime_ns == mtime
    p.write_text("[]")
    assert json.loads(karpenter_types.instance_types_file(p).read_text()) == karpenter_types.instance_types()


def test_unknown_instance_type_names_the_choices() -> None:
    with pytest.raises(KeyError, match="p4d.24xlarge"):
        karpenter_types.get("p3.2xlarge")


def _ctx(tmp_path: Path) -> Ctx:
    c = Ctx(state=tmp_path, pki=tmp_path / "pki", bins={}, ports={}, versions=Versions.load())
    return karpenter_profile.context(c)


def test_process_runs_out_of_cluster_on_loopback_with_stockouts(tmp_path: Path) -> None:
    c = _ctx(tmp_path)
    argv, env = karpenter_profile._argv(c), karpenter_profile._env(c)
    assert f"--instance-types-file-path={tmp_path / 'karpenter' / 'instance-types.json'}" in argv
    assert "--disable-leader-election=true" in argv
    ports = {c.ports["karpenter-metrics"], c.ports["karpenter-health"]}
    assert {f"--metrics-port={c.ports['karpenter-metrics']}", f"--health-probe-port={c.ports['karpenter-health']}"} \
        <= set(argv) and len(ports) == 2
    assert env["KUBECONFIG"] == str(tmp_path / "kubeconfig")
    assert env[karpenter.BIND_HOST_ENV] == "127.0.0.1" and env[karpenter.STOCKOUTS_ENV] == "true"


def test_missing_crds_name_the_build_command(tmp_path: Path) -> None:
    with pytest.raises(procs.BootError, match="build --with karpenter"):
        karpenter_profile.crd_objects(tmp_path)


def test_source_patches_are_opt_in_by_environment() -> None:
    """Every patch hunk names the environment switch or a kfp-gpu marker, so upstream behaviour stays the default."""
    for rel, anchor, new in karpenter.PATCHES:
        assert anchor in new or "kfpgpu" in new, rel
    assert karpenter.STOCKOUTS_ENV in karpenter.NEW_FILES["kwok/cloudprovider/kfpgpu_stockouts.go"]
    assert karpenter.BIND_HOST_ENV in karpenter.NEW_FILES["pkg/operator/kfpgpu_bind.go"]
