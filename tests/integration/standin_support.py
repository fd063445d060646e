"""The one lifecycle of a stand-in world in an integration fixture (GKE ``SimServer`` or AWS ``AwsSimServer``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from kubernetes import client

S = TypeVar("S")


def serving(server: S, kube: Any, cluster: str) -> Iterator[S]:
    """A fixture body: start ``server``, yield it, then stop it and delete its world's Nodes (those labelled
    ``kfp-gpu.io/sim-cluster=<cluster>``). Use as ``yield from serving(server, kube, cluster)``."""
    server.start()  # type: ignore[attr-defined]
    yield server
    server.stop()  # type: ignore[attr-defined]
    core = client.CoreV1Api(kube.api)
    for n in core.list_node(label_selector=f"kfp-gpu.io/sim-cluster={cluster}").items:
        core.delete_node(n.metadata.name)
