"""The optional components of the local cluster: one registry entry each.

An extra is an upstream controller (or emulator) the base control plane does not need: Kueue, Karpenter's kwok
provider, JobSet + Kubeflow Trainer v2, fake-gcs-server. Each is

- **built** by ``build`` (``"module:function"``): ``function(*, wait_for_others: bool = True) -> Path`` builds the
  binary into the cache unless it is there (skips when present) and raises its own ``RuntimeError`` subclass;
- **run** as the row of :data:`kfp_gpu_rehearsal.devcluster.table.UNITS` of the same name (the ``UNIT`` of its ``profile``
  module), by the one runner (:mod:`kfp_gpu_rehearsal.devcluster.runner`: start, stop, status, fingerprint).

``python -m kfp_gpu_rehearsal.devcluster build --with NAME`` / ``up --with NAME`` (and ``down --only NAME``) select them; the
older flags (``--with-kueue``, ``--kueue``, ``--autoscaler karpenter``...) map onto these names. Order matters for
``up`` (the registry order) and ``down`` (reverse): a component whose webhooks guard others' objects goes first on
the way down.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


@dataclass(frozen=True)
class Extra:
    name: str
    build: str  # "module:function", relative modules under kfp_gpu_rehearsal.devcluster
    profile: str  # module under kfp_gpu_rehearsal.devcluster
    help: str

    def build_fn(self) -> Callable[..., Path]:
        mod, _, fn = self.build.partition(":")
        fn_obj: Callable[..., Path] = getattr(importlib.import_module(f"kfp_gpu_rehearsal.devcluster.{mod}"), fn)
        return fn_obj

    def profile_module(self) -> ModuleType:
        return importlib.import_module(f"kfp_gpu_rehearsal.devcluster.{self.profile}")


EXTRAS: tuple[Extra, ...] = (
    # trainer before kueue: Kueue enables its TrainJob/JobSet integrations only when their CRDs exist at its start;
    # on the way down Kueue (whose webhooks then guard TrainJobs and JobSets) stops first
    Extra("trainer", "trainer:build", "trainer_profile",
          "the real JobSet and Kubeflow Trainer v2 controllers, their CRDs and webhooks, and the torch-distributed "
          "ClusterTrainingRuntime (sigs.k8s.io/jobset, github.com/kubeflow/trainer/v2)"),
    Extra("kueue", "kueue:build", "kueue_profile",
          "the real Kueue controller with its CRDs and webhooks (sigs.k8s.io/kueue)"),
    Extra("gcs", "gcs:build", "gcs_profile",
          "fake-gcs-server, a GCS emulator for gs:// checkpoints (STORAGE_EMULATOR_HOST; github.com/fsouza/fake-gcs-server)"),
    Extra("karpenter", "karpenter:build", "karpenter_profile",
          "Karpenter with its kwok cloud provider, AWS GPU instance types and stockouts, no default NodePool "
          "(sigs.k8s.io/karpenter/kwok)"),
    # last: the kfp-gpu controller of this tree (nothing to build), for $KFP_GPU_CONTROLLER_NAMESPACES
    Extra("controller", "controller_profile:build", "controller_profile",
          "the kfp-gpu controller (this tree's code) under its ServiceAccount token, for the namespaces in "
          "$KFP_GPU_CONTROLLER_NAMESPACES (default kfp-gpu-dev)"),
)


class UnknownExtra(ValueError):
    pass


def names() -> tuple[str, ...]:
    return tuple(e.name for e in EXTRAS)


def get(name: str) -> Extra:
    """Raises: UnknownExtra naming the choices."""
    for e in EXTRAS:
        if e.name == name:
            return e
    raise UnknownExtra(f"unknown local-cluster component {name!r}: choose from {', '.join(names())}")


def select(wanted: Iterable[str]) -> tuple[Extra, ...]:
    """The registry entries named in ``wanted``, in registry order. Raises: UnknownExtra."""
    want = set(wanted)
    for n in want:
        get(n)
    return tuple(e for e in EXTRAS if e.name in want)


AUTOSCALERS = ("none", "cluster-autoscaler", "karpenter")


def parse_autoscaler(text: str) -> tuple[bool, tuple[str, ...]]:
    """``--autoscaler`` as (run cluster-autoscaler?, extras): one of :data:`AUTOSCALERS` or a comma list of them
    (``cluster-autoscaler,karpenter``); ``karpenter`` is the registry entry of that name.

    Raises: UnknownExtra naming the choices.
    """
    parts = [p.strip() for p in (text or "none").split(",") if p.strip()]
    bad = [p for p in parts if p not in AUTOSCALERS]
    if bad or not parts:
        raise UnknownExtra(f"--autoscaler {text!r}: choose one of {', '.join(AUTOSCALERS)}, or a comma list of them")
    return "cluster-autoscaler" in parts, tuple(p for p in parts if p not in ("none", "cluster-autoscaler"))
