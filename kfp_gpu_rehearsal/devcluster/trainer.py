"""Build the real JobSet and Kubeflow Trainer v2 controllers and copy what they need out of their modules.

Build: ``sigs.k8s.io/jobset`` at ``JOBSET_VERSION`` and ``github.com/kubeflow/trainer/v2`` at ``TRAINER_VERSION``
(versions.env) are each built from their Go module in a wrapper module under ``<cache>/build/<module>-<version>``
that requires it (upstream requires copied, as is its go.sum; neither has module replaces). The manager main
packages are ``sigs.k8s.io/jobset`` (``main.go`` at the module root) and
``github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager``; they land in ``<cache>/bin/jobset-<version>`` and
``<cache>/bin/trainer-<version>`` (CGO_ENABLED=0, ``-trimpath -ldflags "-s -w"``). No source change: both managers
take a config file that turns internal cert management off and points the webhook server at a cert dir.

Shared files (copied out of the module cache at build time into ``<cache>/share/<name>-<version>``, so ``up`` needs
no Go toolchain; nothing is committed): JobSet's CRD (``config/components/crd/bases``) and webhook configurations
(``config/components/webhook/manifests.yaml`` and its kustomize ``patches``); Trainer's CRDs
(``manifests/base/crds``), webhook configurations (``manifests/base/webhook/manifests.yaml`` and
``patch_{mutating,validating}.yaml``) and the ``torch-distributed`` ClusterTrainingRuntime
(``manifests/base/runtimes/torch_distributed.yaml``).

The manifest helpers (:func:`crd_objects`, :func:`webhook_objects` with upstream's kustomize patches applied,
:func:`runtime_object`) read those copies; :mod:`kfp_gpu_rehearsal.devcluster.trainer_profile` installs them.

    python -m kfp_gpu_rehearsal.devcluster.trainer build      # build both into the cache (skips when present)
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import gobuild, procs
from .versions import binary_path, cache_dir, load_versions, share_dir


class TrainerError(RuntimeError):
    """Building or running JobSet / the Trainer failed (never skipped silently)."""


@dataclass(frozen=True)
class Component:
    name: str  # binary/share name
    key: str  # versions.env key
    module: str
    package: str  # main package, relative to the module ("" = module root)
    shared: tuple[str, ...]  # files or directories (all *.yaml) copied out of the module

    def version(self) -> str:
        """Raises: TrainerError when versions.env lacks the key."""
        v = load_versions().get(self.key, "").strip()
        if not v:
            raise TrainerError(f"{self.key} is empty in kfp_gpu_rehearsal/devcluster/versions.env; set it (see trainer.py)")
        return v

    def binary(self) -> Path:
        return binary_path(self.name, self.version())

    def share(self) -> Path:
        return share_dir(self.name, self.version())


RUNTIME_FILE = "manifests/base/runtimes/torch_distributed.yaml"
JOBSET_CRD_DIR = "config/components/crd/bases"
JOBSET_WEBHOOKS = "config/components/webhook/manifests.yaml"
JOBSET_WEBHOOK_PATCHES = {"MutatingWebhookConfiguration": "config/components/webhook/patches/mutating-patch.yaml",
                          "ValidatingWebhookConfiguration": "config/components/webhook/patches/validating-patch.yaml"}
TRAINER_CRD_DIR = "manifests/base/crds"
TRAINER_WEBHOOKS = "manifests/base/webhook/manifests.yaml"
TRAINER_WEBHOOK_PATCHES = {"MutatingWebhookConfiguration": "manifests/base/webhook/patch_mutating.yaml",
                           "ValidatingWebhookConfiguration": "manifests/base/webhook/patch_validating.yaml"}
# upstream's kustomize namePrefix "jobset-" (config/default); the Trainer's names come from its patches
JOBSET_CONFIG_NAMES = {"MutatingWebhookConfiguration": "jobset-mutating-webhook-configuration",
                       "ValidatingWebhookConfiguration": "jobset-validating-webhook-configuration"}
TRAINER_CONFIG_NAMES = {"MutatingWebhookConfiguration": "defaulter.trainer.kubeflow.org",
                        "ValidatingWebhookConfiguration": "validator.trainer.kubeflow.org"}

JOBSET = Component("jobset", "JOBSET_VERSION", "sigs.k8s.io/jobset", "",
                   (JOBSET_CRD_DIR, JOBSET_WEBHOOKS, *JOBSET_WEBHOOK_PATCHES.values()))
TRAINER = Component("trainer", "TRAINER_VERSION", "github.com/kubeflow/trainer/v2", "cmd/trainer-controller-manager",
                    (TRAINER_CRD_DIR, TRAINER_WEBHOOKS, *TRAINER_WEBHOOK_PATCHES.values(), RUNTIME_FILE))
COMPONENTS = (JOBSET, TRAINER)
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def copy_shared(comp: Component, src: Path, dst: Path) -> None:
    """Copy ``comp.shared`` (directories: their *.yaml) from the module source ``src`` to ``dst``."""
    for rel in comp.shared:
        if (src / rel).is_dir():
            (dst / rel).mkdir(parents=True, exist_ok=True)
            for f in sorted((src / rel).glob("*.yaml")):
                shutil.copyfile(f, dst / rel / f.name)
        else:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, dst / rel)


def shared_present(comp: Component) -> bool:
    d = comp.share()
    return all((d / rel).exists() for rel in comp.shared)


def build_one(comp: Component, *, wait_for_others: bool = True, poll_s: float = 10.0) -> Path:
    """Build one manager into the cache and copy its manifests; a present binary is reused.

    Raises: TrainerError (missing toolchain, download or compile failure).
    """
    ver = comp.version()
    out = comp.binary()
    if out.exists() and shared_present(comp):
        return out
    if shutil.which("go") is None:
        raise TrainerError(f"the Go toolchain ('go') is not on PATH; install Go >= 1.26 to build {comp.name}")
    work = cache_dir() / "build" / f"{comp.module.replace('/', '_')}-{ver}"
    work.mkdir(parents=True, exist_ok=True)
    log = cache_dir() / "build" / f"{comp.name}-{ver}.log"

    def run(cmd: Sequence[str]) -> str:
        return gobuild.run(cmd, work, log, TrainerError)

    t0 = time.monotonic()
    run(["go", "mod", "download", f"{comp.module}@{ver}"])
    src = Path(run(["go", "env", "GOMODCACHE"]).strip()) / f"{comp.module}@{ver}"
    copy_shared(comp, src, comp.share())
    if out.exists():
        return out
    upstream = json.loads(run(["go", "mod", "edit", "-json", str(src / "go.mod")]))
    (work / "go.mod").write_text(
        gobuild.wrapper_gomod(upstream, comp.module, ver, comp.name, go=str(upstream.get("Go") or "1.26.0")))
    if not (work / "go.sum").exists():
        shutil.copyfile(src / "go.sum", work / "go.sum")
        (work / "go.sum").chmod(0o644)
    pkg = comp.module + ("/" + comp.package if comp.package else "")
    return gobuild.go_build(comp.name, pkg, out, work, log, TrainerError, what=f"{pkg}@{ver}",
                            wait_for_others=wait_for_others, poll_s=poll_s, setup_s=time.monotonic() - t0)


def build(*, wait_for_others: bool = True) -> Path:
    """Build JobSet and the Trainer (the registry's build hook); returns the Trainer binary.

    Raises: TrainerError.
    """
    build_one(JOBSET, wait_for_others=wait_for_others)
    return build_one(TRAINER, wait_for_others=wait_for_others)


def _load(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=_LOADER)  # noqa: S506 - a safe loader


def crd_objects(jobset_share: Path, trainer_share: Path) -> list[dict[str, Any]]:
    """JobSet's and the Trainer's CRDs as upstream ships them.

    Raises: procs.BootError when the shared files are missing (names the build command).
    """
    files = sorted((jobset_share / JOBSET_CRD_DIR).glob("*.yaml")) + sorted(
        f for f in (trainer_share / TRAINER_CRD_DIR).glob("*.yaml") if f.name != "kustomization.yaml")
    if not any(f.name.startswith("jobset") for f in files) or not any(f.name.startswith("trainer") for f in files):
        raise procs.BootError(f"JobSet/Trainer CRDs missing under {jobset_share} / {trainer_share}: run "
                              "`python -m kfp_gpu_rehearsal.devcluster build --with trainer`")
    return [_load(f) for f in files]


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A copy of ``doc`` with the JSON-patch ``ops`` (``add``/``replace``, as upstream's kustomize patches use) applied.

    Raises: procs.BootError for another op or a path that does not resolve (the pinned version changed).
    """
    out = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        if op.get("op") not in ("add", "replace"):
            raise procs.BootError(f"webhook patch: unsupported op {op.get('op')!r} at {op['path']}")
        parent: Any = out
        try:
            for p in parts[:-1]:
                parent = parent[int(p)] if isinstance(parent, list) else parent[p]
            last = parts[-1]
            if isinstance(parent, list):
                parent[int(last)] = copy.deepcopy(op["value"])
            else:
                if op["op"] == "replace" and last not in parent:
                    raise KeyError(last)
                parent[last] = copy.deepcopy(op["value"])
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise procs.BootError(f"webhook patch: path {op['path']} does not resolve ({e})") from None
    return out


def webhook_objects(manifest: Path, patches: dict[str, Path], names: dict[str, str], port: int,
                    ca_bundle: str) -> list[dict[str, Any]]:
    """Upstream's webhook configurations with upstream's patches, named as upstream deploys them, each
    ``clientConfig`` an URL on 127.0.0.1:``port``.

    Raises: procs.BootError when a manifest or patch is missing.
    """
    for f in (manifest, *patches.values()):
        if not f.exists():
            raise procs.BootError(f"{f} is missing: run `python -m kfp_gpu_rehearsal.devcluster build --with trainer`")
    out = []
    for doc in (d for d in yaml.safe_load_all(manifest.read_text()) if d):
        doc = apply_patch(doc, yaml.safe_load(patches[doc["kind"]].read_text()))
        for h in doc["webhooks"]:
            h["clientConfig"] = {"url": f"https://127.0.0.1:{port}{h['clientConfig']['service']['path']}",
                                 "caBundle": ca_bundle}
            h["timeoutSeconds"] = 10
        out.append({"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": {"name": names[doc["kind"]]},
                    "webhooks": doc["webhooks"]})
    return out


def runtime_object(trainer_share: Path) -> dict[str, Any]:
    """The ``torch-distributed`` ClusterTrainingRuntime, unchanged. Raises: procs.BootError when missing."""
    f = trainer_share / RUNTIME_FILE
    if not f.exists():
        raise procs.BootError(f"{f} is missing: run `python -m kfp_gpu_rehearsal.devcluster build --with trainer`")
    obj: dict[str, Any] = _load(f)
    return obj


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    names = {c.name: c for c in COMPONENTS}
    if args[:1] != ["build"] or any(a not in names for a in args[1:]):
        print("usage: python -m kfp_gpu_rehearsal.devcluster.trainer build [jobset|trainer]", file=sys.stderr)
        return 2
    try:
        for comp in [names[a] for a in args[1:]] or list(COMPONENTS):
            print(build_one(comp, wait_for_others=False))
    except TrainerError as exc:
        print(f"[trainer] build FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
