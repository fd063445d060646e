"""What a local rehearsal and the warm pool take from the spec and the backend: `kfp-gpu run` boots the extras
the spec needs (:func:`kfp_gpu_rehearsal.demo.extras_for`), and only a backend that holds its own placeholders skips the
generic warm-pool balloons (:func:`kfp_gpu.provisioners.base.holds_placeholders`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from kfp_gpu.providers.fake import FakeProvider
from kfp_gpu.provisioners import backends
from kfp_gpu.provisioners.base import holds_placeholders
from kfp_gpu.spec import ProvisioningSpec, Target
from kfp_gpu_rehearsal.demo import aws_standin_port, extras_for
from kfp_gpu_rehearsal.devcluster import extras
from pipelines.llm_finetune import SPEC as GKE_EXAMPLE
from pipelines.llm_finetune_eks import SPEC as EKS_EXAMPLE
from pipelines.llm_finetune_karpenter import SPEC as KARPENTER_EXAMPLE

ROOT = Path(__file__).resolve().parents[2]


def _spec(provisioner: str = "auto", ckpt: str = "") -> ProvisioningSpec:
    return ProvisioningSpec("a100-40gb", 2, target=Target(provisioner=provisioner), checkpoint_uri=ckpt)


@pytest.mark.parametrize("spec,want", [
    (_spec(), ()),
    (_spec("node-pool", "/tmp/ckpt"), ()),
    (_spec("provisioning-request", "s3://b/ckpt"), ()),
    (_spec(ckpt="gs://bucket/ckpt"), ("gcs",)),
    (_spec("karpenter"), ("karpenter",)),
    (_spec("karpenter", "gs://bucket/ckpt"), ("gcs", "karpenter")),
    (GKE_EXAMPLE, ()),
    (EKS_EXAMPLE, ()),
    (KARPENTER_EXAMPLE, ("karpenter",)),
])
def test_extras_for_the_spec(spec: ProvisioningSpec, want: tuple[str, ...]) -> None:
    assert extras_for(spec) == want


def test_every_extra_named_is_a_registered_component() -> None:
    chosen = extras.select(extras_for(_spec("karpenter", "gs://b/c")))  # boot.up raises on an unknown name
    assert [e.name for e in chosen] == ["gcs", "karpenter"]


def test_only_the_karpenter_and_compute_class_backends_hold_their_own_placeholders() -> None:
    api = client.ApiClient()  # never called: the attribute is read from the backend objects
    got = {b.name: holds_placeholders(b) for b in backends(api, FakeProvider())}
    assert got == {"node-pool": False, "provisioning-request": False, "kueue-admission": False, "karpenter": True,
                   "compute-class": True}


def test_only_the_provisioning_request_backend_is_all_or_nothing() -> None:
    """The contract attribute the compute-class backend reads to hand a multi-node flex-start gang over."""
    api = client.ApiClient()
    got = {b.name: b.all_or_nothing for b in backends(api, FakeProvider())}
    assert got == {"node-pool": False, "provisioning-request": True, "kueue-admission": False, "karpenter": False,
                   "compute-class": False}


@pytest.mark.parametrize("kind,endpoint,want", [
    ("eks", "http://127.0.0.1:8788", 8788),
    ("eks", "http://localhost:9000/", 9000),
    ("eks", "http://127.0.0.1", 8788),
    ("eks", "", None),  # real AWS
    ("eks", "https://eks.us-east-1.amazonaws.com", None),
    ("eks", "http://10.0.0.5:8788", None),  # not this machine: nothing to start
    ("local", "http://127.0.0.1:8788", None),
])
def test_the_rehearsal_starts_the_aws_standin_an_eks_target_names(kind: str, endpoint: str, want: int | None) -> None:
    region = "us-east-1" if kind == "eks" else "us-central1"
    spec = ProvisioningSpec("a100-40gb", 1, target=Target(kind=kind, endpoint=endpoint, region=region))  # type: ignore[arg-type]
    assert aws_standin_port(spec) == want


def test_the_eks_examples_name_the_default_aws_standin() -> None:
    from kfp_gpu_rehearsal.sim.daemon import AWS_PORT

    assert aws_standin_port(EKS_EXAMPLE) == aws_standin_port(KARPENTER_EXAMPLE) == AWS_PORT


def test_the_karpenter_example_compiles_with_the_pipeline_s_steps(tmp_path: Path) -> None:
    from kfp_gpu.compile import compile_pipeline, dag_edges

    out = compile_pipeline(ROOT / "pipelines" / "llm_finetune_karpenter.py", tmp_path / "p.yaml")
    edges = dag_edges(out)
    assert {"quota-preflight", "reserve-warm-pool", "burst-scale-up", "train-pytorchjob", "teardown"} <= set(edges)
    assert 'provisioner":"karpenter' in out.read_text()  # the spec compiled into the steps' spec_json


def test_the_computeclass_example_compiles_with_its_chain(tmp_path: Path) -> None:
    from kfp_gpu.compile import compile_pipeline, dag_edges
    from kfp_gpu.plan import computeclass as cc
    from pipelines.llm_finetune_computeclass import SPEC as CC_EXAMPLE

    out = compile_pipeline(ROOT / "pipelines" / "llm_finetune_computeclass.py", tmp_path / "p.yaml")
    assert {"quota-preflight", "burst-scale-up", "train-pytorchjob", "teardown"} <= set(dag_edges(out))
    text = out.read_text()
    assert 'provisioner":"compute-class' in text and 'fallback":["flex-start","spot","on-demand"]' in text
    cc.check(CC_EXAMPLE)  # nothing GKE refuses
    assert cc.split(CC_EXAMPLE, class_atomic=False) == (True, ["reservation", "spot", "on-demand"])
