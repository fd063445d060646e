"""The owner a step records in its GpuGang (detect_identity) and the lease_ttl_s bound (no cluster needed)."""

from __future__ import annotations

import os
import socket

import pytest
from kubernetes import client

from kfp_gpu.cluster.lease import detect_identity, owner_refs
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.plan.lease import OwnerRef
from kfp_gpu.spec import ProvisioningSpec


def _unreachable() -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: nothing answers
    cfg.retries = 0
    return client.ApiClient(cfg)


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


def test_lease_ttl_minimum_is_named_in_the_error():
    ProvisioningSpec("nvidia-h100-80gb", 1, lease_ttl_s=10)
    with pytest.raises(InvalidSpec, match=r"lease_ttl_s.*\[10, "):
        ProvisioningSpec("nvidia-h100-80gb", 1, lease_ttl_s=9.5)
