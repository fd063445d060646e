"""Build the real Karpenter controller with its kwok cloud provider (``sigs.k8s.io/karpenter/kwok``).

Build: ``sigs.k8s.io/karpenter`` at ``KARPENTER_VERSION`` (versions.env) is built from its Go module in a wrapper module
under ``<cache>/build/sigs.k8s.io_karpenter-<version>`` that requires it (upstream requires and module replaces are
copied into the wrapper, as is its go.sum; :mod:`kfp_gpu_rehearsal.devcluster.gobuild`). The binary (package ``kwok``, the
provider that "launches" a NodeClaim by creating a Node object) lands in ``<cache>/bin/karpenter-<version>``
(CGO_ENABLED=0, ``-trimpath -ldflags "-s -w"``), from a patched copy of the module (``karpenter-src``, the wrapper's
``replace``). The source changes (:data:`PATCHES`, :data:`NEW_FILES`), all opt-in through environment variables
(unset = upstream behaviour):

- Stockouts (``KWOK_OFFERING_STOCKOUTS=true``): upstream's kwok provider forces every offering of the instance-types
  file to ``available``. With the variable set it remembers the offerings the file marks ``"available": false``;
  Karpenter still schedules onto them (as on AWS, where a stockout is learnt only when a launch fails), and
  ``Create`` skips them when it picks the cheapest offering the NodeClaim allows, failing with Karpenter's
  ``InsufficientCapacityError`` when every allowed offering is out of stock (upstream would dereference a nil
  offering there). Karpenter core then emits its ``InsufficientCapacityError`` event and deletes the NodeClaim.
- Bind host (``KARPENTER_BIND_HOST``): upstream binds metrics and health probes to ``:<port>`` (all interfaces);
  the dev cluster's out-of-cluster controller binds them to ``127.0.0.1``.

Shared files: the CRDs of ``kwok/charts/crds`` (NodePool, NodeClaim, NodeOverlay and the provider's KWOKNodeClass)
are copied out of the module cache into ``<cache>/share/karpenter-<version>/crds`` at build time, so ``up`` needs no
Go toolchain.

    python -m kfp_gpu_rehearsal.devcluster.karpenter build      # build into the cache (skips when present)
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

MODULE = "sigs.k8s.io/karpenter"
PACKAGE = MODULE + "/kwok"
NAME = "karpenter"
CRD_DIR = "kwok/charts/crds"
NODECLASS_CRD = "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml"
SRC_DIR = "karpenter-src"
STOCKOUTS_ENV = "KWOK_OFFERING_STOCKOUTS"
BIND_HOST_ENV = "KARPENTER_BIND_HOST"

# (file, anchor, replacement): each anchor must occur exactly once in the pinned version.
PATCHES: tuple[tuple[str, str, str], ...] = (
    ("kwok/cloudprovider/helpers.go",
     "\tfor i := range opts.Offerings {\n\t\topts.Offerings[i].Available = true\n",
     "\tfor i := range opts.Offerings {\n"
     "\t\tif kfpgpuStockouts() && !opts.Offerings[i].Available { // kfp-gpu: remember the file's stockouts\n"
     "\t\t\tkfpgpuOutOfStock[kfpgpuStockKey(opts.Name, opts.Offerings[i].Requirements)] = true\n"
     "\t\t}\n"
     "\t\topts.Offerings[i].Available = true\n"),
    ("kwok/cloudprovider/cloudprovider.go",
     "\t\tavailableOfferings := it.Offerings.Available().Compatible(requirements)\n",
     "\t\tavailableOfferings := kfpgpuInStock(it.Name, it.Offerings.Available().Compatible(requirements))\n"
     "\t\tif len(availableOfferings) == 0 { // kfp-gpu: every allowed offering of this type is out of stock\n"
     "\t\t\tcontinue\n"
     "\t\t}\n"),
    ("kwok/cloudprovider/cloudprovider.go",
     "\treturn &corev1.Node{\n\t\tObjectMeta: metav1.ObjectMeta{\n\t\t\tName:        newName,\n",
     "\tif cheapestOffering == nil { // kfp-gpu: no allowed offering in stock\n"
     "\t\treturn nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf(\"all requested instance types were "
     "unavailable during launch\"))\n"
     "\t}\n"
     "\treturn &corev1.Node{\n\t\tObjectMeta: metav1.ObjectMeta{\n\t\t\tName:        newName,\n"),
    ("pkg/operator/operator.go",
     "\t\t\tBindAddress: fmt.Sprintf(\":%d\", options.FromContext(ctx).MetricsPort),\n",
     "\t\t\tBindAddress: fmt.Sprintf(\"%s:%d\", kfpgpuBindHost(), options.FromContext(ctx).MetricsPort),\n"),
    ("pkg/operator/operator.go",
     "\t\tHealthProbeBindAddress: fmt.Sprintf(\":%d\", options.FromContext(ctx).HealthProbePort),\n",
     "\t\tHealthProbeBindAddress: fmt.Sprintf(\"%s:%d\", kfpgpuBindHost(), options.FromContext(ctx).HealthProbePort),\n"),
)

NEW_FILES: dict[str, str] = {
    "kwok/cloudprovider/kfpgpu_stockouts.go": f"""// kfp-gpu dev cluster: offerings the instance-types file marks unavailable are out of stock at launch.
