"""Shared helpers for stand-in tests: scenario builders and real google clients on a SimServer."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import yaml
from google.api_core.client_options import ClientOptions
from google.oauth2.credentials import Credentials

from kfp_gpu import iam
from kfp_gpu_rehearsal.sim import SimServer, from_dict
from kfp_gpu_rehearsal.sim.state import NodeBackend

PROJECT = "local-project"
CLUSTER = "kfp-gpu-local"
REGION = "us-central1"
PARENT = f"projects/{PROJECT}/locations/{REGION}/clusters/{CLUSTER}"


def default_dict() -> dict[str, Any]:
    from importlib import resources

    text = resources.files("kfp_gpu_rehearsal.sim").joinpath("scenarios/default.yaml").read_text()
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def scenario(**overrides: Any) -> dict[str, Any]:
    data = copy.deepcopy(default_dict())
    data.update(overrides)
    return data


def client_kwargs(url: str, token: str = iam.SIM_GCP_TOKEN) -> dict[str, Any]:
    """Real REST client arguments for the stand-in, as the principal of ``token`` (default: the controller's role)."""
    return {"transport": "rest", "credentials": Credentials(token=token),
            "client_options": ClientOptions(api_endpoint=url)}


@contextmanager
def running(data: dict[str, Any] | None = None, *, kubeconfig: str | None = None,
            backend: NodeBackend | None = None) -> Iterator[SimServer]:
    sim = SimServer(from_dict(data if data is not None else default_dict()), kubeconfig, backend=backend)
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()
