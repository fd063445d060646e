"""Pinned component versions (versions.env) and cache locations."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kfp_gpu import rehearsal_seam

VERSIONS_FILE = Path(__file__).with_name("versions.env")


def cache_dir() -> Path:
    """Root of the build/state cache (outside the repo; :func:`kfp_gpu.rehearsal_seam.cache_dir`)."""
    return rehearsal_seam.cache_dir()


def bin_dir() -> Path:
    return cache_dir() / "bin"


def share_dir(name: str, version: str) -> Path:
    """Non-binary artifacts copied out of a module at build time (CRDs, manifests)."""
    return cache_dir() / "share" / f"{name}-{version}"


def cluster_dir() -> Path:
    return rehearsal_seam.cluster_dir()


def load_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}: bad line {raw!r} (want KEY=value)")
        out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    etcd: str
    kwok: str
    training_operator: str
    cluster_autoscaler: str

    @classmethod
    def load(cls) -> Versions:
        v = load_versions()
        return cls(
            kubernetes=v["KUBERNETES_VERSION"],
            etcd=v["ETCD_VERSION"],
            kwok=v["KWOK_VERSION"],
            training_operator=v["TRAINING_OPERATOR_VERSION"],
            cluster_autoscaler=v.get("CLUSTER_AUTOSCALER_VERSION", ""),
        )

    @property
    def staging(self) -> str:
        """Version of the k8s.io staging modules (v1.34.4 -> v0.34.4)."""
        return "v0" + self.kubernetes[2:]


def binary_path(name: str, version: str) -> Path:
    return bin_dir() / f"{name}-{version}"


def binaries(v: Versions | None = None) -> dict[str, Path]:
    """Paths of the control-plane binaries, keyed by component name."""
    v = v or Versions.load()
    return {
        "etcd": binary_path("etcd", v.etcd),
        "kube-apiserver": binary_path("kube-apiserver", v.kubernetes),
        "kube-controller-manager": binary_path("kube-controller-manager", v.kubernetes),
        "kube-scheduler": binary_path("kube-scheduler", v.kubernetes),
        "kwok": binary_path("kwok", v.kwok),
        "training-operator": binary_path("training-operator", v.training_operator),
    }
