"""Build the real Kueue controller (``sigs.k8s.io/kueue``) and derive what it needs from its module.

Build: ``sigs.k8s.io/kueue`` at ``KUEUE_VERSION`` (versions.env) is built from its Go module in a wrapper module under
``<cache>/build/sigs.k8s.io_kueue-<version>`` that requires it; the upstream go.mod's requires (and module
replaces, none in v0.17) are copied into the wrapper, as is its go.sum. The manager binary (``cmd/kueue``) lands in
``<cache>/bin/kueue-<version>`` (CGO_ENABLED=0, ``-trimpath -ldflags "-s -w"``, the version stamped into
``pkg/version``). One source change: with internal cert management off, upstream reads the metrics serving cert from
the hard-coded ``/etc/kueue/metrics/certs``. The manager's main package is a single file importing no internal
package, so the wrapper module holds a patched copy of it (``cmd/kueue/main.go``, where ``$KUEUE_METRICS_CERT_DIR``
overrides that path) and builds that against the upstream packages: the out-of-cluster controller keeps every file
in the dev cluster's state dir, and nothing else is copied (``go build -overlay`` refuses module-cache files).

Shared files: Kueue's CRDs (``config/components/crd/bases``), the conversion-webhook CRD patches and the webhook
configurations (``config/components/webhook/manifests.yaml``) are copied out of the module cache into
``<cache>/share/kueue-<version>`` at build time, so ``up`` needs no Go toolchain (nothing is committed).

    python -m kfp_gpu_rehearsal.devcluster.kueue build      # build into the cache (skips when present)
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import gobuild
from .versions import binary_path, cache_dir, load_versions, share_dir

MODULE = "sigs.k8s.io/kueue"
PACKAGE = MODULE + "/cmd/kueue"
NAME = "kueue"
METRICS_CERT_ENV = "KUEUE_METRICS_CERT_DIR"
CRD_DIR = "config/components/crd/bases"
CRD_PATCH_DIR = "config/components/crd/patches"
CRD_KUSTOMIZATION = "config/components/crd/kustomization.yaml"  # which conversion patches upstream applies
WEBHOOK_MANIFEST = "config/components/webhook/manifests.yaml"

PATCHED_FILE = "cmd/kueue/main.go"
METRICS_ANCHOR = '\t\tmetricsCertPath := "/etc/kueue/metrics/certs"\n'
METRICS_PATCH = (
    f'\t\tif d := os.Getenv("{METRICS_CERT_ENV}"); d != "" {{ // kfp-gpu dev cluster: runs out of cluster\n'
    "\t\t\tmetricsCertPath = d\n"
    "\t\t}\n"
)


class KueueError(RuntimeError):
    """Building or running Kueue failed (never skipped silently)."""


def version() -> str:
    """The pinned version. Raises: KueueError when versions.env has no KUEUE_VERSION."""
    v = load_versions().get("KUEUE_VERSION", "").strip()
    if not v:
        raise KueueError("KUEUE_VERSION is empty in kfp_gpu_rehearsal/devcluster/versions.env; set it (e.g. v0.17.0)")
    return v


def binary() -> Path:
    return binary_path(NAME, version())


def share() -> Path:
    """Where the CRDs and webhook manifests of the pinned version are kept."""
    return share_dir(NAME, version())


def go_env() -> dict[str, str]:
    return gobuild.go_env()


def _run(cmd: Sequence[str], cwd: Path, log: Path) -> str:
    return gobuild.run(cmd, cwd, log, KueueError)


def wrapper_gomod(upstream: Mapping[str, Any], ver: str) -> str:
    """The wrapper module's go.mod (:func:`kfp_gpu_rehearsal.devcluster.gobuild.wrapper_gomod`), at upstream's Go version."""
    return gobuild.wrapper_gomod(upstream, MODULE, ver, NAME, go=str(upstream.get("Go") or "1.25.0"))


def patched_main(src: str) -> str:
    """``cmd/kueue/main.go`` with :data:`METRICS_PATCH` after the anchor.

    Raises: KueueError when the anchor is not found exactly once (the pinned version changed).
    """
    if src.count(METRICS_ANCHOR) != 1:
        raise KueueError(f"{PATCHED_FILE}: patch anchor not found; review METRICS_PATCH for this version")
    return src.replace(METRICS_ANCHOR, METRICS_ANCHOR + METRICS_PATCH)




def _module_src(work: Path, log: Path, ver: str) -> Path:
    _run(["go", "mod", "download", f"{MODULE}@{ver}"], work, log)
    modcache = Path(_run(["go", "env", "GOMODCACHE"], work, log).strip())
    return modcache / f"{MODULE}@{ver}"


def copy_shared(src: Path, dst: Path) -> None:
    """Copy the CRDs, their conversion patches and the webhook manifests out of the module source."""
    for rel in (CRD_DIR, CRD_PATCH_DIR):
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for f in sorted((src / rel).glob("*.yaml")):
            shutil.copyfile(f, dst / rel / f.name)
    for rel in (CRD_KUSTOMIZATION, WEBHOOK_MANIFEST):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)


def shared_present() -> bool:
    d = share()
    return (d / WEBHOOK_MANIFEST).exists() and (d / CRD_KUSTOMIZATION).exists() and any((d / CRD_DIR).glob("*.yaml"))


def build(*, wait_for_others: bool = True, poll_s: float = 10.0) -> Path:
    """Build Kueue's manager into the cache and copy its manifests; a present binary is reused.

    Raises: KueueError (missing toolchain, download or compile failure, patch anchor gone).
    """
    ver = version()
    out = binary_path(NAME, ver)
    if out.exists() and shared_present():
        return out
    if shutil.which("go") is None:
        raise KueueError("the Go toolchain ('go') is not on PATH; install Go >= 1.25 to build Kueue")
    work = cache_dir() / "build" / f"{MODULE.replace('/', '_')}-{ver}"
    work.mkdir(parents=True, exist_ok=True)
    log = cache_dir() / "build" / f"{NAME}-{ver}.log"
    t0 = time.monotonic()
    src = _module_src(work, log, ver)
    copy_shared(src, share())
    if out.exists():
        return out
    upstream = json.loads(_run(["go", "mod", "edit", "-json", str(src / "go.mod")], work, log))
    (work / "go.mod").write_text(wrapper_gomod(upstream, ver))
    if not (work / "go.sum").exists():
        shutil.copyfile(src / "go.sum", work / "go.sum")
        (work / "go.sum").chmod(0o644)
    (work / "cmd" / "kueue").mkdir(parents=True, exist_ok=True)
    (work / PATCHED_FILE).write_text(patched_main((src / PATCHED_FILE).read_text()))
    ldflags = f"-s -w -X {MODULE}/pkg/version.GitVersion={ver}"
    return gobuild.go_build("kueue", "./cmd/kueue", out, work, log, KueueError, flags=("-ldflags", ldflags),
                            what=f"{PACKAGE}@{ver}", wait_for_others=wait_for_others, poll_s=poll_s,
                            setup_s=time.monotonic() - t0)


def main(argv: Sequence[str] | None = None) -> int:
    return gobuild.cli_main("kueue", "kueue", build, KueueError, argv)


if __name__ == "__main__":
    sys.exit(main())
