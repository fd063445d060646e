"""A small handle on the running dev cluster, for tests and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kubernetes import client

from . import boot, crds


@dataclass(frozen=True)
class Kube:
    kubeconfig: Path
    api: client.ApiClient

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)


def connect(kubeconfig: Path | None = None) -> Kube:
    """Client for an already running cluster (no boot)."""
    kc = kubeconfig or boot.kubeconfig_path()
    return Kube(kubeconfig=kc, api=crds.api_client(kc))


def ensure_up() -> Kube:
    """Boot the cluster (idempotent: a running healthy cluster is re-used) and connect."""
    ctx = boot.up()
    return connect(ctx.kubeconfig)
