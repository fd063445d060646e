"""The rehearsal world is a distribution of its own (kfp_gpu_rehearsal/pyproject.toml), versioned in lockstep with
kfp-gpu and installed by its ``rehearsal`` extra; the product's wheel carries none of it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]


def _toml(path: Path) -> dict:  # type: ignore[type-arg]
    return tomllib.loads(path.read_text())


def test_versions_move_in_lockstep_and_the_extra_pins_the_same() -> None:
    product = _toml(ROOT / "pyproject.toml")["project"]
    rehearsal = _toml(ROOT / "kfp_gpu_rehearsal" / "pyproject.toml")["project"]
    v = product["version"]
    assert rehearsal["version"] == v
    assert product["optional-dependencies"]["rehearsal"] == [f"kfp-gpu-rehearsal=={v}"]
    assert f"kfp-gpu=={v}" in rehearsal["dependencies"]


def test_the_product_wheel_packages_no_rehearsal_module() -> None:
    include = _toml(ROOT / "pyproject.toml")["tool"]["setuptools"]["packages"]["find"]["include"]
    pkgs = find_packages(str(ROOT), include=include)
    assert "kfp_gpu" in pkgs and "kfp_gpu.steps" in pkgs
    assert [p for p in pkgs if not (p == "kfp_gpu" or p.startswith("kfp_gpu."))] == []
    assert [p for p in pkgs if p.split(".")[1:2] in (["sim"], ["devcluster"])] == []
    data = _toml(ROOT / "pyproject.toml")["tool"]["setuptools"]["package-data"]["kfp_gpu"]
    assert [d for d in data if d.startswith(("sim/", "devcluster/"))] == []


def test_the_rehearsal_distribution_lists_every_package_it_has() -> None:
    cfg = _toml(ROOT / "kfp_gpu_rehearsal" / "pyproject.toml")["tool"]["setuptools"]
    have = sorted("kfp_gpu_rehearsal" + ("." + ".".join(p.parent.relative_to(ROOT / "kfp_gpu_rehearsal").parts)
                                         if p.parent != ROOT / "kfp_gpu_rehearsal" else "")
                  for p in (ROOT / "kfp_gpu_rehearsal").rglob("__init__.py"))
    assert sorted(cfg["packages"]) == have
