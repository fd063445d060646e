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

    python -m kfp_gpu.devcluster.trainer build      # build both into the cache (skips when present)
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import gobuild
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
            raise TrainerError(f"{self.key} is empty in kfp_gpu/devcluster/versions.env; set it (see trainer.py)")
        return v

    def binary(self) -> Path:
        return binary_path(self.name, self.version())

    def share(self) -> Path:
        return share_dir(self.name, self.version())


JOBSET = Component("jobset", "JOBSET_VERSION", "sigs.k8s.io/jobset", "",
                   ("config/components/crd/bases", "config/components/webhook/manifests.yaml",
                    "config/components/webhook/patches"))
TRAINER = Component("trainer", "TRAINER_VERSION", "github.com/kubeflow/trainer/v2", "cmd/trainer-controller-manager",
                    ("manifests/base/crds", "manifests/base/webhook/manifests.yaml",
                     "manifests/base/webhook/patch_mutating.yaml", "manifests/base/webhook/patch_validating.yaml",
                     "manifests/base/runtimes/torch_distributed.yaml"))
COMPONENTS = (JOBSET, TRAINER)


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
    while wait_for_others and gobuild.other_go_builds():
        print(f"[{comp.name}] waiting for other go builds {gobuild.other_go_builds()}", flush=True)
        time.sleep(poll_s)
    t1 = time.monotonic()
    pkg = comp.module + ("/" + comp.package if comp.package else "")
    print(f"[{comp.name}] building {pkg}@{ver} (log {log})", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp), pkg])
    tmp.rename(out)
    print(f"[{comp.name}] built in {time.monotonic() - t1:.0f}s (setup {t1 - t0:.0f}s) -> {out}", flush=True)
    return out


def build(*, wait_for_others: bool = True) -> Path:
    """Build JobSet and the Trainer (the registry's build hook); returns the Trainer binary.

    Raises: TrainerError.
    """
    build_one(JOBSET, wait_for_others=wait_for_others)
    return build_one(TRAINER, wait_for_others=wait_for_others)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    names = {c.name: c for c in COMPONENTS}
    if args[:1] != ["build"] or any(a not in names for a in args[1:]):
        print("usage: python -m kfp_gpu.devcluster.trainer build [jobset|trainer]", file=sys.stderr)
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
