"""Heartbeat arguments, the owner it records, and the lease_ttl_s bound (no cluster needed)."""

from __future__ import annotations

import os
import socket

import pytest
from kubernetes import client

from kfp_gpu.cluster.lease import Heartbeat, detect_identity, lease_name, owner_refs
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.plan.lease import OwnerRef
from kfp_gpu.spec import ProvisioningSpec


def _unreachable() -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: nothing answers
    cfg.retries = 0
    return client.ApiClient(cfg)


def test_default_interval_is_a_quarter_of_the_ttl_capped_at_five_minutes():
    assert Heartbeat(_unreachable(), "ns", "run", "train", 10.0).interval_s == 2.5
    assert Heartbeat(_unreachable(), "ns", "run", "train", 6 * 3600.0).interval_s == 300.0


@pytest.mark.parametrize("ttl,interval", [(0.0, None), (-1.0, None), (10.0, 10.0), (10.0, 0.0)])
def test_bad_ttl_or_interval_is_refused(ttl, interval):
    with pytest.raises(ValueError, match="ttl_s"):
        Heartbeat(_unreachable(), "ns", "run", "train", ttl, interval_s=interval)


def test_owner_before_any_renewal_is_now_plus_ttl():
    clock = iter([1000.0]).__next__
    hb = Heartbeat(_unreachable(), "ns", "Run_1", "train", 60.0, clock=clock)
    assert (hb.owner.run_id, hb.owner.step, hb.owner.lease_expires) == ("Run_1", "train", 1060.0)


def test_a_renewal_that_cannot_reach_the_cluster_is_logged_not_raised():
    hb = Heartbeat(_unreachable(), "ns", "run", "train", 60.0)
    before = hb.owner.lease_expires
    assert hb.renew() is False
    assert hb.failures == 2 and hb.last_error.startswith("labels:")
    assert hb.owner.lease_expires == before  # nothing renewed: the owner's expiry does not move


def test_identity_outside_a_pod_is_local_host_and_pid():
    if os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/namespace"):
        pytest.fail("this test must run outside a pod")
    ident = detect_identity(_unreachable(), "ns", env={})
    assert ident.local == f"local:{socket.gethostname()}:{os.getpid()}"
    assert not ident.pod and owner_refs(ident.annotations()) == (OwnerRef("local", ident.local),)


def test_identity_in_a_kfp_pod_comes_from_the_downward_api_variables():
    env = {"KFP_POD_NAME": "llm-abc-system-container-impl-123", "KFP_POD_UID": "u-1", "POD_NAMESPACE": "kubeflow"}
    ident = detect_identity(_unreachable(), "ns", env=env)  # the pod read fails: name and uid still recorded
    assert ident.pod == "kubeflow/llm-abc-system-container-impl-123" and ident.pod_uid == "u-1"
    assert ident.holder == f"llm-abc-system-container-impl-123/{os.getpid()}"
    assert owner_refs(ident.annotations()) == (OwnerRef("pod", ident.pod, "u-1"),)


def test_lease_names_are_valid_object_names():
    name = lease_name("Run_ID.with-UPPER_and_dots" * 3, "warm_pool")
    assert name.startswith("kfp-gpu-lease-") and name.endswith("-warm-pool")
    assert name == name.lower() and "_" not in name and "." not in name and len(name) <= 253


def test_lease_ttl_minimum_is_named_in_the_error():
    ProvisioningSpec("nvidia-h100-80gb", 1, lease_ttl_s=10)
    with pytest.raises(InvalidSpec, match=r"lease_ttl_s.*\[10, "):
        ProvisioningSpec("nvidia-h100-80gb", 1, lease_ttl_s=9.5)
