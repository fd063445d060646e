"""What a local rehearsal and the warm pool take from the spec and the backend: `kfp-gpu run` boots the extras
the spec needs (:func:`kfp_gpu.demo.extras_for`), and only a backend that holds its own placeholders skips the
generic warm-pool balloons (:func:`kfp_gpu.provisioners.base.holds_placeholders`)."""

from __future__ import annotations

import pytest
from kubernetes import client

from kfp_gpu.demo import extras_for
from kfp_gpu.devcluster import extras
from kfp_gpu.providers.fake import FakeProvider
from kfp_gpu.provisioners import backends
from kfp_gpu.provisioners.base import holds_placeholders
from kfp_gpu.spec import ProvisioningSpec, Target
from pipelines.llm_finetune import SPEC as GKE_EXAMPLE
from pipelines.llm_finetune_eks import SPEC as EKS_EXAMPLE
from pipelines.llm_finetune_karpenter import SPEC as KARPENTER_EXAMPLE


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


def test_only_the_karpenter_backend_holds_its_own_placeholders() -> None:
    api = client.ApiClient()  # never called: the attribute is read from the backend objects
    got = {b.name: holds_placeholders(b) for b in backends(api, FakeProvider())}
    assert got == {"node-pool": False, "provisioning-request": False, "kueue-admission": False, "karpenter": True}