package kwok

import (
\t"os"

\tcorev1 "k8s.io/api/core/v1"

\tv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
\t"sigs.k8s.io/karpenter/pkg/cloudprovider"
)

// instance type/zone/capacity type of the offerings the file marks "available": false (filled at startup only).
var kfpgpuOutOfStock = map[string]bool{{}}

func kfpgpuStockouts() bool {{ return os.Getenv("{STOCKOUTS_ENV}") == "true" }}

func kfpgpuKey(instanceType, zone, capacityType string) string {{
\treturn instanceType + "/" + zone + "/" + capacityType
}}

func kfpgpuStockKey(instanceType string, reqs []corev1.NodeSelectorRequirement) string {{
\tvar zone, capacityType string
\tfor _, r := range reqs {{
\t\tif len(r.Values) == 0 {{
\t\t\tcontinue
\t\t}}
\t\tswitch r.Key {{
\t\tcase corev1.LabelTopologyZone:
\t\t\tzone = r.Values[0]
\t\tcase v1.CapacityTypeLabelKey:
\t\t\tcapacityType = r.Values[0]
\t\t}}
\t}}
\treturn kfpgpuKey(instanceType, zone, capacityType)
}}

func kfpgpuInStock(instanceType string, ofs cloudprovider.Offerings) cloudprovider.Offerings {{
\tvar out cloudprovider.Offerings
\tfor _, o := range ofs {{
\t\tk := kfpgpuKey(instanceType, o.Requirements.Get(corev1.LabelTopologyZone).Any(),
\t\t\to.Requirements.Get(v1.CapacityTypeLabelKey).Any())
\t\tif !kfpgpuOutOfStock[k] {{
\t\t\tout = append(out, o)
\t\t}}
\t}}
\treturn out
}}
""",
    "pkg/operator/kfpgpu_bind.go": f"""// kfp-gpu dev cluster: bind metrics and health probes to one host (default: all interfaces, as upstream).
package operator

import "os"

