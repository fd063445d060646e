"""Capabilities are attributes of the provisioner contract (kfp_gpu/provisioners/base.py), never comparisons of
backend names: the steps read ``gang_forms_at_admission``, ``supports_check_capacity`` and
``capacity_via_autoscaler_groups``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kubernetes import client

from kfp_gpu.providers.fake import FakeProvider
from kfp_gpu.provisioners import backends, capabilities
from kfp_gpu.spec import ProvisioningSpec, Target
from kfp_gpu.steps import check_capacity

PKG = Path(__file__).resolve().parents[2] / "kfp_gpu"
CAPS = ("holds_placeholders", "gang_forms_at_admission", "supports_check_capacity", "capacity_via_autoscaler_groups",
        "all_or_nothing", "releases_one_node", "launches_without_pools")


def test_each_backend_s_capabilities() -> None:
    api = client.ApiClient()  # never called: the attributes are read
    got = {b.name: tuple(getattr(b, c) for c in CAPS) for b in backends(api, FakeProvider())}
    assert got == {
        "node-pool": (False, False, False, False, False, True, False),
        "provisioning-request": (False, False, True, True, True, False, False),
        "kueue-admission": (False, True, False, False, False, False, False),
        "karpenter": (True, False, False, False, False, True, True),
        "compute-class": (True, False, False, False, False, False, True),
    }


def test_capabilities_by_recorded_name_are_the_backend_s_own() -> None:
    api = client.ApiClient()
    for b in backends(api, FakeProvider()):
        cls = capabilities(b.name)
        assert cls is not None and all(getattr(cls, c) == getattr(b, c) for c in CAPS), b.name
    assert capabilities("unknown") is None  # preflight without a cluster


def test_a_backend_that_supports_check_capacity_is_asked_directly() -> None:
    spec = ProvisioningSpec("a100-40gb", 2, target=Target(provisioner="provisioning-request"))
    chosen, why_not = check_capacity.backend(spec, client.ApiClient(), None)  # the spec's choice: no API call
    assert chosen["name"] == "provisioning-request" and why_not == ""


NAMES = ("node-pool", "provisioning-request", "kueue-admission", "karpenter", "compute-class")
_ALT = "|".join(NAMES)
COMPARE = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({_ALT})["']|["']({_ALT})["']\s*(==|!=)""")


@pytest.mark.parametrize("layer", ["steps", "plan", "controller", "cluster", "gang", "jobkinds"])
def test_no_layer_above_the_backends_compares_their_names(layer: str) -> None:
    hits = [f"{p.relative_to(PKG)}:{i}: {line.strip()}" for p in sorted((PKG / layer).rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if COMPARE.search(line)]
    assert hits == [], "read a capability of the contract instead:\n" + "\n".join(hits)
