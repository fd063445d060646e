"""The ProvisioningRequest CRD (``autoscaling.x-k8s.io/v1``), taken from cluster-autoscaler's ``apis`` module.

GKE serves this CRD in every cluster, so the dev cluster installs it on every ``up``, with or without the
cluster-autoscaler profile (the GKE stand-in's ``queued-provisioning.gke.io`` class needs it too).

Source: ``config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml`` of ``k8s.io/autoscaler/cluster-autoscaler/apis``
at the version the pinned cluster-autoscaler's go.mod requires (upstream builds CA against ``./apis``; the module
proxy serves only that older version). That version ships the API as ``v1beta1`` only; the CA binary is built with
the same package renamed to ``v1`` (:func:`kfp_gpu_rehearsal.devcluster.autoscaler._apis_v1_copy`), so the CRD is
renamed the same way: version ``v1``, the schema unchanged (docs/architecture.md, verified facts).

The renamed CRD is generated once (``go list -m`` / ``go mod download``, seconds with a warm module cache) into
``<cache>/share/provreq-crd-<ca version>/provisioningrequests-v1.json``; the build does it, so ``up`` needs no
Go toolchain afterwards. Nothing of it is committed to the repository.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from .versions import share_dir

CRD_NAME = "provisioningrequests.autoscaling.x-k8s.io"
CRD_PATH_IN_MODULE = "config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml"
SERVED_VERSION = "v1"
UPSTREAM_VERSION = "v1beta1"


class CrdError(RuntimeError):
    """The CRD could not be produced (no Go toolchain, module download failed, unexpected upstream shape)."""


def as_v1(crd: dict[str, Any]) -> dict[str, Any]:
    """The upstream CRD with its one ``v1beta1`` version renamed to ``v1`` (served, storage); pure.

    Raises: CrdError when the document is not the ProvisioningRequest CRD with exactly one version
    named ``v1beta1`` or ``v1`` (a newer apis module: review the rename).
    """
    if crd.get("kind") != "CustomResourceDefinition" or (crd.get("metadata") or {}).get("name") != CRD_NAME:
        raise CrdError(f"not the {CRD_NAME} CRD: kind={crd.get('kind')!r} name={(crd.get('metadata') or {}).get('name')!r}")
    versions = (crd.get("spec") or {}).get("versions") or []
    names = [v.get("name") for v in versions]
    if len(versions) != 1 or names[0] not in (UPSTREAM_VERSION, SERVED_VERSION):
        raise CrdError(f"{CRD_NAME}: expected one version v1beta1 (or v1), found {names}; review provreq_crd.as_v1")
    out: dict[str, Any] = json.loads(json.dumps(crd))
    v = out["spec"]["versions"][0]
    v["name"], v["served"], v["storage"] = SERVED_VERSION, True, True
    out["metadata"] = {"name": CRD_NAME, "annotations": dict((crd.get("metadata") or {}).get("annotations") or {})}
    out.pop("status", None)
    return out


def crd_file(ca_version: str) -> Path:
    return share_dir("provreq-crd", ca_version) / "provisioningrequests-v1.json"


def _go(args: list[str], env: dict[str, str]) -> Any:
    proc = subprocess.run(["go", *args], env=env, capture_output=True, text=True, cwd=Path("/"))
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-10:])
        raise CrdError(f"`go {' '.join(args)}` failed ({proc.returncode}):\n{tail}")
    return json.loads(proc.stdout)


def ensure_crd_file() -> Path:
    """Generate the renamed CRD into the cache unless present; returns its path.

    Raises: CrdError (no ``go`` on PATH, module download failure, unexpected CRD shape).
    """
    from .autoscaler import APIS_MODULE, MODULE, go_env, version

    ver = version()
    out = crd_file(ver)
    if out.exists():
        return out
    if shutil.which("go") is None:
        raise CrdError(f"{out} is missing and the Go toolchain ('go') is not on PATH to generate it; install Go "
                       "or run `python -m kfp_gpu_rehearsal.devcluster build` where Go is available")
    env = go_env()
    env.pop("GOFLAGS", None)  # -mod=mod is meaningless outside a module and `go list -m` rejects it
    gomod = _go(["list", "-m", "-json", f"{MODULE}@{ver}"], env)["GoMod"]
    requires = _go(["mod", "edit", "-json", gomod], env).get("Require") or []
    apis_ver = next((r["Version"] for r in requires if r["Path"] == APIS_MODULE), "")
    if not apis_ver:
        raise CrdError(f"{MODULE}@{ver}: go.mod does not require {APIS_MODULE}")
    src = Path(_go(["mod", "download", "-json", f"{APIS_MODULE}@{apis_ver}"], env)["Dir"]) / CRD_PATH_IN_MODULE
    if not src.exists():
        raise CrdError(f"{APIS_MODULE}@{apis_ver} has no {CRD_PATH_IN_MODULE}")
    crd = as_v1(yaml.safe_load(src.read_text()))
    crd["metadata"]["annotations"]["kfp-gpu.io/source"] = f"{APIS_MODULE}@{apis_ver}/{CRD_PATH_IN_MODULE} (v1beta1 renamed v1)"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(crd))
    tmp.rename(out)
    return out


def load() -> dict[str, Any]:
    """The v1 CRD object (generated on first use). Raises: CrdError."""
    data: dict[str, Any] = json.loads(ensure_crd_file().read_text())
    return data