func kfpgpuBindHost() string {{ return os.Getenv("{BIND_HOST_ENV}") }}
""",
}


class KarpenterError(RuntimeError):
    """Building or running Karpenter failed (never skipped silently)."""


def version() -> str:
    """The pinned version. Raises: KarpenterError when versions.env has no KARPENTER_VERSION."""
    v = load_versions().get("KARPENTER_VERSION", "").strip()
    if not v:
        raise KarpenterError("KARPENTER_VERSION is empty in kfp_gpu_rehearsal/devcluster/versions.env; set it (e.g. v1.14.1)")
    return v


def binary() -> Path:
    return binary_path(NAME, version())


def share() -> Path:
    """Where the CRDs of the pinned version are kept."""
    return share_dir(NAME, version())


def crd_files() -> list[Path]:
    """The copied CRD manifests (empty before a build)."""
    return sorted((share() / "crds").glob("*.yaml"))


def _run(cmd: Sequence[str], cwd: Path, log: Path) -> str:
    return gobuild.run(cmd, cwd, log, KarpenterError)


def wrapper_gomod(upstream: Mapping[str, Any], ver: str) -> str:
    """The wrapper module's go.mod (:func:`kfp_gpu_rehearsal.devcluster.gobuild.wrapper_gomod`), at upstream's Go version."""
    return gobuild.wrapper_gomod(upstream, MODULE, ver, NAME, go=str(upstream.get("Go") or "1.25.0"),
                                 local_src=f"./{SRC_DIR}")


def _module_src(work: Path, log: Path, ver: str) -> Path:
    _run(["go", "mod", "download", f"{MODULE}@{ver}"], work, log)
    modcache = Path(_run(["go", "env", "GOMODCACHE"], work, log).strip())
    return modcache / f"{MODULE}@{ver}"


def copy_shared(src: Path, dst: Path) -> None:
    """Copy the CRDs (``kwok/charts/crds/*.yaml``) out of the module source into ``dst/crds``.

    Raises: KarpenterError when the module has no CRDs there (the layout changed in the pinned version).
    """
    files = sorted((src / CRD_DIR).glob("*.yaml"))
    if not files:
        raise KarpenterError(f"{src / CRD_DIR}: no CRD manifests; review CRD_DIR for this Karpenter version")
    (dst / "crds").mkdir(parents=True, exist_ok=True)
    for f in [*files, src / NODECLASS_CRD]:
        shutil.copyfile(f, dst / "crds" / f.name)
        (dst / "crds" / f.name).chmod(0o644)


def patched_copy(src: Path, dst: Path) -> None:
    """Copy the module source to ``dst`` (writable), apply :data:`PATCHES` and add :data:`NEW_FILES`.

    Raises: KarpenterError when an anchor is not found exactly once (the pinned version changed).
    """
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*_test.go", "testdata", "designs", "website"))
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    for rel, anchor, new in PATCHES:
        f = dst / rel
        text = f.read_text()
        if text.count(anchor) != 1:
            raise KarpenterError(f"{rel}: patch anchor {anchor.strip()[:60]!r} not found once; review PATCHES "
                                 "for this Karpenter version")
        f.write_text(text.replace(anchor, new))
    for rel, text in NEW_FILES.items():
        (dst / rel).write_text(text)


def shared_present() -> bool:
    return bool(crd_files())


def build(*, wait_for_others: bool = True, poll_s: float = 10.0) -> Path:
    """Build Karpenter's kwok controller into the cache and copy its CRDs; a present binary is reused.

    Raises: KarpenterError (missing toolchain, download or compile failure).
    """
    ver = version()
    out = binary_path(NAME, ver)
    if out.exists() and shared_present():
        return out
    if shutil.which("go") is None:
        raise KarpenterError("the Go toolchain ('go') is not on PATH; install Go >= 1.25 to build Karpenter")
    work = cache_dir() / "build" / f"{MODULE.replace('/', '_')}-{ver}"
    work.mkdir(parents=True, exist_ok=True)
    log = cache_dir() / "build" / f"{NAME}-{ver}.log"
    t0 = time.monotonic()
    src = _module_src(work, log, ver)
    copy_shared(src, share())
    if out.exists():
        return out
    upstream = json.loads(_run(["go", "mod", "edit", "-json", str(src / "go.mod")], work, log))
    patched_copy(src, work / SRC_DIR)
    (work / "go.mod").write_text(wrapper_gomod(upstream, ver))
    if not (work / "go.sum").exists():
        shutil.copyfile(src / "go.sum", work / "go.sum")
        (work / "go.sum").chmod(0o644)
    return gobuild.go_build("karpenter", PACKAGE, out, work, log, KarpenterError, what=f"{PACKAGE}@{ver}",
                            wait_for_others=wait_for_others, poll_s=poll_s, setup_s=time.monotonic() - t0)


def main(argv: Sequence[str] | None = None) -> int:
    return gobuild.cli_main("karpenter", "karpenter", build, KarpenterError, argv)


if __name__ == "__main__":
    sys.exit(main())
