"""Build the control-plane binaries from Go module sources.

Each component is built in a small wrapper module under
``<cache>/build/<name>-<version>`` that requires the upstream module.  Replace
directives of the upstream go.mod are not honoured for dependencies, so they
are re-created in the wrapper: ``./staging/src/k8s.io/X`` becomes
``k8s.io/X => k8s.io/X v0.<minor>.<patch>``; other local-path replaces are
dropped (their requires already name real versions); module replaces are
copied.  Binaries land in ``<cache>/bin/<name>-<version>`` and are skipped when
present.  Any failure raises :class:`BuildError` (never a silent skip).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import buildtimes
from .versions import Versions, binary_path, cache_dir, share_dir

# Files copied from upstream module sources into <cache>/share/<name>-<version>/
# so that `up` needs no Go toolchain or module cache.
SHARED_FILES = {
    "training-operator": (
        "manifests/base/crds/kubeflow.org_pytorchjobs.yaml",
        "manifests/base/webhook/manifests.yaml",
    ),
}


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class Target:
    name: str  # binary name (cache file is <name>-<version>)
    module: str
    version: str
    package: str
    tags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = field(default_factory=tuple)


def _k8s_ldflags(version: str) -> tuple[str, ...]:
    major, minor = version.lstrip("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    return (
        f"-X {pkg}.gitVersion={version}",
        f"-X {pkg}.gitMajor={major}",
        f"-X {pkg}.gitMinor={minor}",
        f"-X {pkg}.gitTreeState=clean",
        "-X k8s.io/client-go/pkg/version.gitVersion=" + version,
    )


def targets(v: Versions) -> list[Target]:
    k8s = "k8s.io/kubernetes"
    out = [
        Target("etcd", "go.etcd.io/etcd/server/v3", v.etcd, "go.etcd.io/etcd/server/v3"),
        *[
            Target(n, k8s, v.kubernetes, f"{k8s}/cmd/{n}", ldflags=_k8s_ldflags(v.kubernetes))
            for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
        ],
        Target("kwok", "sigs.k8s.io/kwok", v.kwok, "sigs.k8s.io/kwok/cmd/kwok"),
        Target(
            "training-operator",
            "github.com/kubeflow/training-operator",
            v.training_operator,
            "github.com/kubeflow/training-operator/cmd/training-operator.v1",
        ),
    ]
    return out


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOTOOLCHAIN", "local")
    env.setdefault("GOFLAGS", "")
    env["GOFLAGS"] = (env["GOFLAGS"] + " -mod=mod -buildvcs=false").strip()
    env.setdefault("CGO_ENABLED", "0")
    return env


def _run(cmd: list[str], cwd: Path, log: Path) -> str:
    if cmd[0] == "go":
        check_toolchain()
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}  (in {cwd})\n")
        fh.flush()
        proc = subprocess.run(cmd, cwd=cwd, env=go_env(), capture_output=True, text=True)
        fh.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise BuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}\n(full log: {log})")
    return proc.stdout


def _gomodcache(cwd: Path, log: Path) -> Path:
    return Path(_run(["go", "env", "GOMODCACHE"], cwd, log).strip())


def _replaces(t: Target, upstream_gomod: Path, cwd: Path, log: Path, staging: str) -> list[str]:
    data = json.loads(_run(["go", "mod", "edit", "-json", str(upstream_gomod)], cwd, log))
    out: list[str] = []
    for r in data.get("Replace") or []:
        old, new = r["Old"], r["New"]
        if new.get("Version"):
            old_s = old["Path"] + (" " + old["Version"] if old.get("Version") else "")
            out.append(f"{old_s} => {new['Path']} {new['Version']}")
        elif new["Path"].startswith("./staging/src/"):
            out.append(f"{old['Path']} => {old['Path']} {staging}")
    return out


def _staging_version(t: Target) -> str:
    if t.module == "k8s.io/kubernetes":
        return "v0" + t.version[2:]
    return ""


def build_target(t: Target, log: Path) -> Path:
    out = binary_path(t.name, t.version)
    if out.exists():
        ensure_shared(t, log)
        print(f"[build] {t.name} {t.version}: cached at {out}", flush=True)
        return out
    work = cache_dir() / "build" / f"{t.module.replace('/', '_')}-{t.version}"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    print(f"[build] {t.name} {t.version}: building {t.package}{buildtimes.note(out.name)} (log {log})", flush=True)
    if not (work / "go.sum").exists():
        _run(["go", "mod", "download", f"{t.module}@{t.version}"], work, log)
        upstream = _gomodcache(work, log) / f"{_escape(t.module)}@{t.version}"
        reps = _replaces(t, upstream / "go.mod", work, log, _staging_version(t))
        gomod = [f"module kfpgpu.local/build/{t.name}", "", "go 1.24", "", f"require {t.module} {t.version}"]
        if reps:
            gomod += ["", "replace (", *[f"\t{r}" for r in reps], ")"]
        (work / "go.mod").write_text("\n".join(gomod) + "\n")
        pkgs = [x.package for x in targets_for_module(t)]
        imports = "\n".join(f'\t_ "{p}"' for p in pkgs)
        (work / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")
        _run(["go", "mod", "tidy", "-e"], work, log)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    cmd = ["go", "build", "-trimpath", "-ldflags", " ".join(("-s", "-w", *t.ldflags)), "-o", str(tmp)]
    if t.tags:
        cmd += ["-tags", ",".join(t.tags)]
    _run([*cmd, t.package], work, log)
    tmp.rename(out)
    _copy_shared(t, work, log)
    buildtimes.record(out.name, time.monotonic() - t0)
    print(f"[build] {t.name} {t.version}: done in {time.monotonic() - t0:.0f}s -> {out}", flush=True)
    return out


def _copy_shared(t: Target, work: Path, log: Path) -> None:
    files = SHARED_FILES.get(t.name, ())
    if not files:
        return
    src = _gomodcache(work, log) / f"{_escape(t.module)}@{t.version}"
    dst = share_dir(t.name, t.version)
    for rel in files:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)


def ensure_shared(t: Target, log: Path) -> None:
    """Copy shared files even when the binary was already cached."""
    if all((share_dir(t.name, t.version) / rel).exists() for rel in SHARED_FILES.get(t.name, ())):
        return
    work = cache_dir() / "build" / f"{t.module.replace('/', '_')}-{t.version}"
    work.mkdir(parents=True, exist_ok=True)
    _run(["go", "mod", "download", f"{t.module}@{t.version}"], work, log)
    _copy_shared(t, work, log)


_ALL: list[Target] = []


def targets_for_module(t: Target) -> list[Target]:
    return [x for x in _ALL if x.module == t.module and x.version == t.version] or [t]


def _escape(module: str) -> str:
    """Module-cache path escaping (upper-case letters become !lower)."""
    return "".join("!" + c.lower() if c.isupper() else c for c in module)


def check_toolchain() -> None:
    if shutil.which("go") is None:
        raise BuildError("the Go toolchain ('go') is not on PATH; install Go >= 1.24 to build the dev cluster")


MODULE_WORKERS = 2  # the machine kind has 2 cores: two modules overlap (one downloads while one compiles)


def _build_modules(ts: list[Target], logdir: Path) -> dict[str, Path]:
    """Build the core targets: the targets of one Go module in turn (they share a work dir and go.sum), up to
    :data:`MODULE_WORKERS` modules at once (module downloads and ``go mod tidy`` are network- and IO-bound, so they
    overlap another module's compile; Go's build cache is safe to share). Returns target name -> binary.

    Raises: BuildError (the first module that failed, after the others finished).
    """
    by_module: dict[tuple[str, str], list[Target]] = {}
    for t in ts:
        by_module.setdefault((t.module, t.version), []).append(t)

    def one_module(group: list[Target]) -> dict[str, Path]:
        return {t.name: build_target(t, logdir / f"{t.name}-{t.version}.log") for t in group}

    with ThreadPoolExecutor(max_workers=MODULE_WORKERS, thread_name_prefix="build-module") as modules:
        jobs = [modules.submit(one_module, group) for group in by_module.values()]
    built: dict[str, Path] = {}
    for job in jobs:
        built.update(job.result())
    return {t.name: built[t.name] for t in ts}


def build_all(with_autoscaler: bool = False, with_kueue: bool = False, extras: Sequence[str] = ()) -> dict[str, Path]:
    """Build what is missing; with ``with_autoscaler`` cluster-autoscaler too, and each optional component named in
    ``extras`` (:mod:`.extras`; ``with_kueue`` adds ``"kueue"``), each in parallel with the others (module downloads
    and compiles overlap; Go's build cache is safe to share).

    Also generates the ProvisioningRequest CRD (:mod:`.provreq_crd`) so that ``up`` needs no Go toolchain.

    Raises: BuildError.
    """
    from . import extras as registry

    try:
        chosen = registry.select([*extras, *(["kueue"] if with_kueue else [])])
    except registry.UnknownExtra as e:
        raise BuildError(str(e)) from None
    v = Versions.load()
    ts = targets(v)
    _ALL[:] = ts
    logdir = cache_dir() / "build"
    logdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    built: dict[str, Path] = {}
    jobs: dict[str, Future[Path]] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, len(chosen) + 1), thread_name_prefix="build-extra")
    for extra in chosen:
        jobs[extra.name] = pool.submit(extra.build_fn(), wait_for_others=False)
    if with_autoscaler:
        # cluster-autoscaler (kwok provider, -tags kwok, one QPS patch) is built by autoscaler.py.
        from .autoscaler import build as build_autoscaler

        jobs["cluster-autoscaler"] = pool.submit(build_autoscaler, wait_for_others=False)
    try:  # one job per Go module (its targets share a work dir and go.sum, so they build in turn)
        built.update(_build_modules(ts, logdir))
    finally:
        pool.shutdown(wait=True)
    failed: list[str] = []
    for name, job in jobs.items():
        try:
            built[name] = job.result()
        except Exception as e:  # noqa: BLE001 - each extra raises its own error type; report them all
            failed.append(f"{name}: {e}")
    if failed:
        raise BuildError("\n".join(failed))
    from .provreq_crd import CrdError, ensure_crd_file

    try:
        ensure_crd_file()
    except CrdError as e:
        raise BuildError(f"ProvisioningRequest CRD: {e}") from e
    print(f"[build] all done in {time.monotonic() - t0:.0f}s", flush=True)
    return built


def main(with_autoscaler: bool = False, with_kueue: bool = False, extras: Sequence[str] = ()) -> int:
    try:
        build_all(with_autoscaler, with_kueue, extras)
    except BuildError as e:
        print(f"[build] FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    return 0
